//! Listeners and per-connection tasks: TCP (host daemons, remote clients and agents;
//! authenticated with the lab secret — the broker's owner — or a user's credential) and the
//! local control socket (the broker's own uid only, checked with SO_PEERCRED: the owner).
//! A bad peer is logged (rate-limited) and dropped; it can never stall the broker, because
//! each connection has its own task and a handshake deadline.
//!
//! Requests are answered by [`crate::requests`] (authorized, carried out, audited); a
//! user's jobs are theirs by authentication, whatever name the agent claims; revoking a
//! user ends their connections at once ([`crate::users::Revocation`]).
//!
//! The listeners, the handshake and clients' sessions are here; a host daemon's session is
//! in `hostd`, an agent's in `agent`.

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use proto::{
    auth::Secret,
    frame::{FrameError, FramedConn},
    handshake::{authenticate, refuse, Peer, ServerAuth},
    msg::{ErrorCode, FromBroker, Role, ToBroker},
    peercred,
    repeats::{HostdFrame, HostdFrames},
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, UnixListener},
    sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore},
};
use tracing::warn;

use crate::{
    audit::AuditLog,
    authz::{Actor, AdminError},
    core::{Event, EventSender, Reported},
    log_limit::LogLimiter,
    outbox::{self, OutboxRx},
    pace::Pace,
    reload::PolicyHandle,
    requests::{respond, status_frame, Reply},
    users::{revoked_message, Revocation, Users},
};

mod agent;
mod hostd;
mod hostd_ring;
pub mod turns;

use agent::agent_session;
use hostd::hostd_session;
use turns::HostdTurns;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Messages of one agent that may wait for the core at once (see `Event::AgentMessage`).
const AGENT_IN_FLIGHT: usize = 1;

/// Shared by every connection task.
pub struct ServerCtx {
    pub secret: Secret,
    pub events: EventSender,
    pub hosts: HashSet<String>,
    pub report_interval_ms: u64,
    pub uid: u32,
    /// Fired by a local `Shutdown` request.
    pub stop: watch::Sender<bool>,
    /// The policy in force and its reloads.
    pub policy: Arc<PolicyHandle>,
    /// Whether daemons are told the live allocations to sweep leftovers by: not where
    /// daemons share a machine (`local`, `manual`), where they must not sweep each other's
    /// processes (see `hostd::sweep`).
    pub sweep_live: bool,
    /// The users with a credential.
    pub users: Arc<Users>,
    /// Admin actions and refusals.
    pub audit: AuditLog,
    /// The broker owner's login name (the user of the owner's jobs).
    pub owner: String,
    /// `[overflow.slurm]` is configured: daemons named `slurm-<node>` (Slurm pilots, with
    /// the lab secret) may join over TCP though the lab file does not list them.
    pub pilot_hosts: bool,
    /// How many messages an agent's outbox holds ([`outbox::agent_outbox_size`]).
    pub agent_outbox: usize,
    /// Connections over TCP (host daemons, agents, users) held at once: the open-files
    /// limit less what the broker keeps for itself and for the daemons it starts
    /// ([`tcp_slots_for`]), so that a flood of
    /// connections never takes the control socket's (found at 20000 connections: `rb
    /// status` failed while every accept failed with EMFILE).
    tcp_slots: Arc<Semaphore>,
    next_conn: AtomicU64,
    limiter: LogLimiter,
    /// Where host daemons' sessions run once they authenticated.
    turns: HostdTurns,
}

/// What a connection's requests are answered from besides the core.
pub struct Identity {
    pub users: Arc<Users>,
    pub audit: AuditLog,
    pub owner: String,
}

impl ServerCtx {
    /// Also starts the host daemons' thread ([`turns`]), which fails only as a thread or a
    /// runtime can.
    pub fn new(
        secret: Secret,
        events: EventSender,
        hosts: HashSet<String>,
        report_interval_ms: u64,
        stop: watch::Sender<bool>,
        policy: Arc<PolicyHandle>,
        identity: Identity,
    ) -> std::io::Result<Self> {
        Ok(Self {
            turns: HostdTurns::start(events.clone(), stop.subscribe())?,
            policy,
            users: identity.users,
            audit: identity.audit,
            owner: identity.owner,
            secret,
            events,
            hosts,
            report_interval_ms,
            uid: nix::unistd::geteuid().as_raw(),
            stop,
            sweep_live: false,
            pilot_hosts: false,
            agent_outbox: outbox::agent_outbox_size(),
            tcp_slots: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
            next_conn: AtomicU64::new(1),
            limiter: LogLimiter::new(20, Duration::from_secs(10)),
        })
    }

