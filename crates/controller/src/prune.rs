//! The retention sweep: every `prune_interval`, finished job trees older than `job_retention`
//! are deleted in batches (one transaction each, so the tick and submissions interleave), with
//! their cached specs and their log lines. Which trees qualify is the store's rule
//! ([`iris_store::prune`]).

use crate::error::Result;
use crate::{lock, Controller};
use std::sync::Arc;
use std::time::Duration;

pub(crate) const DEFAULT_JOB_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
pub(crate) const DEFAULT_PRUNE_INTERVAL: Duration = Duration::from_secs(3600);

/// Job trees deleted per transaction.
const BATCH: usize = 200;

pub(crate) async fn periodic(
    ctl: Arc<Controller>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let Some(retention) = ctl.cfg.job_retention else {
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(ctl.cfg.prune_interval) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        let c = ctl.clone();
        match tokio::task::spawn_blocking(move || c.prune_finished(retention)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(jobs = n, "pruned finished job trees past their retention"),
            Ok(Err(e)) => tracing::error!(error = %e, "pruning finished jobs failed"),
            Err(e) => tracing::error!(error = %e, "pruning finished jobs panicked"),
        }
    }
}

impl Controller {
    /// Deletes every finished job tree older than `retention`; the number of trees deleted.
    pub(crate) fn prune_finished(&self, retention: Duration) -> Result<usize> {
        let cutoff = iris_store::now_ms()
            .saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
        let mut total = 0;
        loop {
            let roots = {
                let snap = lock(&self.snap);
                let tx = snap.begin_read()?;
                iris_store::prune::prunable_roots(&tx, cutoff, BATCH)?
            };
            if roots.is_empty() {
                break;
            }
            {
                let mut conn = self.db();
                let tx = conn.begin()?;
                iris_store::prune::delete_trees(&tx, &roots)?;
                tx.commit()?;
            }
            {
                // The roots' own specs go; their children's age out of the cache (a job id
                // used again gets its new spec at admission, so nothing stale is read).
                let mut specs = lock(&self.specs);
                for r in &roots {
                    specs.remove(r);
                }
            }
            for r in &roots {
                self.forget_logs(r);
            }
            total += roots.len();
            self.metrics.pruned(roots.len());
            // Let a waiting tick or admission batch take the DB between batches.
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(total)
    }
}
