//! Routing constraints and matching them against what a peer's backends advertise (§1.2).

use std::cmp::Ordering;

use iris_types::{AttrValue, Constraint, ConstraintOp};

use crate::{Advertised, CLUSTER_KEY};

/// Registry keys whose constraints steer a job to a peer. Everything else a job may say
/// (`tpu-name`, `gpu-count`, `pool`, ...) is for the peer's own scheduler to judge.
const ROUTING_KEYS: [&str; 5] = [
    "device-type",
    "device-variant",
    "preemptible",
    "region",
    "zone",
];

/// Prefix of the zone-capability markers that `--reserve` adds (`availability:h100`).
pub(crate) const MARKER_PREFIX: &str = iris_types::AVAILABILITY_PREFIX;

/// The peer a job is pinned to: the value of the first `cluster EQ <x>` constraint, trimmed.
///
/// Peer ids are compared exactly, so the value is not lower-cased. A first pin whose value is
/// empty (or missing) means "not pinned"; later `cluster` constraints are not consulted.
pub fn cluster_pin(cs: &[Constraint]) -> Option<String> {
    let c = cs
        .iter()
        .find(|c| c.key == CLUSTER_KEY && c.op == ConstraintOp::Eq)?;
    let pin = c.value.as_ref()?.to_string();
    let pin = pin.trim();
    (!pin.is_empty()).then(|| pin.to_string())
}

/// The required constraints that decide which peer may host a job.
///
/// Kept: `device-type`, `device-variant`, `preemptible`, `region`, `zone` and any
/// `availability:<variant>` marker. Dropped: `device-type EQ cpu` (every peer runs CPU work),
/// `cluster` (the pin is handled separately), preferred constraints, and every other key.
pub fn routing_constraints(cs: &[Constraint]) -> Vec<Constraint> {
    cs.iter()
        .filter(|c| c.required && is_routing_key(&c.key) && !is_cpu_device(c))
        .cloned()
        .collect()
}

fn is_routing_key(key: &str) -> bool {
    ROUTING_KEYS.contains(&key) || key.starts_with(MARKER_PREFIX)
}

fn is_cpu_device(c: &Constraint) -> bool {
    c.key == "device-type"
        && c.op == ConstraintOp::Eq
        && matches!(&c.value, Some(AttrValue::Str(v)) if str_eq(v, "cpu"))
}

/// Whether one backend satisfies one constraint.
///
/// * `EXISTS` / `NOT_EXISTS`: the backend advertises at least one / no value for the key.
/// * Every other operator holds when **any** advertised value satisfies it, so a backend
///   advertising `[h100, a100]` satisfies `device-variant NE h100`; with no advertised value
///   it fails (`NE` included).
/// * Strings compare trimmed and case-insensitively. A numeric operand equals an advertised
///   value that parses to the same number.
/// * `GT`/`GE`/`LT`/`LE` compare numerically when both sides are numbers and are unsatisfied
///   otherwise. (The reference raises here; a malformed constraint should not take down a
///   routing decision.)
/// * A missing operand never matches.
pub fn backend_satisfies(adv: &Advertised, c: &Constraint) -> bool {
    let values = adv.get(&c.key).map(Vec::as_slice).unwrap_or_default();
    match c.op {
        ConstraintOp::Exists => !values.is_empty(),
        ConstraintOp::NotExists => values.is_empty(),
        ConstraintOp::In => values
            .iter()
            .any(|v| c.values.iter().any(|want| value_eq(v, want))),
        op => {
            let Some(want) = &c.value else {
                return false;
            };
            values.iter().any(|v| match op {
                ConstraintOp::Eq => value_eq(v, want),
                ConstraintOp::Ne => !value_eq(v, want),
                _ => ordered(op, v, want),
            })
        }
    }
}

/// Whether this single backend satisfies every constraint in `cs` (vacuously true for none).
pub fn backend_satisfies_all(adv: &Advertised, cs: &[Constraint]) -> bool {
    cs.iter().all(|c| backend_satisfies(adv, c))
}

/// Trimmed, case-insensitive string equality.
pub(crate) fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim(), b.trim());
    a.eq_ignore_ascii_case(b) || a.to_lowercase() == b.to_lowercase()
}

