//! [`HostView`]: what the allocation core knows about one host, and the per-host rules —
//! symbolic-name parsing and matching ([`Want`]; the naming rules are `proto_types::symbolic`'s),
//! "owner away" for private machines (for wait reasons; decisions are the policy's).
//!
//! Unknown sensor values are never idle: a session whose idle time is unknown counts as
//! active, and a host whose sessions could not be read is not quiet.

use std::sync::Arc;

use proto_types::{
    report::{LogindSession, UserSession},
    symbolic::{check_name, label_name, split_instance},
};

/// A session or console is idle once it has seen no input for this many seconds.
pub const IDLE_AFTER: u64 = 5 * 60;

/// The core's view of one host: its own input type (the broker builds it from the host's
/// status row as it changes; the core never reads that row). Serializable for the
/// decision trace (`trace`), which records the fields that changed.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostView {
    pub name: String,
    pub address: String,
    pub up: bool,
    /// Whether a report ever arrived (before that, sensor labels such as `linux` are missing).
    pub reported: bool,
    /// Lab-file and sensor labels in their name form (`proto_types::symbolic::label_name`:
    /// lower case, `_` read as `-`), as symbolic names spell them. Shared: the hosts of a
    /// lab carry a few lists, so a report neither copies nor compares the strings (at 10k
    /// hosts each string of a host's own was a cache miss a report).
    pub labels: Arc<[String]>,
    pub os: Option<String>,
    /// Set for a private machine (the owner's workstation).
    pub owner: Option<String>,
    pub load1: Option<f64>,
    pub load5: Option<f64>,
    pub load15: Option<f64>,
    /// Available memory, MiB.
    pub mem_avail_mb: Option<u64>,
    pub cpus: Option<u32>,
    /// Logged-in sessions; `None` when unknown.
    pub users: Option<Vec<UserSession>>,
    pub console_idle_s: Option<u64>,
    /// The sessions logind lists; `None` when logind could not be read (or from a daemon
    /// or trace that predates it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logind: Option<Vec<LogindSession>>,
    /// Why `logind` is unknown, as the host daemon said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logind_error: Option<String>,
    /// The load of the lab's job processes there (`HostReport::job_load`); `None` when
    /// unknown. Absent from traces that predate it.
    #[serde(default)]
    pub job_load: Option<f64>,
}

/// What a symbolic host name asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Want {
    /// `anyHost`: every host.
    Any,
    /// `any<Label>`: hosts carrying the label (its name form: `x86-64` for `x86_64`).
    Label(String),
}

/// A parsed symbolic name: what it asks for, and the instance number of `<name>-<N>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub(crate) want: Want,
    pub(crate) instance: Option<u32>,
}

impl Want {
    /// Parses `anyHost` / `any<Label>` / either with an instance suffix `-N`,
    /// case-insensitively. The whole name is matched against the labels first
    /// (`is_label`, given a label's name form): only when no label has that name is a
    /// trailing `-N` an instance (`anyLinux-1`, `anyX86-64-2`). An error for a name that is
    /// not a valid symbolic host name (`anyX86_64`), saying what to use instead.
    pub(crate) fn parse(symbolic: &str, is_label: impl Fn(&str) -> bool) -> Result<Wanted, String> {
        check_name(symbolic).map_err(|e| e.to_string())?;
        let whole = Self::plain(symbolic);
        let whole_is_label = match &whole {
            Some(Want::Label(l)) => is_label(l),
            _ => false,
        };
        if !whole_is_label {
            if let Some((base, n)) = split_instance(symbolic) {
                if let Some(want) = Self::plain(base) {
                    return Ok(Wanted {
                        want,
                        instance: Some(n),
                    });
                }
            }
        }
        whole
            .map(|want| Wanted {
                want,
                instance: None,
            })
            .ok_or_else(|| {
                format!(
                    "`{symbolic}` is not a symbolic host name\n\
                     help: use anyHost, anyLinux or any<Label>, optionally with an instance \
                     number (anyLinux-1)"
                )
            })
    }

    /// `anyHost` / `any<Label>` without instance rules.
    fn plain(symbolic: &str) -> Option<Want> {
        let lower = label_name(symbolic);
        match lower.strip_prefix("any")? {
            "" => None,
            "host" => Some(Want::Any),
            label => Some(Want::Label(label.to_string())),
        }
    }
}

impl HostView {
    /// Whether the host carries what `want` names (ignores up/owner/held).
    pub(crate) fn matches(&self, want: &Want) -> bool {
        match want {
            Want::Any => true,
            Want::Label(l) => self.labels.iter().any(|x| x == l),
        }
    }

