//! The `ssh` shim's documented grammar as a clap [`Command`], for its man page only: the
//! shim parses argv by hand exactly as OpenSSH 9.2's `ssh(1)` does (`rsh_shim::ssh_args`,
//! whose option letters this page is built from, so the two cannot drift), and never links
//! clap. The page is installed as `rb-ssh(1)`: `ssh(1)` stays OpenSSH's.

use clap::{Arg, ArgAction, Command};
use rsh_shim::ssh_args::{FLAGS, VALUED};

/// What each flag (an option without an argument) does here, beyond ssh's own meaning.
fn flag_help(letter: char) -> &'static str {
    match letter {
        'N' => "No remote command: passed on for a real host; refused for a granted one (nothing would run there).",
        'f' => "Background after authentication: passed on for a real host; refused for a granted one (the job could not follow the command).",
        'G' => "Print the configuration and exit: the real ssh runs, no host is ever allocated.",
        'V' => "Print ssh's version and exit: the real ssh runs, no host is ever allocated.",
        's' => "The command is a subsystem: `sftp` runs the host's sftp-server under the subagent on a granted host; other subsystems are refused there.",
        't' => "Force a terminal (refused over an rsh job shell: rsh gives no terminal).",
        'n' => "stdin from /dev/null (translated to rsh's -n over an rsh job shell).",
        'M' | 'C' | 'x' | 'X' | 'Y' | 'a' | 'A' | 'T' | 'q' | 'v' | 'k' | 'K' | 'g' | 'y' | '2' | '4' | '6' => {
            "As ssh(1); passed on over ssh, dropped over an rsh job shell."
        }
        _ => "As ssh(1); passed on.",
    }
}

/// ssh(1)'s name for each option's argument, and what happens to it here.
fn valued(letter: char) -> (&'static str, &'static str) {
    match letter {
        'B' => ("bind_interface", "As ssh(1); dropped over rsh."),
        'b' => ("bind_address", "As ssh(1); dropped over rsh."),
        'c' => ("cipher_spec", "As ssh(1); dropped over rsh."),
        'D' => ("[bind_address:]port", "Dynamic forwarding; refused over an rsh job shell."),
        'E' => ("log_file", "As ssh(1); dropped over rsh."),
        'e' => ("escape_char", "As ssh(1); dropped over rsh."),
        'F' => ("configfile", "As ssh(1); dropped over rsh."),
        'I' => ("pkcs11", "As ssh(1); dropped over rsh."),
        'i' => ("identity_file", "As ssh(1); dropped over rsh."),
        'J' => ("destination", "Jump host; refused over an rsh job shell."),
        'L' => ("address", "Local forwarding; refused over an rsh job shell."),
        'l' => ("login_name", "The login (the first of -l, user@ and -o User= wins, as in ssh); rsh's -l over rsh."),
        'm' => ("mac_spec", "As ssh(1); dropped over rsh."),
        'O' => ("ctl_cmd", "Control a master (check, exit, stop, ...): the real ssh runs, no host is ever allocated."),
        'o' => ("option", "-o Key=Value or -o \"Key Value\", also glued (-oKey=Value); keys in any case. Over rsh: what has a meaning there is translated (User, StdinNull), connection tuning dropped, forwarding refused. HostName= and RemoteCommand= are refused for a granted host."),
        'P' => ("tag", "As ssh(1); dropped over rsh."),
        'p' => ("port", "The port (the last -p wins); over rsh only 22 (dropped), another port is refused."),
        'Q' => ("query_option", "Query and exit: the real ssh runs, no host is ever allocated."),
        'R' => ("address", "Remote forwarding; refused over an rsh job shell."),
        'S' => ("ctl_path", "As ssh(1); dropped over rsh."),
        'W' => ("host:port", "stdio forwarding: passed on for a real host; refused for a granted one."),
        'w' => ("local_tun[:remote_tun]", "Tunnel device; refused over an rsh job shell."),
        _ => ("value", "As ssh(1); passed on."),
    }
}

const ABOUT: &str =
    "ResourceBroker's drop-in ssh: a host chosen now for `ssh anyLinux cmd`, plain ssh otherwise";

