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
//! report: its connection reads the frame ([`parse`] into a [`ReportPatch`]) and its host
//! table, which holds that report, moves the fields in ([`ReportPatch::apply_to`]). The first report of every connection is whole, so a daemon and a
//! broker of different versions talk as before (an older broker offers nothing; an older
//! daemon never sends changes).

use std::{fmt, mem::ManuallyDrop};

use serde::{
    de::{IgnoredAny, MapAccess, Visitor},
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

/// What applying a frame found (the tests' look at [`parse`] and
/// [`ReportPatch::apply_to`] together).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// The frame's counter (now `report.seq`).
    pub seq: u64,
    /// Fields it changed (0: the last report again but for its counter).
    pub fields: usize,
}

/// Applies the frame `text` to `report` (the connection's last report): its `seq` and each
/// field it names. On an error `report` is unchanged.
#[cfg(test)]
pub fn apply(text: &str, report: &mut HostReport) -> serde_json::Result<Applied> {
    let mut patch = parse(text)?;
    let (seq, fields) = (patch.seq, patch.fields.len());
    patch.apply_to(report);
    Ok(Applied { seq, fields })
}

/// Reads the frame `text` into the fields it names ([`ReportPatch`]), to be applied where
/// the connection's last report is kept.
pub fn parse(text: &str) -> serde_json::Result<ReportPatch> {
    let mut de = serde_json::Deserializer::from_str(text);
    let patch = (&mut de).deserialize_map(ReadPatch)?;
    de.end()?;
    Ok(patch)
}

/// A set of [`HostReport`]'s fields (`seq` aside): one bit each, in the order of
/// `changeable_fields!`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fields(u32);

macro_rules! field_names {
    ($($f:ident),*) => { [$(stringify!($f)),*] };
}

/// The changeable fields' names, in the order of their bits.
const FIELD_NAMES: &[&str] = &changeable_fields!(field_names);

impl Fields {
    pub const TRIGGER: Fields = Fields::named("trigger");
    pub const LABELS: Fields = Fields::named("labels");
    pub const ALLOCS_RUNNING: Fields = Fields::named("allocs_running");
    /// The fields that move with (nearly) every report of a busy host: the load, the idle
    /// times, the memory free. A row's [`crate::row_parts::FixedPart`] writes what they
    /// give after the rest ([`crate::row_parts::write_moving`]), so that a report that
    /// changes only these leaves the text of the rest as it was.
    pub const MOVING: Fields = Fields::named("load")
        .with(Fields::named("cpu_util"))
        .with(Fields::named("mem_available_kb"))
        .with(Fields::named("users"))
        .with(Fields::named("console_idle_s"))
        .with(Fields::named("managed_procs"))
        .with(Fields::named("job_load"));

    /// The field called `name` (compile-time: a name that is no changeable field does not
    /// compile where a constant is made of it).
    pub const fn named(name: &str) -> Fields {
        let mut i = 0;
        while i < FIELD_NAMES.len() {
            if const_str_eq(FIELD_NAMES[i], name) {
                return Fields(1 << i);
            }
            i += 1;
        }
        panic!("not a changeable field of HostReport")
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    #[cfg(test)]
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub fn contains(self, other: Fields) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn without(self, other: Fields) -> Fields {
        Fields(self.0 & !other.0)
    }

    pub const fn with(self, other: Fields) -> Fields {
        Fields(self.0 | other.0)
    }

    /// The names of the fields in the set, in bit order.
    #[cfg(test)]
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        FIELD_NAMES
            .iter()
            .enumerate()
            .filter(move |(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, name)| *name)
    }
}

const _: () = assert!(FIELD_NAMES.len() <= 32, "one bit a field in a u32");

const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A `report_changes` frame read, not yet applied: its counter and the new values of the
/// fields it names. Reading it needs no earlier report, so a host daemon's connection reads
/// its frames while the one copy of the host's last report stays with the broker's host
/// table, which applies each (at 10k hosts whose every report changes, the connection's
/// own copy, changed and then copied whole for the table, was a tenth of the broker's CPU).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReportPatch {
    /// The frame's counter.
    pub seq: u64,
    fields: Fields,
    /// The named fields' new values; the others are left at their defaults, which own no
    /// memory. Dropping the patch drops the named fields alone ([`Drop`]): a patch is read
    /// on the host daemons' thread and applied on the core's, where each line of it is a
    /// cache miss, and a whole report's drop (or move) reads every line of it, ~7 at 10k
    /// hosts whose every report changes, where a changing report names two or three.
    values: ManuallyDrop<HostReport>,
}

