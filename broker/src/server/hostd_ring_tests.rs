//! The sessions read through io_uring, on real sockets: what a task's session does, they
//! do (where io_uring cannot be used, each test says so and passes without testing).

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    time::{Duration, Instant},
};

use proto::{
    frame::{encode, LineBuffer},
    msg::{FromBroker, ToBroker},
    report::HostReport,
    MAX_FRAME_BYTES,
};

use super::*;
use crate::core::Reported;
use crate::server::turns::FRAMES_PER_TURN;

fn ring() -> Option<RingSessions> {
    match RingSessions::new() {
        Ok(sessions) => Some(sessions),
        Err(e) => {
            eprintln!("io_uring cannot be used here ({e}): not tested");
            None
        }
    }
}

/// A daemon's report line with counter `seq`.
fn report_line(seq: u64) -> String {
    let report = HostReport {
        hostname: "node01".into(),
        seq,
        cpus: Some(2),
        load: Some([0.5, 0.4, 0.3]),
        ..HostReport::default()
    };
    encode(&ToBroker::Report(Box::new(report))).expect("encodes") + "\n"
}

/// A connection of `node01`'s daemon handed to `sessions` with `welcome_bytes` read with
/// its welcome; the daemon's end.
fn connect(
    sessions: &mut RingSessions,
    events: &mut Vec<Event>,
    welcome_bytes: &[u8],
) -> UnixStream {
    let (ours, theirs) = UnixStream::pair().expect("a socket pair");
    ours.set_nonblocking(true)
        .expect("non-blocking, as tokio's");
    theirs
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a timeout");
    let mut lines = LineBuffer::new(MAX_FRAME_BYTES);
    lines.push(welcome_bytes);
    let incoming = Incoming {
        fd: ours.into(),
        lines,
        host: "node01".into(),
        conn: 7,
        sweep_live: true,
        permit: None,
    };
    sessions.turn(vec![incoming], events).expect("a turn");
    theirs
}

/// Turns until `done(events)` or 5 s; the turns taken.
fn turn_until(
    sessions: &mut RingSessions,
    events: &mut Vec<Event>,
    done: impl Fn(&[Event]) -> bool,
) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut turns = 0;
    while !done(events) && Instant::now() < deadline {
        sessions.turn(Vec::new(), events).expect("a turn");
        turns += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(done(events), "not within 5 s: {events:?}");
    turns
}

fn reports(events: &[Event]) -> Vec<&Reported> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Report { report, .. } => Some(report),
            _ => None,
        })
        .collect()
}

fn disconnected(events: &[Event]) -> Option<&str> {
    events.iter().find_map(|e| match e {
        Event::Disconnected {
            reason, conn: 7, ..
        } => Some(reason.as_str()),
        _ => None,
    })
}

#[test]
fn reports_reach_the_core_in_order_and_an_ended_stream_ends_the_session() {
    let Some(mut sessions) = ring() else { return };
    let mut events = Vec::new();
    let mut daemon = connect(&mut sessions, &mut events, b"");
    assert!(
        matches!(&events[..], [Event::HostdConnected { conn: 7, host, .. }] if host == "node01"),
        "{events:?}"
    );
    daemon
        .write_all((report_line(1) + &report_line(2)).as_bytes())
        .expect("sent");
    turn_until(&mut sessions, &mut events, |e| reports(e).len() == 2);
    let got = reports(&events);
    assert!(
        matches!(got[0], Reported::Whole(r) if r.seq == 1),
        "{got:?}"
    );
    assert!(matches!(got[1], Reported::Same { seq: 2 }), "{got:?}");
    drop(daemon);
    turn_until(&mut sessions, &mut events, |e| disconnected(e).is_some());
    assert_eq!(disconnected(&events), Some("connection closed"));
    assert!(
        sessions.sessions.iter().all(Option::is_none),
        "no session is left"
    );
}

