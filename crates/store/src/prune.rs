//! Retention: which finished job trees are old enough to delete, and deleting them.
//!
//! Our rule (the reference deletes any terminal local job finished before the cutoff, one per
//! transaction, children included on their own): a *root* job is prunable when it and every
//! job under it are terminal and finished before the cutoff, and none of them was handed off
//! to or received from a federation peer (those rows mirror a peer, which owns their lifetime).
//! The whole tree goes at once, so a live job never loses its parent or its children.

use crate::sets::jobs_where;
use crate::{Read, Result, Tx};
use iris_types::JobState;
use std::sync::LazyLock;

static PRUNABLE_ROOTS: LazyLock<String> = LazyLock::new(|| {
    let terminal = jobs_where(JobState::is_terminal);
    format!(
        "SELECT j.job_id FROM jobs j
         WHERE j.parent_job_id IS NULL AND j.cluster = 'local' AND j.state IN {terminal}
           AND j.finished_at_ms IS NOT NULL AND j.finished_at_ms < ?1
           AND NOT EXISTS (
             SELECT 1 FROM jobs d WHERE d.root_job_id = j.job_id AND (
               d.state NOT IN {terminal} OR d.finished_at_ms IS NULL OR d.finished_at_ms >= ?1
               OR d.cluster != 'local'
               OR EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = d.job_id)))
         ORDER BY j.finished_at_ms
         LIMIT ?2"
    )
});

/// Up to `limit` root jobs whose whole tree is terminal, local and finished before `cutoff_ms`,
/// oldest first.
pub fn prunable_roots(c: &impl Read, cutoff_ms: i64, limit: usize) -> Result<Vec<String>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut st = c.raw().prepare_cached(&PRUNABLE_ROOTS)?;
    let rows = st.query_map(rusqlite::params![cutoff_ms, limit], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Deletes each job tree (job, descendants, tasks, attempts, events, endpoints, config).
pub fn delete_trees(tx: &Tx<'_>, roots: &[String]) -> Result<()> {
    for r in roots {
        crate::apply::delete_job(tx, r)?;
    }
    Ok(())
}
