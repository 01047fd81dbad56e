//! Mirrored federation state: a job this cluster handed to a peer keeps rows here (`cluster =
//! <peer>`) whose states are the peer's, copied as reported. These are the only writes of state
//! columns outside [`crate::apply`]: the peer's own state machine decided them, so they are
//! copied rather than re-derived (Architecture Invariant "mirrored state has one writer").

use crate::federation::root_of;
use crate::sets::{JOB_LIVE, TASK_LIVE_MIRROR};
use crate::{Raw, Result, Tx};
use iris_types::{JobState, TaskState};
use rusqlite::{params, OptionalExtension};
use std::sync::LazyLock;

/// A peer's report of one job, in store terms.
#[derive(Clone, Debug, Default)]
pub struct MirrorJob {
    pub job_id: String,
    pub state: i32,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub num_tasks: i64,
}

#[derive(Clone, Debug, Default)]
pub struct MirrorAttempt {
    pub attempt_id: i64,
    pub state: i32,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub attempt_uid: String,
    pub worker_id: String,
    pub terminal_reason: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct MirrorTask {
    pub task_index: i64,
    pub state: i32,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub current_attempt_id: i64,
    pub worker_address: String,
    pub status_message: Option<String>,
    pub attempts: Vec<MirrorAttempt>,
}

/// The peer reported the job gone: end it locally.
pub fn kill_mirrored(tx: &Tx<'_>, job_id: &str, reason: &str, now: i64) -> Result<()> {
    static JOBS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET state = {}, error = ?2, finished_at_ms = COALESCE(finished_at_ms, ?3)
             WHERE (job_id = ?1 OR (job_id >= ?1 || '/' AND job_id < ?1 || '0')) AND state IN {}",
            JobState::Killed.code(),
            *JOB_LIVE
        )
    });
    static TASKS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE tasks SET state = {}, error = ?2, finished_at_ms = COALESCE(finished_at_ms, ?3)
             WHERE task_id >= ?1 || '/' AND task_id < ?1 || '0' AND state IN {}",
            TaskState::Killed.code(),
            *TASK_LIVE_MIRROR
        )
    });
    let tx = tx.raw();
    tx.prepare_cached(&JOBS)?
        .execute(params![job_id, reason, now])?;
    tx.prepare_cached(&TASKS)?
        .execute(params![job_id, reason, now])?;
    Ok(())
}

/// Every event of the tasks of the descendants of a job (`?1`), not of the job's own tasks.
static DESCENDANT_EVENTS: LazyLock<String> =
    LazyLock::new(|| crate::events::delete_chains("job_id >= ?1 || '/' AND job_id < ?1 || '0'"));

/// The peer no longer has a root it accepted (it restarted from a state older than the
/// handoff): the mirror is wound back to an undelivered root, so that delivery sends it again.
/// Mirrored descendants go; the root's tasks are PENDING again without attempts, their status
/// saying why; the root is PENDING. A root that already ended here is left as it is (`false`).
pub fn reset_for_redelivery(tx: &Tx<'_>, job_id: &str, note: &str) -> Result<bool> {
    static ROOT: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET state = {}, error = NULL, exit_code = NULL, started_at_ms = NULL,
                 finished_at_ms = NULL
             WHERE job_id = ?1 AND state IN {}",
            JobState::Pending.code(),
            *JOB_LIVE
        )
    });
    static TASKS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE tasks SET state = {}, error = NULL, exit_code = NULL, started_at_ms = NULL,
                 finished_at_ms = NULL, current_attempt_id = -1, current_worker_address = NULL,
                 status_message = ?2
             WHERE job_id = ?1",
            TaskState::Pending.code()
        )
    });
    let raw = tx.raw();
    if raw.prepare_cached(&ROOT)?.execute([job_id])? == 0 {
        return Ok(false);
    }
    // Descendants (ids in [root/, root0)) with their events and endpoints; their tasks and
    // attempts follow by cascade.
    raw.prepare_cached("DELETE FROM endpoints WHERE job_id >= ?1 || '/' AND job_id < ?1 || '0'")?
        .execute([job_id])?;
    raw.prepare_cached(&DESCENDANT_EVENTS)?.execute([job_id])?;
    raw.prepare_cached("DELETE FROM jobs WHERE job_id >= ?1 || '/' AND job_id < ?1 || '0'")?
        .execute([job_id])?;
    raw.prepare_cached(
        "DELETE FROM task_attempts WHERE task_id IN (SELECT task_id FROM tasks WHERE job_id = ?1)",
    )?
    .execute([job_id])?;
    raw.prepare_cached(&TASKS)?.execute(params![job_id, note])?;
    Ok(true)
}

