//! Constraint evaluation against worker attributes (Iris `cluster/constraints.py` semantics).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use iris_types::{AttrValue, Constraint, ConstraintOp};

/// A constraint that cannot be evaluated. `schedule` treats it as "does not match".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// GT/GE/LT/LE with a string operand or a string attribute.
    #[error("constraint {key} {op}: ordering operators do not apply to strings")]
    OrderingOnString {
        /// Attribute key.
        key: String,
        /// Operator used.
        op: ConstraintOp,
    },
    /// EQ/NE/GT/GE/LT/LE without a value.
    #[error("constraint {key} {op} has no value")]
    MissingValue {
        /// Attribute key.
        key: String,
        /// Operator used.
        op: ConstraintOp,
    },
}

/// Evaluates one constraint against a worker's attributes.
///
/// * String values are compared trimmed and lower-cased on both sides.
/// * `Int` and `Float` compare numerically with each other; a string never equals a number.
/// * A missing attribute fails every operator except `NOT_EXISTS` (including `NE`).
/// * Ordering operators on strings are an error, as is a missing operand.
///   The operand is validated before the attribute is looked up, so a malformed
///   constraint is an error on every worker.
/// * `IN` with an empty list matches nothing.
///
/// ```
/// use std::collections::BTreeMap;
/// use iris_scheduler::constraint_matches;
/// use iris_types::{AttrValue, Constraint};
/// let mut attrs = BTreeMap::new();
/// attrs.insert("region".to_string(), AttrValue::from(" US-West "));
/// assert_eq!(constraint_matches(&Constraint::equals("region", "us-west"), &attrs), Ok(true));
/// ```
pub fn constraint_matches(
    c: &Constraint,
    attrs: &BTreeMap<String, AttrValue>,
) -> Result<bool, ConstraintError> {
    let operand = match c.op {
        ConstraintOp::Exists | ConstraintOp::NotExists | ConstraintOp::In => None,
        _ => match &c.value {
            Some(v) => Some(v),
            None => {
                return Err(ConstraintError::MissingValue {
                    key: c.key.clone(),
                    op: c.op,
                })
            }
        },
    };
    let ordering_on_string = || ConstraintError::OrderingOnString {
        key: c.key.clone(),
        op: c.op,
    };
    if c.op.is_ordering() && matches!(operand, Some(AttrValue::Str(_))) {
        return Err(ordering_on_string());
    }
    let Some(attr) = attrs.get(&c.key) else {
        return Ok(c.op == ConstraintOp::NotExists);
    };
    Ok(match (c.op, operand) {
        (ConstraintOp::Exists, _) => true,
        (ConstraintOp::NotExists, _) => false,
        (ConstraintOp::In, _) => c.values.iter().any(|v| values_equal(attr, v)),
        (ConstraintOp::Eq, Some(v)) => values_equal(attr, v),
        (ConstraintOp::Ne, Some(v)) => !values_equal(attr, v),
        (op, Some(v)) => {
            if matches!(attr, AttrValue::Str(_)) {
                return Err(ordering_on_string());
            }
            match numeric_cmp(attr, v) {
                None => false, // NaN
                Some(ord) => match op {
                    ConstraintOp::Gt => ord == Ordering::Greater,
                    ConstraintOp::Ge => ord != Ordering::Less,
                    ConstraintOp::Lt => ord == Ordering::Less,
                    ConstraintOp::Le => ord != Ordering::Greater,
                    _ => false,
                },
            }
        }
        // Operand presence was checked above for every operator that needs one.
        (_, None) => false,
    })
}

/// `constraint_matches` with errors counted as "no match" (how `schedule` uses constraints).
pub(crate) fn satisfied(c: &Constraint, attrs: &BTreeMap<String, AttrValue>) -> bool {
    constraint_matches(c, attrs).unwrap_or(false)
}

/// Trimmed, case-insensitive string equality without allocating.
pub(crate) fn str_eq_normalized(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim(), b.trim());
    if a.is_ascii() && b.is_ascii() {
        return a.eq_ignore_ascii_case(b);
    }
    a.chars()
        .flat_map(char::to_lowercase)
        .eq(b.chars().flat_map(char::to_lowercase))
}

/// Canonical text of a value, used to group workers (`tpu-name`) and to compare variants.
pub(crate) fn canonical(v: &AttrValue) -> String {
    match v {
        AttrValue::Str(s) => normalize(s),
        AttrValue::Int(i) => i.to_string(),
        AttrValue::Float(f) => f.to_string(),
    }
}

/// Trimmed and lower-cased.
pub(crate) fn normalize(s: &str) -> String {
    s.trim().to_lowercase()
}

fn values_equal(a: &AttrValue, b: &AttrValue) -> bool {
    match (a, b) {
        (AttrValue::Str(x), AttrValue::Str(y)) => str_eq_normalized(x, y),
        (AttrValue::Str(_), _) | (_, AttrValue::Str(_)) => false,
        _ => numeric_cmp(a, b) == Some(Ordering::Equal),
    }
}

