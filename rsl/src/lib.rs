//! Globus RSL (Resource Specification Language, GT2 RSL v1.0) for
//! ResourceBroker: a parser that agrees with libglobus-rsl byte for byte,
//! the canonical unparse, attribute canonicalisation, `rsl_substitution`
//! evaluation, and the typed [`JobSpec`] users describe jobs with
//! (`+(count>=4)(arch="i86Linux")(module="pvm")`).
//!
//! ```
//! use rsl::{JobSpec, Mode, Rsl};
//!
//! let rsl: Rsl = "&(executable=/bin/date)(count=4)".parse()?;
//! assert_eq!(rsl.unparse()?, r#"&("executable" = "/bin/date" )("count" = "4" )"#);
//!
//! // Globus' own quirks, reproduced on request:
//! assert!(Rsl::parse(r#"x = "abc""#, Mode::Compatible).is_err());
//! assert!(Rsl::parse(r#"x = "abc""#, Mode::Strict).is_ok());
//!
//! let spec = JobSpec::from_rsl_text(r#"(count>=4)(module="pvm")(adaptive=yes)"#)?;
//! assert_eq!(spec.parts[0].count.min, 4);
//! assert!(spec.parts[0].adaptive);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Modes
//!
//! * [`Mode::Compatible`] reproduces libglobus-rsl exactly, quirks included:
//!   a quoted literal whose closing quote is the last byte is lost (so
//!   `x = "abc"` fails), and the input silently ends at a character no token
//!   starts with (`~ ? * !`, `^` at the end), inside an unterminated comment
//!   or quote, or at a NUL byte.
//! * [`Mode::Strict`] (the default, and what [`JobSpec`] uses) accepts a
//!   closing quote at the end and reports the truncation cases as errors.
//!
//! Both modes share the grammar and the lexical rules otherwise (`\r` is
//! literal text, comments separate tokens, implicit `#`, …); see
//! `rsl/README.md` and REFERENCE-NOTES part A.
//!
//! # Layout
//!
//! * [`ast`] — the owned tree ([`Rsl`], [`Relation`], [`Value`]) and
//!   [`canonical_name`].
//! * `lexer` — lexical productions (literals, blanks, comments, operators).
//! * `parser` — grammar productions and error location.
//! * `unparse` — [`Rsl::unparse`], identical to `globus_rsl_unparse`.
//! * [`eval`] — [`SymbolTable`] and [`Rsl::evaluate`].
//! * [`spec`] — [`JobSpec`], ResourceBroker's typed job description.
//! * [`cli`] — the `rb rsl check|spec` subcommands.
//! * [`error`] — [`RslError`] and friends.

pub mod ast;
pub mod cli;
pub mod error;
pub mod eval;
pub mod input;
mod lexer;
mod parser;
pub mod spec;
mod unparse;

use std::str::FromStr;

pub use ast::{canonical_name, BoolOp, RelOp, Relation, Rsl, Value};
pub use error::{
    EvalError, ParseDetails, ParseError, ParseErrorKind, RslError, SpecError, UnparseError,
};
pub use eval::SymbolTable;
pub use parser::MAX_NESTING;
pub use spec::{Count, JobPart, JobSpec};

/// How closely to follow libglobus-rsl's quirks (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Byte-for-byte what `globus_rsl_parse` accepts.
    Compatible,
    /// Report libglobus-rsl's silent truncations as errors.
    #[default]
    Strict,
}

impl Rsl {
    /// Parse RSL text in `mode`.
    pub fn parse(text: &str, mode: Mode) -> Result<Rsl, ParseError> {
        parser::parse(text.as_bytes(), mode)
    }

    /// Parse raw bytes (RSL is 8-bit text; literals must still be UTF-8).
    pub fn parse_bytes(bytes: &[u8], mode: Mode) -> Result<Rsl, ParseError> {
        parser::parse(bytes, mode)
    }

    /// Parse a ResourceBroker job spec: strict mode, and a leading `(` means
    /// an implicit `&` (`(module="pvm")(adaptive=yes)`). Not Globus syntax.
    pub fn parse_job(text: &str) -> Result<Rsl, ParseError> {
        parser::parse_job(text.as_bytes())
    }
}

/// Strict parsing: `"&(count=4)".parse::<Rsl>()`.
impl FromStr for Rsl {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Rsl::parse(text, Mode::Strict)
    }
}
