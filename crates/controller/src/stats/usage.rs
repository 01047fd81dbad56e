//! Per-task resource samples (`iris.task`): workers report each running attempt's CPU and
//! memory on their reconcile answers; the controller keeps at most one sample per attempt every
//! [`SAMPLE_EVERY_MS`] (and every one that raises the attempt's peak memory), writes them to the stats store in the mirror pass, and shows the newest
//! (with the attempt's peak memory) as a task's `resource_usage`, which `job describe` prints.

use super::{data, stats_error};
use crate::error::Result;
use crate::{lock, Controller};
use iris_proto::job;
use iris_store::stats::{ColumnKind, Policy, StatsColumn, Value};
use std::collections::{HashMap, VecDeque};

pub(crate) const TASK_NAMESPACE: &str = "iris.task";
pub(crate) const WORKER_NAMESPACE: &str = "iris.worker";
/// At most one sample per attempt this often.
const SAMPLE_EVERY_MS: i64 = 5_000;
/// Samples waiting for the mirror pass beyond this are dropped, oldest first.
const MAX_PENDING: usize = 100_000;

struct Sample {
    attempt_uid: String,
    worker_id: String,
    ts_ms: i64,
    usage: job::ResourceUsage,
}

/// Samples not yet written, and when each attempt was last sampled.
#[derive(Default)]
pub(crate) struct UsageBuffer {
    /// Per attempt: when it was last kept, and the peak memory it showed.
    last: HashMap<String, (i64, i64)>,
    pending: VecDeque<Sample>,
    /// Host snapshots per worker, at most one per [`SAMPLE_EVERY_MS`].
    hosts_last: HashMap<String, i64>,
    hosts: VecDeque<(String, i64, job::WorkerResourceSnapshot)>,
}

const WORKER_COLUMNS: &[(&str, ColumnKind)] = &[
    ("worker_id", ColumnKind::String),
    ("ts", ColumnKind::TimestampMs),
    ("status", ColumnKind::String),
    ("cpu_pct", ColumnKind::Float64),
    ("mem_bytes", ColumnKind::Int64),
    ("mem_total_bytes", ColumnKind::Int64),
    ("disk_used_bytes", ColumnKind::Int64),
    ("disk_total_bytes", ColumnKind::Int64),
    ("running_task_count", ColumnKind::Int64),
    ("total_process_count", ColumnKind::Int64),
    ("net_recv_bytes", ColumnKind::Int64),
    ("net_sent_bytes", ColumnKind::Int64),
];

fn task_columns() -> Vec<StatsColumn> {
    [
        ("task_id", ColumnKind::String),
        ("attempt_id", ColumnKind::Int64),
        ("worker_id", ColumnKind::String),
        ("ts", ColumnKind::TimestampMs),
        ("cpu_millicores", ColumnKind::Int64),
        ("memory_mb", ColumnKind::Int64),
        ("disk_mb", ColumnKind::Int64),
        ("memory_peak_mb", ColumnKind::Int64),
        ("accelerator_util_pct", ColumnKind::Float64),
        ("accelerator_mem_bytes", ColumnKind::Int64),
    ]
    .into_iter()
    .map(|(name, kind)| StatsColumn {
        name: name.into(),
        kind,
        nullable: true,
    })
    .collect()
}

impl Controller {
    /// Keeps the usage a worker reported for its attempts (rate-limited per attempt).
    pub(crate) fn note_usage(&self, worker_id: &str, samples: Vec<(String, job::ResourceUsage)>) {
        if samples.is_empty() {
            return;
        }
        let now = iris_store::now_ms();
        let mut buf = lock(&self.usage);
        for (uid, usage) in samples {
            if buf.last.get(&uid).is_some_and(|&(at, peak)| {
                now - at < SAMPLE_EVERY_MS && usage.memory_peak_mb <= peak
            }) {
                continue;
            }
            buf.last.insert(uid.clone(), (now, usage.memory_peak_mb));
            if buf.pending.len() >= MAX_PENDING {
                buf.pending.pop_front();
            }
            buf.pending.push_back(Sample {
                attempt_uid: uid,
                worker_id: worker_id.to_string(),
                ts_ms: now,
                usage,
            });
        }
    }

    /// Keeps a worker's host snapshot (rate-limited per worker) for `iris.worker`.
    pub(crate) fn note_host(&self, worker_id: &str, snapshot: job::WorkerResourceSnapshot) {
        let now = iris_store::now_ms();
        let mut buf = lock(&self.usage);
        if buf
            .hosts_last
            .get(worker_id)
            .is_some_and(|&at| now - at < SAMPLE_EVERY_MS)
        {
            return;
        }
        buf.hosts_last.insert(worker_id.to_string(), now);
        if buf.hosts.len() >= MAX_PENDING {
            buf.hosts.pop_front();
        }
        buf.hosts.push_back((worker_id.to_string(), now, snapshot));
    }

