//! Tier 3, overflow onto Slurm: a real Slurm cluster (Debian's munged,
//! slurmctld, slurmd) whose nodes are lab hosts (`lab::SlurmCluster`). Root only; each test
//! prints why it is skipped otherwise. The cluster and the lab are torn down on drop.

use std::time::Duration;

use proto::report::HostState;
use tests::{
    labtier::{lab_file_with, skip_unless_root, LabOptions, TEST_TIMING},
    slurm::{owner_agent as agent, OverflowOptions, SlurmLab},
    wait_until,
};

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A job that holds both managed lab hosts (`sleep 300` on each), once it does.
fn fill_lab(broker: &tests::Broker) -> std::process::Child {
    let mut filler = agent(
        broker,
        "rsh anyLinux 'sleep 300' & rsh anyLinux 'sleep 300' & wait",
    )
    .spawn()
    .expect("agent");
    let full = wait_until(Duration::from_secs(20), || {
        (broker.held_hosts().len() == 2).then_some(())
    });
    if full.is_none() {
        let _ = filler.kill();
        panic!("the filler holds both lab hosts\n{}", broker.log());
    }
    filler
}

/// The harness's cluster works as Slurm does: `sbatch --parsable` runs a batch script on a
/// node (it writes that node's hostname), `squeue` sees a running job, `scancel` ends it,
/// and teardown leaves no Slurm daemon of this cluster behind.
#[test]
fn the_slurm_cluster_runs_lists_and_cancels_batch_jobs() {
    if skip_unless_root("the_slurm_cluster_runs_lists_and_cancels_batch_jobs") {
        return;
    }
    let lab = lab::Lab::up(&lab::LabSpec {
        hosts: 2,
        ..lab::LabSpec::default()
    })
    .expect("lab up");
    let cluster = lab::SlurmCluster::start(&lab, &["node02", "node03"]).expect("slurm up");
    let jobs = cluster.dir().join("jobs");
    let out_file = jobs.join("hostname.out");
    let out_arg = format!("--output={}", out_file.display());
    let chdir = format!("--chdir={}", jobs.display());
    let id = text(
        &cluster
            .run(
                "sbatch",
                &["--parsable", "-N1", &chdir, &out_arg, "--wrap", "hostname"],
            )
            .expect("sbatch"),
    );
    assert!(
        id.parse::<u64>().is_ok(),
        "sbatch --parsable printed {id:?}"
    );
    let ran_on = wait_until(Duration::from_secs(20), || {
        let s = std::fs::read_to_string(&out_file).ok()?;
        (!s.trim().is_empty()).then(|| s.trim().to_string())
    })
    .expect("the batch job wrote its output");
    assert!(
        ["node02", "node03"].contains(&ran_on.as_str()),
        "ran on a Slurm node, its own hostname: {ran_on:?}"
    );

    // A long job: squeue shows it running on a node, scancel ends it.
    let id = text(
        &cluster
            .run(
                "sbatch",
                &[
                    "--parsable",
                    "-N1",
                    &chdir,
                    "--job-name=rb-m1-sleep",
                    "--wrap",
                    "sleep 300",
                ],
            )
            .expect("sbatch"),
    );
    let running = wait_until(Duration::from_secs(20), || {
        let out = cluster
            .run("squeue", &["-h", "-j", &id, "-o", "%T %N %j"])
            .ok()?;
        let line = text(&out);
        line.starts_with("RUNNING ").then_some(line)
    })
    .expect("squeue shows the job running");
    assert!(running.ends_with(" rb-m1-sleep"), "{running}");
    cluster.run("scancel", &[&id]).expect("scancel");
    let gone = wait_until(Duration::from_secs(20), || {
        (!cluster.job_ids().ok()?.contains(&id)).then_some(())
    });
    assert!(gone.is_some(), "scancel ended job {id}");

    let dir = cluster.dir().to_path_buf();
    let daemons = cluster.daemons();
    assert_eq!(daemons.len(), 4, "munged, slurmctld, 2 slurmd: {daemons:?}");
    cluster.down().expect("slurm down");
    assert!(!dir.exists(), "the cluster's directory is gone");
    for d in daemons {
        assert!(!d.is_alive(), "daemon {} survived teardown", d.pid);
    }
    for node in ["node02", "node03"] {
        let out = lab
            .exec(node, &["pgrep", "-x", "slurmd|slurmctld|slurmstepd"])
            .expect("pgrep");
        assert!(
            text(&out).is_empty(),
            "no Slurm daemon left on {node}: {}",
            text(&out)
        );
    }
}

/// A test that fails while its cluster runs still leaves no Slurm daemon behind: the
/// cluster stops them by pid when dropped during the unwind.
#[test]
fn a_failing_test_leaves_no_slurm_daemon_behind() {
    if skip_unless_root("a_failing_test_leaves_no_slurm_daemon_behind") {
        return;
    }
    let lab = lab::Lab::up(&lab::LabSpec {
        hosts: 1,
        ..lab::LabSpec::default()
    })
    .expect("lab up");
    let cluster = lab::SlurmCluster::start(&lab, &["node02"]).expect("slurm up");
    let daemons = cluster.daemons();
    let dir = cluster.dir().to_path_buf();
    assert_eq!(daemons.len(), 3, "munged, slurmctld, slurmd: {daemons:?}");
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _cluster = cluster;
        panic!("a test failing while the cluster runs");
    }));
    assert!(failed.is_err());
    for d in daemons {
        assert!(!d.is_alive(), "daemon {} survived the failed test", d.pid);
    }
    assert!(!dir.exists(), "the cluster's directory is gone");
}

