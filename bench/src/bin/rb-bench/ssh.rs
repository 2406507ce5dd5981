//! The job's drop-in `ssh` (rsh-shim invoked as `ssh`): what a call costs through it beside
//! plain ssh, measured in one job over the ssh job shell, interleaved run by run with its
//! baselines (the setting of the agent layer's Table 1: node02 issues, node03 runs).
//!
//! Rows: `/usr/bin/ssh node03 true` (baseline); `ssh node03 true` in the job (PATH finds the
//! job's `ssh`: pass-through, with its `named` notice to the agent); the exec floor (a static
//! program that only execs ssh); `ssh anyLinux true` on a free host (allocation, the real
//! ssh to the granted host, the subagent, the host given back).

use crate::agent::{
    print_rows, real_program, row, start_broker, time_interleaved, NULL_REPS_FACTOR, OUTSIDE_JOB,
    TARGET,
};

pub fn run(reps: usize) -> anyhow::Result<()> {
    let runs = reps * NULL_REPS_FACTOR;
    println!("## ssh drop-in (issue 27)\n");
    println!("Real hosts as in the agent layer's Table 1 (network namespaces, sshd, the lab user on node02, node03 the only host the broker manages), the jobs' remote shell ssh (`job_shell = [\"ssh\"]`). One job under `agent` runs the four ways interleaved run by run (`rb-timeit`, rotating which goes first): the real ssh by full path (baseline), `ssh` as typed in the job (PATH finds the job's drop-in, which passes a real host through with its arguments unchanged after one `named` line to the agent), the exec floor (the smallest static program that only execs ssh), and `ssh anyLinux true` on a free host. Medians of {runs} runs (min–max).\n");
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
    let owned = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let ways = vec![
        owned(&[real.as_str(), TARGET, "true"]),
        owned(&["ssh", TARGET, "true"]),
        owned(&[&OUTSIDE_JOB[..], &[floor.as_str(), real.as_str(), TARGET, "true"]].concat()),
        owned(&["ssh", "anyLinux", "true"]),
    ];
    let labels = [
        format!("`{real} {TARGET} true` (real ssh, baseline)"),
        format!("`ssh {TARGET} true` (the job's ssh → real ssh)"),
        format!("`exec_floor ssh {TARGET} true`"),
        "`ssh anyLinux true` (free host, job over ssh)".to_string(),
    ];
    let times = time_interleaved(&env, runs, &ways)?;
    let rows: Vec<_> = labels
        .into_iter()
        .zip(times)
        .map(|(label, times)| row(label, "-", times))
        .collect();
    print_rows(&rows);
    let [real_ms, shim, floor_ms, any] = [0, 1, 2, 3].map(|k| rows[k].ms.median);
    println!(
        "The job's ssh passing a real host through costs {:+.1} ms over the real ssh (target ≤ +1 ms; the exec floor alone {:+.1} ms); `ssh anyLinux true` on a free host {:+.1} ms over `ssh {TARGET} true`.\n",
        shim - real_ms,
        floor_ms - real_ms,
        any - real_ms
    );
    let tests::labtier::LabWithBroker { broker, lab } = env;
    drop(broker);
    lab.down().map_err(|e| anyhow::anyhow!("lab down: {e}"))?;
    Ok(())
}