    /// At most `slots` TCP connections at once (see [`tcp_slots_for`]).
    pub fn with_tcp_slots(mut self, slots: usize) -> Self {
        self.tcp_slots = Arc::new(Semaphore::new(slots.min(Semaphore::MAX_PERMITS)));
        self
    }
}

/// Open files the broker keeps for itself beside its TCP connections: the control socket
/// and its clients, the web page's connections (64 at most), the store, the trace, logs.
pub const FILES_KEPT: u64 = 256;

/// Open files a host daemon the broker starts holds there (its lifeline pipe, the
/// process's handle).
pub const FILES_PER_DAEMON: u64 = 2;

/// How many TCP connections a broker whose open-files limit is `limit`, and which starts
/// `daemons` host daemons, holds at once (at least 16).
pub fn tcp_slots_for(limit: u64, daemons: usize) -> usize {
    let daemons_files = FILES_PER_DAEMON.saturating_mul(daemons as u64);
    let slots = limit
        .saturating_sub(FILES_KEPT)
        .saturating_sub(daemons_files);
    usize::try_from(slots.max(16)).unwrap_or(usize::MAX)
}

/// Accepts TCP connections until `shutdown` fires, at most the context's slots at once
/// (more wait in the listen queue until one closes).
pub async fn serve_tcp(
    listener: TcpListener,
    ctx: Arc<ServerCtx>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let slot = tokio::select! {
            _ = shutdown.changed() => return,
            slot = tcp_slot(&ctx) => slot,
        };
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let ctx = ctx.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    let auth = ServerAuth::SecretOrUser {
                        secret: &ctx.secret,
                        users: ctx.users.as_ref(),
                    };
                    let peer = Connection {
                        name: peer.to_string(),
                        local: false,
                        slot: Some(slot),
                    };
                    handle(stream, &ctx, auth, peer, shutdown).await;
                });
            }
            Err(e) => accept_error(&ctx, &e).await,
        }
    }
}

/// Accepts local control connections until `shutdown` fires.
pub async fn serve_unix(
    listener: UnixListener,
    ctx: Arc<ServerCtx>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => {
                let ctx = ctx.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    let peer_uid = peercred::peer_uid(&stream);
                    let peer = format!(
                        "local uid {}",
                        peer_uid.map_or("?".into(), |u| u.to_string())
                    );
                    let auth = ServerAuth::PeerUid {
                        expected_uid: ctx.uid,
                        peer_uid,
                    };
                    let peer = Connection {
                        name: peer,
                        local: true,
                        slot: None,
                    };
                    handle(stream, &ctx, auth, peer, shutdown).await;
                });
            }
            Err(e) => accept_error(&ctx, &e).await,
        }
    }
}

/// A slot for the next TCP connection, waiting (and saying so) while all are taken.
async fn tcp_slot(ctx: &ServerCtx) -> OwnedSemaphorePermit {
    if let Ok(slot) = ctx.tcp_slots.clone().try_acquire_owned() {
        return slot;
    }
    if ctx.limiter.allow() {
        warn!(
            "every TCP connection slot is taken; more are accepted as others close \
             (the slots are the open-files limit less {FILES_KEPT} and {FILES_PER_DAEMON} per \
             host daemon the broker starts: raise `ulimit -n` for more hosts)"
        );
    }
    match ctx.tcp_slots.clone().acquire_owned().await {
        Ok(slot) => slot,
        Err(_) => std::future::pending().await, // never closed
    }
}

/// Who is at the other end of a connection: its address (or local uid) as logged, whether
/// it came over the control socket, and its TCP slot (held for the connection's life).
struct Connection {
    name: String,
    local: bool,
    slot: Option<OwnedSemaphorePermit>,
}

/// A connection's socket, which can move to the host daemons' runtime ([`turns`]): out of
/// the runtime that accepted it as a std socket, into the other's reactor there.
trait Movable: AsyncRead + AsyncWrite + Unpin + Send + Sized + 'static {
    type Std: Send + Into<std::os::fd::OwnedFd> + 'static;
    fn into_std(self) -> std::io::Result<Self::Std>;
    /// In the runtime it moves to.
    fn from_std(socket: Self::Std) -> std::io::Result<Self>;
}

impl Movable for tokio::net::TcpStream {
    type Std = std::net::TcpStream;
    fn into_std(self) -> std::io::Result<Self::Std> {
        tokio::net::TcpStream::into_std(self)
    }
    fn from_std(socket: Self::Std) -> std::io::Result<Self> {
        tokio::net::TcpStream::from_std(socket)
    }
}