#[test]
fn what_came_with_the_welcome_is_read_in_the_first_turn() {
    let Some(mut sessions) = ring() else { return };
    let mut events = Vec::new();
    let _daemon = connect(&mut sessions, &mut events, report_line(1).as_bytes());
    assert!(
        matches!(events[0], Event::HostdConnected { .. }),
        "{events:?}"
    );
    assert!(
        matches!(reports(&events)[..], [Reported::Whole(_)]),
        "{events:?}"
    );
}

#[test]
fn a_last_line_without_its_newline_is_read_at_the_end_of_the_stream() {
    let Some(mut sessions) = ring() else { return };
    let mut events = Vec::new();
    let mut daemon = connect(&mut sessions, &mut events, b"");
    let line = report_line(1);
    daemon.write_all(line.trim_end().as_bytes()).expect("sent");
    daemon.shutdown(std::net::Shutdown::Write).expect("ended");
    turn_until(&mut sessions, &mut events, |e| disconnected(e).is_some());
    assert!(
        matches!(reports(&events)[..], [Reported::Whole(_)]),
        "{events:?}"
    );
}

#[test]
fn a_bad_frame_is_refused_to_the_daemon_and_ends_the_session() {
    let Some(mut sessions) = ring() else { return };
    let mut events = Vec::new();
    let daemon = connect(&mut sessions, &mut events, b"");
    (&daemon).write_all(b"not json\n").expect("sent");
    turn_until(&mut sessions, &mut events, |e| disconnected(e).is_some());
    let why = disconnected(&events).expect("ended").to_string();
    assert!(why.contains("malformed"), "{why}");
    let mut told = String::new();
    let mut reader = BufReader::new(&daemon);
    reader.read_line(&mut told).expect("the refusal");
    let refusal: FromBroker = serde_json::from_str(&told).expect("a message");
    assert!(
        matches!(&refusal, FromBroker::Error { message, .. } if *message == why),
        "{refusal:?}"
    );
    told.clear();
    assert_eq!(
        reader.read_line(&mut told).expect("the end"),
        0,
        "then closed"
    );
}

/// A daemon that sends more than a turn's frames is read a turn's worth at a time: the
/// rest waits, none is lost or reordered.
#[test]
fn a_flood_is_read_a_turns_frames_at_a_time_and_nothing_is_lost() {
    let Some(mut sessions) = ring() else { return };
    let mut events = Vec::new();
    let mut daemon = connect(&mut sessions, &mut events, b"");
    let sent = 3 * FRAMES_PER_TURN as u64 + 5;
    let flood: String = (1..=sent).map(report_line).collect();
    daemon.write_all(flood.as_bytes()).expect("sent");
    let mut per_turn = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while (reports(&events).len() as u64) < sent && Instant::now() < deadline {
        let before = reports(&events).len();
        sessions.turn(Vec::new(), &mut events).expect("a turn");
        per_turn.push(reports(&events).len() - before);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        per_turn.iter().all(|&n| n <= FRAMES_PER_TURN as usize),
        "frames per turn: {per_turn:?}"
    );
    let seqs: Vec<u64> = reports(&events)
        .iter()
        .map(|r| match r {
            Reported::Whole(r) => r.seq,
            Reported::Same { seq } => *seq,
            Reported::Changes(_) => 0,
        })
        .collect();
    assert_eq!(seqs, (1..=sent).collect::<Vec<_>>(), "each once, in order");
    // Receiving again once caught up.
    daemon
        .write_all(report_line(sent + 1).as_bytes())
        .expect("sent");
    turn_until(&mut sessions, &mut events, |e| {
        reports(e).len() as u64 == sent + 1
    });
}

