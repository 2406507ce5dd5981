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
    lab_file_with(lab, &LabOptions::new(owners, timing))
}

/// What a lab-tier broker is built with beyond the host count.
#[derive(Debug, Clone)]
pub struct LabOptions {
    pub owners: Vec<(String, String)>,
    pub timing: Timing,
    /// Run inetd + in.rshd on every host.
    pub rsh: bool,
    /// `job_shell` of the lab file (jobs' remote shell), e.g. `["rsh"]`.
    pub job_shell: Option<Vec<String>>,
    /// Hosts the broker does not manage (front-end machines where agents run).
    pub unmanaged: Vec<String>,
    /// Lab-file labels of the hosts named here; every other host has `["public"]`.
    pub labels: Vec<(String, Vec<String>)>,
}

impl LabOptions {
    pub fn new(owners: &[(&str, &str)], timing: Timing) -> Self {
        Self {
            owners: owners
                .iter()
                .map(|(h, o)| (h.to_string(), o.to_string()))
                .collect(),
            timing,
            rsh: false,
            job_shell: None,
            unmanaged: Vec::new(),
            labels: Vec::new(),
        }
    }
}

/// [`lab_file`] with every option.
pub fn lab_file_with(lab: &lab::Lab, opts: &LabOptions) -> String {
    let (owners, timing) = (&opts.owners, opts.timing);
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
    if let Some(shell) = &opts.job_shell {
        text.push_str(&format!("job_shell = {shell:?}\n"));
    }
    for host in lab.hosts() {
        if opts.unmanaged.contains(&host.name) {
            continue;
        }
        let public = vec!["public".to_string()];
        let labels = opts
            .labels
            .iter()
            .find(|(h, _)| *h == host.name)
            .map_or(&public, |(_, l)| l);
        text.push_str(&format!(
            "\n[[host]]\nname = \"{}\"\naddress = \"{}\"\nlabels = {labels:?}\n",
            host.name, host.address
        ));
        if let Some((_, owner)) = owners.iter().find(|(h, _)| *h == host.name) {
            text.push_str(&format!("owner = \"{owner}\"\n"));
        }
    }
    text
}

