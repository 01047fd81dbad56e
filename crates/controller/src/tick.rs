//! The control tick: timeouts → snapshot → `schedule` → commit the plan → wake reconcilers.

use crate::{internal, lock, Controller};
use iris_scheduler::{PendingTask, Policy, RunningTask, Snapshot, Worker};
use iris_store::ops;
use iris_store::rusqlite::Connection;
use iris_types::{AttrValue, Band, Resources, TaskEvent};
use rand::RngCore;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

pub(crate) async fn run(ctl: Arc<Controller>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut last_cost = Duration::ZERO;
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
        let res = tokio::task::spawn_blocking(move || {
            let r = tick(&c);
            if let Err(e) = crate::federation::tick_pass(&c) {
                tracing::error!(error = %e.message, "federation placement pass failed");
            }
            r
        })
        .await;
        last_cost = started.elapsed();
        match res {
            Ok(Ok(workers)) => {
                let links = lock(&ctl.workers);
                for w in workers {
                    if let Some(l) = links.get(&w) {
                        l.poke.notify_one();
                    }
                }
            }
            Ok(Err(e)) => tracing::error!(error = %e.message, "control tick failed"),
            Err(e) => tracing::error!(error = %e, "control tick panicked"),
        }
    }
}

/// Loads healthy workers with their attributes.
pub(crate) fn load_workers(conn: &Connection) -> iris_store::rusqlite::Result<Vec<Worker>> {
    let mut attrs: BTreeMap<String, BTreeMap<String, AttrValue>> = BTreeMap::new();
    {
        let mut st = conn.prepare_cached(
            "SELECT worker_id, key, value_type, str_value, int_value, float_value FROM worker_attributes",
        )?;
        let mut rows = st.query([])?;
        while let Some(r) = rows.next()? {
            let w: String = r.get(0)?;
            let k: String = r.get(1)?;
            let t: String = r.get(2)?;
            let v = match t.as_str() {
                "int" => AttrValue::Int(r.get::<_, Option<i64>>(4)?.unwrap_or(0)),
                "float" => AttrValue::Float(r.get::<_, Option<f64>>(5)?.unwrap_or(0.0)),
                _ => AttrValue::Str(r.get::<_, Option<String>>(3)?.unwrap_or_default()),
            };
            attrs.entry(w).or_default().insert(k, v);
        }
    }
    let mut st = conn.prepare_cached(
        "SELECT worker_id, total_cpu_millicores, total_memory_bytes, md_disk_bytes, total_gpu_count, total_tpu_count, device_variant, healthy, address
         FROM workers ORDER BY worker_id",
    )?;
    let rows = st.query_map([], |r| {
        let id: String = r.get(0)?;
        Ok(Worker {
            attributes: BTreeMap::new(),
            total: Resources {
                cpu_millicores: r.get(1)?,
                memory_bytes: r.get(2)?,
                disk_bytes: r.get::<_, Option<i64>>(3)?.unwrap_or(0),
                gpu: r.get(4)?,
                tpu: r.get(5)?,
            },
            device_variant: {
                let v: String = r.get(6)?;
                if v == "cpu" {
                    String::new()
                } else {
                    v.to_ascii_lowercase()
                }
            },
            healthy: r.get::<_, i64>(7)? != 0,
            pooled: r.get::<_, String>(8)?.starts_with("inproc://"),
            id,
        })
    })?;
    let mut out: Vec<Worker> = rows.collect::<Result<_, _>>()?;
    for w in &mut out {
        if let Some(a) = attrs.remove(&w.id) {
            w.attributes = a;
        }
    }
    Ok(out)
}

