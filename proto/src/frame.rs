//! Framing: one JSON message per `\n`-terminated line, at most [`MAX_FRAME_BYTES`].
//!
//! [`FramedConn`] wraps any async byte stream. A line that is too long, not UTF-8 or not
//! valid JSON for the expected type is an error; callers close the connection on errors.
//!
//! The reader never holds more than the connection's limit: each read asks for at most the
//! room left below `limit + 1` bytes, so a peer streaming a line without end is refused
//! after `limit + 1` bytes, whatever it sends after. Reads and writes are
//! cancel-safe (both are used inside `tokio::select!`): bytes read or not yet written stay
//! in the connection's buffers.

use std::{pin::Pin, task::Poll};

use bytes::BufMut;
use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::MAX_FRAME_BYTES;

/// Most bytes asked of the stream by one read.
const READ_CHUNK: usize = 64 * 1024;

/// What a connection's buffers start at, and shrink back to: a host daemon's report is
/// about a kilobyte, and the broker keeps one connection per host (10k at once); a longer
/// line doubles the read size up to [`READ_CHUNK`].
const SMALL_BUFFER: usize = 4 * 1024;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed by peer")]
    Closed,
    #[error("frame longer than the connection's limit")]
    TooLong,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// A message stream over an async byte stream.
pub struct FramedConn<S> {
    stream: S,
    /// Bytes read and not yet returned as lines.
    lines: LineBuffer,
    /// Encoded frames not yet wholly written.
    wbuf: Vec<u8>,
    /// How much of `wbuf` is written (a send cancelled halfway leaves it above 0).
    wsent: usize,
}

/// Bytes read from a stream and not yet returned as lines, never more than `limit + 1`:
/// [`FramedConn`]'s, and theirs who read a stream another way (the broker's host daemons'
/// sessions read through io_uring, [`FramedConn::into_parts`]).
#[derive(Debug)]
pub struct LineBuffer {
    bytes: Vec<u8>,
    /// How much of `bytes` is known to hold no newline.
    scanned: usize,
    limit: usize,
    /// Set once a line was too long: the rest of the stream is not read.
    refused: bool,
}

impl<S> FramedConn<S> {
    /// The same connection over `f(stream)`, with the bytes read and not yet returned, and
    /// those not yet written: e.g. a socket moved to another runtime (deregistered from one
    /// reactor as a std socket, registered with the other). `f`'s error is returned as is.
    pub fn map_stream<T, E>(self, f: impl FnOnce(S) -> Result<T, E>) -> Result<FramedConn<T>, E> {
        Ok(FramedConn {
            stream: f(self.stream)?,
            lines: self.lines,
            wbuf: self.wbuf,
            wsent: self.wsent,
        })
    }

