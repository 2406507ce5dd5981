//! The job's guardian on the front end: a process that outlives the agent and, once the
//! agent is gone (its exit, a crash or SIGKILL alike), ends what is left of the job on this
//! machine — the app's process group and every process whose environment carries the job's
//! tag [`JOB_TAG_VAR`] (pvmd and lamd call `setsid` and leave the group, the tag stays), and
//! the embedded broker the agent started for the job, if any, with its virtual hosts.
//! It is the subagent guardian's [`Watch`] applied to the app, as HTCondor's procd does for
//! a starter.
//!
//! The agent starts `rb-subagent guard-job --pgid PGID --tag TAG --grace-ms N` with its
//! stdin on a pipe whose write end only the agent holds (close-on-exec, so the app does not
//! inherit it): end-of-file on that pipe is the agent's end, however it came.

use std::{
    io::Read,
    os::fd::{AsFd, OwnedFd},
    process::{Child, ChildStdin, Command, Stdio},
    time::Duration,
};

use anyhow::Context;

use crate::watch::{Tree, Watch};

/// The environment variable that marks every process the job's app starts on the front end.
pub const JOB_TAG_VAR: &str = "RB_JOB_TAG";

/// The `rb-subagent` subcommand that runs the guardian.
pub const SUBCOMMAND: &str = "guard-job";

/// The tag of this agent's job: unique among the live agents on this machine, and known
/// before the job is registered (the embedded broker an agent starts carries it too).
pub fn job_tag() -> String {
    format!("agent.{}", std::process::id())
}

/// The running guardian, as the agent holds it. Dropping it closes the pipe, as the agent's
/// death does: either way the guardian then ends what is left of the job, and exits.
pub struct JobGuard {
    _child: Child,
    alive: ChildStdin,
}

impl JobGuard {
    /// Starts the guardian of the app whose process group is `pgid` and whose processes
    /// carry `JOB_TAG_VAR=tag`; at the end it gives them `grace` between SIGTERM and SIGKILL.
    pub fn spawn(pgid: i32, tag: &str, grace: Duration) -> anyhow::Result<JobGuard> {
        let program = crate::link::sibling("rb-subagent");
        let mut cmd = Command::new(&program);
        cmd.arg(SUBCOMMAND)
            .args(["--pgid", &pgid.to_string(), "--tag", tag])
            .args(["--grace-ms", &grace.as_millis().to_string()])
            // Not the job's own: an outer job's sweep must not take the inner job's guardian.
            .env_remove(JOB_TAG_VAR)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = crate::reaper::spawn_own(|| cmd.spawn(), |c| Some(c.id()))
            .with_context(|| format!("cannot start the job's guardian {}", program.display()))?;
        let alive = child.stdin.take().context("the guardian's pipe")?;
        Ok(JobGuard {
            _child: child,
            alive,
        })
    }
}

impl JobGuard {
    /// A second writer of the guardian's pipe, for [`report_adopted`] (the guardian sees
    /// the agent's end once every writer is closed).
    pub fn reporter(&self) -> Option<std::fs::File> {
        self.alive
            .as_fd()
            .try_clone_to_owned()
            .ok()
            .map(std::fs::File::from)
    }
}

/// Tells the guardian the processes the agent adopted that live now (pid and start time,
/// [`crate::reaper`]): one line `adopted PID:START …`, which replaces the previous one.
pub fn report_adopted(pipe: &mut std::fs::File, adopted: &[(i32, u64)]) -> std::io::Result<()> {
    use std::io::Write;
    let mut line = String::from(ADOPTED);
    for (pid, start) in adopted {
        line.push_str(&format!(" {pid}:{start}"));
    }
    line.push('\n');
    pipe.write_all(line.as_bytes())
}

/// The word that starts a line of [`report_adopted`].
const ADOPTED: &str = "adopted";

/// The processes of the last complete `adopted` line in `text`; lines that do not parse
/// are ignored.
fn last_adopted(text: &str) -> Option<Vec<(i32, u64)>> {
    let complete = &text[..text.rfind('\n')? + 1];
    complete.lines().rev().find_map(|line| {
        let mut words = line.split(' ');
        (words.next()? == ADOPTED).then_some(())?;
        words
            .map(|w| {
                let (pid, start) = w.split_once(':')?;
                let pid = pid.parse::<i32>().ok().filter(|p| *p > 1)?;
                Some((pid, start.parse().ok()?))
            })
            .collect()
    })
}

