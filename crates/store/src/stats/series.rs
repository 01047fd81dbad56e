//! Reads of one namespace as a time series (the newest row per key, the newest rows of one key)
//! and retention, which drops a namespace's oldest batches.

use super::{
    ident, Result, StatsDb, Value, DEFAULT_MAX_AGE_SECONDS, DEFAULT_MAX_BYTES, MAX_TOTAL_BYTES,
};
use rusqlite::params;

impl StatsDb {
    /// For each of `keys`, the named columns of the newest row (highest seq) whose key column
    /// holds it: what a status read shows of a time series. Keys without rows are absent; so is
    /// everything when `ns` is not registered.
    pub fn latest_by_key(
        &self,
        ns: &str,
        keys: &[String],
        columns: &[&str],
    ) -> Result<std::collections::HashMap<String, Vec<Value>>> {
        let mut out = std::collections::HashMap::new();
        let Some(entry) = self.namespace(ns)? else {
            return Ok(out);
        };
        let key = if entry.key_column.is_empty() {
            "timestamp_ms".to_string()
        } else {
            entry.key_column
        };
        let wanted: Vec<String> = columns.iter().map(|c| ident(c)).collect();
        for chunk in keys.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("?{i}")).collect();
            let sql = format!(
                "SELECT {k}, {cols} FROM {t} WHERE seq IN
                   (SELECT max(seq) FROM {t} WHERE {k} IN ({marks}) GROUP BY {k})",
                k = ident(&key),
                cols = wanted.join(", "),
                t = ident(ns),
                marks = marks.join(", "),
            );
            let mut stmt = self.conn.prepare_cached(&sql)?;
            let mut rows = stmt.query(rusqlite::params_from_iter(chunk.iter()))?;
            while let Some(row) = rows.next()? {
                let k: String = row.get(0)?;
                let mut values = Vec::with_capacity(columns.len());
                for i in 0..columns.len() {
                    values.push(value_at(row, i + 1)?);
                }
                out.insert(k, values);
            }
        }
        Ok(out)
    }

    /// The named columns of the newest `limit` rows whose key column holds `key`, oldest first
    /// (nothing when `ns` is not registered).
    pub fn newest_for_key(
        &self,
        ns: &str,
        key: &str,
        columns: &[&str],
        limit: usize,
    ) -> Result<Vec<Vec<Value>>> {
        let Some(entry) = self.namespace(ns)? else {
            return Ok(Vec::new());
        };
        let key_column = if entry.key_column.is_empty() {
            "timestamp_ms".to_string()
        } else {
            entry.key_column
        };
        let wanted: Vec<String> = columns.iter().map(|c| ident(c)).collect();
        let sql = format!(
            "SELECT {cols} FROM {t} WHERE {k} = ?1 ORDER BY seq DESC LIMIT ?2",
            cols = wanted.join(", "),
            t = ident(ns),
            k = ident(&key_column),
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let mut rows = stmt.query(params![key, limit as i64])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let mut values = Vec::with_capacity(columns.len());
            for i in 0..columns.len() {
                values.push(value_at(row, i)?);
            }
            out.push(values);
        }
        out.reverse();
        Ok(out)
    }

    /// Applies every namespace's retention: batches older than its age limit go, then the
    /// oldest batches while it is over its byte or batch-count limit. Returns rows removed.
    pub fn enforce_retention(&mut self, now_ms: i64) -> Result<i64> {
        let mut removed = 0;
        for (ns, _) in self.namespaces()? {
            let age = if ns.policy.max_age_seconds > 0 {
                ns.policy.max_age_seconds
            } else {
                DEFAULT_MAX_AGE_SECONDS
            };
            let max_bytes = if ns.policy.max_bytes > 0 {
                ns.policy.max_bytes
            } else {
                DEFAULT_MAX_BYTES
            };
            let max_batches = if ns.policy.max_segments > 0 {
                i64::from(ns.policy.max_segments)
            } else {
                i64::MAX
            };
            let batches: Vec<(i64, i64, i64, i64)> = self
                .conn
                .prepare_cached(
                    "SELECT first_seq, last_seq, bytes, written_ms FROM _stats_batches
                     WHERE namespace = ?1 ORDER BY first_seq DESC",
                )?
                .query_map([&ns.name], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            // Keep the newest batches that fit every limit; everything older goes.
            let mut kept_bytes = 0i64;
            let mut cut: Option<i64> = None;
            for (i, &(_, last, bytes, written)) in batches.iter().enumerate() {
                kept_bytes += bytes;
                let too_old = now_ms - written > age * 1000;
                if too_old || (i > 0 && kept_bytes > max_bytes) || i as i64 >= max_batches {
                    cut = Some(last);
                    break;
                }
            }
            if let Some(last_dropped) = cut {
                let tx = self.conn.transaction()?;
                removed += tx.execute(
                    &format!("DELETE FROM {} WHERE seq <= ?1", ident(&ns.name)),
                    [last_dropped],
                )? as i64;
                tx.execute(
                    "DELETE FROM _stats_batches WHERE namespace = ?1 AND last_seq <= ?2",
                    params![ns.name, last_dropped],
                )?;
                tx.commit()?;
            }
        }
        removed += self.enforce_total_cap(MAX_TOTAL_BYTES)?;
        Ok(removed)
    }

    /// While the store holds more than `cap` bytes, drops the oldest batch of any namespace
    /// (never a namespace's newest). Returns rows removed.
    pub(super) fn enforce_total_cap(&mut self, cap: i64) -> Result<i64> {
        let total: i64 = self.conn.query_row(
            "SELECT coalesce(sum(bytes), 0) FROM _stats_batches",
            [],
            |r| r.get(0),
        )?;
        if total <= cap {
            return Ok(0);
        }
        let oldest: Vec<(String, i64, i64)> = self
            .conn
            .prepare_cached(
                "SELECT b.namespace, b.last_seq, b.bytes FROM _stats_batches b
                 WHERE b.first_seq < (SELECT max(n.first_seq) FROM _stats_batches n
                                      WHERE n.namespace = b.namespace)
                 ORDER BY b.written_ms, b.namespace, b.first_seq",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let (mut over, mut removed) = (total - cap, 0i64);
        let tx = self.conn.transaction()?;
        for (ns, last, bytes) in oldest {
            if over <= 0 {
                break;
            }
            removed += tx.execute(
                &format!("DELETE FROM {} WHERE seq <= ?1", ident(&ns)),
                [last],
            )? as i64;
            tx.execute(
                "DELETE FROM _stats_batches WHERE namespace = ?1 AND last_seq <= ?2",
                params![ns, last],
            )?;
            over -= bytes;
        }
        tx.commit()?;
        Ok(removed)
    }
}

fn value_at(row: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Value> {
    use rusqlite::types::ValueRef;
    Ok(match row.get_ref(i)? {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(v) => Value::Int(v),
        ValueRef::Real(v) => Value::Real(v),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    })
}
