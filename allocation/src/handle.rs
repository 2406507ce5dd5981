//! [`Allocator::handle`]: the allocator's one entry point. Every [`Input`] the broker's
//! shell builds from a wire message, an admin command, a host change or its clock, and every
//! input `rb policy replay` reads from a trace, goes through this one mapping onto the
//! allocator, so a replay re-derives each decision the broker made.
//!
//! The rules that decide about an agent's job live here too, not in the shell: who may
//! resume a job after a broker restart and for how long ([`RESUME_WINDOW`]), that a module
//! job is never granted the lab host its agent runs on (its front end), that a job whose
//! agent is gone ends, and that a job gives back or confirms only allocations of its own.

use std::{sync::Arc, time::Duration, time::Instant};

use crate::{
    trace::{apply_delta, find_alloc, Input, RunsOn},
    AllocError, AllocId, Allocator, Effect, JobId, JobInfo, PreparedPolicy, RequestId, Retired,
};

/// How long a job restored after a broker restart waits for its agent to come back
/// ([`Allocator::await_agents`]); then it ends.
pub const RESUME_WINDOW: Duration = Duration::from_secs(60);

/// What [`Allocator::handle`] did with one input.
#[derive(Debug)]
pub struct Handled {
    /// The input as handled, with the ids it was given (`Register`'s job, `Allocate`'s
    /// request): what the trace records.
    pub input: Input,
    pub effects: Vec<Effect>,
    pub answer: Answer,
}

/// What the caller learns besides the effects.
#[derive(Debug)]
pub enum Answer {
    /// Nothing more.
    Done,
    /// A job registered (`resumed`: the one it asked to take up again). `front_end`: the
    /// lab host its agent runs on; `own_host`, the same for a module job, which is never
    /// granted it.
    Job {
        job: JobId,
        resumed: bool,
        front_end: Option<String>,
        own_host: Option<String>,
    },
    /// The request id an `Allocate` got.
    Request(RequestId),
    /// An `End` or `AgentGone`: whether the job was running until then.
    Ended { was_running: bool },
    /// `UsesHosts`: the lab hosts among the names given.
    Uses(Vec<String>),
    /// The input names nothing the allocator has (an allocation the job does not hold, a
    /// release not asked for): nothing changed, nothing to record.
    Ignored(String),
    /// An admin input refused (unknown host…): nothing changed, nothing to record.
    Refused(AllocError),
    /// `Explain`'s answer.
    Explained(Result<serde_json::Value, String>),
    /// A policy change: what it replaced, to drop off the caller's hot path.
    Retired(Retired),
    /// The input cannot be applied (a trace line that does not rebuild a host view).
    Invalid(String),
}

impl Handled {
    /// Whether the trace records it: not an input that changed nothing (an ignored or
    /// refused one, the end of a job that had ended, a tick that decided nothing).
    pub fn recorded(&self) -> bool {
        match self.answer {
            Answer::Ignored(_) | Answer::Refused(_) | Answer::Invalid(_) => false,
            Answer::Ended { was_running } => was_running,
            _ => !matches!(self.input, Input::Tick) || !self.effects.is_empty(),
        }
    }
}

impl Allocator {
    /// The one entry point: applies `input` at `now` and says what to do (see the module
    /// docs). Ids the input carries for what it creates (`Register`'s job, `Allocate`'s
    /// request) are ignored and replaced by those given.
    pub fn handle(&mut self, input: Input, now: Instant) -> Handled {
        let (input, effects, answer) = match input {
            Input::Register {
                info,
                resume,
                runs_on,
                module,
                ..
            } => return self.register(info, resume, runs_on, module, now),
            Input::Allocate { job, symbolic, .. } => {
                let (req, effects) = self.request(job, &symbolic, now);
                let input = Input::Allocate { job, req, symbolic };
                (input, effects, Answer::Request(req))
            }
            Input::HostsRepeated { hosts } => {
                let mut effects = Vec::new();
                let mut invalid = None;
                for host in &hosts {
                    match self.host_input(host, &Default::default(), None, now) {
                        Ok(more) => effects.extend(more),
                        Err(e) => invalid = invalid.or(Some(e)),
                    }
                }
                let answer = invalid.map_or(Answer::Done, Answer::Invalid);
                (Input::HostsRepeated { hosts }, effects, answer)
            }
            Input::Host {
                host,
                changed,
                view,
            } => {
                let (effects, answer) =
                    match self.host_input(&host, &changed, view.map(|v| *v), now) {
                        Ok(effects) => (effects, Answer::Done),
                        Err(e) => (Vec::new(), Answer::Invalid(e)),
                    };
                let input = Input::Host {
                    host,
                    changed,
                    view: None,
                };
                (input, effects, answer)
            }
            other => {
                let (effects, answer) = self.apply(&other, now);
                (other, effects, answer)
            }
        };
        Handled {
            input,
            effects,
            answer,
        }
    }

