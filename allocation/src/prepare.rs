//! A policy change in two steps, so that the allocator's owner is busy only with what
//! changed: [`HostInputs::prepare`] works out the new policy's host-only decisions for every
//! host (the expensive part: two evaluations per host) and the free-host order they give,
//! anywhere — off the broker's core, beside the file's load and check — from a copy of the
//! cached host values ([`Allocator::policy_inputs`]); then [`Allocator::set_prepared_policy`]
//! swaps them in, redecides the hosts whose values changed in between, and does the rest
//! of [`Allocator::set_policy`] (vacate, serve).
//!
//! A host's cached entry is rebuilt (a new `Arc`) whenever anything it or its place in the
//! free-host order depends on changes: a report, a grant, a release, a drain or resume. So
//! "changed in between" is exactly "its entry is not the one the preparation started from"
//! (`Arc::ptr_eq`; the preparation holds the old entry, so its address cannot be reused).
//! [`PreparedPolicy::catch_up`] shortens that list: given the allocator's values again
//! after the preparation, it decides off the core the hosts that changed meanwhile.
//! The result is the state `set_policy` would have built: the same pure function of the same
//! values.

use std::{sync::Arc, time::Instant};

use crate::HostMap;

use policies::Policy;

use super::{
    free::FreeHosts,
    inputs::{decisions, fitted, HostEntry},
    state::{Allocator, Fx},
    Effect,
};

/// The cached values of every host, taken from an [`Allocator`] to prepare a policy change
/// elsewhere ([`Allocator::policy_inputs`]). Cheap to take: shared references.
#[derive(Debug, Clone)]
pub struct HostInputs {
    hosts: HostMap<Arc<HostEntry>>,
}

/// What a policy change replaced: the cached values of every host. Dropping them frees
/// tens of thousands of small allocations at 10k hosts (milliseconds): the broker drops
/// this off its core.
#[derive(Debug)]
pub struct Retired {
    _hosts: Vec<HostMap<Arc<HostEntry>>>,
}

/// A policy with its host-only decisions worked out for every host of a [`HostInputs`];
/// put in force with [`Allocator::set_prepared_policy`].
#[derive(Debug)]
pub struct PreparedPolicy {
    policy: Arc<Policy>,
    /// The entries the decisions were worked out from.
    from: HostMap<Arc<HostEntry>>,
    /// The same hosts' entries under `policy`.
    hosts: HostMap<Arc<HostEntry>>,
    /// The free-host order of `hosts`.
    free: FreeHosts,
}

impl PreparedPolicy {
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// Brings the preparation up to `inputs`, taken from the allocator again once
    /// [`HostInputs::prepare`] is done: decides here the hosts whose cached values changed
    /// meanwhile (at 10k hosts reporting every second, about a thousand), so that
    /// [`Allocator::set_prepared_policy`] decides only those that change after this. Pure;
    /// the result is what preparing from `inputs` would have given.
    pub fn catch_up(mut self, inputs: HostInputs) -> PreparedPolicy {
        for (name, entry) in &inputs.hosts {
            if self.from.get(name).is_some_and(|e| Arc::ptr_eq(e, entry)) {
                continue;
            }
            let value = fitted(&self.policy, &entry.facts, &entry.value);
            let (start, rank) = decisions(&self.policy, &value);
            let decided = HostEntry {
                facts: entry.facts.clone(),
                value,
                start,
                rank,
                labels: entry.labels,
            };
            let to = decided.place();
            let from = self.hosts.insert(name.clone(), Arc::new(decided));
            self.free.set(name, from.and_then(|e| e.place()), to);
        }
        let gone: Vec<String> = self
            .hosts
            .keys()
            .filter(|h| !inputs.hosts.contains_key(*h))
            .map(|h| h.to_string())
            .collect();
        for host in gone {
            let from = self.hosts.remove(&host);
            self.free.set(&host, from.and_then(|e| e.place()), None);
        }
        self.from = inputs.hosts;
        self
    }
}

impl HostInputs {
    /// Works out `policy`'s host-only decisions for every host and the free-host order they
    /// give. Pure; costs about two evaluations per host.
    pub fn prepare(self, policy: Arc<Policy>) -> PreparedPolicy {
        let mut free = FreeHosts::default();
        let hosts = self
            .hosts
            .iter()
            .map(|(name, old)| {
                let value = fitted(&policy, &old.facts, &old.value);
                let (start, rank) = decisions(&policy, &value);
                let entry = HostEntry {
                    facts: old.facts.clone(),
                    value,
                    start,
                    rank,
                    labels: old.labels,
                };
                free.set(name, None, entry.place());
                (name.clone(), Arc::new(entry))
            })
            .collect();
        PreparedPolicy {
            policy,
            from: self.hosts,
            hosts,
            free,
        }
    }
}

