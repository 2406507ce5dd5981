//! Closing the job's ssh master connections. The shim starts one master per granted host
//! (`rsh-shim`'s `mux`, sockets in `JOBDIR/cm/HOST/`, named by [`proto::mux`]); the agent
//! closes a host's masters when the host leaves the job, and every master at the job's end,
//! with `ssh -O stop`: the master stops listening (its socket goes) and exits once its last
//! session has ended — at once when none is left. `-O exit` would cut sessions whose last
//! output is still on its way (the subagent reports its command's end over its own link,
//! which can arrive first). A master that does not go is ended with the job's other
//! processes (the agent is their subreaper, [`crate::reaper`]).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

/// Numbers the directories of masters being closed (`cm/.xN`).
static CLOSING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long one `ssh -O stop` may take.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the job's masters live and the ssh that closes them.
#[derive(Debug, Clone)]
pub struct Masters {
    pub job_dir: PathBuf,
    /// The job's remote shell (program and leading arguments, e.g. `ssh -F CONFIG`).
    pub remote_shell: Vec<String>,
}

impl Masters {
    /// Creates the job's `cm` directory (mode 0700): without it the shim starts no master.
    pub fn prepare(job_dir: &Path, remote_shell: &[String]) -> anyhow::Result<Masters> {
        privdir::ensure_dir(&job_dir.join(proto::mux::DIR))?;
        Ok(Masters {
            job_dir: job_dir.to_path_buf(),
            remote_shell: remote_shell.to_vec(),
        })
    }

    /// Closes `host`'s masters, in the background. Their directory is first renamed (a
    /// bound socket stays reachable under its new name): a call to the host granted anew
    /// right after this finds no socket and starts a master of its own, instead of
    /// becoming a session of one that is stopping.
    pub fn close_host(&self, host: &str) {
        let dir = proto::mux::host_dir(&self.job_dir, host);
        let closing = self.job_dir.join(proto::mux::DIR).join(format!(
            ".x{}",
            CLOSING.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        if std::fs::rename(&dir, &closing).is_err() {
            return; // no master was started for the host
        }
        let ssh = self.ssh();
        tokio::spawn(async move { close_dir(&ssh, &closing).await });
    }

    /// Closes every master of the job and waits for it (at most 5 s each).
    pub async fn close_all(&self) {
        let Ok(hosts) = std::fs::read_dir(self.job_dir.join(proto::mux::DIR)) else {
            return;
        };
        let ssh = self.ssh();
        let closing: Vec<_> = hosts
            .flatten()
            .map(|h| {
                let (ssh, dir) = (ssh.clone(), h.path());
                tokio::spawn(async move { close_dir(&ssh, &dir).await })
            })
            .collect();
        for c in closing {
            let _ = c.await;
        }
    }

    /// The ssh to run `-O stop` with: the job's remote shell when it is ssh (its `-F`
    /// config applies), else `ssh` from `PATH`.
    fn ssh(&self) -> Vec<String> {
        let is_ssh = self
            .remote_shell
            .first()
            .is_some_and(|p| Path::new(p).file_name().is_some_and(|n| n == "ssh"));
        match is_ssh {
            true => self.remote_shell.clone(),
            false => vec!["ssh".into()],
        }
    }
}

/// `ssh -O stop` for each socket in `dir` (one per remote user), then removes `dir`.
async fn close_dir(ssh: &[String], dir: &Path) {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_socket()) {
            stop_master(ssh, &entry.path()).await;
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Asks the master listening on `socket` to stop: it removes its socket, and exits once
/// its sessions have ended.
async fn stop_master(ssh: &[String], socket: &Path) {
    let Some((program, leading)) = ssh.split_first() else {
        return;
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(leading)
        .arg("-o")
        .arg(format!("ControlPath={}", socket.display()))
        .args(["-O", "stop", "rb-master"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let child = crate::reaper::spawn_own(|| cmd.spawn(), tokio::process::Child::id);
    match child {
        Ok(mut child) => {
            if tokio::time::timeout(EXIT_TIMEOUT, child.wait())
                .await
                .is_err()
            {
                tracing::warn!(socket = %socket.display(), "ssh -O stop did not return");
            }
        }
        Err(e) => tracing::warn!(socket = %socket.display(), error = %e, "cannot run ssh -O stop"),
    }
}
