//! The job side of the broker core: owns the [`Allocator`], knows which agent connection
//! serves which job, maps each agent's own request ids to broker request ids, and turns
//! allocation effects into messages for agents. Called only from the core task.
//!
//! Every call into the allocator goes through [`JobDesk::traced`], which hands the input and
//! the effects to the decision trace ([`crate::trace`]) when one is kept.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use proto::{
    msg::{FromBroker, JobRegistration, Request, Response, ToBroker},
    report::HostStatus,
    symbolic::label_name,
};
use tracing::{debug, info, warn};

use allocation::{
    trace::{host_delta, Input, RunsOn},
    Answer, Handled,
};

use crate::{
    alloc::{
        AllocId, Allocator, Effect, HostInputs, HostView, JobId, JobInfo, PilotId, PreparedPolicy,
        RequestId, Retired,
    },
    authz::{authorize, Actor, AdminError},
    log_limit::LogLimiter,
    outbox::{Outbox, PushError},
    trace::TraceSink,
};

/// Grace of `rb release` when none is given.
pub const DEFAULT_RELEASE_GRACE: Duration = Duration::from_secs(5);
/// The longest grace a `release` may ask for (`rb release --grace-s` allows 0–3600 s): a
/// larger `grace_ms` on the wire is refused, not a reclaim that never ends.
pub const MAX_RELEASE_GRACE: Duration = Duration::from_secs(3600);

pub use allocation::RESUME_WINDOW;

/// Which allocations are live, as host daemons are told (`FromBroker::LiveAllocs`): they
/// end leftover processes of the others. `ending`: those past their reclaim deadline,
/// whose processes daemons end on every transport (`FromBroker::EndAllocs`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LiveAllocs {
    pub live: Vec<u64>,
    pub issued_below: u64,
    pub ending: Vec<u64>,
}

impl LiveAllocs {
    pub fn message(&self) -> FromBroker {
        FromBroker::LiveAllocs {
            live: self.live.clone(),
            issued_below: self.issued_below,
        }
    }

    pub fn end_message(&self) -> FromBroker {
        FromBroker::EndAllocs {
            allocs: self.ending.clone(),
        }
    }
}

/// Jobs, their agents and their allocations.
pub struct JobDesk {
    alloc: Allocator,
    /// Each connected agent's outbox (never waited on: see [`crate::outbox`]).
    agents: HashMap<JobId, Outbox>,
    /// Agents cut because their outbox was full, whose jobs [`Self::perform`] ends next.
    cut: Vec<JobId>,
    /// Warnings about cut agents, rate-limited (a user can trigger them).
    cut_log: LogLimiter,
    /// Jobs whose end the agent is to hear of once it is saved, with the snapshot that
    /// must be written first (see [`Self::confirm_ends`]).
    ends_unsaved: Vec<(u64, JobId)>,
    /// Jobs that ended by their agent's word during the current event: their end is
    /// confirmed once saved.
    ended_by_agent: Vec<JobId>,
    store: Option<crate::persist::StoreWriter>,
    by_agent_req: HashMap<(JobId, u64), RequestId>,
    agent_req: HashMap<RequestId, (JobId, u64)>,
    remote_shell: Vec<String>,
    transport: String,
    /// The lab's public mark, for agents to hand their subagents (`registered`).
    lab_mark: Option<String>,
    secret_file: String,
    /// The broker's IP as its hosts reach it, told to agents
    /// (see [`Self::with_hosts_reach_broker_at`]).
    hosts_reach_broker_at: Option<std::net::IpAddr>,
    /// The last [`NOTES_KEPT`] notes of each job (from its agent), oldest first.
    notes: HashMap<JobId, VecDeque<String>>,
    /// The decision trace, when one is kept.
    trace: Option<TraceSink>,
    /// Slurm pilots' commands, with `[overflow.slurm]`.
    pilots: Option<crate::pilots::Pilots>,
}

/// Notes kept per job, and the longest note kept (longer ones are cut).
const NOTES_KEPT: usize = 8;
const NOTE_MAX_CHARS: usize = 500;

impl JobDesk {
    pub fn new(
        alloc: Allocator,
        remote_shell: Vec<String>,
        transport: &str,
        secret_file: &std::path::Path,
    ) -> Self {
        Self {
            secret_file: secret_file.display().to_string(),
            lab_mark: None,
            alloc,
            agents: HashMap::new(),
            cut: Vec::new(),
            cut_log: LogLimiter::new(20, Duration::from_secs(10)),
            ends_unsaved: Vec::new(),
            ended_by_agent: Vec::new(),
            store: None,
            by_agent_req: HashMap::new(),
            agent_req: HashMap::new(),
            remote_shell,
            transport: transport.to_string(),
            hosts_reach_broker_at: None,
            notes: HashMap::new(),
            trace: None,
            pilots: None,
        }
    }

