//! The policy's inputs, built from the allocator's state and cached: one [`HostValue`] per
//! host, of the fields the policy reads (rebuilt when `host_changed` arrives or the host is
//! granted or freed, or for a policy that reads more; never per decision), with the host-only `start` and `rank` decisions evaluated then; one
//! [`JobValue`] per job (rebuilt only when its facts changed); and the `user`, `lab` and
//! `now` values of the current decision. Evaluating them is `decide`'s.
//!
//! Everything here is pure: the wall clock is given by the shell
//! ([`Allocator::set_wall_clock`]) and advanced by the `Instant`s the entry points receive.

use std::{
    collections::BTreeMap,
    sync::{Arc, OnceLock},
    time::Instant,
};

use policies::{
    facts::{HostFacts, JobFacts, LabFacts, NowFacts, Session, SpecValue, UserFacts},
    value::{HostValue, JobValue, LabValue, NowValue, UserValue},
    Answer, Hook, Policy, Var,
};

use super::{
    decide::ErrorLog,
    free::FreeHosts,
    host::HostView,
    host_map::HostMap,
    state::{AllocState, Allocator, Job},
    Effect, JobId, JobState,
};

/// The shipped `paper` policy, compiled once per process.
pub(crate) fn paper() -> Arc<Policy> {
    static PAPER: OnceLock<Arc<Policy>> = OnceLock::new();
    PAPER
        .get_or_init(|| Arc::new(Policy::shipped(policies::DEFAULT_POLICY).expect("shipped")))
        .clone()
}

/// Unix time and the local time zone at one `Instant` (given by the shell).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WallClock {
    at: Instant,
    unix: i64,
    utc_offset_s: i64,
}

/// One host's cached policy inputs.
#[derive(Debug)]
pub(crate) struct HostEntry {
    pub(crate) facts: HostFacts,
    /// Shared with the entry a policy change makes (the facts do not change with it).
    pub(crate) value: Arc<HostValue>,
    /// `start` when it is the same for every job ([`Policy::host_decision`]).
    pub(crate) start: Option<bool>,
    /// `rank` when it is the same for every job.
    pub(crate) rank: Option<f64>,
    /// The host's label count when a grant could go to it (up, not drained, not held):
    /// with `start` and `rank`, its place in the free-host order (`free`).
    pub(crate) labels: Option<usize>,
}

/// The policy inputs and caches of an [`Allocator`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Inputs {
    pub(crate) hosts: HostMap<Arc<HostEntry>>,
    pub(crate) jobs: BTreeMap<JobId, (JobFacts, Arc<JobValue>)>,
    pub(crate) users: BTreeMap<String, Arc<UserValue>>,
    /// `lab`, with the facts it was built from (rebuilt only when they change).
    pub(crate) lab: Option<(LabFacts, Arc<LabValue>)>,
    /// `now` of the current decision, with the facts it was built from.
    pub(crate) now: Option<(NowFacts, Arc<NowValue>)>,
    pub(crate) at: Option<Instant>,
    wall: Option<WallClock>,
    pub(crate) errors: ErrorLog,
    /// The free hosts in grant order (`free`).
    pub(crate) free: FreeHosts,
    /// Whether the policy (by its sha256) reads `host.held_for_s` (`held`).
    pub(crate) held_for_read: Option<(String, bool)>,
}

impl Allocator {
    /// The policy in force.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// The same allocator with `policy`, before any host is known (at the broker's start,
    /// after a restore): no decision is due, so there are no effects.
    pub fn with_policy(mut self, policy: impl Into<Arc<Policy>>) -> Self {
        let prepared = self.policy_inputs().prepare(policy.into());
        self.install(prepared);
        self
    }

