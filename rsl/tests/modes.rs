//! Compatible vs strict mode, pinned: each libglobus-rsl quirk is accepted
//! (or rejected) exactly like the real parser in compatible mode and
//! reported with its own error kind in strict mode. Also the shape of error
//! messages (line, column, expected, caret excerpt).

use rsl::{Mode, ParseErrorKind, Rsl};

fn compat(text: &str) -> Result<String, ParseErrorKind> {
    Rsl::parse(text, Mode::Compatible)
        .map(|r| r.unparse().expect("unparses"))
        .map_err(|e| e.kind)
}

fn strict(text: &str) -> Result<String, ParseErrorKind> {
    Rsl::parse(text, Mode::Strict)
        .map(|r| r.unparse().expect("unparses"))
        .map_err(|e| e.kind)
}

#[test]
fn quoted_literal_as_last_byte() {
    assert_eq!(
        compat("x = \"abc\""),
        Err(ParseErrorKind::QuoteAtEndOfInput)
    );
    assert_eq!(strict("x = \"abc\"").as_deref(), Ok("\"x\" = \"abc\" "));
    assert_eq!(compat("x = \"abc\" ").as_deref(), Ok("\"x\" = \"abc\" "));
    // The lost token can leave a complete specification behind.
    assert_eq!(compat("x = 1 \"abc\"").as_deref(), Ok("\"x\" = \"1\" "));
    assert_eq!(
        strict("x = 1 \"abc\"").as_deref(),
        Ok("\"x\" = \"1\" \"abc\" ")
    );
    assert_eq!(compat("x = 1 ^|abc|").as_deref(), Ok("\"x\" = \"1\" "));
}

#[test]
fn truncation_at_unmatched_characters() {
    assert_eq!(
        compat("&(x=1)^").as_deref(),
        Ok("&(\"x\" = \"1\" )"),
        "`^` at the end"
    );
    assert_eq!(strict("&(x=1)^"), Err(ParseErrorKind::UnterminatedQuote));
    for junk in ["~junk (y", "?", "*)", "!", "!x"] {
        let text = format!("&(x=1){junk}");
        assert_eq!(compat(&text).as_deref(), Ok("&(\"x\" = \"1\" )"), "{text}");
        assert_eq!(
            strict(&text),
            Err(ParseErrorKind::UnexpectedCharacter),
            "{text}"
        );
    }
    // `!=` is a token, not an unmatched character: a real syntax error.
    assert_eq!(compat("&(x=1)!="), Err(ParseErrorKind::Syntax));
}

#[test]
fn unterminated_comments_and_quotes() {
    assert_eq!(
        compat("&(x=1)(* never closed").as_deref(),
        Ok("&(\"x\" = \"1\" )")
    );
    assert_eq!(
        strict("&(x=1)(* never closed"),
        Err(ParseErrorKind::UnterminatedComment)
    );
    assert_eq!(compat("&(x=1)(*)(y=2)").as_deref(), Ok("&(\"x\" = \"1\" )"));
    assert_eq!(compat("&(x=1) \"abc").as_deref(), Ok("&(\"x\" = \"1\" )"));
    assert_eq!(
        strict("&(x=1) \"abc"),
        Err(ParseErrorKind::UnterminatedQuote)
    );
    assert_eq!(strict("&(x=^"), Err(ParseErrorKind::UnterminatedQuote));
}

#[test]
fn nul_bytes() {
    let input = b"&(x=1)\0(y";
    assert!(
        Rsl::parse_bytes(input, Mode::Compatible).is_ok(),
        "C strings end at NUL"
    );
    let e = Rsl::parse_bytes(input, Mode::Strict).expect_err("strict rejects NUL");
    assert_eq!(e.kind, ParseErrorKind::NulByte);
}

