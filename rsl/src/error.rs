//! Errors of the `rsl` crate: where parsing failed and why, what evaluation
//! or unparsing could not do, and what is wrong with a job spec.
//!
//! A [`ParseError`] carries the 1-based line and column (in characters), the
//! byte offset, what the parser expected, what it found, and renders a caret
//! excerpt of the offending line:
//!
//! ```text
//! error: expected `)` to close the relation, found `~`
//!  --> line 1, column 6
//!   |
//! 1 | &(x=1~)
//!   |      ^
//!   = help: ...
//! ```

use std::fmt;

use thiserror::Error;

/// Any error this crate reports.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RslError {
    /// The text is not valid RSL (in the selected mode).
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// `$(…)` or `rsl_substitution` could not be evaluated.
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// The tree has no RSL text form (see [`UnparseError`]).
    #[error(transparent)]
    Unparse(#[from] UnparseError),
    /// The RSL is fine but is not a valid ResourceBroker job spec.
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// What kind of parse failure happened (for callers and tests to match on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// A token the grammar does not allow here.
    Syntax,
    /// Strict mode: a character no RSL token starts with (`~ ? * !` …),
    /// where libglobus-rsl silently stops reading.
    UnexpectedCharacter,
    /// Strict mode: `(*` without `*)`.
    UnterminatedComment,
    /// Strict mode: a quoted or `^X` literal without its closing delimiter.
    UnterminatedQuote,
    /// Compatible mode: a quoted literal whose closing delimiter is the last
    /// byte of the input is dropped by libglobus-rsl.
    QuoteAtEndOfInput,
    /// Strict mode: a NUL byte (C callers would see the input end there).
    NulByte,
    /// Parentheses nested deeper than [`crate::MAX_NESTING`].
    TooDeep,
    /// Compatible mode: the input needs more than the 10000-entry parser
    /// stack libglobus-rsl's bison parser has (e.g. ≥ 9995 values in one
    /// relation).
    ParserStackExhausted,
    /// A literal is not valid UTF-8 (only possible with `^X` delimiters that
    /// split a multi-byte character, or with non-UTF-8 byte input).
    InvalidUtf8,
}

/// A located parse error with a caret excerpt. The details live behind a
/// box (keeping `Result<Rsl, ParseError>` small) and are reachable as fields
/// through `Deref`: `err.line`, `err.kind`, …
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct ParseError(Box<ParseDetails>);

impl ParseError {
    pub(crate) fn new(details: ParseDetails) -> Self {
        ParseError(Box::new(details))
    }
}

impl std::ops::Deref for ParseError {
    type Target = ParseDetails;

    fn deref(&self) -> &ParseDetails {
        &self.0
    }
}

/// Everything known about a parse error (see [`ParseError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseDetails {
    /// What went wrong, coarsely.
    pub kind: ParseErrorKind,
    /// Byte offset of the error in the input.
    pub offset: usize,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What the parser expected at this point (e.g. "`)` to close the relation").
    pub expected: String,
    /// What it found there (e.g. "`~`", "end of input").
    pub found: String,
    /// The offending source line (without its newline).
    pub excerpt: String,
    /// A hint on how to fix it, when there is one.
    pub help: Option<String>,
}

impl fmt::Display for ParseDetails {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "expected {}, found {}", self.expected, self.found)?;
        writeln!(f, " --> line {}, column {}", self.line, self.column)?;
        let gutter = self.line.to_string();
        let pad = " ".repeat(gutter.len());
        writeln!(f, "{pad} |")?;
        let (shown, caret) = excerpt_window(&printable_line(&self.excerpt), self.column);
        writeln!(f, "{gutter} | {shown}")?;
        write!(f, "{pad} | {}^", " ".repeat(caret))?;
        if let Some(help) = &self.help {
            write!(f, "\n{pad} = help: {help}")?;
        }
        Ok(())
    }
}

/// At most this many characters of the offending line are shown (a one-line spec of
/// megabytes would otherwise flood the terminal).
pub const MAX_EXCERPT_CHARS: usize = 200;

/// The part of `line` shown under an error at 1-based `column`: the whole line when it is
/// short, else [`MAX_EXCERPT_CHARS`] characters around the column with `…` where text was
/// cut. Returns the text and the caret's 0-based character offset in it.
fn excerpt_window(line: &str, column: usize) -> (String, usize) {
    let chars: Vec<char> = line.chars().collect();
    let at = column.saturating_sub(1).min(chars.len());
    if chars.len() <= MAX_EXCERPT_CHARS {
        return (line.to_string(), at);
    }
    // The error column in the middle, `…` where text was cut: one at a cut end, two in the
    // middle of the line.
    let n = chars.len();
    let half = (MAX_EXCERPT_CHARS - 2) / 2;
    let (start, end) = if at <= half {
        (0, MAX_EXCERPT_CHARS - 1)
    } else if at - half + MAX_EXCERPT_CHARS - 2 >= n {
        (n - (MAX_EXCERPT_CHARS - 1), n)
    } else {
        (at - half, at - half + MAX_EXCERPT_CHARS - 2)
    };
    let mut shown = String::new();
    if start > 0 {
        shown.push('…');
    }
    shown.extend(&chars[start..end]);
    if end < n {
        shown.push('…');
    }
    (shown, at - start + usize::from(start > 0))
}

/// Render control characters of an excerpt visibly but keep one character per
/// column, so the caret stays aligned.
fn printable_line(line: &str) -> String {
    line.chars()
        .map(|c| match c {
            '\t' => ' ',
            c if c.is_control() => '\u{fffd}',
            c => c,
        })
        .collect()
}

