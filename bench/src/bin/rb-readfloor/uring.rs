//! `rb-readfloor --uring`: the same reading through io_uring instead of epoll, to measure
//! what the host daemons' thread would cost if it read that way.
//!
//! The broker's way (and `rb-readfloor`'s without `--uring`) is epoll under tokio: each
//! report that arrives is one readiness event, one task woken and polled, and one `recvfrom`.
//! Here every connection has one multishot receive armed in an io_uring set up with
//! `DEFER_TASKRUN`: the kernel receives nothing on its own, and once a turn ([`TURN`]) one
//! `io_uring_enter` receives, into buffers of a ring the kernel picks from, whatever arrived
//! on every connection since the last, and posts one completion for each. No readiness
//! events, no tasks, one system call a turn instead of one a report. Lines are then cut and
//! (with `--parse`) decoded per connection as the broker's sessions do.
//!
//! Not the broker's: a measurement of a way it could read (BENCHMARKS.md, "Reading the
//! reports through io_uring").

use std::{
    alloc::{alloc_zeroed, Layout},
    io,
    os::fd::{AsRawFd, OwnedFd},
    sync::{
        atomic::{AtomicU16, Ordering},
        mpsc::{self, Receiver, Sender},
    },
};

use io_uring::{cqueue, opcode, types, IoUring};
use proto::repeats::HostdFrames;

use crate::TURN;

/// Receive buffers in the ring (a power of two, at most 32768).
const BUFFERS: u16 = 4096;
/// Bytes in each: a report of a few hundred bytes and then some.
const BUFFER_LEN: usize = 2048;
/// The ring's buffer group id.
const GROUP: u16 = 1;
/// Submission queue entries: one arm per new or re-armed connection in a turn.
const SQ_ENTRIES: u32 = 4096;
/// Completion queue entries: every connection's report of a turn and more (beyond, the
/// kernel keeps completions aside until there is room).
const CQ_ENTRIES: u32 = 32768;

/// One connection: its fd (closed when dropped), the start of a line that has not ended
/// yet, and its decoder.
struct Conn {
    fd: OwnedFd,
    partial: Vec<u8>,
    frames: HostdFrames,
}

/// The ring of receive buffers the kernel takes from, and the buffers.
struct Buffers {
    /// `BUFFERS` entries the kernel reads; page-aligned, never freed (it stays registered
    /// for the life of the process).
    ring: *mut types::BufRingEntry,
    bytes: Vec<u8>,
    tail: u16,
}

impl Buffers {
    fn new() -> io::Result<Self> {
        let layout = Layout::from_size_align(usize::from(BUFFERS) * 16, 4096)
            .map_err(|e| io::Error::other(e.to_string()))?;
        // SAFETY: a non-zero size; the memory is only ever reached through `ring`.
        let ring = unsafe { alloc_zeroed(layout) }.cast::<types::BufRingEntry>();
        if ring.is_null() {
            return Err(io::Error::other("no memory for the buffer ring"));
        }
        let mut buffers = Buffers {
            ring,
            bytes: vec![0; usize::from(BUFFERS) * BUFFER_LEN],
            tail: 0,
        };
        for id in 0..BUFFERS {
            buffers.give(id);
        }
        buffers.publish();
        Ok(buffers)
    }

