//! The shell side of overflow onto Slurm (issue 19): runs `sbatch` for the allocation
//! core's [`Effect::SubmitPilot`](allocation::Effect) and `scancel` for its `CancelPilot`,
//! and reports `sbatch`'s answer back to the core as an event. It decides nothing: what to
//! submit or cancel, and when to retry, is the core's (`allocation/src/overflow.rs`).
//!
//! At start it lists the pilots Slurm still has under this broker's job name (a run before
//! a restart) for the core to adopt or cancel.
//!
//! A pilot is `sbatch --parsable` with [`SlurmOverflow::pilot_options`] and the
//! [`PilotScript`] on stdin, named `rb-pilot-<owner>` so that `squeue` shows whose it is.

use std::{net::SocketAddr, path::Path, process::Stdio, time::Duration};

use allocation::PilotId;
use config::{pilot::PilotScript, SlurmOverflow, PILOT_JOB_PREFIX};
use tokio::{io::AsyncWriteExt, process::Command};
use tracing::{info, warn};

use crate::core::{Event, EventSender};

/// How long one Slurm command may take.
const SLURM_LIMIT: Duration = Duration::from_secs(30);

/// Runs the Slurm commands of `[overflow.slurm]`.
#[derive(Debug, Clone)]
pub struct Pilots {
    slurm: SlurmOverflow,
    script: String,
    job_name: String,
    options: Vec<String>,
    events: EventSender,
}

impl Pilots {
    /// Pilots whose `rb-hostd` (at `hostd` on the nodes) reports to `broker` with the lab
    /// secret `secret_file`; Slurm warns them `warning` before the lease ends.
    pub fn new(
        slurm: SlurmOverflow,
        hostd: &Path,
        broker: SocketAddr,
        secret_file: &Path,
        warning: Duration,
        owner: &str,
        events: EventSender,
    ) -> Self {
        let script = PilotScript {
            hostd,
            broker,
            secret_file,
        }
        .text();
        let name: String = owner
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let job_name = format!("{PILOT_JOB_PREFIX}-{name}");
        let mut options = vec!["--parsable".to_string()];
        options.extend(slurm.pilot_options(&job_name, warning));
        Pilots {
            slurm,
            script,
            job_name,
            options,
            events,
        }
    }

    /// Finds this broker's pilots that Slurm still has (by job name, e.g. of a run before
    /// a restart) in the background; the answer comes back as [`Event::PilotsFound`].
    pub fn find(&self) {
        let this = self.clone();
        tokio::spawn(async move {
            let name = format!("--name={}", this.job_name);
            match this
                .run(&this.slurm.squeue, &["--noheader", &name, "--format=%i"])
                .await
            {
                Ok(out) => {
                    let ids: Vec<String> = out.split_whitespace().map(str::to_string).collect();
                    if !ids.is_empty() {
                        info!(jobs = %ids.join(","), "Slurm pilots of an earlier run found");
                    }
                    let _ = this.events.send(Event::PilotsFound { ids }).await;
                }
                Err(why) => warn!(%why, "cannot list this broker's Slurm pilots"),
            }
        });
    }

    /// Submits pilot `pilot` in the background; the answer comes back as
    /// [`Event::PilotSubmitted`].
    pub fn submit(&self, pilot: PilotId) {
        let this = self.clone();
        tokio::spawn(async move {
            let result = this.sbatch().await;
            match &result {
                Ok(id) => info!(pilot, slurm_job = %id, "Slurm pilot submitted"),
                Err(why) => warn!(pilot, %why, "Slurm pilot not submitted"),
            }
            let _ = this
                .events
                .send(Event::PilotSubmitted { pilot, result })
                .await;
        });
    }

    /// Asks Slurm how long `slurm_job`'s lease has left (`squeue --format=%L`: Slurm's
    /// clock and its time limit, which an admin may have changed) in the background; the
    /// answer comes back as [`Event::PilotLeaseLeft`] (`left: None` when Slurm did not say).
    pub fn lease_left(&self, host: String, slurm_job: String, ending: bool) {
        let this = self.clone();
        tokio::spawn(async move {
            let job = format!("--jobs={slurm_job}");
            let args = ["--noheader", job.as_str(), "--format=%L"];
            let left = match this.run(&this.slurm.squeue, &args).await {
                Ok(out) => parse_time_left(&out),
                Err(why) => {
                    warn!(%host, %slurm_job, %why, "cannot ask Slurm for a pilot's lease");
                    None
                }
            };
            let said = Event::PilotLeaseLeft {
                host,
                slurm_job,
                ending,
                left,
            };
            let _ = this.events.send(said).await;
        });
    }

