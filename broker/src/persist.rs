//! Durable broker state off the hot path: one thread owns the SQLite [`Store`] and writes
//! the newest snapshot it has been given (older ones still queued are skipped). Decisions
//! never wait for the disk; a crash loses at most the last few milliseconds of changes.
//! Each queued snapshot gets a sequence number and `StoreWriter::committed` follows the
//! newest one written, so that a reply which must not outrun the disk (a job's end) can
//! wait for it without the decisions waiting.

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
};

use tracing::{error, warn};

use crate::alloc::{snapshot::Snapshot, store::Store};

/// Sends snapshots to the writer thread.
pub struct StoreWriter {
    tx: Option<mpsc::Sender<(u64, Snapshot)>>,
    thread: Option<JoinHandle<()>>,
    /// The state dir (where the database lives).
    dir: PathBuf,
    /// False while the last save failed.
    saved: Arc<AtomicBool>,
    /// The sequence number of the newest snapshot queued.
    queued: u64,
    /// The sequence number of the newest snapshot the thread has written (or failed to:
    /// a failed save is logged, and [`StoreWriter::check_writable`] then refuses new jobs).
    committed: tokio::sync::watch::Receiver<u64>,
}

/// Bytes the writability probe writes: more than one page, so a full tmpfs says so.
const PROBE_BYTES: usize = 8192;

impl StoreWriter {
    /// Opens the database at `path` and returns the writer plus what it held before.
    pub fn open(path: &Path) -> anyhow::Result<(StoreWriter, Option<Snapshot>)> {
        let mut store = Store::open(path)?;
        let previous = store.load()?;
        let (tx, rx) = mpsc::channel::<(u64, Snapshot)>();
        let saved = Arc::new(AtomicBool::new(true));
        let flag = saved.clone();
        let (done_tx, committed) = tokio::sync::watch::channel(0u64);
        let thread = std::thread::Builder::new()
            .name("rb-store".into())
            .spawn(move || {
                while let Ok(mut snap) = rx.recv() {
                    while let Ok(newer) = rx.try_recv() {
                        snap = newer;
                    }
                    let (seq, snap) = snap;
                    let result = store.save(snap);
                    flag.store(result.is_ok(), Ordering::SeqCst);
                    if let Err(e) = result {
                        error!(error = %e, "cannot save broker state");
                    }
                    done_tx.send_replace(seq);
                }
            })?;
        Ok((
            StoreWriter {
                tx: Some(tx),
                thread: Some(thread),
                dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
                saved,
                queued: 0,
                committed,
            },
            previous,
        ))
    }

    /// Whether new durable state can be committed now: the last save succeeded and a probe
    /// file can be written and synced in the state dir (not full, not read-only). New jobs
    /// are refused when it cannot: their state would be lost in a crash.
    pub fn check_writable(&self) -> Result<(), String> {
        let probe = self.dir.join(".rb-write-probe");
        let written = std::fs::File::create(&probe).and_then(|mut f| {
            f.write_all(&[0u8; PROBE_BYTES])?;
            f.sync_all()
        });
        let _ = std::fs::remove_file(&probe);
        let why = match written {
            Err(e) => e.to_string(),
            Ok(()) if !self.saved.load(Ordering::SeqCst) => "the last save failed".to_string(),
            Ok(()) => return Ok(()),
        };
        Err(format!(
            "the broker cannot save its state in {}: {why}; new jobs are refused until it can \
             (running jobs go on)\nhelp: free space in {0} or make it writable for the broker",
            self.dir.display()
        ))
    }

    /// Queues `snap` for writing.
    pub fn save(&mut self, snap: Snapshot) {
        self.queued += 1;
        if let Some(tx) = &self.tx {
            if tx.send((self.queued, snap)).is_err() {
                warn!("the state writer is gone; state is not being saved");
            }
        }
    }

    /// The sequence number of the newest snapshot queued.
    pub fn queued(&self) -> u64 {
        self.queued
    }

    /// The sequence number of the newest snapshot written (or that failed to be).
    pub fn committed_now(&self) -> u64 {
        *self.committed.borrow()
    }

    /// Follows [`Self::committed_now`] as the writer makes progress.
    pub fn progress(&self) -> tokio::sync::watch::Receiver<u64> {
        self.committed.clone()
    }
}

impl Drop for StoreWriter {
    /// Flushes what is queued before the broker exits.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
