//! The agent's life: register the job, run the app with the shim in its environment, turn
//! shim requests into broker allocations, watch subagents, give hosts back on reclaim, and
//! end everything when the app ends (exit status passed through, 128+signal when killed).

use std::{
    collections::HashMap, os::unix::fs::PermissionsExt, path::PathBuf, process::Stdio, sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context};
use proto::{
    agent::ShimReply,
    msg::{FromBroker, JobRegistration, ToBroker},
};
use tokio::{
    net::{TcpListener, UnixListener},
    process::{Child, Command},
    sync::mpsc,
};
use tracing::{info, warn};

mod bind;
mod growth;

use crate::{
    cli::{AgentConfig, Preload},
    instances::Instances,
    jobenv::{self, JobEnv},
    jobguard,
    link::{self, Conn, Registered},
    listeners::{self, Event},
};

/// How long the end of a job waits for subagents to report their processes gone.
const END_WAIT: Duration = Duration::from_secs(4);
/// How long after its launcher ended a subagent may still attach: as long as a guardian keeps
/// trying to reach its agent before it ends its command by itself.
const LATE_ATTACH: Duration = crate::subagent::AGENT_LOSS_LIMIT;

struct Alloc {
    host: String,
    address: String,
    subs: HashMap<u64, mpsc::Sender<FromBroker>>,
    used: bool,
    reclaiming: bool,
    /// When a reclaim must be done by (module jobs: shrink first, then the subagents).
    deadline: Option<tokio::time::Instant>,
    /// Bound to an instance name (`anyLinux-1`): kept between commands until the job ends
    /// or the broker takes it back.
    instance: bool,
    /// Processes given this host (shims, then the remote shells they exec) that may still
    /// start a subagent there: the job's end waits for them (see [`Agent::end`]).
    launchers: Vec<u32>,
}

/// A shim's request the broker has not answered yet.
struct PendingRequest {
    /// The shim's connection (to cancel the request when it goes away).
    conn: u64,
    reply: mpsc::Sender<ShimReply>,
    symbolic: String,
    /// The shim's pid: after a grant it execs the real remote shell, the launcher.
    launcher: u32,
    /// The binding key when `symbolic` looks like an instance name ([`crate::instances`]).
    instance: Option<String>,
}

/// Everything the loop owns.
struct Agent {
    conn: Conn,
    job: Registered,
    env: JobEnv,
    sub_addr: String,
    secret_file: PathBuf,
    grace_ms: u64,
    next_req: u64,
    /// Requests waiting for a grant, by request id.
    pending: HashMap<u64, PendingRequest>,
    allocs: HashMap<u64, Alloc>,
    /// How to reach the broker again after losing it (e.g. it restarted).
    target: link::BrokerTarget,
    reg: JobRegistration,
    broker_lost: bool,
    /// The job's preload library (module jobs), for remote commands too.
    preload: Option<PathBuf>,
    /// The loop's own event queue, for timers.
    events_tx: mpsc::Sender<Event>,
    /// Set for module jobs (`module="NAME"` in the spec).
    module: Option<growth::ModuleJob>,
    /// Which host each instance name of the job is bound to.
    instances: Instances<bind::Caller>,
}

/// How long the agent tries to get its broker back before ending the job.
const RECONNECT_WINDOW: Duration = Duration::from_secs(60);
/// How long the job's end waits for the broker to confirm it saved the end (broker lost
/// meanwhile: reconnecting included). Past it the agent exits anyway: the broker then ends
/// the job when its agent does not come back after a restart.
const END_ACK_WINDOW: Duration = Duration::from_secs(10);

/// Runs the job; returns the app's exit code.
pub async fn run(cfg: AgentConfig) -> anyhow::Result<i32> {
    // Before anything else (an embedded broker, a registration): the directory every job
    // and embedded broker of this user lives in must be ours alone, or we run nothing.
    privdir::ensure_root()?;
    let (embedded, target) = match link::resolve(
        cfg.broker.as_deref(),
        cfg.lab.as_deref(),
        cfg.secret_file.as_deref(),
    )? {
        link::Resolution::Broker(t) => (None, t),
        link::Resolution::Embedded { note } => {
            if let Some(note) = note {
                eprintln!("agent: note: {note}");
            }
            let (e, t) = link::EmbeddedBroker::start()?;
            (Some(e), t)
        }
    };
    let result = run_with(&cfg, &target).await;
    if let Some(e) = embedded {
        e.stop();
    }
    result
}

