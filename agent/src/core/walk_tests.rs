//! A seeded random walk over the agent core, as the broker's allocation core has: random
//! shims, grants, refusals, subagents, reclaims, launcher ends, timers and broker losses,
//! then the app's exit with late subagents, launchers ending, broker losses and the broker's
//! `job_ended`; after every step the outputs are checked against a model of what the peers
//! saw.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use proto::{
    agent::ShimReply,
    msg::{FromBroker, ToBroker},
};

use super::module_calls::{Action, Outcome, Programs};
use super::*;

/// xorshift64*: small, seeded, enough for a walk.
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

    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.below(items.len())])
    }
}

/// What the peers of the core saw, and the shell's pending work.
#[derive(Default)]
struct World {
    /// Shims connected and not answered for good.
    shims: BTreeSet<ShimId>,
    /// Shims whose connection closed or that got their last answer.
    done_shims: BTreeSet<ShimId>,
    /// Requests at the broker not answered, cancelled or granted: id → name.
    requests: BTreeMap<ReqId, String>,
    /// Allocations granted and not given back or released: id → host.
    granted: BTreeMap<AllocId, String>,
    /// Allocations given back or released.
    returned: BTreeSet<AllocId>,
    /// Subagents attached: id → allocation.
    subs: BTreeMap<SubId, AllocId>,
    /// The hosts file as last written.
    hosts_file: Vec<(String, String, AllocId)>,
    timers: Vec<(Instant, Timer)>,
    module_calls: Vec<Call>,
    exit: Option<i32>,
    end_jobs: usize,
    /// Launchers watched and not yet ended: (allocation, pid).
    launchers: BTreeSet<(AllocId, u32)>,
    /// When the app exited.
    app_exited: Option<Instant>,
    /// Subagents that attached after the app exited, and those told to end.
    late_subs: BTreeSet<SubId>,
    terminated: BTreeSet<SubId>,
    /// `end_job` told since the broker was last lost.
    told_end: bool,
    /// The JEL pool's view: hosts granted and not released (a host per allocation), the
    /// hosts it was told are reclaimed, whether it was terminated.
    pool_hosts: Vec<String>,
    pool_vacating: BTreeSet<String>,
    pool_terminated: bool,
}

struct Walk {
    core: AgentCore,
    now: Instant,
    rng: Rng,
    world: World,
    next_id: u64,
}

