//! The typed error of loading a policy file. Every variant that concerns one key renders as
//! `FILE:LINE:COL: key \`KEY\`: MESSAGE` and a `help:` line — exactly what `rb policy check`
//! prints on failure (exit 64).

use std::path::PathBuf;

/// A 1-based line and column in the policy file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

impl Pos {
    /// The line and column of byte `offset` in `text` (columns count characters).
    pub fn of_offset(text: &str, offset: usize) -> Pos {
        let before = &text[..offset.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        Pos { line, col }
    }
}

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: cannot read the policy file: {source}\nhelp: check the path; shipped policies are named paper, desktop, nights-and-weekends, dedicated", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{}:{}: {message}\nhelp: {help}", path.display(), at.line, at.col)]
    Toml {
        path: PathBuf,
        at: Pos,
        message: String,
        help: String,
    },
    #[error("{}:{}:{}: key `{key}`: {message}\nhelp: {help}", path.display(), at.line, at.col)]
    Key {
        path: PathBuf,
        at: Pos,
        key: String,
        message: String,
        help: String,
    },
    #[error("{}: the policy parser thread could not run: {reason}\nhelp: this is a bug or the machine is out of memory or threads; retry", path.display())]
    Thread { path: PathBuf, reason: String },
}

impl Error {
    /// The exit code `rb policy check` uses for this error (sysexits): 64 (usage/config)
    /// for a bad file, 66 (no input) when it cannot be read, 77 (permission) when reading it
    /// is not allowed, 70 (software) when the parser thread cannot run.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Read { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
                77
            }
            Error::Read { .. } => 66,
            Error::Toml { .. } | Error::Key { .. } => 64,
            Error::Thread { .. } => 70,
        }
    }

    /// The key an error is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Error::Key { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// An error about one key, before the file's path is known to it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeyError {
    pub at: Pos,
    pub key: String,
    pub message: String,
    pub help: String,
}

impl KeyError {
    pub(crate) fn into_error(self, path: PathBuf) -> Error {
        Error::Key {
            path,
            at: self.at,
            key: self.key,
            message: self.message,
            help: self.help,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_lines_and_character_columns() {
        let text = "a = 1\nbé = 'x'\n";
        assert_eq!(Pos::of_offset(text, 0), Pos { line: 1, col: 1 });
        let x = text.find('\'').expect("quote");
        assert_eq!(Pos::of_offset(text, x), Pos { line: 2, col: 6 });
    }

    #[test]
    fn key_errors_render_file_line_col_key_and_help() {
        let e = KeyError {
            at: Pos { line: 3, col: 10 },
            key: "vacate".into(),
            message: "gives `int`, but `vacate` must give bool".into(),
            help: "compare it".into(),
        }
        .into_error(PathBuf::from("p.toml"));
        assert_eq!(
            e.to_string(),
            "p.toml:3:10: key `vacate`: gives `int`, but `vacate` must give bool\nhelp: compare it"
        );
        assert_eq!(e.exit_code(), 64);
    }
}
