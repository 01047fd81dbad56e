//! PodDisruptionBudget arithmetic (the disruption controller's status and the eviction check).

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::cluster::Cluster;
use crate::pod;
use crate::resources::id;
use crate::selector::LabelSelector;
use crate::store::{meta_str, name_of};

/// A budget evaluated against the pods it selects now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Budget {
    pub name: String,
    pub expected: i64,
    pub current_healthy: i64,
    pub desired_healthy: i64,
    pub disruptions_allowed: i64,
}

/// Running with `Ready=True` and not terminating.
pub(crate) fn is_healthy(p: &Value) -> bool {
    pod::phase(p) == "Running" && pod::condition_true(p, "Ready") && !pod::is_deleting(p)
}

fn int_or_percent(v: &Value, total: i64, round_up: bool) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            if let Some(pct) = s.strip_suffix('%') {
                let pct: f64 = pct.trim().parse().ok()?;
                let x = pct * total as f64 / 100.0;
                Some(if round_up {
                    x.ceil() as i64
                } else {
                    x.floor() as i64
                })
            } else {
                s.trim().parse().ok()
            }
        }
        _ => None,
    }
}

/// Pods that count for budgets (not terminal, not terminating), by namespace and by label.
struct PodIndex<'a> {
    by_ns: HashMap<&'a str, Vec<&'a Value>>,
    by_label: HashMap<(&'a str, &'a str, &'a str), Vec<&'a Value>>,
}

impl<'a> PodIndex<'a> {
    fn build(cl: &'a Cluster) -> Self {
        let mut idx = PodIndex {
            by_ns: HashMap::new(),
            by_label: HashMap::new(),
        };
        for p in cl
            .store
            .list(id::PODS, None)
            .filter(|p| !pod::is_terminal(p) && !pod::is_deleting(p))
        {
            let ns = meta_str(p, "namespace");
            idx.by_ns.entry(ns).or_default().push(p);
            if let Some(labels) = p.pointer("/metadata/labels").and_then(Value::as_object) {
                for (k, v) in labels {
                    if let Some(v) = v.as_str() {
                        idx.by_label.entry((ns, k.as_str(), v)).or_default().push(p);
                    }
                }
            }
        }
        idx
    }

    /// The counted pods `pdb` selects (an empty or missing selector selects none).
    fn selected(&self, pdb: &Value) -> Vec<&'a Value> {
        let ns = meta_str(pdb, "namespace");
        let Some(sel) = pdb
            .pointer("/spec/selector")
            .and_then(LabelSelector::from_object)
        else {
            return Vec::new();
        };
        if sel.is_empty() {
            return Vec::new();
        }
        let candidates = match sel.first_eq() {
            Some((k, v)) => self.by_label.get(&(ns, k, v)),
            None => self.by_ns.get(ns),
        };
        candidates
            .into_iter()
            .flatten()
            .copied()
            .filter(|p| sel.matches_object(p))
            .collect()
    }
}

fn evaluate_with(index: &PodIndex<'_>, pdb: &Value) -> Budget {
    let pods = index.selected(pdb);
    let expected = pods.len() as i64;
    let current_healthy = pods.iter().filter(|p| is_healthy(p)).count() as i64;
    let spec = pdb.get("spec").cloned().unwrap_or_default();
    let desired_healthy = if let Some(min) = spec.get("minAvailable") {
        int_or_percent(min, expected, true).unwrap_or(0)
    } else if let Some(max) = spec.get("maxUnavailable") {
        (expected - int_or_percent(max, expected, true).unwrap_or(0)).max(0)
    } else {
        0
    };
    Budget {
        name: name_of(pdb).to_string(),
        expected,
        current_healthy,
        desired_healthy,
        disruptions_allowed: (current_healthy - desired_healthy).max(0),
    }
}

/// The budgets selecting `p`, evaluated now.
pub(crate) fn covering(cl: &Cluster, p: &Value) -> Vec<Budget> {
    let index = PodIndex::build(cl);
    let ns = meta_str(p, "namespace");
    cl.store
        .list(id::PDBS, Some(ns))
        .filter(|b| {
            LabelSelector::from_object(b.pointer("/spec/selector").unwrap_or(&Value::Null))
                .is_some_and(|sel| !sel.is_empty() && sel.matches_object(p))
        })
        .map(|b| evaluate_with(&index, b))
        .collect()
}

fn status_is_current(b: &Value, e: &Budget) -> bool {
    let field = |f: &str| b.pointer(&format!("/status/{f}")).and_then(Value::as_i64);
    field("expectedPods") == Some(e.expected)
        && field("currentHealthy") == Some(e.current_healthy)
        && field("desiredHealthy") == Some(e.desired_healthy)
        && field("disruptionsAllowed") == Some(e.disruptions_allowed)
        && b.pointer("/status/observedGeneration") == b.pointer("/metadata/generation")
        && pod::condition(b, "DisruptionAllowed").is_some()
}

/// The disruption controller: keeps every budget's status current.
pub(crate) fn tick(cl: &mut Cluster) {
    let evaluated: Vec<(Value, Budget)> = {
        let index = PodIndex::build(cl);
        cl.store
            .list(id::PDBS, None)
            .filter_map(|b| {
                let e = evaluate_with(&index, b);
                (!status_is_current(b, &e)).then(|| (b.clone(), e))
            })
            .collect()
    };
    for (b, e) in evaluated {
        let mut next = b.clone();
        {
            let st = pod::status_mut(&mut next);
            st.insert(
                "observedGeneration".into(),
                b.pointer("/metadata/generation")
                    .cloned()
                    .unwrap_or(json!(1)),
            );
            st.insert("expectedPods".into(), json!(e.expected));
            st.insert("currentHealthy".into(), json!(e.current_healthy));
            st.insert("desiredHealthy".into(), json!(e.desired_healthy));
            st.insert("disruptionsAllowed".into(), json!(e.disruptions_allowed));
        }
        let (status, reason) = if e.disruptions_allowed > 0 {
            ("True", "SufficientPods")
        } else {
            ("False", "InsufficientPods")
        };
        pod::ensure_condition(&mut next, "DisruptionAllowed", status, reason, "", false);
        if next != b {
            cl.store.update(id::PDBS, next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages() {
        assert_eq!(int_or_percent(&json!("50%"), 3, true), Some(2));
        assert_eq!(int_or_percent(&json!(1), 3, true), Some(1));
        assert_eq!(int_or_percent(&json!("2"), 3, true), Some(2));
    }
}
