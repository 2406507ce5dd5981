//! `/proc` sensors: CPU count and CPU time counters (`/proc/stat`), load averages
//! (`/proc/loadavg`), memory (`/proc/meminfo`), process liveness (`/proc/PID/stat`) and the
//! number of broker-managed processes (`/proc/PID/environ`).
//!
//! Parsers are pure functions over the file text, so tests feed them captured samples; readers
//! take the proc directory as a parameter because `/proc` is global to the machine (LAB-NOTES:
//! every lab host sees the same values), so tests and the lab need an injectable source.
//! A reader that cannot read its file answers `None` ("unknown"), never zero.

use std::fs;
use std::io::Read;
use std::path::Path;

use tracing::debug;

/// Aggregate CPU time counters from the `cpu ` line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks spent neither idle nor waiting for I/O.
    pub busy: u64,
    /// All ticks (user nice system idle iowait irq softirq steal).
    pub total: u64,
}

impl CpuTimes {
    /// Utilisation 0.0–1.0 from `prev` to `self`; `None` when no tick passed in between or the
    /// counters went backwards (e.g. a CPU went offline).
    pub fn utilisation_since(&self, prev: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(prev.total)?;
        let busy = self.busy.checked_sub(prev.busy)?;
        if total == 0 {
            return None;
        }
        Some((busy as f64 / total as f64).clamp(0.0, 1.0))
    }
}

/// What `/proc/stat` tells the sensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatInfo {
    /// Number of `cpuN` lines (online CPUs); `None` when there is none.
    pub cpus: Option<u32>,
    /// The aggregate `cpu` line; `None` when missing or malformed.
    pub times: Option<CpuTimes>,
}

/// Memory figures from `/proc/meminfo`, in kB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub total_kb: Option<u64>,
    /// `MemAvailable` (kernels ≥ 3.14); `None` when the kernel does not report it.
    pub available_kb: Option<u64>,
}

/// Parses `/proc/stat`:
/// ```text
/// cpu  user nice system idle iowait irq softirq steal guest guest_nice
/// cpu0 user nice system idle …
/// intr …
/// ```
pub fn parse_stat(text: &str) -> StatInfo {
    let mut cpus = 0u32;
    let mut times = None;
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        match fields.next() {
            Some("cpu") => times = parse_cpu_times(fields),
            Some(name) if is_cpu_n(name) => cpus += 1,
            _ => {}
        }
    }
    StatInfo {
        cpus: (cpus > 0).then_some(cpus),
        times,
    }
}

/// `cpuN` with N a decimal number.
fn is_cpu_n(name: &str) -> bool {
    name.strip_prefix("cpu")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The counters after `cpu`: at least `user nice system idle`; only the first eight count
/// (guest and guest_nice are already included in user and nice).
fn parse_cpu_times<'a>(fields: impl Iterator<Item = &'a str>) -> Option<CpuTimes> {
    let values: Vec<u64> = fields
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if values.len() < 4 {
        return None;
    }
    let total = values.iter().try_fold(0u64, |acc, v| acc.checked_add(*v))?;
    let idle = values[3].saturating_add(values.get(4).copied().unwrap_or(0));
    Some(CpuTimes {
        busy: total.saturating_sub(idle),
        total,
    })
}

/// Parses `/proc/loadavg`: `load1 load5 load15 running/total last_pid`.
pub fn parse_loadavg(text: &str) -> Option<[f64; 3]> {
    let mut loads = text
        .split_ascii_whitespace()
        .map(|f| f.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0));
    Some([loads.next()??, loads.next()??, loads.next()??])
}

/// Parses `/proc/meminfo`: lines `Key:   value kB`.
pub fn parse_meminfo(text: &str) -> MemInfo {
    let mut mem = MemInfo::default();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let value = rest
            .split_ascii_whitespace()
            .next()
            .and_then(|v| v.parse().ok());
        match key {
            "MemTotal" => mem.total_kb = value,
            "MemAvailable" => mem.available_kb = value,
            _ => {}
        }
    }
    mem
}

/// The state letter of a `/proc/PID/stat` line: the first field after the last `)` (the
/// command name in parentheses may itself contain spaces and parentheses).
pub fn parse_pid_state(stat: &str) -> Option<char> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// Whether `environ` (NUL-separated `NAME=value` entries) has an entry starting with `needle`.
pub fn environ_has(environ: &[u8], needle: &[u8]) -> bool {
    environ
        .split(|b| *b == 0)
        .any(|var| var.starts_with(needle))
}

