//! The host daemon's life: take over from an older daemon for the same host, connect to the
//! broker, authenticate, report, reconnect with backoff, and exit when told to or when its
//! lifeline (stdin, held open by the broker's transport) closes.
//!
//! Reports go out every interval (from the broker's `Welcome`, or `--interval-ms`), and at
//! once when [`detect_trigger`] sees a login or returning input (polled every
//! [`ACTIVITY_POLL`], and at once at each of logind's signals); after a connection's first,
//! as what changed when the welcome offers it ([`proto::report_changes`]). The broker's `LiveAllocs`
//! (this host's allocations, whenever they change) feed the [`Sweeper`], which ends leftover
//! processes of allocations that are over (see [`crate::sweep`]); its word is kept across
//! reconnections (a stale word only spares processes, it never ends a live one). On every
//! transport the broker's `EndAllocs` (allocations past their reclaim deadline) feed it
//! too, and each report lists the allocations with a process here (`allocs_running`):
//! the broker frees such a host once they are gone.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use proto::{
    auth::Secret,
    frame::{FrameError, FramedConn},
    handshake::{client_handshake_welcomed, ClientAuth, HandshakeError},
    msg::{ErrorCode, FromBroker, Role, ToBroker},
    report::{HostReport, ReportTrigger},
    report_changes,
};
use tokio::{net::TcpStream, sync::watch, time::Instant};
use tracing::{debug, info, warn};

use crate::{
    jobload::JobLoad,
    sensors::{detect_trigger, Activity, Sensors},
    sweep::{self, Live, Sweeper},
};

/// How often the cheap activity sample runs (logins, input).
pub const ACTIVITY_POLL: Duration = Duration::from_millis(250);
/// Idle time after which renewed input counts as "someone came back".
pub const IDLE_THRESHOLD_S: u64 = 60;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Validated daemon settings.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub broker: String,
    pub host: String,
    pub secret_file: PathBuf,
    /// Overrides the broker's interval when set.
    pub interval: Option<Duration>,
    /// Exit when stdin reaches end-of-file (the transport that started us is gone).
    pub lifeline_stdin: bool,
    /// Set when the daemon runs in a Slurm pilot job (`--slurm-job`).
    pub pilot: Option<PilotJob>,
}

/// A Slurm pilot's daemon: its job, told to the broker after every welcome, and whether
/// Slurm said that it takes the node back (the lease warning, SIGUSR1; preemption or
/// `scancel`, SIGTERM), told again at once when that turns true.
#[derive(Debug, Clone)]
pub struct PilotJob {
    pub slurm_job: String,
    pub lease_ending: watch::Receiver<bool>,
}

/// Why the daemon stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// The broker asked us to stop, or we were signalled.
    Requested(String),
    /// Our lifeline closed.
    LifelineClosed,
    /// The broker refused us for good (bad secret, unknown host, version).
    Refused(String),
}

