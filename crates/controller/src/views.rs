//! Read models: the store's rows → the wire `JobStatus`, `TaskStatus` and worker views.

use crate::error::Result;
use iris_proto::cluster::controller as c;
use iris_proto::job;
use iris_proto::time::Timestamp;
use iris_store::views::{AttemptRow, JobFilter, JobRow, TaskRow};
use iris_store::Read;
use iris_types::{JobState, TaskState};
use std::collections::{BTreeMap, HashMap};

/// Why each pending task waits, as the last tick left it: per task for the tasks that entered
/// the cycle, per job for the tasks the per-job cap held back (`Plan::capped_jobs`: one entry
/// per job, so a tick over a million pending tasks does not build a million reasons).
#[derive(Clone, Debug, Default)]
pub(crate) struct PendingReasons {
    pub(crate) by_task: HashMap<String, String>,
    pub(crate) capped_jobs: HashMap<String, String>,
}

impl PendingReasons {
    /// The reason of pending task `task_id`: its own, else its job's cap reason.
    pub(crate) fn get(&self, task_id: &str) -> Option<&String> {
        self.by_task.get(task_id).or_else(|| {
            let (job, _) = task_id.rsplit_once('/')?;
            self.capped_jobs.get(job)
        })
    }

    /// Just `task_id`'s reason (the explain RPC's view of one task).
    pub(crate) fn only(&self, task_id: &str) -> PendingReasons {
        PendingReasons {
            by_task: self
                .get(task_id)
                .map(|r| (task_id.to_string(), r.clone()))
                .into_iter()
                .collect(),
            capped_jobs: HashMap::new(),
        }
    }
}

fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(|epoch_ms| Timestamp {
        epoch_ms: Some(epoch_ms),
    })
}

/// The wire `ResourceSpecProto` of a stored request: `device` is always present (an empty
/// message for a CPU job), as the published controller sends it.
fn request_resources(request_blob: &[u8]) -> Option<job::ResourceSpecProto> {
    let mut r = <c::LaunchJobRequest as prost::Message>::decode(request_blob)
        .ok()?
        .resources?;
    r.device.get_or_insert_with(Default::default);
    Some(r)
}

/// A stored request as `GetJobStatus` echoes it: what the published controller rebuilds from
/// its job columns, so every scalar it stores is present (zeros too); the submitting hop's
/// `client_revision_date` is not kept; secrets are redacted.
pub(crate) fn wire_request(mut r: c::LaunchJobRequest) -> c::LaunchJobRequest {
    r.client_revision_date = None;
    r.bundle_blob = None;
    r.name.get_or_insert_with(String::new);
    r.bundle_id.get_or_insert_with(String::new);
    r.task_image.get_or_insert_with(String::new);
    r.max_task_failures.get_or_insert(0);
    r.max_retries_failure.get_or_insert(0);
    r.max_retries_preemption.get_or_insert(0);
    r.replicas.get_or_insert(1);
    r.preemption_policy.get_or_insert(0);
    r.existing_job_policy.get_or_insert(0);
    r.priority_band.get_or_insert(0);
    r.container_profile.get_or_insert(0);
    r.egress_policy.get_or_insert(0);
    r.fail_if_exists.get_or_insert(false);
    r.resources
        .get_or_insert_with(Default::default)
        .device
        .get_or_insert_with(Default::default);
    if let Some(env) = r.environment.as_mut() {
        for v in env.secrets.values_mut() {
            *v = "<redacted>".into();
        }
    }
    r
}

