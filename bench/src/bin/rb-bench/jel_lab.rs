//! The JEL section's lab part (latency on the lab), root only: a real
//! job under `agent` on the lab user's front end (node02), its pool hosted by the agent, and
//! members on the front end and on 3 granted lab hosts, each host's members under the
//! subagent there and relayed over its agent link.
//!
//! # The job
//! Its app (a shell script, as a user's would be) runs [`SLOTS`] member slots on the front end
//! and `rsh anyLinux-K sh slots.sh` for K = 1, 2, 3 (again whenever that returns: a released
//! host's instance binds another). A slot runs `rb-jel-probe` (a member that joins, watches
//! from its `joined`, and appends each event with its CLOCK_REALTIME arrival time to a file
//! in the lab user's home, which every host shares) and starts a new one when it is killed;
//! one that left at its host's `vacate`, or saw `terminated`, ends the slot.
//!
//! # What is measured
//! - **death:** SIGKILL to one member process (from the root namespace, by its pid there),
//!   the hosts taken in turn; the instant taken just before `kill(2)`. The figure per
//!   repetition is the arrival of the `died` at the *last* of the other members (15, on every
//!   host). Between repetitions the slot's replacement joins and every member has caught up.
//! - **vacate:** `rb release HOST --grace-s 2` for each granted host in turn. The start is the
//!   broker's decision: the timestamp of its log line `reclaiming … host=HOST` (µs), which the
//!   broker's job desk writes right after its allocator returned the reclaim and just before
//!   it sends the reclaim to the agent. The figure per repetition is the arrival of the
//!   `vacate` at the last of that host's members; from the start of `rb release` (its process
//!   start, connect, authentication included) beside it.
//!
//! Lab hosts are namespaces of this machine, which has one CLOCK_REALTIME for all of them
//! (network, UTS, mount and PID namespaces do not touch clocks; no time namespace is used):
//! the probes', the broker's and this process's timestamps are on one clock.

use std::{
    collections::HashMap,
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context};
use tests::{
    labtier::{LabWithBroker, FRONT_END},
    wait_until,
};

/// Options of the lab part.
pub struct Options {
    /// Members killed (≥ 50 for a p99).
    pub deaths: usize,
    /// Hosts released.
    pub vacates: usize,
}

/// Member slots per host.
const SLOTS: usize = 4;
/// Granted hosts the job keeps.
const GRANTED: usize = 3;
/// Managed lab hosts (one more than the job keeps: a released host's instance binds another).
const MANAGED: usize = GRANTED + 1;
/// The grace of each release.
const GRACE_S: &str = "2";
/// How long after its `left` or `died` a member's file is read on (its last lines).
const FINISHED: Duration = Duration::from_secs(5);
/// How long the job may take to get back to its full set of members.
const SETTLE: Duration = Duration::from_secs(60);

pub fn run(opts: &Options) -> anyhow::Result<()> {
    println!(
        "### On the lab: {SLOTS} members on the front end and on each of {GRANTED} granted hosts\n"
    );
    if !tests::is_root() {
        println!("skipped: needs root (network namespaces)\n");
        return Ok(());
    }
    let env = LabWithBroker::start_with_front_end(1 + MANAGED);
    let result = measure(&env, opts);
    let LabWithBroker { broker, lab } = env;
    drop(broker);
    lab.down().map_err(|e| anyhow::anyhow!("lab down: {e}"))?;
    let (deaths, vacates) = result?;
    print(&deaths, &vacates);
    Ok(())
}

fn measure(env: &LabWithBroker, opts: &Options) -> anyhow::Result<(Vec<Death>, Vec<Vacate>)> {
    let mut job = Job::start(env)?;
    let result = (|| {
        let mut probes = Probes::new(job.dir.clone());
        probes.settle(SLOTS * (1 + GRANTED), SETTLE)?;
        let mut deaths = Vec::new();
        for rep in 0..opts.deaths {
            let death = one_death(&mut probes, rep).with_context(|| format!("death {rep}"))?;
            eprintln!("rb-bench jel: death {rep}: {:.1} ms", death.ms);
            deaths.push(death);
            probes.settle(SLOTS * (1 + GRANTED), SETTLE)?;
        }
        let mut vacates = Vec::new();
        for rep in 0..opts.vacates {
            let vacate =
                one_vacate(env, &mut probes, rep).with_context(|| format!("vacate {rep}"))?;
            eprintln!("rb-bench jel: vacate {rep}: {:.1} ms", vacate.from_decision);
            vacates.push(vacate);
            probes.settle(SLOTS * (1 + GRANTED), SETTLE)?;
        }
        Ok((deaths, vacates))
    })();
    job.stop(env, result.is_ok());
    result
}

