//! What one evaluation may cost: a static estimate checked at load, and a run-time budget.
//!
//! CEL always ends, but not soon: ten lets each naming the one below ten times inside an
//! `exists`, or `map`s nested over a 1000-element list, are a few hundred bytes of policy
//! and billions of steps (or elements) of evaluation. As Kubernetes does for its CEL, every
//! expression gets a cost:
//!
//! - **At load** (`estimate`): an upper bound of the work of one evaluation, in cost
//!   units (about one per node visited and one per element or byte copied or compared),
//!   counting each use of a let at the let's own whole estimate, as if it were written out
//!   there (Kubernetes' estimator does the same for its variables). Lets are evaluated once
//!   per evaluation (see `eval`), so this is an upper bound; it keeps a file's cost
//!   readable from its text, and refuses a let fan-out (ten uses of a let that uses another
//!   ten times, six levels deep) whatever the evaluator would make of it. Input fields that are lists, maps or strings are assumed to hold at most
//!   [`INPUT_SIZE`] elements or bytes; a comprehension costs its range's size times its
//!   body. A file whose expression (with its lets) is estimated above [`MAX_COST`] is
//!   refused, the estimate and the budget in the message.
//! - **At run time** (`instrument`, `Budget`): the syntax tree is rewritten so that
//!   every comprehension iteration charges its estimated cost (and the size of the value
//!   it passes through) to a thread-local budget of [`RUN_BUDGET`] units, through the
//!   internal function `@rb_cost` (not writable in a policy: `@` is no identifier
//!   character). Outside comprehensions, work is bounded by the tree and the inputs'
//!   sizes, both bounded before evaluation starts. An evaluation
//!   that exhausts it fails with [`EXHAUSTED`] (a policy evaluation error: the hook's
//!   default applies), and nothing it computed meanwhile counts, even where `||` or
//!   `exists` would absorb an error. The charge is the size of the value passed through,
//!   so the memory an evaluation allocates is bounded by the budget too.

use std::{cell::Cell, collections::BTreeMap};

use cel::{
    common::{
        ast::{operators, CallExpr, EntryExpr, Expr, LiteralValue},
        types::{DYN_TYPE, INT_TYPE},
        value::CowVal,
    },
    Env, ExecutionError, IdedExpr,
};

use crate::{ast, hooks::Var};

/// The largest estimated cost of one expression with the lets it uses. The shipped
/// policies' largest is about 200 (`dedicated`'s `may_preempt`); one comprehension over an
/// input list comparing strings costs about 10 000; two nested ones are refused.
pub const MAX_COST: u64 = 100_000;

/// What one evaluation may spend at run time, in the same units: about a millisecond.
pub const RUN_BUDGET: u64 = MAX_COST;

/// The size the estimate assumes for an input field that is a list, a map or a string
/// (`host.users`, `job.spec`, `host.name`). A larger input is evaluated within the
/// run-time budget all the same.
pub const INPUT_SIZE: u64 = 100;

/// How many syntax-tree nodes the estimator visits at most for one expression (nested
/// comprehensions are visited more than once): beyond, the estimate is "too complex",
/// which is refused like an estimate over the budget.
const MAX_VISITS: u64 = 200_000;

/// The message of an evaluation that ran out of budget.
pub const EXHAUSTED: &str = "the evaluation exceeded its run-time cost budget";

/// The name of the internal charging function.
const CHARGE: &str = "@rb_cost";

/// The estimated cost of evaluating an expression once, and the largest size (elements or
/// bytes, nested ones counted) of its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimate {
    pub cost: u64,
    pub size: u64,
}

/// What the estimator knows of the names an expression uses.
pub(crate) struct Names<'a> {
    /// The estimates of the lets (their value's size is what a use of the name gives).
    pub lets: &'a BTreeMap<String, Estimate>,
}

/// The estimate of `e`, `None` when it is too complex to estimate (see [`MAX_VISITS`]).
pub(crate) fn estimate(e: &IdedExpr, names: &Names<'_>) -> Option<(Estimate, PerItem)> {
    let mut walk = Estimator {
        names,
        bound: Vec::new(),
        visits: 0,
        per_item: PerItem::new(),
    };
    let est = walk.node(e);
    (walk.visits <= MAX_VISITS).then_some((est, walk.per_item))
}

/// The estimated cost of one iteration of each comprehension, by its node id: what
/// [`instrument`] charges per iteration at run time.
pub(crate) type PerItem = BTreeMap<u64, u64>;

struct Estimator<'a> {
    names: &'a Names<'a>,
    /// Comprehension variables in scope, innermost last, with their size.
    bound: Vec<(String, u64)>,
    visits: u64,
    per_item: PerItem,
}