    /// Writes the host snapshots kept since the last pass to `iris.worker`.
    fn flush_hosts(&self) -> Result<usize> {
        let hosts: Vec<_> = {
            let mut buf = lock(&self.usage);
            let now = iris_store::now_ms();
            buf.hosts_last.retain(|_, at| now - *at < 60_000);
            buf.hosts.drain(..).collect()
        };
        if hosts.is_empty() {
            return Ok(0);
        }
        let int = |f: fn(&job::WorkerResourceSnapshot) -> i64| -> Vec<Value> {
            hosts.iter().map(|h| Value::Int(f(&h.2))).collect()
        };
        let batch = vec![
            data(
                "worker_id",
                ColumnKind::String,
                hosts.iter().map(|h| Value::Text(h.0.clone())).collect(),
            ),
            data(
                "ts",
                ColumnKind::TimestampMs,
                hosts.iter().map(|h| Value::Int(h.1)).collect(),
            ),
            data(
                "status",
                ColumnKind::String,
                hosts
                    .iter()
                    .map(|h| {
                        Value::Text(
                            if h.2.running_task_count > 0 {
                                "RUNNING"
                            } else {
                                "IDLE"
                            }
                            .into(),
                        )
                    })
                    .collect(),
            ),
            data(
                "cpu_pct",
                ColumnKind::Float64,
                hosts
                    .iter()
                    .map(|h| Value::Real(f64::from(h.2.host_cpu_percent)))
                    .collect(),
            ),
            data("mem_bytes", ColumnKind::Int64, int(|s| s.memory_used_bytes)),
            data(
                "mem_total_bytes",
                ColumnKind::Int64,
                int(|s| s.memory_total_bytes),
            ),
            data(
                "disk_used_bytes",
                ColumnKind::Int64,
                int(|s| s.disk_used_bytes),
            ),
            data(
                "disk_total_bytes",
                ColumnKind::Int64,
                int(|s| s.disk_total_bytes),
            ),
            data(
                "running_task_count",
                ColumnKind::Int64,
                int(|s| s.running_task_count.into()),
            ),
            data(
                "total_process_count",
                ColumnKind::Int64,
                int(|s| s.total_process_count.into()),
            ),
            data(
                "net_recv_bytes",
                ColumnKind::Int64,
                int(|s| s.net_recv_bytes),
            ),
            data(
                "net_sent_bytes",
                ColumnKind::Int64,
                int(|s| s.net_sent_bytes),
            ),
        ];
        let mut stats = lock(&self.stats);
        if stats
            .namespace(WORKER_NAMESPACE)
            .map_err(stats_error)?
            .is_none()
        {
            let cols = WORKER_COLUMNS
                .iter()
                .map(|(name, kind)| StatsColumn {
                    name: (*name).into(),
                    kind: *kind,
                    nullable: true,
                })
                .collect();
            stats
                .register(WORKER_NAMESPACE, cols, "worker_id", Policy::default())
                .map_err(stats_error)?;
        }
        stats
            .write(WORKER_NAMESPACE, &batch, iris_store::now_ms())
            .map_err(stats_error)?;
        Ok(hosts.len())
    }