/// One repetition of the death measurement.
struct Death {
    /// The killed member was on the front end.
    front_end: bool,
    /// Kill → the last other member has the `died`, ms.
    ms: f64,
}

fn one_death(probes: &mut Probes, rep: usize) -> anyhow::Result<Death> {
    let live = probes.live();
    let mut hosts: Vec<&str> = live.iter().map(|p| p.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let host = hosts[rep % hosts.len()].to_string();
    let on_host: Vec<&Live> = live.iter().filter(|p| p.host == host).collect();
    let victim = on_host[(rep / hosts.len()) % on_host.len()].clone();
    let pid = probe_pid(&victim.name)?;
    let start = unix_ns();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
        .with_context(|| format!("killing member {} (pid {pid})", victim.name))?;
    let others: Vec<&Live> = live.iter().filter(|p| p.id != victim.id).collect();
    let last = probes.wait_all(&others, Duration::from_secs(10), |e| {
        e.kind == "died" && e.member == Some(victim.id)
    })?;
    Ok(Death {
        front_end: host == FRONT_END,
        ms: ms_between(start, last),
    })
}

/// One repetition of the vacate measurement.
struct Vacate {
    /// Broker's decision → the last of the host's members has the `vacate`, ms.
    from_decision: f64,
    /// Start of `rb release` → the same, ms.
    from_command: f64,
    /// Broker's decision → the first of the host's members has it, ms.
    first: f64,
}

fn one_vacate(env: &LabWithBroker, probes: &mut Probes, rep: usize) -> anyhow::Result<Vacate> {
    let live = probes.live();
    let mut hosts: Vec<&str> = live
        .iter()
        .map(|p| p.host.as_str())
        .filter(|h| *h != FRONT_END)
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    if hosts.is_empty() {
        bail!("no granted host has members");
    }
    let host = hosts[rep % hosts.len()].to_string();
    let on_host: Vec<&Live> = live.iter().filter(|p| p.host == host).collect();
    let log_from = env.broker.log().len();
    let command = unix_ns();
    let out = env.broker.rb(&["release", &host, "--grace-s", GRACE_S]);
    if !out.status.success() {
        bail!(
            "rb release {host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let decided = wait_until(Duration::from_secs(10), || {
        reclaim_logged(&env.broker.log()[log_from..], &host)
    })
    .with_context(|| format!("no `reclaiming … host={host}` in the broker's log"))?;
    let is_vacate = |e: &Seen| e.kind == "vacate" && e.host.as_deref() == Some(host.as_str());
    let last = probes.wait_all(&on_host, Duration::from_secs(10), is_vacate)?;
    let first = on_host
        .iter()
        .filter_map(|p| probes.arrival(&p.name, is_vacate))
        .min()
        .context("a first arrival")?;
    Ok(Vacate {
        from_decision: ms_between(decided, last),
        from_command: ms_between(command, last),
        first: ms_between(decided, first),
    })
}

/// The time of the broker's `reclaiming` log line for `host` (Unix ns), if written.
fn reclaim_logged(log: &str, host: &str) -> Option<u128> {
    let field = format!("host={host}");
    let line = log
        .lines()
        .find(|l| l.contains(" reclaiming") && l.split_whitespace().any(|w| w == field.as_str()))?;
    rfc3339_ns(line.split_whitespace().next()?)
}

/// `2026-11-27T13:19:35.123456Z` (tracing's timestamps: UTC) as Unix ns.
fn rfc3339_ns(s: &str) -> Option<u128> {
    u128::try_from(bench::civil::civil_ns(s.strip_suffix('Z')?)?).ok()
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn ms_between(from: u128, to: u128) -> f64 {
    to.saturating_sub(from) as f64 / 1e6
}

/// The pid (in the root namespace) of the probe named `name`, from /proc.
fn probe_pid(name: &str) -> anyhow::Result<nix::unistd::Pid> {
    let want = format!("--name\0{name}\0");
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline);
        let argv0 = text.split('\0').next().unwrap_or("");
        if argv0.ends_with("rb-jel-probe") && text.contains(&want) {
            return Ok(nix::unistd::Pid::from_raw(pid));
        }
    }
    bail!("no process of member {name}")
}

