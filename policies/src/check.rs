//! The load-time check of a parsed policy, and the one-line [`Summary`] of a good one.
//!
//! 1. Every `VAR.FIELD` anywhere in an expression names a field of that variable (a typo
//!    in a branch no sample takes is caught too), pointing at the field's column.
//! 2. Each hook reads only the variables bound when it runs ([`Hook::vars`]).
//! 3. Each hook runs cleanly on every complete sample and gives its type there
//!    (`samples`); each let names only things that exist (it may fail where a hook guards
//!    it).
//! 4. On the sparse samples a hook may fail (it gets its default at run time), but where it
//!    gives a value that value has the hook's type.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::{
    ast,
    compile::Compiled,
    error::{Error, KeyError},
    eval::{to_answer, Scope},
    facts::{HostFacts, JobFacts, LabFacts, NowFacts, UserFacts},
    hooks::{Hook, Var},
    policy::Policy,
    samples::{self, Sample},
    value::{HostValue, JobValue, LabValue, NowValue, UserValue},
};

/// What `rb policy check FILE` prints for a good file (one line).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub path: PathBuf,
    pub sha256: String,
    /// Hooks the file sets.
    pub set: Vec<Hook>,
    /// Hooks left to their defaults.
    pub defaulted: Vec<Hook>,
    pub lets: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = |hooks: &[Hook]| {
            let names: Vec<&str> = hooks.iter().map(|h| h.key()).collect();
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        };
        write!(
            f,
            "{}: ok: sets {}; defaults for {}; {} let{}; sha256 {}",
            self.path.display(),
            keys(&self.set),
            keys(&self.defaulted),
            self.lets,
            if self.lets == 1 { "" } else { "s" },
            &self.sha256[..self.sha256.len().min(12)]
        )
    }
}

/// Loads and checks the file at `path`: `Ok` is the one-line summary `rb policy check`
/// prints (exit 0); `Err` renders as the `FILE:LINE:COL: key ...` and `help:` lines it prints
/// (exit [`Error::exit_code`]).
pub fn check_file(path: &Path) -> Result<Summary, Error> {
    Policy::load(path).map(|p| p.summary())
}

impl Policy {
    /// The one-line description of this policy.
    pub fn summary(&self) -> Summary {
        let set = self.set_hooks();
        Summary {
            path: self.source_path().to_path_buf(),
            sha256: self.sha256().to_string(),
            defaulted: Hook::ALL.into_iter().filter(|h| !set.contains(h)).collect(),
            set,
            lets: self.let_names().len(),
        }
    }
}

/// The sample inputs as pre-built values.
pub(crate) struct Built {
    pub(crate) name: String,
    pub(crate) host: HostValue,
    pub(crate) job: JobValue,
    pub(crate) holder: JobValue,
    pub(crate) user: UserValue,
    pub(crate) lab: LabValue,
    pub(crate) now: NowValue,
}

impl Built {
    pub(crate) fn new(s: &Sample) -> Built {
        let job = |j: &JobFacts| JobValue::new(j);
        Built {
            name: s.name.clone(),
            host: HostValue::new(&s.host),
            job: job(&s.job),
            holder: job(&s.holder),
            user: UserValue::new(&s.user),
            lab: LabValue::new(&s.lab),
            now: NowValue::new(&s.now),
        }
    }

    pub(crate) fn scope(&self) -> Scope<'_> {
        Scope::new()
            .host(&self.host)
            .job(&self.job)
            .holder(&self.holder)
            .user(&self.user)
            .lab(&self.lab)
            .now(&self.now)
    }
}

/// Checks a parsed policy; the first problem found, in file order of keys.
pub(crate) fn check(policy: &Policy) -> Result<(), KeyError> {
    let fields = Fields::new();
    for c in policy.lets().values() {
        fields.check(c)?;
    }
    for (hook, c) in policy.file_expressions() {
        fields.check(c)?;
        check_reads(hook, c)?;
    }
    check_share_reads_no_share(policy)?;
    let (complete, sparse) = built_samples();
    let ev = policy.evaluator();
    for c in policy.lets().values() {
        for s in complete {
            // A let may fail where a hook guards it (`has(job.spec.x) && x > 0`); only a
            // name that exists nowhere is an error of its own.
            match ev.value_of(&Var::ALL, c, s.scope()) {
                Err(why) if why.starts_with("undeclared reference") => {
                    return Err(failure(c, &s.name, &why));
                }
                _ => {}
            }
        }
    }
    for (hook, c) in policy.file_expressions() {
        for s in complete {
            if let Err(why) = ev.answer_of(hook, c, s.scope()) {
                return Err(failure(c, &s.name, &why));
            }
        }
        for s in sparse {
            if let Ok(value) = ev.value_of(hook.vars(), c, s.scope()) {
                to_answer(hook, &value).map_err(|why| failure(c, &s.name, &why))?;
            }
        }
    }
    Ok(())
}

