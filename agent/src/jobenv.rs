//! The job's environment: a private directory with the `rsh` shim first in `PATH` (also as
//! `ssh`, `scp` and `sftp`), the
//! launcher variables of PVM, LAM, Open MPI and MPICH pointing at it, and the variables the
//! shim uses to reach this agent.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::Context;
use proto::agent::{ENV_AGENT, ENV_HOSTS_FILE, ENV_JOB, ENV_REAL_RSH};

/// Variables that name the remote-shell program of common parallel systems.
pub const LAUNCHER_VARS: &[&str] = &[
    "PVM_RSH",
    "LAMRSH",
    "OMPI_MCA_plm_rsh_agent",
    "HYDRA_LAUNCHER_EXEC",
];

/// The names the shim has in the job's `bin` directory.
pub const SHIM_NAMES: &[&str] = &["rsh", "ssh", "scp", "sftp"];

/// Open MPI's remote-shell variable (one of [`LAUNCHER_VARS`], with fallbacks: see [`prepare`]).
pub const OMPI_AGENT_VAR: &str = "OMPI_MCA_plm_rsh_agent";
/// Open MPI's tree-spawn switch, set to 1 unless the user's environment has it.
pub const OMPI_NO_TREE_SPAWN_VAR: &str = "OMPI_MCA_plm_rsh_no_tree_spawn";

/// The job's private directory and what the app's environment gets.
#[derive(Debug, Clone)]
pub struct JobEnv {
    pub dir: PathBuf,
    pub shim: PathBuf,
    pub socket: PathBuf,
    pub hosts_file: PathBuf,
    pub vars: BTreeMap<String, String>,
}

/// Creates `dir` (mode 0700) with `bin/rsh` (and `ssh`, `scp`, `sftp`) → the shim, and computes the variables;
/// `preload` (the library's path) goes first in `LD_PRELOAD`. `dir`'s parent, `dir` and
/// `bin` are each created or verified private ([`privdir::ensure_dir`]): a parent another
/// user made or opened would let them swap the job's `rsh`.
pub fn prepare(
    dir: &Path,
    shim_binary: &Path,
    job: u64,
    real_rsh: &[String],
    preload: Option<&Path>,
) -> anyhow::Result<JobEnv> {
    if let Some(parent) = dir.parent() {
        privdir::ensure_dir(parent)?;
        sweep_stale_job_dirs(parent, STALE_AFTER);
    }
    // The name carries this agent's pid: anything already there was left by a dead agent
    // that had the same pid (pids repeat, e.g. in fresh containers), so it is stale.
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("cannot remove the stale {}", dir.display()))?;
    }
    privdir::ensure_dir(dir)?;
    let bin = dir.join("bin");
    privdir::ensure_dir(&bin)?;
    let shim = bin.join("rsh");
    // The same shim as `ssh` (OpenSSH's grammar, by the name it is called under), and as
    // `scp` and `sftp`, which call ssh by full path: they run the real ones with `-S` the
    // job's `ssh` (rsh-shim's `copy`).
    for name in SHIM_NAMES {
        let link = bin.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(shim_binary, &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
    }
    // `rb-jel`, built beside the shim, is on the job's PATH too: a job's scripts use it
    // without installing it (JEL, README).
    let jel_cli = shim_binary.with_file_name("rb-jel");
    if jel_cli.is_file() {
        std::os::unix::fs::symlink(&jel_cli, bin.join("rb-jel"))
            .with_context(|| format!("cannot link {}", bin.join("rb-jel").display()))?;
    }
    let socket = dir.join("agent.sock");
    let hosts_file = dir.join("hosts");
    std::fs::write(&hosts_file, "")?;
    let mut vars = BTreeMap::new();
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    vars.insert("PATH".into(), format!("{}:{path}", bin.display()));
    for var in LAUNCHER_VARS {
        vars.insert((*var).into(), shim.display().to_string());
    }
    // Open MPI hands its agent to every remote orted (`-mca plm_rsh_agent …`), whose
    // plm/rsh component aborts when the program is missing there — and the shim's path is
    // private to this machine (/tmp). ` : rsh : ssh` are alternatives, first found in PATH
    // wins: the shim here, a plain remote shell on the granted hosts.
    vars.insert(
        OMPI_AGENT_VAR.into(),
        format!("{} : rsh : ssh", shim.display()),
    );
    // Tree spawn would have remote orteds start further orteds with that plain remote
    // shell, outside the job (no agent there: `anyLinux` is an unknown host, a real host
    // bypasses the subagent). Every orted starts from here through the shim instead,
    // unless the user chose otherwise.
    if std::env::var_os(OMPI_NO_TREE_SPAWN_VAR).is_none() {
        vars.insert(OMPI_NO_TREE_SPAWN_VAR.into(), "1".into());
    }
    vars.insert(ENV_AGENT.into(), socket.display().to_string());
    vars.insert(ENV_JOB.into(), job.to_string());
    vars.insert(ENV_HOSTS_FILE.into(), hosts_file.display().to_string());
    vars.insert(ENV_REAL_RSH.into(), serde_json::to_string(real_rsh)?);
    if let Some(lib) = preload {
        let existing = std::env::var("LD_PRELOAD").ok();
        let preload =
            proto::symbolic::preload_with(existing.as_deref(), &lib.display().to_string());
        vars.insert("LD_PRELOAD".into(), preload);
    }
    Ok(JobEnv {
        dir: dir.to_path_buf(),
        shim,
        socket,
        hosts_file,
        vars,
    })
}

