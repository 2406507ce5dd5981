//! The host daemons' sessions run here, on a thread of their own (`rb-hostd`), in turns
//! [`TURN`] apart rather than whenever a frame arrives, and the events they make go to the
//! core together at the end of each turn.
//!
//! Why: at 10k hosts reporting each second a report arrives every 0.1 ms. Woken for each
//! (a worker of the connections' runtime from epoll, then the core's thread from its
//! queue), the broker of a quiet lab spent about half of its CPU (16 % of a core) switching
//! threads in and out (perf: `finish_task_switch` a third of its samples, `eventfd_write`
//! and futex waits most of the rest of that half). In turns, one wake reads the ~100 frames
//! that arrived since the last and the core takes their events in a row: 0.58× the CPU
//! with quiet reports, 0.75× with changing ones (BENCHMARKS.md, "Host daemons' sessions
//! in turns"). The price is a delay of up to two turns (20 ms) for a report to reach the
//! core, or for a word of the core to reach a daemon, which nothing of a host daemon's
//! needs sooner: reports come each second, silence is counted in seconds, a reclaim's
//! grace in seconds. The handshake and the welcome stay with the other connections
//! (`hand_over` in the parent module), so a daemon's connect is not held for a turn.
//!
//! A turn is one `block_on(yield_now())` of the runtime: every session woken since the
//! last turn runs (its frames read, its events queued), then the I/O that became ready
//! meanwhile is polled once (the sessions it wakes run in the next turn), and the runtime
//! is left until the next turn. A session that reads more than [`FRAMES_PER_TURN`] frames
//! in one turn (a daemon flooding the broker) waits for the next: what it sends meanwhile
//! stays in its socket's buffers, and what waits for the core stays bounded.
//!
//! Where the kernel allows it, the sessions are not tasks: their sockets are read through
//! io_uring, one system call a turn (the `hostd_ring` module), in the same turns; the runtime
//! is then left with nothing of theirs. `RB_HOSTD_READ=epoll` keeps them tasks.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use tokio::sync::{watch, Notify};
use tracing::{error, info, warn};

use super::hostd_ring::{Incoming, RingSessions};
use crate::core::{Event, EventSender};

/// The variable that chooses how the host daemons' sessions read: `io_uring` (where the
/// kernel allows it, the default) or `epoll` (tasks of the runtime).
pub const READ_VAR: &str = "RB_HOSTD_READ";

/// How long the host daemons' runtime sleeps between turns.
pub const TURN: Duration = Duration::from_millis(10);

/// Frames one session reads in a turn at most (a daemon sends one a second).
pub const FRAMES_PER_TURN: u32 = 16;

/// The host daemons' runtime: where their sessions are spawned, and where they queue
/// their events for the core.
#[derive(Debug, Clone)]
pub struct HostdTurns {
    runtime: tokio::runtime::Handle,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Events of this turn, in the order the sessions made them.
    queued: Mutex<Vec<Event>>,
    /// Turns run so far.
    turns: AtomicU64,
    /// Notified at the end of each turn: sessions that read their frames of the turn wait.
    turn_ended: Notify,
    /// Whether sessions are read through io_uring ([`HostdTurns::hand_to_ring`]).
    through_ring: AtomicBool,
    /// Connections handed to the ring since the last turn.
    incoming: Mutex<Vec<Incoming>>,
    /// The tests' defect: the next ring turn panics.
    #[cfg(test)]
    ring_defect: AtomicBool,
}

impl HostdTurns {
    /// Starts the runtime's thread; it hands each turn's events to `events` and stops
    /// after the turn that finds `stop` set or its sender gone (the sessions see it too
    /// and end), or once the core is gone.
    pub fn start(events: EventSender, stop: watch::Receiver<bool>) -> std::io::Result<Self> {
        Self::start_reading(events, stop, ring_wanted())
    }

