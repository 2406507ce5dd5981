//! `rb-broker`: the lab's manager process.
//!
//! # Layout
//! - [`hosts`]: the pure host table (up/down, latest reports, silence → restart effects, and
//!   which hosts changed, for the allocator).
//! - [`alloc`]: the pure allocation core (the `allocation` crate, re-exported: jobs, requests,
//!   allocations, the policy seam) and its SQLite store.
//! - [`jobs`]: the allocator's async edge: agents, their request ids, effects → messages.
//! - [`core`]: the one task that owns broker state and applies events in order (on a
//!   thread of its own, `rb-core`, under a runtime of its own).
//! - [`outbox`]: each agent's bounded outbox, which the core never waits on.
//! - [`pace`]: the rate at which one agent's messages are read (a flood waits its turn).
//! - [`log_limit`]: the rate limit on warnings a peer can trigger.
//! - [`server`]: TCP and local-socket listeners, handshakes, per-connection tasks; host
//!   daemons' sessions on a thread of their own, run in turns (`server::turns`, `rb-hostd`).
//! - [`requests`]: what a client request does: authorize, carry out, audit.
//! - [`authz`]: who may do what (the owner everything; a user reads, releases own hosts).
//! - [`users`]: the users with a credential (`rb user add|list|revoke`).
//! - [`audit`]: the audit log of admin actions and refusals (`STATE_DIR/audit.log`).
//! - [`pilots`](mod@pilots): overflow onto Slurm's shell: `sbatch`/`scancel` for the core's pilot effects.
//! - [`supervisor`]: keeps every host's daemon running through the transport.
//! - [`trace`]: the decision trace's edge: the sink the job desk records into, and the
//!   writer thread appending to `STATE_DIR/trace/` (format and replay: `allocation`).
//! - [`transport`]: the command line that starts a daemon on a host (ssh, rsh, local).
//! - [`web`]: the `[web]` listener: `/metrics` for Prometheus and a JSON view.
//! - [`embedded`]: the single-machine default lab (virtual hosts) used when none is configured.
//!
//! [`run`] wires them: bind listeners → spawn supervisors and the core → serve until
//! shutdown → stop daemons (lifeline, then SIGKILL) → remove the socket.

pub mod alloc;
pub mod audit;
pub mod authz;
pub mod cli;
pub mod core;
pub mod embedded;
pub mod host_words;
pub mod hosts;
pub mod jobs;
pub mod log_limit;
pub mod outbox;
pub mod pace;
pub mod persist;
pub mod pilots;
pub mod reload;
pub mod requests;
pub mod server;
pub mod shared_lists;
pub mod status_answers;
pub mod supervisor;
pub mod trace;
pub mod transport;
pub mod users;
pub mod web;

use std::{
    collections::HashSet,
    future::Future,
    net::{IpAddr, SocketAddr},
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{bail, Context};
use config::LabConfig;
use proto::auth::Secret;
use tokio::{
    net::{TcpListener, UnixListener},
    sync::watch,
};
use tracing::info;

use crate::{
    hosts::HostTable, server::ServerCtx, supervisor::SupervisorSet, transport::LaunchSpec,
};

/// What a running broker tells other programs about itself (`STATE_DIR/broker.json`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BrokerInfo {
    pub pid: u32,
    /// The bound TCP address (with the real port when the lab file said port 0).
    pub listen: SocketAddr,
    pub control_socket: PathBuf,
    /// The bound `[web]` listener (`/metrics`), if the lab file has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web: Option<SocketAddr>,
}

/// Path of the info file in a state dir.
pub fn info_path(state_dir: &Path) -> PathBuf {
    state_dir.join("broker.json")
}

