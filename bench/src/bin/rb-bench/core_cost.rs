//! The policy section's `core` part: what one host report costs the broker's core alone
//! (`rb-corecost`: the real core, reports handed over as the host daemons' thread does, no
//! sockets or parsing), in time and, where valgrind is installed, in instructions counted
//! by callgrind, which repeat from run to run where this machine's timings move by tens
//! of percent, and in the cache lines those instructions miss in a simulated L2 of one
//! core's size (callgrind's cache simulation): at 10k hosts the core's time follows the
//! misses (each host's records are cold by its next report), not the instructions.
//! Beside an `rb-corecost` of another build when one is given.

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
/// The simulated last-level cache of the callgrind runs: one core's L2 here (2 MiB, 16-way,
/// 64-byte lines): a miss there is a trip to the shared L3 or memory.
const SIMULATED_L2: &str = "--LL=2097152,16,64";

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
         out), {COUNTED_ROUNDS} rounds less none, without the trace (whose files' rotations \
         fall at other reports from run to run); they repeat to 0.1 % between runs. L2 \
         misses: the data reads and writes of those instructions that miss a simulated \
         2 MiB L2 (one core's here; callgrind's cache simulation, `{SIMULATED_L2}`), per \
         report: where the core's time goes at 10k hosts (since session 34).\n"
    );
    println!(
        "| core | reports | wall µs a report | CPU µs a report | instructions a report | \
         L2 misses a report |"
    );
    println!("|---|---|---|---|---|---|");
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
            let counted = (flags.contains(&"--no-trace") && valgrind)
                .then(|| counts_per_report(bin, flags))
                .flatten();
            let (instructions, misses) = counted.map_or(("-".into(), "-".into()), |c| {
                (
                    format!("{:.0}", c.instructions),
                    format!("{:.1}", c.l2_misses),
                )
            });
            println!(
                "| {label} | {row} | {} | {} | {instructions} | {misses} |",
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
    crate::runs_here("valgrind")
}

/// What callgrind counts on the core's thread: instructions, and the data accesses that
/// miss the simulated L2.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counts {
    instructions: f64,
    l2_misses: f64,
}

/// callgrind's counts per report: a run of [`COUNTED_ROUNDS`] rounds less one of none.
fn counts_per_report(bin: &Path, flags: &[&str]) -> Option<Counts> {
    let counted = callgrind_counts(bin, flags, COUNTED_ROUNDS)?;
    let start = callgrind_counts(bin, flags, 0)?;
    let reports = (HOSTS as u64 * COUNTED_ROUNDS) as f64;
    let per = |a: f64, b: f64| (a - b).max(0.0) / reports;
    Some(Counts {
        instructions: per(counted.instructions, start.instructions),
        l2_misses: per(counted.l2_misses, start.l2_misses),
    })
}

/// The counts callgrind makes on the core's thread in one run of `rb-corecost` (one
/// profile a thread; the core's is the one whose functions include the core's loop): the
/// harness that builds, encodes and reads the reports runs on another, before the core is
/// handed them.
fn callgrind_counts(bin: &Path, flags: &[&str], rounds: u64) -> Option<Counts> {
    let dir = tempfile::tempdir().ok()?;
    let mut valgrind = Command::new("valgrind");
    valgrind
        .args([
            "--tool=callgrind",
            "--separate-threads=yes",
            "--cache-sim=yes",
        ])
        .arg(SIMULATED_L2)
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
        .and_then(|profile| thread_counts(&profile))
}

/// A function of the core's loop, named in the core thread's profile only.
const CORE_LOOP: &str = "broker::core::hosts_to_desk";

/// One thread's callgrind profile's totals (its `summary:` or `totals:` line, named by its
/// `events:` line): instructions (`Ir`) and L2 data misses (`DLmr` + `DLmw`).
fn thread_counts(profile: &str) -> Option<Counts> {
    let line = |prefix: &str| profile.lines().find_map(|l| l.strip_prefix(prefix));
    let events: Vec<&str> = line("events:")?.split_whitespace().collect();
    let totals: Vec<f64> = line("summary:")
        .or_else(|| line("totals:"))?
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    let event = |name: &str| {
        let at = events.iter().position(|e| *e == name)?;
        Some(totals.get(at).copied().unwrap_or(0.0))
    };
    Some(Counts {
        instructions: event("Ir")?,
        l2_misses: event("DLmr")? + event("DLmw")?,
    })
}

#[cfg(test)]
mod counts_tests {
    use super::*;

    /// The totals are read by the names of the `events:` line, trailing zeros left out as
    /// callgrind leaves them out.
    #[test]
    fn a_profiles_counts_are_read_by_their_event_names() {
        let profile = "version: 1\nevents: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n\
                       fn=x\n1 2\nsummary: 1000 400 300 1 50 40 1 12 8\n";
        assert_eq!(
            thread_counts(profile),
            Some(Counts {
                instructions: 1000.0,
                l2_misses: 20.0
            })
        );
        let short =
            "events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\ntotals: 1000 400 300 1 50 40 1 12\n";
        assert_eq!(thread_counts(short).map(|c| c.l2_misses), Some(12.0));
        assert_eq!(thread_counts("events: Dr\nsummary: 5\n"), None);
        assert_eq!(thread_counts("summary: 5\n"), None);
    }
}
