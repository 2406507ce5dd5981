//! `rb-subagent`: started by the shim (through the real remote shell) on an allocated host.
//!
//! Two processes, split before any thread exists:
//! - the **front** runs `/bin/sh -c CMD` as a new process group with the caller's stdio (or
//!   CMD's words directly when it is plain words, see [`crate::simple_command`]), waits
//!   for it and exits with its status (128+signal when killed), so the remote shell returns
//!   exactly as plain rsh/ssh would;
//! - the **guardian** (forked right after the command starts, detached from the terminal and
//!   from stdio) connects to the job's agent, reports the group, heartbeats, and ends the
//!   group — SIGTERM, the grace period, then SIGKILL — when the agent reclaims the host or
//!   when the agent is gone for longer than [`AGENT_LOSS_LIMIT`]. It stays while any process
//!   of the group lives (daemons such as a PVM slave outlive the command that started them),
//!   so nothing the job started on this host is ever left unwatched.
//!
//! Daemons may leave the group: LAM's `hboot` calls `setsid()` before starting `lamd`. So
//! the command also gets [`TAG_VAR`] in its environment, which every descendant inherits
//! whatever it does to its session; the guardian's [`Watch`] counts and ends processes of
//! the same uid carrying the tag as well as the group.

use std::{
    os::fd::{AsRawFd, OwnedFd},
    path::PathBuf,
    process::{Command, ExitStatus},
    time::{Duration, Instant},
};

use std::os::unix::process::CommandExt as _;

use nix::{
    sys::signal::{killpg, Signal},
    unistd::Pid,
};
use proto::{
    auth::Secret,
    frame::FramedConn,
    handshake::{client_handshake, ClientAuth},
    msg::{FromBroker, Role, ToBroker},
};

/// How long the guardian keeps the group alive without its agent before ending it.
pub const AGENT_LOSS_LIMIT: Duration = Duration::from_secs(6);
const HEARTBEAT: Duration = Duration::from_secs(2);
const GROUP_POLL: Duration = Duration::from_millis(200);
/// The longest pause between checks while a reclaimed command is given its grace period.
const END_POLL_MAX: Duration = Duration::from_millis(20);

/// What the subagent was asked to do.
#[derive(Debug, Clone)]
pub struct SubagentConfig {
    pub agent: String,
    pub alloc: u64,
    pub secret_file: PathBuf,
    pub command: String,
    /// The job's preload library, present on this host: in the command's `LD_PRELOAD`.
    pub preload: Option<PathBuf>,
}

/// The environment variable that marks every process started under one subagent.
pub const TAG_VAR: &str = "RB_SUBAGENT_TAG";

/// Runs the front and forks the guardian; returns the exit code for the front.
pub fn run(cfg: SubagentConfig) -> i32 {
    unblock_signals();
    let tag = format!("{}.{}", cfg.alloc, std::process::id());
    // Plain words are exec'd as `sh -c` would, without starting the shell; should that
    // fail (not found, not executable, a script without `#!`), the shell runs the command
    // after all and says why, with its usual exit code.
    let plain = crate::simple_command::plain_argv(&cfg.command)
        .and_then(|argv| spawn_command(&cfg, &tag, Some(&argv)).ok());
    let spawned = match plain {
        Some(child) => Ok(child),
        None => spawn_command(&cfg, &tag, None),
    };
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rb-subagent: cannot run /bin/sh: {e}");
            return 127;
        }
    };
    let watch = Watch {
        pgid: child.id() as i32,
        tag,
    };
    let (status_rx, status_tx) = match nix::unistd::pipe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rb-subagent: pipe: {e}");
            return wait_code(child.wait());
        }
    };
    // SAFETY: single-threaded here (no runtime, no threads yet); the child only calls
    // async-signal-safe functions until it execs nothing and builds its own runtime.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(status_tx);
            std::process::exit(guardian(cfg, watch, status_rx));
        }
        Ok(nix::unistd::ForkResult::Parent { child: guardian }) => {
            drop(status_rx);
            end_group_if_guardian_dies(guardian, watch);
            let code = wait_code(child.wait());
            let _ = nix::unistd::write(&status_tx, &code.to_le_bytes());
            code
        }
        Err(e) => {
            eprintln!("rb-subagent: fork: {e}; the command runs unguarded");
            wait_code(child.wait())
        }
    }
}

