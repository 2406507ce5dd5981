//! Each example application's speed-up from 1 to 8 lab hosts, and what a `vacate` costs it
//! (the run's wall time, and the work handed on at the vacate): parts `speedup` (rb-bnb),
//! `speedup-mw` (rb-mw) and `speedup-jacobi` (jacobi.py).

use std::time::{Duration, Instant};

use bench::stats::{summarize, Summary};
use tests::{
    apps::{AppLog, JACOBI, RB_BNB, RB_MW},
    labtier::LabWithBroker,
    wait_until,
};

use super::{down, new_lab, Options, LAB_HOSTS};
use crate::policy::FRONT_END;

/// An example application as the speed-up runs start it: workers only on granted hosts,
/// at most N of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum App {
    Bnb,
    Mw,
    Jacobi,
}

/// rb-mw's problem: the primes below this, in [`MW_TASKS`] tasks.
const MW_N: usize = 100_000_000;
const MW_TASKS: usize = 96;
/// jacobi.py's problem: unknowns, blocks (one worker each at most), tolerance.
const JACOBI_N: usize = 2000;
const JACOBI_BLOCKS: usize = 8;
const JACOBI_TOL: f64 = 1e-10;

impl App {
    pub(super) const ALL: [App; 3] = [App::Bnb, App::Mw, App::Jacobi];

    /// Its `--apps-parts` name.
    pub(super) fn part(self) -> &'static str {
        match self {
            App::Bnb => "speedup",
            App::Mw => "speedup-mw",
            App::Jacobi => "speedup-jacobi",
        }
    }

    fn name(self) -> &'static str {
        match self {
            App::Bnb => "rb-bnb",
            App::Mw => "rb-mw",
            App::Jacobi => "jacobi.py",
        }
    }

    /// The problem, as the section's text names it.
    fn problem(self) -> String {
        match self {
            App::Bnb => "`rb-bnb --cities 12 --seed 1 --local-workers 0`".into(),
            App::Mw => format!("`rb-mw --primes-below {MW_N} --tasks {MW_TASKS}`"),
            App::Jacobi => format!(
                "`jacobi.py --n {JACOBI_N} --blocks {JACOBI_BLOCKS} --tol {JACOBI_TOL:e} \
                 --local-workers 0` (asynchronous: the block updates it needs vary from run to run)"
            ),
        }
    }

    /// How its log names the hosts its workers are handed work on.
    fn log(self) -> AppLog {
        match self {
            App::Bnb => RB_BNB,
            App::Mw => RB_MW,
            App::Jacobi => JACOBI,
        }
    }

    /// What the vacate hands on, as the table names it.
    fn work(self) -> &'static str {
        match self {
            App::Bnb => "tasks handed out again at a vacate",
            App::Mw => "tasks re-queued at a vacate",
            App::Jacobi => "blocks freed at a vacate",
        }
    }

    /// The job's words after `agent`'s options: at most `n` workers, each task at least
    /// `task_ms` ms.
    fn argv(self, n: usize, task_ms: u32) -> Vec<String> {
        let (n, ms) = (n.to_string(), task_ms.to_string());
        let words: Vec<String> = match self {
            App::Bnb => [
                tests::bin("rb-bnb").display().to_string(),
                "--cities".into(),
                "12".into(),
                "--seed".into(),
                "1".into(),
                "--local-workers".into(),
                "0".into(),
            ]
            .into(),
            App::Mw => [
                tests::bin("rb-mw").display().to_string(),
                "--primes-below".into(),
                MW_N.to_string(),
                "--tasks".into(),
                MW_TASKS.to_string(),
            ]
            .into(),
            App::Jacobi => {
                let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../examples/jacobi/jacobi.py");
                [
                    "python3".into(),
                    script.display().to_string(),
                    "--n".into(),
                    JACOBI_N.to_string(),
                    "--blocks".into(),
                    JACOBI_BLOCKS.to_string(),
                    "--tol".into(),
                    format!("{JACOBI_TOL:e}"),
                    "--local-workers".into(),
                    "0".into(),
                    "--verbose".into(), // the blocks handed out, for the vacate runs
                ]
                .into()
            }
        };
        let limits = ["--max-workers".to_string(), n, "--task-ms".into(), ms];
        words.into_iter().chain(limits).collect()
    }

    /// Whether the answer on stdout's last line is right (rb-mw: against a sieve here;
    /// jacobi.py: its residual under the tolerance; rb-bnb: a tour).
    fn check(self, stdout: &str) -> anyhow::Result<()> {
        let last = stdout.lines().last().unwrap_or_default();
        let right = match self {
            App::Bnb => last.starts_with("tour="),
            App::Mw => tests::mw::answer(stdout) == Some(tests::mw::primes_below(MW_N)),
            App::Jacobi => last
                .strip_prefix("residual=")
                .and_then(|r| r.split(' ').next()?.parse::<f64>().ok())
                .is_some_and(|r| r < JACOBI_TOL),
        };
        anyhow::ensure!(right, "{}: a wrong answer: {last}", self.name());
        Ok(())
    }
}

