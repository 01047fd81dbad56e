//! Worker attributes and the constraints jobs place on them: [`AttrValue`], [`ConstraintOp`]
//! and [`Constraint`]. How a constraint is evaluated against a worker is the scheduler's
//! (`iris_scheduler::constraint_matches`); how against a peer's advertised values is
//! federation's.

use std::fmt;

/// A worker attribute value or a constraint operand.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// Compared case-insensitively after trimming.
    Str(String),
    /// Integer.
    Int(i64),
    /// Float; compares numerically with `Int`.
    Float(f64),
}

impl From<&str> for AttrValue {
    fn from(s: &str) -> Self {
        AttrValue::Str(s.to_string())
    }
}

impl From<String> for AttrValue {
    fn from(s: String) -> Self {
        AttrValue::Str(s)
    }
}

impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        AttrValue::Int(v)
    }
}

impl From<f64> for AttrValue {
    fn from(v: f64) -> Self {
        AttrValue::Float(v)
    }
}

/// Strings trimmed (case kept); numbers as Rust prints them.
impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrValue::Str(s) => f.write_str(s.trim()),
            AttrValue::Int(v) => write!(f, "{v}"),
            AttrValue::Float(v) => write!(f, "{v}"),
        }
    }
}

/// Constraint operator (Iris codes EQ=0 … IN=8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConstraintOp {
    /// Attribute equals `value`.
    Eq,
    /// Attribute present and not equal to `value`.
    Ne,
    /// Attribute present.
    Exists,
    /// Attribute absent.
    NotExists,
    /// Attribute `>` `value` (numeric only).
    Gt,
    /// Attribute `>=` `value` (numeric only).
    Ge,
    /// Attribute `<` `value` (numeric only).
    Lt,
    /// Attribute `<=` `value` (numeric only).
    Le,
    /// Attribute equals one of `values`.
    In,
}

impl ConstraintOp {
    /// Upper-case name as in Iris (`EQ`, `NOT_EXISTS`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ConstraintOp::Eq => "EQ",
            ConstraintOp::Ne => "NE",
            ConstraintOp::Exists => "EXISTS",
            ConstraintOp::NotExists => "NOT_EXISTS",
            ConstraintOp::Gt => "GT",
            ConstraintOp::Ge => "GE",
            ConstraintOp::Lt => "LT",
            ConstraintOp::Le => "LE",
            ConstraintOp::In => "IN",
        }
    }

    /// True for GT, GE, LT, LE.
    pub fn is_ordering(self) -> bool {
        matches!(
            self,
            ConstraintOp::Gt | ConstraintOp::Ge | ConstraintOp::Lt | ConstraintOp::Le
        )
    }
}

impl fmt::Display for ConstraintOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One constraint on worker attributes. `required` constraints filter workers;
/// the others (PREFERRED) rank them.
#[derive(Clone, Debug, PartialEq)]
pub struct Constraint {
    /// Attribute key, matched exactly (e.g. `region`, `tpu-name`).
    pub key: String,
    /// Operator.
    pub op: ConstraintOp,
    /// Operand for EQ, NE, GT, GE, LT, LE.
    pub value: Option<AttrValue>,
    /// Operands for IN.
    pub values: Vec<AttrValue>,
    /// REQUIRED (hard) when true, PREFERRED (soft) when false.
    pub required: bool,
}

impl Constraint {
    /// A required constraint with one (optional) operand.
    pub fn new(key: impl Into<String>, op: ConstraintOp, value: Option<AttrValue>) -> Constraint {
        Constraint {
            key: key.into(),
            op,
            value,
            values: Vec::new(),
            required: true,
        }
    }

    /// A required `key EQ value` constraint.
    pub fn equals(key: impl Into<String>, value: impl Into<AttrValue>) -> Constraint {
        Constraint::new(key, ConstraintOp::Eq, Some(value.into()))
    }

    /// A required `key IN [values]` constraint.
    pub fn one_of(key: impl Into<String>, values: Vec<AttrValue>) -> Constraint {
        Constraint {
            values,
            ..Constraint::new(key, ConstraintOp::In, None)
        }
    }

    /// The same constraint in PREFERRED mode.
    pub fn preferred(self) -> Constraint {
        Constraint {
            required: false,
            ..self
        }
    }
}

/// `region EQ us-west`, `zone IN [a, b]`, `gpu EXISTS`.
impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.key, self.op)?;
        match self.op {
            ConstraintOp::Exists | ConstraintOp::NotExists => Ok(()),
            ConstraintOp::In => {
                f.write_str(" [")?;
                for (i, v) in self.values.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            _ => match &self.value {
                Some(v) => write!(f, " {v}"),
                None => f.write_str(" <missing>"),
            },
        }
    }
}

/// The attribute-key prefix of a zone availability marker (`availability:h100`): a hard
/// `availability:<variant> EXISTS` constraint means "only where this accelerator can be found".
pub const AVAILABILITY_PREFIX: &str = "availability:";

/// The availability marker key for a device variant (`H100` → `availability:h100`).
pub fn availability_key(variant: &str) -> String {
    format!("{AVAILABILITY_PREFIX}{}", variant.trim().to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_reads_well() {
        assert_eq!(
            Constraint::equals("region", " us-west ").to_string(),
            "region EQ us-west"
        );
        assert_eq!(
            Constraint::one_of("zone", vec!["a".into(), 2.into()]).to_string(),
            "zone IN [a, 2]"
        );
        assert_eq!(
            Constraint::new("gpu", ConstraintOp::NotExists, None).to_string(),
            "gpu NOT_EXISTS"
        );
        assert_eq!(
            Constraint::new("n", ConstraintOp::Ge, None).to_string(),
            "n GE <missing>"
        );
        assert!(!Constraint::equals("a", 1.5).preferred().required);
    }
}
