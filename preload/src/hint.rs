//! Tells the job's agent that a process looked a symbolic name up (`proto::agent`,
//! `resolved`), so a module job's request (phase 1) starts at the lookup rather than at the
//! `rsh` the program runs next: PVM's master pvmd looks `anyLinux` up, then forks its
//! hoster, which closes every descriptor up to the limit, forks rsh, which does the same,
//! and only then execs the shim; LAM's `lamgrow` spends milliseconds between the two too.
//!
//! Called from inside the resolver, in programs we do not control (a pvmd's event loop): it
//! never blocks (a non-blocking socket; a full backlog or buffer drops the hint, and the
//! shim's call makes the request as before), never leaves a descriptor behind, never
//! changes `errno`, and says nothing. Without `RB_AGENT` (not a job) it does nothing, and a
//! socket served by another uid (SO_PEERCRED) gets nothing either.

use std::{
    ffi::{c_int, OsStr},
    os::fd::{AsRawFd, OwnedFd},
};

use nix::sys::socket::{
    self, connect, socket, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr,
};

use proto::agent::{ShimRequest, ENV_AGENT};

/// Sends the hint for `symbolic` to the agent at `$RB_AGENT`, best effort.
pub fn resolved(symbolic: &str) {
    if let Some(path) = std::env::var_os(ENV_AGENT) {
        resolved_to(&path, symbolic);
    }
}

/// Sends the hint for `symbolic` to the agent socket at `path`; `errno` is kept.
fn resolved_to(path: &OsStr, symbolic: &str) {
    let saved = errno();
    let request = ShimRequest::Resolved {
        symbolic: symbolic.to_string(),
        pid: std::process::id(),
    };
    if let Ok(mut line) = proto::frame::encode(&request) {
        line.push('\n');
        send(path, line.as_bytes());
    }
    set_errno(saved);
}

/// Connects to the unix socket at `path` without blocking, writes `data` if it fits at
/// once, closes. Any failure (a path too long for a socket address included) drops the data.
fn send(path: &OsStr, data: &[u8]) {
    let Ok(addr) = UnixAddr::new(path) else {
        return;
    };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let Ok(fd) = socket(AddressFamily::Unix, SockType::Stream, flags, None) else {
        return;
    };
    // Only an agent of our own uid hears the hint; another uid's server gets nothing.
    if connect(fd.as_raw_fd(), &addr).is_ok() && served_by_us(&fd) {
        // MSG_NOSIGNAL: no SIGPIPE if the agent has gone meanwhile.
        let _ = socket::send(fd.as_raw_fd(), data, MsgFlags::MSG_NOSIGNAL);
    }
    // `fd` is closed here.
}

/// The server at the other end runs as our effective uid (SO_PEERCRED).
fn served_by_us(fd: &OwnedFd) -> bool {
    proto::peercred::peer_uid(fd)
        .is_some_and(|uid| proto::peercred::server_allowed(uid, nix::unistd::geteuid().as_raw()))
}

fn errno() -> c_int {
    // SAFETY: glibc returns a valid per-thread location.
    unsafe { *libc::__errno_location() }
}

fn set_errno(value: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = value };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    #[test]
    fn the_agent_receives_one_resolved_line_and_errno_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        set_errno(libc::ENOENT);
        resolved_to(path.as_os_str(), "anyLinux");
        assert_eq!(errno(), libc::ENOENT);
        let (mut conn, _) = listener.accept().expect("accept");
        let mut text = String::new();
        conn.read_to_string(&mut text)
            .expect("read to the sender's close");
        assert!(
            text.ends_with('\n') && text.lines().count() == 1,
            "{text:?}"
        );
        let request: ShimRequest = proto::frame::decode(text.trim_end()).expect("decode");
        let pid = std::process::id();
        let symbolic = "anyLinux".to_string();
        assert_eq!(request, ShimRequest::Resolved { symbolic, pid });
    }

    #[test]
    fn nobody_listening_is_no_error_and_leaves_no_descriptor_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let none = dir.path().join("none.sock");
        let long = OsStr::new(std::str::from_utf8(&[b'x'; 200]).expect("ascii"));
        let before = open_fds();
        for _ in 0..200 {
            resolved_to(none.as_os_str(), "anyLinux");
            resolved_to(long, "anyLinux");
        }
        // Other tests of this process may hold a few descriptors meanwhile; a leak is 400.
        assert!(open_fds() < before + 20);
    }

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").expect("fds").count()
    }
}
