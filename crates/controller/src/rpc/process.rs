//! Process diagnostics (`iris process ...`, `iris task exec|profile`): `GetProcessStatus`,
//! `ProfileTask` and `ExecInContainer`, and `FetchLogs` for the `/system/...` sources.
//!
//! A target is the controller (`""`, `/system/process`, `/system/controller`), a worker
//! (`/system/worker/<id>`: forwarded to that worker daemon's method of the same name), or a task
//! or attempt (`/user/job/0`, `/user/job/0:1`: owner or admin only, forwarded to the worker
//! running that attempt, which must be running).
//!
//! The controller calls workers without credentials, as it does for `Reconcile`.

use crate::error::{Error, Result};
use crate::Controller;
use iris_proto::cluster::controller as c;
use iris_proto::cluster::worker as w;
use iris_proto::finelog::logging as fl;
use iris_proto::iris::logging as il;
use iris_proto::job;
use iris_rpc::{procinfo, proclog, Code, RpcError};
use iris_types::{AttemptId, TaskId, TaskState};
use std::time::Duration;

const WORKER_SERVICE: &str = "iris.cluster.WorkerService";
const CONTROLLER_SOURCE: &str = "/system/controller";
const WORKER_PREFIX: &str = "/system/worker/";
/// What a worker daemon calls itself in `ProfileTask`.
const SELF_TARGET: &str = "/system/process";
/// Beyond a profile's sampling window or an exec's timeout: attaching, writing, the hop.
const RPC_MARGIN: Duration = Duration::from_secs(45);

/// What a diagnostic request addresses.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Controller,
    Worker(String),
    Task { task: TaskId, attempt: Option<u32> },
}

fn parse_target(target: &str) -> Result<Target> {
    match target {
        "" | SELF_TARGET | CONTROLLER_SOURCE => return Ok(Target::Controller),
        _ => {}
    }
    if let Some(id) = target.strip_prefix(WORKER_PREFIX) {
        if !id.is_empty() && !id.contains('/') {
            return Ok(Target::Worker(id.to_string()));
        }
    }
    if let Ok(a) = AttemptId::parse(target) {
        return Ok(Target::Task {
            task: a.task,
            attempt: Some(a.attempt),
        });
    }
    if let Ok(task) = TaskId::parse(target) {
        return Ok(Target::Task {
            task,
            attempt: None,
        });
    }
    Err(Error::invalid(format!(
        "target '{target}': name the controller ({CONTROLLER_SOURCE}), a worker ({WORKER_PREFIX}<id>), a task (/user/job/0) or an attempt (/user/job/0:1)"
    )))
}

fn version() -> String {
    format!("none: iris controller {} (Rust)", env!("CARGO_PKG_VERSION"))
}

fn own_snapshot() -> Result<procinfo::Snapshot> {
    procinfo::snapshot(std::process::id()).map_err(Error::from)
}

fn process_info(s: procinfo::Snapshot, python_version: String) -> job::ProcessInfo {
    job::ProcessInfo {
        hostname: s.hostname,
        pid: s.pid as i32,
        python_version,
        uptime_ms: s.uptime_ms,
        memory_rss_bytes: s.memory_rss_bytes,
        memory_vms_bytes: s.memory_vms_bytes,
        thread_count: s.thread_count,
        open_fd_count: s.open_fd_count,
        memory_total_bytes: s.memory_total_bytes,
        cpu_count: s.cpu_count,
        cpu_millicores: s.cpu_millicores,
        provenance: Some(iris_proto::build_provenance()),
    }
}

/// The controller's own profile: native threads; CPU and memory profilers are for Python.
/// The published `iris.profile` type and format names of a request's profiler.
fn profile_kind(p: &job::profile_type::Profiler) -> (&'static str, &'static str) {
    use job::profile_type::Profiler;
    match p {
        Profiler::Threads(_) => ("thread", "raw"),
        Profiler::Cpu(c) => (
            "cpu",
            match c.format() {
                job::cpu_profile::Format::Speedscope => "speedscope",
                job::cpu_profile::Format::Raw => "raw",
                _ => "flamegraph",
            },
        ),
        Profiler::Memory(m) => (
            "memory",
            match m.format() {
                job::memory_profile::Format::Table => "table",
                job::memory_profile::Format::Stats => "stats",
                job::memory_profile::Format::Raw => "raw",
                _ => "html",
            },
        ),
    }
}

