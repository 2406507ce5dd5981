//! The allocation policy engine: policy files of named CEL expressions, loaded, checked and
//! evaluated as pure functions over pre-built input values.
//!
//! A policy file is TOML whose values are CEL expressions, one per hook (`start`, `rank`,
//! `vacate`, `grace_s`, `may_preempt`, `preempt_rank`, `share`, `max_hosts`, `priority`)
//! plus a `[let]` table of named sub-expressions. The language, the hooks, their defaults and
//! the variables are documented in `policies/README.md`.
//!
//! # Layout
//! - [`facts`]: the typed inputs the broker fills (`HostFacts`, `JobFacts`, ...).
//! - [`value`]: CEL values pre-built from them once (`HostValue::new` per report).
//! - [`hooks`]: hook names, types, variables and defaults.
//! - `source`: the TOML, with the file position of every expression.
//! - `ast`: walking CEL syntax trees (field selections on variables).
//! - [`parse_thread`]: the long-lived large-stack thread every parse runs on.
//! - [`compile`]: TOML and CEL parsing on that thread, depth cap, lets and what each reads.
//! - `samples` and [`check`]: the load-time check against sample inputs; [`check_file`].
//! - [`cost`]: the static cost estimate checked at load and the run-time budget.
//! - [`policy`]: [`Policy`], loading and the evaluation entry points.
//! - [`eval`]: [`Scope`], [`Decision`], the evaluation itself.
//! - `fast`: the evaluated form's path without the `cel` interpreter (scalar expressions).
//! - [`explain`]: each hook's value and the input fields it read (`rb policy explain`).
//!
//! # Use
//! ```
//! use policies::{facts::*, value::*, Policy, Scope};
//!
//! let policy = Policy::shipped("paper").expect("a shipped policy");
//! let host = HostValue::new(&HostFacts { name: "node01".into(), up: true, cpus: 2,
//!     users: Some(vec![]), ..HostFacts::default() }.derive());
//! let job = JobValue::new(&JobFacts { id: 1, adaptive: true, ..JobFacts::default() });
//! let (user, lab) = (UserValue::new(&UserFacts::default()), LabValue::new(&LabFacts::default()));
//! let now = NowValue::new(&NowFacts::default());
//! let scope = Scope::new().host(&host).job(&job).user(&user).lab(&lab).now(&now);
//! let start = policy.start(scope);
//! assert!(start.value && start.error.is_none());
//! ```

mod ast;
pub mod check;
pub mod compile;
pub mod cost;
pub mod error;
pub mod eval;
pub mod explain;
pub mod facts;
mod fast;
pub mod hooks;
mod inline;
pub mod parse_thread;
pub mod policy;
mod samples;
mod source;
pub mod value;

use std::path::{Path, PathBuf};

pub use check::{check_file, Summary};
pub use error::{Error, Pos};
pub use eval::{Decision, EvalError, Scope};
pub use explain::Explanation;
pub use hooks::{Answer, Hook, Kind, Var};
pub use policy::Policy;

/// The policies shipped in `policies/`, by name; `paper` is the default.
pub const SHIPPED: [(&str, &str); 4] = [
    ("paper", include_str!("../paper.toml")),
    ("desktop", include_str!("../desktop.toml")),
    (
        "nights-and-weekends",
        include_str!("../nights-and-weekends.toml"),
    ),
    ("dedicated", include_str!("../dedicated.toml")),
];

/// The name of the default policy.
pub const DEFAULT_POLICY: &str = "paper";

/// The text of the shipped policy `name`.
pub fn shipped_text(name: &str) -> Option<&'static str> {
    SHIPPED.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

impl Policy {
    /// The shipped policy `name` (built into the binary), its path shown as
    /// `policies/NAME.toml`. `None` for an unknown name.
    pub fn shipped(name: &str) -> Option<Policy> {
        let text = shipped_text(name)?;
        let path = PathBuf::from(format!("policies/{name}.toml"));
        // The shipped files are checked by this crate's tests.
        Some(Policy::from_text(&path, text).expect("a shipped policy loads"))
    }

    /// What the lab file's `[broker] policy` names: a shipped name (`paper`), else a path,
    /// relative to `base` (the lab file's directory) unless absolute.
    pub fn from_setting(setting: &str, base: &Path) -> Result<Policy, Error> {
        match Policy::shipped(setting) {
            Some(p) => Ok(p),
            None => Policy::load(&base.join(setting)),
        }
    }
}

#[cfg(test)]
mod cost_tests;
#[cfg(test)]
mod shipped_tests;
