//! Tier 3 for the drop-in `ssh` of a job (rsh-shim invoked as `ssh`, `scp`, `sftp`): tools
//! that call ssh as typed, inside `agent …` run by the lab user on node02, a host the broker
//! manages (it may be granted to the job itself), broker on the ssh transport, every host
//! with sshd and in.rshd. Each test starts its own lab (they run concurrently) with the
//! jobs' remote shell ssh (`job_shell = ["ssh"]`, the lab user's own keys) or netkit rsh
//! (`job_shell = ["rsh"]`). After each call: no host held, no process of the job left on any
//! host. Root only; each test prints why it is skipped otherwise.

use std::process::{Output, Stdio};
use std::time::Duration;

use tests::{
    labtier::{skip_unless_root, LabOptions, LabWithBroker, FRONT_END, TEST_TIMING},
    wait_until,
};

/// The jobs' remote shell of a lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobShell {
    Ssh,
    Rsh,
}

/// `hosts` lab hosts, all managed (node02, the front end, too), sshd and in.rshd on each.
fn lab(hosts: usize, shell: JobShell) -> LabWithBroker {
    let mut opts = LabOptions::new(&[], TEST_TIMING);
    opts.rsh = true;
    opts.job_shell = Some(vec![match shell {
        JobShell::Ssh => "ssh".into(),
        JobShell::Rsh => "rsh".into(),
    }]);
    LabWithBroker::start_opts(hosts, &opts)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `agent -- sh -c SCRIPT` as the lab user on the front end, to completion; the script runs
/// under `timeout 90` (a launcher that waits for ever must fail the test, not hang it).
fn job(env: &LabWithBroker, script: &str) -> Output {
    let script = format!("timeout 90 sh -c '{}'", script.replace('\'', r"'\''"));
    env.agent_as_user(FRONT_END, &[], &["sh", "-c", &script])
        .output()
        .expect("agent")
}

/// Asserts the job exited 0 and returns its stdout.
fn ok(env: &LabWithBroker, what: &str, out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}\nstdout:\n{}\nstderr:\n{}\nbroker log:\n{}",
        stdout(out),
        String::from_utf8_lossy(&out.stderr),
        env.broker.log()
    );
    stdout(out)
}

/// After a job: no host held, and none of the lab user's processes on any host but the
/// lab's own (sshd sessions of root, the user's nothing).
fn assert_nothing_left(env: &LabWithBroker, what: &str) {
    let held = wait_until(Duration::from_secs(20), || {
        env.broker.held_hosts().is_empty().then_some(())
    });
    assert!(
        held.is_some(),
        "{what}: still held: {:?}",
        env.broker.held_hosts()
    );
    let left = wait_until(Duration::from_secs(20), || {
        let l = env.user_processes(".");
        l.is_empty().then_some(())
    });
    assert!(
        left.is_some(),
        "{what}: the job's processes are left: {:?}",
        env.user_processes(".")
    );
}

fn lab_hosts(env: &LabWithBroker) -> Vec<String> {
    env.lab.hosts().iter().map(|h| h.name.clone()).collect()
}

