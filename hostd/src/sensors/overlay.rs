//! The sensor-overlay file: a documented test and demo facility that replaces sensor values.
//!
//! TOML, every key optional, unknown keys rejected. A key that is present replaces the sensor
//! value and its field name is added to `HostReport::overlaid`:
//!
//! ```toml
//! cpus = 8
//! load = [0.5, 0.4, 0.3]          # 1, 5, 15 minutes; finite, >= 0
//! job_load = 0.2                  # the lab's job processes' load; finite, >= 0
//! cpu_util = 0.1                  # 0.0–1.0
//! mem_total_kb = 16000000
//! mem_available_kb = 12000000
//! console_idle_s = 3600           # or "unknown" to force None
//! labels = ["gpu", "fast"]        # added to the derived labels (lower-cased)
//! [[users]]                       # replaces the utmp list entirely when present
//! user = "alice"
//! tty = "pts/3"
//! idle_s = 5                      # optional; seconds or "unknown" (the default)
//! from = "node02"                 # optional
//! ```
//!
//! `users = []` (before any table) means "nobody is logged in". The file is re-read whenever its
//! mtime, size or inode changes (write a new file and rename it over the old one to change it
//! atomically); a missing file means no overlay. A malformed file is logged once (file, line,
//! key) and ignored until it changes: the sensors then report their own values. The same text
//! is in `hostd/OVERLAY.md`.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use proto::report::{HostReport, UserSession};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use thiserror::Error;
use tracing::{info, warn};

use super::Activity;

/// Overlay files larger than this are cut (a sane file is a few hundred bytes).
const MAX_OVERLAY_BYTES: u64 = 1 << 20;

/// The parsed overlay file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    pub cpus: Option<u32>,
    pub load: Option<[f64; 3]>,
    /// Replaces the daemon's measured `job_load` (`crate::jobload`).
    pub job_load: Option<f64>,
    pub cpu_util: Option<f64>,
    pub mem_total_kb: Option<u64>,
    pub mem_available_kb: Option<u64>,
    pub console_idle_s: Option<IdleValue>,
    pub labels: Option<Vec<String>>,
    pub users: Option<Vec<OverlayUser>>,
}

/// One `[[users]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlayUser {
    pub user: String,
    pub tty: String,
    #[serde(default)]
    pub idle_s: Option<IdleValue>,
    #[serde(default)]
    pub from: Option<String>,
}

/// An idle time in the overlay: seconds, or the string `"unknown"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleValue {
    Seconds(u64),
    Unknown,
}

impl IdleValue {
    /// The sensor value this stands for.
    pub fn seconds(self) -> Option<u64> {
        match self {
            IdleValue::Seconds(s) => Some(s),
            IdleValue::Unknown => None,
        }
    }
}

impl<'de> Deserialize<'de> for IdleValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(IdleVisitor)
    }
}

struct IdleVisitor;

