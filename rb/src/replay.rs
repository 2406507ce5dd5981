//! `rb policy replay TRACE_DIR --policy FILE`: the broker's decision trace played again
//! under another policy ([`allocation::Replay`]), printing each decision that would have
//! differed and a summary line. Reading the files and printing are here; the replay itself
//! is the allocation crate's (pure).
//!
//! Exit codes: 0 after a replay (whether or not decisions differ); 64 for a bad policy file
//! (its `FILE:LINE:COL` error; the policy engine's own codes otherwise: 66 unreadable) and for
//! a bad trace (a missing or empty directory, or `FILE:LINE` of a line that is not a trace
//! record).

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
};

use allocation::{trace::file_seq, Difference, Outcome, Replay, Usage};

use crate::{cli::EXIT_USAGE, table};

/// Why a trace cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read the trace directory {dir}: {source}\nhelp: give the broker's STATE_DIR/trace (the lab file's [broker] state_dir)")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("no trace files (trace-NNNNNN.jsonl) in {dir}\nhelp: the broker writes them under STATE_DIR/trace unless [broker] trace_files_kept = 0")]
    Empty { dir: PathBuf },
    #[error("cannot read {file}: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}:{line}: {message}\nhelp: trace files are written by rb-broker; this line is not one of its records")]
    Line {
        file: PathBuf,
        line: usize,
        message: String,
    },
}

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
            print!("{}", render(&outcome, policy_file, utc_offset_s));
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

/// Feeds every line of every trace file in `dir`, oldest file first.
pub fn replay_dir(dir: &Path, policy: Arc<policies::Policy>) -> Result<Outcome, TraceError> {
    let files = trace_files(dir)?;
    let mut replay = Replay::new(policy);
    for file in &files {
        replay_file(&mut replay, file)?;
    }
    Ok(replay.finish())
}

/// Feeds the lines of one file. A last line without its newline was cut short (the broker
/// was killed, or the disk filled, while writing it): it is skipped with a note.
fn replay_file(replay: &mut Replay, file: &Path) -> Result<(), TraceError> {
    let read_error = |source| TraceError::Read {
        file: file.to_path_buf(),
        source,
    };
    let mut reader = BufReader::new(fs::File::open(file).map_err(read_error)?);
    let mut line = String::new();
    for number in 1.. {
        line.clear();
        if reader.read_line(&mut line).map_err(read_error)? == 0 {
            break;
        }
        let Some(text) = line.strip_suffix('\n') else {
            eprintln!(
                "note: {}:{number}: the last line is incomplete (cut short while being written); skipped",
                file.display()
            );
            break;
        };
        if text.trim().is_empty() {
            continue;
        }
        replay.feed(text).map_err(|message| TraceError::Line {
            file: file.to_path_buf(),
            line: number,
            message,
        })?;
    }
    Ok(())
}

/// The trace files of `dir`, oldest first.
fn trace_files(dir: &Path) -> Result<Vec<PathBuf>, TraceError> {
    let entries = fs::read_dir(dir).map_err(|source| TraceError::Dir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((file_seq(e.file_name().to_str()?)?, e.path())))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(TraceError::Empty {
            dir: dir.to_path_buf(),
        });
    }
    Ok(files.into_iter().map(|(_, p)| p).collect())
}

/// One line per difference, the replayed run's host usage, then `N decisions, M would
/// differ under FILE`.
pub fn render(outcome: &Outcome, policy_file: &Path, utc_offset_s: i64) -> String {
    let mut out = String::new();
    for d in &outcome.differences {
        out.push_str(&render_difference(d, utc_offset_s));
    }
    out.push_str(&render_usage(&outcome.usage));
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
    fn a_bad_line_is_named_by_file_and_line() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::write(tmp.path().join("trace-000001.jsonl"), "\n{\"t_us\": oops\n").expect("write");
        let policy = Arc::new(policies::Policy::shipped("paper").expect("shipped"));
        // A cut last line alone is skipped: the file has no complete record to refuse.
        let cut = tempfile::tempdir().expect("tempdir");
        fs::write(
            cut.path().join("trace-000001.jsonl"),
            "{\"t_us\": 1, \"unix",
        )
        .expect("write");
        let outcome = replay_dir(cut.path(), policy.clone()).expect("a cut last line is skipped");
        assert_eq!(outcome.decisions, 0);
        let err = replay_dir(tmp.path(), policy.clone()).expect_err("bad line");
        let text = err.to_string();
        assert!(
            text.contains("trace-000001.jsonl:2: not a decision-trace line"),
            "{text}"
        );
        assert!(text.contains("help:"), "{text}");
        let empty = tempfile::tempdir().expect("tempdir");
        let err = replay_dir(empty.path(), policy).expect_err("empty");
        assert!(matches!(err, TraceError::Empty { .. }), "{err}");
    }

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
            },
        };
        let text = render(&outcome, Path::new("refuse.toml"), 0);
        assert_eq!(
            text,
            "01-01 01:00:00  host node03  job 2 req 5  recorded: grant node03  replayed: waits (1 matching host(s): 1 held by jobs)\n\
             usage: 400.0 host-s, 300.0 held (75.00 %); requests waited 5.0 s; hosts free meanwhile 2.0 host-s (idle 0.500 %)\n\
             4 decisions, 1 would differ under refuse.toml\n"
        );
    }
}
