//! Tier 2: nothing a job starts on its front end outlives it, tracked by what a process
//! cannot erase (the agent is the job's child subreaper), not only by the environment tag:
//! `setsid env -i …` and a daemon that writes over its environment (as OpenSSH's
//! ControlPersist master does) end with the job, whether the agent ends normally or is
//! SIGKILLed; an unrelated process of the same user is never touched.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use tests::{bin_dir, local_lab, wait_until, Broker};

/// The agent's grace (`--grace-s 1` in [`Broker::agent`]) plus one second.
const GRACE_PLUS_ONE: Duration = Duration::from_secs(2);

/// `tests/programs/clear_environ.c` compiled next to the workspace's binaries, or `None`
/// (with the reason printed) when there is no C compiler.
fn clear_environ_program(test: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/clear_environ.c");
    let out = bin_dir().join(format!("clear_environ-{}-{test}", std::process::id()));
    let built = Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status();
    match built {
        Ok(s) if s.success() => Some(out),
        other => {
            eprintln!(
                "skipped: cannot compile {} with cc ({other:?})",
                src.display()
            );
            None
        }
    }
}

/// Pids of this user's processes whose whole command line is `pattern` (a regex, anchored).
fn pids(pattern: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-u", &nix::unistd::getuid().to_string(), "-f"])
        .arg(format!("^{pattern}$"))
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// An unrelated `sleep` of the same user, outside any job: it must outlive every job.
struct Bystander(Child);

impl Bystander {
    fn start(seconds: &str) -> Self {
        let child = Command::new("sleep")
            .arg(seconds)
            .env_remove("RB_JOB_TAG")
            .stdin(Stdio::null())
            .spawn()
            .expect("sleep");
        Bystander(child)
    }

    fn still_runs(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn what_a_job_abandons_on_its_front_end_ends_with_it_whatever_it_erased() {
    let Some(daemon) = clear_environ_program("ends") else {
        return;
    };
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let id = std::process::id();
    let (sleep_s, daemon_marker) = (format!("2002.{id}"), format!("rbescape{id}"));
    let mut bystander = Bystander::start(&format!("2002.{id}1"));
    let script = format!(
        "setsid env -i sh -c 'sleep {sleep_s} >/dev/null 2>&1 </dev/null &'\n\
         {daemon} 600 {daemon_marker}",
        daemon = daemon.display()
    );
    let out = broker
        .agent(&["sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("agent");
    assert!(
        out.status.success(),
        "agent: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sleep_pattern = format!("sleep {}", sleep_s.replace('.', "\\."));
    let daemon_pattern = format!("{} 600 {daemon_marker}", daemon.display());
    let gone = wait_until(GRACE_PLUS_ONE, || {
        (pids(&sleep_pattern).is_empty() && pids(&daemon_pattern).is_empty()).then_some(())
    });
    assert!(
        gone.is_some(),
        "the job's processes outlived it by {GRACE_PLUS_ONE:?}: setsid env -i sleep {:?}, \
         daemon with its environment erased {:?}",
        pids(&sleep_pattern),
        pids(&daemon_pattern)
    );
    assert!(
        bystander.still_runs(),
        "an unrelated sleep of the same user was ended"
    );
    let _ = std::fs::remove_file(daemon);
}

#[test]
fn a_daemon_that_erased_its_environment_ends_even_when_the_agent_is_sigkilled() {
    let Some(daemon) = clear_environ_program("killed") else {
        return;
    };
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let id = std::process::id();
    let marker = format!("rbkilled{id}");
    let mut bystander = Bystander::start(&format!("2002.{id}2"));
    let script = format!("{} 600 {marker}; sleep 300", daemon.display());
    let mut agent = broker
        .agent(&["sh", "-c", &script])
        .env("RB_LOG", "agent=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent");
    let pattern = format!("{} 600 {marker}", daemon.display());
    let daemon_pid =
        wait_until(Duration::from_secs(10), || pids(&pattern).pop()).expect("the daemon started");
    // The agent tells its guardian which abandoned processes live (at most a second after
    // it adopted them): wait for the line that names the daemon.
    let (lines_tx, lines) = mpsc::channel();
    let stderr = agent.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let reported = wait_until(Duration::from_secs(10), || {
        lines
            .try_iter()
            .find(|l| l.contains("abandoned processes") && l.contains(&format!("({daemon_pid}, ")))
    });
    assert!(reported.is_some(), "the agent never reported the daemon");
    agent.kill().expect("SIGKILL agent");
    let _ = agent.wait();
    let gone = wait_until(Duration::from_secs(10), || {
        pids(&pattern).is_empty().then_some(())
    });
    assert!(
        gone.is_some(),
        "the daemon outlived its SIGKILLed agent by 10 s"
    );
    assert!(
        bystander.still_runs(),
        "an unrelated sleep of the same user was ended"
    );
    let _ = std::fs::remove_file(daemon);
}