/// The lab user's own machine in [`LabWithBroker::start_with_front_end`].
pub const FRONT_END: &str = "node02";

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
        Self::start_opts(hosts, &LabOptions::new(owners, timing))
    }

    pub fn start_opts(hosts: usize, opts: &LabOptions) -> Self {
        let spec = lab::LabSpec {
            hosts,
            rsh: opts.rsh,
            ..lab::LabSpec::default()
        };
        let lab = lab::Lab::up(&spec).unwrap_or_else(|e| panic!("lab up: {e}"));
        let broker = Broker::start(&lab_file_with(&lab, opts));
        broker.wait_all_up(Duration::from_secs(20));
        Self { broker, lab }
    }

    /// node02 as the lab user's front end (not managed: the broker never grants it, so a
    /// job there cannot be given its own machine) and node03.. for the broker, jobs over
    /// real rsh: the setting of the module and MPI lab tests and of their benchmarks.
    pub fn start_with_front_end(hosts: usize) -> Self {
        Self::start_opts(hosts, &Self::front_end_options())
    }

    /// [`start_with_front_end`](Self::start_with_front_end) with the front end managed too,
    /// as on the usual lab where every workstation is a lab host: the broker may grant
    /// node02 to any job, including one whose agent runs there.
    pub fn start_with_managed_front_end(hosts: usize) -> Self {
        let mut opts = Self::front_end_options();
        opts.unmanaged.clear();
        Self::start_opts(hosts, &opts)
    }

    /// The options of [`start_with_front_end`](Self::start_with_front_end): rsh everywhere,
    /// jobs' remote shell rsh, node02 not managed.
    pub fn front_end_options() -> LabOptions {
        let mut opts = LabOptions::new(&[], TEST_TIMING);
        opts.rsh = true;
        opts.job_shell = Some(vec!["rsh".into()]);
        opts.unmanaged = vec![FRONT_END.into()];
        opts
    }

    /// The lab user's processes matching the pgrep pattern `name`, on every host, as
    /// `host: pid command` lines: empty when none is left anywhere.
    pub fn user_processes(&self, name: &str) -> Vec<String> {
        let user = self.lab.user().name.clone();
        self.lab
            .hosts()
            .iter()
            .filter_map(|h| {
                let out = self
                    .lab
                    .exec(&h.name, &["pgrep", "-u", &user, "-a", name])
                    .ok()?;
                let found = String::from_utf8_lossy(&out.stdout).trim().to_string();
                (!found.is_empty()).then(|| format!("{}: {found}", h.name))
            })
            .collect()
    }

    /// `tests/programs/SOURCE.c` copied into the lab user's (shared) home and compiled
    /// there by the lab user on the front end: `COMPILER -O2 -o ~/OUT ~/SOURCE.c LIBS`.
    /// Returns the binary's path, or the compiler's complaint.
    pub fn build_program(
        &self,
        source: &str,
        compiler: &str,
        out: &str,
        libs: &str,
    ) -> Result<std::path::PathBuf, String> {
        let src =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("programs/{source}.c"));
        let home = self.lab.user().home.clone();
        std::fs::copy(&src, home.join(format!("{source}.c")))
            .map_err(|e| format!("copy {}: {e}", src.display()))?;
        let script = format!("{compiler} -O2 -o ~/{out} ~/{source}.c {libs}");
        let done = self
            .lab
            .exec_as_user(FRONT_END, &["sh", "-c", &script])
            .map_err(|e| format!("{FRONT_END}: {e}"))?;
        if !done.status.success() {
            return Err(format!(
                "compiling {source} with {compiler}: {}",
                String::from_utf8_lossy(&done.stderr)
            ));
        }
        Ok(home.join(out))
    }

    /// Copies the lab secret into the lab user's home (`~/.config/rb/secret`, mode 600,
    /// owned by the user) and returns its path: agents run by the lab user read it there.
    pub fn user_secret(&self) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let user = self.lab.user();
        let dir = user.home.join(".config/rb");
        std::fs::create_dir_all(&dir).expect("mkdir ~/.config/rb");
        let path = dir.join("secret");
        std::fs::copy(self.broker.secret(), &path).expect("copy secret");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        for p in [user.home.join(".config"), dir, path.clone()] {
            std::os::unix::fs::chown(&p, Some(user.uid), Some(user.gid)).expect("chown");
        }
        path
    }

    /// `agent --broker ADDR --secret-file S --grace-s 1 -- args…` on the gateway (this
    /// machine), over TCP with the lab secret, outside any job (no `RB_AGENT`, `RB_LAB`,
    /// `RB_JEL` inherited).
    pub fn agent(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(crate::bin("agent"));
        cmd.arg("--broker")
            .arg(self.broker.tcp_addr().to_string())
            .arg("--secret-file")
            .arg(self.broker.secret())
            .arg("--grace-s")
            .arg("1")
            .arg("--")
            .args(args)
            .env_remove("RB_AGENT")
            .env_remove("RB_LAB")
            .env_remove("RB_JEL");
        cmd
    }

    /// `agent --broker ADDR --secret-file S --grace-s 1 [agent_args] -- app…` run by the lab
    /// user inside `host` (stdio: stdin null; set stdout/stderr before running).
    pub fn agent_as_user(
        &self,
        host: &str,
        agent_args: &[&str],
        app: &[&str],
    ) -> std::process::Command {
        let secret = self.user_secret();
        let agent = crate::bin("agent").display().to_string();
        let addr = self.broker.tcp_addr().to_string();
        let secret = secret.display().to_string();
        let mut argv = vec![
            agent.as_str(),
            "--broker",
            &addr,
            "--secret-file",
            &secret,
            "--grace-s",
            "1",
        ];
        argv.extend_from_slice(agent_args);
        argv.push("--");
        argv.extend_from_slice(app);
        let mut cmd = self
            .lab
            .command(host, &argv, true)
            .unwrap_or_else(|e| panic!("agent in {host}: {e}"));
        cmd.stdin(std::process::Stdio::null()).env(
            "RB_LOG",
            std::env::var("RB_LOG").unwrap_or_else(|_| "info".into()),
        );
        cmd
    }

    /// Pid (inside the host's PID namespace) of the host's running `rb-hostd`.
    pub fn hostd_pid(&self, host: &str) -> Option<String> {
        let lock = format!("/tmp/rb-0/hostd-{host}.lock");
        let out = self.lab.exec(host, &["cat", &lock]).ok()?;
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!pid.is_empty()).then_some(pid)
    }
}
