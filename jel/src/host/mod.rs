//! The shell that hosts a pool (feature `tokio`): [`PoolHost`] binds the job's JEL socket,
//! serves the pure [`Pool`](crate::pool::Pool) over it, and takes the job's events (grants,
//! reclaims, releases, losses, kills, the end) from its owner, the agent.
//!
//! # Layout
//! - this module: [`HostConfig`], [`PoolHost`] (the handle, its async methods), [`RemoteOut`]
//!   (what the agent carries to members on other hosts), [`HostError`].
//! - `accept`: the listening socket (same uid only) and one reader task per connection
//!   (lines, bounded in length); its [`LineReader`] is public: the subagents' relay
//!   (`agent/src/subjel.rs`) reads its clients' lines with it.
//! - `serve`: the pool task: batches everything ready into one
//!   [`Pool::handle_batch`](crate::pool::Pool::handle_batch), writes each connection's lines
//!   non-blocking (one `writev`), reports what was written, ticks once a second.
//!
//! # Model
//! One task owns the pool; everything reaches it through one channel, in order: connections
//! opened (by the accept task or [`PoolHost::open_remote`]), lines read, closes, "writable
//! again", and the job's events with a reply channel. A job event's method returns once the
//! pool handled it and every event it caused was written to the local sockets as far as they
//! take without blocking (and handed to [`RemoteOut`] for remote ones): so after
//! [`PoolHost::reclaim`] returns, the `vacate` is in the stream and the caller may send
//! SIGTERM.
//!
//! # Choices
//! - **Remote members** are connections like local ones, with ids from the same counter; their
//!   lines come in through [`PoolHost::remote_line`] and go out as [`RemoteOut`]. Lines handed
//!   to the agent count as written: the agent–subagent link does its own buffering, and the
//!   subagent bounds what it holds for a slow member.
//! - **A connection that never reads** (no watcher: its replies pile up) is closed past
//!   [`HostConfig::max_unwritten`] lines, as if it had closed itself (a member dies `exited`).
//!   Watchers are cut off long before by the pool (slow consumers).
//! - **A line over [`HostConfig::max_line`] bytes** closes its connection, with a warning.
//! - **The end** ([`PoolHost::terminate`]) removes the socket file first, then takes every
//!   connection already queued on the listener, and serves until each local connection is
//!   written out and has made its first request (within [`HostConfig::drain`]): a client that
//!   connected before the end (`rb-jel watch` started as the job ends) gets the stream through
//!   `terminated`; one that connects after finds no socket. Before, such a watch failed with a
//!   broken pipe one run in many.

mod accept;
mod serve;

pub use accept::{LineReader, TooLong};

use std::{
    io,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::{
    net::UnixListener,
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

use crate::pool::{ConnId, DisconnectReason, Input, Line, PoolConfig};

/// How to host a pool.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The socket to bind (the agent's: in the job's private directory; `RB_JEL` names it).
    pub socket: PathBuf,
    /// The lab name of this host: local members are on it.
    pub host: String,
    /// Whether this host is the job's front end (the agent's pool): its local members are
    /// then never touched by host events, which name granted hosts
    /// ([`Input::OpenedFrontEnd`]). Off by default: a
    /// pool hosted by hand (`rb-jel-host`, tests) stands its local members in for a granted
    /// host's.
    pub front_end: bool,
    pub pool: PoolConfig,
    /// Longest line a client may send, in bytes, newline excluded.
    pub max_line: usize,
    /// Lines a connection may have unwritten before it is closed (see the module doc).
    pub max_unwritten: usize,
    /// How often the pool is ticked (stalled watchers).
    pub tick: Duration,
    /// At [`PoolHost::terminate`], how long the last lines may take to be written.
    pub drain: Duration,
}

impl HostConfig {
    /// The defaults: lines up to 1 MiB, ticks every second, 2 s to drain at the end.
    pub fn new(socket: impl Into<PathBuf>, host: impl Into<String>, pool: PoolConfig) -> Self {
        let max_unwritten = pool.max_buffer + pool.max_log + 1024;
        HostConfig {
            socket: socket.into(),
            host: host.into(),
            front_end: false,
            pool,
            max_line: 1 << 20,
            max_unwritten,
            tick: Duration::from_secs(1),
            drain: Duration::from_secs(2),
        }
    }
}

/// Why a pool could not be hosted, or a call did not reach it.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot bind the job's JEL socket {path}: {source}\nhelp: the directory must exist and be the job's own")]
    Bind { path: PathBuf, source: io::Error },
    #[error("the JEL socket {path} is in use by a live server\nhelp: each job binds its own socket in its own private directory")]
    InUse { path: PathBuf },
    #[error("the job's JEL pool has stopped\nhelp: this happens after terminate(), or when its task panicked (see the log)")]
    Stopped,
}

