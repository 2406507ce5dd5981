//! The example applications (rb-mw, rb-bnb, jacobi.py) under test: what their logs say
//! (which lab host's worker was handed work; the summary's counts of work handed on at a
//! vacate, at a death, at a lost connection), their answers checked independently (rb-bnb's
//! brute force, jacobi's residual recomputed), and the four ways a lab takes a host back
//! from a running application: `rb release`, another job, a returning owner, a crash.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use crate::{
    bin,
    labtier::{LabWithBroker, TEST_TIMING},
    mw::MwJob,
    wait_until,
};

/// How one application logs on stderr.
#[derive(Debug, Clone, Copy)]
pub struct AppLog {
    /// Every line's prefix, e.g. `rb-mw:`.
    pub prefix: &'static str,
    /// The start of a line that hands work to a worker; a worker on a granted host is
    /// named at the line's end, `… on HOST`.
    pub work: &'static str,
}

pub const RB_MW: AppLog = AppLog {
    prefix: "rb-mw:",
    work: "rb-mw: task ",
};
pub const RB_BNB: AppLog = AppLog {
    prefix: "rb-bnb:",
    work: "rb-bnb: task ",
};
pub const JACOBI: AppLog = AppLog {
    prefix: "jacobi.py:",
    work: "jacobi.py: block ",
};

/// Work handed on to another worker, by what made the master take it back (the three
/// counts every application's summary gives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandedOn {
    /// The worker's host was vacated (the JEL `vacate`, before any signal).
    pub vacate: usize,
    /// The worker's pool member died or left.
    pub death: usize,
    /// The worker's connection to the master dropped before either was seen.
    pub lost_connection: usize,
}

impl AppLog {
    /// The lab hosts named by the work lines so far, one per line, in order.
    pub fn work_hosts(&self, log: &str) -> Vec<String> {
        log.lines()
            .filter_map(|l| {
                Some(
                    l.strip_prefix(self.work)?
                        .rsplit_once(" on ")?
                        .1
                        .to_string(),
                )
            })
            .collect()
    }

    /// The number just before `what` on the first line of the application that has it
    /// (its summary: `… 2 at a vacate, …`). Panics with the log when there is none.
    pub fn count(&self, log: &str, what: &str) -> usize {
        let number = log
            .lines()
            .filter(|l| l.starts_with(self.prefix))
            .find_map(|l| {
                let before = &l[..l.find(what)?];
                let word = before.split_whitespace().last()?;
                word.trim_start_matches(['(', ',']).parse().ok()
            });
        number.unwrap_or_else(|| panic!("no count before {what:?} in the log:\n{log}"))
    }

    pub fn handed_on(&self, log: &str) -> HandedOn {
        HandedOn {
            vacate: self.count(log, "at a vacate"),
            death: self.count(log, "at a death"),
            lost_connection: self.count(log, "at a lost connection"),
        }
    }

    /// Waits (a minute at most) until workers on `n` different lab hosts had work; the hosts.
    pub fn wait_work_on_hosts(&self, job: &MwJob, n: usize) -> BTreeSet<String> {
        wait_until(Duration::from_secs(60), || {
            let hosts: BTreeSet<String> = self.work_hosts(&job.stderr()).into_iter().collect();
            (hosts.len() >= n).then_some(hosts)
        })
        .unwrap_or_else(|| panic!("workers never had work on {n} lab hosts:\n{}", job.stderr()))
    }
}

/// The last line of a program's output (its answer).
pub fn last_line(text: &str) -> String {
    text.lines().last().unwrap_or_default().to_string()
}

/// `rb-bnb --cities C --seed S --brute-force`'s answer (every tour tried, in one process).
pub fn bnb_brute_force(cities: u32, seed: u32) -> String {
    let out = Command::new(bin("rb-bnb"))
        .args(["--cities", &cities.to_string()])
        .args(["--seed", &seed.to_string(), "--brute-force"])
        .output()
        .expect("rb-bnb --brute-force");
    assert!(out.status.success(), "{out:?}");
    last_line(&String::from_utf8_lossy(&out.stdout))
}

/// `examples/jacobi/jacobi.py` of this repository.
pub fn jacobi_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/jacobi/jacobi.py")
}

/// max |1 - (diag x_i - x_{i-1} - x_{i+1})| for the x jacobi.py wrote to `file` (`--out`):
/// its residual, recomputed here.
pub fn jacobi_residual(file: &Path, diag: f64) -> f64 {
    let text = std::fs::read_to_string(file).expect("jacobi.py --out");
    let x: Vec<f64> = text.lines().map(|l| l.parse().expect("a number")).collect();
    let at = |i: isize| {
        if i < 0 || i as usize >= x.len() {
            0.0
        } else {
            x[i as usize]
        }
    };
    (0..x.len() as isize)
        .map(|i| (1.0 - (diag * at(i) - at(i - 1) - at(i + 1))).abs())
        .fold(0.0, f64::max)
}

/// The owned host of [`Takeback::OwnerReturns`] and its owner.
pub const OWNED_HOST: (&str, &str) = ("node03", "alice");

