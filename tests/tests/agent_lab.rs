//! Tier 3 for the agent layer: the agent on the gateway machine, the broker over TCP with
//! the lab secret, remote commands on real namespaced hosts over real ssh, each under a
//! subagent; and the agent on a lab host (the front end, one of the broker's hosts)
//! reaching the broker every way the README gives. Root only; each test prints why it is
//! skipped otherwise.

use std::{
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

use tests::{
    bin,
    labtier::{skip_unless_root, LabOptions, LabWithBroker, FRONT_END, TEST_TIMING},
    wait_until,
};

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn any_linux_runs_on_a_lab_host_and_real_hosts_pass_through() {
    if skip_unless_root("any_linux_runs_on_a_lab_host_and_real_hosts_pass_through") {
        return;
    }
    let env = LabWithBroker::start(3, &[]);
    let names: Vec<String> = env.lab.hosts().iter().map(|h| h.name.clone()).collect();
    let out = env
        .agent(&["sh", "-c", "rsh anyLinux hostname"])
        .output()
        .expect("agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let host = text(&out);
    assert!(
        names.contains(&host),
        "`{host}` is not a lab host ({names:?})"
    );
    let here = nix::unistd::gethostname()
        .expect("hostname")
        .to_string_lossy()
        .into_owned();
    assert_ne!(host, here, "ran on the submitting machine");
    // A named host not allocated to the job: straight through the real remote shell.
    let out = env
        .agent(&["sh", "-c", "rsh node03 hostname; rsh node03 exit 7"])
        .output()
        .expect("agent");
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text(&out), "node03");
}

#[test]
fn every_caller_argv_shape_runs_through_the_shim_on_a_lab_host() {
    if skip_unless_root("every_caller_argv_shape_runs_through_the_shim_on_a_lab_host") {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let cases: &[(&[&str], &str)] = &[
        // PVM: the whole remote command as one word, `-l` after the host.
        (
            &[
                "anyLinux",
                "-l",
                "root",
                "echo pvmd -s -d0x0 -nnodeb 1 0a4d0001:bfbc 4080 2 0a4d0002:0000",
            ],
            "pvmd -s -d0x0 -nnodeb 1 0a4d0001:bfbc 4080 2 0a4d0002:0000",
        ),
        // PVM's diagnosis.
        (&["anyLinux", "echo YES"], "YES"),
        // LAM: -n, then words, one of them with literal double quotes.
        (
            &[
                "anyLinux",
                "-n",
                "echo",
                "hboot",
                "-t",
                "-c",
                "lam-conf.lamd",
                "-s",
                "-I",
                "\"-H 10.77.0.1 -P 50367 -n 1 -o 0\"",
            ],
            "hboot -t -c lam-conf.lamd -s -I -H 10.77.0.1 -P 50367 -n 1 -o 0",
        ),
        (&["anyLinux", "-n", "echo $SHELL"], "/bin/bash"),
        // Open MPI: -x before the host, user@host, -p after the host, a `;` snippet, "value" words.
        (
            &[
                "-x",
                "root@anyLinux",
                "-p",
                "22",
                " PATH=/usr/bin:$PATH ; export PATH ; echo",
                "orted",
                "-mca",
                "ess",
                "\"env\"",
                "-mca",
                "orte_hnp_uri",
                "\"1.0;tcp://10.77.0.1:4000\"",
            ],
            "orted -mca ess env -mca orte_hnp_uri 1.0;tcp://10.77.0.1:4000",
        ),
        // Hydra: a literally double-quoted program path.
        (
            &[
                "anyLinux",
                "\"/bin/echo\"",
                "--control-port",
                "node01:4242",
                "--proxy-id",
                "0",
            ],
            "--control-port node01:4242 --proxy-id 0",
        ),
    ];
    for (argv, expected) in cases {
        let mut args = vec!["rsh"];
        args.extend_from_slice(argv);
        let out = env.agent(&args).output().expect("agent");
        assert!(
            out.status.success(),
            "{argv:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(text(&out), *expected, "{argv:?}");
        assert!(
            out.stderr.is_empty(),
            "{argv:?} wrote to stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn sigkilled_agent_leaves_no_process_on_any_lab_host() {
    if skip_unless_root("sigkilled_agent_leaves_no_process_on_any_lab_host") {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let marker = format!("rblabmarker{}", std::process::id());
    let script =
        format!("rsh anyLinux 'sleep 300 # {marker}' & rsh anyLinux 'sleep 300 # {marker}' & wait");
    let mut job = env.agent(&["sh", "-c", &script]).spawn().expect("agent");
    let count = |env: &LabWithBroker| -> usize {
        env.lab
            .hosts()
            .iter()
            .map(|h| {
                let out = env
                    .lab
                    .exec(&h.name, &["pgrep", "-f", &marker])
                    .expect("pgrep");
                String::from_utf8_lossy(&out.stdout).lines().count()
            })
            .sum()
    };
    wait_until(Duration::from_secs(15), || (count(&env) >= 2).then_some(()))
        .expect("both remote sleeps running");
    job.kill().expect("SIGKILL agent");
    let _ = job.wait();
    let gone = wait_until(Duration::from_secs(10), || (count(&env) == 0).then_some(()));
    assert!(
        gone.is_some(),
        "{} processes of the job survived on the lab hosts",
        count(&env)
    );
    let freed = wait_until(Duration::from_secs(5), || {
        env.broker
            .jobs()
            .iter()
            .all(|j| j["hosts"].as_array().is_none_or(|h| h.is_empty()))
            .then_some(())
    });
    assert!(
        freed.is_some(),
        "hosts still allocated after the agent died"
    );
}

/// The app ends right after a second `rsh anyLinux` got a host, while the remote shell is
/// still starting that command (its subagent not attached yet) and the first command,
/// deaf to SIGTERM, keeps the end of the job waiting for its grace period. The second
/// subagent attaches during that wait. The agent must end that command too before it
/// tells the broker the job ended (the hosts free for another job): once the agent has
/// exited, nothing of the job runs on any host. Before the fix, a subagent attaching
/// during the end was ignored and its command ran on for the guardian's 6 s agent-loss
/// limit, on a host the broker had already given to the next job (faults_lab,
/// broker_kill: "node05 runs processes of jobs {j4, j5} at once").
#[test]
fn a_job_ending_while_its_remote_command_starts_leaves_nothing_running_once_it_exits() {
    let name = "a_job_ending_while_its_remote_command_starts_leaves_nothing_running_once_it_exits";
    if skip_unless_root(name) {
        return;
    }
    let env = LabWithBroker::start(2, &[]);
    let count = |marker: &str| -> usize {
        env.lab
            .hosts()
            .iter()
            .map(|h| {
                let out = env
                    .lab
                    .exec(&h.name, &["pgrep", "-f", marker])
                    .expect("pgrep");
                String::from_utf8_lossy(&out.stdout).lines().count()
            })
            .sum()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for round in 0..3 {
        let marker = format!("rbinflight{}x{round}", std::process::id());
        let fifo = dir.path().join(format!("up{round}"));
        let script = format!(
            "mkfifo {fifo}\n\
             rsh anyLinux \"trap '' TERM; echo up; sleep 300 # {marker}\" </dev/null >{fifo} 2>/dev/null &\n\
             read -r up <{fifo}\n\
             rsh anyLinux 'sleep 300 # {marker}' </dev/null >/dev/null 2>&1 &\n\
             while [ \"$(grep -c . \"$RB_HOSTS_FILE\")\" -lt 2 ]; do :; done",
            fifo = fifo.display()
        );
        let started = std::time::Instant::now();
        let out = env
            .agent(&["sh", "-c", &script])
            .stdin(Stdio::null())
            .output()
            .expect("agent");
        eprintln!("round {round}: agent ran {:?}", started.elapsed());
        assert!(
            out.status.success(),
            "agent: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let left = count(&marker);
        assert_eq!(
            left, 0,
            "round {round}: {left} process(es) of the ended job still run once its agent exited"
        );
    }
}

#[test]
fn a_lab_user_on_a_lab_host_grows_over_real_rsh() {
    if skip_unless_root("a_lab_user_on_a_lab_host_grows_over_real_rsh") {
        return;
    }
    let mut opts = LabOptions::new(&[], TEST_TIMING);
    opts.rsh = true;
    opts.job_shell = Some(vec!["rsh".into()]);
    opts.unmanaged = vec!["node02".into()];
    let env = LabWithBroker::start_opts(3, &opts);
    let out = env
        .agent_as_user(
            "node02",
            &[],
            &[
                "sh",
                "-c",
                "rsh anyLinux 'hostname; id -un'; rsh node03 hostname",
            ],
        )
        .output()
        .expect("agent");
    assert!(
        out.status.success(),
        "{}\nbroker log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        env.broker.log()
    );
    let lines: Vec<String> = text(&out).lines().map(String::from).collect();
    assert_eq!(
        lines.len(),
        3,
        "{lines:?}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        ["node03", "node04"].contains(&lines[0].as_str()),
        "anyLinux ran on {} (node02 is not managed)",
        lines[0]
    );
    assert_eq!(lines[1], env.lab.user().name, "runs as the lab user");
    assert_eq!(lines[2], "node03");
}

/// How the agent finds the broker: every way the README gives.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// `--broker IP:PORT --secret-file S`.
    BrokerFlag,
    /// `--broker STATE_DIR/broker.sock`.
    BrokerSocketFlag,
    /// `RB_BROKER=STATE_DIR/broker.sock`.
    BrokerVariable,
    LabFlag,
    LabVariable,
    ImplicitLabFile,
}

/// A lab of `hosts` hosts whose front end is one of the broker's hosts: root's own machine
/// (`owner = "root"`), with root at its keyboard so that it is never granted. Keep the login
/// while the test runs.
fn lab_with_front_end_at_keyboard(hosts: usize) -> (LabWithBroker, lab::FakeLogin) {
    let opts = LabOptions::new(&[(FRONT_END, "root")], TEST_TIMING);
    let env = LabWithBroker::start_opts(hosts, &opts);
    let login = env
        .lab
        .fake_login(FRONT_END, "root", "rbtty-front", Duration::ZERO)
        .expect("fake login");
    env.broker
        .wait_host(FRONT_END, Duration::from_secs(10), "root's login", |h| {
            h.users.iter().any(|u| u.user == "root")
        });
    (env, login)
}

/// `agent … -- APP…` run by root inside the front end, reaching the broker `way`; HOME is a
/// fresh home of its own, holding `~/.config/rb/lab.toml` for [`Way::ImplicitLabFile`] only.
fn agent_on_front_end(env: &LabWithBroker, way: Way, home: &Path, app: &[&str]) -> Command {
    let lab_file = env.broker.lab_file.display().to_string();
    let mut argv = vec![bin("agent").display().to_string()];
    match way {
        Way::BrokerFlag => argv.extend([
            "--broker".into(),
            env.broker.tcp_addr().to_string(),
            "--secret-file".into(),
            env.broker.secret().display().to_string(),
        ]),
        Way::BrokerSocketFlag => {
            argv.extend(["--broker".into(), env.broker.socket().display().to_string()])
        }
        Way::LabFlag => argv.extend(["--lab".into(), lab_file.clone()]),
        Way::BrokerVariable | Way::LabVariable | Way::ImplicitLabFile => {}
    }
    if let Way::ImplicitLabFile = way {
        let dir = home.join(".config/rb");
        std::fs::create_dir_all(&dir).expect("mkdir ~/.config/rb");
        std::fs::copy(&env.broker.lab_file, dir.join("lab.toml")).expect("copy the lab file");
    }
    argv.extend(["--grace-s", "1", "--"].map(String::from));
    argv.extend(app.iter().map(|a| a.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut cmd = env
        .lab
        .command(FRONT_END, &argv, false)
        .unwrap_or_else(|e| panic!("agent in {FRONT_END}: {e}"));
    cmd.env("HOME", home)
        .env("RB_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match way {
        Way::BrokerVariable => cmd.env("RB_BROKER", env.broker.socket()),
        Way::LabVariable => cmd.env("RB_LAB", &lab_file),
        _ => &mut cmd,
    };
    cmd
}

#[test]
fn a_remote_command_outlives_6_s_however_the_agent_on_a_lab_host_reaches_the_broker() {
    if skip_unless_root(
        "a_remote_command_outlives_6_s_however_the_agent_on_a_lab_host_reaches_the_broker",
    ) {
        return;
    }
    // Every command below runs on another host than the front end, which must reach the
    // agent over the network.
    let (env, _at_keyboard) = lab_with_front_end_at_keyboard(7);
    // One host for each way besides the front end.
    let ways = [
        Way::BrokerFlag,
        Way::BrokerSocketFlag,
        Way::BrokerVariable,
        Way::LabFlag,
        Way::LabVariable,
        Way::ImplicitLabFile,
    ];
    // Longer than the 6 s a subagent waits for an unreachable agent; all ways at once.
    let jobs: Vec<_> = ways
        .iter()
        .map(|way| {
            let home = tempfile::Builder::new()
                .prefix("rb-home-")
                .tempdir_in("/var/tmp")
                .expect("home");
            let app = ["rsh", "anyLinux", "sleep 8; hostname; echo ok"];
            let child = agent_on_front_end(&env, *way, home.path(), &app)
                .spawn()
                .expect("agent");
            (way, home, child)
        })
        .collect();
    let mut failed = Vec::new();
    for (way, _home, child) in jobs {
        let out = child.wait_with_output().expect("agent");
        let stdout = text(&out);
        let lines: Vec<&str> = stdout.lines().collect();
        let ran_elsewhere = lines.len() == 2 && lines[0] != FRONT_END && lines[1] == "ok";
        if !out.status.success() || !ran_elsewhere {
            failed.push(format!(
                "{way:?}: {:?}, stdout {stdout:?}\nstderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn gnu_parallels_clean_environment_probe_is_served_by_the_jobs_agent() {
    if skip_unless_root("gnu_parallels_clean_environment_probe_is_served_by_the_jobs_agent") {
        return;
    }
    let (env, _at_keyboard) = lab_with_front_end_at_keyboard(3);
    // parallel probes the host's CPUs with only PATH and HOME in the environment
    // (`rsh anyLinux -- exec parallel --number-of-threads`); HOME's lab file names this
    // broker, so a probe that escaped the job would be a second job here.
    let home = tempfile::Builder::new()
        .prefix("rb-home-")
        .tempdir_in("/var/tmp")
        .expect("home");
    let app = [
        "parallel", "--ssh", "rsh", "-S", "anyLinux", "echo", ":::", "a", "b",
    ];
    let out = agent_on_front_end(&env, Way::ImplicitLabFile, home.path(), &app)
        .output()
        .expect("agent");
    let mut lines: Vec<String> = text(&out).lines().map(String::from).collect();
    lines.sort();
    assert!(
        out.status.success() && lines == ["a", "b"],
        "{:?}, stdout {lines:?}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let jobs = env.broker.jobs();
    assert_eq!(jobs.len(), 1, "one job for every call: {jobs:#?}");
}