/// Runs until told to stop. `stop` turns true on SIGTERM/SIGINT or lifeline EOF.
pub async fn run(
    cfg: DaemonConfig,
    mut sensors: Sensors,
    mut stop: watch::Receiver<Option<Exit>>,
) -> Exit {
    let mut backoff = BACKOFF_MIN;
    let mut seq = 0u64;
    let mut sweeper = Sweeper::default();
    // Kept across reconnections, like the sweeper: the average spans them.
    let mut job_load = JobLoad::default();
    loop {
        let session = session(&cfg, &mut sensors, &mut seq, (&mut sweeper, &mut job_load));
        let outcome = tokio::select! {
            outcome = session => outcome,
            _ = stop.changed() => return take_exit(&stop),
        };
        match outcome {
            SessionEnd::Exit(exit) => return exit,
            SessionEnd::Lost { was_welcomed } => {
                if was_welcomed {
                    backoff = BACKOFF_MIN;
                }
            }
        }
        debug!(
            delay_ms = backoff.as_millis() as u64,
            "reconnecting after backoff"
        );
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return take_exit(&stop),
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn take_exit(stop: &watch::Receiver<Option<Exit>>) -> Exit {
    match &*stop.borrow() {
        Some(Exit::LifelineClosed) => Exit::LifelineClosed,
        Some(Exit::Requested(r)) => Exit::Requested(r.clone()),
        Some(Exit::Refused(r)) => Exit::Refused(r.clone()),
        None => Exit::Requested("stop signal".into()),
    }
}

enum SessionEnd {
    Exit(Exit),
    Lost { was_welcomed: bool },
}

async fn session(
    cfg: &DaemonConfig,
    sensors: &mut Sensors,
    seq: &mut u64,
    (sweeper, job_load): (&mut Sweeper, &mut JobLoad),
) -> SessionEnd {
    let secret = match Secret::load(&cfg.secret_file) {
        Ok(s) => s,
        Err(e) => return SessionEnd::Exit(Exit::Refused(e.to_string())),
    };
    let (mut conn, pace) = match connect(cfg, &secret).await {
        Ok(connected) => connected,
        Err(ConnectError::Fatal(reason)) => return SessionEnd::Exit(Exit::Refused(reason)),
        Err(ConnectError::Retry(reason)) => {
            warn!(broker = %cfg.broker, %reason, "cannot reach broker");
            return SessionEnd::Lost {
                was_welcomed: false,
            };
        }
    };
    info!(broker = %cfg.broker, host = %cfg.host, interval_ms = pace.interval.as_millis() as u64,
        report_changes = pace.report_changes, "connected");
    let lab_mark = secret.lab_mark();
    let jobs = Jobs {
        sweeper,
        job_load,
        lab_mark: &lab_mark,
    };
    let mut lease = cfg.pilot.clone();
    if let Some(pilot) = lease.as_mut() {
        if let Err(e) = tell_lease(&mut conn, pilot).await {
            warn!(error = %e, "connection to broker lost");
            return SessionEnd::Lost { was_welcomed: true };
        }
    }
    match report_loop(&mut conn, sensors, seq, pace, jobs, lease.as_mut()).await {
        Ok(exit) => SessionEnd::Exit(exit),
        Err(e) => {
            warn!(error = %e, "connection to broker lost");
            SessionEnd::Lost { was_welcomed: true }
        }
    }
}

enum ConnectError {
    Retry(String),
    Fatal(String),
}

/// How a connection reports: how often, and whether as what changed after its first
/// report ([`proto::report_changes`]: when the broker's welcome offers it).
struct Pace {
    interval: Duration,
    report_changes: bool,
}

/// Connects and completes the handshake: the connection, and how to report on it.
async fn connect(
    cfg: &DaemonConfig,
    secret: &Secret,
) -> Result<(FramedConn<TcpStream>, Pace), ConnectError> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&cfg.broker))
        .await
        .map_err(|_| ConnectError::Retry("connect timed out".into()))?
        .map_err(|e| ConnectError::Retry(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let mut conn = FramedConn::new(stream);
    let handshake = client_handshake_welcomed(
        &mut conn,
        Role::Hostd,
        &cfg.host,
        ClientAuth::Secret(secret),
    );
    let welcome = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Err(_) => return Err(ConnectError::Retry("handshake timed out".into())),
        Ok(Ok(welcome)) => welcome,
        Ok(Err(HandshakeError::Refused { code, message })) if code != ErrorCode::Failed => {
            return Err(ConnectError::Fatal(format!("broker refused us: {message}")))
        }
        Ok(Err(HandshakeError::Auth(reason))) => return Err(ConnectError::Fatal(reason)),
        Ok(Err(e)) => return Err(ConnectError::Retry(e.to_string())),
    };
    let interval = cfg
        .interval
        .unwrap_or(Duration::from_millis(welcome.report_interval_ms.max(50)));
    let pace = Pace {
        interval,
        report_changes: welcome.report_changes,
    };
    Ok((conn, pace))
}

/// Tells the broker which Slurm job this pilot's daemon runs in, and whether its lease ends.
async fn tell_lease(
    conn: &mut FramedConn<TcpStream>,
    pilot: &mut PilotJob,
) -> Result<(), FrameError> {
    let ending = *pilot.lease_ending.borrow_and_update();
    if ending {
        info!(slurm_job = %pilot.slurm_job, "Slurm warned that the lease ends: telling the broker");
    }
    let said = ToBroker::PilotLease {
        slurm_job: pilot.slurm_job.clone(),
        ending,
    };
    conn.send(&said).await
}

