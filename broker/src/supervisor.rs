//! Host-daemon supervision: one task per host keeps its daemon running through the
//! transport, restarts it with exponential backoff when it exits, and kills and restarts it
//! when the core says the host went silent.
//!
//! The daemon's stdin is a pipe the supervisor holds: closing it (or the supervisor dying)
//! is the daemon's lifeline signal to exit, over ssh/rsh as well as locally.

use std::{collections::HashMap, process::Stdio, time::Duration};

use config::HostEntry;
use tokio::{
    process::{Child, Command},
    sync::mpsc,
    time::Instant,
};
use tracing::{debug, info, warn};

use crate::{
    core::{Event, EventSender},
    transport::{log_path, LaunchSpec},
};

const BACKOFF_MIN: Duration = Duration::from_millis(250);
/// A daemon that ran this long resets the backoff.
const STABLE_RUN: Duration = Duration::from_secs(10);
/// How long a stopping daemon gets after its lifeline closes before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Largest daemon log kept; a bigger one is truncated on the next start.
const LOG_LIMIT: u64 = 4 << 20;

enum Command_ {
    Restart(String),
    Stop,
}

/// Handles to every host's supervisor task.
#[derive(Default)]
pub struct SupervisorSet {
    tasks: HashMap<String, (mpsc::Sender<Command_>, tokio::task::JoinHandle<()>)>,
}

impl SupervisorSet {
    /// Starts one supervisor per host (none for the manual transport).
    pub fn spawn(
        hosts: &[HostEntry],
        spec: &LaunchSpec,
        events: EventSender,
        backoff_max: Duration,
    ) -> Self {
        let mut tasks = HashMap::new();
        for host in hosts {
            let Some(argv) = spec.command(host) else {
                continue;
            };
            let (tx, rx) = mpsc::channel(8);
            let sup = Supervisor {
                host: host.name.clone(),
                argv,
                log: log_path(&spec.state_dir, &host.name),
                events: events.clone(),
                backoff_max,
            };
            let _ = std::fs::create_dir_all(spec.host_dir(&host.name));
            tasks.insert(host.name.clone(), (tx, tokio::spawn(sup.run(rx))));
        }
        Self { tasks }
    }

    /// Asks `host`'s supervisor to kill and restart its daemon.
    pub fn restart(&self, host: &str, reason: &str) {
        if let Some((tx, _)) = self.tasks.get(host) {
            let _ = tx.try_send(Command_::Restart(reason.to_string()));
        }
    }

    /// Stops every daemon (lifeline first, then SIGKILL after a grace period) and waits.
    pub async fn shutdown(self) {
        let mut joins = Vec::new();
        for (_, (tx, join)) in self.tasks {
            let _ = tx.send(Command_::Stop).await;
            joins.push(join);
        }
        for join in joins {
            let _ = join.await;
        }
    }
}

struct Supervisor {
    host: String,
    argv: Vec<String>,
    log: std::path::PathBuf,
    events: EventSender,
    backoff_max: Duration,
}

impl Supervisor {
    async fn run(self, mut commands: mpsc::Receiver<Command_>) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let started = Instant::now();
            let outcome = match self.spawn() {
                Ok(child) => {
                    let _ = self
                        .events
                        .send(Event::DaemonStarted {
                            host: self.host.clone(),
                        })
                        .await;
                    self.watch(child, &mut commands).await
                }
                Err(e) => {
                    warn!(host = %self.host, error = %e, program = %self.argv[0], "cannot start host daemon");
                    Outcome::Exited(format!("cannot start {}: {e}", self.argv[0]))
                }
            };
            let how = match outcome {
                Outcome::Stop => return,
                Outcome::Exited(how) => how,
                Outcome::Restarted(reason) => format!("killed for restart ({reason})"),
            };
            let _ = self
                .events
                .send(Event::DaemonExited {
                    host: self.host.clone(),
                    how,
                })
                .await;
            if started.elapsed() >= STABLE_RUN {
                backoff = BACKOFF_MIN;
            }
            debug!(host = %self.host, delay_ms = backoff.as_millis() as u64, "restarting after backoff");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                cmd = commands.recv() => if matches!(cmd, None | Some(Command_::Stop)) { return },
            }
            backoff = (backoff * 2).min(self.backoff_max);
        }
    }

    fn spawn(&self) -> std::io::Result<Child> {
        if let Some(dir) = self.log.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let truncate = std::fs::metadata(&self.log).is_ok_and(|m| m.len() > LOG_LIMIT);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(!truncate)
            .write(true)
            .truncate(truncate)
            .open(&self.log)?;
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true);
        let child = cmd.spawn()?;
        info!(host = %self.host, pid = child.id(), "host daemon started");
        Ok(child)
    }

    async fn watch(&self, mut child: Child, commands: &mut mpsc::Receiver<Command_>) -> Outcome {
        // Held here, not in `child`: tokio's `Child::wait` closes the child's stdin, and the
        // daemon treats that as its lifeline closing.
        let lifeline = child.stdin.take();
        tokio::select! {
            status = child.wait() => {
                let how = status.map_or_else(|e| format!("wait failed: {e}"), |s| s.to_string());
                info!(host = %self.host, %how, "host daemon exited");
                Outcome::Exited(how)
            }
            cmd = commands.recv() => match cmd {
                Some(Command_::Restart(reason)) => {
                    kill_group(&mut child).await;
                    Outcome::Restarted(reason)
                }
                Some(Command_::Stop) | None => {
                    drop(lifeline);
                    stop_gracefully(child).await;
                    Outcome::Stop
                }
            },
        }
    }
}

enum Outcome {
    Exited(String),
    Restarted(String),
    Stop,
}

/// SIGKILL the daemon's whole process group (the transport and anything it started here).
async fn kill_group(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.wait().await;
}

/// Once the lifeline is closed: give the daemon time to leave, then kill what remains.
async fn stop_gracefully(mut child: Child) {
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        kill_group(&mut child).await;
    }
}
