//! The agent layer's step timing: where one `rsh anyLinux true` spends its time, step by
//! step, beside the real remote shell's own time in the same run.
//!
//! One job under `agent` on node02 runs, interleaved run by run, the real remote shell to
//! node03 (as outside any job: the baseline) and `rsh anyLinux true` (granted node03). The
//! job's agent has `RB_STEP_TIMES` set: the shim, the agent, `rb-timeit` and the subagent
//! on node03 (told by the agent, `--step-times`) append `STEP NS` lines to one file in the
//! lab home, all on `CLOCK_MONOTONIC` (see the `steptimes` crate). Each call is the
//! window from its shim's `shim.start` to its `shim.exit`; the steps of its allocation
//! carry its id. Each step's figure is the median over the calls of the time between two
//! of these events; the medians of the steps need not add up to the median of the whole.

use std::{collections::HashMap, path::PathBuf};

use ::tests::labtier::LabWithBroker;
use bench::stats::{summarize, Summary};
use steptimes::{parse_line, Line, ENV_STEP_TIMES};

use crate::agent::{real_program, time_interleaved_with, NULL_REPS_FACTOR, OUTSIDE_JOB, TARGET};

/// The steps of a call on its critical path, in order: (from, to, what happens between).
const CHAIN: [(&str, &str, &str); 22] = [
    (
        "timeit.spawn",
        "shim.start",
        "exec of the shim (fork, exec, until its `main`)",
    ),
    (
        "shim.start",
        "shim.request_sent",
        "shim: arguments, connect to the agent, `allocate` sent",
    ),
    (
        "shim.request_sent",
        "agent.shim_request",
        "agent: the request read",
    ),
    (
        "agent.shim_request",
        "agent.allocate_sent",
        "agent: core, `allocate` sent to the broker",
    ),
    (
        "agent.allocate_sent",
        "agent.broker_granted",
        "broker: `allocate` → `granted` (round trip and decision)",
    ),
    (
        "agent.broker_granted",
        "agent.pool_told",
        "agent: the job's JEL pool told of the host (`joined` written)",
    ),
    (
        "agent.pool_told",
        "agent.hosts_written",
        "agent: the job's hosts file written",
    ),
    (
        "agent.hosts_written",
        "agent.grant_sent",
        "agent: the grant handed to the shim's connection",
    ),
    ("agent.grant_sent", "shim.granted", "shim: the grant read"),
    (
        "shim.granted",
        "shim.spawn",
        "shim: the remote shell's command line (and, before 2026-11-28, the `used` line to the agent)",
    ),
    (
        "shim.spawn",
        "shim.spawned",
        "shim: fork and exec of the real remote shell",
    ),
    (
        "shim.spawned",
        "sub.start",
        "the real remote shell (rsh or ssh) → its daemon → the login shell → `rb-subagent`'s main (node03)",
    ),
    (
        "sub.start",
        "sub.jel_bound",
        "subagent: the command's tag, its JEL socket bound",
    ),
    (
        "sub.jel_bound",
        "sub.guardian_start",
        "subagent: fork of the guardian",
    ),
    (
        "sub.guardian_start",
        "sub.spawn",
        "guardian: a child subreaper",
    ),
    (
        "sub.spawn",
        "sub.command_spawned",
        "guardian: fork and exec of the command",
    ),
    (
        "sub.command_spawned",
        "sub.command_exited",
        "the command (`true`)",
    ),
    (
        "sub.command_exited",
        "sub.front_exit",
        "subagent: the exit status to the front, which exits",
    ),
    (
        "sub.front_exit",
        "shim.child_exited",
        "the rsh session ends (node03 → node02), rsh reaped",
    ),
    (
        "shim.child_exited",
        "shim.taken_back_answered",
        "shim: `taken_back` question to the agent",
    ),
    ("shim.taken_back_answered", "shim.exit", "shim: exit"),
    ("shim.exit", "timeit.reaped", "the shim reaped"),
];

