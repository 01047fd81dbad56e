//! Typed writes and reads used by the controller. Each write function runs inside the caller's
//! transaction; the controller commits before any effect reaches a worker.

use crate::{meta_reserve, Result};
use iris_types::{
    job_state, transition, AttemptCtx, GangCascade, JobCtx, JobState, Rejected, Step, TaskCtx,
    TaskEvent, TaskState,
};
use rusqlite::{params, Connection, OptionalExtension};

/// Resolved job configuration, as stored in `job_config`.
#[derive(Clone, Debug, Default)]
pub struct JobConfigRow {
    pub res_cpu_millicores: i64,
    pub res_memory_bytes: i64,
    pub res_disk_bytes: i64,
    pub res_device_json: Option<String>,
    pub constraints_json: Option<String>,
    pub coscheduling_group_by: Option<String>,
    pub scheduling_timeout_ms: Option<i64>,
    pub max_task_failures: i64,
    pub entrypoint_json: Option<String>,
    pub environment_json: Option<String>,
    pub bundle_id: Option<String>,
    pub ports_json: Option<String>,
    pub max_retries_failure: i64,
    pub max_retries_preemption: i64,
    pub timeout_ms: Option<i64>,
    pub preemption_policy: i32,
    pub existing_job_policy: i32,
    pub priority_band: i32,
    pub task_image: Option<String>,
    pub submit_argv_json: Option<String>,
    /// The full LaunchJobRequest (minus bundle bytes) as binary protobuf.
    pub request_blob: Vec<u8>,
}

/// A job to insert.
#[derive(Clone, Debug, Default)]
pub struct NewJob {
    pub job_id: String,
    pub user_id: String,
    pub submitting_user: String,
    pub parent_job_id: Option<String>,
    pub root_job_id: String,
    pub depth: u32,
    pub num_tasks: u32,
    /// `Some(error)`: insert directly as FAILED with no tasks (invalid replica count).
    pub failed: Option<String>,
    pub cfg: JobConfigRow,
    pub workdir_files: Vec<(String, Vec<u8>)>,
    /// `Some(peer)`: a job queued for a federation peer (`""` while unpinned). It gets no task
    /// rows here: the peer runs it and its tasks are mirrored back.
    pub federated: Option<String>,
}

fn code(s: TaskState) -> i32 {
    s.code()
}