/// [`JobGuard::spawn`] for the app whose pid (its process group) is `pid`. When the guardian
/// cannot start, the job runs on without it, with a warning.
pub fn guard_app(pid: Option<u32>, tag: &str, grace: Duration) -> Option<JobGuard> {
    let pgid = i32::try_from(pid?).ok()?;
    match JobGuard::spawn(pgid, tag, grace) {
        Ok(guard) => Some(guard),
        Err(e) => {
            let error = format!("{e:#}");
            tracing::warn!(%error, "no guardian: a killed agent would leave the app running");
            None
        }
    }
}

/// What `rb-subagent guard-job` was asked to guard (the agent passes every flag).
#[derive(Debug, Clone, PartialEq, Eq, clap::Parser)]
#[command(
    name = "rb-subagent guard-job",
    about = "The job's guardian on the front end (started by `agent`, not by hand)"
)]
pub struct GuardArgs {
    /// The app's process group (above 1: 0 and 1 would name our own group and init's).
    #[arg(long, value_parser = clap::value_parser!(i32).range(2..))]
    pub pgid: i32,
    /// The job's tag: the value of RB_JOB_TAG in its processes' environment.
    #[arg(long, value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub tag: String,
    /// Time between SIGTERM and SIGKILL for what is left, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub grace_ms: u64,
}

/// Parses the arguments after the subcommand.
pub fn parse_args(args: &[String]) -> Result<GuardArgs, clap::Error> {
    use clap::Parser;
    let argv0 = format!("rb-subagent {SUBCOMMAND}");
    GuardArgs::try_parse_from(
        std::iter::once(argv0.as_str()).chain(args.iter().map(String::as_str)),
    )
}

/// `rb-subagent guard-job …`: waits for the agent to end (end-of-file on stdin), then ends
/// the app's group and the job's tagged processes. Returns the exit code.
pub fn guard_job(args: &[String]) -> i32 {
    let guard = match parse_args(args) {
        Ok(g) => g,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 64 } else { 0 };
        }
    };
    let Ok(pipe) = std::io::stdin().as_fd().try_clone_to_owned() else {
        eprintln!("rb-subagent {SUBCOMMAND}: no pipe from the agent on stdin");
        return 64;
    };
    // Our own session: the job's Ctrl-C and hang-up do not reach us.
    crate::subagent::detach_from_session();
    let adopted = read_until_end_of_file(pipe);
    let watch = Watch {
        pgid: guard.pgid,
        var: JOB_TAG_VAR,
        tag: guard.tag,
        tree: Tree::Roots(adopted),
    };
    if watch.alive() {
        watch.end(Duration::from_millis(guard.grace_ms));
    }
    0
}

/// Blocks until every writer of `pipe` is gone; returns the processes of the last
/// `adopted` line read ([`report_adopted`]).
fn read_until_end_of_file(pipe: OwnedFd) -> Vec<(i32, u64)> {
    let mut file = std::fs::File::from(pipe);
    let mut buf = [0u8; 4096];
    let mut pending = String::new();
    let mut adopted = Vec::new();
    loop {
        match file.read(&mut buf) {
            Ok(0) => return adopted,
            Ok(n) => {
                pending.push_str(&String::from_utf8_lossy(&buf[..n]));
                if let Some(last) = last_adopted(&pending) {
                    adopted = last;
                }
                if let Some(end) = pending.rfind('\n') {
                    pending.drain(..=end);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return adopted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_last_complete_adopted_line_counts() {
        assert_eq!(last_adopted(""), None);
        assert_eq!(last_adopted("adopted 40:7"), None, "no newline yet");
        assert_eq!(last_adopted("adopted\n"), Some(vec![]));
        let text = "adopted 40:7\nadopted 40:7 41:9\nadopted 99";
        assert_eq!(last_adopted(text), Some(vec![(40, 7), (41, 9)]));
        assert_eq!(last_adopted("adopted 1:5 x\n"), None);
        assert_eq!(last_adopted("adopted 40:7\nnoise\n"), Some(vec![(40, 7)]));
    }

    #[test]
    fn guard_arguments_need_a_real_group_and_a_tag() {
        assert_eq!(
            parse_args(&words("--pgid 4242 --tag job.3.77 --grace-ms 250")).expect("parses"),
            GuardArgs {
                pgid: 4242,
                tag: "job.3.77".into(),
                grace_ms: 250
            }
        );
        for bad in [
            "--pgid 0 --tag t",
            "--pgid 1 --tag t",
            "--tag t",
            "--pgid 9",
            "--pgid x --tag t",
            "--pgid 9 --tag t --what 1",
            "--pgid",
        ] {
            assert!(parse_args(&words(bad)).is_err(), "{bad}");
        }
    }
}
