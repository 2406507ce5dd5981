//! One ssh connection per granted host, shared by the job's calls: a granted host reached
//! over ssh gets OpenSSH's `ControlMaster=auto` with its socket in the job's private
//! directory ([`proto::mux::control_path`]) and `ControlPersist=yes`, so the host's first
//! call starts a master in the background (one handshake, as before) and every later call
//! to the held host runs as a session of that master, without a handshake. The agent closes
//! the master (`ssh -O exit`) when the host goes back; at the job's end the agent, as the
//! job's subreaper, ends whatever is left, masters included.
//!
//! Two first calls at once would both try to become the master, and the loser would say
//! `ControlSocket … already exists, disabling multiplexing` on stderr (LAM takes any
//! stderr output for a failed boot). So a call that finds no socket becomes the master only
//! if it gets the host's lock (`cm/HOST/USER.lock`, `flock`, held until its remote shell
//! ends); the others, meanwhile, go with `ControlMaster=no`: a session of the master if its
//! socket is there by then, else a connection of their own, silently.
//!
//! No master for calls whose own options shape the connection (`-p -o -i -F -4 -6`: a
//! master made with them would serve calls without them, and the reverse), nor when the
//! remote shell is not ssh, nor outside a job directory with its `cm` directory.

use std::ffi::OsString;
use std::path::Path;

use crate::conversation::Grant;
use crate::launch::{is_ssh, GrantedSession, Plan};

/// Options of the caller that change the connection itself, not one session of it.
const CONNECTION_OPTIONS: &[&str] = &["-p", "-o", "-i", "-F", "-4", "-6"];

/// The host's lock, held by the call that may start the master (dropped: released).
#[derive(Debug)]
pub struct MasterLock(#[allow(dead_code)] std::fs::File);

/// Adds the shared connection's options to `plan` (a [`crate::launch::granted`] plan:
/// `… ADDRESS REMOTE_COMMAND` last) when the call can share one; `agent_socket` is the job
/// agent's socket, in the job's private directory. Keep the lock it returns until the
/// remote shell has ended.
pub fn share_connection(
    plan: &mut Plan,
    session: &GrantedSession,
    grant: &Grant,
    agent_socket: &Path,
) -> Option<MasterLock> {
    let (options, lock) = options(session, grant, agent_socket)?;
    let at = plan.args.len().saturating_sub(2);
    plan.args.splice(at..at, options);
    lock
}

/// The `-o` options that make the call a session of the host's master (or its master), if
/// it can be one, and the lock when this call may start the master.
fn options(
    session: &GrantedSession,
    grant: &Grant,
    agent_socket: &Path,
) -> Option<(Vec<OsString>, Option<MasterLock>)> {
    if !grant.remote_shell.first().is_some_and(|p| is_ssh(p)) {
        return None;
    }
    if session.port.is_some() || session.options.iter().any(|o| shapes_connection(o)) {
        return None;
    }
    let job_dir = agent_socket.parent()?;
    let path = proto::mux::control_path(job_dir, &grant.host, session.user.as_deref())?;
    private_dir(path.parent()?)?;
    let control_path = format!("ControlPath={}", path.to_str()?);
    let lock = match path.exists() {
        true => None,
        false => try_lock(&path.with_extension("lock")),
    };
    let master = match path.exists() || lock.is_some() {
        true => "ControlMaster=auto",
        false => "ControlMaster=no",
    };
    let words = [
        "-o",
        master,
        "-o",
        &control_path,
        "-o",
        "ControlPersist=yes",
    ];
    Some((words.iter().map(OsString::from).collect(), lock))
}

/// Whether `word`, one of the caller's options as the remote shell takes it, is one of
/// [`CONNECTION_OPTIONS`], alone (`-o`) or with its value glued on (`-oPort=2`, `-p22`).
fn shapes_connection(word: &str) -> bool {
    CONNECTION_OPTIONS.iter().any(|o| word.starts_with(o))
}

/// The exclusive `flock` of `path` (created mode 0600, close-on-exec: the master that ssh
/// forks never holds it), if no other call holds it now.
fn try_lock(path: &Path) -> Option<MasterLock> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    locked.then_some(MasterLock(file))
}

/// Creates `dir` (mode 0700) in the job's `cm` directory, or finds it there: a real
/// directory of ours. `None` when the `cm` directory is missing (no agent of this version,
/// or another machine's job directory) or anything is not as it should be.
fn private_dir(dir: &Path) -> Option<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let ours = |p: &Path| {
        std::fs::symlink_metadata(p)
            .is_ok_and(|m| m.is_dir() && m.uid() == nix_uid() && m.mode() & 0o077 == 0)
    };
    if !ours(dir.parent()?) {
        return None;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    ours(dir).then_some(())
}

