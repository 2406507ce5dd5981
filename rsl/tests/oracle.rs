//! Differential tests against the real parser: every input goes through
//! libglobus-rsl (via `rsl/oracle/oracle.c`) and through our compatible mode,
//! and parse success, unparse, canonical form and evaluation (empty symbol
//! table) must agree.
//!
//! Without libglobus-rsl-dev and without root these tests print
//! "skipped: libglobus-rsl-dev not installed (run the suite as root to
//! install it)" and pass; as root they install it and run.
//! `RSL_FUZZ_CASES=N` sets the number of generated cases per property
//! (default 1000); see rsl/README.md.

mod common;

use std::sync::Mutex;

use common::{gen, oracle, ours, peer_cases, show, OracleSession, PEER_CASES};
use proptest::prelude::*;
use rsl::{Mode, ParseErrorKind, Rsl};

/// Run `f` with the shared oracle process, or return `None` (skipped) when
/// libglobus-rsl is unavailable.
fn with_oracle<T>(f: impl FnOnce(&mut OracleSession) -> T) -> Option<T> {
    static SESSION: Mutex<Option<OracleSession>> = Mutex::new(None);
    let path = oracle()?;
    let mut guard = SESSION.lock().unwrap_or_else(|p| p.into_inner());
    let session = guard.get_or_insert_with(|| OracleSession::start(path));
    Some(f(session))
}

/// Compare one input; `Err` describes the disagreement.
fn compare(session: &mut OracleSession, input: &[u8]) -> Result<(), String> {
    let theirs = session.query(input);
    let mine = ours(input);
    if theirs.matches(&mine) {
        return Ok(());
    }
    // Documented deviation: literals must be UTF-8 (a `^X` delimiter that is
    // a UTF-8 lead byte can split a character; C keeps the raw bytes).
    if let Err(e) = Rsl::parse_bytes(input, Mode::Compatible) {
        if e.kind == ParseErrorKind::InvalidUtf8 {
            return Ok(());
        }
    }
    Err(format!(
        "input {}\n  libglobus-rsl: {theirs:?}\n  ours:          {mine:?}",
        show(input)
    ))
}

