//! Overflow onto Slurm in the pure core: when to ask Slurm for a node (a pilot job) and
//! when to give one back. The shell submits and cancels; it never decides.
//!
//! # Model
//! With overflow on ([`Allocator::set_overflow`], from `[overflow.slurm]`), every tick
//! counts the jobs whose requests wait (not restored ones, not those a reclaim is already
//! bringing a host to) and for which the policy's `overflow` hook says yes (`job.waited_s`
//! is the oldest request's wait). A pilot is *outstanding* from its [`Effect::SubmitPilot`]
//! until a host labelled `slurm` comes up that no pilot has yet (then it is *joined* to
//! that host) or Slurm refuses it ([`Allocator::pilot_failed`]). While fewer pilots are
//! outstanding than jobs want one, and fewer than `max_nodes` exist, one more is asked
//! for. When no job wants one, outstanding pilots whose Slurm id is known are cancelled
//! ([`Effect::CancelPilot`]): a pilot still in Slurm's queue holds nothing anyone uses.
//! A joined pilot whose host no allocation has held for `idle_exit` is cancelled too, and
//! a joined pilot is forgotten when its host goes down (lease end, `scancel`). A pilot's
//! daemon names its Slurm job ([`Allocator::pilot_lease`]): the host is joined to that
//! pilot, with the lease's end as Slurm tells it; when Slurm says it takes the node back
//! (the lease warning, preemption, `scancel`: the shell asks Slurm how long the node has
//! left), the host's holder is reclaimed with that time as its grace and the host closes
//! ([`Allocator::lease_ends`]). After a
//! restart the shell finds the previous run's pilots by job name
//! ([`Allocator::pilots_found`]): they are adopted, and cancelled when unwanted; none is
//! while an allocation restored on a pilot's node whose daemon has not reconnected yet
//! holds it, however long the daemon takes (the job runs there).
//!
//! # Choices
//! - **Pilots serve the broker owner's jobs only.** They run as the owner, on the owner's
//!   Slurm account: pilots are asked for the owner's waiting jobs only, and a host labelled
//!   `slurm` starts no other user's job (checked with `start`, so neither a grant nor a
//!   reclaim gives one to them).
//! - A failed `sbatch` backs off: 1 s, doubling to 60 s, reset by the next success.
//! - Until its daemon names its Slurm job, a new `slurm` host is taken to be the oldest
//!   outstanding pilot's; the name then corrects it. Counts, not identities, drive the
//!   decisions, so the guess does not change what is asked for.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::{
    state::{Allocator, Waiting},
    Effect, JobId,
};

/// A pilot's number, given by the core.
pub type PilotId = u64;

/// How long a pilot found after a restart may take to join before, unwanted, it is
/// cancelled (its daemon reconnects when the broker's address did not change).
const FOUND_GRACE: Duration = Duration::from_secs(10);

/// Longest wait after failed submissions.
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// What overflow is allowed: from `[overflow.slurm]` and the broker's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverflowSettings {
    /// Most pilots at once.
    pub max_nodes: usize,
    /// The broker's owner: the only user whose jobs pilots serve.
    pub owner: String,
    /// A pilot whose host nobody holds for this long is cancelled (`idle_exit_s`).
    pub idle_exit: Duration,
    /// How long before its lease ends Slurm warns a pilot (`reclaim_grace_s`): the time
    /// its holder gets when Slurm could not tell the lease's end.
    pub warning: Duration,
}

/// What `rb status` shows of a pilot's host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PilotLease {
    /// Its Slurm job, once known.
    pub slurm_job: Option<String>,
    /// When Slurm takes the node back, as Slurm last said.
    pub ends: Option<Instant>,
    /// Slurm said it takes the node back: the host takes no new grant.
    pub ending: bool,
}

