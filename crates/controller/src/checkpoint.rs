//! Checkpoints and the rollout record (reference §9.3–9.4).
//!
//! A checkpoint is a consistent online copy of `controller.sqlite3` (`VACUUM INTO` from a read
//! connection, so the writer is never blocked), switched to DELETE journal mode, compressed with
//! zstd level 3 (with zstd's content checksum) and stored at
//! `<remote_state_dir>/controller-state/<epoch_ms>/controller.sqlite3.zst`, followed by a
//! [`Manifest`] (`manifest.json`: the data object's size and SHA-256, and the row counts).
//! `remote_state_dir` is a local path or a `file://`, `s3://` or `gs://` URL (`object_store`;
//! the environment conventions are in `checkpoint_remote.rs`). The log store (`logs.sqlite3`) is
//! not part of a checkpoint: it stays in the local state dir.
//!
//! Each object is one `PUT`, so it is wholly there or absent; the manifest goes last, so a
//! directory without one is an upload that did not complete. A checkpoint that fails is removed
//! (best effort), logged, and kept in [`Health`] for `GetCheckpointStatus`; the controller keeps
//! serving and the previous checkpoint stays the newest complete one.
//!
//! On start, before the DB is opened: a rollout record in `rollback_requested` restores its
//! checkpoint once (then reads `rolled_back`); otherwise, when `controller.sqlite3` is absent,
//! the newest usable checkpoint (or the one named by `restore_checkpoint`) is restored. A
//! checkpoint is usable when its data matches its manifest (if it has one), decompresses with a
//! valid zstd checksum and passes `quick_check`; an unusable newest one is skipped, with a
//! message naming it and the one restored instead. A named checkpoint is never substituted.

#[path = "checkpoint_remote.rs"]
mod remote;
pub use remote::{error_text, RemoteStore, MAX_RETRIES, RETRY_TIMEOUT};

use crate::ControllerConfig;
use anyhow::{bail, Context};
use iris_proto::cluster::controller as c;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Directory (under the remote state dir) that holds one sub-directory per checkpoint.
pub const STATE_DIR: &str = "controller-state";
/// The compressed DB inside a checkpoint directory.
pub const DB_OBJECT: &str = "controller.sqlite3.zst";
/// The uncompressed form, accepted on restore.
pub const DB_OBJECT_RAW: &str = "controller.sqlite3";
/// Written after the data object; describes it.
pub const MANIFEST: &str = "manifest.json";
/// The rollout record, at the root of the remote state dir.
pub const ROLLOUT_RECORD: &str = "rollout-record.json";
/// `meta` key stamped after a checkpoint is stored (and after a restore).
pub use iris_store::checkpoint::META_KEY;
/// Default age after which checkpoint directories are pruned.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(3 * 24 * 3600);

/// `<checkpoint dir>/manifest.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The data object's name inside the directory.
    pub object: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, lower-case hex.
    pub sha256: String,
    /// The uncompressed DB's size in bytes.
    pub db_bytes: u64,
    pub jobs: i32,
    pub tasks: i32,
    pub workers: i32,
    pub created_at_ms: i64,
}

/// The last checkpoint attempt's failure and what happened at start, for `GetCheckpointStatus`.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// When it failed, and why.
    pub last_error: Option<(i64, String)>,
    /// The checkpoint this run restored at start.
    pub restored: Option<i64>,
    /// Skipped checkpoints and an unreachable store at start ([`Prepared::notes`]).
    pub startup_notes: Vec<String>,
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
            "checkpoint '{name}': expected a {STATE_DIR}/<epoch_ms> directory (or its epoch_ms)"
        )
    })
}

/// Takes a consistent copy of the DB at `db_path` into memory, compressed, with the uncompressed
/// size and the row counts.
fn snapshot_db(db_path: &Path, tmp: &Path) -> anyhow::Result<(Vec<u8>, u64, [i32; 3])> {
    let _ = std::fs::remove_file(tmp);
    let counts = iris_store::checkpoint::copy_to(db_path, tmp).with_context(|| {
        format!(
            "copying {} for a checkpoint (VACUUM INTO)",
            db_path.display()
        )
    })?;
    let raw = std::fs::read(tmp)?;
    let _ = std::fs::remove_file(tmp);
    let zst = compress(&raw).context("compressing the checkpoint")?;
    Ok((zst, raw.len() as u64, counts))
}

