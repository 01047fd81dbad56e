//! Federation rows (reference federation-k8s §1.3): `federated_jobs` handles on both sides, the
//! peer's per-requester change log (written by triggers from migration `0003_federation`, so no
//! mutation path can forget it), the parent's sync cursors, and mirroring a peer's job, task and
//! attempt state into the parent's own tables.

use crate::apply::apply_job_event;
use crate::sets::{JOB_LIVE, JOB_NOT_STARTED};
use crate::{Raw, Read, Result, Tx};
use iris_types::JobEvent;
use rusqlite::{params, OptionalExtension};
use std::sync::LazyLock;

/// `federated_jobs.direction`: this cluster handed the job to a peer.
pub const SENT: i64 = 0;
/// `federated_jobs.direction`: this cluster received the job from a requester.
pub const RECEIVED: i64 = 1;

/// Persisted handoff states (`HandoffState`).
pub const QUEUED: i64 = 3;
pub const PENDING: i64 = 0;
pub const HANDED_OFF: i64 = 1;
pub const REJECTED: i64 = 2;

/// One `federated_jobs` row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handle {
    pub job_id: String,
    pub direction: i64,
    pub peer_id: String,
    pub owner_principal: String,
    pub handoff_state: i64,
    pub cancel_intent_version: i64,
    pub nonce: String,
    pub backend_id: String,
    pub generation: i64,
    pub last_error: Option<String>,
    /// When the peer accepted it.
    pub handed_off_at_ms: Option<i64>,
}

const HANDLE_COLS: &str = "job_id, direction, peer_id, owner_principal, handoff_state, cancel_intent_version, handoff_nonce, backend_id, generation, last_error, handed_off_at_ms";

fn handle_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Handle> {
    Ok(Handle {
        job_id: r.get(0)?,
        direction: r.get(1)?,
        peer_id: r.get(2)?,
        owner_principal: r.get(3)?,
        handoff_state: r.get(4)?,
        cancel_intent_version: r.get(5)?,
        nonce: r.get(6)?,
        backend_id: r.get(7)?,
        generation: r.get(8)?,
        last_error: r.get(9)?,
        handed_off_at_ms: r.get(10)?,
    })
}

/// Inserts a handle (after the job row).
pub fn insert_handle(
    tx: &Tx<'_>,
    job_id: &str,
    direction: i64,
    peer_id: &str,
    owner: &str,
    state: i64,
    nonce: &str,
) -> Result<()> {
    tx.raw().prepare_cached(
        "INSERT INTO federated_jobs(job_id, direction, peer_id, owner_principal, handoff_state, handoff_nonce)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![job_id, direction, peer_id, owner, state, nonce])?;
    if direction == RECEIVED {
        ensure_change_log(tx.raw())?;
    }
    Ok(())
}

/// Creates the change log's triggers (`schema::CHANGE_LOG_TRIGGERS`) if this DB holds a job
/// received from a hub and they are missing (migration 0015): a cluster no hub ever used runs
/// no trigger on its job, task and attempt updates.
pub(crate) fn ensure_change_log(conn: &rusqlite::Connection) -> Result<()> {
    let (received, triggers): (bool, i64) = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM federated_jobs WHERE direction = ?1),
                (SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name IN (
                   'federation_log_job_update', 'federation_log_job_delete',
                   'federation_log_task_update', 'federation_log_attempt_change'))",
        [RECEIVED],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if received && triggers < 4 {
        conn.execute_batch(crate::schema::CHANGE_LOG_TRIGGERS)?;
    }
    Ok(())
}

/// The handle of `job_id` itself.
pub fn handle(conn: &impl Read, job_id: &str) -> Result<Option<Handle>> {
    Ok(conn
        .raw()
        .prepare_cached(&format!(
            "SELECT {HANDLE_COLS} FROM federated_jobs WHERE job_id = ?1"
        ))?
        .query_row([job_id], handle_row)
        .optional()?)
}

