//! The example applications on the local tier: a real broker with virtual hosts
//! on this machine (`local` transport), the job under a real `agent`, workers started by
//! the application itself with `rsh anyLinux`. rb-mw (examples/mw): the right count of
//! primes (against a plain sieve) on one host and growing onto several; a worker killed
//! mid-task and a host released mid-run have their tasks redone, each counted once; and,
//! with a pool hosted by hand, a `vacate` naming the workers re-queues their tasks at once
//! and their late results are ignored.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Write},
    os::unix::fs::PermissionsExt,
    process::{Command, Stdio},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tests::{
    jel_host_program, local_lab,
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

/// `--max-workers` bounds the workers alive or asked for: 40 waiting tasks are not 40 `rsh`.
#[test]
fn rb_mw_asks_for_no_more_than_max_workers_hosts() {
    let broker = Broker::start(&local_lab(4));
    broker.wait_all_up(Duration::from_secs(10));
    let n = 400_000;
    let mut args = job_args(rb_mw::PROGRAM, n, 40, 60);
    args.splice(1..1, ["--max-workers".to_string(), "2".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut job = MwJob::spawn(broker.agent(&args));
    let mut most = 0;
    let done = wait_until(END, || {
        most = most.max(broker.held_hosts().len());
        job.try_finished()
    });
    assert!(done.is_some(), "rb-mw did not end");
    let log = right_answer(&mut job, n);
    assert!(most >= 1, "it grew at all:\n{log}");
    assert!(
        most <= 2,
        "at most 2 hosts held at once, saw {most}:\n{log}"
    );
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

/// `vacate` listing our workers, which the agent cannot produce on this tier (every
/// member's host is the front end's name there): the pool is hosted by hand by the real
/// pool host (`rb-jel-host`, local members on host `front`) and `rsh` is a script that
/// runs the worker here. On `reclaim front`, the master re-queues every task at once and
/// starts new workers; the old ones finish their tasks (nobody sends them SIGTERM here)
/// and their late results are ignored: each task is counted once, the answer is right.
#[test]
fn on_vacate_the_tasks_are_requeued_at_once_and_late_results_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("jel.sock");
    let mut pool = Command::new(jel_host_program())
        .args([socket.as_os_str(), "front".as_ref()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("rb-jel-host");
    let mut events = pool.stdin.take().expect("stdin");
    let mut replies = BufReader::new(pool.stdout.take().expect("stdout")).lines();
    assert_eq!(
        replies.next().and_then(Result::ok).as_deref(),
        Some("ready")
    );
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    let rsh = bin.join("rsh");
    std::fs::write(&rsh, "#!/bin/sh\nshift\nexec /bin/sh -c \"$*\"\n").expect("rsh");
    std::fs::set_permissions(&rsh, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let n = 400_000;
    let mut master = Command::new(rb_mw::PROGRAM);
    master
        .args(["--primes-below", &n.to_string(), "--tasks", "4"])
        .args(["--task-ms", "2000"])
        .env("RB_JEL", &socket)
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()));
    let mut job = MwJob::spawn(master);
    let first = wait_until(Duration::from_secs(20), || {
        let given = assignments(&job.stderr());
        (given.len() == 4).then_some(given)
    })
    .unwrap_or_else(|| panic!("four tasks given out:\n{}", job.stderr()));
    let deadline = SystemTime::now() + Duration::from_secs(60);
    let ms = deadline
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_millis();
    writeln!(events, "reclaim front {ms}").expect("reclaim");
    assert_eq!(replies.next().and_then(Result::ok).as_deref(), Some("ok"));
    let log = right_answer(&mut job, n);
    let mut redone = requeued(&log);
    redone.sort_unstable();
    assert_eq!(redone, [0, 1, 2, 3], "every task re-queued:\n{log}");
    assert_eq!(
        log.matches("is on a vacated host").count(),
        4,
        "re-queued for the vacate:\n{log}"
    );
    assert_eq!(
        log.matches("the broker takes").count(),
        1,
        "one vacate, of host front:\n{log}"
    );
    for (task, pid) in first {
        let late = format!("result of task {task} from worker pid {pid} ignored");
        assert!(log.contains(&late), "{late}:\n{log}");
    }
    assert!(
        log.contains("4 tasks done in 8 runs (4 re-queued)"),
        "{log}"
    );
    drop(events);
    let _ = pool.wait();
}
