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
