//! A caller's options carried over to the remote shell that runs the call, when the two
//! speak different grammars: an `ssh` caller over the job's rsh (`job_shell = ["rsh"]`), an
//! `rsh` caller whose arguments are ssh's (Hydra's default launcher passes `-x`) over netkit
//! rsh, or an rsh caller over ssh.
//!
//! What has a meaning in both is translated (`-n`, `-l USER`, `user@host`, `-o User=…`,
//! `-o StdinNull=yes`); what only tunes the transport is dropped (`-x -X -Y -a -A -T -q -C
//! -2 -4 -6 -v`, ciphers, keys, and `-o` keys such as BatchMode, ConnectTimeout,
//! StrictHostKeyChecking, ControlMaster); everything else is refused with the option's name
//! ([`Refusal`]: exit 255, before any host is allocated) — a forward, a jump host, a terminal
//! over rsh, a port other than 22.
//!
//! Pure functions; [`Family`] names the two grammars.

use std::path::Path;

use crate::args::Invocation;
use crate::ssh_args::{split_option, SshCall, SshOpt};

/// The grammar a remote-shell program speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// OpenSSH's `ssh`.
    Ssh,
    /// netkit `rsh` (`-n -d -l USER`, plus `-8 -K -L -e -w`), and the `local` transport's
    /// `rb-subagent local-shell` (`-n -l USER`).
    Rsh,
}

impl Family {
    /// `ssh` by the program's basename, anything else rsh.
    pub fn of(program: &str) -> Family {
        match Path::new(program).file_name().and_then(|n| n.to_str()) {
            Some("ssh") => Family::Ssh,
            _ => Family::Rsh,
        }
    }

    /// The grammar of a program known by its basename (`ssh`; `rsh`, `remsh`, `netkit-rsh`),
    /// `None` for any other: a pass-through hands such a program the arguments unchanged.
    pub fn known(program: &str) -> Option<Family> {
        match Path::new(program).file_name().and_then(|n| n.to_str()) {
            Some("ssh") => Some(Family::Ssh),
            Some("rsh" | "remsh" | "netkit-rsh") => Some(Family::Rsh),
            _ => None,
        }
    }

    /// The name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Family::Ssh => "ssh",
            Family::Rsh => "rsh",
        }
    }
}

/// An option the remote shell of the call cannot carry. Display: what follows `ssh: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{option}: {reason}")]
pub struct Refusal {
    /// The option as the caller wrote it (`-L 8080:x:80`, `-o ProxyJump=gw`).
    pub option: String,
    pub reason: String,
}

fn refuse(option: &SshOpt, reason: impl Into<String>) -> Refusal {
    Refusal {
        option: option.words().join(" "),
        reason: reason.into(),
    }
}

/// What the command line of a granted host gets from an ssh caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Session {
    /// `-n`.
    pub no_stdin: bool,
    /// `-l USER`.
    pub user: Option<String>,
    /// `-p PORT` (ssh only).
    pub port: Option<u16>,
    /// The caller's other options, as the target takes them (in order).
    pub extra: Vec<String>,
}

/// `-o` keys that only tune how the connection is made: dropped for rsh.
const HARMLESS_KEYS: &[&str] = &[
    "addkeystoagent",
    "addressfamily",
    "batchmode",
    "bindaddress",
    "bindinterface",
    "canonicaldomains",
    "canonicalizefallbacklocal",
    "canonicalizehostname",
    "canonicalizemaxdots",
    "canonicalizepermittedcnames",
    "certificatefile",
    "challengeresponseauthentication",
    "checkhostip",
    "ciphers",
    "clearallforwardings",
    "compression",
    "connectionattempts",
    "connecttimeout",
    "controlmaster",
    "controlpath",
    "controlpersist",
    "escapechar",
    "exitonforwardfailure",
    "fingerprinthash",
    "forwardagent",
    "forwardx11",
    "forwardx11timeout",
    "forwardx11trusted",
    "globalknownhostsfile",
    "gssapiauthentication",
    "gssapidelegatecredentials",
    "hashknownhosts",
    "hostbasedauthentication",
    "hostbasedacceptedalgorithms",
    "hostkeyalgorithms",
    "hostkeyalias",
    "identitiesonly",
    "identityagent",
    "identityfile",
    "ipqos",
    "kbdinteractiveauthentication",
    "kbdinteractivedevices",
    "kexalgorithms",
    "localcommand",
    "loglevel",
    "logverbose",
    "macs",
    "numberofpasswordprompts",
    "passwordauthentication",
    "permitlocalcommand",
    "pkcs11provider",
    "preferredauthentications",
    "pubkeyacceptedalgorithms",
    "pubkeyauthentication",
    "rekeylimit",
    "requiredrsasize",
    "revokedhostkeys",
    "securitykeyprovider",
    "serveraliveinterval",
    "serveralivecountmax",
    "streamlocalbindmask",
    "streamlocalbindunlink",
    "stricthostkeychecking",
    "syslogfacility",
    "tag",
    "tcpkeepalive",
    "updatehostkeys",
    "userknownhostsfile",
    "verifyhostkeydns",
    "visualhostkey",
    "xauthlocation",
];

