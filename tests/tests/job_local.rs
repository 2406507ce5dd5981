//! Tier 2: what belongs to a job stays in it, on the front end too — against a broker with
//! virtual hosts (local transport). No root needed.
//! - The app and everything it started end when the agent dies, even by SIGKILL (the job's
//!   guardian), and so does an embedded broker the agent started; nothing else does.
//! - A caller that cleans its environment is still served by its job's agent.
//! - A subagent that loses its agent says why it ends the command.
//! - A subagent's command inherits its caller's descriptors and none of the subagent's.
//! - A killed guardian's command is ended by the front, and the caller told why.

use std::{
    process::{Child, Command},
    time::Duration,
};

use tests::{bin, local_lab, proc_stat as stat, process_running as running, wait_until, Broker};

/// Pids of processes whose command line matches the extended regex `pattern`.
fn pgrep(pattern: &str) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-f", pattern])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The children of `pid`, whichever of its threads started them.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The one process matching `pattern` once it has a child: `[it, its child]`.
fn process_and_child(pattern: &str) -> Option<Vec<u32>> {
    let found = pgrep(pattern);
    let [pid] = found[..] else {
        return None;
    };
    let kids = children(pid);
    (!kids.is_empty()).then(|| [vec![pid], kids].concat())
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_sigkilled_agents_app_and_its_setsid_and_plain_children_are_gone_within_10_s() {
    let broker = Broker::start(&local_lab(1));
    let mark = format!("rbguard{}x", std::process::id());
    // The markers are made at run time from $1: only the children's command lines hold
    // them. The first child leaves the job's session and group, as pvmd and lamd do.
    let script =
        r#"setsid sh -c "sleep 401; : ${1}setsid" & sh -c "sleep 402; : ${1}plain" & wait"#;
    let mut job = broker
        .agent(&["sh", "-c", script, "sh", &mark])
        .spawn()
        .expect("agent");
    let found = wait_until(Duration::from_secs(10), || {
        let setsid = process_and_child(&format!("{mark}setsid"))?;
        let plain = process_and_child(&format!("{mark}plain"))?;
        Some((setsid, plain))
    });
    let Some((setsid, plain)) = found else {
        kill(&mut job);
        panic!("the app's two children did not start");
    };
    let session = |pid: u32| stat(pid).map(|f| f[3].clone());
    assert_eq!(
        session(setsid[0]),
        Some(setsid[0].to_string()),
        "the first child leads its own session"
    );
    job.kill().expect("SIGKILL the agent");
    let _ = job.wait();
    let all: Vec<u32> = [setsid, plain].concat();
    let gone = wait_until(Duration::from_secs(10), || {
        all.iter().all(|p| !running(*p)).then_some(())
    });
    let left: Vec<u32> = all.iter().copied().filter(|p| running(*p)).collect();
    for pid in &left {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        gone.is_some(),
        "processes of the job outlived its SIGKILLed agent by 10 s: {left:?}"
    );
}

#[test]
fn a_sigkilled_agents_embedded_broker_and_its_virtual_hosts_end_too() {
    // No broker configured: the agent starts an embedded one (four virtual hosts).
    let home = tempfile::tempdir().expect("home");
    let mut job = Command::new(bin("agent"))
        .args(["--", "sleep", "300"])
        .env_remove("RB_AGENT")
        .env_remove("RB_BROKER")
        .env_remove("RB_LAB")
        .env("HOME", home.path())
        .spawn()
        .expect("agent");
    let is = |pid: &u32, name: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
    };
    // The job running (its app, and the guardian that outlives the agent), the broker, and
    // its daemons once all four have started.
    let started = wait_until(Duration::from_secs(15), || {
        let kids = children(job.id());
        let app = kids.iter().any(|p| is(p, "sleep"));
        let guardian = kids.iter().any(|p| is(p, "rb-subagent"));
        let broker = kids.into_iter().find(|p| is(p, "rb-broker"));
        let broker = broker.filter(|_| app && guardian)?;
        let daemons: Vec<u32> = children(broker)
            .into_iter()
            .filter(|p| is(p, "rb-hostd"))
            .collect();
        (daemons.len() == 4).then(|| [vec![broker], daemons].concat())
    });
    let Some(embedded) = started else {
        kill(&mut job);
        panic!("the embedded broker and its four daemons did not start");
    };
    job.kill().expect("SIGKILL the agent");
    let _ = job.wait();
    let gone = wait_until(Duration::from_secs(10), || {
        embedded.iter().all(|p| !running(*p)).then_some(())
    });
    let left: Vec<u32> = embedded.iter().copied().filter(|p| running(*p)).collect();
    for pid in &left {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    assert!(
        gone.is_some(),
        "the embedded broker or its daemons outlived the agent by 10 s: {left:?}"
    );
}

#[test]
fn the_job_guardian_ends_its_own_jobs_processes_and_nothing_else() {
    let broker = Broker::start(&local_lab(1));
    let id = std::process::id();
    // Same user, same machine: a process outside any job and another job's app.
    let mut outsider = Command::new("sh")
        .args(["-c", &format!("sleep 300; : rboutsider{id}x")])
        .spawn()
        .expect("outsider");
    // Markers made at run time: the agents' own command lines do not hold them.
    let app = r#"exec sh -c "sleep 300; : ${1}x""#;
    let mut other_job = broker
        .agent(&["sh", "-c", app, "sh", &format!("rbjobb{id}")])
        .spawn()
        .expect("agent B");
    let mut job = broker
        .agent(&["sh", "-c", app, "sh", &format!("rbjoba{id}")])
        .spawn()
        .expect("agent A");
    let guardian = format!("guard-job .*--tag agent\\.{} ", job.id());
    let started = wait_until(Duration::from_secs(10), || {
        let seen = [
            format!("rboutsider{id}x"),
            format!("rbjobb{id}x"),
            format!("rbjoba{id}x"),
            guardian.clone(),
        ]
        .map(|p| pgrep(&p));
        seen.iter()
            .all(|p| p.len() == 1)
            .then(|| seen.map(|p| p[0]))
    });
    let Some([outsider_pid, other_pid, app_pid, guardian_pid]) = started else {
        for c in [&mut outsider, &mut other_job, &mut job] {
            kill(c);
        }
        panic!("the three processes and job A's guardian did not all start");
    };
    job.kill().expect("SIGKILL agent A");
    let _ = job.wait();
    // The guardian exits once its sweep is over: then whatever it would end has ended.
    let swept = wait_until(Duration::from_secs(10), || {
        (!running(guardian_pid) && !running(app_pid)).then_some(())
    });
    let survivors = (running(outsider_pid), running(other_pid));
    for c in [&mut outsider, &mut other_job] {
        kill(c);
    }
    assert!(swept.is_some(), "job A's app or guardian still runs");
    assert_eq!(
        survivors,
        (true, true),
        "(outsider, job B's app) must outlive job A's sweep"
    );
}

#[test]
fn a_caller_that_cleans_its_environment_is_served_by_its_jobs_agent() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    // The README's implicit lab file names this broker: a call that escaped the job would
    // become a second job here (a one-shot agent) instead of going unnoticed.
    let home = tempfile::tempdir().expect("home");
    std::fs::create_dir_all(home.path().join(".config/rb")).expect("mkdir");
    std::fs::copy(&broker.lab_file, home.path().join(".config/rb/lab.toml")).expect("lab");
    let out_file = home.path().join("detached.out");
    // As GNU parallel does: only PATH and HOME. Then a caller that also left the job's
    // process tree (setsid -f: its parent exits, it is re-parented): only the shim's own
    // directory tells its job. Last, the shim installed elsewhere ($3, as a system-wide
    // rsh) and a clean PATH: only the caller's ancestry tells.
    let script = r#"
        env -i PATH="$PATH" HOME="$1" rsh anyLinux echo cleaned-ok
        env -i PATH="$PATH" HOME="$1" setsid -f sh -c 'exec rsh anyLinux echo detached-ok > "$1"' sh "$2"
        i=0; while [ ! -s "$2" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
        cat "$2"
        env -i PATH=/usr/bin:/bin HOME="$1" "$3" anyLinux echo ancestry-ok
    "#;
    let home_arg = home.path().display().to_string();
    let out_arg = out_file.display().to_string();
    let shim = bin("rsh").display().to_string();
    let out = broker
        .agent(&["sh", "-c", script, "sh", &home_arg, &out_arg, &shim])
        .output()
        .expect("agent");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.split_whitespace().collect::<Vec<_>>(),
        ["cleaned-ok", "detached-ok", "ancestry-ok"],
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jobs = broker.jobs();
    assert_eq!(
        jobs.len(),
        1,
        "every call in the job's own agent: {jobs:#?}"
    );
}

#[test]
fn a_subagent_that_loses_its_agent_logs_why_it_ends_the_command() {
    let log = agent::subagent::log_path();
    // An allocation id no other test uses: it finds our line in the shared log.
    let alloc = format!("{}{}", 7_000_000, std::process::id());
    let out = Command::new(bin("rb-subagent"))
        .args(["--agent", "127.0.0.1:1", "--alloc", &alloc])
        .args(["--secret-file", "/nonexistent", "-c", "sleep 30"])
        .output()
        .expect("rb-subagent");
    assert_eq!(out.status.code(), Some(143), "ended by SIGTERM");
    assert!(
        out.stderr.is_empty(),
        "nothing on the caller's stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .find(|l| l.contains(&format!("alloc={alloc} ")))
        .map(String::from)
        .unwrap_or_else(|| panic!("no line for alloc {alloc} in {}", log.display()));
    for word in ["unreachable", "127.0.0.1:1", "/nonexistent"] {
        assert!(line.contains(word), "`{word}` not in: {line}");
    }
}

/// The descriptors open in `sh -c 'ls -1 /proc/self/fd'` run through `wrap` (the
/// listing's own directory descriptor included: the same in every way).
fn open_descriptors(wrap: &[&str]) -> Vec<String> {
    let list = "trap '' TERM; ls -1 /proc/self/fd";
    let out = match wrap.split_first() {
        Some((program, args)) => Command::new(program)
            .args(args)
            .arg(list)
            .output()
            .expect("run"),
        None => Command::new("sh").args(["-c", list]).output().expect("sh"),
    };
    let mut fds: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    fds.sort();
    fds
}

/// Found by `hostd_subagent_and_agent_sigkilled…` (seed 1796086143053094066): the
/// subagent's command inherited the write end of the guardian's pipe to the front, so a
/// guardian SIGKILLed left the front waiting for the command instead of ending it. The
/// command gets its caller's descriptors and no other (its SIGTERM ignored so that the
/// listing is written before an unreachable agent ends it).
#[test]
fn a_subagents_command_inherits_no_descriptor_of_the_subagent() {
    let alloc = format!("{}{}", 8_000_000, std::process::id());
    let direct = open_descriptors(&[]);
    let subagent = bin("rb-subagent");
    let under = open_descriptors(&[
        subagent.to_str().expect("utf-8 path"),
        "--agent",
        "127.0.0.1:1",
        "--alloc",
        &alloc,
        "--secret-file",
        "/nonexistent",
        "-c",
    ]);
    assert!(!direct.is_empty(), "the listing ran");
    assert_eq!(
        under, direct,
        "descriptors under rb-subagent against sh's own"
    );
}

/// The rb-subagent of this process tree that the subagent's front forked: its guardian
/// (an `rb-subagent` whose parent is one), among those whose command line holds `mark`.
fn guardian_of(mark: &str) -> Option<u32> {
    let comm = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_string())
    };
    pgrep(mark).into_iter().find(|&pid| {
        comm(pid).is_ok_and(|c| c == "rb-subagent")
            && stat(pid)
                .and_then(|f| f[1].parse::<u32>().ok())
                .is_some_and(|parent| comm(parent).is_ok_and(|c| c == "rb-subagent"))
    })
}

/// A guardian SIGKILLed (the OOM killer) while its command runs: the front ends the
/// command, and the caller's remote shell returns 137 with a line that says why.
#[test]
fn a_killed_guardians_command_ends_with_137_and_the_caller_is_told_why() {
    let broker = Broker::start(&local_lab(1));
    let mark = format!("rbguardianlost{}x", std::process::id());
    let script = format!("rsh anyLinux 'sleep 300; : {mark}'; echo \"rsh exit $?\"");
    let mut job = broker
        .agent(&["sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("agent");
    let Some(guardian) = wait_until(Duration::from_secs(15), || guardian_of(&mark)) else {
        kill(&mut job);
        let out = job.wait_with_output().expect("agent");
        panic!("no guardian: {}", String::from_utf8_lossy(&out.stderr));
    };
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(guardian as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let ended = wait_until(Duration::from_secs(20), || job.try_wait().ok().flatten());
    if ended.is_none() {
        let _ = job.kill();
    }
    let out = job.wait_with_output().expect("agent");
    assert!(
        ended.is_some(),
        "the job still ran 20 s after its command's guardian was killed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        stdout.contains("rsh exit 137"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stderr.contains("the process that guarded this command was killed"),
        "stderr: {stderr}"
    );
}
