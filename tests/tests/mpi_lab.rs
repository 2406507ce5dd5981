//! Tier 3 for Open MPI 4.1 and MPICH 4 (Hydra): `mpirun`/`mpiexec` with symbolic host lists
//! (`anyLinux,anyPublic`), run by the lab's user under a plain `agent` (no module) on
//! node02: each symbolic entry reaches the shim as `rsh anyLinux orted …` /
//! `rsh anyLinux hydra_pmi_proxy …`, the broker grants a host, and the daemon runs there
//! under a subagent, over the real rsh. Root only (the lab); each test prints why it is
//! skipped otherwise. Needs Debian's openmpi-bin, libopenmpi-dev, mpich, libmpich-dev.
//!
//! What these host lists mean (the MPI launchers' rules, not ours): one name is one node,
//! so `anyLinux,anyLinux` is one granted host with two slots; distinct names
//! (`anyLinux,anyPublic`) are distinct hosts.
//!
//! UCX (MPICH's ch4 device) takes two lab hosts for one machine — they share a kernel — and
//! fails in MPI_Init trying shared memory between them (`mm ep failed to connect to remote
//! FIFO`), with or without the broker: MPICH jobs here run with `UCX_TLS=^sm`.

use std::{path::PathBuf, process::Output, time::Duration};

use tests::{
    labtier::{skip_unless_root, LabWithBroker, FRONT_END},
    wait_until,
};

/// node02 (where the job runs, not managed) and node03, node04 for the broker to grant.
fn lab() -> LabWithBroker {
    LabWithBroker::start_with_front_end(3)
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `programs/NAME.c` compiled by the lab user with `compiler` into `~/OUT`.
fn build_program(env: &LabWithBroker, name: &str, compiler: &str, out_name: &str) -> PathBuf {
    env.build_program(name, compiler, out_name, "")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `agent [--rsl SPEC] sh -c SCRIPT` as the lab user on node02, to completion. The script
/// runs under `timeout 60`: a launcher waiting for a daemon that never calls back hangs.
fn job(env: &LabWithBroker, rsl: Option<&str>, script: &str) -> Output {
    let args: Vec<&str> = rsl.map(|r| vec!["--rsl", r]).unwrap_or_default();
    let script = format!("timeout 60 sh -c '{script}'");
    env.agent_as_user(FRONT_END, &args, &["sh", "-c", &script])
        .output()
        .expect("agent")
}

/// Asserts success and returns the `rank R of N on HOST` hosts, sorted.
fn rank_hosts(env: &LabWithBroker, what: &str, out: &Output) -> Vec<String> {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}\nstdout:\n{}\nagent stderr:\n{}\nbroker log:\n{}",
        text(out),
        String::from_utf8_lossy(&out.stderr),
        env.broker.log()
    );
    let mut hosts: Vec<String> = text(out)
        .lines()
        .filter(|l| l.starts_with("rank "))
        .filter_map(|l| l.rsplit(' ').next().map(String::from))
        .collect();
    hosts.sort();
    hosts
}

/// After a job: no host held, and no process named `name` of the lab user anywhere.
fn assert_all_given_back(env: &LabWithBroker, name: &str) {
    let held = wait_until(Duration::from_secs(10), || {
        env.broker.held_hosts().is_empty().then_some(())
    });
    assert!(held.is_some(), "still held: {:?}", env.broker.held_hosts());
    let leftovers = || env.user_processes(name);
    let left = wait_until(Duration::from_secs(5), || {
        let l = leftovers();
        l.is_empty().then_some(l)
    })
    .unwrap_or_else(leftovers);
    assert!(left.is_empty(), "{name} left after the job: {left:?}");
}

const GRANTABLE: [&str; 2] = ["node03", "node04"];

