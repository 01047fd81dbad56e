//! The per-pod Secret holding the job's secrets, owned by the pod so it goes with it.

use super::input::{PodInput, ProviderConfig};
use super::names::{base_labels, owned_by_pod, pod_name};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The Secret name of a pod: `<pod>-secrets`.
pub fn secret_name(pod_name: &str) -> String {
    format!("{pod_name}-secrets")
}

/// The per-pod Secret holding the job's secrets, or `None` when it has none. Pass the created
/// pod's uid to make the pod its owner, so Kubernetes deletes the Secret with the pod.
pub fn build_secret(
    input: &PodInput,
    config: &ProviderConfig,
    owner_pod_uid: Option<&str>,
) -> Option<Secret> {
    if input.secrets.is_empty() {
        return None;
    }
    let pod = pod_name(&input.task_id, input.attempt_id, &input.attempt_uid);
    let owner = owned_by_pod(&pod, owner_pod_uid);
    Some(Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&pod)),
            namespace: Some(config.namespace.clone()),
            labels: Some(base_labels(input, config)),
            owner_references: owner,
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        // One file per secret, plus the AWS credentials file the CoreWeave keys make.
        string_data: Some(iris_backend::task_env::secret_files(&input.secrets)),
        ..Default::default()
    })
}
