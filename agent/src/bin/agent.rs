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
            std::process::exit(1);
        }
    }
}
