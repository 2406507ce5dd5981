//! `rb-corecost [--hosts N] [--rounds R] [--quiet] [--whole-reports] [--no-trace]
//! [--name-order]`: the broker's core alone, taking host reports as the host daemons' thread
//! hands them over (runs of events, no sockets, no parsing): N hosts of a lab under the
//! paper policy connect and report once, then each reports R times more, changing as
//! `rb-loadgen --changing` reports do (as what changed, read as the sessions read it from a
//! daemon that sends it; `--whole-reports`: whole, as from a daemon that predates that), or
//! (`--quiet`) repeating the last one, as the sessions pass on a report whose text repeats. Each round hands the hosts over in an order of its own, as their connections
//! come ready in the broker (a shuffle from a fixed seed: the same orders in every run);
//! `--name-order` hands them over in name order, the order of the core's own tables, whose
//! next record is then at hand in the processor's caches as it would not be in a lab.
//! The decision trace is written as the broker's defaults write it (8 MiB files, 8 kept) to a
//! temporary directory, unless `--no-trace`.
//!
//! Prints the core's wall time and the process's CPU time per report over the R rounds (the
//! trace writer's thread included; every round's reports are built before the timing
//! starts, so this harness only hands them over while it runs).
//! Both move with this machine (±30 % between runs of the same build were seen); for a
//! comparison of two builds, run it under `valgrind --tool=callgrind`: the instruction
//! counts of `broker::core::run` and below are the same from run to run.
//!
//! Not a test: nothing here asserts a speed.

use std::{
    collections::HashMap,
    path::Path,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use anyhow::Context;
use bench::report_shape::{report, Shape};
use broker::{
    alloc::{AllocConfig, Allocator, TraceClock},
    core::{self, Event, EventSender, Reported},
    host_words::WordSender,
    hosts::HostTable,
    jobs::JobDesk,
    supervisor::SupervisorSet,
    trace::{TraceSink, TraceStats},
};
use clap::Parser;
use config::HostEntry;
use proto::report_changes;
use tokio::sync::{oneshot, watch};

#[derive(Debug, Parser)]
#[command(name = "rb-corecost")]
struct Args {
    /// Hosts in the lab, named `load00001`…
    #[arg(long, default_value_t = 10_000)]
    hosts: usize,
    /// Reports of every host after the first, timed.
    #[arg(long, default_value_t = 5)]
    rounds: u64,
    /// Each report repeats the host's last one (as `rb-loadgen` without `--changing`).
    #[arg(long)]
    quiet: bool,
    /// Changing reports handed over whole (from daemons that do not send what changed).
    #[arg(long)]
    whole_reports: bool,
    /// No decision trace (as `trace_files_kept = 0`).
    #[arg(long)]
    no_trace: bool,
    /// Reports without their host's row in the table (each host found by its name, as the
    /// broker's sessions handed them over before session 39).
    #[arg(long)]
    by_name: bool,
    /// Every round in name order instead of a shuffled one.
    #[arg(long)]
    name_order: bool,
}

/// The seed of the rounds' orders: the same orders in every run, so that counts repeat.
const ORDER_SEED: u64 = 34;

/// rb-broker's allocator, with its options (broker/src/main.rs): the core's cost is much
/// that of allocating and freeing each report's strings.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[used]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: &[u8; 10] = b"narenas:1\0";

/// The host whose daemon connects again after each round: the core sets its word when it
/// takes the connection, after every event sent before it.
const MARKER: &str = "marker";

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let trace_dir = tempfile::tempdir().context("a directory for the trace")?;
    let mut lab = Lab::start(&args, trace_dir.path())?;
    let shape = Shape {
        changing: !args.quiet,
        interval: Duration::from_secs(1),
    };
    lab.connect_all()?;
    lab.send(
        lab.names
            .iter()
            .map(|n| report_event(n, None, 1, shape))
            .collect(),
    )?;
    lab.wait_for_core()?;
    let rows = lab.rows(args.by_name);
    let rounds = rounds_of_events(&lab.names, &rows, &args, shape);
    let (wall, cpu) = (Instant::now(), process_cpu());
    for events in rounds {
        lab.send(events)?;
    }
    lab.wait_for_core()?;
    let reports = (args.hosts as u64 * args.rounds).max(1) as f64;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / reports;
    println!(
        "{} hosts, {} rounds of {} reports{}{}: core {:.2} µs of wall time a report, process CPU {:.2} µs a report{}",
        args.hosts,
        args.rounds,
        if args.quiet { "repeated" } else { "changing" },
        if args.whole_reports && !args.quiet { " sent whole" } else { "" },
        if args.name_order { " in name order" } else { "" },
        per(wall.elapsed()),
        per(process_cpu().saturating_sub(cpu)),
        match &lab.trace {
            None => " (no trace)".to_string(),
            Some(stats) => format!(
                "; trace lines dropped: {}",
                stats.dropped.load(Ordering::Relaxed)
            ),
        },
    );
    lab.stop();
    Ok(())
}

