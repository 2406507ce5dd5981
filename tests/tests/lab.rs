//! Tier 3: real hosts (network, UTS, mount and PID namespaces, each with its own sshd), a
//! broker in the root namespace starting `rb-hostd` on each over real ssh. Root only; each
//! test prints why it is skipped otherwise. Every lab is torn down on drop, also on failure.

use std::{
    io::{Read, Write},
    time::{Duration, Instant},
};

use proto::report::HostState;
use tests::labtier::{skip_unless_root, LabWithBroker};

#[test]
fn four_hosts_report_their_own_hostnames() {
    if skip_unless_root("four_hosts_report_their_own_hostnames") {
        return;
    }
    let env = LabWithBroker::start(4, &[]);
    let rows = env.broker.status().expect("status");
    assert_eq!(rows.len(), 4);
    for row in &rows {
        assert_eq!(row.state, HostState::Up, "{row:?}");
        assert_eq!(
            row.hostname.as_deref(),
            Some(row.name.as_str()),
            "each host reports its own hostname"
        );
        assert!(row.users_known, "utmp is readable inside a host: {row:?}");
    }
    let table = String::from_utf8_lossy(&env.broker.rb(&["status"]).stdout).to_string();
    for name in ["node02", "node03", "node04", "node05"] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(name) && l.contains(" up ")),
            "{name} missing in\n{table}"
        );
    }
}

#[test]
fn owner_login_on_node03_is_visible_within_one_second() {
    if skip_unless_root("owner_login_on_node03_is_visible_within_one_second") {
        return;
    }
    let env = LabWithBroker::start(3, &[("node03", "alice")]);
    let start = Instant::now();
    let login = env
        .lab
        .fake_login("node03", "alice", "rbtty-alice", Duration::from_secs(300))
        .expect("fake login");
    let row = env
        .broker
        .wait_host("node03", Duration::from_secs(1), "alice's login", |h| {
            h.users.iter().any(|u| u.user == "alice")
        });
    eprintln!("owner login visible after {:?}", start.elapsed());
    let session = row.users.iter().find(|u| u.user == "alice").expect("alice");
    let idle = session.idle_s.expect("idle time known");
    assert!(
        (295..=310).contains(&idle),
        "idle {idle} s, expected about 300"
    );
    assert_eq!(row.owner.as_deref(), Some("alice"));
    let node02 = env.broker.host("node02").expect("node02");
    assert!(
        node02.users.iter().all(|u| u.user != "alice"),
        "login leaked to node02: {node02:?}"
    );
    // Keyboard used: idle drops to ~0 and is reported at once (input-activity trigger).
    login.touch().expect("touch");
    env.broker.wait_host(
        "node03",
        Duration::from_secs(1),
        "alice active again",
        |h| {
            h.users
                .iter()
                .any(|u| u.user == "alice" && u.idle_s.is_some_and(|i| i < 5))
        },
    );
    login.end().expect("logout");
    env.broker
        .wait_host("node03", Duration::from_secs(3), "alice gone", |h| {
            h.users.iter().all(|u| u.user != "alice")
        });
}

#[test]
fn crashed_host_goes_down_and_comes_back_after_boot_without_help() {
    if skip_unless_root("crashed_host_goes_down_and_comes_back_after_boot_without_help") {
        return;
    }
    let env = LabWithBroker::start(3, &[]);
    let before = env.broker.host("node02").expect("node02");
    let crashed_at = Instant::now();
    env.lab.crash("node02").expect("crash");
    env.broker
        .wait_host("node02", Duration::from_secs(10), "down after crash", |h| {
            h.state == HostState::Down
        });
    eprintln!("node02 down {:?} after crash", crashed_at.elapsed());
    let booted_at = Instant::now();
    env.lab.boot("node02").expect("boot");
    let row = env
        .broker
        .wait_host("node02", Duration::from_secs(10), "up after boot", |h| {
            h.state == HostState::Up
        });
    eprintln!("node02 up {:?} after boot", booted_at.elapsed());
    assert!(
        row.daemon_starts > before.daemon_starts,
        "the broker restarted the daemon: {row:?}"
    );
    assert_eq!(
        env.broker.host("node03").expect("node03").state,
        HostState::Up,
        "others unaffected"
    );
}

