//! Read-only views of the allocator for people (`rb jobs`, `rb status`, a waiting `rsh`):
//! each job's row with its waiting requests and why each waits ([`WaitReason`]), and each
//! host's allocation state ([`HostAlloc`]). Pure: `now` is passed in, nothing changes.
//!
//! The wait reason mirrors the eligibility rule of `policy` (up, not drained, not reserved
//! for another request, not held, the policy's `start`): for each host the name matches, the
//! first of those that fails is counted (a reserved host is always held too: it is being
//! taken back); a private host the policy declines while its owner is active counts as
//! `owner_active`.

use std::{
    collections::BTreeSet,
    fmt,
    time::{Duration, Instant},
};

use serde::Serialize;

use super::{
    state::{AllocState, Allocator, Job},
    JobId, JobRow, RequestId,
};

/// Why a queued request has no host yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReason {
    /// `host` is being taken back from job `holder` for this request.
    Reclaiming { host: String, holder: JobId },
    /// No known host matches the name; `unreported` hosts have not reported their labels yet.
    NoHostMatches { unreported: usize },
    /// Every host the name matches is unavailable; how many for each cause.
    Unavailable(Blocked),
    /// The job holds `max` hosts, the most the policy's `max_hosts` allows.
    AtMaxHosts { max: usize },
}

/// Matching hosts counted by the first reason each cannot be granted now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Blocked {
    pub down: usize,
    pub drained: usize,
    pub held: usize,
    /// Being reclaimed for an earlier request.
    pub reserved: usize,
    /// A private host whose owner is active (or whose sessions are unknown).
    pub owner_active: usize,
    /// Eligible as far as these rules go; the policy declined it for another reason.
    pub other: usize,
}

impl Blocked {
    fn causes(&self) -> [(usize, &'static str, &'static str); 6] {
        [
            (self.held, "all_held", "held by jobs"),
            (self.owner_active, "owner_active", "owner active"),
            (self.drained, "drained", "drained"),
            (self.down, "down", "down"),
            (self.reserved, "reserved", "reserved for earlier requests"),
            (self.other, "policy", "declined by the policy"),
        ]
    }

    fn total(&self) -> usize {
        self.causes().iter().map(|c| c.0).sum()
    }
}

impl WaitReason {
    /// A stable machine-readable code: `reclaiming`, `no_host_matches`, `max_hosts`, `all_held`,
    /// `owner_active`, `drained`, `down`, `reserved`, `policy`, or `mixed`.
    pub fn code(&self) -> &'static str {
        match self {
            WaitReason::Reclaiming { .. } => "reclaiming",
            WaitReason::NoHostMatches { .. } => "no_host_matches",
            WaitReason::AtMaxHosts { .. } => "max_hosts",
            WaitReason::Unavailable(b) => {
                let mut present = b.causes().into_iter().filter(|c| c.0 > 0);
                match (present.next(), present.next()) {
                    (Some(only), None) => only.1,
                    _ => "mixed",
                }
            }
        }
    }
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitReason::Reclaiming { host, holder } => {
                write!(f, "taking {host} back from job {holder} for it")
            }
            WaitReason::NoHostMatches { unreported: 0 } => f.write_str("no host matches"),
            WaitReason::AtMaxHosts { max } => write!(
                f,
                "the job holds {max} host(s), the most the policy's max_hosts allows"
            ),
            WaitReason::NoHostMatches { unreported } => write!(
                f,
                "no host matches yet ({unreported} host(s) have not reported their labels)"
            ),
            WaitReason::Unavailable(b) => {
                let parts: Vec<String> = b
                    .causes()
                    .iter()
                    .filter(|c| c.0 > 0)
                    .map(|(n, _, text)| format!("{n} {text}"))
                    .collect();
                write!(f, "{} matching host(s): {}", b.total(), parts.join(", "))
            }
        }
    }
}

/// One waiting request in a [`JobRow`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitingRow {
    pub req: RequestId,
    pub symbolic: String,
    /// 1 = next in line.
    pub position: usize,
    /// Seconds since the request was queued (or restored), to 0.1 s.
    pub age_s: f64,
    /// Why it waits, for people.
    pub reason: String,
    /// [`WaitReason::code`].
    pub reason_code: &'static str,
    /// What overflow onto Slurm does for it (`waits for Slurm: 1 pilot queued`), when the
    /// policy's `overflow` says a pilot is for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm: Option<String>,
}

