//! The Iris worker daemon: registers with the controller, answers `WorkerService/Reconcile`, and
//! runs each attempt as a child process in its own process group.
//!
//! Architecture invariant: the worker knows nothing about scheduling; it reports facts
//! (BUILDING, RUNNING, exit codes) and obeys the desired set. Unknown desired uids are reported
//! MISSING; local attempts missing from the desired set are killed.
//!
//! This file holds the configuration, the shared state and [`start`]; `registration` talks to
//! the controller's `Register`, `service` answers `Reconcile`, `attempt` runs and stops the
//! attempt processes, `logs` ships their output, and `bundle` fetches and unpacks bundles.
//! Attempt states are [`iris_types::TaskState`], reported over the wire by their codes.

mod attempt;
pub mod bundle;
mod logs;
mod registration;
mod service;

use anyhow::Context;
use axum::routing::post;
use axum::Router;
use iris_types::TaskState;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Worker settings.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub controller_url: String,
    pub worker_id: String,
    pub bind: SocketAddr,
    pub cpu_count: i32,
    pub memory_bytes: i64,
    pub disk_bytes: i64,
    /// Advertised accelerator: `("gpu"|"tpu", variant, count)`. May be fake (testing/dev only).
    pub device: Option<(String, String, i32)>,
    pub attributes: Vec<(String, String)>,
    pub scale_group: String,
    pub cache_dir: PathBuf,
    /// Without a reconcile for this long the worker kills its tasks and re-registers.
    pub heartbeat_timeout: Duration,
}

#[derive(Debug)]
struct Attempt {
    task_id: String,
    attempt_id: i32,
    state: TaskState,
    exit_code: i32,
    error: String,
    pgid: Option<i32>,
    stop_requested: bool,
    /// Stopped by the worker itself after losing the controller (ends WORKER_FAILED).
    abandoned: bool,
}

struct Inner {
    cfg: WorkerConfig,
    attempts: Mutex<HashMap<String, Attempt>>,
    last_reconcile: Mutex<Instant>,
    http: reqwest::Client,
    rpc: iris_rpc::Client,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running worker.
pub struct RunningWorker {
    pub addr: SocketAddr,
    pub worker_id: String,
    inner: Arc<Inner>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningWorker {
    /// Stops the server and kills every task.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        attempt::kill_all(&self.inner);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Starts the worker: binds, serves Reconcile, and registers (retrying until accepted).
pub async fn start(cfg: WorkerConfig) -> anyhow::Result<RunningWorker> {
    std::fs::create_dir_all(&cfg.cache_dir)
        .with_context(|| format!("creating {}", cfg.cache_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(cfg.bind)
        .await
        .with_context(|| format!("binding worker to {}", cfg.bind))?;
    let addr = listener.local_addr()?;
    // With auth on, the worker presents its token (minted with `iris user token mint
    // system:worker --role worker`) on Register and PushLogs.
    let rpc = iris_rpc::Client::new(&cfg.controller_url)
        .map_err(|e| anyhow::anyhow!(e.message))?
        .with_token(std::env::var("IRIS_WORKER_TOKEN").ok());
    let inner = Arc::new(Inner {
        attempts: Mutex::new(HashMap::new()),
        last_reconcile: Mutex::new(Instant::now()),
        http: reqwest::Client::new(),
        rpc,
        cfg,
    });
    let (tx, rx) = tokio::sync::watch::channel(false);
    let app = Router::new()
        .route("/{service}/{method}", post(service::dispatch))
        .with_state(inner.clone());
    let mut srx = rx.clone();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = srx.wait_for(|v| *v).await;
            })
            .await;
    });
    let reg = tokio::spawn(registration::registration_loop(inner.clone(), addr, rx));
    Ok(RunningWorker {
        addr,
        worker_id: inner.cfg.worker_id.clone(),
        inner,
        shutdown: tx,
        tasks: vec![server, reg],
    })
}
