//! The core task: owns the [`HostTable`] and the [`JobDesk`], applies events from
//! connections and supervisors in order, and performs the resulting effects. Nothing else
//! mutates broker state; no decision is taken here (the table and the allocator decide).
//! After every event it tells the daemons of the hosts whose allocations changed
//! ([`HostWords`]), through each daemon's session. `rb-broker` runs it on a
//! thread of its own (`rb-core`; see `on_a_thread_of_its_own` in the crate root), so the
//! connections it wakes are not held behind its turn.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use proto::{
    msg::{JobRegistration, Request, Response, ToBroker},
    report::{HostReport, HostStatus},
    report_changes::ReportPatch,
};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};

use crate::{
    alloc::JobId,
    authz::{Actor, AdminError},
    host_words::{HostWords, WordSender},
    hosts::{ConnId, Effect, HostAt, HostTable, StatusPart},
    jobs::JobDesk,
    outbox::Outbox,
    status_answers::StatusAnswers,
    supervisor::SupervisorSet,
};

/// How often silence is checked.
pub const TICK: Duration = Duration::from_millis(250);
/// How often the allocation core ticks while it may ask Slurm for a pilot
/// ([`JobDesk::pilot_may_be_due`]): the policy's `overflow` is then seen to turn true within
/// this, not within [`TICK`].
pub const PILOT_TICK: Duration = Duration::from_millis(50);

/// Events the core consumes.
#[derive(Debug)]
pub enum Event {
    /// A daemon finished its handshake; `close` ends its connection task when fired;
    /// `word` is where its session hears of its host's allocations.
    HostdConnected {
        host: String,
        conn: ConnId,
        close: oneshot::Sender<String>,
        word: WordSender,
    },
    /// `sbatch` answered for pilot `pilot`: its Slurm job id, or why not.
    PilotSubmitted {
        pilot: allocation::PilotId,
        result: Result<String, String>,
    },
    /// This broker's pilots that Slurm still has, found at start (by job name).
    PilotsFound {
        ids: Vec<String>,
    },
    /// A host daemon says it runs in Slurm job `slurm_job` (a pilot), `ending` once Slurm
    /// warned that the lease ends.
    PilotLease {
        host: String,
        slurm_job: String,
        ending: bool,
    },
    /// What Slurm says is left of `slurm_job`'s lease (`None`: it did not say), asked
    /// after [`Event::PilotLease`].
    PilotLeaseLeft {
        host: String,
        slurm_job: String,
        ending: bool,
        left: Option<Duration>,
    },
    /// A Slurm pilot's daemon (`slurm-<node>`, not in the lab file) authenticated from
    /// `address`; its `HostdConnected` follows.
    PilotJoined {
        host: String,
        address: String,
    },
    /// A report from `host`'s daemon on `conn`, in the form its connection read it;
    /// `allocs_running` as it says them now (apart from the report: `core` passes them to
    /// the desk, the report goes to the table). `row`: where the core last told the
    /// session the host's record is ([`crate::hosts::HostAt`]).
    Report {
        host: String,
        conn: ConnId,
        row: Option<u32>,
        report: Reported,
        allocs_running: Option<Vec<u64>>,
    },
    Disconnected {
        host: String,
        conn: ConnId,
        reason: String,
    },
    DaemonStarted {
        host: String,
    },
    DaemonExited {
        host: String,
        how: String,
    },
    /// Every host's status row in parts, for `rb status` and the web page: the fixed
    /// parts as kept encoded, so that the core builds and encodes no row (the connection
    /// joins them); built a piece at a time between other events
    /// ([`crate::status_answers`]).
    StatusParts {
        reply: oneshot::Sender<Vec<StatusPart>>,
    },
    /// An agent registers its job; answers with the job id (or why not). `tx` is its
    /// connection's outbox.
    AgentRegister {
        reg: Box<JobRegistration>,
        tx: Outbox,
        reply: oneshot::Sender<Result<JobId, String>>,
    },
    /// A message from `job`'s agent. `turn` is one of the few the agent's connection may
    /// have waiting for the core at once (released once the message is applied): a
    /// flooding agent then waits its turn, and other peers' events do not queue behind
    /// thousands of its own.
    AgentMessage {
        job: JobId,
        msg: ToBroker,
        turn: Option<tokio::sync::OwnedSemaphorePermit>,
    },
    AgentGone {
        job: JobId,
    },
    /// The cached host values a reload prepares its policy's host decisions from, off the
    /// core (`reload`).
    PolicyInputs {
        reply: oneshot::Sender<crate::alloc::HostInputs>,
    },
    /// A reloaded policy, its host decisions prepared from [`Event::PolicyInputs`], to put
    /// in force; `reply` fires once it is.
    SetPolicy {
        prepared: Box<crate::alloc::PreparedPolicy>,
        reply: oneshot::Sender<()>,
    },
    /// `rb policy explain HOST [--job ID]`.
    Explain {
        host: String,
        job: Option<JobId>,
        reply: oneshot::Sender<Result<serde_json::Value, String>>,
    },
    /// `rb jobs|release|drain|resume` from `actor` (authorized by the desk).
    Admin {
        actor: Actor,
        req: Request,
        reply: oneshot::Sender<Result<Response, AdminError>>,
    },
}

