//! Pre-built CEL values of the inputs. Building a value costs more than evaluating an
//! expression on it (REFERENCE-NOTES Part F), so the broker builds a [`HostValue`] once per
//! host report and a [`JobValue`] once per job change, and every evaluation borrows them.

use std::{collections::HashMap, sync::OnceLock};

use cel::common::{
    types::{CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt},
    value::Val,
};

use crate::facts::{
    HostFacts, JobFacts, LabFacts, LoginSession, NowFacts, Session, SpecValue, UserFacts,
};
use crate::fast::Scalar;

/// A value built once from one of the fact structs: its top-level fields as scalars (what
/// the fast path reads) and the CEL map `cel` evaluates on. A value of scalars only (the
/// paper policy's host value) builds its map the first time `cel` reads it, which a policy
/// whose expressions all have fast forms never does: the map's hash table and a box per
/// field were most of the cost of building a host's value at each report.
pub struct Prebuilt {
    /// Each field, a string, list or map as [`Scalar::Other`], in the order built: at most
    /// 22, and a search by name is faster than the map's hash. `None`: built otherwise (the
    /// tests' serde values), every field read through `cel`.
    scalars: Option<Box<[(&'static str, Scalar)]>>,
    map: OnceLock<Box<dyn Val>>,
}

impl std::fmt::Debug for Prebuilt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.val())
    }
}

impl Prebuilt {
    /// Through serde: the tests' reference for the values built by hand.
    #[cfg(test)]
    fn build(facts: &impl serde::Serialize) -> Prebuilt {
        // Conversion of our own structs: strings, i64, f64, bools, options, lists and string
        // keyed maps only, all of which CEL represents; a failure would be a bug here.
        let value = cel::to_value(facts).expect("fact structs hold only CEL-representable fields");
        let val: Box<dyn Val> = value
            .try_into()
            .expect("a serialized fact struct converts to a CEL value");
        Prebuilt {
            scalars: None,
            map: OnceLock::from(val),
        }
    }

    /// The CEL map, built now if it was not.
    pub(crate) fn val(&self) -> &dyn Val {
        let map = self.map.get_or_init(|| {
            let scalars = self.scalars.as_deref().unwrap_or_default();
            let fields = scalars
                .iter()
                .map(|(n, s)| (*n, Field::Scalar(*s)))
                .collect();
            Box::new(CelMap::from(map_of(fields)))
        });
        map.as_ref()
    }

    /// The top-level field `name` as a scalar; `None` when the value has no such field.
    pub(crate) fn scalar(&self, name: &str) -> Option<Scalar> {
        let Some(scalars) = &self.scalars else {
            return Some(Scalar::Other);
        };
        scalars.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
    }
}

/// The CEL value of a scalar field (never [`Scalar::Other`], which is kept in the map).
fn boxed(s: Scalar) -> Boxed {
    match s {
        Scalar::Null | Scalar::Other => Box::new(CelNull),
        Scalar::Bool(b) => Box::new(CelBool::from(b)),
        Scalar::Int(i) => Box::new(CelInt::from(i)),
        Scalar::UInt(u) => Box::new(CelUInt::from(u)),
        Scalar::Double(d) => Box::new(CelDouble::from(d)),
    }
}

macro_rules! prebuilt {
    ($(#[$doc:meta])* $name:ident, $facts:ty, $fields:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(pub(crate) Prebuilt);

        impl $name {
            pub fn new(facts: &$facts) -> Self {
                $name($fields(facts).build())
            }
        }
    };
}

/// `host`, built from [`HostFacts`] when its report arrives. Built field by field rather
/// than through serde (5x cheaper, about 1.6 µs: one per report, thousands per second at 10k
/// hosts); a test checks that both give the same value. The broker builds only the fields
/// its policy reads ([`HostValue::reading`], [`crate::Policy::host_value_fields`]): the
/// paper policy reads 5 of 22, and building and dropping the rest was a sixth of the
/// broker's CPU at 10k hosts.
#[derive(Debug)]
pub struct HostValue(pub(crate) Prebuilt, HostFields);

impl HostValue {
    /// Every field (what `rb policy check` and samples evaluate on).
    pub fn new(h: &HostFacts) -> Self {
        HostValue::reading(h, HostFields::ALL)
    }

    /// Only `fields`: an expression that reads another finds no such key.
    pub fn reading(h: &HostFacts, fields: HostFields) -> Self {
        HostValue(host_fields(h, fields).build(), fields)
    }

    /// Whether it holds every one of `fields`.
    pub fn holds(&self, fields: HostFields) -> bool {
        self.1.contains(fields)
    }
}

/// A set of the top-level fields of `host` (`load1`, `users`…).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFields(u32);

impl HostFields {
    pub const ALL: HostFields = HostFields(u32::MAX);
    pub const NONE: HostFields = HostFields(0);

    /// The fields named; an unknown name gives [`HostFields::ALL`] (never too few).
    pub fn named<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let mut bits = 0u32;
        for name in names {
            match HOST_FIELD_NAMES.iter().position(|n| *n == name) {
                Some(i) => bits |= 1 << i,
                None => return HostFields::ALL,
            }
        }
        HostFields(bits)
    }

    pub fn union(self, other: HostFields) -> HostFields {
        HostFields(self.0 | other.0)
    }

    pub fn contains(self, other: HostFields) -> bool {
        self.0 & other.0 == other.0
    }

    fn has(self, i: usize) -> bool {
        self.0 & (1 << i) != 0
    }

    fn len(self) -> usize {
        (self.0 & ((1 << HOST_FIELD_NAMES.len()) - 1)).count_ones() as usize
    }
}

