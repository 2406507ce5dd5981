//! The fault-injection suite: a seeded stream of real jobs on a real lab (agents on
//! the gateway, `rsh anyLinux-N` over ssh to namespaced hosts, releases, owner returns, job
//! ends) with faults injected at random points, and the invariants checked after each:
//! no host in two live allocations, running jobs keep their hosts and queued requests, no
//! process of an ended job on any host, every agent exits within a bound after its app.
//!
//! `RB_FAULT_SEED` replays a run (the seed is printed); `RB_FAULT_KILLS` sets the number of
//! faults (10 by default, >= 100 from `bench/faults/run.sh`). Each scenario writes
//! `target/faults/SCENARIO.json`, which `bench/faults/run.sh` turns into `RELIABILITY.md`.
//! Root only; each test prints why it is skipped otherwise.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use tests::{
    faults::{
        being_taken, exclusive, job_processes, kept, leftovers, reclaims_logged, released_in_time,
        shared_hosts,
        stream::{budget, kill_one, pin_port, stream_lab, Stream, Victim},
        FaultConfig, Jobs, View,
    },
    labtier::{skip_unless_root, LabWithBroker},
    wait_until,
};

#[test]
fn broker_sigkilled_at_random_points_loses_no_job_host_or_request() {
    let name = "broker_sigkilled_at_random_points_loses_no_job_host_or_request";
    if skip_unless_root(name) {
        return;
    }
    let cfg = FaultConfig::from_env("broker_kill", 10);
    let mut env = stream_lab();
    let mut s = Stream::new("broker_kill", cfg.seed);
    let deadline = budget(cfg.kills);
    let mut log_seen = 0;
    for _ in 0..cfg.kills {
        if Instant::now() > deadline {
            s.tally
                .violations
                .push(format!("time budget spent before {} kills", cfg.kills));
            break;
        }
        for _ in 0..1 + s.rng.below(3) {
            s.step(&env);
        }
        // The kill point: a random moment of the stream, not a wait for a condition.
        std::thread::sleep(s.rng.millis(0, 1500));
        let Some(before) = wait_until(Duration::from_secs(5), || View::take(&env)) else {
            panic!("broker not answering before a kill:\n{}", env.broker.log());
        };
        s.taken.extend(being_taken(&before));
        eprintln!("fault: broker killed");
        env.broker.kill_and_restart();
        let after = wait_until(Duration::from_secs(10), || View::take(&env));
        let log = env.broker.log();
        s.taken
            .extend(reclaims_logged(log.get(log_seen..).unwrap_or_default()));
        log_seen = log.len();
        let mut out = match &after {
            None => vec!["broker not answering 10 s after a restart".to_string()],
            Some(after) => {
                let live: Vec<String> = s.jobs.live().map(|j| j.marker.clone()).collect();
                let mut v = exclusive(after);
                v.extend(released_in_time(&env, after));
                v.extend(kept(&before, after, &live, &s.taken));
                v
            }
        };
        out.extend(s.ended_checks(&env));
        s.tally.fault("broker_kill", out);
        s.taken.clear();
    }
    s.finish(&env);
}

#[test]
fn hostd_subagent_and_agent_sigkilled_at_random_points_leave_nothing_behind() {
    let name = "hostd_subagent_and_agent_sigkilled_at_random_points_leave_nothing_behind";
    if skip_unless_root(name) {
        return;
    }
    let cfg = FaultConfig::from_env("daemon_kill", 10);
    let env = stream_lab();
    let mut s = Stream::new("daemon_kill", cfg.seed);
    let deadline = budget(cfg.kills);
    let victims = [Victim::Hostd, Victim::Subagent, Victim::Agent];
    let mut done = 0;
    while done < cfg.kills && Instant::now() < deadline {
        for _ in 0..1 + s.rng.below(3) {
            s.step(&env);
        }
        std::thread::sleep(s.rng.millis(0, 1500));
        let victim = victims[s.rng.below(victims.len())];
        if !kill_one(&env, &mut s, victim) {
            continue;
        }
        eprintln!("fault: {victim:?} killed");
        done += 1;
        // Every host up again (the broker restarts a killed daemon), then the checks.
        let up = wait_until(Duration::from_secs(20), || {
            env.broker
                .status()
                .filter(|hs| hs.iter().all(|h| h.state == proto::report::HostState::Up))
        });
        let mut out = Vec::new();
        if up.is_none() {
            out.push(format!("not every host up 20 s after a {victim:?} kill"));
        }
        match View::take(&env) {
            Some(view) => {
                out.extend(exclusive(&view));
                out.extend(released_in_time(&env, &view));
            }
            None => out.push("broker not answering".into()),
        }
        out.extend(s.ended_checks(&env));
        s.tally.fault(victim.name(), out);
    }
    if done < cfg.kills {
        s.tally.violations.push(format!(
            "time budget spent after {done} of {} kills",
            cfg.kills
        ));
    }
    s.finish(&env);
}

