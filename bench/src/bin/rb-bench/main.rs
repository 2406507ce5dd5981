//! `rb-bench`: runs the resource-layer benchmarks and prints their BENCHMARKS.md sections.
//! Every figure is measured beside its baseline in the same run. Lab sections need root.

mod agent;
mod apps;
mod core_cost;
mod jel;
mod jel_lab;
mod module_steps;
mod modules;
mod overflow;
mod owner_logind;
mod policy;
mod profile;
mod reuse;
mod scale;
mod sessions;
mod ssh;
mod steps;
mod take_back;
mod web;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use bench::{
    procstat,
    stats::{summarize, Summary},
};
use clap::Parser;
use proto::report::HostState;
use tests::{labtier, wait_until, Broker};

#[derive(Debug, Parser)]
#[command(name = "rb-bench")]
struct Args {
    /// Simulated host counts for the broker load benchmark.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1000, 10000])]
    hosts: Vec<usize>,
    /// Repetitions for latency measurements.
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Repetitions for the agent-layer (paper Table 1/2) measurements (Table 1's `null` rows
    /// run three times as many: cheap, and their targets are a few ms).
    #[arg(long, default_value_t = 20)]
    agent_reps: usize,
    /// Remote shells of the agent-layer jobs.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["rsh".to_string(), "ssh".to_string()])]
    agent_transports: Vec<String>,
    /// Agent-layer parts to run (table1, table2, memory, reuse, steps: where one `rsh
    /// anyLinux true` spends its time); default all.
    #[arg(long, value_delimiter = ',')]
    agent_parts: Vec<String>,
    /// Repetitions for the module (paper Table 3) measurements (LAM's own start-up varies
    /// by tens of ms from run to run, with ~45 ms stalls in about one run in three, so more
    /// than the other tables).
    #[arg(long, default_value_t = 9)]
    module_reps: usize,
    /// Systems of the module measurements (pvm, lam); default both.
    #[arg(long, value_delimiter = ',')]
    module_systems: Vec<String>,
    /// Machine counts of the module measurements, each 1 to 8; default 1,2,4,8.
    #[arg(long, value_delimiter = ',')]
    module_machines: Vec<usize>,
    /// The module section's jobs' soft open-files limit (`ulimit -Sn N` in every run's
    /// script, every way alike); default: as inherited. PVM's start of a host closes every
    /// descriptor up to it, twice.
    #[arg(long, value_name = "N")]
    module_open_files: Option<u64>,
    /// Record the `anyLinux` runs' step times (`RB_STEP_TIMES`: the shim, the agent and its
    /// module runs, `rb-pvm-add`, the subagent; `rb-timeit` marks before each add and after
    /// its host joined) into FILE, to see by hand where an add spends its time.
    #[arg(long, value_name = "FILE")]
    module_step_times: Option<std::path::PathBuf>,
    /// Parts of the module section (table3: the paper's Table 3; take-back: a host taken
    /// back during a LAM run, beside Open MPI); default both.
    #[arg(long, value_delimiter = ',')]
    module_parts: Vec<String>,
    /// Runs of each kind in the module section's take-back part.
    #[arg(long, default_value_t = 9)]
    take_back_reps: usize,
    /// Policy-section parts to run (grant, reload, footprint, paired, profile, core, sessions,
    /// scale, owner, figure7, owner-logind); default all (`paired` only with
    /// `--broker-compared`; `profile` where `perf` is installed).
    #[arg(long, value_delimiter = ',')]
    policy_parts: Vec<String>,
    /// `rb-broker` of `policy::BEFORE_POLICY_FILES` (policy compiled in): the baseline of the
    /// policy section's footprint rows; `bench.sh` builds it.
    #[arg(long, value_name = "PATH")]
    broker_before_policy_files: Option<std::path::PathBuf>,
    /// Another `rb-broker` (e.g. built from an earlier commit) whose paper-policy rows run
    /// beside today's in the policy section's footprint.
    #[arg(long, value_name = "PATH")]
    broker_compared: Option<std::path::PathBuf>,
    /// The name of `--broker-compared` in the rows (e.g. its commit).
    #[arg(long, default_value = "compared")]
    broker_compared_label: String,
    /// Another `rb-corecost` (e.g. built from an earlier commit) whose rows run beside
    /// today's in the policy section's `core` part.
    #[arg(long, value_name = "PATH")]
    corecost_compared: Option<std::path::PathBuf>,
    /// The name of `--corecost-compared` in the rows.
    #[arg(long, default_value = "compared")]
    corecost_compared_label: String,
    /// Rounds of the policy section's footprint rows (each broker once per round; their
    /// CPU windows pooled).
    #[arg(long, default_value_t = 3)]
    footprint_rounds: usize,
    /// Grants timed per policy and host count in the policy section.
    #[arg(long, default_value_t = 1000)]
    policy_grants: usize,
    /// Members of the JEL benchmark (each with a member and a watch connection).
    #[arg(long, default_value_t = 2000)]
    jel_members: usize,
    /// Deaths measured by the JEL benchmark (p50/p99 of the slowest watcher), on one host
    /// and on the lab each.
    #[arg(long, default_value_t = 100)]
    jel_reps: usize,
    /// Host releases of the JEL section's lab part (`vacate` latency).
    #[arg(long, default_value_t = 12)]
    jel_vacates: usize,
    /// JEL-section parts to run (lab, scale); default both.
    #[arg(long, value_delimiter = ',')]
    jel_parts: Vec<String>,
    /// Time compressions of the utilization experiment (apps section).
    #[arg(long, value_delimiter = ',', default_values_t = vec![60, 10])]
    utilization_scales: Vec<u32>,
    /// Utilization runs at each scale: adaptive (rb-mw beside the sequential jobs),
    /// baseline (the sequential jobs alone); default both.
    #[arg(long, value_delimiter = ',')]
    utilization_arms: Vec<String>,
    /// Apps-section parts to run (utilization, speedup, speedup-mw, speedup-jacobi,
    /// figure7; speedup is rb-bnb's); default all.
    #[arg(long, value_delimiter = ',')]
    apps_parts: Vec<String>,
    /// Repetitions of each latency of the overflow section (cold, warm, and the baseline).
    #[arg(long, default_value_t = 5)]
    overflow_reps: usize,
    /// Seconds an idle pilot is watched for its cost in the overflow section.
    #[arg(long, default_value_t = 60)]
    overflow_idle_s: u64,
    /// Run only these sections (resource, agent, ssh, modules, policy, jel, apps, overflow;
    /// metrics: only the resource layer's "Metrics endpoint");
    /// default all.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let wanted = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    if wanted("resource") {
        println!("## Resource layer (broker, host daemons)\n");
        broker_load(&args.hosts)?;
        hostd_footprint()?;
        if tests::is_root() {
            lab_latencies(args.reps)?;
        } else {
            println!("### Lab latencies\n\nskipped: needs root (network namespaces)\n");
        }
    }
    // Part of the resource layer; `--only metrics` runs it alone.
    if wanted("resource") || args.only.iter().any(|o| o == "metrics") {
        web::run(args.hosts.iter().copied().max().unwrap_or(10_000))?;
    }
    if wanted("agent") {
        if tests::is_root() {
            agent::run(&agent::Options {
                reps: args.agent_reps,
                transports: args.agent_transports.clone(),
                parts: args.agent_parts.clone(),
            })?;
        } else {
            println!("## Agent layer\n\nskipped: needs root (network namespaces)\n");
        }
    }
    if wanted("ssh") {
        if tests::is_root() {
            ssh::run(args.agent_reps)?;
        } else {
            println!("## ssh drop-in (issue 27)\n\nskipped: needs root (network namespaces)\n");
        }
    }
    if wanted("modules") {
        let part =
            |p: &str| args.module_parts.is_empty() || args.module_parts.iter().any(|x| x == p);
        if let Some(bad) = args
            .module_parts
            .iter()
            .find(|p| !["table3", "take-back"].contains(&p.as_str()))
        {
            anyhow::bail!("--module-parts: unknown part {bad:?} (table3, take-back)");
        }
        if !tests::is_root() {
            println!("## Modules\n\nskipped: needs root (network namespaces; PVM and LAM run as the lab user)\n");
        } else if part("table3") {
            modules::run(&modules::Options {
                reps: args.module_reps,
                systems: args.module_systems.clone(),
                machines: args.module_machines.clone(),
                open_files: args.module_open_files,
                step_times: args.module_step_times.clone(),
            })?;
        } else {
            println!("## Modules: PVM and LAM/MPI jobs\n");
        }
        if tests::is_root() && part("take-back") {
            take_back::run(args.take_back_reps)?;
        }
    }
    if wanted("policy") {
        policy::run(&policy::Options {
            hosts: args.hosts.clone(),
            grants: args.policy_grants,
            lab_reps: args.reps.min(5),
            owner_logind_reps: args.reps.max(10),
            transports: args.agent_transports.clone(),
            parts: args.policy_parts.clone(),
            broker_before: args.broker_before_policy_files.clone(),
            broker_compared: args
                .broker_compared
                .clone()
                .map(|p| (args.broker_compared_label.clone(), p)),
            footprint_rounds: args.footprint_rounds,
            corecost_compared: args
                .corecost_compared
                .clone()
                .map(|p| (args.corecost_compared_label.clone(), p)),
        })?;
    }
    if wanted("jel") {
        jel::run(&jel::Options {
            members: args.jel_members,
            reps: args.jel_reps,
            vacates: args.jel_vacates,
            parts: args.jel_parts.clone(),
        })?;
    }
    if wanted("apps") {
        apps::run(&apps::Options {
            scales: args.utilization_scales.clone(),
            arms: args.utilization_arms.clone(),
            parts: args.apps_parts.clone(),
            reps: args.reps.min(5),
        })?;
    }
    if wanted("overflow") {
        overflow::run(&overflow::Options {
            reps: args.overflow_reps,
            idle: Duration::from_secs(args.overflow_idle_s),
        })?;
    }
    Ok(())
}

