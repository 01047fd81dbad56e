//! The PodDisruptionBudget protecting a coordinator's pod from voluntary eviction.

use super::input::{PodInput, ProviderConfig};
use super::names::{base_labels, pod_name, task_hash};
use super::LABEL_TASK_HASH;
use iris_types::Band;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// The PDB name of a pod: `<pod>-pdb`.
pub fn pdb_name(pod_name: &str) -> String {
    format!("{pod_name}-pdb")
}

/// The PodDisruptionBudget protecting a coordinator's pod (§3.3), applied before the pod;
/// `None` for other tasks. SYSTEM and PRODUCTION get `minAvailable: 1` (never voluntarily
/// evicted); INTERACTIVE and BATCH get `maxUnavailable: 1`.
pub fn build_pdb(input: &PodInput, config: &ProviderConfig) -> Option<PodDisruptionBudget> {
    if !input.is_coordinator() {
        return None;
    }
    let pod = pod_name(&input.task_id, input.attempt_id, &input.attempt_uid);
    let one = Some(IntOrString::Int(1));
    let protected = matches!(input.band, Band::System | Band::Production);
    Some(PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(pdb_name(&pod)),
            namespace: Some(config.namespace.clone()),
            labels: Some(base_labels(input, config)),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: if protected { one.clone() } else { None },
            max_unavailable: if protected { None } else { one },
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    LABEL_TASK_HASH.to_string(),
                    task_hash(&input.task_id),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}
