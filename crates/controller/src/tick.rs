//! The control tick: timeouts → snapshot → `schedule` → commit the plan → wake reconcilers.

use crate::error::Result;
use crate::{lock, Controller};
use iris_scheduler::{PendingTask, Policy, RunningTask, Snapshot, Worker};
use iris_store::{apply, snapshot, Read};
use iris_types::{Band, TaskEvent};
use rand::RngCore;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// How often endpoints whose lease ran out are deleted (reads hide them at once).
const ENDPOINT_SWEEP: Duration = Duration::from_secs(60);

pub(crate) async fn run(ctl: Arc<Controller>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut last_cost = Duration::ZERO;
    let mut last_sweep = std::time::Instant::now();
    loop {
        tokio::select! {
            _ = ctl.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        // Coalesce bursts of wakes (e.g. a storm of submits) into one tick, and keep the tick
        // to about a quarter of one core under load: wait three times as long as the last tick
        // took (a tick over a small queue costs well under a millisecond, so idle clusters still
        // place work within ~2 ms).
        tokio::time::sleep(
            (last_cost * 3).clamp(Duration::from_millis(2), Duration::from_millis(500)),
        )
        .await;
        let c = ctl.clone();
        let started = std::time::Instant::now();
        let sweep = last_sweep.elapsed() >= ENDPOINT_SWEEP;
        if sweep {
            last_sweep = started;
        }
        let res = tokio::task::spawn_blocking(move || {
            if sweep {
                if let Err(e) = c.sweep_endpoints() {
                    tracing::error!(error = %e, "sweeping expired endpoints failed");
                }
            }
            let r = tick(&c);
            if let Err(e) = crate::federation::tick_pass(&c) {
                tracing::error!(error = %e, "federation placement pass failed");
            }
            r
        })
        .await;
        last_cost = started.elapsed();
        ctl.metrics.tick_done(last_cost);
        match res {
            Ok(Ok(workers)) => {
                let links = lock(&ctl.workers);
                for w in workers {
                    if let Some(l) = links.get(&w) {
                        l.poke.notify_one();
                    }
                }
            }
            Ok(Err(e)) => tracing::error!(error = %e, "control tick failed"),
            Err(e) => tracing::error!(error = %e, "control tick panicked"),
        }
    }
}

/// Every worker daemon as the scheduler sees it (capacity, attributes, health).
/// Availability markers (`availability:<variant>`) are added per region (see
/// [`iris_scheduler::enrich_with_availability`]).
pub(crate) fn load_workers(conn: &impl Read) -> Result<Vec<Worker>> {
    let mut workers = worker_rows(conn)?;
    iris_scheduler::enrich_with_availability(&mut workers);
    Ok(workers)
}

fn worker_rows(conn: &impl Read) -> Result<Vec<Worker>> {
    Ok(iris_store::workers::capacities(conn)?
        .into_iter()
        .map(|w| Worker {
            pooled: false,
            id: w.worker_id,
            total: w.total,
            attributes: w.attributes,
            healthy: w.healthy,
            device_variant: w.device_variant,
        })
        .collect())
}

/// The worker rows as of one [`iris_store::workers::generation`]: the tick and every admission
/// batch need all of them (5,000 workers and their attributes at C1M shape), and they change only
/// when a worker registers or goes.
pub(crate) struct WorkerRows {
    generation: u64,
    workers: Vec<Worker>,
}

impl Controller {
    /// Everything work may be placed on: the worker daemons and, as pooled targets, the
    /// in-process backends (which have no worker rows). `generation` is the workers' generation
    /// taken before `conn`'s read transaction first read (or, on the writer connection, under
    /// its lock): rows read at that generation are reused until it moves.
    pub(crate) fn placement_targets(
        &self,
        conn: &impl Read,
        generation: u64,
    ) -> Result<Vec<Worker>> {
        let cached = lock(&self.worker_rows)
            .as_ref()
            .filter(|c| c.generation == generation)
            .map(|c| c.workers.clone());
        let mut targets = match cached {
            Some(w) => w,
            None => {
                let rows = worker_rows(conn)?;
                let mut cache = lock(&self.worker_rows);
                if cache.as_ref().is_none_or(|c| c.generation <= generation) {
                    *cache = Some(WorkerRows {
                        generation,
                        workers: rows.clone(),
                    });
                }
                rows
            }
        };
        targets.extend(self.backend_targets());
        iris_scheduler::enrich_with_availability(&mut targets);
        Ok(targets)
    }
}

pub(crate) fn new_uid() -> String {
    let mut b = [0u8; 8];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// What the scheduler sees, read in one transaction: workers (unconfirmed ones unhealthy),
/// the tasks holding resources on them, every pending local task with its effective band
/// (budgets, §4.7) and each user's spend. The control tick plans over it and `ExplainTask`
/// explains over it, so an explanation and a placement start from the same picture.
pub(crate) fn read_snapshot(ctl: &Controller, tx: &impl Read, generation: u64) -> Result<Snapshot> {
    let mut workers = ctl.placement_targets(tx, generation)?;
    {
        // A worker of a previous run that has not come back gets nothing until it does.
        let confirmed = lock(&ctl.confirmed);
        // Nor does a worker of a slice being stopped.
        let draining = ctl.draining();
        for w in workers.iter_mut().filter(|w| !w.pooled) {
            w.healthy &= confirmed.contains(&w.id) && !draining.contains(&w.id);
        }
    }
    let mut running = Vec::new();
    for h in snapshot::holdings(tx)? {
        let Some(spec) = ctl.spec(tx, &h.job_id)? else {
            continue;
        };
        running.push(RunningTask {
            band: Band::from_code(h.band).unwrap_or(spec.band),
            resources: spec.resources.clone(),
            running: h.running,
            coscheduled: spec.group_by.is_some(),
            device_variant: spec.device_variant.clone(),
            task: h.task_id,
            job: h.job_id,
            worker: h.worker_id,
        });
    }
    // Budgets (§4.7): spend per user over active non-BATCH work; over a non-zero limit, a user's
    // INTERACTIVE work is scheduled as BATCH.
    let spend = iris_store::budgets::spend_by_user(tx)?;
    let limits = crate::accounts::limits(tx)?;
    let mut pending = Vec::new();
    for w in snapshot::waiting(tx)? {
        let Some(spec) = ctl.spec(tx, &w.job_id)? else {
            continue;
        };
        pending.push(PendingTask {
            user: spec.user.clone(),
            band: crate::accounts::effective_band_of(
                spec.band,
                &spec.user,
                &spend,
                &limits,
                ctl.cfg.budget_defaults.limit,
            ),
            resources: spec.resources.clone(),
            constraints: spec.constraints.clone(),
            group_by: spec.group_by.clone(),
            depth: spec.depth,
            root_submitted_ms: w.root_submitted_ms,
            submitted_ms: w.submitted_ms,
            insertion: w.insertion,
            device_variant: spec.device_variant.clone(),
            task: w.task_id,
            job: w.job_id,
        });
    }
    Ok(Snapshot {
        workers,
        running,
        pending,
        user_spend: spend,
    })
}

/// One control tick. Returns the workers whose desired set changed.
pub(crate) fn tick(ctl: &Controller) -> Result<BTreeSet<String>> {
    let now = iris_store::now_ms();
    let mut touched = BTreeSet::new();
    let snap = lock(&ctl.snap);
    let generation = iris_store::workers::generation();
    let tx = snap.begin_read()?;
    let expired = snapshot::past_scheduling_deadline(&tx, now)?;
    let timed_out = snapshot::past_execution_timeout(&tx, now)?;
    let addresses = iris_store::workers::addresses(&tx)?;
    let snapshot = read_snapshot(ctl, &tx, generation)?;
    drop(tx);
    drop(snap);
    let pending_by_band: Vec<(&'static str, i64)> = Band::ALL
        .iter()
        .map(|b| {
            let n = snapshot.pending.iter().filter(|p| p.band == *b).count();
            (b.name(), n as i64)
        })
        .collect();
    let healthy = snapshot.workers.iter().filter(|w| w.healthy).count() as i64;
    let unhealthy = snapshot.workers.len() as i64 - healthy;
    ctl.metrics.tick_plan(&pending_by_band, healthy, unhealthy);
    if !expired.is_empty() || !timed_out.is_empty() {
        let mut conn = ctl.db();
        let wtx = conn.begin()?;
        for t in &expired {
            apply::apply_task_event(
                &wtx,
                t,
                &TaskEvent::SchedulingTimeout,
                None,
                apply::Finish::Now,
                now,
                "iris/controller",
            )?;
        }
        for (t, w) in &timed_out {
            apply::apply_task_event(
                &wtx,
                t,
                &TaskEvent::ExecutionTimeout,
                None,
                apply::Finish::AwaitWorker,
                now,
                "iris/controller",
            )?;
            touched.insert(w.clone());
        }
        wtx.commit()?;
        // Those tasks changed state after the snapshot: plan again right after the pause.
        ctl.wake.notify_one();
        return Ok(touched);
    }
    if snapshot.pending.is_empty() {
        lock(&ctl.pending_reasons).clear();
        return Ok(touched);
    }
    // Plan without holding the DB: submissions and reconciles proceed meanwhile. Every decision
    // is re-validated by `transition` when applied below.
    let bands: BTreeMap<String, Band> = snapshot
        .pending
        .iter()
        .map(|p| (p.task.clone(), p.band))
        .collect();
    let Snapshot {
        workers,
        running,
        pending,
        user_spend,
    } = snapshot;
    let plan = {
        let mut cluster = lock(&ctl.cluster);
        cluster.sync(workers, running);
        cluster.plan(&pending, &user_spend, &Policy::default())
    };
    drop(pending);
    ctl.metrics
        .planned(plan.assignments.len(), plan.preemptions.len());
    if !plan.preemptions.is_empty() || !plan.assignments.is_empty() {
        let now = iris_store::now_ms();
        let mut conn = ctl.db();
        let tx = conn.begin()?;
        // Read under the write lock: a slice being stopped checks, under the same lock, that
        // nothing was placed on it (`crate::autoscale`).
        let draining = ctl.draining();
        // The assignments' jobs are rolled up once each, after all of them.
        let mut rollups = apply::JobRollups::default();
        for p in &plan.preemptions {
            apply::apply_task_event(
                &tx,
                &p.victim,
                &TaskEvent::Preempt { by: p.by.clone() },
                None,
                apply::Finish::AwaitWorker,
                now,
                "iris/controller",
            )?;
            touched.insert(p.worker.clone());
        }
        for a in plan
            .assignments
            .iter()
            .filter(|a| !draining.contains(&a.worker))
        {
            let band = bands.get(&a.task).copied().unwrap_or(Band::Interactive);
            // Asked of the backend registry, not inferred from a missing address: a worker
            // removed since the snapshot must fail this commit (its row is gone), not become a
            // backend nobody reconciles.
            let holder = if ctl.backend(&a.worker).is_some() {
                apply::Holder::Backend(&a.worker)
            } else {
                apply::Holder::Worker {
                    id: &a.worker,
                    address: addresses.get(&a.worker).map_or("", String::as_str),
                }
            };
            if apply::assign_deferred(
                &tx,
                &a.task,
                holder,
                &new_uid(),
                band.code(),
                now,
                &mut rollups,
            )? {
                touched.insert(a.worker.clone());
            }
        }
        rollups.finish(&tx, now)?;
        tx.commit()?;
        // Progress: plan again right after the pause (three times this tick's cost), for what
        // the per-job and per-worker cycle caps held back, instead of waiting out the idle
        // second. A tick that changes nothing does not re-arm itself.
        if !touched.is_empty() {
            ctl.wake.notify_one();
        }
    }
    let mut reasons: std::collections::HashMap<String, String> =
        plan.pending_reasons.into_iter().collect();
    // A task the autoscaler is bringing capacity up for (or cannot) says so instead.
    for (task, hint) in lock(&ctl.autoscale).hints.iter() {
        if let Some(r) = reasons.get_mut(task) {
            r.clone_from(hint);
        }
    }
    *lock(&ctl.pending_reasons) = reasons;
    Ok(touched)
}

#[cfg(test)]
#[path = "tick_tests.rs"]
mod tests;
