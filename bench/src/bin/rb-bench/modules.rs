//! Module benchmarks: the paper's Table 3 — how long it takes to add 1, 2, 4 and 8 machines
//! to a running PVM virtual machine and to a running LAM universe, three ways:
//!
//! - `w/ rsh`: the user names the hosts, the system runs the real rsh (no ResourceBroker);
//! - `w/ rsh host`: the same inside a job under `agent` (the system's rsh is our shim, which
//!   passes named, unallocated hosts straight through);
//! - `w/ rsh anyLinux`: a module job asks for `anyLinux` (phase 1, through the job preload
//!   library and the shim), the broker grants a host and `NAME-grow HOST` adds it (phase 2).
//!
//! Hosts are added one per command, each after the previous one joined, the same way in all
//! three rows, so the difference between rows is what ResourceBroker adds per machine. A
//! driver script on node02 (the lab user's front end, not managed) times the additions with
//! `date +%s%N`; set-up (master pvmd, `lamboot`) and tear-down are outside the timing.

use std::{path::PathBuf, process::Output, time::Duration};

use bench::stats::summarize;
use tests::{
    labtier::{LabWithBroker, FRONT_END},
    wait_until,
};

use crate::{agent::show, module_steps};

/// The machine counts of the paper's Table 3 (the default of `--module-machines`).
pub const MACHINES: [usize; 4] = [1, 2, 4, 8];
/// node03..node10: the most machines a run can add.
const MAX_MACHINES: usize = 8;

/// What `--only modules` measures.
pub struct Options {
    pub reps: usize,
    /// `pvm`, `lam` (empty: both).
    pub systems: Vec<String>,
    /// Machine counts, each 1..=8 (empty: [`MACHINES`]).
    pub machines: Vec<usize>,
    /// The jobs' soft open-files limit (`None`: inherited).
    pub open_files: Option<u64>,
    /// Where the `anyLinux` jobs' step times go (`None`: not recorded).
    pub step_times: Option<PathBuf>,
}

/// What every run's script gets besides its way: the open-files limit, and the marks
/// around each `anyLinux` add when step times are recorded.
struct Setup {
    open_files: Option<u64>,
    /// Where step times go, when they are recorded.
    steps: Option<StepRecording>,
}

/// Step times being recorded: the file in the lab user's home the jobs write, and the
/// `rb-timeit` that marks each add.
struct StepRecording {
    file: PathBuf,
    timeit: String,
}

impl Setup {
    /// Empties the step file (a new system's adds start).
    fn clear_step_file(&self) -> anyhow::Result<()> {
        if let Some(steps) = &self.steps {
            std::fs::write(&steps.file, "")?;
        }
        Ok(())
    }

    /// The script's first line: the soft open-files limit, where set.
    fn prelude(&self) -> String {
        self.open_files
            .map(|n| format!("ulimit -Sn {n} || exit 4; "))
            .unwrap_or_default()
    }