    /// Replaces the policy. Cached host decisions are recomputed, every held host whose
    /// holder the new `vacate` sends away is reclaimed at once (with `grace_s`), and the
    /// queue is served (the new `start` may allow grants). Running jobs keep their hosts
    /// otherwise. The broker prepares the host decisions off its core instead
    /// ([`Allocator::set_prepared_policy`]).
    pub fn set_policy(&mut self, policy: impl Into<Arc<Policy>>, now: Instant) -> Vec<Effect> {
        let prepared = self.policy_inputs().prepare(policy.into());
        self.set_prepared_policy(prepared, now).0
    }

    /// Tells the allocator the wall clock: `unix` seconds at `at`, and the local time zone's
    /// offset from UTC (for the policy's `now.hour` and `now.weekday`). Until called, `now`
    /// reads as the Unix epoch advanced by the `Instant`s given.
    pub fn set_wall_clock(&mut self, at: Instant, unix: i64, utc_offset_s: i64) {
        self.inputs.wall = Some(WallClock {
            at,
            unix,
            utc_offset_s,
        });
    }

    /// The wall clock last given ([`Self::set_wall_clock`]): (at, unix, utc_offset_s).
    pub(crate) fn wall_clock(&self) -> Option<(Instant, i64, i64)> {
        self.inputs.wall.map(|w| (w.at, w.unix, w.utc_offset_s))
    }

    /// Unix seconds at `t`.
    fn unix_at(&self, t: Instant) -> i64 {
        let Some(w) = self.inputs.wall else {
            return 0;
        };
        match t.checked_duration_since(w.at) {
            Some(d) => w.unix.saturating_add(d.as_secs() as i64),
            None => w
                .unix
                .saturating_sub(w.at.duration_since(t).as_secs() as i64),
        }
    }

    /// `now` at `t`, with hour and weekday in the local time zone.
    pub(crate) fn now_facts(&self, t: Instant) -> NowFacts {
        let unix = self.unix_at(t);
        let local = unix + self.inputs.wall.map_or(0, |w| w.utc_offset_s);
        NowFacts {
            unix,
            hour: local.rem_euclid(86_400) / 3600,
            // 1970-01-01 was a Thursday (4).
            weekday: (local.div_euclid(86_400) + 4).rem_euclid(7),
        }
    }

    /// Rebuilds `host`'s value and its host-only decisions (after a report, a grant or a
    /// release, or a policy change).
    pub(crate) fn rebuild_host(&mut self, host: &str) {
        let Some(view) = self.host_view(host) else {
            return;
        };
        let facts = self.host_facts(view);
        if self.unchanged(host, &facts) {
            // The same facts give the same value and decisions: keep the entry (and its
            // place), which also spares a prepared policy from deciding it again.
            return;
        }
        let value = Arc::new(HostValue::reading(&facts, self.policy.host_value_fields()));
        let reused = self.inputs.hosts.get(host).map(|old| {
            let reuse = |hook| self.reads_the_same(hook, &old.facts, &facts);
            (
                reuse(Hook::Start).then_some(old.start),
                reuse(Hook::Rank).then_some(old.rank),
            )
        });
        let (start, rank) = reused.unwrap_or_default();
        self.decide_host_with(host, facts, value, start, rank);
    }

    /// Whether `hook`'s host-only decision on `new` is the one it gave on `old` without
    /// evaluating it: every `host` field it reads (directly or through lets) is the same.
    /// Entries are always decided under the policy in force, so `old`'s decision is this
    /// policy's. Never for a policy that reads `host` whole (its fields read are unknown).
    fn reads_the_same(&self, hook: Hook, old: &HostFacts, new: &HostFacts) -> bool {
        self.policy.host_value_fields() != policies::value::HostFields::ALL
            && self
                .policy
                .host_fields_read(hook)
                .iter()
                .all(|f| old.same_field(new, f))
    }

    /// Whether `host`'s entry was built from `facts` and its place in the free-host order
    /// still holds (up, drained and held are among the facts; the label count too).
    fn unchanged(&self, host: &str, facts: &HostFacts) -> bool {
        let Some(entry) = self.inputs.hosts.get(host) else {
            return false;
        };
        entry.facts == *facts && entry.labels == self.grantable_labels(host)
    }

