//! Task events (`task events`): one row per controller decision or backend verdict. Not state:
//! the event log explains state changes, it never decides them.

use crate::{Raw, Result, Tx};
use rusqlite::{params, Connection, OptionalExtension};

/// Records a task event.
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
    tx.prepare_cached(
        "INSERT INTO task_events(task_id, attempt_id, attempt_uid, ts_ms, type, reason, message, source)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8)",
    )?
    .execute(params![task_id, attempt_id, attempt_uid, now, kind, reason, message, source])?;
    Ok(())
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
    let tx = tx.raw();
    let row: Option<(String, i64)> = tx
        .prepare_cached("SELECT task_id, attempt_id FROM task_attempts WHERE attempt_uid = ?1")?
        .query_row([attempt_uid], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((task, attempt)) = row else {
        return Ok(false);
    };
    insert_event(
        tx,
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
