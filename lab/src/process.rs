//! Processes the lab starts, identified safely, and polling with deadlines.
//!
//! A pid alone is not an identity: pids are reused. Every process the lab records is kept as
//! a [`ProcRef`] (pid + start time from `/proc/<pid>/stat`), and signals are only sent after
//! the start time was checked again, so the lab never signals a process it did not start.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::LabError;

/// A process started by the lab: its pid and its start time (clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRef {
    /// The pid in the root PID namespace.
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`.
    pub start: u64,
}

impl ProcRef {
    /// The running process `pid`, if it exists.
    pub fn of(pid: u32) -> Option<ProcRef> {
        stat(pid).map(|s| ProcRef {
            pid,
            start: s.start,
        })
    }

    /// This process.
    pub fn current() -> Option<ProcRef> {
        ProcRef::of(std::process::id())
    }

    /// Whether this very process is still alive (same start time, not a zombie).
    pub fn is_alive(&self) -> bool {
        stat(self.pid).is_some_and(|s| s.start == self.start && !matches!(s.state, 'Z' | 'X'))
    }

    /// Whether the pid still names this process (alive or zombie).
    fn exists(&self) -> bool {
        stat(self.pid).is_some_and(|s| s.start == self.start)
    }

    /// Sends `signal` if the pid still names this process; `Ok(false)` if it is gone.
    pub fn signal(&self, signal: Signal) -> Result<bool, LabError> {
        if !self.exists() {
            return Ok(false);
        }
        match kill(Pid::from_raw(self.pid as i32), signal) {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::ESRCH) => Ok(false),
            Err(e) => Err(LabError::Io {
                action: "send signal to pid",
                path: format!("/proc/{}", self.pid).into(),
                source: e.into(),
                help: "the lab can only signal processes it started".into(),
            }),
        }
    }

    /// Waits until the process is dead (gone or a zombie).
    pub fn wait_dead(&self, limit: Duration) -> Result<(), LabError> {
        poll(limit, &format!("pid {} to exit", self.pid), "", || {
            Ok(!self.is_alive())
        })
    }
}

/// The fields of `/proc/<pid>/stat` the lab needs.
struct Stat {
    state: char,
    ppid: u32,
    start: u64,
}

/// Parses `/proc/<pid>/stat`; `None` when the process does not exist.
fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses the text of a stat file. The command name may contain spaces and parentheses,
/// so fields are counted after the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); field N is fields[N - 3].
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// The children of `pid` (from `/proc/<pid>/task/*/children`, or a scan of `/proc`).
pub fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut have_children_files = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                have_children_files = true;
                found.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    if !have_children_files {
        found = scan_children(pid);
    }
    found
}

/// Finds the children of `pid` by reading every `/proc/<n>/stat`.
fn scan_children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&n| stat(n).is_some_and(|s| s.ppid == pid))
        .collect()
}

/// Polls `check` until it returns `Ok(true)`, with a short growing interval, for at most
/// `limit`. This is the lab's only way to wait for a condition: no fixed sleeps.
pub fn poll(
    limit: Duration,
    what: &str,
    help: &str,
    mut check: impl FnMut() -> Result<bool, LabError>,
) -> Result<(), LabError> {
    let start = Instant::now();
    let mut interval = Duration::from_millis(1);
    loop {
        if check()? {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= limit {
            return Err(LabError::Timeout {
                what: what.to_string(),
                waited,
                help: if help.is_empty() {
                    "see the host's console.log and sshd.log in the lab directory".to_string()
                } else {
                    help.to_string()
                },
            });
        }
        std::thread::sleep(interval.min(limit - waited));
        interval = (interval * 2).min(Duration::from_millis(25));
    }
}

/// Whether something in the network namespace of `pid` listens on TCP `port`
/// (reads `/proc/<pid>/net/tcp`, which shows that process's network namespace).
pub fn listens_on(pid: u32, port: u16) -> bool {
    let path = Path::new("/proc").join(pid.to_string()).join("net/tcp");
    std::fs::read_to_string(path).is_ok_and(|text| tcp_table_listens(&text, port))
}

/// Whether a `/proc/net/tcp` table has a socket in state LISTEN (0A) on `port`.
fn tcp_table_listens(text: &str, port: u16) -> bool {
    let want = format!(":{port:04X}");
    text.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let text = "42 (a) b (c) S 7 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 0 0";
        let s = parse_stat(text).expect("valid stat");
        assert_eq!((s.state, s.ppid, s.start), ('S', 7, 123456));
    }

    #[test]
    fn current_process_is_alive_and_a_fake_start_is_not() {
        let me = ProcRef::current().expect("own stat");
        assert!(me.is_alive());
        let other = ProcRef {
            start: me.start + 1,
            ..me
        };
        assert!(!other.is_alive());
        assert!(!other.signal(Signal::SIGTERM).expect("no error"));
    }

    #[test]
    fn finds_listening_sockets() {
        let table = "  sl  local_address rem_address   st\n   0: 00000000:0016 00000000:0000 0A 0\n   1: 0100007F:0202 00000000:0000 01 0\n";
        assert!(tcp_table_listens(table, 22));
        assert!(!tcp_table_listens(table, 514));
    }

    #[test]
    fn poll_times_out_with_the_condition_named() {
        let err = poll(Duration::from_millis(5), "godot", "wait less", || Ok(false))
            .expect_err("never true");
        assert!(err.to_string().contains("godot"));
    }

    #[test]
    fn children_of_this_process_include_a_spawned_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("spawn sleep");
        assert!(children(std::process::id()).contains(&child.id()));
        child.kill().expect("kill");
        child.wait().expect("wait");
    }
}