    /// [`Self::start`], the sessions read through io_uring when `ring` and the kernel
    /// allows it.
    pub fn start_reading(
        events: EventSender,
        stop: watch::Receiver<bool>,
        ring: bool,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            // Every session woken runs in the turn: the runtime polls I/O again only once
            // none is left (by default it would after 61, and end the turn there).
            .event_interval(u32::MAX)
            .build()?;
        let turns = HostdTurns {
            runtime: runtime.handle().clone(),
            shared: Arc::default(),
        };
        let shared = turns.shared.clone();
        let (set_up, ready) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("rb-hostd".into())
            .spawn(move || {
                // Made on this thread: the ring is its only issuer.
                let sessions = match ring {
                    true => ring_sessions(),
                    false => {
                        info!("host daemons' reports are read through epoll ({READ_VAR}=epoll)");
                        None
                    }
                };
                shared
                    .through_ring
                    .store(sessions.is_some(), Ordering::Release);
                let _ = set_up.send(());
                run_turns(&runtime, &shared, &events, &stop, sessions);
            })?;
        let _ = ready.recv();
        Ok(turns)
    }

    /// Whether a welcomed connection goes to the ring ([`Self::hand_to_ring`]) rather than
    /// to a task's session.
    pub fn reads_through_ring(&self) -> bool {
        self.shared.through_ring.load(Ordering::Acquire)
    }

    /// Reads `conn` through the ring from the next turn on (a connection handed over as
    /// the ring fails is closed: its daemon connects again).
    pub fn hand_to_ring(&self, conn: Incoming) {
        self.shared
            .incoming
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(conn);
    }

    /// Runs `session` on the host daemons' runtime.
    pub fn spawn(&self, session: impl Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(session);
    }

    /// Queues `event` for the core, after those queued before it in this turn.
    pub fn queue(&self, event: Event) {
        let mut queued = self
            .shared
            .queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        queued.push(event);
    }

    /// Counts a frame a session read (`pace` is the session's own); once it read
    /// [`FRAMES_PER_TURN`] in this turn, returns at the next.
    pub async fn frame_read(&self, pace: &mut Pace) {
        let turn = self.shared.turns.load(Ordering::Acquire);
        if !pace.count(turn) {
            return;
        }
        let ended = self.shared.turn_ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if self.shared.turns.load(Ordering::Acquire) == turn {
            ended.await;
        }
    }
}

/// Turns run so far (the tests count them).
#[cfg(test)]
impl HostdTurns {
    fn turns_run(&self) -> u64 {
        self.shared.turns.load(Ordering::Acquire)
    }
}

/// One turn of the sessions read through the ring; all of them end when `stopping`.
fn ring_turn(
    sessions: &mut RingSessions,
    incoming: Vec<Incoming>,
    events: &mut Vec<Event>,
    stopping: bool,
) -> std::io::Result<()> {
    sessions.turn(incoming, events)?;
    if stopping {
        sessions.end_all("broker stopping", events);
    }
    Ok(())
}

/// A session's frames in the current turn ([`HostdTurns::frame_read`], and the sessions
/// read through io_uring, which count their own turns).
#[derive(Debug, Default)]
pub struct Pace {
    turn: u64,
    frames: u32,
}

impl Pace {
    /// Counts a frame read in `turn`; whether that was the turn's last
    /// ([`FRAMES_PER_TURN`]).
    pub fn count(&mut self, turn: u64) -> bool {
        if self.turn != turn {
            *self = Pace { turn, frames: 0 };
        }
        self.frames += 1;
        self.frames >= FRAMES_PER_TURN
    }

    /// Whether `turn`'s frames are all read.
    pub fn spent(&self, turn: u64) -> bool {
        self.turn == turn && self.frames >= FRAMES_PER_TURN
    }
}

