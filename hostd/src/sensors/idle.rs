//! Idleness sensors: how long since the last keyboard/mouse input.
//!
//! - **tty idle** of a login session: now − atime of `<dev_dir>/<ut_line>` (what `who -u` and
//!   `w` show; the kernel updates a tty's atime on input, with 8-second granularity).
//! - **console idle**: the minimum over (a) the input-device files matching
//!   [`SensorConfig::input_devices`](super::SensorConfig::input_devices), each idle since
//!   max(atime, mtime), and (b) X idle from `xprintidle` (milliseconds) for the configured
//!   display. A source that cannot be read is left out; with no source at all the answer is
//!   `None` (unknown), never "idle".
//!
//! Cost control for the 250 ms activity poll: glob patterns are re-expanded at most every
//! [`DEVICE_RESCAN`], and `xprintidle` runs at most every [`X_IDLE_MIN_INTERVAL`] (between runs
//! the last answer is aged by the time elapsed since it was taken) with a [`X_IDLE_TIMEOUT`].

use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};
use std::{env, fs, thread};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tracing::debug;

use super::glob;

/// How often input-device glob patterns are re-expanded (device hot-plug).
pub const DEVICE_RESCAN: Duration = Duration::from_secs(10);
/// Minimum time between two runs of `xprintidle`.
pub const X_IDLE_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// How long `xprintidle` may take before it is killed and X idle is unknown.
pub const X_IDLE_TIMEOUT: Duration = Duration::from_millis(500);

/// Whole seconds from `then` to `now`; 0 when `then` lies in the future.
pub fn seconds_since(now: SystemTime, then: SystemTime) -> u64 {
    now.duration_since(then).map_or(0, |d| d.as_secs())
}

/// The smaller of two optional idle times; unknown only when both are unknown.
pub fn min_known(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Idle seconds of a login tty: now − atime of `<dev_dir>/<line>`; `None` if it cannot be
/// stat'ed (e.g. `:0` X sessions, a tty that vanished).
pub fn tty_idle(dev_dir: &Path, line: &str, now: SystemTime) -> Option<u64> {
    if line.is_empty() {
        return None;
    }
    let path = dev_dir.join(line.trim_start_matches('/'));
    let atime = fs::metadata(path).and_then(|m| m.accessed()).ok()?;
    Some(seconds_since(now, atime))
}

/// Idle seconds of an input-device file: now − max(atime, mtime); `None` if it cannot be stat'ed.
pub fn device_idle(path: &Path, now: SystemTime) -> Option<u64> {
    let meta = fs::metadata(path).ok()?;
    let last = match (meta.accessed(), meta.modified()) {
        (Ok(a), Ok(m)) => a.max(m),
        (Ok(t), Err(_)) | (Err(_), Ok(t)) => t,
        (Err(_), Err(_)) => return None,
    };
    Some(seconds_since(now, last))
}

/// The input-device files, re-expanded from their glob patterns every [`DEVICE_RESCAN`].
#[derive(Debug)]
pub struct InputDevices {
    patterns: Vec<String>,
    paths: Vec<PathBuf>,
    expanded_at: Option<Instant>,
}

impl InputDevices {
    pub fn new(patterns: Vec<String>) -> Self {
        Self {
            patterns,
            paths: Vec::new(),
            expanded_at: None,
        }
    }

    /// The least idle time over the devices that can be stat'ed; `None` when none can.
    pub fn idle_s(&mut self, now: SystemTime) -> Option<u64> {
        let stale = match self.expanded_at {
            Some(at) => at.elapsed() >= DEVICE_RESCAN,
            None => true,
        };
        if stale {
            self.paths = self.patterns.iter().flat_map(|p| glob::expand(p)).collect();
            self.expanded_at = Some(Instant::now());
        }
        self.paths.iter().filter_map(|p| device_idle(p, now)).min()
    }
}

/// X idle time from `xprintidle`, rate-limited to one run per [`X_IDLE_MIN_INTERVAL`].
#[derive(Debug)]
pub struct XIdle {
    display: Option<String>,
    program: Option<PathBuf>,
    /// When the last run finished and what it answered, in milliseconds.
    last: Option<(Instant, Option<u64>)>,
}

impl XIdle {
    /// X idle for `display` using `xprintidle` from `PATH`; always unknown without a display
    /// or when the program is not installed (looked up once, here).
    pub fn new(display: Option<String>) -> Self {
        let program = display.as_ref().and_then(|_| find_in_path("xprintidle"));
        Self::with_program(display, program)
    }

    /// X idle using a given program that behaves like `xprintidle`.
    pub fn with_program(display: Option<String>, program: Option<PathBuf>) -> Self {
        Self {
            display,
            program,
            last: None,
        }
    }

    /// Seconds since the last X input; `None` when unknown.
    pub fn idle_s(&mut self) -> Option<u64> {
        let (display, program) = (self.display.as_deref()?, self.program.as_deref()?);
        if let Some((at, answer)) = self.last {
            if at.elapsed() < X_IDLE_MIN_INTERVAL {
                let aged = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
                return answer.map(|ms| ms.saturating_add(aged) / 1000);
            }
        }
        let answer = run_xprintidle(program, display, X_IDLE_TIMEOUT);
        self.last = Some((Instant::now(), answer));
        answer.map(|ms| ms / 1000)
    }
}

/// Runs `program` with `DISPLAY=display`; its stdout must be one number of milliseconds.
fn run_xprintidle(program: &Path, display: &str, timeout: Duration) -> Option<u64> {
    let spawned = Command::new(program)
        .env("DISPLAY", display)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => {
            debug!(program = %program.display(), error = %err, "cannot run X idle program");
            return None;
        }
    };
    let status = wait_with_deadline(&mut child, timeout)?;
    if !status.success() {
        debug!(program = %program.display(), %status, "X idle program failed");
        return None;
    }
    let out = read_available(child.stdout.take()?)?;
    out.trim().parse().ok()
}

