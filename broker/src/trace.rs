//! The decision trace's edge: [`TraceSink`], which the job desk hands each allocator input
//! and its effects, and the writer thread that appends the lines to `STATE_DIR/trace/`.
//!
//! The lines come from the pure [`Recorder`] (format and rotation: `allocation::trace`). The
//! core loop never waits for the disk: lines go to the writer through a bounded queue with
//! `try_send`; a full queue or a write the disk refuses (full, unwritable directory) drops
//! lines, counts them, logs once per streak, and makes the next file start afresh (a `start`
//! record marked `gap`), so a replay never runs over a hole.
//!
//! Files are `trace-NNNNNN.jsonl`, numbered on from the highest already there (each broker
//! run opens a new one); when one is opened the oldest are deleted so that at most
//! `files_kept` remain.
//!
//! The trace shares the state dir with the durable store, which must never run out of room
//! because of it: a new file is opened only while the file system has at least twice the
//! file limit free (else lines are dropped as for a full disk, and tried again later).

use std::{
    fs::{self, File, OpenOptions},
    io::{BufWriter, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{sync_channel, Receiver, SyncSender, TrySendError},
        Arc,
    },
    thread::JoinHandle,
    time::Instant,
};

use allocation::{
    trace::{file_name, file_seq, Input, Out, Recorder, TraceClock},
    Allocator, Effect,
};
use tracing::warn;

/// Lines waiting for the writer at most; beyond that they are dropped.
const QUEUE_LINES: usize = 16_384;

/// How long the writer lets lines gather before it writes them (see `Writer::run`): the
/// trace on disk lags the decisions by about this much. At 10k lines a second, a few
/// hundred lines of the queue's [`QUEUE_LINES`].
const GATHER: std::time::Duration = std::time::Duration::from_millis(20);

/// After lines were lost (the writer failed, or fell behind), how long until a fresh file
/// is tried.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// The trace's directory under a state dir.
pub fn trace_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("trace")
}

/// Counters shared by the sink and the writer.
#[derive(Debug, Default)]
pub struct TraceStats {
    /// Lines dropped (queue full, or the disk refused them).
    pub dropped: AtomicU64,
    /// Lines were lost (the disk refused them, or the queue was full): the next file must
    /// start afresh, tried after [`RETRY_AFTER`].
    lost: AtomicBool,
}

/// Where the job desk records the allocator's inputs and decisions.
pub struct TraceSink {
    rec: Recorder,
    tx: Option<SyncSender<Out>>,
    stats: Arc<TraceStats>,
    /// A line of the current call was dropped: drop the rest until the next `begin`.
    dropping: bool,
    /// A drop was logged and no line was sent since.
    warned: bool,
    /// When to try a fresh file after the writer lost lines.
    retry_at: Option<Instant>,
    buf: Vec<Out>,
    writer: Option<JoinHandle<()>>,
}

impl TraceSink {
    /// Starts the writer thread for `dir`: files of about `max_bytes`, the newest
    /// `files_kept` kept. `clock` is the allocator's (the epoch of its wall clock).
    pub fn spawn(
        dir: PathBuf,
        max_bytes: u64,
        files_kept: usize,
        clock: TraceClock,
        run: String,
    ) -> std::io::Result<TraceSink> {
        let (tx, rx) = sync_channel(QUEUE_LINES);
        let stats = Arc::new(TraceStats::default());
        let writer_stats = stats.clone();
        let writer = std::thread::Builder::new()
            .name("rb-trace".into())
            .spawn(move || Writer::new(dir, max_bytes, files_kept, writer_stats).run(rx))?;
        Ok(TraceSink {
            rec: Recorder::new(clock, run, max_bytes),
            tx: Some(tx),
            stats,
            dropping: false,
            warned: false,
            retry_at: None,
            buf: Vec::new(),
            writer: Some(writer),
        })
    }

    pub fn stats(&self) -> &Arc<TraceStats> {
        &self.stats
    }

    /// Before an allocator entry point (see [`Recorder::begin`]).
    /// While the writer cannot write, nothing is recorded and a fresh file (whose `start`
    /// record costs a walk over the whole lab) is tried every `RETRY_AFTER` only.
    pub fn begin(&mut self, alloc: &Allocator, now: Instant) {
        self.dropping = false;
        if self.stats.lost.load(Ordering::Relaxed) {
            let retry = *self.retry_at.get_or_insert(now + RETRY_AFTER);
            if now < retry {
                self.dropping = true;
                return;
            }
            self.retry_at = None;
            self.stats.lost.store(false, Ordering::Relaxed);
            self.rec.gap();
        }
        self.rec.begin(alloc, now, &mut self.buf);
        self.send();
    }

