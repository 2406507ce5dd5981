//! `rb demo`: the embedded single-machine lab, end to end. Starts `rb-broker --embedded`
//! (virtual hosts on this machine, each with its own `rb-hostd`), waits until every host
//! is up, prints the status table, and stops the broker (unless `--keep`).

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
    let log = std::fs::File::create(state_dir.with_extension("log")).ok();
    std::fs::create_dir_all(state_dir)?;
    let mut cmd = Command::new(&broker);
    cmd.arg("--embedded")
        .arg("--hosts")
        .arg(hosts.to_string())
        .arg("--state-dir")
        .arg(state_dir);
    match log {
        Some(f) => cmd.stderr(f),
        None => cmd.stderr(Stdio::null()),
    };
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", broker.display()))?;
    let target = Target::Socket(state_dir.join("broker.sock"));
    let result = wait_all_up(&target, hosts, timeout, &mut child).await;
    if !keep || result.is_err() {
        stop(&target, &mut child).await;
    }
    result
}

async fn wait_all_up(
    target: &Target,
    hosts: usize,
    timeout: Duration,
    child: &mut Child,
) -> anyhow::Result<Vec<HostStatus>> {
    let deadline = Instant::now() + timeout;
    let mut last = Vec::new();
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("rb-broker exited early ({status}); see its log next to the state dir");
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

/// Where `rb demo` keeps its broker unless told otherwise (`rb status` looks there for a
/// `rb demo --keep` broker): `/tmp/rb-demo-<uid>`.
pub fn default_state_dir() -> PathBuf {
    PathBuf::from(format!("/tmp/rb-demo-{}", nix::unistd::getuid()))
}

/// A program installed next to this one (see [`config::sibling_program`]).
pub fn sibling(name: &str) -> PathBuf {
    config::sibling_program(name)
}
