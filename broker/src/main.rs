//! `rb-broker`: flags → validated lab config → [`broker::run`]. Exit 64 on bad configuration.

use std::process::ExitCode;

use broker::cli::Args;

/// See the note on `tikv-jemallocator` in Cargo.toml: the broker allocates and frees a
/// report's strings for every report of every host.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation (`_RJEM_MALLOC_CONF` in the environment
/// is read after them, so it can override them): one arena, not four per CPU. The broker's
/// threads hand each report's strings from one to another (connection task, core), and
/// with an arena per thread what one frees does not serve the next allocation of another.
/// At 10k hosts the broker's peak RSS went from 105 to 96 MiB (A/B runs of issue 34; the
/// CPU within the noise). Returning dirty pages sooner (`dirty_decay_ms:1000`) took off 3
/// MiB more, but `rb status` answered slower in the one A/B run of it (77 against 56 ms;
/// likely its 5 MB answer's pages faulted in again each time): not taken.
#[used]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: &[u8; 10] = b"narenas:1\0";

/// Bad flags or configuration.
const EXIT_CONFIG: u8 = startup::EXIT_USAGE;

fn main() -> ExitCode {
    let args: Args = startup::start("info");
    let lab = match load_lab(&args) {
        Ok(lab) => {
            for warning in lab.warnings() {
                tracing::warn!("{warning}");
            }
            lab
        }
        Err(e) => {
            eprintln!("rb-broker: error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // Parsed before the runtime starts: CEL parsing never runs on a tokio worker.
    let policy = match policies::Policy::from_setting(&lab.broker.policy, &lab.policy_base()) {
        Ok(p) => std::sync::Arc::new(p),
        Err(e) => {
            eprintln!("rb-broker: error: broker.policy: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    tracing::info!(policy = %policy.source_path().display(), sha256 = policy.sha256(), "policy loaded");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rb-broker: error: cannot start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(broker::run(lab, policy, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rb-broker: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn load_lab(args: &Args) -> Result<config::LabConfig, String> {
    let lab_path = args.lab.clone().or_else(|| {
        let default = config::default_lab_path();
        (!args.embedded && default.exists()).then_some(default)
    });
    match lab_path {
        Some(path) => {
            let lab = config::LabConfig::load_checked(&path).map_err(|e| e.to_string())?;
            lab.check_has_hosts().map_err(|e| e.to_string())?;
            lab.check_secret_file().map_err(|e| e.to_string())?;
            Ok(lab)
        }
        None => {
            let dir = args
                .state_dir
                .clone()
                .unwrap_or_else(broker::embedded::default_state_dir);
            broker::embedded::lab(&dir, args.hosts)
                .map_err(|e| format!("cannot prepare embedded lab in {}: {e}", dir.display()))
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        }
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn every_flag_has_help() {
        let cmd = Args::command();
        let missing: Vec<_> = cmd
            .get_arguments()
            .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
            .filter(|a| a.get_help().is_none())
            .map(|a| a.get_id().to_string())
            .collect();
        assert!(missing.is_empty(), "without help: {missing:?}");
    }
}
