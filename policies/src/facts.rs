//! The typed inputs a policy reads: plain structs the broker fills from host reports, job
//! records and the RSL spec. Every number a policy compares or adds is an `i64` (CEL `int`)
//! or an `f64` (CEL `double`); an `Option` that is `None` is CEL `null` (unknown).
//!
//! Field names are the names a policy uses (`host.load1`, `job.spec.count`); they are
//! documented in `policies/README.md` ("Variables").

use std::{collections::BTreeMap, sync::Arc};

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// What `keyboard_idle_s` / `owner_idle_s` say when every source was read and none has a
/// person on it (no login session and no console in use): ten years, so `>= 300` holds.
pub const NEVER_USED_S: i64 = 10 * 365 * 24 * 3600;

/// One login session on a host (utmp).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub user: CompactString,
    pub tty: CompactString,
    /// Seconds since the last input on this terminal; `None` when unknown (never idle).
    pub idle_s: Option<i64>,
}

/// [`LoginSession::idle_source`] of a session whose desktop says it is in use now
/// (`IdleHint` false; the host daemon's `IdleSource::LogindActive`).
pub const LOGIND_ACTIVE: &str = "logind IdleHint=no";

/// One session as logind lists it (`host.sessions`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoginSession {
    pub user: String,
    /// `seat0`; `None` for a session on no seat.
    pub seat: Option<String>,
    pub tty: Option<String>,
    /// The X11 display (`:0`).
    pub display: Option<String>,
    /// `user`, `greeter`, `lock-screen`, `background`, …
    pub class: String,
    /// `x11`, `wayland`, `tty`, `unspecified`, …
    #[serde(rename = "type")]
    pub kind: String,
    pub remote: bool,
    /// In the foreground of its seat.
    pub active: bool,
    pub locked: bool,
    /// Seconds without input; `None`: no source says (never idle).
    pub idle_s: Option<i64>,
    /// Where `idle_s` comes from (`logind IdleHint=no`, `logind IdleSinceHint`, `tty atime`,
    /// `no source`).
    pub idle_source: String,
    /// Can stand for a person at a keyboard: class `user` or `lock-screen`, with a terminal
    /// or a desktop, and not the host daemon's own login. Only these count in the idle
    /// times.
    pub person: bool,
    /// At the machine itself (on a seat, or not remote).
    pub local: bool,
}

/// `host`: one machine of the lab, as its last report and the allocator describe it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostFacts {
    pub name: String,
    /// Lab-file and sensor labels, lower-case. Shared with the allocator's view of the host
    /// (cloning or comparing the facts compares no label when they hold the same list).
    pub labels: Arc<[String]>,
    /// The owner of a private machine (`None`: public).
    pub owner: Option<String>,
    /// `owner.is_some()`.
    pub private: bool,
    pub up: bool,
    pub drained: bool,
    pub load1: Option<f64>,
    pub load5: Option<f64>,
    pub load15: Option<f64>,
    pub cpus: i64,
    pub mem_avail_mb: Option<i64>,
    /// Logged-in sessions; `None` when they could not be read.
    pub users: Option<Vec<Session>>,
    /// Seconds since the last console (keyboard/mouse) input; `None`: unknown, never idle.
    pub console_idle_s: Option<i64>,
    /// The sessions logind lists; `None` when logind could not be read.
    pub sessions: Option<Vec<LoginSession>>,
    /// Someone uses the machine's console now, as logind says: a person's local session in
    /// the foreground of its seat, unlocked, with `IdleHint` false. `None` without logind.
    pub console_active: Option<bool>,
    /// The foreground local sessions of people are all locked (false when there is none).
    /// `None` without logind.
    pub locked: Option<bool>,
    /// Seconds since the owner last typed: the owner's sessions and the console.
    /// `None` when one of those is unknown, the console included.
    pub owner_idle_s: Option<i64>,
    /// Seconds since anyone last typed (HTCondor `KeyboardIdle`): every session and the
    /// console. `None` when one of them is unknown, the console included.
    pub keyboard_idle_s: Option<i64>,
    /// The job holding this host (`None`: free).
    pub held_by: Option<i64>,
    /// Seconds the holder has held it (0 when free).
    pub held_for_s: i64,
    /// Load of broker jobs' processes here (HTCondor `CondorLoadAvg`).
    pub job_load: f64,
    /// `load1 - job_load`, never below 0 (HTCondor `NonCondorLoadAvg`); `None` when `load1`
    /// is unknown.
    pub other_load: Option<f64>,
}

