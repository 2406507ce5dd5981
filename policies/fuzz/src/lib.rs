//! Harness of the `policies` fuzz targets: arbitrary bytes as a policy file through the
//! whole load path ([`Policy::from_text`]: TOML with spans and every CEL expression, both
//! parsed on the parser thread, the load-time check against the sample inputs), and the shipped
//! policies evaluated on arbitrary facts.
//!
//! Shared by the cargo-fuzz targets (`fuzz_targets/`) and by `tests/tests/fuzz_smoke.rs`
//! (which includes this file), so the stable smoke replays exactly what the fuzzer runs.
//! A panic anywhere is the bug (a stack overflow too: the CEL parser is recursive); so is
//! a refused file whose error names no place in it or hides a panicking parser thread, and
//! a cached host-only decision ([`Policy::host_decision`]) that differs from the full one.

use std::{collections::BTreeMap, path::Path, sync::OnceLock};

use policies::{
    facts::{HostFacts, JobFacts, LabFacts, NowFacts, Session, SpecValue, UserFacts},
    value::{HostValue, JobValue, LabValue, NowValue, UserValue},
    Answer, Error, Hook, Policy, Scope,
};

/// One policy file, as `rb policy check FILE` and the broker's (re)load read it.
pub fn policy_file(data: &[u8]) {
    // `Policy::load` reads with `read_to_string`: other bytes are an I/O error there.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Policy::from_text(Path::new("policy.toml"), text) {
        Ok(policy) => {
            let summary = policy.summary();
            assert_eq!(
                summary.set.len() + summary.defaulted.len(),
                Hook::ALL.len(),
                "every hook is either set or defaulted"
            );
            assert!(summary.to_string().contains(": ok: "), "{summary}");
            let facts = Facts::sample();
            facts.values().evaluate(&policy);
        }
        Err(e) => refused_well(text, &e),
    }
}

/// A refused file's error: a message, the exit code of a bad file, a place inside the file.
fn refused_well(text: &str, e: &Error) {
    assert!(!e.to_string().is_empty(), "an error with an empty message");
    // `Thread` is what a panic of the parser thread becomes: a parser bug, not a bad file.
    assert_eq!(e.exit_code(), 64, "a bad file must exit 64: {e}");
    let at = match e {
        Error::Toml { at, .. } | Error::Key { at, .. } => *at,
        other => panic!("not an error about the file's text: {other}"),
    };
    let lines = text.split('\n').count();
    assert!(
        (1..=lines).contains(&at.line) && at.col >= 1,
        "{}:{} is outside a {lines}-line file: {e}",
        at.line,
        at.col
    );
}

/// The shipped policies, loaded once (by [`policy_eval`]'s first byte).
fn shipped() -> &'static [Policy] {
    static SHIPPED: OnceLock<Vec<Policy>> = OnceLock::new();
    SHIPPED.get_or_init(|| {
        policies::SHIPPED
            .iter()
            .map(|(name, _)| Policy::shipped(name).expect("a shipped policy loads"))
            .collect()
    })
}

/// A shipped policy (the first byte picks it) on the facts decoded from the other bytes.
pub fn policy_eval(data: &[u8]) {
    let (pick, rest) = data.split_first().unwrap_or((&0, &[]));
    let all = shipped();
    let policy = &all[usize::from(*pick) % all.len()];
    let (facts, _) = Facts::decode(rest);
    facts.values().evaluate(policy);
}

/// True when `data` holds every fact [`policy_eval`] decodes (none left to its zero).
pub fn policy_eval_input_is_complete(data: &[u8]) -> bool {
    data.split_first()
        .is_some_and(|(_, rest)| Facts::decode(rest).1)
}

/// The inputs of one decision.
#[derive(Debug, Clone)]
pub struct Facts {
    pub host: HostFacts,
    pub job: JobFacts,
    pub holder: JobFacts,
    pub user: UserFacts,
    pub lab: LabFacts,
    pub now: NowFacts,
}

