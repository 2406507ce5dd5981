//! `rb-bnb`, the branch-and-bound example application (issue 18), lab tier: the master on the
//! gateway, workers on real namespaced hosts started over the real remote shell by
//! `rsh anyLinux`, each a member of the job's pool through its subagent. The answer is checked
//! against `rb-bnb --brute-force` while a host is released (`vacate` hands its task on) and
//! while another crashes. Root only; the test prints why it is skipped otherwise.

use std::{process::Command, time::Duration};

use tests::{
    bin,
    labtier::{skip_unless_root, LabWithBroker},
    mw::MwJob,
    wait_until,
};

fn brute_force(cities: u32, seed: u32) -> String {
    let out = Command::new(bin("rb-bnb"))
        .args([
            "--cities",
            &cities.to_string(),
            "--seed",
            &seed.to_string(),
            "--brute-force",
        ])
        .output()
        .expect("rb-bnb --brute-force");
    assert!(out.status.success(), "{out:?}");
    last_line(&out.stdout)
}

fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.lines().last().unwrap_or_default().to_string()
}

fn start_job(env: &LabWithBroker, cities: u32, seed: u32, task_ms: u32) -> MwJob {
    let bnb = bin("rb-bnb").display().to_string();
    let (c, s, ms) = (cities.to_string(), seed.to_string(), task_ms.to_string());
    MwJob::spawn(env.agent(&[
        &bnb,
        "--cities",
        &c,
        "--seed",
        &s,
        "--task-ms",
        &ms,
        "--",
        "(adaptive=yes)",
    ]))
}

fn finish(mut job: MwJob) -> (String, String) {
    let (status, stdout) = job.wait(Duration::from_secs(180));
    let err = job.stderr();
    assert_eq!(status.code(), Some(0), "the job failed: {err}");
    (last_line(stdout.as_bytes()), err)
}

/// The lab host of a worker the master has handed a task to.
fn host_with_a_task(job: &MwJob) -> String {
    wait_until(Duration::from_secs(60), || {
        job.stderr().lines().find_map(|l| {
            let rest = l.strip_prefix("rb-bnb: task ")?;
            let (_, on) = rest.split_once(" on ")?;
            Some(on.to_string())
        })
    })
    .unwrap_or_else(|| panic!("no task went to a lab host:\n{}", job.stderr()))
}

fn summary_count(stderr: &str, what: &str) -> usize {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("rb-bnb:") && l.contains(what))
        .unwrap_or_else(|| panic!("no summary with {what:?} in {stderr}"));
    let before = &line[..line.find(what).expect("what")];
    let word = before.split_whitespace().last().expect("a number");
    word.trim_start_matches(['(', ','])
        .parse()
        .expect("a count")
}

#[test]
fn on_the_lab_it_grows_hands_a_vacated_task_on_and_finds_the_optimum() {
    let name = "on_the_lab_it_grows_hands_a_vacated_task_on_and_finds_the_optimum";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(3, &[]);
    // 504 tasks of at least 60 ms on up to 4 workers: the release comes mid-run.
    let job = start_job(&env, 10, 5, 60);
    let host = host_with_a_task(&job);
    let out = env.broker.rb(&["release", &host, "--grace-s", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (last, err) = finish(job);
    assert_eq!(last, brute_force(10, 5), "{err}");
    assert!(
        summary_count(&err, "workers on granted hosts") >= 2,
        "{err}"
    );
    assert!(
        summary_count(&err, "at a vacate") >= 1,
        "the vacate reached the master through the job's stream: {err}"
    );
}

#[test]
fn on_the_lab_a_crashed_host_costs_only_its_task() {
    let name = "on_the_lab_a_crashed_host_costs_only_its_task";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(3, &[]);
    let job = start_job(&env, 10, 9, 60);
    let host = host_with_a_task(&job);
    env.lab.crash(&host).expect("crash");
    let (last, err) = finish(job);
    assert_eq!(last, brute_force(10, 9), "{err}");
    assert!(summary_count(&err, "handed out again") >= 1, "{err}");
}

/// The lab hosts of workers the master has handed tasks to so far.
fn hosts_with_tasks(job: &MwJob) -> std::collections::BTreeSet<String> {
    job.stderr()
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("rb-bnb: task ")?;
            Some(rest.split_once(" on ")?.1.to_string())
        })
        .collect()
}

#[test]
fn on_the_lab_a_returning_owner_takes_the_host_back_and_the_answer_stays_right() {
    let name = "on_the_lab_a_returning_owner_takes_the_host_back_and_the_answer_stays_right";
    if skip_unless_root(name) {
        return;
    }
    // node03 is alice's workstation; she is away, so the adaptive job may use it.
    let env = LabWithBroker::start(2, &[("node03", "alice")]);
    let job = start_job(&env, 10, 13, 60);
    wait_until(Duration::from_secs(60), || {
        hosts_with_tasks(&job).contains("node03").then_some(())
    })
    .unwrap_or_else(|| panic!("no task went to node03:\n{}", job.stderr()));
    let login = env
        .lab
        .fake_login("node03", "alice", "rbtty-alice", Duration::ZERO)
        .expect("fake login");
    let (last, err) = finish(job);
    drop(login);
    assert_eq!(last, brute_force(10, 13), "{err}");
    assert!(
        summary_count(&err, "at a vacate") >= 1,
        "alice's return reached the master as a vacate: {err}"
    );
}

#[test]
fn on_the_lab_another_job_takes_a_host_from_it_and_the_answer_stays_right() {
    let name = "on_the_lab_another_job_takes_a_host_from_it_and_the_answer_stays_right";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let job = start_job(&env, 10, 17, 60);
    wait_until(Duration::from_secs(60), || {
        (hosts_with_tasks(&job).len() >= 2).then_some(())
    })
    .unwrap_or_else(|| panic!("it never worked on both hosts:\n{}", job.stderr()));
    // A plain (not adaptive) job wants a host: the policy takes one from rb-bnb.
    let other = env
        .agent(&["sh", "-c", "rsh anyLinux true"])
        .output()
        .expect("the other job");
    assert!(
        other.status.success(),
        "the other job got a host: {}",
        String::from_utf8_lossy(&other.stderr)
    );
    let (last, err) = finish(job);
    assert_eq!(last, brute_force(10, 17), "{err}");
    assert!(
        summary_count(&err, "at a vacate") >= 1,
        "the reclaim reached the master as a vacate: {err}"
    );
}
