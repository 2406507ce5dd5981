//! Sensors of the host daemon: what this machine looks like right now, as a
//! [`HostReport`] (full sample) or an [`Activity`] (cheap sample for fast polling), plus the
//! pure [`detect_trigger`] rule that decides when a login or returning user warrants an
//! immediate report.
//!
//! Every value is optional: a sensor that cannot read its source answers `None` ("unknown"),
//! never a guess, and unknown is never treated as idle or zero. All sources are paths in
//! [`SensorConfig`], so tests and the lab can point them at fakes (LAB-NOTES: `/proc` is global
//! to the machine, `/dev/input` may not exist).
//!
//! # Layout
//! - [`proc`]: `/proc/stat` (CPU count, utilisation counters), `/proc/loadavg`,
//!   `/proc/meminfo`, process liveness, broker-managed process count.
//! - [`utmp`]: logins from utmp, and the record encoder test harnesses use for fake logins.
//! - [`idle`]: tty idle, console idle from input-device files (no X: see there why).
//! - [`logind`]: logind's sessions over the system D-Bus, watched by a thread of its own.
//! - [`glob`]: the small glob used for input-device patterns.
//! - [`overlay`]: the sensor-overlay file (test and demo facility; format in `hostd/OVERLAY.md`).
//! - [`trigger`]: the rule behind [`detect_trigger`].
//!
//! Footprint: no async and no network here (the logind watch is a thread of its own, with
//! one bus connection); a full sample reads a handful of small files plus each process's
//! `environ`; an activity sample reads utmp and stats a few files.

pub mod glob;
pub mod idle;
pub mod logind;
pub mod overlay;
pub mod proc;
pub mod trigger;
pub mod utmp;

use std::path::PathBuf;
use std::time::SystemTime;

use proto::report::{HostReport, LogindSession, UserSession};

use self::idle::InputDevices;
use self::logind::{LogindWatch, Snapshot};
use self::overlay::OverlayCache;
pub use self::overlay::{Overlay, OverlayError};
use self::proc::CpuTimes;
pub use self::trigger::detect_trigger;
pub use self::utmp::{encode_record, UtmpRecord, USER_PROCESS, UTMP_RECORD_SIZE};

/// Where the sensors read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SensorConfig {
    /// The proc file system (default `/proc`).
    pub proc_dir: PathBuf,
    /// The utmp file (default `/run/utmp`).
    pub utmp_path: PathBuf,
    /// Directory that utmp `ut_line` values are relative to (default `/dev`).
    pub dev_dir: PathBuf,
    /// Glob patterns of files whose max(atime, mtime) is the last console input. Default:
    /// [`DEFAULT_INPUT_DEVICES`] (evdev devices, mice, virtual consoles). `/dev/console` is not
    /// a default: system messages written to it would look like input.
    pub input_devices: Vec<String>,
    /// The sensor-overlay file (default none).
    pub overlay_path: Option<PathBuf>,
    /// Processes whose environment has `<marker>=` belong to broker jobs (default `RB_JOB`).
    pub managed_env_marker: String,
    /// Read logind's sessions over the system bus (default true).
    pub logind: bool,
}

/// Default [`SensorConfig::input_devices`]: keyboards and mice (evdev and the legacy mouse
/// devices, whose atime the X server or console reader updates) and the virtual consoles
/// `tty0`–`tty63` (atime on keyboard input, mtime on output).
pub const DEFAULT_INPUT_DEVICES: &[&str] = &[
    "/dev/input/event*",
    "/dev/input/mice",
    "/dev/input/mouse*",
    "/dev/tty[0-9]*",
];

impl Default for SensorConfig {
    fn default() -> Self {
        Self {
            proc_dir: PathBuf::from("/proc"),
            utmp_path: PathBuf::from("/run/utmp"),
            dev_dir: PathBuf::from("/dev"),
            input_devices: DEFAULT_INPUT_DEVICES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            overlay_path: None,
            managed_env_marker: "RB_JOB".to_owned(),
            logind: true,
        }
    }
}

/// The cheap sample: who is logged in and how long the console has been idle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activity {
    /// Logged-in sessions; `None` when utmp could not be read.
    pub users: Option<Vec<UserSession>>,
    /// Seconds since the last console input; `None` when no source could be read.
    pub console_idle_s: Option<u64>,
    /// logind's sessions; `None` when logind could not be read (or is not watched).
    pub logind: Option<Vec<LogindSession>>,
}