impl Walk {
    fn new(seed: u64, module: bool) -> Self {
        let programs = Programs {
            name: "w".into(),
            grow: Some(PathBuf::from("/m/w-grow")),
            shrink: Some(PathBuf::from("/m/w-shrink")),
            halt: Some(PathBuf::from("/m/w-halt")),
            searched: vec![],
        };
        let cfg = CoreConfig {
            grace_ms: 1000,
            grant: GrantTemplate {
                subagent_program: PathBuf::from("rb-subagent"),
                sub_addr: "127.0.0.1:1".into(),
                secret_file: PathBuf::from("secret"),
                preload: None,
                lab_mark: None,
                remote_shell: vec!["rsh".into()],
                step_times: None,
            },
            module: module.then_some(ModuleConfig {
                programs,
                timeout: Duration::from_secs(2),
            }),
            agent_pid: 1,
        };
        Self {
            core: AgentCore::new(cfg),
            now: Instant::now(),
            rng: Rng(seed),
            world: World::default(),
            next_id: 1,
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Feeds `input`, performs the outputs as a shell would (answering feedback at once),
    /// and checks them.
    fn feed(&mut self, input: Input) {
        let mut queue: std::collections::VecDeque<Output> =
            self.core.handle(input, self.now).into();
        while let Some(output) = queue.pop_front() {
            if let Some(feedback) = self.perform(output) {
                for o in self.core.handle(feedback, self.now).into_iter().rev() {
                    queue.push_front(o);
                }
            }
        }
        assert!(self.core.offers.is_empty(), "every offer answered");
        self.check();
    }

    fn perform(&mut self, output: Output) -> Option<Input> {
        let w = &mut self.world;
        assert!(w.exit.is_none(), "{output:?} after the exit");
        match output {
            Output::ToBroker(msg) => self.broker_got(msg),
            Output::ReplyShim { shim, reply } => {
                assert!(
                    w.shims.contains(&shim),
                    "answer to shim {shim} gone: {reply:?}"
                );
                if !matches!(reply, ShimReply::Queued { .. }) {
                    w.shims.remove(&shim);
                    w.done_shims.insert(shim);
                }
            }
            Output::Offer { alloc, shims, .. } => {
                let mut reached = false;
                for shim in shims {
                    assert!(!w.done_shims.contains(&shim), "offer to shim {shim} gone");
                    reached |= w.shims.remove(&shim);
                    w.done_shims.insert(shim);
                }
                let reached = reached && self.rng.below(4) > 0;
                return Some(Input::Offered { alloc, reached });
            }
            Output::CloseShim { shim } => {
                w.shims.remove(&shim);
                w.done_shims.insert(shim);
            }
            Output::ToSub { sub, msg } => {
                assert!(w.subs.contains_key(&sub), "to gone sub {sub}");
                let is_terminate = matches!(msg, FromBroker::Terminate { .. });
                if let (true, None, Some(host)) =
                    (is_terminate, w.app_exited, w.granted.get(&w.subs[&sub]))
                {
                    assert!(
                        w.pool_vacating.contains(host),
                        "subagent {sub} on {host} told to end before the pool's vacate"
                    );
                }
                if is_terminate {
                    w.terminated.insert(sub);
                }
            }
            Output::CloseSub { sub } => drop(w.subs.remove(&sub)),
            Output::RunModule(call) => {
                if let (Action::Shrink, Some((host, _))) = (call.action, &call.host) {
                    assert!(w.pool_vacating.contains(host), "shrink before vacate");
                }
                w.module_calls.push(call)
            }
            Output::SkipQueuedModuleCalls => {
                w.module_calls.retain(|c| c.action == Action::Halt);
            }
            Output::WatchLauncher { alloc, pid } => drop(w.launchers.insert((alloc, pid))),
            Output::Signal(_) => {}
            Output::SetTimer { timer, at } => w.timers.push((at, timer)),
            Output::WriteHosts(hosts) => w.hosts_file = hosts,
            Output::Reconnect { until } => {
                assert!(until > self.now);
                return Some(Input::BrokerBack);
            }
            Output::Pool(event) => Self::pool_got(w, event),
            Output::Exit { status } => {
                assert!(w.pool_terminated, "exit before the pool's terminate");
                w.exit = Some(status)
            }
        }
        None
    }

    /// The pool is told of hosts the job holds only, a reclaim once per host, and its end
    /// once, last.
    fn pool_got(w: &mut World, event: PoolEvent) {
        assert!(!w.pool_terminated, "{event:?} after the pool's terminate");
        match event {
            PoolEvent::HostGranted { host } => w.pool_hosts.push(host),
            PoolEvent::Reclaim { host, .. } => {
                assert!(
                    w.pool_hosts.contains(&host),
                    "reclaim of {host} not granted"
                );
                assert!(w.pool_vacating.insert(host), "a second vacate");
            }
            PoolEvent::HostReleased { host } => {
                let at = w.pool_hosts.iter().position(|h| *h == host);
                let at = at.unwrap_or_else(|| panic!("release of {host} not granted"));
                w.pool_hosts.remove(at);
                w.pool_vacating.remove(&host);
            }
            PoolEvent::LinkLost { host, .. } => {
                assert!(w.pool_hosts.contains(&host), "link lost on {host} not held");
            }
            PoolEvent::Terminate => w.pool_terminated = true,
        }
    }

    fn broker_got(&mut self, msg: ToBroker) {
        let w = &mut self.world;
        match msg {
            ToBroker::Allocate { req, symbolic } => {
                assert_eq!(w.end_jobs, 0, "request {req} after end_job");
                w.requests.insert(req, symbolic);
            }
            ToBroker::Cancel { req } => {
                assert!(w.requests.remove(&req).is_some(), "cancel of unknown {req}")
            }
            ToBroker::GiveBack { alloc } | ToBroker::Released { alloc } => {
                assert!(w.returned.insert(alloc), "alloc {alloc} returned twice");
                w.granted.remove(&alloc);
            }
            ToBroker::EndJob { .. } => {
                let exited = w.app_exited.expect("end_job before the app's exit");
                // Launchers of hosts given back no longer hold the job (the broker has them).
                let running: Vec<_> = w
                    .launchers
                    .iter()
                    .filter(|(alloc, _)| w.granted.contains_key(alloc))
                    .collect();
                let drained = w.subs.is_empty() && running.is_empty();
                // The first: told again after a loss, subagents attached late may still end.
                assert!(
                    w.end_jobs > 0 || drained || self.now >= exited + end::END_WAIT,
                    "end_job while subagents {:?} or launchers {:?} run",
                    w.subs,
                    running
                );
                w.end_jobs += 1;
                w.told_end = true;
            }
            _ => {}
        }
    }

    /// The hosts file lists exactly the allocations the core holds, every one of which the
    /// broker granted and was not told back; the core's own invariants hold.
    fn check(&self) {
        let mut pool_hosts = self.world.pool_hosts.clone();
        pool_hosts.sort();
        let mut held_hosts: Vec<String> = self.world.granted.values().cloned().collect();
        held_hosts.sort();
        assert_eq!(pool_hosts, held_hosts, "the pool's hosts are the job's");
        let held: Vec<AllocId> = self.core.allocs.keys().copied().collect();
        let listed: Vec<AllocId> = self.world.hosts_file.iter().map(|h| h.2).collect();
        assert_eq!(held, listed, "hosts file");
        for alloc in &held {
            assert!(
                self.world.granted.contains_key(alloc),
                "alloc {alloc} not granted"
            );
        }
        for a in self.core.allocs.values() {
            assert!(a.subs.is_empty() || a.used, "subagents on an unused host");
            assert!(
                a.deadline.is_none() || a.reclaiming,
                "a deadline without a reclaim"
            );
        }
    }

    fn step(&mut self) {
        let reqs: Vec<ReqId> = self.world.requests.keys().copied().collect();
        let allocs: Vec<AllocId> = self.world.granted.keys().copied().collect();
        let shims: Vec<ShimId> = self.world.shims.iter().copied().collect();
        let subs: Vec<(SubId, AllocId)> = self.world.subs.iter().map(|(s, a)| (*s, *a)).collect();
        match self.rng.below(12) {
            0 | 1 => {
                let shim = self.id();
                let symbolic = ["anyLinux", "anyLinux-1", "anyHost-2"][self.rng.below(3)];
                self.world.shims.insert(shim);
                let pid = shim as u32;
                self.feed(Input::ShimAllocate {
                    shim,
                    symbolic: symbolic.into(),
                    pid,
                    lineage: vec![pid],
                });
            }
            2 => {
                if let Some(shim) = self.rng.pick(&shims) {
                    self.world.shims.remove(&shim);
                    self.world.done_shims.insert(shim);
                    self.feed(Input::ShimGone { shim });
                }
            }
            3 | 4 => {
                if let Some(req) = self.rng.pick(&reqs) {
                    let symbolic = self.world.requests.remove(&req).unwrap_or_default();
                    let alloc = self.id();
                    let host = format!("node{alloc}");
                    self.world.granted.insert(alloc, host.clone());
                    let instance = crate::instances::key(&symbolic).map(|_| 1);
                    self.feed(Input::Broker(FromBroker::Granted {
                        req,
                        alloc,
                        address: host.clone(),
                        host,
                        instance,
                    }));
                }
            }
            5 => {
                if let Some(req) = self.rng.pick(&reqs) {
                    self.world.requests.remove(&req);
                    let message = "no".into();
                    self.feed(Input::Broker(FromBroker::Refused { req, message }));
                }
            }
            6 => {
                if let Some(alloc) = self.rng.pick(&allocs) {
                    let sub = self.id();
                    self.world.subs.insert(sub, alloc);
                    self.feed(Input::SubConnected { alloc, sub });
                }
            }
            7 => {
                if let Some((sub, alloc)) = self.rng.pick(&subs) {
                    self.world.subs.remove(&sub);
                    self.feed(Input::SubGone { alloc, sub });
                }
            }
            8 => {
                if let Some(alloc) = self.rng.pick(&allocs) {
                    let host = self.world.granted[&alloc].clone();
                    let grace_ms = 500;
                    self.feed(Input::Broker(FromBroker::Reclaim {
                        alloc,
                        host,
                        grace_ms,
                    }));
                }
            }
            9 => self.launcher_exits(),
            10 => self.finish_module_call(),
            _ => self.pass_time(Duration::from_millis(700)),
        }
    }

    /// One of the launchers watched ends.
    fn launcher_exits(&mut self) {
        let launchers: Vec<(AllocId, u32)> = self.world.launchers.iter().copied().collect();
        if let Some((alloc, pid)) = self.rng.pick(&launchers) {
            self.world.launchers.remove(&(alloc, pid));
            self.feed(Input::LauncherExited { alloc, pid });
        }
    }

    fn finish_module_call(&mut self) {
        if self.world.module_calls.is_empty() {
            return self.feed(Input::BrokerLost);
        }
        let call = self.world.module_calls.remove(0);
        let code = [Some(0), Some(1), Some(6)][self.rng.below(3)];
        let result = if code == Some(0) {
            Ok(())
        } else {
            Err("failed".into())
        };
        let elapsed = Duration::ZERO;
        self.feed(Input::ModuleDone(Outcome {
            call,
            result,
            elapsed,
            code,
            said: Vec::new(),
        }));
    }

    /// Time passes by `d`: due timers fire, in order.
    fn pass_time(&mut self, d: Duration) {
        self.now += d;
        self.world.timers.sort();
        while self
            .world
            .timers
            .first()
            .is_some_and(|(at, _)| *at <= self.now)
        {
            let (_, timer) = self.world.timers.remove(0);
            self.feed(Input::Timer(timer));
        }
    }

    /// The app ends; subagents leave and attach late, launchers end, the broker is lost or
    /// confirms now and then; the job must end within its waits, the broker told (again
    /// after each loss) unless the confirmation window passed.
    fn end(&mut self) {
        self.world.app_exited = Some(self.now);
        self.feed(Input::AppExited { status: 7 });
        for _ in 0..200 {
            if self.world.exit.is_some() {
                break;
            }
            match self.rng.below(7) {
                0 => {
                    let subs: Vec<(SubId, AllocId)> =
                        self.world.subs.iter().map(|(s, a)| (*s, *a)).collect();
                    if let Some((sub, alloc)) = self.rng.pick(&subs) {
                        self.world.subs.remove(&sub);
                        self.feed(Input::SubGone { alloc, sub });
                    }
                }
                1 => self.finish_module_call(),
                2 => self.launcher_exits(),
                3 => self.late_sub(),
                4 if self.world.told_end && self.rng.below(3) == 0 => {
                    self.feed(Input::Broker(FromBroker::JobEnded { job: 1 }));
                    assert_eq!(self.world.exit, Some(7), "exit on job_ended");
                }
                5 if self.rng.below(4) == 0 => {
                    self.world.told_end = false;
                    let before = self.world.end_jobs;
                    self.feed(Input::BrokerLost);
                    if before > 0 {
                        assert_eq!(self.world.end_jobs, before + 1, "end_job told again");
                    }
                }
                _ => self.pass_time(Duration::from_secs(1)),
            }
        }
        assert_eq!(self.world.exit, Some(7), "the job ended");
        assert!(self.world.end_jobs >= 1, "end_job told");
        for sub in &self.world.late_subs {
            assert!(
                self.world.terminated.contains(sub),
                "late sub {sub} not ended"
            );
        }
    }

    /// A subagent attaches while the job ends: it must be told to end.
    fn late_sub(&mut self) {
        let allocs: Vec<AllocId> = self.world.granted.keys().copied().collect();
        if let Some(alloc) = self.rng.pick(&allocs) {
            let sub = self.id();
            self.world.subs.insert(sub, alloc);
            if !matches!(self.core.phase(), Phase::Halting { .. }) {
                // While halting it is told with the others when the drain starts.
                self.world.late_subs.insert(sub);
            }
            self.feed(Input::SubConnected { alloc, sub });
        }
    }
}

#[test]
fn random_walks_keep_the_hosts_file_the_broker_and_the_shims_consistent() {
    for seed in 1..=200u64 {
        for module in [false, true] {
            let mut walk = Walk::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, module);
            walk.feed(Input::Started);
            for _ in 0..150 {
                walk.step();
            }
            walk.end();
        }
    }
}
