//! The pure decision about one directory: from what `fstat`/`stat` reported, use it,
//! tighten it to 0700, or refuse it (and why). No I/O here.

use std::path::Path;

use crate::{Error, Owner};

/// What the kernel said about a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub is_symlink: bool,
    pub is_dir: bool,
    pub uid: u32,
    /// Permission bits (`st_mode & 07777`).
    pub mode: u32,
}

/// What may be done with a directory that is ours but too open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// A directory we create for ourselves: remove group/other bits.
    Tighten,
    /// A directory the user configured: never changed; group/other write is refused.
    Refuse,
}

/// The directory may be used as it is, or after `chmod 0700`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Use,
    Tighten,
}

/// Why a directory is refused (the path is added by [`Refusal::at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Symlink,
    NotADirectory,
    NotOurs { owner: u32, you: u32 },
    Writable { mode: u32 },
}

impl Refusal {
    /// The error for `path`.
    pub fn at(self, path: &Path) -> Error {
        let path = path.to_path_buf();
        match self {
            Self::Symlink => Error::Symlink { path },
            Self::NotADirectory => Error::NotADirectory { path },
            Self::NotOurs { owner, you } => Error::NotOurs {
                path,
                owner: Owner(owner),
                you: Owner(you),
            },
            Self::Writable { mode } => Error::Writable { path, mode },
        }
    }
}

/// Group or other may write (or, for a directory we create, have any access at all).
const GROUP_OTHER_WRITE: u32 = 0o022;
const GROUP_OTHER_ANY: u32 = 0o077;

/// Decides about a directory with `facts`, for a process with effective uid `euid`.
pub fn judge(facts: &Facts, euid: u32, policy: Policy) -> Result<Verdict, Refusal> {
    if facts.is_symlink {
        return Err(Refusal::Symlink);
    }
    if !facts.is_dir {
        return Err(Refusal::NotADirectory);
    }
    if facts.uid != euid {
        return Err(Refusal::NotOurs {
            owner: facts.uid,
            you: euid,
        });
    }
    match policy {
        Policy::Tighten if facts.mode & GROUP_OTHER_ANY != 0 => Ok(Verdict::Tighten),
        Policy::Refuse if facts.mode & GROUP_OTHER_WRITE != 0 => {
            Err(Refusal::Writable { mode: facts.mode })
        }
        _ => Ok(Verdict::Use),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(uid: u32, mode: u32) -> Facts {
        Facts {
            is_symlink: false,
            is_dir: true,
            uid,
            mode,
        }
    }

    #[test]
    fn our_private_directory_is_used_as_it_is() {
        for policy in [Policy::Tighten, Policy::Refuse] {
            assert_eq!(judge(&dir(1000, 0o700), 1000, policy), Ok(Verdict::Use));
        }
    }

    #[test]
    fn a_directory_another_uid_owns_is_refused_even_when_private() {
        for policy in [Policy::Tighten, Policy::Refuse] {
            assert_eq!(
                judge(&dir(4701, 0o700), 4700, policy),
                Err(Refusal::NotOurs {
                    owner: 4701,
                    you: 4700
                })
            );
        }
    }

    #[test]
    fn root_is_not_trusted_for_a_users_directory() {
        assert!(judge(&dir(0, 0o700), 4700, Policy::Tighten).is_err());
    }

    #[test]
    fn our_open_directory_is_tightened_when_we_made_it_and_refused_when_configured() {
        assert_eq!(
            judge(&dir(7, 0o777), 7, Policy::Tighten),
            Ok(Verdict::Tighten)
        );
        assert_eq!(
            judge(&dir(7, 0o750), 7, Policy::Tighten),
            Ok(Verdict::Tighten)
        );
        assert_eq!(
            judge(&dir(7, 0o777), 7, Policy::Refuse),
            Err(Refusal::Writable { mode: 0o777 })
        );
        assert_eq!(
            judge(&dir(7, 0o1770), 7, Policy::Refuse),
            Err(Refusal::Writable { mode: 0o1770 })
        );
        assert_eq!(judge(&dir(7, 0o755), 7, Policy::Refuse), Ok(Verdict::Use));
    }

    #[test]
    fn a_symlink_or_a_file_is_refused_whoever_owns_it() {
        let link = Facts {
            is_symlink: true,
            ..dir(7, 0o777)
        };
        assert_eq!(judge(&link, 7, Policy::Tighten), Err(Refusal::Symlink));
        let file = Facts {
            is_dir: false,
            ..dir(7, 0o600)
        };
        assert_eq!(
            judge(&file, 7, Policy::Tighten),
            Err(Refusal::NotADirectory)
        );
    }
}
