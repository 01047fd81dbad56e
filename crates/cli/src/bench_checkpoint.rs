//! `iris bench checkpoint`: checkpoint time and size for a DB of N finished jobs, and restore
//! time, against a remote state dir (an `s3://` or `gs://` URL with the store's usual
//! environment, or a local path). The jobs are submitted to an in-process controller with no
//! workers and then terminated, so each ends KILLED through the real state machine.

use anyhow::Context;
use clap::Args;
use iris_controller::checkpoint as cp;
use iris_proto::cluster::controller as c;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct CheckpointArgs {
    /// Where the checkpoints go: `s3://bucket/prefix` (AWS_ENDPOINT_URL etc.), `gs://…`, or a path.
    #[arg(long)]
    remote_state_dir: String,
    /// Finished jobs in the DB.
    #[arg(long, default_value_t = 100_000)]
    jobs: usize,
    /// Concurrent clients submitting and terminating.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Timed checkpoints (each figure is printed).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

const SVC: &str = "iris.cluster.ControllerService";

pub(crate) async fn fill(url: &str, jobs: usize, clients: usize) -> anyhow::Result<()> {
    let mut handles = Vec::new();
    for k in 0..clients.max(1) {
        let cl = iris_rpc::Client::new(url)?;
        let step = clients.max(1);
        // Joined below, before the controller is stopped.
        handles.push(tokio::spawn(async move {
            for i in (k..jobs).step_by(step) {
                let name = format!("/bench/cp-{i:06}");
                let _: c::LaunchJobResponse = cl
                    .call(
                        SVC,
                        "LaunchJob",
                        &crate::bench::request(name.clone()),
                        Duration::from_secs(60),
                    )
                    .await
                    .map_err(|e| anyhow::anyhow!("submitting {name}: {e}"))?;
                let _: iris_proto::job::Empty = cl
                    .call(
                        SVC,
                        "TerminateJob",
                        &c::TerminateJobRequest {
                            job_id: name.clone(),
                        },
                        Duration::from_secs(60),
                    )
                    .await
                    .map_err(|e| anyhow::anyhow!("terminating {name}: {e}"))?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(())
}

pub async fn run(a: CheckpointArgs) -> anyhow::Result<i32> {
    let dir = crate::bench::tempdir()?;
    let remote = cp::RemoteStore::parse(&a.remote_state_dir)?;
    let mut cfg = iris_controller::ControllerConfig::local(dir.join("state"));
    cfg.revision_date = None;
    cfg.remote_state_dir = Some(a.remote_state_dir.clone());
    let ctl = iris_controller::start(cfg).await?;
    let url = ctl.url();
    let t = Instant::now();
    fill(&url, a.jobs, a.clients).await?;
    println!(
        "setup: {} jobs submitted and terminated in {:.1}s",
        a.jobs,
        t.elapsed().as_secs_f64()
    );
    let cl = iris_rpc::Client::new(&url)?;
    let mut last = 0;
    for run in 1..=a.runs.max(1) {
        let t = Instant::now();
        let r: c::BeginCheckpointResponse = cl
            .call(
                SVC,
                "BeginCheckpoint",
                &c::BeginCheckpointRequest {},
                Duration::from_secs(600),
            )
            .await
            .map_err(|e| anyhow::anyhow!("checkpoint: {e}"))?;
        let secs = t.elapsed().as_secs_f64();
        last = r.created_at.map(|t| t.epoch_ms()).unwrap_or_default();
        let m = cp::read_manifest(&remote, last)
            .await?
            .context("the checkpoint has no manifest")?;
        println!(
            "checkpoint {run}: {:.2}s, {} jobs, DB {:.1} MiB, object {:.2} MiB (zstd {:.1}x) -> {}",
            secs,
            r.job_count,
            m.db_bytes as f64 / 1048576.0,
            m.size as f64 / 1048576.0,
            m.db_bytes as f64 / m.size.max(1) as f64,
            r.checkpoint_path
        );
    }
    ctl.shutdown().await;
    for run in 1..=a.runs.max(1) {
        let target = dir.join(format!("restore-{run}"));
        let t = Instant::now();
        cp::restore(&target, &remote, last).await?;
        println!(
            "restore {run}: {:.2}s (download, SHA-256 and zstd checks, quick_check, install)",
            t.elapsed().as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(0)
}