/// Pid of the guardian of the subagent running on `host`: the `rb-subagent` whose parent
/// is an `rb-subagent` (the front forks it).
fn guardian_pid(env: &LabWithBroker, host: &str) -> Option<String> {
    let script = "for p in $(pgrep -x rb-subagent); do \
                  pp=$(awk '/^PPid:/{print $2}' /proc/$p/status); \
                  [ \"$(cat /proc/$pp/comm 2>/dev/null)\" = rb-subagent ] && echo $p; done; true";
    let out = env.lab.exec(host, &["sh", "-c", script]).ok()?;
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!pid.is_empty()).then_some(pid)
}

#[test]
fn sigkilled_subagent_guardian_leaves_no_process_of_the_ended_job() {
    let name = "sigkilled_subagent_guardian_leaves_no_process_of_the_ended_job";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let mut jobs = Jobs::new("guardian_kill");
    let marker = jobs.start(&env, 1).marker.clone();
    let (host, _) = wait_until(Duration::from_secs(15), || {
        job_processes(&env).into_iter().find(|(_, m)| *m == marker)
    })
    .expect("the job's remote sleep running");
    let guardian = wait_until(Duration::from_secs(5), || guardian_pid(&env, &host))
        .expect("the subagent's guardian");
    env.lab
        .exec(&host, &["kill", "-9", &guardian])
        .expect("kill guardian");
    // The command comes to the front (a subreaper), which sees its guardian gone and ends
    // it while the job still holds the host: no sweep of the host's daemon is involved. A
    // command that inherited the front's pipe from the guardian held it open, and the front
    // waited for the command instead (seed 1796086143053094066 of
    // `hostd_subagent_and_agent_sigkilled…`: the job's end then waited for that remote shell).
    let ended_by_front = wait_until(Duration::from_secs(5), || {
        let procs = job_processes(&env);
        (!procs.iter().any(|(h, m)| *h == host && *m == marker)).then_some(())
    });
    let view = View::take(&env).expect("the broker answers");
    let held = view
        .job(&marker)
        .and_then(|j| j["hosts"].as_array())
        .is_some_and(|hosts| hosts.iter().any(|h| h.as_str() == Some(host.as_str())));
    let mut out = jobs.end_all();
    if ended_by_front.is_none() {
        out.push(format!(
            "{host}: {marker}'s command still runs 5 s after its guardian was SIGKILLed"
        ));
    }
    if !held {
        out.push(format!(
            "{marker} no longer holds {host}: the front's end is not shown"
        ));
    }
    out.extend(leftovers(&env, &jobs.ended_markers()));
    assert!(out.is_empty(), "{out:?}");
}

/// Pid of the front of the subagent running on `host`: the `rb-subagent` whose parent is
/// not an `rb-subagent` (the remote shell's).
fn front_pid(env: &LabWithBroker, host: &str) -> Option<String> {
    let script = "for p in $(pgrep -x rb-subagent); do \
                  pp=$(awk '/^PPid:/{print $2}' /proc/$p/status); \
                  [ \"$(cat /proc/$pp/comm 2>/dev/null)\" = rb-subagent ] || echo $p; done; true";
    let out = env.lab.exec(host, &["sh", "-c", script]).ok()?;
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!pid.is_empty() && !pid.contains('\n')).then_some(pid)
}

