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
use server::TestPool;

/// The test program, compiled once against libjel.so (rpath set) and jel.h.
fn member_program() -> &'static PathBuf {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let lib_dir = env!("JEL_C_DIR");
        let exe = PathBuf::from(lib_dir).join("member-test");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/member.c");
        let inc = concat!(env!("CARGO_MANIFEST_DIR"), "/c");
        let status = Command::new("cc")
            .args(["-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&exe)
            .args([src, "-I", inc, "-L", lib_dir, "-ljel"])
            .arg(format!("-Wl,-rpath,{lib_dir}"))
            .status()
            .expect("cc");
        assert!(status.success(), "compiling tests/c/member.c");
        exe
    })
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
