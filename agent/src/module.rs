//! Modules (`modules/CONTRACT.md`): finding a job's `NAME-grow`, `NAME-shrink` and
//! `NAME-halt` programs on the search path, and running them one at a time with the job's
//! environment, stdin from /dev/null, a time limit, and every output line logged.
//!
//! The agent's shell hands [`Call`]s to the runner task from [`spawn_runner`]; each finished
//! call comes back as an [`Outcome`] through the loop's event channel.

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncRead, BufReader},
    process::Command,
    sync::mpsc,
};
use tracing::info;

pub use crate::core::module_calls::{
    log_outcome, Action, Call, Outcome, Programs, EXIT_ALREADY_THERE, MAX_SAID,
};

/// How long a timed-out module gets between SIGTERM and SIGKILL.
const KILL_AFTER: Duration = Duration::from_secs(2);

/// Checks a module name: letters, digits, `_`, `-`, `.`, not starting with `.` or `-`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    let ok_start = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok_chars && ok_start && name.len() <= 64 {
        Ok(())
    } else {
        Err(format!(
            "module name `{name}` is not usable: use letters, digits, `_`, `-` or `.` \
             (e.g. module=\"pvm\")"
        ))
    }
}

/// The search path, in order: `RB_MODULE_PATH`'s directories, `CONFIG_HOME/rb/modules`, the
/// installed `<prefix>/share/rb/modules` beside `<prefix>/bin/agent`, and the source tree's
/// `modules/` (an agent run from `<tree>/target/<profile>/`, or the tree it was built from).
pub fn search_dirs(
    module_path: Option<&OsStr>,
    config_home: Option<&Path>,
    agent_exe: &Path,
    built_from: Option<&Path>,
) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = module_path
        .map(|p| {
            std::env::split_paths(p)
                .filter(|d| d.is_absolute())
                .collect()
        })
        .unwrap_or_default();
    if let Some(home) = config_home {
        dirs.push(home.join("rb/modules"));
    }
    if let Some(bin) = agent_exe.parent() {
        if let Some(prefix) = bin.parent() {
            dirs.push(prefix.join("share/rb/modules"));
            if let Some(tree) = prefix.parent().filter(|_| prefix.ends_with("target")) {
                dirs.push(tree.join("modules"));
            }
        }
    }
    if let Some(tree) = built_from {
        dirs.push(tree.join("modules"));
    }
    dirs.dedup();
    dirs
}

/// The search path of this process (environment, home, own executable).
pub fn default_search_dirs() -> Vec<PathBuf> {
    let config_home = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    let exe = std::env::current_exe().unwrap_or_default();
    // The workspace root this agent was compiled in (a development build's modules/).
    let tree = Path::new(env!("CARGO_MANIFEST_DIR")).parent();
    search_dirs(
        std::env::var_os("RB_MODULE_PATH").as_deref(),
        config_home.as_deref(),
        &exe,
        tree,
    )
}

