//! The job side of the broker core: owns the [`Allocator`], knows which agent connection
//! serves which job, maps each agent's own request ids to broker request ids, and turns
//! allocation effects into messages for agents. Called only from the core task.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, Instant},
};

use proto::{
    msg::{FromBroker, JobRegistration, Request, Response, ToBroker},
    report::HostStatus,
};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::alloc::{AllocId, Allocator, Effect, HostView, JobId, JobInfo, RequestId};

/// Grace of `rb release` when none is given.
pub const DEFAULT_RELEASE_GRACE: Duration = Duration::from_secs(5);

/// How long a job restored after a broker restart waits for its agent to come back.
pub const RESUME_WINDOW: Duration = Duration::from_secs(60);

/// Jobs, their agents and their allocations.
pub struct JobDesk {
    alloc: Allocator,
    agents: HashMap<JobId, mpsc::Sender<FromBroker>>,
    /// Jobs restored from the store whose agents have not reconnected yet, with a deadline.
    awaiting_agent: HashMap<JobId, Instant>,
    store: Option<crate::persist::StoreWriter>,
    by_agent_req: HashMap<(JobId, u64), RequestId>,
    agent_req: HashMap<RequestId, (JobId, u64)>,
    remote_shell: Vec<String>,
    transport: String,
    secret_file: String,
    /// The broker's IP as its hosts reach it, told to agents
    /// (see [`Self::with_hosts_reach_broker_at`]).
    hosts_reach_broker_at: Option<std::net::IpAddr>,
    /// The last [`NOTES_KEPT`] notes of each job (from its agent), oldest first.
    notes: HashMap<JobId, VecDeque<String>>,
}

/// Notes kept per job, and the longest note kept (longer ones are cut).
const NOTES_KEPT: usize = 8;
const NOTE_MAX_CHARS: usize = 500;

impl JobDesk {
    pub fn new(
        alloc: Allocator,
        remote_shell: Vec<String>,
        transport: &str,
        secret_file: &std::path::Path,
    ) -> Self {
        Self {
            secret_file: secret_file.display().to_string(),
            alloc,
            agents: HashMap::new(),
            awaiting_agent: HashMap::new(),
            store: None,
            by_agent_req: HashMap::new(),
            agent_req: HashMap::new(),
            remote_shell,
            transport: transport.to_string(),
            hosts_reach_broker_at: None,
            notes: HashMap::new(),
        }
    }

    /// Agents are told `ip`, the broker's address as its hosts reach it: an agent that
    /// came through the control socket advertises its own address on the route there.
    pub fn with_hosts_reach_broker_at(mut self, ip: Option<std::net::IpAddr>) -> Self {
        self.hosts_reach_broker_at = ip;
        self
    }

    /// Restored running jobs get [`RESUME_WINDOW`] for their agents to reconnect; durable
    /// changes go to `store` from now on.
    pub fn with_store(mut self, store: crate::persist::StoreWriter, now: Instant) -> Self {
        for row in self.alloc.jobs() {
            if row.state == "running" {
                self.awaiting_agent.insert(row.id, now + RESUME_WINDOW);
            }
        }
        self.store = Some(store);
        self
    }

    /// True when some job runs (then host changes matter to the allocator).
    pub fn has_jobs(&self) -> bool {
        !self.agents.is_empty() || !self.awaiting_agent.is_empty()
    }

    /// Feeds fresh host views to the allocator.
    pub fn hosts_changed(&mut self, hosts: &[HostStatus], now: Instant) -> Vec<Effect> {
        let views: Vec<HostView> = hosts.iter().map(HostView::from).collect();
        self.alloc.hosts_changed(&views, now)
    }

