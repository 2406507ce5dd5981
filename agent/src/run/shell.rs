//! The agent's shell around [`AgentCore`]: one select loop reads what happens (the app's
//! exit, shim and subagent traffic, the broker, signals, due timers) into [`Input`]s, and
//! performs the core's [`Output`]s in order. It holds the I/O handles the core names by id
//! (shim reply channels, subagent links, the broker connection, the module runner, the
//! timers, the job's JEL pool) and decides nothing about the job.
//!
//! JEL connections of processes on granted hosts come and go through their subagents' links
//! (`jel_*` messages); the shell routes them between the links and the pool with
//! [`Routes`] (pure), and never blocks on a slow link: a pool connection whose link does not
//! take its lines is cut off (it resumes by seq).

use std::{
    cmp::Reverse,
    collections::{BTreeSet, BinaryHeap, HashMap, VecDeque},
    path::PathBuf,
    time::Duration,
};

use jel::{
    host::{PoolHost, RemoteOut},
    pool::ConnId,
};
use nix::sys::signal::Signal;
use proto::{
    agent::ShimReply,
    msg::{FromBroker, JobRegistration, ToBroker},
};
use tokio::{process::Child, sync::mpsc, time::Instant};
use tracing::{debug, info, warn};

use crate::{
    ancestry,
    core::{AgentCore, AllocId, Input, Output, PoolEvent, ShimId, SubId, Timer},
    jelrelay::{Route, Routes},
    jobenv,
    link::{self, Conn},
    listeners::{Event, TakenBackBook},
    module::Runner,
};

/// The broker link and what re-registering the job needs.
pub(super) struct Broker {
    pub(super) conn: Conn,
    /// The job's id at the broker.
    pub(super) job: u64,
    /// How to reach the broker again after losing it (e.g. it restarted).
    pub(super) target: link::BrokerTarget,
    pub(super) reg: JobRegistration,
}

/// What performing one output led to.
enum Performed {
    Done,
    /// An answer the core waits for before anything else ([`crate::core`], "Choices").
    Feedback(Input),
    Exit(i32),
}

pub(super) struct Shell {
    core: AgentCore,
    broker: Broker,
    /// False once the broker connection failed, until it is back.
    broker_live: bool,
    /// Reply channels of shims that wait for an answer.
    shims: HashMap<ShimId, mpsc::Sender<ShimReply>>,
    /// Links to attached subagents.
    subs: HashMap<SubId, mpsc::Sender<FromBroker>>,
    /// Due times of the core's timers (the sequence number keeps them in the order set).
    timers: BinaryHeap<Reverse<(std::time::Instant, u64, Timer)>>,
    timers_set: u64,
    runner: Option<Runner>,
    /// The loop's own event queue (launcher watches report there).
    events_tx: mpsc::Sender<Event>,
    hosts_file: PathBuf,
    /// The app's process group.
    pgid: Option<i32>,
    /// The job's JEL pool (taken at its `Terminate`).
    pool: Option<PoolHost>,
    /// The pids of the front end's JEL members the pool's `terminated` reached.
    members_told: Vec<u32>,
    /// What the pool has for connections on other hosts.
    remote: mpsc::UnboundedReceiver<RemoteOut>,
    /// Which pool connection is which subagent's.
    routes: Routes,
    /// The job's ssh master connections, closed when their host leaves the job.
    masters: crate::mux::Masters,
    /// What the shims' listener answers `taken_back` questions from, and the core's
    /// version of it last published.
    taken_back: TakenBackBook,
    taken_back_version: u64,
    /// The same as files the shims read (`proto::taken_back`): where, and which are there.
    taken_back_dir: Option<PathBuf>,
    taken_back_files: BTreeSet<u64>,
}

/// The most bytes of lines one `jel_send` carries (a frame holds at most
/// `proto::MAX_FRAME_BYTES`, and JSON escapes some bytes: a `"` takes two).
const JEL_SEND_BYTES: usize = proto::MAX_FRAME_BYTES / 4;

/// The time as the core sees it (tokio's clock, so that paused test time applies).
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

