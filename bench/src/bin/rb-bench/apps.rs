//! The "Example applications" section, lab only (root):
//! - the paper's utilization experiment, time-compressed: an adaptive application soaks up
//!   the lab while a sequential job (`rsh anyLinux sleep T`) starts every 100 s / scale,
//!   T uniform in [1, 10] min / scale (seeded); host usage read from the broker's decision
//!   trace with `rb policy replay … --policy paper` (the policy in force, so the replay is the
//!   run). Beside it, the same stream of sequential jobs alone.
//! - each application's speed-up from 1 to 8 lab hosts, and what a `vacate` costs it
//!   ([`speedup`]);
//! - the paper's Figure 7 with a real application: rb-mw holds 13 hosts, a PVM job adds N
//!   ([`figure7`]).

mod figure7;
mod speedup;

use std::{
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use tests::labtier::LabWithBroker;

use crate::policy::{lab_broker, FRONT_END};
use speedup::App;

/// The parts of the section, in the order they run (`--apps-parts`).
pub const PARTS: [&str; 5] = [
    "utilization",
    "speedup",
    "speedup-mw",
    "speedup-jacobi",
    "figure7",
];

/// Options of the section.
pub struct Options {
    /// Time compressions of the utilization experiment (60 = 5 h in 5 min).
    pub scales: Vec<u32>,
    /// Runs of the utilization experiment at each scale: `adaptive` (rb-mw beside the
    /// sequential jobs), `baseline` (the sequential jobs alone); empty = both.
    pub arms: Vec<String>,
    /// Some of [`PARTS`] (`speedup` is rb-bnb's); empty = all.
    pub parts: Vec<String>,
    /// Repetitions of the speed-up and Figure 7 runs.
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
    if let Some(bad) = opts.parts.iter().find(|p| !PARTS.contains(&p.as_str())) {
        anyhow::bail!(
            "--apps-parts: unknown part {bad:?} (one of {})",
            PARTS.join(", ")
        );
    }
    println!("## Example applications (issue 18)\n");
    if !tests::is_root() {
        println!("skipped: needs root (network namespaces)\n");
        return Ok(());
    }
    if opts.wants("utilization") {
        utilization(opts)?;
    }
    for app in App::ALL {
        if opts.wants(app.part()) {
            speedup::speedup(app, opts)?;
        }
    }
    if opts.wants("figure7") {
        figure7::figure7(opts)?;
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
            let arm = if adaptive { "adaptive" } else { "baseline" };
            if !opts.arms.is_empty() && !opts.arms.iter().any(|a| a == arm) {
                continue;
            }
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

/// The most tasks `rb-mw --tasks` takes.
const MW_MAX_TASKS: f64 = 100_000.0;

/// `--tasks` and `--task-ms` for rb-mw to have twice the work a run of `length_s` on the
/// lab's hosts can do: 200 ms tasks, longer when that many would pass rb-mw's limit.
fn mw_work(length_s: f64) -> (u64, u64) {
    let wanted = |task_ms: f64| 2.0 * length_s * LAB_HOSTS as f64 * 1000.0 / task_ms;
    let task_ms = (200.0 * (wanted(200.0) / MW_MAX_TASKS).ceil()).max(200.0);
    (wanted(task_ms).ceil() as u64, task_ms as u64)
}

fn one_utilization_run(scale: u32, adaptive: bool) -> anyhow::Result<UsageRow> {
    let env = new_lab()?;
    let scale_f = f64::from(scale);
    let log = tempfile::NamedTempFile::new()?;
    let mut adaptive_job = if adaptive {
        let mw = tests::bin("rb-mw").display().to_string();
        let (tasks, task_ms) = mw_work(RUN_S / scale_f);
        let (tasks, task_ms) = (tasks.to_string(), task_ms.to_string());
        let app = [
            mw.as_str(),
            "--primes-below",
            "100000000",
            "--tasks",
            &tasks,
            "--task-ms",
            &task_ms,
        ];
        let mut cmd = env.agent_as_user(FRONT_END, &["--rsl", "(adaptive=yes)"], &app);
        Some(cmd.stdout(Stdio::null()).stderr(log.reopen()?).spawn()?)
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
    // The adaptive job must have lasted the run: one that ended early (a bad flag, a
    // crash) would make the row a second baseline.
    if let Some(job) = adaptive_job.as_mut() {
        if let Some(status) = job.try_wait()? {
            let said = std::fs::read_to_string(log.path()).unwrap_or_default();
            let tail: Vec<&str> = said.lines().rev().take(10).collect();
            anyhow::bail!(
                "rb-mw ended before the run did ({status}); its last lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
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

#[cfg(test)]
mod work_tests {
    use super::*;

    /// rb-mw refuses more than 100 000 tasks: every scale's run stays within it, with
    /// twice the work the run can do.
    #[test]
    fn rb_mw_gets_enough_work_within_its_task_limit() {
        for scale in [1.0, 10.0, 60.0] {
            let length_s = RUN_S / scale;
            let (tasks, task_ms) = mw_work(length_s);
            assert!(tasks as f64 <= MW_MAX_TASKS, "scale {scale}: {tasks}");
            let can_do = length_s * LAB_HOSTS as f64 * 1000.0 / task_ms as f64;
            assert!(
                tasks as f64 >= 2.0 * can_do - 1.0,
                "scale {scale}: {tasks} < 2 × {can_do}"
            );
        }
        assert_eq!(mw_work(300.0), (24_000, 200), "60×: as before");
    }
}
