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
    /// Whether to write the worker's heartbeat with them.
    beat: bool,
    /// Whether any observation changed state; `None` if the answer could not be stored.
    reply: oneshot::Sender<Option<bool>>,
    /// When it was queued (for `iris_observation_queue_seconds`).
    sent: std::time::Instant,
}

pub(crate) type Sender = mpsc::UnboundedSender<Report>;

/// One worker's answer as the writer applies it: the worker, its observations, and whether to
/// write its heartbeat too.
pub(crate) type Answer<'a> = (&'a str, &'a [Observation], bool);

/// Commits one batch of reports (up to 512, `crate::spawn_batcher`; in transactions of about
/// [`TX_BUDGET`]) and tells each sender.
pub(crate) fn write_batch(ctl: &Controller, batch: Vec<Report>) {
    let taken = std::time::Instant::now();
    for r in &batch {
        ctl.metrics.observation_queued(taken.duration_since(r.sent));
    }
    let reports: Vec<Answer<'_>> = batch
        .iter()
        .map(|r| (r.worker_id.as_str(), r.observed.as_slice(), r.beat))
        .collect();
    let changed = apply_reports(ctl, &reports);
    drop(reports);
    for (r, changed) in batch.into_iter().zip(changed) {
        // The loop that sent it may have ended meanwhile: nothing to tell.
        let _ = r.reply.send(changed);
    }
}

impl Controller {
    /// Commits a worker's observations, and its heartbeat when `beat`, through the writer:
    /// whether any observation changed state, or `None` if they could not be stored (logged).
    pub(crate) async fn observe(
        &self,
        worker_id: &str,
        observed: Vec<Observation>,
        beat: bool,
    ) -> Option<bool> {
        let (reply, answer) = oneshot::channel();
        let report = Report {
            worker_id: worker_id.to_string(),
            observed,
            beat,
            reply,
            sent: std::time::Instant::now(),
        };
        if self.observations.send(report).is_err() {
            return None; // the controller is shutting down
        }
        answer.await.ok().flatten()
    }
}

/// How long one of the writer's transactions may keep taking reports: at least `shared`, then
/// on until `alone` has passed or another thread waits for the writer connection.
#[derive(Clone, Copy)]
pub(crate) struct TxBudget {
    pub shared: std::time::Duration,
    pub alone: std::time::Duration,
}

/// The writer connection is shared with the tick's assignments and with admission. A
/// transaction of 512 busy workers' answers held it for up to ~0.4 s at C1M shape, and
/// submissions (a few jobs per turn) waited behind transaction after transaction; but
/// transactions of 25 ms each spent a third of the writer's time committing (each writes every
/// page it dirtied to the WAL) and rolled the same jobs up again and again, and the answers
/// queued for ~12 s (BENCHMARKS.md). So a transaction runs long while nobody else waits, and
/// hands the connection over after `shared` when someone does.
pub(crate) const TX_BUDGET: TxBudget = TxBudget {
    shared: std::time::Duration::from_millis(25),
    alone: std::time::Duration::from_millis(250),
};

/// Applies `reports` (worker, observations) and marks each worker alive, in transactions of
/// [`TX_BUDGET`] each, handing the writer connection fairly to whoever waits in between;
/// returns, per report, whether it changed state (`None`: not stored). If a transaction fails,
/// its first report is applied alone, so that one bad report cannot hold back the others.
pub(crate) fn apply_reports(ctl: &Controller, reports: &[Answer<'_>]) -> Vec<Option<bool>> {
    apply_reports_within(ctl, reports, TX_BUDGET)
}

/// [`apply_reports`] with transactions of `budget` each.
pub(crate) fn apply_reports_within(
    ctl: &Controller,
    reports: &[Answer<'_>],
    budget: TxBudget,
) -> Vec<Option<bool>> {
    let mut out = Vec::with_capacity(reports.len());
    let mut rest = reports;
    let done = |elapsed: std::time::Duration| {
        elapsed >= budget.alone || (elapsed >= budget.shared && ctl.writer_wanted())
    };
    while let Some(first) = rest.first() {
        let now = iris_store::now_ms();
        let mut conn = ctl.writer(crate::WriterUse::Observation);
        let started = std::time::Instant::now();
        match in_one_tx(&mut conn, rest, now, done) {
            Ok(changed) => {
                ctl.metrics
                    .observation_transaction(changed.len(), started.elapsed());
                rest = &rest[changed.len()..];
                out.extend(changed.into_iter().map(Some));
            }
            Err(e) => {
                tracing::warn!(worker = %first.0, error = %e, "applying reconcile responses; retrying the first alone");
                let alone = in_one_tx(&mut conn, std::slice::from_ref(first), now, done);
                out.push(match alone {
                    Ok(changed) => changed.first().copied(),
                    Err(e) => {
                        tracing::error!(worker = %first.0, error = %e, "applying reconcile response");
                        None
                    }
                });
                rest = &rest[1..];
            }
        }
        conn.unlock_fair();
    }
    out
}

/// Applies `reports` from the first, in one transaction, until `done` says so of the time it
/// has taken (at least one): per report applied, whether it changed state.
fn in_one_tx(
    conn: &mut iris_store::Db,
    reports: &[Answer<'_>],
    now: i64,
    done: impl Fn(std::time::Duration) -> bool,
) -> iris_store::Result<Vec<bool>> {
    let started = std::time::Instant::now();
    let tx = conn.begin()?;
    let mut out = Vec::with_capacity(reports.len());
    // Each job the transaction touched is rolled up once, after all of its reports.
    let mut rollups = apply::JobRollups::default();
    for &(worker_id, observed, beat) in reports {
        out.push(apply_one(
            &tx,
            worker_id,
            observed,
            beat,
            now,
            &mut rollups,
        )?);
        if done(started.elapsed()) {
            break;
        }
    }
    rollups.finish(&tx, now)?;
    tx.commit()?;
    Ok(out)
}

fn apply_one(
    tx: &iris_store::Tx<'_>,
    worker_id: &str,
    observed: &[Observation],
    beat: bool,
    now: i64,
    rollups: &mut apply::JobRollups,
) -> iris_store::Result<bool> {
    let mut changed = false;
    for obs in observed {
        changed |= apply::apply_observation_deferred(tx, worker_id, obs, now, rollups)?;
    }
    if beat {
        iris_store::workers::heartbeat(tx, worker_id, now)?;
    }
    Ok(changed)
}