impl HostFacts {
    /// Fills the derived fields (`private`, `owner_idle_s`, `keyboard_idle_s`,
    /// `other_load`) from the raw ones, so that every caller derives them alike.
    pub fn derive(mut self) -> Self {
        self.private = self.owner.is_some();
        self.keyboard_idle_s = self.idle_of(|_| true);
        let owner = self.owner.clone();
        self.owner_idle_s = self.idle_of(|user| owner.as_deref() == Some(user));
        let foreground = |s: &&LoginSession| s.person && s.local && s.active;
        self.console_active = self.sessions.as_ref().map(|ss| {
            ss.iter()
                .filter(foreground)
                .any(|s| !s.locked && s.idle_source == LOGIND_ACTIVE)
        });
        self.locked = self.sessions.as_ref().map(|ss| {
            let mut fg = ss.iter().filter(foreground).peekable();
            fg.peek().is_some() && fg.all(|s| s.locked)
        });
        // Never below 0: `load1` and `job_load` are sampled and averaged apart.
        self.other_load = self.load1.map(|l| (l - self.job_load).max(0.0));
        self
    }

    /// Whether `self` and `other` agree on the field a policy names `host.FIELD`; false for
    /// a name that is no field. Cheaper than comparing serialized values: asked per report.
    pub fn same_field(&self, other: &HostFacts, field: &str) -> bool {
        match field {
            "name" => self.name == other.name,
            "labels" => self.labels == other.labels,
            "owner" => self.owner == other.owner,
            "private" => self.private == other.private,
            "up" => self.up == other.up,
            "drained" => self.drained == other.drained,
            "load1" => self.load1 == other.load1,
            "load5" => self.load5 == other.load5,
            "load15" => self.load15 == other.load15,
            "cpus" => self.cpus == other.cpus,
            "mem_avail_mb" => self.mem_avail_mb == other.mem_avail_mb,
            "users" => self.users == other.users,
            "console_idle_s" => self.console_idle_s == other.console_idle_s,
            "sessions" => self.sessions == other.sessions,
            "console_active" => self.console_active == other.console_active,
            "locked" => self.locked == other.locked,
            "owner_idle_s" => self.owner_idle_s == other.owner_idle_s,
            "keyboard_idle_s" => self.keyboard_idle_s == other.keyboard_idle_s,
            "held_by" => self.held_by == other.held_by,
            "held_for_s" => self.held_for_s == other.held_for_s,
            "job_load" => self.job_load == other.job_load,
            "other_load" => self.other_load == other.other_load,
            _ => false,
        }
    }

    /// The least idle time over the utmp sessions of the users `counts` picks, the console
    /// and logind's sessions of people (the local ones of anyone: they are at the console;
    /// a remote one only for its user). `None` ("unknown", never away) whenever a source
    /// that could show someone active cannot be read: the utmp sessions, a counted session's
    /// idle time, or the console when logind cannot stand in for it (an unknown console is
    /// no evidence that nobody sits at it: a Wayland desktop's input shows in no file a
    /// host daemon can read). [`NEVER_USED_S`] when every source was read and shows nobody.
    fn idle_of(&self, counts: impl Fn(&str) -> bool) -> Option<i64> {
        let utmp = self.users.as_ref()?;
        let logind = self.sessions.as_deref();
        if self.console_idle_s.is_none() && logind.is_none() {
            return None;
        }
        let mut least = self.console_idle_s;
        let people = logind.unwrap_or_default().iter().filter(|s| s.person);
        let idles = utmp
            .iter()
            .filter(|s| counts(&s.user))
            .map(|s| s.idle_s)
            .chain(
                people
                    .filter(|s| s.local || counts(&s.user))
                    .map(|s| s.idle_s),
            );
        for idle in idles {
            let idle = idle?;
            least = Some(least.map_or(idle, |l| l.min(idle)));
        }
        Some(least.unwrap_or(NEVER_USED_S))
    }