impl Shell {
    pub(super) fn new(
        core: AgentCore,
        broker: Broker,
        runner: Option<Runner>,
        listeners: (mpsc::Sender<Event>, TakenBackBook, Option<PathBuf>),
        hosts_file: PathBuf,
        pool: (PoolHost, mpsc::UnboundedReceiver<RemoteOut>),
        masters: crate::mux::Masters,
    ) -> Self {
        let (pool, remote) = pool;
        let (events_tx, taken_back, taken_back_dir) = listeners;
        Self {
            masters,
            taken_back,
            taken_back_version: 0,
            taken_back_dir,
            taken_back_files: BTreeSet::new(),
            core,
            broker,
            broker_live: true,
            shims: HashMap::new(),
            subs: HashMap::new(),
            timers: BinaryHeap::new(),
            timers_set: 0,
            runner,
            events_tx,
            hosts_file,
            pgid: None,
            pool: Some(pool),
            members_told: Vec::new(),
            remote,
            routes: Routes::default(),
        }
    }

    /// Runs the job until the core says it is over; the app's exit code.
    pub(super) async fn drive(
        &mut self,
        mut child: Child,
        mut events: mpsc::Receiver<Event>,
    ) -> anyhow::Result<i32> {
        use tokio::signal::unix::{signal, SignalKind};
        self.pgid = child.id().map(|p| p as i32);
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        let mut app_running = true;
        let mut input = Some(Input::Started);
        loop {
            if let Some(status) = self.step(input.take()).await {
                return Ok(status);
            }
            let next_timer = self.timers.peek().map(|Reverse((at, _, _))| *at);
            let due = next_timer.map_or_else(
                || Instant::now() + Duration::from_secs(86_400),
                Instant::from_std,
            );
            input = tokio::select! {
                status = child.wait(), if app_running => {
                    app_running = false;
                    Some(Input::AppExited { status: super::exit_code(status?) })
                }
                Some(ev) = events.recv() => self.input_of(ev).await,
                Some(out) = self.remote.recv() => {
                    self.relay_out(out).await;
                    None
                }
                msg = self.broker.conn.recv::<FromBroker>(), if self.broker_live => match msg {
                    Ok(msg) => {
                        if let FromBroker::Granted { alloc, .. } = &msg {
                            steptimes::mark("agent.broker_granted", Some(*alloc));
                        }
                        Some(Input::Broker(msg))
                    }
                    Err(e) => {
                        warn!(error = %e, "the broker connection failed");
                        self.broker_live = false;
                        Some(Input::BrokerLost)
                    }
                },
                _ = term.recv() => Some(Input::Signal(Signal::SIGTERM)),
                _ = int.recv() => Some(Input::Signal(Signal::SIGINT)),
                _ = hup.recv() => Some(Input::Signal(Signal::SIGHUP)),
                () = tokio::time::sleep_until(due), if next_timer.is_some() => {
                    self.timers.pop().map(|Reverse((_, _, timer))| Input::Timer(timer))
                }
            };
        }
    }

    /// Feeds one input to the core and performs its outputs, answering feedback outputs at
    /// once; the exit code once the job is over.
    async fn step(&mut self, input: Option<Input>) -> Option<i32> {
        let input = input?;
        let mut queue: VecDeque<Output> = self.core.handle(input, now()).into();
        self.publish_taken_back();
        while let Some(output) = queue.pop_front() {
            match self.perform(output).await {
                Performed::Done => {}
                Performed::Feedback(input) => {
                    for output in self.core.handle(input, now()).into_iter().rev() {
                        queue.push_front(output);
                    }
                    self.publish_taken_back();
                }
                Performed::Exit(status) => return Some(status),
            }
        }
        None
    }

    /// Hands the shims' listener the allocations taken back when they changed: before the
    /// outputs of the input that changed them (a reclaim's `terminate` to the subagent), so a
    /// remote shell that ends because of it is answered `taken_back`.
    fn publish_taken_back(&mut self) {
        let version = self.core.taken_back_version();
        if version == self.taken_back_version {
            return;
        }
        self.taken_back_version = version;
        let (_, book) = self.core.taken_back_book();
        self.write_taken_back_files(&book);
        match self.taken_back.lock() {
            Ok(mut shared) => *shared = book,
            Err(poisoned) => *poisoned.into_inner() = book,
        }
    }

