//! `rsh`: the drop-in remote shell a job's agent puts first in PATH (and in PVM_RSH, LAMRSH,
//! OMPI_MCA_plm_rsh_agent, HYDRA_LAUNCHER_EXEC); under the names `ssh`, `scp` and `sftp` the
//! same program is the job's ssh ([`ssh`]) and its copy programs ([`copy`]).
//!
//! A small synchronous program: it decides where a call goes before talking to anyone, and
//! the real remote shell relays stdin (with EOF), stdout/stderr unbuffered and the remote
//! status itself: the pass-through ends in `exec`; a granted host's remote shell runs as
//! the shim's child with the caller's stdio ([`child`]). It writes nothing on stderr on
//! success (LAM treats any stderr output as a failed boot); its own errors exit 1, except a
//! call with an instance name whose host the broker took back, which exits 255 as ssh does
//! for a host it cannot reach ([`ShimError::exit_code`]).
//!
//! A granted host taken back: netkit rsh exits 0 whatever the remote command
//! did, so when the subagent ended the command for a reclaim the caller would take it for
//! a success (Open MPI's `mpirun` then waits for ever for the orted's callback). When the
//! remote shell exits 0, the shim reads whether the broker took that allocation back (a file
//! the agent writes into the job's directory first, [`proto::taken_back`]: no round trip); if so it says so in one line on stderr,
//! `rsh: HOST was taken back by the broker (…)`, and exits 143 (128+SIGTERM: what ssh
//! returns there, the subagent's status for a command it ended with SIGTERM). It asks too
//! when ssh itself returns 143 or 255, to print the same line.
//!
//! Routing (see [`route`]):
//! 1. a host listed in `RB_HOSTS_FILE` → `attach` request to the agent, run under a subagent;
//! 2. a symbolic host (`anyLinux`) → `allocate` request to the agent (or, with no agent,
//!    `agent -- rsh ARGS…` as a one-shot job), run under a subagent on the granted host;
//! 3. anything else → pass-through to the real remote shell with the same arguments (in a
//!    job, after a `named` line to the agent: the job uses that host by name); when the real
//!    remote shell is netkit rsh and the arguments carry ssh's options (Hydra's `-x`), with
//!    what they mean to rsh ([`translate`]).
//!
//! `RB_VERBOSE` set: one line on stderr says which remote shell a call used
//! (`route_line`); the agent gets the same line (`named`'s `via`, `used`) for `rb jobs`.
//!
//! The job is the caller's whatever its environment: with `RB_AGENT` unset, the agent is
//! found next to the shim's own path, or for a symbolic host in an ancestor's environment
//! ([`lineage`]).
//!
//! `RB_SHIM_DEPTH` counts the shims above us; at 4 we refuse, which stops a loop such as
//! `RB_REAL_RSH` naming the shim itself.
//!
//! # Layout
//! - [`args`]: argv parsing (`Invocation`), exactly as rsh callers need.
//! - [`callers`]: what particular callers (PVM's hoster) read from a refusal on stdout.
//! - [`hosts`]: symbolic names and the job's hosts file.
//! - [`realsh`]: finding the real remote shell, never ourselves.
//! - [`conversation`]: the request/reply exchange with the agent (`proto::agent`).
//! - [`quote`]: the remote command string that starts the subagent.
//! - [`lineage`]: the job of a caller that cleaned its environment (own directory, ancestry).
//! - [`launch`]: exec plans (pass-through, granted host, one-shot agent) and `exec`.
//! - [`child`]: a granted host's remote shell as a child, signals passed on, its end.
//! - [`ssh`], [`ssh_args`]: the same drop-in as `ssh` (OpenSSH's grammar), when the program
//!   is invoked under that name; [`translate`]: options carried between ssh and rsh.
//! - [`copy`]: `scp` and `sftp`, which call ssh by full path: the real ones, told to use the
//!   job's `ssh` (`-S`).
//! - [`mux`]: one ssh master connection per granted host, shared by the job's calls.

pub mod args;
pub mod callers;
pub mod child;
pub mod conversation;
pub mod copy;
pub mod hosts;
pub mod launch;
pub mod lineage;
pub mod mux;
pub mod quote;
pub mod realsh;
pub mod ssh;
pub mod ssh_args;
pub mod translate;

