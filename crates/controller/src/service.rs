//! RPC handlers (`ControllerService`, `EndpointService`, `LogService`) and HTTP routes.

use crate::spec::{constraint_from_proto, device_of, JobSpec};
use crate::{internal, lock, views, Controller};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use iris_proto::cluster::controller as c;
use iris_proto::finelog::logging as fl;
use iris_proto::job;
use iris_proto::query;
use iris_rpc::{unary, Code, RpcError};
use iris_store::ops;
use iris_store::rusqlite::{params, OptionalExtension};
use iris_types::{Band, JobName, JobState, TaskId, TaskState};
use sha2::Digest;
use std::sync::Arc;

type Ctl = Arc<Controller>;

/// Largest accepted workspace bundle.
pub const MAX_BUNDLE_BYTES: usize = 25 << 20;
/// Most replicas a job may ask for.
pub const MAX_REPLICAS: i32 = 10_000;

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

fn valid_sha(sha: &str) -> bool {
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
    crate::auth::with_caller(
        identity,
        dispatch_inner(ctl, service, method, headers, body),
    )
    .await
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
                async move { ctl.$f(req).await }
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
            _ => unimplemented(&service, m),
        },
        ("iris.cluster.EndpointService", "ListEndpoints") => call!(list_endpoints),
        ("finelog.logging.LogService", "FetchLogs") => call!(fetch_logs),
        ("finelog.logging.LogService", "PushLogs") => call!(push_logs),
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

fn now() -> i64 {
    iris_store::now_ms()
}

fn check_revision_date(client: &str, controller: Option<&str>) -> Result<(), RpcError> {
    if client.is_empty() {
        return Ok(());
    }
    let parse = |s: &str| chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d");
    let cd = parse(client).map_err(|_| {
        RpcError::invalid(format!(
            "client_revision_date {client:?} must be YYYY-MM-DD"
        ))
    })?;
    let Some(ours) = controller.and_then(|s| parse(s).ok()) else {
        return Ok(());
    };
    if cd < ours - chrono::Duration::days(14) {
        return Err(RpcError::precondition(format!(
            "marin-iris client is too old: its revision date {client} is more than 14 days before this controller's {ours}; upgrade the client (pip install -U marin-iris)"
        )));
    }
    Ok(())
}