    /// A command that records a step (`timeit.spawn`, `timeit.reaped`), or `:`.
    fn mark(&self) -> String {
        match &self.steps {
            Some(steps) => format!("{} 1 /bin/true >/dev/null 2>&1", steps.timeit),
            None => ":".into(),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Real,
    ShimHost,
    /// LAM only: named hosts through the shim, booted with `boot_rsh_fast` as `lam-grow`
    /// boots (no `echo $SHELL` probe): the same LAM boot procedure as the anyLinux row.
    ShimHostFast,
    AnyLinux,
}

impl System {
    /// The rows measured for the system, in table order.
    fn ways(self) -> &'static [Way] {
        match self {
            System::Pvm => &[Way::Real, Way::ShimHost, Way::AnyLinux],
            System::Lam => &[Way::Real, Way::ShimHost, Way::ShimHostFast, Way::AnyLinux],
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum System {
    Pvm,
    Lam,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Pvm => "pvm",
            System::Lam => "lam",
        }
    }

    /// The paper's Table 3 figure (seconds) for `n` machines, "—" where it has none.
    fn paper(self, way: Way, n: usize) -> &'static str {
        let row = match (self, way) {
            (System::Pvm, Way::Real) => ["0.5", "1.1", "2.3", "6.7"],
            (System::Pvm, Way::ShimHost) => ["0.6", "1.4", "3.2", "7.1"],
            (System::Pvm, Way::AnyLinux) => ["2.1", "3.6", "9.1", "17.6"],
            (System::Lam, Way::Real) => ["1.8", "1.8", "2.1", "2.0"],
            (System::Lam, Way::ShimHost) => ["2.5", "2.8", "2.4", "2.4"],
            (System::Lam, Way::AnyLinux) => ["4.2", "8.8", "16.8", "33.5"],
            (_, Way::ShimHostFast) => return "—",
        };
        MACHINES
            .iter()
            .position(|&m| m == n)
            .map_or("—", |i| row[i])
    }
}

fn label(system: System, way: Way) -> String {
    let name = system.name();
    match way {
        Way::Real => format!("`{name} w/ rsh` (real rsh, baseline)"),
        Way::ShimHost => format!("`{name} w/ rsh host` (through the shim)"),
        Way::ShimHostFast => {
            format!("`{name} w/ rsh host`, `boot_rsh_fast` (through the shim, as lam-grow boots)")
        }
        Way::AnyLinux => format!("`{name} w/ rsh anyLinux` (module job)"),
    }
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let reps = opts.reps;
    let machines: Vec<usize> = match opts.machines.is_empty() {
        true => MACHINES.to_vec(),
        false => opts.machines.clone(),
    };
    if let Some(n) = machines.iter().find(|&&n| n == 0 || n > MAX_MACHINES) {
        anyhow::bail!("--module-machines: {n} is not between 1 and {MAX_MACHINES}");
    }
    let mut systems = Vec::new();
    for system in [System::Pvm, System::Lam] {
        if opts.systems.is_empty() || opts.systems.iter().any(|s| s == system.name()) {
            systems.push(system);
        }
    }
    if let Some(bad) = opts
        .systems
        .iter()
        .find(|s| !["pvm", "lam"].contains(&s.as_str()))
    {
        anyhow::bail!("--module-systems: unknown system {bad:?} (pvm, lam)");
    }
    println!("## Modules: PVM and LAM/MPI jobs (paper Table 3)\n");
    println!("Real PVM 3.4.6 and LAM/MPI 7.1.4 from Debian, run by the lab user `rblab` on node02 (the front end, not managed by the broker); node03–node10 are the machines added, over real rsh (netkit in.rshd). Each figure is the time to add N machines to a running virtual machine (master pvmd on node02) or LAM universe (booted on node02), one machine per command, each once the previous one has joined: `add HOST` at the `pvm` console or `lamgrow HOST` for named hosts; for `anyLinux`, `pvm> add anyLinux` or `lamgrow anyLinux` in a job under `agent --rsl '&(module=\"NAME\")(adaptive=yes)'`, timed until the granted host is in the virtual machine (a PvmHostAdd notification from the master pvmd, then `pvm_config`: nothing polls the pvmd while it adds the host) or in the LAM universe (`lam_wait_nodes`: one `getnall()` request to the local lamd every millisecond from one process; a shell loop of `lamnodes | wc -l` cost three processes per poll and competed with `lamgrow` for the 2 CPUs); the next request waits, untimed, for the module's `NAME-grow` to exit. The modules add with the helpers built with ResourceBroker: `pvm-grow` with `rb-pvm-add` (a PVM task calling `pvm_addhosts`, no console), `lam-grow` with `rb-lam-add` (LAM's own boot, without `lamgrow`'s asking every node whether another lamgrow runs); the named rows are what a user types. `lam-grow` boots with LAM's `boot_rsh_fast` (no `echo $SHELL` probe of the new host, see modules/README.md), so LAM has a fourth row, named hosts booted the same way, and the LAM per-machine figure compares like with like. Medians of {reps} runs (min–max); for each N the three ways take turns run by run. The paper's figures (seconds; 16 PentiumPro 200 MHz, Fast Ethernet, 1998) beside ours. Target: `anyLinux` costs ≤ 20 ms per machine over naming the host, on the same transport.\n");
    let env = start_env(*machines.iter().max().unwrap_or(&MAX_MACHINES));
    build_wait_programs(&env)?;
    let setup = setup(&env, opts)?;
    println!("{}\n", open_files_said(opts.open_files));
    let mut rows = Vec::new();
    let mut recorded = Recorded::default();
    for &system in &systems {
        setup.clear_step_file()?;
        // Per machine count, the ways take turns run by run (round r starts with way
        // r mod W), so a slow spell of the machine hits them alike.
        let ways = system.ways();
        let mut results: Vec<Vec<(Vec<f64>, Vec<String>)>> =
            vec![vec![Default::default(); machines.len()]; ways.len()];
        for (i, &n) in machines.iter().enumerate() {
            for round in 0..reps {
                for turn in 0..ways.len() {
                    let w = (round + turn) % ways.len();
                    let (times, failures) = &mut results[w][i];
                    match run_once(&env, &setup, system, ways[w], n) {
                        Ok(ms) => times.push(ms),
                        Err(e) => failures.push(e.to_string()),
                    }
                    wait_clean(&env)?;
                }
            }
        }
        for (&way, per_n) in ways.iter().zip(results) {
            let mut cells = Vec::new();
            for (&n, (times, failures)) in machines.iter().zip(per_n) {
                if let Some(first) = failures.first() {
                    eprintln!(
                        "rb-bench: {} with {n}: {} of {reps} runs failed, e.g.: {first}",
                        label(system, way),
                        failures.len()
                    );
                }
                cells.push((summarize(&times), failures.len()));
            }
            rows.push((system, way, cells));
        }
        recorded.take(system, &setup)?;
    }
    print_table(&rows, &machines);
    if let Some(to) = &opts.step_times {
        recorded.print();
        std::fs::write(to, &recorded.lines)
            .map_err(|e| anyhow::anyhow!("writing the step times to {}: {e}", to.display()))?;
        eprintln!(
            "rb-bench: the anyLinux jobs' step times are in {}",
            to.display()
        );
    }
    Ok(())
}

/// The step times recorded so far (`--module-step-times`): every line, and each
/// system's adds.
#[derive(Default)]
struct Recorded {
    lines: String,
    adds: Vec<(System, Option<module_steps::AddSteps>)>,
}

impl Recorded {
    /// Takes what `system`'s runs wrote to the step file, if it was kept.
    fn take(&mut self, system: System, setup: &Setup) -> anyhow::Result<()> {
        let Some(steps) = &setup.steps else {
            return Ok(());
        };
        let text = std::fs::read_to_string(&steps.file)?;
        self.adds.push((system, module_steps::add_steps(&text)));
        self.lines.push_str(&text);
        Ok(())
    }

