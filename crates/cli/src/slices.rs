//! The local platform's slices: each worker of a slice is an in-process worker daemon that
//! registers with this cluster's controller; the controller's autoscaler starts and stops them
//! through [`iris_controller::SliceProvider`].

use crate::local::GroupPlan;
use std::path::PathBuf;
use std::time::Duration;

/// The local platform's slices: in-process workers registering with this cluster's controller.
pub(crate) struct LocalSlices {
    pub(crate) controller_url: String,
    pub(crate) state_dir: PathBuf,
    pub(crate) python: Option<PathBuf>,
    pub(crate) task_env: std::collections::BTreeMap<String, String>,
    pub(crate) groups: std::collections::HashMap<String, GroupPlan>,
    pub(crate) running:
        tokio::sync::Mutex<std::collections::HashMap<String, Vec<iris_worker::RunningWorker>>>,
}

impl LocalSlices {
    pub(crate) async fn start_worker(
        &self,
        g: &GroupPlan,
        id: &str,
    ) -> anyhow::Result<iris_worker::RunningWorker> {
        iris_worker::start(iris_worker::WorkerConfig {
            controller_url: self.controller_url.clone(),
            worker_id: id.to_string(),
            bind: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            cpu_count: g.cpu,
            memory_bytes: g.memory,
            disk_bytes: g.disk,
            device: g.device.clone(),
            attributes: g.attributes.clone(),
            scale_group: g.name.clone(),
            cache_dir: self.state_dir.join("workers").join(id),
            heartbeat_timeout: Duration::from_secs(60),
            python: self.python.clone(),
            task_env: self.task_env.clone(),
        })
        .await
    }

    pub(crate) async fn stop_all(&self) {
        let all: Vec<_> = self.running.lock().await.drain().collect();
        for (_, workers) in all {
            for w in workers {
                w.shutdown().await;
            }
        }
    }
}

impl iris_controller::SliceProvider for LocalSlices {
    fn create<'a>(
        &'a self,
        group: &'a str,
        slice_id: &'a str,
        worker_ids: &'a [String],
    ) -> futures::future::BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let g = self
                .groups
                .get(group)
                .ok_or_else(|| format!("no scale group {group} in this cluster's config"))?;
            let mut started = Vec::new();
            for id in worker_ids {
                match self.start_worker(g, id).await {
                    Ok(w) => started.push(w),
                    Err(e) => {
                        for w in started {
                            w.shutdown().await;
                        }
                        return Err(format!("starting worker {id}: {e:#}"));
                    }
                }
            }
            self.running
                .lock()
                .await
                .insert(slice_id.to_string(), started);
            Ok(())
        })
    }

    fn terminate<'a>(&'a self, slice_id: &'a str) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            let workers = self.running.lock().await.remove(slice_id);
            for w in workers.into_iter().flatten() {
                w.shutdown().await;
            }
        })
    }
}
