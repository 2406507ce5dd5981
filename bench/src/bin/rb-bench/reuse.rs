//! Connection reuse over ssh: calls to a host the job holds (an instance name,
//! `anyLinux-1`) are sessions of the host's one ssh master connection (the shim's
//! `ControlMaster`), against plain `ssh node03 true`, which pays a handshake every time.
//! Run in the agent section's ssh setting (front end node02, node03 the managed host).

use bench::stats::{summarize, Summary};
use tests::{bin, labtier::LabWithBroker};

use crate::agent::{FRONT_END, TARGET};

/// One figure of the section.
pub struct Reuse {
    /// The held host's first call (starts the master: one handshake).
    first: Summary,
    /// Later calls to the held host.
    held: Summary,
    /// Plain `ssh node03 true`, interleaved with `held`.
    plain: Summary,
    failures: usize,
}

/// Times, in one job on the front end, the held host's first call, then `reps` calls to it
/// interleaved run by run with `reps` plain `ssh node03 true` (the real ssh, by path).
pub fn measure(env: &LabWithBroker, reps: usize, real_ssh: &str) -> anyhow::Result<Reuse> {
    let timeit = bin("rb-timeit").display().to_string();
    let script = format!(
        "{timeit} 1 ssh anyLinux-1 true; \
         exec {timeit} {reps} {real_ssh} {TARGET} true --then ssh anyLinux-1 true"
    );
    let out = env
        .agent_as_user(FRONT_END, &[], &["sh", "-c", &script])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (mut first, mut plain, mut held, mut failures) = (vec![], vec![], vec![], 0);
    for line in text.lines() {
        let (slot, figure) = match line.split_once(' ') {
            Some(("0", f)) => (&mut plain, f),
            Some(("1", f)) => (&mut held, f),
            Some(_) => continue,
            None => (&mut first, line),
        };
        match figure.parse::<f64>() {
            Ok(ms) => slot.push(ms),
            Err(_) => failures += 1,
        }
    }
    let summary = |v: &[f64], what: &str| {
        summarize(v).ok_or_else(|| {
            anyhow::anyhow!(
                "{what}: no successful run\nstdout:\n{text}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    Ok(Reuse {
        first: summary(&first, "the held host's first call")?,
        held: summary(&held, "ssh anyLinux-1 true")?,
        plain: summary(&plain, "ssh node03 true")?,
        failures,
    })
}

/// Prints the section.
pub fn print(r: &Reuse) {
    println!("### Connection reuse (ssh)\n");
    println!("Jobs over ssh: each host the job holds gets one ssh master connection (OpenSSH `ControlMaster`, socket in the job's private directory), started by the host's first call; later calls to the held host are sessions of that connection, without a handshake. One job on node02 holds node03 as `anyLinux-1`; after the first call, the calls to it run interleaved run by run with plain `ssh {TARGET} true` (the real ssh, a handshake each). Goal: the held host's calls cost ≤ 0.2× the plain ones.{}\n", match r.failures { 0 => String::new(), f => format!(" {f} runs failed.") });
    println!("| command | ours: median (min–max) | runs |");
    println!("|---|---|---:|");
    let show = crate::agent::show;
    println!(
        "| `ssh {TARGET} true` (real ssh, baseline) | {} | {} |",
        show(&r.plain),
        r.plain.n
    );
    println!(
        "| `ssh anyLinux-1 true`, held host, later calls (job over ssh, shared connection) | {} | {} |",
        show(&r.held),
        r.held.n
    );
    println!(
        "| `ssh anyLinux-1 true`, the host's first call (grant + master's handshake) | {} | {} |",
        show(&r.first),
        r.first.n
    );
    println!(
        "\nRatio of the medians, held host over plain ssh: {:.2}× (goal ≤ 0.2×).\n",
        r.held.median / r.plain.median
    );
}
