//! `rb-subagent`: started by the shim (through the real remote shell) on an allocated host.
//!
//! Two processes, split before any thread exists:
//! - the **front** is what the remote shell waits for: it receives the command's pid and
//!   then its exit status (128+signal when killed) from the guardian and exits with it, so
//!   the remote shell returns exactly as plain rsh/ssh would;
//! - the **guardian** (forked first) starts `/bin/sh -c CMD` as a new process group with
//!   the caller's stdio (or CMD's words directly when it is plain words, see
//!   [`crate::simple_command`]), so it is the command's parent; it is a child subreaper
//!   (`PR_SET_CHILD_SUBREAPER`): whatever the command abandons — `setsid`, `env -i`, a
//!   daemon that writes over its environment — is reparented to it, not to init. It then
//!   detaches from the terminal and from stdio, reaps every child, connects to the job's
//!   agent, reports the group, heartbeats, and ends the group, the tagged processes and
//!   everything below itself — SIGTERM, the grace period, then SIGKILL — when the agent
//!   reclaims the host or when the agent is gone for longer than [`AGENT_LOSS_LIMIT`] (at
//!   once when its port refuses: the agent has ended). It stays while any of those lives
//!   (daemons such as a PVM slave outlive the command that started them), so nothing the job
//!   started on this host is ever left unwatched. When it ends a group on its own (the agent
//!   out of reach: for how long, the last error), it says so in the host's [`log_path`],
//!   never on the caller's stderr. The front is a child subreaper too: should the guardian
//!   be killed while the command runs, the command comes to the front, which ends it and
//!   what is below it.
//!
//! Daemons may leave the group: LAM's `hboot` calls `setsid()` before starting `lamd`. So
//! the command also gets [`TAG_VAR`] in its environment, which every descendant inherits
//! whatever it does to its session; the guardian's [`Watch`] counts and ends processes of
//! the same uid carrying the tag as well as the group.
//!
//! JEL: the front binds the command's JEL socket before the command starts
//! ([`crate::subjel::bind`]) and names it in the command's `RB_JEL` (replacing any inherited
//! one: under the `local` transport that would be the front end's); the guardian serves it
//! and relays each connection over its agent link ([`crate::subjel::Relay`]).

use std::{
    os::fd::{AsRawFd, OwnedFd},
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use std::os::unix::process::CommandExt as _;

use nix::{sys::signal::Signal, unistd::Pid};
use proto::{
    auth::Secret,
    frame::FramedConn,
    handshake::{client_handshake, ClientAuth},
    msg::{FromBroker, Role, ToBroker},
};

use crate::{
    core::link_loss::{
        AGENT_LOSS_LIMIT, CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT, LOSS_END_GRACE, RETRY_PAUSE,
    },
    subjel::{self, Relay},
    watch::{Tree, Watch},
};

const HEARTBEAT: Duration = Duration::from_secs(2);
const GROUP_POLL: Duration = Duration::from_millis(200);

/// What the subagent was asked to do.
#[derive(Debug, Clone)]
pub struct SubagentConfig {
    pub agent: String,
    pub alloc: u64,
    pub secret_file: PathBuf,
    pub command: String,
    /// The job's preload library, present on this host: in the command's `LD_PRELOAD`.
    pub preload: Option<PathBuf>,
    /// The lab's mark (from the broker, through the agent), for the command's tag.
    pub lab_mark: Option<String>,
}

/// The environment variable that marks every process started under one subagent
/// (`ALLOC.PID.MARK`, see [`proto::tag`]: the host daemon reads the allocation from it too).
pub const TAG_VAR: &str = proto::tag::SUBAGENT_TAG_VAR;

/// Runs the front and forks the guardian; returns the exit code for the front.
pub fn run(cfg: SubagentConfig) -> i32 {
    steptimes::mark("sub.start", Some(cfg.alloc));
    unblock_signals();
    // The lab's mark lets the host daemon tell this lab's leftovers from another broker's.
    // Given by the agent (the broker told it); else derived from the secret file, which
    // is the lab secret only for subagents of older agents.
    let lab = cfg
        .lab_mark
        .clone()
        .filter(|m| proto::tag::is_mark(m))
        .or_else(|| Secret::load(&cfg.secret_file).ok().map(|s| s.lab_mark()));
    let tag = proto::tag::subagent_tag(cfg.alloc, std::process::id(), lab.as_deref());
    // Without it the command runs with no `RB_JEL` (the guardian's log says why).
    let jel = subjel::bind(std::process::id());
    steptimes::mark("sub.jel_bound", Some(cfg.alloc));
    // Should the guardian be killed, its children (the command, what it abandoned) come to
    // the front, which then ends them.
    let _ = crate::proctree::become_subreaper();
    // Close-on-exec: a command that inherited the write end would hold the pipe open after
    // the guardian's death, and the front would wait for the command instead of ending it.
    let (from_guardian, to_front) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rb-subagent: pipe: {e}");
            return 1;
        }
    };
    // SAFETY: single-threaded here (no runtime, no threads yet); the child builds its own
    // threads and runtime after the fork.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            steptimes::mark("sub.guardian_start", Some(cfg.alloc));
            drop(from_guardian);
            std::process::exit(guardian_process(cfg, tag, to_front, jel));
        }
        Ok(nix::unistd::ForkResult::Parent { .. }) => {
            drop(to_front);
            let jel_dir = jel.ok().map(|b| b.dir);
            let alloc = cfg.alloc;
            let code = front(from_guardian, &tag, jel_dir);
            steptimes::mark("sub.front_exit", Some(alloc));
            code
        }
        Err(e) => {
            eprintln!("rb-subagent: fork: {e}");
            1
        }
    }
}

