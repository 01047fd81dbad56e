//! Read models: the store's rows → the wire `JobStatus`, `TaskStatus` and worker views.

use crate::error::Result;
use iris_proto::cluster::controller as c;
use iris_proto::job;
use iris_proto::time::Timestamp;
use iris_store::views::{AttemptRow, JobFilter, JobRow, TaskRow};
use iris_store::Read;
use iris_types::{JobState, TaskState};
use std::collections::{BTreeMap, HashMap};

fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(|epoch_ms| Timestamp { epoch_ms })
}

fn job_status(j: JobRow, reasons: &HashMap<String, String>) -> job::JobStatus {
    let resources = <c::LaunchJobRequest as prost::Message>::decode(j.request_blob.as_slice())
        .ok()
        .and_then(|q| q.resources);
    let counts: BTreeMap<String, i32> = j
        .task_counts
        .iter()
        .map(|(s, n)| (s.friendly().to_string(), *n))
        .collect();
    let count = |s: TaskState| j.task_counts.get(&s).copied().unwrap_or(0);
    let state = JobState::from_code(j.state).unwrap_or(JobState::Unspecified);
    let error = j.error.unwrap_or_default();
    let pending_reason = if state.is_terminal() {
        error.clone()
    } else if let Some(t) = &j.first_pending_task {
        reasons.get(t).cloned().unwrap_or_default()
    } else {
        // A backend that places work itself (Kubernetes/Kueue) says why a started attempt is
        // not running yet.
        j.first_waiting_message.unwrap_or_default()
    };
    job::JobStatus {
        job_id: j.job_id,
        state: j.state,
        error,
        started_at: ts(j.started_at_ms),
        finished_at: ts(j.finished_at_ms),
        submitted_at: ts(Some(j.submitted_at_ms)),
        name: j.name,
        parent_job_id: j.parent_job_id.unwrap_or_default(),
        backend_id: j.backend_id.unwrap_or_default(),
        cluster: j.cluster,
        task_count: j.num_tasks,
        submitting_user: j.submitting_user,
        resources: Some(resources.unwrap_or_default()),
        completed_count: count(TaskState::Succeeded) + count(TaskState::Killed),
        task_state_counts: counts,
        failure_count: j.failure_count,
        preemption_count: j.preemption_count,
        has_children: j.has_children,
        pending_reason,
        ..Default::default()
    }
}

/// One job's status, if it exists.
pub(crate) fn job(
    conn: &impl Read,
    job_id: &str,
    reasons: &HashMap<String, String>,
) -> Result<Option<job::JobStatus>> {
    Ok(iris_store::views::job(conn, job_id)?.map(|j| job_status(j, reasons)))
}

/// A page of `ListJobs`.
pub(crate) fn list_jobs(
    conn: &impl Read,
    filter: &JobFilter,
    reasons: &HashMap<String, String>,
) -> Result<c::ListJobsResponse> {
    let (rows, total) = iris_store::views::list_jobs(conn, filter)?;
    let jobs: Vec<job::JobStatus> = rows.into_iter().map(|j| job_status(j, reasons)).collect();
    let has_more = (filter.offset as i64 + jobs.len() as i64) < total;
    Ok(c::ListJobsResponse {
        jobs,
        total_count: total as i32,
        has_more,
    })
}

fn attempt(a: &AttemptRow) -> job::TaskAttempt {
    job::TaskAttempt {
        attempt_id: a.attempt_id as i32,
        worker_id: a.worker_id.clone().unwrap_or_default(),
        state: a.state.code(),
        exit_code: a.exit_code.unwrap_or(0),
        error: a.error.clone().unwrap_or_default(),
        started_at: ts(a.started_at_ms),
        finished_at: ts(a.finished_at_ms),
        is_worker_failure: matches!(a.state, TaskState::WorkerFailed | TaskState::Preempted),
        attempt_uid: a.attempt_uid.clone(),
        // The column holds the state machine's event reason (TaskFailed, TaskRetryScheduled,
        // …; `task_events` has them too). On the wire `terminal_reason` is a backend's own
        // failure cause (e.g. OOMKilled) and clients show it instead of `error`; our process
        // workers report none, so it stays empty and clients show the error.
        terminal_reason: String::new(),
        ..Default::default()
    }
}

