//! The allocations a job's broker took back, as files the agent writes into the job's
//! directory and its shims read: `DIR/taken-back/ALLOC` holds `HOST\nMESSAGE`.
//!
//! A remote shell that exits 0 on a granted host leaves its shim one question: did the
//! broker take the host back meanwhile (netkit rsh loses the remote status)? A file read
//! answers it without a round trip to the agent (≈ 0.9 ms of every call). The agent writes
//! an allocation's file before it tells the subagent to end what runs there, so a remote
//! shell that ends because of the take-back finds it. Written whole under a temporary name
//! and renamed, so a reader never sees half a file.

use std::{
    io,
    path::{Path, PathBuf},
};

/// The directory of the files beside the agent's socket (`DIR/agent.sock`).
pub fn dir_beside(agent_socket: &Path) -> Option<PathBuf> {
    Some(agent_socket.parent()?.join("taken-back"))
}

/// Whether `alloc` was taken back, as `(host, message)`; `None` when no file says so (or
/// it cannot be read: the remote shell's status then stands, as before the question).
pub fn read(dir: &Path, alloc: u64) -> Option<(String, String)> {
    let text = std::fs::read_to_string(dir.join(alloc.to_string())).ok()?;
    let (host, message) = text.split_once('\n')?;
    Some((host.to_string(), message.to_string()))
}

/// Records that `alloc` on `host` was taken back, with why.
pub fn write(dir: &Path, alloc: u64, host: &str, message: &str) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(alloc.to_string());
    let partial = dir.join(format!(".{alloc}.partial"));
    std::fs::write(&partial, format!("{host}\n{message}"))?;
    std::fs::rename(&partial, &path)
}

/// Forgets `alloc` (the agent keeps the last 1024 taken back).
pub fn remove(dir: &Path, alloc: u64) -> io::Result<()> {
    match std::fs::remove_file(dir.join(alloc.to_string())) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_read_and_removed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = dir_beside(&tmp.path().join("agent.sock")).expect("dir");
        assert_eq!(read(&dir, 7), None, "nothing yet, not even the directory");
        write(
            &dir,
            7,
            "node03",
            "allocation 7 reclaimed: owner back\nsecond line",
        )
        .expect("write");
        assert_eq!(
            read(&dir, 7),
            Some((
                "node03".into(),
                "allocation 7 reclaimed: owner back\nsecond line".into()
            ))
        );
        assert_eq!(read(&dir, 8), None);
        remove(&dir, 7).expect("remove");
        remove(&dir, 7).expect("removing again is no error");
        assert_eq!(read(&dir, 7), None);
        assert_eq!(
            std::fs::read_dir(&dir).expect("dir").count(),
            0,
            "no partial file left"
        );
    }
}
