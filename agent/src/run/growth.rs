//! Module jobs (DESIGN.md flow 6, `modules/CONTRACT.md`): a symbolic `rsh` is recorded at
//! the broker and refused at once (phase 1); each grant runs `NAME-grow HOST` (phase 2);
//! a reclaim runs `NAME-shrink HOST` before the subagents' TERM/grace/KILL; the job's end
//! runs `NAME-halt`. Failures become notes in `rb jobs`, never the end of the job.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use proto::{agent::ShimReply, msg::FromBroker, msg::ToBroker};
use tokio::{sync::mpsc, time::Instant};
use tracing::{debug, info, warn};

use super::Agent;
use crate::{
    ancestry,
    jobenv::JobEnv,
    listeners::Event,
    module::{self, Action, Call, Outcome, Programs, Runner},
};

/// Calls for the same symbolic name within this window count once while the first is still
/// open (not yet grown): one `pvm> add anyLinux` makes a lookup (the master pvmd's) and two
/// shim calls within milliseconds (the start and the console's `rsh HOST 'echo YES'`
/// probe). Once `NAME-grow` has answered the request, the next call for that name is a new
/// request (a script adding hosts one at a time).
const REPEAT_WINDOW: Duration = Duration::from_secs(2);

/// Shortest time a shrink gets, even when the reclaim's grace is shorter.
const MIN_SHRINK_TIME: Duration = Duration::from_millis(100);

/// A module job's state in the agent.
pub(super) struct ModuleJob {
    programs: Arc<Programs>,
    runner: Runner,
    timeout: Duration,
    /// Phase-1 requests waiting at the broker: request id → symbolic name.
    pub(super) requests: HashMap<u64, String>,
    /// Recent phase-1 calls, for [`REPEAT_WINDOW`].
    recent: Vec<(String, Instant)>,
    /// Recent lookups of symbolic names that made a request: name, process, when. A shim
    /// call from that process or its descendants within [`REPEAT_WINDOW`] is part of the
    /// same request, even once `NAME-grow` has answered it (a quick grow program can).
    lookups: Vec<(String, u32, Instant)>,
    /// Grants whose `NAME-grow` runs: allocation → the symbolic name asked for.
    growing: HashMap<u64, String>,
    /// Hosts the job uses without holding them (reached by name through the shim, or found
    /// in its virtual machine by `NAME-grow`), as told to the broker (`hosts_in_use`).
    pub(super) in_use: BTreeSet<String>,
}

impl ModuleJob {
    /// Finds the module's programs and starts its runner.
    pub(super) fn start(
        name: &str,
        timeout: Duration,
        env: &JobEnv,
        events: mpsc::Sender<Event>,
    ) -> Self {
        let programs = Arc::new(module::find(name, &module::default_search_dirs()));
        let mut vars = env.vars.clone();
        match module::scratch_dir(&env.dir) {
            Ok(dir) => {
                vars.insert(module::ENV_MODULE_DIR.into(), dir.display().to_string());
            }
            Err(e) => warn!("module {name}: no private directory for its programs: {e:#}"),
        }
        if let Some(dir) = module::agent_bin_dir() {
            vars.insert(module::ENV_BIN_DIR.into(), dir.display().to_string());
        }
        let runner = module::spawn_runner(programs.clone(), vars, events, Event::ModuleDone);
        Self {
            programs,
            runner,
            timeout,
            requests: HashMap::new(),
            recent: Vec::new(),
            lookups: Vec::new(),
            growing: HashMap::new(),
            in_use: BTreeSet::new(),
        }
    }

    fn name(&self) -> &str {
        &self.programs.name
    }

    /// True when `symbolic` was asked for within [`REPEAT_WINDOW`]; records this call.
    fn repeated(&mut self, symbolic: &str, now: Instant) -> bool {
        self.recent
            .retain(|(_, at)| now.duration_since(*at) < REPEAT_WINDOW);
        let seen = self.recent.iter().any(|(s, _)| s == symbolic);
        if !seen {
            self.recent.push((symbolic.to_string(), now));
        }
        seen
    }

    /// Records a lookup of `symbolic` by process `pid`.
    fn looked_up(&mut self, symbolic: &str, pid: u32, now: Instant) {
        self.lookups
            .retain(|(_, _, at)| now.duration_since(*at) < REPEAT_WINDOW);
        self.lookups.push((symbolic.to_string(), pid, now));
    }

    /// True when a shim call for `symbolic` from `shim_pid` comes from a process that looked
    /// the name up within [`REPEAT_WINDOW`], or from one of its descendants.
    fn started_by_lookup(&self, symbolic: &str, shim_pid: u32, now: Instant) -> bool {
        self.lookups.iter().any(|(name, pid, at)| {
            name == symbolic
                && now.duration_since(*at) < REPEAT_WINDOW
                && ancestry::descends_from(shim_pid, *pid, ancestry::parent_of)
        })
    }
}

