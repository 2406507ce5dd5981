//! The job-spec attributes: which ones exist, which operators and value
//! shapes each accepts, and how relations fill a [`JobPart`] — including
//! duplicate and contradiction checks and "did you mean" suggestions.

use std::collections::HashMap;

use super::{Count, JobPart};
use crate::ast::{canonical_name, RelOp, Relation, Value};
use crate::error::SpecError;
use crate::eval::is_substitution;

/// Known attributes: GRAM canonical form → the spelling we document.
const KNOWN: &[(&str, &str)] = &[
    ("count", "count"),
    ("arch", "arch"),
    ("os", "os"),
    ("minmemory", "min_memory"),
    ("memory", "memory"),
    ("host", "host"),
    ("adaptive", "adaptive"),
    ("module", "module"),
    ("jel", "jel"),
    ("startscript", "start_script"),
    ("executable", "executable"),
    ("arguments", "arguments"),
    ("directory", "directory"),
    ("environment", "environment"),
    ("stdin", "stdin"),
    ("stdout", "stdout"),
    ("stderr", "stderr"),
    ("maxwalltime", "max_wall_time"),
    ("rslsubstitution", "rsl_substitution"),
];

/// Build one part from its relations.
pub(super) fn part_from_relations(relations: Vec<&Relation>) -> Result<JobPart, SpecError> {
    let mut builder = Builder::default();
    for rel in relations {
        builder.apply(rel)?;
    }
    builder.finish()
}

#[derive(Default)]
struct Builder {
    part: JobPart,
    /// Constraint key → the attribute as first written.
    seen: HashMap<&'static str, String>,
    count_exact: Option<u64>,
    count_lower: Option<u64>,
    count_upper: Option<u64>,
}

impl Builder {
    fn apply(&mut self, rel: &Relation) -> Result<(), SpecError> {
        if is_substitution(&rel.attribute) {
            return Ok(()); // consumed by evaluation
        }
        let canonical = canonical_name(&rel.attribute);
        match canonical.as_str() {
            "count" => return self.count(rel),
            "minmemory" | "memory" => return self.memory(rel),
            "host" => {
                self.once("host", rel, &[RelOp::Eq])?;
                self.part.hosts = literals(rel)?;
            }
            "adaptive" => {
                self.once("adaptive", rel, &[RelOp::Eq])?;
                self.part.adaptive = yes_no(rel)?;
            }
            "arguments" => {
                self.once("arguments", rel, &[RelOp::Eq])?;
                self.part.arguments = literals(rel)?;
            }
            "environment" => {
                self.once("environment", rel, &[RelOp::Eq])?;
                self.part.environment = pairs(rel)?;
            }
            "maxwalltime" => {
                self.once("maxwalltime", rel, &[RelOp::Eq])?;
                self.part.max_wall_time_min = Some(number(rel)?);
            }
            other => {
                let Some(&key) = STRING_ATTRIBUTES.iter().find(|k| **k == other) else {
                    return Err(unknown(rel));
                };
                let value = single(rel)?.to_string();
                self.once(key, rel, &[RelOp::Eq])?;
                if let Some(slot) = string_slot(&mut self.part, key) {
                    *slot = Some(value);
                }
            }
        }
        Ok(())
    }

