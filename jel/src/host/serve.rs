//! The pool task: takes every message that is ready, feeds them to the pool as one batch,
//! and performs the outputs: each local connection's lines written non-blocking with one
//! `writev` (a connection that would block waits for a "writable" wake-up), remote ones
//! handed to the agent, closes done at once. What was written goes back as
//! [`Input::Flushed`].

use std::{
    collections::{HashMap, VecDeque},
    io::{self, IoSlice},
    os::fd::AsRawFd,
    sync::Arc,
    time::Instant,
};

use tokio::{
    net::UnixStream,
    sync::{mpsc, oneshot},
    task::JoinHandle,
    time::{self, MissedTickBehavior},
};

use super::{HostConfig, Msg, RemoteOut};
use crate::pool::{ConnId, Input, Line, Output, Pool};

/// Messages taken into one batch at most (a bound on the latency of the first one).
const MAX_BATCH: usize = 8192;
/// Lines per `writev` (IOV_MAX is 1024 on Linux).
const MAX_IOV: usize = 1024;

/// Where a connection's lines go.
enum Sink {
    Local(Local),
    Remote,
}

/// A local connection's socket and the lines not yet written (the first maybe in part).
struct Local {
    stream: Arc<UnixStream>,
    /// The peer's pid, as the kernel said at accept.
    pid: Option<u32>,
    pending: VecDeque<Line>,
    /// Bytes of the first pending line already written.
    offset: usize,
    /// Waits for the socket to take writes again (set while it would block).
    waiter: Option<JoinHandle<()>>,
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(w) = self.waiter.take() {
            w.abort();
        }
    }
}

/// What a write attempt came to.
enum Wrote {
    /// This many whole lines (the socket took all, or would block now).
    Lines(usize),
    /// The socket is broken.
    Failed,
}

impl Local {
    /// Writes what the socket takes without blocking.
    fn write_some(&mut self) -> Wrote {
        let mut lines = 0;
        while !self.pending.is_empty() {
            let slices = self.slices();
            match self.stream.try_write_vectored(&slices) {
                Ok(n) => lines += self.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Wrote::Failed,
            }
        }
        Wrote::Lines(lines)
    }

    fn slices(&self) -> Vec<IoSlice<'_>> {
        let mut slices = Vec::with_capacity(self.pending.len().min(MAX_IOV));
        for (i, line) in self.pending.iter().take(MAX_IOV).enumerate() {
            let bytes = line.as_str().as_bytes();
            let skip = if i == 0 { self.offset } else { 0 };
            slices.push(IoSlice::new(&bytes[skip..]));
        }
        slices
    }

    /// `n` more bytes were written: drops the lines done; returns how many.
    fn advance(&mut self, mut n: usize) -> usize {
        let mut done = 0;
        while let Some(line) = self.pending.front() {
            let left = line.as_str().len() - self.offset;
            if n < left {
                self.offset += n;
                break;
            }
            n -= left;
            self.offset = 0;
            self.pending.pop_front();
            done += 1;
        }
        done
    }

    /// Closes both ways now (the reader task then sees EOF and ends).
    fn shutdown(&self) {
        // A socket already shut or reset is closed anyway.
        let _ =
            nix::sys::socket::shutdown(self.stream.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    }
}

/// One batch: the pool's inputs and the callers to answer once it is done.
#[derive(Default)]
struct Batch {
    inputs: Vec<Input>,
    done: Vec<oneshot::Sender<()>>,
    terminate: Option<oneshot::Sender<Vec<u32>>>,
    taken: usize,
}

/// The pool task's state.
pub(super) struct Server {
    pool: Pool,
    config: HostConfig,
    sinks: HashMap<ConnId, Sink>,
    /// Our own channel, for the writable waiters.
    tx: mpsc::Sender<Msg>,
    remote: mpsc::UnboundedSender<RemoteOut>,
    /// Local connections with lines to write and no waiter.
    dirty: Vec<ConnId>,
}