/// Runs the broker for `lab` with `policy` (loaded before the runtime started, from
/// `[broker] policy`) until `shutdown` completes or a local client asks it to stop.
pub async fn run(
    lab: LabConfig,
    policy: Arc<policies::Policy>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    prepare_state_dir(&lab.broker.state_dir)?;
    let secret = Secret::load(&lab.broker.secret_file)?;
    let secret_mark = secret.lab_mark();
    let fd_limit = startup::raise_open_files();
    let tcp = TcpListener::bind(lab.broker.listen)
        .await
        .with_context(|| format!("cannot listen on {} (broker.listen)", lab.broker.listen))?;
    let listen = tcp.local_addr()?;
    if listen.ip().is_unspecified() && !matches!(lab.broker.transport, config::Transport::Manual) {
        bail!("broker.listen {listen} is a wildcard address; host daemons need one they can connect to\nhelp: use this machine's lab address, e.g. \"10.77.0.1:7700\"");
    }
    let socket_path = lab.control_socket();
    refuse_a_live_broker(&socket_path).await?;
    let web = bind_web(&lab).await?;
    let web_addr = web.as_ref().and_then(|(l, _, _)| l.local_addr().ok());
    // Before the socket appears: whoever sees it finds this broker's address in broker.json.
    write_info(&lab.broker.state_dir, listen, &socket_path, web_addr)?;
    let unix = bind_control_socket(&socket_path)?;
    info!(%listen, socket = %socket_path.display(), hosts = lab.hosts.len(), transport = lab.broker.transport.name(), "broker listening");

    // Runs of events: at most 64 runs of at most 64 events (core::RUN_EVENTS), 4k events.
    // Beyond, the host daemons' thread waits and their reports wait in the sockets: at 10k
    // hosts the core takes about 100 a turn, and a connect storm's reports held here (with
    // room for 16k events the broker's peak RSS reached 103 MiB in one run of three).
    let (events_tx, events_rx) = core::channel(64);
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let names: HashSet<String> = lab.hosts.iter().map(|h| h.name.clone()).collect();
    let interval_ms = lab.broker.report_interval.as_millis() as u64;
    let policy_handle = Arc::new(
        reload::PolicyHandle::new(
            &lab.broker.policy,
            &lab.policy_base(),
            &policy,
            events_tx.clone(),
        )
        .with_lab_file(lab.source.clone()),
    );
    let watcher = reload::spawn_policy_watcher(policy_handle.clone(), stop_rx.clone())
        .context("cannot watch for SIGHUP")?;
    let owner = owner_name();
    let identity = server::Identity {
        users: Arc::new(users::Users::load(&lab.broker.state_dir, &owner)?),
        audit: audit::AuditLog::new(&lab.broker.state_dir),
        owner,
    };
    let mut ctx = ServerCtx::new(
        secret,
        events_tx.clone(),
        names,
        interval_ms,
        stop_tx.clone(),
        policy_handle,
        identity,
    )
    .context("cannot start the host daemons' thread")?;
    ctx.pilot_hosts = lab.overflow.is_some();
    // Host daemons sweep leftovers only where each serves a machine of its own; they end
    // the processes of allocations past their deadline on every transport.
    let sweep = matches!(
        lab.broker.transport,
        config::Transport::Ssh | config::Transport::Rsh
    );
    ctx.sweep_live = sweep;
    if let Some(limit) = fd_limit {
        let daemons = match lab.broker.transport {
            config::Transport::Manual => 0,
            _ => lab.hosts.len(),
        };
        ctx = ctx.with_tcp_slots(server::tcp_slots_for(limit, daemons));
    }
    let ctx = Arc::new(ctx);
    let spec = LaunchSpec::new(&lab, listen);
    let pilots = pilots(&lab, &spec, events_tx.clone());
    let web_events = events_tx.clone();
    let supervisors =
        SupervisorSet::spawn(&lab.hosts, &spec, events_tx, lab.broker.restart_backoff_max);
    let table = HostTable::new(&lab.hosts, lab.broker.down_after);
    let desk = job_desk(&lab, &spec, policy)?.with_lab_mark(Some(secret_mark));
    let desk = match (pilots, &lab.overflow) {
        (Some(p), Some(o)) => {
            p.find();
            let settings = allocation::OverflowSettings {
                max_nodes: o.max_nodes as usize,
                owner: owner_name(),
                idle_exit: o.idle_exit,
                warning: lab.broker.reclaim_grace,
            };
            desk.with_pilots(p, settings)
        }
        _ => desk,
    };
    let core = on_a_thread_of_its_own(core::run(
        table,
        desk,
        events_rx,
        supervisors,
        stop_rx.clone(),
    ))?;
    let tcp_task = tokio::spawn(server::serve_tcp(tcp, ctx.clone(), stop_rx.clone()));
    let unix_task = tokio::spawn(server::serve_unix(unix, ctx, stop_rx.clone()));
    let web_task = web.map(|(listener, jobs, token)| {
        let usage = web::usage::UsageChart::new(
            trace::trace_dir(&lab.broker.state_dir),
            lab.broker.policy.clone(),
            lab.policy_base(),
        );
        let ctx = web::WebCtx {
            events: web_events,
            jobs,
            token,
            usage,
        };
        tokio::spawn(web::serve(listener, Arc::new(ctx), stop_rx.clone()))
    });

    tokio::select! {
        _ = shutdown => info!("shutdown signal received"),
        _ = stop_rx.changed() => {}
    }
    let _ = stop_tx.send(true);
    let _ = tokio::join!(tcp_task, unix_task, watcher);
    if let Some(w) = web_task {
        let _ = w.await;
    }
    let _ = core.await;
    let _ = std::fs::remove_file(&socket_path);
    let _ = std::fs::remove_file(info_path(&lab.broker.state_dir));
    info!("broker stopped");
    Ok(())
}