/// Every timed round's events, built before the timing starts: encoding and reading back
/// what changed costs about what the core's handling does, and built while the core ran
/// (one arena, two cores) it was timed with the core's.
fn rounds_of_events(
    names: &[String],
    rows: &HashMap<String, u32>,
    args: &Args,
    shape: Shape,
) -> Vec<Vec<Event>> {
    let mut rng = fastrand::Rng::with_seed(ORDER_SEED);
    let mut order: Vec<&String> = names.iter().collect();
    (2..2 + args.rounds)
        .map(|seq| {
            if !args.name_order {
                rng.shuffle(&mut order);
            }
            let row = |n: &str| rows.get(n).copied();
            match (args.quiet, args.whole_reports) {
                (true, _) => order.iter().map(|n| same_event(n, row(n), seq)).collect(),
                (false, true) => order
                    .iter()
                    .map(|n| report_event(n, row(n), seq, shape))
                    .collect(),
                (false, false) => order
                    .iter()
                    .map(|n| changes_event(n, row(n), seq, shape))
                    .collect(),
            }
        })
        .collect()
}

/// A core running on a thread of its own, as the broker's, and the lab's hosts.
struct Lab {
    events: EventSender,
    stop: watch::Sender<bool>,
    core: std::thread::JoinHandle<()>,
    names: Vec<String>,
    /// The trace writer's counts (lines dropped when its queue is full).
    trace: Option<Arc<TraceStats>>,
    /// Each connection's end, kept open while the core runs.
    closes: Vec<oneshot::Receiver<String>>,
    /// Where each host's session hears from the core (its row in the table among it).
    words: Vec<(String, WordSender)>,
    next_conn: u64,
    waiter: tokio::runtime::Runtime,
}

impl Lab {
    fn start(args: &Args, trace_dir: &Path) -> anyhow::Result<Lab> {
        let names: Vec<String> = (1..=args.hosts).map(|i| format!("load{i:05}")).collect();
        let entries: Vec<HostEntry> = names
            .iter()
            .chain(std::iter::once(&MARKER.to_string()))
            .enumerate()
            .map(|(i, name)| HostEntry {
                name: name.clone(),
                address: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                labels: vec!["linux".into(), "x86_64".into()],
                owner: None,
            })
            .collect();
        // Silence is never reached: a round may take seconds under valgrind.
        let table = HostTable::new(&entries, Duration::from_secs(3600));
        let now = Instant::now();
        let mut alloc = Allocator::with_config(AllocConfig::default());
        alloc.set_wall_clock(now, 0, 0);
        let desk = JobDesk::new(alloc, vec!["ssh".into()], "manual", Path::new("/no/secret"));
        let (desk, trace) = match args.no_trace {
            true => (desk, None),
            false => {
                let sink = TraceSink::spawn(
                    trace_dir.to_path_buf(),
                    config::DEFAULT_TRACE_FILE_MAX_KIB * 1024,
                    config::DEFAULT_TRACE_FILES_KEPT,
                    TraceClock::new(now, 0),
                    "corecost".into(),
                )?;
                let stats = sink.stats().clone();
                (desk.with_trace(sink), Some(stats))
            }
        };
        let (events, queues) = core::channel(64);
        let (stop, stopped) = watch::channel(false);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let core = std::thread::Builder::new()
            .name("rb-core".into())
            .spawn(move || {
                let supervisors = SupervisorSet::default();
                runtime.block_on(core::run(table, desk, queues, supervisors, stopped));
            })?;
        Ok(Lab {
            events,
            stop,
            core,
            names,
            trace,
            closes: Vec::new(),
            words: Vec::new(),
            next_conn: 1,
            waiter: tokio::runtime::Builder::new_current_thread().build()?,
        })
    }

