//! Reading a policy file's TOML: which keys it sets, the CEL source of each, and where in
//! the file each expression starts (so that errors point at `FILE:LINE:COL`). No CEL here.
//!
//! A value is a string holding a CEL expression, or a TOML integer, float or boolean, which
//! is taken as that literal (`grace_s = 30`). Unknown keys are errors.

use toml_edit::{ImDocument, Item, Table, Value};

use crate::{
    error::{KeyError, Pos},
    hooks::{Hook, Var},
};

/// One expression of the file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// `start`, or `let.NAME`.
    pub key: String,
    pub source: String,
    /// Where the expression's first character is in the file.
    pub at: Pos,
}

impl Entry {
    /// The file position of `(line, col)` (1-based) inside this expression. Exact for
    /// literal strings (`'…'`, `'''…'''`); escapes in basic strings shift it.
    pub fn file_pos(&self, line: usize, col: usize) -> Pos {
        if line <= 1 {
            Pos {
                line: self.at.line,
                col: self.at.col + col.saturating_sub(1),
            }
        } else {
            Pos {
                line: self.at.line + line - 1,
                col,
            }
        }
    }

    pub fn error(&self, message: impl Into<String>, help: impl Into<String>) -> KeyError {
        KeyError {
            at: self.at,
            key: self.key.clone(),
            message: message.into(),
            help: help.into(),
        }
    }
}

/// The file's hooks and `[let]` entries, in file order.
#[derive(Debug, Default)]
pub(crate) struct RawPolicy {
    pub hooks: Vec<(Hook, Entry)>,
    pub lets: Vec<(String, Entry)>,
}

/// Why the TOML could not be read: a syntax error or a key error.
#[derive(Debug)]
pub(crate) enum SourceError {
    Syntax { at: Pos, message: String },
    Key(KeyError),
}

const KEYS_HELP: &str = "the keys are start, rank, vacate, grace_s, may_preempt, \
     preempt_rank, share, max_hosts, priority and the [let] table (see policies/README.md)";

/// Reads `text` (the whole file).
pub(crate) fn read(text: &str) -> Result<RawPolicy, SourceError> {
    let doc = ImDocument::parse(text).map_err(|e| SourceError::Syntax {
        at: Pos::of_offset(text, e.span().map_or(0, |s| s.start)),
        message: e.message().trim().to_string(),
    })?;
    let mut raw = RawPolicy::default();
    for (key, item) in doc.as_table().iter() {
        let at = key_pos(text, doc.as_table(), key);
        if key == "let" {
            raw.lets = read_lets(text, item, at)?;
            continue;
        }
        let Some(hook) = Hook::from_key(key) else {
            return Err(SourceError::Key(KeyError {
                at,
                key: key.to_string(),
                message: "unknown key".into(),
                help: suggest(key),
            }));
        };
        raw.hooks.push((hook, entry(text, key, item, at)?));
    }
    Ok(raw)
}

fn key_pos(text: &str, table: &Table, key: &str) -> Pos {
    let offset = table.key(key).and_then(|k| k.span()).map_or(0, |s| s.start);
    Pos::of_offset(text, offset)
}

