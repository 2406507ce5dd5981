//! How well a run used its hosts, measured over a replayed decision trace: host-seconds in
//! all, host-seconds in each host state ([`HostUse`]: lent, free, owner's own use, drained,
//! down), and host-seconds a host was free (up, not drained, held by no job) while some
//! request waited — the paper's utilization experiment's "idle". Between two inputs the
//! allocator's state does not change, so integrating the state after each input up to the
//! next one is exact for what the trace recorded.
//!
//! The same integration, kept host by host when asked ([`UsageMeter::keep_timeline`]),
//! gives the [`Timeline`] that `usage_series` buckets into the utilization chart (`rb
//! report`, the status page): the chart and `rb policy replay`'s host-seconds are one
//! computation.
//!
//! # Choices
//! - **One state per host**, the first that applies: held by a job (granted or being taken
//!   back, even while down: the job keeps it) is *lent*; else not up is *down*; else
//!   drained or leaving (a Slurm lease ending) is *drained*; else its owner active (a
//!   session or the console used lately, [`HostView::owner_active`]) is *owner*; else
//!   *free*.
//! - **Runs are not joined.** A trace's `start` record that opens a new broker run (or
//!   follows lost lines) ends the integration of the previous run at its last input: how
//!   the lab was used while no broker ran is unknown.
//!
//! Cost: after each input, only the hosts it or its effects name are classified again
//! (O(log n) each); a `start` record classifies every host. Plus a walk over the hosts after
//! an input that leaves a request waiting.
//!
//! [`HostView::owner_active`]: crate::HostView::owner_active

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{trace::Input, Allocator, Effect};

/// What a host is doing, for the utilization figures (see the module's choices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostUse {
    /// Held by a job (granted, or being taken back).
    Lent,
    /// Up, open to grants, held by no job, its owner (if any) away.
    Free,
    /// A private host whose owner uses it, held by no job.
    Owner,
    /// Drained by an admin, or its Slurm lease ends; held by no job.
    Drained,
    /// Not reporting, held by no job.
    Down,
}

impl HostUse {
    /// Every state, in the chart's stacking order (bottom first).
    pub const ALL: [HostUse; 5] = [
        HostUse::Lent,
        HostUse::Free,
        HostUse::Owner,
        HostUse::Drained,
        HostUse::Down,
    ];

    /// The state's name (`lent`, `free`, `owner`, `drained`, `down`).
    pub fn name(self) -> &'static str {
        match self {
            HostUse::Lent => "lent",
            HostUse::Free => "free",
            HostUse::Owner => "owner",
            HostUse::Drained => "drained",
            HostUse::Down => "down",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Host-seconds (or host counts) per [`HostUse`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ByUse(pub [f64; 5]);

impl ByUse {
    pub fn get(&self, state: HostUse) -> f64 {
        self.0[state.index()]
    }

    pub fn add(&mut self, state: HostUse, value: f64) {
        self.0[state.index()] += value;
    }

    /// The sum over the states.
    pub fn total(&self) -> f64 {
        self.0.iter().sum()
    }
}

/// Host-seconds of a replayed run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Every host of the lab, up or not, over the run.
    pub host_s: f64,
    /// Hosts held by a job (granted, or being taken back).
    pub held_host_s: f64,
    /// Free hosts while at least one request waited.
    pub idle_while_wanted_host_s: f64,
    /// Seconds during which at least one request waited.
    pub wanted_s: f64,
    /// Host-seconds in each state; they sum to `host_s`, and `lent` is `held_host_s`.
    pub by_use: ByUse,
}

impl Usage {
    /// `idle_while_wanted_host_s / host_s` (0 for an empty run).
    pub fn idle_fraction(&self) -> f64 {
        if self.host_s > 0.0 {
            self.idle_while_wanted_host_s / self.host_s
        } else {
            0.0
        }
    }
}

/// One stretch of one host in one state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// Index into [`Timeline::hosts`].
    pub host: usize,
    pub state: HostUse,
    /// Wall time it began (Unix milliseconds: the run's wall clock at its start plus the
    /// run's monotonic clock, so that spans meet exactly).
    pub from_unix_ms: f64,
    /// How long it lasted, seconds (on the run's monotonic clock, as [`Usage`] counts).
    pub seconds: f64,
}

/// Every host's states over a replayed trace, as spans (kept only when asked).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Host names, in the order first seen.
    pub hosts: Vec<String>,
    /// Closed spans, in the order they ended.
    pub spans: Vec<Span>,
    /// Each host's state at the last input (`None` for a host unknown then), to draw a
    /// live lab up to now.
    pub last: Vec<Option<HostUse>>,
    /// Wall time of the first and the last input integrated from (Unix milliseconds).
    pub first_unix_ms: Option<f64>,
    pub last_unix_ms: Option<f64>,
}

