//! The Iris controller: the single writer of the controller DB. It serves
//! `iris.cluster.ControllerService` (Connect), runs the control tick (schedule → commit →
//! wake reconcilers), and reconciles each worker with its desired set of attempts.
//!
//! Architecture invariant: state changes are committed before any effect reaches a worker;
//! workers only learn intent from the committed desired set (see `reconcile`).

mod accounts;
pub mod auth;
pub mod backend;
pub mod checkpoint;
pub mod federation;
mod highlights;
mod limits;
mod reconcile;
mod service;
pub mod spec;
mod tick;
mod views;

use anyhow::Context;
use iris_rpc::RpcError;
use iris_store::rusqlite::Connection;
use spec::JobSpec;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

/// Capacity a scale group can provide, used for the submit-time feasibility check.
#[derive(Clone, Debug)]
pub struct GroupCapacity {
    pub name: String,
    /// What one worker of the group offers.
    pub capacity: iris_types::Resources,
    /// One worker's attributes; `device-type` and `device-variant` (`cpu` for CPU workers)
    /// say which accelerator it has.
    pub attributes: std::collections::BTreeMap<String, iris_types::AttrValue>,
    /// Workers the group can grow to.
    pub max_workers: u32,
}

impl GroupCapacity {
    /// One of the group's workers as the scheduler sees it: healthy, not pooled.
    pub(crate) fn worker(&self, id: String) -> iris_scheduler::Worker {
        let device_variant = match self.attributes.get("device-variant") {
            Some(iris_types::AttrValue::Str(v)) if !v.eq_ignore_ascii_case("cpu") => {
                v.to_ascii_lowercase()
            }
            _ => String::new(),
        };
        iris_scheduler::Worker {
            id,
            total: self.capacity.clone(),
            attributes: self.attributes.clone(),
            healthy: true,
            device_variant,
            pooled: false,
        }
    }
}

/// Controller settings.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub state_dir: PathBuf,
    pub bind: SocketAddr,
    /// The controller's revision date (`YYYY-MM-DD`) for the client freshness gate.
    pub revision_date: Option<String>,
    /// A worker is failed after this long without a successful reconcile (and ≥3 failures).
    pub worker_grace: Duration,
    pub reconcile_interval: Duration,
    /// Declared scale groups: a job no group and no worker could ever host is refused at submit.
    pub groups: Vec<GroupCapacity>,
    /// Query limits for `ExecuteRawQuery`.
    pub query_time_limit: Duration,
    pub query_max_rows: usize,
    /// Where checkpoints and the rollout record live: a local path or a `file://`, `s3://` or
    /// `gs://` URL. `None`: no checkpoints.
    pub remote_state_dir: Option<String>,
    /// Take a checkpoint this often (`None`: only on `BeginCheckpoint`).
    pub checkpoint_interval: Option<Duration>,
    /// Checkpoint directories older than this are pruned after each checkpoint.
    pub checkpoint_max_age: Duration,
    /// With no local DB, restore this checkpoint (`controller-state/<epoch_ms>`) instead of the newest.
    pub restore_checkpoint: Option<String>,
    /// `auth.*`; `None`: null-auth, every caller is the anonymous admin.
    pub auth: Option<auth::AuthConfig>,
    /// This cluster's name and its federation peers (none: no federation).
    pub federation: federation::FederationConfig,
}

impl ControllerConfig {
    pub fn local(state_dir: PathBuf) -> Self {
        ControllerConfig {
            state_dir,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            revision_date: None,
            auth: None,
            worker_grace: Duration::from_secs(10),
            reconcile_interval: Duration::from_secs(1),
            groups: Vec::new(),
            query_time_limit: Duration::from_secs(10),
            query_max_rows: 10_000,
            remote_state_dir: None,
            checkpoint_interval: None,
            checkpoint_max_age: checkpoint::DEFAULT_MAX_AGE,
            restore_checkpoint: None,
            federation: federation::FederationConfig::default(),
        }
    }
}

/// A validated submission waiting for group commit.
pub(crate) struct Admission {
    pub name: iris_types::JobName,
    pub req: iris_proto::cluster::controller::LaunchJobRequest,
    pub user: String,
    pub t: i64,
    /// An admin's SYSTEM/PRODUCTION submission with auth on skips the `max_band` ceiling.
    pub skip_band_ceiling: bool,
    /// Who submitted: a verified user id, `local_admin` for the anonymous admin, or the
    /// `submitting_user` a federation parent asserted.
    pub submitting_user: String,
    pub reply: tokio::sync::oneshot::Sender<
        Result<iris_proto::cluster::controller::LaunchJobResponse, RpcError>,
    >,
}

