//! A process as /proc shows it: CPU time and resident memory (`/proc/PID/stat`, `/proc/PID/status`),
//! its parent and command name, and the processes whose argv holds some words.

use std::time::{Duration, Instant};

/// Clock ticks per second for /proc CPU times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let t = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// User+system CPU seconds consumed so far by `pid` (and its reaped children: no).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = text.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the comm field: state is index 0, utime index 11, stime index 12.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_second())
}

/// Resident set size in KiB (VmRSS).
pub fn rss_kb(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// CPU share (1.0 = one core fully busy) of `pid` over `window`, and its RSS at the end.
pub fn measure(pid: u32, window: Duration) -> Option<(f64, u64)> {
    let c0 = cpu_seconds(pid)?;
    let t0 = Instant::now();
    std::thread::sleep(window);
    let c1 = cpu_seconds(pid)?;
    let share = (c1 - c0) / t0.elapsed().as_secs_f64();
    Some((share, rss_kb(pid)?))
}

/// Root-namespace pids of the processes whose argv contains `words` in a row.
pub fn pids_with_args(words: &[&str]) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let argv: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
            argv.windows(words.len())
                .any(|w| w.iter().zip(words).all(|(a, b)| *a == b.as_bytes()))
        })
        .collect()
}

/// The parent (root-namespace pid) of `pid`.
pub fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The command name (`/proc/PID/comm`) of `pid`.
pub fn comm(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(text.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_cpu_and_rss() {
        let me = std::process::id();
        assert!(cpu_seconds(me).is_some());
        assert!(rss_kb(me).is_some_and(|kb| kb > 0));
    }
}
