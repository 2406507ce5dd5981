//! What the shim runs: the pass-through and the one-shot agent end in `exec`; a granted
//! host's remote shell runs as the shim's child ([`crate::child`]). Either way the real
//! remote shell has the caller's stdin (with EOF), stdout and stderr itself, unbuffered.
//!
//! The plans are pure values (program + arguments) built here and tested; [`exec`] performs
//! one and [`command`] prepares one, setting `RB_SHIM_DEPTH` one higher than ours.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use proto::agent::ENV_SHIM_DEPTH;

use crate::args::{takes_value, Invocation};
use crate::conversation::Grant;
use crate::quote::remote_command;
use crate::realsh::{find_in_path, is_executable};

/// A program to exec and its arguments (argv[1..]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub program: OsString,
    pub args: Vec<OsString>,
}

/// Pass-through: the real remote shell with the caller's arguments unchanged. Under a
/// hostname link the host (our program name) goes first, as the real shell needs it.
pub fn passthrough(
    real: Vec<OsString>,
    host_from_name: Option<&str>,
    original: &[OsString],
) -> Plan {
    let mut words = real.into_iter();
    let program = words.next().unwrap_or_default();
    let mut args: Vec<OsString> = words.collect();
    args.extend(host_from_name.map(OsString::from));
    args.extend(original.iter().cloned());
    Plan { program, args }
}

/// A granted host: `remote_shell… [-n] [-l USER] [options it understands] address REMOTE`,
/// with REMOTE = [`remote_command`] of the grant's subagent and `command`.
pub fn granted(inv: &Invocation, grant: &Grant, command: &str) -> Plan {
    let mut words = grant.remote_shell.iter().map(OsString::from);
    let program = words.next().unwrap_or_default();
    let mut args: Vec<OsString> = words.collect();
    if inv.no_stdin {
        args.push("-n".into());
    }
    if let Some(user) = &inv.user {
        args.extend(["-l".into(), user.into()]);
    }
    let ssh = grant.remote_shell.first().is_some_and(|p| is_ssh(p));
    args.extend(forwarded_options(inv, ssh).into_iter().map(OsString::from));
    args.push(grant.address.clone().into());
    args.push(remote_command(&grant.subagent, command).into());
    Plan { program, args }
}

/// Whether `program` is ssh (by basename), which understands more options than rsh.
pub(crate) fn is_ssh(program: &str) -> bool {
    Path::new(program).file_name() == Some(OsStr::new("ssh"))
}

/// The caller's options the granted remote shell understands: for ssh `-p PORT` and the
/// options with the same meaning in ssh (`-x -X -T -t -q -a -A -4 -6 -o -i -F`); for rsh only
/// `-d`. Options whose meaning differs (`-e -k -K -L -w -8`) are dropped.
pub fn forwarded_options(inv: &Invocation, ssh: bool) -> Vec<String> {
    let keep = if ssh { "xXTtqaA46oiF" } else { "d" };
    let mut out = Vec::new();
    if ssh {
        if let Some(port) = &inv.port {
            out.extend(["-p".to_string(), port.clone()]);
        }
    }
    let mut opts = inv.passthrough_opts.iter();
    while let Some(opt) = opts.next() {
        let letter = opt.chars().nth(1).unwrap_or_default();
        let value = if takes_value(letter) {
            opts.next()
        } else {
            None
        };
        if keep.contains(letter) {
            out.push(opt.clone());
            out.extend(value.cloned());
        }
    }
    out
}

/// Outside any agent: `agent -- SHIM [host] ARGS…`, so the call becomes a one-shot job.
pub fn one_shot(
    agent: &Path,
    shim: &Path,
    host_from_name: Option<&str>,
    original: &[OsString],
) -> Plan {
    let mut args = vec![OsString::from("--"), shim.as_os_str().to_owned()];
    args.extend(host_from_name.map(OsString::from));
    args.extend(original.iter().cloned());
    Plan {
        program: agent.as_os_str().to_owned(),
        args,
    }
}

/// `agent` next to the shim's own executable, else the first one in `path_var`.
pub fn find_agent(self_exe: &Path, path_var: Option<&OsStr>) -> Option<PathBuf> {
    let beside = self_exe.parent().map(|dir| dir.join("agent"));
    match beside {
        Some(path) if is_executable(&path) => Some(path),
        _ => path_var.and_then(|p| find_in_path("agent", p, Path::new(""))),
    }
}

/// Replaces this process with `plan` ([`command`]). Returns only on failure.
pub fn exec(plan: &Plan, depth: u32) -> io::Error {
    command(plan, depth).exec()
}

