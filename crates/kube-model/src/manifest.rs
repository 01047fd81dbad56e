//! Pod, PodDisruptionBudget and Secret manifests for one task attempt (reference §3.1–3.3).
//!
//! One Pod per attempt, named from `(task, attempt, uid)` so a repeated launch is idempotent.
//! Everything here is a pure function of a [`PodInput`] (what the controller decided) and a
//! [`ProviderConfig`] (the `kubernetes_provider` section of the cluster config).
//!
//! Not built, on purpose (the published Python provider has them):
//! * the `log-shipper` sidecar — the controller streams the `task` container's log through the
//!   Kubernetes API instead;
//! * the `output-uploader` container — task outputs stay in the `task-outputs` emptyDir;
//! * the `stage-workdir` init container — the controller stages the bundle itself, by putting
//!   the fetch-and-unpack step first in [`PodInput::setup_commands`], which run in `/app`
//!   before the command;
//! * container security profiles other than the default (`SYS_PTRACE`), gVisor and sandbox
//!   egress (`iris.egress`).

use std::collections::BTreeMap;

use iris_types::Band;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource,
    ObjectFieldSelector, Pod, PodSpec, ResourceRequirements, Secret, SecretVolumeSource,
    SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use crate::priority;
use crate::topology::{self, TopologyError, TopologyMap};

/// Label: every Iris pod carries `iris.managed=true`.
pub const LABEL_MANAGED: &str = "iris.managed";
/// Label: `iris.runtime=iris-kubernetes`.
pub const LABEL_RUNTIME: &str = "iris.runtime";
/// Value of [`LABEL_RUNTIME`].
pub const RUNTIME_VALUE: &str = "iris-kubernetes";
/// Label: the task wire id, sanitised to a label value.
pub const LABEL_TASK_ID: &str = "iris.task_id";
/// Label: the attempt number.
pub const LABEL_ATTEMPT_ID: &str = "iris.attempt_id";
/// Label: first 16 hex chars of sha256(task wire id); kill/stray detection keys on it.
pub const LABEL_TASK_HASH: &str = "iris.task_hash";
/// Label: the job path, sanitised to a label value.
pub const LABEL_JOB_ID: &str = "iris.job_id";
/// Label: the accelerator variant a GPU pod asked for (sanitised), so held GPUs can be
/// attributed per variant.
pub const LABEL_GPU_VARIANT: &str = "iris.gpu_variant";
/// Annotation: the full, unsanitised task wire id.
pub const ANNOTATION_TASK_ID: &str = "iris.task_id";
/// Node label matched by a `pool EQ x` constraint.
pub const NODE_LABEL_POOL: &str = "iris.pool";
/// Node label matched by a `region EQ x` constraint.
pub const NODE_LABEL_REGION: &str = "iris.region";

/// Kueue label: the LocalQueue a pod is admitted through.
pub const KUEUE_QUEUE_NAME: &str = "kueue.x-k8s.io/queue-name";
/// Kueue label: the WorkloadPriorityClass.
pub const KUEUE_PRIORITY_CLASS: &str = "kueue.x-k8s.io/priority-class";
/// Kueue label: the pod group of a gang (also the Workload's name).
pub const KUEUE_POD_GROUP_NAME: &str = "kueue.x-k8s.io/pod-group-name";
/// Kueue label: a gang member's index.
pub const KUEUE_POD_GROUP_POD_INDEX: &str = "kueue.x-k8s.io/pod-group-pod-index";
/// Kueue annotation: a gang's size.
pub const KUEUE_POD_GROUP_TOTAL_COUNT: &str = "kueue.x-k8s.io/pod-group-total-count";

/// Extended resource name of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Extended resource name of InfiniBand RDMA devices.
pub const RDMA_RESOURCE: &str = "rdma/ib";
/// Name of the container that runs the task.
pub const TASK_CONTAINER: &str = "task";
/// Where job secrets are mounted, one file per key.
pub const SECRETS_MOUNT_PATH: &str = "/iris/secrets";

/// Longest pod name we produce (a DNS label).
const MAX_POD_NAME_LEN: usize = 63;
/// Longest label value Kubernetes accepts.
const MAX_LABEL_VALUE_LEN: usize = 63;
/// `/dev/shm` size for accelerator pods that request no memory.
const SHM_FALLBACK: &str = "100Gi";
const GIB: u64 = 1 << 30;