/// Where an installed `<prefix>/bin/agent` finds its shims: `<prefix>/lib/rb/shims/` (the
/// Debian package's `/usr/lib/rb/shims/`). Never `<prefix>/bin/rsh`: beside an installed
/// agent that is the system's own remote shell.
pub const INSTALLED_SHIM_DIR: &str = "lib/rb/shims";

/// The `rsh` shim the job's `bin/rsh` links to: `<prefix>/lib/rb/shims/rsh` when this
/// program is installed there, else next to this program (a cargo build's
/// `target/<profile>/rsh`).
pub fn find_shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    shim_for(&exe).unwrap_or_else(|| config::sibling_program("rsh"))
}

/// The installed shim of the agent at `exe`, when it exists.
fn shim_for(exe: &Path) -> Option<PathBuf> {
    let prefix = exe.parent()?.parent()?;
    Some(prefix.join(INSTALLED_SHIM_DIR).join("rsh")).filter(|p| p.is_file())
}

/// The job preload library: next to this program (a cargo build), else in
/// `<prefix>/lib/rb/` for `<prefix>/bin/agent`.
pub fn find_preload() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let file = proto::symbolic::PRELOAD_FILE;
    [dir.join(file), dir.parent()?.join("lib/rb").join(file)]
        .into_iter()
        .find(|p| p.is_file())
}