    /// The host's label count when a grant could go to it (up, not drained, not held).
    fn grantable_labels(&self, host: &str) -> Option<usize> {
        self.host_view(host)
            .filter(|view| view.up && !self.closed(host) && !self.by_host.contains_key(host))
            .map(|view| view.label_count())
    }

    /// Stores `host`'s entry with its host-only `start` and `rank`, and moves the host to its
    /// place in the free-host order.
    pub(crate) fn decide_host(&mut self, host: &str, facts: HostFacts, value: Arc<HostValue>) {
        self.decide_host_with(host, facts, value, None, None);
    }

    /// [`Self::decide_host`], with `start` and `rank` given where known already (`Some`:
    /// the decision, itself `None` when it depends on the job); the others are evaluated.
    fn decide_host_with(
        &mut self,
        host: &str,
        facts: HostFacts,
        value: Arc<HostValue>,
        start: Option<Option<bool>>,
        rank: Option<Option<f64>>,
    ) {
        let value = fitted(&self.policy, &facts, &value);
        let start = start.unwrap_or_else(|| start_decision(&self.policy, &value));
        let rank = rank.unwrap_or_else(|| rank_decision(&self.policy, &value));
        let entry = HostEntry {
            facts,
            value,
            start,
            rank,
            labels: self.grantable_labels(host),
        };
        let to = entry.place();
        // The usual host is known: its key stays (no name copied a report), and its old
        // entry says where it stood in the free-host order.
        let from = match self.inputs.hosts.get_mut(host) {
            Some(slot) => std::mem::replace(slot, Arc::new(entry)).place(),
            None => {
                self.inputs.hosts.insert(host.to_string(), Arc::new(entry));
                None
            }
        };
        self.inputs.free.set(host, from, to);
    }

    fn host_facts(&self, v: &HostView) -> HostFacts {
        let held_by = self.by_host.get(&v.name).and_then(|id| self.allocs.get(id));
        let users = v.users.as_ref().map(|us| {
            us.iter()
                .map(|u| Session {
                    user: u.user.as_str().into(),
                    tty: u.tty.as_str().into(),
                    idle_s: u.idle_s.map(secs),
                })
                .collect()
        });
        let sessions = v
            .logind
            .as_ref()
            .map(|ss| ss.iter().map(login_session).collect());
        HostFacts {
            name: v.name.clone(),
            labels: v.labels.clone(),
            owner: v.owner.clone(),
            up: v.up,
            drained: self.closed(&v.name),
            load1: v.load1,
            load5: v.load5,
            load15: v.load15,
            cpus: i64::from(v.cpus.unwrap_or(1)),
            mem_avail_mb: v.mem_avail_mb.map(secs),
            users,
            console_idle_s: v.console_idle_s.map(secs),
            sessions,
            held_by: held_by.map(|a| secs(a.job)),
            held_for_s: self.held_for_s(&v.name),
            job_load: v
                .job_load
                .filter(|l| l.is_finite() && *l >= 0.0)
                .unwrap_or(0.0),
            ..HostFacts::default()
        }
        .derive()
    }

