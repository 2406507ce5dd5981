//! `rb-lab-init`: PID 1 of a lab host.
//!
//! Started by the harness as
//! `ip netns exec <netns> unshare --uts --pid --mount --fork --kill-child --mount-proc
//!  rb-lab-init --hostname NAME --state DIR --sshd-config FILE [--inetd-config FILE]`.
//! In that order it
//! 1. sets the hostname (UTS namespace),
//! 2. mounts an overlay on /etc: the machine's /etc below, `DIR/etc` (the host's own
//!    hosts, passwd, …; written by the harness) on top, `DIR/etc-work` as its work
//!    directory; read-only with `DIR/etc` as top lower layer where the lab directory
//!    cannot be an upper layer (why an overlay and not bind mounts: `provision.rs`,
//!    "A host's /etc"),
//! 3. bind-mounts `DIR/tmp` over /tmp, `DIR/run` over /run and `DIR/log` over /var/log
//!    (private per host; /run/utmp is the host's own utmp), mounts a tmpfs on /dev/shm
//!    (private tty files for fake logins), creates /run/sshd, and binds /dev/null over
//!    root's `.bashrc` (the build machine's start-up is not a lab host's),
//! 4. starts `sshd -D` and, with `--inetd-config`, `inetd -i` (for in.rshd),
//! 5. reaps every process of the host (`waitpid(-1)`), restarting nothing,
//! 6. on SIGTERM sends SIGTERM to every process of the host, waits up to 3 s, sends
//!    SIGKILL to what is left and exits.
//!
//! The mount namespace is private (unshare's default propagation), so none of these mounts
//! is seen by the machine. Messages go to stderr, which the harness sends to
//! `hosts/<name>/console.log`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::provision::{ETC_LAYER, ETC_WORK, INETD, SSHD};

/// What the init was told on its command line.
#[derive(Debug, PartialEq)]
struct InitArgs {
    hostname: String,
    state: PathBuf,
    sshd_config: PathBuf,
    inetd_config: Option<PathBuf>,
}

