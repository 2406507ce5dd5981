//! A peer's outbox: the bounded queue of messages the core hands one connection task to
//! write. The core never waits on it ([`Outbox::push`] does not block): a peer that stops
//! reading fills its outbox, and the core then cuts it ([`Outbox::cut`]) instead of waiting,
//! so one stalled peer never holds up a decision for everyone else.
//!
//! The connection task holds the other end ([`OutboxRx`]): the messages to write, and the
//! word that the core cut the peer (with why), which it must watch even while a write is
//! blocked on the peer.

use proto::msg::FromBroker;
use tokio::sync::{mpsc, oneshot};

/// Messages an agent's outbox holds by default. A job's burst is one message per request
/// it has queued (each queue position update), so this bounds the memory a peer that never
/// reads can pin, yet leaves room for jobs with thousands of waiting requests.
pub const AGENT_OUTBOX: usize = 8192;

/// The environment variable that sets the agents' outbox size (tests make it small to
/// reach the limit with few messages).
pub const AGENT_OUTBOX_VAR: &str = "RB_AGENT_OUTBOX";

/// The agents' outbox size: [`AGENT_OUTBOX_VAR`] when it holds a positive number, else
/// [`AGENT_OUTBOX`].
pub fn agent_outbox_size() -> usize {
    std::env::var(AGENT_OUTBOX_VAR)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(AGENT_OUTBOX)
}

/// The core's end of a peer's outbox.
#[derive(Debug)]
pub struct Outbox {
    tx: mpsc::Sender<FromBroker>,
    cut: Option<oneshot::Sender<String>>,
}

/// The connection task's end: what to write, and the core's word that the peer is cut.
#[derive(Debug)]
pub struct OutboxRx {
    pub messages: mpsc::Receiver<FromBroker>,
    pub cut: oneshot::Receiver<String>,
}

/// Why a message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("the peer's outbox is full: it does not read what it is sent")]
    Full,
    #[error("the peer's connection is gone")]
    Closed,
}

/// An outbox for `capacity` messages (at least one).
pub fn channel(capacity: usize) -> (Outbox, OutboxRx) {
    let (tx, messages) = mpsc::channel(capacity.max(1));
    let (cut_tx, cut) = oneshot::channel();
    let outbox = Outbox {
        tx,
        cut: Some(cut_tx),
    };
    (outbox, OutboxRx { messages, cut })
}

impl Outbox {
    /// Queues `msg` without waiting.
    pub fn push(&self, msg: FromBroker) -> Result<(), PushError> {
        self.tx.try_send(msg).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => PushError::Full,
            mpsc::error::TrySendError::Closed(_) => PushError::Closed,
        })
    }

    /// Tells the connection task to close, with `reason` (once; later calls do nothing).
    pub fn cut(&mut self, reason: &str) {
        if let Some(cut) = self.cut.take() {
            let _ = cut.send(reason.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(i: u64) -> FromBroker {
        FromBroker::JobEnded { job: i }
    }

    #[test]
    fn a_full_outbox_refuses_without_waiting_and_the_cut_reaches_the_task() {
        let (mut outbox, mut rx) = channel(2);
        assert_eq!(outbox.push(note(1)), Ok(()));
        assert_eq!(outbox.push(note(2)), Ok(()));
        assert_eq!(outbox.push(note(3)), Err(PushError::Full));
        outbox.cut("full");
        outbox.cut("again");
        assert_eq!(rx.cut.try_recv().as_deref(), Ok("full"));
        assert!(matches!(
            rx.messages.try_recv(),
            Ok(FromBroker::JobEnded { job: 1 })
        ));
        drop(rx);
        assert_eq!(outbox.push(note(4)), Err(PushError::Closed));
    }
}
