//! Tier 2 for the agent layer: `agent` + the `rsh` shim + subagents against a broker with
//! virtual hosts (local transport). No root needed.

use std::{
    io::Write,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tests::{bin, local_lab, process_running, wait_until, Broker};

fn jobs(broker: &Broker) -> Vec<serde_json::Value> {
    broker.jobs()
}

#[test]
fn symbolic_host_runs_the_command_and_passes_the_exit_status() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let out = broker
        .agent(&[
            "sh",
            "-c",
            "rsh anyLinux echo hello from '$(hostname)'; rsh anyHost exit 42",
        ])
        .output()
        .expect("agent");
    assert_eq!(
        out.status.code(),
        Some(42),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("hello from "),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = broker
        .agent(&["rsh", "anyLinux", "kill -9 $$"])
        .output()
        .expect("agent");
    assert_eq!(
        out.status.code(),
        Some(137),
        "killed remote command → 128+9"
    );
    let out = broker
        .agent(&["sh", "-c", "exit 3"])
        .output()
        .expect("agent");
    assert_eq!(out.status.code(), Some(3), "the app's own status");
}

#[test]
fn stdin_is_relayed_to_the_remote_command_including_eof() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let mut child = broker
        .agent(&["rsh", "anyLinux", "wc -l"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("agent");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"one\ntwo\nthree\n")
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3");
}

#[test]
fn the_job_shows_in_rb_jobs_with_its_host_while_it_runs() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let mut child = broker
        .agent(&["rsh", "anyLinux", "sleep 30"])
        .spawn()
        .expect("agent");
    let row = wait_until(Duration::from_secs(10), || {
        jobs(&broker).into_iter().find(|j| {
            j["state"] == "running" && j["hosts"].as_array().is_some_and(|h| h.len() == 1)
        })
    })
    .expect("running job holding one host");
    assert!(row["user"].as_str().is_some());
    assert_eq!(row["argv"][0], "rsh");
    let host = row["hosts"][0].as_str().expect("host").to_string();
    // rb release: the remote sleep gets SIGTERM, the shim returns, the host is free.
    let started = Instant::now();
    let out = broker.rb(&["release", &host, "--grace-s", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = wait_until(Duration::from_secs(10), || child.try_wait().ok().flatten())
        .expect("agent returned after release");
    assert_eq!(
        status.code(),
        Some(143),
        "remote sleep ended by SIGTERM (128+15)"
    );
    eprintln!("release → shim returned in {:?}", started.elapsed());
    wait_until(Duration::from_secs(5), || {
        jobs(&broker)
            .iter()
            .all(|j| j["hosts"].as_array().is_none_or(|h| h.is_empty()))
            .then_some(())
    })
    .expect("host free after release");
}

#[test]
fn a_request_beyond_the_lab_waits_then_proceeds_when_a_host_frees() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let mut first = broker
        .agent(&["rsh", "anyLinux", "sleep 2"])
        .spawn()
        .expect("first");
    wait_until(Duration::from_secs(10), || {
        jobs(&broker)
            .iter()
            .any(|j| j["hosts"].as_array().is_some_and(|h| !h.is_empty()))
            .then_some(())
    })
    .expect("first holds the only host");
    let started = Instant::now();
    let second = broker
        .agent(&["rsh", "anyLinux", "echo second"])
        .output()
        .expect("second");
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&second.stdout).trim(), "second");
    assert!(
        started.elapsed() > Duration::from_millis(500),
        "second must have waited for the first"
    );
    assert!(first.wait().expect("first").success());
}

#[test]
fn sigkilled_agent_leaves_no_process_of_the_job_behind() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let marker = format!("rbmarker{}", std::process::id());
    let mut child = broker
        .agent(&["rsh", "anyLinux", &format!("sleep 300 # {marker}")])
        .spawn()
        .expect("agent");
    let alive = || {
        let out = Command::new("pgrep")
            .args(["-f", &marker])
            .output()
            .expect("pgrep");
        !String::from_utf8_lossy(&out.stdout).trim().is_empty()
    };
    wait_until(Duration::from_secs(10), || alive().then_some(())).expect("remote sleep started");
    child.kill().expect("SIGKILL agent");
    let _ = child.wait();
    let gone = wait_until(Duration::from_secs(10), || (!alive()).then_some(()));
    assert!(
        gone.is_some(),
        "processes of the job survived their agent by 10 s"
    );
}