/// Resolves when a pilot's lease-ending flag changes; never without a pilot, or once
/// nothing can change it any more.
async fn lease_changed(pilot: &mut Option<&mut PilotJob>) {
    if let Some(p) = pilot {
        if p.lease_ending.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

async fn report_loop(
    conn: &mut FramedConn<TcpStream>,
    sensors: &mut Sensors,
    seq: &mut u64,
    Pace {
        interval,
        report_changes,
    }: Pace,
    Jobs {
        sweeper,
        job_load,
        lab_mark,
    }: Jobs<'_>,
    mut pilot: Option<&mut PilotJob>,
) -> Result<Exit, FrameError> {
    // The tag this daemon runs under, when a job's remote command started it: never swept.
    let own_tag = std::env::var(proto::tag::SUBAGENT_TAG_VAR).ok();
    let scope = sweep::Scope {
        proc_root: Path::new("/proc"),
        lab_mark,
        own_tag: own_tag.as_deref(),
    };
    let mut reporter = Reporter {
        sensors,
        seq,
        job_load,
        scope: &scope,
        running: None,
        report_changes,
        last_sent: None,
    };
    reporter.send(conn, ReportTrigger::Start).await?;
    let mut activity: Activity = reporter.sensors.sample_activity();
    let mut next_report = Instant::now() + interval;
    let mut poll = tokio::time::interval(ACTIVITY_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut logind = reporter.sensors.logind_watch();
    loop {
        tokio::select! {
            () = logind_changed(&mut logind) => {
                // logind's signal: the owner may be back; decide now, not at the next poll.
                let now = reporter.sensors.sample_activity();
                if let Some(trigger) = detect_trigger(&activity, &now, IDLE_THRESHOLD_S) {
                    debug!(?trigger, "logind: reporting now");
                    reporter.send(conn, trigger).await?;
                    next_report = Instant::now() + interval;
                }
                activity = now;
            }
            _ = tokio::time::sleep_until(next_report) => {
                reporter.send(conn, ReportTrigger::Interval).await?;
                next_report = Instant::now() + interval;
            }
            _ = poll.tick() => {
                let now = reporter.sensors.sample_activity();
                if let Some(trigger) = detect_trigger(&activity, &now, IDLE_THRESHOLD_S) {
                    debug!(?trigger, "activity: reporting now");
                    reporter.send(conn, trigger).await?;
                    next_report = Instant::now() + interval;
                }
                activity = now;
                if sweeper.due(std::time::Instant::now()) {
                    let found = sweep::sweep(sweeper, &scope, std::time::Instant::now());
                    // The broker holds a host past a deadline until it hears the
                    // allocation's processes are gone: it hears it now, not at the next report.
                    if sweeper.ends_allocs() && reporter.running.as_ref() != Some(&found) {
                        reporter.send(conn, ReportTrigger::Interval).await?;
                        next_report = Instant::now() + interval;
                    }
                }
            }
            () = lease_changed(&mut pilot) => {
                if let Some(p) = pilot.as_deref_mut() {
                    tell_lease(conn, p).await?;
                }
            }
            msg = conn.recv::<FromBroker>() => match msg? {
                FromBroker::Shutdown { reason } => return Ok(Exit::Requested(reason)),
                FromBroker::LiveAllocs { live, issued_below } => {
                    let word = Live { live: live.into_iter().collect(), issued_below };
                    if sweeper.set_live(word) {
                        sweep::sweep(sweeper, &scope, std::time::Instant::now());
                    }
                }
                FromBroker::EndAllocs { allocs } => {
                    if sweeper.set_ending(allocs.into_iter().collect()) {
                        sweep::sweep(sweeper, &scope, std::time::Instant::now());
                    }
                }
                FromBroker::Error { code, message } => warn!(?code, %message, "broker reported an error"),
                other => debug!(?other, "ignoring unexpected message"),
            },
        }
    }
}

/// Resolves at logind's next new snapshot; never without a logind watch.
async fn logind_changed(watch: &mut Option<crate::sensors::logind::LogindWatch>) {
    match watch {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

/// What the daemon keeps about the lab's job processes across a session.
struct Jobs<'a> {
    sweeper: &'a mut Sweeper,
    job_load: &'a mut JobLoad,
    lab_mark: &'a str,
}

/// What the daemon works around, for `rb status`: its runtime directory in /tmp refused
/// ([`privdir::fallback_note`]). Read once: the daemon keeps the directory it started in.
fn runtime_warnings() -> &'static [String] {
    static WARNINGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    WARNINGS.get_or_init(|| privdir::fallback_note().into_iter().collect())
}

/// Builds and sends reports: the sensors' sample, the sequence number, `job_load`.
struct Reporter<'a> {
    sensors: &'a mut Sensors,
    seq: &'a mut u64,
    job_load: &'a mut JobLoad,
    scope: &'a sweep::Scope<'a>,
    /// The allocations with a process here, as last reported.
    running: Option<Vec<u64>>,
    /// The broker takes reports as what changed since the last one on this connection.
    report_changes: bool,
    /// The last report sent on this connection, when `report_changes`.
    last_sent: Option<HostReport>,
}

impl Reporter<'_> {
    async fn send(
        &mut self,
        conn: &mut FramedConn<TcpStream>,
        trigger: ReportTrigger,
    ) -> Result<(), FrameError> {
        *self.seq += 1;
        let mut report: HostReport = self.sensors.sample();
        report.seq = *self.seq;
        report.trigger = Some(trigger);
        // Measured even when the overlay replaces it: the average spans every report.
        let measured = self.job_load.sample(self.scope, std::time::Instant::now());
        if !report.overlaid.iter().any(|f| f == "job_load") {
            report.job_load = measured;
        }
        let running = sweep::allocs_of(&sweep::scan(self.scope));
        report.warnings = runtime_warnings().to_vec();
        report.allocs_running = Some(running.clone());
        self.running = Some(running);
        if !self.report_changes {
            return conn.send(&ToBroker::Report(Box::new(report))).await;
        }
        // The first report of the connection whole, then what changed. Encoded before the
        // last report is replaced, and that before the write: a write cancelled halfway
        // still goes out first with the next, and the broker applies it.
        let frame = match &self.last_sent {
            Some(last) => serde_json::to_vec(&report_changes::Changes::new(last, &report)),
            None => serde_json::to_vec(&ToBroker::Report(Box::new(report.clone()))),
        }
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
        self.last_sent = Some(report);
        conn.send_encoded(frame).await
    }
}

/// Ensures one daemon per (user, host name) on this machine: takes the lock in `dir`,
/// terminating the daemon that holds it (an older instance, e.g. from before a broker
/// restart or a partition). The returned file keeps the lock for the process's life.
/// `dir` is created or verified private ([`privdir::create_private`]): in a directory
/// another user controls, they could hold our lock or swap the file.
pub fn take_over(dir: &Path, host: &str) -> std::io::Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    privdir::create_private(dir).map_err(std::io::Error::other)?;
    let path = dir.join(format!("hostd-{}.lock", sanitize(host)));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut signalled = false;
    while !try_lock(&file)? {
        let mut text = String::new();
        file.seek(std::io::SeekFrom::Start(0))?;
        file.read_to_string(&mut text)?;
        // Our own pid: the holder is this process's own earlier lock, still held by a copy of
        // its descriptor in a child forked by another thread that has not exec'd yet (seen in
        // the test binary, which then SIGTERMed itself). Wait for it; never signal ourselves.
        let holder = text
            .trim()
            .parse::<i32>()
            .ok()
            .filter(|&pid| pid != std::process::id() as i32);
        if let Some(pid) = holder {
            let sig = if std::time::Instant::now() > deadline {
                nix::sys::signal::Signal::SIGKILL
            } else {
                nix::sys::signal::Signal::SIGTERM
            };
            if !signalled || sig == nix::sys::signal::Signal::SIGKILL {
                info!(pid, ?sig, "taking over from an older host daemon");
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
                signalled = true;
            }
        }
        if std::time::Instant::now() > deadline + Duration::from_secs(2) {
            return Err(std::io::Error::other(format!(
                "{} stays locked by another daemon",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    file.set_len(0)?;
    file.seek(std::io::SeekFrom::Start(0))?;
    write!(file, "{}", std::process::id())?;
    Ok(file)
}

fn try_lock(file: &std::fs::File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a valid, owned descriptor; no memory is shared with the kernel.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_over_locks_and_records_pid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lock = take_over(dir.path(), "node/02").expect("lock");
        let text = std::fs::read_to_string(dir.path().join("hostd-node_02.lock")).expect("read");
        assert_eq!(text, std::process::id().to_string());
        drop(lock);
        // Free again: a second take-over succeeds at once.
        take_over(dir.path(), "node/02").expect("relock");
    }

    /// A lock still held under this process's own pid (a copy of its descriptor in a forked
    /// child that has not exec'd yet) is waited for, never signalled: the hostd test binary
    /// once got SIGTERM from itself so. Without the check this test's process dies.
    #[test]
    fn a_lock_held_under_our_own_pid_is_waited_for_not_signalled() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hostd-node03.lock");
        let mut held = std::fs::File::create(&path).expect("create");
        assert!(try_lock(&held).expect("lock"));
        write!(held, "{}", std::process::id()).expect("write pid");
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let started = std::time::Instant::now();
        take_over(dir.path(), "node03").expect("taken once released");
        assert!(started.elapsed() >= Duration::from_millis(250), "it waited");
        release.join().expect("release");
    }
}
