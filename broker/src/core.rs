//! The core task: owns the [`HostTable`], applies events from connections and supervisors
//! in order, and performs the resulting [`Effect`]s. Nothing else mutates broker state.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use proto::{
    msg::{FromBroker, JobRegistration, Request, Response, ToBroker},
    report::{HostReport, HostStatus},
};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};

use crate::{
    alloc::JobId,
    hosts::{ConnId, Effect, HostTable},
    jobs::JobDesk,
    supervisor::SupervisorSet,
};

/// How often silence is checked.
pub const TICK: Duration = Duration::from_millis(250);

/// Events the core consumes.
#[derive(Debug)]
pub enum Event {
    /// A daemon finished its handshake; `close` ends its connection task when fired.
    HostdConnected {
        host: String,
        conn: ConnId,
        close: oneshot::Sender<String>,
    },
    Report {
        host: String,
        conn: ConnId,
        report: Box<HostReport>,
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
    Status {
        reply: oneshot::Sender<Vec<HostStatus>>,
    },
    /// An agent registers its job; answers with the job id (or why not).
    AgentRegister {
        reg: Box<JobRegistration>,
        tx: mpsc::Sender<FromBroker>,
        reply: oneshot::Sender<JobId>,
    },
    AgentMessage {
        job: JobId,
        msg: ToBroker,
    },
    AgentGone {
        job: JobId,
    },
    /// `rb jobs|release|drain|resume`.
    Admin {
        req: Request,
        reply: oneshot::Sender<Result<Response, String>>,
    },
}

/// Sender side used by connections and supervisors.
pub type EventSender = mpsc::Sender<Event>;

/// Runs until `shutdown` fires, then stops every host daemon; returns the last status.
pub async fn run(
    mut table: HostTable,
    mut desk: JobDesk,
    mut events: mpsc::Receiver<Event>,
    supervisors: SupervisorSet,
    mut shutdown: watch::Receiver<bool>,
) -> Vec<HostStatus> {
    let mut closers: HashMap<ConnId, oneshot::Sender<String>> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let effects = tokio::select! {
            _ = shutdown.changed() => break,
            _ = tick.tick() => {
                let now = Instant::now();
                let effects = table.tick(now);
                if desk.has_jobs() {
                    let mut job_effects = desk.hosts_changed(&table.status(now), now);
                    job_effects.extend(desk.tick(now));
                    desk.perform(job_effects).await;
                }
                effects
            }
            event = events.recv() => match event {
                Some(Event::AgentRegister { reg, tx, reply }) => {
                    let now = Instant::now();
                    let _ = desk.hosts_changed(&table.status(now), now);
                    let (job, effects) = desk.register(*reg, tx, now).await;
                    let _ = reply.send(job);
                    desk.perform(effects).await;
                    Vec::new()
                }
                Some(Event::AgentMessage { job, msg }) => {
                    let now = Instant::now();
                    let mut effects = if matches!(msg, ToBroker::Allocate { .. }) {
                        desk.hosts_changed(&table.status(now), now)
                    } else {
                        Vec::new()
                    };
                    effects.extend(desk.agent_message(job, msg, now));
                    desk.perform(effects).await;
                    Vec::new()
                }
                Some(Event::AgentGone { job }) => {
                    let effects = desk.agent_gone(job, Instant::now());
                    desk.perform(effects).await;
                    Vec::new()
                }
                Some(Event::Admin { req, reply }) => {
                    let (answer, effects) = desk.admin(req, Instant::now());
                    let _ = reply.send(answer);
                    desk.perform(effects).await;
                    Vec::new()
                }
                Some(event) => apply(&mut table, &mut closers, event),
                None => break,
            },
        };
        perform(effects, &mut closers, &supervisors).await;
    }
    supervisors.shutdown().await;
    table.status(Instant::now())
}

fn apply(
    table: &mut HostTable,
    closers: &mut HashMap<ConnId, oneshot::Sender<String>>,
    event: Event,
) -> Vec<Effect> {
    let now = Instant::now();
    match event {
        Event::HostdConnected { host, conn, close } => {
            info!(%host, conn, "host daemon connected");
            closers.insert(conn, close);
            table.connected(&host, conn)
        }
        Event::Report { host, conn, report } => {
            table.report(&host, conn, *report, now);
            Vec::new()
        }
        Event::Disconnected { host, conn, reason } => {
            closers.remove(&conn);
            info!(%host, conn, %reason, "host daemon disconnected");
            table.disconnected(&host, conn, &reason);
            Vec::new()
        }
        Event::DaemonStarted { host } => {
            table.daemon_started(&host, now);
            Vec::new()
        }
        Event::DaemonExited { host, how } => {
            table.daemon_exited(&host, &how);
            Vec::new()
        }
        Event::Status { reply } => {
            let _ = reply.send(table.status(now));
            Vec::new()
        }
        Event::AgentRegister { .. }
        | Event::AgentMessage { .. }
        | Event::AgentGone { .. }
        | Event::Admin { .. } => Vec::new(),
    }
}

async fn perform(
    effects: Vec<Effect>,
    closers: &mut HashMap<ConnId, oneshot::Sender<String>>,
    supervisors: &SupervisorSet,
) {
    for effect in effects {
        match effect {
            Effect::CloseConn { conn, reason } => {
                if let Some(close) = closers.remove(&conn) {
                    let _ = close.send(reason);
                }
            }
            Effect::RestartDaemon { host, reason } => {
                warn!(%host, %reason, "host down; restarting its daemon");
                supervisors.restart(&host, &reason).await;
            }
        }
    }
}