/// The overflow state: pilots and the submission backoff.
#[derive(Debug, Clone)]
pub(crate) struct Overflow {
    max_nodes: usize,
    owner: String,
    idle_exit: Duration,
    warning: Duration,
    next: PilotId,
    pilots: BTreeMap<PilotId, Pilot>,
    failures: u32,
    retry_at: Option<Instant>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pilot {
    /// Asked for; `slurm_id` once `sbatch` answered.
    Outstanding {
        slurm_id: Option<String>,
        /// Found in Slurm's queue after a restart ([`Allocator::pilots_found`]), when.
        found: Option<Instant>,
    },
    /// Its node is in the lab as `host`.
    Joined {
        host: String,
        slurm_id: Option<String>,
        /// Since when no allocation holds its host.
        idle_since: Option<Instant>,
        /// When Slurm takes the node back ([`Allocator::pilot_lease`]), once known.
        lease_end: Option<Instant>,
        /// Slurm said it takes the node back.
        ending: bool,
    },
}

/// Whether `view` is a Slurm pilot's node: the label every pilot's host has
/// (`config::pilot::PILOT_LABELS`).
fn is_pilot_node(view: &crate::HostView) -> bool {
    view.labels.iter().any(|l| l == "slurm")
}

impl Overflow {
    fn outstanding(&self) -> usize {
        self.pilots
            .values()
            .filter(|p| matches!(p, Pilot::Outstanding { .. }))
            .count()
    }

    /// Whether a pilot in the table is Slurm job `slurm_id`.
    fn knows(&self, slurm_id: &str) -> bool {
        self.pilots.values().any(|p| match p {
            Pilot::Outstanding { slurm_id: s, .. } | Pilot::Joined { slurm_id: s, .. } => {
                s.as_deref() == Some(slurm_id)
            }
        })
    }

    /// The pilot that Slurm job `slurm_id` is, taken out of the table to be joined to
    /// `host`: the one with that id, else a fresh number (a pilot this broker did not know
    /// of). A pilot that was guessed to be `host`'s goes back to waiting for its own node.
    fn take_pilot_of(&mut self, host: &str, slurm_id: &str) -> PilotId {
        let guessed = self.pilots.iter().find_map(|(id, p)| match p {
            Pilot::Joined {
                host: h,
                slurm_id: s,
                ..
            } if h == host && s.as_deref() != Some(slurm_id) => Some((*id, s.clone())),
            _ => None,
        });
        if let Some((id, other)) = guessed {
            self.pilots.insert(
                id,
                Pilot::Outstanding {
                    slurm_id: other,
                    found: None,
                },
            );
        }
        let own = self.pilots.iter().find_map(|(id, p)| match p {
            Pilot::Outstanding {
                slurm_id: Some(s), ..
            }
            | Pilot::Joined {
                slurm_id: Some(s), ..
            } if s == slurm_id => Some(*id),
            _ => None,
        });
        own.unwrap_or_else(|| {
            let id = self.next;
            self.next += 1;
            id
        })
    }
}

impl Allocator {
    /// Turns overflow on (`Some`), or off (`None`).
    pub fn set_overflow(&mut self, settings: Option<OverflowSettings>) {
        self.overflow = settings.map(|s| Overflow {
            max_nodes: s.max_nodes,
            owner: s.owner,
            idle_exit: s.idle_exit,
            warning: s.warning,
            next: 1,
            pilots: BTreeMap::new(),
            failures: 0,
            retry_at: None,
        });
    }

    /// `sbatch` accepted pilot `pilot` as Slurm job `slurm_id`.
    pub fn pilot_submitted(&mut self, pilot: PilotId, slurm_id: String) {
        if let Some(o) = &mut self.overflow {
            o.failures = 0;
            o.retry_at = None;
            if let Some(Pilot::Outstanding { slurm_id: id, .. }) = o.pilots.get_mut(&pilot) {
                *id = Some(slurm_id);
            }
        }
    }

    /// Pilots of this broker (by job name) that Slurm still has, found at start: adopted as
    /// outstanding. One whose node joins within `FOUND_GRACE` is used like any; the rest
    /// are cancelled once nobody wants them, but none while a restored allocation holds a
    /// node whose daemon is not back yet (`cancel_unwanted_pilots`).
    pub fn pilots_found(&mut self, slurm_ids: Vec<String>, now: Instant) {
        let known = self.pilot_ids();
        let Some(o) = &mut self.overflow else {
            return;
        };
        for id in slurm_ids.into_iter().filter(|id| !known.contains(id)) {
            let pilot = o.next;
            o.next += 1;
            o.pilots.insert(
                pilot,
                Pilot::Outstanding {
                    slurm_id: Some(id),
                    found: Some(now),
                },
            );
        }
    }