/// CPU share (percent of one core) over `n` windows of `window`, and the largest RSS seen.
fn sample_windows(pid: u32, n: usize, window: Duration) -> (Summary, u64) {
    let mut shares = Vec::new();
    let mut rss = 0;
    for _ in 0..n {
        if let Some((share, kb)) = procstat::measure(pid, window) {
            shares.push(share * 100.0);
            rss = rss.max(kb);
        }
    }
    (
        summarize(&shares).unwrap_or(Summary {
            median: f64::NAN,
            min: f64::NAN,
            max: f64::NAN,
            n: 0,
        }),
        rss,
    )
}

/// Whether `program --version` runs here (a tool a part needs: valgrind, perf).
pub(crate) fn runs_here(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A manual lab of `n` hosts with no address (the load generator plays their daemons).
pub(crate) fn manual_lab(n: usize) -> String {
    lab_of(n, |_| String::new())
}

/// [`manual_lab`] with an address for each host, 127.1.x.y: a job's remote shell to one
/// reaches nobody (nothing listens there) and fails at once, on this machine.
pub(crate) fn manual_lab_with_addresses(n: usize) -> String {
    lab_of(n, |i| {
        format!("address = \"127.1.{}.{}\"\n", i / 256, i % 256)
    })
}

/// A manual lab of `n` hosts `load00001`…, each entry ended by `more(i)`.
fn lab_of(n: usize, more: impl Fn(usize) -> String) -> String {
    let mut text = String::from(
        "[broker]\nlisten = \"127.0.0.1:0\"\ntransport = \"manual\"\nstate_dir = \"@STATE@\"\nsecret_file = \"@SECRET@\"\nreport_interval_s = 1\ndown_after_s = 5\n",
    );
    for i in 1..=n {
        text.push_str(&format!("[[host]]\nname = \"load{i:05}\"\n{}", more(i)));
    }
    text
}

fn broker_load(counts: &[usize]) -> anyhow::Result<()> {
    println!("### Broker under load: simulated hosts reporting every second\n");
    println!("A load generator (`rb-loadgen`) opens one TCP connection per simulated host, completes the real HMAC handshake as `hostd`, and sends a real-sized report (one user session) every second. CPU share is of one core (100 % = one core busy), median of five 2 s windows (min–max); RSS is the largest seen. Baseline: the same broker with no hosts.\n");
    println!("| hosts | broker CPU | broker RSS | all hosts up after | `rb status --json` | load generator CPU |");
    println!("|---:|---|---:|---:|---|---|");
    for &n in std::iter::once(&0).chain(counts) {
        let row = one_load_run(Broker::start(&manual_lab(n)), n, false)?;
        println!("{row}");
    }
    println!();
    Ok(())
}

/// One row of the load tables: `broker` (its lab file naming `n` hosts), `n` simulated
/// hosts, their reports repeating each other but for their counter (`changing`: each
/// differs, see `rb-loadgen`).
pub(crate) fn one_load_run(broker: Broker, n: usize, changing: bool) -> anyhow::Result<String> {
    Ok(LoadRun::measure(broker, n, changing)?.row(n))
}

/// `rb-loadgen` simulating `n` hosts against `broker` for `seconds` (reports changing each
/// time when `changing`).
pub(crate) fn spawn_loadgen(
    broker: &Broker,
    n: usize,
    changing: bool,
    seconds: u64,
) -> std::io::Result<std::process::Child> {
    let addr = broker.tcp_addr().to_string();
    spawn_loadgen_at(
        &addr,
        &broker.secret(),
        n,
        Reports::as_today(changing),
        seconds,
    )
}

/// What the simulated daemons send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reports {
    /// Each report differs from the last (`rb-loadgen --changing`).
    pub(crate) changing: bool,
    /// Sent whole even where the broker takes what changed (`--whole-reports`, as a daemon
    /// from before `report_changes`).
    pub(crate) whole: bool,
}