    /// Agents hand `mark` (the lab's public mark, read from the secret at start) to their
    /// subagents.
    pub fn with_lab_mark(mut self, mark: Option<String>) -> Self {
        self.lab_mark = mark;
        self
    }

    /// Records every allocator input and decision in `trace` from now on.
    pub fn with_trace(mut self, trace: TraceSink) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Overflow onto Slurm: the allocator asks for pilots (`settings`), which `pilots`
    /// submits and cancels.
    pub fn with_pilots(
        mut self,
        pilots: crate::pilots::Pilots,
        settings: allocation::OverflowSettings,
    ) -> Self {
        self.alloc.set_overflow(Some(settings));
        self.pilots = Some(pilots);
        self
    }

    /// `sbatch` answered for `pilot`.
    pub fn pilot_submitted(
        &mut self,
        pilot: PilotId,
        result: Result<String, String>,
        now: Instant,
    ) {
        match result {
            Ok(id) => self.alloc.pilot_submitted(pilot, id),
            Err(_) => self.alloc.pilot_failed(pilot, now),
        }
    }

    /// This broker's pilots that Slurm still has (found at start).
    pub fn pilots_found(&mut self, ids: Vec<String>, now: Instant) {
        self.alloc.pilots_found(ids, now);
    }

    /// `host`'s daemon says it runs in Slurm job `slurm_job`: asks Slurm how long the
    /// lease has left (answered as [`crate::core::Event::PilotLeaseLeft`]). Only a pilot's
    /// host (`slurm-<node>`) is asked for, and a job id that is not a number is not passed
    /// to Slurm.
    pub fn ask_lease(&self, host: String, slurm_job: String, ending: bool) {
        let Some(pilots) = &self.pilots else {
            return warn!(%host, %slurm_job, "a daemon names a Slurm job, but overflow is off");
        };
        if !config::pilot::is_pilot_host(&host) {
            return warn!(%host, %slurm_job, "a lab host's daemon names a Slurm job; ignored");
        }
        if !config::pilot::is_slurm_job_id(&slurm_job) {
            return warn!(%host, %slurm_job, "a daemon names a Slurm job that is not a job id");
        }
        pilots.lease_left(host, slurm_job, ending);
    }

    /// What Slurm says is `left` of `host`'s lease ([`Allocator::pilot_lease`]); when the
    /// lease ends, whatever holds the host is reclaimed by Slurm's deadline
    /// ([`Allocator::lease_ends`]).
    pub fn pilot_lease(
        &mut self,
        host: &str,
        slurm_job: &str,
        left: Option<Duration>,
        ending: bool,
        now: Instant,
    ) -> Vec<Effect> {
        let Some(grace) = self.alloc.pilot_lease(host, slurm_job, left, ending, now) else {
            return Vec::new();
        };
        info!(%host, %slurm_job, grace_s = grace.as_secs_f64(), "Slurm takes a pilot's node back");
        let input = Input::LeaseEnds {
            host: host.to_string(),
            grace_us: grace.as_micros() as u64,
        };
        self.handle(input, now).0
    }

    /// Cancels every pilot Slurm knows of (at shutdown).
    pub async fn cancel_pilots(&mut self) {
        if let Some(p) = &self.pilots {
            p.cancel_now(self.alloc.pilot_ids()).await;
        }
    }

    /// The one way into the allocator: [`Allocator::handle`]. When a trace is kept, the
    /// input as handled and the decisions among its effects are recorded (unless it
    /// changed nothing: see [`Handled::recorded`]).
    fn handle(&mut self, input: Input, now: Instant) -> (Vec<Effect>, Answer) {
        if let Some(t) = &mut self.trace {
            t.begin(&self.alloc, now);
        }
        let handled = self.alloc.handle(input, now);
        let recorded = handled.recorded();
        let Handled {
            input,
            effects,
            answer,
        } = handled;
        if let (Some(t), true) = (&mut self.trace, recorded) {
            t.record(&self.alloc, input, &effects, now);
        }
        (effects, answer)
    }

