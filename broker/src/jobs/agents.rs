//! Agents' side of the job desk: registrations and messages turned into allocator inputs,
//! and each agent's outbox (never waited on; a full one is cut).

use super::*;

impl JobDesk {
    /// Registers a job for a newly connected agent; a new job (not a resumed one) is refused
    /// with the reason when the state dir cannot take it (full, read-only). Whether the job
    /// is resumed, and which host is its front end, the allocator decides.
    pub fn register(
        &mut self,
        reg: JobRegistration,
        tx: Outbox,
        now: Instant,
    ) -> Result<(JobId, Vec<Effect>), String> {
        let resumes = reg
            .resume
            .is_some_and(|j| self.alloc.may_resume(j, &reg.user));
        if let (false, Some(store)) = (resumes, &self.store) {
            store.check_writable().inspect_err(|e| {
                crate::web::METRICS.refused("job");
                warn!(error = %e, "job refused");
            })?;
        }
        let (effects, answer) = self.handle(registration_input(reg), now);
        let Answer::Job {
            job,
            resumed,
            front_end,
            own_host,
        } = answer
        else {
            return Err(format!("the allocator registered no job: {answer:?}"));
        };
        let msg = FromBroker::Registered {
            job,
            remote_shell: self.remote_shell.clone(),
            transport: self.transport.clone(),
            secret_file: self.secret_file.clone(),
            hosts_reach_broker_at: self.hosts_reach_broker_at,
            lab_mark: self.lab_mark.clone(),
            front_end,
        };
        // A new outbox has room: this cannot be refused as full.
        let _ = tx.push(msg);
        self.agents.insert(job, tx);
        match resumed {
            true => info!(job, "agent reconnected; job resumed"),
            false => info!(job, "job registered"),
        }
        if let Some(host) = own_host {
            info!(job, %host, "a module job runs on this lab host: never granted to it");
        }
        Ok((job, effects))
    }

    /// A give-back (`confirmed`: a confirmed release after a reclaim) of allocation `alloc`
    /// by `job`'s agent; the allocator applies it only to an allocation of the job's own.
    pub(super) fn return_alloc(
        &mut self,
        job: JobId,
        alloc: AllocId,
        confirmed: bool,
        now: Instant,
    ) -> Vec<Effect> {
        // A late answer about an allocation that is over: the broker forced the release at
        // its deadline, or the agent answered both the reclaim and its re-sending after a
        // broker restart.
        let Some(input) = self.alloc.return_input(job, alloc, confirmed) else {
            debug!(
                job,
                alloc, "ignoring the return of an allocation the job no longer holds"
            );
            return Vec::new();
        };
        let (effects, answer) = self.handle(input, now);
        if let Answer::Ignored(why) = answer {
            warn!(job, alloc, %why, "ignoring the return of an allocation");
        }
        effects
    }

    /// A message from `job`'s agent.
    pub fn agent_message(&mut self, job: JobId, msg: ToBroker, now: Instant) -> Vec<Effect> {
        match msg {
            ToBroker::Allocate { req, symbolic } => {
                let input = Input::Allocate {
                    job,
                    req: 0,
                    symbolic,
                };
                let (effects, answer) = self.handle(input, now);
                if let Answer::Request(id) = answer {
                    self.by_agent_req.insert((job, req), id);
                    self.agent_req.insert(id, (job, req));
                    crate::web::METRICS.requested(id);
                }
                effects
            }
            ToBroker::Cancel { req } => match self.by_agent_req.remove(&(job, req)) {
                Some(id) => {
                    self.agent_req.remove(&id);
                    self.handle(Input::Cancel { job, req: id }, now).0
                }
                None => Vec::new(),
            },
            ToBroker::GiveBack { alloc } => self.return_alloc(job, alloc, false, now),
            ToBroker::Released { alloc } => self.return_alloc(job, alloc, true, now),
            ToBroker::HostsInUse { hosts } => {
                let (effects, answer) = self.handle(Input::UsesHosts { job, hosts }, now);
                if let Answer::Uses(hosts) = answer {
                    info!(
                        job,
                        ?hosts,
                        "hosts the job uses by name: never granted to it"
                    );
                }
                effects
            }
            ToBroker::JobNote { text } => {
                self.add_note(job, &text);
                Vec::new()
            }
            ToBroker::EndJob { status } => {
                info!(job, status, "job ended");
                self.handle(Input::End { job }, now).0
            }
            other => {
                warn!(job, ?other, "ignoring a message an agent should not send");
                Vec::new()
            }
        }
    }

    pub(super) fn add_note(&mut self, job: JobId, text: &str) {
        let text: String = text.chars().take(NOTE_MAX_CHARS).collect();
        info!(job, note = ?text, "job note");
        let notes = self.notes.entry(job).or_default();
        if notes.len() == NOTES_KEPT {
            notes.pop_front();
        }
        notes.push_back(text);
    }

    /// The agent's connection closed: the allocator ends its job if it runs (its
    /// subagents end their processes).
    pub fn agent_gone(&mut self, job: JobId, now: Instant) -> Vec<Effect> {
        self.agents.remove(&job);
        let (effects, answer) = self.handle(Input::AgentGone { job }, now);
        if let Answer::Ended { was_running: true } = answer {
            warn!(job, "agent disconnected; its job ended");
        }
        effects
    }

    pub(super) fn forget_req(&mut self, req: RequestId) -> Option<(JobId, u64)> {
        let found = self.agent_req.remove(&req)?;
        self.by_agent_req.remove(&found);
        Some(found)
    }

    /// Queues `msg` for `job`'s agent without waiting; an agent whose outbox is full is
    /// cut (its job ends in [`Self::perform`]).
    pub(super) fn send(&mut self, job: JobId, msg: FromBroker) {
        let Some(outbox) = self.agents.get(&job) else {
            return;
        };
        match outbox.push(msg) {
            Ok(()) | Err(PushError::Closed) => {}
            Err(PushError::Full) => self.cut_agent(job),
        }
    }

    /// Cuts `job`'s agent, which does not read what it is sent: its connection closes and
    /// its job is ended as if the agent had gone.
    pub(super) fn cut_agent(&mut self, job: JobId) {
        let Some(mut outbox) = self.agents.remove(&job) else {
            return;
        };
        let reason = PushError::Full.to_string();
        outbox.cut(&reason);
        if self.cut_log.allow() {
            warn!(job, %reason, "agent connection cut");
        }
        self.cut.push(job);
    }
}

/// The allocator's input for an agent's registration (`reg.user` is the authenticated
/// user).
pub(super) fn registration_input(reg: JobRegistration) -> Input {
    Input::Register {
        job: 0,
        info: JobInfo {
            user: reg.user,
            cwd: reg.cwd,
            argv: reg.argv,
            spec: reg.spec,
            adaptive: reg.adaptive,
        },
        resume: reg.resume,
        runs_on: reg.runs_on.map(|on| RunsOn {
            hostname: on.hostname,
            addresses: on.addresses,
        }),
        module: reg.module.is_some(),
    }
}
