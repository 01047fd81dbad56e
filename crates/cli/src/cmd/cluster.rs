//! `iris cluster ...`: starting a cluster (local or from a config), the controller daemon and
//! its rollout commands, key generation, and `status` (workers and job counts). Most arms hand
//! off to [`crate::local`], [`crate::rollout`] and [`crate::keys`]; this module routes them.

use crate::client::{call, controller_client};
use crate::{keys, local, output, rollout, ClusterCmd, ControllerCmd};
use iris_proto::cluster::controller as c;

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

pub(crate) async fn run(cmd: ClusterCmd, url: Option<String>) -> anyhow::Result<i32> {
    match cmd {
        ClusterCmd::Start(a) => local::start(a).await,
        ClusterCmd::List => Ok(list()),
        ClusterCmd::Controller(ControllerCmd::Serve(a)) => local::serve_controller(a).await,
        ClusterCmd::Controller(ControllerCmd::Checkpoint) => {
            rollout::checkpoint(&controller_client(&url)?).await
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