/// The state integrated from one input to the next.
#[derive(Debug, Clone, Copy)]
struct Sample {
    t_us: u64,
    hosts: usize,
    held: usize,
    /// Free hosts, when a request waits; `None` when none waits.
    idle_wanted: Option<usize>,
    counts: [usize; 5],
}

/// Which hosts an input may have changed the state of.
pub(crate) enum Touched<'a> {
    All,
    Named(&'a [String]),
}

/// Accumulates [`Usage`] (and, when asked, the [`Timeline`]) as a replay goes.
#[derive(Debug, Default)]
pub(crate) struct UsageMeter {
    last: Option<Sample>,
    usage: Usage,
    /// Each known host's state, and since when (t_us, unix_ms).
    states: BTreeMap<String, HostState>,
    counts: [usize; 5],
    timeline: Option<Timeline>,
    /// Wall time (Unix ms) of the current run's `t_us` 0.
    epoch_unix_ms: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
struct HostState {
    index: usize,
    state: HostUse,
    since_us: u64,
    since_unix_ms: f64,
}

impl UsageMeter {
    /// Keep every host's spans too ([`UsageMeter::timeline`]).
    pub(crate) fn keep_timeline(&mut self) {
        self.timeline.get_or_insert_with(Timeline::default);
    }

    /// A new broker run begins: the previous one's integration ends at its last input.
    pub(crate) fn new_run(&mut self) {
        self.close_spans();
        self.last = None;
        self.epoch_unix_ms = None;
    }

    /// The allocator's state right after the input at `t_us` (wall time `unix_ms`), which
    /// may have changed the state of the `touched` hosts only.
    pub(crate) fn sample(&mut self, t_us: u64, unix_ms: i64, alloc: &Allocator, touched: Touched) {
        if let Some(prev) = self.last {
            self.advance(prev, t_us);
        }
        let epoch = *self
            .epoch_unix_ms
            .get_or_insert(unix_ms as f64 - t_us as f64 / 1000.0);
        let wall_ms = epoch + t_us as f64 / 1000.0;
        match touched {
            Touched::All => {
                let gone: Vec<String> = self
                    .states
                    .keys()
                    .filter(|h| !alloc.hosts.contains_key(*h))
                    .cloned()
                    .collect();
                let known = alloc.hosts.keys().map(|h| h.as_str());
                for host in gone.iter().map(String::as_str).chain(known) {
                    self.classify(host, alloc, t_us, wall_ms);
                }
            }
            Touched::Named(hosts) => {
                for host in hosts {
                    self.classify(host, alloc, t_us, wall_ms);
                }
            }
        }
        #[cfg(test)]
        self.check(alloc);
        let idle_wanted = (!alloc.queue.is_empty()).then(|| free_hosts(alloc));
        self.last = Some(Sample {
            t_us,
            hosts: alloc.hosts.len(),
            held: alloc.by_host.len(),
            idle_wanted,
            counts: self.counts,
        });
        if let Some(tl) = &mut self.timeline {
            tl.first_unix_ms.get_or_insert(wall_ms);
            tl.last_unix_ms = Some(wall_ms);
        }
    }

    /// Integrates the state sampled last from its instant to `t_us`.
    fn advance(&mut self, prev: Sample, t_us: u64) {
        let dt = t_us.saturating_sub(prev.t_us) as f64 / 1e6;
        let u = &mut self.usage;
        u.host_s += prev.hosts as f64 * dt;
        u.held_host_s += prev.held as f64 * dt;
        if let Some(idle) = prev.idle_wanted {
            u.wanted_s += dt;
            u.idle_while_wanted_host_s += idle as f64 * dt;
        }
        for state in HostUse::ALL {
            u.by_use.add(state, prev.counts[state.index()] as f64 * dt);
        }
    }

    /// Sets `host`'s state from the allocator (none for a host it no longer knows).
    fn classify(&mut self, host: &str, alloc: &Allocator, t_us: u64, wall_ms: f64) {
        let now = host_use(alloc, host);
        let was = self.states.get(host).map(|s| s.state);
        if was == now {
            return;
        }
        if let Some(old) = self.states.remove(host) {
            self.counts[old.state.index()] -= 1;
            self.close(&old, t_us);
        }
        if let Some(state) = now {
            self.counts[state.index()] += 1;
            let index = self.host_index(host);
            let since = HostState {
                index,
                state,
                since_us: t_us,
                since_unix_ms: wall_ms,
            };
            self.states.insert(host.to_string(), since);
        }
        if let Some(tl) = &mut self.timeline {
            let index = tl.hosts.iter().position(|h| h == host);
            if let Some(i) = index {
                tl.last[i] = now;
            }
        }
    }