impl Movable for tokio::net::UnixStream {
    type Std = std::os::unix::net::UnixStream;
    fn into_std(self) -> std::io::Result<Self::Std> {
        tokio::net::UnixStream::into_std(self)
    }
    fn from_std(socket: Self::Std) -> std::io::Result<Self> {
        tokio::net::UnixStream::from_std(socket)
    }
}

/// Welcomes an authenticated host daemon, then moves its connection to the host daemons'
/// runtime, where its session runs ([`turns`]); a socket that cannot move is closed and
/// said (the daemon connects again). Welcomed here, not in its first turn: the daemon's
/// handshake ends without waiting for one (a connect storm comes up as fast).
async fn hand_over<S: Movable>(
    mut conn: FramedConn<S>,
    ctx: &Arc<ServerCtx>,
    host: String,
    connection: Connection,
    shutdown: watch::Receiver<bool>,
) {
    if welcome(&mut conn, ctx).await.is_err() {
        return;
    }
    let conn = match conn.map_stream(S::into_std) {
        Ok(conn) => conn,
        Err(e) => {
            let why = format!("cannot move the connection of host `{host}`'s daemon: {e}");
            return ctx.limiter.warn(&connection.name, &why);
        }
    };
    if ctx.turns.reads_through_ring() {
        return to_ring(conn, ctx, host, connection);
    }
    let (turns, ctx) = (ctx.turns.clone(), ctx.clone());
    turns.spawn(async move {
        let _slot = connection.slot;
        match conn.map_stream(S::from_std) {
            Ok(conn) => hostd_session(conn, &ctx, host, shutdown).await,
            Err(e) => {
                let why = format!("cannot move the connection of host `{host}`'s daemon: {e}");
                ctx.limiter.warn(&connection.name, &why)
            }
        }
    });
}

/// A welcomed daemon's connection to the sessions read through io_uring
/// ([`turns::HostdTurns::hand_to_ring`]).
fn to_ring<T: Into<std::os::fd::OwnedFd>>(
    conn: FramedConn<T>,
    ctx: &ServerCtx,
    host: String,
    connection: Connection,
) {
    let Some((socket, lines)) = conn.into_parts() else {
        let why = format!("host `{host}`'s daemon: the welcome was not wholly written");
        return ctx.limiter.warn(&connection.name, &why);
    };
    ctx.turns.hand_to_ring(hostd_ring::Incoming {
        fd: socket.into(),
        lines,
        host,
        conn: ctx.next_conn.fetch_add(1, Ordering::Relaxed),
        sweep_live: ctx.sweep_live,
        permit: connection.slot,
    });
}

/// Out of descriptors and similar: log and back off briefly instead of spinning.
async fn accept_error(ctx: &ServerCtx, e: &std::io::Error) {
    if ctx.limiter.allow() {
        warn!(error = %e, "accept failed");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
}

async fn handle<S: Movable>(
    stream: S,
    ctx: &Arc<ServerCtx>,
    auth: ServerAuth<'_>,
    connection: Connection,
    shutdown: watch::Receiver<bool>,
) {
    let (peer, local) = (connection.name.clone(), connection.local);
    let mut conn = FramedConn::new(stream);
    // The handshake and the sessions other than a host daemon's are boxed: a future keeps
    // room for its largest state for its whole life, and the broker keeps one host daemon
    // session per host (10k at once), each of which would otherwise carry room for a
    // handshake it is done with and for an agent's or a client's session (a task of 5.4 KiB
    // became one of 1.7 KiB).
    let handshake = Box::pin(authenticate(&mut conn, auth));
    let (hello, who) = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => return ctx.limiter.warn(&peer, &e.to_string()),
        Err(_) => return ctx.limiter.warn(&peer, "handshake timed out"),
    };
    let actor = match who {
        Peer::Owner => Actor::Owner,
        Peer::User(name) => {
            ctx.users.seen(&name);
            Actor::User(name)
        }
    };
    match hello.role {
        Role::Hostd if actor != Actor::Owner => {
            let reason = "host daemons prove the lab secret, not a user credential".to_string();
            refuse(&mut conn, ErrorCode::Auth, &reason).await;
            ctx.limiter.warn(&peer, &reason);
        }
        Role::Hostd if ctx.hosts.contains(&hello.name) => {
            hand_over(conn, ctx, hello.name, connection, shutdown).await
        }
        Role::Hostd => match pilot_address(ctx, &hello.name, &peer, local) {
            Some(address) => {
                let host = hello.name.clone();
                let joined = Event::PilotJoined { host, address };
                if ctx.events.send(joined).await.is_ok() {
                    hand_over(conn, ctx, hello.name, connection, shutdown).await
                }
            }
            None => {
                let reason = format!("host `{}` is not in the lab file", hello.name);
                refuse(&mut conn, ErrorCode::UnknownHost, &reason).await;
                ctx.limiter.warn(&peer, &reason);
            }
        },
        Role::Client => {
            let revoked = Revocation::watch(&ctx.users, &actor);
            Box::pin(client_session(
                conn, ctx, local, &peer, &actor, revoked, shutdown,
            ))
            .await
        }
        Role::Agent => {
            let revoked = Revocation::watch(&ctx.users, &actor);
            Box::pin(agent_session(conn, ctx, &actor, revoked, shutdown)).await
        }
        Role::Subagent => {
            let reason = "subagents talk to their agent, not to the broker".to_string();
            refuse(&mut conn, ErrorCode::BadMessage, &reason).await;
            ctx.limiter.warn(&peer, &reason);
        }
    }
}

