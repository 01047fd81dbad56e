//! Read models: DB rows → the wire `JobStatus`, `TaskStatus` and worker views.

use crate::internal;
use iris_proto::cluster::controller as c;
use iris_proto::job;
use iris_proto::time::Timestamp;
use iris_rpc::RpcError;
use iris_store::rusqlite::{params, Connection, OptionalExtension, Row};
use iris_types::{JobState, TaskState};
use std::collections::{BTreeMap, HashMap};

fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(|epoch_ms| Timestamp { epoch_ms })
}

const JOB_COLS: &str =
    "j.job_id, j.state, j.error, j.started_at_ms, j.finished_at_ms, j.submitted_at_ms, j.name,
    j.parent_job_id, j.backend_id, j.cluster, j.num_tasks, j.submitting_user, c.request_blob";

fn job_from_row(r: &Row<'_>) -> iris_store::rusqlite::Result<job::JobStatus> {
    let blob: Vec<u8> = r.get(12)?;
    let resources = <iris_proto::cluster::controller::LaunchJobRequest as prost::Message>::decode(
        blob.as_slice(),
    )
    .ok()
    .and_then(|q| q.resources);
    Ok(job::JobStatus {
        job_id: r.get(0)?,
        state: r.get(1)?,
        error: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
        started_at: ts(r.get(3)?),
        finished_at: ts(r.get(4)?),
        submitted_at: ts(r.get(5)?),
        name: r.get(6)?,
        parent_job_id: r.get::<_, Option<String>>(7)?.unwrap_or_default(),
        backend_id: r.get::<_, Option<String>>(8)?.unwrap_or_default(),
        cluster: r.get(9)?,
        task_count: r.get(10)?,
        submitting_user: r.get(11)?,
        resources: Some(resources.unwrap_or_default()),
        ..Default::default()
    })
}