/// Runs the core on a thread of its own, under a runtime of its own; its result comes back
/// on the channel returned. Why not a task among the connections': a task that the core's
/// task wakes (an agent's connection, to send the grant just decided) would wait in that
/// worker's next-task slot, which no other worker may take, until the core's turn ends
/// (the store's snapshot, the reports behind it): 20–550 µs of an answer in the lab, and
/// the broker's median step from `allocate` to `granted` 0.56 → 0.51 ms when it went.
/// Here every task it wakes goes to the connections' workers, one of which takes it at once.
/// Tasks it spawns itself (the Slurm pilots' commands) run under its runtime, between its
/// events.
fn on_a_thread_of_its_own<F>(core: F) -> anyhow::Result<tokio::sync::oneshot::Receiver<F::Output>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the core's runtime")?;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("rb-core".into())
        .spawn(move || {
            let _ = done_tx.send(runtime.block_on(core));
        })
        .context("cannot start the core's thread")?;
    Ok(done_rx)
}

/// The `[web]` listener, bound, and what it answers from (the token made if missing).
async fn bind_web(
    lab: &LabConfig,
) -> anyhow::Result<Option<(TcpListener, config::JobAccess, Option<String>)>> {
    let Some(w) = &lab.web else {
        return Ok(None);
    };
    let listener = TcpListener::bind(w.listen)
        .await
        .with_context(|| format!("cannot listen on {} (web.listen)", w.listen))?;
    let token = match w.jobs {
        config::JobAccess::Public => None,
        config::JobAccess::Token => Some(
            web::load_or_create_token(&lab.broker.state_dir)
                .context("cannot make STATE_DIR/web-token for [web]")?,
        ),
    };
    info!(listen = %listener.local_addr()?, "web listener (/metrics)");
    Ok(Some((listener, w.jobs, token)))
}

/// The login name of the broker's user (whose jobs are the owner's), else `uid N`.
fn owner_name() -> String {
    let uid = nix::unistd::geteuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {uid}"), |u| u.name)
}

