//! Peer credentials of local (unix-socket) connections, via SO_PEERCRED.

use std::os::fd::AsFd;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socketpair_reports_our_uid() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        assert_eq!(peer_uid(&a), Some(nix::unistd::getuid().as_raw()));
        assert_eq!(peer_pid(&a), Some(std::process::id() as i32));
    }
}
