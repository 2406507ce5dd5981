//! The cold part of the overflow section: the lab host held, no pilot up, a job's request
//! until its command runs on the Slurm node (a pilot submitted for it), split into the
//! policy's wait, Slurm's start of the pilot, the pilot's join and the grant. Two variants,
//! alternating: the cluster quiet for [`QUIET`] first (no Slurm event since: an idle
//! cluster), and back to back (the previous pilot just left).

use std::{path::Path, time::Duration};

use ::tests::slurm::SlurmLab;

use super::{
    hold_lab, record, release_lab, slurm_lab, timed_request, wait_held, wait_no_pilot, Options,
    Request, COLD_IDLE_EXIT_S, JOINS, LAB_HOST, NODE,
};

/// How long the cluster has no job before a quiet repetition (an idle cluster): longer
/// than slurmctld's `batch_sched_delay` (3 s by default), how long it may delay scheduling
/// a batch job. Trial runs saw 0.06–2.7 s from `sbatch` to `sched: Allocate` in slurmctld's
/// log, the longest right after the previous pilot ended.
pub const QUIET: Duration = Duration::from_secs(4);

/// One cold repetition (ms), and its split where the logs had every time.
#[derive(Debug, Clone)]
pub struct ColdRep {
    pub total_ms: f64,
    pub split: Option<ColdSplit>,
}

/// The parts of a cold request (ms): [`ColdSplit::STEPS`] (they add up to the total), and
/// `sbatch`'s own time (within the second step).
#[derive(Debug, Clone, Copy)]
pub struct ColdSplit {
    pub steps: [f64; 5],
    pub sbatch_ms: f64,
}

impl ColdSplit {
    pub const STEPS: [&'static str; 5] = [
        "cold, request → `sbatch` starts (the policy's wait, ≥ 1 s, and the core's tick)",
        "cold, `sbatch` starts → slurmctld allocates the node (`sched: Allocate`)",
        "cold, allocated → `slurmd` launches the pilot's batch script",
        "cold, launched → the pilot's host joins (slurmstepd, the script, `rb-hostd` starts and connects)",
        "cold, host joined → the command runs (grant, ssh)",
    ];
}

/// The cold part's results.
pub struct Cold {
    /// The cluster quiet for [`QUIET`] before each.
    pub quiet: Vec<ColdRep>,
    /// Right after the previous pilot left.
    pub back_to_back: Vec<ColdRep>,
    /// Slurm calls at the broker's start (before any job).
    pub at_start: [usize; 4],
    /// Slurm calls over the repetitions (one pilot each, from submission to idle exit).
    pub per_reps: [usize; 4],
}

impl Cold {
    /// Pilots submitted over the repetitions.
    pub fn pilots(&self) -> usize {
        self.quiet.len() + self.back_to_back.len()
    }
}

/// The broker's, slurmctld's and the node's `slurmd`'s logs, read after a cold request.
struct Logs {
    broker: String,
    slurmctld: String,
    slurmd: String,
}

pub fn run(opts: &Options) -> anyhow::Result<Cold> {
    let dir = tempfile::Builder::new()
        .prefix("rb-bench-overflow-")
        .tempdir_in("/var/tmp")?;
    let env = slurm_lab(dir.path(), COLD_IDLE_EXIT_S)?;
    let filler = hold_lab(&env)?;
    wait_no_pilot(&env)?;
    let at_start = record::count(&record::calls(dir.path()));
    let (mut quiet, mut back_to_back) = (Vec::new(), Vec::new());
    for _ in 0..opts.reps {
        // A fixed quiet period is what "an idle cluster" means here (see QUIET); the node
        // must still be idle after it.
        std::thread::sleep(QUIET);
        wait_no_pilot(&env)?;
        quiet.push(one(&env, dir.path())?);
        back_to_back.push(one(&env, dir.path())?);
    }
    let all = record::count(&record::calls(dir.path()));
    release_lab(&env, filler)?;
    Ok(Cold {
        quiet,
        back_to_back,
        at_start,
        per_reps: [0, 1, 2, 3].map(|i| all[i] - at_start[i]),
    })
}