pub(super) fn speedup(app: App, opts: &Options) -> anyhow::Result<()> {
    println!(
        "### {}: speed-up from 1 to {LAB_HOSTS} lab hosts, and what a vacate costs\n",
        app.name()
    );
    println!(
        "{} as an adaptive job on the front end, workers only on granted lab hosts \
         (`--max-workers N`), jobs over rsh. Two kinds of task: CPU-bound (the work alone: \
         this machine has {} cores, so the lab's hosts share them and the speed-up stops \
         there) and latency-bound (`--task-ms 50`: each task lasts at least 50 ms, as when a \
         worker waits on I/O or a slower machine; the speed-up shows what the broker, the \
         agent and JEL let the job reach). Wall time of the whole job (agent start to exit), \
         median of {} (min–max); every answer checked. Vacate: the same latency-bound run on \
         {LAB_HOSTS} hosts with one host released (`rb release HOST --grace-s 2`) as soon as \
         the log shows a worker there handed work: \
         the work handed on at the `vacate` (redone), and the time lost.\n",
        app.problem(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        opts.reps
    );
    let env = new_lab()?;
    println!("| tasks | N = 1 | N = 2 | N = 4 | N = 8 | speed-up at 8 |");
    println!("|---|---|---|---|---|---:|");
    for (label, task_ms) in [("CPU-bound", 0), ("latency-bound (≥ 50 ms)", 50)] {
        let mut row = Vec::new();
        for n in [1, 2, 4, LAB_HOSTS] {
            row.push(time_app(&env, app, n, task_ms, opts.reps, false)?.0);
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
    let (plain, _) = time_app(&env, app, LAB_HOSTS, 50, opts.reps, false)?;
    let (vacated, again) = time_app(&env, app, LAB_HOSTS, 50, opts.reps, true)?;
    println!(
        "| run on {LAB_HOSTS} hosts, latency-bound | wall time | {} |",
        app.work()
    );
    println!("|---|---|---|");
    println!("| no vacate (baseline) | {} | - |", show_s(plain));
    println!(
        "| one working host released | {} | {again} |",
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

/// Times `reps` runs of `app` on `n` hosts; with `release`, one held host is released once
/// the job holds all `n`. Returns the wall times (ms) and the median of the work handed on at a vacate.
fn time_app(
    env: &LabWithBroker,
    app: App,
    n: usize,
    task_ms: u32,
    reps: usize,
    release: bool,
) -> anyhow::Result<(Option<Summary>, String)> {
    let words = app.argv(n, task_ms);
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let mut times = Vec::new();
    let mut again = Vec::new();
    for _ in 0..reps {
        let dir = tempfile::tempdir()?;
        let (out_file, err_file) = (dir.path().join("stdout"), dir.path().join("stderr"));
        let t0 = Instant::now();
        let mut child = env
            .agent_as_user(FRONT_END, &["--rsl", "(adaptive=yes)"], &words)
            .stdout(std::fs::File::create(&out_file)?)
            .stderr(std::fs::File::create(&err_file)?)
            .spawn()?;
        if release {
            release_a_working_host(env, &mut child, app, &err_file);
        }
        let status = child.wait()?;
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        let out = std::process::Output {
            status,
            stdout: std::fs::read(&out_file)?,
            stderr: std::fs::read(&err_file)?,
        };
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(out.status.success(), "{} failed: {err}", app.name());
        app.check(&String::from_utf8_lossy(&out.stdout))?;
        times.push(ms);
        if let Some(k) = count_before(&err, " at a vacate") {
            again.push(k as f64);
        }
    }
    let again = summarize(&again).map_or("-".into(), |s| format!("{:.0}", s.median));
    Ok((summarize(&times), again))
}

/// Releases (`rb release HOST --grace-s 2`) the first lab host whose worker the
/// application's log (`log`, its stderr so far) shows handed work: mid-run, while that
/// worker holds work. Nothing if the job ends first.
fn release_a_working_host(
    env: &LabWithBroker,
    child: &mut std::process::Child,
    app: App,
    log: &std::path::Path,
) {
    let host = wait_until(Duration::from_secs(30), || {
        if child.try_wait().ok().flatten().is_some() {
            return Some(None);
        }
        let text = std::fs::read_to_string(log).unwrap_or_default();
        app.log().work_hosts(&text).into_iter().next().map(Some)
    });
    if let Some(Some(host)) = host {
        let _ = env.broker.rb(&["release", &host, "--grace-s", "2"]);
    }
}

/// The number just before `what` in the application's summary line.
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
