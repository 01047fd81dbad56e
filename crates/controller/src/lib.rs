//! The Iris controller: the single writer of the controller DB. It serves
//! `iris.cluster.ControllerService` (Connect), runs the control tick (schedule → commit →
//! wake reconcilers), and reconciles each worker with its desired set of attempts.
//!
//! Architecture invariant: state changes are committed before any effect reaches a worker;
//! workers only learn intent from the committed desired set (see `reconcile`).

mod accounts;
mod admission;
pub mod auth;
mod autoscale;
pub mod backend;
pub mod checkpoint;
mod config;
mod error;
mod explain;
pub mod federation;
mod highlights;
mod inspect;
mod limits;
mod metrics;
mod observe;
mod pending;
mod proxy;
mod prune;
mod reconcile;
mod rpc;
mod serve;
pub mod spec;
mod stats;
#[cfg(test)]
mod testutil;
mod tick;
mod views;

pub use autoscale::SliceProvider;
pub use config::{BudgetDefaults, BudgetTier, ControllerConfig, GroupCapacity};
pub use error::Error;

use anyhow::Context;
use error::Result;
use iris_store::logs::LogDb;
use iris_store::query::ReadOnlyDb;
use iris_store::Db;
use spec::JobSpec;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

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
    pub reply:
        tokio::sync::oneshot::Sender<Result<iris_proto::cluster::controller::LaunchJobResponse>>,
}

/// Per-worker handle held by the controller.
struct WorkerLink {
    poke: Arc<Notify>,
    generation: u64,
}

/// Shared controller state.
pub struct Controller {
    cfg: ControllerConfig,
    /// The writer connection. `parking_lot`'s lock, for its fair hand-over
    /// (`MutexGuard::unlock_fair`): the observation writer, which would otherwise hold it back to
    /// back, lets the tick and admission in between its transactions (`crate::observe`).
    db: parking_lot::Mutex<Db>,
    /// Threads waiting for [`Controller::db`] (the observation writer ends its transaction early
    /// for them: `crate::observe`).
    writer_wanted: std::sync::atomic::AtomicUsize,
    logs: Mutex<LogDb>,
    /// finelog's stats store (`crate::stats`).
    stats: Mutex<iris_store::stats::StatsDb>,
    /// Task resource samples on their way to `iris.task`.
    usage: Mutex<stats::UsageBuffer>,
    readonly: Mutex<ReadOnlyDb>,
    /// Endpoint lookups (every proxied request, `ListEndpoints`) on their own WAL connection, so
    /// they never wait for the writer.
    endpoint_db: Mutex<Db>,
    verifier: Option<iris_auth::Verifier>,
    /// Verifies federation parents' tokens (`auth.federation_peers`).
    fed_verifier: Option<iris_auth::Verifier>,
    fed: federation::Federation,
    /// In-process backends (Kubernetes) by backend id.
    backends: Mutex<HashMap<String, Arc<dyn iris_backend::Backend>>>,
    /// Each backend's latest registration as a placement target (a backend has no worker row).
    backend_targets: Mutex<BTreeMap<String, iris_scheduler::Worker>>,
    /// The tick's snapshot reader (WAL: reads never block the writer).
    snap: Mutex<Db>,
    /// Workers and running tasks indexed as of the last tick: each tick applies only what
    /// changed since (`Cluster::sync`) instead of re-indexing every running task.
    cluster: Mutex<iris_scheduler::Cluster>,
    /// Pending tasks and open attempts as of the last tick: each tick re-reads only the rows
    /// written since (`pending::Kept`).
    kept: Mutex<pending::Kept>,
    /// The worker rows last read, by workers' generation (`tick::WorkerRows`).
    worker_rows: Mutex<Option<tick::WorkerRows>>,
    wake: Notify,
    workers: Mutex<HashMap<String, WorkerLink>>,
    /// Workers that registered with, or answered a reconcile from, this run of the controller.
    /// Only they get new work: after a restart the DB still lists the previous run's workers,
    /// which may be gone.
    confirmed: Mutex<std::collections::HashSet<String>>,
    /// Parsed job specs, most recently used kept: every job's would grow with the DB (a million
    /// finished jobs' requests), and a miss only costs one row and one decode.
    specs: Mutex<hashlink::LruCache<String, Arc<JobSpec>>>,
    pending_reasons: Mutex<views::PendingReasons>,
    generation: std::sync::atomic::AtomicU64,
    advertised: Mutex<String>,
    me: std::sync::Weak<Controller>,
    /// The remote state dir for checkpoints, if configured.
    remote: Option<checkpoint::RemoteStore>,
    /// One checkpoint at a time.
    checkpoint_lock: tokio::sync::Mutex<()>,
    /// The last checkpoint failure, for `GetCheckpointStatus`.
    checkpoint_health: Mutex<checkpoint::Health>,
    admissions: tokio::sync::mpsc::UnboundedSender<Admission>,
    /// Reconcile answers on their way to the observation writer (`crate::observe`).
    observations: observe::Sender,
    /// The reconcile loops' reader for desired sets (WAL: never waits for the writer).
    reconcile_reader: Mutex<Db>,
    /// The read RPCs' connection (job and task status, listings): each reads in one WAL read
    /// transaction, so it neither waits behind a commit nor holds one up.
    rpc_reader: Mutex<Db>,
    /// The HTTP clients `/proxy` forwards with (kept for their connection pools), built on the
    /// first proxied request: most controllers never proxy, and building them reads the system's
    /// CA roots.
    upstreams: std::sync::OnceLock<proxy::Upstreams>,
    /// `/metrics`.
    metrics: metrics::Metrics,
    /// The scale-group autoscaler's state (`crate::autoscale`).
    autoscale: Mutex<autoscale::State>,
}

