//! The JEL socket of a remote command: the subagent serves the job's pool to the
//! processes of its command on this host, relaying each connection over its authenticated
//! link to the job's agent, which hosts the pool.
//!
//! - [`bind`] (in the front, before the command starts): a Unix socket `jel.sock` in a
//!   private directory of its own (`RUNTIME_ROOT/subagent-PID`, mode 0700; the socket 0600;
//!   the fd close-on-exec, so the command does not inherit it), named in the command's
//!   `RB_JEL`. The guardian gets the listener across the fork.
//! - [`Relay`] (in the guardian): accepts peers of our own uid only (SO_PEERCRED), gives each
//!   connection an id (unique for the subagent's life), reads its lines (at most
//!   [`JEL_RELAY_MAX_LINE`] bytes; a longer one closes it) and turns what happens into
//!   [`ToBroker::JelOpen`] / [`ToBroker::JelLine`] / [`ToBroker::JelClosed`]; it writes what
//!   the agent sends ([`FromBroker::JelSend`], [`FromBroker::JelDisconnect`]) to the
//!   connection.
//!
//! # Choices
//! - **A member that does not read** has at most [`MAX_QUEUED`] batches waiting to be written
//!   to it; past that it is cut off (closed here, [`ToBroker::JelClosed`] to the agent): a
//!   watcher resumes with `watch from SEQ`, as after the pool's own slow-consumer cut.
//! - **The agent link lost:** every connection is closed at once, on this host (its clients
//!   see EOF) and, when the agent learns it, in the pool; a watcher resumes by seq once the
//!   link is back, a member joins again. Connections accepted while the link is down wait
//!   (their lines too) and are opened at the agent when it is back.
//! - **Before the command is ended** (a reclaim's `Terminate`) the guardian waits, bounded,
//!   until what the agent sent before is written ([`Relay::flush`]): the `vacate` is on the
//!   members' sockets before SIGTERM.

use std::{
    collections::HashMap,
    io,
    os::fd::AsRawFd,
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use jel::host::{LineReader, TooLong};
use proto::msg::{FromBroker, ToBroker, JEL_RELAY_MAX_LINE};
use tokio::{net::UnixStream, sync::mpsc};
use tracing::{debug, warn};

/// The socket's name in its directory.
pub const SOCKET: &str = "jel.sock";
/// Batches of lines a member may have waiting to be written before it is cut off.
pub const MAX_QUEUED: usize = 1024;
/// Events from the accept and reader tasks the guardian holds before they wait.
const CHANNEL: usize = 1024;

/// The socket bound in the front: the listener, its directory (removed when the guardian
/// ends).
#[derive(Debug)]
pub struct Bound {
    pub listener: std::os::unix::net::UnixListener,
    pub dir: PathBuf,
}

impl Bound {
    /// The socket's path (the command's `RB_JEL`).
    pub fn socket(&self) -> PathBuf {
        self.dir.join(SOCKET)
    }
}

/// Why a subagent serves no JEL socket (its command then runs without `RB_JEL`).
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(transparent)]
    Dir(#[from] privdir::Error),
    #[error("cannot bind the JEL socket {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
}

/// Binds `RUNTIME_ROOT/subagent-PID/jel.sock` (`pid`: the subagent's front), mode 0600.
/// The listener is close-on-exec (std's default): the command does not inherit it.
pub fn bind(pid: u32) -> Result<Bound, BindError> {
    let dir = privdir::in_root(&format!("subagent-{pid}"))?;
    let path = dir.join(SOCKET);
    let error = |source| BindError::Bind {
        path: path.clone(),
        source,
    };
    // A socket left by an earlier subagent of the same pid (its guardian died).
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(error(e)),
        _ => {}
    }
    let listener = std::os::unix::net::UnixListener::bind(&path).map_err(error)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(error)?;
    Ok(Bound { listener, dir })
}

/// What the accept and reader tasks report.
#[derive(Debug)]
pub enum Local {
    Opened {
        conn: u64,
        pid: Option<u32>,
        member: Member,
    },
    Line {
        conn: u64,
        line: String,
    },
    Closed {
        conn: u64,
    },
}

/// One connection's writing side.
#[derive(Debug)]
pub struct Member {
    stream: Arc<UnixStream>,
    tx: mpsc::Sender<Write>,
    /// Batches handed to the writer and not yet written.
    queued: Arc<AtomicUsize>,
}

#[derive(Debug)]
enum Write {
    Lines(Vec<String>),
    /// Close once the lines before are written.
    Close,
}

impl Member {
    /// Closes the connection now: its reader sees EOF, its writer an error.
    fn cut(&self) {
        shutdown(&self.stream);
    }
}

fn shutdown(stream: &UnixStream) {
    let _ = nix::sys::socket::shutdown(stream.as_raw_fd(), nix::sys::socket::Shutdown::Both);
}

/// The guardian's side: the connections of its command's processes.
#[derive(Debug)]
pub struct Relay {
    rx: mpsc::Receiver<Local>,
    /// Held so that [`Relay::next`] waits for ever when there is no socket.
    _tx: mpsc::Sender<Local>,
    members: HashMap<u64, Member>,
    accept: Option<tokio::task::JoinHandle<()>>,
    dir: Option<PathBuf>,
}

