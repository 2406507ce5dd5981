//! Evaluation: pure functions of a compiled policy and pre-built input values. Nothing here
//! logs, reads a clock or a file. A run-time error (a missing field, division by zero, a
//! wrong type) gives the hook's default there and is returned beside the value, so that the
//! caller can log it once per key and host.
//!
//! `[let]` names are resolved lazily: a let is evaluated where an expression reads it, so
//! `a || expensive` never evaluates `expensive` when `a` holds. A let is evaluated at most
//! once per evaluation (its value, or its error, is kept for the other uses): ten uses of a
//! let that uses another ten times cost twenty evaluations, not a hundred.
//!
//! Every evaluation runs within the run-time cost budget of [`crate::cost`]: one that
//! exhausts it fails with [`crate::cost::EXHAUSTED`].

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, OnceLock},
};

use cel::{
    common::value::{CowVal, Val},
    context::VariableResolver,
    Context, Env, IdedExpr, Value,
};

use crate::{
    compile::Compiled,
    cost::{self, Budget},
    hooks::{Answer, Hook, Kind, Var},
    value::{HostValue, JobValue, LabValue, NowValue, Prebuilt, UserValue},
};

/// The pre-built values one evaluation may read. A hook reading a variable that is not
/// bound here fails (and gives its default).
#[derive(Debug, Default, Clone, Copy)]
pub struct Scope<'a> {
    pub host: Option<&'a HostValue>,
    pub job: Option<&'a JobValue>,
    pub holder: Option<&'a JobValue>,
    pub user: Option<&'a UserValue>,
    pub lab: Option<&'a LabValue>,
    pub now: Option<&'a NowValue>,
}

impl<'a> Scope<'a> {
    pub fn new() -> Self {
        Scope::default()
    }

    pub fn host(self, host: &'a HostValue) -> Self {
        Scope {
            host: Some(host),
            ..self
        }
    }

    pub fn job(self, job: &'a JobValue) -> Self {
        Scope {
            job: Some(job),
            ..self
        }
    }

    pub fn holder(self, holder: &'a JobValue) -> Self {
        Scope {
            holder: Some(holder),
            ..self
        }
    }

    pub fn user(self, user: &'a UserValue) -> Self {
        Scope {
            user: Some(user),
            ..self
        }
    }

    pub fn lab(self, lab: &'a LabValue) -> Self {
        Scope {
            lab: Some(lab),
            ..self
        }
    }

    pub fn now(self, now: &'a NowValue) -> Self {
        Scope {
            now: Some(now),
            ..self
        }
    }

    /// Whether `var` is bound.
    pub fn binds(&self, var: Var) -> bool {
        self.get(var).is_some()
    }

    /// The value bound to `var`, if any.
    pub(crate) fn prebuilt(&self, var: Var) -> Option<&'a Prebuilt> {
        self.get(var)
    }

    fn get(&self, var: Var) -> Option<&'a Prebuilt> {
        match var {
            Var::Host => self.host.map(|v| &v.0),
            Var::Job => self.job.map(|v| &v.0),
            Var::Holder => self.holder.map(|v| &v.0),
            Var::User => self.user.map(|v| &v.0),
            Var::Lab => self.lab.map(|v| &v.0),
            Var::Now => self.now.map(|v| &v.0),
        }
    }
}

/// A hook's value, and the run-time error that made it the default, if one did.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision<T> {
    pub value: T,
    pub error: Option<EvalError>,
}

/// A run-time error of one hook's expression on one input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("policy key `{}`: {message}; its default was used", hook.key())]
pub struct EvalError {
    pub hook: Hook,
    pub message: String,
}

/// What evaluation needs besides the scope: the lets and the CEL environment.
pub(crate) struct Evaluator<'a> {
    pub env: &'a Arc<Env>,
    pub lets: &'a BTreeMap<String, Compiled>,
}

