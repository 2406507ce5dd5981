//! The Rust client against the pool core served over a real Unix socket (`server`): real
//! connections, real closes, a real slow reader.

mod server;

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use jel::{
    pool::{Input, PoolConfig},
    Client, DeathReason, EventKind, JelError,
};
use serde_json::json;
use server::TestPool;

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

#[test]
fn outside_a_job_every_client_fails_with_exit_2() {
    std::env::remove_var(jel::ENV_JEL);
    let e = Client::connect().expect_err("no RB_JEL");
    assert!(matches!(e, JelError::NotInJob));
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().starts_with("not inside a ResourceBroker job"));
}

#[test]
fn members_join_watch_and_a_closed_connection_is_died_exited() {
    let pool = TestPool::start(PoolConfig::default());
    let a = Client::connect_to(&pool.path)
        .expect("a")
        .join(Some("a"))
        .expect("join a");
    assert_eq!(a.info().pid, std::process::id(), "pid from SO_PEERCRED");
    let mut w = a.watch(1).expect("watch");
    let b = Client::connect_to(&pool.path)
        .expect("b")
        .join(None)
        .expect("join b");
    let b_id = b.id();
    drop(b);
    let died = wait_for(&mut w, "died", |k| matches!(k, EventKind::Died { .. }));
    assert_eq!(died.seq, 3, "joined a, joined b, died b");
    let EventKind::Died { member, reason } = died.kind else {
        unreachable!()
    };
    assert_eq!((member.id, reason), (b_id, DeathReason::Exited));
    let (_, rows) = Client::connect_to(&pool.path)
        .expect("c")
        .members()
        .expect("members");
    assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1]);
    let seq = a.leave().expect("leave");
    assert_eq!(seq, 4);
}

#[test]
fn the_winner_killed_gives_a_new_winner_with_the_next_epoch() {
    let pool = TestPool::start(PoolConfig::default());
    let mut first = Client::connect_to(&pool.path)
        .expect("1")
        .join(Some("first"))
        .expect("j1");
    let mut second = Client::connect_to(&pool.path)
        .expect("2")
        .join(Some("second"))
        .expect("j2");
    let mut w = Client::connect_to(&pool.path)
        .expect("w")
        .watch(1)
        .expect("watch");
    assert_eq!(first.elect("master").expect("elect").epoch, 1);
    let r = second.elect("master").expect("elect");
    assert_eq!(r.winner.map(|m| m.label()), Some("first".into()));
    drop(first);
    let e = wait_for(&mut w, "a new winner", |k| {
        matches!(k, EventKind::Elected { epoch: 2, .. })
    });
    let EventKind::Elected { winner, .. } = e.kind else {
        unreachable!()
    };
    assert_eq!(winner.map(|m| m.label()), Some("second".into()));
    let r = second.result("master").expect("result");
    assert_eq!((r.winner.map(|m| m.id), r.epoch), (Some(second.id()), 2));
}

#[test]
fn a_slow_watcher_is_cut_off_and_resumes_with_no_gap_and_no_duplicate() {
    let config = PoolConfig {
        max_log: 100_000,
        max_buffer: 16,
        ..PoolConfig::default()
    };
    let pool = TestPool::start(config);
    let mut me = Client::connect_to(&pool.path)
        .expect("c")
        .join(None)
        .expect("join");
    let mut w = me.watch(1).expect("watch");
    let payload = json!("x".repeat(1000));
    let n = 3000;
    for _ in 0..n {
        me.signal("tick", &[], payload.clone()).expect("signal");
    }
    assert!(
        pool.cut_off.load(Ordering::SeqCst) > 0,
        "the slow watcher was never cut off"
    );
    for seq in 1..=n + 1 {
        assert_eq!(w.next_event().expect("event").seq, seq);
    }
}

#[test]
fn a_lost_host_kills_its_members_with_host_lost() {
    let pool = TestPool::start(PoolConfig::default());
    let mut w = Client::connect_to(&pool.path)
        .expect("w")
        .watch(1)
        .expect("watch");
    pool.set_host("nodeb");
    let remote = Client::connect_to(&pool.path)
        .expect("b")
        .join(None)
        .expect("join");
    pool.input(Input::HostLost {
        host: "nodeb".into(),
    });
    let e = wait_for(&mut w, "died", |k| matches!(k, EventKind::Died { .. }));
    let EventKind::Died { member, reason } = e.kind else {
        unreachable!()
    };
    assert_eq!(
        (member.id, member.host.as_str(), reason),
        (remote.id(), "nodeb", DeathReason::HostLost)
    );
}

#[test]
fn a_hello_of_another_version_gets_an_error_line_then_the_close() {
    let pool = TestPool::start(PoolConfig::default());
    let mut s = UnixStream::connect(&pool.path).expect("connect");
    s.write_all(b"{\"jel\":99}\n").expect("write");
    let mut lines = BufReader::new(s).lines();
    let reply: serde_json::Value =
        serde_json::from_str(&lines.next().expect("line").expect("read")).expect("json");
    assert_eq!(reply["reply"], "error");
    assert!(reply["error"]
        .as_str()
        .expect("error")
        .contains("version 1, not 99"));
    assert!(lines.next().is_none(), "closed after the error");
}

#[test]
fn a_refused_request_is_an_error_with_help_and_exit_1() {
    let pool = TestPool::start(PoolConfig::default());
    let mut me = Client::connect_to(&pool.path)
        .expect("c")
        .join(None)
        .expect("join");
    let e = me
        .signal("x", &[4242], json!(null))
        .expect_err("no member 4242");
    assert_eq!(e.exit_code(), 1);
    assert!(e.to_string().contains("no member 4242") && e.to_string().contains("help:"));
}

#[cfg(feature = "tokio")]
#[test]
fn the_async_client_joins_elects_watches_and_leaves() {
    use jel::nonblocking::AsyncClient;
    let pool = TestPool::start(PoolConfig::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut a = AsyncClient::connect_to(&pool.path)
            .await
            .expect("a")
            .join(Some("a"))
            .await
            .expect("join");
        assert_eq!(a.elect("m").await.expect("elect").epoch, 1);
        let mut w = a.watch(1).await.expect("watch");
        let b = Client::connect_to(&pool.path)
            .expect("b")
            .join(None)
            .expect("b");
        drop(b);
        let mut kinds = Vec::new();
        while kinds.len() < 4 {
            kinds.push(w.next_event().await.expect("event").kind);
        }
        assert!(matches!(
            kinds[3],
            EventKind::Died {
                reason: DeathReason::Exited,
                ..
            }
        ));
        assert_eq!(a.leave().await.expect("leave"), 5);
    });
}