impl Estimator<'_> {
    fn node(&mut self, e: &IdedExpr) -> Estimate {
        self.visits += 1;
        if self.visits > MAX_VISITS {
            return Estimate {
                cost: u64::MAX,
                size: u64::MAX,
            };
        }
        match &e.expr {
            Expr::Literal(l) => leaf(literal_size(l)),
            Expr::Ident(name) => Estimate {
                cost: self.let_cost(name).saturating_add(1),
                size: self.ident_size(name),
            },
            Expr::Select(s) => {
                let operand = self.node(&s.operand);
                let size = match ast::var_field(e) {
                    Some((var, field)) => field_size(var, field),
                    None if s.test => 1,
                    None => operand.size,
                };
                Estimate {
                    cost: operand.cost.saturating_add(1),
                    size,
                }
            }
            Expr::Call(c) => self.call(c),
            Expr::List(l) => self.all(l.elements.iter()),
            Expr::Map(m) => self.all(m.entries.iter().flat_map(|entry| match &entry.expr {
                EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
                EntryExpr::StructField(s) => vec![&s.value],
            })),
            Expr::Struct(s) => self.all(s.entries.iter().flat_map(|entry| match &entry.expr {
                EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
                EntryExpr::StructField(s) => vec![&s.value],
            })),
            Expr::Comprehension(c) => self.comprehension(e.id, c),
            Expr::Unspecified => leaf(1),
        }
    }

    /// What a use of `name` costs beyond the lookup: a let's whole estimate (each use
    /// counted as if the let were written out there), nothing for anything else.
    fn let_cost(&self, name: &str) -> u64 {
        if self.bound.iter().any(|(n, _)| n == name) {
            return 0;
        }
        self.names.lets.get(name).map_or(0, |est| est.cost)
    }

    fn ident_size(&self, name: &str) -> u64 {
        if let Some((_, size)) = self.bound.iter().rev().find(|(n, _)| n == name) {
            return *size;
        }
        if let Some(est) = self.names.lets.get(name) {
            return est.size;
        }
        if Var::ALL.iter().any(|v| v.name() == name) {
            return INPUT_SIZE;
        }
        1
    }

    /// A literal list or map: building it visits and copies every element.
    fn all<'e>(&mut self, parts: impl Iterator<Item = &'e IdedExpr>) -> Estimate {
        let mut total = Estimate { cost: 1, size: 1 };
        for p in parts {
            let est = self.node(p);
            total.cost = total.cost.saturating_add(est.cost).saturating_add(1);
            total.size = total.size.saturating_add(est.size);
        }
        total
    }

    fn call(&mut self, c: &CallExpr) -> Estimate {
        let args: Vec<Estimate> = c
            .target
            .iter()
            .map(|t| &**t)
            .chain(&c.args)
            .map(|a| self.node(a))
            .collect();
        let cost = args.iter().fold(1u64, |sum, a| sum.saturating_add(a.cost));
        let sizes = args.iter().fold(0u64, |sum, a| sum.saturating_add(a.size));
        let largest = args.iter().map(|a| a.size).max().unwrap_or(1);
        let (extra, size) = match c.func_name.as_str() {
            operators::LOGICAL_AND
            | operators::LOGICAL_OR
            | operators::LOGICAL_NOT
            | operators::NOT_STRICTLY_FALSE
            | "int"
            | "uint"
            | "double"
            | "bool"
            | "type"
            | "dyn" => (0, 1),
            operators::CONDITIONAL => (0, args.iter().skip(1).map(|a| a.size).max().unwrap_or(1)),
            operators::INDEX => (0, args.first().map_or(1, |a| a.size)),
            operators::ADD => (sizes, sizes),
            "string" | "bytes" => (largest.max(32), largest.max(32)),
            operators::EQUALS
            | operators::NOT_EQUALS
            | operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS
            | operators::IN
            | "size"
            | "contains"
            | "startsWith"
            | "endsWith" => (sizes, 1),
            _ => (sizes, largest),
        };
        Estimate {
            cost: cost.saturating_add(extra),
            size,
        }
    }

    /// A comprehension (`all`, `exists`, `exists_one`, `map`, `filter`): its range's size
    /// times its body. The accumulator grows by what one step adds, once per element; a
    /// step that adds more each time (`accu + accu`) is estimated as unbounded.
    fn comprehension(&mut self, id: u64, c: &cel::common::ast::ComprehensionExpr) -> Estimate {
        let range = self.node(&c.iter_range);
        let init = self.node(&c.accu_init);
        let n = range.size;
        let mut vars = vec![(c.iter_var.clone(), range.size)];
        if let Some(v2) = &c.iter_var2 {
            vars.push((v2.clone(), range.size));
        }
        let depth = self.bound.len();
        self.bound.extend(vars);
        let step_at = |me: &mut Self, accu: u64| {
            me.bound.push((c.accu_var.clone(), accu));
            let step = me.node(&c.loop_step);
            me.bound.pop();
            step
        };
        let s0 = init.size;
        let s1 = step_at(self, s0).size;
        let accu = if s1 <= s0 {
            s0
        } else {
            let s2 = step_at(self, s1).size;
            let (d1, d2) = (s1 - s0, s2.saturating_sub(s1));
            if d2 > d1 {
                u64::MAX
            } else {
                s0.saturating_add(n.saturating_mul(d1))
            }
        };
        // `map` and `filter` append in place: a step copies the element, not the
        // accumulator.
        let copied = if appends(&c.loop_step, &c.accu_var) {
            s0
        } else {
            accu
        };
        self.bound.push((c.accu_var.clone(), copied));
        let per_item = self
            .node(&c.loop_cond)
            .cost
            .saturating_add(self.node(&c.loop_step).cost)
            .saturating_add(1);
        let recorded = self.per_item.entry(id).or_default();
        *recorded = (*recorded).max(per_item);
        self.bound.pop();
        self.bound.push((c.accu_var.clone(), accu));
        let result = self.node(&c.result);
        self.bound.truncate(depth);
        Estimate {
            cost: range
                .cost
                .saturating_add(init.cost)
                .saturating_add(n.saturating_mul(per_item))
                .saturating_add(result.cost),
            size: result.size,
        }
    }
}

