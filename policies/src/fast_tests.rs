//! The fast path against `cel` itself: every operation on every pair of scalar kinds, the
//! shipped policies' expressions on the samples, and the shapes that have no fast form.

use std::collections::BTreeMap;

use cel::Value;

use super::*;
use crate::{
    ast,
    compile::Compiled,
    eval::Evaluator,
    facts::{HostFacts, JobFacts},
    value::{HostValue, JobValue},
    Hook, Policy,
};

/// Values of every scalar kind, edge cases included.
const SAMPLES: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "1",
    "-1",
    "7",
    "9223372036854775807",
    "-9223372036854775807 - 1",
    "0u",
    "1u",
    "18446744073709551615u",
    "0.0",
    "-0.0",
    "1.5",
    "-2.5",
    "7.0",
    "double(\"NaN\")",
    "double(\"inf\")",
];

const BINARY: &[&str] = &[
    "||", "&&", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%",
];
const UNARY: &[&str] = &["!", "-", "double"];

/// What `cel` gives for `expr` with no variables: a value, or `Err` for an error.
fn by_cel(expr: &str) -> Result<Value, ()> {
    let program = cel::Program::compile(expr).expect("parses");
    program.execute(&cel::Context::default()).map_err(|_| ())
}

/// What the fast path gives for `expr` with no variables (`None`: no fast form, or it
/// does not tell).
fn by_fast(expr: &str) -> Option<Result<Value, ()>> {
    let parsed = cel::parser::Parser::new().parse(expr).expect("parses");
    let node = compile(&ast::indexed(&parsed), &BTreeMap::new())?;
    match node.eval(&[], &Scope::new()) {
        Ok(s) => Some(Ok(to_value(s))),
        Err(Stop::Error) => Some(Err(())),
        Err(Stop::Unknown) => None,
    }
}

