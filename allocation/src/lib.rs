//! The allocation core: which job holds which host, who waits for one, and when to take a
//! host back. A library of its own so that `rb-broker` (which runs it) and `rb` (which
//! replays a decision trace through it, `rb policy replay`) share it; the SQLite store that
//! makes its state survive a broker restart stays in the broker (`broker::alloc::store`).
//!
//! # Layout
//! - `host`: [`HostView`], the core's view of one host (its own type: the broker builds it
//!   from a host's status row), and
//!   the per-host predicates: symbolic-name matching, "owner away", the choice order.
//! - `state`: [`Allocator`], the pure state machine (jobs, requests, allocations) and its
//!   operations, each returning the [`Effect`]s the async shell must perform.
//! - `handle`: [`Allocator::handle`], the one entry point the broker and `rb policy replay`
//!   drive it through ([`trace::Input`] in, [`Handled`] out), and the rules about agents'
//!   jobs: the resume window, who may resume, a module job's front end, agent gone,
//!   ownership of what a job gives back.
//! - `policy`: serving the queue, choosing a host, choosing what to reclaim: the mechanism,
//!   asking the policy file (`policies` crate) for each decision.
//! - `inputs`: the policy's inputs (a pre-built value per host and per job, cached with the
//!   host-only decisions), [`Allocator::set_policy`], and rate-limited run-time errors.
//! - `prepare`: a policy change whose host-only decisions are worked out elsewhere
//!   ([`HostInputs::prepare`], off the broker's core), then swapped in.
//! - `free`: the free hosts in grant order, so a grant looks at the best few hosts and
//!   evaluates the job-dependent rest of the policy on those only.
//! - `held`: `host.held_for_s` from the grant instants, kept current in the cached values.
//! - `share`: each running job's `share`, the fair partition's weight (`job.share`).
//! - `decide`: evaluating one hook on the cached inputs; run-time errors, rate-limited.
//! - `explain`: the policy explained on one host (`rb policy explain`, `policy_note`).
//! - `overflow`: overflow onto Slurm: when the `overflow` hook asks for a pilot job
//!   ([`Effect::SubmitPilot`]) and when an unneeded one is cancelled ([`Effect::CancelPilot`]).
//! - `view`: read-only views for people: [`JobRow`]s with each waiting request's
//!   [`WaitReason`], and each host's [`HostAlloc`] (free, held, draining…).
//! - `in_use`: hosts a job uses without holding them (never granted to it), and finding
//!   the lab host an agent names.
//! - [`trace`]: the decision trace's format (JSON lines of inputs and decisions) and its
//!   pure [`Recorder`]; [`trace_state`]: [`TraceState`], the whole state that opens each
//!   trace file.
//! - [`replay`]: [`Replay`], a trace played again under another policy, and the decisions
//!   that would have differed (`rb policy replay`).
//! - `usage`: host-seconds of a replayed run, in all and per host state ([`Usage`],
//!   [`HostUse`]), and each host's states as spans ([`Timeline`]), for `rb policy replay`.
//! - [`usage_series`]: a [`Timeline`] cut into time buckets ([`usage_series::Series`]), what
//!   the utilization chart draws.
//! - [`snapshot`]: [`Snapshot`], the plain-data form of the durable state; snapshot/restore and
//!   the invariant checker.
//!
//! # Model
//! - A **job** is registered by an agent and is `Running` until [`Allocator::end_job`].
//! - A **request** asks for a host by symbolic name (`anyHost`, `anyLinux`, `any<Label>`):
//!   `Queued → Granted | Cancelled` (the latter two are terminal and leave the table).
//! - An **allocation** is one host held by one job:
//!   `Granted → Releasing{deadline} → Released`, or `Granted → Released` when the job gives the
//!   host back or ends. `Released` is terminal and represented by removal from the table (with
//!   a [`Effect::Freed`]); a host is in at most one live allocation, and is granted elsewhere
//!   only after its holder confirmed the release or the deadline forced it.
//!
//! Every entry point is pure: no I/O, no clock (callers pass `now`), no async. Decisions are made
//! on in-memory state only; [`Effect::Persist`] comes last and tells the shell to write a
//! [`Allocator::snapshot`] to its store after the decision.
//!
//! # Choices
//! - **A host that goes down keeps its allocation.** "Down" here means the broker has not heard
//!   from the host daemon for a few seconds; the job's processes usually still run. Like a
//!   Condor claim surviving a startd disconnect (job lease) or a Slurm node that is "not
//!   responding" before it is declared DOWN, the allocation stays with the job until the job
//!   gives it back, ends, or an admin runs `rb release HOST`. Dropping it would let a second job
//!   be granted the host while the first one's processes still run there.
//! - **Policy in a file, mechanism here.** The [`Allocator`] holds a compiled
//!   [`policies::Policy`] (default: the shipped `paper`). Rust filters first (up, drained,
//!   held, reserved, label, in use); then `start` decides eligibility, `rank` the order
//!   after the tie-breaks below, `may_preempt`/`preempt_rank` what to reclaim for a waiting
//!   request, `vacate` when a holder must give a host back, and `grace_s` the grace when it
//!   ends before the lab's or the admin's (the earliest deadline wins); a job at its
//!   `max_hosts` gets no more hosts; `priority` orders the queue; `share` weighs each job
//!   in the partition (`job.share`, read by `may_preempt` and `preempt_rank`). A hook that
//!   fails at run time gives
//!   its default there and an [`Effect::PolicyError`] (once per key and host a minute).
//! - **Fair partition without thrashing** (the paper's `may_preempt`). A non-adaptive
//!   requester may reclaim from any adaptive job; an adaptive requester only from an adaptive
//!   job holding at least two more hosts than itself (counting hosts already being reclaimed
//!   for it: the policy's `hosts_held`), so two adaptive jobs never take the same host back
//!   and forth. Weighted by `share`: the holder, one host fewer, must still hold at least
//!   as many hosts per share as the requester with one more.
//! - **A broad name takes the most generic host** (`policy`): among eligible hosts a
//!   request gets one no other waiting request could use, then the one with the fewest
//!   labels, then the usual choice order. With `anyLinux,anyHost,anyPublic` asked at once
//!   (an MPI launcher), the public hosts are left for `anyPublic` instead of being taken by
//!   the broad names while generic hosts sit idle and the launcher waits for ever.
//! - **Owner returns** (flow 8): on each report of a held host the policy's `vacate` is
//!   asked about its holder; the paper's reclaims a private host from an adaptive job once a
//!   session or the console saw input within the last 5 minutes. Non-adaptive holders are
//!   left alone by the paper, which never gives them private hosts in the first place.
//! - **Deadlines across restarts:** a snapshot stores each in-flight reclaim's grace, not its
//!   deadline; [`Allocator::restore`] re-arms it as `now + grace`, so a restart never shortens
//!   the time a job was promised ([`Allocator::resend_reclaims`] re-sends them).
//! - **A reclaim is not withdrawn.** If the request it was started for is cancelled or served
//!   by another host meanwhile, the reclaim goes on (the agent was already told); the host,
//!   once released, serves the next request that can use it or becomes free.
//! - **Host views arrive one at a time** ([`Allocator::host_changed`]), as the host table
//!   records each change (a report, a connection, up/down); the lab file's hosts are made
//!   known at the broker's start, so `drain`/`resume`/`release` work before any report. A
//!   change that alters no decision input (only the load, say) does not serve the queue.
//! - **Restored requests wait for nobody.** After a restart agents re-send their waiting
//!   requests as new ones; a request restored from a snapshot keeps its place and its
//!   reserved host, never starts a reclaim, and leaves the queue without a grant once a host
//!   is free for it (the host stays free for the next in line).
//! - **Ended jobs** stay listed in [`Allocator::jobs`] until more than
//!   [`AllocConfig::ended_jobs_kept`] have ended; then the oldest are forgotten.

