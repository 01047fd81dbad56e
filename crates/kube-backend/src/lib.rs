//! The Kubernetes backend (reference federation-k8s §3): no worker daemons; the controller makes
//! one Pod per task attempt, Kueue admits it (gangs whole, by priority tier) and Kubernetes
//! places it.
//!
//! It implements [`iris_backend::Backend`] once per device lane (one per GPU variant, one for
//! CPU work; no worker rows): each lane registers a placement target whose capacity is
//! effectively unbounded (placement and preemption belong to Kueue, so the controller's
//! scheduler only turns pending tasks into attempts), it receives the desired set of attempts
//! each round and
//! * applies the Pod (server-side apply, deterministic name from task, attempt and uid, so a
//!   retried apply is idempotent) and, for coordinator tasks, its PodDisruptionBudget;
//! * deletes the exact Pod of an attempt that is no longer wanted (gangs: every pod of the group
//!   and its Workload);
//! * maps what it watches (kube-runtime reflectors over Pods and Kueue Workloads) to attempt
//!   observations with `iris_kube_model::status`, records Kueue / container / disruption events,
//!   and gives up on a pod missing for three scans;
//! * streams each attempt's `task` container log through the API into the controller's log
//!   store (no sidecar), so `job logs` works as on workers.
//!
//! Pod manifests, priority classes, topology arithmetic and status mapping are pure
//! (`iris-kube-model`); this crate is only the I/O.
//!
//! Modules by role: `connect` (client, cluster objects, watches), `pods` (apply and delete of an
//! attempt's Pod), `reconcile` (one round: apply, delete, observe), `logs` (log shipping) and
//! `summary` (registration and `ListBackends` summary).

mod connect;
mod logs;
#[cfg(test)]
mod parity;
mod pods;
mod reconcile;
mod summary;

pub use connect::{client, connect};

use futures::future::BoxFuture;
use iris_backend::{Backend, DesiredAttempt, Error, Registration, Report, Summary};
use iris_kube_model as km;
use iris_proto::job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::Store;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// The label scoping pods to one device lane (so two backends never collect each other's).
pub const LABEL_BACKEND: &str = "iris.backend";
const FIELD_MANAGER: &str = "iris-controller";
/// A running pod's log is read at most this often; a finished pod's once, at the end.
const LOG_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);
/// Pod applies in flight per reconcile round.
const APPLY_CONCURRENCY: usize = 32;
const KUEUE_GROUP: &str = "kueue.x-k8s.io";
const KUEUE_VERSION: &str = "v1beta1";

/// `kubernetes_provider` settings the backend needs.
#[derive(Clone, Debug)]
pub struct KubeSettings {
    /// Pod layout (namespace, label prefix, host networking, caches, images, priority classes,
    /// topologies).
    pub provider: km::ProviderConfig,
    /// `kubernetes_provider.kueue.cluster_queue` (required).
    pub cluster_queue: String,
    /// GPU variants the cluster's scale groups offer (`H100`, `GB200`); one lane each,
    /// plus one for CPU work.
    pub gpu_variants: Vec<String>,
    /// Scale group names, for `ListBackends`.
    pub scale_groups: Vec<String>,
    /// Where pods reach the controller (`IRIS_CONTROLLER_URL`).
    pub controller_url: String,
}

/// What startup found missing among the admin-owned Kueue objects (reported, never created).
#[derive(Clone, Debug, Default)]
pub struct Preflight {
    pub missing: Vec<String>,
}

/// Connection and watch state shared by the backend's device lanes.
struct Core {
    client: kube::Client,
    settings: KubeSettings,
    pods: Api<Pod>,
    pdbs: Api<PodDisruptionBudget>,
    /// Per-pod Secrets holding a job's secrets (owned by their pod).
    secrets: Api<Secret>,
    /// Per-pod ConfigMaps holding a job's workdir files (owned by their pod).
    config_maps: Api<ConfigMap>,
    workloads: Api<DynamicObject>,
    pod_store: Store<Pod>,
    workload_store: Store<DynamicObject>,
    /// The last version seen of every pod that ended (or was marked for disruption), kept after
    /// it is deleted: a preempted pod is often gone before the next scan, and its final state
    /// still says what happened.
    last_seen: Arc<Mutex<HashMap<String, Pod>>>,
}

#[derive(Default)]
struct State {
    /// The run request of each attempt uid (sent once, on assignment).
    requests: HashMap<String, job::RunTaskRequest>,
    /// Pod name per attempt uid, once applied.
    applied: HashMap<String, String>,
    missing: km::MissingTracker,
    /// Log lines already shipped per pod.
    log_lines: HashMap<String, usize>,
    /// Pods whose final log has been shipped.
    log_done: BTreeSet<String>,
    /// When a running pod's log was last read (read at most every [`LOG_PERIOD`]).
    log_read_at: HashMap<String, std::time::Instant>,
    /// Events already recorded, per attempt uid.
    events: HashMap<String, BTreeSet<String>>,
    /// Manifest errors per attempt uid (the attempt fails with it).
    manifest_errors: HashMap<String, String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unavailable(what: &str, e: kube::Error) -> Error {
    Error::transient(format!("kubernetes: {what}")).caused_by(e)
}

/// One device lane of the Kubernetes backend.
pub struct KubeBackend {
    core: Arc<Core>,
    /// This lane's own bookkeeping (its pods carry its `iris.backend` label).
    state: Mutex<State>,
    id: String,
    /// `None`: the CPU lane.
    variant: Option<String>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Backend for KubeBackend {
    fn backend_id(&self) -> String {
        self.id.clone()
    }

    fn registration(&self) -> BoxFuture<'_, Result<Registration, Error>> {
        Box::pin(async move { Ok(self.registration_now()) })
    }

    fn reconcile(&self, desired: Vec<DesiredAttempt>) -> BoxFuture<'_, Result<Report, Error>> {
        Box::pin(self.reconcile_now(desired))
    }

    fn summary(&self) -> BoxFuture<'_, Result<Summary, Error>> {
        Box::pin(self.summary_now())
    }

    /// A gang's Kueue topology annotations are computed now, with the pods' own rule: a shape
    /// the arithmetic rejects (an NVL72 gang that cannot split into rack slices, a required
    /// single-rack gang over 16 nodes, an unknown level) is refused with its reason.
    fn check_job(&self, job: &iris_backend::JobShape<'_>) -> Result<(), String> {
        let Some(group_by) = job.group_by else {
            return Ok(());
        };
        km::topology::annotations(
            group_by,
            job.replicas,
            job.gpus_per_task,
            self.core.settings.provider.kueue_topologies.as_ref(),
        )
        .map(|_| ())
        .map_err(|e| {
            format!(
                "coscheduling.group_by `{group_by}` with {} replicas: {e}",
                job.replicas
            )
        })
    }
}
