//! What a manifest is built from: the attempt's [`PodInput`] (what the controller decided), its
//! [`NodeConstraint`]s, and the [`ProviderConfig`] (the `kubernetes_provider` section of the
//! cluster config).

use crate::priority;
use crate::topology::TopologyMap;
use iris_types::Band;
use std::collections::BTreeMap;

/// A scheduling constraint, as far as a nodeSelector cares.
///
/// Only `pool` and `region` map to node labels
/// ([`NODE_LABEL_POOL`](super::NODE_LABEL_POOL), [`NODE_LABEL_REGION`](super::NODE_LABEL_REGION));
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
    /// The attempt's uid (20 hex digits; 16 from earlier releases); empty leaves it out of the
    /// pod name.
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
    /// A TPU pod (a `tpu` device): the accelerator priority class, `SYS_RESOURCE` for locked
    /// memory, the `/dev/shm` fallback size and no PDB, as GPU pods.
    pub tpu: bool,
    /// Coscheduling level; `Some` makes the pod a gang member.
    pub group_by: Option<String>,
    /// Constraints that may map to a nodeSelector.
    pub constraints: Vec<NodeConstraint>,
    /// Task timeout in seconds; `None` or 0 means none.
    pub timeout_seconds: Option<u64>,
    /// Image override; `None` uses the cluster's default task image.
    pub task_image: Option<String>,
    /// Job secrets, mounted read-only under [`SECRETS_MOUNT_PATH`](super::SECRETS_MOUNT_PATH)
    /// from `<pod>-secrets`.
    pub secrets: BTreeMap<String, String>,
    /// The bundle to unpack into `/app` (empty: none), by the `stage-workdir` init container.
    pub bundle_id: String,
    /// Workdir files (relative path → contents), staged from the per-pod ConfigMap `<pod>-wf`.
    pub workdir_files: BTreeMap<String, Vec<u8>>,
    /// Workdir files the controller holds (relative path → SHA-256), fetched from its blobs.
    pub workdir_file_refs: BTreeMap<String, String>,
}

impl PodInput {
    /// True when the pod belongs to a coscheduled gang.
    pub fn is_gang(&self) -> bool {
        self.group_by.is_some()
    }

    /// True for a "coordinator": a single-task job without accelerators (gets a PDB).
    pub fn is_coordinator(&self) -> bool {
        self.num_tasks <= 1 && !self.has_accelerator()
    }

    /// True for a GPU or TPU pod.
    pub fn has_accelerator(&self) -> bool {
        self.gpu_count > 0 || self.tpu
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
