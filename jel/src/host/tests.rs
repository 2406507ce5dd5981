//! The line reader, and the host in-process with real sockets and the async client.

use std::time::Duration;

use super::{accept::LineReader, accept::TooLong, HostConfig, PoolHost, RemoteOut};
use crate::{nonblocking::AsyncClient, pool::PoolConfig, wire::EventKind};

#[test]
fn lines_are_split_across_reads_and_bounded() {
    let mut r = LineReader::new(5);
    assert_eq!(r.push(b"ab").expect("ok"), Vec::<String>::new());
    assert_eq!(r.push(b"c\nde\nf").expect("ok"), ["abc", "de"]);
    assert_eq!(r.push(b"g\n").expect("ok"), ["fg"]);
    assert_eq!(
        r.push(b"12345\n").expect("ok"),
        ["12345"],
        "the bound itself is fine"
    );
    assert_eq!(
        r.push(b"123456"),
        Err(TooLong(6)),
        "no newline yet, already too long"
    );
    let mut r = LineReader::new(5);
    assert_eq!(r.push(b"1234567\nx"), Err(TooLong(7)));
}

#[test]
fn a_line_that_is_not_utf8_is_passed_on_replaced() {
    let mut r = LineReader::new(100);
    assert_eq!(r.push(b"a\xffb\n").expect("ok"), ["a\u{fffd}b"]);
}

fn config(dir: &tempfile::TempDir) -> HostConfig {
    HostConfig::new(dir.path().join("jel.sock"), "front", PoolConfig::default())
}

#[tokio::test]
async fn a_reclaim_returns_after_vacate_was_written_to_every_watcher() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (host, _remote) = PoolHost::bind(config(&dir)).expect("bind");
    let mut w = AsyncClient::connect_to(host.socket())
        .await
        .expect("connect")
        .watch(1)
        .await
        .expect("watch");
    host.host_granted("nodeb").await.expect("granted");
    host.reclaim("nodeb", 42).await.expect("reclaim");
    // The lines are in the socket already: reading them takes no help from the host.
    let granted = w.next_event().await.expect("event");
    assert_eq!(
        granted.kind,
        EventKind::HostGranted {
            host: "nodeb".into()
        }
    );
    let vacate = w.next_event().await.expect("event");
    assert!(
        matches!(vacate.kind, EventKind::Vacate { deadline: 42, .. }),
        "{vacate:?}"
    );
    host.terminate().await.expect("terminate");
    let closed = w.next_event().await.expect("event");
    assert_eq!(closed.kind, EventKind::Closed);
    let end = w.next_event().await.expect("event");
    assert_eq!(end.kind, EventKind::Terminated);
    assert!(
        !dir.path().join("jel.sock").exists(),
        "the socket is removed at the end"
    );
}

/// The race `rb-jel watch` lost one run in many when a job ended as it started: its
/// connection queued (or accepted, not yet heard) when `terminate` came, it was reset and the
/// watch failed with a broken pipe. Here the request goes out only once the socket file is
/// gone (the pool takes no more connections).
#[tokio::test]
async fn a_watcher_that_connected_before_the_end_gets_the_stream_through_terminated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (host, _remote) = PoolHost::bind(config(&dir)).expect("bind");
    host.host_granted("nodeb").await.expect("granted");
    let client = AsyncClient::connect_to(host.socket())
        .await
        .expect("connect");
    let socket = dir.path().join("jel.sock");
    let watch = async {
        while socket.exists() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut w = client.watch(1).await.expect("watch after the end began");
        let mut kinds = Vec::new();
        loop {
            let event = w.next_event().await.expect("event");
            let end = event.kind == EventKind::Terminated;
            kinds.push(event.kind);
            if end {
                return kinds;
            }
        }
    };
    let (ended, kinds) = tokio::join!(host.terminate(), watch);
    // The watcher, this process, is the member told.
    assert_eq!(ended.expect("terminate"), [std::process::id()]);
    assert_eq!(
        kinds,
        [
            EventKind::HostGranted {
                host: "nodeb".into()
            },
            EventKind::Closed,
            EventKind::Terminated
        ]
    );
    let late = AsyncClient::connect_to(&socket).await;
    assert!(late.is_err(), "no connection after the end");
}

#[tokio::test]
async fn a_remote_member_joins_through_the_relay_and_local_watchers_see_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (host, mut remote) = PoolHost::bind(config(&dir)).expect("bind");
    let mut w = AsyncClient::connect_to(host.socket())
        .await
        .expect("connect")
        .watch(1)
        .await
        .expect("watch");
    let conn = host.open_remote("nodeb", Some(77)).await.expect("open");
    host.remote_line(conn, r#"{"jel":1}"#.into())
        .await
        .expect("line");
    host.remote_line(conn, r#"{"op":"join","name":"far"}"#.into())
        .await
        .expect("line");
    let joined = w.next_event().await.expect("event");
    let EventKind::Joined { member } = joined.kind else {
        panic!("{joined:?}")
    };
    assert_eq!((member.host.as_str(), member.pid), ("nodeb", 77));
    let mut got = Vec::new();
    while got.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(10), remote.recv()).await {
            Ok(Some(RemoteOut::Send { conn: c, lines })) if c == conn => {
                got.extend(lines.iter().map(|l| l.as_str().to_string()))
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(got[0].starts_with(r#"{"jel":1"#), "{got:?}");
    assert!(got[1].starts_with(r#"{"reply":"join""#), "{got:?}");
    host.remote_closed(conn).await.expect("closed");
    let died = w.next_event().await.expect("event");
    assert!(matches!(died.kind, EventKind::Died { .. }), "{died:?}");
}
