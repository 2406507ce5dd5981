//! JEL hosted by the job's agent, lab tier (issue 16): the agent on the gateway machine, the
//! broker over TCP, the remote command on a real namespaced host over real ssh under a
//! subagent. `rb release HOST` puts `vacate` (with its deadline) in the job's stream before
//! the subagent ends the command there, then `host_released`. Root only; the test prints why
//! it is skipped otherwise.

use std::{
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tests::{
    bin,
    labtier::{skip_unless_root, LabWithBroker},
    wait_until,
};

/// The events of a `rb-jel watch --json` output file, as JSON values.
fn events(file: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

fn unix_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

#[test]
fn a_release_over_ssh_is_vacate_with_its_deadline_then_host_released_in_the_jobs_stream() {
    let name =
        "a_release_over_ssh_is_vacate_with_its_deadline_then_host_released_in_the_jobs_stream";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("events");
    // As in jel_agent_local: the job goes on after its remote command is ended, until the
    // pool says the host is gone (at most 20 s).
    let script = format!(
        "'{jel}' watch --json > '{file}' & rsh anyLinux-1 sleep 60 </dev/null & wait $!; \
         for _ in $(seq 200); do grep -q host_released '{file}' && exit 0; sleep 0.1; done; \
         exit 1",
        jel = bin("rb-jel").display(),
        file = file.display()
    );
    let mut job = env.agent(&["sh", "-c", &script]).spawn().expect("agent");
    let host = wait_until(Duration::from_secs(30), || {
        let seen = events(&file);
        let first = seen.iter().find(|e| e["event"] == "host_granted")?;
        first["host"].as_str().map(String::from)
    })
    .expect("the watcher sees host_granted");
    let names: Vec<String> = env.lab.hosts().iter().map(|h| h.name.clone()).collect();
    assert!(
        names.contains(&host),
        "`{host}` is not a lab host ({names:?})"
    );
    // The remote command runs there under its subagent before the host is taken back.
    wait_until(Duration::from_secs(30), || {
        let out = env.lab.exec(&host, &["pgrep", "-x", "sleep"]).ok()?;
        out.status.success().then_some(())
    })
    .expect("the remote sleep runs");
    let asked = unix_ms();
    let out = env.broker.rb(&["release", &host, "--grace-s", "3"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = wait_until(Duration::from_secs(30), || job.try_wait().ok().flatten())
        .expect("the job ends after the release");
    assert_eq!(status.code(), Some(0), "the app saw host_released");
    let seen = wait_until(Duration::from_secs(10), || {
        let seen = events(&file);
        seen.iter()
            .any(|e| e["event"] == "terminated")
            .then_some(seen)
    })
    .expect("the watcher sees terminated");
    let order: Vec<&str> = seen
        .iter()
        .filter_map(|e| e["event"].as_str())
        .filter(|k| ["host_granted", "vacate", "host_released", "terminated"].contains(k))
        .collect();
    assert_eq!(
        order,
        ["host_granted", "vacate", "host_released", "terminated"],
        "{seen:?}"
    );
    let seqs: Vec<u64> = seen.iter().filter_map(|e| e["seq"].as_u64()).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "seq from 1, no gap, no duplicate");
    let vacate = seen
        .iter()
        .find(|e| e["event"] == "vacate")
        .expect("vacate");
    assert_eq!(vacate["host"], host.as_str());
    let deadline = vacate["deadline"].as_u64().expect("a deadline in Unix ms");
    assert!(
        (asked + 2_000..=unix_ms() + 3_000).contains(&deadline),
        "the deadline is the release's grace (3 s) from the reclaim: {deadline}, asked at {asked}"
    );
}
