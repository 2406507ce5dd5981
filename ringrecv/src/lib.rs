//! Receiving from many sockets through one io_uring, in turns: what the broker's host
//! daemons' thread reads their reports with (and `rb-readfloor --uring` measures).
//!
//! Each socket has one multishot receive armed in a ring set up with `DEFER_TASKRUN`: the
//! kernel receives nothing on its own, and once a turn ([`Ring::turn`]) one `io_uring_enter`
//! receives, into buffers of a ring the kernel picks from, whatever arrived on every socket
//! since the last turn, and posts one completion for each. No readiness events, no tasks,
//! one system call a turn instead of one a report (BENCHMARKS.md, "Reading the reports
//! through io_uring": a point of a core less at 10k hosts).
//!
//! What the ring owns: the sockets it was given (closed when it is done with them), the
//! receive buffers, and which socket each completion belongs to (a [`Token`], whose
//! generation keeps a late completion of a closed socket from reaching the socket that took
//! its slot). What it leaves to its caller: what the bytes mean, and writing (the caller
//! writes to [`Ring::fd`] itself, rarely and without blocking).
//!
//! A receive armed is submitted at the next turn's system call; one that ends (the buffers
//! ran out, or after a [`Next::Pause`] and [`Ring::resume`]) is armed again at the end of the
//! turn. A socket whose caller is behind is paused (its receive cancelled, what its peer
//! sends waits in the socket's buffers and then the peer's: TCP's own back-pressure) until
//! resumed.

use std::{
    alloc::{alloc_zeroed, Layout},
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    sync::atomic::{AtomicU16, Ordering},
};

use io_uring::{cqueue, opcode, types, IoUring};

/// Receive buffers in the ring (a power of two, at most 32768): a turn's reports at 10k
/// hosts are ~100; a burst beyond waits for the next turn (the socket keeps it).
const BUFFERS: u16 = 1024;
/// Bytes in each: a report of a few hundred bytes and then some (a longer message comes
/// in several).
const BUFFER_LEN: usize = 2048;
/// The ring's buffer group id.
const GROUP: u16 = 1;
/// Submission queue entries: one arm or cancel per socket that needs one in a turn
/// (beyond, the ring submits what it has and goes on).
const SQ_ENTRIES: u32 = 4096;
/// Completion queue entries: every socket's completion of a turn and more (beyond, the
/// kernel keeps completions aside until there is room).
const CQ_ENTRIES: u32 = 32768;
/// The user data of a cancel's own completion (never a token's).
const CANCEL: u64 = u64::MAX;

/// One socket given to the ring, for as long as it has it: a token of a socket the ring
/// closed names nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    slot: u32,
    generation: u32,
}

impl Token {
    /// A small number no other socket the ring has shares (a closed one's is reused): an
    /// index for its caller's table of sockets.
    pub fn index(self) -> usize {
        self.slot as usize
    }

    fn user_data(self) -> u64 {
        u64::from(self.generation) << 32 | u64::from(self.slot)
    }

    fn of(user_data: u64) -> Self {
        Token {
            slot: user_data as u32,
            generation: (user_data >> 32) as u32,
        }
    }
}

/// What arrived on a socket in a turn.
#[derive(Debug)]
pub enum Received<'a> {
    /// Bytes, in the order sent (a socket's come in as many pieces as buffers they took).
    Data(&'a [u8]),
    /// The peer ended the stream: the ring has closed the socket.
    Ended,
    /// Receiving failed: the ring has closed the socket.
    Failed(io::Error),
}

/// What the ring does with a socket after its caller took [`Received::Data`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Goes on receiving.
    Receive,
    /// Stops receiving until [`Ring::resume`] (the caller has enough to work through).
    Pause,
    /// Is shut down and closed ([`Ring::close`]).
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nobody's: no socket, no operation.
    Free,
    /// A receive is armed (or will be, at the end of the turn).
    Receiving,
    /// Its receive is being cancelled; then paused.
    Pausing,
    /// No receive armed until resumed.
    Paused,
    /// Shut down: its receive's last completion closes it.
    Closing,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    fd: Option<OwnedFd>,
    state: State,
    /// A resume asked while the cancel of a pause was still under way.
    resume: bool,
}

