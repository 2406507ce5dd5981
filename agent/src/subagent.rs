//! `rb-subagent`: started by the shim (through the real remote shell) on an allocated host.
//!
//! Two processes, split before any thread exists:
//! - the **front** runs `/bin/sh -c CMD` as a new process group with the caller's stdio, waits
//!   for it and exits with its status (128+signal when killed), so the remote shell returns
//!   exactly as plain rsh/ssh would;
//! - the **guardian** (forked right after the command starts, detached from the terminal and
//!   from stdio) connects to the job's agent, reports the group, heartbeats, and ends the
//!   group — SIGTERM, the grace period, then SIGKILL — when the agent reclaims the host or
//!   when the agent is gone for longer than [`AGENT_LOSS_LIMIT`]. It stays while any process
//!   of the group lives (daemons such as a PVM slave outlive the command that started them),
//!   so nothing the job started on this host is ever left unwatched.

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

/// What the subagent was asked to do.
#[derive(Debug, Clone)]
pub struct SubagentConfig {
    pub agent: String,
    pub alloc: u64,
    pub secret_file: PathBuf,
    pub command: String,
}

/// Runs the front and forks the guardian; returns the exit code for the front.
pub fn run(cfg: SubagentConfig) -> i32 {
    let mut child = match Command::new("/bin/sh")
        .arg("-c")
        .arg(&cfg.command)
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rb-subagent: cannot run /bin/sh: {e}");
            return 127;
        }
    };
    let pgid = child.id() as i32;
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
            std::process::exit(guardian(cfg, pgid, status_rx));
        }
        Ok(nix::unistd::ForkResult::Parent { .. }) => {
            drop(status_rx);
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
fn guardian(cfg: SubagentConfig, pgid: i32, status_rx: OwnedFd) -> i32 {
    detach_from_session();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => {
            end_group(pgid, Duration::from_secs(1));
            return 1;
        }
    };
    runtime.block_on(guard(cfg, pgid, status_rx));
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

async fn guard(cfg: SubagentConfig, pgid: i32, status_rx: OwnedFd) {
    let mut exit_status: Option<i32> = None;
    let status_task = tokio::task::spawn_blocking(move || read_status(status_rx));
    tokio::pin!(status_task);
    let mut lost_since: Option<Instant> = None;
    loop {
        let conn = connect(&cfg).await;
        let Some(mut conn) = conn else {
            let since = *lost_since.get_or_insert_with(Instant::now);
            if since.elapsed() > AGENT_LOSS_LIMIT || !group_alive(pgid) {
                end_group(pgid, Duration::from_secs(1));
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
                pid: pgid as u32,
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
        match session(&mut conn, pgid, &mut exit_status, &mut status_task).await {
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
    pgid: i32,
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
                if exit_status.is_some() && !group_alive(pgid) {
                    return SessionEnd::Done;
                }
            }
            status = &mut **status_task, if exit_status.is_none() => {
                let code = status.ok().flatten().unwrap_or(1);
                *exit_status = Some(code);
                if conn.send(&ToBroker::SubExited { status: code }).await.is_err() { return SessionEnd::Lost; }
            }
            msg = conn.recv::<FromBroker>() => match msg {
                Ok(FromBroker::Terminate { grace_ms }) => {
                    end_group(pgid, Duration::from_millis(grace_ms));
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

/// True while any process of the group exists.
pub fn group_alive(pgid: i32) -> bool {
    killpg(Pid::from_raw(pgid), None).is_ok()
}

/// SIGTERM the group, wait up to `grace` for it to empty, then SIGKILL what is left.
pub fn end_group(pgid: i32, grace: Duration) {
    let pg = Pid::from_raw(pgid);
    if killpg(pg, Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !group_alive(pgid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = killpg(pg, Signal::SIGKILL);
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
