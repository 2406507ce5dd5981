//! The "Overflow onto Slurm" section, lab only (root): a real Slurm
//! cluster made of a lab host (`tests::slurm::SlurmLab`: munged, slurmctld and slurmd inside
//! node03) beside one managed lab host (node02), and a broker whose lab file has
//! `[overflow.slurm]` with the default policy (`overflow` once a request waited 1 s):
//! - cold: node02 held by a filler job, no pilot up; a job's `rsh anyLinux` until its command
//!   runs on the Slurm node, split into the policy's wait, `sbatch`, the pilot's start and
//!   join, and the grant ([`cold`]);
//! - warm: an idle pilot up; the same measurement, beside a free lab host with no Slurm
//!   involved ([`warm`]);
//! - the cost of a pilot: CPU and RSS of its processes on the node over an idle window, beside
//!   a lab host's `rb-hostd` and the node's `slurmd`, and the Slurm calls the broker made per
//!   pilot (a recorder script before the lab file's commands, [`record`]).

mod cold;
mod record;

use std::{
    path::Path,
    process::Child,
    time::{Duration, Instant},
};

use bench::{procstat, stats::summarize};
use cold::{Cold, ColdSplit};
use proto::report::HostState;
use tests::{
    labtier::DEFAULT_TIMING,
    slurm::{owner_agent, OverflowOptions, SlurmLab},
    wait_until,
};

/// Options of the section.
pub struct Options {
    /// Repetitions of each latency (`--overflow-reps`).
    pub reps: usize,
    /// The idle window over which a pilot's cost is measured (`--overflow-idle-s`).
    pub idle: Duration,
}

/// The managed lab host.
const LAB_HOST: &str = "node02";
/// The Slurm node (controller and compute node).
const NODE: &str = "node03";
/// The pilot's host name in the lab.
const PILOT_HOST: &str = "slurm-node03";
/// `idle_exit_s` of the cold part: each repetition's pilot is gone soon after its job.
const COLD_IDLE_EXIT_S: u64 = 2;
/// `idle_exit_s` of the warm part: the pilot stays up for the whole part.
const WARM_IDLE_EXIT_S: u64 = 3600;
/// Warm requests and their baseline are repeated this many times the cold ones: they are
/// cheap, and the ssh under each varies by tens of ms on a loaded machine.
const WARM_FACTOR: usize = 4;
/// `lease_s` of every pilot.
const LEASE_S: u64 = 600;
/// How long one step (a pilot joining, leaving, a job) may take before the run fails.
const STEP_LIMIT: Duration = Duration::from_secs(60);
/// The broker's log line when a pilot's daemon joins.
const JOINS: &str = "a Slurm pilot's host joins the lab";

pub fn run(opts: &Options) -> anyhow::Result<()> {
    println!("## Overflow onto Slurm (issue 19)\n");
    if !tests::is_root() {
        println!("skipped: needs root (network namespaces, a Slurm cluster of lab hosts)\n");
        return Ok(());
    }
    intro(opts);
    let cold = cold::run(opts)?;
    let warm = warm(opts)?;
    latency_table(&cold, &warm);
    cost_table(&warm.cost, opts.idle);
    calls_table(&cold, &warm, opts.idle);
    Ok(())
}