/// Reads a small text file under the proc directory; `None` (logged at debug) when it fails.
fn read_proc_text(proc_dir: &Path, name: &str) -> Option<String> {
    let path = proc_dir.join(name);
    match fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(err) => {
            debug!(path = %path.display(), error = %err, "sensor file unreadable");
            None
        }
    }
}

/// CPU count and counters from `<proc_dir>/stat`; all unknown when unreadable.
pub fn read_stat(proc_dir: &Path) -> StatInfo {
    read_proc_text(proc_dir, "stat")
        .map(|t| parse_stat(&t))
        .unwrap_or_default()
}

/// Load averages from `<proc_dir>/loadavg`.
pub fn read_loadavg(proc_dir: &Path) -> Option<[f64; 3]> {
    parse_loadavg(&read_proc_text(proc_dir, "loadavg")?)
}

/// Memory from `<proc_dir>/meminfo`; all unknown when unreadable.
pub fn read_meminfo(proc_dir: &Path) -> MemInfo {
    read_proc_text(proc_dir, "meminfo")
        .map(|t| parse_meminfo(&t))
        .unwrap_or_default()
}

/// Whether process `pid` is alive, as coreutils `who` decides for utmp records: `pid > 0` and
/// `<proc_dir>/<pid>` exists, except that a zombie (`Z`) or dead (`X`) process counts as gone
/// (LAB-NOTES: zombies look alive). An unreadable `stat` of an existing process counts as alive.
pub fn pid_alive(proc_dir: &Path, pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    let dir = proc_dir.join(pid.to_string());
    match fs::read_to_string(dir.join("stat")) {
        Ok(stat) => !matches!(parse_pid_state(&stat), Some('Z' | 'X')),
        Err(_) => dir.is_dir(),
    }
}

/// Counts processes whose `<proc_dir>/PID/environ` has an entry `<marker>=…`. Processes whose
/// environment cannot be read (other users', exited meanwhile) are skipped; `None` when the
/// proc directory itself cannot be listed.
pub fn count_managed(proc_dir: &Path, marker: &str) -> Option<u32> {
    let entries = match fs::read_dir(proc_dir) {
        Ok(entries) => entries,
        Err(err) => {
            debug!(path = %proc_dir.display(), error = %err, "cannot list processes");
            return None;
        }
    };
    let needle = format!("{marker}=");
    let mut buf = Vec::new();
    let mut count = 0u32;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_pid_name) {
            continue;
        }
        buf.clear();
        let read =
            fs::File::open(entry.path().join("environ")).and_then(|mut f| f.read_to_end(&mut buf));
        if read.is_ok() && environ_has(&buf, needle.as_bytes()) {
            count += 1;
        }
    }
    Some(count)
}

