//! Tier 2: the real binaries on one machine, virtual hosts through the `local` transport.
//! No root needed.

use std::{
    io::{Read, Write},
    net::TcpStream,
    os::unix::process::CommandExt,
    time::Duration,
};

use proto::report::HostState;
use tests::{local_lab, rb, wait_until, Broker};

#[test]
fn embedded_demo_brings_every_virtual_host_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("demo");
    let out = rb(&[
        "demo",
        "--hosts",
        "3",
        "--state-dir",
        state.to_str().expect("utf8"),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rb demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("3 hosts: 3 up, 0 down"), "{stdout}");
    for h in ["vhost01", "vhost02", "vhost03"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(h) && l.contains(" up ")),
            "{h} not up in:\n{stdout}"
        );
    }
    assert!(
        !state.join("broker.sock").exists(),
        "demo must stop its broker"
    );
}

/// `rb demo --keep` returns when its output goes to a pipe or a command substitution:
/// the broker it keeps running holds none of the caller's descriptors.
#[test]
fn demo_keep_returns_through_a_pipe_and_a_command_substitution() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("demo");
    let rb_path = tests::bin("rb");
    for shape in [
        "\"$RB\" demo --keep --hosts 1 --state-dir \"$STATE\" | cat",
        "x=$(\"$RB\" demo --keep --hosts 1 --state-dir \"$STATE\") && printf '%s\\n' \"$x\"",
    ] {
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(shape)
            .env("RB", &rb_path)
            .env("STATE", &state)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let finished = wait_until(Duration::from_secs(60), || child.try_wait().ok().flatten());
        let socket = state.join("broker.sock");
        let stop = || {
            let sock = socket.to_str().expect("utf8");
            rb(&["--broker", sock, "shutdown"])
        };
        if finished.is_none() {
            let _ = stop();
            let _ = child.kill();
            panic!("`{shape}` did not return within 60 s");
        }
        let out = child.wait_with_output().expect("output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{shape}: {stdout}");
        assert!(
            stdout.contains("1 hosts: 1 up, 0 down"),
            "{shape}: {stdout}"
        );
        assert!(socket.exists(), "the broker was kept");
        let stopped = stop();
        assert!(stopped.status.success(), "{stopped:?}");
        wait_until(Duration::from_secs(20), || (!socket.exists()).then_some(()))
            .expect("the kept broker stopped");
    }
}

#[test]
fn status_json_has_the_documented_fields() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let out = broker.rb(&["status", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json array");
    let first = &rows.as_array().expect("array")[0];
    for key in [
        "name",
        "state",
        "cpus",
        "load1",
        "users",
        "console_idle_s",
        "labels",
        "owner",
        "last_report_age_s",
    ] {
        assert!(first.get(key).is_some(), "missing `{key}` in {first}");
    }
    assert_eq!(first["state"], "up");
    assert!(first["cpus"].as_u64().is_some_and(|c| c >= 1), "{first}");
    let table = String::from_utf8_lossy(&broker.rb(&["status"]).stdout).to_string();
    assert!(table.starts_with("HOST"), "{table}");
    assert!(table.contains("2 hosts: 2 up, 0 down"), "{table}");
}

#[test]
fn killed_host_daemon_is_restarted_by_the_broker() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let before = broker.host("vhost02").expect("vhost02");
    let pid = broker
        .local_hostd_pid("vhost02")
        .expect("hostd pid from lock file");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill hostd");
    broker.wait_host("vhost02", Duration::from_secs(5), "down after kill", |h| {
        h.state == HostState::Down || h.daemon_starts > before.daemon_starts
    });
    let after = broker.wait_host(
        "vhost02",
        Duration::from_secs(10),
        "up again with a new daemon",
        |h| h.state == HostState::Up && h.daemon_starts > before.daemon_starts,
    );
    assert_ne!(broker.local_hostd_pid("vhost02"), Some(pid));
    assert_eq!(after.daemon_starts, before.daemon_starts + 1, "{after:?}");
}