    /// Inputs that create nothing.
    fn apply(&mut self, input: &Input, now: Instant) -> (Vec<Effect>, Answer) {
        let done = |effects| (effects, Answer::Done);
        let admin = |r: Result<Vec<Effect>, AllocError>| match r {
            Ok(effects) => (effects, Answer::Done),
            Err(e) => (Vec::new(), Answer::Refused(e)),
        };
        match input {
            Input::Cancel { req, .. } => done(self.cancel(*req)),
            Input::GiveBack { job, host, req } => self.return_alloc(*job, host, *req, false, now),
            Input::Released { job, host, req } => self.return_alloc(*job, host, *req, true, now),
            Input::End { job } => {
                let was_running = self.is_running(*job);
                self.awaiting.remove(job);
                let mut effects = self.end_job(*job, now);
                // Before `Persist`, which comes last.
                let at = effects.len() - usize::from(effects.last() == Some(&Effect::Persist));
                effects.insert(at, Effect::ConfirmEnd { job: *job });
                (effects, Answer::Ended { was_running })
            }
            Input::AgentGone { job } => {
                let was_running = self.is_running(*job);
                self.awaiting.remove(job);
                (self.end_job(*job, now), Answer::Ended { was_running })
            }
            Input::Resumed { job } => {
                self.awaiting.remove(job);
                done(self.resumed(*job, now))
            }
            Input::UsesHosts { job, hosts } => {
                let hosts: Vec<String> = hosts.iter().filter_map(|h| self.lab_host(h)).collect();
                let effects = self.uses_hosts(*job, hosts.clone(), now);
                (effects, Answer::Uses(hosts))
            }
            Input::ReleaseHost { host, grace_us } => {
                admin(self.release_host(host, Duration::from_micros(*grace_us), now))
            }
            Input::LeaseEnds { host, grace_us } => {
                admin(self.lease_ends(host, Duration::from_micros(*grace_us), now))
            }
            Input::Drain { host } => admin(self.drain(host)),
            Input::Resume { host } => admin(self.resume(host, now)),
            Input::Tick => done(self.tick(now)),
            Input::Policy { .. } => self.policy_input(now),
            Input::AllocsRunning { host, allocs } => done(self.allocs_running(host, allocs, now)),
            Input::Explain { host, job } => {
                let answer = self.explain(host, *job, now);
                (Vec::new(), Answer::Explained(answer))
            }
            Input::Register { .. }
            | Input::Allocate { .. }
            | Input::Host { .. }
            | Input::HostsRepeated { .. } => {
                (Vec::new(), Answer::Invalid("handled by `handle`".into()))
            }
        }
    }

    /// A host's new view: the whole of it (`view`), or the fields that changed since the
    /// last one; none changed is a repeated report.
    fn host_input(
        &mut self,
        host: &str,
        changed: &crate::trace::Delta,
        view: Option<crate::HostView>,
        now: Instant,
    ) -> Result<Vec<Effect>, String> {
        if let Some(view) = view {
            return Ok(self.host_changed(view, now));
        }
        if changed.is_empty() && self.host_repeated(host, now) {
            return Ok(Vec::new());
        }
        let view = apply_delta(self.host_view(host), host, changed)?;
        Ok(self.host_changed(view, now))
    }

    /// An agent registers: resumes the job it names when it may, else a new job; a module
    /// job's front end is never granted to it.
    fn register(
        &mut self,
        info: JobInfo,
        resume: Option<JobId>,
        runs_on: Option<RunsOn>,
        module: bool,
        now: Instant,
    ) -> Handled {
        let resumable = resume.filter(|&j| self.may_resume(j, &info.user));
        let (job, mut effects) = match resumable {
            Some(job) => {
                self.awaiting.remove(&job);
                (job, self.resumed(job, now))
            }
            None => self.register_job(info.clone(), now),
        };
        let front_end = runs_on
            .as_ref()
            .and_then(|on| self.lab_host_of(&on.hostname, &on.addresses));
        let own_host = front_end.clone().filter(|_| module);
        if let Some(host) = &own_host {
            effects = merge(effects, self.uses_hosts(job, [host.clone()], now));
        }
        Handled {
            input: Input::Register {
                job,
                info,
                resume,
                runs_on,
                module,
            },
            effects,
            answer: Answer::Job {
                job,
                resumed: resumable.is_some(),
                front_end,
                own_host,
            },
        }
    }

