//! What the overflow section reads its timings and counts from: a recorder script put before
//! the lab file's `sbatch`/`squeue`/`scancel`/`scontrol` (each call's start and end, in ns since the
//! epoch), the broker log's timestamps, and the pilot's processes in `/proc`.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use localtime::utc_offset_s;

/// The Slurm commands the broker runs.
pub const COMMANDS: [&str; 4] = ["sbatch", "squeue", "scancel", "scontrol"];

/// Writes the recorder script into `dir` and returns its path. Called as
/// `recorder NAME COMMAND…`, it appends `NS PID start NAME` to `dir/calls.log`, runs the
/// command (stdin, stdout and stderr are the broker's) and appends `NS PID end NAME STATUS`.
pub fn write_recorder(dir: &Path) -> anyhow::Result<PathBuf> {
    let log = dir.join("calls.log");
    let path = dir.join("slurm-call");
    let text = format!(
        "#!/bin/sh\n\
         # rb-bench: records a Slurm call's start and end (ns since the epoch), then runs it.\n\
         name=$1\n\
         shift\n\
         echo \"$(date +%s%N) $$ start $name\" >> '{log}'\n\
         \"$@\"\n\
         status=$?\n\
         echo \"$(date +%s%N) $$ end $name $status\" >> '{log}'\n\
         exit $status\n",
        log = log.display()
    );
    std::fs::write(&path, text)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// One recorded Slurm call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    pub start_ns: i128,
    /// `None` while it runs.
    pub end_ns: Option<i128>,
}

/// The calls recorded in `dir/calls.log` so far, in order of their start.
pub fn calls(dir: &Path) -> Vec<Call> {
    let text = std::fs::read_to_string(dir.join("calls.log")).unwrap_or_default();
    parse_calls(&text)
}

fn parse_calls(text: &str) -> Vec<Call> {
    let mut out: Vec<(String, Call)> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(ns), Some(pid), Some(what), Some(name)) = (
            f.first().and_then(|s| s.parse::<i128>().ok()),
            f.get(1),
            f.get(2),
            f.get(3),
        ) else {
            continue;
        };
        match *what {
            "start" => out.push((
                pid.to_string(),
                Call {
                    name: name.to_string(),
                    start_ns: ns,
                    end_ns: None,
                },
            )),
            "end" => {
                let open = out
                    .iter_mut()
                    .rev()
                    .find(|(p, c)| p == pid && c.name == *name && c.end_ns.is_none());
                if let Some((_, call)) = open {
                    call.end_ns = Some(ns);
                }
            }
            _ => {}
        }
    }
    out.into_iter().map(|(_, c)| c).collect()
}

/// How many of `calls` are of each of [`COMMANDS`].
pub fn count(calls: &[Call]) -> [usize; 4] {
    COMMANDS.map(|name| calls.iter().filter(|c| c.name == name).count())
}

/// Nanoseconds since the epoch of a broker log line's timestamp (tracing's default format,
/// UTC: `2026-11-27T16:40:01.123456Z  INFO …`).
pub fn log_time_ns(line: &str) -> Option<i128> {
    let stamp = line.split_whitespace().next()?.strip_suffix('Z')?;
    bench::civil::civil_ns(stamp)
}

/// Nanoseconds since the epoch of a Slurm daemon's log line (`LogTimeFormat`'s default,
/// local time to the millisecond: `[2026-11-27T16:40:01.123] Launching batch job …`).
pub fn slurm_log_time_ns(line: &str) -> Option<i128> {
    let stamp = line.strip_prefix('[')?.split_once(']')?.0;
    let as_utc = bench::civil::civil_ns(stamp)?;
    let offset_s = utc_offset_s(i64::try_from(as_utc / 1_000_000_000).ok()?)?;
    Some(as_utc - i128::from(offset_s) * 1_000_000_000)
}

/// The first line of `log` containing `what` stamped after `after_ns` (read by `time`):
/// its time.
pub fn first_after(
    log: &str,
    what: &str,
    after_ns: i128,
    time: fn(&str) -> Option<i128>,
) -> Option<i128> {
    log.lines()
        .filter(|l| l.contains(what))
        .filter_map(time)
        .find(|&t| t > after_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_pair_by_pid_and_name() {
        let log = "10 7 start sbatch\n11 8 start squeue\n15 8 end squeue 0\n20 7 end sbatch 0\n\
                   30 9 start scancel\nnot a line\n";
        let calls = parse_calls(log);
        assert_eq!(calls.len(), 3);
        assert_eq!(
            (calls[0].name.as_str(), calls[0].end_ns),
            ("sbatch", Some(20))
        );
        assert_eq!(calls[1].end_ns, Some(15));
        assert_eq!(calls[2].end_ns, None, "scancel still runs");
        assert_eq!(count(&calls), [1, 1, 1, 0]);
    }

    #[test]
    fn log_timestamps_are_utc_nanoseconds() {
        let line = "2026-11-27T16:40:01.123456Z  INFO broker::core: a Slurm pilot's host joins";
        // 2026-11-27 is day 20_784 since the epoch.
        let want = (20_784i128 * 86_400 + 16 * 3600 + 40 * 60 + 1) * 1_000_000_000 + 123_456_000;
        assert_eq!(log_time_ns(line), Some(want));
        assert_eq!(log_time_ns("1970-01-01T00:00:00Z x"), Some(0));
        assert_eq!(log_time_ns("  INFO no stamp"), None);
        let log = format!("{line}\n");
        assert_eq!(
            first_after(&log, "joins", want - 1, log_time_ns),
            Some(want)
        );
        assert_eq!(first_after(&log, "joins", want, log_time_ns), None);
    }

    #[test]
    fn slurm_log_timestamps_are_local_time() {
        let line = "[2026-11-27T16:40:01.123] Launching batch job 5 for UID 0";
        let as_utc = (20_784i128 * 86_400 + 16 * 3600 + 40 * 60 + 1) * 1_000_000_000 + 123_000_000;
        let offset = utc_offset_s(1_795_000_000).expect("local offset");
        assert_eq!(
            slurm_log_time_ns(line),
            Some(as_utc - i128::from(offset) * 1_000_000_000)
        );
        assert_eq!(slurm_log_time_ns("Launching batch job 5"), None);
    }

    #[test]
    fn the_recorder_runs_the_command_and_records_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rec = write_recorder(dir.path()).expect("recorder");
        // Through `sh`, which reads the script: exec'ing a file just written fails with
        // ETXTBSY while a child that another test thread forked meanwhile still holds the
        // write descriptor (until its own exec closes it).
        let out = std::process::Command::new("sh")
            .arg(&rec)
            .args(["squeue", "echo", "hello"])
            .output()
            .expect("run");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
        let status = std::process::Command::new("sh")
            .arg(&rec)
            .args(["scancel", "false"])
            .status()
            .expect("run");
        assert_eq!(status.code(), Some(1), "the command's status is kept");
        let calls = calls(dir.path());
        assert_eq!(count(&calls), [0, 1, 1, 0]);
        assert!(calls
            .iter()
            .all(|c| c.end_ns.is_some_and(|e| e >= c.start_ns)));
    }
}
