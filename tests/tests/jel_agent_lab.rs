//! JEL hosted by the job's agent, lab tier: the agent on the gateway machine, the
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
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use tests::{
    bin,
    labtier::{skip_unless_root, LabWithBroker, FRONT_END},
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
            "export J='{jel}' D='{dir}'; {body}\nwhile [ ! -e \"$D/stop\" ]; do sleep 0.1; done",
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

fn died(e: &serde_json::Value, name: &str) -> bool {
    e["event"] == "died" && e["member"]["name"] == name
}

fn host_of(e: &serde_json::Value) -> String {
    e["member"]["host"]
        .as_str()
        .expect("a member's host")
        .to_string()
}

#[test]
fn a_release_is_vacate_on_the_host_before_sigterm_then_left_or_died_vacated() {
    let name = "a_release_is_vacate_on_the_host_before_sigterm_then_left_or_died_vacated";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    // On one host: a watcher member killed by SIGTERM (it must have seen `vacate` before),
    // a member that leaves when it sees `vacate` (SIGTERM ignored: it leaves in time), and
    // one that ignores SIGTERM until the SIGKILL at the deadline.
    let job = JelJob::start(
        &env,
        "\"$J\" watch --from 1 --json > \"$D/fe\" &\n\
         rsh anyLinux-1 \"$J\" join --name w -- \"$J\" watch --from 1 --json > \"$D/w\" </dev/null &\n\
         rsh anyLinux-1 \"trap '' TERM; exec $J join --name leaver -- sh -c '$J watch --from 1 \
         --json > /tmp/leaver.ev & until grep -q vacate /tmp/leaver.ev; do sleep 0.05; done'\" \
         </dev/null &\n\
         rsh anyLinux-1 \"trap '' TERM; exec $J join --name stubborn -- sleep 600\" </dev/null &",
    );
    let within = Duration::from_secs(30);
    let mut hosts = Vec::new();
    for member in ["w", "leaver", "stubborn"] {
        hosts.push(host_of(
            &job.wait_event("fe", within, |e| joined(e, member)),
        ));
    }
    assert!(hosts.iter().all(|h| *h == hosts[0]), "{hosts:?}");
    let host = hosts[0].clone();
    job.wait_event("w", within, |e| joined(e, "stubborn"));
    let out = env.broker.rb(&["release", &host, "--grace-s", "3"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    job.wait_event("fe", within, |e| e["event"] == "host_released");
    let fe = job.events("fe");
    let at = |pick: &dyn Fn(&serde_json::Value) -> bool| {
        fe.iter()
            .position(pick)
            .unwrap_or_else(|| panic!("not in the stream: {fe:?}"))
    };
    let vacate = at(&|e| e["event"] == "vacate" && e["host"] == host.as_str());
    let left = at(&|e| e["event"] == "left" && e["member"]["name"] == "leaver");
    let w_died = at(&|e| died(e, "w"));
    let stubborn = at(&|e| died(e, "stubborn"));
    let released = at(&|e| e["event"] == "host_released");
    assert!(vacate < left && left < released, "{fe:?}");
    assert!(vacate < w_died && w_died < released, "{fe:?}");
    assert!(vacate < stubborn && stubborn < released, "{fe:?}");
    assert_eq!(fe[stubborn]["reason"], "vacated", "{fe:?}");
    assert_eq!(fe[w_died]["reason"], "vacated", "{fe:?}");
    let listed: Vec<&str> = fe[vacate]["members"]
        .as_array()
        .expect("vacate's members")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    for member in ["w", "leaver", "stubborn"] {
        assert!(listed.contains(&member), "{member} in {listed:?}");
    }
    // The watcher on the host saw `vacate` before its SIGTERM ended it, as the front end did.
    let w = job.events("w");
    let seen = w
        .iter()
        .find(|e| e["event"] == "vacate")
        .expect("vacate on the host");
    assert_eq!(seen, &fe[vacate]);
    same_stream(&fe, &w);
    job.stop();
}

/// A member that leaves only at its SIGTERM (an adaptive program's worker, once its master
/// has handed its work on) sends its `leave` while the reclaim's grace runs: the pool's
/// answer must reach it then, or it waits in `leave` until the SIGKILL at the grace's end
/// (and the host is freed only then). Regression: the subagent relayed the members' lines
/// during the grace but not the agent's answers.
#[test]
fn a_member_leaving_at_sigterm_gets_its_leave_answered_within_the_grace() {
    let name = "a_member_leaving_at_sigterm_gets_its_leave_answered_within_the_grace";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let program = repo.join("tests/programs/leave_at_sigterm.py");
    let job = JelJob::start(
        &env,
        &format!(
            "\"$J\" watch --from 1 --json > \"$D/fe\" &\n\
             rsh anyLinux-1 'python3 {} {}' > \"$D/late\" </dev/null &",
            program.display(),
            repo.join("jel").display()
        ),
    );
    let within = Duration::from_secs(30);
    let host = host_of(&job.wait_event("fe", within, |e| joined(e, "late")));
    // A grace far longer than the leave needs: a member stuck in `leave` would show.
    let out = env.broker.rb(&["release", &host, "--grace-s", "20"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    job.wait_event("fe", Duration::from_secs(60), |e| {
        e["event"] == "host_released"
    });
    let said = std::fs::read_to_string(job.file("late")).unwrap_or_default();
    let fe = job.events("fe");
    let left = fe
        .iter()
        .find(|e| e["event"] == "left" && e["member"]["name"] == "late")
        .unwrap_or_else(|| panic!("the member's leave reached the pool: {fe:?}"));
    assert_eq!(
        said.lines().last(),
        Some(format!("left {}", left["seq"]).as_str()),
        "the member got its leave's answer (it was not killed waiting for it): {said:?}"
    );
    job.stop();
}

#[test]
fn the_remote_winner_killed_is_replaced_everywhere_with_a_higher_epoch() {
    let name = "the_remote_winner_killed_is_replaced_everywhere_with_a_higher_epoch";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let job = JelJob::start(
        &env,
        "\"$J\" watch --from 1 --json > \"$D/fe\" &\n\
         rsh anyLinux-1 \"$J join --name r1 -- sh -c '$J elect master; exec sleep 600'\" </dev/null &\n\
         until grep -q '\"elected\"' \"$D/fe\"; do sleep 0.1; done\n\
         rsh anyLinux-2 \"$J join --name r2 -- sh -c '$J elect master >&2; $J watch --from 1 \
         --json'\" > \"$D/r2\" </dev/null &\n\
         \"$J\" join --name fe -- sh -c '\"$J\" elect master > \"$D/fe.elect\"; exec sleep 600' &",
    );
    let within = Duration::from_secs(30);
    let first = job.wait_event("fe", within, |e| e["event"] == "elected");
    assert_eq!(first["winner"]["name"], "r1", "{first}");
    let r1 = job.wait_event("fe", within, |e| joined(e, "r1"));
    // Both other candidates stand (r2's watcher runs once its elect returned).
    wait_until(within, || {
        let fe_stood = std::fs::read_to_string(job.file("fe.elect")).ok()?;
        (!fe_stood.is_empty()).then_some(())
    })
    .expect("fe stands");
    job.wait_event("r2", within, |e| joined(e, "r2"));
    let (host, pid) = (host_of(&r1), r1["member"]["pid"].to_string());
    let out = env.lab.exec(&host, &["kill", "-KILL", &pid]).expect("kill");
    assert!(out.status.success(), "kill {pid} on {host}: {out:?}");
    let epoch = first["epoch"].as_u64().expect("epoch");
    let next = |e: &serde_json::Value| {
        e["event"] == "elected" && e["epoch"].as_u64().is_some_and(|n| n > epoch)
    };
    let fe_saw = job.wait_event("fe", within, next);
    let r2_saw = job.wait_event("r2", within, next);
    assert_eq!(fe_saw, r2_saw, "one winner, known everywhere");
    let winner = fe_saw["winner"]["name"].as_str().expect("a winner");
    assert!(["r2", "fe"].contains(&winner), "{fe_saw}");
    let death = job.wait_event("fe", within, |e| died(e, "r1"));
    assert!(
        death["seq"].as_u64() < fe_saw["seq"].as_u64(),
        "{death} before {fe_saw}"
    );
    job.stop();
}

#[test]
fn a_remote_watcher_that_reconnects_from_its_seq_gets_no_gap_and_no_duplicate() {
    let name = "a_remote_watcher_that_reconnects_from_its_seq_gets_no_gap_and_no_duplicate";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let job = JelJob::start(
        &env,
        "\"$J\" watch --from 1 --json > \"$D/fe\" &\n\
         rsh anyLinux-1 \"$J\" watch --from 1 --json > \"$D/w1\" </dev/null &\n\
         for i in 1 2 3; do \"$J\" join --name a$i -- sleep 600 & done\n\
         until [ -e \"$D/from\" ]; do sleep 0.1; done\n\
         for i in 4 5; do \"$J\" join --name a$i -- sleep 600 & done\n\
         until grep -q '\"a5\"' \"$D/fe\"; do sleep 0.1; done\n\
         rsh anyLinux-1 \"$J\" watch --from \"$(cat \"$D/from\")\" --json > \"$D/w2\" </dev/null &",
    );
    let within = Duration::from_secs(30);
    let granted = job.wait_event("w1", within, |e| e["event"] == "host_granted");
    job.wait_event("w1", within, |e| joined(e, "a3"));
    // The watcher on the host is cut off: its process killed there.
    let host = granted["host"].as_str().expect("host").to_string();
    let pids = env
        .lab
        .exec(&host, &["pgrep", "-x", "rb-jel"])
        .expect("pgrep");
    let pids = String::from_utf8_lossy(&pids.stdout).to_string();
    let pid: Vec<&str> = pids.split_whitespace().collect();
    assert_eq!(pid.len(), 1, "one rb-jel on {host}: {pids}");
    let out = env
        .lab
        .exec(&host, &["kill", "-KILL", pid[0]])
        .expect("kill");
    assert!(out.status.success(), "{out:?}");
    let before = job.events("w1");
    let last = before
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .max()
        .expect("seqs");
    std::fs::write(job.file("from"), (last + 1).to_string()).expect("from");
    job.wait_event("w2", within, |e| joined(e, "a5"));
    let after = job.events("w2");
    let seqs: Vec<u64> = before
        .iter()
        .chain(&after)
        .filter_map(|e| e["seq"].as_u64())
        .collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "no gap, no duplicate across the reconnect");
    let fe = job.events("fe");
    same_stream(&fe, &before);
    same_stream(&fe, &after);
    job.stop();
}

#[test]
fn a_crashed_hosts_members_die_host_lost_once_the_subagents_deadline_has_passed() {
    let name = "a_crashed_hosts_members_die_host_lost_once_the_subagents_deadline_has_passed";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let job = JelJob::start(
        &env,
        "\"$J\" watch --from 1 --json > \"$D/fe\" &\n\
         rsh anyLinux-1 \"$J\" join --name r1 -- sleep 600 </dev/null &\n\
         rsh anyLinux-1 \"$J\" join --name r2 -- sleep 600 </dev/null &",
    );
    let within = Duration::from_secs(30);
    let host = host_of(&job.wait_event("fe", within, |e| joined(e, "r1")));
    job.wait_event("fe", within, |e| joined(e, "r2"));
    let crashed = Instant::now();
    env.lab.crash(&host).expect("crash");
    // The subagent's deadline: 6 s of retries, a last connect and handshake, 1 s of grace.
    let limit = Duration::from_millis(15_500);
    let death = job.wait_event("fe", limit + within, |e| died(e, "r1"));
    let waited = crashed.elapsed();
    assert_eq!(death["reason"], "host_lost", "{death}");
    assert!(
        waited >= limit,
        "died{{host_lost}} after {waited:?}, before {limit:?}"
    );
    let other = job.wait_event("fe", within, |e| died(e, "r2"));
    assert_eq!(other["reason"], "host_lost", "{other}");
    // Nothing else about them came before (no `exited` when the links broke).
    let fe = job.events("fe");
    let deaths = fe.iter().filter(|e| e["event"] == "died").count();
    assert_eq!(deaths, 2, "{fe:?}");
    env.lab.boot(&host).expect("boot");
    drop(job);
}

/// The lines a child prints, collected by a thread as they come.
fn collect_lines(out: std::process::ChildStdout) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use std::io::BufRead;
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&lines);
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            sink.lock().expect("lines").push(line);
        }
    });
    lines
}