/// Looks up `NAME-grow|shrink|halt` in `dirs`, each on its own, first executable wins.
pub fn find(name: &str, dirs: &[PathBuf]) -> Programs {
    let lookup = |action: Action| {
        let file = format!("{name}-{}", action.name());
        dirs.iter()
            .map(|d| d.join(&file))
            .find(|p| is_executable(p))
    };
    Programs {
        name: name.to_string(),
        grow: lookup(Action::Grow),
        shrink: lookup(Action::Shrink),
        halt: lookup(Action::Halt),
        searched: dirs.to_vec(),
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The runner's handle: queue calls with [`Runner::submit`]; [`Runner::skip_queued`] drops
/// calls that have not started (job ending) except halts.
#[derive(Clone)]
pub struct Runner {
    tx: mpsc::UnboundedSender<Call>,
    skipping: Arc<AtomicBool>,
}

impl Runner {
    pub fn submit(&self, call: Call) {
        let _ = self.tx.send(call);
    }

    pub fn skip_queued(&self) {
        self.skipping.store(true, Ordering::SeqCst);
    }
}

/// The variable naming the job's private directory for module programs (see
/// [`scratch_dir`]).
pub const ENV_MODULE_DIR: &str = "RB_MODULE_DIR";

/// The variable naming the directory of the agent's own programs, where modules find
/// helpers shipped with ResourceBroker (`rb-pvm-add`).
pub const ENV_BIN_DIR: &str = "RB_BIN_DIR";

/// The directory of the running agent's executable.
pub fn agent_bin_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()?
        .parent()
        .map(Path::to_path_buf)
}

/// Creates `JOB_DIR/module` (mode 0700), where the job's module programs may keep files:
/// private to the user, used by one call at a time, removed with the job directory. It
/// spares a module a `mktemp` per call (a process, a millisecond or more, while the job
/// waits for its host).
pub fn scratch_dir(job_dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = job_dir.join("module");
    privdir::ensure_dir(&dir)?;
    Ok(dir)
}

/// Starts the task that runs calls one at a time and sends each [`Outcome`] to `done`.
pub fn spawn_runner<E: Send + 'static>(
    programs: Arc<Programs>,
    env: BTreeMap<String, String>,
    done: mpsc::Sender<E>,
    wrap: fn(Outcome) -> E,
) -> Runner {
    let (tx, mut rx) = mpsc::unbounded_channel::<Call>();
    let skipping = Arc::new(AtomicBool::new(false));
    let skip = skipping.clone();
    tokio::spawn(async move {
        while let Some(call) = rx.recv().await {
            if skip.load(Ordering::SeqCst) && call.action != Action::Halt {
                let outcome = Outcome {
                    call,
                    result: Err("skipped: the job is ending".into()),
                    elapsed: Duration::ZERO,
                    code: None,
                    said: Vec::new(),
                };
                let _ = done.send(wrap(outcome)).await;
                continue;
            }
            let started = Instant::now();
            let ran = match programs.program(call.action) {
                Some(program) => run(program, &programs.name, &call, &env).await,
                None => Ran::failed(programs.missing(call.action)),
            };
            let outcome = Outcome {
                call,
                result: ran.result,
                elapsed: started.elapsed(),
                code: ran.code,
                said: ran.said,
            };
            if done.send(wrap(outcome)).await.is_err() {
                break;
            }
        }
    });
    Runner { tx, skipping }
}

/// What running one program came to (see [`Outcome`]).
#[derive(Debug)]
struct Ran {
    result: Result<(), String>,
    code: Option<i32>,
    said: Vec<String>,
}

impl Ran {
    fn failed(why: String) -> Self {
        Ran {
            result: Err(why),
            code: None,
            said: Vec::new(),
        }
    }
}

/// Runs one program to completion or its time limit: the result, its exit status, and
/// what it said on stderr when it succeeded.
async fn run(program: &Path, module: &str, call: &Call, env: &BTreeMap<String, String>) -> Ran {
    match run_program(program, module, call, env).await {
        Ok((status, _, mut said)) if status.success() => {
            said.truncate(MAX_SAID);
            Ran {
                result: Ok(()),
                code: status.code(),
                said,
            }
        }
        Ok((status, failure, _)) => Ran {
            result: Err(failure),
            code: status.code(),
            said: Vec::new(),
        },
        Err(e) => Ran::failed(e),
    }
}

