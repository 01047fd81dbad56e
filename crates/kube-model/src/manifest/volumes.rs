//! The pod's volumes and the task container's mounts: work and output dirs, caches, `/dev/shm`
//! and the job's secrets.

use super::input::{PodInput, ProviderConfig};
use super::secret::secret_name;
use super::{SECRETS_MOUNT_PATH, SECRETS_VOLUME, SECRET_FILE_MODE, SHM_FALLBACK};
use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, HostPathVolumeSource, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

/// Volumes and the task container's mounts (§3.2).
pub(super) fn volumes(
    input: &PodInput,
    config: &ProviderConfig,
    pod: &str,
) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut vols = Vec::new();
    let mut mounts = Vec::new();
    for (name, path) in [
        ("workdir", "/app"),
        ("task-outputs", "/iris/outputs"),
        ("tmpfs", "/tmp"),
    ] {
        vols.push(empty_dir(name));
        mounts.push(mount(name, path));
    }
    let root = config.cache_dir.trim_end_matches('/');
    for (name, path, host) in [
        ("uv-cache", "/uv/cache", "uv-cache"),
        ("hf-cache", "/hf/cache", "hf-cache"),
        ("cargo", "/cargo", "cargo"),
        ("scratch-cache", "/cache", "cache"),
    ] {
        vols.push(Volume {
            name: name.into(),
            host_path: Some(HostPathVolumeSource {
                path: format!("{root}/{host}"),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Default::default()
        });
        mounts.push(mount(name, path));
    }
    let shm_limit = if input.memory_bytes > 0 {
        Some(Quantity(input.memory_bytes.to_string()))
    } else if input.has_accelerator() {
        Some(Quantity(SHM_FALLBACK.into()))
    } else {
        None
    };
    vols.push(Volume {
        name: "dshm".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: shm_limit,
            ..Default::default()
        }),
        ..Default::default()
    });
    mounts.push(mount("dshm", "/dev/shm"));
    if !input.secrets.is_empty() {
        // Readable by the pod's fsGroup only (0440), as the reference mounts them.
        vols.push(Volume {
            name: SECRETS_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name(pod)),
                default_mode: Some(SECRET_FILE_MODE),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            read_only: Some(true),
            ..mount(SECRETS_VOLUME, SECRETS_MOUNT_PATH)
        });
    }
    (vols, mounts)
}
