//! `rb-bnb`, the branch-and-bound example application, lab tier: the master on the
//! gateway, workers on real namespaced hosts started over the real remote shell by
//! `rsh anyLinux`, each a member of the job's pool through its subagent. The answer is checked
//! against `rb-bnb --brute-force` while a host is taken back mid-run: released
//! (`rb release`), taken by another job, taken back by its returning owner (each a `vacate`
//! first, which hands its task on) or crashed (`rb lab crash`: handed on at the death or the
//! lost connection). Root only; each test prints why it is skipped otherwise.

use std::time::Duration;

use tests::{
    apps::{bnb_brute_force, last_line, Takeback, RB_BNB},
    bin,
    labtier::{skip_unless_root, LabWithBroker},
    mw::MwJob,
};

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

/// rb-bnb on a lab of 2 hosts (3 for a release and a crash), 504 tasks of at least 60 ms:
/// workers on every host hold tasks before `takeback` takes one back; the tour is the brute
/// force's and the summary shows the host's task handed on for the reason intended.
fn survives(takeback: Takeback, seed: u32) {
    let hosts = match takeback {
        Takeback::Release | Takeback::Crash => 3,
        _ => 2,
    };
    let env = takeback.lab(hosts);
    let mut job = start_job(&env, 10, seed, 60);
    let aftermath = takeback.inflict(&env, &job, RB_BNB);
    let (status, stdout) = job.wait(Duration::from_secs(180));
    drop(aftermath);
    let err = job.stderr();
    assert_eq!(status.code(), Some(0), "the job failed: {err}");
    assert_eq!(last_line(&stdout), bnb_brute_force(10, seed), "{err}");
    assert!(RB_BNB.count(&err, "workers on granted hosts") >= 2, "{err}");
    assert!(RB_BNB.count(&err, "handed out again") >= 1, "{err}");
    takeback.check_handed_on(RB_BNB, &err);
}

#[test]
fn on_the_lab_it_grows_hands_a_vacated_task_on_and_finds_the_optimum() {
    let name = "on_the_lab_it_grows_hands_a_vacated_task_on_and_finds_the_optimum";
    if skip_unless_root(name) {
        return;
    }
    survives(Takeback::Release, 5);
}

#[test]
fn on_the_lab_a_crashed_host_costs_only_its_task() {
    if skip_unless_root("on_the_lab_a_crashed_host_costs_only_its_task") {
        return;
    }
    survives(Takeback::Crash, 9);
}

#[test]
fn on_the_lab_a_returning_owner_takes_the_host_back_and_the_answer_stays_right() {
    let name = "on_the_lab_a_returning_owner_takes_the_host_back_and_the_answer_stays_right";
    if skip_unless_root(name) {
        return;
    }
    survives(Takeback::OwnerReturns, 13);
}

#[test]
fn on_the_lab_another_job_takes_a_host_from_it_and_the_answer_stays_right() {
    let name = "on_the_lab_another_job_takes_a_host_from_it_and_the_answer_stays_right";
    if skip_unless_root(name) {
        return;
    }
    survives(Takeback::AnotherJob, 17);
}
