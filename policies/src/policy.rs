//! [`Policy`]: a loaded, checked policy file, and the evaluation of its hooks.
//!
//! Loading is read → parse (TOML with positions, then CEL on a large-stack thread) → check
//! (every expression against the samples of [`crate::samples`]). A `Policy` is immutable
//! and `Send + Sync`: the broker swaps the whole value on reload.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use cel::Env;
use sha2::{Digest, Sha256};

use crate::{
    check,
    compile::{self, Compiled, CompiledPolicy},
    error::Error,
    eval::{Decision, EvalError, Evaluator, Scope},
    hooks::{Answer, Hook, Var},
    source::{self, SourceError},
};

/// A checked policy, ready to evaluate.
pub struct Policy {
    path: PathBuf,
    sha256: String,
    env: Arc<Env>,
    compiled: CompiledPolicy,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("set", &self.set_hooks())
            .finish()
    }
}

impl Policy {
    /// Reads, parses and checks the file at `path`. Parsing runs on its own thread; call
    /// this from a blocking context (`spawn_blocking`), not from a tokio worker.
    pub fn load(path: &Path) -> Result<Policy, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Policy::from_text(path, &text)
    }

    /// Parses and checks `text`, naming it `path` in errors and in [`Policy::source_path`].
    pub fn from_text(path: &Path, text: &str) -> Result<Policy, Error> {
        let raw = source::read(text).map_err(|e| source_error(path, e))?;
        let compiled = compile::compile(raw).map_err(|e| match e {
            Some(e) => e.into_error(path.to_path_buf()),
            None => Error::Thread {
                path: path.to_path_buf(),
                reason: "the parser thread could not start or panicked".into(),
            },
        })?;
        let policy = Policy {
            path: path.to_path_buf(),
            sha256: hex::encode(Sha256::digest(text.as_bytes())),
            env: Arc::new(Env::stdlib()),
            compiled,
        };
        check::check(&policy).map_err(|e| e.into_error(path.to_path_buf()))?;
        Ok(policy)
    }

    /// The SHA-256 of the file's bytes, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The path the policy was loaded from.
    pub fn source_path(&self) -> &Path {
        &self.path
    }

    /// Whether the file sets `hook` (else its default applies).
    pub fn is_set(&self, hook: Hook) -> bool {
        self.compiled.hooks.contains_key(&hook)
    }

    /// The hooks the file sets, in [`Hook::ALL`] order.
    pub fn set_hooks(&self) -> Vec<Hook> {
        Hook::ALL.into_iter().filter(|h| self.is_set(*h)).collect()
    }

    /// The names of the file's `[let]` expressions.
    pub fn let_names(&self) -> Vec<&str> {
        self.compiled.lets.keys().map(String::as_str).collect()
    }

    /// The expression in force for `hook`: the file's, else the default; `None` when the
    /// hook is unset and has no default expression.
    pub fn expression(&self, hook: Hook) -> Option<&str> {
        self.active(hook).map(|c| c.entry.source.as_str())
    }

    /// The variables the expression in force for `hook` reads, directly or through lets.
    pub fn reads(&self, hook: Hook) -> BTreeSet<Var> {
        self.active(hook)
            .map(|c| c.reads.clone())
            .unwrap_or_default()
    }

    /// True when the expression in force for `hook` reads only `host`: its value for a host
    /// can be computed once per report and cached until the next one.
    pub fn host_only(&self, hook: Hook) -> bool {
        self.reads(hook).iter().all(|v| *v == Var::Host)
    }

    fn active(&self, hook: Hook) -> Option<&Compiled> {
        let c = &self.compiled;
        c.hooks.get(&hook).or_else(|| c.defaults.get(&hook))
    }

    pub(crate) fn file_expressions(&self) -> impl Iterator<Item = (Hook, &Compiled)> {
        self.compiled.hooks.iter().map(|(h, c)| (*h, c))
    }

    pub(crate) fn lets(&self) -> &BTreeMap<String, Compiled> {
        &self.compiled.lets
    }

    pub(crate) fn evaluator(&self) -> Evaluator<'_> {
        Evaluator {
            env: &self.env,
            lets: &self.compiled.lets,
        }
    }

    /// Evaluates `hook` on `scope`: the file's expression, else the default. On a run-time
    /// error the default's value is given, with the error. `None`: no value (the hook is
    /// unset and has no default, e.g. `max_hosts`: no limit).
    pub fn eval(&self, hook: Hook, scope: Scope<'_>) -> Decision<Option<Answer>> {
        let ev = self.evaluator();
        let Some(own) = self.compiled.hooks.get(&hook) else {
            return Decision {
                value: self.default_answer(hook, scope),
                error: None,
            };
        };
        match ev.answer(hook, &own.expr, scope) {
            Ok(a) => Decision {
                value: Some(a),
                error: None,
            },
            Err(message) => Decision {
                value: self.default_answer(hook, scope),
                error: Some(EvalError { hook, message }),
            },
        }
    }

    /// The default expression's value, or the fail-safe when even it cannot run.
    fn default_answer(&self, hook: Hook, scope: Scope<'_>) -> Option<Answer> {
        let default = self.compiled.defaults.get(&hook)?;
        let ev = Evaluator {
            env: &self.env,
            lets: &EMPTY,
        };
        ev.answer(hook, &default.expr, scope)
            .ok()
            .or_else(|| hook.fail_safe())
    }

    fn eval_bool(&self, hook: Hook, scope: Scope<'_>) -> Decision<bool> {
        let d = self.eval(hook, scope);
        Decision {
            value: d.value.and_then(Answer::as_bool).unwrap_or(false),
            error: d.error,
        }
    }

    fn eval_number(&self, hook: Hook, scope: Scope<'_>) -> Decision<Option<f64>> {
        let d = self.eval(hook, scope);
        Decision {
            value: d.value.and_then(Answer::as_number),
            error: d.error,
        }
    }

    /// `start`: may `job` be granted `host` now.
    pub fn start(&self, scope: Scope<'_>) -> Decision<bool> {
        self.eval_bool(Hook::Start, scope)
    }

    /// `rank`: among startable hosts, higher first.
    pub fn rank(&self, scope: Scope<'_>) -> Decision<f64> {
        let d = self.eval_number(Hook::Rank, scope);
        Decision {
            value: d.value.unwrap_or(0.0),
            error: d.error,
        }
    }

    /// `vacate`: should `job`, holding `host`, give it back now.
    pub fn vacate(&self, scope: Scope<'_>) -> Decision<bool> {
        self.eval_bool(Hook::Vacate, scope)
    }

    /// `grace_s`: seconds from the vacate notice to SIGKILL; `None`: the lab's own.
    pub fn grace_s(&self, scope: Scope<'_>) -> Decision<Option<f64>> {
        self.eval_number(Hook::GraceS, scope)
    }

    /// `may_preempt`: may waiting `job` take `host` from `holder`.
    pub fn may_preempt(&self, scope: Scope<'_>) -> Decision<bool> {
        self.eval_bool(Hook::MayPreempt, scope)
    }

    /// `preempt_rank`: among holders that may lose a host, higher loses first.
    pub fn preempt_rank(&self, scope: Scope<'_>) -> Decision<f64> {
        let d = self.eval_number(Hook::PreemptRank, scope);
        Decision {
            value: d.value.unwrap_or(0.0),
            error: d.error,
        }
    }

    /// `share`: the job's weight in the fair partition.
    pub fn share(&self, scope: Scope<'_>) -> Decision<f64> {
        let d = self.eval_number(Hook::Share, scope);
        Decision {
            value: d.value.unwrap_or(1.0),
            error: d.error,
        }
    }

    /// `max_hosts`: most hosts the job may hold; `None`: no limit.
    pub fn max_hosts(&self, scope: Scope<'_>) -> Decision<Option<f64>> {
        self.eval_number(Hook::MaxHosts, scope)
    }

    /// `priority`: queue order, higher first; `None`: arrival order.
    pub fn priority(&self, scope: Scope<'_>) -> Decision<Option<f64>> {
        self.eval_number(Hook::Priority, scope)
    }
}

static EMPTY: BTreeMap<String, Compiled> = BTreeMap::new();

fn source_error(path: &Path, e: SourceError) -> Error {
    match e {
        SourceError::Key(k) => k.into_error(path.to_path_buf()),
        SourceError::Syntax { at, message } => Error::Toml {
            path: path.to_path_buf(),
            at,
            message: format!("not valid TOML: {message}"),
            help: "a policy file is TOML: `KEY = 'CEL EXPRESSION'` lines and a [let] table".into(),
        },
    }
}