impl Controller {
    pub(crate) async fn launch_job(
        &self,
        mut req: c::LaunchJobRequest,
    ) -> Result<c::LaunchJobResponse, RpcError> {
        let name =
            JobName::parse(&req.name).map_err(|e| RpcError::invalid(format!("name: {e}")))?;
        let caller = crate::auth::caller();
        let handoff = req.federation.clone();
        let (name, submitting_user) = match &handoff {
            Some(f) => {
                // A parent's handoff keeps its job id (the same id on both clusters).
                self.check_handoff(&name, f)?;
                (name, f.submitting_user.clone())
            }
            None => {
                let name = self.authorize_submission(name, req.priority_band)?;
                let who = if caller.anonymous {
                    "local_admin".to_string()
                } else {
                    caller.user_id.clone()
                };
                (name, who)
            }
        };
        req.name = name.to_string();
        if req.replicas == 0 {
            req.replicas = 1;
        }
        if req.replicas < 1 || req.replicas > MAX_REPLICAS {
            return Err(RpcError::invalid(format!(
                "replicas: {} is out of range; use 1 to {MAX_REPLICAS}",
                req.replicas
            )));
        }
        let res = req.resources.clone().unwrap_or_default();
        if res.cpu_millicores < 0 || res.memory_bytes < 0 || res.disk_bytes < 0 {
            return Err(RpcError::invalid(
                "resources: cpu, memory and disk must not be negative",
            ));
        }
        let (dtype, variant, gpu, tpu) = device_of(req.resources.as_ref());
        if gpu < 0 || tpu < 0 {
            return Err(RpcError::invalid(
                "resources.device: count must not be negative",
            ));
        }
        let argv_empty = req
            .entrypoint
            .as_ref()
            .and_then(|e| e.run_command.as_ref())
            .map(|r| r.argv.is_empty())
            .unwrap_or(true);
        if argv_empty {
            return Err(RpcError::invalid(
                "entrypoint.run_command.argv: a command is required (e.g. iris job run -- python train.py)",
            ));
        }
        if req.max_retries_failure < 0
            || req.max_retries_preemption < 0
            || req.max_task_failures < 0
        {
            return Err(RpcError::invalid("max_retries_failure, max_retries_preemption and max_task_failures must not be negative"));
        }
        if let Some(co) = &req.coscheduling {
            if co.group_by.trim().is_empty() {
                return Err(RpcError::invalid("coscheduling.group_by must not be empty"));
            }
        }
        if req.bundle_blob.len() > MAX_BUNDLE_BYTES {
            return Err(RpcError::invalid(format!(
                "bundle_blob: {} bytes exceeds the {} MiB limit; exclude large files with --exclude",
                req.bundle_blob.len(),
                MAX_BUNDLE_BYTES >> 20
            )));
        }
        for pc in &req.constraints {
            constraint_from_proto(pc).map_err(RpcError::invalid)?;
        }
        // Freshness gate: root jobs only (a parent's handoff was checked there).
        if name.is_root() && handoff.is_none() {
            check_revision_date(&req.client_revision_date, self.cfg.revision_date.as_deref())?;
        }
        // Auto device constraints.
        if dtype != "cpu" && !req.constraints.iter().any(|k| k.key == "device-type") {
            req.constraints.push(eq_constraint("device-type", dtype));
        }
        if dtype != "cpu"
            && !variant.is_empty()
            && !variant.eq_ignore_ascii_case("auto")
            && !req.constraints.iter().any(|k| k.key == "device-variant")
        {
            req.constraints.push(eq_constraint(
                "device-variant",
                &variant.to_ascii_lowercase(),
            ));
        }
        let t = now();
        let user = name.user().to_string();
        // Bundle: content-addressed under the state dir.
        if !req.bundle_blob.is_empty() {
            let sha = hex::encode(sha2::Sha256::digest(&req.bundle_blob));
            let path = self.cfg.state_dir.join("bundles").join(&sha);
            if !path.exists() {
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, &req.bundle_blob).map_err(internal)?;
                std::fs::rename(&tmp, &path).map_err(internal)?;
            }
            req.bundle_id = sha;
            req.bundle_blob.clear();
        } else if !req.bundle_id.is_empty()
            && (!valid_sha(&req.bundle_id)
                || !self
                    .cfg
                    .state_dir
                    .join("bundles")
                    .join(&req.bundle_id)
                    .exists())
        {
            return Err(RpcError::invalid(format!(
                "bundle_id {:?} is not a bundle this controller has; send bundle_blob instead",
                req.bundle_id
            )));
        }
        let skip_band_ceiling = handoff.is_some()
            || (self.cfg.auth.is_some()
                && caller.is_admin()
                && matches!(
                    Band::from_code(req.priority_band),
                    Some(Band::System) | Some(Band::Production)
                ));
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.admissions
            .send(crate::Admission {
                name,
                req,
                user,
                t,
                skip_band_ceiling,
                submitting_user,
                reply,
            })
            .map_err(|_| RpcError::new(Code::Unavailable, "controller is shutting down"))?;
        rx.await
            .map_err(|_| RpcError::new(Code::Unavailable, "controller is shutting down"))?
    }

    /// Admits a batch of validated submissions in one transaction (group commit): each gets a
    /// savepoint, so one refusal never affects another; all are acknowledged only after commit.
    pub(crate) fn admit_batch(&self, batch: Vec<crate::Admission>) {
        let mut conn = self.db();
        let workers = match self.feasibility_workers(&conn) {
            Ok(w) => w,
            Err(e) => {
                drop(conn);
                for a in batch {
                    let _ = a.reply.send(Err(e.clone()));
                }
                return;
            }
        };
        let tx = match conn.transaction() {
            Ok(tx) => tx,
            Err(e) => {
                let e = internal(e);
                for a in batch {
                    let _ = a.reply.send(Err(e.clone()));
                }
                return;
            }
        };
        let mut results = Vec::with_capacity(batch.len());
        for a in batch {
            if let Err(e) = tx
                .prepare_cached("SAVEPOINT admit")
                .and_then(|mut st| st.execute([]))
            {
                results.push((a.reply, Err(internal(e)), None));
                continue;
            }
            let r = self.admit(
                &tx,
                a.name,
                a.req,
                a.user,
                a.t,
                &workers,
                a.skip_band_ceiling,
                &a.submitting_user,
            );
            let sp = if r.is_ok() {
                tx.prepare_cached("RELEASE admit")
                    .and_then(|mut st| st.execute([]))
            } else {
                tx.prepare_cached("ROLLBACK TO admit")
                    .and_then(|mut st| st.execute([]))
                    .and_then(|_| {
                        tx.prepare_cached("RELEASE admit")
                            .and_then(|mut st| st.execute([]))
                    })
            };
            if let Err(e) = sp {
                results.push((a.reply, Err(internal(e)), None));
                continue;
            }
            match r {
                Ok((resp, spec)) => results.push((a.reply, Ok(resp), spec)),
                Err(e) => results.push((a.reply, Err(e), None)),
            }
        }
        let committed = tx.commit().map_err(internal);
        drop(conn);
        let mut any = false;
        for (reply, r, spec) in results {
            let r = match (&committed, r) {
                (Err(e), _) => Err(e.clone()),
                (Ok(()), r) => r,
            };
            if r.is_ok() {
                any = true;
                if let Some((replaced, job_id, spec)) = spec {
                    if replaced {
                        self.forget_spec(&job_id);
                    }
                    lock(&self.specs).insert(job_id, spec);
                }
            }
            let _ = reply.send(r);
        }
        if any {
            self.wake();
        }
    }

    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn admit(
        &self,
        conn: &iris_store::rusqlite::Connection,
        name: JobName,
        mut req: c::LaunchJobRequest,
        user: String,
        t: i64,
        workers: &[iris_scheduler::Worker],
        skip_band_ceiling: bool,
        submitting_user: &str,
    ) -> Result<(c::LaunchJobResponse, Option<(bool, String, Arc<JobSpec>)>), RpcError> {
        let res = req.resources.clone().unwrap_or_default();
        // Band resolution and authorization.
        let parent = name.parent();
        let parent_band = match &parent {
            Some(p) => {
                let row: Option<(i32, i32)> = conn
                    .prepare_cached(
                        "SELECT j.state, c.priority_band FROM jobs j JOIN job_config c ON c.job_id = j.job_id WHERE j.job_id = ?1",
                    )
                    .and_then(|mut st| st.query_row([p.as_str()], |r| Ok((r.get(0)?, r.get(1)?))).optional())
                    .map_err(internal)?;
                match row {
                    None => {
                        return Err(RpcError::precondition(format!(
                            "parent job {p} does not exist; submit the parent first or use a root name /<user>/<job>"
                        )))
                    }
                    Some((s, _)) if JobState::from_code(s).map(|s| s.is_terminal()).unwrap_or(false) => {
                        return Err(RpcError::precondition(format!("parent job {p} has already finished")))
                    }
                    Some((_, b)) => Band::from_code(b),
                }
            }
            None => None,
        };
        let band = match req.priority_band {
            0 => parent_band.unwrap_or(Band::Interactive),
            code => Band::from_code(code).ok_or_else(|| {
                RpcError::invalid(format!(
                    "priority_band: unknown value {code}; use PRODUCTION=1, INTERACTIVE=2, BATCH=3 or SYSTEM=4"
                ))
            })?,
        };
        if !skip_band_ceiling
            && (parent.is_none() || parent_band.map(|pb| band.outranks(pb)).unwrap_or(true))
        {
            let max_band: i32 = conn
                .prepare_cached("SELECT max_band FROM user_budgets WHERE user_id = ?1")
                .and_then(|mut st| st.query_row([&user], |r| r.get(0)).optional())
                .map_err(internal)?
                .unwrap_or(Band::Interactive.code());
            let max_band = Band::from_code(max_band).unwrap_or(Band::Interactive);
            if band.outranks(max_band) {
                return Err(RpcError::new(
                    Code::PermissionDenied,
                    format!(
                        "priority {band} is above user {user}'s maximum band {max_band}; an admin can allow it with: iris user budget set {user} --max-band {band}"
                    ),
                ));
            }
        }
        req.priority_band = band.code();
        // Feasibility, and where the job runs (here, or queued for a federation peer).
        let local = self.check_feasible(workers, &name, &req);
        let route = self.classify_submit(&name, &mut req, local, submitting_user)?;
        let handoff = req.federation.clone();
        // Existing job policy.
        let existing = ops::job_state_of(conn, name.as_str()).map_err(internal)?;
        if let (Some(f), Some(_)) = (&handoff, existing) {
            let h = iris_store::federation::handle(conn, name.as_str()).map_err(internal)?;
            match h {
                Some(h)
                    if h.direction == iris_store::federation::RECEIVED
                        && h.peer_id == f.requester_id =>
                {
                    if h.nonce == f.handoff_nonce {
                        // A redelivery of the same handoff: acknowledge it again.
                        return Ok((
                            c::LaunchJobResponse {
                                job_id: name.to_string(),
                            },
                            None,
                        ));
                    }
                }
                _ => {
                    return Err(RpcError::new(
                        Code::AlreadyExists,
                        format!(
                        "job {name} already exists on this cluster and was not handed over by {}",
                        f.requester_id
                    ),
                    ))
                }
            }
        }
        if let Some(st) = existing {
            let policy = req.existing_job_policy;
            let running = !st.is_terminal();
            let keep = policy == 2 && running;
            if keep {
                return Ok((
                    c::LaunchJobResponse {
                        job_id: name.to_string(),
                    },
                    None,
                ));
            }
            if policy == 1 || req.fail_if_exists || (running && policy != 3) {
                return Err(RpcError::new(
                    Code::AlreadyExists,
                    format!("job {name} already exists and is {st}; cancel it first or choose another --job-name"),
                ));
            }
        }
        let group_by = req.coscheduling.as_ref().map(|c| c.group_by.clone());
        let cfg = ops::JobConfigRow {
            res_cpu_millicores: res.cpu_millicores as i64,
            res_memory_bytes: res.memory_bytes,
            res_disk_bytes: res.disk_bytes,
            res_device_json: res
                .device
                .as_ref()
                .and_then(|d| serde_json::to_string(d).ok()),
            constraints_json: if req.constraints.is_empty() {
                None
            } else {
                serde_json::to_string(&req.constraints).ok()
            },
            coscheduling_group_by: group_by,
            scheduling_timeout_ms: req
                .scheduling_timeout
                .as_ref()
                .map(|d| d.milliseconds)
                .filter(|m| *m > 0),
            max_task_failures: req.max_task_failures as i64,
            entrypoint_json: req.entrypoint.as_ref().and_then(|e| {
                let mut e = e.clone();
                e.workdir_files.clear();
                serde_json::to_string(&e).ok()
            }),
            environment_json: req
                .environment
                .as_ref()
                .and_then(|e| serde_json::to_string(e).ok()),
            bundle_id: (!req.bundle_id.is_empty()).then(|| req.bundle_id.clone()),
            ports_json: serde_json::to_string(&req.ports).ok(),
            max_retries_failure: req.max_retries_failure as i64,
            max_retries_preemption: req.max_retries_preemption as i64,
            timeout_ms: req
                .timeout
                .as_ref()
                .map(|d| d.milliseconds)
                .filter(|m| *m > 0),
            preemption_policy: req.preemption_policy,
            existing_job_policy: req.existing_job_policy,
            priority_band: band.code(),
            task_image: (!req.task_image.is_empty()).then(|| req.task_image.clone()),
            submit_argv_json: serde_json::to_string(&req.submit_argv).ok(),
            request_blob: prost::Message::encode_to_vec(&req),
        };
        let new = ops::NewJob {
            job_id: name.to_string(),
            user_id: user.clone(),
            submitting_user: submitting_user.to_string(),
            parent_job_id: parent.as_ref().map(|p| p.to_string()),
            root_job_id: name.root_job().to_string(),
            depth: name.depth(),
            num_tasks: req.replicas as u32,
            failed: None,
            cfg,
            workdir_files: Vec::new(),
            federated: match &route {
                crate::federation::Route::Queue(peer) => Some(peer.clone()),
                crate::federation::Route::Local => None,
            },
        };
        let tx = conn;
        if existing.is_some() {
            if existing.map(|s| !s.is_terminal()).unwrap_or(false) {
                ops::kill_subtree(
                    tx,
                    name.as_str(),
                    "Replaced by a new submission",
                    "Parent job terminated",
                    t,
                )
                .map_err(internal)?;
            }
            ops::delete_job(tx, name.as_str()).map_err(internal)?;
        }
        ops::insert_job(tx, &new, t).map_err(internal)?;
        {
            use iris_store::federation as sf;
            if let crate::federation::Route::Queue(peer) = &route {
                let nonce = crate::tick::new_uid() + &crate::tick::new_uid();
                sf::insert_handle(tx, name.as_str(), sf::SENT, peer, &user, sf::QUEUED, &nonce)
                    .map_err(internal)?;
            } else if let Some(f) = &handoff {
                let owner = if f.owner_principal.is_empty() {
                    &user
                } else {
                    &f.owner_principal
                };
                sf::insert_handle(
                    tx,
                    name.as_str(),
                    sf::RECEIVED,
                    &f.requester_id,
                    owner,
                    sf::HANDED_OFF,
                    &f.handoff_nonce,
                )
                .map_err(internal)?;
                sf::append_changelog(tx, name.as_str(), &f.requester_id, None, false, t)
                    .map_err(internal)?;
            }
        }
        let spec = Arc::new(JobSpec::from_request(req, band, user, name.depth()));
        Ok((
            c::LaunchJobResponse {
                job_id: name.to_string(),
            },
            Some((existing.is_some(), name.to_string(), spec)),
        ))
    }

    /// Workers (registered, plus declared scale groups) for the submit-time feasibility check.
    fn feasibility_workers(
        &self,
        conn: &iris_store::rusqlite::Connection,
    ) -> Result<Vec<iris_scheduler::Worker>, RpcError> {
        let mut workers = crate::tick::load_workers(conn).map_err(internal)?;
        for g in &self.cfg.groups {
            for i in 0..g.max_workers.max(1) {
                workers.push(g.worker(format!("{}#{i}", g.name)));
            }
        }
        Ok(workers)
    }

    fn check_feasible(
        &self,
        workers: &[iris_scheduler::Worker],
        name: &JobName,
        req: &c::LaunchJobRequest,
    ) -> Result<(), RpcError> {
        if workers.is_empty() {
            return Ok(());
        }
        // Every constraint was validated in `launch_job`; this list includes the automatic
        // device-type/device-variant ones added after that.
        let all: Vec<_> = req
            .constraints
            .iter()
            .filter_map(|pc| constraint_from_proto(pc).ok())
            .collect();
        let res = crate::spec::resources_of(req.resources.as_ref());
        let group_by = req.coscheduling.as_ref().map(|c| c.group_by.as_str());
        iris_scheduler::feasible_anywhere(&res, &all, group_by, req.replicas.max(1) as u32, workers)
            .map_err(|why| RpcError::precondition(format!("Job {name} is unschedulable: {why}")))
    }

    pub(crate) async fn get_job_status(
        &self,
        req: c::GetJobStatusRequest,
    ) -> Result<c::GetJobStatusResponse, RpcError> {
        let conn = self.db();
        let reasons = lock(&self.pending_reasons);
        let mut job = views::job_status(&conn, &req.job_id, &reasons)?
            .ok_or_else(|| RpcError::not_found(format!("job {} not found", req.job_id)))?;
        self.decorate_federated(&conn, &mut job)?;
        let mut request = self.spec(&conn, &req.job_id)?.map(|s| s.request.clone());
        if let Some(r) = request.as_mut() {
            if let Some(env) = r.environment.as_mut() {
                for v in env.secrets.values_mut() {
                    *v = "<redacted>".into();
                }
            }
        }
        Ok(c::GetJobStatusResponse {
            job: Some(job),
            request,
        })
    }

    pub(crate) async fn get_job_state(
        &self,
        req: c::GetJobStateRequest,
    ) -> Result<c::GetJobStateResponse, RpcError> {
        let conn = self.db();
        let mut states = std::collections::BTreeMap::new();
        for id in req.job_ids {
            if let Some(s) = ops::job_state_of(&conn, &id).map_err(internal)? {
                states.insert(id, s.code());
            }
        }
        Ok(c::GetJobStateResponse { states })
    }

    /// Auth rules for a submission (reference §2.4): non-admin root jobs are renamed to
    /// `/<caller>/<name>`; children need the parent's owner (a task token: its own job);
    /// SYSTEM and PRODUCTION need an admin, except a task's child at its parent's band.
    fn authorize_submission(&self, name: JobName, band_code: i32) -> Result<JobName, RpcError> {
        if self.cfg.auth.is_none() {
            return Ok(name);
        }
        let caller = crate::auth::caller();
        if caller.is_admin() {
            return Ok(name);
        }
        let elevated = matches!(
            Band::from_code(band_code),
            Some(Band::System) | Some(Band::Production)
        );
        match (&caller.role, name.parent()) {
            (iris_auth::Role::Task, None) => Err(RpcError::new(
                Code::PermissionDenied,
                "a task token may only submit child jobs under its own job",
            )),
            (iris_auth::Role::Task, Some(parent)) => {
                crate::auth::check_owner(&caller, parent.as_str(), "submit a child of")?;
                Ok(name)
            }
            (_, parent) => {
                if elevated {
                    return Err(RpcError::new(
                        Code::PermissionDenied,
                        "submitting at priority system or production requires the admin role; use --priority interactive or batch",
                    ));
                }
                match parent {
                    Some(p) => {
                        crate::auth::check_owner(&caller, p.as_str(), "submit a child of")?;
                        Ok(name)
                    }
                    None if name.user() == caller.user_id => Ok(name),
                    None => {
                        let job = name
                            .as_str()
                            .trim_start_matches('/')
                            .split_once('/')
                            .map(|x| x.1)
                            .unwrap_or("");
                        JobName::root(&caller.user_id, job)
                            .map_err(|e| RpcError::invalid(format!("name: {e}")))
                    }
                }
            }
        }
    }

    pub(crate) async fn terminate_job(
        &self,
        req: c::TerminateJobRequest,
    ) -> Result<job::Empty, RpcError> {
        let caller = crate::auth::caller();
        if caller.role == iris_auth::Role::FederationPeer {
            self.check_received_from(&req.job_id, &caller.user_id)?;
        } else {
            crate::auth::check_owner(&caller, &req.job_id, "cancel")?;
        }
        if self.cancel_federated(&req.job_id).await? {
            return Ok(job::Empty {});
        }
        let mut conn = self.db();
        let tx = conn.transaction().map_err(internal)?;
        let found = ops::kill_subtree(
            &tx,
            &req.job_id,
            "Terminated by user",
            "Parent job terminated",
            now(),
        )
        .map_err(internal)?;
        if !found {
            return Err(RpcError::not_found(format!("job {} not found", req.job_id)));
        }
        tx.commit().map_err(internal)?;
        drop(conn);
        self.poke_all();
        self.wake();
        Ok(job::Empty {})
    }

    pub(crate) async fn complete_job(
        &self,
        req: c::CompleteJobRequest,
    ) -> Result<job::Empty, RpcError> {
        crate::auth::check_owner(&crate::auth::caller(), &req.job_id, "complete")?;
        {
            let conn = self.db();
            if let Some(h) =
                iris_store::federation::root_handle(&conn, &req.job_id).map_err(internal)?
            {
                if h.direction == iris_store::federation::SENT {
                    return Err(RpcError::precondition(format!(
                        "job {} runs on federation peer {}; complete it there (or cancel it here)",
                        req.job_id,
                        if h.peer_id.is_empty() {
                            "(not yet chosen)"
                        } else {
                            &h.peer_id
                        }
                    )));
                }
            }
        }
        let mut conn = self.db();
        let tx = conn.transaction().map_err(internal)?;
        if !ops::complete_job(&tx, &req.job_id, now()).map_err(internal)? {
            return Err(RpcError::not_found(format!("job {} not found", req.job_id)));
        }
        tx.commit().map_err(internal)?;
        drop(conn);
        self.poke_all();
        self.wake();
        Ok(job::Empty {})
    }

    pub(crate) async fn list_jobs(
        &self,
        req: c::ListJobsRequest,
    ) -> Result<c::ListJobsResponse, RpcError> {
        let q = req.query.unwrap_or_default();
        if q.offset < 0 || q.offset > 5000 {
            return Err(RpcError::invalid("query.offset must be between 0 and 5000"));
        }
        let state = if q.state_filter.is_empty() {
            None
        } else {
            Some(JobState::from_friendly(&q.state_filter).ok_or_else(|| {
                RpcError::invalid(format!(
                    "query.state_filter: unknown state {:?}; use pending, running, succeeded, failed, killed, worker_failed or unschedulable",
                    q.state_filter
                ))
            })?)
        };
        let limit = if q.limit <= 0 || q.limit > 500 {
            500
        } else {
            q.limit
        };
        let conn = self.db();
        let reasons = lock(&self.pending_reasons);
        let mut resp = views::list_jobs(&conn, &q, state, limit, &reasons)?;
        for j in &mut resp.jobs {
            self.decorate_federated(&conn, j)?;
        }
        Ok(resp)
    }

    pub(crate) async fn get_task_status(
        &self,
        req: c::GetTaskStatusRequest,
    ) -> Result<c::GetTaskStatusResponse, RpcError> {
        TaskId::parse(&req.task_id).map_err(|e| RpcError::invalid(format!("task_id: {e}")))?;
        let conn = self.db();
        let reasons = lock(&self.pending_reasons);
        let task = views::task_status(&conn, &req.task_id, true, &reasons)?
            .ok_or_else(|| RpcError::not_found(format!("task {} not found", req.task_id)))?;
        let job_id = req.task_id.rsplit_once('/').map(|x| x.0).unwrap_or("");
        let job_resources = self
            .spec(&conn, job_id)?
            .and_then(|s| s.request.resources.clone());
        drop(reasons);
        drop(conn);
        let failed = matches!(
            TaskState::from_code(task.state),
            Some(TaskState::Failed | TaskState::WorkerFailed)
        );
        let root_cause_highlights = if failed {
            self.root_cause_highlights(&req.task_id)
        } else {
            Vec::new()
        };
        Ok(c::GetTaskStatusResponse {
            task: Some(task),
            job_resources,
            root_cause_highlights,
        })
    }

    /// The lines of a failed task's recent logs most likely to name the failure; empty if the
    /// logs cannot be read (the status is still worth returning).
    fn root_cause_highlights(&self, task_id: &str) -> Vec<String> {
        let q = iris_store::logs::FetchQuery {
            source: format!("{task_id}:"),
            scope: iris_store::logs::Scope::Prefix,
            since_ms: 0,
            cursor: 0,
            until_cursor: 0,
            substring: String::new(),
            regex: String::new(),
            max_lines: crate::highlights::LOG_TAIL,
            tail: true,
            min_level: 0,
        };
        let conn = lock(&self.logs);
        match iris_store::logs::fetch(&conn, &q) {
            Ok((lines, _)) => {
                let data: Vec<String> = lines.into_iter().map(|l| l.data).collect();
                crate::highlights::root_cause(&data)
            }
            Err(e) => {
                tracing::warn!(task = task_id, error = %e, "reading logs for root-cause highlights");
                Vec::new()
            }
        }
    }

    pub(crate) async fn list_tasks(
        &self,
        req: c::ListTasksRequest,
    ) -> Result<c::ListTasksResponse, RpcError> {
        let conn = self.db();
        if ops::job_state_of(&conn, &req.job_id)
            .map_err(internal)?
            .is_none()
        {
            return Err(RpcError::not_found(format!("job {} not found", req.job_id)));
        }
        let reasons = lock(&self.pending_reasons);
        let tasks = views::tasks_of_job(&conn, &req.job_id, &reasons)?;
        Ok(c::ListTasksResponse { tasks })
    }

    pub(crate) async fn kick_tasks(
        &self,
        req: c::KickTasksRequest,
    ) -> Result<c::KickTasksResponse, RpcError> {
        let caller = crate::auth::caller();
        for t in &req.targets {
            crate::auth::check_owner(&caller, t, "kick")?;
        }
        let desired = TaskState::from_code(req.desired_state);
        if !matches!(
            desired,
            Some(TaskState::Preempted) | Some(TaskState::Failed)
        ) {
            return Err(RpcError::invalid(
                "desired_state must be one of: preempted, failed",
            ));
        }
        if req.targets.is_empty() {
            return Err(RpcError::invalid(
                "at least one target (a task, <task>:<attempt> or job id) is required",
            ));
        }
        let reason = if req.reason.is_empty() {
            "operator request".to_string()
        } else {
            req.reason.clone()
        };
        let mut conn = self.db();
        let tx = conn.transaction().map_err(internal)?;
        let mut results = Vec::new();
        for target in &req.targets {
            let tasks = match resolve_kick(&tx, target)? {
                Kick::Tasks(tasks) => tasks,
                Kick::Reject { task_id, detail } => {
                    results.push(c::KickResult {
                        target: target.clone(),
                        task_id,
                        queued: false,
                        detail,
                    });
                    continue;
                }
            };
            for task_id in tasks {
                let ev = match desired {
                    Some(TaskState::Failed) => iris_types::TaskEvent::KickFail,
                    _ => iris_types::TaskEvent::Preempt {
                        by: format!("operator ({reason})"),
                    },
                };
                let r = ops::apply_task_event(
                    &tx,
                    &task_id,
                    &ev,
                    None,
                    ops::Finish::AwaitWorker,
                    now(),
                    "iris/operator",
                )
                .map_err(internal)?;
                let (queued, detail) = match r {
                    Some(s) => (true, format!("now {s}")),
                    None => (false, "task is not running on a worker".to_string()),
                };
                results.push(c::KickResult {
                    target: target.clone(),
                    task_id,
                    queued,
                    detail,
                });
            }
        }
        tx.commit().map_err(internal)?;
        drop(conn);
        self.poke_all();
        self.wake();
        Ok(c::KickTasksResponse { results })
    }

    pub(crate) async fn register(
        &self,
        req: c::RegisterRequest,
    ) -> Result<c::RegisterResponse, RpcError> {
        if req.worker_id.is_empty() {
            return Ok(c::RegisterResponse {
                worker_id: String::new(),
                accepted: false,
            });
        }
        if req.address.is_empty() {
            return Err(RpcError::invalid(
                "address: the worker's host:port is required",
            ));
        }
        let md = req.metadata.clone().unwrap_or_default();
        {
            let mut conn = self.db();
            let tx = conn.transaction().map_err(internal)?;
            crate::reconcile::upsert_worker(&tx, &req, &md).map_err(internal)?;
            tx.commit().map_err(internal)?;
        }
        crate::reconcile::ensure_reconciler(self, &req.worker_id);
        self.wake();
        Ok(c::RegisterResponse {
            worker_id: req.worker_id,
            accepted: true,
        })
    }

    pub(crate) async fn list_workers(
        &self,
        _req: c::ListWorkersRequest,
    ) -> Result<c::ListWorkersResponse, RpcError> {
        let conn = self.db();
        let workers = views::workers(&conn)?;
        let n = workers.len() as i32;
        Ok(c::ListWorkersResponse {
            workers,
            total_count: n,
            has_more: false,
        })
    }

    pub(crate) async fn execute_raw_query(
        &self,
        req: query::RawQueryRequest,
    ) -> Result<query::RawQueryResponse, RpcError> {
        // A query may run for its whole time limit: keep it off the async workers, so that
        // even several runaway queries never stall RPCs, reconciles or the tick.
        let me = self
            .self_arc()
            .ok_or_else(|| RpcError::new(Code::Unavailable, "controller is shutting down"))?;
        let r = tokio::task::spawn_blocking(move || {
            let conn = lock(&me.readonly);
            iris_store::query::run_readonly(
                &conn,
                &req.sql,
                me.cfg.query_time_limit,
                me.cfg.query_max_rows,
            )
        })
        .await
        .map_err(internal)?
        .map_err(|e| match e {
            iris_store::query::QueryError::NotAllowed(m) => RpcError::invalid(m),
            iris_store::query::QueryError::Timeout(_) => {
                RpcError::new(Code::DeadlineExceeded, e.to_string())
            }
            iris_store::query::QueryError::Sql(m) => RpcError::invalid(format!("sql: {m}")),
        })?;
        Ok(query::RawQueryResponse {
            columns: r
                .columns
                .into_iter()
                .map(|name| query::ColumnMeta {
                    name,
                    r#type: "unknown".into(),
                })
                .collect(),
            rows: r.rows,
        })
    }

    pub(crate) async fn set_user_budget(
        &self,
        req: c::SetUserBudgetRequest,
    ) -> Result<c::SetUserBudgetResponse, RpcError> {
        iris_types::ids::validate_user(&req.user_id)
            .map_err(|e| RpcError::invalid(format!("user_id: {e}")))?;
        if req.budget_limit < 0 {
            return Err(RpcError::invalid(
                "budget_limit must not be negative (0 = unlimited)",
            ));
        }
        let band = if req.max_band == 0 {
            Band::Interactive
        } else {
            Band::from_code(req.max_band).ok_or_else(|| {
                RpcError::invalid(format!("max_band: unknown value {}", req.max_band))
            })?
        };
        let conn = self.db();
        conn.execute(
            "INSERT INTO user_budgets(user_id, budget_limit, max_band, updated_at_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(user_id) DO UPDATE SET budget_limit = excluded.budget_limit, max_band = excluded.max_band, updated_at_ms = excluded.updated_at_ms",
            params![req.user_id.trim(), req.budget_limit, band.code(), now()],
        )
        .map_err(internal)?;
        Ok(c::SetUserBudgetResponse {})
    }

    pub(crate) async fn get_user_budget(
        &self,
        req: c::GetUserBudgetRequest,
    ) -> Result<c::GetUserBudgetResponse, RpcError> {
        if req.user_id.trim().is_empty() {
            return Err(RpcError::invalid("user_id is required"));
        }
        let conn = self.db();
        let row: Option<(i64, i32)> = conn
            .query_row(
                "SELECT budget_limit, max_band FROM user_budgets WHERE user_id = ?1",
                [&req.user_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(internal)?;
        let (limit, band) = row.unwrap_or((
            crate::accounts::DEFAULT_BUDGET_LIMIT,
            crate::accounts::DEFAULT_MAX_BAND.code(),
        ));
        let spent = views::user_spend(&conn, &req.user_id)?;
        Ok(c::GetUserBudgetResponse {
            user_id: req.user_id,
            budget_limit: limit,
            budget_spent: spent,
            max_band: band,
        })
    }

    pub(crate) async fn list_user_budgets(
        &self,
        _req: c::ListUserBudgetsRequest,
    ) -> Result<c::ListUserBudgetsResponse, RpcError> {
        let conn = self.db();
        let rows: Vec<(String, i64, i32)> = {
            let mut st = conn
                .prepare(
                    "SELECT user_id, budget_limit, max_band FROM user_budgets ORDER BY user_id",
                )
                .map_err(internal)?;
            let it = st
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .map_err(internal)?;
            it.collect::<Result<_, _>>().map_err(internal)?
        };
        let mut users = Vec::new();
        for (u, l, b) in rows {
            let spent = views::user_spend(&conn, &u)?;
            users.push(c::GetUserBudgetResponse {
                user_id: u,
                budget_limit: l,
                budget_spent: spent,
                max_band: b,
            });
        }
        Ok(c::ListUserBudgetsResponse { users })
    }

    /// A fresh 30-day worker token for a worker (or admin) caller; needs auth configured.
    pub(crate) async fn renew_worker_token(
        &self,
        _req: c::RenewWorkerTokenRequest,
    ) -> Result<c::RenewWorkerTokenResponse, RpcError> {
        let Some(a) = &self.cfg.auth else {
            return Err(RpcError::precondition(
                "this controller has no auth configured, so it issues no worker tokens",
            ));
        };
        let caller = crate::auth::caller();
        if !matches!(
            caller.role,
            iris_auth::Role::Worker | iris_auth::Role::Admin
        ) {
            return Err(RpcError::new(
                Code::PermissionDenied,
                "RenewWorkerToken requires the worker role",
            ));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let token = a
            .keypair
            .mint(
                &a.issuer,
                "iris",
                "system:worker",
                "worker",
                30 * 86400,
                now,
                Default::default(),
            )
            .map_err(internal)?;
        Ok(c::RenewWorkerTokenResponse { token })
    }

    pub(crate) async fn get_current_user(
        &self,
        _req: job::GetCurrentUserRequest,
    ) -> Result<job::GetCurrentUserResponse, RpcError> {
        let c = crate::auth::caller();
        Ok(job::GetCurrentUserResponse {
            display_name: c.user_id.clone(),
            user_id: c.user_id,
            role: c.role.name().into(),
        })
    }

    pub(crate) async fn list_endpoints(
        &self,
        req: c::ListEndpointsRequest,
    ) -> Result<c::ListEndpointsResponse, RpcError> {
        let mut endpoints = Vec::new();
        let log_name = "/system/log-server";
        let matches = if req.exact {
            req.prefix == log_name
        } else {
            log_name.starts_with(&req.prefix)
        };
        if matches {
            endpoints.push(c::Endpoint {
                name: log_name.into(),
                address: self.url(),
                ..Default::default()
            });
        }
        Ok(c::ListEndpointsResponse { endpoints })
    }

    pub(crate) async fn push_logs(
        &self,
        req: fl::PushLogsRequest,
    ) -> Result<fl::PushLogsResponse, RpcError> {
        if req.key.is_empty() {
            return Err(RpcError::invalid(
                "key: the log key (<task>:<attempt>) is required",
            ));
        }
        // A positive `seq` is the writer's own line number: retried pushes are stored once.
        let lines: Vec<(String, String, i64, i32, Option<i64>)> = req
            .entries
            .into_iter()
            .map(|e| {
                (
                    e.source,
                    e.data,
                    e.timestamp.map(|t| t.epoch_ms).unwrap_or_else(now),
                    e.level,
                    (e.seq > 0).then_some(e.seq),
                )
            })
            .collect();
        let mut conn = lock(&self.logs);
        iris_store::logs::append_numbered(&mut conn, &req.key, &lines).map_err(internal)?;
        Ok(fl::PushLogsResponse {})
    }

    pub(crate) async fn fetch_logs(
        &self,
        req: fl::FetchLogsRequest,
    ) -> Result<fl::FetchLogsResponse, RpcError> {
        let scope = match req.match_scope {
            1 => iris_store::logs::Scope::Exact,
            2 => iris_store::logs::Scope::Prefix,
            _ => iris_store::logs::Scope::Regex,
        };
        if req.max_lines < 0 {
            return Err(RpcError::invalid(
                "max_lines must not be negative (0 = 1000)",
            ));
        }
        let min_level = iris_store::logs::parse_level(&req.min_level).map_err(RpcError::invalid)?;
        let caller = crate::auth::caller();
        if caller.role == iris_auth::Role::FederationPeer {
            let key = crate::federation::log_job_key(&req.source);
            self.check_received_from(key, &caller.user_id)?;
        } else if let Some(peer) = self.log_peer(&req.source) {
            return self.fetch_logs_from_peer(&peer, &req).await;
        }
        let q = iris_store::logs::FetchQuery {
            source: req.source.clone(),
            scope,
            since_ms: req.since_ms,
            cursor: req.cursor,
            until_cursor: req.until_cursor,
            substring: req.substring,
            regex: req.regex,
            max_lines: req.max_lines.min(100_000) as usize,
            tail: req.tail,
            min_level,
        };
        let conn = lock(&self.logs);
        let (lines, cursor) = iris_store::logs::fetch(&conn, &q).map_err(|e| match e {
            iris_store::logs::FetchError::BadRegex(..) => RpcError::invalid(e.to_string()),
            other => internal(other),
        })?;
        let entries = lines
            .into_iter()
            .map(|l| fl::LogEntry {
                timestamp: Some(fl::Timestamp {
                    epoch_ms: l.epoch_ms,
                }),
                attempt_id: l
                    .key
                    .rsplit_once(':')
                    .and_then(|(_, n)| n.parse().ok())
                    .unwrap_or(0),
                source: l.source,
                data: l.data,
                level: l.level,
                key: if scope == iris_store::logs::Scope::Exact {
                    String::new()
                } else {
                    l.key
                },
                seq: l.seq,
            })
            .collect();
        Ok(fl::FetchLogsResponse { entries, cursor })
    }

    fn poke_all(&self) {
        for w in lock(&self.workers).values() {
            w.poke.notify_one();
        }
    }
}

fn eq_constraint(key: &str, value: &str) -> job::Constraint {
    job::Constraint {
        key: key.into(),
        op: 0,
        value: Some(job::AttributeValue {
            value: Some(job::attribute_value::Value::StringValue(value.into())),
        }),
        values: Vec::new(),
        mode: 0,
    }
}

/// What a kick target names: the active tasks to kick, or why there are none.
#[derive(Debug, PartialEq, Eq)]
enum Kick {
    Tasks(Vec<String>),
    Reject { task_id: String, detail: String },
}

/// Resolves a kick target: a task (its current attempt), `<task>:<N>` (only if N is current),
/// or a job (its tasks that are assigned, building or running). Only active tasks are kicked.
fn resolve_kick(conn: &iris_store::rusqlite::Connection, target: &str) -> Result<Kick, RpcError> {
    let reject = |task_id: &str, detail: String| {
        Ok(Kick::Reject {
            task_id: task_id.to_string(),
            detail,
        })
    };
    let (name, attempt) = match target.rsplit_once(':') {
        Some((name, n)) => match n.parse::<i64>() {
            Ok(n) if n >= 0 => (name, Some(n)),
            _ => {
                return reject(
                    "",
                    format!("{target:?}: an attempt suffix must be a non-negative number"),
                )
            }
        },
        None => (target, None),
    };
    if TaskId::parse(name).is_ok() {
        let row: Option<(i32, i64)> = conn
            .query_row(
                "SELECT state, current_attempt_id FROM tasks WHERE task_id = ?1",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(internal)?;
        let Some((state, current)) = row else {
            return reject("", "task not found".into());
        };
        if let Some(n) = attempt.filter(|n| *n != current) {
            return reject(
                name,
                format!("attempt {n} is not current (current is {current})"),
            );
        }
        let state = TaskState::from_code(state).unwrap_or(TaskState::Unspecified);
        if !matches!(
            state,
            TaskState::Assigned | TaskState::Building | TaskState::Running
        ) {
            return reject(name, format!("task is {state}, not running on a worker"));
        }
        return Ok(Kick::Tasks(vec![name.to_string()]));
    }
    if let Err(e) = JobName::parse(name) {
        return reject(
            "",
            format!("{target:?} is not a task, attempt or job id: {e}"),
        );
    }
    if attempt.is_some() {
        return reject("", "a job target cannot carry an ':attempt' suffix".into());
    }
    if ops::job_state_of(conn, name).map_err(internal)?.is_none() {
        return reject("", "job not found".into());
    }
    let mut st = conn
        .prepare("SELECT task_id FROM tasks WHERE job_id = ?1 AND state IN (2, 3, 9) ORDER BY task_index")
        .map_err(internal)?;
    let tasks: Vec<String> = st
        .query_map([name], |r| r.get(0))
        .map_err(internal)?
        .collect::<Result<_, _>>()
        .map_err(internal)?;
    if tasks.is_empty() {
        return reject(name, "job has no tasks running on a worker".into());
    }
    Ok(Kick::Tasks(tasks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_gate() {
        assert!(check_revision_date("", Some("2026-10-24")).is_ok());
        assert!(check_revision_date("2026-10-24", Some("2026-10-24")).is_ok());
        assert!(check_revision_date("2026-10-10", Some("2026-10-24")).is_ok());
        let e = check_revision_date("2026-10-09", Some("2026-10-24")).expect_err("too old");
        assert_eq!(e.code, Code::FailedPrecondition);
        assert!(e.message.contains("too old"));
        assert_eq!(
            check_revision_date("yesterday", Some("2026-10-24"))
                .expect_err("bad")
                .code,
            Code::InvalidArgument
        );
        assert!(check_revision_date("2020-01-01", None).is_ok());
    }
}
