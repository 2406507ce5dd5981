//! `job_load`: the load of this lab's job processes on the machine, HTCondor's
//! `CondorLoadAvg`, sent in each report (`HostReport::job_load`) so that a policy can tell
//! the jobs' load from the owner's (`host.other_load = load1 - job_load`).
//!
//! **What is measured.** The job processes are those the sweep would recognise: this uid's
//! processes whose subagent tag carries this lab's mark ([`crate::sweep::lab_alloc`]), the
//! daemon's own tag excepted. Between two reports, the CPU time they used
//! (`/proc/PID/stat` `utime + stime`) divided by the time passed is how many CPUs' worth
//! they kept busy; that rate is then averaged exactly as the kernel averages `load1`
//! (exponential decay with a one-minute time constant), so that `load1 - job_load` compares
//! like with like: a job that starts or stops moves both at the same pace. CPU time rather
//! than a count of running tasks: it needs no sampling faster than the report, and a
//! process's counters cover every instant between two reads. It counts time on a CPU, not
//! time waiting for one, so on an overloaded machine it reads lower than the jobs' share of
//! `load1`; the difference shows as `other_load` (erring towards "someone else is busy").
//! The CPU time of a process that started and ended between two reports (and of reaped
//! children, `cutime`) is not seen.
//!
//! **Cost** (the daemon's footprint is a benchmark): one `readdir` of `/proc` per report;
//! a process's `environ` is read when its pid is first seen (and once more at the next
//! report when it had no tag: the first read may have come between a fork and the exec
//! that set it), and the verdict is cached until the pid leaves `/proc`; only the tagged
//! processes' `stat` is read each report. A pid reused between two reports by a process of another kind keeps the
//! verdict of the first (pids wrap slowly: `pid_max` is 4 million on current kernels).
//!
//! [`JobLoad::advance`] is the pure part (counters in, average out); [`JobLoad::sample`]
//! reads `/proc` and calls it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    time::Instant,
};

use crate::sweep::{lab_alloc, start_time, Scope};

/// The time constant of the average, seconds: `load1`'s.
pub const TAU_S: f64 = 60.0;

/// One tagged process's CPU time counter at one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub pid: i32,
    /// Start time (clock ticks after boot): tells a process from a later one with its pid.
    pub start: u64,
    /// `utime + stime`, clock ticks.
    pub ticks: u64,
}

/// What a pid's `environ` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// A job process of this lab.
    Job,
    /// Not one, read once: read again at the next sample, in case the first read came
    /// between a fork and the exec that set the tag.
    OtherOnce,
    /// Not one, read twice: final while the pid lives.
    Other,
}

/// The measurement's state across reports.
#[derive(Debug)]
pub struct JobLoad {
    /// What each pid seen in `/proc` is (see [`Verdict`]).
    verdicts: BTreeMap<i32, Verdict>,
    /// The counters at the previous sample, by (pid, start).
    prev: BTreeMap<(i32, u64), u64>,
    last: Option<Instant>,
    avg: f64,
    ticks_per_s: f64,
}

impl Default for JobLoad {
    fn default() -> Self {
        Self::new(clock_ticks_per_s())
    }
}

impl JobLoad {
    pub fn new(ticks_per_s: f64) -> Self {
        Self {
            verdicts: BTreeMap::new(),
            prev: BTreeMap::new(),
            last: None,
            avg: 0.0,
            ticks_per_s,
        }
    }

    /// Takes the counters read at `now` and gives the average. The first call only sets the
    /// baseline (0). A process first seen now counts all its CPU time (it started since the
    /// last read, except at the first); one whose counter went backwards counts nothing.
    pub fn advance(&mut self, usage: &[Usage], now: Instant) -> f64 {
        let first = self.last.is_none();
        let mut used = 0u64;
        for u in usage {
            used += match self.prev.get(&(u.pid, u.start)) {
                Some(&before) => u.ticks.saturating_sub(before),
                None if first => 0,
                None => u.ticks,
            };
        }
        self.prev = usage.iter().map(|u| ((u.pid, u.start), u.ticks)).collect();
        let dt = self
            .last
            .map_or(0.0, |l| now.saturating_duration_since(l).as_secs_f64());
        self.last = Some(now);
        if dt > 0.0 && self.ticks_per_s > 0.0 {
            let rate = used as f64 / self.ticks_per_s / dt;
            let keep = (-dt / TAU_S).exp();
            self.avg = self.avg * keep + rate * (1.0 - keep);
        }
        self.avg
    }

    /// Reads the job processes' counters under `scope.proc_root` and advances the average.
    /// `None` when `/proc` cannot be listed (unknown, never 0).
    pub fn sample(&mut self, scope: &Scope, now: Instant) -> Option<f64> {
        let usage = self.read(scope)?;
        Some(self.advance(&usage, now))
    }

    /// The counters of the job processes, refreshing the cached verdicts.
    fn read(&mut self, scope: &Scope) -> Option<Vec<Usage>> {
        let me = std::process::id() as i32;
        let pids: BTreeSet<i32> = std::fs::read_dir(scope.proc_root)
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| *pid != me)
            .collect();
        self.verdicts.retain(|pid, _| pids.contains(pid));
        let mut usage = Vec::new();
        for pid in pids {
            let dir = scope.proc_root.join(pid.to_string());
            let verdict = match self.verdicts.get(&pid) {
                Some(v @ (Verdict::Job | Verdict::Other)) => *v,
                seen => match (is_job_process(scope, &dir), seen.is_some()) {
                    (true, _) => Verdict::Job,
                    (false, true) => Verdict::Other,
                    (false, false) => Verdict::OtherOnce,
                },
            };
            self.verdicts.insert(pid, verdict);
            if verdict != Verdict::Job {
                continue;
            }
            let stat = std::fs::read_to_string(dir.join("stat")).ok();
            if let Some(u) = stat.as_deref().and_then(|s| parse_usage(pid, s)) {
                usage.push(u);
            }
        }
        Some(usage)
    }
}

/// Whether the process in `dir` is of this uid and carries this lab's tag.
fn is_job_process(scope: &Scope, dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let uid = nix::unistd::getuid().as_raw();
    let mine = std::fs::metadata(dir).is_ok_and(|m| m.uid() == uid);
    mine && std::fs::read(dir.join("environ")).is_ok_and(|env| lab_alloc(scope, &env).is_some())
}

/// `utime` and `stime` (fields 14 and 15 of `/proc/PID/stat`) and the start time; fields are
/// counted after the last `)` (the command name may hold spaces and parentheses).
pub fn parse_usage(pid: i32, stat: &str) -> Option<Usage> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some(Usage {
        pid,
        start: start_time(stat)?,
        ticks: num(11)?.checked_add(num(12)?)?,
    })
}

/// `sysconf(_SC_CLK_TCK)`: the unit of `/proc/PID/stat`'s times (100 on Linux).
fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant of the C library; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

#[cfg(test)]
#[path = "jobload_tests.rs"]
mod tests;
