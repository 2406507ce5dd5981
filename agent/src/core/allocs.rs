//! The job's allocations: grants, subagents attaching and leaving, reclaims (subagents told
//! to end by the deadline), hosts handed back, launchers that ended without starting a
//! subagent, and the hosts file that lists them.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use proto::{
    agent::TAKEN_BACK_MEMORY,
    msg::{FromBroker, ToBroker},
};
use tracing::info;

use super::{AgentCore, AllocId, Out, Output, PoolEvent, ReqId, SubId, Timer};

/// How long after its launcher ended a subagent may still attach: as long as a guardian keeps
/// trying to reach its agent before it ends its command by itself.
pub(super) const LATE_ATTACH: Duration = super::link_loss::AGENT_LOSS_LIMIT;

/// A host the broker granted to the job.
#[derive(Debug)]
pub(super) struct Alloc {
    pub(super) host: String,
    pub(super) address: String,
    /// The subagents attached for it.
    pub(super) subs: BTreeSet<SubId>,
    /// A subagent attached at least once.
    pub(super) used: bool,
    /// The broker asked for it back (or the job ends).
    pub(super) reclaiming: bool,
    /// When a reclaim must be done by (module jobs: shrink first, then the subagents).
    pub(super) deadline: Option<Instant>,
    /// Bound to an instance name (`anyLinux-1`): kept between commands until the job ends
    /// or the broker takes it back.
    pub(super) instance: bool,
    /// Processes a `Granted` answer for this host went to (shims, then the remote shells
    /// they exec) that still run: each may still start a subagent here, so the job's end
    /// waits for them.
    pub(super) launchers: BTreeSet<u32>,
}

/// An allocation the broker took back from the job, for shims that ask (`taken_back`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TakenBack {
    pub(super) alloc: AllocId,
    pub(super) host: String,
    /// Why, for the shim's line on stderr.
    pub(super) message: String,
}

impl AgentCore {
    /// The broker granted `alloc` on `host` for `req`; `bound` when it read the request's
    /// name as an instance.
    pub(super) fn granted(
        &mut self,
        req: ReqId,
        alloc: AllocId,
        host: String,
        address: String,
        bound: bool,
        out: &mut Out,
    ) {
        info!(req, alloc, %host, "host granted");
        let a = Alloc {
            host: host.clone(),
            address: address.clone(),
            subs: BTreeSet::new(),
            used: false,
            reclaiming: false,
            deadline: None,
            instance: false,
            launchers: BTreeSet::new(),
        };
        self.allocs.insert(alloc, a);
        out.push(Output::Pool(PoolEvent::HostGranted { host: host.clone() }));
        self.write_hosts(out);
        if self.phase_two(req, alloc, &host, &address, out) {
            return;
        }
        if !self.offer_grant(req, alloc, bound, out) {
            self.give_back_untaken(alloc, out);
        }
    }

    /// A grant no shim took goes back to the broker.
    pub(super) fn give_back_untaken(&mut self, alloc: AllocId, out: &mut Out) {
        self.remove_alloc(alloc, out);
        self.write_hosts(out);
        self.tell_broker(ToBroker::GiveBack { alloc }, out);
    }

    pub(super) fn sub_connected(
        &mut self,
        alloc: AllocId,
        sub: SubId,
        now: Instant,
        out: &mut Out,
    ) {
        let Some(a) = self.allocs.get_mut(&alloc) else {
            // Not (or no longer) ours: end it at once.
            let msg = FromBroker::Terminate { grace_ms: 0 };
            out.push(Output::ToSub { sub, msg });
            out.push(Output::CloseSub { sub });
            return;
        };
        a.used = true;
        if a.reclaiming {
            // What is left of the reclaim's grace period.
            let grace_ms = a.deadline.map_or(self.cfg.grace_ms, |d| {
                d.saturating_duration_since(now).as_millis() as u64
            });
            let msg = FromBroker::Terminate { grace_ms };
            out.push(Output::ToSub { sub, msg });
        }
        a.subs.insert(sub);
    }

