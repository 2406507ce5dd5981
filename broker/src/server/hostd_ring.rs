//! Host daemons' sessions read through io_uring ([`ringrecv`]), where the kernel allows it:
//! what a session of [`super::hostd`] does, without a task, a readiness event or a system
//! call a report. The host daemons' thread ([`super::turns`]) runs them: each turn, one
//! `io_uring_enter` receives what every daemon sent since the last; the lines are cut and
//! read as a task's session reads them ([`read_frame`]: the same events for the core, the
//! same refusals).
//!
//! Why: at 10k quiet hosts the thread's reading was 5–6 % of a core, most of it tokio's task
//! machinery and epoll around each report's `recvfrom`; read this way, reading alone costs a
//! point of a core less (BENCHMARKS.md, "Reading the reports through io_uring", and the
//! broker's rows that follow it).
//!
//! What a task's `select!` waited on, a session here is told of by a waker of its own: the
//! core's word for its host ([`WordSender`]) and its close, each polled only in the turn
//! after it woke. Writes (the words, a refusal) are rare and small: written at once without
//! blocking, the rest kept for the next turns; a daemon that reads none of it for
//! [`OUTBOX_LIMIT`] bytes is closed. A daemon that sends more than
//! [`FRAMES_PER_TURN`](super::turns::FRAMES_PER_TURN) frames in a turn is paused (its
//! socket's receive cancelled, the rest waits in its socket) until its session has read
//! what it holds.

use std::{
    future::Future,
    io,
    os::fd::{AsRawFd, BorrowedFd, OwnedFd},
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll, Wake, Waker},
};

use proto::{
    frame::{line_text, FrameError, LineBuffer},
    msg::{ErrorCode, FromBroker},
    repeats::HostdFrames,
};
use ringrecv::{Next, Received, Ring, Token};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tracing::warn;

use super::{
    hostd::{read_frame, report_event, FrameRead, LeaseAfterReport, Told},
    turns::Pace,
};
use crate::{
    core::Event,
    host_words::{HostWord, WordSender},
    hosts::ConnId,
};

/// Bytes a session keeps for a daemon that does not read them before it is closed.
pub const OUTBOX_LIMIT: usize = 1 << 20;

/// A host daemon's connection, welcomed, for the ring: its socket, what was read of it
/// and not yet taken as lines, and what its session needs.
#[derive(Debug)]
pub struct Incoming {
    pub fd: OwnedFd,
    pub lines: LineBuffer,
    pub host: String,
    pub conn: ConnId,
    /// Whether daemons are told the live allocations ([`super::ServerCtx::sweep_live`]).
    pub sweep_live: bool,
    /// The connection's place among those the broker holds, kept while it lives.
    pub permit: Option<OwnedSemaphorePermit>,
}

/// Every session read through the ring: on the host daemons' thread, which made it.
#[derive(Debug)]
pub struct RingSessions {
    ring: Ring,
    /// By [`Token::index`].
    sessions: Vec<Option<Session>>,
    /// Sessions whose word or close woke them since the last turn (the core's thread
    /// pushes here).
    woken: Arc<Mutex<Vec<Token>>>,
    /// Paused sessions with lines left to read.
    behind: Vec<Token>,
    /// Sessions with bytes left to write.
    writing: Vec<Token>,
    /// Sessions to end after this turn's receives: why, and the refusal to send first.
    ending: Vec<(Token, String, Option<String>)>,
    /// The turn, counted: a session's frames are counted per turn.
    turn: u64,
}

struct Session {
    token: Token,
    host: String,
    conn: ConnId,
    lines: LineBuffer,
    frames: HostdFrames,
    last_allocs_running: Option<Vec<u64>>,
    lease: LeaseAfterReport,
    told: Told,
    sweep_live: bool,
    word: WordSender,
    next_word: Pin<Box<dyn Future<Output = HostWord> + Send>>,
    /// The core's close, until it came (a spent receiver must not be polled again: its
    /// session may be woken twice in a turn).
    close: Option<oneshot::Receiver<String>>,
    waker: Waker,
    /// Frames read in this turn.
    pace: Pace,
    paused: bool,
    outbox: Vec<u8>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("host", &self.host)
            .field("conn", &self.conn)
            .finish_non_exhaustive()
    }
}