/// Trimmed and lower-cased.
pub(crate) fn normalize(s: &str) -> String {
    s.trim().to_lowercase()
}

fn value_eq(advertised: &str, want: &AttrValue) -> bool {
    match want {
        AttrValue::Str(s) => str_eq(advertised, s),
        number => num_cmp(Number::parse(advertised), Number::of(number)) == Some(Ordering::Equal),
    }
}

fn ordered(op: ConstraintOp, advertised: &str, want: &AttrValue) -> bool {
    let Some(ord) = num_cmp(Number::parse(advertised), Number::of(want)) else {
        return false;
    };
    match op {
        ConstraintOp::Gt => ord == Ordering::Greater,
        ConstraintOp::Ge => ord != Ordering::Less,
        ConstraintOp::Lt => ord == Ordering::Less,
        ConstraintOp::Le => ord != Ordering::Greater,
        ConstraintOp::Eq
        | ConstraintOp::Ne
        | ConstraintOp::Exists
        | ConstraintOp::NotExists
        | ConstraintOp::In => false,
    }
}

#[derive(Clone, Copy)]
enum Number {
    Int(i64),
    Float(f64),
}

impl Number {
    fn parse(s: &str) -> Option<Number> {
        let s = s.trim();
        s.parse()
            .map(Number::Int)
            .or_else(|_| s.parse().map(Number::Float))
            .ok()
    }

    fn of(v: &AttrValue) -> Option<Number> {
        match v {
            AttrValue::Str(s) => Number::parse(s),
            AttrValue::Int(i) => Some(Number::Int(*i)),
            AttrValue::Float(f) => Some(Number::Float(*f)),
        }
    }
}

