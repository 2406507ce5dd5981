//! Splitting `start` for speed: the conjuncts of its top-level `&&` chain that read only
//! `host` form a *host gate*. When one of them is false on a host, `start` is false there for
//! every job (CEL's `&&` is false as soon as one side is, even if the other fails), so the
//! broker can evaluate the gate once per host report and skip the host until the next one.

use std::collections::{BTreeMap, BTreeSet};

use cel::{
    common::ast::{operators::LOGICAL_AND, Expr},
    IdedExpr,
};

use crate::{compile::Compiled, hooks::Var};

/// The host-only conjuncts of `c`'s top-level `&&` chain (empty when there are none, or when
/// the whole expression is host-only: then cache the whole value instead).
pub(crate) fn host_gate(c: &Compiled, lets: &BTreeMap<String, Compiled>) -> Vec<IdedExpr> {
    let mut parts = Vec::new();
    conjuncts(&c.expr, &mut parts);
    if parts.len() < 2 {
        return Vec::new();
    }
    parts
        .into_iter()
        .filter(|e| reads(e, lets).iter().all(|v| *v == Var::Host))
        .cloned()
        .collect()
}

fn conjuncts<'e>(e: &'e IdedExpr, out: &mut Vec<&'e IdedExpr>) {
    match &e.expr {
        Expr::Call(call) if call.func_name == LOGICAL_AND && call.target.is_none() => {
            for arg in &call.args {
                conjuncts(arg, out);
            }
        }
        _ => out.push(e),
    }
}

/// The variables `e` reads, directly or through lets.
fn reads(e: &IdedExpr, lets: &BTreeMap<String, Compiled>) -> BTreeSet<Var> {
    let refs = e.references();
    let names = refs.variables();
    let mut out: BTreeSet<Var> = Var::ALL
        .into_iter()
        .filter(|v| names.contains(&v.name()))
        .collect();
    for c in names.iter().filter_map(|n| lets.get(*n)) {
        out.extend(c.reads.iter().copied());
    }
    out
}
