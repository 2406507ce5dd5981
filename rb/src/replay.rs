//! `rb policy replay TRACE_DIR --policy FILE`: the broker's decision trace played again
//! under another policy ([`allocation::Replay`]), printing each decision that would have
//! differed and the summary lines. Printing is here; reading the files is `usage_report`'s
//! (shared with `rb report`), the replay itself the allocation crate's (pure).
//!
//! Exit codes: 0 after a replay (whether or not decisions differ); 64 for a bad policy file
//! (its `FILE:LINE:COL` error; the policy engine's own codes otherwise: 66 unreadable) and for
//! a bad trace (a missing or empty directory, or `FILE:LINE` of a line that is not a trace
//! record).

use std::{path::Path, process::ExitCode, sync::Arc};

use allocation::{Difference, HostUse, Outcome, Replay, Usage};
pub use usage_report::TraceError;

use crate::{cli::EXIT_USAGE, table};

/// `rb policy replay`: prints the differences and the summary; the exit code.
pub fn run(dir: &Path, policy_file: &Path, utc_offset_s: i64) -> ExitCode {
    let policy = match policies::Policy::load(policy_file) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1));
        }
    };
    match replay_dir(dir, policy) {
        Ok(outcome) => {
            if let Err(e) = startup::output::print(render(&outcome, policy_file, utc_offset_s)) {
                return e.exit("rb");
            }
            if outcome.skipped > 0 {
                eprintln!(
                    "note: {} recorded give-back(s) named a host the replayed job did not hold; skipped",
                    outcome.skipped
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Replays every trace file in `dir` under `policy`, oldest file first.
pub fn replay_dir(dir: &Path, policy: Arc<policies::Policy>) -> Result<Outcome, TraceError> {
    usage_report::replay_dir(dir, Replay::new(policy))
}

/// One line per difference, the replayed run's host usage and host states, then `N decisions, M would
/// differ under FILE`.
pub fn render(outcome: &Outcome, policy_file: &Path, utc_offset_s: i64) -> String {
    let mut out = String::new();
    for d in &outcome.differences {
        out.push_str(&render_difference(d, utc_offset_s));
    }
    out.push_str(&render_usage(&outcome.usage));
    out.push_str(&render_states(&outcome.usage));
    out.push_str(&format!(
        "{} decisions, {} would differ under {}\n",
        outcome.decisions,
        outcome.differences.len(),
        policy_file.display()
    ));
    out
}

/// `usage: H host-s, U held (P %); requests waited W s; hosts free meanwhile I host-s (idle
/// P %)`: the
/// paper's utilization, under the replayed policy (the same as recorded when it is the one
/// in force).
fn render_usage(u: &Usage) -> String {
    format!(
        "usage: {:.1} host-s, {:.1} held ({:.2} %); requests waited {:.1} s; hosts free meanwhile {:.1} host-s (idle {:.3} %)\n",
        u.host_s,
        u.held_host_s,
        if u.host_s > 0.0 { 100.0 * u.held_host_s / u.host_s } else { 0.0 },
        u.wanted_s,
        u.idle_while_wanted_host_s,
        100.0 * u.idle_fraction()
    )
}

/// `host states: lent L host-s, free F, owner O, drained D, down W`: where the host-seconds
/// went (what `rb report` draws).
fn render_states(u: &Usage) -> String {
    let parts: Vec<String> = HostUse::ALL
        .iter()
        .map(|s| format!("{} {:.1}", s.name(), u.by_use.get(*s)))
        .collect();
    format!("host states: {} host-s\n", parts.join(", "))
}

fn render_difference(d: &Difference, utc_offset_s: i64) -> String {
    let at = table::clock(d.unix_ms.div_euclid(1000), utc_offset_s);
    let host = d.host.as_deref().unwrap_or("-");
    let req = d.req.map_or(String::new(), |r| format!(" req {r}"));
    format!(
        "{at}  host {host}  job {}{req}  recorded: {}  replayed: {}\n",
        d.job, d.recorded, d.replayed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_names_the_policy_file() {
        let outcome = Outcome {
            decisions: 4,
            differences: vec![Difference {
                unix_ms: 3_600_000,
                host: Some("node03".into()),
                job: 2,
                req: Some(5),
                recorded: "grant node03".into(),
                replayed: "waits (1 matching host(s): 1 held by jobs)".into(),
            }],
            skipped: 0,
            usage: Usage {
                host_s: 400.0,
                held_host_s: 300.0,
                idle_while_wanted_host_s: 2.0,
                wanted_s: 5.0,
                by_use: allocation::ByUse([300.0, 50.0, 25.0, 0.0, 25.0]),
            },
            timeline: Default::default(),
        };
        let text = render(&outcome, Path::new("refuse.toml"), 0);
        assert_eq!(
            text,
            "01-01 01:00:00  host node03  job 2 req 5  recorded: grant node03  replayed: waits (1 matching host(s): 1 held by jobs)\n\
             usage: 400.0 host-s, 300.0 held (75.00 %); requests waited 5.0 s; hosts free meanwhile 2.0 host-s (idle 0.500 %)\n\
             host states: lent 300.0, free 50.0, owner 25.0, drained 0.0, down 25.0 host-s\n\
             4 decisions, 1 would differ under refuse.toml\n"
        );
    }
}
