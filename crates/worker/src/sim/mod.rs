//! Simulated workers (`iris worker simulate`): one process hosts thousands of workers that run
//! attempts without processes. Each registers with the controller like a process worker (its
//! own id, capacity, device and attributes) and answers `WorkerService/Reconcile` over real RPC
//! on one shared listener (the request names the worker), so the controller pays what it pays
//! for real workers. An attempt "runs" for a duration drawn from the configured distribution and
//! ends as the configured outcome mix says ([`model`]); when it ends, its worker pokes the
//! controller as a process worker does when its child exits.
//!
//! Not simulated: logs, usage samples, exec and profiling, and the heartbeat-timeout watchdog (a
//! simulated worker keeps its attempts until the controller's desired set drops them or a fence
//! arrives, then registers afresh).

pub mod model;

use crate::{lock, WorkerConfig};
use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{Path as AxPath, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use iris_proto::cluster::controller as c;
use iris_proto::cluster::worker as w;
use iris_proto::job;
use iris_rpc::RpcError;
use model::{Profile, SimWorker};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A fleet of simulated workers.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    pub controller_url: String,
    pub bind: SocketAddr,
    pub count: usize,
    /// Worker ids are `<prefix>-<index>`.
    pub id_prefix: String,
    pub cpu_count: i32,
    pub memory_bytes: i64,
    pub disk_bytes: i64,
    pub device: Option<(String, String, i32)>,
    pub attributes: Vec<(String, String)>,
    /// Workers per pool: each gets `pool=<prefix>-pool-<index / pool_size>` and its index in the
    /// pool as `tpu-worker-id`, so gangs (`group_by pool`) have pools to fill. 0: no pools.
    pub pool_size: usize,
    pub scale_group: String,
    pub profile: Profile,
}

struct Fleet {
    cfg: FleetConfig,
    ids: Vec<String>,
    index: HashMap<String, usize>,
    workers: Vec<Mutex<SimWorker>>,
    started: Instant,
    /// When started attempts end, and on which worker: the poker tells the controller then.
    ends: Mutex<BinaryHeap<Reverse<(u64, usize)>>>,
    ends_changed: tokio::sync::Notify,
    /// Workers fenced by the controller, to register again.
    fenced: Mutex<Vec<usize>>,
    fenced_changed: tokio::sync::Notify,
    rpc: iris_rpc::Client,
    http: reqwest::Client,
}

impl Fleet {
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// What worker `i` registers as (its own config, as a process worker would have).
    fn worker_config(&self, i: usize) -> WorkerConfig {
        let cfg = &self.cfg;
        let mut attributes = cfg.attributes.clone();
        if let Some(pool) = i.checked_div(cfg.pool_size) {
            attributes.push(("pool".into(), format!("{}-pool-{pool}", cfg.id_prefix)));
            attributes.push(("tpu-worker-id".into(), (i % cfg.pool_size).to_string()));
        }
        WorkerConfig {
            controller_url: cfg.controller_url.clone(),
            worker_id: self.ids[i].clone(),
            bind: cfg.bind,
            cpu_count: cfg.cpu_count,
            memory_bytes: cfg.memory_bytes,
            disk_bytes: cfg.disk_bytes,
            device: cfg.device.clone(),
            attributes,
            scale_group: cfg.scale_group.clone(),
            cache_dir: std::path::PathBuf::new(),
            heartbeat_timeout: Duration::MAX,
            python: None,
            task_env: Default::default(),
        }
    }
}

/// A running fleet; [`RunningFleet::shutdown`] stops it.
pub struct RunningFleet {
    pub addr: SocketAddr,
    pub ids: Vec<String>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningFleet {
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Binds the shared listener, then registers every worker (retrying each until accepted).
pub async fn start(cfg: FleetConfig) -> anyhow::Result<RunningFleet> {
    cfg.profile.validate().map_err(anyhow::Error::msg)?;
    if cfg.count == 0 {
        anyhow::bail!("--count must be at least 1");
    }
    let listener = tokio::net::TcpListener::bind(cfg.bind)
        .await
        .with_context(|| format!("binding the simulated workers to {}", cfg.bind))?;
    let addr = listener.local_addr()?;
    let ids: Vec<String> = (0..cfg.count)
        .map(|i| format!("{}-{i:05}", cfg.id_prefix))
        .collect();
    let rpc = iris_rpc::Client::new(&cfg.controller_url)
        .map_err(|e| anyhow::anyhow!(e.message))?
        .with_token(std::env::var("IRIS_WORKER_TOKEN").ok());
    let fleet = Arc::new(Fleet {
        index: ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.clone(), i))
            .collect(),
        workers: (0..cfg.count).map(|_| Mutex::default()).collect(),
        ids: ids.clone(),
        started: Instant::now(),
        ends: Mutex::default(),
        ends_changed: Default::default(),
        fenced: Mutex::default(),
        fenced_changed: Default::default(),
        rpc,
        http: reqwest::Client::new(),
        cfg,
    });
    let (tx, rx) = tokio::sync::watch::channel(false);
    let app = Router::new()
        .route("/{service}/{method}", post(dispatch))
        .with_state(fleet.clone());
    let mut srx = rx.clone();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = srx.wait_for(|v| *v).await;
            })
            .await;
    });
    let poker = tokio::spawn(poke_when_attempts_end(fleet.clone(), rx.clone()));
    let reregister = tokio::spawn(register_fenced(fleet.clone(), addr, rx.clone()));
    let all: Vec<usize> = (0..fleet.cfg.count).collect();
    register_all(&fleet, addr, &all, rx).await;
    Ok(RunningFleet {
        addr,
        ids,
        shutdown: tx,
        tasks: vec![server, poker, reregister],
    })
}

