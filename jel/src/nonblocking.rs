//! The async (tokio) client, behind the `tokio` feature: the same calls as [`crate::client`],
//! awaited. Lines are decoded by the same functions, so both clients read the protocol alike.

use std::path::{Path, PathBuf};

use serde::Serialize;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{
        unix::{OwnedReadHalf, OwnedWriteHalf},
        UnixStream,
    },
};

use crate::{
    client::{
        decode_event, decode_hello, decode_reply, socket_path, unexpected, Election, JelError,
    },
    wire::{
        to_line, Event, EventKind, Hello, Member as MemberInfo, MemberId, MemberRow, Reply,
        Request, VERSION,
    },
};

#[derive(Debug)]
struct Conn {
    path: PathBuf,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Conn {
    async fn open(path: &Path) -> Result<Conn, JelError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| JelError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        proto::peercred::check_server(&stream, path, "job's agent")?;
        let (read, writer) = stream.into_split();
        let mut conn = Conn {
            path: path.to_path_buf(),
            reader: BufReader::new(read),
            writer,
        };
        let hello = Hello {
            jel: VERSION,
            consistency: None,
        };
        conn.write(&hello).await?;
        let line = conn.read_line().await?;
        decode_hello(path, line)?;
        Ok(conn)
    }

    async fn write<T: Serialize>(&mut self, value: &T) -> Result<(), JelError> {
        let line = to_line(value);
        self.writer
            .write_all(line.as_bytes())
            .await
            .map_err(|source| JelError::Io {
                path: self.path.clone(),
                source,
            })
    }

    async fn read_line(&mut self) -> Result<String, JelError> {
        let mut line = String::new();
        match self.reader.read_line(&mut line).await {
            Ok(0) => Err(JelError::Closed {
                path: self.path.clone(),
            }),
            Ok(_) => Ok(line),
            Err(source) => Err(JelError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }

    async fn request(&mut self, request: &Request) -> Result<Reply, JelError> {
        self.write(request).await?;
        let line = self.read_line().await?;
        decode_reply(&self.path, line)
    }

    async fn election(&mut self, request: Request) -> Result<Election, JelError> {
        match self.request(&request).await? {
            Reply::Elect {
                name,
                winner,
                epoch,
            }
            | Reply::Result {
                name,
                winner,
                epoch,
            } => Ok(Election {
                name,
                winner,
                epoch,
            }),
            other => Err(unexpected(&self.path, other)),
        }
    }

    async fn members(&mut self) -> Result<(u64, Vec<MemberRow>), JelError> {
        match self.request(&Request::Members).await? {
            Reply::Members { seq, members } => Ok((seq, members)),
            other => Err(unexpected(&self.path, other)),
        }
    }
}

/// A connection to the pool that is not a member (yet).
#[derive(Debug)]
pub struct AsyncClient {
    conn: Conn,
}

impl AsyncClient {
    /// Connects to the pool at `$RB_JEL`.
    pub async fn connect() -> Result<AsyncClient, JelError> {
        AsyncClient::connect_to(&socket_path()?).await
    }

    pub async fn connect_to(path: &Path) -> Result<AsyncClient, JelError> {
        Ok(AsyncClient {
            conn: Conn::open(path).await?,
        })
    }

    /// Joins; the connection becomes the member's (see [`crate::Client::join`]).
    pub async fn join(mut self, name: Option<&str>) -> Result<AsyncMember, JelError> {
        let request = Request::Join {
            name: name.map(str::to_string),
            pid: None,
        };
        match self.conn.request(&request).await? {
            Reply::Join { member, .. } => Ok(AsyncMember {
                conn: self.conn,
                info: member,
            }),
            other => Err(unexpected(&self.conn.path, other)),
        }
    }

    pub async fn members(&mut self) -> Result<(u64, Vec<MemberRow>), JelError> {
        self.conn.members().await
    }

    pub async fn result(&mut self, name: &str) -> Result<Election, JelError> {
        let name = name.to_string();
        self.conn.election(Request::Result { name }).await
    }

    pub async fn watch(self, from: u64) -> Result<AsyncWatcher, JelError> {
        AsyncWatcher::start(self.conn, from).await
    }
}

/// A member of the pool, for as long as this value (its connection) lives.
#[derive(Debug)]
pub struct AsyncMember {
    conn: Conn,
    info: MemberInfo,
}

impl AsyncMember {
    pub fn id(&self) -> MemberId {
        self.info.id
    }

    pub fn info(&self) -> &MemberInfo {
        &self.info
    }

    pub async fn elect(&mut self, name: &str) -> Result<Election, JelError> {
        let name = name.to_string();
        self.conn.election(Request::Elect { name }).await
    }

    pub async fn result(&mut self, name: &str) -> Result<Election, JelError> {
        let name = name.to_string();
        self.conn.election(Request::Result { name }).await
    }

    pub async fn members(&mut self) -> Result<(u64, Vec<MemberRow>), JelError> {
        self.conn.members().await
    }

    pub async fn signal(
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
        match self.conn.request(&request).await? {
            Reply::Signal { seq } => Ok(seq),
            other => Err(unexpected(&self.conn.path, other)),
        }
    }

    pub async fn leave(mut self) -> Result<u64, JelError> {
        match self.conn.request(&Request::Leave).await? {
            Reply::Leave { seq } => Ok(seq),
            other => Err(unexpected(&self.conn.path, other)),
        }
    }

    /// Watches the stream from `from` on a connection of its own.
    pub async fn watch(&self, from: u64) -> Result<AsyncWatcher, JelError> {
        AsyncWatcher::start(Conn::open(&self.conn.path).await?, from).await
    }
}

/// The pool's stream; resumes by seq when cut off (see [`crate::Watcher`]).
#[derive(Debug)]
pub struct AsyncWatcher {
    conn: Conn,
    next: u64,
    terminated: bool,
}

impl AsyncWatcher {
    async fn start(mut conn: Conn, from: u64) -> Result<AsyncWatcher, JelError> {
        let from = from.max(1);
        match conn.request(&Request::Watch { from: Some(from) }).await? {
            Reply::Watch { .. } => Ok(AsyncWatcher {
                conn,
                next: from,
                terminated: false,
            }),
            other => Err(unexpected(&conn.path, other)),
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.next
    }

    pub async fn next_event(&mut self) -> Result<Event, JelError> {
        let line = match self.conn.read_line().await {
            Err(JelError::Closed { .. } | JelError::Io { .. }) if !self.terminated => {
                self.resume().await?;
                self.conn.read_line().await?
            }
            other => other?,
        };
        let event = decode_event(&self.conn.path, line)?;
        self.next = event.seq + 1;
        self.terminated |= event.kind == EventKind::Terminated;
        Ok(event)
    }

    pub async fn resume(&mut self) -> Result<(), JelError> {
        let conn = Conn::open(&self.conn.path).await?;
        *self = AsyncWatcher::start(conn, self.next).await?;
        Ok(())
    }
}
