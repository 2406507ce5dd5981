//! `rb check --probe`: asks the Slurm cluster of `[overflow.slurm]` once and says what it
//! found, or why it could not ask.
//!
//! Two questions: `squeue` (does the cluster answer, how many of its jobs are pilots of
//! ResourceBroker) and `sbatch --test-only` with exactly a pilot's options (partition,
//! lease, `sbatch_args`), which submits nothing but makes Slurm validate them and say
//! where and when a pilot would start. `squeue` alone cannot do the second: it filters by
//! partition on the client and accepts a partition the cluster does not have. A missing
//! program, a cluster that does not answer (no munge, controller down), an unknown
//! partition, account or QOS all show here rather than when the lab is full. Where compute
//! nodes cannot reach the broker (a loopback or wildcard `listen`) is said by
//! [`config::LabConfig::warnings`], which `rb check` prints with or without `--probe`.

use std::{
    io::Read,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use config::{SlurmOverflow, PILOT_JOB_PREFIX};

/// How long each Slurm command may take.
const PROBE_LIMIT: Duration = Duration::from_secs(15);

/// What the probe found: the queue and where a pilot would run, or what went wrong and
/// what to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// Slurm answered: jobs in the queue, how many are pilots, and `sbatch --test-only`'s
    /// answer for a pilot (e.g. "Job 12 to start at … on nodes node02 in partition p").
    Answered {
        jobs: usize,
        pilots: usize,
        test_only: String,
    },
    /// It did not: what happened, and a help line.
    Failed { what: String, help: String },
}

/// Runs `squeue --noheader --format=%j` once, then `sbatch --test-only` with a pilot's
/// options (the lease's warning is `warning`).
pub fn probe(slurm: &SlurmOverflow, warning: Duration) -> Probe {
    let names = match ask(&slurm.squeue, &["--noheader", "--format=%j"]) {
        Ok(out) => out,
        Err(failed) => return failed,
    };
    let mut args: Vec<String> = vec!["--test-only".into()];
    args.extend(slurm.pilot_options(&format!("{PILOT_JOB_PREFIX}-probe"), warning));
    args.extend(["--wrap".into(), "true".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // sbatch --test-only answers on stderr.
    let test_only = match ask_stderr(&slurm.sbatch, &args) {
        Ok(out) => out,
        Err(failed) => return failed,
    };
    let names: Vec<&str> = names.lines().filter(|l| !l.trim().is_empty()).collect();
    Probe::Answered {
        jobs: names.len(),
        pilots: names
            .iter()
            .filter(|n| n.starts_with(PILOT_JOB_PREFIX))
            .count(),
        test_only: test_only.trim().trim_start_matches("sbatch: ").to_string(),
    }
}

/// Runs `command args`; its stdout, or a [`Probe::Failed`].
fn ask(command: &[String], args: &[&str]) -> Result<String, Probe> {
    run(command, args).map(|(out, _)| out)
}

/// Runs `command args`; its stderr, or a [`Probe::Failed`].
fn ask_stderr(command: &[String], args: &[&str]) -> Result<String, Probe> {
    run(command, args).map(|(_, err)| err)
}

fn run(command: &[String], args: &[&str]) -> Result<(String, String), Probe> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]).args(args);
    let shown = command.join(" ");
    match run_with_limit(&mut cmd, PROBE_LIMIT) {
        Err(e) => Err(Probe::Failed {
            what: format!("cannot run `{shown}`: {e}"),
            help: "install Slurm's client commands (Debian: slurm-client) or set \
                   overflow.slurm.squeue/sbatch to the program's path"
                .into(),
        }),
        Ok(None) => Err(Probe::Failed {
            what: format!("`{shown}` did not answer within {PROBE_LIMIT:?}"),
            help: "is slurmctld running and reachable from here (`scontrol ping`)?".into(),
        }),
        Ok(Some((true, stdout, stderr))) => Ok((stdout, stderr)),
        Ok(Some((false, _, stderr))) => Err(Probe::Failed {
            what: format!("`{shown} {}` failed: {}", args.join(" "), stderr.trim()),
            help: "check overflow.slurm.partition against `sinfo -s` and sbatch_args against \
                   your account and QOS, and that this machine is a Slurm client (slurm.conf, \
                   munge)"
                .into(),
        }),
    }
}

/// Runs `cmd` (stdin null), killing it after `limit`: `Ok(None)` then, else whether it
/// succeeded with its stdout and stderr.
fn run_with_limit(
    cmd: &mut Command,
    limit: Duration,
) -> std::io::Result<Option<(bool, String, String)>> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Read both pipes on threads so a talkative program cannot block on a full pipe.
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let out_reader = std::thread::spawn(move || read_all(out.as_mut()));
    let err_reader = std::thread::spawn(move || read_all(err.as_mut()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Ok(status.map(|s| (s.success(), stdout, stderr)))
}

fn read_all(pipe: Option<&mut impl Read>) -> String {
    let mut s = String::new();
    if let Some(p) = pipe {
        let _ = p.read_to_string(&mut s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const WARN: Duration = Duration::from_secs(5);

    fn slurm(squeue: &[&str]) -> SlurmOverflow {
        let text = format!(
            "[broker]\nlisten = \"10.77.0.1:1\"\nstate_dir = \"/x\"\n[overflow.slurm]\nsqueue = {:?}\n",
            squeue
        );
        config::LabConfig::parse(&text, None)
            .expect("valid")
            .overflow
            .expect("slurm")
    }

    #[test]
    fn a_missing_program_says_how_to_fix_it() {
        let Probe::Failed { what, help } = probe(&slurm(&["/nonexistent/rb-squeue"]), WARN) else {
            panic!("a missing program cannot answer");
        };
        assert!(
            what.contains("cannot run `/nonexistent/rb-squeue`"),
            "{what}"
        );
        assert!(help.contains("slurm-client"), "{help}");
    }

    #[test]
    fn a_program_that_fails_shows_its_stderr() {
        let Probe::Failed { what, .. } = probe(
            &slurm(&["sh", "-c", "echo no cluster >&2; exit 1", "sh"]),
            WARN,
        ) else {
            panic!("a failing squeue is no answer");
        };
        assert!(
            what.contains("no cluster") && what.contains("--format=%j"),
            "{what}"
        );
    }
}
