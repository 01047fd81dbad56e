//! Checkpoints and the rollout record (reference §9.3–9.4).
//!
//! A checkpoint is a consistent online copy of `controller.sqlite3` (`VACUUM INTO` from a read
//! connection, so the writer is never blocked), switched to DELETE journal mode, compressed with
//! zstd level 3 and stored at `<remote_state_dir>/controller-state/<epoch_ms>/controller.sqlite3.zst`.
//! `remote_state_dir` is a local path or a `file://`, `s3://` or `gs://` URL (`object_store`).
//! The log store (`logs.sqlite3`) is not part of a checkpoint: it stays in the local state dir.
//!
//! On start, before the DB is opened: a rollout record in `rollback_requested` restores its
//! checkpoint once (then reads `rolled_back`); otherwise, when `controller.sqlite3` is absent,
//! the newest checkpoint (or the one named by `restore_checkpoint`) is restored. A restored DB
//! must pass `PRAGMA quick_check` before it replaces anything.

use crate::ControllerConfig;
use anyhow::{bail, Context};
use futures::TryStreamExt;
use iris_proto::cluster::controller as c;
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Directory (under the remote state dir) that holds one sub-directory per checkpoint.
pub const STATE_DIR: &str = "controller-state";
/// The compressed DB inside a checkpoint directory.
pub const DB_OBJECT: &str = "controller.sqlite3.zst";
/// The uncompressed form, accepted on restore.
pub const DB_OBJECT_RAW: &str = "controller.sqlite3";
/// The rollout record, at the root of the remote state dir.
pub const ROLLOUT_RECORD: &str = "rollout-record.json";
/// `meta` key stamped after a checkpoint is stored (and after a restore).
pub use iris_store::checkpoint::META_KEY;
/// Default age after which checkpoint directories are pruned.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(3 * 24 * 3600);

/// A remote state dir: an object store plus the prefix inside it.
#[derive(Clone)]
pub struct RemoteStore {
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    /// The location as configured (for messages and `checkpoint_path`).
    display: String,
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteStore({})", self.display)
    }
}