#[test]
fn peer_cases_match_the_live_oracle() {
    with_oracle(|session| {
        let cases = peer_cases();
        assert_eq!(cases.len(), PEER_CASES);
        let mut failures = Vec::new();
        for case in &cases {
            // The live oracle and the recorded lines must agree too (the file is
            // not stale), then ours must agree with both.
            let live = session.query(&case.input);
            if !case.verified.matches(&live) {
                failures.push(format!(
                    "{}: recorded {:?} but live {live:?}",
                    case.id, case.verified
                ));
            }
            if let Err(e) = compare(session, &case.input) {
                failures.push(format!("{}: {e}", case.id));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    });
}

/// REFERENCE-NOTES A.6 and the scanner corners found while writing the
/// parser; each is one input.
const EDGE_CASES: &[&str] = &[
    "x = 1",
    "x = \"abc\"",
    "x = \"abc\" ",
    "x = 1 \"abc\"",
    "x = 1 ^|abc|",
    "x = 1 \"\"",
    "&(x=\"abc\")",
    "x = \"abc",
    "&(x=1) \"abc",
    "&(x=1)~junk (y",
    "&(x=1)(* never closed",
    "&(x=1)(*)(y=2)",
    "&(*)*)(x=1)",
    "&(x=1)(* a (* b *) c *)",
    "&(x=1)(**)(y=2)",
    "x=1(*",
    "&(x=1)!",
    "&(x ! = 1)",
    "&(x=1)!=",
    "&(x=1)?",
    "&(x=1)^",
    "&(x=^",
    "x = 1 ^",
    "&(x=1)\r\n",
    "x=1\r\n",
    "&(x=1)\n",
    "&(x=\u{1})",
    "&(x=\u{c})",
    "&(x =< 1)",
    "&(x == 1)",
    "x = 'a''b' ",
    "&(x=^||a||b|)",
    "&(x=^ a b )",
    "&(x=^\na\n)",
    "&(x=\"a\nb\")",
    "&(x=a+b&c|d)",
    "&(x=+a)",
    "&(x=a(*c*)b)",
    "x=a(*c*)$(B)",
    "&(x=a$(B)c)",
    "&(x=$(A)$(B))",
    "&(x=$(A)\"b\")",
    "&(x=\"a\"$(B))",
    "&(x=$(A)^|b|)",
    "&(x=$(A (b) c)d)",
    "&(x=$(A(*c*))d)",
    "&(x=$(A) d)",
    "&(x=$(A)(*c*)d)",
    "&(x=$(A (b)c))",
    "&(x=$($(N)x))",
    "&(x=$ (A))",
    "&(x=$ a)",
    "&(x=a$)",
    "&(x=a$",
    "&(x=($(A))b)",
    "&(x=$(A ($(B)c)))",
    "&(x=$($(A))b)",
    "&(x=$(*c*)(A)b)",
    "&(x=$ (A)b)",
    "&(x=1)$",
    "&(x=$(A)+b)",
    "&(x=$(A)b$(C))",
    "&(x=a$ (B))",
    "&(x=a $(B))",
    "&(x=a#b)",
    "&(x=a#$(B)#\"c\")",
    "&(x=(a)b)",
    "&(x=(a)$(B))",
    "&(x=$(A)(b))",
    "&(x=a(b))",
    "&(x=$(A)$)",
    "&(x=$(A)$ (B))",
    "&(x=$(A)\r)",
    "&(x=$(A b c))",
    "&(x=$((A) b))",
    "&(x=$(A (b)))",
    "&(x=$(A # B))",
    "&()",
    "&",
    "&(x=())",
    "&(a=1)(|(b=2)(c=3))",
    "&(+(&(a=1)))",
    "+(a=1)(b=2)",
    "&(a=1)&(b=2)",
    "(a=1)",
    "&(x=(a b) # c)",
    "&(x=a # # b)",
    "&(x=a #)",
    "&(x=# a)",
    "&(x=a # b # c)",
    "&(\"\"=1)",
    "&(1=1)",
    "&(\"a b\"=1)",
    "&(x=a)(x=b)",
    "&(count=4)(COUNT=5)",
    "&(Max_Wall_Time=1)",
    "&(rsl_substitution=(a b)($(a) c))(x=$(b))",
    "rsl_substitution=(a b)($(a) c)",
    "&(RSLSUBSTITUTION=(a 1)(a 2))(x=$(a))",
    "&(rsl_substitution=(a 1))(&(rsl_substitution=(a 2))(x=$(a)))(y=$(a))",
    "+(&(rsl_substitution=(a 1)))(&(x=$(a)))",
    "&(rsl_substitution=(A 1))(x=$(a))",
    "&(rsl_substitution=a)",
    "&(rsl_substitution=(a b c))",
    "&(rsl_substitution=(a (b)))",
    "&(rsl_substitution=((a b) c))",
    "&(rsl_substitution=(a#b c))(x=$(ab))",
    "&(x=$(A d))",
    "&(rsl_substitution=(A 1))(x=$(A)#b#$(A))",
    "&(environment=(HOME $(H)) (X a#b))",
    "&(x=\u{e9}t\u{e9})",
    "&(x=^\u{e9}a\u{e9} )",
];

#[test]
fn edge_cases_match_the_oracle() {
    let Some(failures) = with_oracle(|session| {
        EDGE_CASES
            .iter()
            .filter_map(|input| compare(session, input.as_bytes()).err())
            .collect::<Vec<String>>()
    }) else {
        return;
    };
    assert!(
        EDGE_CASES.len() >= 110,
        "edge-case list intact ({})",
        EDGE_CASES.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn parser_stack_limit_matches_bison() {
    with_oracle(|session| {
        for k in [9993, 9994, 9995, 9996, 9997, 9998] {
            let values = vec!["v"; k].join(" ");
            for input in [format!("&(x={values})"), format!("x={values}")] {
                let result = compare(session, input.as_bytes());
                assert!(result.is_ok(), "{k} values: {}", &input[..10]);
            }
        }
    });
}

/// The generators must produce both valid and invalid RSL in useful
/// proportions, or the properties below would pass vacuously.
#[test]
fn generators_cover_valid_and_invalid_input() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut ok, mut total) = (0, 0);
    for _ in 0..400 {
        let doc = gen::document()
            .new_tree(&mut runner)
            .expect("tree")
            .current();
        total += 1;
        ok += usize::from(Rsl::parse(&doc, Mode::Compatible).is_ok());
    }
    assert!(
        ok * 10 > total * 4,
        "only {ok}/{total} generated documents parse"
    );
    let (mut bad, mut total) = (0, 0);
    for _ in 0..400 {
        let bytes = gen::mutated()
            .new_tree(&mut runner)
            .expect("tree")
            .current();
        total += 1;
        bad += usize::from(Rsl::parse_bytes(&bytes, Mode::Compatible).is_err());
    }
    assert!(
        bad * 10 > total,
        "only {bad}/{total} mutated documents fail"
    );
    assert!(
        bad * 20 < total * 19,
        "{bad}/{total} mutated documents fail"
    );
}

fn cases() -> u32 {
    std::env::var("RSL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn generated_rsl_matches_the_oracle(doc in gen::document()) {
        if let Some(Err(e)) = with_oracle(|session| compare(session, doc.as_bytes())) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn mutated_rsl_matches_the_oracle(bytes in gen::mutated()) {
        if let Some(Err(e)) = with_oracle(|session| compare(session, &bytes)) {
            prop_assert!(false, "{}", e);
        }
    }
}
