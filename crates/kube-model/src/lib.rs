//! The Kubernetes/Kueue object model of the Iris Kubernetes task provider: pure functions, no
//! I/O, no clock (reference federation-k8s §3–4).
//!
//! * [`topology`] — CoreWeave/NVL72 gang arithmetic and Kueue topology annotations;
//! * [`manifest`] — the Pod, PodDisruptionBudget and Secret of one task attempt;
//! * [`priority`] — Pod PriorityClasses, Kueue WorkloadPriorityClasses, the LocalQueue;
//! * [`status`] — what an observed Pod (and its Kueue Workload) means for the attempt;
//! * [`capacity`](mod@capacity) — GPU totals, held/free GPUs per band, node summaries;
//! * [`controller`] — the controller's own Deployment, Service and checks when it runs in the
//!   cluster.
//!
//! The controller's Kubernetes backend does the API calls; this crate decides what to send and
//! what the answers mean. Kubernetes types (`k8s-openapi`) stop here: callers get Iris types
//! (`ObservedState`, `Capacity`) back.
//!
//! **API boundary:** label, annotation and object names are what running clusters and the
//! Python Iris agree on; changing one orphans existing pods.

#![warn(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod capacity;
pub mod controller;
pub mod manifest;
pub mod priority;
pub mod status;
pub mod topology;

pub use capacity::{capacity, Capacity, NodeSummary};
pub use manifest::{
    build_pdb, build_pod, build_secret, pod_name, ManifestError, NodeConstraint, PodInput,
    ProviderConfig,
};
pub use priority::{local_queue, workload_priority_class, WorkloadKind};
pub use status::{
    observe, EventSource, MissingTracker, Observation, ObservedState, PodEvent, Severity,
};
pub use topology::{
    annotations, balanced_split, gang_level, GroupBy, TopologyBinding, TopologyError, TopologyMap,
    TopologyMode,
};