/// Why `globus_rsl_eval` semantics reject a tree.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EvalError {
    /// `$(NAME)` with no binding in any enclosing scope.
    #[error("variable `{name}` is not defined (define it earlier with (rsl_substitution = ({name} VALUE)))")]
    Unbound {
        /// The variable name.
        name: String,
    },
    /// `$(NAME default)`: RSL parses a default but never honours it.
    #[error("variable `{name}` has {count} elements; only `$(NAME)` can be evaluated (defaults are not supported)")]
    VariableArity {
        /// The variable name.
        name: String,
        /// The number of elements inside `$( )`.
        count: usize,
    },
    /// `$(…)` whose first element is not a plain literal.
    #[error("a variable name must be a literal, not a sequence, variable or concatenation")]
    ComputedName,
    /// An `rsl_substitution` value that is not a parenthesised pair.
    #[error("`{attribute}` values must be pairs like (NAME VALUE); found a non-sequence value")]
    SubstitutionNotSequence {
        /// The attribute as written.
        attribute: String,
    },
    /// An `rsl_substitution` pair with the wrong number of elements.
    #[error("`{attribute}` pairs must have exactly 2 elements (NAME VALUE); found {count}")]
    SubstitutionArity {
        /// The attribute as written.
        attribute: String,
        /// The number of elements found.
        count: usize,
    },
    /// A concatenation operand that is a sequence (only in hand-built trees).
    #[error("a concatenation operand must be a literal or a variable, not a sequence")]
    ConcatenatedSequence,
    /// An `rsl_substitution` name or value that is itself a sequence.
    #[error("`{attribute}` pair elements must be single values, not sequences")]
    SubstitutionNested {
        /// The attribute as written.
        attribute: String,
    },
}

/// Why a tree cannot be unparsed (`globus_rsl_unparse` returns NULL).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UnparseError {
    /// A variable whose first element is not a literal (`$(A # B)`,
    /// `$($(N))`, `$((A) x)`): the unparser cannot name it.
    #[error(
        "cannot unparse a variable whose name is not a literal (e.g. `$(A # B)` or `$($(N))`)"
    )]
    ComputedVariableName,
}

/// Why an evaluated RSL is not an acceptable ResourceBroker job spec.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    /// An attribute ResourceBroker does not know.
    #[error("unknown attribute `{attribute}`{}", suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
    UnknownAttribute {
        /// The attribute as written.
        attribute: String,
        /// The closest known attribute, if any is close.
        suggestion: Option<String>,
    },
    /// The same attribute given twice (in any spelling) with the same operator.
    #[error("attribute `{attribute}` is given more than once (first as `{first}`)")]
    Duplicate {
        /// The attribute as written the second time.
        attribute: String,
        /// How it was written the first time.
        first: String,
    },
    /// Constraints that no value can satisfy (e.g. `count>=8` with `count<=2`).
    #[error("contradictory constraints on `{attribute}`: {detail}")]
    Contradiction {
        /// The canonical attribute name.
        attribute: String,
        /// Which constraints clash.
        detail: String,
    },
    /// An operator the attribute does not support (e.g. `arch>=x`).
    #[error("`{attribute}` does not support `{op}` (use {allowed})")]
    Operator {
        /// The attribute as written.
        attribute: String,
        /// The operator used.
        op: String,
        /// The operators it does support.
        allowed: String,
    },
    /// A value of the wrong shape or type.
    #[error("bad value for `{attribute}`: {detail}")]
    Value {
        /// The attribute as written.
        attribute: String,
        /// What is wrong.
        detail: String,
    },
    /// A composition the job spec cannot express.
    #[error("{0}")]
    Shape(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Mode, Rsl};

    /// The excerpt line and the caret line of a rendered parse error.
    fn excerpt_and_caret(shown: &str) -> (String, String) {
        let lines: Vec<&str> = shown.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("1 | "))
            .expect("excerpt");
        (lines[at][4..].to_string(), lines[at + 1][4..].to_string())
    }

    #[test]
    fn a_long_offending_line_is_cut_to_200_characters_around_the_error() {
        let text = format!("&(x = {}~{})", "1 ".repeat(3000), " 2".repeat(3000));
        let err = Rsl::parse_bytes(text.as_bytes(), Mode::Strict).expect_err("`~` in strict");
        let shown = err.to_string();
        let (excerpt, caret) = excerpt_and_caret(&shown);
        assert!(excerpt.chars().count() <= MAX_EXCERPT_CHARS, "{excerpt}");
        assert_eq!(excerpt.chars().count(), MAX_EXCERPT_CHARS, "{excerpt}");
        assert!(
            excerpt.starts_with('…') && excerpt.ends_with('…'),
            "{excerpt}"
        );
        let caret_at = caret.chars().count() - 1;
        assert_eq!(excerpt.chars().nth(caret_at), Some('~'), "{shown}");
        assert!(
            shown.contains(&format!("column {}", 6 + 6000 + 1)),
            "{shown}"
        );
    }

    #[test]
    fn an_error_near_either_end_of_a_long_line_keeps_that_end() {
        let line: String = "abcdefghij".repeat(50);
        let (shown, caret) = excerpt_window(&line, 3);
        assert_eq!(shown.chars().count(), MAX_EXCERPT_CHARS);
        assert!(!shown.starts_with('…'));
        assert!(shown.starts_with("abc") && shown.ends_with('…'));
        assert_eq!(caret, 2);
        let (shown, caret) = excerpt_window(&line, 500);
        assert_eq!(shown.chars().count(), MAX_EXCERPT_CHARS);
        assert!(shown.starts_with('…') && shown.ends_with("hij"));
        assert_eq!(shown.chars().nth(caret), Some('j'));
        assert_eq!(excerpt_window("short", 9), ("short".to_string(), 5));
    }
}
