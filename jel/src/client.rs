//! The blocking Rust client: connects to the job's pool at `$RB_JEL` (a Unix socket served
//! by the job's agent or subagent, checked to run as our uid), says hello, and then either
//! makes requests ([`Client`]), acts as a member ([`Member`]) or reads the stream
//! ([`Watcher`], which resumes by seq when the pool cuts it off).
//!
//! ```no_run
//! let mut me = jel::Client::connect()?.join(Some("worker"))?;
//! let master = me.elect("master")?;
//! println!("master: {:?} (epoch {})", master.winner.map(|m| m.label()), master.epoch);
//! let mut events = me.watch(1)?;
//! while let Ok(event) = events.next_event() {
//!     println!("{} {:?}", event.seq, event.kind);
//! }
//! # Ok::<(), jel::JelError>(())
//! ```

use std::{
    io::{self, BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
};

use serde::Serialize;

use crate::wire::{
    to_line, Event, EventKind, Hello, Member as MemberInfo, MemberId, MemberRow, Reply, Request,
    VERSION,
};

/// The environment variable naming the pool's socket, set in every process of a job.
pub const ENV_JEL: &str = "RB_JEL";

/// Everything a client call can fail with. [`JelError::exit_code`] is what a command-line
/// client exits with.
#[derive(Debug, thiserror::Error)]
pub enum JelError {
    #[error("not inside a ResourceBroker job ({ENV_JEL} is not set)\nhelp: JEL serves the processes of a job: run the program under the agent (`agent PROGRAM ARGS…`), or from a process of a job")]
    NotInJob,
    #[error("cannot connect to the job's pool at {path}: {source}\nhelp: is the job still running? {ENV_JEL} is set by the job's agent and is valid while the job runs")]
    Connect { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Peer(#[from] proto::peercred::PeerError),
    #[error("lost the connection to the job's pool at {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("the job's pool at {path} closed the connection\nhelp: the job may have ended")]
    Closed { path: PathBuf },
    #[error("the job's pool at {path} sent `{line}`, which this client cannot read: {reason}\nhelp: use a JEL client of the same ResourceBroker version as the job's agent")]
    Protocol {
        path: PathBuf,
        line: String,
        reason: String,
    },
    #[error("the pool refused `{op}`: {error}\nhelp: {help}")]
    Refused {
        op: String,
        error: String,
        help: String,
    },
}

impl JelError {
    /// 2 outside a job, 1 for a refused request, 77 for a socket served by someone else, 69
    /// (unavailable) when the pool cannot be reached or talked to.
    pub fn exit_code(&self) -> i32 {
        match self {
            JelError::NotInJob => 2,
            JelError::Refused { .. } => 1,
            JelError::Peer(_) => 77,
            _ => 69,
        }
    }
}

/// The pool's socket from the environment.
pub fn socket_path() -> Result<PathBuf, JelError> {
    match std::env::var_os(ENV_JEL) {
        Some(path) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ => Err(JelError::NotInJob),
    }
}

/// How many ancestors [`find_socket`] looks at, at most.
const MAX_ANCESTORS: usize = 16;

/// The pool's socket: `$RB_JEL`, or else the nearest ancestor's (`/proc/PID/environ`, as it
/// was started): a process of a job that cleaned its environment is still in its job, as
/// the `rsh` shim finds its agent. [`JelError::NotInJob`] when neither names one.
pub fn find_socket() -> Result<PathBuf, JelError> {
    socket_path().or_else(|_| from_ancestry(std::os::unix::process::parent_id()))
}

fn from_ancestry(mut pid: u32) -> Result<PathBuf, JelError> {
    for _ in 0..MAX_ANCESTORS {
        if pid <= 1 {
            break;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if let Some(path) = var_in_environ(&environ, ENV_JEL) {
            return Ok(path);
        }
        match parent_of(pid) {
            Some(parent) => pid = parent,
            None => break,
        }
    }
    Err(JelError::NotInJob)
}

/// A non-empty variable of a `/proc/PID/environ` (NUL-separated `NAME=VALUE`).
pub fn var_in_environ(environ: &[u8], name: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(name.as_bytes())?.strip_prefix(b"="))
        .filter(|value| !value.is_empty())
        .map(|value| PathBuf::from(std::ffi::OsStr::from_bytes(value)))
}

/// The parent of `pid`, from `/proc/PID/stat` (the field after the state).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// One connection after the hello.
#[derive(Debug)]
struct Conn {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    consistency: String,
}

impl Conn {
    fn open(path: &Path) -> Result<Conn, JelError> {
        let connect_error = |source| JelError::Connect {
            path: path.to_path_buf(),
            source,
        };
        let stream = UnixStream::connect(path).map_err(connect_error)?;
        proto::peercred::check_server(&stream, path, "job's agent")?;
        let writer = stream.try_clone().map_err(connect_error)?;
        let mut conn = Conn {
            path: path.to_path_buf(),
            reader: BufReader::new(stream),
            writer,
            consistency: String::new(),
        };
        conn.write(&Hello {
            jel: VERSION,
            consistency: None,
        })?;
        let line = conn.read_line()?;
        conn.consistency = decode_hello(&conn.path, line)?;
        Ok(conn)
    }

    fn io_error(&self, source: io::Error) -> JelError {
        JelError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn write<T: Serialize>(&mut self, value: &T) -> Result<(), JelError> {
        let line = to_line(value);
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| self.io_error(e))
    }

    fn read_line(&mut self) -> Result<String, JelError> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(JelError::Closed {
                path: self.path.clone(),
            }),
            Ok(_) => Ok(line),
            Err(e) => Err(self.io_error(e)),
        }
    }

    fn request(&mut self, request: &Request) -> Result<Reply, JelError> {
        self.write(request)?;
        let line = self.read_line()?;
        decode_reply(&self.path, line)
    }

    fn unexpected(&self, reply: Reply) -> JelError {
        unexpected(&self.path, reply)
    }
}

/// The server's hello line: the pool's consistency, or why it refused us.
pub(crate) fn decode_hello(path: &Path, line: String) -> Result<String, JelError> {
    match serde_json::from_str::<Hello>(&line) {
        Ok(hello) => Ok(hello.consistency.unwrap_or_default()),
        Err(e) => Err(refusal_or(path, line, e.to_string())),
    }
}

/// A reply line: the reply, or the pool's refusal as [`JelError::Refused`].
pub(crate) fn decode_reply(path: &Path, line: String) -> Result<Reply, JelError> {
    match serde_json::from_str::<Reply>(&line) {
        Ok(Reply::Error { op, error, help }) => Err(JelError::Refused { op, error, help }),
        Ok(reply) => Ok(reply),
        Err(e) => Err(refusal_or(path, line, e.to_string())),
    }
}

/// An event line of a watch connection.
pub(crate) fn decode_event(path: &Path, line: String) -> Result<Event, JelError> {
    serde_json::from_str(&line).map_err(|e| JelError::Protocol {
        path: path.to_path_buf(),
        line: line.trim_end().to_string(),
        reason: e.to_string(),
    })
}

/// A line that is not what we expected: the pool's error reply, or a protocol error.
fn refusal_or(path: &Path, line: String, reason: String) -> JelError {
    match serde_json::from_str::<Reply>(&line) {
        Ok(Reply::Error { op, error, help }) => JelError::Refused { op, error, help },
        _ => JelError::Protocol {
            path: path.to_path_buf(),
            line: line.trim_end().to_string(),
            reason,
        },
    }
}

/// A reply of another kind than the request calls for.
pub(crate) fn unexpected(path: &Path, reply: Reply) -> JelError {
    JelError::Protocol {
        path: path.to_path_buf(),
        line: to_line(&reply).trim_end().to_string(),
        reason: "not the reply to the request sent".into(),
    }
}

/// The winner of an election (if any) and its epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Election {
    pub name: String,
    pub winner: Option<MemberInfo>,
    pub epoch: u64,
}

