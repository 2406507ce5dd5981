//! Idleness sensors: how long since the last keyboard/mouse input.
//!
//! - **tty idle** of a login session: now − atime of `<dev_dir>/<ut_line>` (what `who -u` and
//!   `w` show; the kernel updates a tty's atime on input, with 8-second granularity).
//! - **console idle**: the minimum over the input-device files matching
//!   [`SensorConfig::input_devices`](super::SensorConfig::input_devices), each idle since
//!   max(atime, mtime). A file that cannot be read is left out; with none at all the answer
//!   is `None` (unknown), never "idle".
//!
//! There is no X source: the daemon runs as the broker's user, started over the transport
//! without a display, and every display manager starts its X server with an authority file
//! only the owner can read, so asking the X server (`xprintidle`) needs the owner's cookie;
//! Wayland desktops have no X server's idle counter at all. Desktops say their idle time to
//! logind ([`super::logind`]), which any user may read.
//!
//! Cost control for the 250 ms activity poll: glob patterns are re-expanded at most every
//! [`DEVICE_RESCAN`].

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use super::glob;

/// How often input-device glob patterns are re-expanded (device hot-plug).
pub const DEVICE_RESCAN: Duration = Duration::from_secs(10);

/// Whole seconds from `then` to `now`; 0 when `then` lies in the future.
pub fn seconds_since(now: SystemTime, then: SystemTime) -> u64 {
    now.duration_since(then).map_or(0, |d| d.as_secs())
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

#[cfg(test)]
mod tests {
    use std::fs::{File, FileTimes};

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
}