/// The guardian ends the group before it exits, so a guardian gone while the command runs
/// was killed (SIGKILL, the OOM killer): nothing would watch the group any more and the
/// job's processes would outlive it. The front then ends the group itself (issue 17, the
/// fault suite's `hostd_subagent_and_agent_sigkilled…` with seed 3).
fn end_group_if_guardian_dies(guardian: Pid, watch: Watch) {
    let spawned = std::thread::Builder::new()
        .name("guardian-watch".into())
        .spawn(move || {
            // Only this thread waits for the guardian; the main thread waits for the command.
            let _ = nix::sys::wait::waitpid(guardian, None);
            watch.end(Duration::from_secs(1));
        });
    if let Err(e) = spawned {
        eprintln!("rb-subagent: cannot watch the guardian: {e}");
    }
}

/// Starts the command as its own process group, tagged, with the job's preload library:
/// `argv` directly, or `/bin/sh -c COMMAND` when `argv` is `None`.
fn spawn_command(
    cfg: &SubagentConfig,
    tag: &str,
    argv: Option<&Vec<String>>,
) -> std::io::Result<std::process::Child> {
    let mut command = match argv {
        Some(argv) => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
        None => {
            let mut c = Command::new("/bin/sh");
            c.arg("-c").arg(&cfg.command);
            c
        }
    };
    command.env(TAG_VAR, tag).process_group(0);
    if let Some(lib) = &cfg.preload {
        let existing = std::env::var("LD_PRELOAD").ok();
        let preload =
            proto::symbolic::preload_with(existing.as_deref(), &lib.display().to_string());
        command.env("LD_PRELOAD", preload);
    }
    command.spawn()
}

/// Gives the command (and the guardian) an empty signal mask and the default SIGTERM
/// action. A remote-shell daemon may start commands with SIGTERM *blocked* (an inetd
/// started with a blocked mask passes it on through in.rshd), and the mask is inherited
/// across fork and exec: a reclaim's SIGTERM would then never arrive, and every reclaim
/// would wait out the grace period for SIGKILL.
fn unblock_signals() {
    use nix::sys::signal::{signal, SigHandler, SigSet, SigmaskHow};
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    // SAFETY: single-threaded here; SIG_DFL installs no handler code.
    let _ = unsafe { signal(Signal::SIGTERM, SigHandler::SigDfl) };
}

/// rsh-style exit code of a finished command.
fn wait_code(status: std::io::Result<ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => s
            .code()
            .or_else(|| s.signal().map(|sig| 128 + sig))
            .unwrap_or(1),
        Err(_) => 1,
    }
}

/// The guardian process: detached, reports to the agent, ends the group when told.
fn guardian(cfg: SubagentConfig, watch: Watch, status_rx: OwnedFd) -> i32 {
    detach_from_session();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => {
            watch.end(Duration::from_secs(1));
            return 1;
        }
    };
    runtime.block_on(guard(cfg, &watch, status_rx));
    0
}

/// New session, stdio on /dev/null: the remote shell's session may end without us.
fn detach_from_session() {
    let _ = nix::unistd::setsid();
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..=2 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
        }
    }
}

async fn guard(cfg: SubagentConfig, watch: &Watch, status_rx: OwnedFd) {
    let mut exit_status: Option<i32> = None;
    let status_task = tokio::task::spawn_blocking(move || read_status(status_rx));
    tokio::pin!(status_task);
    let mut lost_since: Option<Instant> = None;
    loop {
        let conn = connect(&cfg).await;
        let Some(mut conn) = conn else {
            let since = *lost_since.get_or_insert_with(Instant::now);
            if since.elapsed() > AGENT_LOSS_LIMIT || !watch.alive() {
                watch.end(Duration::from_secs(1));
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        lost_since = None;
        let host = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        if conn
            .send(&ToBroker::SubStarted {
                pid: watch.pgid as u32,
                host,
            })
            .await
            .is_err()
        {
            continue;
        }
        if let Some(status) = exit_status {
            let _ = conn.send(&ToBroker::SubExited { status }).await;
        }
        match session(&mut conn, watch, &mut exit_status, &mut status_task).await {
            SessionEnd::Done => return,
            SessionEnd::Lost => lost_since = Some(Instant::now()),
        }
    }
}

enum SessionEnd {
    Done,
    Lost,
}

async fn session(
    conn: &mut FramedConn<tokio::net::TcpStream>,
    watch: &Watch,
    exit_status: &mut Option<i32>,
    status_task: &mut std::pin::Pin<&mut tokio::task::JoinHandle<Option<i32>>>,
) -> SessionEnd {
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    let mut poll = tokio::time::interval(GROUP_POLL);
    loop {
        tokio::select! {
            _ = heartbeat.tick() => {
                if conn.send(&ToBroker::Heartbeat).await.is_err() { return SessionEnd::Lost; }
            }
            _ = poll.tick() => {
                if exit_status.is_some() && !watch.alive() {
                    return SessionEnd::Done;
                }
            }
            status = &mut **status_task, if exit_status.is_none() => {
                let code = status.ok().flatten().unwrap_or(1);
                *exit_status = Some(code);
                if conn.send(&ToBroker::SubExited { status: code }).await.is_err() { return SessionEnd::Lost; }
                // Usually nothing outlives the command: the host goes back now, not at the
                // next poll (up to GROUP_POLL later, while the next request waits for it).
                if !watch.alive() {
                    return SessionEnd::Done;
                }
            }
            msg = conn.recv::<FromBroker>() => match msg {
                Ok(FromBroker::Terminate { grace_ms }) => {
                    watch.end(Duration::from_millis(grace_ms));
                    let code = exit_status.unwrap_or(128 + Signal::SIGTERM as i32);
                    let _ = conn.send(&ToBroker::SubExited { status: code }).await;
                    return SessionEnd::Done;
                }
                Ok(_) => {}
                Err(_) => return SessionEnd::Lost,
            },
        }
    }
}

fn read_status(fd: OwnedFd) -> Option<i32> {
    let mut buf = [0u8; 4];
    match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
        Ok(4) => Some(i32::from_le_bytes(buf)),
        _ => None,
    }
}

async fn connect(cfg: &SubagentConfig) -> Option<FramedConn<tokio::net::TcpStream>> {
    let secret = Secret::load(&cfg.secret_file).ok()?;
    let stream = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::net::TcpStream::connect(&cfg.agent),
    )
    .await
    .ok()?
    .ok()?;
    let _ = stream.set_nodelay(true);
    let mut conn = FramedConn::new(stream);
    let name = cfg.alloc.to_string();
    let hs = client_handshake(
        &mut conn,
        Role::Subagent,
        &name,
        ClientAuth::Secret(&secret),
    );
    tokio::time::timeout(Duration::from_secs(5), hs)
        .await
        .ok()?
        .ok()?;
    Some(conn)
}