impl Allocator {
    /// What [`HostInputs::prepare`] needs: every host's cached values (shared, not copied).
    pub fn policy_inputs(&self) -> HostInputs {
        HostInputs {
            hosts: self.inputs.hosts.clone(),
        }
    }

    /// [`Allocator::set_policy`] with the host-only decisions prepared beforehand
    /// ([`HostInputs::prepare`], from this allocator's [`Allocator::policy_inputs`]): the
    /// hosts whose values changed since are decided again here; the effects are the same.
    /// Also returns what the change replaced, to drop elsewhere ([`Retired`]).
    pub fn set_prepared_policy(
        &mut self,
        prepared: PreparedPolicy,
        now: Instant,
    ) -> (Vec<Effect>, Retired) {
        let retired = self.install(prepared);
        let mut fx = Fx {
            dirty: false,
            ..Fx::default()
        };
        self.refresh(now);
        let held: Vec<String> = self.by_host.keys().cloned().collect();
        for host in &held {
            self.vacate_if_asked(host, now, &mut fx);
        }
        self.serve(now, &mut fx);
        (self.finish(fx), retired)
    }

    /// Puts the prepared policy, entries and free-host order in place, then decides again
    /// every host whose entry is not the one the preparation started from.
    pub(crate) fn install(&mut self, prepared: PreparedPolicy) -> Retired {
        let PreparedPolicy {
            policy,
            from,
            hosts,
            free,
        } = prepared;
        let stale = self.stale_since(&from);
        self.policy = policy;
        let current = std::mem::replace(&mut self.inputs.hosts, hosts);
        self.inputs.free = free;
        for host in &stale {
            match current.get(host) {
                Some(entry) => {
                    let entry = entry.clone();
                    self.decide_host(host, entry.facts.clone(), entry.value.clone());
                }
                None => {
                    let from = self.inputs.hosts.remove(host);
                    self.inputs
                        .free
                        .set(host, from.and_then(|e| e.place()), None);
                    self.rebuild_host(host);
                }
            }
        }
        Retired {
            _hosts: vec![from, current],
        }
    }

    /// The hosts whose entry differs from the one in `from` (or that only one of them has),
    /// and hosts with a view but no entry: one ordered walk over both maps.
    fn stale_since(&self, from: &HostMap<Arc<HostEntry>>) -> Vec<String> {
        let mut stale = Vec::new();
        let mut old = from.iter().peekable();
        for (host, entry) in &self.inputs.hosts {
            while let Some((h, _)) = old.next_if(|(h, _)| *h < host) {
                stale.push(h.to_string());
            }
            match old.next_if(|(h, _)| *h == host) {
                Some((_, e)) if Arc::ptr_eq(e, entry) => {}
                _ => stale.push(host.to_string()),
            }
        }
        stale.extend(old.map(|(h, _)| h.to_string()));
        if self.hosts.len() != self.inputs.hosts.len() {
            let missing = self
                .hosts
                .keys()
                .filter(|h| !self.inputs.hosts.contains_key(*h))
                .map(|h| h.to_string());
            stale.extend(missing);
        }
        stale
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        host::tests::{session, view},
        tests::job_info,
        Effect, HostView,
    };

    /// Host `i`: every third a private workstation whose owner typed `idle_s` ago.
    fn host(i: usize, idle_s: u64) -> HostView {
        let mut v = view(&format!("node{i:02}"));
        v.load1 = Some((i % 5) as f64 / 2.0);
        if i.is_multiple_of(3) {
            v.owner = Some("alice".into());
            v.users = Some(vec![session(Some(idle_s))]);
        }
        v
    }

    fn shipped(name: &str) -> Arc<Policy> {
        Arc::new(Policy::shipped(name).expect("shipped"))
    }

    /// Each host's cached start, rank and grantable label count.
    type Decided = Vec<(String, Option<bool>, Option<f64>, Option<usize>)>;

    /// Every host's cached decisions and the free-host order.
    fn decided(a: &Allocator) -> (Decided, FreeHosts) {
        let hosts = a
            .inputs
            .hosts
            .iter()
            .map(|(h, e)| (h.to_string(), e.start, e.rank, e.labels))
            .collect();
        (hosts, a.inputs.free.clone())
    }

