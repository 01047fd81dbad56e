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
mod diag;
mod host;
pub mod levels;
mod logs;
mod registration;
mod service;
mod setup;
pub mod sim;
pub use iris_backend::task_env;
mod usage;

use anyhow::Context;
use axum::routing::post;
use axum::Router;
use iris_types::TaskState;
use std::collections::{BTreeMap, HashMap};
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
    /// The interpreter callable entrypoints run with (`IRIS_PYTHON`) when the task's workdir
    /// has no synced `.venv`; unset: `python3` (else `python`) from `PATH`.
    pub python: Option<PathBuf>,
    /// Cluster-wide task env defaults (`defaults.task_env`); the job's env overrides them.
    pub task_env: BTreeMap<String, String>,
}

#[derive(Debug)]
struct Attempt {
    task_id: String,
    attempt_id: i32,
    state: TaskState,
    exit_code: i32,
    error: String,
    pgid: Option<i32>,
    /// The id reported for the attempt's "container" once its process group exists; kept
    /// after the group ends (`pgid` is cleared then).
    container_id: String,
    stop_requested: bool,
    /// Stopped by the worker itself after losing the controller (ends WORKER_FAILED).
    abandoned: bool,
    /// Where and with what environment the command runs, once it does (for exec and profiling).
    run_env: Option<Arc<RunEnv>>,
    /// What the attempt's process group uses, sampled when the controller reconciles.
    usage: usage::Tracker,
}

/// An attempt's command's working directory and environment (the variables set on top of the
/// worker's own, as the command got them).
#[derive(Debug)]
struct RunEnv {
    dir: PathBuf,
    env: BTreeMap<String, String>,
}

struct Inner {
    cfg: WorkerConfig,
    /// The host other tasks and users reach this worker's tasks on (`IRIS_ADVERTISE_HOST`).
    advertise_host: String,
    /// `IRIS_PYTHON` for tasks without their own venv.
    python: String,
    /// When that interpreter lives in a virtualenv, the directory of the interpreter it was made
    /// from: uv builds a task's venv only from a non-virtualenv ("system") interpreter, so the
    /// setup phase finds this one on its `PATH`.
    python_home: Option<PathBuf>,
    attempts: Mutex<HashMap<String, Attempt>>,
    /// The host's usage, sent with each reconcile answer.
    host: Mutex<host::Host>,
    last_reconcile: Mutex<Instant>,
    /// Set by a fencing `Reconcile` (the controller declared this worker lost): register again.
    fenced: std::sync::atomic::AtomicBool,
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
    /// One worker per cache dir (its workdirs and secrets), for as long as this one runs.
    _dir_lock: iris_rpc::dirlock::DirLock,
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
    let dir_lock = iris_rpc::dirlock::DirLock::acquire(&cfg.cache_dir, "worker")?;
    let listener = tokio::net::TcpListener::bind(cfg.bind)
        .await
        .with_context(|| format!("binding worker to {}", cfg.bind))?;
    let addr = listener.local_addr()?;
    dir_lock
        .record(Some(&addr.to_string()))
        .with_context(|| format!("writing {}", dir_lock.path().display()))?;
    let advertise_host = advertise_host(addr.ip());
    let python = resolve_python(cfg.python.as_deref());
    let python_home = venv_home(std::path::Path::new(&python));
    // With auth on, the worker presents its token (minted with `iris user token mint
    // system:worker --role worker`) on Register and PushLogs.
    let rpc = iris_rpc::Client::new(&cfg.controller_url)
        .map_err(|e| anyhow::anyhow!(e.message))?
        .with_token(std::env::var("IRIS_WORKER_TOKEN").ok());
    let inner = Arc::new(Inner {
        advertise_host,
        python,
        python_home,
        attempts: Mutex::new(HashMap::new()),
        host: Mutex::new(Default::default()),
        last_reconcile: Mutex::new(Instant::now()),
        fenced: std::sync::atomic::AtomicBool::new(false),
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
    let advertised = SocketAddr::new(
        inner
            .advertise_host
            .parse()
            .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()),
        addr.port(),
    );
    let reg = tokio::spawn(registration::registration_loop(
        inner.clone(),
        advertised,
        rx,
    ));
    Ok(RunningWorker {
        addr,
        worker_id: inner.cfg.worker_id.clone(),
        inner,
        shutdown: tx,
        tasks: vec![server, reg],
        _dir_lock: dir_lock,
    })
}

/// The address this worker's tasks are reached on: the bind address, or for a wildcard bind the
/// address of the interface the default route leaves by (a UDP `connect` sends nothing), as the
/// reference probes it; loopback when there is no route.
fn advertise_host(bind: std::net::IpAddr) -> String {
    if !bind.is_unspecified() {
        return bind.to_string();
    }
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("8.8.8.8:80")?;
            s.local_addr()
        })
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "127.0.0.1".into())
}

/// The interpreter for `IRIS_PYTHON`: the configured one, else `python3` or `python` on `PATH`,
/// else the bare name `python` (the reference's default), with a warning, since callable jobs
/// will then fail to start.
fn resolve_python(configured: Option<&std::path::Path>) -> String {
    if let Some(p) = configured {
        return p.display().to_string();
    }
    if let Some(p) = ["python3", "python"].into_iter().find_map(find_on_path) {
        return p.display().to_string();
    }
    tracing::warn!(
        "no python3 or python on PATH: jobs submitted as Python callables will not start \
         (pass the worker an interpreter with --python)"
    );
    "python".into()
}

/// The first file named `name` in a directory of the worker's `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The `home` of the virtualenv `python` belongs to (from its `pyvenv.cfg`), if it is in one.
fn venv_home(python: &std::path::Path) -> Option<PathBuf> {
    let cfg = python.parent()?.parent()?.join("pyvenv.cfg");
    let text = std::fs::read_to_string(cfg).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "home").then(|| PathBuf::from(v.trim()))
    })
}