impl RemoteStore {
    /// Parses a local path or a `file://`, `s3://` or `gs://` URL. Local directories are created.
    /// Cloud stores take their credentials and region from the usual environment variables.
    pub fn parse(spec: &str) -> anyhow::Result<RemoteStore> {
        let spec = spec.trim();
        if spec.is_empty() {
            bail!("remote_state_dir is empty");
        }
        let display = spec.trim_end_matches('/').to_string();
        if !spec.contains("://") {
            return Self::local(Path::new(spec), display);
        }
        let url = url::Url::parse(spec)
            .with_context(|| format!("remote_state_dir {spec:?} is not a valid URL"))?;
        let prefix = ObjPath::from_url_path(url.path())
            .with_context(|| format!("remote_state_dir {spec:?}: invalid path"))?;
        let store: Arc<dyn ObjectStore> = match url.scheme() {
            "file" => {
                let p = url.to_file_path().map_err(|_| {
                    anyhow::anyhow!("remote_state_dir {spec:?}: not a local file URL")
                })?;
                return Self::local(&p, display);
            }
            "s3" | "s3a" => Arc::new(
                object_store::aws::AmazonS3Builder::from_env()
                    .with_url(spec)
                    .build()
                    .with_context(|| format!("remote_state_dir {spec:?}: configuring S3"))?,
            ),
            "gs" => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(spec)
                    .build()
                    .with_context(|| format!("remote_state_dir {spec:?}: configuring GCS"))?,
            ),
            other => bail!(
                "remote_state_dir {spec:?}: unsupported scheme {other:?} (use a local path, file://, s3:// or gs://)"
            ),
        };
        Ok(RemoteStore {
            store,
            prefix,
            display,
        })
    }

    fn local(dir: &Path, display: String) -> anyhow::Result<RemoteStore> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating remote state dir {}", dir.display()))?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(dir)
            .with_context(|| format!("opening remote state dir {}", dir.display()))?
            .with_automatic_cleanup(true);
        Ok(RemoteStore {
            store: Arc::new(fs),
            prefix: ObjPath::default(),
            display,
        })
    }

    /// The configured location.
    pub fn location(&self) -> &str {
        &self.display
    }

    fn path(&self, rel: &str) -> ObjPath {
        rel.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.prefix.clone(), |p, part| p.child(part))
    }

    async fn put(&self, rel: &str, data: Vec<u8>) -> anyhow::Result<()> {
        self.store
            .put(&self.path(rel), data.into())
            .await
            .with_context(|| format!("writing {}/{rel}", self.display))?;
        Ok(())
    }

    async fn get(&self, rel: &str) -> anyhow::Result<Option<Vec<u8>>> {
        match self.store.get(&self.path(rel)).await {
            Ok(r) => Ok(Some(
                r.bytes()
                    .await
                    .with_context(|| format!("reading {}/{rel}", self.display))?
                    .to_vec(),
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}/{rel}", self.display)),
        }
    }

    /// Epoch-ms names of the checkpoint directories, ascending.
    pub async fn checkpoints(&self) -> anyhow::Result<Vec<i64>> {
        let dir = self.path(STATE_DIR);
        let listed = match self.store.list_with_delimiter(Some(&dir)).await {
            Ok(l) => l,
            Err(object_store::Error::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => {
                return Err(e).with_context(|| format!("listing {}/{STATE_DIR}", self.display))
            }
        };
        let mut out: Vec<i64> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().and_then(|n| n.parse().ok()))
            .collect();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    async fn delete_dir(&self, rel: &str) -> anyhow::Result<()> {
        let dir = self.path(rel);
        let objects: Vec<object_store::ObjectMeta> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .with_context(|| format!("listing {}/{rel}", self.display))?;
        for o in objects {
            match self.store.delete(&o.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e).with_context(|| format!("deleting {}", o.location)),
            }
        }
        Ok(())
    }

    /// Reads the rollout record, if any.
    pub async fn read_rollout(&self) -> anyhow::Result<Option<RolloutRecord>> {
        match self.get(ROLLOUT_RECORD).await? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b).map(Some).with_context(|| {
                format!(
                    "{}/{ROLLOUT_RECORD} is not a valid rollout record",
                    self.display
                )
            }),
        }
    }

    /// Writes the rollout record (stamping `updated_at_ms`).
    pub async fn write_rollout(&self, rec: &RolloutRecord) -> anyhow::Result<()> {
        let mut rec = rec.clone();
        rec.updated_at_ms = iris_store::now_ms();
        let text = serde_json::to_vec_pretty(&rec)?;
        self.put(ROLLOUT_RECORD, text).await
    }

    /// `<location>/controller-state/<epoch_ms>`.
    pub fn checkpoint_location(&self, epoch_ms: i64) -> String {
        format!("{}/{STATE_DIR}/{epoch_ms}", self.display)
    }
}

/// Phase of a controller rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutPhase {
    Pending,
    Committed,
    RollbackRequested,
    RolledBack,
}

/// `<remote_state_dir>/rollout-record.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub phase: RolloutPhase,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub previous_image: String,
    /// A `controller-state/<epoch_ms>` directory.
    #[serde(default)]
    pub rollback_checkpoint: String,
    #[serde(default)]
    pub updated_at_ms: i64,
}

/// Parses a checkpoint name: `<epoch_ms>`, `controller-state/<epoch_ms>`, or any path or URL
/// ending in those.
pub fn parse_checkpoint_name(name: &str) -> anyhow::Result<i64> {
    let last = name
        .trim()
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    last.parse::<i64>().map_err(|_| {
        anyhow::anyhow!(
            "checkpoint {name:?}: expected a {STATE_DIR}/<epoch_ms> directory (or its epoch_ms)"
        )
    })
}