    /// Whether `user`'s agent may take up `job` again: the job was restored after a broker
    /// restart, its agent has not come back yet, it runs, and it is `user`'s (the
    /// authenticated user).
    pub fn may_resume(&self, job: JobId, user: &str) -> bool {
        self.awaiting.contains_key(&job)
            && self.is_running(job)
            && self.job_info(job).is_some_and(|i| i.user == user)
    }

    /// Every running job (restored after a restart) waits `window` for its agent to come
    /// back ([`Input::Register`] with `resume`); then [`Allocator::tick`] ends it.
    pub fn await_agents(&mut self, window: Duration, now: Instant) {
        let running: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state == crate::JobState::Running)
            .map(|(&id, _)| id)
            .collect();
        for job in running {
            self.awaiting.insert(job, now + window);
        }
    }

    /// Ends the jobs whose agent did not come back within the resume window.
    pub(crate) fn end_late_agents(&mut self, now: Instant) -> Vec<Effect> {
        let late: Vec<JobId> = self
            .awaiting
            .iter()
            .filter(|(_, &deadline)| deadline <= now)
            .map(|(&job, _)| job)
            .collect();
        let mut effects = Vec::new();
        for job in late {
            self.awaiting.remove(&job);
            effects.push(Effect::AgentLate { job });
            effects = merge(effects, self.end_job(job, now));
        }
        effects
    }

    /// A give-back or a confirmed release by `job` of its allocation of `host` (granted
    /// for `req`); a confirmation only of an allocation being taken back.
    fn return_alloc(
        &mut self,
        job: JobId,
        host: &str,
        req: Option<RequestId>,
        confirmed: bool,
        now: Instant,
    ) -> (Vec<Effect>, Answer) {
        let Some(alloc) = find_alloc(self, job, host, req) else {
            let why = format!("job {job} holds no allocation of {host}");
            return (Vec::new(), Answer::Ignored(why));
        };
        if confirmed && !self.is_releasing(alloc) {
            let why = format!("{host} is not being taken back from job {job}");
            return (Vec::new(), Answer::Ignored(why));
        }
        (self.give_back(alloc, now), Answer::Done)
    }

    /// The input for `job`'s agent returning allocation `alloc` (`confirmed`: its word
    /// that a reclaim is done), named as the trace names it (host and request); `None` for
    /// an allocation that is over. A confirmation of an allocation nobody is taking back is
    /// a give-back: the agent is done with the host either way.
    pub fn return_input(&self, job: JobId, alloc: AllocId, confirmed: bool) -> Option<Input> {
        let (host, req) = self.alloc_host(alloc)?;
        Some(match confirmed && self.is_releasing(alloc) {
            true => Input::Released { job, host, req },
            false => Input::GiveBack { job, host, req },
        })
    }

    /// Puts in force the policy staged by [`Allocator::stage_policy`], else the policy in
    /// force again (a replay decides with its own).
    fn policy_input(&mut self, now: Instant) -> (Vec<Effect>, Answer) {
        match self.staged.take().and_then(|p| Arc::try_unwrap(p).ok()) {
            Some(prepared) => {
                let (effects, retired) = self.set_prepared_policy(prepared, now);
                (effects, Answer::Retired(retired))
            }
            None => (self.set_policy(self.policy.clone(), now), Answer::Done),
        }
    }

    /// The next [`Input::Policy`] puts `prepared` in force (worked out off the caller's
    /// hot path: [`crate::HostInputs::prepare`]).
    pub fn stage_policy(&mut self, prepared: PreparedPolicy) {
        self.staged = Some(Arc::new(prepared));
    }
}

/// `a` then `b`, one `Persist` last when either asked for one.
pub(crate) fn merge(mut a: Vec<Effect>, b: Vec<Effect>) -> Vec<Effect> {
    let persist = a.last() == Some(&Effect::Persist) || b.last() == Some(&Effect::Persist);
    a.retain(|e| *e != Effect::Persist);
    a.extend(b.into_iter().filter(|e| *e != Effect::Persist));
    if persist {
        a.push(Effect::Persist);
    }
    a
}