/// A job's wire status. `with_resources`: `GetJobStatus` carries the job's resources, a
/// `ListJobs` row does not (as in the published controller; it also spares decoding every
/// stored request of a page).
fn job_status(j: JobRow, reasons: &PendingReasons, with_resources: bool) -> job::JobStatus {
    let resources = if with_resources {
        Some(request_resources(&j.request_blob).unwrap_or_default())
    } else {
        None
    };
    // The published controller never sends it; we do when someone other than the owner (the
    // first component of the job id) submitted the job, e.g. a federated handoff's principal,
    // and that someone is not the local admin of an unauthenticated cluster.
    let owner = j.job_id.split('/').nth(1).unwrap_or_default();
    let submitting_user = (!j.submitting_user.is_empty()
        && j.submitting_user != owner
        && j.submitting_user != iris_federation::LOCAL_ADMIN)
        .then(|| j.submitting_user.clone());
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
        job_id: Some(j.job_id),
        state: Some(j.state),
        error: Some(error),
        started_at: ts(j.started_at_ms),
        finished_at: ts(j.finished_at_ms),
        submitted_at: ts(Some(j.submitted_at_ms)),
        name: Some(j.name),
        parent_job_id: Some(j.parent_job_id.unwrap_or_default()),
        backend_id: Some(j.backend_id.unwrap_or_default()),
        cluster: Some(j.cluster),
        task_count: Some(j.num_tasks),
        submitting_user,
        resources,
        completed_count: Some(count(TaskState::Succeeded) + count(TaskState::Killed)),
        task_state_counts: counts,
        failure_count: Some(j.failure_count),
        preemption_count: Some(j.preemption_count),
        has_children: Some(j.has_children),
        pending_reason: Some(pending_reason),
        // Our jobs carry no exit code of their own (their tasks do); a federated job's
        // peer status is filled in by the federation decorator.
        exit_code: Some(0),
        peer_status: Some(job::PeerStatus::None as i32),
        ..Default::default()
    }
}

/// One job's status, if it exists.
pub(crate) fn job(
    conn: &impl Read,
    job_id: &str,
    reasons: &PendingReasons,
) -> Result<Option<job::JobStatus>> {
    Ok(iris_store::views::job(conn, job_id)?.map(|j| job_status(j, reasons, true)))
}

/// A page of `ListJobs`.
/// A page of `ListJobs`; `keyset` when the query asked for page tokens.
pub(crate) fn list_jobs(
    conn: &impl Read,
    filter: &JobFilter,
    reasons: &PendingReasons,
    keyset: bool,
) -> Result<c::ListJobsResponse> {
    let page = iris_store::views::list_jobs(conn, filter)?;
    let next_page_token = match (keyset, page.has_more, page.jobs.last()) {
        (true, true, Some(last)) => Some(page_token(last.submitted_at_ms, &last.job_id)),
        _ => None,
    };
    let jobs: Vec<job::JobStatus> = page
        .jobs
        .into_iter()
        .map(|j| job_status(j, reasons, false))
        .collect();
    Ok(c::ListJobsResponse {
        jobs,
        total_count: Some(page.total as i32),
        has_more: Some(page.has_more),
        next_page_token,
        total_count_is_lower_bound: page.total_is_lower_bound.then_some(true),
    })
}

/// A keyset page token: where the listing continues (the last job's submission time and id).
pub(crate) fn page_token(submitted_at_ms: i64, job_id: &str) -> String {
    format!("{submitted_at_ms}:{job_id}")
}

/// The position a [`page_token`] names; `None` for anything this controller did not issue.
pub(crate) fn parse_page_token(token: &str) -> Option<(i64, String)> {
    let (ms, id) = token.split_once(':')?;
    let ms: i64 = ms.parse().ok()?;
    id.starts_with('/').then(|| (ms, id.to_string()))
}

pub(crate) fn attempt(a: &AttemptRow) -> job::TaskAttempt {
    job::TaskAttempt {
        attempt_id: Some(a.attempt_id as i32),
        worker_id: Some(a.worker_id.clone().unwrap_or_default()),
        state: Some(a.state.code()),
        exit_code: Some(a.exit_code.unwrap_or(0)),
        error: Some(a.error.clone().unwrap_or_default()),
        started_at: ts(a.started_at_ms),
        finished_at: ts(a.finished_at_ms),
        is_worker_failure: Some(matches!(
            a.state,
            TaskState::WorkerFailed | TaskState::Preempted
        )),
        attempt_uid: Some(a.attempt_uid.clone()),
        // The column holds the state machine's event reason (TaskFailed, TaskRetryScheduled,
        // …; `task_events` has them too). On the wire `terminal_reason` is a backend's own
        // failure cause (e.g. OOMKilled) and clients show it instead of `error`; our process
        // workers report none, so it stays empty and clients show the error.
        terminal_reason: Some(String::new()),
        // Kubernetes names; a process worker's attempt has none.
        node_name: Some(String::new()),
        pod_name: Some(String::new()),
        pod_uid: Some(String::new()),
        // A finished attempt's output archive: we keep no archives of task outputs, so it is
        // always EMPTY with nothing skipped.
        output_archive: a.state.is_terminal().then(|| job::TaskOutputArchive {
            state: Some(job::task_output_archive::State::TaskOutputArchiveStateEmpty as i32),
            skipped_count: Some(0),
            ..Default::default()
        }),
    }
}

