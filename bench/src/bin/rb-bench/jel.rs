//! The JEL section: its lab part (latency: a job's members on 4 lab hosts,
//! [`crate::jel_lab`]) and its scale part, on one host: a pool hosted by `jel::host::PoolHost`
//! in a process of its own (the `rb-jel-host` example, the same host the agent runs), and N
//! members in this process, each with a member connection and a watch connection from seq 1,
//! over the real socket and protocol.
//!
//! - scale: the N members join at once; the time until every watcher has every `joined`
//!   line, with the host's CPU time and peak RSS over that phase;
//! - elections: every member stands in `master`; the winner's connection is closed; the
//!   time until every watcher has the `died` and the new `elected`;
//! - deaths: a member's connection closed; the time until every watcher has the `died`
//!   (per repetition, the slowest watcher), p50 and p99: the fan-out of one event to N
//!   watchers, all read by one process on this machine's cores, not a job's latency (that
//!   is the lab part's).
//!
//! Watchers count lines (raw reads, no JSON decoding): the figure is the pool's delivery,
//! not a client library's parsing.
//!
//! The fan-out is not batched further than one `writev` per watcher per batch of events: a
//! profile of the host during the deaths only (perf, 2000 watchers, one `died` each) put 69 %
//! of its CPU in the kernel: 61 % inside the `writev`s (the unix-socket send, the wake-up of
//! each watcher's reader, being preempted by it), 8 % in `epoll_wait` (tokio registers every
//! socket for writable too, so each watcher's read wakes the host's epoll: a read-only
//! registration with a writable waiter only while blocked would save that part); the pool's
//! per-connection bookkeeping and allocation are the other 31 %. With one socket per watcher
//! (the protocol) the writes cannot be merged; io_uring could batch the system calls, not the
//! per-socket work. The row "CPU per `died` fanned out" tracks that cost.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use bench::procstat;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

pub struct Options {
    pub members: usize,
    pub reps: usize,
    /// Host releases of the lab part.
    pub vacates: usize,
    /// `lab`, `scale`; empty = both.
    pub parts: Vec<String>,
}

impl Options {
    fn wants(&self, part: &str) -> bool {
        self.parts.is_empty() || self.parts.iter().any(|p| p == part)
    }
}

/// What one watcher has read: lines, and when the last ones came.
#[derive(Default)]
struct Seen {
    lines: AtomicU64,
    last: Mutex<Option<Instant>>,
}

/// A member's connection, after its join.
struct MemberConn {
    id: u64,
    conn: BufReader<UnixStream>,
}

/// The hosting process; killed on drop.
struct Host {
    child: Child,
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    println!("## JEL (issue 16)\n");
    if opts.wants("lab") {
        crate::jel_lab::run(&crate::jel_lab::Options {
            deaths: opts.reps,
            vacates: opts.vacates,
        })?;
    }
    if opts.wants("scale") {
        scale(opts)?;
    }
    Ok(())
}

fn scale(opts: &Options) -> anyhow::Result<()> {
    raise_fd_limit(4 * opts.members as u64 + 256)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(measure(opts))
}

/// The open-files limit raised (to the hard limit, `startup::raise_open_files`); an error
/// when it stays below `want` or cannot be read.
fn raise_fd_limit(want: u64) -> anyhow::Result<()> {
    match startup::raise_open_files() {
        Some(limit) if limit >= want => Ok(()),
        Some(limit) => bail!("open files are limited to {limit}; {want} are needed (ulimit -n)"),
        None => bail!("the open-files limit cannot be read; {want} open files are needed"),
    }
}

fn start_host() -> anyhow::Result<Host> {
    let program = tests::bin_dir().join("examples/rb-jel-host");
    if !program.exists() {
        bail!(
            "{} is missing\nhelp: build it with `cargo build --release -p jel --features tokio --example rb-jel-host`",
            program.display()
        );
    }
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("jel.sock");
    let mut child = Command::new(&program)
        .arg(&socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let mut out = std::io::BufReader::new(child.stdout.take().context("stdout")?);
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut out, &mut ready)?;
    if ready.trim() != "ready" {
        bail!("rb-jel-host did not start: `{ready}`");
    }
    Ok(Host {
        child,
        _dir: dir,
        socket,
    })
}