impl Visitor<'_> for IdleVisitor {
    type Value = IdleValue;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(r#"seconds (an integer >= 0) or "unknown""#)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<IdleValue, E> {
        Ok(IdleValue::Seconds(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<IdleValue, E> {
        u64::try_from(v)
            .map(IdleValue::Seconds)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<IdleValue, E> {
        match v {
            "unknown" => Ok(IdleValue::Unknown),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }
}

/// Why an overlay file was not used.
#[derive(Debug, Error)]
pub enum OverlayError {
    #[error("cannot read sensor overlay {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("sensor overlay {path}, line {line}, key `{key}`: {message}\nhelp: see hostd/OVERLAY.md for the format")]
    Invalid {
        path: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
}

impl Overlay {
    /// Parses and validates overlay text read from `path` (used in error messages).
    pub fn parse(text: &str, path: &Path) -> Result<Overlay, OverlayError> {
        let invalid = |line, key, message| OverlayError::Invalid {
            path: path.to_owned(),
            line,
            key,
            message,
        };
        let overlay: Overlay = toml::from_str(text).map_err(|err| {
            let (line, key) = locate(text, err.span().map_or(0, |s| s.start));
            invalid(line, key, err.message().to_owned())
        })?;
        overlay
            .validate()
            .map_err(|(key, message)| invalid(line_of_key(text, key), key.to_owned(), message))?;
        Ok(overlay)
    }

    /// Value checks serde cannot express; the error names the offending key.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        if let Some(u) = self.cpu_util.filter(|u| !(0.0..=1.0).contains(u)) {
            return Err(("cpu_util", format!("{u} is not within 0.0–1.0")));
        }
        if let Some(load) = self
            .load
            .filter(|l| l.iter().any(|x| !x.is_finite() || *x < 0.0))
        {
            return Err(("load", format!("{load:?} must be finite and >= 0")));
        }
        if let Some(j) = self.job_load.filter(|j| !j.is_finite() || *j < 0.0) {
            return Err(("job_load", format!("{j} must be finite and >= 0")));
        }
        if self.labels.iter().flatten().any(|l| l.trim().is_empty()) {
            return Err(("labels", "a label is empty".to_owned()));
        }
        if self.users.iter().flatten().any(|u| u.user.is_empty()) {
            return Err(("user", "a user name is empty".to_owned()));
        }
        Ok(())
    }

    /// Replaces the report's sensor values with the overlay's and records which it replaced.
    pub fn apply_report(&self, report: &mut HostReport) {
        let overlaid = &mut report.overlaid;
        put(&mut report.cpus, self.cpus.map(Some), "cpus", overlaid);
        put(&mut report.load, self.load.map(Some), "load", overlaid);
        put(
            &mut report.job_load,
            self.job_load.map(Some),
            "job_load",
            overlaid,
        );
        put(
            &mut report.cpu_util,
            self.cpu_util.map(Some),
            "cpu_util",
            overlaid,
        );
        put(
            &mut report.mem_total_kb,
            self.mem_total_kb.map(Some),
            "mem_total_kb",
            overlaid,
        );
        let available = self.mem_available_kb.map(Some);
        put(
            &mut report.mem_available_kb,
            available,
            "mem_available_kb",
            overlaid,
        );
        put(
            &mut report.console_idle_s,
            self.console_idle(),
            "console_idle_s",
            overlaid,
        );
        put(
            &mut report.users,
            self.sessions().map(Some),
            "users",
            overlaid,
        );
        if let Some(labels) = &self.labels {
            report.labels.extend(labels.iter().cloned());
            overlaid.push("labels".to_owned());
        }
    }

    /// Replaces the activity's users and console idle with the overlay's.
    pub fn apply_activity(&self, activity: &mut Activity) {
        if let Some(idle) = self.console_idle() {
            activity.console_idle_s = idle;
        }
        if let Some(sessions) = self.sessions() {
            activity.users = Some(sessions);
        }
    }

    fn console_idle(&self) -> Option<Option<u64>> {
        self.console_idle_s.map(IdleValue::seconds)
    }

    fn sessions(&self) -> Option<Vec<UserSession>> {
        let users = self.users.as_ref()?;
        let to_session = |u: &OverlayUser| UserSession {
            user: u.user.clone(),
            tty: u.tty.clone(),
            idle_s: u.idle_s.and_then(IdleValue::seconds),
            from: u.from.clone(),
        };
        Some(users.iter().map(to_session).collect())
    }
}

fn put<T>(slot: &mut T, value: Option<T>, name: &str, overlaid: &mut Vec<String>) {
    if let Some(value) = value {
        *slot = value;
        overlaid.push(name.to_owned());
    }
}

/// Line number (1-based) of byte `offset` in `text`, and the key or table header on that line.
fn locate(text: &str, offset: usize) -> (usize, String) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let key = text.lines().nth(line - 1).map(key_of).unwrap_or_default();
    (line, key)
}

/// The key of a `key = value` line, or the header of a `[table]` line.
fn key_of(line: &str) -> String {
    let line = line.trim();
    if line.starts_with('[') {
        return line.to_owned();
    }
    line.split('=').next().unwrap_or_default().trim().to_owned()
}

/// The line (1-based) where `key` is first assigned; 0 when it cannot be found.
fn line_of_key(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| !l.trim().starts_with('[') && key_of(l) == key)
        .map_or(0, |i| i + 1)
}

/// What the file looked like when last checked; any change triggers a re-read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Missing,
    Unreadable,
    File {
        mtime: Option<SystemTime>,
        size: u64,
        ino: u64,
    },
}