/// The address of a Slurm pilot's daemon that may join as `host`: over TCP, with
/// `[overflow.slurm]` configured, named `slurm-<node>`. `None` otherwise.
fn pilot_address(ctx: &ServerCtx, host: &str, peer: &str, local: bool) -> Option<String> {
    if local || !ctx.pilot_hosts || !config::pilot::is_pilot_host(host) {
        return None;
    }
    let addr: std::net::SocketAddr = peer.parse().ok()?;
    Some(addr.ip().to_string())
}

async fn welcome<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut FramedConn<S>,
    ctx: &ServerCtx,
) -> Result<(), FrameError> {
    // Every role hears the same welcome; only host daemons' reports come as changes.
    conn.send(&FromBroker::Welcome {
        report_interval_ms: ctx.report_interval_ms,
        report_changes: true,
    })
    .await
}

async fn client_session<S>(
    mut conn: FramedConn<S>,
    ctx: &ServerCtx,
    local: bool,
    peer: &str,
    actor: &Actor,
    mut revoked: Revocation,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if welcome(&mut conn, ctx).await.is_err() {
        return;
    }
    loop {
        let msg = tokio::select! {
            _ = shutdown.changed() => return,
            _ = revoked.revoked() => {
                return refuse(&mut conn, ErrorCode::Auth, &revoked_message(actor)).await;
            }
            msg = conn.recv::<ToBroker>() => msg,
        };
        let (id, req) = match msg {
            Ok(ToBroker::Request { id, req }) => (id, req),
            Ok(other) => {
                return refuse(
                    &mut conn,
                    ErrorCode::BadMessage,
                    &format!("expected a request, got {}", short(&other)),
                )
                .await
            }
            Err(FrameError::Closed) => return,
            Err(e) => return refuse(&mut conn, ErrorCode::BadMessage, &e.to_string()).await,
        };
        let reply = match respond(ctx, req, local, peer, actor).await {
            Ok(Reply::Response(resp)) => FromBroker::Response { id, resp },
            Ok(Reply::StatusRows(parts)) => match status_frame(id, &parts) {
                Ok(frame) => {
                    drop(parts);
                    if conn.send_encoded(frame).await.is_err() {
                        return;
                    }
                    continue;
                }
                Err(e) => FromBroker::Error {
                    code: ErrorCode::Failed,
                    message: e.to_string(),
                },
            },
            Err(AdminError::Denied(refusal)) => FromBroker::Error {
                code: ErrorCode::Denied,
                message: refusal.to_string(),
            },
            Err(AdminError::Failed(message)) => FromBroker::Error {
                code: ErrorCode::Failed,
                message,
            },
        };
        if conn.send(&reply).await.is_err() {
            return;
        }
    }
}

fn short(msg: &ToBroker) -> String {
    let text = format!("{msg:?}");
    text.chars().take(60).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files kept, two per daemon the broker starts, the rest for TCP, never fewer
    /// than 16 (an unlimited limit gives as many as a semaphore holds).
    #[test]
    fn tcp_slots_leave_the_kept_files_and_the_daemons_pipes() {
        assert_eq!(tcp_slots_for(20_000, 0), 19_744);
        assert_eq!(tcp_slots_for(20_000, 5_000), 9_744);
        assert_eq!(tcp_slots_for(64, 0), 16);
        assert_eq!(tcp_slots_for(20_000, 100_000), 16);
        assert!(tcp_slots_for(u64::MAX, 10) > 1 << 40);
    }
}
