//! `jel::host::PoolHost`, the shell the agent hosts pools with, against real clients over
//! its real socket: the Rust client, jel.py and the C library, real closes and kills, a
//! raw slow reader, a peer of another uid, an over-long line.

mod server;

use std::{
    io::{BufRead, BufReader, Read, Write},
    os::unix::{net::UnixStream, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use jel::{
    host::{HostConfig, PoolHost},
    pool::PoolConfig,
    Client, DeathReason, EventKind,
};
use serde_json::json;

/// A pool hosted by [`PoolHost`] on a runtime of its own, in a temp dir.
struct Hosted {
    path: PathBuf,
    host: Option<PoolHost>,
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Hosted {
    fn start(config: PoolConfig) -> Hosted {
        Hosted::start_with(|c| HostConfig { pool: config, ..c })
    }

    fn start_with(change: impl FnOnce(HostConfig) -> HostConfig) -> Hosted {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jel.sock");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let config = change(HostConfig::new(&path, "front", PoolConfig::default()));
        let (host, _remote) = rt.block_on(async { PoolHost::bind(config) }).expect("bind");
        Hosted {
            path,
            host: Some(host),
            rt,
            _dir: dir,
        }
    }

    fn host(&self) -> &PoolHost {
        self.host.as_ref().expect("not terminated")
    }

    fn client(&self) -> Client {
        Client::connect_to(&self.path).expect("connect")
    }
}

/// Reads events until one matches; panics after 10 s.
fn wait_for(w: &mut jel::Watcher, what: &str, hit: impl Fn(&EventKind) -> bool) -> jel::Event {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let e = w.next_event().expect("event");
        if hit(&e.kind) {
            return e;
        }
    }
    panic!("no {what} within 10 s");
}

fn jel_py() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/jel.py"))
}

/// A Python member that joins as `name`, stands in `elect` if given, says `joined ID` and
/// waits on stdin.
fn python_member(pool: &Hosted, name: &str, elect: Option<&str>) -> (std::process::Child, u64) {
    let elect = match elect {
        Some(e) => format!("me.elect({e:?})"),
        None => String::new(),
    };
    let script = format!(
        "import sys; sys.path.insert(0, {dir:?}); import jel\n\
         me = jel.Client().join({name:?})\n\
         {elect}\n\
         print('joined', me.info['id'], flush=True)\n\
         sys.stdin.read()\n",
        dir = jel_py().parent().expect("dir").display().to_string(),
    );
    let mut child = Command::new("python3")
        .args(["-c", &script])
        .env(jel::ENV_JEL, &pool.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let id = line
        .strip_prefix("joined ")
        .and_then(|id| id.trim().parse().ok())
        .unwrap_or_else(|| panic!("python member said `{line}`"));
    (child, id)
}

#[test]
fn a_killed_python_member_is_died_exited_within_100_ms() {
    let pool = Hosted::start(PoolConfig::default());
    let mut w = pool.client().watch(1).expect("watch");
    let (mut child, id) = python_member(&pool, "py", None);
    wait_for(&mut w, "joined", |k| matches!(k, EventKind::Joined { .. }));
    child.kill().expect("kill");
    let killed = Instant::now();
    let died = wait_for(&mut w, "died", |k| matches!(k, EventKind::Died { .. }));
    let latency = killed.elapsed();
    child.wait().expect("wait");
    let EventKind::Died { member, reason } = died.kind else {
        unreachable!()
    };
    assert_eq!((member.id, reason), (id, DeathReason::Exited));
    assert!(
        latency < Duration::from_millis(100),
        "died after {latency:?}"
    );
}

#[test]
fn the_winner_killed_gives_every_watcher_the_next_candidate_with_the_next_epoch() {
    let pool = Hosted::start(PoolConfig::default());
    let mut w = pool.client().watch(1).expect("watch");
    let (mut first, first_id) = python_member(&pool, "first", Some("master"));
    let mut second = pool.client().join(Some("second")).expect("join");
    let e = second.elect("master").expect("elect");
    assert_eq!(
        e.winner.map(|m| m.id),
        Some(first_id),
        "the first candidate won"
    );
    first.kill().expect("kill");
    first.wait().expect("wait");
    let next = wait_for(&mut w, "elected", |k| {
        matches!(k, EventKind::Elected { epoch: 2, .. })
    });
    let EventKind::Elected { winner, .. } = next.kind else {
        unreachable!()
    };
    assert_eq!(winner.map(|m| m.id), Some(second.id()));
    assert_eq!(second.result("master").expect("result").epoch, 2);
}

#[test]
fn a_slow_raw_watcher_is_cut_off_and_resumes_with_no_gap_and_no_duplicate() {
    let config = PoolConfig {
        max_buffer: 16,
        ..PoolConfig::default()
    };
    let pool = Hosted::start(config);
    let mut me = pool.client().join(None).expect("join");
    let mut raw = UnixStream::connect(&pool.path).expect("connect");
    raw.write_all(b"{\"jel\":1}\n{\"op\":\"watch\",\"from\":1}\n")
        .expect("write");
    // We read nothing while 3000 fat signals go out: the socket fills, the pool cuts us off.
    let payload = json!("x".repeat(1000));
    let n = 3000;
    for _ in 0..n {
        me.signal("tick", &[], payload.clone()).expect("signal");
    }
    let mut seen = Vec::new();
    let mut text = String::new();
    raw.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    raw.read_to_string(&mut text).expect("EOF: cut off");
    for line in text.lines().skip(2) {
        let e: serde_json::Value = serde_json::from_str(line).expect("json");
        seen.push(e["seq"].as_u64().expect("seq"));
    }
    assert!(
        (seen.len() as u64) < n,
        "all events fitted: the watcher was not cut off"
    );
    let mut w = pool.client().watch(seen.len() as u64 + 1).expect("watch");
    for _ in seen.len() as u64 + 1..=n + 1 {
        seen.push(w.next_event().expect("event").seq);
    }
    let want: Vec<u64> = (1..=n + 1).collect();
    assert_eq!(seen, want);
}

#[test]
fn an_over_long_line_closes_its_connection() {
    let pool = Hosted::start_with(|c| HostConfig { max_line: 100, ..c });
    let mut w = pool.client().watch(1).expect("watch");
    let mut raw = UnixStream::connect(&pool.path).expect("connect");
    raw.write_all(b"{\"jel\":1}\n{\"op\":\"join\"}\n")
        .expect("write");
    wait_for(&mut w, "joined", |k| matches!(k, EventKind::Joined { .. }));
    raw.write_all(&[b'x'; 200]).expect("write");
    let died = wait_for(&mut w, "died", |k| matches!(k, EventKind::Died { .. }));
    assert!(matches!(
        died.kind,
        EventKind::Died {
            reason: DeathReason::Exited,
            ..
        }
    ));
}

#[test]
fn a_peer_of_another_uid_is_refused_before_its_hello() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to connect as another uid");
        return;
    }
    let pool = Hosted::start(PoolConfig::default());
    use std::os::unix::fs::PermissionsExt;
    let open = std::fs::Permissions::from_mode(0o777);
    std::fs::set_permissions(pool.path.parent().expect("dir"), open.clone()).expect("chmod");
    std::fs::set_permissions(&pool.path, open).expect("chmod");
    let script = "import socket, sys\n\
                  s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n\
                  try:\n    s.sendall(b'{\"jel\":1}\\n'); data = s.recv(100)\n\
                  except OSError:\n    data = b''\n\
                  print(repr(data))\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&pool.path)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "b''",
        "no hello for another uid"
    );
    let mut ours = pool.client();
    assert_eq!(ours.members().expect("members").1.len(), 0);
}