/// What the agent carries to a remote connection (one opened with [`PoolHost::open_remote`]).
#[derive(Debug, Clone, PartialEq)]
pub enum RemoteOut {
    /// Write these lines to the member's connection on its host, in order.
    Send { conn: ConnId, lines: Vec<Line> },
    /// Close that connection (after the lines sent before).
    Disconnect {
        conn: ConnId,
        reason: DisconnectReason,
    },
}

/// A message to the pool task.
enum Msg {
    /// A connection opened: local (with its socket) or remote.
    Opened {
        conn: ConnId,
        host: String,
        pid: Option<u32>,
        stream: Option<Arc<tokio::net::UnixStream>>,
    },
    /// Lines read from a connection.
    Lines { conn: ConnId, lines: Vec<String> },
    /// A connection closed (EOF, an error, an over-long line).
    Closed { conn: ConnId },
    /// A local socket that would have blocked takes writes again.
    Writable { conn: ConnId },
    /// A job event; `done` once it is handled and its lines written.
    Job {
        input: Input,
        done: oneshot::Sender<()>,
    },
    /// The job ends: `terminated`, write out, close everything.
    /// Answered with the pids of the local members the end reached ([`PoolHost::terminate`]).
    Terminate { done: oneshot::Sender<Vec<u32>> },
}

/// A pool hosted on a Unix socket, and the handle its owner (the agent) drives it with.
/// Dropping it stops the pool at once (no `terminated`); [`PoolHost::terminate`] ends it
/// properly.
#[derive(Debug)]
pub struct PoolHost {
    tx: mpsc::Sender<Msg>,
    socket: PathBuf,
    next_conn: Arc<AtomicU64>,
    accept: JoinHandle<()>,
    /// Tells the accept task to take what is queued and end (at [`PoolHost::terminate`]).
    stop_accept: Option<oneshot::Sender<()>>,
    serve: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

/// Messages the pool task's channel holds before senders wait.
const CHANNEL: usize = 4096;

impl PoolHost {
    /// Binds `config.socket` (mode 0600) and starts serving; the receiver gets what is for
    /// remote connections. Must be called inside a tokio runtime.
    pub fn bind(
        config: HostConfig,
    ) -> Result<(PoolHost, mpsc::UnboundedReceiver<RemoteOut>), HostError> {
        let listener = bind_socket(&config.socket)?;
        let (tx, rx) = mpsc::channel(CHANNEL);
        let (remote_tx, remote_rx) = mpsc::unbounded_channel();
        let next_conn = Arc::new(AtomicU64::new(1));
        let (stop_accept, stop) = oneshot::channel();
        let accept = tokio::spawn(accept::accept(
            listener,
            accept::Acceptor {
                tx: tx.clone(),
                next_conn: Arc::clone(&next_conn),
                host: config.host.clone(),
                max_line: config.max_line,
            },
            stop,
            config.socket.clone(),
        ));
        let socket = config.socket.clone();
        let serve = tokio::spawn(serve::Server::new(config, tx.clone(), remote_tx).run(rx));
        let host = PoolHost {
            tx,
            socket,
            next_conn,
            accept,
            stop_accept: Some(stop_accept),
            serve: Some(serve),
        };
        Ok((host, remote_rx))
    }

    /// The socket's path (what `RB_JEL` names).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn job(&self, input: Input) -> Result<(), HostError> {
        let (done, wait) = oneshot::channel();
        let msg = Msg::Job { input, done };
        self.tx.send(msg).await.map_err(|_| HostError::Stopped)?;
        wait.await.map_err(|_| HostError::Stopped)
    }

    /// The broker granted `host` to the job: `host_granted`.
    pub async fn host_granted(&self, host: &str) -> Result<(), HostError> {
        let host = host.to_string();
        self.job(Input::HostGranted { host }).await
    }