use std::convert::Infallible;
use std::ffi::{OsStr, OsString};
use std::io::{self, IsTerminal, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use proto::agent::{ShimRequest, ENV_AGENT, ENV_HOSTS_FILE, ENV_REAL_RSH, ENV_SHIM_DEPTH};

use crate::args::{Invocation, UsageError};
use crate::child::Ended;
use crate::conversation::{ConversationError, Grant, Outcome};
use crate::launch::Plan;
use crate::realsh::RealShellError;
use crate::ssh_args::{SshCall, SshUsageError};
use crate::translate::{Family, Refusal};

/// Refuse to run when this many shims are already above us.
pub const MAX_DEPTH: u32 = 4;

/// Everything that makes the shim exit 1. The display text follows `rsh: `.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("{0}")]
    Usage(#[from] UsageError),
    #[error(
        "refusing to recurse ({ENV_SHIM_DEPTH}={depth}): is RB_REAL_RSH pointing at the shim?"
    )]
    Recursion { depth: u32 },
    /// Exit 255: instance `name` was bound to `host`, which the broker took back.
    #[error("{name}: {message}")]
    InstanceLost {
        name: String,
        host: String,
        message: String,
    },
    #[error("{host}: a symbolic host needs a command")]
    SymbolicWithoutCommand { host: String },
    #[error("{host}: a host allocated to this job needs a command")]
    AttachWithoutCommand { host: String },
    /// `stdout`: a line for callers that read the refusal there ([`callers`]).
    #[error("{host}: {message}")]
    Refused {
        host: String,
        message: String,
        stdout: Option<String>,
    },
    #[error("cannot reach the agent at ${ENV_AGENT} ({path}): {source}")]
    AgentUnreachable { path: String, source: io::Error },
    /// The socket is served by another uid: nothing was sent to it.
    #[error("{0}")]
    NotOurAgent(#[from] proto::peercred::PeerError),
    #[error("{host}: the agent at ${ENV_AGENT} ({path}): {source}")]
    Agent {
        path: String,
        host: String,
        source: ConversationError,
    },
    #[error("{host} is listed in ${ENV_HOSTS_FILE} but ${ENV_AGENT} is not set")]
    NoAgentVariable { host: String },
    #[error("{host} is symbolic but no agent is running and `agent` was not found")]
    NoAgentProgram { host: String },
    #[error("cannot read ${ENV_HOSTS_FILE} ({path}): {source}")]
    HostsFile { path: String, source: io::Error },
    #[error("{0}")]
    RealShell(#[from] RealShellError),
    #[error("cannot find my own executable: {0}")]
    SelfExe(io::Error),
    #[error("cannot run {program}: {source}")]
    Exec { program: String, source: io::Error },
    /// An ssh call whose command line ssh itself would refuse (exit 255).
    #[error("{0}")]
    SshUsage(#[from] SshUsageError),
    /// An option the remote shell of the call cannot carry (exit 255, before any host is
    /// allocated).
    #[error("{0}")]
    Untranslatable(#[from] Refusal),
    /// `ssh -s NAME` on a granted host for a subsystem other than sftp (exit 255).
    #[error("{host}: -s {name}: only the sftp subsystem runs on a granted host")]
    Subsystem { host: String, name: String },
    /// `ssh anyLinux` with no command over the rsh transport (exit 255).
    #[error("{host}: an interactive login needs a terminal, which the job's remote shell (rsh) does not give; give a command")]
    LoginOverRsh { host: String },
}

impl ShimError {
    /// The shim's exit status for this error: 255 for [`ShimError::InstanceLost`] (the
    /// remote side is gone, as when ssh cannot reach a host), else 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            ShimError::InstanceLost { .. }
            | ShimError::SshUsage(_)
            | ShimError::Untranslatable(_)
            | ShimError::Subsystem { .. }
            | ShimError::LoginOverRsh { .. } => 255,
            _ => 1,
        }
    }

    /// The exit status when the shim runs as `shell` (`rsh` or `ssh`): ssh exits 255 for
    /// every error of its own.
    pub fn exit_code_as(&self, shell: &str) -> i32 {
        match shell {
            "ssh" => 255,
            _ => self.exit_code(),
        }
    }
}

/// The environment the shim reads, captured once (empty values count as unset).
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub agent: Option<OsString>,
    pub hosts_file: Option<OsString>,
    pub real_rsh: Option<OsString>,
    pub depth: Option<OsString>,
    pub path: Option<OsString>,
}

