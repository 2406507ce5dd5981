//! The job stream of the fault scenarios: random steps (jobs start and end, hosts are
//! released, the owner of the private host comes and goes), the lab it runs on (broker on
//! a fixed port so agents find it after a restart), and SIGKILL of one of the stack's
//! processes inside the lab.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use super::{held, job_processes, leftovers, shared_hosts, Jobs, Rng, Tally, View};
use crate::{labtier::LabWithBroker, wait_until};

/// The owned (private) host of the stream's lab, where the owner comes back.
pub const PRIVATE: &str = "node05";
pub const OWNER: &str = "alice";
/// At most this many apps at once (3 hosts: some requests queue).
pub const MAX_LIVE: usize = 4;

/// The mutable state of a job stream.
pub struct Stream {
    pub rng: Rng,
    pub jobs: Jobs,
    pub tally: Tally,
    pub login: Option<lab::FakeLogin>,
    /// Hosts taken from their job on purpose since the last check.
    pub taken: BTreeSet<String>,
}

impl Stream {
    pub fn new(scenario: &str, seed: u64) -> Self {
        Self {
            rng: Rng::new(seed),
            jobs: Jobs::new(scenario),
            tally: Tally::new(scenario, seed),
            login: None,
            taken: BTreeSet::new(),
        }
    }

    /// One random step of the stream: a job starts or ends, a host is released, the owner
    /// of the private host comes back or leaves.
    pub fn step(&mut self, env: &LabWithBroker) {
        let live = self.jobs.live().count();
        match self.rng.below(6) {
            0..=2 if live < MAX_LIVE => {
                let n = 1 + self.rng.below(2);
                let m = self.jobs.start(env, n).marker.clone();
                eprintln!("step: start {m} with {n} instance(s)");
                self.tally.jobs += 1;
            }
            0..=3 if live > 0 => {
                let i = self.rng.below(live);
                eprintln!("step: end app of {:?}", self.jobs.end_app(i));
            }
            4 => {
                let Some(view) = View::take(env) else { return };
                let hosts = held(&view);
                if hosts.is_empty() {
                    return;
                }
                let host = hosts[self.rng.below(hosts.len())].clone();
                eprintln!("step: release {host}");
                let _ = env.broker.rb(&["release", &host, "--grace-s", "1"]);
                self.taken.insert(host);
            }
            _ => match self.login.take() {
                Some(login) => {
                    eprintln!("step: owner leaves");
                    let _ = login.end();
                }
                None => {
                    eprintln!("step: owner returns");
                    let login = env
                        .lab
                        .fake_login(PRIVATE, OWNER, "rbtty-alice", Duration::ZERO)
                        .expect("fake login");
                    self.login = Some(login);
                    self.taken.insert(PRIVATE.into());
                }
            },
        }
    }

    /// Agents that outlive their app, and processes of ended jobs still on a host.
    pub fn ended_checks(&mut self, env: &LabWithBroker) -> Vec<String> {
        let mut out = self.jobs.reap();
        out.extend(shared_hosts(&job_processes(env)));
        let ended = self.jobs.ended_markers();
        let left = leftovers(env, &ended);
        self.tally.left.extend(left.iter().cloned());
        out.extend(left);
        out
    }

    /// Ends every job; then no agent, no process of a job, no held host may be left.
    pub fn finish(mut self, env: &LabWithBroker) {
        if let Some(login) = self.login.take() {
            let _ = login.end();
        }
        let mut out = self.jobs.end_all();
        out.extend(self.ended_checks(env));
        let freed = wait_until(Duration::from_secs(15), || {
            View::take(env).filter(|v| held(v).is_empty())
        });
        if freed.is_none() {
            out.push(format!(
                "hosts still held after every job ended: {:?}",
                View::take(env).map(|v| held(&v))
            ));
        }
        // A subagent may still be ending its command's group: give it the same bound.
        let find = || -> Vec<String> {
            env.lab
                .hosts()
                .iter()
                .filter_map(|h| {
                    let o = env
                        .lab
                        .exec(&h.name, &["pgrep", "-a", "rb-subagent"])
                        .ok()?;
                    let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
                    (!s.is_empty()).then(|| format!("{}: {s}", h.name))
                })
                .collect()
        };
        let gone = wait_until(super::LEFTOVER_BOUND, || find().is_empty().then_some(()));
        let subagents = if gone.is_some() { Vec::new() } else { find() };
        for s in &subagents {
            self.tally.left.insert(s.clone());
            out.push(format!("subagent left after every job ended: {s}"));
        }
        self.tally.fault("end", out);
        keep_broker_log(env, &self.jobs);
        self.tally.finish();
    }
}

