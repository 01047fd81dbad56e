//! Task and attempt transitions: every write of `tasks.state` and `task_attempts.state` applies
//! a `Step` from `iris_types::transition`, inside the caller's transaction. Gang cascades and the
//! job recomputation follow in the same transaction.

use super::job::recompute_job;
use crate::events::append_event;
use crate::sets::{ATTEMPT_PREEMPTION, TASK_ACTIVE};
use crate::{Result, Tx};
use iris_types::{
    orphaned_attempt_on_worker_loss, transition, AttemptCtx, GangCascade, Rejected, RunningJobMove,
    Step, TaskCtx, TaskEvent, TaskState,
};
use rusqlite::{params, Connection, OptionalExtension};
use std::sync::LazyLock;

const CONTROLLER: &str = "iris/controller";

#[derive(Debug, PartialEq, Eq)]
struct TaskRow {
    job_id: String,
    state: TaskState,
    attempt_id: i64,
    max_retries_failure: i64,
    max_retries_preemption: i64,
    coscheduled: bool,
    worker_id: Option<String>,
    /// The task's rowid, and its current attempt's: the transition's updates find the rows by
    /// them instead of descending the text-keyed indexes again (five descents per task at C1M).
    rowid: i64,
    attempt_rowid: Option<i64>,
    /// The task's newest event, which the next one it gets follows (`events::append_event`).
    last_event_id: Option<i64>,
}

/// A task with what its transition needs, in one statement: its row, its job's gang flag and its
/// current attempt; the retry counts are left at zero (see [`LOAD_TASK_WITH_RETRY_COUNTS`]).
/// (Three statements before: the same instructions, as its cost is the index lookups.)
static LOAD_TASK: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {TASK_ROW_COLUMNS}, a.state, a.started_at_ms IS NOT NULL, a.attempt_uid, 0, 0,
                a.rowid
         {LOAD_TASK_FROM}"
    )
});

/// [`LOAD_TASK`] with the counts of the task's failed and charged attempts (the retry budgets):
/// two more lookups in `task_attempts`, which only a failure or a loss reads
/// (`TaskEvent::reads_retry_counts`); done for every report before, about a fifth of the
/// instructions of each RUNNING and SUCCEEDED one.
static LOAD_TASK_WITH_RETRY_COUNTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {TASK_ROW_COLUMNS}, a.state, a.started_at_ms IS NOT NULL, a.attempt_uid,
                (SELECT count(*) FROM task_attempts f WHERE f.task_id = ?1 AND f.state = {}),
                (SELECT count(*) FROM task_attempts p
                  WHERE p.task_id = ?1 AND p.state IN {} AND p.started_at_ms IS NOT NULL),
                a.rowid
         {LOAD_TASK_FROM}",
        TaskState::Failed.code(),
        *ATTEMPT_PREEMPTION
    )
});

/// A [`TaskRow`]'s columns (tasks `t`, job config `c`), in the order [`task_row`] reads them
/// (all but the attempt's rowid, which each query adds where it joins the attempt).
const TASK_ROW_COLUMNS: &str = "t.job_id, t.state, t.current_attempt_id, t.max_retries_failure,
                t.max_retries_preemption, c.has_coscheduling, t.current_worker_id, t.rowid,
                t.last_event_id";

/// How many columns [`TASK_ROW_COLUMNS`] has.
const TASK_ROW_WIDTH: usize = 9;

/// The [`TaskRow`] of [`TASK_ROW_COLUMNS`] starting at column `at`, with its current attempt's
/// rowid read from column `attempt_rowid_at`.
fn task_row(
    r: &rusqlite::Row<'_>,
    at: usize,
    attempt_rowid_at: usize,
) -> rusqlite::Result<TaskRow> {
    Ok(TaskRow {
        job_id: r.get(at)?,
        state: TaskState::from_code(r.get(at + 1)?).unwrap_or(TaskState::Unspecified),
        attempt_id: r.get(at + 2)?,
        max_retries_failure: r.get(at + 3)?,
        max_retries_preemption: r.get(at + 4)?,
        coscheduled: r.get::<_, i64>(at + 5)? != 0,
        worker_id: r.get(at + 6)?,
        rowid: r.get(at + 7)?,
        last_event_id: r.get(at + 8)?,
        attempt_rowid: r.get(attempt_rowid_at)?,
    })
}