/// The front: waits for the command's pid and then its exit code from the guardian, and
/// returns that code. A guardian that ends without sending the code was killed (SIGKILL,
/// the OOM killer; it never ends on its own before the command): nothing would watch the
/// command any more, and its processes, now the front's (a subreaper), would outlive the
/// job. The front then ends them itself (the fault suite's
/// `hostd_subagent_and_agent_sigkilled…` with seed 3), says so on the caller's stderr
/// ([`guardian_lost_note`]) and removes the JEL socket's directory, which the guardian
/// removes when it ends by itself. (The pipe is close-on-exec: a command holding its write
/// end kept the front waiting for the command instead.)
fn front(from_guardian: OwnedFd, tag: &str, jel_dir: Option<PathBuf>) -> i32 {
    let pid = read_i32(&from_guardian);
    let code = pid.and_then(|_| read_i32(&from_guardian));
    if let Some(code) = code {
        return code;
    }
    let watch = Watch {
        pgid: pid.unwrap_or(0),
        var: TAG_VAR,
        tag: tag.to_string(),
        tree: Tree::Below {
            root: std::process::id() as i32,
            skip: Default::default(),
        },
    };
    let reaper = std::thread::spawn(|| reap_children(None, |_| {}));
    watch.end(Duration::from_secs(1));
    drop(reaper);
    // The caller sees the command end with 137 (128 + SIGKILL): say why, as ssh says that a
    // connection was closed by the remote host.
    eprintln!("{}", guardian_lost_note(&hostname()));
    if let Some(dir) = jel_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    128 + Signal::SIGKILL as i32
}

/// What the front says on the caller's stderr when the guardian was killed and it ended
/// the command itself.
fn guardian_lost_note(host: &str) -> String {
    format!(
        "rb-subagent: on {host}, the process that guarded this command was killed (SIGKILL, \
         the OOM killer?); with nothing left to watch it, the command was ended (exit 137)"
    )
}

/// This host's name, or `this host`.
fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "this host".into())
}

