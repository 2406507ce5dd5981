//! `jel.py` as real Python processes against the pool core served over a real Unix socket.

mod server;

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
};

use jel::{pool::PoolConfig, Client, EventKind};
use server::TestPool;

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
