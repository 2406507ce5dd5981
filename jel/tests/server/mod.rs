//! A test harness, not a product: the pure [`Pool`] served over a real Unix socket, the way
//! the agent will serve it (one reader thread per connection feeding lines in, one pool
//! thread batching inputs, performing outputs with non-blocking writes and reporting
//! flushes). Clients under test talk to it exactly as they will to the agent.

// Each test binary uses a part of the harness.
#![allow(dead_code)]

use std::{
    collections::{HashMap, VecDeque},
    io::{BufRead, BufReader},
    os::{
        fd::AsRawFd,
        unix::net::{UnixListener, UnixStream},
    },
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc::{channel, Receiver, RecvTimeoutError, Sender},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use jel::pool::{ConnId, DisconnectReason, Input, Output, Pool, PoolConfig};

enum Msg {
    Conn(ConnId, UnixStream),
    Input(Input),
    Stop,
}

/// A pool served at `path` until dropped.
pub struct TestPool {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    tx: Sender<Msg>,
    /// The host the next connections come from.
    host: Arc<Mutex<String>>,
    /// How many watchers the pool cut off for being slow.
    pub cut_off: Arc<AtomicUsize>,
    pool_thread: Option<thread::JoinHandle<()>>,
}

impl TestPool {
    pub fn start(config: PoolConfig) -> TestPool {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jel.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let (tx, rx) = channel();
        let host = Arc::new(Mutex::new("front".to_string()));
        let cut_off = Arc::new(AtomicUsize::new(0));
        let (accept_tx, accept_host) = (tx.clone(), Arc::clone(&host));
        thread::spawn(move || accept(listener, accept_tx, accept_host));
        let counter = Arc::clone(&cut_off);
        let pool_thread = thread::spawn(move || serve(Pool::new(config), rx, counter));
        TestPool {
            _dir: dir,
            path,
            tx,
            host,
            cut_off,
            pool_thread: Some(pool_thread),
        }
    }

    /// Connections made from now on come from `host`.
    pub fn set_host(&self, host: &str) {
        *self.host.lock().expect("host lock") = host.to_string();
    }

    /// Feeds an input as the agent would (a reclaim, a lost host…).
    pub fn input(&self, input: Input) {
        self.tx.send(Msg::Input(input)).expect("pool thread alive");
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop); // the pool thread may have panicked already
        if let Some(t) = self.pool_thread.take() {
            let _ = t.join();
        }
    }
}

fn accept(listener: UnixListener, tx: Sender<Msg>, host: Arc<Mutex<String>>) {
    for (conn, stream) in listener.incoming().enumerate() {
        let Ok(stream) = stream else { return };
        let conn = conn as ConnId + 1;
        let pid = proto::peercred::peer_pid(&stream).map(|p| p as u32);
        let host = host.lock().expect("host lock").clone();
        let reader = stream.try_clone().expect("clone");
        let opened = Input::Opened { conn, host, pid };
        if tx.send(Msg::Conn(conn, stream)).is_err() || tx.send(Msg::Input(opened)).is_err() {
            return;
        }
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                if tx.send(Msg::Input(Input::Line { conn, line })).is_err() {
                    return;
                }
            }
            let _ = tx.send(Msg::Input(Input::Closed { conn })); // the pool may be gone
        });
    }
}

/// A connection's socket and the lines not yet written (the first maybe in part).
struct Out {
    stream: UnixStream,
    pending: VecDeque<String>,
    offset: usize,
}

impl Out {
    /// Writes what the socket takes without blocking; the number of whole lines written.
    fn write_some(&mut self) -> Result<usize, ()> {
        let mut lines = 0;
        while let Some(line) = self.pending.front() {
            let bytes = &line.as_bytes()[self.offset..];
            let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
            // SAFETY: `bytes` is a live slice of its length; the fd is open while self lives.
            let n = unsafe {
                libc::send(
                    self.stream.as_raw_fd(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    flags,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return match e.kind() {
                    std::io::ErrorKind::WouldBlock => Ok(lines),
                    _ => Err(()),
                };
            }
            self.offset += n as usize;
            if self.offset == line.len() {
                self.pending.pop_front();
                self.offset = 0;
                lines += 1;
            }
        }
        Ok(lines)
    }
}

fn serve(mut pool: Pool, rx: Receiver<Msg>, cut_off: Arc<AtomicUsize>) {
    let mut outs: HashMap<ConnId, Out> = HashMap::new();
    loop {
        let mut inputs = Vec::new();
        let first = rx.recv_timeout(Duration::from_millis(5));
        let mut next = match first {
            Ok(msg) => Some(msg),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        while let Some(msg) = next {
            match msg {
                Msg::Stop => return,
                Msg::Conn(conn, stream) => {
                    let out = Out {
                        stream,
                        pending: VecDeque::new(),
                        offset: 0,
                    };
                    outs.insert(conn, out);
                }
                Msg::Input(input) => inputs.push(input),
            }
            next = rx.try_recv().ok();
        }
        inputs.push(Input::Tick);
        let outputs = pool.handle_batch(inputs, Instant::now());
        perform(outputs, &mut outs, &cut_off);
        let mut flushed = Vec::new();
        outs.retain(|conn, out| match out.write_some() {
            Ok(0) => true,
            Ok(lines) => {
                flushed.push(Input::Flushed { conn: *conn, lines });
                true
            }
            Err(()) => false, // the reader thread reports the close
        });
        let more = pool.handle_batch(flushed, Instant::now());
        perform(more, &mut outs, &cut_off);
    }
}

fn perform(outputs: Vec<Output>, outs: &mut HashMap<ConnId, Out>, cut_off: &AtomicUsize) {
    for output in outputs {
        match output {
            Output::Send { conn, lines } => {
                if let Some(out) = outs.get_mut(&conn) {
                    out.pending
                        .extend(lines.iter().map(|l| l.as_str().to_string()));
                }
            }
            Output::Disconnect { conn, reason } => {
                if reason == DisconnectReason::SlowConsumer {
                    cut_off.fetch_add(1, Ordering::SeqCst);
                }
                if let Some(mut out) = outs.remove(&conn) {
                    let _ = out.write_some(); // a last error reply, if it fits
                    let _ = out.stream.shutdown(std::net::Shutdown::Both);
                }
            }
        }
    }
}

/// Kills process `pid` if the guard still lives after `limit`: a client under test that
/// hangs fails its test instead of hanging it.
pub struct KillGuard(Sender<()>);

pub fn kill_after(pid: u32, limit: Duration) -> KillGuard {
    let (tx, rx) = channel::<()>();
    thread::spawn(move || {
        if rx.recv_timeout(limit) == Err(RecvTimeoutError::Timeout) {
            // SAFETY: kill(2) with a pid we spawned; at worst it is gone (ESRCH).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    });
    KillGuard(tx)
}

/// Compiles the C test member (`tests/c/member.c`) against libjel.so (rpath set) and jel.h,
/// as `JEL_C_DIR/exe_name` (one name per test binary: they build in parallel).
pub fn compile_c_member(exe_name: &str) -> PathBuf {
    let lib_dir = env!("JEL_C_DIR");
    let exe = PathBuf::from(lib_dir).join(exe_name);
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/member.c");
    let inc = concat!(env!("CARGO_MANIFEST_DIR"), "/c");
    let status = std::process::Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .args([src, "-I", inc, "-L", lib_dir, "-ljel"])
        .arg(format!("-Wl,-rpath,{lib_dir}"))
        .status()
        .expect("cc");
    assert!(status.success(), "compiling tests/c/member.c");
    exe
}
