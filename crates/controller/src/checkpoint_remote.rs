//! The remote state dir: an `object_store` (local directory, S3 or GCS) plus a prefix.
//!
//! Cloud stores are configured the standard ways, from the environment:
//! - S3 (`s3://bucket/prefix`): `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//!   `AWS_REGION` (or `AWS_DEFAULT_REGION`), and `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT`) for an
//!   S3-compatible service such as CoreWeave's. `object_store` refuses plain HTTP unless
//!   `AWS_ALLOW_HTTP=true`; an endpoint that is itself an `http://` URL allows it here too (the
//!   operator asked for HTTP by writing it), unless `AWS_ALLOW_HTTP` says otherwise.
//! - GCS (`gs://bucket/prefix`): `GOOGLE_SERVICE_ACCOUNT` (a service-account JSON file) or
//!   `GOOGLE_SERVICE_ACCOUNT_KEY` (the JSON itself), else `GOOGLE_APPLICATION_CREDENTIALS` or the
//!   metadata server. An emulator is reached through the service account's `gcs_base_url` with
//!   `disable_oauth: true` (`object_store` reads those two keys only from `GOOGLE_SERVICE_ACCOUNT*`,
//!   not from `GOOGLE_APPLICATION_CREDENTIALS`); an `http://` base URL allows plain HTTP as above
//!   (or set `GOOGLE_ALLOW_HTTP`).
//!
//! Requests are retried at most [`MAX_RETRIES`] times within [`RETRY_TIMEOUT`], so a store that is
//! down fails a checkpoint in seconds instead of `object_store`'s default three minutes.

use super::{RolloutRecord, ROLLOUT_RECORD, STATE_DIR};
use anyhow::{bail, Context};
use futures::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Retries of one request to a cloud store.
pub const MAX_RETRIES: usize = 3;
/// Time from a request's first try after which it is not retried again.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(20);

/// A remote state dir: an object store plus the prefix inside it.
#[derive(Clone)]
pub struct RemoteStore {
    store: Arc<dyn ObjectStore>,
    pub(super) prefix: ObjPath,
    /// The location as configured (for messages and `checkpoint_path`).
    display: String,
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteStore({})", self.display)
    }
}

fn retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig::default(),
        max_retries: MAX_RETRIES,
        retry_timeout: RETRY_TIMEOUT,
    }
}

fn env_is_http(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v.trim().to_ascii_lowercase().starts_with("http://"))
}

/// The `gcs_base_url` of the service account `object_store` will read, if any.
fn gcs_base_url() -> Option<String> {
    let json = match std::env::var("GOOGLE_SERVICE_ACCOUNT_KEY") {
        Ok(k) => k,
        Err(_) => {
            let path = [
                "GOOGLE_SERVICE_ACCOUNT",
                "GOOGLE_SERVICE_ACCOUNT_PATH",
                "SERVICE_ACCOUNT",
            ]
            .iter()
            .find_map(|v| std::env::var(v).ok())?;
            std::fs::read_to_string(path).ok()?
        }
    };
    let v: serde_json::Value = serde_json::from_str(&json).ok()?;
    v.get("gcs_base_url")?.as_str().map(str::to_string)
}

