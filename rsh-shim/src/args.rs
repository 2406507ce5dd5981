//! The command line, parsed exactly as the callers of `rsh` need (REFERENCE-NOTES C.1, C.6).
//!
//! Accepted shape: `[opts] host [opts] word…`, where the host may be `user@host`, options may
//! be clustered (`-nx`) and values attached (`-lbob`). Option parsing stops at the first word
//! after the host that is not an option (no GNU permutation), or after `--`. The remaining
//! words are the command, joined with single spaces: the remote side re-parses that string
//! with `sh -c`, so literal quotes and `;` inside words are kept as they are.
//!
//! BSD "hostname links": when the program is invoked under a name that is not a remote-shell
//! name (`rsh`, `remsh`, `rsh-shim`, `ssh`, `scp`, `sftp`), that basename is the host and every argument is
//! `[opts] word…`.
//!
//! User precedence: `-l USER` beats `user@host`; among several `-l` the last wins (netkit).

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// The usage line netkit `rsh` prints.
pub const USAGE: &str = "usage: rsh [-nd] [-l login] host [command]";

/// Program names under which the shim is a remote shell, not a hostname link.
const SHELL_NAMES: &[&str] = &["rsh", "remsh", "rsh-shim", "ssh", "scp", "sftp"];
/// Options without a value.
const FLAGS: &str = "ndxXK8Lew46TtqaA";
/// Options that take a value (attached or as the next word).
const VALUED: &str = "lkpoiF";

/// One parsed `rsh` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The host, without any `user@` prefix.
    pub host: String,
    /// `-l USER` or the `user@` of `user@host`.
    pub user: Option<String>,
    /// `-n`: stdin from /dev/null.
    pub no_stdin: bool,
    /// `-p PORT`.
    pub port: Option<String>,
    /// Every other option, in order; a valued option is followed by its value as its own
    /// element (`["-x", "-o", "BatchMode=yes"]`).
    pub passthrough_opts: Vec<String>,
    /// The command words joined with single spaces; `None` when there are none.
    pub command: Option<String>,
    /// The command words as given.
    pub words: Vec<String>,
}

/// Why a command line was rejected. The display text is what follows `rsh: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    #[error("invalid option -- '{0}'")]
    InvalidOption(char),
    #[error("option requires an argument -- '{0}'")]
    MissingValue(char),
    #[error("no host given")]
    NoHost,
    #[error("bad host `{0}`")]
    BadHost(String),
    #[error("argument {0} is not valid UTF-8")]
    NotUtf8(usize),
}

impl UsageError {
    /// The line to print before the usage line, if any (netkit prints none for a missing host).
    pub fn message(&self) -> Option<String> {
        match self {
            UsageError::NoHost => None,
            other => Some(other.to_string()),
        }
    }
}

/// How to treat arguments that are not valid UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Text {
    Strict,
    Lossy,
}

/// Parses a full argv (`args[0]` is the program name). Non-UTF-8 arguments are an error.
pub fn parse(args: &[OsString]) -> Result<Invocation, UsageError> {
    parse_with(args, Text::Strict)
}

/// Like [`parse`], but replaces invalid UTF-8 instead of failing: good enough to decide where
/// a call goes, while pass-through still hands the original bytes to the real remote shell.
pub fn parse_lossy(args: &[OsString]) -> Result<Invocation, UsageError> {
    parse_with(args, Text::Lossy)
}

/// The host named by the program name (BSD hostname links), if it is not a remote-shell name.
pub fn host_from_program_name(argv0: &OsStr) -> Option<String> {
    let base = Path::new(argv0).file_name()?.to_str()?;
    (!base.is_empty() && !SHELL_NAMES.contains(&base)).then(|| base.to_string())
}

/// The basename of the program name, if it is text.
pub fn program_name(argv0: &OsStr) -> Option<&str> {
    Path::new(argv0).file_name()?.to_str()
}

/// The remote-shell name the shim stands in for: `ssh` when invoked as `ssh`, else `rsh`.
pub fn shell_name(argv0: &OsStr) -> &'static str {
    match Path::new(argv0).file_name().and_then(OsStr::to_str) {
        Some("ssh") => "ssh",
        _ => "rsh",
    }
}