/// Every handle of a job whose id starts with `id_prefix` (empty: all), by job id, then
/// direction.
pub fn handles(conn: &impl Read, id_prefix: &str) -> Result<Vec<Handle>> {
    let mut st = conn.raw().prepare_cached(&format!(
        "SELECT {HANDLE_COLS} FROM federated_jobs
         WHERE ?1 = '' OR substr(job_id, 1, length(?1)) = ?1 ORDER BY job_id, direction"
    ))?;
    let rows = st.query_map([id_prefix], handle_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The handle of the root of `job_id` (federation moves whole root jobs).
pub fn root_handle(conn: &impl Read, job_id: &str) -> Result<Option<Handle>> {
    let root = root_of(job_id);
    handle(conn, &root)
}

/// `/user/name/child/...` → `/user/name`.
pub fn root_of(job_id: &str) -> String {
    let mut parts = job_id.trim_start_matches('/').splitn(3, '/');
    match (parts.next(), parts.next()) {
        (Some(u), Some(n)) => format!("/{u}/{n}"),
        _ => job_id.to_string(),
    }
}

/// A QUEUED, uncancelled SENT handle of a live job: a placement candidate.
#[derive(Clone, Debug)]
pub struct Queued {
    pub job_id: String,
    pub pinned_peer: String,
    pub user_id: String,
    pub band: i32,
    pub submitted_at_ms: i64,
    pub deadline_ms: Option<i64>,
    pub request_blob: Vec<u8>,
}

/// Every placement candidate, oldest first.
pub fn queued(conn: &impl Read) -> Result<Vec<Queued>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT f.job_id, f.peer_id, j.user_id, c.priority_band, j.submitted_at_ms, j.scheduling_deadline_epoch_ms, c.request_blob
             FROM federated_jobs f JOIN jobs j ON j.job_id = f.job_id JOIN job_config c ON c.job_id = f.job_id
             WHERE f.direction = 0 AND f.handoff_state = 3 AND f.cancel_intent_version = 0 AND j.state IN {}
             ORDER BY j.submitted_at_ms",
            *JOB_NOT_STARTED
        )
    });
    let mut st = conn.raw().prepare_cached(&SQL)?;
    let rows = st.query_map([], |r| {
        Ok(Queued {
            job_id: r.get(0)?,
            pinned_peer: r.get(1)?,
            user_id: r.get(2)?,
            band: r.get(3)?,
            submitted_at_ms: r.get(4)?,
            deadline_ms: r.get(5)?,
            request_blob: r.get(6)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// A queued job whose scheduling deadline passed → UNSCHEDULABLE (the handle stays QUEUED, so
/// the promotion CAS refuses it).
pub fn expire_queued(tx: &Tx<'_>, job_id: &str, now: i64) -> Result<bool> {
    apply_job_event(tx, job_id, &JobEvent::QueuedDeadlinePassed, now)
}

/// The promotion CAS: QUEUED → PENDING on `peer` only while the handle is still queued, not
/// cancelled, and its job is live. Also stamps `jobs.cluster`, and (unlike the reference) keeps
/// the chosen backend and heartbeat generation for operators.
pub fn promote(
    tx: &Tx<'_>,
    job_id: &str,
    peer: &str,
    backend_id: &str,
    generation: i64,
    now: i64,
) -> Result<bool> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE federated_jobs SET handoff_state = 0, peer_id = ?2, backend_id = ?3, generation = ?4, promoted_at_ms = ?5
             WHERE job_id = ?1 AND direction = 0 AND handoff_state = 3 AND cancel_intent_version = 0
               AND EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = ?1 AND j.state IN {})",
            *JOB_NOT_STARTED
        )
    });
    let tx = tx.raw();
    let n = tx
        .prepare_cached(&SQL)?
        .execute(params![job_id, peer, backend_id, generation, now])?;
    if n > 0 {
        tx.prepare_cached("UPDATE jobs SET cluster = ?2 WHERE job_id = ?1")?
            .execute(params![job_id, peer])?;
    }
    Ok(n > 0)
}

/// A PENDING handle awaiting delivery.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub job_id: String,
    pub nonce: String,
    pub owner: String,
    pub submitting_user: String,
    pub request_blob: Vec<u8>,
}