/// The sockets received from through one io_uring, on the thread that made it (the ring
/// is made for a single issuer).
pub struct Ring {
    ring: IoUring,
    buffers: Buffers,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slots whose receive is armed at the end of this turn.
    rearm: Vec<u32>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("sockets", &(self.slots.len() - self.free.len()))
            .finish_non_exhaustive()
    }
}

impl Ring {
    /// A ring whose receives run only when this thread enters it, with its buffers
    /// registered; an error where io_uring cannot be used (a kernel before 6.1,
    /// `kernel.io_uring_disabled`, a seccomp profile that refuses it).
    pub fn new() -> io::Result<Self> {
        let ring: IoUring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(CQ_ENTRIES)
            .build(SQ_ENTRIES)?;
        let buffers = Buffers::new()?;
        // SAFETY: the buffer ring's memory is never freed (see `Buffers`), so it stays
        // valid while the ring lives.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                buffers.ring as u64,
                BUFFERS,
                GROUP,
                0,
            )?;
        }
        Ok(Ring {
            ring,
            buffers,
            slots: Vec::new(),
            free: Vec::new(),
            rearm: Vec::new(),
        })
    }

    /// Receives from `fd` (a stream socket, non-blocking) from the next turn on.
    pub fn add(&mut self, fd: OwnedFd) -> io::Result<Token> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = u32::try_from(self.slots.len())
                    .map_err(|_| io::Error::other("more sockets than a ring holds"))?;
                self.slots.push(Slot {
                    generation: 0,
                    fd: None,
                    state: State::Free,
                    resume: false,
                });
                slot
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.fd = Some(fd);
        entry.state = State::Receiving;
        entry.resume = false;
        let token = Token {
            slot,
            generation: entry.generation,
        };
        self.arm(token)?;
        Ok(token)
    }

    /// The socket of `token`, while the ring has it (to write to).
    pub fn fd(&self, token: Token) -> Option<BorrowedFd<'_>> {
        self.live(token)?.fd.as_ref().map(AsFd::as_fd)
    }

    /// Sockets the ring has.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether the ring has no socket.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shuts `token`'s socket down (its peer sees the end of the stream) and closes it once
    /// its receive is over: nothing of it is received from now on.
    pub fn close(&mut self, token: Token) {
        let Some(slot) = self.live_mut(token) else {
            return;
        };
        let state = slot.state;
        if let Some(fd) = &slot.fd {
            // SAFETY: shutdown(2) of a descriptor the slot owns and keeps open.
            let _ = unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
        }
        match state {
            State::Paused => self.release(token.slot),
            // The receive's last completion (the end the shutdown makes, or the cancel's)
            // closes it.
            State::Receiving | State::Pausing => {
                if let Some(slot) = self.live_mut(token) {
                    slot.state = State::Closing;
                }
                // A receive waiting to be armed at the end of the turn never will be.
                if let Some(at) = self.rearm.iter().position(|&s| s == token.slot) {
                    self.rearm.swap_remove(at);
                    self.release(token.slot);
                }
            }
            State::Closing | State::Free => {}
        }
    }

    /// Receives from `token`'s socket again after a [`Next::Pause`].
    pub fn resume(&mut self, token: Token) -> io::Result<()> {
        let Some(slot) = self.live_mut(token) else {
            return Ok(());
        };
        match slot.state {
            State::Paused => {
                slot.state = State::Receiving;
                self.arm(token)
            }
            State::Pausing => {
                slot.resume = true;
                Ok(())
            }
            State::Receiving | State::Closing | State::Free => Ok(()),
        }
    }

    /// One turn: submits what was armed, receives in one system call whatever arrived on
    /// every socket since the last turn, and hands each completion to `received` in the
    /// order the kernel posted them (a socket's bytes in the order sent); what `received`
    /// answers to [`Received::Data`] is done with the socket before its next completion.
    pub fn turn(
        &mut self,
        mut received: impl FnMut(Token, Received<'_>) -> Next,
    ) -> io::Result<()> {
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
        let completions: Vec<cqueue::Entry> = self.ring.completion().collect();
        for cqe in completions {
            self.complete(&cqe, &mut received);
        }
        self.buffers.publish();
        for slot in std::mem::take(&mut self.rearm) {
            let entry = &self.slots[slot as usize];
            if entry.state == State::Receiving {
                let token = Token {
                    slot,
                    generation: entry.generation,
                };
                self.arm(token)?;
            }
        }
        Ok(())
    }

    /// One completion: its bytes to `received`, then what becomes of its socket.
    fn complete(
        &mut self,
        cqe: &cqueue::Entry,
        received: &mut impl FnMut(Token, Received<'_>) -> Next,
    ) {
        if cqe.user_data() == CANCEL {
            return;
        }
        let token = Token::of(cqe.user_data());
        let result = cqe.result();
        let more = cqueue::more(cqe.flags());
        let state = self.live(token).map(|s| s.state);
        if let Some(id) = cqueue::buffer_select(cqe.flags()) {
            let wanted = matches!(state, Some(State::Receiving | State::Pausing));
            if let (true, Ok(len)) = (wanted, usize::try_from(result)) {
                match received(token, Received::Data(self.buffers.data(id, len))) {
                    Next::Receive => {}
                    Next::Pause => self.pause(token),
                    Next::Close => self.close(token),
                }
            }
            self.buffers.give(id);
        }
        if more {
            return;
        }
        // The receive is over.
        match self.live(token).map(|s| s.state) {
            Some(State::Receiving) if result == -libc::ENOBUFS || result > 0 => {
                self.rearm.push(token.slot);
            }
            Some(State::Receiving) => {
                let why = match result {
                    0 => Received::Ended,
                    e => Received::Failed(io::Error::from_raw_os_error(-e)),
                };
                self.release(token.slot);
                let _ = received(token, why);
            }
            Some(State::Pausing) => {
                let slot = &mut self.slots[token.slot as usize];
                slot.state = State::Paused;
                if std::mem::take(&mut slot.resume) {
                    slot.state = State::Receiving;
                    self.rearm.push(token.slot);
                }
            }
            Some(State::Closing) => self.release(token.slot),
            Some(State::Paused | State::Free) | None => {}
        }
    }

    /// Cancels `token`'s receive; the socket is paused once the receive is over.
    fn pause(&mut self, token: Token) {
        let Some(slot) = self.live_mut(token) else {
            return;
        };
        if slot.state != State::Receiving {
            return;
        }
        slot.state = State::Pausing;
        if let Some(at) = self.rearm.iter().position(|&s| s == token.slot) {
            // Its receive is over already and waits to be armed again: it will not be.
            self.rearm.swap_remove(at);
            self.slots[token.slot as usize].state = State::Paused;
            return;
        }
        let cancel = opcode::AsyncCancel::new(token.user_data())
            .build()
            .user_data(CANCEL);
        self.push(&cancel);
    }

    /// One multishot receive on `token`'s socket, its completions tagged with the token.
    fn arm(&mut self, token: Token) -> io::Result<()> {
        let Some(fd) = self.fd(token).map(|fd| fd.as_raw_fd()) else {
            return Ok(());
        };
        let recv = opcode::RecvMulti::new(types::Fd(fd), GROUP)
            .build()
            .user_data(token.user_data());
        self.push(&recv);
        Ok(())
    }

    /// Queues `entry` for the next submit; a full queue is submitted first.
    fn push(&mut self, entry: &io_uring::squeue::Entry) {
        // SAFETY: the receives write only into the registered buffers, which outlive the
        // ring; a cancel refers to nothing but a user data value.
        while unsafe { self.ring.submission().push(entry) }.is_err() {
            if self.ring.submit().is_err() {
                // Nothing to do but try again: the kernel takes entries as it can.
                std::thread::yield_now();
            }
        }
    }

    /// The slot of `token` if it is still that socket's.
    fn live(&self, token: Token) -> Option<&Slot> {
        self.slots
            .get(token.slot as usize)
            .filter(|s| s.generation == token.generation && s.state != State::Free)
    }

    fn live_mut(&mut self, token: Token) -> Option<&mut Slot> {
        self.slots
            .get_mut(token.slot as usize)
            .filter(|s| s.generation == token.generation && s.state != State::Free)
    }

    /// Closes the slot's socket; a token of it names nothing from now on.
    fn release(&mut self, slot: u32) {
        let entry = &mut self.slots[slot as usize];
        entry.fd = None;
        entry.state = State::Free;
        entry.resume = false;
        entry.generation = entry.generation.wrapping_add(1);
        self.free.push(slot);
    }
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
        &self.bytes[usize::from(id) * BUFFER_LEN..][..len.min(BUFFER_LEN)]
    }
}

#[cfg(test)]
mod tests;
