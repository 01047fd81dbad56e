//! The `stage-workdir` init container (reference §3.2): it fills `/app` before the task starts —
//! the bundle from the controller, the job's workdir files from a per-pod ConfigMap, and
//! workdir files the controller holds as blobs — so the task image needs no `curl` or `unzip`.
//! The staging script is our own (`stage_workdir.py`, Python standard library only, since task
//! images have Python).

use super::input::{PodInput, ProviderConfig};
use super::names::{base_labels, owned_by_pod, pod_name};
use super::ManifestError;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, EnvVar, KeyToPath, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use std::collections::BTreeMap;

/// Name of the init container that stages the working directory.
pub const STAGE_CONTAINER: &str = "stage-workdir";
/// The volume holding the job's workdir files (from the ConfigMap).
const FILES_VOLUME: &str = "workdir-files";
/// Where the init container sees the workdir files.
const FILES_MOUNT: &str = "/iris/staged-workdir-files";
/// The staging script the init container runs with `python -c`.
pub const STAGE_SCRIPT: &str = include_str!("stage_workdir.py");

/// The ConfigMap name of a pod's workdir files: `<pod>-wf`.
pub fn workdir_config_map_name(pod_name: &str) -> String {
    format!("{pod_name}-wf")
}

/// A workdir file name as a safe relative path: `\` read as `/`, normalised, never absolute,
/// empty or leaving the directory.
pub fn workdir_relative_path(name: &str) -> Result<String, ManifestError> {
    let bad = |why: &str| ManifestError::InvalidWorkdirFile {
        name: name.to_string(),
        why: why.to_string(),
    };
    let candidate = name.replace('\\', "/");
    if candidate.starts_with('/') {
        return Err(bad("absolute paths are not allowed"));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in candidate.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(bad("it leaves the working directory"));
                }
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(bad("it names no file"));
    }
    Ok(parts.join("/"))
}

/// The workdir files' ConfigMap keys (`f0000`, …) and paths, in name order.
fn items(input: &PodInput) -> Result<Vec<KeyToPath>, ManifestError> {
    input
        .workdir_files
        .keys()
        .enumerate()
        .map(|(i, name)| {
            Ok(KeyToPath {
                key: format!("f{i:04}"),
                path: workdir_relative_path(name)?,
                ..Default::default()
            })
        })
        .collect()
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// The init container and the extra volume it needs, or `None` when there is nothing to stage
/// (no bundle, no workdir files). A bundle or blob refs are fetched from
/// `kubernetes_provider.controller_address`; without one they are not staged, as in the
/// reference. The init container runs the cluster's default task image.
pub(super) fn stage_workdir(
    input: &PodInput,
    config: &ProviderConfig,
) -> Result<Option<(Container, Option<Volume>)>, ManifestError> {
    let url = config.controller_address.as_deref().unwrap_or_default();
    let bundle = !input.bundle_id.is_empty() && !url.is_empty();
    let refs = !input.workdir_file_refs.is_empty() && !url.is_empty();
    let files = !input.workdir_files.is_empty();
    if !bundle && !refs && !files {
        return Ok(None);
    }
    let mut envs = vec![env("IRIS_WORKDIR", "/app")];
    let mut mounts = vec![VolumeMount {
        name: "workdir".into(),
        mount_path: "/app".into(),
        ..Default::default()
    }];
    if bundle || refs {
        envs.push(env("IRIS_CONTROLLER_URL", url));
    }
    if bundle {
        envs.push(env("IRIS_BUNDLE_ID", input.bundle_id.clone()));
    }
    if refs {
        let json = serde_json::to_string(&input.workdir_file_refs).unwrap_or_default();
        envs.push(env("IRIS_WORKDIR_BLOB_REFS", json));
    }
    let mut volume = None;
    if files {
        let pod = pod_name(&input.task_id, input.attempt_id, &input.attempt_uid);
        volume = Some(Volume {
            name: FILES_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: workdir_config_map_name(&pod),
                items: Some(items(input)?),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: FILES_VOLUME.into(),
            mount_path: FILES_MOUNT.into(),
            read_only: Some(true),
            ..Default::default()
        });
        envs.push(env("IRIS_WORKDIR_FILES_SRC", FILES_MOUNT));
    }
    let container = Container {
        name: STAGE_CONTAINER.into(),
        image: Some(config.default_task_image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["python".into(), "-c".into(), STAGE_SCRIPT.into()]),
        env: Some(envs),
        volume_mounts: Some(mounts),
        // A failure's cause is the script's last stderr line: let it reach the pod status.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    Ok(Some((container, volume)))
}

/// The per-pod ConfigMap holding the job's workdir files (`binaryData`, keys as the init
/// container's volume maps them), or `None` when the job has none. Pass the created pod's uid
/// to make the pod its owner, so Kubernetes deletes the ConfigMap with the pod.
pub fn build_workdir_config_map(
    input: &PodInput,
    config: &ProviderConfig,
    owner_pod_uid: Option<&str>,
) -> Option<ConfigMap> {
    if input.workdir_files.is_empty() {
        return None;
    }
    let pod = pod_name(&input.task_id, input.attempt_id, &input.attempt_uid);
    let owner = owned_by_pod(&pod, owner_pod_uid);
    let data: BTreeMap<String, ByteString> = input
        .workdir_files
        .values()
        .enumerate()
        .map(|(i, bytes)| (format!("f{i:04}"), ByteString(bytes.clone())))
        .collect();
    Some(ConfigMap {
        metadata: ObjectMeta {
            name: Some(workdir_config_map_name(&pod)),
            namespace: Some(config.namespace.clone()),
            labels: Some(base_labels(input, config)),
            owner_references: owner,
            ..Default::default()
        },
        binary_data: Some(data),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workdir_paths_are_relative_and_stay_inside() {
        assert_eq!(
            workdir_relative_path("a/./b//c.py").as_deref(),
            Ok("a/b/c.py")
        );
        assert_eq!(workdir_relative_path("a\\b.txt").as_deref(), Ok("a/b.txt"));
        assert_eq!(workdir_relative_path("a/../b").as_deref(), Ok("b"));
        for bad in ["/etc/passwd", "../x", "a/../../x", "", ".", "a/.."] {
            let e = workdir_relative_path(bad).expect_err(bad);
            assert!(e.to_string().contains("workdir file"), "{e}");
        }
    }
}
