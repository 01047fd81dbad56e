//! Names, labels and annotations of an attempt's objects: the deterministic pod name, the Kueue
//! pod group of a gang, label-value sanitising, and the pod's labels and annotations (Kueue
//! queue, priority class, gang and topology). These are what running clusters agree on.

use super::input::{PodInput, ProviderConfig};
use super::{
    ManifestError, ANNOTATION_TASK_ID, KUEUE_POD_GROUP_NAME, KUEUE_POD_GROUP_POD_INDEX,
    KUEUE_POD_GROUP_TOTAL_COUNT, KUEUE_PRIORITY_CLASS, KUEUE_QUEUE_NAME, LABEL_ATTEMPT_ID,
    LABEL_GPU_VARIANT, LABEL_JOB_ID, LABEL_MANAGED, LABEL_RUNTIME, LABEL_TASK_HASH, LABEL_TASK_ID,
    MAX_LABEL_VALUE_LEN, MAX_POD_NAME_LEN, RUNTIME_VALUE,
};
use crate::priority;
use crate::topology;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// First `n` hex chars of sha256(`s`).
fn sha_prefix(s: &str, n: usize) -> String {
    let mut hex = hex::encode(Sha256::digest(s.as_bytes()));
    hex.truncate(n);
    hex
}

/// `iris.task_hash`: the first 16 hex chars of sha256(task wire id).
pub fn task_hash(task_id: &str) -> String {
    sha_prefix(task_id, 16)
}

/// A Kubernetes label value for `value`: characters outside `[A-Za-z0-9-_.]` become `.`, the
/// ends are trimmed of `-_.`, and the result is cut to 63 chars; empty becomes `unknown`.
pub fn sanitize_label_value(value: &str) -> String {
    let mapped: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '.'
            }
        })
        .collect();
    let trim = |c: char| matches!(c, '-' | '_' | '.');
    let mut out = mapped.trim_matches(trim).to_string();
    if out.len() > MAX_LABEL_VALUE_LEN {
        out.truncate(MAX_LABEL_VALUE_LEN);
        out = out.trim_end_matches(trim).to_string();
    }
    if out.is_empty() {
        "unknown".into()
    } else {
        out
    }
}

/// Lower-cases `s`, turns characters outside `[a-z0-9-]` into `-`, collapses runs of `-` and
/// trims them from both ends.
pub(super) fn dns_fragment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars().flat_map(char::to_lowercase) {
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    out.trim_matches('-').to_string()
}

/// The pod name of an attempt: `iris-<task id as a DNS fragment>` cut so the whole name fits 63
/// chars, then `-<sha256(task id)[:8]>-<attempt>[-<uid>]`. The hash keeps tasks with a long
/// common prefix apart; the attempt and uid keep retries apart.
pub fn pod_name(task_id: &str, attempt_id: u32, attempt_uid: &str) -> String {
    let uid = dns_fragment(attempt_uid);
    let mut suffix = format!("-{}-{attempt_id}", sha_prefix(task_id, 8));
    if !uid.is_empty() {
        suffix.push('-');
        suffix.push_str(&uid);
    }
    let mut prefix = dns_fragment(&format!("iris-{task_id}"));
    let room = MAX_POD_NAME_LEN.saturating_sub(suffix.len());
    if prefix.len() > room {
        // `dns_fragment` output is ASCII, so any byte index is a char boundary.
        prefix.truncate(room);
        prefix = prefix.trim_end_matches('-').to_string();
    }
    if prefix.is_empty() {
        prefix = "iris-task".into();
    }
    prefix + &suffix
}

/// The Kueue pod group of a gang attempt: `iris-pg-<sha256(job path)[:16]>-<attempt>`. Every
/// sibling shares it; a whole-gang retry bumps the attempt and so gets a fresh group.
pub fn pod_group_name(job_id: &str, attempt_id: u32) -> String {
    format!("iris-pg-{}-{attempt_id}", sha_prefix(job_id, 16))
}

/// Labels shared by every object of an attempt (pod, PDB, secret).
pub(super) fn base_labels(input: &PodInput, config: &ProviderConfig) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_RUNTIME.to_string(), RUNTIME_VALUE.to_string()),
        (LABEL_TASK_HASH.to_string(), task_hash(&input.task_id)),
    ]);
    if let Some(managed) = config.managed_label() {
        labels.insert(managed, "true".into());
    }
    labels
}

/// The pod's labels (§3.1).
pub fn pod_labels(input: &PodInput, config: &ProviderConfig) -> BTreeMap<String, String> {
    let mut labels = base_labels(input, config);
    labels.insert(LABEL_TASK_ID.into(), sanitize_label_value(&input.task_id));
    labels.insert(LABEL_ATTEMPT_ID.into(), input.attempt_id.to_string());
    labels.insert(LABEL_JOB_ID.into(), sanitize_label_value(&input.job_id));
    if input.gpu_count > 0 && !input.gpu_variant.is_empty() {
        labels.insert(
            LABEL_GPU_VARIANT.into(),
            sanitize_label_value(&input.gpu_variant),
        );
    }
    labels.insert(
        KUEUE_QUEUE_NAME.into(),
        priority::local_queue_name(&config.label_prefix),
    );
    labels.insert(
        KUEUE_PRIORITY_CLASS.into(),
        priority::workload_priority_class(input.band, input.is_gang(), input.has_accelerator()),
    );
    if input.is_gang() {
        labels.insert(
            KUEUE_POD_GROUP_NAME.into(),
            pod_group_name(&input.job_id, input.attempt_id),
        );
        labels.insert(
            KUEUE_POD_GROUP_POD_INDEX.into(),
            input.task_index.to_string(),
        );
    }
    labels
}

/// The pod's annotations (§3.1, §4.3). Fails for gang shapes the topology cannot place.
pub fn pod_annotations(
    input: &PodInput,
    config: &ProviderConfig,
) -> Result<BTreeMap<String, String>, ManifestError> {
    let mut ann = match &input.group_by {
        Some(group_by) => {
            let mut ann = topology::annotations(
                group_by,
                input.num_tasks,
                input.gpu_count,
                config.kueue_topologies.as_ref(),
            )?;
            ann.insert(
                KUEUE_POD_GROUP_TOTAL_COUNT.into(),
                input.num_tasks.to_string(),
            );
            ann
        }
        None if input.gpu_count > 0 => BTreeMap::from([(
            topology::ANNOTATION_PREFERRED.to_string(),
            topology::LABEL_HOSTNAME.to_string(),
        )]),
        None => BTreeMap::from([(
            topology::ANNOTATION_UNCONSTRAINED.to_string(),
            "true".to_string(),
        )]),
    };
    ann.insert(ANNOTATION_TASK_ID.into(), input.task_id.clone());
    Ok(ann)
}

/// An owner reference to the attempt's pod (uid `pod_uid`), so Kubernetes deletes an object
/// that belongs to the pod (its Secret, its workdir ConfigMap) with it.
pub(super) fn owned_by_pod(pod_name: &str, pod_uid: Option<&str>) -> Option<Vec<OwnerReference>> {
    pod_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod_name.to_string(),
            uid: uid.into(),
            ..Default::default()
        }]
    })
}