/// Fills counts and the pending reason.
fn finish_job(
    conn: &Connection,
    j: &mut job::JobStatus,
    reasons: &HashMap<String, String>,
) -> Result<(), RpcError> {
    let mut counts: BTreeMap<String, i32> = BTreeMap::new();
    let mut first_pending: Option<String> = None;
    let mut first_waiting: Option<String> = None;
    {
        let mut st = conn
            .prepare_cached(
                "SELECT task_id, state, status_message FROM tasks WHERE job_id = ?1 ORDER BY task_index",
            )
            .map_err(internal)?;
        let mut rows = st.query([&j.job_id]).map_err(internal)?;
        while let Some(r) = rows.next().map_err(internal)? {
            let tid: String = r.get(0).map_err(internal)?;
            let s =
                TaskState::from_code(r.get(1).map_err(internal)?).unwrap_or(TaskState::Unspecified);
            *counts.entry(s.friendly().to_string()).or_default() += 1;
            if s == TaskState::Pending && first_pending.is_none() {
                first_pending = Some(tid);
            } else if matches!(s, TaskState::Assigned | TaskState::Building)
                && first_waiting.is_none()
            {
                // A backend that places work itself (Kubernetes/Kueue) says why a started
                // attempt is not running yet.
                first_waiting = r
                    .get::<_, Option<String>>(2)
                    .map_err(internal)?
                    .filter(|m| !m.is_empty());
            }
        }
    }
    j.completed_count =
        counts.get("succeeded").copied().unwrap_or(0) + counts.get("killed").copied().unwrap_or(0);
    j.task_state_counts = counts;
    let (f, p): (i64, i64) = conn
        .prepare_cached(
            "SELECT COALESCE(SUM(a.state = 5), 0), COALESCE(SUM(a.state IN (6, 7, 10) AND a.started_at_ms IS NOT NULL), 0)
             FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id WHERE t.job_id = ?1",
        )
        .and_then(|mut s| s.query_row([&j.job_id], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(internal)?;
    j.failure_count = f as i32;
    j.preemption_count = p as i32;
    j.has_children = conn
        .prepare_cached("SELECT EXISTS(SELECT 1 FROM jobs WHERE parent_job_id = ?1)")
        .and_then(|mut s| s.query_row([&j.job_id], |r| r.get::<_, bool>(0)))
        .map_err(internal)?;
    let state = JobState::from_code(j.state).unwrap_or(JobState::Unspecified);
    j.pending_reason = if state.is_terminal() {
        j.error.clone()
    } else if let Some(t) = first_pending {
        reasons.get(&t).cloned().unwrap_or_default()
    } else {
        first_waiting.unwrap_or_default()
    };
    Ok(())
}

pub(crate) fn job_status(
    conn: &Connection,
    job_id: &str,
    reasons: &HashMap<String, String>,
) -> Result<Option<job::JobStatus>, RpcError> {
    let sql = format!("SELECT {JOB_COLS} FROM jobs j JOIN job_config c ON c.job_id = j.job_id WHERE j.job_id = ?1");
    let j = conn
        .prepare_cached(&sql)
        .and_then(|mut s| s.query_row([job_id], job_from_row).optional())
        .map_err(internal)?;
    let Some(mut j) = j else { return Ok(None) };
    finish_job(conn, &mut j, reasons)?;
    Ok(Some(j))
}

pub(crate) fn list_jobs(
    conn: &Connection,
    q: &c::JobQuery,
    state: Option<JobState>,
    limit: i32,
    reasons: &HashMap<String, String>,
) -> Result<c::ListJobsResponse, RpcError> {
    let mut where_ = vec!["1=1".to_string()];
    let mut args: Vec<iris_store::rusqlite::types::Value> = Vec::new();
    if let Some(s) = state {
        args.push((s.code() as i64).into());
        where_.push(format!("j.state = ?{}", args.len()));
    }
    if !q.job_id_prefix.is_empty() {
        args.push(q.job_id_prefix.clone().into());
        where_.push(format!(
            "substr(j.job_id, 1, length(?{0})) = ?{0}",
            args.len()
        ));
    }
    if !q.name_filter.is_empty() {
        args.push(q.name_filter.to_lowercase().into());
        where_.push(format!("instr(j.name, ?{}) > 0", args.len()));
    }
    if !q.parent_job_id.is_empty() {
        args.push(q.parent_job_id.clone().into());
        where_.push(format!("j.parent_job_id = ?{}", args.len()));
    }
    let w = where_.join(" AND ");
    let total: i64 = conn
        .query_row(
            &format!("SELECT count(*) FROM jobs j WHERE {w}"),
            iris_store::rusqlite::params_from_iter(args.iter()),
            |r| r.get(0),
        )
        .map_err(internal)?;
    // Ascending only when explicitly asked (SortDirection ASC = 1).
    let dir = if q.sort_direction == 1 { "ASC" } else { "DESC" };
    let sql = format!(
        "SELECT {JOB_COLS} FROM jobs j JOIN job_config c ON c.job_id = j.job_id WHERE {w}
         ORDER BY j.submitted_at_ms {dir}, j.job_id LIMIT {limit} OFFSET {}",
        q.offset.max(0)
    );
    let mut st = conn.prepare(&sql).map_err(internal)?;
    let rows = st
        .query_map(
            iris_store::rusqlite::params_from_iter(args.iter()),
            job_from_row,
        )
        .map_err(internal)?;
    let mut jobs: Vec<job::JobStatus> = rows.collect::<Result<_, _>>().map_err(internal)?;
    for j in &mut jobs {
        finish_job(conn, j, reasons)?;
    }
    let has_more = (q.offset as i64 + jobs.len() as i64) < total;
    Ok(c::ListJobsResponse {
        jobs,
        total_count: total as i32,
        has_more,
    })
}

fn attempts(conn: &Connection, task_id: &str) -> Result<Vec<job::TaskAttempt>, RpcError> {
    let mut st = conn
        .prepare_cached(
            "SELECT attempt_id, COALESCE(worker_id, node_name), state, exit_code, error, started_at_ms, finished_at_ms, attempt_uid
             FROM task_attempts WHERE task_id = ?1 ORDER BY attempt_id",
        )
        .map_err(internal)?;
    let rows = st
        .query_map([task_id], |r| {
            let state: i32 = r.get(2)?;
            Ok(job::TaskAttempt {
                attempt_id: r.get::<_, i64>(0)? as i32,
                worker_id: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                state,
                exit_code: r.get::<_, Option<i32>>(3)?.unwrap_or(0),
                error: r.get::<_, Option<String>>(4)?.unwrap_or_default(),
                started_at: ts(r.get(5)?),
                finished_at: ts(r.get(6)?),
                is_worker_failure: state == 7 || state == 10,
                attempt_uid: r.get(7)?,
                // The column holds the state machine's event reason (TaskFailed, TaskRetryScheduled,
                // …; `task_events` has them too). On the wire `terminal_reason` is a backend's own
                // failure cause (e.g. OOMKilled) and clients show it instead of `error`; our
                // process workers report none, so it stays empty and clients show the error.
                terminal_reason: String::new(),
                ..Default::default()
            })
        })
        .map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

const TASK_COLS: &str = "task_id, state, current_worker_id, current_worker_address, exit_code, error, current_attempt_id,
    submitted_at_ms, status_message, backend_id, cluster, container_id";

fn task_from_row(r: &Row<'_>) -> iris_store::rusqlite::Result<job::TaskStatus> {
    Ok(job::TaskStatus {
        task_id: r.get(0)?,
        state: r.get(1)?,
        worker_id: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
        worker_address: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
        exit_code: r.get::<_, Option<i32>>(4)?.unwrap_or(0),
        error: r.get::<_, Option<String>>(5)?.unwrap_or_default(),
        current_attempt_id: r.get::<_, i64>(6)? as i32,
        submitted_at: ts(r.get(7)?),
        status_message: r.get::<_, Option<String>>(8)?.unwrap_or_default(),
        backend_id: r.get::<_, Option<String>>(9)?.unwrap_or_default(),
        cluster: r.get(10)?,
        container_id: r.get::<_, Option<String>>(11)?.unwrap_or_default(),
        ..Default::default()
    })
}

fn finish_task(
    conn: &Connection,
    t: &mut job::TaskStatus,
    full: bool,
    reasons: &HashMap<String, String>,
) -> Result<(), RpcError> {
    let all = attempts(conn, &t.task_id)?;
    if let Some(cur) = all.iter().find(|a| a.attempt_id == t.current_attempt_id) {
        t.started_at = cur.started_at;
        t.finished_at = cur.finished_at;
        if t.worker_id.is_empty() {
            t.worker_id = cur.worker_id.clone();
        }
    }
    let state = TaskState::from_code(t.state).unwrap_or(TaskState::Unspecified);
    if state == TaskState::Pending {
        t.can_be_scheduled = true;
        t.pending_reason = match all.last() {
            Some(last)
                if last.state != 1
                    && TaskState::from_code(last.state)
                        .map(|s| s.is_terminal())
                        .unwrap_or(false) =>
            {
                let base = format!(
                    "Retrying (attempt {}, last: {})",
                    last.attempt_id + 1,
                    TaskState::from_code(last.state)
                        .map(|s| format!("task_state_{}", s.friendly()))
                        .unwrap_or_default()
                );
                match reasons.get(&t.task_id) {
                    Some(r) => format!("{base}; {r}"),
                    None => base,
                }
            }
            _ => reasons.get(&t.task_id).cloned().unwrap_or_default(),
        };
    }
    t.attempts = if full {
        all
    } else {
        let cur = t.current_attempt_id;
        let last_fail = all
            .iter()
            .rev()
            .find(|a| a.state == 5 || a.state == 7)
            .map(|a| a.attempt_id);
        all.into_iter()
            .filter(|a| a.attempt_id == cur || Some(a.attempt_id) == last_fail)
            .collect()
    };
    Ok(())
}

pub(crate) fn task_status(
    conn: &Connection,
    task_id: &str,
    full: bool,
    reasons: &HashMap<String, String>,
) -> Result<Option<job::TaskStatus>, RpcError> {
    let t = conn
        .prepare_cached(&format!("SELECT {TASK_COLS} FROM tasks WHERE task_id = ?1"))
        .and_then(|mut s| s.query_row([task_id], task_from_row).optional())
        .map_err(internal)?;
    let Some(mut t) = t else { return Ok(None) };
    finish_task(conn, &mut t, full, reasons)?;
    Ok(Some(t))
}

pub(crate) fn tasks_of_job(
    conn: &Connection,
    job_id: &str,
    reasons: &HashMap<String, String>,
) -> Result<Vec<job::TaskStatus>, RpcError> {
    let mut st = conn
        .prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE job_id = ?1 ORDER BY task_index"
        ))
        .map_err(internal)?;
    let rows = st.query_map([job_id], task_from_row).map_err(internal)?;
    let mut tasks: Vec<job::TaskStatus> = rows.collect::<Result<_, _>>().map_err(internal)?;
    for t in &mut tasks {
        finish_task(conn, t, false, reasons)?;
    }
    Ok(tasks)
}

pub(crate) fn workers(conn: &Connection) -> Result<Vec<c::WorkerHealthStatus>, RpcError> {
    let mut st = conn
        .prepare("SELECT worker_id, address, healthy, last_heartbeat_ms, metadata_blob, scale_group FROM workers ORDER BY worker_id")
        .map_err(internal)?;
    let rows = st
        .query_map([], |r| {
            let blob: Option<Vec<u8>> = r.get(4)?;
            Ok(c::WorkerHealthStatus {
                worker_id: r.get(0)?,
                address: r.get(1)?,
                healthy: r.get::<_, i64>(2)? != 0,
                last_heartbeat: ts(r.get(3)?),
                metadata: blob.and_then(|b| {
                    <job::WorkerMetadata as prost::Message>::decode(b.as_slice()).ok()
                }),
                scale_group: r.get::<_, Option<String>>(5)?.unwrap_or_default(),
                backend_id: "default".into(),
                ..Default::default()
            })
        })
        .map_err(internal)?;
    let mut out: Vec<c::WorkerHealthStatus> = rows.collect::<Result<_, _>>().map_err(internal)?;
    for w in &mut out {
        let mut st = conn
            .prepare_cached(
                "SELECT DISTINCT t.job_id FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
                 WHERE a.worker_id = ?1 AND a.finished_at_ms IS NULL",
            )
            .map_err(internal)?;
        let rows = st
            .query_map(params![w.worker_id], |r| r.get(0))
            .map_err(internal)?;
        w.running_job_ids = rows.collect::<Result<_, _>>().map_err(internal)?;
    }
    Ok(out)
}

/// SQL for one task's budget value: 1000·accelerators (GPU + TPU) + whole GiB + 5·whole cores.
const TASK_VALUE_SQL: &str = "1000 * (COALESCE(json_extract(c.res_device_json, '$.gpu.count'), 0)
        + COALESCE(json_extract(c.res_device_json, '$.tpu.count'), 0))
    + c.res_memory_bytes / 1073741824 + 5 * (c.res_cpu_millicores / 1000)";