fn nix_uid() -> u32 {
    // SAFETY: getuid cannot fail and has no preconditions.
    unsafe { libc::getuid() }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::DirBuilderExt;

    use super::*;
    use crate::args::parse;
    use crate::launch::{granted, rsh_session};

    fn os(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    fn grant(shell: &[&str]) -> Grant {
        Grant {
            alloc: 7,
            host: "node03".into(),
            address: "10.77.0.3".into(),
            remote_shell: shell.iter().map(|s| s.to_string()).collect(),
            subagent: vec!["/opt/rb-subagent".into()],
        }
    }

    /// A job directory with its `cm` directory, as the agent makes it.
    fn job_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.path().join("cm"))
            .expect("cm");
        dir
    }

    fn plan_for(words: &[&str], shell: &[&str], dir: &Path) -> Plan {
        let inv = parse(&os(&[&["rsh"], words].concat())).expect("parses");
        let g = grant(shell);
        let session = rsh_session(&inv, is_ssh(shell[0]));
        let mut plan = granted(&g, &session, "true");
        let _lock = share_connection(&mut plan, &session, &g, &dir.join("agent.sock"));
        plan
    }

    #[test]
    fn an_ssh_call_shares_the_hosts_master_before_the_address() {
        let dir = job_dir();
        let plan = plan_for(
            &["anyLinux", "-n", "true"],
            &["ssh", "-F", "/c"],
            dir.path(),
        );
        let socket = dir.path().join("cm/node03/_");
        let want = os(&[
            "-F",
            "/c",
            "-o",
            "HostKeyAlias=node03",
            "-n",
            "-o",
            "ControlMaster=auto",
            "-o",
            &format!("ControlPath={}", socket.display()),
            "-o",
            "ControlPersist=yes",
            "10.77.0.3",
        ]);
        assert_eq!(plan.args[..plan.args.len() - 1], want[..]);
        assert!(dir.path().join("cm/node03").is_dir());
        // Another login on the same host has a master of its own.
        let plan = plan_for(&["anyLinux", "-l", "bob", "true"], &["ssh"], dir.path());
        let path = format!("ControlPath={}", dir.path().join("cm/node03/bob").display());
        assert!(plan.args.contains(&OsString::from(path)));
    }

    #[test]
    fn while_one_call_may_start_the_master_the_others_do_not_try() {
        let dir = job_dir();
        let inv = parse(&os(&["rsh", "anyLinux", "true"])).expect("parses");
        let g = grant(&["ssh"]);
        let inv = rsh_session(&inv, true);
        let socket = dir.path().join("agent.sock");
        let mut first = granted(&g, &inv, "true");
        let lock = share_connection(&mut first, &inv, &g, &socket);
        assert!(lock.is_some(), "the first call may start the master");
        assert!(first.args.contains(&OsString::from("ControlMaster=auto")));
        let mut second = granted(&g, &inv, "true");
        assert!(share_connection(&mut second, &inv, &g, &socket).is_none());
        assert!(second.args.contains(&OsString::from("ControlMaster=no")));
        drop(lock);
        let mut third = granted(&g, &inv, "true");
        assert!(share_connection(&mut third, &inv, &g, &socket).is_some());
        assert!(third.args.contains(&OsString::from("ControlMaster=auto")));
    }

    #[test]
    fn no_master_for_rsh_own_connection_options_or_without_the_cm_directory() {
        let dir = job_dir();
        let shares = |p: &Plan| p.args.iter().any(|a| a == "ControlPersist=yes");
        assert!(!shares(&plan_for(
            &["anyLinux", "true"],
            &["rsh"],
            dir.path()
        )));
        for own in [
            &["-p", "2222"][..],
            &["-o", "Port=2"],
            &["-4"],
            &["-i", "k"],
        ] {
            let words = [&["anyLinux"], own, &["true"]].concat();
            assert!(!shares(&plan_for(&words, &["ssh"], dir.path())), "{own:?}");
        }
        let session_only = plan_for(&["-x", "anyLinux", "true"], &["ssh"], dir.path());
        assert!(shares(&session_only));
        let bare = tempfile::tempdir().expect("tempdir");
        assert!(!shares(&plan_for(
            &["anyLinux", "true"],
            &["ssh"],
            bare.path()
        )));
    }
}
