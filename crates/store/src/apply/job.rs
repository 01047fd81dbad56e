//! Job-level transitions: every write of `jobs.state` is a [`JobEvent`] applied here through
//! `iris_types::job_transition`, and whatever the step implies for the job's tasks goes through
//! the task state machine.

use super::task::{apply_raw, Finish};
use crate::sets::{JOB_TERMINAL, TASK_TERMINAL};
use crate::{Result, Tx};
use iris_types::{
    job_state, job_transition, terminates_children, ErrorUpdate, JobCtx, JobEvent, JobRejected,
    JobState, RunningJobMove, TaskEvent, TaskState,
};
use rusqlite::{params, Connection, OptionalExtension};
use std::sync::LazyLock;

const CONTROLLER: &str = "iris/controller";

/// A job's new state (`OR FAIL`: see "No statement journal" in `apply`).
pub(crate) const SAVE_JOB_STATE: &str = "UPDATE OR FAIL jobs SET state = ?2,
        error = CASE ?3 WHEN 0 THEN error WHEN 1 THEN NULL ELSE ?4 END,
        started_at_ms = CASE WHEN ?5 THEN COALESCE(started_at_ms, ?7) ELSE started_at_ms END,
        finished_at_ms = CASE WHEN ?6 THEN COALESCE(finished_at_ms, ?7) ELSE finished_at_ms END
     WHERE job_id = ?1";

/// Applies one job event (no recomputation, no children). Returns the new state, or `None` when
/// the job does not exist or the event does not apply.
pub(crate) fn apply_job_raw(
    tx: &Connection,
    job_id: &str,
    event: &JobEvent,
    now: i64,
) -> Result<Option<JobState>> {
    let cur: Option<i32> = tx
        .prepare_cached("SELECT state FROM jobs WHERE job_id = ?1")?
        .query_row([job_id], |r| r.get(0))
        .optional()?;
    let Some(cur) = cur else { return Ok(None) };
    let cur = JobState::from_code(cur).unwrap_or(JobState::Unspecified);
    let step = match job_transition(cur, event) {
        Ok(s) => s,
        Err(JobRejected::NoChange) | Err(JobRejected::Terminal(_)) => return Ok(None),
        Err(e @ JobRejected::Illegal { .. }) => {
            super::note_illegal("job", job_id, &e.to_string());
            return Ok(None);
        }
    };
    let (error_mode, error) = match &step.error {
        ErrorUpdate::Keep => (0, None),
        ErrorUpdate::Clear => (1, None),
        ErrorUpdate::Set(e) => (2, Some(e.as_str())),
    };
    tx.prepare_cached(SAVE_JOB_STATE)?.execute(params![
        job_id,
        step.state.code(),
        error_mode,
        error,
        step.stamp_started,
        step.stamp_finished,
        now
    ])?;
    let task_event = if let Some(reason) = &step.kill_tasks {
        Some(TaskEvent::Kill {
            reason: reason.clone(),
        })
    } else if let Some(reason) = &step.finalize_tasks {
        Some(TaskEvent::JobFinalized {
            reason: reason.clone(),
        })
    } else if step.complete_tasks {
        Some(TaskEvent::Complete)
    } else {
        None
    };
    if let Some(ev) = task_event {
        let exit = step.complete_tasks.then_some(0);
        for t in unfinished_tasks(tx, job_id)? {
            apply_raw(tx, &t, &ev, exit, Finish::AwaitWorker, now, CONTROLLER)?;
        }
    }
    Ok(Some(step.state))
}

/// Applies a job event that is not about its tasks (federation verdicts). Returns whether it
/// applied.
pub fn apply_job_event(tx: &Tx<'_>, job_id: &str, event: &JobEvent, now: i64) -> Result<bool> {
    Ok(apply_job_raw(&tx.tx, job_id, event, now)?.is_some())
}

