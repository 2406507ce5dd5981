//! [`Allocator`]: the jobs, queued requests and live allocations, and the public entry points.
//!
//! Each entry point mutates the tables, lets `policy` serve the queue, and
//! returns the effects in decision order, followed by `Queued` position updates and, when
//! durable state changed, one `Persist`.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use policies::Policy;

use crate::host_map::HostMap;

use super::{
    host::{HostView, Want, Wanted},
    inputs::{paper, Inputs},
    AllocConfig, AllocError, AllocId, Effect, JobId, JobInfo, JobState, RequestId,
};

#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) info: JobInfo,
    pub(crate) state: JobState,
    /// When the job registered (`None` for a job restored from a snapshot: soft state).
    pub(crate) started: Option<Instant>,
    /// When the job ended.
    pub(crate) ended: Option<Instant>,
}

/// A live allocation's state (`Released` is represented by removal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AllocState {
    Granted,
    Releasing {
        deadline: Instant,
        /// The grace the job was given (kept for snapshots and re-sent reclaims).
        grace: Duration,
        /// The queued request this host is being reclaimed for, if any (not for admin or
        /// owner-return reclaims).
        for_request: Option<RequestId>,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Allocation {
    pub(crate) job: JobId,
    pub(crate) host: String,
    pub(crate) address: String,
    /// The request it was granted for (`None` only for records restored without one).
    pub(crate) request: Option<RequestId>,
    pub(crate) state: AllocState,
    /// When the host was granted (for a record restored from a snapshot: the restore), for
    /// the policy's `host.held_for_s`.
    pub(crate) since: Instant,
}

/// A queued request.
#[derive(Debug, Clone)]
pub(crate) struct Waiting {
    pub(crate) id: RequestId,
    pub(crate) job: JobId,
    pub(crate) symbolic: String,
    pub(crate) want: Want,
    /// The instance number of an instance name (`anyLinux-2`), passed on with the grant.
    pub(crate) instance: Option<u32>,
    /// A host being reclaimed for this request: first in line for it once released.
    pub(crate) reserved: Option<String>,
    /// The position last reported in a `Queued` effect.
    pub(crate) reported: Option<usize>,
    /// When the request was queued (for a restored request: when it was restored).
    pub(crate) since: Instant,
    /// Restored from a snapshot: no agent waits for it (agents re-send their waiting
    /// requests as new ones after a restart). It keeps its place and its reserved host, but
    /// never starts a reclaim, and leaves the queue without a grant once a host is free for
    /// it (the host stays free for the next in line).
    pub(crate) restored: bool,
}

/// Effects collected by one entry point, and whether durable state changed.
#[derive(Debug, Default)]
pub(crate) struct Fx {
    pub(crate) out: Vec<Effect>,
    pub(crate) dirty: bool,
}

impl Fx {
    pub(crate) fn push(&mut self, e: Effect) {
        self.out.push(e);
        self.dirty = true;
    }
}

/// The allocation core. See the [module docs](super) for the model.
#[derive(Debug, Clone)]
pub struct Allocator {
    pub(crate) config: AllocConfig,
    pub(crate) next_job: JobId,
    pub(crate) next_alloc: AllocId,
    pub(crate) next_request: RequestId,
    pub(crate) jobs: BTreeMap<JobId, Job>,
    pub(crate) allocs: BTreeMap<AllocId, Allocation>,
    /// Host name → its live allocation.
    pub(crate) by_host: BTreeMap<String, AllocId>,
    /// Queued requests, first in line first.
    pub(crate) queue: Vec<Waiting>,
    /// The hosts the allocator has a view of (soft state, not persisted), each with its
    /// latest view and what its daemon does ([`KnownHost`]).
    pub(crate) hosts: HostMap<KnownHost>,
    pub(crate) drained: BTreeSet<String>,
    /// Hosts whose Slurm lease ends ([`Allocator::lease_ends`]): closed to grants like a
    /// drained host until they go down (soft state: a pilot's daemon says so again after
    /// every reconnection).
    pub(crate) leaving: BTreeSet<String>,
    /// Hosts each running job uses without holding them (the machine its agent runs on,
    /// hosts it added by name): never granted to it. Soft state, like `hosts`: agents tell
    /// them again when they re-register after a restart.
    pub(crate) in_use: BTreeMap<JobId, BTreeSet<String>>,
    /// The policy in force (default: the shipped `paper`); see [`Allocator::set_policy`].
    pub(crate) policy: Arc<Policy>,
    /// The policy's inputs, built as the state changes (soft state).
    pub(crate) inputs: Inputs,
    /// Overflow onto Slurm, when on (soft state: pilots are Slurm's to remember).
    pub(crate) overflow: Option<crate::overflow::Overflow>,
    /// Allocations whose reclaim deadline passed on a host whose daemon ends an
    /// allocation's processes when told ([`Allocator::allocs_running`]): they hold their
    /// host until the daemon no longer finds a process of theirs, or the host is down. Not
    /// live for the daemons' sweep ([`Allocator::allocs_with_hosts`]). Soft state: after a
    /// restart their deadline passes again.
    pub(crate) ending: BTreeSet<AllocId>,
    /// Changes of `ending`, for [`Allocator::live_allocs_stamp`].
    pub(crate) ending_changes: u64,
    /// Jobs restored after a restart whose agents have not come back, with the instant
    /// their resume window closes ([`Allocator::await_agents`]).
    pub(crate) awaiting: BTreeMap<JobId, Instant>,
    /// A policy worked out off the core, put in force by the next `Input::Policy`
    /// ([`Allocator::stage_policy`]).
    pub(crate) staged: Option<Arc<crate::PreparedPolicy>>,
}

/// A host the allocator has a view of. What a report reads of a host is in one place, so
/// that a report looks the host up once (at 10k hosts each lookup in a map of its own is a
/// few cache misses).
#[derive(Debug, Clone)]
pub(crate) struct KnownHost {
    /// Its latest view, shared, so that the trace's opening state takes it without copying
    /// (at 100k hosts, copying the views stalled the core for ~100 ms at every new trace
    /// file).
    pub(crate) view: Arc<HostView>,
    /// Its daemon reports the allocations running there and ends those it is told to (soft
    /// state: until the host goes down; its next daemon says so again).
    pub(crate) ends_allocs: bool,
    /// `view.up`, kept here too: a repeated report asks only this of the view, and the
    /// view is another heap object, cold by the host's next report at 10k hosts.
    up: bool,
}

impl KnownHost {
    fn new(view: HostView) -> Self {
        Self::shared(Arc::new(view))
    }

    /// A host whose view is shared already (a trace's opening state).
    pub(crate) fn shared(view: Arc<HostView>) -> Self {
        KnownHost {
            up: view.up,
            view,
            ends_allocs: false,
        }
    }

    /// Whether the view says the host is up.
    pub(crate) fn up(&self) -> bool {
        debug_assert_eq!(self.up, self.view.up, "`up` follows the view");
        self.up
    }
}

impl Default for Allocator {
    fn default() -> Self {
        Self::new()
    }
}

impl Allocator {
    /// An empty allocator with the default policy settings.
    pub fn new() -> Self {
        Self::with_config(AllocConfig::default())
    }

    pub fn with_config(config: AllocConfig) -> Self {
        Allocator {
            config,
            next_job: 1,
            next_alloc: 1,
            next_request: 1,
            jobs: BTreeMap::new(),
            allocs: BTreeMap::new(),
            by_host: BTreeMap::new(),
            queue: Vec::new(),
            hosts: HostMap::new(),
            drained: BTreeSet::new(),
            leaving: BTreeSet::new(),
            in_use: BTreeMap::new(),
            policy: paper(),
            inputs: Inputs::default(),
            overflow: None,
            ending: BTreeSet::new(),
            ending_changes: 0,
            awaiting: BTreeMap::new(),
            staged: None,
        }
    }

    pub fn config(&self) -> &AllocConfig {
        &self.config
    }

    /// Registers a running job.
    pub fn register_job(&mut self, info: JobInfo, now: Instant) -> (JobId, Vec<Effect>) {
        let id = self.next_job;
        self.next_job += 1;
        let job = Job {
            info,
            state: JobState::Running,
            started: Some(now),
            ended: None,
        };
        self.jobs.insert(id, job);
        let fx = Fx {
            dirty: true,
            ..Fx::default()
        };
        (id, self.finish(fx))
    }

    /// `job` asks for a host by symbolic name: granted now, queued, or refused.
    pub fn request(
        &mut self,
        job: JobId,
        symbolic: &str,
        now: Instant,
    ) -> (RequestId, Vec<Effect>) {
        let req = self.next_request;
        self.next_request += 1;
        let mut fx = Fx::default();
        match self.admit(job, symbolic) {
            Err(reason) => fx.push(Effect::Refused { job, req, reason }),
            Ok(Wanted { want, instance }) => {
                self.queue.push(Waiting {
                    id: req,
                    job,
                    symbolic: symbolic.to_string(),
                    want,
                    instance,
                    reserved: None,
                    reported: None,
                    since: now,
                    restored: false,
                });
                fx.dirty = true;
                self.serve(now, &mut fx);
            }
        }
        (req, self.finish(fx))
    }

    fn admit(&self, job: JobId, symbolic: &str) -> Result<Wanted, String> {
        if !self.is_running(job) {
            return Err(format!("job {job} is not running"));
        }
        let wanted = self.parse_name(symbolic)?;
        self.possible(job, &wanted.want, symbolic)?;
        Ok(wanted)
    }

    /// [`Want::parse`] against the labels of the lab's hosts.
    pub(crate) fn parse_name(&self, symbolic: &str) -> Result<Wanted, String> {
        Want::parse(symbolic, |label| {
            self.views().any(|h| h.labels.iter().any(|l| l == label))
        })
    }

    /// Withdraws a queued request (e.g. its shim died). A reclaim started for it goes on; the
    /// host, once released, serves the next request or becomes free.
    pub fn cancel(&mut self, req: RequestId) -> Vec<Effect> {
        let mut fx = Fx::default();
        if let Some(i) = self.queue.iter().position(|w| w.id == req) {
            self.queue.remove(i);
            fx.dirty = true;
        }
        self.finish(fx)
    }

    /// The holder confirms it released the host (after a `Reclaim`, or on its own).
    /// Unknown or already released allocations are ignored.
    pub fn release_confirmed(&mut self, alloc: AllocId, now: Instant) -> Vec<Effect> {
        self.give_back(alloc, now)
    }

    /// The job no longer needs the host.
    pub fn give_back(&mut self, alloc: AllocId, now: Instant) -> Vec<Effect> {
        let mut fx = Fx::default();
        if self.allocs.contains_key(&alloc) {
            self.release_alloc(alloc, &mut fx);
            self.serve(now, &mut fx);
        }
        self.finish(fx)
    }

    /// The job ended or its agent is gone: release every host it holds, drop its requests.
    pub fn end_job(&mut self, job: JobId, now: Instant) -> Vec<Effect> {
        let mut fx = Fx::default();
        let Some(j) = self.jobs.get_mut(&job) else {
            return Vec::new();
        };
        if j.state == JobState::Ended {
            return Vec::new();
        }
        j.state = JobState::Ended;
        j.ended = Some(now);
        fx.dirty = true;
        // Those past their deadline wait for their host's daemon, whatever the job does.
        let held: Vec<AllocId> = self
            .allocs_of(job)
            .filter(|id| !self.ending.contains(id))
            .collect();
        for id in held {
            self.release_alloc(id, &mut fx);
        }
        self.queue.retain(|w| w.job != job);
        self.in_use.remove(&job);
        self.prune_ended();
        self.serve(now, &mut fx);
        self.finish(fx)
    }

    /// `rb release HOST`: reclaim whatever holds `host` within `grace`.
    pub fn release_host(
        &mut self,
        host: &str,
        grace: Duration,
        now: Instant,
    ) -> Result<Vec<Effect>, AllocError> {
        self.known(host)?;
        let Some(&alloc) = self.by_host.get(host) else {
            return Err(AllocError::NotHeld { host: host.into() });
        };
        let mut fx = Fx::default();
        self.reclaim_within(alloc, host, grace, now, &mut fx);
        Ok(self.finish(fx))
    }

    /// Reclaims `alloc` (on `host`) within `grace`, or less if the policy's `grace_s` says
    /// so; an allocation already being released keeps the earlier of the two deadlines.
    fn reclaim_within(
        &mut self,
        alloc: AllocId,
        host: &str,
        grace: Duration,
        now: Instant,
        fx: &mut Fx,
    ) {
        self.refresh(now);
        let job = self.allocs.get(&alloc).map_or(0, |a| a.job);
        let grace = self.grace_for(job, host, grace);
        self.reclaim(alloc, None, grace, now, fx);
    }

    /// Slurm takes `host` (a pilot's node) back: no new grants on it, and whatever holds it
    /// is reclaimed within `grace` (the time left on the lease, or less if the policy's
    /// `grace_s` says so). It stays closed until it goes down.
    pub fn lease_ends(
        &mut self,
        host: &str,
        grace: Duration,
        now: Instant,
    ) -> Result<Vec<Effect>, AllocError> {
        self.known(host)?;
        let mut fx = Fx::default();
        if self.leaving.insert(host.to_string()) {
            self.rebuild_host(host);
        }
        if let Some(&alloc) = self.by_host.get(host) {
            self.reclaim_within(alloc, host, grace, now, &mut fx);
        }
        Ok(self.finish(fx))
    }

    /// No new grants on `host`; its current allocation (if any) stays.
    pub fn drain(&mut self, host: &str) -> Result<Vec<Effect>, AllocError> {
        self.known(host)?;
        let fx = Fx {
            dirty: self.drained.insert(host.to_string()),
            ..Fx::default()
        };
        self.rebuild_host(host);
        Ok(self.finish(fx))
    }

    /// Undoes [`drain`](Self::drain) and serves the queue.
    pub fn resume(&mut self, host: &str, now: Instant) -> Result<Vec<Effect>, AllocError> {
        self.known(host)?;
        let mut fx = Fx {
            dirty: self.drained.remove(host),
            ..Fx::default()
        };
        self.rebuild_host(host);
        self.serve(now, &mut fx);
        Ok(self.finish(fx))
    }

    /// One host's view changed (a report, up/down, a daemon (re)connected), or a host of the
    /// lab file is made known at start: stores it, rebuilds its policy value, reclaims it
    /// when the policy's `vacate` sends its holder away, and serves the queue. Costs O(1) in
    /// the number of hosts besides serving the queue; nothing rebuilds every view.
    ///
    /// A report that changes nothing `start` reads (only the load, say, under the paper)
    /// does not serve the queue: the queue was served after every earlier change, so nothing
    /// new could happen.
    pub fn host_changed(&mut self, view: HostView, now: Instant) -> Vec<Effect> {
        let host = view.name.clone();
        let mut fx = Fx::default();
        if !view.up {
            // A pilot's node that left: a later pilot on it is a new lease.
            self.leaving.remove(&host);
            // No process runs on a host that is down: what waited for its daemon ends.
            if let Some(known) = self.hosts.get_mut(&host) {
                known.ends_allocs = false;
            }
            for alloc in self.ending_on(&host, &[]) {
                self.release_alloc(alloc, &mut fx);
            }
        }
        let same_inputs = self.set_view(&host, view);
        let old_entry = self.inputs.hosts.get(&host).cloned();
        // `now` first: the rebuilt value's `held_for_s` is as of this report.
        self.inputs_now(now);
        self.rebuild_host(&host);
        let same = match (same_inputs, old_entry) {
            (true, Some(entry)) => self.same_start(&entry, &host),
            _ => false,
        };
        self.vacate_if_asked(&host, now, &mut fx);
        if !same {
            self.serve(now, &mut fx);
        }
        self.finish(fx)
    }

    /// Holds `view` as `host`'s; whether it had one whose inputs to the allocator's own
    /// rules ([`rust_inputs`]) were the same. The view is replaced in place unless a trace's
    /// opening state still shares it (no allocation a report).
    fn set_view(&mut self, host: &str, view: HostView) -> bool {
        let Some(known) = self.hosts.get_mut(host) else {
            self.hosts.insert(host.to_string(), KnownHost::new(view));
            return false;
        };
        known.up = view.up;
        let slot = &mut known.view;
        let same = rust_inputs(slot) == rust_inputs(&view);
        match Arc::get_mut(slot) {
            Some(held) => *held = view,
            None => *slot = Arc::new(view),
        }
        same
    }

    /// Whether [`host_changed`](Self::host_changed) with the view the allocator already
    /// holds for `host` would decide nothing and change nothing a decision reads, so that
    /// the shell may skip it for a report that repeats the last one (at 10k hosts, most
    /// reports). True only for a known, up host nobody holds (no `vacate` to ask, no
    /// `held_for_s` that grows), under a `start` that does not read `now` (whose value may
    /// change with the clock alone), with no policy error waiting to be reported: then its
    /// policy value is unchanged, `start` gives what it gave, and the queue, served after
    /// the last change, is served again for nothing.
    pub fn same_view_decides_nothing(&self, host: &str) -> bool {
        self.hosts.get(host).is_some_and(KnownHost::up)
            && self.has_entry(host)
            && !self.by_host.contains_key(host)
            && !self.start_reads_now()
            && self.no_pending_errors()
    }

    /// Whether `host` has its policy entry (`inputs.hosts`). Entries are made only for hosts
    /// with a view, and no view is dropped, so with as many entries as views every view has
    /// one: then no lookup (at 10k hosts, a cache-cold one a repeated report).
    fn has_entry(&self, host: &str) -> bool {
        debug_assert!(
            self.inputs.hosts.len() <= self.hosts.len(),
            "an entry without a view"
        );
        self.inputs.hosts.len() == self.hosts.len() || self.inputs.hosts.contains_key(host)
    }

    /// A report repeated `host`'s last one. When the view the allocator holds decides
    /// nothing ([`same_view_decides_nothing`](Self::same_view_decides_nothing)), takes it
    /// as [`host_changed`](Self::host_changed) with that view would (only the clock of the
    /// policy's inputs moves on) and returns true; else changes nothing and returns false:
    /// the shell must pass the host's view to `host_changed`.
    pub fn host_repeated(&mut self, host: &str, now: Instant) -> bool {
        if !self.same_view_decides_nothing(host) {
            return false;
        }
        self.inputs_now(now);
        true
    }

    /// Forces the release of every allocation whose reclaim deadline has passed. Where the
    /// host's daemon ends an allocation's processes when told, the allocation keeps its
    /// host until the daemon no longer finds one ([`Allocator::allocs_running`]); elsewhere
    /// the host is free at once.
    pub fn tick(&mut self, now: Instant) -> Vec<Effect> {
        let expired: Vec<AllocId> = self
            .allocs
            .iter()
            .filter(|(id, a)| {
                matches!(a.state, AllocState::Releasing { deadline, .. } if deadline <= now)
                    && !self.ending.contains(id)
            })
            .map(|(&id, _)| id)
            .collect();
        let mut fx = Fx::default();
        let mut freed = false;
        for alloc in &expired {
            let Some(a) = self.allocs.get(alloc) else {
                continue;
            };
            let (job, host) = (a.job, a.host.clone());
            let waits = self.ends_allocs(&host);
            fx.push(Effect::ForceRelease {
                job,
                alloc: *alloc,
                host,
            });
            if waits {
                self.ending.insert(*alloc);
                self.ending_changes += 1;
            } else {
                self.release_alloc(*alloc, &mut fx);
                freed = true;
            }
        }
        if freed {
            self.serve(now, &mut fx);
        }
        let pilots = self.overflow_tick(now);
        let mut out = self.finish(fx);
        // Before `Persist`, which comes last.
        let at = out.len() - usize::from(out.last() == Some(&Effect::Persist));
        out.splice(at..at, pilots);
        let late = self.end_late_agents(now);
        crate::handle::merge(out, late)
    }

    /// `host`'s daemon found processes of the allocations `running` on its machine (and
    /// ends those of an allocation past its deadline when told): each allocation of
    /// `host` past its deadline that is not among them is over, and its host free.
    pub fn allocs_running(&mut self, host: &str, running: &[AllocId], now: Instant) -> Vec<Effect> {
        if let Some(known) = self.hosts.get_mut(host) {
            known.ends_allocs = true;
        }
        let mut fx = Fx::default();
        let over = self.ending_on(host, running);
        for alloc in &over {
            self.release_alloc(*alloc, &mut fx);
        }
        if !over.is_empty() {
            self.serve(now, &mut fx);
        }
        self.finish(fx)
    }

    /// Whether [`Allocator::allocs_running`] would change anything: the host's daemon was
    /// not known to end allocations yet, or an allocation of it past its deadline is over.
    /// (The shell skips the others, most reports.)
    pub fn allocs_running_matters(&self, host: &str, running: &[AllocId]) -> bool {
        !self.ends_allocs(host) || !self.ending_on(host, running).is_empty()
    }

    /// Whether `host`'s daemon is known to end allocations ([`KnownHost::ends_allocs`]).
    fn ends_allocs(&self, host: &str) -> bool {
        self.hosts.get(host).is_some_and(|known| known.ends_allocs)
    }

    /// The view the allocator holds for `host` (the shell's [`crate::trace::host_delta`] compares
    /// the next one with it).
    pub fn host_view(&self, host: &str) -> Option<&HostView> {
        self.hosts.get(host).map(|known| &*known.view)
    }

    /// Every host's view, in name order.
    pub(crate) fn views(&self) -> impl Iterator<Item = &HostView> {
        self.hosts.values().map(|known| &*known.view)
    }

    /// The allocations of `host` past their deadline that are not among `running`.
    fn ending_on(&self, host: &str, running: &[AllocId]) -> Vec<AllocId> {
        self.ending
            .iter()
            .filter(|id| !running.contains(id))
            .filter(|id| self.allocs.get(id).is_some_and(|a| a.host == host))
            .copied()
            .collect()
    }

    /// Allocations past their reclaim deadline whose processes their host's daemon is to
    /// end now (see [`Allocator::tick`]), ascending. (The shell reads them, host by host,
    /// from [`Allocator::allocs_with_hosts`].)
    #[cfg(test)]
    pub(crate) fn ending_allocs(&self) -> Vec<AllocId> {
        self.ending.iter().copied().collect()
    }

    /// `job`'s agent came back after a restart: its requests restored from the snapshot
    /// leave the queue (the agent sends again those that still wait, under its own ids;
    /// kept, they would show as queued twice and hold a place nobody waits on), and it is
    /// told again of its hosts being taken back, with the grace left. Other jobs' agents
    /// hear nothing.
    pub fn resumed(&mut self, job: JobId, now: Instant) -> Vec<Effect> {
        let mut fx = Fx::default();
        let before = self.queue.len();
        self.queue.retain(|w| !(w.job == job && w.restored));
        fx.dirty = self.queue.len() != before;
        let mut effects = self
            .resend_reclaims(now)
            .into_iter()
            .filter(|e| matches!(e, Effect::Reclaim { job: j, .. } if *j == job))
            .collect::<Vec<_>>();
        if fx.dirty {
            self.serve(now, &mut fx);
        }
        effects.extend(self.finish(fx));
        effects
    }

    /// `Reclaim` effects for every allocation being released, with the grace left — to
    /// re-send after a restart or when an agent reconnects.
    pub fn resend_reclaims(&self, now: Instant) -> Vec<Effect> {
        self.allocs
            .iter()
            .filter_map(|(&alloc, a)| match a.state {
                AllocState::Releasing { deadline, .. } => Some(Effect::Reclaim {
                    job: a.job,
                    alloc,
                    host: a.host.clone(),
                    grace: deadline.saturating_duration_since(now),
                }),
                AllocState::Granted => None,
            })
            .collect()
    }

    /// The job and allocation holding `host` (granted or being released).
    pub fn holder(&self, host: &str) -> Option<(JobId, AllocId)> {
        let id = *self.by_host.get(host)?;
        self.allocs.get(&id).map(|a| (a.job, id))
    }

    /// A stamp that changes whenever the set of live allocations does: a new allocation
    /// always takes the next id, and one that ends shrinks the count. O(1), for callers that
    /// would otherwise walk [`Allocator::allocs_with_hosts`] after every event. It changes
    /// too when the allocations past their deadline do.
    pub fn live_allocs_stamp(&self) -> (usize, AllocId, u64) {
        (self.allocs.len(), self.next_alloc, self.ending_changes)
    }

    /// Every allocation, ascending by id, with its host and whether it is past its reclaim
    /// deadline (its processes to end; else live), and the next id to be issued: what each
    /// host's daemon is told of its own (`broker::host_words`).
    pub fn allocs_with_hosts(&self) -> (impl Iterator<Item = (AllocId, &str, bool)>, AllocId) {
        let allocs = self
            .allocs
            .iter()
            .map(|(&id, a)| (id, a.host.as_str(), self.ending.contains(&id)));
        (allocs, self.next_alloc)
    }

    /// Every live allocation (granted or being released), ascending, and the next id to be
    /// issued (every id below it has been). Those past their deadline are not live: their
    /// processes are to end. (The shell reads them, host by host, from
    /// [`Allocator::allocs_with_hosts`].)
    #[cfg(test)]
    pub(crate) fn live_allocs(&self) -> (Vec<AllocId>, AllocId) {
        let live = self
            .allocs
            .keys()
            .filter(|id| !self.ending.contains(id))
            .copied()
            .collect();
        (live, self.next_alloc)
    }

    /// The live allocations of `job`: (allocation, host, address).
    pub fn allocations_of(&self, job: JobId) -> Vec<(AllocId, String, String)> {
        self.allocs_of(job)
            .filter_map(|id| {
                let a = self.allocs.get(&id)?;
                Some((id, a.host.clone(), a.address.clone()))
            })
            .collect()
    }

    /// The registration of `job`, if it is still known.
    pub fn job_info(&self, job: JobId) -> Option<&JobInfo> {
        self.jobs.get(&job).map(|j| &j.info)
    }

    pub fn is_running(&self, job: JobId) -> bool {
        self.jobs
            .get(&job)
            .is_some_and(|j| j.state == JobState::Running)
    }

    pub fn is_drained(&self, host: &str) -> bool {
        self.drained.contains(host)
    }

    /// Whether `host` takes no new grant: drained, or its Slurm lease ends.
    pub(crate) fn closed(&self, host: &str) -> bool {
        self.drained.contains(host) || self.leaving.contains(host)
    }

    pub(crate) fn allocs_of(&self, job: JobId) -> impl Iterator<Item = AllocId> + '_ {
        self.allocs
            .iter()
            .filter(move |(_, a)| a.job == job)
            .map(|(&id, _)| id)
    }

    fn known(&self, host: &str) -> Result<(), AllocError> {
        let known = self.hosts.contains_key(host)
            || self.by_host.contains_key(host)
            || self.drained.contains(host);
        if known {
            Ok(())
        } else {
            Err(AllocError::UnknownHost { host: host.into() })
        }
    }

    /// Forgets the oldest ended jobs beyond `config.ended_jobs_kept`.
    fn prune_ended(&mut self) {
        let ended: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state == JobState::Ended)
            .map(|(&id, _)| id)
            .collect();
        let excess = ended.len().saturating_sub(self.config.ended_jobs_kept);
        for id in &ended[..excess] {
            self.jobs.remove(id);
        }
    }

    /// Appends position updates (with why each waits) for queued requests whose position
    /// changed, then `Persist`.
    pub(crate) fn finish(&mut self, mut fx: Fx) -> Vec<Effect> {
        let changed: Vec<usize> = (0..self.queue.len())
            .filter(|&i| self.queue[i].reported != Some(i + 1))
            .collect();
        for i in changed {
            let reason = self.wait_reason(i).to_string();
            let w = &mut self.queue[i];
            w.reported = Some(i + 1);
            fx.out.push(Effect::Queued {
                job: w.job,
                req: w.id,
                position: i + 1,
                reason,
            });
        }
        self.drain_errors(&mut fx);
        if fx.dirty {
            fx.out.push(Effect::Persist);
        }
        fx.out
    }
}

/// What of a host's view the Rust-side filters read: up, whether it reported (every host
/// has before a label can be refused), and its labels.
fn rust_inputs(v: &HostView) -> (bool, bool, &[String]) {
    (v.up, v.reported, &v.labels)
}