/// zstd level 3 with the content checksum and size in the frame header.
fn compress(raw: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut enc = zstd::stream::Encoder::new(Vec::with_capacity(raw.len() / 4), 3)?;
    enc.include_checksum(true)?;
    enc.include_contentsize(true)?;
    enc.set_pledged_src_size(Some(raw.len() as u64))?;
    std::io::Write::write_all(&mut enc, raw)?;
    enc.finish()
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

/// Takes a checkpoint of the state dir's DB into `remote` (data object, then manifest), then
/// prunes directories older than `max_age` (never the newest). Returns the epoch-ms name and the
/// row counts. A checkpoint that cannot be completed is removed again (best effort).
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
    let (zst, db_bytes, counts) = tokio::task::spawn_blocking(move || snapshot_db(&db_path, &tmp))
        .await
        .context("checkpoint thread")??;
    let manifest = Manifest {
        object: DB_OBJECT.into(),
        size: zst.len() as u64,
        sha256: sha256_hex(&zst),
        db_bytes,
        jobs: counts[0],
        tasks: counts[1],
        workers: counts[2],
        created_at_ms: epoch_ms,
    };
    let dir = format!("{STATE_DIR}/{epoch_ms}");
    let written = async {
        remote.put(&format!("{dir}/{DB_OBJECT}"), zst).await?;
        remote
            .put(
                &format!("{dir}/{MANIFEST}"),
                serde_json::to_vec_pretty(&manifest)?,
            )
            .await
    }
    .await;
    if let Err(e) = written {
        if let Err(d) = remote.delete_dir(&dir).await {
            tracing::warn!(checkpoint = %remote.checkpoint_location(epoch_ms), error = %error_text(&d),
                "could not remove the incomplete checkpoint; restores skip it (it has no manifest)");
        }
        return Err(e.context(format!(
            "checkpoint {} was not completed",
            remote.checkpoint_location(epoch_ms)
        )));
    }
    if let Err(e) = prune(remote, max_age, epoch_ms).await {
        // The checkpoint itself is complete; the next one prunes again.
        tracing::warn!(error = %error_text(&e), "pruning old checkpoints failed");
    }
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

/// Reads a checkpoint's manifest, if it has one.
pub async fn read_manifest(
    remote: &RemoteStore,
    epoch_ms: i64,
) -> anyhow::Result<Option<Manifest>> {
    let rel = format!("{STATE_DIR}/{epoch_ms}/{MANIFEST}");
    match remote.get(&rel).await? {
        None => Ok(None),
        Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
            anyhow::anyhow!(
                "{}/{MANIFEST} is not a valid manifest: {e}",
                remote.checkpoint_location(epoch_ms)
            )
        }),
    }
}

/// Why a checkpoint cannot be restored (as opposed to an error reaching the store).
type Unusable = String;

/// Downloads checkpoint `epoch_ms` and checks it against its manifest and zstd's checksum.
/// The outer error is the store's; the inner one says why the checkpoint is unusable.
async fn fetch(remote: &RemoteStore, epoch_ms: i64) -> anyhow::Result<Result<Vec<u8>, Unusable>> {
    let dir = format!("{STATE_DIR}/{epoch_ms}");
    let manifest: Option<Manifest> = match remote.get(&format!("{dir}/{MANIFEST}")).await? {
        None => None,
        Some(b) => match serde_json::from_slice(&b) {
            Ok(m) => Some(m),
            Err(e) => return Ok(Err(format!("its {MANIFEST} is not valid: {e}"))),
        },
    };
    let object = manifest.as_ref().map_or(DB_OBJECT, |m| m.object.as_str());
    let Some(data) = remote.get(&format!("{dir}/{object}")).await? else {
        if manifest.is_none() {
            if let Some(raw) = remote.get(&format!("{dir}/{DB_OBJECT_RAW}")).await? {
                return Ok(Ok(raw));
            }
        }
        return Ok(Err(format!(
            "it has no {object} (an upload that did not complete)"
        )));
    };
    if let Some(m) = &manifest {
        if data.len() as u64 != m.size {
            return Ok(Err(format!(
                "{object} is truncated or damaged: {} bytes, its manifest says {}",
                data.len(),
                m.size
            )));
        }
        if sha256_hex(&data) != m.sha256 {
            return Ok(Err(format!(
                "{object} does not match the SHA-256 in its manifest"
            )));
        }
    }
    if !object.ends_with(".zst") {
        return Ok(Ok(data));
    }
    Ok(zstd::decode_all(data.as_slice())
        .map_err(|e| format!("{object} is not valid zstd data (truncated or corrupt): {e}")))
}

/// Downloads checkpoint `epoch_ms`, checks it, and installs it as the state dir's DB (replacing
/// any DB and WAL there). The previous DB files are removed only after the copy passed
/// `quick_check`.
pub async fn restore(state_dir: &Path, remote: &RemoteStore, epoch_ms: i64) -> anyhow::Result<()> {
    let location = remote.checkpoint_location(epoch_ms);
    match try_restore(state_dir, remote, epoch_ms).await? {
        Ok(()) => Ok(()),
        Err(why) => bail!("checkpoint {location} cannot be restored: {why}"),
    }
}

