//! [`Store`]: the broker's durable state in one SQLite file (WAL, `synchronous=NORMAL`).
//!
//! The file holds exactly one [`Snapshot`]; [`Store::save`] writes it in one transaction and
//! [`Store::load`] reads it back. A save writes only the rows that differ from the snapshot
//! this store last wrote (the first save of an opened store, or the one after a failed save,
//! rewrites every table): a grant changes one allocation row and a counter, not every row of
//! a lab where a job holds thousands of hosts. The schema is versioned in
//! `schema_version`; the `MIGRATIONS` list takes a file from any older version (0 = empty file) to
//! the current one, and a file from a newer broker is refused rather than misread.
//!
//! The store is written after decisions, never consulted by them (see `DESIGN.md`, State).

use std::{
    collections::{HashMap, HashSet},
    hash::Hash,
    path::{Path, PathBuf},
    time::Duration,
};

use rusqlite::{params, Connection, ErrorCode, OptionalExtension, Transaction};

use super::{AllocRecord, JobInfo, JobRecord, JobState, ReleasingRecord, RequestRecord, Snapshot};

/// Migration `i` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 0 → 1: the first schema.
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
     CREATE TABLE jobs (
         id INTEGER PRIMARY KEY, user TEXT NOT NULL, cwd TEXT NOT NULL,
         argv TEXT NOT NULL, spec TEXT, adaptive INTEGER NOT NULL, state TEXT NOT NULL);
     CREATE TABLE allocations (
         id INTEGER PRIMARY KEY, job INTEGER NOT NULL, host TEXT NOT NULL,
         address TEXT NOT NULL, request INTEGER,
         releasing INTEGER NOT NULL, grace_ms INTEGER, for_request INTEGER);
     CREATE TABLE requests (
         position INTEGER PRIMARY KEY, id INTEGER NOT NULL, job INTEGER NOT NULL,
         symbolic TEXT NOT NULL);
     CREATE TABLE drained (host TEXT PRIMARY KEY);",
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

const HELP_IO: &str = "help: check free space and permissions in the state dir, and that no \
                       other rb-broker uses the same state dir";

/// Errors of the store; each names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the broker database {}: {source}\nhelp: check that the state dir exists and is writable by you", path.display())]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("the broker database {} is corrupt or not a database ({detail})\nhelp: move it aside (mv {} {}.bad, and its -wal and -shm files); the broker then starts empty", path.display(), path.display(), path.display())]
    Corrupt { path: PathBuf, detail: String },
    #[error("the broker database {} has schema version {found}, newer than this broker knows ({known})\nhelp: run the newer rb-broker, or move the file aside; the broker then starts empty", path.display())]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("cannot {op} the broker database {}: {source}\n{HELP_IO}", path.display())]
    Sql {
        path: PathBuf,
        op: &'static str,
        source: rusqlite::Error,
    },
}

/// The broker's database file.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    conn: Connection,
    /// What the file holds, as this store last wrote it (`None`: not known, the next save
    /// rewrites every table).
    written: Option<Snapshot>,
}