/// Off the critical path: the subagent's link to the agent and the host's give-back, which
/// run beside the command and after the call.
const SIDE: [(&str, &str, &str); 6] = [
    (
        "shim.granted",
        "shim.used_sent",
        "shim: the `used` line to the agent, a connection of its own (since 2026-11-28 once the remote shell runs)",
    ),
    (
        "sub.command_spawned",
        "sub.connected",
        "subagent's guardian: runtime, key file, TCP connect, handshake",
    ),
    (
        "sub.connected",
        "agent.sub_connected",
 "agent: the subagent's link registered (before the guardian reads the welcome: < 0)",
    ),
    (
        "sub.command_exited",
        "agent.sub_exited",
        "the command's end reaches the agent (`sub_exited`)",
    ),
    (
        "sub.command_exited",
        "agent.give_back_sent",
        "the command's end → host given back to the broker (`give_back`)",
    ),
    (
        "shim.exit",
        "agent.give_back_sent",
        "the call's end → host given back (after the call when > 0)",
    ),
];

/// What one run of the step timing found.
pub(crate) struct Steps {
    pub(crate) transport: String,
    pub(crate) real: Summary,
    pub(crate) any: Summary,
    /// The same with a command that is no shell builtin ([`PLAIN_COMMAND`]), and one
    /// fork, exec and wait of it on the front end: what an exec costs here.
    pub(crate) plain: Option<PlainCommand>,
    /// Per [`CHAIN`] step then per [`SIDE`] step: its summary, if any call had both events.
    pub(crate) chain: Vec<Option<Summary>>,
    pub(crate) side: Vec<Option<Summary>>,
    pub(crate) total: Option<Summary>,
    /// Calls found in the step file.
    pub(crate) calls: usize,
    /// What recording one step costs (µs, median of many), and steps per call.
    pub(crate) step_cost_us: f64,
    pub(crate) steps_per_call: f64,
}

/// A command that is not a shell builtin: the remote shell's login shell execs it, and the
/// subagent execs its words directly (no `/bin/sh`), so both ways make one exec for it.
const PLAIN_COMMAND: &str = "/bin/true";

/// `rsh anyLinux /bin/true` beside the real remote shell's, and one exec on the front end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlainCommand {
    pub(crate) real: Summary,
    pub(crate) any: Summary,
    pub(crate) exec: Summary,
}

/// Runs the real remote shell and `rsh anyLinux true` interleaved in one job whose agent
/// records step times; `reps` runs of each (× [`NULL_REPS_FACTOR`], as Table 1's `null`).
/// Then, without step times, the same with [`PLAIN_COMMAND`], beside one local exec of it.
pub(crate) fn measure(env: &LabWithBroker, transport: &str, reps: usize) -> anyhow::Result<Steps> {
    let file = step_file(env)?;
    let real = real_program(transport)?;
    let owned = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let ways = vec![
        owned(&[&OUTSIDE_JOB[..], &[real.as_str(), TARGET, "true"]].concat()),
        owned(&["rsh", "anyLinux", "true"]),
    ];
    let path = file.display().to_string();
    let runs = reps * NULL_REPS_FACTOR;
    let times = time_interleaved_with(env, runs, &ways, &[(ENV_STEP_TIMES, path.as_str())])?;
    let text = std::fs::read_to_string(&file)?;
    let lines: Vec<Line> = text.lines().filter_map(parse_line).collect();
    let calls = calls(&lines);
    anyhow::ensure!(
        !calls.is_empty(),
        "no call in the step file {path} ({} lines): did the shim see {ENV_STEP_TIMES}?",
        lines.len()
    );
    let between = |from: &str, to: &str| {
        let ms: Vec<f64> = calls
            .iter()
            .filter_map(|c| Some((*c.get(to)? as f64 - *c.get(from)? as f64) / 1e6))
            .collect();
        summarize(&ms)
    };
    let summary = |(times, _): &(Vec<f64>, usize)| summarize(times).expect("non-empty");
    let plain_ways = vec![
        owned(&[&OUTSIDE_JOB[..], &[real.as_str(), TARGET, PLAIN_COMMAND]].concat()),
        owned(&["rsh", "anyLinux", PLAIN_COMMAND]),
        owned(&[PLAIN_COMMAND]),
    ];
    let plain_times = time_interleaved_with(env, runs, &plain_ways, &[])?;
    let plain = match plain_times
        .iter()
        .map(|(t, _)| summarize(t))
        .collect::<Vec<_>>()[..]
    {
        [Some(real), Some(any), Some(exec)] => Some(PlainCommand { real, any, exec }),
        _ => None,
    };
    Ok(Steps {
        transport: transport.to_string(),
        real: summary(&times[0]),
        any: summary(&times[1]),
        plain,
        chain: CHAIN.iter().map(|(a, b, _)| between(a, b)).collect(),
        side: SIDE.iter().map(|(a, b, _)| between(a, b)).collect(),
        total: between("timeit.spawn", "timeit.reaped"),
        steps_per_call: calls.iter().map(HashMap::len).sum::<usize>() as f64 / calls.len() as f64,
        calls: calls.len(),
        step_cost_us: step_cost_us(&file),
    })
}

