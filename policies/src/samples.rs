//! The built-in sample inputs every expression is evaluated against at load time. CEL has
//! no type checker here: a misspelt field or a type error shows only when an expression
//! runs, so a file is refused unless each expression runs cleanly, with the hook's type, on
//! every *complete* sample (every field known), and gives the hook's type wherever it runs
//! on the *sparse* ones (unknown loads, sessions, console; a free host; a bare job), where
//! a run-time error is allowed: at run time it gives the hook's default.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::OnceLock,
};

use crate::{
    facts::{HostFacts, JobFacts, LabFacts, LoginSession, NowFacts, Session, SpecValue, UserFacts},
    hooks::Var,
};

/// One set of sample inputs, named for error messages.
pub(crate) struct Sample {
    pub name: String,
    pub host: HostFacts,
    pub job: JobFacts,
    pub holder: JobFacts,
    pub user: UserFacts,
    pub lab: LabFacts,
    pub now: NowFacts,
}

fn login(user: &str) -> LoginSession {
    LoginSession {
        user: user.into(),
        seat: Some("seat0".into()),
        tty: Some("tty2".into()),
        display: Some(":0".into()),
        class: "user".into(),
        kind: "x11".into(),
        remote: false,
        active: true,
        locked: false,
        idle_s: Some(600),
        idle_source: "logind IdleSinceHint".into(),
        person: true,
        local: true,
    }
}

fn session(user: &str, idle_s: i64) -> Session {
    Session {
        user: user.into(),
        tty: "pts/1".into(),
        idle_s: Some(idle_s),
    }
}

fn host(name: &str, owner: Option<&str>, users: Vec<Session>, console: i64) -> HostFacts {
    HostFacts {
        name: name.into(),
        labels: vec!["linux".into(), "x86_64".into()].into(),
        owner: owner.map(String::from),
        up: true,
        load1: Some(0.25),
        load5: Some(0.5),
        load15: Some(0.75),
        cpus: 4,
        mem_avail_mb: Some(8000),
        users: Some(users),
        console_idle_s: Some(console),
        // The owner's desktop on seat0, every field known.
        sessions: Some(owner.map(login).into_iter().collect()),
        held_by: Some(7),
        held_for_s: 120,
        job_load: 0.125,
        ..HostFacts::default()
    }
    .derive()
}

fn complete_hosts() -> Vec<HostFacts> {
    vec![
        host("node01", None, vec![], 4000),
        host("ws-ann", Some("ann"), vec![session("ann", 900)], 1200),
        host(
            "ws-bob",
            Some("bob"),
            vec![session("bob", 5), session("eve", 50)],
            3,
        ),
    ]
}

fn job(id: i64, adaptive: bool, module: &str, hosts_held: i64) -> JobFacts {
    let spec = BTreeMap::from([
        ("count".to_string(), SpecValue::Int(2)),
        ("executable".to_string(), SpecValue::Str("/bin/true".into())),
        (
            "arguments".to_string(),
            SpecValue::List(vec![SpecValue::Str("-v".into())]),
        ),
    ]);
    JobFacts {
        id,
        user: "carol".into(),
        adaptive,
        module: Some(module.into()),
        host: "node00".into(),
        count: 2,
        min: Some(1),
        max: Some(8),
        hosts_held,
        waiting: 1,
        waited_s: 2.5,
        started_s: 1_700_000_000 + id,
        spec,
        // Not 1: a weighted expression must work with any share.
        share: if adaptive { 2.0 } else { 0.5 },
    }
}

fn complete_jobs() -> Vec<JobFacts> {
    vec![job(7, true, "pvm", 5), job(8, false, "lam", 1)]
}

fn nows() -> Vec<NowFacts> {
    vec![
        // Tuesday 12:00 and Saturday 03:00.
        NowFacts {
            unix: 1_763_985_600,
            hour: 12,
            weekday: 2,
        },
        NowFacts {
            unix: 1_764_212_400,
            hour: 3,
            weekday: 6,
        },
    ]
}

fn user() -> UserFacts {
    UserFacts {
        name: "carol".into(),
        jobs: 2,
        hosts_held: 6,
    }
}

fn lab() -> LabFacts {
    LabFacts {
        hosts: 13,
        free_hosts: 4,
        jobs: 3,
        adaptive_jobs: 2,
        users: 2,
    }
}

/// Every combination of complete hosts, jobs, holders and times.
pub(crate) fn complete() -> Vec<Sample> {
    let mut out = Vec::new();
    for h in complete_hosts() {
        for j in complete_jobs() {
            for holder in complete_jobs() {
                for now in nows() {
                    out.push(Sample {
                        name: format!(
                            "host {}, job {}, holder {}, {:02}:00 on day {}",
                            h.name, j.id, holder.id, now.hour, now.weekday
                        ),
                        host: h.clone(),
                        job: j.clone(),
                        holder: holder.clone(),
                        user: user(),
                        lab: lab(),
                        now,
                    });
                }
            }
        }
    }
    out
}

/// Inputs with unknown and absent values.
pub(crate) fn sparse() -> Vec<Sample> {
    let unknown = HostFacts {
        name: "mystery".into(),
        owner: Some("dan".into()),
        up: false,
        cpus: 0,
        ..HostFacts::default()
    }
    .derive();
    let bare = JobFacts {
        id: 9,
        user: "dan".into(),
        host: "mystery".into(),
        count: 1,
        ..JobFacts::default()
    };
    let now = nows().remove(0);
    vec![Sample {
        name: "host mystery (nothing known), job 9 (no RSL)".into(),
        host: unknown,
        job: bare.clone(),
        holder: bare,
        user: UserFacts::default(),
        lab: LabFacts::default(),
        now,
    }]
}

/// Whether `var.field` is a number or a bool (not a string, list or map) in the complete
/// samples: what the cost estimate sizes as 1 (`cost`). A field null in every sample is
/// not known to be scalar.
pub(crate) fn scalar_field(var: Var, field: &str) -> bool {
    static SCALAR: OnceLock<BTreeSet<(Var, String)>> = OnceLock::new();
    SCALAR
        .get_or_init(scalar_fields)
        .contains(&(var, field.to_string()))
}

fn scalar_fields() -> BTreeSet<(Var, String)> {
    let mut kinds: BTreeMap<(Var, String), (bool, bool)> = BTreeMap::new();
    let mut note = |var: Var, facts: cel::Value| {
        let cel::Value::Map(m) = facts else { return };
        for (k, v) in m.map.iter() {
            let cel::objects::Key::String(name) = k else {
                continue;
            };
            let seen = kinds.entry((var, name.to_string())).or_default();
            match v {
                cel::Value::Null => {}
                cel::Value::Bool(_) | cel::Value::Int(_) | cel::Value::UInt(_) => seen.0 = true,
                cel::Value::Float(_) => seen.0 = true,
                _ => seen.1 = true,
            }
        }
    };
    for s in complete().iter().chain(sparse().iter()) {
        let facts = [
            (Var::Host, cel::to_value(&s.host)),
            (Var::Job, cel::to_value(&s.job)),
            (Var::Holder, cel::to_value(&s.holder)),
            (Var::User, cel::to_value(&s.user)),
            (Var::Lab, cel::to_value(&s.lab)),
            (Var::Now, cel::to_value(&s.now)),
        ];
        for (var, value) in facts {
            if let Ok(value) = value {
                note(var, value);
            }
        }
    }
    kinds
        .into_iter()
        .filter(|(_, (scalar, sized))| *scalar && !*sized)
        .map(|(key, _)| key)
        .collect()
}
