//! Fake logins: utmp records in a host's private `/run/utmp`, for testing sensors that look
//! at who is logged in and how long their keyboard has been idle.
//!
//! `who -u` shows a USER_PROCESS record when its pid is alive (so a placeholder process
//! runs in the host under that pid) and computes idle time as now − atime of
//! `/dev/<ut_line>`. `/dev` is the machine's, so the line is `shm/rbtty-<tty>`: the host has
//! a private tmpfs on `/dev/shm`. The harness reaches the host's files through
//! `/proc/<host PID 1>/root`, which resolves paths in the host's mount namespace.
//!
//! Records use the x86_64 glibc `struct utmp` layout (384 bytes) and are written under an
//! fcntl write lock, like glibc's `pututline`.

use std::fs::{File, FileTimes, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::fcntl::{fcntl, FcntlArg};

use crate::{Lab, LabError};

/// Size of one utmp record.
const RECORD: usize = 384;
/// `ut_type` of a login.
const USER_PROCESS: i16 = 7;
/// `ut_type` of an ended login.
const DEAD_PROCESS: i16 = 8;

/// One utmp record, the fields the lab sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub kind: i16,
    pub pid: i32,
    pub line: String,
    pub id: [u8; 4],
    pub user: String,
    pub time: SystemTime,
}

impl Record {
    /// The 384-byte glibc encoding.
    pub fn encode(&self) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        b[0..2].copy_from_slice(&self.kind.to_ne_bytes());
        b[4..8].copy_from_slice(&self.pid.to_ne_bytes());
        put(&mut b[8..40], &self.line); // ut_line[32]
        b[40..44].copy_from_slice(&self.id); // ut_id[4]
        put(&mut b[44..76], &self.user); // ut_user[32]; ut_host[256] at 76 stays empty
        let t = self.time.duration_since(UNIX_EPOCH).unwrap_or_default();
        // ut_session at 336; ut_tv (two int32) at 340.
        b[340..344].copy_from_slice(&(t.as_secs() as i32).to_ne_bytes());
        b[344..348].copy_from_slice(&(t.subsec_micros() as i32).to_ne_bytes());
        b
    }
}

fn put(field: &mut [u8], s: &str) {
    let n = s.len().min(field.len());
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Writes `rec` into the utmp file at `path`: over the record with the same `ut_id`, or
/// appended.
pub(crate) fn write_record(path: &Path, rec: &Record) -> Result<(), LabError> {
    let help = "is the host running? its /run/utmp is hosts/<name>/run/utmp in the lab dir";
    let io = |action| LabError::io(action, path, help);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io("open"))?;
    let lock = libc::flock {
        l_type: libc::F_WRLCK as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    fcntl(f.as_raw_fd(), FcntlArg::F_SETLKW(&lock)).map_err(|e| io("lock")(e.into()))?;
    let mut all = Vec::new();
    f.read_to_end(&mut all).map_err(io("read"))?;
    let slot = all
        .chunks_exact(RECORD)
        .position(|r| r[40..44] == rec.id)
        .unwrap_or(all.len() / RECORD);
    f.seek(SeekFrom::Start((slot * RECORD) as u64))
        .map_err(io("seek"))?;
    f.write_all(&rec.encode()).map_err(io("write"))
    // The lock goes with the file.
}

/// A login recorded in a host's utmp, with its tty file and placeholder process.
/// Dropping it ends the login (like [`FakeLogin::end`], errors ignored).
#[derive(Debug)]
pub struct FakeLogin {
    host: String,
    utmp: PathBuf,
    tty: PathBuf,
    record: Record,
    placeholder: Option<Child>,
}

impl FakeLogin {
    /// See [`Lab::fake_login`].
    pub(crate) fn start(
        lab: &Lab,
        host: &str,
        user: &str,
        tty: &str,
        idle: Duration,
    ) -> Result<FakeLogin, LabError> {
        let ok_tty = !tty.is_empty()
            && tty.len() <= 20
            && tty
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok_tty || user.is_empty() || user.len() > 32 {
            return Err(LabError::InvalidInput {
                reason: format!("fake login user {user:?} tty {tty:?}"),
                help: "tty: 1-20 of [A-Za-z0-9_-]; user: 1-32 bytes".into(),
            });
        }
        let root = PathBuf::from(format!("/proc/{}/root", lab.running_init(host)?.pid));
        let line = format!("shm/rbtty-{tty}");
        let tty_path = root.join("dev").join(&line);
        let (placeholder, pid) = placeholder(lab, host)?;
        let login = FakeLogin {
            host: host.into(),
            utmp: root.join("run/utmp"),
            tty: tty_path,
            record: Record {
                kind: USER_PROCESS,
                pid,
                id: ut_id(tty),
                line,
                user: user.into(),
                time: SystemTime::now(),
            },
            placeholder: Some(placeholder),
        };
        File::create(&login.tty).map_err(LabError::io(
            "create tty file",
            &login.tty,
            "is the host running?",
        ))?;
        login.set_idle(idle)?;
        write_record(&login.utmp, &login.record)?;
        Ok(login)
    }

    /// The pid of the placeholder process, as seen inside the host (the record's `ut_pid`).
    pub fn pid(&self) -> i32 {
        self.record.pid
    }

    /// The utmp line, relative to /dev (`shm/rbtty-<tty>`).
    pub fn line(&self) -> &str {
        &self.record.line
    }

    /// The host the login is on.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Sets the keyboard idle time (atime of the tty file = now − `idle`).
    pub fn set_idle(&self, idle: Duration) -> Result<(), LabError> {
        let when = SystemTime::now().checked_sub(idle).unwrap_or(UNIX_EPOCH);
        let f = OpenOptions::new()
            .write(true)
            .open(&self.tty)
            .map_err(LabError::io(
                "open tty file",
                &self.tty,
                "is the host still running?",
            ))?;
        f.set_times(FileTimes::new().set_accessed(when).set_modified(when))
            .map_err(LabError::io(
                "set times of",
                &self.tty,
                "is the host still running?",
            ))
    }

    /// "The keyboard was just used": idle time becomes zero.
    pub fn touch(&self) -> Result<(), LabError> {
        self.set_idle(Duration::ZERO)
    }

    /// Ends the login: DEAD_PROCESS record, placeholder killed, tty file removed.
    pub fn end(mut self) -> Result<(), LabError> {
        self.finish()
    }

    fn finish(&mut self) -> Result<(), LabError> {
        let Some(mut child) = self.placeholder.take() else {
            return Ok(());
        };
        let _ = crate::ops::kill_inside(&mut child);
        let dead = Record {
            kind: DEAD_PROCESS,
            user: String::new(),
            time: SystemTime::now(),
            ..self.record.clone()
        };
        let result = write_record(&self.utmp, &dead);
        let _ = std::fs::remove_file(&self.tty);
        result
    }
}

impl Drop for FakeLogin {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Starts `sleep infinity` in the host; returns it and its pid inside the host.
fn placeholder(lab: &Lab, host: &str) -> Result<(Child, i32), LabError> {
    let argv = ["sh", "-c", "echo $$; exec sleep infinity"];
    let mut c = lab.command(host, &argv, false)?;
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|source| LabError::Spawn {
            command: crate::cmd::describe(&c),
            source,
            help: "is util-linux (nsenter) installed?".into(),
        })?;
    let mut first = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut first);
    }
    match first.trim().parse::<i32>() {
        Ok(pid) => Ok((child, pid)),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(LabError::HostDown { host: host.into() })
        }
    }
}