/// One cold request; returns once its pilot is gone again and the node idle.
fn one(env: &SlurmLab, dir: &Path) -> anyhow::Result<ColdRep> {
    let req = timed_request(env, NODE)?;
    let slurm_log = |name: &str| {
        std::fs::read_to_string(env.cluster.dir().join("log").join(name)).unwrap_or_default()
    };
    let logs = Logs {
        broker: env.broker.log(),
        slurmctld: slurm_log("slurmctld.log"),
        slurmd: slurm_log(&format!("slurmd-{NODE}.log")),
    };
    let rep = ColdRep {
        total_ms: req.ms(),
        split: split(&req, &record::calls(dir), &logs),
    };
    wait_held(env, &[LAB_HOST])?;
    wait_no_pilot(env)?;
    Ok(rep)
}

/// The split of a cold request: the first `sbatch` after it, the first allocation slurmctld
/// logged after that `sbatch` started, the first batch job `slurmd` launched after that,
/// the first join the broker logged after that.
fn split(req: &Request, calls: &[record::Call], logs: &Logs) -> Option<ColdSplit> {
    let sbatch = calls
        .iter()
        .find(|c| c.name == "sbatch" && c.start_ns > req.asked_ns)?;
    let allocated = record::first_after(
        &logs.slurmctld,
        "sched: Allocate",
        sbatch.start_ns,
        record::slurm_log_time_ns,
    )?;
    let launched = record::first_after(
        &logs.slurmd,
        "Launching batch job",
        allocated,
        record::slurm_log_time_ns,
    )?;
    let joined = record::first_after(&logs.broker, JOINS, launched, record::log_time_ns)?;
    let ms = |a: i128, b: i128| (b - a) as f64 / 1e6;
    Some(ColdSplit {
        steps: [
            ms(req.asked_ns, sbatch.start_ns),
            ms(sbatch.start_ns, allocated),
            ms(allocated, launched),
            ms(launched, joined),
            ms(joined, req.ran_ns),
        ],
        sbatch_ms: ms(sbatch.start_ns, sbatch.end_ns?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split's steps add up to the request's total, from the recorder's and the two
    /// logs' times.
    #[test]
    fn the_split_adds_up_to_the_total() {
        let s = |ms: i128| 1_795_797_900_000_000_000i128 + ms * 1_000_000;
        let req = Request {
            asked_ns: s(0),
            ran_ns: s(2000),
            host: NODE.into(),
        };
        let calls = vec![
            record::Call {
                name: "squeue".into(),
                start_ns: s(-5000),
                end_ns: Some(s(-4900)),
            },
            record::Call {
                name: "sbatch".into(),
                start_ns: s(1100),
                end_ns: Some(s(1160)),
            },
        ];
        // s(1400), s(1500) and s(1600) as the logs write them: Slurm's in local time to the
        // ms, the broker's in UTC to the µs.
        let stamp = |ns: i128, utc: bool, digits: u32| {
            let secs = ns.div_euclid(1_000_000_000);
            let frac = ns.rem_euclid(1_000_000_000) / 10i128.pow(9 - digits);
            let mut date = std::process::Command::new("date");
            if utc {
                date.arg("-u");
            }
            let out = date
                .args(["-d", &format!("@{secs}"), "+%Y-%m-%dT%H:%M:%S"])
                .output()
                .expect("date");
            let day = String::from_utf8_lossy(&out.stdout).trim().to_string();
            format!("{day}.{frac:0w$}", w = digits as usize)
        };
        let logs = Logs {
            slurmctld: format!(
                "[{}] sched: Allocate JobId=1 NodeList=node03 #CPUs=1 Partition=rbtest\n",
                stamp(s(1400), false, 3)
            ),
            slurmd: format!(
                "[{}] Launching batch job 1 for UID 0\n",
                stamp(s(1500), false, 3)
            ),
            broker: format!(
                "{}Z  INFO broker::core: {JOINS} host=slurm-node03\n",
                stamp(s(1600), true, 6)
            ),
        };
        let split = split(&req, &calls, &logs).expect("split");
        assert_eq!(split.steps, [1100.0, 300.0, 100.0, 100.0, 400.0]);
        assert_eq!(split.steps.iter().sum::<f64>(), req.ms());
        assert_eq!(split.sbatch_ms, 60.0);
    }
}
