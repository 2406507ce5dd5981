//! The evaluated form's fast path: expressions of scalars (null, bools, numbers), the
//! fields of the variables, the lets, `? :`, `||`, `&&`, `!`, comparisons, arithmetic and
//! `double()` — all of the shipped policies' `start`, `rank` and `vacate` — evaluated
//! without the `cel` interpreter, whose contexts, boxed intermediate values and map lookups
//! by hashed name cost ten times the arithmetic (a tenth of the broker's CPU at 10k hosts
//! with changing reports, in the paper's `rank`).
//!
//! Same values as `cel` by construction, checked by tests: each operation does what `cel`
//! 0.15 does for these types (its `&&` and `||` absorbing an error when the other side
//! decides, its checked integer arithmetic, its comparisons across int, uint and double),
//! and every type it does not model (strings, lists, maps, a field holding one) stops the
//! fast path: the caller then evaluates with `cel` ([`Stop::Unknown`]). An error stops it
//! too ([`Stop::Error`]): the fast path says there is one, never which; the caller asks
//! `cel` for the message when it needs one. A tree with anything else (a comprehension, a
//! presence test, another function) has no fast form at all ([`compile`] gives `None`).
//!
//! A let used more than once is written in at each use: same values (expressions have no
//! side effects), evaluated once per use; the form is refused beyond [`MAX_NODES`] nodes,
//! so a chain of lets each using the next twice never grows it exponentially.

use std::collections::BTreeMap;

use cel::{
    common::ast::{operators, CallExpr, Expr, LiteralValue},
    IdedExpr,
};

use crate::{eval::Scope, hooks::Var};

/// Most nodes a fast form may have, with each let written in at each of its uses.
pub(crate) const MAX_NODES: usize = 256;

/// A scalar value, as CEL has it; [`Scalar::Other`] stands for any other type (a string, a
/// list, a map), which the fast path does not evaluate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Double(f64),
    Other,
}

/// Why a fast evaluation gave no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// CEL gives an error here (which one, only `cel` says).
    Error,
    /// A value the fast path does not model: evaluate with `cel`.
    Unknown,
}

type Outcome = Result<Scalar, Stop>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unary {
    Not,
    Negate,
    ToDouble,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binary {
    Or,
    And,
    Equals,
    NotEquals,
    Less,
    LessEquals,
    Greater,
    GreaterEquals,
    Add,
    Subtract,
    Multiply,
    Divide,
    Modulo,
}

/// A fast form: the expression's tree, lets written in.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Literal(Scalar),
    Field(Var, Box<str>),
    Unary(Unary, Box<Node>),
    Binary(Binary, Box<Node>, Box<Node>),
    Conditional(Box<Node>, Box<Node>, Box<Node>),
}

/// The fast form of an evaluated form (`e`, see [`crate::compile::Compiled::run`]), the
/// lets it names given by theirs; `None` when it uses anything the fast path does not
/// evaluate, or a let without one, or grows beyond [`MAX_NODES`].
pub(crate) fn compile(e: &IdedExpr, lets: &BTreeMap<String, Node>) -> Option<Node> {
    let node = build(e, lets)?;
    (node.size() <= MAX_NODES).then_some(node)
}

fn build(e: &IdedExpr, lets: &BTreeMap<String, Node>) -> Option<Node> {
    let node = match &e.expr {
        Expr::Literal(l) => Node::Literal(literal(l)?),
        Expr::Ident(name) => lets.get(name)?.clone(),
        Expr::Call(call) => call_node(call, lets)?,
        _ => return None,
    };
    // Checked as the tree grows, so that a let fan-out stops at the first oversized level.
    (node.size() <= MAX_NODES).then_some(node)
}

fn literal(l: &LiteralValue) -> Option<Scalar> {
    Some(match l {
        LiteralValue::Null => Scalar::Null,
        LiteralValue::Boolean(b) => Scalar::Bool(**b),
        LiteralValue::Int(i) => Scalar::Int(**i),
        LiteralValue::UInt(u) => Scalar::UInt(**u),
        LiteralValue::Double(d) => Scalar::Double(**d),
        _ => return None,
    })
}

fn call_node(call: &CallExpr, lets: &BTreeMap<String, Node>) -> Option<Node> {
    if call.target.is_some() {
        return None;
    }
    let arg = |i: usize| build(&call.args[i], lets).map(Box::new);
    match (call.func_name.as_str(), call.args.len()) {
        (operators::INDEX, 2) => field(&call.args[0], &call.args[1]),
        (operators::CONDITIONAL, 3) => Some(Node::Conditional(arg(0)?, arg(1)?, arg(2)?)),
        (name, 2) => Some(Node::Binary(binary(name)?, arg(0)?, arg(1)?)),
        (operators::LOGICAL_NOT, 1) => Some(Node::Unary(Unary::Not, arg(0)?)),
        (operators::NEGATE, 1) => Some(Node::Unary(Unary::Negate, arg(0)?)),
        ("double", 1) => Some(Node::Unary(Unary::ToDouble, arg(0)?)),
        _ => None,
    }
}