async fn try_restore(
    state_dir: &Path,
    remote: &RemoteStore,
    epoch_ms: i64,
) -> anyhow::Result<Result<(), Unusable>> {
    let bytes = match fetch(remote, epoch_ms).await? {
        Ok(b) => b,
        Err(why) => return Ok(Err(why)),
    };
    let state_dir = state_dir.to_path_buf();
    let location = remote.checkpoint_location(epoch_ms);
    tokio::task::spawn_blocking(move || install(&state_dir, &bytes, epoch_ms, &location))
        .await
        .context("restore thread")?
}

/// Restores the newest usable checkpoint, skipping unusable ones (each named in the log and in
/// `notes`, with the one restored instead). `None`: there is no checkpoint at all.
pub async fn restore_newest(
    state_dir: &Path,
    remote: &RemoteStore,
    notes: &mut Vec<String>,
) -> anyhow::Result<Option<i64>> {
    let mut skipped: Vec<String> = Vec::new();
    // This release writes the manifest last; only checkpoints from before manifests existed
    // lack one, so with any manifest in the store a directory without one is incomplete (its
    // data object may even be whole: a PUT given up on can still land).
    let manifests = remote.with_manifest().await?;
    for ms in remote.checkpoints().await?.into_iter().rev() {
        let location = remote.checkpoint_location(ms);
        let verdict = if !manifests.is_empty() && !manifests.contains(&ms) {
            Err(format!(
                "it has no {MANIFEST} (an upload that did not complete)"
            ))
        } else {
            try_restore(state_dir, remote, ms).await?
        };
        match verdict {
            Ok(()) => {
                if !skipped.is_empty() {
                    let note = format!(
                        "skipped unusable checkpoint(s): {}; restored the previous checkpoint {location} instead",
                        skipped.join("; ")
                    );
                    tracing::warn!("{note}");
                    notes.push(note);
                }
                return Ok(Some(ms));
            }
            Err(why) => {
                tracing::error!(checkpoint = %location, reason = %why,
                    "checkpoint is unusable; trying the previous one");
                skipped.push(format!("{location} ({why})"));
            }
        }
    }
    if skipped.is_empty() {
        return Ok(None);
    }
    bail!(
        "no usable checkpoint in {}: {}; restore one by hand or move the bad ones aside",
        remote.location(),
        skipped.join("; ")
    )
}

fn install(
    state_dir: &Path,
    bytes: &[u8],
    epoch_ms: i64,
    location: &str,
) -> anyhow::Result<Result<(), Unusable>> {
    std::fs::create_dir_all(state_dir)?;
    let tmp = state_dir.join("controller.sqlite3.restoring");
    let _ = std::fs::remove_file(&tmp);
    std::fs::write(&tmp, bytes)?;
    if let Err(e) = iris_store::checkpoint::validate_and_stamp(&tmp, epoch_ms) {
        let _ = std::fs::remove_file(&tmp);
        return Ok(Err(e.to_string()));
    }
    let db = state_dir.join("controller.sqlite3");
    for suffix in ["-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(PathBuf::from(format!("{}{suffix}", db.display())));
    }
    std::fs::rename(&tmp, &db)?;
    if let Ok(d) = std::fs::File::open(state_dir) {
        let _ = d.sync_all();
    }
    tracing::warn!(checkpoint = %location, quick_check = "ok", bytes = bytes.len(),
        "restored controller DB from checkpoint (quick_check: ok)");
    Ok(Ok(()))
}

