//! Private directories: every directory ResourceBroker creates for itself (job directories,
//! the embedded broker's and `rb demo`'s state, the host daemon's lock directory) is made
//! mode 0700 and then verified, or refused with an error that names the path, the owner
//! found and what to do. A directory another local user made, or a symbolic link planted in
//! its place, would let that user replace our files (the job's `rsh`, sockets, the lab
//! secret).
//!
//! # Layout
//! - [`verdict`]: the pure decision — given what `fstat` says, use, tighten or refuse.
//! - this module: the I/O around it (`mkdir`, `lstat`, `open(O_NOFOLLOW|O_DIRECTORY)`,
//!   `fstat`, `fchmod`) and where the runtime root is.
//!
//! # Where
//! [`runtime_root`] is `$XDG_RUNTIME_DIR/rb` when `XDG_RUNTIME_DIR` names an absolute
//! directory that is ours and private (set by `pam_systemd` on login; a variable kept
//! across `su`/`sudo` that names someone else's directory is ignored), else
//! `/tmp/rb-<euid>`. When something in `/tmp` already has that name and is refused
//! (another local user's directory, a symlink, a file: one `mkdir` by another user would
//! otherwise deny us service), the root is `$HOME/.local/state/rb/run-<hostname>` instead
//! ([`refused_tmp_root`] says why, for the logs); the name in `/tmp` is still never used.
//!
//! # Rules
//! A directory we create ([`ensure_dir`], [`create_private`]) must be a real directory (not
//! a symlink) owned by our effective uid; if it has any group or other permission bit we
//! tighten it to 0700 (only we could have set them). A directory the user configured
//! ([`check_configured`], e.g. `broker.state_dir`) is never changed: it is refused when
//! someone else owns it or group/others can write it.

pub mod verdict;

use std::{
    fmt,
    fs::{DirBuilder, OpenOptions, Permissions},
    io,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

pub use verdict::{Facts, Policy, Verdict};

/// Why a directory cannot be used. Every message names the path and carries a `help:` line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create or open the private directory {path}: {source}\nhelp: check that its parent exists and is writable by you")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is a symbolic link, not a directory: refusing to use it (someone may be trying to redirect your files)\nhelp: remove it (`rm {path}`) if you did not make it; or set XDG_RUNTIME_DIR to a private directory of yours")]
    Symlink { path: PathBuf },
    #[error("{path} is not a directory\nhelp: move it away, or set XDG_RUNTIME_DIR to a private directory of yours")]
    NotADirectory { path: PathBuf },
    #[error("{path} is owned by {owner}, not by you ({you}): refusing to use it, its owner could replace your files\nhelp: ask {owner} or root to remove it; or set XDG_RUNTIME_DIR to a private directory of yours")]
    NotOurs {
        path: PathBuf,
        owner: Owner,
        you: Owner,
    },
    #[error("{path} can be written by group or others (mode {mode:04o}): refusing to use it, they could replace your files\nhelp: `chmod go-w {path}`, or choose another directory")]
    Writable { path: PathBuf, mode: u32 },
}

/// A uid, shown with its user name when the user database has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner(pub u32);

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let uid = nix::unistd::Uid::from_raw(self.0);
        match nix::unistd::User::from_uid(uid) {
            Ok(Some(user)) => write!(f, "uid {} ({})", self.0, user.name),
            _ => write!(f, "uid {}", self.0),
        }
    }
}

/// Our effective uid: the owner every private directory must have.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Where our private directories live: `$XDG_RUNTIME_DIR/rb` when usable, else
/// `/tmp/rb-<euid>` (see the module doc). Not created: see [`ensure_root`].
pub fn runtime_root() -> PathBuf {
    runtime_root_from(std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from))
}

fn runtime_root_from(xdg: Option<PathBuf>) -> PathBuf {
    let usable = |dir: &PathBuf| {
        dir.is_absolute()
            && std::fs::metadata(dir).is_ok_and(|m| {
                let facts = Facts::of(&m);
                verdict::judge(&facts, euid(), Policy::Refuse) == Ok(Verdict::Use)
            })
    };
    match xdg.filter(usable) {
        Some(dir) => dir.join("rb"),
        None => tmp_or_fallback(tmp_root(), std::env::var_os("HOME").map(PathBuf::from)),
    }
}

/// `/tmp/rb-<euid>`.
fn tmp_root() -> PathBuf {
    PathBuf::from(format!("/tmp/rb-{}", euid()))
}

/// `tmp` unless it is refused ([`refusal`]); then the fallback under `home`, when there is
/// an absolute one.
fn tmp_or_fallback(tmp: PathBuf, home: Option<PathBuf>) -> PathBuf {
    if refusal(&tmp).is_none() {
        return tmp;
    }
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "host".into());
    match home.filter(|h| h.is_absolute()) {
        Some(home) => home.join(".local/state/rb").join(format!("run-{host}")),
        None => tmp,
    }
}

/// Why `/tmp/rb-<euid>` cannot be our runtime root (`None`: it is absent, or ours): what a
/// daemon logs when [`runtime_root`] fell back to the directory under `$HOME`.
pub fn refused_tmp_root() -> Option<Error> {
    refusal(&tmp_root())
}

