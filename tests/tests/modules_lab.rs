//! Tier 3 for modules: real PVM 3.4 and LAM/MPI 7.1 jobs, run by the lab's unprivileged
//! user (both refuse root) under `agent` on node02, grown onto, shrunk off and halted on
//! real namespaced hosts by the shipped `pvm-*` and `lam-*` modules, over real rsh.
//! Root only (the lab); each test prints why it is skipped otherwise.
//!
//! Phase 1 is what a user types: `pvm> add anyLinux`, `lamgrow anyLinux`. Both systems look
//! the name up before they run the remote shell; the agent preloads librb_preload.so into
//! module jobs, so `anyLinux` resolves (to a placeholder) and the shim gets the call.

use std::{
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

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

/// `sh -c SCRIPT` as the lab user on `host`.
fn user_sh(env: &LabWithBroker, host: &str, script: &str) -> Output {
    env.lab
        .exec_as_user(host, &["sh", "-c", script])
        .unwrap_or_else(|e| panic!("{host}: {e}"))
}

/// A test program compiled by the lab user (binary `~/NAME`); panics with the compiler's
/// complaint.
fn build_program(env: &LabWithBroker, name: &str, compiler: &str, libs: &str) -> PathBuf {
    env.build_program(name, compiler, name, libs)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The job: `agent --rsl '&(module=NAME)(adaptive=yes)' sh -c DRIVER` as the lab user.
fn start_job(env: &LabWithBroker, module: &str, driver: &str) -> Child {
    let spec = format!("&(module=\"{module}\")(adaptive=yes)");
    env.agent_as_user(FRONT_END, &["--rsl", &spec], &["sh", "-c", driver])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent")
}

fn held_hosts(env: &LabWithBroker) -> Vec<String> {
    env.broker.held_hosts()
}

/// No process named `name` (a pgrep pattern) of the lab user on any host, once the hosts'
/// inits have had a moment to reap what the halt ended; the agent's log otherwise.
fn assert_nothing_left(env: &LabWithBroker, name: &str, agent: &Output) {
    let left = wait_until(Duration::from_secs(5), || {
        let left = env.user_processes(name);
        left.is_empty().then_some(left)
    })
    .unwrap_or_else(|| env.user_processes(name));
    assert!(
        left.is_empty(),
        "{name} left after the job: {left:?}\nagent log:\n{}",
        String::from_utf8_lossy(&agent.stderr)
    );
}

fn finish(env: &LabWithBroker, child: Child) -> Output {
    let out = child.wait_with_output().expect("agent");
    assert_eq!(
        out.status.code(),
        Some(0),
        "agent stderr:\n{}\nbroker log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        env.broker.log()
    );
    out
}

/// Waits for `what`; on failure ends the job and panics with its story: the lab user's
/// processes and home at the deadline, the agent's log, `rb jobs` (with the module notes)
/// and the driver's files.
fn wait_for<T>(
    env: &LabWithBroker,
    job: &mut Option<Child>,
    what: &str,
    limit: Duration,
    f: impl FnMut() -> Option<T>,
) -> T {
    if let Some(found) = wait_until(limit, f) {
        return found;
    }
    // Taken before the job is ended: what the lab user runs on each host, and the home.
    let running = env.user_processes(".").join("\n");
    let home_files = std::fs::read_dir(&env.lab.user().home)
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|e| format!("unreadable: {e}"));
    let agent_log = job.take().map_or_else(String::new, |mut child| {
        let _ = env.lab.kill_spawned(&mut child);
        child
            .wait_with_output()
            .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            .unwrap_or_default()
    });
    let jobs = serde_json::to_string_pretty(&env.broker.jobs()).unwrap_or_default();
    let home = &env.lab.user().home;
    let files: String = [
        "pvm-add.out",
        "lam-boot.out",
        "lam-grow.out",
        "lam-grow2.out",
        "lam-mpi.out",
        "lamexec.out",
        "mpirun.out",
    ]
    .iter()
    .filter_map(|f| {
        Some(format!(
            "--- {f}\n{}",
            std::fs::read_to_string(home.join(f)).ok()?
        ))
    })
    .collect();
    panic!(
        "{what}: not within {limit:?}\nagent log:\n{agent_log}\nrb jobs:\n{jobs}\n{files}\n\
         the lab user's processes then:\n{running}\nhome then: {home_files}"
    );
}

const PVM_ENV: &str = "PVM_ROOT=/usr/lib/pvm3; export PVM_ROOT;";

/// Console commands into the job's running master pvmd (never starts one: the job's own).
fn pvm_console(env: &LabWithBroker, commands: &str) -> String {
    text(&user_sh(
        env,
        FRONT_END,
        &format!("{PVM_ENV} printf '{commands}\\n' | pvm 2>&1"),
    ))
}

/// Hosts in the virtual machine's `conf`, besides the master's.
fn pvm_hosts_in_conf(env: &LabWithBroker) -> Vec<String> {
    pvm_console(env, "conf")
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|w| w.starts_with("node") && w != FRONT_END)
        .collect()
}

