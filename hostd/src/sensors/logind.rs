//! logind's sessions (systemd-logind, or elogind where there is no systemd), read over the
//! system D-Bus: the one source every desktop of today feeds (GNOME and KDE set `IdleHint`
//! and `LockedHint` on their session; logind derives a tty session's idle from its tty).
//!
//! A [`LogindWatch`] owns a thread with its own small tokio runtime and one bus connection
//! (zbus, no `busctl` per poll). It lists the sessions, subscribes to logind's signals
//! (`SessionNew`, `SessionRemoved`, `PropertiesChanged` under `/org/freedesktop/login1`)
//! and lists them again at each signal (and every [`REFRESH`], for the tty sessions whose
//! idle logind computes on read), keeping the last answer in a [`Snapshot`] the sensors
//! read without any bus call. Every new snapshot bumps a counter the daemon waits on, so an
//! owner's return (idle hint cleared, unlock, a new session) reaches the daemon at the
//! signal, not at the next poll. When the bus or logind cannot be reached the snapshot
//! says why, and the watch tries again every [`RETRY`].
//!
//! [`to_report`] turns a raw session into the report's [`LogindSession`] at sampling time
//! (idle seconds need `now`): a graphical session's idle is 0 while `IdleHint` is false,
//! else now − `IdleSinceHint`, or now − its last unlock the watch saw when that is later
//! ([`mark_unlocks`]); a terminal session's is now − its tty's access time (as `w` shows
//! it), else logind's `IdleSinceHint` (which logind takes from the tty).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_lite::StreamExt;
use proto::report::{IdleSource, LogindSession};
use tokio::sync::watch;
use tracing::{debug, info};
use zbus::zvariant::{OwnedObjectPath, OwnedValue};
use zbus::{Connection, MatchRule, MessageStream};

use super::idle::{seconds_since, tty_idle};

/// How often the sessions are listed again without a signal.
pub const REFRESH: Duration = Duration::from_secs(2);
/// How long to wait before reconnecting after the bus or logind failed.
pub const RETRY: Duration = Duration::from_secs(3);
/// The longest one listing may take before logind counts as unreachable.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

const LOGIN1: &str = "org.freedesktop.login1";
const LOGIN1_PATH: &str = "/org/freedesktop/login1";

/// One session's properties as logind gave them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawSession {
    pub id: String,
    pub user: String,
    pub seat: String,
    pub tty: String,
    pub display: String,
    pub class: String,
    pub kind: String,
    pub remote: bool,
    pub remote_host: String,
    pub active: bool,
    pub locked: bool,
    pub idle_hint: bool,
    /// `IdleSinceHint`: microseconds since the epoch, 0 when unset.
    pub idle_since_us: u64,
    /// When this watch last saw `LockedHint` go from true to false ([`mark_unlocks`]).
    pub unlocked_at: Option<SystemTime>,
    /// The session this daemon runs in.
    pub own: bool,
}

/// The last word from logind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Snapshot {
    /// Not listed yet (the watch has just started).
    Pending,
    Read(Vec<RawSession>),
    /// Why logind could not be read.
    Unreachable(String),
}

/// The handle of the watching thread: the last snapshot and a counter of new ones.
#[derive(Debug, Clone)]
pub struct LogindWatch {
    snapshot: Arc<Mutex<Snapshot>>,
    changes: watch::Receiver<u64>,
}

impl LogindWatch {
    /// Starts watching the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else
    /// `/run/dbus/system_bus_socket`). The thread lives as long as the process.
    pub fn spawn() -> LogindWatch {
        let snapshot = Arc::new(Mutex::new(Snapshot::Pending));
        let (tx, changes) = watch::channel(0u64);
        let shared = snapshot.clone();
        let started = std::thread::Builder::new()
            .name("logind".into())
            .spawn(move || watch_thread(shared, tx));
        if let Err(e) = started {
            set(
                &snapshot,
                None,
                Snapshot::Unreachable(format!("cannot start the logind thread: {e}")),
            );
        }
        LogindWatch { snapshot, changes }
    }

    /// The last snapshot.
    pub fn snapshot(&self) -> Snapshot {
        lock(&self.snapshot).clone()
    }