fn intro(opts: &Options) {
    println!(
        "A lab of two namespaced hosts: {LAB_HOST} managed by the broker, {NODE} a one-node \
         Slurm cluster (Debian's munged, slurmctld and slurmd inside the host, \
         `lab::SlurmCluster`), not in the lab file. The broker (root, so pilots serve its \
         jobs) has `[overflow.slurm]` with `max_nodes = 1`, `lease_s = {LEASE_S}`, the \
         default policy (`overflow` when a request waited ≥ 1 s; the core ticks every \
         250 ms), product report timing (2 s) and ssh as the jobs' remote shell. A job is \
         `agent sh -c 'date +%s%N; rsh anyLinux \"date +%s%N; hostname\"'` run as root on \
         the gateway: times are from the job's `rsh` call (the `date` just before it) to the \
         command running on the host it was given (the `date` there; the lab's hosts share \
         the machine's clock). Each of `sbatch`, `squeue`, `scancel` and `scontrol` in the lab file is \
         run through a recorder script that appends its start and end time to a file (a \
         `sh` and two `date`s, a few ms added to each call). {} repetitions of each cold \
         latency, {} of the warm one and its baseline. The machine is shared with other work: \
         figures are noisy.\n",
        opts.reps,
        opts.reps * WARM_FACTOR
    );
    println!(
        "- **cold**: {LAB_HOST} held by a filler job, no pilot in Slurm and the node idle \
         (`idle_exit_s = {COLD_IDLE_EXIT_S}`: each pilot is cancelled after its job; the next \
         request waits until `squeue` is empty and `sinfo` shows the node idle). Two variants, \
         alternating: the cluster quiet (no job) for {quiet} s first, as on an idle cluster, \
         and back to back (right after the previous pilot left). slurmctld need not \
         schedule a batch job at its submission: its `batch_sched_delay` (3 s by default) \
         lets it delay batch jobs to a later scheduling pass, and the `sched: Allocate` row \
         shows the wait. Split from the recorder's times, slurmctld's and the node's `slurmd`'s \
         logs (`sched: Allocate`, `Launching batch job`, to the millisecond) and the broker \
         log's timestamps (`{JOINS}`).\n\
         - **warm**: `idle_exit_s = {WARM_IDLE_EXIT_S}`; {LAB_HOST} held by a filler job and \
         one pilot up and idle (brought up by one cold request, not counted). Baseline in \
         the same run, before any pilot: the same job with {LAB_HOST} free.\n",
        quiet = cold::QUIET.as_secs()
    );
}

/// One job's request: when it asked (its `rsh` call), when its command ran, and where.
#[derive(Debug, Clone)]
struct Request {
    asked_ns: i128,
    ran_ns: i128,
    host: String,
}

impl Request {
    fn ms(&self) -> f64 {
        (self.ran_ns - self.asked_ns) as f64 / 1e6
    }
}

/// Runs one job (`rsh anyLinux` once) and reads its times; it must run on `want`.
fn timed_request(env: &SlurmLab, want: &str) -> anyhow::Result<Request> {
    let script = "date +%s%N; rsh anyLinux 'date +%s%N; hostname'";
    let out = owner_agent(&env.broker, script).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let parsed = match lines.as_slice() {
        [asked, ran, host] => asked
            .parse()
            .ok()
            .zip(ran.parse().ok())
            .map(|(asked_ns, ran_ns)| Request {
                asked_ns,
                ran_ns,
                host: host.to_string(),
            }),
        _ => None,
    };
    let Some(req) = parsed.filter(|r| r.host == want) else {
        anyhow::bail!(
            "a job's command did not run on {want} ({}): stdout {text:?}, stderr {:?}\nbroker log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            env.broker.log()
        );
    };
    Ok(req)
}

/// Polls `cond` for up to [`STEP_LIMIT`]; an error naming `what` (with the broker log)
/// otherwise.
fn step<T>(env: &SlurmLab, what: &str, cond: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    wait_until(STEP_LIMIT, cond).ok_or_else(|| {
        anyhow::anyhow!(
            "{what}: not within {STEP_LIMIT:?}\nbroker log:\n{}",
            env.broker.log()
        )
    })
}

/// A filler job holding the lab host; returns once the broker shows it held.
fn hold_lab(env: &SlurmLab) -> anyhow::Result<Child> {
    let filler = owner_agent(&env.broker, "rsh anyLinux 'sleep 100000'").spawn()?;
    step(env, "the filler holds the lab host", || {
        (env.broker.held_hosts() == [LAB_HOST]).then_some(())
    })?;
    Ok(filler)
}