    /// `sbatch` failed for `pilot`: it is forgotten and submissions back off.
    pub fn pilot_failed(&mut self, pilot: PilotId, now: Instant) {
        if let Some(o) = &mut self.overflow {
            o.pilots.remove(&pilot);
            o.failures = o.failures.saturating_add(1);
            let wait = Duration::from_secs(1 << o.failures.min(6).saturating_sub(1));
            o.retry_at = Some(now + wait.min(BACKOFF_MAX));
        }
    }

    /// A pilot's daemon on `host` says it runs in Slurm job `slurm_id`, whose lease Slurm
    /// says has `left` to run (`None`: Slurm did not say); `ending` once Slurm said that
    /// it takes the node back. The host is joined to the pilot with that id (found by id, not
    /// guessed; one this broker does not know of is adopted, unless it is ending: a pilot
    /// this broker cancelled says so when Slurm's SIGTERM reaches it). Returns the grace its
    /// holder gets when the lease ends: the time left by Slurm's clock, else the warning's.
    pub fn pilot_lease(
        &mut self,
        host: &str,
        slurm_id: &str,
        left: Option<Duration>,
        ending: bool,
        now: Instant,
    ) -> Option<Duration> {
        let is_pilot_host = self.host_view(host).is_some_and(is_pilot_node);
        let o = self.overflow.as_mut()?;
        if !is_pilot_host {
            return None;
        }
        let lease_end = left.and_then(|l| now.checked_add(l));
        let grace = ending.then(|| left.unwrap_or(o.warning));
        if ending && !o.knows(slurm_id) {
            return grace;
        }
        let pilot = o.take_pilot_of(host, slurm_id);
        o.pilots.insert(
            pilot,
            Pilot::Joined {
                host: host.to_string(),
                slurm_id: Some(slurm_id.to_string()),
                idle_since: None,
                lease_end,
                ending,
            },
        );
        grace
    }

    /// Whether the next tick may ask Slurm for a pilot: overflow on, fewer pilots than
    /// `max_nodes`, not backing off, and more of the owner's jobs waiting than pilots
    /// outstanding. The shell ticks more often while this holds, so that a pilot is asked
    /// for close to when the policy's `overflow` turns true (a tick's 250 ms would add up to
    /// that to every cold start).
    pub fn pilot_may_be_due(&self, now: Instant) -> bool {
        let Some(o) = &self.overflow else {
            return false;
        };
        if o.pilots.len() >= o.max_nodes || o.retry_at.is_some_and(|t| now < t) {
            return false;
        }
        let mut jobs: Vec<JobId> = self
            .queue
            .iter()
            .filter(|w| self.may_want_pilot(w, &o.owner))
            .map(|w| w.job)
            .collect();
        jobs.sort_unstable();
        jobs.dedup();
        jobs.len() > o.outstanding()
    }

    /// What `rb status` shows of `host` when it is a pilot's node.
    pub fn pilot_lease_of(&self, host: &str) -> Option<PilotLease> {
        let o = self.overflow.as_ref()?;
        o.pilots.values().find_map(|p| match p {
            Pilot::Joined {
                host: h,
                slurm_id,
                lease_end,
                ending,
                ..
            } if h == host => Some(PilotLease {
                slurm_job: slurm_id.clone(),
                ends: *lease_end,
                ending: *ending,
            }),
            _ => None,
        })
    }

    /// The Slurm ids of every pilot, queued or running (for cancelling them at shutdown).
    pub fn pilot_ids(&self) -> Vec<String> {
        let Some(o) = &self.overflow else {
            return Vec::new();
        };
        o.pilots
            .values()
            .filter_map(|p| match p {
                Pilot::Outstanding { slurm_id, .. } | Pilot::Joined { slurm_id, .. } => {
                    slurm_id.clone()
                }
            })
            .collect()
    }