    /// A daemon connection for `host`; returns where the core tells it of its host.
    fn connected(&mut self, host: &str) -> (Event, WordSender) {
        let (close, closed) = oneshot::channel();
        self.closes.push(closed);
        let word = WordSender::default();
        let conn = self.next_conn;
        self.next_conn += 1;
        let event = Event::HostdConnected {
            host: host.to_string(),
            conn,
            close,
            word: word.clone(),
        };
        (event, word)
    }

    /// Every host's daemon connects, on connection `i` for host `i`.
    fn connect_all(&mut self) -> anyhow::Result<()> {
        let names = self.names.clone();
        let mut events = Vec::new();
        for name in names {
            let (event, word) = self.connected(&name);
            events.push(event);
            self.words.push((name, word));
        }
        self.send(events)
    }

    /// Each host's row as the core told its session, for its reports to hand over as a
    /// session does (none `by_name`).
    fn rows(&self, by_name: bool) -> HashMap<String, u32> {
        let rows = self.words.iter().filter(|_| !by_name);
        rows.filter_map(|(name, word)| Some((name.clone(), word.row()?)))
            .collect()
    }

    fn send(&self, events: Vec<Event>) -> anyhow::Result<()> {
        self.events
            .blocking_send_all(events)
            .map_err(|_| anyhow::anyhow!("the core stopped"))
    }

    /// Returns once the core took every event sent before.
    fn wait_for_core(&mut self) -> anyhow::Result<()> {
        let (event, word) = self.connected(MARKER);
        self.send(vec![event])?;
        self.waiter.block_on(word.next());
        Ok(())
    }

    fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.core.join();
    }
}

/// Host `name`'s report number `seq` (connection `i + 1` for the `i`th host).
fn report_event(name: &str, row: Option<u32>, seq: u64, shape: Shape) -> Event {
    let mut report = report(name, seq, shape);
    let allocs_running = report.allocs_running.take();
    Event::Report {
        host: name.to_string(),
        conn: conn_of(name),
        row,
        report: Reported::Whole(Box::new(report)),
        allocs_running,
    }
}

/// Host `name`'s report number `seq` as what changed since its last, as a session hands it
/// over (`proto::repeats`): the allocations running apart, the last known when not named.
fn changes_event(name: &str, row: Option<u32>, seq: u64, shape: Shape) -> Event {
    let (last, new) = (report(name, seq - 1, shape), report(name, seq, shape));
    let text = report_changes::encode(&last, &new).expect("a report encodes");
    let mut patch = report_changes::parse(&text).expect("what changed reads back");
    if patch.fields().is_empty() {
        return same_event(name, row, seq);
    }
    let allocs_running = patch
        .take_allocs_running()
        .unwrap_or_else(|| last.allocs_running.clone());
    Event::Report {
        host: name.to_string(),
        conn: conn_of(name),
        row,
        report: Reported::Changes(Box::new(patch)),
        allocs_running,
    }
}

/// Host `name`'s report number `seq`, the same text as its last but for the counter.
fn same_event(name: &str, row: Option<u32>, seq: u64) -> Event {
    Event::Report {
        host: name.to_string(),
        conn: conn_of(name),
        row,
        report: Reported::Same { seq },
        allocs_running: Some(Vec::new()),
    }
}

/// The connection [`Lab::connect_all`] gave host `load#####`.
fn conn_of(name: &str) -> u64 {
    name.trim_start_matches("load").parse().unwrap_or(0)
}

/// This process's CPU time so far (every thread's), to the microsecond: `procstat`'s
/// /proc ticks are 10 ms, a tenth of a run of repeated reports.
fn process_cpu() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF);
    usage.map_or(Duration::ZERO, |u| {
        let tv = |t: nix::sys::time::TimeVal| {
            Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000)
        };
        tv(u.user_time()) + tv(u.system_time())
    })
}