    /// Refreshes the values of one decision round: `now`, `lab`, every user and every
    /// running job whose facts changed.
    pub(crate) fn refresh(&mut self, now: Instant) {
        self.inputs_now(now);
        self.refresh_held_for();
        let counts = self.held_counts();
        let running: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state == JobState::Running)
            .map(|(&id, _)| id)
            .collect();
        self.inputs.jobs.retain(|id, _| running.contains(id));
        for id in &running {
            self.refresh_job(*id, &counts);
        }
        let mut users: BTreeMap<&str, UserFacts> = BTreeMap::new();
        for id in &running {
            let j = &self.jobs[id];
            let u = users.entry(j.info.user.as_str()).or_default();
            u.name = j.info.user.clone();
            u.jobs += 1;
            u.hosts_held += counts.get(id).copied().unwrap_or(0) as i64;
        }
        let lab = LabFacts {
            hosts: self.hosts.len() as i64,
            free_hosts: self.hosts.len().saturating_sub(self.by_host.len()) as i64,
            jobs: running.len() as i64,
            adaptive_jobs: running
                .iter()
                .filter(|id| self.jobs[id].info.adaptive)
                .count() as i64,
            users: users.len() as i64,
        };
        self.inputs.users = users
            .into_iter()
            .map(|(n, f)| (n.to_string(), Arc::new(UserValue::new(&f))))
            .collect();
        if self.inputs.lab.as_ref().is_none_or(|(f, _)| *f != lab) {
            // Most refreshes (a report each) leave the counts as they were.
            let value = Arc::new(LabValue::new(&lab));
            self.inputs.lab = Some((lab, value));
        }
        self.refresh_shares();
    }

    /// Sets `now` for a decision that needs no job refreshed (a report).
    /// The value is built again only when `now`'s facts (whole seconds) changed.
    pub(crate) fn inputs_now(&mut self, now: Instant) {
        self.inputs.at = Some(now);
        let facts = self.now_facts(now);
        if self.inputs.now.as_ref().is_some_and(|(f, _)| *f == facts) {
            return;
        }
        let value = Arc::new(NowValue::new(&facts));
        self.inputs.now = Some((facts, value));
    }

    /// Whether `start` on `host` is what it was before its new report (`old`): the same
    /// host-only value, or, when it depends on the job, the same values of every host field
    /// the expression reads.
    pub(crate) fn same_start(&self, old: &HostEntry, host: &str) -> bool {
        let Some(new) = self.inputs.hosts.get(host) else {
            return false;
        };
        match (old.start, new.start) {
            (Some(a), Some(b)) => a == b,
            (None, None) if self.start_reads_now() => false,
            (None, None) => self.reads_the_same(Hook::Start, &old.facts, &new.facts),
            _ => false,
        }
    }

    /// Whether the policy's `start` reads `now` (its value may change with the clock alone).
    pub(crate) fn start_reads_now(&self) -> bool {
        self.policy.reads_var(Hook::Start, Var::Now)
    }

    /// Refreshes one job's value after its holdings changed (a grant, a reclaim, a release).
    pub(crate) fn touch_job(&mut self, job: JobId) {
        if self.is_running(job) {
            let counts = self.held_counts();
            self.refresh_job(job, &counts);
        }
    }

    /// Hosts each job holds for the policy's `hosts_held`: granted allocations, plus hosts
    /// being reclaimed for its waiting requests (they are on their way to it).
    fn held_counts(&self) -> BTreeMap<JobId, usize> {
        let mut counts = BTreeMap::new();
        for a in self.allocs.values() {
            if a.state == AllocState::Granted {
                *counts.entry(a.job).or_insert(0) += 1;
            }
        }
        for w in self.queue.iter().filter(|w| w.reserved.is_some()) {
            *counts.entry(w.job).or_insert(0) += 1;
        }
        counts
    }

    fn refresh_job(&mut self, id: JobId, counts: &BTreeMap<JobId, usize>) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let mut facts = job_facts(id, job);
        facts.hosts_held = counts.get(&id).copied().unwrap_or(0) as i64;
        facts.waiting = self.queue.iter().filter(|w| w.job == id).count() as i64;
        facts.started_s = job.started.map_or(0, |t| self.unix_at(t));
        facts.host = self
            .in_use
            .get(&id)
            .and_then(|h| h.first().cloned())
            .unwrap_or_default();
        // The share of the last round stands until the next (`share`).
        facts.share = self.inputs.jobs.get(&id).map_or(1.0, |(f, _)| f.share);
        let same = self.inputs.jobs.get(&id).is_some_and(|(f, _)| *f == facts);
        if !same {
            let value = Arc::new(JobValue::new(&facts));
            self.inputs.jobs.insert(id, (facts, value));
        }
    }
}