/// The complete and the sparse samples as values, built by the first check of the process
/// and shared by every later one: they are constant, and building them was a third of the
/// time a good file took to load (measured with the fuzz target `policy_file`).
fn built_samples() -> &'static (Vec<Built>, Vec<Built>) {
    static BUILT: OnceLock<(Vec<Built>, Vec<Built>)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let build = |samples: Vec<Sample>| samples.iter().map(Built::new).collect();
        (build(samples::complete()), build(samples::sparse()))
    })
}

/// The fields of each variable, from the fact structs themselves.
struct Fields(BTreeMap<Var, BTreeSet<String>>);

impl Fields {
    fn new() -> Fields {
        let job = names(&JobFacts::default());
        let map = BTreeMap::from([
            (Var::Host, names(&HostFacts::default())),
            (Var::Job, job.clone()),
            (Var::Holder, job),
            (Var::User, names(&UserFacts::default())),
            (Var::Lab, names(&LabFacts::default())),
            (Var::Now, names(&NowFacts::default())),
        ]);
        Fields(map)
    }

    /// Every `VAR.FIELD` in `c` names a field of VAR (wherever it is, taken or not).
    fn check(&self, c: &Compiled) -> Result<(), KeyError> {
        let mut bad = None;
        ast::walk(&c.expr, &mut |node| {
            if let Some((var, field)) = ast::var_field(node) {
                if bad.is_none() && !self.0[&var].contains(field) {
                    bad = Some((node.id, var, field.to_string()));
                }
            }
        });
        let Some((id, var, field)) = bad else {
            return Ok(());
        };
        let known: Vec<&str> = self.0[&var].iter().map(String::as_str).collect();
        Err(KeyError {
            at: c.node_pos(id, 1),
            key: c.entry.key.clone(),
            message: format!("`{}` has no field `{field}`", var.name()),
            help: format!("the fields of `{}` are {}", var.name(), known.join(", ")),
        })
    }
}

/// The field names of a fact struct, as CEL sees them.
fn names(facts: &impl serde::Serialize) -> BTreeSet<String> {
    match cel::to_value(facts) {
        Ok(cel::Value::Map(m)) => m
            .map
            .keys()
            .filter_map(|k| match k {
                cel::objects::Key::String(s) => Some(s.to_string()),
                _ => None,
            })
            .collect(),
        _ => BTreeSet::new(),
    }
}

fn check_reads(hook: Hook, c: &Compiled) -> Result<(), KeyError> {
    let Some(bad) = c.reads.iter().find(|v| !hook.vars().contains(v)) else {
        return Ok(());
    };
    let seen: Vec<&str> = hook.vars().iter().map(|v| v.name()).collect();
    Err(c.entry.error(
        format!(
            "reads `{}` (directly or through a let), which `{}` cannot see",
            bad.name(),
            hook.key()
        ),
        format!("`{}` sees only {}", hook.key(), seen.join(", ")),
    ))
}

/// `job.share` is the `share` hook's own value: the hook cannot read it (directly or
/// through a let).
fn check_share_reads_no_share(policy: &Policy) -> Result<(), KeyError> {
    let Some((_, c)) = policy.file_expressions().find(|(h, _)| *h == Hook::Share) else {
        return Ok(());
    };
    if !policy.fields_read(Hook::Share).contains("job.share") {
        return Ok(());
    }
    Err(c.entry.error(
        "reads `job.share` (directly or through a let), which is the value of `share` itself"
            .to_string(),
        "`share` gives the job's weight; compute it from other fields (job, user, lab, now)"
            .to_string(),
    ))
}

fn failure(c: &Compiled, sample: &str, why: &str) -> KeyError {
    c.entry
        .error(format!("{why} (on the sample {sample})"), help_for(why))
}

fn help_for(why: &str) -> String {
    let text = if why.contains("No such key") {
        "that field does not exist (the variables and their fields are listed in \
         policies/README.md); for an RSL relation a job may leave out, test \
         `has(job.spec.KEY)` first"
    } else if why.contains("undeclared reference") {
        "the names an expression can use are host, job, holder, user, lab, now and the \
         names under [let]; the functions are CEL's standard ones, without regular \
         expressions, timestamps and durations (see policies/README.md)"
    } else if why.contains("overload") || why.contains("binary operator") {
        "CEL does not mix int and double in arithmetic: convert with double(x) or int(x); \
         a value that may be unknown (null) must be compared with null first"
    } else if why.contains("must give") {
        "make the expression give the hook's type, e.g. a comparison for a bool hook"
    } else {
        "see policies/README.md for the language, the hooks and the variables"
    };
    text.to_string()
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::{Built, Sample};

    pub(crate) fn built(s: &Sample) -> Built {
        Built::new(s)
    }
}
