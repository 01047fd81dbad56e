//! The worker's RPC surface (`iris.cluster.WorkerService`): `HealthCheck`, `ListTasks` and
//! `GetTaskStatus` (what this worker runs, with each attempt's resource usage); `Reconcile`,
//! which takes the controller's desired set of attempts, starts the new ones, stops the ones
//! asked to stop (and live ones no longer desired), and answers with what the worker observes;
//! and the diagnostics in `diag` (`ExecInContainer`, `ProfileTask`, `GetProcessStatus`).

use crate::attempt::{kill_group, run_attempt};
use crate::{lock, Attempt, Inner};
use axum::body::Bytes;
use axum::extract::{Path as AxPath, State};
use axum::http::HeaderMap;
use axum::response::Response;
use iris_proto::cluster::worker as w;
use iris_proto::job;
use iris_rpc::RpcError;
use iris_types::TaskState;
use std::sync::Arc;
use std::time::Instant;

pub(crate) async fn dispatch(
    State(inner): State<Arc<Inner>>,
    AxPath((service, method)): AxPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    use axum::response::IntoResponse;
    match (service.as_str(), method.as_str()) {
        ("iris.cluster.WorkerService", "Reconcile") => {
            let fence = headers.contains_key(iris_rpc::FENCE_HEADER);
            iris_rpc::unary(&headers, &body, |req: w::ReconcileRequest| {
                let inner = inner.clone();
                async move {
                    // A fence carries an empty desired set: every live attempt is stopped below.
                    let fence = fence && req.desired.is_empty();
                    let r = reconcile(&inner, req);
                    if fence && r.is_ok() {
                        inner
                            .fenced
                            .store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    r
                }
            })
            .await
        }
        ("iris.cluster.WorkerService", "ExecInContainer") => {
            iris_rpc::unary(&headers, &body, |req| {
                let inner = inner.clone();
                async move { crate::diag::exec(&inner, req).await }
            })
            .await
        }
        ("iris.cluster.WorkerService", "ProfileTask") => {
            iris_rpc::unary(&headers, &body, |req| {
                let inner = inner.clone();
                async move { crate::diag::profile(&inner, req).await }
            })
            .await
        }
        ("iris.cluster.WorkerService", "GetProcessStatus") => {
            iris_rpc::unary(&headers, &body, |req| {
                let inner = inner.clone();
                async move { crate::diag::process_status(&inner, req) }
            })
            .await
        }
        ("iris.cluster.WorkerService", "ListTasks") => {
            iris_rpc::unary(&headers, &body, |_req: w::ListTasksRequest| {
                let inner = inner.clone();
                async move {
                    let attempts = lock(&inner.attempts);
                    let mut tasks: Vec<job::TaskStatus> =
                        attempts.values().map(task_status).collect();
                    tasks.sort_by(|a, b| {
                        (a.task_id(), a.current_attempt_id())
                            .cmp(&(b.task_id(), b.current_attempt_id()))
                    });
                    Ok::<_, RpcError>(w::ListTasksResponse { tasks })
                }
            })
            .await
        }
        ("iris.cluster.WorkerService", "GetTaskStatus") => {
            iris_rpc::unary(&headers, &body, |req: w::GetTaskStatusRequest| {
                let inner = inner.clone();
                async move {
                    let attempts = lock(&inner.attempts);
                    attempts
                        .values()
                        .filter(|a| a.task_id == req.task_id)
                        .max_by_key(|a| a.attempt_id)
                        .map(task_status)
                        .ok_or_else(|| {
                            RpcError::new(
                                iris_rpc::Code::NotFound,
                                format!(
                                    "task {} has no attempt on this worker (`iris task describe` names the worker that runs it)",
                                    req.task_id
                                ),
                            )
                        })
                }
            })
            .await
        }
        ("iris.cluster.WorkerService", "HealthCheck") => {
            iris_rpc::unary(&headers, &body, |_req: job::Empty| {
                let inner = inner.clone();
                async move {
                    let running = lock(&inner.attempts)
                        .values()
                        .filter(|a| !a.state.is_terminal())
                        .count() as i32;
                    Ok::<_, RpcError>(w::HealthResponse {
                        healthy: true,
                        uptime: None,
                        running_tasks: running,
                    })
                }
            })
            .await
        }
        _ => RpcError::new(
            iris_rpc::Code::Unimplemented,
            format!("{service}/{method} is not implemented"),
        )
        .into_response(),
    }
}

fn reconcile(
    inner: &Arc<Inner>,
    req: w::ReconcileRequest,
) -> Result<w::ReconcileResponse, RpcError> {
    if req.worker_id != inner.cfg.worker_id {
        return Err(RpcError::invalid(format!(
            "reconcile addressed to worker '{}', but this is '{}'",
            req.worker_id, inner.cfg.worker_id
        )));
    }
    *lock(&inner.last_reconcile) = Instant::now();
    let mut observed = Vec::with_capacity(req.desired.len());
    let desired_uids: std::collections::HashSet<String> =
        req.desired.iter().map(|d| d.attempt_uid.clone()).collect();
    let mut attempts = lock(&inner.attempts);
    crate::usage::sample(&mut attempts, Instant::now());
    // Kill zombies: live local attempts the controller no longer wants; forget finished ones.
    attempts.retain(|uid, a| {
        if desired_uids.contains(uid) {
            return true;
        }
        if !a.state.is_terminal() {
            a.stop_requested = true;
            if let Some(pg) = a.pgid {
                kill_group(pg);
            }
            return true;
        }
        false
    });
    for d in req.desired {
        use w::desired_attempt::Intent;
        match d.intent {
            Some(Intent::Run(spec)) => {
                if !attempts.contains_key(&d.attempt_uid) {
                    match spec.request {
                        Some(run) => {
                            // A newer attempt of the same task supersedes an older live one.
                            for a in attempts.values_mut() {
                                if a.task_id == run.task_id
                                    && a.attempt_id < run.attempt_id
                                    && !a.state.is_terminal()
                                {
                                    a.stop_requested = true;
                                    if let Some(pg) = a.pgid {
                                        kill_group(pg);
                                    }
                                }
                            }
                            attempts.insert(
                                d.attempt_uid.clone(),
                                Attempt {
                                    task_id: run.task_id.clone(),
                                    attempt_id: run.attempt_id,
                                    state: TaskState::Building,
                                    exit_code: 0,
                                    error: String::new(),
                                    pgid: None,
                                    container_id: String::new(),
                                    stop_requested: false,
                                    abandoned: false,
                                    run_env: None,
                                    usage: Default::default(),
                                },
                            );
                            let inner2 = inner.clone();
                            let uid = d.attempt_uid.clone();
                            // Owned by the attempt entry: ends when the child exits.
                            tokio::spawn(async move { run_attempt(inner2, uid, run).await });
                        }
                        None => {
                            observed.push(w::AttemptObservation {
                                attempt_uid: d.attempt_uid,
                                state: TaskState::Missing.code(),
                                ..Default::default()
                            });
                            continue;
                        }
                    }
                }
            }
            Some(Intent::Stop(_)) => match attempts.get_mut(&d.attempt_uid) {
                Some(a) if !a.state.is_terminal() => {
                    a.stop_requested = true;
                    if let Some(pg) = a.pgid {
                        kill_group(pg);
                    } else if a.state == TaskState::Pending {
                        a.state = TaskState::Killed;
                    }
                }
                Some(_) => {}
                None => {
                    observed.push(w::AttemptObservation {
                        attempt_uid: d.attempt_uid,
                        state: TaskState::Missing.code(),
                        ..Default::default()
                    });
                    continue;
                }
            },
            None => continue,
        }
        if let Some(a) = attempts.get(&d.attempt_uid) {
            observed.push(w::AttemptObservation {
                attempt_uid: d.attempt_uid,
                state: if a.state == TaskState::Pending {
                    TaskState::Building.code()
                } else {
                    a.state.code()
                },
                exit_code: a.exit_code,
                error: a.error.clone(),
                container_id: a.container_id.clone(),
                resource_usage: a.usage.reported(),
                ..Default::default()
            });
        }
    }
    let running = attempts.values().filter(|a| !a.state.is_terminal()).count() as i32;
    drop(attempts);
    let resources = lock(&inner.host).sample(Instant::now(), running, &inner.cfg.cache_dir);
    Ok(w::ReconcileResponse {
        worker_id: inner.cfg.worker_id.clone(),
        observed,
        health: Some(w::WorkerHealth {
            healthy: true,
            health_error: String::new(),
            resources,
        }),
    })
}

/// What this worker knows of an attempt, as the worker-served status calls answer: its state,
/// exit, container and the usage of its process group.
fn task_status(a: &Attempt) -> job::TaskStatus {
    job::TaskStatus {
        task_id: Some(a.task_id.clone()),
        state: Some(a.state.code()),
        exit_code: Some(a.exit_code),
        error: Some(a.error.clone()),
        current_attempt_id: Some(a.attempt_id),
        container_id: Some(a.container_id.clone()),
        resource_usage: a.usage.reported(),
        ..Default::default()
    }
}

/// The id `task describe` shows for an attempt's "container": its process group, which is what
/// `kill -- -<pgid>` or `ps -g` act on (the reference's process runtime names a random
/// `local-<hex>`; ours keeps its prefix and says which group).
pub(crate) fn container_id(pgid: i32) -> String {
    format!("local-pg{pgid}")
}

#[cfg(test)]
mod tests {
    use iris_proto::job;
    use iris_types::TaskState;

    /// The worker reports `TaskState::code()` in `AttemptObservation.state`: every code must be
    /// the proto's value for the state of the same name.
    #[test]
    fn reported_codes_are_the_wire_codes() {
        for s in TaskState::ALL {
            let wire = job::TaskState::try_from(s.code()).expect("every state has a wire code");
            assert_eq!(TaskState::from_friendly(wire.as_str_name()), Some(*s));
        }
        let reported = [
            (TaskState::Pending, 1),
            (TaskState::Building, 2),
            (TaskState::Running, 3),
            (TaskState::Succeeded, 4),
            (TaskState::Failed, 5),
            (TaskState::Killed, 6),
            (TaskState::WorkerFailed, 7),
            (TaskState::Missing, 12),
        ];
        for (s, code) in reported {
            assert_eq!(s.code(), code, "{s}");
        }
    }
}
