//! The contract between the controller and an in-process backend: something other than worker
//! daemons that runs attempts (today Kubernetes, in `iris-kube-backend`).
//!
//! A backend sits behind the same reconcile contract as a worker, but it is not a worker: it
//! has no worker row and `ListWorkers` does not list it. It registers a placement target
//! ([`Registration`]: capacity and attributes, which the scheduler treats as a pool that places
//! work itself), receives the complete desired set of its attempts on every round
//! ([`DesiredAttempt`]; its attempts have no worker and name the backend), and answers with
//! facts ([`Report`]:
//! [`Observation`]s, plus task events with their own source, e.g. `k8s/kueue`, and log lines,
//! which the controller stores exactly as it stores a worker's). It also describes itself for
//! `ListBackends` ([`Summary`]).
//!
//! Architecture Invariant: backends report facts and never decide retries; what a fact means
//! (retry, fail, preempt) is `iris_types::transition`'s. A failure says whether trying again
//! may help ([`Error::Transient`]) or not ([`Error::Permanent`]); the backend itself does not
//! retry. Applying the same desired set twice is harmless (launches are idempotent).
//!
//! API Boundary: the trait speaks domain types (`iris-types` and the structs here); the
//! controller converts to and from the wire in one place. The one exception is the launch
//! payload, [`Intent::Run`]'s `launch`: it stays the wire `iris.job.RunTaskRequest`, because it
//! is the launch spec that both kinds of backend consume — a worker daemon receives exactly this
//! message, and the Kubernetes backend's pure manifest builder (`iris-kube-model`) is written
//! against it. A domain launch spec would be a copy of that message plus a conversion in each
//! direction; it is wrapped instead, so everything the controller and the backend decide on
//! (which attempt, run or stop, why) is domain-typed.

#![warn(missing_docs)]

pub mod task_env;

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use iris_proto::job::RunTaskRequest;
use iris_types::{AttrValue, Band, Resources, TaskId, TaskState};

/// An in-process backend. Implementations are shared as `Arc<dyn Backend>`.
pub trait Backend: Send + Sync {
    /// Its id: the placement target the scheduler sees, the `backend_id` its attempts carry and
    /// its entry in `ListBackends`.
    fn backend_id(&self) -> String;
    /// Capacity and attributes to register (asked for again after every successful round, so
    /// capacity can follow the cluster).
    fn registration(&self) -> BoxFuture<'_, Result<Registration, Error>>;
    /// Makes the backend's attempts match `desired` (the complete set for this backend: an
    /// attempt it holds that is not listed is no longer wanted) and reports what it observes.
    fn reconcile(&self, desired: Vec<DesiredAttempt>) -> BoxFuture<'_, Result<Report, Error>>;
    /// What `ListBackends` shows for it.
    fn summary(&self) -> BoxFuture<'_, Result<Summary, Error>>;
    /// Refuses at submit, with the reason, a job this backend could never run (a gang shape its
    /// topology rules reject), so it fails fast instead of waiting. Default: no objection.
    fn check_job(&self, _job: &JobShape<'_>) -> Result<(), String> {
        Ok(())
    }
}

/// What [`Backend::check_job`] sees of a submitted job.
#[derive(Clone, Copy, Debug)]
pub struct JobShape<'a> {
    /// Tasks in the job.
    pub replicas: u32,
    /// `coscheduling.group_by`, when the job is a gang.
    pub group_by: Option<&'a str>,
    /// GPUs each task asks for.
    pub gpus_per_task: u32,
}

/// A backend failure, with whether trying again later may help.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// May succeed later, unchanged: the cluster's API was unreachable, overloaded or slow.
    #[error("{message}")]
    Transient {
        /// What failed, e.g. `kubernetes: listing nodes`.
        message: String,
        /// The underlying failure, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// Fails the same way until something else changes (a refused request, a bad setting).
    #[error("{message}")]
    Permanent {
        /// What failed.
        message: String,
        /// The underlying failure, if any.
        #[source]
        source: Option<BoxError>,
    },
}

/// The source of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl Error {
    /// A transient failure without an underlying error.
    pub fn transient(message: impl Into<String>) -> Error {
        Error::Transient {
            message: message.into(),
            source: None,
        }
    }

    /// A permanent failure without an underlying error.
    pub fn permanent(message: impl Into<String>) -> Error {
        Error::Permanent {
            message: message.into(),
            source: None,
        }
    }

    /// The same failure, caused by `source`.
    pub fn caused_by(self, source: impl Into<BoxError>) -> Error {
        match self {
            Error::Transient { message, .. } => Error::Transient {
                message,
                source: Some(source.into()),
            },
            Error::Permanent { message, .. } => Error::Permanent {
                message,
                source: Some(source.into()),
            },
        }
    }

    /// True if trying again later may help.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Transient { .. })
    }
}