fn suggest(key: &str) -> String {
    let close = Hook::ALL
        .iter()
        .map(|h| h.key())
        .chain(["let"])
        .find(|k| edit_distance(k, key) <= 2);
    match close {
        Some(k) => format!("did you mean `{k}`? {KEYS_HELP}"),
        None => KEYS_HELP.to_string(),
    }
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The `[let]` table (or inline table `let = { … }`).
fn read_lets(text: &str, item: &Item, at: Pos) -> Result<Vec<(String, Entry)>, SourceError> {
    let pairs: Vec<(String, Pos, &Item)> = match item {
        Item::Table(t) => t
            .iter()
            .map(|(k, v)| (k.to_string(), key_pos(text, t, k), v))
            .collect(),
        _ => {
            return Err(SourceError::Key(KeyError {
                at,
                key: "let".into(),
                message: "`let` must be a table of named expressions".into(),
                help: "write `[let]` on its own line, then `NAME = 'EXPRESSION'` lines".into(),
            }))
        }
    };
    let mut lets = Vec::new();
    for (name, at, item) in pairs {
        let key = format!("let.{name}");
        check_let_name(&name, &key, at)?;
        lets.push((name, entry(text, &key, item, at)?));
    }
    Ok(lets)
}

fn check_let_name(name: &str, key: &str, at: Pos) -> Result<(), SourceError> {
    let ident = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let reserved = ["true", "false", "null", "in", "as", "let", "has"];
    let message = if !ident {
        "a let name must be an identifier (letters, digits, `_`; not starting with a digit)"
    } else if Var::ALL.iter().any(|v| v.name() == name) || reserved.contains(&name) {
        "this name is taken by a variable or a CEL keyword"
    } else {
        return Ok(());
    };
    Err(SourceError::Key(KeyError {
        at,
        key: key.to_string(),
        message: message.into(),
        help: "rename it, e.g. `owner_away`".into(),
    }))
}

/// One value: a CEL string, or a number/boolean literal.
fn entry(text: &str, key: &str, item: &Item, key_at: Pos) -> Result<Entry, SourceError> {
    let bad = |at: Pos| {
        SourceError::Key(KeyError {
            at,
            key: key.to_string(),
            message: "the value must be a CEL expression in a string, a number or a boolean".into(),
            help: format!(
                "write e.g. {key} = 'host.load1 < 0.5' (single quotes keep CEL's double quotes)"
            ),
        })
    };
    let Item::Value(value) = item else {
        return Err(bad(key_at));
    };
    let span = value.span().unwrap_or(0..0);
    let at = Pos::of_offset(text, span.start);
    let source = match value {
        Value::String(s) => {
            let raw = &text[span.clone()];
            let skip = string_prefix(raw);
            return Ok(Entry {
                key: key.to_string(),
                source: s.value().clone(),
                at: Pos::of_offset(text, span.start + skip),
            });
        }
        Value::Integer(i) => i.value().to_string(),
        Value::Float(f) => format!("{:?}", f.value()),
        Value::Boolean(b) => b.value().to_string(),
        _ => return Err(bad(at)),
    };
    Ok(Entry {
        key: key.to_string(),
        source,
        at,
    })
}

/// Bytes before a string's content: the quote(s), and for a multi-line string the newline
/// TOML trims right after the opening quotes.
fn string_prefix(raw: &str) -> usize {
    for quotes in ["'''", "\"\"\""] {
        if let Some(rest) = raw.strip_prefix(quotes) {
            let newline = if rest.starts_with("\r\n") {
                2
            } else {
                usize::from(rest.starts_with('\n'))
            };
            return 3 + newline;
        }
    }
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_error(text: &str) -> KeyError {
        match read(text) {
            Err(SourceError::Key(e)) => e,
            other => panic!("expected a key error, got {other:?}"),
        }
    }

    #[test]
    fn reads_hooks_and_lets_with_expression_positions() {
        let text = "# c\nstart = 'host.up'\ngrace_s = 30\n[let]\nidle = '''\nhost.x'''\n";
        let raw = read(text).expect("reads");
        assert_eq!(raw.hooks[0].0, Hook::Start);
        assert_eq!(raw.hooks[0].1.source, "host.up");
        assert_eq!(raw.hooks[0].1.at, Pos { line: 2, col: 10 });
        assert_eq!(raw.hooks[1].1.source, "30");
        assert_eq!(raw.lets[0].0, "idle");
        assert_eq!(raw.lets[0].1.key, "let.idle");
        assert_eq!(raw.lets[0].1.at, Pos { line: 6, col: 1 });
        assert_eq!(raw.lets[0].1.file_pos(1, 6), Pos { line: 6, col: 6 });
    }

    #[test]
    fn unknown_key_is_an_error_with_a_suggestion() {
        let e = key_error("start = 'true'\nvacte = 'false'\n");
        assert_eq!(e.key, "vacte");
        assert_eq!(e.at, Pos { line: 2, col: 1 });
        assert!(e.help.starts_with("did you mean `vacate`?"), "{}", e.help);
    }

    #[test]
    fn bad_values_and_let_names_are_key_errors() {
        assert_eq!(key_error("start = [1]\n").key, "start");
        assert_eq!(key_error("[let]\nhost = 'true'\n").key, "let.host");
        assert_eq!(key_error("let = 3\n").key, "let");
        assert_eq!(key_error("[start]\n").key, "start");
    }

    #[test]
    fn toml_syntax_errors_carry_a_position() {
        let Err(SourceError::Syntax { at, message }) = read("start = 'x\n") else {
            panic!("expected a syntax error");
        };
        assert_eq!(at.line, 1);
        assert!(!message.is_empty());
    }
}