/// Inserts a job, its config and its tasks. Returns `submitted_at_ms` (strictly increasing).
pub fn insert_job(tx: &Connection, j: &NewJob, now: i64) -> Result<i64> {
    let last: Option<i64> = tx
        .prepare_cached("SELECT MAX(submitted_at_ms) FROM jobs")?
        .query_row([], |r| r.get(0))?;
    let submitted = now.max(last.map(|l| l + 1).unwrap_or(now));
    let root_submitted: i64 = match &j.parent_job_id {
        Some(p) => tx
            .query_row(
                "SELECT root_submitted_at_ms FROM jobs WHERE job_id = ?1",
                [p],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(submitted),
        None => submitted,
    };
    let deadline = j
        .cfg
        .scheduling_timeout_ms
        .filter(|t| *t > 0)
        .map(|t| submitted + t);
    let (state, err, finished) = match &j.failed {
        Some(e) => (JobState::Failed.code(), Some(e.clone()), Some(submitted)),
        None => (JobState::Pending.code(), None, None),
    };
    let num_tasks = if j.failed.is_some() { 0 } else { j.num_tasks };
    let cluster = j.federated.as_deref().unwrap_or("local");
    tx.prepare_cached(
        "INSERT INTO jobs(job_id, user_id, submitting_user, parent_job_id, root_job_id, depth, state,
            submitted_at_ms, root_submitted_at_ms, finished_at_ms, scheduling_deadline_epoch_ms, error,
            num_tasks, name, backend_id, cluster)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,'default',?15)",
    )?
    .execute(params![
        j.job_id,
        j.user_id,
        j.submitting_user,
        j.parent_job_id,
        j.root_job_id,
        j.depth,
        state,
        submitted,
        root_submitted,
        finished,
        deadline,
        err,
        num_tasks,
        j.job_id.to_lowercase(),
        cluster,
    ])?;
    let c = &j.cfg;
    tx.prepare_cached(
        "INSERT INTO job_config(job_id, res_cpu_millicores, res_memory_bytes, res_disk_bytes, res_device_json,
            constraints_json, has_coscheduling, coscheduling_group_by, scheduling_timeout_ms, max_task_failures,
            entrypoint_json, environment_json, bundle_id, ports_json, max_retries_failure, max_retries_preemption,
            timeout_ms, preemption_policy, existing_job_policy, priority_band, task_image, submit_argv_json,
            request_blob)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23)",
    )?
    .execute(params![
        j.job_id,
        c.res_cpu_millicores,
        c.res_memory_bytes,
        c.res_disk_bytes,
        c.res_device_json,
        c.constraints_json,
        c.coscheduling_group_by.is_some() as i32,
        c.coscheduling_group_by,
        c.scheduling_timeout_ms,
        c.max_task_failures,
        c.entrypoint_json,
        c.environment_json,
        c.bundle_id,
        c.ports_json,
        c.max_retries_failure,
        c.max_retries_preemption,
        c.timeout_ms,
        c.preemption_policy,
        c.existing_job_policy,
        c.priority_band,
        c.task_image,
        c.submit_argv_json,
        c.request_blob,
    ])?;
    for (name, data) in &j.workdir_files {
        tx.prepare_cached(
            "INSERT INTO job_workdir_files(job_id, filename, data) VALUES (?1,?2,?3)",
        )?
        .execute(params![j.job_id, name, data])?;
    }
    if num_tasks > 0 && j.federated.is_none() {
        let first = meta_reserve(tx, "task_priority_insertion", num_tasks as i64)?;
        let mut st = tx.prepare_cached(
            "INSERT INTO tasks(task_id, job_id, task_index, state, submitted_at_ms, max_retries_failure,
                max_retries_preemption, current_attempt_id, priority_neg_depth, priority_root_submitted_ms,
                priority_insertion, priority_band, backend_id, cluster)
             VALUES (?1,?2,?3,?4,?5,?6,?7,-1,?8,?9,?10,?11,'default','local')",
        )?;
        for i in 0..num_tasks {
            st.execute(params![
                format!("{}/{}", j.job_id, i),
                j.job_id,
                i,
                code(TaskState::Pending),
                submitted,
                c.max_retries_failure,
                c.max_retries_preemption,
                -(j.depth as i64),
                root_submitted,
                first + i as i64,
                c.priority_band,
            ])?;
        }
    }
    Ok(submitted)
}

/// The state of a job, if it exists.
pub fn job_state_of(conn: &Connection, job_id: &str) -> Result<Option<JobState>> {
    let s: Option<i32> = conn
        .prepare_cached("SELECT state FROM jobs WHERE job_id = ?1")?
        .query_row([job_id], |r| r.get(0))
        .optional()?;
    Ok(s.and_then(JobState::from_code))
}

/// Deletes a job and (by cascade) its tasks, attempts and descendants.
pub fn delete_job(tx: &Connection, job_id: &str) -> Result<()> {
    tx.execute(
        "DELETE FROM task_events WHERE task_id IN (SELECT task_id FROM tasks WHERE job_id = ?1 OR substr(job_id, 1, length(?1) + 1) = ?1 || '/')",
        [job_id],
    )?;
    tx.execute(
        "DELETE FROM jobs WHERE job_id = ?1 OR substr(job_id, 1, length(?1) + 1) = ?1 || '/'",
        [job_id],
    )?;
    Ok(())
}