    /// Record that `key` was given; only `ops` are allowed for it.
    fn once(&mut self, key: &'static str, rel: &Relation, ops: &[RelOp]) -> Result<(), SpecError> {
        if !ops.contains(&rel.op) {
            return Err(SpecError::Operator {
                attribute: rel.attribute.clone(),
                op: rel.op.to_string(),
                allowed: ops
                    .iter()
                    .map(|o| format!("`{o}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        if let Some(first) = self.seen.get(key) {
            return Err(SpecError::Duplicate {
                attribute: rel.attribute.clone(),
                first: first.clone(),
            });
        }
        self.seen.insert(key, rel.attribute.clone());
        Ok(())
    }

    fn count(&mut self, rel: &Relation) -> Result<(), SpecError> {
        let all = [RelOp::Eq, RelOp::Ge, RelOp::Gt, RelOp::Le, RelOp::Lt];
        let n = number(rel)?;
        let key = match rel.op {
            RelOp::Eq => "count=",
            RelOp::Ge | RelOp::Gt => "count>",
            _ => "count<",
        };
        self.once(key, rel, &all)?;
        let exact_and_bound = (self.count_exact.is_some() && rel.op != RelOp::Eq)
            || (rel.op == RelOp::Eq && (self.count_lower.is_some() || self.count_upper.is_some()));
        if exact_and_bound {
            return Err(SpecError::Contradiction {
                attribute: "count".into(),
                detail: "an exact `count=` cannot be combined with a range".into(),
            });
        }
        let impossible = || SpecError::Contradiction {
            attribute: "count".into(),
            detail: format!("`count{}{n}` leaves no possible count", rel.op),
        };
        match rel.op {
            RelOp::Eq if n == 0 => return Err(impossible()),
            RelOp::Eq => self.count_exact = Some(n),
            RelOp::Ge => self.count_lower = Some(n),
            RelOp::Gt => self.count_lower = Some(n.checked_add(1).ok_or_else(impossible)?),
            RelOp::Le => self.count_upper = Some(n),
            RelOp::Lt => self.count_upper = Some(n.checked_sub(1).ok_or_else(impossible)?),
            RelOp::Ne => unreachable!("rejected by once()"),
        }
        Ok(())
    }

    fn memory(&mut self, rel: &Relation) -> Result<(), SpecError> {
        let ops: &[RelOp] = if canonical_name(&rel.attribute) == "minmemory" {
            &[RelOp::Eq]
        } else {
            &[RelOp::Ge, RelOp::Gt, RelOp::Eq]
        };
        self.once("memory", rel, ops)?;
        let n = number(rel)?;
        let n = if rel.op == RelOp::Gt {
            n.saturating_add(1)
        } else {
            n
        };
        self.part.min_memory_mb = Some(n);
        Ok(())
    }

    fn finish(mut self) -> Result<JobPart, SpecError> {
        let min = self.count_exact.or(self.count_lower).unwrap_or(1).max(1);
        let max = self.count_exact.or(self.count_upper);
        if let Some(max) = max.filter(|&max| max < min) {
            return Err(SpecError::Contradiction {
                attribute: "count".into(),
                detail: format!("at least {min} and at most {max} machines cannot both hold"),
            });
        }
        self.part.count = Count { min, max };
        Ok(self.part)
    }
}

/// Attributes holding one string (canonical names).
const STRING_ATTRIBUTES: &[&str] = &[
    "arch",
    "os",
    "module",
    "jel",
    "startscript",
    "executable",
    "directory",
    "stdin",
    "stdout",
    "stderr",
];

/// The `Option<String>` field for a plain string attribute.
fn string_slot<'p>(part: &'p mut JobPart, canonical: &str) -> Option<&'p mut Option<String>> {
    Some(match canonical {
        "arch" => &mut part.arch,
        "os" => &mut part.os,
        "module" => &mut part.module,
        "jel" => &mut part.jel,
        "startscript" => &mut part.start_script,
        "executable" => &mut part.executable,
        "directory" => &mut part.directory,
        "stdin" => &mut part.stdin,
        "stdout" => &mut part.stdout,
        "stderr" => &mut part.stderr,
        _ => return None,
    })
}

fn bad(rel: &Relation, detail: impl Into<String>) -> SpecError {
    SpecError::Value {
        attribute: rel.attribute.clone(),
        detail: detail.into(),
    }
}

/// The one literal value of `rel`.
fn single(rel: &Relation) -> Result<&str, SpecError> {
    match rel.values.as_slice() {
        [Value::Literal(text)] => Ok(text),
        [_] => Err(bad(
            rel,
            "expected a single value, found a parenthesised sequence",
        )),
        values => Err(bad(
            rel,
            format!("expected a single value, found {}", values.len()),
        )),
    }
}

/// All values of `rel`, which must be literals.
fn literals(rel: &Relation) -> Result<Vec<String>, SpecError> {
    rel.values
        .iter()
        .map(|v| match v {
            Value::Literal(text) => Ok(text.clone()),
            _ => Err(bad(
                rel,
                "expected plain values, found a parenthesised sequence",
            )),
        })
        .collect()
}

/// `(NAME VALUE)…` pairs.
fn pairs(rel: &Relation) -> Result<Vec<(String, String)>, SpecError> {
    let mut seen = HashMap::new();
    rel.values
        .iter()
        .map(|v| match v {
            Value::Sequence(pair) => match pair.as_slice() {
                [Value::Literal(name), Value::Literal(value)] => {
                    if seen.insert(name.clone(), ()).is_some() {
                        return Err(bad(rel, format!("variable `{name}` is set twice")));
                    }
                    Ok((name.clone(), value.clone()))
                }
                _ => Err(bad(rel, "expected pairs like (NAME VALUE)")),
            },
            _ => Err(bad(
                rel,
                "expected pairs like (NAME VALUE), found a plain value",
            )),
        })
        .collect()
}

fn number(rel: &Relation) -> Result<u64, SpecError> {
    let text = single(rel)?;
    text.trim()
        .parse()
        .map_err(|_| bad(rel, format!("expected a whole number, found `{text}`")))
}

fn yes_no(rel: &Relation) -> Result<bool, SpecError> {
    match single(rel)?.to_ascii_lowercase().as_str() {
        "yes" | "true" => Ok(true),
        "no" | "false" => Ok(false),
        other => Err(bad(rel, format!("expected `yes` or `no`, found `{other}`"))),
    }
}

fn unknown(rel: &Relation) -> SpecError {
    let canonical = canonical_name(&rel.attribute);
    let best = KNOWN
        .iter()
        .map(|(c, shown)| (osa_distance(&canonical, c), *shown))
        .min_by_key(|(d, _)| *d);
    let limit = if canonical.chars().count() >= 4 { 2 } else { 1 };
    SpecError::UnknownAttribute {
        attribute: rel.attribute.clone(),
        suggestion: best
            .filter(|(d, _)| *d <= limit)
            .map(|(_, s)| s.to_string()),
    }
}

/// Optimal-string-alignment distance (Levenshtein plus adjacent swaps).
fn osa_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::osa_distance;

    #[test]
    fn distance_counts_swaps_as_one() {
        assert_eq!(osa_distance("cuont", "count"), 1);
        assert_eq!(osa_distance("arch", "arch"), 0);
        assert_eq!(osa_distance("modul", "module"), 1);
        assert_eq!(osa_distance("", "os"), 2);
    }
}