/// Starts thread `name`, which hands what arrives on `rx` to `write` in batches of at most
/// `max` (whatever queued while the previous batch was written: group commit). It ends when the
/// channel closes or the controller is gone.
fn spawn_batcher<T: Send + 'static>(
    name: &str,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
    max: usize,
    ctl: std::sync::Weak<Controller>,
    write: fn(&Controller, Vec<T>),
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            while let Some(first) = rx.blocking_recv() {
                let mut batch = vec![first];
                while batch.len() < max {
                    match rx.try_recv() {
                        Ok(item) => batch.push(item),
                        Err(_) => break,
                    }
                }
                let Some(c) = ctl.upgrade() else { return };
                write(&c, batch);
            }
        })?;
    Ok(())
}

/// How often the WAL checkpointer copies the controller DB's WAL into the DB file. Under a
/// storm of submits the WAL grows by about 10,000 pages a second; a passive checkpoint with
/// nothing to copy reads the WAL index and returns.
const WAL_CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// How large the controller DB's WAL may grow (pages of 4 KiB) before a writer's commit copies
/// what the checkpoint thread has not, and so lets the WAL start over (SQLite's default is 1,000).
/// A commit that copies also syncs the WAL and the DB file while it holds the one writer
/// connection: at 10,000 pages the C1M run's WAL stayed past the mark (readers pin its tail), and
/// the observation writer spent ~16% of its time in disk waits (`D` state,
/// `fsync`'s writeback) instead of ~5% at 100,000; end to end +4–6% in two alternating runs, for a
/// WAL of up to ~0.5 GB under that load (BENCHMARKS.md, C1M).
const WAL_PAGES_BEFORE_A_COMMIT_COPIES: u32 = 100_000;

/// The thread that checkpoints the controller DB's WAL, so that its writers' commits find
/// little to copy (`Db::checkpoint_on_commit_past`). It ends within one period of the
/// controller's drop.
fn spawn_wal_checkpointer(db: Db, ctl: std::sync::Weak<Controller>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("iris-wal".into())
        .spawn(move || loop {
            std::thread::sleep(WAL_CHECKPOINT_EVERY);
            if ctl.strong_count() == 0 {
                return;
            }
            if let Err(e) = db.checkpoint_wal() {
                tracing::warn!(error = %e, "checkpointing the controller DB's WAL failed; trying again");
            }
        })?;
    Ok(())
}