/// What [`prepare`] did at start.
#[derive(Debug, Default)]
pub struct Prepared {
    pub remote: Option<RemoteStore>,
    /// The checkpoint that was restored, if any.
    pub restored: Option<i64>,
    /// A `pending` rollout record to mark `committed` once the controller serves.
    pub commit_rollout: Option<RolloutRecord>,
    /// What an operator should know about this start (shown by `GetCheckpointStatus` and
    /// `iris cluster status`): skipped checkpoints, a store that could not be reached.
    pub notes: Vec<String>,
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
    let record = match remote.read_rollout().await {
        Ok(record) => record,
        // A store that is down must not keep a controller with a DB of its own from serving:
        // it starts from that DB and checkpoints fail (and say so) until the store is back.
        Err(e) if db.exists() && cfg.restore_checkpoint.is_none() => {
            let note = format!(
                "the remote state dir {} could not be read at start ({}); started from the local DB {} without checking the rollout record",
                remote.location(),
                error_text(&e),
                db.display()
            );
            tracing::error!("{note}");
            out.notes.push(note);
            return Ok(out);
        }
        Err(e) => {
            return Err(e.context(format!(
                "reading the rollout record from the remote state dir {} (there is no local DB at {} to start from instead; fix the store's address or credentials, or pass --fresh to start with an empty DB)",
                remote.location(),
                db.display()
            )))
        }
    };
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
    out.restored = match &cfg.restore_checkpoint {
        Some(name) => {
            let ms = parse_checkpoint_name(name)?;
            restore(&cfg.state_dir, &remote, ms).await?;
            Some(ms)
        }
        None => restore_newest(&cfg.state_dir, &remote, &mut out.notes).await?,
    };
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
            created_at: Some(iris_proto::time::Timestamp {
                epoch_ms: Some(epoch_ms),
            }),
            job_count: counts[0],
            task_count: counts[1],
            worker_count: counts[2],
        })
    }

    /// Takes one checkpoint (one at a time). A failure is logged here, recorded for
    /// `GetCheckpointStatus`, and returned as UNAVAILABLE naming the remote state dir.
    pub async fn checkpoint_now(&self) -> crate::error::Result<(i64, [i32; 3])> {
        let Some(remote) = &self.remote else {
            return Err(crate::Error::precondition(
                "this controller has no remote state dir; start it with --remote-state-dir DIR (or storage.remote_state_dir in the cluster config)",
            ));
        };
        let _one = self.checkpoint_lock.lock().await;
        let (epoch_ms, counts) = match take(
            &self.cfg.state_dir,
            remote,
            self.cfg.checkpoint_max_age,
        )
        .await
        {
            Ok(x) => x,
            Err(e) => {
                let msg = format!(
                        "checkpoint to {} failed: {}; the previous checkpoint is still the newest (check the store's credentials, bucket and endpoint)",
                    remote.location(),
                    error_text(&e)
                );
                tracing::error!(remote = %remote.location(), error = %error_text(&e), "checkpoint failed");
                crate::lock(&self.checkpoint_health).last_error =
                    Some((iris_store::now_ms(), msg.clone()));
                return Err(crate::Error::unavailable(msg));
            }
        };
        crate::lock(&self.checkpoint_health).last_error = None;
        let mut conn = self.db();
        let tx = conn.begin()?;
        iris_store::checkpoint::record_taken(&tx, epoch_ms)?;
        tx.commit()?;
        Ok((epoch_ms, counts))
    }

    /// The last checkpoint failure (since the last success), for `GetCheckpointStatus`.
    pub(crate) fn checkpoint_error(&self) -> Option<(i64, String)> {
        crate::lock(&self.checkpoint_health).last_error.clone()
    }

    /// The checkpoint restored at start and the start's notes, for `GetCheckpointStatus`.
    pub(crate) fn startup_report(&self) -> (Option<i64>, Vec<String>) {
        let h = crate::lock(&self.checkpoint_health);
        (h.restored, h.startup_notes.clone())
    }

    /// The remote state dir, as configured (empty: none).
    pub(crate) fn remote_location(&self) -> String {
        self.remote
            .as_ref()
            .map(|r| r.location().to_string())
            .unwrap_or_default()
    }
}

/// The optional periodic checkpoint loop. A failed checkpoint is logged (by `checkpoint_now`) and
/// the loop goes on.
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
        if let Ok((ms, _)) = ctl.checkpoint_now().await {
            tracing::info!(checkpoint = ms, "periodic checkpoint written");
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

    #[tokio::test]
    async fn a_truncated_checkpoint_without_manifests_is_caught_by_zstd() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).expect("state");
        drop(iris_store::Db::open(&state.join("controller.sqlite3")).expect("db"));
        let url = format!("file://{}", dir.path().join("remote").display());
        let remote = RemoteStore::parse(&url).expect("remote");
        let (ms1, _) = take(&state, &remote, DEFAULT_MAX_AGE).await.expect("take");
        let (ms2, _) = take(&state, &remote, DEFAULT_MAX_AGE)
            .await
            .expect("take 2");
        // As from a release before manifests: none at all.
        for ms in [ms1, ms2] {
            remote
                .delete(&format!("{STATE_DIR}/{ms}/{MANIFEST}"))
                .await
                .expect("rm");
        }
        let obj = format!("{STATE_DIR}/{ms2}/{DB_OBJECT}");
        let data = remote.get(&obj).await.expect("get").expect("data");
        remote
            .put(&obj, data[..data.len() - 7].to_vec())
            .await
            .expect("truncate");
        let err = restore(&state, &remote, ms2).await.expect_err("truncated");
        assert!(
            format!("{err:#}").contains("not valid zstd data"),
            "{err:#}"
        );
        std::fs::remove_file(state.join("controller.sqlite3")).expect("rm db");
        let mut notes = Vec::new();
        assert_eq!(
            restore_newest(&state, &remote, &mut notes)
                .await
                .expect("newest"),
            Some(ms1)
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains(&remote.checkpoint_location(ms2))
                && notes[0].contains(&remote.checkpoint_location(ms1)),
            "the note names the skipped checkpoint and the one used: {}",
            notes[0]
        );
    }
}