/// An empty step file in the lab home (the same path on every host), the lab user's.
pub(crate) fn step_file(env: &LabWithBroker) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let user = env.lab.user();
    let path = user.home.join("step-times");
    std::fs::write(&path, "")?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))?;
    Ok(path)
}

/// Each call's events (step → ns): the window of a shim (`shim.start` … `shim.exit`, the
/// same pid), the untagged agent steps inside it, the steps of the allocation its
/// `shim.granted` names (wherever they are), and `rb-timeit`'s spawn before and reap after.
fn calls(lines: &[Line]) -> Vec<HashMap<String, u64>> {
    let mut sorted = lines.to_vec();
    sorted.sort_by_key(|l| l.ns);
    let mut out = Vec::new();
    for start in sorted.iter().filter(|l| l.step == "shim.start") {
        let shim =
            |l: &&Line| l.step.starts_with("shim.") && l.pid == start.pid && l.ns >= start.ns;
        let Some(exit) = sorted.iter().filter(shim).find(|l| l.step == "shim.exit") else {
            continue;
        };
        let window = |l: &&Line| l.ns >= start.ns && l.ns <= exit.ns;
        let mut events: HashMap<String, u64> = HashMap::new();
        let mut put = |l: &Line| {
            events.entry(l.step.clone()).or_insert(l.ns);
        };
        sorted.iter().filter(shim).filter(window).for_each(&mut put);
        let alloc = sorted
            .iter()
            .filter(shim)
            .find(|l| l.step == "shim.granted")
            .and_then(|l| l.alloc);
        sorted
            .iter()
            .filter(window)
            .filter(|l| l.step.starts_with("agent.") && l.alloc.is_none())
            .for_each(&mut put);
        if let Some(alloc) = alloc {
            sorted
                .iter()
                .filter(|l| !l.step.starts_with("shim.") && l.alloc == Some(alloc))
                .for_each(&mut put);
        }
        if let Some(spawn) = sorted
            .iter()
            .rev()
            .find(|l| l.step == "timeit.spawn" && l.ns <= start.ns)
        {
            put(spawn);
        }
        if let Some(reaped) = sorted
            .iter()
            .find(|l| l.step == "timeit.reaped" && l.ns >= exit.ns)
        {
            put(reaped);
        }
        out.push(events);
    }
    out
}

/// What one recorded step costs here (median of 2000, µs): the clock, the line, the write.
fn step_cost_us(file: &std::path::Path) -> f64 {
    let dir = file.with_file_name("step-times-cost");
    let _ = std::fs::remove_file(&dir);
    let Ok(sink) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&dir)
    else {
        return f64::NAN;
    };
    use std::io::Write;
    let mut each = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let t0 = steptimes::now_ns();
        let line = steptimes::format_line("cost", steptimes::now_ns(), 1, Some(1));
        let _ = (&sink).write_all(line.as_bytes());
        each.push((steptimes::now_ns() - t0) as f64 / 1000.0);
    }
    let _ = std::fs::remove_file(&dir);
    summarize(&each).map_or(f64::NAN, |s| s.median)
}