impl Facts {
    /// An ordinary decision: a private workstation whose owner is away, an adaptive job.
    pub fn sample() -> Facts {
        let host = HostFacts {
            name: "node01".into(),
            labels: vec!["linux".into()].into(),
            owner: Some("ann".into()),
            up: true,
            load1: Some(0.5),
            cpus: 4,
            users: Some(vec![Session {
                user: "ann".into(),
                tty: "pts/0".into(),
                idle_s: Some(900),
            }]),
            ..HostFacts::default()
        }
        .derive();
        let job = JobFacts {
            id: 7,
            user: "bob".into(),
            adaptive: true,
            count: 2,
            hosts_held: 1,
            spec: BTreeMap::from([("count".into(), SpecValue::Int(2))]),
            ..JobFacts::default()
        };
        let holder = JobFacts {
            id: 3,
            hosts_held: 5,
            adaptive: true,
            ..JobFacts::default()
        };
        Facts {
            host,
            job,
            holder,
            user: UserFacts {
                name: "bob".into(),
                jobs: 1,
                hosts_held: 1,
            },
            lab: LabFacts {
                hosts: 10,
                free_hosts: 2,
                jobs: 3,
                adaptive_jobs: 2,
                users: 2,
            },
            now: NowFacts {
                unix: 1_764_000_000,
                hour: 22,
                weekday: 3,
            },
        }
    }

    /// Facts from arbitrary bytes; true when the bytes sufficed (none defaulted to zero).
    pub fn decode(data: &[u8]) -> (Facts, bool) {
        let mut b = Bytes { data, short: false };
        let facts = Facts {
            host: b.host(),
            job: b.job(),
            holder: b.job(),
            user: UserFacts {
                name: b.text(),
                jobs: b.int(),
                hosts_held: b.int(),
            },
            lab: LabFacts {
                hosts: b.int(),
                free_hosts: b.int(),
                jobs: b.int(),
                adaptive_jobs: b.int(),
                users: b.int(),
            },
            now: NowFacts {
                unix: b.int(),
                hour: b.int(),
                weekday: b.int(),
            },
        };
        (facts, !b.short)
    }

    fn values(&self) -> Values {
        Values {
            host: HostValue::new(&self.host),
            job: JobValue::new(&self.job),
            holder: JobValue::new(&self.holder),
            user: UserValue::new(&self.user),
            lab: LabValue::new(&self.lab),
            now: NowValue::new(&self.now),
        }
    }
}

/// [`Facts`] pre-built as the broker builds them.
struct Values {
    host: HostValue,
    job: JobValue,
    holder: JobValue,
    user: UserValue,
    lab: LabValue,
    now: NowValue,
}

impl Values {
    fn scope(&self) -> Scope<'_> {
        Scope::new()
            .host(&self.host)
            .job(&self.job)
            .holder(&self.holder)
            .user(&self.user)
            .lab(&self.lab)
            .now(&self.now)
    }

    /// Every hook, every way the broker and `rb policy explain` evaluate it, agreeing.
    fn evaluate(&self, policy: &Policy) {
        let scope = self.scope();
        let _ = (
            policy.start(scope),
            policy.rank(scope),
            policy.vacate(scope),
        );
        let _ = (policy.grace_s(scope), policy.may_preempt(scope));
        let _ = (policy.preempt_rank(scope), policy.share(scope));
        let _ = (policy.max_hosts(scope), policy.priority(scope));
        let explained = policy.explain(scope);
        assert_eq!(
            explained.len(),
            Hook::ALL.len(),
            "a full scope explains every hook"
        );
        for hook in Hook::ALL {
            let full = policy.eval(hook, scope);
            if let Some(e) = &full.error {
                assert!(
                    !e.message.is_empty(),
                    "{hook:?}: an error without a message"
                );
            }
            let shown = explained.iter().find(|x| x.hook == hook);
            let shown = shown.unwrap_or_else(|| panic!("{hook:?} is not explained"));
            assert!(
                same(shown.value, full.value),
                "{hook:?}: explain says {:?}, eval {:?}",
                shown.value,
                full.value
            );
            if let Some(cached) = policy.host_decision(hook, &self.host, Some(&self.now)) {
                assert!(
                    same(Some(cached), full.value),
                    "{hook:?}: the host-only decision {cached} differs from the full one {:?}",
                    full.value
                );
            }
        }
    }
}

/// Equal answers (NaN equal to NaN).
fn same(a: Option<Answer>, b: Option<Answer>) -> bool {
    match (a, b) {
        (Some(Answer::Number(x)), Some(Answer::Number(y))) => x == y || (x.is_nan() && y.is_nan()),
        _ => a == b,
    }
}