impl Reports {
    /// As today's daemons send them: what changed, where the broker offers it.
    pub(crate) fn as_today(changing: bool) -> Self {
        Reports {
            changing,
            whole: false,
        }
    }
}

/// `rb-loadgen` of `n` hosts against `addr`, proving the secret in `secret`, sending
/// `reports`.
pub(crate) fn spawn_loadgen_at(
    addr: &str,
    secret: &Path,
    n: usize,
    Reports { changing, whole }: Reports,
    seconds: u64,
) -> std::io::Result<std::process::Child> {
    Command::new(tests::bin("rb-loadgen"))
        .args(["--broker", addr, "--hosts", &n.to_string()])
        .args(["--seconds", &seconds.to_string()])
        .args(changing.then_some("--changing"))
        .args(whole.then_some("--whole-reports"))
        .arg("--secret-file")
        .arg(secret)
        .stdout(Stdio::piped())
        .spawn()
}

/// How `rb-readfloor` reads the reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadFloor {
    /// Each frame parsed with the broker's decoder (`--parse`), not only cut into lines.
    pub(crate) parse: bool,
    /// Through io_uring (`--uring`) instead of epoll and tokio's tasks, as the broker.
    pub(crate) uring: bool,
}

impl ReadFloor {
    /// Read and parsed as the broker's sessions do.
    pub(crate) const AS_THE_BROKER: ReadFloor = ReadFloor {
        parse: true,
        uring: false,
    };
    /// Read and parsed, through io_uring.
    pub(crate) const THROUGH_URING: ReadFloor = ReadFloor {
        parse: true,
        uring: true,
    };
}