/// What the allocator does with one host, for `rb status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostAlloc {
    /// `free`, `held`, `releasing` (being taken back), `reserved` (being taken back for a
    /// waiting request), `draining` (drained, still held), `drained`, or `leaving` (a Slurm
    /// pilot's node whose lease ends, no longer held).
    pub alloc_state: &'static str,
    /// The job holding the host (granted or being released).
    pub held_by: Option<JobId>,
    /// True from `rb drain` until `rb resume`.
    pub drained: bool,
}

impl Allocator {
    /// Why queue entry `i` waits.
    pub(crate) fn wait_reason(&self, i: usize) -> WaitReason {
        let w = &self.queue[i];
        if let Some(host) = &w.reserved {
            let holder = self.holder(host).map_or(0, |h| h.0);
            let host = host.clone();
            return WaitReason::Reclaiming { host, holder };
        }
        if let Some(max) = self.at_max_hosts(w.job) {
            return WaitReason::AtMaxHosts { max };
        }
        let others: BTreeSet<&str> = self
            .queue
            .iter()
            .filter(|q| q.id != w.id)
            .filter_map(|q| q.reserved.as_deref())
            .collect();
        let mut b = Blocked::default();
        let mut matching = 0;
        for v in self.views().filter(|v| v.matches(&w.want)) {
            matching += 1;
            let count = match () {
                _ if !v.up => &mut b.down,
                _ if self.closed(&v.name) => &mut b.drained,
                _ if others.contains(v.name.as_str()) => &mut b.reserved,
                _ if self.by_host.contains_key(&v.name) => &mut b.held,
                _ if v.is_private() && !v.owner_away() => &mut b.owner_active,
                _ => &mut b.other,
            };
            *count += 1;
        }
        if matching == 0 {
            let unreported = self.views().filter(|v| !v.reported).count();
            return WaitReason::NoHostMatches { unreported };
        }
        WaitReason::Unavailable(b)
    }

    /// The allocation state of `host` (known or not: an unknown host is `free`).
    pub fn host_alloc(&self, host: &str) -> HostAlloc {
        let drained = self.drained.contains(host);
        let alloc = self.by_host.get(host).and_then(|id| self.allocs.get(id));
        let alloc_state = match alloc.map(|a| &a.state) {
            None if drained => "drained",
            None if self.leaving.contains(host) => "leaving",
            None => "free",
            Some(_) if drained => "draining",
            Some(AllocState::Granted) => "held",
            Some(AllocState::Releasing {
                for_request: Some(r),
                ..
            }) if self.queue.iter().any(|w| w.id == *r) => "reserved",
            Some(AllocState::Releasing { .. }) => "releasing",
        };
        HostAlloc {
            alloc_state,
            held_by: alloc.map(|a| a.job),
            drained,
        }
    }

    /// One row per known job, by id.
    pub fn jobs(&self, now: Instant) -> Vec<JobRow> {
        self.jobs
            .iter()
            .map(|(&id, j)| self.job_row(id, j, now))
            .collect()
    }

    fn job_row(&self, id: JobId, j: &Job, now: Instant) -> JobRow {
        let mut hosts: Vec<String> = self
            .allocs_of(id)
            .filter_map(|a| self.allocs.get(&a).map(|a| a.host.clone()))
            .collect();
        hosts.sort();
        let waiting: Vec<WaitingRow> = (0..self.queue.len())
            .filter(|&i| self.queue[i].job == id)
            .map(|i| self.waiting_row(i, now))
            .collect();
        JobRow {
            id,
            user: j.info.user.clone(),
            state: j.state.as_str(),
            hosts,
            spec: j.info.spec.clone(),
            argv: j.info.argv.clone(),
            cwd: j.info.cwd.clone(),
            queued: waiting.iter().map(|w| w.symbolic.clone()).collect(),
            waiting,
            started_ago: j.started.map(|t| now.saturating_duration_since(t)),
            ended_ago: j.ended.map(|t| now.saturating_duration_since(t)),
        }
    }

    fn waiting_row(&self, i: usize, now: Instant) -> WaitingRow {
        let w = &self.queue[i];
        let reason = self.wait_reason(i);
        WaitingRow {
            slurm: self.slurm_note(w, now),
            req: w.id,
            symbolic: w.symbolic.clone(),
            position: i + 1,
            age_s: tenths(now.saturating_duration_since(w.since)),
            reason: reason.to_string(),
            reason_code: reason.code(),
        }
    }
}

fn tenths(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
