//! The typed inputs a policy reads: plain structs the broker fills from host reports, job
//! records and the RSL spec. Every number a policy compares or adds is an `i64` (CEL `int`)
//! or an `f64` (CEL `double`); an `Option` that is `None` is CEL `null` (unknown).
//!
//! Field names are the names a policy uses (`host.load1`, `job.spec.count`); they are
//! documented in `policies/README.md` ("Variables").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What `keyboard_idle_s` / `owner_idle_s` say when every source was read and none has a
/// person on it (no login session and no console in use): ten years, so `>= 300` holds.
pub const NEVER_USED_S: i64 = 10 * 365 * 24 * 3600;

/// One login session on a host (utmp).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub user: String,
    pub tty: String,
    /// Seconds since the last input on this terminal; `None` when unknown (never idle).
    pub idle_s: Option<i64>,
}

/// `host`: one machine of the lab, as its last report and the allocator describe it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostFacts {
    pub name: String,
    /// Lab-file and sensor labels, lower-case.
    pub labels: Vec<String>,
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
        self.owner_idle_s = self.idle_of(|s| owner.as_deref() == Some(s.user.as_str()));
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
            "owner_idle_s" => self.owner_idle_s == other.owner_idle_s,
            "keyboard_idle_s" => self.keyboard_idle_s == other.keyboard_idle_s,
            "held_by" => self.held_by == other.held_by,
            "held_for_s" => self.held_for_s == other.held_for_s,
            "job_load" => self.job_load == other.job_load,
            "other_load" => self.other_load == other.other_load,
            _ => false,
        }
    }

    /// The least idle time over the sessions `counts` picks and the console. `None`
    /// ("unknown", never away) whenever a source that could show someone active cannot be
    /// read: the sessions, one of the picked sessions' idle times, or the console (an
    /// unknown console is no evidence that nobody is at it: a Wayland desktop's input shows
    /// in none of the device files a host daemon can read).
    fn idle_of(&self, counts: impl Fn(&Session) -> bool) -> Option<i64> {
        let sessions = self.users.as_ref()?;
        let mut least = self.console_idle_s?;
        for s in sessions.iter().filter(|s| counts(s)) {
            least = least.min(s.idle_s?);
        }
        Some(least)
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
            labels: vec!["linux".into()],
            owner: Some("ann".into()),
            load1: Some(0.5),
            load5: Some(0.5),
            load15: Some(0.5),
            cpus: 4,
            mem_avail_mb: Some(1024),
            users: Some(vec![session("ann", Some(30))]),
            console_idle_s: Some(40),
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
}