/// The Slurm pilots of `[overflow.slurm]`: their `rb-hostd` is the transport's, and reports
/// to the address the lab's hosts reach the broker at.
fn pilots(lab: &LabConfig, spec: &LaunchSpec, events: core::EventSender) -> Option<pilots::Pilots> {
    let slurm = lab.overflow.clone()?;
    let ip = hosts_reach_broker_at(spec.broker_addr, &lab.hosts).unwrap_or(spec.broker_addr.ip());
    Some(pilots::Pilots::new(
        slurm,
        &spec.hostd_path,
        SocketAddr::new(ip, spec.broker_addr.port()),
        &lab.broker.secret_file,
        lab.broker.reclaim_grace,
        &owner_name(),
        events,
    ))
}

/// The job side, restored from `STATE_DIR/broker.db` when it holds a previous run's state.
fn job_desk(
    lab: &LabConfig,
    spec: &LaunchSpec,
    policy: Arc<policies::Policy>,
) -> anyhow::Result<jobs::JobDesk> {
    let db = lab.broker.state_dir.join("broker.db");
    let (writer, previous) =
        persist::StoreWriter::open(&db).with_context(|| format!("cannot open {}", db.display()))?;
    let now = std::time::Instant::now();
    let config = alloc::AllocConfig {
        reclaim_grace: lab.broker.reclaim_grace,
        ..alloc::AllocConfig::default()
    };
    let allocator = match previous {
        Some(snap) => {
            let (a, dropped) = alloc::Allocator::restore(snap, config, now);
            for why in dropped {
                tracing::warn!(%why, "dropped an inconsistent record while restoring state");
            }
            info!(jobs = a.jobs(now).len(), "restored broker state");
            a
        }
        None => alloc::Allocator::with_config(config),
    };
    let mut allocator = allocator.with_policy(policy);
    let (unix, offset) = wall_clock();
    allocator.set_wall_clock(now, unix, offset);
    let desk = jobs::JobDesk::new(
        allocator,
        spec.remote_shell(),
        lab.broker.transport.name(),
        &lab.broker.secret_file,
    )
    .with_hosts_reach_broker_at(hosts_reach_broker_at(spec.broker_addr, &lab.hosts));
    let desk = match trace_sink(lab, now)? {
        Some(sink) => desk.with_trace(sink),
        None => desk,
    };
    Ok(desk.with_store(writer, now))
}

/// The decision trace of this run (`STATE_DIR/trace/`), unless `trace_files_kept = 0`. Its
/// clock starts at `now`, the allocator's wall-clock epoch.
fn trace_sink(
    lab: &LabConfig,
    now: std::time::Instant,
) -> anyhow::Result<Option<trace::TraceSink>> {
    if lab.broker.trace_files_kept == 0 {
        return Ok(None);
    }
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let clock = allocation::TraceClock::new(now, unix_ms);
    let run = format!("{unix_ms}-{}", std::process::id());
    let sink = trace::TraceSink::spawn(
        trace::trace_dir(&lab.broker.state_dir),
        lab.broker.trace_file_max_bytes,
        lab.broker.trace_files_kept,
        clock,
        run,
    )
    .context("cannot start the decision-trace writer thread")?;
    Ok(Some(sink))
}

/// The broker's IP as its hosts reach it: the bound address, or for a wildcard (allowed
/// with the manual transport only) this machine's address on the route to the first host
/// whose address resolves; `None` when none does.
fn hosts_reach_broker_at(listen: SocketAddr, hosts: &[config::HostEntry]) -> Option<IpAddr> {
    use std::net::ToSocketAddrs;
    if !listen.ip().is_unspecified() {
        return Some(listen.ip());
    }
    hosts.iter().find_map(|h| {
        let peer = (h.address.as_str(), 0).to_socket_addrs().ok()?.next()?;
        proto::route::source_toward(peer.ip()).ok()
    })
}