impl Store {
    /// Opens (creating if missing) and migrates the database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let conn = Connection::open(path).map_err(|source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let mut store = Store {
            path: path.to_path_buf(),
            conn,
            written: None,
        };
        store.configure()?;
        store.migrate()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn configure(&self) -> Result<(), StoreError> {
        let err = |e| self.error("open", e);
        self.conn
            .busy_timeout(Duration::from_secs(5))
            .map_err(err)?;
        let mode: String = self
            .conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(self.corrupt(format!("journal mode stays {mode}, not wal")));
        }
        self.conn
            .execute_batch("PRAGMA synchronous=NORMAL;")
            .map_err(err)
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        let found = self.version()?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path: self.path.clone(),
                found,
                known: SCHEMA_VERSION,
            });
        }
        let path = self.path.clone();
        let err = |e| classify(&path, "migrate", e);
        let tx = self.conn.transaction().map_err(err)?;
        for (from, sql) in MIGRATIONS.iter().enumerate().skip(found.max(0) as usize) {
            tx.execute_batch(sql).map_err(err)?;
            tx.execute("DELETE FROM schema_version", []).map_err(err)?;
            let to = from as i64 + 1;
            tx.execute("INSERT INTO schema_version (version) VALUES (?1)", [to])
                .map_err(err)?;
        }
        tx.commit().map_err(err)
    }

    /// The schema version in the file; 0 for a new file.
    fn version(&self) -> Result<i64, StoreError> {
        let err = |e| self.error("read", e);
        self.conn
            .execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);")
            .map_err(err)?;
        let v: Option<i64> = self
            .conn
            .query_row("SELECT MAX(version) FROM schema_version", [], |r| r.get(0))
            .map_err(err)?;
        Ok(v.unwrap_or(0))
    }

    /// Replaces the stored state with `s`, in one transaction: the rows that differ from
    /// the last snapshot saved, or every row when that is not known. The store keeps `s`
    /// (what the file holds) for the next save to compare with.
    pub fn save(&mut self, s: Snapshot) -> Result<(), StoreError> {
        let path = self.path.clone();
        let err = |e| classify(&path, "write", e);
        // Unknown until this save commits: a failed one leaves the next to rewrite it all.
        let written = self.written.take();
        let tx = self.conn.transaction().map_err(err)?;
        match &written {
            Some(old) => write_changes(&tx, old, &s),
            None => tx
                .execute_batch(
                    "DELETE FROM counters; DELETE FROM jobs; DELETE FROM allocations;
                     DELETE FROM requests; DELETE FROM drained;",
                )
                .and_then(|()| write_rows(&tx, &s)),
        }
        .map_err(err)?;
        tx.commit().map_err(err)?;
        self.written = Some(s);
        Ok(())
    }

    /// The stored state; `None` when nothing was ever saved.
    pub fn load(&self) -> Result<Option<Snapshot>, StoreError> {
        let err = |e| self.error("read", e);
        let counter = |name: &str| {
            self.conn
                .query_row("SELECT value FROM counters WHERE name = ?1", [name], |r| {
                    r.get::<_, i64>(0)
                })
                .optional()
        };
        let Some(next_job) = counter("next_job").map_err(err)? else {
            return Ok(None);
        };
        let next_alloc = counter("next_alloc").map_err(err)?.unwrap_or(1);
        let next_request = counter("next_request").map_err(err)?.unwrap_or(1);
        Ok(Some(Snapshot {
            next_job: next_job as u64,
            next_alloc: next_alloc as u64,
            next_request: next_request as u64,
            jobs: self.read_jobs()?,
            allocations: self.read_allocations().map_err(err)?,
            requests: self.read_requests().map_err(err)?,
            drained: self.read_drained().map_err(err)?,
        }))
    }

    fn read_jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        let err = |e| self.error("read", e);
        let mut stmt = self
            .conn
            .prepare("SELECT id, user, cwd, argv, spec, adaptive, state FROM jobs ORDER BY id")
            .map_err(err)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, bool>(5)?,
                    r.get::<_, String>(6)?,
                ))
            })
            .map_err(err)?;
        let mut jobs = Vec::new();
        for row in rows {
            let (id, user, cwd, argv, spec, adaptive, state) = row.map_err(err)?;
            let bad = |what: &str| self.corrupt(format!("job {id}: bad {what}"));
            let argv = serde_json::from_str(&argv).map_err(|_| bad("argv"))?;
            let spec = match spec {
                Some(s) => Some(serde_json::from_str(&s).map_err(|_| bad("spec"))?),
                None => None,
            };
            let state = match state.as_str() {
                "running" => JobState::Running,
                "ended" => JobState::Ended,
                _ => return Err(bad("state")),
            };
            let info = JobInfo {
                user,
                cwd,
                argv,
                spec,
                adaptive,
            };
            let id = id as u64;
            jobs.push(JobRecord { id, info, state });
        }
        Ok(jobs)
    }

    fn read_allocations(&self) -> rusqlite::Result<Vec<AllocRecord>> {
        let mut stmt = self.conn.prepare(
            "SELECT id, job, host, address, request, releasing, grace_ms, for_request
             FROM allocations ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| {
            let releasing = r.get::<_, bool>(5)?.then_some(ReleasingRecord {
                grace: Duration::from_millis(r.get::<_, Option<i64>>(6)?.unwrap_or(0) as u64),
                for_request: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
            });
            Ok(AllocRecord {
                id: r.get::<_, i64>(0)? as u64,
                job: r.get::<_, i64>(1)? as u64,
                host: r.get(2)?,
                address: r.get(3)?,
                request: r.get::<_, Option<i64>>(4)?.map(|v| v as u64),
                releasing,
            })
        })?;
        rows.collect()
    }

    fn read_requests(&self) -> rusqlite::Result<Vec<RequestRecord>> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, job, symbolic FROM requests ORDER BY position")?;
        let rows = stmt.query_map([], |r| {
            Ok(RequestRecord {
                id: r.get::<_, i64>(0)? as u64,
                job: r.get::<_, i64>(1)? as u64,
                symbolic: r.get(2)?,
            })
        })?;
        rows.collect()
    }

    fn read_drained(&self) -> rusqlite::Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare("SELECT host FROM drained ORDER BY host")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect()
    }

    fn error(&self, op: &'static str, e: rusqlite::Error) -> StoreError {
        classify(&self.path, op, e)
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            detail,
        }
    }
}