/// Wakes a session: its token onto the list the next turn polls.
struct SessionWaker {
    token: Token,
    woken: Arc<Mutex<Vec<Token>>>,
}

impl Wake for SessionWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut woken = self.woken.lock().unwrap_or_else(PoisonError::into_inner);
        woken.push(self.token);
    }
}

/// What reading a session's lines came to.
enum Read {
    /// Every whole line read.
    Done,
    /// Its frames of the turn read, lines may be left: paused.
    Behind,
    /// The session ends: why, and the refusal to send first.
    Ends(String, Option<String>),
}

impl RingSessions {
    /// Sessions read through a new ring; an error where io_uring cannot be used.
    pub fn new() -> io::Result<Self> {
        Ok(RingSessions {
            ring: Ring::new()?,
            sessions: Vec::new(),
            woken: Arc::default(),
            behind: Vec::new(),
            writing: Vec::new(),
            ending: Vec::new(),
            turn: 0,
        })
    }

    /// One turn: the connections come in since the last start their sessions; then what
    /// arrived is read, the words and closes that woke sessions are taken, and what waits
    /// to be written is written. Events for the core go to `events`, in order.
    pub fn turn(&mut self, incoming: Vec<Incoming>, events: &mut Vec<Event>) -> io::Result<()> {
        self.turn += 1;
        for conn in incoming {
            self.start(conn, events);
        }
        self.catch_up(events)?;
        let (sessions, ending, behind, writing, turn) = (
            &mut self.sessions,
            &mut self.ending,
            &mut self.behind,
            &mut self.writing,
            self.turn,
        );
        self.ring.turn(|token, received| {
            let Some(session) = session_of(sessions, token) else {
                return Next::Close; // none: nothing would read it
            };
            match received {
                Received::Data(data) => {
                    session.lines.push(data);
                    match session.read(turn, events, writing) {
                        Read::Done => Next::Receive,
                        Read::Behind => {
                            if !std::mem::replace(&mut session.paused, true) {
                                behind.push(token);
                            }
                            Next::Pause
                        }
                        Read::Ends(why, refusal) => {
                            ending.push((token, why, refusal));
                            Next::Pause // closed once told why
                        }
                    }
                }
                Received::Ended => {
                    let why = session.at_end(events);
                    ending.push((token, why, None));
                    Next::Close
                }
                Received::Failed(e) => {
                    let why = FrameError::Io(e).to_string();
                    ending.push((token, why, None));
                    Next::Close
                }
            }
        })?;
        self.take_woken();
        self.write_out();
        self.end_sessions(events);
        Ok(())
    }

    /// Ends every session (the broker stops, or the ring failed): `why`.
    pub fn end_all(&mut self, why: &str, events: &mut Vec<Event>) {
        for session in self.sessions.iter_mut().filter_map(Option::take) {
            self.ring.close(session.token);
            events.push(session.disconnected(why.to_string()));
        }
    }

    /// A welcomed connection's session: the core hears of it, and it reads what came with
    /// it from the next turn's receives on.
    fn start(&mut self, conn: Incoming, events: &mut Vec<Event>) {
        let token = match self.ring.add(conn.fd) {
            Ok(token) => token,
            Err(e) => {
                warn!(host = %conn.host, error = %e, "cannot read a host daemon's connection");
                return;
            }
        };
        let (close_tx, close) = oneshot::channel();
        let word = WordSender::default();
        events.push(Event::HostdConnected {
            host: conn.host.clone(),
            conn: conn.conn,
            close: close_tx,
            word: word.clone(),
        });
        let waker = Waker::from(Arc::new(SessionWaker {
            token,
            woken: self.woken.clone(),
        }));
        let mut session = Session {
            token,
            host: conn.host,
            conn: conn.conn,
            lines: conn.lines,
            frames: HostdFrames::default(),
            last_allocs_running: None,
            lease: LeaseAfterReport::default(),
            told: Told::default(),
            sweep_live: conn.sweep_live,
            next_word: next_word(&word),
            word,
            close: Some(close),
            waker,
            pace: Pace::default(),
            paused: false,
            outbox: Vec::new(),
            _permit: conn.permit,
        };
        // What came with the welcome; and the waits registered.
        if !session.lines.is_empty() {
            match session.read(self.turn, events, &mut self.writing) {
                Read::Done => {}
                Read::Behind => self.behind.push(token),
                Read::Ends(why, refusal) => self.ending.push((token, why, refusal)),
            }
        }
        if self.sessions.len() <= token.index() {
            self.sessions.resize_with(token.index() + 1, || None);
        }
        self.sessions[token.index()] = Some(session);
        self.woken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(token);
    }