#[test]
fn pvm_grows_onto_any_linux_shrinks_on_release_and_halts_at_job_end() {
    if skip_unless_root("pvm_grows_onto_any_linux_shrinks_on_release_and_halts_at_job_end") {
        return;
    }
    let env = lab();
    let program = build_program(&env, "pvm_hosts", "gcc", "-lpvm3");
    // The driver plays the user at the console: start the virtual machine, `add anyLinux`
    // (phase 1: PVM sees a failed add), then keep the job alive until told to stop.
    let driver = format!(
        "{PVM_ENV} echo quit | pvm >/dev/null 2>&1; \
         echo 'add anyLinux' | pvm >~/pvm-add.out 2>&1; touch ~/pvm-ready; \
         while [ ! -e ~/pvm-add2 ]; do sleep 0.1; done; \
         echo 'add anyLinux' | pvm >~/pvm-add2.out 2>&1; \
         while [ ! -e ~/pvm-stop ]; do sleep 0.1; done"
    );
    let started = Instant::now();
    let mut job = Some(start_job(&env, "pvm", &driver));
    // Only once the job's master runs: a console with no pvmd starts one of its own.
    let ready = env.lab.user().home.join("pvm-ready");
    wait_for(
        &env,
        &mut job,
        "the job's PVM master started",
        Duration::from_secs(20),
        || ready.exists().then_some(()),
    );
    // Phase 2: the broker grants a host, pvm-grow adds it; `conf` lists it soon after.
    let grown = wait_for(
        &env,
        &mut job,
        "a granted host in PVM's conf",
        Duration::from_secs(30),
        || pvm_hosts_in_conf(&env).pop(),
    );
    let took = started.elapsed();
    assert!(["node03", "node04"].contains(&grown.as_str()), "{grown}");
    assert_eq!(
        held_hosts(&env),
        vec![grown.clone()],
        "the job holds what PVM has"
    );
    let add = std::fs::read_to_string(env.lab.user().home.join("pvm-add.out")).unwrap_or_default();
    assert!(
        add.contains("anyLinux Can't start pvmd") && !add.contains("No such host"),
        "phase 1 is an add that reached the shim (the name resolved) and failed: {add}"
    );
    // The master's log: PVM took the shim's stdout line as the start's answer, so it made
    // one attempt, not a second with the Windows command (a second refusal on stderr).
    let log = text(&user_sh(&env, FRONT_END, "cat /tmp/pvml.$(id -u)"));
    assert!(
        log.contains(
            "startack() host anyLinux expected version, got \"ddpro<refused-by-the-rsh-shim\""
        ),
        "{log}"
    );
    assert_eq!(
        log.matches("stderr@anyLinux: rsh: anyLinux:").count(),
        1,
        "{log}"
    );
    // A compiled PVM program spawns tasks on the grown host.
    let out = user_sh(
        &env,
        FRONT_END,
        &format!("{PVM_ENV} {} 4", program.display()),
    );
    assert!(
        out.status.success(),
        "pvm_hosts: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task_hosts = text(&out);
    assert!(
        task_hosts.lines().any(|l| l.trim() == grown),
        "no task ran on {grown}: {task_hosts}"
    );
    // A second `add anyLinux` from the script, right after the first was answered: a new
    // request (not a retry of the first), so the job grows onto the other host too.
    std::fs::write(env.lab.user().home.join("pvm-add2"), "").expect("add2");
    let both = wait_for(
        &env,
        &mut job,
        "a second add anyLinux: two hosts in conf",
        Duration::from_secs(30),
        || {
            let mut hosts = pvm_hosts_in_conf(&env);
            hosts.sort();
            (hosts.len() == 2).then_some(hosts)
        },
    );
    let other = both.iter().find(|h| **h != grown).cloned().expect("other");
    // The first add left the job's PVM task behind (`rb-pvm-add --serve`), and the second
    // went through it; it ends with the virtual machine (below).
    let served = wait_until(Duration::from_secs(5), || {
        let found = env.user_processes("rb-pvm-add");
        (found.len() == 1 && found[0].ends_with("--serve")).then_some(())
    });
    assert!(
        served.is_some(),
        "the job's enrolled PVM task: {:?}",
        env.user_processes("rb-pvm-add")
    );
    // rb release: pvm-shrink deletes the host; PVM's conf and the broker forget it.
    let out = env.broker.rb(&["release", &grown, "--grace-s", "5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        &env,
        &mut job,
        "the released host gone from conf",
        Duration::from_secs(15),
        || (!pvm_hosts_in_conf(&env).contains(&grown)).then_some(()),
    );
    wait_for(
        &env,
        &mut job,
        "the released host free, the other still held",
        Duration::from_secs(10),
        || (held_hosts(&env) == vec![other.clone()]).then_some(()),
    );
    wait_for(
        &env,
        &mut job,
        "no pvmd left on the released host",
        Duration::from_secs(10),
        || {
            env.user_processes("pvmd3?")
                .iter()
                .all(|l| !l.starts_with(&grown))
                .then_some(())
        },
    );
    // Job end: pvm-halt; no pvmd anywhere.
    std::fs::write(env.lab.user().home.join("pvm-stop"), "").expect("stop");
    let out = finish(&env, job.take().expect("job"));
    assert_nothing_left(&env, "pvmd3?", &out);
    assert_nothing_left(&env, "rb-pvm-add", &out);
    eprintln!("pvm: anyLinux add to conf in {took:?}");
}

#[test]
fn pvm_grow_answers_alike_with_the_pvm_task_and_with_the_console() {
    if skip_unless_root("pvm_grow_answers_alike_with_the_pvm_task_and_with_the_console") {
        return;
    }
    let env = lab();
    let grow = shipped_module("pvm-grow");
    let bin_dir = tests::bin_dir().display().to_string();
    // A stand-in rb-pvm-add that cannot use PVM (exit 3): pvm-grow must fall back to the
    // console.
    let fake = env.lab.user().home.join("fake-bin");
    write_script(
        &fake.join("rb-pvm-add"),
        "#!/bin/sh\necho \"$@\" >>~/fake-adder-calls\nexit 3\n",
    );
    // The same calls three ways: with RB_BIN_DIR (rb-pvm-add does the add), without (the
    // console does), and with the stand-in (tried, then the console). Each prints
    // "WAY CALL rc=N stderr=…" lines.
    let script = format!(
        "{PVM_ENV} echo quit | pvm >/dev/null 2>&1
         for way in task console fallback; do
           case $way in
             task) RB_BIN_DIR={bin_dir}; export RB_BIN_DIR ;;
             console) unset RB_BIN_DIR ;;
             fallback) RB_BIN_DIR={fake}; export RB_BIN_DIR ;;
           esac
           for call in node03 node03 nosuchhost; do
             err=$({grow} $call 2>&1 >/dev/null); echo \"$way $call rc=$? stderr=$err\"
           done
           echo 'conf' | pvm 2>/dev/null | grep -cw node03 | sed \"s/^/$way conf=/\"
           echo 'delete node03' | pvm >/dev/null 2>&1; sleep 1
         done
          echo halt | pvm >/dev/null 2>&1",
        grow = grow.display(),
        fake = fake.display()
    );
    let out = text(&user_sh(&env, FRONT_END, &script));
    let calls =
        std::fs::read_to_string(env.lab.user().home.join("fake-adder-calls")).unwrap_or_default();
    assert_eq!(
        calls.lines().filter(|l| l.ends_with(" node03")).count(),
        2,
        "pvm-grow tried RB_BIN_DIR/rb-pvm-add first: {calls}"
    );
    for way in ["task", "console", "fallback"] {
        let lines = way_lines(&out, way);
        let already = "pvm-grow: node03 is in the virtual machine already (Duplicate host)";
        assert_added_then_already_there(&lines, way, already, &out);
        assert!(
            lines.iter().any(|l| l.ends_with(
                "nosuchhost rc=1 stderr=pvm-grow: PVM could not add nosuchhost: No such host"
            )),
            "{way}: PVM's refusal, in its words: {out}"
        );
        assert!(
            lines.contains(&format!("{way} conf=1").as_str()),
            "{way}: node03 in conf: {out}"
        );
    }
}