#[test]
fn broker_killed_and_restarted_mid_job_keeps_the_job_and_its_host() {
    let mut broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let script = "rsh anyLinux 'sleep 4; echo remote-done'; echo app-done";
    let child = broker
        .agent(&["sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("agent");
    let before = wait_until(Duration::from_secs(10), || {
        jobs(&broker).into_iter().find(|j| {
            j["state"] == "running" && j["hosts"].as_array().is_some_and(|h| h.len() == 1)
        })
    })
    .expect("job holds a host");
    broker.kill_and_restart();
    let after = wait_until(Duration::from_secs(10), || {
        jobs(&broker)
            .into_iter()
            .find(|j| j["id"] == before["id"] && j["state"] == "running")
    });
    let after = after.unwrap_or_else(|| {
        panic!(
            "job lost across the restart; jobs: {:?}\n{}",
            jobs(&broker),
            broker.log()
        )
    });
    assert_eq!(after["hosts"], before["hosts"], "allocation intact");
    let out = child.wait_with_output().expect("agent");
    assert!(out.status.success(), "job failed after the broker restart");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("remote-done") && stdout.contains("app-done"),
        "{stdout}"
    );
    assert!(broker.log().contains("job resumed"), "{}", broker.log());
}

/// The job ends while its broker is stopped, and the broker is then killed before it read
/// the agent's `end_job`: after its restart the job must be over and its host free within
/// seconds, not held for the broker's 60 s resume window with no agent to end it (the
/// agent waits for `job_ended` and tells the restarted broker again). Before the fix the
/// agent exited at once and the host stayed held (faults_lab, broker_kill: "hosts still
/// held after every job ended").
#[test]
fn a_job_end_the_broker_never_saved_is_told_again_after_its_restart() {
    let mut broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let dir = tempfile::tempdir().expect("tempdir");
    let stop = dir.path().join("stop");
    let log = dir.path().join("agent.log");
    let script = format!(
        "rsh anyLinux-1 true && while [ ! -e {0} ]; do sleep 0.05; done; rm {0}",
        stop.display()
    );
    let mut child = broker
        .agent(&["sh", "-c", &script])
        .env("RB_LOG", "info")
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("agent");
    let job = wait_until(Duration::from_secs(10), || {
        jobs(&broker).into_iter().find(|j| {
            j["state"] == "running" && j["hosts"].as_array().is_some_and(|h| h.len() == 1)
        })
    })
    .expect("job holds its instance's host");
    let broker_pid = nix::unistd::Pid::from_raw(broker.pid() as i32);
    nix::sys::signal::kill(broker_pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    std::fs::write(&stop, "").expect("stop file");
    let told = wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|l| l.contains("told the broker the job ended"))
    });
    assert!(
        told.is_some(),
        "the agent never ended the job:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    broker.kill_and_restart();
    let over = wait_until(Duration::from_secs(15), || {
        let running = jobs(&broker)
            .iter()
            .any(|j| j["id"] == job["id"] && j["state"] == "running");
        (!running && broker.held_hosts().is_empty()).then_some(())
    });
    assert!(
        over.is_some(),
        "job still running or its host held after the restart: {:?}\nagent:\n{}\nbroker:\n{}",
        jobs(&broker),
        std::fs::read_to_string(&log).unwrap_or_default(),
        broker.log()
    );
    let status = child.wait().expect("agent");
    assert!(status.success(), "agent: {status}");
}

