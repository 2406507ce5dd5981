//! [`Snapshot`]: the durable part of the allocator as plain data (what the store writes),
//! [`Allocator::snapshot`] / [`Allocator::restore`], and [`Allocator::check_invariants`].
//!
//! Not in a snapshot: host views (soft state, rebuilt from reports) and queue positions
//! already reported (after a restore every queued request's position is reported again).
//! Reclaim deadlines are stored as the grace given, not as instants; a restore re-arms each
//! as `now + grace`.

use std::{collections::BTreeSet, time::Duration, time::Instant};

use serde::{Deserialize, Serialize};

use super::{
    state::{AllocState, Allocation, Allocator, Job, Waiting},
    AllocConfig, AllocId, JobId, JobInfo, JobState, RequestId,
};

/// The allocator's durable state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub next_job: JobId,
    pub next_alloc: AllocId,
    pub next_request: RequestId,
    pub jobs: Vec<JobRecord>,
    pub allocations: Vec<AllocRecord>,
    /// Queued requests, first in line first.
    pub requests: Vec<RequestRecord>,
    pub drained: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    pub info: JobInfo,
    pub state: JobState,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocRecord {
    pub id: AllocId,
    pub job: JobId,
    pub host: String,
    pub address: String,
    pub request: Option<RequestId>,
    /// Set while the allocation is being released.
    pub releasing: Option<ReleasingRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleasingRecord {
    pub grace: Duration,
    /// The queued request the host is reclaimed for (it is first in line for the host).
    pub for_request: Option<RequestId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub id: RequestId,
    pub job: JobId,
    pub symbolic: String,
}

impl Allocator {
    /// The durable state, for the store.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            next_job: self.next_job,
            next_alloc: self.next_alloc,
            next_request: self.next_request,
            jobs: self.jobs.iter().map(|(&id, j)| job_record(id, j)).collect(),
            allocations: self
                .allocs
                .iter()
                .map(|(&id, a)| alloc_record(id, a))
                .collect(),
            requests: self.queue.iter().map(request_record).collect(),
            drained: self.drained.iter().cloned().collect(),
        }
    }

    /// Rebuilds an allocator from a snapshot. Records that contradict the others (an
    /// allocation of a job that is not running, a second allocation of one host, a request
    /// with a bad name) are dropped; the second value says which, for the log. Restored
    /// requests wait for nobody (agents re-send theirs): they are never granted. Call
    /// [`host_changed`](Self::host_changed) for each host next, then
    /// [`resend_reclaims`](Self::resend_reclaims).
    pub fn restore(s: Snapshot, config: AllocConfig, now: Instant) -> (Allocator, Vec<String>) {
        let mut a = Allocator::with_config(config);
        let mut dropped = Vec::new();
        for j in s.jobs {
            let job = Job {
                info: j.info,
                state: j.state,
                started: None,
                ended: None,
            };
            a.jobs.insert(j.id, job);
        }
        for r in s.allocations {
            if let Err(why) = a.restore_alloc(r, now) {
                dropped.push(why);
            }
        }
        for r in s.requests {
            if let Err(why) = a.restore_request(r, now) {
                dropped.push(why);
            }
        }
        a.forget_stale_reservations();
        a.drained = s.drained.into_iter().collect();
        a.next_job = s.next_job.max(a.jobs.keys().max().map_or(1, |m| m + 1));
        a.next_alloc = s.next_alloc.max(a.allocs.keys().max().map_or(1, |m| m + 1));
        let top_req = a.queue.iter().map(|w| w.id).max().map_or(1, |m| m + 1);
        a.next_request = s.next_request.max(top_req);
        (a, dropped)
    }

    fn restore_alloc(&mut self, r: AllocRecord, now: Instant) -> Result<(), String> {
        let what = format!("allocation {} (host {}, job {})", r.id, r.host, r.job);
        if !self.is_running(r.job) {
            return Err(format!("{what}: the job is not running"));
        }
        if self.by_host.contains_key(&r.host) || self.allocs.contains_key(&r.id) {
            return Err(format!("{what}: the host or id is already in use"));
        }
        let state = match r.releasing {
            None => AllocState::Granted,
            Some(rel) => AllocState::Releasing {
                deadline: now.checked_add(rel.grace).unwrap_or(now),
                grace: rel.grace,
                for_request: rel.for_request,
            },
        };
        self.by_host.insert(r.host.clone(), r.id);
        let alloc = Allocation {
            job: r.job,
            host: r.host,
            address: r.address,
            request: r.request,
            state,
            // Not in the store: `held_for_s` counts from the restore.
            since: now,
        };
        self.allocs.insert(r.id, alloc);
        Ok(())
    }

    /// Queues a restored request; its reservation is derived from the allocation being
    /// reclaimed for it, if any.
    fn restore_request(&mut self, r: RequestRecord, now: Instant) -> Result<(), String> {
        let what = format!("request {} ({}, job {})", r.id, r.symbolic, r.job);
        if !self.is_running(r.job) {
            return Err(format!("{what}: the job is not running"));
        }
        if self.queue.iter().any(|w| w.id == r.id) {
            return Err(format!("{what}: duplicate id"));
        }
        let wanted = self
            .parse_name(&r.symbolic)
            .map_err(|e| format!("{what}: {e}"))?;
        let reserved = self.allocs.values().find_map(|a| match a.state {
            AllocState::Releasing {
                for_request: Some(q),
                ..
            } if q == r.id => Some(a.host.clone()),
            _ => None,
        });
        self.queue.push(Waiting {
            id: r.id,
            job: r.job,
            symbolic: r.symbolic,
            want: wanted.want,
            instance: wanted.instance,
            reserved,
            reported: None,
            since: now,
            restored: true,
        });
        Ok(())
    }

    /// A corrupt snapshot may name one request in two reclaims: only the reservation the
    /// request holds stays linked to it.
    fn forget_stale_reservations(&mut self) {
        for a in self.allocs.values_mut() {
            if let AllocState::Releasing { for_request, .. } = &mut a.state {
                let stale = for_request.is_some_and(|r| {
                    self.queue
                        .iter()
                        .any(|w| w.id == r && w.reserved.as_deref() != Some(a.host.as_str()))
                });
                if stale {
                    *for_request = None;
                }
            }
        }
    }

    /// Checks the allocator's invariants; `Err` names the first one broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_allocations()?;
        self.check_queue()?;
        self.check_no_idle_host_for_a_waiting_request()?;
        self.check_host_decisions()?;
        let ended = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Ended)
            .count();
        if ended > self.config.ended_jobs_kept {
            return Err(format!("{ended} ended jobs kept"));
        }
        if let Some(job) = self.in_use.keys().find(|j| !self.is_running(**j)) {
            return Err(format!("job {job} is not running but has hosts in use"));
        }
        match self.jobs.keys().next_back() {
            Some(&top) if top >= self.next_job => Err(format!("job id {top} ≥ next id")),
            _ => Ok(()),
        }
    }

    /// Every host's cached `start` and `rank` are what the policy in force gives on its
    /// cached value (decisions are reused when the fields they read did not change), and
    /// the value holds every field the policy may read.
    fn check_host_decisions(&self) -> Result<(), String> {
        for (name, entry) in &self.inputs.hosts {
            if !entry.value.holds(self.policy.host_value_fields()) {
                return Err(format!(
                    "{name}: the cached value lacks fields the policy reads"
                ));
            }
            let (start, rank) = crate::inputs::decisions(&self.policy, &entry.value);
            let bits = |r: Option<f64>| r.map(f64::to_bits);
            if start != entry.start || bits(rank) != bits(entry.rank) {
                return Err(format!(
                    "{name}: cached start/rank {:?}/{:?}, the policy gives {start:?}/{rank:?}",
                    entry.start, entry.rank
                ));
            }
        }
        Ok(())
    }

    fn check_allocations(&self) -> Result<(), String> {
        if self.by_host.len() != self.allocs.len() {
            return Err("a host is in two live allocations (host index size differs)".into());
        }
        for (&id, a) in &self.allocs {
            if self.by_host.get(&a.host) != Some(&id) {
                return Err(format!(
                    "allocation {id}: host {} not indexed to it",
                    a.host
                ));
            }
            if !self.is_running(a.job) {
                return Err(format!(
                    "allocation {id} belongs to job {} not running",
                    a.job
                ));
            }
            if id >= self.next_alloc {
                return Err(format!("allocation id {id} ≥ next id"));
            }
            if let AllocState::Releasing {
                for_request: Some(r),
                ..
            } = a.state
            {
                let w = self.queue.iter().find(|w| w.id == r);
                if w.is_some_and(|w| w.reserved.as_deref() != Some(&a.host)) {
                    return Err(format!(
                        "request {r} waits for {} but does not reserve it",
                        a.host
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_queue(&self) -> Result<(), String> {
        let mut ids = BTreeSet::new();
        let mut reserved = BTreeSet::new();
        for (i, w) in self.queue.iter().enumerate() {
            if !ids.insert(w.id) || w.id >= self.next_request {
                return Err(format!("request id {} duplicated or ≥ next id", w.id));
            }
            if !self.is_running(w.job) {
                return Err(format!(
                    "request {} belongs to job {} not running",
                    w.id, w.job
                ));
            }
            if w.reported.is_some_and(|p| p != i + 1) {
                return Err(format!("request {} position {} not reported", w.id, i + 1));
            }
            if let Some(h) = &w.reserved {
                self.check_reservation(w.id, h)?;
                if !reserved.insert(h) {
                    return Err(format!("host {h} reserved twice"));
                }
            }
        }
        Ok(())
    }

    /// Work conservation: no request waits while a host it could be granted sits free
    /// (unless its job is at the policy's `max_hosts`).
    fn check_no_idle_host_for_a_waiting_request(&self) -> Result<(), String> {
        for (i, w) in self.queue.iter().enumerate() {
            if self.at_max_hosts(w.job).is_some() {
                continue;
            }
            let others = self.reserved_except(i);
            if let Some(h) = self.hosts.keys().find(|h| self.eligible(w, h, &others)) {
                return Err(format!(
                    "request {} ({}) waits while {h} could be granted to it",
                    w.id, w.symbolic
                ));
            }
        }
        Ok(())
    }

    fn check_reservation(&self, req: RequestId, host: &str) -> Result<(), String> {
        let ok = self
            .by_host
            .get(host)
            .and_then(|id| self.allocs.get(id))
            .is_some_and(|a| {
                matches!(a.state, AllocState::Releasing { for_request: Some(r), .. } if r == req)
            });
        if ok {
            Ok(())
        } else {
            Err(format!(
                "request {req} reserves {host}, which is not being reclaimed for it"
            ))
        }
    }
}

fn job_record(id: JobId, j: &Job) -> JobRecord {
    JobRecord {
        id,
        info: j.info.clone(),
        state: j.state,
    }
}

fn alloc_record(id: AllocId, a: &Allocation) -> AllocRecord {
    let releasing = match a.state {
        AllocState::Granted => None,
        AllocState::Releasing {
            grace, for_request, ..
        } => Some(ReleasingRecord { grace, for_request }),
    };
    AllocRecord {
        id,
        job: a.job,
        host: a.host.clone(),
        address: a.address.clone(),
        request: a.request,
        releasing,
    }
}

fn request_record(w: &Waiting) -> RequestRecord {
    RequestRecord {
        id: w.id,
        job: w.job,
        symbolic: w.symbolic.clone(),
    }
}