/// Why a manifest cannot be built. The task fails terminally with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// An impossible gang shape (§4.4).
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The gang's `group_by` is not a level this cluster maps.
    #[error(
        "coscheduling group_by {group_by:?} has no topology mapping on this cluster (known: {}); \
         use a known level or configure kubernetes_provider.kueue.topologies",
        known.join(", ")
    )]
    UnknownGroupBy {
        /// The requested level.
        group_by: String,
        /// The levels the cluster maps, sorted.
        known: Vec<String>,
    },
    /// A `pool`/`region` constraint with an operator other than EQ.
    #[error("constraint {key} {op} cannot become a nodeSelector: only EQ is supported for {key}")]
    UnsupportedConstraint {
        /// `pool` or `region`.
        key: String,
        /// The operator's name (`NE`, `IN`, …).
        op: String,
    },
    /// Neither the request nor the cluster names an image.
    #[error(
        "no task image: the request sets none and kubernetes_provider has no default task image"
    )]
    MissingImage,
    /// `kubernetes_provider.kueue.cluster_queue` is empty.
    #[error("kubernetes_provider.kueue.cluster_queue is required: the LocalQueue must point at a ClusterQueue")]
    MissingClusterQueue,
}

/// A scheduling constraint, as far as a nodeSelector cares.
///
/// Only `pool` and `region` map to node labels ([`NODE_LABEL_POOL`], [`NODE_LABEL_REGION`]);
/// constraints on other keys are ignored here (Kueue and the controller handle placement).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeConstraint {
    /// `key EQ value` with a string value.
    Eq {
        /// Attribute key.
        key: String,
        /// Required value.
        value: String,
    },
    /// Any other operator (`NE`, `IN`, `EXISTS`, …), by its upper-case name.
    Other {
        /// Attribute key.
        key: String,
        /// Operator name.
        op: String,
    },
}

/// Everything about one attempt that its pod depends on.
#[derive(Clone, Debug, PartialEq)]
pub struct PodInput {
    /// Task wire id, e.g. `/alice/train/0`.
    pub task_id: String,
    /// Attempt number.
    pub attempt_id: u32,
    /// The attempt's 16-hex uid; empty leaves it out of the pod name.
    pub attempt_uid: String,
    /// Job wire id, e.g. `/alice/train`.
    pub job_id: String,
    /// Tasks in the job.
    pub num_tasks: u32,
    /// This task's index in the job.
    pub task_index: u32,
    /// Effective band. A job without one (wire 0) is passed as [`Band::Interactive`].
    pub band: Band,
    /// The command, run with `exec` after the setup commands.
    pub argv: Vec<String>,
    /// Shell steps run in `/app` before the command, each on its own line under `set -e`.
    pub setup_commands: Vec<String>,
    /// The job's environment.
    pub env: BTreeMap<String, String>,
    /// Iris system variables the controller computes (`IRIS_BUNDLE_ID`, `IRIS_TASK_TOKEN`,
    /// `IRIS_JOB_ENV`, `IRIS_TASK_RESOURCES`, …). They win over everything else.
    pub system_env: BTreeMap<String, String>,
    /// CPU request in millicores (0 = none).
    pub cpu_millicores: u64,
    /// Memory request and limit in bytes (0 = none).
    pub memory_bytes: u64,
    /// Ephemeral-storage request and limit in bytes (0 = none).
    pub disk_bytes: u64,
    /// GPUs per pod (0 = CPU pod).
    pub gpu_count: u32,
    /// Accelerator variant (`H100`, `GB200`); empty for CPU pods.
    pub gpu_variant: String,
    /// Coscheduling level; `Some` makes the pod a gang member.
    pub group_by: Option<String>,
    /// Constraints that may map to a nodeSelector.
    pub constraints: Vec<NodeConstraint>,
    /// Task timeout in seconds; `None` or 0 means none.
    pub timeout_seconds: Option<u64>,
    /// Image override; `None` uses the cluster's default task image.
    pub task_image: Option<String>,
    /// Job secrets, mounted read-only under [`SECRETS_MOUNT_PATH`] from `<pod>-secrets`.
    pub secrets: BTreeMap<String, String>,
}