#[test]
fn overlay_login_is_reported_within_one_second_despite_a_long_interval() {
    let lab = tests::local_lab_timed(2, 30.0, 90.0);
    let broker = Broker::start(&lab);
    broker.wait_all_up(Duration::from_secs(10));
    let overlay = broker.state_dir().join("hosts/vhost02/overlay.toml");
    let tmp = overlay.with_extension("tmp");
    std::fs::write(
        &tmp,
        "[[users]]\nuser = \"alice\"\ntty = \"pts/7\"\nidle_s = 42\n",
    )
    .expect("write overlay");
    std::fs::rename(&tmp, &overlay).expect("rename overlay");
    let started = std::time::Instant::now();
    let host = broker.wait_host("vhost02", Duration::from_secs(1), "alice's login", |h| {
        h.users.iter().any(|u| u.user == "alice")
    });
    eprintln!("login visible after {:?}", started.elapsed());
    assert_eq!(host.users[0].idle_s, Some(42));
    assert_eq!(host.users[0].tty, "pts/7");
    let other = broker.host("vhost01").expect("vhost01");
    assert!(
        other.users.iter().all(|u| u.user != "alice"),
        "overlay leaked to another host: {other:?}"
    );
}

#[test]
fn garbage_on_the_broker_port_leaves_it_unaffected() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let addr = broker.tcp_addr();
    let mut silent = TcpStream::connect(addr).expect("connect");
    for payload in [
        &b"\x00\xff\xfe garbage {{{\n"[..],
        b"{\"t\":\"hello\",\"proto\":99}\n",
        b"GET / HTTP/1.0\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(payload).expect("write");
        let mut buf = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let _ = s.read_to_end(&mut buf);
        assert!(
            String::from_utf8_lossy(&buf).contains("\"t\":\"error\"") || buf.is_empty(),
            "{}",
            String::from_utf8_lossy(&buf)
        );
    }
    endless_line_is_dropped_without_growing_the_broker(&broker);
    let hosts = broker.status().expect("broker still answers");
    assert!(hosts.iter().all(|h| h.state == HostState::Up), "{hosts:?}");
    silent.write_all(b"\n").ok();
    let logged = wait_until(Duration::from_secs(5), || {
        broker.log().contains("dropped connection").then_some(())
    });
    assert!(logged.is_some(), "bad peers must be logged");
}

/// A peer streaming 100 MiB without a newline is dropped at the frame limit
/// (its writes fail long before 100 MiB), and the broker's peak RSS does not grow by
/// anything near what was sent.
fn endless_line_is_dropped_without_growing_the_broker(broker: &Broker) {
    let peak_before = peak_rss_kib(broker.child.id()).expect("broker VmHWM");
    let mut huge = TcpStream::connect(broker.tcp_addr()).expect("connect");
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0usize;
    while sent < 100 << 20 && huge.write_all(&chunk).is_ok() {
        sent += chunk.len();
    }
    assert!(
        sent < 100 << 20,
        "the broker read 100 MiB of one line without dropping the connection"
    );
    let peak_after = peak_rss_kib(broker.child.id()).expect("broker VmHWM");
    let grown = peak_after.saturating_sub(peak_before);
    eprintln!("dropped after {sent} bytes; broker peak RSS grew by {grown} KiB");
    assert!(
        grown < 8 * 1024,
        "broker peak RSS grew by {grown} KiB for one endless line (limit {} bytes)",
        proto::MAX_FRAME_BYTES
    );
}

/// Peak resident set size of a process, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn a_peer_with_the_wrong_secret_is_rejected() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    // A host daemon holding another secret refuses the broker (mutual proof) and exits.
    let dir = tempfile::tempdir().expect("tempdir");
    let wrong = dir.path().join("secret");
    proto::auth::write_new_secret(&wrong, false).expect("secret");
    let out = std::process::Command::new(tests::bin("rb-hostd"))
        .args([
            "--broker",
            &broker.tcp_addr().to_string(),
            "--host",
            "vhost01",
            "--lock-dir",
        ])
        .arg(dir.path())
        .arg("--secret-file")
        .arg(&wrong)
        .output()
        .expect("run hostd");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not hold our lab secret"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A raw client that answers the challenge with a wrong MAC gets an auth error.
    let mut s = TcpStream::connect(broker.tcp_addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(
        b"{\"t\":\"hello\",\"proto\":1,\"role\":\"hostd\",\"name\":\"vhost01\",\"nonce\":\"00\"}\n",
    )
    .expect("hello");
    let mut line = read_line(&mut s);
    assert!(line.contains("\"t\":\"challenge\""), "{line}");
    s.write_all(format!("{{\"t\":\"auth\",\"mac\":\"{}\"}}\n", "ab".repeat(32)).as_bytes())
        .expect("auth");
    line = read_line(&mut s);
    assert!(line.contains("\"code\":\"auth\""), "{line}");
    let logged = wait_until(Duration::from_secs(5), || {
        broker.log().contains("wrong lab secret").then_some(())
    });
    assert!(logged.is_some(), "{}", broker.log());
    assert_eq!(
        broker.host("vhost01").expect("host").state,
        HostState::Up,
        "the real daemon is unaffected"
    );
}

