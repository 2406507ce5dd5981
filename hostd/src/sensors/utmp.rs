//! The login sensor: reads utmp (`/run/utmp`) into [`UserSession`]s, and encodes utmp records
//! for test harnesses (the lab writes fake logins with [`encode_record`]).
//!
//! Layout: x86_64 glibc `struct utmp`, 384 bytes, native byte order:
//!
//! | offset | field | type |
//! |---|---|---|
//! | 0 | `ut_type` | i16 (+2 padding) |
//! | 4 | `ut_pid` | i32 |
//! | 8 | `ut_line` | `[u8; 32]`, relative to `/dev` |
//! | 40 | `ut_id` | `[u8; 4]` |
//! | 44 | `ut_user` | `[u8; 32]` |
//! | 76 | `ut_host` | `[u8; 256]` |
//! | 332 | `ut_exit` | 2 × i16 |
//! | 336 | `ut_session` | i32 |
//! | 340 | `ut_tv` | 2 × i32 (sec, usec) |
//! | 348 | `ut_addr_v6` | 4 × i32 |
//! | 364 | unused | `[u8; 20]` |
//!
//! Strings are NUL-padded and need no terminator when they fill their field. Only
//! `USER_PROCESS` records whose pid is alive count (as coreutils `who` does; a zombie counts as
//! dead). A trailing partial record is ignored; a missing or unreadable file means "unknown".

use std::fs;
use std::ops::Range;
use std::path::Path;
use std::time::SystemTime;

use proto::report::UserSession;
use tracing::debug;

use super::{idle, proc};

/// Size of one utmp record.
pub const UTMP_RECORD_SIZE: usize = 384;
/// `ut_type` of a login session.
pub const USER_PROCESS: i16 = 7;
/// `ut_type` of a session that ended.
pub const DEAD_PROCESS: i16 = 8;

const TYPE_AT: usize = 0;
const PID_AT: usize = 4;
const LINE: Range<usize> = 8..40;
const ID: Range<usize> = 40..44;
const USER: Range<usize> = 44..76;
const HOST: Range<usize> = 76..332;
const SESSION_AT: usize = 336;
const TV_SEC_AT: usize = 340;
const TV_USEC_AT: usize = 344;

/// The fields of a utmp record that the sensors use or a harness needs to set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UtmpRecord {
    pub ut_type: i16,
    pub pid: i32,
    /// Terminal relative to `/dev`, e.g. `pts/3` or `tty1`.
    pub line: String,
    /// Short id, e.g. `ts/3` (at most 4 bytes).
    pub id: String,
    pub user: String,
    /// Remote host, empty for local logins.
    pub host: String,
    pub session: i32,
    /// Login time, seconds since the epoch.
    pub tv_sec: i32,
    pub tv_usec: i32,
}

impl UtmpRecord {
    /// A live-looking login record: `USER_PROCESS` for `user` on `line` with process `pid`.
    pub fn login(user: &str, line: &str, pid: i32) -> Self {
        let start = line.len().saturating_sub(4);
        let id = line.get(start..).unwrap_or(line).to_owned();
        Self {
            ut_type: USER_PROCESS,
            pid,
            line: line.to_owned(),
            id,
            user: user.to_owned(),
            ..Self::default()
        }
    }
}

/// Encodes `record` into the 384-byte layout; strings longer than their field are cut.
pub fn encode_record(record: &UtmpRecord) -> [u8; UTMP_RECORD_SIZE] {
    let mut buf = [0u8; UTMP_RECORD_SIZE];
    buf[TYPE_AT..TYPE_AT + 2].copy_from_slice(&record.ut_type.to_ne_bytes());
    put_i32(&mut buf, PID_AT, record.pid);
    put_str(&mut buf, LINE, &record.line);
    put_str(&mut buf, ID, &record.id);
    put_str(&mut buf, USER, &record.user);
    put_str(&mut buf, HOST, &record.host);
    put_i32(&mut buf, SESSION_AT, record.session);
    put_i32(&mut buf, TV_SEC_AT, record.tv_sec);
    put_i32(&mut buf, TV_USEC_AT, record.tv_usec);
    buf
}