    pub(super) fn sub_gone(&mut self, alloc: AllocId, sub: SubId, now: Instant, out: &mut Out) {
        let Some(a) = self.allocs.get_mut(&alloc) else {
            return;
        };
        a.subs.remove(&sub);
        // A module job keeps its hosts between remote commands (LAM probes a host before
        // it boots a daemon there), and every job its instances' hosts: they go back on
        // reclaim or at job end.
        let kept = self.module.is_some() || a.instance;
        if !a.subs.is_empty() || (kept && !a.reclaiming) {
            // The host stays the job's: whether the JEL members that subagent relayed still
            // run is known once its own deadline for ending them has passed.
            let timer = Timer::LinkLost { alloc };
            let at = now + super::link_loss::ENDS_AFTER_LOSS;
            out.push(Output::SetTimer { timer, at });
            return;
        }
        self.hand_back(alloc, out);
    }

    /// The job is done with `alloc`: forget it, and tell the broker — `Released` when the
    /// broker had asked for it back, else `GiveBack`.
    pub(super) fn hand_back(&mut self, alloc: AllocId, out: &mut Out) {
        let Some(a) = self.remove_alloc(alloc, out) else {
            return;
        };
        self.instances.given_back(alloc);
        self.write_hosts(out);
        let msg = if a.reclaiming {
            ToBroker::Released { alloc }
        } else {
            ToBroker::GiveBack { alloc }
        };
        self.tell_broker(msg, out);
    }

    /// `alloc` leaves the job: forgotten, and the pool told (`host_released`, its members
    /// still there dead) before anyone else learns it.
    pub(super) fn remove_alloc(&mut self, alloc: AllocId, out: &mut Out) -> Option<Alloc> {
        let a = self.allocs.remove(&alloc)?;
        let host = a.host.clone();
        out.push(Output::Pool(PoolEvent::HostReleased { host }));
        Some(a)
    }

    /// The broker wants `alloc` back within `grace_ms`.
    pub(super) fn reclaim(
        &mut self,
        alloc: AllocId,
        host: &str,
        grace_ms: u64,
        now: Instant,
        out: &mut Out,
    ) {
        info!(alloc, %host, grace_ms, "broker reclaims host");
        self.instances.taken_back(alloc, host);
        self.remember_taken_back(alloc, grace_ms);
        if self.module_shrink(alloc, grace_ms, now, out) {
            return;
        }
        let Some(a) = self.allocs.get_mut(&alloc) else {
            return self.tell_broker(ToBroker::Released { alloc }, out);
        };
        // `released` when no subagent is attached to a host that had one, even if
        // an orphaned process group of the job still runs there.
        if a.subs.is_empty() && a.used {
            self.remove_alloc(alloc, out);
            self.write_hosts(out);
            return self.tell_broker(ToBroker::Released { alloc }, out);
        }
        let deadline = now + Duration::from_millis(grace_ms);
        // `vacate` (once) before any subagent is told to end the host's processes.
        if !a.reclaiming {
            let host = a.host.clone();
            out.push(Output::Pool(PoolEvent::Reclaim { host, deadline }));
        }
        a.reclaiming = true;
        a.deadline = Some(deadline);
        if !a.used {
            // Granted to a shim whose remote shell is still starting the subagent: the
            // command may already run there. Its subagent gets Terminate when it attaches;
            // if none attaches within the grace period (the remote shell failed), release.
            let timer = Timer::LaunchWindow { alloc };
            out.push(Output::SetTimer {
                timer,
                at: deadline,
            });
            return;
        }
        for &sub in &a.subs {
            let msg = FromBroker::Terminate { grace_ms };
            out.push(Output::ToSub { sub, msg });
        }
    }

