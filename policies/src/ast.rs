//! Walking CEL syntax trees: every node, and field selections on a variable
//! (`host.load1`, `job.spec.count`). Used by the field check and by explain.

use cel::{
    common::ast::{EntryExpr, Expr},
    IdedExpr,
};

use crate::hooks::Var;

/// Calls `f` on `e` and every node below it.
pub(crate) fn walk<'e>(e: &'e IdedExpr, f: &mut impl FnMut(&'e IdedExpr)) {
    f(e);
    match &e.expr {
        Expr::Select(s) => walk(&s.operand, f),
        Expr::Call(c) => {
            if let Some(t) = &c.target {
                walk(t, f);
            }
            c.args.iter().for_each(|a| walk(a, f));
        }
        Expr::List(l) => l.elements.iter().for_each(|x| walk(x, f)),
        Expr::Map(m) => {
            for entry in &m.entries {
                match &entry.expr {
                    EntryExpr::MapEntry(m) => {
                        walk(&m.key, f);
                        walk(&m.value, f);
                    }
                    EntryExpr::StructField(s) => walk(&s.value, f),
                }
            }
        }
        Expr::Comprehension(c) => {
            for x in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                walk(x, f);
            }
        }
        _ => {}
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
fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
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
