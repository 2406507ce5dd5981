//! The built-in policy: serving the queue head-first, choosing the host for a request, and
//! choosing what to reclaim when nothing is eligible (or when a private host's owner returns).
//!
//! Eligibility of a host for a request: the host is up, matches the symbolic name, is not
//! drained, is not held, is not reserved for another queued request, is not one the
//! requesting job uses already ([`Allocator::uses_hosts`]), and — for a private host — its
//! owner is away ([`HostView::owner_away`]).
//!
//! Which eligible host a request gets (`pick_host`), so that a broad name never
//! takes the host a narrower one needs (MPI launchers ask for `anyLinux,anyHost,anyPublic`
//! at once and wait for all three):
//! 1. a host no other waiting request could use, before one that some could (the fewer the
//!    better): a request does not take a host another waits for when another would do;
//! 2. then the most generic host: the fewest labels (lab file and sensors), so that a name
//!    arriving a moment later still finds the scarce, specific host free;
//! 3. then [`choice_order`] (quiet, least loaded, public, name).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use super::{
    host::{generic_first, HostView, Want},
    state::{AllocState, Allocation, Allocator, Fx, Waiting},
    AllocId, Effect, JobId, RequestId,
};

/// Used when `now + grace` does not fit in an `Instant`.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Allocator {
    /// `Err(reason)` when no host of the lab can ever match `want`. While some host has not
    /// reported yet (its sensor labels are unknown) or no host is known, anything may match.
    pub(crate) fn possible(&self, job: JobId, want: &Want, symbolic: &str) -> Result<(), String> {
        let unsure = self.hosts.is_empty() || self.hosts.values().any(|h| !h.reported);
        if unsure {
            return Ok(());
        }
        let matching: Vec<&str> = self
            .hosts
            .values()
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
            .hosts
            .values()
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
        let mut i = 0;
        while i < self.queue.len() {
            if self.serve_one(i, now, fx) {
                self.queue.remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Handles queue entry `i`; true when it leaves the queue (granted or refused).
    fn serve_one(&mut self, i: usize, now: Instant, fx: &mut Fx) -> bool {
        let w = &self.queue[i];
        if let Err(reason) = self.possible(w.job, &w.want, &w.symbolic) {
            let (job, req) = (w.job, w.id);
            fx.push(Effect::Refused { job, req, reason });
            return true;
        }
        if let Some(host) = self.pick_host(i, fx) {
            if self.queue[i].restored {
                // Nobody waits for it (see `Waiting::restored`): the host stays free.
                fx.dirty = true;
                return true;
            }
            self.grant(i, host, fx);
            return true;
        }
        if self.queue[i].reserved.is_none() && !self.queue[i].restored {
            if let Some(alloc) = self.reclaim_victim(i) {
                let req = self.queue[i].id;
                let host = self.allocs.get(&alloc).map(|a| a.host.clone());
                self.reclaim(alloc, Some(req), self.config.reclaim_grace, now, fx);
                self.queue[i].reserved = host;
            }
        }
        false
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
        let w = &self.queue[i];
        self.hosts
            .values()
            .filter(|v| self.eligible(w, &v.name, &others))
            .map(|v| (self.wanted_by_others(i, &v.name, &others), v))
            .min_by(|(na, a), (nb, b)| na.cmp(nb).then_with(|| generic_first(a, b)))
            .map(|(_, v)| v.name.clone())
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
        self.hosts.get(host).is_some_and(|v| v.usable_for(&w.want))
            && !self.uses(w.job, host)
            && !self.drained.contains(host)
            && !self.by_host.contains_key(host)
            && !reserved.contains(host)
    }

    fn grant(&mut self, i: usize, host: String, fx: &mut Fx) {
        let (job, req, instance) = (self.queue[i].job, self.queue[i].id, self.queue[i].instance);
        let address = self
            .hosts
            .get(&host)
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
        };
        self.allocs.insert(alloc, record);
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
    /// request could use, held by another running adaptive job. The job holding the most
    /// hosts loses (ties: the newest job), its newest allocation first. An adaptive requester
    /// only takes from a job holding at least two more granted hosts than the requester has
    /// (granted, plus hosts already being reclaimed for it), so a move always narrows the gap
    /// and two adaptive jobs never pass a host back and forth.
    fn reclaim_victim(&self, i: usize) -> Option<AllocId> {
        let w = &self.queue[i];
        let counts = self.granted_counts();
        let requester_adaptive = self.jobs.get(&w.job).is_some_and(|j| j.info.adaptive);
        let incoming = self
            .queue
            .iter()
            .filter(|q| q.job == w.job && q.reserved.is_some())
            .count();
        let have = counts.get(&w.job).copied().unwrap_or(0) + incoming;
        self.allocs
            .iter()
            .filter(|(_, a)| self.reclaimable(a, w.job, &w.want))
            .map(|(&id, a)| (counts.get(&a.job).copied().unwrap_or(0), a.job, id))
            .filter(|&(count, _, _)| !requester_adaptive || count >= have + 2)
            .max()
            .map(|(_, _, id)| id)
    }

    /// Granted allocations per job.
    fn granted_counts(&self) -> BTreeMap<JobId, usize> {
        let mut counts = BTreeMap::new();
        for a in self.allocs.values() {
            if a.state == AllocState::Granted {
                *counts.entry(a.job).or_insert(0) += 1;
            }
        }
        counts
    }

    fn reclaimable(&self, a: &Allocation, requester: JobId, want: &Want) -> bool {
        let holder_adaptive = self
            .jobs
            .get(&a.job)
            .is_some_and(|j| j.info.adaptive && j.state == super::JobState::Running);
        a.state == AllocState::Granted
            && a.job != requester
            && !self.uses(requester, &a.host)
            && holder_adaptive
            && !self.drained.contains(&a.host)
            && self
                .hosts
                .get(&a.host)
                .is_some_and(|v: &HostView| v.usable_for(want))
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
        fx.push(Effect::Reclaim {
            job,
            alloc,
            host,
            grace,
        });
    }

    /// Reclaims `host` when an adaptive job holds it and its owner is back (flow 8).
    pub(crate) fn owner_returns(&mut self, host: &str, now: Instant, fx: &mut Fx) {
        let Some(&alloc) = self.by_host.get(host) else {
            return;
        };
        let target = self.allocs.get(&alloc).is_some_and(|a| {
            a.state == AllocState::Granted
                && self.jobs.get(&a.job).is_some_and(|j| j.info.adaptive)
                && self.hosts.get(host).is_some_and(|v| v.owner_active())
        });
        if target {
            self.reclaim(alloc, None, self.config.reclaim_grace, now, fx);
        }
    }

    /// Ends an allocation (→ Released): the host is free for the next serve.
    pub(crate) fn release_alloc(&mut self, alloc: AllocId, fx: &mut Fx) {
        let Some(a) = self.allocs.remove(&alloc) else {
            return;
        };
        self.by_host.remove(&a.host);
        fx.push(Effect::Freed { host: a.host });
    }
}
