//! The listening socket and the readers: a connection is taken only from a peer of our own
//! uid (SO_PEERCRED), gets the next [`ConnId`], and one task reads its lines (each bounded
//! in length) into the pool task's channel until EOF, an error or an over-long line.

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
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
};
use tracing::warn;

use super::Msg;
use crate::pool::ConnId;

/// What the accept task needs.
pub(super) struct Acceptor {
    pub tx: mpsc::Sender<Msg>,
    pub next_conn: Arc<AtomicU64>,
    /// The lab name of this host.
    pub host: String,
    pub max_line: usize,
}

/// Accepts connections until the pool task is gone, this task is aborted, or `stop` fires.
/// At `stop` the socket file goes first (a later `connect` fails: no pool), then every
/// connection already queued on the listener is handed over: a client that connected
/// before the end is served through `terminated` instead of being reset.
pub(super) async fn accept(
    listener: UnixListener,
    a: Acceptor,
    mut stop: oneshot::Receiver<()>,
    socket: PathBuf,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stop => return take_queued(listener, &a, &socket).await,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: back off instead of spinning.
                warn!(error = %e, "JEL socket: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if !admit(stream, &a).await {
            return;
        }
    }
}

/// Removes the socket file, then hands over the connections queued on the listener.
async fn take_queued(listener: UnixListener, a: &Acceptor, socket: &Path) {
    let _ = std::fs::remove_file(socket); // may be gone already
    let Ok(listener) = listener.into_std() else {
        return;
    };
    // Non-blocking (into_std keeps it so): WouldBlock once the queue is empty.
    while let Ok((stream, _)) = listener.accept() {
        let stream = stream
            .set_nonblocking(true)
            .and_then(|()| UnixStream::from_std(stream));
        match stream {
            Ok(stream) => {
                if !admit(stream, a).await {
                    return;
                }
            }
            Err(e) => warn!(error = %e, "JEL socket: a queued connection could not be taken"),
        }
    }
}

/// Takes a connection from a peer of our own uid: tells the pool task and starts its
/// reader. False once the pool task is gone.
async fn admit(stream: UnixStream, a: &Acceptor) -> bool {
    let euid = nix::unistd::geteuid().as_raw();
    let uid = proto::peercred::peer_uid(&stream);
    if uid != Some(euid) {
        warn!(peer_uid = ?uid, "JEL socket: refused a connection from another user");
        return true;
    }
    let pid = proto::peercred::peer_pid(&stream).and_then(|p| u32::try_from(p).ok());
    let conn = a.next_conn.fetch_add(1, Ordering::Relaxed);
    let stream = Arc::new(stream);
    let opened = Msg::Opened {
        conn,
        host: a.host.clone(),
        pid,
        stream: Some(Arc::clone(&stream)),
    };
    if a.tx.send(opened).await.is_err() {
        return false;
    }
    tokio::spawn(read_lines(conn, stream, a.tx.clone(), a.max_line));
    true
}

/// Reads `conn`'s lines and hands them over, as many as one read brings in one message;
/// then reports the close.
async fn read_lines(conn: ConnId, stream: Arc<UnixStream>, tx: mpsc::Sender<Msg>, max: usize) {
    let mut reader = LineReader::new(max);
    // Small: one per connection (thousands), and requests are short lines.
    let mut chunk = vec![0u8; 4 * 1024];
    loop {
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
            Ok(lines) if lines.is_empty() => {}
            Ok(lines) => {
                if tx.send(Msg::Lines { conn, lines }).await.is_err() {
                    return;
                }
            }
            Err(TooLong(len)) => {
                warn!(conn, len, max, "JEL socket: a line over the limit; closing");
                break;
            }
        }
    }
    let _ = tx.send(Msg::Closed { conn }).await; // the pool task may be gone: nothing to tell
}

/// A line longer than allowed (at least this many bytes).
#[derive(Debug, PartialEq, Eq)]
pub struct TooLong(pub usize);

/// Splits a byte stream into lines of at most `max` bytes (newline excluded).
#[derive(Debug)]
pub struct LineReader {
    buf: Vec<u8>,
    max: usize,
}

impl LineReader {
    pub fn new(max: usize) -> Self {
        LineReader {
            buf: Vec::new(),
            max,
        }
    }

    /// Takes `bytes`; returns the lines they complete (not valid UTF-8: replaced, the pool
    /// then refuses the request).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, TooLong> {
        self.buf.extend_from_slice(bytes);
        let mut lines = Vec::new();
        let mut start = 0;
        while let Some(end) = self.buf[start..].iter().position(|b| *b == b'\n') {
            let line = &self.buf[start..start + end];
            if line.len() > self.max {
                return Err(TooLong(line.len()));
            }
            lines.push(String::from_utf8_lossy(line).into_owned());
            start += end + 1;
        }
        self.buf.drain(..start);
        if self.buf.len() > self.max {
            return Err(TooLong(self.buf.len()));
        }
        Ok(lines)
    }
}
