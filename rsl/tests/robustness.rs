//! No input may panic: arbitrary bytes through every entry point (both
//! modes, the job-spec dialect, unparse, evaluation, canonicalisation).
//! The cargo-fuzz target in rsl/fuzz does the same, unbounded.

use proptest::prelude::*;
use rsl::{JobSpec, Mode, Rsl, SymbolTable};

fn exercise(bytes: &[u8]) {
    for mode in [Mode::Compatible, Mode::Strict] {
        match Rsl::parse_bytes(bytes, mode) {
            Ok(rsl) => {
                if let Ok(text) = rsl.unparse() {
                    // The canonical form re-parses, and is a fixed point.
                    let again = Rsl::parse(&text, mode).expect("unparse output parses");
                    assert_eq!(again.unparse().as_deref(), Ok(text.as_str()));
                }
                let _ = rsl.canonicalized().unparse();
                let _ = rsl.evaluate(&mut SymbolTable::new());
                let _ = JobSpec::from_rsl(&rsl);
            }
            Err(e) => {
                assert!(e.offset <= bytes.len());
                assert!(e.line >= 1 && e.column >= 1);
                let _ = e.to_string();
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(bytes) {
        let _ = JobSpec::from_rsl_text(text).map(|s| s.to_json_pretty());
    }
}

fn cases() -> u32 {
    std::env::var("RSL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        exercise(&bytes);
    }

    #[test]
    fn rsl_flavoured_bytes_never_panic(
        bytes in prop::collection::vec(prop::sample::select(b"()&|+=!<>\"'^*$#?~ \t\n\rax_\0\xc3\xa9".to_vec()), 0..128)
    ) {
        exercise(&bytes);
    }
}

#[test]
fn pathological_inputs() {
    for text in [
        "(".repeat(100_000),
        "$(".repeat(100_000),
        "&(".repeat(100_000),
        "a#".repeat(100_000),
        "\"".repeat(100_001),
        "(*".repeat(100_000),
        format!("x={}", "v ".repeat(50_000)),
    ] {
        exercise(text.as_bytes());
    }
}
