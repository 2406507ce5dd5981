//! Serving the queue head-first, choosing the host for a request, and choosing what to
//! reclaim when nothing is eligible or when the policy's `vacate` sends a holder away. The
//! mechanism is here; the decisions are the policy file's (`Allocator::policy`, default the
//! shipped `paper`), evaluated on cached inputs (`inputs`).
//!
//! Eligibility of a host for a request: Rust filters first — the host is up, matches the
//! symbolic name, is not drained, is not held, is not reserved for another queued request,
//! is not one the requesting job uses already ([`Allocator::uses_hosts`]) — then the
//! policy's `start` (cached per report when it reads only `host`).
//!
//! Which eligible host a request gets (`pick_host`), so that a broad name never
//! takes the host a narrower one needs (MPI launchers ask for `anyLinux,anyHost,anyPublic`
//! at once and wait for all three):
//! 1. a host no other waiting request could use, before one that some could (the fewer the
//!    better): a request does not take a host another waits for when another would do;
//! 2. then the most generic host: the fewest labels (lab file and sensors), so that a name
//!    arriving a moment later still finds the scarce, specific host free;
//! 3. then the policy's `rank`, higher first (the paper's is today's choice order: quiet,
//!    least loaded, public), then the name.
//!
//! With no other request queued, rule 1 is moot and the free hosts are already kept in that
//! order (`free`): a grant walks the best few and evaluates the job-dependent rest of
//! `start` on those only; otherwise every host is looked at (`pick_scan`).
//!
//! The queue is served first to last; when the policy sets `priority`, it is first ordered
//! by it (higher first, equal in arrival order) at each serve.
//!
//! A job holding as many hosts as the policy's `max_hosts` allows (counting hosts being
//! reclaimed for it) gets no more: its requests wait (reason `max_hosts`).
//!
//! What to reclaim for a waiting request: a granted host the request could start on, held
//! by another running job the policy's `may_preempt` allows taking from; the highest
//! `preempt_rank` loses (ties: the newest job, its newest allocation). The grace of every
//! reclaim is the lab's (or the admin's) unless the policy's `grace_s` ends earlier.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use policies::{Answer, Hook};

use super::{
    host::{HostView, Want},
    state::{AllocState, Allocation, Allocator, Fx, Waiting},
    AllocId, Effect, JobId, RequestId,
};

