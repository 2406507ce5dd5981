//! Lexical productions of RSL (REFERENCE-NOTES A.2, `globus_rsl_scanner.l`):
//! blanks and `(* *)` comments, the three literal forms, operators, and the
//! "effective end of input" rules behind libglobus-rsl's silent truncation.
//!
//! Every function here works on raw bytes (`&[u8]`); the const parameter
//! `S` selects strict (`true`) or compatible (`false`) behaviour. In
//! compatible mode the places where the flex scanner returns end-of-input are
//! reported as recoverable [`nom::Err::Error`]s so the grammar stops there; in
//! strict mode they are hard [`nom::Err::Failure`]s with their own
//! [`ParseErrorKind`].

use nom::branch::alt;
use nom::bytes::complete::{tag, take_while};
use nom::combinator::value;
use nom::error::{ContextError, ErrorKind, ParseError as NomParseError};
use nom::{IResult, Parser};

use crate::ast::{BoolOp, RelOp};
use crate::error::ParseErrorKind;

/// Parser input: the raw bytes still to read.
pub(crate) type In<'a> = &'a [u8];

/// Result of every production.
pub(crate) type PResult<'a, O> = IResult<In<'a>, O, PError<'a>>;

/// The crate-internal nom error: where, what was expected, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PError<'a> {
    /// The input at the point of failure.
    pub at: In<'a>,
    /// What the parser wanted to see there.
    pub expected: &'static str,
    /// The coarse classification.
    pub kind: ParseErrorKind,
    /// The enclosing production, if a `context()` named one.
    pub context: Option<&'static str>,
}

impl<'a> PError<'a> {
    /// A syntax error at `at`.
    pub fn expected(at: In<'a>, expected: &'static str) -> Self {
        PError {
            at,
            expected,
            kind: ParseErrorKind::Syntax,
            context: None,
        }
    }

    /// An error of a specific kind at `at`.
    pub fn of_kind(at: In<'a>, expected: &'static str, kind: ParseErrorKind) -> Self {
        PError {
            at,
            expected,
            kind,
            context: None,
        }
    }
}

impl<'a> NomParseError<In<'a>> for PError<'a> {
    fn from_error_kind(input: In<'a>, _kind: ErrorKind) -> Self {
        PError::expected(input, "valid RSL")
    }

    fn append(_input: In<'a>, _kind: ErrorKind, other: Self) -> Self {
        other
    }

    /// Of two alternatives, report the one that got further.
    fn or(self, other: Self) -> Self {
        if other.at.len() < self.at.len() {
            other
        } else {
            self
        }
    }
}

impl<'a> ContextError<In<'a>> for PError<'a> {
    fn add_context(_input: In<'a>, ctx: &'static str, mut other: Self) -> Self {
        other.context.get_or_insert(ctx);
        other
    }
}

