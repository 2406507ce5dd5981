//! The pool core: one job's JEL pool (members, elections, the ordered event stream and its
//! watchers) as a pure state machine the agent hosts.
//!
//! # Layout
//! - this module: the [`PoolConfig`] (from RSL `jel="…"`), the [`Input`]s the shell feeds,
//!   the [`Output`]s it must perform, and the [`Line`]s it writes.
//! - `state`: [`Pool`] and its entry points [`Pool::handle`] / [`Pool::handle_batch`];
//!   connections, hello and requests, members joining, leaving and dying.
//! - `hosts`: hosts granted, reclaimed (`vacate`), released or lost, processes killed.
//! - `elect`: elections (uniform and non-uniform) and their epochs.
//! - `stream`: the log (seq, compaction), watchers (replay, snapshot, slow consumers) and the
//!   per-connection batching of what is sent.
//!
//! # Model
//! - A **connection** is opened by the shell ([`Input::Opened`], with the host it comes from
//!   and the peer's pid) and starts with a hello line each way. After the hello it is either a
//!   *request* connection (it may `join`, then it carries that **member**) or, once it sent
//!   `watch`, a *watch* connection that only receives events. Keeping the two apart means a
//!   watcher cut off for being slow never kills a member.
//! - A **member** is `joined`, then `left` (it said `leave`) or `died` with a reason:
//!   `exited` (its connection closed without `leave`), `killed` ([`Input::Killed`] or its host
//!   handed back), `host_lost` ([`Input::HostLost`]), `vacated` (its host was reclaimed and it
//!   did not leave before the host was released).
//! - The **stream** is totally ordered: every event gets the next `seq`, from 1, and is sent to
//!   every watcher in that order. The newest [`PoolConfig::max_log`] events are kept for
//!   watchers that (re)connect with `watch from`; older ones are compacted away, and a watcher
//!   asking for them gets one `snapshot` event (the state at the newest seq) instead.
//! - An **election** has a winner (or none) and an epoch that grows with every `elected`.
//!
//! Every entry point is pure: no I/O, no clock (callers pass `now`), no async. The shell turns
//! [`Output`]s into writes and closes and reports back what it wrote ([`Input::Flushed`]).
//!
//! # Choices
//! - **`host_lost` only when certain.** The shell feeds [`Input::HostLost`] only once the host
//!   is down *and* the subagent's own deadline for ending its processes has passed; until then
//!   those members are alive as far as the pool knows (two live masters are worse than a late
//!   `died`; the election epoch fences what slips through).
//! - **A reclaim is announced first.** [`Input::Reclaim`] puts `vacate{host, members, deadline}`
//!   in the stream; the shell sends SIGTERM only after performing the outputs. A member of that
//!   host whose connection then closes without `leave` died `vacated`; the ones still there at
//!   [`Input::HostReleased`] too. Released without a reclaim (a hand-back), they died `killed`.
//! - **Uniform elections re-elect at once:** when the winner leaves or dies, the earliest
//!   remaining candidate wins and `elected` announces it with the next epoch (or `winner: null`
//!   when no candidate is left). **Non-uniform** elections only announce `winner: null`; the
//!   next `elect` wins (as Ibis's central registry does).
//! - **Reliable membership** keeps the log and cuts a slow watcher off (it resumes by seq, with
//!   no gap and no duplicate). **Unreliable** keeps no log (a reconnecting watcher always gets a
//!   `snapshot`, never the events it missed) and drops the events that do not fit a slow
//!   watcher's buffer (it sees a gap in `seq`) instead of cutting it off.
//! - **Signals are events:** every watcher sees them, with the addressees in `to` (empty: all);
//!   a member filters them.
//! - **After `terminated` nothing is emitted**: state still changes, the stream has ended.
//!
//! # Hosting a pool (what the agent's shell does)
//! `jel/tests/server` is a small working example of all this, on one host.
//! - **Start:** one [`Pool`] per job, `Pool::new(PoolConfig::from_rsl(jel)?)` with the RSL
//!   `jel` value (a [`JelRslError`] is a bad job spec: exit 64 before the job starts). Bind a
//!   Unix socket in the job's private directory and put its path in the job's environment as
//!   `RB_JEL` ([`crate::ENV_JEL`]); each subagent does the same on its host for the remote
//!   processes and relays connections over its agent link (open, line, closed one way; send,
//!   disconnect the other), the agent choosing [`ConnId`]s unique across hosts.
//! - **Connections:** accept only peers of the job's uid (`proto::peercred::peer_uid`);
//!   [`Input::Opened`] with the host's lab name and the peer's pid
//!   ([`Input::OpenedFrontEnd`] for the agent's own socket, whose members no host event
//!   touches); every line read (bound
//!   its length, and close the connection past it) → [`Input::Line`]; EOF or an error →
//!   [`Input::Closed`] at once (the issue wants `died` within 100 ms).
//! - **Batching:** feed everything that is ready (all lines read in one go) through one
//!   [`Pool::handle_batch`]: each connection then gets one [`Output::Send`].
//! - **Outputs:** `Send` → append the lines to the connection's buffer and write it
//!   non-blocking (one `writev`), reporting [`Input::Flushed`] with the whole lines written;
//!   `Disconnect` → write what is buffered if it goes at once, then close and forget (no
//!   `Closed` needed). Never drop an output.
//! - **Job events:** a broker grant → [`Input::HostGranted`]; a reclaim → [`Input::Reclaim`]
//!   with `deadline_ms` = now + grace (Unix ms), performed *before* the subagent is told to
//!   terminate; the host given back (release confirmed, forced, or a shrink) →
//!   [`Input::HostReleased`]; a subagent link lost → [`Input::HostLost`] only once its own
//!   deadline for ending its processes has passed; a process the agent kills (pid known) →
//!   [`Input::Killed`]; the job's end → [`Input::Terminate`], then write out and close.
//! - **Time:** [`Input::Tick`] about once a second (stalled watchers).