/// The usual lab: every workstation is a lab host, so the broker
/// manages node02, the front end the job runs on, as well as node03 and node04.
fn lab_with_the_front_end_inside() -> LabWithBroker {
    LabWithBroker::start_with_managed_front_end(3)
}

/// The notes of the running job in `rb jobs`, joined.
fn job_notes(env: &LabWithBroker) -> String {
    env.broker
        .jobs()
        .iter()
        .filter(|j| j["state"] == "running")
        .map(|j| j["notes"].to_string())
        .collect()
}

/// With the front end managed by the broker, a PVM job on node02 that
/// typed `add anyLinux` was granted node02 itself; PVM refused the duplicate and the job
/// never grew. It must grow onto another host; a host it added by name (node03, through
/// the shim) is never granted to it either.
#[test]
fn pvm_add_any_linux_with_the_front_end_inside_grows_onto_another_host() {
    if skip_unless_root("pvm_add_any_linux_with_the_front_end_inside_grows_onto_another_host") {
        return;
    }
    let env = lab_with_the_front_end_inside();
    let driver = format!(
        "{PVM_ENV} echo quit | pvm >/dev/null 2>&1; touch ~/pvm-ready; \
         while [ ! -e ~/pvm-go ]; do sleep 0.1; done; \
         echo 'add anyLinux' | pvm >~/pvm-add.out 2>&1; \
         while [ ! -e ~/pvm-named ]; do sleep 0.1; done; \
         echo 'add node03' | pvm >~/pvm-add-named.out 2>&1; \
         echo 'add anyLinux' | pvm >~/pvm-add2.out 2>&1; \
         while [ ! -e ~/pvm-stop ]; do sleep 0.1; done"
    );
    let home = env.lab.user().home.clone();
    let mut job = Some(start_job(&env, "pvm", &driver));
    wait_for(
        &env,
        &mut job,
        "the job's PVM master started",
        Duration::from_secs(20),
        || home.join("pvm-ready").exists().then_some(()),
    );
    std::fs::write(home.join("pvm-go"), "").expect("go");
    let grown = wait_for(
        &env,
        &mut job,
        "a host other than the front end in PVM's conf",
        Duration::from_secs(30),
        || pvm_hosts_in_conf(&env).pop(),
    );
    assert_ne!(grown, FRONT_END);
    let held = wait_for(
        &env,
        &mut job,
        "the job holds one host",
        Duration::from_secs(10),
        || {
            let held = held_hosts(&env);
            (held.len() == 1).then_some(held)
        },
    );
    assert_eq!(held, vec![grown.clone()], "never its own node02");
    // Give the grown host back, then add node03 by name and anyLinux again: the grant must
    // be node04, whatever held what before.
    let out = env.broker.rb(&["release", &grown, "--grace-s", "5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        &env,
        &mut job,
        "the released host gone",
        Duration::from_secs(20),
        || (pvm_hosts_in_conf(&env).is_empty() && held_hosts(&env).is_empty()).then_some(()),
    );
    std::fs::write(home.join("pvm-named"), "").expect("named");
    wait_for(
        &env,
        &mut job,
        "node03 (by name) and node04 (granted) in conf, node04 held",
        Duration::from_secs(30),
        || {
            let mut conf = pvm_hosts_in_conf(&env);
            conf.sort();
            (conf == ["node03", "node04"] && held_hosts(&env) == ["node04"]).then_some(())
        },
    );
    let notes = job_notes(&env);
    assert!(
        !notes.contains("already"),
        "no grant of a host in use: {notes}"
    );
    std::fs::write(home.join("pvm-stop"), "").expect("stop");
    let out = finish(&env, job.take().expect("job"));
    assert_nothing_left(&env, "pvmd3?", &out);
}

/// The same for LAM: `lamgrow anyLinux` in a universe booted on node02 (managed
/// by the broker) grows onto another host, and a host of the boot schema (node03, booted
/// through the shim) is never granted to the job.
#[test]
fn lam_grow_any_linux_with_the_front_end_inside_grows_onto_another_host() {
    if skip_unless_root("lam_grow_any_linux_with_the_front_end_inside_grows_onto_another_host") {
        return;
    }
    let env = lab_with_the_front_end_inside();
    let driver = "printf 'node02\\nnode03\\n' >~/lam-boot.schema; \
         lamboot -s ~/lam-boot.schema </dev/null >~/lam-boot.out 2>&1 || exit 3; touch ~/lam-booted; \
         lamgrow anyLinux </dev/null >~/lam-grow.out 2>&1; \
         while [ ! -e ~/lam-stop ]; do sleep 0.1; done";
    let mut job = Some(start_job(&env, "lam", driver));
    let grown = wait_for(
        &env,
        &mut job,
        "node04 in lamnodes",
        Duration::from_secs(30),
        || {
            lam_nodes(&env)
                .into_iter()
                .find(|n| n.starts_with("node04"))
        },
    );
    assert!(grown.starts_with("node04"), "{grown}");
    let nodes = lam_nodes(&env);
    assert_eq!(
        nodes.len(),
        3,
        "node02, node03 and node04 once each: {nodes:?}"
    );
    wait_for(
        &env,
        &mut job,
        "node04 held",
        Duration::from_secs(10),
        || (held_hosts(&env) == ["node04"]).then_some(()),
    );
    let notes = job_notes(&env);
    assert!(
        !notes.contains("already"),
        "no grant of a host in use: {notes}"
    );
    std::fs::write(env.lab.user().home.join("lam-stop"), "").expect("stop");
    let out = finish(&env, job.take().expect("job"));
    assert_nothing_left(&env, "lamd", &out);
}

/// A program of the shipped modules (`modules/` of this repository).
fn shipped_module(name: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../modules")
        .join(name)
}

/// `lamnodes` of the job's running LAM universe: node names; none before the job's driver
/// has said that its lamboot returned (`~/lam-booted`). LAM's clients remove the session
/// directory of a lamd they cannot reach: a `lamnodes` between the booting lamd's mkdir of
/// that directory and its socket ended that lamd, and the job's lamboot waited 60 s (CI,
/// session 19; see `lam_grow_during_the_jobs_lamboot_waits_for_its_lamd_and_leaves_the_boot_alone`).
fn lam_nodes(env: &LabWithBroker) -> Vec<String> {
    if !env.lab.user().home.join("lam-booted").exists() {
        return Vec::new();
    }
    text(&user_sh(env, FRONT_END, "lamnodes 2>/dev/null"))
        .lines()
        .filter_map(|l| l.split('\t').nth(1)?.split(':').next().map(String::from))
        .collect()
}

#[test]
fn lam_grows_onto_any_linux_shrinks_on_release_and_halts() {
    if skip_unless_root("lam_grows_onto_any_linux_shrinks_on_release_and_halts") {
        return;
    }
    let env = lab();
    build_program(&env, "mpi_hosts", "mpicc.lam", "");
    // The driver: boot LAM on node02 alone, `lamgrow anyLinux` (phase 1), wait for stop.
    let driver = "echo node02 >~/lam-boot.schema; \\
         lamboot -s ~/lam-boot.schema </dev/null >~/lam-boot.out 2>&1 || exit 3; touch ~/lam-booted; \\
         lamgrow anyLinux </dev/null >~/lam-grow.out 2>&1; touch ~/lam-grow.done; \\
         while [ ! -e ~/lam-mpi.go ]; do sleep 0.1; done; \\
         for i in 1 2 3 4 5; do mpirun.lam N ~/mpi_hosts; done >~/lam-mpi.out 2>&1; \\
         touch ~/lam-mpi.done; \\
         while [ ! -e ~/lam-stop ]; do sleep 0.1; done";
    let started = Instant::now();
    let mut job = Some(start_job(&env, "lam", driver));
    let grown = wait_for(
        &env,
        &mut job,
        "a granted host in lamnodes",
        Duration::from_secs(30),
        || {
            lam_nodes(&env)
                .into_iter()
                .find(|n| n.starts_with("node03") || n.starts_with("node04"))
        },
    );
    let took = started.elapsed();
    let grown = grown.split('.').next().unwrap_or_default().to_string();
    let grow =
        std::fs::read_to_string(env.lab.user().home.join("lam-grow.out")).unwrap_or_default();
    assert!(
        grow.contains("rsh anyLinux -n"),
        "phase 1 is a lamgrow whose rsh reached the shim (the name resolved): {grow}"
    );
    assert_eq!(held_hosts(&env), vec![grown.clone()]);
    // An MPI program in the grown universe, run by the job: one rank per node, so one on the
    // grown host. Five runs: without librb_preload's `nsend` guard, LAM 7.1's MPI_Init
    // failed with errno 14 in about half of the processes the job's lamd started.
    let home = env.lab.user().home.clone();
    std::fs::write(home.join("lam-mpi.go"), "").expect("go");
    wait_for(
        &env,
        &mut job,
        "five mpirun.lam N runs in the job",
        Duration::from_secs(60),
        || home.join("lam-mpi.done").exists().then_some(()),
    );
    let mpi = std::fs::read_to_string(home.join("lam-mpi.out")).unwrap_or_default();
    let on_grown = mpi
        .lines()
        .filter(|l| l.starts_with("rank ") && l.ends_with(&format!(" on {grown}")))
        .count();
    let on_front = mpi
        .lines()
        .filter(|l| l.starts_with("rank ") && l.ends_with(&format!(" on {FRONT_END}")))
        .count();
    assert!(
        on_grown == 5 && on_front == 5 && !mpi.contains("errno"),
        "mpirun.lam N ~/mpi_hosts five times: one rank on {FRONT_END} and one on {grown} each:\n{mpi}"
    );
    // rb release: lam-shrink; lamnodes and the broker forget the host.
    let out = env.broker.rb(&["release", &grown, "--grace-s", "5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        &env,
        &mut job,
        "the released host gone from lamnodes",
        Duration::from_secs(15),
        || (!lam_nodes(&env).iter().any(|n| n.starts_with(&grown))).then_some(()),
    );
    wait_for(
        &env,
        &mut job,
        "the released host free",
        Duration::from_secs(10),
        || held_hosts(&env).is_empty().then_some(()),
    );
    std::fs::write(env.lab.user().home.join("lam-stop"), "").expect("stop");
    let out = finish(&env, job.take().expect("job"));
    assert_nothing_left(&env, "lamd", &out);
    eprintln!("lam: anyLinux grow to lamnodes in {took:?}");
}

#[test]
fn lam_grow_waits_while_another_lamgrow_of_the_universe_runs() {
    if skip_unless_root("lam_grow_waits_while_another_lamgrow_of_the_universe_runs") {
        return;
    }
    let env = lab();
    let grow = shipped_module("lam-grow");
    let bin_dir = tests::bin_dir().display().to_string();
    // A lamgrow of node04 whose remote shell takes a second to fail holds LAM's one-lamgrow
    // lock meanwhile, as a job's own phase-1 `lamgrow anyLinux` does for milliseconds.
    // A plain lamgrow is refused ("already running"); lam-grow waits and then grows, both
    // when rb-lam-add does the add (it waits itself) and when lamgrow does (asked again).
    for (way, bin_dir_setting) in [
        (
            "rb-lam-add",
            format!("RB_BIN_DIR={bin_dir}; export RB_BIN_DIR"),
        ),
        ("lamgrow", "unset RB_BIN_DIR".to_string()),
    ] {
        let script = format!(
            "{bin_dir_setting}
             printf '#!/bin/sh\\ncase \"$*\" in *node04*) sleep 1; exit 1;; esac\\nexec rsh \"$@\"\\n' >~/slowrsh
             chmod +x ~/slowrsh
             echo {FRONT_END} >~/lam-lock.schema
             LAMRSH=rsh lamboot -s ~/lam-lock.schema </dev/null >/dev/null 2>&1 || exit 3
             LAMRSH=~/slowrsh lamgrow node04 </dev/null >~/slow.out 2>&1 &
             sleep 0.3
             LAMRSH=rsh lamgrow node05 </dev/null 2>&1 | grep -c 'already running' | sed 's/^/plain=/'
             t0=$(date +%s%N)
             LAMRSH=rsh {grow} node03; echo \"rc=$?\"
             echo \"waited_ms=$(( ($(date +%s%N) - t0) / 1000000 ))\"
             wait
             lamnodes 2>&1
             lamhalt </dev/null >/dev/null 2>&1",
            grow = grow.display()
        );
        let out = text(&user_sh(&env, FRONT_END, &script));
        assert!(
            out.contains("plain=1"),
            "{way}: LAM refuses a second lamgrow: {out}"
        );
        assert!(
            out.contains("rc=0"),
            "{way}: lam-grow waited, then grew: {out}"
        );
        let waited: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("waited_ms=")?.parse().ok())
            .unwrap_or(0);
        assert!(
            waited >= 300,
            "{way}: lam-grow waited for the slow lamgrow: {out}"
        );
        assert!(
            out.lines().any(|l| l.contains("\tnode03")),
            "{way}: node03 in lamnodes: {out}"
        );
    }
}

/// The job's lamboot of the front end, with `lamd` on its PATH a script that marks its
/// start (`~/lamd-mark`) and then runs `lamd_body` (lines of a `printf` format, so `\n`
/// between them and no `'` or `%`); once the shell condition `caught` holds (at most 10 s),
/// the shell lines `probes`, then `lam-grow node03` during the boot, the boot's end and
/// `lamnodes`. The script's output.
fn lam_grow_during_a_boot(
    env: &LabWithBroker,
    lamd_body: &str,
    caught: &str,
    probes: &str,
) -> String {
    let script = format!(
        "RB_BIN_DIR={bin_dir}; export RB_BIN_DIR
         mkdir -p ~/wrapped-lamd
         rm -f ~/lamd-mark
         printf '#!/bin/sh\\ntouch %s/lamd-mark\\n{lamd_body}\\n' \"$HOME\" >~/wrapped-lamd/lamd
         chmod +x ~/wrapped-lamd/lamd
         echo {FRONT_END} >~/boot.schema
         dir=/tmp/lam-$(id -un)@$(hostname)
         PATH=~/wrapped-lamd:$PATH LAMRSH=rsh timeout 20 lamboot -s ~/boot.schema </dev/null >~/boot.out 2>&1 &
         boot=$!
         i=0
         while ! {{ {caught}; }} && [ $i -lt 10000 ]; do i=$((i + 1)); sleep 0.001; done
         {probes}
         LAMRSH=rsh {grow} node03 2>&1; echo \"grow_rc=$?\"
         wait $boot; echo \"boot_rc=$?\"
         lamnodes 2>&1
         lamhalt </dev/null >/dev/null 2>&1",
        bin_dir = tests::bin_dir().display(),
        grow = shipped_module("lam-grow").display()
    );
    text(&user_sh(env, FRONT_END, &script))
}

/// A boot caught in one state ([`lam_grow_during_a_boot`]'s arguments), and what its
/// probes print there (`seen`, not `unseen`: `what`).
struct BootCaught {
    lamd_body: &'static str,
    caught: &'static str,
    probes: &'static str,
    seen: &'static str,
    unseen: &'static str,
    what: &'static str,
}

/// The test `name` (as root): lam-grow during the job's boot caught as `boot` says; the
/// boot was caught so, the grow grew the universe and the boot returned.
fn grows_during_a_boot(name: &str, boot: &BootCaught) {
    if skip_unless_root(name) {
        return;
    }
    let env = lab();
    let out = lam_grow_during_a_boot(&env, boot.lamd_body, boot.caught, boot.probes);
    assert!(
        out.contains(boot.seen) && !out.contains(boot.unseen),
        "{}: {out}",
        boot.what
    );
    assert_grown_during_the_boot(&out);
}

/// lam-grow's call in [`lam_grow_during_a_boot`] grew the universe onto node03, and the
/// job's lamboot returned.
fn assert_grown_during_the_boot(out: &str) {
    assert!(
        out.contains("grow_rc=0"),
        "lam-grow waited, then grew: {out}"
    );
    assert!(
        out.contains("boot_rc=0"),
        "the job's lamboot was left alone and returned: {out}"
    );
    assert!(
        out.lines().any(|l| l.contains("\tnode03")),
        "node03 in lamnodes: {out}"
    );
}

/// A grow while the job's lamboot is still starting its lamd: LAM's attach to a lamd it
/// cannot reach removes the session directory, so a lamd between its mkdir of that directory
/// and its socket then fails ("chdir failed!") and the lamboot waits 60 s for it (CI,
/// session 19: the test's own `lamnodes` did it). lam-grow (through rb-lam-add) waits for
/// the socket instead. The lamd is held in that state for 2 s, deterministically: strace
/// delays its first bind, the kernel socket's. The script waits for the lamd's own
/// directory: the one hboot's tkill makes and removes just before is not it.
#[test]
fn lam_grow_during_the_jobs_lamboot_waits_for_its_lamd_and_leaves_the_boot_alone() {
    grows_during_a_boot(
        "lam_grow_during_the_jobs_lamboot_waits_for_its_lamd_and_leaves_the_boot_alone",
        &BootCaught {
            lamd_body: "exec strace -f -o /dev/null -e trace=bind \
                        -e inject=bind:delay_enter=2s:when=1 /usr/bin/lamd \"$@\"",
            caught: "[ -e ~/lamd-mark ] && [ -d \"$dir\" ]",
            probes: "[ -d \"$dir\" ] && echo starting=yes
                     [ -S \"$dir/lam-kernel-socket\" ] && echo socket=early",
            seen: "starting=yes",
            unseen: "socket=early",
            what: "the lamd was caught starting (its directory, no socket)",
        },
    );
}

/// A grow between the lamboot's tkill and its lamd: hboot's tkill makes the session
/// directory and removes it, and for the next 2 ms (or however long the lamd takes to
/// start) there is no directory although the boot is under way. rb-lam-add said "no
/// lamd" there and lam-grow failed (CI, session 21: the test above caught tkill's
/// directory). It now waits while a lamboot, hboot, tkill or lamd of the user runs there.
/// Held for 1 s, deterministically: the lamd is a script that marks the gap, then sleeps.
#[test]
fn lam_grow_between_the_boots_tkill_and_its_lamd_waits_for_the_lamd() {
    grows_during_a_boot(
        "lam_grow_between_the_boots_tkill_and_its_lamd_waits_for_the_lamd",
        &BootCaught {
            lamd_body: "sleep 1\\nexec /usr/bin/lamd \"$@\"",
            caught: "[ -e ~/lamd-mark ]",
            probes: "[ -e ~/lamd-mark ] && echo gap=yes
                     [ -d \"$dir\" ] && echo directory=there",
            seen: "gap=yes",
            unseen: "directory=there",
            what: "the boot was caught between tkill and lamd (no directory)",
        },
    );
}

/// A grow while the job's lamd has bound its kernel socket but does not listen on it yet:
/// the socket file is there, and a LAM client's connect is refused, which makes LAM's
/// attach remove the session directory; the lamd then died and the job's lamboot hung
/// until its timeout (CI, session 26: rb-lam-add took the socket file for a listening lamd
/// and caught that window, microseconds wide, on a loaded machine). rb-lam-add now asks
/// the socket itself. Held for 2 s, deterministically: strace delays the lamd's first
/// listen, the kernel socket's (it follows that socket's bind in LAM's
/// `sfh_sock_open_srv_unix_stm`). The script sees the socket not listening in the
/// kernel's table of this host's Unix sockets (a listening one has flag 00010000).
#[test]
fn lam_grow_while_the_lamd_binds_but_does_not_yet_listen_waits_for_it() {
    grows_during_a_boot(
        "lam_grow_while_the_lamd_binds_but_does_not_yet_listen_waits_for_it",
        &BootCaught {
            lamd_body: "exec strace -f -o /dev/null -e trace=listen \
                        -e inject=listen:delay_enter=2s:when=1 /usr/bin/lamd \"$@\"",
            caught: "[ -S \"$dir/lam-kernel-socket\" ]",
            probes: "[ -S \"$dir/lam-kernel-socket\" ] && echo socket=bound
                     awk '$4 == \"00010000\" && $NF ~ /lam-kernel-socket$/' /proc/net/unix \
                       | grep -q . && echo listening=early",
            seen: "socket=bound",
            unseen: "listening=early",
            what: "the lamd was caught between its socket's bind and its listen",
        },
    );
}

#[test]
fn lam_grow_answers_alike_with_rb_lam_add_and_with_lamgrow() {
    if skip_unless_root("lam_grow_answers_alike_with_rb_lam_add_and_with_lamgrow") {
        return;
    }
    let env = lab();
    let grow = shipped_module("lam-grow");
    let bin_dir = tests::bin_dir().display().to_string();
    let home = env.lab.user().home.clone();
    // A stand-in rb-lam-add that cannot use LAM (exit 3), and a lamgrow first on PATH that
    // notes each call and runs LAM's: lam-grow must use lamgrow only when rb-lam-add is
    // absent or answers 3.
    let fake = home.join("fake-bin");
    let spy = home.join("spy-bin");
    write_script(
        &fake.join("rb-lam-add"),
        "#!/bin/sh\necho \"$@\" >>~/fake-adder-calls\nexit 3\n",
    );
    write_script(
        &spy.join("lamgrow"),
        "#!/bin/sh\necho \"$@\" >>~/lamgrow-calls\nexec /usr/bin/lamgrow \"$@\"\n",
    );
    // The same calls three ways: with RB_BIN_DIR (rb-lam-add does the add), without
    // (lamgrow does), and with the stand-in (tried, then lamgrow). Each prints
    // "WAY CALL rc=N stderr=…" lines, the number of lamgrow calls and of node03 nodes.
    let script = format!(
        "LAMRSH=rsh; export LAMRSH
         echo {FRONT_END} >~/alike.schema
         lamboot -s ~/alike.schema </dev/null >/dev/null 2>&1 || exit 3
         PATH={spy}:$PATH
         for way in rb-lam-add lamgrow fallback; do
           case $way in
             rb-lam-add) RB_BIN_DIR={bin_dir}; export RB_BIN_DIR ;;
             lamgrow) unset RB_BIN_DIR ;;
             fallback) RB_BIN_DIR={fake}; export RB_BIN_DIR ;;
           esac
           : >~/lamgrow-calls
           for call in node03 node03 nosuchhost; do
             err=$({grow} $call 2>&1 >/dev/null); echo \"$way $call rc=$? stderr=$err\"
           done
           echo \"$way lamgrow-calls=$(wc -l <~/lamgrow-calls)\"
           echo \"$way node03=$(lamnodes 2>/dev/null | grep -c node03)\"
           lamshrink $(lamnodes 2>/dev/null | awk -F '\\t' '/node03/ {{ print $1 }}') >/dev/null 2>&1
         done
         lamhalt </dev/null >/dev/null 2>&1",
        grow = grow.display(),
        spy = spy.display(),
        fake = fake.display()
    );
    let out = text(&user_sh(&env, FRONT_END, &script));
    let fake_calls = std::fs::read_to_string(home.join("fake-adder-calls")).unwrap_or_default();
    assert_eq!(
        fake_calls.lines().count(),
        3,
        "lam-grow tried RB_BIN_DIR/rb-lam-add first: {fake_calls}"
    );
    for (way, lamgrow_calls) in [("rb-lam-add", 0), ("lamgrow", 3), ("fallback", 3)] {
        let lines = way_lines(&out, way);
        let already = "lam-grow: node03 is a node of this LAM universe already";
        assert_added_then_already_there(&lines, way, already, &out);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("nosuchhost rc=1 stderr=lam-grow: ")
                    && l.contains(
                        " nosuchhost failed (exit 1): The host 'nosuchhost' cannot be resolved"
                    )),
            "{way}: LAM's refusal, in its words: {out}"
        );
        assert!(
            lines.contains(&format!("{way} lamgrow-calls={lamgrow_calls}").as_str()),
            "{way}: {lamgrow_calls} lamgrow calls: {out}"
        );
        assert!(
            lines.contains(&format!("{way} node03=1").as_str()),
            "{way}: node03 once in lamnodes: {out}"
        );
    }
}

