//! Per-worker reconcile loops: send the complete desired set, apply the observations.
//!
//! Reconcile is the only controller→worker channel and the worker's keep-alive. A worker that
//! fails ≥3 reconciles in a row and has not answered for `worker_grace` is declared failed: its
//! attempts go down the WORKER_FAILED path (§2.4) and its row is removed.

use crate::{internal, lock, Controller, WorkerLink};
use iris_backend::{DesiredAttempt, Intent, StopReason};
use iris_proto::cluster::controller as c;
use iris_proto::cluster::worker as w;
use iris_proto::job;
use iris_store::ops;
use iris_store::rusqlite::{params, Connection};
use iris_types::{TaskId, TaskState};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Inserts or updates a worker and its attributes.
pub(crate) fn upsert_worker(
    tx: &Connection,
    req: &c::RegisterRequest,
    md: &job::WorkerMetadata,
) -> iris_store::rusqlite::Result<()> {
    let (dtype, variant, gpu, tpu) = crate::spec::device_of(Some(&job::ResourceSpecProto {
        device: md.device.clone(),
        ..Default::default()
    }));
    let variant = if dtype == "cpu" {
        "cpu".to_string()
    } else {
        variant
    };
    let now = iris_store::now_ms();
    tx.execute(
        "INSERT INTO workers(worker_id, address, md_hostname, md_ip_address, md_cpu_count, md_memory_bytes, md_disk_bytes,
            md_device_json, total_cpu_millicores, total_memory_bytes, total_gpu_count, total_tpu_count, device_type,
            device_variant, slice_id, scale_group, healthy, registered_at_ms, last_heartbeat_ms, metadata_blob)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,1,?17,?17,?18)
         ON CONFLICT(worker_id) DO UPDATE SET address = excluded.address, md_hostname = excluded.md_hostname,
            md_ip_address = excluded.md_ip_address, md_cpu_count = excluded.md_cpu_count, md_memory_bytes = excluded.md_memory_bytes,
            md_disk_bytes = excluded.md_disk_bytes, md_device_json = excluded.md_device_json,
            total_cpu_millicores = excluded.total_cpu_millicores, total_memory_bytes = excluded.total_memory_bytes,
            total_gpu_count = excluded.total_gpu_count, total_tpu_count = excluded.total_tpu_count,
            device_type = excluded.device_type, device_variant = excluded.device_variant, slice_id = excluded.slice_id,
            scale_group = excluded.scale_group, healthy = 1, last_heartbeat_ms = excluded.last_heartbeat_ms,
            metadata_blob = excluded.metadata_blob",
        params![
            req.worker_id,
            req.address,
            md.hostname,
            md.ip_address,
            md.cpu_count,
            md.memory_bytes,
            md.disk_bytes,
            md.device.as_ref().and_then(|d| serde_json::to_string(d).ok()),
            md.cpu_count as i64 * 1000,
            md.memory_bytes,
            gpu,
            tpu,
            dtype,
            variant,
            req.slice_id,
            req.scale_group,
            now,
            prost::Message::encode_to_vec(md),
        ],
    )?;
    tx.execute(
        "DELETE FROM worker_attributes WHERE worker_id = ?1",
        [&req.worker_id],
    )?;
    let mut attrs: Vec<(String, job::AttributeValue)> = md
        .attributes
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let s = |v: &str| job::AttributeValue {
        value: Some(job::attribute_value::Value::StringValue(v.into())),
    };
    for (k, v) in [
        ("device-type", dtype.to_string()),
        ("device-variant", variant.to_ascii_lowercase()),
    ] {
        if !attrs.iter().any(|(a, _)| a == k) {
            attrs.push((k.to_string(), s(&v)));
        }
    }
    if !attrs.iter().any(|(a, _)| a == "preemptible") {
        attrs.push(("preemptible".into(), s("false")));
    }
    if !req.scale_group.is_empty() && !attrs.iter().any(|(a, _)| a == "scale-group") {
        attrs.push(("scale-group".into(), s(&req.scale_group)));
    }
    for (k, v) in attrs {
        use job::attribute_value::Value;
        let (t, sv, iv, fv) = match v.value {
            Some(Value::IntValue(i)) => ("int", None, Some(i), None),
            Some(Value::FloatValue(f)) => ("float", None, None, Some(f)),
            Some(Value::StringValue(s)) => ("str", Some(s), None, None),
            None => ("str", Some(String::new()), None, None),
        };
        tx.execute(
            "INSERT INTO worker_attributes(worker_id, key, value_type, str_value, int_value, float_value) VALUES (?1,?2,?3,?4,?5,?6)",
            params![req.worker_id, k, t, sv, iv, fv],
        )?;
    }
    Ok(())
}