    /// A subagent link of `alloc` was lost [`super::link_loss::ENDS_AFTER_LOSS`] ago: the
    /// pool ends what it relayed (see [`PoolEvent::LinkLost`]).
    pub(super) fn link_loss_over(&mut self, alloc: AllocId, out: &mut Out) {
        if let Some(a) = self.allocs.get(&alloc) {
            out.push(Output::Pool(PoolEvent::LinkLost {
                alloc,
                host: a.host.clone(),
                host_lost: a.subs.is_empty(),
            }));
        }
    }

    /// `alloc`, if the job holds it, was taken back: remembered (once) for the shims whose
    /// remote shell exits 0 after its command was ended ([`Self::taken_back`]).
    fn remember_taken_back(&mut self, alloc: AllocId, grace_ms: u64) {
        let Some(a) = self.allocs.get(&alloc) else {
            return;
        };
        if self.taken_back.iter().any(|t| t.alloc == alloc) {
            return;
        }
        let message = format!(
            "allocation {alloc} reclaimed with {grace_ms} ms of grace: what ran there was ended"
        );
        self.taken_back.push_back(TakenBack {
            alloc,
            host: a.host.clone(),
            message,
        });
        self.taken_back_added += 1;
        while self.taken_back.len() > TAKEN_BACK_MEMORY {
            self.taken_back.pop_front();
        }
    }

    /// Whether (and how) the broker took `alloc` back from the job.
    pub(super) fn taken_back(&self, alloc: AllocId) -> Option<&TakenBack> {
        self.taken_back.iter().find(|t| t.alloc == alloc)
    }

    /// A reclaimed host whose launch never attached a subagent goes back to the broker.
    pub(super) fn launch_window_over(&mut self, alloc: AllocId, out: &mut Out) {
        let unused = self
            .allocs
            .get(&alloc)
            .is_some_and(|a| a.reclaiming && !a.used);
        if unused {
            info!(
                alloc,
                "no subagent attached within the grace period; releasing"
            );
            self.hand_back(alloc, out);
        }
    }

    /// `pid` got a `Granted` answer for `alloc`: it is watched until it ends.
    pub(super) fn watch_launcher(&mut self, alloc: AllocId, pid: u32, out: &mut Out) {
        if let Some(a) = self.allocs.get_mut(&alloc) {
            a.launchers.insert(pid);
            out.push(Output::WatchLauncher { alloc, pid });
        }
    }

    /// The launcher `pid` of `alloc` ended: a late subagent gets [`LATE_ATTACH`] to attach.
    pub(super) fn launcher_exited(
        &mut self,
        alloc: AllocId,
        pid: u32,
        now: Instant,
        out: &mut Out,
    ) {
        let Some(a) = self.allocs.get_mut(&alloc) else {
            return;
        };
        a.launchers.remove(&pid);
        let timer = Timer::LateAttach { alloc };
        out.push(Output::SetTimer {
            timer,
            at: now + LATE_ATTACH,
        });
    }

    /// The launcher of `alloc` is long gone: if no subagent ever attached, the remote shell
    /// failed before starting one, and the host goes back instead of staying held until the
    /// job ends.
    pub(super) fn launcher_gone(&mut self, alloc: AllocId, out: &mut Out) {
        let Some(a) = self.allocs.get(&alloc) else {
            return;
        };
        if a.used || !a.subs.is_empty() || a.instance {
            return;
        }
        info!(
            alloc,
            host = %a.host,
            "the remote shell given this host ended without starting a subagent; giving it back"
        );
        self.hand_back(alloc, out);
    }

    /// Whether `host` (a name or an address) is one of the job's allocations.
    pub(super) fn holds(&self, host: &str) -> bool {
        self.allocs
            .values()
            .any(|a| a.host == host || a.address == host)
    }

    pub(super) fn write_hosts(&self, out: &mut Out) {
        let hosts = self
            .allocs
            .iter()
            .map(|(id, a)| (a.host.clone(), a.address.clone(), *id))
            .collect();
        out.push(Output::WriteHosts(hosts));
    }
}