/// Writes every row of `s` (the tables are empty).
fn write_rows(tx: &Transaction<'_>, s: &Snapshot) -> rusqlite::Result<()> {
    write_counters(tx, s)?;
    let mut job = tx.prepare(INSERT_JOB)?;
    for j in &s.jobs {
        insert_job(&mut job, j)?;
    }
    let mut alloc = tx.prepare(INSERT_ALLOC)?;
    for a in &s.allocations {
        insert_alloc(&mut alloc, a)?;
    }
    write_requests(tx, s)?;
    write_drained(tx, s)
}

/// Writes what differs between `old` (what the file holds) and `new`: jobs and allocations
/// row by row (by id); the counters, the queue and the drained hosts whole, when they
/// changed.
fn write_changes(tx: &Transaction<'_>, old: &Snapshot, new: &Snapshot) -> rusqlite::Result<()> {
    let counters = |s: &Snapshot| (s.next_job, s.next_alloc, s.next_request);
    if counters(old) != counters(new) {
        write_counters(tx, new)?;
    }
    let job_rows = Rows {
        table: "jobs",
        insert: INSERT_JOB,
    };
    job_rows.write_changes(tx, &old.jobs, &new.jobs, |j| j.id, insert_job)?;
    let alloc_rows = Rows {
        table: "allocations",
        insert: INSERT_ALLOC,
    };
    alloc_rows.write_changes(
        tx,
        &old.allocations,
        &new.allocations,
        |a| a.id,
        insert_alloc,
    )?;
    if old.requests != new.requests {
        tx.execute("DELETE FROM requests", [])?;
        write_requests(tx, new)?;
    }
    if old.drained != new.drained {
        tx.execute("DELETE FROM drained", [])?;
        write_drained(tx, new)?;
    }
    Ok(())
}

/// A table of records keyed by an integer `id`, and its statement that inserts or replaces
/// one.
struct Rows {
    table: &'static str,
    insert: &'static str,
}