/// What a backend registers as: one placement target (a pool, not a worker).
#[derive(Clone, Debug, PartialEq)]
pub struct Registration {
    /// Shown as the worker's host, e.g. `kubernetes/<namespace>`.
    pub hostname: String,
    /// Total capacity. Cpu is counted in whole cores (millicores are rounded down to cores);
    /// the accelerator count of [`Registration::device`] is `gpu` or `tpu`.
    pub capacity: Resources,
    /// Its accelerator.
    pub device: Device,
    /// Attributes constraints are matched against (`device-type`, `device-variant` and
    /// `preemptible` are added by the controller when absent).
    pub attributes: BTreeMap<String, AttrValue>,
    /// The scale group it is shown in (`kubernetes`); also its `scale-group` attribute.
    pub scale_group: String,
}

/// The accelerator of a backend's placement target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    /// No accelerator.
    Cpu,
    /// GPUs of one variant (`H100`); the count is `capacity.gpu`.
    Gpu {
        /// Device variant, as configured.
        variant: String,
    },
    /// TPU chips of one variant (`v5e`); the count is `capacity.tpu`.
    Tpu {
        /// Device variant, as configured.
        variant: String,
    },
}

/// One attempt the controller wants on this backend, from committed state.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredAttempt {
    /// The attempt's unique id (20 hex digits, the time first; 16 random ones before); fences
    /// every report.
    pub attempt_uid: String,
    /// The task it is an attempt of.
    pub task_id: TaskId,
    /// The attempt number within the task (0, 1, ...).
    pub attempt_id: u32,
    /// Run it or stop it.
    pub intent: Intent,
}

impl DesiredAttempt {
    /// The key its log lines are stored under: `/user/job/<task>:<attempt>`.
    pub fn log_key(&self) -> String {
        format!("{}:{}", self.task_id, self.attempt_id)
    }
}

/// What should happen to a desired attempt.
#[derive(Clone, Debug, PartialEq)]
pub enum Intent {
    /// Keep it running; start it if the backend does not hold it yet.
    Run {
        /// The launch spec (the wire message a worker daemon receives; see the crate docs). Sent
        /// only on the round that assigns the attempt; later rounds leave it out and the backend
        /// uses the copy it kept.
        launch: Option<Box<RunTaskRequest>>,
    },
    /// Stop it (if it still runs) and report it ended.
    Stop(StopReason),
}

/// Why an attempt is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The job or task was cancelled.
    Cancelled,
    /// A higher band preempted it.
    Preempted,
    /// A newer attempt replaced it, or the controller moved on from it.
    Superseded,
    /// Its job ended.
    JobTerminated,
    /// It ran past its timeout.
    TaskTimeout,
}

/// One reconcile answer.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The state of attempts, as observed.
    pub observed: Vec<Observation>,
    /// Task events to record.
    pub events: Vec<AttemptEvent>,
    /// New log lines.
    pub logs: Vec<AttemptLogs>,
}

/// What a backend observed about one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The attempt it is about.
    pub attempt_uid: String,
    /// The state the attempt is in.
    pub state: TaskState,
    /// The exit code of an attempt that ended, when there is one (`-1`: it ended without
    /// exiting, e.g. it never started). An ended attempt reported without one is recorded as 0.
    pub exit_code: Option<i32>,
    /// Why an ended attempt failed (empty when it did not).
    pub error: String,
    /// Why it is in that state, for `task describe` (empty when there is nothing to say).
    pub status_message: String,
}

impl Observation {
    /// An observation with no exit code, error or message.
    pub fn new(attempt_uid: impl Into<String>, state: TaskState) -> Observation {
        Observation {
            attempt_uid: attempt_uid.into(),
            state,
            exit_code: None,
            error: String::new(),
            status_message: String::new(),
        }
    }
}

/// A task event a backend observed (shown by `task events`).
#[derive(Clone, Debug, Default)]
pub struct AttemptEvent {
    /// The attempt it is about.
    pub attempt_uid: String,
    /// `INFO`, `WARNING`, ...
    pub kind: String,
    /// A short machine-readable reason (`Preempted`).
    pub reason: String,
    /// What happened, for people.
    pub message: String,
    /// Where it came from, e.g. `k8s/kueue`, `k8s/container`, `k8s/disruption`.
    pub source: String,
}

/// Log lines of one attempt.
#[derive(Clone, Debug, Default)]
pub struct AttemptLogs {
    /// `/user/job/<task>:<attempt>` ([`DesiredAttempt::log_key`]).
    pub key: String,
    /// `(source, data, epoch_ms, client_seq)`: `client_seq` makes re-sent lines idempotent.
    pub lines: Vec<(String, String, i64, i64)>,
}

