//! The "Example applications" section (issue 18, "Experiments"), lab only (root):
//! - the paper's utilization experiment, time-compressed: an adaptive application soaks up
//!   the lab while a sequential job (`rsh anyLinux sleep T`) starts every 100 s / scale,
//!   T uniform in [1, 10] min / scale (seeded); host usage read from the broker's decision
//!   trace with `rb policy replay … --policy paper` (the policy in force, so the replay is the
//!   run). Beside it, the same stream of sequential jobs alone.
//! - rb-bnb's speed-up from 1 to 8 lab hosts, and what a `vacate` costs it.

use std::{
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use bench::stats::{summarize, Summary};
use tests::{labtier::LabWithBroker, wait_until};

use crate::policy::{lab_broker, FRONT_END};

/// Options of the section.
pub struct Options {
    /// Time compressions of the utilization experiment (60 = 5 h in 5 min).
    pub scales: Vec<u32>,
    /// `utilization`, `speedup`; empty = all.
    pub parts: Vec<String>,
    /// Repetitions of the speed-up runs.
    pub reps: usize,
}

impl Options {
    fn wants(&self, part: &str) -> bool {
        self.parts.is_empty() || self.parts.iter().any(|p| p == part)
    }
}

/// Managed lab hosts (node03…node10) beside the front end (node02).
const LAB_HOSTS: usize = 8;
/// The paper's run: 5 h, a sequential job every 100 s, each 1–10 min.
const RUN_S: f64 = 5.0 * 3600.0;
const EVERY_S: f64 = 100.0;
const SHORTEST_S: f64 = 60.0;
const LONGEST_S: f64 = 600.0;

pub fn run(opts: &Options) -> anyhow::Result<()> {
    println!("## Example applications (issue 18)\n");
    if !tests::is_root() {
        println!("skipped: needs root (network namespaces)\n");
        return Ok(());
    }
    if opts.wants("utilization") {
        utilization(opts)?;
    }
    if opts.wants("speedup") {
        speedup(opts)?;
    }
    Ok(())
}

fn new_lab() -> anyhow::Result<LabWithBroker> {
    let spec = lab::LabSpec {
        hosts: LAB_HOSTS + 1,
        rsh: true,
        ..lab::LabSpec::default()
    };
    let lab = lab::Lab::up(&spec).map_err(|e| anyhow::anyhow!("lab up: {e}"))?;
    Ok(lab_broker(lab, "rsh", &[]))
}

fn down(env: LabWithBroker) -> anyhow::Result<()> {
    let LabWithBroker { broker, lab } = env;
    drop(broker);
    lab.down().map_err(|e| anyhow::anyhow!("lab down: {e}"))
}

fn utilization(opts: &Options) -> anyhow::Result<()> {
    println!("### Utilization beside sequential jobs (the paper's last experiment, lab)\n");
    println!(
        "{LAB_HOSTS} managed lab hosts (node03–node10; node02 is the lab user's front end), jobs \
         over rsh, `[broker] policy = \"paper\"`. `rb-mw` (adaptive, it keeps asking for hosts \
         while tasks wait) starts first; then a sequential job, `agent sh -c 'rsh anyLinux sleep \
         T'`, starts every {EVERY_S} s / scale with T uniform in [{}, {}] min / scale (seeded: \
         every run the same stream). The paper ran 5 h at scale 1. Host usage from the broker's \
         decision trace (`rb policy replay STATE_DIR/trace --policy paper.toml`: the policy in \
         force, so the replay is the run): held = host-seconds held by some job over all \
         host-seconds; idle = host-seconds a host was free while some request waited, over \
         all host-seconds (goal < 0.5 %; paper: idle < 1 % over 5 h). The trace covers the run \
         from the broker's start (the lab's few seconds of start-up included).\n",
        SHORTEST_S / 60.0,
        LONGEST_S / 60.0
    );
    println!("| run | scale | length | sequential jobs | held | idle while a job waited |");
    println!("|---|---:|---:|---:|---:|---:|");
    for &scale in &opts.scales {
        for adaptive in [true, false] {
            let row = one_utilization_run(scale, adaptive)?;
            let label = if adaptive {
                "rb-mw beside the sequential jobs"
            } else {
                "sequential jobs alone (baseline)"
            };
            println!(
                "| {label} | {scale}× | {:.0} s | {} | {:.2} % | {:.3} % |",
                RUN_S / f64::from(scale),
                row.jobs,
                row.held_pct,
                row.idle_pct
            );
        }
    }
    println!();
    Ok(())
}

struct UsageRow {
    jobs: usize,
    held_pct: f64,
    idle_pct: f64,
}

/// A tiny seeded generator (xorshift64*): the same stream of job lengths in every run.
struct Lengths(u64);

impl Lengths {
    fn next_s(&mut self, scale: f64) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        let u = r as f64 / (1u64 << 53) as f64;
        (SHORTEST_S + u * (LONGEST_S - SHORTEST_S)) / scale
    }
}

