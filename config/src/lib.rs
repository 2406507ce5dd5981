//! The lab file: which hosts the broker manages and how it reaches them.
//!
//! Two stages, as everywhere in ResourceBroker: [`raw`] mirrors the TOML exactly
//! (`deny_unknown_fields`, spans kept), and [`LabConfig`] is the validated result the
//! programs use. Every error names the file, line, column and key, and says how to fix it.
//! Before the typed parse, `keys` finds every unknown key of the file at once; after it,
//! `validate` checks values, names, addresses and duplicates. [`LabConfig::warnings`] and
//! [`LabConfig::check_secret_file`] are what `rb check` and `rb-broker` add at start.
//!
//! ```toml
//! [broker]
//! listen = "10.77.0.1:7700"        # where host daemons, agents and rb connect
//! transport = "ssh"                # ssh | rsh | local | manual
//! state_dir = "/var/tmp/rb-alice"  # database, sockets, logs
//! secret_file = "~/.config/rb/secret"
//! [[host]]
//! name = "node02"
//! address = "10.77.0.2"            # optional, defaults to name
//! labels = ["public"]
//! owner = "alice"                  # set = private machine of that user
//! [overflow.slurm]                 # optional: grow onto a Slurm cluster (see `overflow`)
//! max_nodes = 4
//! [web]                           # optional: /metrics for Prometheus (see `web`)
//! listen = "127.0.0.1:9770"
//! ```

// Config errors are built at most once per load, at start-up: their size does not matter,
// and keeping the fields plain makes them easy to inspect in tests.
#![allow(clippy::result_large_err)]

mod error;
mod keys;
mod labels;
mod overflow;
pub mod pilot;
pub mod raw;
mod statedir;
mod validate;
mod web;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

pub use error::{ConfigError, ConfigWarning};
pub use overflow::{SlurmOverflow, PILOT_JOB_PREFIX};
pub use web::{JobAccess, WebSettings, WEB_TOKEN_FILE};

/// How the broker starts host daemons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `ssh ADDRESS rb-hostd …` (default).
    Ssh,
    /// `rsh ADDRESS rb-hostd …`.
    Rsh,
    /// Virtual hosts: `rb-hostd` runs as a child process on this machine, one per host.
    Local,
    /// The broker starts nothing; daemons are started by someone else and connect in.
    Manual,
}

impl Transport {
    pub const NAMES: &'static [&'static str] = &["ssh", "rsh", "local", "manual"];

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "ssh" => Some(Self::Ssh),
            "rsh" => Some(Self::Rsh),
            "local" => Some(Self::Local),
            "manual" => Some(Self::Manual),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Ssh => "ssh",
            Self::Rsh => "rsh",
            Self::Local => "local",
            Self::Manual => "manual",
        }
    }
}

/// Validated `[broker]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerSettings {
    pub listen: SocketAddr,
    pub transport: Transport,
    pub state_dir: PathBuf,
    pub secret_file: PathBuf,
    /// How often host daemons report.
    pub report_interval: Duration,
    /// Silence after which a host is marked down and its daemon restarted.
    pub down_after: Duration,
    /// Upper bound of the restart backoff.
    pub restart_backoff_max: Duration,
    /// Path of `rb-hostd` on the hosts; `None` = next to the broker's own executable.
    pub hostd_path: Option<PathBuf>,
    /// Remote-shell command used by the ssh transport (program and leading arguments).
    pub ssh_command: Vec<String>,
    /// Remote-shell command used by the rsh transport.
    pub rsh_command: Vec<String>,
    /// Remote shell that jobs' shims use to reach allocated hosts, when it differs from the
    /// transport's (e.g. daemons over ssh, jobs over rsh); `None` = the transport's.
    pub job_shell: Option<Vec<String>>,
    /// How long a job's processes get between SIGTERM and SIGKILL when the policy takes a
    /// host back (another job's turn, an owner returns).
    pub reclaim_grace: Duration,
    /// The allocation policy: a shipped name (`paper`, the default) or a path, relative to
    /// the lab file's directory unless absolute. Resolved and checked by the `policies`
    /// crate (`Policy::from_setting(policy, LabConfig::policy_base())`).
    pub policy: String,
    /// The decision trace (`STATE_DIR/trace/`, for `rb policy replay`): a file is rotated
    /// once it holds this many bytes beyond its opening state (`trace_file_max_kib`, default
    /// 8192 = 8 MiB).
    pub trace_file_max_bytes: u64,
    /// How many trace files are kept, the newest (`trace_files_kept`, default 8); 0 turns
    /// the trace off.
    pub trace_files_kept: usize,
}