/// Runs one program; its exit status, what to tell people should it have failed, and its
/// stderr lines.
async fn run_program(
    program: &Path,
    module: &str,
    call: &Call,
    env: &BTreeMap<String, String>,
) -> Result<(std::process::ExitStatus, String, Vec<String>), String> {
    let what = call.describe(module);
    let mut cmd = Command::new(program);
    cmd.envs(env)
        .env("RB_MODULE", module)
        .env("RB_MODULE_ACTION", call.action.name())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if call.action == Action::Shrink {
        // What the module may spend itself, a little below the agent's limit.
        let budget = call.timeout.as_secs_f64() * 0.9;
        cmd.env("RB_SHRINK_TIMEOUT_S", format!("{budget:.1}"));
    }
    if let Some((host, address)) = &call.host {
        cmd.arg(host)
            .env("RB_HOST", host)
            .env("RB_HOST_ADDRESS", address);
    }
    steptimes::mark("agent.module_spawn", None);
    let mut child = crate::reaper::spawn_own(|| cmd.spawn(), tokio::process::Child::id)
        .map_err(|e| format!("{what}: cannot run {}: {e}", program.display()))?;
    let pgid = child.id().map(|p| p as i32);
    let out = tokio::spawn(log_lines(child.stdout.take(), what.clone()));
    let err = tokio::spawn(log_lines(child.stderr.take(), what.clone()));
    let status = match tokio::time::timeout(call.timeout, child.wait()).await {
        Ok(status) => {
            steptimes::mark("agent.module_exit", None);
            status.map_err(|e| format!("{what}: {e}"))?
        }
        Err(_) => {
            signal_group(pgid, nix::sys::signal::Signal::SIGTERM);
            if tokio::time::timeout(KILL_AFTER, child.wait())
                .await
                .is_err()
            {
                signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait().await;
            }
            return Err(format!(
                "{what}: timed out after {:.1} s (killed)",
                call.timeout.as_secs_f64()
            ));
        }
    };
    // A module may leave a daemon holding its pipes: do not wait for them forever.
    let _ = tokio::time::timeout(Duration::from_millis(200), out).await;
    let err_lines = tokio::time::timeout(Duration::from_millis(200), err)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let how = describe_status(status);
    let failure = match err_lines.last() {
        Some(line) => format!("{what}: {how}: {line}"),
        None => format!("{what}: {how}"),
    };
    Ok((status, failure, err_lines))
}

fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "failed".into(),
    }
}

fn signal_group(pgid: Option<i32>, signal: nix::sys::signal::Signal) {
    if let Some(pgid) = pgid {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), signal);
    }
}