impl Evaluator<'_> {
    /// Evaluates `c` for `hook` and checks the type; `Err(message)` on any failure: its
    /// evaluated form ([`Compiled::run`]), and when that fails, the expression as written,
    /// whose message names the let that failed.
    ///
    /// Its fast form first ([`crate::fast`]), when it has one and that gives a value.
    pub fn answer_of(&self, hook: Hook, c: &Compiled, scope: Scope<'_>) -> Result<Answer, String> {
        if let Some(Ok(answer)) = fast_answer(hook, c, &scope) {
            return Ok(answer);
        }
        self.answer(hook, &c.run, scope)
            .map_err(|fast| again_as_written(fast, || self.answer(hook, &c.expr, scope).err()))
    }

    /// [`Self::value`] of `c`, as [`Self::answer_of`] evaluates it.
    pub fn value_of(&self, vars: &[Var], c: &Compiled, scope: Scope<'_>) -> Result<Value, String> {
        self.value(vars, &c.run, scope)
            .map_err(|fast| again_as_written(fast, || self.value(vars, &c.expr, scope).err()))
    }

    /// Evaluates `expr` for `hook` and checks the type; `Err(message)` on any failure.
    pub fn answer(&self, hook: Hook, expr: &IdedExpr, scope: Scope<'_>) -> Result<Answer, String> {
        let value = self.value(hook.vars(), expr, scope)?;
        to_answer(hook, &value)
    }

    /// Evaluates `expr` with the variables `vars` of `scope` bound.
    pub fn value(&self, vars: &[Var], expr: &IdedExpr, scope: Scope<'_>) -> Result<Value, String> {
        let budget = Budget::start();
        let memo = Memo::default();
        let resolver = Resolver {
            scope,
            vars,
            eval: self,
            memo: &memo,
            failed: Mutex::new(None),
        };
        let value = resolver.run(expr);
        if budget.exhausted() {
            return Err(format!("{} of {}", cost::EXHAUSTED, cost::RUN_BUDGET));
        }
        value
    }
}

/// The message of a failure of an evaluated form (`fast`): the failure of the expression as
/// written (`written`, run only now), which names the let that failed. Not for a failure
/// of the run-time budget: that one says all, and running again would spend a second one.
fn again_as_written(fast: String, written: impl FnOnce() -> Option<String>) -> String {
    if fast.contains(cost::EXHAUSTED) {
        return fast;
    }
    written().unwrap_or(fast)
}

/// The lets evaluated so far in one evaluation, by [`Compiled::slot`]; allocated when the
/// first let is read.
#[derive(Default)]
struct Memo(OnceLock<Box<[Slot]>>);

/// One let's value (or why it failed), once evaluated.
type Slot = OnceLock<Result<Box<dyn Val>, String>>;

impl Memo {
    fn slot(&self, slot: usize, lets: usize) -> Option<&Slot> {
        self.0
            .get_or_init(|| (0..lets).map(|_| OnceLock::new()).collect())
            .get(slot)
    }
}

/// Binds the scope's values (borrowed, never copied) and the lets (evaluated on use).
struct Resolver<'a> {
    scope: Scope<'a>,
    vars: &'a [Var],
    eval: &'a Evaluator<'a>,
    memo: &'a Memo,
    /// The first let that failed, and why: a let's failure surfaces as an undeclared
    /// reference to its name, which [`Resolver::run`] turns back into this message.
    failed: Mutex<Option<(String, String)>>,
}