/// Options seen so far.
#[derive(Debug, Default)]
struct Opts {
    user: Option<String>,
    no_stdin: bool,
    port: Option<String>,
    passthrough: Vec<String>,
}

fn parse_with(args: &[OsString], text: Text) -> Result<Invocation, UsageError> {
    let rest = args.get(1..).unwrap_or_default();
    let mut host = args.first().and_then(|a| host_from_program_name(a));
    let mut opts = Opts::default();
    let mut i = 0;
    while i < rest.len() {
        let word = to_text(&rest[i], i + 1, text)?;
        if word == "--" {
            i += 1;
            if host.is_none() {
                host = rest.get(i).map(|a| to_text(a, i + 1, text)).transpose()?;
                i += 1;
            }
            break;
        }
        if is_option(&word) {
            i = parse_cluster(&word, rest, i, text, &mut opts)?;
        } else if host.is_none() {
            host = Some(word);
            i += 1;
        } else {
            break;
        }
    }
    let words = rest
        .get(i..)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(k, a)| to_text(a, i + k + 1, text))
        .collect::<Result<Vec<_>, _>>()?;
    build(host.ok_or(UsageError::NoHost)?, opts, words)
}

/// Assembles the invocation, splitting `user@host`.
fn build(host_word: String, opts: Opts, words: Vec<String>) -> Result<Invocation, UsageError> {
    let (at_user, host) = split_user(&host_word)?;
    Ok(Invocation {
        host,
        user: opts.user.or(at_user),
        no_stdin: opts.no_stdin,
        port: opts.port,
        passthrough_opts: opts.passthrough,
        command: (!words.is_empty()).then(|| words.join(" ")),
        words,
    })
}

/// `user@host` → (Some(user), host); `host` → (None, host). Splits at the last `@` (as ssh).
fn split_user(word: &str) -> Result<(Option<String>, String), UsageError> {
    let (user, host) = match word.rsplit_once('@') {
        Some((user, host)) => (Some(user.to_string()), host),
        None => (None, word),
    };
    if host.is_empty() || user.as_deref() == Some("") {
        return Err(UsageError::BadHost(word.to_string()));
    }
    Ok((user, host.to_string()))
}

/// An option word: starts with `-` and has at least one letter after it (`-` alone is a word).
fn is_option(word: &str) -> bool {
    word.len() > 1 && word.starts_with('-')
}

/// Parses one option word `-abc` (at `rest[i]`), possibly taking the next word as a value.
/// Returns the index of the next unparsed word.
fn parse_cluster(
    word: &str,
    rest: &[OsString],
    i: usize,
    text: Text,
    opts: &mut Opts,
) -> Result<usize, UsageError> {
    for (at, letter) in word.char_indices().skip(1) {
        if VALUED.contains(letter) {
            let attached = &word[at + letter.len_utf8()..];
            if !attached.is_empty() {
                record_valued(letter, attached.to_string(), opts);
                return Ok(i + 1);
            }
            let value = rest.get(i + 1).ok_or(UsageError::MissingValue(letter))?;
            record_valued(letter, to_text(value, i + 2, text)?, opts);
            return Ok(i + 2);
        }
        if !FLAGS.contains(letter) {
            return Err(UsageError::InvalidOption(letter));
        }
        record_flag(letter, opts);
    }
    Ok(i + 1)
}

fn record_flag(letter: char, opts: &mut Opts) {
    match letter {
        'n' => opts.no_stdin = true,
        _ => opts.passthrough.push(format!("-{letter}")),
    }
}

fn record_valued(letter: char, value: String, opts: &mut Opts) {
    match letter {
        'l' => opts.user = Some(value),
        'p' => opts.port = Some(value),
        _ => opts.passthrough.extend([format!("-{letter}"), value]),
    }
}

fn to_text(arg: &OsStr, index: usize, text: Text) -> Result<String, UsageError> {
    match (arg.to_str(), text) {
        (Some(s), _) => Ok(s.to_string()),
        (None, Text::Lossy) => Ok(arg.to_string_lossy().into_owned()),
        (None, Text::Strict) => Err(UsageError::NotUtf8(index)),
    }
}