/// `rb check --probe` asks the real cluster once: it answers for the lab file's partition,
/// and a partition the cluster does not have is reported with squeue's own words (exit 69).
#[test]
fn rb_check_probe_asks_the_real_cluster() {
    if skip_unless_root("rb_check_probe_asks_the_real_cluster") {
        return;
    }
    let lab = lab::Lab::up(&lab::LabSpec {
        hosts: 1,
        ..lab::LabSpec::default()
    })
    .expect("lab up");
    let cluster = lab::SlurmCluster::start(&lab, &["node02"]).expect("slurm up");
    let dir = tempfile::Builder::new()
        .prefix("rb-slurm-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let secret = dir.path().join("secret");
    proto::auth::write_new_secret(&secret, false).expect("secret");
    let check = |partition: &str| {
        let path = dir.path().join(format!("lab-{partition}.toml"));
        let text = format!(
            "[broker]\nlisten = \"{}:0\"\nstate_dir = \"{}\"\nsecret_file = \"{}\"\n\
             [overflow.slurm]\npartition = \"{partition}\"\n",
            lab.gateway(),
            dir.path().join("state").display(),
            secret.display()
        );
        std::fs::write(&path, text).expect("lab file");
        std::process::Command::new(tests::bin("rb"))
            .args(["check", "--probe"])
            .arg(&path)
            .env("SLURM_CONF", cluster.conf())
            .env_remove("RB_LAB")
            .output()
            .expect("rb check")
    };
    let out = check(lab::slurm::PARTITION);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text(&out).contains("probe: slurm: ok: squeue answered: 0 job(s) queued, 0 of them pilots")
            && text(&out).contains("in partition rbtest")
            && text(&out).contains("on nodes node02"),
        "{}",
        text(&out)
    );
    let out = check("nosuchpartition");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains("--partition=nosuchpartition") && err.contains("invalid partition"),
        "{err}"
    );
}