impl Resolver<'_> {
    fn run(&self, expr: &IdedExpr) -> Result<Value, String> {
        let mut ctx = Context::with_env(Arc::clone(self.eval.env));
        ctx.set_variable_resolver(self);
        Value::resolve(expr, &ctx).map_err(|e| self.explain(e))
    }

    fn explain(&self, e: cel::ExecutionError) -> String {
        let failed = self.failed.lock().map(|mut f| f.take()).unwrap_or(None);
        match (e, failed) {
            (cel::ExecutionError::UndeclaredReference(name), Some((let_name, why)))
                if *name == let_name =>
            {
                format!("in let `{let_name}`: {why}")
            }
            (cel::ExecutionError::UndeclaredReference(name), _)
                if Var::ALL.iter().any(|v| v.name() == name.as_str()) =>
            {
                format!("`{name}` is not bound in this evaluation")
            }
            (cel::ExecutionError::UndeclaredReference(name), _) => {
                format!("undeclared reference to `{name}`")
            }
            (e, _) => e.to_string(),
        }
    }
}

impl VariableResolver for Resolver<'_> {
    fn resolve<'b>(&'b self, name: &str) -> Option<CowVal<'b, 'b>> {
        // CEL asks for `host.load1` whole before `host`: neither a variable nor a let name
        // (an identifier) has a dot, so such a name is nobody's here.
        if name.contains('.') {
            return None;
        }
        if let Some(var) = Var::ALL.into_iter().find(|v| v.name() == name) {
            if !self.vars.contains(&var) {
                return None;
            }
            return self.scope.get(var).map(|p| CowVal::Borrowed(p.val()));
        }
        let c = self.eval.lets.get(name)?;
        let built = self
            .memo
            .slot(c.slot, self.eval.lets.len())?
            .get_or_init(|| {
                let inner = Resolver {
                    scope: self.scope,
                    vars: self.vars,
                    eval: self.eval,
                    memo: self.memo,
                    failed: Mutex::new(None),
                };
                inner
                    .run(&c.run)
                    // The message of a failure: the let as written says which of its lets.
                    .map_err(|fast| again_as_written(fast, || inner.run(&c.expr).err()))
                    .and_then(|v| Box::<dyn Val>::try_from(v).map_err(|e| e.to_string()))
            });
        match built {
            Ok(val) => Some(CowVal::Borrowed(&**val)),
            Err(why) => {
                let why = why.clone();
                if let Ok(mut f) = self.failed.lock() {
                    f.get_or_insert((name.to_string(), why));
                }
                None
            }
        }
    }
}

/// `c`'s answer for `hook` from its fast form: `None` when it has none or the fast path
/// cannot tell (evaluate with `cel`), `Some(Err(()))` when the evaluation fails (an error,
/// or a value of the wrong type: `cel` says why).
pub(crate) fn fast_answer(
    hook: Hook,
    c: &Compiled,
    scope: &Scope<'_>,
) -> Option<Result<Answer, ()>> {
    match c.fast.as_ref()?.eval(hook.vars(), scope) {
        Ok(value) => Some(to_answer(hook, &crate::fast::to_value(value)).map_err(|_| ())),
        Err(crate::fast::Stop::Error) => Some(Err(())),
        Err(crate::fast::Stop::Unknown) => None,
    }
}

/// The hook's typed answer, or why the value has the wrong type.
pub(crate) fn to_answer(hook: Hook, value: &Value) -> Result<Answer, String> {
    let answer = match value {
        Value::Bool(b) => Some(Answer::Bool(*b)),
        Value::Int(i) => Some(Answer::Number(*i as f64)),
        Value::UInt(u) => Some(Answer::Number(*u as f64)),
        Value::Float(f) if f.is_nan() => return Err("gives NaN, not a number".into()),
        Value::Float(f) => Some(Answer::Number(*f)),
        _ => None,
    };
    match (hook.kind(), answer) {
        (Kind::Bool, Some(a @ Answer::Bool(_))) => Ok(a),
        (Kind::Number, Some(a @ Answer::Number(n))) => hook.check_range(n).map(|()| a),
        _ => Err(format!(
            "gives `{}`, but `{}` must give a {}",
            type_name(value),
            hook.key(),
            hook.kind().name()
        )),
    }
}

/// CEL's name of a value's type.
pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Bool(_) => "bool",
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "double",
        Value::String(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Null => "null",
        _ => "another type",
    }
}
