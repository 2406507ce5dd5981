//! Module jobs (DESIGN.md flow 6, `modules/CONTRACT.md`): a symbolic `rsh` is recorded at
//! the broker and refused at once (phase 1); each grant runs `NAME-grow HOST` (phase 2);
//! a reclaim runs `NAME-shrink HOST` before the subagents' TERM/grace/KILL; the job's end
//! runs `NAME-halt`. Failures become notes in `rb jobs`, never the end of the job.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use proto::{agent::ShimReply, msg::FromBroker, msg::ToBroker};
use tracing::{debug, info};

use super::module_calls::{self, in_lineage, Action, Call, Outcome};
use super::{AgentCore, AllocId, ModuleConfig, Out, Output, PoolEvent, ReqId, ShimId};

/// Calls for the same symbolic name within this window count once while the first is still
/// open (not yet grown): one `pvm> add anyLinux` makes a lookup (the master pvmd's) and two
/// shim calls within milliseconds (the start and the console's `rsh HOST 'echo YES'`
/// probe). Once `NAME-grow` has answered the request, the next call for that name is a new
/// request (a script adding hosts one at a time).
pub(super) const REPEAT_WINDOW: Duration = Duration::from_secs(2);

/// Shortest time a shrink gets, even when the reclaim's grace is shorter.
pub(super) const MIN_SHRINK_TIME: Duration = Duration::from_millis(100);

/// A module job's state in the agent.
#[derive(Debug)]
pub(super) struct ModuleJob {
    cfg: ModuleConfig,
    /// Phase-1 requests waiting at the broker: request id → symbolic name.
    pub(super) requests: BTreeMap<ReqId, String>,
    /// Recent phase-1 calls, for [`REPEAT_WINDOW`].
    recent: Vec<(String, Instant)>,
    /// Recent lookups of symbolic names that made a request: name, process, when. A shim
    /// call from that process or its descendants within [`REPEAT_WINDOW`] is part of the
    /// same request, even once `NAME-grow` has answered it (a quick grow program can).
    lookups: Vec<(String, u32, Instant)>,
    /// Grants whose `NAME-grow` runs: allocation → the symbolic name asked for.
    growing: HashMap<AllocId, String>,
    /// Hosts the job uses without holding them (reached by name through the shim, or found
    /// in its virtual machine by `NAME-grow`), as told to the broker (`hosts_in_use`).
    pub(super) in_use: BTreeSet<String>,
}

impl ModuleJob {
    pub(super) fn new(cfg: ModuleConfig) -> Self {
        Self {
            cfg,
            requests: BTreeMap::new(),
            recent: Vec::new(),
            lookups: Vec::new(),
            growing: HashMap::new(),
            in_use: BTreeSet::new(),
        }
    }

    pub(super) fn name(&self) -> &str {
        &self.cfg.programs.name
    }

    pub(super) fn timeout(&self) -> Duration {
        self.cfg.timeout
    }

    /// True when `symbolic` was asked for within [`REPEAT_WINDOW`]; records this call.
    fn repeated(&mut self, symbolic: &str, now: Instant) -> bool {
        self.recent
            .retain(|(_, at)| now.saturating_duration_since(*at) < REPEAT_WINDOW);
        let seen = self.recent.iter().any(|(s, _)| s == symbolic);
        if !seen {
            self.recent.push((symbolic.to_string(), now));
        }
        seen
    }

    /// Records a lookup of `symbolic` by process `pid`.
    fn looked_up(&mut self, symbolic: &str, pid: u32, now: Instant) {
        self.lookups
            .retain(|(_, _, at)| now.saturating_duration_since(*at) < REPEAT_WINDOW);
        self.lookups.push((symbolic.to_string(), pid, now));
    }

    /// True when a shim call for `symbolic` whose lineage (the shim and its ancestors) is
    /// `lineage` comes from a process that looked the name up within [`REPEAT_WINDOW`].
    fn started_by_lookup(&self, symbolic: &str, lineage: &[u32], now: Instant) -> bool {
        self.lookups.iter().any(|(name, pid, at)| {
            name == symbolic
                && now.saturating_duration_since(*at) < REPEAT_WINDOW
                && in_lineage(lineage, *pid)
        })
    }
}

impl AgentCore {
    /// At job start: log where the programs are, note the missing ones.
    pub(super) fn announce_module(&self, out: &mut Out) {
        let Some(m) = &self.module else { return };
        let programs = &m.cfg.programs;
        for action in [Action::Grow, Action::Shrink, Action::Halt] {
            match programs.program(action) {
                Some(p) => {
                    info!(module = %programs.name, action = action.name(), path = %p.display(), "module program")
                }
                None => self.note(programs.missing(action), out),
            }
        }
    }

