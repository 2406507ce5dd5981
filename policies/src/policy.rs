//! [`Policy`]: a loaded, checked policy file, and the evaluation of its hooks.
//!
//! Loading is read → parse (TOML with positions, then CEL, on the large-stack parser thread) → check
//! (every expression against the samples of `samples.rs`). A `Policy` is immutable
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
    compile::{self, Compiled, CompiledPolicy, Failure},
    error::Error,
    eval::{Decision, EvalError, Evaluator, Scope},
    hooks::{Answer, Hook, Var},
    source::SourceError,
    value::{HostFields, HostValue, NowValue},
};

/// A checked policy, ready to evaluate.
pub struct Policy {
    path: PathBuf,
    sha256: String,
    env: Arc<Env>,
    compiled: CompiledPolicy,
    /// The `host.FIELD` names each hook in force reads, directly or through lets (worked
    /// out once at load: asked per report).
    host_fields: BTreeMap<Hook, Vec<String>>,
    /// The `host` fields any expression of the policy may read: its hooks, the defaults
    /// (which stand in for a hook that fails) and its lets ([`Policy::host_value_fields`]).
    host_value_fields: HostFields,
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
    /// Reads, parses and checks the file at `path`. Parsing runs on the parser thread; call
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
        let compiled = compile::compile(text).map_err(|e| match e {
            Failure::Source(e) => source_error(path, e),
            Failure::Key(e) => e.into_error(path.to_path_buf()),
            Failure::Thread(e) => Error::Thread {
                path: path.to_path_buf(),
                reason: e.to_string(),
            },
        })?;
        let mut policy = Policy {
            path: path.to_path_buf(),
            sha256: hex::encode(Sha256::digest(text.as_bytes())),
            env: Arc::new(crate::cost::env()),
            compiled,
            host_fields: BTreeMap::new(),
            host_value_fields: HostFields::ALL,
        };
        check::check(&policy).map_err(|e| e.into_error(path.to_path_buf()))?;
        policy.host_fields = Hook::ALL
            .into_iter()
            .map(|hook| (hook, host_fields(&policy.fields_read(hook))))
            .collect();
        policy.host_value_fields = host_value_fields(&policy.compiled);
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

    /// The fields of `host` (`keyboard_idle_s` for `host.keyboard_idle_s`, `users` for
    /// `host.users[0].idle_s`) the expression in force for `hook` reads, directly or through
    /// lets.
    pub fn host_fields_read(&self, hook: Hook) -> &[String] {
        self.host_fields.get(&hook).map_or(&[], Vec::as_slice)
    }

    /// The fields of `host` any of its expressions may read: a [`HostValue`] built with
    /// these ([`HostValue::reading`]) decides every hook as the full one does.
    pub fn host_value_fields(&self) -> HostFields {
        self.host_value_fields
    }

    /// Whether the expression in force for `hook` reads `var` (as [`reads`](Self::reads)
    /// says, without building the set: asked once per report).
    pub fn reads_var(&self, hook: Hook, var: Var) -> bool {
        self.active(hook).is_some_and(|c| c.reads.contains(&var))
    }

    /// True when the expression in force for `hook` reads only `host`: its value for a host
    /// can be computed once per report and cached until the next one. Do not cache a
    /// [`Decision`] that carries an error: its value is the default's, which may read more.
    pub fn host_only(&self, hook: Hook) -> bool {
        self.active(hook)
            .is_none_or(|c| c.reads.iter().all(|v| *v == Var::Host))
    }

    /// The value of `hook` on `host` (at `now`, if given) when it is the same for every
    /// job, holder, user and lab: evaluate it when the host's report arrives (and when the
    /// policy changes), cache it, and skip the per-job evaluation. `None`: it depends on them
    /// (or fails on this host, or the hook has no expression): evaluate per job.
    ///
    /// Exact, because CEL's `&&`, `||` and `exists` absorb an error when the other side
    /// decides: an expression that gives a value with `job` unbound gives the same value
    /// whatever `job` is. For the paper's `start`, a public host gives `true` and a private
    /// host whose owner is active gives `false`, for every job.
    pub fn host_decision(
        &self,
        hook: Hook,
        host: &HostValue,
        now: Option<&NowValue>,
    ) -> Option<Answer> {
        let c = self.active(hook)?;
        let mut scope = Scope::new().host(host);
        scope.now = now;
        if let Some(fast) = crate::eval::fast_answer(hook, c, &scope) {
            return fast.ok();
        }
        let ev = if self.is_set(hook) {
            self.evaluator()
        } else {
            Evaluator {
                env: &self.env,
                lets: &EMPTY,
            }
        };
        // No message is kept: the evaluated form alone, never again as written.
        ev.answer(hook, &c.run, scope).ok()
    }