/// Up to `limit` PENDING, uncancelled handles for `peer`, oldest promotion first.
pub fn deliveries(conn: &impl Read, peer: &str, limit: usize) -> Result<Vec<Delivery>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT f.job_id, f.handoff_nonce, f.owner_principal, j.submitting_user, c.request_blob
             FROM federated_jobs f JOIN jobs j ON j.job_id = f.job_id JOIN job_config c ON c.job_id = f.job_id
             WHERE f.direction = 0 AND f.handoff_state = 0 AND f.peer_id = ?1 AND f.cancel_intent_version = 0
               AND j.state IN {}
             ORDER BY f.promoted_at_ms LIMIT ?2",
            *JOB_NOT_STARTED
        )
    });
    let mut st = conn.raw().prepare_cached(&SQL)?;
    let rows = st.query_map(params![peer, limit as i64], |r| {
        Ok(Delivery {
            job_id: r.get(0)?,
            nonce: r.get(1)?,
            owner: r.get(2)?,
            submitting_user: r.get(3)?,
            request_blob: r.get(4)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// PENDING → HANDED_OFF after the peer acknowledged (only if still PENDING).
pub fn mark_handed_off(tx: &Tx<'_>, job_id: &str, now: i64) -> Result<bool> {
    let n = tx
        .raw()
        .prepare_cached(
            "UPDATE federated_jobs SET handoff_state = 1, handed_off_at_ms = ?2, last_error = NULL
             WHERE job_id = ?1 AND handoff_state = 0",
        )?
        .execute(params![job_id, now])?;
    Ok(n > 0)
}

/// PENDING → HANDOFF_REJECTED with the peer's verdict; the job ends KILLED with that message.
pub fn mark_rejected(tx: &Tx<'_>, job_id: &str, message: &str, now: i64) -> Result<bool> {
    let n = tx
        .raw()
        .prepare_cached(
            "UPDATE federated_jobs SET handoff_state = 2, last_error = ?2 WHERE job_id = ?1 AND handoff_state = 0",
        )?
        .execute(params![job_id, message])?;
    if n > 0 {
        apply_job_event(
            tx,
            job_id,
            &JobEvent::HandoffRejected {
                message: message.to_string(),
            },
            now,
        )?;
    }
    Ok(n > 0)
}

/// The scheduling deadline of a PENDING handle's job while it has not started: `None` when the
/// handle is not PENDING or the job is past PENDING/BUILDING; `Some(None)` without a deadline.
pub fn pending_deadline(conn: &impl Read, job_id: &str) -> Result<Option<Option<i64>>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT j.scheduling_deadline_epoch_ms FROM federated_jobs f JOIN jobs j ON j.job_id = f.job_id
             WHERE f.job_id = ?1 AND f.direction = 0 AND f.handoff_state = 0 AND j.state IN {}",
            *JOB_NOT_STARTED
        )
    });
    Ok(conn
        .raw()
        .prepare_cached(&SQL)?
        .query_row([job_id], |r| r.get::<_, Option<i64>>(0))
        .optional()?)
}

/// A PENDING handle its peer kept refusing, past its scheduling deadline → UNSCHEDULABLE with
/// `message` (the handle stays PENDING; its job is no longer deliverable).
pub fn expire_refused(tx: &Tx<'_>, job_id: &str, message: &str, now: i64) -> Result<bool> {
    if pending_deadline(tx, job_id)?.is_none() {
        return Ok(false);
    }
    apply_job_event(
        tx,
        job_id,
        &JobEvent::RefusedDeadlinePassed {
            message: message.to_string(),
        },
        now,
    )
}

/// The peer's own pending reason for a mirrored job: the first non-empty status message of its
/// still-pending tasks, by index.
pub fn mirrored_pending_reason(conn: &impl Read, job_id: &str) -> Result<Option<String>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT status_message FROM tasks
             WHERE job_id = ?1 AND state IN {} AND COALESCE(status_message, '') != ''
             ORDER BY task_index LIMIT 1",
            crate::sets::tasks_where(|s| s == iris_types::TaskState::Pending)
        )
    });
    Ok(conn
        .raw()
        .prepare_cached(&SQL)?
        .query_row([job_id], |r| r.get::<_, String>(0))
        .optional()?)
}

