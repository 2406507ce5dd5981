//! OpenSSH's command line, parsed as `ssh(1)` of OpenSSH 9.2 (Debian 12) parses it, so that
//! the drop-in `ssh` decides where a call goes exactly as the real one would read it.
//!
//! The grammar (ssh.c's `main`):
//! - BSD `getopt` with the flags [`FLAGS`] and the options with an argument [`VALUED`]:
//!   flags cluster (`-nT`), an argument is the rest of the word (`-p22`) or the next word
//!   (`-p 22`); parsing stops at the first word that is not an option, and after `--`.
//! - The first word after the options is the destination: `[user@]host` (split at the last
//!   `@`) or `ssh://[user@]host[:port]`. Unless `--` came first, options may follow it
//!   (`ssh host -l bob ls`) until the next word that is not an option, or `--`.
//! - What remains is the command, its words joined with single blanks (the remote shell
//!   re-parses that string); with `-s` the command is a subsystem's name.
//! - `-V` and `-Q` end the parse at once (ssh prints and exits there): no host is needed.
//! - The user is the first given of `-l USER`, `user@`, `-o User=…` (ssh keeps the first);
//!   the port is the last `-p`, else the first of `-o Port=…` and the URI's.
//! - `-o Key=Value` and `-o "Key Value"` (also glued, `-oKey=Value`); keys in any case.

use std::ffi::OsString;

/// Options without an argument.
pub const FLAGS: &str = "1246AaCfGgKkMNnqsTtVvXxYy";
/// Options with an argument.
pub const VALUED: &str = "BbcDEeFIiJLlmOoPpQRSWw";
/// ssh's usage text (ssh(1), OpenSSH 9.2).
pub const USAGE: &str = "usage: ssh [-46AaCfGgKkMNnqsTtVvXxYy] [-B bind_interface] [-b bind_address]\n           [-c cipher_spec] [-D [bind_address:]port] [-E log_file]\n           [-e escape_char] [-F configfile] [-I pkcs11] [-i identity_file]\n           [-J destination] [-L address] [-l login_name] [-m mac_spec]\n           [-O ctl_cmd] [-o option] [-P tag] [-p port] [-R address]\n           [-S ctl_path] [-W host:port] [-w local_tun[:remote_tun]]\n           destination [command [argument ...]]\n       ssh [-Q query_option]";

/// One option as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SshOpt {
    Flag(char),
    Valued(char, String),
}

impl SshOpt {
    /// The option's letter.
    pub fn letter(&self) -> char {
        match self {
            SshOpt::Flag(c) | SshOpt::Valued(c, _) => *c,
        }
    }

    /// The option as command-line words (`-n`; `-p`, `22`).
    pub fn words(&self) -> Vec<String> {
        match self {
            SshOpt::Flag(c) => vec![format!("-{c}")],
            SshOpt::Valued(c, v) => vec![format!("-{c}"), v.clone()],
        }
    }
}

/// One parsed `ssh` call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SshCall {
    /// Every option, in order (destination and command excluded).
    pub opts: Vec<SshOpt>,
    /// The destination host (no user, no port); `None` only with `-V` or `-Q`.
    pub host: Option<String>,
    /// The login name ssh would use from the command line (see the module docs).
    pub user: Option<String>,
    /// The port ssh would use from the command line.
    pub port: Option<u16>,
    /// The command words as given (a subsystem's name with `-s`).
    pub command: Vec<String>,
}

/// What a call asks of ssh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A session: a command, a subsystem or a login.
    Session,
    /// Nothing is opened on the destination (`-V`, `-Q`, `-G`, `-O ctl_cmd`).
    NoSession,
}

/// Why ssh would refuse the command line (exit 255, as ssh). Display: what follows `ssh: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SshUsageError {
    #[error("unknown option -- {0}")]
    UnknownOption(char),
    #[error("option requires an argument -- {0}")]
    MissingArgument(char),
    #[error("no destination given")]
    NoHost,
    #[error("bad destination `{0}`")]
    BadDestination(String),
    #[error("Bad port '{0}'")]
    BadPort(String),
    #[error("argument {0} is not valid UTF-8")]
    NotUtf8(usize),
}