    /// Puts `prepared` in force in `a` at `now` and checks it ends as `set_policy` of the
    /// same policy would have: the same effects, decisions and snapshot.
    fn assert_as_set_policy(a: &mut Allocator, prepared: PreparedPolicy, now: Instant) {
        let policy = prepared.policy().clone();
        let mut b = a.clone();
        let (fast, _) = a.set_prepared_policy(prepared, now);
        let plain = b.set_policy(policy, now);
        assert_eq!(fast, plain);
        assert_eq!(decided(a), decided(&b));
        assert_eq!(a.snapshot(), b.snapshot());
    }

    /// An allocator (the paper policy) that heard from `node00`–`node29` at `t0`, owners
    /// away an hour.
    fn thirty_hosts(t0: Instant) -> Allocator {
        let mut a = Allocator::new();
        for i in 0..30 {
            a.host_changed(host(i, 3600), t0);
        }
        a
    }

    /// A policy prepared from the inputs of one moment and put in force after reports,
    /// a drain, a grant and a new host changed them ends in the state, with the effects,
    /// that `set_policy` at that later moment gives.
    #[test]
    fn a_prepared_policy_decides_again_the_hosts_that_changed_meanwhile() {
        let t0 = Instant::now();
        let mut a = thirty_hosts(t0);
        let (holder, _) = a.register_job(job_info(true), t0);
        let (_, fx) = a.request(holder, "anyHost", t0);
        assert!(fx.iter().any(|e| matches!(e, Effect::Granted { .. })));
        let prepared = a.policy_inputs().prepare(shipped("desktop"));
        // Meanwhile: owners back at two workstations (one held, maybe), a drain, a grant,
        // a new host.
        let t1 = t0 + Duration::from_secs(1);
        for i in [0, 3] {
            a.host_changed(host(i, 1), t1);
        }
        a.drain("node07").expect("known");
        let (rigid, _) = a.register_job(job_info(false), t1);
        a.request(rigid, "anyHost", t1);
        a.host_changed(host(31, 3600), t1);
        assert_eq!(
            prepared.hosts["node00"].start,
            Some(true),
            "owner away then"
        );
        assert_as_set_policy(&mut a, prepared, t1 + Duration::from_secs(1));
        let start = |a: &Allocator, h: &str| a.inputs.hosts[h].start;
        assert_eq!(
            start(&a, "node00"),
            Some(false),
            "owner back: decided again"
        );
        assert_eq!(start(&a, "node15"), Some(true), "unchanged: as prepared");
    }

    /// A preparation caught up with the allocator's values halfway through the changes
    /// (owners back, a drain, a grant, a new host, a host down) ends where `set_policy` at
    /// the end does, and the caught-up hosts are not stale any more.
    #[test]
    fn a_caught_up_preparation_ends_where_set_policy_does() {
        let t0 = Instant::now();
        let mut a = thirty_hosts(t0);
        let prepared = a.policy_inputs().prepare(shipped("desktop"));
        let t1 = t0 + Duration::from_secs(1);
        for i in [0, 3] {
            a.host_changed(host(i, 1), t1);
        }
        a.host_changed(host(31, 3600), t1);
        a.drain("node07").expect("known");
        let prepared = prepared.catch_up(a.policy_inputs());
        assert!(
            a.stale_since(&prepared.from).is_empty(),
            "every change so far caught up"
        );
        assert_eq!(prepared.hosts["node00"].start, Some(false), "owner back");
        // After the catch-up: another owner back, a grant, a host down.
        a.host_changed(host(6, 1), t1);
        let (rigid, _) = a.register_job(job_info(false), t1);
        a.request(rigid, "anyHost", t1);
        let mut down = host(12, 3600);
        down.up = false;
        a.host_changed(down, t1);
        assert_as_set_policy(&mut a, prepared, t1 + Duration::from_secs(1));
    }

    /// A report that changes none of a host's facts keeps its entry (no value built, no
    /// decision evaluated, and a prepared policy need not decide it again); one that does
    /// replaces it.
    #[test]
    fn an_unchanged_report_keeps_the_hosts_entry() {
        let t0 = Instant::now();
        let mut a = Allocator::new();
        a.host_changed(host(1, 3600), t0);
        let entry = |a: &Allocator| a.inputs.hosts["node01"].clone();
        let first = entry(&a);
        a.host_changed(host(1, 3600), t0 + Duration::from_secs(1));
        assert!(Arc::ptr_eq(&first, &entry(&a)), "same facts");
        let mut busy = host(1, 3600);
        busy.load1 = Some(3.0);
        a.host_changed(busy, t0 + Duration::from_secs(2));
        assert!(!Arc::ptr_eq(&first, &entry(&a)), "a new load");
        assert_eq!(entry(&a).facts.load1, Some(3.0));
        a.drain("node01").expect("known");
        assert_eq!(entry(&a).labels, None, "drained: no place, a new entry");
    }
}