    /// A table per system: each step's time after the mark before the add.
    fn print(&self) {
        for (system, adds) in &self.adds {
            let name = system.name().to_uppercase();
            let Some(adds) = adds else {
                println!("{name}: no `anyLinux` add in the step times.\n");
                continue;
            };
            println!(
                "{name}: where an `anyLinux` add spends its time ({} adds; each step's first \
                 time after the `rb-timeit` mark before the add: median (min–max), n the adds \
                 that had it; sorted by median).\n",
                adds.adds
            );
            println!("| step | ms after the mark |");
            println!("|---|---:|");
            let mut steps: Vec<_> = adds.steps.iter().collect();
            steps.sort_by(|a, b| a.1.median.total_cmp(&b.1.median));
            for (step, summary) in steps {
                println!("| {step} | {}, n={} |", show(summary), summary.n);
            }
            if let Some(busy) = &adds.busy {
                println!(
                    "| \"Already in progress\" answers to `rb-pvm-add` (a count, not ms) | {:.0} ({:.0}–{:.0}, n={}) |",
                    busy.median, busy.min, busy.max, busy.n
                );
            }
            println!();
        }
    }
}

/// The runs' [`Setup`]; with step times, their file made in the lab user's home, empty.
fn setup(env: &LabWithBroker, opts: &Options) -> anyhow::Result<Setup> {
    let steps = match &opts.step_times {
        Some(_) => Some(StepRecording {
            file: crate::steps::step_file(env)?,
            timeit: tests::bin("rb-timeit").display().to_string(),
        }),
        None => None,
    };
    Ok(Setup {
        open_files: opts.open_files,
        steps,
    })
}

/// The sentence on the jobs' soft open-files limit: PVM's start of a host closes every
/// descriptor up to it, twice (its hoster, then the hoster's `rsh` child), and what a
/// `close` of a descriptor that is not open costs here, measured now.
fn open_files_said(set: Option<u64>) -> String {
    use nix::sys::resource::{getrlimit, Resource};
    let limit = set.or_else(|| {
        getrlimit(Resource::RLIMIT_NOFILE)
            .ok()
            .map(|(soft, _)| soft)
    });
    let how = match (set, limit) {
        (Some(n), _) => format!("{n} (`--module-open-files`, every way alike)"),
        (None, Some(soft)) => format!("{soft}, as inherited"),
        (None, None) => "unknown".to_string(),
    };
    let each_ns = unopened_close_ns();
    let loop_ms = limit.map_or_else(String::new, |n| {
        format!(", {:.1} ms a loop at {n}", each_ns * n as f64 / 1e6)
    });
    format!(
        "The jobs' soft open-files limit: {how}. The master pvmd's start of a host closes \
         every descriptor up to it twice (its hoster, then the hoster's `rsh` child): a \
         `close` of a descriptor that is not open costs {each_ns:.0} ns here{loop_ms}."
    )
}

/// What one `close` of a descriptor that is not open costs here (ns, the median of five
/// rounds of 20000): the loops PVM runs over the open-files limit are made of them.
fn unopened_close_ns() -> f64 {
    const CALLS: u32 = 20_000;
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let started = std::time::Instant::now();
            for _ in 0..CALLS {
                // SAFETY: -1 is never a descriptor: the call fails with EBADF, as PVM's
                // close of a descriptor that is not open does, and closes nothing.
                unsafe { libc::close(-1) };
            }
            started.elapsed().as_nanos() as f64 / f64::from(CALLS)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

type Cells = Vec<(Option<bench::stats::Summary>, usize)>;

fn print_table(rows: &[(System, Way, Cells)], machines: &[usize]) {
    let heads: Vec<String> = machines
        .iter()
        .map(|&n| match n {
            1 => "1 machine".to_string(),
            n => format!("{n} machines"),
        })
        .collect();
    println!("| operation | {} |", heads.join(" | "));
    println!("|---|{}", "---|".repeat(machines.len()));
    for (system, way, cells) in rows {
        let shown: Vec<String> = cells
            .iter()
            .zip(machines)
            .map(|((summary, failed), &n)| {
                let paper = system.paper(*way, n);
                let ours = summary.as_ref().map_or_else(|| "failed".to_string(), show);
                let failed = match failed {
                    0 => String::new(),
                    f => format!(", {f} failed"),
                };
                match paper {
                    "—" => format!("{ours}{failed}"),
                    paper => format!("{ours}{failed} · paper {paper} s"),
                }
            })
            .collect();
        println!("| {} | {} |", label(*system, *way), shown.join(" | "));
    }
    println!();
    let systems: Vec<System> = rows.iter().map(|(s, _, _)| *s).collect();
    for system in [System::Pvm, System::Lam] {
        if !systems.contains(&system) {
            continue;
        }
        let median = |way: Way, i: usize| {
            rows.iter()
                .find(|(s, w, _)| *s == system && *w == way)
                .and_then(|(_, _, cells)| cells[i].0.as_ref().map(|s| s.median))
        };
        let per_machine: Vec<String> = machines
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let per = |a: f64, b: f64| (a - b) / *n as f64;
                let host = median(Way::ShimHost, i)?;
                let any = median(Way::AnyLinux, i)?;
                let real = median(Way::Real, i)?;
                Some(match median(Way::ShimHostFast, i) {
                    Some(fast) => format!(
                        "{n}: {:+.1} ms over the same boot ({:+.1} ms over LAM's default boot; {:+.2} ms for the shim)",
                        per(any, fast),
                        per(any, host),
                        per(host, real)
                    ),
                    None => format!(
                        "{n}: {:+.1} ms ({:+.2} ms for the shim)",
                        per(any, host),
                        per(host, real)
                    ),
                })
            })
            .collect();
        println!(
            "{}: `anyLinux` over naming the host, per machine, for N machines (target ≤ 20 ms) — {}.\n",
            system.name().to_uppercase(),
            per_machine.join("; ")
        );
    }
}

