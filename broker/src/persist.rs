//! Durable broker state off the hot path: one thread owns the SQLite [`Store`] and writes
//! the newest snapshot it has been given (older ones still queued are skipped). Decisions
//! never wait for the disk; a crash loses at most the last few milliseconds of changes.

use std::{path::Path, sync::mpsc, thread::JoinHandle};

use tracing::{error, warn};

use crate::alloc::{snapshot::Snapshot, store::Store};

/// Sends snapshots to the writer thread.
pub struct StoreWriter {
    tx: Option<mpsc::Sender<Snapshot>>,
    thread: Option<JoinHandle<()>>,
}

impl StoreWriter {
    /// Opens the database at `path` and returns the writer plus what it held before.
    pub fn open(path: &Path) -> anyhow::Result<(StoreWriter, Option<Snapshot>)> {
        let mut store = Store::open(path)?;
        let previous = store.load()?;
        let (tx, rx) = mpsc::channel::<Snapshot>();
        let thread = std::thread::Builder::new()
            .name("rb-store".into())
            .spawn(move || {
                while let Ok(mut snap) = rx.recv() {
                    while let Ok(newer) = rx.try_recv() {
                        snap = newer;
                    }
                    if let Err(e) = store.save(&snap) {
                        error!(error = %e, "cannot save broker state");
                    }
                }
            })?;
        Ok((
            StoreWriter {
                tx: Some(tx),
                thread: Some(thread),
            },
            previous,
        ))
    }

    /// Queues `snap` for writing.
    pub fn save(&self, snap: Snapshot) {
        if let Some(tx) = &self.tx {
            if tx.send(snap).is_err() {
                warn!("the state writer is gone; state is not being saved");
            }
        }
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
