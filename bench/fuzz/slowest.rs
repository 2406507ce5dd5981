//! The time bound of a fuzz run and its slowest input, for the table of `bench/fuzz/run.sh`.
//! Every fuzz target's body is wrapped in [`timed`], which measures the CPU time the
//! process spent on the input (every thread: the policy parser runs on its own), fails an
//! input over [`LIMIT_US`] of it, and, when `RB_FUZZ_SLOWEST` names a file, writes each new
//! maximum there (microseconds). Included with `#[path]` by `*/fuzz/fuzz_targets/*.rs`.
//!
//! CPU time, not wall time: on a shared machine a fuzzer at `nice 10` waits its turn, and
//! libFuzzer's wall-clock `-timeout` once failed a `policy_file` input that takes 40 ms of
//! CPU (it is kept for hangs, with a wider bound).

use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `data` to the file `RB_FUZZ_LAST` names (when it names one), before the target
/// runs it: a stack overflow kills a libFuzzer process with a bare SIGSEGV (no Rust
/// handler, no alternate signal stack: libFuzzer's own handler cannot run and writes no
/// input), and this file then holds the input that did it.
pub fn keep_last(data: &[u8]) {
    static LAST: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    if let Some(path) = LAST.get_or_init(|| std::env::var_os("RB_FUZZ_LAST").map(Into::into)) {
        // A lost write only loses the clue, never the run.
        let _ = std::fs::write(path, data);
    }
}

/// The most CPU time one input may take (the bound: no input over 1 s).
pub const LIMIT_US: u64 = 1_000_000;

static SLOWEST_US: AtomicU64 = AtomicU64::new(0);

/// Runs one input, records its CPU time if it is the slowest so far, and panics (a finding
/// run.sh reports as an input over 1 s, not as a panic) when it took over [`LIMIT_US`].
pub fn timed(run: impl FnOnce()) {
    let start = process_cpu_us();
    run();
    let us = process_cpu_us().saturating_sub(start);
    if us > SLOWEST_US.fetch_max(us, Ordering::Relaxed) {
        if let Some(path) = std::env::var_os("RB_FUZZ_SLOWEST") {
            // A lost record only makes the table's figure smaller than the truth once;
            // the bound itself is the check below.
            let _ = std::fs::write(path, format!("{us}\n"));
        }
    }
    assert!(
        us <= LIMIT_US,
        "input over 1 s of CPU: {} ms (rb-fuzz-slow-input)",
        us / 1000
    );
}

/// CPU time of the whole process so far, in microseconds.
fn process_cpu_us() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec; CLOCK_PROCESS_CPUTIME_ID exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed");
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(t.tv_nsec).unwrap_or(0);
    secs * 1_000_000 + nanos / 1000
}