/// Used when `now + grace` does not fit in an `Instant`.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Allocator {
    /// `Err(reason)` when no host of the lab can ever match `want`. While some host has not
    /// reported yet (its sensor labels are unknown) or no host is known, anything may match.
    pub(crate) fn possible(&self, job: JobId, want: &Want, symbolic: &str) -> Result<(), String> {
        // The usual case, without a scan of the whole lab: a host matches that the job does
        // not use (then none of the refusals below applies).
        let usable = |v: &HostView| v.matches(want) && !self.uses(job, &v.name);
        if self.views().any(usable) {
            return Ok(());
        }
        let unsure = self.hosts.is_empty() || self.views().any(|h| !h.reported);
        if unsure {
            return Ok(());
        }
        let matching: Vec<&str> = self
            .views()
            .filter(|v| v.matches(want))
            .map(|v| v.name.as_str())
            .collect();
        if !matching.is_empty() && matching.iter().all(|h| self.uses(job, h)) {
            return Err(format!(
                "every host that `{symbolic}` matches ({}) is one this job uses already \
                 (the machine it runs on, or one it added by name)\nhelp: ask for a name \
                 more hosts match, e.g. anyHost",
                matching.join(", ")
            ));
        }
        let Want::Label(label) = want else {
            return Ok(());
        };
        if !matching.is_empty() {
            return Ok(());
        }
        let labels: BTreeSet<&str> = self
            .views()
            .flat_map(|h| h.labels.iter().map(String::as_str))
            .collect();
        let list = labels.into_iter().collect::<Vec<_>>().join(", ");
        Err(format!(
            "no host in the lab has the label `{label}` that `{symbolic}` asks for; \
             labels in this lab: {list}\nhelp: use anyHost for any machine, or any<Label> \
             with one of those labels"
        ))
    }

    /// Serves the queue head-first: grant, refuse, or start one reclaim per waiting request.
    pub(crate) fn serve(&mut self, now: Instant, fx: &mut Fx) {
        self.refresh(now);
        self.order_queue();
        let mut i = 0;
        while i < self.queue.len() {
            if self.serve_one(i, now, fx) {
                self.queue.remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Orders the queue by the policy's `priority` (higher first; equal: arrival order) when
    /// the file sets one; else it stays in arrival order.
    fn order_queue(&mut self) {
        if !self.policy.is_set(Hook::Priority) || self.queue.len() < 2 {
            return;
        }
        let jobs: BTreeSet<JobId> = self.queue.iter().map(|w| w.job).collect();
        let prio: BTreeMap<JobId, f64> = jobs.into_iter().map(|j| (j, self.priority(j))).collect();
        self.queue
            .sort_by(|a, b| prio[&b.job].total_cmp(&prio[&a.job]));
    }

    /// Refuses entry `i` when no host can ever serve it ([`Allocator::possible`]); true
    /// when refused.
    fn refuse_if_impossible(&mut self, i: usize, fx: &mut Fx) -> bool {
        let w = &self.queue[i];
        match self.possible(w.job, &w.want, &w.symbolic) {
            Ok(()) => false,
            Err(reason) => {
                let (job, req) = (w.job, w.id);
                fx.push(Effect::Refused { job, req, reason });
                true
            }
        }
    }

    /// Handles queue entry `i`; true when it leaves the queue (granted or refused).
    fn serve_one(&mut self, i: usize, now: Instant, fx: &mut Fx) -> bool {
        if self.at_max_hosts(self.queue[i].job).is_some() {
            if self.refuse_if_impossible(i, fx) {
                return true;
            }
            self.drop_free_reservation(i, fx);
            return false;
        }
        // A host found means the request is possible: `possible` (a scan of every host) is
        // asked only when none is.
        if let Some(host) = self.pick_host(i, fx) {
            if self.queue[i].restored {
                // Nobody waits for it (see `Waiting::restored`): the host stays free.
                fx.dirty = true;
                return true;
            }
            self.grant(i, host, now, fx);
            return true;
        }
        if self.refuse_if_impossible(i, fx) {
            return true;
        }
        if self.queue[i].reserved.is_none() && !self.queue[i].restored {
            if let Some(alloc) = self.reclaim_victim(i) {
                let req = self.queue[i].id;
                let (holder, host) = self
                    .allocs
                    .get(&alloc)
                    .map_or((0, String::new()), |a| (a.job, a.host.clone()));
                let grace = self.grace_for(holder, &host, self.config.reclaim_grace);
                self.reclaim(alloc, Some(req), grace, now, fx);
                self.queue[i].reserved = Some(host);
                let job = self.queue[i].job;
                self.touch_job(job);
            }
        }
        false
    }

    /// Forgets entry `i`'s reservation once its host is free (the entry cannot take it: its
    /// job is at its `max_hosts`), so that the host serves the next request.
    fn drop_free_reservation(&mut self, i: usize, fx: &mut Fx) {
        let free = matches!(&self.queue[i].reserved, Some(h) if !self.by_host.contains_key(h));
        if free {
            self.queue[i].reserved = None;
            fx.dirty = true;
        }
    }

    /// The host to grant entry `i` now: its reserved host once free and still eligible,
    /// else the best eligible host. A reservation whose host is free is used up either way.
    fn pick_host(&mut self, i: usize, fx: &mut Fx) -> Option<String> {
        let freed = match &self.queue[i].reserved {
            Some(h) if !self.by_host.contains_key(h) => Some(h.clone()),
            _ => None,
        };
        if let Some(h) = freed {
            self.queue[i].reserved = None;
            fx.dirty = true;
            let others = self.reserved_except(i);
            if self.eligible(&self.queue[i], &h, &others) {
                return Some(h);
            }
        }
        let others = self.reserved_except(i);
        if self.queue.len() == 1 {
            // No other request competes: the best few hosts of the free-host order decide.
            return self.pick_free(&self.queue[i], &others);
        }
        self.pick_scan(i, &others)
    }

    /// [`pick_host`](Self::pick_host) by looking at every host.
    pub(crate) fn pick_scan(&self, i: usize, others: &BTreeSet<String>) -> Option<String> {
        let w = &self.queue[i];
        self.hosts
            .keys()
            .filter(|h| self.eligible(w, h, others))
            .map(|h| {
                let labels = self.host_view(h).map_or(0, HostView::label_count);
                let wanted = self.wanted_by_others(i, h, others);
                (wanted, labels, self.rank(w.job, h), h)
            })
            .min_by(|a, b| {
                (a.0, a.1)
                    .cmp(&(b.0, b.1))
                    .then_with(|| b.2.total_cmp(&a.2))
                    .then_with(|| a.3.cmp(b.3))
            })
            .map(|(_, _, _, h)| h.to_string())
    }

    /// How many queued requests other than entry `i` could be granted `host` now.
    fn wanted_by_others(&self, i: usize, host: &str, reserved: &BTreeSet<String>) -> usize {
        self.queue
            .iter()
            .enumerate()
            .filter(|&(j, w)| j != i && self.eligible(w, host, reserved))
            .count()
    }

    /// Hosts reserved by queue entries other than `i`.
    pub(crate) fn reserved_except(&self, i: usize) -> BTreeSet<String> {
        self.queue
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, w)| w.reserved.clone())
            .collect()
    }

    /// Whether `host` can be granted now for queue entry `w` (hosts in `reserved` are kept for
    /// other entries).
    pub(crate) fn eligible(&self, w: &Waiting, host: &str, reserved: &BTreeSet<String>) -> bool {
        self.host_view(host)
            .is_some_and(|v| v.up && v.matches(&w.want))
            && !self.uses(w.job, host)
            && !self.closed(host)
            && !self.by_host.contains_key(host)
            && !reserved.contains(host)
            && self.starts(w.job, host)
    }

    fn grant(&mut self, i: usize, host: String, now: Instant, fx: &mut Fx) {
        let (job, req, instance) = (self.queue[i].job, self.queue[i].id, self.queue[i].instance);
        let address = self
            .host_view(&host)
            .map_or_else(|| host.clone(), |v| v.address.clone());
        let alloc = self.next_alloc;
        self.next_alloc += 1;
        self.by_host.insert(host.clone(), alloc);
        let record = Allocation {
            job,
            host: host.clone(),
            address: address.clone(),
            request: Some(req),
            state: AllocState::Granted,
            since: now,
        };
        self.allocs.insert(alloc, record);
        self.rebuild_host(&host);
        self.touch_job(job);
        fx.push(Effect::Granted {
            job,
            req,
            alloc,
            host,
            address,
            instance,
        });
    }

    /// The allocation to reclaim for entry `i`, if the policy allows one: a granted host the
    /// request could start on, held by another running job that `may_preempt` lets the
    /// requester take from. The highest `preempt_rank` loses (the paper's: the job holding
    /// the most hosts, then the newest); ties: the newest job, its newest allocation.
    fn reclaim_victim(&self, i: usize) -> Option<AllocId> {
        let w = &self.queue[i];
        self.allocs
            .iter()
            .filter(|(_, a)| self.reclaimable(a, w.job, &w.want))
            .filter(|(_, a)| self.may_preempt(w.job, a))
            .map(|(&id, a)| (self.preempt_rank(w.job, a), a.job, id))
            .max_by(|a, b| {
                a.0.total_cmp(&b.0)
                    .then_with(|| (a.1, a.2).cmp(&(b.1, b.2)))
            })
            .map(|(_, _, id)| id)
    }

    fn may_preempt(&self, requester: JobId, a: &Allocation) -> bool {
        self.decide(Hook::MayPreempt, requester, &a.host, Some(a.job))
            .and_then(Answer::as_bool)
            .unwrap_or(false)
    }

    fn preempt_rank(&self, requester: JobId, a: &Allocation) -> f64 {
        self.decide(Hook::PreemptRank, requester, &a.host, Some(a.job))
            .and_then(Answer::as_number)
            .unwrap_or(0.0)
    }

    fn reclaimable(&self, a: &Allocation, requester: JobId, want: &Want) -> bool {
        let holder_running = self
            .jobs
            .get(&a.job)
            .is_some_and(|j| j.state == super::JobState::Running);
        a.state == AllocState::Granted
            && a.job != requester
            && !self.uses(requester, &a.host)
            && holder_running
            && !self.closed(&a.host)
            && self
                .host_view(&a.host)
                .is_some_and(|v| v.up && v.matches(want))
            && self.starts(requester, &a.host)
    }

    /// Asks the holder of `alloc` to release it within `grace`. An allocation already being
    /// released only gets an earlier deadline (and a new `Reclaim`), never a later one.
    pub(crate) fn reclaim(
        &mut self,
        alloc: AllocId,
        for_request: Option<RequestId>,
        grace: Duration,
        now: Instant,
        fx: &mut Fx,
    ) {
        let Some(a) = self.allocs.get_mut(&alloc) else {
            return;
        };
        let deadline = now
            .checked_add(grace)
            .or_else(|| now.checked_add(FAR_FUTURE))
            .unwrap_or(now);
        match &mut a.state {
            AllocState::Granted => {
                a.state = AllocState::Releasing {
                    deadline,
                    grace,
                    for_request,
                };
            }
            AllocState::Releasing {
                deadline: d,
                grace: g,
                ..
            } => {
                if deadline >= *d {
                    return;
                }
                (*d, *g) = (deadline, grace);
            }
        }
        let (job, host) = (a.job, a.host.clone());
        self.touch_job(job);
        fx.push(Effect::Reclaim {
            job,
            alloc,
            host,
            grace,
        });
    }

    /// Reclaims `host` when the policy's `vacate` sends its holder away (the paper: an
    /// adaptive job on a private host whose owner is back, flow 8), with `grace_s` when it
    /// ends before the lab's grace. A host already being released only gets an earlier
    /// deadline.
    pub(crate) fn vacate_if_asked(&mut self, host: &str, now: Instant, fx: &mut Fx) {
        let Some(job) = self.by_host.get(host).and_then(|id| self.allocs.get(id)) else {
            return;
        };
        let (alloc, job) = (self.by_host[host], job.job);
        let vacate = self.host_view(host).is_some_and(|v| v.up)
            && self
                .decide(Hook::Vacate, job, host, None)
                .and_then(Answer::as_bool)
                .unwrap_or(false);
        if vacate {
            let grace = self.grace_for(job, host, self.config.reclaim_grace);
            self.reclaim(alloc, None, grace, now, fx);
        }
    }

    /// Ends an allocation (→ Released): the host is free for the next serve.
    pub(crate) fn release_alloc(&mut self, alloc: AllocId, fx: &mut Fx) {
        let Some(a) = self.allocs.remove(&alloc) else {
            return;
        };
        if self.ending.remove(&alloc) {
            self.ending_changes += 1;
        }
        self.by_host.remove(&a.host);
        self.rebuild_host(&a.host);
        self.touch_job(a.job);
        fx.push(Effect::Freed { host: a.host });
    }
}
