//! What the control tick reads: deadlines, timeouts, the work holding workers and the work
//! waiting for them. All reads; the tick applies its decisions through [`crate::apply`].

use crate::{Read, Result};
use iris_types::TaskState;
use rusqlite::OptionalExtension;
use std::sync::LazyLock;

// From the live jobs (a terminal job has no pending task: it finalized them), not from the
// pending tasks: at 100,000 pending tasks, joining each to its job took up to ~190 ms a tick,
// where few jobs are live and fewer have a deadline. `CROSS JOIN` keeps SQLite to that order,
// and the unary `+` keeps it finding each job's tasks by job (not every pending task per job).
static EXPIRED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT t.task_id FROM jobs j CROSS JOIN tasks t ON t.job_id = j.job_id
         WHERE j.state IN {} AND j.scheduling_deadline_epoch_ms IS NOT NULL
           AND j.scheduling_deadline_epoch_ms < ?1
           AND +t.state = {} AND t.cluster = 'local'",
        *crate::sets::JOB_LIVE,
        TaskState::Pending.code()
    )
});

/// Pending local tasks whose job's scheduling deadline is before `now`.
pub fn past_scheduling_deadline(c: &impl Read, now: i64) -> Result<Vec<String>> {
    let mut st = c.raw().prepare_cached(&EXPIRED)?;
    let rows = st.query_map([now], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

static TIMED_OUT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT t.task_id, COALESCE(a.worker_id, a.backend_id) FROM tasks t JOIN job_config c ON c.job_id = t.job_id
         JOIN task_attempts a ON a.task_id = t.task_id AND a.attempt_id = t.current_attempt_id
         WHERE t.state IN ({}, {}) AND t.cluster = 'local' AND c.timeout_ms IS NOT NULL
           AND a.started_at_ms IS NOT NULL AND a.started_at_ms + c.timeout_ms < ?1",
        TaskState::Building.code(),
        TaskState::Running.code()
    )
});

/// Executing local tasks past their execution timeout (measured from the attempt's start):
/// `(task, holder)` (its worker, or the backend of an attempt with no worker).
pub fn past_execution_timeout(c: &impl Read, now: i64) -> Result<Vec<(String, String)>> {
    let mut st = c.raw().prepare_cached(&TIMED_OUT)?;
    let rows = st.query_map([now], |r| {
        Ok((
            r.get(0)?,
            r.get::<_, Option<String>>(1)?.unwrap_or_default(),
        ))
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// An attempt that still holds a worker's resources (no `finished_at`).
#[derive(Clone, Debug)]
pub struct Holding {
    /// The attempt row's id, as [`crate::changes`] names it.
    pub row: i64,
    pub task_id: String,
    pub job_id: String,
    pub worker_id: String,
    /// The band the task runs at (after budget demotion at assignment).
    pub band: i32,
    /// The attempt is RUNNING (not assigned or building).
    pub running: bool,
}

fn holding_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Holding> {
    Ok(Holding {
        row: r.get(0)?,
        task_id: r.get(1)?,
        job_id: r.get(2)?,
        worker_id: r.get(3)?,
        band: r.get(4)?,
        running: r.get(5)?,
    })
}

// The task's band and job are written with the attempt (assignment) and not after, so an
// attempt row that did not change holds what it held (`holding_rows`).
static HOLDING: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT a.rowid, a.task_id, t.job_id, a.worker_id, t.priority_band, a.state = {}
         FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
         WHERE a.finished_at_ms IS NULL AND a.worker_id IS NOT NULL",
        TaskState::Running.code()
    )
});

static HOLDING_ROW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT a.rowid, a.task_id, t.job_id, a.worker_id, t.priority_band, a.state = {}
         FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
         WHERE a.rowid = ?1 AND a.finished_at_ms IS NULL AND a.worker_id IS NOT NULL",
        TaskState::Running.code()
    )
});

/// Every attempt holding a worker.
pub fn holdings(c: &impl Read) -> Result<Vec<Holding>> {
    let mut st = c.raw().prepare_cached(&HOLDING)?;
    let rows = st.query_map([], holding_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Rows `rows` of `task_attempts` (rowids, from [`crate::changes`]) as they are now: each with
/// the worker it holds, or `None` if it holds none (gone, finished, or on a backend).
pub fn holding_rows(c: &impl Read, rows: &[i64]) -> Result<Vec<(i64, Option<Holding>)>> {
    let mut st = c.raw().prepare_cached(&HOLDING_ROW)?;
    let mut out = Vec::with_capacity(rows.len());
    for &row in rows {
        out.push((row, st.query_row([row], holding_row).optional()?));
    }
    Ok(out)
}

/// A pending local task with its queue-order keys.
#[derive(Clone, Debug)]
pub struct Waiting {
    /// The row's id, as [`crate::changes`] names it.
    pub row: i64,
    pub task_id: String,
    pub job_id: String,
    pub root_submitted_ms: i64,
    pub submitted_ms: i64,
    pub insertion: i64,
}

static WAITING: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT rowid, task_id, job_id, priority_root_submitted_ms, submitted_at_ms, priority_insertion
         FROM tasks WHERE state = {} AND cluster = 'local'",
        TaskState::Pending.code()
    )
});

fn waiting_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Waiting> {
    Ok(Waiting {
        row: r.get(0)?,
        task_id: r.get(1)?,
        job_id: r.get(2)?,
        root_submitted_ms: r.get(3)?,
        submitted_ms: r.get(4)?,
        insertion: r.get(5)?,
    })
}

static WAITING_ROW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT rowid, task_id, job_id, priority_root_submitted_ms, submitted_at_ms, priority_insertion
         FROM tasks WHERE rowid = ?1 AND state = {} AND cluster = 'local'",
        TaskState::Pending.code()
    )
});

/// Rows `rows` of `tasks` (rowids, from [`crate::changes`]) as they are now: each with the
/// pending local task it holds, or `None` if it holds none (gone, or not pending).
pub fn waiting_rows(c: &impl Read, rows: &[i64]) -> Result<Vec<(i64, Option<Waiting>)>> {
    let mut st = c.raw().prepare_cached(&WAITING_ROW)?;
    let mut out = Vec::with_capacity(rows.len());
    for &row in rows {
        let w = st.query_row([row], waiting_row).optional()?;
        out.push((row, w));
    }
    Ok(out)
}

/// Every pending local task.
pub fn waiting(c: &impl Read) -> Result<Vec<Waiting>> {
    let mut st = c.raw().prepare_cached(&WAITING)?;
    let rows = st.query_map([], waiting_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

static WAITING_COUNT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT count(*) FROM tasks WHERE state = {} AND cluster = 'local'",
        TaskState::Pending.code()
    )
});

/// How many local tasks are pending.
pub fn waiting_count(c: &impl Read) -> Result<i64> {
    Ok(c.raw()
        .prepare_cached(&WAITING_COUNT)?
        .query_row([], |r| r.get(0))?)
}