/// Flags of ssh that only tune the connection: dropped for rsh.
const HARMLESS_FLAGS: &str = "xXYaATqC246vkKgyM";
/// Options of ssh with an argument that only tune the connection: dropped for rsh.
const HARMLESS_VALUED: &str = "cmiIFESPbBe";

/// The session options of an ssh caller for a granted host reached with `target`, or the
/// first option that cannot work there. `-s` is not carried (the shim runs the subsystem
/// itself, [`subsystem_command`]); `-t`/`-T` are left to the caller of this function.
pub fn ssh_session(call: &SshCall, target: Family) -> Result<Session, Refusal> {
    let mut session = Session {
        user: call.user.clone(),
        port: call.port.filter(|p| *p != 22 || target == Family::Ssh),
        ..Session::default()
    };
    if let (Family::Rsh, Some(port)) = (target, session.port) {
        let option = call
            .opts
            .iter()
            .find(|o| o.letter() == 'p')
            .map_or(format!("port {port}"), |o| o.words().join(" "));
        return Err(Refusal {
            option,
            reason: "the job's remote shell (rsh) has no port; only 22 can be dropped".into(),
        });
    }
    for opt in &call.opts {
        session_option(opt, target, &mut session)?;
    }
    Ok(session)
}

/// One option of an ssh caller: into `session`, dropped, or refused.
fn session_option(opt: &SshOpt, target: Family, session: &mut Session) -> Result<(), Refusal> {
    let letter = opt.letter();
    match (letter, target) {
        ('n', _) => session.no_stdin = true,
        ('l' | 'p' | 's', _) => {}
        ('t', Family::Rsh) => return Err(refuse(opt, rsh_cannot('t'))),
        ('N', _) => {
            return Err(refuse(
                opt,
                "opens no session: nothing would run on the granted host",
            ))
        }
        ('f', _) => return Err(refuse(
            opt,
            "puts ssh in the background: the job could not follow the command on the granted host",
        )),
        ('W', _) => {
            return Err(refuse(
                opt,
                "forwards stdio elsewhere: no command would run on the granted host",
            ))
        }
        ('o', _) => return option_key(opt, target, session),
        (_, Family::Ssh) => session.extra.extend(opt.words()),
        (_, Family::Rsh) if HARMLESS_FLAGS.contains(letter) => {}
        (_, Family::Rsh)
            if HARMLESS_VALUED.contains(letter) && matches!(opt, SshOpt::Valued(..)) => {}
        (_, Family::Rsh) => return Err(refuse(opt, rsh_cannot(letter))),
    }
    Ok(())
}

/// Why an rsh remote shell cannot carry option `letter`.
fn rsh_cannot(letter: char) -> &'static str {
    match letter {
        'L' | 'R' | 'D' => "the job's remote shell (rsh) forwards no ports",
        'w' => "the job's remote shell (rsh) forwards no tunnel devices",
        'J' => "the job's remote shell (rsh) cannot go through a jump host",
        't' => "the job's remote shell (rsh) gives no terminal",
        '1' => "SSH protocol v.1 is no longer supported",
        _ => "the job's remote shell (rsh) has no such option",
    }
}