/// Records a transient delivery error for operators (the handle stays PENDING).
pub fn note_error(tx: &Tx<'_>, job_id: &str, message: &str) -> Result<()> {
    tx.raw()
        .prepare_cached("UPDATE federated_jobs SET last_error = ?2 WHERE job_id = ?1")?
        .execute(params![job_id, message])?;
    Ok(())
}

/// Cancel on the parent: bumps the intent. QUEUED and PENDING handles end their job KILLED
/// ("Cancelled before handoff"); returns the handle as it was, so the caller knows whether the
/// peer must be told (PENDING or HANDED_OFF).
pub fn cancel_sent(tx: &Tx<'_>, job_id: &str, now: i64) -> Result<Option<Handle>> {
    let Some(h) = handle(tx, job_id)? else {
        return Ok(None);
    };
    if h.direction != SENT {
        return Ok(None);
    }
    tx.raw()
        .prepare_cached(
            "UPDATE federated_jobs SET cancel_intent_version = cancel_intent_version + 1 WHERE job_id = ?1",
        )?
        .execute([job_id])?;
    if h.handoff_state == QUEUED || h.handoff_state == PENDING {
        apply_job_event(tx, job_id, &JobEvent::CancelledBeforeHandoff, now)?;
    }
    Ok(Some(h))
}

/// Handles on `peer` with a cancel intent whose local job is still live (cancel re-drive).
pub fn pending_cancels(conn: &impl Read, peer: &str) -> Result<Vec<String>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT f.job_id FROM federated_jobs f JOIN jobs j ON j.job_id = f.job_id
             WHERE f.direction = 0 AND f.peer_id = ?1 AND f.cancel_intent_version > 0
               AND f.handoff_state = 1 AND j.state IN {}",
            *JOB_LIVE
        )
    });
    let mut st = conn.raw().prepare_cached(&SQL)?;
    let rows = st.query_map([peer], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Records a cancel of a child of a handed-off root: the sync loop re-drives it until the peer
/// confirms it.
pub fn record_child_cancel(tx: &Tx<'_>, job_id: &str, peer: &str, now: i64) -> Result<()> {
    tx.raw()
        .prepare_cached(
            "INSERT INTO federated_child_cancels(job_id, peer_id, requested_at_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT(job_id) DO UPDATE SET peer_id = excluded.peer_id",
        )?
        .execute(params![job_id, peer, now])?;
    Ok(())
}

/// Child cancels on `peer` not yet confirmed: the mirrored child is still live, or not mirrored
/// yet.
pub fn pending_child_cancels(conn: &impl Read, peer: &str) -> Result<Vec<String>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT c.job_id FROM federated_child_cancels c LEFT JOIN jobs j ON j.job_id = c.job_id
             WHERE c.peer_id = ?1 AND (j.job_id IS NULL OR j.state IN {})
             ORDER BY c.requested_at_ms",
            *JOB_LIVE
        )
    });
    let mut st = conn.raw().prepare_cached(&SQL)?;
    let rows = st.query_map([peer], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Drops the child cancels on `peer` that are done: the mirror shows the child ended, or
/// `gone` names it (the peer does not know it).
pub fn settle_child_cancels(tx: &Tx<'_>, peer: &str, gone: &[String]) -> Result<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "DELETE FROM federated_child_cancels WHERE peer_id = ?1
               AND job_id IN (SELECT job_id FROM jobs WHERE state NOT IN {})",
            *JOB_LIVE
        )
    });
    let tx = tx.raw();
    tx.prepare_cached(&SQL)?.execute([peer])?;
    let mut del = tx.prepare_cached("DELETE FROM federated_child_cancels WHERE job_id = ?1")?;
    for j in gone {
        del.execute([j])?;
    }
    Ok(())
}

/// Non-terminal SENT handles on `peer`.
pub fn active_count(conn: &impl Read, peer: &str) -> Result<i64> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT count(*) FROM federated_jobs f JOIN jobs j ON j.job_id = f.job_id
             WHERE f.direction = 0 AND f.peer_id = ?1 AND j.state IN {}",
            *JOB_LIVE
        )
    });
    Ok(conn
        .raw()
        .prepare_cached(&SQL)?
        .query_row([peer], |r| r.get(0))?)
}