    /// After it: its input and the decisions among its effects.
    pub fn record(&mut self, alloc: &Allocator, input: Input, effects: &[Effect], now: Instant) {
        if self.dropping {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.rec.record(alloc, input, effects, now, &mut self.buf);
        self.send();
    }

    fn send(&mut self) {
        let Some(tx) = &self.tx else {
            self.buf.clear();
            return;
        };
        for out in self.buf.drain(..) {
            if self.dropping {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match tx.try_send(out) {
                Ok(()) => self.warned = false,
                Err(e) => {
                    if !self.warned {
                        let why = match e {
                            TrySendError::Full(_) => "the writer is behind",
                            TrySendError::Disconnected(_) => "the writer thread is gone",
                        };
                        warn!(
                            why,
                            "decision trace: dropping lines (the next file starts afresh)"
                        );
                        self.warned = true;
                    }
                    self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    self.dropping = true;
                    // As after a failed write: the fresh file's `start` (the whole lab's
                    // state, for the writer to encode: 2.8 MB at 10k hosts) is tried after
                    // `RETRY_AFTER`, not at the next call. Tried at each call, a writer behind
                    // was handed a state to encode at every free slot, and fell further behind.
                    self.stats.lost.store(true, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Drop for TraceSink {
    /// Lets the writer write what is queued (the broker is stopping).
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            if w.join().is_err() {
                warn!("decision trace: the writer thread panicked");
            }
        }
    }
}

/// The writer thread's state.
struct Writer {
    dir: PathBuf,
    /// The file size limit (for the free-space check).
    max_bytes: u64,
    files_kept: usize,
    stats: Arc<TraceStats>,
    file: Option<BufWriter<File>>,
    /// After a failed write, lines are dropped until the next file.
    broken: bool,
    /// A failure was logged and nothing was written since.
    logged: bool,
}

impl Writer {
    fn new(dir: PathBuf, max_bytes: u64, files_kept: usize, stats: Arc<TraceStats>) -> Writer {
        Writer {
            dir,
            max_bytes,
            files_kept: files_kept.max(1),
            stats,
            file: None,
            broken: false,
            logged: false,
        }
    }

    /// Writes what arrives, [`GATHER`] at a time: once a line came, the thread sleeps
    /// while more queue up, then writes them all and flushes. A broker deciding on every
    /// report (10k a second at 10k hosts) then wakes this thread and writes to the file
    /// a few dozen times a second, not once per line.
    fn run(mut self, rx: Receiver<Out>) {
        while let Ok(first) = rx.recv() {
            self.handle(first);
            std::thread::sleep(GATHER);
            while let Ok(next) = rx.try_recv() {
                self.handle(next);
            }
            self.flush();
        }
        self.flush();
    }

    fn handle(&mut self, out: Out) {
        if self.broken && !matches!(out, Out::Rotate) {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match out.into_text() {
            None => {
                self.flush();
                self.file = None;
                self.broken = false;
            }
            Some(mut line) => {
                // One write per line with its newline: a reader never sees half a line
                // between two flushes (a line larger than the buffer aside).
                line.push('\n');
                if let Err(e) = self.write(&line) {
                    self.failed(&e);
                } else if self.logged {
                    let dropped = self.stats.dropped.load(Ordering::Relaxed);
                    warn!(
                        dropped,
                        "decision trace: writing again; lines dropped so far"
                    );
                    self.logged = false;
                }
            }
        }
    }

    fn write(&mut self, line: &str) -> std::io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.write_all(line.as_bytes())?,
            None => self.file = Some(BufWriter::new(self.open_next(line)?)),
        }
        crate::web::METRICS.trace_written(line.len());
        Ok(())
    }

    fn flush(&mut self) {
        let result = self.file.as_mut().map(|f| f.flush());
        if let Some(Err(e)) = result {
            self.failed(&e);
        }
    }

    /// Logs once per streak, drops until the next file, and asks for a fresh one.
    fn failed(&mut self, e: &std::io::Error) {
        if !self.logged {
            warn!(dir = %self.dir.display(), error = %e,
                "decision trace: cannot write; dropping lines until it can (help: free space \
                 or fix the permissions of the directory)");
            self.logged = true;
        }
        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        self.stats.lost.store(true, Ordering::Relaxed);
        self.file = None;
        self.broken = true;
    }

    /// Opens the next numbered file, holding `first` (its opening `start` record) from the
    /// moment it has its name (written under a temporary one, then renamed: a reader never
    /// finds it empty), and deletes the oldest beyond `files_kept`.
    fn open_next(&mut self, first: &str) -> std::io::Result<File> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let mut seqs = trace_files(&self.dir)?;
        let free = free_bytes(&self.dir)?;
        if free < self.max_bytes.saturating_mul(2) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "only {free} bytes free; a new trace file needs twice its limit ({} bytes) \
                     so that the broker's store keeps room",
                    self.max_bytes
                ),
            ));
        }
        let next = seqs.last().map_or(1, |(n, _)| n + 1);
        let path = self.dir.join(file_name(next));
        if path.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            ));
        }
        let part = self.dir.join(".trace-next.part");
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&part)?;
        file.write_all(first.as_bytes())?;
        fs::rename(&part, &path)?;
        seqs.push((next, path));
        let excess = seqs.len().saturating_sub(self.files_kept);
        for (_, old) in &seqs[..excess] {
            if let Err(e) = fs::remove_file(old) {
                warn!(file = %old.display(), error = %e, "decision trace: cannot delete an old file");
            }
        }
        Ok(file)
    }
}