fn read_line(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while s.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
        out.push(byte[0]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn rb_check_reports_file_line_and_key_with_exit_64() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("lab.toml");
    std::fs::write(&file, "[broker]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"/tmp/x\"\n\n[[host]]\nname = \"a\"\nlabel = [\"x\"]\n").expect("write");
    let out = rb(&["check", file.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lab.toml:7:1"), "{err}");
    assert!(err.contains("unknown field `label`"), "{err}");
    assert!(err.contains("help:"), "{err}");
    let good = dir.path().join("good.toml");
    // rb check also checks the secret file, as rb-broker does at start.
    let secret = dir.path().join("secret");
    proto::auth::write_new_secret(&secret, false).expect("secret");
    std::fs::write(
        &good,
        local_lab(2)
            .replace("@STATE@", "/tmp/s")
            .replace("@SECRET@", secret.to_str().expect("utf8")),
    )
    .expect("write");
    let out = rb(&["check", good.to_str().expect("utf8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok: 2 hosts, transport local"));
}

#[test]
fn another_uid_cannot_use_the_control_socket() {
    if !tests::is_root() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: another_uid_cannot_use_the_control_socket: needs root to act as another uid"
        );
        return;
    }
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    // Open the file mode so only the SO_PEERCRED check stands in the way.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(broker.socket(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    std::fs::set_permissions(broker.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    std::fs::set_permissions(broker.state_dir(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let out = std::process::Command::new(tests::bin("rb"))
        .args([
            "--broker",
            broker.socket().to_str().expect("utf8"),
            "status",
        ])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run rb as nobody");
    assert!(!out.status.success());
    // `rb` itself refuses first: the socket is served by uid 0, not by nobody.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("served by uid 0, not you (uid 65534)"),
        "{err}"
    );
    // A client that does not check (raw hello from perl, as nobody): the broker refuses.
    let hello = proto::frame::encode(&proto::msg::ToBroker::Hello(proto::msg::Hello {
        proto: proto::PROTOCOL_VERSION,
        role: proto::msg::Role::Client,
        name: "raw".into(),
        nonce: String::new(),
        user: None,
    }))
    .expect("encode");
    let raw = std::process::Command::new("perl")
        .args([
            "-MIO::Socket::UNIX",
            "-e",
            r#"my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "connect: $!";
               print $s "$ARGV[1]\n"; print scalar <$s>;"#,
            broker.socket().to_str().expect("utf8"),
            &hello,
        ])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run perl as nobody");
    let reply = String::from_utf8_lossy(&raw.stdout);
    assert!(
        reply.contains("uid 65534 may not use the control socket"),
        "{reply} {}",
        String::from_utf8_lossy(&raw.stderr)
    );
    assert!(
        wait_until(Duration::from_secs(2), || broker.status()).is_some(),
        "owner still served"
    );
}

#[test]
fn status_of_a_lab_bigger_than_one_frame_is_served() {
    // 4000 hosts (manual transport, no daemons): the answer is several MiB, more than the
    // 1 MiB a broker accepts from peers, and must still reach `rb`.
    let mut lab = String::from("[broker]\nlisten = \"127.0.0.1:0\"\ntransport = \"manual\"\nstate_dir = \"@STATE@\"\nsecret_file = \"@SECRET@\"\n");
    for i in 0..4000 {
        lab.push_str(&format!("[[host]]\nname = \"load{i:05}\"\nlabels = [\"public\", \"a-fairly-long-label-to-grow-the-answer\"]\n"));
    }
    let broker = Broker::start(&lab);
    let out = broker.rb(&["status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.len() > proto::MAX_FRAME_BYTES,
        "answer only {} bytes",
        out.stdout.len()
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(rows.len(), 4000);
}

/// On a fresh broker (no job ever ran) `rb drain` and `rb resume` know the
/// lab file's hosts, and `rb status` shows the drain (column and `--json`).
#[test]
fn drain_and_resume_on_a_fresh_broker_show_in_rb_status() {
    let broker = Broker::start(&local_lab(2));
    let out = broker.rb(&["drain", "vhost02"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = broker.host("vhost02").expect("vhost02");
    assert_eq!((row.drained, row.alloc_state.as_str()), (true, "drained"));
    assert_eq!(row.held_by, None);
    let table = String::from_utf8_lossy(&broker.rb(&["status"]).stdout).to_string();
    let line = table
        .lines()
        .find(|l| l.starts_with("vhost02"))
        .expect("row");
    assert!(line.contains(" drained "), "{table}");
    let out = broker.rb(&["resume", "vhost02"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = broker.host("vhost02").expect("vhost02");
    assert_eq!((row.drained, row.alloc_state.as_str()), (false, "free"));
}

/// `agent --broker SOCKET -- ARGS…` for the broker's lab, with `RB_VERBOSE` set.
fn verbose_agent(broker: &Broker, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(tests::bin("agent"));
    cmd.arg("--broker")
        .arg(broker.socket())
        .arg("--")
        .args(args);
    cmd.env_remove("RB_AGENT")
        .env_remove("RB_LAB")
        .env("RB_VERBOSE", "1");
    cmd
}

/// A child process killed and reaped when the test ends, even by a panic.
struct Reap(Option<std::process::Child>);

impl Reap {
    fn take(&mut self) -> std::process::Child {
        self.0.take().expect("child not taken yet")
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `rb status` names the job holding a host; `rb jobs` shows start and
/// end times and why a request waits, in aligned columns; a waiting `rsh` off a terminal
/// with `RB_VERBOSE` says the same reason once on stderr.
#[test]
fn rb_status_and_jobs_show_the_holder_times_and_why_a_request_waits() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let mut first = Reap(Some(
        verbose_agent(&broker, &["rsh", "anyLinux", "sleep 60"])
            .spawn()
            .expect("first agent"),
    ));
    let holder = broker.wait_host("vhost01", Duration::from_secs(10), "held", |h| {
        h.alloc_state == "held"
    });
    let job = holder.held_by.expect("held_by");
    let mut second = Reap(Some(
        verbose_agent(&broker, &["rsh", "anyLinux", "echo second"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("second agent"),
    ));
    let waiting = wait_until(Duration::from_secs(10), || {
        broker
            .jobs()
            .into_iter()
            .find_map(|j| j["waiting"].as_array()?.first().cloned())
    })
    .expect("a waiting request in rb jobs --json");
    assert_eq!(waiting["reason_code"], "all_held", "{waiting}");
    assert_eq!(waiting["position"], 1);
    assert!(waiting["age_s"].as_f64().is_some(), "{waiting}");
    let text = String::from_utf8_lossy(&broker.rb(&["jobs"]).stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("JOB  USER"), "{text}");
    let started = lines[0].find("STARTED").expect("STARTED column");
    assert!(
        lines[1][started..].starts_with(|c: char| c.is_ascii_digit()),
        "a start time under STARTED: {text}"
    );
    assert!(
        text.contains("waits: anyLinux #1 for ")
            && text.contains(": 1 matching host(s): 1 held by jobs"),
        "{text}"
    );
    let table = String::from_utf8_lossy(&broker.rb(&["status"]).stdout).to_string();
    assert!(table.contains(&format!(" held({job}) ")), "{table}");
    let out = broker.rb(&["release", "vhost01", "--grace-s", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = second.take().wait_with_output().expect("second ends");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{stderr}");
    assert_eq!(
        stderr
            .matches("rsh: waiting for a host for anyLinux (position 1): 1 matching host(s): 1 held by jobs")
            .count(),
        1,
        "{stderr}"
    );
    let _ = first.take().wait();
    let ended = wait_until(Duration::from_secs(10), || {
        broker
            .jobs()
            .into_iter()
            .find(|j| j["id"] == job && j["state"] == "ended")
    })
    .expect("first job ended");
    assert!(
        ended["ended_at"].as_u64() >= ended["started_at"].as_u64() && ended["ended_at"].is_u64(),
        "{ended}"
    );
}
