//! JEL hosted by the job's agent, lab tier (issue 16): the agent on the gateway machine, the
//! broker over TCP, the remote command on a real namespaced host over real ssh under a
//! subagent. `rb release HOST` puts `vacate` (with its deadline) in the job's stream before
//! the subagent ends the command there, then `host_released`.
//!
//! Members on granted hosts: real `rb-jel` processes started with `rsh anyLinux-N` join
//! through their subagent's socket, relayed over its agent link: every host sees one stream,
//! with each member's lab host; a release, a crash, a killed winner and a watcher cut off
//! reach them as they reach the front end's. Root only; each test prints why it is skipped
//! otherwise.

use std::{
    path::{Path, PathBuf},
    process::Child,
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

/// A job whose app runs `body` (a shell script with `$J` = rb-jel's absolute path and `$D`
/// = a directory of the test's), then waits until the test creates `$D/stop`.
struct JelJob {
    dir: tempfile::TempDir,
    child: Child,
}

impl JelJob {
    fn start(env: &LabWithBroker, body: &str) -> JelJob {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = format!(
            "J='{jel}'; D='{dir}'; {body}\nwhile [ ! -e \"$D/stop\" ]; do sleep 0.1; done",
            jel = bin("rb-jel").display(),
            dir = dir.path().display(),
        );
        let child = env.agent(&["sh", "-c", &script]).spawn().expect("agent");
        JelJob { dir, child }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn events(&self, name: &str) -> Vec<serde_json::Value> {
        events(&self.file(name))
    }

    /// Waits (up to `within`) for an event of watcher file `name` that `pick` chooses.
    fn wait_event(
        &self,
        name: &str,
        within: Duration,
        pick: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_until(within, || self.events(name).into_iter().find(|e| pick(e))).unwrap_or_else(
            || {
                panic!(
                    "no such event in {name} within {within:?}: {:?}",
                    self.events(name)
                )
            },
        )
    }

    /// Ends the app and waits for the job's end.
    fn stop(mut self) {
        std::fs::write(self.file("stop"), "").expect("stop file");
        let ended = wait_until(Duration::from_secs(30), || {
            self.child.try_wait().ok().flatten()
        });
        if ended.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!("the job did not end");
        }
    }
}

impl Drop for JelJob {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = std::fs::write(self.file("stop"), "");
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn joined(e: &serde_json::Value, name: &str) -> bool {
    e["event"] == "joined" && e["member"]["name"] == name
}

/// The events of `a` and `b` agree wherever both have a seq.
fn same_stream(a: &[serde_json::Value], b: &[serde_json::Value]) {
    for e in a {
        if let Some(other) = b.iter().find(|o| o["seq"] == e["seq"]) {
            assert_eq!(e, other, "one stream for every host");
        }
    }
}

#[test]
fn members_on_three_hosts_see_one_stream_with_their_lab_hosts() {
    let name = "members_on_three_hosts_see_one_stream_with_their_lab_hosts";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let job = JelJob::start(
        &env,
        "\"$J\" watch --from 1 --json > \"$D/fe\" &\n\
         \"$J\" join --name fe -- sleep 600 &\n\
         rsh anyLinux-1 \"$J\" join --name r1 -- \"$J\" watch --from 1 --json > \"$D/r1\" </dev/null &\n\
         rsh anyLinux-2 \"$J\" join --name r2 -- \"$J\" watch --from 1 --json > \"$D/r2\" </dev/null &\n\
         while [ ! -e \"$D/list\" ]; do sleep 0.1; done; \"$J\" members --json > \"$D/members.tmp\"; \
         mv \"$D/members.tmp\" \"$D/members\"",
    );
    let within = Duration::from_secs(30);
    let mut hosts = Vec::new();
    for member in ["fe", "r1", "r2"] {
        for watcher in ["fe", "r1", "r2"] {
            let e = job.wait_event(watcher, within, |e| joined(e, member));
            if watcher == "fe" {
                hosts.push(e["member"]["host"].as_str().expect("host").to_string());
            }
        }
    }
    let names: Vec<String> = env.lab.hosts().iter().map(|h| h.name.clone()).collect();
    assert!(
        !names.contains(&hosts[0]),
        "the gateway is no lab host: {hosts:?}"
    );
    assert!(
        names.contains(&hosts[1]) && names.contains(&hosts[2]),
        "{hosts:?} {names:?}"
    );
    assert_ne!(hosts[1], hosts[2], "two hosts granted");
    let (fe, r1, r2) = (job.events("fe"), job.events("r1"), job.events("r2"));
    same_stream(&fe, &r1);
    same_stream(&fe, &r2);
    std::fs::write(job.file("list"), "").expect("list");
    let members = wait_until(within, || {
        let text = std::fs::read_to_string(job.file("members")).ok()?;
        serde_json::from_str::<serde_json::Value>(&text).ok()
    })
    .expect("rb-jel members");
    let listed: Vec<(String, String)> = members
        .as_array()
        .expect("an array")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or("").into(),
                m["host"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    for (member, host) in ["fe", "r1", "r2"].iter().zip(&hosts) {
        assert!(
            listed.contains(&(member.to_string(), host.clone())),
            "{member} on {host} in {listed:?}"
        );
    }
    job.stop();
}