/// How many jobs' parsed specs the controller keeps in memory (about a kilobyte each).
const SPEC_CACHE_JOBS: usize = 50_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves SQLite consistent (transactions roll back on drop),
    // so recovering the guard is safe.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Who holds the writer connection, for `iris_writer_held_seconds_total{by}`: the three paths
/// that share it under load, and everything else (RPC writes, federation, pruning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriterUse {
    Admission,
    Tick,
    Observation,
    Other,
}

impl WriterUse {
    /// Every user, in declaration order (`self as usize` indexes it).
    pub(crate) const ALL: [WriterUse; 4] = [
        WriterUse::Admission,
        WriterUse::Tick,
        WriterUse::Observation,
        WriterUse::Other,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            WriterUse::Admission => "admission",
            WriterUse::Tick => "tick",
            WriterUse::Observation => "observation",
            WriterUse::Other => "other",
        }
    }
}

/// The writer connection, held: counts the time it is held toward its user's share of
/// `iris_writer_held_seconds_total` when released. The writer's time is the controller's scarce
/// resource at scale (one connection commits everything), and the time each path waits for it
/// (in `admission_commit_duration_seconds`, say) does not add up to it.
pub(crate) struct Writer<'a> {
    guard: Option<parking_lot::MutexGuard<'a, Db>>,
    since: std::time::Instant,
    by: WriterUse,
    metrics: &'a metrics::Metrics,
}

impl Writer<'_> {
    /// Releases the connection to the thread that has waited longest (`crate::observe`).
    pub(crate) fn unlock_fair(mut self) {
        self.record();
        if let Some(g) = self.guard.take() {
            parking_lot::MutexGuard::unlock_fair(g);
        }
    }

    fn record(&self) {
        self.metrics.writer_held(self.by, self.since.elapsed());
    }
}

impl std::ops::Deref for Writer<'_> {
    type Target = Db;
    fn deref(&self) -> &Db {
        // Only `unlock_fair`, which consumes the writer, takes the guard out.
        self.guard
            .as_deref()
            .expect("the writer is held until dropped")
    }
}

impl std::ops::DerefMut for Writer<'_> {
    fn deref_mut(&mut self) -> &mut Db {
        self.guard
            .as_deref_mut()
            .expect("the writer is held until dropped")
    }
}

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        if self.guard.is_some() {
            self.record();
        }
    }
}