/// node02 (front end, not managed) and node03 onwards (`machines` of them), jobs over
/// real rsh.
fn start_env(machines: usize) -> LabWithBroker {
    LabWithBroker::start_with_front_end(1 + machines)
}

/// `~/pvm_wait_hosts` and `~/lam_wait_nodes`, compiled in the lab user's shared home.
fn build_wait_programs(env: &LabWithBroker) -> anyhow::Result<()> {
    env.build_program("pvm_wait_hosts", "gcc", "pvm_wait_hosts", "-lpvm3")
        .map_err(|e| anyhow::anyhow!(e))?;
    env.build_program(
        "lam_wait_nodes",
        "gcc -I/usr/include/lam",
        "lam_wait_nodes",
        "-llam",
    )
    .map(drop)
    .map_err(|e| anyhow::anyhow!(e))
}

fn user_sh(env: &LabWithBroker, script: &str) -> anyhow::Result<Output> {
    env.lab
        .exec_as_user(FRONT_END, &["sh", "-c", script])
        .map_err(|e| anyhow::anyhow!("{FRONT_END}: {e}"))
}

/// The machines to add, by name.
fn hosts(n: usize) -> String {
    (3..3 + n)
        .map(|i| format!("node{i:02}"))
        .collect::<Vec<_>>()
        .join(" ")
}

