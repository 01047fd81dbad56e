//! The observation writer: what every worker reports in its reconcile answer (attempt
//! observations and its heartbeat) is committed by one thread, many workers' reports per
//! transaction (group commit, as submissions are in `crate::admission`).
//!
//! Before, each reconcile loop took the writer connection itself, on the async runtime, for one
//! transaction per worker per round: with thousands of workers the runtime's threads sat waiting
//! for SQLite and submissions queued behind a commit per worker (BENCHMARKS.md, "C1M shape").

use crate::Controller;
use iris_store::apply::{self, Observation};
use tokio::sync::{mpsc, oneshot};

/// One worker's reconcile answer on its way to the store.
pub(crate) struct Report {
    worker_id: String,
    observed: Vec<Observation>,
    /// Whether any observation changed state; `None` if the answer could not be stored.
    reply: oneshot::Sender<Option<bool>>,
}

pub(crate) type Sender = mpsc::UnboundedSender<Report>;

/// Commits one batch of reports (up to 512, `crate::spawn_batcher`) and tells each sender.
pub(crate) fn write_batch(ctl: &Controller, batch: Vec<Report>) {
    let reports: Vec<(&str, &[Observation])> = batch
        .iter()
        .map(|r| (r.worker_id.as_str(), r.observed.as_slice()))
        .collect();
    let changed = apply_reports(ctl, &reports);
    drop(reports);
    for (r, changed) in batch.into_iter().zip(changed) {
        // The loop that sent it may have ended meanwhile: nothing to tell.
        let _ = r.reply.send(changed);
    }
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
    match in_one_tx(&mut conn, reports, now) {
        Ok(changed) => changed.into_iter().map(Some).collect(),
        Err(e) if reports.len() == 1 => {
            tracing::error!(worker = %reports[0].0, error = %e, "applying reconcile response");
            vec![None]
        }
        Err(e) => {
            tracing::warn!(reports = reports.len(), error = %e, "applying a batch of reconcile responses; retrying each alone");
            reports
                .iter()
                .map(|r| match in_one_tx(&mut conn, std::slice::from_ref(r), now) {
                    Ok(changed) => changed.first().copied(),
                    Err(e) => {
                        tracing::error!(worker = %r.0, error = %e, "applying reconcile response");
                        None
                    }
                })
                .collect()
        }
    }
}

/// Applies `reports` in one transaction: per report, whether it changed state.
fn in_one_tx(
    conn: &mut iris_store::Db,
    reports: &[(&str, &[Observation])],
    now: i64,
) -> iris_store::Result<Vec<bool>> {
    let tx = conn.begin()?;
    let mut out = Vec::with_capacity(reports.len());
    // Each job the batch touched is rolled up once, after all of the batch's reports.
    let mut rollups = apply::JobRollups::default();
    for (worker_id, observed) in reports {
        out.push(apply_one(&tx, worker_id, observed, now, &mut rollups)?);
    }
    rollups.finish(&tx, now)?;
    tx.commit()?;
    Ok(out)
}

fn apply_one(
    tx: &iris_store::Tx<'_>,
    worker_id: &str,
    observed: &[Observation],
    now: i64,
    rollups: &mut apply::JobRollups,
) -> iris_store::Result<bool> {
    let mut changed = false;
    for obs in observed {
        changed |= apply::apply_observation_deferred(tx, worker_id, obs, now, rollups)?;
    }
    iris_store::workers::heartbeat(tx, worker_id, now)?;
    Ok(changed)
}
