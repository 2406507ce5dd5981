//! The audit log: one JSON line per admin action carried out and per request refused, in
//! `STATE_DIR/audit.log` (appended, mode 0600):
//!
//! ```json
//! {"time_unix":1764081234,"who":"bob","action":"drain","target":"node02","outcome":"refused","reason":"…"}
//! ```
//!
//! `outcome` is `ok`, `failed` (allowed, but it could not be done) or `refused` (not
//! allowed; `reason` says why). Writing is best effort: a full disk never stops the broker,
//! it logs a warning instead.

use std::{
    io::Write,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::Mutex,
    time::{SystemTime, UNIX_EPOCH},
};

use serde::Serialize;
use tracing::warn;

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    pub time_unix: i64,
    pub who: String,
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    Failed,
    Refused,
}

impl AuditEntry {
    /// The entry as one line (no newline inside: JSON escapes them).
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_else(|_| "{}".into());
        line.push('\n');
        line
    }
}

/// The log file, opened on first use.
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<Option<std::fs::File>>,
}

impl AuditLog {
    /// The log of the state dir `dir` (`dir/audit.log`).
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join("audit.log"),
            file: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `entry` now (its `time_unix` is set here).
    pub fn record(&self, mut entry: AuditEntry) {
        entry.time_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let Ok(mut slot) = self.file.lock() else {
            return;
        };
        if slot.is_none() {
            match open_log(&self.path) {
                Ok(f) => *slot = Some(f),
                Err(e) => {
                    return warn!(path = %self.path.display(), error = %e, "cannot open the audit log")
                }
            }
        }
        if let Some(file) = slot.as_mut() {
            if let Err(e) = file.write_all(entry.to_line().as_bytes()) {
                warn!(path = %self.path.display(), error = %e, "cannot write the audit log");
                *slot = None;
            }
        }
    }
}

/// Opens the log for appending: mode 0600, never through a symlink, ours only.
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(std::io::Error::other(
            "not a regular file of the broker's user",
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(outcome: Outcome) -> AuditEntry {
        AuditEntry {
            time_unix: 0,
            who: "bob".into(),
            action: "drain".into(),
            target: Some("node02".into()),
            outcome,
            reason: Some("needs the owner\nhelp: ask".into()),
        }
    }

    #[test]
    fn entries_are_single_json_lines() {
        let line = entry(Outcome::Refused).to_line();
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["outcome"], "refused");
        assert_eq!(v["who"], "bob");
    }

    #[test]
    fn the_log_is_appended_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let log = AuditLog::new(dir.path());
        log.record(entry(Outcome::Refused));
        log.record(entry(Outcome::Ok));
        let text = std::fs::read_to_string(log.path()).expect("read");
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.lines().all(|l| !l.contains("\"time_unix\":0")),
            "{text}"
        );
        let mode = std::fs::metadata(log.path())
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
