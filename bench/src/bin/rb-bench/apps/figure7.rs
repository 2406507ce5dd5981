//! The paper's Figure 7 with a real application (part `figure7`): rb-mw holds every managed
//! lab host; a PVM job (`(module="pvm")`, not adaptive, so the policy takes hosts from
//! rb-mw for it) adds N machines with `add anyLinux-1 … anyLinux-N`; the time until all N
//! are in the virtual machine's `conf`, and rb-mw's answer, still right.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use bench::stats::{summarize, Summary};
use tests::{labtier::LabWithBroker, mw::MwJob, wait_until};

use super::Options;
use crate::policy::{lab_broker, FRONT_END, GRACE_S};

/// Machine counts of Figure 7.
const N: [usize; 5] = [1, 2, 4, 8, 12];
/// Managed hosts (node03–node15), all held by rb-mw before each run.
const HOSTS: usize = 13;
/// rb-mw's problem: the primes below this; tasks of at least [`MW_TASK_MS`] ms.
const MW_N: usize = 50_000_000;
const MW_TASK_MS: u64 = 250;
/// Host-seconds of rb-mw work per PVM run (a run, PVM's halt, rb-mw growing back), so that
/// it holds the hosts through every run of a machine count.
const WORK_PER_RUN_S: u64 = 8;
const PVM_ENV: &str = "PVM_ROOT=/usr/lib/pvm3; export PVM_ROOT;";

pub(super) fn figure7(opts: &Options) -> anyhow::Result<()> {
    println!("### Reclaiming N hosts from a real application (the paper's Figure 7, lab)\n");
    println!(
        "{HOSTS} managed lab hosts (node03–node15; node02 is the lab user's front end), jobs \
         over rsh, `[broker] policy = \"paper\"`, `reclaim_grace_s = {GRACE_S}`. `rb-mw \
         --primes-below {MW_N} --task-ms {MW_TASK_MS}` (adaptive) holds every host; then a \
         PVM job on node02 (`agent --rsl '&(module=\"pvm\")'`, not adaptive, so the policy \
         takes hosts from rb-mw for it) starts its virtual machine and types `add \
         anyLinux-1 … anyLinux-N` at its console (instances: N distinct requests); timed \
         inside node02 from the `add` until all N granted hosts are in the virtual machine \
         (`pvm_wait_hosts`: PvmHostAdd notifications, then `pvm_config`). rb-mw hands the work of a vacated host on and \
         quits there before its grace runs out; its answer is checked after the runs of \
         each N. Baseline: the same PVM job with every host free (no rb-mw). Median of {} \
         (min–max). Paper: about 1 s per machine, linear. Goal: ≤ grace + 150 ms at N = 12.\n",
        opts.reps
    );
    let spec = lab::LabSpec {
        hosts: HOSTS + 1,
        rsh: true,
        ..lab::LabSpec::default()
    };
    let lab = lab::Lab::up(&spec).map_err(|e| anyhow::anyhow!("lab up: {e}"))?;
    let env = lab_broker(lab, "rsh", &[]);
    env.build_program("pvm_wait_hosts", "gcc", "pvm_wait_hosts", "-lpvm3")
        .map_err(|e| anyhow::anyhow!(e))?;
    let mut free = Vec::new();
    let mut held = Vec::new();
    let mut answers = Vec::new();
    for n in N {
        free.push(time_adds(&env, n, opts.reps, None)?);
        let mut mw = start_mw(&env, opts.reps);
        let times = time_adds(&env, n, opts.reps, Some(&mut mw));
        answers.push(mw_answer(&mut mw));
        held.push(times?);
    }
    println!("| hosts |{}", N.map(|n| format!(" N = {n} |")).concat());
    println!("|---|{}", "---|".repeat(N.len()));
    println!("| every host free (baseline) |{}", cells(&free));
    println!("| every host held by rb-mw |{}", cells(&held));
    println!(
        "| paper (1998) |{}",
        N.map(|n| format!(" ≈ {n} s |")).concat()
    );
    println!();
    println!("rb-mw's answers (one run per N): {}.\n", answers.join(", "));
    let LabWithBroker { broker, lab } = env;
    drop(broker);
    lab.down().map_err(|e| anyhow::anyhow!("lab down: {e}"))
}

fn cells(row: &[Option<Summary>]) -> String {
    row.iter()
        .map(|s| format!(" {} |", crate::policy::show_ms(*s)))
        .collect()
}