/// Deletes a mirrored job (a peer tombstone).
pub fn delete_mirrored(tx: &Tx<'_>, job_id: &str) -> Result<()> {
    crate::apply::delete_job_raw(tx.raw(), job_id)
}

/// Upserts a mirrored job and the given tasks with their attempts. A child the parent has not
/// seen is created from its parent's row (user, band, root submit time) with `cluster = peer`.
pub fn apply_mirror(
    tx: &Tx<'_>,
    peer: &str,
    job: &MirrorJob,
    tasks: &[MirrorTask],
    now: i64,
) -> Result<()> {
    let tx = tx.raw();
    let exists: bool = tx
        .prepare_cached("SELECT EXISTS(SELECT 1 FROM jobs WHERE job_id = ?1)")?
        .query_row([&job.job_id], |r| r.get(0))?;
    if !exists {
        let parent = match job.job_id.rsplit_once('/') {
            Some((p, _)) if !p.is_empty() => p.to_string(),
            _ => return Ok(()),
        };
        let seed: Option<(String, String, i64, i64, i32)> = tx
            .prepare_cached(
                "SELECT j.user_id, j.submitting_user, j.root_submitted_at_ms, j.depth, c.priority_band
                 FROM jobs j JOIN job_config c ON c.job_id = j.job_id WHERE j.job_id = ?1",
            )?
            .query_row([&parent], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .optional()?;
        let Some((user, submitting, root_ms, depth, band)) = seed else {
            // Parent not mirrored yet: deltas arrive ordered by depth, so this is a gap; the next
            // full snapshot fills it.
            return Ok(());
        };
        tx.prepare_cached(
            "INSERT INTO jobs(job_id, user_id, submitting_user, parent_job_id, root_job_id, depth, state,
                submitted_at_ms, root_submitted_at_ms, num_tasks, name, backend_id, cluster)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'peer', ?12)",
        )?
        .execute(params![
            job.job_id,
            user,
            submitting,
            parent,
            root_of(&job.job_id),
            depth + 1,
            job.state,
            now,
            root_ms,
            job.num_tasks,
            job.job_id.to_lowercase(),
            peer
        ])?;
        crate::federation::log_received_child(tx, &job.job_id, &root_of(&job.job_id), depth + 1)?;
        tx.prepare_cached(
            "INSERT INTO job_config(job_id, priority_band, request_blob) VALUES (?1, ?2, x'')",
        )?
        .execute(params![job.job_id, band])?;
    }
    tx.prepare_cached(
        "UPDATE jobs SET state = ?2, error = ?3, exit_code = ?4, started_at_ms = ?5,
             finished_at_ms = ?6, num_tasks = ?7, cluster = ?8
         WHERE job_id = ?1",
    )?
    .execute(params![
        job.job_id,
        job.state,
        job.error,
        job.exit_code,
        job.started_at_ms,
        job.finished_at_ms,
        job.num_tasks,
        peer
    ])?;
    let (band, depth, root_ms, submitted): (i32, i64, i64, i64) = tx
        .prepare_cached(
            "SELECT c.priority_band, j.depth, j.root_submitted_at_ms, j.submitted_at_ms
             FROM jobs j JOIN job_config c ON c.job_id = j.job_id WHERE j.job_id = ?1",
        )?
        .query_row([&job.job_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?;
    for t in tasks {
        let task_id = format!("{}/{}", job.job_id, t.task_index);
        tx.prepare_cached(
            "INSERT INTO tasks(task_id, job_id, task_index, state, error, exit_code, submitted_at_ms,
                started_at_ms, finished_at_ms, max_retries_failure, max_retries_preemption,
                current_attempt_id, priority_neg_depth, priority_root_submitted_ms, priority_insertion,
                priority_band, status_message, current_worker_address, backend_id, cluster)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, 0, ?10, ?11, ?12, 0, ?13, ?14, ?15, 'peer', ?16)
             ON CONFLICT(task_id) DO UPDATE SET state = excluded.state, error = excluded.error,
                exit_code = excluded.exit_code, started_at_ms = excluded.started_at_ms,
                finished_at_ms = excluded.finished_at_ms, current_attempt_id = excluded.current_attempt_id,
                status_message = excluded.status_message, current_worker_address = excluded.current_worker_address",
        )?
        .execute(params![
            task_id,
            job.job_id,
            t.task_index,
            t.state,
            t.error,
            t.exit_code,
            submitted,
            t.started_at_ms,
            t.finished_at_ms,
            t.current_attempt_id,
            -depth,
            root_ms,
            band,
            t.status_message,
            t.worker_address,
            peer
        ])?;
        for a in &t.attempts {
            // A new attempt goes in UNSPECIFIED and then takes the peer's state by update: the
            // job's failed-attempt count is kept by the update trigger alone, as no attempt is
            // ever inserted FAILED (migration 0011 dropped the insert trigger).
            tx.prepare_cached(
                "INSERT INTO task_attempts(task_id, attempt_id, worker_id, state, created_at_ms, started_at_ms,
                    finished_at_ms, exit_code, error, attempt_uid, backend_id, node_name, terminal_reason)
                 VALUES (?1, ?2, NULL, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'peer', ?10, ?11)
                 ON CONFLICT(task_id, attempt_id) DO UPDATE SET
                    started_at_ms = excluded.started_at_ms, finished_at_ms = excluded.finished_at_ms,
                    exit_code = excluded.exit_code, error = excluded.error,
                    node_name = excluded.node_name, terminal_reason = excluded.terminal_reason",
            )?
            .execute(params![
                task_id,
                a.attempt_id,
                TaskState::Unspecified.code(),
                a.started_at_ms.unwrap_or(now),
                a.started_at_ms,
                a.finished_at_ms,
                a.exit_code,
                a.error,
                a.attempt_uid,
                a.worker_id,
                a.terminal_reason
            ])?;
            tx.prepare_cached(
                "UPDATE task_attempts SET state = ?3
                 WHERE task_id = ?1 AND attempt_id = ?2 AND state IS NOT ?3",
            )?
            .execute(params![task_id, a.attempt_id, a.state])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::{insert_job, NewJob};
    use crate::Db;

    fn failed_attempts(db: &mut Db, job: &str) -> i64 {
        let tx = db.begin().expect("begin");
        tx.raw()
            .query_row(
                "SELECT failed_attempts FROM jobs WHERE job_id = ?1",
                [job],
                |r| r.get(0),
            )
            .expect("count")
    }

    /// A job's failed-attempt count follows the peer's attempts though no attempt is inserted
    /// FAILED (the insert goes in UNSPECIFIED, the update trigger counts): once per FAILED
    /// attempt, not again when the same report comes back, and down when a peer's attempt leaves
    /// FAILED.
    #[test]
    fn a_mirrored_failed_attempt_counts_once() {
        let mut db = Db::open_in_memory().expect("db");
        let job = "/alice/sent";
        {
            let tx = db.begin().expect("begin");
            let new = NewJob {
                job_id: job.into(),
                user_id: "alice".into(),
                submitting_user: "alice".into(),
                root_job_id: job.into(),
                depth: 1,
                num_tasks: 1,
                ..Default::default()
            };
            insert_job(&tx, &new, 1_000).expect("insert");
            tx.commit().expect("commit");
        }
        let attempt = |id: i64, state: TaskState| MirrorAttempt {
            attempt_id: id,
            state: state.code(),
            attempt_uid: format!("uid-{id}"),
            worker_id: "peer-w".into(),
            ..Default::default()
        };
        let report = |attempts: Vec<MirrorAttempt>| MirrorTask {
            task_index: 0,
            state: TaskState::Pending.code(),
            current_attempt_id: attempts.len() as i64 - 1,
            attempts,
            ..Default::default()
        };
        let mirror = |db: &mut Db, task: MirrorTask| {
            let tx = db.begin().expect("begin");
            let j = MirrorJob {
                job_id: job.into(),
                state: JobState::Running.code(),
                num_tasks: 1,
                ..Default::default()
            };
            apply_mirror(&tx, "peer", &j, &[task], 2_000).expect("mirror");
            tx.commit().expect("commit");
        };
        mirror(&mut db, report(vec![attempt(0, TaskState::Failed)]));
        assert_eq!(
            failed_attempts(&mut db, job),
            1,
            "a new FAILED attempt counts"
        );
        mirror(&mut db, report(vec![attempt(0, TaskState::Failed)]));
        assert_eq!(
            failed_attempts(&mut db, job),
            1,
            "the same report again does not"
        );
        mirror(
            &mut db,
            report(vec![
                attempt(0, TaskState::Failed),
                attempt(1, TaskState::Failed),
            ]),
        );
        assert_eq!(
            failed_attempts(&mut db, job),
            2,
            "a second FAILED attempt counts"
        );
        mirror(
            &mut db,
            report(vec![
                attempt(0, TaskState::Failed),
                attempt(1, TaskState::Succeeded),
            ]),
        );
        assert_eq!(
            failed_attempts(&mut db, job),
            1,
            "one that left FAILED no longer"
        );
    }
}
