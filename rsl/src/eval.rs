//! Evaluation of `$(…)` references and `rsl_substitution` definitions, as
//! `globus_rsl_eval` does it (REFERENCE-NOTES A.5).
//!
//! * Every boolean (`&`, `|`, `+`) opens a scope for its operands, which are
//!   evaluated left to right; lookups search inner → outer scopes, so a
//!   name must be defined before use and definitions in one `+` part are
//!   invisible to its siblings.
//! * A relation named `rsl_substitution` or `rslsubstitution` (ASCII
//!   case-insensitive) defines variables: each value must be a pair
//!   `(NAME VALUE)` of single values, evaluated before the binding is made.
//!   Re-defining a name in the same scope is ignored (first binding wins);
//!   an inner scope may shadow. With no scope at all (a bare top-level
//!   relation and an empty [`SymbolTable`]) definitions are dropped.
//! * `$(NAME)` must have exactly one element, a literal; variable names are
//!   case-sensitive. Concatenations collapse into one literal.

use std::collections::HashMap;

use crate::ast::{Relation, Rsl, Value};
use crate::error::EvalError;

/// Scoped variable bindings (`globus_symboltable_t`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SymbolTable {
    scopes: Vec<HashMap<String, String>>,
}

impl SymbolTable {
    /// A table with no scope, like a freshly initialised Globus symbol table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table with one outer scope holding `bindings` (the way GRAM
    /// pre-defines `HOME`, `LOGNAME`, …). Earlier pairs win over later ones.
    pub fn with_bindings<I, K, V>(bindings: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let mut table = Self::new();
        table.push_scope();
        for (name, value) in bindings {
            table.insert(name.into(), value.into());
        }
        table
    }

    /// Open a new innermost scope.
    pub fn push_scope(&mut self) {
        self.scopes.push(HashMap::new());
    }

    /// Close the innermost scope (no-op when there is none).
    pub fn pop_scope(&mut self) {
        self.scopes.pop();
    }

    /// Bind `name` in the innermost scope. Returns `false` (and changes
    /// nothing) when there is no scope or the name is already bound there.
    pub fn insert(&mut self, name: String, value: String) -> bool {
        match self.scopes.last_mut() {
            Some(scope) if !scope.contains_key(&name) => {
                scope.insert(name, value);
                true
            }
            _ => false,
        }
    }

    /// The innermost binding of `name`.
    pub fn lookup(&self, name: &str) -> Option<&str> {
        self.scopes
            .iter()
            .rev()
            .find_map(|scope| scope.get(name).map(String::as_str))
    }
}

impl Rsl {
    /// Evaluate against `table` and return the evaluated tree: variables
    /// replaced by their values, concatenations joined, `rsl_substitution`
    /// pairs reduced to literals. `table` is left as it was found.
    pub fn evaluate(&self, table: &mut SymbolTable) -> Result<Rsl, EvalError> {
        match self {
            Rsl::Boolean { op, operands } => {
                table.push_scope();
                let evaluated: Result<Vec<Rsl>, EvalError> =
                    operands.iter().map(|o| o.evaluate(table)).collect();
                table.pop_scope();
                Ok(Rsl::Boolean {
                    op: *op,
                    operands: evaluated?,
                })
            }
            Rsl::Relation(rel) => Ok(Rsl::Relation(evaluate_relation(rel, table)?)),
        }
    }
}

/// Is this the attribute that defines variables?
pub(crate) fn is_substitution(attribute: &str) -> bool {
    attribute.eq_ignore_ascii_case("rsl_substitution")
        || attribute.eq_ignore_ascii_case("rslsubstitution")
}

fn evaluate_relation(rel: &Relation, table: &mut SymbolTable) -> Result<Relation, EvalError> {
    let values = if is_substitution(&rel.attribute) {
        rel.values
            .iter()
            .map(|v| define_pair(&rel.attribute, v, table))
            .collect::<Result<_, _>>()?
    } else {
        rel.values
            .iter()
            .map(|v| evaluate_value(v, table))
            .collect::<Result<_, _>>()?
    };
    Ok(Relation {
        attribute: rel.attribute.clone(),
        op: rel.op,
        values,
    })
}

/// One `(NAME VALUE)` of an `rsl_substitution`: evaluate both, bind, and
/// return the pair as literals.
fn define_pair(attribute: &str, pair: &Value, table: &mut SymbolTable) -> Result<Value, EvalError> {
    let Value::Sequence(elements) = pair else {
        return Err(EvalError::SubstitutionNotSequence {
            attribute: attribute.into(),
        });
    };
    let [name, value] = elements.as_slice() else {
        return Err(EvalError::SubstitutionArity {
            attribute: attribute.into(),
            count: elements.len(),
        });
    };
    let nested = || EvalError::SubstitutionNested {
        attribute: attribute.into(),
    };
    let name = evaluate_string(name, table)?.ok_or_else(nested)?;
    let value = evaluate_string(value, table)?.ok_or_else(nested)?;
    table.insert(name.clone(), value.clone());
    Ok(Value::Sequence(vec![
        Value::Literal(name),
        Value::Literal(value),
    ]))
}