    /// Writes the samples kept since the last pass to `iris.task` (and the hosts' to
    /// `iris.worker`); returns how many task samples.
    pub(crate) fn flush_usage(&self) -> Result<usize> {
        self.flush_hosts()?;
        let samples: Vec<Sample> = {
            let mut buf = lock(&self.usage);
            let now = iris_store::now_ms();
            // Attempts not sampled for a minute have ended: forget them.
            buf.last.retain(|_, (at, _)| now - *at < 60_000);
            buf.pending.drain(..).collect()
        };
        if samples.is_empty() {
            return Ok(0);
        }
        let mut rows: Vec<(String, i64, &Sample)> = Vec::with_capacity(samples.len());
        {
            let snap = lock(&self.snap);
            let tx = snap.begin_read()?;
            for s in &samples {
                if let Some((task, attempt)) =
                    iris_store::events::attempt_identity(&tx, &s.attempt_uid)?
                {
                    rows.push((task, attempt, s));
                }
            }
        }
        let col = |f: &dyn Fn(&(String, i64, &Sample)) -> Value| rows.iter().map(f).collect();
        let batch = vec![
            data(
                "task_id",
                ColumnKind::String,
                col(&|r| Value::Text(r.0.clone())),
            ),
            data("attempt_id", ColumnKind::Int64, col(&|r| Value::Int(r.1))),
            data(
                "worker_id",
                ColumnKind::String,
                col(&|r| Value::Text(r.2.worker_id.clone())),
            ),
            data(
                "ts",
                ColumnKind::TimestampMs,
                col(&|r| Value::Int(r.2.ts_ms)),
            ),
            data(
                "cpu_millicores",
                ColumnKind::Int64,
                col(&|r| Value::Int(r.2.usage.cpu_millicores.into())),
            ),
            data(
                "memory_mb",
                ColumnKind::Int64,
                col(&|r| Value::Int(r.2.usage.memory_mb)),
            ),
            data(
                "disk_mb",
                ColumnKind::Int64,
                col(&|r| Value::Int(r.2.usage.disk_mb)),
            ),
            data(
                "memory_peak_mb",
                ColumnKind::Int64,
                col(&|r| Value::Int(r.2.usage.memory_peak_mb)),
            ),
        ];
        let mut stats = lock(&self.stats);
        if stats
            .namespace(TASK_NAMESPACE)
            .map_err(stats_error)?
            .is_none()
        {
            stats
                .register(TASK_NAMESPACE, task_columns(), "task_id", Policy::default())
                .map_err(stats_error)?;
        }
        stats
            .write(TASK_NAMESPACE, &batch, iris_store::now_ms())
            .map_err(stats_error)?;
        Ok(rows.len())
    }

    /// `ListTaskSamples`: a task's newest samples, oldest first (what the dashboard plots).
    pub(crate) async fn list_task_samples(
        &self,
        req: iris_proto::inspect::ListTaskSamplesRequest,
    ) -> Result<iris_proto::inspect::ListTaskSamplesResponse> {
        use crate::error::Error;
        let task = iris_types::TaskId::parse(&req.task_id)
            .map_err(|e| Error::invalid(format!("task_id: {e}")))?;
        let limit = match req.limit {
            0 => 720,
            n @ 1..=10_000 => n as usize,
            n => {
                return Err(Error::invalid(format!(
                    "limit: {n} is out of range; use 1..10000 (0 = 720)"
                )))
            }
        };
        let caller = crate::auth::caller();
        if caller.role != iris_auth::Role::Dashboard {
            crate::auth::check_owner(&caller, task.job.as_str(), "read resource samples of job")?;
        }
        let columns = [
            "ts",
            "attempt_id",
            "cpu_millicores",
            "memory_mb",
            "memory_peak_mb",
        ];
        let rows = lock(&self.stats)
            .newest_for_key(TASK_NAMESPACE, &req.task_id, &columns, limit)
            .map_err(stats_error)?;
        let int = |v: &Value| match v {
            Value::Int(i) => *i,
            _ => 0,
        };
        let samples = rows
            .iter()
            .map(|r| iris_proto::inspect::TaskSample {
                ts_ms: int(&r[0]),
                attempt_id: i32::try_from(int(&r[1])).unwrap_or(-1),
                cpu_millicores: i32::try_from(int(&r[2])).unwrap_or(i32::MAX),
                memory_mb: int(&r[3]),
                memory_peak_mb: int(&r[4]),
            })
            .collect();
        Ok(iris_proto::inspect::ListTaskSamplesResponse { samples })
    }

    /// Sets each task's `resource_usage` to its newest sample, where there is one.
    pub(crate) fn fill_usage(&self, tasks: &mut [job::TaskStatus]) {
        let ids: Vec<String> = tasks.iter().map(|t| t.task_id().to_string()).collect();
        let columns = ["memory_mb", "disk_mb", "cpu_millicores", "memory_peak_mb"];
        let latest = match lock(&self.stats).latest_by_key(TASK_NAMESPACE, &ids, &columns) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "reading task resource samples");
                return;
            }
        };
        let int = |v: Option<&Value>| match v {
            Some(Value::Int(i)) => *i,
            _ => 0,
        };
        for t in tasks {
            if let Some(v) = latest.get(t.task_id()) {
                t.resource_usage = Some(job::ResourceUsage {
                    memory_mb: int(v.first()),
                    disk_mb: int(v.get(1)),
                    cpu_millicores: i32::try_from(int(v.get(2))).unwrap_or(i32::MAX),
                    memory_peak_mb: int(v.get(3)),
                    process_count: 0,
                });
            }
        }
    }
}