/// What a guardian watches: the command's process group and every process of this uid
/// carrying the tag (daemons that left the group).
#[derive(Debug, Clone)]
pub struct Watch {
    pub pgid: i32,
    pub tag: String,
}

impl Watch {
    /// True while any watched process exists.
    pub fn alive(&self) -> bool {
        group_alive(self.pgid) || !tagged_processes(&self.tag).is_empty()
    }

    /// SIGTERM to everything watched, up to `grace` for it to go, then SIGKILL what is left.
    pub fn end(&self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        // Most commands are gone within a millisecond or two of SIGTERM, and the host is
        // held until we see it: look again soon, then less and less often.
        let mut pause = Duration::from_millis(1);
        while Instant::now() < deadline {
            if !self.alive() {
                return;
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(END_POLL_MAX);
        }
        self.signal(Signal::SIGKILL);
    }

    fn signal(&self, signal: Signal) {
        let _ = killpg(Pid::from_raw(self.pgid), signal);
        for pid in tagged_processes(&self.tag) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    }
}

/// Pids of this uid's live processes whose environment holds `TAG_VAR=tag`.
pub fn tagged_processes(tag: &str) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let needle = format!("{TAG_VAR}={tag}\0").into_bytes();
    let uid = nix::unistd::getuid().as_raw();
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok().map(|p| (p, e)))
        .filter(|(pid, e)| *pid != me && e.metadata().is_ok_and(|m| m.uid() == uid))
        .filter(|(_, e)| has_tag(&e.path(), &needle))
        .map(|(pid, _)| pid)
        .collect()
}

/// Whether the process is a zombie, gone, or a kernel thread: none has an environment.
fn is_zombie_gone_or_kernel_thread(proc_dir: &std::path::Path) -> bool {
    /// `PF_KTHREAD` in the flags field of `/proc/PID/stat`.
    const KERNEL_THREAD: u64 = 0x0020_0000;
    let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else {
        return true;
    };
    let fields: Vec<&str> = crate::ancestry::stat_fields(&stat).take(7).collect();
    let Some(flags) = fields.get(6).and_then(|f| f.parse::<u64>().ok()) else {
        return true;
    };
    matches!(fields.first(), Some(&("Z" | "X"))) || flags & KERNEL_THREAD != 0
}

/// Whether `/proc/PID/environ` holds `needle`. While a process is in the middle of
/// `execve` its environ may not be readable (nor is it empty): retry a few times so a daemon
/// caught exec'ing is not taken for gone. Processes whose environment we may not read (other
/// users', setuid programs) were not started under us, and zombies and kernel threads have
/// none: those are answered at once (a scan as root meets many of them).
fn has_tag(proc_dir: &std::path::Path, needle: &[u8]) -> bool {
    has_tag_pausing(proc_dir, needle, || {
        std::thread::sleep(Duration::from_millis(2))
    })
}