impl Env {
    /// Reads the variables of this process; when they name no agent, the job's are taken
    /// from the job directory the shim was exec'd from, if any ([`lineage`]).
    pub fn from_process() -> Env {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let mut env = Env {
            agent: var(ENV_AGENT),
            hosts_file: var(ENV_HOSTS_FILE),
            real_rsh: var(ENV_REAL_RSH),
            depth: var(ENV_SHIM_DEPTH),
            path: var("PATH"),
        };
        if env.agent.is_none() {
            if let Some(job) = lineage::from_own_directory() {
                env.agent = job.agent;
                env.hosts_file = env.hosts_file.or(job.hosts_file);
                env.real_rsh = env.real_rsh.or(job.real_rsh);
            }
        }
        env
    }
}

/// Where a call goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    PassThrough,
    Symbolic,
    Attach,
}

/// Runs the shim for `args` (a full argv). Returns how a granted host's remote shell ended
/// (the shim then ends the same way: [`Ended::exit`]) or an error; every other success is
/// an `exec`.
pub fn run(args: &[OsString], env: &Env) -> Result<Ended, ShimError> {
    let argv0 = args.first().map(OsString::as_os_str).unwrap_or_default();
    match args::program_name(argv0) {
        Some("ssh") => ssh::run(args, env),
        Some(name @ ("scp" | "sftp")) => copy::run(name, args, env).map(|never| match never {}),
        _ => try_run(args, env),
    }
}

/// Prints `err` the way `shell` (rsh or ssh, [`args::shell_name`]) does: `rsh: MESSAGE`,
/// plus the usage line for usage errors; then, for a refusal its caller reads on stdout
/// ([`callers`]), that line on stdout.
pub fn print_error(err: &ShimError, shell: &str) {
    let mut stderr = io::stderr().lock();
    let _ = match err {
        ShimError::Usage(usage) => match usage.message() {
            Some(message) => writeln!(stderr, "rsh: {message}\n{}", args::USAGE),
            None => writeln!(stderr, "{}", args::USAGE),
        },
        ShimError::SshUsage(usage) => writeln!(stderr, "ssh: {usage}\n{}", ssh_args::USAGE),
        other => writeln!(stderr, "{shell}: {other}"),
    };
    // After the stderr line: the caller may stop reading once it has this one.
    if let ShimError::Refused {
        stdout: Some(line), ..
    } = err
    {
        let _ = writeln!(io::stdout().lock(), "{line}");
    }
}

fn try_run(args: &[OsString], env: &Env) -> Result<Ended, ShimError> {
    let depth = check_depth(env.depth.as_deref())?;
    let inv = args::parse_lossy(args)?;
    match route_host(&inv.host, env)? {
        Route::PassThrough => {
            pass_through(args, &inv, env, depth, true).map(|never| match never {})
        }
        route => {
            let inv = args::parse(args)?;
            let request = Request {
                host: inv.host.clone(),
                attach: route == Route::Attach,
                words: inv.words.clone(),
                args,
                caller: Caller::Rsh(&inv),
            };
            via_agent(&request, env, depth)
        }
    }
}

/// `RB_SHIM_DEPTH` (unset or unreadable = 0); an error at [`MAX_DEPTH`] or more.
pub fn check_depth(value: Option<&OsStr>) -> Result<u32, ShimError> {
    let depth = value
        .and_then(OsStr::to_str)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    if depth >= MAX_DEPTH {
        return Err(ShimError::Recursion { depth });
    }
    Ok(depth)
}

/// Decides where `inv` goes: listed in the hosts file, symbolic, or pass-through.
pub fn route(inv: &Invocation, env: &Env) -> Result<Route, ShimError> {
    route_host(&inv.host, env)
}

/// Decides where a call to `host` goes: listed in the hosts file, symbolic, or pass-through.
pub fn route_host(host: &str, env: &Env) -> Result<Route, ShimError> {
    if let Some(path) = &env.hosts_file {
        let listed = hosts::hosts_file_lists(Path::new(path), host).map_err(|source| {
            ShimError::HostsFile {
                path: Path::new(path).display().to_string(),
                source,
            }
        })?;
        if listed {
            return Ok(Route::Attach);
        }
    }
    Ok(if hosts::is_symbolic(host) {
        Route::Symbolic
    } else {
        Route::PassThrough
    })
}