/// Whether option `letter` takes a value (used to walk `passthrough_opts`).
pub fn takes_value(letter: char) -> bool {
    VALUED.contains(letter)
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStringExt;

    use super::*;

    fn argv(words: &[&str]) -> Vec<OsString> {
        std::iter::once("/usr/lib/rb/rsh")
            .chain(words.iter().copied())
            .map(OsString::from)
            .collect()
    }

    fn ok(words: &[&str]) -> Invocation {
        parse(&argv(words)).expect("parses")
    }

    fn err(words: &[&str]) -> UsageError {
        parse(&argv(words)).expect_err("rejected")
    }

    #[test]
    fn pvm_one_word_command() {
        let cmd = "pvmd -s -d0x0 -nnodeb 1 0a4d0001:bfbc 4080 2 0a4d0002:0000";
        let inv = ok(&["nodeb", cmd]);
        assert_eq!(inv.host, "nodeb");
        assert_eq!(inv.user, None);
        assert!(!inv.no_stdin);
        assert_eq!(inv.command.as_deref(), Some(cmd));
        assert_eq!(inv.words, vec![cmd.to_string()]);
    }

    #[test]
    fn pvm_login_after_host() {
        let cmd = "/usr/bin/pvmd -s -d0x0 -nnodeb 1 0a4d0001:aca2 4080 2 0a4d0002:0000";
        let inv = ok(&["nodeb", "-l", "alice", cmd]);
        assert_eq!(
            (inv.host.as_str(), inv.user.as_deref()),
            ("nodeb", Some("alice"))
        );
        assert!(!inv.no_stdin);
        assert_eq!(inv.command.as_deref(), Some(cmd));
    }

    #[test]
    fn pvm_console_diagnosis() {
        let inv = ok(&["nodeb", "echo YES"]);
        assert_eq!(inv.host, "nodeb");
        assert_eq!(inv.command.as_deref(), Some("echo YES"));
    }

    #[test]
    fn lam_shell_probe() {
        let inv = ok(&["nodeb", "-n", "-l", "alice", "echo $SHELL"]);
        assert_eq!(
            (inv.host.as_str(), inv.user.as_deref()),
            ("nodeb", Some("alice"))
        );
        assert!(inv.no_stdin);
        assert_eq!(inv.command.as_deref(), Some("echo $SHELL"));
        assert!(inv.passthrough_opts.is_empty());
    }

    #[test]
    fn lam_hboot_keeps_literal_quotes_and_stops_at_first_word() {
        let words = [
            "nodeb",
            "-n",
            "-l",
            "alice",
            "hboot",
            "-t",
            "-c",
            "lam-conf.lamd",
            "-d",
            "-s",
            "-I",
            "\"-H 10.77.0.1 -P 50367 -n 1 -o 0\"",
        ];
        let inv = ok(&words);
        assert_eq!(
            (inv.host.as_str(), inv.user.as_deref()),
            ("nodeb", Some("alice"))
        );
        assert!(inv.no_stdin);
        assert_eq!(
            inv.command.as_deref(),
            Some("hboot -t -c lam-conf.lamd -d -s -I \"-H 10.77.0.1 -P 50367 -n 1 -o 0\"")
        );
        assert!(inv.passthrough_opts.is_empty(), "hboot's -d is not ours");
    }

    #[test]
    fn lam_without_user() {
        let inv = ok(&["nodeb", "-n", "echo $SHELL"]);
        assert!(inv.no_stdin);
        assert_eq!(inv.user, None);
        assert_eq!(inv.command.as_deref(), Some("echo $SHELL"));
    }

    #[test]
    fn open_mpi_x_before_host_with_user_at_host_and_snippets() {
        let words = [
            "-x",
            "bob@node07",
            " PATH=/p/bin:$PATH ; export PATH ; /p/bin/orted",
            "-mca",
            "ess",
            "\"env\"",
            "-mca",
            "ess_base_jobid",
            "\"1234\"",
        ];
        let inv = ok(&words);
        assert_eq!(
            (inv.host.as_str(), inv.user.as_deref()),
            ("node07", Some("bob"))
        );
        assert!(!inv.no_stdin);
        assert_eq!(inv.passthrough_opts, vec!["-x"]);
        assert_eq!(
            inv.command.as_deref(),
            Some(" PATH=/p/bin:$PATH ; export PATH ; /p/bin/orted -mca ess \"env\" -mca ess_base_jobid \"1234\"")
        );
    }

    #[test]
    fn open_mpi_port_after_host_and_profile_wrapper() {
        let words = [
            "node07",
            "-p",
            "2222",
            "(",
            "test",
            "!",
            "-r",
            "./.profile",
            "||",
            ".",
            "./.profile;",
            "orted",
            "-mca",
            "plm",
            "\"rsh\"",
            ")",
        ];
        let inv = ok(&words);
        assert_eq!(inv.host, "node07");
        assert_eq!(inv.port.as_deref(), Some("2222"));
        assert_eq!(
            inv.command.as_deref(),
            Some("( test ! -r ./.profile || . ./.profile; orted -mca plm \"rsh\" )")
        );
    }

    #[test]
    fn open_mpi_agent_args_before_host() {
        let inv = ok(&["-x", "-o", "BatchMode=yes", "-p22", "node07", "orted"]);
        assert_eq!(inv.passthrough_opts, vec!["-x", "-o", "BatchMode=yes"]);
        assert_eq!(inv.port.as_deref(), Some("22"));
        assert_eq!(inv.command.as_deref(), Some("orted"));
    }

    #[test]
    fn hydra_quoted_proxy_path() {
        let words = [
            "bob@node07",
            "\"/opt/mpich/bin/hydra_pmi_proxy\"",
            "--control-port",
            "node01:40123",
            "--rmk",
            "user",
            "--launcher",
            "rsh",
            "--launcher-exec",
            "/usr/lib/rb/rsh",
            "--demux",
            "poll",
            "--pgid",
            "0",
            "--proxy-id",
            "1",
        ];
        let inv = ok(&words);
        assert_eq!(
            (inv.host.as_str(), inv.user.as_deref()),
            ("node07", Some("bob"))
        );
        assert!(!inv.no_stdin);
        assert_eq!(
            inv.command.as_deref(),
            Some(
                "\"/opt/mpich/bin/hydra_pmi_proxy\" --control-port node01:40123 --rmk user --launcher rsh \
                 --launcher-exec /usr/lib/rb/rsh --demux poll --pgid 0 --proxy-id 1"
            )
        );
    }

    #[test]
    fn options_before_host_netkit_style() {
        let inv = ok(&["-n", "-l", "bob", "nosuchhost", "hboot", "-t", "-c", "x"]);
        assert_eq!(
            (inv.host.as_str(), inv.user.as_deref()),
            ("nosuchhost", Some("bob"))
        );
        assert!(inv.no_stdin);
        assert_eq!(inv.command.as_deref(), Some("hboot -t -c x"));
    }

    #[test]
    fn clustered_and_attached_forms() {
        let inv = ok(&["-nxlbob", "node03", "-d4", "-oUser=x", "ls"]);
        assert_eq!(inv.user.as_deref(), Some("bob"));
        assert!(inv.no_stdin);
        assert_eq!(inv.passthrough_opts, vec!["-x", "-d", "-4", "-o", "User=x"]);
        let inv = ok(&["node03", "-nl", "carol", "ls"]);
        assert_eq!(inv.user.as_deref(), Some("carol"));
        assert!(inv.no_stdin);
    }

    #[test]
    fn every_contract_option_is_accepted() {
        let inv = ok(&[
            "-d", "-x", "-X", "-K", "-8", "-L", "-e", "-w", "-k", "R", "-4", "-6", "-T", "-t",
            "-q", "-o", "O", "-i", "I", "-F", "F", "-a", "-A", "h", "c",
        ]);
        assert_eq!(inv.host, "h");
        let want = [
            "-d", "-x", "-X", "-K", "-8", "-L", "-e", "-w", "-k", "R", "-4", "-6", "-T", "-t",
            "-q", "-o", "O", "-i", "I", "-F", "F", "-a", "-A",
        ];
        assert_eq!(inv.passthrough_opts, want);
        assert_eq!(inv.command.as_deref(), Some("c"));
    }

    #[test]
    fn login_option_beats_user_at_host() {
        assert_eq!(
            ok(&["bob@h", "-l", "carol", "c"]).user.as_deref(),
            Some("carol")
        );
        assert_eq!(
            ok(&["-l", "carol", "bob@h", "c"]).user.as_deref(),
            Some("carol")
        );
        assert_eq!(
            ok(&["-l", "a", "h", "-l", "b", "c"]).user.as_deref(),
            Some("b")
        );
    }

    #[test]
    fn semicolons_and_value_words_are_joined_verbatim() {
        let inv = ok(&["h", "a;", "b", "\"value\"", "'x y'", ""]);
        assert_eq!(inv.command.as_deref(), Some("a; b \"value\" 'x y' "));
        assert_eq!(inv.words.len(), 5);
    }

    #[test]
    fn no_command_is_none() {
        let inv = ok(&["-n", "h"]);
        assert_eq!(inv.command, None);
        assert!(inv.words.is_empty());
    }

    #[test]
    fn double_dash_ends_options() {
        let inv = ok(&["h", "--", "-n", "x"]);
        assert!(!inv.no_stdin);
        assert_eq!(inv.command.as_deref(), Some("-n x"));
        let inv = ok(&["-n", "--", "h", "-l", "x"]);
        assert_eq!((inv.host.as_str(), inv.user), ("h", None));
        assert_eq!(inv.command.as_deref(), Some("-l x"));
    }

    #[test]
    fn lone_dash_is_a_word() {
        assert_eq!(ok(&["h", "-"]).command.as_deref(), Some("-"));
    }

    #[test]
    fn errors() {
        assert_eq!(err(&[]), UsageError::NoHost);
        assert_eq!(err(&["-n"]), UsageError::NoHost);
        assert_eq!(err(&["-n", "--"]), UsageError::NoHost);
        assert_eq!(err(&["h", "-l"]), UsageError::MissingValue('l'));
        assert_eq!(err(&["-l"]), UsageError::MissingValue('l'));
        assert_eq!(err(&["h", "-p"]), UsageError::MissingValue('p'));
        assert_eq!(err(&["h", "-z", "c"]), UsageError::InvalidOption('z'));
        assert_eq!(err(&["-nz", "h"]), UsageError::InvalidOption('z'));
        assert_eq!(err(&["- x", "h"]), UsageError::InvalidOption(' '));
        assert_eq!(err(&["@h", "c"]), UsageError::BadHost("@h".into()));
        assert_eq!(err(&["bob@", "c"]), UsageError::BadHost("bob@".into()));
        assert_eq!(
            err(&["h", "-z"]).message().as_deref(),
            Some("invalid option -- 'z'")
        );
        assert_eq!(UsageError::NoHost.message(), None);
    }

    #[test]
    fn non_utf8_is_strict_or_lossy() {
        let mut args = argv(&["h"]);
        args.push(OsString::from_vec(vec![b'a', 0xff]));
        assert_eq!(parse(&args), Err(UsageError::NotUtf8(2)));
        let inv = parse_lossy(&args).expect("lossy parse");
        assert_eq!(inv.host, "h");
        assert_eq!(inv.command.as_deref(), Some("a\u{fffd}"));
    }

    #[test]
    fn hostname_link_names_the_host() {
        let args: Vec<OsString> = ["/usr/local/bin/node03", "-l", "bob", "ls", "-l"]
            .iter()
            .map(OsString::from)
            .collect();
        let inv = parse(&args).expect("parses");
        assert_eq!(
            (inv.host.as_str(), inv.user.as_deref()),
            ("node03", Some("bob"))
        );
        assert_eq!(inv.command.as_deref(), Some("ls -l"));
        let args: Vec<OsString> = ["anyLinux", "echo hi"].iter().map(OsString::from).collect();
        let inv = parse(&args).expect("parses");
        assert_eq!(
            (inv.host.as_str(), inv.command.as_deref()),
            ("anyLinux", Some("echo hi"))
        );
    }

    #[test]
    fn shell_names_are_not_hosts() {
        for name in ["rsh", "/x/rsh", "remsh", "rsh-shim", "/usr/bin/ssh"] {
            assert_eq!(host_from_program_name(OsStr::new(name)), None, "{name}");
        }
        assert_eq!(
            host_from_program_name(OsStr::new("/l/node03")).as_deref(),
            Some("node03")
        );
        assert_eq!(shell_name(OsStr::new("/x/ssh")), "ssh");
        assert_eq!(shell_name(OsStr::new("/x/rsh")), "rsh");
        assert_eq!(shell_name(OsStr::new("node03")), "rsh");
    }
}
