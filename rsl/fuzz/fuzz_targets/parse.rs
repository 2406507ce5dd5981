//! Fuzz target: arbitrary bytes through every `rsl` entry point. Any panic,
//! abort or stack overflow is a bug; so is an unparse that does not parse
//! back, or that changes when unparsed again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rsl::{JobSpec, Mode, Rsl, SymbolTable};

#[path = "../../../bench/fuzz/slowest.rs"]
mod slowest;

fuzz_target!(|data: &[u8]| {
    slowest::keep_last(data);
    slowest::timed(|| check(data))
});

fn check(data: &[u8]) {
    for mode in [Mode::Compatible, Mode::Strict] {
        let Ok(rsl) = Rsl::parse_bytes(data, mode) else {
            continue;
        };
        if let Ok(text) = rsl.unparse() {
            // Re-parses, and is a fixed point (variables may lose extra
            // elements, exactly as with globus_rsl_unparse).
            let again = Rsl::parse(&text, mode).expect("unparse output parses");
            assert_eq!(
                again.unparse().as_deref(),
                Ok(text.as_str()),
                "unparse fixed point"
            );
        }
        let _ = rsl.canonicalized().unparse();
        let _ = rsl.evaluate(&mut SymbolTable::new());
        let _ = JobSpec::from_rsl(&rsl);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = JobSpec::from_rsl_text(text).map(|s| s.to_json_pretty());
    }
}