    /// Why a private host is not away now, in a few words for `rb status` (`owner active
    /// (logind seat0, wayland)`, `idle unknown: no readable source`); `None` when its owner
    /// is away (or it is public).
    pub fn not_away_reason(&self, away_s: i64) -> Option<String> {
        if !self.private {
            return None;
        }
        let Some(idle) = self.owner_idle_s else {
            return Some(format!("idle unknown: {}", self.unknown_reason()));
        };
        if idle >= away_s {
            return None;
        }
        let owner = self.owner.as_deref().unwrap_or_default();
        let logind = self
            .sessions
            .iter()
            .flatten()
            .find(|s| s.person && (s.local || s.user == owner) && s.idle_s == Some(idle));
        let utmp = self
            .users
            .iter()
            .flatten()
            .find(|s| s.user == owner && s.idle_s == Some(idle));
        let who = |user: &str| if user == owner { "owner" } else { "someone" };
        Some(match (logind, utmp) {
            (Some(s), _) => {
                let seatless = if s.local { "local" } else { "remote" };
                let place = s.seat.as_deref().or(s.tty.as_deref()).unwrap_or(seatless);
                let what = if s.idle_source == LOGIND_ACTIVE {
                    "active".to_string()
                } else {
                    format!("active {idle} s ago")
                };
                format!(
                    "{} {what} (logind {place}, {}, {})",
                    who(&s.user),
                    s.kind,
                    s.user
                )
            }
            (None, Some(s)) => format!("owner active {idle} s ago (utmp {})", s.tty),
            (None, None) => format!("console used {idle} s ago"),
        })
    }

    /// Which source left the owner's idle time unknown.
    fn unknown_reason(&self) -> String {
        let Some(utmp) = &self.users else {
            return "login sessions (utmp) unreadable".into();
        };
        if self.console_idle_s.is_none() && self.sessions.is_none() {
            return "no readable source (console unknown, logind not read)".into();
        }
        let owner = self.owner.as_deref().unwrap_or_default();
        if let Some(s) = utmp.iter().find(|s| s.user == owner && s.idle_s.is_none()) {
            return format!("no idle time for {}'s session on {}", s.user, s.tty);
        }
        let unknown = self
            .sessions
            .iter()
            .flatten()
            .find(|s| s.person && (s.local || s.user == owner) && s.idle_s.is_none());
        match unknown {
            Some(s) => format!("no idle time for {}'s {} session (logind)", s.user, s.kind),
            None => "no readable source".into(),
        }
    }
}

/// One value of an RSL relation, as `job.spec.KEY` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SpecValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<SpecValue>),
}

/// `job` (and `holder`): a job known to the broker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobFacts {
    pub id: i64,
    pub user: String,
    pub adaptive: bool,
    /// The module name for module jobs (`None`: a plain job).
    pub module: Option<String>,
    /// The machine its agent runs on.
    pub host: String,
    /// Hosts asked for now; `min` / `max` from the RSL (`None` when not given).
    pub count: i64,
    pub min: Option<i64>,
    pub max: Option<i64>,
    pub hosts_held: i64,
    /// Requests of this job waiting in the queue.
    pub waiting: i64,
    /// Seconds its oldest waiting request has waited (double): set for `overflow`, which
    /// is asked about waiting requests; 0 in the other hooks.
    #[serde(default)]
    pub waited_s: f64,
    /// When the job started, unix seconds.
    pub started_s: i64,
    /// Every other RSL relation, by attribute name (lower-case).
    pub spec: BTreeMap<String, SpecValue>,
    /// The job's weight in the fair partition: the policy's `share` for it (default 1),
    /// for `may_preempt` and `preempt_rank` to weigh `hosts_held` by. The `share` hook
    /// itself may not read it.
    pub share: f64,
}

impl Default for JobFacts {
    fn default() -> Self {
        JobFacts {
            id: 0,
            user: String::new(),
            adaptive: false,
            module: None,
            host: String::new(),
            count: 0,
            min: None,
            max: None,
            hosts_held: 0,
            waiting: 0,
            waited_s: 0.0,
            started_s: 0,
            spec: BTreeMap::new(),
            share: 1.0,
        }
    }
}