    /// The stream, and the bytes read from it and not yet returned as lines; `None` while
    /// bytes wait to be written (a send cancelled halfway).
    pub fn into_parts(self) -> Option<(S, LineBuffer)> {
        self.wbuf.is_empty().then_some((self.stream, self.lines))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> FramedConn<S> {
    /// A connection that accepts frames up to [`MAX_FRAME_BYTES`] (what servers use).
    pub fn new(stream: S) -> Self {
        Self::with_limit(stream, MAX_FRAME_BYTES)
    }

    /// A connection that accepts frames up to `max_bytes`: clients of the broker use
    /// [`crate::MAX_RESPONSE_BYTES`], since a status of 10k hosts is several MiB.
    pub fn with_limit(stream: S, max_bytes: usize) -> Self {
        Self {
            stream,
            lines: LineBuffer::new(max_bytes),
            wbuf: Vec::new(),
            wsent: 0,
        }
    }

    /// Reads the next message; `Err(Closed)` at a clean end of stream.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<T, FrameError> {
        let line = self.recv_line().await?;
        decode(&line)
    }

    /// Reads the next raw line (for callers that decode themselves). A last line without
    /// a newline counts as a line at the end of the stream.
    pub async fn recv_line(&mut self) -> Result<String, FrameError> {
        line_text(self.recv_line_bytes().await?)
    }

    /// [`Self::recv_line`] without the UTF-8 check, for a caller that passes the line on
    /// untouched (`rb status --json` piped: megabytes at 10k hosts, checked downstream by
    /// whatever reads the JSON).
    pub async fn recv_line_bytes(&mut self) -> Result<Vec<u8>, FrameError> {
        loop {
            if let Some(line) = self.lines.take_line()? {
                return Ok(line);
            }
            let read = if self.lines.bytes.len() < SMALL_BUFFER {
                self.read_small().await?
            } else {
                let want = self.lines.bytes.len().clamp(SMALL_BUFFER, READ_CHUNK);
                let room = (self.lines.limit + 1 - self.lines.bytes.len()).min(want);
                self.lines.grow_for(room);
                let mut window = (&mut self.lines.bytes).limit(room);
                self.stream.read_buf(&mut window).await?
            };
            if read == 0 {
                return self.lines.take_last_line();
            }
        }
    }

    /// Reads while what is kept of a line is short: into a buffer on the stack of the poll,
    /// keeping only the bytes that came. So a connection waiting for its peer holds no read
    /// buffer, or one the size of a line's start: the broker keeps one connection per host
    /// daemon (10k at once), idle between reports, and a 4 KiB buffer each was 40 MiB of
    /// its heap (heaptrack, issue 34). Longer lines are read in place, in larger chunks.
    async fn read_small(&mut self) -> std::io::Result<usize> {
        let room = (SMALL_BUFFER - self.lines.bytes.len())
            .min(self.lines.limit + 1 - self.lines.bytes.len());
        std::future::poll_fn(|cx| {
            let mut scratch = [std::mem::MaybeUninit::<u8>::uninit(); SMALL_BUFFER];
            let mut window = ReadBuf::uninit(&mut scratch[..room]);
            std::task::ready!(Pin::new(&mut self.stream).poll_read(cx, &mut window))?;
            self.lines.bytes.extend_from_slice(window.filled());
            Poll::Ready(Ok(window.filled().len()))
        })
        .await
    }

    /// Writes one message and flushes it.
    ///
    /// Encoded straight into the write buffer and written from a cursor: a multi-MiB
    /// answer (`rb status` at 10k hosts) was encoded into a string, copied, and the rest
    /// moved to the front after every write (a quarter of the broker's time on it).
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), FrameError> {
        // A send cancelled halfway: what it wrote goes, what it did not goes first.
        self.wbuf.drain(..std::mem::take(&mut self.wsent));
        let start = self.wbuf.len();
        if let Err(e) = serde_json::to_writer(&mut self.wbuf, msg) {
            self.wbuf.truncate(start);
            return Err(FrameError::Malformed(e.to_string()));
        }
        self.write_out().await
    }

    /// Writes one frame its caller encoded and flushes it, as [`Self::send`] does, without
    /// copying it when nothing else waits to be written. The frame is one JSON value as
    /// `serde_json` writes it compactly (never a raw newline; [`status_envelope`]).
    pub async fn send_encoded(&mut self, mut frame: Vec<u8>) -> Result<(), FrameError> {
        debug_assert!(!frame.contains(&b'\n'), "an encoded frame holds no newline");
        self.wbuf.drain(..std::mem::take(&mut self.wsent));
        if self.wbuf.is_empty() {
            self.wbuf = frame;
        } else {
            self.wbuf.append(&mut frame);
        }
        self.write_out().await
    }

    /// Ends the frame at the end of the write buffer and writes the buffer out.
    async fn write_out(&mut self) -> Result<(), FrameError> {
        self.wbuf.push(b'\n');
        while self.wsent < self.wbuf.len() {
            let n = self.stream.write(&self.wbuf[self.wsent..]).await?;
            if n == 0 {
                return Err(FrameError::Io(std::io::ErrorKind::WriteZero.into()));
            }
            self.wsent += n;
        }
        self.wbuf.clear();
        self.wsent = 0;
        if self.wbuf.capacity() > READ_CHUNK {
            self.wbuf.shrink_to(SMALL_BUFFER); // no multi-MiB buffer for the connection's life
        }
        self.stream.flush().await?;
        Ok(())
    }

