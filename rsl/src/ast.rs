//! The owned RSL syntax tree: what [`crate::Rsl`] is made of.
//!
//! The shapes mirror `globus_rsl.h` (REFERENCE-NOTES A.4): a specification is
//! either a boolean composition (`&`, `|`, `+`) of specifications or a
//! relation `attribute op values…`; a value is a literal, a parenthesised
//! sequence, a variable reference `$(name [default…])` or a concatenation
//! `left # right`. Attribute names are kept verbatim; [`canonical_name`] gives
//! the GRAM form used for lookups.

use std::fmt;

/// A parsed RSL specification (the `specification` production).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rsl {
    /// `OP(spec)(spec)…` with at least one operand.
    Boolean {
        /// The composition operator.
        op: BoolOp,
        /// The operands, in source order (never empty).
        operands: Vec<Rsl>,
    },
    /// `attribute OP value…`.
    Relation(Relation),
}

/// The boolean composition operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoolOp {
    /// `&`: conjunction.
    And,
    /// `|`: disjunction.
    Or,
    /// `+`: multi-request.
    Multi,
}

/// A relation `attribute OP value…` (the `relation` production).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The attribute name exactly as written (after unquoting).
    pub attribute: String,
    /// The relational operator.
    pub op: RelOp,
    /// The value sequence (never empty).
    pub values: Vec<Value>,
}

/// The relational operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RelOp {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// A value inside a relation's value sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A literal string (quoted or not in the source; the quotes are gone).
    Literal(String),
    /// A parenthesised, non-empty sequence `(v v …)`.
    Sequence(Vec<Value>),
    /// `$(v v …)`: the first element names the variable, a second one is the
    /// (never honoured) "default". Any value may appear syntactically.
    Variable(Vec<Value>),
    /// `left # right`, explicit or implicit. Operands are literals, variables
    /// or concatenations (the parser nests to the right, as bison does).
    Concat(Box<Value>, Box<Value>),
}

impl BoolOp {
    /// The operator's RSL spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BoolOp::And => "&",
            BoolOp::Or => "|",
            BoolOp::Multi => "+",
        }
    }
}

impl RelOp {
    /// The operator's RSL spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RelOp::Eq => "=",
            RelOp::Ne => "!=",
            RelOp::Lt => "<",
            RelOp::Le => "<=",
            RelOp::Gt => ">",
            RelOp::Ge => ">=",
        }
    }
}

impl fmt::Display for BoolOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for RelOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The GRAM canonical form of an attribute name: ASCII lower-case with every
/// `_` removed (`globus_rsl_assist_string_canonicalize`), so `Max_Wall_Time`,
/// `max__wall__time` and `maxwalltime` are one attribute.
pub fn canonical_name(name: &str) -> String {
    name.chars()
        .filter(|&c| c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

impl Relation {
    /// [`canonical_name`] of this relation's attribute.
    pub fn canonical_attribute(&self) -> String {
        canonical_name(&self.attribute)
    }
}

impl Value {
    /// The string of a literal value, `None` for any other kind.
    pub fn as_literal(&self) -> Option<&str> {
        match self {
            Value::Literal(s) => Some(s),
            _ => None,
        }
    }

    /// For a variable: its name, when the first element is a literal
    /// (`globus_rsl_value_variable_get_name`).
    pub fn variable_name(&self) -> Option<&str> {
        match self {
            Value::Variable(seq) => seq.first().and_then(Value::as_literal),
            _ => None,
        }
    }

    /// For a variable: the "default", when there is a second element and it
    /// is a literal (`globus_rsl_value_variable_get_default`).
    pub fn variable_default(&self) -> Option<&str> {
        match self {
            Value::Variable(seq) => seq.get(1).and_then(Value::as_literal),
            _ => None,
        }
    }
}

impl Rsl {
    /// Rewrite every attribute name into its [`canonical_name`], in place
    /// (`globus_rsl_assist_attributes_canonicalize`). Values are untouched.
    pub fn canonicalize_attributes(&mut self) {
        match self {
            Rsl::Boolean { operands, .. } => {
                operands.iter_mut().for_each(Rsl::canonicalize_attributes)
            }
            Rsl::Relation(rel) => rel.attribute = canonical_name(&rel.attribute),
        }
    }

    /// A copy with canonical attribute names (see [`Rsl::canonicalize_attributes`]).
    pub fn canonicalized(&self) -> Rsl {
        let mut copy = self.clone();
        copy.canonicalize_attributes();
        copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_name_lowercases_and_drops_underscores() {
        assert_eq!(canonical_name("Max_Wall_Time"), "maxwalltime");
        assert_eq!(canonical_name("max__wall__time"), "maxwalltime");
        assert_eq!(canonical_name("RSL_SUBSTITUTION"), "rslsubstitution");
        assert_eq!(canonical_name("Ünï_x"), "Ünïx", "only ASCII letters fold");
    }

    #[test]
    fn variable_accessors_follow_globus() {
        let lit = |s: &str| Value::Literal(s.into());
        let v = Value::Variable(vec![lit("A"), Value::Sequence(vec![lit("b")]), lit("c")]);
        assert_eq!(v.variable_name(), Some("A"));
        assert_eq!(v.variable_default(), None, "a sequence is no default");
        let computed = Value::Variable(vec![Value::Sequence(vec![lit("A")])]);
        assert_eq!(computed.variable_name(), None);
    }

    #[test]
    fn canonicalize_walks_booleans() {
        let mut rsl = Rsl::Boolean {
            op: BoolOp::And,
            operands: vec![Rsl::Relation(Relation {
                attribute: "Max_Time".into(),
                op: RelOp::Eq,
                values: vec![Value::Literal("A_B".into())],
            })],
        };
        rsl.canonicalize_attributes();
        let Rsl::Boolean { operands, .. } = &rsl else {
            panic!("shape")
        };
        let Rsl::Relation(rel) = &operands[0] else {
            panic!("shape")
        };
        assert_eq!(rel.attribute, "maxtime");
        assert_eq!(
            rel.values[0],
            Value::Literal("A_B".into()),
            "values untouched"
        );
    }
}