/// Per-worker handle held by the controller.
struct WorkerLink {
    poke: Arc<Notify>,
    generation: u64,
}

/// Shared controller state.
pub struct Controller {
    cfg: ControllerConfig,
    db: Mutex<Connection>,
    logs: Mutex<Connection>,
    readonly: Mutex<Connection>,
    verifier: Option<iris_auth::Verifier>,
    /// Verifies federation parents' tokens (`auth.federation_peers`).
    fed_verifier: Option<iris_auth::Verifier>,
    fed: federation::Federation,
    /// In-process backends (Kubernetes) by pseudo worker id.
    backends: Mutex<HashMap<String, Arc<dyn iris_backend::Backend>>>,
    /// The tick's snapshot reader (WAL: reads never block the writer).
    snap: Mutex<Connection>,
    wake: Notify,
    workers: Mutex<HashMap<String, WorkerLink>>,
    specs: Mutex<HashMap<String, Arc<JobSpec>>>,
    pending_reasons: Mutex<HashMap<String, String>>,
    generation: std::sync::atomic::AtomicU64,
    advertised: Mutex<String>,
    me: std::sync::Weak<Controller>,
    /// The remote state dir for checkpoints, if configured.
    remote: Option<checkpoint::RemoteStore>,
    /// One checkpoint at a time.
    checkpoint_lock: tokio::sync::Mutex<()>,
    admissions: tokio::sync::mpsc::UnboundedSender<Admission>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves SQLite consistent (transactions roll back on drop),
    // so recovering the guard is safe.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Controller {
    fn db(&self) -> MutexGuard<'_, Connection> {
        lock(&self.db)
    }

    /// Opens the state dir's databases.
    pub fn open(cfg: ControllerConfig) -> anyhow::Result<Arc<Controller>> {
        std::fs::create_dir_all(&cfg.state_dir)
            .with_context(|| format!("creating state dir {}", cfg.state_dir.display()))?;
        std::fs::create_dir_all(cfg.state_dir.join("bundles"))?;
        let remote = match &cfg.remote_state_dir {
            Some(r) => Some(checkpoint::RemoteStore::parse(r)?),
            None => None,
        };
        let db_path = cfg.state_dir.join("controller.sqlite3");
        let db =
            iris_store::open(&db_path).with_context(|| format!("opening {}", db_path.display()))?;
        let logs = iris_store::logs::open(&cfg.state_dir.join("logs.sqlite3"))
            .context("opening log store")?;
        let readonly =
            iris_store::query::open_readonly(&db_path).context("opening read-only connection")?;
        let snap = iris_store::open(&db_path).context("opening snapshot connection")?;
        let (admissions, mut admit_rx) = tokio::sync::mpsc::unbounded_channel::<Admission>();
        let verifier = cfg.auth.as_ref().map(auth::control_plane_verifier);
        let fed_verifier = cfg.auth.as_ref().and_then(auth::federation_verifier);
        let fed = federation::Federation::new(cfg.federation.clone())
            .map_err(|e| anyhow::anyhow!("federation peers: {}", e.message))?;
        if cfg.auth.is_some() {
            tracing::info!("auth enabled");
        }
        let ctl = Arc::new_cyclic(|me| Controller {
            cfg,
            db: Mutex::new(db),
            logs: Mutex::new(logs),
            readonly: Mutex::new(readonly),
            verifier,
            fed_verifier,
            fed,
            backends: Mutex::new(HashMap::new()),
            snap: Mutex::new(snap),
            wake: Notify::new(),
            workers: Mutex::new(HashMap::new()),
            specs: Mutex::new(HashMap::new()),
            pending_reasons: Mutex::new(HashMap::new()),
            generation: std::sync::atomic::AtomicU64::new(0),
            advertised: Mutex::new(String::new()),
            me: me.clone(),
            remote,
            checkpoint_lock: tokio::sync::Mutex::new(()),
            admissions,
        });
        let weak = Arc::downgrade(&ctl);
        // The admission batcher: a plain thread (SQLite is blocking). It ends when the controller
        // is dropped, because the channel's only sender lives in the controller.
        std::thread::Builder::new()
            .name("iris-admit".into())
            .spawn(move || {
                while let Some(first) = admit_rx.blocking_recv() {
                    let mut batch = vec![first];
                    while batch.len() < 256 {
                        match admit_rx.try_recv() {
                            Ok(a) => batch.push(a),
                            Err(_) => break,
                        }
                    }
                    match weak.upgrade() {
                        Some(c) => c.admit_batch(batch),
                        None => return,
                    }
                }
            })
            .context("starting the admission thread")?;
        Ok(ctl)
    }

    fn self_arc(&self) -> Option<Arc<Controller>> {
        self.me.upgrade()
    }

    /// A task token for an attempt of `job_id` (reference §2.1: role task, the job owner as
    /// subject, `job_id` claim, 30 days), or empty when auth is off.
    fn task_token(&self, job_id: &str, owner: &str) -> String {
        let Some(a) = &self.cfg.auth else {
            return String::new();
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let extra = std::collections::BTreeMap::from([(
            "job_id".to_string(),
            serde_json::Value::from(job_id),
        )]);
        a.keypair
            .mint(&a.issuer, "iris", owner, "task", 30 * 86400, now, extra)
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, job = %job_id, "minting a task token");
                String::new()
            })
    }

    /// Wakes the control tick.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Loads (and caches) a job's spec.
    fn spec(&self, conn: &Connection, job_id: &str) -> Result<Option<Arc<JobSpec>>, RpcError> {
        if let Some(s) = lock(&self.specs).get(job_id) {
            return Ok(Some(s.clone()));
        }
        let row: Option<(Vec<u8>, i32, String, i64)> = {
            use iris_store::rusqlite::OptionalExtension;
            conn.prepare_cached(
                "SELECT c.request_blob, c.priority_band, j.user_id, j.depth FROM job_config c JOIN jobs j ON j.job_id = c.job_id WHERE c.job_id = ?1",
            )
            .and_then(|mut st| st.query_row([job_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).optional())
            .map_err(internal)?
        };
        let Some((blob, band, user, depth)) = row else {
            return Ok(None);
        };
        let req = <iris_proto::cluster::controller::LaunchJobRequest as prost::Message>::decode(
            blob.as_slice(),
        )
        .map_err(|e| RpcError::internal(format!("stored request for {job_id} is corrupt: {e}")))?;
        let band = iris_types::Band::from_code(band).unwrap_or(iris_types::Band::Interactive);
        let spec = Arc::new(JobSpec::from_request(req, band, user, depth as u32));
        lock(&self.specs).insert(job_id.to_string(), spec.clone());
        Ok(Some(spec))
    }

    fn forget_spec(&self, job_id: &str) {
        let prefix = format!("{job_id}/");
        lock(&self.specs).retain(|k, _| k != job_id && !k.starts_with(&prefix));
    }

    /// The controller's URL as workers and clients reach it.
    pub fn url(&self) -> String {
        lock(&self.advertised).clone()
    }
}

