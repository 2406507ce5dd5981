//! Configuration errors that say where (file, line, column, key) and how to fix it.

use std::path::Path;

/// A lab-file problem. `Display` gives `FILE:LINE:COL: KEY: message` plus a `help:` line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ConfigError {
    pub file: String,
    /// 1-based line and column, when known.
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// Dotted key, e.g. `host[2].name`.
    pub key: Option<String>,
    pub message: String,
    pub help: Option<String>,
    /// Further problems found in the same pass (e.g. every unknown key of a file), each
    /// rendered after this one on a line of its own starting with `error: ` (callers print
    /// the first one's prefix).
    pub more: Vec<ConfigError>,
}

impl ConfigError {
    fn render(&self) -> String {
        let mut out = self.file.clone();
        if let (Some(line), Some(col)) = (self.line, self.column) {
            out.push_str(&format!(":{line}:{col}"));
        }
        out.push_str(": ");
        if let Some(key) = &self.key {
            out.push_str(&format!("{key}: "));
        }
        out.push_str(&self.message);
        if let Some(help) = &self.help {
            out.push_str(&format!("\nhelp: {help}"));
        }
        for other in &self.more {
            out.push_str("\nerror: ");
            out.push_str(&other.render());
        }
        out
    }

    /// This error followed by `more` found in the same pass.
    pub(crate) fn with_more(mut self, more: Vec<ConfigError>) -> Self {
        self.more.extend(more);
        self
    }

    /// How many problems this error reports (itself and [`Self::more`]).
    pub fn count(&self) -> usize {
        1 + self.more.iter().map(Self::count).sum::<usize>()
    }

    pub(crate) fn io(path: &Path, err: &std::io::Error) -> Self {
        Self {
            file: path.display().to_string(),
            line: None,
            column: None,
            key: None,
            message: format!("cannot read: {err}"),
            help: Some("create a lab file with `rb init`, or pass its path with --lab".into()),
            more: Vec::new(),
        }
    }

    pub(crate) fn from_toml(text: &str, path: Option<&Path>, err: &toml::de::Error) -> Self {
        let (line, column) = match err.span() {
            Some(span) => line_col(text, span.start),
            None => (None, None),
        };
        let message = err.message().trim().to_string();
        Self {
            file: file_name(path),
            line,
            column,
            key: None,
            help: Some(toml_help(&message)),
            message,
            more: Vec::new(),
        }
    }

    pub(crate) fn at(text: &str, path: Option<&Path>, offset: Option<usize>, key: &str) -> Builder {
        let (line, column) = offset.map_or((None, None), |o| line_col(text, o));
        Builder(Self {
            file: file_name(path),
            line,
            column,
            key: Some(key.to_string()),
            message: String::new(),
            help: None,
            more: Vec::new(),
        })
    }
}

/// Finishes a [`ConfigError`] with its message and help.
pub(crate) struct Builder(ConfigError);

impl Builder {
    pub(crate) fn msg(
        mut self,
        message: impl Into<String>,
        help: impl Into<String>,
    ) -> ConfigError {
        self.0.message = message.into();
        self.0.help = Some(help.into());
        self.0
    }
}

/// Something allowed in a lab file but probably a mistake: `FILE: KEY: warning: message`
/// plus a `help:` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    pub file: String,
    /// Dotted key, e.g. `broker.listen`.
    pub key: String,
    pub message: String,
    pub help: String,
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}: warning: {}\nhelp: {}",
            self.file, self.key, self.message, self.help
        )
    }
}

fn file_name(path: Option<&Path>) -> String {
    path.map_or_else(|| "<lab>".to_string(), |p| p.display().to_string())
}

fn toml_help(message: &str) -> String {
    if message.contains("unknown field") {
        "remove the key or fix its spelling; the expected keys are listed above".into()
    } else if message.contains("missing field") {
        "add the missing key; see `rb init` for a complete example".into()
    } else {
        "see `rb init` for a complete, valid example lab file".into()
    }
}

/// 1-based line and column of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (Option<usize>, Option<usize>) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (Some(line), Some(col))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one() {
        let text = "a\nbc\nd";
        assert_eq!(line_col(text, 0), (Some(1), Some(1)));
        assert_eq!(line_col(text, 3), (Some(2), Some(2)));
        assert_eq!(line_col(text, 5), (Some(3), Some(1)));
        assert_eq!(line_col(text, 99), (Some(3), Some(2)));
    }
}