/// The overlay file, re-read only when it changes; at most one warning per change.
#[derive(Debug)]
pub struct OverlayCache {
    path: Option<PathBuf>,
    seen: Option<Seen>,
    current: Option<Overlay>,
}

impl OverlayCache {
    pub fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            seen: None,
            current: None,
        }
    }

    /// The overlay in force now, if any.
    pub fn current(&mut self) -> Option<&Overlay> {
        let path = self.path.as_deref()?;
        let seen = look(path);
        if self.seen != Some(seen) {
            self.current = load(path, seen);
            self.seen = Some(seen);
        }
        self.current.as_ref()
    }
}

fn look(path: &Path) -> Seen {
    match fs::metadata(path) {
        Ok(m) => Seen::File {
            mtime: m.modified().ok(),
            size: m.len(),
            ino: m.ino(),
        },
        Err(err) if err.kind() == io::ErrorKind::NotFound => Seen::Missing,
        Err(_) => Seen::Unreadable,
    }
}

fn load(path: &Path, seen: Seen) -> Option<Overlay> {
    if seen == Seen::Missing {
        info!(file = %path.display(), "no sensor overlay file; sensors report their own values");
        return None;
    }
    match read_overlay(path) {
        Ok(overlay) => {
            info!(file = %path.display(), ?overlay, "sensor overlay loaded");
            Some(overlay)
        }
        Err(OverlayError::Invalid {
            path,
            line,
            key,
            message,
        }) => {
            warn!(file = %path.display(), line, key = %key, error = %message,
                "malformed sensor overlay ignored until the file changes");
            None
        }
        Err(err) => {
            warn!(file = %path.display(), error = %err, "sensor overlay ignored until it changes");
            None
        }
    }
}

