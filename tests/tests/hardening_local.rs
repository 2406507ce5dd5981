//! Tier 2, hostile and careless input: what the programs read is bounded, what the broker
//! accepts on the wire is range-checked. The real binaries; no root needed.

use std::{
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use proto::msg::Request;
use tests::{bin, local_lab, rb, wait_until, Broker};

/// How long a program may take to refuse what it reads (a loaded machine; the old
/// programs read `/dev/zero` until memory ran out).
const REFUSE_WITHIN: Duration = Duration::from_secs(30);

/// Waits for `child` to end (killing it past the deadline) and returns its output.
fn finish(mut child: Child, what: &str) -> Output {
    let ended = wait_until(REFUSE_WITHIN, || child.try_wait().ok().flatten());
    if ended.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what}: still running after {REFUSE_WITHIN:?}");
    }
    child.wait_with_output().expect("output")
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn agent_rsl_from_an_endless_file_ends_at_once_with_64() {
    let child = spawn(
        Command::new(bin("agent"))
            .args(["--rsl", "@/dev/zero", "true"])
            .stdin(Stdio::null()),
    );
    let out = finish(child, "agent --rsl @/dev/zero true");
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("longer than 65536 bytes"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn rb_rsl_check_of_an_endless_file_or_stdin_ends_at_once_with_64() {
    for (arg, stdin) in [("@/dev/zero", None), ("@-", Some("/dev/zero"))] {
        let mut cmd = Command::new(bin("rb"));
        cmd.args(["rsl", "check", arg]);
        match stdin {
            Some(path) => cmd.stdin(std::fs::File::open(path).expect("open")),
            None => cmd.stdin(Stdio::null()),
        };
        let out = finish(spawn(&mut cmd), arg);
        assert_eq!(out.status.code(), Some(64), "{arg}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("longer than 65536 bytes"),
            "{arg}: {}",
            stderr(&out)
        );
    }
    // A spec at the limit's side of it is still read.
    let out = rb(&["rsl", "check", "&(count=2)"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `rb release --grace-s` allows 0–3600 s; a peer writing the request itself cannot ask
/// for 2^64-1 ms (the broker printed "grace 18446744073709552.0 s" and took it).
#[test]
fn a_release_with_an_endless_grace_is_refused_on_the_wire() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(20));
    let target = rb::client::Target::Socket(broker.socket());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ask = |grace_ms| {
        runtime.block_on(rb::client::request(
            &target,
            Request::Release {
                host: "vhost01".into(),
                grace_ms: Some(grace_ms),
            },
        ))
    };
    let e = ask(u64::MAX).expect_err("refused");
    assert!(e.to_string().contains("out of range (0–3600000)"), "{e:#}");
    // An hour passes the range check (the free host then has nothing to release).
    let e = ask(3_600_000).expect_err("a free host");
    assert!(e.to_string().contains("nothing to release"), "{e:#}");
}

/// TCP connections beyond what the broker may hold wait in the listen queue, so a flood of
/// them leaves the control socket answering: at its open-files limit (20000 connections on
/// the machine of 2026-11-29) every accept failed with EMFILE, the control socket's too,
/// and `rb status` failed until the connections closed.
#[test]
fn a_flood_of_tcp_connections_leaves_the_control_socket_answering() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let wrapper = dir.path().join("rb-broker");
    // `ulimit -n` sets both limits: the broker cannot raise it back.
    let script = format!(
        "#!/bin/sh\nulimit -n 64 || exit 99\nexec '{}' \"$@\"\n",
        bin("rb-broker").display()
    );
    std::fs::write(&wrapper, script).expect("wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let broker = Broker::start_program(&wrapper, &local_lab(1));
    broker.wait_all_up(Duration::from_secs(20));
    let addr = broker.tcp_addr();
    // More than the 64 files the broker may have open; fewer than its 16 slots and the
    // listen queue (128) hold.
    let flood: Vec<std::net::TcpStream> = (0..120)
        .map(|_| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect")
        })
        .collect();
    let sock = broker.socket().display().to_string();
    // Until the broker took what it may: its slots (or, before them, its files) ran out.
    let full =
        |log: &str| log.contains("every TCP connection slot") || log.contains("accept failed");
    let ran_out = wait_until(Duration::from_secs(10), || {
        full(&broker.log()).then_some(())
    });
    assert!(
        ran_out.is_some(),
        "the broker took every connection:\n{}",
        broker.log()
    );
    let status = rb(&["--broker", &sock, "status", "--json"]);
    assert!(
        status.status.success(),
        "rb status during the flood: {}\n{}",
        stderr(&status),
        broker.log()
    );
    assert!(String::from_utf8_lossy(&status.stdout).contains("vhost01"));
    assert!(
        !broker.log().contains("accept failed"),
        "no accept failed:\n{}",
        broker.log()
    );
    drop(flood);
    broker.wait_all_up(Duration::from_secs(20));
}