    /// The estimated cost of the expression in force for `hook`, with the lets it uses
    /// (0 for a default): what the load-time check held within [`crate::cost::MAX_COST`].
    pub fn cost(&self, hook: Hook) -> u64 {
        self.compiled.hooks.get(&hook).map_or(0, |c| c.cost)
    }

    pub(crate) fn active_expression(&self, hook: Hook) -> Option<&Compiled> {
        self.active(hook)
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
        match ev.answer_of(hook, own, scope) {
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
        if let Some(fast) = crate::eval::fast_answer(hook, default, &scope) {
            return fast.ok().or_else(|| hook.fail_safe());
        }
        let ev = Evaluator {
            env: &self.env,
            lets: &EMPTY,
        };
        // Its message is not kept: the evaluated form alone, never again as written.
        ev.answer(hook, &default.run, scope)
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

    /// `overflow`: should a node be asked of Slurm for waiting `job` (with
    /// `[overflow.slurm]`).
    pub fn overflow(&self, scope: Scope<'_>) -> Decision<bool> {
        self.eval_bool(Hook::Overflow, scope)
    }
}

static EMPTY: BTreeMap<String, Compiled> = BTreeMap::new();

/// The `host` fields the expressions of `c` select; every field when one uses `host`
/// other than by selecting a field.
fn host_value_fields(c: &CompiledPolicy) -> HostFields {
    let mut names = Vec::new();
    let mut expressions = c
        .hooks
        .values()
        .chain(c.defaults.values())
        .chain(c.lets.values());
    if !expressions.all(|e| crate::ast::host_fields_selected(&e.expr, &mut names)) {
        return HostFields::ALL;
    }
    HostFields::named(names.iter().map(String::as_str))
}

/// The top-level `host` fields among `fields` (`host.users[0].idle_s` → `users`).
fn host_fields(fields: &BTreeSet<String>) -> Vec<String> {
    let mut out: Vec<String> = fields
        .iter()
        .filter_map(|f| f.strip_prefix("host."))
        .filter_map(|f| f.split(|c: char| !(c.is_alphanumeric() || c == '_')).next())
        .map(String::from)
        .collect();
    out.dedup();
    out
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        check_file,
        facts::{HostFacts, JobFacts, UserFacts},
        value::{HostValue, JobValue, UserValue},
    };

    fn policy(text: &str) -> Result<Policy, Error> {
        Policy::from_text(Path::new("t.toml"), text)
    }

    fn refused(text: &str) -> String {
        policy(text).expect_err("refused").to_string()
    }

    /// A host value of only the fields a policy reads decides every hook as the full value
    /// does: every shipped policy, and one reaching fields through a let and a
    /// comprehension, on every sample; a policy that uses `host` whole gets every field.
    #[test]
    fn a_value_of_the_fields_read_decides_every_hook_as_the_full_one() {
        use crate::value::{HostFields, LabValue, NowValue};
        let mut policies: Vec<Policy> = crate::SHIPPED
            .iter()
            .map(|(name, _)| Policy::shipped(name).expect("shipped"))
            .collect();
        let reach = "start = 'host.users.exists(u, u.idle_s > 60) && quiet'\n\
                     [let]\nquiet = 'host.load1 < 0.5'\n";
        policies.push(policy(reach).expect("loads"));
        let paper = &policies[0];
        let read = HostFields::named(["private", "owner_idle_s", "keyboard_idle_s", "load1"]);
        assert!(paper.host_value_fields().contains(read));
        assert!(!paper
            .host_value_fields()
            .contains(HostFields::named(["sessions"])));
        for p in &policies {
            let fields = p.host_value_fields();
            assert_ne!(fields, HostFields::ALL, "{}", p.source_path().display());
            for s in crate::samples::complete()
                .into_iter()
                .chain(crate::samples::sparse())
            {
                let (job, holder) = (JobValue::new(&s.job), JobValue::new(&s.holder));
                let (user, lab) = (UserValue::new(&s.user), LabValue::new(&s.lab));
                let now = NowValue::new(&s.now);
                let scope = |host| {
                    Scope::new()
                        .host(host)
                        .job(&job)
                        .holder(&holder)
                        .user(&user)
                        .lab(&lab)
                        .now(&now)
                };
                let full = HostValue::new(&s.host);
                let some = HostValue::reading(&s.host, fields);
                for hook in Hook::ALL {
                    assert_eq!(
                        format!("{:?}", p.eval(hook, scope(&some))),
                        format!("{:?}", p.eval(hook, scope(&full))),
                        "{} {hook:?} on {}",
                        p.source_path().display(),
                        s.name
                    );
                }
            }
        }
        let whole = policy("start = 'size(host) > 3'").expect("loads");
        assert_eq!(whole.host_value_fields(), HostFields::ALL);
    }

    fn host(cpus: i64) -> HostValue {
        HostValue::new(
            &HostFacts {
                name: "node03".into(),
                up: true,
                cpus,
                users: Some(vec![]),
                ..HostFacts::default()
            }
            .derive(),
        )
    }

    fn job() -> JobValue {
        JobValue::new(&JobFacts {
            id: 3,
            adaptive: true,
            ..JobFacts::default()
        })
    }

    #[test]
    fn overflow_by_default_asks_slurm_after_a_second_of_waiting() {
        let waited = |s: f64| {
            JobValue::new(&JobFacts {
                id: 3,
                waiting: 1,
                waited_s: s,
                ..JobFacts::default()
            })
        };
        let p = policy("start = 'true'\n").expect("loads");
        assert!(!p.overflow(Scope::new().job(&waited(0.4))).value);
        assert!(p.overflow(Scope::new().job(&waited(1.2))).value);
        let never = policy("overflow = 'false'\n").expect("loads");
        assert!(!never.overflow(Scope::new().job(&waited(60.0))).value);
        let e = refused("overflow = 'host.up'\n");
        assert!(e.contains("overflow"), "overflow cannot read host: {e}");
    }

    #[test]
    fn a_one_line_file_is_a_policy_and_the_rest_is_default() {
        let p = policy("start = 'host.name == \"node03\"'\n").expect("loads");
        assert_eq!(p.set_hooks(), vec![Hook::Start]);
        assert_eq!(
            p.expression(Hook::Vacate),
            Hook::Vacate.default_source(),
            "unset hooks use the default"
        );
        let (h, j) = (host(2), job());
        assert!(p.start(Scope::new().host(&h).job(&j)).value);
        assert_eq!(
            p.summary().to_string(),
            format!(
                "t.toml: ok: sets start; defaults for rank, vacate, grace_s, may_preempt, \
                 preempt_rank, share, max_hosts, priority, overflow; 0 lets; sha256 {}",
                &p.sha256()[..12]
            )
        );
    }

    #[test]
    fn sha256_is_of_the_file_bytes_and_the_path_is_kept() {
        let p = policy("start = 'true'\n").expect("loads");
        assert_eq!(
            p.sha256(),
            "958b64697c1f73e3be19f53d0cc4d13d7f9b11e243e8c296f56ae362edc41c91"
        );
        assert_eq!(p.source_path(), Path::new("t.toml"));
    }

    #[test]
    fn a_run_time_error_gives_the_default_and_is_returned_not_swallowed() {
        // Fine on every sample host (4 CPUs), divides by zero on a host reporting none.
        let p = policy("start = '10 / host.cpus > 100'\n").expect("loads");
        let (h, j) = (host(0), job());
        let d = p.start(Scope::new().host(&h).job(&j));
        assert!(d.value, "the paper default: a public host to anyone");
        let e = d.error.expect("the error is reported");
        assert_eq!(e.hook, Hook::Start);
        assert!(e.message.contains("Division by zero"), "{}", e.message);
        assert!(e.to_string().starts_with("policy key `start`: "));
    }

    #[test]
    fn a_failing_let_is_named_in_the_run_time_error() {
        let p = policy("rank = 'per_cpu'\n[let]\nper_cpu = '100 / host.cpus'\n").expect("loads");
        let (h, j) = (host(0), job());
        let d = p.rank(Scope::new().host(&h).job(&j));
        let e = d.error.expect("error");
        assert!(
            e.message.starts_with("in let `per_cpu`: Division by zero"),
            "{}",
            e.message
        );
    }

    #[test]
    fn lets_short_circuit_and_reach_other_lets() {
        let p = policy("start = 'public || bad'\n[let]\npublic = '!private'\nprivate = 'host.private'\nbad = '1 / (host.cpus - 2) == 0'\n")
            .expect("loads");
        // `bad` divides by zero on this host, but `public` already decides.
        let (h, j) = (host(2), job());
        let d = p.start(Scope::new().host(&h).job(&j));
        assert_eq!((d.value, d.error), (true, None));
    }

    #[test]
    fn a_type_error_is_refused_at_load_with_file_line_col_and_help() {
        let text = "# desk\nvacate = 'host.load1'\n";
        let e = refused(text);
        let mut lines = e.lines();
        assert_eq!(
            lines.next(),
            Some(
                "t.toml:2:11: key `vacate`: gives `double`, but `vacate` must give a bool \
                 (on the sample host node01, job 7, holder 7, 12:00 on day 2)"
            )
        );
        assert!(lines.next().is_some_and(|l| l.starts_with("help: ")));
        assert_eq!(lines.next(), None);
    }

    #[test]
    fn a_misspelt_field_is_refused_at_its_column_not_a_quiet_false() {
        let e = refused("start = 'host.lod1 < 1.0'\n");
        let want = "t.toml:1:15: key `start`: `host` has no field `lod1`\n\
                    help: the fields of `host` are console_active, console_idle_s, cpus,";
        assert!(e.starts_with(want), "{e}");
        let e = refused("[let]\nbusy = '''\nhost.up &&\n  host.laod1 > 1.0'''\n");
        assert!(
            e.starts_with("t.toml:4:8: key `let.busy`: `host` has no field `laod1`"),
            "{e}"
        );
        let e = refused("start = 'false && job.adaptiv'\n");
        assert!(
            e.contains("`job` has no field `adaptiv`"),
            "a branch never taken: {e}"
        );
        let e = refused("start = 'jobb.adaptive'\n");
        assert!(e.contains("undeclared reference to `jobb`"), "{e}");
        let e = refused("start = 'x'\n[let]\nx = 'true'\ny = 'hots.up'\n");
        assert!(
            e.contains("key `let.y`: undeclared reference to `hots`"),
            "{e}"
        );
    }

    #[test]
    fn a_let_may_fail_where_the_hook_guards_it() {
        policy("start = 'has(job.spec.gpus) && gpus > 0'\n[let]\ngpus = 'job.spec.gpus'\n")
            .expect("loads");
    }

    #[test]
    fn an_rsl_relation_must_be_tested_with_has_before_use() {
        refused("start = 'job.spec.gpus > 0'\n");
        policy("start = '!has(job.spec.gpus) || job.spec.gpus > 0'\n").expect("loads");
    }

    #[test]
    fn share_reading_its_own_value_is_refused_but_other_hooks_may() {
        let e = refused("share = 'w'\n[let]\nw = 'job.share * 2.0'\n");
        assert!(e.contains("key `share`: reads `job.share`"), "{e}");
        assert!(e.contains("help: `share` gives the job's weight"), "{e}");
        policy("may_preempt = 'holder.share > job.share'\n").expect("may_preempt may");
    }

    #[test]
    fn a_hook_reading_a_variable_it_cannot_see_is_refused() {
        let e = refused("share = 'weight'\n[let]\nweight = 'host.cpus'\n");
        assert!(e.contains("key `share`: reads `host`"), "{e}");
        assert!(
            e.contains("help: `share` sees only job, user, lab, now"),
            "{e}"
        );
        let (h, j) = (host(2), job());
        let u = UserValue::new(&UserFacts::default());
        let p = policy("share = 'user.jobs + 1'\n").expect("share may read user");
        assert_eq!(p.share(Scope::new().host(&h).job(&j).user(&u)).value, 1.0);
    }

    #[test]
    fn reads_tell_which_hooks_depend_on_the_host_alone() {
        let p = Policy::shipped("paper").expect("paper");
        assert!(!p.host_only(Hook::Start), "start reads job.adaptive");
        assert!(p.host_only(Hook::Rank));
        assert_eq!(p.reads(Hook::Start), [Var::Host, Var::Job].into());
        assert!(p.reads_var(Hook::Start, Var::Job));
        assert!(!p.reads_var(Hook::Start, Var::Now));
        let d = Policy::shipped("desktop").expect("desktop");
        assert!(d.host_only(Hook::Start));
        assert!(d.host_only(Hook::Vacate));
        let n = Policy::shipped("nights-and-weekends").expect("nights-and-weekends");
        assert!(
            n.reads_var(Hook::Start, Var::Now),
            "{:?}",
            n.reads(Hook::Start)
        );
        assert!(!n.host_only(Hook::Start));
    }

    #[test]
    fn host_decision_is_given_when_no_job_can_change_it() {
        let paper = Policy::shipped("paper").expect("paper");
        let private = |idle: Option<i64>| {
            HostValue::new(&HostFacts {
                owner: Some("ann".into()),
                private: true,
                keyboard_idle_s: idle,
                owner_idle_s: idle,
                cpus: 2,
                ..HostFacts::default()
            })
        };
        let start = |h: &HostValue| paper.host_decision(Hook::Start, h, None);
        assert_eq!(start(&host(2)), Some(Answer::Bool(true)), "public: any job");
        assert_eq!(
            start(&private(Some(5))),
            Some(Answer::Bool(false)),
            "owner active"
        );
        assert_eq!(start(&private(None)), Some(Answer::Bool(false)), "unknown");
        assert_eq!(
            start(&private(Some(900))),
            None,
            "owner away: adaptive jobs only"
        );
        assert!(paper
            .host_decision(Hook::Rank, &private(None), None)
            .is_some());
        let unset = policy("start = 'true'\n").expect("loads");
        assert_eq!(
            unset.host_decision(Hook::Vacate, &host(2), None),
            Some(Answer::Bool(false)),
            "the default vacate on a public host"
        );
    }

    /// Whenever `host_decision` gives a value, evaluating with any job gives that value.
    #[test]
    fn host_decision_agrees_with_every_full_evaluation_on_the_samples() {
        let samples = crate::samples::complete()
            .into_iter()
            .chain(crate::samples::sparse())
            .collect::<Vec<_>>();
        for (name, _) in crate::SHIPPED {
            let p = Policy::shipped(name).expect("shipped");
            for s in &samples {
                let built = crate::check::tests_support::built(s);
                for hook in Hook::ALL {
                    let Some(v) = p.host_decision(hook, &built.host, Some(&built.now)) else {
                        continue;
                    };
                    let full = p.eval(hook, built.scope());
                    assert_eq!(full.value, Some(v), "{name} {} {}", hook.key(), s.name);
                }
            }
        }
    }

    #[test]
    fn loading_parses_off_the_callers_stack_and_deep_expressions_evaluate_on_a_small_one() {
        // A tokio worker has 2 MiB of stack; parsing this in a debug build needs more.
        let nested = format!("{}host.up{}", "(".repeat(28), ")".repeat(28));
        let text = format!("start = '{nested} && {nested}'\n");
        let small = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || {
                let p = policy(&text).expect("loads");
                let (h, j) = (host(2), job());
                p.start(Scope::new().host(&h).job(&j))
            })
            .expect("spawn");
        let d = small.join().expect("no stack overflow");
        assert_eq!((d.value, d.error), (true, None));
    }