/// Takes a consistent copy of the DB at `db_path` into memory, ready for upload, with row counts.
fn snapshot_db(db_path: &Path, tmp: &Path) -> anyhow::Result<(Vec<u8>, [i32; 3])> {
    let _ = std::fs::remove_file(tmp);
    let counts = iris_store::checkpoint::copy_to(db_path, tmp).with_context(|| {
        format!(
            "copying {} for a checkpoint (VACUUM INTO)",
            db_path.display()
        )
    })?;
    let raw = std::fs::read(tmp)?;
    let _ = std::fs::remove_file(tmp);
    let zst = zstd::encode_all(raw.as_slice(), 3).context("compressing the checkpoint")?;
    Ok((zst, counts))
}

/// Takes a checkpoint of the state dir's DB into `remote`, then prunes directories older than
/// `max_age` (never the newest). Returns the epoch-ms name and the row counts.
pub async fn take(
    state_dir: &Path,
    remote: &RemoteStore,
    max_age: Duration,
) -> anyhow::Result<(i64, [i32; 3])> {
    let epoch_ms = {
        // Directory names are unique and increasing even for two checkpoints in one ms.
        let newest = remote.checkpoints().await?.last().copied().unwrap_or(0);
        iris_store::now_ms().max(newest + 1)
    };
    let db_path = state_dir.join("controller.sqlite3");
    let tmp = state_dir.join(format!("checkpoint-{epoch_ms}.tmp"));
    let (zst, counts) = tokio::task::spawn_blocking(move || snapshot_db(&db_path, &tmp))
        .await
        .context("checkpoint thread")??;
    remote
        .put(&format!("{STATE_DIR}/{epoch_ms}/{DB_OBJECT}"), zst)
        .await?;
    prune(remote, max_age, epoch_ms).await?;
    Ok((epoch_ms, counts))
}

async fn prune(remote: &RemoteStore, max_age: Duration, keep: i64) -> anyhow::Result<()> {
    let cutoff = iris_store::now_ms() - max_age.as_millis() as i64;
    for ms in remote.checkpoints().await? {
        if ms < cutoff && ms != keep {
            tracing::info!(checkpoint = ms, "pruning old checkpoint");
            remote.delete_dir(&format!("{STATE_DIR}/{ms}")).await?;
        }
    }
    Ok(())
}

/// Downloads checkpoint `epoch_ms`, checks it, and installs it as the state dir's DB (replacing
/// any DB and WAL there). The previous DB files are removed only after the copy passed
/// `PRAGMA quick_check`.
pub async fn restore(state_dir: &Path, remote: &RemoteStore, epoch_ms: i64) -> anyhow::Result<()> {
    let dir = format!("{STATE_DIR}/{epoch_ms}");
    let bytes = match remote.get(&format!("{dir}/{DB_OBJECT}")).await? {
        Some(z) => zstd::decode_all(z.as_slice()).with_context(|| {
            format!(
                "checkpoint {}: corrupt zstd data",
                remote.checkpoint_location(epoch_ms)
            )
        })?,
        None => remote
            .get(&format!("{dir}/{DB_OBJECT_RAW}"))
            .await?
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "checkpoint {} not found (no {DB_OBJECT} or {DB_OBJECT_RAW})",
                    remote.checkpoint_location(epoch_ms)
                )
            })?,
    };
    let state_dir = state_dir.to_path_buf();
    let location = remote.checkpoint_location(epoch_ms);
    tokio::task::spawn_blocking(move || install(&state_dir, &bytes, epoch_ms, &location))
        .await
        .context("restore thread")?
}

fn install(state_dir: &Path, bytes: &[u8], epoch_ms: i64, location: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    let tmp = state_dir.join("controller.sqlite3.restoring");
    let _ = std::fs::remove_file(&tmp);
    std::fs::write(&tmp, bytes)?;
    if let Err(e) = iris_store::checkpoint::validate_and_stamp(&tmp, epoch_ms) {
        let _ = std::fs::remove_file(&tmp);
        bail!("checkpoint {location} {e}");
    }
    let db = state_dir.join("controller.sqlite3");
    for suffix in ["-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(PathBuf::from(format!("{}{suffix}", db.display())));
    }
    std::fs::rename(&tmp, &db)?;
    if let Ok(d) = std::fs::File::open(state_dir) {
        let _ = d.sync_all();
    }
    tracing::warn!(checkpoint = %location, "restored controller DB from checkpoint");
    Ok(())
}