/// In a job, tells the agent the job reaches `host` by name (`named`, no reply): a module
/// job is then never granted that host. Best effort: a call outside a job, an agent that
/// cannot be reached, or a socket served by another uid (nothing is written to it, as for
/// every other client of the agent's socket) changes nothing about the pass-through.
/// `via`: the remote shell the call uses (`route_line`), for `rb jobs`.
pub(crate) fn tell_named(env: &Env, host: &str, via: Option<String>) {
    let Some(socket) = &env.agent else { return };
    let request = ShimRequest::Named {
        host: host.to_string(),
        pid: std::process::id(),
        via,
    };
    notify_agent(Path::new(socket), &request);
}

/// Sends the agent a request that gets no answer. Best effort, as [`tell_named`].
fn notify_agent(socket: &Path, request: &ShimRequest) {
    let Ok(stream) = UnixStream::connect(socket) else {
        return;
    };
    if proto::peercred::check_server(&stream, socket, "job's agent").is_err() {
        return;
    }
    let _ = conversation::notify(stream, request);
}

/// Execs the real remote shell (`RB_REAL_RSH`, the job's) with our arguments unchanged;
/// when they are another grammar's than that shell's (Hydra's `-x` for netkit rsh), with
/// what they mean in its grammar ([`translate::rsh_passthrough`]).
/// `named`: tell the agent the job reaches this host by name ([`tell_named`]).
fn pass_through(
    args: &[OsString],
    inv: &Invocation,
    env: &Env,
    depth: u32,
    named: bool,
) -> Result<Infallible, ShimError> {
    let argv0 = args.first().map(OsString::as_os_str).unwrap_or_default();
    let real = realsh::real_shell(
        env.real_rsh.as_deref(),
        args::shell_name(argv0),
        env.path.as_deref(),
        &self_exe()?,
    )?;
    let family = Family::known(
        &real
            .first()
            .map(|p| p.to_string_lossy())
            .unwrap_or_default(),
    );
    let link_host = args::host_from_program_name(argv0);
    let translated = match family {
        Some(family) => translate::rsh_passthrough(inv, family)?,
        None => None,
    };
    let plan = match translated {
        None => launch::passthrough(
            real,
            link_host.as_deref(),
            args.get(1..).unwrap_or_default(),
        ),
        Some(words) => {
            let words: Vec<OsString> = words.into_iter().map(OsString::from).collect();
            launch::passthrough(real, None, &words)
        }
    };
    let line = route_line(
        "rsh",
        &inv.host,
        &format!("pass-through to {}", plan.program.to_string_lossy()),
    );
    say_route(&line);
    if named {
        tell_named(env, &inv.host, Some(line));
    }
    Err(exec(&plan, depth))
}

/// Which remote shell a call used: `ssh: node03: pass-through to /usr/bin/ssh`,
/// `rsh: anyLinux: granted node04 (allocation 7) over ssh`.
pub(crate) fn route_line(shell: &str, host: &str, what: &str) -> String {
    format!("{shell}: {host}: {what}")
}

/// With [`ENV_VERBOSE`] set, `line` (`route_line`) on stderr. Nothing otherwise (LAM
/// treats any stderr output of its remote shell as fatal).
pub(crate) fn say_route(line: &str) {
    if std::env::var_os(ENV_VERBOSE).is_some_and(|v| !v.is_empty()) {
        let _ = writeln!(io::stderr(), "{line}");
    }
}

/// Who is calling: the grammar the call was written in, and what it parsed to.
pub(crate) enum Caller<'a> {
    Rsh(&'a Invocation),
    Ssh(&'a SshCall),
}

impl Caller<'_> {
    fn shell(&self) -> &'static str {
        match self {
            Caller::Rsh(_) => "rsh",
            Caller::Ssh(_) => "ssh",
        }
    }
}

/// A call for a symbolic host or one allocated to the job.
pub(crate) struct Request<'a> {
    pub host: String,
    /// The host is listed in the hosts file (`attach`), else symbolic (`allocate`).
    pub attach: bool,
    /// The command words (what [`callers`] read a refusal from).
    pub words: Vec<String>,
    /// The full argv, for a pass-through or a one-shot job.
    pub args: &'a [OsString],
    pub caller: Caller<'a>,
}