#[test]
fn carriage_return_is_text_in_both_modes() {
    assert_eq!(compat("x=1\r\n").as_deref(), Ok("\"x\" = \"1\r\" "));
    let e = Rsl::parse("&(x=1)\r\n", Mode::Strict).expect_err("CR after `)`");
    assert_eq!(e.kind, ParseErrorKind::Syntax);
    assert!(e.help.as_deref().unwrap_or("").contains("CRLF"), "{e}");
}

#[test]
fn shared_grammar() {
    for mode in [Mode::Compatible, Mode::Strict] {
        let ok = |t: &str| Rsl::parse(t, mode).is_ok();
        assert!(ok("x = 1 "));
        assert!(ok("+(a=1)(b=2)"));
        assert!(ok("&(+(&(a=1)))"));
        assert!(!ok("&()"));
        assert!(!ok("&(x=())"));
        assert!(!ok("(a=1)"), "no bare spec lists in Globus RSL");
        assert!(!ok("&(a=1)&(b=2)"));
        assert!(!ok("&(x=(a b) # c)"));
        assert!(!ok("&(x ! = 1)"));
        assert!(!ok("&(x =< 1)"));
    }
}

#[test]
fn error_messages_locate_and_explain() {
    let e = Rsl::parse("&(executable=/bin/date)\n (count = 4~)", Mode::Strict).expect_err("bad");
    assert_eq!((e.line, e.column, e.offset), (2, 12, 35));
    assert_eq!(e.kind, ParseErrorKind::UnexpectedCharacter);
    assert_eq!(e.excerpt, " (count = 4~)");
    let shown = e.to_string();
    assert!(
        shown.starts_with("expected `)` to close the operand"),
        "{shown}"
    );
    assert!(shown.contains("found `~`"), "{shown}");
    assert!(
        shown.contains("2 |  (count = 4~)\n  |            ^"),
        "{shown}"
    );
    assert!(shown.contains("help:"), "{shown}");

    let e = Rsl::parse("&(x y = 1 1 )", Mode::Compatible).expect_err("bad");
    assert_eq!((e.line, e.column), (1, 5));
    assert!(e.expected.contains("relational operator"), "{}", e.expected);
    assert_eq!(e.found, "`y`");

    let e = Rsl::parse("&(x = 1", Mode::Compatible).expect_err("bad");
    assert_eq!(e.found, "end of input");
}

#[test]
fn nesting_limit_is_an_error_not_a_crash() {
    let deep = format!("&(x={}a{})", "(".repeat(5000), ")".repeat(5000));
    for mode in [Mode::Compatible, Mode::Strict] {
        let e = Rsl::parse(&deep, mode).expect_err("too deep");
        assert_eq!(e.kind, ParseErrorKind::TooDeep);
    }
    let fine = format!("&(x={}a{})", "(".repeat(120), ")".repeat(120));
    assert!(Rsl::parse(&fine, Mode::Strict).is_ok());
    let chain = vec!["a"; 5000].join("#");
    assert_eq!(compat(&format!("x={chain}")), Err(ParseErrorKind::TooDeep));
    let bools = format!("&{}(a=b){}", "(&".repeat(5000), ")".repeat(5000));
    assert_eq!(strict(&bools), Err(ParseErrorKind::TooDeep));
    let vars = format!("&(x={}a{})", "$(".repeat(5000), ")".repeat(5000));
    assert_eq!(strict(&vars), Err(ParseErrorKind::TooDeep));
}

#[test]
fn parser_stack_limit_is_compatible_mode_only() {
    let values = vec!["v"; 9995].join(" ");
    let text = format!("&(x={values})");
    assert_eq!(
        compat(&text).map(|_| ()),
        Err(ParseErrorKind::ParserStackExhausted)
    );
    assert!(strict(&text).is_ok());
    let text = format!("&(x={})", vec!["v"; 9994].join(" "));
    assert!(compat(&text).is_ok());
}

#[test]
fn from_str_is_strict() {
    assert!("x = \"abc\"".parse::<Rsl>().is_ok());
    assert!("&(x=1)~".parse::<Rsl>().is_err());
}