    pub fn is_private(&self) -> bool {
        self.owner.is_some()
    }

    /// No session (utmp, or logind's sessions of people) active within [`IDLE_AFTER`] and
    /// the console idle that long. Unknown sessions, a session with unknown idle time or an
    /// unknown console (unless logind, read, stands in for it) make the host not quiet
    /// (nothing says that nobody is at it).
    pub fn quiet(&self) -> bool {
        let idle = |s: Option<u64>| s.is_some_and(|s| s >= IDLE_AFTER);
        let sessions_idle = self
            .users
            .as_ref()
            .is_some_and(|users| users.iter().all(|u| idle(u.idle_s)));
        let people_idle = self.people().all(|s: &LogindSession| idle(s.idle_s));
        let console = match self.console_idle_s {
            Some(s) => s >= IDLE_AFTER,
            None => self.logind.is_some(),
        };
        sessions_idle && people_idle && console
    }

    /// logind's sessions that stand for a person at a keyboard.
    fn people(&self) -> impl Iterator<Item = &LogindSession> {
        self.logind.iter().flatten().filter(|s| s.is_person())
    }

    /// A public host always; a private one only while quiet.
    pub fn owner_away(&self) -> bool {
        !self.is_private() || self.quiet()
    }

    /// Positive evidence that someone is using a private host: an up host whose report shows
    /// a session or the console used within [`IDLE_AFTER`].
    pub fn owner_active(&self) -> bool {
        let recent = |s: u64| s < IDLE_AFTER;
        let session = self
            .users
            .iter()
            .flatten()
            .any(|u| u.idle_s.is_some_and(recent))
            || self.people().any(|s| s.idle_s.is_some_and(recent));
        self.is_private() && self.up && (session || self.console_idle_s.is_some_and(recent))
    }

    /// How many distinct labels the host carries (lab file and sensors).
    pub(crate) fn label_count(&self) -> usize {
        // The broker's views hold their labels sorted, once each: counted without a copy.
        if self.labels.windows(2).all(|pair| pair[0] < pair[1]) {
            return self.labels.len();
        }
        let mut labels: Vec<&str> = self.labels.iter().map(String::as_str).collect();
        labels.sort_unstable();
        labels.dedup();
        labels.len()
    }

