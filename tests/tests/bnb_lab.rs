//! `rb-bnb`, the branch-and-bound example application (issue 18), lab tier: the master on the
//! gateway, workers on real namespaced hosts started over the real remote shell by
//! `rsh anyLinux`, each a member of the job's pool through its subagent. The answer is checked
//! against `rb-bnb --brute-force` while a host is released (`vacate` hands its task on) and
//! while another crashes. Root only; the test prints why it is skipped otherwise.

use std::{
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use tests::{
    bin,
    labtier::{skip_unless_root, LabWithBroker},
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

fn start_job(env: &LabWithBroker, cities: u32, seed: u32, task_ms: u32) -> Child {
    let bnb = bin("rb-bnb").display().to_string();
    let (c, s, ms) = (cities.to_string(), seed.to_string(), task_ms.to_string());
    env.agent(&[
        &bnb,
        "--cities",
        &c,
        "--seed",
        &s,
        "--task-ms",
        &ms,
        "--",
        "(adaptive=yes)",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("agent")
}

fn finish(job: Child) -> (Output, String) {
    let out = job.wait_with_output().expect("wait for the job");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the job failed: {err}");
    (out, err)
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

/// Waits until the job holds at least `n` hosts; returns them.
fn holds(env: &LabWithBroker, n: usize) -> Vec<String> {
    wait_until(Duration::from_secs(60), || {
        let held = env.broker.held_hosts();
        (held.len() >= n).then_some(held)
    })
    .unwrap_or_else(|| panic!("the job never held {n} hosts"))
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
    let held = holds(&env, 2);
    let out = env.broker.rb(&["release", &held[0], "--grace-s", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (out, err) = finish(job);
    assert_eq!(last_line(&out.stdout), brute_force(10, 5), "{err}");
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
    let held = holds(&env, 2);
    env.lab.crash(&held[0]).expect("crash");
    let (out, err) = finish(job);
    assert_eq!(last_line(&out.stdout), brute_force(10, 9), "{err}");
    assert!(summary_count(&err, "handed out again") >= 1, "{err}");
}
