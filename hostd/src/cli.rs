//! The `rb-hostd` command line (its own `main` parses it; `rb-docgen` renders its man page
//! and completions from it).

use std::path::PathBuf;

use clap::Parser;

/// ResourceBroker host daemon: reports this machine's load, users and idleness to the broker.
#[derive(Debug, Parser)]
#[command(name = "rb-hostd", version)]
pub struct Args {
    /// Broker address (IP:port) to report to.
    #[arg(long, required_unless_present = "once")]
    pub broker: Option<String>,
    /// This machine's name in the lab file.
    #[arg(long, required_unless_present = "once")]
    pub host: Option<String>,
    /// The lab secret file (mode 0600). `~/` is expanded on this machine.
    #[arg(long, default_value = "~/.config/rb/secret")]
    pub secret_file: String,
    /// Report interval in milliseconds (default: what the broker says).
    #[arg(long)]
    pub interval_ms: Option<u64>,
    /// Exit when stdin reaches end-of-file (set by the broker's transports).
    #[arg(long)]
    pub lifeline_stdin: bool,
    /// Directory for the per-host lock that keeps one daemon per host (default
    /// $XDG_RUNTIME_DIR/rb, else /tmp/rb-<uid>); created 0700, refused if another user owns it.
    #[allow(rustdoc::invalid_html_tags)] // --help text: `<uid>` is shown as written
    #[arg(long)]
    pub lock_dir: Option<PathBuf>,
    /// Sensor-overlay file (test and demo facility, see hostd/OVERLAY.md).
    #[arg(long, env = "RB_SENSOR_OVERLAY")]
    pub overlay: Option<PathBuf>,
    /// utmp file to read logins from.
    #[arg(long, default_value = "/run/utmp")]
    pub utmp: PathBuf,
    /// Glob of an input device whose access time is the last console input (repeatable;
    /// replaces the defaults).
    #[arg(long = "input-device")]
    pub input_devices: Vec<String>,
    /// Print one report as JSON on stdout, then a summary of the login sessions with the
    /// source of each idle time on stderr, and exit.
    #[arg(long)]
    pub once: bool,
    /// Do not read logind's sessions over the system bus (idle times then rest on utmp and
    /// the console only).
    #[arg(long)]
    pub no_logind: bool,
    /// Run as a Slurm pilot's daemon in this Slurm job (the pilot script passes
    /// `$SLURM_JOB_ID`): the broker reads the lease's end from Slurm. SIGUSR1 (Slurm's lease
    /// warning) and SIGTERM (Slurm's notice of preemption or scancel) tell the broker that
    /// the lease ends; the daemon then runs on until Slurm's SIGKILL (SIGINT stops it).
    #[arg(long, value_name = "JOB_ID")]
    pub slurm_job: Option<String>,
}