impl Server {
    pub fn new(
        config: HostConfig,
        tx: mpsc::Sender<Msg>,
        remote: mpsc::UnboundedSender<RemoteOut>,
    ) -> Self {
        Server {
            pool: Pool::new(config.pool.clone()),
            config,
            sinks: HashMap::new(),
            tx,
            remote,
            dirty: Vec::new(),
        }
    }

    /// Serves until terminated (or aborted).
    pub async fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut tick = time::interval(self.config.tick);
        tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            let mut batch = Batch::default();
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(msg) => self.take(msg, &mut batch),
                    None => return,
                },
                _ = tick.tick() => batch.inputs.push(Input::Tick),
            }
            self.drain_ready(&mut rx, &mut batch);
            // Let the readers woken meanwhile hand their lines in too: one batch (one write
            // per connection) then carries them all. Costs one turn of the scheduler.
            if batch.taken < MAX_BATCH {
                tokio::task::yield_now().await;
                self.drain_ready(&mut rx, &mut batch);
            }
            let terminate = batch.terminate.take();
            self.step(std::mem::take(&mut batch.inputs));
            for done in batch.done {
                let _ = done.send(()); // the caller may have given up waiting
            }
            if let Some(done) = terminate {
                let told = self.drain(&mut rx).await;
                let _ = done.send(told);
                return;
            }
        }
    }

    /// Takes the messages already in the channel, up to [`MAX_BATCH`].
    fn drain_ready(&mut self, rx: &mut mpsc::Receiver<Msg>, batch: &mut Batch) {
        while batch.taken < MAX_BATCH {
            match rx.try_recv() {
                Ok(msg) => self.take(msg, batch),
                Err(_) => break,
            }
        }
    }

    /// Turns a message into inputs (or bookkeeping).
    fn take(&mut self, msg: Msg, batch: &mut Batch) {
        batch.taken += 1;
        match msg {
            Msg::Opened {
                conn,
                host,
                pid,
                stream,
            } => {
                let input = match (&stream, self.config.front_end) {
                    (Some(_), true) => Input::OpenedFrontEnd { conn, host, pid },
                    _ => Input::Opened { conn, host, pid },
                };
                let sink = match stream {
                    Some(stream) => Sink::Local(Local {
                        stream,
                        pid,
                        pending: VecDeque::new(),
                        offset: 0,
                        waiter: None,
                    }),
                    None => Sink::Remote,
                };
                self.sinks.insert(conn, sink);
                batch.inputs.push(input);
            }
            Msg::Lines { conn, lines } => {
                let lines = lines.into_iter().map(|line| Input::Line { conn, line });
                batch.inputs.extend(lines);
            }
            Msg::Closed { conn } => {
                // Closed by us before (a Disconnect): the pool forgot it already.
                if self.sinks.remove(&conn).is_some() {
                    batch.inputs.push(Input::Closed { conn });
                }
            }
            Msg::Writable { conn } => {
                if let Some(Sink::Local(local)) = self.sinks.get_mut(&conn) {
                    local.waiter = None;
                    self.dirty.push(conn);
                }
            }
            Msg::Job { input, done } => {
                batch.inputs.push(input);
                batch.done.push(done);
            }
            Msg::Terminate { done } => {
                batch.inputs.push(Input::Terminate);
                batch.terminate = Some(done);
            }
        }
    }

    /// Feeds the inputs, performs the outputs, writes, and feeds back what was written
    /// until nothing more comes of it.
    fn step(&mut self, inputs: Vec<Input>) {
        let now = Instant::now();
        let mut outputs = self.pool.handle_batch(inputs, now);
        loop {
            let mut back = self.perform(outputs);
            back.extend(self.write_dirty());
            if back.is_empty() {
                return;
            }
            outputs = self.pool.handle_batch(back, now);
        }
    }

    /// Queues sends and closes; returns the inputs that come of it at once (remote lines
    /// count as written).
    fn perform(&mut self, outputs: Vec<Output>) -> Vec<Input> {
        let mut back = Vec::new();
        for output in outputs {
            match output {
                Output::Send { conn, lines } => match self.sinks.get_mut(&conn) {
                    Some(Sink::Local(local)) => {
                        if local.pending.is_empty() && local.waiter.is_none() {
                            self.dirty.push(conn);
                        }
                        local.pending.extend(lines);
                    }
                    Some(Sink::Remote) => {
                        let n = lines.len();
                        if self.remote.send(RemoteOut::Send { conn, lines }).is_ok() {
                            back.push(Input::Flushed { conn, lines: n });
                        }
                    }
                    None => {}
                },
                Output::Disconnect { conn, reason } => match self.sinks.remove(&conn) {
                    Some(Sink::Local(mut local)) => {
                        let _ = local.write_some(); // a last error reply, if it goes at once
                        local.shutdown();
                    }
                    Some(Sink::Remote) => {
                        let _ = self.remote.send(RemoteOut::Disconnect { conn, reason });
                    }
                    None => {}
                },
            }
        }
        back
    }

    /// Writes every dirty connection as far as it goes; `Flushed` for what was written,
    /// `Closed` for the ones that broke or hold too much.
    fn write_dirty(&mut self) -> Vec<Input> {
        let mut back = Vec::new();
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for conn in dirty {
            let Some(Sink::Local(local)) = self.sinks.get_mut(&conn) else {
                continue;
            };
            if local.waiter.is_some() {
                continue;
            }
            let close = match local.write_some() {
                Wrote::Lines(lines) => {
                    if lines > 0 {
                        back.push(Input::Flushed { conn, lines });
                    }
                    if !local.pending.is_empty() {
                        local.waiter = Some(wait_writable(conn, &local.stream, &self.tx));
                    }
                    local.pending.len() > self.config.max_unwritten
                }
                Wrote::Failed => true,
            };
            if close {
                if let Some(Sink::Local(local)) = self.sinks.remove(&conn) {
                    local.shutdown();
                }
                back.push(Input::Closed { conn });
            }
        }
        back
    }

    /// After `terminated`: serve on until every local connection is written out and has
    /// made its first request (a watcher that connected just before the end gets the
    /// stream through `terminated`), or the drain time is over; then close them all.
    /// Returns the pids of the local connections' peers.
    async fn drain(&mut self, rx: &mut mpsc::Receiver<Msg>) -> Vec<u32> {
        let deadline = time::Instant::now() + self.config.drain;
        while self.unwritten() || self.unasked() {
            let Ok(Some(msg)) = time::timeout_at(deadline, rx.recv()).await else {
                break;
            };
            let mut batch = Batch::default();
            self.take(msg, &mut batch);
            self.step(batch.inputs);
            for done in batch.done {
                let _ = done.send(());
            }
        }
        let mut told = Vec::new();
        for (conn, sink) in self.sinks.drain() {
            match sink {
                Sink::Local(local) => {
                    local.shutdown();
                    told.extend(local.pid);
                }
                Sink::Remote => {
                    let reason = crate::pool::DisconnectReason::HostGone;
                    let _ = self.remote.send(RemoteOut::Disconnect { conn, reason });
                }
            }
        }
        let _ = std::fs::remove_file(&self.config.socket); // may be gone already
        told.sort_unstable();
        told.dedup();
        told
    }

    fn unwritten(&self) -> bool {
        let has = |s: &Sink| matches!(s, Sink::Local(l) if !l.pending.is_empty());
        self.sinks.values().any(has)
    }

    /// Whether a local connection has not made its first request yet.
    fn unasked(&self) -> bool {
        let local = |(_, s): &(&ConnId, &Sink)| matches!(s, Sink::Local(_));
        let fresh = |(conn, _): (&ConnId, &Sink)| self.pool.awaits_first_request(*conn);
        self.sinks.iter().filter(local).any(fresh)
    }
}

/// A task that tells the pool task when `conn`'s socket takes writes again.
fn wait_writable(conn: ConnId, stream: &Arc<UnixStream>, tx: &mpsc::Sender<Msg>) -> JoinHandle<()> {
    let (stream, tx) = (Arc::clone(stream), tx.clone());
    tokio::spawn(async move {
        if stream.writable().await.is_ok() {
            let _ = tx.send(Msg::Writable { conn }).await; // the pool may be gone
        }
    })
}