    /// Puts buffer `id` back at the ring's tail (the kernel sees it after [`Self::publish`]).
    fn give(&mut self, id: u16) {
        let slot = usize::from(self.tail & (BUFFERS - 1));
        let addr = self.bytes[usize::from(id) * BUFFER_LEN..].as_mut_ptr() as u64;
        // SAFETY: `slot` < BUFFERS, inside the ring's allocation.
        let entry = unsafe { &mut *self.ring.add(slot) };
        entry.set_addr(addr);
        entry.set_len(BUFFER_LEN as u32);
        entry.set_bid(id);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Tells the kernel of the buffers given back.
    fn publish(&self) {
        // SAFETY: the ring's first entry holds the tail the kernel reads; u16-aligned.
        let tail = unsafe { &*types::BufRingEntry::tail(self.ring).cast::<AtomicU16>() };
        tail.store(self.tail, Ordering::Release);
    }

    fn data(&self, id: u16, len: usize) -> &[u8] {
        &self.bytes[usize::from(id) * BUFFER_LEN..][..len]
    }
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
    ring: IoUring,
    buffers: Buffers,
    /// Indexed by fd.
    conns: Vec<Option<Conn>>,
    /// Connections whose multishot receive ended this turn (out of buffers).
    rearm: Vec<usize>,
    parse: bool,
    /// Lines read so far, on every connection.
    lines: u64,
}

impl Reader {
    /// An io_uring whose receives run only when this thread enters it, with the buffer
    /// ring registered.
    fn new(parse: bool) -> io::Result<Self> {
        let ring: IoUring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(CQ_ENTRIES)
            .build(SQ_ENTRIES)?;
        let buffers = Buffers::new()?;
        // SAFETY: the ring's memory stays valid (never freed) while the ring lives.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                buffers.ring as u64,
                BUFFERS,
                GROUP,
                0,
            )?;
        }
        Ok(Reader {
            ring,
            buffers,
            conns: Vec::new(),
            rearm: Vec::new(),
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
        let raw = fd.as_raw_fd();
        let slot = usize::try_from(raw).map_err(|_| io::Error::other("a negative fd"))?;
        if self.conns.len() <= slot {
            self.conns.resize_with(slot + 1, || None);
        }
        self.conns[slot] = Some(Conn {
            fd,
            partial: Vec::new(),
            frames: HostdFrames::default(),
        });
        arm(&mut self.ring, raw)
    }

    /// One turn: everything that arrived since the last, received in one system call, cut
    /// into lines (and decoded).
    fn turn(&mut self) -> io::Result<()> {
        // A wait for as many completions as the queue holds, for no time: the kernel then
        // runs every receive deferred to this call (with a wait for one, it runs at most
        // 20 of them: the rest wait for the next call, and the reports pile up).
        let no_wait = types::Timespec::new();
        let enter = types::SubmitArgs::new().timespec(&no_wait);
        match self
            .ring
            .submitter()
            .submit_with_args(CQ_ENTRIES as usize, &enter)
        {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(e) => return Err(e),
        }
        for cqe in self.ring.completion() {
            let fd = cqe.user_data() as usize;
            let result = cqe.result();
            if let Some(id) = cqueue::buffer_select(cqe.flags()) {
                if let (Ok(len), Some(Some(conn))) =
                    (usize::try_from(result), self.conns.get_mut(fd))
                {
                    self.lines += conn.take(self.buffers.data(id, len), self.parse);
                }
                self.buffers.give(id);
            }
            if !cqueue::more(cqe.flags()) {
                // Out of buffers: armed again. Ended (0) or failed: closed.
                if result == -libc::ENOBUFS || result > 0 {
                    self.rearm.push(fd);
                } else if let Some(slot) = self.conns.get_mut(fd) {
                    *slot = None;
                }
            }
        }
        self.buffers.publish();
        for fd in self.rearm.drain(..) {
            if let Some(Some(conn)) = self.conns.get(fd) {
                arm(&mut self.ring, conn.fd.as_raw_fd())?;
            }
        }
        Ok(())
    }
}

/// One multishot receive on `fd`, its completions tagged with the fd.
fn arm(ring: &mut IoUring, fd: i32) -> io::Result<()> {
    let recv = opcode::RecvMulti::new(types::Fd(fd), GROUP)
        .build()
        .user_data(fd as u64);
    // SAFETY: the receive writes only into the registered buffers, which outlive the ring.
    while unsafe { ring.submission().push(&recv) }.is_err() {
        ring.submit()?;
    }
    Ok(())
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
    use std::{
        io::Write,
        net::{TcpListener, TcpStream},
        time::{Duration, Instant},
    };

    use super::*;

    fn conn() -> Conn {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
        Conn {
            fd: a.into(),
            partial: Vec::new(),
            frames: HostdFrames::default(),
        }
    }

    #[test]
    fn lines_are_cut_across_receives() {
        let mut c = conn();
        assert_eq!(c.take(b"{\"a\":1}\n{\"b\"", false), 1);
        assert_eq!(c.take(b":2", false), 0);
        assert_eq!(c.take(b"}\n\n{}\n{", true), 3);
        assert_eq!(c.partial, b"{");
    }

    /// Turns until `reader` has read `lines` lines, or 5 s have passed.
    fn turn_until(reader: &mut Reader, lines: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while reader.lines < lines && Instant::now() < deadline {
            reader.turn().expect("a turn");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A reader with `n` loopback connections armed; `None` where io_uring cannot be used.
    fn reader_of(n: usize) -> Option<(Reader, Vec<TcpStream>)> {
        let mut reader = match Reader::new(false) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("io_uring cannot be used here ({e}): not tested");
                return None;
            }
        };
        let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let addr = listener.local_addr().expect("its address");
        let mut senders = Vec::new();
        for _ in 0..n {
            senders.push(TcpStream::connect(addr).expect("connected"));
            let (accepted, _) = listener.accept().expect("accepted");
            accepted
                .set_nonblocking(true)
                .expect("non-blocking, as tokio's");
            reader.add(accepted.into()).expect("armed");
        }
        reader.turn().expect("the receives armed");
        Some((reader, senders))
    }

    #[test]
    fn one_turn_reads_what_every_connection_sent() {
        let Some((mut reader, mut senders)) = reader_of(64) else {
            return;
        };
        for s in &mut senders {
            s.write_all(b"a report\n").expect("sent");
        }
        // Loopback: each line is in its socket, its receive queued to the ring, once sent.
        reader.turn().expect("a turn");
        assert_eq!(reader.lines, 64, "every receive queued runs in the turn");
    }

    #[test]
    fn every_line_of_every_connection_is_read_and_an_ended_one_closed() {
        let Some((mut reader, mut senders)) = reader_of(3) else {
            return;
        };
        senders[0].write_all(b"one\ntwo\n").expect("sent");
        senders[1].write_all(b"thr").expect("sent");
        turn_until(&mut reader, 2);
        assert_eq!(reader.lines, 2);
        senders[1].write_all(b"ee\n").expect("sent");
        // More than one receive buffer's worth on one connection within a turn.
        let many = "x".repeat(99) + "\n";
        senders[2]
            .write_all(many.repeat(100).as_bytes())
            .expect("sent");
        turn_until(&mut reader, 103);
        assert_eq!(reader.lines, 103);
        drop(senders.remove(0));
        let deadline = Instant::now() + Duration::from_secs(5);
        while reader.conns.iter().flatten().count() == 3 && Instant::now() < deadline {
            reader.turn().expect("a turn");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            reader.conns.iter().flatten().count(),
            2,
            "the ended one is closed"
        );
    }
}
