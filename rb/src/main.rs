//! `rb`: flags ([`rb::cli`]) → one subcommand → exit code (64 bad flags, configuration or
//! input; 77 permission denied; 141 standard output's reader gone; 1 other errors). Answers
//! go to standard output through `startup::out!`/`outln!`, whose failure is returned, not a
//! panic as `println!`'s.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use proto::msg::{Request, Response};
use rb::{
    cli::{self, BrokerFlags, Cli, Cmd, EXIT_PERMISSION, EXIT_USAGE},
    client, demo, init, table,
};

fn main() -> ExitCode {
    let cli: Cli = startup::start("warn");
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            // The reader of standard output went away (`rb status | head -1`): nothing to say.
            if let Some(gone) = e
                .chain()
                .find_map(|c| c.downcast_ref::<startup::OutputError>())
            {
                return gone.exit("rb");
            }
            eprintln!("rb: error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// 64 for bad flags or lab file; 77 for permission denied, and when a directory or socket
/// is not this user's alone; else 1.
fn exit_code(e: &anyhow::Error) -> u8 {
    if let Some(code) = e.chain().find_map(proto::credential::key_file_exit_code) {
        return code;
    }
    let usage = e.downcast_ref::<cli::UsageError>().is_some()
        || e.downcast_ref::<client::ResolveError>()
            .is_some_and(client::ResolveError::is_usage);
    let denied = e.chain().any(|cause| {
        cause.is::<privdir::Error>()
            || cause.is::<proto::peercred::PeerError>()
            || cause
                .downcast_ref::<client::BrokerError>()
                .is_some_and(client::BrokerError::is_permission)
            || cause
                .downcast_ref::<proto::handshake::HandshakeError>()
                .is_some_and(proto::credential::is_auth_refusal)
            || cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
    });
    match (usage, denied) {
        (true, _) => EXIT_USAGE,
        (false, true) => EXIT_PERMISSION,
        _ => 1,
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    cli.check_flags()?;
    let before = &cli.broker;
    let env = |key: &str| std::env::var(key).ok();
    let env_lab = || env("RB_LAB").filter(|v| !v.is_empty()).map(PathBuf::from);
    let broker = |flags: &BrokerFlags| target(&flags.or(before, env));
    match &cli.command {
        Cmd::Init {
            force,
            lab,
            secret_file,
        } => {
            let lab = lab.clone().or_else(|| before.lab.clone()).or_else(env_lab);
            let secret = secret_file.as_deref().or(before.secret_file.as_deref());
            cmd_init(lab.as_deref(), secret, *force)
        }
        Cmd::Check { file, lab, probe } => {
            let file = file
                .clone()
                .or_else(|| lab.clone())
                .or_else(|| before.lab.clone())
                .or_else(env_lab);
            cmd_check(file.as_deref(), *probe)
        }
        Cmd::Status { json, broker: b } => block_on(cmd_status(broker(b)?, *json)),
        Cmd::Shutdown { broker: b } => block_on(cmd_shutdown(broker(b)?)),
        Cmd::Jobs { json, broker: b } => block_on(cmd_jobs(broker(b)?, *json)),
        Cmd::Release {
            host,
            grace_s,
            broker: b,
        } => {
            let grace_ms = cli::grace_ms(*grace_s)?;
            let host = host.clone();
            block_on(cmd_admin(broker(b)?, Request::Release { host, grace_ms }))
        }
        Cmd::Drain { host, broker: b } => {
            let host = host.clone();
            block_on(cmd_admin(broker(b)?, Request::Drain { host }))
        }
        Cmd::Resume { host, broker: b } => {
            let host = host.clone();
            block_on(cmd_admin(broker(b)?, Request::Resume { host }))
        }
        Cmd::Lab(cmd) => lab::cli::run(cmd.clone()).map(ExitCode::from),
        Cmd::Report {
            trace_dir,
            svg,
            policy,
            buckets,
            max_hosts,
            title,
        } => Ok(rb::report::run(&rb::report::ReportArgs {
            trace_dir,
            svg,
            policy: policy.as_deref(),
            buckets: usize::from(*buckets),
            max_hosts: *max_hosts,
            title: title.as_deref(),
            utc_offset_s: local_utc_offset_s(),
        })),
        Cmd::Policy(cmd) => dispatch_policy(cmd, &broker),
        Cmd::User(cmd) => dispatch_user(cmd, &broker),
        Cmd::Rsl(cmd) => {
            let code = rsl::cli::run(cmd, &mut std::io::stdout(), &mut std::io::stderr());
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
        }
        Cmd::Demo {
            hosts,
            keep,
            state_dir,
        } => {
            let dir = state_dir.clone().unwrap_or_else(demo::default_state_dir);
            block_on(cmd_demo(*hosts, dir, *keep))
        }
    }
}

/// How a subcommand finds the broker it talks to, from its own flags.
type BrokerOf<'a> = dyn Fn(&BrokerFlags) -> anyhow::Result<client::Target> + 'a;

/// `rb policy …`.
fn dispatch_policy(cmd: &cli::PolicyCommand, broker: &BrokerOf) -> anyhow::Result<ExitCode> {
    match cmd {
        cli::PolicyCommand::Check { file } => cmd_policy_check(file),
        cli::PolicyCommand::Replay { trace_dir, policy } => {
            Ok(rb::replay::run(trace_dir, policy, local_utc_offset_s()))
        }
        cli::PolicyCommand::Show { json, broker: b } => {
            let offset = local_utc_offset_s();
            block_on(async { rb::policy::show(&broker(b)?, *json, offset).await })
        }
        cli::PolicyCommand::Reload { broker: b } => {
            block_on(async { rb::policy::reload(&broker(b)?).await })
        }
        cli::PolicyCommand::Explain {
            host,
            job,
            json,
            broker: b,
        } => {
            let host = host.clone();
            block_on(async { rb::policy::explain(&broker(b)?, host, *job, *json).await })
        }
    }
}

/// `rb user …`.
fn dispatch_user(cmd: &cli::UserCommand, broker: &BrokerOf) -> anyhow::Result<ExitCode> {
    match cmd {
        cli::UserCommand::Add {
            name,
            out,
            broker: b,
        } => {
            let out = match out {
                Some(path) => Some(std::path::absolute(path)?.display().to_string()),
                None => None,
            };
            let req = Request::UserAdd {
                name: name.clone(),
                out,
            };
            block_on(cmd_user_add(broker(b)?, req))
        }
        cli::UserCommand::List { json, broker: b } => block_on(cmd_user_list(broker(b)?, *json)),
        cli::UserCommand::Revoke { name, broker: b } => {
            let name = name.clone();
            block_on(cmd_admin(broker(b)?, Request::UserRevoke { name }))
        }
    }
}

fn block_on<F: std::future::Future<Output = anyhow::Result<ExitCode>>>(
    f: F,
) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

fn cmd_init(lab: Option<&Path>, secret: Option<&Path>, force: bool) -> anyhow::Result<ExitCode> {
    let lab = lab.map_or_else(config::default_lab_path, Path::to_path_buf);
    let secret = secret.map_or_else(config::default_secret_path, Path::to_path_buf);
    let done = init::init(&secret, &lab, force)?;
    let verb = |created| if created { "created" } else { "kept existing" };
    startup::outln!(
        "{} secret    {}",
        verb(done.secret_created),
        done.secret.display()
    )?;
    startup::outln!(
        "{} lab file  {}",
        verb(done.lab_created),
        done.lab.display()
    )?;
    startup::outln!(
        "next: rb check && rb-broker --lab {}   (then: rb status)",
        done.lab.display()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `rb policy check FILE`: the summary line, or the policy engine's error and its exit code.
fn cmd_policy_check(file: &Path) -> anyhow::Result<ExitCode> {
    match policies::check_file(file) {
        Ok(summary) => {
            startup::outln!("{summary}")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1)))
        }
    }
}

/// `rb check`: the lab file as `rb-broker` will load it, and what the broker checks at start
/// (the secret file); warnings go to stderr and do not fail.
fn cmd_check(file: Option<&Path>, probe: bool) -> anyhow::Result<ExitCode> {
    let path = file.map_or_else(config::default_lab_path, Path::to_path_buf);
    let checked = config::LabConfig::load_checked(&path).map_err(Box::new);
    let checked = checked.and_then(|lab| match lab.check_has_hosts() {
        Ok(()) => Ok(lab),
        Err(e) => Err(Box::new(e)),
    });
    let checked = checked.and_then(|lab| match lab.check_secret_file() {
        Ok(()) => Ok(lab),
        Err(e) => Err(Box::new(e)),
    });
    let lab = match checked {
        Ok(lab) => lab,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    for warning in lab.warnings() {
        eprintln!("{warning}");
    }
    // The policy the broker will load (`[broker] policy`): its own FILE:LINE:COL error.
    let policy = match policies::Policy::from_setting(&lab.broker.policy, &lab.policy_base()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {}: broker.policy: {e}", path.display());
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    startup::outln!("policy {}", policy.summary())?;
    startup::outln!(
        "{}: ok: {} hosts, transport {}, listen {}",
        path.display(),
        lab.hosts.len(),
        lab.broker.transport.name(),
        lab.broker.listen
    )?;
    if let Some(slurm) = &lab.overflow {
        startup::outln!(
            "overflow: slurm: up to {} node(s), lease {} min, idle exit {} s",
            slurm.max_nodes,
            slurm.lease_minutes(),
            slurm.idle_exit.as_secs_f64()
        )?;
    }
    if probe {
        return cmd_probe(&path, &lab);
    }
    Ok(ExitCode::SUCCESS)
}

/// `rb check --probe`: the Slurm part (exit 69, EX_UNAVAILABLE, when Slurm does not answer).
fn cmd_probe(path: &Path, lab: &config::LabConfig) -> anyhow::Result<ExitCode> {
    let Some(slurm) = &lab.overflow else {
        startup::outln!(
            "probe: {} has no [overflow.slurm]: nothing to ask",
            path.display()
        )?;
        return Ok(ExitCode::SUCCESS);
    };
    match rb::probe::probe(slurm, lab.broker.reclaim_grace) {
        rb::probe::Probe::Answered {
            jobs,
            pilots,
            test_only,
        } => {
            startup::outln!(
                "probe: slurm: ok: squeue answered: {jobs} job(s) queued, {pilots} of them pilots"
            )?;
            startup::outln!("probe: slurm: a pilot (sbatch --test-only): {test_only}")?;
            Ok(ExitCode::SUCCESS)
        }
        rb::probe::Probe::Failed { what, help } => {
            eprintln!(
                "error: {}: overflow.slurm: {what}\nhelp: {help}",
                path.display()
            );
            Ok(ExitCode::from(EXIT_UNAVAILABLE))
        }
    }
}

/// Exit status of `rb check --probe` when the cluster does not answer (sysexits'
/// EX_UNAVAILABLE).
const EXIT_UNAVAILABLE: u8 = 69;

fn target(flags: &BrokerFlags) -> anyhow::Result<client::Target> {
    let defaults = client::Defaults {
        lab_file: config::default_lab_path(),
        demo_sockets: vec![
            demo::default_state_dir().join("broker.sock"),
            privdir::embedded_state_dir().join("broker.sock"),
        ],
    };
    let resolved = client::resolve(
        flags.broker.as_deref(),
        flags.lab.as_deref(),
        flags.secret_file.as_deref(),
        &defaults,
    )?;
    if let Some(note) = resolved.note {
        eprintln!("rb: note: {note}");
    }
    let mut target = resolved.target;
    if let client::Target::Tcp { credential, .. } = &mut target {
        credential.clone_from(&flags.credential);
    }
    Ok(target)
}

/// `rb user add`: what to do with the file, then its path as the last line.
async fn cmd_user_add(target: client::Target, req: Request) -> anyhow::Result<ExitCode> {
    match client::request(&target, req).await? {
        Response::UserAdded { name, path } => {
            startup::outln!(
                "credential of user {name} written (mode 0600) to the broker's machine;"
            )?;
            startup::outln!("{name} keeps it as ~/.config/rb/credential (mode 0600):")?;
            startup::outln!("{path}")?;
        }
        other => anyhow::bail!("unexpected answer from broker: {other:?}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `rb user list`: name, created, last seen (local time).
async fn cmd_user_list(target: client::Target, json: bool) -> anyhow::Result<ExitCode> {
    let users = match client::request(&target, Request::UserList).await? {
        Response::Users { users } => users,
        other => anyhow::bail!("unexpected answer from broker: {other:?}"),
    };
    if json {
        startup::outln!("{}", serde_json::to_string_pretty(&users)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let offset = local_utc_offset_s();
    let rows: Vec<Vec<String>> = users
        .iter()
        .map(|u| {
            let seen = u
                .last_seen_unix
                .map_or("never".into(), |t| table::clock(t, offset));
            vec![u.name.clone(), table::clock(u.created_unix, offset), seen]
        })
        .collect();
    startup::out!(
        "{}",
        table::aligned(&["USER", "CREATED", "LAST SEEN"], &rows)
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `rb status [--json]`. With `--json`: indented on a terminal; piped, the broker's rows as
/// it sent them, on one line (not parsed: 6 MB at 10k hosts).
async fn cmd_status(target: client::Target, json: bool) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    if json && !std::io::stdout().is_terminal() {
        let rows = client::status_json(&target).await?;
        startup::output::print(rows.as_bytes())?;
        return Ok(ExitCode::SUCCESS);
    }
    let hosts = client::status(&target).await?;
    if json {
        startup::outln!("{}", serde_json::to_string_pretty(&hosts)?)?;
    } else {
        startup::out!("{}", table::render(&hosts))?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn cmd_shutdown(target: client::Target) -> anyhow::Result<ExitCode> {
    client::request(&target, proto::msg::Request::Shutdown).await?;
    startup::outln!("broker stopping")?;
    Ok(ExitCode::SUCCESS)
}

async fn cmd_jobs(target: client::Target, json: bool) -> anyhow::Result<ExitCode> {
    let jobs = match client::request(&target, Request::Jobs).await? {
        Response::Jobs { jobs } => jobs,
        other => anyhow::bail!("unexpected answer from broker: {other:?}"),
    };
    if json {
        startup::outln!("{}", serde_json::to_string_pretty(&jobs)?)?;
    } else {
        startup::out!("{}", table::render_jobs(&jobs, local_utc_offset_s()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The local time zone's offset from UTC now, in seconds (0 when it cannot be read).
fn local_utc_offset_s() -> i64 {
    localtime::utc_offset_now_s()
}

async fn cmd_admin(target: client::Target, req: Request) -> anyhow::Result<ExitCode> {
    match client::request(&target, req).await? {
        Response::Done { message } => startup::outln!("{message}")?,
        Response::Ok => startup::outln!("ok")?,
        other => anyhow::bail!("unexpected answer from broker: {other:?}"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn cmd_demo(hosts: usize, dir: PathBuf, keep: bool) -> anyhow::Result<ExitCode> {
    startup::outln!(
        "starting an embedded broker with {hosts} virtual hosts (state dir {}, log {})…",
        dir.display(),
        demo::log_path(&dir).display()
    )?;
    let rows = demo::run(hosts, &dir, keep, Duration::from_secs(30)).await?;
    startup::out!("{}", table::render(&rows))?;
    if keep {
        startup::outln!(
            "\nthe broker keeps running: rb --broker {}/broker.sock status",
            dir.display()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