    /// `load1 / cpus` (a missing CPU count counts as one); `None` when the load is unknown.
    pub fn load_ratio(&self) -> Option<f64> {
        let cpus = f64::from(self.cpus.unwrap_or(1).max(1));
        self.load1.map(|l| l / cpus)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    impl HostView {
        /// The view with `label` added to its labels (a list of its own).
        pub(crate) fn add_label(&mut self, label: &str) {
            self.labels = self.labels.iter().cloned().chain([label.into()]).collect();
        }
    }

    /// A quiet, up, public linux host with load 0 on 4 CPUs.
    pub(crate) fn view(name: &str) -> HostView {
        HostView {
            name: name.into(),
            address: format!("10.0.0.{}", name.len()),
            up: true,
            reported: true,
            labels: vec!["linux".into(), "x86-64".into()].into(),
            os: Some("Linux".into()),
            owner: None,
            load1: Some(0.0),
            load5: None,
            load15: None,
            mem_avail_mb: None,
            cpus: Some(4),
            users: Some(vec![]),
            // Known and idle for an hour: a host whose console is unknown is never quiet.
            console_idle_s: Some(3600),
            logind: None,
            logind_error: None,
            job_load: None,
        }
    }

    pub(crate) fn session(idle_s: Option<u64>) -> UserSession {
        UserSession {
            user: "alice".into(),
            tty: "pts/0".into(),
            idle_s,
            from: None,
        }
    }

    /// Distinct labels, whether the list comes sorted and once each (the broker's) or not.
    #[test]
    fn the_label_count_is_the_distinct_labels_in_any_order() {
        let count = |labels: &[&str]| {
            let mut v = view("n1");
            v.labels = labels.iter().map(|l| l.to_string()).collect();
            v.label_count()
        };
        assert_eq!(count(&[]), 0);
        assert_eq!(count(&["linux", "public", "x86-64"]), 3);
        assert_eq!(count(&["public", "linux", "public"]), 2);
        assert_eq!(count(&["linux", "linux"]), 1);
        assert_eq!(count(&["x86-64", "linux"]), 2);
    }

    fn parse(name: &str, labels: &[&str]) -> Result<Wanted, String> {
        Want::parse(name, |l| labels.contains(&l))
    }

    fn label(l: &str, instance: Option<u32>) -> Result<Wanted, String> {
        Ok(Wanted {
            want: Want::Label(l.into()),
            instance,
        })
    }

    #[test]
    fn symbolic_names_parse_case_insensitively() {
        let any = Ok(Wanted {
            want: Want::Any,
            instance: None,
        });
        assert_eq!(parse("anyHost", &[]), any);
        assert_eq!(parse("ANYHOST", &[]), any);
        assert_eq!(parse("anyLinux", &[]), label("linux", None));
        assert_eq!(parse("AnyPublic", &[]), label("public", None));
        assert!(parse("any", &[]).is_err());
        assert!(parse("node07", &[]).is_err());
    }

    #[test]
    fn a_label_with_underscore_is_named_with_a_dash() {
        assert_eq!(parse("anyX86-64", &["x86-64"]), label("x86-64", None));
        let err = parse("anyX86_64", &["x86-64"]).expect_err("not a host name");
        assert!(err.contains("use `anyX86-64`"), "{err}");
        let host = HostView {
            labels: vec![label_name("x86_64")].into(),
            ..view("a")
        };
        assert!(host.matches(&Want::Label("x86-64".into())));
    }

    #[test]
    fn a_trailing_number_is_an_instance_unless_a_label_has_the_whole_name() {
        assert_eq!(parse("anyLinux-1", &["linux"]), label("linux", Some(1)));
        assert_eq!(parse("anyPublic-3", &[]), label("public", Some(3)));
        assert_eq!(
            parse("anyHost-2", &[]),
            Ok(Wanted {
                want: Want::Any,
                instance: Some(2)
            })
        );
        // A label named like an instance wins: the name is matched whole first.
        assert_eq!(parse("anyGpu-1", &["gpu-1"]), label("gpu-1", None));
        assert_eq!(parse("anyGpu-1-2", &["gpu-1"]), label("gpu-1", Some(2)));
        assert_eq!(parse("anyX86-64", &["x86-64"]), label("x86-64", None));
        assert_eq!(parse("anyX86-64-2", &["x86-64"]), label("x86-64", Some(2)));
        assert!(parse("anyLinux-", &[]).is_err());
    }

    #[test]
    fn unknown_is_never_idle() {
        let mut v = view("a");
        assert!(v.quiet());
        v.users = None;
        assert!(!v.quiet(), "unknown sessions");
        v.users = Some(vec![session(None)]);
        assert!(!v.quiet(), "session with unknown idle time");
        v.users = Some(vec![session(Some(IDLE_AFTER))]);
        assert!(v.quiet());
        v.console_idle_s = Some(IDLE_AFTER - 1);
        assert!(!v.quiet(), "console used recently");
        v.console_idle_s = None;
        assert!(
            !v.quiet(),
            "an unknown console is no evidence that nobody is at it"
        );
    }

    #[test]
    fn logind_people_count_and_logind_stands_in_for_an_unknown_console() {
        let desktop = |idle_s: Option<u64>, class: &str| LogindSession {
            id: "2".into(),
            user: "alice".into(),
            seat: Some("seat0".into()),
            class: class.into(),
            kind: "wayland".into(),
            active: true,
            idle_s,
            ..LogindSession::default()
        };
        let mut v = view("ws");
        v.owner = Some("alice".into());
        v.console_idle_s = None;
        assert!(!v.quiet(), "console unknown, logind unread");
        v.logind = Some(vec![]);
        assert!(v.quiet(), "logind read: nobody there");
        v.logind = Some(vec![desktop(Some(0), "user")]);
        assert!(!v.quiet() && v.owner_active(), "the owner's desktop in use");
        v.logind = Some(vec![desktop(None, "user")]);
        assert!(!v.quiet() && !v.owner_active(), "unknown: neither");
        v.logind = Some(vec![desktop(Some(0), "greeter")]);
        assert!(v.quiet() && !v.owner_active(), "a greeter is nobody");
        v.logind = Some(vec![desktop(Some(900), "user")]);
        assert!(v.quiet());
    }

    #[test]
    fn private_host_needs_owner_away() {
        let mut v = view("ws");
        v.owner = Some("alice".into());
        assert!(v.owner_away());
        v.users = None;
        assert!(!v.owner_away(), "unknown users on a private host");
        assert!(!v.owner_active(), "unknown is not evidence of activity");
        v.users = Some(vec![session(Some(10))]);
        assert!(!v.owner_away());
        assert!(v.owner_active());
        v.owner = None;
        assert!(
            v.owner_away(),
            "public hosts ignore sessions for eligibility"
        );
        assert!(!v.owner_active());
    }
}