    /// Splits the connection into a reading half and a writing half, to read and write
    /// at once (a peer that stops reading then blocks only the writer). Bytes already read
    /// stay with the reader, bytes not yet written with the writer.
    pub fn split(self) -> (FrameReader<S>, FrameWriter<S>) {
        let (read, write) = tokio::io::split(self.stream);
        let limit = self.lines.limit;
        let reader = FramedConn {
            stream: tokio::io::join(read, tokio::io::sink()),
            lines: self.lines,
            wbuf: Vec::new(),
            wsent: 0,
        };
        let writer = FramedConn {
            stream: tokio::io::join(tokio::io::empty(), write),
            lines: LineBuffer::new(limit),
            wbuf: self.wbuf,
            wsent: self.wsent,
        };
        (reader, writer)
    }

    /// The underlying stream (e.g. to read peer credentials).
    pub fn get_ref(&self) -> &S {
        &self.stream
    }
}

impl LineBuffer {
    /// An empty buffer for lines up to `limit` bytes.
    pub fn new(limit: usize) -> Self {
        LineBuffer {
            bytes: Vec::new(),
            scanned: 0,
            limit,
            refused: false,
        }
    }

    /// Bytes waiting (the start of a line, or lines not yet taken).
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether no byte waits.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Room for `more` bytes: capacity doubles (amortized, for multi-MiB answers) but never
    /// past `limit + 1`.
    fn grow_for(&mut self, more: usize) {
        let need = self.bytes.len() + more;
        if self.bytes.capacity() < need {
            let target = need.max((2 * self.bytes.capacity()).min(self.limit + 1));
            self.bytes.reserve_exact(target - self.bytes.len());
        }
    }

    /// Adds bytes read; once more than the limit wait without a newline, [`Self::take_line`]
    /// refuses the stream, so a caller stops adding there.
    pub fn push(&mut self, data: &[u8]) {
        if !self.refused {
            self.bytes.extend_from_slice(data);
        }
    }

    /// The next complete line in the buffer, if any; `TooLong` once the buffer exceeds
    /// the limit without a newline.
    pub fn take_line(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        if self.refused {
            return Err(FrameError::TooLong);
        }
        let Some(at) = memchr::memchr(b'\n', &self.bytes[self.scanned..]) else {
            self.scanned = self.bytes.len();
            if self.bytes.len() > self.limit {
                self.refused = true;
                self.bytes = Vec::new();
                return Err(FrameError::TooLong);
            }
            return Ok(None);
        };
        let end = self.scanned + at;
        self.scanned = 0;
        if end > READ_CHUNK {
            // A long line (`rb status` at 10k hosts: megabytes) is taken, not copied; what
            // follows it (usually nothing) starts the next buffer.
            let rest = self.bytes.split_off(end + 1);
            let mut line = std::mem::replace(&mut self.bytes, rest);
            line.truncate(end);
            return Ok(Some(without_cr(line)));
        }
        if end + 1 == self.bytes.len() {
            // The buffer holds this line only (a report read whole): it becomes the line,
            // and an idle connection keeps no buffer (see `read_small`).
            let mut line = std::mem::take(&mut self.bytes);
            line.truncate(end);
            return Ok(Some(without_cr(line)));
        }
        let line = without_cr(self.bytes[..end].to_vec());
        self.bytes.drain(..=end);
        if self.bytes.capacity() > READ_CHUNK && self.bytes.len() < SMALL_BUFFER {
            self.bytes.shrink_to(SMALL_BUFFER);
        }
        Ok(Some(line))
    }

    /// At end of stream: what is left, as a line, or `Closed`.
    pub fn take_last_line(&mut self) -> Result<Vec<u8>, FrameError> {
        if self.bytes.is_empty() {
            return Err(FrameError::Closed);
        }
        let rest = std::mem::take(&mut self.bytes);
        self.scanned = 0;
        Ok(without_cr(rest))
    }
}

