//! The ring on real loopback sockets: what each socket sent arrives whole and in order, a
//! closed or paused socket behaves as `Ring` says (where io_uring cannot be used, each test
//! says so and passes without testing).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    time::{Duration, Instant},
};

use super::*;

/// What a test's turns received, per token.
#[derive(Default)]
struct Seen {
    bytes: std::collections::HashMap<Token, Vec<u8>>,
    ended: Vec<Token>,
    failed: Vec<Token>,
}

impl Seen {
    fn take(&mut self, token: Token, what: Received<'_>) -> Next {
        match what {
            Received::Data(data) => self.bytes.entry(token).or_default().extend(data),
            Received::Ended => self.ended.push(token),
            Received::Failed(_) => self.failed.push(token),
        }
        Next::Receive
    }

    fn of(&self, token: Token) -> &[u8] {
        self.bytes.get(&token).map_or(&[], Vec::as_slice)
    }
}

/// Turns until `done` holds or 5 s have passed (a condition, not a sleep: each turn takes
/// what arrived; the pause between turns only spares the CPU).
fn turn_until(ring: &mut Ring, seen: &mut Seen, done: impl Fn(&Seen) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done(seen) && Instant::now() < deadline {
        ring.turn(|t, r| seen.take(t, r)).expect("a turn");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A ring with `n` loopback connections given to it, and their peers; `None` where
/// io_uring cannot be used.
fn ring_of(n: usize) -> Option<(Ring, Vec<Token>, Vec<TcpStream>)> {
    let mut ring = match Ring::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("io_uring cannot be used here ({e}): not tested");
            return None;
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let addr = listener.local_addr().expect("its address");
    let (mut tokens, mut peers) = (Vec::new(), Vec::new());
    for _ in 0..n {
        peers.push(TcpStream::connect(addr).expect("connected"));
        let (accepted, _) = listener.accept().expect("accepted");
        accepted.set_nonblocking(true).expect("non-blocking");
        tokens.push(ring.add(accepted.into()).expect("armed"));
    }
    ring.turn(|_, _| Next::Receive).expect("the receives armed");
    Some((ring, tokens, peers))
}

#[test]
fn one_turn_receives_what_every_socket_sent() {
    let Some((mut ring, tokens, mut peers)) = ring_of(64) else {
        return;
    };
    for p in &mut peers {
        p.write_all(b"a report\n").expect("sent");
    }
    // Loopback: each line is in its socket, its receive queued to the ring, once sent.
    let mut seen = Seen::default();
    ring.turn(|t, r| seen.take(t, r)).expect("a turn");
    for t in tokens {
        assert_eq!(
            seen.of(t),
            b"a report\n",
            "every receive queued runs in the turn"
        );
    }
}

#[test]
fn bytes_come_in_order_across_buffers_and_an_ended_stream_is_closed() {
    let Some((mut ring, tokens, mut peers)) = ring_of(2) else {
        return;
    };
    // More than the buffers hold at once on one socket.
    let many: Vec<u8> = (0..3 * usize::from(BUFFERS) * BUFFER_LEN / 2)
        .map(|i| (i % 251) as u8)
        .collect();
    let writer = {
        let mut peer = peers.remove(0);
        let many = many.clone();
        std::thread::spawn(move || {
            peer.write_all(&many).expect("sent");
            peer // kept open
        })
    };
    let mut seen = Seen::default();
    turn_until(&mut ring, &mut seen, |s| {
        s.of(tokens[0]).len() == many.len()
    });
    let _first = writer.join().expect("the writer");
    assert!(
        seen.of(tokens[0]) == many.as_slice(),
        "every byte, in order"
    );
    assert_eq!(ring.len(), 2);
    drop(peers.remove(0));
    turn_until(&mut ring, &mut seen, |s| !s.ended.is_empty());
    assert_eq!(seen.ended, vec![tokens[1]]);
    assert_eq!(ring.len(), 1, "the ended one is closed");
    assert!(ring.fd(tokens[1]).is_none(), "its token names nothing");
}

#[test]
fn a_closed_socket_is_shut_down_and_its_slot_serves_the_next_one_alone() {
    let Some((mut ring, tokens, mut peers)) = ring_of(1) else {
        return;
    };
    ring.close(tokens[0]);
    let mut seen = Seen::default();
    while !ring.is_empty() {
        ring.turn(|t, r| seen.take(t, r)).expect("a turn");
    }
    let mut byte = [0u8; 1];
    peers[0]
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a timeout");
    assert_eq!(
        peers[0].read(&mut byte).expect("the end"),
        0,
        "the peer sees the end"
    );
    assert!(ring.is_empty(), "closed");
    assert!(
        seen.ended.is_empty() && seen.bytes.is_empty(),
        "nothing after close"
    );
    // The slot's next socket: the old token names nothing.
    let (again, mut new_peers) = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let peer = TcpStream::connect(listener.local_addr().expect("addr")).expect("connected");
        let (accepted, _) = listener.accept().expect("accepted");
        accepted.set_nonblocking(true).expect("non-blocking");
        (ring.add(accepted.into()).expect("armed"), vec![peer])
    };
    assert_ne!(again, tokens[0]);
    assert!(ring.fd(tokens[0]).is_none());
    new_peers[0].write_all(b"x").expect("sent");
    turn_until(&mut ring, &mut seen, |s| !s.of(again).is_empty());
    assert_eq!(seen.of(again), b"x");
    assert!(seen.of(tokens[0]).is_empty());
}

#[test]
fn a_paused_socket_receives_nothing_until_resumed_and_loses_nothing() {
    let Some((mut ring, tokens, mut peers)) = ring_of(1) else {
        return;
    };
    let token = tokens[0];
    peers[0].write_all(b"one\n").expect("sent");
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.is_empty() && Instant::now() < deadline {
        ring.turn(|_, r| {
            if let Received::Data(d) = r {
                got.extend_from_slice(d);
            }
            Next::Pause
        })
        .expect("a turn");
    }
    assert_eq!(got, b"one\n");
    peers[0].write_all(b"two\n").expect("sent");
    // Paused: turns receive nothing of it (the cancel's completion comes in a turn).
    for _ in 0..20 {
        ring.turn(|_, r| {
            if let Received::Data(d) = r {
                got.extend_from_slice(d);
            }
            Next::Receive
        })
        .expect("a turn");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(got, b"one\n", "nothing while paused");
    ring.resume(token).expect("resumed");
    let mut seen = Seen::default();
    turn_until(&mut ring, &mut seen, |s| !s.of(token).is_empty());
    assert_eq!(seen.of(token), b"two\n", "what waited in the socket");
}
