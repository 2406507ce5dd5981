//! Tests of the cost estimate and the run-time budget on whole policy files.

use std::path::Path;

use crate::{
    cost::{self, MAX_COST},
    facts::{HostFacts, JobFacts},
    value::{HostValue, JobValue},
    Error, Hook, Policy, Scope,
};

fn load(text: &str) -> Result<Policy, Error> {
    Policy::from_text(Path::new("p.toml"), text)
}

fn refused(text: &str) -> String {
    load(text).expect_err("refused").to_string()
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

/// The shipped policies are far within the budget (their figures are in policies/README.md).
#[test]
fn shipped_policies_cost_little() {
    for (name, _) in crate::SHIPPED {
        let p = Policy::shipped(name).expect("loads");
        for h in Hook::ALL {
            assert!(p.cost(h) < 1_000, "{name} {}: {}", h.key(), p.cost(h));
        }
    }
}

/// Ten uses of a let that uses another ten times, seven levels deep: a million evaluations
/// of `l0` when lets were inlined at every use (55 s to check, 11 minutes of a broker's
/// core). Lets are evaluated once now, but the estimate counts each use at the let's own
/// cost, so the file is refused at load, naming the first let over the budget.
#[test]
fn a_let_fan_out_is_refused_with_the_estimate() {
    let started = std::time::Instant::now();
    let e = refused(include_str!("../tests/costly/let-fanout.toml"));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(e.contains("key `let.l4`"), "{e}");
    assert!(e.contains("estimated cost is"), "{e}");
    assert!(e.contains(&format!("over the budget of {MAX_COST}")), "{e}");
    assert!(e.contains("each use of a let costs the whole let"), "{e}");
}

/// Three levels of the same fan-out are cheap enough, and each let is still evaluated
/// once per evaluation: the run-time spend is far below the (conservative) estimate.
#[test]
fn a_small_let_fan_out_loads_and_evaluates_each_let_once() {
    let text = "start = 'l3'\n[let]\nl0 = 'host.cpus > 1000'\n\
        l1 = '[l0,l0,l0,l0,l0,l0,l0,l0,l0,l0].exists(x, x)'\n\
        l2 = '[l1,l1,l1,l1,l1,l1,l1,l1,l1,l1].exists(x, x)'\n\
        l3 = '[l2,l2,l2,l2,l2,l2,l2,l2,l2,l2].exists(x, x)'\n";
    let p = load(text).expect("three levels load");
    assert!(p.cost(Hook::Start) > 1_000, "{}", p.cost(Hook::Start));
    assert_eq!(p.fields_read(Hook::Start), ["host.cpus".to_string()].into());
    let h = host(0);
    let job = JobValue::new(&JobFacts::default());
    let d = p.start(Scope::new().host(&h).job(&job));
    assert_eq!((d.value, d.error), (false, None));
    let spent = cost::last_spent();
    assert!(
        spent > 0 && spent < p.cost(Hook::Start) / 10,
        "each let once: spent {spent} of an estimate of {}",
        p.cost(Hook::Start)
    );
}

/// `map`s nested over a 1000-element list: a billion elements (the broker grew by 800 MB
/// and aborted). Refused at load, with the estimate and the budget.
#[test]
fn nested_maps_over_a_long_list_are_refused_with_the_estimate() {
    let e = refused(include_str!("../tests/costly/nested-maps.toml"));
    assert!(e.starts_with("p.toml:"), "{e}");
    assert!(e.contains("key `let.nested`"), "{e}");
    assert!(e.contains("estimated cost is"), "{e}");
    assert!(e.contains(&format!("over the budget of {MAX_COST}")), "{e}");
    assert!(e.contains("help: a comprehension"), "{e}");
}

/// A let that quadruples a list, nine times: each let is evaluated once, but the value is
/// 2.6 million elements.
#[test]
fn growing_through_lets_is_refused() {
    let mut text =
        String::from("start = 'size(l9) > 0'\n[let]\nl0 = '[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]'\n");
    for i in 1..=9 {
        let b = i - 1;
        text.push_str(&format!("l{i} = '(l{b} + l{b}) + (l{b} + l{b})'\n"));
    }
    let e = refused(&text);
    assert!(e.contains("estimated cost is"), "{e}");
    let e = refused("start = '[1].map(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).map(y, y + y).size() > 0 && host.labels.exists(a, host.labels.exists(b, host.labels.exists(c, a + b == c)))'\n");
    assert!(
        e.contains("key `start`") && e.contains("estimated cost"),
        "{e}"
    );
}

/// An accumulator that doubles on every step grows exponentially: unbounded.
#[test]
fn a_step_that_doubles_its_accumulator_is_unbounded() {
    // `exists_one` counts; a hand-written fold is not writable in CEL, so the doubling is
    // in a nested map over the result of another.
    let e = refused(
        "start = 'host.labels.map(a, host.labels.map(b, host.labels.map(c, c))).size() > 0'\n",
    );
    assert!(e.contains("estimated cost is"), "{e}");
}

/// One comprehension over an input list passes; an input larger than the estimate assumed
/// is stopped by the run-time budget: a policy error (the default applies), not a hang.
#[test]
fn an_input_larger_than_assumed_runs_out_of_budget_with_a_clear_error() {
    let p = load("start = 'host.labels.filter(l, l == \"gpu\").size() == 0'\n").expect("loads");
    assert!(p.cost(Hook::Start) <= MAX_COST);
    let job = JobValue::new(&JobFacts::default());
    let small = host(50);
    let d = p.start(Scope::new().host(&small).job(&job));
    assert_eq!((d.value, d.error), (true, None));
    let huge = host(2 * MAX_COST as usize);
    let d = p.start(Scope::new().host(&huge).job(&job));
    let error = d.error.expect("out of budget");
    assert!(error.message.contains(cost::EXHAUSTED), "{error}");
    assert!(error.message.contains(&MAX_COST.to_string()), "{error}");
}

/// An error `||` absorbs still ends the evaluation when it is the budget's.
#[test]
fn running_out_is_an_error_even_where_or_absorbs_errors() {
    let p = load("start = 'host.labels.exists(l, l == \"gpu\") || true'\n").expect("loads");
    let job = JobValue::new(&JobFacts::default());
    let huge = host(2 * MAX_COST as usize);
    let d = p.start(Scope::new().host(&huge).job(&job));
    assert!(d.error.is_some_and(|e| e.message.contains(cost::EXHAUSTED)));
}