impl Controller {
    /// The writer connection (one for the whole controller), for a path not named in
    /// [`WriterUse`].
    fn db(&self) -> Writer<'_> {
        self.writer(WriterUse::Other)
    }

    /// The writer connection, its holding time counted as `by`'s.
    fn writer(&self, by: WriterUse) -> Writer<'_> {
        use std::sync::atomic::Ordering::Relaxed;
        let guard = match self.db.try_lock() {
            Some(conn) => conn,
            None => {
                self.writer_wanted.fetch_add(1, Relaxed);
                let conn = self.db.lock();
                self.writer_wanted.fetch_sub(1, Relaxed);
                conn
            }
        };
        Writer {
            guard: Some(guard),
            since: std::time::Instant::now(),
            by,
            metrics: &self.metrics,
        }
    }

    /// Whether another thread waits for the writer connection.
    fn writer_wanted(&self) -> bool {
        self.writer_wanted
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    }

    /// Tests: behave as if another thread waited for the writer connection (or stop).
    #[cfg(test)]
    pub(crate) fn pretend_writer_wanted(&self, wanted: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if wanted {
            self.writer_wanted.fetch_add(1, Relaxed);
        } else {
            self.writer_wanted.fetch_sub(1, Relaxed);
        }
    }

    /// The read RPCs' connection; read in one `begin_read` transaction on it.
    fn reader(&self) -> MutexGuard<'_, Db> {
        lock(&self.rpc_reader)
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
        let mut db =
            Db::open(&db_path).with_context(|| format!("opening {}", db_path.display()))?;
        let n = accounts::apply_budget_tiers(&mut db, &cfg.budget_tiers)
            .context("applying the config's user_budgets")?;
        if n > 0 {
            tracing::info!(
                assignments = n,
                "user budgets from the cluster config applied"
            );
        }
        // The one writer connection keeps its pages across its own commits (only another
        // connection's commit empties a WAL reader's cache), so a cache larger than a
        // transaction's working set saves the re-reads, and spares the mid-transaction spills
        // of dirty pages to the WAL that the 2 MiB default caused at C1M shape.
        db.set_page_cache_mib(64)?;
        let logs = iris_store::logs::open(&cfg.state_dir.join("logs.sqlite3"))
            .context("opening log store")?;
        let stats = iris_store::stats::open(
            &cfg.state_dir.join("stats.sqlite3"),
            Some(&cfg.state_dir.join("logs.sqlite3")),
        )
        .context("opening the stats store")?;
        let readonly =
            iris_store::query::open_readonly(&db_path).context("opening read-only connection")?;
        let snap = Db::open(&db_path).context("opening snapshot connection")?;
        // The tick re-reads thousands of scattered task and attempt rows a tick at scale.
        snap.set_page_cache_mib(64)?;
        let endpoint_db = Db::open(&db_path).context("opening endpoint connection")?;
        let reconcile_reader = Db::open(&db_path).context("opening the reconcile reader")?;
        let rpc_reader = Db::open(&db_path).context("opening the RPC reader")?;
        // WAL checkpoints run mostly on a thread of their own (`spawn_wal_checkpointer`); a
        // writer's commit copies what is left only past WAL_PAGES_BEFORE_A_COMMIT_COPIES.
        let wal = Db::open(&db_path).context("opening the WAL checkpoint connection")?;
        for c in [&db, &endpoint_db] {
            c.checkpoint_on_commit_past(WAL_PAGES_BEFORE_A_COMMIT_COPIES)?;
        }
        let (admissions, admit_rx) = tokio::sync::mpsc::unbounded_channel::<Admission>();
        let verifier = cfg.auth.as_ref().map(auth::control_plane_verifier);
        let fed_verifier = cfg.auth.as_ref().and_then(auth::federation_verifier);
        let fed = federation::Federation::new(cfg.federation.clone())
            .map_err(|e| anyhow::anyhow!("federation peers: {e}"))?;
        if cfg.auth.is_some() {
            tracing::info!("auth enabled");
        }
        let (observations, observe_rx) = tokio::sync::mpsc::unbounded_channel();
        let ctl = Arc::new_cyclic(|me| Controller {
            cfg,
            db: parking_lot::Mutex::new(db),
            writer_wanted: Default::default(),
            logs: Mutex::new(logs),
            stats: Mutex::new(stats),
            usage: Mutex::new(Default::default()),
            readonly: Mutex::new(readonly),
            endpoint_db: Mutex::new(endpoint_db),
            verifier,
            fed_verifier,
            fed,
            backends: Mutex::new(HashMap::new()),
            backend_targets: Mutex::new(BTreeMap::new()),
            snap: Mutex::new(snap),
            cluster: Mutex::new(iris_scheduler::Cluster::default()),
            kept: Mutex::new(Default::default()),
            worker_rows: Mutex::new(None),
            wake: Notify::new(),
            workers: Mutex::new(HashMap::new()),
            confirmed: Mutex::new(std::collections::HashSet::new()),
            autoscale: Mutex::new(autoscale::State::default()),
            specs: Mutex::new(hashlink::LruCache::new(SPEC_CACHE_JOBS)),
            pending_reasons: Mutex::new(Default::default()),
            generation: std::sync::atomic::AtomicU64::new(0),
            advertised: Mutex::new(String::new()),
            me: me.clone(),
            remote,
            checkpoint_lock: tokio::sync::Mutex::new(()),
            checkpoint_health: Mutex::new(checkpoint::Health::default()),
            admissions,
            observations,
            reconcile_reader: Mutex::new(reconcile_reader),
            rpc_reader: Mutex::new(rpc_reader),
            upstreams: std::sync::OnceLock::new(),
            metrics: metrics::Metrics::new(),
        });
        let weak = Arc::downgrade(&ctl);
        // Both writers are plain threads (SQLite is blocking). Each ends when the controller is
        // dropped, because its channel's only sender lives in the controller.
        spawn_batcher(
            "iris-observe",
            observe_rx,
            512,
            weak.clone(),
            observe::write_batch,
        )
        .context("starting the observation writer")?;
        spawn_batcher(
            "iris-admit",
            admit_rx,
            256,
            weak.clone(),
            Controller::admit_batch,
        )
        .context("starting the admission thread")?;
        spawn_wal_checkpointer(wal, weak).context("starting the WAL checkpointer")?;
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

    /// Loads (and caches) a job's spec (its stored request with its secrets).
    fn spec(&self, conn: &impl iris_store::Read, job_id: &str) -> Result<Option<Arc<JobSpec>>> {
        if let Some(s) = lock(&self.specs).get(job_id) {
            return Ok(Some(s.clone()));
        }
        let Some(row) = iris_store::jobs::spec_row(conn, job_id)? else {
            return Ok(None);
        };
        let req = stored_request(conn, job_id, &row.request_blob)?;
        let band = iris_types::Band::from_code(row.band).unwrap_or(iris_types::Band::Interactive);
        let spec = Arc::new(JobSpec::from_request(req, band, row.user, row.depth as u32));
        lock(&self.specs).insert(job_id.to_string(), spec.clone());
        Ok(Some(spec))
    }

    /// Drops a replaced job's log lines (its tasks' and its children's), once the replacement is
    /// committed; before its new tasks write any.
    fn forget_logs(&self, job_id: &str) {
        let mut logs = lock(&self.logs);
        if let Err(e) = iris_store::logs::delete_under(&mut logs, &format!("{job_id}/")) {
            tracing::warn!(job = %job_id, error = %e, "dropping the replaced job's logs");
        }
    }

    fn upstreams(&self) -> &proxy::Upstreams {
        self.upstreams.get_or_init(proxy::Upstreams::new)
    }

    /// Drops a replaced job's cached spec and its children's (a scan of the cache: replacing a
    /// job is rare).
    fn forget_spec(&self, job_id: &str) {
        let prefix = format!("{job_id}/");
        let mut specs = lock(&self.specs);
        let gone: Vec<String> = specs
            .iter()
            .map(|(k, _)| k)
            .filter(|k| *k == job_id || k.starts_with(&prefix))
            .cloned()
            .collect();
        for k in gone {
            specs.remove(&k);
        }
        drop(specs);
        // A tick between the replacement's commit and this may have kept the new tasks with
        // the old spec: the next one reads every pending task again, with the new.
        lock(&self.kept).distrust();
    }

    /// The controller's URL as workers and clients reach it.
    pub fn url(&self) -> String {
        lock(&self.advertised).clone()
    }
}