/// `-o Key=Value` of an ssh caller.
fn option_key(opt: &SshOpt, target: Family, session: &mut Session) -> Result<(), Refusal> {
    let SshOpt::Valued(_, text) = opt else {
        return Ok(());
    };
    let (key, value) = split_option(text);
    let key = key.to_ascii_lowercase();
    let yes = value.eq_ignore_ascii_case("yes");
    match key.as_str() {
        "hostname" => {
            return Err(refuse(
                opt,
                "would send the call to another host than the granted one",
            ))
        }
        "remotecommand" if !value.eq_ignore_ascii_case("none") => {
            return Err(refuse(
                opt,
                "give the command on the command line: it runs under the job's subagent",
            ))
        }
        "sessiontype" if value.eq_ignore_ascii_case("none") => {
            return Err(refuse(
                opt,
                "opens no session: nothing would run on the granted host",
            ))
        }
        "sessiontype" if value.eq_ignore_ascii_case("subsystem") => {
            return Err(refuse(
                opt,
                "use -s: the shim runs the subsystem under the job's subagent",
            ))
        }
        "forkafterauthentication" if yes => return Err(refuse(
            opt,
            "puts ssh in the background: the job could not follow the command on the granted host",
        )),
        "stdinnull" if yes => session.no_stdin = true,
        _ => {}
    }
    if target == Family::Ssh {
        session.extra.extend(opt.words());
        return Ok(());
    }
    match key.as_str() {
        "user" | "port" | "remotecommand" | "sessiontype" | "stdinnull" => Ok(()),
        "requesttty" if matches!(value.to_ascii_lowercase().as_str(), "no" | "auto") => Ok(()),
        "requesttty" => Err(refuse(
            opt,
            "the job's remote shell (rsh) gives no terminal",
        )),
        k if HARMLESS_KEYS.contains(&k) => Ok(()),
        _ => Err(refuse(
            opt,
            "the job's remote shell (rsh) has no such setting",
        )),
    }
}

/// The command that runs subsystem `name` (ssh's `-s`) under the subagent: sshd would run
/// its configured server; the sftp server is found where distributions install it.
pub fn subsystem_command(name: &str) -> Option<String> {
    (name == "sftp").then(|| {
        "for p in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server \
         /usr/libexec/sftp-server /usr/lib/ssh/sftp-server /usr/lib/sftp-server; \
         do if [ -x \"$p\" ]; then exec \"$p\"; fi; done; \
         echo 'sftp-server not found on this host' >&2; exit 127"
            .to_string()
    })
}

/// The command of an interactive login (`ssh anyLinux` without a command): the user's login
/// shell, as sshd starts it.
pub const LOGIN_COMMAND: &str = "exec \"${SHELL:-/bin/sh}\" -l";

/// netkit rsh's own options (`getopt "8KLdel:nw"`).
const NETKIT_FLAGS: &str = "8KLdenw";

/// An rsh-shim call's arguments for a pass-through to `target`, when the caller used
/// options `target` does not take: `None` when the arguments go unchanged (the common case,
/// and the cheap one), else the rebuilt `[-n] [-l USER] [options] HOST WORDS…`.
pub fn rsh_passthrough(inv: &Invocation, target: Family) -> Result<Option<Vec<String>>, Refusal> {
    let foreign = |letter: char| match target {
        Family::Rsh => !NETKIT_FLAGS.contains(letter) && letter != 'l',
        // rsh's -d, -8, -L, -e, -w, -k mean something else (or nothing) to ssh.
        Family::Ssh => "d8KLewk".contains(letter),
    };
    let letters: Vec<char> = opt_letters(inv);
    let port = inv.port.as_deref().filter(|p| *p != "22");
    if !letters.iter().any(|l| foreign(*l)) && (port.is_none() || target == Family::Ssh) {
        return Ok(None);
    }
    if let (Family::Rsh, Some(port)) = (target, port) {
        return Err(Refusal {
            option: format!("-p {port}"),
            reason: "the job's remote shell (rsh) has no port; only 22 can be dropped".into(),
        });
    }
    let mut out = Vec::new();
    if inv.no_stdin {
        out.push("-n".to_string());
    }
    if let Some(user) = &inv.user {
        out.extend(["-l".to_string(), user.clone()]);
    }
    if let (Family::Ssh, Some(port)) = (target, &inv.port) {
        out.extend(["-p".to_string(), port.clone()]);
    }
    let mut opts = inv.passthrough_opts.iter();
    while let Some(opt) = opts.next() {
        let letter = opt.chars().nth(1).unwrap_or_default();
        let value = crate::args::takes_value(letter)
            .then(|| opts.next())
            .flatten();
        if !foreign(letter) {
            out.push(opt.clone());
            out.extend(value.cloned());
            continue;
        }
        if target == Family::Rsh {
            rsh_drops(letter, value.map(String::as_str), opt)?;
        }
    }
    out.push(inv.host.clone());
    out.extend(inv.words.iter().cloned());
    Ok(Some(out))
}

