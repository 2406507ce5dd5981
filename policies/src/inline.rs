//! Lets written into the expressions that use them once: the evaluated form's other half
//! (with [`crate::ast::indexed`]).
//!
//! A let read through the resolver costs a lookup by name, a slot in the evaluation's memo,
//! an evaluation of its own (a fresh interpreter context) and a boxed copy of its value:
//! about a fifth of the paper policy's `rank` (two lets, each used once). An expression
//! that uses a let once gains nothing from the memo, so the let's expression takes the
//! identifier's place. A let used twice or more (its memo saves evaluations), or inside a
//! comprehension (whose variables could capture the let's names, and which may evaluate it
//! once per item), stays a reference; so does every let inside such a one.
//!
//! Same values: expressions have no side effects, and a let's expression means the same
//! wherever it stands outside comprehensions (no variable but those of the comprehensions
//! is ever bound). Same errors, but not the same messages: a failing let is reported as
//! `in let NAME: …`, which only its own evaluation can say, so an evaluation of the inlined
//! form that fails is run again as written for its message ([`crate::eval`]).

use std::collections::BTreeMap;

use cel::{common::ast::Expr, IdedExpr};

use crate::{
    ast::{children, children_mut},
    compile::Compiled,
};

/// How often an expression uses each let, through the lets it uses too: 0, 1 or [`MANY`]
/// (a use inside a comprehension counts as many).
type Uses = BTreeMap<String, usize>;

/// Two or more uses.
const MANY: usize = 2;

/// Inlines the lets of one policy: each let's total uses are counted once (a let used
/// twice by each of a chain of lets is used 2^n times: counting through the chain anew at
/// each use would take as long).
pub(crate) struct Inliner<'a> {
    lets: &'a BTreeMap<String, Compiled>,
    totals: BTreeMap<String, Uses>,
}

impl<'a> Inliner<'a> {
    pub(crate) fn new(lets: &'a BTreeMap<String, Compiled>) -> Self {
        Inliner {
            lets,
            totals: BTreeMap::new(),
        }
    }

    /// `e` with each let it uses once, outside comprehensions, replaced by the let's
    /// expression (as written, with its cost charges), recursively: see the module docs.
    pub(crate) fn inline(&mut self, e: &IdedExpr) -> IdedExpr {
        let uses = self.total_uses(e);
        let mut out = e.clone();
        self.expand(&mut out, &uses);
        out
    }

    /// Whether the let `name` may take its identifier's place, given the whole expression's
    /// `uses`: it is used once, and so is every let it uses.
    fn inlinable(&mut self, name: &str, uses: &Uses) -> bool {
        let once = |n: &str| uses.get(n) == Some(&1);
        once(name) && self.let_uses(name).keys().all(|n| once(n))
    }

    fn expand(&mut self, e: &mut IdedExpr, uses: &Uses) {
        match &e.expr {
            Expr::Ident(name) if self.inlinable(name, uses) => {
                let mut body = self.lets[name.as_str()].expr.clone();
                self.expand(&mut body, uses);
                *e = body;
            }
            // Uses inside count as many: nothing in here is inlined.
            Expr::Comprehension(_) => {}
            _ => {
                for child in children_mut(e) {
                    self.expand(child, uses);
                }
            }
        }
    }

    /// The lets `e` uses, directly and through the lets it uses.
    fn total_uses(&mut self, e: &IdedExpr) -> Uses {
        let mut total = Uses::new();
        for (name, n) in direct_uses(e, self.lets) {
            add(&mut total, &name, n);
            for (inner, m) in self.let_uses(&name) {
                add(&mut total, &inner, n * m);
            }
        }
        total
    }

    /// [`Self::total_uses`] of the let `name`'s expression, counted once (lets form no
    /// cycle: the compiler refused those before).
    fn let_uses(&mut self, name: &str) -> Uses {
        if let Some(known) = self.totals.get(name) {
            return known.clone();
        }
        let uses = match self.lets.get(name) {
            Some(c) => self.total_uses(&c.expr),
            None => Uses::new(),
        };
        self.totals.insert(name.to_string(), uses.clone());
        uses
    }
}