    /// Phase 1: record the request at the broker and refuse the shim at once.
    pub(super) fn phase_one(
        &mut self,
        shim: ShimId,
        symbolic: String,
        shim_pid: u32,
        lineage: &[u32],
        now: Instant,
        out: &mut Out,
    ) {
        let Some(m) = self.module.as_ref() else {
            return;
        };
        let message = match m.cfg.programs.grow {
            None => m.cfg.programs.missing(Action::Grow),
            // The caller (lamgrow, PVM's pvmd) prints its own failure around this line;
            // the line says that failure is expected, and what follows.
            Some(_) => format!(
                "request recorded; the {} module adds the host granted for it in a moment \
                 (the failure reported for this name is expected)",
                m.name()
            ),
        };
        let joins = m.started_by_lookup(&symbolic, lineage, now);
        let reply = ShimReply::Refused { message };
        out.push(Output::ReplyShim { shim, reply });
        if joins {
            return debug!(%symbolic, shim_pid, "phase 1: the rsh of a lookup's request");
        }
        self.record_request(symbolic, shim_pid, "rsh", now, out);
    }

    /// A job process looked a symbolic name up: in a module job, phase 1 starts now, before
    /// the program's `rsh` (`proto::agent`, `resolved`), which then joins this request.
    pub(super) fn resolved(&mut self, symbolic: String, pid: u32, now: Instant, out: &mut Out) {
        let Some(m) = self.module.as_mut() else {
            return debug!(%symbolic, pid, "a lookup of a symbolic name; not a module job");
        };
        m.looked_up(&symbolic, pid, now);
        self.record_request(symbolic, pid, "lookup", now, out);
    }

    /// Records a phase-1 request for `symbolic` at the broker, unless one is open already
    /// ([`REPEAT_WINDOW`]) or the module cannot grow.
    fn record_request(
        &mut self,
        symbolic: String,
        pid: u32,
        by: &str,
        now: Instant,
        out: &mut Out,
    ) {
        let Some(m) = self.module.as_mut() else {
            return;
        };
        if m.cfg.programs.grow.is_none() {
            return;
        }
        if m.repeated(&symbolic, now) {
            debug!(%symbolic, pid, by, "phase 1: part of the open request; ignored");
            return;
        }
        let req = self.new_request();
        if let Some(m) = self.module.as_mut() {
            m.requests.insert(req, symbolic.clone());
        }
        info!(req, %symbolic, pid, by, "phase 1: request recorded");
        self.tell_broker(ToBroker::Allocate { req, symbolic }, out);
    }

    /// Phase 2 for a granted host: `NAME-grow HOST`. True when `req` was a module request.
    pub(super) fn phase_two(
        &mut self,
        req: ReqId,
        alloc: AllocId,
        host: &str,
        address: &str,
        out: &mut Out,
    ) -> bool {
        let Some(m) = self.module.as_mut() else {
            return false;
        };
        let Some(symbolic) = m.requests.remove(&req) else {
            return false;
        };
        m.growing.insert(alloc, symbolic);
        out.push(Output::RunModule(Call {
            action: Action::Grow,
            host: Some((host.to_string(), address.to_string())),
            alloc: Some(alloc),
            timeout: m.timeout(),
        }));
        true
    }

    /// A refused module request: a note (no shim is waiting). True when it was one.
    pub(super) fn module_refused(&mut self, req: ReqId, message: &str, out: &mut Out) -> bool {
        let Some(m) = self.module.as_mut() else {
            return false;
        };
        let Some(symbolic) = m.requests.remove(&req) else {
            return false;
        };
        self.note(format!("{symbolic}: {message}"), out);
        true
    }

    /// Reclaim of a module job's host: `NAME-shrink HOST` first, by the deadline.
    /// False when this is not a module job (the caller ends the subagents itself).
    pub(super) fn module_shrink(
        &mut self,
        alloc: AllocId,
        grace_ms: u64,
        now: Instant,
        out: &mut Out,
    ) -> bool {
        if self.module.is_none() {
            return false;
        }
        let Some(a) = self.allocs.get_mut(&alloc) else {
            return false;
        };
        let grace = Duration::from_millis(grace_ms);
        // `vacate` (once) before `NAME-shrink` (and the subagents after it) end anything.
        if !a.reclaiming {
            let (host, deadline) = (a.host.clone(), now + grace);
            out.push(Output::Pool(PoolEvent::Reclaim { host, deadline }));
        }
        a.reclaiming = true;
        a.deadline = Some(now + grace);
        out.push(Output::RunModule(Call {
            action: Action::Shrink,
            host: Some((a.host.clone(), a.address.clone())),
            alloc: Some(alloc),
            timeout: grace.max(MIN_SHRINK_TIME),
        }));
        true
    }

    /// The shim passed a call to `host` through: a module job uses that host by name now,
    /// so the broker must never grant it to the job (PVM and LAM refuse a host twice).
    pub(super) fn named(&mut self, host: String, out: &mut Out) {
        let ours = self.holds(&host);
        let Some(m) = self.module.as_mut() else {
            return;
        };
        if ours || !m.in_use.insert(host.clone()) {
            return;
        }
        info!(%host, "the job reaches a host by name; telling the broker it is in use");
        self.tell_broker(ToBroker::HostsInUse { hosts: vec![host] }, out);
    }

