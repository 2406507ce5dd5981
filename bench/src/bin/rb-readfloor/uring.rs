//! `rb-readfloor --uring`: the same reading through io_uring instead of epoll, as the
//! broker's host daemons' thread reads where the kernel allows it ([`ringrecv`]): one
//! multishot receive armed on each connection, in a ring set up with `DEFER_TASKRUN`, and
//! once a turn ([`TURN`]) one `io_uring_enter` that receives whatever arrived on every
//! connection since the last. Lines are then cut and (with `--parse`) decoded per
//! connection as the broker's sessions do.
//!
//! Not the broker's: a measurement of its reading alone (BENCHMARKS.md, "Reading the
//! reports through io_uring").

use std::{
    io,
    os::fd::OwnedFd,
    sync::mpsc::{self, Receiver, Sender},
};

use proto::repeats::HostdFrames;
use ringrecv::{Next, Received, Ring, Token};

use crate::TURN;

/// One connection: the start of a line that has not ended yet, and its decoder.
#[derive(Default)]
struct Conn {
    partial: Vec<u8>,
    frames: HostdFrames,
}

/// Starts the thread that reads, in turns, every connection sent on the channel returned,
/// until the process is killed; an error when io_uring cannot be used here.
pub fn start(parse: bool) -> io::Result<Sender<OwnedFd>> {
    let (fds, taken) = mpsc::channel();
    let (ready, set_up) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("readers".into())
        .spawn(move || {
            let reader = Reader::new(parse);
            let failed = reader
                .as_ref()
                .err()
                .map(|e| io::Error::new(e.kind(), e.to_string()));
            let _ = ready.send(failed);
            if let Ok(reader) = reader {
                if let Err(e) = reader.run(&taken) {
                    eprintln!("rb-readfloor: reading through io_uring failed: {e}");
                    std::process::exit(3);
                }
            }
        })?;
    match set_up.recv() {
        Ok(None) => Ok(fds),
        Ok(Some(e)) => Err(e),
        Err(_) => Err(io::Error::other("the io_uring thread ended")),
    }
}

/// The connections read through one io_uring, on the thread that made it.
struct Reader {
    ring: Ring,
    /// By [`Token::index`].
    conns: Vec<Option<(Token, Conn)>>,
    parse: bool,
    /// Lines read so far, on every connection.
    lines: u64,
}

impl Reader {
    fn new(parse: bool) -> io::Result<Self> {
        Ok(Reader {
            ring: Ring::new()?,
            conns: Vec::new(),
            parse,
            lines: 0,
        })
    }

    /// Reads every connection sent on `fds`, a turn at a time, until an error.
    fn run(mut self, fds: &Receiver<OwnedFd>) -> io::Result<()> {
        loop {
            for fd in fds.try_iter() {
                self.add(fd)?;
            }
            self.turn()?;
            std::thread::sleep(TURN);
        }
    }

    /// Reads `fd` from the next turn on.
    fn add(&mut self, fd: OwnedFd) -> io::Result<()> {
        let token = self.ring.add(fd)?;
        if self.conns.len() <= token.index() {
            self.conns.resize_with(token.index() + 1, || None);
        }
        self.conns[token.index()] = Some((token, Conn::default()));
        Ok(())
    }

    /// One turn: everything that arrived since the last, received in one system call, cut
    /// into lines (and decoded).
    fn turn(&mut self) -> io::Result<()> {
        let (conns, lines, parse) = (&mut self.conns, &mut self.lines, self.parse);
        self.ring.turn(|token, received| {
            let Some(slot) = conns.get_mut(token.index()) else {
                return Next::Close;
            };
            match (received, slot.as_mut().filter(|(t, _)| *t == token)) {
                (Received::Data(data), Some((_, conn))) => {
                    *lines += conn.take(data, parse);
                    Next::Receive
                }
                (Received::Data(_), None) => Next::Close,
                (Received::Ended | Received::Failed(_), _) => {
                    *slot = None;
                    Next::Close
                }
            }
        })
    }
}

impl Conn {
    /// The lines `data` ends, each a `String` as `FramedConn::recv_line` gives the
    /// broker's sessions, decoded with `parse`; the rest kept for the next. How many ended.
    fn take(&mut self, mut data: &[u8], parse: bool) -> u64 {
        let mut lines = 0;
        while let Some(end) = data.iter().position(|&b| b == b'\n') {
            let line = if self.partial.is_empty() {
                data[..end].to_vec()
            } else {
                self.partial.extend_from_slice(&data[..end]);
                std::mem::take(&mut self.partial)
            };
            data = &data[end + 1..];
            lines += 1;
            if let Ok(line) = String::from_utf8(line) {
                if parse {
                    let _ = self.frames.decode(line);
                }
            }
        }
        self.partial.extend_from_slice(data);
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_across_receives() {
        let mut c = Conn::default();
        assert_eq!(c.take(b"{\"a\":1}\n{\"b\"", false), 1);
        assert_eq!(c.take(b":2", false), 0);
        assert_eq!(c.take(b"}\n\n{}\n{", true), 3);
        assert_eq!(c.partial, b"{");
    }
}