#[test]
fn killing_only_hostd_on_node04_gets_it_restarted() {
    if skip_unless_root("killing_only_hostd_on_node04_gets_it_restarted") {
        return;
    }
    let env = LabWithBroker::start(3, &[]);
    let pid = env.hostd_pid("node04").expect("hostd pid on node04");
    let before = env.broker.host("node04").expect("node04").daemon_starts;
    let out = env.lab.exec("node04", &["kill", "-9", &pid]).expect("kill");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = env.broker.wait_host(
        "node04",
        Duration::from_secs(10),
        "restarted daemon reporting",
        |h| h.state == HostState::Up && h.daemon_starts > before,
    );
    assert_ne!(
        env.hostd_pid("node04").as_deref(),
        Some(pid.as_str()),
        "a new daemon runs: {row:?}"
    );
    let sshd_alive = env
        .lab
        .exec("node04", &["pgrep", "-x", "sshd"])
        .expect("pgrep");
    assert!(sshd_alive.status.success(), "only hostd was killed");
}

#[test]
fn partitioned_host_goes_down_and_heals() {
    if skip_unless_root("partitioned_host_goes_down_and_heals") {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let cut_at = Instant::now();
    env.lab.partition("node03").expect("partition");
    env.broker.wait_host(
        "node03",
        Duration::from_secs(10),
        "down while partitioned",
        |h| h.state == HostState::Down,
    );
    eprintln!("node03 down {:?} after partition", cut_at.elapsed());
    assert_eq!(
        env.broker.host("node02").expect("node02").state,
        HostState::Up
    );
    let healed_at = Instant::now();
    env.lab.heal("node03").expect("heal");
    env.broker
        .wait_host("node03", Duration::from_secs(15), "up after heal", |h| {
            h.state == HostState::Up
        });
    eprintln!("node03 up {:?} after heal", healed_at.elapsed());
    // Exactly one daemon is left on the healed host (the newer one took over).
    let out = env
        .lab
        .exec("node03", &["pgrep", "-c", "-x", "rb-hostd"])
        .expect("pgrep");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1",
        "one hostd on node03"
    );
}

#[test]
fn wrong_secret_and_garbage_from_a_lab_host_are_rejected() {
    if skip_unless_root("wrong_secret_and_garbage_from_a_lab_host_are_rejected") {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let addr = env.broker.tcp_addr().to_string();
    // A daemon on node03 with another secret: refused, exits non-zero, node03 stays up.
    let script = format!(
        "umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /tmp/wrong; \
         exec {} --broker {addr} --host node03 --secret-file /tmp/wrong --lock-dir /tmp/other",
        tests::bin("rb-hostd").display()
    );
    let out = env
        .lab
        .exec("node03", &["sh", "-c", &script])
        .expect("run hostd");
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not hold our lab secret"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Garbage bytes from node02 to the broker port.
    let garbage = format!(
        "head -c 300000 /dev/urandom > /dev/tcp/{}/{} || true",
        env.lab.gateway(),
        env.broker.tcp_addr().port()
    );
    env.lab
        .exec("node02", &["bash", "-c", &garbage])
        .expect("send garbage");
    let mut raw = std::net::TcpStream::connect(env.broker.tcp_addr()).expect("connect");
    raw.write_all(b"{\"t\":\"report\"}\n").expect("write");
    let mut buf = String::new();
    raw.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let _ = raw.read_to_string(&mut buf);
    assert!(
        buf.contains("expected hello") || buf.contains("error"),
        "{buf}"
    );
    let rows = env.broker.status().expect("broker still answers");
    assert!(rows.iter().all(|h| h.state == HostState::Up), "{rows:?}");
    let logged = tests::wait_until(Duration::from_secs(5), || {
        env.broker
            .log()
            .contains("dropped connection")
            .then_some(())
    });
    assert!(logged.is_some(), "bad peers must be logged");
}

/// Root's logins in a host never run the build machine's `~/.bashrc` (this machine's runs
/// `pyenv init`, whose rehash waits 60 s on a lock left by a host crashed during a login,
/// stalling every later root login of every lab); the machine's own file is untouched.
#[test]
fn a_root_login_in_a_host_reads_an_empty_bashrc() {
    if skip_unless_root("a_root_login_in_a_host_reads_an_empty_bashrc") {
        return;
    }
    let machines = std::fs::read("/root/.bashrc").ok();
    let env = LabWithBroker::start(1, &[]);
    let out = env
        .lab
        .ssh("node02", false)
        .expect("node02")
        .args(["wc", "-c", "<", "~/.bashrc;", "echo", "PATH=$PATH"])
        .output()
        .expect("ssh");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if machines.is_some() {
        assert!(text.starts_with("0\n"), "root's .bashrc in node02: {text}");
    }
    assert!(
        !text.contains(".pyenv"),
        "no start-up of the machine ran: {text}"
    );
    assert_eq!(
        std::fs::read("/root/.bashrc").ok(),
        machines,
        "the machine's file is kept"
    );
}
