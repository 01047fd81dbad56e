//! Task events (`task events`): one row per controller decision or backend verdict. Not state:
//! the event log explains state changes, it never decides them.

use crate::{Raw, Result, Tx};
use rusqlite::{params, Connection, OptionalExtension};

/// Records a task event, for a caller that writes nothing else to the task's row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn insert_event(
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
    let prev: Option<i64> = tx
        .prepare_cached("SELECT last_event_id FROM tasks WHERE task_id = ?1")?
        .query_row([task_id], |r| r.get(0))
        .optional()?
        .flatten();
    let id = append_event(
        tx,
        task_id,
        attempt_id,
        attempt_uid,
        now,
        [kind, reason, message, source],
        prev,
    )?;
    // `OR FAIL`: see "No statement journal" in `apply`.
    tx.prepare_cached("UPDATE OR FAIL tasks SET last_event_id = ?2 WHERE task_id = ?1")?
        .execute(params![task_id, id])?;
    Ok(())
}

/// Appends a task event (`kind`, `reason`, `message`, `source`) to its task's chain after `prev`,
/// the task's `last_event_id` as the caller read it, and returns its id, which the caller must
/// write to the task's `last_event_id` in the same transaction.
///
/// A task's events are a chain, newest first: the task row names its newest event and each
/// event the one before it (migration 0014). An index of events by task was a B-tree insert at
/// a scattered place for every event, and most pages a transition's commit wrote (BENCHMARKS.md,
/// C1M); the chain's writes land on the task row a transition writes anyway and on the events
/// table's last page.
pub(crate) fn append_event(
    tx: &Connection,
    task_id: &str,
    attempt_id: Option<i64>,
    attempt_uid: Option<&str>,
    now: i64,
    [kind, reason, message, source]: [&str; 4],
    prev: Option<i64>,
) -> Result<i64> {
    tx.prepare_cached(
        "INSERT INTO task_events(task_id, attempt_id, attempt_uid, ts_ms, type, reason, message, source, prev_id)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)",
    )?
    .execute(params![task_id, attempt_id, attempt_uid, now, kind, reason, message, source, prev])?;
    Ok(tx.last_insert_rowid())
}

/// `chain(id)`: the ids of every event of the tasks `tasks_where` selects (a condition on
/// `tasks`, with its own parameters), found by walking each task's chain from its newest event.
pub(crate) fn chain_cte(tasks_where: &str) -> String {
    format!(
        "WITH RECURSIVE chain(id) AS (
           SELECT last_event_id FROM tasks WHERE ({tasks_where}) AND last_event_id IS NOT NULL
           UNION ALL SELECT e.prev_id FROM task_events e JOIN chain c ON e.id = c.id
           WHERE e.prev_id IS NOT NULL)"
    )
}

/// The statement that deletes every event of the tasks `tasks_where` selects: run it before the
/// tasks themselves go, as their rows lead to their events.
pub(crate) fn delete_chains(tasks_where: &str) -> String {
    format!(
        "{} DELETE FROM task_events WHERE id IN (SELECT id FROM chain)",
        chain_cte(tasks_where)
    )
}

/// Records an event a backend observed (`kind`, `reason`, `message`, `source`) against the
/// attempt it names; returns false (and records nothing) for an attempt this controller does not
/// know.
pub fn record_attempt_event(
    tx: &Tx<'_>,
    attempt_uid: &str,
    [kind, reason, message, source]: [&str; 4],
    now: i64,
) -> Result<bool> {
    let Some((task, attempt)) = attempt_identity(tx, attempt_uid)? else {
        return Ok(false);
    };
    insert_event(
        tx.raw(),
        &task,
        Some(attempt),
        Some(attempt_uid),
        now,
        kind,
        reason,
        message,
        source,
    )?;
    Ok(true)
}

/// A stored task event, as the stats mirror copies it to `iris.task_event`.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredEvent {
    pub id: i64,
    pub task_id: String,
    pub attempt_id: Option<i64>,
    pub attempt_uid: Option<String>,
    pub ts_ms: i64,
    pub kind: String,
    pub reason: String,
    pub message: String,
    pub source: String,
}

/// Up to `limit` events recorded after event `after` (by id), oldest first, and the highest id
/// stored (0 when there are none).
pub fn since(db: &impl crate::Read, after: i64, limit: usize) -> Result<(Vec<StoredEvent>, i64)> {
    let conn = db.raw();
    let newest: i64 = conn.query_row("SELECT coalesce(max(id), 0) FROM task_events", [], |r| {
        r.get(0)
    })?;
    let rows = conn
        .prepare_cached(
            "SELECT id, task_id, attempt_id, attempt_uid, ts_ms, type, reason, message, source
             FROM task_events WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?
        .query_map(params![after, limit as i64], |r| {
            Ok(StoredEvent {
                id: r.get(0)?,
                task_id: r.get(1)?,
                attempt_id: r.get(2)?,
                attempt_uid: r.get(3)?,
                ts_ms: r.get(4)?,
                kind: r.get(5)?,
                reason: r.get(6)?,
                message: r.get(7)?,
                source: r.get(8)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok((rows, newest))
}

/// The task and attempt number of the attempt with `attempt_uid`, if this controller knows it.
pub fn attempt_identity(db: &impl crate::Read, attempt_uid: &str) -> Result<Option<(String, i64)>> {
    Ok(db
        .raw()
        .prepare_cached("SELECT task_id, attempt_id FROM task_attempts WHERE attempt_uid = ?1")?
        .query_row([attempt_uid], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}
