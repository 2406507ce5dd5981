//! Reading a decision-trace directory (`STATE_DIR/trace`, files `trace-NNNNNN.jsonl`) into
//! a [`Replay`]: the files oldest first, each line fed in turn. A trace file opens with the
//! whole state, so any suffix of the files is a trace of its own (the status page reads
//! only the last hours' files).

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    time::SystemTime,
};

use allocation::{
    trace::{file_seq, Body, Line},
    Outcome, Replay,
};

/// Why a trace cannot be read.
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

impl TraceError {
    /// Whether the trace is missing (no directory, no files, unreadable: exit 66) rather
    /// than bad (exit 64).
    pub fn is_missing(&self) -> bool {
        !matches!(self, TraceError::Line { .. })
    }
}

/// Feeds every line of every trace file in `dir` to `replay`, oldest file first.
pub fn replay_dir(dir: &Path, replay: Replay) -> Result<Outcome, TraceError> {
    replay_files(&trace_files(dir)?, replay)
}

/// Feeds every line of `files` (oldest first) to `replay`; notes (a last line cut short)
/// go to standard error.
pub fn replay_files(files: &[PathBuf], replay: Replay) -> Result<Outcome, TraceError> {
    replay_files_noting(files, replay, &mut |note| eprintln!("{note}"))
}

/// [`replay_files`], each note given to `note` (a live trace's last line is often being
/// written: the status page skips it without a word).
pub fn replay_files_noting(
    files: &[PathBuf],
    mut replay: Replay,
    note: &mut dyn FnMut(String),
) -> Result<Outcome, TraceError> {
    for file in files {
        replay_file(&mut replay, file, note)?;
    }
    Ok(replay.finish())
}

/// Feeds the lines of one file. A last line without its newline was cut short (the broker
/// was killed, or the disk filled, while writing it; or it is being written): it is skipped
/// with a note.
fn replay_file(
    replay: &mut Replay,
    file: &Path,
    note: &mut dyn FnMut(String),
) -> Result<(), TraceError> {
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
            note(format!(
                "note: {}:{number}: the last line is incomplete (cut short while being written); skipped",
                file.display()
            ));
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
pub fn trace_files(dir: &Path) -> Result<Vec<PathBuf>, TraceError> {
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

/// The files of `files` (oldest first) that cover the time from `since` on: those last
/// written at or after it, and the one before them (whose state the first of them
/// continues; any file can start a replay, as each opens with the whole state).
pub fn files_since(files: &[PathBuf], since: SystemTime) -> &[PathBuf] {
    let modified = |p: &PathBuf| fs::metadata(p).and_then(|m| m.modified()).ok();
    let first_recent = files
        .iter()
        .position(|f| modified(f).is_none_or(|m| m >= since))
        .map_or(files.len().saturating_sub(1), |i| i.saturating_sub(1));
    &files[first_recent..]
}

/// The sha256 of the policy in force when the newest file of `files` was opened (its
/// `start` record), if it can be read.
pub fn recorded_policy(files: &[PathBuf]) -> Option<String> {
    let file = fs::File::open(files.last()?).ok()?;
    let mut first = String::new();
    BufReader::new(file).read_line(&mut first).ok()?;
    match serde_json::from_str::<Line>(&first).ok()?.body {
        Body::Start(start) => Some(start.state.policy_sha256),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn paper() -> Replay {
        Replay::new(Arc::new(
            policies::Policy::shipped("paper").expect("shipped"),
        ))
    }

    #[test]
    fn a_bad_line_is_named_by_file_and_line() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::write(tmp.path().join("trace-000001.jsonl"), "\n{\"t_us\": oops\n").expect("write");
        // A cut last line alone is skipped: the file has no complete record to refuse.
        let cut = tempfile::tempdir().expect("tempdir");
        fs::write(
            cut.path().join("trace-000001.jsonl"),
            "{\"t_us\": 1, \"unix",
        )
        .expect("write");
        let outcome = replay_dir(cut.path(), paper()).expect("a cut last line is skipped");
        assert_eq!(outcome.decisions, 0);
        let err = replay_dir(tmp.path(), paper()).expect_err("bad line");
        let text = err.to_string();
        assert!(
            text.contains("trace-000001.jsonl:2: not a decision-trace line"),
            "{text}"
        );
        assert!(text.contains("help:"), "{text}");
        assert!(!err.is_missing());
        let empty = tempfile::tempdir().expect("tempdir");
        let err = replay_dir(empty.path(), paper()).expect_err("empty");
        assert!(matches!(err, TraceError::Empty { .. }), "{err}");
        assert!(err.is_missing());
        let err = replay_dir(&empty.path().join("nope"), paper()).expect_err("no dir");
        assert!(matches!(err, TraceError::Dir { .. }), "{err}");
    }

    #[test]
    fn files_since_keeps_the_file_that_covers_the_start() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let names = [
            "trace-000001.jsonl",
            "trace-000002.jsonl",
            "trace-000003.jsonl",
        ];
        for n in names {
            fs::write(tmp.path().join(n), "").expect("write");
        }
        let files = trace_files(tmp.path()).expect("files");
        let long_ago = SystemTime::UNIX_EPOCH;
        assert_eq!(files_since(&files, long_ago).len(), 3);
        let future = SystemTime::now() + std::time::Duration::from_secs(3600);
        assert_eq!(
            files_since(&files, future),
            &files[2..],
            "the newest always"
        );
        let now = SystemTime::now() - std::time::Duration::from_secs(60);
        assert_eq!(files_since(&files, now).len(), 3, "all written since");
    }
}
