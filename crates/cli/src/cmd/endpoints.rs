//! `iris endpoints list|mint`: the endpoint registry, and capability URLs for `/proxy`.

use crate::client::{call, controller_client};
use crate::EndpointsCmd;
use iris_proto::cluster::controller as c;
use iris_types::endpoint::{encode_proxy_name, Access};
use std::time::Duration;

pub(crate) async fn run(cmd: EndpointsCmd, url: Option<String>) -> anyhow::Result<i32> {
    let cl = controller_client(&url)?;
    match cmd {
        EndpointsCmd::List {
            prefix,
            exact,
            task_id,
        } => {
            let r: c::ListEndpointsResponse = cl
                .call(
                    "iris.cluster.EndpointService",
                    "ListEndpoints",
                    &c::ListEndpointsRequest {
                        prefix,
                        exact,
                        task_ids: task_id,
                    },
                    Duration::from_secs(30),
                )
                .await?;
            print_endpoints(r.endpoints);
        }
        EndpointsCmd::Mint { name, ttl_hours } => {
            if !(ttl_hours.is_finite() && ttl_hours > 0.0) {
                anyhow::bail!("--ttl-hours: {ttl_hours} is not a positive number of hours");
            }
            let r: c::MintEndpointTokenResponse = call(
                &cl,
                "MintEndpointToken",
                &c::MintEndpointTokenRequest {
                    endpoint_name: name.clone(),
                    ttl: Some(iris_proto::time::Duration {
                        milliseconds: (ttl_hours * 3_600_000.0) as i64,
                    }),
                },
            )
            .await?;
            let left_h = r
                .expires_at
                .map(|t| (t.epoch_ms() - now_ms()) as f64 / 3_600_000.0)
                .unwrap_or(0.0)
                .max(0.0);
            println!("Capability URL for {name} (the token is in the path: anyone with the URL can call it):");
            if r.capability_url.is_empty() {
                println!(
                    "  path       /proxy/t/{}/{}/",
                    r.token,
                    encode_proxy_name(&name)
                );
            } else {
                println!("  url        {}/", r.capability_url);
            }
            println!("  expires    in {left_h:.1}h");
            println!("  note       append the service's own path; no auth header is needed");
        }
    }
    Ok(0)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The published CLI's table (NAME, ACCESS, PEER, ADDRESS, TASK), sorted by name, plus the
/// proxy path each one is reached at.
fn print_endpoints(mut eps: Vec<c::Endpoint>) {
    if eps.is_empty() {
        println!("No endpoints found.");
        return;
    }
    eps.sort_by(|a, b| a.name.cmp(&b.name));
    println!(
        "{:<44} {:<8} {:<16} {:<28} {:<20} PROXY",
        "NAME", "ACCESS", "PEER", "ADDRESS", "TASK"
    );
    for e in eps {
        let access = Access::from_code(e.access.unwrap_or_default())
            .map(|a| a.name().to_string())
            .unwrap_or_else(|| e.access.unwrap_or_default().to_string());
        let peer = if e.peer_id().is_empty() {
            "local"
        } else {
            e.peer_id()
        };
        println!(
            "{:<44} {:<8} {:<16} {:<28} {:<20} /proxy/{}/",
            e.name(),
            access,
            peer,
            e.address(),
            e.task_id(),
            encode_proxy_name(e.name())
        );
    }
}