/// The output lines of one way of an "answers alike" test ("WAY CALL rc=N stderr=…").
fn way_lines<'a>(out: &'a str, way: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(way)).collect()
}

/// What every way of an "answers alike" test shares: the first `node03` call added the
/// host (exit 0, silent), the second found it there already (exit 6, `already` on stderr:
/// the agent then gives the grant back and asks again, modules/CONTRACT.md).
fn assert_added_then_already_there(lines: &[&str], way: &str, already: &str, out: &str) {
    let node03: Vec<&&str> = lines.iter().filter(|l| l.contains(" node03 rc=")).collect();
    assert!(
        node03.len() == 2
            && node03[0].ends_with("node03 rc=0 stderr=")
            && node03[1].ends_with(&format!("node03 rc=6 stderr={already}")),
        "{way}: added, then already there: {out}"
    );
}

/// Writes the executable script `path` (and its directory) from a child process: a script
/// this process wrote and a lab host then ran could fail with "Text file busy", as another
/// test thread's fork, made while the file was open for writing, keeps the descriptor until
/// its own exec.
fn write_script(path: &std::path::Path, body: &str) {
    use std::io::Write;
    std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
    let mut child = Command::new("/bin/sh")
        .args(["-c", "cat >\"$0\" && chmod 755 \"$0\""])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .expect("sh");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(body.as_bytes()).expect("write script");
    drop(stdin);
    assert!(child.wait().expect("wait").success(), "wrote {path:?}");
}