/// The reading half of a [`FramedConn::split`] connection (its writes go nowhere).
pub type FrameReader<S> = FramedConn<tokio::io::Join<tokio::io::ReadHalf<S>, tokio::io::Sink>>;

/// The writing half of a [`FramedConn::split`] connection (it reads nothing).
pub type FrameWriter<S> = FramedConn<tokio::io::Join<tokio::io::Empty, tokio::io::WriteHalf<S>>>;

/// A line read as text: `Malformed` when it is not UTF-8.
pub fn line_text(line: Vec<u8>) -> Result<String, FrameError> {
    String::from_utf8(line).map_err(|_| FrameError::Malformed("frame is not UTF-8".into()))
}

/// A line without its `\r` (if any).
fn without_cr(mut line: Vec<u8>) -> Vec<u8> {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    line
}

/// Decodes one frame's text.
pub fn decode<T: DeserializeOwned>(line: &str) -> Result<T, FrameError> {
    serde_json::from_str(line).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Encodes one message as a frame's text (without the newline). Size is the receiver's
/// business: each side enforces its own limit when reading.
pub fn encode<T: Serialize>(msg: &T) -> Result<String, FrameError> {
    serde_json::to_string(msg).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Where the rows of a status response frame to request `id` are in it, as a broker
/// writes it (between [`status_envelope`]'s two parts): to be taken untouched (not parsed: megabytes at 10k hosts); `None` for any other frame, which
/// the caller parses.
pub fn status_rows(line: &[u8], id: u64) -> Option<std::ops::Range<usize>> {
    let (head, tail) = status_envelope(id).ok()?;
    let rows = line
        .strip_prefix(head.as_bytes())?
        .strip_suffix(tail.as_bytes())?;
    (rows.starts_with(b"[") && rows.ends_with(b"]")).then(|| head.len()..head.len() + rows.len())
}

/// What [`encode`] writes before and after the rows of a status response to `id`
/// (`FromBroker::Response { id, resp: Response::Status { hosts } }`): a broker that keeps
/// its rows encoded writes the frame as the first part, the JSON array of the rows, and the
/// second part.
pub fn status_envelope(id: u64) -> Result<(String, String), FrameError> {
    use crate::msg::{FromBroker, Response};
    let empty = encode(&FromBroker::Response {
        id,
        resp: Response::Status { hosts: Vec::new() },
    })?;
    let at = empty
        .rfind("[]")
        .ok_or_else(|| FrameError::Malformed("a status response has its rows".into()))?;
    Ok((empty[..at].to_string(), empty[at + 2..].to_string()))
}

/// How every report frame begins (the tag first, as [`encode`] writes it).
pub(crate) const REPORT_FRAME_START: &str = r#"{"t":"report","#;

/// Decodes one frame from a host daemon. Nearly every frame is a report: one that begins
/// as the encoder writes it is read straight into a [`HostReport`](crate::report::HostReport) (which ignores the tag
/// as an unknown field), not through the tagged enum, which first buffers the whole
/// object to find its tag (a quarter of the broker's CPU at 10k hosts). Anything else,
/// reports spaced otherwise included, is decoded as a [`ToBroker`](crate::msg::ToBroker).
pub fn decode_from_hostd(line: &str) -> Result<crate::msg::ToBroker, FrameError> {
    if line.starts_with(REPORT_FRAME_START) {
        let report: crate::report::HostReport = decode(line)?;
        return Ok(crate::msg::ToBroker::Report(Box::new(report)));
    }
    decode(line)
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::msg::{Request, ToBroker};

    /// A status response built around encoded rows is the frame `encode` writes for the
    /// response, and the client takes the rows back out of it untouched; other frames (and
    /// another request's answer) are left to the parser.
    #[test]
    fn a_status_response_is_spliced_as_encode_writes_it_and_its_rows_taken_back() {
        use crate::msg::{FromBroker, Response};
        let row: crate::report::HostStatus = serde_json::from_str(
            r#"{"name":"n1","address":"10.0.0.1","state":"up","users":[],
            "users_known":true,"labels":["linux"],"daemon_starts":1}"#,
        )
        .expect("a row");
        let rows = serde_json::to_string(&vec![row.clone(), row.clone()]).expect("rows");
        let (head, tail) = status_envelope(9).expect("envelope");
        let frame = format!("{head}{rows}{tail}").into_bytes();
        let whole = FromBroker::Response {
            id: 9,
            resp: Response::Status {
                hosts: vec![row.clone(), row],
            },
        };
        let frame = String::from_utf8(frame).expect("utf-8");
        assert_eq!(frame, encode(&whole).expect("encode"));
        assert_eq!(decode::<FromBroker>(&frame).expect("decode"), whole);
        assert_eq!(
            status_rows(frame.as_bytes(), 9).map(|r| &frame[r]),
            Some(rows.as_str())
        );
        assert_eq!(
            status_rows(frame.as_bytes(), 8),
            None,
            "another request's answer"
        );
        let other = encode(&FromBroker::Response {
            id: 9,
            resp: Response::Ok,
        })
        .expect("encode");
        assert_eq!(status_rows(other.as_bytes(), 9), None);
    }

    /// A connection moved to another stream keeps the lines read and not yet returned
    /// (a daemon's first report may arrive with the handshake's last line).
    #[tokio::test]
    async fn a_connection_moved_to_another_stream_keeps_what_it_read() {
        let (a, mut b) = tokio::io::duplex(1024);
        b.write_all(b"one\ntwo\nthr").await.expect("write");
        let mut conn = FramedConn::new(a);
        assert_eq!(conn.recv_line().await.expect("line"), "one");
        let mut moved = conn
            .map_stream(|a| Ok::<_, std::convert::Infallible>(tokio::io::BufReader::new(a)))
            .expect("moved");
        b.write_all(b"ee\n").await.expect("write");
        assert_eq!(moved.recv_line().await.expect("line"), "two");
        assert_eq!(moved.recv_line().await.expect("line"), "three");
    }

    /// An encoded frame goes out as one line, after what an earlier send left unwritten.
    #[tokio::test]
    async fn an_encoded_frame_is_one_line() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut conn = FramedConn::new(a);
        conn.send_encoded(b"{\"a\":1}".to_vec())
            .await
            .expect("send");
        conn.wbuf.extend_from_slice(b"{\"left\":0}\n");
        conn.send_encoded(b"{\"a\":2}".to_vec())
            .await
            .expect("send");
        drop(conn);
        let mut got = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut b, &mut got)
            .await
            .expect("read");
        assert_eq!(got, "{\"a\":1}\n{\"left\":0}\n{\"a\":2}\n");
    }

    /// A report frame as the daemon writes it takes the direct path and decodes to what
    /// the tagged enum gives; other frames and other spellings decode as before.
    #[test]
    fn a_hostd_frame_decodes_as_the_tagged_enum_does() {
        let report = ToBroker::Report(Box::new(crate::report::HostReport {
            hostname: "node02".into(),
            seq: 7,
            load: Some([0.5, 0.25, 0.0]),
            users: Some(vec![crate::report::UserSession {
                user: "alice".into(),
                tty: "pts/0".into(),
                idle_s: Some(3),
                from: None,
            }]),
            labels: vec!["linux".into()],
            ..crate::report::HostReport::default()
        }));
        let lease = ToBroker::PilotLease {
            slurm_job: "42".into(),
            ending: true,
        };
        for msg in [report, lease] {
            let text = encode(&msg).expect("encode");
            let generic: ToBroker = decode(&text).expect("generic");
            assert_eq!(decode_from_hostd(&text).expect("direct"), generic);
            assert_eq!(generic, msg);
        }
        let text = encode(&ToBroker::Report(Box::default())).expect("encode");
        assert!(text.starts_with(REPORT_FRAME_START), "{text}");
        let spaced = r#"{ "t": "report", "hostname": "n", "seq": 1, "trigger": null, "cpus": null, "load": null, "cpu_util": null, "mem_total_kb": null, "mem_available_kb": null, "os": null, "arch": null, "kernel": null, "users": null, "console_idle_s": null, "managed_procs": null}"#;
        assert!(matches!(decode_from_hostd(spaced), Ok(ToBroker::Report(_))));
        for bad in [r#"{"t":"report","seq":"x"}"#, r#"{"t":"report","#, "{}"] {
            assert!(decode_from_hostd(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn round_trip_over_duplex() {
        let (a, b) = tokio::io::duplex(4096);
        let mut a = FramedConn::new(a);
        let mut b = FramedConn::new(b);
        let msg = ToBroker::Request {
            id: 1,
            req: Request::Status,
        };
        a.send(&msg).await.expect("send");
        let got: ToBroker = b.recv().await.expect("recv");
        assert_eq!(got, msg);
    }

    /// A line longer than a read (taken whole, not copied) and the lines after it in the
    /// same buffer come out as sent, a CR before its newline dropped as for short lines.
    #[tokio::test]
    async fn a_long_line_and_the_short_ones_after_it_come_out_whole() {
        let long = format!("\"{}\"", "x".repeat(3 * READ_CHUNK));
        let (mut a, b) = tokio::io::duplex(8 * READ_CHUNK);
        let mut b = FramedConn::with_limit(b, 4 * READ_CHUNK);
        a.write_all(format!("{long}\r\n\"short\"\n{long}\n").as_bytes())
            .await
            .expect("write");
        drop(a);
        assert_eq!(b.recv_line().await.expect("long"), long);
        assert_eq!(b.recv_line().await.expect("short"), "\"short\"");
        assert_eq!(b.recv_line().await.expect("long again"), long);
        assert!(matches!(b.recv_line().await, Err(FrameError::Closed)));
    }

    /// Between lines a connection keeps no read buffer (10k idle host daemon connections
    /// at the broker), and lines come out whole however the reads cut them: one line a
    /// read, two in one read with the start of a third, the rest of it later, a line
    /// longer than the first read.
    #[tokio::test]
    async fn a_connection_between_lines_keeps_no_read_buffer() {
        let (mut a, b) = tokio::io::duplex(8 * SMALL_BUFFER);
        let mut b = FramedConn::new(b);
        a.write_all(b"\"one\"\n").await.expect("write");
        assert_eq!(b.recv_line().await.expect("one"), "\"one\"");
        assert_eq!(
            b.lines.bytes.capacity(),
            0,
            "a line read whole leaves no buffer"
        );
        a.write_all(b"\"two\"\n\"thr").await.expect("write");
        assert_eq!(b.recv_line().await.expect("two"), "\"two\"");
        assert_eq!(
            b.lines.bytes, b"\"thr",
            "the start of the next line is kept"
        );
        a.write_all(b"ee\"\r\n").await.expect("write");
        assert_eq!(b.recv_line().await.expect("three"), "\"three\"");
        assert_eq!(b.lines.bytes.capacity(), 0);
        let long = format!("\"{}\"", "x".repeat(3 * SMALL_BUFFER));
        a.write_all(format!("{long}\n").as_bytes())
            .await
            .expect("write");
        assert_eq!(b.recv_line().await.expect("long"), long);
        assert_eq!(b.lines.bytes.capacity(), 0);
        drop(a);
        assert!(matches!(b.recv_line().await, Err(FrameError::Closed)));
    }

    /// A send cancelled halfway (the peer not reading) leaves the rest of its frame to go
    /// first: the next send completes it, and both frames arrive whole, in order, however
    /// the writes were cut.
    #[tokio::test]
    async fn a_send_cancelled_halfway_is_completed_by_the_next() {
        let (a, b) = tokio::io::duplex(1000);
        let mut a = FramedConn::new(a);
        let mut b = FramedConn::new(b);
        let big = ToBroker::Request {
            id: 1,
            req: Request::UserAdd {
                name: "x".repeat(5000),
                out: None,
            },
        };
        let cut = tokio::time::timeout(std::time::Duration::from_millis(50), a.send(&big));
        assert!(cut.await.is_err(), "blocked with the pipe full");
        let small = ToBroker::Request {
            id: 2,
            req: Request::Status,
        };
        let reader = tokio::spawn(async move {
            let first: ToBroker = b.recv().await.expect("first");
            let second: ToBroker = b.recv().await.expect("second");
            (first, second)
        });
        a.send(&small).await.expect("send");
        assert_eq!(reader.await.expect("reader"), (big, small));
    }

    #[tokio::test]
    async fn garbage_is_malformed_not_panic() {
        let (mut a, b) = tokio::io::duplex(4096);
        let mut b = FramedConn::new(b);
        a.write_all(b"\x00\x01garbage{\n").await.expect("write");
        let got = b.recv::<ToBroker>().await;
        assert!(matches!(got, Err(FrameError::Malformed(_))), "{got:?}");
    }

    #[tokio::test]
    async fn overlong_frame_is_rejected() {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        let mut b = FramedConn::new(b);
        tokio::spawn(async move {
            let chunk = vec![b'x'; 1 << 16];
            for _ in 0..20 {
                if a.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        });
        let got = b.recv::<ToBroker>().await;
        assert!(matches!(got, Err(FrameError::TooLong)), "{got:?}");
    }

    #[tokio::test]
    async fn eof_is_closed() {
        let (a, b) = tokio::io::duplex(64);
        drop(a);
        let mut b = FramedConn::new(b);
        assert!(matches!(
            b.recv::<ToBroker>().await,
            Err(FrameError::Closed)
        ));
    }

    /// An endless line: yields `x` forever and counts what the connection pulled.
    struct Endless(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl tokio::io::AsyncRead for Endless {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = buf.remaining();
            buf.put_slice(&vec![b'x'; n]);
            self.0.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// A peer streaming a line without end is refused after at most `limit + 1`
    /// bytes; the connection never reads (so never holds) more than its limit.
    #[tokio::test]
    async fn an_endless_line_is_refused_without_reading_past_the_limit() {
        for limit in [1000, crate::MAX_FRAME_BYTES] {
            let pulled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let stream = tokio::io::join(Endless(pulled.clone()), tokio::io::sink());
            let mut conn = FramedConn::with_limit(stream, limit);
            let got = conn.recv::<ToBroker>().await;
            assert!(matches!(got, Err(FrameError::TooLong)), "{got:?}");
            let pulled = pulled.load(std::sync::atomic::Ordering::Relaxed);
            assert!(
                pulled <= limit + 1,
                "read {pulled} bytes for a limit of {limit}"
            );
        }
    }

    #[tokio::test]
    async fn lines_in_one_write_crlf_and_an_unterminated_last_line_are_frames() {
        let (mut a, b) = tokio::io::duplex(4096);
        let mut b = FramedConn::new(b);
        a.write_all(b"one\r\ntwo\nthree").await.expect("write");
        drop(a);
        for want in ["one", "two", "three"] {
            assert_eq!(b.recv_line().await.expect("line"), want);
        }
        assert!(matches!(b.recv_line().await, Err(FrameError::Closed)));
    }

    /// `recv` is used inside `tokio::select!`: a read cancelled halfway loses nothing.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_recv_keeps_the_partial_line() {
        let (mut a, b) = tokio::io::duplex(4096);
        let mut b = FramedConn::new(b);
        a.write_all(b"{\"t\":\"heart").await.expect("write");
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(20), b.recv::<ToBroker>()).await;
        assert!(waited.is_err(), "no full line yet: {waited:?}");
        a.write_all(b"beat\"}\n").await.expect("write");
        assert_eq!(
            b.recv::<ToBroker>().await.expect("recv"),
            ToBroker::Heartbeat
        );
    }
}
