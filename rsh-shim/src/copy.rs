//! `scp` and `sftp` in a job: both run ssh by its full path (`/usr/bin/ssh`), so the job's
//! `ssh` first in PATH never reaches them. The job's `bin/scp` and `bin/sftp` are this
//! shim; it execs the real program (the first in PATH that is not the shim, else
//! `/usr/bin/NAME`) with `-S JOB_SSH` first and the caller's arguments after it: both
//! programs take the last `-S`, so a caller's own `-S` still wins.
//!
//! Why wrappers and not the job's preload library: the library is loaded only in jobs that
//! ask for it, and never in set-user-ID or static programs; a wrapper is one exec, works
//! for every caller that finds `scp` in PATH, and needs no interposition.
//!
//! `JOB_SSH` is the job's `ssh` (a path whose name is `ssh`: the shim picks its grammar by
//! name): the `ssh` beside the path this program was exec'd by, else the first `ssh` in
//! PATH that is this shim. With neither, the real program runs unchanged.

use std::convert::Infallible;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::launch::Plan;
use crate::realsh::{is_executable, same_file};
use crate::{check_depth, exec, lineage, realsh, route_line, say_route, self_exe, Env, ShimError};

/// Execs the real `name` (`scp` or `sftp`) told to use the job's ssh.
pub fn run(name: &str, args: &[OsString], env: &Env) -> Result<Infallible, ShimError> {
    let depth = check_depth(env.depth.as_deref())?;
    let me = self_exe()?;
    let real = realsh::real_shell(None, name, env.path.as_deref(), &me)?;
    let ssh = job_ssh(lineage::exec_path().as_deref(), env.path.as_deref(), &me);
    let plan = plan(real, ssh.as_deref(), args.get(1..).unwrap_or_default());
    let via = ssh.map_or("its own ssh".to_string(), |p| p.display().to_string());
    let what = format!("{} with {via}", plan.program.to_string_lossy());
    say_route(&route_line(name, "-", &what));
    Err(exec(&plan, depth))
}

/// `real… [-S ssh] ARGS…`.
pub fn plan(real: Vec<OsString>, ssh: Option<&Path>, original: &[OsString]) -> Plan {
    let mut words = real.into_iter();
    let program = words.next().unwrap_or_default();
    let mut args: Vec<OsString> = words.collect();
    if let Some(ssh) = ssh {
        args.extend([OsString::from("-S"), ssh.as_os_str().to_owned()]);
    }
    args.extend(original.iter().cloned());
    Plan { program, args }
}

/// The job's `ssh`: beside `exec_path` when that is this shim, else the first `ssh` in
/// `path_var` that is.
pub fn job_ssh(exec_path: Option<&Path>, path_var: Option<&OsStr>, me: &Path) -> Option<PathBuf> {
    let beside = exec_path
        .filter(|p| p.is_absolute())
        .and_then(Path::parent)
        .map(|dir| dir.join("ssh"));
    let ours = |p: &PathBuf| is_executable(p) && same_file(p, me);
    if let Some(path) = beside.filter(ours) {
        return Some(path);
    }
    std::env::split_paths(path_var?)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join("ssh"))
        .find(ours)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn the_job_ssh_goes_first() {
        let plan = plan(
            vec!["/usr/bin/scp".into()],
            Some(Path::new("/job/bin/ssh")),
            &["-O".into(), "f".into(), "anyLinux:".into()],
        );
        assert_eq!(plan.program, "/usr/bin/scp");
        let want: Vec<OsString> = ["-S", "/job/bin/ssh", "-O", "f", "anyLinux:"]
            .map(OsString::from)
            .to_vec();
        assert_eq!(plan.args, want);
    }

    #[test]
    fn the_job_ssh_is_found_beside_us_or_in_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let me = dir.path().join("shim");
        std::fs::write(&me, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&me, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let (bin, other, real) = (
            dir.path().join("bin"),
            dir.path().join("o"),
            dir.path().join("r"),
        );
        for d in [&bin, &other, &real] {
            std::fs::create_dir(d).expect("mkdir");
        }
        symlink(&me, bin.join("ssh")).expect("link");
        symlink(&me, bin.join("scp")).expect("link");
        std::fs::copy(&me, real.join("ssh")).expect("a real ssh");
        assert_eq!(
            job_ssh(Some(&bin.join("scp")), None, &me),
            Some(bin.join("ssh"))
        );
        let path = std::env::join_paths([&real, &bin]).expect("join");
        assert_eq!(
            job_ssh(Some(&other.join("scp")), Some(&path), &me),
            Some(bin.join("ssh")),
            "a real ssh earlier in PATH is not the job's"
        );
        assert_eq!(
            job_ssh(Some(Path::new("scp")), Some(real.as_os_str()), &me),
            None
        );
    }
}