/// Decodes one 384-byte record; non-UTF-8 bytes in strings are replaced.
pub fn decode_record(buf: &[u8; UTMP_RECORD_SIZE]) -> UtmpRecord {
    UtmpRecord {
        ut_type: i16::from_ne_bytes([buf[TYPE_AT], buf[TYPE_AT + 1]]),
        pid: get_i32(buf, PID_AT),
        line: get_str(buf, LINE),
        id: get_str(buf, ID),
        user: get_str(buf, USER),
        host: get_str(buf, HOST),
        session: get_i32(buf, SESSION_AT),
        tv_sec: get_i32(buf, TV_SEC_AT),
        tv_usec: get_i32(buf, TV_USEC_AT),
    }
}

/// Decodes every whole record in `data`; a trailing partial record is ignored.
pub fn parse_records(data: &[u8]) -> Vec<UtmpRecord> {
    data.chunks_exact(UTMP_RECORD_SIZE)
        .filter_map(|chunk| <&[u8; UTMP_RECORD_SIZE]>::try_from(chunk).ok())
        .map(decode_record)
        .collect()
}

/// The live login sessions in `utmp_path`: `USER_PROCESS` records with a user name whose pid
/// is alive in `proc_dir`, with tty idle from `dev_dir`. `None` when the file cannot be read.
pub fn read_sessions(
    utmp_path: &Path,
    proc_dir: &Path,
    dev_dir: &Path,
    now: SystemTime,
) -> Option<Vec<UserSession>> {
    let data = match fs::read(utmp_path) {
        Ok(data) => data,
        Err(err) => {
            debug!(path = %utmp_path.display(), error = %err, "utmp unreadable; users unknown");
            return None;
        }
    };
    let partial = data.len() % UTMP_RECORD_SIZE;
    if partial != 0 {
        debug!(path = %utmp_path.display(), bytes = partial, "utmp ends in a partial record; ignored");
    }
    let sessions = parse_records(&data)
        .into_iter()
        .filter(|r| r.ut_type == USER_PROCESS && !r.user.is_empty())
        .filter(|r| proc::pid_alive(proc_dir, r.pid))
        .map(|r| to_session(r, dev_dir, now))
        .collect();
    Some(sessions)
}

fn to_session(record: UtmpRecord, dev_dir: &Path, now: SystemTime) -> UserSession {
    UserSession {
        idle_s: idle::tty_idle(dev_dir, &record.line, now),
        user: record.user,
        tty: record.line,
        from: (!record.host.is_empty()).then_some(record.host),
    }
}

fn put_i32(buf: &mut [u8; UTMP_RECORD_SIZE], at: usize, value: i32) {
    buf[at..at + 4].copy_from_slice(&value.to_ne_bytes());
}