/// Numeric comparison; `None` for strings and NaN.
fn numeric_cmp(a: &AttrValue, b: &AttrValue) -> Option<Ordering> {
    match (a, b) {
        (AttrValue::Int(x), AttrValue::Int(y)) => Some(x.cmp(y)),
        (AttrValue::Int(x), AttrValue::Float(y)) => (*x as f64).partial_cmp(y),
        (AttrValue::Float(x), AttrValue::Int(y)) => x.partial_cmp(&(*y as f64)),
        (AttrValue::Float(x), AttrValue::Float(y)) => x.partial_cmp(y),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConstraintOp::*;

    fn attrs(pairs: &[(&str, AttrValue)]) -> BTreeMap<String, AttrValue> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn c(key: &str, op: ConstraintOp, v: Option<AttrValue>) -> Constraint {
        Constraint::new(key, op, v)
    }

    fn s(v: &str) -> Option<AttrValue> {
        Some(AttrValue::from(v))
    }

    #[test]
    fn eq_is_trimmed_and_case_insensitive() {
        let a = attrs(&[("region", " US-West ".into())]);
        assert_eq!(
            constraint_matches(&c("region", Eq, s("us-west ")), &a),
            Ok(true)
        );
        assert_eq!(
            constraint_matches(&c("region", Eq, s("us-east")), &a),
            Ok(false)
        );
        assert_eq!(
            constraint_matches(&c("region", Ne, s("US-EAST")), &a),
            Ok(true)
        );
        assert_eq!(
            constraint_matches(&c("region", Ne, s("us-west")), &a),
            Ok(false)
        );
    }

    #[test]
    fn missing_attribute_fails_everything_but_not_exists() {
        let a = attrs(&[]);
        for op in [Eq, Ne, Gt, Ge, Lt, Le] {
            assert_eq!(
                constraint_matches(&c("x", op, Some(1.into())), &a),
                Ok(false),
                "{op}"
            );
        }
        assert_eq!(constraint_matches(&c("x", Exists, None), &a), Ok(false));
        assert_eq!(
            constraint_matches(&Constraint::one_of("x", vec![1.into()]), &a),
            Ok(false)
        );
        assert_eq!(constraint_matches(&c("x", NotExists, None), &a), Ok(true));
    }

    #[test]
    fn exists_and_not_exists() {
        let a = attrs(&[("gpu", AttrValue::Int(0))]);
        assert_eq!(constraint_matches(&c("gpu", Exists, None), &a), Ok(true));
        assert_eq!(
            constraint_matches(&c("gpu", NotExists, None), &a),
            Ok(false)
        );
    }

    #[test]
    fn numeric_comparisons_mix_int_and_float() {
        let a = attrs(&[("n", AttrValue::Int(4)), ("f", AttrValue::Float(2.5))]);
        let t = |key: &str, op, v: AttrValue| constraint_matches(&c(key, op, Some(v)), &a);
        assert_eq!(t("n", Gt, 3.5.into()), Ok(true));
        assert_eq!(t("n", Ge, 4.into()), Ok(true));
        assert_eq!(t("n", Gt, 4.into()), Ok(false));
        assert_eq!(t("n", Lt, 5.into()), Ok(true));
        assert_eq!(t("n", Le, 4.0.into()), Ok(true));
        assert_eq!(t("n", Eq, 4.0.into()), Ok(true));
        assert_eq!(t("f", Lt, 3.into()), Ok(true));
        assert_eq!(t("f", Ge, 2.5.into()), Ok(true));
        assert_eq!(t("f", Gt, f64::NAN.into()), Ok(false));
    }

    #[test]
    fn ordering_on_strings_is_an_error() {
        let a = attrs(&[("zone", "a".into()), ("n", 3.into())]);
        assert!(matches!(
            constraint_matches(&c("zone", Gt, Some(1.into())), &a),
            Err(ConstraintError::OrderingOnString { .. })
        ));
        assert!(matches!(
            constraint_matches(&c("n", Lt, s("5")), &a),
            Err(ConstraintError::OrderingOnString { .. })
        ));
        // Even when the attribute is missing, a string operand is malformed.
        assert!(constraint_matches(&c("missing", Ge, s("x")), &a).is_err());
        assert!(!satisfied(&c("zone", Gt, Some(1.into())), &a));
    }

    #[test]
    fn missing_value_is_an_error() {
        let a = attrs(&[("zone", "a".into())]);
        assert!(matches!(
            constraint_matches(&c("zone", Eq, None), &a),
            Err(ConstraintError::MissingValue { .. })
        ));
    }

    #[test]
    fn unicode_strings_compare_case_insensitively() {
        let a = attrs(&[("zone", " ÉTÉ ".into())]);
        assert_eq!(constraint_matches(&c("zone", Eq, s("été")), &a), Ok(true));
        assert_eq!(constraint_matches(&c("zone", Eq, s("ete")), &a), Ok(false));
    }

    #[test]
    fn strings_never_equal_numbers() {
        let a = attrs(&[("count", "4".into())]);
        assert_eq!(
            constraint_matches(&c("count", Eq, Some(4.into())), &a),
            Ok(false)
        );
        assert_eq!(
            constraint_matches(&c("count", Ne, Some(4.into())), &a),
            Ok(true)
        );
    }

    #[test]
    fn in_matches_any_value() {
        let a = attrs(&[("device-variant", "V5e".into())]);
        let yes = Constraint::one_of("device-variant", vec!["v4".into(), " v5E".into()]);
        let no = Constraint::one_of("device-variant", vec!["v4".into()]);
        let empty = Constraint::one_of("device-variant", vec![]);
        assert_eq!(constraint_matches(&yes, &a), Ok(true));
        assert_eq!(constraint_matches(&no, &a), Ok(false));
        assert_eq!(constraint_matches(&empty, &a), Ok(false));
    }

    #[test]
    fn display_reads_well() {
        assert_eq!(
            Constraint::equals("region", "us-west").to_string(),
            "region EQ us-west"
        );
        assert_eq!(
            Constraint::one_of("zone", vec!["a".into(), "b".into()]).to_string(),
            "zone IN [a, b]"
        );
        assert_eq!(c("gpu", Exists, None).to_string(), "gpu EXISTS");
        assert_eq!(
            ConstraintError::OrderingOnString {
                key: "zone".into(),
                op: Gt
            }
            .to_string(),
            "constraint zone GT: ordering operators do not apply to strings"
        );
    }
}
