//! How long a subagent (the guardian of a job's command on a host) goes on without its
//! agent: the limits the guardian keeps (`crate::subagent`) and the agent core counts on
//! (a link lost for [`ENDS_AFTER_LOSS`] means the host has nothing of the job left). Kept
//! here so that the core depends on no I/O module for them.

use std::time::Duration;

/// How long the guardian keeps the group alive without its agent before ending it.
pub const AGENT_LOSS_LIMIT: Duration = Duration::from_secs(6);
/// How long a guardian waits for a connection to its agent.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a guardian waits for its agent's handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause between a guardian's tries to reach its agent again.
pub const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// The grace the guardian gives the command when it ends it on its own (agent lost).
pub const LOSS_END_GRACE: Duration = Duration::from_secs(1);
/// The latest a guardian that lost its agent has ended its command, counted from the loss:
/// it tries to reconnect until [`AGENT_LOSS_LIMIT`] has passed (the last try may take a
/// connect and a handshake timeout), then gives the command [`LOSS_END_GRACE`]. Past this,
/// a host whose subagents are all out of reach has certainly nothing of the job left
/// running (JEL's `died{host_lost}`).
pub const ENDS_AFTER_LOSS: Duration = Duration::from_millis(
    (AGENT_LOSS_LIMIT.as_millis()
        + RETRY_PAUSE.as_millis()
        + CONNECT_TIMEOUT.as_millis()
        + HANDSHAKE_TIMEOUT.as_millis()
        + LOSS_END_GRACE.as_millis()) as u64,
);