/// `program` (`rb-readfloor`, or a wrapper that runs it) expecting `n` connections that
/// prove `secret`, reading their frames as `how` says: the process, the address it listens
/// on (its first line), and the rest of its lines (`all N connected` comes next).
pub(crate) fn spawn_readfloor(
    program: &Path,
    n: usize,
    how: ReadFloor,
    secret: &Path,
) -> anyhow::Result<(
    std::process::Child,
    String,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
)> {
    use std::io::BufRead;
    let mut floor = Command::new(program)
        .args(["--hosts", &n.to_string()])
        .args(how.parse.then_some("--parse"))
        .args(how.uring.then_some("--uring"))
        .arg("--secret-file")
        .arg(secret)
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = floor
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("rb-readfloor's stdout is not piped"))?;
    let mut said = std::io::BufReader::new(stdout).lines();
    let addr = said.next().transpose()?.unwrap_or_default();
    Ok((floor, addr, said))
}

/// `Some(())` once `rb status` shows `n` hosts up, within `limit`.
pub(crate) fn all_up_within(broker: &Broker, n: usize, limit: Duration) -> Option<()> {
    wait_until(limit, || {
        broker
            .status()
            .filter(|rows| rows.iter().filter(|h| h.state == HostState::Up).count() == n)
            .map(|_| ())
    })
}

/// What one broker under `rb-loadgen` measured; runs of the same broker pool into one row.
#[derive(Debug, Default)]
pub(crate) struct LoadRun {
    /// CPU share of each 2 s window, percent of one core.
    cpu: Vec<f64>,
    /// Largest RSS seen, KiB.
    rss_kb: u64,
    /// Seconds until every simulated host was up (`None`: not within 40 s).
    up_after_s: Vec<Option<f64>>,
    /// `rb status --json`, ms.
    status_ms: Vec<f64>,
    /// The load generator's CPU share, percent of one core.
    gen_cpu: Vec<f64>,
}