/// Found by `hostd_subagent_and_agent_sigkilled…`, seed 1795507071920840295: the
/// subagent's front SIGKILLed, then its guardian: nothing watches the command any more, the
/// agent (its subagent gone) answers a reclaim at once, and the host goes to the next job
/// with the first job's command still running there. The host daemon ends it once the
/// allocation is over.
#[test]
fn sigkilled_subagent_front_then_guardian_leave_no_process_once_the_host_is_taken_back() {
    let name =
        "sigkilled_subagent_front_then_guardian_leave_no_process_once_the_host_is_taken_back";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let mut jobs = Jobs::new("front_then_guardian_kill");
    let marker = jobs.start(&env, 1).marker.clone();
    let (host, _) = wait_until(Duration::from_secs(15), || {
        job_processes(&env).into_iter().find(|(_, m)| *m == marker)
    })
    .expect("the job's remote sleep running");
    let guardian = wait_until(Duration::from_secs(5), || guardian_pid(&env, &host))
        .expect("the subagent's guardian");
    let front = front_pid(&env, &host).expect("the subagent's front");
    env.lab
        .exec(&host, &["kill", "-9", &front])
        .expect("kill front");
    // The guardian sees its front gone (the command's status never comes) and stays, as the
    // command still runs; then it is killed too.
    env.lab
        .exec(&host, &["kill", "-9", &guardian])
        .expect("kill guardian");
    let still = job_processes(&env)
        .into_iter()
        .any(|(h, m)| h == host && m == marker);
    assert!(still, "the job's command outlives both subagent processes");
    let released = env.broker.rb(&["release", &host, "--grace-s", "1"]);
    assert!(released.status.success(), "rb release: {released:?}");
    let gone = wait_until(Duration::from_secs(10), || {
        let procs = job_processes(&env);
        (!procs.iter().any(|(h, m)| *h == host && *m == marker)).then_some(())
    });
    let mut out = Vec::new();
    if gone.is_none() {
        out.push(format!(
            "{host}: {marker}'s command still runs 10 s after the host was taken back"
        ));
    }
    out.extend(jobs.end_all());
    out.extend(leftovers(&env, &jobs.ended_markers()));
    assert!(out.is_empty(), "{out:?}");
}

/// A host fault injected while the host is being taken back.
#[derive(Debug, Clone, Copy, PartialEq)]
enum HostFault {
    Crash,
    Partition,
}

/// Job 1 holds a host with a command that outlasts SIGTERM; `rb release` takes it back
/// with a 5 s grace and, within the grace, the host crashes or is cut off; job 2 asks for
/// a host meanwhile. Checked all along and after the host is back: no host in two live
/// allocations, never processes of two jobs on one host, none left of ended jobs.
fn host_fault_during_reclaim(fault: HostFault, scenario: &str) {
    let cfg = FaultConfig::from_env(scenario, 1);
    let env = LabWithBroker::start(3, &[]);
    let mut s = Stream::new(scenario, cfg.seed);
    let marker = s
        .jobs
        .start_running(&env, 1, "trap '' TERM; sleep 600")
        .marker
        .clone();
    let (host, _) = wait_until(Duration::from_secs(15), || {
        job_processes(&env).into_iter().find(|(_, m)| *m == marker)
    })
    .expect("job 1's command running");
    let _ = env.broker.rb(&["release", &host, "--grace-s", "5"]);
    std::thread::sleep(s.rng.millis(200, 3000)); // a random point of the grace period
    eprintln!("fault: {fault:?} {host} during its reclaim");
    match fault {
        HostFault::Crash => env.lab.crash(&host).expect("crash"),
        HostFault::Partition => env.lab.partition(&host).expect("partition"),
    }
    s.jobs.start(&env, 2);
    s.tally.jobs += 2;
    let mut out = Vec::new();
    // While the host is away (past the down limit and the subagent's agent-loss limit).
    let away_until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < away_until {
        if let Some(view) = View::take(&env) {
            out.extend(exclusive(&view));
        }
        out.extend(shared_hosts(&job_processes(&env)));
        std::thread::sleep(Duration::from_millis(500));
    }
    match fault {
        HostFault::Crash => env.lab.boot(&host).expect("boot"),
        HostFault::Partition => env.lab.heal(&host).expect("heal"),
    }
    env.broker
        .wait_host(&host, Duration::from_secs(20), "back up", |h| {
            h.state == proto::report::HostState::Up
        });
    let old = wait_until(Duration::from_secs(10), || {
        let procs = job_processes(&env);
        (!procs.iter().any(|(h, m)| *h == host && *m == marker)).then_some(())
    });
    if old.is_none() {
        out.push(format!(
            "{host}: job 1's command still runs 10 s after the host came back from its reclaim"
        ));
        s.tally.left.insert(format!("{host}: job 1's command"));
    }
    if let Some(view) = View::take(&env) {
        out.extend(exclusive(&view));
        out.extend(released_in_time(&env, &view));
        if view.job(&marker).is_some_and(|j| {
            j["hosts"]
                .as_array()
                .is_some_and(|hs| hs.iter().any(|h| *h == host))
        }) {
            out.push(format!("{host} still held by job 1 after its reclaim"));
        }
    }
    out.extend(s.ended_checks(&env));
    let kind = format!("{fault:?}_during_reclaim").to_lowercase();
    s.tally.fault(&kind, out);
    s.finish(&env);
}