static FIRST_FAILED_ATTEMPT_ERROR: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT a.error FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
         WHERE t.job_id = ?1 AND a.state = {} ORDER BY a.finished_at_ms, a.task_id LIMIT 1",
        TaskState::Failed.code()
    )
});

/// The task error that explains a job's failure: among tasks that ended other than SUCCEEDED
/// with an error, FAILED ones first, then by finish time (none first, as SQLite orders NULL),
/// then index. Fed row by row, so the rollup's one pass over the tasks finds it.
#[derive(Default)]
struct FirstTaskError {
    best: Option<(ErrorRank, String)>,
}

/// Smaller explains first: not FAILED, has a finish time, the finish time, the task index.
type ErrorRank = (bool, bool, Option<i64>, i64);

impl FirstTaskError {
    /// Considers a task in `state`; `rest` reads its (error, finished_at_ms, task_index) only if
    /// the state can explain a failure.
    fn offer(
        &mut self,
        state: TaskState,
        rest: impl FnOnce() -> rusqlite::Result<(Option<String>, Option<i64>, i64)>,
    ) -> rusqlite::Result<()> {
        if !state.is_terminal() || state == TaskState::Succeeded {
            return Ok(());
        }
        let (error, finished, index) = rest()?;
        let Some(error) = error else {
            return Ok(());
        };
        let key = (
            state != TaskState::Failed,
            finished.is_some(),
            finished,
            index,
        );
        if self.best.as_ref().is_none_or(|(k, _)| key < *k) {
            self.best = Some((key, error));
        }
        Ok(())
    }

    fn into_error(self) -> Option<String> {
        self.best.map(|(_, e)| e)
    }
}

/// Recomputes a job's state from its tasks (§2.6) and applies it as [`JobEvent::Recomputed`];
/// a job that went terminal finalizes its remaining tasks and, per its preemption policy, its
/// descendants. `steps` is the most the task steps since the job's last rollup can do to a
/// started RUNNING job ([`iris_types::Step::running_job_move`]): such a job keeps its state
/// without its tasks being read when they cannot move it, or when they are successes and one of
/// its tasks is still unfinished (at C1M shape, reading every task of the job for each batch
/// that finished one of them was 6% of the controller's CPU).
pub(crate) fn recompute_job(
    tx: &Connection,
    job_id: &str,
    steps: RunningJobMove,
    now: i64,
) -> Result<()> {
    let row: Option<(i32, bool, i64, i32, i64, i64)> = tx
        .prepare_cached(
            "SELECT j.state, j.started_at_ms IS NOT NULL, c.max_task_failures, c.preemption_policy,
                    j.num_tasks, j.failed_attempts
             FROM jobs j JOIN job_config c ON c.job_id = j.job_id WHERE j.job_id = ?1",
        )?
        .query_row([job_id], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .optional()?;
    let Some((cur, started, max_task_failures, policy, num_tasks, failed_attempts)) = row else {
        return Ok(());
    };
    let cur = JobState::from_code(cur).unwrap_or(JobState::Unspecified);
    if cur.is_terminal() {
        return Ok(());
    }
    if cur == JobState::Running && started {
        let stays = match steps {
            RunningJobMove::Cannot => true,
            RunningJobMove::OnceNoTaskIsLeft => {
                failed_attempts <= max_task_failures && has_unfinished_task(tx, job_id)?
            }
            RunningJobMove::May => false,
        };
        if stays {
            return Ok(());
        }
    }
    // One pass over the job's tasks gives both their states and the first task error.
    let mut states: Vec<TaskState> = Vec::with_capacity(num_tasks.max(0) as usize);
    let mut first_error = FirstTaskError::default();
    {
        let mut st = tx.prepare_cached(
            "SELECT state, error, finished_at_ms, task_index FROM tasks WHERE job_id = ?1 ORDER BY task_index",
        )?;
        let mut rows = st.query([job_id])?;
        while let Some(r) = rows.next()? {
            let state = TaskState::from_code(r.get(0)?).unwrap_or(TaskState::Unspecified);
            states.push(state);
            first_error.offer(state, || Ok((r.get(1)?, r.get(2)?, r.get(3)?)))?;
        }
    }
    let ctx = |first_error| JobCtx {
        tasks: &states,
        failed_attempts: failed_attempts.max(0) as u32,
        max_task_failures: max_task_failures.max(0) as u32,
        ever_started: started,
        first_error,
    };
    // `job_state` picks the state without looking at the error (the error only words the
    // verdict), so the error, which may take a search of the job's attempts, is looked up
    // only for a verdict that carries one.
    let (next, _) = job_state(&ctx(None));
    if next == cur && (next != JobState::Running || started) {
        return Ok(());
    }
    let error = if next.is_terminal() {
        let first_failed_attempt_error: Option<String> = if failed_attempts > 0 {
            tx.prepare_cached(&FIRST_FAILED_ATTEMPT_ERROR)?
                .query_row([job_id], |r| r.get(0))
                .optional()?
                .flatten()
        } else {
            None
        };
        let err_src = first_failed_attempt_error.or(first_error.into_error());
        let (again, error) = job_state(&ctx(err_src.as_deref()));
        debug_assert_eq!(again, next, "the error changed the job's verdict");
        error
    } else {
        None
    };
    let applied = apply_job_raw(tx, job_id, &JobEvent::Recomputed { next, error }, now)?;
    if applied.is_some_and(|s| s.is_terminal()) && terminates_children(next, policy, num_tasks) {
        kill_unfinished_children(tx, job_id, now)?;
    }
    Ok(())
}

static UNFINISHED_TASKS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT task_id FROM tasks WHERE job_id = ?1 AND state NOT IN {} ORDER BY task_index",
        *TASK_TERMINAL
    )
});
static UNFINISHED_CHILDREN: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT job_id FROM jobs WHERE parent_job_id = ?1 AND state NOT IN {}",
        *JOB_TERMINAL
    )
});

