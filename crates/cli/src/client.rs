//! Talking to the controller: resolving its address and token ([`controller_client`]) and
//! typed calls to its services (`ControllerService`, Iris's `InspectService` and the finelog
//! `LogService`). Every command that reaches a controller goes through these helpers, so
//! timeouts and the service names live in one place.

use crate::{keys, local};
use anyhow::Context;
use iris_proto::finelog::logging as fl;
use iris_rpc::{Client, RpcError};
use std::time::Duration;

/// The controller when no flag names one: `IRIS_CONTROLLER_URL`, else the address the local
/// cluster recorded in its state dir.
pub(crate) fn ambient_url() -> Option<String> {
    std::env::var("IRIS_CONTROLLER_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .or_else(local::recorded_url)
}

pub(crate) fn controller_client(url: &Option<String>) -> anyhow::Result<Client> {
    let url = match url {
        Some(u) => u.clone(),
        None => ambient_url().context(
            "no controller address: start one with `iris cluster start --local`, or pass --controller-url, --config or --cluster",
        )?,
    };
    let token = keys::cli_token();
    Ok(Client::new(&url)
        .map_err(anyhow::Error::new)?
        .with_token(token))
}

pub(crate) const SVC: &str = "iris.cluster.ControllerService";

pub(crate) async fn call<Req: prost::Message, Resp: prost::Message + Default>(
    client: &Client,
    method: &str,
    req: &Req,
) -> Result<Resp, RpcError> {
    let timeout = if method == "LaunchJob" { 180 } else { 30 };
    client
        .call(SVC, method, req, Duration::from_secs(timeout))
        .await
}

/// Calls Iris's own `iris.inspect.InspectService` (typed reads; not in the published protocol).
pub(crate) async fn call_inspect<Req: prost::Message, Resp: prost::Message + Default>(
    client: &Client,
    method: &str,
    req: &Req,
) -> Result<Resp, RpcError> {
    client
        .call(
            iris_proto::INSPECT_SERVICE,
            method,
            req,
            Duration::from_secs(30),
        )
        .await
}

pub(crate) async fn fetch_logs(
    cl: &Client,
    req: &fl::FetchLogsRequest,
) -> Result<fl::FetchLogsResponse, RpcError> {
    cl.call(
        "finelog.logging.LogService",
        "FetchLogs",
        req,
        Duration::from_secs(30),
    )
    .await
}