/// Spend = Σ over active (assigned, building, running) tasks of non-BATCH jobs of the task
/// value (§4.7). BATCH is judged by the job's requested band.
pub(crate) fn user_spend(conn: &Connection, user: &str) -> Result<i64, RpcError> {
    conn.query_row(
        &format!(
            "SELECT COALESCE(SUM({TASK_VALUE_SQL}), 0)
             FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN job_config c ON c.job_id = t.job_id
             WHERE j.user_id = ?1 AND t.state IN (2, 3, 9) AND c.priority_band != 3"
        ),
        [user],
        |r| r.get(0),
    )
    .map_err(internal)
}

/// [`user_spend`] for every user with active non-BATCH tasks.
pub(crate) fn spend_by_user(conn: &Connection) -> Result<BTreeMap<String, i64>, RpcError> {
    let mut st = conn
        .prepare_cached(&format!(
            "SELECT j.user_id, SUM({TASK_VALUE_SQL})
             FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN job_config c ON c.job_id = t.job_id
             WHERE t.state IN (2, 3, 9) AND c.priority_band != 3
             GROUP BY j.user_id"
        ))
        .map_err(internal)?;
    let rows = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

/// Configured budgets `(user, limit, max_band)`, ordered by user.
pub(crate) fn user_budgets(conn: &Connection) -> Result<Vec<(String, i64, i32)>, RpcError> {
    let mut st = conn
        .prepare_cached("SELECT user_id, budget_limit, max_band FROM user_budgets ORDER BY user_id")
        .map_err(internal)?;
    let rows = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

/// Per-user workload counts for `ListUsers`: every user with a job or a budget row, with counts
/// of their active (pending, building, running) jobs by state and of those jobs' tasks by state.
pub(crate) struct UserCounts {
    pub user: String,
    pub jobs: BTreeMap<i32, i32>,
    pub tasks: BTreeMap<i32, i32>,
}

pub(crate) fn user_counts(conn: &Connection) -> Result<Vec<UserCounts>, RpcError> {
    let mut by_user: BTreeMap<String, UserCounts> = BTreeMap::new();
    fn entry(by_user: &mut BTreeMap<String, UserCounts>, u: String) -> &mut UserCounts {
        by_user.entry(u.clone()).or_insert_with(|| UserCounts {
            user: u,
            jobs: BTreeMap::new(),
            tasks: BTreeMap::new(),
        })
    }
    let users: Vec<String> = {
        let mut st = conn
            .prepare_cached(
                "SELECT DISTINCT user_id FROM jobs UNION SELECT user_id FROM user_budgets",
            )
            .map_err(internal)?;
        let rows = st.query_map([], |r| r.get(0)).map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for u in users {
        entry(&mut by_user, u);
    }
    let jobs: Vec<(String, i32, i32)> = {
        let mut st = conn
            .prepare_cached("SELECT user_id, state, count(*) FROM jobs WHERE state IN (1, 2, 3) GROUP BY user_id, state")
            .map_err(internal)?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for (u, state, n) in jobs {
        entry(&mut by_user, u).jobs.insert(state, n);
    }
    let tasks: Vec<(String, i32, i32)> = {
        let mut st = conn
            .prepare_cached(
                "SELECT j.user_id, t.state, count(*) FROM tasks t JOIN jobs j ON j.job_id = t.job_id
                 WHERE j.state IN (1, 2, 3) GROUP BY j.user_id, t.state",
            )
            .map_err(internal)?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    for (u, state, n) in tasks {
        entry(&mut by_user, u).tasks.insert(state, n);
    }
    Ok(by_user.into_values().collect())
}

/// A PENDING task for `GetSchedulerState`: `(user, job, requested band, backend)`.
pub(crate) type PendingRow = (String, String, i32, String);
/// A RUNNING task for `GetSchedulerState`: `(user, job, band it runs at, worker, backend)`.
pub(crate) type RunningRow = (String, String, i32, String, String);

/// Every PENDING task, by job and index.
pub(crate) fn pending_tasks(conn: &Connection) -> Result<Vec<PendingRow>, RpcError> {
    let mut st = conn
        .prepare_cached(
            "SELECT j.user_id, t.job_id, c.priority_band, COALESCE(t.backend_id, '')
             FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN job_config c ON c.job_id = t.job_id
             WHERE t.state = 1 ORDER BY t.job_id, t.task_index",
        )
        .map_err(internal)?;
    let rows = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

/// Every RUNNING task on a worker, by job and index.
pub(crate) fn running_tasks(conn: &Connection) -> Result<Vec<RunningRow>, RpcError> {
    let mut st = conn
        .prepare_cached(
            "SELECT j.user_id, t.job_id, t.priority_band, t.current_worker_id, COALESCE(t.backend_id, '')
             FROM tasks t JOIN jobs j ON j.job_id = t.job_id
             WHERE t.state = 3 AND t.current_worker_id IS NOT NULL ORDER BY t.job_id, t.task_index",
        )
        .map_err(internal)?;
    let rows = st
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}
