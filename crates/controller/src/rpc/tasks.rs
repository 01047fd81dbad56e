//! Task RPCs: status, list, and operator kicks.

use crate::error::{Error, Result};
use crate::{lock, views, Controller};
use iris_proto::cluster::controller as c;
use iris_store::apply;
use iris_types::{JobName, TaskId, TaskState};

use super::now;

impl Controller {
    pub(crate) async fn get_task_status(
        &self,
        req: c::GetTaskStatusRequest,
    ) -> Result<c::GetTaskStatusResponse> {
        TaskId::parse(&req.task_id).map_err(|e| Error::invalid(format!("task_id: {e}")))?;
        let reader = self.reader();
        let conn = reader.begin_read()?;
        let reasons = lock(&self.pending_reasons);
        let task = views::task(&conn, &req.task_id, &reasons)?
            .ok_or_else(|| Error::not_found(format!("task {} not found", req.task_id)))?;
        let mut task = [task];
        let job_id = req.task_id.rsplit_once('/').map(|x| x.0).unwrap_or("");
        let job_resources = self.job_resources(&conn, job_id)?;
        drop(reasons);
        drop(conn);
        drop(reader);
        self.fill_usage(&mut task);
        let [task] = task;
        let failed = matches!(
            TaskState::from_code(task.state.unwrap_or_default()),
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

    /// A job's requested resources as the published controller sends them beside a task:
    /// `device` always present (empty for a CPU job).
    pub(crate) fn job_resources(
        &self,
        conn: &impl iris_store::Read,
        job_id: &str,
    ) -> Result<Option<iris_proto::job::ResourceSpecProto>> {
        Ok(self
            .spec(conn, job_id)?
            .and_then(|s| s.request.resources.clone())
            .map(|mut r| {
                r.device.get_or_insert_with(Default::default);
                r
            }))
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
    ) -> Result<c::ListTasksResponse> {
        let reader = self.reader();
        let conn = reader.begin_read()?;
        if iris_store::jobs::job_state_of(&conn, &req.job_id)?.is_none() {
            return Err(Error::not_found(format!("job {} not found", req.job_id)));
        }
        let reasons = lock(&self.pending_reasons);
        let mut tasks = views::tasks_of_job(&conn, &req.job_id, &reasons)?;
        drop(reasons);
        drop(conn);
        drop(reader);
        self.fill_usage(&mut tasks);
        Ok(c::ListTasksResponse { tasks })
    }

    pub(crate) async fn kick_tasks(
        &self,
        req: c::KickTasksRequest,
    ) -> Result<c::KickTasksResponse> {
        let caller = crate::auth::caller();
        for t in &req.targets {
            crate::auth::check_owner(&caller, t, "kick")?;
        }
        let desired = TaskState::from_code(req.desired_state);
        if !matches!(
            desired,
            Some(TaskState::Preempted) | Some(TaskState::Failed)
        ) {
            return Err(Error::invalid(
                "desired_state must be one of: preempted, failed",
            ));
        }
        if req.targets.is_empty() {
            return Err(Error::invalid(
                "at least one target (a task, <task>:<attempt> or job id) is required",
            ));
        }
        let reason = if req.reason.is_empty() {
            "operator request".to_string()
        } else {
            req.reason.clone()
        };
        let mut conn = self.db();
        let tx = conn.begin()?;
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
                let r = apply::apply_task_event(
                    &tx,
                    &task_id,
                    &ev,
                    None,
                    apply::Finish::AwaitWorker,
                    now(),
                    "iris/operator",
                )?;
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
        tx.commit()?;
        drop(conn);
        self.poke_all();
        self.wake();
        Ok(c::KickTasksResponse { results })
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
fn resolve_kick(conn: &impl iris_store::Read, target: &str) -> Result<Kick> {
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
                    format!("'{target}': an attempt suffix must be a non-negative number"),
                )
            }
        },
        None => (target, None),
    };
    if TaskId::parse(name).is_ok() {
        let Some((state, current)) = iris_store::jobs::task_state(conn, name)? else {
            return reject("", "task not found".into());
        };
        if let Some(n) = attempt.filter(|n| *n != current) {
            return reject(
                name,
                format!("attempt {n} is not current (current is {current})"),
            );
        }
        if !state.is_active() {
            return reject(name, format!("task is {state}, not running on a worker"));
        }
        return Ok(Kick::Tasks(vec![name.to_string()]));
    }
    if let Err(e) = JobName::parse(name) {
        return reject(
            "",
            format!("'{target}' is not a task, attempt or job id: {e}"),
        );
    }
    if attempt.is_some() {
        return reject("", "a job target cannot carry an ':attempt' suffix".into());
    }
    if iris_store::jobs::job_state_of(conn, name)?.is_none() {
        return reject("", "job not found".into());
    }
    let tasks = iris_store::jobs::active_tasks(conn, name)?;
    if tasks.is_empty() {
        return reject(name, "job has no tasks running on a worker".into());
    }
    Ok(Kick::Tasks(tasks))
}