mod elect;
mod hosts;
mod state;
mod stream;

use std::{sync::Arc, time::Duration};

pub use state::Pool;

use crate::wire::Event;

/// A connection's id, chosen by the shell (unique among open connections).
pub type ConnId = u64;

/// Membership consistency (Ibis `MEMBERSHIP_TOTALLY_ORDERED` / `MEMBERSHIP_UNRELIABLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    Reliable,
    Unreliable,
}

/// Election consistency (Ibis `ELECTIONS_STRICT` / `ELECTIONS_UNRELIABLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elections {
    Uniform,
    NonUniform,
}

/// A pool's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pub membership: Membership,
    pub elections: Elections,
    /// Events kept for replay (reliable membership; unreliable keeps none).
    pub max_log: usize,
    /// Lines a watcher may have sent but not yet flushed before it is cut off (reliable) or
    /// loses events (unreliable). Replays count too, so keep it above `max_log`.
    pub max_buffer: usize,
    /// A watcher with unflushed lines that flushed nothing for this long is cut off
    /// (checked on [`Input::Tick`]).
    pub stall: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            membership: Membership::Reliable,
            elections: Elections::Uniform,
            max_log: 65_536,
            max_buffer: 2 * 65_536,
            stall: Duration::from_secs(30),
        }
    }
}

/// A bad `jel=` value in a job's RSL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("RSL `jel=\"{value}\"`: unknown word `{word}`\nhelp: use a comma-separated list of `reliable` or `unreliable` and `uniform` or `nonuniform`, e.g. (jel=\"reliable,uniform\")")]
pub struct JelRslError {
    pub value: String,
    pub word: String,
}

