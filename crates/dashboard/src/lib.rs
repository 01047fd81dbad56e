//! The Iris web dashboard: server-rendered pages over the controller's public API.
//!
//! [`serve`] binds its own port and reads the cluster only through the Connect RPCs the CLI uses
//! (`iris.cluster.ControllerService`, `iris.inspect.InspectService`,
//! `finelog.logging.LogService/FetchLogs`), over loopback; it never opens the controller's DB and
//! sends SQL only from the admin's Query page. Pages are HTML rendered with `maud`, with inline SVG
//! pictures; a small hand-written script (embedded, like the stylesheet) refreshes each page's
//! live region, follows logs and runs the find box.
//!
//! **API Boundary:** read-only. Every call to the controller is made as the browser's user: the
//! session token from the `iris_session` cookie (set from a one-time `?session_token=` login URL,
//! which is then redirected away so the token never stays in the address bar or later links) as
//! the bearer, and the browser's address as `x-forwarded-for`, so the controller applies that
//! user's role (the `dashboard` role reads; only admins run Query) and never mistakes the
//! dashboard's loopback connection for its anonymous admin.

mod api;
pub mod fmt;
pub mod model;
pub mod pages;
pub mod svg;

pub use api::{Api, Table};

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Extension;
use axum::Router;
use iris_proto::cluster::controller as c;
use iris_proto::finelog_logging as fl;
use iris_rpc::{Code, RpcError};
use pages::{Nav, Page};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

const CSS: &str = include_str!("assets/app.css");
const JS: &str = include_str!("assets/app.js");

/// Stops a running dashboard.
#[must_use = "dropping the handle stops the dashboard"]
pub struct Shutdown {
    tx: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
}

impl Shutdown {
    /// Stops accepting connections and waits for in-flight requests.
    pub async fn shutdown(self) {
        let _ = self.tx.send(());
        let _ = self.server.await;
    }
}

/// Serves the dashboard for the controller at `controller_url` on `bind` (port 0: any free
/// port). Returns the bound address and the handle that stops it.
pub async fn serve(
    controller_url: String,
    bind: SocketAddr,
) -> anyhow::Result<(SocketAddr, Shutdown)> {
    let api = Api::new(&controller_url).map_err(|e| anyhow::anyhow!("dashboard client: {e}"))?;
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| anyhow::anyhow!("binding dashboard to {bind}: {e}"))?;
    let addr = listener.local_addr()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let app = router(api);
    // Owned by the returned `Shutdown`: stops when it fires or is dropped.
    let server = tokio::spawn(async move {
        let r = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = rx.await;
        })
        .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "dashboard server stopped");
        }
    });
    Ok((addr, Shutdown { tx, server }))
}

/// The dashboard's routes over a controller client.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/jobs") }))
        .route("/health", get(|| async { "ok" }))
        .route("/static/{file}", get(asset))
        .route("/jobs", get(jobs))
        .route("/job/{*id}", get(job))
        .route("/task/{*id}", get(task))
        .route("/logs/{*id}", get(logs))
        .route("/workers", get(workers))
        .route("/backends", get(backends))
        .route("/peers", get(peers))
        .route("/scheduler", get(scheduler))
        .route("/query", get(query))
        .layer(axum::middleware::from_fn_with_state(api.clone(), session))
        .with_state(api)
}

use iris_auth::SESSION_COOKIE;

