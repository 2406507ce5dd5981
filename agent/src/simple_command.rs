//! Recognises remote commands that need no shell: plain words, quoted or not, with nothing
//! a shell would expand, redirect, chain or look up as a builtin. The subagent execs such a
//! command directly instead of through `/bin/sh -c`, which saves a shell start (an exec, a
//! millisecond or more on a loaded host) on every remote call of, e.g., LAM's
//! `hboot -t -c lam-conf.lamd -d -s -I '"-H 10.0.0.2 -P 4242 -n 1 -o 0"'` or PVM's
//! `/usr/lib/pvm3/lib/pvmd -s -d0x0 -nnode03 1 0a000002:8e2b 4080 2 0a000003:0000`.
//!
//! Anything else (`$`, globs, `~`, `;`, `|`, redirections, backslashes, comments, an
//! assignment or a shell keyword or builtin as the first word) is left to the shell, so the
//! result is what `sh -c COMMAND` would run, or `None`.

/// Characters that are literal outside quotes in every POSIX shell.
fn is_plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_./,:=+@%^".contains(c)
}

/// Words a shell treats specially as the command name: reserved words and the builtins of
/// dash (the shell that `sh -c` runs on Debian), whose behaviour an exec would not match.
const SHELL_WORDS: &[&str] = &[
    "!", "{", "}", "case", "do", "done", "elif", "else", "esac", "fi", "for", "if", "in", "then",
    "until", "while", ".", ":", "[", "alias", "bg", "break", "cd", "command", "continue", "echo",
    "eval", "exec", "exit", "export", "false", "fg", "getopts", "hash", "jobs", "kill", "local",
    "printf", "pwd", "read", "readonly", "return", "set", "shift", "test", "times", "trap", "true",
    "type", "ulimit", "umask", "unalias", "unset", "wait",
];

/// The argv `sh -c command` would exec, when the command is plain words; else `None`.
pub fn plain_argv(command: &str) -> Option<Vec<String>> {
    let words = split_words(command)?;
    let first = words.first()?;
    if first.is_empty() || first.contains('=') || SHELL_WORDS.contains(&first.as_str()) {
        return None;
    }
    Some(words)
}

/// Splits on blanks, removing quotes; `None` at anything a shell would interpret.
fn split_words(command: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '\'' => break,
                        q => w.push(q),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '"' => break,
                        '$' | '`' | '\\' => return None,
                        q => w.push(q),
                    }
                }
            }
            c if is_plain(c) => word.get_or_insert_with(String::new).push(c),
            _ => return None,
        }
    }
    words.extend(word);
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(command: &str) -> Option<Vec<String>> {
        plain_argv(command)
    }

    fn words(list: &[&str]) -> Option<Vec<String>> {
        Some(list.iter().map(|w| w.to_string()).collect())
    }

    #[test]
    fn lam_and_pvm_start_commands_need_no_shell() {
        assert_eq!(
            argv(r#"hboot -t -c lam-conf.lamd -d -s -I '"-H 10.77.0.2 -P 59001 -n 1 -o 0"'"#),
            words(&[
                "hboot",
                "-t",
                "-c",
                "lam-conf.lamd",
                "-d",
                "-s",
                "-I",
                r#""-H 10.77.0.2 -P 59001 -n 1 -o 0""#
            ])
        );
        assert_eq!(
            argv("/usr/lib/pvm3/lib/pvmd -s -d0x0 -nnode03 1 0a4dd002:8002 4080 2 0a4dd003:0000"),
            words(&[
                "/usr/lib/pvm3/lib/pvmd",
                "-s",
                "-d0x0",
                "-nnode03",
                "1",
                "0a4dd002:8002",
                "4080",
                "2",
                "0a4dd003:0000"
            ])
        );
    }

    #[test]
    fn quotes_join_and_keep_blanks() {
        assert_eq!(
            argv(r#"prog  a'b c'"d e"   ''"#),
            words(&["prog", "ab cd e", ""])
        );
        assert_eq!(argv("prog\tx"), words(&["prog", "x"]));
        assert_eq!(argv(r#"prog "it's""#), words(&["prog", "it's"]));
    }

    #[test]
    fn anything_a_shell_interprets_goes_to_the_shell() {
        for command in [
            "echo $SHELL",
            "ls *.c",
            "cat ~/x",
            "a; b",
            "a && b",
            "a | b",
            "a > f",
            "a < f",
            "a &",
            "(a)",
            r"a\ b",
            "a `b`",
            r#"a "$HOME""#,
            r#"a "x\y""#,
            "a # comment",
            "a\nb",
            "prog 'unterminated",
            r#"prog "unterminated"#,
            "a [x]",
            "a {x,y}",
            "VAR=1 prog",
            "cd /tmp",
            "exec prog",
            "echo hi",
            "true",
            "if",
            "",
            "   ",
            "''",
            "ünïcode",
        ] {
            assert_eq!(argv(command), None, "{command:?}");
        }
    }
}
