//! The one error type of the lab harness.
//!
//! Every variant says what failed (the command line, the path, the host), what the system
//! said (stderr, the I/O error) and what to do about it (a `help:` line), because these
//! errors end up in front of a person: a failing test or `rb lab up`.

use std::path::PathBuf;
use std::time::Duration;

/// What can go wrong while building, using or tearing down a lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The caller is not root; namespaces, veths and bridges need root.
    #[error("rb lab needs root to create network namespaces; you are uid {uid}\nhelp: run it as root (e.g. `sudo rb lab up`); `cargo test` skips the lab tier when not root")]
    NotRoot {
        /// The effective uid of the caller.
        uid: u32,
    },

    /// A command ran but failed.
    #[error("command `{command}` failed ({status}): {stderr}\nhelp: {help}")]
    Command {
        /// The command line, as one string.
        command: String,
        /// Its exit status.
        status: String,
        /// Its standard error, trimmed.
        stderr: String,
        /// What to do about it.
        help: String,
    },

    /// A command could not be started at all.
    #[error("cannot run `{command}`: {source}\nhelp: {help}")]
    Spawn {
        /// The command line, as one string.
        command: String,
        /// Why it did not start.
        source: std::io::Error,
        /// What to do about it.
        help: String,
    },

    /// Reading or writing a file or directory failed.
    #[error("{action} {}: {source}\nhelp: {help}", path.display())]
    Io {
        /// What was being done ("write", "create directory", ...).
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
        /// What to do about it.
        help: String,
    },

    /// The `rb-lab-init` binary was not found.
    #[error("cannot find the lab init binary rb-lab-init (looked at: {searched})\nhelp: build it with `cargo build -p lab --bin rb-lab-init` (it is built next to the test binaries by `cargo test -p lab`), or point RB_LAB_INIT at it")]
    InitMissing {
        /// The places looked at, comma separated.
        searched: String,
    },

    /// Every 10.77.S.0/24 subnet is taken.
    #[error("no free lab subnet 10.77.S.0/24 (S = 1..=254 all in use)\nhelp: `rb lab status` lists them; tear down yours with `rb lab down`, every lab with `rb lab down --all`")]
    NoSubnet,

    /// An argument (lab specification, host command, tty name, ...) is not valid.
    #[error("invalid input: {reason}\nhelp: {help}")]
    InvalidInput {
        /// What is wrong.
        reason: String,
        /// What is allowed.
        help: String,
    },

    /// No host of that name in this lab.
    #[error("no host `{host}` in this lab (hosts: {known})\nhelp: use one of the listed names")]
    UnknownHost {
        /// The name asked for.
        host: String,
        /// The names that exist.
        known: String,
    },

    /// The host is not running (crashed or never booted).
    #[error("host {host} is not running\nhelp: start it with `boot` (`rb lab boot {host}`)")]
    HostDown {
        /// The host.
        host: String,
    },

    /// The host is already running.
    #[error("host {host} is already running\nhelp: crash it first (`rb lab crash {host}`) to boot it again")]
    HostRunning {
        /// The host.
        host: String,
    },

    /// A condition did not become true in time.
    #[error("timed out after {waited:?} waiting for {what}\nhelp: {help}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long it was awaited.
        waited: Duration,
        /// What to look at.
        help: String,
    },

    /// A lab manifest is missing or unreadable.
    #[error("bad lab manifest {}: {reason}\nhelp: {help}", path.display())]
    Manifest {
        /// The manifest path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// What to do about it.
        help: String,
    },

    /// Teardown left things behind.
    #[error("teardown of {} was incomplete: {}\nhelp: run `rb lab down {}` again; remaining pieces are listed in its manifest", dir.display(), errors.join("; "), dir.display())]
    Teardown {
        /// The lab directory.
        dir: PathBuf,
        /// Every step that failed.
        errors: Vec<String>,
    },
}

impl LabError {
    /// An [`LabError::Io`] with a help line.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        help: impl Into<String>,
    ) -> impl FnOnce(std::io::Error) -> LabError {
        let path = path.into();
        let help = help.into();
        move |source| LabError::Io {
            action,
            path,
            source,
            help,
        }
    }
}
