//! The slowest input of a fuzz run, for the table of `bench/fuzz/run.sh` (libFuzzer only
//! reports whole seconds). Every fuzz target's body is wrapped in [`timed`]; when
//! `RB_FUZZ_SLOWEST` names a file, each new maximum (microseconds) is written there.
//! Included with `#[path]` by the targets under `*/fuzz/fuzz_targets/`.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Instant,
};

static SLOWEST_US: AtomicU64 = AtomicU64::new(0);

/// Runs one input and records its time if it is the slowest so far.
pub fn timed(run: impl FnOnce()) {
    let start = Instant::now();
    run();
    let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
    if us > SLOWEST_US.fetch_max(us, Ordering::Relaxed) {
        if let Some(path) = std::env::var_os("RB_FUZZ_SLOWEST") {
            // A lost record only makes the table's figure smaller than the truth once;
            // the 1 s bound itself is enforced by libFuzzer's -timeout.
            let _ = std::fs::write(path, format!("{us}\n"));
        }
    }
}