#[test]
fn host_crash_during_a_reclaim_loses_no_host_and_leaves_nothing_behind() {
    let name = "host_crash_during_a_reclaim_loses_no_host_and_leaves_nothing_behind";
    if skip_unless_root(name) {
        return;
    }
    host_fault_during_reclaim(HostFault::Crash, "crash_during_reclaim");
}

#[test]
fn host_partition_during_a_reclaim_loses_no_host_and_leaves_nothing_behind() {
    let name = "host_partition_during_a_reclaim_loses_no_host_and_leaves_nothing_behind";
    if skip_unless_root(name) {
        return;
    }
    host_fault_during_reclaim(HostFault::Partition, "partition_during_reclaim");
}

/// Unmounts the tmpfs under the broker's state dir (after the broker has stopped).
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the file system of `dir` with `dir/fill` until it is full.
fn fill(dir: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("fill")).expect("create fill");
    let block = vec![0u8; 64 * 1024];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
}

#[test]
fn full_state_dir_keeps_serving_refuses_new_jobs_and_loses_nothing_committed() {
    let name = "full_state_dir_keeps_serving_refuses_new_jobs_and_loses_nothing_committed";
    if skip_unless_root(name) {
        return;
    }
    let cfg = FaultConfig::from_env("state_dir_full", 1);
    let lab = lab::Lab::up(&lab::LabSpec {
        hosts: 3,
        ..lab::LabSpec::default()
    })
    .expect("lab up");
    let mut state = std::path::PathBuf::new();
    // Declared before the broker: unmounted after it stopped (also on a failed start).
    let mut unmount = None;
    let broker = tests::Broker::start_prepared(
        &tests::labtier::lab_file(&lab, &[], tests::labtier::TEST_TIMING),
        |dir| {
            std::fs::create_dir_all(dir).expect("mkdir state");
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=8m,mode=0700", "rbfaults"])
                .arg(dir)
                .status()
                .expect("mount");
            assert!(ok.success(), "mount tmpfs on {}", dir.display());
            unmount = Some(Unmount(dir.to_path_buf()));
            state = dir.to_path_buf();
        },
    );
    let mut env = LabWithBroker { broker, lab };
    env.broker.wait_all_up(Duration::from_secs(20));
    pin_port(&mut env);
    let mut s = Stream::new("state_dir_full", cfg.seed);
    let a = s.jobs.start(&env, 1).marker.clone();
    s.tally.jobs += 2; // A, and B which is refused
    let committed = wait_until(Duration::from_secs(15), || {
        View::take(&env).and_then(|v| v.job(&a).cloned().filter(|j| j["hosts"][0].is_string()))
    })
    .expect("job A holds a host");
    // The broker writes its state off the hot path: give the writer a moment to commit.
    std::thread::sleep(Duration::from_secs(1));
    eprintln!("fault: state dir full");
    fill(&state);
    let mut out = Vec::new();
    // It keeps serving what it has.
    match View::take(&env) {
        Some(v) if v.job(&a).is_some_and(|j| j["hosts"] == committed["hosts"]) => {
            out.extend(exclusive(&v))
        }
        other => out.push(format!(
            "with a full state dir: job A not served: {other:?}"
        )),
    }
    // A new job is refused with a clear error.
    let b = std::process::Command::new(tests::bin("agent"))
        .arg("--broker")
        .arg(env.broker.tcp_addr().to_string())
        .arg("--secret-file")
        .arg(env.broker.secret())
        .args(["--", "true"])
        .env_remove("RB_AGENT")
        .env_remove("RB_LAB")
        .output()
        .expect("agent");
    let stderr = String::from_utf8_lossy(&b.stderr);
    if b.status.success() || !stderr.contains("state") {
        out.push(format!(
            "with a full state dir a new job was not refused clearly: {:?}, stderr: {stderr}",
            b.status
        ));
    }
    // Space back, broker killed and restarted: job A is still there with its host.
    std::fs::remove_file(state.join("fill")).expect("rm fill");
    env.broker.kill_and_restart();
    match wait_until(Duration::from_secs(10), || View::take(&env)) {
        Some(v) => {
            out.extend(exclusive(&v));
            let live = vec![a.clone()];
            let before = View {
                jobs: vec![committed.clone()],
                ..View::default()
            };
            out.extend(kept(&before, &v, &live, &BTreeSet::new()));
        }
        None => out.push("broker not answering after the restart".into()),
    }
    out.extend(s.ended_checks(&env));
    s.tally.fault("state_dir_full", out);
    s.finish(&env);
    // The tmpfs off the state dir before the broker's directory is removed: removing it
    // with the tmpfs mounted failed (busy), and every run left the directory behind.
    env.broker.stop();
    drop(unmount);
}