impl PodInput {
    /// True when the pod belongs to a coscheduled gang.
    pub fn is_gang(&self) -> bool {
        self.group_by.is_some()
    }

    /// True for a "coordinator": a single-task job without accelerators (gets a PDB).
    pub fn is_coordinator(&self) -> bool {
        self.num_tasks <= 1 && self.gpu_count == 0
    }
}

/// The `kubernetes_provider` settings a manifest depends on (reference §5).
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderConfig {
    /// Namespace of task pods and the LocalQueue (default `iris`).
    pub namespace: String,
    /// `platform.label_prefix` (default `iris`): LocalQueue `<prefix>-lq`, managed label
    /// `iris-<prefix>-managed`.
    pub label_prefix: String,
    /// Host networking (and `rdma/ib` for GPU pods).
    pub host_network: bool,
    /// Node-local cache root for the hostPath caches (default `/cache`).
    pub cache_dir: String,
    /// Image used when the request names none.
    pub default_task_image: String,
    /// In-cluster controller address injected as `IRIS_CONTROLLER_ADDRESS`/`_URL`.
    pub controller_address: Option<String>,
    /// Service account for task pods.
    pub service_account: Option<String>,
    /// `defaults.task_env`: the lowest-precedence environment.
    pub task_env: BTreeMap<String, String>,
    /// Band name (`system`, …) → PriorityClass, replacing the `iris-<band>` defaults.
    pub priority_classes: BTreeMap<String, String>,
    /// `kueue.topologies`; `None` or empty uses the CoreWeave defaults.
    pub kueue_topologies: Option<TopologyMap>,
    /// Seconds added to a task's timeout for `activeDeadlineSeconds` (output finalisation).
    pub deadline_grace_seconds: u64,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            namespace: "iris".into(),
            label_prefix: "iris".into(),
            host_network: false,
            cache_dir: "/cache".into(),
            default_task_image: String::new(),
            controller_address: None,
            service_account: None,
            task_env: BTreeMap::new(),
            priority_classes: BTreeMap::new(),
            kueue_topologies: None,
            deadline_grace_seconds: 0,
        }
    }
}

impl ProviderConfig {
    /// `iris-<label_prefix>-managed`, or `None` without a prefix.
    pub fn managed_label(&self) -> Option<String> {
        (!self.label_prefix.is_empty()).then(|| format!("iris-{}-managed", self.label_prefix))
    }

    /// The PriorityClass for `band`: the override if configured, else `iris-<band>`.
    pub fn priority_class_name(&self, band: Band) -> String {
        self.priority_classes
            .get(band.name())
            .cloned()
            .unwrap_or_else(|| priority::pod_priority_class_name(band).to_string())
    }

    /// The band whose PriorityClass is `class` (overrides first, then the defaults).
    pub fn band_for_priority_class(&self, class: &str) -> Option<Band> {
        Band::ALL
            .into_iter()
            .find(|b| self.priority_class_name(*b) == class)
    }
}

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
fn dns_fragment(s: &str) -> String {
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
fn base_labels(input: &PodInput, config: &ProviderConfig) -> BTreeMap<String, String> {
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
        priority::workload_priority_class(input.band, input.is_gang(), input.gpu_count > 0),
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

/// Quotes `s` for a POSIX shell (single quotes unless it is plainly safe).
fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r#"'"'"'"#))
    }
}

/// The `bash -lc` script: strict mode, no core dumps, the setup steps, the venv if one exists,
/// then `exec` of the command.
pub fn task_script(input: &PodInput) -> String {
    let mut lines = vec![
        "set -e".to_string(),
        "ulimit -c 0".to_string(),
        "cd /app".to_string(),
    ];
    lines.extend(input.setup_commands.iter().cloned());
    lines.push(
        r#"if [ -f "$IRIS_VENV/bin/activate" ]; then . "$IRIS_VENV/bin/activate"; fi"#.to_string(),
    );
    if !input.argv.is_empty() {
        let argv: Vec<String> = input.argv.iter().map(|a| shell_quote(a)).collect();
        lines.push(format!("exec {}", argv.join(" ")));
    }
    lines.join("\n")
}