/// A task's status; `full`: every attempt, else the current one and the last failed one.
fn task_status(t: TaskRow, full: bool, reasons: &PendingReasons) -> job::TaskStatus {
    let mut out = job::TaskStatus {
        task_id: Some(t.task_id),
        state: Some(t.state),
        worker_id: Some(t.worker_id.unwrap_or_default()),
        worker_address: Some(t.worker_address.unwrap_or_default()),
        exit_code: Some(t.exit_code.unwrap_or(0)),
        error: Some(t.error.unwrap_or_default()),
        current_attempt_id: Some(t.current_attempt_id as i32),
        submitted_at: ts(t.submitted_at_ms),
        status_message: t.status_message.filter(|m| !m.is_empty()),
        backend_id: Some(t.backend_id.unwrap_or_default()),
        cluster: Some(t.cluster),
        container_id: t.container_id.filter(|c| !c.is_empty()),
        ..Default::default()
    };
    if let Some(cur) = t
        .attempts
        .iter()
        .find(|a| a.attempt_id == t.current_attempt_id)
    {
        out.started_at = ts(cur.started_at_ms);
        out.finished_at = ts(cur.finished_at_ms);
        if out.worker_id().is_empty() {
            out.worker_id = Some(cur.worker_id.clone().unwrap_or_default());
        }
    }
    if TaskState::from_code(out.state.unwrap_or_default()) == Some(TaskState::Pending) {
        out.can_be_scheduled = Some(true);
        let reason = reasons.get(out.task_id()).cloned();
        out.pending_reason = match t.attempts.last() {
            Some(last) if last.state.is_terminal() => {
                let base = format!(
                    "Retrying (attempt {}, last: task_state_{})",
                    last.attempt_id + 1,
                    last.state.friendly()
                );
                match reason {
                    Some(r) => Some(format!("{base}; {r}")),
                    None => Some(base),
                }
            }
            _ => Some(reason.unwrap_or_default()),
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
    reasons: &PendingReasons,
) -> Result<Option<job::TaskStatus>> {
    Ok(iris_store::views::task(conn, task_id)?.map(|t| task_status(t, true, reasons)))
}

/// A job's tasks, each with its current and last failed attempt.
pub(crate) fn tasks_of_job(
    conn: &impl Read,
    job_id: &str,
    reasons: &PendingReasons,
) -> Result<Vec<job::TaskStatus>> {
    Ok(iris_store::views::tasks_of_job(conn, job_id)?
        .into_iter()
        .map(|t| task_status(t, false, reasons))
        .collect())
}

/// A worker's registered metadata as the published controller sends it back, rebuilt from
/// its columns: every scalar present, zeros too (a worker registering without some of them,
/// e.g. an older one, reads the same as one that sent zeros).
fn wire_metadata(mut md: job::WorkerMetadata) -> job::WorkerMetadata {
    for s in [
        &mut md.hostname,
        &mut md.ip_address,
        &mut md.tpu_name,
        &mut md.tpu_worker_hostnames,
        &mut md.tpu_worker_id,
        &mut md.tpu_chips_per_host_bounds,
        &mut md.gpu_name,
        &mut md.gce_instance_name,
        &mut md.gce_zone,
    ] {
        s.get_or_insert_with(String::new);
    }
    md.cpu_count.get_or_insert(0);
    md.memory_bytes.get_or_insert(0);
    md.disk_bytes.get_or_insert(0);
    md.gpu_count.get_or_insert(0);
    md.gpu_memory_mb.get_or_insert(0);
    md
}

/// `ListWorkers`.
pub(crate) fn workers(conn: &impl Read) -> Result<Vec<c::WorkerHealthStatus>> {
    Ok(iris_store::workers::list(conn)?
        .into_iter()
        .map(|w| c::WorkerHealthStatus {
            worker_id: Some(w.worker_id),
            address: Some(w.address),
            healthy: Some(w.healthy),
            last_heartbeat: ts(w.last_heartbeat_ms),
            metadata: w
                .metadata_blob
                .and_then(|b| <job::WorkerMetadata as prost::Message>::decode(b.as_slice()).ok())
                .map(wire_metadata),
            scale_group: Some(w.scale_group),
            backend_id: Some("default".into()),
            running_job_ids: w.running_task_ids,
            // We count no failed pings: a worker is dead once its heartbeats lapse.
            consecutive_failures: Some(0),
            status_message: Some(String::new()),
        })
        .collect())
}