const LOAD_TASK_FROM: &str = "FROM tasks t
         JOIN job_config c ON c.job_id = t.job_id
         LEFT JOIN task_attempts a ON a.task_id = t.task_id AND a.attempt_id = t.current_attempt_id
         WHERE t.task_id = ?1";

/// The task and what `event`'s transition needs of it; the retry counts are zero unless the
/// event reads them.
fn load_task(tx: &Connection, task_id: &str, event: &TaskEvent) -> Result<Option<Loaded>> {
    let sql = if event.reads_retry_counts() {
        &LOAD_TASK_WITH_RETRY_COUNTS
    } else {
        &LOAD_TASK
    };
    let loaded = tx
        .prepare_cached(sql)?
        .query_row([task_id], |r| {
            // After the row: the attempt's state, whether it started, its uid, the two retry
            // counts and its rowid.
            const AT: usize = TASK_ROW_WIDTH;
            let row = task_row(r, 0, AT + 5)?;
            let attempt = match r.get::<_, Option<i32>>(AT)? {
                Some(state) => Some((
                    AttemptCtx {
                        state: TaskState::from_code(state).unwrap_or(TaskState::Unspecified),
                        started: r.get(AT + 1)?,
                    },
                    r.get::<_, String>(AT + 2)?,
                )),
                None => None,
            };
            let counts: (i64, i64) = (r.get(AT + 3)?, r.get(AT + 4)?);
            Ok((row, attempt, counts))
        })
        .optional()?;
    Ok(loaded.map(|(row, attempt, counts)| loaded_task(row, attempt, counts)))
}

/// A task as [`apply_loaded`] takes it: its row, its transition's context, and its current
/// attempt's uid.
type Loaded = (TaskRow, TaskCtx, Option<String>);

/// [`Loaded`] from a task's row, its current attempt (with its uid) and its retry counts
/// (failed, charged).
fn loaded_task(row: TaskRow, attempt: Option<(AttemptCtx, String)>, counts: (i64, i64)) -> Loaded {
    let ctx = TaskCtx {
        state: row.state,
        attempt: attempt.as_ref().map(|a| a.0),
        failure_count: counts.0.max(0) as u32,
        preemption_count: counts.1.max(0) as u32,
        max_retries_failure: row.max_retries_failure.max(0) as u32,
        max_retries_preemption: row.max_retries_preemption.max(0) as u32,
        coscheduled: row.coscheduled,
    };
    (row, ctx, attempt.map(|a| a.1))
}

/// How an applied step ends the attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The worker reported the end: stamp `finished_at_ms` now.
    Now,
    /// The controller decided: the worker must still confirm (the attempt keeps its resources).
    AwaitWorker,
}

/// The step `event` takes the task through, or `None` when it does not apply; an illegal event
/// is noted (logged and counted).
fn step_of(task_id: &str, ctx: &TaskCtx, event: &TaskEvent) -> Option<Step> {
    match transition(ctx, event) {
        Ok(s) => Some(s),
        Err(Rejected::NoChange) | Err(Rejected::Terminal(_)) => None,
        Err(e @ Rejected::Illegal { .. }) => {
            super::note_illegal("task", task_id, &e.to_string());
            None
        }
    }
}

/// A task's new state (`OR FAIL`: see "No statement journal" in `apply`).
pub(crate) const SAVE_TASK_STATE: &str = "UPDATE OR FAIL tasks SET state = ?2,
        error = COALESCE(?3, error),
        exit_code = COALESCE(?4, exit_code),
        finished_at_ms = CASE WHEN ?5 THEN ?6 ELSE NULL END,
        last_event_id = ?7
     WHERE rowid = ?1";