fn is_pid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  10132153 290696 3084719 46828483 16683 0 25195 0 175628 0\n\
cpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0\n\
cpu1 1335185 43768 558236 13346006 5063 0 1864 0 23483 0\n\
cpu12 1 2 3 4 5 6 7 8 9 10\n\
intr 1462898 1 0 0\n\
ctxt 1990473\n\
btime 1062191376\n\
processes 2915\n\
procs_running 1\n";

    #[test]
    fn stat_counts_cpu_lines_and_sums_times() {
        let info = parse_stat(STAT);
        assert_eq!(info.cpus, Some(3));
        let t = info.times.expect("aggregate line parsed");
        // irq and steal are 0; guest and guest_nice (175628 0) must not count.
        let total = 10132153 + 290696 + 3084719 + 46828483 + 16683 + 25195;
        assert_eq!(t.total, total);
        assert_eq!(t.busy, total - 46828483 - 16683);
    }

    #[test]
    fn stat_with_only_four_counters_and_garbage() {
        let info = parse_stat("cpu 1 2 3 4\ncpux 1\ncpu0 1 2 3 4\n");
        assert_eq!(info.cpus, Some(1));
        assert_eq!(info.times, Some(CpuTimes { busy: 6, total: 10 }));
        let bad = parse_stat("cpu 1 2 x 4\n");
        assert_eq!(bad, StatInfo::default());
        assert_eq!(parse_stat("cpu 1 2\n").times, None);
        assert_eq!(parse_stat("").cpus, None);
    }

    #[test]
    fn utilisation_between_samples() {
        let a = CpuTimes {
            busy: 100,
            total: 1000,
        };
        let b = CpuTimes {
            busy: 150,
            total: 1200,
        };
        assert_eq!(b.utilisation_since(&a), Some(0.25));
        assert_eq!(a.utilisation_since(&a), None, "no tick passed");
        assert_eq!(a.utilisation_since(&b), None, "counters went backwards");
    }

    #[test]
    fn loadavg_parses_three_values() {
        assert_eq!(
            parse_loadavg("0.52 0.58 0.59 1/467 12345\n"),
            Some([0.52, 0.58, 0.59])
        );
        assert_eq!(parse_loadavg("0.52 0.58\n"), None);
        assert_eq!(parse_loadavg("0.52 nan 0.1 1/2 3"), None);
        assert_eq!(parse_loadavg(""), None);
    }

    #[test]
    fn meminfo_total_and_available() {
        let text = "MemTotal:       16318044 kB\nMemFree:         1234567 kB\n\
MemAvailable:   12000000 kB\nBuffers:          100 kB\n";
        let mem = parse_meminfo(text);
        assert_eq!(mem.total_kb, Some(16318044));
        assert_eq!(mem.available_kb, Some(12000000));
        let old_kernel = parse_meminfo("MemTotal: 1000 kB\nMemFree: 10 kB\n");
        assert_eq!(old_kernel.available_kb, None);
        assert_eq!(parse_meminfo("MemTotal: lots\n").total_kb, None);
    }

    #[test]
    fn pid_state_after_last_paren() {
        assert_eq!(parse_pid_state("42 (sleep) S 1 42 42"), Some('S'));
        assert_eq!(parse_pid_state("43 (a) b) (c) Z 1 43"), Some('Z'));
        assert_eq!(parse_pid_state("garbage"), None);
    }

    #[test]
    fn environ_marker_match() {
        let env = b"HOME=/root\0RB_JOB=17\0PATH=/bin\0";
        assert!(environ_has(env, b"RB_JOB="));
        assert!(!environ_has(env, b"RB_JO="));
        assert!(!environ_has(b"XRB_JOB=1\0", b"RB_JOB="));
        assert!(!environ_has(b"", b"RB_JOB="));
    }

    fn fake_proc(procs: &[(&str, &str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (pid, stat, environ) in procs {
            let p = dir.path().join(pid);
            fs::create_dir(&p).expect("mkdir");
            fs::write(p.join("stat"), stat).expect("stat");
            fs::write(p.join("environ"), environ).expect("environ");
        }
        fs::create_dir(dir.path().join("sys")).expect("non-pid dir");
        fs::write(dir.path().join("loadavg"), "1.00 2.00 3.00 1/1 1\n").expect("loadavg");
        dir
    }

    #[test]
    fn liveness_treats_zombies_and_missing_as_dead() {
        let dir = fake_proc(&[("10", "10 (sh) S 1", b""), ("11", "11 (sh) Z 1", b"")]);
        assert!(pid_alive(dir.path(), 10));
        assert!(!pid_alive(dir.path(), 11), "zombie");
        assert!(!pid_alive(dir.path(), 12), "missing");
        assert!(!pid_alive(dir.path(), 0));
        assert!(!pid_alive(dir.path(), -5));
    }

    #[test]
    fn managed_processes_counted_from_environ() {
        let dir = fake_proc(&[
            ("1", "1 (init) S 0", b"PATH=/bin\0"),
            ("20", "20 (job) R 1", b"A=1\0RB_JOB=j7\0"),
            ("21", "21 (job) S 1", b"RB_JOB=j8\0"),
            ("22", "22 (other) S 1", b"RB_JOBS=x\0"),
        ]);
        assert_eq!(count_managed(dir.path(), "RB_JOB"), Some(2));
        assert_eq!(count_managed(dir.path(), "A"), Some(1));
        assert_eq!(count_managed(&dir.path().join("absent"), "RB_JOB"), None);
    }

    #[test]
    fn readers_answer_unknown_when_files_are_missing() {
        let dir = fake_proc(&[]);
        assert_eq!(read_loadavg(dir.path()), Some([1.0, 2.0, 3.0]));
        assert_eq!(read_stat(dir.path()), StatInfo::default());
        assert_eq!(read_meminfo(dir.path()), MemInfo::default());
    }
}