/// Evaluate a value outside `rsl_substitution`: sequences element-wise,
/// everything else to one literal.
fn evaluate_value(value: &Value, table: &SymbolTable) -> Result<Value, EvalError> {
    match value {
        Value::Sequence(values) => Ok(Value::Sequence(
            values
                .iter()
                .map(|v| evaluate_value(v, table))
                .collect::<Result<_, _>>()?,
        )),
        other => Ok(Value::Literal(
            evaluate_string(other, table)?.ok_or(EvalError::ConcatenatedSequence)?,
        )),
    }
}

/// The string a non-sequence value stands for; `None` for a sequence.
fn evaluate_string(value: &Value, table: &SymbolTable) -> Result<Option<String>, EvalError> {
    match value {
        Value::Literal(text) => Ok(Some(text.clone())),
        Value::Sequence(_) => Ok(None),
        Value::Variable(elements) => {
            let name = value.variable_name();
            if elements.len() != 1 {
                return Err(EvalError::VariableArity {
                    name: name.unwrap_or("?").into(),
                    count: elements.len(),
                });
            }
            let name = name.ok_or(EvalError::ComputedName)?;
            match table.lookup(name) {
                Some(bound) => Ok(Some(bound.to_string())),
                None => Err(EvalError::Unbound { name: name.into() }),
            }
        }
        Value::Concat(left, right) => {
            let left = evaluate_string(left, table)?.ok_or(EvalError::ConcatenatedSequence)?;
            let right = evaluate_string(right, table)?.ok_or(EvalError::ConcatenatedSequence)?;
            Ok(Some(left + &right))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mode;

    fn eval(text: &str) -> Result<String, EvalError> {
        let rsl = Rsl::parse(text, Mode::Strict).expect("parses");
        let evaluated = rsl.evaluate(&mut SymbolTable::new())?;
        Ok(evaluated.unparse().expect("unparses"))
    }

    #[test]
    fn substitution_defines_in_order() {
        assert_eq!(
            eval("&(rsl_substitution=(a b)($(a) foo))(x=$(b)/out)").as_deref(),
            Ok(r#"&("rsl_substitution" = ("a" "b" ) ("b" "foo" ) )("x" = "foo/out" )"#)
        );
        assert!(matches!(
            eval("&(x=$(a))(rsl_substitution=(a b))"),
            Err(EvalError::Unbound { .. })
        ));
    }

    #[test]
    fn scopes_shadow_and_first_binding_wins() {
        assert_eq!(
            eval("&(RSLSubstitution=(a 1)(a 2))(x=$(a))").as_deref(),
            Ok(r#"&("RSLSubstitution" = ("a" "1" ) ("a" "2" ) )("x" = "1" )"#)
        );
        assert_eq!(
            eval("&(rsl_substitution=(a 1))(&(rsl_substitution=(a 2))(x=$(a)))(y=$(a))").as_deref(),
            Ok(
                r#"&("rsl_substitution" = ("a" "1" ) )(&("rsl_substitution" = ("a" "2" ) )("x" = "2" ))("y" = "1" )"#
            )
        );
        assert!(
            eval("+(&(rsl_substitution=(a 1)))(&(x=$(a)))").is_err(),
            "siblings do not see each other's definitions"
        );
        assert!(
            eval("&(rsl_substitution=(A 1))(x=$(a))").is_err(),
            "case-sensitive names"
        );
    }

    #[test]
    fn bare_relation_with_empty_table_drops_definitions() {
        assert!(eval("rsl_substitution=(a b)($(a) c)").is_err());
        let rsl = Rsl::parse("rsl_substitution=(a b)($(a) c)", Mode::Strict).expect("parses");
        let mut table = SymbolTable::with_bindings([("HOME", "/home/u")]);
        assert!(rsl.evaluate(&mut table).is_ok());
        assert_eq!(
            table.lookup("a"),
            Some("b"),
            "a bare relation binds in the caller's scope"
        );
    }

    #[test]
    fn evaluation_errors() {
        assert!(matches!(
            eval("&(x=$(A d))"),
            Err(EvalError::VariableArity { count: 2, .. })
        ));
        assert!(matches!(eval("&(x=$((A)))"), Err(EvalError::ComputedName)));
        assert!(matches!(
            eval("&(rsl_substitution=a)"),
            Err(EvalError::SubstitutionNotSequence { .. })
        ));
        assert!(matches!(
            eval("&(rsl_substitution=(a b c))"),
            Err(EvalError::SubstitutionArity { count: 3, .. })
        ));
        assert!(matches!(
            eval("&(rsl_substitution=(a (b)))"),
            Err(EvalError::SubstitutionNested { .. })
        ));
    }

    #[test]
    fn nested_sequences_and_concatenation() {
        let mut table = SymbolTable::with_bindings([("H", "/home/u")]);
        let rsl = Rsl::parse("&(environment=(HOME $(H)) (X a#b))", Mode::Strict).expect("parses");
        let out = rsl.evaluate(&mut table).expect("evaluates");
        assert_eq!(
            out.unparse().as_deref(),
            Ok(r#"&("environment" = ("HOME" "/home/u" ) ("X" "ab" ) )"#)
        );
    }
}
