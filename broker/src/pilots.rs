//! The shell side of overflow onto Slurm: runs `sbatch` for the allocation
//! core's [`Effect::SubmitPilot`](allocation::Effect) and `scancel` for its `CancelPilot`,
//! and reports `sbatch`'s answer back to the core as an event. It decides nothing: what to
//! submit or cancel, and when to retry, is the core's (`allocation/src/overflow.rs`).
//!
//! At start it lists the pilots Slurm still has under this broker's job name (a run before
//! a restart) for the core to adopt or cancel.
//!
//! A pilot is `sbatch --parsable` with [`SlurmOverflow::pilot_options`] and the
//! [`PilotScript`] on stdin, named `rb-pilot-<owner>` so that `squeue` shows whose it is.
//!
//! How long a pilot's node has left is Slurm's word: the job's end time (`squeue %e`), which
//! Slurm moves when it preempts the job (to now + the partition's `GraceTime`) or an
//! administrator changes its limit. A job Slurm is already ending (`scancel`, or past its
//! end) has `KillWait` left (`scontrol show config`, read once).

use std::{
    net::SocketAddr,
    path::Path,
    process::Stdio,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use allocation::PilotId;
use config::{pilot::PilotScript, SlurmOverflow, PILOT_JOB_PREFIX};
use tokio::{io::AsyncWriteExt, process::Command, sync::OnceCell};
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
    /// Slurm's `KillWait`, once read.
    kill_wait: Arc<OnceCell<Duration>>,
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
            kill_wait: Arc::default(),
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

    /// Asks Slurm how long `slurm_job`'s node has left in the background (see the module
    /// docs; `ending`: the daemon got Slurm's notice, so a job Slurm is ending has its
    /// `KillWait` left); the answer comes back as [`Event::PilotLeaseLeft`] (`left: None`
    /// when Slurm did not say).
    pub fn lease_left(&self, host: String, slurm_job: String, ending: bool) {
        let this = self.clone();
        tokio::spawn(async move {
            let left = match this.job_end(&slurm_job).await {
                Ok(end) => match end.left(SystemTime::now()) {
                    Some(left) => Some(left),
                    None if ending => this.kill_wait().await,
                    None => None,
                },
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

    /// `squeue` on `slurm_job`: its state and end time (Unix seconds: `SLURM_TIME_FORMAT=%s`,
    /// so no time zone is involved).
    async fn job_end(&self, slurm_job: &str) -> Result<JobEnd, String> {
        let job = format!("--jobs={slurm_job}");
        let args = ["--noheader", job.as_str(), "--format=%T %e"];
        let out = self
            .run_env(&self.slurm.squeue, &args, &[("SLURM_TIME_FORMAT", "%s")])
            .await?;
        Ok(JobEnd::parse(&out))
    }

    /// Slurm's `KillWait` (`scontrol show config`), read at the first need and kept; `None`
    /// (asked again next time) when Slurm did not say.
    async fn kill_wait(&self) -> Option<Duration> {
        let read = self.kill_wait.get_or_try_init(|| async {
            let out = self.run(&self.slurm.scontrol, &["show", "config"]).await?;
            parse_kill_wait(&out).ok_or_else(|| "no KillWait in `scontrol show config`".into())
        });
        read.await
            .map_err(|why: String| warn!(%why, "cannot read Slurm's KillWait"))
            .ok()
            .copied()
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
        self.run_env(command, args, &[]).await
    }

    /// [`Pilots::run`] with `env` added to the command's environment.
    async fn run_env(
        &self,
        command: &[String],
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<String, String> {
        let mut cmd = Command::new(&command[0]);
        cmd.args(&command[1..])
            .args(args)
            .envs(env.iter().copied())
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

/// A job's state and end as `squeue --format="%T %e"` prints them with
/// `SLURM_TIME_FORMAT=%s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct JobEnd {
    running: bool,
    /// Unix seconds; `None` for no limit (`Unknown`, `NONE`) or no such job (empty output).
    end: Option<u64>,
}

impl JobEnd {
    fn parse(stdout: &str) -> JobEnd {
        let mut words = stdout.split_whitespace();
        let running = words.next() == Some("RUNNING");
        let end = words.next().and_then(|e| e.parse().ok());
        JobEnd { running, end }
    }

    /// How long the running job has until its end at `now`; `None` when it is not running,
    /// has no end, or is past it (Slurm is ending it).
    fn left(self, now: SystemTime) -> Option<Duration> {
        let end = UNIX_EPOCH + Duration::from_secs(self.end?);
        let left = end.duration_since(now).ok()?;
        (self.running && !left.is_zero()).then_some(left)
    }
}

/// `KillWait` from `scontrol show config` (`KillWait                = 30 sec`).
fn parse_kill_wait(stdout: &str) -> Option<Duration> {
    stdout.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        if key.trim() != "KillWait" {
            return None;
        }
        let secs = value.split_whitespace().next()?.parse().ok()?;
        Some(Duration::from_secs(secs))
    })
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
    fn a_running_jobs_end_is_its_time_left() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let left = |s: &str| JobEnd::parse(s).left(now).map(|d| d.as_secs());
        assert_eq!(left("RUNNING 1000292\n"), Some(292));
        // Preempted: Slurm moved the end to now + GraceTime; the job still runs.
        assert_eq!(left("RUNNING 1000015"), Some(15));
        // Past its end (Slurm's periodic check not yet run), or being ended.
        assert_eq!(left("RUNNING 999990"), None);
        assert_eq!(left("RUNNING 1000000"), None);
        assert_eq!(left("COMPLETING 1000300"), None);
        assert_eq!(left("PENDING 1000300"), None);
        // No limit, no such job, or not what squeue prints.
        for none in ["RUNNING Unknown", "RUNNING NONE", "", "RUNNING", "1000300"] {
            assert_eq!(left(none), None, "{none:?}");
        }
    }

    #[test]
    fn reads_kill_wait_from_scontrol_show_config() {
        let config = "JobCompType             = jobcomp/none\n\
                      KillOnBadExit           = 0\n\
                      KillWait                = 30 sec\n\
                      LaunchParameters        = (null)\n";
        assert_eq!(parse_kill_wait(config), Some(Duration::from_secs(30)));
        assert_eq!(
            parse_kill_wait("KillWait = 2 sec"),
            Some(Duration::from_secs(2))
        );
        assert_eq!(parse_kill_wait("KillOnBadExit = 0\n"), None);
        assert_eq!(parse_kill_wait("KillWait = soon\n"), None);
        assert_eq!(parse_kill_wait(""), None);
    }

    #[test]
    fn parses_what_sbatch_parsable_prints() {
        assert_eq!(parse_job_id("4242\n"), Ok("4242".into()));
        assert_eq!(parse_job_id("17;cluster2\n"), Ok("17".into()));
        assert!(parse_job_id("Submitted batch job 3\n").is_err());
        assert!(parse_job_id("").is_err());
    }
}