/// Whether any task of `job_id` has been mirrored from its peer.
pub fn tasks_mirrored(conn: &impl Read, job_id: &str) -> Result<bool> {
    Ok(conn
        .raw()
        .prepare_cached("SELECT EXISTS(SELECT 1 FROM tasks WHERE job_id = ?1)")?
        .query_row([job_id], |r| r.get(0))?)
}

// ---- peer side ----

/// Appends a change-log row by hand (the received root itself: its handle is written after its
/// job and task rows, so the triggers did not see them).
pub fn append_changelog(
    tx: &Tx<'_>,
    job_id: &str,
    requester: &str,
    task_index: Option<i64>,
    tombstone: bool,
) -> Result<()> {
    changelog_row(tx.raw(), job_id, requester, task_index, tombstone)
}

fn changelog_row(
    conn: &rusqlite::Connection,
    job_id: &str,
    requester: &str,
    task_index: Option<i64>,
    tombstone: bool,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone)
         VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![job_id, requester, task_index, tombstone as i64])?;
    Ok(())
}

/// A new job below a root this cluster received from a hub goes into that hub's change log.
/// Updates and deletes are logged by triggers; an insert is logged here, by the two inserts into
/// `jobs` (`apply::create::insert_job`, `mirror`), because a trigger on insert would make every
/// job insert run under a statement journal (migration 0010). A root job (depth 1) is never a
/// received job's child, so most inserts skip even the lookup.
pub(crate) fn log_received_child(
    conn: &rusqlite::Connection,
    job_id: &str,
    root_job_id: &str,
    depth: i64,
) -> Result<()> {
    if depth <= 1 {
        return Ok(());
    }
    let hub: Option<String> = conn
        .prepare_cached("SELECT peer_id FROM federated_jobs WHERE job_id = ?1 AND direction = ?2")?
        .query_row(params![root_job_id, RECEIVED], |r| r.get(0))
        .optional()?;
    match hub {
        Some(hub) => changelog_row(conn, job_id, &hub, None, false),
        None => Ok(()),
    }
}

/// After a restore from a checkpoint: the change log starts a new history whose numbers are
/// above any its previous life can have issued (`now_ms × 1000`: fewer than a thousand changes a
/// millisecond since it was first written), so every requester's cursor reads as stale and gets
/// a full snapshot, from which it learns which handed-off jobs this cluster no longer has.
pub fn start_new_history(tx: &Tx<'_>, now_ms: i64) -> Result<()> {
    let raw = tx.raw();
    raw.prepare_cached("DELETE FROM federation_changelog")?
        .execute([])?;
    let floor = now_ms.saturating_mul(1000);
    let n = raw
        .prepare_cached(
            "UPDATE sqlite_sequence SET seq = MAX(seq, ?1) WHERE name = 'federation_changelog'",
        )?
        .execute([floor])?;
    if n == 0 {
        raw.prepare_cached(
            "INSERT INTO sqlite_sequence(name, seq) VALUES ('federation_changelog', ?1)",
        )?
        .execute([floor])?;
    }
    Ok(())
}

/// The peer lost a handed-off root (see [`crate::mirror::reset_for_redelivery`]): HANDED_OFF →
/// PENDING with the same nonce, so the next sync round delivers it again, noting why.
pub fn redeliver(tx: &Tx<'_>, job_id: &str, note: &str) -> Result<bool> {
    let n = tx
        .raw()
        .prepare_cached(
            "UPDATE federated_jobs SET handoff_state = 0, handed_off_at_ms = NULL, last_error = ?2
             WHERE job_id = ?1 AND direction = 0 AND handoff_state = 1",
        )?
        .execute(params![job_id, note])?;
    Ok(n > 0)
}

/// What changed for a requester since a cursor.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    /// The newest sequence number in the whole log (the next cursor).
    pub max_seq: i64,
    /// True when the cursor is empty or older than the retained log: send everything.
    pub stale: bool,
    /// Per job, in first-change order: `None` = tombstone; `Some(None)` = all tasks;
    /// `Some(Some(indexes))` = those tasks only.
    pub jobs: Vec<(String, Option<Option<Vec<i64>>>)>,
}