impl LoadRun {
    /// Starts `n` simulated hosts against `broker`, waits until all are up, then samples
    /// the broker's CPU over five 2 s windows and times `rb status --json` five times.
    pub(crate) fn measure(broker: Broker, n: usize, changing: bool) -> anyhow::Result<LoadRun> {
        Self::measure_reports(broker, n, Reports::as_today(changing))
    }

    /// [`Self::measure`], the simulated daemons sending `reports`.
    pub(crate) fn measure_reports(
        broker: Broker,
        n: usize,
        reports: Reports,
    ) -> anyhow::Result<LoadRun> {
        let pid = broker.child.id();
        let started = Instant::now();
        let addr = broker.tcp_addr().to_string();
        let mut gen = (n > 0)
            .then(|| spawn_loadgen_at(&addr, &broker.secret(), n, reports, 45))
            .transpose()?;
        let mut run = LoadRun::default();
        if n > 0 {
            let all_up = all_up_within(&broker, n, Duration::from_secs(40));
            run.up_after_s
                .push(all_up.map(|()| started.elapsed().as_secs_f64()));
        }
        run.sample_cpu(pid, gen.as_ref().map(|g| g.id()));
        for _ in 0..5 {
            // The command alone, its output piped as a script's would be (not parsed here).
            let t = Instant::now();
            let out = broker.rb(&["status", "--json"]);
            let took = t.elapsed().as_secs_f64() * 1000.0;
            if out.status.success() {
                run.status_ms.push(took);
            }
        }
        if let Some(g) = gen.as_mut() {
            let _ = g.kill();
            let _ = g.wait();
        }
        Ok(run)
    }

    /// As [`Self::measure`] with `rb-readfloor` in the broker's place (its frames read as
    /// `how` says, nothing else): the floor under the broker's CPU for the same load. "All
    /// up" is when it has read `n` connections' welcomes; no `rb status`.
    pub(crate) fn measure_floor(
        n: usize,
        reports: Reports,
        how: ReadFloor,
    ) -> anyhow::Result<LoadRun> {
        let dir = tempfile::tempdir()?;
        let secret = dir.path().join("secret");
        proto::auth::write_new_secret(&secret, false)?;
        let started = Instant::now();
        let (mut floor, addr, mut said) =
            spawn_readfloor(&tests::bin("rb-readfloor"), n, how, &secret)?;
        let mut gen = spawn_loadgen_at(&addr, &secret, n, reports, 45)?;
        let mut run = LoadRun::default();
        // The line comes once all are connected, or never (then the reader is killed below).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(said.next());
        });
        let all_up = rx.recv_timeout(Duration::from_secs(40)).ok().flatten();
        run.up_after_s
            .push(all_up.map(|_| started.elapsed().as_secs_f64()));
        run.sample_cpu(floor.id(), Some(gen.id()));
        for child in [&mut gen, &mut floor] {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(run)
    }

    /// The load generator's CPU over one 2 s window, then `pid`'s over five, and its RSS.
    fn sample_cpu(&mut self, pid: u32, gen: Option<u32>) {
        let window = Duration::from_secs(2);
        let gen_cpu = gen.and_then(|g| procstat::measure(g, window));
        self.gen_cpu.extend(gen_cpu.map(|(s, _)| s * 100.0));
        for _ in 0..5 {
            if let Some((share, kb)) = procstat::measure(pid, window) {
                self.cpu.push(share * 100.0);
                self.rss_kb = self.rss_kb.max(kb);
            }
        }
    }

    /// Adds `other`'s samples (another run of the same broker and load).
    pub(crate) fn pool(&mut self, other: LoadRun) {
        self.cpu.extend(other.cpu);
        self.rss_kb = self.rss_kb.max(other.rss_kb);
        self.up_after_s.extend(other.up_after_s);
        self.status_ms.extend(other.status_ms);
        self.gen_cpu.extend(other.gen_cpu);
    }

    /// The CPU share's median, percent of one core.
    pub(crate) fn cpu_median(&self) -> Option<f64> {
        summarize(&self.cpu).map(|s| s.median)
    }

    /// `| n | CPU | RSS | all up after | status | load generator |`: medians (min–max, n).
    pub(crate) fn row(&self, n: usize) -> String {
        let cpu = summarize(&self.cpu).map_or("-".into(), |s| s.show("%", 2));
        let up: Vec<f64> = self.up_after_s.iter().flatten().copied().collect();
        let late = self.up_after_s.len() - up.len();
        let up_after = match (n, summarize(&up)) {
            (0, _) => "-".to_string(),
            (_, None) => "not all up in 40 s".into(),
            (_, Some(s)) if late > 0 => format!(
                "{:.2} s (median of {}; {late} of {} runs not all up in 40 s)",
                s.median,
                s.n,
                self.up_after_s.len()
            ),
            (_, Some(s)) if s.n == 1 => format!("{:.2} s", s.median),
            (_, Some(s)) => format!("{:.2} s (median of {})", s.median, s.n),
        };
        let status = summarize(&self.status_ms).map_or("-".into(), |s| s.show("ms", 1));
        let gen = summarize(&self.gen_cpu).map_or("-".into(), |s| format!("{:.0} %", s.median));
        format!(
            "| {n} | {cpu} | {:.1} MiB | {up_after} | {status} | {gen} |",
            self.rss_kb as f64 / 1024.0
        )
    }
}