/// The grace period of the releases in the take-back tests, and the most a run may take
/// after the release to end (the bound: Open MPI ends in 3.5 s, MPICH in 0.5 s).
const TAKE_BACK_GRACE_S: u64 = 3;
const RUN_ENDS_WITHIN: Duration = Duration::from_secs(TAKE_BACK_GRACE_S + 5);

/// The one host of `held` that the job runs `pattern` (a pgrep pattern) on, once it does.
fn running_on(env: &LabWithBroker, hosts: &[String], pattern: &str) -> Option<String> {
    let user = env.lab.user().name.clone();
    hosts.iter().find_map(|h| {
        env.lab
            .exec(h, &["pgrep", "-u", &user, "-f", pattern])
            .is_ok_and(|o| o.status.success())
            .then(|| h.clone())
    })
}

/// Releases `host` with [`TAKE_BACK_GRACE_S`], then waits for the driver's `rc_file` (the
/// run's exit status): the run must end within [`RUN_ENDS_WITHIN`] of the release, with a
/// non-zero status, and leave nothing of the job's user on `host`. Returns the status.
fn release_ends_the_run(
    env: &LabWithBroker,
    job: &mut Option<Child>,
    host: &str,
    run: &str,
    rc_file: &str,
) -> i32 {
    let rc_path = env.lab.user().home.join(rc_file);
    let released = Instant::now();
    let out = env
        .broker
        .rb(&["release", host, "--grace-s", &TAKE_BACK_GRACE_S.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rc: i32 = wait_for(
        env,
        job,
        &format!("{run} ended after {host} was taken back"),
        RUN_ENDS_WITHIN,
        || std::fs::read_to_string(&rc_path).ok()?.trim().parse().ok(),
    );
    eprintln!(
        "{run}: ended {:?} after the release, status {rc}",
        released.elapsed()
    );
    assert_ne!(rc, 0, "{run} ended well although {host} was taken back");
    let user = env.lab.user().name.clone();
    wait_for(
        env,
        job,
        &format!("nothing of the job left on {host}"),
        RUN_ENDS_WITHIN,
        || {
            env.lab
                .exec(host, &["pgrep", "-u", &user])
                .is_ok_and(|o| !o.status.success())
                .then_some(())
        },
    );
    rc
}

/// The agent's log lines a user sees by default (WARN) naming `host` as taken back.
fn take_back_lines(agent_log: &str, host: &str) -> Vec<String> {
    agent_log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("taken back") && l.contains(host))
        .map(String::from)
        .collect()
}

/// A host taken back while a LAM run uses it: `lamexec N` and `mpirun.lam N` used to wait
/// for the lost processes for ever (lamshrink removes the node, but its processes' exits
/// are never reported). lam-shrink ends the job's processes on the node first, through
/// LAM, so each run fails at once, and says which host was taken back.
#[test]
fn lam_release_during_lamexec_and_mpirun_ends_the_run_and_names_the_host() {
    if skip_unless_root("lam_release_during_lamexec_and_mpirun_ends_the_run_and_names_the_host") {
        return;
    }
    let env = lab();
    build_program(&env, "mpi_sleep_barrier", "mpicc.lam", "");
    let driver = "echo node02 >~/lam-boot.schema; \\
         lamboot -s ~/lam-boot.schema </dev/null >~/lam-boot.out 2>&1 || exit 3; touch ~/lam-booted; \\
         lamgrow anyLinux </dev/null >~/lam-grow.out 2>&1; \\
         while [ ! -e ~/lamexec.go ]; do sleep 0.1; done; \\
         lamexec N sh -c 'echo running on $(hostname); sleep 120' </dev/null >~/lamexec.out 2>&1; \\
         echo $? >~/lamexec.rc; \\
         while [ ! -e ~/grow2.go ]; do sleep 0.1; done; \\
         lamgrow anyLinux </dev/null >~/lam-grow2.out 2>&1; \\
         while [ ! -e ~/mpirun.go ]; do sleep 0.1; done; \\
         mpirun.lam N ~/mpi_sleep_barrier 120 </dev/null >~/mpirun.out 2>&1; \\
         echo $? >~/mpirun.rc; \\
         while [ ! -e ~/lam-stop ]; do sleep 0.1; done";
    let home = env.lab.user().home.clone();
    let mut job = Some(start_job(&env, "lam", driver));
    let grown_in = |env: &LabWithBroker| {
        lam_nodes(env)
            .into_iter()
            .find(|n| n.starts_with("node03") || n.starts_with("node04"))
            .map(|n| n.split('.').next().unwrap_or_default().to_string())
    };
    let first = wait_for(
        &env,
        &mut job,
        "a granted host in lamnodes",
        Duration::from_secs(30),
        || grown_in(&env),
    );
    // lamexec N: one `sh` per node, sleeping; taken back while it sleeps on `first`.
    std::fs::write(home.join("lamexec.go"), "").expect("go");
    wait_for(
        &env,
        &mut job,
        "lamexec's process on the grown host",
        Duration::from_secs(20),
        || running_on(&env, std::slice::from_ref(&first), "sleep 120"),
    );
    release_ends_the_run(&env, &mut job, &first, "lamexec N", "lamexec.rc");
    let lamexec_out = std::fs::read_to_string(home.join("lamexec.out")).unwrap_or_default();
    // Only now may the driver grow again (`lamgrow anyLinux`), then run mpirun.lam N: a
    // released host is free, so the grow may be granted `first` again, and its new lamd
    // there would be taken for a leftover of the run (CI, session 27: granted 1 s after
    // the release, while the check above still looked for an empty host).
    std::fs::write(home.join("grow2.go"), "").expect("go");
    let second = wait_for(
        &env,
        &mut job,
        "a granted host in lamnodes again",
        Duration::from_secs(30),
        || grown_in(&env),
    );
    std::fs::write(home.join("mpirun.go"), "").expect("go");
    wait_for(
        &env,
        &mut job,
        "an MPI rank on the grown host",
        Duration::from_secs(30),
        || running_on(&env, std::slice::from_ref(&second), "mpi_sleep_barrier"),
    );
    release_ends_the_run(&env, &mut job, &second, "mpirun.lam N", "mpirun.rc");
    let mpirun_out = std::fs::read_to_string(home.join("mpirun.out")).unwrap_or_default();
    assert!(
        !mpirun_out.contains("done"),
        "no rank passed the barrier: {mpirun_out}"
    );
    let notes = job_notes(&env);
    std::fs::write(home.join("lam-stop"), "").expect("stop");
    let out = finish(&env, job.take().expect("job"));
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    for host in [&first, &second] {
        assert!(
            !take_back_lines(&log, host).is_empty()
                && notes.contains(&format!("{host} taken back")),
            "a message a user sees names {host} as taken back:\nrb jobs notes: {notes}\n\
             lamexec: {lamexec_out}\nmpirun: {mpirun_out}\nagent log:\n{log}"
        );
    }
    assert_nothing_left(&env, "lamd", &out);
}

/// `lamgrow anyLinux-1; lamgrow anyLinux-2` back to back: each asks for its own machine,
/// and both end up in the universe. The second used to be refused by LAM ("already
/// running on n0": the module's add of the first grant counted as a lamgrow) before it
/// looked its name up, so it never asked.
#[test]
fn lam_back_to_back_lamgrows_of_two_instances_grow_onto_two_hosts() {
    if skip_unless_root("lam_back_to_back_lamgrows_of_two_instances_grow_onto_two_hosts") {
        return;
    }
    let env = lab();
    let driver = "echo node02 >~/lam-boot.schema; \\
         lamboot -s ~/lam-boot.schema </dev/null >~/lam-boot.out 2>&1 || exit 3; touch ~/lam-booted; \\
         lamgrow anyLinux-1 </dev/null >~/lam-grow.out 2>&1; \\
         lamgrow anyLinux-2 </dev/null >~/lam-grow2.out 2>&1; \\
         while [ ! -e ~/lam-stop ]; do sleep 0.1; done";
    let mut job = Some(start_job(&env, "lam", driver));
    let mut both = wait_for(
        &env,
        &mut job,
        "node03 and node04 in lamnodes",
        Duration::from_secs(40),
        || {
            let mut grown: Vec<String> = lam_nodes(&env)
                .into_iter()
                .filter(|n| n.starts_with("node03") || n.starts_with("node04"))
                .collect();
            grown.sort();
            (grown.len() == 2).then_some(grown)
        },
    );
    both.dedup();
    assert_eq!(both.len(), 2, "two distinct hosts: {both:?}");
    let grow2 =
        std::fs::read_to_string(env.lab.user().home.join("lam-grow2.out")).unwrap_or_default();
    assert!(
        !grow2.contains("already running"),
        "the second lamgrow was not refused: {grow2}"
    );
    // Phase 1's output: LAM's own failure report, whose first lines (the remote shell's
    // stderr, i.e. the shim's refusal) say what happens and that the failure is expected.
    let first_lines: Vec<&str> = grow2.lines().take(2).collect();
    assert_eq!(
        first_lines,
        [
            "ERROR: LAM/MPI unexpectedly received the following on stderr:",
            "rsh: anyLinux-2: request recorded; the lam module adds the host granted for it \
             in a moment (the failure reported for this name is expected)"
        ],
        "{grow2}"
    );
    std::fs::write(env.lab.user().home.join("lam-stop"), "").expect("stop");
    let out = finish(&env, job.take().expect("job"));
    assert_nothing_left(&env, "lamd", &out);
}

/// What a shrink does to a running PVM program (modules/CONTRACT.md): pvm-shrink deletes
/// the host, PVM stops the tasks there, and a master that asked for `PvmTaskExit`
/// notifications hears of it at once, so its run ends instead of waiting for the lost
/// task.
#[test]
fn pvm_release_during_a_run_stops_the_hosts_tasks_and_notifies_the_master() {
    if skip_unless_root("pvm_release_during_a_run_stops_the_hosts_tasks_and_notifies_the_master") {
        return;
    }
    let env = lab();
    let program = build_program(&env, "pvm_lost_task", "gcc", "-lpvm3");
    let driver = format!(
        "{PVM_ENV} echo quit | pvm >/dev/null 2>&1; \
         echo 'add anyLinux' | pvm >~/pvm-add.out 2>&1; touch ~/pvm-ready; \
         while [ ! -s ~/pvm-run ]; do sleep 0.1; done; \
         {} $(cat ~/pvm-run) >~/pvm-run.out 2>&1; echo $? >~/pvm-run.rc; \
         while [ ! -e ~/pvm-stop ]; do sleep 0.1; done",
        program.display()
    );
    let home = env.lab.user().home.clone();
    let mut job = Some(start_job(&env, "pvm", &driver));
    wait_for(
        &env,
        &mut job,
        "the job's PVM master started",
        Duration::from_secs(20),
        || home.join("pvm-ready").exists().then_some(()),
    );
    let grown = wait_for(
        &env,
        &mut job,
        "a granted host in PVM's conf",
        Duration::from_secs(30),
        || pvm_hosts_in_conf(&env).pop(),
    );
    std::fs::write(home.join("pvm-run"), &grown).expect("run");
    wait_for(
        &env,
        &mut job,
        "the worker task on the grown host",
        Duration::from_secs(20),
        || running_on(&env, std::slice::from_ref(&grown), "pvm_lost_task"),
    );
    let rc = release_ends_the_run(&env, &mut job, &grown, "pvm_lost_task", "pvm-run.rc");
    let run = std::fs::read_to_string(home.join("pvm-run.out")).unwrap_or_default();
    assert!(
        rc == 2 && run.contains(&format!("on {grown} is gone")),
        "the master heard of its lost task: status {rc}: {run}"
    );
    std::fs::write(home.join("pvm-stop"), "").expect("stop");
    let out = finish(&env, job.take().expect("job"));
    assert_nothing_left(&env, "pvmd3?", &out);
}