/// Folds the change log for `requester` after `cursor` (reference §1.7).
pub fn changes_since(conn: &impl Read, requester: &str, cursor: &str) -> Result<Changes> {
    let conn = conn.raw();
    let (min_seq, max_seq): (Option<i64>, Option<i64>) = conn
        .prepare_cached("SELECT MIN(seq), MAX(seq) FROM federation_changelog")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let max_seq = max_seq.unwrap_or(0);
    let parsed = cursor.trim().parse::<i64>().ok();
    let stale = match (parsed, min_seq) {
        (None, _) => true,
        // A cursor this log never issued: the requester saw a history this DB does not have
        // (it was restored from an older checkpoint).
        (Some(c), _) if c > max_seq => true,
        (Some(c), Some(min)) => min > 0 && c < min - 1,
        (Some(_), None) => false,
    };
    let mut out = Changes {
        max_seq,
        stale,
        jobs: Vec::new(),
    };
    if stale {
        let mut st = conn.prepare_cached(
            "SELECT j.job_id FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id
             WHERE f.direction = 1 AND f.peer_id = ?1 ORDER BY j.depth, j.job_id",
        )?;
        let rows = st.query_map([requester], |r| r.get::<_, String>(0))?;
        for j in rows {
            out.jobs.push((j?, Some(None)));
        }
        return Ok(out);
    }
    let cursor = parsed.unwrap_or(0);
    let mut st = conn.prepare_cached(
        "SELECT job_id, task_index, tombstone FROM federation_changelog
         WHERE requester_id = ?1 AND seq > ?2 ORDER BY seq",
    )?;
    let rows = st.query_map(params![requester, cursor], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, Option<i64>>(1)?,
            r.get::<_, i64>(2)? != 0,
        ))
    })?;
    let mut index: std::collections::HashMap<String, usize> = Default::default();
    for row in rows {
        let (job, task, tomb) = row?;
        let i = *index.entry(job.clone()).or_insert_with(|| {
            out.jobs.push((job.clone(), Some(Some(Vec::new()))));
            out.jobs.len() - 1
        });
        let slot = &mut out.jobs[i].1;
        *slot = match (tomb, slot.take(), task) {
            (true, _, _) => None,
            // A change after a tombstone, or a job-level change: every task.
            (false, None, _) | (false, _, None) | (false, Some(None), _) => Some(None),
            (false, Some(Some(mut v)), Some(t)) => {
                if !v.contains(&t) {
                    v.push(t);
                }
                Some(Some(v))
            }
        };
    }
    Ok(out)
}

// ---- parent side ----

/// The stored sync cursor for `peer` ("" when none).
pub fn cursor(conn: &impl Read, peer: &str) -> Result<String> {
    Ok(conn
        .raw()
        .prepare_cached("SELECT cursor FROM federation_sync_state WHERE peer_id = ?1")?
        .query_row([peer], |r| r.get(0))
        .optional()?
        .unwrap_or_default())
}

pub fn set_cursor(tx: &Tx<'_>, peer: &str, cursor: &str) -> Result<()> {
    tx.raw()
        .prepare_cached(
            "INSERT INTO federation_sync_state(peer_id, cursor) VALUES (?1, ?2)
         ON CONFLICT(peer_id) DO UPDATE SET cursor = excluded.cursor",
        )?
        .execute(params![peer, cursor])?;
    Ok(())
}

/// Whether `job_id`'s root was SENT to `peer` (deltas for anything else are ignored).
pub fn root_sent_to(conn: &impl Read, job_id: &str, peer: &str) -> Result<bool> {
    Ok(root_handle(conn, job_id)?
        .map(|h| h.direction == SENT && h.peer_id == peer)
        .unwrap_or(false))
}

/// After a full snapshot: HANDED_OFF handles on `peer` absent from it are gone on the peer.
pub fn handed_off_roots(conn: &impl Read, peer: &str) -> Result<Vec<String>> {
    let mut st = conn.raw().prepare_cached(
        "SELECT job_id FROM federated_jobs WHERE direction = 0 AND peer_id = ?1 AND handoff_state = 1",
    )?;
    let rows = st.query_map([peer], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_of_job_ids() {
        assert_eq!(root_of("/alice/train"), "/alice/train");
        assert_eq!(root_of("/alice/train/eval/0"), "/alice/train");
    }
}