    /// TOML nests too: 79 arrays (toml_edit's limit is 80), or inline tables whose dotted
    /// keys each add 79 tables more (the limit counts the braces, not the dots). Parsing
    /// either on the caller's stack took more than this thread's 256 KiB.
    #[test]
    fn deep_toml_is_parsed_off_the_callers_stack_too() {
        let arrays = format!("start = {}1{}\n", "[".repeat(79), "]".repeat(79));
        let dotted = vec!["a"; 79].join(".");
        let tables = format!(
            "start = {}1{}\n",
            format!("{{{dotted}=").repeat(79),
            "}".repeat(79)
        );
        let small = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || [refused(&arrays), refused(&tables)])
            .expect("spawn");
        let [arrays, tables] = small.join().expect("no stack overflow");
        assert!(arrays.starts_with("t.toml:1:"), "{arrays}");
        assert!(tables.starts_with("t.toml:1:"), "{tables}");
        assert!(tables.contains("must be a CEL expression"), "{tables}");
    }

    #[test]
    fn a_policy_is_shared_across_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<Policy>();
    }

    #[test]
    fn check_file_prints_the_summary_or_the_error_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("good.toml");
        std::fs::write(&good, "start = 'true'\n").expect("write");
        let line = check_file(&good).expect("good").to_string();
        assert!(
            line.starts_with(&format!("{}: ok: sets start;", good.display())),
            "{line}"
        );
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "start = 'true'\n\nvacate = 'host.up &&'\n").expect("write");
        let e = check_file(&bad).expect_err("bad");
        assert_eq!(e.exit_code(), 64);
        assert!(
            e.to_string().starts_with(&format!(
                "{}:3:21: key `vacate`: syntax error",
                bad.display()
            )),
            "{e}"
        );
        let missing = check_file(&dir.path().join("none.toml")).expect_err("missing");
        assert_eq!(missing.exit_code(), 66);
    }

    #[test]
    fn toml_errors_are_positioned_too() {
        let e = refused("start = 'true'\nstart = 'false'\n");
        assert!(e.starts_with("t.toml:2:1: not valid TOML"), "{e}");
        let e = refused("start = 'true'\nstrat = 'false'\n");
        assert!(
            e.starts_with("t.toml:2:1: key `strat`: unknown key\nhelp: did you mean `start`?"),
            "{e}"
        );
    }
}