    /// The broker takes `host` back; what is left on it is killed at `deadline_unix_ms`.
    /// Returns once `vacate` is written: send SIGTERM after this.
    pub async fn reclaim(&self, host: &str, deadline_unix_ms: u64) -> Result<(), HostError> {
        let input = Input::Reclaim {
            host: host.to_string(),
            deadline_ms: deadline_unix_ms,
        };
        self.job(input).await
    }

    /// `host` left the job (release confirmed, forced, or a shrink): its members still there
    /// died (`vacated` after a reclaim, else `killed`), then `host_released`.
    pub async fn host_released(&self, host: &str) -> Result<(), HostError> {
        let host = host.to_string();
        self.job(Input::HostReleased { host }).await
    }

    /// `host` is down and its processes are certainly gone: `died{host_lost}` for its members.
    pub async fn host_lost(&self, host: &str) -> Result<(), HostError> {
        let host = host.to_string();
        self.job(Input::HostLost { host }).await
    }

    /// The agent killed process `pid` on `host`: its members died `killed`.
    pub async fn killed(&self, host: &str, pid: u32) -> Result<(), HostError> {
        let host = host.to_string();
        self.job(Input::Killed { host, pid }).await
    }

    /// No more joins: `closed`.
    pub async fn close(&self) -> Result<(), HostError> {
        self.job(Input::Close).await
    }

    /// A member's connection opened on remote `host` (relayed by its subagent); lines for
    /// it come out as [`RemoteOut`] with the id returned.
    pub async fn open_remote(&self, host: &str, pid: Option<u32>) -> Result<ConnId, HostError> {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let msg = Msg::Opened {
            conn,
            host: host.to_string(),
            pid,
            stream: None,
        };
        self.tx.send(msg).await.map_err(|_| HostError::Stopped)?;
        Ok(conn)
    }

    /// A line a remote connection sent (without its newline).
    pub async fn remote_line(&self, conn: ConnId, line: String) -> Result<(), HostError> {
        let msg = Msg::Lines {
            conn,
            lines: vec![line],
        };
        self.tx.send(msg).await.map_err(|_| HostError::Stopped)
    }

    /// A remote connection closed.
    pub async fn remote_closed(&self, conn: ConnId) -> Result<(), HostError> {
        let msg = Msg::Closed { conn };
        self.tx.send(msg).await.map_err(|_| HostError::Stopped)
    }

    /// The job ends: `closed` (if not yet) and `terminated`, written out within
    /// [`HostConfig::drain`]; then every connection and the socket are closed. Returns the
    /// pids of the processes on the other end of the local connections still open then (as
    /// the kernel said when they connected): the members that were told, which the caller
    /// may give a moment to end on their own before it ends what is left of the job.
    pub async fn terminate(mut self) -> Result<Vec<u32>, HostError> {
        // No connection after this; those queued already are the pool's before it ends.
        if let Some(stop) = self.stop_accept.take() {
            let _ = stop.send(()); // the accept task may have ended (the pool task is gone)
        }
        let _ = (&mut self.accept).await; // ended, or panicked: nothing more to accept either way
        let (done, wait) = oneshot::channel();
        let sent = self.tx.send(Msg::Terminate { done }).await;
        let result = match sent {
            Ok(()) => wait.await.map_err(|_| HostError::Stopped),
            Err(_) => Err(HostError::Stopped),
        };
        if let Some(serve) = self.serve.take() {
            let _ = serve.await; // it has finished (or panicked: reported as Stopped above)
        }
        result
    }
}

impl Drop for PoolHost {
    fn drop(&mut self) {
        self.accept.abort();
        if let Some(serve) = &self.serve {
            serve.abort();
        }
        let _ = std::fs::remove_file(&self.socket); // gone already after a clean end
    }
}

/// Binds the socket, mode 0600. A socket file left by a dead server is replaced; a live one
/// is an error.
fn bind_socket(path: &Path) -> Result<UnixListener, HostError> {
    let bind_error = |source| HostError::Bind {
        path: path.to_path_buf(),
        source,
    };
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(HostError::InUse {
                path: path.to_path_buf(),
            });
        }
        std::fs::remove_file(path).map_err(bind_error)?;
    }
    let listener = UnixListener::bind(path).map_err(bind_error)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_error)?;
    Ok(listener)
}

#[cfg(test)]
mod tests;