/// One line for people when [`runtime_root`] fell back because `/tmp/rb-<euid>` is refused
/// (`None` otherwise): what is refused, why, and where we run instead. The host daemon
/// reports it (`rb status`), a job's guardian tells its agent (the job's stderr).
pub fn fallback_note() -> Option<String> {
    let refused = refused_tmp_root()?;
    let why = refused.to_string();
    let why = why.lines().next().unwrap_or_default();
    let why: String = why.chars().take(300).collect();
    Some(format!(
        "{why}; running from {} instead (remove the refused directory to go back to it)",
        runtime_root().display()
    ))
}

/// Why `dir` is refused as a directory of ours, judged on `lstat` (`None`: absent, or ours
/// and private or to be tightened).
fn refusal(dir: &Path) -> Option<Error> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(source) => Some(Error::Io {
            path: dir.to_path_buf(),
            source,
        }),
        Ok(meta) => verdict::judge(&Facts::of(&meta), euid(), Policy::Tighten)
            .err()
            .map(|kind| kind.at(dir)),
    }
}

/// Creates (mode 0700) or verifies [`runtime_root`]; returns it.
pub fn ensure_root() -> Result<PathBuf, Error> {
    let root = runtime_root();
    ensure_root_dir(&root)?;
    Ok(root)
}

/// [`ensure_dir`] for a root, whose parents (under `$HOME` for the fallback) are created
/// mode 0700 when missing.
///
/// When `root` is the fallback under `$HOME` and it cannot be made either (no home, not
/// writable), the refused `/tmp/rb-<euid>` is the error: it names what to remove.
fn ensure_root_dir(root: &Path) -> Result<(), Error> {
    make_root_dir(root).map_err(|fallback| match refused_tmp_root() {
        Some(refused) if root != tmp_root() => refused,
        _ => fallback,
    })
}

fn make_root_dir(root: &Path) -> Result<(), Error> {
    if let Some(parent) = root.parent().filter(|p| !p.exists()) {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|source| Error::Io {
                path: parent.to_path_buf(),
                source,
            })?;
    }
    ensure_dir(root)
}

/// Where `rb-broker --embedded` keeps its state by default: `embedded` in [`runtime_root`].
/// Here rather than in the broker so that `rb` (which looks for a running embedded broker)
/// does not link the broker.
pub fn embedded_state_dir() -> PathBuf {
    runtime_root().join("embedded")
}

/// Creates (mode 0700) or verifies `runtime_root()/name`, the root included; returns it.
pub fn in_root(name: &str) -> Result<PathBuf, Error> {
    let dir = ensure_root()?.join(name);
    ensure_dir(&dir)?;
    Ok(dir)
}

/// Creates `dir` (mode 0700; its parent must exist) unless it exists, then verifies it:
/// a directory (not a symlink) owned by us; group/other bits are removed.
pub fn ensure_dir(dir: &Path) -> Result<(), Error> {
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(Error::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    }
    verify(dir, Policy::Tighten)
}

/// Creates a private directory anywhere: under [`runtime_root`], the root and every
/// component below it are created or verified as by [`ensure_dir`]; elsewhere (a path the
/// user chose), missing parents are created mode 0700 and `dir` itself is verified.
pub fn create_private(dir: &Path) -> Result<(), Error> {
    let root = runtime_root();
    if let Ok(below) = dir.strip_prefix(&root) {
        ensure_root_dir(&root)?;
        let mut path = root;
        for part in below.components() {
            path.push(part);
            ensure_dir(&path)?;
        }
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|source| Error::Io {
                path: parent.to_path_buf(),
                source,
            })?;
    }
    ensure_dir(dir)
}

/// Checks a directory the user configured (e.g. `broker.state_dir`), following symlinks
/// and changing nothing: refused when someone else owns it or group/others can write it.
/// A directory that does not exist yet passes (it will be created mode 0700).
pub fn check_configured(dir: &Path) -> Result<(), Error> {
    match std::fs::metadata(dir) {
        Ok(meta) => verdict::judge(&Facts::of(&meta), euid(), Policy::Refuse)
            .map(drop)
            .map_err(|kind| kind.at(dir)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Verifies an existing `dir` under `policy`: judged on `lstat` first (a clear message for
/// a symlink, or for another user's directory we could not even open), then again on
/// `fstat` of the directory opened with `O_NOFOLLOW`, and `fchmod` on that same
/// descriptor, so a swap between the two cannot fool us.
fn verify(dir: &Path, policy: Policy) -> Result<(), Error> {
    let io_err = |source| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    let lmeta = std::fs::symlink_metadata(dir).map_err(io_err)?;
    verdict::judge(&Facts::of(&lmeta), euid(), policy).map_err(|kind| kind.at(dir))?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_DIRECTORY | nix::libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => Error::Symlink {
                path: dir.to_path_buf(),
            },
            Some(nix::libc::ENOTDIR) => Error::NotADirectory {
                path: dir.to_path_buf(),
            },
            _ => io_err(e),
        })?;
    let meta = file.metadata().map_err(io_err)?;
    match verdict::judge(&Facts::of(&meta), euid(), policy) {
        Ok(Verdict::Use) => Ok(()),
        Ok(Verdict::Tighten) => file
            .set_permissions(Permissions::from_mode(0o700))
            .map_err(io_err),
        Err(kind) => Err(kind.at(dir)),
    }
}

impl Facts {
    fn of(meta: &std::fs::Metadata) -> Self {
        Facts {
            is_symlink: meta.file_type().is_symlink(),
            is_dir: meta.is_dir(),
            uid: meta.uid(),
            mode: meta.mode() & 0o7777,
        }
    }
}

#[cfg(test)]
mod tests;
