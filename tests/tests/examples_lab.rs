//! The example applications on the lab tier: real namespaced hosts over real
//! ssh, the broker and the job's agent on the gateway (this machine). rb-mw (examples/mw):
//! its master on the gateway grows onto 3 lab hosts with `rsh anyLinux` and counts right;
//! a host taken back mid-run has its tasks redone, each counted once, whether it is
//! released (`rb release`), taken by another job, taken back by its returning owner (each a
//! `vacate` first) or crashed (`rb lab crash`: a death, no vacate). Root only; each test
//! prints why it is skipped otherwise.
//!
//! Both need workers on granted hosts to reach the job's pool (`RB_JEL` there): their
//! subagents relay it (`agent/src/subjel.rs`).

use std::time::Duration;

use tests::{
    apps::{Takeback, RB_MW},
    labtier::{skip_unless_root, LabWithBroker},
    mw::{answer, job_args, primes_below, requeued, MwJob},
    wait_until,
};

const END: Duration = Duration::from_secs(120);

fn start(env: &LabWithBroker, n: usize, tasks: u32, task_ms: u32) -> MwJob {
    let args = job_args(rb_mw::PROGRAM, n, tasks, task_ms);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    MwJob::spawn(env.agent(&args))
}

/// Waits for the end: exit 0 and the right answer; returns the master's log.
fn right_answer(job: &mut MwJob, n: usize) -> String {
    let (status, stdout) = job.wait(END);
    let log = job.stderr();
    assert_eq!(status.code(), Some(0), "{stdout}\n{log}");
    assert_eq!(answer(&stdout), Some(primes_below(n)), "{stdout}\n{log}");
    log
}

/// Waits until the job holds at least `n` hosts; their names.
fn holds(env: &LabWithBroker, job: &MwJob, n: usize) -> Vec<String> {
    wait_until(Duration::from_secs(60), || {
        let held = env.broker.held_hosts();
        (held.len() >= n).then_some(held)
    })
    .unwrap_or_else(|| panic!("the job never held {n} hosts:\n{}", job.stderr()))
}

#[test]
fn rb_mw_grows_onto_three_lab_hosts_and_counts_right() {
    if skip_unless_root("rb_mw_grows_onto_three_lab_hosts_and_counts_right") {
        return;
    }
    let env = LabWithBroker::start(3, &[]);
    let n = 3_000_000;
    let mut job = start(&env, n, 12, 800);
    let held = holds(&env, &job, 3);
    let names: Vec<String> = env.lab.hosts().iter().map(|h| h.name.clone()).collect();
    assert!(held.iter().all(|h| names.contains(h)), "{held:?} {names:?}");
    let log = right_answer(&mut job, n);
    assert!(log.contains("12 tasks done"), "{log}");
}

/// rb-mw on a lab of 2 hosts (3 for a release), 24 tasks of at least 1 s: every host has a
/// worker with a task before `takeback` takes one back; the answer is right and the
/// summary shows the host's tasks re-queued for the reason intended.
fn survives(takeback: Takeback) {
    let hosts = if takeback == Takeback::Release { 3 } else { 2 };
    let env = takeback.lab(hosts);
    let n = 2_000_000;
    let mut job = start(&env, n, 24, 1_000);
    let aftermath = takeback.inflict(&env, &job, RB_MW);
    let log = right_answer(&mut job, n);
    drop(aftermath);
    assert!(!requeued(&log).is_empty(), "a task redone:\n{log}");
    takeback.check_handed_on(RB_MW, &log);
}

#[test]
fn rb_mw_on_the_lab_redoes_the_tasks_of_a_released_host() {
    if skip_unless_root("rb_mw_on_the_lab_redoes_the_tasks_of_a_released_host") {
        return;
    }
    survives(Takeback::Release);
}

#[test]
fn rb_mw_on_the_lab_lends_a_host_to_another_job_and_counts_right() {
    if skip_unless_root("rb_mw_on_the_lab_lends_a_host_to_another_job_and_counts_right") {
        return;
    }
    survives(Takeback::AnotherJob);
}

#[test]
fn rb_mw_on_the_lab_gives_a_returning_owner_her_host_and_counts_right() {
    let name = "rb_mw_on_the_lab_gives_a_returning_owner_her_host_and_counts_right";
    if skip_unless_root(name) {
        return;
    }
    survives(Takeback::OwnerReturns);
}

#[test]
fn rb_mw_on_the_lab_redoes_the_tasks_of_a_crashed_host() {
    if skip_unless_root("rb_mw_on_the_lab_redoes_the_tasks_of_a_crashed_host") {
        return;
    }
    survives(Takeback::Crash);
}
