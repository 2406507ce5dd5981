//! The agent's life: register the job, run the app with the shim and the job's JEL pool
//! (`RB_JEL`) in its environment, serve shims and subagents, and hand everything that happens to the job to the agent core
//! ([`crate::core`]), whose decisions `shell` performs; the app's exit status is passed
//! through (128+signal when killed).

use std::{os::unix::fs::PermissionsExt, path::PathBuf, process::Stdio, sync::Arc, time::Duration};

use anyhow::{bail, Context};
use jel::host::{HostConfig, PoolHost, RemoteOut};
use proto::msg::JobRegistration;
use tokio::{
    net::{TcpListener, UnixListener},
    process::{Child, Command},
    sync::mpsc,
};
use tracing::{info, warn};

mod shell;

/// The job's JEL socket, in its private directory.
pub const JEL_SOCKET: &str = "jel.sock";

use crate::{
    cli::{AgentConfig, Preload},
    core::{AgentCore, CoreConfig, GrantTemplate, ModuleConfig},
    jobenv::{self, JobEnv},
    jobguard, link,
    listeners::{self, Event},
    module::{self, Runner},
};

/// Runs the job; returns the app's exit code.
pub async fn run(cfg: AgentConfig) -> anyhow::Result<i32> {
    // Before anything else (an embedded broker, a registration): the directory every job
    // and embedded broker of this user lives in must be ours alone, or we run nothing.
    privdir::ensure_root()?;
    // Before any child: whatever the job starts and abandons is reparented to us, not init.
    if let Err(e) = crate::proctree::become_subreaper() {
        warn!(error = %e, "not a child subreaper: a daemon the job starts may outlive it");
    }
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
    let mut env = jobenv::prepare(
        &dir,
        &jobenv::find_shim(),
        job.job,
        &job.remote_shell,
        preload.as_deref(),
    )?;
    // The pool, and what it has for members on other hosts (their subagents relay them).
    let pool = host_pool(cfg, job.front_end.as_deref(), &mut env)?;
    let shims = UnixListener::bind(&env.socket)
        .with_context(|| format!("cannot bind {}", env.socket.display()))?;
    std::fs::set_permissions(&env.socket, std::fs::Permissions::from_mode(0o600))?;
    let sub_ip = link::advertised_ip(&job, local_ip);
    let subs = TcpListener::bind((sub_ip, 0))
        .await
        .context("cannot open the subagent port")?;
    let sub_addr = subs.local_addr()?.to_string();
    info!(%sub_addr, "subagents reach the agent here");
    // Subagents prove the job's own key, not the lab secret (crate::jobkey).
    let job_key = crate::jobkey::JobKey::create(job.job, &env.dir)?;
    let (secret_file, secret) = (
        job_key.path().to_path_buf(),
        Arc::new(job_key.secret().clone()),
    );
    let (events_tx, events) = mpsc::channel(256);
    let taken_back = listeners::TakenBackBook::default();
    let shim_task = tokio::spawn(listeners::serve_shims(
        shims,
        events_tx.clone(),
        taken_back.clone(),
    ));
    let module = cfg
        .module
        .as_deref()
        .map(|name| start_module(name, cfg.module_timeout, &env, events_tx.clone()));
    let (module, runner) = module.unzip();
    let sub_task = tokio::spawn(listeners::serve_subagents(subs, secret, events_tx.clone()));
    let tag = jobguard::job_tag();
    let masters = crate::mux::Masters::prepare(&env.dir, &job.remote_shell)?;
    let child = spawn_app(&cfg.app, &env, &tag)?;
    let app = child.id();
    // Held until the job is over (the end of this function) or this process dies, however:
    // then the guardian ends whatever the app left running.
    let guard = jobguard::guard_app(app, &tag, Duration::from_millis(cfg.grace_ms));
    let (reaper, stop_reaper) = start_reaper(guard.as_ref());
    let core = AgentCore::new(CoreConfig {
        grace_ms: cfg.grace_ms,
        grant: GrantTemplate {
            subagent_program: link::sibling("rb-subagent"),
            sub_addr,
            secret_file,
            preload,
            lab_mark: job.lab_mark.clone(),
            remote_shell: job.remote_shell.clone(),
            step_times: std::env::var_os(steptimes::ENV_STEP_TIMES)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        },
        module,
        agent_pid: std::process::id(),
    });
    let broker = shell::Broker {
        conn,
        job: job.job,
        target: target.clone(),
        reg,
    };
    let mut shell = shell::Shell::new(
        core,
        broker,
        runner,
        (
            events_tx,
            taken_back,
            proto::taken_back::dir_beside(&env.socket),
        ),
        env.hosts_file.clone(),
        pool,
        masters.clone(),
    );
    let code = shell.drive(child, events).await;
    shim_task.abort();
    sub_task.abort();
    // The front end's JEL members told `terminated` end on their own, given a moment.
    crate::reaper::members_end(shell.members_told(), crate::reaper::MEMBERS_END_WAIT).await;
    // Nothing of the job outlives it: the masters first (a clean goodbye to each host),
    // then everything still below the agent, however it left the app's group and tag.
    masters.close_all().await;
    let watch = crate::reaper::job_watch(app.map_or(0, |p| p as i32), &tag, app);
    let left = crate::reaper::end_job_processes(watch, Duration::from_millis(cfg.grace_ms)).await;
    if left > 0 {
        info!(
            processes = left,
            "ended what the job left running on this machine"
        );
    }
    let _ = stop_reaper.send(());
    let _ = reaper.await;
    drop(guard);
    let _ = std::fs::remove_dir_all(&env.dir);
    code
}