async fn run_with(cfg: &AgentConfig, target: &link::BrokerTarget) -> anyhow::Result<i32> {
    let label = cfg.app.first().cloned().unwrap_or_default();
    let (mut conn, local_ip) = link::connect(target, &label).await?;
    let reg = registration(cfg)?;
    let job = link::register(&mut conn, reg.clone()).await?;
    info!(job = job.job, transport = %job.transport, "job registered");
    let dir = privdir::runtime_root().join(format!("job-{}-{}", job.job, std::process::id()));
    let preload = preload_library(cfg.preload)?;
    let env = jobenv::prepare(
        &dir,
        &link::sibling("rsh"),
        job.job,
        &job.remote_shell,
        preload.as_deref(),
    )?;
    let shims = UnixListener::bind(&env.socket)
        .with_context(|| format!("cannot bind {}", env.socket.display()))?;
    std::fs::set_permissions(&env.socket, std::fs::Permissions::from_mode(0o600))?;
    let sub_ip = link::advertised_ip(&job, local_ip);
    let subs = TcpListener::bind((sub_ip, 0))
        .await
        .context("cannot open the subagent port")?;
    let sub_addr = subs.local_addr()?.to_string();
    info!(%sub_addr, "subagents reach the agent here");
    // Subagents prove the job's own key, not the lab secret (issue 17; crate::jobkey).
    let job_key = crate::jobkey::JobKey::create(job.job, &env.dir)?;
    let (secret_file, secret) = (
        job_key.path().to_path_buf(),
        Arc::new(job_key.secret().clone()),
    );
    let (events_tx, events) = mpsc::channel(256);
    let shim_task = tokio::spawn(listeners::serve_shims(shims, events_tx.clone()));
    let module = cfg
        .module
        .as_deref()
        .map(|name| growth::ModuleJob::start(name, cfg.module_timeout, &env, events_tx.clone()));
    let events_tx_loop = events_tx.clone();
    let sub_task = tokio::spawn(listeners::serve_subagents(subs, secret, events_tx));
    let tag = jobguard::job_tag();
    let child = spawn_app(&cfg.app, &env, &tag)?;
    // Held until the job is over (the end of this function) or this process dies, however:
    // then the guardian ends whatever the app left running.
    let _guard = jobguard::guard_app(child.id(), &tag, Duration::from_millis(cfg.grace_ms));
    let mut agent = Agent {
        conn,
        job,
        env,
        sub_addr,
        secret_file,
        grace_ms: cfg.grace_ms,
        next_req: 1,
        pending: HashMap::new(),
        allocs: HashMap::new(),
        target: target.clone(),
        reg,
        broker_lost: false,
        module,
        events_tx: events_tx_loop,
        preload,
        instances: Instances::default(),
    };
    agent.announce_module().await;
    let code = agent.drive(child, events).await;
    shim_task.abort();
    sub_task.abort();
    let _ = std::fs::remove_dir_all(&agent.env.dir);
    code
}

/// The preload library the job gets: found, or an error when asked for explicitly and a
/// warning in `auto` (the job then runs without it: symbolic names do not resolve).
fn preload_library(choice: Preload) -> anyhow::Result<Option<PathBuf>> {
    if choice == Preload::Off {
        return Ok(None);
    }
    let found = jobenv::find_preload();
    if found.is_none() {
        let message = format!(
            "{} not found next to agent or in ../lib/rb (build it with `cargo build`): \
             symbolic names will not resolve in the job",
            proto::symbolic::PRELOAD_FILE
        );
        if choice == Preload::On {
            bail!("--preload on: {message}");
        }
        warn!("{message}");
    }
    Ok(found)
}

fn registration(cfg: &AgentConfig) -> anyhow::Result<JobRegistration> {
    Ok(JobRegistration {
        user: nix::unistd::User::from_uid(nix::unistd::getuid())
            .ok()
            .flatten()
            .map_or_else(|| nix::unistd::getuid().to_string(), |u| u.name),
        cwd: std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
        argv: cfg.app.clone(),
        spec: cfg.spec.clone(),
        adaptive: cfg.adaptive,
        resume: None,
        runs_on: Some(crate::whereami::this_host()),
        module: cfg.module.clone(),
    })
}

