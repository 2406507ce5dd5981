//! Fault-injection support for `tests/tests/faults_lab.rs`: a seeded random source, a
//! stream of real jobs (agents on the gateway running `rsh anyLinux-N …` on lab hosts),
//! the invariant checks run after every fault, and the JSON summary each scenario writes
//! under `target/faults/` (turned into `RELIABILITY.md` by `bench/faults/run.sh`).
//!
//! Layout: here [`Rng`] and [`FaultConfig`] (seed and kill count from the environment,
//! printed) and [`Tally`] (what was injected, what broke); [`jobs`] the job stream's agents
//! and the processes they leave on the hosts; [`stream`] the random job stream and the
//! kills; [`view`] the pure checks [`exclusive`] and
//! [`kept`] on `rb status --json` / `rb jobs --json`.
//!
//! Every remote command of job `jN` carries `RBFAULT=jN` in its environment, so a process
//! left behind by an ended job is found by walking `/proc/*/environ` on every lab host.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::Duration,
};

pub mod jobs;
pub mod stream;
pub mod view;

pub use jobs::{job_processes, leftovers, shared_hosts, Job, Jobs};
pub use view::{being_taken, exclusive, held, kept, reclaims_logged, released_in_time, View};

/// How long an agent may take to exit after its app ended.
pub const AGENT_EXIT_BOUND: Duration = Duration::from_secs(20);
/// How long the processes of an ended job may outlive it on the hosts (subagent: 10 s).
pub const LEFTOVER_BOUND: Duration = Duration::from_secs(15);

/// splitmix64: small, seedable, the same sequence on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// A duration uniform in `lo..hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next_u64() % (hi - lo).max(1))
    }
}

/// Seed and fault count of a run: `RB_FAULT_SEED` (else from the clock) and
/// `RB_FAULT_KILLS` (else `default_kills`). Printed so a failure can be replayed.
#[derive(Debug, Clone, Copy)]
pub struct FaultConfig {
    pub seed: u64,
    pub kills: usize,
}

impl FaultConfig {
    pub fn from_env(scenario: &str, default_kills: usize) -> Self {
        let seed = std::env::var("RB_FAULT_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        let kills = std::env::var("RB_FAULT_KILLS")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(default_kills);
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "{scenario}: RB_FAULT_SEED={seed} RB_FAULT_KILLS={kills}"
        );
        Self { seed, kills }
    }
}

/// What a scenario injected and what broke; written as JSON under `target/faults/`.
#[derive(Debug, Default)]
pub struct Tally {
    pub scenario: String,
    pub seed: u64,
    pub faults: BTreeMap<String, u64>,
    pub survived: u64,
    pub violations: Vec<String>,
    /// Processes found left behind (`host: what`), each counted once however often seen.
    pub left: BTreeSet<String>,
    pub jobs: u64,
}

impl Tally {
    pub fn new(scenario: &str, seed: u64) -> Self {
        Self {
            scenario: scenario.into(),
            seed,
            ..Self::default()
        }
    }

    /// One fault of `kind` injected; `survived` when every check after it passed.
    pub fn fault(&mut self, kind: &str, violations: Vec<String>) {
        *self.faults.entry(kind.into()).or_default() += 1;
        if violations.is_empty() {
            self.survived += 1;
        }
        for v in violations {
            let v = v.replace('\n', "; ");
            let line = format!("after {kind} #{}: {v}", self.faults[kind]);
            eprintln!("VIOLATION {line}");
            self.violations.push(line);
        }
    }

    /// Writes `target/faults/SCENARIO.json` and returns its path.
    pub fn write(&self) -> PathBuf {
        let dir = faults_dir();
        std::fs::create_dir_all(&dir).expect("mkdir target/faults");
        let path = dir.join(format!("{}.json", self.scenario));
        let json = serde_json::json!({
            "scenario": self.scenario,
            // A string: jq and JavaScript read numbers as doubles, and seeds are u64.
            "seed": self.seed.to_string(),
            "faults": self.faults,
            "injected": self.faults.values().sum::<u64>(),
            "survived": self.survived,
            "violations": self.violations,
            "leftovers": self.left.len(),
            "jobs": self.jobs,
            // How the numbers were made: a debug build or a loaded machine misses more
            // deadlines than a release build on an idle one.
            "build": build_profile(),
            "loadavg": load_average(),
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json).expect("json"))
            .expect("write summary");
        path
    }

    /// Writes the summary, then fails the test on any violation or leftover.
    pub fn finish(&self) {
        let path = self.write();
        assert!(
            self.violations.is_empty() && self.left.is_empty(),
            "{}: {} violation(s), {} process(es) left behind (seed {}; summary {}):\n{}",
            self.scenario,
            self.violations.len(),
            self.left.len(),
            self.seed,
            path.display(),
            self.violations.join("\n")
        );
    }
}

/// The cargo profile of the binaries under test (`debug`, `release`): their directory's name.
fn build_profile() -> String {
    crate::bin_dir()
        .file_name()
        .map_or_else(|| "unknown".into(), |n| n.to_string_lossy().into_owned())
}

/// The 1-minute load average as the scenario ends (`/proc/loadavg`), if readable.
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// `target/faults`: the summaries, and the agents' logs under `logs/SCENARIO/`.
pub fn faults_dir() -> PathBuf {
    crate::bin_dir()
        .parent()
        .expect("target dir")
        .join("faults")
}