/// Reaps what the job abandons while it runs ([`crate::reaper::serve`]) and tells the
/// job's guardian which of those processes live, so that it ends them should the agent be
/// killed. Stopped by the sender.
fn start_reaper(
    guard: Option<&jobguard::JobGuard>,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let mut pipe = guard.and_then(jobguard::JobGuard::reporter);
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let serve = crate::reaper::serve(move |adopted| {
            tracing::debug!(
                ?adopted,
                "the job's abandoned processes (pid, start) told the guardian"
            );
            if let Some(p) = pipe.as_mut() {
                if jobguard::report_adopted(p, adopted).is_err() {
                    pipe = None;
                }
            }
        });
        tokio::select! {
            _ = serve => {}
            _ = stopped => {}
        }
    });
    (task, stop)
}

/// Hosts the job's JEL pool on `JOBDIR/jel.sock` and names the socket in the job's
/// environment (`RB_JEL`). Its members are on `front_end`, the lab name the broker found for
/// this machine, else on its hostname (an agent outside the lab's hosts). The pool never
/// counts them on a granted host of the same name (`jel::pool::Input::OpenedFrontEnd`).
fn host_pool(
    cfg: &AgentConfig,
    front_end: Option<&str>,
    env: &mut JobEnv,
) -> anyhow::Result<(PoolHost, mpsc::UnboundedReceiver<RemoteOut>)> {
    let socket = env.dir.join(JEL_SOCKET);
    let host = front_end.map_or_else(|| crate::whereami::this_host().hostname, String::from);
    let config = HostConfig {
        front_end: true,
        ..HostConfig::new(&socket, host, cfg.jel.clone())
    };
    let bound = PoolHost::bind(config)?;
    env.vars
        .insert(jel::ENV_JEL.into(), socket.display().to_string());
    Ok(bound)
}

/// A module job's programs (found on the search path) and the runner that runs them with
/// the job's environment, its private directory and the agent's own programs' directory.
fn start_module(
    name: &str,
    timeout: Duration,
    env: &JobEnv,
    events: mpsc::Sender<Event>,
) -> (ModuleConfig, Runner) {
    let programs = module::find(name, &module::default_search_dirs());
    let mut vars = env.vars.clone();
    match module::scratch_dir(&env.dir) {
        Ok(dir) => {
            vars.insert(module::ENV_MODULE_DIR.into(), dir.display().to_string());
        }
        Err(e) => warn!("module {name}: no private directory for its programs: {e:#}"),
    }
    if let Some(dir) = module::agent_bin_dir() {
        vars.insert(module::ENV_BIN_DIR.into(), dir.display().to_string());
    }
    let runner = module::spawn_runner(Arc::new(programs.clone()), vars, events, Event::ModuleDone);
    (ModuleConfig { programs, timeout }, runner)
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
    crate::reaper::spawn_own(|| cmd.spawn(), Child::id)
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