/// The record's `ut_id`: the last four bytes of the tty name (as login(1) does).
fn ut_id(tty: &str) -> [u8; 4] {
    let b = tty.as_bytes();
    let tail = &b[b.len().saturating_sub(4)..];
    let mut id = [0u8; 4];
    id[..tail.len()].copy_from_slice(tail);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: i16, id: &str) -> Record {
        Record {
            kind,
            pid: 77,
            line: format!("shm/rbtty-{id}"),
            id: ut_id(id),
            user: "alice".into(),
            time: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        }
    }

    #[test]
    fn encodes_the_glibc_layout() {
        let b = record(USER_PROCESS, "a1").encode();
        assert_eq!(b.len(), 384);
        assert_eq!(i16::from_ne_bytes([b[0], b[1]]), 7);
        assert_eq!(i32::from_ne_bytes([b[4], b[5], b[6], b[7]]), 77);
        assert_eq!(&b[8..20], b"shm/rbtty-a1");
        assert_eq!(&b[40..44], b"a1\0\0");
        assert_eq!(&b[44..49], b"alice");
        assert_eq!(
            i32::from_ne_bytes([b[340], b[341], b[342], b[343]]),
            1_700_000_000
        );
    }

    #[test]
    fn replaces_the_record_with_the_same_id() {
        let path = std::env::temp_dir().join(format!("rb-lab-utmp-test-{}", std::process::id()));
        std::fs::write(&path, b"").expect("create");
        write_record(&path, &record(USER_PROCESS, "a1")).expect("first");
        write_record(&path, &record(USER_PROCESS, "b2")).expect("second");
        write_record(&path, &record(DEAD_PROCESS, "a1")).expect("end first");
        let all = std::fs::read(&path).expect("read");
        std::fs::remove_file(&path).expect("cleanup");
        assert_eq!(all.len(), 2 * RECORD);
        assert_eq!(i16::from_ne_bytes([all[0], all[1]]), DEAD_PROCESS);
        assert_eq!(&all[RECORD + 40..RECORD + 42], b"b2");
    }

    #[test]
    fn utmpdump_reads_our_records() {
        if !Path::new("/usr/bin/utmpdump").exists() {
            return;
        }
        let path = std::env::temp_dir().join(format!("rb-lab-utmpdump-{}", std::process::id()));
        std::fs::write(&path, record(USER_PROCESS, "x9").encode()).expect("write");
        let out = std::process::Command::new("utmpdump")
            .arg(&path)
            .output()
            .expect("utmpdump");
        std::fs::remove_file(&path).expect("cleanup");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("[7] [00077] [x9  ] [alice   ] [shm/rbtty-x9"),
            "{text}"
        );
    }
}
