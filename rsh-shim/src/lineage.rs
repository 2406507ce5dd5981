//! The job of a caller that cleaned its environment (GNU parallel runs its remote probe
//! with only `PATH` and `HOME`): a process of a job is in the job whatever its environment.
//! Found from
//! 1. the shim's own directory ([`from_own_directory`], every call without `RB_AGENT`: one
//!    `lstat`): the agent installs it as `JOBDIR/bin/rsh`, next to `JOBDIR/agent.sock` and
//!    `JOBDIR/hosts`, and a caller reaches it there through the job's `PATH` or launcher
//!    variables (the path it exec'd is `AT_EXECFN`);
//! 2. else, for a symbolic host only (a call that would otherwise become a one-shot job),
//!    its ancestry ([`from_ancestry`]): the nearest ancestor whose environment
//!    (`/proc/PID/environ`, as it was started) names an agent. Pass-through calls outside
//!    any job do not pay for that walk.

use std::ffi::{CStr, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use proto::agent::{ENV_AGENT, ENV_HOSTS_FILE, ENV_REAL_RSH};

/// How many ancestors are looked at, at most.
const MAX_ANCESTORS: usize = 16;

/// What a job's environment tells the shim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobVars {
    pub agent: Option<OsString>,
    pub hosts_file: Option<OsString>,
    pub real_rsh: Option<OsString>,
}

/// The job whose directory holds this shim, if it was exec'd there.
pub fn from_own_directory() -> Option<JobVars> {
    own_directory(&exec_path()?)
}

/// The job of the nearest ancestor that names one.
pub fn from_ancestry() -> Option<JobVars> {
    ancestry(std::os::unix::process::parent_id())
}

/// The path this program was exec'd by (relative paths resolve against the unchanged cwd).
pub fn exec_path() -> Option<PathBuf> {
    // SAFETY: getauxval has no preconditions; AT_EXECFN, when present, points at the
    // NUL-terminated path string the kernel put on our stack at exec, alive until exit.
    let ptr = unsafe { libc::getauxval(libc::AT_EXECFN) } as *const libc::c_char;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-null AT_EXECFN is a valid C string (see above).
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    Some(PathBuf::from(OsStr::from_bytes(bytes)))
}

/// `JOBDIR/bin/rsh` with `JOBDIR/agent.sock` next to it → that job (its real remote shell
/// is not on disk: the default one is used for pass-through).
pub fn own_directory(exec_path: &Path) -> Option<JobVars> {
    let bin = exec_path.parent()?;
    if bin.file_name()? != "bin" {
        return None;
    }
    let dir = bin.parent()?;
    let socket = dir.join("agent.sock");
    use std::os::unix::fs::FileTypeExt;
    if !std::fs::symlink_metadata(&socket).is_ok_and(|m| m.file_type().is_socket()) {
        return None;
    }
    Some(JobVars {
        agent: Some(socket.into_os_string()),
        hosts_file: Some(dir.join("hosts").into_os_string()),
        real_rsh: None,
    })
}

/// The job variables of the nearest process from `pid` up that has them.
pub fn ancestry(mut pid: u32) -> Option<JobVars> {
    for _ in 0..MAX_ANCESTORS {
        if pid <= 1 {
            return None;
        }
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        // Unreadable (another user's, a setuid program): not the job's, look further up.
        if let Some(vars) = std::fs::read(proc_dir.join("environ"))
            .ok()
            .and_then(|env| job_vars(&env))
        {
            return Some(vars);
        }
        pid = parent(&proc_dir)?;
    }
    None
}

/// The job variables in a NUL-separated environment block, if it names an agent.
pub fn job_vars(environ: &[u8]) -> Option<JobVars> {
    let mut vars = JobVars::default();
    for entry in environ.split(|b| *b == 0) {
        let Some(eq) = entry.iter().position(|b| *b == b'=') else {
            continue;
        };
        let (name, value) = (&entry[..eq], &entry[eq + 1..]);
        let value = (!value.is_empty()).then(|| OsStr::from_bytes(value).to_owned());
        match name {
            n if n == ENV_AGENT.as_bytes() => vars.agent = value,
            n if n == ENV_HOSTS_FILE.as_bytes() => vars.hosts_file = value,
            n if n == ENV_REAL_RSH.as_bytes() => vars.real_rsh = value,
            _ => {}
        }
    }
    vars.agent.is_some().then_some(vars)
}

/// The parent field of `/proc/PID/stat` (after the command name's last `)`).
fn parent(proc_dir: &Path) -> Option<u32> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_variables_are_read_from_an_environment_block() {
        let block: &[u8] = b"PATH=/bin\0RB_AGENT=/tmp/rb-1/job-2-3/agent.sock\0\
            RB_HOSTS_FILE=/h\0RB_REAL_RSH=[\"ssh\"]\0";
        let vars = job_vars(block).expect("names an agent");
        assert_eq!(
            vars.agent.as_deref(),
            Some(OsStr::new("/tmp/rb-1/job-2-3/agent.sock"))
        );
        assert_eq!(vars.hosts_file.as_deref(), Some(OsStr::new("/h")));
        assert_eq!(vars.real_rsh.as_deref(), Some(OsStr::new("[\"ssh\"]")));
        assert_eq!(job_vars(b"PATH=/bin\0HOME=/root\0"), None);
        assert_eq!(
            job_vars(b"RB_AGENT=\0RB_HOSTS_FILE=/h\0"),
            None,
            "empty is unset"
        );
    }

    #[test]
    fn the_shim_in_a_job_directory_finds_the_socket_next_to_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("mkdir");
        let shim = bin.join("rsh");
        assert_eq!(own_directory(&shim), None, "no socket yet");
        let _listener =
            std::os::unix::net::UnixListener::bind(dir.path().join("agent.sock")).expect("bind");
        let vars = own_directory(&shim).expect("a job directory");
        assert_eq!(
            vars.agent,
            Some(dir.path().join("agent.sock").into_os_string())
        );
        assert_eq!(
            vars.hosts_file,
            Some(dir.path().join("hosts").into_os_string())
        );
        assert_eq!(own_directory(Path::new("/usr/bin/rsh")), None);
        assert_eq!(own_directory(Path::new("rsh")), None);
    }

    #[test]
    fn an_ancestor_that_names_an_agent_is_found_from_a_clean_environment() {
        // A shell in the job starts a program with an empty environment, as `env -i` does.
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "env -i sleep 30; :"])
            .env(ENV_AGENT, "/tmp/x/agent.sock")
            .spawn()
            .expect("spawn");
        let children = format!("/proc/{0}/task/{0}/children", shell.id());
        let is_sleep = |pid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
        };
        let sleeper = (0..500).find_map(|_| {
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            let first = text.split_whitespace().next().and_then(|p| p.parse().ok());
            let pid = first.filter(is_sleep);
            if pid.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            pid
        });
        let found = sleeper.and_then(ancestry);
        if let Some(pid) = sleeper {
            let _ = nix_kill(pid);
        }
        let _ = shell.kill();
        let _ = shell.wait();
        let found = found.expect("the shell above the clean-environment sleep names the agent");
        assert_eq!(
            found.agent.as_deref(),
            Some(OsStr::new("/tmp/x/agent.sock"))
        );
        if std::env::var_os(ENV_AGENT).is_none() {
            assert_eq!(
                ancestry(std::process::id()),
                None,
                "the test runner is in no job"
            );
        }
    }

    fn nix_kill(pid: u32) -> std::io::Result<()> {
        std::process::Command::new("kill")
            .arg(pid.to_string())
            .status()
            .map(drop)
    }
}