#[test]
fn the_cores_word_and_close_reach_the_daemon() {
    let Some(mut sessions) = ring() else { return };
    let mut events = Vec::new();
    let daemon = connect(&mut sessions, &mut events, b"");
    let Some(Event::HostdConnected { word, close, .. }) = events.pop() else {
        panic!("connected first: {events:?}");
    };
    word.set(HostWord {
        live: vec![3, 5],
        issued_below: 6,
        ending: Vec::new(),
    });
    let mut reader = BufReader::new(&daemon);
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    daemon
        .set_nonblocking(true)
        .expect("non-blocking while the turns run");
    while line.is_empty() && Instant::now() < deadline {
        sessions.turn(Vec::new(), &mut events).expect("a turn");
        let _ = reader.read_line(&mut line);
        std::thread::sleep(Duration::from_millis(1));
    }
    let told: FromBroker = serde_json::from_str(&line).expect("a message");
    assert!(
        matches!(&told, FromBroker::LiveAllocs { live, issued_below: 6 } if *live == [3, 5]),
        "{told:?}"
    );
    close
        .send("drained by the test".into())
        .expect("the session listens");
    turn_until(&mut sessions, &mut events, |e| disconnected(e).is_some());
    assert_eq!(disconnected(&events), Some("drained by the test"));
    daemon.set_nonblocking(false).expect("blocking");
    line.clear();
    assert_eq!(reader.read_line(&mut line).expect("the end"), 0, "closed");
}

#[test]
fn every_session_ends_when_the_broker_stops() {
    let Some(mut sessions) = ring() else { return };
    let mut events = Vec::new();
    let daemon = connect(&mut sessions, &mut events, b"");
    sessions.end_all("broker stopping", &mut events);
    assert_eq!(disconnected(&events), Some("broker stopping"));
    sessions.turn(Vec::new(), &mut events).expect("a turn");
    let mut line = String::new();
    assert_eq!(
        BufReader::new(&daemon)
            .read_line(&mut line)
            .expect("the end"),
        0
    );
}

/// The core's word and close waking a session in the same turn (its token twice on the
/// list of those woken) end it once: found in the lab, where a word and a close came
/// together and the second poll of the spent close panicked the host daemons' thread.
#[test]
fn a_word_and_a_close_in_the_same_turn_end_the_session_once() {
    let Some(mut sessions) = ring() else { return };
    let mut events = Vec::new();
    let _daemon = connect(&mut sessions, &mut events, b"");
    let Some(Event::HostdConnected { word, close, .. }) = events.pop() else {
        panic!("connected first: {events:?}");
    };
    word.set(HostWord::default());
    close
        .send("closed by the test".into())
        .expect("the session listens");
    word.set(HostWord::default());
    sessions.turn(Vec::new(), &mut events).expect("a turn");
    sessions.turn(Vec::new(), &mut events).expect("a turn");
    let ends = events
        .iter()
        .filter(|e| matches!(e, Event::Disconnected { .. }))
        .count();
    assert_eq!(ends, 1, "{events:?}");
    assert_eq!(disconnected(&events), Some("closed by the test"));
}

/// A pilot's lease told before the connection's first report reaches the core right after
/// that report, not before (the allocator takes a lease only for a host it has a view of);
/// a lease told after a report goes at once.
#[test]
fn a_pilots_lease_told_before_its_first_report_follows_the_report() {
    let Some(mut sessions) = ring() else { return };
    let mut events = Vec::new();
    let mut daemon = connect(&mut sessions, &mut events, b"");
    let lease = |ending| {
        let told = ToBroker::PilotLease {
            slurm_job: "4242".into(),
            ending,
        };
        encode(&told).expect("encodes") + "\n"
    };
    daemon.write_all(lease(false).as_bytes()).expect("sent");
    // Turns go by with the lease read and held (the daemon's first report is late).
    for _ in 0..20 {
        sessions.turn(Vec::new(), &mut events).expect("a turn");
        std::thread::sleep(Duration::from_millis(1));
    }
    let leases = |events: &[Event]| {
        events
            .iter()
            .filter(|e| matches!(e, Event::PilotLease { .. }))
            .count()
    };
    assert_eq!(leases(&events), 0, "held: {events:?}");
    daemon.write_all(report_line(1).as_bytes()).expect("sent");
    turn_until(&mut sessions, &mut events, |e| leases(e) == 1);
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            Event::HostdConnected { .. } => "connected",
            Event::Report { .. } => "report",
            Event::PilotLease { .. } => "lease",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["connected", "report", "lease"]);
    daemon.write_all(lease(true).as_bytes()).expect("sent");
    turn_until(&mut sessions, &mut events, |e| leases(e) == 2);
}