/// The guardian process, the command's parent: starts the command with the caller's stdio,
/// tells the front its pid, becomes a child subreaper (what the command abandons stays
/// below it, whatever it does to its session, environment or title), detaches, reaps, and
/// guards ([`guardian`]). Returns its exit code.
fn guardian_process(
    cfg: SubagentConfig,
    tag: String,
    to_front: OwnedFd,
    jel: Result<subjel::Bound, subjel::BindError>,
) -> i32 {
    if let Err(e) = crate::proctree::become_subreaper() {
        eprintln!("rb-subagent: not a child subreaper ({e}): a daemon may outlive the job");
    }
    let jel_socket = jel.as_ref().ok().map(subjel::Bound::socket);
    steptimes::mark("sub.spawn", Some(cfg.alloc));
    let child = match spawn_either(&cfg, &tag, jel_socket.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rb-subagent: cannot run /bin/sh: {e}");
            let _ = nix::unistd::write(&to_front, &0i32.to_le_bytes());
            let _ = nix::unistd::write(&to_front, &127i32.to_le_bytes());
            return 127;
        }
    };
    let pid = child.id() as i32;
    steptimes::mark("sub.command_spawned", Some(cfg.alloc));
    // The front waits for the pid, then the code (the reaper's).
    let _ = nix::unistd::write(&to_front, &pid.to_le_bytes());
    let watch = Watch {
        pgid: pid,
        var: TAG_VAR,
        tag,
        tree: Tree::Below {
            root: std::process::id() as i32,
            skip: Default::default(),
        },
    };
    detach_from_session();
    let (status_tx, status_rx) = tokio::sync::oneshot::channel();
    let alloc = cfg.alloc;
    let spawned = std::thread::Builder::new()
        .name("reaper".into())
        .spawn(move || {
            let mut to_front = Some(to_front);
            let mut status_tx = Some(status_tx);
            reap_children(Some(pid), |code| {
                steptimes::mark("sub.command_exited", Some(alloc));
                if let Some(fd) = to_front.take() {
                    let _ = nix::unistd::write(&fd, &code.to_le_bytes());
                }
                if let Some(tx) = status_tx.take() {
                    let _ = tx.send(code);
                }
            });
        });
    if let Err(e) = spawned {
        // No reaper: the command's end would never be seen. End it now.
        tracing::error!(error = %e, "no reaper thread: ending the command");
        watch.end(LOSS_END_GRACE);
        return 1;
    }
    drop(child);
    guardian(cfg, watch, status_rx, jel)
}

/// Starts the command: plain words are exec'd as `sh -c` would, without starting the
/// shell; should that fail (not found, not executable, a script without `#!`), the shell
/// runs the command after all and says why, with its usual exit code.
fn spawn_either(
    cfg: &SubagentConfig,
    tag: &str,
    jel_socket: Option<&std::path::Path>,
) -> std::io::Result<std::process::Child> {
    let plain = crate::simple_command::plain_argv(&cfg.command)
        .and_then(|argv| spawn_command(cfg, tag, jel_socket, Some(&argv)).ok());
    match plain {
        Some(child) => Ok(child),
        None => spawn_command(cfg, tag, jel_socket, None),
    }
}