impl SshCall {
    /// The command words joined with blanks, `None` when there are none.
    pub fn command_line(&self) -> Option<String> {
        (!self.command.is_empty()).then(|| self.command.join(" "))
    }

    /// Whether flag `letter` was given.
    pub fn has(&self, letter: char) -> bool {
        self.opts.iter().any(|o| o.letter() == letter)
    }

    /// The values of option `letter`, in order.
    pub fn values(&self, letter: char) -> impl Iterator<Item = &str> {
        self.opts.iter().filter_map(move |o| match o {
            SshOpt::Valued(c, v) if *c == letter => Some(v.as_str()),
            _ => None,
        })
    }

    /// The first `-o` value for `key` (any case): the one ssh uses.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.values('o')
            .map(split_option)
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    }

    /// [`Mode::NoSession`] for `-V`, `-Q`, `-G` and `-O`.
    pub fn mode(&self) -> Mode {
        match self.opts.iter().any(|o| "VQGO".contains(o.letter())) {
            true => Mode::NoSession,
            false => Mode::Session,
        }
    }
}

/// `Key=Value`, `Key Value`, `Key = Value` → (`Key`, `Value`) as ssh's config parser splits.
pub fn split_option(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    let end = text
        .find(|c: char| c == '=' || c.is_whitespace())
        .unwrap_or(text.len());
    let (key, rest) = text.split_at(end);
    let rest = rest.trim_start();
    let rest = rest.strip_prefix('=').unwrap_or(rest).trim_start();
    (key, rest.trim_end())
}

/// Parses a full argv (`args[0]` is the program name) as ssh does.
pub fn parse(args: &[OsString]) -> Result<SshCall, SshUsageError> {
    let words = args
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, a)| {
            a.to_str()
                .map(str::to_string)
                .ok_or(SshUsageError::NotUtf8(i))
        })
        .collect::<Result<Vec<_>, _>>()?;
    parse_words(&words)
}

/// Like [`parse`], with invalid UTF-8 replaced: enough to decide where a call goes.
pub fn parse_lossy(args: &[OsString]) -> Result<SshCall, SshUsageError> {
    let words: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    parse_words(&words)
}

/// How one `getopt` pass ended.
enum Stop {
    /// At `words[i]`, a word that is not an option.
    Word(usize),
    /// After `--`; the next word is at `i`.
    Terminated(usize),
    /// `-V` or `-Q`: ssh exits here.
    Exit,
}

/// Parses the words after the program name.
pub fn parse_words(words: &[String]) -> Result<SshCall, SshUsageError> {
    let mut call = SshCall::default();
    let mut explicit_port = None;
    let (mut i, terminated) = match getopt(words, 0, &mut call, &mut explicit_port)? {
        Stop::Exit => return Ok(finish(call, explicit_port)),
        Stop::Word(i) => (i, false),
        Stop::Terminated(i) => (i, true),
    };
    let Some(destination) = words.get(i) else {
        return Err(SshUsageError::NoHost);
    };
    set_destination(destination, &mut call)?;
    i += 1;
    if !terminated && i < words.len() {
        i = match getopt(words, i, &mut call, &mut explicit_port)? {
            Stop::Exit => return Ok(finish(call, explicit_port)),
            Stop::Word(i) | Stop::Terminated(i) => i,
        };
    }
    call.command = words.get(i..).unwrap_or_default().to_vec();
    Ok(finish(call, explicit_port))
}

/// `-p` beats every other source of the port.
fn finish(mut call: SshCall, explicit_port: Option<u16>) -> SshCall {
    if explicit_port.is_some() {
        call.port = explicit_port;
    }
    call
}