/// A host report as its daemon's connection read it (`proto::repeats`).
#[derive(Debug)]
pub enum Reported {
    /// The whole report (its `allocs_running` taken out).
    Whole(Box<HostReport>),
    /// The connection's last report again, but for its counter `seq`.
    Same { seq: u64 },
    /// What changed since the connection's last report, to apply to it.
    Changes(Box<ReportPatch>),
}

impl Event {
    /// Whether someone waits for the answer (`rb status`, `rb jobs`, explain, a reload):
    /// such events go in a queue of their own, never behind the second's burst of 10k
    /// host reports.
    fn is_request(&self) -> bool {
        matches!(
            self,
            Event::StatusParts { .. }
                | Event::Explain { .. }
                | Event::Admin { .. }
                | Event::PolicyInputs { .. }
                | Event::SetPolicy { .. }
        )
    }
}

/// Sender side used by connections and supervisors: host and agent events go in one
/// queue, in order; requests someone waits for (`Event::is_request`) in another, which
/// the core serves before the next batch of events (`run`): a request waits for at most
/// one batch, never for the second's burst of reports.
///
/// The events' queue carries them in runs ([`Self::blocking_send_all`]: the host daemons'
/// thread hands over a turn's events as one), so that the core's task is woken once a
/// turn, not once an event: woken for each, it emptied the queue between two events and
/// waited again, and the daemons' thread woke it again (tokio's `wake`, 2.6 % of the
/// broker's CPU at 10k quiet hosts).
#[derive(Debug, Clone)]
pub struct EventSender {
    events: mpsc::Sender<Vec<Event>>,
    requests: mpsc::Sender<Event>,
}

impl EventSender {
    /// Queues `event`; waits while its queue is full. Fails once the core is gone.
    pub async fn send(&self, event: Event) -> Result<(), Gone> {
        let sent = match event.is_request() {
            true => self.requests.send(event).await.is_ok(),
            false => self.events.send(vec![event]).await.is_ok(),
        };
        sent.then_some(()).ok_or(Gone)
    }

    /// `events` in their order from a thread outside any runtime (the host daemons' turns,
    /// which hand over each turn's events between turns): the requests among them one by
    /// one to theirs, the others as one run; blocks while a queue is full. Fails once the
    /// core is gone.
    pub fn blocking_send_all(&self, mut events: Vec<Event>) -> Result<(), Gone> {
        if events.iter().any(Event::is_request) {
            let (requests, others) = events.into_iter().partition(Event::is_request);
            for request in requests {
                self.requests.blocking_send(request).map_err(|_| Gone)?;
            }
            events = others;
        }
        if events.len() <= RUN_EVENTS {
            return self.blocking_send_run(events);
        }
        let mut events = events.into_iter().peekable();
        while events.peek().is_some() {
            self.blocking_send_run(events.by_ref().take(RUN_EVENTS).collect())?;
        }
        Ok(())
    }

    /// One run of at most [`RUN_EVENTS`] events (none a request).
    fn blocking_send_run(&self, run: Vec<Event>) -> Result<(), Gone> {
        if run.is_empty() {
            return Ok(());
        }
        // Room is the rule: taken without `blocking_send`'s runtime guard and park.
        match self.events.try_send(run) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(run)) => {
                self.events.blocking_send(run).map_err(|_| Gone)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Gone),
        }
    }

    /// Runs of host and agent events sent and not yet taken by the core (an event sent
    /// alone is applied as it is taken): tests wait for 0 before a request that must see
    /// them.
    #[cfg(test)]
    pub(crate) fn events_waiting(&self) -> usize {
        self.events.max_capacity() - self.events.capacity()
    }
}

