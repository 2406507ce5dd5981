//! Tier 3: on granted hosts nothing of a job outlives it, however a process hides
//! (`setsid env -i`, a daemon that writes over its environment as OpenSSH's ControlPersist
//! master does): the subagent's guardian is the command's parent and its child subreaper.
//! And each granted host reached over ssh shares one master connection per job: later calls
//! to a held host are sessions of it (no handshake), and it is closed when the host leaves
//! the job and at the job's end. Root only; each test prints why it is skipped otherwise.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use tests::{
    bin_dir,
    labtier::{skip_unless_root, LabWithBroker},
    wait_until,
};

/// The agent's grace (`--grace-s 1` in [`LabWithBroker::agent`]) plus one second.
const GRACE_PLUS_ONE: Duration = Duration::from_secs(2);

/// `tests/programs/clear_environ.c` compiled next to the workspace's binaries (where the
/// lab's hosts see it).
fn clear_environ_program(test: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/clear_environ.c");
    let out = bin_dir().join(format!("clear_environ-lab-{}-{test}", std::process::id()));
    let status = Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc (gcc is one of test.sh's LAB_PACKAGES)");
    assert!(status.success(), "compiling {}", src.display());
    out
}

/// `host: pid command` of the processes matching the pgrep pattern on every lab host.
fn on_hosts(env: &LabWithBroker, pattern: &str) -> Vec<String> {
    env.lab
        .hosts()
        .iter()
        .filter_map(|h| {
            let out = env
                .lab
                .exec(&h.name, &["pgrep", "-a", "-f", pattern])
                .ok()?;
            let found = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (!found.is_empty()).then(|| format!("{}: {found}", h.name))
        })
        .collect()
}

#[test]
fn what_a_job_abandons_on_a_granted_host_ends_with_it_whatever_it_erased() {
    let name = "what_a_job_abandons_on_a_granted_host_ends_with_it_whatever_it_erased";
    if skip_unless_root(name) {
        return;
    }
    let daemon = clear_environ_program("ends");
    let env = LabWithBroker::start(2, &[]);
    let id = std::process::id();
    let (sleep_s, marker) = (format!("2002.{id}"), format!("rbescapelab{id}"));
    // An unrelated sleep of the same user (root) on every host, outside any job.
    let bystander = format!("sleep 2002.{id}9");
    let mut bystanders: Vec<_> = env
        .lab
        .hosts()
        .iter()
        .map(|h| {
            let argv: Vec<&str> = bystander.split(' ').collect();
            env.lab
                .command(&h.name, &argv, false)
                .expect("command")
                .stdin(Stdio::null())
                .spawn()
                .expect("bystander")
        })
        .collect();
    wait_until(Duration::from_secs(10), || {
        (on_hosts(&env, &bystander).len() == 2).then_some(())
    })
    .expect("bystanders run");
    let remote = format!(
        "setsid env -i sh -c \"sleep {sleep_s} >/dev/null 2>&1 </dev/null &\"; {} 600 {marker}",
        daemon.display()
    );
    let out = env
        .agent(&["rsh", "anyLinux", &remote])
        .stdin(Stdio::null())
        .output()
        .expect("agent");
    assert!(
        out.status.success(),
        "agent: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sleep_pattern = format!("^sleep {}$", sleep_s.replace('.', "\\."));
    let daemon_pattern = format!("600 {marker}$");
    let gone = wait_until(GRACE_PLUS_ONE, || {
        (on_hosts(&env, &sleep_pattern).is_empty() && on_hosts(&env, &daemon_pattern).is_empty())
            .then_some(())
    });
    assert!(
        gone.is_some(),
        "the job's processes outlived it by {GRACE_PLUS_ONE:?} on its granted host: {:?} {:?}",
        on_hosts(&env, &sleep_pattern),
        on_hosts(&env, &daemon_pattern)
    );
    assert_eq!(
        on_hosts(&env, &bystander).len(),
        2,
        "an unrelated sleep of the same user was ended"
    );
    for b in &mut bystanders {
        let _ = b.kill();
        let _ = b.wait();
    }
    let _ = std::fs::remove_file(daemon);
}

/// What the remote command prints to say which ssh connection it came through: the pid
/// of the sshd process above its subagent (command → guardian → front → sshd).
const SSHD_OF_THIS_CALL: &str =
    "g=$(ps -o ppid= -p $PPID); s=$(ps -o ppid= -p $g); echo $s $(ps -o comm= -p $s)";

#[test]
fn calls_to_a_held_host_share_one_ssh_connection_closed_when_the_host_goes_back() {
    let name = "calls_to_a_held_host_share_one_ssh_connection_closed_when_the_host_goes_back";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(3, &[]);
    let cfg = env.lab.ssh_config();
    let dir = tempfile::tempdir().expect("tempdir");
    let go_on = dir.path().join("go-on");
    let script = format!(
        "set -e\n\
         mkfifo {fifo}\n\
         h=$(rsh anyLinux-1 hostname)\n\
         a=$(rsh anyLinux-1 '{sshd}')\n\
         b=$(rsh anyLinux-1 '{sshd}')\n\
         d=$(dirname \"$RB_AGENT\")\n\
         check=$(ssh -F {cfg} -o ControlPath=\"$d/cm/$h/_\" -O check rb-master 2>&1 || true)\n\
         echo \"host=$h\"; echo \"a=$a\"; echo \"b=$b\"; echo \"check=$check\"; echo \"dir=$d\"\n\
         read -r _ <{fifo}\n\
         h2=$(rsh anyLinux-2 hostname)\n\
         rsh anyLinux-2 true\n\
         echo \"host2=$h2\"\n",
        fifo = go_on.display(),
        sshd = SSHD_OF_THIS_CALL,
        cfg = cfg.display(),
    );
    let mut agent = env
        .agent(&["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("agent");
    let mut stdout = BufReader::new(agent.stdout.take().expect("stdout"));
    let mut seen = std::collections::BTreeMap::new();
    while !seen.contains_key("dir") {
        let mut line = String::new();
        if stdout.read_line(&mut line).expect("read") == 0 {
            panic!("the job ended early: {seen:?}");
        }
        if let Some((k, v)) = line.trim_end().split_once('=') {
            seen.insert(k.to_string(), v.to_string());
        }
    }
    let (host, a, b) = (&seen["host"], &seen["a"], &seen["b"]);
    assert!(a.ends_with(" sshd"), "not an sshd above the subagent: {a}");
    assert_eq!(
        a, b,
        "the second and third calls to {host} came through different ssh connections"
    );
    assert!(
        seen["check"].contains("Master running"),
        "no master for {host}: {}",
        seen["check"]
    );
    let masters = |pattern: &str| -> Vec<String> {
        let out = Command::new("pgrep")
            .args(["-a", "-f", pattern])
            .output()
            .expect("pgrep");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect()
    };
    let job_dir = PathBuf::from(&seen["dir"]);
    let host_dir = job_dir.join("cm").join(host);
    let host_master = format!("{}/", host_dir.display());
    assert!(!masters(&host_master).is_empty(), "no master process");
    // The host goes back: its master and socket go with it.
    let out = env.broker.rb(&["release", host, "--grace-s", "1"]);
    assert!(out.status.success(), "rb release: {out:?}");
    let closed = wait_until(Duration::from_secs(15), || {
        (!host_dir.exists() && masters(&host_master).is_empty()).then_some(())
    });
    assert!(
        closed.is_some(),
        "after {host}'s release: socket dir there: {}, masters: {:?}",
        host_dir.exists(),
        masters(&host_master)
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&go_on)
        .and_then(|mut f| f.write_all(b"go\n"))
        .expect("let the job go on");
    let status = agent.wait().expect("agent");
    assert!(status.success(), "agent: {status:?}");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stdout, &mut rest);
    assert!(rest.contains("host2="), "the job's end: {rest}");
    // The job's end: no master of the job and no socket anywhere.
    let job_masters = format!("{}/cm/", job_dir.display());
    let none = wait_until(GRACE_PLUS_ONE, || {
        (masters(&job_masters).is_empty() && !job_dir.exists()).then_some(())
    });
    assert!(
        none.is_some(),
        "after the job's end: masters {:?}, job dir there: {}",
        masters(&job_masters),
        job_dir.exists()
    );
}

/// The last net on a granted host: the guardian is SIGKILLed after its command ended, so
/// what it had adopted — here a daemon that erased its environment, tag included — goes
/// to init. The host daemon noted the daemon below the subagent while it lived (at one of
/// its sweeps: within 5 s, at once when its host's allocations change; it logs each such
/// process once, which the test waits for before it kills the guardian), and ends it once
/// the allocation is over. (Until 672babe every grant anywhere in the lab made every host
/// daemon sweep, and the test relied on its second call's grant of another host for it.)
#[test]
fn the_host_daemon_ends_an_untagged_leftover_whose_guardian_was_killed() {
    let name = "the_host_daemon_ends_an_untagged_leftover_whose_guardian_was_killed";
    if skip_unless_root(name) {
        return;
    }
    let daemon = clear_environ_program("noted");
    let env = LabWithBroker::start(2, &[]);
    let marker = format!("rbnoted{}", std::process::id());
    let dir = tempfile::tempdir().expect("tempdir");
    let go_on = dir.path().join("go-on");
    let script = format!(
        "mkfifo {fifo}\n\
         rsh anyLinux '{daemon} 600 {marker}'\n\
         echo ready\n\
         read -r _ <{fifo}\n",
        fifo = go_on.display(),
        daemon = daemon.display(),
    );
    let mut agent = env
        .agent(&["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("agent");
    let mut line = String::new();
    BufReader::new(agent.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line.trim(), "ready", "the job's calls failed");
    let pattern = format!("600 {marker}$");
    let found = on_hosts(&env, &pattern);
    // pgrep's lines are "PID COMMAND…": the daemon's (the subagent's own ends alike).
    let daemon_path = daemon.display().to_string();
    let (host, pid) = found
        .first()
        .and_then(|l| {
            let (host, lines) = l.split_once(": ")?;
            let pid = lines.lines().find_map(|line| {
                let mut words = line.split_whitespace();
                let pid = words.next()?;
                (words.next()? == daemon_path).then(|| pid.to_string())
            })?;
            Some((host.to_string(), pid))
        })
        .expect("the daemon runs on a granted host");
    let hostd_log = env
        .broker
        .state_dir()
        .join(format!("logs/hostd-{host}.log"));
    let noted = wait_until(Duration::from_secs(20), || {
        let log = std::fs::read_to_string(&hostd_log).unwrap_or_default();
        log.lines()
            .any(|l| {
                l.contains("noted a process below a subagent") && l.contains(&format!("pid={pid} "))
            })
            .then_some(())
    });
    assert!(
        noted.is_some(),
        "{host}'s daemon never noted pid {pid}: {}",
        std::fs::read_to_string(&hostd_log).unwrap_or_default()
    );
    let guardians = env
        .lab
        .exec(&host, &["pgrep", "-f", "rb-subagent --agent"])
        .expect("pgrep");
    let guardians = String::from_utf8_lossy(&guardians.stdout)
        .trim()
        .to_string();
    assert!(!guardians.is_empty(), "no guardian on {host}");
    for pid in guardians.split_whitespace() {
        env.lab.exec(&host, &["kill", "-KILL", pid]).expect("kill");
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&go_on)
        .and_then(|mut f| f.write_all(b"go\n"))
        .expect("let the job end");
    let _ = agent.wait();
    let gone = wait_until(Duration::from_secs(30), || {
        on_hosts(&env, &pattern).is_empty().then_some(())
    });
    assert!(
        gone.is_some(),
        "an untagged leftover outlived its allocation: {:?}",
        on_hosts(&env, &pattern)
    );
    let _ = std::fs::remove_file(daemon);
}