pub(crate) fn print(all: &[Steps]) {
    for s in all {
        let t = &s.transport;
        println!("### Where `rsh anyLinux null` spends its time (job over {t})\n");
        println!("One job on node02 runs `{t} node03 true` (the real {t}, as outside any job: the baseline) and `rsh anyLinux true` (granted node03) interleaved run by run, {} runs each; its agent has `{ENV_STEP_TIMES}` set, so the shim, the agent, `rb-timeit` and the subagent on node03 append a line with `CLOCK_MONOTONIC` at each step. Each step: the median over the {} calls found of the time between its two events, and its share of the median call (`timeit.spawn` → `timeit.reaped`); step medians need not add up to the whole.\n", s.real.n, s.calls);
        println!("| step | median ms | share |");
        println!("|---|---:|---:|");
        let total = s.total.map_or(f64::NAN, |t| t.median);
        for ((from, to, what), sum) in CHAIN.iter().zip(&s.chain) {
            let (ms, share) = match sum {
                Some(x) => (
                    format!("{:.2}", x.median),
                    format!("{:.0} %", 100.0 * x.median / total),
                ),
                None => ("-".into(), "-".into()),
            };
            println!("| {what} (`{from}` → `{to}`) | {ms} | {share} |");
        }
        println!("| **the call** (`timeit.spawn` → `timeit.reaped`) | **{total:.2}** | 100 % |");
        println!();
        println!("Beside the call (not on its path):\n");
        println!("| step | median ms |");
        println!("|---|---:|");
        for ((from, to, what), sum) in SIDE.iter().zip(&s.side) {
            let ms = sum.map_or("-".into(), |x| format!("{:.2}", x.median));
            println!("| {what} (`{from}` → `{to}`) | {ms} |");
        }
        println!();
        println!(
            "rb-timeit in the same run: `{t} node03 true` (real {t}, baseline) {}, `rsh anyLinux true` {}: {:+.1} ms beyond the real {t} (goal ≤ +3 ms). Recording costs {:.1} µs a step here, {:.0} steps a call.\n",
            crate::agent::show(&s.real),
            crate::agent::show(&s.any),
            s.any.median - s.real.median,
            s.step_cost_us,
            s.steps_per_call,
        );
        if let Some(p) = &s.plain {
            println!(
                "A command that is no shell builtin, `{PLAIN_COMMAND}`, in the same job without step times: `{t} node03 {PLAIN_COMMAND}` {}, `rsh anyLinux {PLAIN_COMMAND}` {}: {:+.1} ms beyond the real {t}. One fork, exec and wait of `{PLAIN_COMMAND}` on node02 in the same run: {}. For `true`, a builtin, the real {t} makes no exec on node03 while the shim's way makes two there (the subagent, and `/bin/sh` for the builtin) and one on node02 (the shim); for `{PLAIN_COMMAND}` both ways exec it, and the shim's way makes one more on each host (the shim, the subagent, which execs a plain command's words directly).\n",
                crate::agent::show(&p.real),
                crate::agent::show(&p.any),
                p.any.median - p.real.median,
                crate::agent::show(&p.exec),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(step: &str, ns: u64, pid: u32, alloc: Option<u64>) -> Line {
        Line {
            step: step.into(),
            ns,
            pid: Some(pid),
            alloc,
        }
    }

    #[test]
    fn calls_are_windows_of_a_shim_with_their_allocation() {
        let lines = vec![
            line("timeit.spawn", 1, 9, None),
            line("shim.start", 2, 50, None),
            line("agent.shim_request", 3, 7, None),
            line("shim.granted", 4, 50, Some(11)),
            line("sub.start", 5, 3, Some(11)),
            line("shim.exit", 6, 50, None),
            line("timeit.reaped", 7, 9, None),
            // After the call: its give-back, and the next call's steps.
            line("agent.give_back_sent", 8, 7, Some(11)),
            line("timeit.spawn", 9, 9, None),
            line("shim.start", 10, 51, None),
            line("agent.shim_request", 11, 7, None),
            line("shim.granted", 12, 51, Some(12)),
            line("shim.exit", 13, 51, None),
        ];
        let calls = calls(&lines);
        assert_eq!(calls.len(), 2);
        let first = &calls[0];
        assert_eq!(first["timeit.spawn"], 1);
        assert_eq!(first["agent.shim_request"], 3);
        assert_eq!(first["sub.start"], 5);
        assert_eq!(first["timeit.reaped"], 7);
        assert_eq!(first["agent.give_back_sent"], 8);
        assert_eq!(calls[1]["agent.shim_request"], 11);
        assert!(!calls[1].contains_key("agent.give_back_sent"));
        assert!(!calls[1].contains_key("timeit.reaped"));
    }
}