/// How old a job directory without a live agent must be before another agent removes it
/// (a young one may belong to an agent that has not bound its socket yet).
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Removes `job-*` directories under `parent` whose agent is gone: nobody accepts on their
/// `agent.sock`. Liveness is tested by connecting, not by pid, so it holds across PID
/// namespaces sharing one /tmp. Errors are ignored: sweeping is best effort.
pub fn sweep_stale_job_dirs(parent: &Path, older_than: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_job_dir = entry.file_name().to_string_lossy().starts_with("job-")
            && entry.file_type().is_ok_and(|t| t.is_dir());
        let old_enough = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= older_than);
        if is_job_dir && old_enough && !agent_alive(&path.join("agent.sock")) {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn agent_alive(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// Rewrites the hosts file atomically: one `NAME ADDRESS ALLOC` line per allocation.
pub fn write_hosts(path: &Path, hosts: &[(String, String, u64)]) -> std::io::Result<()> {
    let text: String = hosts
        .iter()
        .map(|(n, a, id)| format!("{n} {a} {id}\n"))
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    put_in_place(&tmp, path)
}

/// Puts the file `fresh` where `path` is, at once for readers (who see the old file or the
/// new one, whole). Swapped in (`renameat2` with `RENAME_EXCHANGE`), then the old one,
/// now at `fresh`, removed; a plain rename where the file system cannot swap or `path`
/// does not exist yet. Why not always the rename: ext4 (`auto_da_alloc`, the default)
/// allocates the new file's blocks before it renames it over an existing file: 0.1 ms
/// here on a quiet machine, 0.4 ms under a build's disk load, on every grant's path (the
/// hosts file is written before the grant goes to the shim); the swap it does not (about
/// 45 µs in all, either way).
fn put_in_place(fresh: &Path, path: &Path) -> std::io::Result<()> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use nix::fcntl::{renameat2, RenameFlags};
        if renameat2(None, fresh, None, path, RenameFlags::RENAME_EXCHANGE).is_ok() {
            // The old contents: a file left behind is overwritten by the next write.
            let _ = std::fs::remove_file(fresh);
            return Ok(());
        }
    }
    std::fs::rename(fresh, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_installed_agent_uses_its_private_shim_never_the_system_rsh() {
        let root = tempfile::tempdir().expect("tempdir");
        let prefix = root.path().join("usr");
        std::fs::create_dir_all(prefix.join("bin")).expect("bin");
        std::fs::write(prefix.join("bin/rsh"), "the system's rsh").expect("rsh");
        let agent = prefix.join("bin/agent");
        assert_eq!(shim_for(&agent), None, "no private shim installed yet");
        std::fs::create_dir_all(prefix.join(INSTALLED_SHIM_DIR)).expect("shims");
        std::fs::write(prefix.join(INSTALLED_SHIM_DIR).join("rsh"), "shim").expect("shim");
        assert_eq!(shim_for(&agent), Some(prefix.join("lib/rb/shims/rsh")));
    }

    #[test]
    fn the_preload_library_is_loaded_only_when_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lib = Path::new("/opt/rb/lib/rb/librb_preload.so");
        let with =
            prepare(&dir.path().join("a"), Path::new("/x"), 1, &[], Some(lib)).expect("prepare");
        assert!(with.vars["LD_PRELOAD"].starts_with(&lib.display().to_string()));
        let without =
            prepare(&dir.path().join("b"), Path::new("/x"), 1, &[], None).expect("prepare");
        assert!(!without.vars.contains_key("LD_PRELOAD"));
    }

    #[test]
    fn prepare_links_the_shim_and_sets_every_launcher_variable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = prepare(
            &dir.path().join("job"),
            Path::new("/opt/rb/rsh"),
            7,
            &["ssh".into()],
            None,
        )
        .expect("prepare");
        for name in SHIM_NAMES {
            assert_eq!(
                std::fs::read_link(env.dir.join("bin").join(name)).expect("link"),
                Path::new("/opt/rb/rsh"),
                "{name}"
            );
        }
        assert_eq!(env.shim, env.dir.join("bin/rsh"));
        assert!(env.vars["PATH"].starts_with(&format!("{}:", env.dir.join("bin").display())));
        let shim = env.shim.display().to_string();
        for var in LAUNCHER_VARS.iter().filter(|v| **v != OMPI_AGENT_VAR) {
            assert_eq!(env.vars[*var], shim);
        }
        assert_eq!(env.vars[OMPI_AGENT_VAR], format!("{shim} : rsh : ssh"));
        if std::env::var_os(OMPI_NO_TREE_SPAWN_VAR).is_none() {
            assert_eq!(env.vars[OMPI_NO_TREE_SPAWN_VAR], "1");
        }
        assert_eq!(env.vars[ENV_JOB], "7");
        assert_eq!(env.vars[ENV_REAL_RSH], r#"["ssh"]"#);
        write_hosts(&env.hosts_file, &[("node03".into(), "10.77.0.3".into(), 4)]).expect("hosts");
        assert_eq!(
            std::fs::read_to_string(&env.hosts_file).expect("read"),
            "node03 10.77.0.3 4\n"
        );
    }

    /// The hosts file is replaced whole: a reader never finds it missing, empty or half
    /// written while it is rewritten (swapped in, or renamed where it did not exist yet),
    /// and no temporary file stays beside it.
    #[test]
    fn the_hosts_file_is_always_read_whole_while_rewritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hosts");
        let lists: Vec<Vec<(String, String, u64)>> = (1..=6u64)
            .map(|n| {
                (1..=n)
                    .map(|i| (format!("node{i:02}"), format!("10.77.0.{i}"), 100 * n + i))
                    .collect()
            })
            .collect();
        let texts: Vec<String> = lists
            .iter()
            .map(|l| {
                l.iter()
                    .map(|(n, a, id)| format!("{n} {a} {id}\n"))
                    .collect()
            })
            .collect();
        write_hosts(&path, &lists[0]).expect("the first write: nothing there yet");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, texts, stop) = (path.clone(), texts.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads == 0 {
                    let text = std::fs::read_to_string(&path).expect("never missing");
                    assert!(texts.contains(&text), "a partial hosts file: {text:?}");
                    reads += 1;
                }
                reads
            })
        };
        for round in 0..300 {
            write_hosts(&path, &lists[round % lists.len()]).expect("rewrite");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().expect("reader") > 0);
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            texts[299 % 6]
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["hosts"], "nothing left beside it");
    }

    #[test]
    fn sweep_removes_dirs_of_dead_agents_and_keeps_live_and_young_ones() {
        let root = tempfile::tempdir().expect("tempdir");
        let dead = root.path().join("job-1-100");
        let live = root.path().join("job-2-200");
        let other = root.path().join("keep-me");
        for d in [&dead, &live, &other] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        drop(std::os::unix::net::UnixListener::bind(dead.join("agent.sock")).expect("bind"));
        let _alive = std::os::unix::net::UnixListener::bind(live.join("agent.sock")).expect("bind");
        sweep_stale_job_dirs(root.path(), std::time::Duration::from_secs(3600));
        assert!(dead.exists(), "a young directory is kept");
        sweep_stale_job_dirs(root.path(), std::time::Duration::ZERO);
        assert!(!dead.exists(), "nobody accepts on its socket: removed");
        assert!(live.exists(), "its agent accepts: kept");
        assert!(other.exists(), "not a job directory: kept");
    }

    #[test]
    fn prepare_replaces_a_stale_directory_of_the_same_name() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("job-1-5047");
        std::fs::create_dir_all(&dir).expect("mkdir");
        drop(std::os::unix::net::UnixListener::bind(dir.join("agent.sock")).expect("bind"));
        let env = prepare(&dir, Path::new("/opt/rb/rsh"), 1, &[], None).expect("prepare");
        assert!(!env.socket.exists(), "the stale socket is gone");
        std::os::unix::net::UnixListener::bind(&env.socket).expect("the socket can be bound again");
    }
}