/// Default of `[broker] trace_file_max_kib`: 8 MiB files.
pub const DEFAULT_TRACE_FILE_MAX_KIB: u64 = 8192;
/// Default of `[broker] trace_files_kept`.
pub const DEFAULT_TRACE_FILES_KEPT: usize = 8;

/// One validated `[[host]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    pub name: String,
    /// Where the transport connects; defaults to the name.
    pub address: String,
    /// Lower-case labels, sorted and unique.
    pub labels: Vec<String>,
    /// The user whose private machine this is.
    pub owner: Option<String>,
}

/// A validated lab file.
#[derive(Debug, Clone, PartialEq)]
pub struct LabConfig {
    /// The file it came from (for messages), if any.
    pub source: Option<PathBuf>,
    pub broker: BrokerSettings,
    pub hosts: Vec<HostEntry>,
    /// `[overflow.slurm]`: pilot jobs on a Slurm cluster while the lab is full; `None` when
    /// the table is absent (no overflow).
    pub overflow: Option<SlurmOverflow>,
    /// `[web]`: the HTTP listener for `/metrics` and the JSON view; `None` = off.
    pub web: Option<WebSettings>,
}

impl LabConfig {
    /// The directory a relative `[broker] policy` path is read from: the lab file's.
    pub fn policy_base(&self) -> PathBuf {
        self.source
            .as_deref()
            .and_then(std::path::Path::parent)
            .map_or_else(|| PathBuf::from("."), std::path::Path::to_path_buf)
    }