/// An attempt's new state, by the rowid its task's load read (`OR FAIL`: see "No statement
/// journal" in `apply`). A task loaded without a current attempt row has none to update, as
/// `(task_id, current_attempt_id)` would find none either.
pub(crate) const SAVE_ATTEMPT_STATE: &str = "UPDATE OR FAIL task_attempts SET state = ?2,
        started_at_ms = CASE WHEN ?3 AND started_at_ms IS NULL THEN ?5 ELSE started_at_ms END,
        finished_at_ms = CASE WHEN ?4 AND finished_at_ms IS NULL THEN ?5 ELSE finished_at_ms END,
        error = COALESCE(?6, error),
        exit_code = COALESCE(?7, exit_code),
        terminal_reason = CASE WHEN ?8 THEN ?9 ELSE terminal_reason END
     WHERE rowid = ?1";

/// Applies one event to a task (no job recomputation); returns the step, or `None` if rejected.
pub(crate) fn apply_raw(
    tx: &Connection,
    task_id: &str,
    event: &TaskEvent,
    exit_code: Option<i32>,
    finish: Finish,
    now: i64,
    source: &str,
) -> Result<Option<(Step, String, Option<GangCascade>)>> {
    let Some(loaded) = load_task(tx, task_id, event)? else {
        return Ok(None);
    };
    apply_loaded(tx, task_id, loaded, event, exit_code, finish, now, source)
}

/// [`apply_raw`] for a task its caller has loaded already.
#[allow(clippy::too_many_arguments)]
fn apply_loaded(
    tx: &Connection,
    task_id: &str,
    (row, ctx, uid): Loaded,
    event: &TaskEvent,
    exit_code: Option<i32>,
    finish: Finish,
    now: i64,
    source: &str,
) -> Result<Option<(Step, String, Option<GangCascade>)>> {
    let Some(step) = step_of(task_id, &ctx, event) else {
        return Ok(None);
    };
    let terminal = step.task.is_terminal();
    super::note_entered(step.task);
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
    let event_id = append_event(
        tx,
        task_id,
        attempt_id,
        uid.as_deref(),
        now,
        [kind, step.reason, &msg, source],
        row.last_event_id,
    )?;
    // The worker columns are written only when the task goes back to PENDING: `current_worker_id`
    // is a foreign key, and a statement that writes one (even to itself) checks it and runs
    // under a statement journal (−4% of the writer's instructions per task; BENCHMARKS.md).
    tx.prepare_cached(SAVE_TASK_STATE)?.execute(params![
        row.rowid,
        step.task.code(),
        step.error,
        exit_code,
        terminal,
        now,
        event_id,
    ])?;
    if step.task == TaskState::Pending {
        tx.prepare_cached(
            "UPDATE tasks SET current_worker_id = NULL, current_worker_address = NULL
             WHERE task_id = ?1",
        )?
        .execute([task_id])?;
    }
    if let Some(att_state) = step.attempt {
        let att_terminal = att_state.is_terminal();
        let stamp_finish = att_terminal && (finish == Finish::Now || row.worker_id.is_none());
        tx.prepare_cached(SAVE_ATTEMPT_STATE)?.execute(params![
            row.attempt_rowid,
            att_state.code(),
            step.mark_started,
            stamp_finish,
            now,
            step.error,
            exit_code,
            att_terminal,
            step.reason,
        ])?;
    }
    // An endpoint belongs to its task's live attempt: when that attempt (or the task) ends, its
    // service is gone, so its names must stop resolving in the same commit.
    if terminal || step.attempt.is_some_and(|a| a.is_terminal()) {
        crate::endpoints::drop_for_task(tx, task_id)?;
    }
    let cascade = if ctx.coscheduled { step.cascade } else { None };
    Ok(Some((step, row.job_id, cascade)))
}

