//! Reads about jobs and tasks that the admission and RPC paths need.

use crate::sets::TASK_ACTIVE;
use crate::{Read, Result};
use iris_types::{JobState, TaskState};
use rusqlite::OptionalExtension;
use std::sync::LazyLock;

/// The state of a job, if it exists.
pub fn job_state_of(c: &impl Read, job_id: &str) -> Result<Option<JobState>> {
    let s: Option<i32> = c
        .raw()
        .prepare_cached("SELECT state FROM jobs WHERE job_id = ?1")?
        .query_row([job_id], |r| r.get(0))
        .optional()?;
    Ok(s.and_then(JobState::from_code))
}

/// A job's state and band (`None`: no such job).
pub fn state_and_band(c: &impl Read, job_id: &str) -> Result<Option<(JobState, i32)>> {
    let row: Option<(i32, i32)> = c
        .raw()
        .prepare_cached(
            "SELECT j.state, c.priority_band FROM jobs j JOIN job_config c ON c.job_id = j.job_id WHERE j.job_id = ?1",
        )?
        .query_row([job_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(row.map(|(s, b)| (JobState::from_code(s).unwrap_or(JobState::Unspecified), b)))
}

/// What the controller caches about a job to schedule and dispatch it.
#[derive(Clone, Debug)]
pub struct SpecRow {
    /// The stored `LaunchJobRequest` (binary protobuf, bundle bytes removed).
    pub request_blob: Vec<u8>,
    pub band: i32,
    pub user: String,
    pub depth: i64,
}

/// A job's stored request and the columns its spec needs.
pub fn spec_row(c: &impl Read, job_id: &str) -> Result<Option<SpecRow>> {
    Ok(c
        .raw()
        .prepare_cached(
            "SELECT c.request_blob, c.priority_band, j.user_id, j.depth FROM job_config c JOIN jobs j ON j.job_id = c.job_id WHERE c.job_id = ?1",
        )?
        .query_row([job_id], |r| {
            Ok(SpecRow {
                request_blob: r.get(0)?,
                band: r.get(1)?,
                user: r.get(2)?,
                depth: r.get(3)?,
            })
        })
        .optional()?)
}

/// A job's secrets (name, value), by name.
pub fn secrets(c: &impl Read, job_id: &str) -> Result<Vec<(String, String)>> {
    let mut st = c
        .raw()
        .prepare_cached("SELECT name, value FROM job_secrets WHERE job_id = ?1 ORDER BY name")?;
    let rows = st.query_map([job_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// A task's state and current attempt number.
pub fn task_state(c: &impl Read, task_id: &str) -> Result<Option<(TaskState, i64)>> {
    let row: Option<(i32, i64)> = c
        .raw()
        .prepare_cached("SELECT state, current_attempt_id FROM tasks WHERE task_id = ?1")?
        .query_row([task_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(row.map(|(s, a)| (TaskState::from_code(s).unwrap_or(TaskState::Unspecified), a)))
}

static ACTIVE_TASKS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT task_id FROM tasks WHERE job_id = ?1 AND state IN {} ORDER BY task_index",
        *TASK_ACTIVE
    )
});

/// A job's tasks that hold a worker (assigned, building, running), by index.
pub fn active_tasks(c: &impl Read, job_id: &str) -> Result<Vec<String>> {
    let mut st = c.raw().prepare_cached(&ACTIVE_TASKS)?;
    let rows = st.query_map([job_id], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Whether the job has any task rows (a federated job's tasks appear once mirrored).
pub fn has_tasks(c: &impl Read, job_id: &str) -> Result<bool> {
    Ok(c.raw()
        .prepare_cached("SELECT EXISTS(SELECT 1 FROM tasks WHERE job_id = ?1)")?
        .query_row([job_id], |r| r.get(0))?)
}

/// One root job's waiting and running tasks now (`iris.task_state`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskStateRollup {
    pub root_job_id: String,
    pub pending: i64,
    pub assigned: i64,
    pub building: i64,
    pub running: i64,
    /// When the oldest pending task last became pending (submitted, or its last attempt ended).
    pub oldest_pending_since_ms: Option<i64>,
    /// When the oldest assigned-or-building task's current attempt was created.
    pub oldest_building_since_ms: Option<i64>,
}

/// Every root job with a pending, assigned, building or running task, with their counts.
pub fn task_state_rollup(db: &impl Read) -> Result<Vec<TaskStateRollup>> {
    use iris_types::TaskState as S;
    let (p, a, b, r) = (
        S::Pending.code(),
        S::Assigned.code(),
        S::Building.code(),
        S::Running.code(),
    );
    // Counted per job first and only then per root, so that a task costs no lookup of its job;
    // an attempt is looked up only for a task whose age reads it (a pending task that ran
    // before, an assigned or building one), not for the running tasks and never-run pending
    // tasks that are most of a busy cluster (a million tasks read every 10 s at C1M shape).
    let sql = format!(
        "WITH per_job AS (
             SELECT t.job_id AS job_id,
                    sum(t.state = {p}) AS pending, sum(t.state = {a}) AS assigned,
                    sum(t.state = {b}) AS building, sum(t.state = {r}) AS running,
                    min(CASE WHEN t.state = {p} THEN
                        CASE WHEN t.current_attempt_id < 0 THEN t.submitted_at_ms
                             ELSE coalesce((SELECT at.finished_at_ms FROM task_attempts at
                                            WHERE at.task_id = t.task_id
                                              AND at.attempt_id = t.current_attempt_id),
                                           t.submitted_at_ms) END END) AS pending_since,
                    min(CASE WHEN t.state IN ({a}, {b}) THEN
                        (SELECT at.created_at_ms FROM task_attempts at
                         WHERE at.task_id = t.task_id AND at.attempt_id = t.current_attempt_id)
                        END) AS building_since
             FROM tasks t WHERE t.state IN ({p}, {a}, {b}, {r}) GROUP BY t.job_id)
         SELECT j.root_job_id, sum(pending), sum(assigned), sum(building), sum(running),
                min(pending_since), min(building_since)
         FROM per_job JOIN jobs j ON j.job_id = per_job.job_id
         GROUP BY j.root_job_id ORDER BY j.root_job_id"
    );
    let rows = db
        .raw()
        .prepare_cached(&sql)?
        .query_map([], |row| {
            Ok(TaskStateRollup {
                root_job_id: row.get(0)?,
                pending: row.get(1)?,
                assigned: row.get(2)?,
                building: row.get(3)?,
                running: row.get(4)?,
                oldest_pending_since_ms: row.get(5)?,
                oldest_building_since_ms: row.get(6)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}