/// A connection to the pool that is not a member (yet).
#[derive(Debug)]
pub struct Client {
    conn: Conn,
}

impl Client {
    /// Connects to the pool at `$RB_JEL`.
    pub fn connect() -> Result<Client, JelError> {
        Client::connect_to(&socket_path()?)
    }

    /// Connects to the pool at `path`.
    pub fn connect_to(path: &Path) -> Result<Client, JelError> {
        Ok(Client {
            conn: Conn::open(path)?,
        })
    }

    /// The pool's consistency as its hello states it (`reliable,uniform`…).
    pub fn consistency(&self) -> &str {
        &self.conn.consistency
    }

    /// Joins the pool: this connection becomes the member's (closing it without
    /// [`Member::leave`] is reported as `died{exited}`). `pid` defaults to ours.
    pub fn join(self, name: Option<&str>) -> Result<Member, JelError> {
        self.join_as(name, None)
    }

    /// Joins on behalf of process `pid` (as `rb-jel join -- CMD` does for CMD).
    pub fn join_as(mut self, name: Option<&str>, pid: Option<u32>) -> Result<Member, JelError> {
        let request = Request::Join {
            name: name.map(str::to_string),
            pid,
        };
        match self.conn.request(&request)? {
            Reply::Join { member, seq } => Ok(Member {
                conn: self.conn,
                info: member,
                seq,
            }),
            other => Err(self.conn.unexpected(other)),
        }
    }

