//! Agent-layer benchmarks: the paper's Table 1 (a remote command the real way, through the
//! shim, and as `anyLinux`), Table 2 (`anyLinux` when every host is held by an adaptive
//! job and one must be reclaimed first), over real rsh and real ssh between lab hosts, and
//! the resident memory of the agent and the subagent.
//!
//! Setting, as in the paper: commands are issued on one machine (node02, where the lab user
//! runs the agent) and run on another (node03, the only host the broker manages). Each
//! command is timed inside node02 by `rb-timeit`, so only the command itself is measured.

use std::{path::Path, process::Output, time::Duration};

use bench::{
    procstat,
    stats::{summarize, Summary},
};
use tests::{
    bin,
    labtier::{lab_file_with, LabOptions, LabWithBroker, TEST_TIMING},
    wait_until, Broker,
};

pub(crate) const FRONT_END: &str = "node02";
pub(crate) const TARGET: &str = "node03";
/// The broker's reclaim grace in these runs (`reclaim_grace_s`).
const GRACE_S: f64 = 1.0;
/// Table 1's `null` rows run this many times the repetitions: they are cheap (one remote
/// `true`), and their targets are a few ms against a real ssh session's ±10 ms spread.
pub(crate) const NULL_REPS_FACTOR: usize = 3;

/// What to measure.
pub struct Options {
    pub reps: usize,
    /// Remote shells of the jobs (`rsh`, `ssh`).
    pub transports: Vec<String>,
    /// `table1`, `table2`, `memory`, `reuse`, `steps`; empty = all.
    pub parts: Vec<String>,
}

impl Options {
    fn wants(&self, part: &str) -> bool {
        self.parts.is_empty() || self.parts.iter().any(|p| p == part)
    }
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let reps = opts.reps;
    println!("## Agent layer (agent, rsh shim, subagents)\n");
    println!("Real hosts: network namespaces with their own sshd and in.rshd (netkit), the lab user `rblab` on node02 issues every command, node03 runs it (the only host the broker manages, as `n01` in the paper). Each command is timed inside node02 by `rb-timeit` (fork+exec+wait, stdio on /dev/null); in Table 1 the three ways of a row group run interleaved, run by run (rotating which goes first), in one job under `agent`, the first two with the job's variables unset so they behave as outside any job — so machine drift hits all three alike. `loop` is a ~1 s CPU loop (`awk`, calibrated at the start), `null` is `true`. Shim pass-through = our `rsh` with `RB_REAL_RSH` naming the real remote shell; `anyLinux` = inside a job under `agent`, i.e. allocation by the broker, the real remote shell, a subagent on node03, and the host given back when the command ends. Medians of {reps} runs (min–max), and of {null_reps} for Table 1's `null` rows: their targets are a few ms, while one real ssh session varies by ±10 ms here, so 20 runs moved the ssh medians by ±2 ms from run to run (even the exec floor's). The paper's figures (16 PentiumPro 200 MHz, Fast Ethernet, 1998) beside ours.\n", null_reps = reps * NULL_REPS_FACTOR);
    let spec = lab::LabSpec {
        hosts: 2,
        rsh: true,
        ..lab::LabSpec::default()
    };
    let mut lab = lab::Lab::up(&spec).map_err(|e| anyhow::anyhow!("lab up: {e}"))?;
    let loop_cmd = calibrated_loop()?;
    let mut table1 = Vec::new();
    let mut table2 = Vec::new();
    let mut memory = None;
    let mut reuse = None;
    let mut steps = Vec::new();
    for transport in &opts.transports {
        let env = start_broker(lab, transport);
        if opts.wants("table1") {
            table1.extend(table_one(&env, transport, &loop_cmd, reps)?);
        }
        if opts.wants("table2") {
            table2.extend(table_two(&env, transport, &loop_cmd, reps)?);
        }
        if memory.is_none() && opts.wants("memory") {
            memory = Some(footprint(&env)?);
        }
        if opts.wants("steps") {
            steps.push(crate::steps::measure(&env, transport, reps)?);
        }
        if transport == "ssh" && opts.wants("reuse") {
            reuse = Some(crate::reuse::measure(&env, reps, &real_program("ssh")?)?);
        }
        let LabWithBroker { broker, lab: l } = env;
        drop(broker);
        lab = l;
    }
    if !table1.is_empty() {
        print_table1(&table1);
    }
    if !table2.is_empty() {
        print_table2(&table2, &table1);
    }
    if let Some(rows) = memory {
        print_memory(&rows);
    }
    if let Some(r) = reuse {
        crate::reuse::print(&r);
    }
    if !steps.is_empty() {
        crate::steps::print(&steps);
    }
    lab.down().map_err(|e| anyhow::anyhow!("lab down: {e}"))?;
    Ok(())
}