#[test]
fn agent_rsl_spec_reaches_the_broker_in_both_forms() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let find_spec = |marker: &str| {
        wait_until(Duration::from_secs(10), || {
            jobs(&broker).into_iter().find(|j| {
                j["argv"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|w| w == marker))
            })
        })
    };
    let mut with_flag = Command::new(bin("agent"))
        .args([
            "--broker",
            broker.socket().to_str().expect("utf8"),
            "--rsl",
            "&(adaptive=yes)(module=\"pvm\")(count>=2)",
            "--",
            "sleep",
            "3.01",
        ])
        .spawn()
        .expect("agent --rsl");
    let row = find_spec("3.01").expect("job with --rsl");
    assert_eq!(row["spec"]["parts"][0]["module"], "pvm", "{row}");
    assert_eq!(row["spec"]["parts"][0]["adaptive"], true);
    assert_eq!(row["spec"]["parts"][0]["count"]["min"], 2);
    let mut paper = Command::new(bin("agent"))
        .args([
            "--broker",
            broker.socket().to_str().expect("utf8"),
            "sleep",
            "3.02",
            "--",
            "(module=\"lam\")",
        ])
        .spawn()
        .expect("agent paper form");
    let row = find_spec("3.02").expect("job with the paper's form");
    assert_eq!(row["spec"]["parts"][0]["module"], "lam", "{row}");
    assert_eq!(
        row["argv"],
        serde_json::json!(["sleep", "3.02"]),
        "the spec is not passed to the app"
    );
    assert!(with_flag.wait().expect("wait").success());
    assert!(paper.wait().expect("wait").success());
    let bad = Command::new(bin("agent"))
        .args([
            "--broker",
            broker.socket().to_str().expect("utf8"),
            "--rsl",
            "&(cuont=2)",
            "true",
        ])
        .output()
        .expect("agent");
    assert_eq!(bad.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("did you mean `count`"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

#[test]
fn another_uid_cannot_use_a_jobs_agent_socket() {
    if !tests::is_root() {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: another_uid_cannot_use_a_jobs_agent_socket: needs root to act as another uid"
        );
        return;
    }
    use std::os::unix::process::CommandExt;
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let dir = tempfile::tempdir().expect("tempdir");
    let sock_file = dir.path().join("sock");
    // The app publishes its agent socket, opened up to everyone at the file level, and waits.
    let script = format!(
        "echo $RB_AGENT > {0}; chmod 777 $(dirname $RB_AGENT) $RB_AGENT; sleep 5",
        sock_file.display()
    );
    let mut job = broker.agent(&["sh", "-c", &script]).spawn().expect("agent");
    let sock = wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&sock_file)
            .ok()
            .filter(|s| !s.trim().is_empty())
    })
    .expect("socket path");
    let _ = Command::new("chmod").args(["755", "/tmp/rb-0"]).status();
    let out = Command::new(bin("rsh"))
        .args(["anyLinux", "true"])
        .env("RB_AGENT", sock.trim())
        .uid(65534)
        .gid(65534)
        .output()
        .expect("rsh as nobody");
    assert!(!out.status.success(), "another uid was served");
    assert!(
        jobs(&broker)
            .iter()
            .all(|j| j["hosts"].as_array().is_none_or(|h| h.is_empty())),
        "no host was allocated for the intruder"
    );
    let _ = job.kill();
    let _ = job.wait();
}

#[test]
fn a_command_started_with_sigterm_blocked_gets_it_unblocked() {
    // As under an inetd started with SIGTERM blocked (in.rshd passes the mask on): the
    // subagent must unblock it, or a reclaim's SIGTERM never arrives.
    let out = Command::new("python3")
        .args([
            "-c",
            "import os,signal,sys; signal.pthread_sigmask(signal.SIG_BLOCK,[signal.SIGTERM]); \
             os.execv(sys.argv[1], sys.argv[1:])",
        ])
        .arg(bin("rb-subagent"))
        .args(agentless_subagent_args(
            "exec grep SigBlk /proc/self/status",
        ))
        .output()
        .expect("python3 starts the subagent with SIGTERM blocked");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim(), "SigBlk:\t0000000000000000");
}

/// rb-subagent's arguments for `command` with no agent to reach (its guardian gives up
/// quietly once the command is gone).
fn agentless_subagent_args(command: &str) -> [&str; 8] {
    [
        "--agent",
        "127.0.0.1:1",
        "--alloc",
        "1",
        "--secret-file",
        "/nonexistent",
        "-c",
        command,
    ]
}

/// Runs `rb-subagent -c COMMAND` with no agent to reach, `path` first in PATH.
fn subagent_run(command: &str, path: &std::path::Path) -> std::process::Output {
    Command::new(bin("rb-subagent"))
        .args(agentless_subagent_args(command))
        .env("PATH", format!("{}:/usr/bin:/bin", path.display()))
        .output()
        .expect("rb-subagent runs")
}