/// `plan` as a command with `RB_SHIM_DEPTH` = `depth + 1` and without the job's preload
/// library in `LD_PRELOAD` (the remote shell resolves real names only); stdio inherited.
pub fn command(plan: &Plan, depth: u32) -> Command {
    let mut cmd = Command::new(&plan.program);
    cmd.args(&plan.args)
        .env(ENV_SHIM_DEPTH, depth.saturating_add(1).to_string());
    if let Some(preload) = std::env::var_os("LD_PRELOAD") {
        match proto::symbolic::without_preload(&preload.to_string_lossy()) {
            rest if rest.is_empty() => cmd.env_remove("LD_PRELOAD"),
            rest => cmd.env("LD_PRELOAD", rest),
        };
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::parse;

    fn os(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    fn inv(words: &[&str]) -> Invocation {
        parse(&os(&[&["rsh"], words].concat())).expect("parses")
    }

    fn grant(shell: &[&str]) -> Grant {
        Grant {
            alloc: 7,
            host: "node03".into(),
            address: "10.77.0.3".into(),
            remote_shell: shell.iter().map(|s| s.to_string()).collect(),
            subagent: vec!["/opt/rb-subagent".into(), "--alloc".into(), "7".into()],
        }
    }

    #[test]
    fn passthrough_keeps_arguments() {
        let original = os(&["-n", "node07", "-l", "bob", "echo $SHELL"]);
        let plan = passthrough(os(&["ssh", "-F", "/x/cfg"]), None, &original);
        assert_eq!(plan.program, "ssh");
        assert_eq!(
            plan.args,
            os(&["-F", "/x/cfg", "-n", "node07", "-l", "bob", "echo $SHELL"])
        );
        let plan = passthrough(os(&["/usr/bin/rsh"]), Some("node03"), &os(&["ls"]));
        assert_eq!(plan.args, os(&["node03", "ls"]));
    }

    #[test]
    fn granted_over_ssh() {
        let i = inv(&[
            "-x", "anyLinux", "-n", "-l", "bob", "-p", "2222", "-o", "A=b", "-e", "-k", "R",
            "pvmd -s",
        ]);
        let plan = granted(&i, &grant(&["/usr/bin/ssh", "-F", "/x/cfg"]), "pvmd -s");
        assert_eq!(plan.program, "/usr/bin/ssh");
        let want = [
            "-F",
            "/x/cfg",
            "-n",
            "-l",
            "bob",
            "-p",
            "2222",
            "-x",
            "-o",
            "A=b",
            "10.77.0.3",
            "exec '/opt/rb-subagent' '--alloc' '7' -c 'pvmd -s'",
        ];
        assert_eq!(plan.args, os(&want));
    }

    #[test]
    fn granted_over_rsh_drops_port_and_ssh_options() {
        let i = inv(&["anyLinux", "-d", "-x", "-p", "2222", "echo hi"]);
        let plan = granted(&i, &grant(&["rsh"]), "echo hi");
        assert_eq!(plan.program, "rsh");
        assert_eq!(
            plan.args,
            os(&[
                "-d",
                "10.77.0.3",
                "exec '/opt/rb-subagent' '--alloc' '7' -c 'echo hi'"
            ])
        );
    }

    #[test]
    fn one_shot_wraps_the_original_call() {
        let plan = one_shot(
            Path::new("/rb/agent"),
            Path::new("/rb/rsh"),
            None,
            &os(&["anyLinux", "ls"]),
        );
        assert_eq!(plan.program, "/rb/agent");
        assert_eq!(plan.args, os(&["--", "/rb/rsh", "anyLinux", "ls"]));
        let plan = one_shot(
            Path::new("/rb/agent"),
            Path::new("/rb/rsh"),
            Some("anyX"),
            &os(&["ls"]),
        );
        assert_eq!(plan.args, os(&["--", "/rb/rsh", "anyX", "ls"]));
    }

    #[test]
    fn agent_is_found_beside_us_then_in_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let (bin, other) = (dir.path().join("bin"), dir.path().join("other"));
        std::fs::create_dir(&bin).expect("mkdir");
        std::fs::create_dir(&other).expect("mkdir");
        let mk = |p: &Path| {
            std::fs::write(p, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        };
        let me = bin.join("rsh");
        mk(&me);
        assert_eq!(find_agent(&me, Some(other.as_os_str())), None);
        mk(&other.join("agent"));
        assert_eq!(
            find_agent(&me, Some(other.as_os_str())),
            Some(other.join("agent"))
        );
        mk(&bin.join("agent"));
        assert_eq!(
            find_agent(&me, Some(other.as_os_str())),
            Some(bin.join("agent"))
        );
    }
}
