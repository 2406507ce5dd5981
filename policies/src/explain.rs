//! Explaining decisions (for `rb policy explain HOST`): each hook's expression, its value on
//! a scope, and the input fields it reads (`host.keyboard_idle_s`, `job.adaptive`, through
//! lets too) with their values there.

use std::collections::{BTreeMap, BTreeSet};

use cel::{
    common::ast::{Expr, SelectExpr},
    IdedExpr, Value,
};

use crate::{
    ast,
    compile::Compiled,
    eval::{EvalError, Scope},
    hooks::{Answer, Hook, Var},
    policy::Policy,
};

/// One hook, explained.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub hook: Hook,
    /// Whether the file sets it (else the default is in force).
    pub set: bool,
    /// The expression in force; `None`: unset with no default (the broker's rule).
    pub expression: Option<String>,
    pub value: Option<Answer>,
    pub error: Option<EvalError>,
    /// The input fields the expression reads and their values (CEL notation).
    pub inputs: Vec<(String, String)>,
}

impl Policy {
    /// The input fields (`host.load1`, `job.spec.count`) the expression in force for `hook`
    /// reads, directly or through lets.
    pub fn fields_read(&self, hook: Hook) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        if let Some(c) = self.active_expression(hook) {
            collect(&c.expr, self.lets(), &mut out, &mut BTreeSet::new());
        }
        out
    }

    /// Explains every hook whose variables `scope` binds, in [`Hook::ALL`] order.
    pub fn explain(&self, scope: Scope<'_>) -> Vec<Explanation> {
        Hook::ALL
            .into_iter()
            .filter(|h| self.reads(*h).iter().all(|v| scope.binds(*v)))
            .map(|hook| {
                let d = self.eval(hook, scope);
                let inputs = self
                    .fields_read(hook)
                    .into_iter()
                    .map(|path| {
                        let value = self.field_value(&path, scope);
                        (path, value)
                    })
                    .collect();
                Explanation {
                    hook,
                    set: self.is_set(hook),
                    expression: self.expression(hook).map(String::from),
                    value: d.value,
                    error: d.error,
                    inputs,
                }
            })
            .collect()
    }

    /// The value of a dotted field path on `scope`, rendered; `?` when it cannot be read.
    fn field_value(&self, path: &str, scope: Scope<'_>) -> String {
        let mut parts = path.split('.');
        let Some(root) = parts.next() else {
            return "?".into();
        };
        let mut expr = IdedExpr {
            id: 1,
            expr: Expr::Ident(root.to_string()),
        };
        for field in parts {
            expr = IdedExpr {
                id: 1,
                expr: Expr::Select(SelectExpr {
                    operand: Box::new(expr),
                    field: field.to_string(),
                    test: false,
                }),
            };
        }
        self.evaluator()
            .value(&Var::ALL, &expr, scope)
            .map_or_else(|_| "?".into(), |v| render(&v))
    }
}

/// Adds the dotted paths of field selections rooted at a variable in `e` (and in the lets
/// it uses) to `out`. `host.users.exists(u, ...)` reads `host.users`.
/// Each let is walked once (`seen`): a let used ten times by a let used ten times... is
/// not walked a million times.
fn collect<'l>(
    e: &IdedExpr,
    lets: &'l BTreeMap<String, Compiled>,
    out: &mut BTreeSet<String>,
    seen: &mut BTreeSet<&'l str>,
) {
    let mut used_lets = Vec::new();
    let mut paths = Vec::new();
    ast::walk(e, &mut |node| match &node.expr {
        Expr::Ident(name) if lets.contains_key(name) => used_lets.push(name.clone()),
        _ => paths.extend(ast::var_path(node)),
    });
    // Keep the longest path of a chain: `job.spec.gpus`, not also `job.spec`.
    for p in &paths {
        if !paths
            .iter()
            .any(|q| q.len() > p.len() && q.starts_with(&format!("{p}.")))
        {
            out.insert(p.clone());
        }
    }
    for name in used_lets {
        if let Some((name, c)) = lets.get_key_value(&name) {
            if seen.insert(name.as_str()) {
                collect(&c.expr, lets, out, seen);
            }
        }
    }
}

/// A value in CEL notation.
fn render(v: &Value) -> String {
    match v {
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => format!("{u}u"),
        Value::Float(f) => format!("{f:?}"),
        Value::String(s) => format!("{:?}", s.as_str()),
        Value::Null => "null".into(),
        Value::List(l) => {
            let items: Vec<String> = l.iter().map(render).collect();
            format!("[{}]", items.join(", "))
        }
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        facts::{HostFacts, JobFacts, SpecValue},
        value::{HostValue, JobValue},
    };

    #[test]
    fn explains_each_hook_with_the_fields_it_read() {
        let p = Policy::shipped("paper").expect("paper");
        let host = HostValue::new(
            &HostFacts {
                name: "ws1".into(),
                owner: Some("ann".into()),
                up: true,
                cpus: 2,
                load1: Some(0.5),
                users: Some(vec![]),
                console_idle_s: Some(12),
                ..HostFacts::default()
            }
            .derive(),
        );
        let job = JobValue::new(&JobFacts {
            id: 4,
            adaptive: true,
            ..JobFacts::default()
        });
        let all = p.explain(Scope::new().host(&host).job(&job));
        let hooks: Vec<Hook> = all.iter().map(|e| e.hook).collect();
        // Not may_preempt / preempt_rank: no holder is bound.
        let want = [
            Hook::Start,
            Hook::Rank,
            Hook::Vacate,
            Hook::GraceS,
            Hook::Share,
            Hook::MaxHosts,
            Hook::Priority,
            Hook::Overflow,
        ];
        assert_eq!(hooks, want);
        let start = &all[0];
        assert_eq!(start.value, Some(Answer::Bool(false)));
        assert!(start.set);
        assert_eq!(
            start.inputs,
            [
                ("host.owner_idle_s".to_string(), "12".to_string()),
                ("host.private".to_string(), "true".to_string()),
                ("job.adaptive".to_string(), "true".to_string()),
            ]
        );
        assert_eq!(all[2].value, Some(Answer::Bool(true)), "vacate: owner back");
    }

    #[test]
    fn fields_read_reach_rsl_relations_and_comprehensions() {
        let text = "start = 'has(job.spec.gpus) && host.users.exists(u, u.idle_s > 9)'\n";
        let p = Policy::from_text(std::path::Path::new("t.toml"), text).expect("loads");
        assert_eq!(
            p.fields_read(Hook::Start),
            ["host.users".to_string(), "job.spec.gpus".to_string()].into()
        );
        let job = JobValue::new(&JobFacts {
            spec: [("gpus".to_string(), SpecValue::Int(2))].into(),
            ..JobFacts::default()
        });
        assert_eq!(p.field_value("job.spec.gpus", Scope::new().job(&job)), "2");
        assert_eq!(p.field_value("job.spec.none", Scope::new().job(&job)), "?");
    }
}
