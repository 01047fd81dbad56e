//! `iris cluster ...`: starting a cluster (local or from a config), the controller daemon and
//! its rollout commands, key generation, and `status` (workers and job counts). Most arms hand
//! off to [`crate::local`], [`crate::rollout`] and [`crate::keys`]; this module routes them.

use crate::client::{call, controller_client};
use crate::{keys, lifecycle, local, output, rollout, ClusterCmd, ControllerCmd};
use iris_proto::cluster::controller as c;
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
        ClusterCmd::Status => {
            let cl = controller_client(&url)?;
            let w: c::ListWorkersResponse =
                call(&cl, "ListWorkers", &c::ListWorkersRequest::default()).await?;
            println!("Controller: {}", cl.base());
            output::print_workers(&w.workers);
            Ok(0)
        }
        ClusterCmd::InitKeys(a) => keys::init_keys(a),
    }
}
