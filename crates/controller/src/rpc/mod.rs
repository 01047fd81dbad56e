//! The controller's HTTP surface: Connect RPC dispatch (one `match` over every method, each
//! handler's [`crate::Error`] mapped to the wire here and nowhere else), blobs, the worker poke,
//! JWKS and `/metrics`. The handlers live in one file per resource.

mod admin;
mod autoscaler;
pub(crate) mod endpoints;
mod jobs;
mod logs;
mod process;
mod tasks;
mod users;
mod workers;

use crate::{lock, Controller};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use iris_rpc::{unary, Code, RpcError};
use std::sync::Arc;

type Ctl = Arc<Controller>;

pub(crate) fn now() -> i64 {
    iris_store::now_ms()
}

/// Prometheus (OpenMetrics) text: see [`crate::metrics`].
async fn metrics(State(ctl): State<Ctl>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        ctl.metrics.render(),
    )
        .into_response()
}

pub fn router(ctl: Ctl) -> Router {
    Router::new()
        .route(
            "/health",
            get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
        )
        .route("/.well-known/jwks.json", get(jwks))
        .route("/blobs/{sha}", get(get_blob))
        .route("/bundles/{file}", get(get_bundle_zip))
        .route("/internal/worker-poke/{worker}", post(poke_worker))
        .route(
            "/proxy/system.log-server/{service}/{method}",
            post(dispatch),
        )
        .route("/metrics", get(metrics))
        .route("/{service}/{method}", post(dispatch))
        .with_state(ctl)
}

async fn jwks(State(ctl): State<Ctl>) -> Response {
    match &ctl.verifier {
        Some(v) => axum::Json(v.jwks()).into_response(),
        None => axum::Json(serde_json::json!({"keys": []})).into_response(),
    }
}

async fn poke_worker(State(ctl): State<Ctl>, Path(worker): Path<String>) -> StatusCode {
    if let Some(w) = lock(&ctl.workers).get(&worker) {
        w.poke.notify_one();
    }
    StatusCode::NO_CONTENT
}

pub(crate) fn valid_sha(sha: &str) -> bool {
    sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn get_blob(State(ctl): State<Ctl>, Path(sha): Path<String>) -> Response {
    if !valid_sha(&sha) {
        return (StatusCode::BAD_REQUEST, "blob id must be 64 hex characters").into_response();
    }
    match tokio::fs::read(ctl.cfg.state_dir.join("bundles").join(&sha)).await {
        Ok(b) => (StatusCode::OK, b).into_response(),
        Err(_) => (StatusCode::NOT_FOUND, format!("no blob {sha}")).into_response(),
    }
}

async fn get_bundle_zip(state: State<Ctl>, Path(file): Path<String>) -> Response {
    let sha = file.trim_end_matches(".zip").to_string();
    get_blob(state, Path(sha)).await
}

async fn dispatch(
    State(ctl): State<Ctl>,
    Path((service, method)): Path<(String, String)>,
    req: axum::extract::Request,
) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let identity = match crate::auth::authenticate(
        ctl.cfg.auth.as_ref(),
        ctl.verifier.as_ref(),
        ctl.fed_verifier.as_ref(),
        &headers,
        peer,
    )
    .and_then(|id| crate::auth::authorize(&id, &service, &method).map(|()| id))
    {
        Ok(id) => id,
        Err(e) => return e.into_response(),
    };
    let started = std::time::Instant::now();
    let metrics = ctl.clone();
    let resp = crate::auth::with_caller(
        identity,
        dispatch_inner(ctl, service, method.clone(), headers, body),
    )
    .await;
    // Unknown methods (501) are one label, so a caller cannot grow the label set at will.
    let status = resp.status();
    let label = if status == axum::http::StatusCode::NOT_IMPLEMENTED {
        "unknown"
    } else {
        method.as_str()
    };
    metrics
        .metrics
        .rpc(label, status.as_u16(), started.elapsed());
    resp
}