pub(crate) fn internal(e: impl std::fmt::Display) -> RpcError {
    tracing::error!(error = %e, "internal error");
    RpcError::internal(format!("internal error: {e}"))
}

/// A running controller.
pub struct RunningController {
    pub controller: Arc<Controller>,
    pub addr: SocketAddr,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl RunningController {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving and the background loops.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.server.await;
    }
}

/// The controller's HTTP routes (Connect services, blobs) with the request-size guard.
pub fn router(ctl: Arc<Controller>) -> axum::Router {
    limits::guard(service::router(ctl))
}

/// Opens the state dir, binds, and starts the server, the tick and reconcilers for known workers.
pub async fn start(cfg: ControllerConfig) -> anyhow::Result<RunningController> {
    let bind = cfg.bind;
    // Rollback requests and restores happen before the DB is opened.
    let prepared = checkpoint::prepare(&cfg).await?;
    let ctl = Controller::open(cfg)?;
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .with_context(|| format!("binding controller to {bind}"))?;
    let addr = listener.local_addr()?;
    *lock(&ctl.advertised) = format!("http://{addr}");
    let (tx, rx) = tokio::sync::watch::channel(false);
    let app = router(ctl.clone());
    // Owned by RunningController: stops when the shutdown channel fires.
    tokio::spawn(tick::run(ctl.clone(), rx.clone()));
    if let Some(every) = ctl.cfg.checkpoint_interval {
        // Owned by RunningController: stops when the shutdown channel fires.
        tokio::spawn(checkpoint::periodic(ctl.clone(), every, rx.clone()));
    }
    if let (Some(remote), Some(mut rec)) = (&prepared.remote, prepared.commit_rollout) {
        rec.phase = checkpoint::RolloutPhase::Committed;
        remote.write_rollout(&rec).await?;
    }
    reconcile::start_known_workers(&ctl, rx.clone())?;
    federation::start(&ctl, rx.clone());
    let mut srx = rx.clone();
    let server = tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = srx.wait_for(|v| *v).await;
        })
        .await;
    });
    Ok(RunningController {
        controller: ctl,
        addr,
        shutdown: tx,
        server,
    })
}