    /// The overflow decisions of one tick (see the module docs).
    pub(crate) fn overflow_tick(&mut self, now: Instant) -> Vec<Effect> {
        if self.overflow.is_none() {
            return Vec::new();
        }
        self.join_pilot_hosts();
        let mut out = self.cancel_idle_pilots(now);
        let wanted = self.jobs_wanting_pilots(now);
        if wanted == 0 {
            out.extend(self.cancel_unwanted_pilots(now));
            return out;
        }
        let Some(o) = &mut self.overflow else {
            return out;
        };
        let backing_off = o.retry_at.is_some_and(|t| now < t);
        if !backing_off && o.outstanding() < wanted && o.pilots.len() < o.max_nodes {
            let pilot = o.next;
            o.next += 1;
            o.pilots.insert(
                pilot,
                Pilot::Outstanding {
                    slurm_id: None,
                    found: None,
                },
            );
            out.push(Effect::SubmitPilot { pilot });
        }
        out
    }

    /// Nobody wants a pilot: those still outstanding are cancelled (a pilot still in
    /// Slurm's queue holds nothing anyone uses), found ones after [`FOUND_GRACE`]. But no
    /// found one is while an allocation holds a node not back yet
    /// ([`Self::a_held_host_is_not_back`]), however long its daemon takes: a job still runs
    /// there, and which found pilot is that node's is known only once its daemon names its
    /// Slurm job (cancelling a queued pilot later costs less than a used node now).
    fn cancel_unwanted_pilots(&mut self, now: Instant) -> Vec<Effect> {
        let keep_found = self.a_held_host_is_not_back();
        let Some(o) = &mut self.overflow else {
            return Vec::new();
        };
        let unwanted: Vec<(PilotId, String)> = o
            .pilots
            .iter()
            .filter_map(|(id, p)| match p {
                Pilot::Outstanding {
                    slurm_id: Some(s),
                    found,
                } if found.is_none_or(|t| {
                    !keep_found && now.saturating_duration_since(t) >= FOUND_GRACE
                }) =>
                {
                    Some((*id, s.clone()))
                }
                _ => None,
            })
            .collect();
        unwanted
            .into_iter()
            .map(|(pilot, slurm_id)| {
                o.pilots.remove(&pilot);
                Effect::CancelPilot { pilot, slurm_id }
            })
            .collect()
    }

    /// Whether an allocation holds a pilot's node that is not back: after a restart, one
    /// the core has no view of (its daemon has not reconnected: every host of the lab file
    /// is made known at start, a pilot's node only once its daemon connects), or one whose
    /// daemon connected but has not reported yet (the node is known, not up). Taking the
    /// latter for back cancelled the found pilot of a node a job still held when a tick
    /// fell between the connection and the first report (`overflow_tests`).
    fn a_held_host_is_not_back(&self) -> bool {
        self.by_host
            .keys()
            .any(|h| match self.host_view(h.as_str()) {
                None => true,
                Some(view) => is_pilot_node(view) && !view.up,
            })
    }

    /// Joined pilots whose host nobody has held for `idle_exit` are cancelled: nothing is
    /// held on Slurm that nobody uses.
    fn cancel_idle_pilots(&mut self, now: Instant) -> Vec<Effect> {
        let Some(o) = &mut self.overflow else {
            return Vec::new();
        };
        let mut idle = Vec::new();
        for (id, p) in &mut o.pilots {
            if let Pilot::Joined {
                host,
                slurm_id,
                idle_since,
                ..
            } = p
            {
                if self.by_host.contains_key(host.as_str()) {
                    *idle_since = None;
                    continue;
                }
                let since = *idle_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= o.idle_exit {
                    if let Some(s) = slurm_id {
                        idle.push((*id, s.clone()));
                    }
                }
            }
        }
        idle.into_iter()
            .map(|(pilot, slurm_id)| {
                o.pilots.remove(&pilot);
                Effect::CancelPilot { pilot, slurm_id }
            })
            .collect()
    }

    /// Joined pilots whose host went down are forgotten; new up `slurm` hosts join the
    /// oldest outstanding pilots.
    fn join_pilot_hosts(&mut self) {
        let up_slurm: Vec<String> = self
            .views()
            .filter(|h| h.up && is_pilot_node(h))
            .map(|h| h.name.clone())
            .collect();
        let Some(o) = &mut self.overflow else {
            return;
        };
        o.pilots.retain(|_, p| match p {
            Pilot::Joined { host, .. } => up_slurm.contains(host),
            Pilot::Outstanding { .. } => true,
        });
        for host in up_slurm {
            let known = o
                .pilots
                .values()
                .any(|p| matches!(p, Pilot::Joined { host: h, .. } if *h == host));
            if known {
                continue;
            }
            let oldest = o
                .pilots
                .iter_mut()
                .find(|(_, p)| matches!(p, Pilot::Outstanding { .. }));
            if let Some((_, p)) = oldest {
                let slurm_id = match p {
                    Pilot::Outstanding { slurm_id, .. } => slurm_id.take(),
                    Pilot::Joined { .. } => None,
                };
                *p = Pilot::Joined {
                    host,
                    slurm_id,
                    idle_since: None,
                    lease_end: None,
                    ending: false,
                };
            }
        }
    }

