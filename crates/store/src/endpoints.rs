//! The endpoint registry: services tasks register (a coordinator, an actor server, a metrics
//! page) under a name, leased, owned by the task's current attempt. An endpoint is gone when its
//! lease runs out (hidden at once, swept later), when its attempt ends (the task appliers drop
//! it in the same transaction), when its job is killed, or when its task unregisters it. Rows
//! with a `peer_id` are a federation peer's endpoints mirrored on the hub.

use crate::{Raw, Read, Result, Tx};
use iris_types::endpoint::Access;
use iris_types::TaskState;
use rusqlite::{params, Connection, OptionalExtension, Row};
use std::collections::BTreeMap;

/// One registered endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub endpoint_id: String,
    pub name: String,
    pub address: String,
    pub task_id: String,
    pub job_id: String,
    pub metadata: BTreeMap<String, String>,
    pub registered_at_ms: i64,
    /// `None`: never expires.
    pub lease_deadline_ms: Option<i64>,
    pub access: Access,
    /// The federation peer it lives on (a mirror on the hub); `None` for our own tasks'.
    pub peer_id: Option<String>,
}

/// What a registration found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registered {
    /// Registered (or renewed).
    Ok,
    /// No such task.
    NoTask,
    /// The task has finished.
    Terminal(TaskState),
    /// The attempt named is not the task's live attempt (an earlier one, or one that ended).
    Stale { current: i64 },
    /// The endpoint id is already registered by another task.
    TakenBy(String),
}

const COLS: &str = "endpoint_id, name, address, task_id, job_id, metadata_json, registered_at_ms, lease_deadline_ms, access, peer_id";
const LIVE: &str = "(lease_deadline_ms IS NULL OR lease_deadline_ms > ?1)";

fn row(r: &Row<'_>) -> rusqlite::Result<Endpoint> {
    let metadata: Option<String> = r.get(5)?;
    let access: Option<String> = r.get(8)?;
    Ok(Endpoint {
        endpoint_id: r.get(0)?,
        name: r.get(1)?,
        address: r.get(2)?,
        task_id: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
        job_id: r.get::<_, Option<String>>(4)?.unwrap_or_default(),
        metadata: metadata
            .and_then(|m| serde_json::from_str(&m).ok())
            .unwrap_or_default(),
        registered_at_ms: r.get(6)?,
        lease_deadline_ms: r.get(7)?,
        access: access
            .as_deref()
            .and_then(Access::parse)
            .unwrap_or_default(),
        peer_id: r.get(9)?,
    })
}

fn insert(tx: &Connection, e: &Endpoint) -> Result<()> {
    let metadata = serde_json::to_string(&e.metadata)
        .map_err(|err| crate::Error::Invalid(format!("endpoint metadata: {err}")))?;
    tx.prepare_cached(&format!(
        "INSERT OR REPLACE INTO endpoints({COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)"
    ))?
    .execute(params![
        e.endpoint_id,
        e.name,
        e.address,
        e.task_id,
        e.job_id,
        metadata,
        e.registered_at_ms,
        e.lease_deadline_ms,
        e.access.name(),
        e.peer_id,
    ])?;
    Ok(())
}

/// Registers or renews `e` (keyed by its id) for `attempt_id` of its task. The task's live
/// attempt owns it; another registration of the same name by the same task is replaced (a
/// retried attempt takes its predecessor's name). `e.job_id` is filled from the task.
pub fn register(tx: &Tx<'_>, e: &Endpoint, attempt_id: i64) -> Result<Registered> {
    let tx = tx.raw();
    let task: Option<(String, i64, i64, Option<i64>)> = tx
        .prepare_cached(
            "SELECT t.job_id, t.state, t.current_attempt_id, a.state
             FROM tasks t LEFT JOIN task_attempts a
               ON a.task_id = t.task_id AND a.attempt_id = t.current_attempt_id
             WHERE t.task_id = ?1",
        )?
        .query_row([&e.task_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    let Some((job_id, state, current, attempt_state)) = task else {
        return Ok(Registered::NoTask);
    };
    let state = TaskState::from_code(state as i32).unwrap_or(TaskState::Unspecified);
    if state.is_terminal() {
        return Ok(Registered::Terminal(state));
    }
    let attempt_ended = attempt_state
        .and_then(|s| TaskState::from_code(s as i32))
        .is_none_or(|s| s.is_terminal());
    if current != attempt_id || attempt_ended {
        return Ok(Registered::Stale { current });
    }
    if let Some(other) = get(tx, &e.endpoint_id)?.filter(|p| p.task_id != e.task_id) {
        return Ok(Registered::TakenBy(other.task_id));
    }
    tx.prepare_cached(
        "DELETE FROM endpoints WHERE task_id = ?1 AND name = ?2 AND endpoint_id <> ?3",
    )?
    .execute(params![e.task_id, e.name, e.endpoint_id])?;
    insert(
        tx,
        &Endpoint {
            job_id,
            peer_id: None,
            ..e.clone()
        },
    )?;
    Ok(Registered::Ok)
}

/// Removes an endpoint; false if there was none.
pub fn unregister(tx: &Tx<'_>, endpoint_id: &str) -> Result<bool> {
    Ok(tx
        .raw()
        .prepare_cached("DELETE FROM endpoints WHERE endpoint_id = ?1")?
        .execute([endpoint_id])?
        > 0)
}

fn get(conn: &Connection, endpoint_id: &str) -> Result<Option<Endpoint>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {COLS} FROM endpoints WHERE endpoint_id = ?1"
        ))?
        .query_row([endpoint_id], row)
        .optional()?)
}