impl Relay {
    /// Serves `bound` (none: a relay that never has a connection). Inside a runtime.
    pub fn start(bound: Option<Bound>) -> Relay {
        let (tx, rx) = mpsc::channel(CHANNEL);
        let mut relay = Relay {
            rx,
            _tx: tx.clone(),
            members: HashMap::new(),
            accept: None,
            dir: None,
        };
        let Some(bound) = bound else { return relay };
        relay.dir = Some(bound.dir.clone());
        let listener = bound
            .listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixListener::from_std(bound.listener));
        match listener {
            Ok(listener) => relay.accept = Some(tokio::spawn(accept(listener, tx))),
            Err(e) => warn!(error = %e, "the JEL socket cannot be served"),
        }
        relay
    }

    /// The next thing that happened on the socket.
    pub async fn next(&mut self) -> Option<Local> {
        self.rx.recv().await
    }

    /// The next thing that already happened, if any (without waiting).
    pub fn try_next(&mut self) -> Option<Local> {
        self.rx.try_recv().ok()
    }

    /// Takes a local event; the message for the agent, if any.
    pub fn local(&mut self, ev: Local) -> Option<ToBroker> {
        match ev {
            Local::Opened { conn, pid, member } => {
                self.members.insert(conn, member);
                Some(ToBroker::JelOpen { conn, pid })
            }
            Local::Line { conn, line } => self
                .members
                .contains_key(&conn)
                .then_some(ToBroker::JelLine { conn, line }),
            Local::Closed { conn } => self
                .members
                .remove(&conn)
                .map(|_| ToBroker::JelClosed { conn }),
        }
    }

    /// Takes a JEL message from the agent; what to tell it back (a member cut off).
    pub fn from_agent(&mut self, msg: FromBroker) -> Option<ToBroker> {
        match msg {
            FromBroker::JelSend { conn, lines } => {
                let member = self.members.get(&conn)?;
                member.queued.fetch_add(1, Ordering::Relaxed);
                if member.tx.try_send(Write::Lines(lines)).is_ok() {
                    return None;
                }
                warn!(conn, "a JEL member does not read its lines: cut off");
                let member = self.members.remove(&conn)?;
                member.cut();
                Some(ToBroker::JelClosed { conn })
            }
            FromBroker::JelDisconnect { conn, reason } => {
                debug!(conn, %reason, "the pool closes a JEL connection");
                let member = self.members.remove(&conn)?;
                if member.tx.try_send(Write::Close).is_err() {
                    member.cut();
                }
                None
            }
            _ => None,
        }
    }

    /// The agent link is lost: every connection closes (see the module doc).
    pub fn close_all(&mut self) {
        for (_, member) in self.members.drain() {
            member.cut();
        }
    }

    /// Waits until every member's lines are written, at most `within`.
    pub async fn flush(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let pending = || {
            self.members
                .values()
                .any(|m| m.queued.load(Ordering::Relaxed) > 0)
        };
        while pending() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(accept) = &self.accept {
            accept.abort();
        }
        self.close_all();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Accepts connections of our uid until aborted.
async fn accept(listener: tokio::net::UnixListener, tx: mpsc::Sender<Local>) {
    let euid = nix::unistd::geteuid().as_raw();
    let mut next_conn = 1u64;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!(error = %e, "JEL socket: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let uid = proto::peercred::peer_uid(&stream);
        if uid != Some(euid) {
            warn!(peer_uid = ?uid, "JEL socket: refused a connection from another user");
            continue;
        }
        let pid = proto::peercred::peer_pid(&stream).and_then(|p| u32::try_from(p).ok());
        let conn = next_conn;
        next_conn += 1;
        let stream = Arc::new(stream);
        let (wtx, wrx) = mpsc::channel(MAX_QUEUED);
        let queued = Arc::new(AtomicUsize::new(0));
        tokio::spawn(write_member(Arc::clone(&stream), wrx, Arc::clone(&queued)));
        let member = Member {
            stream: Arc::clone(&stream),
            tx: wtx,
            queued,
        };
        if tx.send(Local::Opened { conn, pid, member }).await.is_err() {
            return;
        }
        tokio::spawn(read_lines(conn, stream, tx.clone()));
    }
}

/// Reads `conn`'s lines into the guardian's channel; then reports the close.
async fn read_lines(conn: u64, stream: Arc<UnixStream>, tx: mpsc::Sender<Local>) {
    let mut reader = LineReader::new(JEL_RELAY_MAX_LINE);
    let mut chunk = vec![0u8; 4 * 1024];
    'read: loop {
        if stream.readable().await.is_err() {
            break;
        }
        let n = match stream.try_read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => break,
        };
        match reader.push(&chunk[..n]) {
            Ok(lines) => {
                for line in lines {
                    if tx.send(Local::Line { conn, line }).await.is_err() {
                        return;
                    }
                }
            }
            Err(TooLong(len)) => {
                let max = JEL_RELAY_MAX_LINE;
                warn!(conn, len, max, "JEL socket: a line over the limit; closing");
                break 'read;
            }
        }
    }
    shutdown(&stream);
    let _ = tx.send(Local::Closed { conn }).await;
}