    /// Whether `job` may start on `host`: a pilot's host (labelled `slurm`) only runs the
    /// owner's jobs while overflow is on.
    pub(crate) fn pilot_allows(&self, job: JobId, host: &str) -> bool {
        let Some(o) = &self.overflow else {
            return true;
        };
        let pilot = self.host_view(host).is_some_and(is_pilot_node);
        !pilot || self.is_owners(job, &o.owner)
    }

    fn is_owners(&self, job: JobId, owner: &str) -> bool {
        self.jobs.get(&job).is_some_and(|j| j.info.user == owner)
    }

    /// How many of the owner's jobs have a waiting request the `overflow` hook says a
    /// pilot is for.
    fn jobs_wanting_pilots(&self, now: Instant) -> usize {
        let Some(o) = &self.overflow else {
            return 0;
        };
        let mut oldest: BTreeMap<JobId, Instant> = BTreeMap::new();
        for w in self
            .queue
            .iter()
            .filter(|w| self.may_want_pilot(w, &o.owner))
        {
            let t = oldest.entry(w.job).or_insert(w.since);
            *t = (*t).min(w.since);
        }
        oldest
            .into_iter()
            .filter(|(job, since)| self.overflow_for(*job, now.saturating_duration_since(*since)))
            .count()
    }

    /// Whether waiting request `w` counts toward its job's want of a pilot: the owner's,
    /// not restored, and no reclaim already bringing it a host.
    fn may_want_pilot(&self, w: &Waiting, owner: &str) -> bool {
        !w.restored && w.reserved.is_none() && self.is_owners(w.job, owner)
    }

    /// What overflow does for waiting request `w`, for `rb jobs`; `None` when overflow is
    /// off, the request does not count ([`Self::may_want_pilot`]), or the policy's
    /// `overflow` says no for its job (asked with the job's oldest counted wait, as the
    /// decision is).
    pub(crate) fn slurm_note(&self, w: &Waiting, now: Instant) -> Option<String> {
        let o = self.overflow.as_ref()?;
        if !self.may_want_pilot(w, &o.owner) {
            return None;
        }
        let since = self
            .queue
            .iter()
            .filter(|v| v.job == w.job && self.may_want_pilot(v, &o.owner))
            .map(|v| v.since)
            .min()
            .unwrap_or(w.since);
        if !self.overflow_for(w.job, now.saturating_duration_since(since)) {
            return None;
        }
        let queued = o.outstanding();
        Some(match o.retry_at {
            _ if queued > 0 => format!("waits for Slurm: {queued} pilot(s) queued"),
            Some(t) if now < t => format!(
                "waits for Slurm: sbatch failed, trying again in {:.0} s",
                t.saturating_duration_since(now).as_secs_f64().ceil()
            ),
            _ if o.pilots.len() >= o.max_nodes => format!(
                "waits for Slurm: max_nodes ({}) pilots already run",
                o.max_nodes
            ),
            _ => "waits for Slurm: a pilot is asked for".to_string(),
        })
    }

    /// The policy's `overflow` for `job`, whose oldest request waited `waited`.
    fn overflow_for(&self, job: JobId, waited: Duration) -> bool {
        let Some((facts, _)) = self.inputs.jobs.get(&job) else {
            return false;
        };
        let mut facts = facts.clone();
        facts.waited_s = waited.as_secs_f64();
        let value = policies::value::JobValue::new(&facts);
        let Some(scope) = self.job_scope(job) else {
            return false;
        };
        let d = self.policy.overflow(scope.job(&value));
        self.note_error(&d, "-", Some(job));
        d.value
    }
}