/// Records a task event (shown by `task events`).
#[allow(clippy::too_many_arguments)]
pub fn record_event(
    tx: &Connection,
    task_id: &str,
    attempt_id: Option<i64>,
    attempt_uid: Option<&str>,
    now: i64,
    kind: &str,
    reason: &str,
    message: &str,
    source: &str,
) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO task_events(task_id, attempt_id, attempt_uid, ts_ms, type, reason, message, source)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8)",
    )?
    .execute(params![task_id, attempt_id, attempt_uid, now, kind, reason, message, source])?;
    Ok(())
}

struct TaskRow {
    job_id: String,
    state: TaskState,
    attempt_id: i64,
    max_retries_failure: i64,
    max_retries_preemption: i64,
    coscheduled: bool,
    worker_id: Option<String>,
}

fn load_task(tx: &Connection, task_id: &str) -> Result<Option<(TaskRow, TaskCtx, Option<String>)>> {
    let row = tx
        .prepare_cached(
            "SELECT t.job_id, t.state, t.current_attempt_id, t.max_retries_failure, t.max_retries_preemption,
                    c.has_coscheduling, t.current_worker_id
             FROM tasks t JOIN job_config c ON c.job_id = t.job_id WHERE t.task_id = ?1",
        )?
        .query_row([task_id], |r| {
            Ok(TaskRow {
                job_id: r.get(0)?,
                state: TaskState::from_code(r.get(1)?).unwrap_or(TaskState::Unspecified),
                attempt_id: r.get(2)?,
                max_retries_failure: r.get(3)?,
                max_retries_preemption: r.get(4)?,
                coscheduled: r.get::<_, i64>(5)? != 0,
                worker_id: r.get(6)?,
            })
        })
        .optional()?;
    let Some(row) = row else { return Ok(None) };
    let attempt: Option<(AttemptCtx, String)> = tx
        .prepare_cached(
            "SELECT state, started_at_ms IS NOT NULL, attempt_uid FROM task_attempts WHERE task_id = ?1 AND attempt_id = ?2",
        )?
        .query_row(params![task_id, row.attempt_id], |r| {
            Ok((
                AttemptCtx {
                    state: TaskState::from_code(r.get(0)?).unwrap_or(TaskState::Unspecified),
                    started: r.get(1)?,
                },
                r.get::<_, String>(2)?,
            ))
        })
        .optional()?;
    let (failures, preemptions): (i64, i64) = tx
        .prepare_cached(
            "SELECT COALESCE(SUM(state = 5), 0),
                    COALESCE(SUM(state IN (6, 7, 10) AND started_at_ms IS NOT NULL), 0)
             FROM task_attempts WHERE task_id = ?1",
        )?
        .query_row([task_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let ctx = TaskCtx {
        state: row.state,
        attempt: attempt.as_ref().map(|a| a.0),
        failure_count: failures as u32,
        preemption_count: preemptions as u32,
        max_retries_failure: row.max_retries_failure.max(0) as u32,
        max_retries_preemption: row.max_retries_preemption.max(0) as u32,
        coscheduled: row.coscheduled,
    };
    Ok(Some((row, ctx, attempt.map(|a| a.1))))
}

/// How an applied step ends the attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The worker reported the end: stamp `finished_at_ms` now.
    Now,
    /// The controller decided: the worker must still confirm (the attempt keeps its resources).
    AwaitWorker,
}

/// Applies one event to a task (no job recomputation); returns the step, or `None` if rejected.
fn apply_raw(
    tx: &Connection,
    task_id: &str,
    event: &TaskEvent,
    exit_code: Option<i32>,
    finish: Finish,
    now: i64,
    source: &str,
) -> Result<Option<(Step, String, Option<GangCascade>)>> {
    let Some((row, ctx, uid)) = load_task(tx, task_id)? else {
        return Ok(None);
    };
    let step = match transition(&ctx, event) {
        Ok(s) => s,
        Err(Rejected::NoChange) | Err(Rejected::Terminal(_)) => return Ok(None),
        Err(e @ Rejected::Illegal { .. }) => {
            tracing_free_log(task_id, &e);
            return Ok(None);
        }
    };
    let terminal = step.task.is_terminal();
    tx.prepare_cached(
        "UPDATE tasks SET state = ?2,
            error = COALESCE(?3, error),
            exit_code = COALESCE(?4, exit_code),
            finished_at_ms = CASE WHEN ?5 THEN ?6 ELSE NULL END,
            current_worker_id = CASE WHEN ?7 THEN NULL ELSE current_worker_id END,
            current_worker_address = CASE WHEN ?7 THEN NULL ELSE current_worker_address END
         WHERE task_id = ?1",
    )?
    .execute(params![
        task_id,
        code(step.task),
        step.error,
        exit_code,
        terminal,
        now,
        step.task == TaskState::Pending,
    ])?;
    if let Some(att_state) = step.attempt {
        let att_terminal = att_state.is_terminal();
        let stamp_finish = att_terminal && (finish == Finish::Now || row.worker_id.is_none());
        tx.prepare_cached(
            "UPDATE task_attempts SET state = ?3,
                started_at_ms = CASE WHEN ?4 AND started_at_ms IS NULL THEN ?6 ELSE started_at_ms END,
                finished_at_ms = CASE WHEN ?5 AND finished_at_ms IS NULL THEN ?6 ELSE finished_at_ms END,
                error = COALESCE(?7, error),
                exit_code = COALESCE(?8, exit_code),
                terminal_reason = CASE WHEN ?9 THEN ?10 ELSE terminal_reason END
             WHERE task_id = ?1 AND attempt_id = ?2",
        )?
        .execute(params![
            task_id,
            row.attempt_id,
            code(att_state),
            step.mark_started,
            stamp_finish,
            now,
            step.error,
            exit_code,
            att_terminal,
            step.reason,
        ])?;
    }
    let msg = match (&step.error, step.attempt) {
        (Some(e), _) => format!("{} -> {}: {}", ctx.state, step.task, e),
        (None, _) => format!("{} -> {}", ctx.state, step.task),
    };
    let kind = if matches!(
        step.task,
        TaskState::Failed
            | TaskState::WorkerFailed
            | TaskState::Preempted
            | TaskState::CoschedFailed
    ) || step.reason == "TaskRetryScheduled"
        || step.reason == "Preempted"
    {
        "Warning"
    } else {
        "Normal"
    };
    let attempt_id = (row.attempt_id >= 0).then_some(row.attempt_id);
    record_event(
        tx,
        task_id,
        attempt_id,
        uid.as_deref(),
        now,
        kind,
        step.reason,
        &msg,
        source,
    )?;
    let cascade = if ctx.coscheduled { step.cascade } else { None };
    Ok(Some((step, row.job_id, cascade)))
}

/// Illegal transitions are bugs in the caller; they are dropped (and visible in tests).
fn tracing_free_log(task_id: &str, e: &Rejected) {
    if cfg!(debug_assertions) {
        eprintln!("iris-store: dropped illegal event for {task_id}: {e}");
    }
}

/// Applies an event to a task, cascades to gang siblings, and recomputes the job. Returns the
/// resulting task state when the event applied.
pub fn apply_task_event(
    tx: &Connection,
    task_id: &str,
    event: &TaskEvent,
    exit_code: Option<i32>,
    finish: Finish,
    now: i64,
    source: &str,
) -> Result<Option<TaskState>> {
    let Some((step, job_id, cascade)) =
        apply_raw(tx, task_id, event, exit_code, finish, now, source)?
    else {
        return Ok(None);
    };
    if let Some(c) = cascade {
        let siblings: Vec<String> = {
            let mut st = tx.prepare_cached(
                "SELECT task_id FROM tasks WHERE job_id = ?1 AND task_id != ?2 AND state IN (2, 3, 9) ORDER BY task_index",
            )?;
            let rows = st.query_map(params![job_id, task_id], |r| r.get(0))?;
            rows.collect::<std::result::Result<_, _>>()?
        };
        for sib in siblings {
            let ev = match c {
                GangCascade::Fail => TaskEvent::SiblingFailed {
                    sibling: task_id.to_string(),
                },
                GangCascade::Requeue => TaskEvent::SiblingRequeued {
                    sibling: task_id.to_string(),
                },
            };
            apply_raw(
                tx,
                &sib,
                &ev,
                None,
                Finish::AwaitWorker,
                now,
                "iris/controller",
            )?;
        }
    }
    recompute_job(tx, &job_id, now)?;
    Ok(Some(step.task))
}

/// Recomputes a job's state (§2.6); on going terminal kills remaining tasks and, per the
/// preemption policy, the job's descendants.
pub fn recompute_job(tx: &Connection, job_id: &str, now: i64) -> Result<()> {
    let (cur, started, max_task_failures, policy, num_tasks): (i32, bool, i64, i32, i64) = match tx
        .prepare_cached(
            "SELECT j.state, j.started_at_ms IS NOT NULL, c.max_task_failures, c.preemption_policy, j.num_tasks
             FROM jobs j JOIN job_config c ON c.job_id = j.job_id WHERE j.job_id = ?1",
        )?
        .query_row([job_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .optional()?
    {
        Some(v) => v,
        None => return Ok(()),
    };
    let cur = JobState::from_code(cur).unwrap_or(JobState::Unspecified);
    if cur.is_terminal() {
        return Ok(());
    }
    let states: Vec<TaskState> = {
        let mut st =
            tx.prepare_cached("SELECT state FROM tasks WHERE job_id = ?1 ORDER BY task_index")?;
        let rows = st.query_map([job_id], |r| r.get::<_, i32>(0))?;
        rows.map(|r| r.map(|c| TaskState::from_code(c).unwrap_or(TaskState::Unspecified)))
            .collect::<std::result::Result<_, _>>()?
    };
    let failed_attempts: i64 = tx
        .prepare_cached(
            "SELECT count(*) FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id WHERE t.job_id = ?1 AND a.state = 5",
        )?
        .query_row([job_id], |r| r.get(0))?;
    let first_error: Option<String> = tx
        .prepare_cached(
            "SELECT error FROM tasks WHERE job_id = ?1 AND error IS NOT NULL AND state IN (5, 6, 7, 8, 10, 11)
             ORDER BY (state = 5) DESC, finished_at_ms, task_index LIMIT 1",
        )?
        .query_row([job_id], |r| r.get(0))
        .optional()?
        .flatten();
    let first_failed_attempt_error: Option<String> = if failed_attempts > 0 {
        tx.prepare_cached(
            "SELECT a.error FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
             WHERE t.job_id = ?1 AND a.state = 5 ORDER BY a.finished_at_ms, a.task_id LIMIT 1",
        )?
        .query_row([job_id], |r| r.get(0))
        .optional()?
        .flatten()
    } else {
        None
    };
    let err_src = first_failed_attempt_error.or(first_error);
    let (next, error) = job_state(&JobCtx {
        tasks: &states,
        failed_attempts: failed_attempts as u32,
        max_task_failures: max_task_failures.max(0) as u32,
        ever_started: started,
        first_error: err_src.as_deref(),
    });
    if next == cur && !next.is_terminal() {
        if next == JobState::Running && !started {
            tx.execute(
                "UPDATE jobs SET started_at_ms = ?2 WHERE job_id = ?1 AND started_at_ms IS NULL",
                params![job_id, now],
            )?;
        }
        return Ok(());
    }
    tx.prepare_cached(
        "UPDATE jobs SET state = ?2, error = ?3,
            started_at_ms = CASE WHEN ?4 = 3 AND started_at_ms IS NULL THEN ?5 ELSE started_at_ms END,
            finished_at_ms = CASE WHEN ?6 THEN ?5 ELSE finished_at_ms END
         WHERE job_id = ?1",
    )?
    .execute(params![
        job_id,
        next.code(),
        error,
        next.code(),
        now,
        next.is_terminal()
    ])?;
    if next.is_terminal() {
        let reason = error.clone().unwrap_or_else(|| format!("Job {next}"));
        let remaining: Vec<String> = unfinished_tasks(tx, job_id)?;
        for t in remaining {
            apply_raw(
                tx,
                &t,
                &TaskEvent::JobFinalized {
                    reason: reason.clone(),
                },
                None,
                Finish::AwaitWorker,
                now,
                "iris/controller",
            )?;
        }
        // TERMINATE_CHILDREN=1, PRESERVE_CHILDREN=2; unspecified: terminate for 1-task jobs.
        let terminate_children =
            next == JobState::Succeeded || policy == 1 || (policy == 0 && num_tasks <= 1);
        if terminate_children {
            let children: Vec<String> = unfinished_children(tx, job_id)?;
            for c in children {
                kill_subtree(
                    tx,
                    &c,
                    "Parent job terminated",
                    "Parent job terminated",
                    now,
                )?;
            }
        }
    }
    Ok(())
}

/// The job's tasks that are not terminal, in index order.
fn unfinished_tasks(tx: &Connection, job_id: &str) -> Result<Vec<String>> {
    let mut st = tx.prepare_cached(
        "SELECT task_id FROM tasks WHERE job_id = ?1 AND state NOT IN (4,5,6,7,8,10,11) ORDER BY task_index",
    )?;
    let rows = st.query_map([job_id], |r| r.get(0))?;
    Ok(rows.collect::<std::result::Result<_, _>>()?)
}

/// The job's direct children that are not terminal.
fn unfinished_children(tx: &Connection, job_id: &str) -> Result<Vec<String>> {
    let mut st = tx.prepare_cached(
        "SELECT job_id FROM jobs WHERE parent_job_id = ?1 AND state NOT IN (4,5,6,7,8)",
    )?;
    let rows = st.query_map([job_id], |r| r.get(0))?;
    Ok(rows.collect::<std::result::Result<_, _>>()?)
}

/// Kills a job and all its descendants (§2.7). Returns false if the job does not exist.
pub fn kill_subtree(
    tx: &Connection,
    job_id: &str,
    root_reason: &str,
    child_reason: &str,
    now: i64,
) -> Result<bool> {
    let jobs: Vec<(String, i32)> = {
        let mut st = tx.prepare_cached(
            "SELECT job_id, state FROM jobs WHERE job_id = ?1 OR substr(job_id, 1, length(?1) + 1) = ?1 || '/'
             ORDER BY depth",
        )?;
        let rows = st.query_map([job_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    if jobs.is_empty() {
        return Ok(false);
    }
    for (jid, state) in &jobs {
        let reason = if jid == job_id {
            root_reason
        } else {
            child_reason
        };
        let st = JobState::from_code(*state).unwrap_or(JobState::Unspecified);
        if st.is_terminal() && st != JobState::WorkerFailed {
            continue;
        }
        tx.prepare_cached(
            "UPDATE jobs SET state = 6, error = ?2, finished_at_ms = COALESCE(finished_at_ms, ?3) WHERE job_id = ?1",
        )?
        .execute(params![jid, reason, now])?;
        let tasks: Vec<String> = unfinished_tasks(tx, jid)?;
        for t in tasks {
            apply_raw(
                tx,
                &t,
                &TaskEvent::Kill {
                    reason: reason.to_string(),
                },
                None,
                Finish::AwaitWorker,
                now,
                "iris/controller",
            )?;
        }
        tx.execute("DELETE FROM endpoints WHERE job_id = ?1", [jid])?;
    }
    Ok(true)
}

/// Marks a job and its unfinished tasks SUCCEEDED (`CompleteJob`); kills descendants.
pub fn complete_job(tx: &Connection, job_id: &str, now: i64) -> Result<bool> {
    let Some(state) = job_state_of(tx, job_id)? else {
        return Ok(false);
    };
    if state.is_terminal() {
        return Ok(true);
    }
    let tasks: Vec<String> = unfinished_tasks(tx, job_id)?;
    for t in &tasks {
        apply_raw(
            tx,
            t,
            &TaskEvent::Complete,
            Some(0),
            Finish::AwaitWorker,
            now,
            "iris/controller",
        )?;
    }
    tx.execute(
        "UPDATE jobs SET state = 4, error = NULL, finished_at_ms = ?2, started_at_ms = COALESCE(started_at_ms, ?2) WHERE job_id = ?1",
        params![job_id, now],
    )?;
    let children: Vec<String> = unfinished_children(tx, job_id)?;
    for c in children {
        kill_subtree(
            tx,
            &c,
            "Parent job terminated",
            "Parent job terminated",
            now,
        )?;
    }
    Ok(true)
}

/// Places a pending task on a worker: new attempt in ASSIGNED with `uid`.
pub fn assign_task(
    tx: &Connection,
    task_id: &str,
    worker_id: &str,
    worker_address: &str,
    uid: &str,
    band: i32,
    now: i64,
) -> Result<bool> {
    let Some((row, ctx, _)) = load_task(tx, task_id)? else {
        return Ok(false);
    };
    if transition(&ctx, &TaskEvent::Assign).is_err() {
        return Ok(false);
    }
    let attempt_id = row.attempt_id + 1;
    tx.prepare_cached(
        "INSERT INTO task_attempts(task_id, attempt_id, worker_id, state, created_at_ms, attempt_uid, backend_id)
         VALUES (?1,?2,?3,9,?4,?5,'default')",
    )?
    .execute(params![task_id, attempt_id, worker_id, now, uid])?;
    tx.prepare_cached(
        "UPDATE tasks SET state = 9, current_attempt_id = ?2, current_worker_id = ?3, current_worker_address = ?4,
            started_at_ms = COALESCE(started_at_ms, ?5), priority_band = ?6, status_message = NULL
         WHERE task_id = ?1",
    )?
    .execute(params![task_id, attempt_id, worker_id, worker_address, now, band])?;
    record_event(
        tx,
        task_id,
        Some(attempt_id),
        Some(uid),
        now,
        "Normal",
        "TaskAssigned",
        &format!("Assigned to worker {worker_id}"),
        "iris/controller",
    )?;
    recompute_job(tx, &row.job_id, now)?;
    Ok(true)
}

/// A worker's observation of one attempt.
#[derive(Clone, Debug)]
pub struct Observation {
    pub attempt_uid: String,
    pub state: TaskState,
    pub exit_code: Option<i32>,
    pub error: String,
    pub status_message: String,
}

/// Applies a worker's observation, fenced by attempt uid and worker id. Returns true when it
/// changed state.
pub fn apply_observation(
    tx: &Connection,
    worker_id: &str,
    obs: &Observation,
    now: i64,
) -> Result<bool> {
    let att: Option<(String, i64, Option<String>, i32, bool, i64)> = tx
        .prepare_cached(
            "SELECT a.task_id, a.attempt_id, a.worker_id, a.state, a.finished_at_ms IS NOT NULL, t.current_attempt_id
             FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id WHERE a.attempt_uid = ?1",
        )?
        .query_row([&obs.attempt_uid], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
        })
        .optional()?;
    let Some((task_id, attempt_id, att_worker, att_state, finished, current)) = att else {
        return Ok(false);
    };
    if att_worker.as_deref() != Some(worker_id) {
        return Ok(false);
    }
    let att_state = TaskState::from_code(att_state).unwrap_or(TaskState::Unspecified);
    let reported_terminal = obs.state.is_terminal() || obs.state == TaskState::Missing;
    if attempt_id == current {
        if !obs.status_message.is_empty() {
            tx.prepare_cached("UPDATE tasks SET status_message = ?2 WHERE task_id = ?1")?
                .execute(params![task_id, obs.status_message])?;
        } else if obs.state == TaskState::Running {
            // Running: whatever it was waiting for is over.
            tx.prepare_cached(
                "UPDATE tasks SET status_message = NULL WHERE task_id = ?1 AND status_message IS NOT NULL",
            )?
            .execute(params![task_id])?;
        }
    }
    if attempt_id != current || att_state.is_terminal() {
        // The controller already decided this attempt's fate (or it is superseded): a terminal
        // report only confirms it ended on the worker, releasing its resources.
        if reported_terminal && !finished {
            tx.prepare_cached(
                "UPDATE task_attempts SET finished_at_ms = ?2, exit_code = COALESCE(exit_code, ?3) WHERE attempt_uid = ?1",
            )?
            .execute(params![obs.attempt_uid, now, obs.exit_code])?;
            return Ok(true);
        }
        return Ok(false);
    }
    let ev = TaskEvent::Report {
        state: obs.state,
        error: obs.error.clone(),
    };
    let src = "iris/worker";
    let exit = if reported_terminal {
        obs.exit_code
    } else {
        None
    };
    let applied = apply_task_event(tx, &task_id, &ev, exit, Finish::Now, now, src)?;
    Ok(applied.is_some())
}

/// Declares a worker dead: its open attempts go down the WORKER_FAILED path and are finished.
pub fn fail_worker(tx: &Connection, worker_id: &str, now: i64) -> Result<Vec<String>> {
    let open: Vec<(String, i64, i64)> = {
        let mut st = tx.prepare_cached(
            "SELECT a.task_id, a.attempt_id, t.current_attempt_id FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
             WHERE a.worker_id = ?1 AND a.finished_at_ms IS NULL",
        )?;
        let rows = st.query_map([worker_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    let mut affected = Vec::new();
    for (task_id, attempt_id, current) in open {
        if attempt_id == current {
            apply_task_event(
                tx,
                &task_id,
                &TaskEvent::WorkerLost,
                None,
                Finish::Now,
                now,
                "iris/controller",
            )?;
        }
        tx.execute(
            "UPDATE task_attempts SET finished_at_ms = COALESCE(finished_at_ms, ?3),
                state = CASE WHEN state IN (9, 2, 3) THEN 7 ELSE state END
             WHERE task_id = ?1 AND attempt_id = ?2",
            params![task_id, attempt_id, now],
        )?;
        affected.push(task_id);
    }
    tx.execute(
        "UPDATE tasks SET current_worker_id = NULL, current_worker_address = NULL WHERE current_worker_id = ?1",
        [worker_id],
    )?;
    tx.execute("DELETE FROM workers WHERE worker_id = ?1", [worker_id])?;
    Ok(affected)
}

/// One attempt a worker should hold (for building the reconcile desired set).
#[derive(Clone, Debug)]
pub struct DesiredRow {
    pub attempt_uid: String,
    pub task_id: String,
    pub job_id: String,
    pub attempt_id: i64,
    pub attempt_state: TaskState,
    pub task_state: TaskState,
    pub is_current: bool,
    pub num_tasks: i64,
}

/// Open attempts (no `finished_at`) on a worker.
pub fn open_attempts_for_worker(conn: &Connection, worker_id: &str) -> Result<Vec<DesiredRow>> {
    let mut st = conn.prepare_cached(
        "SELECT a.attempt_uid, a.task_id, t.job_id, a.attempt_id, a.state, t.state, t.current_attempt_id, j.num_tasks
         FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id JOIN jobs j ON j.job_id = t.job_id
         WHERE a.worker_id = ?1 AND a.finished_at_ms IS NULL ORDER BY a.created_at_ms",
    )?;
    let rows = st.query_map([worker_id], |r| {
        let attempt_id: i64 = r.get(3)?;
        let current: i64 = r.get(6)?;
        Ok(DesiredRow {
            attempt_uid: r.get(0)?,
            task_id: r.get(1)?,
            job_id: r.get(2)?,
            attempt_id,
            attempt_state: TaskState::from_code(r.get(4)?).unwrap_or(TaskState::Unspecified),
            task_state: TaskState::from_code(r.get(5)?).unwrap_or(TaskState::Unspecified),
            is_current: attempt_id == current,
            num_tasks: r.get(7)?,
        })
    })?;
    Ok(rows.collect::<std::result::Result<_, _>>()?)
}
