//! Tier 3, another local user on a lab host plants `/tmp/rb-<uid>` (a 0777 directory or a
//! symlink) where the host daemon keeps its lock: one `mkdir` took the host out of the lab
//! (every restart of `rb-hostd` exited 1). The name is still refused; the daemon runs from
//! the private directory under its home instead, and people are told: `rb status` lists the
//! host's warning, and a job with a command there gets one line on its stderr. Root and a lab
//! needed.

use std::time::Duration;

use proto::report::HostState;
use tests::{
    labtier::{skip_unless_root, LabWithBroker},
    wait_until,
};

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
        // Said where the admin looks: the host's row (`rb status` lists it under the table).
        let warned = env.broker.wait_host(
            host,
            Duration::from_secs(10),
            "the host's warning about the refused /tmp/rb-0",
            |h| {
                h.warnings
                    .iter()
                    .any(|w| w.contains("/tmp/rb-0") && w.contains("instead"))
            },
        );
        assert!(
            warned
                .warnings
                .iter()
                .all(|w| w.contains(".local/state/rb")),
            "{:?}",
            warned.warnings
        );
        assert!(
            env.broker
                .host("node04")
                .expect("node04")
                .warnings
                .is_empty(),
            "others unaffected"
        );
    }
    job_is_told_on_its_stderr(&env);
    // The hosts share root's home: leave no fallback directory behind.
    for host in ["node02", "node03"] {
        let clean = r#"rm -rf "$HOME/.local/state/rb/run-$(hostname)""#;
        let _ = env.lab.exec(host, &["sh", "-c", clean]);
    }
}

/// A job with a command on each host: its stderr names the two planted hosts' refused
/// directory once each (the guardian tells the agent), the third host's not at all.
fn job_is_told_on_its_stderr(env: &LabWithBroker) {
    let dir = tempfile::tempdir().expect("tempdir");
    let err_file = dir.path().join("stderr");
    let mut child = env
        .agent(&[
            "sh",
            "-c",
            "rsh anyLinux-1 sleep 600 & rsh anyLinux-2 sleep 600 & rsh anyLinux-3 sleep 600 & wait",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_file).expect("stderr file"))
        .spawn()
        .expect("agent");
    let told = wait_until(Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&err_file).unwrap_or_default();
        ["node02", "node03"]
            .iter()
            .all(|h| text.contains(&format!("{h}: ")) && text.contains("/tmp/rb-0"))
            .then_some(text)
    });
    let _ = child.kill();
    let _ = child.wait();
    let text = told.unwrap_or_else(|| {
        panic!(
            "the job's stderr never named both hosts' refused directory:\n{}",
            std::fs::read_to_string(&err_file).unwrap_or_default()
        )
    });
    for host in ["node02", "node03"] {
        let lines = text
            .lines()
            .filter(|l| l.contains(&format!("{host}: ")) && l.contains("/tmp/rb-0"))
            .count();
        assert_eq!(lines, 1, "{host} told once:\n{text}");
    }
    assert!(!text.contains("node04: "), "{text}");
}