#[test]
fn open_mpi_mpirun_with_any_linux_hosts_runs_on_granted_hosts() {
    if skip_unless_root("open_mpi_mpirun_with_any_linux_hosts_runs_on_granted_hosts") {
        return;
    }
    let env = lab();
    build_program(&env, "mpi_hosts", "mpicc.openmpi", "mpi_hosts.ompi");
    std::fs::write(
        env.lab.user().home.join("ompi.hosts"),
        "anyLinux slots=1\nanyPublic slots=1\n",
    )
    .expect("hostfile");
    let both = GRANTABLE.map(String::from).to_vec();
    // Two distinct symbolic names: two granted hosts, one rank each. The agent's
    // environment alone (OMPI_MCA_plm_rsh_agent, no tree spawn), plain and adaptive,
    // with --host and with a hostfile, and with tree spawn asked for explicitly.
    for (rsl, script) in [
        (None, "mpirun.openmpi -np 2 --host anyLinux,anyPublic ~/mpi_hosts.ompi"),
        (
            Some("&(adaptive=yes)"),
            "mpirun.openmpi -np 2 --host anyLinux,anyPublic ~/mpi_hosts.ompi",
        ),
        (None, "mpirun.openmpi -np 2 --hostfile ~/ompi.hosts ~/mpi_hosts.ompi"),
        (
            None,
            "mpirun.openmpi --mca plm_rsh_no_tree_spawn 0 -np 2 --host anyLinux,anyPublic ~/mpi_hosts.ompi",
        ),
    ] {
        let out = job(&env, rsl, script);
        assert_eq!(rank_hosts(&env, script, &out), both, "{script}");
        assert_all_given_back(&env, "orted");
    }
    // One name twice is one node with two slots: both ranks on one granted host.
    let script = "mpirun.openmpi -np 2 --host anyLinux,anyLinux ~/mpi_hosts.ompi";
    let hosts = rank_hosts(&env, script, &job(&env, None, script));
    assert_eq!(hosts.len(), 2, "{hosts:?}");
    assert_eq!(hosts[0], hosts[1], "{hosts:?}");
    assert!(GRANTABLE.contains(&hosts[0].as_str()), "{hosts:?}");
    // The front end and a granted host in one MPI_COMM_WORLD.
    let script = "mpirun.openmpi -np 2 --host node02,anyLinux ~/mpi_hosts.ompi";
    let hosts = rank_hosts(&env, script, &job(&env, None, script));
    assert_eq!(hosts[0], FRONT_END, "{hosts:?}");
    assert!(GRANTABLE.contains(&hosts[1].as_str()), "{hosts:?}");
    assert_all_given_back(&env, "orted");
}

