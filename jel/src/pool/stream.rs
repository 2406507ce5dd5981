//! The stream: seq numbering, the bounded log (compaction), watchers (replay from a seq, a
//! `snapshot` when it was compacted away), slow consumers, and batching what each connection
//! is sent into one [`Output::Send`] per batch of inputs.

use std::{sync::Arc, time::Instant};

use super::{
    state::{Pool, Refusal},
    ConnId, DisconnectReason, Line, Logged, Membership, Output,
};
use crate::wire::{to_line, Event, EventKind, Reply};

/// A watch connection's delivery state.
#[derive(Debug, Clone)]
pub(super) struct Watcher {
    /// Lines handed to the shell and not yet reported flushed.
    pub unflushed: usize,
    /// When it last flushed something (or started watching).
    pub progress: Instant,
    /// Events it lost for being slow (unreliable membership only).
    pub dropped: u64,
    /// Lines for it in this batch of inputs (sent at [`Pool::flush`]).
    pub pending: Vec<Line>,
}

impl Pool {
    /// Puts an event in the stream (the next seq) and sends it to every watcher; returns its
    /// seq. After `terminated` nothing is emitted (returns the head).
    pub(super) fn emit(&mut self, kind: EventKind) -> u64 {
        if self.terminated {
            return self.head;
        }
        self.head += 1;
        let event = Event {
            seq: self.head,
            kind,
        };
        let text = to_line(&event);
        let logged = Arc::new(Logged { event, text });
        if self.log_limit() > 0 {
            self.log.push_back(Arc::clone(&logged));
            while self.log.len() > self.log_limit() {
                self.log.pop_front();
            }
        }
        let limit = self.config.max_buffer;
        let reliable = self.config.membership == Membership::Reliable;
        self.watchers_pending = !self.watchers.is_empty();
        let mut slow = Vec::new();
        for (conn, w) in self.watchers.iter_mut() {
            if w.unflushed + w.pending.len() < limit {
                w.pending.push(Line::Event(Arc::clone(&logged)));
            } else if reliable {
                slow.push(*conn);
            } else {
                w.dropped += 1;
            }
        }
        for conn in slow {
            self.cut_off(conn, DisconnectReason::SlowConsumer);
        }
        self.head
    }

    fn log_limit(&self) -> usize {
        match self.config.membership {
            Membership::Reliable => self.config.max_log,
            Membership::Unreliable => 0,
        }
    }

    pub(super) fn cut_off(&mut self, conn: ConnId, reason: DisconnectReason) {
        self.watchers.remove(&conn);
        self.conns.remove(&conn);
        self.outbox.remove(&conn);
        self.closing.push((conn, reason));
    }

    /// `watch from`: the reply, then the events from `from` (or a snapshot), then live ones.
    pub(super) fn watch(&mut self, conn: ConnId, from: u64, now: Instant) -> Result<(), Refusal> {
        if let Some(id) = self.conns.get(&conn).and_then(|c| c.member) {
            return Err(Refusal {
                error: format!("this connection is member {id}; a member does not watch on it"),
                help: "open another connection to watch (the clients do)".into(),
            });
        }
        let from = from.max(1);
        if from > self.head + 1 {
            return Err(Refusal {
                error: format!("seq {from} is after the newest event ({})", self.head),
                help: "watch from a seq you saw, or without `from`; a pool restarted with its job has a new stream".into(),
            });
        }
        // The replies to this connection's earlier requests of this batch are not written
        // yet either: they are the first lines of its buffer, and a connection that asked
        // more than its buffer holds is a slow consumer from the start. (Found by the
        // `jel_lines` fuzz target: a hello, 25 bad lines and `watch` in one batch made a
        // watcher holding 27 lines over a buffer of 16, and the events of that batch went
        // on top.)
        let queued = self.outbox.remove(&conn).unwrap_or_default();
        if queued.len() >= self.config.max_buffer {
            self.cut_off(conn, DisconnectReason::SlowConsumer);
            return Ok(());
        }
        let w = Watcher {
            unflushed: 0,
            progress: now,
            dropped: 0,
            pending: queued,
        };
        self.watchers.insert(conn, w);
        let reply = Reply::Watch {
            from,
            head: self.head,
        };
        self.send(conn, Line::Text(to_line(&reply)));
        let first_kept = self.head + 1 - self.log.len() as u64;
        if from >= first_kept {
            let skip = (from - first_kept) as usize;
            let replay: Vec<Line> = self
                .log
                .iter()
                .skip(skip)
                .cloned()
                .map(Line::Event)
                .collect();
            for line in replay {
                self.send(conn, line);
            }
        } else {
            let snapshot = self.snapshot();
            self.send(conn, Line::Text(to_line(&snapshot)));
        }
        Ok(())
    }

    /// The state as of the newest seq.
    pub fn snapshot(&self) -> Event {
        Event {
            seq: self.head,
            kind: EventKind::Snapshot {
                members: self.members().cloned().collect(),
                elections: self.election_states(),
                closed: self.is_closed(),
            },
        }
    }

    pub(super) fn flushed(&mut self, conn: ConnId, lines: usize, now: Instant) {
        if let Some(w) = self.watchers.get_mut(&conn) {
            w.unflushed = w.unflushed.saturating_sub(lines);
            w.progress = now;
        }
    }

    pub(super) fn tick(&mut self, now: Instant) {
        let stall = self.config.stall;
        let stalled: Vec<ConnId> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.unflushed > 0 && now.duration_since(w.progress) >= stall)
            .map(|(conn, _)| *conn)
            .collect();
        for conn in stalled {
            self.cut_off(conn, DisconnectReason::Stalled);
        }
    }

    /// The end of a batch: one `Send` per connection, then the closes.
    pub(super) fn flush(&mut self) -> Vec<Output> {
        let mut sends = std::mem::take(&mut self.outbox);
        let watchers = match std::mem::take(&mut self.watchers_pending) {
            true => self.watchers.iter_mut(),
            false => Default::default(),
        };
        for (conn, w) in watchers {
            if !w.pending.is_empty() {
                let lines = std::mem::take(&mut w.pending);
                sends.entry(*conn).or_default().extend(lines);
            }
        }
        let mut out = Vec::with_capacity(sends.len() + self.closing.len());
        for (conn, lines) in sends {
            if let Some(w) = self.watchers.get_mut(&conn) {
                w.unflushed += lines.len();
            }
            out.push(Output::Send { conn, lines });
        }
        for (conn, reason) in self.closing.drain(..) {
            out.push(Output::Disconnect { conn, reason });
        }
        out
    }

    pub(super) fn check_stream(&self) -> Result<(), String> {
        if self.log.len() > self.log_limit() {
            return Err(format!(
                "the log holds {} events, over its limit",
                self.log.len()
            ));
        }
        let first = self.head + 1 - self.log.len() as u64;
        for (i, logged) in self.log.iter().enumerate() {
            if logged.event.seq != first + i as u64 {
                return Err(format!(
                    "log gap: position {i} holds seq {}",
                    logged.event.seq
                ));
            }
        }
        for (conn, w) in &self.watchers {
            if !self.conns.contains_key(conn) {
                return Err(format!("watcher {conn} has no connection"));
            }
            if w.unflushed > self.config.max_buffer + self.log_limit() + 2 {
                return Err(format!(
                    "watcher {conn} holds {} unflushed lines",
                    w.unflushed
                ));
            }
        }
        Ok(())
    }
}
