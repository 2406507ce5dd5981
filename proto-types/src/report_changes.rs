//! A host report sent as what changed since the daemon's last one on the connection:
//! `{"t":"report_changes","seq":N, FIELD: VALUE…}`, each field of [`HostReport`] whose value
//! differs, with its whole new value (`null` for a nullable field that became unknown, `[]`
//! for an emptied list).
//!
//! Why: at 10k hosts whose every report changes, parsing the reports was 2.9 % of a core of
//! the broker's (BENCHMARKS.md, "The sessions counted"): ~600 bytes of JSON a report, most
//! of them the same names, versions and labels as the report before. A daemon whose load
//! and idle times moved sends those few fields instead.
//!
//! Who sends it: a daemon the broker's welcome offered it to (`report_changes: true`), after
//! a whole report on the same connection; the broker applies it to that connection's last
//! report ([`apply`]). The first report of every connection is whole, so a daemon and a
//! broker of different versions talk as before (an older broker offers nothing; an older
//! daemon never sends changes).

use std::fmt;

use serde::{
    de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor},
    ser::SerializeMap,
    Deserializer, Serialize, Serializer,
};

use crate::report::HostReport;

/// The value of the frame's `t`.
pub const TAG: &str = "report_changes";

/// How every such frame begins, as [`Changes`] writes it: the broker takes a frame as one by
/// this beginning (PROTOCOL.md: the tag first), any other is decoded as a whole message.
pub const FRAME_START: &str = "{\"t\":\"report_changes\",";

/// The frame that turns `old` into `new` (`new`'s fields that differ, and its `seq`).
pub fn encode(old: &HostReport, new: &HostReport) -> serde_json::Result<String> {
    serde_json::to_string(&Changes { old, new })
}

/// Serializes as the frame: the tag, `seq`, then each field of `new` that differs from
/// `old`'s (what a daemon sends: `conn.send(&Changes::new(&last, &report))`).
pub struct Changes<'a> {
    old: &'a HostReport,
    new: &'a HostReport,
}

impl<'a> Changes<'a> {
    /// The frame that turns `old` into `new`.
    pub fn new(old: &'a HostReport, new: &'a HostReport) -> Self {
        Changes { old, new }
    }
}

/// Calls `$m!(field, …)` with every field of [`HostReport`] but `seq`: the one list the
/// encoder and the decoder share. [`Changes::serialize`] names every field in a pattern,
/// so a field added to the report does not compile until it is here too.
macro_rules! changeable_fields {
    ($m:ident) => {
        $m!(
            hostname,
            trigger,
            cpus,
            load,
            cpu_util,
            mem_total_kb,
            mem_available_kb,
            os,
            arch,
            kernel,
            users,
            console_idle_s,
            managed_procs,
            job_load,
            labels,
            overlaid,
            logind,
            logind_error,
            warnings,
            allocs_running
        )
    };
}

impl Serialize for Changes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (old, new) = (self.old, self.new);
        // Every field named: one added to `HostReport` fails here until it is listed in
        // `changeable_fields!` (and so both encoded and decoded).
        let HostReport {
            hostname: _,
            seq,
            trigger: _,
            cpus: _,
            load: _,
            cpu_util: _,
            mem_total_kb: _,
            mem_available_kb: _,
            os: _,
            arch: _,
            kernel: _,
            users: _,
            console_idle_s: _,
            managed_procs: _,
            job_load: _,
            labels: _,
            overlaid: _,
            logind: _,
            logind_error: _,
            warnings: _,
            allocs_running: _,
        } = new;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("t", TAG)?;
        map.serialize_entry("seq", seq)?;
        macro_rules! changed {
            ($($f:ident),*) => {
                $(
                    if old.$f != new.$f {
                        map.serialize_entry(stringify!($f), &new.$f)?;
                    }
                )*
            };
        }
        changeable_fields!(changed);
        map.end()
    }
}

/// What applying a frame found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// The frame's counter (now `report.seq`).
    pub seq: u64,
    /// Fields it changed (0: the last report again but for its counter).
    pub fields: usize,
}

/// Applies the frame `text` to `report` (the connection's last report): its `seq` and each
/// field it names. On an error `report` may be half changed: the caller drops it (the
/// connection's frames can no longer be followed).
pub fn apply(text: &str, report: &mut HostReport) -> serde_json::Result<Applied> {
    let mut de = serde_json::Deserializer::from_str(text);
    let applied = ApplyTo(report).deserialize(&mut de)?;
    de.end()?;
    Ok(applied)
}

/// Deserializes a frame's fields straight into the report they change.
struct ApplyTo<'a>(&'a mut HostReport);

