//! `rb-bnb`, the branch-and-bound example application, local tier: a real agent
//! with virtual hosts. The answer is checked against `rb-bnb --brute-force` (every tour
//! tried) while the job grows onto granted hosts, loses one to `rb release` (its `vacate`
//! hands the task on), and loses a worker to SIGKILL (`died`).

use std::time::Duration;

use tests::{
    apps::{bnb_brute_force as brute_force, last_line, RB_BNB},
    bin, local_lab,
    mw::MwJob,
    wait_until, Broker,
};

const END: Duration = Duration::from_secs(120);

/// `agent rb-bnb --cities C --seed S --task-ms MS -- '(adaptive=yes)'`, its output in files.
fn start_job(broker: &Broker, cities: u32, seed: u32, task_ms: u32) -> MwJob {
    let bnb = bin("rb-bnb").display().to_string();
    let (c, s, ms) = (cities.to_string(), seed.to_string(), task_ms.to_string());
    let mut agent = broker.agent(&[
        &bnb,
        "--cities",
        &c,
        "--seed",
        &s,
        "--task-ms",
        &ms,
        "--",
        "(adaptive=yes)",
    ]);
    agent.env_remove("RB_JEL");
    MwJob::spawn(agent)
}

/// Waits for the end: exit 0; (last line of stdout, stderr).
fn finish(mut job: MwJob) -> (String, String) {
    let (status, stdout) = job.wait(END);
    let err = job.stderr();
    assert_eq!(status.code(), Some(0), "the job failed: {err}");
    (last_line(&stdout), err)
}

/// The pid of a worker on `host` (any granted host when `None`) the master has handed a
/// task to (`rb-bnb: task K to the worker pid P on HOST`).
fn worker_with_a_task(job: &MwJob, host: Option<&str>) -> i32 {
    wait_until(Duration::from_secs(30), || {
        job.stderr().lines().find_map(|l| {
            let rest = l.strip_prefix("rb-bnb: task ")?;
            let (_, who) = rest.split_once(" to the worker pid ")?;
            let (pid, on) = who.split_once(" on ")?;
            host.is_none_or(|h| h == on).then(|| pid.parse().ok())?
        })
    })
    .unwrap_or_else(|| panic!("no task went to a worker on {host:?}:\n{}", job.stderr()))
}

#[test]
fn it_grows_onto_granted_hosts_and_finds_the_optimum() {
    let broker = Broker::start(&local_lab(3));
    broker.wait_all_up(Duration::from_secs(10));
    let job = start_job(&broker, 10, 7, 10);
    let (last, err) = finish(job);
    assert_eq!(last, brute_force(10, 7), "{err}");
    assert!(
        RB_BNB.count(&err, "workers on granted hosts") >= 2,
        "it grew onto the free hosts: {err}"
    );
}

#[test]
fn a_released_host_hands_its_task_on_and_the_answer_stays_right() {
    let broker = Broker::start(&local_lab(3));
    broker.wait_all_up(Duration::from_secs(10));
    // 504 tasks of at least 40 ms: about 5 s on 4 workers, so the release comes mid-run
    // while every worker holds a task.
    let job = start_job(&broker, 10, 11, 40);
    // Its worker there holds a task (the tasks outnumber the workers all through the run).
    worker_with_a_task(&job, Some("vhost01"));
    let out = broker.rb(&["release", "vhost01", "--grace-s", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (last, err) = finish(job);
    assert_eq!(last, brute_force(10, 11), "{err}");
    assert!(
        RB_BNB.count(&err, "at a vacate") >= 1,
        "the vacated worker's task was handed on at the vacate: {err}"
    );
}

#[test]
fn a_worker_killed_mid_task_is_seen_dead_and_its_task_is_redone() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let seed = 4242;
    let job = start_job(&broker, 10, seed, 40);
    let pid = worker_with_a_task(&job, None);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the worker");
    let (last, err) = finish(job);
    assert_eq!(last, brute_force(10, seed), "{err}");
    assert!(
        RB_BNB.count(&err, "handed out again") >= 1,
        "the dead worker's task was handed out again: {err}"
    );
}