/// One BSD `getopt` pass from `words[start]`.
fn getopt(
    words: &[String],
    start: usize,
    call: &mut SshCall,
    explicit_port: &mut Option<u16>,
) -> Result<Stop, SshUsageError> {
    let mut i = start;
    while let Some(word) = words.get(i) {
        if word == "--" {
            return Ok(Stop::Terminated(i + 1));
        }
        if word.len() < 2 || !word.starts_with('-') {
            return Ok(Stop::Word(i));
        }
        i += 1;
        for (at, letter) in word.char_indices().skip(1) {
            if VALUED.contains(letter) {
                let glued = &word[at + letter.len_utf8()..];
                let value = if glued.is_empty() {
                    i += 1;
                    words
                        .get(i - 1)
                        .ok_or(SshUsageError::MissingArgument(letter))?
                        .clone()
                } else {
                    glued.to_string()
                };
                record_valued(letter, value, call, explicit_port)?;
                if letter == 'Q' {
                    return Ok(Stop::Exit);
                }
                break;
            }
            if !FLAGS.contains(letter) {
                return Err(SshUsageError::UnknownOption(letter));
            }
            call.opts.push(SshOpt::Flag(letter));
            if letter == 'V' {
                return Ok(Stop::Exit);
            }
        }
    }
    Ok(Stop::Word(i))
}

fn record_valued(
    letter: char,
    value: String,
    call: &mut SshCall,
    explicit_port: &mut Option<u16>,
) -> Result<(), SshUsageError> {
    match letter {
        'l' => {
            call.user.get_or_insert_with(|| value.clone());
        }
        'p' => *explicit_port = Some(port(&value)?),
        'o' => {
            let (key, v) = split_option(&value);
            if key.eq_ignore_ascii_case("user") && !v.is_empty() {
                call.user.get_or_insert_with(|| v.to_string());
            }
            if key.eq_ignore_ascii_case("port") && call.port.is_none() {
                call.port = Some(port(v)?);
            }
        }
        _ => {}
    }
    call.opts.push(SshOpt::Valued(letter, value));
    Ok(())
}

fn port(text: &str) -> Result<u16, SshUsageError> {
    match text.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(SshUsageError::BadPort(text.to_string())),
    }
}