/// The C test program, compiled once against libjel.so.
fn c_member() -> &'static PathBuf {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| server::compile_c_member("member-host-test"))
}

#[test]
fn a_c_member_joins_elects_gets_its_signal_and_leaves_and_a_reclaim_reaches_it_first() {
    let pool = Hosted::start(PoolConfig::default());
    let mut rust = pool.client().join(Some("rust")).expect("join");
    rust.elect("master").expect("elect");
    let mut w = rust.watch(1).expect("watch");
    let mut child = Command::new(c_member())
        .arg("c")
        .env(jel::ENV_JEL, &pool.path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("line").expect("read");
    assert!(first.starts_with("rust 1 "), "{first}");
    let c_id: u64 = first
        .rsplit(' ')
        .next()
        .and_then(|id| id.parse().ok())
        .expect("id");
    pool.rt
        .block_on(pool.host().reclaim("front", 1_764_000_005_000))
        .expect("reclaim");
    let vacate = wait_for(&mut w, "vacate", |k| matches!(k, EventKind::Vacate { .. }));
    let EventKind::Vacate { members, .. } = vacate.kind else {
        unreachable!()
    };
    assert!(members.iter().any(|m| m.id == c_id), "{members:?}");
    rust.signal("go", &[c_id], json!(1)).expect("signal");
    assert!(lines
        .next()
        .expect("line")
        .expect("read")
        .contains("\"go\""));
    assert!(child.wait().expect("wait").success());
    let left = wait_for(&mut w, "left", |k| matches!(k, EventKind::Left { .. }));
    assert!(matches!(left.kind, EventKind::Left { member } if member.id == c_id));
}

#[test]
fn terminate_writes_terminated_to_every_client_then_closes_and_removes_the_socket() {
    let mut pool = Hosted::start(PoolConfig::default());
    let me = pool.client().join(None).expect("join");
    let mut w = me.watch(1).expect("watch");
    let host = pool.host.take().expect("host");
    pool.rt.block_on(host.terminate()).expect("terminate");
    let kinds: Vec<EventKind> = w.by_ref().map(|e| e.expect("event").kind).collect();
    assert_eq!(kinds.len(), 3, "{kinds:?}");
    assert_eq!(kinds[1..], [EventKind::Closed, EventKind::Terminated]);
    assert!(!pool.path.exists());
}