    /// Agents are told `ip`, the broker's address as its hosts reach it: an agent that
    /// came through the control socket advertises its own address on the route there.
    pub fn with_hosts_reach_broker_at(mut self, ip: Option<std::net::IpAddr>) -> Self {
        self.hosts_reach_broker_at = ip;
        self
    }

    /// Restored running jobs get [`RESUME_WINDOW`] for their agents to reconnect; durable
    /// changes go to `store` from now on.
    pub fn with_store(mut self, store: crate::persist::StoreWriter, now: Instant) -> Self {
        self.alloc.await_agents(RESUME_WINDOW, now);
        self.store = Some(store);
        self
    }

    /// The host daemons' word on live allocations (see `FromBroker::LiveAllocs`).
    /// Changes whenever [`JobDesk::live_allocs`] does (O(1)).
    pub fn live_allocs_stamp(&self) -> (usize, u64, u64) {
        self.alloc.live_allocs_stamp()
    }

    pub fn live_allocs(&self) -> LiveAllocs {
        let (live, issued_below) = self.alloc.live_allocs();
        let ending = self.alloc.ending_allocs();
        LiveAllocs {
            live,
            issued_below,
            ending,
        }
    }

    /// `host`'s daemon found processes of the allocations `running` on its machine
    /// ([`Allocator::allocs_running`]); a report that changes nothing is not passed on.
    pub fn allocs_running(&mut self, host: &str, running: Vec<u64>, now: Instant) -> Vec<Effect> {
        if !self.alloc.allocs_running_matters(host, &running) {
            return Vec::new();
        }
        let input = Input::AllocsRunning {
            host: host.to_string(),
            allocs: running,
        };
        self.handle(input, now).0
    }

    /// Tells the allocator that one host's row changed (as it happens).
    pub fn host_changed(&mut self, row: &HostStatus, now: Instant) -> Vec<Effect> {
        let view = host_view(row);
        // The delta costs a serialization: only when a trace is kept.
        let changed = if self.trace.is_some() {
            host_delta(self.alloc.host_view(&view.name), &view)
        } else {
            Default::default()
        };
        let input = Input::Host {
            host: view.name.clone(),
            changed,
            view: Some(Box::new(view)),
        };
        self.handle(input, now).0
    }

    /// A report repeated `host`'s last one (its row changed only in age). True when the
    /// allocator took it without a row ([`Allocator::host_repeated`]: it decides nothing);
    /// the trace records it as the host input it stands for, with no field changed, so
    /// that a replay under another policy (which may hold the host, or read the clock)
    /// feeds it again. False: the caller passes the host's row to
    /// [`host_changed`](Self::host_changed).
    pub fn host_repeated(&mut self, host: &str, now: Instant) -> bool {
        if !self.alloc.same_view_decides_nothing(host) {
            return false;
        }
        let input = Input::Host {
            host: host.to_string(),
            changed: Default::default(),
            view: None,
        };
        self.handle(input, now);
        true
    }

    /// Adds what the allocator does with each host (`alloc_state`, `held_by`, `drained`,
    /// `policy_note`).
    pub fn annotate(&self, rows: &mut [HostStatus], now: Instant) {
        for row in rows {
            let a = self.alloc.host_alloc(&row.name);
            row.alloc_state = a.alloc_state.to_string();
            row.held_by = a.held_by;
            row.drained = a.drained;
            row.policy_note = self.alloc.policy_note(&row.name);
            if let Some(lease) = self.alloc.pilot_lease_of(&row.name) {
                row.slurm_job = lease.slurm_job;
                row.lease_left_s = lease
                    .ends
                    .map(|end| end.saturating_duration_since(now).as_secs_f64().round());
                row.lease_ending = lease.ending;
            }
        }
    }

    /// What a reload prepares its policy's host decisions from, off the core
    /// ([`Allocator::policy_inputs`]).
    pub fn policy_inputs(&self) -> HostInputs {
        self.alloc.policy_inputs()
    }

    /// Puts a reloaded policy in force ([`Allocator::set_prepared_policy`]): recorded as
    /// the same input as [`Allocator::set_policy`], which a replay calls. Also returns what
    /// the change replaced, to drop off the core.
    pub fn set_policy(
        &mut self,
        prepared: PreparedPolicy,
        now: Instant,
    ) -> (Vec<Effect>, Option<Retired>) {
        let sha256 = prepared.policy().sha256().to_string();
        self.alloc.stage_policy(prepared);
        match self.handle(Input::Policy { sha256 }, now) {
            (effects, Answer::Retired(retired)) => (effects, Some(retired)),
            (effects, _) => (effects, None),
        }
    }