mod decide;
mod delta;
mod explain;
mod free;
mod handle;
mod held;
mod host;
pub mod host_map;
mod in_use;
mod inputs;
mod overflow;
mod policy;
mod prepare;
pub mod replay;
mod share;
pub mod snapshot;
mod state;
pub mod trace;
pub mod trace_state;
mod usage;
pub mod usage_series;
mod view;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use decide::POLICY_ERROR_EVERY;
pub use explain::PolicyNotes;
pub use handle::{Answer, Handled, RESUME_WINDOW};
pub use host::{HostView, IDLE_AFTER};
pub use host_map::HostMap;
pub use overflow::{OverflowSettings, PilotId};
pub use prepare::{HostInputs, PreparedPolicy, Retired};
pub use replay::{Difference, Outcome, Replay};
pub use snapshot::{AllocRecord, JobRecord, ReleasingRecord, RequestRecord, Snapshot};
pub use state::Allocator;
pub use trace::{Recorder, TraceClock};
pub use trace_state::TraceState;
pub use usage::{ByUse, HostUse, Span, Timeline, Usage};
pub use view::{Blocked, HostAlloc, WaitReason, WaitingRow};

pub type JobId = u64;
pub type AllocId = u64;
pub type RequestId = u64;

/// What an agent says about the job it wraps when it registers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobInfo {
    pub user: String,
    pub cwd: String,
    pub argv: Vec<String>,
    /// The RSL job spec as JSON; opaque to the core.
    pub spec: Option<serde_json::Value>,
    /// Whether the job can give hosts back on demand (only such jobs are reclaimed by policy).
    pub adaptive: bool,
}

