//! Host reports (sent by `rb-hostd`) and host status rows (served by `rb-broker`).
//!
//! Every sensor value is optional: `None` means the sensor could not read it ("unknown"),
//! which consumers must never treat as idle or zero.

use serde::{Deserialize, Serialize};

/// Why a report was sent now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportTrigger {
    /// First report after (re)connecting.
    Start,
    /// The periodic report.
    Interval,
    /// A user session appeared that was not in the previous report.
    Login,
    /// Keyboard, mouse or tty input resumed after a period of idleness.
    InputActivity,
}

/// One logged-in user session, from utmp.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserSession {
    pub user: String,
    pub tty: String,
    /// Seconds since the last input on this tty (now − atime of the tty); `None` if unknown.
    pub idle_s: Option<u64>,
    /// Remote host the session came from, when utmp records one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// One login session as logind (systemd-logind, or elogind) lists it, read over the system
/// D-Bus by `rb-hostd`. Strings are logind's own (`class`: `user`, `greeter`, `lock-screen`,
/// `background`, `manager`…; `kind`: `x11`, `wayland`, `mir`, `tty`, `unspecified`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogindSession {
    /// logind's session id (`c1`, `3`).
    pub id: String,
    pub user: String,
    /// The seat (`seat0`); `None` for a session on no seat (remote, background).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seat: Option<String>,
    /// The session's terminal (`tty2`, `pts/3`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<String>,
    /// The X11 display (`:0`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<String>,
    pub class: String,
    /// logind's `Type`.
    #[serde(rename = "type")]
    pub kind: String,
    pub remote: bool,
    /// Where a remote session came from (`RemoteHost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_host: Option<String>,
    /// The session in the foreground of its seat.
    pub active: bool,
    /// `LockedHint`: the desktop says its screen is locked.
    pub locked: bool,
    /// `IdleHint`: the desktop (or, for a tty, logind from the tty) says nobody uses it.
    pub idle_hint: bool,
    /// Seconds without input, at the time of the report; `None` when no source says.
    pub idle_s: Option<u64>,
    /// Where `idle_s` comes from ([`IdleSource`]).
    pub idle_source: IdleSource,
    /// The session this host daemon itself runs in (the broker's transport login): no
    /// person at the machine.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own: bool,
}

/// Where a session's idle time comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleSource {
    /// `IdleHint` is false: the desktop says the session is in use now (idle 0).
    LogindActive,
    /// `IdleHint` is true: now − `IdleSinceHint`.
    LogindIdleSince,
    /// `IdleHint` is true, but the screen was unlocked since `IdleSinceHint`: now − the
    /// unlock the host daemon saw (an unlock is someone typing a password).
    LogindUnlock,
    /// Now − the access time of the session's terminal (as `w` reads it).
    TtyAtime,
    /// No source: the session has no terminal and no desktop that says (a remote command,
    /// a background service), or `IdleHint` without `IdleSinceHint`. A source this broker
    /// does not know (from a newer daemon) reads as this: unknown, never away.
    #[default]
    #[serde(other)]
    None,
}

impl IdleSource {
    /// A few words for `rb status` and `rb-hostd --once`.
    pub fn describe(self) -> &'static str {
        match self {
            IdleSource::LogindActive => "logind IdleHint=no",
            IdleSource::LogindIdleSince => "logind IdleSinceHint",
            IdleSource::LogindUnlock => "logind unlock",
            IdleSource::TtyAtime => "tty atime",
            IdleSource::None => "no source",
        }
    }
}

impl LogindSession {
    /// Whether the session can stand for a person at a keyboard: class `user` or
    /// `lock-screen` (a greeter is nobody, a background service neither), with a terminal or a
    /// desktop (a remote command without a terminal, such as the broker's transport or a
    /// job's remote shell, has no keyboard), and not the host daemon's own.
    ///
    /// Type `tty` alone is no terminal: `pam_systemd` registers every `ssh host command`
    /// login (sshd's `PAM_TTY` is `ssh`) as type `tty` with no tty device, and such a
    /// session has no idle time either, so counting it would make its user's idle time
    /// unknown for as long as a job's command runs there.
    pub fn is_person(&self) -> bool {
        let class = matches!(self.class.as_str(), "user" | "lock-screen");
        let terminal = self.tty.is_some()
            || self.display.is_some()
            || matches!(self.kind.as_str(), "x11" | "wayland" | "mir");
        class && terminal && !self.own
    }