/// Whether [`READ_VAR`] asks for io_uring (unset: yes).
fn ring_wanted() -> bool {
    match std::env::var(READ_VAR).as_deref() {
        Err(_) | Ok("io_uring") => true,
        Ok("epoll") => false,
        Ok(other) => {
            warn!("{READ_VAR}={other:?} is neither `io_uring` nor `epoll`: io_uring it is");
            true
        }
    }
}

/// The ring sessions read through, or `None` (said) where io_uring cannot be used.
fn ring_sessions() -> Option<RingSessions> {
    match RingSessions::new() {
        Ok(sessions) => {
            info!("host daemons' reports are read through io_uring");
            Some(sessions)
        }
        Err(e) => {
            info!(error = %e, "io_uring cannot be used here: host daemons' reports are read through epoll");
            None
        }
    }
}

/// The runtime's thread: a turn, its events to the core, a sleep; until `stop`.
fn run_turns(
    runtime: &tokio::runtime::Runtime,
    shared: &Shared,
    events: &EventSender,
    stop: &watch::Receiver<bool>,
    mut ring: Option<RingSessions>,
) {
    let mut ring_events = Vec::new();
    loop {
        // Also once nobody can tell it to stop any more.
        let stopping = *stop.borrow() || stop.has_changed().is_err();
        runtime.block_on(tokio::task::yield_now());
        let incoming = std::mem::take(
            &mut *shared
                .incoming
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if let Some(sessions) = ring.as_mut() {
            // A defect in a session must not take every daemon's reading with it: the ring
            // is given up as when it fails.
            let turned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                #[cfg(test)]
                if shared.ring_defect.swap(false, Ordering::AcqRel) {
                    panic!("a defect the test put in the ring's turn");
                }
                ring_turn(sessions, incoming, &mut ring_events, stopping)
            }));
            let failed = match turned {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some("a session panicked".to_string()),
            };
            if let Some(why) = failed {
                error!(%why, "reading through io_uring failed: host daemons are read through epoll from now on");
                shared.through_ring.store(false, Ordering::Release);
                let ended = format!("the broker's io_uring failed: {why}");
                sessions.end_all(&ended, &mut ring_events);
                ring = None;
            }
        }
        shared.turns.fetch_add(1, Ordering::AcqRel);
        shared.turn_ended.notify_waiters();
        let mut queued =
            std::mem::take(&mut *shared.queued.lock().unwrap_or_else(PoisonError::into_inner));
        queued.append(&mut ring_events);
        if events.blocking_send_all(queued).is_err() {
            return; // the core is gone
        }
        if stopping {
            return; // the sessions saw `stop` before this turn: each ended in it
        }
        std::thread::sleep(TURN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started() -> (HostdTurns, crate::core::EventReceiver, watch::Sender<bool>) {
        let (events, queues) = crate::core::channel(1024);
        let (stop, stopped) = watch::channel(false);
        let turns = HostdTurns::start_reading(events, stopped, false).expect("the turns' thread");
        (turns, queues, stop)
    }

    /// A ring turn that panics (a defect in a session) gives the ring up: its sessions end
    /// with why, their daemons see their connection end, and connections are read through
    /// epoll from then on.
    #[tokio::test]
    async fn a_ring_turn_that_panics_ends_its_sessions_and_epoll_takes_over() {
        let (events, mut queues) = crate::core::channel(1024);
        let (_stop, stopped) = watch::channel(false);
        let turns = HostdTurns::start_reading(events, stopped, true).expect("the turns' thread");
        if !turns.reads_through_ring() {
            eprintln!("io_uring cannot be used here: not tested");
            return;
        }
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
        ours.set_nonblocking(true).expect("non-blocking");
        turns.hand_to_ring(Incoming {
            fd: ours.into(),
            lines: proto::frame::LineBuffer::new(proto::MAX_FRAME_BYTES),
            host: "node01".into(),
            conn: 3,
            sweep_live: false,
            permit: None,
        });
        assert!(matches!(
            queues.next_event().await,
            Some(Event::HostdConnected { conn: 3, .. })
        ));
        turns.shared.ring_defect.store(true, Ordering::Release);
        match queues.next_event().await {
            Some(Event::Disconnected {
                conn: 3, reason, ..
            }) => {
                assert!(reason.contains("io_uring failed"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(!turns.reads_through_ring(), "epoll from now on");
        let mut byte = [0u8; 1];
        theirs
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("a timeout");
        let read = std::io::Read::read(&mut &theirs, &mut byte).expect("the end");
        assert_eq!(read, 0, "the daemon sees its connection end");
    }

    fn daemon_started(i: usize) -> Event {
        Event::DaemonStarted {
            host: format!("h{i}"),
        }
    }

    /// Every session woken before a turn runs in it, however many (tokio's current-thread
    /// runtime would by default leave all but 61 for later turns), and each event they
    /// queue reaches the core once.
    #[tokio::test]
    async fn every_session_woken_runs_in_the_next_turn_and_each_event_reaches_the_core() {
        let (turns, mut queues, _stop) = started();
        let sessions = 500;
        let (go, _) = tokio::sync::broadcast::channel::<()>(1);
        for i in 0..sessions {
            let (turns_, mut go) = (turns.clone(), go.subscribe());
            turns.spawn(async move {
                let _ = go.recv().await;
                turns_.queue(daemon_started(i));
            });
        }
        // Wait for a turn in which every session registered, then wake them all at once.
        let spawned = turns.turns_run();
        while turns.turns_run() < spawned + 2 {
            tokio::time::sleep(TURN / 4).await;
        }
        let woken = turns.turns_run();
        go.send(()).expect("sessions listen");
        let mut hosts = Vec::new();
        while hosts.len() < sessions {
            match queues.next_event().await {
                Some(Event::DaemonStarted { host }) => hosts.push(host),
                other => panic!("unexpected {other:?}"),
            }
        }
        let taken = turns.turns_run() - woken;
        assert!(taken <= 2, "{sessions} sessions took {taken} turns");
        let numbered: Vec<usize> = hosts.iter().map(|h| h[1..].parse().expect("n")).collect();
        let mut sorted = numbered.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..sessions).collect::<Vec<_>>(), "each once");
    }

    /// A session reads at most [`FRAMES_PER_TURN`] frames in a turn: the next one waits
    /// for the next turn.
    #[tokio::test]
    async fn a_session_reads_its_frames_of_a_turn_then_waits_for_the_next() {
        let (turns, _queues, _stop) = started();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let frames = 3 * FRAMES_PER_TURN as usize;
        let turns_ = turns.clone();
        turns.spawn(async move {
            let mut pace = Pace::default();
            let mut seen = Vec::new();
            for _ in 0..frames {
                seen.push(turns_.turns_run());
                turns_.frame_read(&mut pace).await;
            }
            let _ = done_tx.send(seen);
        });
        let seen = done_rx.await.expect("the session ends");
        let mut per_turn = std::collections::BTreeMap::<u64, usize>::new();
        for turn in seen {
            *per_turn.entry(turn).or_default() += 1;
        }
        assert!(
            per_turn.values().all(|&n| n <= FRAMES_PER_TURN as usize),
            "frames per turn: {per_turn:?}"
        );
        assert!(per_turn.len() >= 3, "frames per turn: {per_turn:?}");
    }

    /// The thread stops after the turn that finds `stop` set; events queued before it
    /// still reach the core.
    #[tokio::test]
    async fn the_turns_stop_when_told_and_hand_over_what_was_queued() {
        let (turns, mut queues, stop) = started();
        turns.queue(daemon_started(1));
        stop.send(true).expect("the thread listens");
        assert!(matches!(
            queues.next_event().await,
            Some(Event::DaemonStarted { .. })
        ));
        // The thread held the only sender: once it ended, the queue closed.
        assert!(queues.next_event().await.is_none(), "the thread is gone");
    }
}