/// Logs every line of a module's output; returns the non-empty ones (the first
/// [`MAX_SAID`] and the last, at most: a chatty module is not kept in memory).
async fn log_lines<R: AsyncRead + Unpin>(pipe: Option<R>, what: String) -> Vec<String> {
    let mut kept = Vec::new();
    let Some(pipe) = pipe else { return kept };
    let mut lines = BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        info!(module = %what, "{line}");
        if kept.len() > MAX_SAID {
            kept.pop();
        }
        kept.push(line);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_dir_is_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let job = tempfile::tempdir().expect("tempdir");
        let dir = scratch_dir(job.path()).expect("created");
        assert_eq!(dir, job.path().join("module"));
        let mode = std::fs::metadata(&dir).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::write(dir.join("out"), "x").expect("write");
        assert_eq!(scratch_dir(job.path()).expect("again"), dir);
        let file = job.path().join("file");
        std::fs::write(&file, "").expect("write");
        let err = scratch_dir(&file).expect_err("not a directory");
        assert!(format!("{err:#}").contains("cannot create"), "{err:#}");
    }

    #[test]
    fn search_path_order_env_then_config_then_installed_then_tree() {
        let dirs = search_dirs(
            Some(OsStr::new("/a:relative:/b")),
            Some(Path::new("/home/u/.config")),
            Path::new("/opt/rb/bin/agent"),
            None,
        );
        let want: Vec<PathBuf> = [
            "/a",
            "/b",
            "/home/u/.config/rb/modules",
            "/opt/rb/share/rb/modules",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(dirs, want, "relative entries are ignored");
        let dirs = search_dirs(None, None, Path::new("/src/rb/target/debug/agent"), None);
        assert_eq!(dirs.last(), Some(&PathBuf::from("/src/rb/modules")));
    }

    #[test]
    fn find_takes_the_first_executable_of_each_program() {
        use std::os::unix::fs::PermissionsExt;
        let a = tempfile::tempdir().expect("tempdir");
        let b = tempfile::tempdir().expect("tempdir");
        let write = |dir: &Path, name: &str, mode: u32| {
            let p = dir.join(name);
            std::fs::write(&p, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
            p
        };
        write(a.path(), "x-grow", 0o644); // not executable: skipped
        let grow = write(b.path(), "x-grow", 0o755);
        let shrink = write(a.path(), "x-shrink", 0o755);
        write(b.path(), "x-shrink", 0o755);
        let found = find("x", &[a.path().into(), b.path().into()]);
        assert_eq!(found.grow, Some(grow));
        assert_eq!(found.shrink, Some(shrink));
        assert_eq!(found.halt, None);
        let msg = found.missing(Action::Halt);
        assert!(msg.contains("x-halt not found in"), "{msg}");
        assert!(msg.contains(&a.path().display().to_string()), "{msg}");
    }

    #[test]
    fn module_names_cannot_escape_the_search_path() {
        assert!(check_name("pvm").is_ok());
        assert!(check_name("lam_7.1").is_ok());
        for bad in ["", "../x", "a/b", "-x", ".x", "a b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    /// Writes the executable script `path` from a child process. A script this process
    /// wrote and then ran could fail with "Text file busy": another test thread's fork,
    /// made while the file was open for writing, keeps the descriptor until its own exec.
    /// A child's descriptors are gone when it exits, and no thread here holds one.
    fn write_script(path: &std::path::Path, text: &str) {
        use std::io::Write;
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "cat >\"$0\" && chmod 755 \"$0\""])
            .arg(path)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(text.as_bytes()).expect("write");
        drop(stdin);
        assert!(child.wait().expect("wait").success(), "wrote {path:?}");
    }

    async fn run_script(body: &str, timeout: Duration) -> Result<(), String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t-grow");
        write_script(&p, &format!("#!/bin/sh\n{body}\n"));
        let call = Call {
            action: Action::Grow,
            host: Some(("node03".into(), "10.0.0.3".into())),
            alloc: Some(1),
            timeout,
        };
        let env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        run(&p, "t", &call, &env).await.result
    }

    #[tokio::test]
    async fn run_passes_host_and_env_and_reports_failures_with_the_last_stderr_line() {
        let ok = run_script(
            r#"[ "$1" = node03 ] && [ "$RB_HOST_ADDRESS" = 10.0.0.3 ] && [ "$RB_MODULE_ACTION" = grow ] && [ "$RB_MODULE" = t ]"#,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(ok, Ok(()));
        let err = run_script(
            "echo first >&2; echo 'no such host' >&2; exit 3",
            Duration::from_secs(5),
        )
        .await
        .expect_err("fails");
        assert_eq!(err, "t-grow node03: exit status 3: no such host");
        let err = run_script("read x", Duration::from_secs(5)).await;
        assert!(err.is_err(), "stdin is /dev/null: read fails at once");
    }

    #[tokio::test]
    async fn what_a_successful_module_says_on_stderr_is_kept_for_the_user() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t-shrink");
        let body = "#!/bin/sh\necho quiet\necho \"t-shrink: $1 taken back: ended 2\" >&2\n";
        write_script(&p, body);
        let call = Call {
            action: Action::Shrink,
            host: Some(("node03".into(), "10.0.0.3".into())),
            alloc: Some(1),
            timeout: Duration::from_secs(5),
        };
        let ran = run(&p, "t", &call, &BTreeMap::new()).await;
        assert_eq!(ran.result, Ok(()));
        assert_eq!(
            ran.said,
            ["t-shrink: node03 taken back: ended 2"],
            "stderr only"
        );
        std::fs::write(
            &p,
            "#!/bin/sh\nfor i in 1 2 3 4 5 6 7 8; do echo $i >&2; done\nexit 1\n",
        )
        .expect("write");
        let ran = run(&p, "t", &call, &BTreeMap::new()).await;
        assert_eq!(ran.result, Err("t-shrink node03: exit status 1: 8".into()));
        assert!(ran.said.is_empty(), "a failure says it in its result");
    }

    #[tokio::test]
    async fn a_hanging_module_is_killed_at_its_time_limit() {
        let started = Instant::now();
        let err = run_script("trap '' TERM; sleep 30", Duration::from_millis(300))
            .await
            .expect_err("times out");
        assert!(err.contains("timed out after 0.3 s"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