/// Writes what the agent sends to one connection, in order.
async fn write_member(stream: Arc<UnixStream>, mut rx: mpsc::Receiver<Write>, q: Arc<AtomicUsize>) {
    while let Some(item) = rx.recv().await {
        let Write::Lines(lines) = item else { break };
        let bytes: String = lines.concat();
        let written = write_all(&stream, bytes.as_bytes()).await;
        q.fetch_sub(1, Ordering::Relaxed);
        if written.is_err() {
            // The peer is gone: its reader reports the close. Nothing waits on these.
            rx.close();
            while let Ok(item) = rx.try_recv() {
                if matches!(item, Write::Lines(_)) {
                    q.fetch_sub(1, Ordering::Relaxed);
                }
            }
            return;
        }
    }
    shutdown(&stream);
}

async fn write_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write as _};

    fn bound(dir: &tempfile::TempDir) -> Bound {
        let path = dir.path().join(SOCKET);
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        Bound {
            listener,
            dir: dir.path().to_path_buf(),
        }
    }

    /// A client on a thread of its own (blocking I/O), as a job's process is.
    fn client(path: PathBuf) -> std::os::unix::net::UnixStream {
        std::os::unix::net::UnixStream::connect(path).expect("connect")
    }

    /// The next local event, and what it tells the agent.
    async fn step(relay: &mut Relay) -> Option<ToBroker> {
        let ev = tokio::time::timeout(Duration::from_secs(5), relay.next())
            .await
            .expect("in time")
            .expect("an event");
        relay.local(ev)
    }

    #[tokio::test]
    async fn a_connection_is_relayed_both_ways_and_closed_by_either_side() {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = bound(&dir);
        let path = b.socket();
        let mut relay = Relay::start(Some(b));
        let mut c = client(path.clone());
        let opened = step(&mut relay).await;
        let Some(ToBroker::JelOpen { conn, pid }) = opened else {
            panic!("{opened:?}");
        };
        assert_eq!(pid, Some(std::process::id()));
        c.write_all(b"{\"jel\":1}\n").expect("write");
        let line = step(&mut relay).await;
        let expected = ToBroker::JelLine {
            conn,
            line: "{\"jel\":1}".into(),
        };
        assert_eq!(line, Some(expected));
        let send = FromBroker::JelSend {
            conn,
            lines: vec!["a\n".into(), "b\n".into()],
        };
        assert_eq!(relay.from_agent(send), None);
        relay.flush(Duration::from_secs(5)).await;
        let reason = "HostGone".to_string();
        assert_eq!(
            relay.from_agent(FromBroker::JelDisconnect { conn, reason }),
            None
        );
        let read = tokio::task::spawn_blocking(move || {
            BufReader::new(c)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
        });
        let lines = tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("EOF in time")
            .expect("reader");
        assert_eq!(lines, ["a", "b"], "the lines, then EOF");
        // Its reader reports the close; the agent already forgot it: nothing to say.
        assert_eq!(step(&mut relay).await, None);
        // A second client closes by itself: `jel_closed`.
        let c2 = client(path);
        let Some(ToBroker::JelOpen { conn: second, .. }) = step(&mut relay).await else {
            panic!("no open");
        };
        assert_ne!(second, conn);
        drop(c2);
        let closed = step(&mut relay).await;
        assert_eq!(closed, Some(ToBroker::JelClosed { conn: second }));
        drop(relay);
        assert!(!dir.path().exists(), "the relay's directory goes with it");
    }

    #[tokio::test]
    async fn a_line_over_the_limit_closes_its_connection() {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = bound(&dir);
        let path = b.socket();
        let mut relay = Relay::start(Some(b));
        let mut c = client(path);
        let Some(ToBroker::JelOpen { conn, .. }) = step(&mut relay).await else {
            panic!("no open");
        };
        let long = vec![b'x'; JEL_RELAY_MAX_LINE + 1];
        let writer = std::thread::spawn(move || {
            let _ = c.write_all(&long);
            let _ = c.write_all(b"\n");
            c
        });
        let closed = step(&mut relay).await;
        assert_eq!(closed, Some(ToBroker::JelClosed { conn }));
        drop(writer.join());
    }

    #[tokio::test]
    async fn the_link_lost_closes_every_connection_on_the_host() {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = bound(&dir);
        let path = b.socket();
        let mut relay = Relay::start(Some(b));
        let c = client(path);
        let Some(ToBroker::JelOpen { conn, .. }) = step(&mut relay).await else {
            panic!("no open");
        };
        relay.close_all();
        let read = tokio::task::spawn_blocking(move || BufReader::new(c).lines().count());
        let n = tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("EOF in time")
            .expect("reader");
        assert_eq!(n, 0, "EOF at once");
        // Lines for it from the agent are dropped: it is no member any more.
        let send = FromBroker::JelSend {
            conn,
            lines: vec!["x\n".into()],
        };
        assert_eq!(relay.from_agent(send), None);
    }
}