/// Starts the app as its own process group, every process it starts tagged with `tag`.
fn spawn_app(app: &[String], env: &JobEnv, tag: &str) -> anyhow::Result<Child> {
    let mut cmd = Command::new(&app[0]);
    cmd.args(&app[1..])
        .envs(&env.vars)
        .env(jobguard::JOB_TAG_VAR, tag)
        .stdin(Stdio::inherit())
        .process_group(0);
    cmd.spawn()
        .with_context(|| format!("cannot run `{}`", app[0]))
}

/// rsh-style exit code: the status, or 128+signal.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

impl Agent {
    async fn drive(
        &mut self,
        mut child: Child,
        mut events: mpsc::Receiver<Event>,
    ) -> anyhow::Result<i32> {
        use tokio::signal::unix::{signal, SignalKind};
        let pgid = child.id().map(|p| p as i32);
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        let status = loop {
            tokio::select! {
                status = child.wait() => break exit_code(status?),
                Some(ev) = events.recv() => self.on_event(ev).await,
                msg = self.conn.recv::<FromBroker>(), if !self.broker_lost => match msg {
                    Ok(msg) => self.on_broker(msg).await,
                    Err(e) => {
                        warn!(error = %e, "lost the broker; reconnecting");
                        if !self.reconnect().await {
                            warn!("the broker did not come back; ending the job");
                            self.broker_lost = true;
                            forward(pgid, nix::sys::signal::Signal::SIGTERM);
                        }
                    }
                },
                _ = term.recv() => forward(pgid, nix::sys::signal::Signal::SIGTERM),
                _ = int.recv() => forward(pgid, nix::sys::signal::Signal::SIGINT),
                _ = hup.recv() => forward(pgid, nix::sys::signal::Signal::SIGHUP),
            }
        };
        self.end(status, &mut events).await;
        Ok(status)
    }

    async fn on_event(&mut self, ev: Event) {
        match ev {
            Event::ShimAllocate {
                symbolic,
                pid,
                reply,
                ..
            } if self.module.is_some() => self.phase_one(symbolic, pid, reply).await,
            Event::ShimAllocate {
                conn,
                symbolic,
                pid,
                reply,
            } => {
                let caller = bind::Caller { conn, pid, reply };
                self.shim_allocate(symbolic, caller).await;
            }
            Event::Resolved { symbolic, pid } => self.resolved(symbolic, pid).await,
            Event::Named { host } => self.named(host).await,
            Event::ShimAttach { host, reply } => {
                let found = self
                    .allocs
                    .iter()
                    .find(|(_, a)| a.host == host || a.address == host)
                    .map(|(id, a)| (*id, a.host.clone(), a.address.clone()));
                let answer = match found {
                    Some((alloc, host, address)) => self.granted_reply(alloc, host, address),
                    None => ShimReply::Refused {
                        message: format!("{host} is not allocated to this job"),
                    },
                };
                let _ = reply.send(answer).await;
            }
            Event::ShimGone { conn } => self.shim_gone(conn).await,
            Event::SubConnected { alloc, sub, tx } => self.sub_connected(alloc, sub, tx).await,
            Event::SubMessage { .. } => {}
            Event::SubGone { alloc, sub } => self.sub_gone(alloc, sub).await,
            Event::ModuleDone(outcome) => self.module_done(outcome).await,
            Event::LaunchWindowOver { alloc } => self.launch_window_over(alloc).await,
            Event::LauncherGone { alloc } => self.launcher_gone(alloc).await,
        }
    }

    async fn sub_connected(&mut self, alloc: u64, sub: u64, tx: mpsc::Sender<FromBroker>) {
        match self.allocs.get_mut(&alloc) {
            Some(a) => {
                a.used = true;
                if a.reclaiming {
                    // What is left of the reclaim's grace period.
                    let grace_ms = a.deadline.map_or(self.grace_ms, |d| {
                        d.saturating_duration_since(tokio::time::Instant::now())
                            .as_millis() as u64
                    });
                    let _ = tx.send(FromBroker::Terminate { grace_ms }).await;
                }
                a.subs.insert(sub, tx);
            }
            None => {
                // Not (or no longer) ours: end it at once.
                let _ = tx.send(FromBroker::Terminate { grace_ms: 0 }).await;
            }
        }
    }

