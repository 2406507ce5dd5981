//! A worker: joins the job's pool as `worker` (so the master hears when it dies or its host
//! is vacated), calls the master back, and searches the subtrees it is handed, sharing each
//! better tour as soon as it finds it. The master's own in-process workers run the same
//! loop without joining.

use std::{
    io::{BufReader, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

use crate::{
    tsp::Instance,
    wire::{self, Found, FromWorker, ToWorker},
    BnbError,
};

/// A worker started on a granted host.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub master: Vec<SocketAddr>,
    pub cities: usize,
    pub seed: u64,
    /// Each task lasts at least this long (so that demos and tests can watch the job grow).
    pub task_ms: u64,
    /// The master's number for the `rsh` that started us.
    pub launch: Option<u64>,
}

/// Runs a worker process to the master's `quit` (or its loss).
///
/// SIGTERM is ignored: when the broker takes the host back, the job's stream has the
/// `vacate` before the subagent sends SIGTERM, and the master, having handed this worker's
/// task on, tells it to quit; a worker that died at SIGTERM would race that (its dropped
/// connection against the `vacate`). Without a master, SIGKILL at the grace's end ends it.
pub fn run(cfg: &WorkerConfig) -> Result<(), BnbError> {
    // SAFETY: SIG_IGN installs no handler code; no other thread exists yet.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGTERM,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    let member = jel::Client::connect()?.join(Some("worker"))?;
    let stream = connect_any(&cfg.master)?;
    let inst = Instance::random(cfg.cities, cfg.seed);
    let hello = FromWorker::Hello {
        member: Some(member.id()),
        launch: cfg.launch,
        pid: std::process::id(),
        host: Some(member.info().host.clone()),
    };
    serve(stream, hello, &inst, cfg.task_ms);
    let _ = member.leave();
    Ok(())
}

/// The first of `addrs` that answers (the master gives every address it has: which one a
/// granted host reaches depends on the lab).
fn connect_any(addrs: &[SocketAddr]) -> Result<TcpStream, BnbError> {
    let mut last = std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address given");
    for addr in addrs {
        match TcpStream::connect_timeout(addr, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    let addrs = addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    Err(BnbError::Master {
        addrs: addrs.join(","),
        source: last,
    })
}

/// Says `hello`, then answers tasks until the master says `quit` or goes away.
pub fn serve(stream: TcpStream, hello: FromWorker, inst: &Instance, task_ms: u64) {
    let _ = stream.set_nodelay(true);
    let Ok(reader) = stream.try_clone() else {
        return;
    };
    let out = Arc::new(Mutex::new(stream));
    if send(&out, &hello).is_err() {
        return;
    }
    let bound = Arc::new(AtomicU64::new(u64::MAX));
    let quit = Arc::new(AtomicBool::new(false));
    let tasks = read_tasks(reader, bound.clone(), quit.clone());
    for (id, prefix) in tasks {
        let started = Instant::now();
        let found = inst.search(&prefix, &|| bound.load(Ordering::Relaxed), &mut |t| {
            bound.fetch_min(t.cost, Ordering::Relaxed);
            let better = FromWorker::Better {
                cost: t.cost,
                cities: t.cities.clone(),
            };
            let _ = send(&out, &better);
        });
        if quit.load(Ordering::Relaxed) {
            return; // the master handed this task on and said quit: no answer
        }
        let left = Duration::from_millis(task_ms).saturating_sub(started.elapsed());
        std::thread::sleep(left);
        let best = found.map(|t| Found {
            cost: t.cost,
            cities: t.cities,
        });
        if send(&out, &FromWorker::Done { id, best }).is_err() {
            return;
        }
    }
}

/// Reads the master's lines on a thread of their own (a new bound must reach a search that
/// is running): tasks come out of the returned channel; it ends at `quit` or the master's loss,
/// which also set `quit` and a bound of 0, so that a search under way stops at once.
fn read_tasks(
    stream: TcpStream,
    bound: Arc<AtomicU64>,
    quit: Arc<AtomicBool>,
) -> mpsc::Receiver<(usize, Vec<usize>)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        while let Ok(Some(msg)) = wire::read::<ToWorker>(&mut reader) {
            match msg {
                ToWorker::Task {
                    id,
                    prefix,
                    bound: b,
                } => {
                    bound.fetch_min(b, Ordering::Relaxed);
                    if tx.send((id, prefix)).is_err() {
                        return;
                    }
                }
                ToWorker::Bound { cost } => {
                    bound.fetch_min(cost, Ordering::Relaxed);
                }
                ToWorker::Quit => break,
            }
        }
        quit.store(true, Ordering::Relaxed);
        bound.store(0, Ordering::Relaxed);
    });
    rx
}

fn send(out: &Mutex<TcpStream>, msg: &FromWorker) -> std::io::Result<()> {
    let mut s = out.lock().unwrap_or_else(|p| p.into_inner());
    s.write_all(wire::line(msg).as_bytes())
}