    /// `rb policy explain` ([`Allocator::explain`]).
    pub fn explain(
        &mut self,
        host: &str,
        job: Option<JobId>,
        now: Instant,
    ) -> Result<serde_json::Value, String> {
        let input = Input::Explain {
            host: host.to_string(),
            job,
        };
        match self.handle(input, now).1 {
            Answer::Explained(answer) => answer,
            other => Err(format!("the allocator did not explain: {other:?}")),
        }
    }

    /// Registers a job for a newly connected agent; a new job (not a resumed one) is refused
    /// with the reason when the state dir cannot take it (full, read-only). Whether the job
    /// is resumed, and which host is its front end, the allocator decides.
    pub fn register(
        &mut self,
        reg: JobRegistration,
        tx: Outbox,
        now: Instant,
    ) -> Result<(JobId, Vec<Effect>), String> {
        let resumes = reg
            .resume
            .is_some_and(|j| self.alloc.may_resume(j, &reg.user));
        if let (false, Some(store)) = (resumes, &self.store) {
            store.check_writable().inspect_err(|e| {
                crate::web::METRICS.refused("job");
                warn!(error = %e, "job refused");
            })?;
        }
        let (effects, answer) = self.handle(registration_input(reg), now);
        let Answer::Job {
            job,
            resumed,
            front_end,
            own_host,
        } = answer
        else {
            return Err(format!("the allocator registered no job: {answer:?}"));
        };
        let msg = FromBroker::Registered {
            job,
            remote_shell: self.remote_shell.clone(),
            transport: self.transport.clone(),
            secret_file: self.secret_file.clone(),
            hosts_reach_broker_at: self.hosts_reach_broker_at,
            lab_mark: self.lab_mark.clone(),
            front_end,
        };
        // A new outbox has room: this cannot be refused as full.
        let _ = tx.push(msg);
        self.agents.insert(job, tx);
        match resumed {
            true => info!(job, "agent reconnected; job resumed"),
            false => info!(job, "job registered"),
        }
        if let Some(host) = own_host {
            info!(job, %host, "a module job runs on this lab host: never granted to it");
        }
        Ok((job, effects))
    }

    /// A give-back (`confirmed`: a confirmed release after a reclaim) of allocation `alloc`
    /// by `job`'s agent; the allocator applies it only to an allocation of the job's own.
    fn return_alloc(
        &mut self,
        job: JobId,
        alloc: AllocId,
        confirmed: bool,
        now: Instant,
    ) -> Vec<Effect> {
        // A late answer about an allocation that is over: the broker forced the release at
        // its deadline, or the agent answered both the reclaim and its re-sending after a
        // broker restart.
        let Some(input) = self.alloc.return_input(job, alloc, confirmed) else {
            debug!(
                job,
                alloc, "ignoring the return of an allocation the job no longer holds"
            );
            return Vec::new();
        };
        let (effects, answer) = self.handle(input, now);
        if let Answer::Ignored(why) = answer {
            warn!(job, alloc, %why, "ignoring the return of an allocation");
        }
        effects
    }

    /// A message from `job`'s agent.
    pub fn agent_message(&mut self, job: JobId, msg: ToBroker, now: Instant) -> Vec<Effect> {
        match msg {
            ToBroker::Allocate { req, symbolic } => {
                let input = Input::Allocate {
                    job,
                    req: 0,
                    symbolic,
                };
                let (effects, answer) = self.handle(input, now);
                if let Answer::Request(id) = answer {
                    self.by_agent_req.insert((job, req), id);
                    self.agent_req.insert(id, (job, req));
                    crate::web::METRICS.requested(id);
                }
                effects
            }
            ToBroker::Cancel { req } => match self.by_agent_req.remove(&(job, req)) {
                Some(id) => {
                    self.agent_req.remove(&id);
                    self.handle(Input::Cancel { job, req: id }, now).0
                }
                None => Vec::new(),
            },
            ToBroker::GiveBack { alloc } => self.return_alloc(job, alloc, false, now),
            ToBroker::Released { alloc } => self.return_alloc(job, alloc, true, now),
            ToBroker::HostsInUse { hosts } => {
                let (effects, answer) = self.handle(Input::UsesHosts { job, hosts }, now);
                if let Answer::Uses(hosts) = answer {
                    info!(
                        job,
                        ?hosts,
                        "hosts the job uses by name: never granted to it"
                    );
                }
                effects
            }
            ToBroker::JobNote { text } => {
                self.add_note(job, &text);
                Vec::new()
            }
            ToBroker::EndJob { status } => {
                info!(job, status, "job ended");
                self.ended_by_agent.push(job);
                self.handle(Input::End { job }, now).0
            }
            other => {
                warn!(job, ?other, "ignoring a message an agent should not send");
                Vec::new()
            }
        }
    }