/// A job's stored request (`job_config.request_blob`) decoded, with the secrets the store keeps
/// apart put back: what its tasks and a federation peer receive.
fn stored_request(
    conn: &impl iris_store::Read,
    job_id: &str,
    blob: &[u8],
) -> Result<iris_proto::cluster::controller::LaunchJobRequest> {
    let mut req =
        <iris_proto::cluster::controller::LaunchJobRequest as prost::Message>::decode(blob)
            .map_err(|e| Error::internal(format!("stored request for {job_id} is corrupt: {e}")))?;
    let secrets = iris_store::jobs::secrets(conn, job_id)?;
    if !secrets.is_empty() {
        req.environment
            .get_or_insert_with(Default::default)
            .secrets
            .extend(secrets);
    }
    Ok(req)
}

/// A running controller.
pub struct RunningController {
    pub controller: Arc<Controller>,
    pub addr: SocketAddr,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    /// One controller per state dir, for as long as this one runs.
    _state_lock: iris_rpc::dirlock::DirLock,
}

impl RunningController {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Runs the scale-group autoscaler with `provider` starting and stopping slices, until
    /// shutdown. Groups without an autoscale policy are left alone.
    pub fn autoscale(&self, provider: Arc<dyn SliceProvider>) {
        // Owned by RunningController: stops when the shutdown channel fires.
        tokio::spawn(autoscale::run(
            self.controller.clone(),
            provider,
            self.shutdown.subscribe(),
        ));
    }

