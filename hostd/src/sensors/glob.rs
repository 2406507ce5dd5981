//! A tiny shell-style glob, enough for the input-device patterns of
//! [`SensorConfig::input_devices`](super::SensorConfig::input_devices) (no dependency needed).
//!
//! Supported in any path component: `*` (any run of characters, including none and a leading
//! dot), `?` (one character), `[abc]`, `[a-z]`, `[!a-z]` / `[^a-z]` (a `]` first in the class is
//! literal; an unterminated `[` is literal). Not supported: `**`, braces, escapes.
//! Expansion lists only paths that exist; matches within a directory come sorted by name.

use std::fs;
use std::path::{Path, PathBuf};

/// The existing paths that match `pattern` (absolute, or relative to the current directory).
pub fn expand(pattern: &str) -> Vec<PathBuf> {
    let (root, rest) = match pattern.strip_prefix('/') {
        Some(rest) => (PathBuf::from("/"), rest),
        None => (PathBuf::new(), pattern),
    };
    let components: Vec<&str> = rest.split('/').filter(|c| !c.is_empty()).collect();
    let mut out = Vec::new();
    walk(root, &components, &mut out);
    out
}

fn walk(base: PathBuf, components: &[&str], out: &mut Vec<PathBuf>) {
    let Some((first, rest)) = components.split_first() else {
        if !base.as_os_str().is_empty() && base.exists() {
            out.push(base);
        }
        return;
    };
    if !has_wildcard(first) {
        return walk(base.join(first), rest, out);
    }
    let dir = if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base.as_path()
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let pattern: Vec<char> = first.chars().collect();
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| matches(&pattern, &name.chars().collect::<Vec<_>>()))
        .collect();
    names.sort();
    for name in names {
        walk(base.join(name), rest, out);
    }
}

fn has_wildcard(component: &str) -> bool {
    component.contains(['*', '?', '['])
}

/// Whether one path component `name` matches the component pattern `pattern`.
pub fn matches(pattern: &[char], name: &[char]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some(('*', rest)) => {
            let rest = trim_stars(rest);
            rest.is_empty() || (0..=name.len()).any(|i| matches(rest, &name[i..]))
        }
        Some(('?', rest)) => !name.is_empty() && matches(rest, &name[1..]),
        Some(('[', rest)) => match (name.split_first(), class(rest)) {
            (Some((c, name_rest)), Some((set, after))) => {
                set.contains(*c) && matches(after, name_rest)
            }
            (None, _) => false,
            (Some((c, name_rest)), None) => *c == '[' && matches(rest, name_rest),
        },
        Some((p, rest)) => name.first() == Some(p) && matches(rest, &name[1..]),
    }
}

fn trim_stars(pattern: &[char]) -> &[char] {
    let n = pattern.iter().take_while(|c| **c == '*').count();
    &pattern[n..]
}

/// A parsed bracket class.
struct Class<'a> {
    negated: bool,
    /// The class body between the optional `!`/`^` and the closing `]`.
    body: &'a [char],
}

impl Class<'_> {
    fn contains(&self, c: char) -> bool {
        let mut hit = false;
        let mut i = 0;
        while i < self.body.len() {
            if i + 2 < self.body.len() && self.body[i + 1] == '-' {
                hit |= self.body[i] <= c && c <= self.body[i + 2];
                i += 3;
            } else {
                hit |= self.body[i] == c;
                i += 1;
            }
        }
        hit != self.negated
    }
}

/// Parses a class whose `[` was just consumed; returns it and the pattern after `]`, or `None`
/// when the class is unterminated.
fn class(pattern: &[char]) -> Option<(Class<'_>, &[char])> {
    let negated = matches!(pattern.first(), Some('!' | '^'));
    let body_start = usize::from(negated);
    // A `]` right at the start of the body is a literal member.
    let search_from = body_start + 1;
    let close = pattern.get(search_from..)?.iter().position(|c| *c == ']')? + search_from;
    let class = Class {
        negated,
        body: &pattern[body_start..close],
    };
    Some((class, &pattern[close + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, name: &str) -> bool {
        let p: Vec<char> = pattern.chars().collect();
        let n: Vec<char> = name.chars().collect();
        matches(&p, &n)
    }

    #[test]
    fn literal_star_and_question() {
        assert!(m("mice", "mice"));
        assert!(!m("mice", "mouse"));
        assert!(m("event*", "event12"));
        assert!(m("event*", "event"));
        assert!(!m("event*", "xevent1"));
        assert!(m("*0", "tty10"));
        assert!(m("a**b", "axxb"));
        assert!(m("tty?", "tty1"));
        assert!(!m("tty?", "tty"));
    }

    #[test]
    fn classes_ranges_and_negation() {
        assert!(m("tty[0-9]*", "tty1"));
        assert!(m("tty[0-9]*", "tty63"));
        assert!(!m("tty[0-9]*", "ttyS0"));
        assert!(!m("tty[0-9]*", "tty"));
        assert!(m("[!a]x", "bx"));
        assert!(!m("[^a]x", "ax"));
        assert!(m("[]]", "]"));
        assert!(m("[ab-]", "-"));
        assert!(m("[x", "[x"), "unterminated class is literal");
        assert!(!m("[x", "x"));
    }

    #[test]
    fn expand_lists_existing_matches_sorted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("input");
        fs::create_dir(&input).expect("mkdir");
        for name in ["event3", "event10", "mice", "mouse0"] {
            fs::write(input.join(name), "").expect("touch");
        }
        let base = dir.path().display().to_string();
        let found = expand(&format!("{base}/input/event*"));
        assert_eq!(found, vec![input.join("event10"), input.join("event3")]);
        assert_eq!(
            expand(&format!("{base}/input/mice")),
            vec![input.join("mice")]
        );
        assert_eq!(
            expand(&format!("{base}/*/mouse?")),
            vec![input.join("mouse0")]
        );
        assert!(expand(&format!("{base}/input/kbd")).is_empty());
        assert!(expand(&format!("{base}/absent/*")).is_empty());
    }
}