    fn add_note(&mut self, job: JobId, text: &str) {
        let text: String = text.chars().take(NOTE_MAX_CHARS).collect();
        info!(job, note = ?text, "job note");
        let notes = self.notes.entry(job).or_default();
        if notes.len() == NOTES_KEPT {
            notes.pop_front();
        }
        notes.push_back(text);
    }

    /// `rb jobs` rows: the allocator's, plus each job's notes and its start and end times
    /// (unix seconds, from the allocator's "how long ago").
    fn job_rows(&mut self, now: Instant) -> Vec<serde_json::Value> {
        let rows = self.alloc.jobs(now);
        let known: HashSet<JobId> = rows.iter().map(|r| r.id).collect();
        self.notes.retain(|job, _| known.contains(job));
        let wall = SystemTime::now();
        let unix = |ago: Option<Duration>| {
            ago.and_then(|a| wall.checked_sub(a))
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
        };
        rows.iter()
            .filter_map(|row| {
                let mut v = serde_json::to_value(row).ok()?;
                let notes = self
                    .notes
                    .get(&row.id)
                    .map(|n| n.iter().collect::<Vec<_>>());
                v["notes"] = serde_json::json!(notes.unwrap_or_default());
                v["started_at"] = serde_json::json!(unix(row.started_ago));
                v["ended_at"] = serde_json::json!(unix(row.ended_ago));
                Some(v)
            })
            .collect()
    }

    /// The agent's connection closed: the allocator ends its job if it runs (its
    /// subagents end their processes).
    pub fn agent_gone(&mut self, job: JobId, now: Instant) -> Vec<Effect> {
        self.agents.remove(&job);
        let (effects, answer) = self.handle(Input::AgentGone { job }, now);
        if let Answer::Ended { was_running: true } = answer {
            warn!(job, "agent disconnected; its job ended");
        }
        effects
    }

    /// Whether the core should tick faster: it may ask Slurm for a pilot soon
    /// ([`Allocator::pilot_may_be_due`](crate::alloc::Allocator::pilot_may_be_due)).
    pub fn pilot_may_be_due(&self, now: Instant) -> bool {
        self.alloc.pilot_may_be_due(now)
    }

    /// The allocator's clock: reclaim deadlines, resume windows, pilots.
    pub fn tick(&mut self, now: Instant) -> Vec<Effect> {
        self.handle(Input::Tick, now).0
    }

    /// An admin input: its effects, or why the allocator refused it.
    fn admin_input(&mut self, input: Input, now: Instant) -> Result<Vec<Effect>, String> {
        match self.handle(input, now) {
            (_, Answer::Refused(e)) => Err(e.to_string()),
            (effects, _) => Ok(effects),
        }
    }

    /// The user of the job holding `host`, if a job holds it.
    fn holder_user(&self, host: &str) -> Option<String> {
        let (job, _) = self.alloc.holder(host)?;
        self.alloc.job_info(job).map(|i| i.user.clone())
    }

    /// Client requests about jobs, from `actor` (authorized here: whether a user may
    /// release a host depends on whose job holds it).
    pub fn admin(
        &mut self,
        actor: &Actor,
        req: Request,
        now: Instant,
    ) -> (Result<Response, AdminError>, Vec<Effect>) {
        if let Err(refusal) = authorize(actor, &req, |h| self.holder_user(h)) {
            return (Err(refusal.into()), Vec::new());
        }
        let (answer, effects) = self.admin_allowed(req, now);
        (answer.map_err(AdminError::Failed), effects)
    }