/// `uname(2)`, read once: it does not change while the daemon runs.
#[derive(Debug, Clone, Default)]
struct Uname {
    sysname: Option<String>,
    nodename: Option<String>,
    release: Option<String>,
    machine: Option<String>,
}

impl Uname {
    fn read() -> Self {
        match nix::sys::utsname::uname() {
            Ok(u) => Self {
                sysname: Some(u.sysname().to_string_lossy().to_lowercase()),
                nodename: Some(u.nodename().to_string_lossy().into_owned()),
                release: Some(u.release().to_string_lossy().into_owned()),
                machine: Some(u.machine().to_string_lossy().into_owned()),
            },
            Err(err) => {
                tracing::warn!(error = %err, "uname failed; os, arch, kernel and hostname unknown");
                Self::default()
            }
        }
    }
}

/// The sensors of one machine, with the state that spans samples.
#[derive(Debug)]
pub struct Sensors {
    cfg: SensorConfig,
    uname: Uname,
    /// CPU counters of the previous full sample, for utilisation deltas.
    prev_cpu: Option<CpuTimes>,
    /// The utilisation computed at the last baseline change.
    last_util: Option<f64>,
    overlay: OverlayCache,
    input: InputDevices,
    logind: Option<LogindWatch>,
}

impl Sensors {
    pub fn new(cfg: SensorConfig) -> Self {
        Self {
            uname: Uname::read(),
            prev_cpu: None,
            last_util: None,
            overlay: OverlayCache::new(cfg.overlay_path.clone()),
            input: InputDevices::new(cfg.input_devices.clone()),
            logind: cfg.logind.then(LogindWatch::spawn),
            cfg,
        }
    }

    /// Full sample: everything in [`HostReport`] except `seq` and `trigger` (the daemon fills
    /// those). `cpu_util` is `None` on the first sample (it needs a previous one).
    pub fn sample(&mut self) -> HostReport {
        let now = SystemTime::now();
        let stat = proc::read_stat(&self.cfg.proc_dir);
        let mem = proc::read_meminfo(&self.cfg.proc_dir);
        let activity = self.read_activity(now);
        let mut report = HostReport {
            hostname: self.uname.nodename.clone().unwrap_or_default(),
            cpus: stat.cpus,
            load: proc::read_loadavg(&self.cfg.proc_dir),
            cpu_util: stat.times.and_then(|t| self.cpu_util(t)),
            mem_total_kb: mem.total_kb,
            mem_available_kb: mem.available_kb,
            os: self.uname.sysname.clone(),
            arch: self.uname.machine.clone(),
            kernel: self.uname.release.clone(),
            users: activity.users,
            console_idle_s: activity.console_idle_s,
            logind: activity.logind,
            logind_error: self.logind_error(),
            managed_procs: proc::count_managed(&self.cfg.proc_dir, &self.cfg.managed_env_marker),
            labels: self.derived_labels(),
            ..HostReport::default()
        };
        if let Some(overlay) = self.overlay.current() {
            overlay.apply_report(&mut report);
        }
        report.labels = normalize_labels(std::mem::take(&mut report.labels));
        report
    }

    /// Cheap sample for fast polling: users (utmp + tty atimes) and console idle only, with the
    /// overlay applied.
    pub fn sample_activity(&mut self) -> Activity {
        let mut activity = self.read_activity(SystemTime::now());
        if let Some(overlay) = self.overlay.current() {
            overlay.apply_activity(&mut activity);
        }
        activity
    }

    fn read_activity(&mut self, now: SystemTime) -> Activity {
        let cfg = &self.cfg;
        let users = utmp::read_sessions(&cfg.utmp_path, &cfg.proc_dir, &cfg.dev_dir, now);
        let console_idle_s = self.input.idle_s(now);
        let logind = match self.logind.as_ref().map(LogindWatch::snapshot) {
            Some(Snapshot::Read(sessions)) => Some(
                sessions
                    .iter()
                    .map(|s| logind::to_report(s, &cfg.dev_dir, now))
                    .collect(),
            ),
            _ => None,
        };
        Activity {
            users,
            console_idle_s,
            logind,
        }
    }