static ACTIVE_SIBLINGS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT task_id FROM tasks WHERE job_id = ?1 AND task_id != ?2 AND state IN {} ORDER BY task_index",
        *TASK_ACTIVE
    )
});

/// Applies an event to a task, cascades to gang siblings, and recomputes the job. Returns the
/// resulting task state when the event applied.
pub fn apply_task_event(
    tx: &Tx<'_>,
    task_id: &str,
    event: &TaskEvent,
    exit_code: Option<i32>,
    finish: Finish,
    now: i64,
    source: &str,
) -> Result<Option<TaskState>> {
    apply_task_event_raw(&tx.tx, task_id, event, exit_code, finish, now, source)
}

pub(crate) fn apply_task_event_raw(
    tx: &Connection,
    task_id: &str,
    event: &TaskEvent,
    exit_code: Option<i32>,
    finish: Finish,
    now: i64,
    source: &str,
) -> Result<Option<TaskState>> {
    let mut rollups = JobRollups::default();
    let state = apply_task_event_deferred(
        tx,
        task_id,
        None,
        event,
        exit_code,
        finish,
        now,
        source,
        &mut rollups,
    )?;
    rollups.finish_raw(tx, now)?;
    Ok(state)
}

/// [`apply_task_event_raw`] with the job's rollup left to `rollups`; `loaded` is the task when
/// the caller has read it already (else it is read here).
#[allow(clippy::too_many_arguments)]
fn apply_task_event_deferred(
    tx: &Connection,
    task_id: &str,
    loaded: Option<Loaded>,
    event: &TaskEvent,
    exit_code: Option<i32>,
    finish: Finish,
    now: i64,
    source: &str,
    rollups: &mut JobRollups,
) -> Result<Option<TaskState>> {
    // Debug builds (every test) check that a caller's read of the task is what `load_task` reads.
    #[cfg(debug_assertions)]
    if let Some(l) = &loaded {
        let again = load_task(tx, task_id, event)?;
        debug_assert_eq!(again.as_ref(), Some(l), "the caller's read of {task_id}");
    }
    let loaded = match loaded {
        Some(l) => l,
        None => match load_task(tx, task_id, event)? {
            Some(l) => l,
            None => return Ok(None),
        },
    };
    let Some((step, job_id, cascade)) =
        apply_loaded(tx, task_id, loaded, event, exit_code, finish, now, source)?
    else {
        return Ok(None);
    };
    if let Some(c) = cascade {
        let siblings: Vec<String> = {
            let mut st = tx.prepare_cached(&ACTIVE_SIBLINGS)?;
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
            apply_raw(tx, &sib, &ev, None, Finish::AwaitWorker, now, CONTROLLER)?;
        }
    }
    rollups.note(job_id, step.running_job_move());
    Ok(Some(step.task))
}

/// Jobs whose tasks changed during a batch of task transitions (one tick's assignments, one
/// observation-writer transaction), each rolled up once at the end of the batch instead of after
/// every transition: the rollup reads every task of the job, so per transition it cost
/// O(tasks²) per job (BENCHMARKS, C1M). Task transitions never read their job's state, so the
/// only difference is order within the batch: a job that turns terminal part-way kills its
/// unfinished tasks after the batch's other reports of that job are applied, not before.
///
/// A job whose noted steps all leave a started RUNNING job RUNNING
/// ([`iris_types::Step::can_move_a_running_job`]: assignments, RUNNING reports, requeues
/// without a failure) is rolled up without reading its tasks when it is such a job: that is
/// two of every three transitions of a task that succeeds first time. One whose strongest steps
/// are successes ([`RunningJobMove::OnceNoTaskIsLeft`]) reads only whether a task is left.
#[derive(Debug, Default)]
pub struct JobRollups {
    /// Each job noted, and the most its noted steps can do to it while it runs.
    jobs: std::collections::BTreeMap<String, RunningJobMove>,
}