fn one_utilization_run(scale: u32, adaptive: bool) -> anyhow::Result<UsageRow> {
    let env = new_lab()?;
    let scale_f = f64::from(scale);
    let mut adaptive_job = if adaptive {
        let mw = tests::bin("rb-mw").display().to_string();
        // More work than the run lasts: 8 hosts × the run's length in 200 ms tasks.
        let tasks = ((RUN_S / scale_f) * 5.0 * LAB_HOSTS as f64 * 2.0) as u64;
        let app = [
            mw.as_str(),
            "--primes-below",
            "100000000",
            "--tasks",
            &tasks.to_string(),
            "--task-ms",
            "200",
        ];
        let mut cmd = env.agent_as_user(FRONT_END, &["--rsl", "(adaptive=yes)"], &app);
        Some(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?)
    } else {
        None
    };
    let started = Instant::now();
    let length = Duration::from_secs_f64(RUN_S / scale_f);
    let mut lengths = Lengths(0x5eed_0018);
    let mut jobs: Vec<Child> = Vec::new();
    let mut next = Duration::ZERO;
    while started.elapsed() < length {
        if started.elapsed() >= next {
            let t = format!("{:.2}", lengths.next_s(scale_f));
            let script = format!("rsh anyLinux sleep {t}");
            let job = env
                .agent_as_user(FRONT_END, &[], &["sh", "-c", &script])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            jobs.push(job);
            next += Duration::from_secs_f64(EVERY_S / scale_f);
        }
        std::thread::sleep(Duration::from_millis(20));
        jobs.retain_mut(|j| !matches!(j.try_wait(), Ok(Some(_))));
    }
    let count = (RUN_S / EVERY_S).ceil() as usize;
    let usage = replay_usage(&env.broker.state_dir().join("trace"));
    for mut job in jobs.into_iter().chain(adaptive_job.take()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(job.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = job.wait();
    }
    down(env)?;
    let (held_pct, idle_pct) = usage?;
    Ok(UsageRow {
        jobs: count,
        held_pct,
        idle_pct,
    })
}

fn paper_policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/paper.toml")
}

/// (held %, idle %) from `rb policy replay DIR --policy paper.toml`'s usage line.
fn replay_usage(dir: &Path) -> anyhow::Result<(f64, f64)> {
    let out = std::process::Command::new(tests::bin("rb"))
        .args(["policy", "replay"])
        .arg(dir)
        .arg("--policy")
        .arg(paper_policy())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("usage: "))
        .ok_or_else(|| anyhow::anyhow!("no usage line from rb policy replay: {text}"))?;
    let pct = |before: &str| -> Option<f64> {
        let (_, rest) = line.split_once(before)?;
        rest.split('%').next()?.trim().parse().ok()
    };
    let held = pct(" held (").ok_or_else(|| anyhow::anyhow!("{line}"))?;
    let idle = pct("(idle ").ok_or_else(|| anyhow::anyhow!("{line}"))?;
    Ok((held, idle))
}