/// The fields of `host`, each with how it is built from `h` (in bit order).
macro_rules! host_value_fields {
    ($($name:ident => |$h:ident| $build:expr),* $(,)?) => {
        /// The top-level field names of `host`, in [`HostFields`] bit order.
        pub const HOST_FIELD_NAMES: &[&str] = &[$(stringify!($name)),*];

        fn host_fields(h: &HostFacts, fields: HostFields) -> Fields {
            let mut m = Fields::with_capacity(fields.len());
            let mut i = 0;
            $(
                if fields.has(i) {
                    let $h = h;
                    m.put(stringify!($name), $build);
                }
                i += 1;
            )*
            let _ = i;
            m
        }
    };
}

host_value_fields! {
    name => |h| string(&h.name),
    labels => |h| list(h.labels.iter().map(|l| string(l))),
    owner => |h| opt(h.owner.as_deref(), string),
    private => |h| boolean(h.private),
    up => |h| boolean(h.up),
    drained => |h| boolean(h.drained),
    load1 => |h| opt(h.load1, double),
    load5 => |h| opt(h.load5, double),
    load15 => |h| opt(h.load15, double),
    cpus => |h| int(h.cpus),
    mem_avail_mb => |h| opt(h.mem_avail_mb, int),
    users => |h| opt(h.users.as_deref(), |u| list(u.iter().map(session))),
    console_idle_s => |h| opt(h.console_idle_s, int),
    sessions => |h| opt(h.sessions.as_deref(), |s| list(s.iter().map(login_session))),
    console_active => |h| opt(h.console_active, boolean),
    locked => |h| opt(h.locked, boolean),
    owner_idle_s => |h| opt(h.owner_idle_s, int),
    keyboard_idle_s => |h| opt(h.keyboard_idle_s, int),
    held_by => |h| opt(h.held_by, int),
    held_for_s => |h| int(h.held_for_s),
    job_load => |h| double(h.job_load),
    other_load => |h| opt(h.other_load, double),
}

type Boxed = Box<dyn Val>;