/// Submits one pilot for `broker` on `cluster`, with exactly the broker's options
/// (`SlurmOverflow::pilot_options`) and script (`PilotScript`); returns its Slurm job id.
fn submit_pilot(cluster: &lab::SlurmCluster, broker: &tests::Broker) -> String {
    let config = config::LabConfig::load(&broker.lab_file).expect("lab file");
    let slurm = config.overflow.expect("[overflow.slurm]");
    let hostd = tests::bin("rb-hostd");
    let secret = broker.secret();
    let script = config::pilot::PilotScript {
        hostd: &hostd,
        broker: broker.tcp_addr(),
        secret_file: &secret,
    };
    let jobs = cluster.dir().join("jobs");
    let script_path = jobs.join("pilot.sh");
    std::fs::write(&script_path, script.text()).expect("script");
    let mut args = vec![
        "--parsable".to_string(),
        format!("--chdir={}", jobs.display()),
        format!("--output={}", jobs.join("pilot-%j.out").display()),
    ];
    args.extend(slurm.pilot_options("rb-pilot-test", config.broker.reclaim_grace));
    args.push(script_path.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    text(&cluster.run("sbatch", &args).expect("sbatch the pilot"))
}

/// Overflow with the pilot submitted by hand: the lab's two hosts are held by a job; a
/// pilot job (the broker's options and script) runs `rb-hostd` on its Slurm node, which
/// joins the lab by itself as `slurm-node04` (public, labelled `slurm`, not in the lab
/// file, with the node's own hostname and Slurm's time limit as the lease);
/// `rsh anyLinux hostname` in another job then runs on the Slurm node; `scancel` of the
/// pilot takes the host out and the broker carries on. The broker submitting the pilot
/// itself is the next step (README, "Overflow onto Slurm").
#[test]
fn with_the_lab_full_a_job_runs_on_a_slurm_pilots_node() {
    if skip_unless_root("with_the_lab_full_a_job_runs_on_a_slurm_pilots_node") {
        return;
    }
    let lab = lab::Lab::up(&lab::LabSpec {
        hosts: 3,
        ..lab::LabSpec::default()
    })
    .expect("lab up");
    let mut opts = LabOptions::new(&[], TEST_TIMING);
    opts.unmanaged = vec!["node04".into()];
    let lab_text = format!(
        "{}\n[overflow.slurm]\npartition = \"{}\"\nlease_s = 300\n",
        lab_file_with(&lab, &opts),
        lab::slurm::PARTITION
    );
    let broker = tests::Broker::start(&lab_text);
    broker.wait_all_up(Duration::from_secs(20));
    let cluster = lab::SlurmCluster::start(&lab, &["node04"]).expect("slurm up");

    // The lab is full: one job holds node02 and node03.
    let mut filler = fill_lab(&broker);

    let id = submit_pilot(&cluster, &broker);
    let up = broker.wait_host("slurm-node04", Duration::from_secs(30), "pilot up", |h| {
        h.state == HostState::Up
    });
    assert_eq!(up.hostname.as_deref(), Some("node04"), "{up:?}");
    assert_eq!(
        up.address,
        lab.host("node04").expect("node04").address.to_string()
    );
    assert!(
        up.labels.contains(&"slurm".to_string()) && up.owner.is_none(),
        "{up:?}"
    );
    let limit = text(
        &cluster
            .run("squeue", &["-h", "-j", &id, "-o", "%l %j"])
            .expect("squeue"),
    );
    assert_eq!(
        limit, "5:00 rb-pilot-test",
        "the lease is Slurm's time limit"
    );

    let out = agent(&broker, "rsh anyLinux hostname")
        .output()
        .expect("agent");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        broker.log()
    );
    assert_eq!(
        text(&out),
        "node04",
        "the job's command ran on the Slurm node"
    );

    cluster.run("scancel", &[&id]).expect("scancel");
    broker.wait_host("slurm-node04", Duration::from_secs(20), "pilot gone", |h| {
        h.state != HostState::Up
    });
    assert_eq!(
        broker.held_hosts().len(),
        2,
        "the broker carries on: {}",
        broker.log()
    );
    // SIGTERM: the agent ends its job and its subagents on node02 and node03.
    let pid = nix::unistd::Pid::from_raw(filler.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("stop the filler");
    let _ = filler.wait();
}

/// Overflow end to end (M3): the lab's two hosts are held by a job; `rsh anyLinux hostname`
/// in another job waits, the broker's `overflow` policy hook (the default: after about a
/// second) asks for a pilot, the broker submits it to the real Slurm (`sbatch` with the
/// lab file's partition and lease), its node joins as `slurm-node04` and the command runs
/// there. Once nobody uses the node for `idle_exit_s`, the broker cancels the pilot and the
/// host leaves; the next waiting job gets a new pilot, and stopping the broker cancels it.
#[test]
fn the_broker_overflows_onto_slurm_when_the_lab_is_full() {
    if skip_unless_root("the_broker_overflows_onto_slurm_when_the_lab_is_full") {
        return;
    }
    // node02 and node03 in the lab, node04 the Slurm cluster; one pilot at most, idle 3 s.
    let env = SlurmLab::start(3, &OverflowOptions::new(3, TEST_TIMING)).expect("slurm lab");
    // Bound in this order, they drop as a SlurmLab does: broker, cluster, lab.
    let SlurmLab {
        lab: _lab,
        cluster,
        broker,
    } = env;

    let filler = fill_lab(&broker);
    assert!(
        cluster.job_ids().expect("squeue").is_empty(),
        "no pilot while nobody waits"
    );

    let out = agent(&broker, "rsh anyLinux hostname")
        .output()
        .expect("agent");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        broker.log()
    );
    assert_eq!(
        text(&out),
        "node04",
        "ran on the Slurm node\n{}",
        broker.log()
    );
    let log = broker.log();
    assert!(log.contains("Slurm pilot submitted"), "{log}");
    let pilot = text(
        &cluster
            .run("squeue", &["-h", "-o", "%i %j %l %P"])
            .expect("squeue"),
    );
    let fields: Vec<&str> = pilot.split_whitespace().collect();
    assert_eq!(
        fields.get(1..),
        Some(&["rb-pilot-root", "5:00", lab::slurm::PARTITION][..]),
        "one pilot, the lab file's lease and partition: {pilot}"
    );
    assert_eq!(broker.held_hosts().len(), 2, "the filler kept its hosts");

    // Idle exit: nobody holds slurm-node04 any more.
    assert_idle_pilot_leaves(&cluster, &broker, Duration::from_secs(20));
    assert!(
        broker.log().contains("Slurm pilot cancelled"),
        "{}",
        broker.log()
    );

    // A new waiting job gets a new pilot; the broker's shutdown cancels it.
    let holder = agent(&broker, "rsh anyLinux 'sleep 300'")
        .spawn()
        .expect("agent");
    let held = wait_until(Duration::from_secs(30), || {
        (broker.held_hosts().len() == 3).then_some(())
    });
    assert!(
        held.is_some(),
        "a second pilot's node is held\n{}",
        broker.log()
    );
    assert_eq!(
        cluster.job_ids().expect("squeue").len(),
        1,
        "one pilot at a time"
    );

    // The broker stops while the pilot's node is in use (so idle exit cannot be what
    // ends it): it cancels the pilot.
    drop(broker);
    let cancelled = wait_until(Duration::from_secs(20), || {
        cluster.job_ids().ok()?.is_empty().then_some(())
    });
    assert!(
        cancelled.is_some(),
        "the broker's shutdown cancelled its pilot"
    );
    // With their broker gone for good, agents would try to get it back for a minute
    // (agent/src/core/end.rs): the test ends them; the lab's teardown takes their hosts.
    for mut a in [holder, filler] {
        let _ = a.kill();
        let _ = a.wait();
    }
}