impl Agent {
    /// At job start: log where the programs are, note the missing ones.
    pub(super) async fn announce_module(&mut self) {
        let Some(m) = &self.module else { return };
        let programs = m.programs.clone();
        for action in [Action::Grow, Action::Shrink, Action::Halt] {
            match programs.program(action) {
                Some(p) => {
                    info!(module = %programs.name, action = action.name(), path = %p.display(), "module program")
                }
                None => self.note(programs.missing(action)).await,
            }
        }
    }

    /// Phase 1: record the request at the broker and refuse the shim at once.
    pub(super) async fn phase_one(
        &mut self,
        symbolic: String,
        shim_pid: u32,
        reply: mpsc::Sender<ShimReply>,
    ) {
        let Some(m) = self.module.as_ref() else {
            return;
        };
        let message = match m.programs.grow {
            None => m.programs.missing(Action::Grow),
            Some(_) => format!(
                "request recorded; the {} module will add the host when one is granted",
                m.name()
            ),
        };
        // Ancestry first: once refused, the shim exits and its caller reaps it, and a
        // process that is gone descends from nobody (the rsh would count as a new request).
        let joins = m.started_by_lookup(&symbolic, shim_pid, Instant::now());
        let _ = reply.send(ShimReply::Refused { message }).await;
        if joins {
            return debug!(%symbolic, shim_pid, "phase 1: the rsh of a lookup's request");
        }
        self.record_request(symbolic, shim_pid, "rsh").await;
    }

    /// A job process looked a symbolic name up: in a module job, phase 1 starts now, before
    /// the program's `rsh` (`proto::agent`, `resolved`), which then joins this request.
    pub(super) async fn resolved(&mut self, symbolic: String, pid: u32) {
        let Some(m) = self.module.as_mut() else {
            return debug!(%symbolic, pid, "a lookup of a symbolic name; not a module job");
        };
        m.looked_up(&symbolic, pid, Instant::now());
        self.record_request(symbolic, pid, "lookup").await;
    }

    /// Records a phase-1 request for `symbolic` at the broker, unless one is open already
    /// ([`REPEAT_WINDOW`]) or the module cannot grow.
    async fn record_request(&mut self, symbolic: String, pid: u32, by: &str) {
        let Some(m) = self.module.as_mut() else {
            return;
        };
        if m.programs.grow.is_none() {
            return;
        }
        if m.repeated(&symbolic, Instant::now()) {
            debug!(%symbolic, pid, by, "phase 1: part of the open request; ignored");
            return;
        }
        let req = self.next_req;
        self.next_req += 1;
        m.requests.insert(req, symbolic.clone());
        info!(req, %symbolic, pid, by, "phase 1: request recorded");
        self.tell_broker(ToBroker::Allocate { req, symbolic }).await;
    }

    /// Phase 2 for a granted host: `NAME-grow HOST`. True when `req` was a module request.
    pub(super) fn phase_two(&mut self, req: u64, alloc: u64, host: &str, address: &str) -> bool {
        let Some(m) = self.module.as_mut() else {
            return false;
        };
        let Some(symbolic) = m.requests.remove(&req) else {
            return false;
        };
        m.growing.insert(alloc, symbolic);
        m.runner.submit(Call {
            action: Action::Grow,
            host: Some((host.to_string(), address.to_string())),
            alloc: Some(alloc),
            timeout: m.timeout,
        });
        true
    }

    /// A refused module request: a note (no shim is waiting). True when it was one.
    pub(super) async fn module_refused(&mut self, req: u64, message: &str) -> bool {
        let Some(m) = self.module.as_mut() else {
            return false;
        };
        let Some(symbolic) = m.requests.remove(&req) else {
            return false;
        };
        self.note(format!("{symbolic}: {message}")).await;
        true
    }

    /// Reclaim of a module job's host: `NAME-shrink HOST` first, by the deadline.
    /// False when this is not a module job (the caller ends the subagents itself).
    pub(super) fn module_shrink(&mut self, alloc: u64, grace_ms: u64) -> bool {
        let Some(m) = self.module.as_ref() else {
            return false;
        };
        let Some(a) = self.allocs.get_mut(&alloc) else {
            return false;
        };
        let grace = Duration::from_millis(grace_ms);
        a.reclaiming = true;
        a.deadline = Some(Instant::now() + grace);
        m.runner.submit(Call {
            action: Action::Shrink,
            host: Some((a.host.clone(), a.address.clone())),
            alloc: Some(alloc),
            timeout: grace.max(MIN_SHRINK_TIME),
        });
        true
    }

    /// The shim passed a call to `host` through: a module job uses that host by name now,
    /// so the broker must never grant it to the job (PVM and LAM refuse a host twice).
    pub(super) async fn named(&mut self, host: String) {
        let ours = self
            .allocs
            .values()
            .any(|a| a.host == host || a.address == host);
        let Some(m) = self.module.as_mut() else {
            return;
        };
        if ours || !m.in_use.insert(host.clone()) {
            return;
        }
        info!(%host, "the job reaches a host by name; telling the broker it is in use");
        self.tell_broker(ToBroker::HostsInUse { hosts: vec![host] })
            .await;
    }