/// Events in one run at most: the queue's room in runs times this is what it holds at most
/// (a turn of a connect storm can make thousands).
const RUN_EVENTS: usize = 64;

/// The core is gone: nothing takes events any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

/// The core's side of [`EventSender`].
#[derive(Debug)]
pub struct EventReceiver {
    events: Events,
    requests: mpsc::Receiver<Event>,
}

/// The host and agent events as the core takes them: one by one, out of the runs they
/// came in.
#[derive(Debug)]
struct Events {
    runs: mpsc::Receiver<Vec<Event>>,
    /// What is left of the run taken last.
    run: std::vec::IntoIter<Event>,
}

impl Events {
    /// The next event, waiting for one (`None` once every sender is gone). Cancel-safe:
    /// a run is taken and its first event returned in one poll.
    async fn recv(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.run.next() {
                return Some(event);
            }
            self.run = self.runs.recv().await?.into_iter();
        }
    }

    /// The next event if one is there.
    fn try_recv(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.run.next() {
                return Some(event);
            }
            self.run = self.runs.try_recv().ok()?.into_iter();
        }
    }
}

#[cfg(test)]
impl EventReceiver {
    /// The next host or agent event, waiting for one (`None` once every sender is gone).
    pub(crate) async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }
}

/// The core's queues: up to `capacity` runs of host and agent events (the host daemons'
/// thread sends a turn's in runs of `RUN_EVENTS` at most, an agent's session or a
/// supervisor runs of one), and a few hundred requests.
pub fn channel(capacity: usize) -> (EventSender, EventReceiver) {
    let (events_tx, runs) = mpsc::channel(capacity);
    let (requests_tx, requests) = mpsc::channel(REQUESTS);
    let sender = EventSender {
        events: events_tx,
        requests: requests_tx,
    };
    let events = Events {
        runs,
        run: Vec::new().into_iter(),
    };
    (sender, EventReceiver { events, requests })
}

/// Requests waiting for the core at most (their senders wait beyond).
const REQUESTS: usize = 256;

/// Runs until `shutdown` fires, then stops every host daemon; returns the last status.
///
/// Every host change the table records (a report, a connection, up/down, and each host of
/// the lab file at start) reaches the allocator right after the event that caused it (or
/// the batch of reports, `REPORT_BATCH`), before any other event is applied; and
/// every effect of every allocator entry point is performed. The daemons of the hosts
/// whose allocations an event changed hear of it after it (after the grants it caused
/// went out).
pub async fn run(
    mut table: HostTable,
    mut desk: JobDesk,
    mut queues: EventReceiver,
    supervisors: SupervisorSet,
    mut shutdown: watch::Receiver<bool>,
) -> Vec<HostStatus> {
    let mut sessions = Sessions::default();
    let mut status = StatusAnswers::default();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pilot_tick = tokio::time::interval(PILOT_TICK);
    pilot_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    hosts_to_desk(&mut table, &mut desk);
    let mut saved = desk.store_progress();
    sessions.words.publish(&desk);
    // An event of another kind found behind a batch of reports: applied next, first.
    let mut held = None;
    // A waiting request goes before the next batch of events (at most every other turn,
    // so that a stream of requests never starves the hosts' reports).
    let mut request_first = true;
    loop {
        let request = match (&held, request_first) {
            (None, true) => queues.requests.try_recv().ok(),
            _ => None,
        };
        request_first = request.is_none();
        let effects = match (held.take(), request) {
            (Some(event), _) | (None, Some(event)) => {
                apply(&mut table, &mut desk, &mut sessions, &mut status, event)
            }
            (None, None) => tokio::select! {
                _ = shutdown.changed() => break,
                () = std::future::ready(()), if status.busy() => {
                    status.build(&table, &desk, now());
                    Vec::new()
                }
                _ = tick.tick() => {
                    let now = now();
                    let effects = table.tick(now);
                    let job_effects = desk.tick(now);
                    desk.perform(job_effects, now);
                    effects
                }
                _ = pilot_tick.tick(), if desk.pilot_may_be_due(now()) => {
                    let now = now();
                    let job_effects = desk.tick(now);
                    desk.perform(job_effects, now);
                    Vec::new()
                }
                written = next_saved(&mut saved), if desk.ends_wait_for_disk() => {
                    desk.saved_up_to(written);
                    Vec::new()
                }
                event = queues.requests.recv() => match event {
                    Some(event) => apply(&mut table, &mut desk, &mut sessions, &mut status, event),
                    None => break,
                },
                event = queues.events.recv() => match event {
                    Some(event) => {
                        let effects = apply(&mut table, &mut desk, &mut sessions, &mut status, event);
                        let queue = &mut queues.events;
                        reports_behind(&mut table, &mut desk, queue, &mut held);
                        effects
                    }
                    None => break,
                },
            },
        };
        hosts_to_desk(&mut table, &mut desk);
        perform(effects, &mut sessions, &supervisors);
        sessions.words.publish(&desk);
    }
    supervisors.shutdown().await;
    desk.cancel_pilots().await;
    let now = now();
    let mut rows = table.status(now);
    desk.annotate(&mut rows, now);
    rows
}