pub fn stream_lab() -> LabWithBroker {
    // node02..node05, all managed; node05 private (its owner comes and goes).
    let mut env = LabWithBroker::start(4, &[(PRIVATE, OWNER)]);
    pin_port(&mut env);
    env
}

/// Writes the port the broker got into its lab file and restarts it there, so that agents
/// find it again after a restart (a lab's broker has a fixed port; tests bind port 0).
pub fn pin_port(env: &mut LabWithBroker) {
    let addr = env.broker.tcp_addr();
    let text = std::fs::read_to_string(&env.broker.lab_file).expect("lab file");
    let pinned = text.replacen(
        &format!("listen = \"{}:0\"", addr.ip()),
        &format!("listen = \"{addr}\""),
        1,
    );
    assert_ne!(pinned, text, "listen line not found in\n{text}");
    std::fs::write(&env.broker.lab_file, pinned).expect("write lab file");
    env.broker.kill_and_restart();
    env.broker.wait_all_up(Duration::from_secs(20));
    assert_eq!(env.broker.tcp_addr(), addr, "broker moved to another port");
}

/// A deadline for `faults` faults: the default run stays well under 3 minutes.
pub fn budget(faults: usize) -> Instant {
    Instant::now() + Duration::from_secs(30 + 12 * faults as u64)
}

/// A process of the stack to SIGKILL inside the lab.
#[derive(Debug, Clone, Copy)]
pub enum Victim {
    Hostd,
    Subagent,
    Agent,
}

impl Victim {
    pub fn name(self) -> &'static str {
        match self {
            Victim::Hostd => "hostd_kill",
            Victim::Subagent => "subagent_kill",
            Victim::Agent => "agent_kill",
        }
    }
}

/// SIGKILLs one `victim` chosen by the stream's seed; false when there was none to kill.
pub fn kill_one(env: &LabWithBroker, s: &mut Stream, victim: Victim) -> bool {
    let hosts: Vec<String> = env.lab.hosts().iter().map(|h| h.name.clone()).collect();
    match victim {
        Victim::Agent => {
            let live = s.jobs.live().count();
            live > 0 && s.jobs.kill_agent(s.rng.below(live)).is_some()
        }
        Victim::Hostd => {
            let host = &hosts[s.rng.below(hosts.len())];
            let Some(pid) = env.hostd_pid(host) else {
                return false;
            };
            env.lab.exec(host, &["kill", "-9", &pid]).is_ok()
        }
        Victim::Subagent => {
            let mut found = Vec::new();
            for host in &hosts {
                let Ok(o) = env.lab.exec(host, &["pgrep", "-x", "rb-subagent"]) else {
                    continue;
                };
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    found.push((host.clone(), pid.to_string()));
                }
            }
            if found.is_empty() {
                return false;
            }
            let (host, pid) = &found[s.rng.below(found.len())];
            // Which one (front or guardian, of which alloc): for reading a failure.
            if let Ok(o) = env
                .lab
                .exec(host, &["ps", "-o", "pid=,ppid=,args=", "-p", pid])
            {
                let what = String::from_utf8_lossy(&o.stdout).trim().to_string();
                eprintln!("fault: SIGKILL rb-subagent on {host}: {what}");
            }
            env.lab.exec(host, &["kill", "-9", pid]).is_ok()
        }
    }
}

/// Copies the broker's log beside the agents' logs (its temp dir goes with the test).
pub fn keep_broker_log(env: &LabWithBroker, jobs: &Jobs) {
    let _ = std::fs::write(jobs.logs.join("broker.log"), env.broker.log());
}