/// Ends the filler job (SIGTERM: its agent ends the job) and waits until nothing is held.
fn release_lab(env: &SlurmLab, mut filler: Child) -> anyhow::Result<()> {
    let pid = nix::unistd::Pid::from_raw(filler.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    filler.wait()?;
    step(env, "the filler's host released", || {
        env.broker.held_hosts().is_empty().then_some(())
    })
}

/// Waits until `held` is exactly what the broker shows held (a finished job's host back).
fn wait_held(env: &SlurmLab, held: &[&str]) -> anyhow::Result<()> {
    step(env, "a finished job's host released", || {
        (env.broker.held_hosts() == held).then_some(())
    })
}

/// Waits until no pilot is left: Slurm has no job, the node is idle, the pilot's host is
/// not up in the lab.
fn wait_no_pilot(env: &SlurmLab) -> anyhow::Result<()> {
    step(env, "no pilot left and the node idle", || {
        let queue_empty = env.cluster.job_ids().ok()?.is_empty();
        let out = env
            .cluster
            .run(
                "sinfo",
                &["-h", "-n", NODE, "-p", lab::slurm::PARTITION, "-o", "%t"],
            )
            .ok()?;
        let idle = String::from_utf8_lossy(&out.stdout).trim() == "idle";
        let host_gone = env
            .broker
            .status()?
            .iter()
            .all(|h| h.name != PILOT_HOST || h.state != HostState::Up);
        (queue_empty && idle && host_gone).then_some(())
    })
}

/// A new [`SlurmLab`] whose Slurm commands go through the recorder in `dir`.
fn slurm_lab(dir: &Path, idle_exit_s: u64) -> anyhow::Result<SlurmLab> {
    let mut o = OverflowOptions::new(idle_exit_s, DEFAULT_TIMING);
    o.lease_s = LEASE_S;
    o.wrapper = Some(record::write_recorder(dir)?);
    SlurmLab::start(2, &o).map_err(anyhow::Error::msg)
}

/// The warm part's results.
struct Warm {
    baseline: Vec<f64>,
    warm: Vec<f64>,
    cost: Vec<CostRow>,
    /// Slurm calls while the pilot was up and idle over the cost window.
    idle_calls: [usize; 4],
}

fn warm(opts: &Options) -> anyhow::Result<Warm> {
    let dir = tempfile::Builder::new()
        .prefix("rb-bench-overflow-")
        .tempdir_in("/var/tmp")?;
    let env = slurm_lab(dir.path(), WARM_IDLE_EXIT_S)?;
    let mut baseline = Vec::new();
    for _ in 0..opts.reps * WARM_FACTOR {
        baseline.push(timed_request(&env, LAB_HOST)?.ms());
        wait_held(&env, &[])?;
    }
    let filler = hold_lab(&env)?;
    // One cold request brings the pilot up; it stays (idle exit is an hour).
    timed_request(&env, NODE)?;
    wait_held(&env, &[LAB_HOST])?;
    let mut warm = Vec::new();
    for _ in 0..opts.reps * WARM_FACTOR {
        warm.push(timed_request(&env, NODE)?.ms());
        wait_held(&env, &[LAB_HOST])?;
    }
    let before = record::calls(dir.path()).len();
    let cost = pilot_cost(&env, opts.idle)?;
    let idle_calls = record::count(&record::calls(dir.path())[before..]);
    release_lab(&env, filler)?;
    Ok(Warm {
        baseline,
        warm,
        cost,
        idle_calls,
    })
}

/// One process of the cost table: CPU seconds over the window and RSS at its end.
struct CostRow {
    label: String,
    cpu_s: f64,
    rss_kb: u64,
}

/// The processes measured: the pilot's `rb-hostd` and Slurm's `slurmstepd` of its step,
/// the batch step's `srun` (the pilot script exec'd it) and its `slurmstepd`; baselines:
/// the lab host's `rb-hostd` and the node's `slurmd`.
fn cost_processes(env: &SlurmLab) -> anyhow::Result<Vec<(String, u32)>> {
    let addr = env.broker.tcp_addr().to_string();
    let named = |host: &str, comm: &str| {
        procstat::pids_with_args(&["--broker", &addr, "--host", host])
            .into_iter()
            .find(|&p| procstat::comm(p).as_deref() == Some(comm))
            .ok_or_else(|| anyhow::anyhow!("no {comm} for {host} reporting to {addr}"))
    };
    let hostd_of = |host: &str| named(host, "rb-hostd");
    let hostd = hostd_of(PILOT_HOST)?;
    let step = procstat::parent(hostd).ok_or_else(|| anyhow::anyhow!("no step slurmstepd"))?;
    let srun = named(PILOT_HOST, "srun")?;
    let stepd = procstat::parent(srun).ok_or_else(|| anyhow::anyhow!("no batch slurmstepd"))?;
    let slurmd = env
        .cluster
        .daemons()
        .into_iter()
        .map(|d| d.pid)
        .find(|&p| procstat::comm(p).as_deref() == Some("slurmd"))
        .ok_or_else(|| anyhow::anyhow!("no slurmd of this cluster"))?;
    let name = |p: u32| procstat::comm(p).unwrap_or_else(|| "?".into());
    Ok(vec![
        (format!("pilot: `rb-hostd` on {NODE}"), hostd),
        (
            format!("Slurm's `{}` of the daemon's step", name(step)),
            step,
        ),
        (format!("pilot: the batch step's `{}`", name(srun)), srun),
        (
            format!("Slurm's `{}` of the batch step", name(stepd)),
            stepd,
        ),
        (
            format!("baseline: `rb-hostd` of lab host {LAB_HOST}"),
            hostd_of(LAB_HOST)?,
        ),
        (format!("baseline: `slurmd` on {NODE}"), slurmd),
    ])
}

/// CPU time and RSS of [`cost_processes`] over `idle`, the pilot up and nobody holding it.
fn pilot_cost(env: &SlurmLab, idle: Duration) -> anyhow::Result<Vec<CostRow>> {
    let procs = cost_processes(env)?;
    let before: Vec<Option<f64>> = procs
        .iter()
        .map(|(_, p)| procstat::cpu_seconds(*p))
        .collect();
    let t0 = Instant::now();
    // A fixed measurement window, not a wait for a condition.
    std::thread::sleep(idle);
    let held = env.broker.held_hosts();
    anyhow::ensure!(
        held == [LAB_HOST] && t0.elapsed() >= idle,
        "the pilot was to stay idle; held: {held:?}"
    );
    let mut rows = Vec::new();
    for ((label, pid), c0) in procs.into_iter().zip(before) {
        let (Some(c0), Some(c1), Some(rss_kb)) =
            (c0, procstat::cpu_seconds(pid), procstat::rss_kb(pid))
        else {
            anyhow::bail!("{label} (pid {pid}) ended during the idle window");
        };
        rows.push(CostRow {
            label,
            cpu_s: c1 - c0,
            rss_kb,
        });
    }
    Ok(rows)
}

fn show(v: &[f64], unit: &str, digits: usize) -> String {
    summarize(v).map_or("-".into(), |s| s.show(unit, digits))
}

fn latency_table(cold: &Cold, warm: &Warm) {
    println!("### Request → command running on a Slurm node\n");
    println!("| measurement | median (min–max, n) | goal |");
    println!("|---|---|---|");
    let base = summarize(&warm.baseline);
    println!(
        "| free lab host, no Slurm (baseline) | {} | |",
        show(&warm.baseline, "ms", 1)
    );
    let warm_s = summarize(&warm.warm);
    println!(
        "| warm: an idle pilot up | {} | ≤ baseline + 50 ms |",
        show(&warm.warm, "ms", 1)
    );
    if let (Some(w), Some(b)) = (warm_s, base) {
        println!(
            "| warm over the baseline (difference of the medians) | {:+.1} ms | ≤ 50 ms |",
            w.median - b.median
        );
    }
    let total = |reps: &[cold::ColdRep]| reps.iter().map(|r| r.total_ms).collect::<Vec<f64>>();
    println!(
        "| cold: no pilot up, one submitted (the cluster quiet ≥ {} s) | {} | ≤ 2000 ms |",
        cold::QUIET.as_secs(),
        show(&total(&cold.quiet), "ms", 0)
    );
    let splits: Vec<ColdSplit> = cold.quiet.iter().filter_map(|r| r.split).collect();
    for (i, label) in ColdSplit::STEPS.iter().enumerate() {
        let v: Vec<f64> = splits.iter().map(|s| s.steps[i]).collect();
        println!("| {label} | {} | |", show(&v, "ms", 0));
    }
    let v: Vec<f64> = splits.iter().map(|s| s.sbatch_ms).collect();
    println!(
        "| (within the second step: `sbatch` itself, until it prints the job id) | {} | |",
        show(&v, "ms", 0)
    );
    println!(
        "| cold, back to back: the previous pilot left just before (node idle, queue empty) | {} | |",
        show(&total(&cold.back_to_back), "ms", 0)
    );
    let v: Vec<f64> = cold
        .back_to_back
        .iter()
        .filter_map(|r| r.split.map(|s| s.steps[1]))
        .collect();
    println!(
        "| cold, back to back, `sbatch` starts → slurmctld allocates the node | {} | |",
        show(&v, "ms", 0)
    );
    println!();
    let unsplit = cold.quiet.len() + cold.back_to_back.len()
        - splits.len()
        - cold
            .back_to_back
            .iter()
            .filter(|r| r.split.is_some())
            .count();
    if unsplit > 0 {
        println!(
            "{unsplit} cold repetition(s) could not be split (a time missing from the recorder \
             or the logs).\n"
        );
    }
}

fn cost_table(rows: &[CostRow], idle: Duration) {
    println!("### Cost of a pilot per node\n");
    println!(
        "The pilot up and idle (nobody holds its host) for {} s: CPU time (user + system, from \
         /proc, in 10 ms ticks) and RSS at the end, of the processes a pilot adds to its node, \
         beside the lab host's `rb-hostd` (started by the broker over ssh; same report \
         interval) and the `slurmd` every Slurm node runs anyway.\n",
        idle.as_secs()
    );
    println!("| process | CPU over the window | share of a core | RSS |");
    println!("|---|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.2} s | {:.3} % | {:.1} MiB |",
            r.label,
            r.cpu_s,
            r.cpu_s / idle.as_secs_f64() * 100.0,
            r.rss_kb as f64 / 1024.0
        );
    }
    println!();
}