    /// At the machine itself: on a seat, or not remote with a terminal or desktop.
    pub fn is_local(&self) -> bool {
        self.seat.is_some() || !self.remote
    }
}

/// Everything a host daemon knows about its machine at one instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    /// The machine's own hostname (uname nodename).
    pub hostname: String,
    /// Monotonic counter per daemon process.
    pub seq: u64,
    pub trigger: Option<ReportTrigger>,
    pub cpus: Option<u32>,
    /// Load averages over 1, 5 and 15 minutes.
    pub load: Option<[f64; 3]>,
    /// CPU utilisation over the last interval, 0.0–1.0.
    pub cpu_util: Option<f64>,
    pub mem_total_kb: Option<u64>,
    pub mem_available_kb: Option<u64>,
    pub os: Option<String>,
    pub arch: Option<String>,
    pub kernel: Option<String>,
    /// Logged-in sessions; `None` when utmp could not be read.
    pub users: Option<Vec<UserSession>>,
    /// Seconds since the last keyboard/mouse input at the console; `None` when unknown.
    pub console_idle_s: Option<u64>,
    /// Processes on this machine that belong to broker jobs.
    pub managed_procs: Option<u32>,
    /// The load of this lab's job processes (HTCondor's `CondorLoadAvg`): CPUs' worth of
    /// CPU time they used, averaged like `load[0]` (1-minute exponential decay). `None`
    /// when unknown or from a daemon that predates it (older brokers ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_load: Option<f64>,
    /// Labels derived from the sensors, e.g. `linux`, `x86_64`.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Names of fields whose values came from the sensor-overlay file (tests, demos).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overlaid: Vec<String>,
    /// The sessions logind lists; `None` when logind could not be read (no logind on this
    /// machine, the system bus unreachable) or from a daemon that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logind: Option<Vec<LogindSession>>,
    /// Why `logind` is `None` (`no system bus: …`), for `rb status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logind_error: Option<String>,
    /// What is wrong on the host that the daemon works around, for `rb status` (e.g. its
    /// runtime directory in /tmp refused, and where it runs instead). Older brokers
    /// ignore it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The allocations of this lab with a process of the daemon's user on this machine
    /// (ascending): sent by daemons that end an allocation's processes when the broker says
    /// its deadline passed (`FromBroker::EndAllocs`); `None` from daemons that predate it,
    /// whose hosts the broker frees at the deadline as before (older brokers ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocs_running: Option<Vec<u64>>,
}

/// Whether the broker currently hears from a host (down until it reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    Up,
    #[default]
    Down,
}

impl std::fmt::Display for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HostState::Up => "up",
            HostState::Down => "down",
        })
    }
}