    /// The current members, and the seq they are current at.
    pub fn members(&mut self) -> Result<(u64, Vec<MemberRow>), JelError> {
        members(&mut self.conn)
    }

    /// The winner of election `name`, if any.
    pub fn result(&mut self, name: &str) -> Result<Election, JelError> {
        result(&mut self.conn, name)
    }

    /// Turns this connection into a stream of the events with `seq >= from`.
    pub fn watch(self, from: u64) -> Result<Watcher, JelError> {
        Watcher::start(self.conn, from)
    }

    /// One request as it is, and its reply (a refusal as [`JelError::Refused`]): for a
    /// relay such as `rb-jel join`'s, which passes its CMD's requests on.
    pub fn request(&mut self, request: &Request) -> Result<Reply, JelError> {
        self.conn.request(request)
    }
}

fn members(conn: &mut Conn) -> Result<(u64, Vec<MemberRow>), JelError> {
    match conn.request(&Request::Members)? {
        Reply::Members { seq, members } => Ok((seq, members)),
        other => Err(conn.unexpected(other)),
    }
}

fn result(conn: &mut Conn, name: &str) -> Result<Election, JelError> {
    let request = Request::Result { name: name.into() };
    match conn.request(&request)? {
        Reply::Result {
            name,
            winner,
            epoch,
        } => Ok(Election {
            name,
            winner,
            epoch,
        }),
        other => Err(conn.unexpected(other)),
    }
}

/// A member of the pool, for as long as this value (its connection) lives.
#[derive(Debug)]
pub struct Member {
    conn: Conn,
    info: MemberInfo,
    seq: u64,
}

impl Member {
    pub fn id(&self) -> MemberId {
        self.info.id
    }

    /// Who we are in the pool (id, name, host, pid).
    pub fn info(&self) -> &MemberInfo {
        &self.info
    }

    /// The seq of our `joined` event.
    pub fn joined_seq(&self) -> u64 {
        self.seq
    }

    /// Stands as a candidate in election `name`; the winner (us when nobody won before).
    pub fn elect(&mut self, name: &str) -> Result<Election, JelError> {
        let request = Request::Elect { name: name.into() };
        match self.conn.request(&request)? {
            Reply::Elect {
                name,
                winner,
                epoch,
            } => Ok(Election {
                name,
                winner,
                epoch,
            }),
            other => Err(self.conn.unexpected(other)),
        }
    }

    /// The winner of election `name`, if any.
    pub fn result(&mut self, name: &str) -> Result<Election, JelError> {
        result(&mut self.conn, name)
    }

    pub fn members(&mut self) -> Result<(u64, Vec<MemberRow>), JelError> {
        members(&mut self.conn)
    }

