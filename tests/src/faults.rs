//! Fault-injection support for `tests/tests/faults_lab.rs`: a seeded random source, a
//! stream of real jobs (agents on the gateway running `rsh anyLinux-N …` on lab hosts),
//! the invariant checks run after every fault, and the JSON summary each scenario writes
//! under `target/faults/` (turned into `RELIABILITY.md` by `bench/faults/run.sh`).
//!
//! Layout: [`Rng`] and [`FaultConfig`] (seed and kill count from the environment, printed);
//! [`Jobs`] (start, stop, watch the agents); the pure checks [`exclusive`] and [`kept`] on
//! `rb status --json` / `rb jobs --json`; [`Tally`] (what was injected, what broke).
//!
//! Every remote command of job `jN` carries `RBFAULT=jN` in its environment, so a process
//! left behind by an ended job is found by walking `/proc/*/environ` on every lab host.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{bin, labtier::LabWithBroker, wait_until};

/// How long an agent may take to exit after its app ended.
pub const AGENT_EXIT_BOUND: Duration = Duration::from_secs(20);
/// How long the processes of an ended job may outlive it on the hosts (subagent: 10 s).
pub const LEFTOVER_BOUND: Duration = Duration::from_secs(15);

/// splitmix64: small, seedable, the same sequence on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// A duration uniform in `lo..hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next_u64() % (hi - lo).max(1))
    }
}

/// Seed and fault count of a run: `RB_FAULT_SEED` (else from the clock) and
/// `RB_FAULT_KILLS` (else `default_kills`). Printed so a failure can be replayed.
#[derive(Debug, Clone, Copy)]
pub struct FaultConfig {
    pub seed: u64,
    pub kills: usize,
}

impl FaultConfig {
    pub fn from_env(scenario: &str, default_kills: usize) -> Self {
        let seed = std::env::var("RB_FAULT_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        let kills = std::env::var("RB_FAULT_KILLS")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(default_kills);
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "{scenario}: RB_FAULT_SEED={seed} RB_FAULT_KILLS={kills}"
        );
        Self { seed, kills }
    }
}

/// What a scenario injected and what broke; written as JSON under `target/faults/`.
#[derive(Debug, Default)]
pub struct Tally {
    pub scenario: String,
    pub seed: u64,
    pub faults: BTreeMap<String, u64>,
    pub survived: u64,
    pub violations: Vec<String>,
    pub leftovers: u64,
    pub jobs: u64,
}

impl Tally {
    pub fn new(scenario: &str, seed: u64) -> Self {
        Self {
            scenario: scenario.into(),
            seed,
            ..Self::default()
        }
    }

    /// One fault of `kind` injected; `survived` when every check after it passed.
    pub fn fault(&mut self, kind: &str, violations: Vec<String>) {
        *self.faults.entry(kind.into()).or_default() += 1;
        if violations.is_empty() {
            self.survived += 1;
        }
        for v in violations {
            let line = format!("after {kind} #{}: {v}", self.faults[kind]);
            eprintln!("VIOLATION {line}");
            self.violations.push(line);
        }
    }

    /// Writes `target/faults/SCENARIO.json` and returns its path.
    pub fn write(&self) -> PathBuf {
        let dir = faults_dir();
        std::fs::create_dir_all(&dir).expect("mkdir target/faults");
        let path = dir.join(format!("{}.json", self.scenario));
        let json = serde_json::json!({
            "scenario": self.scenario,
            "seed": self.seed,
            "faults": self.faults,
            "injected": self.faults.values().sum::<u64>(),
            "survived": self.survived,
            "violations": self.violations,
            "leftovers": self.leftovers,
            "jobs": self.jobs,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json).expect("json"))
            .expect("write summary");
        path
    }

    /// Writes the summary, then fails the test on any violation or leftover.
    pub fn finish(&self) {
        let path = self.write();
        assert!(
            self.violations.is_empty() && self.leftovers == 0,
            "{}: {} violation(s), {} process(es) left behind (seed {}; summary {}):\n{}",
            self.scenario,
            self.violations.len(),
            self.leftovers,
            self.seed,
            path.display(),
            self.violations.join("\n")
        );
    }
}

/// `target/faults`: the summaries, and the agents' logs under `logs/SCENARIO/`.
pub fn faults_dir() -> PathBuf {
    crate::bin_dir()
        .parent()
        .expect("target dir")
        .join("faults")
}