impl JobRollups {
    fn note(&mut self, job_id: String, step: RunningJobMove) {
        let noted = self.jobs.entry(job_id).or_default();
        *noted = (*noted).max(step);
    }

    /// Rolls up every job noted, inside the batch's transaction.
    pub fn finish(self, tx: &Tx<'_>, now: i64) -> Result<()> {
        self.finish_raw(&tx.tx, now)
    }

    fn finish_raw(self, tx: &Connection, now: i64) -> Result<()> {
        for (job_id, step) in &self.jobs {
            recompute_job(tx, job_id, *step, now)?;
        }
        Ok(())
    }
}

/// Where an attempt runs: on a worker daemon (a `workers` row, dialled at its address) or in an
/// in-process backend (Kubernetes), which places work without any worker row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder<'a> {
    /// A worker daemon.
    Worker { id: &'a str, address: &'a str },
    /// An in-process backend, by its id (kept in the attempt's `backend_id`).
    Backend(&'a str),
}

/// Places a pending task on a worker: applies `TaskEvent::Assign`, whose step opens a new attempt
/// (with `uid`) in the state it names. Returns false when the task cannot be placed.
pub fn assign_task(
    tx: &Tx<'_>,
    task_id: &str,
    worker_id: &str,
    worker_address: &str,
    uid: &str,
    band: i32,
    now: i64,
) -> Result<bool> {
    let holder = Holder::Worker {
        id: worker_id,
        address: worker_address,
    };
    assign(tx, task_id, holder, uid, band, now)
}

/// Places a pending task on `holder`: a worker, or an in-process backend (the attempt then has
/// no worker and names the backend in `backend_id`). Returns false when the task cannot be
/// placed.
pub fn assign(
    tx: &Tx<'_>,
    task_id: &str,
    holder: Holder<'_>,
    uid: &str,
    band: i32,
    now: i64,
) -> Result<bool> {
    let mut rollups = JobRollups::default();
    let placed = assign_deferred(tx, task_id, holder, uid, band, now, &mut rollups)?;
    rollups.finish(tx, now)?;
    Ok(placed)
}

/// [`assign`] with the job's rollup left to `rollups` (one per job for a tick's assignments).
pub fn assign_deferred(
    tx: &Tx<'_>,
    task_id: &str,
    holder: Holder<'_>,
    uid: &str,
    band: i32,
    now: i64,
    rollups: &mut JobRollups,
) -> Result<bool> {
    let tx = &tx.tx;
    let Some((row, ctx, _)) = load_task(tx, task_id, &TaskEvent::Assign)? else {
        return Ok(false);
    };
    let Some(step) = step_of(task_id, &ctx, &TaskEvent::Assign) else {
        return Ok(false);
    };
    let (Some(attempt_state), true) = (step.attempt, step.new_attempt) else {
        super::note_illegal("task", task_id, "Assign produced no new attempt");
        return Ok(false);
    };
    let (worker_id, worker_address, backend_id, message) = match holder {
        Holder::Worker { id, address } => (
            Some(id),
            Some(address),
            "default",
            format!("Assigned to worker {id}"),
        ),
        Holder::Backend(id) => (None, None, id, format!("Dispatched to backend {id}")),
    };
    let attempt_id = row.attempt_id + 1;
    tx.prepare_cached(
        "INSERT INTO task_attempts(task_id, attempt_id, worker_id, state, created_at_ms, attempt_uid, backend_id)
         VALUES (?1,?2,?3,?4,?5,?6,?7)",
    )?
    .execute(params![
        task_id,
        attempt_id,
        worker_id,
        attempt_state.code(),
        now,
        uid,
        backend_id
    ])?;
    let event_id = append_event(
        tx,
        task_id,
        Some(attempt_id),
        Some(uid),
        now,
        ["Normal", step.reason, &message, CONTROLLER],
        row.last_event_id,
    )?;
    tx.prepare_cached(
        "UPDATE tasks SET state = ?7, current_attempt_id = ?2, current_worker_id = ?3, current_worker_address = ?4,
            started_at_ms = COALESCE(started_at_ms, ?5), priority_band = ?6, status_message = NULL,
            last_event_id = ?8
         WHERE rowid = ?1",
    )?
    .execute(params![
        row.rowid,
        attempt_id,
        worker_id,
        worker_address,
        now,
        band,
        step.task.code(),
        event_id
    ])?;
    super::note_entered(step.task);
    rollups.note(row.job_id, step.running_job_move());
    Ok(true)
}