fn get_i32(buf: &[u8; UTMP_RECORD_SIZE], at: usize) -> i32 {
    i32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

fn put_str(buf: &mut [u8; UTMP_RECORD_SIZE], field: Range<usize>, value: &str) {
    let bytes = value.as_bytes();
    let n = bytes.len().min(field.len());
    buf[field.start..field.start + n].copy_from_slice(&bytes[..n]);
}

fn get_str(buf: &[u8; UTMP_RECORD_SIZE], field: Range<usize>) -> String {
    let raw = &buf[field];
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use std::fs::{File, FileTimes};
    use std::time::Duration;

    use super::*;

    #[test]
    fn record_round_trips_through_the_layout() {
        let rec = UtmpRecord {
            host: "10.77.0.2".into(),
            session: 99,
            tv_sec: 1_700_000_000,
            tv_usec: 5,
            ..UtmpRecord::login("alice", "pts/3", 4242)
        };
        assert_eq!(rec.id, "ts/3");
        let buf = encode_record(&rec);
        assert_eq!(i16::from_ne_bytes([buf[0], buf[1]]), USER_PROCESS);
        assert_eq!(&buf[8..13], b"pts/3");
        assert_eq!(&buf[44..49], b"alice");
        assert_eq!(&buf[76..85], b"10.77.0.2");
        assert_eq!(decode_record(&buf), rec);
    }

    #[test]
    fn full_width_strings_need_no_terminator_and_long_ones_are_cut() {
        let user = "u".repeat(40);
        let buf = encode_record(&UtmpRecord::login(&user, "tty1", 1));
        assert_eq!(decode_record(&buf).user, "u".repeat(32));
        assert_eq!(
            decode_record(&buf).line,
            "tty1",
            "user did not spill into ut_host"
        );
    }

    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        /// A fake proc with live pid 100, zombie 101; a dev dir with pts/3 idle 120 s.
        fn new() -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            let proc_dir = dir.path().join("proc");
            for (pid, state) in [("100", 'S'), ("101", 'Z')] {
                fs::create_dir_all(proc_dir.join(pid)).expect("mkdir");
                fs::write(
                    proc_dir.join(pid).join("stat"),
                    format!("{pid} (sh) {state} 1"),
                )
                .expect("stat");
            }
            fs::create_dir_all(dir.path().join("dev/pts")).expect("mkdir");
            let tty = dir.path().join("dev/pts/3");
            fs::write(&tty, "").expect("touch");
            let atime = SystemTime::now() - Duration::from_secs(120);
            let times = FileTimes::new().set_accessed(atime);
            File::options()
                .write(true)
                .open(&tty)
                .expect("open")
                .set_times(times)
                .expect("times");
            Self { dir }
        }

        fn write_utmp(&self, records: &[UtmpRecord], extra: &[u8]) {
            let mut data: Vec<u8> = records.iter().flat_map(encode_record).collect();
            data.extend_from_slice(extra);
            fs::write(self.utmp(), data).expect("utmp");
        }

        fn utmp(&self) -> std::path::PathBuf {
            self.dir.path().join("utmp")
        }

        fn sessions(&self) -> Option<Vec<UserSession>> {
            let (proc_dir, dev) = (self.dir.path().join("proc"), self.dir.path().join("dev"));
            read_sessions(&self.utmp(), &proc_dir, &dev, SystemTime::now())
        }
    }

    #[test]
    fn live_user_processes_only_with_tty_idle_and_origin() {
        let fx = Fixture::new();
        let boot = UtmpRecord {
            ut_type: 2,
            ..UtmpRecord::default()
        };
        let remote = UtmpRecord {
            host: "node02".into(),
            ..UtmpRecord::login("alice", "pts/3", 100)
        };
        let no_tty = UtmpRecord::login("bob", "pts/9", 100);
        let stale = UtmpRecord::login("carol", "pts/3", 4_000_000);
        let zombie = UtmpRecord::login("dave", "pts/3", 101);
        let dead = UtmpRecord {
            ut_type: DEAD_PROCESS,
            ..UtmpRecord::login("erin", "pts/3", 100)
        };
        fx.write_utmp(&[boot, remote, no_tty, stale, zombie, dead], &[]);
        let sessions = fx.sessions().expect("utmp readable");
        assert_eq!(sessions.len(), 2, "{sessions:?}");
        assert_eq!(
            (sessions[0].user.as_str(), sessions[0].tty.as_str()),
            ("alice", "pts/3")
        );
        assert_eq!(sessions[0].from.as_deref(), Some("node02"));
        let idle = sessions[0].idle_s.expect("tty stat'ed");
        assert!((120..=122).contains(&idle), "got {idle}");
        assert_eq!(sessions[1].user, "bob");
        assert_eq!(sessions[1].idle_s, None, "missing tty means unknown idle");
        assert_eq!(sessions[1].from, None);
    }

    #[test]
    fn truncated_file_keeps_whole_records() {
        let fx = Fixture::new();
        let whole = encode_record(&UtmpRecord::login("zoe", "pts/3", 100));
        fx.write_utmp(&[UtmpRecord::login("alice", "pts/3", 100)], &whole[..200]);
        let sessions = fx.sessions().expect("readable");
        assert_eq!(sessions.len(), 1);
        assert_eq!(sessions[0].user, "alice");
        fx.write_utmp(&[], &whole[..10]);
        assert_eq!(fx.sessions(), Some(vec![]));
    }

    #[test]
    fn garbage_never_panics_and_missing_file_is_unknown() {
        let fx = Fixture::new();
        let garbage: Vec<u8> = (0..UTMP_RECORD_SIZE * 3 + 7)
            .map(|i| (i * 37 % 251) as u8)
            .collect();
        fs::write(fx.utmp(), &garbage).expect("write");
        assert!(fx.sessions().is_some());
        fs::remove_file(fx.utmp()).expect("rm");
        assert_eq!(fx.sessions(), None);
    }
}