/// Reaps every child of this process as it ends (a subreaper's adopted ones too) until
/// none is left; `command`'s exit code (rsh style) goes to `on_command`.
fn reap_children(command: Option<i32>, mut on_command: impl FnMut(i32)) {
    use nix::sys::wait::{waitpid, WaitStatus};
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) if Some(pid.as_raw()) == command => on_command(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if Some(pid.as_raw()) == command => {
                on_command(128 + sig as i32)
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// Four bytes from the pipe as an `i32`; `None` at its end.
fn read_i32(fd: &OwnedFd) -> Option<i32> {
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match nix::unistd::read(fd.as_raw_fd(), &mut buf[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
    Some(i32::from_le_bytes(buf))
}

/// Starts the command as its own process group, tagged, with the job's preload library and
/// this host's JEL socket (`RB_JEL`; none: unset): `argv` directly, or `/bin/sh -c COMMAND`
/// when `argv` is `None`.
fn spawn_command(
    cfg: &SubagentConfig,
    tag: &str,
    jel: Option<&std::path::Path>,
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
    // An inherited member relay is another host's (the front end's, under `local`).
    command.env_remove(ENV_MEMBER_RELAY);
    match jel {
        Some(socket) => command.env(jel::ENV_JEL, socket),
        None => command.env_remove(jel::ENV_JEL),
    };
    if let Some(lib) = &cfg.preload {
        let existing = std::env::var("LD_PRELOAD").ok();
        let preload =
            proto::symbolic::preload_with(existing.as_deref(), &lib.display().to_string());
        command.env("LD_PRELOAD", preload);
    }
    let child = command.spawn()?;
    give_terminal(child.id());
    Ok(child)
}

/// A command whose stdin is our terminal (an interactive login, `ssh -t`) runs in its own
/// process group: that group becomes the terminal's foreground group, else a shell stops at
/// its first read (SIGTTIN). Only when we hold the foreground ourselves; then SIGCONT, for a
/// shell that read before and stopped.
fn give_terminal(pid: u32) {
    use std::io::IsTerminal;
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return;
    }
    let ours = nix::unistd::tcgetpgrp(&stdin).is_ok_and(|fg| fg == nix::unistd::getpgrp());
    let group = nix::unistd::Pid::from_raw(pid as i32);
    if ours && nix::unistd::tcsetpgrp(&stdin, group).is_ok() {
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGCONT);
    }
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

/// `rb-jel join`'s relay for its command (`jel-cli`): never passed to another host.
const ENV_MEMBER_RELAY: &str = "RB_JEL_MEMBER";

/// The guardian process: detached, reports to the agent, ends the group when told.
fn guardian(
    cfg: SubagentConfig,
    watch: Watch,
    status_rx: tokio::sync::oneshot::Receiver<i32>,
    jel: Result<subjel::Bound, subjel::BindError>,
) -> i32 {
    start_log();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let (alloc, pgid) = (cfg.alloc, watch.pgid);
            tracing::error!(alloc, pgid, error = %e, "no runtime: ending the command's processes");
            watch.end(LOSS_END_GRACE);
            return 1;
        }
    };
    runtime.block_on(async {
        let bound = jel
            .map_err(|e| tracing::warn!(error = %e, "the command runs without a JEL socket"))
            .ok();
        let mut relay = Relay::start(bound);
        let alloc = cfg.alloc;
        guard(cfg, &watch, status_rx, &mut relay).await;
        steptimes::mark("sub.guardian_done", Some(alloc));
    });
    0
}

/// Where guardians on this host say why they ended a command (see `start_log`):
/// `subagent.log` in the private runtime root ([`privdir::runtime_root`]).
pub fn log_path() -> PathBuf {
    privdir::runtime_root().join("subagent.log")
}

/// Sends this process's log to [`log_path`] (appended, mode 0600): the guardian's stderr
/// is /dev/null, and the command's stderr is the caller's, where a word from us would
/// break callers that take any stderr output for failure (LAM). Without the file, no log:
/// only a regular file of ours is written (never a symlink, and no FIFO to block on).
fn start_log() {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let path = log_path();
    let opened = privdir::ensure_root()
        .ok()
        .and_then(|_| {
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path)
                .ok()
        })
        .filter(|file| {
            file.metadata()
                .is_ok_and(|m| m.is_file() && m.uid() == nix::unistd::getuid().as_raw())
        });
    if let Some(file) = opened {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::sync::Mutex::new(file))
            // The usual end (the agent's terminate) is debug: one line per remote command
            // would grow the file without end on a busy host.
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_target(false)
            .try_init();
    }
}

