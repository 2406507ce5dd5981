//! Tier 3, policies: the shipped `paper` policy on real namespaced hosts. An
//! owner logging in on their private machine (a real utmp entry) sends the adaptive job
//! there away: its processes on that host are gone within the grace plus a second. Root
//! only; each test prints why it is skipped otherwise.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use tests::{
    bin,
    labtier::{skip_unless_root, LabWithBroker},
    wait_until,
};

/// How many processes on `host` carry `marker` in their command line.
fn count(env: &LabWithBroker, host: &str, marker: &str) -> usize {
    let out = env.lab.exec(host, &["pgrep", "-f", marker]).expect("pgrep");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn owner_login_vacates_the_adaptive_job_on_a_private_host() {
    if skip_unless_root("owner_login_vacates_the_adaptive_job_on_a_private_host") {
        return;
    }
    let env = LabWithBroker::start(2, &[("node03", "alice")]);
    let marker = format!("rbpolicymarker{}", std::process::id());
    let script =
        format!("rsh anyLinux 'sleep 300 # {marker}' & rsh anyLinux 'sleep 300 # {marker}' & wait");
    let mut job = Command::new(bin("agent"))
        .arg("--broker")
        .arg(env.broker.tcp_addr().to_string())
        .arg("--secret-file")
        .arg(env.broker.secret())
        .args(["--grace-s", "1", "--rsl", "&(adaptive=yes)", "--"])
        .args(["sh", "-c", &script])
        .env_remove("RB_AGENT")
        .env_remove("RB_LAB")
        .spawn()
        .expect("agent");
    let both = wait_until(Duration::from_secs(20), || {
        (count(&env, "node02", &marker) >= 1 && count(&env, "node03", &marker) >= 1).then_some(())
    });
    assert!(
        both.is_some(),
        "the adaptive job did not get the private node03 while alice was away\n{}",
        env.broker.log()
    );
    let login = env
        .lab
        .fake_login("node03", "alice", "rbtty-alice", Duration::ZERO)
        .expect("fake login");
    let t0 = Instant::now();
    // The lab's reclaim grace (5 s) plus a second.
    let gone = wait_until(Duration::from_secs(6), || {
        (count(&env, "node03", &marker) == 0).then_some(t0.elapsed())
    });
    let _ = job.kill();
    let _ = job.wait();
    drop(login);
    let gone = gone.unwrap_or_else(|| {
        panic!(
            "the job's process survived alice's login on node03\n{}",
            env.broker.log()
        )
    });
    eprintln!("owner login → process gone on node03 after {gone:?}");
    let log = env.broker.log();
    assert!(
        log.lines()
            .any(|l| l.contains("reclaiming") && l.contains("host=node03")),
        "the broker took node03 back: {log}"
    );
    let clean = wait_until(Duration::from_secs(10), || {
        (count(&env, "node02", &marker) == 0).then_some(())
    });
    assert!(clean.is_some(), "the job's process survived on node02");
}
