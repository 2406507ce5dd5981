//! `examples/jacobi/jacobi.py` (issue 18), lab tier: the master on the gateway, workers on
//! real namespaced hosts over the real remote shell, each a pool member through its
//! subagent. A released host's block is freed at its `vacate`; the solution is checked here.
//! Root only; the test prints why it is skipped otherwise.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use tests::{
    labtier::{skip_unless_root, LabWithBroker},
    mw::MwJob,
    wait_until,
};

fn jacobi_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/jacobi/jacobi.py")
}

fn residual_of(file: &Path, diag: f64) -> f64 {
    let text = std::fs::read_to_string(file).expect("jacobi.py --out");
    let x: Vec<f64> = text.lines().map(|l| l.parse().expect("a number")).collect();
    let at = |i: isize| {
        if i < 0 || i as usize >= x.len() {
            0.0
        } else {
            x[i as usize]
        }
    };
    (0..x.len() as isize)
        .map(|i| (1.0 - (diag * at(i) - at(i - 1) - at(i + 1))).abs())
        .fold(0.0, f64::max)
}

fn count(stderr: &str, what: &str) -> usize {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("jacobi.py:") && l.contains(what))
        .unwrap_or_else(|| panic!("no summary with {what:?} in {stderr}"));
    let before = &line[..line.find(what).expect("what")];
    before
        .split_whitespace()
        .last()
        .expect("n")
        .parse()
        .expect("a count")
}

#[test]
fn on_the_lab_a_released_hosts_block_is_freed_at_the_vacate_and_it_converges() {
    let name = "on_the_lab_a_released_hosts_block_is_freed_at_the_vacate_and_it_converges";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(3, &[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let x = dir.path().join("x");
    let (script, out) = (jacobi_py().display().to_string(), x.display().to_string());
    let mut job = MwJob::spawn(env.agent(&[
        "python3",
        &script,
        "--n",
        "600",
        "--blocks",
        "6",
        "--diag",
        "2.2",
        "--tol",
        "1e-12",
        "--task-ms",
        "60",
        "--out",
        &out,
        "--verbose",
        "--",
        "(adaptive=yes)",
    ]));
    // A worker on a lab host holds a block: release that host.
    let host = wait_until(Duration::from_secs(60), || {
        job.stderr().lines().find_map(|l| {
            let rest = l.strip_prefix("jacobi.py: block ")?;
            let (_, who) = rest.split_once(" to the worker pid ")?;
            Some(who.split_once(" on ")?.1.to_string())
        })
    })
    .unwrap_or_else(|| panic!("no block went to a lab host:\n{}", job.stderr()));
    let r = env.broker.rb(&["release", &host, "--grace-s", "2"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let (status, _) = job.wait(Duration::from_secs(180));
    let err = job.stderr();
    assert!(status.success(), "the job failed: {err}");
    assert!(residual_of(&x, 2.2) < 1e-11, "x solves A x = b: {err}");
    assert!(count(&err, "workers on granted hosts") >= 2, "{err}");
    assert!(count(&err, "blocks freed at a vacate") >= 1, "{err}");
}