const PVM_ENV: &str = "PVM_ROOT=/usr/lib/pvm3; export PVM_ROOT;";

/// The driver: prints `hosts K` (hosts or nodes at the end, the front end included) and
/// `elapsed_us T` (the additions).
fn driver(system: System, way: Way, n: usize, setup: &Setup) -> String {
    let hosts = hosts(n);
    let want = n + 1;
    let mark = setup.mark();
    let body = match (system, way) {
        (System::Pvm, Way::AnyLinux) => format!(
            "{PVM_ENV} echo quit | pvm >/dev/null 2>&1
             total=0; k=1
             while [ $k -le {n} ]; do
               {mark}; t0=$(date +%s%N)
               echo 'add anyLinux' | pvm >/dev/null 2>&1
               ~/pvm_wait_hosts $((k + 1)) 10000 >/dev/null || {{ {mark}; break; }}
               t1=$(date +%s%N); total=$((total + t1 - t0)); {mark}
               while pgrep -u \"$(id -u)\" -f 'pvm-gro[w] ' >/dev/null; do :; done
               k=$((k + 1))
             done
             echo \"hosts $(~/pvm_wait_hosts {want} 0)\"
             echo \"elapsed_us $((total / 1000))\""
        ),
        (System::Pvm, _) => {
            let rsh = if way == Way::Real {
                "PVM_RSH=/usr/bin/rsh; export PVM_RSH;"
            } else {
                ""
            };
            format!(
                "{PVM_ENV} {rsh} echo quit | pvm >/dev/null 2>&1
                 t0=$(date +%s%N)
                 for h in {hosts}; do echo \"add $h\" | pvm >/dev/null 2>&1; done
                 t1=$(date +%s%N)
                 echo \"hosts $(~/pvm_wait_hosts {want} 0)\"
                 echo \"elapsed_us $(( (t1 - t0) / 1000 ))\"
                 echo halt | pvm >/dev/null 2>&1; exit 0"
            )
        }
        (System::Lam, way) => {
            let rsh = match way {
                Way::Real => "LAMRSH=/usr/bin/rsh; export LAMRSH;",
                Way::ShimHostFast => {
                    "LAM_MPI_SSI_boot_rsh_fast=1; export LAM_MPI_SSI_boot_rsh_fast;"
                }
                _ => "",
            };
            let grow = if way == Way::AnyLinux {
                format!(
                    "total=0; k=1
                     while [ $k -le {n} ]; do
                       {mark}; t0=$(date +%s%N)
                       lamgrow anyLinux </dev/null >/dev/null 2>&1
                       ~/lam_wait_nodes $((k + 1)) 10000 >/dev/null || {{ {mark}; break; }}
                       t1=$(date +%s%N); total=$((total + t1 - t0)); {mark}
                       while pgrep -u \"$(id -u)\" -f 'lam-gro[w] ' >/dev/null; do :; done
                       k=$((k + 1))
                     done"
                )
            } else {
                format!(
                    "t0=$(date +%s%N)
                     for h in {hosts}; do lamgrow $h </dev/null >/dev/null 2>&1; done
                     total=$(($(date +%s%N) - t0))"
                )
            };
            let halt = if way == Way::AnyLinux {
                ""
            } else {
                "lamhalt </dev/null >/dev/null 2>&1"
            };
            format!(
                "{rsh} echo {FRONT_END} >~/lam-bench.schema
                 lamboot -s ~/lam-bench.schema </dev/null >/dev/null 2>&1 || {{ echo 'lamboot failed'; exit 3; }}
                 {grow}
                 echo \"hosts $(lamnodes 2>/dev/null | wc -l)\"
                 echo \"elapsed_us $((total / 1000))\"
                 {halt}; exit 0"
            )
        }
    };
    format!("{}{body}", setup.prelude())
}