/// A worker's observation of one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub attempt_uid: String,
    pub state: TaskState,
    pub exit_code: Option<i32>,
    pub error: String,
    pub status_message: String,
    /// The runtime's id for the attempt's container (empty: not reported).
    pub container_id: String,
}

/// Applies a worker's (or backend's) observation, fenced by attempt uid and holder: the attempt's
/// worker id, or, for an attempt with no worker, its backend id. Returns true when it changed
/// state.
pub fn apply_observation(
    tx: &Tx<'_>,
    worker_id: &str,
    obs: &Observation,
    now: i64,
) -> Result<bool> {
    let mut rollups = JobRollups::default();
    let changed = apply_observation_deferred(tx, worker_id, obs, now, &mut rollups)?;
    rollups.finish(tx, now)?;
    Ok(changed)
}

/// Where [`REPORTED_ATTEMPT`]'s [`TASK_ROW_COLUMNS`] start.
const REPORTED_TASK_AT: usize = 8;

/// The attempt a worker reported on by its uid, with its task ([`TASK_ROW_COLUMNS`] from
/// column [`REPORTED_TASK_AT`]).
static REPORTED_ATTEMPT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT a.task_id, a.attempt_id, COALESCE(a.worker_id, a.backend_id), a.state,
                a.finished_at_ms IS NOT NULL, a.started_at_ms IS NOT NULL, t.container_id,
                t.status_message, {TASK_ROW_COLUMNS}, a.rowid
         FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
         LEFT JOIN job_config c ON c.job_id = t.job_id
         WHERE a.attempt_uid = ?1"
    )
});

/// The attempt a worker reported on, with its task (`None`: the task has no job config).
struct ReportedAttempt {
    task_id: String,
    attempt_id: i64,
    /// Its worker, or for an attempt with no worker, its backend.
    holder: Option<String>,
    state: i32,
    finished: bool,
    /// The task's current attempt id.
    current: i64,
    started: bool,
    task: Option<TaskRow>,
    /// The task's container id and status message: a report that leaves them as they are
    /// writes neither.
    container_id: Option<String>,
    status_message: Option<String>,
}

