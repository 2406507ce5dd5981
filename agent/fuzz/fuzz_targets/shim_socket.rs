//! Fuzz target: arbitrary bytes on the agent's job-local socket (shim requests and the
//! preload's `resolved` hint). See `src/lib.rs` for what counts as a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../../bench/fuzz/slowest.rs"]
mod slowest;

fuzz_target!(|data: &[u8]| {
    slowest::keep_last(data);
    slowest::timed(|| agent_fuzz::shim_socket(data))
});