/// One row of `rb status --json`: the broker's view of a host.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostStatus {
    pub name: String,
    pub address: String,
    pub state: HostState,
    /// Why the host is down (e.g. "no report for 6.1 s", "daemon exited: status 1").
    pub down_reason: Option<String>,
    pub hostname: Option<String>,
    pub cpus: Option<u32>,
    pub load1: Option<f64>,
    pub load5: Option<f64>,
    pub load15: Option<f64>,
    pub cpu_util: Option<f64>,
    pub mem_total_kb: Option<u64>,
    pub mem_available_kb: Option<u64>,
    pub os: Option<String>,
    pub arch: Option<String>,
    pub users: Vec<UserSession>,
    /// False when the host's utmp could not be read (then `users` is empty but unknown).
    pub users_known: bool,
    pub console_idle_s: Option<u64>,
    /// [`HostReport::logind`]: `None` when unknown or from an older broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logind: Option<Vec<LogindSession>>,
    /// [`HostReport::logind_error`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logind_error: Option<String>,
    /// [`HostReport::warnings`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub managed_procs: Option<u32>,
    /// The load of the lab's job processes there ([`HostReport::job_load`]).
    #[serde(default)]
    pub job_load: Option<f64>,
    /// Lab-file labels plus sensor labels, lower-case, sorted, unique.
    pub labels: Vec<String>,
    pub owner: Option<String>,
    /// Seconds since the last report arrived; `None` if none ever did.
    pub last_report_age_s: Option<f64>,
    /// How many times the broker (re)started this host's daemon.
    pub daemon_starts: u32,
    /// What the allocator does with the host: `free`, `held`, `releasing` (being taken back),
    /// `reserved` (being taken back for a waiting request), `draining` (drained, still held)
    /// or `drained`. Empty from a broker that predates it.
    #[serde(default)]
    pub alloc_state: String,
    /// The job holding the host (granted or being released), if any.
    #[serde(default)]
    pub held_by: Option<u64>,
    /// True from `rb drain HOST` until `rb resume HOST`.
    #[serde(default)]
    pub drained: bool,
    /// Why the policy would not start any job on this free host now (`owner active 12 s
    /// ago`); `None` when it would, or when the host is held, drained or down.
    #[serde(default)]
    pub policy_note: Option<String>,
    /// A Slurm pilot's node: its Slurm job id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job: Option<String>,
    /// A Slurm pilot's node: seconds until Slurm takes it back, as Slurm last said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_left_s: Option<f64>,
    /// A Slurm pilot's node whose lease Slurm warned ends: it takes no new grant.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lease_ending: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `job_load` is new: reports and rows without it still parse, and a report without it
    /// is written as before.
    #[test]
    fn job_load_is_optional_both_ways() {
        let old: HostReport = serde_json::from_str(
            r#"{"hostname":"n1","seq":1,"trigger":null,
            "cpus":2,"load":null,"cpu_util":null,"mem_total_kb":null,"mem_available_kb":null,
            "os":null,"arch":null,"kernel":null,"users":null,"console_idle_s":null,
            "managed_procs":null}"#,
        )
        .expect("a report from an older daemon");
        assert_eq!(old.job_load, None);
        let text = serde_json::to_string(&old).expect("json");
        assert!(!text.contains("job_load"), "{text}");
        let new = HostReport {
            job_load: Some(0.5),
            ..old
        };
        let back: HostReport =
            serde_json::from_str(&serde_json::to_string(&new).expect("json")).expect("parse");
        assert_eq!(back.job_load, Some(0.5));
    }

    /// An idle source from a newer daemon is no source (never away), not a bad report.
    #[test]
    fn unknown_idle_source_reads_as_none() {
        let s: IdleSource = serde_json::from_str(r#""logind_unlock""#).expect("known");
        assert_eq!(s, IdleSource::LogindUnlock);
        let s: IdleSource = serde_json::from_str(r#""from_the_future""#).expect("unknown");
        assert_eq!(s, IdleSource::None);
    }

    /// Who is a person, with the sessions `pam_systemd` registers for each kind of login (as
    /// a real elogind lists them).
    #[test]
    fn person_needs_a_user_class_and_a_terminal_or_desktop() {
        let ssh = |tty: Option<&str>| LogindSession {
            user: "ann".into(),
            tty: tty.map(str::to_string),
            class: "user".into(),
            kind: "tty".into(),
            remote: true,
            remote_host: Some("10.0.0.2".into()),
            active: true,
            ..LogindSession::default()
        };
        assert!(ssh(Some("pts/0")).is_person(), "an interactive ssh login");
        assert!(
            !ssh(None).is_person(),
            "`ssh host command`: type tty, no tty device (a job's command, the transport)"
        );
        let desktop = |class: &str| LogindSession {
            class: class.into(),
            kind: "wayland".into(),
            ..ssh(None)
        };
        assert!(desktop("user").is_person());
        assert!(desktop("lock-screen").is_person());
        assert!(!desktop("greeter").is_person(), "a login screen is nobody");
        assert!(!desktop("background").is_person());
        let own = LogindSession {
            own: true,
            ..ssh(Some("pts/1"))
        };
        assert!(!own.is_person(), "the host daemon's own login");
    }
}