    fn admin_allowed(
        &mut self,
        req: Request,
        now: Instant,
    ) -> (Result<Response, String>, Vec<Effect>) {
        match req {
            Request::Jobs => {
                let jobs = self.job_rows(now);
                (Ok(Response::Jobs { jobs }), Vec::new())
            }
            Request::Release { host, grace_ms } => {
                let grace = grace_ms.map_or(DEFAULT_RELEASE_GRACE, Duration::from_millis);
                if grace > MAX_RELEASE_GRACE {
                    let max = MAX_RELEASE_GRACE.as_millis();
                    let e = format!("grace_ms {} is out of range (0–{max})", grace.as_millis());
                    return (Err(e), Vec::new());
                }
                let holder = self.alloc.holder(&host);
                let input = Input::ReleaseHost {
                    host: host.clone(),
                    grace_us: grace.as_micros() as u64,
                };
                match self.admin_input(input, now) {
                    Ok(effects) => {
                        let message = match holder {
                            Some((job, _)) => format!(
                                "reclaiming {host} from job {job} (grace {:.1} s)",
                                grace.as_secs_f64()
                            ),
                            None => format!("{host} released"),
                        };
                        (Ok(Response::Done { message }), effects)
                    }
                    Err(e) => (Err(e), Vec::new()),
                }
            }
            Request::Drain { host } => {
                match self.admin_input(Input::Drain { host: host.clone() }, now) {
                    Ok(effects) => (
                        Ok(Response::Done {
                            message: format!("{host} drained: no new grants"),
                        }),
                        effects,
                    ),
                    Err(e) => (Err(e), Vec::new()),
                }
            }
            Request::Resume { host } => {
                match self.admin_input(Input::Resume { host: host.clone() }, now) {
                    Ok(effects) => (
                        Ok(Response::Done {
                            message: format!("{host} resumed"),
                        }),
                        effects,
                    ),
                    Err(e) => (Err(e), Vec::new()),
                }
            }
            other => (Err(format!("not a job request: {other:?}")), Vec::new()),
        }
    }

    /// Performs effects: messages to agents, never waited on. An agent whose outbox is
    /// full is cut and its job ended as if its connection had closed ([`Self::agent_gone`]),
    /// and what that decides is performed too. Returns true when durable state changed.
    pub fn perform(&mut self, effects: Vec<Effect>, now: Instant) -> bool {
        let mut persist = self.perform_each(effects);
        while let Some(job) = self.cut.pop() {
            let effects = self.agent_gone(job, now);
            persist |= self.perform_each(effects);
        }
        if persist {
            if let Some(store) = &mut self.store {
                store.save(self.alloc.snapshot());
            }
        }
        self.confirm_ends();
        persist
    }

    /// Performs effects in order; true when one of them asks for a save.
    fn perform_each(&mut self, effects: Vec<Effect>) -> bool {
        let mut persist = false;
        for effect in effects {
            crate::web::METRICS.effect(&effect);
            match effect {
                Effect::Granted {
                    job,
                    req,
                    alloc,
                    host,
                    address,
                    instance,
                } => match self.forget_req(req) {
                    Some((_, agent_req)) => {
                        info!(job, alloc, %host, ?instance, "granted");
                        let msg = FromBroker::Granted {
                            req: agent_req,
                            alloc,
                            host,
                            address,
                            instance,
                        };
                        self.send(job, msg);
                    }
                    None => warn!(job, req, alloc, %host, "granted a request no agent asked for"),
                },
                Effect::Queued {
                    job,
                    req,
                    position,
                    reason,
                } => {
                    if let Some(&(_, agent_req)) = self.agent_req.get(&req) {
                        self.send(
                            job,
                            FromBroker::Queued {
                                req: agent_req,
                                position: position as u32,
                                reason: Some(reason),
                            },
                        );
                    }
                }
                Effect::Refused { job, req, reason } => {
                    if let Some((_, agent_req)) = self.forget_req(req) {
                        self.send(
                            job,
                            FromBroker::Refused {
                                req: agent_req,
                                message: reason,
                            },
                        );
                    }
                }
                Effect::Reclaim {
                    job,
                    alloc,
                    host,
                    grace,
                } => {
                    info!(job, alloc, %host, "reclaiming");
                    self.send(
                        job,
                        FromBroker::Reclaim {
                            alloc,
                            host,
                            grace_ms: grace.as_millis() as u64,
                        },
                    );
                }
                Effect::ForceRelease { job, alloc, host } => {
                    warn!(job, alloc, %host, "release deadline passed; forcing");
                    self.send(
                        job,
                        FromBroker::Reclaim {
                            alloc,
                            host,
                            grace_ms: 0,
                        },
                    );
                }
                Effect::Freed { .. } => {}
                Effect::AgentLate { job } => warn!(
                    job,
                    "agent did not come back after the broker restarted; its job ended"
                ),
                Effect::PolicyError {
                    key,
                    host,
                    job,
                    message,
                } => {
                    warn!(key, %host, ?job, %message, "policy expression failed; its default was used");
                }
                Effect::SubmitPilot { pilot } => match &self.pilots {
                    Some(p) => p.submit(pilot),
                    None => warn!(pilot, "a pilot asked for without [overflow.slurm]"),
                },
                Effect::CancelPilot { pilot, slurm_id } => {
                    if let Some(p) = &self.pilots {
                        p.cancel(pilot, slurm_id);
                    }
                }
                Effect::Persist => persist = true,
            }
        }
        persist
    }