/// Registers workers `which`, 64 at a time, each retried until the controller accepts it.
async fn register_all(
    fleet: &Arc<Fleet>,
    addr: SocketAddr,
    which: &[usize],
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    use futures::StreamExt;
    futures::stream::iter(which.iter().copied())
        .for_each_concurrent(64, |i| {
            let fleet = fleet.clone();
            let mut shutdown = shutdown.clone();
            async move {
                let cfg = fleet.worker_config(i);
                let req = c::RegisterRequest {
                    address: addr.to_string(),
                    metadata: Some(crate::registration::metadata(&cfg, &addr.ip().to_string())),
                    worker_id: cfg.worker_id.clone(),
                    slice_id: String::new(),
                    scale_group: cfg.scale_group.clone(),
                };
                loop {
                    let r: Result<c::RegisterResponse, _> = fleet
                        .rpc
                        .call(
                            "iris.cluster.ControllerService",
                            "Register",
                            &req,
                            Duration::from_secs(30),
                        )
                        .await;
                    match r {
                        Ok(r) if r.accepted => return,
                        Ok(_) => tracing::warn!(worker = %cfg.worker_id, "registration refused"),
                        Err(e) => {
                            tracing::warn!(worker = %cfg.worker_id, error = %e, "registration failed; retrying")
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = shutdown.wait_for(|v| *v) => return,
                    }
                }
            }
        })
        .await;
}

async fn register_fenced(
    fleet: Arc<Fleet>,
    addr: SocketAddr,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = fleet.fenced_changed.notified() => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        let which = std::mem::take(&mut *lock(&fleet.fenced));
        if !which.is_empty() {
            tracing::warn!(
                workers = which.len(),
                "the controller declared simulated workers lost; registering them again"
            );
            register_all(&fleet, addr, &which, shutdown.clone()).await;
        }
    }
}

/// Pokes the controller (`/internal/worker-poke/<id>`) for each worker whose attempts ended, once
/// per worker per wake-up, as a process worker does when a child exits.
async fn poke_when_attempts_end(
    fleet: Arc<Fleet>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let base = fleet.cfg.controller_url.trim_end_matches('/').to_string();
    loop {
        let next = lock(&fleet.ends).peek().map(|Reverse((t, _))| *t);
        let wait = match next {
            Some(t) => Duration::from_millis(t.saturating_sub(fleet.now())),
            None => Duration::from_secs(3600),
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = fleet.ends_changed.notified() => continue,
            _ = shutdown.wait_for(|v| *v) => return,
        }
        let now = fleet.now();
        let mut due = std::collections::BTreeSet::new();
        {
            let mut ends = lock(&fleet.ends);
            while let Some(Reverse((t, i))) = ends.peek().copied() {
                if t > now {
                    break;
                }
                ends.pop();
                due.insert(i);
            }
        }
        for i in due {
            let url = format!("{base}/internal/worker-poke/{}", fleet.ids[i]);
            let http = fleet.http.clone();
            // Owned by nothing: a poke is fire-and-forget (the next reconcile tells the same).
            tokio::spawn(async move {
                let _ = http.post(url).timeout(Duration::from_secs(5)).send().await;
            });
        }
    }
}

async fn dispatch(
    State(fleet): State<Arc<Fleet>>,
    AxPath((service, method)): AxPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match (service.as_str(), method.as_str()) {
        ("iris.cluster.WorkerService", "Reconcile") => {
            let fence = headers.contains_key(iris_rpc::FENCE_HEADER);
            iris_rpc::unary(&headers, &body, |req: w::ReconcileRequest| {
                let fleet = fleet.clone();
                async move { reconcile(&fleet, req, fence) }
            })
            .await
        }
        ("iris.cluster.WorkerService", "HealthCheck") => {
            iris_rpc::unary(&headers, &body, |_req: job::Empty| async move {
                Ok::<_, RpcError>(w::HealthResponse {
                    healthy: true,
                    uptime: None,
                    running_tasks: 0,
                })
            })
            .await
        }
        _ => RpcError::new(
            iris_rpc::Code::Unimplemented,
            format!(
                "{service}/{method} is not served by simulated workers (they run no processes)"
            ),
        )
        .into_response(),
    }
}

fn reconcile(
    fleet: &Fleet,
    req: w::ReconcileRequest,
    fence: bool,
) -> Result<w::ReconcileResponse, RpcError> {
    let Some(&i) = fleet.index.get(&req.worker_id) else {
        return Err(RpcError::new(
            iris_rpc::Code::NotFound,
            format!(
                "no simulated worker '{}' here (this fleet's ids are {}-00000 to {})",
                req.worker_id,
                fleet.cfg.id_prefix,
                fleet.ids.last().map(String::as_str).unwrap_or("")
            ),
        ));
    };
    let now = fleet.now();
    let fence = fence && req.desired.is_empty();
    let answer = {
        let mut wk = lock(&fleet.workers[i]);
        if fence {
            wk.fence();
        }
        wk.reconcile(req.desired, now, &fleet.cfg.profile)
    };
    if fence {
        lock(&fleet.fenced).push(i);
        fleet.fenced_changed.notify_one();
    }
    if !answer.ends_at.is_empty() {
        let mut ends = lock(&fleet.ends);
        let earliest = ends.peek().map(|Reverse((t, _))| *t);
        for t in &answer.ends_at {
            ends.push(Reverse((*t, i)));
        }
        drop(ends);
        let first = answer.ends_at.iter().min().copied();
        if earliest.is_none() || first < earliest {
            fleet.ends_changed.notify_one();
        }
    }
    Ok(w::ReconcileResponse {
        worker_id: req.worker_id,
        observed: answer.observed,
        health: Some(w::WorkerHealth {
            healthy: true,
            health_error: String::new(),
            resources: None,
        }),
    })
}