fn add(uses: &mut Uses, name: &str, n: usize) {
    let u = uses.entry(name.to_string()).or_default();
    *u = (*u + n).min(MANY);
}

/// The lets `e` names itself, each with its number of uses.
fn direct_uses(e: &IdedExpr, lets: &BTreeMap<String, Compiled>) -> Uses {
    let mut uses = Uses::new();
    count(e, lets, 1, &mut uses);
    uses
}

fn count(e: &IdedExpr, lets: &BTreeMap<String, Compiled>, weight: usize, uses: &mut Uses) {
    let below = match &e.expr {
        Expr::Ident(name) if lets.contains_key(name) => return add(uses, name, weight),
        Expr::Comprehension(_) => MANY,
        _ => weight,
    };
    for child in children(e) {
        count(child, lets, below, uses);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use cel::common::ast::Expr;

    use crate::{ast::walk, Hook, Policy};

    /// The lets left as references in each hook's evaluated form.
    fn left(text: &str) -> Vec<(Hook, Vec<String>)> {
        let p = Policy::from_text(Path::new("t.toml"), text).expect("loads");
        p.file_expressions()
            .map(|(hook, c)| {
                let mut names = Vec::new();
                walk(&c.run, &mut |node| {
                    if let Expr::Ident(name) = &node.expr {
                        if p.lets().contains_key(name) {
                            names.push(name.clone());
                        }
                    }
                });
                names.sort();
                (hook, names)
            })
            .collect()
    }

    #[test]
    fn lets_used_once_are_written_in_and_the_others_stay() {
        let text = r#"
start = 'once && [1].all(x, x <= looped)'
rank = 'outer + twice + twice'
[let]
once = 'host.up'
inner = 'host.load1 == null ? 1.0 : host.load1'
outer = 'inner * 2.0'
twice = 'double(host.cpus)'
looped = 'host.cpus'
"#;
        assert_eq!(
            left(text),
            [
                (Hook::Start, vec!["looped".to_string()]),
                (Hook::Rank, vec!["twice".to_string(), "twice".to_string()]),
            ]
        );
    }

    /// A let used once that uses a let another use reaches too stays whole: inlining it
    /// would evaluate the inner one twice.
    #[test]
    fn a_let_whose_own_let_is_used_elsewhere_stays() {
        let text = r#"
rank = 'outer + inner'
[let]
inner = 'host.load1 == null ? 1.0 : host.load1'
outer = 'inner * 2.0'
"#;
        assert_eq!(
            left(text),
            [(Hook::Rank, vec!["inner".to_string(), "outer".to_string()])]
        );
    }

    /// The paper policy's hooks read no let through the resolver any more.
    #[test]
    fn the_paper_policy_inlines_every_let() {
        let p = Policy::shipped("paper").expect("paper");
        for (hook, c) in p.file_expressions() {
            walk(&c.run, &mut |node| {
                if let Expr::Ident(name) = &node.expr {
                    assert!(!p.lets().contains_key(name), "{} keeps {name}", hook.key());
                }
            });
        }
    }

    /// A failing let is named in the message, as it was when evaluated on its own.
    #[test]
    fn a_failing_inlined_let_is_named_in_the_message() {
        let text = "rank = 'd + 1.0'\n[let]\nd = 'double(host.cpus)'\n";
        let p = Policy::from_text(Path::new("t.toml"), text).expect("loads");
        let facts = crate::facts::HostFacts::default();
        let fields = crate::value::HostFields::NONE;
        let host = crate::value::HostValue::reading(&facts, fields);
        let d = p.eval(Hook::Rank, crate::Scope::new().host(&host));
        let why = d.error.expect("no session: an error").message;
        assert!(why.starts_with("in let `d`:"), "{why}");
    }
}
