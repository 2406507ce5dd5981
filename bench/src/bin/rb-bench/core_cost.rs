//! The policy section's `core` part: what one host report costs the broker's core alone
//! (`rb-corecost`: the real core, reports handed over as the host daemons' thread does, no
//! sockets or parsing), in time and, where valgrind is installed, in instructions counted
//! by callgrind, which repeat from run to run where this machine's timings move by tens
//! of percent. Beside an `rb-corecost` of another build when one is given.

use std::{path::Path, process::Command};

use bench::stats::summarize;

/// Timed runs of each row (medians shown).
const RUNS: usize = 3;
/// Hosts and timed rounds of every run (100k reports).
const HOSTS: usize = 10_000;
const ROUNDS: u64 = 10;
/// Rounds of the callgrind runs: the difference between a run of these and one of none
/// is their reports' count (the lab's start left out).
const COUNTED_ROUNDS: u64 = 3;

/// The rows: which reports, with the decision trace or not.
const ROWS: [(&str, &[&str]); 6] = [
    ("every report changing", &[]),
    ("every report changing, no trace", &["--no-trace"]),
    (
        "every report changing, sent whole, no trace",
        &["--whole-reports", "--no-trace"],
    ),
    (
        "every report changing, no trace, in name order",
        &["--no-trace", "--name-order"],
    ),
    ("repeating (quiet)", &["--quiet"]),
    ("repeating (quiet), no trace", &["--quiet", "--no-trace"]),
];

pub fn run(compared: Option<&(String, std::path::PathBuf)>) -> anyhow::Result<()> {
    println!("### The core's cost per report (`rb-corecost`)\n");
    println!(
        "`rb-corecost --hosts {HOSTS} --rounds {ROUNDS}`: the broker's core (`core::run` on a \
         thread of its own, the paper policy, jemalloc as the broker's) handed every host's \
         report {ROUNDS} times after the lab's start, in runs of events as the host daemons' \
         thread hands them over (a changing report as what changed, read as a session reads \
         it from today's daemons; `sent whole`: as from a daemon that sends whole reports), \
         each round in an order of its own as connections come \
         ready (a seeded shuffle; one row in name order, the order of the core's tables, \
         whose next record the processor's caches then hold already: what a lab's order of \
         arrival costs); no sockets, no parsing (the floor rows of the footprint are \
         those). Time: the core's wall time and the process's CPU time (the trace writer's \
         thread included; every round's reports are built, encoded and read back before \
         the timing starts, since session 33: a compared `rb-corecost` older than that \
         built each round while the core ran) per report, median of {RUNS} runs (min–max), \
         the builds' runs interleaved. Instructions: \
         callgrind's count on the core's thread per report (the harness's thread left \
         out), {COUNTED_ROUNDS} rounds less none, without the trace (whose files' rotations fall at other reports from run to \
         run); they repeat to 0.1 % between runs.\n"
    );
    println!("| core | reports | wall µs a report | CPU µs a report | instructions a report |");
    println!("|---|---|---|---|---|");
    let ours = tests::bin("rb-corecost");
    let valgrind = has_valgrind();
    let mut builds = vec![("today's".to_string(), ours)];
    if let Some((label, path)) = compared {
        builds.insert(0, (label.clone(), path.clone()));
    }
    for (row, flags) in ROWS {
        // The builds' runs interleaved, so that the machine's drift falls on each alike.
        let mut runs = vec![(Vec::new(), Vec::new()); builds.len()];
        for _ in 0..RUNS {
            for ((_, bin), (wall, cpu)) in builds.iter().zip(runs.iter_mut()) {
                if let Some((w, c)) = corecost(bin, flags, ROUNDS) {
                    wall.push(w);
                    cpu.push(c);
                }
            }
        }
        for ((label, bin), (wall, cpu)) in builds.iter().zip(&runs) {
            let counted = match flags.contains(&"--no-trace") && valgrind {
                true => instructions_per_report(bin, flags)
                    .map_or("-".to_string(), |n| format!("{n:.0}")),
                false => "-".to_string(),
            };
            println!(
                "| {label} | {row} | {} | {} | {counted} |",
                show(wall),
                show(cpu)
            );
        }
    }
    if !valgrind {
        println!("\nvalgrind is not installed here: no instruction counts.");
    }
    println!();
    Ok(())
}

/// `median µs (min–max, n)`, or `-` without runs.
fn show(values: &[f64]) -> String {
    summarize(values).map_or("-".to_string(), |s| s.show("µs", 2))
}

/// One run: its `core W µs of wall time …, process CPU C µs …` line's W and C.
fn corecost(bin: &Path, flags: &[&str], rounds: u64) -> Option<(f64, f64)> {
    let out = corecost_command(Command::new(bin), flags, rounds)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let number_before = |marker: &str| -> Option<f64> {
        let head = &text[..text.find(marker)?];
        head.rsplit(' ').find(|w| !w.is_empty())?.parse().ok()
    };
    Some((
        number_before(" µs of wall time")?,
        number_before(" µs a report")?,
    ))
}

/// `command` (rb-corecost, or valgrind before it) with the lab's size, `rounds` and `flags`.
fn corecost_command(mut command: Command, flags: &[&str], rounds: u64) -> Command {
    command
        .args([
            "--hosts",
            &HOSTS.to_string(),
            "--rounds",
            &rounds.to_string(),
        ])
        .args(flags);
    command
}

pub(crate) fn has_valgrind() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// callgrind's instructions per report: a run of [`COUNTED_ROUNDS`] rounds less one of none.
fn instructions_per_report(bin: &Path, flags: &[&str]) -> Option<f64> {
    let counted = callgrind_total(bin, flags, COUNTED_ROUNDS)?;
    let start = callgrind_total(bin, flags, 0)?;
    Some(counted.saturating_sub(start) as f64 / (HOSTS as u64 * COUNTED_ROUNDS) as f64)
}

/// The instructions callgrind counts on the core's thread in one run of `rb-corecost`
/// (one profile a thread; the core's is the one whose functions include the core's loop):
/// the harness that builds, encodes and reads the reports runs on another, before the core
/// is handed them.
fn callgrind_total(bin: &Path, flags: &[&str], rounds: u64) -> Option<u64> {
    let dir = tempfile::tempdir().ok()?;
    let mut valgrind = Command::new("valgrind");
    valgrind
        .args(["--tool=callgrind", "--separate-threads=yes"])
        .arg(format!(
            "--callgrind-out-file={}/callgrind.%p",
            dir.path().display()
        ))
        .arg(bin);
    let out = corecost_command(valgrind, flags, rounds).output().ok()?;
    if !out.status.success() {
        return None;
    }
    std::fs::read_dir(dir.path())
        .ok()?
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path()).ok())
        .find(|profile| profile.contains(CORE_LOOP))
        .and_then(|profile| thread_total(&profile))
}

/// A function of the core's loop, named in the core thread's profile only.
const CORE_LOOP: &str = "broker::core::hosts_to_desk";

/// The `summary:` (or `totals:`) line of one thread's callgrind profile.
fn thread_total(profile: &str) -> Option<u64> {
    profile
        .lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|n| n.trim().parse().ok())
}