fn calls_table(cold: &Cold, warm: &Warm, idle: Duration) {
    println!("### Slurm calls\n");
    println!(
        "Counted by the recorder. Per pilot: over the cold part's {} pilots (each from its \
         submission to its idle exit), divided by their number. A pilot's `squeue` is the \
         broker asking Slurm for the job's end (`--jobs=ID --format=\"%T %e\"`) when its \
         daemon says which Slurm job it runs in, and again when Slurm's SIGTERM (here: the \
         idle exit's `scancel`) reaches the daemon; `scontrol` is read once per broker, for \
         `KillWait`, at the first pilot Slurm is already ending. The fewest a pilot can need \
         is one `sbatch` and one `scancel` (baseline).\n",
        cold.pilots()
    );
    println!("| when | sbatch | squeue | scancel | scontrol |");
    println!("|---|---:|---:|---:|---:|");
    let [b, q, c, s] = cold.at_start;
    println!("| broker start (finding an earlier run's pilots) | {b} | {q} | {c} | {s} |");
    let n = cold.pilots().max(1) as f64;
    let [b, q, c, s] = cold.per_reps.map(|x| x as f64 / n);
    println!("| per pilot (cold part) | {b:.1} | {q:.1} | {c:.1} | {s:.1} |");
    let [b, q, c, s] = warm.idle_calls;
    println!(
        "| a pilot up and idle for {} s | {b} | {q} | {c} | {s} |",
        idle.as_secs()
    );
    println!("| fewest possible per pilot (baseline) | 1 | 0 | 1 | 0 |");
    println!();
}