/// A broker killed outright (no shutdown, so nothing cancelled) leaves its pilot in Slurm;
/// the restarted broker finds it by job name and, as nobody wants it (its daemon cannot
/// reach the new port), cancels it.
#[test]
fn a_restarted_broker_finds_its_pilots_by_job_name() {
    if skip_unless_root("a_restarted_broker_finds_its_pilots_by_job_name") {
        return;
    }
    // node02 in the lab, node03 the Slurm cluster; Slurm's default partition and max_nodes.
    let mut opts = OverflowOptions::new(3600, TEST_TIMING);
    opts.partition = None;
    opts.max_nodes = None;
    let env = SlurmLab::start(2, &opts).expect("slurm lab");
    // Bound in this order, they drop as a SlurmLab does: broker, cluster, lab.
    let SlurmLab {
        lab: _lab,
        cluster,
        mut broker,
    } = env;
    let mut filler = agent(&broker, "rsh anyLinux 'sleep 300'")
        .spawn()
        .expect("agent");
    let full = wait_until(Duration::from_secs(20), || {
        (broker.held_hosts().len() == 1).then_some(())
    });
    assert!(full.is_some(), "the filler holds node02\n{}", broker.log());
    let out = agent(&broker, "rsh anyLinux hostname")
        .output()
        .expect("agent");
    assert_eq!(
        text(&out),
        "node03",
        "ran on the pilot's node\n{}",
        broker.log()
    );
    let pilots = cluster.job_ids().expect("squeue");
    assert_eq!(pilots.len(), 1, "the pilot runs on (idle exit is an hour)");

    let _ = filler.kill();
    let _ = filler.wait();
    broker.kill_and_restart();
    let found = wait_until(Duration::from_secs(10), || {
        broker
            .log()
            .contains(&format!(
                "Slurm pilots of an earlier run found jobs={}",
                pilots[0]
            ))
            .then_some(())
    });
    assert!(found.is_some(), "{}", broker.log());
    let cancelled = wait_until(Duration::from_secs(30), || {
        cluster.job_ids().ok()?.is_empty().then_some(())
    });
    assert!(
        cancelled.is_some(),
        "the unwanted pilot was cancelled\n{}",
        broker.log()
    );
}

