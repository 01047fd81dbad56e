//! The other namespaces the controller fills: `iris.task_state` (every 10 s, each root job's
//! waiting and running tasks, and a cluster rollup under root `""`) and `iris.profile` (each
//! profile captured through `ProfileTask`).

use super::{data, stats_error};
use crate::error::Result;
use crate::{lock, Controller};
use iris_store::stats::{ColumnKind, Policy, StatsColumn, Value};

pub(crate) const TASK_STATE_NAMESPACE: &str = "iris.task_state";
pub(crate) const PROFILE_NAMESPACE: &str = "iris.profile";
/// The root job id of the cluster-wide rollup row.
const CLUSTER_ROLLUP: &str = "";

fn columns(cols: &[(&str, ColumnKind)]) -> Vec<StatsColumn> {
    cols.iter()
        .map(|(name, kind)| StatsColumn {
            name: (*name).into(),
            kind: *kind,
            nullable: true,
        })
        .collect()
}

const TASK_STATE_COLUMNS: &[(&str, ColumnKind)] = &[
    ("root_job_id", ColumnKind::String),
    ("ts", ColumnKind::TimestampMs),
    ("pending", ColumnKind::Int64),
    ("assigned", ColumnKind::Int64),
    ("building", ColumnKind::Int64),
    ("running", ColumnKind::Int64),
    ("oldest_pending_age_ms", ColumnKind::Int64),
    ("oldest_building_age_ms", ColumnKind::Int64),
];

const PROFILE_COLUMNS: &[(&str, ColumnKind)] = &[
    ("source", ColumnKind::String),
    ("attempt_id", ColumnKind::Int64),
    ("vm_id", ColumnKind::String),
    ("captured_at", ColumnKind::TimestampMs),
    ("duration_seconds", ColumnKind::Int64),
    ("type", ColumnKind::String),
    ("format", ColumnKind::String),
    ("trigger", ColumnKind::String),
    ("rate_hz", ColumnKind::Int64),
    ("native", ColumnKind::Bool),
    ("leaks", ColumnKind::Bool),
    ("locals_dump", ColumnKind::Bool),
    ("profile_data", ColumnKind::Bytes),
];

/// One captured profile, as `iris.profile` keeps it.
pub(crate) struct Capture<'a> {
    pub source: &'a str,
    pub attempt_id: Option<i64>,
    pub vm_id: &'a str,
    pub duration_seconds: i64,
    /// `thread`, `cpu` or `memory`.
    pub kind: &'a str,
    pub format: &'a str,
    pub data: &'a [u8],
}

impl Controller {
    fn ensure(&self, ns: &str, cols: &[(&str, ColumnKind)], key: &str) -> Result<()> {
        let mut stats = lock(&self.stats);
        if stats.namespace(ns).map_err(stats_error)?.is_none() {
            stats
                .register(ns, columns(cols), key, Policy::default())
                .map_err(stats_error)?;
        }
        Ok(())
    }

    /// Writes one `iris.task_state` row per root job with live tasks, and the cluster rollup;
    /// returns the rows written.
    pub(crate) fn write_task_state(&self) -> Result<usize> {
        let rollups = {
            let snap = lock(&self.snap);
            let tx = snap.begin_read()?;
            iris_store::jobs::task_state_rollup(&tx)?
        };
        let now = iris_store::now_ms();
        let age = |since: Option<i64>| since.map_or(0, |s| (now - s).max(0));
        let mut rows: Vec<[Value; 8]> = Vec::with_capacity(rollups.len() + 1);
        let mut total = [0i64; 4];
        let (mut oldest_pending, mut oldest_building) = (0i64, 0i64);
        for r in &rollups {
            let (p, b) = (
                age(r.oldest_pending_since_ms),
                age(r.oldest_building_since_ms),
            );
            oldest_pending = oldest_pending.max(p);
            oldest_building = oldest_building.max(b);
            for (t, n) in total
                .iter_mut()
                .zip([r.pending, r.assigned, r.building, r.running])
            {
                *t += n;
            }
            rows.push([
                Value::Text(r.root_job_id.clone()),
                Value::Int(now),
                Value::Int(r.pending),
                Value::Int(r.assigned),
                Value::Int(r.building),
                Value::Int(r.running),
                Value::Int(p),
                Value::Int(b),
            ]);
        }
        rows.push([
            Value::Text(CLUSTER_ROLLUP.into()),
            Value::Int(now),
            Value::Int(total[0]),
            Value::Int(total[1]),
            Value::Int(total[2]),
            Value::Int(total[3]),
            Value::Int(oldest_pending),
            Value::Int(oldest_building),
        ]);
        self.ensure(TASK_STATE_NAMESPACE, TASK_STATE_COLUMNS, "root_job_id")?;
        let batch: Vec<_> = TASK_STATE_COLUMNS
            .iter()
            .enumerate()
            .map(|(i, (name, kind))| data(name, *kind, rows.iter().map(|r| r[i].clone()).collect()))
            .collect();
        lock(&self.stats)
            .write(TASK_STATE_NAMESPACE, &batch, now)
            .map_err(stats_error)?;
        Ok(rows.len())
    }

    /// Keeps a captured profile in `iris.profile` (a failure to keep it is logged: the caller
    /// has its profile either way).
    pub(crate) fn record_profile(&self, c: &Capture<'_>) {
        let result = (|| -> Result<()> {
            self.ensure(PROFILE_NAMESPACE, PROFILE_COLUMNS, "source")?;
            let text = |s: &str| vec![Value::Text(s.into())];
            let batch = vec![
                data("source", ColumnKind::String, text(c.source)),
                data(
                    "attempt_id",
                    ColumnKind::Int64,
                    vec![c.attempt_id.map_or(Value::Null, Value::Int)],
                ),
                data("vm_id", ColumnKind::String, text(c.vm_id)),
                data(
                    "captured_at",
                    ColumnKind::TimestampMs,
                    vec![Value::Int(iris_store::now_ms())],
                ),
                data(
                    "duration_seconds",
                    ColumnKind::Int64,
                    vec![Value::Int(c.duration_seconds)],
                ),
                data("type", ColumnKind::String, text(c.kind)),
                data("format", ColumnKind::String, text(c.format)),
                data("trigger", ColumnKind::String, text("on_demand")),
                data(
                    "profile_data",
                    ColumnKind::Bytes,
                    vec![Value::Blob(c.data.to_vec())],
                ),
            ];
            lock(&self.stats)
                .write(PROFILE_NAMESPACE, &batch, iris_store::now_ms())
                .map_err(stats_error)?;
            Ok(())
        })();
        if let Err(e) = result {
            tracing::warn!(source = %c.source, error = %e, "keeping a profile in iris.profile");
        }
    }
}
