//! `iris cluster vm status|logs` (the scale groups, slices and VMs the controller reports) and
//! `iris cluster create-slice|delete-slice` (operator-managed slices, which need a cloud
//! platform: refused for local clusters, as the published CLI refuses them, and for the cloud
//! platforms this build does not provision).

use crate::client::{call, controller_client};
use clap::Subcommand;
use iris_proto::cluster::controller as c;
use iris_proto::vm;
use std::path::Path;

#[derive(Subcommand)]
pub enum VmCmd {
    /// Scale groups with their slices and VMs, from the controller.
    Status {
        /// Only this scale group.
        #[arg(long)]
        scale_group: Option<String>,
    },
    /// One VM (worker): its state, its worker and its bootstrap log.
    Logs { vm_id: String },
}

/// The published CLI's spelling (`VM_STATE_READY`).
fn vm_state(s: i32) -> String {
    vm::VmState::try_from(s)
        .map(|s| s.as_str_name().to_string())
        .unwrap_or_else(|_| format!("unknown state {s}"))
}

pub(crate) async fn run(cmd: VmCmd, url: &Option<String>) -> anyhow::Result<i32> {
    let cl = controller_client(url)?;
    match cmd {
        VmCmd::Status { scale_group } => {
            let r: c::GetAutoscalerStatusResponse = call(
                &cl,
                "GetAutoscalerStatus",
                &c::GetAutoscalerStatusRequest::default(),
            )
            .await?;
            let groups = r.status.map(|s| s.groups).unwrap_or_default();
            if groups.is_empty() {
                println!("No scale groups configured");
                return Ok(0);
            }
            let mut shown = 0;
            for g in groups
                .iter()
                .filter(|g| scale_group.as_ref().is_none_or(|want| g.name() == want))
            {
                shown += 1;
                let total: i32 = g.slice_state_counts.values().sum();
                let n = |k: &str| g.slice_state_counts.get(k).copied().unwrap_or(0);
                println!("\nScale Group: {}", g.name());
                let accel = match (g.device_type(), g.device_variant()) {
                    ("" | "cpu", _) => "cpu".to_string(),
                    (t, v) => format!("{t} {v}"),
                };
                println!("  Accelerator: {accel}");
                println!("  Slices: {}/{total} ready", n("ready"));
                println!("    Failed: {}", n("failed"));
                println!(
                    "  Demand: {} (peak: {})",
                    g.current_demand(),
                    g.peak_demand()
                );
                match (g.availability_status(), g.availability_reason()) {
                    ("", _) => {}
                    (status, "") => println!("  Availability: {status}"),
                    (status, why) => println!("  Availability: {status} ({why})"),
                }
                if !g.slices.is_empty() {
                    println!("  Slices:");
                    for s in &g.slices {
                        match s.capacity_status() {
                            "" => println!("    {}: {}", s.slice_id(), s.state().to_uppercase()),
                            c => {
                                println!("    {}: {} ({c})", s.slice_id(), s.state().to_uppercase())
                            }
                        }
                        for v in &s.vms {
                            if v.address.is_empty() {
                                println!("      {}: {}", v.vm_id, vm_state(v.state));
                            } else {
                                println!(
                                    "      {}: {} ({})",
                                    v.vm_id,
                                    vm_state(v.state),
                                    v.address
                                );
                            }
                        }
                    }
                }
            }
            if shown == 0 {
                if let Some(want) = scale_group {
                    let names: Vec<&str> = groups.iter().map(|g| g.name()).collect();
                    anyhow::bail!(
                        "--scale-group {want}: no such scale group; the controller has: {}",
                        names.join(", ")
                    );
                }
            }
            Ok(0)
        }
        VmCmd::Logs { vm_id } => {
            let r: c::GetWorkerStatusResponse = call(
                &cl,
                "GetWorkerStatus",
                &c::GetWorkerStatusRequest { id: vm_id.clone() },
            )
            .await?;
            if let Some(v) = &r.vm {
                println!("VM: {}", v.vm_id);
                println!("State: {}", vm_state(v.state));
            }
            if let Some(w) = &r.worker {
                println!("Worker: {}", w.worker_id());
                println!("Healthy: {}", w.healthy());
            }
            println!("---");
            if r.bootstrap_logs.is_empty() {
                println!("(no bootstrap logs available: this worker was started by its cluster or supervisor, not bootstrapped on a VM; its own log: `iris process logs -t /system/worker/{vm_id}`)");
            } else {
                println!("{}", r.bootstrap_logs);
            }
            Ok(0)
        }
    }
}

/// `create-slice` / `delete-slice`: which config, and why it cannot be done here.
pub(crate) fn manual_slice(
    what: &str,
    scale_group: Option<&str>,
    config: Option<&Path>,
    cluster: Option<&str>,
) -> anyhow::Result<i32> {
    let Some((path, cfg)) = crate::target::selected_config(config, cluster)? else {
        anyhow::bail!(
            "--config is required for cluster {what} (the scale group's template comes from it)"
        );
    };
    let kind = crate::config::oneof_arm(&cfg.controller);
    if kind == "local" {
        anyhow::bail!("{what} is not supported for local clusters: a local cluster runs the num_vms workers of each scale group it was started with (change num_vms and `iris cluster restart`)");
    }
    if let Some(g) = scale_group {
        let groups = crate::local::plan_groups(&cfg)?;
        if !groups.iter().any(|p| p.name == g) {
            let names: Vec<&str> = groups.iter().map(|p| p.name.as_str()).collect();
            anyhow::bail!(
                "Unknown scale group '{g}'. Available: {}",
                if names.is_empty() {
                    "(none)".to_string()
                } else {
                    names.join(", ")
                }
            );
        }
    }
    eprintln!(
        "error: {what} is not supported by this build for {} (controller kind `{kind}`): it allocates cloud VMs outside the controller; create the slice with your platform's tooling and start `iris worker serve --controller-url URL --scale-group GROUP` on it",
        path.display()
    );
    Ok(crate::lifecycle::UNSUPPORTED)
}
