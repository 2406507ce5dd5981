//! Walking CEL syntax trees: every node, and field selections on a variable
//! (`host.load1`, `job.spec.count`). Used by the field check and by explain; and the
//! evaluated form of an expression ([`indexed`]).

use cel::{
    common::ast::{operators, CallExpr, EntryExpr, Expr, LiteralValue},
    IdedExpr,
};

use crate::hooks::Var;

/// Calls `f` on `e` and every node below it.
pub(crate) fn walk<'e>(e: &'e IdedExpr, f: &mut impl FnMut(&'e IdedExpr)) {
    f(e);
    for child in children(e) {
        walk(child, f);
    }
}

/// Adds to `out` the top-level fields of `host` that `e` selects (`users` for
/// `host.users[0].idle_s`). False when `e` also uses `host` otherwise (`size(host)`,
/// `host["load1"]`): then it may read any field.
pub(crate) fn host_fields_selected(e: &IdedExpr, out: &mut Vec<String>) -> bool {
    let (mut selects, mut mentions) = (0, 0);
    walk(e, &mut |node| {
        if let Some((Var::Host, field)) = var_field(node) {
            out.push(field.to_string());
            selects += 1;
        }
        if matches!(&node.expr, Expr::Ident(name) if name == Var::Host.name()) {
            mentions += 1;
        }
    });
    mentions == selects
}

/// The depth of `e`'s tree (a leaf is 1), without recursion: a tree too deep to evaluate
/// must not overflow the stack of the code that refuses it.
pub(crate) fn depth(e: &IdedExpr) -> usize {
    let mut deepest = 0;
    let mut todo = vec![(e, 1)];
    while let Some((node, level)) = todo.pop() {
        deepest = deepest.max(level);
        todo.extend(children(node).into_iter().map(|c| (c, level + 1)));
    }
    deepest
}

/// The nodes right below `e`.
pub(crate) fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
    match &e.expr {
        Expr::Select(s) => vec![&*s.operand],
        Expr::Call(c) => c.target.as_deref().into_iter().chain(&c.args).collect(),
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|entry| match &entry.expr {
                EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
                EntryExpr::StructField(s) => vec![&s.value],
            })
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        _ => Vec::new(),
    }
}

/// The nodes right below `e`, to rewrite them (as [`children`]).
pub(crate) fn children_mut(e: &mut IdedExpr) -> Vec<&mut IdedExpr> {
    match &mut e.expr {
        Expr::Select(s) => vec![&mut *s.operand],
        Expr::Call(c) => c
            .target
            .as_deref_mut()
            .into_iter()
            .chain(&mut c.args)
            .collect(),
        Expr::List(l) => l.elements.iter_mut().collect(),
        Expr::Map(m) => m
            .entries
            .iter_mut()
            .flat_map(|entry| match &mut entry.expr {
                EntryExpr::MapEntry(m) => vec![&mut m.key, &mut m.value],
                EntryExpr::StructField(s) => vec![&mut s.value],
            })
            .collect(),
        Expr::Comprehension(c) => vec![
            &mut c.iter_range,
            &mut c.accu_init,
            &mut c.loop_cond,
            &mut c.loop_step,
            &mut c.result,
        ],
        _ => Vec::new(),
    }
}

/// A selection of a field of a variable: `host.load1` is `(Host, "load1")`.
pub(crate) fn var_field(e: &IdedExpr) -> Option<(Var, &str)> {
    let Expr::Select(s) = &e.expr else {
        return None;
    };
    let Expr::Ident(root) = &s.operand.expr else {
        return None;
    };
    let var = Var::ALL.into_iter().find(|v| v.name() == root)?;
    Some((var, &s.field))
}

/// The dotted path of a selection on a variable, down to `job.spec.KEY`.
pub(crate) fn var_path(e: &IdedExpr) -> Option<String> {
    if let Some((var, field)) = var_field(e) {
        return Some(format!("{}.{field}", var.name()));
    }
    let Expr::Select(s) = &e.expr else {
        return None;
    };
    var_path(&s.operand)
        .filter(|p| p.ends_with(".spec"))
        .map(|p| format!("{p}.{}", s.field))
}

/// The form of `e` that is evaluated: each field selection on a variable (`host.load1`) an
/// index with the field's name (`host["load1"]`), the rest as it was.
///
/// Same value and same error: on a map (every variable's value is one) a selection is the
/// index by the field's name, and an unbound variable is the same undeclared reference.
/// But the interpreter takes `host.load1` for a possibly qualified name: it joins the
/// segments into a new string and looks `host.load1` up as a variable and then as a type
/// before it tries `host`, on every evaluation; that was about a fifth of the time of the
/// paper policy's `start` and `rank` (4.5 µs a host, 3.7 with indexes). An index resolves
/// `host` alone.
///
/// Presence tests (`has(host.load1)`) stay as they are, and so does everything inside a
/// comprehension that names its own variable like one of ours (`l.exists(host, …)`): there
/// `host` may not be a map, and a selection on another value fails with another message.
/// The nodes it adds take ids from `u64::MAX / 4` upwards (no source position has them).
pub(crate) fn indexed(e: &IdedExpr) -> IdedExpr {
    let mut out = e.clone();
    index_var_fields(&mut out, &mut (u64::MAX / 4));
    out
}