/// Variables fixed by the pod layout (mount points) and the attempt's identity.
fn layout_env(input: &PodInput, config: &ProviderConfig) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = [
        ("IRIS_WORKDIR", "/app"),
        ("IRIS_OUTPUT_DIR", "/iris/outputs"),
        ("IRIS_VENV", "/app/.venv"),
        ("UV_PROJECT_ENVIRONMENT", "/app/.venv"),
        ("UV_CACHE_DIR", "/uv/cache"),
        ("HF_HUB_CACHE", "/hf/cache"),
        ("CARGO_HOME", "/cargo"),
        ("CARGO_TARGET_DIR", "/cargo/target"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.insert(
        "IRIS_TASK_ID".into(),
        format!("{}:{}", input.task_id, input.attempt_id),
    );
    env.insert("IRIS_ATTEMPT_UID".into(), input.attempt_uid.clone());
    env.insert("IRIS_NUM_TASKS".into(), input.num_tasks.to_string());
    env.insert("IRIS_JOB_ID".into(), input.job_id.clone());
    if let Some(addr) = &config.controller_address {
        env.insert("IRIS_CONTROLLER_ADDRESS".into(), addr.clone());
        env.insert("IRIS_CONTROLLER_URL".into(), addr.clone());
    }
    env
}

/// Variables filled in by the kubelet through the downward API.
const DOWNWARD_ENV: [(&str, &str); 2] = [
    ("IRIS_ADVERTISE_HOST", "status.podIP"),
    ("IRIS_NODE_NAME", "spec.nodeName"),
];

/// The task container's environment: cluster `task_env` < job env < pod-layout and identity
/// variables < the controller's `system_env`, sorted by name, then `IRIS_ADVERTISE_HOST` (pod
/// IP) and `IRIS_NODE_NAME` (node) from the downward API, which nothing can override.
pub fn pod_env(input: &PodInput, config: &ProviderConfig) -> Vec<EnvVar> {
    let mut merged = config.task_env.clone();
    merged.extend(input.env.clone());
    merged.extend(layout_env(input, config));
    merged.extend(input.system_env.clone());
    for (name, _) in DOWNWARD_ENV {
        merged.remove(name);
    }
    let mut env: Vec<EnvVar> = merged
        .into_iter()
        .map(|(name, value)| EnvVar {
            name,
            value: Some(value),
            ..Default::default()
        })
        .collect();
    env.extend(DOWNWARD_ENV.into_iter().map(|(name, path)| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }));
    env
}