/// What [`prepare`] did at start.
#[derive(Debug, Default)]
pub struct Prepared {
    pub remote: Option<RemoteStore>,
    /// The checkpoint that was restored, if any.
    pub restored: Option<i64>,
    /// A `pending` rollout record to mark `committed` once the controller serves.
    pub commit_rollout: Option<RolloutRecord>,
}

/// Runs before the DB is opened: honours a rollback request, or restores a checkpoint when the
/// local DB is absent.
pub async fn prepare(cfg: &ControllerConfig) -> anyhow::Result<Prepared> {
    let db = cfg.state_dir.join("controller.sqlite3");
    let Some(spec) = &cfg.remote_state_dir else {
        if cfg.restore_checkpoint.is_some() {
            bail!("--restore-checkpoint needs a remote state dir (--remote-state-dir or storage.remote_state_dir)");
        }
        return Ok(Prepared::default());
    };
    let remote = RemoteStore::parse(spec)?;
    let mut out = Prepared {
        remote: Some(remote.clone()),
        ..Default::default()
    };
    let record = remote.read_rollout().await?;
    if let Some(rec) = &record {
        if rec.phase == RolloutPhase::RollbackRequested {
            let ms = parse_checkpoint_name(&rec.rollback_checkpoint)
                .context("rollout record: rollback_checkpoint")?;
            restore(&cfg.state_dir, &remote, ms).await?;
            let mut done = rec.clone();
            done.phase = RolloutPhase::RolledBack;
            remote.write_rollout(&done).await?;
            out.restored = Some(ms);
            return Ok(out);
        }
        if rec.phase == RolloutPhase::Pending {
            out.commit_rollout = Some(rec.clone());
        }
    }
    if db.exists() {
        if let Some(name) = &cfg.restore_checkpoint {
            bail!(
                "--restore-checkpoint {name}: {} already exists; move it aside first (a restore never overwrites a live DB)",
                db.display()
            );
        }
        return Ok(out);
    }
    let chosen = match &cfg.restore_checkpoint {
        Some(name) => Some(parse_checkpoint_name(name)?),
        None => remote.checkpoints().await?.last().copied(),
    };
    if let Some(ms) = chosen {
        restore(&cfg.state_dir, &remote, ms).await?;
        out.restored = Some(ms);
    }
    Ok(out)
}

impl crate::Controller {
    /// `BeginCheckpoint`: writes a checkpoint now and stamps `meta.last_checkpoint_epoch_ms`.
    pub(crate) async fn begin_checkpoint(
        &self,
        _req: c::BeginCheckpointRequest,
    ) -> crate::error::Result<c::BeginCheckpointResponse> {
        let (epoch_ms, counts) = self.checkpoint_now().await?;
        let location = self
            .remote
            .as_ref()
            .map(|r| r.checkpoint_location(epoch_ms))
            .unwrap_or_default();
        Ok(c::BeginCheckpointResponse {
            checkpoint_path: location,
            created_at: Some(iris_proto::time::Timestamp { epoch_ms }),
            job_count: counts[0],
            task_count: counts[1],
            worker_count: counts[2],
        })
    }

    /// Takes one checkpoint (one at a time).
    pub(crate) async fn checkpoint_now(&self) -> crate::error::Result<(i64, [i32; 3])> {
        let Some(remote) = &self.remote else {
            return Err(crate::Error::precondition(
                "this controller has no remote state dir; start it with --remote-state-dir DIR (or storage.remote_state_dir in the cluster config)",
            ));
        };
        let _one = self.checkpoint_lock.lock().await;
        let (epoch_ms, counts) = take(&self.cfg.state_dir, remote, self.cfg.checkpoint_max_age)
            .await
            .map_err(|e| crate::Error::internal(format!("{e:#}")))?;
        let mut conn = self.db();
        let tx = conn.begin()?;
        iris_store::checkpoint::record_taken(&tx, epoch_ms)?;
        tx.commit()?;
        Ok((epoch_ms, counts))
    }
}