/// [`apply_observation`] with the job's rollup left to `rollups` (one per job for a batch of
/// reconcile answers).
pub fn apply_observation_deferred(
    tx: &Tx<'_>,
    worker_id: &str,
    obs: &Observation,
    now: i64,
    rollups: &mut JobRollups,
) -> Result<bool> {
    let tx = &tx.tx;
    // The attempt, and with it its task as `load_task` reads it (one lookup of each instead of
    // two: the reported attempt is the task's current one, except for a late report).
    let att: Option<ReportedAttempt> = tx
        .prepare_cached(&REPORTED_ATTEMPT)?
        .query_row([&obs.attempt_uid], |r| {
            // No job config (`c.has_coscheduling` is NULL): `load_task` finds no task either.
            let has_config = r.get::<_, Option<i64>>(REPORTED_TASK_AT + 5)?.is_some();
            Ok(ReportedAttempt {
                task_id: r.get(0)?,
                attempt_id: r.get(1)?,
                holder: r.get(2)?,
                state: r.get(3)?,
                finished: r.get(4)?,
                started: r.get(5)?,
                container_id: r.get(6)?,
                status_message: r.get(7)?,
                current: r.get(REPORTED_TASK_AT + 2)?,
                task: if has_config {
                    Some(task_row(
                        r,
                        REPORTED_TASK_AT,
                        REPORTED_TASK_AT + TASK_ROW_WIDTH,
                    )?)
                } else {
                    None
                },
            })
        })
        .optional()?;
    let Some(ReportedAttempt {
        task_id,
        attempt_id,
        holder: att_worker,
        state: att_state,
        finished,
        current,
        started,
        task,
        container_id,
        status_message,
    }) = att
    else {
        return Ok(false);
    };
    if att_worker.as_deref() != Some(worker_id) {
        return Ok(false);
    }
    let att_state = TaskState::from_code(att_state).unwrap_or(TaskState::Unspecified);
    let reported_terminal = obs.state.is_terminal() || obs.state == TaskState::Missing;
    if attempt_id == current {
        if !obs.container_id.is_empty() && container_id.as_deref() != Some(&obs.container_id) {
            // The current attempt's container, as the reference keeps it: the last one reported.
            tx.prepare_cached("UPDATE tasks SET container_id = ?2 WHERE task_id = ?1")?
                .execute(params![task_id, obs.container_id])?;
        }
        if !obs.status_message.is_empty() {
            if status_message.as_deref() != Some(&obs.status_message) {
                tx.prepare_cached("UPDATE tasks SET status_message = ?2 WHERE task_id = ?1")?
                    .execute(params![task_id, obs.status_message])?;
            }
        } else if obs.state == TaskState::Running && status_message.is_some() {
            // Running: whatever it was waiting for is over.
            tx.prepare_cached("UPDATE tasks SET status_message = NULL WHERE task_id = ?1")?
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
    // The task as read with the attempt, its current one here; an event that reads the retry
    // counts has it read again with them.
    let loaded = task.filter(|_| !ev.reads_retry_counts()).map(|row| {
        let attempt = AttemptCtx {
            state: att_state,
            started,
        };
        loaded_task(row, Some((attempt, obs.attempt_uid.clone())), (0, 0))
    });
    let applied = apply_task_event_deferred(
        tx,
        &task_id,
        loaded,
        &ev,
        exit,
        Finish::Now,
        now,
        src,
        rollups,
    )?;
    Ok(applied.is_some())
}

/// Declares a worker dead: its current attempts go down the WORKER_FAILED path (§2.4), every
/// open attempt on it is finished (superseded ones that still held it end WORKER_FAILED), and its
/// row is removed. Returns the affected tasks.
pub fn fail_worker(tx: &Tx<'_>, worker_id: &str, now: i64) -> Result<Vec<String>> {
    tx.workers_changed.set(true);
    let tx = &tx.tx;
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
            apply_task_event_raw(
                tx,
                &task_id,
                &TaskEvent::WorkerLost,
                None,
                Finish::Now,
                now,
                CONTROLLER,
            )?;
        }
        let state: i32 = tx
            .prepare_cached(
                "SELECT state FROM task_attempts WHERE task_id = ?1 AND attempt_id = ?2",
            )?
            .query_row(params![task_id, attempt_id], |r| r.get(0))?;
        let state = TaskState::from_code(state).unwrap_or(TaskState::Unspecified);
        tx.prepare_cached(
            "UPDATE task_attempts SET finished_at_ms = COALESCE(finished_at_ms, ?3), state = ?4
             WHERE task_id = ?1 AND attempt_id = ?2",
        )?
        .execute(params![
            task_id,
            attempt_id,
            now,
            orphaned_attempt_on_worker_loss(state).code()
        ])?;
        affected.push(task_id);
    }
    tx.prepare_cached(
        "UPDATE tasks SET current_worker_id = NULL, current_worker_address = NULL WHERE current_worker_id = ?1",
    )?
    .execute([worker_id])?;
    tx.prepare_cached("DELETE FROM workers WHERE worker_id = ?1")?
        .execute([worker_id])?;
    Ok(affected)
}