impl<'de> DeserializeSeed<'de> for ApplyTo<'_> {
    type Value = Applied;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Applied, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ApplyTo<'_> {
    type Value = Applied;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {TAG} frame")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Applied, A::Error> {
        use serde::de::Error;
        let report = self.0;
        let (mut tag, mut seq, mut fields) = (false, None, 0);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            macro_rules! assign {
                ($($f:ident),*) => {
                    match key.as_ref() {
                        "t" => {
                            let t: std::borrow::Cow<'de, str> = map.next_value()?;
                            if t != TAG {
                                return Err(A::Error::custom(format!("not a {TAG} frame: t={t:?}")));
                            }
                            tag = true;
                        }
                        "seq" => seq = Some(map.next_value()?),
                        $(stringify!($f) => {
                            report.$f = map.next_value()?;
                            fields += 1;
                        })*
                        other => {
                            let _: IgnoredAny = map.next_value()?;
                            return Err(A::Error::unknown_field(other, &["t", "seq", "…"]));
                        }
                    }
                };
            }
            changeable_fields!(assign);
        }
        if !tag {
            return Err(A::Error::missing_field("t"));
        }
        let seq = seq.ok_or_else(|| A::Error::missing_field("seq"))?;
        report.seq = seq;
        Ok(Applied { seq, fields })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{LogindSession, ReportTrigger, UserSession};

    fn full() -> HostReport {
        HostReport {
            hostname: "n01".into(),
            seq: 7,
            trigger: Some(ReportTrigger::Interval),
            cpus: Some(8),
            load: Some([0.42, 0.37, 0.3]),
            cpu_util: Some(0.05),
            mem_total_kb: Some(16_000_000),
            mem_available_kb: Some(12_000_000),
            os: Some("linux".into()),
            arch: Some("x86_64".into()),
            kernel: Some("6.1.0".into()),
            users: Some(vec![UserSession {
                user: "alice".into(),
                tty: "pts/0".into(),
                idle_s: Some(1200),
                from: None,
            }]),
            console_idle_s: Some(3600),
            managed_procs: Some(0),
            job_load: Some(0.0),
            labels: vec!["linux".into(), "x86_64".into()],
            overlaid: vec!["job_load".into()],
            logind: Some(vec![LogindSession::default()]),
            logind_error: Some("no bus".into()),
            warnings: vec!["w".into()],
            allocs_running: Some(vec![3, 4]),
        }
    }

    /// One way to change a report.
    type Change = Box<dyn Fn(&mut HostReport)>;

    /// Each way a field can change (a value, to none or empty, from none), one field at a
    /// time and all at once: the frame applied to the old report gives the new one.
    #[test]
    fn the_frame_turns_the_old_report_into_the_new_one() {
        let old = full();
        let mut changes: Vec<Change> = vec![
            Box::new(|r| r.hostname = "n02".into()),
            Box::new(|r| r.trigger = Some(ReportTrigger::InputActivity)),
            Box::new(|r| r.trigger = None),
            Box::new(|r| r.cpus = None),
            Box::new(|r| r.load = Some([1.0, 0.5, 0.25])),
            Box::new(|r| r.cpu_util = None),
            Box::new(|r| r.mem_total_kb = Some(1)),
            Box::new(|r| r.mem_available_kb = None),
            Box::new(|r| r.os = None),
            Box::new(|r| r.arch = Some("aarch64".into())),
            Box::new(|r| r.kernel = Some("6.12".into())),
            Box::new(|r| {
                if let Some(user) = r.users.as_mut().and_then(|u| u.first_mut()) {
                    user.idle_s = Some(1201);
                }
            }),
            Box::new(|r| r.users = Some(Vec::new())),
            Box::new(|r| r.users = None),
            Box::new(|r| r.console_idle_s = Some(3601)),
            Box::new(|r| r.managed_procs = Some(2)),
            Box::new(|r| r.job_load = None),
            Box::new(|r| r.labels.clear()),
            Box::new(|r| r.overlaid.clear()),
            Box::new(|r| r.logind = None),
            Box::new(|r| r.logind_error = None),
            Box::new(|r| r.warnings.clear()),
            Box::new(|r| r.allocs_running = Some(Vec::new())),
            Box::new(|r| r.allocs_running = None),
        ];
        let all: Change = Box::new(|r| {
            r.load = Some([9.0, 9.0, 9.0]);
            r.users = None;
            r.labels = vec!["a".into()];
            r.logind_error = None;
        });
        changes.push(all);
        for (i, change) in changes.iter().enumerate() {
            let mut new = old.clone();
            new.seq = 8;
            change(&mut new);
            let text = encode(&old, &new).expect("encode");
            assert!(text.starts_with(FRAME_START), "{text}");
            let mut applied = old.clone();
            let got = apply(&text, &mut applied).expect("apply");
            assert_eq!(applied, new, "change {i}: {text}");
            assert_eq!(got.seq, 8);
            assert!(got.fields >= 1, "change {i}: {text}");
            // And from none at all back to the full report.
            let back = encode(&new, &old).expect("encode");
            let mut again = new.clone();
            apply(&back, &mut again).expect("apply back");
            assert_eq!(again, old, "change {i} back: {back}");
        }
    }

    #[test]
    fn an_unchanged_report_is_its_counter_alone() {
        let old = full();
        let mut new = old.clone();
        new.seq = 9;
        let text = encode(&old, &new).expect("encode");
        assert_eq!(text, r#"{"t":"report_changes","seq":9}"#);
        let mut applied = old.clone();
        let got = apply(&text, &mut applied).expect("apply");
        assert_eq!(got, Applied { seq: 9, fields: 0 });
        assert_eq!(applied, new);
    }

    /// A frame that is not one, names an unknown field, lacks its counter or has a value of
    /// the wrong type is an error.
    #[test]
    fn a_bad_frame_is_refused() {
        for bad in [
            r#"{"t":"report","seq":2}"#,
            r#"{"t":"report_changes","seq":2,"bogus":1}"#,
            r#"{"t":"report_changes","cpus":2}"#,
            r#"{"seq":2,"cpus":2}"#,
            r#"{"t":"report_changes","seq":2,"cpus":"many"}"#,
            r#"{"t":"report_changes","seq":2} trailing"#,
            r#"[1,2]"#,
        ] {
            let mut report = full();
            assert!(apply(bad, &mut report).is_err(), "{bad}");
        }
    }
}