/// What runs on the granted host for `request` over `family`, or why it cannot; checked
/// once before asking the agent (with the job's remote shell) and again with the grant's.
fn session_for(
    request: &Request,
    family: Family,
) -> Result<(launch::GrantedSession, String), ShimError> {
    let host = request.host.clone();
    match request.caller {
        Caller::Rsh(inv) => {
            let command = inv.command.clone().ok_or(match request.attach {
                true => ShimError::AttachWithoutCommand { host },
                false => ShimError::SymbolicWithoutCommand { host },
            })?;
            Ok((launch::rsh_session(inv, family == Family::Ssh), command))
        }
        Caller::Ssh(call) => ssh::session(call, &host, family),
    }
}

/// Symbolic or allocated host: ask the agent, then run the granted remote shell.
fn via_agent(request: &Request, env: &Env, depth: u32) -> Result<Ended, ShimError> {
    let host = request.host.clone();
    let attach = request.attach;
    let shell = request.caller.shell();
    // Before any allocation: what the job's remote shell could not carry.
    if let Some(real) = env.real_rsh.as_deref() {
        if let Some(program) = realsh::parse_real_rsh(&real.to_string_lossy())
            .ok()
            .and_then(|argv| argv.into_iter().next())
        {
            session_for(request, Family::of(&program.to_string_lossy()))?;
        }
    } else {
        session_for(request, Family::Ssh)?;
    }
    if !attach {
        // Before any allocation: a name launchers would refuse (Open MPI's `anyX86_64`)
        // ends the call at once, as an unresolvable name does outside a job.
        if let Err(e) = proto::symbolic::check_name(&host) {
            let message = e.to_string();
            return Err(ShimError::Refused {
                stdout: callers::refusal_stdout(&request.words, &host, &message),
                host,
                message,
            });
        }
    }
    // A symbolic call whose caller cleaned the environment is still its job's.
    let agent = match (&env.agent, attach) {
        (None, false) => lineage::from_ancestry().and_then(|job| job.agent),
        (agent, _) => agent.clone(),
    };
    let Some(socket) = &agent else {
        return match attach {
            true => Err(ShimError::NoAgentVariable { host }),
            false => one_shot(request, env, &host, depth).map(|never| match never {}),
        };
    };
    let pid = std::process::id();
    let ask = match attach {
        true => ShimRequest::Attach {
            host: host.clone(),
            pid,
        },
        false => ShimRequest::Allocate {
            symbolic: host.clone(),
            pid,
        },
    };
    match ask_agent(Path::new(socket), &ask, &host, shell)? {
        Outcome::Granted(mut grant) => {
            steptimes::mark("shim.granted", Some(grant.alloc));
            // A bare `rsh` from the broker must not find this shim first in the job's PATH.
            if let Some(program) = grant.remote_shell.first_mut() {
                let mut name = OsString::from(program.as_str());
                realsh::resolve_bare_name(&mut name, env.path.as_deref(), &self_exe()?);
                *program = name.to_string_lossy().into_owned();
            }
            let family = Family::of(grant.remote_shell.first().map_or("", String::as_str));
            let (session, command) = session_for(request, family)?;
            let mut plan = launch::granted(&grant, &session, &command);
            // Held until the remote shell ends: the call that may start the host's master.
            let _master = mux::share_connection(&mut plan, &session, &grant, Path::new(socket));
            let what = format!(
                "granted {} (allocation {}) over {}",
                grant.host,
                grant.alloc,
                family.name()
            );
            let line = route_line(shell, &host, &what);
            say_route(&line);
            let used = ShimRequest::Used {
                host: host.clone(),
                pid,
                via: line,
            };
            // Told once the remote shell runs: a line for `rb jobs`, which need not delay
            // the remote shell's start by a connection to the agent.
            let tell_used = || {
                notify_agent(Path::new(socket), &used);
                steptimes::mark("shim.used_sent", Some(grant.alloc));
            };
            run_granted(&plan, depth, Path::new(socket), &grant, shell, tell_used)
        }
        // The hosts file said the host was the job's, but the agent has given it back
        // meanwhile (the file trails the agent): it is an ordinary host again.
        Outcome::Refused(_) if attach => match request.caller {
            Caller::Rsh(inv) => pass_through(request.args, inv, env, depth, false),
            Caller::Ssh(_) => ssh::pass_through(request.args, env, depth, None),
        }
        .map(|never| match never {}),
        Outcome::Refused(message) => Err(ShimError::Refused {
            stdout: callers::refusal_stdout(&request.words, &host, &message),
            host,
            message,
        }),
        Outcome::Lost {
            host: bound,
            message,
        } => Err(ShimError::InstanceLost {
            name: host,
            host: bound,
            message,
        }),
    }
}

