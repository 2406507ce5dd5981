//! `examples/jacobi/jacobi.py`, lab tier: the master on the gateway, workers on
//! real namespaced hosts over the real remote shell, each a pool member through its
//! subagent. A host is taken back mid-run — released (`rb release`), taken by another job,
//! taken back by its returning owner (each a `vacate` first: the block there is freed at
//! it), or crashed (`rb lab crash`: freed at the death or the lost connection) — and the
//! solution it writes is checked here. Root only; each test prints why it is skipped
//! otherwise.

use std::time::Duration;

use tests::{
    apps::{jacobi_py, jacobi_residual, last_line, Takeback, JACOBI},
    labtier::skip_unless_root,
    mw::MwJob,
};

const DIAG: f64 = 2.2;
const TOL: f64 = 1e-12;

/// jacobi.py on a lab of 2 hosts (3 for a release), 6 blocks of at least 60 ms: workers
/// on every host hold blocks before `takeback` takes one back; it converges (x checked
/// here) and the summary shows the host's block freed for the reason intended.
fn survives(takeback: Takeback) {
    let hosts = if takeback == Takeback::Release { 3 } else { 2 };
    let env = takeback.lab(hosts);
    let dir = tempfile::tempdir().expect("tempdir");
    let x = dir.path().join("x");
    let (script, out) = (jacobi_py().display().to_string(), x.display().to_string());
    let (diag, tol) = (DIAG.to_string(), TOL.to_string());
    let mut job = MwJob::spawn(env.agent(&[
        "python3",
        &script,
        "--n",
        "600",
        "--blocks",
        "6",
        "--diag",
        &diag,
        "--tol",
        &tol,
        "--task-ms",
        "60",
        "--out",
        &out,
        "--verbose",
        "--",
        "(adaptive=yes)",
    ]));
    let aftermath = takeback.inflict(&env, &job, JACOBI);
    let (status, stdout) = job.wait(Duration::from_secs(180));
    drop(aftermath);
    let err = job.stderr();
    assert!(status.success(), "the job failed: {err}");
    let residual: f64 = last_line(&stdout)
        .strip_prefix("residual=")
        .and_then(|r| r.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no residual=<r> on the last line: {stdout}"));
    assert!(residual < TOL, "converged to the tolerance: {stdout}");
    assert!(
        jacobi_residual(&x, DIAG) < 10.0 * TOL,
        "x solves A x = b: {err}"
    );
    assert!(JACOBI.count(&err, "workers on granted hosts") >= 2, "{err}");
    takeback.check_handed_on(JACOBI, &err);
}

#[test]
fn on_the_lab_a_released_hosts_block_is_freed_at_the_vacate_and_it_converges() {
    let name = "on_the_lab_a_released_hosts_block_is_freed_at_the_vacate_and_it_converges";
    if skip_unless_root(name) {
        return;
    }
    survives(Takeback::Release);
}

#[test]
fn on_the_lab_another_job_takes_a_host_and_it_converges() {
    if skip_unless_root("on_the_lab_another_job_takes_a_host_and_it_converges") {
        return;
    }
    survives(Takeback::AnotherJob);
}

#[test]
fn on_the_lab_a_returning_owner_takes_her_host_back_and_it_converges() {
    let name = "on_the_lab_a_returning_owner_takes_her_host_back_and_it_converges";
    if skip_unless_root(name) {
        return;
    }
    survives(Takeback::OwnerReturns);
}

#[test]
fn on_the_lab_a_crashed_hosts_block_is_freed_and_it_converges() {
    if skip_unless_root("on_the_lab_a_crashed_hosts_block_is_freed_and_it_converges") {
        return;
    }
    survives(Takeback::Crash);
}