fn hostd_footprint() -> anyhow::Result<()> {
    println!("### Host daemon footprint\n");
    println!("One `rb-hostd` reporting to a broker. /proc CPU times tick every 10 ms, too coarse for a daemon that wakes every 2 s, so CPU is measured as CPU time per report with the daemon reporting every 50 ms for 10 s (three windows; its 250 ms activity poll included), and converted to the share of one core at the default 2 s interval. RSS is at the default interval. Baselines measured in the same run: a `sleep` process (the smallest possible resident process) and, in the lab, the per-host `sshd` every lab machine already runs (CPU shares over three 10 s windows).\n");
    println!("| process | CPU | RSS |");
    println!("|---|---|---:|");
    let per_report_us = hostd_cpu_per_report()?;
    let (_broker, pid) = local_hostd(2.0, 6.0)?;
    let (_, rss) = sample_windows(pid, 2, Duration::from_secs(2));
    let at_default = per_report_us.map(|s| s.median / 2_000_000.0 * 100.0);
    println!(
        "| rb-hostd | {} per report ({}) → {} of a core at 2 s | {:.1} MiB |",
        per_report_us.map_or("-".into(), |s| format!("{:.0} µs", s.median)),
        per_report_us.map_or("-".into(), |s| format!(
            "{:.0}–{:.0} µs, n={}",
            s.min, s.max, s.n
        )),
        at_default.map_or("-".into(), |p| format!("{p:.4} %")),
        rss as f64 / 1024.0
    );
    let mut sleeper = Command::new("sleep").arg("60").spawn()?;
    let (cpu, rss) = sample_windows(sleeper.id(), 3, Duration::from_secs(10));
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    println!(
        "| sleep (baseline) | {} | {:.1} MiB |",
        cpu.show("%", 3),
        rss as f64 / 1024.0
    );
    if tests::is_root() {
        let env = labtier::LabWithBroker::start(1, &[]);
        let host = env.lab.hosts()[0].name.clone();
        let out = env.lab.exec(&host, &["pgrep", "-o", "-x", "sshd"])?;
        let inner = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let outer = outer_pid(&env.lab, &host, &inner);
        if let Some(pid) = outer {
            let (cpu, rss) = sample_windows(pid, 3, Duration::from_secs(10));
            println!(
                "| sshd in a lab host (baseline) | {} | {:.1} MiB |",
                cpu.show("%", 3),
                rss as f64 / 1024.0
            );
        }
    }
    println!();
    Ok(())
}

/// A broker with one virtual host whose daemon reports every `interval_s`; the daemon's pid.
/// Keep the broker alive while measuring.
fn local_hostd(interval_s: f64, down_after_s: f64) -> anyhow::Result<(Broker, u32)> {
    let broker = Broker::start(&tests::local_lab_timed(1, interval_s, down_after_s));
    broker.wait_all_up(Duration::from_secs(10));
    let pid = broker
        .local_hostd_pid("vhost01")
        .ok_or_else(|| anyhow::anyhow!("no hostd pid"))?;
    Ok((broker, pid as u32))
}

