//! Policy reloads: `rb policy reload`, SIGHUP to `rb-broker`, and the policy file changing
//! on disk (polled each second, read once its size and mtime have been still for
//! [`QUIET`]: editors write in steps). Loading (CEL parsing) runs in `spawn_blocking`,
//! never on a tokio worker; a bad policy is refused, logged and kept as the last reload
//! error, and the old policy stays. For a good one the core hands out its cached host
//! values ([`Event::PolicyInputs`]), the new policy's host-only decisions are worked out
//! from them in `spawn_blocking` too (two evaluations per host: at 10k hosts, most of a
//! reload's work), then brought up to the core's values of that moment (asked again:
//! the hosts that reported while it was prepared are decided off the core as well), and
//! the core puts the result in force ([`Event::SetPolicy`]), deciding again only the
//! hosts that reported during that second, short pass.
//!
//! Each reload reads the lab file's `[broker] policy` again (when the broker was started
//! from a lab file): pointing it at another file and running `rb policy reload` switches
//! to that file, and the watcher then watches the new one. The rest of the lab file is not
//! re-read (it needs a restart).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use policies::Policy;
use proto::msg::PolicyInfo;
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::{oneshot, watch},
    task::JoinHandle,
};
use tracing::{info, warn};

use crate::{
    alloc::HostInputs,
    core::{Event, EventSender},
};

/// How often the policy file is looked at.
pub const POLL: Duration = Duration::from_secs(1);
/// How long the file must stay unchanged before it is read.
pub const QUIET: Duration = Duration::from_millis(200);

/// The lab's policy setting, what is in force, and the reloads.
pub struct PolicyHandle {
    /// `[broker] policy` and the directory a relative path is read from, as last loaded.
    setting: Mutex<(String, PathBuf)>,
    /// The lab file, read again by each reload for its `policy` key.
    lab_file: Option<PathBuf>,
    events: EventSender,
    info: Mutex<PolicyInfo>,
    /// One reload at a time.
    serial: tokio::sync::Mutex<()>,
}

impl PolicyHandle {
    /// `setting` is `[broker] policy` (a shipped name or a path relative to `base`, the lab
    /// file's directory); `policy` is what was loaded from it at start.
    pub fn new(setting: &str, base: &Path, policy: &Policy, events: EventSender) -> Self {
        PolicyHandle {
            setting: Mutex::new((setting.to_string(), base.to_path_buf())),
            lab_file: None,
            events,
            info: Mutex::new(info_of(policy)),
            serial: tokio::sync::Mutex::new(()),
        }
    }

    /// Each reload reads `[broker] policy` again from `lab_file` (the file the broker was
    /// started with; `None`: the setting given to [`PolicyHandle::new`] stays).
    pub fn with_lab_file(mut self, lab_file: Option<PathBuf>) -> Self {
        self.lab_file = lab_file;
        self
    }