/// `policy`'s host-only `start` and `rank` on `host` ([`Policy::host_decision`]).
/// `value` when it holds every `host` field `policy` may read; else one built from `facts`
/// that does (a policy change to one that reads more).
pub(crate) fn fitted(policy: &Policy, facts: &HostFacts, value: &Arc<HostValue>) -> Arc<HostValue> {
    let fields = policy.host_value_fields();
    match value.holds(fields) {
        true => Arc::clone(value),
        false => Arc::new(HostValue::reading(facts, fields)),
    }
}

pub(crate) fn decisions(policy: &Policy, host: &HostValue) -> (Option<bool>, Option<f64>) {
    (start_decision(policy, host), rank_decision(policy, host))
}

fn start_decision(policy: &Policy, host: &HostValue) -> Option<bool> {
    policy
        .host_decision(Hook::Start, host, None)
        .and_then(Answer::as_bool)
}

fn rank_decision(policy: &Policy, host: &HostValue) -> Option<f64> {
    policy
        .host_decision(Hook::Rank, host, None)
        .and_then(Answer::as_number)
}

/// The job facts that come from its registration (the rest are filled by the caller): the
/// RSL spec's first part (`rsl::JobSpec` JSON: `{"parts": [{...}]}`) flattened into
/// `spec.KEY`, its `count` as `count`/`min`/`max`, and the first part's `module`.
fn job_facts(id: JobId, job: &Job) -> JobFacts {
    let spec_json = job.info.spec.as_ref();
    let parts = spec_json
        .and_then(|s| s.get("parts"))
        .and_then(|p| p.as_array());
    let part = parts.and_then(|p| p.first()).or(spec_json);
    let mut spec: BTreeMap<String, SpecValue> = BTreeMap::new();
    if let Some(serde_json::Value::Object(map)) = part {
        for (k, v) in map {
            if let Some(v) = spec_value(v) {
                spec.insert(k.to_ascii_lowercase(), v);
            }
        }
    }
    let count = part.and_then(|p| p.get("count"));
    let int = |k: &str| count.and_then(|c| c.get(k)).and_then(|n| n.as_i64());
    let (min, max) = (int("min"), int("max"));
    let module = parts
        .into_iter()
        .flatten()
        .find_map(|p| p.get("module").and_then(|m| m.as_str()))
        .map(String::from);
    JobFacts {
        id: secs(id),
        user: job.info.user.clone(),
        adaptive: job.info.adaptive,
        module,
        count: min.unwrap_or(1),
        min,
        max,
        spec,
        ..JobFacts::default()
    }
}

/// An RSL relation's JSON value as the policy sees it; `None` for null and objects.
fn spec_value(v: &serde_json::Value) -> Option<SpecValue> {
    use serde_json::Value as J;
    match v {
        J::Bool(b) => Some(SpecValue::Bool(*b)),
        J::Number(n) => n
            .as_i64()
            .map(SpecValue::Int)
            .or_else(|| n.as_f64().map(SpecValue::Float)),
        J::String(s) => Some(SpecValue::Str(s.clone())),
        J::Array(a) => Some(SpecValue::List(a.iter().filter_map(spec_value).collect())),
        J::Null | J::Object(_) => None,
    }
}

/// A `u64` count as the policy's `int` (saturating).
fn secs(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `host.sessions[i]` from a host daemon's report of one logind session.
fn login_session(s: &proto_types::report::LogindSession) -> policies::facts::LoginSession {
    policies::facts::LoginSession {
        user: s.user.clone(),
        seat: s.seat.clone(),
        tty: s.tty.clone(),
        display: s.display.clone(),
        class: s.class.clone(),
        kind: s.kind.clone(),
        remote: s.remote,
        active: s.active,
        locked: s.locked,
        idle_s: s.idle_s.map(secs),
        idle_source: s.idle_source.describe().to_string(),
        person: s.is_person(),
        local: s.is_local(),
    }
}
