//! The job's own key: what its subagents prove to its agent (issue 17), instead of the lab
//! secret, which users other than the broker's owner cannot and must not read.
//!
//! The agent makes 32 random bytes per job and writes them to a file only the job's user can
//! read: `~/.config/rb/jobs/job-JOB-PID.key` (directory 0700, file 0600, `O_EXCL`), since a
//! lab's hosts share home directories the way they shared `~/.config/rb/secret` before;
//! without a home, the job's private directory. Subagents are started with
//! `--secret-file PATH`: the path is on their command line, the key never is. The file is
//! removed when the job ends ([`JobKey`]'s drop); a key left by a killed agent opens
//! nothing, because its agent's port is gone with it.
//!
//! Why not stdin or the environment: through rsh or ssh the remote command's stdin is the
//! application's (and `-n` makes it /dev/null), and neither rsh nor ssh (without
//! `AcceptEnv` on every host) carries environment variables.

use std::path::{Path, PathBuf};

use anyhow::Context;
use proto::auth::Secret;

/// The key file of one job; removed on drop.
#[derive(Debug)]
pub struct JobKey {
    path: PathBuf,
    secret: Secret,
}

impl JobKey {
    /// Makes the key of `job` in `~/.config/rb/jobs`, else in `job_dir`.
    pub fn create(job: u64, job_dir: &Path) -> anyhow::Result<Self> {
        let name = format!("job-{job}-{}.key", std::process::id());
        let dir = key_dir().filter(|d| privdir::create_private(d).is_ok());
        let path = dir.unwrap_or_else(|| job_dir.to_path_buf()).join(name);
        Self::create_at(&path)
    }

    /// Makes a new key file at `path` (never over an existing file or through a symlink).
    pub fn create_at(path: &Path) -> anyhow::Result<Self> {
        let contents = Secret::generate_file_contents()?;
        proto::credential::write_new_private(path, &contents)
            .with_context(|| format!("cannot write the job's key {}", path.display()))?;
        let secret = Secret::load(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            secret,
        })
    }

    /// Where subagents read the key.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn secret(&self) -> &Secret {
        &self.secret
    }
}

impl Drop for JobKey {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `~/.config/rb/jobs`, when there is a home.
fn key_dir() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    Some(Path::new(&home).join(".config/rb/jobs"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn each_job_gets_its_own_private_key_removed_at_the_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = JobKey::create_at(&dir.path().join("a.key")).expect("a");
        let b = JobKey::create_at(&dir.path().join("b.key")).expect("b");
        assert!(!a.secret().same_key(b.secret()), "a key per job");
        assert_eq!(
            std::fs::metadata(a.path()).expect("stat").mode() & 0o777,
            0o600
        );
        assert!(JobKey::create_at(a.path()).is_err(), "never over a file");
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists(), "removed when the job ends");
    }
}