#[test]
fn a_remote_command_runs_as_sh_c_would_whether_or_not_it_needs_a_shell() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    // A script without `#!`: exec fails with ENOEXEC, sh runs it as a shell script.
    let script = dir.path().join("no-hash-bang");
    std::fs::write(&script, "echo \"script: $*\"\n").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let cases: &[(&str, &str, i32)] = &[
        // Plain words, exec'd directly: quotes removed, blanks inside quotes kept, and the
        // program looked up in PATH.
        (r#"printf '%s|' 'a  b' c"d e" x'y'"#, "a  b|cd e|xy|", 0),
        ("no-hash-bang one two", "script: one two\n", 0),
        ("sh -c 'exit 3'", "", 3),
        // Needs the shell.
        ("echo $((1 + 2)) | tr 3 4", "4\n", 0),
        ("X=5; echo $X", "5\n", 0),
    ];
    for (command, stdout, code) in cases {
        let out = subagent_run(command, dir.path());
        assert_eq!(
            (
                String::from_utf8_lossy(&out.stdout).as_ref(),
                out.status.code()
            ),
            (*stdout, Some(*code)),
            "{command}: stderr {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Plain words start with no shell in between.
    let out = subagent_run(
        r#"python3 -c 'import os; print(open("/proc/%d/comm" % os.getppid()).read().strip())'"#,
        dir.path(),
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "rb-subagent");
    // Not found, or not executable: the shell's message and exit code.
    let out = subagent_run("no-such-program-rb arg", dir.path());
    assert_eq!(out.status.code(), Some(127));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-program-rb: not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = subagent_run(&format!("{} x", script.display()), dir.path());
    assert_eq!(out.status.code(), Some(126), "not executable");
}

#[test]
fn a_host_whose_remote_shell_fails_goes_back_while_the_job_runs_on() {
    // The remote shell fails before it starts the subagent there (as ssh does when the host
    // refuses the login). The job goes on; the host must not stay held until it ends.
    let lab = local_lab(1).replacen(
        "[broker]\n",
        "[broker]\njob_shell = [\"sh\", \"-c\", \"echo refused >&2; exit 255\", \"failing-shell\"]\n",
        1,
    );
    let broker = Broker::start(&lab);
    broker.wait_all_up(Duration::from_secs(10));
    let mut job = broker
        .agent(&[
            "sh",
            "-c",
            "rsh anyLinux true; echo \"rsh: $?\"; exec sleep 60",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("job");
    let mut stdout = std::io::BufReader::new(job.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).expect("read");
    assert_eq!(
        line.trim(),
        "rsh: 255",
        "the remote shell's failure reaches the job"
    );
    let freed = wait_until(Duration::from_secs(20), || {
        broker.held_hosts().is_empty().then_some(())
    });
    let still_running = job.try_wait().expect("try_wait").is_none();
    // SIGTERM: the agent passes it to the job's processes and ends.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(job.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = job.wait();
    freed.expect("the host goes back while the job still runs");
    assert!(still_running, "the job was still running");
}

#[test]
fn a_host_reclaimed_while_its_command_starts_is_free_only_once_that_command_is_gone() {
    // A remote shell that takes a second to start the subagent: the reclaim arrives after
    // the grant but before anything runs there. The host must not be given back until the
    // command that was on its way has started, been told to end, and ended.
    // It marks the moment the launch reaches the host (the command itself may be ended
    // before it does anything).
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("launched");
    let slow_shell = format!(
        "sleep 1; touch '{}'; exec '{}' local-shell \"$@\"",
        marker.display(),
        bin("rb-subagent").display()
    );
    let lab = local_lab(1).replacen(
        "[broker]\n",
        &format!(
            "[broker]\njob_shell = [\"sh\", \"-c\", {}, \"slow-shell\"]\n",
            serde_json::to_string(&slow_shell).expect("json")
        ),
        1,
    );
    let broker = Broker::start(&lab);
    broker.wait_all_up(Duration::from_secs(10));
    let mut holder = broker
        .agent(&["rsh", "anyLinux", "exec sleep 30"])
        .spawn()
        .expect("holder");
    wait_until(Duration::from_secs(10), || {
        (!broker.held_hosts().is_empty()).then_some(())
    })
    .expect("the holder is granted the host");
    assert!(!marker.exists(), "the slow shell has not started it yet");
    let out = broker.rb(&["release", "vhost01", "--grace-s", "5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(Duration::from_secs(10), || {
        broker.held_hosts().is_empty().then_some(())
    })
    .expect("the host is released");
    assert!(
        marker.exists(),
        "released before the launch on its way had even reached the host"
    );
    let status = holder.wait().expect("holder");
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "the command ended at SIGTERM"
    );
}

/// A stopped agent cannot keep a released host busy on the `local` transport: the host's
/// daemon ends the job's processes at the reclaim deadline, and the host goes to the next
/// job only once they are gone. The next job's command checks, on the host, whether the
/// first job's `sleep` still runs beside it.
#[test]
fn a_stopped_agents_processes_end_at_the_reclaim_deadline_before_the_host_goes_on() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let sleep = format!("sleep 1777.{}", std::process::id());
    let pattern = format!("^{}$", sleep.replace('.', "[.]"));
    let mut holder = broker
        .agent(&["rsh", "anyLinux", &format!("exec {sleep}")])
        .spawn()
        .expect("holder");
    let alive = || {
        let out = Command::new("pgrep")
            .args(["-f", &pattern])
            .output()
            .expect("pgrep");
        out.status.success()
    };
    wait_until(Duration::from_secs(10), || alive().then_some(())).expect("the sleep started");
    let agent = nix::unistd::Pid::from_raw(holder.id() as i32);
    nix::sys::signal::kill(agent, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    let check = format!("pgrep -f '{pattern}' >/dev/null && echo BESIDE || echo ALONE");
    let next = broker
        .agent(&["rsh", "anyLinux", &check])
        .stdout(Stdio::piped())
        .spawn()
        .expect("next job");
    wait_until(Duration::from_secs(10), || {
        let waiting = jobs(&broker).iter().any(|j| {
            j["state"] == "running" && j["hosts"].as_array().is_some_and(|h| h.is_empty())
        });
        waiting.then_some(())
    })
    .expect("the next job waits for vhost01");
    let released = Instant::now();
    let out = broker.rb(&["release", "vhost01", "--grace-s", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gone = wait_until(Duration::from_secs(10), || {
        (!alive()).then(|| released.elapsed())
    });
    let next = next.wait_with_output().expect("next job");
    let _ = nix::sys::signal::kill(agent, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::signal::kill(agent, nix::sys::signal::Signal::SIGCONT);
    let _ = holder.wait();
    let gone = gone.expect("the stopped job's sleep ended");
    eprintln!("the stopped job's sleep ended {gone:?} after the release");
    assert!(
        gone <= Duration::from_secs(2),
        "the sleep ended {gone:?} after a release with 1 s of grace:\n{}",
        broker.log()
    );
    assert_eq!(
        String::from_utf8_lossy(&next.stdout).trim(),
        "ALONE",
        "the next job ran beside the stopped job's sleep:\n{}",
        broker.log()
    );
}

/// `RB_STEP_TIMES` (the `steptimes` crate): one `rsh anyLinux true` leaves the steps of
/// the shim, the agent and the subagent (told by the agent, `--step-times`) in the file, on
/// one clock, the granted allocation's in order; unset, no process writes a step.
#[test]
fn step_times_record_a_call_from_shim_to_subagent_and_nothing_when_unset() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("steps");
    let out = broker
        .agent(&["rsh", "anyLinux", "true"])
        .env(steptimes::ENV_STEP_TIMES, &file)
        .output()
        .expect("agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The guardian's last steps may come after the agent's end, or never: with the local
    // transport the guardian runs below the agent, whose end sweeps it away (a guardian that
    // connects after the job's last command ended is not waited for), so the file is read
    // once the guardian is gone, not once it wrote `sub.guardian_done`.
    let want = [
        "shim.start",
        "shim.request_sent",
        "agent.shim_request",
        "agent.allocate_sent",
        "agent.broker_granted",
        "agent.grant_sent",
        "shim.granted",
        "shim.spawn",
        "sub.start",
        "sub.command_spawned",
        "sub.command_exited",
        "sub.front_exit",
        "shim.child_exited",
        "shim.exit",
    ];
    let lines = wait_until(Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&file).ok()?;
        let lines: Vec<steptimes::Line> = text.lines().filter_map(steptimes::parse_line).collect();
        let guardian = lines.iter().find(|l| l.step == "sub.guardian_start")?.pid?;
        let all_there = want.iter().all(|w| lines.iter().any(|l| l.step == *w));
        (all_there && !process_running(guardian)).then_some(lines)
    })
    .unwrap_or_else(|| {
        panic!(
            "steps missing from {}:\n{}",
            file.display(),
            std::fs::read_to_string(&file).unwrap_or_default()
        )
    });
    let at = |step: &str| lines.iter().find(|l| l.step == step).map(|l| l.ns);
    let times: Vec<u64> = want.iter().filter_map(|w| at(w)).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "steps out of order: {:?}",
        want.iter().zip(&times).collect::<Vec<_>>()
    );
    let alloc = lines
        .iter()
        .find(|l| l.step == "shim.granted")
        .and_then(|l| l.alloc);
    assert!(alloc.is_some());
    for step in ["agent.grant_sent", "sub.start", "sub.command_exited"] {
        let l = lines.iter().find(|l| l.step == step).expect("present");
        assert_eq!(l.alloc, alloc, "{step}");
    }

    let before = std::fs::read_to_string(&file).expect("read");
    let out = broker
        .agent(&["rsh", "anyLinux", "true"])
        .env_remove(steptimes::ENV_STEP_TIMES)
        .output()
        .expect("agent");
    assert!(out.status.success());
    assert_eq!(std::fs::read_to_string(&file).expect("read"), before);
}