    /// Tells each agent whose job ended by its word that the end is saved, once everything
    /// queued for the disk up to it is written (the end was queued by [`Self::perform`]).
    /// The agent waits for this before it exits: a broker killed between the agent's
    /// `end_job` and the save would otherwise bring the job back with its hosts held until
    /// [`RESUME_WINDOW`] passed, with no agent to end it. The core calls
    /// [`Self::saved_up_to`] as the writer makes progress; nothing waits here.
    fn confirm_ends(&mut self) {
        let queued = self.store.as_ref().map_or(0, |s| s.queued());
        for job in std::mem::take(&mut self.ended_by_agent) {
            self.ends_unsaved.push((queued, job));
        }
        let written = self.store.as_ref().map_or(u64::MAX, |s| s.committed_now());
        self.saved_up_to(written);
    }

    /// The store's writer has written every snapshot up to `written`: the ends waiting for
    /// it are confirmed to their agents.
    pub fn saved_up_to(&mut self, written: u64) {
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ends_unsaved)
            .into_iter()
            .partition(|(seq, _)| *seq <= written);
        self.ends_unsaved = waiting;
        for (_, job) in done {
            self.send(job, FromBroker::JobEnded { job });
        }
    }

    /// Whether an end waits for the disk (the core then watches the writer's progress).
    pub fn ends_wait_for_disk(&self) -> bool {
        !self.ends_unsaved.is_empty()
    }

    /// The writer's progress, which [`Self::saved_up_to`] is to be told of.
    pub fn store_progress(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.store.as_ref().map(|s| s.progress())
    }

    fn forget_req(&mut self, req: RequestId) -> Option<(JobId, u64)> {
        let found = self.agent_req.remove(&req)?;
        self.by_agent_req.remove(&found);
        Some(found)
    }

    /// Queues `msg` for `job`'s agent without waiting; an agent whose outbox is full is
    /// cut (its job ends in [`Self::perform`]).
    fn send(&mut self, job: JobId, msg: FromBroker) {
        let Some(outbox) = self.agents.get(&job) else {
            return;
        };
        match outbox.push(msg) {
            Ok(()) | Err(PushError::Closed) => {}
            Err(PushError::Full) => self.cut_agent(job),
        }
    }

    /// Cuts `job`'s agent, which does not read what it is sent: its connection closes and
    /// its job is ended as if the agent had gone.
    fn cut_agent(&mut self, job: JobId) {
        let Some(mut outbox) = self.agents.remove(&job) else {
            return;
        };
        let reason = PushError::Full.to_string();
        outbox.cut(&reason);
        if self.cut_log.allow() {
            warn!(job, %reason, "agent connection cut");
        }
        self.cut.push(job);
    }
}

/// The allocator's view of a host, from the host's status row (the core's input is its
/// own type, not the row `rb status` shows).
pub fn host_view(s: &HostStatus) -> HostView {
    HostView {
        name: s.name.clone(),
        address: s.address.clone(),
        up: s.state == proto::report::HostState::Up,
        reported: s.last_report_age_s.is_some(),
        labels: s.labels.iter().map(|l| label_name(l)).collect(),
        os: s.os.clone(),
        owner: s.owner.clone(),
        load1: s.load1,
        load5: s.load5,
        load15: s.load15,
        mem_avail_mb: s.mem_available_kb.map(|kb| kb / 1024),
        cpus: s.cpus,
        users: s.users_known.then(|| s.users.clone()),
        console_idle_s: s.console_idle_s,
        logind: s.logind.clone(),
        logind_error: s.logind_error.clone(),
        job_load: s.job_load,
    }
}

