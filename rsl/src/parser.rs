//! The RSL grammar (REFERENCE-NOTES A.3, `globus_rsl_parser.y`) as nom
//! productions over bytes, one function per rule, plus the entry points that
//! turn nom's result into an owned [`Rsl`] or a located [`ParseError`].
//!
//! Two resource limits apply. [`MAX_NESTING`] bounds parentheses and
//! concatenation chains so no input can exhaust the Rust stack. In
//! compatible mode the parser also counts the symbols bison would hold on
//! its stack and fails where libglobus-rsl's 10000-entry stack overflows
//! (e.g. a relation with 9995 values inside `&( )`), so the two parsers
//! agree on such inputs too.

use nom::combinator::cut;
use nom::error::context;
use nom::multi::many1;
use nom::Parser;

use crate::ast::{BoolOp, Relation, Rsl, Value};
use crate::error::{ParseDetails, ParseError, ParseErrorKind};
use crate::lexer::{
    boolean_op, error, failure, is_effective_end, is_unmatched, is_unquoted_first, literal, punct,
    rel_op, trivia, unquoted_literal, In, LiteralForm, PError, PResult,
};
use crate::Mode;

/// Deepest nesting of parentheses, `$( )` and `#` chains accepted (in both
/// modes), chosen so that even an unoptimised build parses, evaluates and
/// drops the deepest accepted tree within a 2 MiB thread stack.
/// libglobus-rsl accepts deeper inputs (thousands of levels, up to its
/// parser stack size); real specifications nest a handful of levels.
pub const MAX_NESTING: u32 = 128;

/// bison's `YYMAXDEPTH`: the parse fails once the stack holds this many
/// states (the initial state plus 9999 symbols).
const BISON_STACK_LIMIT: u32 = 9999;

/// Where a production starts: symbols on the (emulated) bison stack and the
/// current nesting depth.
#[derive(Debug, Clone, Copy)]
struct Depth {
    stack: u32,
    nest: u32,
}

impl Depth {
    const TOP: Depth = Depth { stack: 0, nest: 0 };

    fn at(self, stack: u32) -> Depth {
        Depth { stack, ..self }
    }
}