    /// Why logind's sessions are unknown, if they are.
    fn logind_error(&self) -> Option<String> {
        match self.logind.as_ref().map(LogindWatch::snapshot) {
            None => Some("not watched (--no-logind)".into()),
            Some(Snapshot::Pending) => Some("not listed yet".into()),
            Some(Snapshot::Unreachable(why)) => Some(why),
            Some(Snapshot::Read(_)) => None,
        }
    }

    /// The logind watch, for the daemon to wake at its signals (`None`: not watched).
    pub fn logind_watch(&self) -> Option<LogindWatch> {
        self.logind.clone()
    }

    /// Utilisation since the previous sample. When no clock tick passed since then (two
    /// samples within ~10 ms), the last answer stands and the baseline stays.
    fn cpu_util(&mut self, times: CpuTimes) -> Option<f64> {
        match self.prev_cpu {
            Some(prev) if prev.total == times.total => return self.last_util,
            Some(prev) => self.last_util = times.utilisation_since(&prev),
            None => {}
        }
        self.prev_cpu = Some(times);
        self.last_util
    }

    /// `os` and `arch`, as far as known.
    fn derived_labels(&self) -> Vec<String> {
        [&self.uname.sysname, &self.uname.machine]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }
}

/// Lower-case, trimmed, non-empty, sorted, unique.
fn normalize_labels(labels: Vec<String>) -> Vec<String> {
    let mut labels: Vec<String> = labels
        .into_iter()
        .map(|l| l.trim().to_lowercase())
        .filter(|l| !l.is_empty())
        .collect();
    labels.sort();
    labels.dedup();
    labels
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn smoke_sample_of_this_machine() {
        let mut sensors = Sensors::new(SensorConfig::default());
        let report = sensors.sample();
        assert!(report.cpus.is_some_and(|n| n >= 1), "{report:?}");
        assert!(report.load.is_some(), "{report:?}");
        assert_eq!(report.os.as_deref(), Some("linux"));
        assert!(!report.hostname.is_empty());
        assert!(report.mem_total_kb.is_some_and(|kb| kb > 0));
        assert_eq!(report.cpu_util, None, "first sample has no delta");
        assert!(report.managed_procs.is_some());
        assert!(
            report.labels.contains(&"linux".to_owned()),
            "{:?}",
            report.labels
        );
        assert!(report.overlaid.is_empty());
        assert_eq!((report.seq, report.trigger), (0, None));
        std::thread::sleep(std::time::Duration::from_millis(50));
        let util = sensors
            .sample()
            .cpu_util
            .expect("second sample has a delta");
        assert!((0.0..=1.0).contains(&util));
        assert_eq!(
            sensors.sample().cpu_util.map(|u| (0.0..=1.0).contains(&u)),
            Some(true)
        );
    }

    #[test]
    fn cpu_util_from_stat_deltas() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = fake_config(dir.path());
        let stat = cfg.proc_dir.join("stat");
        let mut sensors = Sensors::new(cfg);
        assert_eq!(sensors.sample().cpu_util, None, "first sample");
        // busy 20 -> 50, total 100 -> 200.
        fs::write(&stat, "cpu 40 0 10 150 0 0 0 0\ncpu0 1 2 3 4\n").expect("stat");
        assert_eq!(sensors.sample().cpu_util, Some(0.3));
        assert_eq!(
            sensors.sample().cpu_util,
            Some(0.3),
            "no tick: last answer stands"
        );
        fs::write(&stat, "cpu 40 0 10 250 0 0 0 0\ncpu0 1 2 3 4\n").expect("stat");
        assert_eq!(sensors.sample().cpu_util, Some(0.0));
        fs::write(&stat, "cpu 1 0 1 1 0 0 0 0\ncpu0 1 2 3 4\n").expect("stat");
        assert_eq!(sensors.sample().cpu_util, None, "counters went backwards");
    }

    /// A fake machine: proc files, an empty utmp, one input device, and an overlay path.
    fn fake_config(dir: &std::path::Path) -> SensorConfig {
        let proc_dir = dir.join("proc");
        fs::create_dir_all(&proc_dir).expect("mkdir");
        fs::write(
            proc_dir.join("stat"),
            "cpu 10 0 10 80 0 0 0 0\ncpu0 1 2 3 4\ncpu1 1 2 3 4\n",
        )
        .expect("stat");
        fs::write(proc_dir.join("loadavg"), "0.25 0.50 0.75 1/99 123\n").expect("loadavg");
        fs::write(
            proc_dir.join("meminfo"),
            "MemTotal: 2000 kB\nMemAvailable: 500 kB\n",
        )
        .expect("meminfo");
        fs::write(dir.join("utmp"), b"").expect("utmp");
        fs::write(dir.join("kbd"), b"").expect("kbd");
        SensorConfig {
            proc_dir,
            utmp_path: dir.join("utmp"),
            dev_dir: dir.join("dev"),
            input_devices: vec![format!("{}/kbd", dir.display())],
            overlay_path: Some(dir.join("overlay.toml")),
            managed_env_marker: "RB_JOB".into(),
            logind: false,
        }
    }

    #[test]
    fn fake_sources_and_overlay_precedence() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut sensors = Sensors::new(fake_config(dir.path()));
        let plain = sensors.sample();
        assert_eq!(plain.cpus, Some(2));
        assert_eq!(plain.load, Some([0.25, 0.5, 0.75]));
        assert_eq!(
            (plain.mem_total_kb, plain.mem_available_kb),
            (Some(2000), Some(500))
        );
        assert_eq!(plain.users, Some(vec![]));
        assert!(plain.console_idle_s.is_some_and(|s| s < 5));
        assert_eq!(plain.managed_procs, Some(0));
        let overlay = "cpus = 64\nconsole_idle_s = \"unknown\"\nlabels = [\"GPU\", \"linux\"]\n\
                       [[users]]\nuser = \"alice\"\ntty = \"pts/3\"\nidle_s = 5\n";
        fs::write(dir.path().join("overlay.toml"), overlay).expect("overlay");
        let report = sensors.sample();
        assert_eq!(report.cpus, Some(64));
        assert_eq!(report.load, Some([0.25, 0.5, 0.75]), "not overlaid");
        assert_eq!(report.console_idle_s, None);
        assert_eq!(report.users.as_ref().map(Vec::len), Some(1));
        assert!(report.labels.contains(&"gpu".to_owned()));
        assert_eq!(report.labels.iter().filter(|l| *l == "linux").count(), 1);
        assert_eq!(
            report.overlaid,
            ["cpus", "console_idle_s", "users", "labels"]
        );
        let activity = sensors.sample_activity();
        assert_eq!(activity.console_idle_s, None);
        assert_eq!(activity.users, report.users);
    }

    #[test]
    fn malformed_overlay_does_not_break_reporting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = fake_config(dir.path());
        fs::write(dir.path().join("overlay.toml"), "cpus = 64\nbogus = 1\n").expect("overlay");
        let mut sensors = Sensors::new(cfg);
        let report = sensors.sample();
        assert_eq!(report.cpus, Some(2), "sensor value, overlay ignored");
        assert!(report.overlaid.is_empty());
        assert_eq!(sensors.sample_activity().users, Some(vec![]));
    }

    #[test]
    fn unreadable_sources_are_unknown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let absent = dir.path().join("absent");
        let cfg = SensorConfig {
            proc_dir: absent.clone(),
            utmp_path: absent.join("utmp"),
            dev_dir: absent.clone(),
            input_devices: vec![format!("{}/input/*", absent.display())],
            overlay_path: None,
            managed_env_marker: "RB_JOB".into(),
            logind: false,
        };
        let mut sensors = Sensors::new(cfg);
        let report = sensors.sample();
        assert_eq!(
            (report.cpus, report.load, report.cpu_util),
            (None, None, None)
        );
        assert_eq!((report.mem_total_kb, report.mem_available_kb), (None, None));
        assert_eq!((report.users, report.console_idle_s), (None, None));
        assert_eq!(report.managed_procs, None);
        assert_eq!(sensors.sample_activity(), Activity::default());
    }

    #[test]
    fn labels_are_normalized() {
        let labels = vec![" Fast ".into(), "gpu".into(), "GPU".into(), "".into()];
        assert_eq!(normalize_labels(labels), ["fast", "gpu"]);
    }
}