/// A job that watches its JEL stream into `file`, runs `rsh anyLinux sleep 300` on
/// whatever host it gets, and exits 0 once the pool says that host is released (1 if it is
/// not within a minute).
struct WatchingJob {
    child: std::process::Child,
    file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl WatchingJob {
    fn start(broker: &tests::Broker) -> WatchingJob {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("events");
        let script = format!(
            "'{jel}' watch --json > '{file}' & rsh anyLinux sleep 300 </dev/null & wait $!; \
             for _ in $(seq 600); do grep -q host_released '{file}' && exit 0; sleep 0.1; done; \
             exit 1",
            jel = tests::bin("rb-jel").display(),
            file = file.display()
        );
        let child = agent(broker, &script).spawn().expect("agent");
        WatchingJob {
            child,
            file,
            _dir: dir,
        }
    }
}

/// Waits until Slurm has no job left (the idle pilot was cancelled) within `within`, and
/// then until `slurm-node04` is no longer up.
fn assert_idle_pilot_leaves(cluster: &lab::SlurmCluster, broker: &tests::Broker, within: Duration) {
    let gone = wait_until(within, || cluster.job_ids().ok()?.is_empty().then_some(()));
    assert!(
        gone.is_some(),
        "the idle pilot was cancelled\n{}",
        broker.log()
    );
    broker.wait_host(
        "slurm-node04",
        Duration::from_secs(20),
        "idle pilot gone",
        |h| h.state != HostState::Up,
    );
}

/// Waits until the JEL events in `file` show a grant, which must be of the pilot's node.
fn assert_granted_the_pilots_node(file: &std::path::Path, broker: &tests::Broker) {
    let granted = wait_until(Duration::from_secs(60), || {
        let seen = jel_events(file);
        let e = seen.iter().find(|e| e["event"] == "host_granted")?;
        e["host"].as_str().map(String::from)
    });
    assert_eq!(
        granted.as_deref(),
        Some("slurm-node04"),
        "the job got the pilot's node\n{}",
        broker.log()
    );
}

/// Where the restart test's job writes the pid of its `sleep 300` (the node's own /tmp).
const SLEEP_PID_FILE: &str = "/tmp/rb-restart-sleep.pid";

/// Pid of the job's `sleep 300` on lab host `node`, from [`SLEEP_PID_FILE`], once there.
fn job_sleep_pid(lab: &lab::Lab, node: &str) -> Option<String> {
    let out = lab.exec(node, &["cat", SLEEP_PID_FILE]).ok()?;
    let pid = text(&out);
    pid.parse::<u32>().is_ok().then_some(pid)
}

/// What `ps` on lab host `node` says of process `pid`: its state and command (`S sleep`),
/// empty when there is no such process.
fn process_on(lab: &lab::Lab, node: &str, pid: &str) -> String {
    let out = lab
        .exec(node, &["ps", "-o", "stat=,comm=", "-p", pid])
        .expect("ps on the node");
    text(&out)
}

/// Slurm job `pilot`'s state as `squeue` shows it (`RUNNING`; empty once it is gone).
fn pilot_state(cluster: &lab::SlurmCluster, pilot: &str) -> Result<String, String> {
    let out = cluster
        .run("squeue", &["-h", "-j", pilot, "-o", "%T"])
        .map_err(|e| format!("squeue: {e}"))?;
    Ok(text(&out))
}

/// Whether `cond` holds at every check for `window` (checked about every 200 ms); `Err`
/// says when it first failed and what it saw then.
fn holds_for(window: Duration, mut cond: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let start = std::time::Instant::now();
    loop {
        cond().map_err(|why| format!("after {:?}: {why}", start.elapsed()))?;
        if start.elapsed() >= window {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A broker restart while a job holds a pilot's node. The lab is full and a
/// job's `rsh anyLinux sleep 300` runs on the pilot's node `slurm-node04`; the broker is
/// SIGKILLed (nothing cancelled) and restarted on the same address, as a production broker
/// on its fixed `listen` is. The pilot's daemon reconnects and the host is up, still the
/// job's (`rb status` held_by, `rb jobs`), the job's agent resumes, the pilot is adopted
/// (its Slurm job shown for the node) and not cancelled: Slurm runs it on past the 10 s in
/// which a found pilot nobody uses would be, and the job's process on the node is the same
/// one throughout. Then the job ends normally (its remote shell prints the node's name)
/// and the pilot, idle, exits.
#[test]
fn a_job_keeps_its_pilots_node_across_a_broker_restart() {
    let name = "a_job_keeps_its_pilots_node_across_a_broker_restart";
    if !skip_unless_root(name) {
        job_on_a_pilots_node_across_a_restart(false);
    }
}

/// As above, but the pilot's daemon is back only after the 10 s in which the restarted
/// broker cancels a found pilot whose node did not join (it is stopped with SIGSTOP across
/// the restart: a loaded node, a broker down long enough for the daemon's backoff to
/// grow). The allocation restored on its node keeps the pilot: Slurm runs it on, the job
/// keeps the node and its process; once the daemon is back, all goes on as above.
///
/// Ignored from session 13 to 23 as flaky (once in five runs beside its sibling, the job had
/// ended right after its agent resumed). Its broker log in session 27 said why: the found
/// pilot was cancelled as unwanted 40 ms after the node's daemon connected, a tick having
/// come before the daemon's first report (the node known to the core, not up yet, was
/// taken for back); the core now keeps found pilots while a held pilot's node is known but
/// not up (`overflow_tests::a_found_pilot_is_kept_while_its_held_node_is_known_but_not_up_yet`
/// reproduces it deterministically).
#[test]
fn a_job_keeps_its_pilots_node_when_the_pilots_daemon_is_back_late() {
    let name = "a_job_keeps_its_pilots_node_when_the_pilots_daemon_is_back_late";
    if !skip_unless_root(name) {
        job_on_a_pilots_node_across_a_restart(true);
    }
}

/// The two tests above; `late`: the pilot's daemon is stopped across the restart and
/// continued 13 s after it.
fn job_on_a_pilots_node_across_a_restart(late: bool) {
    let mut opts = OverflowOptions::new(3, TEST_TIMING);
    opts.fixed_port = true;
    let env = SlurmLab::start(3, &opts).expect("lab, cluster and broker");
    // Bound in this order, they drop as a SlurmLab does: broker, cluster, lab.
    let SlurmLab {
        lab,
        cluster,
        mut broker,
    } = env;
    let mut filler = fill_lab(&broker);

    // The job: `sleep 300` on whatever host it gets (its pid in that host's /tmp); once
    // the sleep ends, the host's name.
    let script =
        format!("rsh anyLinux 'sleep 300 & echo $! > {SLEEP_PID_FILE}; wait; hostname' </dev/null");
    let mut job = agent(&broker, &script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("agent");
    let held = broker.wait_host(
        "slurm-node04",
        Duration::from_secs(60),
        "held by the job",
        |h| h.state == HostState::Up && h.held_by.is_some(),
    );
    let job_id = held.held_by.expect("held");
    let sleep_pid = wait_until(Duration::from_secs(20), || job_sleep_pid(&lab, "node04"))
        .unwrap_or_else(|| panic!("the job's sleep runs on node04\n{}", broker.log()));
    let pilots = cluster.job_ids().expect("squeue");
    assert_eq!(pilots.len(), 1, "one pilot: {pilots:?}");
    let pilot = pilots[0].clone();
    broker.wait_host(
        "slurm-node04",
        Duration::from_secs(20),
        "its pilot known",
        |h| h.slurm_job.as_deref() == Some(pilot.as_str()),
    );
    let addr = broker.tcp_addr();
    let hostd = text(
        &lab.exec("node04", &["pgrep", "-x", "rb-hostd"])
            .expect("pgrep"),
    );
    assert!(hostd.parse::<u32>().is_ok(), "one pilot daemon: {hostd:?}");
    if late {
        lab.exec("node04", &["kill", "-STOP", &hostd])
            .expect("stop the pilot's daemon");
    }

    broker.kill_and_restart();
    let restarted = std::time::Instant::now();
    if late {
        // Its daemon away, the node is still the job's: the pilot runs on past the found
        // pilots' grace (10 s), the job's sleep too.
        let away = holds_for(Duration::from_secs(13), || {
            let state = pilot_state(&cluster, &pilot)?;
            // `rb jobs` answers nothing while the broker starts.
            let jobs = broker.jobs();
            let hosts = jobs
                .iter()
                .find(|j| j["id"] == job_id)
                .map(|j| j["hosts"].clone());
            let ps = process_on(&lab, "node04", &sleep_pid);
            let alive = ps.ends_with(" sleep") && !ps.starts_with('Z');
            let held = jobs.is_empty() || hosts == Some(serde_json::json!(["slurm-node04"]));
            if state == "RUNNING" && alive && held {
                Ok(())
            } else {
                Err(format!(
                    "pilot {state:?}, job's hosts {hosts:?}, sleep: {ps:?}"
                ))
            }
        });
        if let Err(why) = away {
            panic!("{why}\n{}", broker.log());
        }
        lab.exec("node04", &["kill", "-CONT", &hostd])
            .expect("continue the pilot's daemon");
    }
    let row = broker.wait_host(
        "slurm-node04",
        Duration::from_secs(30),
        "the pilot's daemon reconnected, the host up and still the job's",
        |h| h.state == HostState::Up && h.held_by.is_some(),
    );
    assert_eq!(row.held_by, Some(job_id), "{row:?}\n{}", broker.log());
    assert_eq!(broker.tcp_addr(), addr, "the same listen address");
    // Adopted: the daemon named its Slurm job, and Slurm's answer on the lease (an `squeue`
    // the broker runs once the daemon named it) arrived.
    broker.wait_host(
        "slurm-node04",
        Duration::from_secs(20),
        "the pilot adopted, its lease known",
        |h| h.slurm_job.as_deref() == Some(pilot.as_str()) && h.lease_left_s.is_some(),
    );
    let resumed = format!("agent reconnected; job resumed job={job_id}");
    let log_has = |what: &str| broker.log().contains(what).then_some(());
    assert!(
        wait_until(Duration::from_secs(30), || log_has(&resumed)).is_some(),
        "the job's agent resumed\n{}",
        broker.log()
    );
    let job_row = broker
        .jobs()
        .into_iter()
        .find(|j| j["id"] == job_id)
        .unwrap_or_else(|| panic!("rb jobs lists job {job_id}\n{}", broker.log()));
    assert_eq!(job_row["state"], "running", "{job_row}\n{}", broker.log());
    assert_eq!(
        job_row["hosts"],
        serde_json::json!(["slurm-node04"]),
        "{job_row}\n{}",
        broker.log()
    );

    // A found pilot nobody uses is cancelled 10 s after the restart
    // (`allocation::overflow`, FOUND_GRACE): this one is in use, so Slurm runs it on, the
    // node stays the job's and the job's sleep is the one it started.
    let window = Duration::from_secs(15).saturating_sub(restarted.elapsed());
    let kept = holds_for(window, || {
        let state = pilot_state(&cluster, &pilot)?;
        let row = broker.host("slurm-node04");
        let held_by = row.as_ref().and_then(|h| h.held_by);
        let ps = process_on(&lab, "node04", &sleep_pid);
        let alive = ps.ends_with(" sleep") && !ps.starts_with('Z');
        if state == "RUNNING" && held_by == Some(job_id) && alive {
            Ok(())
        } else {
            Err(format!(
                "pilot {state:?}, held by {held_by:?}, sleep: {ps:?}"
            ))
        }
    });
    if let Err(why) = kept {
        panic!("{why}\n{}", broker.log());
    }
    assert!(
        !broker.log().contains("Slurm pilot cancelled"),
        "{}",
        broker.log()
    );

    // The job ends normally: its sleep ends, its remote shell prints the node's name.
    lab.exec("node04", &["kill", &sleep_pid])
        .expect("end the sleep");
    let status = wait_until(Duration::from_secs(30), || job.try_wait().ok().flatten())
        .unwrap_or_else(|| panic!("the job ends\n{}", broker.log()));
    let mut out = String::new();
    if let Some(mut stdout) = job.stdout.take() {
        std::io::Read::read_to_string(&mut stdout, &mut out).expect("job output");
    }
    assert_eq!(
        (status.code(), out.trim()),
        (Some(0), "node04"),
        "{}",
        broker.log()
    );

    // Idle now: the pilot exits, the host leaves, the filler keeps its hosts.
    assert_idle_pilot_leaves(&cluster, &broker, Duration::from_secs(30));
    assert!(
        log_has("Slurm pilot cancelled").is_some(),
        "{}",
        broker.log()
    );
    assert_eq!(broker.held_hosts().len(), 2, "the filler kept its hosts");
    let pid = nix::unistd::Pid::from_raw(filler.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("stop the filler");
    let _ = filler.wait();
}

/// The events of a `rb-jel watch --json` output file, as JSON values.
fn jel_events(file: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

fn unix_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

/// A pilot's lease ends: with the lab full, a job's `rsh anyLinux` waits, `rb jobs` says it
/// waits for Slurm, and it runs on the pilot's node. `rb status` shows the node's Slurm job
/// and the lease left as Slurm says. Slurm's warning (`--signal=B:USR1@20`, a one-minute
/// lease) reaches the job as `vacate` with Slurm's deadline (the lease's end, not the
/// broker's grace), the job lets go, and when Slurm's time limit ends the pilot the host
/// leaves the lab.
#[test]
fn a_pilots_lease_end_is_vacate_by_slurms_deadline_then_the_host_leaves() {
    let name = "a_pilots_lease_end_is_vacate_by_slurms_deadline_then_the_host_leaves";
    if skip_unless_root(name) {
        return;
    }
    let mut opts = OverflowOptions::new(300, TEST_TIMING);
    (opts.lease_s, opts.reclaim_grace_s) = (60, Some(20));
    let env = SlurmLab::start(3, &opts).expect("lab, cluster and broker");
    let (broker, cluster) = (&env.broker, &env.cluster);
    let mut filler = fill_lab(broker);

    let WatchingJob {
        child: mut job,
        file,
        _dir,
    } = WatchingJob::start(broker);
    let slurm_note = wait_until(Duration::from_secs(30), || {
        broker.jobs().iter().find_map(|j| {
            j["waiting"]
                .as_array()?
                .iter()
                .find_map(|w| w["slurm"].as_str().map(String::from))
        })
    });
    assert!(
        slurm_note.is_some_and(|n| n.starts_with("waits for Slurm")),
        "rb jobs says the request waits for Slurm\n{}",
        broker.log()
    );
    assert_granted_the_pilots_node(&file, broker);
    let ids = cluster.job_ids().expect("squeue");
    assert_eq!(ids.len(), 1, "one pilot: {ids:?}\n{}", broker.log());

    // rb status: the node's Slurm job, and the lease left by Slurm's clock.
    let (row, seen_at) = wait_until(Duration::from_secs(20), || {
        let row = broker.host("slurm-node04")?;
        row.lease_left_s.is_some().then(|| (row, unix_ms()))
    })
    .unwrap_or_else(|| panic!("rb status shows the pilot's lease\n{}", broker.log()));
    assert_eq!(
        row.slurm_job.as_deref(),
        Some(ids[0].as_str()),
        "{row:?}\n{}",
        broker.log()
    );
    let left_s = row.lease_left_s.expect("lease left");
    assert!((1.0..=60.0).contains(&left_s), "{row:?}\n{}", broker.log());
    let lease_end_ms = seen_at + (left_s * 1000.0) as u64;
    let shown = text(&broker.rb(&["status"]));
    assert!(
        shown.contains(&format!("slurm job {}, lease", ids[0])),
        "{shown}"
    );

    // Slurm's warning: vacate, with the lease's end as the deadline.
    let vacate = wait_until(Duration::from_secs(90), || {
        jel_events(&file)
            .into_iter()
            .find(|e| e["event"] == "vacate" && e["host"] == "slurm-node04")
    })
    .unwrap_or_else(|| {
        panic!(
            "the job gets vacate before the lease ends\n{}",
            broker.log()
        )
    });
    let deadline = vacate["deadline"].as_u64().expect("a deadline in Unix ms");
    assert!(
        deadline.abs_diff(lease_end_ms) <= 3_000,
        "the deadline {deadline} is Slurm's lease end ({lease_end_ms}, ±3 s)\n{}",
        broker.log()
    );
    assert!(
        broker.log().contains("Slurm takes a pilot's node back"),
        "{}",
        broker.log()
    );
    let status = wait_until(Duration::from_secs(60), || job.try_wait().ok().flatten())
        .unwrap_or_else(|| panic!("the job ends once its host is released\n{}", broker.log()));
    assert_eq!(
        status.code(),
        Some(0),
        "the job saw host_released\n{}",
        broker.log()
    );
    let closed = broker.host("slurm-node04").expect("row");
    assert!(closed.lease_ending, "{closed:?}\n{}", broker.log());

    // Slurm's time limit ends the pilot: the host leaves, the broker carries on.
    broker.wait_host(
        "slurm-node04",
        Duration::from_secs(120),
        "lease over",
        |h| h.state != HostState::Up,
    );
    let gone = wait_until(Duration::from_secs(60), || {
        cluster.job_ids().ok()?.is_empty().then_some(())
    });
    assert!(gone.is_some(), "Slurm ended the pilot\n{}", broker.log());
    assert_eq!(
        broker.held_hosts().len(),
        2,
        "the filler kept its hosts\n{}",
        broker.log()
    );
    let pid = nix::unistd::Pid::from_raw(filler.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("stop the filler");
    let _ = filler.wait();
}

/// How a test makes Slurm take a pilot's node back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TakeBack {
    /// A job in the cluster's urgent partition needs the node.
    Preemption,
    /// `scancel` of the pilot.
    Scancel,
}

/// Slurm preempts a pilot: a job in the cluster's urgent partition needs the pilot's node.
/// Slurm moves the pilot's end to now + the partition's `GraceTime` and sends its step (the
/// pilot's `rb-hostd`) SIGTERM at once; the daemon stays and tells the broker, which asks
/// Slurm for the new end and vacates the job holding the node by that deadline (not by its
/// own `reclaim_grace_s`, a minute here). The job lets go; at the end Slurm kills the
/// pilot, the host leaves and the urgent job runs on the node.
#[test]
fn a_preempted_pilots_job_gets_vacate_by_slurms_grace_time_then_the_host_leaves() {
    let name = "a_preempted_pilots_job_gets_vacate_by_slurms_grace_time_then_the_host_leaves";
    if !skip_unless_root(name) {
        slurm_takes_the_node_back(TakeBack::Preemption);
    }
}

/// `scancel` of a pilot whose node a job holds: Slurm sends the daemon SIGTERM and kills it
/// `KillWait` later; the broker reads `KillWait` from Slurm (`scontrol show config`) and
/// the job gets its `vacate` with that deadline; the host leaves and the broker carries on.
#[test]
fn a_cancelled_pilots_job_gets_vacate_by_slurms_kill_wait_then_the_host_leaves() {
    let name = "a_cancelled_pilots_job_gets_vacate_by_slurms_kill_wait_then_the_host_leaves";
    if !skip_unless_root(name) {
        slurm_takes_the_node_back(TakeBack::Scancel);
    }
}

/// The two tests above: a job holds a pilot's node (the lab full), Slurm takes it back
/// `how`, the job's `vacate` has Slurm's deadline, the job lets go, the host leaves.
fn slurm_takes_the_node_back(how: TakeBack) {
    let mut opts = OverflowOptions::new(300, TEST_TIMING);
    (opts.lease_s, opts.reclaim_grace_s) = (600, Some(60));
    let env = SlurmLab::start(3, &opts).expect("lab, cluster and broker");
    let (broker, cluster) = (&env.broker, &env.cluster);
    let mut filler = fill_lab(broker);

    let WatchingJob {
        child: mut job,
        file,
        _dir,
    } = WatchingJob::start(broker);
    assert_granted_the_pilots_node(&file, broker);
    let pilot = cluster.job_ids().expect("squeue");
    assert_eq!(pilot.len(), 1, "one pilot: {pilot:?}");
    let pilot = pilot[0].clone();
    wait_until(Duration::from_secs(20), || {
        broker.host("slurm-node04")?.lease_left_s.map(drop)
    })
    .expect("the broker knows the pilot's lease");

    let taken_ms = unix_ms();
    let urgent = match how {
        TakeBack::Preemption => Some(submit_urgent(cluster)),
        TakeBack::Scancel => {
            cluster.run("scancel", &[&pilot]).expect("scancel");
            None
        }
    };
    let vacate = wait_until(Duration::from_secs(30), || {
        jel_events(&file)
            .into_iter()
            .find(|e| e["event"] == "vacate" && e["host"] == "slurm-node04")
    })
    .unwrap_or_else(|| panic!("the job gets vacate ({how:?})\n{}", broker.log()));
    let deadline = vacate["deadline"].as_u64().expect("a deadline in Unix ms");
    let (slurms, within_ms) = match how {
        // Slurm's end for the pilot, as squeue shows it while the pilot runs.
        TakeBack::Preemption => (slurm_end_ms(cluster, &pilot), 2_000),
        // The test cluster's KillWait after the scancel.
        TakeBack::Scancel => (taken_ms + lab::slurm::KILL_WAIT_S * 1000, 1_500),
    };
    assert!(
        deadline.abs_diff(slurms) <= within_ms,
        "{how:?}: the deadline {deadline} is Slurm's ({slurms} ± {within_ms} ms), \
         {} ms after the take-back\n{}",
        deadline.saturating_sub(taken_ms),
        broker.log()
    );
    let soon_ms = (lab::slurm::PREEMPT_GRACE_S + 5) * 1000;
    assert!(
        deadline <= taken_ms + soon_ms,
        "not the broker's reclaim_grace_s (60 s)\n{}",
        broker.log()
    );
    assert!(
        broker.log().contains("Slurm takes a pilot's node back"),
        "{}",
        broker.log()
    );
    let status = wait_until(Duration::from_secs(60), || job.try_wait().ok().flatten())
        .expect("the job ends once its host is released");
    assert_eq!(status.code(), Some(0), "the job saw host_released");

    // Slurm ends the pilot (after its end, then KillWait): the host leaves; an urgent job
    // runs on the node.
    broker.wait_host(
        "slurm-node04",
        Duration::from_secs(90),
        "pilot taken back",
        |h| h.state != HostState::Up,
    );
    let left = wait_until(Duration::from_secs(60), || {
        let out = cluster.run("squeue", &["-h", "-o", "%i %T"]).ok()?;
        let want = urgent.as_ref().map(|u| format!("{u} RUNNING"));
        (text(&out) == want.unwrap_or_default()).then_some(())
    });
    assert!(left.is_some(), "the pilot is gone, an urgent job runs");
    assert_eq!(broker.held_hosts().len(), 2, "the filler kept its hosts");
    let pid = nix::unistd::Pid::from_raw(filler.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("stop the filler");
    let _ = filler.wait();
}

/// Submits a job to the cluster's urgent partition (it preempts a pilot); its Slurm id.
fn submit_urgent(cluster: &lab::SlurmCluster) -> String {
    let jobs = cluster.dir().join("jobs");
    let args = [
        "--parsable".to_string(),
        "-N1".to_string(),
        format!("--partition={}", lab::slurm::URGENT_PARTITION),
        format!("--chdir={}", jobs.display()),
        format!("--output={}", jobs.join("urgent-%j.out").display()),
        "--wrap".to_string(),
        "sleep 300".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    text(&cluster.run("sbatch", &args).expect("sbatch urgent"))
}

/// Slurm's end time of job `id` (Unix ms), as `squeue` shows it.
fn slurm_end_ms(cluster: &lab::SlurmCluster, id: &str) -> u64 {
    cluster
        .client("squeue")
        .env("SLURM_TIME_FORMAT", "%s")
        .args(["-h", "-j", id, "-o", "%e"])
        .output()
        .ok()
        .and_then(|o| text(&o).parse::<u64>().ok())
        .map(|s| s * 1000)
        .expect("squeue shows the pilot's end")
}