    /// Cancels Slurm job `slurm_id` in the background.
    pub fn cancel(&self, pilot: PilotId, slurm_id: String) {
        let this = self.clone();
        tokio::spawn(async move {
            match this.scancel(std::slice::from_ref(&slurm_id)).await {
                Ok(()) => {
                    info!(pilot, slurm_job = %slurm_id, "Slurm pilot cancelled: nobody waits for it")
                }
                Err(why) => {
                    warn!(pilot, slurm_job = %slurm_id, %why, "cannot cancel a Slurm pilot")
                }
            }
        });
    }

    /// Cancels `ids` and waits for `scancel` (at shutdown).
    pub async fn cancel_now(&self, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        match self.scancel(&ids).await {
            Ok(()) => info!(jobs = %ids.join(","), "Slurm pilots cancelled at shutdown"),
            Err(why) => {
                warn!(jobs = %ids.join(","), %why, "cannot cancel Slurm pilots at shutdown")
            }
        }
    }

    /// `sbatch --parsable …` with the script on stdin: the job id, or why not.
    async fn sbatch(&self) -> Result<String, String> {
        let mut cmd = Command::new(&self.slurm.sbatch[0]);
        cmd.args(&self.slurm.sbatch[1..])
            .args(&self.options)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| format!("cannot run sbatch: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(self.script.as_bytes())
                .await
                .map_err(|e| format!("cannot write the pilot script to sbatch: {e}"))?;
        }
        let out = tokio::time::timeout(SLURM_LIMIT, child.wait_with_output())
            .await
            .map_err(|_| format!("sbatch did not answer within {SLURM_LIMIT:?}"))?
            .map_err(|e| format!("sbatch: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "sbatch failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        parse_job_id(&String::from_utf8_lossy(&out.stdout))
    }

    async fn scancel(&self, ids: &[String]) -> Result<(), String> {
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        self.run(&self.slurm.scancel, &ids).await.map(drop)
    }

    /// Runs `command args` (stdin null) with a time limit: its stdout, or why not.
    async fn run(&self, command: &[String], args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(&command[0]);
        cmd.args(&command[1..])
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let shown = command.join(" ");
        let out = tokio::time::timeout(SLURM_LIMIT, cmd.output())
            .await
            .map_err(|_| format!("`{shown}` did not answer within {SLURM_LIMIT:?}"))?
            .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }
}

/// Slurm's time left (`squeue --format=%L`): `[days-][hours:]minutes:seconds`; `None` for
/// `UNLIMITED`, `NOT_SET`, `INVALID` or anything else.
fn parse_time_left(stdout: &str) -> Option<Duration> {
    let text = stdout.split_whitespace().next()?;
    let (days, clock) = match text.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().ok()?, rest),
        None => (0, text),
    };
    let parts: Vec<u64> = clock
        .split(':')
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    let (h, m, s) = match parts[..] {
        [m, s] => (0, m, s),
        [h, m, s] => (h, m, s),
        _ => return None,
    };
    Some(Duration::from_secs(((days * 24 + h) * 60 + m) * 60 + s))
}

/// `sbatch --parsable` prints `ID` or `ID;CLUSTER`.
fn parse_job_id(stdout: &str) -> Result<String, String> {
    let id = stdout.trim().split(';').next().unwrap_or_default();
    if config::pilot::is_slurm_job_id(id) {
        Ok(id.to_string())
    } else {
        Err(format!(
            "sbatch --parsable printed {:?}, not a job id",
            stdout.trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_slurms_time_left() {
        let secs = |s: &str| parse_time_left(s).map(|d| d.as_secs());
        assert_eq!(secs("4:52\n"), Some(292));
        assert_eq!(secs("1:00:05"), Some(3605));
        assert_eq!(secs("2-03:04:05"), Some(((2 * 24 + 3) * 60 + 4) * 60 + 5));
        assert_eq!(secs("0:00"), Some(0));
        for none in [
            "UNLIMITED",
            "NOT_SET",
            "INVALID",
            "",
            "1:2:3:4",
            "-1:00",
            "a:b",
        ] {
            assert_eq!(secs(none), None, "{none}");
        }
    }

    #[test]
    fn parses_what_sbatch_parsable_prints() {
        assert_eq!(parse_job_id("4242\n"), Ok("4242".into()));
        assert_eq!(parse_job_id("17;cluster2\n"), Ok("17".into()));
        assert!(parse_job_id("Submitted batch job 3\n").is_err());
        assert!(parse_job_id("").is_err());
    }
}