/// One measurement: milliseconds to add `n` machines.
fn run_once(
    env: &LabWithBroker,
    setup: &Setup,
    system: System,
    way: Way,
    n: usize,
) -> anyhow::Result<f64> {
    let script = driver(system, way, n, setup);
    let argv = ["sh", "-c", script.as_str()];
    let out = match way {
        Way::Real => user_sh(env, &script)?,
        Way::ShimHost | Way::ShimHostFast => env.agent_as_user(FRONT_END, &[], &argv).output()?,
        Way::AnyLinux => {
            let spec = format!("&(module=\"{}\")(adaptive=yes)", system.name());
            let mut agent = env.agent_as_user(FRONT_END, &["--rsl", &spec], &argv);
            if let Some(steps) = &setup.steps {
                agent.env(steptimes::ENV_STEP_TIMES, &steps.file);
            }
            agent.output()?
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse::<f64>().ok())
    };
    match (field("hosts "), field("elapsed_us ")) {
        (Some(hosts), Some(us)) if hosts as usize == n + 1 => Ok(us / 1000.0),
        (hosts, _) => anyhow::bail!(
            "{} hosts instead of {}; stdout: {text}; stderr: {}",
            hosts.map_or("no count of".into(), |h| h.to_string()),
            n + 1,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" / ")
        ),
    }
}

/// Before the next run: no host held, no pvmd or lamd of the lab user on any host, and
/// reserved ports left on the front end for the run's remote shells.
fn wait_clean(env: &LabWithBroker) -> anyhow::Result<()> {
    let clean = wait_until(Duration::from_secs(90), || {
        if !env.broker.held_hosts().is_empty() {
            return None;
        }
        let busy = env.lab.hosts().iter().any(|h| {
            env.lab
                .exec(&h.name, &["pgrep", "-u", "rblab", "pvmd|lamd"])
                .is_ok_and(|o| o.status.success())
        });
        let ports_short = reserved_ports_waiting(env).is_none_or(|n| n > RESERVED_PORTS_BUSY_MAX);
        (!busy && !ports_short).then_some(())
    });
    clean.ok_or_else(|| {
        anyhow::anyhow!(
            "hosts still held, daemons left or the front end's reserved ports in TIME-WAIT \
             after a run"
        )
    })
}

/// Reserved ports (512–1023) of the front end in TIME-WAIT at most before a run. netkit
/// rsh binds one for each call and closes first, so the port waits 60 s (docs/src/user/
/// rsh.md: about 500 calls a minute from one host). At this section's pace — hundreds of
/// calls a minute at 8 machines, after the smaller counts — they ran out: 2 or 3 runs in 15
/// failed in every way, the real rsh included, with "Can't start pvmd" (session 26: 511
/// such sockets on node02 at those failures; none when 8 machines ran alone). A run of 8
/// machines takes 8 for its pvmds or lamds, a few more for the module job's calls.
const RESERVED_PORTS_BUSY_MAX: usize = 448;

/// The front end's TCP sockets in TIME-WAIT on a reserved local port (`None`: cannot ask).
fn reserved_ports_waiting(env: &LabWithBroker) -> Option<usize> {
    let out = env
        .lab
        .exec(FRONT_END, &["ss", "-Htan", "state", "time-wait"])
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let reserved = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2)?.rsplit_once(':'))
        .filter_map(|(_, port)| port.parse::<u16>().ok())
        .filter(|port| (512..1024).contains(port))
        .count();
    out.status.success().then_some(reserved)
}