/// Starts reconcilers for workers already in the DB (after a controller restart).
pub(crate) fn start_known_workers(
    ctl: &Arc<Controller>,
    _shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let ids: Vec<String> = {
        let conn = ctl.db();
        let mut st = conn.prepare("SELECT worker_id FROM workers")?;
        let rows = st.query_map([], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    for id in ids {
        ensure_reconciler(ctl, &id);
    }
    Ok(())
}

/// Starts (or restarts) the reconcile loop for a worker.
pub(crate) fn ensure_reconciler(ctl: &Controller, worker_id: &str) {
    let generation = ctl.generation.fetch_add(1, Ordering::SeqCst) + 1;
    let poke = Arc::new(Notify::new());
    {
        let mut links = lock(&ctl.workers);
        links.insert(
            worker_id.to_string(),
            WorkerLink {
                poke: poke.clone(),
                generation,
            },
        );
    }
    poke.notify_one();
    let Some(me) = ctl.self_arc() else { return };
    let id = worker_id.to_string();
    // Owned by the worker link: the loop exits when a newer generation replaces it or the worker is failed.
    tokio::spawn(async move { reconcile_loop(me, id, generation, poke).await });
}

fn stop_reason(attempt: TaskState) -> StopReason {
    match attempt {
        TaskState::Killed => StopReason::Cancelled,
        TaskState::Preempted => StopReason::Preempted,
        TaskState::Failed => StopReason::TaskTimeout,
        _ => StopReason::JobTerminated,
    }
}

/// Builds the desired set for a worker from committed state.
fn desired_set(
    ctl: &Controller,
    conn: &Connection,
    worker_id: &str,
) -> Result<Vec<DesiredAttempt>, iris_rpc::RpcError> {
    let rows = ops::open_attempts_for_worker(conn, worker_id).map_err(internal)?;
    let victim_pending = rows.iter().any(|r| r.attempt_state == TaskState::Preempted);
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let (Ok(task_id), Ok(attempt_id)) =
            (TaskId::parse(&r.task_id), u32::try_from(r.attempt_id))
        else {
            // Ids are validated before they are stored: a bug, not a worker's problem.
            tracing::error!(task = %r.task_id, attempt = r.attempt_id, "malformed attempt in the store");
            continue;
        };
        let intent = if r.attempt_state.is_terminal() {
            Intent::Stop(stop_reason(r.attempt_state))
        } else if !r.is_current || r.task_state.is_terminal() || r.task_state == TaskState::Pending
        {
            // Superseded or the controller moved on: make sure it stops.
            Intent::Stop(StopReason::Superseded)
        } else if r.attempt_state == TaskState::Assigned {
            if victim_pending {
                continue; // withheld until the preempted victim has left this worker
            }
            let Some(spec) = ctl.spec(conn, &r.job_id)? else {
                continue;
            };
            let req = &spec.request;
            Intent::Run {
                launch: Some(Box::new(job::RunTaskRequest {
                    task_id: r.task_id.clone(),
                    num_tasks: r.num_tasks as i32,
                    entrypoint: req.entrypoint.clone(),
                    environment: req.environment.clone(),
                    bundle_id: req.bundle_id.clone(),
                    resources: req.resources.clone(),
                    timeout: req.timeout,
                    ports: req.ports.clone(),
                    attempt_id: r.attempt_id as i32,
                    constraints: req.constraints.clone(),
                    task_image: req.task_image.clone(),
                    attempt_uid: r.attempt_uid.clone(),
                    coscheduling: req.coscheduling.clone(),
                    priority: spec.band.code(),
                    container_profile: req.container_profile,
                    egress_policy: req.egress_policy,
                    task_token: ctl.task_token(&r.job_id, &spec.user),
                })),
            }
        } else {
            Intent::Run { launch: None }
        };
        out.push(DesiredAttempt {
            attempt_uid: r.attempt_uid,
            task_id,
            attempt_id,
            intent,
        });
    }
    Ok(out)
}

/// Drops this loop's link, unless a newer registration already replaced it.
fn forget_link(ctl: &Controller, worker_id: &str, generation: u64) {
    let mut links = lock(&ctl.workers);
    if links.get(worker_id).map(|l| l.generation) == Some(generation) {
        links.remove(worker_id);
    }
}

async fn reconcile_loop(
    ctl: Arc<Controller>,
    worker_id: String,
    generation: u64,
    poke: Arc<Notify>,
) {
    let mut failures = 0u32;
    let mut last_ok = Instant::now();
    // One client per worker address, kept across rounds (keep-alive, parsed URLs).
    let mut client: Option<(String, iris_rpc::Client)> = None;
    loop {
        tokio::select! {
            _ = poke.notified() => {}
            _ = tokio::time::sleep(ctl.cfg.reconcile_interval) => {}
        }
        let current = lock(&ctl.workers).get(&worker_id).map(|l| l.generation);
        if current != Some(generation) {
            return;
        }
        let prepared = {
            use iris_store::rusqlite::OptionalExtension;
            let conn = ctl.db();
            conn.query_row(
                "SELECT address FROM workers WHERE worker_id = ?1",
                [&worker_id],
                |r| r.get::<_, String>(0),
            )
            .optional()
            .map_err(internal)
            .and_then(|addr| match addr {
                None => Ok(None),
                Some(a) => desired_set(&ctl, &conn, &worker_id).map(|d| Some((a, d))),
            })
        };
        let (addr, desired) = match prepared {
            Ok(Some(p)) => p,
            // The worker row is gone (declared failed or removed): this loop ends.
            Ok(None) => {
                forget_link(&ctl, &worker_id, generation);
                return;
            }
            // A store error is not a lost worker: try again next round.
            Err(e) => {
                tracing::error!(worker = %worker_id, error = %e.message, "building the desired set");
                continue;
            }
        };
        if let Some(b) = ctl.backend(&worker_id) {
            // An in-process backend: same contract, no network hop.
            match b.reconcile(desired).await {
                Ok(report) => {
                    failures = 0;
                    last_ok = Instant::now();
                    let observed = report.observed.into_iter();
                    let changed = apply_observations(
                        &ctl,
                        &worker_id,
                        observed.map(crate::backend::store_observation).collect(),
                    );
                    apply_backend_extras(&ctl, &report.events, &report.logs);
                    if changed {
                        ctl.wake();
                    }
                    // Capacity follows the cluster (nodes come and go).
                    if let Err(e) = ctl.register_backend(&b).await {
                        tracing::warn!(backend = %worker_id, error = %e.message, "refreshing backend capacity");
                    }
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(backend = %worker_id, failures, error = %crate::backend::error_text(&e), "backend reconcile failed");
                }
            }
            continue;
        }
        if addr.starts_with("inproc://") {
            // An in-process backend not (yet) registered in this process: nothing to dial.
            continue;
        }
        let url = if addr.starts_with("http") {
            addr.clone()
        } else {
            format!("http://{addr}")
        };
        if client.as_ref().map(|(u, _)| u != &url).unwrap_or(true) {
            match iris_rpc::Client::new(&url) {
                Ok(c) => client = Some((url, c)),
                Err(_) => continue,
            }
        }
        let Some((_, client)) = client.as_ref() else {
            continue;
        };
        let req = w::ReconcileRequest {
            worker_id: worker_id.clone(),
            desired: desired
                .into_iter()
                .map(crate::backend::desired_to_wire)
                .collect(),
        };
        let res: Result<w::ReconcileResponse, _> = client
            .call(
                "iris.cluster.WorkerService",
                "Reconcile",
                &req,
                Duration::from_secs(10),
            )
            .await;
        match res {
            Ok(resp) => {
                failures = 0;
                last_ok = Instant::now();
                let changed = apply_response(&ctl, &worker_id, resp);
                if changed {
                    ctl.wake();
                }
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(worker = %worker_id, failures, error = %e, "reconcile failed");
                if failures >= 3 && last_ok.elapsed() >= ctl.cfg.worker_grace {
                    tracing::warn!(worker = %worker_id, "declaring worker failed");
                    let mut conn = ctl.db();
                    let done = (|| -> Result<(), iris_store::Error> {
                        let tx = conn.transaction()?;
                        ops::fail_worker(&tx, &worker_id, iris_store::now_ms())?;
                        tx.commit()?;
                        Ok(())
                    })();
                    drop(conn);
                    if let Err(e) = done {
                        tracing::error!(worker = %worker_id, error = %e, "failing worker");
                        continue;
                    }
                    forget_link(&ctl, &worker_id, generation);
                    ctl.wake();
                    return;
                }
            }
        }
    }
}

/// Events and log lines an in-process backend reported.
fn apply_backend_extras(
    ctl: &Controller,
    events: &[iris_backend::AttemptEvent],
    logs: &[iris_backend::AttemptLogs],
) {
    if !events.is_empty() {
        let now = iris_store::now_ms();
        let mut conn = ctl.db();
        let res = (|| -> Result<(), iris_store::Error> {
            let tx = conn.transaction()?;
            for e in events {
                let row: Option<(String, i64)> = {
                    use iris_store::rusqlite::OptionalExtension;
                    tx.query_row(
                        "SELECT task_id, attempt_id FROM task_attempts WHERE attempt_uid = ?1",
                        [&e.attempt_uid],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?
                };
                if let Some((task, attempt)) = row {
                    ops::record_event(
                        &tx,
                        &task,
                        Some(attempt),
                        Some(&e.attempt_uid),
                        now,
                        &e.kind,
                        &e.reason,
                        &e.message,
                        &e.source,
                    )?;
                }
            }
            tx.commit()?;
            Ok(())
        })();
        if let Err(e) = res {
            tracing::error!(error = %e, "recording backend events");
        }
    }
    if !logs.is_empty() {
        let mut conn = lock(&ctl.logs);
        for l in logs {
            let lines: Vec<(String, String, i64, i32, Option<i64>)> = l
                .lines
                .iter()
                .map(|(src, data, ts, seq)| (src.clone(), data.clone(), *ts, 0, Some(*seq)))
                .collect();
            if let Err(e) = iris_store::logs::append_numbered(&mut conn, &l.key, &lines) {
                tracing::error!(key = %l.key, error = %e, "storing backend log lines");
            }
        }
    }
}

fn apply_response(ctl: &Controller, worker_id: &str, resp: w::ReconcileResponse) -> bool {
    let observed = resp.observed.into_iter().map(|o| {
        let state = TaskState::from_code(o.state).unwrap_or(TaskState::Unspecified);
        ops::Observation {
            attempt_uid: o.attempt_uid,
            state,
            exit_code: (state.is_terminal()).then_some(o.exit_code),
            error: o.error,
            status_message: o.status_message,
        }
    });
    apply_observations(ctl, worker_id, observed.collect())
}

/// Applies a worker's or backend's observations and marks it alive. True when any changed state.
fn apply_observations(ctl: &Controller, worker_id: &str, observed: Vec<ops::Observation>) -> bool {
    let now = iris_store::now_ms();
    let mut conn = ctl.db();
    let mut changed = false;
    let res = (|| -> Result<(), iris_store::Error> {
        let tx = conn.transaction()?;
        for obs in observed {
            if ops::apply_observation(&tx, worker_id, &obs, now)? {
                changed = true;
            }
        }
        tx.execute(
            "UPDATE workers SET last_heartbeat_ms = ?2, healthy = 1 WHERE worker_id = ?1",
            params![worker_id, now],
        )?;
        tx.commit()?;
        Ok(())
    })();
    if let Err(e) = res {
        tracing::error!(worker = %worker_id, error = %e, "applying reconcile response");
    }
    changed
}