#[test]
fn open_mpi_daemon_is_ended_when_the_broker_takes_its_host_back() {
    if skip_unless_root("open_mpi_daemon_is_ended_when_the_broker_takes_its_host_back") {
        return;
    }
    let env = lab();
    let script = "mpirun.openmpi -np 2 --host anyLinux,anyPublic sh -c \"hostname; sleep 60\"";
    let child = env
        .agent_as_user(FRONT_END, &[], &["sh", "-c", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("agent");
    let held = wait_until(Duration::from_secs(20), || {
        let held = env.broker.held_hosts();
        (held.len() == 2).then_some(held)
    })
    .expect("both hosts granted");
    // Only once the ranks run, i.e. every orted has called back: an orted ended before
    // its callback leaves mpirun waiting for it forever (over rsh the remote status is
    // lost, so mpirun sees its launcher exit 0; orte_startup_timeout does not help).
    let running = wait_until(Duration::from_secs(20), || {
        held.iter()
            .all(|h| {
                env.lab
                    .exec(h, &["pgrep", "-u", "rblab", "-x", "sleep"])
                    .is_ok_and(|o| o.status.success())
            })
            .then_some(())
    });
    assert!(running.is_some(), "ranks not running on {held:?}");
    let out = env.broker.rb(&["release", &held[0], "--grace-s", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Open MPI cannot shrink: mpirun sees a lost daemon and ends the whole job.
    let out = child.wait_with_output().expect("agent");
    assert_ne!(
        out.status.code(),
        Some(0),
        "mpirun survived losing a daemon"
    );
    // Which loss mpirun reports first is a race inside Open MPI: the orted's connection,
    // or a rank that the SIGTERM to the host's process group ended before its orted.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("lost communication with a remote daemon")
            || stderr.contains("exited on signal 15"),
        "mpirun did not report the lost daemon or rank:\n{stderr}"
    );
    assert_all_given_back(&env, "orted|sleep");
}

/// A host taken back before its daemon called back. Over rsh the remote status
/// is lost (netkit rsh exits 0 whatever the remote command did): mpirun takes its launcher's
/// exit for a success and waits for the orted's callback for ever. It must end with an error
/// within the grace + 10 s. The orted starts late (a wrapper sleeps first), so the host is
/// taken back before the callback. The fix: the shim waits for the remote shell and, on
/// its 0, asks the agent whether the host was taken back (`taken_back`); it was, so the shim
/// exits 143 and mpirun reports the failed launch.
#[test]
fn open_mpi_ends_with_an_error_when_a_host_is_taken_back_before_its_daemon_called_back() {
    let name =
        "open_mpi_ends_with_an_error_when_a_host_is_taken_back_before_its_daemon_called_back";
    if skip_unless_root(name) {
        return;
    }
    let env = lab();
    let slow = env.lab.user().home.join("slow_orted");
    std::fs::write(&slow, "#!/bin/sh\nsleep 30\nexec orted \"$@\"\n").expect("write wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let script = format!(
        "timeout 60 mpirun.openmpi --mca orte_launch_agent {} -np 2 --host anyLinux,anyPublic \
         sh -c \"hostname; sleep 60\"",
        slow.display()
    );
    let mut child = env
        .agent_as_user(FRONT_END, &[], &["sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("agent");
    let held = wait_until(Duration::from_secs(20), || {
        let held = env.broker.held_hosts();
        (held.len() == 2).then_some(held)
    })
    .expect("both hosts granted");
    // The wrapper sleeps there (under its subagent), the orted not started yet.
    let waiting = wait_until(Duration::from_secs(10), || {
        env.lab
            .exec(&held[0], &["pgrep", "-u", "rblab", "-x", "sleep"])
            .is_ok_and(|o| o.status.success())
            .then_some(())
    });
    assert!(
        waiting.is_some(),
        "the orted wrapper is not running on {}",
        held[0]
    );
    let grace_s = 1;
    let out = env
        .broker
        .rb(&["release", &held[0], "--grace-s", &grace_s.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bound = Duration::from_secs(grace_s + 10);
    let ended = wait_until(bound, || child.try_wait().ok().flatten());
    if ended.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("agent");
    assert!(
        ended.is_some(),
        "mpirun still waits {bound:?} after its host was taken back before the orted called \
         back\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(
        out.status.code(),
        Some(0),
        "mpirun took the lost daemon for a success"
    );
    // The shim said why its remote shell failed (mpirun leaves its launchers' stderr ours).
    let stderr = String::from_utf8_lossy(&out.stderr);
    let why = format!("rsh: {} was taken back by the broker (", held[0]);
    assert!(stderr.contains(&why), "no `{why}…` line:\n{stderr}");
    assert_all_given_back(&env, "orted|slow_orted|sleep");
}

#[test]
fn mpich_hydra_with_any_linux_hosts_runs_on_granted_hosts() {
    if skip_unless_root("mpich_hydra_with_any_linux_hosts_runs_on_granted_hosts") {
        return;
    }
    let env = lab();
    build_program(&env, "mpi_hosts", "mpicc.mpich", "mpi_hosts.mpich");
    std::fs::write(
        env.lab.user().home.join("mpich.hosts"),
        "anyLinux:1\nanyPublic:1\n",
    )
    .expect("hostfile");
    let both = GRANTABLE.map(String::from).to_vec();
    for (rsl, script) in [
        // The form: the shim named on the command line.
        (
            None,
            "UCX_TLS=^sm mpiexec.mpich -launcher rsh -launcher-exec $(command -v rsh) -hosts anyLinux,anyPublic -n 2 ~/mpi_hosts.mpich",
        ),
        // HYDRA_LAUNCHER_EXEC from the agent's environment, with Hydra's default ssh
        // launcher (it adds -x, which the shim takes) and with -launcher rsh.
        (
            Some("&(adaptive=yes)"),
            "UCX_TLS=^sm mpiexec.mpich -hosts anyLinux,anyPublic -n 2 ~/mpi_hosts.mpich",
        ),
        (
            None,
            "UCX_TLS=^sm mpiexec.mpich -launcher rsh -f ~/mpich.hosts -n 2 ~/mpi_hosts.mpich",
        ),
    ] {
        let out = job(&env, rsl, script);
        assert_eq!(rank_hosts(&env, script, &out), both, "{script}");
        assert_all_given_back(&env, "hydra_pmi_proxy");
    }
    // One name twice is one proxy: both ranks on one granted host.
    let script = "mpiexec.mpich -launcher rsh -hosts anyLinux,anyLinux -n 2 ~/mpi_hosts.mpich";
    let hosts = rank_hosts(&env, script, &job(&env, None, script));
    assert_eq!(hosts.len(), 2, "{hosts:?}");
    assert_eq!(hosts[0], hosts[1], "{hosts:?}");
    assert!(GRANTABLE.contains(&hosts[0].as_str()), "{hosts:?}");
    assert_all_given_back(&env, "hydra_pmi_proxy");
}

#[test]
fn instance_names_put_mpi_ranks_on_distinct_hosts() {
    // `--host anyLinux,anyLinux` is one node for both launchers, so N
    // hosts need N names; the instance form gives them: `anyLinux-1,anyLinux-2`.
    if skip_unless_root("instance_names_put_mpi_ranks_on_distinct_hosts") {
        return;
    }
    let env = lab();
    build_program(&env, "mpi_hosts", "mpicc.openmpi", "mpi_hosts.ompi");
    build_program(&env, "mpi_hosts", "mpicc.mpich", "mpi_hosts.mpich");
    let both = GRANTABLE.map(String::from).to_vec();
    for (script, daemon) in [
        (
            "mpirun.openmpi -np 2 --host anyLinux-1,anyLinux-2 ~/mpi_hosts.ompi",
            "orted",
        ),
        (
            "UCX_TLS=^sm mpiexec.mpich -launcher rsh -hosts anyLinux-1,anyLinux-2 -n 2 ~/mpi_hosts.mpich",
            "hydra_pmi_proxy",
        ),
    ] {
        let out = job(&env, None, script);
        assert_eq!(rank_hosts(&env, script, &out), both, "{script}");
        // The job keeps an instance's host until it ends; then both go back.
        assert_all_given_back(&env, daemon);
    }
}

/// With 4 idle hosts of which 2 are `public`, the broad names of
/// `-hosts anyLinux,anyHost,anyPublic` took both public hosts, `anyPublic` waited while two
/// hosts sat idle, and the ranks waited in MPI_Init for ever. Every name must get a host
/// (three distinct ones), `anyPublic` a public one, and the run must complete.
#[test]
fn broad_names_leave_the_public_hosts_for_any_public_and_mpi_starts() {
    if skip_unless_root("broad_names_leave_the_public_hosts_for_any_public_and_mpi_starts") {
        return;
    }
    // node02: the front end; node03, node04 public; node05, node06 not.
    let mut opts = LabWithBroker::front_end_options();
    opts.labels = vec![("node05".into(), vec![]), ("node06".into(), vec![])];
    let env = LabWithBroker::start_opts(5, &opts);
    build_program(&env, "mpi_hosts", "mpicc.mpich", "mpi_hosts.mpich");
    build_program(&env, "mpi_hosts", "mpicc.openmpi", "mpi_hosts.ompi");
    for (daemon, script) in [
        (
            "hydra_pmi_proxy",
            "UCX_TLS=^sm mpiexec.mpich -launcher rsh -hosts anyLinux,anyHost,anyPublic -n 3 ~/mpi_hosts.mpich",
        ),
        (
            "orted",
            "mpirun.openmpi -np 3 --host anyLinux,anyHost,anyPublic ~/mpi_hosts.ompi",
        ),
    ] {
        let out = job(&env, None, script);
        let hosts = rank_hosts(&env, script, &out);
        let mut distinct = hosts.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), 3, "three names, three hosts: {hosts:?}");
        let public = hosts.iter().filter(|h| GRANTABLE.contains(&h.as_str()));
        assert_eq!(
            public.count(),
            1,
            "{script}: only anyPublic on a public host, the broad names on node05/node06: \
             {hosts:?}"
        );
        assert_all_given_back(&env, daemon);
    }
}