#[test]
fn ssh_any_linux_runs_a_command_on_a_granted_host_over_either_job_shell() {
    if skip_unless_root("ssh_any_linux_runs_a_command_on_a_granted_host_over_either_job_shell") {
        return;
    }
    for shell in [JobShell::Ssh, JobShell::Rsh] {
        let env = lab(3, shell);
        let names = lab_hosts(&env);
        let script = "ssh anyLinux hostname; ssh -n -o BatchMode=yes -x anyLinux-1 exit 7";
        let out = job(&env, script);
        // netkit rsh loses the remote status (it exits 0), as `rsh anyLinux` does.
        let status = match shell {
            JobShell::Ssh => 7,
            JobShell::Rsh => 0,
        };
        assert_eq!(
            out.status.code(),
            Some(status),
            "{shell:?}: {}\n{}",
            stdout(&out),
            String::from_utf8_lossy(&out.stderr)
        );
        let host = stdout(&out).trim().to_string();
        assert!(
            names.contains(&host),
            "{shell:?}: `{host}` is not a lab host"
        );
        assert_nothing_left(&env, &format!("{shell:?}: {script}"));
        // A real host: the real ssh, the arguments unchanged, and RB_VERBOSE says so.
        let out = job(&env, "RB_VERBOSE=1 ssh -o BatchMode=yes node03 hostname");
        assert_eq!(ok(&env, "ssh node03", &out).trim(), "node03");
        assert!(
            String::from_utf8_lossy(&out.stderr)
                .contains("ssh: node03: pass-through to /usr/bin/ssh"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_nothing_left(&env, &format!("{shell:?}: ssh node03"));
        // `rb jobs` keeps what each call used.
        let jobs = env.broker.rb(&["jobs", "--json"]);
        let jobs = String::from_utf8_lossy(&jobs.stdout);
        let over = match shell {
            JobShell::Ssh => "over ssh",
            JobShell::Rsh => "over rsh",
        };
        for want in [
            "ssh: anyLinux: granted ",
            over,
            "ssh: node03: pass-through to /usr/bin/ssh",
        ] {
            assert!(
                jobs.contains(want),
                "{shell:?}: `{want}` not in rb jobs:\n{jobs}"
            );
        }
    }
}

/// The shim's own `RB_VERBOSE` lines starting with `prefix` (the agent logs them too).
fn granted_lines(stderr: &str, prefix: &str) -> usize {
    stderr.lines().filter(|l| l.starts_with(prefix)).count()
}

/// A private directory under /tmp (shared by the lab's hosts) for a test's files.
const WORKDIR: &str = "t=$(mktemp -d /tmp/ssh_lab.XXXXXX) && cd $t && trap \"rm -rf $t\" EXIT";

#[test]
fn scp_in_both_modes_and_sftp_reach_granted_hosts() {
    if skip_unless_root("scp_in_both_modes_and_sftp_reach_granted_hosts") {
        return;
    }
    let env = lab(3, JobShell::Ssh);
    let script = format!(
        "{WORKDIR} && echo hello > f1 && export RB_VERBOSE=1 && \
         scp f1 anyLinux-1:$t/f2 && scp -O anyLinux-1:$t/f2 f3 && \
         printf \"put f1 $t/f4\\nget $t/f4 f5\\n\" | sftp -q -b - anyLinux-1 >/dev/null && \
         cat f2 f3 f5"
    );
    let out = job(&env, &script);
    assert_eq!(ok(&env, &script, &out), "hello\nhello\nhello\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let granted = granted_lines(&stderr, "ssh: anyLinux-1: granted");
    assert_eq!(
        granted, 3,
        "scp, scp -O and sftp each through the job's ssh:\n{stderr}"
    );
    assert_nothing_left(&env, "scp, sftp");
}

#[test]
fn rsync_with_its_default_transport_reaches_a_granted_host() {
    if skip_unless_root("rsync_with_its_default_transport_reaches_a_granted_host") {
        return;
    }
    for shell in [JobShell::Ssh, JobShell::Rsh] {
        let env = lab(3, shell);
        let script = format!(
            "{WORKDIR} && echo data > a && export RB_VERBOSE=1 && \
             rsync -a a anyLinux-1:$t/b && rsync -a anyLinux-1:$t/b c && cat c"
        );
        let out = job(&env, &script);
        assert_eq!(ok(&env, &script, &out), "data\n", "{shell:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            granted_lines(&stderr, "ssh: anyLinux-1: granted"),
            2,
            "{stderr}"
        );
        assert_nothing_left(&env, &format!("{shell:?}: rsync"));
    }
}

#[test]
fn gnu_parallel_with_its_default_ssh_transfers_returns_and_cleans_up_on_two_instances() {
    if skip_unless_root(
        "gnu_parallel_with_its_default_ssh_transfers_returns_and_cleans_up_on_two_instances",
    ) {
        return;
    }
    let env = lab(4, JobShell::Ssh);
    let names = lab_hosts(&env);
    let script = format!(
        "{WORKDIR} && echo one > a && echo two > b && \
         parallel -S anyLinux-1,anyLinux-2 --wd ... --transferfile {{}} --return {{}}.out \
         --cleanup \"cat {{}} > {{}}.out; hostname >> {{}}.out\" ::: a b && cat a.out b.out"
    );
    let out = job(&env, &script);
    let text = ok(&env, &script, &out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert_eq!((lines[0], lines[2]), ("one", "two"), "{text}");
    for host in [lines[1], lines[3]] {
        assert!(
            names.iter().any(|n| n == host),
            "`{host}` is not a lab host: {text}"
        );
    }
    assert_nothing_left(&env, "parallel");
}

#[test]
fn pdsh_over_ssh_runs_on_three_instances() {
    if skip_unless_root("pdsh_over_ssh_runs_on_three_instances") {
        return;
    }
    let env = lab(4, JobShell::Ssh);
    let script = "pdsh -R ssh -w anyLinux-[1-3] hostname";
    let out = job(&env, script);
    let text = ok(&env, script, &out);
    let mut hosts: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(_, h)| h))
        .collect();
    hosts.sort();
    hosts.dedup();
    assert_eq!(hosts.len(), 3, "three distinct granted hosts: {text}");
    assert_nothing_left(&env, script);
}

/// MPICH (Hydra) with named, mixed and symbolic host lists, its default launcher and
/// `-launcher ssh`: HYDRA_LAUNCHER_EXEC is the job's shim, Hydra passes ssh's `-x`, and over
/// netkit rsh that used to fail (`invalid option -- 'x'`) and hang mpiexec for ever.
fn mpich_host_lists(shell: JobShell) {
    let env = lab(4, shell);
    let names = lab_hosts(&env);
    for launcher in ["", "-launcher ssh "] {
        for (hosts, want) in [
            ("node03,node04", Some(["node03", "node04"])),
            ("node03,anyLinux", None),
        ] {
            let script = format!("mpiexec.mpich {launcher}-hosts {hosts} -n 2 hostname");
            let out = job(&env, &script);
            let text = ok(&env, &format!("{shell:?}: {script}"), &out);
            let mut got: Vec<&str> = text.lines().collect();
            got.sort();
            match want {
                Some(want) => assert_eq!(got, want, "{shell:?}: {script}"),
                None => {
                    assert_eq!(got.len(), 2, "{text}");
                    assert!(got.contains(&"node03"), "{shell:?}: {script}: {text}");
                    assert!(got.iter().all(|h| names.iter().any(|n| n == h)), "{text}");
                }
            }
            assert_nothing_left(&env, &format!("{shell:?}: {script}"));
        }
    }
}

#[test]
fn mpich_named_and_mixed_host_lists_over_the_ssh_job_shell() {
    if skip_unless_root("mpich_named_and_mixed_host_lists_over_the_ssh_job_shell") {
        return;
    }
    mpich_host_lists(JobShell::Ssh);
}

#[test]
fn mpich_named_and_mixed_host_lists_over_the_rsh_job_shell() {
    if skip_unless_root("mpich_named_and_mixed_host_lists_over_the_rsh_job_shell") {
        return;
    }
    mpich_host_lists(JobShell::Rsh);
}

#[test]
fn open_mpi_mpirun_with_two_instances_and_no_variable_set_by_hand() {
    if skip_unless_root("open_mpi_mpirun_with_two_instances_and_no_variable_set_by_hand") {
        return;
    }
    let env = lab(4, JobShell::Ssh);
    let script = "mpirun.openmpi -np 2 --host anyLinux-1,anyLinux-2 hostname";
    let out = job(&env, script);
    let text = ok(&env, script, &out);
    let mut hosts: Vec<&str> = text.lines().collect();
    hosts.sort();
    hosts.dedup();
    assert_eq!(hosts.len(), 2, "two instances, two hosts: {text}");
    assert_nothing_left(&env, script);
}

/// `rb release` of the host an `ssh anyLinux` command runs on: the command is ended, the
/// call says why in one line and exits 143, over either job shell.
#[test]
fn ssh_any_linux_taken_back_mid_run_says_so_and_exits_143() {
    if skip_unless_root("ssh_any_linux_taken_back_mid_run_says_so_and_exits_143") {
        return;
    }
    for shell in [JobShell::Ssh, JobShell::Rsh] {
        let env = lab(3, shell);
        let child = env
            .agent_as_user(
                FRONT_END,
                &[],
                &["sh", "-c", "ssh anyLinux 'hostname; sleep 60'"],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("agent");
        let held = wait_until(Duration::from_secs(30), || {
            let held = env.broker.held_hosts();
            (held.len() == 1).then_some(held)
        })
        .expect("a host granted");
        let host = held[0].clone();
        let user = env.lab.user().name.clone();
        let running = wait_until(Duration::from_secs(30), || {
            env.lab
                .exec(&host, &["pgrep", "-u", &user, "-x", "sleep"])
                .is_ok_and(|o| o.status.success())
                .then_some(())
        });
        assert!(running.is_some(), "{shell:?}: sleep not running on {host}");
        let out = env.broker.rb(&["release", &host, "--grace-s", "2"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = child.wait_with_output().expect("agent");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(143), "{shell:?}: {stderr}");
        assert!(
            stderr.contains(&format!("ssh: {host} was taken back by the broker")),
            "{shell:?}: {stderr}"
        );
        assert_nothing_left(&env, &format!("{shell:?}: release"));
    }
}

/// `ssh anyLinux` with no command, stdin a terminal (`script` gives it one): a login shell
/// on a granted host with a terminal of its own, under the subagent.
#[test]
fn ssh_any_linux_without_a_command_is_a_login_with_a_terminal() {
    if skip_unless_root("ssh_any_linux_without_a_command_is_a_login_with_a_terminal") {
        return;
    }
    let env = lab(3, JobShell::Ssh);
    let names = lab_hosts(&env);
    let script = "printf \"echo TTY=\\$(tty); echo HOST=\\$(hostname); echo SUB=\\${RB_SUBAGENT_TAG:+yes}; exit\\n\" \
                  | script -qec \"ssh anyLinux\" /dev/null";
    let out = job(&env, script);
    let text = ok(&env, script, &out);
    let field = |key: &str| {
        text.lines()
            .filter_map(|l| {
                l.trim_end_matches('\r')
                    .split_once(key)
                    .map(|(_, v)| v.to_string())
            })
            .find(|v| !v.starts_with('$') && !v.is_empty() && !v.starts_with("\\"))
    };
    let tty = field("TTY=").unwrap_or_default();
    assert!(tty.starts_with("/dev/pts/"), "no terminal: {text}");
    let host = field("HOST=").unwrap_or_default();
    assert!(names.contains(&host), "`{host}` is not a lab host: {text}");
    assert_eq!(
        field("SUB=").as_deref(),
        Some("yes"),
        "not under the subagent: {text}"
    );
    assert_nothing_left(&env, "ssh anyLinux (login)");
}