    /// A module program finished while the job runs.
    pub(super) fn module_done(&mut self, outcome: Outcome, now: Instant, out: &mut Out) {
        let Some(m) = &self.module else { return };
        module_calls::log_outcome(&outcome, m.name());
        self.pass_on_what_it_said(&outcome, out);
        let already = outcome.already_there();
        if let (Err(e), false) = (&outcome.result, already) {
            self.note(e.clone(), out);
        }
        let Some(alloc) = outcome.call.alloc else {
            return;
        };
        if already {
            return self.grant_already_there(alloc, now, out);
        }
        if outcome.call.action == Action::Grow {
            self.grow_done(alloc);
        }
        match outcome.call.action {
            Action::Grow if outcome.result.is_err() => self.drop_if_idle(alloc, out),
            Action::Grow => {}
            Action::Shrink => self.after_shrink(alloc, now, out),
            Action::Halt => {}
        }
    }

    /// The request behind `alloc` is answered (grown, or failed for good): a new request
    /// for the same name is a new one, not a retry.
    fn grow_done(&mut self, alloc: AllocId) {
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
    fn grant_already_there(&mut self, alloc: AllocId, now: Instant, out: &mut Out) {
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
        let text = format!(
            "{name}-grow {host}: {host} is in the job's virtual machine already; \
             giving it back{again}"
        );
        self.note(text, out);
        if let Some(m) = self.module.as_mut() {
            m.in_use.insert(host.clone());
        }
        self.tell_broker(ToBroker::HostsInUse { hosts: vec![host] }, out);
        self.drop_if_idle(alloc, out);
        if let Some(symbolic) = symbolic {
            let pid = self.cfg.agent_pid;
            self.record_request(symbolic, pid, "already there", now, out);
        }
    }

    /// A host the job did not take (grow failed): back to the broker unless in use.
    fn drop_if_idle(&mut self, alloc: AllocId, out: &mut Out) {
        let Some(a) = self.allocs.get(&alloc) else {
            return;
        };
        if !a.subs.is_empty() {
            return;
        }
        let reclaiming = a.reclaiming;
        self.remove_alloc(alloc, out);
        self.write_hosts(out);
        let msg = match reclaiming {
            true => ToBroker::Released { alloc },
            false => ToBroker::GiveBack { alloc },
        };
        self.tell_broker(msg, out);
    }

    /// After `NAME-shrink`: released if nothing is left there, else the subagents end what
    /// is left within what remains of the grace period.
    fn after_shrink(&mut self, alloc: AllocId, now: Instant, out: &mut Out) {
        let Some(a) = self.allocs.get(&alloc) else {
            return;
        };
        if a.subs.is_empty() {
            self.remove_alloc(alloc, out);
            self.write_hosts(out);
            return self.tell_broker(ToBroker::Released { alloc }, out);
        }
        let left = a
            .deadline
            .map_or(Duration::ZERO, |d| d.saturating_duration_since(now));
        for &sub in &a.subs {
            let grace_ms = left.as_millis() as u64;
            let msg = FromBroker::Terminate { grace_ms };
            out.push(Output::ToSub { sub, msg });
        }
    }

    /// Job end: drop queued grows/shrinks, run `NAME-halt`. True when this is a module job
    /// (its halt's outcome then comes back, or [`super::Timer::HaltWait`]).
    pub(super) fn module_halt(&mut self, now: Instant, out: &mut Out) -> bool {
        let Some(m) = &self.module else { return false };
        out.push(Output::SkipQueuedModuleCalls);
        out.push(Output::RunModule(Call {
            action: Action::Halt,
            host: None,
            alloc: None,
            timeout: m.timeout(),
        }));
        let at = now + m.timeout() + Duration::from_secs(3);
        let timer = super::Timer::HaltWait;
        out.push(Output::SetTimer { timer, at });
        true
    }

    /// What a module that succeeded said on stderr is for the user (e.g. that a shrink
    /// ended the job's processes on the host taken back, so the runs using them failed):
    /// each line is a note (the agent's log at WARN, shown by default, and `rb jobs`).
    fn pass_on_what_it_said(&self, outcome: &Outcome, out: &mut Out) {
        for line in &outcome.said {
            self.note(line.clone(), out);
        }
    }

    /// A module program finished while the halt runs: noted; true when it was the halt.
    pub(super) fn halting_module_done(&mut self, outcome: &Outcome, out: &mut Out) -> bool {
        if let Some(m) = &self.module {
            module_calls::log_outcome(outcome, m.name());
        }
        self.pass_on_what_it_said(outcome, out);
        if let Err(e) = &outcome.result {
            if !e.starts_with("skipped") {
                self.note(e.clone(), out);
            }
        }
        outcome.call.action == Action::Halt
    }

    /// Module requests waiting at the broker, and hosts the job uses by name (to tell a
    /// broker that came back).
    pub(super) fn module_state_to_resend(&self) -> (Vec<(ReqId, String)>, Vec<String>) {
        match &self.module {
            Some(m) => (
                m.requests.iter().map(|(r, s)| (*r, s.clone())).collect(),
                m.in_use.iter().cloned().collect(),
            ),
            None => (Vec::new(), Vec::new()),
        }
    }
}