/// `VAR["field"]`: what [`crate::ast::indexed`] makes of `VAR.field`.
fn field(operand: &IdedExpr, key: &IdedExpr) -> Option<Node> {
    let Expr::Ident(root) = &operand.expr else {
        return None;
    };
    let var = Var::ALL.into_iter().find(|v| v.name() == root)?;
    let Expr::Literal(LiteralValue::String(name)) = &key.expr else {
        return None;
    };
    Some(Node::Field(var, name.to_string().into()))
}

fn binary(name: &str) -> Option<Binary> {
    Some(match name {
        operators::LOGICAL_OR => Binary::Or,
        operators::LOGICAL_AND => Binary::And,
        operators::EQUALS => Binary::Equals,
        operators::NOT_EQUALS => Binary::NotEquals,
        operators::LESS => Binary::Less,
        operators::LESS_EQUALS => Binary::LessEquals,
        operators::GREATER => Binary::Greater,
        operators::GREATER_EQUALS => Binary::GreaterEquals,
        operators::ADD => Binary::Add,
        operators::SUBSTRACT => Binary::Subtract,
        operators::MULTIPLY => Binary::Multiply,
        operators::DIVIDE => Binary::Divide,
        operators::MODULO => Binary::Modulo,
        _ => return None,
    })
}

impl Node {
    fn size(&self) -> usize {
        match self {
            Node::Literal(_) | Node::Field(..) => 1,
            Node::Unary(_, a) => 1 + a.size(),
            Node::Binary(_, a, b) => 1 + a.size() + b.size(),
            Node::Conditional(c, a, b) => 1 + c.size() + a.size() + b.size(),
        }
    }

    /// Its value on `scope`, where only `vars` are bound (those of the hook evaluated).
    pub(crate) fn eval(&self, vars: &[Var], scope: &Scope<'_>) -> Outcome {
        match self {
            Node::Literal(s) => Ok(*s),
            Node::Field(var, name) => read_field(vars, scope, *var, name),
            Node::Unary(op, a) => unary(*op, a.eval(vars, scope)?),
            Node::Binary(Binary::Or, a, b) => logical(false, a, b, vars, scope),
            Node::Binary(Binary::And, a, b) => logical(true, a, b, vars, scope),
            Node::Binary(op, a, b) => {
                let lhs = a.eval(vars, scope)?;
                let rhs = b.eval(vars, scope)?;
                binary_op(*op, lhs, rhs)
            }
            Node::Conditional(c, a, b) => match c.eval(vars, scope)? {
                Scalar::Bool(true) => a.eval(vars, scope),
                Scalar::Bool(false) => b.eval(vars, scope),
                Scalar::Other => Err(Stop::Unknown),
                _ => Err(Stop::Error),
            },
        }
    }
}

fn read_field(vars: &[Var], scope: &Scope<'_>, var: Var, name: &str) -> Outcome {
    if !vars.contains(&var) {
        return Err(Stop::Error);
    }
    let Some(value) = scope.prebuilt(var) else {
        return Err(Stop::Error);
    };
    match value.scalar(name) {
        Some(Scalar::Other) => Err(Stop::Unknown),
        Some(s) => Ok(s),
        None => Err(Stop::Error),
    }
}

/// `a || b` (`all` false) or `a && b` (`all` true), as `cel` evaluates them: `a` decides
/// alone when it is the deciding value; an error or a non-bool on the left is absorbed when
/// the right decides; an error on the right is the result.
fn logical(all: bool, a: &Node, b: &Node, vars: &[Var], scope: &Scope<'_>) -> Outcome {
    let deciding = !all;
    let left = match a.eval(vars, scope) {
        Ok(Scalar::Bool(l)) => Some(l),
        Err(Stop::Unknown) | Ok(Scalar::Other) => return Err(Stop::Unknown),
        Ok(_) | Err(Stop::Error) => None,
    };
    if left == Some(deciding) {
        return Ok(Scalar::Bool(deciding));
    }
    match (left, b.eval(vars, scope)?) {
        (Some(_), Scalar::Bool(r)) => Ok(Scalar::Bool(r)),
        (None, Scalar::Bool(r)) if r == deciding => Ok(Scalar::Bool(deciding)),
        (_, Scalar::Other) => Err(Stop::Unknown),
        _ => Err(Stop::Error),
    }
}