    /// The taken-back allocations as the shims' files: each new one written (before the
    /// outputs that end its commands, see above), each gone removed. A file that cannot be
    /// written is logged: that shim's remote shell keeps its status, as with no answer.
    fn write_taken_back_files(&mut self, book: &HashMap<u64, (String, String)>) {
        let Some(dir) = &self.taken_back_dir else {
            return;
        };
        for (alloc, (host, message)) in book {
            if self.taken_back_files.contains(alloc) {
                continue;
            }
            match proto::taken_back::write(dir, *alloc, host, message) {
                Ok(()) => {
                    self.taken_back_files.insert(*alloc);
                }
                Err(e) => {
                    warn!(alloc, dir = %dir.display(), error = %e, "cannot write the taken-back file")
                }
            }
        }
        let gone: Vec<u64> = self
            .taken_back_files
            .iter()
            .filter(|alloc| !book.contains_key(alloc))
            .copied()
            .collect();
        for alloc in gone {
            let _ = proto::taken_back::remove(dir, alloc);
            self.taken_back_files.remove(&alloc);
        }
    }

    /// An event of the listeners, module runner or launcher watches as the core's input;
    /// the shell keeps the channels that come with it.
    async fn input_of(&mut self, ev: Event) -> Option<Input> {
        let input = match ev {
            Event::ShimAllocate {
                conn,
                symbolic,
                pid,
                reply,
            } => {
                steptimes::mark("agent.shim_request", None);
                // Read now, as the call arrives: once refused, the shim exits and its caller
                // reaps it, and a process that is gone descends from nobody.
                let lineage = match self.core.is_module_job() {
                    true => ancestry::lineage(pid, ancestry::parent_of),
                    false => Vec::new(),
                };
                self.shims.insert(conn, reply);
                Input::ShimAllocate {
                    shim: conn,
                    symbolic,
                    pid,
                    lineage,
                }
            }
            Event::ShimAttach { conn, host, reply } => {
                self.shims.insert(conn, reply);
                Input::ShimAttach { shim: conn, host }
            }
            Event::Resolved { symbolic, pid } => Input::Resolved { symbolic, pid },
            Event::Named { host } => Input::Named { host },
            Event::RouteUsed { line } => Input::RouteUsed { line },
            Event::ShimGone { conn } => {
                self.shims.remove(&conn);
                Input::ShimGone { shim: conn }
            }
            Event::SubConnected { alloc, sub, tx } => {
                steptimes::mark("agent.sub_connected", Some(alloc));
                self.subs.insert(sub, tx);
                // A subagent of the host is back: what its lost link relayed was closed there.
                for conn in self.routes.take_orphans(alloc) {
                    self.pool_closed(conn).await;
                }
                Input::SubConnected { alloc, sub }
            }
            Event::SubMessage {
                alloc,
                msg: ToBroker::JobNote { text },
                ..
            } => Input::SubNote { alloc, text },
            Event::SubMessage { alloc, sub, msg } => {
                if let ToBroker::SubExited { .. } = msg {
                    steptimes::mark("agent.sub_exited", Some(alloc));
                }
                self.jel_from_sub(alloc, sub, msg).await;
                return None;
            }
            Event::SubGone { alloc, sub } => {
                steptimes::mark("agent.sub_gone", Some(alloc));
                self.subs.remove(&sub);
                self.routes.sub_gone(sub);
                Input::SubGone { alloc, sub }
            }
            Event::ModuleDone(outcome) => Input::ModuleDone(outcome),
            Event::LauncherExited { alloc, pid } => Input::LauncherExited { alloc, pid },
        };
        Some(input)
    }