#[test]
fn releasing_the_front_ends_own_host_ends_only_the_members_started_under_the_grant() {
    let name = "releasing_the_front_ends_own_host_ends_only_the_members_started_under_the_grant";
    if skip_unless_root(name) {
        return;
    }
    // One lab host, the front end, managed: the job's grant is its own machine.
    let env = LabWithBroker::start_with_managed_front_end(1);
    let jel = bin("rb-jel").display().to_string();
    let script = format!(
        "J='{jel}'; export J\n\
         \"$J\" watch --from 1 --json &\n\
         \"$J\" join --name fe -- sleep 600 &\n\
         rsh anyLinux-1 \"$J\" join --name g -- sleep 600 </dev/null &\n\
         until \"$J\" members --json | grep -q '\"g\"'; do sleep 0.1; done\n\
         until \"$J\" members --json | grep -q '\"fe\"'; do sleep 0.1; done\n\
         echo READY\n\
         while \"$J\" members --json | grep -q '\"g\"'; do sleep 0.1; done\n\
         echo \"MEMBERS $(\"$J\" members --json)\""
    );
    let mut child = env
        .agent_as_user(FRONT_END, &[], &["sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("agent");
    let lines = collect_lines(child.stdout.take().expect("stdout"));
    let has = |prefix: &str| {
        let lines = lines.lock().expect("lines");
        lines.iter().find(|l| l.starts_with(prefix)).cloned()
    };
    let ready = wait_until(Duration::from_secs(40), || has("READY"));
    if ready.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "both members never joined: {:?}",
            lines.lock().expect("lines")
        );
    }
    let out = env.broker.rb(&["release", FRONT_END, "--grace-s", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let members = wait_until(Duration::from_secs(30), || has("MEMBERS "));
    let status = wait_until(Duration::from_secs(30), || child.try_wait().ok().flatten());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let seen: Vec<serde_json::Value> = lines
        .lock()
        .expect("lines")
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let members = members.unwrap_or_else(|| panic!("no members listed: {seen:?}"));
    let members: serde_json::Value =
        serde_json::from_str(members.trim_start_matches("MEMBERS ")).expect("members json");
    let names: Vec<(&str, &str)> = members
        .as_array()
        .expect("array")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or(""),
                m["host"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(names, [("fe", FRONT_END)], "the front end's member stays");
    let g = seen.iter().find(|e| died(e, "g")).expect("g died");
    assert_eq!(g["reason"], "vacated", "{g}");
    assert!(!seen.iter().any(|e| died(e, "fe")), "{seen:?}");
    let vacate = seen
        .iter()
        .find(|e| e["event"] == "vacate")
        .expect("vacate");
    let listed: Vec<&str> = vacate["members"]
        .as_array()
        .expect("vacate's members")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(listed, ["g"], "{vacate}");
    let fe = seen.iter().find(|e| joined(e, "fe")).expect("fe joined");
    assert_eq!(fe["member"]["host"], FRONT_END, "the front end's lab name");
}
