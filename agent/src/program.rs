//! Whether the app can be started at all, found as `execvp` finds it, before any job is
//! registered: a name that is not there exits 127, one that is not executable 126, with the
//! shells' messages (`agent /nonexistent` behaves as `sh -c /nonexistent` does).

use std::{
    ffi::OsStr,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

/// Why the app cannot be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotRunnable {
    #[error("{0}: command not found\nhelp: check the spelling, or give the program's path")]
    NotFound(String),
    #[error("{0}: No such file or directory")]
    NoSuchFile(String),
    #[error("{0}: Permission denied (not an executable file)\nhelp: chmod +x it, or run it through its interpreter (e.g. `agent sh {0}`)")]
    NotExecutable(String),
}

impl NotRunnable {
    /// The shells' exit code: 127 not found, 126 found but not executable.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::NotFound(_) | Self::NoSuchFile(_) => 127,
            Self::NotExecutable(_) => 126,
        }
    }
}

/// Names the job's own environment provides (the shim directory is first in its `PATH`):
/// found there even when this machine has no such program.
const PROVIDED_BY_THE_JOB: &[&str] = &["rsh"];

/// Checks that `program` would start, searching `path` (the `PATH` value) for a bare name.
pub fn check(program: &str, path: Option<&OsStr>) -> Result<(), NotRunnable> {
    if PROVIDED_BY_THE_JOB.contains(&program) {
        return Ok(());
    }
    if program.contains('/') {
        return match Path::new(program).metadata() {
            Err(_) => Err(NotRunnable::NoSuchFile(program.into())),
            Ok(meta) if is_executable_file(&meta) => Ok(()),
            Ok(_) => Err(NotRunnable::NotExecutable(program.into())),
        };
    }
    let dirs = path.unwrap_or_else(|| OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    let mut seen_unexecutable = false;
    for dir in std::env::split_paths(dirs) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        match dir.join(program).metadata() {
            Ok(meta) if is_executable_file(&meta) => return Ok(()),
            Ok(meta) if meta.is_file() => seen_unexecutable = true,
            _ => {}
        }
    }
    Err(if seen_unexecutable {
        NotRunnable::NotExecutable(program.into())
    } else {
        NotRunnable::NotFound(program.into())
    })
}

/// A regular file with an execute bit (what `execve` needs besides the right owner).
fn is_executable_file(meta: &std::fs::Metadata) -> bool {
    meta.is_file() && meta.permissions().mode() & 0o111 != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_unexecutable_programs_get_the_shells_codes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("job.sh");
        std::fs::write(&script, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let path = dir.path().as_os_str();
        let shown = script.display().to_string();
        assert_eq!(check(&shown, None).map_err(|e| e.exit_code()), Err(126));
        assert_eq!(
            check("job.sh", Some(path)).map_err(|e| e.exit_code()),
            Err(126)
        );
        assert_eq!(
            check("/nonexistent", None).map_err(|e| e.exit_code()),
            Err(127)
        );
        let err = check("no-such-program-rb", Some(path)).expect_err("not found");
        assert_eq!(err.exit_code(), 127);
        assert!(err
            .to_string()
            .starts_with("no-such-program-rb: command not found"));
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(check("job.sh", Some(path)), Ok(()));
        assert_eq!(check("sh", None), Ok(()));
        assert_eq!(check("rsh", Some(path)), Ok(()), "the job's shim");
        assert_eq!(check("/tmp", None).map_err(|e| e.exit_code()), Err(126));
    }
}
