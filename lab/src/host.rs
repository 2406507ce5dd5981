//! Booting and killing one lab host.
//!
//! A host is `ip netns exec <netns> unshare --uts --pid --mount --fork --kill-child
//! --mount-proc rb-lab-init …`: `ip netns exec` does not fork, so the pid the harness gets
//! is `unshare`'s. SIGKILL to that pid is a crash: `--kill-child` takes the host's PID 1
//! down and with it every process of the host's PID namespace. The network namespace and
//! the veth are not touched by a crash, so `boot` only starts a new process tree.

use std::fs::{File, OpenOptions};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::cmd;
use crate::manifest::{HostRecord, Manifest};
use crate::process::{children, listens_on, poll, ProcRef};
use crate::provision::reset_host_runtime;
use crate::LabError;

/// How long a host may take from start to sshd (and inetd) accepting connections.
pub(crate) const BOOT_LIMIT: Duration = Duration::from_secs(20);
/// How long a killed host may take to disappear.
pub(crate) const KILL_LIMIT: Duration = Duration::from_secs(10);

/// Environment variable naming the `rb-lab-init` binary.
pub const INIT_ENV: &str = "RB_LAB_INIT";
const INIT_NAME: &str = "rb-lab-init";

/// Finds `rb-lab-init`: `$RB_LAB_INIT` if set (and then only there), else next to the current executable or in its
/// parent directory (tests run from `target/<profile>/deps/`).
pub fn find_init() -> Result<PathBuf, LabError> {
    if let Some(p) = std::env::var_os(INIT_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(LabError::InitMissing {
                searched: format!("${INIT_ENV}={}", p.display()),
            })
        };
    }
    let mut searched = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            let candidate = dir.join(INIT_NAME);
            if candidate.is_file() {
                return Ok(candidate);
            }
            searched.push(candidate.display().to_string());
        }
    }
    Err(LabError::InitMissing {
        searched: searched.join(", "),
    })
}

/// A booted host: the `unshare` child and the host's PID 1.
pub(crate) struct Booted {
    pub child: Child,
    pub unshare: ProcRef,
    pub init: ProcRef,
}

/// Starts the host's process tree (fresh /tmp, /run, /var/log) and returns once its PID 1
/// exists. Call [`wait_ready`] to wait for its daemons.
pub(crate) fn start(m: &Manifest, h: &HostRecord) -> Result<Booted, LabError> {
    reset_host_runtime(m, h)?;
    let console = m.host_dir(&h.name).join("console.log");
    let (out, err) = console_log(&console)?;
    let mut c = host_command(m, h);
    c.stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent; it detaches
    // the host from the caller's terminal and process group (Ctrl-C goes to the caller only).
    unsafe {
        c.pre_exec(|| nix::unistd::setsid().map(drop).map_err(Into::into));
    }
    let mut child = c.spawn().map_err(|source| LabError::Spawn {
        command: cmd::describe(&c),
        source,
        help: START_HELP.into(),
    })?;
    let unshare = ProcRef::of(child.id());
    let init = wait_for_init(&c, &mut child, &h.name, &console);
    match (unshare, init) {
        (Some(unshare), Ok(init)) => Ok(Booted {
            child,
            unshare,
            init,
        }),
        (_, init) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(init.err().unwrap_or(LabError::HostDown {
                host: h.name.clone(),
            }))
        }
    }
}

const START_HELP: &str = "install iproute2 and util-linux (unshare); see the host's console.log";

/// The console log, opened for appending, twice (stdout and stderr).
fn console_log(path: &Path) -> Result<(File, File), LabError> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(LabError::io("open", path, "is the lab directory writable?"))?;
    let copy = log.try_clone().map_err(LabError::io(
        "duplicate handle of",
        path,
        "out of file descriptors?",
    ))?;
    Ok((log, copy))
}

/// Waits for `unshare` (the spawned `child`) to fork the host's PID 1, and returns it.
fn wait_for_init(
    c: &Command,
    child: &mut Child,
    host: &str,
    console: &Path,
) -> Result<ProcRef, LabError> {
    let pid = child.id();
    let mut init = None;
    poll(
        Duration::from_secs(5),
        &format!("PID 1 of {host}"),
        START_HELP,
        || {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(LabError::Command {
                    command: cmd::describe(c),
                    status: status.to_string(),
                    stderr: tail(console),
                    help: START_HELP.into(),
                });
            }
            init = children(pid).first().copied().and_then(ProcRef::of);
            Ok(init.is_some())
        },
    )?;
    init.ok_or_else(|| LabError::HostDown { host: host.into() })
}

/// `ip netns exec <netns> unshare … rb-lab-init …` for the host.
fn host_command(m: &Manifest, h: &HostRecord) -> Command {
    let dir = m.host_dir(&h.name);
    let mut c = Command::new("ip");
    c.args([
        "netns", "exec", &h.netns, "unshare", "--uts", "--pid", "--mount",
    ])
    .args(["--fork", "--kill-child", "--mount-proc"])
    .arg(&m.init)
    .args(["--hostname", &h.name, "--state"])
    .arg(&dir)
    .arg("--sshd-config")
    .arg(dir.join("sshd_config"));
    if m.rsh {
        c.arg("--inetd-config").arg(dir.join("inetd.conf"));
    }
    c
}

/// Waits until the host's sshd (and inetd, with rsh) listen, then, unless the host is
/// partitioned, until a TCP connection from the root namespace to port 22 succeeds.
pub(crate) fn wait_ready(m: &Manifest, h: &HostRecord, init: ProcRef) -> Result<(), LabError> {
    let deadline = Instant::now() + BOOT_LIMIT;
    let console = m.host_dir(&h.name).join("console.log");
    let help = format!(
        "see {} and {}",
        console.display(),
        m.host_dir(&h.name).join("sshd.log").display()
    );
    let what = format!(
        "sshd{} on {} to listen",
        if m.rsh { "/inetd" } else { "" },
        h.name
    );
    poll(BOOT_LIMIT, &what, &help, || {
        if !init.is_alive() {
            return Err(LabError::Command {
                command: format!("rb-lab-init on {}", h.name),
                status: "exited during boot".into(),
                stderr: tail(&console),
                help: help.clone(),
            });
        }
        Ok(listens_on(init.pid, 22) && (!m.rsh || listens_on(init.pid, 514)))
    })?;
    if h.partitioned {
        return Ok(());
    }
    let addr = SocketAddr::from((h.address, 22));
    let left = deadline.saturating_duration_since(Instant::now());
    poll(left, &format!("TCP {addr} to accept"), &help, || {
        Ok(TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok())
    })
}

/// Kills the host: SIGKILL to `unshare` (and to PID 1, should `unshare` be gone already),
/// then waits until both are dead. `child` is reaped when this process started the host.
pub(crate) fn kill(h: &HostRecord, child: Option<Child>) -> Result<(), LabError> {
    for p in [h.unshare, h.init].into_iter().flatten() {
        p.signal(Signal::SIGKILL)?;
    }
    if let Some(mut child) = child {
        child.wait().map_err(LabError::io(
            "wait for host process",
            format!("/proc/{}", child.id()),
            "this should not happen",
        ))?;
    }
    for p in [h.unshare, h.init].into_iter().flatten() {
        p.wait_dead(KILL_LIMIT)?;
    }
    Ok(())
}

/// The last lines of a log file, for error messages.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}