/// Reads what the exited child left in its stdout pipe without blocking (a grandchild that
/// kept the pipe open must not stall the sensors).
fn read_available(mut pipe: ChildStdout) -> Option<String> {
    let flags = fcntl(pipe.as_raw_fd(), FcntlArg::F_GETFL).ok()?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(pipe.as_raw_fd(), FcntlArg::F_SETFL(flags)).ok()?;
    let mut out = Vec::new();
    match pipe.read_to_end(&mut out) {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(_) => return None,
    }
    String::from_utf8(out).ok()
}

/// Waits for `child` until `timeout`; past it, kills and reaps the child and answers `None`.
fn wait_with_deadline(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => {
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            _ => {
                debug!(pid = child.id(), "X idle program timed out; killing it");
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// The first executable file called `name` in `PATH`.
fn find_in_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use std::fs::{File, FileTimes};
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn set_times(path: &Path, atime: SystemTime, mtime: SystemTime) {
        let file = File::options().write(true).open(path).expect("open");
        let times = FileTimes::new().set_accessed(atime).set_modified(mtime);
        file.set_times(times).expect("set times");
    }

    fn ago(secs: u64) -> SystemTime {
        SystemTime::now() - Duration::from_secs(secs)
    }

    #[test]
    fn tty_idle_is_now_minus_atime() {
        let dev = tempfile::tempdir().expect("tempdir");
        fs::create_dir(dev.path().join("pts")).expect("mkdir");
        let tty = dev.path().join("pts/3");
        fs::write(&tty, "").expect("touch");
        set_times(&tty, ago(300), ago(5));
        let idle = tty_idle(dev.path(), "pts/3", SystemTime::now()).expect("known");
        assert!((300..=302).contains(&idle), "atime only, got {idle}");
        assert_eq!(tty_idle(dev.path(), "pts/4", SystemTime::now()), None);
        assert_eq!(tty_idle(dev.path(), "", SystemTime::now()), None);
    }

    #[test]
    fn future_times_count_as_zero_idle() {
        let now = SystemTime::now();
        assert_eq!(seconds_since(now, now + Duration::from_secs(50)), 0);
    }

    #[test]
    fn device_idle_uses_latest_of_atime_and_mtime() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dev = dir.path().join("event0");
        fs::write(&dev, "").expect("touch");
        set_times(&dev, ago(1000), ago(40));
        let idle = device_idle(&dev, SystemTime::now()).expect("known");
        assert!((40..=42).contains(&idle), "got {idle}");
        set_times(&dev, ago(7), ago(1000));
        let idle = device_idle(&dev, SystemTime::now()).expect("known");
        assert!((7..=9).contains(&idle), "got {idle}");
    }

    #[test]
    fn console_idle_is_minimum_over_devices_and_unknown_without_any() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, secs) in [("event0", 500u64), ("event1", 90), ("mice", 3000)] {
            let p = dir.path().join(name);
            fs::write(&p, "").expect("touch");
            set_times(&p, ago(secs), ago(secs));
        }
        let base = dir.path().display();
        let mut devices = InputDevices::new(vec![format!("{base}/event*"), format!("{base}/mice")]);
        let idle = devices.idle_s(SystemTime::now()).expect("known");
        assert!((90..=92).contains(&idle), "got {idle}");
        let mut none = InputDevices::new(vec![format!("{base}/kbd*")]);
        assert_eq!(none.idle_s(SystemTime::now()), None);
    }

    #[test]
    fn min_known_ignores_unknown() {
        assert_eq!(min_known(Some(5), Some(3)), Some(3));
        assert_eq!(min_known(None, Some(3)), Some(3));
        assert_eq!(min_known(Some(5), None), Some(5));
        assert_eq!(min_known(None, None), None);
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    #[test]
    fn x_idle_from_program_output() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = script(dir.path(), "ok", r#"[ "$DISPLAY" = ":7" ] && echo 12345"#);
        let mut x = XIdle::with_program(Some(":7".into()), Some(ok));
        assert_eq!(x.idle_s(), Some(12));
        assert_eq!(x.idle_s(), Some(12), "cached answer within the interval");
        let fail = script(dir.path(), "fail", "echo 'no display' >&2; exit 1");
        assert_eq!(
            XIdle::with_program(Some(":7".into()), Some(fail)).idle_s(),
            None
        );
        let junk = script(dir.path(), "junk", "echo twelve");
        assert_eq!(
            XIdle::with_program(Some(":7".into()), Some(junk)).idle_s(),
            None
        );
        assert_eq!(XIdle::with_program(None, None).idle_s(), None);
        let missing = dir.path().join("absent");
        assert_eq!(
            XIdle::with_program(Some(":7".into()), Some(missing)).idle_s(),
            None
        );
    }

    #[test]
    fn x_idle_output_read_even_if_a_grandchild_keeps_the_pipe() {
        let dir = tempfile::tempdir().expect("tempdir");
        let forks = script(dir.path(), "forks", "echo 4000; sleep 3 &");
        let started = Instant::now();
        assert_eq!(
            XIdle::with_program(Some(":0".into()), Some(forks)).idle_s(),
            Some(4)
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn x_idle_program_that_hangs_is_killed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hang = script(dir.path(), "hang", "exec sleep 30");
        let started = Instant::now();
        assert_eq!(
            XIdle::with_program(Some(":0".into()), Some(hang)).idle_s(),
            None
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