    /// Signals `name` with `payload` to the members `to` (every member when empty); returns
    /// the signal event's seq.
    pub fn signal(
        &mut self,
        name: &str,
        to: &[MemberId],
        payload: serde_json::Value,
    ) -> Result<u64, JelError> {
        let request = Request::Signal {
            name: name.into(),
            to: to.to_vec(),
            payload,
        };
        match self.conn.request(&request)? {
            Reply::Signal { seq } => Ok(seq),
            other => Err(self.conn.unexpected(other)),
        }
    }

    /// One request as it is, on the member's connection, and its reply (a refusal as
    /// [`JelError::Refused`]): `rb-jel join` relays its CMD's requests this way.
    pub fn request(&mut self, request: &Request) -> Result<Reply, JelError> {
        self.conn.request(request)
    }

    /// Leaves the pool (`left`); returns the seq of that event.
    pub fn leave(mut self) -> Result<u64, JelError> {
        match self.conn.request(&Request::Leave)? {
            Reply::Leave { seq } => Ok(seq),
            other => Err(self.conn.unexpected(other)),
        }
    }

    /// Watches the stream from `from` on a connection of its own.
    pub fn watch(&self, from: u64) -> Result<Watcher, JelError> {
        Watcher::start(Conn::open(&self.conn.path)?, from)
    }
}

/// The pool's stream, from some seq on. If the pool cuts the connection (a slow reader), the
/// next [`Watcher::next_event`] reconnects and resumes at the next seq, once per cut.
#[derive(Debug)]
pub struct Watcher {
    conn: Conn,
    /// The seq of the next event we expect.
    next: u64,
    terminated: bool,
}

impl Watcher {
    fn start(mut conn: Conn, from: u64) -> Result<Watcher, JelError> {
        let from = from.max(1);
        match conn.request(&Request::Watch { from: Some(from) })? {
            Reply::Watch { .. } => Ok(Watcher {
                conn,
                next: from,
                terminated: false,
            }),
            other => Err(conn.unexpected(other)),
        }
    }

    /// The seq of the next event expected (resuming starts there).
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Whether a whole line is read already: [`Watcher::next_event`] will not wait for the
    /// connection (else wait on [`std::os::fd::AsFd::as_fd`] to know when it will not).
    pub fn has_buffered_line(&self) -> bool {
        self.conn.reader.buffer().contains(&b'\n')
    }

    /// The next event, waiting for it; after a snapshot the stream goes on at its seq + 1.
    pub fn next_event(&mut self) -> Result<Event, JelError> {
        let line = match self.conn.read_line() {
            Err(JelError::Closed { .. } | JelError::Io { .. }) if !self.terminated => {
                self.resume()?;
                self.conn.read_line()?
            }
            other => other?,
        };
        let event = decode_event(&self.conn.path, line)?;
        self.next = event.seq + 1;
        self.terminated |= event.kind == EventKind::Terminated;
        Ok(event)
    }

    /// Reconnects and resumes at [`Watcher::next_seq`].
    pub fn resume(&mut self) -> Result<(), JelError> {
        let conn = Conn::open(&self.conn.path)?;
        *self = Watcher::start(conn, self.next)?;
        Ok(())
    }
}

impl std::os::fd::AsFd for Watcher {
    /// The connection, to wait on beside other descriptors (`poll`).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.conn.reader.get_ref().as_fd()
    }
}

impl Iterator for Watcher {
    type Item = Result<Event, JelError>;

    /// Events until the stream ends (`terminated`, or the pool is gone).
    fn next(&mut self) -> Option<Self::Item> {
        if self.terminated {
            return None;
        }
        Some(self.next_event())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_read_from_an_environ_block() {
        let environ = b"HOME=/root\0RB_JEL_MEMBER=/x.member-1\0RB_JEL=/run/job/jel.sock\0";
        assert_eq!(
            var_in_environ(environ, ENV_JEL),
            Some(PathBuf::from("/run/job/jel.sock"))
        );
        assert_eq!(
            var_in_environ(b"RB_JEL=\0", ENV_JEL),
            None,
            "empty is unset"
        );
        assert_eq!(var_in_environ(b"", ENV_JEL), None);
    }

    #[test]
    fn our_own_parent_is_read_from_proc() {
        assert_eq!(
            parent_of(std::process::id()),
            Some(std::os::unix::process::parent_id())
        );
    }
}
