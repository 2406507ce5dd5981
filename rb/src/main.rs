//! `rb`: flags → one subcommand → exit code (64 for bad configuration, 1 for other errors).

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use clap::{Parser, Subcommand};
use proto::msg::{Request, Response};
use rb::{client, demo, init, table};

/// ResourceBroker: hand idle lab machines to adaptive parallel jobs.
#[derive(Debug, Parser)]
#[command(name = "rb", version)]
struct Cli {
    /// Broker to talk to: a control-socket path or IP:port (default: from the lab file).
    #[arg(long, global = true, env = "RB_BROKER")]
    broker: Option<String>,
    /// Lab file (default ~/.config/rb/lab.toml).
    #[arg(long, global = true, env = "RB_LAB")]
    lab: Option<PathBuf>,
    /// Lab secret for TCP connections (default: the lab file's, else ~/.config/rb/secret).
    #[arg(long, global = true)]
    secret_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Create the lab secret and an example lab file (never overwrites without --force).
    Init {
        #[arg(long)]
        force: bool,
    },
    /// Validate a lab file without starting anything (exit 64 when invalid).
    Check { file: Option<PathBuf> },
    /// Show every host: state, allocation (free, held by a job, drained…), load, CPUs, users,
    /// idleness, labels, owner.
    Status {
        /// Machine-readable output: a JSON array of host objects.
        #[arg(long)]
        json: bool,
    },
    /// Stop the broker (local control socket only).
    Shutdown,
    /// Show jobs: id, user, state, start and end times, hosts, and each waiting request's
    /// position, age and why it waits.
    Jobs {
        /// Machine-readable output: a JSON array of job objects.
        #[arg(long)]
        json: bool,
    },
    /// Take HOST back from whatever job holds it (TERM, grace period, then KILL).
    Release {
        host: String,
        /// Grace period in seconds before remaining processes are killed.
        #[arg(long)]
        grace_s: Option<f64>,
    },
    /// Stop granting HOST to jobs (jobs already on it keep it).
    Drain { host: String },
    /// Grant HOST to jobs again.
    Resume { host: String },
    /// Test hosts on this machine (root): network namespaces with their own sshd.
    #[command(subcommand)]
    Lab(lab::cli::LabCommand),
    /// Globus RSL job specifications: check them, turn them into job specs.
    #[command(subcommand)]
    Rsl(rsl::cli::RslCommand),
    /// Run the embedded single-machine lab: start a broker with virtual hosts, show them up.
    Demo {
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        /// Leave the broker running afterwards.
        #[arg(long)]
        keep: bool,
        /// State dir (default /tmp/rb-demo-<uid>).
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
}

const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RB_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rb: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Cmd::Init { force } => cmd_init(cli.lab.as_deref(), cli.secret_file.as_deref(), *force),
        Cmd::Check { file } => Ok(cmd_check(file.as_deref().or(cli.lab.as_deref()))),
        Cmd::Status { json } => block_on(cmd_status(&cli, *json)),
        Cmd::Shutdown => block_on(cmd_shutdown(&cli)),
        Cmd::Jobs { json } => block_on(cmd_jobs(&cli, *json)),
        Cmd::Release { host, grace_s } => {
            let grace_ms = grace_s.map(|g| (g.max(0.0) * 1000.0) as u64);
            block_on(cmd_admin(
                &cli,
                Request::Release {
                    host: host.clone(),
                    grace_ms,
                },
            ))
        }
        Cmd::Drain { host } => block_on(cmd_admin(&cli, Request::Drain { host: host.clone() })),
        Cmd::Resume { host } => block_on(cmd_admin(&cli, Request::Resume { host: host.clone() })),
        Cmd::Lab(cmd) => lab::cli::run(cmd.clone()).map(|()| ExitCode::SUCCESS),
        Cmd::Rsl(cmd) => {
            let code = rsl::cli::run(cmd, &mut std::io::stdout(), &mut std::io::stderr());
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
        }
        Cmd::Demo {
            hosts,
            keep,
            state_dir,
        } => {
            let dir = state_dir.clone().unwrap_or_else(|| {
                PathBuf::from(format!("/tmp/rb-demo-{}", nix::unistd::getuid()))
            });
            block_on(cmd_demo(*hosts, dir, *keep))
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
    println!(
        "{} secret    {}",
        verb(done.secret_created),
        done.secret.display()
    );
    println!(
        "{} lab file  {}",
        verb(done.lab_created),
        done.lab.display()
    );
    println!(
        "next: rb check && rb-broker --lab {}   (then: rb status)",
        done.lab.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn cmd_check(file: Option<&Path>) -> ExitCode {
    let path = file.map_or_else(config::default_lab_path, Path::to_path_buf);
    match config::LabConfig::load(&path) {
        Ok(lab) => {
            println!(
                "{}: ok: {} hosts, transport {}, listen {}",
                path.display(),
                lab.hosts.len(),
                lab.broker.transport.name(),
                lab.broker.listen
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

fn target(cli: &Cli) -> anyhow::Result<client::Target> {
    client::resolve(
        cli.broker.as_deref(),
        cli.lab.as_deref(),
        cli.secret_file.as_deref(),
    )
}

async fn cmd_status(cli: &Cli, json: bool) -> anyhow::Result<ExitCode> {
    let hosts = client::status(&target(cli)?).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&hosts)?);
    } else {
        print!("{}", table::render(&hosts));
    }
    Ok(ExitCode::SUCCESS)
}

async fn cmd_shutdown(cli: &Cli) -> anyhow::Result<ExitCode> {
    client::request(&target(cli)?, proto::msg::Request::Shutdown).await?;
    println!("broker stopping");
    Ok(ExitCode::SUCCESS)
}

async fn cmd_jobs(cli: &Cli, json: bool) -> anyhow::Result<ExitCode> {
    let jobs = match client::request(&target(cli)?, Request::Jobs).await? {
        Response::Jobs { jobs } => jobs,
        other => anyhow::bail!("unexpected answer from broker: {other:?}"),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&jobs)?);
    } else {
        print!("{}", table::render_jobs(&jobs, local_utc_offset_s()));
    }
    Ok(ExitCode::SUCCESS)
}

/// The local time zone's offset from UTC now, in seconds (0 when it cannot be read).
fn local_utc_offset_s() -> i64 {
    let now: libc::time_t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as libc::time_t);
    // SAFETY: `tm` is plain data that localtime_r fills in; both pointers are valid for the
    // call, and localtime_r is the thread-safe variant (no shared static buffer).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let filled = unsafe { libc::localtime_r(&now, &mut tm) };
    if filled.is_null() {
        0
    } else {
        tm.tm_gmtoff
    }
}

async fn cmd_admin(cli: &Cli, req: Request) -> anyhow::Result<ExitCode> {
    match client::request(&target(cli)?, req).await? {
        Response::Done { message } => println!("{message}"),
        Response::Ok => println!("ok"),
        other => anyhow::bail!("unexpected answer from broker: {other:?}"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn cmd_demo(hosts: usize, dir: PathBuf, keep: bool) -> anyhow::Result<ExitCode> {
    println!(
        "starting an embedded broker with {hosts} virtual hosts (state dir {})…",
        dir.display()
    );
    let rows = demo::run(hosts, &dir, keep, Duration::from_secs(30)).await?;
    print!("{}", table::render(&rows));
    if keep {
        println!(
            "\nthe broker keeps running: rb --broker {}/broker.sock status",
            dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
