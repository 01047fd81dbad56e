//! Scale groups and their slices as the autoscaler last left them (`scaling_groups`, `slices`),
//! so `iris query` and a restarted controller see them.

use crate::{Read, Result, Tx};
use rusqlite::params;

/// One scale group's scaling record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupRow {
    pub name: String,
    pub consecutive_failures: i64,
    /// 0: not backing off.
    pub backoff_until_ms: i64,
    /// 0: never.
    pub last_scale_up_ms: i64,
    pub last_scale_down_ms: i64,
}

/// One slice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceRow {
    pub slice_id: String,
    pub scale_group: String,
    /// `booting`, `ready`, ...
    pub lifecycle: String,
    pub worker_ids: Vec<String>,
    pub created_at_ms: i64,
    pub error_message: String,
}

/// Replaces every group's record and the whole slice table with these.
pub fn save(tx: &Tx<'_>, groups: &[GroupRow], slices: &[SliceRow]) -> Result<()> {
    let tx = &tx.tx;
    tx.prepare_cached("DELETE FROM scaling_groups")?
        .execute([])?;
    tx.prepare_cached("DELETE FROM slices")?.execute([])?;
    {
        let mut st = tx.prepare_cached(
            "INSERT INTO scaling_groups(name, consecutive_failures, backoff_until_ms, last_scale_up_ms, last_scale_down_ms)
             VALUES (?1, ?2, NULLIF(?3, 0), NULLIF(?4, 0), NULLIF(?5, 0))",
        )?;
        for g in groups {
            st.execute(params![
                g.name,
                g.consecutive_failures,
                g.backoff_until_ms,
                g.last_scale_up_ms,
                g.last_scale_down_ms
            ])?;
        }
    }
    let mut st = tx.prepare_cached(
        "INSERT INTO slices(slice_id, scale_group, lifecycle, worker_ids, created_at_ms, error_message)
         VALUES (?1, ?2, ?3, ?4, ?5, NULLIF(?6, ''))",
    )?;
    for s in slices {
        let workers = serde_json::to_string(&s.worker_ids).unwrap_or_else(|_| "[]".into());
        st.execute(params![
            s.slice_id,
            s.scale_group,
            s.lifecycle,
            workers,
            s.created_at_ms,
            s.error_message
        ])?;
    }
    Ok(())
}

/// Every slice, by group then id.
pub fn slices(c: &impl Read) -> Result<Vec<SliceRow>> {
    let mut st = c.raw().prepare_cached(
        "SELECT slice_id, COALESCE(scale_group, ''), COALESCE(lifecycle, ''), COALESCE(worker_ids, '[]'),
            COALESCE(created_at_ms, 0), COALESCE(error_message, '')
         FROM slices ORDER BY scale_group, slice_id",
    )?;
    let rows = st.query_map([], |r| {
        let workers: String = r.get(3)?;
        Ok(SliceRow {
            slice_id: r.get(0)?,
            scale_group: r.get(1)?,
            lifecycle: r.get(2)?,
            worker_ids: serde_json::from_str(&workers).unwrap_or_default(),
            created_at_ms: r.get(4)?,
            error_message: r.get(5)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Every group's record, by name.
pub fn groups(c: &impl Read) -> Result<Vec<GroupRow>> {
    let mut st = c.raw().prepare_cached(
        "SELECT name, consecutive_failures, COALESCE(backoff_until_ms, 0), COALESCE(last_scale_up_ms, 0),
            COALESCE(last_scale_down_ms, 0)
         FROM scaling_groups ORDER BY name",
    )?;
    let rows = st.query_map([], |r| {
        Ok(GroupRow {
            name: r.get(0)?,
            consecutive_failures: r.get(1)?,
            backoff_until_ms: r.get(2)?,
            last_scale_up_ms: r.get(3)?,
            last_scale_down_ms: r.get(4)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_save_replaces_the_groups_and_slices_and_reads_back() {
        let mut db = crate::Db::open_in_memory().expect("db");
        let tx = db.begin().expect("tx");
        let g = GroupRow {
            name: "cpu".into(),
            consecutive_failures: 2,
            backoff_until_ms: 9_000,
            last_scale_up_ms: 5_000,
            last_scale_down_ms: 0,
        };
        let s = SliceRow {
            slice_id: "iris-cpu-1".into(),
            scale_group: "cpu".into(),
            lifecycle: "booting".into(),
            worker_ids: vec!["worker-iris-cpu-1-0-ab".into()],
            created_at_ms: 5_000,
            error_message: String::new(),
        };
        save(&tx, std::slice::from_ref(&g), std::slice::from_ref(&s)).expect("save");
        assert_eq!(groups(&tx).expect("groups"), vec![g.clone()]);
        assert_eq!(slices(&tx).expect("slices"), vec![s]);
        save(&tx, &[g], &[]).expect("save again");
        assert!(
            slices(&tx).expect("slices").is_empty(),
            "a stopped slice is gone"
        );
    }
}
