//! Submit-time feasibility: could a job ever be placed on these workers if they were empty?

use std::collections::BTreeMap;

use crate::constraint::{canonical, satisfied};
use crate::model::Worker;
use iris_types::{Constraint, Resources};

/// Checks whether a job could ever be placed on an otherwise empty cluster of `workers`,
/// ignoring current usage and health (an unhealthy worker may come back). `Err` carries a
/// human-readable reason for "Job … is unschedulable: …".
///
/// Checks, in order: some worker exists; every hard constraint is met by some worker, and all
/// of them by one worker; each requested dimension fits some constraint-matching worker's
/// total, and all of them fit one worker; for a coscheduled job, `replicas` such workers share
/// one value of `group_by`. Preferred constraints never make a job infeasible.
pub fn feasible_anywhere(
    req: &Resources,
    constraints: &[Constraint],
    group_by: Option<&str>,
    replicas: u32,
    workers: &[Worker],
) -> Result<(), String> {
    if workers.is_empty() {
        return Err("no workers are registered".to_string());
    }
    if group_by.is_some_and(|k| k.trim().is_empty()) {
        return Err("coscheduling group_by must be non-empty".to_string());
    }
    let hard: Vec<&Constraint> = constraints.iter().filter(|c| c.required).collect();
    let matching: Vec<&Worker> = workers
        .iter()
        .filter(|w| hard.iter().all(|c| satisfied(c, &w.attributes)))
        .collect();
    if matching.is_empty() {
        for c in &hard {
            if !workers.iter().any(|w| satisfied(c, &w.attributes)) {
                return Err(format!("no worker satisfies constraint {c}"));
            }
        }
        let all: Vec<String> = hard.iter().map(|c| c.to_string()).collect();
        return Err(format!(
            "no worker satisfies all constraints together: {}",
            all.join(" AND ")
        ));
    }
    let scope = if hard.is_empty() {
        "worker"
    } else {
        "worker matching its constraints"
    };
    for d in req.requested() {
        let largest = matching.iter().map(|w| w.total.get(d)).max().unwrap_or(0);
        if largest < req.get(d) {
            return Err(format!(
                "no {scope} has {} {} (largest: {})",
                d.amount(req.get(d)),
                d.name(),
                d.amount(largest.max(0))
            ));
        }
    }
    let fitting: Vec<&Worker> = matching
        .into_iter()
        .filter(|w| req.fits_in(&w.total))
        .collect();
    if fitting.is_empty() {
        return Err(format!("no single {scope} has {req}"));
    }
    if let Some(key) = group_by {
        let mut groups: BTreeMap<String, u32> = BTreeMap::new();
        for w in &fitting {
            if let Some(v) = w.attributes.get(key) {
                // A pooled worker (Kubernetes) hosts a whole gang by itself.
                let n = if w.pooled { replicas } else { 1 };
                let e = groups.entry(canonical(v)).or_default();
                *e = e.saturating_add(n);
            }
        }
        let largest = groups.values().copied().max().unwrap_or(0);
        if largest < replicas {
            return Err(format!(
                "coscheduled job needs {replicas} workers sharing one value of {key}; largest group has {largest}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{res, worker};

    fn workers() -> Vec<Worker> {
        vec![
            worker("cpu-1").cpu(4000).attr("region", "us-west").build(),
            worker("gpu-1")
                .cpu(64000)
                .gpu(4, "a100")
                .attr("device-variant", "a100")
                .attr("region", "us-east")
                .build(),
            worker("tpu-1")
                .attr("tpu-name", "s1")
                .attr("region", "us-east")
                .build(),
            worker("tpu-2").attr("tpu-name", "s1").build(),
            worker("tpu-3").attr("tpu-name", "s1").unhealthy().build(),
            worker("tpu-4").attr("tpu-name", "s2").build(),
        ]
    }

    #[test]
    fn feasible_job_passes() {
        assert_eq!(
            feasible_anywhere(&res(1000, 1), &[], None, 100, &workers()),
            Ok(())
        );
    }

    #[test]
    fn too_large_names_the_dimension() {
        let mut req = res(1000, 1);
        req.gpu = 8;
        assert_eq!(
            feasible_anywhere(&req, &[], None, 1, &workers()),
            Err("no worker has 8 gpu (largest: 4)".to_string())
        );
        assert_eq!(
            feasible_anywhere(&res(128_000, 1), &[], None, 1, &workers()),
            Err("no worker has 128000m cpu (largest: 64000m)".to_string())
        );
    }

    #[test]
    fn unsatisfiable_constraint_is_named() {
        let c = Constraint::equals("device-variant", "h100");
        assert_eq!(
            feasible_anywhere(&res(1000, 1), &[c], None, 1, &workers()),
            Err("no worker satisfies constraint device-variant EQ h100".to_string())
        );
        // Preferred constraints never make a job infeasible.
        let soft = Constraint::equals("device-variant", "h100").preferred();
        assert_eq!(
            feasible_anywhere(&res(1000, 1), &[soft], None, 1, &workers()),
            Ok(())
        );
    }

    #[test]
    fn constraints_that_conflict_together() {
        let cs = [
            Constraint::equals("region", "us-west"),
            Constraint::new("tpu-name", iris_types::ConstraintOp::Exists, None),
        ];
        assert_eq!(
            feasible_anywhere(&res(1000, 1), &cs, None, 1, &workers()),
            Err("no worker satisfies all constraints together: region EQ us-west AND tpu-name EXISTS"
                .to_string())
        );
    }

    #[test]
    fn resources_must_fit_together() {
        let mut req = res(16000, 1);
        req.gpu = 1;
        let ws = vec![
            worker("big-cpu").cpu(32000).build(),
            worker("gpu").cpu(8000).gpu(1, "t4").build(),
        ];
        assert_eq!(
            feasible_anywhere(&req, &[], None, 1, &ws),
            Err("no single worker has cpu=16000m, memory=1 GiB, gpu=1".to_string())
        );
    }

    #[test]
    fn gang_needs_a_large_enough_group() {
        // s1 has three hosts (one unhealthy still counts: it may come back), s2 one.
        assert_eq!(
            feasible_anywhere(&res(1000, 1), &[], Some("tpu-name"), 3, &workers()),
            Ok(())
        );
        assert_eq!(
            feasible_anywhere(&res(1000, 1), &[], Some("tpu-name"), 4, &workers()),
            Err("coscheduled job needs 4 workers sharing one value of tpu-name; largest group has 3"
                .to_string())
        );
        assert!(feasible_anywhere(&res(1000, 1), &[], Some(" "), 1, &workers()).is_err());
        assert_eq!(
            feasible_anywhere(&res(1000, 1), &[], Some("pool"), 1, &workers()),
            Err(
                "coscheduled job needs 1 workers sharing one value of pool; largest group has 0"
                    .to_string()
            )
        );
    }

    #[test]
    fn no_workers() {
        assert!(feasible_anywhere(&res(1, 1), &[], None, 1, &[]).is_err());
    }
}
