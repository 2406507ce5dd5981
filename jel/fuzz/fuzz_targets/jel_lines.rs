//! Fuzz target: arbitrary lines from a job's processes to its JEL pool, over several
//! connections, with the agent's own inputs between them. See `src/lib.rs` for what counts
//! as a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../../bench/fuzz/slowest.rs"]
mod slowest;

fuzz_target!(|data: &[u8]| {
    slowest::keep_last(data);
    slowest::timed(|| jel_fuzz::jel_lines(data))
});
