//! `rb demo`: the embedded single-machine lab, end to end. Starts `rb-broker --embedded`
//! (virtual hosts on this machine, each with its own `rb-hostd`), waits until every host
//! is up, prints the status table, and stops the broker (unless `--keep`).
//!
//! Everything lives in one private state dir (created or verified by
//! [`privdir::create_private`]: another user's directory or symlink there is refused), the
//! broker's log included (`broker.log`, opened `O_NOFOLLOW | O_EXCL`), so no fixed `/tmp`
//! path is ever followed or written by whoever made it first.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use proto::report::{HostState, HostStatus};

use crate::client::{self, Target};

/// Runs the demo; returns the final status rows.
pub async fn run(
    hosts: usize,
    state_dir: &Path,
    keep: bool,
    timeout: Duration,
) -> anyhow::Result<Vec<HostStatus>> {
    let broker = sibling("rb-broker");
    privdir::create_private(state_dir)?;
    let log = new_log(&log_path(state_dir))?;
    let out = log
        .try_clone()
        .with_context(|| format!("cannot reopen the log {}", log_path(state_dir).display()))?;
    // The broker (and the daemons it starts) hold none of the caller's descriptors: a
    // broker kept running must not keep `rb demo --keep | cat` or `$(rb demo --keep)`
    // waiting for the end of its output.
    let mut cmd = Command::new(&broker);
    cmd.arg("--embedded")
        .arg("--hosts")
        .arg(hosts.to_string())
        .arg("--state-dir")
        .arg(state_dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(log);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", broker.display()))?;
    let target = Target::Socket(state_dir.join("broker.sock"));
    let result = wait_all_up(&target, state_dir, hosts, timeout, &mut child).await;
    if !keep || result.is_err() {
        stop(&target, &mut child).await;
    }
    result
}

/// Where `rb demo` keeps its broker unless told otherwise (`rb status` looks there for a
/// `rb demo --keep` broker): `demo` in the private runtime root (`$XDG_RUNTIME_DIR/rb/demo`,
/// else `/tmp/rb-<uid>/demo`).
pub fn default_state_dir() -> PathBuf {
    privdir::runtime_root().join("demo")
}

/// Where the demo broker's log goes: inside its (private) state dir.
pub fn log_path(state_dir: &Path) -> PathBuf {
    state_dir.join("broker.log")
}

/// Opens a fresh log at `path` (in a verified private directory): a previous run's file is
/// removed (`unlink` never follows a link), and the new one is created with
/// `O_CREAT | O_EXCL | O_NOFOLLOW`, so nothing that appeared meanwhile is followed or reused.
fn new_log(path: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("cannot remove the old log {}", path.display()))
        }
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("cannot create the log {}", path.display()))
}

async fn wait_all_up(
    target: &Target,
    state_dir: &Path,
    hosts: usize,
    timeout: Duration,
    child: &mut Child,
) -> anyhow::Result<Vec<HostStatus>> {
    let deadline = Instant::now() + timeout;
    let mut last = Vec::new();
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!(
                "rb-broker exited early ({status}); see its log {}",
                log_path(state_dir).display()
            );
        }
        if let Ok(rows) = client::status(target).await {
            if rows.len() == hosts && rows.iter().all(|h| h.state == HostState::Up) {
                return Ok(rows);
            }
            last = rows;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let up = last.iter().filter(|h| h.state == HostState::Up).count();
    bail!(
        "only {up} of {hosts} virtual hosts came up within {} s",
        timeout.as_secs()
    )
}

async fn stop(target: &Target, child: &mut Child) {
    let _ = client::request(target, proto::msg::Request::Shutdown).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A program installed next to this one (see [`config::sibling_program`]).
pub fn sibling(name: &str) -> PathBuf {
    config::sibling_program(name)
}
