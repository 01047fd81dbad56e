//! The one piece of shared state: the object store plus the simulation's bookkeeping, behind a
//! mutex that is never held across an `.await`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::kubelet::Kubelet;
use crate::kueue::KueueState;
use crate::sim::SimState;
use crate::store::Store;
use crate::RecordedRequest;

/// Settings the simulation reads on every tick; some change at run time through the handle.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub gpu_quota: Option<u64>,
    pub bad_images: BTreeSet<String>,
    pub max_termination_grace: Duration,
    pub kueue_pod_finalizer: bool,
    pub require_local_queue: bool,
    pub run_init_containers: bool,
    pub cluster_queue: String,
    pub resource_flavor: String,
    pub auto_create_namespaces: bool,
    pub work_dir: PathBuf,
    pub bookmark_interval: Duration,
    pub port: u16,
}

impl Settings {
    pub(crate) fn is_bad_image(&self, image: &str) -> bool {
        image.contains("does-not-exist") || self.bad_images.contains(image)
    }
}

pub(crate) struct Cluster {
    pub store: Store,
    pub settings: Settings,
    pub kubelet: Kubelet,
    pub kueue: KueueState,
    pub requests: Vec<RecordedRequest>,
    pub sim: SimState,
}

pub(crate) struct Shared {
    cluster: Mutex<Cluster>,
    /// Wakes the simulation loop early after a write.
    pub kick: Notify,
    pub shutdown: watch::Sender<bool>,
}

impl Shared {
    pub(crate) fn new(cluster: Cluster) -> Self {
        let (shutdown, _) = watch::channel(false);
        Self {
            cluster: Mutex::new(cluster),
            kick: Notify::new(),
            shutdown,
        }
    }

    /// Locks the cluster. A panic while holding the lock (a bug) must not wedge every later
    /// request, so a poisoned lock is recovered.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Cluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}