    fn host_index(&mut self, host: &str) -> usize {
        let Some(tl) = &mut self.timeline else {
            return 0;
        };
        if let Some(i) = tl.hosts.iter().position(|h| h == host) {
            return i;
        }
        tl.hosts.push(host.to_string());
        tl.last.push(None);
        tl.hosts.len() - 1
    }

    /// Records `old`'s span, ended at `t_us` (when keeping the timeline).
    fn close(&mut self, old: &HostState, t_us: u64) {
        let Some(tl) = &mut self.timeline else {
            return;
        };
        let end = t_us.max(old.since_us);
        tl.spans.push(Span {
            host: old.index,
            state: old.state,
            from_unix_ms: old.since_unix_ms,
            seconds: (end - old.since_us) as f64 / 1e6,
        });
    }

    /// Ends every open span at the last input; each host starts afresh at the next sample.
    fn close_spans(&mut self) {
        let Some(last) = self.last else {
            return;
        };
        let open = std::mem::take(&mut self.states);
        for s in open.values() {
            self.close(s, last.t_us);
        }
        self.counts = [0; 5];
    }

    pub(crate) fn usage(&self) -> Usage {
        self.usage
    }

    /// The spans so far, open ones ended at the last input (empty unless kept).
    pub(crate) fn timeline(&self) -> Timeline {
        let mut tl = self.timeline.clone().unwrap_or_default();
        if let (Some(last), Some(_)) = (self.last, &self.timeline) {
            for s in self.states.values() {
                tl.spans.push(Span {
                    host: s.index,
                    state: s.state,
                    from_unix_ms: s.since_unix_ms,
                    seconds: last.t_us.saturating_sub(s.since_us) as f64 / 1e6,
                });
            }
        }
        tl
    }

    /// The states kept up to date by touched hosts only are those of a full walk.
    #[cfg(test)]
    fn check(&self, alloc: &Allocator) {
        for (name, s) in &self.states {
            assert_eq!(Some(s.state), host_use(alloc, name), "{name}");
        }
        assert_eq!(self.states.len(), alloc.hosts.len());
        assert_eq!(self.counts.iter().sum::<usize>(), self.states.len());
    }
}

/// `host`'s state in `alloc` (see the module's choices); `None` for an unknown host.
fn host_use(alloc: &Allocator, host: &str) -> Option<HostUse> {
    let view = alloc.host_view(host)?;
    Some(if alloc.by_host.contains_key(host) {
        HostUse::Lent
    } else if !view.up {
        HostUse::Down
    } else if alloc.closed(host) {
        HostUse::Drained
    } else if view.owner_active() {
        HostUse::Owner
    } else {
        HostUse::Free
    })
}

/// Hosts up, open to grants (not drained, no lease ending), held by no job.
fn free_hosts(alloc: &Allocator) -> usize {
    alloc
        .views()
        .filter(|h| h.up && !alloc.closed(&h.name) && !alloc.by_host.contains_key(&h.name))
        .count()
}

/// The hosts an input names (a host view, an admin command on a host, a give-back…) and
/// those its effects name (grants, reclaims, frees): the only hosts whose state it may
/// change.
pub(crate) fn touched_hosts<'a>(
    input: &Input,
    effects: impl IntoIterator<Item = &'a Effect>,
) -> Vec<String> {
    let mut hosts = match input {
        Input::HostsRepeated { hosts } => hosts.clone(),
        Input::Host { host, .. }
        | Input::GiveBack { host, .. }
        | Input::Released { host, .. }
        | Input::ReleaseHost { host, .. }
        | Input::LeaseEnds { host, .. }
        | Input::Drain { host }
        | Input::Resume { host }
        | Input::Explain { host, .. }
        | Input::AllocsRunning { host, .. } => vec![host.clone()],
        Input::Register { .. }
        | Input::Allocate { .. }
        | Input::Cancel { .. }
        | Input::End { .. }
        | Input::AgentGone { .. }
        | Input::Resumed { .. }
        | Input::UsesHosts { .. }
        | Input::Tick
        | Input::Policy { .. } => Vec::new(),
    };
    for e in effects {
        match e {
            Effect::Granted { host, .. }
            | Effect::Reclaim { host, .. }
            | Effect::ForceRelease { host, .. }
            | Effect::Freed { host } => hosts.push(host.clone()),
            _ => {}
        }
    }
    hosts.sort_unstable();
    hosts.dedup();
    hosts
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