    async fn perform(&mut self, output: Output) -> Performed {
        match output {
            Output::ToBroker(msg) => self.tell_broker(msg).await,
            Output::ReplyShim { shim, reply } => self.reply_shim(shim, reply).await,
            Output::Offer {
                alloc,
                shims,
                reply,
            } => {
                let reached = self.offer(&shims, reply).await;
                steptimes::mark("agent.grant_sent", Some(alloc));
                return Performed::Feedback(Input::Offered { alloc, reached });
            }
            Output::CloseShim { shim } => drop(self.shims.remove(&shim)),
            Output::ToSub { sub, msg } => self.send_sub(sub, msg).await,
            Output::CloseSub { sub } => drop(self.subs.remove(&sub)),
            Output::RunModule(call) => match &self.runner {
                Some(runner) => runner.submit(call),
                None => warn!(?call, "a module call in a job without a module"),
            },
            Output::SkipQueuedModuleCalls => {
                if let Some(runner) = &self.runner {
                    runner.skip_queued();
                }
            }
            Output::WatchLauncher { alloc, pid } => self.watch_launcher(alloc, pid),
            Output::SetTimer { timer, at } => {
                self.timers_set += 1;
                self.timers.push(Reverse((at, self.timers_set, timer)));
            }
            Output::WriteHosts(hosts) => {
                if let Err(e) = jobenv::write_hosts(&self.hosts_file, &hosts) {
                    warn!(error = %e, "cannot write the job's hosts file");
                }
                steptimes::mark("agent.hosts_written", None);
            }
            Output::Signal(sig) => forward(self.pgid, sig),
            Output::Reconnect { until } => {
                self.broker_live = self.reconnect(Instant::from_std(until)).await;
                let input = match self.broker_live {
                    true => Input::BrokerBack,
                    false => Input::BrokerGone,
                };
                return Performed::Feedback(input);
            }
            Output::Pool(event) => {
                self.tell_pool(event).await;
                steptimes::mark("agent.pool_told", None);
            }
            Output::Exit { status } => return Performed::Exit(status),
        }
        Performed::Done
    }

    /// A JEL message of subagent `sub` (of `alloc`): a connection on its host opened, sent
    /// a line, closed. Other reports are not used by the agent yet.
    async fn jel_from_sub(&mut self, alloc: AllocId, sub: SubId, msg: ToBroker) {
        let Some(pool) = &self.pool else { return };
        match msg {
            ToBroker::JelOpen { conn, pid } => {
                let Some(host) = self.core.host_of(alloc) else {
                    let reason = "the host is not the job's".to_string();
                    return self
                        .send_sub(sub, FromBroker::JelDisconnect { conn, reason })
                        .await;
                };
                let Ok(id) = pool.open_remote(host, pid).await else {
                    return;
                };
                if let Some(old) = self.routes.opened(alloc, sub, conn, id) {
                    self.pool_closed(old).await;
                }
            }
            ToBroker::JelLine { conn, line } => {
                if let Some(id) = self.routes.pool_conn(sub, conn) {
                    if let Err(e) = pool.remote_line(id, line).await {
                        debug!(error = %e, "a JEL line after the pool's end");
                    }
                }
            }
            ToBroker::JelClosed { conn } => {
                if let Some(id) = self.routes.closed(sub, conn) {
                    self.pool_closed(id).await;
                }
            }
            _ => {}
        }
    }

    /// Tells the pool that remote connection `conn` closed.
    async fn pool_closed(&self, conn: ConnId) {
        if let Some(pool) = &self.pool {
            if let Err(e) = pool.remote_closed(conn).await {
                debug!(error = %e, "a JEL close after the pool's end");
            }
        }
    }

    /// Carries what the pool has for a remote connection to its subagent. A link that does
    /// not take it (its queue is full) gets the connection cut off instead.
    async fn relay_out(&mut self, out: RemoteOut) {
        match out {
            RemoteOut::Send { conn, lines } => {
                let Some(route) = self.routes.route(conn) else {
                    return;
                };
                for lines in jel_batches(lines.iter().map(|l| l.as_str())) {
                    // One line too long for a frame would break the whole link.
                    let too_long = lines.iter().any(|l| l.len() > JEL_SEND_BYTES);
                    let msg = FromBroker::JelSend {
                        conn: route.conn,
                        lines,
                    };
                    if too_long || !self.try_send_sub(route.sub, msg) {
                        let why = if too_long {
                            "line_too_long"
                        } else {
                            "slow_link"
                        };
                        warn!(
                            conn,
                            why, "a JEL connection's lines cannot be carried: cut off"
                        );
                        self.routes.disconnect(conn);
                        self.pool_closed(conn).await;
                        self.disconnect_later(route, why);
                        return;
                    }
                }
            }
            RemoteOut::Disconnect { conn, reason } => {
                if let Some(route) = self.routes.disconnect(conn) {
                    let reason = format!("{reason:?}");
                    let msg = FromBroker::JelDisconnect {
                        conn: route.conn,
                        reason,
                    };
                    if !self.try_send_sub(route.sub, msg) {
                        self.disconnect_later(route, "slow_link");
                    }
                }
            }
        }
    }