impl PoolConfig {
    /// The settings named by an RSL `jel` value such as `reliable,uniform` (each word optional;
    /// the defaults are reliable and uniform).
    pub fn from_rsl(value: &str) -> Result<PoolConfig, JelRslError> {
        let mut config = PoolConfig::default();
        for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "reliable" => config.membership = Membership::Reliable,
                "unreliable" => config.membership = Membership::Unreliable,
                "uniform" => config.elections = Elections::Uniform,
                "nonuniform" | "non-uniform" => config.elections = Elections::NonUniform,
                _ => {
                    return Err(JelRslError {
                        value: value.to_string(),
                        word: word.to_string(),
                    })
                }
            }
        }
        Ok(config)
    }

    /// The settings as the hello line states them: `reliable,uniform` and so on.
    pub fn consistency(&self) -> String {
        let m = match self.membership {
            Membership::Reliable => "reliable",
            Membership::Unreliable => "unreliable",
        };
        let e = match self.elections {
            Elections::Uniform => "uniform",
            Elections::NonUniform => "nonuniform",
        };
        format!("{m},{e}")
    }
}

/// What the shell tells the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A client connected from `host` (the lab name); `pid` from SO_PEERCRED when known.
    Opened {
        conn: ConnId,
        host: String,
        pid: Option<u32>,
    },
    /// A client connected on the pool's own host (the job's front end, the agent's socket),
    /// labelled `host`. Its members leave only by themselves or at the pool's end: host
    /// events (reclaim, release, loss, kill) name granted hosts, and a granted host may have
    /// the front end's name (a lab host granted to the job that runs on it) without its
    /// events being about the front end's own processes.
    OpenedFrontEnd {
        conn: ConnId,
        host: String,
        pid: Option<u32>,
    },
    /// One line the client sent, without its newline.
    Line { conn: ConnId, line: String },
    /// The shell wrote `lines` more of this connection's lines to the socket.
    Flushed { conn: ConnId, lines: usize },
    /// The connection closed (EOF or error).
    Closed { conn: ConnId },
    /// The broker granted `host` to the job.
    HostGranted { host: String },
    /// The broker takes `host` back; its processes are killed at `deadline_ms` (Unix ms).
    /// Feed this before the subagent sends SIGTERM.
    Reclaim { host: String, deadline_ms: u64 },
    /// `host` left the job (after a reclaim or a hand-back); the members still on it are dead.
    HostReleased { host: String },
    /// `host` is down and its processes are certainly gone (see the module doc).
    HostLost { host: String },
    /// The agent killed process `pid` on `host`.
    Killed { host: String, pid: u32 },
    /// No more joins.
    Close,
    /// The job ends: `closed` (if not yet) then `terminated`.
    Terminate,
    /// Time passed: cut off stalled watchers.
    Tick,
}

/// Why the pool wants a connection closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisconnectReason {
    /// The first line was not a hello of our version (the error reply says why).
    BadHello,
    /// A watcher's buffer is full; it resumes with `watch from` its last seq + 1.
    SlowConsumer,
    /// A watcher with unflushed lines made no progress for [`PoolConfig::stall`].
    Stalled,
    /// The connection's host is gone (lost or released).
    HostGone,
    /// A watch connection sent a request: it takes none, and answering each with an error
    /// would buffer without bound for a client that writes and never reads (found by the
    /// `jel_lines` fuzz target). Requests go on another connection.
    RequestOnWatch,
}

/// What the shell must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Write these lines to the connection, in order, in as few writes as it can; then report
    /// [`Input::Flushed`].
    Send { conn: ConnId, lines: Vec<Line> },
    /// Close the connection (after writing what was sent to it before) and forget it: no
    /// [`Input::Closed`] is needed for it.
    Disconnect {
        conn: ConnId,
        reason: DisconnectReason,
    },
}

/// One line to write (it ends with a newline). Events are serialized once and shared by every
/// watcher they go to.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Event(Arc<Logged>),
    Text(String),
}

impl Line {
    /// The bytes to write, newline included.
    pub fn as_str(&self) -> &str {
        match self {
            Line::Event(logged) => &logged.text,
            Line::Text(text) => text,
        }
    }
}

/// An event of the stream and its line, serialized once.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
    pub event: Event,
    pub text: String,
}

#[cfg(test)]
mod tests;