/// A broker whose jobs use `transport` (daemons always over ssh), managing node03 only.
pub(crate) fn start_broker(lab: lab::Lab, transport: &str) -> LabWithBroker {
    let mut opts = LabOptions::new(&[], TEST_TIMING);
    opts.rsh = true;
    opts.job_shell = Some(vec![transport.to_string()]);
    opts.unmanaged = vec![FRONT_END.to_string()];
    let text = lab_file_with(&lab, &opts).replacen(
        "[broker]\n",
        &format!("[broker]\nreclaim_grace_s = {GRACE_S}\n"),
        1,
    );
    let broker = Broker::start(&text);
    broker.wait_all_up(Duration::from_secs(20));
    LabWithBroker { broker, lab }
}

/// An awk loop that runs for about one second on this machine.
fn calibrated_loop() -> anyhow::Result<String> {
    let probe = 20_000_000u64;
    let started = std::time::Instant::now();
    let status = std::process::Command::new("awk")
        .arg(format!("BEGIN{{for(i=0;i<{probe};i++)s+=i}}"))
        .status()?;
    anyhow::ensure!(status.success(), "awk failed");
    let per_iter = started.elapsed().as_secs_f64() / probe as f64;
    let n = (1.0 / per_iter) as u64;
    Ok(format!("awk 'BEGIN{{for(i=0;i<{n};i++)s+=i}}'"))
}

pub(crate) struct Row {
    pub(crate) label: String,
    pub(crate) paper: &'static str,
    pub(crate) ms: Summary,
    pub(crate) failures: usize,
}