    /// Sends to a subagent if its link's queue has room (false: it had not).
    fn try_send_sub(&self, sub: SubId, msg: FromBroker) -> bool {
        match self.subs.get(&sub) {
            Some(tx) => !matches!(tx.try_send(msg), Err(mpsc::error::TrySendError::Full(_))),
            None => true, // gone: nothing to carry
        }
    }

    /// Tells subagent `route.sub` to close its connection once its link takes it.
    fn disconnect_later(&self, route: Route, reason: &str) {
        let Some(tx) = self.subs.get(&route.sub).cloned() else {
            return;
        };
        let msg = FromBroker::JelDisconnect {
            conn: route.conn,
            reason: reason.to_string(),
        };
        tokio::spawn(async move {
            let _ = tx.send(msg).await;
        });
    }

    /// Carries what the pool has already handed over (after a job event: a `vacate` goes
    /// out before the subagents are told anything else).
    async fn relay_ready(&mut self) {
        while let Ok(out) = self.remote.try_recv() {
            self.relay_out(out).await;
        }
    }

    /// Hands a job event to the JEL pool and waits until its lines are written (so a
    /// `vacate` is out before the subagents are told to end the host's processes).
    async fn tell_pool(&mut self, event: PoolEvent) {
        self.tell_pool_now(event).await;
        self.relay_ready().await;
    }

    async fn tell_pool_now(&mut self, event: PoolEvent) {
        if let PoolEvent::LinkLost {
            alloc,
            host,
            host_lost,
        } = event
        {
            return self.link_lost(alloc, &host, host_lost).await;
        }
        if let PoolEvent::HostReleased { host } = &event {
            if !self.core.holds_host(host) {
                self.masters.close_host(host);
            }
        }
        let Some(pool) = &self.pool else { return };
        let done = match event {
            PoolEvent::HostGranted { host } => pool.host_granted(&host).await,
            PoolEvent::Reclaim { host, deadline } => {
                pool.reclaim(&host, unix_ms_at(deadline)).await
            }
            PoolEvent::HostReleased { host } => pool.host_released(&host).await,
            PoolEvent::LinkLost { .. } => Ok(()),
            PoolEvent::Terminate => match self.pool.take() {
                Some(pool) => pool.terminate().await.map(|told| self.members_told = told),
                None => Ok(()),
            },
        };
        if let Err(e) = done {
            warn!(error = %e, "the job's JEL pool");
        }
    }

    /// A lost link's subagent has certainly ended its command: what it relayed ends in the
    /// pool (`died{host_lost}` for the host's members when none of its subagents is back).
    async fn link_lost(&mut self, alloc: AllocId, host: &str, host_lost: bool) {
        let orphans = self.routes.take_orphans(alloc);
        if orphans.is_empty() {
            return;
        }
        if !host_lost {
            for conn in orphans {
                self.pool_closed(conn).await;
            }
            return;
        }
        if let Some(pool) = &self.pool {
            if let Err(e) = pool.host_lost(host).await {
                warn!(error = %e, "the job's JEL pool");
            }
        }
    }

    /// Answers a shim; any answer but `queued` is its last.
    async fn reply_shim(&mut self, shim: ShimId, reply: ShimReply) {
        let tx = match reply {
            ShimReply::Queued { .. } => self.shims.get(&shim).cloned(),
            _ => self.shims.remove(&shim),
        };
        let delivered = match tx {
            Some(tx) => tx.send(reply).await.is_ok(),
            None => false,
        };
        if !delivered {
            debug!(shim, "the shim went away before its answer");
        }
    }