/// Numeric comparison; `None` when either side is not a number, or for NaN.
fn num_cmp(a: Option<Number>, b: Option<Number>) -> Option<Ordering> {
    match (a?, b?) {
        (Number::Int(x), Number::Int(y)) => Some(x.cmp(&y)),
        (Number::Int(x), Number::Float(y)) => (x as f64).partial_cmp(&y),
        (Number::Float(x), Number::Int(y)) => x.partial_cmp(&(y as f64)),
        (Number::Float(x), Number::Float(y)) => x.partial_cmp(&y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::adv;
    use ConstraintOp::*;

    fn c(key: &str, op: ConstraintOp, value: impl Into<AttrValue>) -> Constraint {
        Constraint::new(key, op, Some(value.into()))
    }

    fn bare(key: &str, op: ConstraintOp) -> Constraint {
        Constraint::new(key, op, None)
    }

    #[test]
    fn cluster_pin_is_the_first_cluster_eq() {
        let cs = [
            c("cluster", Ne, "x"),
            c("region", Eq, "us"),
            c("cluster", Eq, "  Peer-A "),
            c("cluster", Eq, "peer-b"),
        ];
        assert_eq!(cluster_pin(&cs).as_deref(), Some("Peer-A"));
        assert_eq!(cluster_pin(&[c("region", Eq, "us")]), None);
        assert_eq!(cluster_pin(&[]), None);
    }

    #[test]
    fn empty_or_missing_pin_is_no_pin() {
        assert_eq!(cluster_pin(&[c("cluster", Eq, "  ")]), None);
        assert_eq!(cluster_pin(&[bare("cluster", Eq)]), None);
        // Only the first pin counts.
        assert_eq!(
            cluster_pin(&[c("cluster", Eq, ""), c("cluster", Eq, "b")]),
            None
        );
    }

    #[test]
    fn routing_constraints_keep_only_routing_keys() {
        let cs = vec![
            c("device-type", Eq, "gpu"),
            c("device-variant", In, "h100"),
            c("preemptible", Eq, "false"),
            bare("region", Exists),
            c("zone", Eq, "z1"),
            c("availability:h100", Eq, "true"),
            c("cluster", Eq, "peer"),
            c("pool", Eq, "a"),
            c("tpu-name", Eq, "t"),
            c("gpu-count", Ge, 8i64),
            c("gpu-variant", Eq, "h100"),
        ];
        let kept = routing_constraints(&cs);
        let keys: Vec<&str> = kept.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "device-type",
                "device-variant",
                "preemptible",
                "region",
                "zone",
                "availability:h100"
            ]
        );
    }

    #[test]
    fn routing_constraints_drop_cpu_and_soft() {
        let cs = vec![
            c("device-type", Eq, " CPU "),
            c("region", Eq, "us").preferred(),
            c("device-type", Ne, "cpu"),
        ];
        assert_eq!(routing_constraints(&cs), vec![c("device-type", Ne, "cpu")]);
    }

    #[test]
    fn eq_and_in_are_case_insensitive_and_trimmed() {
        let a = adv(&[("device-variant", &["h100"]), ("region", &["us-east"])]);
        assert!(backend_satisfies(&a, &c("device-variant", Eq, " H100 ")));
        assert!(!backend_satisfies(&a, &c("device-variant", Eq, "a100")));
        let any = Constraint::one_of("region", vec!["eu".into(), "US-EAST".into()]);
        assert!(backend_satisfies(&a, &any));
        assert!(!backend_satisfies(
            &a,
            &Constraint::one_of("region", vec![])
        ));
    }

    #[test]
    fn ne_holds_when_any_value_differs() {
        let a = adv(&[("device-variant", &["h100", "a100"])]);
        assert!(backend_satisfies(&a, &c("device-variant", Ne, "h100")));
        let single = adv(&[("device-variant", &["h100"])]);
        assert!(!backend_satisfies(
            &single,
            &c("device-variant", Ne, "H100")
        ));
        // Absent attribute fails NE.
        assert!(!backend_satisfies(&single, &c("zone", Ne, "z1")));
    }

    #[test]
    fn exists_and_not_exists_look_at_the_list() {
        let a = adv(&[("region", &["us"]), ("zone", &[])]);
        assert!(backend_satisfies(&a, &bare("region", Exists)));
        assert!(!backend_satisfies(&a, &bare("zone", Exists)));
        assert!(!backend_satisfies(&a, &bare("pool", Exists)));
        assert!(backend_satisfies(&a, &bare("zone", NotExists)));
        assert!(backend_satisfies(&a, &bare("pool", NotExists)));
        assert!(!backend_satisfies(&a, &bare("region", NotExists)));
    }

    #[test]
    fn ordered_ops_compare_numbers_and_never_panic() {
        let a = adv(&[("tpu-vm-count", &["4"]), ("region", &["us"])]);
        assert!(backend_satisfies(&a, &c("tpu-vm-count", Ge, 4i64)));
        assert!(backend_satisfies(&a, &c("tpu-vm-count", Gt, 3.5)));
        assert!(backend_satisfies(&a, &c("tpu-vm-count", Lt, "5")));
        assert!(!backend_satisfies(&a, &c("tpu-vm-count", Le, 3i64)));
        // Strings on either side: unsatisfied, not an error.
        assert!(!backend_satisfies(&a, &c("tpu-vm-count", Gt, "many")));
        assert!(!backend_satisfies(&a, &c("region", Gt, 1i64)));
        assert!(!backend_satisfies(&a, &c("region", Le, "zz")));
        assert!(!backend_satisfies(&a, &c("tpu-vm-count", Ge, f64::NAN)));
    }

    #[test]
    fn numeric_operands_equal_parsed_values() {
        let a = adv(&[("tpu-vm-count", &["4"])]);
        assert!(backend_satisfies(&a, &c("tpu-vm-count", Eq, 4i64)));
        assert!(backend_satisfies(&a, &c("tpu-vm-count", Eq, 4.0)));
        assert!(!backend_satisfies(&a, &c("tpu-vm-count", Ne, 4i64)));
    }

    #[test]
    fn missing_operand_never_matches() {
        let a = adv(&[("region", &["us"])]);
        for op in [Eq, Ne, Gt, Ge, Lt, Le] {
            assert!(!backend_satisfies(&a, &bare("region", op)), "{op}");
        }
    }

    #[test]
    fn satisfies_all_needs_every_constraint() {
        let a = adv(&[("device-variant", &["h100"]), ("region", &["us"])]);
        assert!(backend_satisfies_all(&a, &[]));
        assert!(backend_satisfies_all(
            &a,
            &[c("device-variant", Eq, "h100"), c("region", Eq, "us")]
        ));
        assert!(!backend_satisfies_all(
            &a,
            &[c("device-variant", Eq, "h100"), c("region", Eq, "eu")]
        ));
    }
}
