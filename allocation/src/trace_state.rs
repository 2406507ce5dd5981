//! [`TraceState`]: the allocator's whole state at one instant as plain data — the record
//! that opens each decision-trace file (`trace`), from which `rb policy replay` rebuilds an
//! [`Allocator`] that decides exactly as the live one did from there on.
//!
//! Unlike a [`Snapshot`](crate::Snapshot) (the durable part, for the store), it keeps the soft
//! state too: host views, hosts in use, when jobs started and ended, every detail of the
//! queue (reservations, positions reported, restored requests), reclaim deadlines and the
//! wall clock. Instants are microseconds on the trace's clock ([`TraceClock`]). Not kept:
//! the policy (the replay brings its own) and the rate-limit memory of policy errors.

use std::{collections::BTreeSet, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::{
    host::{HostView, Want},
    state::{AllocState, Allocation, Allocator, Job, KnownHost, Waiting},
    trace::TraceClock,
    AllocConfig, AllocId, JobId, JobInfo, JobState, RequestId,
};

/// The allocator's whole state (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceState {
    /// The policy in force (sha256 of its file).
    pub policy_sha256: String,
    pub reclaim_grace_us: u64,
    pub ended_jobs_kept: usize,
    pub next_job: JobId,
    pub next_alloc: AllocId,
    pub next_request: RequestId,
    pub jobs: Vec<TraceJob>,
    pub allocations: Vec<TraceAlloc>,
    /// First in line first.
    pub queue: Vec<TraceWaiting>,
    /// Shared with the allocator: taking the state copies no view.
    pub hosts: Vec<Arc<HostView>>,
    pub drained: Vec<String>,
    /// Hosts whose Slurm lease ends (absent from traces that predate it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaving: Vec<String>,
    /// Hosts each job uses without holding them.
    pub in_use: Vec<(JobId, Vec<String>)>,
    pub wall: Option<TraceWall>,
    /// Jobs restored after a restart whose agents have not come back, with the end of
    /// their resume window (absent from traces that predate it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting: Vec<(JobId, u64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceJob {
    pub id: JobId,
    pub info: JobInfo,
    pub state: JobState,
    pub started_us: Option<u64>,
    pub ended_us: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceAlloc {
    pub id: AllocId,
    pub job: JobId,
    pub host: String,
    pub address: String,
    pub request: Option<RequestId>,
    pub releasing: Option<TraceReleasing>,
    /// When it was granted (`held_for_s`); absent from traces that predate it (read as
    /// the trace's epoch).
    #[serde(default)]
    pub since_us: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceReleasing {
    pub deadline_us: u64,
    pub grace_us: u64,
    pub for_request: Option<RequestId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceWaiting {
    pub id: RequestId,
    pub job: JobId,
    pub symbolic: String,
    /// The label the name asks for; `None` for `anyHost`.
    pub label: Option<String>,
    pub instance: Option<u32>,
    pub reserved: Option<String>,
    pub reported: Option<usize>,
    pub since_us: u64,
    pub restored: bool,
}

/// The wall clock the shell gave ([`Allocator::set_wall_clock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceWall {
    pub at_us: u64,
    pub unix: i64,
    pub utc_offset_s: i64,
}

impl Allocator {
    /// The whole state, instants on `clock`.
    pub fn trace_state(&self, clock: &TraceClock) -> TraceState {
        TraceState {
            policy_sha256: self.policy.sha256().to_string(),
            reclaim_grace_us: micros(self.config.reclaim_grace),
            ended_jobs_kept: self.config.ended_jobs_kept,
            next_job: self.next_job,
            next_alloc: self.next_alloc,
            next_request: self.next_request,
            jobs: self
                .jobs
                .iter()
                .map(|(&id, j)| trace_job(id, j, clock))
                .collect(),
            allocations: self
                .allocs
                .iter()
                .map(|(&id, a)| trace_alloc(id, a, clock))
                .collect(),
            queue: self.queue.iter().map(|w| trace_waiting(w, clock)).collect(),
            hosts: self
                .hosts
                .values()
                .map(|known| Arc::clone(&known.view))
                .collect(),
            drained: self.drained.iter().cloned().collect(),
            leaving: self.leaving.iter().cloned().collect(),
            in_use: self
                .in_use
                .iter()
                .map(|(&j, h)| (j, h.iter().cloned().collect()))
                .collect(),
            wall: self.wall_clock().map(|(at, unix, utc_offset_s)| TraceWall {
                at_us: clock.us(at),
                unix,
                utc_offset_s,
            }),
            awaiting: self
                .awaiting
                .iter()
                .map(|(&j, &deadline)| (j, clock.us(deadline)))
                .collect(),
        }
    }

    /// Rebuilds the allocator a [`TraceState`] describes, deciding with `policy`.
    pub fn from_trace_state(
        s: TraceState,
        policy: std::sync::Arc<policies::Policy>,
        clock: &TraceClock,
    ) -> Allocator {
        let config = AllocConfig {
            reclaim_grace: std::time::Duration::from_micros(s.reclaim_grace_us),
            ended_jobs_kept: s.ended_jobs_kept,
        };
        let mut a = Allocator::with_config(config);
        a.policy = policy;
        a.next_job = s.next_job;
        a.next_alloc = s.next_alloc;
        a.next_request = s.next_request;
        for j in s.jobs {
            let job = Job {
                info: j.info,
                state: j.state,
                started: j.started_us.map(|t| clock.instant(t)),
                ended: j.ended_us.map(|t| clock.instant(t)),
            };
            a.jobs.insert(j.id, job);
        }
        for r in s.allocations {
            a.by_host.insert(r.host.clone(), r.id);
            a.allocs.insert(r.id, restore_alloc(r, clock));
        }
        a.queue = s
            .queue
            .into_iter()
            .map(|w| restore_waiting(w, clock))
            .collect();
        a.drained = s.drained.into_iter().collect();
        a.leaving = s.leaving.into_iter().collect();
        a.in_use = s
            .in_use
            .into_iter()
            .map(|(j, h)| (j, h.into_iter().collect::<BTreeSet<_>>()))
            .collect();
        a.awaiting = s
            .awaiting
            .into_iter()
            .map(|(j, t)| (j, clock.instant(t)))
            .collect();
        if let Some(w) = s.wall {
            a.set_wall_clock(clock.instant(w.at_us), w.unix, w.utc_offset_s);
        }
        for view in s.hosts {
            let known = KnownHost::shared(view);
            a.hosts.insert(known.view.name.clone(), known);
        }
        let names: Vec<String> = a.hosts.keys().map(|h| h.to_string()).collect();
        for host in &names {
            a.rebuild_host(host);
        }
        a
    }
}

fn trace_job(id: JobId, j: &Job, clock: &TraceClock) -> TraceJob {
    TraceJob {
        id,
        info: j.info.clone(),
        state: j.state,
        started_us: j.started.map(|t| clock.us(t)),
        ended_us: j.ended.map(|t| clock.us(t)),
    }
}

fn trace_alloc(id: AllocId, a: &Allocation, clock: &TraceClock) -> TraceAlloc {
    let releasing = match a.state {
        AllocState::Granted => None,
        AllocState::Releasing {
            deadline,
            grace,
            for_request,
        } => Some(TraceReleasing {
            deadline_us: clock.us(deadline),
            grace_us: micros(grace),
            for_request,
        }),
    };
    TraceAlloc {
        id,
        job: a.job,
        host: a.host.clone(),
        address: a.address.clone(),
        request: a.request,
        releasing,
        since_us: clock.us(a.since),
    }
}

fn restore_alloc(r: TraceAlloc, clock: &TraceClock) -> Allocation {
    let state = match r.releasing {
        None => AllocState::Granted,
        Some(rel) => AllocState::Releasing {
            deadline: clock.instant(rel.deadline_us),
            grace: std::time::Duration::from_micros(rel.grace_us),
            for_request: rel.for_request,
        },
    };
    Allocation {
        job: r.job,
        host: r.host,
        address: r.address,
        request: r.request,
        state,
        since: clock.instant(r.since_us),
    }
}

fn trace_waiting(w: &Waiting, clock: &TraceClock) -> TraceWaiting {
    TraceWaiting {
        id: w.id,
        job: w.job,
        symbolic: w.symbolic.clone(),
        label: match &w.want {
            Want::Any => None,
            Want::Label(l) => Some(l.clone()),
        },
        instance: w.instance,
        reserved: w.reserved.clone(),
        reported: w.reported,
        since_us: clock.us(w.since),
        restored: w.restored,
    }
}

fn restore_waiting(w: TraceWaiting, clock: &TraceClock) -> Waiting {
    Waiting {
        id: w.id,
        job: w.job,
        symbolic: w.symbolic,
        want: w.label.map_or(Want::Any, Want::Label),
        instance: w.instance,
        reserved: w.reserved,
        reported: w.reported,
        since: clock.instant(w.since_us),
        restored: w.restored,
    }
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
