//! `iris cluster ...`: starting a cluster (local or from a config), the controller daemon and
//! its rollout commands, key generation, and `status` (the controller, its checkpoints, scale groups and workers). Most arms hand
//! off to [`crate::local`], [`crate::rollout`] and [`crate::keys`]; this module routes them.

use crate::client::{call, call_inspect, controller_client};
use crate::{keys, lifecycle, local, output, rollout, ClusterCmd, ControllerCmd};
use iris_proto::cluster::controller as c;
use iris_proto::{inspect, job};
use std::path::Path;

/// `iris cluster list`: the configs `--cluster NAME` resolves, by name.
pub(crate) fn list() -> i32 {
    let configs = crate::target::list_configs(&crate::target::config_dirs());
    if configs.is_empty() {
        println!("No cluster configurations found.");
        return 0;
    }
    println!("Available clusters:");
    for (name, path) in &configs {
        println!("  {name:30} {}", path.display());
    }
    0
}

pub(crate) async fn run(
    cmd: ClusterCmd,
    url: Option<String>,
    config: Option<&Path>,
    cluster: Option<&str>,
) -> anyhow::Result<i32> {
    match cmd {
        ClusterCmd::Start(a) => local::start(a).await,
        ClusterCmd::List => Ok(list()),
        ClusterCmd::Controller(ControllerCmd::Serve(a)) => local::serve_controller(a).await,
        ClusterCmd::Controller(ControllerCmd::Checkpoint { stop, state_dir }) => {
            let code = rollout::checkpoint(&controller_client(&url)?).await?;
            if !stop || code != 0 {
                return Ok(code);
            }
            let dir = lifecycle::local_state_dir(state_dir.as_deref(), config, cluster)?;
            lifecycle::stop_after_checkpoint(&dir, &url).await
        }
        ClusterCmd::Controller(ControllerCmd::WorkerRestart(a)) => Ok(lifecycle::worker_restart(a)),
        ClusterCmd::Stop(a) => {
            let dir = lifecycle::local_state_dir(a.state_dir.as_deref(), config, cluster)?;
            lifecycle::stop(&a, &dir, &url).await
        }
        ClusterCmd::Restart { .. } => {
            anyhow::bail!("cluster restart: handled before a controller is chosen")
        }
        ClusterCmd::Dashboard => {
            let cl = controller_client(&url)?;
            lifecycle::dashboard(cl.base(), 0).await
        }
        ClusterCmd::DashboardProxy(a) => {
            let cl = controller_client(&url)?;
            lifecycle::dashboard(cl.base(), a.port).await
        }
        ClusterCmd::LogServer(c) => lifecycle::log_server(c, &url).await,
        ClusterCmd::Vm(v) => crate::cmd::vm::run(v, &url).await,
        ClusterCmd::CreateSlice { .. } | ClusterCmd::DeleteSlice { .. } => {
            anyhow::bail!("create-slice/delete-slice: handled before a controller is chosen")
        }
        ClusterCmd::Controller(ControllerCmd::Restart(a)) => rollout::restart(a, &url).await,
        ClusterCmd::Controller(ControllerCmd::Rollback(a)) => rollout::rollback(a).await,
        ClusterCmd::Status => status(&controller_client(&url)?).await,
        ClusterCmd::InitKeys(a) => keys::init_keys(a),
    }
}

/// `iris cluster status`: the controller (as the published CLI prints it, plus its uptime and
/// checkpoints), its scale groups, then its workers.
async fn status(cl: &iris_rpc::Client) -> anyhow::Result<i32> {
    let p: job::GetProcessStatusResponse = call(
        cl,
        "GetProcessStatus",
        &job::GetProcessStatusRequest::default(),
    )
    .await?;
    let w: c::ListWorkersResponse =
        call(cl, "ListWorkers", &c::ListWorkersRequest::default()).await?;
    let a: c::GetAutoscalerStatusResponse = call(
        cl,
        "GetAutoscalerStatus",
        &c::GetAutoscalerStatusRequest::default(),
    )
    .await?;
    let cp: inspect::GetCheckpointStatusResponse = call_inspect(
        cl,
        "GetCheckpointStatus",
        &inspect::GetCheckpointStatusRequest::default(),
    )
    .await?;
    let info = p.process_info.unwrap_or_default();
    let version = info
        .provenance
        .and_then(|v| v.tree_hash)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let healthy = w
        .workers
        .iter()
        .filter(|w| w.healthy.unwrap_or_default())
        .count();
    println!("Controller Status:");
    println!("  Running: true");
    println!("  Healthy: true");
    println!("  Address: {}", cl.base());
    println!("  Version: {version}");
    println!("  Uptime: {}", fmt_uptime(info.uptime_ms));
    println!("  Workers: {healthy}/{} healthy", w.workers.len());
    print_checkpoints(&cp);
    let groups = a.status.map(|s| s.groups).unwrap_or_default();
    if !groups.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = groups
            .iter()
            .map(|g| {
                let n = |k: &str| {
                    g.slice_state_counts
                        .get(k)
                        .copied()
                        .unwrap_or(0)
                        .to_string()
                };
                vec![
                    g.name().to_string(),
                    n("booting"),
                    n("initializing"),
                    n("ready"),
                    n("failed"),
                    g.current_demand().to_string(),
                ]
            })
            .collect();
        output::table(
            &[
                "Scale Group",
                "Booting",
                "Initializing",
                "Ready",
                "Failed",
                "Demand",
            ],
            &rows,
        );
    }
    println!();
    output::print_workers(&w.workers);
    Ok(0)
}

/// The checkpoint lines of `cluster status`: where checkpoints go, the last one, the last
/// failure and what the controller's start restored or skipped.
fn print_checkpoints(cp: &inspect::GetCheckpointStatusResponse) {
    let at = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_else(|| ms.to_string())
    };
    if cp.remote_state_dir.is_empty() {
        println!("  Checkpoints: none (no remote state dir configured)");
        return;
    }
    println!("  Checkpoints: {}", cp.remote_state_dir);
    match cp.last_checkpoint_epoch_ms {
        Some(ms) => println!("    Last: {}", at(ms)),
        None => println!("    Last: never"),
    }
    if let Some(ms) = cp.restored_checkpoint_epoch_ms {
        println!("    Restored at start: {}", at(ms));
    }
    if !cp.last_error.is_empty() {
        let when = cp.last_error_epoch_ms.map(at).unwrap_or_default();
        println!("    Last failure ({when}): {}", cp.last_error);
    }
    for note in &cp.startup_notes {
        println!("    At start: {note}");
    }
}

fn fmt_uptime(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}