/// `[user@]host` or `ssh://[user@]host[:port]`.
fn set_destination(word: &str, call: &mut SshCall) -> Result<(), SshUsageError> {
    let bad = || SshUsageError::BadDestination(word.to_string());
    let (user, host, uri_port) = match word.strip_prefix("ssh://") {
        Some(rest) => {
            let rest = rest.strip_suffix('/').unwrap_or(rest);
            let (user, hostport) = match rest.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, rest),
            };
            let (host, port_text) = split_host_port(hostport).ok_or_else(bad)?;
            if host.contains('/') {
                return Err(bad());
            }
            let uri_port = port_text.map(port).transpose()?;
            (user, host, uri_port)
        }
        None => match word.rsplit_once('@') {
            Some((u, h)) => (Some(u), h, None),
            None => (None, word, None),
        },
    };
    if host.is_empty() || user == Some("") {
        return Err(bad());
    }
    if let Some(user) = user {
        call.user.get_or_insert_with(|| user.to_string());
    }
    if call.port.is_none() {
        call.port = uri_port;
    }
    call.host = Some(host.to_string());
    Ok(())
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` → (host, port text).
fn split_host_port(text: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?))),
        };
    }
    Some(match text.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (text, None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(words: &[&str]) -> SshCall {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        parse_words(&words).unwrap_or_else(|e| panic!("{words:?}: {e}"))
    }

    fn err(words: &[&str]) -> SshUsageError {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        parse_words(&words).expect_err("rejected")
    }

    /// ssh(1)'s option table, OpenSSH 9.2: every flag alone before the host, and clustered.
    #[test]
    fn every_flag_of_the_option_table() {
        for flag in FLAGS.chars() {
            let call = ok(&[&format!("-{flag}"), "h", "c"]);
            assert_eq!(call.opts, vec![SshOpt::Flag(flag)], "-{flag}");
            if flag == 'V' {
                assert_eq!(call.host, None, "-V ends the parse");
                continue;
            }
            assert_eq!(call.host.as_deref(), Some("h"), "-{flag}");
            assert_eq!(call.command, vec!["c"], "-{flag}");
            // After the host, too.
            let call = ok(&["h", &format!("-{flag}"), "c"]);
            assert_eq!(call.opts, vec![SshOpt::Flag(flag)], "h -{flag}");
        }
        let call = ok(&["-nTxq", "h", "c"]);
        let letters: String = call.opts.iter().map(SshOpt::letter).collect();
        assert_eq!(letters, "nTxq");
    }

    /// Every option with an argument: separate, glued, and at the end of a cluster.
    #[test]
    fn every_option_with_an_argument() {
        for letter in VALUED.chars() {
            let value = match letter {
                'p' => "2222",
                'o' => "BatchMode=yes",
                _ => "V",
            };
            let want = SshOpt::Valued(letter, value.to_string());
            for words in [
                vec![
                    format!("-{letter}"),
                    value.to_string(),
                    "h".into(),
                    "c".into(),
                ],
                vec![format!("-{letter}{value}"), "h".into(), "c".into()],
                vec![
                    format!("-n{letter}"),
                    value.to_string(),
                    "h".into(),
                    "c".into(),
                ],
                vec![
                    "h".into(),
                    format!("-{letter}"),
                    value.to_string(),
                    "c".into(),
                ],
            ] {
                let call = parse_words(&words).unwrap_or_else(|e| panic!("{words:?}: {e}"));
                assert!(call.opts.contains(&want), "{words:?}: {:?}", call.opts);
                if letter == 'Q' {
                    continue;
                }
                assert_eq!(call.host.as_deref(), Some("h"), "{words:?}");
                assert_eq!(call.command, vec!["c"], "{words:?}");
            }
            assert_eq!(
                err(&[&format!("-{letter}")]),
                SshUsageError::MissingArgument(letter)
            );
        }
    }

    #[test]
    fn letters_outside_the_table_are_unknown() {
        for letter in "dhjruzHUZ8".chars() {
            assert_eq!(
                err(&[&format!("-{letter}"), "h"]),
                SshUsageError::UnknownOption(letter)
            );
        }
        assert_eq!(err(&["-nd", "h"]), SshUsageError::UnknownOption('d'));
        assert_eq!(err(&["h", "-d", "c"]), SshUsageError::UnknownOption('d'));
    }

    #[test]
    fn glued_port_and_option_forms() {
        let call = ok(&["-p22", "-oBatchMode=yes", "-o", "ConnectTimeout 3", "h"]);
        assert_eq!(call.port, Some(22));
        assert_eq!(call.option("batchmode"), Some("yes"));
        assert_eq!(call.option("CONNECTTIMEOUT"), Some("3"));
        assert_eq!(call.option("User"), None);
        assert_eq!(split_option("Key = Value "), ("Key", "Value"));
        assert_eq!(split_option("Key"), ("Key", ""));
        assert_eq!(call.mode(), Mode::Session);
        assert_eq!(call.command_line(), None);
    }

    #[test]
    fn destinations() {
        let call = ok(&["bob@h", "ls"]);
        assert_eq!(
            (call.user.as_deref(), call.host.as_deref()),
            (Some("bob"), Some("h"))
        );
        let call = ok(&["a@b@h", "ls"]);
        assert_eq!(
            (call.user.as_deref(), call.host.as_deref()),
            (Some("a@b"), Some("h"))
        );
        let call = ok(&["ssh://bob@h:2222", "ls"]);
        assert_eq!(
            (call.user.as_deref(), call.host.as_deref(), call.port),
            (Some("bob"), Some("h"), Some(2222))
        );
        let call = ok(&["ssh://[fe80::1]:22"]);
        assert_eq!(
            (call.host.as_deref(), call.port),
            (Some("fe80::1"), Some(22))
        );
        let call = ok(&["ssh://h"]);
        assert_eq!((call.host.as_deref(), call.port), (Some("h"), None));
        assert_eq!(err(&["@h"]), SshUsageError::BadDestination("@h".into()));
        assert_eq!(err(&["bob@"]), SshUsageError::BadDestination("bob@".into()));
        assert_eq!(
            err(&["ssh://h/path"]),
            SshUsageError::BadDestination("ssh://h/path".into())
        );
        assert_eq!(err(&["ssh://h:x"]), SshUsageError::BadPort("x".into()));
        assert_eq!(err(&["-p", "0", "h"]), SshUsageError::BadPort("0".into()));
        assert_eq!(err(&[]), SshUsageError::NoHost);
        assert_eq!(err(&["-n", "--"]), SshUsageError::NoHost);
    }

    #[test]
    fn the_first_user_and_the_last_port_win() {
        assert_eq!(ok(&["-l", "a", "b@h"]).user.as_deref(), Some("a"));
        assert_eq!(ok(&["b@h", "-l", "a"]).user.as_deref(), Some("b"));
        assert_eq!(ok(&["-l", "a", "h", "-l", "b"]).user.as_deref(), Some("a"));
        assert_eq!(ok(&["-oUser=c", "-l", "a", "h"]).user.as_deref(), Some("c"));
        assert_eq!(ok(&["-p", "1", "h", "-p", "2"]).port, Some(2));
        assert_eq!(ok(&["-p", "1", "ssh://h:3"]).port, Some(1));
        assert_eq!(ok(&["-oPort=4", "ssh://h:3"]).port, Some(4));
        assert_eq!(ok(&["ssh://h:3", "-oPort=4"]).port, Some(3));
    }

    #[test]
    fn options_after_the_host_then_the_command() {
        let call = ok(&["h", "-n", "-l", "bob", "ls", "-l", "/x"]);
        assert_eq!(call.user.as_deref(), Some("bob"));
        assert!(call.has('n'));
        assert_eq!(call.command_line().as_deref(), Some("ls -l /x"));
        // Words are joined with single blanks; the remote shell re-parses them.
        let call = ok(&["h", "echo", "a b", "'c'"]);
        assert_eq!(call.command_line().as_deref(), Some("echo a b 'c'"));
    }

    #[test]
    fn double_dash() {
        let call = ok(&["-n", "--", "h", "-l", "x"]);
        assert_eq!(call.user, None);
        assert_eq!(call.command, vec!["-l", "x"]);
        let call = ok(&["h", "--", "-n"]);
        assert!(!call.has('n'));
        assert_eq!(call.command, vec!["-n"]);
        let call = ok(&["h", "-n", "--", "-x"]);
        assert!(call.has('n'));
        assert_eq!(call.command, vec!["-x"]);
        // A lone `-` is a word.
        assert_eq!(ok(&["h", "-"]).command, vec!["-"]);
    }

    #[test]
    fn subsystems_and_no_session_modes() {
        // How sftp and scp (SFTP mode) call ssh.
        let call = ok(&[
            "-oForwardX11 no",
            "-oPermitLocalCommand no",
            "-oClearAllForwardings yes",
            "-oForwardAgent no",
            "-l",
            "bob",
            "-s",
            "--",
            "h",
            "sftp",
        ]);
        assert!(call.has('s'));
        assert_eq!(call.host.as_deref(), Some("h"));
        assert_eq!(call.command, vec!["sftp"]);
        assert_eq!(call.option("forwardx11"), Some("no"));
        for words in [
            vec!["-V"],
            vec!["-V", "-z"],
            vec!["-Q", "cipher"],
            vec!["-Qkex", "junk"],
            vec!["-G", "h"],
            vec!["-O", "check", "h"],
            vec!["-O", "exit", "-o", "ControlPath=/x", "h"],
            vec!["h", "-O", "stop"],
        ] {
            assert_eq!(ok(&words).mode(), Mode::NoSession, "{words:?}");
        }
        assert_eq!(ok(&["-V", "h"]).host, None);
        // Ansible's call: a master that persists, compression, a session.
        let call = ok(&[
            "-C",
            "-o",
            "ControlMaster=auto",
            "-o",
            "ControlPersist=60s",
            "-o",
            "ControlPath=/x/%C",
            "h",
            "/bin/sh -c 'echo ok'",
        ]);
        assert_eq!(call.mode(), Mode::Session);
        assert_eq!(call.option("controlpersist"), Some("60s"));
    }

    #[test]
    fn arguments_must_be_text_unless_lossy() {
        use std::os::unix::ffi::OsStringExt;
        let args = vec![
            OsString::from("ssh"),
            OsString::from("h"),
            OsString::from_vec(vec![b'a', 0xff]),
        ];
        assert_eq!(parse(&args), Err(SshUsageError::NotUtf8(2)));
        assert_eq!(
            parse_lossy(&args).expect("lossy").command,
            vec!["a\u{fffd}"]
        );
    }
}