/// What takes a host back from a running application in a lab test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeback {
    /// `rb release HOST --grace-s 2`.
    Release,
    /// A plain (not adaptive) job runs `rsh anyLinux true`: with every host held by the
    /// adaptive application, the policy takes one from it.
    AnotherJob,
    /// The owner of [`OWNED_HOST`] logs in at its console, active now.
    OwnerReturns,
    /// The host crashes (`rb lab crash`): every process on it dies at once.
    Crash,
}

/// What must live until the application ends (the returning owner's login).
pub type Aftermath = Option<lab::FakeLogin>;

impl Takeback {
    /// A lab of `hosts` hosts with a broker; for [`Takeback::OwnerReturns`], node03 is
    /// alice's workstation (she is away at the start, so the application may use it).
    pub fn lab(self, hosts: usize) -> LabWithBroker {
        let owners: &[(&str, &str)] = match self {
            Takeback::OwnerReturns => &[OWNED_HOST],
            _ => &[],
        };
        LabWithBroker::start_with(hosts, owners, TEST_TIMING)
    }

    /// Waits until the job's workers had work on every lab host, so that the host taken
    /// back holds some (the masters hand a worker its next task as they take its result),
    /// then takes one back.
    pub fn inflict(self, env: &LabWithBroker, job: &MwJob, app: AppLog) -> Aftermath {
        let hosts = app.wait_work_on_hosts(job, env.lab.hosts().len());
        let first = hosts.first().expect("a host").clone();
        match self {
            Takeback::Release => {
                let out = env.broker.rb(&["release", &first, "--grace-s", "2"]);
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(out.status.success(), "rb release {first}: {err}");
                None
            }
            Takeback::AnotherJob => {
                let other = env
                    .agent(&["sh", "-c", "rsh anyLinux true"])
                    .output()
                    .expect("the other job");
                let err = String::from_utf8_lossy(&other.stderr);
                assert!(other.status.success(), "the other job got a host: {err}");
                None
            }
            Takeback::OwnerReturns => {
                let (host, owner) = OWNED_HOST;
                let tty = format!("rbtty-{owner}");
                let login = env.lab.fake_login(host, owner, &tty, Duration::ZERO);
                Some(login.expect("fake login"))
            }
            Takeback::Crash => {
                env.lab.crash(&first).expect("crash");
                None
            }
        }
    }

    /// Asserts that the event reached the application as intended, from its summary. A
    /// host taken back in order (released, to another job, to its owner) is vacated: the
    /// work there is handed on at the `vacate`, and none at a death or a lost connection
    /// (a worker keeps its connection until its master, having seen the vacate, says quit:
    /// README, "Example applications"). A crashed host has no vacate: its work is handed
    /// on when the worker's death or its lost connection is seen, whichever comes first.
    pub fn check_handed_on(self, app: AppLog, log: &str) {
        let seen = app.handed_on(log);
        // Shown with --nocapture: what each run saw.
        println!("{} after {self:?}: {seen:?}", app.prefix);
        if self == Takeback::Crash {
            assert!(
                seen.death + seen.lost_connection >= 1 && seen.vacate == 0,
                "the crashed host's work handed on at its death or lost connection, {seen:?}:\n{log}"
            );
        } else {
            assert!(
                seen.vacate >= 1 && seen.death == 0 && seen.lost_connection == 0,
                "the host's work handed on at its vacate, and only then, {seen:?}:\n{log}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summaries_counts_are_read() {
        let mw = "rb-mw: task 3 [10,20) to worker pid 77 (member 2) on node03\n\
                  rb-mw: 12 tasks done in 14 runs (2 re-queued): 1 at a vacate, 0 at a death, \
                  1 at a lost connection\n";
        assert_eq!(RB_MW.work_hosts(mw), ["node03"]);
        assert_eq!(
            RB_MW.handed_on(mw),
            HandedOn {
                vacate: 1,
                death: 0,
                lost_connection: 1
            }
        );
        let bnb = "rb-bnb: task 5 to the worker in the master\n\
                   rb-bnb: task 6 to the worker pid 9 on node04\n\
                   rb-bnb: 504 tasks, 3 handed out again (2 at a vacate, 1 at a death, 0 at a \
                   lost connection), 4 workers on granted hosts\n";
        assert_eq!(RB_BNB.work_hosts(bnb), ["node04"]);
        assert_eq!(RB_BNB.count(bnb, "handed out again"), 3);
        assert_eq!(RB_BNB.handed_on(bnb).vacate, 2);
        let jacobi = "jacobi.py: 212 block updates, 9 workers on granted hosts, blocks freed: \
                      1 at a vacate, 0 at a death, 0 at a lost connection\n";
        assert_eq!(JACOBI.count(jacobi, "workers on granted hosts"), 9);
        assert_eq!(JACOBI.handed_on(jacobi).vacate, 1);
    }

    #[test]
    #[should_panic(expected = "no count before")]
    fn a_missing_count_is_an_error() {
        RB_MW.count("rb-mw: 3 tasks done\n", "at a vacate");
    }
}