async fn dispatch_inner(
    ctl: Ctl,
    service: String,
    method: String,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    // Read the body ourselves: the `Bytes` extractor caps bodies at axum's 2 MiB default with
    // a plain-text 413, which refused workspace bundles over 2 MiB (the client allows 25 MiB).
    let body = match axum::body::to_bytes(body, iris_rpc::MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            return RpcError::new(
                Code::ResourceExhausted,
                format!(
                    "request body exceeds {} bytes or could not be read: {e}",
                    iris_rpc::MAX_BODY_BYTES
                ),
            )
            .into_response()
        }
    };
    let h = &headers;
    let b = &body[..];
    macro_rules! call {
        ($f:ident) => {
            unary(h, b, |req| {
                let ctl = ctl.clone();
                async move { ctl.$f(req).await.map_err(|e| e.to_wire()) }
            })
            .await
        };
    }
    match (service.as_str(), method.as_str()) {
        ("iris.cluster.ControllerService", m) => match m {
            "LaunchJob" => call!(launch_job),
            "GetJobStatus" => call!(get_job_status),
            "GetJobState" => call!(get_job_state),
            "TerminateJob" => call!(terminate_job),
            "CompleteJob" => call!(complete_job),
            "ListJobs" => call!(list_jobs),
            "GetTaskStatus" => call!(get_task_status),
            "ListTasks" => call!(list_tasks),
            "KickTasks" => call!(kick_tasks),
            "Register" => call!(register),
            "RenewWorkerToken" => call!(renew_worker_token),
            "ListWorkers" => call!(list_workers),
            "ExecuteRawQuery" => call!(execute_raw_query),
            "SetUserBudget" => call!(set_user_budget),
            "GetUserBudget" => call!(get_user_budget),
            "ListUserBudgets" => call!(list_user_budgets),
            "GetCurrentUser" => call!(get_current_user),
            "ListUsers" => call!(list_users),
            "GetSchedulerState" => call!(get_scheduler_state),
            "BeginCheckpoint" => call!(begin_checkpoint),
            "ListPeers" => call!(list_peers),
            "ListBackends" => call!(list_backends),
            "GetKubernetesClusterStatus" => call!(get_kubernetes_cluster_status),
            "FederationSync" => call!(federation_sync),
            "MintEndpointToken" => call!(mint_endpoint_token),
            "GetAutoscalerStatus" => call!(get_autoscaler_status),
            "GetWorkerStatus" => call!(get_worker_status),
            "GetProcessStatus" => call!(get_process_status),
            "ProfileTask" => call!(profile_task),
            "ExecInContainer" => call!(exec_in_container),
            _ => unimplemented(&service, m),
        },
        ("iris.inspect.InspectService", "ListTaskEvents") => call!(list_task_events),
        ("iris.inspect.InspectService", "CountJobs") => call!(count_jobs),
        ("iris.inspect.InspectService", "ListAttempts") => call!(list_attempts),
        ("iris.inspect.InspectService", "ListResourceHolds") => call!(list_resource_holds),
        ("iris.inspect.InspectService", "ListHandoffs") => call!(list_handoffs),
        ("iris.inspect.InspectService", "GetCheckpointStatus") => call!(get_checkpoint_status),
        ("iris.inspect.InspectService", "ExplainTask") => call!(explain_task),
        ("iris.inspect.InspectService", "ListTaskSamples") => call!(list_task_samples),
        ("iris.cluster.EndpointService", m) => match m {
            "RegisterEndpoint" => call!(register_endpoint),
            "UnregisterEndpoint" => call!(unregister_endpoint),
            "ListEndpoints" => call!(list_endpoints),
            _ => unimplemented(&service, m),
        },
        ("finelog.logging.LogService", "FetchLogs") => call!(fetch_logs),
        ("finelog.logging.LogService", "PushLogs") => call!(push_logs),
        ("finelog.stats.StatsService", m) => match m {
            "RegisterTable" => call!(register_table),
            "WriteRows" => call!(write_rows),
            "Query" => call!(query_stats),
            "DropTable" => call!(drop_table),
            "ListNamespaces" => call!(list_namespaces),
            "GetTableSchema" => call!(get_table_schema),
            "GetTableStatus" => call!(get_table_status),
            "AbortTableMigration" => call!(abort_table_migration),
            "ReportRelayStatus" => call!(report_relay_status),
            "ListRelayStatus" => call!(list_relay_status),
            _ => unimplemented(&service, m),
        },
        _ => unimplemented(&service, &method),
    }
}

fn unimplemented(service: &str, method: &str) -> Response {
    RpcError::new(
        Code::Unimplemented,
        format!("{service}/{method} is not implemented by this controller"),
    )
    .into_response()
}

impl Controller {
    pub(crate) fn poke_all(&self) {
        for w in lock(&self.workers).values() {
            w.poke.notify_one();
        }
    }
}
