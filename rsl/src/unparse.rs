//! The canonical text form of an RSL tree, byte-identical to
//! `globus_rsl_unparse` (REFERENCE-NOTES A.4): every literal double-quoted
//! with `"` doubled, a blank after every value, no blanks around boolean
//! operands.
//!
//! ```text
//! &(executable=/bin/date)(count=4)  →  &("executable" = "/bin/date" )("count" = "4" )
//! ```

use crate::ast::{Relation, Rsl, Value};
use crate::error::UnparseError;

impl Rsl {
    /// The canonical RSL text of this tree.
    ///
    /// Fails exactly where `globus_rsl_unparse` returns NULL: for a variable
    /// whose first element is not a literal (`$(A # B)`, `$($(N))`).
    ///
    /// Like the C original, a variable keeps only its name and a literal
    /// second element (`$(A b c)` → `$("A" "b")`, `$(A (b))` → `$("A")`);
    /// such variables never evaluate anyway. Otherwise parsing the result
    /// gives back an equal tree, and unparsing is always idempotent.
    pub fn unparse(&self) -> Result<String, UnparseError> {
        let mut out = String::new();
        write_rsl(&mut out, self)?;
        Ok(out)
    }
}

impl Value {
    /// The canonical RSL text of one value (`globus_rsl_value_unparse`).
    pub fn unparse(&self) -> Result<String, UnparseError> {
        let mut out = String::new();
        write_value(&mut out, self)?;
        Ok(out)
    }
}

fn write_rsl(out: &mut String, rsl: &Rsl) -> Result<(), UnparseError> {
    match rsl {
        Rsl::Boolean { op, operands } => {
            out.push_str(op.as_str());
            for operand in operands {
                out.push('(');
                write_rsl(out, operand)?;
                out.push(')');
            }
            Ok(())
        }
        Rsl::Relation(rel) => write_relation(out, rel),
    }
}

fn write_relation(out: &mut String, rel: &Relation) -> Result<(), UnparseError> {
    write_literal(out, &rel.attribute);
    out.push(' ');
    out.push_str(rel.op.as_str());
    out.push(' ');
    for value in &rel.values {
        write_value(out, value)?;
        out.push(' ');
    }
    Ok(())
}

fn write_value(out: &mut String, value: &Value) -> Result<(), UnparseError> {
    match value {
        Value::Literal(text) => write_literal(out, text),
        Value::Sequence(values) => {
            out.push('(');
            for v in values {
                write_value(out, v)?;
                out.push(' ');
            }
            out.push(')');
        }
        Value::Variable(_) => {
            let name = value
                .variable_name()
                .ok_or(UnparseError::ComputedVariableName)?;
            out.push_str("$(");
            write_literal(out, name);
            if let Some(default) = value.variable_default() {
                out.push(' ');
                write_literal(out, default);
            }
            out.push(')');
        }
        Value::Concat(left, right) => {
            write_value(out, left)?;
            out.push_str(" # ");
            write_value(out, right)?;
        }
    }
    Ok(())
}

/// `"text"` with every `"` doubled.
fn write_literal(out: &mut String, text: &str) {
    out.reserve(text.len() + 2);
    out.push('"');
    let mut rest = text;
    while let Some(p) = rest.find('"') {
        out.push_str(&rest[..=p]);
        out.push('"');
        rest = &rest[p + 1..];
    }
    out.push_str(rest);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use crate::{Mode, Rsl};

    fn unparse(text: &str) -> String {
        Rsl::parse(text, Mode::Strict)
            .expect("parses")
            .unparse()
            .expect("unparses")
    }

    #[test]
    fn matches_globus_examples() {
        assert_eq!(
            unparse("&(executable=/bin/date)(count=4)"),
            r#"&("executable" = "/bin/date" )("count" = "4" )"#
        );
        assert_eq!(unparse("x = 1"), r#""x" = "1" "#);
        assert_eq!(unparse("&(x = (1 1) )"), r#"&("x" = ("1" "1" ) )"#);
        assert_eq!(unparse(r#"&(y="a""b")"#), r#"&("y" = "a""b" )"#);
        assert_eq!(unparse("&(x=a$(B)c)"), r#"&("x" = "a" # $("B") # "c" )"#);
        assert_eq!(unparse("&(x=$(A b c))"), r#"&("x" = $("A" "b") )"#);
        assert_eq!(unparse("&(x=$(A (b)))"), r#"&("x" = $("A") )"#);
    }

    #[test]
    fn computed_variable_names_do_not_unparse() {
        for text in ["&(x=$((A) b))", "&(x=$($(N)x))", "&(x=$(A # B))"] {
            let rsl = Rsl::parse(text, Mode::Strict).expect("parses");
            assert!(rsl.unparse().is_err(), "{text}");
        }
    }
}