/// Names that matter to the shipped policies (an owner who is also a session's user).
const WORDS: &[&str] = &[
    "", "ann", "bob", "root", "node01", "pts/0", ":0", "linux", "x86_64", "desktop", "é",
];
/// RSL attribute names a policy may test with `has(job.spec.KEY)`.
const SPEC_KEYS: &[&str] = &["count", "min", "max", "arch", "os", "memory", "jel", "x"];
const INTS: &[i64] = &[
    0,
    1,
    -1,
    2,
    299,
    300,
    301,
    3600,
    86_400,
    10 * 365 * 24 * 3600,
    1_764_000_000,
    i64::MAX,
    i64::MIN,
    i64::MAX / 10_000_000_000,
    -(1 << 53),
];
const FLOATS: &[f64] = &[
    0.0,
    -0.0,
    0.5,
    1.0,
    10_000.0,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::MIN_POSITIVE,
    f64::MAX,
    1e-300,
];

/// A reader of arbitrary bytes as facts; past the end every read is zero.
struct Bytes<'a> {
    data: &'a [u8],
    short: bool,
}

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => {
                self.short = true;
                0
            }
        }
    }

    fn word(&mut self) -> u64 {
        let mut bytes = [0; 8];
        bytes.iter_mut().for_each(|b| *b = self.byte());
        u64::from_le_bytes(bytes)
    }

    fn bool(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    fn int(&mut self) -> i64 {
        match self.byte() % 4 {
            0 => i64::from(self.byte()) - 16,
            1 => i64::from(u16::from_le_bytes([self.byte(), self.byte()])) * 60,
            2 => INTS[usize::from(self.byte()) % INTS.len()],
            _ => self.word() as i64,
        }
    }

    fn float(&mut self) -> f64 {
        match self.byte() % 3 {
            0 => f64::from(self.byte()) / 16.0,
            1 => FLOATS[usize::from(self.byte()) % FLOATS.len()],
            _ => f64::from_bits(self.word()),
        }
    }

    fn opt<T>(&mut self, read: impl FnOnce(&mut Self) -> T) -> Option<T> {
        self.bool().then(|| read(self))
    }

    fn list<T>(&mut self, mut read: impl FnMut(&mut Self) -> T) -> Vec<T> {
        let n = self.byte() % 4;
        (0..n).map(|_| read(self)).collect()
    }

    fn text(&mut self) -> String {
        let pick = self.byte();
        if pick < 240 {
            return WORDS[usize::from(pick) % WORDS.len()].to_string();
        }
        let n = usize::from(self.byte() % 32);
        let raw: Vec<u8> = (0..n).map(|_| self.byte()).collect();
        String::from_utf8_lossy(&raw).into_owned()
    }

    fn session(&mut self) -> Session {
        Session {
            user: self.text().into(),
            tty: self.text().into(),
            idle_s: self.opt(Self::int),
        }
    }

    fn host(&mut self) -> HostFacts {
        HostFacts {
            name: self.text(),
            labels: self.list(Self::text).into(),
            owner: self.opt(Self::text),
            up: self.bool(),
            drained: self.bool(),
            load1: self.opt(Self::float),
            load5: self.opt(Self::float),
            load15: self.opt(Self::float),
            cpus: self.int(),
            mem_avail_mb: self.opt(Self::int),
            users: self.opt(|b| b.list(Self::session)),
            console_idle_s: self.opt(Self::int),
            held_by: self.opt(Self::int),
            held_for_s: self.int(),
            job_load: self.float(),
            ..HostFacts::default()
        }
        .derive()
    }

    fn spec_value(&mut self, depth: u8) -> SpecValue {
        match self.byte() % 5 {
            0 => SpecValue::Bool(self.bool()),
            1 => SpecValue::Int(self.int()),
            2 => SpecValue::Float(self.float()),
            3 if depth < 3 => SpecValue::List(self.list(|b| b.spec_value(depth + 1))),
            _ => SpecValue::Str(self.text()),
        }
    }

    fn job(&mut self) -> JobFacts {
        JobFacts {
            id: self.int(),
            user: self.text(),
            adaptive: self.bool(),
            module: self.opt(Self::text),
            host: self.text(),
            count: self.int(),
            min: self.opt(Self::int),
            max: self.opt(Self::int),
            hosts_held: self.int(),
            waiting: self.int(),
            waited_s: self.float(),
            started_s: self.int(),
            spec: self
                .list(|b| {
                    let key = SPEC_KEYS[usize::from(b.byte()) % SPEC_KEYS.len()];
                    (key.to_string(), b.spec_value(0))
                })
                .into_iter()
                .collect(),
            share: self.float(),
        }
    }
}