/// One endpoint by id, expired or not.
pub fn by_id(conn: &impl Read, endpoint_id: &str) -> Result<Option<Endpoint>> {
    get(conn.raw(), endpoint_id)
}

/// Which endpoints to list.
#[derive(Clone, Debug, Default)]
pub struct Filter<'a> {
    /// Names equal to this (`exact`) or starting with it.
    pub name: &'a str,
    pub exact: bool,
    /// Only these tasks' (ANDed with the name); empty: any task.
    pub task_ids: &'a [String],
}

/// Live endpoints (lease not run out) matching `f`, by name then id.
pub fn list(conn: &impl Read, f: &Filter<'_>, now: i64) -> Result<Vec<Endpoint>> {
    let name_sql = if f.exact {
        "name = ?2"
    } else {
        "substr(name, 1, length(?2)) = ?2"
    };
    let mut stmt = conn.raw().prepare_cached(&format!(
        "SELECT {COLS} FROM endpoints WHERE {LIVE} AND {name_sql} ORDER BY name, endpoint_id"
    ))?;
    let rows = stmt.query_map(params![now, f.name], row)?;
    let mut out = Vec::new();
    for r in rows {
        let e = r?;
        if f.task_ids.is_empty() || f.task_ids.contains(&e.task_id) {
            out.push(e);
        }
    }
    Ok(out)
}

/// The live endpoint a proxy request for `name` reaches: the most recently registered one.
pub fn resolve(conn: &impl Read, name: &str, now: i64) -> Result<Option<Endpoint>> {
    Ok(conn
        .raw()
        .prepare_cached(&format!(
            "SELECT {COLS} FROM endpoints WHERE {LIVE} AND name = ?2
             ORDER BY registered_at_ms DESC, endpoint_id LIMIT 1"
        ))?
        .query_row(params![now, name], row)
        .optional()?)
}

/// Deletes endpoints whose lease ran out; returns their ids and names.
pub fn sweep_expired(tx: &Tx<'_>, now: i64) -> Result<Vec<(String, String)>> {
    let tx = tx.raw();
    let mut stmt = tx.prepare_cached(
        "DELETE FROM endpoints WHERE lease_deadline_ms IS NOT NULL AND lease_deadline_ms <= ?1
         RETURNING endpoint_id, name",
    )?;
    let gone = stmt
        .query_map([now], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(gone)
}

/// Drops a task's endpoints: its attempt ended. Called by the task appliers.
pub(crate) fn drop_for_task(tx: &Connection, task_id: &str) -> Result<()> {
    tx.prepare_cached("DELETE FROM endpoints WHERE task_id = ?1 AND peer_id IS NULL")?
        .execute([task_id])?;
    Ok(())
}

/// Replaces the endpoints mirrored from `peer_id` with `rows` (the peer's full current set for
/// our jobs); rows naming a job we did not hand to that peer are skipped. Returns how many were
/// kept.
pub fn replace_for_peer(tx: &Tx<'_>, peer_id: &str, rows: &[Endpoint]) -> Result<usize> {
    let tx = tx.raw();
    tx.prepare_cached("DELETE FROM endpoints WHERE peer_id = ?1")?
        .execute([peer_id])?;
    let mut kept = 0;
    for e in rows {
        let ours: bool = tx
            .prepare_cached(
                "SELECT EXISTS(SELECT 1 FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id
                 WHERE j.job_id = ?1 AND f.direction = ?2 AND f.peer_id = ?3)",
            )?
            .query_row(
                params![e.job_id, crate::federation::SENT, peer_id],
                |r| r.get(0),
            )?;
        if !ours {
            continue;
        }
        insert(
            tx,
            &Endpoint {
                peer_id: Some(peer_id.to_string()),
                ..e.clone()
            },
        )?;
        kept += 1;
    }
    Ok(kept)
}

/// The live endpoints of jobs `requester` handed to us (what a `FederationSync` reports).
pub fn for_requester(conn: &impl Read, requester: &str, now: i64) -> Result<Vec<Endpoint>> {
    let mut stmt = conn.raw().prepare_cached(&format!(
        "SELECT {COLS} FROM endpoints e WHERE {LIVE} AND e.peer_id IS NULL AND EXISTS(
            SELECT 1 FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id
            WHERE j.job_id = e.job_id AND f.direction = ?2 AND f.peer_id = ?3)
         ORDER BY name, endpoint_id"
    ))?;
    let rows = stmt
        .query_map(params![now, crate::federation::RECEIVED, requester], row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

#[cfg(test)]
mod tests;