fn s3(spec: &str) -> anyhow::Result<Arc<dyn ObjectStore>> {
    let mut b = object_store::aws::AmazonS3Builder::from_env()
        .with_url(spec)
        .with_retry(retry());
    if std::env::var_os("AWS_ALLOW_HTTP").is_none()
        && (env_is_http("AWS_ENDPOINT_URL") || env_is_http("AWS_ENDPOINT"))
    {
        b = b.with_allow_http(true);
    }
    let s = b.build().with_context(|| {
        format!("remote_state_dir {spec}: configuring S3 (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
    })?;
    Ok(Arc::new(s))
}

fn gcs(spec: &str) -> anyhow::Result<Arc<dyn ObjectStore>> {
    let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
        .with_url(spec)
        .with_retry(retry());
    if std::env::var_os("GOOGLE_ALLOW_HTTP").is_none()
        && gcs_base_url().is_some_and(|u| u.to_ascii_lowercase().starts_with("http://"))
    {
        b = b.with_config(
            object_store::gcp::GoogleConfigKey::Client(object_store::ClientConfigKey::AllowHttp),
            "true",
        );
    }
    let s = b.build().with_context(|| {
        format!("remote_state_dir {spec}: configuring GCS (GOOGLE_SERVICE_ACCOUNT or GOOGLE_APPLICATION_CREDENTIALS)")
    })?;
    Ok(Arc::new(s))
}

impl RemoteStore {
    /// Parses a local path or a `file://`, `s3://` or `gs://` URL. Local directories are created.
    /// Cloud stores take their credentials, region and endpoint from the environment (module doc).
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
            .with_context(|| format!("remote_state_dir {spec} is not a valid URL"))?;
        let prefix = ObjPath::from_url_path(url.path())
            .with_context(|| format!("remote_state_dir {spec}: invalid path"))?;
        let store = match url.scheme() {
            "file" => {
                let p = url
                    .to_file_path()
                    .map_err(|_| anyhow::anyhow!("remote_state_dir {spec}: not a local file URL"))?;
                return Self::local(&p, display);
            }
            "s3" | "s3a" => s3(spec)?,
            "gs" => gcs(spec)?,
            other => bail!(
                "remote_state_dir {spec}: unsupported scheme {other} (use a local path, file://, s3:// or gs://)"
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

    pub(super) fn path(&self, rel: &str) -> ObjPath {
        rel.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.prefix.clone(), |p, part| p.child(part))
    }

    /// Writes one object at `rel` (relative to the remote state dir) in a single request, so it
    /// is either wholly there or absent.
    pub async fn put(&self, rel: &str, data: Vec<u8>) -> anyhow::Result<()> {
        self.store
            .put(&self.path(rel), data.into())
            .await
            .with_context(|| format!("writing {}/{rel}", self.display))?;
        Ok(())
    }

    /// Reads the object at `rel`; `None` if there is none.
    pub async fn get(&self, rel: &str) -> anyhow::Result<Option<Vec<u8>>> {
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

    /// Epoch-ms names of the checkpoint directories, ascending (complete or not).
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

    /// The checkpoint directories that hold a [`super::MANIFEST`] (one recursive listing).
    pub async fn with_manifest(&self) -> anyhow::Result<std::collections::BTreeSet<i64>> {
        let dir = self.path(STATE_DIR);
        let objects: Vec<object_store::ObjectMeta> =
            match self.store.list(Some(&dir)).try_collect().await {
                Ok(o) => o,
                Err(object_store::Error::NotFound { .. }) => Vec::new(),
                Err(e) => {
                    return Err(e).with_context(|| format!("listing {}/{STATE_DIR}", self.display))
                }
            };
        Ok(objects
            .iter()
            .filter(|o| o.location.filename() == Some(super::MANIFEST))
            .filter_map(|o| {
                let parts: Vec<_> = o.location.parts().collect();
                parts
                    .len()
                    .checked_sub(2)
                    .and_then(|i| parts[i].as_ref().parse().ok())
            })
            .collect())
    }

    /// Deletes the object at `rel`, if there is one.
    pub async fn delete(&self, rel: &str) -> anyhow::Result<()> {
        match self.store.delete(&self.path(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("deleting {}/{rel}", self.display)),
        }
    }

    /// Deletes every object under `rel`.
    pub(super) async fn delete_dir(&self, rel: &str) -> anyhow::Result<()> {
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
                Err(e) => {
                    return Err(e).with_context(|| format!("deleting {}/{rel}", self.display))
                }
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

/// An object-store error as one line: its causes joined by `: `, each dropped when the text so
/// far already holds it (`object_store` errors print their source inside their own message, so
/// `{:#}` repeats every cause two or three times).
pub fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