/// The job's last task (by index) that is not terminal: tasks are placed in index order, so
/// while a job runs its last one is usually unfinished and this reads one index entry and one
/// row (backwards over the `(job_id, task_index)` index). Read for every job a success touches,
/// so its states are compared without a temporary B-tree (`sets::tasks_matching`).
static LAST_UNFINISHED_TASK: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT task_index FROM tasks WHERE job_id = ?1 AND ({})
         ORDER BY task_index DESC LIMIT 1",
        crate::sets::tasks_matching("state", |s| !s.is_terminal())
    )
});

/// Whether any of the job's tasks is not terminal.
fn has_unfinished_task(tx: &Connection, job_id: &str) -> Result<bool> {
    Ok(tx
        .prepare_cached(&LAST_UNFINISHED_TASK)?
        .query_row([job_id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// The job's tasks that are not terminal, in index order.
pub(crate) fn unfinished_tasks(tx: &Connection, job_id: &str) -> Result<Vec<String>> {
    let mut st = tx.prepare_cached(&UNFINISHED_TASKS)?;
    let rows = st.query_map([job_id], |r| r.get(0))?;
    Ok(rows.collect::<std::result::Result<_, _>>()?)
}

/// The job's direct children that are not terminal.
fn unfinished_children(tx: &Connection, job_id: &str) -> Result<Vec<String>> {
    let mut st = tx.prepare_cached(&UNFINISHED_CHILDREN)?;
    let rows = st.query_map([job_id], |r| r.get(0))?;
    Ok(rows.collect::<std::result::Result<_, _>>()?)
}

/// Kills the job's unfinished children with their subtrees ("Parent job terminated").
fn kill_unfinished_children(tx: &Connection, job_id: &str, now: i64) -> Result<()> {
    for c in unfinished_children(tx, job_id)? {
        let reason = "Parent job terminated";
        kill_subtree_raw(tx, &c, reason, reason, now)?;
    }
    Ok(())
}

/// Kills a job and all its descendants (§2.7). Returns false if the job does not exist.
pub fn kill_subtree(
    tx: &Tx<'_>,
    job_id: &str,
    root_reason: &str,
    child_reason: &str,
    now: i64,
) -> Result<bool> {
    kill_subtree_raw(&tx.tx, job_id, root_reason, child_reason, now)
}

pub(crate) fn kill_subtree_raw(
    tx: &Connection,
    job_id: &str,
    root_reason: &str,
    child_reason: &str,
    now: i64,
) -> Result<bool> {
    let jobs: Vec<String> = {
        let mut st = tx.prepare_cached(
            "SELECT job_id FROM jobs WHERE job_id = ?1 OR (job_id >= ?1 || '/' AND job_id < ?1 || '0')
             ORDER BY depth",
        )?;
        let rows = st.query_map([job_id], |r| r.get(0))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    if jobs.is_empty() {
        return Ok(false);
    }
    for jid in &jobs {
        let reason = if jid == job_id {
            root_reason
        } else {
            child_reason
        };
        let killed = apply_job_raw(
            tx,
            jid,
            &JobEvent::Kill {
                reason: reason.to_string(),
            },
            now,
        )?;
        if killed.is_some() {
            tx.prepare_cached("DELETE FROM endpoints WHERE job_id = ?1")?
                .execute([jid])?;
        }
    }
    Ok(true)
}

/// Marks a job and its unfinished tasks SUCCEEDED (`CompleteJob`); kills descendants. Returns
/// false if the job does not exist.
pub fn complete_job(tx: &Tx<'_>, job_id: &str, now: i64) -> Result<bool> {
    let tx = &tx.tx;
    let exists: bool = tx
        .prepare_cached("SELECT EXISTS(SELECT 1 FROM jobs WHERE job_id = ?1)")?
        .query_row([job_id], |r| r.get(0))?;
    if !exists {
        return Ok(false);
    }
    if apply_job_raw(tx, job_id, &JobEvent::Complete, now)?.is_some() {
        kill_unfinished_children(tx, job_id, now)?;
    }
    Ok(true)
}

#[cfg(test)]
mod first_error_tests {
    use super::*;
    use crate::sets::tasks_where;

    /// The SQL this rollup used before it read the tasks once (kept as the oracle).
    fn by_sql(conn: &Connection) -> Option<String> {
        let sql = format!(
            "SELECT error FROM t WHERE error IS NOT NULL AND state IN {}
             ORDER BY (state = {}) DESC, finished_at_ms, task_index LIMIT 1",
            tasks_where(|s| s.is_terminal() && s != TaskState::Succeeded),
            TaskState::Failed.code()
        );
        conn.query_row(&sql, [], |r| r.get(0))
            .optional()
            .ok()
            .flatten()
    }

    #[test]
    fn one_pass_picks_the_error_the_sql_ordering_picked() {
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let conn = Connection::open_in_memory().expect("db");
        conn.execute_batch(
            "CREATE TABLE t (task_index INTEGER, state INTEGER, error TEXT, finished_at_ms INTEGER)",
        )
        .expect("table");
        for case in 0..500 {
            conn.execute("DELETE FROM t", []).expect("clear");
            let mut pass = FirstTaskError::default();
            for index in 0..(1 + next(8) as i64) {
                let state = TaskState::ALL[next(TaskState::ALL.len() as u64) as usize];
                let error = (next(3) > 0).then(|| format!("e{case}-{index}"));
                let finished = (next(3) > 0).then(|| next(4) as i64);
                conn.execute(
                    "INSERT INTO t VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![index, state.code(), error, finished],
                )
                .expect("row");
                pass.offer(state, || Ok((error.clone(), finished, index)))
                    .expect("offer");
            }
            assert_eq!(pass.into_error(), by_sql(&conn), "case {case}");
        }
    }
}