async fn measure(opts: &Options) -> anyhow::Result<()> {
    let n = opts.members;
    let host = start_host()?;
    let pid = host.child.id();
    let seen: Vec<Arc<Seen>> = (0..n).map(|_| Arc::default()).collect();
    for s in &seen {
        tokio::spawn(watch(host.socket.clone(), Arc::clone(s)));
    }
    // Hello and watch reply.
    let mut expected = 2;
    wait_all(&seen, expected, Instant::now()).await?;
    let cpu0 = procstat::cpu_seconds(pid).context("host CPU")?;
    let start = Instant::now();
    let joins: Vec<_> = (0..n)
        .map(|_| tokio::spawn(join(host.socket.clone())))
        .collect();
    let mut members = Vec::with_capacity(n);
    for j in joins {
        members.push(j.await??);
    }
    expected += n as u64;
    let join_all = wait_all(&seen, expected, start).await?;
    let cpu = procstat::cpu_seconds(pid).context("host CPU")? - cpu0;
    let rss = peak_rss_kb(pid).unwrap_or(0);
    // Elections: all stand; the first in wins (one `elected`).
    let mut winner = None;
    for m in &mut members {
        winner = Some(elect(m).await?);
    }
    let winner = winner.context("no members")?;
    expected += 1;
    wait_all(&seen, expected, Instant::now()).await?;
    let at = members
        .iter()
        .position(|m| m.id == winner)
        .context("winner")?;
    let gone = members.swap_remove(at);
    let start = Instant::now();
    drop(gone);
    expected += 2; // died, elected
    let reelect = wait_all(&seen, expected, start).await?;
    // Deaths: one member's connection closed at a time.
    let mut died = Vec::new();
    let me = std::process::id();
    let cpu_before = (cpu_of(pid)?, cpu_of(me)?);
    for _ in 0..opts.reps.min(members.len()) {
        let m = members.pop().context("a member")?;
        let start = Instant::now();
        drop(m);
        expected += 1;
        died.push(wait_all(&seen, expected, start).await?.as_secs_f64() * 1000.0);
    }
    let reps = died.len().max(1) as f64;
    let fan_out_cpu = (
        (cpu_of(pid)? - cpu_before.0) / reps,
        (cpu_of(me)? - cpu_before.1) / reps,
    );
    print(&Figures {
        n,
        join_all,
        cpu,
        rss,
        reelect,
        died,
        fan_out_cpu,
    });
    Ok(())
}

fn cpu_of(pid: u32) -> anyhow::Result<f64> {
    procstat::cpu_seconds(pid).with_context(|| format!("CPU time of process {pid}"))
}

/// What the scale part measured.
struct Figures {
    n: usize,
    join_all: Duration,
    /// The host's CPU seconds over the joins.
    cpu: f64,
    /// The host's peak RSS, KiB.
    rss: u64,
    reelect: Duration,
    /// Per death, ms.
    died: Vec<f64>,
    /// CPU seconds per death of the host, and of this process (the watchers).
    fan_out_cpu: (f64, f64),
}

fn peak_rss_kb(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Waits until every watcher has `lines` lines; how long after `start` the last one got
/// them.
async fn wait_all(seen: &[Arc<Seen>], lines: u64, start: Instant) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if seen
            .iter()
            .all(|s| s.lines.load(Ordering::Acquire) >= lines)
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("the watchers did not all get {lines} lines within 120 s");
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let last = seen
        .iter()
        .filter_map(|s| *s.last.lock().expect("lock"))
        .max()
        .context("no lines")?;
    Ok(last.saturating_duration_since(start))
}

