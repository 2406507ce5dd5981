//! Running the `rb-mw` example application (examples/mw) as a job and reading what it says:
//! the answer on its last stdout line, the master's log on stderr (which worker pid got
//! which task, what was re-queued), and the right answer from a plain sieve.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::Duration,
};

use crate::wait_until;

/// The primes below `n`, by a plain sieve of Eratosthenes.
pub fn primes_below(n: usize) -> usize {
    let mut composite = vec![false; n.max(2)];
    let mut count = 0;
    for i in 2..n {
        if composite[i] {
            continue;
        }
        count += 1;
        for j in (i * i..n).step_by(i) {
            composite[j] = true;
        }
    }
    count
}

/// The `agent … -- rb-mw ARGS -- '(adaptive=yes)'` words after `agent`'s own options.
pub fn job_args(program: &str, primes_below: usize, tasks: u32, task_ms: u32) -> Vec<String> {
    let mut args: Vec<String> = vec![program.into()];
    for (flag, value) in [
        ("--primes-below", primes_below.to_string()),
        ("--tasks", tasks.to_string()),
        ("--task-ms", task_ms.to_string()),
    ] {
        args.extend([flag.to_string(), value]);
    }
    args.extend(["--".into(), "(adaptive=yes)".into()]);
    args
}

/// A running `rb-mw` job, its stdout and stderr in files (read while it runs).
pub struct MwJob {
    child: Child,
    _dir: tempfile::TempDir,
    out: PathBuf,
    err: PathBuf,
}

impl MwJob {
    /// Starts `agent` (the command as the test's broker helper builds it).
    pub fn spawn(mut agent: Command) -> MwJob {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("stdout");
        let err = dir.path().join("stderr");
        let child = agent
            .stdin(Stdio::null())
            .stdout(File::create(&out).expect("stdout file"))
            .stderr(File::create(&err).expect("stderr file"))
            .spawn()
            .expect("agent");
        MwJob {
            child,
            _dir: dir,
            out,
            err,
        }
    }

    pub fn stderr(&self) -> String {
        read(&self.err)
    }

    /// `Some` once the job has ended (then [`MwJob::wait`] returns at once).
    pub fn try_finished(&mut self) -> Option<()> {
        self.child.try_wait().ok().flatten().map(|_| ())
    }

    /// Waits for the job's end; its status and stdout. Panics with the log past `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> (ExitStatus, String) {
        let child = &mut self.child;
        let Some(status) = wait_until(timeout, || child.try_wait().ok().flatten()) else {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!("rb-mw did not end within {timeout:?}:\n{}", self.stderr());
        };
        (status, read(&self.out))
    }

    /// Waits for the first task given to a worker: (task, worker pid).
    pub fn first_assignment(&self, timeout: Duration) -> (u32, i32) {
        wait_until(timeout, || assignments(&self.stderr()).first().copied())
            .unwrap_or_else(|| panic!("no task was given out:\n{}", self.stderr()))
    }
}

impl Drop for MwJob {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The master's `task K [LO,HI) to worker pid P (member M) on HOST` lines: (K, P).
pub fn assignments(log: &str) -> Vec<(u32, i32)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("rb-mw: task ")?;
            let (task, rest) = rest.split_once(' ')?;
            let pid = rest.split_once(" to worker pid ")?.1.split(' ').next()?;
            Some((task.parse().ok()?, pid.parse().ok()?))
        })
        .collect()
}

/// The tasks the master re-queued (`task K re-queued: …` lines).
pub fn requeued(log: &str) -> Vec<u32> {
    log.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("rb-mw: task ")?;
            let (task, rest) = rest.split_once(' ')?;
            rest.starts_with("re-queued").then(|| task.parse().ok())?
        })
        .collect()
}

/// The answer: the last stdout line `primes=<count>`.
pub fn answer(stdout: &str) -> Option<usize> {
    stdout.lines().last()?.strip_prefix("primes=")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sieve_counts_the_known_values() {
        assert_eq!(
            [0, 2, 3, 10, 100, 1000].map(primes_below),
            [0, 0, 1, 4, 25, 168]
        );
    }

    #[test]
    fn the_masters_log_is_read() {
        let log = "rb-mw: task 3 [10,20) to worker pid 77 (member 2) on node03\n\
                   rb-mw: task 3 re-queued: worker pid 77 (member 2) died\n";
        assert_eq!(assignments(log), [(3, 77)]);
        assert_eq!(requeued(log), [3]);
        assert_eq!(answer("x\nprimes=25\n"), Some(25));
        assert_eq!(answer("primes=25\nmore\n"), None);
    }
}