/// The same value (NaN equal to itself, and 0.0 and -0.0 told apart).
fn same(a: &Result<Value, ()>, b: &Result<Value, ()>) -> bool {
    match (a, b) {
        (Ok(Value::Float(x)), Ok(Value::Float(y))) => {
            (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits()
        }
        _ => a == b,
    }
}

fn check(expr: &str, checked: &mut usize) {
    let Some(fast) = by_fast(expr) else {
        return;
    };
    let slow = by_cel(expr);
    assert!(same(&fast, &slow), "`{expr}`: fast {fast:?}, cel {slow:?}");
    *checked += 1;
}

/// Every binary and unary operation on every pair of sample values, and the conditional
/// on each as its condition, give what `cel` gives.
#[test]
fn every_operation_on_every_kind_of_scalar_gives_what_cel_gives() {
    let mut checked = 0;
    for a in SAMPLES {
        for op in UNARY {
            let expr = if *op == "double" {
                format!("double({a})")
            } else {
                format!("{op}({a})")
            };
            check(&expr, &mut checked);
        }
        check(&format!("({a}) ? 1 : 2"), &mut checked);
        for b in SAMPLES {
            for op in BINARY {
                check(&format!("({a}) {op} ({b})"), &mut checked);
            }
        }
    }
    // The strings (NaN, inf) have no fast form; everything else does.
    let fast_samples = SAMPLES.len() - 2;
    let expected = fast_samples * (UNARY.len() + 1) + fast_samples * fast_samples * BINARY.len();
    assert_eq!(checked, expected);
}

/// An error on one side of `||` or `&&` is absorbed when the other side decides, as `cel`
/// has it, and an error that decides is an error.
#[test]
fn errors_are_absorbed_where_cel_absorbs_them() {
    let mut checked = 0;
    for (expr, value) in [
        ("(1 / 0 == 1) || true", Some(true)),
        ("true || (1 / 0 == 1)", Some(true)),
        ("false || (1 / 0 == 1)", None),
        ("(1 / 0 == 1) || false", None),
        ("(1 / 0 == 1) && false", Some(false)),
        ("false && (1 / 0 == 1)", Some(false)),
        ("true && (1 / 0 == 1)", None),
        ("1 || true", Some(true)),
        ("true ? 1 : 1 / 0", None),
    ] {
        check(expr, &mut checked);
        let got = by_fast(expr).expect("a fast form that tells");
        match value {
            Some(b) => assert_eq!(got, Ok(Value::Bool(b)), "{expr}"),
            None if expr.starts_with("true ?") => assert_eq!(got, Ok(Value::Int(1)), "{expr}"),
            None => assert_eq!(got, Err(()), "{expr}"),
        }
    }
    assert_eq!(checked, 9);
}

/// Strings, lists, maps, presence tests, comprehensions and other functions have no fast
/// form; a let without one makes its users have none.
#[test]
fn what_the_fast_path_does_not_model_has_no_fast_form() {
    for expr in [
        "'a' == 'a'",
        "[1][0] == 1",
        "{'a': 1}['a'] == 1",
        "has(host.load1)",
        "[1, 2].exists(x, x > 1)",
        "size([1])",
        "int(1.5) == 1",
        "host",
        "unknown_name",
        "host.users[0].idle_s > 1",
    ] {
        let parsed = cel::parser::Parser::new().parse(expr).expect("parses");
        assert_eq!(
            compile(&ast::indexed(&parsed), &BTreeMap::new()),
            None,
            "{expr}"
        );
    }
}

/// A fast form stops at [`MAX_NODES`]: a chain of lets each using the one below twice.
#[test]
fn a_let_fan_out_has_no_fast_form_beyond_the_node_cap() {
    let mut lets = BTreeMap::new();
    let mut size = 1;
    lets.insert("l0".to_string(), Node::Literal(Scalar::Int(1)));
    for i in 1..12 {
        let expr = format!("l{0} + l{0}", i - 1);
        let parsed = cel::parser::Parser::new().parse(&expr).expect("parses");
        size = 2 * size + 1;
        match compile(&parsed, &lets) {
            Some(node) => {
                assert!(size <= MAX_NODES, "{size} nodes");
                lets.insert(format!("l{i}"), node);
            }
            None => {
                assert!(size > MAX_NODES, "{size} nodes");
                return;
            }
        }
    }
    panic!("the cap never applied");
}

/// A field of a bound variable is read; an unbound variable, a variable the hook may not
/// read, and a field the value lacks are errors; a string field does not tell.
#[test]
fn fields_are_read_from_the_bound_values_only() {
    let host = HostValue::reading(
        &HostFacts {
            name: "n1".into(),
            load1: Some(0.5),
            cpus: 2,
            ..HostFacts::default()
        },
        crate::value::HostFields::named(["load1", "cpus", "name"]),
    );
    let job = JobValue::new(&JobFacts::default());
    let scope = Scope::new().host(&host).job(&job);
    let run = |expr: &str, vars: &[Var]| {
        let parsed = cel::parser::Parser::new().parse(expr).expect("parses");
        let node = compile(&ast::indexed(&parsed), &BTreeMap::new()).expect("a fast form");
        node.eval(vars, &scope)
    };
    let both = [Var::Host, Var::Job];
    assert_eq!(run("host.load1 * 2.0", &both), Ok(Scalar::Double(1.0)));
    assert_eq!(run("host.cpus", &both), Ok(Scalar::Int(2)));
    assert_eq!(run("job.adaptive", &both), Ok(Scalar::Bool(false)));
    assert_eq!(run("host.cpus", &[Var::Job]), Err(Stop::Error));
    assert_eq!(run("holder.adaptive", &[Var::Holder]), Err(Stop::Error));
    assert_eq!(run("host.users", &both), Err(Stop::Error));
    assert_eq!(run("host.name == null", &both), Err(Stop::Unknown));
}

/// Policies beside the shipped ones: lets used twice (kept as references, written in by
/// the fast form), a let that fails, a let over a string, errors absorbed or not, ranges.
const WRITTEN: &[&str] = &[
    "start = 'busy || busy'\nrank = 'load + load'\n[let]\n\
     busy = 'host.load1 != null && host.load1 > 1.0'\n\
     load = 'host.load1 == null ? 0.0 : host.load1'\n",
    "start = 'bad || job.adaptive'\nrank = 'bad ? 1 : 2'\nvacate = 'bad && false'\n[let]\n\
     bad = 'host.cpus > 64 ? host.cpus / 0 > 1 : false'\n",
    "start = 'named && named'\n[let]\nnamed = 'host.owner == null'\n",
    "rank = 'host.cpus > 64 ? double(host.cpus) / 0.0 : 1.0'\nshare = 'lab.jobs + 1'\n\
     vacate = 'host.cpus > 64 ? host.load1 : false'\n\
     max_hosts = 'user.jobs > 2 ? user.jobs * 9223372036854775807 : 1'\n",
];

/// Every hook of every shipped policy and of [`WRITTEN`], on every sample, answers through
/// its fast form (when it has one) what it answers through `cel`: value and failure alike.
#[test]
fn the_shipped_policies_answer_the_same_fast_and_through_cel() {
    let mut fast_hooks = 0;
    let mut told: BTreeMap<bool, usize> = BTreeMap::new();
    let shipped = crate::SHIPPED
        .iter()
        .map(|(name, _)| (name.to_string(), Policy::shipped(name).expect("shipped")));
    let written = WRITTEN.iter().map(|text| {
        let loaded = Policy::from_text(std::path::Path::new("t.toml"), text);
        (text.to_string(), loaded.expect("loads"))
    });
    for (name, policy) in shipped.chain(written) {
        let ev = policy.evaluator();
        let mut hooks: Vec<(Hook, &Compiled)> = policy.file_expressions().collect();
        hooks.extend(
            Hook::ALL
                .into_iter()
                .filter_map(|h| policy.active_expression(h).map(|c| (h, c))),
        );
        for (hook, c) in hooks {
            if c.fast.is_none() {
                continue;
            }
            fast_hooks += 1;
            for sample in samples() {
                let built = crate::check::Built::new(&sample);
                let scope = built.scope();
                let by_cel = slow_answer(&ev, hook, c, scope);
                if let Some(fast) = crate::eval::fast_answer(hook, c, &scope) {
                    assert_eq!(fast, by_cel.map_err(|_| ()), "{name} {hook:?}");
                    *told.entry(fast.is_ok()).or_default() += 1;
                }
            }
        }
    }
    assert!(fast_hooks >= 30, "{fast_hooks} hooks with a fast form");
    // Both outcomes were compared: values, and failures (errors, wrong types, NaN).
    assert!(told[&true] > 500 && told[&false] > 20, "{told:?}");
}

/// The check's samples, and hosts on which [`WRITTEN`]'s expressions fail (128 CPUs).
fn samples() -> Vec<crate::samples::Sample> {
    let mut all = crate::samples::complete();
    all.extend(crate::samples::sparse());
    let mut odd = crate::samples::complete();
    for s in &mut odd {
        s.host.cpus = 128;
        s.user.jobs = 3;
    }
    all.extend(odd);
    all
}

fn slow_answer(
    ev: &Evaluator<'_>,
    hook: Hook,
    c: &Compiled,
    scope: Scope<'_>,
) -> Result<crate::Answer, String> {
    ev.answer(hook, &c.run, scope)
}

/// One generated case: an expression, a host (`load1`, `cpus`, private, the owner's and the
/// console's idle time) and a job (adaptive, hosts held, share).
type Case = (
    String,
    (Option<f64>, i64, bool, Option<i64>),
    (bool, i64, f64),
);

/// Composed expressions (depth up to 5: nested `? :`, `||` and `&&` over errors, mixed
/// kinds, fields that are null, strings or missing) on varied hosts and jobs: the fast
/// form gives what `cel` gives, value or error, whenever it tells (a fixed seed: the same
/// cases each run).
#[test]
fn generated_expressions_give_what_cel_gives() {
    use proptest::{
        prelude::*,
        test_runner::{Config, RngAlgorithm, TestRng, TestRunner},
    };
    const LEAVES: &[&str] = &[
        "null",
        "true",
        "false",
        "0",
        "1",
        "-2",
        "3u",
        "0.0",
        "1.5",
        "-2.5",
        "300.0",
        "host.load1",
        "host.cpus",
        "host.private",
        "host.owner_idle_s",
        "host.keyboard_idle_s",
        "host.name",
        "host.users",
        "host.mem_avail_mb",
        "job.adaptive",
        "job.hosts_held",
        "job.share",
        "holder.adaptive",
    ];
    let leaf = prop::sample::select(LEAVES).prop_map(String::from);
    let expr = leaf.prop_recursive(5, 48, 3, |inner| {
        prop_oneof![
            (inner.clone(), prop::sample::select(BINARY), inner.clone())
                .prop_map(|(a, op, b)| format!("({a}) {op} ({b})")),
            (prop::sample::select(UNARY), inner.clone()).prop_map(|(op, a)| match op {
                "double" => format!("double({a})"),
                _ => format!("{op}({a})"),
            }),
            (inner.clone(), inner.clone(), inner)
                .prop_map(|(c, a, b)| format!("({c}) ? ({a}) : ({b})")),
        ]
    });
    let host = (
        prop::option::of(prop::sample::select(&[0.0, 0.5, 2.0, -1.0][..])),
        0i64..3,
        any::<bool>(),
        prop::option::of(prop::sample::select(
            &[0i64, 299, 300, 9_223_372_036_854_775_807][..],
        )),
    );
    let job = (
        any::<bool>(),
        0i64..3,
        prop::sample::select(&[0.0, 1.0, 2.5][..]),
    );
    let env = std::sync::Arc::new(crate::cost::env());
    let lets = BTreeMap::new();
    let ev = Evaluator {
        env: &env,
        lets: &lets,
    };
    let (told, compared) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let check = |(text, (load1, cpus, private, idle), (adaptive, held, share)): Case| {
        let host = HostFacts {
            name: "n1".into(),
            load1,
            cpus,
            owner: private.then(|| "ann".to_string()),
            users: Some(Vec::new()),
            console_idle_s: idle,
            ..HostFacts::default()
        }
        .derive();
        let fields = crate::value::HostFields::named([
            "load1",
            "cpus",
            "private",
            "owner_idle_s",
            "keyboard_idle_s",
            "name",
            "users",
        ]);
        let host = HostValue::reading(&host, fields);
        let job = JobValue::new(&JobFacts {
            adaptive,
            hosts_held: held,
            share,
            ..JobFacts::default()
        });
        let scope = Scope::new().host(&host).job(&job);
        let parsed = cel::parser::Parser::new().parse(&text).expect("parses");
        let run = ast::indexed(&parsed);
        let node = compile(&run, &BTreeMap::new()).expect("a fast form");
        let vars = [Var::Host, Var::Job];
        compared.set(compared.get() + 1);
        let slow = || ev.value(&vars, &run, scope).map_err(|_| ());
        match node.eval(&vars, &scope) {
            Err(Stop::Unknown) => return Ok(()),
            Err(Stop::Error) => assert!(slow().is_err(), "`{text}`: fast fails, cel not"),
            Ok(s) => {
                let (fast, slow) = (Ok(to_value(s)), slow());
                assert!(same(&fast, &slow), "`{text}`: fast {fast:?}, cel {slow:?}");
            }
        }
        told.set(told.get() + 1);
        Ok(())
    };
    let config = Config {
        cases: 3000,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, b"resourcebroker-fast-path-vs-cel!");
    let mut runner = TestRunner::new_with_rng(config, rng);
    runner
        .run(&(expr, host, job), check)
        .expect("the fast form agrees with cel");
    let (told, compared) = (told.get(), compared.get());
    assert!(told > compared / 2, "{told} of {compared} told");
}
