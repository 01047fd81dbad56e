//! `iris worker simulate`: thousands of simulated workers in one process (see
//! [`iris_worker::sim`]), for scale tests and benchmarks of the controller.

use crate::local::{parse_device, parse_pairs};
use anyhow::Context;
use clap::Args;
use iris_worker::sim::model::{Profile, Span};

#[derive(Args)]
pub struct SimulateArgs {
    /// How many workers this process hosts.
    #[arg(long, default_value_t = 100)]
    pub count: usize,
    /// Worker ids are PREFIX-00000, PREFIX-00001, ...
    #[arg(long, default_value = "sim")]
    pub id_prefix: String,
    /// Address the workers answer `Reconcile` on (shared by all of them).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: std::net::SocketAddr,
    /// CPUs each worker advertises.
    #[arg(long, default_value_t = 32)]
    pub cpu: i32,
    #[arg(long, default_value = "128GB")]
    pub memory: String,
    #[arg(long, default_value = "1TB")]
    pub disk: String,
    /// Accelerators each worker advertises, e.g. `gpu:h100:8`.
    #[arg(long)]
    pub device: Option<String>,
    /// Worker attribute KEY=VALUE (repeatable), on every worker.
    #[arg(long = "attribute", action = clap::ArgAction::Append)]
    pub attributes: Vec<String>,
    /// Workers per pool (attribute `pool`, and `tpu-worker-id` within it), so gangs grouped by
    /// `pool` have pools to fill; 0: none.
    #[arg(long, default_value_t = 0)]
    pub pool_size: usize,
    #[arg(long, default_value = "")]
    pub scale_group: String,
    /// How long each attempt runs: `5s`, `250ms`, `1s..10s` (uniform), `exp:5s` (exponential).
    #[arg(long, default_value = "1s")]
    pub duration: String,
    /// Share of attempts that exit 1, in percent.
    #[arg(long, default_value_t = 0)]
    pub fail_percent: u32,
    /// Share of attempts that crash (killed by SIGSEGV, exit 139), in percent.
    #[arg(long, default_value_t = 0)]
    pub crash_percent: u32,
}

pub async fn run(a: SimulateArgs, url: Option<String>) -> anyhow::Result<i32> {
    let url = match url {
        Some(u) => u,
        None => {
            crate::client::ambient_url().context("no controller address: pass --controller-url")?
        }
    };
    let duration = Span::parse(&a.duration).map_err(|e| anyhow::anyhow!("--duration {e}"))?;
    let cfg = iris_worker::sim::FleetConfig {
        controller_url: url,
        bind: a.bind,
        count: a.count,
        id_prefix: a.id_prefix.clone(),
        cpu_count: a.cpu,
        memory_bytes: iris_types::resources::parse_bytes(&a.memory)
            .map_err(|e| anyhow::anyhow!("--memory: {e}"))?,
        disk_bytes: iris_types::resources::parse_bytes(&a.disk)
            .map_err(|e| anyhow::anyhow!("--disk: {e}"))?,
        device: parse_device(a.device.as_deref())?,
        attributes: parse_pairs("--attribute", &a.attributes)?,
        pool_size: a.pool_size,
        scale_group: a.scale_group.clone(),
        profile: Profile {
            duration,
            fail_percent: a.fail_percent,
            crash_percent: a.crash_percent,
        },
    };
    let stop = crate::local::shutdown_signal();
    let fleet = iris_worker::sim::start(cfg).await?;
    println!(
        "{} simulated workers ({} to {}) serving at {}",
        fleet.ids.len(),
        fleet.ids.first().map(String::as_str).unwrap_or(""),
        fleet.ids.last().map(String::as_str).unwrap_or(""),
        fleet.addr
    );
    stop.recv().await;
    fleet.shutdown().await;
    Ok(0)
}
