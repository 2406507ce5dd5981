//! The job side of the broker core: owns the [`Allocator`], knows which agent connection
//! serves which job, maps each agent's own request ids to broker request ids, and turns
//! allocation effects into messages for agents. Called only from the core task.
//!
//! Every call into the allocator goes through `JobDesk::handle` ([`Allocator::handle`]),
//! which hands the input and the effects to the decision trace ([`crate::trace`]) when one
//! is kept.
//!
//! # Layout
//! - this module: [`JobDesk`], its construction, the one way into the allocator, ticks and
//!   the live allocations host daemons are told.
//! - `agents`: agents' registrations and messages, turned into inputs; their outboxes.
//! - `host_side`: host changes and policy changes into inputs; `rb status` annotations.
//! - `admin`: `rb jobs|release|drain|resume`, authorized; job rows with their notes.
//! - `effects`: effects turned into messages; ends confirmed once saved.
//! - `overflow`: Slurm pilots and leases.

mod admin;
mod agents;
mod effects;
mod host_side;
mod overflow;

pub use host_side::{host_view, LabelNames};

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use proto::{
    msg::{FromBroker, JobRegistration, Request, Response, ToBroker},
    report::HostStatus,
    row_parts::{FixedPart, LivePart},
    symbolic::label_name,
};
use tracing::{debug, info, warn};

use allocation::{
    trace::{host_delta, Input, RunsOn},
    Answer, Handled, PolicyNotes,
};

use crate::{
    alloc::{
        AllocId, Allocator, Effect, HostInputs, HostView, JobId, JobInfo, PilotId, PreparedPolicy,
        RequestId, Retired,
    },
    authz::{authorize, Actor, AdminError},
    log_limit::LogLimiter,
    outbox::{Outbox, PushError},
    shared_lists::SharedLists,
    trace::TraceSink,
};

/// Grace of `rb release` when none is given.
pub const DEFAULT_RELEASE_GRACE: Duration = Duration::from_secs(5);
/// The longest grace a `release` may ask for (`rb release --grace-s` allows 0–3600 s): a
/// larger `grace_ms` on the wire is refused, not a reclaim that never ends.
pub const MAX_RELEASE_GRACE: Duration = Duration::from_secs(3600);

pub use allocation::RESUME_WINDOW;

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
    /// Jobs whose end the allocator asked to confirm to their agent during the current
    /// event ([`Effect::ConfirmEnd`]): it is confirmed once saved.
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
    /// The hosts' label lists as the allocator's views carry them.
    label_names: LabelNames,
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
            label_names: LabelNames::default(),
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

    /// The one way into the allocator: [`Allocator::handle`]. When a trace is kept, the
    /// input as handled and the decisions among its effects are recorded (unless it
    /// changed nothing: see [`Handled::recorded`]).
    pub(super) fn handle(&mut self, input: Input, now: Instant) -> (Vec<Effect>, Answer) {
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

    /// A stamp that changes whenever [`JobDesk::allocs_with_hosts`] does (O(1)).
    pub fn live_allocs_stamp(&self) -> (usize, u64, u64) {
        self.alloc.live_allocs_stamp()
    }

    /// Every allocation (ascending) with its host and whether it is past its deadline, and
    /// the next allocation id ([`crate::host_words`]).
    pub fn allocs_with_hosts(&self) -> (impl Iterator<Item = (u64, &str, bool)>, u64) {
        self.alloc.allocs_with_hosts()
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
}

#[cfg(test)]
mod tests;
