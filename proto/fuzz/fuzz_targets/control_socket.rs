//! Fuzz target: arbitrary bytes from a peer of the broker's control socket (rb on the broker's machine).
//! See `src/lib.rs` for what counts as a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../../bench/fuzz/slowest.rs"]
mod slowest;

fuzz_target!(|data: &[u8]| {
    slowest::keep_last(data);
    slowest::timed(|| proto_fuzz::control_socket(data))
});
