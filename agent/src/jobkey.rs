//! The job's own key: what its subagents prove to its agent, instead of the lab
//! secret, which users other than the broker's owner cannot and must not read.
//!
//! The agent makes 32 random bytes per job and writes them to a file only the job's user can
//! read: `~/.config/rb/jobs/job-JOB-HOST-PID-NONCE.key` (directory 0700, file 0600,
//! `O_EXCL`; NONCE, 8 random hex digits, because job, host and pid alone repeat: every
//! embedded broker numbers its jobs from 1, pids are reused, and agents in the PID
//! namespaces of two test labs' `node02` share root's home),
//! since a lab's hosts share home directories the way they shared `~/.config/rb/secret`
//! before; without a home, the job's private directory. Subagents are started with
//! `--secret-file PATH`: the path is on their command line, the key never is. The file is
//! removed when the job ends ([`JobKey`]'s drop). A key left by a SIGKILLed agent opens
//! nothing (its agent's port is gone with it); the next agent on the same host removes it
//! once it is a day old and no process has its pid ([`sweep`]).
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
        Self::create_in(job, key_dir(), job_dir)
    }

    /// Makes the key of `job` in `keys` (created private), else in `job_dir`.
    fn create_in(job: u64, keys: Option<PathBuf>, job_dir: &Path) -> anyhow::Result<Self> {
        let host = this_host();
        let name = format!("job-{job}-{host}-{}-{}.key", std::process::id(), nonce());
        let dir = keys.filter(|d| privdir::create_private(d).is_ok());
        if let Some(dir) = &dir {
            sweep(dir, &host, STALE_AFTER, pid_alive);
        }
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

/// How old a dead agent's key must be before another agent removes it.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// This machine's name, as it goes into key file names (no `/`).
fn this_host() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().replace('/', "_"))
        .unwrap_or_else(|_| "unknown".into())
}

fn pid_alive(pid: i32) -> bool {
    let pid = nix::unistd::Pid::from_raw(pid);
    !matches!(
        nix::sys::signal::kill(pid, None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// 8 hex digits that tell apart two key files of the same job, host and pid: from std's
/// randomly keyed hasher (uniqueness, not secrecy: the key is in the file).
fn nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:08x}", h.finish() as u32)
}

/// The host and pid a key file's name carries (`job-JOB-HOST-PID-NONCE.key`, or
/// `job-JOB-HOST-PID.key` as agents wrote it before the nonce).
fn owner_of(file_name: &str) -> Option<(&str, i32)> {
    let rest = file_name.strip_prefix("job-")?.strip_suffix(".key")?;
    let (_job, rest) = rest.split_once('-')?;
    let is_nonce = |s: &str| s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let rest = match rest.rsplit_once('-') {
        Some((head, last)) if is_nonce(last) => head,
        _ => rest,
    };
    let (host, pid) = rest.rsplit_once('-')?;
    Some((host, pid.parse().ok()?))
}

/// Removes the keys in `dir` left by agents of `host` that are gone (`alive` says no) and
/// older than `older_than`. Keys of other hosts are never touched: their pids mean nothing
/// here. Best effort: errors are ignored.
pub fn sweep(dir: &Path, host: &str, older_than: std::time::Duration, alive: fn(i32) -> bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((of, pid)) = owner_of(&name.to_string_lossy()).map(|(h, p)| (h.to_string(), p))
        else {
            continue;
        };
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= older_than);
        if of == host && old && !alive(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
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

    /// Two keys of the same job number, host and pid (two embedded brokers' job 1, a reused
    /// pid, or two labs' `node02` sharing root's home) are two files: the second agent
    /// failed with `File exists` before the nonce.
    #[test]
    fn the_same_job_host_and_pid_twice_get_two_keys() {
        let home = tempfile::tempdir().expect("tempdir");
        let keys = home.path().join("jobs");
        let a = JobKey::create_in(1, Some(keys.clone()), home.path()).expect("a");
        let b = JobKey::create_in(1, Some(keys.clone()), home.path()).expect("b");
        assert_ne!(a.path(), b.path());
        assert_eq!(a.path().parent(), Some(keys.as_path()));
        let name = a.path().file_name().expect("name").to_string_lossy();
        assert_eq!(
            owner_of(&name),
            Some((this_host().as_str(), std::process::id() as i32))
        );
    }

    #[test]
    fn key_names_say_their_host_and_pid() {
        assert_eq!(owner_of("job-7-node-02-4242.key"), Some(("node-02", 4242)));
        assert_eq!(
            owner_of("job-7-node-02-4242-0a1b2c3d.key"),
            Some(("node-02", 4242))
        );
        assert_eq!(owner_of("job-7-4242.key"), None);
        assert_eq!(owner_of("notes.txt"), None);
    }

    #[test]
    fn only_old_keys_of_dead_agents_of_this_host_are_swept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let names = [
            "job-1-here-100.key",  // dead agent here: swept
            "job-2-here-200.key",  // live agent here: kept
            "job-3-there-100.key", // another host: kept
            "other-file",          // not a key: kept
        ];
        for n in names {
            std::fs::write(dir.path().join(n), "x").expect("write");
        }
        let alive = |pid| pid == 200;
        sweep(
            dir.path(),
            "here",
            std::time::Duration::from_secs(3600),
            alive,
        );
        assert!(dir.path().join(names[0]).exists(), "young: kept");
        sweep(dir.path(), "here", std::time::Duration::ZERO, alive);
        let left: Vec<bool> = names.iter().map(|n| dir.path().join(n).exists()).collect();
        assert_eq!(left, [false, true, true, true]);
    }
}