/// New session, stdio on /dev/null: the remote shell's session may end without us.
pub(crate) fn detach_from_session() {
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

async fn guard(
    cfg: SubagentConfig,
    watch: &Watch,
    mut status_rx: tokio::sync::oneshot::Receiver<i32>,
    relay: &mut Relay,
) {
    let mut exit_status: Option<i32> = None;
    let mut lost_since: Option<Instant> = None;
    let mut fallback_note = privdir::fallback_note();
    loop {
        let conn = connect(&cfg).await;
        let mut conn = match conn {
            Ok(conn) => conn,
            Err(why) => {
                let since = *lost_since.get_or_insert_with(Instant::now);
                if why.agent_is_gone() || since.elapsed() > AGENT_LOSS_LIMIT || !watch.alive() {
                    agent_lost(&cfg, watch, since, &why);
                    return;
                }
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        lost_since = None;
        steptimes::mark("sub.connected", Some(cfg.alloc));
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
            steptimes::mark("sub.exited_sent", Some(cfg.alloc));
        }
        // The job is told once (its agent prints it on the job's stderr and keeps it as a
        // note): its command runs, but this host's runtime directory is not the usual one.
        if let Some(text) = fallback_note.take() {
            let _ = conn.send(&ToBroker::JobNote { text }).await;
        }
        let mut s = Session {
            alloc: cfg.alloc,
            conn: &mut conn,
            watch,
            relay,
        };
        match s.run(&mut exit_status, &mut status_rx).await {
            SessionEnd::Done => return,
            SessionEnd::Lost => {
                relay.close_all();
                lost_since = Some(Instant::now());
            }
        }
    }
}

/// The agent has been out of reach since `since` (`why`: the last attempt's failure): the
/// command's processes end, and the log says why.
fn agent_lost(cfg: &SubagentConfig, watch: &Watch, since: Instant, why: &AgentLinkError) {
    if !watch.alive() {
        let (alloc, agent) = (cfg.alloc, &cfg.agent);
        tracing::info!(alloc, %agent, "the agent is out of reach; the command has ended");
        return;
    }
    // One line per entry: a `help:` line of the error joins the first.
    let why = why.to_string().replace('\n', "; ");
    tracing::warn!(
        alloc = cfg.alloc,
        pgid = watch.pgid,
        agent = %cfg.agent,
        unreachable_for_s = since.elapsed().as_secs_f64(),
        limit_s = AGENT_LOSS_LIMIT.as_secs(),
        last_error = %why,
        "the job's agent is unreachable: ending the command's processes"
    );
    watch.end(LOSS_END_GRACE);
}

enum SessionEnd {
    Done,
    Lost,
}

/// One connection to the agent, with what it serves.
struct Session<'a> {
    /// For the step times.
    alloc: u64,
    conn: &'a mut FramedConn<tokio::net::TcpStream>,
    watch: &'a Watch,
    relay: &'a mut Relay,
}

/// How long a `Terminate` waits for the JEL lines sent before it (a `vacate`) to be written.
const JEL_FLUSH: Duration = Duration::from_millis(200);

impl Session<'_> {
    async fn run(
        &mut self,
        exit_status: &mut Option<i32>,
        status_rx: &mut tokio::sync::oneshot::Receiver<i32>,
    ) -> SessionEnd {
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        let mut poll = tokio::time::interval(GROUP_POLL);
        loop {
            tokio::select! {
                _ = heartbeat.tick() => {
                    if self.conn.send(&ToBroker::Heartbeat).await.is_err() { return SessionEnd::Lost; }
                }
                _ = poll.tick() => {
                    if exit_status.is_some() && !self.watch.alive() {
                        self.relay_ready().await;
                        return SessionEnd::Done;
                    }
                }
                Some(ev) = self.relay.next() => {
                    if self.relay_local(ev).await.is_err() { return SessionEnd::Lost; }
                }
                status = &mut *status_rx, if exit_status.is_none() => {
                    let code = status.unwrap_or(1);
                    *exit_status = Some(code);
                    if self.conn.send(&ToBroker::SubExited { status: code }).await.is_err() { return SessionEnd::Lost; }
                    steptimes::mark("sub.exited_sent", Some(self.alloc));
                    // Usually nothing outlives the command: the host goes back now, not at the
                    // next poll (up to GROUP_POLL later, while the next request waits for it).
                    if !self.watch.alive() {
                        self.relay_ready().await;
                        return SessionEnd::Done;
                    }
                }
                msg = self.conn.recv::<FromBroker>() => match msg {
                    Ok(FromBroker::Terminate { grace_ms }) => {
                        self.terminate(grace_ms, *exit_status).await;
                        return SessionEnd::Done;
                    }
                    Ok(msg @ (FromBroker::JelSend { .. } | FromBroker::JelDisconnect { .. })) => {
                        if let Some(back) = self.relay.from_agent(msg) {
                            if self.conn.send(&back).await.is_err() { return SessionEnd::Lost; }
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return SessionEnd::Lost,
                },
            }
        }
    }

    /// Passes a local JEL event on to the agent.
    async fn relay_local(&mut self, ev: subjel::Local) -> Result<(), proto::frame::FrameError> {
        match self.relay.local(ev) {
            Some(msg) => self.conn.send(&msg).await,
            None => Ok(()),
        }
    }

    /// Passes on the JEL events already there (the lines and closes of processes that just
    /// ended), so the pool learns a `leave` before the host's end.
    async fn relay_ready(&mut self) {
        while let Some(ev) = self.relay.try_next() {
            if self.relay_local(ev).await.is_err() {
                return;
            }
        }
    }

    /// The agent ends the command (reclaim or job end): the JEL lines sent before (the
    /// `vacate`) are written first; while the group is given its grace, its members' lines
    /// (a `leave`) still reach the pool and the pool's answers reach them (a member waiting
    /// for its `leave` to be answered would otherwise wait for the SIGKILL).
    async fn terminate(&mut self, grace_ms: u64, exit_status: Option<i32>) {
        let pgid = self.watch.pgid;
        tracing::debug!(
            pgid,
            grace_ms,
            "the agent ends the command (reclaim or job end)"
        );
        self.relay.flush(JEL_FLUSH).await;
        let watch = self.watch.clone();
        let end = tokio::task::spawn_blocking(move || watch.end(Duration::from_millis(grace_ms)));
        tokio::pin!(end);
        loop {
            tokio::select! {
                _ = &mut end => break,
                Some(ev) = self.relay.next() => {
                    if self.relay_local(ev).await.is_err() { break; }
                }
                msg = self.conn.recv::<FromBroker>() => match msg {
                    Ok(msg @ (FromBroker::JelSend { .. } | FromBroker::JelDisconnect { .. })) => {
                        if let Some(back) = self.relay.from_agent(msg) {
                            if self.conn.send(&back).await.is_err() { break; }
                        }
                    }
                    Ok(_) => {}
                    Err(_) => break,
                },
            }
        }
        self.relay_ready().await;
        let code = exit_status.unwrap_or(128 + Signal::SIGTERM as i32);
        let _ = self.conn.send(&ToBroker::SubExited { status: code }).await;
    }
}

/// Why a guardian could not get through to its agent (said in the log).
#[derive(Debug, thiserror::Error)]
enum AgentLinkError {
    #[error(transparent)]
    Secret(#[from] proto::auth::SecretError),
    #[error("connecting to {agent} timed out")]
    ConnectTimeout { agent: String },
    #[error("connecting to {agent}: {source}")]
    Connect {
        agent: String,
        source: std::io::Error,
    },
    #[error("the handshake with {agent} timed out")]
    HandshakeTimeout { agent: String },
    #[error("the handshake with {agent}: {source}")]
    Handshake {
        agent: String,
        source: proto::handshake::HandshakeError,
    },
}

impl AgentLinkError {
    /// The agent's port refused the connection: nothing listens there any more, so the
    /// agent has ended (it listens for its whole life), unlike a timeout, which may be a
    /// partition that heals. Its job has ended: waiting [`AGENT_LOSS_LIMIT`] would only
    /// leave the command running on a host the broker may already have given to another job.
    fn agent_is_gone(&self) -> bool {
        matches!(self, AgentLinkError::Connect { source, .. }
            if source.kind() == std::io::ErrorKind::ConnectionRefused)
    }
}

/// Connects to the agent and authenticates.
async fn connect(
    cfg: &SubagentConfig,
) -> Result<FramedConn<tokio::net::TcpStream>, AgentLinkError> {
    let secret = Secret::load(&cfg.secret_file)?;
    let agent = || cfg.agent.clone();
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&cfg.agent))
        .await
        .map_err(|_| AgentLinkError::ConnectTimeout { agent: agent() })?
        .map_err(|source| AgentLinkError::Connect {
            agent: agent(),
            source,
        })?;
    let _ = stream.set_nodelay(true);
    let mut conn = FramedConn::new(stream);
    let name = cfg.alloc.to_string();
    let hs = client_handshake(
        &mut conn,
        Role::Subagent,
        &name,
        ClientAuth::Secret(&secret),
    );
    tokio::time::timeout(HANDSHAKE_TIMEOUT, hs)
        .await
        .map_err(|_| AgentLinkError::HandshakeTimeout { agent: agent() })?
        .map_err(|source| AgentLinkError::Handshake {
            agent: agent(),
            source,
        })?;
    Ok(conn)
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
