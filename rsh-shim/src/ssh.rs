//! The shim invoked as `ssh` (the job's `bin/ssh`): OpenSSH's grammar ([`ssh_args`]), the
//! rsh shim's routing.
//!
//! - A call that opens no session (`-V`, `-Q`, `-G`, `-O ctl_cmd`), a command line ssh
//!   itself refuses, and a real host not allocated to the job → `exec` of the real `ssh`
//!   (the first in PATH that is not this shim, else `/usr/bin/ssh`) with the caller's
//!   arguments unchanged: no broker, no agent round trip (a `named` line to the agent in a
//!   job, as the rsh shim sends). The user typed ssh: the job's remote shell (`job_shell`)
//!   does not apply to hosts the job names.
//! - A symbolic name or instance (`anyLinux`, `anyLinux-2`) or a host allocated to the job →
//!   a granted host, reached with the job's remote shell (ssh or rsh, the site's choice),
//!   the command under the subagent, exactly as `rsh anyLinux` (`via_agent`).
//!   The caller's options are carried as [`translate`] says; what cannot work is refused
//!   before any host is allocated (exit 255, the option named). Without a command: an
//!   interactive login (the user's login shell, with `-t` when stdin is a terminal) under
//!   the subagent; `-s sftp`: the host's sftp server under the subagent.

use std::convert::Infallible;
use std::ffi::OsString;
use std::io::IsTerminal;

use crate::child::Ended;
use crate::launch::{self, GrantedSession};
use crate::ssh_args::{self, Mode, SshCall};
use crate::translate::{self, Family};
use crate::{
    check_depth, exec, realsh, route_host, route_line, say_route, self_exe, tell_named, via_agent,
    Caller, Env, Request, Route, ShimError,
};

/// Runs the shim as `ssh` for `args` (a full argv).
pub fn run(args: &[OsString], env: &Env) -> Result<Ended, ShimError> {
    let depth = check_depth(env.depth.as_deref())?;
    // A command line ssh refuses is refused by ssh, word for word.
    let Ok(call) = ssh_args::parse_lossy(args) else {
        return pass_through(args, env, depth, None).map(|never| match never {});
    };
    let host = match (&call.host, call.mode()) {
        (Some(host), Mode::Session) => host.clone(),
        _ => return pass_through(args, env, depth, None).map(|never| match never {}),
    };
    let route = route_host(&host, env)?;
    if route == Route::PassThrough {
        return pass_through(args, env, depth, Some(&host)).map(|never| match never {});
    }
    let call = ssh_args::parse(args)?;
    let request = Request {
        host,
        attach: route == Route::Attach,
        words: call.command.clone(),
        args,
        caller: Caller::Ssh(&call),
    };
    via_agent(&request, env, depth)
}

/// Execs the real ssh with the caller's arguments unchanged. `named`: the host of a
/// session, which the agent is told the job reaches by name.
pub(crate) fn pass_through(
    args: &[OsString],
    env: &Env,
    depth: u32,
    named: Option<&str>,
) -> Result<Infallible, ShimError> {
    let real = realsh::real_shell(None, "ssh", env.path.as_deref(), &self_exe()?)?;
    let plan = launch::passthrough(real, None, args.get(1..).unwrap_or_default());
    let what = format!("pass-through to {}", plan.program.to_string_lossy());
    let line = route_line("ssh", named.unwrap_or("-"), &what);
    say_route(&line);
    if let Some(host) = named {
        tell_named(env, host, Some(line));
    }
    Err(exec(&plan, depth))
}

/// The granted host's session for an ssh `call` over `family`, and the command that runs
/// under the subagent there; or why it cannot run.
pub(crate) fn session(
    call: &SshCall,
    host: &str,
    family: Family,
) -> Result<(GrantedSession, String), ShimError> {
    let carried = translate::ssh_session(call, family)?;
    let login = call.command.is_empty() && !call.has('s');
    let command = if call.has('s') {
        let name = call.command_line().unwrap_or_default();
        translate::subsystem_command(&name).ok_or_else(|| ShimError::Subsystem {
            host: host.to_string(),
            name,
        })?
    } else {
        match (call.command_line(), family) {
            (Some(command), _) => command,
            (None, Family::Rsh) => {
                return Err(ShimError::LoginOverRsh {
                    host: host.to_string(),
                })
            }
            (None, Family::Ssh) => translate::LOGIN_COMMAND.to_string(),
        }
    };
    // ssh asks for a terminal for a login when stdin is one (RequestTTY auto); the command
    // we send instead of none would not get one.
    let tty = family == Family::Ssh
        && login
        && !carried.no_stdin
        && !call.has('T')
        && !call.has('t')
        && call.option("RequestTTY").is_none()
        && std::io::stdin().is_terminal();
    let session = GrantedSession {
        no_stdin: carried.no_stdin,
        user: carried.user,
        port: carried.port.map(|p| p.to_string()),
        tty,
        options: carried.extra,
    };
    Ok((session, command))
}
