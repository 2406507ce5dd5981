//! Tier 2, the decision trace replays what the broker decided: the broker's job desk (its
//! shell around the allocator: agents' messages, admin commands, host changes, restarts
//! from its store) driven through a seeded scenario with jobs resumed after restarts, jobs
//! whose agent never comes back or goes away, module jobs whose front end is a lab host and
//! releases by an admin; its trace is then replayed by the real `rb policy replay` under the
//! same policy: no decision differs. No network and no root: the desk is driven in-process
//! on a simulated clock, so the run is the same for a seed.
//!
//! `RB_REPLAY_SEED` replays another run (the seed is printed).

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use broker::{
    alloc::{AllocConfig, Allocator, Effect},
    authz::Actor,
    jobs::{JobDesk, RESUME_WINDOW},
    outbox::{channel, OutboxRx},
    persist::StoreWriter,
    trace::{trace_dir, TraceSink},
};
use proto::{
    msg::{AgentHost, FromBroker, JobRegistration, Request, ToBroker},
    report::{HostState, HostStatus},
};

const HOSTS: usize = 6;
const STEPS_PER_RUN: usize = 160;
const RUNS: usize = 3;

/// A small deterministic generator (xorshift64*): the scenario is a function of the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn host_name(i: usize) -> String {
    format!("vhost{:02}", i + 1)
}

fn host_address(i: usize) -> String {
    format!("10.29.0.{}", i + 1)
}

fn status(i: usize, up: bool, load: f64) -> HostStatus {
    HostStatus {
        name: host_name(i),
        address: host_address(i),
        state: if up { HostState::Up } else { HostState::Down },
        down_reason: None,
        hostname: Some(host_name(i)),
        cpus: Some(2),
        load1: Some(load),
        load5: None,
        load15: None,
        cpu_util: None,
        mem_total_kb: None,
        mem_available_kb: None,
        os: Some("Linux".into()),
        arch: None,
        users: Vec::new(),
        users_known: true,
        console_idle_s: None,
        logind: None,
        logind_error: None,
        warnings: Vec::new(),
        managed_procs: None,
        job_load: None,
        labels: vec!["linux".into(), "public".into()],
        owner: None,
        last_report_age_s: Some(0.5),
        daemon_starts: 1,
        alloc_state: String::new(),
        held_by: None,
        drained: false,
        policy_note: None,
        slurm_job: None,
        lease_left_s: None,
        lease_ending: false,
    }
}

/// One simulated agent: its user, the lab host it runs on when it is a module job's, its
/// outbox and what it holds.
struct Agent {
    user: String,
    front_end: Option<String>,
    rx: OutboxRx,
    /// Allocation → host.
    held: BTreeMap<u64, String>,
    /// Reclaims it will confirm, with when; one it never confirms is forced.
    confirm_at: BTreeMap<u64, Instant>,
    next_req: u64,
}

/// One broker run: the desk, its agents and the simulated clock.
struct Run<'a> {
    desk: JobDesk,
    agents: BTreeMap<u64, Agent>,
    now: Instant,
    rng: &'a mut Rng,
    /// Grants the front-end rule forbids (must stay empty).
    broken: Vec<String>,
    grants: usize,
}