    /// Registers a job for a newly connected agent.
    pub async fn register(
        &mut self,
        reg: JobRegistration,
        tx: mpsc::Sender<FromBroker>,
        now: Instant,
    ) -> (JobId, Vec<Effect>) {
        let resumable = reg
            .resume
            .filter(|j| self.awaiting_agent.contains_key(j) && self.alloc.is_running(*j));
        let (job, effects) = match resumable {
            Some(job) => {
                self.awaiting_agent.remove(&job);
                info!(job, "agent reconnected; job resumed");
                (job, self.alloc.resend_reclaims(now))
            }
            None => {
                let info = JobInfo {
                    user: reg.user,
                    cwd: reg.cwd,
                    argv: reg.argv,
                    spec: reg.spec,
                    adaptive: reg.adaptive,
                };
                self.alloc.register_job(info)
            }
        };
        let msg = FromBroker::Registered {
            job,
            remote_shell: self.remote_shell.clone(),
            transport: self.transport.clone(),
            secret_file: self.secret_file.clone(),
            hosts_reach_broker_at: self.hosts_reach_broker_at,
        };
        let _ = tx.send(msg).await;
        self.agents.insert(job, tx);
        info!(job, "job registered");
        (job, effects)
    }

    /// A message from `job`'s agent.
    pub fn agent_message(&mut self, job: JobId, msg: ToBroker, now: Instant) -> Vec<Effect> {
        match msg {
            ToBroker::Allocate { req, symbolic } => {
                let (id, effects) = self.alloc.request(job, &symbolic, now);
                self.by_agent_req.insert((job, req), id);
                self.agent_req.insert(id, (job, req));
                effects
            }
            ToBroker::Cancel { req } => match self.by_agent_req.remove(&(job, req)) {
                Some(id) => {
                    self.agent_req.remove(&id);
                    self.alloc.cancel(id)
                }
                None => Vec::new(),
            },
            ToBroker::GiveBack { alloc } if self.owns(job, alloc) => {
                self.alloc.give_back(alloc, now)
            }
            ToBroker::Released { alloc } if self.owns(job, alloc) => {
                self.alloc.release_confirmed(alloc, now)
            }
            ToBroker::JobNote { text } => {
                self.add_note(job, &text);
                Vec::new()
            }
            ToBroker::EndJob { status } => {
                info!(job, status, "job ended");
                self.alloc.end_job(job, now)
            }
            other => {
                warn!(job, ?other, "ignoring a message an agent should not send");
                Vec::new()
            }
        }
    }

    fn add_note(&mut self, job: JobId, text: &str) {
        let text: String = text.chars().take(NOTE_MAX_CHARS).collect();
        info!(job, note = %text, "job note");
        let notes = self.notes.entry(job).or_default();
        if notes.len() == NOTES_KEPT {
            notes.pop_front();
        }
        notes.push_back(text);
    }

    /// `rb jobs` rows: the allocator's, plus each job's notes.
    fn job_rows(&mut self) -> Vec<serde_json::Value> {
        let rows = self.alloc.jobs();
        let known: HashSet<JobId> = rows.iter().map(|r| r.id).collect();
        self.notes.retain(|job, _| known.contains(job));
        rows.iter()
            .filter_map(|row| {
                let mut v = serde_json::to_value(row).ok()?;
                let notes = self
                    .notes
                    .get(&row.id)
                    .map(|n| n.iter().collect::<Vec<_>>());
                v["notes"] = serde_json::json!(notes.unwrap_or_default());
                Some(v)
            })
            .collect()
    }

    fn owns(&self, job: JobId, alloc: AllocId) -> bool {
        self.alloc
            .allocations_of(job)
            .iter()
            .any(|(id, _, _)| *id == alloc)
    }

    /// The agent's connection closed: the job ends (its subagents end their processes).
    pub fn agent_gone(&mut self, job: JobId, now: Instant) -> Vec<Effect> {
        self.agents.remove(&job);
        if self.alloc.is_running(job) {
            warn!(job, "agent disconnected; ending its job");
            return self.alloc.end_job(job, now);
        }
        Vec::new()
    }