    /// A module program finished.
    pub(super) async fn module_done(&mut self, outcome: Outcome) {
        let Some(m) = &self.module else { return };
        module::log_outcome(&outcome, m.name());
        let already = outcome.already_there();
        if let (Err(e), false) = (&outcome.result, already) {
            self.note(e.clone()).await;
        }
        let Some(alloc) = outcome.call.alloc else {
            return;
        };
        if already {
            return self.grant_already_there(alloc).await;
        }
        if outcome.call.action == Action::Grow {
            self.grow_done(alloc);
        }
        match outcome.call.action {
            Action::Grow if outcome.result.is_err() => self.drop_if_idle(alloc).await,
            Action::Grow => {}
            Action::Shrink => self.after_shrink(alloc).await,
            Action::Halt => {}
        }
    }

    /// The request behind `alloc` is answered (grown, or failed for good): a new request
    /// for the same name is a new one, not a retry.
    fn grow_done(&mut self, alloc: u64) {
        let Some(m) = self.module.as_mut() else {
            return;
        };
        if let Some(symbolic) = m.growing.remove(&alloc) {
            m.recent.retain(|(s, _)| s != &symbolic);
        }
    }

    /// `NAME-grow` found the granted host in the job's virtual machine already (the job
    /// added it by name where the agent could not see it): the broker learns the host is in
    /// use, the host goes back, and the request is asked again (served elsewhere); a note
    /// in `rb jobs` says so.
    async fn grant_already_there(&mut self, alloc: u64) {
        let symbolic = self
            .module
            .as_mut()
            .and_then(|m| m.growing.get(&alloc).cloned());
        self.grow_done(alloc);
        let Some(host) = self.allocs.get(&alloc).map(|a| a.host.clone()) else {
            return;
        };
        let again = match &symbolic {
            Some(s) => format!("; asking again for {s}"),
            None => String::new(),
        };
        let name = self.module.as_ref().map_or("", |m| m.name()).to_string();
        self.note(format!(
            "{name}-grow {host}: {host} is in the job's virtual machine already; \
             giving it back{again}"
        ))
        .await;
        if let Some(m) = self.module.as_mut() {
            m.in_use.insert(host.clone());
        }
        self.tell_broker(ToBroker::HostsInUse { hosts: vec![host] })
            .await;
        self.drop_if_idle(alloc).await;
        if let Some(symbolic) = symbolic {
            self.record_request(symbolic, std::process::id(), "already there")
                .await;
        }
    }

    /// A host the job did not take (grow failed): back to the broker unless in use.
    async fn drop_if_idle(&mut self, alloc: u64) {
        let Some(a) = self.allocs.get(&alloc) else {
            return;
        };
        if !a.subs.is_empty() {
            return;
        }
        let reclaiming = a.reclaiming;
        self.allocs.remove(&alloc);
        self.write_hosts();
        let msg = match reclaiming {
            true => ToBroker::Released { alloc },
            false => ToBroker::GiveBack { alloc },
        };
        self.tell_broker(msg).await;
    }

    /// After `NAME-shrink`: released if nothing is left there, else the subagents end what
    /// is left within what remains of the grace period.
    async fn after_shrink(&mut self, alloc: u64) {
        let Some(a) = self.allocs.get(&alloc) else {
            return;
        };
        if a.subs.is_empty() {
            self.allocs.remove(&alloc);
            self.write_hosts();
            return self.tell_broker(ToBroker::Released { alloc }).await;
        }
        let left = a.deadline.map_or(Duration::ZERO, |d| {
            d.saturating_duration_since(Instant::now())
        });
        for tx in a.subs.values() {
            let _ = tx
                .send(FromBroker::Terminate {
                    grace_ms: left.as_millis() as u64,
                })
                .await;
        }
    }

    /// Job end: drop queued grows/shrinks, run `NAME-halt` and wait for it (subagents that
    /// end meanwhile are noted).
    pub(super) async fn module_halt(&mut self, events: &mut mpsc::Receiver<Event>) {
        let Some(m) = &self.module else { return };
        m.runner.skip_queued();
        m.runner.submit(Call {
            action: Action::Halt,
            host: None,
            alloc: None,
            timeout: m.timeout,
        });
        let limit = m.timeout + Duration::from_secs(3);
        let deadline = Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(Event::ModuleDone(outcome))) => {
                    let halted = outcome.call.action == Action::Halt;
                    if let Some(m) = &self.module {
                        module::log_outcome(&outcome, m.name());
                    }
                    if let Err(e) = &outcome.result {
                        if !e.starts_with("skipped") {
                            self.note(e.clone()).await;
                        }
                    }
                    if halted {
                        return;
                    }
                }
                Ok(Some(Event::SubGone { alloc, sub })) => {
                    if let Some(a) = self.allocs.get_mut(&alloc) {
                        a.subs.remove(&sub);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    return warn!("the module's halt did not report back in time");
                }
            }
        }
    }

    /// Something people should see: the agent log and `rb jobs`.
    pub(super) async fn note(&mut self, text: String) {
        warn!("{text}");
        self.tell_broker(ToBroker::JobNote { text }).await;
    }
}