/// Account for one shifted token: bison would now hold `symbols` symbols.
fn shift<const S: bool>(i: In<'_>, symbols: u32) -> Result<(), nom::Err<PError<'_>>> {
    if !S && symbols >= BISON_STACK_LIMIT {
        return Err(nom::Err::Failure(PError::of_kind(
            i,
            "a shorter specification",
            ParseErrorKind::ParserStackExhausted,
        )));
    }
    Ok(())
}

/// Enter one more level of nesting.
fn enter(i: In<'_>, d: Depth) -> Result<Depth, nom::Err<PError<'_>>> {
    if d.nest >= MAX_NESTING {
        return Err(nom::Err::Failure(PError::of_kind(
            i,
            "less deeply nested parentheses",
            ParseErrorKind::TooDeep,
        )));
    }
    Ok(Depth {
        nest: d.nest + 1,
        ..d
    })
}

/// `")"` closing a group, after optional blanks/comments.
fn close<'a, const S: bool>(i: In<'a>, symbols: u32, expected: &'static str) -> PResult<'a, ()> {
    let (i, ()) = trivia::<S>(i)?;
    let (i, ()) = punct(i, b')', expected)?;
    shift::<S>(i, symbols)?;
    Ok((i, ()))
}

/// `rsl = specification` followed only by blanks and comments (compatible
/// mode: or by anything the scanner treats as end of input, A.2).
fn rsl<const S: bool>(i: In<'_>) -> PResult<'_, Rsl> {
    let (i, spec) = specification::<S>(i, Depth::TOP)?;
    let (i, ()) = trivia::<S>(i)?;
    end_of_input::<S>(i)?;
    Ok((i, spec))
}

/// `job_spec = spec_list | specification` — ResourceBroker's dialect, never
/// used for Globus compatibility: a leading `(` means the operands of an
/// implicit `&`, so `(module="pvm")(adaptive=yes)` is
/// `&(module="pvm")(adaptive=yes)`. Always strict.
fn job_spec(i: In<'_>) -> PResult<'_, Rsl> {
    let (i, ()) = trivia::<true>(i)?;
    let (i, spec) = if punct(i, b'(', "").is_ok() {
        let (i, operands) = spec_list::<true>(i, Depth::TOP)?;
        let spec = Rsl::Boolean {
            op: BoolOp::And,
            operands,
        };
        (i, spec)
    } else {
        specification::<true>(i, Depth::TOP)?
    };
    let (i, ()) = trivia::<true>(i)?;
    end_of_input::<true>(i)?;
    Ok((i, spec))
}

fn end_of_input<const S: bool>(i: In<'_>) -> PResult<'_, ()> {
    if i.is_empty() || (!S && is_effective_end(i)) {
        return Ok((i, ()));
    }
    if S && matches!(i.first(), Some(b'"' | b'\'' | b'^')) {
        // Report an unterminated trailing quote as such.
        literal::<true>(i)?;
    }
    failure(PError::expected(i, "end of input after the specification"))
}

/// `specification = boolean_op spec_list | relation`
fn specification<const S: bool>(i: In<'_>, d: Depth) -> PResult<'_, Rsl> {
    let (i, ()) = trivia::<S>(i)?;
    if let Ok((rest, op)) = boolean_op(i) {
        shift::<S>(rest, d.stack + 1)?;
        let operands = |r| spec_list::<S>(r, d.at(d.stack + 1));
        let (rest, operands) = cut(context("boolean composition", operands)).parse(rest)?;
        return Ok((rest, Rsl::Boolean { op, operands }));
    }
    match relation::<S>(i, d) {
        Ok((rest, rel)) => Ok((rest, Rsl::Relation(rel))),
        Err(nom::Err::Error(e)) if e.at.len() == i.len() && e.kind == ParseErrorKind::Syntax => {
            error(PError::expected(i, "`&`, `|`, `+` or an attribute name"))
        }
        Err(e) => Err(e),
    }
}

/// `spec_list = "(" specification ")" { "(" specification ")" }`
fn spec_list<const S: bool>(i: In<'_>, d: Depth) -> PResult<'_, Vec<Rsl>> {
    let mut k = 0;
    many1(move |i| {
        let base = d.stack + 3 * k;
        k += 1;
        operand::<S>(i, d, base)
    })
    .parse(i)
}

/// One operand of a boolean: `"(" specification ")"`.
fn operand<const S: bool>(i: In<'_>, d: Depth, base: u32) -> PResult<'_, Rsl> {
    let (i, ()) = trivia::<S>(i)?;
    let (i, ()) = punct(i, b'(', "`(` to start an operand")?;
    shift::<S>(i, base + 1)?;
    let d = enter(i, d)?.at(base + 1);
    let (i, spec) = cut(|i| specification::<S>(i, d)).parse(i)?;
    let (i, ()) = cut(|i| close::<S>(i, base + 3, "`)` to close the operand")).parse(i)?;
    Ok((i, spec))
}

/// `relation = literal rel_op value_sequence`
fn relation<const S: bool>(i: In<'_>, d: Depth) -> PResult<'_, Relation> {
    let (i, ()) = trivia::<S>(i)?;
    let (i, (attribute, _)) = literal::<S>(i)?;
    shift::<S>(i, d.stack + 1)?;
    let (i, ()) = trivia::<S>(i)?;
    let (i, op) = cut(rel_op).parse(i)?;
    shift::<S>(i, d.stack + 2)?;
    let values = |i| value_sequence::<S>(i, d.at(d.stack + 2));
    let (i, values) = cut(context("relation", values)).parse(i)?;
    Ok((
        i,
        Relation {
            attribute,
            op,
            values,
        },
    ))
}

/// `value_sequence = value { value }`
fn value_sequence<const S: bool>(i: In<'_>, d: Depth) -> PResult<'_, Vec<Value>> {
    let mut k = 0;
    many1(move |i| {
        let base = d.stack + k;
        k += 1;
        value::<S>(i, d.at(base))
    })
    .parse(i)
}

/// `value = "(" value_sequence ")" | simple_value`
fn value<const S: bool>(i: In<'_>, d: Depth) -> PResult<'_, Value> {
    let (i, ()) = trivia::<S>(i)?;
    let Ok((rest, ())) = punct(i, b'(', "") else {
        return simple_value::<S>(i, d);
    };
    shift::<S>(rest, d.stack + 1)?;
    let inner = enter(rest, d)?.at(d.stack + 1);
    let (rest, seq) = cut(|r| value_sequence::<S>(r, inner)).parse(rest)?;
    let (rest, ()) =
        cut(|r| close::<S>(r, d.stack + 3, "`)` to close the sequence")).parse(rest)?;
    Ok((rest, Value::Sequence(seq)))
}

/// `simple_value = (literal | variable) [ "#" simple_value ]`
///
/// The `#` is implicit (injected by the scanner) between an unquoted literal
/// and an adjacent `$`, and between a variable's closing `)` and an adjacent
/// unquoted literal or `$`. Chains nest to the right, as bison shifts.
fn simple_value<const S: bool>(i: In<'_>, d: Depth) -> PResult<'_, Value> {
    let (i, ()) = trivia::<S>(i)?;
    let (rest, left, implicit) = if i.first() == Some(&b'$') {
        let (rest, var) = variable::<S>(i, d)?;
        let adjacent = rest
            .first()
            .is_some_and(|&b| b == b'$' || is_unquoted_first(b));
        (rest, var, adjacent)
    } else {
        let (rest, (text, form)) = literal::<S>(i).map_err(|e| {
            e.map(|e| match e.kind {
                ParseErrorKind::Syntax => PError::expected(i, "a value"),
                _ => e,
            })
        })?;
        shift::<S>(rest, d.stack + 1)?;
        let adjacent = form == LiteralForm::Unquoted && rest.first() == Some(&b'$');
        (rest, Value::Literal(text), adjacent)
    };
    let rest = if implicit {
        rest
    } else {
        let (rest, ()) = trivia::<S>(rest)?;
        match punct(rest, b'#', "") {
            Ok((rest, ())) => rest,
            Err(_) => return Ok((rest, left)),
        }
    };
    shift::<S>(rest, d.stack + 2)?;
    let right = enter(rest, d)?.at(d.stack + 2);
    let (rest, right) =
        cut(context("concatenation", |r| simple_value::<S>(r, right))).parse(rest)?;
    Ok((rest, Value::Concat(Box::new(left), Box::new(right))))
}

/// `variable = "$" "(" value_sequence ")"`
fn variable<const S: bool>(i: In<'_>, d: Depth) -> PResult<'_, Value> {
    let (rest, ()) = punct(i, b'$', "`$`")?;
    shift::<S>(rest, d.stack + 1)?;
    let (rest, ()) = trivia::<S>(rest)?;
    let (rest, ()) = cut(|r| punct(r, b'(', "`(` after `$`")).parse(rest)?;
    shift::<S>(rest, d.stack + 2)?;
    let inner = enter(rest, d)?.at(d.stack + 2);
    let (rest, seq) = cut(context("variable", |r| value_sequence::<S>(r, inner))).parse(rest)?;
    let (rest, ()) = cut(|r| close::<S>(r, d.stack + 4, "`)` to close `$(`")).parse(rest)?;
    Ok((rest, Value::Variable(seq)))
}

/// Parse a whole input in `mode` (see [`Mode`]).
pub(crate) fn parse(input: &[u8], mode: Mode) -> Result<Rsl, ParseError> {
    let result = match mode {
        Mode::Compatible => {
            // A C caller passes a NUL-terminated string: the text ends there.
            let end = input.iter().position(|&b| b == 0).unwrap_or(input.len());
            rsl::<false>(&input[..end])
        }
        Mode::Strict => rsl::<true>(input),
    };
    finish(input, mode, result)
}

/// Parse a ResourceBroker job spec (strict, implicit `&`, see [`job_spec`]).
pub(crate) fn parse_job(input: &[u8]) -> Result<Rsl, ParseError> {
    finish(input, Mode::Strict, job_spec(input))
}

fn finish(input: &[u8], mode: Mode, result: PResult<'_, Rsl>) -> Result<Rsl, ParseError> {
    match result {
        Ok((_, rsl)) => Ok(rsl),
        Err(nom::Err::Error(e) | nom::Err::Failure(e)) => Err(locate(input, mode, e)),
        Err(nom::Err::Incomplete(_)) => Err(locate(
            input,
            mode,
            PError::expected(&input[input.len()..], "more input"),
        )),
    }
}

/// Turn an internal error into a located, explained [`ParseError`].
fn locate(input: &[u8], mode: Mode, e: PError<'_>) -> ParseError {
    let offset = input.len().saturating_sub(e.at.len());
    let kind = match (mode, e.kind) {
        (Mode::Strict, ParseErrorKind::Syntax) if e.at.first() == Some(&0) => {
            ParseErrorKind::NulByte
        }
        (Mode::Strict, ParseErrorKind::Syntax) if is_unmatched(e.at) => {
            ParseErrorKind::UnexpectedCharacter
        }
        (_, kind) => kind,
    };
    let line_start = input[..offset]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    let line_end = input[offset..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(input.len(), |p| offset + p);
    let expected = match e.context {
        Some(ctx) => format!("{} (in a {ctx})", e.expected),
        None => e.expected.to_string(),
    };
    ParseError::new(ParseDetails {
        kind,
        offset,
        line: input[..offset].iter().filter(|&&b| b == b'\n').count() + 1,
        column: String::from_utf8_lossy(&input[line_start..offset])
            .chars()
            .count()
            + 1,
        expected,
        found: describe(e.at),
        excerpt: String::from_utf8_lossy(&input[line_start..line_end]).into_owned(),
        help: help(kind, mode, e.at),
    })
}

/// A short description of the token at `at`.
fn describe(at: &[u8]) -> String {
    match at.first() {
        None => "end of input".into(),
        Some(b'\n') => "a newline".into(),
        Some(b'\r') => "a carriage return (`\\r`)".into(),
        Some(b'\t') => "a tab".into(),
        Some(0) => "a NUL byte".into(),
        Some(b'"' | b'\'' | b'^') => "a quoted literal".into(),
        Some(_) => {
            if let Ok((_, word)) = unquoted_literal(at) {
                let word = String::from_utf8_lossy(word);
                let short: String = word.chars().take(24).collect();
                let more = if short.len() < word.len() { "…" } else { "" };
                return format!("`{short}{more}`");
            }
            let len = at.len().min(4);
            let c = (1..=len)
                .find_map(|n| std::str::from_utf8(&at[..n]).ok())
                .and_then(|s| s.chars().next());
            match c {
                Some(c) => format!("`{c}`"),
                None => format!("byte 0x{:02x}", at[0]),
            }
        }
    }
}

/// The `help:` line for an error, when there is something useful to say.
fn help(kind: ParseErrorKind, mode: Mode, at: &[u8]) -> Option<String> {
    let text = match kind {
        ParseErrorKind::UnexpectedCharacter => "no RSL token starts with this character; quote values containing `* ? ~ ! ^ = < > ( ) \" ' $ #` (libglobus-rsl would silently ignore everything from here on)".into(),
        ParseErrorKind::UnterminatedComment => "close the comment with `*)` (comments do not nest)".into(),
        ParseErrorKind::UnterminatedQuote => "close the literal with its delimiter; double the delimiter to include it (\"a\"\"b\")".into(),
        ParseErrorKind::QuoteAtEndOfInput => "libglobus-rsl drops a quoted literal whose closing quote is the last byte of the input; add a newline after it, or parse in strict mode".into(),
        ParseErrorKind::NulByte => "RSL text cannot contain NUL bytes".into(),
        ParseErrorKind::TooDeep => format!("nesting deeper than {MAX_NESTING} levels (parentheses, `$(`, `#` chains) is not supported"),
        ParseErrorKind::ParserStackExhausted => "libglobus-rsl's parser stack holds 10000 entries; split very long value lists or nesting".into(),
        ParseErrorKind::InvalidUtf8 => "RSL text must be UTF-8 (a `^X` delimiter must be an ASCII character)".into(),
        ParseErrorKind::Syntax => match at.first() {
            Some(b'\r') => "RSL treats `\\r` as text, not as a blank: convert CRLF line endings to LF".into(),
            Some(_) if mode == Mode::Compatible && is_effective_end(at) => "libglobus-rsl stops reading here (unmatched character, unterminated comment or quote), so the specification is incomplete".into(),
            _ => return None,
        },
    };
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ast::RelOp;

    fn lit(s: &str) -> Value {
        Value::Literal(s.into())
    }

    /// Run a production in strict mode; return its output and what is left.
    fn run<'a, O>(p: impl Fn(In<'a>, Depth) -> PResult<'a, O>, input: &'a str) -> (O, &'a str) {
        let (rest, out) = p(input.as_bytes(), Depth::TOP).expect("production succeeds");
        (out, std::str::from_utf8(rest).expect("utf8"))
    }

    #[test]
    fn specification_production() {
        let (spec, rest) = run(specification::<true>, "&(a=1)(b=2) tail");
        assert!(
            matches!(spec, Rsl::Boolean { op: BoolOp::And, ref operands } if operands.len() == 2)
        );
        assert_eq!(rest, " tail");
        let (spec, rest) = run(specification::<true>, "x = 1 )");
        assert!(matches!(spec, Rsl::Relation(_)));
        assert_eq!(rest, ")");
    }

    #[test]
    fn spec_list_production() {
        let (ops, rest) = run(spec_list::<true>, "(a=1) (* c *) (+(b=2)) x");
        assert_eq!(ops.len(), 2);
        assert_eq!(rest, " x");
    }

    #[test]
    fn relation_production() {
        let (rel, rest) = run(relation::<true>, "\"A b\" >= 1 (2 3) )");
        assert_eq!(rel.attribute, "A b");
        assert_eq!(rel.op, RelOp::Ge);
        assert_eq!(
            rel.values,
            vec![lit("1"), Value::Sequence(vec![lit("2"), lit("3")])]
        );
        assert_eq!(rest, " )");
    }

    #[test]
    fn value_sequence_production() {
        let (values, rest) = run(value_sequence::<true>, "a 'b' ^|c| )");
        assert_eq!(values, vec![lit("a"), lit("b"), lit("c")]);
        assert_eq!(rest, ")");
    }

    #[test]
    fn value_production() {
        let (v, rest) = run(value::<true>, "((a) b) c");
        assert_eq!(
            v,
            Value::Sequence(vec![Value::Sequence(vec![lit("a")]), lit("b")])
        );
        assert_eq!(rest, " c");
    }

    #[test]
    fn simple_value_production() {
        let var = |n: &str| Value::Variable(vec![lit(n)]);
        let cat = |l, r| Value::Concat(Box::new(l), Box::new(r));
        let (v, rest) = run(simple_value::<true>, "a$(B)c d");
        assert_eq!(v, cat(lit("a"), cat(var("B"), lit("c"))));
        assert_eq!(
            rest, "d",
            "blanks after a value are consumed looking for `#`"
        );
        let (v, rest) = run(simple_value::<true>, "\"a\" # b # c)");
        assert_eq!(v, cat(lit("a"), cat(lit("b"), lit("c"))), "right-nested");
        assert_eq!(rest, ")");
        let (v, rest) = run(simple_value::<true>, "$(A)\"b\"");
        assert_eq!(v, var("A"), "no implicit # before a quoted literal");
        assert_eq!(rest, "\"b\"");
    }

    #[test]
    fn variable_production() {
        let (v, rest) = run(variable::<true>, "$ (* c *) (A (b) c)d");
        assert_eq!(
            v,
            Value::Variable(vec![lit("A"), Value::Sequence(vec![lit("b")]), lit("c")])
        );
        assert_eq!(rest, "d");
    }

    #[test]
    fn job_spec_production() {
        let (rest, spec) = job_spec(b" (a=1)(b=2) ").expect("bare form");
        assert!(
            matches!(spec, Rsl::Boolean { op: BoolOp::And, ref operands } if operands.len() == 2)
        );
        assert!(rest.is_empty());
        assert!(job_spec(b"&(a=1)").is_ok());
    }
}