/// One job of the stream: its agent and the file that ends its app.
#[derive(Debug)]
pub struct Job {
    pub marker: String,
    pub instances: usize,
    pub stop: PathBuf,
    pub child: Child,
    /// When the driver ended the app (created the stop file) or killed the agent.
    pub ended_at: Option<Instant>,
    pub exited: bool,
}

/// The jobs of a scenario, the temp dir of their stop files and the dir of the agents' logs.
pub struct Jobs {
    pub dir: tempfile::TempDir,
    pub logs: PathBuf,
    pub list: Vec<Job>,
    next: usize,
}

impl Jobs {
    /// Agents log (`RB_LOG=info`) to `target/faults/logs/SCENARIO/MARKER.log`.
    pub fn new(scenario: &str) -> Self {
        let logs = faults_dir().join("logs").join(scenario);
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs).expect("mkdir logs");
        Self {
            logs,
            dir: tempfile::Builder::new()
                .prefix("rb-faults-")
                .tempdir_in("/var/tmp")
                .expect("tempdir"),
            list: Vec::new(),
            next: 1,
        }
    }

    /// Starts an adaptive job whose app binds `instances` instances (`anyLinux-1..`), each
    /// running a long sleep tagged with the job's marker, then waits for its stop file.
    pub fn start(&mut self, env: &LabWithBroker, instances: usize) -> &Job {
        self.start_running(env, instances, "sleep 600")
    }

    /// [`start`](Self::start) with `body` as each instance's remote command (after the
    /// marker's `export`), e.g. `trap '' TERM; sleep 600` for one that outlasts SIGTERM.
    pub fn start_running(&mut self, env: &LabWithBroker, instances: usize, body: &str) -> &Job {
        let marker = format!("j{}", self.next);
        self.next += 1;
        let stop = self.dir.path().join(format!("stop-{marker}"));
        let mut script = String::new();
        for i in 1..=instances {
            script.push_str(&format!(
                "rsh anyLinux-{i} \"export RBFAULT={marker}; {body}\" </dev/null >/dev/null 2>&1 & "
            ));
        }
        script.push_str(&format!(
            "while [ ! -e {} ]; do sleep 0.1; done",
            stop.display()
        ));
        let log = std::fs::File::create(self.logs.join(format!("{marker}.log"))).expect("log");
        let child = Command::new(bin("agent"))
            .arg("--broker")
            .arg(env.broker.tcp_addr().to_string())
            .arg("--secret-file")
            .arg(env.broker.secret())
            .args(["--grace-s", "1", "--rsl", "(adaptive=yes)", "--"])
            .args(["sh", "-c", &script])
            .env_remove("RB_AGENT")
            .env_remove("RB_LAB")
            .env("RBFAULTJOB", &marker)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .env("RB_LOG", "info")
            .spawn()
            .expect("start agent");
        self.list.push(Job {
            marker,
            instances,
            stop,
            child,
            ended_at: None,
            exited: false,
        });
        self.list.last().expect("just pushed")
    }

    /// Jobs whose app has not been ended.
    pub fn live(&self) -> impl Iterator<Item = &Job> {
        self.list.iter().filter(|j| j.ended_at.is_none())
    }

    /// Ends the app of the `i`th live job (its agent should then end the job and exit).
    pub fn end_app(&mut self, i: usize) -> Option<String> {
        let job = self
            .list
            .iter_mut()
            .filter(|j| j.ended_at.is_none())
            .nth(i)?;
        std::fs::write(&job.stop, b"").expect("stop file");
        job.ended_at = Some(Instant::now());
        Some(job.marker.clone())
    }

    /// SIGKILLs the agent of the `i`th live job.
    pub fn kill_agent(&mut self, i: usize) -> Option<String> {
        let job = self
            .list
            .iter_mut()
            .filter(|j| j.ended_at.is_none())
            .nth(i)?;
        let _ = job.child.kill();
        job.ended_at = Some(Instant::now());
        eprintln!("fault: agent of {} killed", job.marker);
        Some(job.marker.clone())
    }

    /// Reaps exited agents; an agent still running [`AGENT_EXIT_BOUND`] after its app
    /// ended is a violation (and is killed so the run goes on).
    pub fn reap(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for job in self.list.iter_mut().filter(|j| !j.exited) {
            if job.child.try_wait().ok().flatten().is_some() {
                job.exited = true;
            } else if let Some(at) = job.ended_at {
                if at.elapsed() > AGENT_EXIT_BOUND {
                    out.push(format!(
                        "agent of {} still running {:?} after its app ended",
                        job.marker,
                        at.elapsed()
                    ));
                    let _ = job.child.kill();
                    let _ = job.child.wait();
                    job.exited = true;
                }
            }
        }
        out
    }

    /// Ends every app and waits for every agent (bounded); returns the violations.
    pub fn end_all(&mut self) -> Vec<String> {
        while self.end_app(0).is_some() {}
        let mut out = Vec::new();
        wait_until(AGENT_EXIT_BOUND + Duration::from_secs(2), || {
            out.extend(self.reap());
            self.list.iter().all(|j| j.exited).then_some(())
        });
        out.extend(self.reap());
        out
    }

    /// Markers of the jobs whose agent has exited.
    pub fn ended_markers(&self) -> BTreeSet<String> {
        self.list
            .iter()
            .filter(|j| j.exited)
            .map(|j| j.marker.clone())
            .collect()
    }
}