/// Host reports applied in a row at most: the allocator then hears of their hosts in one
/// pass, and the core's loop turns once for them all (at 10k hosts reporting each second,
/// most of the queue is reports). Bounds how long a request waits behind a batch.
const REPORT_BATCH: usize = 64;

/// Applies the host reports queued right behind the event just applied, up to
/// [`REPORT_BATCH`]; an event of another kind is left in `held` for the next turn, so that
/// the host changes reach the allocator before it (none is applied out of order).
fn reports_behind(
    table: &mut HostTable,
    desk: &mut JobDesk,
    events: &mut Events,
    held: &mut Option<Event>,
) {
    for _ in 1..REPORT_BATCH {
        match events.try_recv() {
            Some(Event::Report {
                host,
                conn,
                row,
                report,
                allocs_running,
            }) => {
                let at = HostAt { name: &host, row };
                apply_report(table, desk, at, conn, report, allocs_running)
            }
            Some(other) => {
                *held = Some(other);
                break;
            }
            None => break,
        }
    }
}

/// The connected host daemons' sessions: how to end each, and what each is told of its
/// host's allocations.
#[derive(Default)]
struct Sessions {
    closers: HashMap<ConnId, oneshot::Sender<String>>,
    words: HostWords,
}

/// The next snapshot sequence number the store's writer has written; never without a
/// store, or once the writer is gone.
async fn next_saved(saved: &mut Option<watch::Receiver<u64>>) -> u64 {
    let Some(rx) = saved.as_mut() else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_err() {
        *saved = None;
        return std::future::pending().await;
    }
    let written = *rx.borrow_and_update();
    written
}

/// The core's clock: tokio's, so that tests with a paused clock control every deadline.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Passes every host row that changed to the allocator and performs what it decides; the
/// hosts whose reports repeated their last one go after them, as one input and without
/// rows ([`JobDesk::hosts_repeated`]).
fn hosts_to_desk(table: &mut HostTable, desk: &mut JobDesk) {
    let now = now();
    table.take_changes(now, |fixed, live| {
        let effects = desk.host_changed(fixed, &live, now);
        desk.perform(effects, now);
    });
    desk.hosts_repeated(table.take_repeated(), now);
}

/// Applies one event; returns the host-table effects to perform.
fn apply(
    table: &mut HostTable,
    desk: &mut JobDesk,
    sessions: &mut Sessions,
    status: &mut StatusAnswers,
    event: Event,
) -> Vec<Effect> {
    let now = now();
    match event {
        Event::AgentRegister { reg, tx, reply } => match desk.register(*reg, tx, now) {
            Ok((job, effects)) => {
                let _ = reply.send(Ok(job));
                desk.perform(effects, now);
            }
            Err(why) => {
                let _ = reply.send(Err(why));
            }
        },
        Event::AgentMessage { job, msg, turn } => {
            let _turn = turn;
            let effects = desk.agent_message(job, msg, now);
            desk.perform(effects, now);
        }
        Event::AgentGone { job } => {
            let effects = desk.agent_gone(job, now);
            desk.perform(effects, now);
        }
        Event::Admin { actor, req, reply } => {
            let (answer, effects) = desk.admin(&actor, req, now);
            let _ = reply.send(answer);
            desk.perform(effects, now);
        }
        Event::PolicyInputs { reply } => {
            let _ = reply.send(desk.policy_inputs());
        }
        Event::SetPolicy { prepared, reply } => {
            let (effects, retired) = desk.set_policy(*prepared, now);
            // Tens of thousands of small frees at 10k hosts: not on the core.
            tokio::task::spawn_blocking(move || drop(retired));
            desk.perform(effects, now);
            let _ = reply.send(());
        }
        Event::PilotSubmitted { pilot, result } => {
            desk.pilot_submitted(pilot, result, now);
        }
        Event::PilotsFound { ids } => desk.pilots_found(ids, now),
        Event::PilotLease {
            host,
            slurm_job,
            ending,
        } => desk.ask_lease(host, slurm_job, ending),
        Event::PilotLeaseLeft {
            host,
            slurm_job,
            ending,
            left,
        } => {
            let effects = desk.pilot_lease(&host, &slurm_job, left, ending, now);
            desk.perform(effects, now);
        }
        Event::Explain { host, job, reply } => {
            let _ = reply.send(desk.explain(&host, job, now));
        }
        // Built a piece at a time between other events (`run`).
        Event::StatusParts { reply } => status.ask(reply),
        Event::Report {
            host,
            conn,
            row,
            report,
            allocs_running,
        } => {
            let at = HostAt { name: &host, row };
            apply_report(table, desk, at, conn, report, allocs_running)
        }
        event => return apply_host(table, sessions, event, now),
    }
    Vec::new()
}