/// Reads and parses the overlay at `path`.
pub fn read_overlay(path: &Path) -> Result<Overlay, OverlayError> {
    let read_err = |source| OverlayError::Read {
        path: path.to_owned(),
        source,
    };
    let mut text = String::new();
    File::open(path)
        .and_then(|f| f.take(MAX_OVERLAY_BYTES).read_to_string(&mut text))
        .map_err(read_err)?;
    Overlay::parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Overlay, OverlayError> {
        Overlay::parse(text, Path::new("/etc/rb/overlay.toml"))
    }

    fn invalid_at(text: &str) -> (usize, String) {
        match parse(text) {
            Err(OverlayError::Invalid { line, key, .. }) => (line, key),
            other => panic!("expected an invalid overlay, got {other:?}"),
        }
    }

    const FULL: &str = r#"
cpus = 8
load = [0.5, 0.4, 0.3]
job_load = 0.2
cpu_util = 0.1
mem_total_kb = 16000000
mem_available_kb = 12000000
console_idle_s = 3600
labels = ["gpu", "fast"]
[[users]]
user = "alice"
tty = "pts/3"
idle_s = 5
[[users]]
user = "bob"
tty = "tty1"
from = "node02"
"#;

    #[test]
    fn full_overlay_replaces_every_value_and_lists_them() {
        let overlay = parse(FULL).expect("valid");
        let mut report = HostReport {
            cpus: Some(2),
            load: None,
            console_idle_s: Some(1),
            labels: vec!["linux".into()],
            ..HostReport::default()
        };
        overlay.apply_report(&mut report);
        assert_eq!(report.cpus, Some(8));
        assert_eq!(report.load, Some([0.5, 0.4, 0.3]));
        assert_eq!(report.job_load, Some(0.2));
        assert_eq!(report.cpu_util, Some(0.1));
        assert_eq!(report.mem_total_kb, Some(16_000_000));
        assert_eq!(report.mem_available_kb, Some(12_000_000));
        assert_eq!(report.console_idle_s, Some(3600));
        assert_eq!(report.labels, ["linux", "gpu", "fast"]);
        let users = report.users.expect("users replaced");
        assert_eq!(users.len(), 2);
        assert_eq!(users[0].idle_s, Some(5));
        assert_eq!(users[1].idle_s, None);
        assert_eq!(users[1].from.as_deref(), Some("node02"));
        let expected = [
            "cpus",
            "load",
            "job_load",
            "cpu_util",
            "mem_total_kb",
            "mem_available_kb",
            "console_idle_s",
            "users",
            "labels",
        ];
        assert_eq!(report.overlaid, expected);
    }

    #[test]
    fn absent_keys_leave_sensor_values_alone() {
        let overlay = parse("cpus = 4\n").expect("valid");
        let mut report = HostReport {
            load: Some([1.0, 1.0, 1.0]),
            console_idle_s: Some(9),
            users: Some(vec![]),
            ..HostReport::default()
        };
        overlay.apply_report(&mut report);
        assert_eq!(report.cpus, Some(4));
        assert_eq!(report.load, Some([1.0, 1.0, 1.0]));
        assert_eq!(report.console_idle_s, Some(9));
        assert_eq!(report.overlaid, ["cpus"]);
    }

    #[test]
    fn unknown_forces_none_and_empty_users_means_nobody() {
        let overlay = parse("console_idle_s = \"unknown\"\nusers = []\n").expect("valid");
        let mut activity = Activity {
            users: Some(vec![UserSession {
                user: "root".into(),
                tty: "pts/0".into(),
                idle_s: Some(1),
                from: None,
            }]),
            console_idle_s: Some(42),
            logind: None,
        };
        overlay.apply_activity(&mut activity);
        assert_eq!(activity.console_idle_s, None);
        assert_eq!(activity.users, Some(vec![]));
        let integer_load = parse("load = [1, 0, 2]\n").expect("integers are numbers");
        assert_eq!(integer_load.load, Some([1.0, 0.0, 2.0]));
    }

    #[test]
    fn malformed_overlays_name_line_and_key() {
        assert_eq!(
            invalid_at("cpus = 2\ncolour = \"red\"\n"),
            (2, "colour".into())
        );
        assert_eq!(invalid_at("cpus = \"eight\"\n"), (1, "cpus".into()));
        assert_eq!(
            invalid_at("\n\nconsole_idle_s = \"idle\"\n"),
            (3, "console_idle_s".into())
        );
        assert_eq!(invalid_at("console_idle_s = -5\n").0, 1);
        assert_eq!(
            invalid_at("cpus = 1\ncpu_util = 1.5\n"),
            (2, "cpu_util".into())
        );
        assert_eq!(invalid_at("load = [1.0, -1.0, 0.0]\n"), (1, "load".into()));
        assert_eq!(invalid_at("load = [1.0]\n").1, "load");
        assert_eq!(invalid_at("job_load = -0.5\n"), (1, "job_load".into()));
        assert_eq!(
            invalid_at("[[users]]\nuser = \"a\"\ntty = \"t\"\nshell = 1\n").1,
            "shell"
        );
        assert_eq!(invalid_at("cpus = = 3\n").0, 1);
        let err = parse("colour = 1\n").expect_err("invalid");
        let text = err.to_string();
        assert!(
            text.contains("/etc/rb/overlay.toml") && text.contains("line 1"),
            "{text}"
        );
    }

    fn write(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, text).expect("write");
        fs::rename(&tmp, path).expect("rename");
    }

    #[test]
    fn cache_follows_changes_and_ignores_malformed_until_fixed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("overlay.toml");
        let mut cache = OverlayCache::new(Some(path.clone()));
        assert_eq!(cache.current(), None, "missing file: no overlay");
        write(&path, "cpus = 3\n");
        assert_eq!(cache.current().and_then(|o| o.cpus), Some(3));
        write(&path, "cpus = three\n");
        assert_eq!(cache.current(), None, "malformed: ignored");
        assert_eq!(cache.current(), None, "still ignored, no re-read");
        write(&path, "cpus = 16\n");
        assert_eq!(cache.current().and_then(|o| o.cpus), Some(16));
        fs::remove_file(&path).expect("rm");
        assert_eq!(cache.current(), None);
        assert_eq!(OverlayCache::new(None).current(), None);
    }
}
