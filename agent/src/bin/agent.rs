//! `agent [--rsl SPEC] [--] app args…`: flags → [`agent::cli::AgentConfig`] →
//! [`agent::run::run`]; exits with the app's status (128+signal when it was killed).

use clap::Parser;

fn main() {
    let args = agent::cli::Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RB_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cfg = match agent::cli::AgentConfig::from_args(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agent: error: {e:#}");
            std::process::exit(64);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agent: error: {e}");
            std::process::exit(1);
        }
    };
    match runtime.block_on(agent::run::run(cfg)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("agent: error: {e:#}");
            std::process::exit(exit_code(&e));
        }
    }
}

/// 77 (permission) when a directory or socket is not this user's alone (issue 14), else 1.
fn exit_code(e: &anyhow::Error) -> i32 {
    let unsafe_place = |c: &(dyn std::error::Error + 'static)| {
        c.is::<privdir::Error>() || c.is::<proto::peercred::PeerError>()
    };
    if e.chain().any(unsafe_place) {
        77
    } else {
        1
    }
}