/// Life of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Running,
    Ended,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Ended => "ended",
        }
    }
}

/// What the async shell must do after a decision, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Tell the job's agent: `host` (reachable at `address`) is yours for request `req`;
    /// `instance` when the request named an instance (`anyLinux-2`), which the agent binds.
    Granted {
        job: JobId,
        req: RequestId,
        alloc: AllocId,
        host: String,
        address: String,
        instance: Option<u32>,
    },
    /// Tell the job's agent its request waits; `position` 1 is next in line; `reason` says
    /// why (a [`WaitReason`], for people).
    Queued {
        job: JobId,
        req: RequestId,
        position: usize,
        reason: String,
    },
    /// The request can never be served; `reason` says why and what exists.
    Refused {
        job: JobId,
        req: RequestId,
        reason: String,
    },
    /// Ask the job's agent to release `host` within `grace`, then confirm
    /// ([`Allocator::release_confirmed`]).
    Reclaim {
        job: JobId,
        alloc: AllocId,
        host: String,
        grace: Duration,
    },
    /// The deadline passed without confirmation: kill the job's processes on `host`.
    /// The allocation is already released.
    ForceRelease {
        job: JobId,
        alloc: AllocId,
        host: String,
    },
    /// `host` left its allocation (released); it may be granted again (maybe in this same
    /// batch of effects).
    Freed { host: String },
    /// A policy expression failed at run time on `host` (for `job`, when one was asked
    /// about); its default was used. Reported at most once per key and host every
    /// [`POLICY_ERROR_EVERY`]: the shell logs it.
    PolicyError {
        key: &'static str,
        host: String,
        job: Option<JobId>,
        message: String,
    },
    /// Ask Slurm for a node: submit pilot job `pilot` (`[overflow.slurm]`); report the
    /// answer with [`Allocator::pilot_submitted`] or [`Allocator::pilot_failed`].
    SubmitPilot { pilot: PilotId },
    /// Nobody waits for pilot `pilot` any more and it has not started: `scancel` it.
    CancelPilot { pilot: PilotId, slurm_id: String },
    /// A job restored after a restart ended: its agent did not come back within the
    /// resume window ([`RESUME_WINDOW`]). For the log; its other effects follow.
    AgentLate { job: JobId },
    /// The job's agent said it ended (`Input::End`): tell the agent its end is recorded
    /// once the state that records it is saved (the agent waits for that before it exits;
    /// an end lost with the broker would bring the job back with no agent to end it).
    /// Follows the end's other effects, before [`Effect::Persist`].
    ConfirmEnd { job: JobId },
    /// Durable state changed: write [`Allocator::snapshot`] to the store (the broker's).
    Persist,
}

/// Errors of the admin entry points.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("no host named `{host}` in the lab\nhelp: `rb status` lists the hosts")]
    UnknownHost { host: String },
    #[error("host `{host}` is not allocated to any job; there is nothing to release\nhelp: `rb jobs` shows which job holds which host")]
    NotHeld { host: String },
}

/// Tunables of the allocation mechanism.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocConfig {
    /// Grace given to a job when the policy (not an admin) reclaims one of its hosts.
    pub reclaim_grace: Duration,
    /// How many ended jobs `jobs()` keeps showing before the oldest are forgotten.
    pub ended_jobs_kept: usize,
}

impl Default for AllocConfig {
    fn default() -> Self {
        AllocConfig {
            reclaim_grace: Duration::from_secs(5),
            ended_jobs_kept: 200,
        }
    }
}

/// One row of `rb jobs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobRow {
    pub id: JobId,
    pub user: String,
    /// `"running"` or `"ended"`.
    pub state: &'static str,
    /// Hosts held (granted or being released), in name order.
    pub hosts: Vec<String>,
    pub spec: Option<serde_json::Value>,
    pub argv: Vec<String>,
    pub cwd: String,
    /// Symbolic names of the job's queued requests, in queue order.
    pub queued: Vec<String>,
    /// The job's queued requests with position, age and why each waits, in queue order.
    pub waiting: Vec<WaitingRow>,
    /// How long ago the job registered (`None` when restored after a broker restart).
    #[serde(skip)]
    pub started_ago: Option<Duration>,
    /// How long ago the job ended.
    #[serde(skip)]
    pub ended_ago: Option<Duration>,
}

#[cfg(test)]
mod facts_tests;
#[cfg(test)]
mod overflow_tests;
#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod tests;