pub(crate) fn new_uid() -> String {
    let mut b = [0u8; 8];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// One control tick. Returns the workers whose desired set changed.
pub(crate) fn tick(ctl: &Controller) -> Result<BTreeSet<String>, iris_rpc::RpcError> {
    let now = iris_store::now_ms();
    let mut touched = BTreeSet::new();
    let snap = lock(&ctl.snap);
    let tx = snap.unchecked_transaction().map_err(internal)?;
    // Scheduling deadlines.
    let expired: Vec<String> = {
        let mut st = tx
            .prepare_cached(
                "SELECT t.task_id FROM tasks t JOIN jobs j ON j.job_id = t.job_id
                 WHERE t.state = 1 AND t.cluster = 'local' AND j.scheduling_deadline_epoch_ms IS NOT NULL AND j.scheduling_deadline_epoch_ms < ?1",
            )
            .map_err(internal)?;
        let rows = st.query_map([now], |r| r.get(0)).map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };

    // Execution timeouts (measured from the attempt's start).
    let timed_out: Vec<(String, String)> = {
        let mut st = tx
            .prepare_cached(
                "SELECT t.task_id, a.worker_id FROM tasks t JOIN job_config c ON c.job_id = t.job_id
                 JOIN task_attempts a ON a.task_id = t.task_id AND a.attempt_id = t.current_attempt_id
                 WHERE t.state IN (2, 3) AND t.cluster = 'local' AND c.timeout_ms IS NOT NULL AND a.started_at_ms IS NOT NULL
                   AND a.started_at_ms + c.timeout_ms < ?1",
            )
            .map_err(internal)?;
        let rows = st
            .query_map([now], |r| {
                Ok((
                    r.get(0)?,
                    r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                ))
            })
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };

    // Snapshot.
    let workers = load_workers(&tx).map_err(internal)?;
    let addresses: BTreeMap<String, String> = {
        let mut st = tx
            .prepare_cached("SELECT worker_id, address FROM workers")
            .map_err(internal)?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    let running = {
        let rows: Vec<(String, String, String, i32, bool)> = {
            let mut st = tx
                .prepare_cached(
                    "SELECT a.task_id, t.job_id, a.worker_id, t.priority_band, a.state = 3
                     FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
                     WHERE a.finished_at_ms IS NULL AND a.worker_id IS NOT NULL",
                )
                .map_err(internal)?;
            let rows = st
                .query_map([], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)?
        };
        let mut out = Vec::with_capacity(rows.len());
        for (task, job, worker, band, is_running) in rows {
            let Some(spec) = ctl.spec(&tx, &job)? else {
                continue;
            };
            out.push(RunningTask {
                task,
                job,
                worker,
                band: Band::from_code(band).unwrap_or(spec.band),
                resources: spec.resources.clone(),
                running: is_running,
                coscheduled: spec.group_by.is_some(),
                device_variant: spec.device_variant.clone(),
            });
        }
        out
    };
    // Budgets (§4.7): spend per user over active non-BATCH work; over a non-zero limit, a user's
    // INTERACTIVE work is scheduled as BATCH.
    let spend = crate::views::spend_by_user(&tx)?;
    let limits = crate::accounts::limits(&tx)?;
    let pending = {
        let rows: Vec<(String, String, i64, i64, i64)> = {
            let mut st = tx
                .prepare_cached(
                    "SELECT task_id, job_id, priority_root_submitted_ms, submitted_at_ms, priority_insertion
                     FROM tasks WHERE state = 1 AND cluster = 'local'",
                )
                .map_err(internal)?;
            let rows = st
                .query_map([], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })
                .map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)?
        };
        let mut out = Vec::with_capacity(rows.len());
        for (task, job, root_ms, sub_ms, ins) in rows {
            let Some(spec) = ctl.spec(&tx, &job)? else {
                continue;
            };
            out.push(PendingTask {
                task,
                job,
                user: spec.user.clone(),
                band: crate::accounts::effective_band_of(spec.band, &spec.user, &spend, &limits),
                resources: spec.resources.clone(),
                constraints: spec.constraints.clone(),
                group_by: spec.group_by.clone(),
                depth: spec.depth,
                root_submitted_ms: root_ms,
                submitted_ms: sub_ms,
                insertion: ins,
                device_variant: spec.device_variant.clone(),
            });
        }
        out
    };
    drop(tx);
    drop(snap);
    if !expired.is_empty() || !timed_out.is_empty() {
        let mut conn = ctl.db();
        let wtx = conn.transaction().map_err(internal)?;
        for t in &expired {
            ops::apply_task_event(
                &wtx,
                t,
                &TaskEvent::SchedulingTimeout,
                None,
                ops::Finish::Now,
                now,
                "iris/controller",
            )
            .map_err(internal)?;
        }
        for (t, w) in &timed_out {
            ops::apply_task_event(
                &wtx,
                t,
                &TaskEvent::ExecutionTimeout,
                None,
                ops::Finish::AwaitWorker,
                now,
                "iris/controller",
            )
            .map_err(internal)?;
            touched.insert(w.clone());
        }
        wtx.commit().map_err(internal)?;
        // Those tasks changed state after the snapshot: plan on the next tick.
        return Ok(touched);
    }
    if pending.is_empty() {
        lock(&ctl.pending_reasons).clear();
        return Ok(touched);
    }
    // Plan without holding the DB: submissions and reconciles proceed meanwhile. Every decision
    // is re-validated by `transition` when applied below.
    let bands: BTreeMap<String, Band> = pending.iter().map(|p| (p.task.clone(), p.band)).collect();
    let snapshot = Snapshot {
        workers,
        running,
        pending,
        user_spend: spend,
    };
    let plan = iris_scheduler::schedule(&snapshot, &Policy::default());
    drop(snapshot);
    if !plan.preemptions.is_empty() || !plan.assignments.is_empty() {
        let now = iris_store::now_ms();
        let mut conn = ctl.db();
        let tx = conn.transaction().map_err(internal)?;
        for p in &plan.preemptions {
            ops::apply_task_event(
                &tx,
                &p.victim,
                &TaskEvent::Preempt { by: p.by.clone() },
                None,
                ops::Finish::AwaitWorker,
                now,
                "iris/controller",
            )
            .map_err(internal)?;
            touched.insert(p.worker.clone());
        }
        for a in &plan.assignments {
            let band = bands.get(&a.task).copied().unwrap_or(Band::Interactive);
            let addr = addresses.get(&a.worker).cloned().unwrap_or_default();
            if ops::assign_task(&tx, &a.task, &a.worker, &addr, &new_uid(), band.code(), now)
                .map_err(internal)?
            {
                touched.insert(a.worker.clone());
            }
        }
        tx.commit().map_err(internal)?;
    }
    *lock(&ctl.pending_reasons) = plan.pending_reasons.into_iter().collect();
    Ok(touched)
}