/// What `ListBackends` shows for a backend (its id is [`Backend::worker_id`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// `kubernetes`.
    pub kind: String,
    /// e.g. `DIRECT_DISPATCH`.
    pub capabilities: Vec<String>,
    /// Attribute → the values this backend can satisfy (lower-case), for federation routing.
    pub advertised: BTreeMap<String, Vec<String>>,
    /// Scale groups behind it.
    pub scale_groups: Vec<String>,
    /// Machines behind it (Kubernetes: nodes).
    pub worker_count: u32,
    /// Its attempts waiting to start.
    pub pending_tasks: u32,
    /// Its attempts running.
    pub running_tasks: u32,
    /// Accelerator capacity; `None` when the backend reports none (CPU only).
    pub availability: Option<Availability>,
    /// Backend-specific detail.
    pub detail: Option<Detail>,
}

/// A backend's accelerator capacity, as of one observation. Keys are lower-case device
/// variants (`h100`); amounts are device counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Availability {
    /// When the numbers were computed (epoch ms).
    pub observed_at_ms: i64,
    /// Variant → idle devices.
    pub free: BTreeMap<String, i64>,
    /// Variant → all devices.
    pub total: BTreeMap<String, i64>,
    /// Devices in use by each band (bands using none are left out).
    pub held_by_band: BTreeMap<Band, BTreeMap<String, i64>>,
}

/// Backend-specific detail of a [`Summary`].
#[derive(Clone, Debug, PartialEq)]
pub enum Detail {
    /// The Kubernetes cluster behind the backend (also `GetKubernetesClusterStatus`).
    Kubernetes(KubernetesStatus),
}

/// A Kubernetes cluster as the backend sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KubernetesStatus {
    /// The namespace Iris's pods live in.
    pub namespace: String,
    /// Nodes in the cluster.
    pub total_nodes: u32,
    /// Nodes that accept pods.
    pub schedulable_nodes: u32,
    /// Allocatable cpu over all nodes, as shown (`12.5 cores`).
    pub allocatable_cpu: String,
    /// Allocatable memory over all nodes, as shown (`64.0 GiB`).
    pub allocatable_memory: String,
    /// This backend's pods.
    pub pods: Vec<PodStatus>,
    /// `iris-kubernetes/v1`.
    pub provider_version: String,
    /// Every node, sorted by name.
    pub nodes: Vec<NodeStatus>,
}

/// One pod of a [`KubernetesStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodStatus {
    /// Pod name.
    pub pod_name: String,
    /// The task it runs an attempt of.
    pub task_id: String,
    /// Pod phase (`Pending`, `Running`, ...).
    pub phase: String,
    /// Why it failed, if it did.
    pub reason: String,
    /// What it is waiting for or doing.
    pub message: String,
    /// The node it is bound to (empty while unbound).
    pub node_name: String,
}

/// One node of a [`KubernetesStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStatus {
    /// Node name.
    pub name: String,
    /// The Ready condition holds.
    pub ready: bool,
    /// Not cordoned.
    pub schedulable: bool,
    /// Instance type label, if any.
    pub instance_type: String,
    /// Allocatable GPUs.
    pub gpu_count: u32,
    /// GPU model label, if any.
    pub gpu_model: String,
    /// Allocatable cpu in millicores.
    pub cpu_millicores: i64,
    /// Allocatable memory in bytes.
    pub memory_bytes: i64,
    /// Allocatable ephemeral storage in bytes.
    pub disk_bytes: i64,
    /// Pods running on it.
    pub running_pods: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_whether_to_retry_and_keep_their_cause() {
        let io = std::io::Error::other("connection refused");
        let e = Error::transient("kubernetes: listing nodes").caused_by(io);
        assert!(e.is_transient());
        assert_eq!(e.to_string(), "kubernetes: listing nodes");
        let cause = std::error::Error::source(&e).map(|s| s.to_string());
        assert_eq!(cause.as_deref(), Some("connection refused"));
        let p = Error::permanent("kubernetes: bad namespace");
        assert!(!p.is_transient());
        assert!(std::error::Error::source(&p).is_none());
    }

    #[test]
    fn log_key_is_task_and_attempt() {
        let d = DesiredAttempt {
            attempt_uid: "0123456789abcdef".into(),
            task_id: TaskId::parse("/alice/train/3").expect("valid task id"),
            attempt_id: 2,
            intent: Intent::Stop(StopReason::Cancelled),
        };
        assert_eq!(d.log_key(), "/alice/train/3:2");
    }
}