/// rb-mw as an adaptive job on the front end, with work for `reps` PVM runs.
fn start_mw(env: &LabWithBroker, reps: usize) -> MwJob {
    let work_ms = HOSTS as u64 * WORK_PER_RUN_S * 1000 * (reps as u64 + 1);
    let tasks = (work_ms / MW_TASK_MS).to_string();
    let mw = tests::bin("rb-mw").display().to_string();
    let (n, ms) = (MW_N.to_string(), MW_TASK_MS.to_string());
    let app = [
        mw.as_str(),
        "--primes-below",
        &n,
        "--tasks",
        &tasks,
        "--task-ms",
        &ms,
    ];
    MwJob::spawn(env.agent_as_user(FRONT_END, &["--rsl", "(adaptive=yes)"], &app))
}

/// Waits for rb-mw's end: `right (primes=…)`, or what went wrong.
fn mw_answer(mw: &mut MwJob) -> String {
    let (status, stdout) = mw.wait(Duration::from_secs(600));
    let want = tests::mw::primes_below(MW_N);
    match tests::mw::answer(&stdout) {
        Some(got) if status.success() && got == want => format!("right (primes={got})"),
        got => {
            eprintln!(
                "rb-bench figure7: rb-mw: {status}, {got:?}:\n{}",
                mw.stderr()
            );
            format!("WRONG ({status}, {got:?}, want {want})")
        }
    }
}

/// Times `reps` PVM jobs adding `n` machines; with `mw`, each run first waits until rb-mw
/// holds every host (and stops early, said on stderr, if rb-mw has ended).
fn time_adds(
    env: &LabWithBroker,
    n: usize,
    reps: usize,
    mut mw: Option<&mut MwJob>,
) -> anyhow::Result<Option<Summary>> {
    let mut times = Vec::new();
    for _ in 0..reps {
        wait_no_pvmd(env)?;
        if mw.is_none() {
            let free = wait_until(Duration::from_secs(30), || {
                env.broker.held_hosts().is_empty().then_some(())
            });
            anyhow::ensure!(free.is_some(), "hosts still held after a PVM job");
        }
        if let Some(mw) = mw.as_deref_mut() {
            let all = wait_until(Duration::from_secs(60), || {
                (env.broker.held_hosts().len() == HOSTS || mw.try_finished().is_some())
                    .then_some(())
            });
            if mw.try_finished().is_some() || all.is_none() {
                eprintln!(
                    "rb-bench figure7: rb-mw ended or did not hold every host; N = {n} has {} runs",
                    times.len()
                );
                break;
            }
        }
        match add_once(env, n) {
            Ok(ms) => times.push(ms),
            Err(e) => eprintln!("rb-bench figure7: N = {n}: {e}"),
        }
    }
    Ok(summarize(&times))
}

/// One PVM job: its virtual machine on node02, `add anyLinux-1 … anyLinux-N` at its
/// console, then `pvm_wait_hosts N+1`. Milliseconds from the add until all N are in.
///
/// Instances, not N × `anyLinux`: the agent takes calls for one name within its repeat
/// window (2 s) for PVM's retries of one request, so N quick `add anyLinux` ask for one host.
fn add_once(env: &LabWithBroker, n: usize) -> anyhow::Result<f64> {
    let names: Vec<String> = (1..=n).map(|i| format!("anyLinux-{i}")).collect();
    let adds = format!("add {}\\n", names.join(" "));
    let want = n + 1;
    let script = format!(
        "{PVM_ENV} echo quit | pvm >/dev/null 2>&1
         t0=$(date +%s%N)
         printf '{adds}' | pvm >/dev/null 2>&1
         ~/pvm_wait_hosts {want} 30000 >/dev/null
         t1=$(date +%s%N)
         echo \"hosts $(~/pvm_wait_hosts {want} 0)\"
         echo \"elapsed_us $(( (t1 - t0) / 1000 ))\""
    );
    let out = pvm_job(env, &script).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse::<f64>().ok())
    };
    match (field("hosts "), field("elapsed_us ")) {
        (Some(hosts), Some(us)) if hosts as usize == want => Ok(us / 1000.0),
        (hosts, _) => anyhow::bail!(
            "{hosts:?} hosts in the virtual machine, not {want}; stdout: {text}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn pvm_job(env: &LabWithBroker, script: &str) -> Command {
    let mut cmd = env.agent_as_user(
        FRONT_END,
        &["--rsl", "&(module=\"pvm\")"],
        &["sh", "-c", script],
    );
    cmd.stderr(Stdio::piped());
    cmd
}

/// Before a run: no pvmd of the lab user left on any host (the last job's halt done).
fn wait_no_pvmd(env: &LabWithBroker) -> anyhow::Result<()> {
    let user = env.lab.user().name.clone();
    let clean = wait_until(Duration::from_secs(30), || {
        let busy = env.lab.hosts().iter().any(|h| {
            env.lab
                .exec(&h.name, &["pgrep", "-u", &user, "pvmd"])
                .is_ok_and(|o| o.status.success())
        });
        (!busy).then_some(())
    });
    clean.ok_or_else(|| anyhow::anyhow!("a pvmd is left after a PVM job"))
}