    /// Offers a grant to shims; true when one of them was still there to take it.
    async fn offer(&mut self, shims: &[ShimId], reply: ShimReply) -> bool {
        let mut reached = false;
        for shim in shims {
            if let Some(tx) = self.shims.remove(shim) {
                reached |= tx.send(reply.clone()).await.is_ok();
            }
        }
        reached
    }

    async fn send_sub(&mut self, sub: SubId, msg: FromBroker) {
        let delivered = match self.subs.get(&sub) {
            Some(tx) => tx.send(msg).await.is_ok(),
            None => false,
        };
        if !delivered {
            debug!(sub, "the subagent went away before a message");
        }
    }

    /// Reports [`Event::LauncherExited`] once process `pid` has ended.
    fn watch_launcher(&self, alloc: u64, pid: u32) {
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            crate::launcher::exited(pid).await;
            if events
                .send(Event::LauncherExited { alloc, pid })
                .await
                .is_err()
            {
                debug!(alloc, "the launcher ended after the job");
            }
        });
    }

    async fn tell_broker(&mut self, msg: ToBroker) {
        if let Err(e) = self.broker.conn.send(&msg).await {
            warn!(error = %e, "cannot reach the broker");
        }
        match msg {
            ToBroker::Allocate { .. } => steptimes::mark("agent.allocate_sent", None),
            ToBroker::GiveBack { alloc } | ToBroker::Released { alloc } => {
                steptimes::mark("agent.give_back_sent", Some(alloc))
            }
            _ => {}
        }
    }

    /// The pids of the front end's JEL members told `terminated` at the job's end (none
    /// before it): [`crate::reaper::members_end`] gives them a moment to end on their own.
    pub(super) fn members_told(&self) -> &[u32] {
        &self.members_told
    }

    /// Gets the broker back by `until` (same job, `resume`); true when it resumed the job.
    /// A broker that no longer knows the job registered it anew: that registration is
    /// ended at once.
    async fn reconnect(&mut self, until: Instant) -> bool {
        let b = &mut self.broker;
        let label = b.reg.argv.first().cloned().unwrap_or_default();
        let mut reg = b.reg.clone();
        reg.resume = Some(b.job);
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let Ok((mut conn, _)) = link::connect(&b.target, &label).await else {
                continue;
            };
            match link::register(&mut conn, reg.clone()).await {
                Ok(r) if r.job == b.job => {
                    info!(job = r.job, "broker is back; job resumed");
                    b.conn = conn;
                    return true;
                }
                Ok(r) => {
                    warn!(
                        old = b.job,
                        new = r.job,
                        "the broker no longer knows this job"
                    );
                    if let Err(e) = conn.send(&ToBroker::EndJob { status: 1 }).await {
                        warn!(error = %e, "cannot end the new registration");
                    }
                    return false;
                }
                Err(e) => warn!(error = %e, "re-registering failed"),
            }
        }
        false
    }
}

/// `lines` (each with its newline) in batches of at most [`JEL_SEND_BYTES`] (a longer line
/// goes alone).
fn jel_batches<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<Vec<String>> {
    let mut batches: Vec<Vec<String>> = Vec::new();
    let mut size = 0;
    for line in lines {
        if batches.is_empty() || size + line.len() > JEL_SEND_BYTES {
            batches.push(Vec::new());
            size = 0;
        }
        size += line.len();
        if let Some(batch) = batches.last_mut() {
            batch.push(line.to_string());
        }
    }
    batches
}

/// The Unix time in ms of a core's `deadline` (an `Instant`, as [`now`] gives them).
fn unix_ms_at(deadline: std::time::Instant) -> u64 {
    let unix_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let left = deadline.saturating_duration_since(now());
    u64::try_from((unix_now + left).as_millis()).unwrap_or(u64::MAX)
}

/// Sends `sig` to the app's process group.
fn forward(pgid: Option<i32>, sig: Signal) {
    if let Some(pgid) = pgid {
        if let Err(e) = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), sig) {
            debug!(pgid, %sig, error = %e, "cannot signal the app's group");
        }
    }
}