fn speedup(opts: &Options) -> anyhow::Result<()> {
    println!("### rb-bnb: speed-up from 1 to {LAB_HOSTS} lab hosts, and what a vacate costs\n");
    println!(
        "`rb-bnb --cities 12 --seed 1` as an adaptive job on the front end, workers only on \
         granted lab hosts (`--local-workers 0 --max-workers N`), jobs over rsh. Two kinds of \
         task: CPU-bound (the search alone: this machine has {} cores, so the lab's hosts share \
         them and the speed-up stops there) and latency-bound (`--task-ms 50`: each task lasts \
         at least 50 ms, as when a worker waits on I/O or a slower machine; the speed-up shows \
         what the broker, the agent and JEL let the job reach). Wall time of the whole job \
         (agent start to exit), median of {} (min–max). Vacate: the same latency-bound run on 8 \
         hosts with one host released (`rb release HOST --grace-s 2`) after 1 s: tasks handed \
         out again at the `vacate`, and the time lost.\n",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        opts.reps
    );
    let env = new_lab()?;
    println!("| tasks | N = 1 | N = 2 | N = 4 | N = 8 | speed-up at 8 |");
    println!("|---|---|---|---|---|---:|");
    for (label, task_ms) in [("CPU-bound", 0), ("latency-bound (≥ 50 ms)", 50)] {
        let mut row = Vec::new();
        for n in [1, 2, 4, LAB_HOSTS] {
            row.push(time_bnb(&env, n, task_ms, opts.reps, false)?.0);
        }
        let speedup = match (row.first(), row.last()) {
            (Some(Some(a)), Some(Some(b))) if b.median > 0.0 => {
                format!("{:.1}×", a.median / b.median)
            }
            _ => "-".into(),
        };
        let cells: Vec<String> = row.iter().map(|s| show_s(*s)).collect();
        println!("| {label} | {} | {speedup} |", cells.join(" | "));
    }
    println!();
    let (plain, _) = time_bnb(&env, LAB_HOSTS, 50, opts.reps, false)?;
    let (vacated, again) = time_bnb(&env, LAB_HOSTS, 50, opts.reps, true)?;
    println!("| run on {LAB_HOSTS} hosts, latency-bound | wall time | tasks handed out again at a vacate |");
    println!("|---|---|---|");
    println!("| no vacate (baseline) | {} | - |", show_s(plain));
    println!(
        "| one host released after 1 s | {} | {again} |",
        show_s(vacated)
    );
    println!();
    down(env)
}

fn show_s(s: Option<Summary>) -> String {
    s.map_or("-".into(), |s| {
        format!(
            "{:.2} s ({:.2}–{:.2})",
            s.median / 1000.0,
            s.min / 1000.0,
            s.max / 1000.0
        )
    })
}

/// Times `reps` runs of rb-bnb on `n` hosts; with `release`, one held host is released 1 s
/// in. Returns the wall times (ms) and the median of the tasks handed on at a vacate.
fn time_bnb(
    env: &LabWithBroker,
    n: usize,
    task_ms: u32,
    reps: usize,
    release: bool,
) -> anyhow::Result<(Option<Summary>, String)> {
    let bnb = tests::bin("rb-bnb").display().to_string();
    let (n_s, ms) = (n.to_string(), task_ms.to_string());
    let app = [
        bnb.as_str(),
        "--cities",
        "12",
        "--seed",
        "1",
        "--local-workers",
        "0",
        "--max-workers",
        &n_s,
        "--task-ms",
        &ms,
    ];
    let mut times = Vec::new();
    let mut again = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        let child = env
            .agent_as_user(FRONT_END, &["--rsl", "(adaptive=yes)"], &app)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        if release {
            std::thread::sleep(Duration::from_secs(1));
            let held = wait_until(Duration::from_secs(10), || {
                env.broker.held_hosts().into_iter().next()
            });
            if let Some(host) = held {
                let _ = env.broker.rb(&["release", &host, "--grace-s", "2"]);
            }
        }
        let out = child.wait_with_output()?;
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(out.status.success(), "rb-bnb failed: {err}");
        times.push(ms);
        if let Some(k) = count_before(&err, " at a vacate") {
            again.push(k as f64);
        }
    }
    let again = summarize(&again).map_or("-".into(), |s| format!("{:.0}", s.median));
    Ok((summarize(&times), again))
}

/// The number just before `what` in rb-bnb's summary line.
fn count_before(stderr: &str, what: &str) -> Option<usize> {
    let line = stderr.lines().find(|l| l.contains(what))?;
    let before = &line[..line.find(what)?];
    before
        .split_whitespace()
        .last()?
        .trim_start_matches('(')
        .parse()
        .ok()
}
