//! `examples/jacobi/jacobi.py`, asynchronous Jacobi with `jel.py`, local tier: a
//! real agent with virtual hosts. The solution it writes is checked here, independently of
//! the program's own residual, while workers join and leave mid-run and a host is released.

use std::{path::Path, time::Duration};

use tests::{
    apps::{jacobi_py, jacobi_residual, last_line, JACOBI},
    local_lab,
    mw::MwJob,
    wait_until, Broker,
};

fn start(broker: &Broker, out: &Path, extra: &[&str]) -> MwJob {
    let script = jacobi_py().display().to_string();
    let out = out.display().to_string();
    let mut args = vec![
        "python3", &script, "--n", "600", "--blocks", "6", "--out", &out,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "(adaptive=yes)"]);
    let mut agent = broker.agent(&args);
    agent.env_remove("RB_JEL");
    MwJob::spawn(agent)
}

/// Waits for the end: exit 0; (last line of stdout, stderr).
fn finish(mut job: MwJob) -> (String, String) {
    let (status, stdout) = job.wait(Duration::from_secs(120));
    let err = job.stderr();
    assert_eq!(status.code(), Some(0), "the job failed: {err}");
    (last_line(&stdout), err)
}

#[test]
fn workers_join_and_leave_mid_run_and_it_converges() {
    let broker = Broker::start(&local_lab(3));
    broker.wait_all_up(Duration::from_secs(10));
    let dir = tempfile::tempdir().expect("tempdir");
    let x = dir.path().join("x");
    // Each remote worker leaves after 4 blocks: the job keeps asking for hosts, so workers
    // join and leave all through the run (a diagonal of 2.2 converges slowly enough).
    let job = start(
        &broker,
        &x,
        &["--diag", "2.2", "--task-ms", "40", "--worker-blocks", "4"],
    );
    let (last, err) = finish(job);
    assert!(
        last.starts_with("residual=") && last.contains(" iterations="),
        "{last}"
    );
    assert!(jacobi_residual(&x, 2.2) < 1e-9, "x solves A x = b: {last}");
    assert!(
        JACOBI.count(&err, "workers on granted hosts") > 3,
        "more workers came than there are hosts, so some left and others joined: {err}"
    );
}

#[test]
fn a_released_host_frees_its_block_at_the_vacate_and_it_converges() {
    let broker = Broker::start(&local_lab(3));
    broker.wait_all_up(Duration::from_secs(10));
    let dir = tempfile::tempdir().expect("tempdir");
    let x = dir.path().join("x");
    let job = start(
        &broker,
        &x,
        &["--task-ms", "60", "--tol", "1e-12", "--verbose"],
    );
    // A worker there holds a block (the blocks outnumber the hosts).
    wait_until(Duration::from_secs(30), || {
        let log = job.stderr();
        log.lines()
            .any(|l| l.starts_with("jacobi.py: block ") && l.ends_with(" on vhost01"))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("no block went to vhost01:\n{}", job.stderr()));
    let out = broker.rb(&["release", "vhost01", "--grace-s", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (last, err) = finish(job);
    assert!(jacobi_residual(&x, 4.0) < 1e-11, "x solves A x = b: {last}");
    assert!(
        JACOBI.count(&err, "at a vacate") >= 1,
        "the vacated worker's block was freed at the vacate: {err}"
    );
}
