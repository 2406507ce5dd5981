//! JEL hosted by the job's agent, local tier: a real `agent` with the local
//! virtual-host lab hosts its job's pool on `RB_JEL`; a watcher started by the app sees the
//! hosts the broker grants and takes back (`host_granted`, `vacate` with its deadline before
//! the remote command is told to end, `host_released`) and the job's end (`terminated`).

use std::{
    path::Path,
    process::Command,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tests::{bin, local_lab, wait_until, Broker};

/// The events of a `rb-jel watch --json` output file, as JSON values.
fn events(file: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

fn kinds(events: &[serde_json::Value]) -> Vec<&str> {
    events.iter().filter_map(|e| e["event"].as_str()).collect()
}

fn unix_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

#[test]
fn the_agent_hosts_the_pool_and_a_release_is_granted_vacate_released_in_order() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("events");
    // The job goes on after its remote command is ended (as an adaptive job does when a
    // host is taken back): it waits, at most 10 s, for the pool to say the host is gone,
    // then ends; the job's end (`terminated`) ends the watcher.
    let script = format!(
        "'{jel}' watch --json > '{file}' & rsh anyLinux-1 sleep 30 & wait $!; \
         for _ in $(seq 100); do grep -q host_released '{file}' && exit 0; sleep 0.1; done; \
         exit 1",
        jel = bin("rb-jel").display(),
        file = file.display()
    );
    let mut job = broker
        .agent(&["sh", "-c", &script])
        .env_remove("RB_JEL")
        .spawn()
        .expect("agent");
    let granted = wait_until(Duration::from_secs(10), || {
        let seen = events(&file);
        let first = seen.iter().find(|e| e["event"] == "host_granted")?;
        first["host"].as_str().map(String::from)
    })
    .expect("the watcher sees host_granted");
    assert_eq!(granted, "vhost01");
    wait_until(Duration::from_secs(10), || {
        (!broker.held_hosts().is_empty()).then_some(())
    })
    .expect("the job holds the host");
    let asked = unix_ms();
    let out = broker.rb(&["release", "vhost01", "--grace-s", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = wait_until(Duration::from_secs(15), || job.try_wait().ok().flatten())
        .expect("the job ends after the release");
    assert_eq!(status.code(), Some(0), "the app saw host_released");
    let seen = wait_until(Duration::from_secs(5), || {
        let seen = events(&file);
        kinds(&seen).contains(&"terminated").then_some(seen)
    })
    .expect("the watcher sees terminated");
    let order: Vec<&str> = kinds(&seen)
        .into_iter()
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
    assert_eq!(vacate["host"], "vhost01");
    let deadline = vacate["deadline"].as_u64().expect("a deadline in Unix ms");
    assert!(
        (asked + 1_000..=unix_ms() + 2_000).contains(&deadline),
        "the deadline is the release's grace (2 s) from the reclaim: {deadline}, asked at {asked}"
    );
    let released = seen.iter().find(|e| e["event"] == "host_released");
    assert_eq!(released.expect("host_released")["host"], "vhost01");
}

/// The job's end gives the front end's JEL members it told `terminated` a moment to end on
/// their own before it ends what is left of the job: a watcher whose script takes 0.3 s over
/// `terminated` finishes it. (The agent used to end the job's processes right after the
/// pool wrote `terminated`, so that a member was often killed before it had read it: the
/// test above saw its watcher miss `terminated` one run in many.)
#[test]
fn a_member_told_terminated_ends_on_its_own_before_the_job_ends_it() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let dir = tempfile::tempdir().expect("tempdir");
    let (ready, done) = (dir.path().join("ready"), dir.path().join("done"));
    let on_event = format!(
        "case $JEL_EVENT in host_granted) touch '{ready}';; \
         terminated) sleep 0.3; touch '{done}';; esac",
        ready = ready.display(),
        done = done.display()
    );
    // The app ends once the watcher has seen an event (it watches), having done nothing else.
    let script = format!(
        "'{jel}' watch --exec \"$1\" & rsh anyLinux-1 true; \
         for _ in $(seq 100); do [ -e '{ready}' ] && exit 0; sleep 0.1; done; exit 1",
        jel = bin("rb-jel").display(),
        ready = ready.display()
    );
    let out = broker
        .agent(&["sh", "-c", &script, "sh", &on_event])
        .env_remove("RB_JEL")
        .output()
        .expect("agent");
    assert_eq!(
        out.status.code(),
        Some(0),
        "the watcher saw host_granted\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        done.exists(),
        "the watcher's script for `terminated` ran to its end before the agent exited\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A job's scripts find `rb-jel` on their PATH (the job's bin dir, beside the shim) and
/// reach the job's pool with it, nothing installed.
#[test]
fn rb_jel_is_on_the_jobs_path_and_reaches_its_pool() {
    let broker = Broker::start(&local_lab(1));
    let out = broker
        .agent(&["sh", "-c", "command -v rb-jel && rb-jel members --json"])
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("agent");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    assert!(
        lines.next().is_some_and(|l| l.ends_with("/bin/rb-jel")),
        "{stdout}"
    );
    let members: serde_json::Value =
        serde_json::from_str(lines.next().unwrap_or_default()).expect("members json");
    assert!(members.is_array(), "{members}");
}

#[test]
fn outside_a_job_rb_jel_fails_with_exit_2() {
    let out = Command::new(bin("rb-jel"))
        .args(["watch", "--json"])
        .env_remove("RB_JEL")
        .output()
        .expect("rb-jel");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not inside a ResourceBroker job"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_bad_jel_value_exits_64_before_the_job_starts() {
    let broker = Broker::start(&local_lab(1));
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("ran");
    let app = format!("touch '{}'", marker.display());
    let out = Command::new(bin("agent"))
        .arg("--broker")
        .arg(broker.socket())
        .args([
            "--rsl",
            "(adaptive=yes)(jel=\"sometimes\")",
            "sh",
            "-c",
            &app,
        ])
        .env_remove("RB_AGENT")
        .env_remove("RB_LAB")
        .output()
        .expect("agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("jel") && stderr.contains("sometimes"),
        "{stderr}"
    );
    assert!(!marker.exists(), "the app did not run");
    assert!(broker.jobs().is_empty(), "no job was registered");
}

/// Under the `local` transport (virtual hosts on this machine) a remote command gets its
/// subagent's JEL socket, not the front end's `RB_JEL` it would inherit: its member is on
/// the virtual host, relayed by the subagent (a regression test: it joined as a front-end
/// member before).
#[test]
fn a_remote_command_on_a_virtual_host_joins_through_its_subagent() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("events");
    let script = format!(
        "J='{jel}'; F='{file}'; \"$J\" watch --from 1 --json > \"$F\" & \
         rsh anyLinux-1 \"'$J' join --name r -- sh -c 'echo \\$RB_JEL > {file}.sock'\" & \
         wait $!; \
         for _ in $(seq 100); do grep -q '\"left\"' \"$F\" && exit 0; sleep 0.1; done; exit 1",
        jel = bin("rb-jel").display(),
        file = file.display()
    );
    let out = broker
        .agent(&["sh", "-c", &script])
        .env_remove("RB_JEL")
        .output()
        .expect("agent");
    let seen = events(&file);
    assert!(
        out.status.success(),
        "{seen:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let joined = seen
        .iter()
        .find(|e| e["event"] == "joined")
        .expect("joined");
    assert_eq!(joined["member"]["host"], "vhost01", "{joined}");
    let socket = std::fs::read_to_string(dir.path().join("events.sock")).expect("RB_JEL");
    assert!(
        socket.contains("/subagent-") && socket.trim().ends_with("/jel.sock"),
        "the subagent's socket: {socket}"
    );
}
