//! Module benchmark: a host taken back while a run uses it. The time from `rb release HOST`
//! to the end of the run that had a process there, for LAM/MPI (`mpirun.lam N`, `lamexec
//! N`, in a `module="lam"` job: `lam-shrink` ends the node's processes, then shrinks) beside
//! Open MPI (`mpirun -np 2 --host node02,anyLinux` under `agent`, no module: mpirun ends the
//! whole run when it loses a daemon), on the same lab in the same run.
//!
//! The lab is `LabWithBroker::start_with_front_end(3)`: node02 (the lab user's front end,
//! not managed), node03 and node04 (granted, one at a time). The gateway notes the time just before `rb release`;
//! the job's driver notes the run's end with `date +%s%N` (one clock: the lab hosts are
//! namespaces of this machine).

use std::{
    path::Path,
    process::Child,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bench::stats::summarize;
use tests::{
    labtier::{LabWithBroker, FRONT_END},
    wait_until,
};

/// The grace period of each release (the module gets 90 % of it).
const GRACE_S: u64 = 3;

/// One way of running: its label, and the run (a shell command on node02).
struct Run {
    label: &'static str,
    command: &'static str,
    /// The pgrep -f pattern of the run's process on the granted host.
    on_host: &'static str,
}

const LAM_RUNS: [Run; 2] = [
    Run {
        label: "`mpirun.lam N` (LAM 7.1.4, module job: lam-shrink)",
        command: "mpirun.lam N ~/mpi_sleep_barrier 120",
        on_host: "mpi_sleep_barrier",
    },
    Run {
        label: "`lamexec N` (LAM 7.1.4, module job: lam-shrink)",
        command: "lamexec N sh -c 'sleep 120'",
        on_host: "sleep 120",
    },
];

const OPEN_MPI: Run = Run {
    label: "`mpirun -np 2 --host node02,anyLinux` (Open MPI 4.1, baseline: no module)",
    command: "mpirun.openmpi -np 2 --host node02,anyLinux sh -c 'sleep 120'",
    on_host: "sleep 120",
};

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The job's file `name`, trimmed, once it exists and is not empty.
fn read(home: &Path, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(home.join(name)).ok()?;
    let text = text.trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// True once the lab user runs `pattern` on `host`.
fn running(env: &LabWithBroker, host: &str, pattern: &str) -> bool {
    let user = env.lab.user().name.clone();
    env.lab
        .exec(host, &["pgrep", "-u", &user, "-f", pattern])
        .is_ok_and(|o| o.status.success())
}

/// Releases the job's granted host once `run` has its process there and the driver said `ready`, and
/// returns the time until the driver's `end` file ("STATUS END_NS"), with the status.
fn release_and_time(
    env: &LabWithBroker,
    run: &Run,
    ready: &str,
    end: &str,
) -> anyhow::Result<(f64, i32)> {
    let home = env.lab.user().home.clone();
    wait_until(Duration::from_secs(60), || read(&home, ready))
        .ok_or_else(|| anyhow::anyhow!("{}: the driver never got ready", run.label))?;
    let host = wait_until(Duration::from_secs(30), || {
        env.broker
            .held_hosts()
            .into_iter()
            .find(|h| running(env, h, run.on_host))
    })
    .ok_or_else(|| anyhow::anyhow!("{}: no process on a granted host", run.label))?;
    let released = now_ns();
    let out = env
        .broker
        .rb(&["release", &host, "--grace-s", &GRACE_S.to_string()]);
    anyhow::ensure!(
        out.status.success(),
        "rb release: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = wait_until(Duration::from_secs(60), || read(&home, end))
        .ok_or_else(|| anyhow::anyhow!("{}: the run did not end within 60 s", run.label))?;
    let mut words = line.split_whitespace();
    let status: i32 = words.next().and_then(|w| w.parse().ok()).unwrap_or(-1);
    let ended: u128 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    anyhow::ensure!(ended > released, "{}: bad end line {line:?}", run.label);
    Ok(((ended - released) as f64 / 1e6, status))
}

/// The LAM job: boots on node02, then for each rep grows onto a granted host (`lamgrow
/// anyLinux`), runs the rep's command and notes its end; the benchmark releases the host
/// meanwhile.
fn lam_job(env: &LabWithBroker, reps: usize) -> anyhow::Result<Child> {
    let mut commands = String::new();
    for i in 0..reps {
        let run = &LAM_RUNS[i % LAM_RUNS.len()];
        commands.push_str(&format!(
            "lamgrow anyLinux </dev/null >/dev/null 2>&1; \
             until lamnodes 2>/dev/null | grep -q 'node0[34]'; do sleep 0.05; done; \
             echo go >~/tb-ready.{i}; \
             {} </dev/null >~/tb-run.{i} 2>&1; echo \"$? $(date +%s%N)\" >~/tb-end.{i}; ",
            run.command
        ));
    }
    let driver = format!(
        "echo {FRONT_END} >~/tb.schema; \
         lamboot -s ~/tb.schema </dev/null >/dev/null 2>&1 || exit 3; {commands}"
    );
    env.agent_as_user(
        FRONT_END,
        &["--rsl", "&(module=\"lam\")(adaptive=yes)"],
        &["sh", "-c", &driver],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .map_err(|e| anyhow::anyhow!("agent: {e}"))
}

/// One Open MPI job: the run, its end noted.
fn open_mpi_job(env: &LabWithBroker, i: usize) -> anyhow::Result<Child> {
    let driver = format!(
        "echo go >~/tb-ompi-ready.{i}; {} </dev/null >~/tb-ompi-run.{i} 2>&1; \
         echo \"$? $(date +%s%N)\" >~/tb-ompi-end.{i}",
        OPEN_MPI.command
    );
    env.agent_as_user(FRONT_END, &[], &["sh", "-c", &driver])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("agent: {e}"))
}

/// Waits for a job's agent to end (killing it after 60 s).
fn reap(env: &LabWithBroker, mut child: Child) {
    let ended = wait_until(Duration::from_secs(60), || {
        child.try_wait().ok().flatten().map(drop)
    });
    if ended.is_none() {
        let _ = env.lab.kill_spawned(&mut child);
        let _ = child.wait();
    }
}

pub fn run(reps: usize) -> anyhow::Result<()> {
    println!("### A host taken back during a run: from `rb release` to the run's end\n");
    let env = LabWithBroker::start_with_front_end(3);
    env.build_program("mpi_sleep_barrier", "mpicc.lam", "mpi_sleep_barrier", "")
        .map_err(|e| anyhow::anyhow!(e))?;
    let lam_reps = reps * LAM_RUNS.len();
    let mut lam: Vec<Vec<f64>> = vec![Vec::new(); LAM_RUNS.len()];
    let mut statuses: Vec<Vec<i32>> = vec![Vec::new(); LAM_RUNS.len() + 1];
    let job = lam_job(&env, lam_reps)?;
    for i in 0..lam_reps {
        let way = i % LAM_RUNS.len();
        let (ms, status) = release_and_time(
            &env,
            &LAM_RUNS[way],
            &format!("tb-ready.{i}"),
            &format!("tb-end.{i}"),
        )?;
        lam[way].push(ms);
        statuses[way].push(status);
    }
    reap(&env, job);
    let mut ompi = Vec::new();
    for i in 0..reps {
        let job = open_mpi_job(&env, i)?;
        let (ms, status) = release_and_time(
            &env,
            &OPEN_MPI,
            &format!("tb-ompi-ready.{i}"),
            &format!("tb-ompi-end.{i}"),
        )?;
        ompi.push(ms);
        statuses[LAM_RUNS.len()].push(status);
        reap(&env, job);
    }
    println!(
        "Lab: node02 (the lab user's front end) and node03/node04 (one granted at a time, \
         released with `--grace-s {GRACE_S}`), real rsh. A run with one process on each \
         node; the granted host is released once its process runs, and the time is from just before `rb release` \
         to the run's end as its driver notes it (`date +%s%N`). Before this change the \
         LAM runs did not end at all (lamshrink leaves the node's processes running and \
         unreported). Medians of {reps} runs each (min–max); Open MPI in the same run as \
         the baseline. Bound: the grace period + 5 s ({} s).\n",
        GRACE_S + 5
    );
    println!("| run | release → run ended | exit statuses |");
    println!("|---|---|---|");
    let rows = LAM_RUNS
        .iter()
        .zip(&lam)
        .map(|(r, v)| (r.label, v))
        .chain(std::iter::once((OPEN_MPI.label, &ompi)));
    for ((label, values), status) in rows.zip(&statuses) {
        let shown = summarize(values).map_or("-".into(), |s| crate::agent::show(&s));
        let mut codes: Vec<String> = status.iter().map(i32::to_string).collect();
        codes.dedup();
        println!("| {label} | {shown} | {} |", codes.join(", "));
    }
    println!();
    Ok(())
}
