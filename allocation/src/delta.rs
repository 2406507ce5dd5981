//! A host view as the trace records it: the fields that changed since the host's last view
//! ([`Delta`]), computed by the shell for each report ([`host_delta`]) and applied by a
//! replay ([`apply_delta`]).
//!
//! The shell's delta is written as JSON text at once, field by field (only the fields that
//! differ, in the order of their names, as a JSON object's keys come out of a
//! `serde_json::Map`), and the trace line takes the text as it is: each of 10k hosts
//! reports its load and idle times anew every second, and building those fields as JSON
//! values in a map, then serializing the map, was most of the trace's share of the
//! broker's CPU. A delta read back from a trace is a map.

use std::borrow::Cow;

use serde::{ser::SerializeMap, Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{value::RawValue, Map, Value};

use crate::HostView;

/// The fields of a host view that changed, as a JSON object: text the shell wrote, or a map
/// read from a trace. Equal when they hold the same fields and values.
#[derive(Debug, Clone)]
pub struct Delta(Repr);

#[derive(Debug, Clone)]
enum Repr {
    Text(Box<RawValue>),
    Map(Map<String, Value>),
}

impl Delta {
    /// No field changed: a report that repeated the last one.
    pub fn is_empty(&self) -> bool {
        match &self.0 {
            Repr::Text(t) => t.get() == "{}",
            Repr::Map(m) => m.is_empty(),
        }
    }

    /// The fields and their values (text is parsed: a replay's business, not the shell's).
    pub fn to_map(&self) -> Result<Cow<'_, Map<String, Value>>, String> {
        match &self.0 {
            Repr::Map(m) => Ok(Cow::Borrowed(m)),
            Repr::Text(t) => serde_json::from_str(t.get())
                .map(Cow::Owned)
                .map_err(|e| format!("a host delta is not a JSON object: {e}")),
        }
    }
}

impl Default for Delta {
    fn default() -> Self {
        Delta(Repr::Map(Map::new()))
    }
}

impl From<Map<String, Value>> for Delta {
    fn from(m: Map<String, Value>) -> Self {
        Delta(Repr::Map(m))
    }
}

impl PartialEq for Delta {
    fn eq(&self, other: &Self) -> bool {
        match (self.to_map(), other.to_map()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

impl Serialize for Delta {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Repr::Text(t) => t.serialize(s),
            Repr::Map(m) => m.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Delta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Map::deserialize(d).map(Delta::from)
    }
}

/// The fields of `new` that differ from `old` (every field when there is no `old`), the
/// name left out. Compared field by field, so that a report that changed only the load
/// writes only the load (one per host and second at 10k hosts).
pub fn host_delta(old: Option<&HostView>, new: &HostView) -> Delta {
    let Some(old) = old else {
        let Ok(Value::Object(mut all)) = serde_json::to_value(new) else {
            return Delta::default();
        };
        all.remove("name");
        return Delta::from(all);
    };
    // Plain fields (strings, numbers, lists, options): writing them cannot fail.
    serde_json::value::to_raw_value(&Differences { old, new })
        .map(|raw| Delta(Repr::Text(raw)))
        .unwrap_or_default()
}

/// Serializes as the JSON object of the fields of `new` that differ from `old`.
struct Differences<'a> {
    old: &'a HostView,
    new: &'a HostView,
}

impl Serialize for Differences<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let old = self.old;
        // Every field named: a field added to `HostView` does not compile until it is here.
        let HostView {
            name: _,
            address,
            up,
            reported,
            labels,
            os,
            owner,
            load1,
            load5,
            load15,
            mem_avail_mb,
            cpus,
            users,
            console_idle_s,
            logind,
            logind_error,
            job_load,
        } = self.new;
        let mut map = s.serialize_map(None)?;
        macro_rules! fields {
            ($($f:ident),*) => {
                $(
                    if old.$f != *$f {
                        map.serialize_entry(stringify!($f), $f)?;
                    }
                )*
            };
        }
        // In the order of the names, as a map's keys come out.
        fields!(
            address,
            console_idle_s,
            cpus,
            job_load,
            labels,
            load1,
            load15,
            load5
        );
        fields!(
            logind,
            logind_error,
            mem_avail_mb,
            os,
            owner,
            reported,
            up,
            users
        );
        map.end()
    }
}

/// `old` (the host's previous view, if any) with the fields of `changed` applied.
pub fn apply_delta(
    old: Option<&HostView>,
    host: &str,
    changed: &Delta,
) -> Result<HostView, String> {
    let changed = changed
        .to_map()
        .map_err(|e| format!("host `{host}`: {e}"))?;
    let mut map = match old.map(serde_json::to_value) {
        Some(Ok(Value::Object(m))) => m,
        _ => Map::new(),
    };
    for (k, v) in changed.iter() {
        map.insert(k.clone(), v.clone());
    }
    map.insert("name".into(), Value::String(host.to_string()));
    serde_json::from_value(Value::Object(map))
        .map_err(|e| format!("host `{host}`: its view cannot be rebuilt from the trace: {e}"))
}