/// Recoverable error (the grammar may try something else).
pub(crate) fn error<O>(e: PError<'_>) -> PResult<'_, O> {
    Err(nom::Err::Error(e))
}

/// Fatal error (a branch was committed to).
pub(crate) fn failure<O>(e: PError<'_>) -> PResult<'_, O> {
    Err(nom::Err::Failure(e))
}

const fn class(excluded: &[u8]) -> [bool; 256] {
    let mut table = [true; 256];
    table[0] = false; // NUL: end of a C string, never literal text
    let mut k = 0;
    while k < excluded.len() {
        table[excluded[k] as usize] = false;
        k += 1;
    }
    table
}

/// `[^\t \n+&|=!<>()"'^*$#?~]`: bytes an unquoted literal may start with.
static UNQUOTED_FIRST: [bool; 256] = class(b"\t \n+&|=!<>()\"'^*$#?~");
/// `[^\t \n=!<>()"'^*$#?~]`: bytes an unquoted literal may continue with.
static UNQUOTED_REST: [bool; 256] = class(b"\t \n=!<>()\"'^*$#?~");

/// Can `b` start an unquoted literal?
pub(crate) fn is_unquoted_first(b: u8) -> bool {
    UNQUOTED_FIRST[b as usize]
}

/// Bytes that no scanner rule matches: libglobus-rsl stops reading there.
/// (`!` only counts when it does not start `!=`; `^` only at the very end.)
pub(crate) fn is_unmatched(i: In<'_>) -> bool {
    match i {
        [b'*' | b'?' | b'~', ..] | [b'^'] => true,
        [b'!', rest @ ..] => rest.first() != Some(&b'='),
        _ => false,
    }
}

/// `blank = " " | "\t" | "\n"` (not `\r`!) and
/// `comment = "(*" … "*)"` (not nested), skipped between any two tokens.
///
/// An unterminated comment ends the input in compatible mode (the scanner
/// hits EOF inside it) and is an [`ParseErrorKind::UnterminatedComment`] in
/// strict mode.
pub(crate) fn trivia<const S: bool>(mut i: In<'_>) -> PResult<'_, ()> {
    loop {
        match i {
            [b' ' | b'\t' | b'\n', rest @ ..] => i = rest,
            [b'(', b'*', body @ ..] => match body.windows(2).position(|w| w == b"*)") {
                Some(p) => i = &body[p + 2..],
                None if S => {
                    return failure(PError::of_kind(
                        i,
                        "`*)` to close this comment",
                        ParseErrorKind::UnterminatedComment,
                    ))
                }
                None => return Ok((i, ())),
            },
            _ => return Ok((i, ())),
        }
    }
}

/// `UNQUOTED = [^\t \n+&|=!<>()"'^*$#?~] [^\t \n=!<>()"'^*$#?~]*`
///
/// `+ & |` may appear after the first byte: `a+b&c|d` is one literal.
pub(crate) fn unquoted_literal(i: In<'_>) -> PResult<'_, In<'_>> {
    match i.first() {
        Some(&b) if is_unquoted_first(b) => {
            let (rest, tail) = take_while(|b| UNQUOTED_REST[b as usize]).parse(&i[1..])?;
            Ok((rest, &i[..1 + tail.len()]))
        }
        _ => error(PError::expected(i, "a literal")),
    }
}

/// `QUOTED = '"' ( [^"] | '""' )* '"' | "'" ( [^'] | "''" )* "'"`
///
/// The delimiter is escaped by doubling it; there are no backslash escapes
/// and newlines are kept.
pub(crate) fn quoted_literal<const S: bool>(i: In<'_>) -> PResult<'_, Vec<u8>> {
    match i.first() {
        Some(&d @ (b'"' | b'\'')) => delimited_body::<S>(i, d, &i[1..]),
        _ => error(PError::expected(i, "a quoted literal")),
    }
}

/// `USER_QUOTED = "^" X ( [^X] | X X )* X` for any single byte X
/// (`^|a"b'c|`, `^|a||b|` is `a|b`).
pub(crate) fn user_quoted_literal<const S: bool>(i: In<'_>) -> PResult<'_, Vec<u8>> {
    match i {
        [b'^', d, body @ ..] => delimited_body::<S>(i, *d, body),
        [b'^'] if S => failure(PError::of_kind(
            i,
            "a delimiter character after `^`",
            ParseErrorKind::UnterminatedQuote,
        )),
        _ => error(PError::expected(i, "a `^X…X` literal")),
    }
}

/// The body of a delimited literal after its opening delimiter, up to and
/// including the closing one; doubled delimiters stand for one.
///
/// Compatible mode reproduces the scanner's EOF behaviour: a missing closing
/// delimiter, or a closing delimiter that is the very last byte, yields no
/// token at all (a recoverable error here).
fn delimited_body<'a, const S: bool>(
    start: In<'a>,
    d: u8,
    mut body: In<'a>,
) -> PResult<'a, Vec<u8>> {
    let mut text = Vec::new();
    loop {
        let Some(p) = body.iter().position(|&b| b == d) else {
            let e = PError::of_kind(
                start,
                "a closing delimiter for this literal",
                ParseErrorKind::UnterminatedQuote,
            );
            return if S { failure(e) } else { error(e) };
        };
        match body.get(p + 1) {
            Some(&next) if next == d => {
                text.extend_from_slice(&body[..=p]);
                body = &body[p + 2..];
            }
            None if !S => {
                return error(PError::of_kind(
                    start,
                    "a value",
                    ParseErrorKind::QuoteAtEndOfInput,
                ))
            }
            _ => {
                text.extend_from_slice(&body[..p]);
                return Ok((&body[p + 1..], text));
            }
        }
    }
}

/// Which lexical form a literal had (implicit concatenation cares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LiteralForm {
    /// `abc`
    Unquoted,
    /// `"abc"`, `'abc'` or `^XabcX`
    Quoted,
}

/// `literal = UNQUOTED | QUOTED | USER_QUOTED`, decoded to a `String`.
pub(crate) fn literal<const S: bool>(i: In<'_>) -> PResult<'_, (String, LiteralForm)> {
    let (rest, bytes, form) = match i.first() {
        Some(b'"' | b'\'') => {
            let (rest, v) = quoted_literal::<S>(i)?;
            (rest, v, LiteralForm::Quoted)
        }
        Some(b'^') => {
            let (rest, v) = user_quoted_literal::<S>(i)?;
            (rest, v, LiteralForm::Quoted)
        }
        _ => {
            let (rest, v) = unquoted_literal(i)?;
            (rest, v.to_vec(), LiteralForm::Unquoted)
        }
    };
    match String::from_utf8(bytes) {
        Ok(s) => Ok((rest, (s, form))),
        Err(_) => failure(PError::of_kind(
            i,
            "a literal that is valid UTF-8",
            ParseErrorKind::InvalidUtf8,
        )),
    }
}

/// `rel_op = "=" | "!=" | "<=" | "<" | ">=" | ">"` (no inner blanks).
pub(crate) fn rel_op(i: In<'_>) -> PResult<'_, RelOp> {
    fn op<'a>(
        t: &'static [u8],
        op: RelOp,
    ) -> impl Parser<In<'a>, Output = RelOp, Error = PError<'a>> {
        value(op, tag(t))
    }
    alt((
        op(b"=", RelOp::Eq),
        op(b"!=", RelOp::Ne),
        op(b"<=", RelOp::Le),
        op(b"<", RelOp::Lt),
        op(b">=", RelOp::Ge),
        op(b">", RelOp::Gt),
    ))
    .parse(i)
    .map_err(|_| {
        nom::Err::Error(PError::expected(
            i,
            "a relational operator (`=`, `!=`, `<`, `<=`, `>` or `>=`)",
        ))
    })
}

/// `boolean_op = "&" | "|" | "+"`.
pub(crate) fn boolean_op(i: In<'_>) -> PResult<'_, BoolOp> {
    match i.first() {
        Some(b'&') => Ok((&i[1..], BoolOp::And)),
        Some(b'|') => Ok((&i[1..], BoolOp::Or)),
        Some(b'+') => Ok((&i[1..], BoolOp::Multi)),
        _ => error(PError::expected(i, "`&`, `|` or `+`")),
    }
}

/// A single punctuation byte (`(`, `)`, `$`, `#`). A `(` that starts a
/// comment (`(*`) is not a parenthesis.
pub(crate) fn punct<'a>(i: In<'a>, b: u8, expected: &'static str) -> PResult<'a, ()> {
    match i {
        [b'(', b'*', ..] => error(PError::expected(i, expected)),
        [first, rest @ ..] if *first == b => Ok((rest, ())),
        _ => error(PError::expected(i, expected)),
    }
}

/// Compatible mode: is `i` (after trivia) somewhere the flex scanner returns
/// end-of-input? True at the real end, at an unmatched character, in an
/// unterminated comment, and at a quoted literal that is unterminated or
/// whose closing delimiter is the last byte.
pub(crate) fn is_effective_end(i: In<'_>) -> bool {
    if i.is_empty() || is_unmatched(i) || i.starts_with(b"(*") {
        return true;
    }
    if matches!(i.first(), Some(b'"' | b'\'' | b'^')) {
        return matches!(
            literal::<false>(i),
            Err(nom::Err::Error(PError {
                kind: ParseErrorKind::UnterminatedQuote | ParseErrorKind::QuoteAtEndOfInput,
                ..
            }))
        );
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit<const S: bool>(i: &str) -> Result<(String, &str), ParseErrorKind> {
        match literal::<S>(i.as_bytes()) {
            Ok((rest, (s, _))) => Ok((s, std::str::from_utf8(rest).expect("utf8"))),
            Err(nom::Err::Error(e) | nom::Err::Failure(e)) => Err(e.kind),
            Err(nom::Err::Incomplete(_)) => unreachable!("complete parsers"),
        }
    }

    #[test]
    fn unquoted_literal_classes() {
        assert_eq!(lit::<true>("a+b&c|d rest"), Ok(("a+b&c|d".into(), " rest")));
        assert_eq!(lit::<true>("/bin/date)"), Ok(("/bin/date".into(), ")")));
        assert_eq!(
            lit::<true>("a\rb c"),
            Ok(("a\rb".into(), " c")),
            "CR is literal"
        );
        assert_eq!(lit::<true>("x$(Y)"), Ok(("x".into(), "$(Y)")));
        assert!(lit::<true>("+a").is_err(), "`+` cannot start a literal");
        assert!(lit::<true>("~").is_err());
    }

    #[test]
    fn quoted_literal_doubles_its_delimiter() {
        assert_eq!(lit::<true>(r#""a""b" x"#), Ok((r#"a"b"#.into(), " x")));
        assert_eq!(lit::<true>("'it''s' x"), Ok(("it's".into(), " x")));
        assert_eq!(lit::<true>("\"a\\nb\" "), Ok(("a\\nb".into(), " ")));
        assert_eq!(lit::<true>("\"a\nb\" "), Ok(("a\nb".into(), " ")));
        assert_eq!(lit::<true>("\"\" "), Ok(("".into(), " ")));
    }

    #[test]
    fn user_delimited_literal() {
        assert_eq!(lit::<true>("^|a\"b'c| "), Ok(("a\"b'c".into(), " ")));
        assert_eq!(lit::<true>("^|a||b| "), Ok(("a|b".into(), " ")));
        assert_eq!(lit::<true>("^ a b )"), Ok(("a".into(), "b )")));
        assert_eq!(lit::<true>("^||a"), Ok(("".into(), "a")));
    }

    #[test]
    fn quote_at_end_of_input_differs_by_mode() {
        assert_eq!(lit::<true>("\"abc\""), Ok(("abc".into(), "")));
        assert_eq!(
            lit::<false>("\"abc\""),
            Err(ParseErrorKind::QuoteAtEndOfInput)
        );
        assert_eq!(lit::<false>("\"abc\" "), Ok(("abc".into(), " ")));
        assert_eq!(
            lit::<false>("\"abc"),
            Err(ParseErrorKind::UnterminatedQuote)
        );
        assert_eq!(lit::<true>("\"abc"), Err(ParseErrorKind::UnterminatedQuote));
        assert_eq!(lit::<true>("^"), Err(ParseErrorKind::UnterminatedQuote));
    }

    #[test]
    fn trivia_skips_blanks_and_comments() {
        let rest = |s: &'static str| trivia::<true>(s.as_bytes()).map(|(r, _)| r);
        assert_eq!(rest(" \t\n(* c *) (**)x"), Ok(&b"x"[..]));
        assert_eq!(rest("\rx"), Ok(&b"\rx"[..]), "CR is not a blank");
        assert_eq!(
            rest("(* a (* b *) c"),
            Ok(&b"c"[..]),
            "comments do not nest"
        );
        assert!(rest("(*)").is_err(), "`(*)` does not close itself");
        assert_eq!(
            trivia::<false>(b" (* open").map(|(r, _)| r),
            Ok(&b"(* open"[..]),
            "compatible mode stops at an unterminated comment"
        );
    }

    #[test]
    fn operators() {
        assert_eq!(rel_op(b">=1"), Ok((&b"1"[..], RelOp::Ge)));
        assert_eq!(rel_op(b"!=1"), Ok((&b"1"[..], RelOp::Ne)));
        assert_eq!(rel_op(b"<1"), Ok((&b"1"[..], RelOp::Lt)));
        assert!(rel_op(b"! =").is_err());
        assert_eq!(boolean_op(b"+("), Ok((&b"("[..], BoolOp::Multi)));
        assert!(punct(b"(*", b'(', "`(`").is_err());
    }

    #[test]
    fn effective_end() {
        for s in [
            "", "~junk", "?", "*)", "!x", "^", "(* open", "\"abc\"", "\"abc", "^|x|",
        ] {
            assert!(is_effective_end(s.as_bytes()), "{s:?}");
        }
        for s in ["!=", "(y)", "\"abc\" ", "x", "^|x| "] {
            assert!(!is_effective_end(s.as_bytes()), "{s:?}");
        }
    }
}