    /// Paused sessions read their next frames; those with no whole line left receive
    /// again.
    fn catch_up(&mut self, events: &mut Vec<Event>) -> io::Result<()> {
        for token in std::mem::take(&mut self.behind) {
            let Some(session) = session_of(&mut self.sessions, token) else {
                continue;
            };
            match session.read(self.turn, events, &mut self.writing) {
                Read::Done => {
                    session.paused = false;
                    self.ring.resume(token)?;
                }
                Read::Behind => self.behind.push(token),
                Read::Ends(why, refusal) => self.ending.push((token, why, refusal)),
            }
        }
        Ok(())
    }

    /// The words and closes of the sessions woken since the last turn.
    fn take_woken(&mut self) {
        let woken = std::mem::take(&mut *self.woken.lock().unwrap_or_else(PoisonError::into_inner));
        for token in woken {
            let Some(session) = session_of(&mut self.sessions, token) else {
                continue;
            };
            let waker = session.waker.clone();
            let mut cx = Context::from_waker(&waker);
            let Some(close) = session.close.as_mut() else {
                continue; // closed in this turn already
            };
            if let Poll::Ready(why) = Pin::new(close).poll(&mut cx) {
                session.close = None;
                let why = why.unwrap_or_else(|_| "closed by broker".into());
                self.ending.push((token, why, None));
                continue;
            }
            while let Poll::Ready(word) = session.next_word.as_mut().poll(&mut cx) {
                session.next_word = next_word(&session.word);
                let messages = session.told.changes(&word, session.sweep_live);
                session.queue(&messages, &mut self.writing);
            }
        }
    }

    /// Writes what waits, without blocking: what the socket does not take waits for the
    /// next turn.
    fn write_out(&mut self) {
        for token in std::mem::take(&mut self.writing) {
            let Some(session) = session_of(&mut self.sessions, token) else {
                continue;
            };
            let Some(fd) = self.ring.fd(token) else {
                continue;
            };
            match write_some(fd, &mut session.outbox) {
                Ok(()) if session.outbox.is_empty() => {}
                Ok(()) if session.outbox.len() > OUTBOX_LIMIT => {
                    let why = "the daemon reads nothing the broker sends".to_string();
                    self.ending.push((token, why, None));
                }
                Ok(()) => self.writing.push(token),
                Err(_) => self.ending.push((token, "connection closed".into(), None)),
            }
        }
    }

    /// Ends the sessions found ending this turn: a refusal written as far as the socket
    /// takes it, the socket closed, the core told.
    fn end_sessions(&mut self, events: &mut Vec<Event>) {
        for (token, why, refusal) in std::mem::take(&mut self.ending) {
            let Some(mut session) = self.sessions.get_mut(token.index()).and_then(|s| {
                s.as_ref()
                    .is_some_and(|s| s.token == token)
                    .then(|| s.take())
                    .flatten()
            }) else {
                continue; // ended already
            };
            if let (Some(message), Some(fd)) = (refusal, self.ring.fd(token)) {
                let refusal = FromBroker::Error {
                    code: ErrorCode::BadMessage,
                    message,
                };
                session.encode(&refusal);
                let _ = write_some(fd, &mut session.outbox);
            }
            self.ring.close(token);
            events.push(session.disconnected(why));
        }
    }
}