fn leaf(size: u64) -> Estimate {
    Estimate { cost: 1, size }
}

fn literal_size(l: &LiteralValue) -> u64 {
    match l {
        LiteralValue::String(s) => s.inner().len() as u64,
        LiteralValue::Bytes(b) => b.inner().len() as u64,
        _ => 1,
    }
}

/// The size of `var.field`: 1 for a number, a bool or null; [`INPUT_SIZE`] for a string,
/// a list or a map (read from a complete sample, so a new fact field is sized right).
fn field_size(var: Var, field: &str) -> u64 {
    if crate::samples::scalar_field(var, field) {
        1
    } else {
        INPUT_SIZE
    }
}

/// Whether `step` is a `map` or `filter` step, `accu + [x]` or `g ? accu + [x] : accu`,
/// which the interpreter runs as an append in place.
fn appends(step: &IdedExpr, accu: &str) -> bool {
    let is_accu = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(n) if n == accu);
    let Expr::Call(c) = &step.expr else {
        return false;
    };
    match (c.func_name.as_str(), c.args.as_slice()) {
        (operators::ADD, [lhs, rhs]) => is_accu(lhs) && matches!(rhs.expr, Expr::List(_)),
        (operators::CONDITIONAL, [_, append, otherwise]) => {
            is_accu(otherwise) && appends(append, accu)
        }
        _ => false,
    }
}

/// Rewrites `e` so that evaluating it charges the run-time budget, once per comprehension
/// iteration: the iteration's estimated cost (`per_item`) and the size of the value
/// passed through. The charge is on the loop condition, which ends the loop when it fails
/// (an error in a step is absorbed by `exists` and `all`), or on the appended element
/// and guard of `map` and `filter`, so that the interpreter's in-place append still applies.
pub(crate) fn instrument(e: &mut IdedExpr, per_item: &PerItem) {
    let mut next = u64::MAX / 2;
    rewrite(e, per_item, &mut next);
}

fn rewrite(e: &mut IdedExpr, per_item: &PerItem, next: &mut u64) {
    let id = e.id;
    match &mut e.expr {
        Expr::Select(s) => rewrite(&mut s.operand, per_item, next),
        Expr::Call(c) => {
            if let Some(t) = &mut c.target {
                rewrite(t, per_item, next);
            }
            c.args.iter_mut().for_each(|a| rewrite(a, per_item, next));
        }
        Expr::List(l) => l
            .elements
            .iter_mut()
            .for_each(|x| rewrite(x, per_item, next)),
        Expr::Map(m) => {
            for entry in &mut m.entries {
                match &mut entry.expr {
                    EntryExpr::MapEntry(m) => {
                        rewrite(&mut m.key, per_item, next);
                        rewrite(&mut m.value, per_item, next);
                    }
                    EntryExpr::StructField(s) => rewrite(&mut s.value, per_item, next),
                }
            }
        }
        Expr::Comprehension(c) => {
            for x in [
                &mut c.iter_range,
                &mut c.accu_init,
                &mut c.result,
                &mut c.loop_cond,
                &mut c.loop_step,
            ] {
                rewrite(x, per_item, next);
            }
            let weight = per_item.get(&id).copied().unwrap_or(1);
            if !charge_append(&mut c.loop_step, &c.accu_var, weight, next) {
                wrap(&mut c.loop_cond, weight, next);
            }
        }
        _ => {}
    }
}