/// A host daemon's report (as its connection read it: whole, the last again, or what
/// changed): to the table (the allocator hears of the change at the end of the turn,
/// `hosts_to_desk`); the allocations it says still run, to the desk at once.
fn apply_report(
    table: &mut HostTable,
    desk: &mut JobDesk,
    host: HostAt<'_>,
    conn: ConnId,
    report: Reported,
    running: Option<Vec<u64>>,
) {
    let now = now();
    match report {
        Reported::Whole(report) => table.report(host, conn, *report, now),
        Reported::Same { seq } => table.report_same(host, conn, seq, now),
        Reported::Changes(mut patch) => table.report_changes(host, conn, &mut patch, now),
    };
    allocs_running(desk, host.name, running, now);
}

/// The allocations a report says still run on `host`, to the desk.
fn allocs_running(desk: &mut JobDesk, host: &str, running: Option<Vec<u64>>, now: Instant) {
    if let Some(running) = running {
        let effects = desk.allocs_running(host, running, now);
        desk.perform(effects, now);
    }
}

/// Applies an event about a host daemon to the table.
fn apply_host(
    table: &mut HostTable,
    sessions: &mut Sessions,
    event: Event,
    now: Instant,
) -> Vec<Effect> {
    match event {
        Event::HostdConnected {
            host,
            conn,
            close,
            word,
        } => {
            info!(%host, conn, "host daemon connected");
            sessions.closers.insert(conn, close);
            word.set_row(table.row_of(&host));
            sessions.words.connected(&host, conn, word);
            return table.connected(&host, conn);
        }
        Event::PilotJoined { host, address } => {
            info!(%host, %address, "a Slurm pilot's host joins the lab");
            let hosts = table.len();
            table.add_pilot(&host, &address);
            if table.len() != hosts {
                sessions.words.rows_moved(|host| table.row_of(host));
            }
        }
        Event::Disconnected { host, conn, reason } => {
            sessions.closers.remove(&conn);
            sessions.words.disconnected(&host, conn);
            info!(%host, conn, %reason, "host daemon disconnected");
            table.disconnected(&host, conn, &reason);
        }
        Event::DaemonStarted { host } => table.daemon_started(&host, now),
        Event::DaemonExited { host, how } => table.daemon_exited(&host, &how),
        Event::StatusParts { .. }
        | Event::Report { .. }
        | Event::AgentRegister { .. }
        | Event::AgentMessage { .. }
        | Event::AgentGone { .. }
        | Event::PolicyInputs { .. }
        | Event::SetPolicy { .. }
        | Event::Explain { .. }
        | Event::PilotSubmitted { .. }
        | Event::PilotsFound { .. }
        | Event::PilotLease { .. }
        | Event::PilotLeaseLeft { .. }
        | Event::Admin { .. } => {}
    }
    Vec::new()
}

fn perform(effects: Vec<Effect>, sessions: &mut Sessions, supervisors: &SupervisorSet) {
    for effect in effects {
        match effect {
            Effect::CloseConn { conn, reason } => {
                if let Some(close) = sessions.closers.remove(&conn) {
                    let _ = close.send(reason);
                }
            }
            Effect::RestartDaemon { host, reason } => {
                warn!(%host, %reason, "host down; restarting its daemon");
                supervisors.restart(&host, &reason);
            }
        }
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
