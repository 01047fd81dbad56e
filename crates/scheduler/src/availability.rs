//! Zone availability markers (reference: the scheduler's availability enrichment): a job that
//! says `--reserve H100x8` carries a hard `availability:h100 EXISTS` constraint, "schedule me
//! only where this accelerator can be found". A worker satisfies it when its region has a
//! healthy worker of that variant, whatever the worker itself carries.
//!
//! Regions are the workers' `region` attribute, else their `zone`. The reference leaves workers
//! with neither unmarked, so on a cluster whose workers name no region a reserving job waits
//! forever; here such workers form one anonymous region (the cluster itself), which is what
//! "where the accelerator can be found" means on a single-site cluster.

use crate::Worker;
use iris_types::{availability_key, AttrValue};
use std::collections::{BTreeMap, BTreeSet};

fn region_of(w: &Worker) -> String {
    let attr = |k: &str| match w.attributes.get(k) {
        Some(AttrValue::Str(s)) if !s.trim().is_empty() => Some(s.trim().to_lowercase()),
        Some(AttrValue::Int(i)) => Some(i.to_string()),
        _ => None,
    };
    attr("region").or_else(|| attr("zone")).unwrap_or_default()
}

/// Adds `availability:<variant> = "true"` to every worker of each region for each variant a
/// healthy worker of that region has. Markers a worker already advertises are kept.
pub fn enrich_with_availability(workers: &mut [Worker]) {
    let mut by_region: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for w in workers.iter() {
        let v = w.device_variant.trim();
        if w.healthy && !v.is_empty() && !v.eq_ignore_ascii_case("cpu") {
            by_region
                .entry(region_of(w))
                .or_default()
                .insert(availability_key(v));
        }
    }
    if by_region.is_empty() {
        return;
    }
    for w in workers.iter_mut() {
        if let Some(keys) = by_region.get(&region_of(w)) {
            for k in keys {
                w.attributes
                    .entry(k.clone())
                    .or_insert_with(|| AttrValue::Str("true".into()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_types::Resources;

    fn worker(id: &str, variant: &str, region: Option<&str>, healthy: bool) -> Worker {
        let mut w = Worker::new(id, Resources::default());
        w.device_variant = variant.into();
        w.healthy = healthy;
        if let Some(r) = region {
            w.attributes
                .insert("region".into(), AttrValue::Str(r.into()));
        }
        w
    }

    #[test]
    fn a_region_with_a_healthy_gpu_worker_marks_all_its_workers() {
        let mut ws = vec![
            worker("cpu-west", "", Some("us-west"), true),
            worker("gpu-west", "H100", Some("us-west"), true),
            worker("cpu-east", "", Some("us-east"), true),
            worker("gpu-east-down", "A100", Some("us-east"), false),
        ];
        enrich_with_availability(&mut ws);
        let has = |i: usize, k: &str| ws[i].attributes.contains_key(k);
        assert!(has(0, "availability:h100"), "a CPU worker in the region");
        assert!(has(1, "availability:h100"));
        assert!(!has(2, "availability:h100"), "another region");
        assert!(
            !has(2, "availability:a100") && !has(3, "availability:a100"),
            "an unhealthy worker confirms nothing"
        );
    }

    #[test]
    fn workers_without_a_region_share_one() {
        let mut ws = vec![worker("a", "", None, true), worker("b", "h100", None, true)];
        enrich_with_availability(&mut ws);
        assert!(ws[0].attributes.contains_key("availability:h100"));
        assert_eq!(iris_types::availability_key(" H100 "), "availability:h100");
    }
}