impl Drop for Jobs {
    fn drop(&mut self) {
        for job in &mut self.list {
            let _ = job.child.kill();
            let _ = job.child.wait();
        }
    }
}

/// `(host, marker)` for every process on the lab hosts whose environment has `RBFAULT=`.
pub fn job_processes(env: &LabWithBroker) -> Vec<(String, String)> {
    let script = "for f in /proc/[0-9]*/environ; do \
                  m=$(tr '\\0' '\\n' < $f 2>/dev/null | sed -n 's/^RBFAULT=//p'); \
                  [ -n \"$m\" ] && echo \"$m\"; done; true";
    let mut out = Vec::new();
    for host in env.lab.hosts() {
        if !env.lab.is_running(&host.name) {
            continue;
        }
        if let Ok(o) = env.lab.exec(&host.name, &["sh", "-c", script]) {
            for m in String::from_utf8_lossy(&o.stdout).lines() {
                out.push((host.name.clone(), m.trim().to_string()));
            }
        }
    }
    out
}

/// Waits up to [`LEFTOVER_BOUND`] for the processes of the ended jobs `ended` to go;
/// returns those still there (`host: marker`).
pub fn leftovers(env: &LabWithBroker, ended: &BTreeSet<String>) -> Vec<String> {
    let find = || -> Vec<String> {
        job_processes(env)
            .into_iter()
            .filter(|(_, m)| ended.contains(m))
            .map(|(h, m)| format!("{h}: process of ended job {m}"))
            .collect()
    };
    wait_until(LEFTOVER_BOUND, || {
        let left = find();
        left.is_empty().then_some(())
    })
    .map_or_else(find, |()| Vec::new())
}

/// Hosts where processes of two jobs run at once: a host went to a second job while the
/// first one's processes were still there.
pub fn shared_hosts(procs: &[(String, String)]) -> Vec<String> {
    let mut by_host: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (h, m) in procs {
        by_host.entry(h).or_default().insert(m);
    }
    by_host
        .into_iter()
        .filter(|(_, ms)| ms.len() > 1)
        .map(|(h, ms)| format!("{h} runs processes of jobs {ms:?} at once"))
        .collect()
}

/// `rb status --json` and `rb jobs --json` at one moment.
/// The jobs are asked for before and after the status (`jobs_before`, `jobs`), so that a
/// grant or a job end between the two questions is not taken for an inconsistency.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub status: Vec<Value>,
    pub jobs: Vec<Value>,
    pub jobs_before: Vec<Value>,
}

impl View {
    /// Both lists, or `None` when the broker does not answer.
    pub fn take(env: &LabWithBroker) -> Option<View> {
        let before = env.broker.rb(&["jobs", "--json"]);
        let status = env.broker.rb(&["status", "--json"]);
        let jobs = env.broker.rb(&["jobs", "--json"]);
        if [&before, &status, &jobs]
            .iter()
            .any(|o| !o.status.success())
        {
            return None;
        }
        Some(View {
            status: serde_json::from_slice(&status.stdout).ok()?,
            jobs: serde_json::from_slice(&jobs.stdout).ok()?,
            jobs_before: serde_json::from_slice(&before.stdout).ok()?,
        })
    }