/// A `map` or `filter` step, `accu + [x]` or `g ? accu + [x] : accu`: charges `x` (or `g`)
/// inside, keeping the shape the interpreter appends in place. False for another step.
fn charge_append(step: &mut IdedExpr, accu: &str, weight: u64, next: &mut u64) -> bool {
    if !appends(step, accu) {
        return false;
    }
    let Expr::Call(c) = &mut step.expr else {
        return false;
    };
    match c.args.as_mut_slice() {
        [guard, _, _] if c.func_name == operators::CONDITIONAL => wrap(guard, weight, next),
        [_, items] => {
            if let Expr::List(items) = &mut items.expr {
                if let Some(x) = items.elements.first_mut() {
                    wrap(x, weight, next);
                }
            }
        }
        _ => {}
    }
    true
}

/// Replaces `e` by `@rb_cost(e, weight)`, with ids no source position has.
fn wrap(e: &mut IdedExpr, weight: u64, next: &mut u64) {
    let inner = std::mem::take(e);
    *next += 2;
    let weight = IdedExpr {
        id: *next - 1,
        expr: Expr::Literal(LiteralValue::Int(
            i64::try_from(weight).unwrap_or(i64::MAX).into(),
        )),
    };
    *e = IdedExpr {
        id: *next,
        expr: Expr::Call(CallExpr {
            func_name: CHARGE.to_string(),
            target: None,
            args: vec![inner, weight],
        }),
    };
}

/// The CEL environment of every policy: the standard library and `@rb_cost`.
pub(crate) fn env() -> Env {
    let mut env = Env::stdlib();
    env.add_overload(CHARGE, "rb_cost_dyn_int", vec![DYN_TYPE, INT_TYPE], charge)
        .expect("`@rb_cost` is no standard function");
    env
}

thread_local! {
    /// What the evaluation running on this thread may still spend; `None` when it has
    /// exhausted its budget.
    static LEFT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// `@rb_cost(x, weight)`: charges `weight` and `x`'s size, and gives `x`.
fn charge<'b, 'v>(mut args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let weight = args
        .pop()
        .and_then(|w| {
            w.downcast_ref::<cel::common::types::CelInt>()
                .map(|w| *w.inner())
        })
        .and_then(|w| u64::try_from(w).ok())
        .ok_or_else(|| ExecutionError::function_error(CHARGE, "no weight"))?;
    let value = args
        .pop()
        .ok_or_else(|| ExecutionError::function_error(CHARGE, "no argument"))?;
    let size = value
        .as_sizer()
        .map_or(0, |s| u64::try_from(*s.size().inner()).unwrap_or(0));
    let spent = size.saturating_add(weight);
    let ok = LEFT.with(|left| match left.get() {
        Some(n) if n >= spent => {
            left.set(Some(n - spent));
            true
        }
        _ => {
            left.set(None);
            false
        }
    });
    if ok {
        Ok(value)
    } else {
        Err(ExecutionError::function_error(
            "cost",
            format!("{EXHAUSTED} of {RUN_BUDGET}"),
        ))
    }
}

/// The run-time budget of one evaluation on this thread: set by [`Budget::start`], checked
/// by [`Budget::exhausted`], the previous one restored on drop (evaluations do not nest
/// today, but a nested one must not refill its caller's budget).
pub(crate) struct Budget {
    previous: Option<u64>,
}

impl Budget {
    pub(crate) fn start() -> Budget {
        let previous = LEFT.with(|left| left.replace(Some(RUN_BUDGET)));
        Budget { previous }
    }

    /// Whether the evaluation ran out (an error `||` or `exists` absorbed is still one).
    pub(crate) fn exhausted(&self) -> bool {
        LEFT.with(|left| left.get().is_none())
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        let left = LEFT.with(|left| left.replace(self.previous));
        SPENT.with(|spent| spent.set(RUN_BUDGET - left.unwrap_or(0)));
    }
}

thread_local! {
    /// What the last evaluation on this thread spent ([`last_spent`]).
    static SPENT: Cell<u64> = const { Cell::new(0) };
}

/// The run-time units the last evaluation on this thread spent (tests compare it with the
/// estimate).
#[doc(hidden)]
pub fn last_spent() -> u64 {
    SPENT.with(Cell::get)
}
