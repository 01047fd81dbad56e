//! Pod PriorityClasses, Kueue WorkloadPriorityClasses and the LocalQueue (reference §3.4–3.5).
//!
//! Two separate priority domains: the Pod PriorityClass (kube-scheduler) is the plain Iris
//! band; the Kueue WorkloadPriorityClass (admission and preemption) also depends on the
//! request's shape. Within BATCH and INTERACTIVE a CPU pod ranks below a standalone
//! accelerator pod, which ranks below a coscheduled gang; SYSTEM and PRODUCTION use one value
//! per band so shape never causes preemption inside those bands. Every tier of a band stays
//! above every tier of the band below.

use iris_types::Band;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};

use crate::manifest::{ManifestError, LABEL_MANAGED};

/// API version of the Kueue objects Iris writes.
pub const KUEUE_API_VERSION: &str = "kueue.x-k8s.io/v1beta1";

/// The request shape that selects a band's Kueue tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    /// No accelerator.
    Cpu,
    /// A standalone GPU/TPU pod.
    Accelerator,
    /// A member of a coscheduled gang (whatever it requests).
    Coscheduled,
}

impl WorkloadKind {
    /// Every kind, lowest tier first.
    pub const ALL: [WorkloadKind; 3] = [
        WorkloadKind::Cpu,
        WorkloadKind::Accelerator,
        WorkloadKind::Coscheduled,
    ];

    /// Gang membership wins over the accelerator.
    pub fn of(gang: bool, accelerator: bool) -> WorkloadKind {
        match (gang, accelerator) {
            (true, _) => WorkloadKind::Coscheduled,
            (false, true) => WorkloadKind::Accelerator,
            (false, false) => WorkloadKind::Cpu,
        }
    }

    /// The name used in class names: `cpu`, `accelerator`, `coscheduled`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Cpu => "cpu",
            WorkloadKind::Accelerator => "accelerator",
            WorkloadKind::Coscheduled => "coscheduled",
        }
    }

    /// Tier offset inside BATCH and INTERACTIVE.
    fn tier(self) -> i32 {
        match self {
            WorkloadKind::Cpu => 0,
            WorkloadKind::Accelerator => 1,
            WorkloadKind::Coscheduled => 2,
        }
    }
}

/// The default Pod PriorityClass of a band: `iris-<band>`.
pub fn pod_priority_class_name(band: Band) -> &'static str {
    match band {
        Band::System => "iris-system",
        Band::Production => "iris-production",
        Band::Interactive => "iris-interactive",
        Band::Batch => "iris-batch",
    }
}

/// The Pod priority of a band: 10000, 1000, 10, 0.
pub fn pod_priority_value(band: Band) -> i32 {
    match band {
        Band::System => 10_000,
        Band::Production => 1_000,
        Band::Interactive => 10,
        Band::Batch => 0,
    }
}

