//! Watching the process that launches a remote command on a granted host.
//!
//! A shim that gets a grant runs the real remote shell as its child and waits for it (then
//! asks whether the host was taken back), so its pid is the launcher's. When that
//! process is gone and no subagent ever attached for the allocation, the
//! remote shell failed (host refused the login, command not found before the subagent ran,
//! …) and the host would otherwise stay held until the job ends. [`exited`] resolves when the
//! process has ended: through a pidfd (Linux ≥ 5.3), else by polling.

use std::{
    os::fd::{FromRawFd, OwnedFd},
    time::Duration,
};

use tokio::io::unix::AsyncFd;

/// How often the fallback checks for the process when pidfds are not available.
const POLL: Duration = Duration::from_millis(100);

/// Resolves once process `pid` has ended (exited, or is a zombie not yet reaped).
pub async fn exited(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    match pidfd_open(pid) {
        // SAFETY: the pidfd is owned by the AsyncFd and neither replaced nor closed while
        // registered.
        Ok(fd) => match unsafe { AsyncFd::register(fd) } {
            // A pidfd becomes readable when its process terminates.
            Ok(fd) => {
                let _ = fd.readable().await;
            }
            Err(_) => poll_until_gone(pid).await,
        },
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
        Err(_) => poll_until_gone(pid).await,
    }
}

/// True while process `pid` runs (a zombie has ended).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| crate::ancestry::stat_fields(&s).next() != Some("Z"))
}

fn pidfd_open(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; on success the kernel hands us a new fd we now own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor returned by pidfd_open, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The fallback: until `/proc` no longer lists the pid, or lists it as a zombie.
async fn poll_until_gone(pid: libc::pid_t) {
    loop {
        if !running(pid as u32) {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_when_the_process_ends_and_not_before() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.3")
            .spawn()
            .expect("spawn");
        let pid = child.id();
        let started = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(5), exited(pid))
            .await
            .expect("resolves after the sleep ends");
        assert!(started.elapsed() >= Duration::from_millis(250));
        child.wait().expect("wait");
    }

    #[tokio::test]
    async fn a_pid_that_is_gone_resolves_at_once() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        child.wait().expect("wait");
        tokio::time::timeout(Duration::from_secs(1), exited(pid))
            .await
            .expect("resolves");
    }

    #[tokio::test]
    async fn the_fallback_sees_a_zombie_as_ended() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id() as libc::pid_t;
        tokio::time::sleep(Duration::from_millis(100)).await; // a zombie now, not reaped
        tokio::time::timeout(Duration::from_secs(1), poll_until_gone(pid))
            .await
            .expect("resolves");
        child.wait().expect("wait");
    }
}
