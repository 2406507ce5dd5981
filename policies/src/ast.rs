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
