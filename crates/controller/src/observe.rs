//! The observation writer: what every worker reports in its reconcile answer (attempt
//! observations and its heartbeat) is committed by one thread, many workers' reports per
//! transaction (group commit, as submissions are in `crate::admission`).
//!
//! Before, each reconcile loop took the writer connection itself, on the async runtime, for one
//! transaction per worker per round: with thousands of workers the runtime's threads sat waiting
//! for SQLite and submissions queued behind a commit per worker (BENCHMARKS.md, "C1M shape").

use crate::Controller;
use iris_store::apply::{self, Observation};
use std::sync::Weak;
use tokio::sync::{mpsc, oneshot};

/// Reports committed in one transaction at most.
const MAX_BATCH: usize = 512;

/// One worker's reconcile answer on its way to the store.
pub(crate) struct Report {
    worker_id: String,
    observed: Vec<Observation>,
    /// Whether any observation changed state; `None` if the answer could not be stored.
    reply: oneshot::Sender<Option<bool>>,
}

pub(crate) type Sender = mpsc::UnboundedSender<Report>;

/// Starts the writer thread. It ends when the controller is dropped (the channel's only sender
/// lives in the controller).
pub(crate) fn start(
    weak: Weak<Controller>,
    mut rx: mpsc::UnboundedReceiver<Report>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("iris-observe".into())
        .spawn(move || {
            while let Some(first) = rx.blocking_recv() {
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(r) => batch.push(r),
                        Err(_) => break,
                    }
                }
                let Some(ctl) = weak.upgrade() else { return };
                let reports: Vec<(&str, &[Observation])> = batch
                    .iter()
                    .map(|r| (r.worker_id.as_str(), r.observed.as_slice()))
                    .collect();
                let changed = apply_reports(&ctl, &reports);
                drop(reports);
                for (r, changed) in batch.into_iter().zip(changed) {
                    // The loop that sent it may have ended meanwhile: nothing to tell.
                    let _ = r.reply.send(changed);
                }
            }
        })?;
    Ok(())
}

impl Controller {
    /// Commits a worker's observations and heartbeat through the writer: whether any
    /// observation changed state, or `None` if they could not be stored (logged).
    pub(crate) async fn observe(
        &self,
        worker_id: &str,
        observed: Vec<Observation>,
    ) -> Option<bool> {
        let (reply, answer) = oneshot::channel();
        let report = Report {
            worker_id: worker_id.to_string(),
            observed,
            reply,
        };
        if self.observations.send(report).is_err() {
            return None; // the controller is shutting down
        }
        answer.await.ok().flatten()
    }
}

/// Applies `reports` (worker, observations) and marks each worker alive, all in one
/// transaction; returns, per report, whether it changed state (`None`: not stored). If that
/// transaction fails, each report is applied in its own, so that one bad report cannot hold
/// back the others.
pub(crate) fn apply_reports(
    ctl: &Controller,
    reports: &[(&str, &[Observation])],
) -> Vec<Option<bool>> {
    let now = iris_store::now_ms();
    let mut conn = ctl.db();
    let together = (|| -> iris_store::Result<Vec<Option<bool>>> {
        let tx = conn.begin()?;
        let mut out = Vec::with_capacity(reports.len());
        for (worker_id, observed) in reports {
            out.push(Some(apply_one(&tx, worker_id, observed, now)?));
        }
        tx.commit()?;
        Ok(out)
    })();
    let changed = match together {
        Ok(out) => out,
        Err(e) if reports.len() == 1 => {
            tracing::error!(worker = %reports[0].0, error = %e, "applying reconcile response");
            vec![None]
        }
        Err(_) => reports
            .iter()
            .map(|(worker_id, observed)| {
                let one = (|| -> iris_store::Result<bool> {
                    let tx = conn.begin()?;
                    let changed = apply_one(&tx, worker_id, observed, now)?;
                    tx.commit()?;
                    Ok(changed)
                })();
                one.map_err(|e| {
                    tracing::error!(worker = %worker_id, error = %e, "applying reconcile response");
                })
                .ok()
            })
            .collect(),
    };
    changed
}

fn apply_one(
    tx: &iris_store::Tx<'_>,
    worker_id: &str,
    observed: &[Observation],
    now: i64,
) -> iris_store::Result<bool> {
    let mut changed = false;
    for obs in observed {
        changed |= apply::apply_observation(tx, worker_id, obs, now)?;
    }
    iris_store::workers::heartbeat(tx, worker_id, now)?;
    Ok(changed)
}
