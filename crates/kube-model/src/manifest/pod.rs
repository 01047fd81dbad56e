//! The attempt's Pod: nodeSelector, tolerations and [`build_pod`], which assembles the pieces
//! from the sibling modules after validating the gang shape.

use super::env::{pod_env, task_script};
use super::input::{NodeConstraint, PodInput, ProviderConfig};
use super::names::{pod_annotations, pod_labels, pod_name};
use super::resources::resources;
use super::volumes::volumes;
use super::{
    ManifestError, GPU_RESOURCE, NODE_LABEL_POOL, NODE_LABEL_REGION, SECRET_GROUP, TASK_CONTAINER,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, Pod, PodSecurityContext, PodSpec, SecurityContext, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// The nodeSelector: the managed label plus `pool`/`region` EQ constraints.
fn node_selector(
    input: &PodInput,
    config: &ProviderConfig,
) -> Result<BTreeMap<String, String>, ManifestError> {
    let mut sel = BTreeMap::new();
    if let Some(managed) = config.managed_label() {
        sel.insert(managed, "true".to_string());
    }
    for c in &input.constraints {
        let (key, label) = match c {
            NodeConstraint::Eq { key, .. } | NodeConstraint::Other { key, .. } => {
                match key.as_str() {
                    "pool" => (key, NODE_LABEL_POOL),
                    "region" => (key, NODE_LABEL_REGION),
                    _ => continue,
                }
            }
        };
        match c {
            NodeConstraint::Eq { value, .. } => {
                sel.insert(label.to_string(), value.clone());
            }
            NodeConstraint::Other { op, .. } => {
                return Err(ManifestError::UnsupportedConstraint {
                    key: key.clone(),
                    op: op.clone(),
                })
            }
        }
    }
    Ok(sel)
}

fn toleration(key: &str, effect: &str) -> Toleration {
    Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Default::default()
    }
}

/// Builds the attempt's Pod (§3.2). Gang shapes are validated first, so an impossible NVL72
/// shape fails with the §4.4 message before anything else is looked at.
pub fn build_pod(input: &PodInput, config: &ProviderConfig) -> Result<Pod, ManifestError> {
    let annotations = pod_annotations(input, config)?;
    let node_selector = node_selector(input, config)?;
    let image = input
        .task_image
        .as_deref()
        .filter(|i| !i.is_empty())
        .unwrap_or(&config.default_task_image);
    if image.is_empty() {
        return Err(ManifestError::MissingImage);
    }
    let name = pod_name(&input.task_id, input.attempt_id, &input.attempt_uid);
    let (mut volumes, volume_mounts) = volumes(input, config, &name);
    let stage = super::workdir::stage_workdir(input, config)?;
    let mut init_containers = Vec::new();
    if let Some((container, volume)) = stage {
        init_containers.push(container);
        volumes.extend(volume);
    }

    let container = Container {
        name: TASK_CONTAINER.into(),
        image: Some(image.to_string()),
        image_pull_policy: Some("IfNotPresent".into()),
        working_dir: Some("/app".into()),
        command: Some(vec!["bash".into(), "-lc".into(), task_script(input)]),
        env: Some(pod_env(input, config)),
        resources: resources(input, config),
        volume_mounts: Some(volume_mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        // SYS_PTRACE for profiling; a TPU also needs SYS_RESOURCE to lock memory.
        security_context: Some(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(if input.tpu {
                    vec!["SYS_PTRACE".into(), "SYS_RESOURCE".into()]
                } else {
                    vec!["SYS_PTRACE".into()]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };

    let tolerations = (input.gpu_count > 0).then(|| {
        vec![
            toleration(GPU_RESOURCE, "NoSchedule"),
            toleration("qos.coreweave.cloud/interruptable", "NoExecute"),
        ]
    });
    // Kubernetes counts the deadline from pod creation, including time spent gated by Kueue, so
    // gangs (which may wait long for admission) rely on the controller's own timeout instead.
    let active_deadline_seconds = match input.timeout_seconds {
        Some(t) if t > 0 && !input.is_gang() => {
            let total = t.saturating_add(config.deadline_grace_seconds);
            Some(i64::try_from(total).unwrap_or(i64::MAX))
        }
        _ => None,
    };

    let spec = PodSpec {
        restart_policy: Some("Never".into()),
        init_containers: (!init_containers.is_empty()).then_some(init_containers),
        containers: vec![container],
        volumes: Some(volumes),
        node_selector: (!node_selector.is_empty()).then_some(node_selector),
        tolerations,
        host_network: config.host_network.then_some(true),
        dns_policy: config
            .host_network
            .then(|| "ClusterFirstWithHostNet".to_string()),
        priority_class_name: Some(config.priority_class_name(input.band)),
        active_deadline_seconds,
        service_account_name: config.service_account.clone().filter(|s| !s.is_empty()),
        security_context: (!input.secrets.is_empty()).then(|| PodSecurityContext {
            fs_group: Some(SECRET_GROUP),
            ..Default::default()
        }),
        ..Default::default()
    };

    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(config.namespace.clone()),
            labels: Some(pod_labels(input, config)),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}