    /// Once the process that got `alloc` (the shim, then the real remote shell) has ended,
    /// and a late subagent has had [`LATE_ATTACH`] to attach, `LauncherGone` checks that
    /// the host is in use.
    fn watch_launcher(&mut self, alloc: u64, launcher: u32) {
        self.note_launcher(alloc, launcher);
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            crate::launcher::exited(launcher).await;
            tokio::time::sleep(LATE_ATTACH).await;
            let _ = events.send(Event::LauncherGone { alloc }).await;
        });
    }

    /// Remembers that `launcher` was given `alloc`'s host (for the job's end); forgets
    /// launchers of that host that have ended.
    fn note_launcher(&mut self, alloc: u64, launcher: u32) {
        if let Some(a) = self.allocs.get_mut(&alloc) {
            a.launchers.retain(|p| crate::launcher::running(*p));
            a.launchers.push(launcher);
        }
    }

    /// The launcher of `alloc` is gone: if no subagent ever attached, the remote shell
    /// failed before starting one, and the host goes back instead of staying held until the
    /// job ends.
    async fn launcher_gone(&mut self, alloc: u64) {
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
        self.hand_back(alloc).await;
    }

    /// The job is done with `alloc`: forget it, and tell the broker — `Released` when the
    /// broker had asked for it back, else `GiveBack`.
    async fn hand_back(&mut self, alloc: u64) {
        let Some(a) = self.allocs.remove(&alloc) else {
            return;
        };
        self.instances.given_back(alloc);
        self.write_hosts();
        let msg = if a.reclaiming {
            ToBroker::Released { alloc }
        } else {
            ToBroker::GiveBack { alloc }
        };
        self.tell_broker(msg).await;
    }

    /// A reclaimed host whose launch never attached a subagent goes back to the broker.
    async fn launch_window_over(&mut self, alloc: u64) {
        let unused = self
            .allocs
            .get(&alloc)
            .is_some_and(|a| a.reclaiming && !a.used);
        if unused {
            info!(
                alloc,
                "no subagent attached within the grace period; releasing"
            );
            self.hand_back(alloc).await;
        }
    }

    async fn sub_gone(&mut self, alloc: u64, sub: u64) {
        let Some(a) = self.allocs.get_mut(&alloc) else {
            return;
        };
        a.subs.remove(&sub);
        // A module job keeps its hosts between remote commands (LAM probes a host before
        // it boots a daemon there), and every job its instances' hosts: they go back on
        // reclaim or at job end.
        let kept = self.module.is_some() || a.instance;
        if !a.subs.is_empty() || (kept && !a.reclaiming) {
            return;
        }
        self.hand_back(alloc).await;
    }

    async fn on_broker(&mut self, msg: FromBroker) {
        match msg {
            FromBroker::Queued {
                req,
                position,
                reason,
            } => {
                let queued = ShimReply::Queued { position, reason };
                if let Some(r) = self.pending.get(&req) {
                    let _ = r.reply.send(queued.clone()).await;
                }
                self.queued_waiting(req, &queued).await;
            }
            FromBroker::Granted {
                req,
                alloc,
                host,
                address,
                instance,
            } => {
                self.granted(req, alloc, host, address, instance.is_some())
                    .await
            }
            FromBroker::Refused { req, message } => {
                if self.module_refused(req, &message).await {
                    return;
                }
                if let Some(r) = self.pending.remove(&req) {
                    self.refuse_waiting(r.instance.as_deref(), &message).await;
                    let _ = r.reply.send(ShimReply::Refused { message }).await;
                }
            }
            FromBroker::Reclaim {
                alloc,
                host,
                grace_ms,
            } => self.reclaim(alloc, &host, grace_ms).await,
            other => warn!(?other, "unexpected message from the broker"),
        }
    }

    async fn granted(&mut self, req: u64, alloc: u64, host: String, address: String, bound: bool) {
        info!(req, alloc, %host, "host granted");
        self.allocs.insert(
            alloc,
            Alloc {
                host: host.clone(),
                address: address.clone(),
                subs: HashMap::new(),
                used: false,
                reclaiming: false,
                deadline: None,
                instance: false,
                launchers: Vec::new(),
            },
        );
        self.write_hosts();
        if self.phase_two(req, alloc, &host, &address) {
            return;
        }
        let reply = self.granted_reply(alloc, host, address);
        let delivered = match self.pending.remove(&req) {
            Some(r) if r.instance.is_some() => self.grant_instance(r, alloc, bound).await,
            Some(r) => {
                let delivered = r.reply.send(reply).await.is_ok();
                if delivered {
                    self.watch_launcher(alloc, r.launcher);
                }
                delivered
            }
            None => false,
        };
        if !delivered {
            self.allocs.remove(&alloc);
            self.write_hosts();
            self.tell_broker(ToBroker::GiveBack { alloc }).await;
        }
    }

    fn granted_reply(&self, alloc: u64, host: String, address: String) -> ShimReply {
        let mut subagent = vec![
            link::sibling("rb-subagent").display().to_string(),
            "--agent".into(),
            self.sub_addr.clone(),
            "--alloc".into(),
            alloc.to_string(),
            "--secret-file".into(),
            self.secret_file.display().to_string(),
        ];
        if let Some(lib) = &self.preload {
            subagent.extend(["--preload".into(), lib.display().to_string()]);
        }
        ShimReply::Granted {
            alloc,
            host,
            address,
            remote_shell: self.job.remote_shell.clone(),
            subagent,
        }
    }

    async fn reclaim(&mut self, alloc: u64, host: &str, grace_ms: u64) {
        info!(alloc, %host, grace_ms, "broker reclaims host");
        self.instances.taken_back(alloc, host);
        if self.module_shrink(alloc, grace_ms) {
            return;
        }
        let Some(a) = self.allocs.get_mut(&alloc) else {
            return self.tell_broker(ToBroker::Released { alloc }).await;
        };
        if a.subs.is_empty() && a.used {
            self.allocs.remove(&alloc);
            self.write_hosts();
            return self.tell_broker(ToBroker::Released { alloc }).await;
        }
        a.reclaiming = true;
        a.deadline = Some(tokio::time::Instant::now() + Duration::from_millis(grace_ms));
        if !a.used {
            // Granted to a shim whose remote shell is still starting the subagent: the
            // command may already run there. Its subagent gets Terminate when it attaches;
            // if none attaches within the grace period (the remote shell failed), release.
            let events = self.events_tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(grace_ms)).await;
                let _ = events.send(Event::LaunchWindowOver { alloc }).await;
            });
            return;
        }
        for tx in a.subs.values() {
            let _ = tx.send(FromBroker::Terminate { grace_ms }).await;
        }
    }

    /// The app ended: end every remote process group, then tell the broker. A remote shell
    /// still starting a command on a held host (its subagent not yet attached) is waited for
    /// too, and its subagent told to end at once when it attaches: were the broker told
    /// first, it could give that host to another job while this job's command starts there.
    async fn end(&mut self, status: i32, events: &mut mpsc::Receiver<Event>) {
        self.module_halt(events).await;
        let grace = Duration::from_millis(1000);
        let mut launches = tokio::task::JoinSet::new();
        for a in self.allocs.values_mut() {
            a.reclaiming = true;
            a.deadline = Some(tokio::time::Instant::now() + grace);
            for tx in a.subs.values() {
                let _ = tx
                    .send(FromBroker::Terminate {
                        grace_ms: grace.as_millis() as u64,
                    })
                    .await;
            }
            for pid in a
                .launchers
                .drain(..)
                .filter(|p| crate::launcher::running(*p))
            {
                launches.spawn(crate::launcher::exited(pid));
            }
        }
        let deadline = tokio::time::Instant::now() + END_WAIT;
        while self.allocs.values().any(|a| !a.subs.is_empty()) || !launches.is_empty() {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                Some(_) = launches.join_next(), if !launches.is_empty() => {}
                ev = events.recv() => match ev {
                    Some(Event::SubGone { alloc, sub }) => {
                        if let Some(a) = self.allocs.get_mut(&alloc) {
                            a.subs.remove(&sub);
                        }
                    }
                    // Late: its command ends at once (the alloc is reclaiming).
                    Some(Event::SubConnected { alloc, sub, tx }) => {
                        self.sub_connected(alloc, sub, tx).await
                    }
                    Some(_) => {}
                    None => break,
                },
            }
        }
        self.end_at_broker(status).await;
    }

    /// Tells the broker the job ended and waits (within [`END_ACK_WINDOW`]) until it says
    /// the end is saved, re-registering and telling it again when it was lost meanwhile
    /// (killed, restarted): an end the broker never saved would bring the job back after
    /// its restart, its hosts held with no agent to end it.
    async fn end_at_broker(&mut self, status: i32) {
        let deadline = tokio::time::Instant::now() + END_ACK_WINDOW;
        // Nothing is asked for any more (a reconnect re-sends what still waits).
        self.pending.clear();
        if let Some(m) = &mut self.module {
            m.requests.clear();
        }
        let mut told = !self.broker_lost;
        if told {
            self.tell_broker(ToBroker::EndJob { status }).await;
            info!("told the broker the job ended; waiting for it to save that");
        }
        while told {
            match tokio::time::timeout_at(deadline, self.conn.recv::<FromBroker>()).await {
                Err(_) => {
                    warn!("the broker did not confirm the job's end in time");
                    return;
                }
                Ok(Ok(FromBroker::JobEnded { .. })) => return,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    warn!(error = %e, "lost the broker while ending the job; reconnecting");
                    told = self.reconnect_until(deadline).await;
                    if told {
                        self.tell_broker(ToBroker::EndJob { status }).await;
                    }
                }
            }
        }
    }

    /// Gets the broker back (same job, `resume`), re-sending requests still waiting.
    async fn reconnect(&mut self) -> bool {
        self.reconnect_until(tokio::time::Instant::now() + RECONNECT_WINDOW)
            .await
    }

    /// [`Agent::reconnect`], trying until `deadline`.
    async fn reconnect_until(&mut self, deadline: tokio::time::Instant) -> bool {
        let label = self.reg.argv.first().cloned().unwrap_or_default();
        let mut reg = self.reg.clone();
        reg.resume = Some(self.job.job);
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let Ok((mut conn, _)) = link::connect(&self.target, &label).await else {
                continue;
            };
            match link::register(&mut conn, reg.clone()).await {
                Ok(r) if r.job == self.job.job => {
                    info!(job = r.job, "broker is back; job resumed");
                    self.conn = conn;
                    let mut waiting: Vec<(u64, String)> = self
                        .pending
                        .iter()
                        .map(|(req, r)| (*req, r.symbolic.clone()))
                        .collect();
                    let mut in_use = Vec::new();
                    if let Some(m) = &self.module {
                        waiting.extend(m.requests.iter().map(|(r, s)| (*r, s.clone())));
                        in_use.extend(m.in_use.iter().cloned());
                    }
                    if !in_use.is_empty() {
                        let hosts = in_use;
                        self.tell_broker(ToBroker::HostsInUse { hosts }).await;
                    }
                    for (req, symbolic) in waiting {
                        self.tell_broker(ToBroker::Allocate { req, symbolic }).await;
                    }
                    return true;
                }
                Ok(r) => {
                    warn!(
                        old = self.job.job,
                        new = r.job,
                        "the broker no longer knows this job"
                    );
                    let _ = conn.send(&ToBroker::EndJob { status: 1 }).await;
                    return false;
                }
                Err(e) => warn!(error = %e, "re-registering failed"),
            }
        }
        false
    }

    fn write_hosts(&self) {
        let hosts: Vec<(String, String, u64)> = self
            .allocs
            .iter()
            .map(|(id, a)| (a.host.clone(), a.address.clone(), *id))
            .collect();
        if let Err(e) = jobenv::write_hosts(&self.env.hosts_file, &hosts) {
            warn!(error = %e, "cannot write the job's hosts file");
        }
    }

    async fn tell_broker(&mut self, msg: ToBroker) {
        if let Err(e) = self.conn.send(&msg).await {
            warn!(error = %e, "cannot reach the broker");
        }
    }
}

fn forward(pgid: Option<i32>, sig: nix::sys::signal::Signal) {
    if let Some(pgid) = pgid {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), sig);
    }
}