    /// Stops serving and the background loops.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.server.await;
    }
}

/// The controller's HTTP routes: Connect services and blobs behind the request-size guard, and
/// `/proxy` (whose bodies stream, unbounded).
pub fn router(ctl: Arc<Controller>) -> axum::Router {
    limits::guard(rpc::router(ctl.clone())).merge(proxy::router(ctl))
}

/// `--fresh`: the state dir's DB (with its WAL and shared-memory files) is renamed to
/// `controller.sqlite3.set-aside-<epoch_ms>` so the controller starts empty; nothing is deleted.
fn set_aside_db(state_dir: &std::path::Path) -> anyhow::Result<()> {
    let db = state_dir.join("controller.sqlite3");
    if !db.exists() {
        return Ok(());
    }
    let stamp = iris_store::now_ms();
    for suffix in ["", "-wal", "-shm"] {
        let from = state_dir.join(format!("controller.sqlite3{suffix}"));
        if from.exists() {
            let to = state_dir.join(format!("controller.sqlite3.set-aside-{stamp}{suffix}"));
            std::fs::rename(&from, &to).with_context(|| {
                format!(
                    "--fresh: setting {} aside as {}",
                    from.display(),
                    to.display()
                )
            })?;
        }
    }
    tracing::warn!(
        set_aside = %state_dir.join(format!("controller.sqlite3.set-aside-{stamp}")).display(),
        "--fresh: the previous DB was set aside; starting empty"
    );
    Ok(())
}

/// Opens the state dir, binds, and starts the server, the tick and reconcilers for known workers.
pub async fn start(cfg: ControllerConfig) -> anyhow::Result<RunningController> {
    let bind = cfg.bind;
    std::fs::create_dir_all(&cfg.state_dir)
        .with_context(|| format!("creating state dir {}", cfg.state_dir.display()))?;
    // Before anything reads or writes the state dir (a restore, the DB): two controllers on one
    // DB would assign tasks to each other's workers.
    let state_lock = iris_rpc::dirlock::DirLock::acquire(&cfg.state_dir, "controller")?;
    // Rollback requests and restores happen before the DB is opened.
    if cfg.fresh {
        set_aside_db(&cfg.state_dir)?;
    }
    // Fresh means no restore, unless a checkpoint is named explicitly.
    let prepared = if cfg.fresh && cfg.restore_checkpoint.is_none() {
        checkpoint::Prepared {
            remote: match &cfg.remote_state_dir {
                Some(spec) => Some(checkpoint::RemoteStore::parse(spec)?),
                None => None,
            },
            ..Default::default()
        }
    } else {
        checkpoint::prepare(&cfg).await?
    };
    let ctl = Controller::open(cfg)?;
    if prepared.restored.is_some() {
        // Hubs' sync cursors point into the history the checkpoint does not have.
        let mut conn = ctl.db();
        let tx = conn.begin()?;
        iris_store::federation::start_new_history(&tx, iris_store::now_ms())?;
        tx.commit()?;
    }
    {
        let mut health = lock(&ctl.checkpoint_health);
        health.restored = prepared.restored;
        health.startup_notes = prepared.notes.clone();
    }
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .with_context(|| format!("binding controller to {bind}"))?;
    let addr = listener.local_addr()?;
    *lock(&ctl.advertised) = format!("http://{addr}");
    state_lock
        .record(Some(&format!("http://{addr}")))
        .with_context(|| format!("writing {}", state_lock.path().display()))?;
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
    // Owned by RunningController: stops when the shutdown channel fires.
    tokio::spawn(prune::periodic(ctl.clone(), rx.clone()));
    // Owned by RunningController: stops when the shutdown channel fires.
    tokio::spawn(stats::periodic(ctl.clone(), rx.clone()));
    reconcile::start_known_workers(&ctl, rx.clone())?;
    federation::start(&ctl, rx.clone());
    let server = tokio::spawn(serve::serve(listener, app, rx.clone()));
    Ok(RunningController {
        controller: ctl,
        addr,
        shutdown: tx,
        server,
        _state_lock: state_lock,
    })
}