fn profile_self(profiler: &job::profile_type::Profiler) -> std::result::Result<Vec<u8>, String> {
    use job::profile_type::Profiler;
    match profiler {
        Profiler::Threads(_) => procinfo::thread_dump(std::process::id(), false)
            .map(String::into_bytes)
            .map_err(|e| format!("reading /proc/self/task: {e}")),
        Profiler::Cpu(_) => Err(
            "cpu profiling of the controller is not supported (it is a Rust process, which py-spy cannot sample); use `iris process profile threads` for its threads, or `perf record -p <pid>` on its host".into(),
        ),
        Profiler::Memory(_) => Err(
            "memory profiling of the controller is not supported (it is a Rust process, which memray cannot attach to); `iris process status` shows its RSS".into(),
        ),
    }
}

impl Controller {
    /// A client for worker daemon `worker_id` (never an in-process backend).
    fn worker_client(&self, worker_id: &str) -> Result<iris_rpc::Client> {
        let inproc = || {
            Error::precondition(format!(
                "worker {worker_id} is an in-process backend (e.g. Kubernetes), not a worker daemon: exec, profiles and process status reach only worker daemons (for a pod, use kubectl)"
            ))
        };
        if self.backend(worker_id).is_some() {
            return Err(inproc());
        }
        let addr = iris_store::workers::address(&*self.db(), worker_id)?.ok_or_else(|| {
            Error::not_found(format!(
                "worker {worker_id} not found; `iris cluster status` lists the workers"
            ))
        })?;
        let url = if addr.starts_with("http") {
            addr
        } else {
            format!("http://{addr}")
        };
        iris_rpc::Client::new(&url).map_err(Error::from)
    }

    /// Calls a worker daemon; its refusals reach the caller as they are, and a worker that does
    /// not answer is UNAVAILABLE naming it.
    async fn call_worker<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        worker_id: &str,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp> {
        let client = self.worker_client(worker_id)?;
        client
            .call(WORKER_SERVICE, method, req, timeout)
            .await
            .map_err(|e| match e.code {
                Code::Unavailable | Code::DeadlineExceeded | Code::Unknown => Error::unavailable(
                    format!("worker {worker_id} did not answer {method}: {}", e.message),
                ),
                _ => Error::Rejected(e),
            })
    }

    /// The running attempt of `task` (attempt `n`, else its current one) and its worker, after
    /// the caller's owner-or-admin check; `what` names the operation in refusals.
    fn running_attempt(
        &self,
        task: &TaskId,
        attempt: Option<u32>,
        what: &str,
    ) -> Result<(AttemptId, String)> {
        let caller = crate::auth::caller();
        let id = task.to_string();
        crate::auth::check_owner(&caller, &id, what)?;
        let row = iris_store::views::task(&*self.db(), &id)?
            .ok_or_else(|| Error::not_found(format!("task {id} not found")))?;
        // `local` unless the task's job was handed to a federation peer (its mirrored rows).
        if row.cluster != "local" && !row.cluster.is_empty() {
            return Err(Error::precondition(format!(
                "task {id} runs on federation peer {}: {what} reaches only tasks on this cluster's workers; ask that cluster's controller",
                row.cluster
            )));
        }
        let n = match attempt {
            Some(n) => i64::from(n),
            None => row.current_attempt_id,
        };
        let state = TaskState::from_code(row.state).unwrap_or(TaskState::Unspecified);
        let Some(a) = row.attempts.iter().find(|a| a.attempt_id == n) else {
            return Err(match attempt {
                Some(_) => Error::not_found(format!(
                    "attempt {id}:{n} not found (the task's current attempt is {})",
                    row.current_attempt_id
                )),
                None => Error::precondition(format!(
                    "task {id} is {state}, not running: {what} needs a running task (`iris task wait` or `iris task describe` shows where it is)"
                )),
            });
        };
        if a.state != TaskState::Running {
            return Err(Error::precondition(format!(
                "attempt {id}:{n} is {}, not running: {what} needs a running task (`iris task describe {id}` shows its state)",
                a.state
            )));
        }
        let worker = a.worker_id.clone().ok_or_else(|| {
            Error::precondition(format!("attempt {id}:{n} has no worker recorded"))
        })?;
        Ok((task.attempt(n as u32), worker))
    }

