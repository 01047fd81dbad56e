//! `iris cluster controller checkpoint | restart | rollback` (reference §9.3–9.4).
//!
//! `restart` takes a checkpoint through the running controller and records a `pending` rollout
//! (`<remote_state_dir>/rollout-record.json`) whose `rollback_checkpoint` is that checkpoint. It
//! does not stop or start any process: a local daemon is restarted by its operator (stop
//! `iris cluster controller serve`, start it again, possibly with a new binary), and the
//! controller marks the rollout `committed` once it serves. `rollback` sets the record to
//! `rollback_requested`; the next controller start restores that checkpoint once and rewrites the
//! record as `rolled_back`.

use crate::config;
use anyhow::{bail, Context};
use clap::Args;
use iris_controller::checkpoint::{RemoteStore, RolloutPhase, RolloutRecord, STATE_DIR};
use iris_proto::cluster::controller as c;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct RestartArgs {
    /// The controller's remote state dir (default: `storage.remote_state_dir` from --config).
    #[arg(long)]
    pub remote_state_dir: Option<String>,
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The image (or binary version) being rolled out; recorded in the rollout record.
    #[arg(long, default_value = "")]
    pub image: String,
    /// Record the rollout without a pre-restart checkpoint (its rollback then has none to
    /// restore: refused, since a rollout record needs one).
    #[arg(long)]
    pub skip_checkpoint: bool,
    /// Seconds to wait for the checkpoint.
    #[arg(long, default_value_t = 300)]
    pub checkpoint_timeout: u64,
    /// Revert the last deploy: the same as `cluster controller rollback` (the record's
    /// checkpoint is restored at the next start).
    #[arg(long)]
    pub rollback: bool,
    /// Accepted for the published CLI's scripts; this controller builds no images.
    #[arg(long)]
    pub image_platform: Option<String>,
    /// Accepted for the published CLI's scripts; this controller builds no images.
    #[arg(long, value_parser = ["fast", "release"])]
    pub cargo_profile: Option<String>,
    /// Record this image tag as the one rolled out (there is nothing to build or verify here).
    #[arg(long)]
    pub prebuilt_tag: Option<String>,
}

#[derive(Args)]
pub struct RollbackArgs {
    /// The controller's remote state dir (default: `storage.remote_state_dir` from --config).
    #[arg(long)]
    pub remote_state_dir: Option<String>,
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Restore this checkpoint (`controller-state/<epoch_ms>`) instead of the record's.
    #[arg(long)]
    pub checkpoint: Option<String>,
}

fn remote(flag: &Option<String>, cfg: &Option<PathBuf>) -> anyhow::Result<RemoteStore> {
    let spec = match (flag, cfg) {
        (Some(r), _) => r.clone(),
        (None, Some(p)) => config::load(p)?
            .remote_state_dir()
            .with_context(|| format!("{}: storage.remote_state_dir is not set", p.display()))?,
        (None, None) => {
            bail!("pass --remote-state-dir DIR (or --config with storage.remote_state_dir)")
        }
    };
    RemoteStore::parse(&spec)
}

async fn begin(cl: &iris_rpc::Client) -> anyhow::Result<c::BeginCheckpointResponse> {
    begin_within(cl, Duration::from_secs(600)).await
}

pub(crate) async fn begin_within(
    cl: &iris_rpc::Client,
    timeout: Duration,
) -> anyhow::Result<c::BeginCheckpointResponse> {
    Ok(cl
        .call(
            "iris.cluster.ControllerService",
            "BeginCheckpoint",
            &c::BeginCheckpointRequest {},
            timeout,
        )
        .await?)
}

/// `iris cluster controller checkpoint`.
pub async fn checkpoint(cl: &iris_rpc::Client) -> anyhow::Result<i32> {
    let r = begin(cl).await?;
    println!(
        "Checkpoint written to {} ({} jobs, {} tasks, {} workers)",
        r.checkpoint_path, r.job_count, r.task_count, r.worker_count
    );
    Ok(0)
}

/// `iris cluster controller restart`.
pub async fn restart(a: RestartArgs, url: &Option<String>) -> anyhow::Result<i32> {
    if a.rollback {
        return rollback(RollbackArgs {
            remote_state_dir: a.remote_state_dir,
            config: a.config,
            checkpoint: None,
        })
        .await;
    }
    if a.skip_checkpoint {
        bail!("--skip-checkpoint: a rollout is recorded with the checkpoint it rolls back to; without one there is nothing to roll back to. Restart the daemon yourself (stop `iris cluster controller serve` and start it again) if you want no checkpoint");
    }
    if a.image_platform.is_some() || a.cargo_profile.is_some() {
        eprintln!("note: --image-platform and --cargo-profile have no effect: this controller builds no images");
    }
    let image = a.prebuilt_tag.clone().unwrap_or_else(|| a.image.clone());
    let store = remote(&a.remote_state_dir, &a.config)?;
    let previous = store.read_rollout().await?;
    let cl = crate::client::controller_client(url)?;
    let r = begin_within(&cl, Duration::from_secs(a.checkpoint_timeout.max(1))).await?;
    let ms = r.created_at.map(|t| t.epoch_ms()).unwrap_or_default();
    let rec = RolloutRecord {
        phase: RolloutPhase::Pending,
        image,
        previous_image: previous.map(|p| p.image).unwrap_or_default(),
        rollback_checkpoint: format!("{STATE_DIR}/{ms}"),
        updated_at_ms: 0,
    };
    store.write_rollout(&rec).await?;
    println!("Checkpoint written to {}", r.checkpoint_path);
    println!(
        "Rollout recorded in {}/rollout-record.json: pending (rollback checkpoint {})",
        store.location(),
        rec.rollback_checkpoint
    );
    println!("This command does not restart the daemon: stop `iris cluster controller serve` and start it again; it marks the rollout committed once it serves. To undo: `iris cluster controller rollback`, then restart it.");
    Ok(0)
}

/// `iris cluster controller rollback`.
pub async fn rollback(a: RollbackArgs) -> anyhow::Result<i32> {
    let store = remote(&a.remote_state_dir, &a.config)?;
    let mut rec = match store.read_rollout().await? {
        Some(r) => r,
        None if a.checkpoint.is_some() => RolloutRecord {
            phase: RolloutPhase::Committed,
            image: String::new(),
            previous_image: String::new(),
            rollback_checkpoint: String::new(),
            updated_at_ms: 0,
        },
        None => bail!(
            "no rollout record in {}: pass --checkpoint {STATE_DIR}/<epoch_ms>",
            store.location()
        ),
    };
    if let Some(cp) = &a.checkpoint {
        let ms = iris_controller::checkpoint::parse_checkpoint_name(cp)?;
        rec.rollback_checkpoint = format!("{STATE_DIR}/{ms}");
    }
    if rec.rollback_checkpoint.is_empty() {
        bail!("the rollout record names no checkpoint: pass --checkpoint {STATE_DIR}/<epoch_ms>");
    }
    let ms = iris_controller::checkpoint::parse_checkpoint_name(&rec.rollback_checkpoint)?;
    if !store.checkpoints().await?.contains(&ms) {
        bail!(
            "checkpoint {} does not exist",
            store.checkpoint_location(ms)
        );
    }
    rec.phase = RolloutPhase::RollbackRequested;
    store.write_rollout(&rec).await?;
    println!(
        "Rollback requested: the next controller start restores {}",
        store.checkpoint_location(ms)
    );
    Ok(0)
}