impl Rows {
    /// Deletes the rows of the records `new` no longer has and inserts (or replaces) those
    /// it holds otherwise than `old` (`insert` binds one record to the statement).
    fn write_changes<T: PartialEq>(
        &self,
        tx: &Transaction<'_>,
        old: &[T],
        new: &[T],
        id: impl Fn(&T) -> u64,
        insert: impl Fn(&mut rusqlite::Statement<'_>, &T) -> rusqlite::Result<()>,
    ) -> rusqlite::Result<()> {
        let (upserts, gone) = changed_rows(old, new, id);
        let mut delete = tx.prepare(&format!("DELETE FROM {} WHERE id = ?1", self.table))?;
        for id in gone {
            delete.execute([id as i64])?;
        }
        let mut statement = tx.prepare(self.insert)?;
        for record in upserts {
            insert(&mut statement, record)?;
        }
        Ok(())
    }
}

/// The records of `new` that `old` does not hold as they are (new or changed), and the keys
/// of those of `old` that `new` no longer has.
fn changed_rows<'a, T: PartialEq, K: Copy + Eq + Hash>(
    old: &[T],
    new: &'a [T],
    key: impl Fn(&T) -> K,
) -> (Vec<&'a T>, Vec<K>) {
    let before: HashMap<K, &T> = old.iter().map(|r| (key(r), r)).collect();
    let now: HashSet<K> = new.iter().map(&key).collect();
    let upserts = new
        .iter()
        .filter(|r| before.get(&key(r)) != Some(r))
        .collect();
    let gone = before.into_keys().filter(|k| !now.contains(k)).collect();
    (upserts, gone)
}

fn write_counters(tx: &Transaction<'_>, s: &Snapshot) -> rusqlite::Result<()> {
    let mut counter =
        tx.prepare("INSERT OR REPLACE INTO counters (name, value) VALUES (?1, ?2)")?;
    counter.execute(params!["next_job", s.next_job as i64])?;
    counter.execute(params!["next_alloc", s.next_alloc as i64])?;
    counter.execute(params!["next_request", s.next_request as i64])?;
    Ok(())
}

const INSERT_JOB: &str = "INSERT OR REPLACE INTO jobs (id, user, cwd, argv, spec, adaptive, state)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

fn insert_job(stmt: &mut rusqlite::Statement<'_>, j: &JobRecord) -> rusqlite::Result<()> {
    let argv = serde_json::Value::from(j.info.argv.clone()).to_string();
    let spec = j.info.spec.as_ref().map(|v| v.to_string());
    let i = &j.info;
    let state = j.state.as_str();
    stmt.execute(params![
        j.id as i64,
        i.user,
        i.cwd,
        argv,
        spec,
        i.adaptive,
        state
    ])?;
    Ok(())
}

const INSERT_ALLOC: &str = "INSERT OR REPLACE INTO allocations
     (id, job, host, address, request, releasing, grace_ms, for_request)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

fn insert_alloc(stmt: &mut rusqlite::Statement<'_>, a: &AllocRecord) -> rusqlite::Result<()> {
    let rel = a.releasing.as_ref();
    stmt.execute(params![
        a.id as i64,
        a.job as i64,
        a.host,
        a.address,
        a.request.map(|r| r as i64),
        rel.is_some(),
        rel.map(|r| r.grace.as_millis().min(i64::MAX as u128) as i64),
        rel.and_then(|r| r.for_request).map(|r| r as i64),
    ])?;
    Ok(())
}

fn write_requests(tx: &Transaction<'_>, s: &Snapshot) -> rusqlite::Result<()> {
    let mut req =
        tx.prepare("INSERT INTO requests (position, id, job, symbolic) VALUES (?1, ?2, ?3, ?4)")?;
    for (pos, r) in s.requests.iter().enumerate() {
        req.execute(params![pos as i64, r.id as i64, r.job as i64, r.symbolic])?;
    }
    Ok(())
}