/// A value under construction, field by field.
struct Fields(Vec<(&'static str, Field)>);

impl Fields {
    fn with_capacity(n: usize) -> Self {
        Fields(Vec::with_capacity(n))
    }

    fn put(&mut self, key: &'static str, value: Field) {
        self.0.push((key, value));
    }

    /// The CEL map of every field, now (a session's or a login session's).
    fn map(self) -> Field {
        map(map_of(self.0))
    }

    /// The value: its map built now when a field is not a scalar (that field's value is
    /// kept only there), else when `cel` first reads it.
    fn build(self) -> Prebuilt {
        let scalars: Box<[(&'static str, Scalar)]> =
            self.0.iter().map(|(n, f)| (*n, f.scalar())).collect();
        let map = OnceLock::new();
        if scalars.iter().any(|(_, s)| *s == Scalar::Other) {
            let _ = map.set(Box::new(CelMap::from(map_of(self.0))) as Boxed);
        }
        Prebuilt {
            scalars: Some(scalars),
            map,
        }
    }
}

/// The CEL map entries of `fields`.
fn map_of(fields: Vec<(&'static str, Field)>) -> HashMap<CelMapKey<'static>, Boxed> {
    let mut m = HashMap::with_capacity(fields.len());
    for (name, field) in fields {
        m.insert(CelMapKey::from(name), field.boxed());
    }
    m
}

fn session(s: &Session) -> Field {
    let mut m = Fields::with_capacity(3);
    m.put("user", string(&s.user));
    m.put("tty", string(&s.tty));
    m.put("idle_s", opt(s.idle_s, int));
    m.map()
}

fn login_session(s: &LoginSession) -> Field {
    let mut m = Fields::with_capacity(13);
    m.put("user", string(&s.user));
    m.put("seat", opt(s.seat.as_deref(), string));
    m.put("tty", opt(s.tty.as_deref(), string));
    m.put("display", opt(s.display.as_deref(), string));
    m.put("class", string(&s.class));
    m.put("type", string(&s.kind));
    m.put("remote", boolean(s.remote));
    m.put("active", boolean(s.active));
    m.put("locked", boolean(s.locked));
    m.put("idle_s", opt(s.idle_s, int));
    m.put("idle_source", string(&s.idle_source));
    m.put("person", boolean(s.person));
    m.put("local", boolean(s.local));
    m.map()
}

/// One field as built: a scalar (kept unboxed until `cel` reads the value) or a CEL value.
enum Field {
    Scalar(Scalar),
    Value(Boxed),
}

impl Field {
    fn scalar(&self) -> Scalar {
        match self {
            Field::Scalar(s) => *s,
            Field::Value(_) => Scalar::Other,
        }
    }

    fn boxed(self) -> Boxed {
        match self {
            Field::Scalar(s) => boxed(s),
            Field::Value(v) => v,
        }
    }
}

fn string(s: &str) -> Field {
    Field::Value(Box::new(CelString::from(s.to_string())))
}

fn int(i: i64) -> Field {
    Field::Scalar(Scalar::Int(i))
}

fn double(f: f64) -> Field {
    Field::Scalar(Scalar::Double(f))
}

fn boolean(b: bool) -> Field {
    Field::Scalar(Scalar::Bool(b))
}

fn opt<T>(v: Option<T>, some: impl FnOnce(T) -> Field) -> Field {
    v.map_or(Field::Scalar(Scalar::Null), some)
}

fn list(items: impl Iterator<Item = Field>) -> Field {
    let items: Vec<Boxed> = items.map(Field::boxed).collect();
    Field::Value(Box::new(CelList::from(items)))
}

fn map(m: HashMap<CelMapKey<'static>, Boxed>) -> Field {
    Field::Value(Box::new(CelMap::from(m)))
}

// `job`, `user`, `lab` and `now` are built field by field, as `host` is: through serde
// (`cel::to_value`, then a conversion) a job's value cost 15–20 µs, built at every grant
// and give-back (more than half of the allocator's time on an `allocate`). Each builder
// takes its struct apart whole, so that a field added to it does not compile until it is
// here; a test checks each against the serde-built value.
prebuilt!(
    /// `job` or `holder`, built from [`JobFacts`].
    JobValue,
    JobFacts,
    job_fields
);
prebuilt!(
    /// `user`, built from [`UserFacts`].
    UserValue,
    UserFacts,
    user_fields
);
prebuilt!(
    /// `lab`, built from [`LabFacts`].
    LabValue,
    LabFacts,
    lab_fields
);
prebuilt!(
    /// `now`, built from [`NowFacts`] once per decision round.
    NowValue,
    NowFacts,
    now_fields
);

fn job_fields(j: &JobFacts) -> Fields {
    let JobFacts {
        id,
        user,
        adaptive,
        module,
        host,
        count,
        min,
        max,
        hosts_held,
        waiting,
        waited_s,
        started_s,
        spec,
        share,
    } = j;
    let mut m = Fields::with_capacity(14);
    m.put("id", int(*id));
    m.put("user", string(user));
    m.put("adaptive", boolean(*adaptive));
    m.put("module", opt(module.as_deref(), string));
    m.put("host", string(host));
    m.put("count", int(*count));
    m.put("min", opt(*min, int));
    m.put("max", opt(*max, int));
    m.put("hosts_held", int(*hosts_held));
    m.put("waiting", int(*waiting));
    m.put("waited_s", double(*waited_s));
    m.put("started_s", int(*started_s));
    let mut relations = HashMap::with_capacity(spec.len());
    for (name, value) in spec {
        relations.insert(CelMapKey::from(name.clone()), spec_value(value).boxed());
    }
    m.put("spec", map(relations));
    m.put("share", double(*share));
    m
}

fn spec_value(v: &SpecValue) -> Field {
    match v {
        SpecValue::Bool(b) => boolean(*b),
        SpecValue::Int(i) => int(*i),
        SpecValue::Float(f) => double(*f),
        SpecValue::Str(s) => string(s),
        SpecValue::List(items) => list(items.iter().map(spec_value)),
    }
}

fn user_fields(u: &UserFacts) -> Fields {
    let UserFacts {
        name,
        jobs,
        hosts_held,
    } = u;
    let mut m = Fields::with_capacity(3);
    m.put("name", string(name));
    m.put("jobs", int(*jobs));
    m.put("hosts_held", int(*hosts_held));
    m
}

fn lab_fields(l: &LabFacts) -> Fields {
    let LabFacts {
        hosts,
        free_hosts,
        jobs,
        adaptive_jobs,
        users,
    } = l;
    let mut m = Fields::with_capacity(5);
    m.put("hosts", int(*hosts));
    m.put("free_hosts", int(*free_hosts));
    m.put("jobs", int(*jobs));
    m.put("adaptive_jobs", int(*adaptive_jobs));
    m.put("users", int(*users));
    m
}

fn now_fields(n: &NowFacts) -> Fields {
    let NowFacts {
        unix,
        hour,
        weekday,
    } = n;
    let mut m = Fields::with_capacity(3);
    m.put("unix", int(*unix));
    m.put("hour", int(*hour));
    m.put("weekday", int(*weekday));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-built host value equals the serde-built one, field for field.
    #[test]
    fn host_value_by_hand_equals_the_serde_one() {
        for host in crate::samples::complete()
            .into_iter()
            .chain(crate::samples::sparse())
            .map(|s| s.host)
        {
            let by_hand = HostValue::new(&host);
            let by_serde = Prebuilt::build(&host);
            let a = cel::Value::try_from(by_hand.0.val()).expect("value");
            let b = cel::Value::try_from(by_serde.val()).expect("value");
            assert_eq!(a, b, "{}", host.name);
        }
    }

    /// The hand-built `job`, `user`, `lab` and `now` values equal the serde-built ones,
    /// every kind of RSL relation included.
    #[test]
    fn job_user_lab_and_now_values_by_hand_equal_the_serde_ones() {
        fn same(by_hand: &Prebuilt, by_serde: &Prebuilt, what: &str) {
            let a = cel::Value::try_from(by_hand.val()).expect("value");
            let b = cel::Value::try_from(by_serde.val()).expect("value");
            assert_eq!(a, b, "{what}");
        }
        let mut related = crate::samples::complete().remove(0).job;
        related.module = Some("pvm".into());
        related.min = Some(2);
        related.spec = [
            ("adaptive", SpecValue::Bool(true)),
            ("count", SpecValue::Int(4)),
            ("weight", SpecValue::Float(0.5)),
            ("queue", SpecValue::Str("night".into())),
            (
                "hosts",
                SpecValue::List(vec![SpecValue::Str("n1".into()), SpecValue::Int(2)]),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let samples = crate::samples::complete()
            .into_iter()
            .chain(crate::samples::sparse());
        for s in samples {
            for job in [&s.job, &s.holder, &related] {
                same(&JobValue::new(job).0, &Prebuilt::build(job), "job");
            }
            same(
                &UserValue::new(&s.user).0,
                &Prebuilt::build(&s.user),
                "user",
            );
            same(&LabValue::new(&s.lab).0, &Prebuilt::build(&s.lab), "lab");
            same(&NowValue::new(&s.now).0, &Prebuilt::build(&s.now), "now");
        }
    }

    /// A value of some fields holds exactly those, each as the full value has it.
    #[test]
    fn a_value_of_some_fields_holds_those_as_the_full_value_does() {
        let host = crate::samples::complete().remove(0).host;
        let full = cel::Value::try_from(HostValue::new(&host).0.val()).expect("value");
        let fields = HostFields::named(["load1", "users", "private"]);
        let some = HostValue::reading(&host, fields);
        assert!(some.holds(HostFields::named(["users"])));
        assert!(!some.holds(HostFields::named(["cpus", "users"])));
        let cel::Value::Map(some) = cel::Value::try_from(some.0.val()).expect("value") else {
            panic!("a map");
        };
        let cel::Value::Map(full) = full else {
            panic!("a map");
        };
        assert_eq!(some.map.len(), 3);
        for (key, value) in some.map.iter() {
            assert_eq!(full.map.get(key), Some(value));
        }
        assert_eq!(HostFields::named(["no_such_field"]), HostFields::ALL);
        // Scalars only: the map is built when `cel` first reads it, with the same fields.
        let scalars = HostFields::named(["load1", "cpus", "private", "owner_idle_s", "up"]);
        let lazy = HostValue::reading(&host, scalars);
        assert!(lazy.0.map.get().is_none());
        let cel::Value::Map(lazy) = cel::Value::try_from(lazy.0.val()).expect("value") else {
            panic!("a map");
        };
        assert_eq!(lazy.map.len(), 5);
        for (key, value) in lazy.map.iter() {
            assert_eq!(full.map.get(key), Some(value));
        }
        assert_eq!(
            HostFields::named(HOST_FIELD_NAMES.iter().copied()).len(),
            HOST_FIELD_NAMES.len()
        );
    }
}