/// Parses `--hostname NAME --state DIR --sshd-config FILE [--inetd-config FILE]`.
fn parse_args(args: &[String]) -> Result<InitArgs, String> {
    let (mut hostname, mut state, mut sshd, mut inetd) = (None, None, None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .clone();
        match flag.as_str() {
            "--hostname" => hostname = Some(value),
            "--state" => state = Some(PathBuf::from(value)),
            "--sshd-config" => sshd = Some(PathBuf::from(value)),
            "--inetd-config" => inetd = Some(PathBuf::from(value)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(InitArgs {
        hostname: hostname.ok_or("--hostname is required")?,
        state: state.ok_or("--state is required")?,
        sshd_config: sshd.ok_or("--sshd-config is required")?,
        inetd_config: inetd,
    })
}

/// Runs the init with the arguments after the program name; returns the exit code.
/// Only returns early on setup errors: otherwise it runs until SIGTERM.
pub fn main(args: &[String]) -> i32 {
    let usage = "usage: rb-lab-init --hostname NAME --state DIR --sshd-config FILE [--inetd-config FILE]\n(started by the lab harness inside a host's namespaces; not meant to be run by hand)";
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rb-lab-init: {e}\n{usage}");
            return 64;
        }
    };
    if std::process::id() != 1 {
        eprintln!("rb-lab-init: must be PID 1 of a new PID namespace\n{usage}");
        return 64;
    }
    // Block the signals we wait for before starting anything, so none is lost.
    // Children get an empty mask back in `spawn` (std's Command keeps the mask).
    let mut set = SigSet::empty();
    for s in [Signal::SIGCHLD, Signal::SIGTERM] {
        set.add(s);
    }
    if let Err(e) = set.thread_block() {
        eprintln!("rb-lab-init: cannot block signals: {e}");
        return 1;
    }
    if let Err(e) = setup(&args) {
        eprintln!("rb-lab-init[{}]: setup failed: {e}", args.hostname);
        return 1;
    }
    start_daemons(&args);
    eprintln!("rb-lab-init[{}]: up", args.hostname);
    serve(&set, &args.hostname)
}

/// Hostname, private mounts, /run/sshd.
fn setup(a: &InitArgs) -> Result<(), String> {
    nix::unistd::sethostname(&a.hostname).map_err(|e| format!("sethostname: {e}"))?;
    mount_etc(&a.hostname, &a.state)?;
    bind(&a.state.join("tmp"), Path::new("/tmp"))?;
    bind(&a.state.join("run"), Path::new("/run"))?;
    bind(&a.state.join("log"), Path::new("/var/log"))?;
    mount(
        Some("tmpfs"),
        "/dev/shm",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777,size=16m"),
    )
    .map_err(|e| format!("mount tmpfs on /dev/shm: {e}"))?;
    std::fs::create_dir_all("/run/sshd").map_err(|e| format!("mkdir /run/sshd: {e}"))?;
    hide_roots_bashrc()?;
    Ok(())
}

/// Root's logins in a host (the broker's ssh and rsh transports) start a bash that reads
/// root's `~/.bashrc`, which is the build machine's: this machine's runs `pyenv init`, whose
/// rehash waits 60 s on a lock file that a host crashed during a login leaves behind, after
/// which every root login on every lab host (and every later lab) stalls. A host is its own
/// machine: root's `.bashrc` there reads as empty (`/dev/null` bound over it), as the lab
/// user's is.
fn hide_roots_bashrc() -> Result<(), String> {
    let Ok(Some(root)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(0)) else {
        return Ok(());
    };
    let bashrc = root.dir.join(".bashrc");
    if !bashrc.is_file() {
        return Ok(());
    }
    bind(Path::new("/dev/null"), &bashrc)
}

/// Mounts the overlay on /etc: `state/etc` over the machine's /etc, writable (writes go
/// to `state/etc`). Where the lab directory cannot be an overlay's upper layer (it is on
/// an overlayfs itself, as in many containers), falls back to a read-only /etc with
/// `state/etc` as its top layer, and says so on the console.
fn mount_etc(host: &str, state: &Path) -> Result<(), String> {
    if !state.join(ETC_LAYER).is_dir() {
        // A lab made by an earlier version, booted again: `ip netns exec` has put its
        // /etc/netns files over /etc already.
        eprintln!("rb-lab-init[{host}]: no {ETC_LAYER}/ in the host directory: /etc as is");
        return Ok(());
    }
    let writable = etc_overlay_options(state, true)?;
    let Err(first) = mount_overlay_on_etc(&writable) else {
        return Ok(());
    };
    let read_only = etc_overlay_options(state, false)?;
    mount_overlay_on_etc(&read_only).map_err(|e| {
        format!("mount overlay on /etc: {first} ({writable}); read-only: {e} ({read_only})")
    })?;
    eprintln!("rb-lab-init[{host}]: /etc is read-only: {first} ({writable})");
    Ok(())
}

fn mount_overlay_on_etc(options: &str) -> Result<(), Errno> {
    mount(
        Some("overlay"),
        "/etc",
        Some("overlay"),
        MsFlags::empty(),
        Some(options),
    )
}

/// The overlay options for /etc, with `state/etc` as upper layer (`writable`) or as the
/// top lower layer; refuses state paths the option syntax cannot carry.
fn etc_overlay_options(state: &Path, writable: bool) -> Result<String, String> {
    let text = |path: PathBuf| {
        path.to_str()
            .filter(|t| !t.contains([',', ':', '\\']))
            .map(str::to_string)
            .ok_or_else(|| {
                format!(
                    "state path {} cannot be an overlay option (no ',', ':' or '\\')",
                    path.display()
                )
            })
    };
    let layer = text(state.join(ETC_LAYER))?;
    Ok(if writable {
        let work = text(state.join(ETC_WORK))?;
        format!("lowerdir=/etc,upperdir={layer},workdir={work}")
    } else {
        format!("lowerdir={layer}:/etc")
    })
}

fn bind(from: &Path, to: &Path) -> Result<(), String> {
    mount(Some(from), to, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| format!("bind {} over {}: {e}", from.display(), to.display()))
}

/// Starts sshd and, if configured, inetd. A daemon that fails to start is reported, not
/// fatal: the host stays up (like a real machine whose sshd is broken).
fn start_daemons(a: &InitArgs) {
    let log = a.state.join("sshd.log");
    let mut sshd = Command::new(SSHD);
    sshd.arg("-D")
        .arg("-f")
        .arg(&a.sshd_config)
        .arg("-E")
        .arg(&log);
    spawn(&a.hostname, &mut sshd);
    if let Some(conf) = &a.inetd_config {
        let mut inetd = Command::new(INETD);
        inetd.args(["-i", "-R", "10000"]).arg(conf);
        spawn(&a.hostname, &mut inetd);
    }
}

fn spawn(host: &str, cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::null());
    // A daemon started with SIGCHLD/SIGTERM blocked never reaps its children (inetd left
    // every in.rshd a zombie) and passes the blocked SIGTERM on to every remote command.
    // SAFETY: between fork and exec; sigprocmask is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_SETMASK,
                Some(&SigSet::empty()),
                None,
            )
            .map_err(std::io::Error::from)
        });
    }
    if let Err(e) = cmd.spawn() {
        eprintln!(
            "rb-lab-init[{host}]: cannot start {:?}: {e}",
            cmd.get_program()
        );
    }
}