    pub fn tick(&mut self, now: Instant) -> Vec<Effect> {
        let mut effects = self.alloc.tick(now);
        let expired: Vec<JobId> = self
            .awaiting_agent
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(j, _)| *j)
            .collect();
        for job in expired {
            warn!(
                job,
                "agent did not come back after the broker restarted; ending its job"
            );
            self.awaiting_agent.remove(&job);
            effects.extend(self.alloc.end_job(job, now));
        }
        effects
    }

    /// Client requests about jobs.
    pub fn admin(&mut self, req: Request, now: Instant) -> (Result<Response, String>, Vec<Effect>) {
        match req {
            Request::Jobs => {
                let jobs = self.job_rows();
                (Ok(Response::Jobs { jobs }), Vec::new())
            }
            Request::Release { host, grace_ms } => {
                let grace = grace_ms.map_or(DEFAULT_RELEASE_GRACE, Duration::from_millis);
                let holder = self.alloc.holder(&host);
                match self.alloc.release_host(&host, grace, now) {
                    Ok(effects) => {
                        let message = match holder {
                            Some((job, _)) => format!(
                                "reclaiming {host} from job {job} (grace {:.1} s)",
                                grace.as_secs_f64()
                            ),
                            None => format!("{host} released"),
                        };
                        (Ok(Response::Done { message }), effects)
                    }
                    Err(e) => (Err(e.to_string()), Vec::new()),
                }
            }
            Request::Drain { host } => match self.alloc.drain(&host) {
                Ok(effects) => (
                    Ok(Response::Done {
                        message: format!("{host} drained: no new grants"),
                    }),
                    effects,
                ),
                Err(e) => (Err(e.to_string()), Vec::new()),
            },
            Request::Resume { host } => match self.alloc.resume(&host, now) {
                Ok(effects) => (
                    Ok(Response::Done {
                        message: format!("{host} resumed"),
                    }),
                    effects,
                ),
                Err(e) => (Err(e.to_string()), Vec::new()),
            },
            other => (Err(format!("not a job request: {other:?}")), Vec::new()),
        }
    }

    /// Performs effects: messages to agents. Returns true when durable state changed.
    pub async fn perform(&mut self, effects: Vec<Effect>) -> bool {
        let mut persist = false;
        for effect in effects {
            match effect {
                Effect::Granted {
                    job,
                    req,
                    alloc,
                    host,
                    address,
                } => match self.forget_req(req) {
                    Some((_, agent_req)) => {
                        info!(job, alloc, %host, "granted");
                        let msg = FromBroker::Granted {
                            req: agent_req,
                            alloc,
                            host,
                            address,
                        };
                        self.send(job, msg).await;
                    }
                    None => {
                        // A request restored from the store that no agent asked for again.
                        let more = self.alloc.give_back(alloc, Instant::now());
                        persist |= Box::pin(self.perform(more)).await;
                    }
                },
                Effect::Queued { job, req, position } => {
                    if let Some(&(_, agent_req)) = self.agent_req.get(&req) {
                        self.send(
                            job,
                            FromBroker::Queued {
                                req: agent_req,
                                position: position as u32,
                            },
                        )
                        .await;
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
                        )
                        .await;
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
                    )
                    .await;
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
                    )
                    .await;
                }
                Effect::Freed { .. } => {}
                Effect::Persist => persist = true,
            }
        }
        if persist {
            if let Some(store) = &self.store {
                store.save(self.alloc.snapshot());
            }
        }
        persist
    }

    fn forget_req(&mut self, req: RequestId) -> Option<(JobId, u64)> {
        let found = self.agent_req.remove(&req)?;
        self.by_agent_req.remove(&found);
        Some(found)
    }

    async fn send(&self, job: JobId, msg: FromBroker) {
        if let Some(tx) = self.agents.get(&job) {
            let _ = tx.send(msg).await;
        }
    }
}