/// Login and per-request identity: `?session_token=T` sets the session cookie and redirects to
/// the same URL without the token; every other request gets an [`Api`] acting for its caller.
async fn session(State(api): State<Api>, mut req: Request, next: Next) -> Response {
    let query = req.uri().query().unwrap_or("").to_string();
    let mut token = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("session_token", v)) => token = Some(v.to_string()),
            _ => rest.push(pair),
        }
    }
    if let Some(t) = token.filter(|t| !t.is_empty()) {
        let path = req.uri().path();
        let location = if rest.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{}", rest.join("&"))
        };
        let cookie = format!("{SESSION_COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict");
        let mut r = Redirect::to(&location).into_response();
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return r;
    }
    let cookie_token = iris_auth::session_token(
        req.headers()
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string())
        .unwrap_or_else(|| "unknown".into());
    req.extensions_mut()
        .insert(api.for_caller(cookie_token, &peer));
    next.run(req).await
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn asset(Path(file): Path<String>) -> Response {
    let (body, ct) = if file == pages::css_path().trim_start_matches("/static/") {
        (CSS, "text/css; charset=utf-8")
    } else if file == pages::js_path().trim_start_matches("/static/") {
        (JS, "text/javascript; charset=utf-8")
    } else {
        return (StatusCode::NOT_FOUND, "no such asset").into_response();
    };
    (
        [
            (header::CONTENT_TYPE, ct),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// The whole page, or only its live part when the script asks for a fragment.
fn respond(headers: &HeaderMap, page: Page, status: StatusCode) -> Response {
    let fragment = headers.contains_key("x-iris-fragment");
    let body = if fragment {
        page.live.into_string()
    } else {
        pages::layout(&page).into_string()
    };
    let mut r = (status, Html(body)).into_response();
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-iris-done",
        HeaderValue::from_static(if page.done { "1" } else { "0" }),
    );
    r
}

fn status_of(e: &RpcError) -> StatusCode {
    match e.code {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unavailable | Code::DeadlineExceeded => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn fail(headers: &HeaderMap, nav: Nav, title: &str, e: &RpcError) -> Response {
    if e.code != Code::NotFound && e.code != Code::InvalidArgument {
        tracing::warn!(error = %e, page = title, "dashboard RPC failed");
    }
    respond(
        headers,
        pages::error_page(nav, title, &error_message(e)),
        status_of(e),
    )
}

/// The message a page shows for a failed call; a missing login says how to sign in.
fn error_message(e: &RpcError) -> String {
    if e.code == Code::Unauthenticated {
        format!("{} — sign in by opening the dashboard URL printed by `iris cluster start --local`, or append ?session_token=<token> to this page's URL (`iris user token mint <user> --role dashboard`).", e.message)
    } else {
        e.message.clone()
    }
}

/// The Jobs page: ListJobs under the filters, plus job counts by state for the bar.
pub async fn jobs(
    Extension(api): Extension<Api>,
    Query(f): Query<pages::JobsFilter>,
    headers: HeaderMap,
) -> Response {
    let counts_req = f.counts_request();
    let (list, counts) = tokio::join!(api.list_jobs(f.query()), api.count_jobs(&counts_req));
    let counts = counts.map(|r| pages::state_counts(&r)).unwrap_or_default();
    let shown;
    let (status, list) = match &list {
        Ok(r) => (StatusCode::OK, Ok(r)),
        Err(e) => {
            shown = error_message(e);
            (status_of(e), Err(shown.as_str()))
        }
    };
    respond(
        &headers,
        pages::jobs_page(&f, list, &counts, now_ms()),
        status,
    )
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct JobParams {
    tpage: usize,
}

async fn job(
    Extension(api): Extension<Api>,
    Path(id): Path<String>,
    Query(p): Query<JobParams>,
    headers: HeaderMap,
) -> Response {
    let id = format!("/{}", id.trim_matches('/'));
    let attempts_req = iris_proto::inspect::ListAttemptsRequest {
        job_id: id.clone(),
        ..Default::default()
    };
    let (status, tasks, attempts, endpoints) = tokio::join!(
        api.job_status(&id),
        api.list_tasks(&id),
        api.list_attempts(&attempts_req),
        api.list_endpoints("")
    );
    let status = match status {
        Ok(s) => s,
        Err(e) => return fail(&headers, Nav::Jobs, &format!("Job {id}"), &e),
    };
    let Some(j) = status.job.as_ref() else {
        return fail(
            &headers,
            Nav::Jobs,
            &format!("Job {id}"),
            &RpcError::not_found(format!("job {id} not found")),
        );
    };
    let tasks = tasks.map(|t| t.tasks).unwrap_or_default();
    let attempts = attempts
        .map(|r| pages::attempts_from(&r.attempts))
        .unwrap_or_default();
    let children = if j.has_children.unwrap_or_default() {
        api.list_jobs(c::JobQuery {
            parent_job_id: id.clone(),
            limit: 50,
            ..Default::default()
        })
        .await
        .ok()
    } else {
        None
    };
    // The job's own tasks' endpoints (names need not share the job's prefix).
    let endpoints: Vec<_> = endpoints
        .map(|r| r.endpoints)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.task_id().rsplit_once('/').map(|(job, _)| job) == Some(id.as_str()))
        .collect();
    let view = pages::JobView {
        job: j,
        endpoints: &endpoints,
        controller_url: api.controller_url(),
        request: status.request.as_ref(),
        tasks: &tasks,
        attempts: &attempts,
        children: children.as_ref(),
        task_page: p.tpage.max(1),
        now: now_ms(),
    };
    respond(&headers, pages::job_page(&view), StatusCode::OK)
}

async fn task(
    Extension(api): Extension<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let id = format!("/{}", id.trim_matches('/'));
    let logs_req = fl::FetchLogsRequest {
        source: format!("{id}:"),
        match_scope: 2,
        max_lines: 20,
        tail: true,
        ..Default::default()
    };
    let attempts_req = iris_proto::inspect::ListAttemptsRequest {
        task_id: id.clone(),
        ..Default::default()
    };
    let (status, attempts, events, tail, samples) = tokio::join!(
        api.task_status(&id),
        api.list_attempts(&attempts_req),
        api.list_task_events(&id),
        api.fetch_logs(&logs_req),
        api.list_task_samples(&id)
    );
    // No samples (an older controller, or none taken yet) is an empty chart, not an error.
    let samples = samples.map(|r| r.samples).unwrap_or_default();
    let status = match status {
        Ok(s) => s,
        Err(e) => return fail(&headers, Nav::Jobs, &format!("Task {id}"), &e),
    };
    let spans = attempts
        .map(|r| {
            pages::attempts_from(&r.attempts)
                .remove(&id)
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let events_err;
    let events = match &events {
        Ok(r) => Ok(r),
        Err(e) => {
            events_err = e.message.clone();
            Err(events_err.as_str())
        }
    };
    let tail = tail.map(|r| r.entries).unwrap_or_default();
    // Only a pending task has a placement to explain.
    let pending =
        status.task.as_ref().map(|t| t.state) == Some(Some(iris_types::TaskState::Pending.code()));
    let explain = if pending {
        Some(api.explain_task(&id).await)
    } else {
        None
    };
    let explain_err;
    let explain = match &explain {
        None => None,
        Some(Ok(r)) => Some(Ok(r)),
        Some(Err(e)) => {
            explain_err = e.message.clone();
            Some(Err(explain_err.as_str()))
        }
    };
    let view = pages::TaskView {
        resp: &status,
        spans: &spans,
        events,
        explain,
        log_tail: &tail,
        samples: &samples,
        now: now_ms(),
    };
    respond(&headers, pages::task_page(&view), StatusCode::OK)
}

/// Whether a job (or a task's job) may still produce log lines.
async fn job_active(api: &Api, job_id: &str) -> bool {
    let r: Result<c::GetJobStateResponse, RpcError> = api.job_state(job_id).await;
    match r {
        Ok(r) => r
            .states
            .get(job_id)
            .and_then(|s| iris_types::JobState::from_code(*s))
            .map(|s| !s.is_terminal())
            .unwrap_or(false),
        Err(_) => true,
    }
}

async fn logs(
    Extension(api): Extension<Api>,
    Path(id): Path<String>,
    Query(f): Query<pages::LogsFilter>,
    headers: HeaderMap,
) -> Response {
    let id = format!("/{}", id.trim_matches('/'));
    let task = iris_types::TaskId::parse(&id).ok();
    let (source, job_id) = match &task {
        Some(t) => (format!("{id}:"), t.job.as_str().to_string()),
        None => (format!("{id}/"), id.clone()),
    };
    let regex = f.regex.trim().to_string();
    // Follow: new lines after the browser's cursor, as bare list items.
    if let Some(after) = f.after {
        let req = fl::FetchLogsRequest {
            source,
            match_scope: 2,
            cursor: after,
            regex,
            max_lines: pages::MAX_LOG_LINES as i32,
            tail: false,
            ..Default::default()
        };
        let (r, active) = tokio::join!(api.fetch_logs(&req), job_active(&api, &job_id));
        return match r {
            Ok(r) => {
                let mut body = String::new();
                for e in &r.entries {
                    body.push_str(&pages::log_line(e, task.is_none()).into_string());
                }
                let mut resp = (StatusCode::OK, Html(body)).into_response();
                let h = resp.headers_mut();
                h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                if let Ok(v) = HeaderValue::from_str(&r.cursor.max(after).to_string()) {
                    h.insert("x-iris-cursor", v);
                }
                // Keep polling until the job ends and nothing new arrived.
                let more = active || !r.entries.is_empty();
                h.insert(
                    "x-iris-active",
                    HeaderValue::from_static(if more { "1" } else { "0" }),
                );
                resp
            }
            Err(e) => (status_of(&e), e.message).into_response(),
        };
    }
    let full = !regex.is_empty();
    let want = if f.lines == 0 {
        pages::MAX_LOG_LINES
    } else {
        f.lines.min(pages::MAX_LOG_LINES)
    };
    let req = fl::FetchLogsRequest {
        source,
        match_scope: 2,
        regex: regex.clone(),
        // The filter runs over the whole log: oldest first, as many lines as the server gives.
        max_lines: if full { 100_000 } else { want as i32 },
        tail: !full,
        ..Default::default()
    };
    let (r, active) = tokio::join!(api.fetch_logs(&req), job_active(&api, &job_id));
    let mut err = String::new();
    let (lines, more, cursor, status) = match r {
        Ok(r) => {
            let n = r.entries.len();
            let (lines, more) = if full {
                let more = n.saturating_sub(pages::MAX_LOG_LINES);
                let mut v = r.entries;
                v.truncate(pages::MAX_LOG_LINES);
                (v, more)
            } else {
                (r.entries, usize::from(n >= want))
            };
            (lines, more, r.cursor, StatusCode::OK)
        }
        Err(e) => {
            err = e.message.clone();
            (Vec::new(), 0, 0, status_of(&e))
        }
    };
    let view = pages::LogsView {
        id: &id,
        is_task: task.is_some(),
        filter: &f,
        lines: if status == StatusCode::OK {
            Ok(&lines)
        } else {
            Err(err.as_str())
        },
        more,
        cursor,
        active,
    };
    respond(&headers, pages::logs_page(&view), status)
}

async fn open_holds(api: &Api) -> Result<Vec<model::Hold>, RpcError> {
    let r = api.list_resource_holds().await?;
    Ok(r.holds.iter().map(model::Hold::from).collect())
}

async fn workers(Extension(api): Extension<Api>, headers: HeaderMap) -> Response {
    let (ws, holds) = tokio::join!(api.list_workers(), open_holds(&api));
    let committed = model::committed(&holds.unwrap_or_default());
    let (status, ws) = match &ws {
        Ok(w) => (StatusCode::OK, Ok(w)),
        Err(e) => (status_of(e), Err(e.message.as_str())),
    };
    respond(
        &headers,
        pages::workers_page(ws, &committed, now_ms()),
        status,
    )
}

async fn backends(Extension(api): Extension<Api>, headers: HeaderMap) -> Response {
    let (ws, holds, bs) = tokio::join!(api.list_workers(), open_holds(&api), api.list_backends());
    let r = match (ws, holds) {
        (Ok(w), Ok(h)) => Ok(model::variants(&w.workers, &h)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    let kube: Vec<c::BackendSummary> = bs
        .map(|b| {
            b.backends
                .into_iter()
                .filter(|b| b.kind == "kubernetes")
                .collect()
        })
        .unwrap_or_default();
    let (status, mut page) = match &r {
        Ok(v) => (StatusCode::OK, pages::backends_page(Ok(v))),
        Err(e) => (status_of(e), pages::backends_page(Err(&e.message))),
    };
    if !kube.is_empty() {
        page.live = pages::with_kubernetes(page.live, &kube);
    }
    respond(&headers, page, status)
}

async fn peers(Extension(api): Extension<Api>, headers: HeaderMap) -> Response {
    match api.list_peers().await {
        Ok(r) => respond(
            &headers,
            pages::peers_page(Ok(&r), now_ms()),
            StatusCode::OK,
        ),
        Err(e) => respond(
            &headers,
            pages::peers_page(Err(&error_message(&e)), now_ms()),
            status_of(&e),
        ),
    }
}

/// Jobs whose pending tasks get per-task reasons on the scheduler page (the rest show counts).
const SCHEDULER_JOBS_WITH_REASONS: usize = 20;
const SCHEDULER_TASKS_PER_JOB: usize = 20;

async fn scheduler(Extension(api): Extension<Api>, headers: HeaderMap) -> Response {
    let st = match api.scheduler_state().await {
        Ok(s) => s,
        Err(e) => {
            return respond(
                &headers,
                pages::scheduler_page(Err(&e.message), &BTreeMap::new()),
                status_of(&e),
            )
        }
    };
    let mut jobs: Vec<String> = Vec::new();
    for b in &st.pending_buckets {
        if !jobs.contains(&b.job_id) && jobs.len() < SCHEDULER_JOBS_WITH_REASONS {
            jobs.push(b.job_id.clone());
        }
    }
    let lists = futures::future::join_all(jobs.iter().map(|j| api.list_tasks(j))).await;
    let mut pending: BTreeMap<String, Vec<pages::PendingTask>> = BTreeMap::new();
    for (j, r) in jobs.iter().zip(lists) {
        let Ok(r) = r else { continue };
        let v = r
            .tasks
            .into_iter()
            .filter(|t| t.state == Some(iris_types::TaskState::Pending.code()))
            .take(SCHEDULER_TASKS_PER_JOB)
            .map(|t| pages::PendingTask {
                task_id: t.task_id.unwrap_or_default(),
                reason: t.pending_reason.unwrap_or_default(),
            })
            .collect();
        pending.insert(j.clone(), v);
    }
    respond(
        &headers,
        pages::scheduler_page(Ok(&st), &pending),
        StatusCode::OK,
    )
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct QueryParams {
    sql: String,
}

async fn query(
    Extension(api): Extension<Api>,
    Query(q): Query<QueryParams>,
    headers: HeaderMap,
) -> Response {
    // Admin only: say so up front instead of offering a form that can only fail.
    match api.current_user().await {
        Ok(me) if me.role != "admin" => {
            let e = RpcError::new(
                Code::PermissionDenied,
                format!(
                    "the Query page needs the admin role (you are {} with role {})",
                    me.user_id, me.role
                ),
            );
            return fail(&headers, Nav::Query, "Query", &e);
        }
        Ok(_) => {}
        Err(e) => return fail(&headers, Nav::Query, "Query", &e),
    }
    let sql = q.sql.trim();
    if sql.is_empty() {
        return respond(&headers, pages::query_page("", None, 0.0), StatusCode::OK);
    }
    let t0 = Instant::now();
    let r = api.query(sql).await;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    match &r {
        Ok(t) => respond(
            &headers,
            pages::query_page(sql, Some(Ok(t)), ms),
            StatusCode::OK,
        ),
        Err(e) => respond(
            &headers,
            pages::query_page(sql, Some(Err(&e.message)), ms),
            status_of(e),
        ),
    }
}
