//! `rb report TRACE_DIR --svg FILE`: the lab's utilization chart from the broker's decision
//! trace. The trace is replayed ([`usage_report::replay_dir`], as `rb policy replay` does)
//! keeping each host's states, cut into buckets and drawn ([`usage_report::render`]); the
//! file is written here.
//!
//! Which policy: `--policy FILE`, else the shipped policy whose sha256 the trace's newest
//! file records (a replay under another policy would draw another run). A trace recorded
//! under a policy file of the lab's own needs `--policy`: the trace keeps its hash only.
//!
//! Exit codes: 0 the chart was written; 64 a bad trace line or policy file, or no policy
//! known (`help:` says which flag); 66 no such directory, no trace files in it, a trace
//! file unreadable, or `--policy FILE` unreadable; 73 FILE cannot be written (77:
//! permission denied on it).

use std::{
    fs,
    io::ErrorKind,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
};

use allocation::{
    usage_series::{series, SeriesOptions},
    Replay,
};
use policies::Policy;
use usage_report::{recorded_policy, replay_files, trace_files, Chart};

use crate::cli::{EXIT_CANT_CREATE, EXIT_NO_INPUT, EXIT_PERMISSION, EXIT_USAGE};

/// What `rb report` was asked.
#[derive(Debug, Clone)]
pub struct ReportArgs<'a> {
    pub trace_dir: &'a Path,
    pub svg: &'a Path,
    pub policy: Option<&'a Path>,
    pub buckets: usize,
    pub max_hosts: usize,
    pub title: Option<&'a str>,
    pub utc_offset_s: i64,
}

/// A failure, with its exit code and what to say (nothing when empty: standard output's
/// reader went away).
struct Failure(u8, String);

/// `rb report`: writes the chart; the exit code.
pub fn run(args: &ReportArgs) -> ExitCode {
    match report(args) {
        Ok(summary) => {
            eprintln!("{summary}");
            ExitCode::SUCCESS
        }
        Err(Failure(code, message)) => {
            if !message.is_empty() {
                eprintln!("error: {message}");
            }
            ExitCode::from(code)
        }
    }
}

fn report(args: &ReportArgs) -> Result<String, Failure> {
    let trace_error = |e: usage_report::TraceError| {
        let code = if e.is_missing() {
            EXIT_NO_INPUT
        } else {
            EXIT_USAGE
        };
        Failure(code, e.to_string())
    };
    check_output(args.svg)?;
    let files = trace_files(args.trace_dir).map_err(trace_error)?;
    let policy = choose_policy(args.policy, &files)?;
    let mut replay = Replay::new(Arc::new(policy));
    replay.keep_timeline();
    let outcome = replay_files(&files, replay).map_err(trace_error)?;
    let opts = SeriesOptions {
        buckets: args.buckets,
        max_host_rows: args.max_hosts,
        ..SeriesOptions::default()
    };
    let s = series(&outcome.timeline, &opts);
    let default_title = format!("Lab utilization: {}", args.trace_dir.display());
    let doc = usage_report::render(&Chart {
        title: args.title.unwrap_or(&default_title),
        series: &s,
        utc_offset_s: args.utc_offset_s,
    });
    write_svg(args.svg, &doc)?;
    Ok(format!(
        "wrote {} ({} hosts, {:.1} host-hours, {:.2} % lent)",
        args.svg.display(),
        s.hosts.len() + s.hosts_left_out,
        outcome.usage.host_s / 3600.0,
        if outcome.usage.host_s > 0.0 {
            100.0 * outcome.usage.held_host_s / outcome.usage.host_s
        } else {
            0.0
        }
    ))
}

/// `--policy FILE`, else the shipped policy the trace names.
fn choose_policy(given: Option<&Path>, files: &[PathBuf]) -> Result<Policy, Failure> {
    if let Some(path) = given {
        return Policy::load(path).map_err(|e| {
            let code = u8::try_from(e.exit_code()).unwrap_or(EXIT_USAGE);
            Failure(code, e.to_string())
        });
    }
    let Some(recorded) = recorded_policy(files) else {
        // The newest file does not open with a readable `start` record: the replay says
        // where the trace is wrong.
        return Ok(Policy::shipped("paper").expect("the paper policy is shipped"));
    };
    usage_report::shipped_with_sha(&recorded)
        .ok_or_else(|| {
            let which = &recorded;
            Failure(
                EXIT_USAGE,
                format!(
                    "the trace was recorded under a policy that is not a shipped one (sha256 {which})\n\
                     help: give the lab's policy file with --policy FILE (the lab file's [broker] policy)"
                ),
            )
        })
}

/// Refuses at once (before a long replay) an output path that cannot be a file: a
/// directory, or a file in a directory that does not exist.
fn check_output(path: &Path) -> Result<(), Failure> {
    if path == Path::new("-") {
        return Ok(());
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let why = if path.is_dir() {
        "it is a directory"
    } else if !parent.is_dir() {
        "its directory does not exist"
    } else {
        return Ok(());
    };
    Err(Failure(
        EXIT_CANT_CREATE,
        format!(
            "cannot write {}: {why}\nhelp: name a file in a directory you can write (or `-` for standard output)",
            path.display()
        ),
    ))
}

/// Writes `doc` to `path` (`-`: standard output), through a temporary file renamed into
/// place so a reader never sees half a chart.
fn write_svg(path: &Path, doc: &str) -> Result<(), Failure> {
    let fail = |e: std::io::Error| {
        let code = if e.kind() == ErrorKind::PermissionDenied {
            EXIT_PERMISSION
        } else {
            EXIT_CANT_CREATE
        };
        Failure(
            code,
            format!(
                "cannot write {}: {e}\nhelp: name a file in a directory you can write (or `-` for standard output)",
                path.display()
            ),
        )
    };
    if path == Path::new("-") {
        return startup::output::print(doc).map_err(|e| match e {
            startup::OutputError::ReaderGone => Failure(startup::EXIT_READER_GONE, String::new()),
            startup::OutputError::Failed(e) => fail(e),
        });
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, doc).map_err(fail)?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        fail(e)
    })
}