const LONG_ABOUT: &str = "\
ResourceBroker's drop-in ssh. Every job run under `agent` has it first on its PATH as `ssh`
(beside `rsh`, `scp` and `sftp`, one program that picks its grammar by the name it is called
under); the Debian package installs it as /usr/lib/rb/shims/ssh (this page as rb-ssh), never
as /usr/bin/ssh. scp and sftp, which run ssh by full path, reach it through the job's `scp` and
`sftp`, which run the real ones with `-S JOBDIR/bin/ssh`.

Grammar: OpenSSH 9.2's ssh(1), exactly: flags cluster (-nT), an option's argument is glued
(-p22) or the next word; `[user@]host` or `ssh://[user@]host[:port]`; options may follow the
destination until the first command word or `--`; the command words are joined with single
blanks for the remote shell.

DESTINATION is one of the following.

A real host not granted to the job: the real ssh (the first ssh in PATH that is not the shim,
else /usr/bin/ssh) runs with the caller's arguments unchanged: no broker round trip. So do
calls that open no session (-G, -V, -Q, -O check|exit|stop) whatever the destination.

anyHost, anyLinux, any<Label>: the broker picks a free eligible host now; the command runs
there under rb-subagent through the job's remote shell (RB_REAL_RSH, the lab file's
job_shell), with the same exit status, stdin end-of-file, signals and take-back as
`rsh anyLinux`. Without a command: an interactive login ($SHELL -l) on the granted host, with a
terminal when stdin is one. Over ssh, each granted host gets one master connection owned by
the job (ControlMaster in the job's private directory, closed when the host goes back or the
job ends), so later calls skip the handshake; host keys are checked under the host's lab name
(HostKeyAlias).

An instance <symbolic name>-<N> (anyLinux-1): the first call binds it to a host, later calls
reach the same host until the job ends. A host the job holds: runs under rb-subagent there.

When the job's remote shell is rsh, ssh's options are translated where they mean something to
rsh, dropped where they only tune the connection, and refused otherwise; a refusal names the
option and exits 255 at once, before any host is allocated (never a hang).

Exit status: the remote command's; 143 when the broker took the host back while the command
ran (one line on stderr says so); 255 for ssh's own errors, a refused option, or an instance
whose host was taken back. RB_VERBOSE set: one line on stderr says where the call went
(pass-through or granted, over ssh or rsh). The book: docs/src/user/ssh.md.";

/// An argument id made at run time (clap's ids are `&'static str` without its `string`
/// feature); the page is built a few times per process, so what leaks is a few hundred bytes.
fn id(name: String) -> &'static str {
    Box::leak(name.into_boxed_str())
}

/// The `ssh` shim's command line as documented (see the module doc).
pub fn command() -> Command {
    let mut cmd = Command::new("ssh")
        .version(env!("CARGO_PKG_VERSION"))
        .about(ABOUT)
        .long_about(LONG_ABOUT)
        .disable_help_flag(true)
        .disable_version_flag(true);
    for letter in VALUED.chars() {
        let (value, help) = valued(letter);
        cmd = cmd.arg(
            Arg::new(id(format!("opt-{letter}")))
                .short(letter)
                .value_name(value)
                .action(ArgAction::Append)
                .help(help),
        );
    }
    for letter in FLAGS.chars() {
        cmd = cmd.arg(
            Arg::new(id(format!("flag-{letter}")))
                .short(letter)
                .action(ArgAction::SetTrue)
                .help(flag_help(letter)),
        );
    }
    cmd.arg(
        Arg::new("destination")
            .required(true)
            .value_name("DESTINATION")
            .help("[user@]host or ssh://[user@]host[:port]: a real host, a symbolic name (anyLinux, anyHost, any<Label>) or an instance (anyLinux-1)."),
    )
    .arg(
        Arg::new("command")
            .value_name("COMMAND")
            .num_args(0..)
            .trailing_var_arg(true)
            .allow_hyphen_values(true)
            .help("The remote command; its words are joined with single blanks. None: an interactive login."),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_of_the_shims_grammar_is_documented_once() {
        let cmd = command();
        for letter in FLAGS.chars().chain(VALUED.chars()) {
            let args: Vec<_> = cmd
                .get_arguments()
                .filter(|a| a.get_short() == Some(letter))
                .collect();
            assert_eq!(args.len(), 1, "-{letter}");
            if VALUED.contains(letter) {
                assert_ne!(valued(letter).0, "value", "-{letter} has no ssh(1) name");
            }
        }
    }
}
