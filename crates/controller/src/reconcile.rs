//! Reconcile loops, one per worker daemon and one per in-process backend: send the complete
//! desired set, apply the observations.
//!
//! Reconcile is the only controller→worker channel and the worker's keep-alive. A worker that
//! fails ≥3 reconciles in a row and has not answered for `worker_grace` is declared failed: its
//! attempts go down the WORKER_FAILED path (§2.4) and its row is removed.

use crate::error::Result;
use crate::{lock, Controller, WorkerLink};
use iris_backend::{DesiredAttempt, Intent, StopReason};
use iris_proto::cluster::controller as c;
use iris_proto::cluster::worker as w;
use iris_proto::job;
use iris_store::{apply, Read};
use iris_types::{AttrValue, TaskId, TaskState};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A worker's registration in store terms: capacity from its metadata, and the attributes it
/// advertises plus the ones every worker has (`device-type`, `device-variant`, `preemptible`,
/// `scale-group`).
pub(crate) fn registration_of(
    req: &c::RegisterRequest,
    md: &job::WorkerMetadata,
) -> iris_store::workers::Registration {
    let (dtype, variant, gpu, tpu) = crate::spec::device_of(Some(&job::ResourceSpecProto {
        device: md.device.clone(),
        ..Default::default()
    }));
    let variant = if dtype == "cpu" {
        "cpu".to_string()
    } else {
        variant
    };
    let mut attributes: Vec<(String, AttrValue)> = md
        .attributes
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                crate::spec::attr_from_proto(v).unwrap_or_else(|| AttrValue::Str(String::new())),
            )
        })
        .collect();
    let mut default = |k: &str, v: String| {
        if !attributes.iter().any(|(a, _)| a == k) {
            attributes.push((k.to_string(), AttrValue::Str(v)));
        }
    };
    default("device-type", dtype.to_string());
    default("device-variant", variant.to_ascii_lowercase());
    default("preemptible", "false".into());
    if !req.scale_group.is_empty() {
        default("scale-group", req.scale_group.clone());
    }
    iris_store::workers::Registration {
        worker_id: req.worker_id.clone(),
        address: req.address.clone(),
        hostname: md.hostname.clone().unwrap_or_default(),
        ip_address: md.ip_address.clone().unwrap_or_default(),
        cpu_count: md.cpu_count() as i64,
        memory_bytes: md.memory_bytes.unwrap_or_default(),
        disk_bytes: md.disk_bytes.unwrap_or_default(),
        device_json: md
            .device
            .as_ref()
            .and_then(|d| serde_json::to_string(d).ok()),
        total: iris_types::Resources {
            cpu_millicores: md.cpu_count() as i64 * 1000,
            memory_bytes: md.memory_bytes.unwrap_or_default(),
            disk_bytes: md.disk_bytes.unwrap_or_default(),
            gpu,
            tpu,
        },
        device_type: dtype.to_string(),
        device_variant: variant,
        slice_id: req.slice_id.clone(),
        scale_group: req.scale_group.clone(),
        attributes,
        metadata_blob: prost::Message::encode_to_vec(md),
    }
}

/// Registers (or refreshes) a worker in one transaction.
impl Controller {
    /// Marks a worker as heard from in this run (it may get work); true if it was not yet.
    pub(crate) fn confirm_worker(&self, worker_id: &str) -> bool {
        lock(&self.confirmed).insert(worker_id.to_string())
    }
}

pub(crate) fn upsert_worker(
    ctl: &Controller,
    req: &c::RegisterRequest,
    md: &job::WorkerMetadata,
) -> Result<()> {
    ctl.confirm_worker(&req.worker_id);
    let reg = registration_of(req, md);
    let mut conn = ctl.db();
    let tx = conn.begin()?;
    iris_store::workers::upsert(&tx, &reg, iris_store::now_ms())?;
    tx.commit()?;
    Ok(())
}

