//! Tier 3, overflow onto Slurm (issue 19): a real Slurm cluster (Debian's munged,
//! slurmctld, slurmd) whose nodes are lab hosts (`lab::SlurmCluster`). Root only; each test
//! prints why it is skipped otherwise. The cluster and the lab are torn down on drop.

use std::time::Duration;

use tests::{labtier::skip_unless_root, wait_until};

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
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

/// The pilot piece of overflow, on the real cluster: a pilot job submitted with exactly the
/// broker's options (`SlurmOverflow::pilot_options`) and script (`PilotScript`) runs
/// `rb-hostd` on its Slurm node, which joins the lab as `slurm-<node>` with the node's own
/// hostname; `rsh anyLinux hostname` in a job then runs there; `scancel` of the pilot takes
/// the host out and the broker carries on. The pilot is submitted by the test here: the
/// broker's submitting it itself is the next step (README, "Overflow onto Slurm").
#[test]
fn a_pilot_job_brings_its_node_into_the_lab_and_a_job_runs_there() {
    if skip_unless_root("a_pilot_job_brings_its_node_into_the_lab_and_a_job_runs_there") {
        return;
    }
    let lab = lab::Lab::up(&lab::LabSpec {
        hosts: 1,
        ..lab::LabSpec::default()
    })
    .expect("lab up");
    let cluster = lab::SlurmCluster::start(&lab, &["node02"]).expect("slurm up");
    let node = lab.host("node02").expect("node02");
    let lab_text = format!(
        "[broker]\nlisten = \"{gw}:0\"\ntransport = \"manual\"\nstate_dir = \"@STATE@\"\n\
         secret_file = \"@SECRET@\"\nreport_interval_s = 1\ndown_after_s = 4\n\
         job_shell = [\"ssh\", \"-F\", \"{cfg}\"]\n\n\
         [[host]]\nname = \"slurm-node02\"\naddress = \"{addr}\"\nlabels = [\"slurm\", \"public\"]\n\n\
         [overflow.slurm]\npartition = \"{part}\"\nlease_s = 300\n",
        gw = lab.gateway(),
        cfg = lab.ssh_config().display(),
        addr = node.address,
        part = lab::slurm::PARTITION,
    );
    let broker = tests::Broker::start(&lab_text);
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
    let id = text(&cluster.run("sbatch", &args).expect("sbatch the pilot"));

    let up = broker.wait_host("slurm-node02", Duration::from_secs(30), "pilot up", |h| {
        h.state == proto::report::HostState::Up
    });
    assert_eq!(up.hostname.as_deref(), Some("node02"), "{up:?}");
    let time_limit = cluster
        .run("squeue", &["-h", "-j", &id, "-o", "%l %j"])
        .expect("squeue");
    assert_eq!(
        text(&time_limit),
        "5:00 rb-pilot-test",
        "the lease is Slurm's limit"
    );

    let out = std::process::Command::new(tests::bin("agent"))
        .arg("--broker")
        .arg(broker.tcp_addr().to_string())
        .arg("--secret-file")
        .arg(broker.secret())
        .args(["--grace-s", "1", "--", "sh", "-c", "rsh anyLinux hostname"])
        .env_remove("RB_AGENT")
        .env_remove("RB_LAB")
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
        "node02",
        "the job's command ran on the Slurm node"
    );

    cluster.run("scancel", &[&id]).expect("scancel");
    broker.wait_host("slurm-node02", Duration::from_secs(20), "pilot gone", |h| {
        h.state != proto::report::HostState::Up
    });
    assert!(
        broker.status().is_some(),
        "the broker survives the pilot's end"
    );
}