/// The four Pod PriorityClasses Iris keeps up to date at controller start.
pub fn pod_priority_classes() -> Vec<PriorityClass> {
    Band::ALL
        .into_iter()
        .map(|band| PriorityClass {
            metadata: ObjectMeta {
                name: Some(pod_priority_class_name(band).to_string()),
                labels: Some([(LABEL_MANAGED.to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            value: Some(pod_priority_value(band)),
            preemption_policy: Some("PreemptLowerPriority".into()),
            global_default: Some(false),
            description: Some(format!(
                "Kubernetes scheduling priority of Iris {} task pods",
                band.name()
            )),
        })
        .collect()
}

/// The Kueue priority of a band and request shape (§3.4 table).
pub fn workload_priority_value(band: Band, kind: WorkloadKind) -> i32 {
    match band {
        Band::System | Band::Production => pod_priority_value(band),
        Band::Interactive | Band::Batch => pod_priority_value(band) + kind.tier(),
    }
}

/// The WorkloadPriorityClass name for a pod: `iris-<kind>-<band>`.
pub fn workload_priority_class(band: Band, gang: bool, accelerator: bool) -> String {
    format!(
        "iris-{}-{}",
        WorkloadKind::of(gang, accelerator).as_str(),
        band.name()
    )
}

/// The twelve Kueue WorkloadPriorityClass objects, band by band, lowest tier first.
pub fn workload_priority_classes() -> Vec<Value> {
    let mut out = Vec::with_capacity(Band::ALL.len() * WorkloadKind::ALL.len());
    for band in Band::ALL {
        for kind in WorkloadKind::ALL {
            out.push(json!({
                "apiVersion": KUEUE_API_VERSION,
                "kind": "WorkloadPriorityClass",
                "metadata": {
                    "name": format!("iris-{}-{}", kind.as_str(), band.name()),
                    "labels": { LABEL_MANAGED: "true" },
                },
                "value": workload_priority_value(band, kind),
                "description": format!(
                    "Kueue admission priority of Iris {} workloads of kind {}",
                    band.name(),
                    kind.as_str()
                ),
            }));
        }
    }
    out
}

/// The LocalQueue name: `<label_prefix>-lq`.
pub fn local_queue_name(label_prefix: &str) -> String {
    format!("{label_prefix}-lq")
}

/// The namespaced LocalQueue Iris applies, bound to the admin-installed ClusterQueue.
/// An empty `cluster_queue` is a configuration error.
pub fn local_queue(
    namespace: &str,
    label_prefix: &str,
    cluster_queue: &str,
) -> Result<Value, ManifestError> {
    if cluster_queue.trim().is_empty() {
        return Err(ManifestError::MissingClusterQueue);
    }
    Ok(json!({
        "apiVersion": KUEUE_API_VERSION,
        "kind": "LocalQueue",
        "metadata": {
            "name": local_queue_name(label_prefix),
            "namespace": namespace,
            "labels": { LABEL_MANAGED: "true" },
        },
        "spec": { "clusterQueue": cluster_queue },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_values_match_the_table() {
        let table = [
            (Band::System, [10_000, 10_000, 10_000]),
            (Band::Production, [1_000, 1_000, 1_000]),
            (Band::Interactive, [10, 11, 12]),
            (Band::Batch, [0, 1, 2]),
        ];
        let classes = workload_priority_classes();
        assert_eq!(classes.len(), 12);
        for (band, values) in table {
            for (kind, want) in WorkloadKind::ALL.into_iter().zip(values) {
                assert_eq!(workload_priority_value(band, kind), want, "{band} {kind:?}");
                let name = format!("iris-{}-{}", kind.as_str(), band.name());
                let obj = classes
                    .iter()
                    .find(|c| c["metadata"]["name"] == name.as_str())
                    .unwrap_or_else(|| panic!("missing {name}"));
                assert_eq!(obj["value"], want);
                assert_eq!(obj["apiVersion"], KUEUE_API_VERSION);
                assert_eq!(obj["kind"], "WorkloadPriorityClass");
            }
        }
    }

    #[test]
    fn every_tier_outranks_the_band_below() {
        for pair in Band::ALL.windows(2) {
            let lowest_above = WorkloadKind::ALL
                .into_iter()
                .map(|k| workload_priority_value(pair[0], k))
                .min();
            let highest_below = WorkloadKind::ALL
                .into_iter()
                .map(|k| workload_priority_value(pair[1], k))
                .max();
            assert!(lowest_above > highest_below, "{} vs {}", pair[0], pair[1]);
        }
    }

    #[test]
    fn class_names() {
        assert_eq!(
            workload_priority_class(Band::Batch, false, false),
            "iris-cpu-batch"
        );
        assert_eq!(
            workload_priority_class(Band::Interactive, false, true),
            "iris-accelerator-interactive"
        );
        assert_eq!(
            workload_priority_class(Band::System, true, false),
            "iris-coscheduled-system"
        );
        assert_eq!(
            workload_priority_class(Band::Production, true, true),
            "iris-coscheduled-production"
        );
    }

    #[test]
    fn pod_priority_classes_are_the_four_bands() {
        let pcs = pod_priority_classes();
        let got: Vec<(String, i32)> = pcs
            .iter()
            .map(|p| {
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    p.value.unwrap_or(-1),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("iris-system".to_string(), 10_000),
                ("iris-production".to_string(), 1_000),
                ("iris-interactive".to_string(), 10),
                ("iris-batch".to_string(), 0),
            ]
        );
        assert!(pcs
            .iter()
            .all(|p| p.preemption_policy.as_deref() == Some("PreemptLowerPriority")));
    }

    #[test]
    fn local_queue_binds_the_cluster_queue() {
        let lq = local_queue("iris", "cw", "cw-cq").unwrap();
        assert_eq!(lq["metadata"]["name"], "cw-lq");
        assert_eq!(lq["metadata"]["namespace"], "iris");
        assert_eq!(lq["spec"]["clusterQueue"], "cw-cq");
        assert_eq!(lq["kind"], "LocalQueue");
        assert_eq!(
            local_queue("iris", "cw", " "),
            Err(ManifestError::MissingClusterQueue)
        );
    }
}