/// A watcher from seq 1 that counts the lines it reads.
async fn watch(socket: PathBuf, seen: Arc<Seen>) -> anyhow::Result<()> {
    let mut stream = UnixStream::connect(&socket).await?;
    stream
        .write_all(b"{\"jel\":1}\n{\"op\":\"watch\",\"from\":1}\n")
        .await?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let lines = buf[..n].iter().filter(|b| **b == b'\n').count() as u64;
        if lines > 0 {
            *seen.last.lock().expect("lock") = Some(Instant::now());
            seen.lines.fetch_add(lines, Ordering::Release);
        }
    }
}

async fn read_line(conn: &mut BufReader<UnixStream>) -> anyhow::Result<String> {
    let mut line = String::new();
    if conn.read_line(&mut line).await? == 0 {
        bail!("the pool closed a member's connection");
    }
    Ok(line)
}

async fn join(socket: PathBuf) -> anyhow::Result<MemberConn> {
    let stream = UnixStream::connect(&socket).await?;
    let mut conn = BufReader::new(stream);
    conn.get_mut()
        .write_all(b"{\"jel\":1}\n{\"op\":\"join\"}\n")
        .await?;
    read_line(&mut conn).await?;
    let reply: serde_json::Value = serde_json::from_str(&read_line(&mut conn).await?)?;
    let id = reply["member"]["id"].as_u64().context("join reply")?;
    Ok(MemberConn { id, conn })
}

/// Stands in `master`; the winner's id.
async fn elect(m: &mut MemberConn) -> anyhow::Result<u64> {
    m.conn
        .get_mut()
        .write_all(b"{\"op\":\"elect\",\"name\":\"master\"}\n")
        .await?;
    let reply: serde_json::Value = serde_json::from_str(&read_line(&mut m.conn).await?)?;
    reply["winner"]["id"].as_u64().context("elect reply")
}

fn print(f: &Figures) {
    let Figures {
        n,
        join_all,
        cpu,
        rss,
        reelect,
        ..
    } = *f;
    let mut sorted = f.died.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted.get(i).copied().unwrap_or(f64::NAN)
    };
    println!("### Scale, on one host: {n} members, pool hosted by jel::host::PoolHost\n");
    println!("Each member has a member connection and a watch connection from seq 1, all {n} of each in this one process (2 runtime threads), on the machine's {} cores with the host; watchers count lines (no JSON decoding). Host = the `rb-jel-host` process (current-thread runtime, as the agent's). The last two rows are the fan-out of one event to {n} watchers, not a job's latency (the lab rows above are).\n", std::thread::available_parallelism().map_or(1, |c| c.get()));
    println!("| measurement | figure | goal | anchors |");
    println!("|---|---:|---|---|");
    println!(
        "| {n} join; every member has seen all {n} joins ({} deliveries) | {:.0} ms | < 2 s | JEL paper: tens of seconds (central registry, 30 s push); Serf: 2.4 s at 2000 nodes |",
        n * n,
        join_all.as_secs_f64() * 1000.0
    );
    println!("| host CPU time over the joins | {:.2} s | — | — |", cpu);
    println!("| host peak RSS | {} MiB | — | — |", rss / 1024);
    println!(
        "| {n} candidates, winner's connection closed → new winner seen by all | {:.1} ms | < 200 ms | — |",
        reelect.as_secs_f64() * 1000.0
    );
    println!(
        "| fan-out: a member's connection closed → `died` read by all {n} watchers, in one process: p50 / p99 (n={}) | {:.1} / {:.1} ms | — (the goal is the lab row's) | — |",
        sorted.len(),
        pct(0.5),
        pct(0.99)
    );
    let (host_s, watchers_s) = f.fan_out_cpu;
    println!(
        "| … CPU per `died` fanned out: the host / the {n} watchers' process | {:.2} / {:.2} ms ({:.1} / {:.1} µs per delivery) | — | — |",
        host_s * 1e3,
        watchers_s * 1e3,
        host_s * 1e6 / n as f64,
        watchers_s * 1e6 / n as f64
    );
    println!();
}