fn write_drained(tx: &Transaction<'_>, s: &Snapshot) -> rusqlite::Result<()> {
    let mut drained = tx.prepare("INSERT INTO drained (host) VALUES (?1)")?;
    for h in &s.drained {
        drained.execute([h])?;
    }
    Ok(())
}

/// Corruption-type SQLite failures become [`StoreError::Corrupt`]; the rest name the step.
fn classify(path: &Path, op: &'static str, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: e.to_string(),
        },
        _ => StoreError::Sql {
            path: path.to_path_buf(),
            op,
            source: e,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// Moved here with the store when the allocation core became its own crate.
    #[test]
    fn store_round_trip_of_a_live_allocator() {
        use crate::alloc::{Allocator, HostView};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broker.db");
        let now = Instant::now();
        let mut a = Allocator::new();
        let view = HostView {
            name: "n1".into(),
            address: "10.0.0.1".into(),
            up: true,
            reported: true,
            labels: vec!["linux".into()].into(),
            os: Some("Linux".into()),
            owner: None,
            load1: Some(0.0),
            load5: None,
            load15: None,
            mem_avail_mb: None,
            cpus: Some(4),
            users: Some(vec![]),
            console_idle_s: None,
            logind: None,
            logind_error: None,
            job_load: None,
        };
        a.host_changed(view, now);
        let info = |adaptive| JobInfo {
            user: "alice".into(),
            cwd: "/".into(),
            argv: vec!["pvm".into()],
            spec: None,
            adaptive,
        };
        let (adaptive, _) = a.register_job(info(true), now);
        a.request(adaptive, "anyHost", now);
        let (j, _) = a.register_job(info(false), now);
        a.request(j, "anyLinux", now);
        let mut store = Store::open(&path).expect("open");
        store.save(a.snapshot()).expect("save");
        drop(store);
        let loaded = Store::open(&path).expect("reopen").load().expect("load");
        assert_eq!(loaded, Some(a.snapshot()));
    }

    fn sample(jobs: u64) -> Snapshot {
        let info = |i: u64| JobInfo {
            user: "alice".into(),
            cwd: "/home/alice".into(),
            argv: vec!["pvm".into(), format!("run{i}")],
            spec: matches!(i % 2, 0).then(|| serde_json::json!({"count": i, "adaptive": true})),
            adaptive: matches!(i % 3, 0),
        };
        let state = |i: u64| match i % 4 {
            0 => JobState::Ended,
            _ => JobState::Running,
        };
        Snapshot {
            next_job: jobs + 1,
            next_alloc: jobs + 1,
            next_request: 2 * jobs + 1,
            jobs: (1..=jobs)
                .map(|id| JobRecord {
                    id,
                    info: info(id),
                    state: state(id),
                })
                .collect(),
            allocations: (1..=jobs)
                .map(|id| AllocRecord {
                    id,
                    job: id,
                    host: format!("node{id:04}"),
                    address: format!("10.1.{}.{}", id / 250, id % 250),
                    request: Some(id),
                    releasing: (id % 5 == 0).then_some(ReleasingRecord {
                        grace: Duration::from_millis(5000 + id),
                        for_request: (id % 10 == 0).then_some(jobs + id),
                    }),
                })
                .collect(),
            requests: (1..=jobs)
                .rev()
                .map(|id| RequestRecord {
                    id: jobs + id,
                    job: id,
                    symbolic: "anyLinux".into(),
                })
                .collect(),
            drained: vec!["node0003".into(), "node0007".into()],
        }
    }

    #[test]
    fn new_file_loads_none_then_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = Store::open(&dir.path().join("broker.db")).expect("open");
        assert_eq!(store.load().expect("load"), None);
        let s = sample(20);
        store.save(s.clone()).expect("save");
        assert_eq!(store.load().expect("load"), Some(s.clone()));
        let smaller = sample(3);
        store.save(smaller.clone()).expect("save again");
        assert_eq!(store.load().expect("load"), Some(smaller), "full rewrite");
    }

    /// A save writes the rows that changed since the last one (it rewrote every row: at a
    /// lab where a job holds thousands of hosts, each grant rewrote thousands), and what it
    /// leaves reads back as the snapshot saved, whatever changed.
    #[test]
    fn a_save_writes_only_what_changed_and_reads_back_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = Store::open(&dir.path().join("broker.db")).expect("open");
        let mut s = sample(500);
        store.save(s.clone()).expect("first save");
        let before = store.conn.total_changes();
        let mut granted = s.allocations[0].clone();
        granted.id = s.next_alloc;
        granted.host = "node9999".into();
        s.allocations.push(granted);
        s.next_alloc += 1;
        store.save(s.clone()).expect("a grant");
        let rows = store.conn.total_changes() - before;
        assert!(rows <= 5, "a grant wrote {rows} rows");
        assert_eq!(store.load().expect("load"), Some(s.clone()));
        // Every kind of change at once, row by row and whole.
        s.allocations.retain(|a| a.id % 3 != 0);
        s.allocations[1].releasing = None;
        s.jobs.retain(|j| j.id != 4);
        s.jobs[0].state = JobState::Ended;
        s.requests.truncate(7);
        s.requests.reverse();
        s.drained.push("node0042".into());
        s.next_job += 2;
        store.save(s.clone()).expect("changes");
        assert_eq!(store.load().expect("load"), Some(s.clone()));
        let before = store.conn.total_changes();
        store.save(s.clone()).expect("the same again");
        assert_eq!(
            store.conn.total_changes(),
            before,
            "nothing changed, nothing written"
        );
    }

    #[test]
    fn reopen_after_drop_keeps_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broker.db");
        let s = sample(7);
        {
            let mut store = Store::open(&path).expect("open");
            store.save(s.clone()).expect("save");
        }
        let store = Store::open(&path).expect("reopen");
        assert_eq!(store.load().expect("load"), Some(s));
        let mode: String = store
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("pragma");
        assert_eq!(mode, "wal");
        assert_eq!(store.version().expect("version"), SCHEMA_VERSION);
    }

    #[test]
    fn corrupt_file_gives_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broker.db");
        std::fs::write(
            &path,
            "this is not a database, it is a shopping list\n".repeat(200),
        )
        .expect("write");
        let err = Store::open(&path).expect_err("must refuse");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("move it aside"), "{msg}");
        assert!(msg.contains("starts empty"), "{msg}");
    }

    #[test]
    fn bad_row_is_reported_as_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broker.db");
        let mut store = Store::open(&path).expect("open");
        store.save(sample(2)).expect("save");
        store
            .conn
            .execute("UPDATE jobs SET state = 'zombie' WHERE id = 1", [])
            .expect("update");
        let err = store.load().expect_err("bad state");
        assert!(err.to_string().contains("job 1: bad state"), "{err}");
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broker.db");
        drop(Store::open(&path).expect("open"));
        let conn = Connection::open(&path).expect("raw open");
        conn.execute("UPDATE schema_version SET version = 99", [])
            .expect("bump");
        drop(conn);
        let err = Store::open(&path).expect_err("too new");
        assert!(
            matches!(err, StoreError::TooNew { found: 99, .. }),
            "{err:?}"
        );
    }

    /// A thousand jobs, allocations and requests saved and saved again round-trip (their
    /// time is a benchmark's, not a test's: see BENCHMARKS.md).
    #[test]
    fn a_thousand_jobs_round_trip_through_full_and_incremental_saves() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = Store::open(&dir.path().join("broker.db")).expect("open");
        let s = sample(1000);
        store.save(s.clone()).expect("full save");
        assert_eq!(store.load().expect("load"), Some(s.clone()));
        let mut fewer = s.clone();
        fewer.allocations.truncate(10);
        store.save(fewer.clone()).expect("incremental save");
        assert_eq!(store.load().expect("load"), Some(fewer));
    }
}