/// The optional periodic checkpoint loop.
pub(crate) async fn periodic(
    ctl: Arc<crate::Controller>,
    every: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        match ctl.checkpoint_now().await {
            Ok((ms, _)) => tracing::info!(checkpoint = ms, "periodic checkpoint written"),
            Err(e) => tracing::error!(error = %e, "periodic checkpoint failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_names() {
        assert_eq!(parse_checkpoint_name("123").expect("n"), 123);
        assert_eq!(
            parse_checkpoint_name("controller-state/456/").expect("n"),
            456
        );
        assert_eq!(
            parse_checkpoint_name("s3://b/p/controller-state/789").expect("n"),
            789
        );
        assert!(parse_checkpoint_name("controller-state/x").is_err());
    }

    #[test]
    fn cloud_urls_construct() {
        let s3 = RemoteStore::parse("s3://bucket/some/prefix").expect("s3");
        assert_eq!(s3.prefix.as_ref(), "some/prefix");
        let gs = RemoteStore::parse("gs://bucket/p").expect("gs");
        assert_eq!(gs.path(ROLLOUT_RECORD).as_ref(), "p/rollout-record.json");
        assert!(RemoteStore::parse("ftp://x/y").is_err());
    }

    #[tokio::test]
    async fn take_restore_prune_and_rollout_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).expect("state");
        let mut db = iris_store::Db::open(&state.join("controller.sqlite3")).expect("db");
        let mark = |db: &mut iris_store::Db, limit: i64| {
            let tx = db.begin().expect("tx");
            let b = iris_store::budgets::Budget {
                user_id: "x".into(),
                limit,
                max_band: 2,
            };
            iris_store::budgets::set(&tx, &b, 0).expect("mark");
            tx.commit().expect("commit");
        };
        mark(&mut db, 7);
        let url = format!("file://{}", dir.path().join("remote").display());
        let remote = RemoteStore::parse(&url).expect("remote");
        let (ms, counts) = take(&state, &remote, DEFAULT_MAX_AGE).await.expect("take");
        assert_eq!(counts, [0, 0, 0]);
        assert!(dir
            .path()
            .join(format!("remote/{STATE_DIR}/{ms}/{DB_OBJECT}"))
            .exists());
        mark(&mut db, 8);
        drop(db);
        restore(&state, &remote, ms).await.expect("restore");
        let db = iris_store::Db::open(&state.join("controller.sqlite3")).expect("reopen");
        let x = iris_store::budgets::get(&db, "x").expect("x").expect("row");
        assert_eq!(x.limit, 7, "the checkpointed value");
        assert_eq!(iris_store::meta_get(&db, META_KEY).expect("meta"), Some(ms));
        drop(db);
        // A second checkpoint with max age 0 prunes the first.
        let (ms2, _) = take(&state, &remote, Duration::ZERO).await.expect("take 2");
        assert_eq!(remote.checkpoints().await.expect("list"), vec![ms2]);
        assert!(!dir.path().join(format!("remote/{STATE_DIR}/{ms}")).exists());
        let rec = RolloutRecord {
            phase: RolloutPhase::RollbackRequested,
            image: "new".into(),
            previous_image: "old".into(),
            rollback_checkpoint: format!("{STATE_DIR}/{ms2}"),
            updated_at_ms: 0,
        };
        remote.write_rollout(&rec).await.expect("write");
        let text = std::fs::read_to_string(dir.path().join("remote").join(ROLLOUT_RECORD))
            .expect("record");
        assert!(text.contains("\"rollback_requested\""), "{text}");
        let back = remote.read_rollout().await.expect("read").expect("some");
        assert_eq!(back.phase, RolloutPhase::RollbackRequested);
        assert!(back.updated_at_ms > 0);
    }
}
