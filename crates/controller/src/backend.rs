//! In-process backends: something other than worker daemons that runs attempts (Kubernetes).
//!
//! A backend sits behind the same reconcile contract as a worker: it registers as one pseudo
//! worker (its capacity and attributes), receives the complete desired set of attempts on every
//! round, and answers with observations. It may also report task events (with their own source,
//! e.g. `k8s/kueue`) and log lines, which the controller stores exactly as it stores a worker's.
//! The controller crate knows nothing about Kubernetes: the implementation lives in its own
//! crate and is handed in with [`Controller::add_backend`].

use crate::{lock, Controller};
use futures::future::BoxFuture;
use iris_proto::cluster::controller as c;
use iris_proto::cluster::worker as w;
use iris_rpc::RpcError;
use std::sync::Arc;

/// A task event a backend observed (shown by `task events`).
#[derive(Clone, Debug, Default)]
pub struct AttemptEvent {
    pub attempt_uid: String,
    /// `INFO`, `WARNING`, ...
    pub kind: String,
    pub reason: String,
    pub message: String,
    /// Where it came from, e.g. `k8s/kueue`, `k8s/container`, `k8s/disruption`.
    pub source: String,
}

/// Log lines of one attempt (`key` = `/user/job/<task>:<attempt>`).
#[derive(Clone, Debug, Default)]
pub struct AttemptLogs {
    pub key: String,
    /// `(source, data, epoch_ms, client_seq)`: `client_seq` makes re-sent lines idempotent.
    pub lines: Vec<(String, String, i64, i64)>,
}

/// One reconcile answer.
#[derive(Clone, Debug, Default)]
pub struct BackendReport {
    pub observed: Vec<w::AttemptObservation>,
    pub events: Vec<AttemptEvent>,
    pub logs: Vec<AttemptLogs>,
}

/// An in-process backend.
pub trait Backend: Send + Sync {
    /// The pseudo worker id it registers as (also its `backend_id`).
    fn worker_id(&self) -> String;
    /// Capacity and attributes to register (refreshed every round).
    fn registration(&self) -> BoxFuture<'_, Result<c::RegisterRequest, RpcError>>;
    /// Makes the backend's attempts match `desired` and reports what it observes.
    fn reconcile(
        &self,
        desired: Vec<w::DesiredAttempt>,
    ) -> BoxFuture<'_, Result<BackendReport, RpcError>>;
    /// What `ListBackends` shows for it.
    fn summary(&self) -> BoxFuture<'_, Result<c::BackendSummary, RpcError>>;
}

/// The address a backend's pseudo worker row carries: never dialled.
pub(crate) fn address_of(id: &str) -> String {
    format!("inproc://{id}")
}

/// Whether a worker address is a backend's pseudo worker (pooled: Kueue places its work).
pub(crate) fn is_inproc_address(address: &str) -> bool {
    address.starts_with("inproc://")
}

impl Controller {
    /// Registers an in-process backend and starts reconciling it.
    pub async fn add_backend(&self, b: Arc<dyn Backend>) -> Result<(), RpcError> {
        let id = b.worker_id();
        lock(&self.backends).insert(id.clone(), b.clone());
        self.register_backend(&b).await.map_err(|e| e.to_wire())?;
        crate::reconcile::ensure_reconciler(self, &id);
        self.wake();
        Ok(())
    }

    pub(crate) async fn register_backend(&self, b: &Arc<dyn Backend>) -> crate::error::Result<()> {
        let mut req = b.registration().await?;
        req.worker_id = b.worker_id();
        req.address = address_of(&req.worker_id);
        let md = req.metadata.clone().unwrap_or_default();
        crate::reconcile::upsert_worker(self, &req, &md)
    }

    pub(crate) fn backend(&self, worker_id: &str) -> Option<Arc<dyn Backend>> {
        lock(&self.backends).get(worker_id).cloned()
    }

    pub(crate) fn backend_list(&self) -> Vec<Arc<dyn Backend>> {
        lock(&self.backends).values().cloned().collect()
    }
}
