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
    assert!(held.is_some(), "{what}: still held: {:?}", env.broker.held_hosts());
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
        assert!(names.contains(&host), "{shell:?}: `{host}` is not a lab host");
        assert_nothing_left(&env, &format!("{shell:?}: {script}"));
        // A real host: the real ssh, the arguments unchanged, and RB_VERBOSE says so.
        let out = job(&env, "RB_VERBOSE=1 ssh -o BatchMode=yes node03 hostname");
        assert_eq!(ok(&env, "ssh node03", &out).trim(), "node03");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("ssh: node03: pass-through to /usr/bin/ssh"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_nothing_left(&env, &format!("{shell:?}: ssh node03"));
    }
}
