//! Step timestamps for benchmarks: with `RB_STEP_TIMES=FILE` set, the rsh shim, the agent
//! (also around each module program it runs), the subagent and `rb-pvm-add` append one line
//! per step of a remote call or a host's add to FILE,
//! `STEP MONOTONIC_NS pid=PID[ alloc=ALLOC]`, so `rb-bench --only agent --agent-parts steps`
//! can say where a call spends its time without scraping debug logs.
//!
//! The clock is `CLOCK_MONOTONIC`, which every namespace of one machine shares (the lab
//! hosts are namespaces of it), so the lines of processes on different lab hosts compare.
//! FILE is opened once per process (`O_APPEND`: each line is one `write`, whole even when
//! several processes append at once) and kept; a process forked after that shares it.
//!
//! Unset (the normal case), a step costs one check of a `OnceLock` after the first, which
//! reads the variable once: no file, no clock, no formatting. A FILE that cannot be opened
//! is the same as unset (a benchmark aid never fails the call it watches).

use std::{
    ffi::OsStr, fs::File, io::Write, os::unix::fs::OpenOptionsExt, path::Path, sync::OnceLock,
};

/// The variable naming the file steps are appended to.
pub const ENV_STEP_TIMES: &str = "RB_STEP_TIMES";

static SINK: OnceLock<Option<File>> = OnceLock::new();

/// Appends steps to `path` from now on in this process (for a program that learns the file
/// from its command line, not the environment: the subagent, started through a remote
/// shell that passes no variables). Does nothing once a step was recorded or a file set.
pub fn set_file(path: &Path) {
    let _ = SINK.set(open(path));
}

/// Whether steps are recorded in this process.
pub fn enabled() -> bool {
    sink().is_some()
}

/// Records `step` now, with the allocation it belongs to if known.
pub fn mark(step: &str, alloc: Option<u64>) {
    if let Some(file) = sink() {
        write_line(file, step, now_ns(), alloc);
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

fn sink() -> Option<&'static File> {
    SINK.get_or_init(|| {
        std::env::var_os(ENV_STEP_TIMES)
            .filter(|v| !v.is_empty())
            .and_then(|v| open(Path::new(&v as &OsStr)))
    })
    .as_ref()
}

fn open(path: &Path) -> Option<File> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o666)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .ok()
}

/// One line, one `write` (O_APPEND keeps lines of concurrent writers whole).
fn write_line(mut file: &File, step: &str, ns: u64, alloc: Option<u64>) {
    let line = format_line(step, ns, std::process::id(), alloc);
    let _ = file.write_all(line.as_bytes());
}

/// `STEP NS pid=PID[ alloc=ALLOC]\n`.
pub fn format_line(step: &str, ns: u64, pid: u32, alloc: Option<u64>) -> String {
    match alloc {
        Some(a) => format!("{step} {ns} pid={pid} alloc={a}\n"),
        None => format!("{step} {ns} pid={pid}\n"),
    }
}

/// One parsed line: the step, its time, and the tags it carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub step: String,
    pub ns: u64,
    pub pid: Option<u32>,
    pub alloc: Option<u64>,
}

/// Parses a line as [`format_line`] writes it; `None` for anything else.
pub fn parse_line(text: &str) -> Option<Line> {
    let mut words = text.split_whitespace();
    let step = words.next()?.to_string();
    let ns = words.next()?.parse().ok()?;
    let (mut pid, mut alloc) = (None, None);
    for word in words {
        match word.split_once('=')? {
            ("pid", v) => pid = Some(v.parse().ok()?),
            ("alloc", v) => alloc = Some(v.parse().ok()?),
            _ => return None,
        }
    }
    Some(Line {
        step,
        ns,
        pid,
        alloc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let text = format_line("shim.start", 12, 7, None);
        assert_eq!(text, "shim.start 12 pid=7\n");
        let line = parse_line(&text).expect("parses");
        assert_eq!(
            (line.step.as_str(), line.ns, line.pid),
            ("shim.start", 12, Some(7))
        );
        assert_eq!(line.alloc, None);
        let line = parse_line(&format_line("sub.start", 5, 9, Some(3))).expect("parses");
        assert_eq!((line.pid, line.alloc), (Some(9), Some(3)));
    }

    #[test]
    fn bad_lines_are_none() {
        for text in [
            "",
            "step",
            "step x",
            "step 1 pid=x",
            "step 1 what=2",
            "step 1 pid",
        ] {
            assert_eq!(parse_line(text), None, "{text}");
        }
    }

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ns();
        let b = now_ns();
        assert!(a > 0 && b >= a);
    }

    #[test]
    fn a_set_file_gets_the_steps() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("steps");
        set_file(&path);
        assert!(enabled());
        mark("one", None);
        mark("two", Some(4));
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<Line> = text.lines().filter_map(parse_line).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!((lines[0].step.as_str(), lines[1].alloc), ("one", Some(4)));
        assert!(lines[1].ns >= lines[0].ns);
    }
}