impl Session {
    /// Reads the whole lines the session holds, up to its frames of this turn.
    fn read(&mut self, turn: u64, events: &mut Vec<Event>, writing: &mut Vec<Token>) -> Read {
        loop {
            if self.pace.spent(turn) {
                return Read::Behind;
            }
            let line = match self.lines.take_line() {
                Ok(Some(line)) => line,
                Ok(None) => return Read::Done,
                Err(e) => return Read::Ends(e.to_string(), Some(e.to_string())),
            };
            self.pace.count(turn);
            if let Some(ends) = self.frame(Ok(line), events, writing) {
                return ends;
            }
        }
    }

    /// The stream ended: a last line without its newline is read as a line (as a task's
    /// session reads it); why the session ends.
    fn at_end(&mut self, events: &mut Vec<Event>) -> String {
        let mut unwritten = Vec::new();
        while let Ok(Some(line)) = self.lines.take_line() {
            if let Some(Read::Ends(why, _)) = self.frame(Ok(line), events, &mut unwritten) {
                return why;
            }
        }
        if let Ok(line) = self.lines.take_last_line() {
            if let Some(Read::Ends(why, _)) = self.frame(Ok(line), events, &mut unwritten) {
                return why;
            }
        }
        "connection closed".into()
    }

    /// One line read: its event for the core; `Some` when the session ends with it.
    fn frame(
        &mut self,
        line: Result<Vec<u8>, FrameError>,
        events: &mut Vec<Event>,
        writing: &mut Vec<Token>,
    ) -> Option<Read> {
        let frame = line.and_then(line_text).and_then(|l| self.frames.decode(l));
        let report = match read_frame(frame, &self.host, &mut self.last_allocs_running) {
            FrameRead::Report(report) => report,
            FrameRead::Other(event) => {
                events.extend(self.lease.told(event));
                return None;
            }
            FrameRead::Refuse(why) => return Some(Read::Ends(why.clone(), Some(why))),
            FrameRead::End(why) => return Some(Read::Ends(why, None)),
        };
        events.push(report_event(
            &self.host,
            self.conn,
            self.word.row(),
            report,
            &self.last_allocs_running,
        ));
        events.extend(self.lease.reported());
        // A daemon that ends allocations past their deadline hears of them from now.
        if let Some(word) = self
            .told
            .starts_ending(&self.last_allocs_running, &self.word)
        {
            let messages = self.told.changes(&word, self.sweep_live);
            self.queue(&messages, writing);
        }
        None
    }

    /// `messages` to be written at the end of the turn.
    fn queue(&mut self, messages: &[FromBroker], writing: &mut Vec<Token>) {
        if messages.is_empty() {
            return;
        }
        if self.outbox.is_empty() {
            writing.push(self.token);
        }
        for message in messages {
            self.encode(message);
        }
    }

    fn encode(&mut self, message: &FromBroker) {
        let start = self.outbox.len();
        match serde_json::to_writer(&mut self.outbox, message) {
            Ok(()) => self.outbox.push(b'\n'),
            Err(e) => {
                self.outbox.truncate(start);
                warn!(host = %self.host, error = %e, "a message to a host daemon did not encode");
            }
        }
    }

    fn disconnected(self, reason: String) -> Event {
        Event::Disconnected {
            host: self.host,
            conn: self.conn,
            reason,
        }
    }
}

/// The session of `token`, if it is still that connection's.
fn session_of(sessions: &mut [Option<Session>], token: Token) -> Option<&mut Session> {
    sessions
        .get_mut(token.index())?
        .as_mut()
        .filter(|s| s.token == token)
}

/// A wait for `word`'s next word, owned (polled by the session's waker).
fn next_word(word: &WordSender) -> Pin<Box<dyn Future<Output = HostWord> + Send>> {
    let word = word.clone();
    Box::pin(async move { word.next().await })
}

/// Writes as much of `outbox` as the socket takes now, and drops it from `outbox`.
fn write_some(fd: BorrowedFd<'_>, outbox: &mut Vec<u8>) -> io::Result<()> {
    let flags = nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL;
    let mut sent = 0;
    while sent < outbox.len() {
        match nix::sys::socket::send(fd.as_raw_fd(), &outbox[sent..], flags) {
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EAGAIN) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    outbox.drain(..sent);
    Ok(())
}

#[cfg(test)]
#[path = "hostd_ring_tests.rs"]
mod tests;
