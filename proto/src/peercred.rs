//! Peer credentials of local (unix-socket) connections, via SO_PEERCRED: servers learn
//! who connected ([`peer_uid`]); clients check who serves before they send anything
//! ([`check_server`]), because whoever controls the directory holding a socket could
//! otherwise pose as the broker or the agent. Only our own uid is accepted as a
//! server, root included: a root-run broker is not one a user's job may talk to locally.

use std::{os::fd::AsFd, path::Path};

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// The uid of the process at the other end of a connected unix socket, if the kernel says.
pub fn peer_uid<S: AsFd>(socket: &S) -> Option<u32> {
    getsockopt(socket, PeerCredentials)
        .ok()
        .map(|cred| cred.uid())
}

/// The pid of the process at the other end of a connected unix socket, if the kernel says.
pub fn peer_pid<S: AsFd>(socket: &S) -> Option<i32> {
    getsockopt(socket, PeerCredentials)
        .ok()
        .map(|cred| cred.pid())
}

/// The broker's control socket could not be reached, in words a user can act on: a
/// permission error is not a missing broker. The `io::Error` stays in the error's chain
/// (callers map `PermissionDenied` to exit 77).
#[derive(Debug, thiserror::Error)]
#[error("cannot reach the broker at {path}\nhelp: {}", self.help())]
pub struct BrokerSocketError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

impl BrokerSocketError {
    pub fn new(path: &Path, source: std::io::Error) -> Self {
        BrokerSocketError {
            path: path.display().to_string(),
            source,
        }
    }

    fn help(&self) -> &'static str {
        if self.source.kind() == std::io::ErrorKind::PermissionDenied {
            "the socket or a directory above it is not yours (another user's broker?); use your own lab file's broker, or --broker IP:PORT with the lab secret or your credential (~/.config/rb/credential, from the broker's owner: `rb user add`)"
        } else {
            "is rb-broker running? start it with `rb-broker --lab LAB.toml`"
        }
    }
}

/// A unix-socket server that is not us.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("the socket {path} is served by uid {found}, not you (uid {you}); someone may be posing as the {role}\nhelp: do not use this socket; check who made it (`ls -ln {path}`) and use your own {role}")]
    WrongUid {
        path: String,
        found: u32,
        you: u32,
        role: &'static str,
    },
    #[error("cannot tell who serves the socket {path}: {source}\nhelp: this needs a Linux unix socket (SO_PEERCRED)")]
    Unknown {
        path: String,
        source: std::io::Error,
    },
}

/// Checks that the server at the other end of the connected `socket` (opened at `path`)
/// runs as our effective uid; `role` names what it should be ("broker", "job's agent").
pub fn check_server<S: AsFd>(socket: &S, path: &Path, role: &'static str) -> Result<(), PeerError> {
    let found = getsockopt(socket, PeerCredentials)
        .map_err(|e| PeerError::Unknown {
            path: path.display().to_string(),
            source: e.into(),
        })?
        .uid();
    let you = nix::unistd::geteuid().as_raw();
    if server_allowed(found, you) {
        return Ok(());
    }
    Err(PeerError::WrongUid {
        path: path.display().to_string(),
        found,
        you,
        role,
    })
}

/// The rule: only a server with our own (effective) uid is talked to, root or not.
pub fn server_allowed(found: u32, euid: u32) -> bool {
    found == euid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_server_with_our_uid_is_accepted_root_included() {
        assert!(server_allowed(1000, 1000));
        assert!(!server_allowed(0, 1000), "a root server is not ours");
        assert!(!server_allowed(1000, 0), "root talks to root only");
    }

    #[test]
    fn our_own_server_passes_the_check() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        check_server(&a, Path::new("pair"), "broker").expect("ours");
    }

    #[test]
    fn socketpair_reports_our_uid() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        assert_eq!(peer_uid(&a), Some(nix::unistd::getuid().as_raw()));
        assert_eq!(peer_pid(&a), Some(std::process::id() as i32));
    }
}
