//! Generated let fan-outs and nested comprehensions: every file either loads, and then no
//! evaluation of it spends more at run time than its estimate (within the budget), or is
//! refused for its cost (or its depth) with the estimate, quickly.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use policies::{
    cost::{self, MAX_COST},
    facts::{HostFacts, JobFacts},
    value::{HostValue, JobValue},
    Hook, Policy, Scope,
};
use proptest::{
    prelude::*,
    test_runner::{Config, RngAlgorithm, TestRng, TestRunner},
};

/// Slowest a load may be (a debug build on a shared machine).
const PER_FILE: Duration = Duration::from_secs(1);

/// One level of a let chain: how the let uses the one below.
#[derive(Debug, Clone)]
enum Level {
    /// `[below, below, ...].exists(x, x)` (`n` uses).
    FanOut(usize),
    /// `RANGE.map(x, below)` over a literal list of `n` elements or an input list.
    Map(Range),
    /// `RANGE.exists(x, below && x == x)`.
    Exists(Range),
    /// `RANGE.filter(x, below).size() > 0 || below` on a list.
    Filter(Range),
    /// `below + below` (lists or strings grow).
    Double,
}

#[derive(Debug, Clone)]
enum Range {
    Literal(usize),
    Labels,
}

impl Range {
    fn text(&self) -> String {
        match self {
            Range::Literal(n) => {
                let items: Vec<String> = (0..*n).map(|i| i.to_string()).collect();
                format!("[{}]", items.join(", "))
            }
            Range::Labels => "host.labels".to_string(),
        }
    }
}

fn range() -> impl Strategy<Value = Range> {
    prop_oneof![(1usize..400).prop_map(Range::Literal), Just(Range::Labels)]
}

fn level() -> impl Strategy<Value = Level> {
    prop_oneof![
        (1usize..12).prop_map(Level::FanOut),
        range().prop_map(Level::Map),
        range().prop_map(Level::Exists),
        range().prop_map(Level::Filter),
        Just(Level::Double),
    ]
}

/// A file whose `start` reads the top of a chain of lets built from `levels`. Each let is
/// kept bool-or-list so that every level type-checks.
fn file(levels: &[Level]) -> String {
    let mut lets = vec!["l0 = '[host.cpus > 1000]'".to_string()];
    for (i, level) in levels.iter().enumerate() {
        let b = format!("l{i}");
        let expr = match level {
            Level::FanOut(n) => format!("[{}].map(x, x)", vec![b.as_str(); *n].join(", ")),
            Level::Map(r) => format!("{}.map(x, {b})", r.text()),
            Level::Exists(r) => format!("[{}.exists(x, size({b}) > 0 && x == x)]", r.text()),
            Level::Filter(r) => format!("{}.filter(x, size({b}) > 0)", r.text()),
            Level::Double => format!("{b} + {b}"),
        };
        lets.push(format!("l{} = '{expr}'", i + 1));
    }
    format!(
        "start = 'size(l{}) > 0'\n[let]\n{}\n",
        levels.len(),
        lets.join("\n")
    )
}

fn host(labels: usize) -> HostValue {
    HostValue::new(
        &HostFacts {
            name: "node01".into(),
            up: true,
            cpus: 4,
            labels: (0..labels).map(|i| format!("l{i}")).collect(),
            users: Some(vec![]),
            ..HostFacts::default()
        }
        .derive(),
    )
}

fn check(levels: Vec<Level>) -> Result<(), TestCaseError> {
    let text = file(&levels);
    let started = Instant::now();
    let loaded = Policy::from_text(Path::new("gen.toml"), &text);
    let took = started.elapsed();
    prop_assert!(took < PER_FILE, "took {took:?} to load or refuse:\n{text}");
    let policy = match loaded {
        Ok(p) => p,
        Err(e) => {
            let e = e.to_string();
            let why = ["estimated cost", "too complex", "levels deep", "must give"];
            prop_assert!(why.iter().any(|w| e.contains(w)), "{e}\n{text}");
            if e.contains("estimated cost") {
                prop_assert!(e.contains(&format!("budget of {MAX_COST}")), "{e}");
            }
            return Ok(());
        }
    };
    let estimate = policy.cost(Hook::Start);
    prop_assert!(estimate <= MAX_COST);
    let job = JobValue::new(&JobFacts::default());
    for labels in [0, 7, cost::INPUT_SIZE as usize] {
        let h = host(labels);
        let d = policy.start(Scope::new().host(&h).job(&job));
        let spent = cost::last_spent();
        prop_assert!(d.error.is_none(), "{:?}\n{text}", d.error);
        prop_assert!(
            spent <= estimate,
            "spent {spent} > estimate {estimate}\n{text}"
        );
    }
    Ok(())
}

#[test]
fn generated_fan_outs_and_nested_comprehensions_are_bounded() {
    let config = Config {
        cases: 200,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, b"resourcebroker-policy-cost-check");
    let mut runner = TestRunner::new_with_rng(config, rng);
    runner
        .run(&proptest::collection::vec(level(), 1..8), check)
        .expect("every generated policy is bounded");
}