/// `user`: the job's user across the lab.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UserFacts {
    pub name: String,
    pub jobs: i64,
    pub hosts_held: i64,
}

/// `lab`: lab-wide counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LabFacts {
    pub hosts: i64,
    pub free_hosts: i64,
    pub jobs: i64,
    pub adaptive_jobs: i64,
    pub users: i64,
}

/// `now`: the decision's time, with hour and weekday in the broker's local time zone.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NowFacts {
    /// Unix seconds.
    pub unix: i64,
    /// 0..=23, local time.
    pub hour: i64,
    /// 0 = Sunday .. 6 = Saturday, local time (as `date +%w`).
    pub weekday: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(user: &str, idle_s: Option<i64>) -> Session {
        Session {
            user: user.into(),
            tty: "pts/0".into(),
            idle_s,
        }
    }

    /// Every field a policy can read is compared, and only that field: changing one field
    /// of a full sample makes exactly that name differ.
    #[test]
    fn same_field_compares_each_field_and_only_it() {
        let sample = HostFacts {
            name: "node01".into(),
            labels: vec!["linux".into()].into(),
            owner: Some("ann".into()),
            load1: Some(0.5),
            load5: Some(0.5),
            load15: Some(0.5),
            cpus: 4,
            mem_avail_mb: Some(1024),
            users: Some(vec![session("ann", Some(30))]),
            console_idle_s: Some(40),
            sessions: Some(vec![login("ann", true, Some(0))]),
            held_by: Some(7),
            held_for_s: 9,
            job_load: 0.25,
            ..HostFacts::default()
        }
        .derive();
        let serde_json::Value::Object(fields) = serde_json::to_value(&sample).expect("json") else {
            panic!("facts serialize to an object");
        };
        for (name, value) in &fields {
            assert!(sample.same_field(&sample, name), "{name} equal to itself");
            let changed = match value {
                serde_json::Value::Bool(b) => serde_json::json!(!b),
                serde_json::Value::Number(n) => match n.as_i64() {
                    Some(i) => serde_json::json!(i + 1),
                    None => serde_json::json!(n.as_f64().unwrap_or(0.0) + 1.0),
                },
                serde_json::Value::String(s) => serde_json::json!(format!("{s}x")),
                serde_json::Value::Array(_) => serde_json::json!([]),
                other => panic!("{name}: sample field {other} is not set"),
            };
            let mut json = fields.clone();
            json.insert(name.clone(), changed);
            let other: HostFacts =
                serde_json::from_value(serde_json::Value::Object(json)).expect("facts back");
            for each in fields.keys() {
                assert_eq!(
                    sample.same_field(&other, each),
                    each != name,
                    "{name} changed, {each} compared"
                );
            }
        }
        assert!(!sample.same_field(&sample, "no_such_field"));
    }

    /// A local wayland session on seat0 (remote: an ssh session on no seat) of `user`.
    fn login(user: &str, local: bool, idle_s: Option<i64>) -> LoginSession {
        LoginSession {
            user: user.into(),
            seat: local.then(|| "seat0".into()),
            tty: (!local).then(|| "pts/1".into()),
            display: None,
            class: "user".into(),
            kind: if local { "wayland" } else { "tty" }.into(),
            remote: !local,
            active: local,
            locked: false,
            idle_s,
            idle_source: match idle_s {
                Some(0) if local => LOGIND_ACTIVE.into(),
                Some(_) => "logind IdleSinceHint".into(),
                None => "no source".into(),
            },
            person: true,
            local,
        }
    }

    #[test]
    fn derive_takes_the_least_idle_and_unknown_wins() {
        let h = HostFacts {
            owner: Some("ann".into()),
            users: Some(vec![session("ann", Some(900)), session("bob", Some(20))]),
            console_idle_s: Some(600),
            load1: Some(1.5),
            job_load: 1.0,
            ..HostFacts::default()
        }
        .derive();
        assert!(h.private);
        assert_eq!(h.keyboard_idle_s, Some(20));
        assert_eq!(h.owner_idle_s, Some(600));
        assert_eq!(h.other_load, Some(0.5));
        let busier = HostFacts {
            job_load: 2.0,
            ..h.clone()
        }
        .derive();
        assert_eq!(busier.other_load, Some(0.0), "never below 0");
        let unknown = HostFacts {
            users: Some(vec![session("bob", None)]),
            ..h.clone()
        }
        .derive();
        assert_eq!(unknown.keyboard_idle_s, None);
        assert_eq!(unknown.owner_idle_s, Some(600));
        let console_unknown = HostFacts {
            users: Some(vec![]),
            console_idle_s: None,
            ..h
        }
        .derive();
        assert_eq!(console_unknown.keyboard_idle_s, None, "never NEVER_USED_S");
        assert_eq!(console_unknown.owner_idle_s, None);
        let unread = HostFacts::default().derive();
        assert_eq!(unread.keyboard_idle_s, None);
    }

    /// Every combination of the sources: utmp unread / empty / a session of the owner or
    /// of someone else, with a known or unknown idle time; the console known or unknown.
    /// Unknown wins whenever the unknown source could show the person asked about active.
    #[test]
    fn idle_of_every_combination_of_known_and_unknown_sources() {
        type Users = Option<Vec<Session>>;
        let users: [(&str, Users); 6] = [
            ("utmp unread", None),
            ("nobody", Some(vec![])),
            ("ann 100 s", Some(vec![session("ann", Some(100))])),
            ("ann unknown", Some(vec![session("ann", None)])),
            ("bob 50 s", Some(vec![session("bob", Some(50))])),
            ("bob unknown", Some(vec![session("bob", None)])),
        ];
        for (what, users) in users {
            for console in [Some(400), None] {
                let h = HostFacts {
                    owner: Some("ann".into()),
                    users: users.clone(),
                    console_idle_s: console,
                    ..HostFacts::default()
                }
                .derive();
                let (keyboard, owner) = match (what, console) {
                    (_, None) | ("utmp unread", _) => (None, None),
                    ("nobody", Some(c)) => (Some(c), Some(c)),
                    ("ann 100 s", _) => (Some(100), Some(100)),
                    ("ann unknown", _) => (None, None),
                    ("bob 50 s", Some(c)) => (Some(50), Some(c)),
                    ("bob unknown", Some(c)) => (None, Some(c)),
                    _ => unreachable!("{what}"),
                };
                let case = format!("{what}, console {console:?}");
                assert_eq!(h.keyboard_idle_s, keyboard, "keyboard: {case}");
                assert_eq!(h.owner_idle_s, owner, "owner: {case}");
            }
        }
    }

    /// With logind: every combination of the console (known, unknown), logind (unread,
    /// read) and its sessions (none; ann's or bob's, local or remote; idle known or
    /// unknown; a greeter; the daemon's own login; a remote command without a terminal).
    /// Logind read stands in for an unknown console; a local session counts for everyone,
    /// a remote one only for its user; sessions that are no person never count.
    #[test]
    fn idle_of_every_combination_with_logind() {
        let greeter = LoginSession {
            class: "greeter".into(),
            person: false,
            ..login("gdm", true, Some(0))
        };
        let own = LoginSession {
            person: false,
            ..login("rb", false, None)
        };
        let command = LoginSession {
            tty: None,
            kind: "unspecified".into(),
            person: false,
            ..login("carol", false, None)
        };
        type Sessions = Option<Vec<LoginSession>>;
        let cases: Vec<(&str, Sessions, Option<i64>, Option<i64>)> = vec![
            // (what, logind, keyboard when console unknown, owner when console unknown)
            ("logind unread", None, None, None),
            (
                "nobody",
                Some(vec![]),
                Some(NEVER_USED_S),
                Some(NEVER_USED_S),
            ),
            (
                "ann local active",
                Some(vec![login("ann", true, Some(0))]),
                Some(0),
                Some(0),
            ),
            (
                "ann local idle 900",
                Some(vec![login("ann", true, Some(900))]),
                Some(900),
                Some(900),
            ),
            (
                "ann local unknown",
                Some(vec![login("ann", true, None)]),
                None,
                None,
            ),
            (
                "bob local active",
                Some(vec![login("bob", true, Some(0))]),
                Some(0),
                Some(0),
            ),
            (
                "bob remote 20",
                Some(vec![login("bob", false, Some(20))]),
                Some(20),
                Some(NEVER_USED_S),
            ),
            (
                "bob remote unknown",
                Some(vec![login("bob", false, None)]),
                None,
                Some(NEVER_USED_S),
            ),
            (
                "ann remote 30",
                Some(vec![login("ann", false, Some(30))]),
                Some(30),
                Some(30),
            ),
            (
                "greeter",
                Some(vec![greeter.clone()]),
                Some(NEVER_USED_S),
                Some(NEVER_USED_S),
            ),
            (
                "own and command",
                Some(vec![own.clone(), command.clone()]),
                Some(NEVER_USED_S),
                Some(NEVER_USED_S),
            ),
        ];
        for (what, sessions, keyboard, owner) in cases {
            for console in [None, Some(400)] {
                let h = HostFacts {
                    owner: Some("ann".into()),
                    users: Some(vec![]),
                    console_idle_s: console,
                    sessions: sessions.clone(),
                    ..HostFacts::default()
                }
                .derive();
                // A known console caps what logind says; with logind unread it alone counts.
                let with_console = |v: Option<i64>| match (console, v, &sessions) {
                    (None, v, _) => v,
                    (Some(c), _, None) => Some(c),
                    (Some(_), None, _) => None,
                    (Some(c), Some(v), _) => Some(v.min(c)),
                };
                let case = format!("{what}, console {console:?}");
                assert_eq!(
                    h.keyboard_idle_s,
                    with_console(keyboard),
                    "keyboard: {case}"
                );
                assert_eq!(h.owner_idle_s, with_console(owner), "owner: {case}");
            }
        }
        let unread_utmp = HostFacts {
            sessions: Some(vec![]),
            console_idle_s: Some(400),
            ..HostFacts::default()
        }
        .derive();
        assert_eq!(
            unread_utmp.keyboard_idle_s, None,
            "utmp unread stays unknown"
        );
    }

    #[test]
    fn console_active_and_locked_from_the_foreground_sessions() {
        let base = HostFacts {
            owner: Some("ann".into()),
            users: Some(vec![]),
            ..HostFacts::default()
        };
        let with = |sessions: Option<Vec<LoginSession>>| {
            let h = HostFacts {
                sessions,
                ..base.clone()
            }
            .derive();
            (h.console_active, h.locked)
        };
        assert_eq!(with(None), (None, None), "unknown without logind");
        assert_eq!(with(Some(vec![])), (Some(false), Some(false)));
        assert_eq!(
            with(Some(vec![login("ann", true, Some(0))])),
            (Some(true), Some(false))
        );
        let locked = LoginSession {
            locked: true,
            ..login("ann", true, Some(0))
        };
        assert_eq!(with(Some(vec![locked])), (Some(false), Some(true)));
        let idle = login("ann", true, Some(900));
        assert_eq!(with(Some(vec![idle])), (Some(false), Some(false)));
        let remote = login("ann", false, Some(0));
        assert_eq!(with(Some(vec![remote])), (Some(false), Some(false)));
    }

    #[test]
    fn not_away_reason_names_the_source() {
        let h = |users: Option<Vec<Session>>, console, sessions| {
            HostFacts {
                owner: Some("ann".into()),
                users,
                console_idle_s: console,
                sessions,
                ..HostFacts::default()
            }
            .derive()
        };
        let wayland = h(
            Some(vec![]),
            Some(4000),
            Some(vec![login("ann", true, Some(0))]),
        );
        assert_eq!(
            wayland.not_away_reason(300).as_deref(),
            Some("owner active (logind seat0, wayland, ann)")
        );
        let unknown = h(Some(vec![]), None, None);
        assert_eq!(
            unknown.not_away_reason(300).as_deref(),
            Some("idle unknown: no readable source (console unknown, logind not read)")
        );
        let utmp = h(Some(vec![session("ann", Some(12))]), Some(4000), None);
        assert_eq!(
            utmp.not_away_reason(300).as_deref(),
            Some("owner active 12 s ago (utmp pts/0)")
        );
        let away = h(
            Some(vec![]),
            Some(4000),
            Some(vec![login("ann", true, Some(900))]),
        );
        assert_eq!(away.not_away_reason(300), None);
    }
}
