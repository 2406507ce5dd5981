//! `rb-hostd`: flags → validated config → [`hostd::daemon::run`].
//!
//! Normally started by the broker over the lab's transport; can also be run by hand
//! (`--once` prints one report as JSON and exits, handy to see what a machine reports).

use std::{process::ExitCode, time::Duration};

use hostd::cli::Args;
use hostd::{
    daemon::{self, DaemonConfig, Exit, PilotJob},
    sensors::{SensorConfig, Sensors},
};
use tokio::sync::watch;

/// Bad flags.
const EXIT_USAGE: u8 = startup::EXIT_USAGE;

fn main() -> ExitCode {
    let args: Args = startup::start("info");
    if let Some(Err(e)) = args.broker.as_deref().map(check_broker) {
        eprintln!("rb-hostd: error: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    if let Some(Err(e)) = args.slurm_job.as_deref().map(check_slurm_job) {
        eprintln!("rb-hostd: error: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    let sensors = Sensors::new(sensor_config(&args));
    if args.once {
        return print_once(sensors);
    }
    match run(args, sensors) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rb-hostd: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// `--broker` is HOST:PORT (an IP or a name, and a port number): anything else could never
/// be reached, and retrying it for ever would only hide the mistake.
fn check_broker(value: &str) -> Result<(), String> {
    if value.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let ok = value.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.starts_with('-')
            && !host.contains(char::is_whitespace)
            && port.parse::<u16>().is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--broker `{value}` is not HOST:PORT\nhelp: e.g. --broker 10.77.0.1:7700 (the broker's listen address)"
        ))
    }
}

/// `--slurm-job` is a Slurm job id (digits), as `$SLURM_JOB_ID` is in a batch job.
fn check_slurm_job(value: &str) -> Result<(), String> {
    if config::pilot::is_slurm_job_id(value) {
        Ok(())
    } else {
        Err(format!(
            "--slurm-job `{value}` is not a Slurm job id\nhelp: pass $SLURM_JOB_ID from the pilot's batch script (digits only)"
        ))
    }
}

fn sensor_config(args: &Args) -> SensorConfig {
    let mut cfg = SensorConfig {
        utmp_path: args.utmp.clone(),
        overlay_path: args.overlay.clone(),
        logind: !args.no_logind,
        ..SensorConfig::default()
    };
    if !args.input_devices.is_empty() {
        cfg.input_devices = args.input_devices.clone();
    }
    cfg
}

fn print_once(mut sensors: Sensors) -> ExitCode {
    if let Some(watch) = sensors.logind_watch() {
        watch.wait_first(Duration::from_secs(3));
    }
    sensors.sample();
    std::thread::sleep(Duration::from_millis(200));
    let report = sensors.sample();
    match serde_json::to_string_pretty(&report) {
        Ok(text) => {
            if let Err(e) = startup::outln!("{text}") {
                return e.exit("rb-hostd");
            }
            eprint!("{}", hostd::sessions_summary(&report));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rb-hostd: cannot encode report: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(args: Args, sensors: Sensors) -> anyhow::Result<()> {
    let (Some(broker), Some(host)) = (args.broker.clone(), args.host.clone()) else {
        anyhow::bail!("--broker and --host are required");
    };
    let lock_dir = args.lock_dir.clone().unwrap_or_else(privdir::runtime_root);
    if let Some(refused) = privdir::refused_tmp_root() {
        tracing::warn!(
            reason = %refused.to_string().lines().next().unwrap_or_default(),
            using = %privdir::runtime_root().display(),
            "the runtime directory in /tmp is refused; using the private one in the home directory"
        );
    }
    let _lock = daemon::take_over(&lock_dir, &host)
        .map_err(|e| anyhow::anyhow!("cannot take the host lock in {}: {e}", lock_dir.display()))?;
    // A pilot's daemon: Slurm's notices (SIGUSR1, SIGTERM) reach the daemon through `warned`.
    let (pilot, warned) = match args.slurm_job.clone() {
        Some(slurm_job) => {
            let (warned, lease_ending) = watch::channel(false);
            let pilot = PilotJob {
                slurm_job,
                lease_ending,
            };
            (Some(pilot), Some(warned))
        }
        None => (None, None),
    };
    let cfg = DaemonConfig {
        broker,
        host,
        secret_file: config::expand_home(&args.secret_file),
        interval: args.interval_ms.map(Duration::from_millis),
        lifeline_stdin: args.lifeline_stdin,
        pilot,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let exit = runtime.block_on(async move {
        let (stop_tx, stop_rx) = watch::channel(None);
        let stop_on_term = warned.is_none();
        spawn_stop_sources(&cfg, stop_tx, stop_on_term);
        if let Some(warned) = warned {
            spawn_lease_notices(warned)?;
        }
        anyhow::Ok(daemon::run(cfg, sensors, stop_rx).await)
    })?;
    match exit {
        Exit::Requested(reason) => tracing::info!(%reason, "stopping"),
        Exit::LifelineClosed => tracing::info!("lifeline closed; stopping"),
        Exit::Refused(reason) => anyhow::bail!("{reason}"),
    }
    Ok(())
}

/// A pilot's daemon (the pilot job's step, so Slurm signals it): SIGUSR1 (the lease
/// warning before the time limit) and SIGTERM (preemption, at once, or `scancel`) turn
/// `lease_ending` true, once; the broker asks Slurm how long the node has left. Slurm's
/// SIGKILL ends the daemon. Installed before the daemon connects, so an early notice is not
/// the signal's default action (the end of the process).
fn spawn_lease_notices(lease_ending: watch::Sender<bool>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|e| anyhow::anyhow!("cannot handle {name}: {e}"))
    };
    let mut usr1 = listen(SignalKind::user_defined1(), "SIGUSR1")?;
    let mut term = listen(SignalKind::terminate(), "SIGTERM")?;
    tokio::spawn(async move {
        loop {
            let notice = tokio::select! {
                Some(()) = usr1.recv() => "SIGUSR1: Slurm's lease warning",
                Some(()) = term.recv() => "SIGTERM: Slurm takes the node (preemption or scancel)",
                else => return,
            };
            tracing::info!("{notice}; running on until Slurm's SIGKILL");
            // Told once: a second notice (the time limit's SIGTERM after the warning) is no news.
            lease_ending.send_if_modified(|ending| !std::mem::replace(ending, true));
        }
    });
    Ok(())
}

/// Signals and the stdin lifeline both end the daemon through one watch channel. SIGTERM
/// ends it only when `stop_on_term` (not for a pilot's daemon: there it is Slurm's notice).
fn spawn_stop_sources(cfg: &DaemonConfig, stop: watch::Sender<Option<Exit>>, stop_on_term: bool) {
    let stop = std::sync::Arc::new(stop);
    let on_signal = stop.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        let name = tokio::select! {
            Some(()) = term.recv(), if stop_on_term => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        let _ = on_signal.send(Some(Exit::Requested(name.into())));
    });
    if cfg.lifeline_stdin {
        // A plain thread: a blocking wait on stdin costs nothing until the lifeline closes.
        std::thread::spawn(move || {
            let why = wait_for_eof_on_stdin();
            tracing::debug!(%why, "lifeline ended");
            let _ = stop.send(Some(Exit::LifelineClosed));
        });
    }
}

/// Blocks until stdin reports end-of-file or hang-up (data is read and discarded).
fn wait_for_eof_on_stdin() -> String {
    use std::os::fd::AsFd;

    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let stdin = std::io::stdin();
    let mut buf = [0u8; 256];
    loop {
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return format!("poll: {e}"),
            Ok(_) => {}
        }
        match nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&stdin), &mut buf) {
            Ok(0) => return "end of file".into(),
            Ok(_) | Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return format!("read: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn a_broker_that_is_not_host_and_port_is_refused() {
        assert!(check_broker("10.77.0.1:7700").is_ok());
        assert!(check_broker("[::1]:7700").is_ok());
        assert!(check_broker("broker.lab:7700").is_ok());
        for bad in [
            "nonsense",
            "10.77.0.1",
            ":7700",
            "host:port",
            "-oX=y:22",
            "a b:1",
        ] {
            assert!(check_broker(bad).is_err(), "{bad}");
        }
    }

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