/// Bytes an unprivileged writer may still use on the file system of `dir`.
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir)?;
    Ok(st.blocks_available().saturating_mul(st.fragment_size()))
}

/// The trace files in `dir`, oldest first, with their numbers.
pub fn trace_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut files: Vec<(u64, PathBuf)> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((file_seq(e.file_name().to_str()?)?, e.path())))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use allocation::{HostView, TraceClock};

    use super::*;

    fn view(name: &str) -> HostView {
        HostView {
            name: name.into(),
            address: "127.0.0.1".into(),
            up: true,
            reported: true,
            labels: vec!["linux".into()].into(),
            os: None,
            owner: None,
            load1: Some(0.0),
            load5: None,
            load15: None,
            mem_avail_mb: None,
            cpus: Some(1),
            users: Some(vec![]),
            console_idle_s: None,
            logind: None,
            logind_error: None,
            job_load: None,
        }
    }

    fn record_hosts(sink: &mut TraceSink, n: usize) {
        record_hosts_from(sink, &mut Allocator::new(), Instant::now(), 0..n);
    }

    /// Records hosts `names` into `sink` through `a`, 10 ms apart from `now`.
    fn record_hosts_from(
        sink: &mut TraceSink,
        a: &mut Allocator,
        mut now: Instant,
        names: std::ops::Range<usize>,
    ) {
        for i in names {
            let v = view(&format!("node{i:03}"));
            sink.begin(a, now);
            let changed = allocation::trace::host_delta(None, &v);
            let input = Input::Host {
                host: v.name.clone(),
                changed,
                view: Some(Box::new(v)),
            };
            let handled = a.handle(input, now);
            sink.record(a, handled.input, &handled.effects, now);
            now += Duration::from_millis(10);
        }
    }

    /// A reader (`rb policy replay`, a test) that lists the files while the writer opens
    /// one finds it with its opening line, never empty (it was, for the writer's 20 ms of
    /// gathering: a flaky test read a new file's first line as "").
    #[test]
    fn a_new_file_is_never_seen_empty() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("trace");
        let clock = TraceClock::new(Instant::now(), 0);
        let mut sink = TraceSink::spawn(dir.clone(), 1 << 20, 3, clock, "r".into()).expect("spawn");
        record_hosts(&mut sink, 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        let path = loop {
            if let Some((_, path)) = trace_files(&dir).ok().and_then(|f| f.into_iter().next()) {
                break path;
            }
            assert!(Instant::now() < deadline, "no file");
            std::thread::sleep(Duration::from_millis(1));
        };
        let text = fs::read_to_string(&path).expect("read");
        assert!(text.contains("\"start\":"), "{text:?}");
        drop(sink);
        let names: Vec<String> = fs::read_dir(&dir)
            .expect("listed")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        assert_eq!(names, ["trace-000001.jsonl"], "no part file left");
    }

    #[test]
    fn files_rotate_and_only_the_newest_are_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("trace");
        let clock = TraceClock::new(Instant::now(), 0);
        let mut sink = TraceSink::spawn(dir.clone(), 1024, 3, clock, "r".into()).expect("spawn");
        record_hosts(&mut sink, 60);
        drop(sink);
        let files = trace_files(&dir).expect("listed");
        assert_eq!(files.len(), 3, "{files:?}");
        assert!(files[0].0 > 1, "older files deleted: {files:?}");
        for (_, path) in &files {
            let text = fs::read_to_string(path).expect("read");
            assert!(text.starts_with("{\"t_us\":"), "{text}");
            assert!(text
                .lines()
                .next()
                .is_some_and(|l| l.contains("\"start\":")));
            // Beyond its opening state, a file holds about the limit (one call's lines more).
            let start = text.lines().next().map_or(0, |l| l.len() + 1);
            assert!(
                text.len() - start < 1024 + 600,
                "{} bytes",
                text.len() - start
            );
        }
    }

    #[test]
    fn an_unwritable_directory_drops_and_counts_without_blocking() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("not-a-dir");
        fs::write(&file, "x").expect("write");
        let clock = TraceClock::new(Instant::now(), 0);
        let mut sink =
            TraceSink::spawn(file.join("trace"), 1024, 3, clock, "r".into()).expect("spawn");
        let stats = sink.stats().clone();
        record_hosts(&mut sink, 5);
        drop(sink);
        assert!(stats.dropped.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn no_file_is_opened_without_twice_its_limit_free() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("trace");
        let clock = TraceClock::new(Instant::now(), 0);
        let huge = 1 << 60;
        let mut sink = TraceSink::spawn(dir.clone(), huge, 3, clock, "r".into()).expect("spawn");
        let stats = sink.stats().clone();
        record_hosts(&mut sink, 3);
        drop(sink);
        assert!(stats.dropped.load(Ordering::Relaxed) > 0);
        assert_eq!(trace_files(&dir).expect("listed"), Vec::new());
    }

    #[test]
    fn once_the_disk_takes_lines_again_a_fresh_file_starts_marked_gap() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("trace");
        fs::write(&dir, "in the way").expect("block the directory");
        let start = Instant::now();
        let clock = TraceClock::new(start, 0);
        let mut sink = TraceSink::spawn(dir.clone(), 1 << 20, 3, clock, "r".into()).expect("spawn");
        let stats = sink.stats().clone();
        let mut a = Allocator::new();
        record_hosts_from(&mut sink, &mut a, start, 0..3);
        let lost = || stats.lost.load(Ordering::Relaxed).then_some(());
        let deadline = Instant::now() + Duration::from_secs(10);
        while lost().is_none() && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(lost().is_some(), "the writer saw the failure");
        let dropped = stats.dropped.load(Ordering::Relaxed);
        // Within the retry delay nothing is recorded (only counted).
        record_hosts_from(&mut sink, &mut a, start + Duration::from_secs(1), 3..5);
        assert!(stats.dropped.load(Ordering::Relaxed) > dropped);
        fs::remove_file(&dir).expect("unblock");
        record_hosts_from(&mut sink, &mut a, start + RETRY_AFTER * 2, 5..6);
        drop(sink);
        let files = trace_files(&dir).expect("listed");
        assert_eq!(files.len(), 1, "{files:?}");
        let text = fs::read_to_string(&files[0].1).expect("read");
        let first = text.lines().next().unwrap_or_default();
        assert!(first.contains("\"gap\":true"), "{first}");
        assert!(
            first.contains("node004"),
            "the state before the call: {first}"
        );
    }

    /// A queue the writer does not empty fills: from then on the calls are dropped (only
    /// counted) until `RETRY_AFTER` has passed, and only then is a fresh `start` (marked
    /// `gap`) tried, once, not at every call.
    #[test]
    fn a_full_queue_drops_calls_and_tries_a_fresh_file_after_the_retry_delay() {
        let start = Instant::now();
        let clock = TraceClock::new(start, 0);
        // Room for a call's lines after a rotation: the `Rotate`, the `start`, the input.
        let (tx, rx) = sync_channel(3);
        let stats = Arc::new(TraceStats::default());
        let mut sink = TraceSink {
            rec: Recorder::new(clock, "r", 1 << 20),
            tx: Some(tx),
            stats: stats.clone(),
            dropping: false,
            warned: false,
            retry_at: None,
            buf: Vec::new(),
            writer: None,
        };
        let mut a = Allocator::new();
        // The first call (its `start` and its input line) and the next one's line fill it.
        record_hosts_from(&mut sink, &mut a, start, 0..1);
        let queued = |rx: &Receiver<Out>| rx.try_iter().collect::<Vec<_>>();
        // The next calls find it full (nothing read): dropped, counted.
        record_hosts_from(&mut sink, &mut a, start, 1..4);
        let dropped = stats.dropped.load(Ordering::Relaxed);
        assert!(dropped >= 2, "{dropped}");
        // The writer catches up; within the retry delay nothing is queued, no `start` made.
        let first = queued(&rx);
        assert_eq!(first.len(), 3, "the first two calls' lines");
        record_hosts_from(&mut sink, &mut a, start + Duration::from_secs(1), 4..8);
        assert!(queued(&rx).is_empty(), "nothing within the retry delay");
        assert!(stats.dropped.load(Ordering::Relaxed) > dropped);
        // After it: one fresh `start`, marked `gap`, with the lab as it is now.
        record_hosts_from(&mut sink, &mut a, start + RETRY_AFTER * 2, 8..9);
        let after = queued(&rx);
        let texts: Vec<String> = after.into_iter().filter_map(Out::into_text).collect();
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert!(texts[0].contains("\"gap\":true"), "{}", texts[0]);
        assert!(texts[0].contains("node007"), "{}", texts[0]);
        assert!(texts[1].contains("node008"), "{}", texts[1]);
    }
}
