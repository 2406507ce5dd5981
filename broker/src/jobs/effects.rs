//! Effects carried out: messages to agents, the store's save, pilots; a job's end
//! confirmed to its agent once it is saved.

use super::*;

impl JobDesk {
    /// Performs effects: messages to agents, never waited on. An agent whose outbox is
    /// full is cut and its job ended as if its connection had closed ([`Self::agent_gone`]),
    /// and what that decides is performed too. Returns true when durable state changed.
    pub fn perform(&mut self, effects: Vec<Effect>, now: Instant) -> bool {
        let mut persist = self.perform_each(effects);
        while let Some(job) = self.cut.pop() {
            let effects = self.agent_gone(job, now);
            persist |= self.perform_each(effects);
        }
        if persist {
            if let Some(store) = &mut self.store {
                store.save(self.alloc.snapshot());
            }
        }
        self.confirm_ends();
        persist
    }

    /// Performs effects in order; true when one of them asks for a save.
    pub(super) fn perform_each(&mut self, effects: Vec<Effect>) -> bool {
        let mut persist = false;
        for effect in effects {
            crate::web::METRICS.effect(&effect);
            match effect {
                Effect::Granted {
                    job,
                    req,
                    alloc,
                    host,
                    address,
                    instance,
                } => match self.forget_req(req) {
                    Some((_, agent_req)) => {
                        // Sent, then logged: the line costs tens of µs the grant need not wait.
                        let logged_host = host.clone();
                        let msg = FromBroker::Granted {
                            req: agent_req,
                            alloc,
                            host,
                            address,
                            instance,
                        };
                        self.send(job, msg);
                        info!(job, alloc, host = %logged_host, ?instance, "granted");
                    }
                    None => warn!(job, req, alloc, %host, "granted a request no agent asked for"),
                },
                Effect::Queued {
                    job,
                    req,
                    position,
                    reason,
                } => {
                    if let Some(&(_, agent_req)) = self.agent_req.get(&req) {
                        self.send(
                            job,
                            FromBroker::Queued {
                                req: agent_req,
                                position: position as u32,
                                reason: Some(reason),
                            },
                        );
                    }
                }
                Effect::Refused { job, req, reason } => {
                    if let Some((_, agent_req)) = self.forget_req(req) {
                        self.send(
                            job,
                            FromBroker::Refused {
                                req: agent_req,
                                message: reason,
                            },
                        );
                    }
                }
                Effect::Reclaim {
                    job,
                    alloc,
                    host,
                    grace,
                } => {
                    info!(job, alloc, %host, "reclaiming");
                    self.send(
                        job,
                        FromBroker::Reclaim {
                            alloc,
                            host,
                            grace_ms: grace.as_millis() as u64,
                        },
                    );
                }
                Effect::ForceRelease { job, alloc, host } => {
                    warn!(job, alloc, %host, "release deadline passed; forcing");
                    self.send(
                        job,
                        FromBroker::Reclaim {
                            alloc,
                            host,
                            grace_ms: 0,
                        },
                    );
                }
                Effect::Freed { .. } => {}
                Effect::AgentLate { job } => warn!(
                    job,
                    "agent did not come back after the broker restarted; its job ended"
                ),
                Effect::PolicyError {
                    key,
                    host,
                    job,
                    message,
                } => {
                    warn!(key, %host, ?job, %message, "policy expression failed; its default was used");
                }
                Effect::SubmitPilot { pilot } => match &self.pilots {
                    Some(p) => p.submit(pilot),
                    None => warn!(pilot, "a pilot asked for without [overflow.slurm]"),
                },
                Effect::CancelPilot { pilot, slurm_id } => {
                    if let Some(p) = &self.pilots {
                        p.cancel(pilot, slurm_id);
                    }
                }
                Effect::ConfirmEnd { job } => self.ended_by_agent.push(job),
                Effect::Persist => persist = true,
            }
        }
        persist
    }

    /// Tells each agent whose job ended by its word that the end is saved, once everything
    /// queued for the disk up to it is written (the end was queued by [`Self::perform`]).
    /// The agent waits for this before it exits: a broker killed between the agent's
    /// `end_job` and the save would otherwise bring the job back with its hosts held until
    /// [`RESUME_WINDOW`] passed, with no agent to end it. The core calls
    /// [`Self::saved_up_to`] as the writer makes progress; nothing waits here.
    pub(super) fn confirm_ends(&mut self) {
        let queued = self.store.as_ref().map_or(0, |s| s.queued());
        for job in std::mem::take(&mut self.ended_by_agent) {
            self.ends_unsaved.push((queued, job));
        }
        let written = self.store.as_ref().map_or(u64::MAX, |s| s.committed_now());
        self.saved_up_to(written);
    }

    /// The store's writer has written every snapshot up to `written`: the ends waiting for
    /// it are confirmed to their agents.
    pub fn saved_up_to(&mut self, written: u64) {
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ends_unsaved)
            .into_iter()
            .partition(|(seq, _)| *seq <= written);
        self.ends_unsaved = waiting;
        for (_, job) in done {
            self.send(job, FromBroker::JobEnded { job });
        }
    }

    /// Whether an end waits for the disk (the core then watches the writer's progress).
    pub fn ends_wait_for_disk(&self) -> bool {
        !self.ends_unsaved.is_empty()
    }

    /// The writer's progress, which [`Self::saved_up_to`] is to be told of.
    pub fn store_progress(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.store.as_ref().map(|s| s.progress())
    }
}