    /// Reads and validates a lab file.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::io(path, &e))?;
        Self::parse(&text, Some(path))
    }

    /// Parses and validates lab-file text; `path` is only used in messages.
    pub fn parse(text: &str, path: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        if let Some(unknown) = keys::unknown_keys(text, path) {
            return Err(unknown);
        }
        let raw: raw::RawLab =
            toml::from_str(text).map_err(|e| ConfigError::from_toml(text, path, &e))?;
        validate::validate(raw, text, path)
    }

    /// A lab to run a broker on names at least one host, or grows onto Slurm: a file with
    /// neither has nothing to allocate (`rb check` and `rb-broker` refuse it; a file parsed
    /// for other reasons may have none).
    pub fn check_has_hosts(&self) -> Result<(), ConfigError> {
        if !self.hosts.is_empty() || self.overflow.is_some() {
            return Ok(());
        }
        let path = self.source.as_deref();
        Err(error::ConfigError::at("", path, None, "host").msg(
            "the lab file names no host: there is nothing to allocate",
            "add a [[host]] table per machine (name = \"node01\"), or [overflow.slurm]",
        ))
    }

    pub fn host(&self, name: &str) -> Option<&HostEntry> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// What is allowed but probably a mistake (`rb check` prints these; the broker logs
    /// them at start): a loopback `listen` with a transport that starts daemons on other
    /// machines, which cannot connect back to it.
    pub fn warnings(&self) -> Vec<ConfigWarning> {
        let b = &self.broker;
        let remote = matches!(b.transport, Transport::Ssh | Transport::Rsh);
        let mut out = Vec::new();
        if remote && b.listen.ip().is_loopback() {
            out.push(ConfigWarning {
                file: self.source_name(),
                key: "broker.listen".into(),
                message: format!(
                    "{} is a loopback address, but transport `{}` starts host daemons on other \
                     machines, which cannot connect to it",
                    b.listen,
                    b.transport.name()
                ),
                help: "listen on an address of this machine that the hosts can reach \
                       (e.g. \"10.77.0.1:7700\"), or use transport = \"local\""
                    .into(),
            });
        }
        if let Some(w) = self.overflow_listen_warning() {
            out.push(w);
        }
        out
    }

    /// With `[overflow.slurm]`, pilots on compute nodes connect to `listen`: a loopback or
    /// wildcard address cannot be reached (or named) from there.
    fn overflow_listen_warning(&self) -> Option<ConfigWarning> {
        self.overflow.as_ref()?;
        let ip = self.broker.listen.ip();
        let why = if ip.is_loopback() {
            "a loopback address"
        } else if ip.is_unspecified() {
            "a wildcard address, which a pilot cannot connect to"
        } else {
            return None;
        };
        Some(ConfigWarning {
            file: self.source_name(),
            key: "broker.listen".into(),
            message: format!(
                "{} is {why}, but with [overflow.slurm] the pilots' rb-hostd on Slurm compute \
                 nodes connect to it: the compute nodes cannot reach the broker",
                self.broker.listen
            ),
            help: "listen on an address of this machine that the compute nodes can reach \
                   (e.g. \"10.1.0.5:7700\")"
                .into(),
        })
    }

    /// What `rb-broker` checks at start beyond the file itself: the secret file exists, is
    /// ours, is not readable by group or others, and is long enough (the same check,
    /// [`proto::auth::Secret::load`]). `rb check` runs it too.
    pub fn check_secret_file(&self) -> Result<(), ConfigError> {
        let Err(e) = proto::auth::Secret::load(&self.broker.secret_file) else {
            return Ok(());
        };
        let shown = e.to_string();
        let (message, help) = match shown.split_once("\nhelp: ") {
            Some((m, h)) => (m.to_string(), h.to_string()),
            None => (
                shown,
                "use a secret file of your own, mode 0600 (`rb init` creates one)".to_string(),
            ),
        };
        Err(ConfigError {
            file: self.source_name(),
            line: None,
            column: None,
            key: Some("broker.secret_file".into()),
            message,
            help: Some(help),
            more: Vec::new(),
        })
    }

    /// The file this lab came from, for messages (`<lab>` when it was built in memory).
    pub fn source_name(&self) -> String {
        self.source
            .as_ref()
            .map_or_else(|| "<lab>".to_string(), |p| p.display().to_string())
    }

    /// The broker's local control socket.
    pub fn control_socket(&self) -> PathBuf {
        self.broker.state_dir.join("broker.sock")
    }
}

/// Expands a leading `~/` with `$HOME`.
pub fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// The default location of the user's lab file: `~/.config/rb/lab.toml`.
pub fn default_lab_path() -> PathBuf {
    expand_home("~/.config/rb/lab.toml")
}

/// The lab file to use: `explicit`, else `~/.config/rb/lab.toml` if it exists, else none.
pub fn load_lab(explicit: Option<&Path>) -> Result<Option<LabConfig>, ConfigError> {
    let path = explicit
        .map(Path::to_path_buf)
        .or_else(|| Some(default_lab_path()).filter(|p| p.exists()));
    path.map(|p| LabConfig::load(&p)).transpose()
}

/// The default location of the lab secret: `~/.config/rb/secret`.
pub fn default_secret_path() -> PathBuf {
    expand_home("~/.config/rb/secret")
}

/// Where a user keeps the credential `rb user add` made for them.
pub fn default_credential_path() -> PathBuf {
    expand_home("~/.config/rb/credential")
}

/// A program installed next to the running one (cargo and packages put them in one
/// directory); falls back to the bare name, looked up in `PATH`.
pub fn sibling_program(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(name)))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}