/// [`has_tag`], calling `pause` between attempts.
fn has_tag_pausing(proc_dir: &std::path::Path, needle: &[u8], mut pause: impl FnMut()) -> bool {
    for _ in 0..5 {
        match std::fs::read(proc_dir.join("environ")) {
            Ok(env) if !env.is_empty() => {
                return env.windows(needle.len()).any(|w| w == needle);
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return false,
            _ if is_zombie_gone_or_kernel_thread(proc_dir) => return false,
            _ => pause(),
        }
    }
    false
}

/// True while any process of the group exists.
pub fn group_alive(pgid: i32) -> bool {
    killpg(Pid::from_raw(pgid), None).is_ok()
}

/// `rb-subagent local-shell [-n] [-l USER] HOST CMD`: the remote shell of the `local`
/// transport (virtual hosts on this machine). Runs `sh -c CMD` here; `-n` = stdin from
/// /dev/null; the user must be the caller's own.
pub fn local_shell(args: &[String]) -> i32 {
    let mut no_stdin = false;
    let mut rest = args.iter().peekable();
    while let Some(a) = rest.peek() {
        match a.as_str() {
            "-n" => no_stdin = true,
            "-l" => {
                rest.next();
            }
            s if s.starts_with('-') => {}
            _ => break,
        }
        rest.next();
    }
    let _host = rest.next();
    let command: Vec<&str> = rest.map(String::as_str).collect();
    if command.is_empty() {
        eprintln!("rb-subagent local-shell: no command");
        return 1;
    }
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(command.join(" "));
    if no_stdin {
        cmd.stdin(std::process::Stdio::null());
    }
    use std::os::unix::process::CommandExt;
    let err = cmd.exec();
    eprintln!("rb-subagent local-shell: cannot run /bin/sh: {err}");
    127
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_dir_with_stat(stat: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("stat"), stat).expect("write stat");
        dir
    }

    #[test]
    fn kernel_threads_zombies_and_vanished_processes_have_no_environment_to_wait_for() {
        // Fields as in proc(5); the flags of a kernel thread carry PF_KTHREAD (0x200000).
        let kthread = proc_dir_with_stat("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0");
        let zombie = proc_dir_with_stat("77 (sh) Z 1 77 77 0 -1 4194304 0 0");
        let user = proc_dir_with_stat("78 (a (b) c) S 1 78 78 0 -1 4194560 0 0");
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(is_zombie_gone_or_kernel_thread(kthread.path()));
        assert!(is_zombie_gone_or_kernel_thread(zombie.path()));
        assert!(is_zombie_gone_or_kernel_thread(empty.path()));
        assert!(!is_zombie_gone_or_kernel_thread(user.path()));
    }

    #[test]
    fn a_kernel_thread_is_answered_at_once_a_live_process_is_retried() {
        // No environ file and a kernel thread's stat: not tagged, and no 5 × 2 ms retries.
        let kthread = proc_dir_with_stat("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0");
        let mut pauses = 0;
        let tagged = has_tag_pausing(kthread.path(), b"RB_SUBAGENT_TAG=x\0", || pauses += 1);
        assert!(!tagged);
        assert_eq!(pauses, 0);
        // A live process caught without a readable environment is retried.
        let user = proc_dir_with_stat("78 (lamd) S 1 78 78 0 -1 4194560 0 0");
        let tagged = has_tag_pausing(user.path(), b"RB_SUBAGENT_TAG=x\0", || pauses += 1);
        assert!(!tagged);
        assert_eq!(pauses, 5);
    }

    #[test]
    fn a_daemon_that_left_the_group_is_still_watched_and_ended() {
        // `setsid` puts the sleep in a new session and group, as LAM's hboot does to lamd.
        let tag = format!("test.{}", std::process::id());
        let mut child = Command::new("setsid")
            .args(["sleep", "30"])
            .env(TAG_VAR, &tag)
            .spawn()
            .expect("setsid");
        let is_sleep = |pid: &i32| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
        };
        let found = (0..200).find_map(|_| {
            let pids = tagged_processes(&tag);
            if pids.is_empty() || !pids.iter().all(is_sleep) {
                std::thread::sleep(Duration::from_millis(10));
                None
            } else {
                Some(pids)
            }
        });
        assert_eq!(found, Some(vec![child.id() as i32]));
        // A group that no longer exists: only the tag keeps it alive.
        let watch = Watch {
            pgid: i32::MAX - 1,
            tag: tag.clone(),
        };
        assert!(watch.alive());
        let ended = std::thread::spawn(move || child.wait());
        watch.end(Duration::from_secs(2));
        ended.join().expect("join").expect("wait");
        assert!(!watch.alive());
        assert!(
            tagged_processes(&format!("{tag}9")).is_empty(),
            "tags match exactly"
        );
    }
}
