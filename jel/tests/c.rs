//! libjel.so + jel.h as a real C program against the pool core served over a real Unix
//! socket: outside a job, join, elect, watch, a signal, leave.

mod server;

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    sync::OnceLock,
};

use jel::{pool::PoolConfig, Client, EventKind};
use serde_json::json;
use server::{kill_after, TestPool};

/// The test program, compiled once against libjel.so (rpath set) and jel.h.
fn member_program() -> &'static PathBuf {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| server::compile_c_member("member-test"))
}

#[test]
fn a_c_program_outside_a_job_says_so_and_exits_2() {
    let out = Command::new(member_program())
        .arg("x")
        .env_remove(jel::ENV_JEL)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not inside a ResourceBroker job"), "{err}");
}

#[test]
fn a_c_member_joins_elects_watches_gets_its_signal_and_leaves() {
    let pool = TestPool::start(PoolConfig::default());
    let mut rust = Client::connect_to(&pool.path)
        .expect("c")
        .join(Some("rust"))
        .expect("join");
    rust.elect("master").expect("elect");
    let mut w = rust.watch(1).expect("watch");
    let mut child = Command::new(member_program())
        .arg("c-\u{e9}l\u{e8}ve")
        .env(jel::ENV_JEL, &pool.path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run");
    let _guard = kill_after(child.id(), std::time::Duration::from_secs(60));
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("line").expect("read");
    let fields: Vec<&str> = first.split(' ').collect();
    assert_eq!(&fields[..2], ["rust", "1"], "{first}");
    let c_id: u64 = fields[2].parse().expect("id");
    let member = loop {
        let e = w.next_event().expect("event");
        if let EventKind::Joined { member } = e.kind {
            if member.id == c_id {
                break member;
            }
        }
    };
    assert_eq!(
        (member.id, member.name.as_deref()),
        (c_id, Some("c-\u{e9}l\u{e8}ve"))
    );
    let seq = rust.signal("go", &[c_id], json!({"n": 1})).expect("signal");
    let got = lines.next().expect("line").expect("read");
    let want = serde_json::to_string(&loop {
        let e = w.next_event().expect("event");
        if e.seq == seq {
            break e;
        }
    })
    .expect("json");
    assert_eq!(got, want, "the C client hands the line over exactly");
    assert!(child.wait().expect("wait").success());
    let left = w.next_event().expect("event");
    assert!(matches!(left.kind, EventKind::Left { member } if member.id == c_id));
}

#[test]
fn a_slow_c_watcher_is_cut_off_and_resumes_with_no_gap_and_no_duplicate() {
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
    let mut child = Command::new(member_program())
        .args(["watch", &(n + 1).to_string()])
        .env(jel::ENV_JEL, &pool.path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run");
    let _guard = kill_after(child.id(), std::time::Duration::from_secs(60));
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("line").expect("read");
    assert!(first.starts_with(r#"{"seq":1,"event":"joined""#), "{first}");
    // The program now blocks on its full stdout pipe and stops reading the socket.
    let payload = json!("x".repeat(1000));
    for _ in 0..n {
        me.signal("tick", &[], payload.clone()).expect("signal");
    }
    let cut_off = pool.cut_off.load(std::sync::atomic::Ordering::SeqCst);
    assert!(cut_off > 0, "the slow watcher was never cut off");
    for seq in 2..=n + 1 {
        let line = lines.next().expect("line").expect("read");
        let event: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(event["seq"].as_u64(), Some(seq));
    }
    assert!(child.wait().expect("wait").success());
}