/// Status of a remote shell whose host the broker took back while it ran: 128+SIGTERM, what
/// ssh returns when the subagent ended the command with SIGTERM.
pub const TAKEN_BACK_STATUS: i32 = 128 + libc::SIGTERM;

/// Runs a granted host's remote shell as our child (the agent's connection is closed by
/// then), then reads whether the broker took the host back meanwhile (the file the agent
/// writes before it has the command ended: [`proto::taken_back`]): if so, one
/// line says so and a 0 (netkit rsh loses the remote status) becomes 143; ssh's own 143
/// (the subagent's status for a command it ended) stands, now explained. `on_spawned`: as
/// in [`child::run`].
fn run_granted(
    plan: &Plan,
    depth: u32,
    socket: &Path,
    grant: &Grant,
    shell: &str,
    on_spawned: impl FnOnce(),
) -> Result<Ended, ShimError> {
    let ended =
        child::run(plan, depth, grant.alloc, on_spawned).map_err(|source| ShimError::Exec {
            program: plan.program.to_string_lossy().into_owned(),
            source,
        })?;
    steptimes::mark("shim.child_exited", Some(grant.alloc));
    if !matches!(ended, Ended::Code(0 | TAKEN_BACK_STATUS | 255)) {
        return Ok(ended);
    }
    let answer = proto::taken_back::dir_beside(socket)
        .and_then(|dir| proto::taken_back::read(&dir, grant.alloc));
    steptimes::mark("shim.taken_back_answered", Some(grant.alloc));
    match answer {
        Some((host, message)) => {
            let _ = writeln!(
                io::stderr(),
                "{shell}: {host} was taken back by the broker ({message})"
            );
            Ok(match ended {
                Ended::Code(0) => Ended::Code(TAKEN_BACK_STATUS),
                other => other,
            })
        }
        None => Ok(ended),
    }
}

/// Connects to the agent and converses; says once that we wait (see [`wait_notice`]).
fn ask_agent(
    socket: &Path,
    request: &ShimRequest,
    host: &str,
    shell: &str,
) -> Result<Outcome, ShimError> {
    let path = socket.display().to_string();
    let stream = UnixStream::connect(socket).map_err(|source| ShimError::AgentUnreachable {
        path: path.clone(),
        source,
    })?;
    proto::peercred::check_server(&stream, socket, "job's agent")?;
    let tty = io::stderr().is_terminal();
    let verbose = std::env::var_os(ENV_VERBOSE).is_some_and(|v| !v.is_empty());
    let mut told = false;
    let notice = |position: u32, reason: Option<&str>| {
        if told {
            return;
        }
        if let Some(text) = wait_notice(tty, verbose, host, position, reason) {
            let text = match text.strip_prefix("rsh: ") {
                Some(rest) => format!("{shell}: {rest}"),
                None => text,
            };
            told = true;
            let _ = writeln!(io::stderr(), "{text}");
        }
    };
    conversation::converse(stream, request, notice).map_err(|source| ShimError::Agent {
        path,
        host: host.to_string(),
        source,
    })
}

/// Set (non-empty) to have a waiting call say why it waits even off a terminal.
pub const ENV_VERBOSE: &str = "RB_VERBOSE";

/// What a waiting call prints to stderr, once: on a terminal, its position (as always);
/// off a terminal nothing unless [`ENV_VERBOSE`] is set (LAM treats any stderr output of
/// its remote shell as fatal), and then the broker's reason.
pub fn wait_notice(
    tty: bool,
    verbose: bool,
    host: &str,
    position: u32,
    reason: Option<&str>,
) -> Option<String> {
    if tty {
        return Some(format!(
            "rsh: waiting for a host for {host} (position {position})"
        ));
    }
    verbose.then(|| {
        let why = reason.unwrap_or("the broker gave no reason");
        format!("rsh: waiting for a host for {host} (position {position}): {why}")
    })
}

