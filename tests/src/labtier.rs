//! Lab-tier support: a [`lab::Lab`] of real namespaced hosts plus a broker in the root
//! namespace that starts `rb-hostd` on every host over real ssh.

use std::time::Duration;

use crate::Broker;

/// Prints why a lab test is skipped and returns true when not root.
pub fn skip_unless_root(test: &str) -> bool {
    if crate::is_root() {
        return false;
    }
    // Straight to the stderr handle: libtest captures eprintln! of passing tests.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {test}: lab tests need root (network namespaces); run ./test.sh as root"
    );
    true
}

/// Report interval and silence limit of a lab file, in seconds.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub interval_s: f64,
    pub down_after_s: f64,
}

/// What the lab tests use: fast reports, quick down detection.
pub const TEST_TIMING: Timing = Timing {
    interval_s: 1.0,
    down_after_s: 4.0,
};
/// The product defaults (2 s reports, down after 6 s), used by the benchmarks.
pub const DEFAULT_TIMING: Timing = Timing {
    interval_s: 2.0,
    down_after_s: 6.0,
};

/// A lab file for `lab`'s hosts: ssh transport, broker on the gateway.
/// `owners` assigns owners to hosts by name.
pub fn lab_file(lab: &lab::Lab, owners: &[(&str, &str)], timing: Timing) -> String {
    let mut text = format!(
        "[broker]\nlisten = \"{gw}:0\"\ntransport = \"ssh\"\nstate_dir = \"@STATE@\"\nsecret_file = \"@SECRET@\"\n\
         report_interval_s = {interval}\ndown_after_s = {down}\nrestart_backoff_max_s = 2\nhostd_path = \"{hostd}\"\n\
         ssh_command = [\"ssh\", \"-F\", \"{cfg}\"]\n",
        gw = lab.gateway(),
        interval = timing.interval_s,
        down = timing.down_after_s,
        hostd = crate::bin("rb-hostd").display(),
        cfg = lab.ssh_config().display(),
    );
    for host in lab.hosts() {
        text.push_str(&format!(
            "\n[[host]]\nname = \"{}\"\naddress = \"{}\"\nlabels = [\"public\"]\n",
            host.name, host.address
        ));
        if let Some((_, owner)) = owners.iter().find(|(h, _)| *h == host.name) {
            text.push_str(&format!("owner = \"{owner}\"\n"));
        }
    }
    text
}

/// A lab with `hosts` hosts and a broker managing them, every host up.
pub struct LabWithBroker {
    // Field order matters: the broker stops (and its daemons with it) before the lab goes.
    pub broker: Broker,
    pub lab: lab::Lab,
}

impl LabWithBroker {
    pub fn start(hosts: usize, owners: &[(&str, &str)]) -> Self {
        Self::start_with(hosts, owners, TEST_TIMING)
    }

    pub fn start_with(hosts: usize, owners: &[(&str, &str)], timing: Timing) -> Self {
        let spec = lab::LabSpec {
            hosts,
            ..lab::LabSpec::default()
        };
        let lab = lab::Lab::up(&spec).unwrap_or_else(|e| panic!("lab up: {e}"));
        let broker = Broker::start(&lab_file(&lab, owners, timing));
        broker.wait_all_up(Duration::from_secs(20));
        Self { broker, lab }
    }

    /// Pid (inside the host's PID namespace) of the host's running `rb-hostd`.
    pub fn hostd_pid(&self, host: &str) -> Option<String> {
        let lock = format!("/tmp/rb-0/hostd-{host}.lock");
        let out = self.lab.exec(host, &["cat", &lock]).ok()?;
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!pid.is_empty()).then_some(pid)
    }
}
