//! Tier 2, overflow onto Slurm: who may join the lab as a Slurm pilot's host.
//! Real `rb-broker` and `rb-hostd` on this machine (manual transport), no Slurm and no
//! root needed; the real cluster is in `slurm_lab.rs`.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use proto::report::HostState;
use tests::{bin, wait_until, Broker};

const LAB: &str = "[broker]\nlisten = \"127.0.0.1:0\"\ntransport = \"manual\"\nstate_dir = \"@STATE@\"\nsecret_file = \"@SECRET@\"\nreport_interval_s = 0.5\ndown_after_s = 2\n\n[[host]]\nname = \"vhost01\"\nlabels = [\"public\"]\n";

/// `rb-hostd --host NAME` against `broker`, as a pilot's script starts it.
fn hostd(broker: &Broker, name: &str) -> Child {
    hostd_with(broker, name, &[])
}

/// [`hostd`] with `more` arguments (e.g. `--slurm-job ID`).
fn hostd_with(broker: &Broker, name: &str, more: &[&str]) -> Child {
    let lock = broker.dir.path().join(format!("lock-{name}"));
    Command::new(bin("rb-hostd"))
        .arg("--broker")
        .arg(broker.tcp_addr().to_string())
        .args(more)
        .args(["--host", name, "--secret-file"])
        .arg(broker.secret())
        .arg("--lock-dir")
        .arg(lock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rb-hostd")
}

fn stop(mut child: Child) -> String {
    let _ = child.kill();
    let out = child.wait_with_output().expect("wait");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn with_overflow_a_slurm_pilot_joins_as_a_public_slurm_host() {
    let broker = Broker::start(&format!("{LAB}\n[overflow.slurm]\n"));
    let pilot = hostd(&broker, "slurm-cn17");
    let up = broker.wait_host("slurm-cn17", Duration::from_secs(15), "pilot up", |h| {
        h.state == HostState::Up
    });
    assert_eq!(up.address, "127.0.0.1", "the address it connected from");
    assert!(up.labels.contains(&"slurm".to_string()), "{up:?}");
    assert!(up.labels.contains(&"public".to_string()) && up.owner.is_none());
    assert!(broker.log().contains("a Slurm pilot's host joins the lab"));
    stop(pilot);
    broker.wait_host("slurm-cn17", Duration::from_secs(10), "pilot gone", |h| {
        h.state == HostState::Down
    });
}

#[test]
fn only_slurm_names_join_and_only_with_overflow_configured() {
    let with = Broker::start(&format!("{LAB}\n[overflow.slurm]\n"));
    let without = Broker::start(LAB);
    for (broker, name) in [(&with, "cn17"), (&with, "slurm-"), (&without, "slurm-cn17")] {
        let mut daemon = hostd(broker, name);
        // Refused: the daemon keeps retrying; the broker says why in its log.
        let refused = wait_until(Duration::from_secs(10), || {
            broker
                .log()
                .contains(&format!("host `{name}` is not in the lab file"))
                .then_some(())
        });
        let _ = daemon.kill();
        let _ = daemon.wait();
        assert!(refused.is_some(), "{name}: {}", broker.log());
        let names: Vec<String> = broker
            .status()
            .expect("status")
            .into_iter()
            .map(|h| h.name)
            .collect();
        assert_eq!(names, ["vhost01"], "{name} did not join");
    }
}

/// A pilot's daemon (`--slurm-job`) is the pilot job's step: Slurm's SIGTERM (preemption,
/// `scancel`) is a notice, not the end. The daemon stays up, tells the broker, and the
/// host closes (`lease_ending`) while still up; SIGINT stops it. Slurm cannot be asked
/// here, so the broker falls back to its own grace.
#[test]
fn a_pilots_daemon_tells_the_broker_at_sigterm_and_runs_on() {
    let lab = format!("{LAB}\n[overflow.slurm]\nsqueue = [\"/nonexistent/rb-squeue\"]\n");
    let broker = Broker::start(&lab);
    let mut pilot = hostd_with(&broker, "slurm-cn17", &["--slurm-job", "4242"]);
    let up = broker.wait_host("slurm-cn17", Duration::from_secs(15), "pilot up", |h| {
        h.state == HostState::Up && h.slurm_job.is_some()
    });
    assert_eq!(up.slurm_job.as_deref(), Some("4242"), "{up:?}");
    assert!(!up.lease_ending, "{up:?}");

    let pid = nix::unistd::Pid::from_raw(pilot.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let closed = broker.wait_host("slurm-cn17", Duration::from_secs(15), "told", |h| {
        h.lease_ending
    });
    assert_eq!(
        closed.state,
        HostState::Up,
        "still up after SIGTERM: {closed:?}"
    );
    assert!(
        pilot.try_wait().expect("try_wait").is_none(),
        "the daemon runs on after SIGTERM"
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let ended = wait_until(Duration::from_secs(10), || pilot.try_wait().ok().flatten());
    let err = stop(pilot);
    assert!(ended.is_some(), "SIGINT stops it\n{err}");
    assert!(err.contains("SIGTERM: Slurm takes the node"), "{err}");
}