/// A task's status; `full`: every attempt, else the current one and the last failed one.
fn task_status(t: TaskRow, full: bool, reasons: &HashMap<String, String>) -> job::TaskStatus {
    let mut out = job::TaskStatus {
        task_id: t.task_id,
        state: t.state,
        worker_id: t.worker_id.unwrap_or_default(),
        worker_address: t.worker_address.unwrap_or_default(),
        exit_code: t.exit_code.unwrap_or(0),
        error: t.error.unwrap_or_default(),
        current_attempt_id: t.current_attempt_id as i32,
        submitted_at: ts(t.submitted_at_ms),
        status_message: t.status_message.unwrap_or_default(),
        backend_id: t.backend_id.unwrap_or_default(),
        cluster: t.cluster,
        container_id: t.container_id.unwrap_or_default(),
        ..Default::default()
    };
    if let Some(cur) = t
        .attempts
        .iter()
        .find(|a| a.attempt_id == t.current_attempt_id)
    {
        out.started_at = ts(cur.started_at_ms);
        out.finished_at = ts(cur.finished_at_ms);
        if out.worker_id.is_empty() {
            out.worker_id = cur.worker_id.clone().unwrap_or_default();
        }
    }
    if TaskState::from_code(out.state) == Some(TaskState::Pending) {
        out.can_be_scheduled = true;
        let reason = reasons.get(&out.task_id).cloned();
        out.pending_reason = match t.attempts.last() {
            Some(last) if last.state.is_terminal() => {
                let base = format!(
                    "Retrying (attempt {}, last: task_state_{})",
                    last.attempt_id + 1,
                    last.state.friendly()
                );
                match reason {
                    Some(r) => format!("{base}; {r}"),
                    None => base,
                }
            }
            _ => reason.unwrap_or_default(),
        };
    }
    let cur = t.current_attempt_id;
    let last_fail = t
        .attempts
        .iter()
        .rev()
        .find(|a| matches!(a.state, TaskState::Failed | TaskState::WorkerFailed))
        .map(|a| a.attempt_id);
    out.attempts = t
        .attempts
        .iter()
        .filter(|a| full || a.attempt_id == cur || Some(a.attempt_id) == last_fail)
        .map(attempt)
        .collect();
    out
}

/// One task with every attempt.
pub(crate) fn task(
    conn: &impl Read,
    task_id: &str,
    reasons: &HashMap<String, String>,
) -> Result<Option<job::TaskStatus>> {
    Ok(iris_store::views::task(conn, task_id)?.map(|t| task_status(t, true, reasons)))
}

/// A job's tasks, each with its current and last failed attempt.
pub(crate) fn tasks_of_job(
    conn: &impl Read,
    job_id: &str,
    reasons: &HashMap<String, String>,
) -> Result<Vec<job::TaskStatus>> {
    Ok(iris_store::views::tasks_of_job(conn, job_id)?
        .into_iter()
        .map(|t| task_status(t, false, reasons))
        .collect())
}

/// `ListWorkers`.
pub(crate) fn workers(conn: &impl Read) -> Result<Vec<c::WorkerHealthStatus>> {
    Ok(iris_store::workers::list(conn)?
        .into_iter()
        .map(|w| c::WorkerHealthStatus {
            worker_id: w.worker_id,
            address: w.address,
            healthy: w.healthy,
            last_heartbeat: ts(w.last_heartbeat_ms),
            metadata: w
                .metadata_blob
                .and_then(|b| <job::WorkerMetadata as prost::Message>::decode(b.as_slice()).ok()),
            scale_group: w.scale_group,
            backend_id: "default".into(),
            running_job_ids: w.running_job_ids,
            ..Default::default()
        })
        .collect())
}
