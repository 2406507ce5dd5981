//! Fuzz target: the shipped policies evaluated on arbitrary host, job, user, lab and time
//! facts. See `src/lib.rs` for what counts as a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../../bench/fuzz/slowest.rs"]
mod slowest;

fuzz_target!(|data: &[u8]| {
    slowest::keep_last(data);
    slowest::timed(|| policies_fuzz::policy_eval(data))
});