/// CPU microseconds per report of a host daemon reporting every 50 ms (three 10 s windows).
fn hostd_cpu_per_report() -> anyhow::Result<Option<Summary>> {
    let (_broker, pid) = local_hostd(0.05, 2.0)?;
    let mut per_report = Vec::new();
    for _ in 0..3 {
        if let Some((share, _)) = procstat::measure(pid, Duration::from_secs(10)) {
            // share × 50 ms = CPU time per 50 ms interval, i.e. per report.
            per_report.push(share * 50_000.0);
        }
    }
    Ok(summarize(&per_report))
}

/// Root-namespace pid of a process known by its pid inside a lab host.
fn outer_pid(lab: &lab::Lab, host: &str, inner: &str) -> Option<u32> {
    let out = lab
        .exec(host, &["cat", &format!("/proc/{inner}/stat")])
        .ok()?;
    let start = String::from_utf8_lossy(&out.stdout)
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .to_string();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Ok(pid) = name.parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(Path::new("/proc").join(&name).join("stat")) else {
            continue;
        };
        let same_start = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(19).map(|s| s == start))
            .unwrap_or(false);
        let comm_is_sshd = stat.contains("(sshd)");
        let status = std::fs::read_to_string(Path::new("/proc").join(&name).join("status"))
            .unwrap_or_default();
        let nspid_matches = status
            .lines()
            .find(|l| l.starts_with("NSpid:"))
            .is_some_and(|l| l.split_whitespace().last() == Some(inner));
        if same_start && comm_is_sshd && nspid_matches {
            return Some(pid);
        }
    }
    None
}

fn lab_latencies(reps: usize) -> anyhow::Result<()> {
    println!("### Lab latencies (real namespaced hosts, daemons started over ssh)\n");
    println!("Broker in the root namespace, `rb-hostd` started on each host over real ssh; report interval 2 s, host down after 6 s of silence, restart backoff capped at 2 s (as in the lab tests). Latency = until `rb status` shows the change (polled every 20 ms).\n");
    let env =
        labtier::LabWithBroker::start_with(2, &[("node03", "alice")], labtier::DEFAULT_TIMING);
    let mut boot_sshd = Vec::new();
    let mut boot_up = Vec::new();
    for _ in 0..reps.min(5) {
        env.lab.crash("node02")?;
        env.broker
            .wait_host("node02", Duration::from_secs(10), "down", |h| {
                h.state == HostState::Down
            });
        let t0 = Instant::now();
        env.lab.boot("node02")?;
        boot_sshd.push(t0.elapsed().as_secs_f64() * 1000.0);
        env.broker
            .wait_host("node02", Duration::from_secs(15), "up", |h| {
                h.state == HostState::Up
            });
        boot_up.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    let mut login = Vec::new();
    let mut periodic = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        let session =
            env.lab
                .fake_login("node03", "alice", "rbtty-alice", Duration::from_secs(600))?;
        env.broker
            .wait_host("node03", Duration::from_secs(5), "login", |h| {
                h.users.iter().any(|u| u.user == "alice")
            });
        login.push(t0.elapsed().as_secs_f64() * 1000.0);
        // Baseline: a change no trigger fires for (idle 600 s -> 300 s) waits for the periodic report.
        let t1 = Instant::now();
        session.set_idle(Duration::from_secs(300))?;
        env.broker
            .wait_host("node03", Duration::from_secs(5), "idle change", |h| {
                h.users
                    .iter()
                    .any(|u| u.user == "alice" && u.idle_s.is_some_and(|i| i < 400))
            });
        periodic.push(t1.elapsed().as_secs_f64() * 1000.0);
        session.end()?;
        env.broker
            .wait_host("node03", Duration::from_secs(5), "logout", |h| {
                h.users.iter().all(|u| u.user != "alice")
            });
    }
    println!("| measurement | median (min–max, n) |");
    println!("|---|---|");
    let show = |v: &[f64]| summarize(v).map_or("-".into(), |s| s.show("ms", 0));
    println!(
        "| host boot → its sshd accepts (baseline) | {} |",
        show(&boot_sshd)
    );
    println!("| host boot → up in `rb status` | {} |", show(&boot_up));
    println!(
        "| owner login → visible in `rb status` (immediate report) | {} |",
        show(&login)
    );
    println!(
        "| idle-time change → visible (periodic report, baseline) | {} |",
        show(&periodic)
    );
    println!();
    Ok(())
}