/// Whether netkit rsh can do without an ssh option of an rsh-shim call (else the refusal).
fn rsh_drops(letter: char, value: Option<&str>, opt: &str) -> Result<(), Refusal> {
    let as_ssh = match value {
        Some(v) => SshOpt::Valued(letter, v.to_string()),
        None => SshOpt::Flag(letter),
    };
    if letter == 'o' {
        let mut ignored = Session::default();
        return option_key(&as_ssh, Family::Rsh, &mut ignored);
    }
    if HARMLESS_FLAGS.contains(letter) || (HARMLESS_VALUED.contains(letter) && value.is_some()) {
        return Ok(());
    }
    Err(Refusal {
        option: opt.to_string(),
        reason: rsh_cannot(letter).to_string(),
    })
}

fn opt_letters(inv: &Invocation) -> Vec<char> {
    let mut letters = Vec::new();
    let mut opts = inv.passthrough_opts.iter();
    while let Some(opt) = opts.next() {
        let letter = opt.chars().nth(1).unwrap_or_default();
        if crate::args::takes_value(letter) {
            opts.next();
        }
        letters.push(letter);
    }
    letters
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;
    use crate::ssh_args::parse_words;

    fn call(words: &[&str]) -> SshCall {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        parse_words(&words).expect("parses")
    }

    fn inv(words: &[&str]) -> Invocation {
        let args: Vec<OsString> = std::iter::once("rsh")
            .chain(words.iter().copied())
            .map(OsString::from)
            .collect();
        crate::args::parse(&args).expect("parses")
    }

    #[test]
    fn families() {
        assert_eq!(Family::of("/usr/bin/ssh"), Family::Ssh);
        assert_eq!(Family::of("ssh"), Family::Ssh);
        assert_eq!(Family::of("rsh"), Family::Rsh);
        assert_eq!(Family::of("/opt/rb/rb-subagent"), Family::Rsh);
        assert_eq!(Family::known("/usr/bin/rsh"), Some(Family::Rsh));
        assert_eq!(Family::known("/opt/rb/rb-subagent"), None);
    }

    #[test]
    fn ssh_over_ssh_keeps_every_session_option() {
        let c = call(&[
            "-x",
            "-C",
            "-o",
            "ControlMaster=auto",
            "-i",
            "/k",
            "-n",
            "-l",
            "bob",
            "-p",
            "2222",
            "-s",
            "-t",
            "anyLinux",
            "sftp",
        ]);
        let s = ssh_session(&c, Family::Ssh).expect("carried");
        assert!(s.no_stdin);
        assert_eq!(s.user.as_deref(), Some("bob"));
        assert_eq!(s.port, Some(2222));
        assert_eq!(
            s.extra,
            ["-x", "-C", "-o", "ControlMaster=auto", "-i", "/k", "-t"]
        );
    }

    #[test]
    fn ssh_over_rsh_translates_and_drops() {
        // pdsh -R ssh, Hydra, Open MPI, ansible, scp: what they pass.
        let c = call(&[
            "-2",
            "-a",
            "-x",
            "-T",
            "-q",
            "-C",
            "-4",
            "-oBatchMode=yes",
            "-o",
            "ConnectTimeout 3",
            "-oStrictHostKeyChecking=no",
            "-oControlMaster=auto",
            "-oControlPersist=60s",
            "-oForwardX11 no",
            "-oRemoteCommand=none",
            "-oRequestTTY=no",
            "-oUser=carol",
            "-oStdinNull=yes",
            "-p22",
            "anyLinux",
            "hostname",
        ]);
        let s = ssh_session(&c, Family::Rsh).expect("translated");
        assert_eq!(
            s,
            Session {
                no_stdin: true,
                user: Some("carol".into()),
                port: None,
                extra: vec![]
            }
        );
    }

    #[test]
    fn what_cannot_work_is_refused_by_name() {
        let refused =
            |words: &[&str], target| ssh_session(&call(words), target).expect_err("refused");
        let r = refused(&["-L", "8080:x:80", "h", "c"], Family::Rsh);
        assert_eq!(r.option, "-L 8080:x:80");
        assert!(r.reason.contains("forwards no ports"), "{r}");
        assert_eq!(
            refused(&["-J", "gw", "h", "c"], Family::Rsh).option,
            "-J gw"
        );
        assert_eq!(refused(&["-t", "h", "c"], Family::Rsh).option, "-t");
        assert_eq!(
            refused(&["-p", "2222", "h", "c"], Family::Rsh).option,
            "-p 2222"
        );
        assert_eq!(
            refused(&["-oSendEnv=LANG", "h", "c"], Family::Rsh).option,
            "-o SendEnv=LANG"
        );
        assert_eq!(
            refused(&["-oRequestTTY=yes", "h", "c"], Family::Rsh).option,
            "-o RequestTTY=yes"
        );
        for target in [Family::Ssh, Family::Rsh] {
            assert_eq!(refused(&["-N", "h"], target).option, "-N");
            assert_eq!(refused(&["-f", "h", "c"], target).option, "-f");
            assert_eq!(refused(&["-W", "x:22", "h"], target).option, "-W x:22");
            assert_eq!(
                refused(&["-oHostName=x", "h", "c"], target).option,
                "-o HostName=x"
            );
            assert_eq!(
                refused(&["-oRemoteCommand=ls", "h"], target).option,
                "-o RemoteCommand=ls"
            );
        }
    }

    #[test]
    fn ssh_terminal_flag_over_rsh_is_refused() {
        // -t asks for a terminal the rsh transport cannot give; -T (none) is dropped.
        assert!(ssh_session(&call(&["-T", "h", "c"]), Family::Rsh).is_ok());
    }

    #[test]
    fn rsh_passthrough_unchanged_when_the_target_takes_everything() {
        assert_eq!(
            rsh_passthrough(&inv(&["-n", "-l", "bob", "h", "ls"]), Family::Rsh),
            Ok(None)
        );
        assert_eq!(
            rsh_passthrough(&inv(&["-x", "h", "ls"]), Family::Ssh),
            Ok(None)
        );
        assert_eq!(
            rsh_passthrough(&inv(&["-d", "h", "ls"]), Family::Rsh),
            Ok(None)
        );
    }

    #[test]
    fn hydra_x_over_netkit_rsh_is_dropped() {
        let got = rsh_passthrough(
            &inv(&["-x", "node03", "\"/usr/bin/hydra_pmi_proxy\"", "--x"]),
            Family::Rsh,
        );
        assert_eq!(
            got,
            Ok(Some(vec![
                "node03".into(),
                "\"/usr/bin/hydra_pmi_proxy\"".into(),
                "--x".into()
            ]))
        );
        let got = rsh_passthrough(
            &inv(&[
                "-x",
                "-o",
                "BatchMode=yes",
                "-n",
                "-l",
                "bob",
                "-p",
                "22",
                "h",
                "ls",
                "-l",
            ]),
            Family::Rsh,
        );
        assert_eq!(
            got,
            Ok(Some(
                ["-n", "-l", "bob", "h", "ls", "-l"]
                    .map(String::from)
                    .to_vec()
            ))
        );
        let refused = rsh_passthrough(&inv(&["-t", "h", "ls"]), Family::Rsh).expect_err("refused");
        assert_eq!(refused.option, "-t");
        let refused =
            rsh_passthrough(&inv(&["-p", "2222", "h", "ls"]), Family::Rsh).expect_err("port");
        assert_eq!(refused.option, "-p 2222");
    }

    #[test]
    fn rsh_options_over_ssh_are_dropped() {
        let got = rsh_passthrough(&inv(&["-d", "-8", "-n", "h", "ls"]), Family::Ssh);
        assert_eq!(got, Ok(Some(["-n", "h", "ls"].map(String::from).to_vec())));
    }

    #[test]
    fn only_the_sftp_subsystem_runs() {
        assert!(subsystem_command("sftp").is_some_and(|c| c.contains("sftp-server")));
        assert_eq!(subsystem_command("netconf"), None);
    }
}