impl Drop for ReportPatch {
    fn drop(&mut self) {
        macro_rules! drop_named {
            ($($f:ident),*) => {
                $(
                    if self.fields.contains(const { Fields::named(stringify!($f)) }) {
                        self.values.$f = Default::default();
                    } else {
                        debug_assert!(
                            self.values.$f == HostReport::default().$f,
                            "a field the patch does not name holds a value, which its drop leaks"
                        );
                    }
                )*
            };
        }
        changeable_fields!(drop_named);
    }
}

impl ReportPatch {
    /// The fields the frame names.
    pub fn fields(&self) -> Fields {
        self.fields
    }

    /// The new `allocs_running`, when the frame names it, taken out of the patch (the
    /// broker passes it on apart from the host's report).
    pub fn take_allocs_running(&mut self) -> Option<Option<Vec<u64>>> {
        if !self.fields.contains(Fields::ALLOCS_RUNNING) {
            return None;
        }
        self.fields = self.fields.without(Fields::ALLOCS_RUNNING);
        Some(self.values.allocs_running.take())
    }

    /// Applies the patch to `report` (the connection's last report): its counter, and each
    /// field it names, moved in. Returns the named fields whose value differed. Taken by
    /// reference, so that a boxed patch is not moved (read) whole; the patch then holds
    /// the values it replaced, dropped with it: apply a patch once.
    pub fn apply_to(&mut self, report: &mut HostReport) -> Fields {
        let mut differed = Fields::default();
        macro_rules! move_in {
            ($($f:ident),*) => {
                $(
                    let bit = const { Fields::named(stringify!($f)) };
                    if self.fields.contains(bit) && report.$f != self.values.$f {
                        std::mem::swap(&mut report.$f, &mut self.values.$f);
                        differed = differed.with(bit);
                    }
                )*
            };
        }
        changeable_fields!(move_in);
        report.seq = self.seq;
        differed
    }
}

/// Reads a frame's fields into a [`ReportPatch`].
struct ReadPatch;

impl<'de> Visitor<'de> for ReadPatch {
    type Value = ReportPatch;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {TAG} frame")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ReportPatch, A::Error> {
        use serde::de::Error;
        let mut patch = ReportPatch::default();
        let (mut tag, mut seq) = (false, None);
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
                            patch.values.$f = map.next_value()?;
                            patch.fields = patch.fields.with(const { Fields::named(stringify!($f)) });
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
        patch.seq = seq.ok_or_else(|| A::Error::missing_field("seq"))?;
        Ok(patch)
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

    /// A frame read names its fields; applied, it says which of them differed; the
    /// allocations running come out apart.
    #[test]
    fn a_read_frame_names_its_fields_and_says_which_differed() {
        let old = full();
        let mut new = old.clone();
        new.seq = 8;
        new.load = Some([2.0, 1.0, 0.5]);
        new.labels = vec!["linux".into()];
        new.allocs_running = Some(vec![4]);
        let text = encode(&old, &new).expect("encode");
        // And `cpus` named with the value it had.
        let text = text.replacen('}', r#","cpus":8}"#, 1);
        let mut patch = parse(&text).expect("parse");
        assert_eq!(
            patch.fields().names().collect::<Vec<_>>(),
            ["cpus", "load", "labels", "allocs_running"]
        );
        assert_eq!(patch.take_allocs_running(), Some(Some(vec![4])));
        assert_eq!(patch.take_allocs_running(), None);
        let mut applied = old.clone();
        let differed = patch.apply_to(&mut applied);
        assert_eq!(
            differed.names().collect::<Vec<_>>(),
            ["load", "labels"],
            "cpus had that value"
        );
        assert!(differed.contains(Fields::LABELS) && !differed.contains(Fields::TRIGGER));
        assert_eq!(
            applied,
            HostReport {
                allocs_running: old.allocs_running.clone(),
                ..new
            }
        );
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
