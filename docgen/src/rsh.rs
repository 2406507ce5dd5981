//! The `rsh` shim's documented grammar as a clap [`Command`], for its man page and
//! completions only: the shim itself parses argv by hand, exactly as netkit rsh does
//! (`rsh_shim::args`), and never links clap (it is on every remote start of every job).

use clap::{Arg, ArgAction, Command};

/// Options without a value that rsh and ssh callers pass (`rsh_shim::args`' FLAGS).
const FLAGS: &[(char, &str, &str)] = &[
    ('n', "flag-n", "Take stdin from /dev/null."),
    (
        'd',
        "flag-d",
        "Passed on to the real remote shell (rsh: socket debugging).",
    ),
    (
        'x',
        "flag-x",
        "Passed on (rsh: encryption; ssh: no X11 forwarding).",
    ),
    ('X', "flag-X", "Passed on (ssh: X11 forwarding)."),
    ('K', "flag-K", "Passed on (rsh: no Kerberos)."),
    ('8', "flag-8", "Passed on (rsh: 8-bit clean)."),
    ('L', "flag-L", "Passed on (rsh: litteral escape)."),
    ('e', "flag-e", "Passed on."),
    ('w', "flag-w", "Passed on."),
    ('4', "flag-4", "Passed on (IPv4 only)."),
    ('6', "flag-6", "Passed on (IPv6 only)."),
    ('T', "flag-T", "Passed on (ssh: no pseudo-terminal)."),
    ('t', "flag-t", "Passed on (ssh: force a pseudo-terminal)."),
    ('q', "flag-q", "Passed on (ssh: quiet)."),
    ('a', "flag-a", "Passed on (ssh: no agent forwarding)."),
    ('A', "flag-A", "Passed on (ssh: agent forwarding)."),
];

const ABOUT: &str =
    "ResourceBroker's drop-in remote shell: a host chosen now for `rsh anyLinux cmd`";

const LONG_ABOUT: &str = "\
ResourceBroker's drop-in remote shell. Every job run under `agent` finds it first on its PATH
(and in PVM_RSH, LAMRSH, OMPI_MCA_plm_rsh_agent, HYDRA_LAUNCHER_EXEC); the Debian package
installs it as /usr/lib/rb/shims/rsh (this page as rb-rsh), never as /usr/bin/rsh.

Grammar: `rsh [opts] host [opts] command…`, as netkit rsh: options may be clustered (-nx) and
take attached values (-lbob); option parsing stops at the first word after the host that is
not an option, or after `--`; the command words are joined with single spaces for the remote
shell. `user@host` names the user (-l wins).

HOST is one of the following.

A real host not granted to the job: the real remote shell runs with the same arguments (exec,
no broker round trip).

anyHost, anyLinux, any<Label> (labels from the lab file and the sensors, case-insensitive, `_`
read as `-`): the broker picks a free eligible host now and the command runs there under
rb-subagent; the request waits in a queue while no host is eligible.

An instance <symbolic name>-<N> (anyLinux-1): the first call binds it to a host, later calls
reach the same host until the job ends.

A host the job holds: the command runs under rb-subagent there.

Outside any agent, `rsh anyLinux cmd` runs itself under a one-shot agent. The exit status is
the real remote shell's; 143 when the broker took the host back while the command ran (one
line on stderr says so); 255 when an instance's host was taken back; 1 for a symbolic name no
launcher would accept (the message names the one to use). RB_VERBOSE set: say on stderr why a
request waits.";

/// The `rsh` command line as documented (see the module doc).
pub fn command() -> Command {
    let mut cmd = Command::new("rsh")
        .version(env!("CARGO_PKG_VERSION"))
        .about(ABOUT)
        .long_about(LONG_ABOUT)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(
            Arg::new("login")
                .short('l')
                .value_name("USER")
                .help("Log in as USER on the host (beats user@host; the last -l wins)."),
        )
        .arg(
            Arg::new("port")
                .short('p')
                .value_name("PORT")
                .help("Passed on: the port."),
        )
        .arg(
            Arg::new("option")
                .short('o')
                .value_name("OPT")
                .help("Passed on (ssh: -o OPT)."),
        )
        .arg(
            Arg::new("identity")
                .short('i')
                .value_name("FILE")
                .help("Passed on (ssh: identity file)."),
        )
        .arg(
            Arg::new("config")
                .short('F')
                .value_name("FILE")
                .help("Passed on (ssh: config file)."),
        )
        .arg(
            Arg::new("realm")
                .short('k')
                .value_name("REALM")
                .help("Passed on (rsh: Kerberos realm)."),
        );
    for (c, id, help) in FLAGS {
        cmd = cmd.arg(
            Arg::new(*id)
                .short(*c)
                .action(ArgAction::SetTrue)
                .help(*help),
        );
    }
    cmd.arg(Arg::new("host").required(true).value_name("HOST").help(
        "A real host, a symbolic name (anyLinux, anyHost, any<Label>) or an instance (anyLinux-1).",
    ))
    .arg(
        Arg::new("command")
            .value_name("COMMAND")
            .num_args(0..)
            .trailing_var_arg(true)
            .allow_hyphen_values(true)
            .help("The remote command; its words are joined with single spaces."),
    )
}