    fn setting(&self) -> (String, PathBuf) {
        self.setting
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// The setting a reload loads now: the lab file's `[broker] policy` as it is now.
    async fn current_setting(&self) -> Result<(String, PathBuf), String> {
        let Some(lab_file) = self.lab_file.clone() else {
            return Ok(self.setting());
        };
        tokio::task::spawn_blocking(move || {
            config::LabConfig::load(&lab_file)
                .map(|lab| (lab.broker.policy.clone(), lab.policy_base()))
                .map_err(|e| {
                    format!(
                        "the lab file cannot be read again for its policy setting: {e}\n\
                         help: fix the lab file ({}); the policy in force stays",
                        lab_file.display()
                    )
                })
        })
        .await
        .map_err(|e| format!("the lab file reader failed: {e}"))?
    }

    /// The policy in force and the last reload error.
    pub fn info(&self) -> PolicyInfo {
        self.info
            .lock()
            .map(|i| i.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// The file to watch: `None` for a shipped policy (built into the binary).
    pub fn file(&self) -> Option<PathBuf> {
        let (setting, base) = self.setting();
        policies::shipped_text(&setting)
            .is_none()
            .then(|| base.join(&setting))
    }

    /// Loads the setting again and, when it is good, puts it in force. `cause` is logged.
    pub async fn reload(&self, cause: &'static str) -> Result<PolicyInfo, String> {
        let _one = self.serial.lock().await;
        let (setting, base) = match self.current_setting().await {
            Ok(s) => s,
            Err(e) => return Err(self.refused(cause, e)),
        };
        let new_setting = (setting.clone(), base.clone());
        let loaded = tokio::task::spawn_blocking(move || Policy::from_setting(&setting, &base))
            .await
            .map_err(|e| format!("the policy loader failed: {e}"));
        let policy = match loaded {
            Ok(Ok(p)) => Arc::new(p),
            Ok(Err(e)) => return Err(self.refused(cause, e.to_string())),
            Err(e) => return Err(self.refused(cause, e)),
        };
        let stopping = || "broker stopping".to_string();
        let inputs = self.policy_inputs().await.ok_or_else(stopping)?;
        let new = policy.clone();
        let prepared = tokio::task::spawn_blocking(move || inputs.prepare(new))
            .await
            .map_err(|e| format!("preparing the policy failed: {e}"))?;
        // Hosts reported while it was prepared (at 10k hosts, hundreds): decided here too,
        // so that the core decides only those that report during this second, short pass.
        let inputs = self.policy_inputs().await.ok_or_else(stopping)?;
        let prepared = tokio::task::spawn_blocking(move || prepared.catch_up(inputs))
            .await
            .map_err(|e| format!("preparing the policy failed: {e}"))?;
        let (reply, done) = oneshot::channel();
        let event = Event::SetPolicy {
            prepared: Box::new(prepared),
            reply,
        };
        if self.events.send(event).await.is_err() || done.await.is_err() {
            return Err(stopping());
        }
        let info = info_of(&policy);
        let before = self.setting();
        if before.0 != new_setting.0 {
            info!(cause, from = %before.0, to = %new_setting.0, "the lab file names another policy");
        }
        if let Ok(mut s) = self.setting.lock() {
            *s = new_setting;
        }
        info!(cause, path = %info.path, sha256 = %info.sha256, "policy reloaded");
        crate::web::METRICS.reload(true);
        if let Ok(mut i) = self.info.lock() {
            *i = info.clone();
        }
        Ok(info)
    }

    /// The allocator's cached host values, from the core; `None` when it is stopping.
    async fn policy_inputs(&self) -> Option<HostInputs> {
        let (reply, inputs) = oneshot::channel();
        let event = Event::PolicyInputs { reply };
        self.events.send(event).await.ok()?;
        inputs.await.ok()
    }

    fn refused(&self, cause: &'static str, error: String) -> String {
        warn!(cause, %error, "policy reload refused; the old policy stays");
        crate::web::METRICS.reload(false);
        if let Ok(mut i) = self.info.lock() {
            i.last_reload_error = Some(error.clone());
        }
        error
    }
}

fn info_of(policy: &Policy) -> PolicyInfo {
    let loaded_at_unix = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    PolicyInfo {
        path: policy.source_path().display().to_string(),
        sha256: policy.sha256().to_string(),
        loaded_at_unix,
        summary: policy.summary().to_string(),
        last_reload_error: None,
    }
}

/// What the poll compares: modification time and size (`None`: cannot be read now).
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Reloads on SIGHUP and when the policy file changes, until `shutdown` fires.
pub fn spawn_policy_watcher(
    handle: Arc<PolicyHandle>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<()>> {
    let mut hup = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        let mut file = handle.file();
        let mut last = file.as_deref().and_then(stamp);
        let mut poll = tokio::time::interval(POLL);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = hup.recv() => {
                    let _ = handle.reload("SIGHUP").await;
                }
                _ = poll.tick() => {
                    // A reload may have switched to another file (the lab file's setting).
                    // That file may have changed since the reload read it and before this
                    // tick: no stamp to compare with, so it is read once more (the same
                    // content is the same policy).
                    let now_file = handle.file();
                    if now_file != file {
                        last = None;
                        file = now_file;
                    }
                    let Some(path) = file.as_deref() else { continue };
                    let now = stamp(path);
                    if now == last || now.is_none() {
                        continue;
                    }
                    last = settle(path, now).await;
                    let _ = handle.reload("policy file changed").await;
                }
            }
        }
    }))
}

/// Waits until `path` has kept the same stamp for [`QUIET`]; returns that stamp.
async fn settle(path: &Path, mut seen: Stamp) -> Stamp {
    loop {
        tokio::time::sleep(QUIET).await;
        let now = stamp(path);
        if now == seen {
            return now;
        }
        seen = now;
    }
}
