//! Tier 3, another local user on a lab host plants `/tmp/rb-<uid>` (a 0777 directory or a
//! symlink) where the host daemon keeps its lock: one `mkdir` took the host out of the lab
//! (every restart of `rb-hostd` exited 1). The name is still refused; the daemon runs from
//! the private directory under its home instead. Root and a lab needed.

use std::time::Duration;

use proto::report::HostState;
use tests::labtier::{skip_unless_root, LabWithBroker};

/// Plants `/tmp/rb-0` on `host` as user nobody (`how`: a shell command run by nobody),
/// then kills the host's daemon: the broker restarts it into the planted name.
fn plant_and_kill(env: &LabWithBroker, host: &str, how: &str) {
    let pid = env.hostd_pid(host).expect("hostd pid");
    let plant = format!(
        "rm -rf /tmp/rb-0 && setpriv --reuid=65534 --regid=65534 --clear-groups sh -c '{how}' \
         && kill -9 {pid}"
    );
    let out = env.lab.exec(host, &["sh", "-c", &plant]).expect("plant");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_planted_tmp_dir_does_not_keep_a_host_out_of_the_lab() {
    if skip_unless_root("a_planted_tmp_dir_does_not_keep_a_host_out_of_the_lab") {
        return;
    }
    let env = LabWithBroker::start(3, &[]);
    for (host, how) in [
        ("node02", "mkdir -m 0777 /tmp/rb-0"),
        (
            "node03",
            "mkdir /tmp/elsewhere && ln -s /tmp/elsewhere /tmp/rb-0",
        ),
    ] {
        let before = env.broker.host(host).expect("host").daemon_starts;
        plant_and_kill(&env, host, how);
        let row = env.broker.wait_host(
            host,
            Duration::from_secs(30),
            "a restarted daemon reporting despite the planted /tmp/rb-0",
            |h| h.state == HostState::Up && h.daemon_starts > before,
        );
        // The planted name is left alone: still nobody's, and nothing of ours in it.
        let out = env
            .lab
            .exec(
                host,
                &["sh", "-c", "stat -c %U /tmp/rb-0/ && ls -A /tmp/rb-0/"],
            )
            .expect("stat");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.trim(), "nobody", "{row:?}: {text}");
        assert_eq!(
            env.broker.host("node04").expect("node04").state,
            HostState::Up,
            "others unaffected"
        );
    }
    // The hosts share root's home: leave no fallback directory behind.
    for host in ["node02", "node03"] {
        let clean = r#"rm -rf "$HOME/.local/state/rb/run-$(hostname)""#;
        let _ = env.lab.exec(host, &["sh", "-c", clean]);
    }
}