    /// Resolves at the next new snapshot (never, once the thread is gone).
    pub async fn changed(&mut self) {
        if self.changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Waits (blocking) until the first listing is done or `timeout` passed.
    pub fn wait_first(&self, timeout: Duration) -> Snapshot {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let s = self.snapshot();
            if s != Snapshot::Pending || std::time::Instant::now() >= deadline {
                return s;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn lock(shared: &Mutex<Snapshot>) -> std::sync::MutexGuard<'_, Snapshot> {
    match shared.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn set(shared: &Mutex<Snapshot>, tx: Option<&watch::Sender<u64>>, new: Snapshot) {
    let mut guard = lock(shared);
    if *guard == new {
        return;
    }
    *guard = new;
    drop(guard);
    if let Some(tx) = tx {
        tx.send_modify(|n| *n += 1);
    }
}

fn watch_thread(shared: Arc<Mutex<Snapshot>>, tx: watch::Sender<u64>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let why = format!("cannot start the logind runtime: {e}");
            return set(&shared, Some(&tx), Snapshot::Unreachable(why));
        }
    };
    runtime.block_on(async move {
        let mut said = None::<String>;
        loop {
            let why = follow(&shared, &tx).await;
            if said.as_deref() != Some(why.as_str()) {
                info!(reason = %why, "logind not readable; idle times rest on the console and utmp");
                said = Some(why.clone());
            }
            set(&shared, Some(&tx), Snapshot::Unreachable(why));
            tokio::time::sleep(RETRY).await;
        }
    });
}

/// Connects, subscribes and keeps the snapshot current until something fails; returns why.
async fn follow(shared: &Mutex<Snapshot>, tx: &watch::Sender<u64>) -> String {
    let conn = match tokio::time::timeout(CALL_TIMEOUT, Connection::system()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return format!("no system bus: {e}"),
        Err(_) => return "no system bus: connecting timed out".into(),
    };
    let rule = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(LOGIN1)
        .and_then(|b| b.path_namespace(LOGIN1_PATH))
        .map(|b| b.build());
    let rule = match rule {
        Ok(r) => r,
        Err(e) => return format!("bad match rule: {e}"),
    };
    let mut signals = match MessageStream::for_match_rule(rule, &conn, Some(64)).await {
        Ok(s) => s,
        Err(e) => return format!("cannot subscribe to logind's signals: {e}"),
    };
    let own = own_session(&conn).await;
    loop {
        match tokio::time::timeout(CALL_TIMEOUT, list(&conn, own.as_ref())).await {
            Ok(Ok(mut sessions)) => {
                if let Snapshot::Read(before) = &*lock(shared) {
                    mark_unlocks(before, &mut sessions, SystemTime::now());
                }
                set(shared, Some(tx), Snapshot::Read(sessions))
            }
            Ok(Err(e)) => return format!("logind: {e}"),
            Err(_) => return "logind: listing the sessions timed out".into(),
        }
        tokio::select! {
            msg = signals.next() => match msg {
                Some(_) => debug!("logind signal"),
                None => return "the system bus closed the connection".into(),
            },
            () = tokio::time::sleep(REFRESH) => {}
        }
    }
}

/// The object path of the session this process runs in, if any.
async fn own_session(conn: &Connection) -> Option<OwnedObjectPath> {
    let reply = conn
        .call_method(
            Some(LOGIN1),
            LOGIN1_PATH,
            Some("org.freedesktop.login1.Manager"),
            "GetSessionByPID",
            &(std::process::id()),
        )
        .await
        .ok()?;
    reply.body().deserialize().ok()
}

type SessionRow = (String, u32, String, String, OwnedObjectPath);

async fn list(conn: &Connection, own: Option<&OwnedObjectPath>) -> zbus::Result<Vec<RawSession>> {
    let reply = conn
        .call_method(
            Some(LOGIN1),
            LOGIN1_PATH,
            Some("org.freedesktop.login1.Manager"),
            "ListSessions",
            &(),
        )
        .await?;
    let rows: Vec<SessionRow> = reply.body().deserialize()?;
    let mut sessions = Vec::with_capacity(rows.len());
    for (id, _uid, user, seat, path) in rows {
        let reply = conn
            .call_method(
                Some(LOGIN1),
                &path,
                Some("org.freedesktop.DBus.Properties"),
                "GetAll",
                &("org.freedesktop.login1.Session",),
            )
            .await;
        // A session that ended between the two calls is simply gone.
        let Ok(reply) = reply else { continue };
        let props: HashMap<String, OwnedValue> = reply.body().deserialize()?;
        let mut s = from_properties(&props);
        s.id = id;
        if s.user.is_empty() {
            s.user = user;
        }
        if s.seat.is_empty() {
            s.seat = seat;
        }
        s.own = own == Some(&path);
        sessions.push(s);
    }
    sessions.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(sessions)
}

/// A session from logind's property map; a missing or mistyped property is left empty.
pub fn from_properties(props: &HashMap<String, OwnedValue>) -> RawSession {
    let text = |k: &str| {
        props
            .get(k)
            .and_then(|v| v.downcast_ref::<&str>().ok().map(str::to_string))
            .unwrap_or_default()
    };
    let flag = |k: &str| {
        props
            .get(k)
            .and_then(|v| v.downcast_ref::<bool>().ok())
            .unwrap_or(false)
    };
    let seat = props
        .get("Seat")
        .and_then(|v| v.try_clone().ok())
        .and_then(|v| <(String, OwnedObjectPath)>::try_from(v).ok())
        .map(|(name, _)| name)
        .unwrap_or_default();
    RawSession {
        id: text("Id"),
        user: text("Name"),
        seat,
        tty: text("TTY"),
        display: text("Display"),
        class: text("Class"),
        kind: text("Type"),
        remote: flag("Remote"),
        remote_host: text("RemoteHost"),
        active: flag("Active"),
        locked: flag("LockedHint"),
        idle_hint: flag("IdleHint"),
        idle_since_us: props
            .get("IdleSinceHint")
            .and_then(|v| v.downcast_ref::<u64>().ok())
            .unwrap_or(0),
        unlocked_at: None,
        own: false,
    }
}

/// Carries each session's last unlock from the previous listing `before` into `after`, and
/// marks the sessions unlocked since then with `now`. logind keeps no time for
/// `LockedHint`, and a desktop may clear `IdleHint` only a while after its owner typed the
/// password: the unlock itself is the owner's return.
pub fn mark_unlocks(before: &[RawSession], after: &mut [RawSession], now: SystemTime) {
    for s in after {
        let Some(old) = before.iter().find(|o| o.id == s.id) else {
            continue;
        };
        s.unlocked_at = if old.locked && !s.locked {
            Some(now)
        } else {
            old.unlocked_at
        };
    }
}

/// The report's session, with its idle time at `now` and where that came from.
pub fn to_report(s: &RawSession, dev_dir: &Path, now: SystemTime) -> LogindSession {
    let some = |v: &str| (!v.is_empty()).then(|| v.to_string());
    let (idle_s, idle_source) = idle_of(s, dev_dir, now);
    LogindSession {
        id: s.id.clone(),
        user: s.user.clone(),
        seat: some(&s.seat),
        tty: some(&s.tty),
        display: some(&s.display),
        class: s.class.clone(),
        kind: s.kind.clone(),
        remote: s.remote,
        remote_host: some(&s.remote_host),
        active: s.active,
        locked: s.locked,
        idle_hint: s.idle_hint,
        idle_s,
        idle_source,
        own: s.own,
    }
}

/// See the module doc.
fn idle_of(s: &RawSession, dev_dir: &Path, now: SystemTime) -> (Option<u64>, IdleSource) {
    let since = (s.idle_since_us > 0)
        .then(|| UNIX_EPOCH + Duration::from_micros(s.idle_since_us))
        .map(|t| seconds_since(now, t));
    let graphical = matches!(s.kind.as_str(), "x11" | "wayland" | "mir");
    if graphical {
        let unlocked = s.unlocked_at.map(|t| seconds_since(now, t));
        return match (s.idle_hint, since, unlocked) {
            (false, _, _) => (Some(0), IdleSource::LogindActive),
            (true, Some(secs), Some(u)) if u < secs => (Some(u), IdleSource::LogindUnlock),
            (true, Some(secs), _) => (Some(secs), IdleSource::LogindIdleSince),
            (true, None, _) => (None, IdleSource::None),
        };
    }
    if !s.tty.is_empty() {
        if let Some(secs) = tty_idle(dev_dir, &s.tty, now) {
            return (Some(secs), IdleSource::TtyAtime);
        }
    }
    match since {
        Some(secs) if s.kind == "tty" => (Some(secs), IdleSource::LogindIdleSince),
        _ => (None, IdleSource::None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: &str, idle_hint: bool, since_ago_s: Option<u64>) -> RawSession {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        RawSession {
            id: "2".into(),
            user: "ann".into(),
            seat: "seat0".into(),
            kind: kind.into(),
            class: "user".into(),
            idle_hint,
            idle_since_us: since_ago_s
                .map_or(0, |s| (now - Duration::from_secs(s)).as_micros() as u64),
            ..RawSession::default()
        }
    }

    #[test]
    fn graphical_idle_follows_the_idle_hint() {
        let dev = Path::new("/nonexistent");
        let now = SystemTime::now();
        let active = to_report(&raw("wayland", false, Some(900)), dev, now);
        assert_eq!(
            (active.idle_s, active.idle_source),
            (Some(0), IdleSource::LogindActive)
        );
        let idle = to_report(&raw("x11", true, Some(900)), dev, now);
        assert!(
            idle.idle_s.is_some_and(|s| (899..=901).contains(&s)),
            "{idle:?}"
        );
        assert_eq!(idle.idle_source, IdleSource::LogindIdleSince);
        let no_since = to_report(&raw("wayland", true, None), dev, now);
        assert_eq!(
            (no_since.idle_s, no_since.idle_source),
            (None, IdleSource::None)
        );
        assert_eq!(active.seat.as_deref(), Some("seat0"));
        assert_eq!(active.tty, None, "empty strings are absent");
    }

    /// An unlock is input: the idle time restarts there even while the desktop still says
    /// `IdleHint`, and the mark is carried over later listings until the next unlock.
    #[test]
    fn an_unlock_restarts_the_idle_time() {
        let dev = Path::new("/nonexistent");
        let t0 = SystemTime::now();
        let locked = RawSession {
            locked: true,
            ..raw("wayland", true, Some(900))
        };
        let unlocked = RawSession {
            locked: false,
            ..locked.clone()
        };
        let mut after = vec![unlocked.clone()];
        mark_unlocks(std::slice::from_ref(&locked), &mut after, t0);
        assert_eq!(after[0].unlocked_at, Some(t0));
        let r = to_report(&after[0], dev, t0 + Duration::from_secs(20));
        assert_eq!(
            (r.idle_s, r.idle_source),
            (Some(20), IdleSource::LogindUnlock)
        );
        let mut later = vec![unlocked.clone()];
        mark_unlocks(&after, &mut later, t0 + Duration::from_secs(5));
        assert_eq!(later[0].unlocked_at, Some(t0), "carried, not renewed");
        let mut relocked = vec![locked.clone()];
        mark_unlocks(&later, &mut relocked, t0 + Duration::from_secs(6));
        assert_eq!(relocked[0].unlocked_at, Some(t0), "a lock is no input");
        let mut fresh = vec![unlocked.clone()];
        mark_unlocks(&[], &mut fresh, t0);
        assert_eq!(fresh[0].unlocked_at, None, "a new session was not unlocked");
        let r = to_report(&unlocked, dev, t0);
        assert_eq!(r.idle_source, IdleSource::LogindIdleSince, "{r:?}");
        let older = RawSession {
            unlocked_at: Some(t0 - Duration::from_secs(2000)),
            ..unlocked
        };
        let r = to_report(&older, dev, t0);
        assert_eq!(
            r.idle_source,
            IdleSource::LogindIdleSince,
            "an unlock before the idle hint's time says nothing new: {r:?}"
        );
    }

    #[test]
    fn terminal_idle_from_the_tty_then_logind() {
        let dev = tempfile::tempdir().expect("tempdir");
        std::fs::write(dev.path().join("tty3"), "").expect("tty");
        let now = SystemTime::now();
        let tty = RawSession {
            tty: "tty3".into(),
            ..raw("tty", false, Some(4000))
        };
        let r = to_report(&tty, dev.path(), now);
        assert_eq!(r.idle_source, IdleSource::TtyAtime);
        assert!(r.idle_s.is_some_and(|s| s < 5), "{r:?}");
        let gone = RawSession {
            tty: "tty9".into(),
            ..tty.clone()
        };
        let r = to_report(&gone, dev.path(), now);
        assert_eq!(r.idle_source, IdleSource::LogindIdleSince);
        assert!(r.idle_s.is_some_and(|s| (3999..=4001).contains(&s)));
        let command = raw("unspecified", false, None);
        let r = to_report(&command, dev.path(), now);
        assert_eq!((r.idle_s, r.idle_source), (None, IdleSource::None));
        assert!(
            !r.is_person(),
            "no terminal, no desktop: nobody at a keyboard"
        );
    }

    #[test]
    fn properties_with_missing_or_mistyped_values_are_left_empty() {
        let mut props: HashMap<String, OwnedValue> = HashMap::new();
        props.insert("Name".into(), OwnedValue::from(7u32));
        props.insert("IdleHint".into(), OwnedValue::from(true));
        let s = from_properties(&props);
        assert_eq!(s.user, "", "a number is no name");
        assert!(s.idle_hint);
        assert_eq!(s.seat, "");
    }
}
