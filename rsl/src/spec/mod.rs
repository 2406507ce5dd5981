//! ResourceBroker job specs: the typed, serialisable form of an evaluated
//! RSL request, with ResourceBroker's own `adaptive`, `module` and
//! `start_script` keys (ResourceBroker paper §4.1).
//!
//! Text → [`JobSpec`] is strict-mode parsing with ResourceBroker's bare form
//! (`(module="pvm")(adaptive=yes)` is an implicit `&`, see
//! [`Rsl::parse_job`]), evaluation with an empty symbol table (so
//! `rsl_substitution` works), then this module's checks:
//!
//! * **Shape.** A relation, or an `&` of relations (nested `&` flatten), is
//!   one part. A `+` whose operands are all relations is the paper's form,
//!   `+(count>=4)(arch="i86Linux")(module="pvm")`, and is also ONE part. A
//!   `+` whose operands are all `&` (or single relations wrapped in `&`) is a
//!   multi-request: one part per operand. `|` is not supported, and nothing
//!   may nest below a part.
//! * **Attributes** are compared in GRAM canonical form (case-insensitive,
//!   `_` ignored: `Start_Script`, `startscript`). Unknown ones are an error
//!   naming the closest known attribute.
//! * **Duplicates and contradictions** are errors: an attribute given twice,
//!   `count>=8` with `count<=2`, `count=4` with `count>=2`.

mod attributes;

use serde::{Deserialize, Serialize};

use crate::ast::{BoolOp, Relation, Rsl};
use crate::error::{RslError, SpecError};
use crate::eval::SymbolTable;

/// A job description: one or more parts (several for a `+` multi-request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The requests, in source order (never empty).
    pub parts: Vec<JobPart>,
}

/// How many machines a part wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    /// At least this many (default 1).
    pub min: u64,
    /// At most this many (`None`: no upper bound).
    pub max: Option<u64>,
}

impl Default for Count {
    fn default() -> Self {
        Count { min: 1, max: None }
    }
}

/// One request: where and how to run, and what.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPart {
    /// `count` (`=`, `>=`, `>`, `<=`, `<`): number of machines.
    pub count: Count,
    /// `arch`: required architecture label (e.g. `i86Linux`, `x86_64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// `os`: required operating system label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    /// `min_memory = N` or `memory >= N`: megabytes per machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_memory_mb: Option<u64>,
    /// `host`: explicit machine names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// `adaptive = yes|no`: may grow and shrink while running.
    pub adaptive: bool,
    /// `module`: external grow/shrink/halt modules to use (e.g. `pvm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// `jel`: the consistency of the job's JEL pool, e.g. `reliable,uniform` (the agent
    /// checks the words; see `jel::pool::PoolConfig::from_rsl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jel: Option<String>,
    /// `start_script`: run on each machine before the job's processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_script: Option<String>,
    /// `executable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executable: Option<String>,
    /// `arguments`: one value per argument.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arguments: Vec<String>,
    /// `directory`: working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<String>,
    /// `environment = (NAME VALUE)…`, in source order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environment: Vec<(String, String)>,
    /// `stdin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// `stdout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// `stderr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// `max_wall_time`: minutes (GRAM's unit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wall_time_min: Option<u64>,
}

impl JobSpec {
    /// THE entry point for other crates: parse (strict, bare form allowed),
    /// evaluate, and check a job spec.
    pub fn from_rsl_text(text: &str) -> Result<JobSpec, RslError> {
        let rsl = Rsl::parse_job(text)?;
        JobSpec::from_rsl(&rsl)
    }

    /// Evaluate `rsl` (empty symbol table) and check it as a job spec.
    pub fn from_rsl(rsl: &Rsl) -> Result<JobSpec, RslError> {
        let evaluated = rsl.evaluate(&mut SymbolTable::new())?;
        let parts = split_parts(&evaluated)?
            .into_iter()
            .map(attributes::part_from_relations)
            .collect::<Result<Vec<_>, SpecError>>()?;
        Ok(JobSpec { parts })
    }

    /// Pretty JSON, as `rb rsl spec` prints it and the broker receives it.
    pub fn to_json_pretty(&self) -> String {
        // Plain data with string keys: serialisation cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Split an evaluated tree into parts, each a list of relations.
fn split_parts(rsl: &Rsl) -> Result<Vec<Vec<&Relation>>, SpecError> {
    match rsl {
        Rsl::Relation(rel) => Ok(vec![vec![rel]]),
        Rsl::Boolean {
            op: BoolOp::And,
            operands,
        } => Ok(vec![flatten_and(operands)?]),
        Rsl::Boolean {
            op: BoolOp::Multi,
            operands,
        } => {
            if operands.iter().all(|o| matches!(o, Rsl::Relation(_))) {
                // The paper's `+(count>=4)(arch="i86Linux")(module="pvm")`.
                return Ok(vec![flatten_and(operands)?]);
            }
            operands
                .iter()
                .map(|o| match o {
                    Rsl::Boolean {
                        op: BoolOp::And,
                        operands,
                    } => flatten_and(operands),
                    _ => Err(SpecError::Shape(
                        "in a multi-request every operand of `+` must be an `&(…)` part \
                         (or every operand a relation, for a single request)"
                            .into(),
                    )),
                })
                .collect()
        }
        Rsl::Boolean { op: BoolOp::Or, .. } => Err(or_unsupported()),
    }
}

fn or_unsupported() -> SpecError {
    SpecError::Shape(
        "alternatives (`|`) are not supported in job specs; describe one request, \
         or several parts with `+(&(…))(&(…))`"
            .into(),
    )
}

/// The relations under an `&`, flattening nested `&`.
fn flatten_and(operands: &[Rsl]) -> Result<Vec<&Relation>, SpecError> {
    let mut out = Vec::new();
    for operand in operands {
        match operand {
            Rsl::Relation(rel) => out.push(rel),
            Rsl::Boolean {
                op: BoolOp::And,
                operands,
            } => out.extend(flatten_and(operands)?),
            Rsl::Boolean { op: BoolOp::Or, .. } => return Err(or_unsupported()),
            Rsl::Boolean {
                op: BoolOp::Multi, ..
            } => {
                return Err(SpecError::Shape(
                    "a multi-request (`+`) may only appear at the top level".into(),
                ))
            }
        }
    }
    Ok(out)
}