/// Unix seconds now and the local time zone's offset from UTC (for the policy's `now`).
fn wall_clock() -> (i64, i64) {
    let unix = localtime::unix_now();
    (unix, localtime::utc_offset_s(unix).unwrap_or(0))
}

/// Creates the state dir (mode 0700) if missing and refuses one another user owns or
/// group/others can write ([`privdir::check_configured`]): it holds the control socket,
/// the database and, for the embedded lab, the secret.
fn prepare_state_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create state dir {}", dir.display()))?;
    privdir::check_configured(dir)?;
    privdir::ensure_dir(&dir.join("logs"))?;
    Ok(())
}

/// Refuses to steal the control socket a live broker still answers on; removes a stale one.
async fn refuse_a_live_broker(path: &Path) -> anyhow::Result<()> {
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            bail!("another broker is running with this state dir (it answers on {})\nhelp: stop it with `rb shutdown`, or use another broker.state_dir", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    Ok(())
}

/// Binds the control socket at `path` (see [`refuse_a_live_broker`] first).
///
/// The socket is bound and listening under a temporary name, made 0600, and only then
/// renamed to `path`: whoever sees `path` can connect. (Bound in place, the file exists
/// between `bind` and `listen`, and a client that saw it then was refused: an agent
/// started right after the broker failed so under load.)
fn bind_control_socket(path: &Path) -> anyhow::Result<UnixListener> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".binding");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let listener =
        UnixListener::bind(&tmp).with_context(|| format!("cannot bind {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))?;
    Ok(listener)
}

fn write_info(
    state_dir: &Path,
    listen: SocketAddr,
    socket: &Path,
    web: Option<SocketAddr>,
) -> anyhow::Result<()> {
    let info = BrokerInfo {
        pid: std::process::id(),
        listen,
        control_socket: socket.to_path_buf(),
        web,
    };
    let tmp = state_dir.join("broker.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&info)?)?;
    std::fs::rename(&tmp, info_path(state_dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(address: &str) -> config::HostEntry {
        config::HostEntry {
            name: "node02".into(),
            address: address.into(),
            labels: Vec::new(),
            owner: None,
        }
    }

    /// Whoever sees the control socket's path can connect: a client polling for the file
    /// (as tests and scripts do after starting the broker) is never refused. Bound in
    /// place, the file existed before `listen`, and such a client was refused under load.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_control_socket_appears_only_once_it_accepts() {
        let dir = tempfile::tempdir().expect("tempdir");
        for round in 0..500 {
            let path = dir.path().join(format!("broker-{round}.sock"));
            let watched = path.clone();
            let client = std::thread::spawn(move || {
                while !watched.exists() {
                    std::hint::spin_loop();
                }
                std::os::unix::net::UnixStream::connect(&watched)
            });
            let listener = bind_control_socket(&path).expect("bind");
            let connected = client.join().expect("client thread");
            assert!(connected.is_ok(), "round {round}: {connected:?}");
            let mode = std::fs::metadata(&path)
                .expect("socket")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "round {round}");
            drop(listener);
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".binding"))
            .collect();
        assert!(left.is_empty(), "no temporary name left: {left:?}");
    }

    #[test]
    fn agents_are_told_the_listen_ip_or_for_a_wildcard_the_route_to_the_hosts() {
        let listen: SocketAddr = "10.77.0.1:7700".parse().expect("addr");
        assert_eq!(
            hosts_reach_broker_at(listen, &[]),
            Some(listen.ip()),
            "a specific listen address is what the hosts use"
        );
        let wildcard: SocketAddr = "0.0.0.0:7700".parse().expect("addr");
        assert_eq!(
            hosts_reach_broker_at(
                wildcard,
                &[host("no host by this name.invalid"), host("127.0.0.1")]
            ),
            Some(IpAddr::from([127, 0, 0, 1])),
            "the first host that resolves gives the route"
        );
        assert_eq!(hosts_reach_broker_at(wildcard, &[]), None);
    }
}