fn index_var_fields(e: &mut IdedExpr, next: &mut u64) {
    if let Expr::Comprehension(c) = &e.expr {
        let shadows = [Some(&c.iter_var), c.iter_var2.as_ref(), Some(&c.accu_var)]
            .into_iter()
            .flatten()
            .any(|name| Var::ALL.iter().any(|v| v.name() == name));
        if shadows {
            return;
        }
    }
    for child in children_mut(e) {
        index_var_fields(child, next);
    }
    let Expr::Select(s) = &mut e.expr else {
        return;
    };
    let on_a_var = matches!(&s.operand.expr, Expr::Ident(root)
        if Var::ALL.iter().any(|v| v.name() == root));
    if on_a_var && !s.test {
        let operand = std::mem::take(&mut *s.operand);
        let field = std::mem::take(&mut s.field);
        *next += 1;
        let name = IdedExpr {
            id: *next,
            expr: Expr::Literal(LiteralValue::String(field.into())),
        };
        e.expr = Expr::Call(CallExpr {
            func_name: operators::INDEX.to_string(),
            target: None,
            args: vec![operand, name],
        });
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{
        check::tests_support::built,
        value::{HostFields, HostValue},
        Policy,
    };

    /// Expressions beside the shipped policies' that the rewrite must leave alone or get
    /// right: presence tests, deeper selections, a comprehension whose variable is named
    /// `host`, fields no value has, variables a hook may not read, lets.
    const TRICKY: &str = r#"
start = 'has(host.load1) && host.users.all(u, u.idle_s >= 0) && [1, 2].exists(host, host > 1) && [1].all(x, x <= looped)'
rank = 'double(size(host.labels)) + (has(job.spec.nodes) ? 1.0 : 0.0) + (host.load1 == null ? 0.0 : host.load1) + d + outer + double([host].map(h, h.cpus)[0])'
vacate = '[{"load1": 1}].all(host, host.load1 == 1) && (host.owner == "x" || !host.private) && twice > 1 && twice < 100'
may_preempt = 'holder.adaptive && job.user == holder.user && lab.free_hosts >= 0 && now.hour >= 0'
max_hosts = '[job].map(j, j.count)[0]'
[let]
d = 'host.sessions.size() > 0 ? double(host.sessions[0].idle_s) : 0.5'
inner = 'host.load1 == null ? 1.0 : host.load1'
outer = 'inner * 2.0'
twice = 'host.cpus * 2'
looped = 'host.cpus'
"#;

    fn policies() -> Vec<Policy> {
        let mut all: Vec<Policy> = crate::SHIPPED
            .iter()
            .map(|(name, _)| Policy::shipped(name).expect("shipped"))
            .collect();
        all.push(Policy::from_text(Path::new("t.toml"), TRICKY).expect("loads"));
        all
    }

    /// Every expression of every policy, evaluated as written and as rewritten (lets
    /// inlined, selections indexed), gives the same value or an error, on every sample,
    /// with the whole host value and with a host value of no fields (every selection a
    /// missing key, every let that reads one failing), every variable bound; and, run
    /// again as written on failure, the same message.
    #[test]
    fn the_indexed_form_evaluates_as_the_expression_does() {
        let samples = crate::samples::complete()
            .into_iter()
            .chain(crate::samples::sparse())
            .collect::<Vec<_>>();
        let mut compared = 0;
        for policy in policies() {
            let ev = policy.evaluator();
            let exprs = policy
                .file_expressions()
                .map(|(_, c)| c)
                .chain(policy.lets().values())
                .collect::<Vec<_>>();
            for s in &samples {
                let b = built(s);
                let empty = HostValue::reading(&s.host, HostFields::NONE);
                for scope in [b.scope(), b.scope().host(&empty)] {
                    for c in &exprs {
                        let written = ev.value(&Var::ALL, &c.expr, scope);
                        let run = ev.value(&Var::ALL, &c.run, scope);
                        let what = format!("`{}` on {}", c.entry.source, s.name);
                        assert_eq!(run.is_ok(), written.is_ok(), "{what}");
                        assert_eq!(run.as_ref().ok(), written.as_ref().ok(), "{what}");
                        // The message too, once the failure is run again as written.
                        assert_eq!(ev.value_of(&Var::ALL, c, scope), written, "{what}");
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared > 1000, "{compared}");
    }

    /// What the rewrite leaves: no selection on a variable but presence tests and those
    /// inside a comprehension that names its own `host`.
    #[test]
    fn selections_on_variables_become_indexes() {
        let p = Policy::from_text(Path::new("t.toml"), TRICKY).expect("loads");
        let mut left = Vec::new();
        for (_, c) in p.file_expressions() {
            walk(&c.run, &mut |node| {
                if let (Some((var, field)), Expr::Select(s)) = (var_field(node), &node.expr) {
                    left.push(format!(
                        "{}.{field}{}",
                        var.name(),
                        if s.test { "?" } else { "" }
                    ));
                }
            });
        }
        left.sort();
        assert_eq!(
            left,
            ["host.load1", "host.load1?"],
            "has(host.load1), and `host.load1` on the comprehension's own `host`"
        );
    }
}