/// Requests and limits (§3.2): CPU as a request only, memory as both, GPUs (and `rdma/ib` with
/// host networking) as limits, disk as whole GiB (at least 1) both ways.
fn resources(input: &PodInput, config: &ProviderConfig) -> Option<ResourceRequirements> {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    if input.cpu_millicores > 0 {
        requests.insert(
            "cpu".to_string(),
            Quantity(format!("{}m", input.cpu_millicores)),
        );
    }
    if input.memory_bytes > 0 {
        let q = Quantity(input.memory_bytes.to_string());
        requests.insert("memory".to_string(), q.clone());
        limits.insert("memory".to_string(), q);
    }
    if input.gpu_count > 0 {
        let q = Quantity(input.gpu_count.to_string());
        if config.host_network {
            limits.insert(RDMA_RESOURCE.to_string(), q.clone());
        }
        limits.insert(GPU_RESOURCE.to_string(), q);
    }
    if input.disk_bytes > 0 {
        let q = Quantity(format!("{}Gi", (input.disk_bytes / GIB).max(1)));
        requests.insert("ephemeral-storage".to_string(), q.clone());
        limits.insert("ephemeral-storage".to_string(), q);
    }
    if requests.is_empty() && limits.is_empty() {
        return None;
    }
    Some(ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..Default::default()
    })
}

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
fn volumes(
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
    } else if input.gpu_count > 0 {
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
        vols.push(Volume {
            name: "task-secrets".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name(pod)),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            read_only: Some(true),
            ..mount("task-secrets", SECRETS_MOUNT_PATH)
        });
    }
    (vols, mounts)
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
    let (volumes, volume_mounts) = volumes(input, config, &name);

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
        security_context: Some(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["SYS_PTRACE".into()]),
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
    let owner = owner_pod_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod.clone(),
            uid: uid.into(),
            ..Default::default()
        }]
    });
    Some(Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&pod)),
            namespace: Some(config.namespace.clone()),
            labels: Some(base_labels(input, config)),
            owner_references: owner,
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        string_data: Some(input.secrets.clone()),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal CPU task; tests override what they exercise.
    fn input() -> PodInput {
        PodInput {
            task_id: "/alice/train/0".into(),
            attempt_id: 0,
            attempt_uid: "0123456789abcdef".into(),
            job_id: "/alice/train".into(),
            num_tasks: 1,
            task_index: 0,
            band: Band::Interactive,
            argv: vec!["python".into(), "-c".into(), "print('hi')".into()],
            setup_commands: vec![],
            env: BTreeMap::new(),
            system_env: BTreeMap::new(),
            cpu_millicores: 500,
            memory_bytes: 1 << 30,
            disk_bytes: 0,
            gpu_count: 0,
            gpu_variant: String::new(),
            group_by: None,
            constraints: vec![],
            timeout_seconds: None,
            task_image: None,
            secrets: BTreeMap::new(),
        }
    }

    fn config() -> ProviderConfig {
        ProviderConfig {
            default_task_image: "ghcr.io/example/iris-task:latest".into(),
            ..Default::default()
        }
    }

    fn spec(pod: &Pod) -> &PodSpec {
        pod.spec.as_ref().expect("built pods have a spec")
    }

    #[test]
    fn pod_names_are_dns_labels_and_distinct() {
        let n = pod_name("/alice/train/0", 3, "0123456789ABCDEF");
        let hash8 = &task_hash("/alice/train/0")[..8];
        assert_eq!(n, format!("iris-alice-train-0-{hash8}-3-0123456789abcdef"));
        assert_eq!(
            pod_name("/alice/train/0", 3, ""),
            format!("iris-alice-train-0-{hash8}-3")
        );

        let long_a = format!("/alice/{}/0", "x".repeat(100));
        let long_b = format!("/alice/{}/1", "x".repeat(100));
        let a = pod_name(&long_a, 0, "ffffffffffffffff");
        let b = pod_name(&long_b, 0, "ffffffffffffffff");
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
        for n in [&a, &b] {
            assert!(n
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
            assert!(!n.contains("--"));
        }
        assert_eq!(dns_fragment("iris-/Bob__x//y/0"), "iris-bob-x-y-0");
    }

    #[test]
    fn label_values_are_sanitised() {
        assert_eq!(sanitize_label_value("/alice/train/0"), "alice.train.0");
        assert_eq!(sanitize_label_value("///"), "unknown");
        let long = sanitize_label_value(&format!("/a/{}", "b".repeat(80)));
        assert_eq!(long.len(), 63);
        assert_eq!(sanitize_label_value("/a/b c:1"), "a.b.c.1");
        assert_eq!(task_hash("/alice/train/0").len(), 16);
    }

    #[test]
    fn labels_for_cpu_and_gang_pods() {
        let cfg = config();
        let l = pod_labels(&input(), &cfg);
        assert_eq!(l["iris.task_id"], "alice.train.0");
        assert_eq!(l["iris.job_id"], "alice.train");
        assert_eq!(l["iris.attempt_id"], "0");
        assert_eq!(l["iris-iris-managed"], "true");
        assert_eq!(l[KUEUE_QUEUE_NAME], "iris-lq");
        assert_eq!(l[KUEUE_PRIORITY_CLASS], "iris-cpu-interactive");
        assert!(!l.contains_key(KUEUE_POD_GROUP_NAME));

        let gang = PodInput {
            task_id: "/alice/train/3".into(),
            task_index: 3,
            num_tasks: 8,
            gpu_count: 8,
            gpu_variant: "H100".into(),
            group_by: Some("leafgroup".into()),
            band: Band::Batch,
            ..input()
        };
        let l = pod_labels(&gang, &cfg);
        assert_eq!(l[KUEUE_POD_GROUP_NAME], pod_group_name("/alice/train", 0));
        assert_eq!(l[KUEUE_POD_GROUP_POD_INDEX], "3");
        assert_eq!(l[KUEUE_PRIORITY_CLASS], "iris-coscheduled-batch");
        assert_eq!(l[LABEL_GPU_VARIANT], "H100");
        assert!(pod_group_name("/alice/train", 2).starts_with("iris-pg-"));
        assert!(pod_group_name("/alice/train", 2).ends_with("-2"));
    }

    #[test]
    fn annotations_for_each_kind_of_pod() {
        let cfg = config();
        let a = pod_annotations(&input(), &cfg).unwrap();
        assert_eq!(a[topology::ANNOTATION_UNCONSTRAINED], "true");
        assert_eq!(a[ANNOTATION_TASK_ID], "/alice/train/0");
        let gpu = PodInput {
            gpu_count: 1,
            ..input()
        };
        let a = pod_annotations(&gpu, &cfg).unwrap();
        assert_eq!(a[topology::ANNOTATION_PREFERRED], "kubernetes.io/hostname");
        assert!(!a.contains_key(topology::ANNOTATION_UNCONSTRAINED));
        let gang = PodInput {
            num_tasks: 8,
            gpu_count: 8,
            group_by: Some("leafgroup".into()),
            ..input()
        };
        let a = pod_annotations(&gang, &cfg).unwrap();
        assert_eq!(a[KUEUE_POD_GROUP_TOTAL_COUNT], "8");
        assert_eq!(a[topology::ANNOTATION_PREFERRED], topology::LABEL_LEAFGROUP);
    }

    #[test]
    fn env_precedence_and_downward_api() {
        let mut cfg = config();
        cfg.controller_address = Some("http://iris-controller-svc:10000".into());
        cfg.task_env = BTreeMap::from([
            ("A".into(), "cluster".into()),
            ("B".into(), "cluster".into()),
            ("IRIS_WORKDIR".into(), "/elsewhere".into()),
        ]);
        let inp = PodInput {
            env: BTreeMap::from([
                ("B".into(), "job".into()),
                ("C".into(), "job".into()),
                ("IRIS_NUM_TASKS".into(), "99".into()),
                ("IRIS_ADVERTISE_HOST".into(), "1.2.3.4".into()),
            ]),
            system_env: BTreeMap::from([
                ("C".into(), "system".into()),
                ("IRIS_BUNDLE_ID".into(), "abc".into()),
            ]),
            ..input()
        };
        let env = pod_env(&inp, &cfg);
        let plain: BTreeMap<&str, &str> = env
            .iter()
            .filter_map(|e| e.value.as_deref().map(|v| (e.name.as_str(), v)))
            .collect();
        assert_eq!(plain["A"], "cluster");
        assert_eq!(plain["B"], "job");
        assert_eq!(plain["C"], "system");
        assert_eq!(plain["IRIS_WORKDIR"], "/app");
        assert_eq!(plain["IRIS_NUM_TASKS"], "1");
        assert_eq!(plain["IRIS_TASK_ID"], "/alice/train/0:0");
        assert_eq!(plain["IRIS_BUNDLE_ID"], "abc");
        assert_eq!(
            plain["IRIS_CONTROLLER_URL"],
            "http://iris-controller-svc:10000"
        );
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names
                .iter()
                .filter(|n| **n == "IRIS_ADVERTISE_HOST")
                .count(),
            1
        );
        let tail: Vec<(&str, &str)> = env[env.len() - 2..]
            .iter()
            .map(|e| {
                let path = e
                    .value_from
                    .as_ref()
                    .and_then(|v| v.field_ref.as_ref())
                    .map(|f| f.field_path.as_str())
                    .unwrap_or("");
                (e.name.as_str(), path)
            })
            .collect();
        assert_eq!(
            tail,
            vec![
                ("IRIS_ADVERTISE_HOST", "status.podIP"),
                ("IRIS_NODE_NAME", "spec.nodeName")
            ]
        );
    }

    #[test]
    fn resources_and_host_network() {
        let gpu = PodInput {
            gpu_count: 8,
            gpu_variant: "H100".into(),
            cpu_millicores: 32_000,
            memory_bytes: 0,
            disk_bytes: 100 * GIB + 5,
            ..input()
        };
        let mut cfg = config();
        let pod = build_pod(&gpu, &cfg).unwrap();
        let s = spec(&pod);
        let r = s.containers[0].resources.clone().unwrap();
        let limits = r.limits.unwrap();
        let requests = r.requests.unwrap();
        assert_eq!(requests["cpu"], Quantity("32000m".into()));
        assert!(!limits.contains_key("cpu"));
        assert_eq!(limits[GPU_RESOURCE], Quantity("8".into()));
        assert!(!limits.contains_key(RDMA_RESOURCE));
        assert_eq!(limits["ephemeral-storage"], Quantity("100Gi".into()));
        assert_eq!(s.host_network, None);
        assert_eq!(s.dns_policy, None);
        let shm = s
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "dshm")
            .unwrap();
        assert_eq!(
            shm.empty_dir.as_ref().unwrap().size_limit,
            Some(Quantity("100Gi".into()))
        );
        assert_eq!(s.tolerations.as_ref().map(Vec::len), Some(2));

        cfg.host_network = true;
        let pod = build_pod(&gpu, &cfg).unwrap();
        let s = spec(&pod);
        let limits = s.containers[0].resources.clone().unwrap().limits.unwrap();
        assert_eq!(limits[RDMA_RESOURCE], Quantity("8".into()));
        assert_eq!(s.host_network, Some(true));
        assert_eq!(s.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));

        let tiny_disk = PodInput {
            disk_bytes: 10,
            ..input()
        };
        let pod = build_pod(&tiny_disk, &config()).unwrap();
        let r = spec(&pod).containers[0].resources.clone().unwrap();
        assert_eq!(
            r.requests.unwrap()["ephemeral-storage"],
            Quantity("1Gi".into())
        );
        let mem = r.limits.unwrap();
        assert_eq!(mem["memory"], Quantity((1u64 << 30).to_string()));
    }

    #[test]
    fn node_selector_from_constraints() {
        let cfg = config();
        let inp = PodInput {
            constraints: vec![
                NodeConstraint::Eq {
                    key: "pool".into(),
                    value: "h100-a".into(),
                },
                NodeConstraint::Eq {
                    key: "region".into(),
                    value: "US-EAST-04".into(),
                },
                NodeConstraint::Other {
                    key: "tpu-name".into(),
                    op: "EXISTS".into(),
                },
                NodeConstraint::Eq {
                    key: "zone".into(),
                    value: "z".into(),
                },
            ],
            ..input()
        };
        let pod = build_pod(&inp, &cfg).unwrap();
        let sel = spec(&pod).node_selector.clone().unwrap();
        assert_eq!(
            sel,
            BTreeMap::from([
                ("iris-iris-managed".to_string(), "true".to_string()),
                ("iris.pool".to_string(), "h100-a".to_string()),
                ("iris.region".to_string(), "US-EAST-04".to_string()),
            ])
        );
        let bad = PodInput {
            constraints: vec![NodeConstraint::Other {
                key: "region".into(),
                op: "NE".into(),
            }],
            ..input()
        };
        assert_eq!(
            build_pod(&bad, &cfg).unwrap_err().to_string(),
            "constraint region NE cannot become a nodeSelector: only EQ is supported for region"
        );
    }

    #[test]
    fn deadline_only_for_non_gang_pods_with_a_timeout() {
        let mut cfg = config();
        cfg.deadline_grace_seconds = 300;
        let t = PodInput {
            timeout_seconds: Some(3600),
            ..input()
        };
        assert_eq!(
            spec(&build_pod(&t, &cfg).unwrap()).active_deadline_seconds,
            Some(3900)
        );
        let zero = PodInput {
            timeout_seconds: Some(0),
            ..input()
        };
        assert_eq!(
            spec(&build_pod(&zero, &cfg).unwrap()).active_deadline_seconds,
            None
        );
        let gang = PodInput {
            timeout_seconds: Some(3600),
            num_tasks: 2,
            gpu_count: 8,
            group_by: Some("leafgroup".into()),
            ..input()
        };
        assert_eq!(
            spec(&build_pod(&gang, &cfg).unwrap()).active_deadline_seconds,
            None
        );
    }

    #[test]
    fn invalid_nvl72_gangs_fail_first() {
        // Even with no image configured, the topology error is what the user sees.
        let cfg = ProviderConfig::default();
        let gang = PodInput {
            num_tasks: 18,
            gpu_count: 4,
            gpu_variant: "GB200".into(),
            group_by: Some("nvlink.domain.sliced".into()),
            ..input()
        };
        assert_eq!(
            build_pod(&gang, &cfg).unwrap_err().to_string(),
            "18 nodes would place 2 racks of 9, but a rack slice must exceed half a rack (10+ of 18 nodes) \
             to keep one slice per rack; use a larger gang (e.g. 20, 24, 32, 48)"
        );
        let half = PodInput {
            num_tasks: 32,
            gpu_count: 2,
            ..gang.clone()
        };
        assert!(build_pod(&half, &cfg)
            .unwrap_err()
            .to_string()
            .ends_with("(4 GPUs each); got 2"));
        let unknown = PodInput {
            group_by: Some("rack".into()),
            ..gang
        };
        assert!(matches!(
            build_pod(&unknown, &cfg),
            Err(ManifestError::UnknownGroupBy { .. })
        ));
        assert_eq!(build_pod(&input(), &cfg), Err(ManifestError::MissingImage));
    }

    #[test]
    fn priority_class_and_overrides() {
        let mut cfg = config();
        let pod = build_pod(
            &PodInput {
                band: Band::System,
                ..input()
            },
            &cfg,
        )
        .unwrap();
        assert_eq!(
            spec(&pod).priority_class_name.as_deref(),
            Some("iris-system")
        );
        cfg.priority_classes.insert("batch".into(), "cw-low".into());
        let pod = build_pod(
            &PodInput {
                band: Band::Batch,
                ..input()
            },
            &cfg,
        )
        .unwrap();
        assert_eq!(spec(&pod).priority_class_name.as_deref(), Some("cw-low"));
        assert_eq!(cfg.band_for_priority_class("cw-low"), Some(Band::Batch));
        assert_eq!(cfg.band_for_priority_class("iris-batch"), None);
        assert_eq!(
            cfg.band_for_priority_class("iris-production"),
            Some(Band::Production)
        );
    }

    #[test]
    fn script_quotes_argv_and_runs_setup_first() {
        let inp = PodInput {
            setup_commands: vec!["uv sync".into()],
            argv: vec![
                "echo".into(),
                "it's".into(),
                "a b".into(),
                "".into(),
                "x=1".into(),
            ],
            ..input()
        };
        let s = task_script(&inp);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            &lines[..4],
            &["set -e", "ulimit -c 0", "cd /app", "uv sync"]
        );
        assert_eq!(
            lines.last().copied(),
            Some(r#"exec echo 'it'"'"'s' 'a b' '' x=1"#)
        );
    }

    #[test]
    fn pdb_only_for_coordinators() {
        let cfg = config();
        let pdb = build_pdb(
            &PodInput {
                band: Band::Production,
                ..input()
            },
            &cfg,
        )
        .unwrap();
        let spec = pdb.spec.unwrap();
        assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
        assert_eq!(spec.max_unavailable, None);
        let pdb = build_pdb(
            &PodInput {
                band: Band::Batch,
                ..input()
            },
            &cfg,
        )
        .unwrap();
        assert_eq!(pdb.spec.unwrap().max_unavailable, Some(IntOrString::Int(1)));
        assert!(build_pdb(
            &PodInput {
                gpu_count: 1,
                ..input()
            },
            &cfg
        )
        .is_none());
        assert!(build_pdb(
            &PodInput {
                num_tasks: 2,
                ..input()
            },
            &cfg
        )
        .is_none());
    }

    #[test]
    fn secrets_are_mounted_and_owned_by_the_pod() {
        let cfg = config();
        assert!(build_secret(&input(), &cfg, None).is_none());
        let inp = PodInput {
            secrets: BTreeMap::from([("WANDB_API_KEY".into(), "s3cr3t".into())]),
            ..input()
        };
        let pod = build_pod(&inp, &cfg).unwrap();
        let pod_name = pod.metadata.name.clone().unwrap();
        let vol = spec(&pod)
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "task-secrets")
            .unwrap();
        assert_eq!(
            vol.secret.as_ref().unwrap().secret_name,
            Some(format!("{pod_name}-secrets"))
        );
        let secret = build_secret(&inp, &cfg, Some("uid-1")).unwrap();
        assert_eq!(secret.metadata.name, Some(format!("{pod_name}-secrets")));
        let owner = &secret.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Pod", pod_name.as_str(), "uid-1")
        );
    }
}
