//! The job's drop-in `ssh` (rsh-shim invoked as `ssh`): what a call costs through it beside
//! plain ssh, measured in one job over the ssh job shell, interleaved run by run with its
//! baselines (the setting of the agent layer's Table 1: node02 issues, node03 runs).
//!
//! Rows: `/usr/bin/ssh node03 true` (baseline); `ssh node03 true` in the job (PATH finds the
//! job's `ssh`: pass-through, with its `named` notice to the agent); the exec floor (a static
//! program that only execs ssh); `ssh anyLinux true` on a free host (allocation, the real
//! ssh to the granted host, the subagent, the host given back); and the shim's own cost with
//! `/bin/true` standing in for ssh, direct and through the shim.

use crate::agent::{
    print_rows, real_program, row, start_broker, time_interleaved, NULL_REPS_FACTOR, OUTSIDE_JOB,
    TARGET,
};

/// The shim measured in the `/bin/true` rows, when not the one built beside rb-bench (e.g.
/// the static release shim while rb-bench is a debug build).
const SHIM_VAR: &str = "RB_BENCH_SSH_SHIM";

/// The host of the pass-through rows: one the broker never grants (the front end), so
/// it is never in the job's hosts file while `anyLinux` holds node03.
const NAMED: &str = "node02";

pub fn run(reps: usize) -> anyhow::Result<()> {
    let runs = reps * NULL_REPS_FACTOR;
    println!("## ssh drop-in (issue 27)\n");
    println!("Real hosts as in the agent layer's Table 1 (network namespaces, sshd, the lab user on node02, node03 the only host the broker manages), the jobs' remote shell ssh (`job_shell = [\"ssh\"]`). One job under `agent` runs the eight ways interleaved run by run (`rb-timeit`, rotating which goes first): the real ssh by full path to node02 (baseline; a host the broker never grants, so never the job's), `ssh` as typed in the job (PATH finds the job's drop-in, which passes a real host through with its arguments unchanged after one `named` line to the agent), the exec floor (the smallest static program that only execs ssh), `ssh anyLinux true` on a free host (node03) beside the real ssh to node03, and, for the shim's own cost without a network round trip's noise, `/bin/true` standing in for ssh, run directly and through the shim (with the job's variables, so its `named` line to the agent is included), beside the rsh shim passing through to `/bin/true` (`RB_REAL_RSH`). Medians of {runs} runs (min–max).\n");
    let spec = lab::LabSpec {
        hosts: 2,
        rsh: true,
        ..lab::LabSpec::default()
    };
    let lab = lab::Lab::up(&spec).map_err(|e| anyhow::anyhow!("lab up: {e}"))?;
    let env = start_broker(lab, "ssh");
    let real = real_program("ssh")?;
    let floor = env
        .build_program("exec_floor", "gcc -static", "exec_floor", "")
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .display()
        .to_string();
    // The shim's own cost, without a network round trip's noise: the "real ssh" is
    // /bin/true (`~/fake/ssh`), reached directly or through the shim (`~/shim/ssh`, with
    // the job's variables: its `named` line to the agent included).
    let home = env.lab.user().home.clone();
    let (fake, shim_dir) = (home.join("fake"), home.join("shim"));
    for dir in [&fake, &shim_dir] {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
    }
    std::os::unix::fs::symlink("/bin/true", fake.join("ssh"))?;
    let shim = std::env::var_os(SHIM_VAR).map_or_else(|| tests::bin("rsh"), Into::into);
    std::os::unix::fs::symlink(&shim, shim_dir.join("ssh"))?;
    std::os::unix::fs::symlink(&shim, shim_dir.join("rsh"))?;
    let shim_rsh = shim_dir.join("rsh").display().to_string();
    let true_rsh = format!("{}=[\"/bin/true\"]", proto::agent::ENV_REAL_RSH);
    let fake_ssh = fake.join("ssh").display().to_string();
    let shim_ssh = shim_dir.join("ssh").display().to_string();
    let fake_path = format!("PATH={}:/usr/bin:/bin", fake.display());
    let owned = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let ways = vec![
        owned(&[real.as_str(), NAMED, "true"]),
        owned(&["ssh", NAMED, "true"]),
        owned(
            &[
                &OUTSIDE_JOB[..],
                &[floor.as_str(), real.as_str(), NAMED, "true"],
            ]
            .concat(),
        ),
        owned(&[real.as_str(), TARGET, "true"]),
        owned(&["ssh", "anyLinux", "true"]),
        owned(&[fake_ssh.as_str(), NAMED, "true"]),
        owned(&[fake_path.as_str(), shim_ssh.as_str(), NAMED, "true"]),
        owned(&[true_rsh.as_str(), shim_rsh.as_str(), NAMED, "true"]),
    ];
    let labels = [
        format!("`{real} {NAMED} true` (real ssh, baseline)"),
        format!("`ssh {NAMED} true` (the job's ssh → real ssh)"),
        format!("`exec_floor ssh {NAMED} true`"),
        format!("`{real} {TARGET} true` (real ssh, baseline)"),
        "`ssh anyLinux true` (free host, job over ssh)".to_string(),
        format!("`ssh {NAMED} true`, ssh = /bin/true (direct, baseline)"),
        format!("`ssh {NAMED} true`, ssh = /bin/true (through the job's ssh)"),
        format!("`rsh {NAMED} true`, RB_REAL_RSH = /bin/true (through the job's rsh)"),
    ];
    let times = time_interleaved(&env, runs, &ways)?;
    let rows: Vec<_> = labels
        .into_iter()
        .zip(times)
        .map(|(label, times)| row(label, "-", times))
        .collect();
    print_rows(&rows);
    println!("The `/bin/true` rows ran {}.\n", shim.display());
    let [real_ms, shim, floor_ms, real_target, any, bare, bare_shim, bare_rsh] =
        [0, 1, 2, 3, 4, 5, 6, 7].map(|k| rows[k].ms.median);
    println!(
        "The job's ssh passing a real host through costs {:+.1} ms over the real ssh (target ≤ +1 ms; the exec floor alone {:+.1} ms); with /bin/true for ssh, where no network round trip adds its noise, {:+.2} ms (the rsh shim's pass-through in the same runs: {:+.2} ms). `ssh anyLinux true` on a free host (node03) costs {:+.1} ms over `ssh {TARGET} true`.\n",
        shim - real_ms,
        floor_ms - real_ms,
        bare_shim - bare,
        bare_rsh - bare,
        any - real_target
    );
    let tests::labtier::LabWithBroker { broker, lab } = env;
    drop(broker);
    lab.down().map_err(|e| anyhow::anyhow!("lab down: {e}"))?;
    Ok(())
}