    pub(crate) async fn get_process_status(
        &self,
        req: job::GetProcessStatusRequest,
    ) -> Result<job::GetProcessStatusResponse> {
        match parse_target(&req.target)? {
            Target::Controller => {
                let min_level = proclog::parse_level(&req.min_log_level).map_err(Error::invalid)?;
                let log_entries = if req.max_log_lines > 0 {
                    let (lines, _) = proclog::recent(&proclog::Query {
                        substring: &req.log_substring,
                        min_level,
                        after_seq: 0,
                        max_lines: req.max_log_lines as usize,
                        tail: true,
                    });
                    lines
                        .into_iter()
                        .map(|l| il::LogEntry {
                            timestamp: Some(iris_proto::time::Timestamp {
                                epoch_ms: Some(l.epoch_ms),
                            }),
                            source: CONTROLLER_SOURCE.into(),
                            data: l.data,
                            level: l.level,
                            seq: l.seq,
                            ..Default::default()
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                Ok(job::GetProcessStatusResponse {
                    process_info: Some(process_info(own_snapshot()?, version())),
                    log_entries,
                })
            }
            Target::Worker(id) => {
                let fwd = job::GetProcessStatusRequest {
                    target: String::new(),
                    ..req
                };
                self.call_worker(&id, "GetProcessStatus", &fwd, Duration::from_secs(15))
                    .await
            }
            Target::Task { task, attempt } => {
                let (a, worker) = self.running_attempt(&task, attempt, "process status of")?;
                let fwd = job::GetProcessStatusRequest {
                    target: a.to_string(),
                    ..req
                };
                self.call_worker(&worker, "GetProcessStatus", &fwd, Duration::from_secs(15))
                    .await
            }
        }
    }

    pub(crate) async fn profile_task(
        &self,
        req: job::ProfileTaskRequest,
    ) -> Result<job::ProfileTaskResponse> {
        let Some(profiler) = req.profile_type.as_ref().and_then(|p| p.profiler.as_ref()) else {
            return Err(Error::invalid(
                "profile_type: choose one of threads, cpu or memory",
            ));
        };
        let duration = Duration::from_secs(req.duration_seconds.clamp(1, 3600) as u64);
        let timeout = duration + RPC_MARGIN;
        let (kind, format) = profile_kind(profiler);
        let source = match req.target.as_str() {
            "" | SELF_TARGET => CONTROLLER_SOURCE.to_string(),
            t => t.to_string(),
        };
        let (resp, attempt_id, vm_id) = match parse_target(&req.target)? {
            Target::Controller => (
                job::ProfileTaskResponse::from_outcome(profile_self(profiler)),
                None,
                String::new(),
            ),
            Target::Worker(id) => {
                let fwd = job::ProfileTaskRequest {
                    target: SELF_TARGET.into(),
                    ..req
                };
                let r = self.call_worker(&id, "ProfileTask", &fwd, timeout).await?;
                (r, None, id)
            }
            Target::Task { task, attempt } => {
                let (a, worker) = self.running_attempt(&task, attempt, "profile")?;
                tracing::info!(attempt = %a, worker = %worker, "profiling an attempt");
                let fwd = job::ProfileTaskRequest {
                    target: a.to_string(),
                    ..req
                };
                let r: job::ProfileTaskResponse = self
                    .call_worker(&worker, "ProfileTask", &fwd, timeout)
                    .await?;
                (r, Some(i64::from(a.attempt)), worker)
            }
        };
        if !resp.profile_data().is_empty() {
            self.record_profile(&crate::stats::Capture {
                source: source.split_once(':').map_or(source.as_str(), |(t, _)| t),
                attempt_id,
                vm_id: &vm_id,
                duration_seconds: duration.as_secs() as i64,
                kind,
                format,
                data: resp.profile_data(),
            });
        }
        Ok(resp)
    }

    pub(crate) async fn exec_in_container(
        &self,
        req: c::ExecInContainerRequest,
    ) -> Result<c::ExecInContainerResponse> {
        let task = TaskId::parse(&req.task_id).map_err(|e| {
            Error::invalid(format!("task_id: {e}; name a task, e.g. /alice/train/0"))
        })?;
        if req.command.is_empty() {
            return Err(Error::invalid(
                "command: give the command to run (e.g. `iris task exec TASK -- pwd`)",
            ));
        }
        let (a, worker) = self.running_attempt(&task, None, "exec in")?;
        let timeout = match req.timeout_seconds {
            // No limit asked for: the call still ends some day.
            t if t < 0 => Duration::from_secs(7 * 24 * 3600),
            0 => Duration::from_secs(60) + RPC_MARGIN,
            t => Duration::from_secs(t as u64) + RPC_MARGIN,
        };
        tracing::info!(attempt = %a, worker = %worker, user = %crate::auth::caller().user_id, "exec in a task");
        let r: w::ExecInContainerResponse = self
            .call_worker(
                &worker,
                "ExecInContainer",
                &w::ExecInContainerRequest {
                    task_id: req.task_id,
                    command: req.command,
                    timeout_seconds: req.timeout_seconds,
                },
                timeout,
            )
            .await?;
        // Every field is sent, zeros too, as the published controller does.
        Ok(c::ExecInContainerResponse {
            exit_code: Some(r.exit_code),
            stdout: Some(r.stdout),
            stderr: Some(r.stderr),
            error: Some(r.error),
        })
    }

    /// `FetchLogs` for a `/system/...` source: the controller's own recent lines, or a worker's
    /// (from its `GetProcessStatus`); `None` for other sources.
    pub(crate) async fn fetch_system_logs(
        &self,
        req: &fl::FetchLogsRequest,
        min_level: i32,
    ) -> Result<Option<fl::FetchLogsResponse>> {
        let source = req.source.as_str();
        let max = if req.max_lines > 0 {
            req.max_lines as usize
        } else {
            1000
        };
        let lines: Vec<fl::LogEntry> = if matches!(source, CONTROLLER_SOURCE | SELF_TARGET) {
            let (lines, cursor) = proclog::recent(&proclog::Query {
                substring: &req.substring,
                min_level,
                after_seq: req.cursor,
                max_lines: max,
                tail: req.tail,
            });
            let entries = lines
                .into_iter()
                .map(|l| fl::LogEntry {
                    timestamp: Some(fl::Timestamp {
                        epoch_ms: l.epoch_ms,
                    }),
                    source: Some(source.to_string()),
                    data: Some(l.data),
                    level: Some(l.level),
                    seq: Some(l.seq),
                    attempt_id: Some(0),
                    key: None,
                })
                .collect();
            return Ok(Some(fl::FetchLogsResponse { entries, cursor }));
        } else if let Some(id) = source.strip_prefix(WORKER_PREFIX) {
            let r: job::GetProcessStatusResponse = self
                .call_worker(
                    id,
                    "GetProcessStatus",
                    &job::GetProcessStatusRequest {
                        // The worker has no cursor: ask for its whole ring and cut here.
                        max_log_lines: if req.cursor > 0 {
                            proclog::CAPACITY as i32
                        } else {
                            max as i32
                        },
                        log_substring: req.substring.clone(),
                        min_log_level: req.min_level.clone(),
                        target: String::new(),
                    },
                    Duration::from_secs(15),
                )
                .await?;
            r.log_entries
                .into_iter()
                .filter(|e| e.seq > req.cursor)
                .map(|e| fl::LogEntry {
                    timestamp: e.timestamp.map(|t| fl::Timestamp {
                        epoch_ms: t.epoch_ms(),
                    }),
                    source: Some(source.to_string()),
                    data: Some(e.data),
                    level: Some(e.level),
                    seq: Some(e.seq),
                    attempt_id: Some(0),
                    key: None,
                })
                .collect()
        } else {
            return Ok(None);
        };
        let keep = lines.len().min(max);
        let lines: Vec<fl::LogEntry> = if req.tail || req.cursor == 0 {
            lines[lines.len() - keep..].to_vec()
        } else {
            lines[..keep].to_vec()
        };
        let cursor = lines.last().and_then(|e| e.seq).unwrap_or(req.cursor);
        Ok(Some(fl::FetchLogsResponse {
            entries: lines,
            cursor,
        }))
    }
}

/// Refuses `/system/...` log reads to callers that are not people (or the dashboard).
pub(crate) fn check_system_log_reader() -> Result<()> {
    let caller = crate::auth::caller();
    use iris_auth::Role;
    match caller.role {
        Role::Admin | Role::User | Role::Dashboard => Ok(()),
        Role::Task | Role::Worker | Role::FederationPeer | Role::Endpoint => {
            Err(Error::Rejected(RpcError::new(
                Code::PermissionDenied,
                format!(
                    "reading the daemons' own logs requires a user or admin role (you are {} with role {})",
                    caller.user_id,
                    caller.role.name()
                ),
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_the_controller_a_worker_a_task_or_an_attempt() {
        for t in ["", "/system/process", "/system/controller"] {
            assert_eq!(parse_target(t).ok(), Some(Target::Controller), "{t}");
        }
        assert_eq!(
            parse_target("/system/worker/w-1").ok(),
            Some(Target::Worker("w-1".into()))
        );
        let task = TaskId::parse("/alice/train/0").expect("a task id");
        assert_eq!(
            parse_target("/alice/train/0:2").ok(),
            Some(Target::Task {
                task: task.clone(),
                attempt: Some(2)
            })
        );
        assert_eq!(
            parse_target("/alice/train/0").ok(),
            Some(Target::Task {
                task,
                attempt: None
            })
        );
        for bad in ["/system/worker/", "/alice/train", "nonsense"] {
            let e = parse_target(bad).expect_err(bad).to_wire();
            assert_eq!(e.code, Code::InvalidArgument, "{bad}");
            assert!(e.message.contains("/system/worker/<id>"), "{}", e.message);
        }
    }
}