/// No agent: a symbolic call becomes a one-shot job, `agent -- SHIM ARGS…` (for an ssh
/// caller `agent -- ssh ARGS…`: the job's PATH has the drop-in ssh first).
fn one_shot(request: &Request, env: &Env, host: &str, depth: u32) -> Result<Infallible, ShimError> {
    let me = self_exe()?;
    let agent =
        launch::find_agent(&me, env.path.as_deref()).ok_or_else(|| ShimError::NoAgentProgram {
            host: host.to_string(),
        })?;
    let args = request.args;
    let argv0 = args.first().map(OsString::as_os_str).unwrap_or_default();
    let link_host = args::host_from_program_name(argv0);
    let program = match request.caller {
        Caller::Rsh(_) => me,
        Caller::Ssh(_) => PathBuf::from("ssh"),
    };
    let plan = launch::one_shot(
        &agent,
        &program,
        link_host.as_deref(),
        args.get(1..).unwrap_or_default(),
    );
    Err(exec(&plan, depth))
}

pub(crate) fn self_exe() -> Result<PathBuf, ShimError> {
    std::env::current_exe().map_err(ShimError::SelfExe)
}

pub(crate) fn exec(plan: &Plan, depth: u32) -> ShimError {
    let source = launch::exec(plan, depth);
    ShimError::Exec {
        program: plan.program.to_string_lossy().into_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_guard() {
        assert_eq!(check_depth(None).expect("unset"), 0);
        assert_eq!(check_depth(Some(OsStr::new("3"))).expect("3"), 3);
        assert_eq!(check_depth(Some(OsStr::new("junk"))).expect("junk"), 0);
        let err = check_depth(Some(OsStr::new("4"))).expect_err("4");
        assert_eq!(
            err.to_string(),
            "refusing to recurse (RB_SHIM_DEPTH=4): is RB_REAL_RSH pointing at the shim?"
        );
        assert!(check_depth(Some(OsStr::new("17"))).is_err());
    }

    #[test]
    fn wait_notice_off_a_terminal_only_when_verbose() {
        let n = |tty, verbose| wait_notice(tty, verbose, "anyLinux", 2, Some("2 held by jobs"));
        assert_eq!(
            n(true, false).as_deref(),
            Some("rsh: waiting for a host for anyLinux (position 2)")
        );
        assert_eq!(n(false, false), None, "LAM treats stderr output as fatal");
        assert_eq!(
            n(false, true).as_deref(),
            Some("rsh: waiting for a host for anyLinux (position 2): 2 held by jobs")
        );
    }

    #[test]
    fn a_pass_through_in_a_job_tells_the_agent_the_host_it_names() {
        use std::io::BufRead;
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("agent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let env = Env {
            agent: Some(socket.into_os_string()),
            ..Env::default()
        };
        tell_named(&env, "node07", None);
        let (stream, _) = listener.accept().expect("the shim connected");
        let mut line = String::new();
        io::BufReader::new(stream)
            .read_line(&mut line)
            .expect("one line");
        let sent: ShimRequest = serde_json::from_str(&line).expect("a shim request");
        assert_eq!(
            sent,
            ShimRequest::Named {
                host: "node07".into(),
                pid: std::process::id(),
                via: None
            }
        );
        let gone = Env {
            agent: Some(dir.path().join("none").into_os_string()),
            ..Env::default()
        };
        tell_named(&gone, "node07", None);
        tell_named(&Env::default(), "node07", None);
    }

    fn inv(host: &str) -> Invocation {
        args::parse(&[OsString::from("rsh"), host.into(), "true".into()]).expect("parses")
    }

    #[test]
    fn routes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "node03 10.77.0.3 7\nanyone 10.77.0.9 8\n").expect("write");
        let none = Env::default();
        let with_hosts = Env {
            hosts_file: Some(hosts.into_os_string()),
            ..Env::default()
        };
        let route_of = |host: &str, env: &Env| route(&inv(host), env).expect("route");
        assert_eq!(route_of("node03", &none), Route::PassThrough);
        assert_eq!(route_of("anyLinux", &none), Route::Symbolic);
        assert_eq!(route_of("node03", &with_hosts), Route::Attach);
        assert_eq!(route_of("10.77.0.3", &with_hosts), Route::Attach);
        assert_eq!(
            route_of("anyone", &with_hosts),
            Route::Attach,
            "listed beats symbolic"
        );
        assert_eq!(route_of("anyLinux", &with_hosts), Route::Symbolic);
        assert_eq!(route_of("node04", &with_hosts), Route::PassThrough);
        let unreadable = Env {
            hosts_file: Some(dir.path().as_os_str().to_owned()),
            ..Env::default()
        };
        assert!(matches!(
            route(&inv("node03"), &unreadable),
            Err(ShimError::HostsFile { .. })
        ));
    }
}