/// Reaps children until SIGTERM, then shuts the host down.
fn serve(set: &SigSet, host: &str) -> i32 {
    loop {
        match set.wait() {
            Ok(Signal::SIGTERM) => break,
            Ok(_) => {
                reap_all();
            }
            Err(e) => {
                eprintln!("rb-lab-init[{host}]: sigwait: {e}");
                return 1;
            }
        }
    }
    eprintln!("rb-lab-init[{host}]: SIGTERM, stopping every process");
    // pid -1 from PID 1: every process of this PID namespace except ourselves.
    let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut interval = Duration::from_millis(1);
    while reap_all() && Instant::now() < deadline {
        std::thread::sleep(interval);
        interval = (interval * 2).min(Duration::from_millis(50));
    }
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    0
}

/// Reaps every exited child; returns whether children remain.
fn reap_all() -> bool {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return true,
            Ok(_) => continue,
            Err(Errno::EINTR) => continue,
            Err(_) => return false, // ECHILD: nobody left
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_full_and_minimal_arguments() {
        let a = parse_args(&strings(&[
            "--hostname",
            "node02",
            "--state",
            "/s",
            "--sshd-config",
            "/c",
            "--inetd-config",
            "/i",
        ]))
        .expect("valid");
        assert_eq!(a.hostname, "node02");
        assert_eq!(a.inetd_config, Some(PathBuf::from("/i")));
        let a = parse_args(&strings(&[
            "--hostname",
            "h",
            "--state",
            "/s",
            "--sshd-config",
            "/c",
        ]))
        .expect("valid");
        assert_eq!(a.inetd_config, None);
    }

    #[test]
    fn etc_overlay_puts_the_host_layer_over_the_machine_s_etc() {
        let state = Path::new("/var/tmp/rb-lab-3/hosts/node02");
        assert_eq!(
            etc_overlay_options(state, true).expect("valid"),
            "lowerdir=/etc,upperdir=/var/tmp/rb-lab-3/hosts/node02/etc,\
             workdir=/var/tmp/rb-lab-3/hosts/node02/etc-work"
        );
        assert_eq!(
            etc_overlay_options(state, false).expect("valid"),
            "lowerdir=/var/tmp/rb-lab-3/hosts/node02/etc:/etc"
        );
        assert!(etc_overlay_options(Path::new("/x,lowerdir=/y"), true).is_err());
        assert!(etc_overlay_options(Path::new("/x:y"), false).is_err());
    }

    #[test]
    fn rejects_missing_and_unknown_arguments() {
        assert!(parse_args(&strings(&["--hostname"])).is_err());
        assert!(parse_args(&strings(&["--state", "/s"])).is_err());
        assert!(parse_args(&strings(&["--bogus", "x"])).is_err());
    }
}
