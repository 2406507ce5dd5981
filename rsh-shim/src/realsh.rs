//! Finding the real remote shell for pass-through: `$RB_REAL_RSH` (a JSON array, program and
//! leading arguments), else the first `rsh` in PATH that is not this shim, else `/usr/bin/rsh`.
//!
//! "Not this shim" compares canonical paths and (device, inode), so symlinks and hard links to
//! the shim are skipped, and the shim's own directory is not searched at all.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why no real remote shell could be chosen. The display text follows `rsh: `.
#[derive(Debug, thiserror::Error)]
pub enum RealShellError {
    #[error("RB_REAL_RSH is not a non-empty JSON array of strings ({detail}): got `{text}`")]
    BadVariable { text: String, detail: String },
    #[error(
        "cannot find the real {name}: every {name} in PATH and {fallback} is this shim\n\
         help: set RB_REAL_RSH, e.g. RB_REAL_RSH='[\"/usr/bin/ssh\"]'"
    )]
    OnlyOurselves { name: String, fallback: String },
}

/// The program and its leading arguments.
pub type Argv = Vec<OsString>;

/// The real remote shell: from `real_rsh_var` when set (a bare program name there is looked
/// up in `path_var`, skipping ourselves), else searched as `name` in `path_var`.
pub fn real_shell(
    real_rsh_var: Option<&OsStr>,
    name: &str,
    path_var: Option<&OsStr>,
    self_exe: &Path,
) -> Result<Argv, RealShellError> {
    if let Some(text) = real_rsh_var {
        let mut argv = parse_real_rsh(&text.to_string_lossy())?;
        if let Some(program) = argv.first_mut() {
            resolve_bare_name(program, path_var, self_exe);
        }
        return Ok(argv);
    }
    let found = path_var.and_then(|p| find_in_path(name, p, self_exe));
    let fallback = Path::new("/usr/bin").join(name);
    match found {
        Some(path) => Ok(vec![path.into_os_string()]),
        None if !same_file(&fallback, self_exe) => Ok(vec![fallback.into_os_string()]),
        None => Err(RealShellError::OnlyOurselves {
            name: name.to_string(),
            fallback: fallback.display().to_string(),
        }),
    }
}

/// Replaces a program name without `/` by its first PATH match that is not us (if any).
pub fn resolve_bare_name(program: &mut OsString, path_var: Option<&OsStr>, self_exe: &Path) {
    let Some(name) = program.to_str().filter(|p| !p.contains('/')) else {
        return;
    };
    if let Some(found) = path_var.and_then(|path| find_in_path(name, path, self_exe)) {
        *program = found.into_os_string();
    }
}

/// `["ssh","-F","/x/cfg"]` → the argv. The array must be non-empty with a non-empty program.
pub fn parse_real_rsh(text: &str) -> Result<Argv, RealShellError> {
    let bad = |detail: &str| RealShellError::BadVariable {
        text: text.to_string(),
        detail: detail.to_string(),
    };
    let words: Vec<String> = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
    match words.first() {
        None => Err(bad("empty array")),
        Some(program) if program.is_empty() => Err(bad("empty program name")),
        Some(_) => Ok(words.into_iter().map(OsString::from).collect()),
    }
}

/// The first executable `name` in `path_var` that is not `self_exe`, skipping the directory
/// that holds `self_exe`.
pub fn find_in_path(name: &str, path_var: &OsStr, self_exe: &Path) -> Option<PathBuf> {
    let own_dir = self_exe.parent().and_then(|d| d.canonicalize().ok());
    std::env::split_paths(path_var)
        .map(|dir| {
            if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            }
        })
        .filter(|dir| own_dir.is_none() || dir.canonicalize().ok() != own_dir)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate) && !same_file(candidate, self_exe))
}

/// A regular file with an execute bit (following symlinks).
pub fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether `a` and `b` are the same file: equal canonical paths, or the same inode.
pub fn same_file(a: &Path, b: &Path) -> bool {
    if let (Ok(ca), Ok(cb)) = (a.canonicalize(), b.canonicalize()) {
        if ca == cb {
            return true;
        }
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(ma), Ok(mb)) => (ma.dev(), ma.ino()) == (mb.dev(), mb.ino()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn exe(path: &Path) {
        std::fs::write(path, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    /// dirs: shim/rsh (us), links/rsh → shim/rsh, hard/rsh (hard link to us),
    /// noexec/rsh (not executable), real/rsh.
    fn layout() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["shim", "links", "hard", "noexec", "real"] {
            std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
        }
        let me = dir.path().join("shim/rsh");
        exe(&me);
        symlink(&me, dir.path().join("links/rsh")).expect("symlink");
        std::fs::hard_link(&me, dir.path().join("hard/rsh")).expect("hard link");
        std::fs::write(dir.path().join("noexec/rsh"), "x").expect("write");
        exe(&dir.path().join("real/rsh"));
        (dir, me)
    }

    fn path_of(root: &Path, subs: &[&str]) -> OsString {
        std::env::join_paths(subs.iter().map(|s| root.join(s))).expect("join")
    }

    #[test]
    fn path_search_skips_ourselves() {
        let (dir, me) = layout();
        let path = path_of(dir.path(), &["shim", "links", "hard", "noexec", "real"]);
        assert_eq!(
            find_in_path("rsh", &path, &me),
            Some(dir.path().join("real/rsh"))
        );
        let only_us = path_of(dir.path(), &["shim", "links", "hard", "noexec"]);
        assert_eq!(find_in_path("rsh", &only_us, &me), None);
    }

    #[test]
    fn own_directory_is_skipped_even_for_other_files() {
        let (dir, me) = layout();
        exe(&dir.path().join("shim/ssh"));
        let path = path_of(dir.path(), &["shim", "real"]);
        assert_eq!(find_in_path("ssh", &path, &me), None);
    }

    #[test]
    fn real_shell_prefers_the_variable_then_path_then_fallback() {
        let (dir, me) = layout();
        let var = OsStr::new(r#"["ssh","-F","/x/cfg"]"#);
        let path = path_of(dir.path(), &["shim", "real"]);
        let got = real_shell(Some(var), "rsh", Some(&path), &me).expect("from variable");
        assert_eq!(
            got,
            vec![OsString::from("ssh"), "-F".into(), "/x/cfg".into()]
        );
        let got = real_shell(None, "rsh", Some(&path), &me).expect("from PATH");
        assert_eq!(got, vec![dir.path().join("real/rsh").into_os_string()]);
        let got = real_shell(None, "rsh", None, &me).expect("fallback");
        assert_eq!(got, vec![OsString::from("/usr/bin/rsh")]);
    }

    #[test]
    fn fallback_that_is_ourselves_is_an_error() {
        // Pretend we are /usr/bin/sh and look for `sh` in an empty PATH: the fallback is us.
        let err = real_shell(None, "sh", Some(OsStr::new("")), Path::new("/usr/bin/sh"));
        assert!(
            matches!(err, Err(RealShellError::OnlyOurselves { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn bad_variable_is_reported() {
        for text in ["", "ssh", "[]", "[\"\"]", "[1]", "{\"a\":1}"] {
            assert!(parse_real_rsh(text).is_err(), "{text}");
        }
        assert_eq!(
            parse_real_rsh(r#"["/bin/true"]"#).expect("ok"),
            vec![OsString::from("/bin/true")]
        );
    }
}