impl Run<'_> {
    fn advance(&mut self, secs: f64) {
        let end = self.now + Duration::from_secs_f64(secs);
        while self.now < end {
            self.now = (self.now + Duration::from_millis(250)).min(end);
            let effects = self.desk.tick(self.now);
            self.perform(effects);
            self.confirm_due();
        }
    }

    fn perform(&mut self, effects: Vec<Effect>) {
        self.desk.perform(effects, self.now);
        self.read_messages();
    }

    /// Each agent reads what the broker sent it.
    fn read_messages(&mut self) {
        for (&job, agent) in &mut self.agents {
            while let Ok(msg) = agent.rx.messages.try_recv() {
                match msg {
                    FromBroker::Granted { alloc, host, .. } => {
                        self.grants += 1;
                        if agent.front_end.as_deref() == Some(host.as_str()) {
                            self.broken
                                .push(format!("job {job} granted its front end {host}"));
                        }
                        agent.held.insert(alloc, host);
                    }
                    FromBroker::Reclaim {
                        alloc, grace_ms, ..
                    } => {
                        if grace_ms == 0 {
                            agent.held.remove(&alloc);
                            agent.confirm_at.remove(&alloc);
                        } else if self.rng.chance(70) {
                            let after = self.rng.below(grace_ms as usize + 500) as u64;
                            let at = self.now + Duration::from_millis(after);
                            agent.confirm_at.insert(alloc, at);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// Agents confirm the reclaims they meant to, when they meant to.
    fn confirm_due(&mut self) {
        let now = self.now;
        let due: Vec<(u64, u64)> = self
            .agents
            .iter()
            .flat_map(|(&job, a)| {
                a.confirm_at
                    .iter()
                    .filter(move |(_, &at)| at <= now)
                    .map(move |(&alloc, _)| (job, alloc))
            })
            .collect();
        for (job, alloc) in due {
            if let Some(a) = self.agents.get_mut(&job) {
                a.confirm_at.remove(&alloc);
                a.held.remove(&alloc);
            }
            self.message(job, ToBroker::Released { alloc });
        }
    }

    fn message(&mut self, job: u64, msg: ToBroker) {
        let effects = self.desk.agent_message(job, msg, self.now);
        self.perform(effects);
    }

    fn register(&mut self, user: &str, resume: Option<u64>, module: bool) -> Option<u64> {
        let front_end = module.then(|| self.rng.below(HOSTS));
        let runs_on = match front_end {
            Some(i) => AgentHost {
                hostname: host_name(i),
                addresses: vec!["127.0.0.1".into(), host_address(i)],
            },
            None => AgentHost {
                hostname: "workstation-1".into(),
                addresses: vec!["192.0.2.1".into()],
            },
        };
        let reg = JobRegistration {
            user: user.into(),
            cwd: "/".into(),
            argv: vec!["pvm".into()],
            spec: None,
            adaptive: self.rng.chance(60),
            resume,
            runs_on: Some(runs_on),
            module: module.then(|| "pvm".into()),
        };
        let (tx, rx) = channel(1024);
        let (job, effects) = self.desk.register(reg, tx, self.now).ok()?;
        self.agents.insert(
            job,
            Agent {
                user: user.into(),
                front_end: front_end.map(host_name),
                rx,
                held: BTreeMap::new(),
                confirm_at: BTreeMap::new(),
                next_req: 1,
            },
        );
        self.perform(effects);
        Some(job)
    }

    fn any_job(&mut self) -> Option<u64> {
        let jobs: Vec<u64> = self.agents.keys().copied().collect();
        (!jobs.is_empty()).then(|| jobs[self.rng.below(jobs.len())])
    }

    /// One random step of the scenario.
    fn step(&mut self) {
        match self.rng.below(100) {
            0..=14 => {
                let user = ["alice", "bob"][self.rng.below(2)];
                let module = self.rng.chance(40);
                self.register(user, None, module);
            }
            15..=49 => {
                if let Some(job) = self.any_job() {
                    let agent = self.agents.get_mut(&job).expect("listed");
                    let req = agent.next_req;
                    agent.next_req += 1;
                    let symbolic = ["anyLinux", "anyHost", "anyPublic"][self.rng.below(3)];
                    let msg = ToBroker::Allocate {
                        req,
                        symbolic: symbolic.into(),
                    };
                    self.message(job, msg);
                }
            }
            50..=64 => {
                let held: Vec<(u64, u64)> = self
                    .agents
                    .iter()
                    .flat_map(|(&j, a)| a.held.keys().map(move |&al| (j, al)))
                    .collect();
                if !held.is_empty() {
                    let (job, alloc) = held[self.rng.below(held.len())];
                    if let Some(a) = self.agents.get_mut(&job) {
                        a.held.remove(&alloc);
                    }
                    self.message(job, ToBroker::GiveBack { alloc });
                }
            }
            65..=71 => {
                if let Some(job) = self.any_job() {
                    self.agents.remove(&job);
                    let effects = self.desk.agent_gone(job, self.now);
                    self.perform(effects);
                }
            }
            72..=76 => {
                if let Some(job) = self.any_job() {
                    self.message(job, ToBroker::EndJob { status: 0 });
                    self.agents.remove(&job);
                }
            }
            77..=84 => {
                let host = host_name(self.rng.below(HOSTS));
                let grace_ms = Some(self.rng.below(3000) as u64);
                let req = Request::Release { host, grace_ms };
                let (_, effects) = self.desk.admin(&Actor::Owner, req, self.now);
                self.perform(effects);
            }
            85..=92 => {
                let i = self.rng.below(HOSTS);
                let up = self.rng.chance(90);
                let load = self.rng.below(300) as f64 / 100.0;
                let row = status(i, up, load);
                let effects = self
                    .desk
                    .host_changed(&row.fixed_part(), &row.live_part(), self.now);
                self.perform(effects);
            }
            _ => {
                let secs = self.rng.below(3000) as f64 / 1000.0;
                self.advance(secs);
            }
        }
        self.advance(0.1);
    }
}

/// A desk as the broker builds it at start: restored from `state/broker.db`, writing its
/// trace to `state/trace/` under run `run`.
fn start_desk(state: &Path, run: usize, now: Instant) -> JobDesk {
    let (store, previous) = StoreWriter::open(&state.join("broker.db")).expect("store");
    let config = AllocConfig::default();
    let mut alloc = match previous {
        Some(snap) => Allocator::restore(snap, config, now).0,
        None => Allocator::with_config(config),
    };
    alloc.set_wall_clock(now, 1_700_000_000 + 3600 * run as i64, 0);
    let clock = allocation::TraceClock::new(now, 1_700_000_000_000 + 3_600_000 * run as i64);
    let sink = TraceSink::spawn(
        trace_dir(state),
        64 << 10,
        1000,
        clock,
        format!("run-{run}"),
    )
    .expect("trace writer");
    JobDesk::new(alloc, vec!["ssh".into()], "ssh", Path::new("/no/secret"))
        .with_trace(sink)
        .with_store(store, now)
}

/// The seeded scenario; returns the grants, the jobs resumed and the front-end rule's
/// violations.
fn scenario(state: &Path, seed: u64) -> (usize, usize, Vec<String>) {
    let mut rng = Rng(seed.max(1));
    let mut now = Instant::now();
    let mut survivors: Vec<(u64, String)> = Vec::new();
    let (mut grants, mut resumed, mut broken) = (0, 0, Vec::new());
    for run in 0..RUNS {
        let desk = start_desk(state, run, now);
        let mut r = Run {
            desk,
            agents: BTreeMap::new(),
            now,
            rng: &mut rng,
            broken: Vec::new(),
            grants: 0,
        };
        for i in 0..HOSTS {
            let row = status(i, true, 0.1);
            let effects = r
                .desk
                .host_changed(&row.fixed_part(), &row.live_part(), r.now);
            r.perform(effects);
        }
        // Agents of the previous run come back (some as another user, refused: a new
        // job), or never do.
        for (job, user) in std::mem::take(&mut survivors) {
            match r.rng.below(10) {
                0..=5 => {
                    let back = r.register(&user, Some(job), false);
                    resumed += usize::from(back == Some(job));
                }
                6 => {
                    r.register("mallory", Some(job), false);
                }
                _ => {}
            }
        }
        for _ in 0..STEPS_PER_RUN / 2 {
            r.step();
        }
        // The resume window closes: the jobs whose agents are late end, and what they held
        // serves the requests that follow.
        r.advance(RESUME_WINDOW.as_secs_f64() + 1.0);
        for _ in 0..STEPS_PER_RUN / 2 {
            r.step();
        }
        survivors = r.agents.iter().map(|(&j, a)| (j, a.user.clone())).collect();
        grants += r.grants;
        broken.append(&mut r.broken);
        now = r.now + Duration::from_secs(1);
        // The broker stops: the store and the trace are written out.
        drop(r);
    }
    (grants, resumed, broken)
}

#[test]
fn a_seeded_broker_run_with_restarts_replays_with_no_decision_differing() {
    let seed = std::env::var("RB_REPLAY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(29);
    eprintln!("RB_REPLAY_SEED={seed}");
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    let (grants, resumed, broken) = scenario(&state, seed);
    assert!(
        broken.is_empty(),
        "the front-end rule was broken: {broken:?}"
    );
    assert!(grants >= 20, "a scenario that grants: {grants}");
    assert!(resumed >= 1, "a scenario where an agent resumes its job");

    let trace = trace_dir(&state);
    let text: String = std::fs::read_dir(&trace)
        .expect("trace dir")
        .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("read trace"))
        .collect();
    for kind in [
        r#""kind":"agent_gone""#,
        r#""resume":"#,
        r#""module":true"#,
        r#""kind":"release_host""#,
        r#""kind":"force""#,
    ] {
        assert!(text.contains(kind), "the trace records {kind}");
    }

    let paper = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/paper.toml");
    let out = tests::rb(&[
        "policy",
        "replay",
        trace.to_str().expect("utf8"),
        "--policy",
        paper.to_str().expect("utf8"),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    eprintln!("grants {grants}, resumed {resumed}\n{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    let (n, rest) = last.split_once(" decisions, ").expect("a summary line");
    let n: usize = n.parse().expect("a count");
    assert!(n >= grants, "every grant compared: {last}");
    assert!(
        rest.starts_with("0 would differ under "),
        "seed {seed}: the same policy decides the same:\n{stdout}"
    );
}