fn unary(op: Unary, a: Scalar) -> Outcome {
    match (op, a) {
        (_, Scalar::Other) => Err(Stop::Unknown),
        (Unary::Not, Scalar::Bool(b)) => Ok(Scalar::Bool(!b)),
        (Unary::Negate, Scalar::Int(i)) => i.checked_neg().map(Scalar::Int).ok_or(Stop::Error),
        (Unary::Negate, Scalar::Double(d)) => Ok(Scalar::Double(-d)),
        (Unary::ToDouble, Scalar::Double(d)) => Ok(Scalar::Double(d)),
        (Unary::ToDouble, Scalar::Int(i)) => Ok(Scalar::Double(i as f64)),
        (Unary::ToDouble, Scalar::UInt(u)) => Ok(Scalar::Double(u as f64)),
        _ => Err(Stop::Error),
    }
}

fn binary_op(op: Binary, lhs: Scalar, rhs: Scalar) -> Outcome {
    use std::cmp::Ordering::{Greater, Less};
    if lhs == Scalar::Other || rhs == Scalar::Other {
        return Err(Stop::Unknown);
    }
    let order = || compare(lhs, rhs).ok_or(Stop::Error);
    let truth = |b: bool| Ok(Scalar::Bool(b));
    match op {
        Binary::Equals => truth(equals(lhs, rhs)),
        Binary::NotEquals => truth(!equals(lhs, rhs)),
        Binary::Less => truth(order()? == Less),
        Binary::LessEquals => truth(order()? != Greater),
        Binary::Greater => truth(order()? == Greater),
        Binary::GreaterEquals => truth(order()? != Less),
        Binary::Or | Binary::And => unreachable!("evaluated by `logical`"),
        arithmetic => arithmetic_op(arithmetic, lhs, rhs).ok_or(Stop::Error),
    }
}

/// `cel`'s ordering: bools among themselves, numbers across int, uint and double (`None`:
/// not comparable, NaN included).
fn compare(lhs: Scalar, rhs: Scalar) -> Option<std::cmp::Ordering> {
    use std::cmp::Ordering;
    use Scalar::*;
    match (lhs, rhs) {
        (Bool(a), Bool(b)) => Some(a.cmp(&b)),
        (Int(a), Int(b)) => Some(a.cmp(&b)),
        (UInt(a), UInt(b)) => Some(a.cmp(&b)),
        (Int(a), UInt(b)) => Some(u64::try_from(a).map_or(Ordering::Less, |a| a.cmp(&b))),
        (UInt(a), Int(b)) => Some(i64::try_from(a).map_or(Ordering::Greater, |a| a.cmp(&b))),
        (Double(a), Double(b)) => a.partial_cmp(&b),
        (Int(a), Double(b)) => (a as f64).partial_cmp(&b),
        (UInt(a), Double(b)) => (a as f64).partial_cmp(&b),
        (Double(a), Int(b)) => a.partial_cmp(&(b as f64)),
        (Double(a), UInt(b)) => a.partial_cmp(&(b as f64)),
        _ => None,
    }
}

/// `cel`'s `==`: null equals only null; the rest equal when they compare equal.
fn equals(lhs: Scalar, rhs: Scalar) -> bool {
    match (lhs, rhs) {
        (Scalar::Null, other) => other == Scalar::Null,
        _ => compare(lhs, rhs) == Some(std::cmp::Ordering::Equal),
    }
}

/// Arithmetic on two values of one numeric type (`cel` has no mixed arithmetic); integers
/// checked (`None`: an overflow, a division by zero, or no such overload).
fn arithmetic_op(op: Binary, lhs: Scalar, rhs: Scalar) -> Option<Scalar> {
    use Scalar::*;
    // The same checked operations on i64 and u64.
    macro_rules! checked {
        ($a:expr, $b:expr) => {
            match op {
                Binary::Add => $a.checked_add($b)?,
                Binary::Subtract => $a.checked_sub($b)?,
                Binary::Multiply => $a.checked_mul($b)?,
                Binary::Divide => $a.checked_div($b)?,
                Binary::Modulo => $a.checked_rem($b)?,
                _ => return None,
            }
        };
    }
    Some(match (lhs, rhs) {
        (Int(a), Int(b)) => Int(checked!(a, b)),
        (UInt(a), UInt(b)) => UInt(checked!(a, b)),
        (Double(a), Double(b)) => Double(match op {
            Binary::Add => a + b,
            Binary::Subtract => a - b,
            Binary::Multiply => a * b,
            Binary::Divide => a / b,
            _ => return None,
        }),
        _ => return None,
    })
}

/// The `cel` value of a scalar the fast path gave (never [`Scalar::Other`]).
pub(crate) fn to_value(s: Scalar) -> cel::Value {
    match s {
        Scalar::Null | Scalar::Other => cel::Value::Null,
        Scalar::Bool(b) => cel::Value::Bool(b),
        Scalar::Int(i) => cel::Value::Int(i),
        Scalar::UInt(u) => cel::Value::UInt(u),
        Scalar::Double(d) => cel::Value::Float(d),
    }
}

#[cfg(test)]
#[path = "fast_tests.rs"]
mod tests;