fn parse_times(out: &Output, what: &str) -> anyhow::Result<(Vec<f64>, usize)> {
    let text = String::from_utf8_lossy(&out.stdout);
    let times: Vec<f64> = text.lines().filter_map(|l| l.parse().ok()).collect();
    let failures = text.lines().filter(|l| l.starts_with("fail")).count();
    if times.is_empty() {
        anyhow::bail!(
            "{what}: no successful run ({failures} failed)\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((times, failures))
}

pub(crate) fn row(label: String, paper: &'static str, (times, failures): (Vec<f64>, usize)) -> Row {
    Row {
        label,
        paper,
        ms: summarize(&times).expect("non-empty"),
        failures,
    }
}

/// `rb-timeit REPS ARGV…`.
fn timeit_argv(reps: usize, argv: &[&str]) -> Vec<String> {
    let mut all = vec![bin("rb-timeit").display().to_string(), reps.to_string()];
    all.extend(argv.iter().map(|a| a.to_string()));
    all
}

/// `rb-timeit REPS ARGV…` as the app of a job under `agent` on the front end.
fn time_in_job(
    env: &LabWithBroker,
    agent_args: &[&str],
    reps: usize,
    argv: &[&str],
) -> anyhow::Result<(Vec<f64>, usize)> {
    let all = timeit_argv(reps, argv);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let out = env.agent_as_user(FRONT_END, agent_args, &all).output()?;
    parse_times(&out, &argv.join(" "))
}

/// The job's variables, unset for a command that must run as if outside any job.
pub(crate) const OUTSIDE_JOB: [&str; 8] = [
    "-u",
    proto::agent::ENV_AGENT,
    "-u",
    proto::agent::ENV_JOB,
    "-u",
    proto::agent::ENV_HOSTS_FILE,
    "-u",
    proto::agent::ENV_SHIM_DEPTH,
];

/// Times `ways` interleaved run by run (`rb-timeit … --then …`) in one job under `agent`:
/// each way's times and failures, in the order given.
pub(crate) fn time_interleaved(
    env: &LabWithBroker,
    reps: usize,
    ways: &[Vec<String>],
) -> anyhow::Result<Vec<(Vec<f64>, usize)>> {
    time_interleaved_with(env, reps, ways, &[])
}

/// [`time_interleaved`] with variables `vars` set for the job's agent (and so its app).
pub(crate) fn time_interleaved_with(
    env: &LabWithBroker,
    reps: usize,
    ways: &[Vec<String>],
    vars: &[(&str, &str)],
) -> anyhow::Result<Vec<(Vec<f64>, usize)>> {
    let mut argv = vec![bin("rb-timeit").display().to_string(), reps.to_string()];
    for (k, way) in ways.iter().enumerate() {
        if k > 0 {
            argv.push("--then".into());
        }
        argv.extend(way.iter().cloned());
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = env
        .agent_as_user(FRONT_END, &[], &argv)
        .envs(vars.iter().copied())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if std::env::var_os("RB_BENCH_DEBUG").is_some() {
        eprintln!(
            "rb-timeit {}:\n{text}\nagent stderr:\n{}",
            ways.len(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut per_way = vec![(Vec::new(), 0usize); ways.len()];
    for line in text.lines() {
        let Some((k, figure)) = line.split_once(' ') else {
            continue;
        };
        let Some(slot) = k.parse::<usize>().ok().and_then(|k| per_way.get_mut(k)) else {
            continue;
        };
        match figure.parse::<f64>() {
            Ok(ms) => slot.0.push(ms),
            Err(_) => slot.1 += 1,
        }
    }
    for (way, (times, failures)) in ways.iter().zip(&per_way) {
        anyhow::ensure!(
            !times.is_empty(),
            "{}: no successful run ({failures} failed)\nstderr:\n{}",
            way.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(per_way)
}

/// Table 1's exec-floor row: `tests/programs/exec_floor.c`, built static.
const EXEC_FLOOR: &str = "exec_floor";

/// The real remote shell's absolute path: inside a job `rsh` is the shim.
pub(crate) fn real_program(name: &str) -> anyhow::Result<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
        .ok_or_else(|| anyhow::anyhow!("no {name} in PATH"))
}

/// Table 1: the real remote shell, the shim passing through to it (both as outside any
/// job) and `rsh anyLinux` in the job, interleaved run by run.
fn table_one(
    env: &LabWithBroker,
    transport: &str,
    loop_cmd: &str,
    reps: usize,
) -> anyhow::Result<Vec<Row>> {
    let shim = bin("rsh").display().to_string();
    let real = real_program(transport)?;
    let floor = env
        .build_program("exec_floor", "gcc -static", "exec_floor", "")
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .display()
        .to_string();
    let real_rsh = format!("{}=[\"{real}\"]", proto::agent::ENV_REAL_RSH);
    let owned = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let mut rows = Vec::new();
    for (cmd, papers) in [
        ("true", ["0.4 s", "0.6 s", "0.6 s"]),
        (loop_cmd, ["36.9 s", "37.0 s", "37.1 s"]),
    ] {
        let name = if cmd == "true" { "null" } else { "loop" };
        let mut ways = vec![
            owned(&[&OUTSIDE_JOB[..], &[real.as_str(), TARGET, cmd]].concat()),
            owned(&[&OUTSIDE_JOB[..], &[real_rsh.as_str(), &shim, TARGET, cmd]].concat()),
            owned(&["rsh", "anyLinux", cmd]),
        ];
        let mut labels = vec![
            (
                format!("`{transport} {TARGET} {name}` (real {transport}, baseline)"),
                papers[0],
            ),
            (
                format!("`rsh {TARGET} {name}` (shim → {transport})"),
                papers[1],
            ),
            (
                format!("`rsh anyLinux {name}` (job over {transport})"),
                papers[2],
            ),
        ];
        if cmd == "true" {
            // The least any wrapper can cost: one exec of a static program that does nothing
            // but exec the real remote shell.
            ways.push(owned(
                &[
                    &OUTSIDE_JOB[..],
                    &[floor.as_str(), real.as_str(), TARGET, cmd],
                ]
                .concat(),
            ));
            labels.push((format!("`{EXEC_FLOOR} {transport} {TARGET} {name}`"), "-"));
        }
        let runs = if cmd == "true" {
            reps * NULL_REPS_FACTOR
        } else {
            reps
        };
        let times = time_interleaved(env, runs, &ways)?;
        for ((label, paper), times) in labels.into_iter().zip(times) {
            rows.push(row(label, paper, times));
        }
    }
    Ok(rows)
}

/// Table 2: every rep starts with node03 held by an adaptive job whose process there
/// either ends at SIGTERM or ignores it (then SIGKILL after the grace period).
fn table_two(
    env: &LabWithBroker,
    transport: &str,
    loop_cmd: &str,
    reps: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (holder_cmd, cmd, label, paper) in [
        (
            "exec sleep 1000",
            "true",
            "null; holder ends at SIGTERM",
            "1.5 s",
        ),
        (
            "trap \"\" TERM; sleep 1000",
            "true",
            "null; holder ignores SIGTERM (SIGKILL after the grace)",
            "-",
        ),
        (
            "exec sleep 1000",
            loop_cmd,
            "loop; holder ends at SIGTERM",
            "37.9 s",
        ),
    ] {
        let times = reclaim_runs(env, holder_cmd, cmd, reps)?;
        rows.push(row(
            format!("`rsh anyLinux {label}` (job over {transport})"),
            paper,
            times,
        ));
    }
    Ok(rows)
}

fn reclaim_runs(
    env: &LabWithBroker,
    holder_cmd: &str,
    cmd: &str,
    reps: usize,
) -> anyhow::Result<(Vec<f64>, usize)> {
    // The holder re-requests the host each time it loses it, so it gets it back after
    // every measured command.
    let holder_app = format!("while :; do rsh anyLinux '{holder_cmd}'; sleep 0.05; done");
    let mut holder = env
        .agent_as_user(
            FRONT_END,
            &["--rsl", "&(adaptive=yes)"],
            &["sh", "-c", &holder_app],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut times = Vec::new();
    let mut failures = 0;
    let mut last_holder = None;
    for _ in 0..reps {
        if !wait_held_by_adaptive_job(&env.broker) || !wait_holder_running(env, &mut last_holder) {
            anyhow::bail!("the adaptive holder job never got {TARGET}");
        }
        let ps = std::env::var_os("RB_BENCH_DEBUG").map(|_| {
            env.lab
                .exec(
                    TARGET,
                    &["ps", "-u", "rblab", "-o", "pid,pgid,stat,ignored,args"],
                )
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        });
        let (t, f) = time_in_job(env, &[], 1, &["rsh", "anyLinux", cmd])?;
        if let Some(ps) = ps {
            eprintln!("rep: {t:?} holder={last_holder:?}\n{ps}");
        }
        times.extend(t);
        failures += f;
    }
    // SIGTERM, not SIGKILL: the agent ends the job's shell loop too (killed alone, its
    // agent would leave the loop running one-shot jobs that compete for the host).
    let _ = env.lab.stop_spawned(&mut holder);
    // Wait until the broker has taken the host back and the holder's subagent has ended
    // its last process (a stale one would pass for the next holder's).
    wait_until(Duration::from_secs(20), || {
        host_holders(&env.broker).is_empty().then_some(())
    })
    .ok_or_else(|| anyhow::anyhow!("{TARGET} still held after the holder job ended"))?;
    wait_until(Duration::from_secs(20), || {
        let out = env.lab.exec(TARGET, &["pgrep", "-u", "rblab"]).ok()?;
        (!out.status.success()).then_some(())
    })
    .ok_or_else(|| anyhow::anyhow!("the holder job left processes on {TARGET}"))?;
    Ok((times, failures))
}

/// Jobs holding hosts: `(adaptive, hosts)` per running job.
fn host_holders(broker: &Broker) -> Vec<(bool, Vec<String>)> {
    broker
        .jobs()
        .iter()
        .filter(|j| j["state"] == "running")
        .filter_map(|j| {
            let hosts: Vec<String> = serde_json::from_value(j["hosts"].clone()).ok()?;
            let adaptive = j["spec"]["parts"][0]["adaptive"].as_bool().unwrap_or(false);
            (!hosts.is_empty()).then_some((adaptive, hosts))
        })
        .collect()
}

/// A new holder's `sleep` runs on node03 (a grant alone is not enough: its remote shell may
/// not have started the command yet, and a reclaim before that is free). New = not the
/// previous rep's (`last`), and running or sleeping: the killed one may linger as a zombie
/// until its reaper gets to it, and would otherwise pass for the next.
fn wait_holder_running(env: &LabWithBroker, last: &mut Option<String>) -> bool {
    let running = wait_until(Duration::from_secs(20), || {
        let out = env
            .lab
            .exec(
                TARGET,
                &["pgrep", "-r", "R,S", "-u", "rblab", "-x", "sleep"],
            )
            .ok()?;
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && Some(&pid) != last.as_ref()).then_some(pid)
    });
    // Let its subagent's guardian connect to the holder's agent.
    std::thread::sleep(Duration::from_millis(100));
    running.map(|pid| *last = Some(pid)).is_some()
}

fn wait_held_by_adaptive_job(broker: &Broker) -> bool {
    wait_until(Duration::from_secs(20), || {
        let holders = host_holders(broker);
        (holders.len() == 1 && holders[0].0).then_some(())
    })
    .is_some()
}

/// RSS of the agent, the subagent (front and guardian) and baselines, while a job runs a
/// command on node03.
fn footprint(env: &LabWithBroker) -> anyhow::Result<Vec<(String, String)>> {
    let mut job = env
        .agent_as_user(FRONT_END, &[], &["rsh", "anyLinux", "sleep 3"])
        .stdout(std::process::Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(1500));
    let uid = env.lab.user().uid;
    let mut rows = Vec::new();
    for (name, path) in [
        ("agent (node02)", bin("agent")),
        (
            "rb-subagent: front and guardian (node03)",
            bin("rb-subagent"),
        ),
        (
            "netkit rsh client (node02, baseline)",
            "/usr/bin/netkit-rsh".into(),
        ),
        ("sleep (node03, baseline)", "/usr/bin/sleep".into()),
    ] {
        let mut kbs = rss_of(uid, &path);
        kbs.sort_unstable();
        let shown: Vec<String> = kbs
            .iter()
            .map(|kb| format!("{:.1} MiB", *kb as f64 / 1024.0))
            .collect();
        rows.push((name.to_string(), shown.join(", ")));
    }
    let _ = job.wait();
    Ok(rows)
}

/// VmRSS (KiB) of every process of `uid` running `exe`.
fn rss_of(uid: u32, exe: &Path) -> Vec<u64> {
    use std::os::unix::fs::MetadataExt;
    let want = exe.canonicalize().unwrap_or_else(|_| exe.to_path_buf());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            (e.metadata().ok()?.uid() == uid).then_some(())?;
            let target = std::fs::read_link(e.path().join("exe")).ok()?;
            (target == want).then_some(())?;
            procstat::rss_kb(pid)
        })
        .collect()
}

pub(crate) fn show(s: &Summary) -> String {
    if s.median >= 1000.0 {
        format!(
            "{:.3} s ({:.3}–{:.3})",
            s.median / 1000.0,
            s.min / 1000.0,
            s.max / 1000.0
        )
    } else {
        format!("{:.1} ms ({:.1}–{:.1})", s.median, s.min, s.max)
    }
}

pub(crate) fn print_rows(rows: &[Row]) {
    println!("| command | ours: median (min–max) | runs | paper |");
    println!("|---|---|---:|---:|");
    for r in rows {
        let runs = match r.failures {
            0 => r.ms.n.to_string(),
            f => format!("{} ({f} failed)", r.ms.n),
        };
        println!("| {} | {} | {runs} | {} |", r.label, show(&r.ms), r.paper);
    }
    println!();
}

fn print_table1(rows: &[Row]) {
    println!("### Table 1: performance of `rsh`\n");
    print_rows(rows);
    let by = |needle: &str| {
        rows.iter()
            .find(|r| r.label.contains(needle))
            .map(|r| r.ms.median)
    };
    for t in ["rsh", "ssh"] {
        let real = by(&format!("`{t} {TARGET} null` (real"));
        let shim = by(&format!("(shim → {t})"));
        let any = by(&format!("`rsh anyLinux null` (job over {t})"));
        let floor = by(&format!("`{EXEC_FLOOR} {t} {TARGET} null`"));
        if let (Some(real), Some(shim), Some(any)) = (real, shim, any) {
            print!(
                "Over {t}: shim pass-through costs {:+.1} ms (target ≤ +1 ms), `anyLinux` {:+.1} ms (target ≤ +5 ms) over the real {t}.",
                shim - real,
                any - real
            );
            if let Some(floor) = floor {
                print!(
                    " One exec of the smallest static program that only execs {t} (`{EXEC_FLOOR}`, C) costs {:+.1} ms here: any wrapper pays that; the shim's own work is {:+.1} ms beyond it.",
                    floor - real,
                    shim - floor
                );
            }
            println!("\n");
        }
    }
}

fn print_table2(rows: &[Row], table1: &[Row]) {
    println!("### Table 2: performance of reallocation\n");
    println!("Before every run node03 is held by another, adaptive job (`agent --rsl '&(adaptive=yes)'` running `rsh anyLinux 'sleep 1000'` in a loop, so it takes the host back after each run). The broker reclaims it (grace period {GRACE_S} s, `reclaim_grace_s`): SIGTERM to the holder's process group on node03, SIGKILL after the grace period if it is still there; the host is granted only once the holder's agent confirms its processes are gone. Target: reclaim + regrant ≤ grace + 20 ms.\n");
    print_rows(rows);
    let median = |rows: &[Row], needle: &str| {
        rows.iter()
            .find(|r| r.label.contains(needle))
            .map(|r| r.ms.median)
    };
    for t in ["rsh", "ssh"] {
        let free = median(table1, &format!("`rsh anyLinux null` (job over {t})"));
        let term = median(
            rows,
            &format!("null; holder ends at SIGTERM` (job over {t})"),
        );
        let kill = median(
            rows,
            &format!("null; holder ignores SIGTERM (SIGKILL after the grace)` (job over {t})"),
        );
        if let (Some(free), Some(term), Some(kill)) = (free, term, kill) {
            println!(
                "Over {t}, beyond `rsh anyLinux null` on a free host ({free:.1} ms, Table 1): reclaiming from a holder that ends at SIGTERM costs {:+.1} ms; from one that ignores it, the grace period {:+.1} ms (target: grace + 20 ms).\n",
                term - free,
                kill - GRACE_S * 1000.0 - free
            );
        }
    }
}

fn print_memory(rows: &[(String, String)]) {
    println!("### Agent and subagent memory\n");
    println!("Resident set size of each process of a job running `rsh anyLinux 'sleep 3'` (measured 1.5 s in; release build). Target: < 8 MB each.\n");
    println!("| process | RSS |");
    println!("|---|---:|");
    for (name, shown) in rows {
        println!("| {name} | {shown} |");
    }
    println!();
}