/// The allocator's input for an agent's registration (`reg.user` is the authenticated
/// user).
fn registration_input(reg: JobRegistration) -> Input {
    Input::Register {
        job: 0,
        info: JobInfo {
            user: reg.user,
            cwd: reg.cwd,
            argv: reg.argv,
            spec: reg.spec,
            adaptive: reg.adaptive,
        },
        resume: reg.resume,
        runs_on: reg.runs_on.map(|on| RunsOn {
            hostname: on.hostname,
            addresses: on.addresses,
        }),
        module: reg.module.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use proto::{
        msg::AgentHost,
        report::{HostState, HostStatus},
    };

    use super::*;

    fn status(name: &str, address: &str) -> HostStatus {
        HostStatus {
            name: name.into(),
            address: address.into(),
            state: HostState::Up,
            down_reason: None,
            hostname: Some(name.into()),
            cpus: Some(1),
            load1: Some(0.0),
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

    fn registration(module: Option<&str>) -> JobRegistration {
        JobRegistration {
            user: "alice".into(),
            cwd: "/".into(),
            argv: vec!["pvm".into()],
            spec: None,
            adaptive: true,
            resume: None,
            runs_on: Some(AgentHost {
                hostname: "workstation-1".into(),
                addresses: vec!["127.0.0.1".into(), "10.0.0.1".into()],
            }),
            module: module.map(String::from),
        }
    }

    fn granted_host(effects: &[Effect]) -> Option<String> {
        effects.iter().find_map(|e| match e {
            Effect::Granted { host, .. } => Some(host.clone()),
            _ => None,
        })
    }

    /// A user releases the hosts of their own jobs only, and drains nothing.
    #[tokio::test]
    async fn a_user_releases_only_their_own_jobs_hosts() {
        let mut desk = JobDesk::new(
            Allocator::new(),
            vec!["ssh".into()],
            "ssh",
            std::path::Path::new("/nonexistent/secret"),
        );
        let now = Instant::now();
        desk.host_changed(&status("node02", "10.0.0.2"), now);
        let (tx, _rx) = crate::outbox::channel(16);
        let mut reg = registration(None);
        reg.user = "bob".into();
        let (job, _) = desk.register(reg, tx, now).expect("registered");
        let allocate = ToBroker::Allocate {
            req: 1,
            symbolic: "anyLinux".into(),
        };
        let effects = desk.agent_message(job, allocate, now);
        assert_eq!(granted_host(&effects).as_deref(), Some("node02"));
        let release = || Request::Release {
            host: "node02".into(),
            grace_ms: Some(0),
        };
        let eve = Actor::User("eve".into());
        let (answer, effects) = desk.admin(&eve, release(), now);
        assert!(matches!(answer, Err(AdminError::Denied(_))), "{answer:?}");
        assert!(effects.is_empty(), "nothing done");
        let drain = Request::Drain {
            host: "node02".into(),
        };
        let bob = Actor::User("bob".into());
        let (answer, _) = desk.admin(&bob, drain, now);
        assert!(matches!(answer, Err(AdminError::Denied(_))), "{answer:?}");
        let (answer, effects) = desk.admin(&bob, release(), now);
        assert!(matches!(answer, Ok(Response::Done { .. })), "{answer:?}");
        assert!(!effects.is_empty(), "the reclaim starts");
    }

    /// A module job on a lab host, as the broker sees it: the agent runs on node01 (found by its
    /// address); a module job is never granted node01, a plain job may be.
    #[tokio::test]
    async fn a_module_job_is_never_granted_the_host_its_agent_runs_on() {
        let mut desk = JobDesk::new(
            Allocator::new(),
            vec!["ssh".into()],
            "ssh",
            std::path::Path::new("/nonexistent/secret"),
        );
        let now = Instant::now();
        let hosts = [
            status("node01", "10.0.0.1"),
            status("node02", "10.0.0.2"),
            status("node03", "10.0.0.3"),
        ];
        for host in &hosts {
            desk.host_changed(host, now);
        }
        let (tx, _rx) = crate::outbox::channel(16);
        let (pvm, _) = desk
            .register(registration(Some("pvm")), tx, now)
            .expect("no store: never refused");
        let allocate = |req| ToBroker::Allocate {
            req,
            symbolic: "anyLinux".into(),
        };
        let effects = desk.agent_message(pvm, allocate(1), now);
        assert_eq!(granted_host(&effects).as_deref(), Some("node02"));
        let in_use = ToBroker::HostsInUse {
            hosts: vec!["10.0.0.3".into(), "not-in-the-lab".into()],
        };
        desk.agent_message(pvm, in_use, now);
        let effects = desk.agent_message(pvm, allocate(2), now);
        assert_eq!(
            granted_host(&effects),
            None,
            "node01 and node03 in use: {effects:?}"
        );
        let (tx, _rx2) = crate::outbox::channel(16);
        let (plain, _) = desk
            .register(registration(None), tx, now)
            .expect("no store: never refused");
        let effects = desk.agent_message(plain, allocate(1), now);
        assert_eq!(granted_host(&effects).as_deref(), Some("node01"));
    }
}
