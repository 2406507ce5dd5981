//! The example applications on the local tier (issue 18): a real broker with virtual hosts
//! on this machine (`local` transport), the job under a real `agent`, workers started by
//! the application itself with `rsh anyLinux`. rb-mw (examples/mw): the right count of
//! primes (against a plain sieve) on one host and growing onto several; a worker killed
//! mid-task and a host released mid-run have their tasks redone, each counted once.

use std::{collections::BTreeSet, process::Command, time::Duration};

use tests::{
    local_lab,
    mw::{answer, assignments, job_args, primes_below, requeued, MwJob},
    wait_until, Broker,
};

const END: Duration = Duration::from_secs(90);

/// Starts rb-mw as an adaptive job of `broker`.
fn start(broker: &Broker, n: usize, tasks: u32, task_ms: u32) -> MwJob {
    let args = job_args(rb_mw::PROGRAM, n, tasks, task_ms);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    MwJob::spawn(broker.agent(&args))
}

/// Waits for the end: exit 0 and the right answer; returns the master's log.
fn right_answer(job: &mut MwJob, n: usize) -> String {
    let (status, stdout) = job.wait(END);
    let log = job.stderr();
    assert_eq!(status.code(), Some(0), "{stdout}\n{log}");
    assert_eq!(answer(&stdout), Some(primes_below(n)), "{stdout}\n{log}");
    log
}

fn worker_pids(log: &str) -> BTreeSet<i32> {
    assignments(log).into_iter().map(|(_, pid)| pid).collect()
}

#[test]
fn rb_mw_counts_the_primes_on_one_host() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let n = 300_000;
    let mut job = start(&broker, n, 6, 100);
    let log = right_answer(&mut job, n);
    assert_eq!(worker_pids(&log).len(), 1, "one host, one worker:\n{log}");
    assert!(
        log.contains("6 tasks done in 6 runs (0 re-queued)"),
        "{log}"
    );
}

#[test]
fn rb_mw_grows_onto_several_virtual_hosts_while_tasks_wait() {
    let broker = Broker::start(&local_lab(4));
    broker.wait_all_up(Duration::from_secs(10));
    let n = 2_000_000;
    let mut job = start(&broker, n, 12, 600);
    let held = wait_until(Duration::from_secs(30), || {
        let held = broker.held_hosts();
        (held.len() >= 3).then_some(held)
    });
    let log = right_answer(&mut job, n);
    assert!(held.is_some(), "the job never held 3 hosts:\n{log}");
    assert!(worker_pids(&log).len() >= 3, "{log}");
}

#[test]
fn a_worker_killed_mid_task_has_its_task_redone() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let n = 500_000;
    let mut job = start(&broker, n, 6, 1_500);
    let (task, pid) = job.first_assignment(Duration::from_secs(30));
    let killed = Command::new("kill").args(["-9", &pid.to_string()]).status();
    assert!(killed.is_ok_and(|s| s.success()), "kill -9 {pid}");
    let log = right_answer(&mut job, n);
    assert!(requeued(&log).contains(&task), "task {task} redone:\n{log}");
    let again = assignments(&log).iter().filter(|(t, _)| *t == task).count();
    assert!(again >= 2, "task {task} given out again:\n{log}");
}

#[test]
fn a_host_released_mid_run_has_its_tasks_redone() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let n = 500_000;
    let mut job = start(&broker, n, 6, 1_500);
    // Both hosts have a worker with a task.
    wait_until(Duration::from_secs(30), || {
        (worker_pids(&job.stderr()).len() >= 2).then_some(())
    })
    .unwrap_or_else(|| panic!("two workers:\n{}", job.stderr()));
    let held = broker.held_hosts();
    let host = held.first().expect("the job holds a host");
    let out = broker.rb(&["release", host, "--grace-s", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = right_answer(&mut job, n);
    assert!(!requeued(&log).is_empty(), "a task redone:\n{log}");
}

#[test]
fn bad_flags_are_usage_and_exit_64() {
    for args in [
        &["--tasks", "4"][..],
        &["--primes-below", "100", "--tasks", "0"],
        &["--primes-below", "ten", "--tasks", "4"],
        &["--primes-below", "100", "--tasks", "4", "--frobnicate"],
    ] {
        let out = Command::new(rb_mw::PROGRAM)
            .args(args)
            .output()
            .expect("rb-mw");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains("usage: rb-mw"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn outside_a_job_rb_mw_says_so_and_exits_2() {
    let out = Command::new(rb_mw::PROGRAM)
        .args(["--primes-below", "100", "--tasks", "4"])
        .env_remove("RB_JEL")
        .output()
        .expect("rb-mw");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not inside a ResourceBroker job"),
        "{stderr}"
    );
}
