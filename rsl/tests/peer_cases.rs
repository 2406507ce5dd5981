//! The 181 real RSL inputs from gridcf/gct (tests/data/peer-cases.txt) must
//! give, in compatible mode, exactly the results recorded from the real
//! libglobus-rsl: parse success/failure, unparse, canonical form and
//! evaluation with an empty symbol table. Needs no C library.

mod common;

use common::{ours, peer_cases, show, Outcome, PEER_CASES};
use rsl::{Mode, Rsl};

#[test]
fn all_peer_cases_match_the_recorded_results() {
    let cases = peer_cases();
    assert_eq!(
        cases.len(),
        PEER_CASES,
        "the case file lost or gained cases"
    );
    let parsed = cases.iter().filter(|c| c.verified.parsed()).count();
    assert_eq!(
        (parsed, cases.len() - parsed),
        (171, 10),
        "171 valid, 10 bad inputs"
    );
    let mut failures = Vec::new();
    for case in &cases {
        let got = ours(&case.input);
        if !case.verified.matches(&got) {
            failures.push(format!(
                "{}: input {}\n  recorded {:?}\n  ours     {:?}",
                case.id,
                show(&case.input),
                case.verified,
                got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn peer_cases_unparse_round_trips() {
    let mut checked = 0;
    for case in peer_cases() {
        let Outcome::Parsed { .. } = case.verified else {
            continue;
        };
        let rsl = Rsl::parse_bytes(&case.input, Mode::Compatible).expect("parses");
        let text = rsl.unparse().expect("unparses");
        // The unparse ends with a blank or `)`, never with a bare quote, so it
        // re-parses even in compatible mode.
        let again = Rsl::parse(&text, Mode::Compatible).expect("unparse re-parses");
        assert_eq!(again, rsl, "{}", case.id);
        checked += 1;
    }
    assert_eq!(checked, 171);
}

#[test]
fn peer_cases_in_strict_mode() {
    // Strict mode only differs on the quirks; none of the valid peer inputs
    // relies on one, and every bad one is still rejected.
    for case in peer_cases() {
        let strict = Rsl::parse_bytes(&case.input, Mode::Strict);
        assert_eq!(
            strict.is_ok(),
            case.verified.parsed(),
            "{}: {:?}",
            case.id,
            strict.err()
        );
    }
}