    /// The running job whose command carries `marker`.
    pub fn job(&self, marker: &str) -> Option<&Value> {
        let tag = format!("RBFAULT={marker};");
        self.jobs.iter().find(|j| {
            j["state"] == "running"
                && j["argv"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|w| w.as_str().is_some_and(|w| w.contains(&tag)))
                })
        })
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// No host in two live allocations: a host is in at most one running job's `hosts`, that
/// job is the host's `held_by`, and no `held_by` names a job that is not running.
pub fn exclusive(view: &View) -> Vec<String> {
    let mut out = Vec::new();
    let mut holder: BTreeMap<String, u64> = BTreeMap::new();
    let running: BTreeSet<u64> = view
        .jobs
        .iter()
        .chain(&view.jobs_before)
        .filter(|j| j["state"] == "running")
        .filter_map(|j| j["id"].as_u64())
        .collect();
    for job in view.jobs.iter().filter(|j| j["state"] == "running") {
        let id = job["id"].as_u64().unwrap_or(0);
        for host in strings(&job["hosts"]) {
            if let Some(other) = holder.insert(host.clone(), id) {
                out.push(format!("{host} held by jobs {other} and {id}"));
            }
        }
    }
    for row in &view.status {
        let name = row["name"].as_str().unwrap_or("?");
        let held_by = row["held_by"].as_u64();
        if let Some(j) = held_by {
            if !running.contains(&j) {
                out.push(format!(
                    "{name} held_by job {j} ({}), which is not running: {}",
                    row["alloc_state"],
                    view.jobs
                        .iter()
                        .find(|x| x["id"].as_u64() == Some(j))
                        .map_or("not in rb jobs".into(), |x| format!(
                            "{} {}",
                            x["state"], x["hosts"]
                        ))
                ));
            }
        }
        if let Some(&j) = holder.get(name) {
            if held_by != Some(j) && holds(&view.jobs_before, j, name) {
                out.push(format!(
                    "{name} is in job {j}'s hosts but status says held_by {held_by:?}"
                ));
            }
        }
    }
    out
}

/// Whether running job `id` lists `host` in `jobs`.
fn holds(jobs: &[Value], id: u64, host: &str) -> bool {
    jobs.iter().any(|j| {
        j["id"].as_u64() == Some(id)
            && j["state"] == "running"
            && strings(&j["hosts"]).iter().any(|h| h == host)
    })
}

/// Every job running before a fault (app not ended since) keeps its hosts but `taken`
/// (released or reclaimed on purpose) and its queued requests (still queued or granted).
pub fn kept(
    before: &View,
    after: &View,
    markers: &[String],
    taken: &BTreeSet<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for m in markers {
        let Some(b) = before.job(m) else { continue };
        let hosts_b: BTreeSet<String> = strings(&b["hosts"])
            .into_iter()
            .filter(|h| !taken.contains(h))
            .collect();
        let queued_b = strings(&b["queued"]).len();
        let Some(a) = after.job(m) else {
            out.push(format!(
                "job {m} (id {}) running with {hosts_b:?} before, gone after",
                b["id"]
            ));
            continue;
        };
        let hosts_a: BTreeSet<String> = strings(&a["hosts"]).into_iter().collect();
        if !hosts_b.is_subset(&hosts_a) {
            out.push(format!("job {m} held {hosts_b:?}, now {hosts_a:?}"));
        }
        let gained = hosts_a.difference(&hosts_b).count();
        let queued_a = strings(&a["queued"]).len();
        if queued_a + gained < queued_b {
            out.push(format!(
                "job {m} had {queued_b} queued request(s), now {queued_a} queued and {gained} new host(s)"
            ));
        }
    }
    out
}

/// Hosts that are releasing or reserved (being taken back) in `view`.
pub fn being_taken(view: &View) -> BTreeSet<String> {
    view.status
        .iter()
        .filter(|r| {
            r["alloc_state"]
                .as_str()
                .is_some_and(|s| s != "free" && s != "held" && s != "drained")
        })
        .filter_map(|r| r["name"].as_str().map(String::from))
        .collect()
}

/// Hosts held by a running job in `view`.
pub fn held(view: &View) -> Vec<String> {
    view.status
        .iter()
        .filter(|r| r["held_by"].as_u64().is_some())
        .filter_map(|r| r["name"].as_str().map(String::from))
        .collect()
}