/// The job: its agent (run by the lab user on the front end) and the shared directory of its
/// members' files.
struct Job {
    agent: Child,
    dir: PathBuf,
}

impl Job {
    fn start(env: &LabWithBroker) -> anyhow::Result<Job> {
        let user = env.lab.user();
        let dir = user.home.join(format!("jelbench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid))?;
        let probe = tests::bin("rb-jel-probe");
        if !probe.exists() {
            bail!(
                "{} is missing\nhelp: build it with `cargo build --release -p bench`",
                probe.display()
            );
        }
        let slots = dir.join("slots.sh");
        std::fs::write(&slots, slots_script(&dir, &probe))?;
        let app = app_script(&dir, &slots);
        let log = std::fs::File::create(dir.join("agent.log"))?;
        let agent = env
            .agent_as_user(FRONT_END, &["--rsl", "(adaptive=yes)"], &["sh", "-c", &app])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting the job's agent")?;
        Ok(Job { agent, dir })
    }

    /// Ends the app (its stop file), waits for the job's end; removes the files, or after a
    /// failure keeps them with the broker's log in `/tmp/rb-bench-jel-PID` for a look.
    fn stop(&mut self, env: &LabWithBroker, ok: bool) {
        let _ = std::fs::write(self.dir.join("stop"), "");
        let ended = wait_until(Duration::from_secs(30), || {
            self.agent.try_wait().ok().flatten()
        });
        if ended.is_none() {
            let _ = env.lab.stop_spawned(&mut self.agent);
        }
        if !ok {
            let keep = PathBuf::from(format!("/tmp/rb-bench-jel-{}", std::process::id()));
            let _ = std::fs::write(self.dir.join("broker.log"), env.broker.log());
            let copied = std::process::Command::new("cp")
                .arg("-r")
                .arg(&self.dir)
                .arg(&keep)
                .status();
            if copied.is_ok_and(|s| s.success()) {
                eprintln!(
                    "rb-bench jel: the job's files and logs are in {}",
                    keep.display()
                );
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `slots.sh TAG`: [`SLOTS`] member slots; a member killed is replaced, one that ended
/// (vacated, or the job's end) ends its slot.
fn slots_script(dir: &Path, probe: &Path) -> String {
    format!(
        "D='{dir}'; P='{probe}'; tag=$1\n\
         for s in $(seq {SLOTS}); do\n\
         \x20 (n=0; while [ ! -e \"$D/stop\" ]; do n=$((n+1)); \"$P\" --out \"$D\" --name \"$tag-$s-$n\" && break; done) &\n\
         done\n\
         wait\n",
        dir = dir.display(),
        probe = probe.display(),
    )
}

/// The app: slots on the front end, and on each of [`GRANTED`] instances; until the stop file.
fn app_script(dir: &Path, slots: &Path) -> String {
    format!(
        "D='{dir}'; S='{slots}'\n\
         sh \"$S\" fe &\n\
         for k in $(seq {GRANTED}); do\n\
         \x20 (g=0; while [ ! -e \"$D/stop\" ]; do g=$((g+1)); rsh anyLinux-$k sh \"$S\" r$k.$g </dev/null; done) &\n\
         done\n\
         while [ ! -e \"$D/stop\" ]; do sleep 0.1; done\n",
        dir = dir.display(),
        slots = slots.display(),
    )
}

/// One event as a probe recorded it.
#[derive(Debug, Clone)]
struct Seen {
    t_ns: u128,
    seq: u64,
    kind: String,
    /// The event's member, if it has one.
    member: Option<u64>,
    /// The event's host, if it has one (`vacate`, `host_*`).
    host: Option<String>,
}

/// One probe's file, read so far.
#[derive(Debug, Default)]
struct ProbeFile {
    /// (member id, host) from the first line.
    me: Option<(u64, String)>,
    read: u64,
    partial: Vec<u8>,
    events: Vec<Seen>,
}

/// A member that is live as far as any probe knows.
#[derive(Debug, Clone)]
struct Live {
    name: String,
    id: u64,
    host: String,
}

/// The probes' files in the job's directory.
struct Probes {
    dir: PathBuf,
    files: HashMap<String, ProbeFile>,
    /// Members some probe saw leave or die, and when that was read.
    gone: HashMap<u64, Instant>,
    max_seq: u64,
}

impl Probes {
    fn new(dir: PathBuf) -> Self {
        Probes {
            dir,
            files: HashMap::new(),
            gone: HashMap::new(),
            max_seq: 0,
        }
    }

    /// Reads what the probes wrote since the last call (files of gone members no more).
    fn refresh(&mut self) -> anyhow::Result<()> {
        for entry in std::fs::read_dir(&self.dir)?.flatten() {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".events")) else {
                continue;
            };
            let file = self.files.entry(name.to_string()).or_default();
            // A member gone a while ago writes no more (it was killed, or left and exited).
            let gone_at = file.me.as_ref().and_then(|(id, _)| self.gone.get(id));
            if gone_at.is_some_and(|at| at.elapsed() > FINISHED) {
                continue;
            }
            for seen in read_new(&entry.path(), file)? {
                if matches!(seen.kind.as_str(), "died" | "left") {
                    if let Some(id) = seen.member {
                        self.gone.entry(id).or_insert_with(Instant::now);
                    }
                }
                self.max_seq = self.max_seq.max(seen.seq);
                file.events.push(seen);
            }
        }
        Ok(())
    }

    /// The members that are live (joined, not seen gone).
    fn live(&self) -> Vec<Live> {
        let mut live: Vec<Live> = self
            .files
            .iter()
            .filter_map(|(name, f)| {
                let (id, host) = f.me.clone()?;
                (!self.gone.contains_key(&id)).then(|| Live {
                    name: name.clone(),
                    id,
                    host,
                })
            })
            .collect();
        live.sort_by_key(|l| l.id);
        live
    }

    /// Waits until `n` members are live and each has read the newest event any has.
    fn settle(&mut self, n: usize, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            self.refresh()?;
            let live = self.live();
            let caught_up = |l: &Live| {
                let last = self.files[&l.name].events.last().map_or(0, |e| e.seq);
                last == self.max_seq
            };
            if live.len() == n && live.iter().all(caught_up) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the job did not get back to {n} caught-up members within {within:?}: {} live",
                    live.len()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// When the probe `name` read the first event `pick` chooses.
    fn arrival(&self, name: &str, pick: impl Fn(&Seen) -> bool) -> Option<u128> {
        let file = self.files.get(name)?;
        file.events.iter().find(|e| pick(e)).map(|e| e.t_ns)
    }

    /// Waits until each of `members` has read an event `pick` chooses; the latest arrival.
    fn wait_all(
        &mut self,
        members: &[&Live],
        within: Duration,
        pick: impl Fn(&Seen) -> bool,
    ) -> anyhow::Result<u128> {
        let deadline = Instant::now() + within;
        loop {
            self.refresh()?;
            let times: Vec<Option<u128>> = members
                .iter()
                .map(|m| self.arrival(&m.name, &pick))
                .collect();
            if times.iter().all(Option::is_some) {
                return times.into_iter().flatten().max().context("no members");
            }
            if Instant::now() > deadline {
                let missing: Vec<String> = members
                    .iter()
                    .zip(&times)
                    .filter(|(_, t)| t.is_none())
                    .map(|(m, _)| {
                        let last = self.files[&m.name].events.last();
                        let last = last.map(|e| format!("{} {}", e.seq, e.kind));
                        format!("{} on {} (last read: {last:?})", m.name, m.host)
                    })
                    .collect();
                bail!(
                    "members did not see the event within {within:?} (newest seq {}): {missing:?}",
                    self.max_seq
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The whole lines added to `path` since `file.read`, as events (the first line: `me`).
fn read_new(path: &Path, file: &mut ProbeFile) -> anyhow::Result<Vec<Seen>> {
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(file.read))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    file.read += bytes.len() as u64;
    file.partial.extend_from_slice(&bytes);
    let Some(end) = file.partial.iter().rposition(|b| *b == b'\n') else {
        return Ok(Vec::new());
    };
    let whole: Vec<u8> = file.partial.drain(..=end).collect();
    let mut seen = Vec::new();
    for line in String::from_utf8_lossy(&whole).lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}: `{line}`", path.display()))?;
        if let Some(me) = v.get("me") {
            let id = me["id"].as_u64().context("the probe's id")?;
            let host = me["host"].as_str().context("the probe's host")?;
            file.me = Some((id, host.to_string()));
            continue;
        }
        let e = &v["event"];
        seen.push(Seen {
            t_ns: v["t_ns"].as_u64().context("t_ns")?.into(),
            seq: e["seq"].as_u64().context("seq")?,
            kind: e["event"].as_str().unwrap_or("").to_string(),
            member: e["member"]["id"].as_u64(),
            host: e["host"].as_str().map(String::from),
        });
    }
    Ok(seen)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

fn print(deaths: &[Death], vacates: &[Vacate]) {
    println!(
        "A job under `agent` on node02 (the lab user's front end, not managed), jobs over rsh; \
         {GRANTED} lab hosts granted (`rsh anyLinux-1..{GRANTED}`). On each of the 4 hosts, \
         {SLOTS} members: `rb-jel-probe` processes (bench/src/bin/rb-jel-probe.rs: joins, \
         watches from its `joined`, records each event's CLOCK_REALTIME arrival), replaced when \
         killed; on granted hosts under the subagent, whose socket relays them over its agent \
         link. One clock: the lab hosts are namespaces of this machine. Death: SIGKILL to a \
         member process (hosts in turn), from just before `kill(2)` to the `died` read by the \
         last of the other {} members. Vacate: `rb release HOST --grace-s {GRACE_S}`, from the \
         broker's decision (the µs timestamp of its `reclaiming` log line, written right after \
         its allocator decided and before the reclaim goes to the agent) to the `vacate` read by \
         the last of the host's {SLOTS} members (they then leave).\n",
        SLOTS * (1 + GRANTED) - 1
    );
    println!("| measurement | figure | goal |");
    println!("|---|---:|---|");
    let row = |label: &str, v: Vec<f64>| {
        let mut v = v;
        v.sort_by(f64::total_cmp);
        println!(
            "| {label}: p50 / p99 (n={}) | {:.1} / {:.1} ms | p99 ≤ 50 ms |",
            v.len(),
            pct(&v, 0.5),
            pct(&v, 0.99)
        );
    };
    row(
        "member killed → `died` seen by every other member, every host",
        deaths.iter().map(|d| d.ms).collect(),
    );
    row(
        "… the killed member on the front end",
        deaths
            .iter()
            .filter(|d| d.front_end)
            .map(|d| d.ms)
            .collect(),
    );
    row(
        "… the killed member on a granted host",
        deaths
            .iter()
            .filter(|d| !d.front_end)
            .map(|d| d.ms)
            .collect(),
    );
    let show = |v: Vec<f64>| {
        bench::stats::summarize(&v).map_or("-".into(), |s| {
            format!("{:.1} ms ({:.1}–{:.1}, n={})", s.median, s.min, s.max, s.n)
        })
    };
    println!(
        "| broker decides a reclaim → `vacate` seen by all the host's members: median (min–max) | {} | ≤ 20 ms |",
        show(vacates.iter().map(|v| v.from_decision).collect())
    );
    println!(
        "| … seen by the host's first member | {} | — |",
        show(vacates.iter().map(|v| v.first).collect())
    );
    println!(
        "| `rb release` started → `vacate` seen by all the host's members | {} | — |",
        show(vacates.iter().map(|v| v.from_command).collect())
    );
    println!();
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn tracing_timestamps_read_as_unix_ns() {
        assert_eq!(rfc3339_ns("1970-01-01T00:00:00.000001Z"), Some(1_000));
        assert_eq!(
            rfc3339_ns("2026-11-27T13:19:35.123456Z"),
            Some(1_795_785_575_123_456_000)
        );
        assert_eq!(rfc3339_ns("2026-11-27 13:19:35"), None);
    }

    #[test]
    fn the_reclaim_line_of_the_host_is_found() {
        let log = "2026-11-27T13:19:35.000001Z  INFO rb_broker::jobs: reclaiming job=1 alloc=2 host=node030\n\
                   2026-11-27T13:19:36.000002Z  INFO rb_broker::jobs: reclaiming job=1 alloc=3 host=node03\n";
        let t = reclaim_logged(log, "node03").expect("found");
        assert_eq!(t % 1_000_000_000, 2_000);
    }
}