/// Starts reconcilers for workers already in the DB (after a controller restart).
pub(crate) fn start_known_workers(
    ctl: &Arc<Controller>,
    _shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let ids = iris_store::workers::ids(&*ctl.db())?;
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

/// Builds a desired set from committed state: `rows` are the open attempts of one worker or
/// one in-process backend.
fn desired_set(
    ctl: &Controller,
    conn: &impl Read,
    rows: Vec<iris_store::workers::DesiredRow>,
) -> Result<Vec<DesiredAttempt>> {
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
        } else if !r.current_of_active_task {
            // Superseded or the controller moved on: make sure it stops.
            Intent::Stop(StopReason::Superseded)
        } else if r.attempt_state == TaskState::Assigned {
            if victim_pending {
                continue; // withheld until the preempted victim has left this worker
            }
            let job_id = iris_types::job_of_task(&r.task_id);
            let Some(spec) = ctl.spec(conn, job_id)? else {
                continue;
            };
            let req = &spec.request;
            Intent::Run {
                launch: Some(Box::new(job::RunTaskRequest {
                    task_id: r.task_id.clone(),
                    num_tasks: spec.num_tasks as i32,
                    entrypoint: req.entrypoint.clone(),
                    environment: req.environment.clone(),
                    bundle_id: req.bundle_id.clone().unwrap_or_default(),
                    resources: req.resources.clone(),
                    timeout: req.timeout,
                    ports: req.ports.clone(),
                    attempt_id: r.attempt_id as i32,
                    constraints: req.constraints.clone(),
                    task_image: req.task_image.clone().unwrap_or_default(),
                    attempt_uid: r.attempt_uid.clone(),
                    coscheduling: req.coscheduling.clone(),
                    priority: spec.band.code(),
                    container_profile: req.container_profile.unwrap_or_default(),
                    egress_policy: req.egress_policy.unwrap_or_default(),
                    task_token: ctl.task_token(job_id, &spec.user),
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

/// A reconcile loop's way to its worker: a connection of its own over plain HTTP
/// ([`iris_rpc::Channel`]: no pool or retry layers per round), else the shared client (TLS).
enum Link {
    Own(iris_rpc::Channel),
    Shared(iris_rpc::Client),
}

impl Link {
    fn new(url: &str) -> Option<Link> {
        match iris_rpc::Channel::new(url) {
            Some(c) => Some(Link::Own(c)),
            None => iris_rpc::Client::new(url).ok().map(Link::Shared),
        }
    }

    fn base(&self) -> &str {
        match self {
            Link::Own(c) => c.base(),
            Link::Shared(c) => c.base(),
        }
    }

    /// One round: a `Reconcile` call, which is idempotent (the worker converges on the set).
    async fn reconcile(
        &mut self,
        req: &w::ReconcileRequest,
    ) -> Result<w::ReconcileResponse, iris_rpc::RpcError> {
        const SERVICE: &str = "iris.cluster.WorkerService";
        let timeout = Duration::from_secs(10);
        match self {
            Link::Own(c) => c.call(SERVICE, "Reconcile", req, timeout).await,
            Link::Shared(c) => c.call(SERVICE, "Reconcile", req, timeout).await,
        }
    }
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
    // One link per worker address, kept across rounds.
    let mut client: Option<(String, Link)> = None;
    let mut stored = Stored::default();
    // The worker's address as of one workers' generation: read again only once a worker has
    // been registered or removed since (every reconcile read it: 2% of the controller at C1M
    // shape).
    let mut known: Option<(u64, String)> = None;
    // After a failed round the next comes at the base interval, so a lost worker is noticed as
    // quickly in a large fleet as in a small one.
    let mut wait = ctl.cfg.reconcile_interval;
    loop {
        tokio::select! {
            _ = poke.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        let fleet = lock(&ctl.workers).len();
        wait = idle_interval(
            ctl.cfg.reconcile_interval,
            fleet,
            ctl.cfg.max_reconciles_per_second,
        );
        let current = lock(&ctl.workers).get(&worker_id).map(|l| l.generation);
        if current != Some(generation) {
            return;
        }
        if let Some(b) = ctl.backend(&worker_id) {
            // An in-process backend: same contract, no network hop, no worker row.
            let desired = {
                let conn = lock(&ctl.reconcile_reader);
                (|| -> Result<Vec<DesiredAttempt>> {
                    let tx = conn.begin_read()?;
                    let rows = iris_store::workers::open_backend_attempts(&tx, &worker_id)?;
                    desired_set(&ctl, &tx, rows)
                })()
            };
            match desired {
                Ok(desired) => backend_round(&ctl, &b, &worker_id, desired, &mut failures).await,
                Err(e) => {
                    tracing::error!(backend = %worker_id, error = %e, "building the desired set")
                }
            }
            continue;
        }
        // Read on the reconcile reader, not the writer's connection: thousands of loops do this
        // each round, and none of them should wait for (or hold up) a commit. The read is a few
        // indexed lookups, done in place (handing thousands of them per second to the blocking
        // pool cost more memory than it saved time).
        let prepared = {
            let conn = lock(&ctl.reconcile_reader);
            (|| -> Result<Option<(String, Vec<DesiredAttempt>)>> {
                // Taken before the read transaction's first read (`workers::generation`).
                let generation = iris_store::workers::generation();
                let tx = conn.begin_read()?;
                let addr = match known.take() {
                    Some((g, a)) if g == generation => Some(a),
                    _ => iris_store::workers::address(&tx, &worker_id)?,
                };
                match addr {
                    None => Ok(None),
                    Some(a) => {
                        known = Some((generation, a.clone()));
                        let rows = iris_store::workers::open_attempts(&tx, &worker_id)?;
                        desired_set(&ctl, &tx, rows).map(|d| Some((a, d)))
                    }
                }
            })()
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
                tracing::error!(worker = %worker_id, error = %e, "building the desired set");
                continue;
            }
        };
        let url = if addr.starts_with("http") {
            addr.clone()
        } else {
            format!("http://{addr}")
        };
        if client.as_ref().map(|(u, _)| u != &url).unwrap_or(true) {
            match Link::new(&url) {
                Some(c) => client = Some((url, c)),
                None => continue,
            }
        }
        let Some((_, client)) = client.as_mut() else {
            continue;
        };
        let req = w::ReconcileRequest {
            worker_id: worker_id.clone(),
            desired: desired
                .into_iter()
                .map(crate::backend::desired_to_wire)
                .collect(),
        };
        let res = client.reconcile(&req).await;
        match res {
            Ok(resp) => {
                failures = 0;
                last_ok = Instant::now();
                let confirmed = ctl.confirm_worker(&worker_id);
                let observed = response_observations(&ctl, &worker_id, resp);
                let changed = stored.report(&ctl, &worker_id, observed).await || confirmed;
                if changed {
                    ctl.wake();
                }
            }
            Err(e) => {
                failures += 1;
                wait = ctl.cfg.reconcile_interval;
                tracing::warn!(worker = %worker_id, failures, error = %e, "reconcile failed");
                if failures >= 3 && last_ok.elapsed() >= ctl.cfg.worker_grace {
                    tracing::warn!(worker = %worker_id, "declaring worker failed");
                    let done = {
                        let mut conn = ctl.db();
                        (|| -> iris_store::Result<()> {
                            let tx = conn.begin()?;
                            apply::fail_worker(&tx, &worker_id, iris_store::now_ms())?;
                            tx.commit()
                        })()
                    };
                    if let Err(e) = done {
                        tracing::error!(worker = %worker_id, error = %e, "failing worker");
                        continue;
                    }
                    forget_link(&ctl, &worker_id, generation);
                    ctl.wake();
                    let url = client.base().to_string();
                    fence(&ctl, &worker_id, &url).await;
                    return;
                }
            }
        }
    }
}

/// One round of an in-process backend: hand it the desired set, store what it observed (with
/// its events and log lines), and refresh its placement target (capacity follows the cluster).
/// A failed round is logged and retried next round; a backend is never declared failed.
async fn backend_round(
    ctl: &Controller,
    b: &Arc<dyn iris_backend::Backend>,
    id: &str,
    desired: Vec<DesiredAttempt>,
    failures: &mut u32,
) {
    match b.reconcile(desired).await {
        Ok(report) => {
            *failures = 0;
            let observed = report.observed.into_iter();
            let changed = ctl
                .observe(
                    id,
                    observed.map(crate::backend::store_observation).collect(),
                    false, // a backend has no worker row to beat
                )
                .await
                .unwrap_or(false);
            apply_backend_extras(ctl, &report.events, &report.logs);
            if changed {
                ctl.wake();
            }
            if let Err(e) = ctl.register_backend(b).await {
                tracing::warn!(backend = %id, error = %e, "refreshing backend capacity");
            }
        }
        Err(e) => {
            *failures += 1;
            tracing::warn!(backend = %id, failures = *failures, error = %crate::backend::error_text(&e), "backend reconcile failed");
        }
    }
}

/// How long an idle worker waits for its next round: `base`, or longer once the fleet would
/// exceed `max_per_second` idle rounds, so that `fleet` workers together make at most that many.
pub(crate) fn idle_interval(base: Duration, fleet: usize, max_per_second: u32) -> Duration {
    let spread = Duration::from_secs_f64(fleet as f64 / f64::from(max_per_second.max(1)));
    base.max(spread)
}

/// How often a worker's heartbeat is written: at most this often, with its changed observations
/// or alone. Written with every answer that changed something, it was a row update, and a page
/// of the `workers` table in each observation transaction's WAL frames, per answer (~6,600 a
/// second at C1M shape) for a time that `ListWorkers` shows and nothing decides on: a lost worker
/// is noticed by its reconcile loop (`worker_grace`), in memory.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// What one reconcile loop has stored of its worker's answers. A worker repeats every live
/// attempt's observation each round; one already stored changes nothing when applied again
/// (observations are fenced by attempt uid and worker, and the controller's own moves never
/// wait for a repeat), so only new or changed ones go to the writer, with the heartbeat when it
/// is due ([`HEARTBEAT_EVERY`]), or the heartbeat alone when it is due.
#[derive(Default)]
struct Stored {
    observed: std::collections::HashMap<String, apply::Observation>,
    beat: Option<Instant>,
}

impl Stored {
    /// Stores what is new in `observed`; true when it changed state.
    async fn report(
        &mut self,
        ctl: &Controller,
        worker_id: &str,
        observed: Vec<apply::Observation>,
    ) -> bool {
        // Forget attempts the worker no longer reports.
        let reported: std::collections::HashSet<&str> =
            observed.iter().map(|o| o.attempt_uid.as_str()).collect();
        self.observed
            .retain(|uid, _| reported.contains(uid.as_str()));
        let fresh: Vec<apply::Observation> = observed
            .into_iter()
            .filter(|o| self.observed.get(&o.attempt_uid) != Some(o))
            .collect();
        let beat_due = self.beat.is_none_or(|b| b.elapsed() >= HEARTBEAT_EVERY);
        if fresh.is_empty() && !beat_due {
            return false;
        }
        match ctl.observe(worker_id, fresh.clone(), beat_due).await {
            Some(changed) => {
                if beat_due {
                    self.beat = Some(Instant::now());
                }
                for o in fresh {
                    self.observed.insert(o.attempt_uid.clone(), o);
                }
                changed
            }
            // Not stored: everything is sent again next round.
            None => false,
        }
    }
}

/// How long a lost worker is fenced: past the default worker `heartbeat_timeout` (600 s), after
/// which a worker still cut off has stopped its attempts by itself.
const FENCE_FOR: Duration = Duration::from_secs(15 * 60);
const FENCE_EVERY: Duration = Duration::from_secs(1);

/// A worker declared lost may only be cut off: its attempts, already rerun elsewhere, live on
/// until its own lease (`heartbeat_timeout`) lapses. So the controller keeps offering it an
/// empty desired set flagged as a fence, once a second; the first that gets through (the
/// partition healed) stops every attempt it still runs and has it register afresh. Ends then,
/// when the worker registers again by itself, or after [`FENCE_FOR`].
async fn fence(ctl: &Controller, worker_id: &str, url: &str) {
    let Ok(client) = iris_rpc::Client::new(url) else {
        return;
    };
    let client = client.with_header(iris_rpc::FENCE_HEADER, "lost");
    let until = Instant::now() + FENCE_FOR;
    while Instant::now() < until {
        tokio::time::sleep(FENCE_EVERY).await;
        if lock(&ctl.workers).contains_key(worker_id) {
            // Registered again: its new link's reconciles say what it should run.
            return;
        }
        let req = w::ReconcileRequest {
            worker_id: worker_id.to_string(),
            desired: Vec::new(),
        };
        let r: Result<w::ReconcileResponse, _> = client
            .call(
                "iris.cluster.WorkerService",
                "Reconcile",
                &req,
                Duration::from_secs(3),
            )
            .await;
        if r.is_ok() {
            tracing::warn!(worker = %worker_id, "a worker declared lost answered again; its attempts were stopped (fenced)");
            return;
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
        let res = (|| -> iris_store::Result<()> {
            let tx = conn.begin()?;
            for e in events {
                iris_store::events::record_attempt_event(
                    &tx,
                    &e.attempt_uid,
                    [&e.kind, &e.reason, &e.message, &e.source],
                    now,
                )?;
            }
            tx.commit()
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
            let bytes: usize = lines.iter().map(|l| l.1.len()).sum();
            match iris_store::logs::append_numbered(&mut conn, &l.key, &lines) {
                Ok(_) => ctl.metrics.logs_stored(lines.len(), bytes),
                Err(e) => tracing::error!(key = %l.key, error = %e, "storing backend log lines"),
            }
        }
    }
}

/// Applies a worker's reconcile answer directly (the loops go through `Controller::observe`).
#[cfg(test)]
fn apply_response(ctl: &Controller, worker_id: &str, resp: w::ReconcileResponse) -> bool {
    let observed = response_observations(ctl, worker_id, resp);
    crate::observe::apply_reports(ctl, &[(worker_id, &observed, true)])[0].unwrap_or(false)
}

/// A worker's reconcile answer as store observations; its host and usage samples are noted on
/// the way.
fn response_observations(
    ctl: &Controller,
    worker_id: &str,
    resp: w::ReconcileResponse,
) -> Vec<apply::Observation> {
    if let Some(host) = resp.health.as_ref().and_then(|h| h.resources) {
        ctl.note_host(worker_id, host);
    }
    ctl.note_usage(
        worker_id,
        resp.observed
            .iter()
            .filter_map(|o| Some((o.attempt_uid.clone(), o.resource_usage?)))
            .collect(),
    );
    resp.observed
        .into_iter()
        .map(|o| {
            let state = TaskState::from_code(o.state).unwrap_or(TaskState::Unspecified);
            apply::Observation {
                attempt_uid: o.attempt_uid,
                state,
                exit_code: (state.is_terminal()).then_some(o.exit_code),
                error: o.error,
                status_message: o.status_message,
                container_id: o.container_id,
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
