//! `jel.py` as real Python processes against the pool core served over a real Unix socket.

mod server;

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
};

use jel::{pool::PoolConfig, Client, EventKind};
use server::{kill_after, TestPool};

fn jel_py() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/jel.py"))
}

fn python(pool: Option<&TestPool>, args: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(jel_py()).args(args);
    match pool {
        Some(pool) => cmd.env(jel::ENV_JEL, &pool.path),
        None => cmd.env_remove(jel::ENV_JEL),
    };
    cmd
}

#[test]
fn jel_py_outside_a_job_says_so_and_exits_2() {
    let out = python(None, &["members"]).output().expect("python3");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not inside a ResourceBroker job"), "{err}");
}

#[test]
fn jel_py_watch_prints_events_exactly_as_the_stream_has_them() {
    let pool = TestPool::start(PoolConfig::default());
    let mut me = Client::connect_to(&pool.path)
        .expect("c")
        .join(Some("rust"))
        .expect("join");
    me.elect("master").expect("elect");
    let out = python(Some(&pool), &["watch", "--from", "1", "--count", "2"])
        .output()
        .expect("python3");
    assert!(out.status.success(), "{out:?}");
    let mut rust = Client::connect_to(&pool.path)
        .expect("w")
        .watch(1)
        .expect("watch");
    let want: Vec<String> = (0..2)
        .map(|_| serde_json::to_string(&rust.next_event().expect("event")).expect("json"))
        .collect();
    let got: Vec<&str> = std::str::from_utf8(&out.stdout)
        .expect("utf8")
        .lines()
        .collect();
    assert_eq!(got, want);
    let out = python(Some(&pool), &["result", "master"])
        .output()
        .expect("python3");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "rust\n");
    let out = python(Some(&pool), &["result", "nobody"])
        .output()
        .expect("python3");
    assert_eq!(out.status.code(), Some(1), "no winner: exit 1");
}

#[test]
fn a_python_member_that_exits_without_leave_is_died_exited_and_loses_its_election() {
    let pool = TestPool::start(PoolConfig::default());
    let mut w = Client::connect_to(&pool.path)
        .expect("w")
        .watch(1)
        .expect("watch");
    let script = format!(
        "import sys; sys.path.insert(0, {dir:?}); import jel\n\
         me = jel.Client().join('py')\n\
         print(jel.winner_label(me.elect('master')), me.id, flush=True)\n\
         sys.stdin.readline()\n",
        dir = jel_py().parent().expect("dir").display().to_string()
    );
    let mut child = Command::new("python3")
        .args(["-c", &script])
        .env(jel::ENV_JEL, &pool.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let _guard = kill_after(child.id(), std::time::Duration::from_secs(60));
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout");
    BufReader::new(stdout).read_line(&mut line).expect("read");
    let id: u64 = line
        .split_whitespace()
        .nth(1)
        .expect("id")
        .parse()
        .expect("number");
    assert!(line.starts_with("py "), "{line}");
    child.kill().expect("kill");
    child.wait().expect("wait");
    let kinds: Vec<EventKind> = (0..4)
        .map(|_| w.next_event().expect("event").kind)
        .collect();
    assert!(
        matches!(&kinds[2], EventKind::Died { member, .. } if member.id == id),
        "{kinds:?}"
    );
    assert!(
        matches!(
            &kinds[3],
            EventKind::Elected {
                winner: None,
                epoch: 2,
                ..
            }
        ),
        "{kinds:?}"
    );
}

#[test]
fn a_slow_python_watcher_is_cut_off_and_resumes_with_no_gap_and_no_duplicate() {
    let config = PoolConfig {
        max_buffer: 16,
        ..PoolConfig::default()
    };
    let pool = TestPool::start(config);
    let mut me = Client::connect_to(&pool.path)
        .expect("c")
        .join(None)
        .expect("join");
    let n = 3000;
    let count = (n + 1).to_string();
    let mut child = python(Some(&pool), &["watch", "--from", "1", "--count", &count])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let _guard = kill_after(child.id(), std::time::Duration::from_secs(60));
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("line").expect("read");
    assert!(first.starts_with(r#"{"seq":1,"event":"joined""#), "{first}");
    // Python now blocks on its full stdout pipe and stops reading the socket.
    let payload = serde_json::json!("x".repeat(1000));
    for _ in 0..n {
        me.signal("tick", &[], payload.clone()).expect("signal");
    }
    assert!(
        pool.cut_off.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "the slow watcher was never cut off"
    );
    for seq in 2..=n + 1 {
        let line = lines.next().expect("line").expect("read");
        let event: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(event["seq"].as_u64(), Some(seq));
    }
    assert!(child.wait().expect("wait").success());
}
