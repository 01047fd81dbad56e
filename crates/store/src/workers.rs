//! Workers: registration, liveness, and the rows the scheduler and the views read.

use crate::{Raw, Read, Result, Tx};
use iris_types::{AttrValue, Resources, TaskState};
use rusqlite::{params, OptionalExtension};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

/// What a worker registers.
#[derive(Clone, Debug, Default)]
pub struct Registration {
    pub worker_id: String,
    pub address: String,
    pub hostname: String,
    pub ip_address: String,
    pub cpu_count: i64,
    pub memory_bytes: i64,
    pub disk_bytes: i64,
    /// The advertised device, as JSON, for operators.
    pub device_json: Option<String>,
    pub total: Resources,
    /// `cpu`, `gpu` or `tpu`.
    pub device_type: String,
    /// `cpu` for CPU workers, else the accelerator variant.
    pub device_variant: String,
    pub slice_id: String,
    pub scale_group: String,
    pub attributes: Vec<(String, AttrValue)>,
    /// The full metadata as the worker sent it (binary protobuf), returned by `ListWorkers`.
    pub metadata_blob: Vec<u8>,
}

/// Bumped after every commit that wrote a worker row or its attributes (registration,
/// removal). A reader that takes the generation *before* its read transaction's first read
/// and finds it unchanged later may reuse what it read: a write committed after that read
/// bumps it afterwards. Shared by every DB in the process, so another controller's writes
/// (tests run several) only cost a re-read.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The workers' generation (see [`GENERATION`]).
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

pub(crate) fn bump_generation() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Inserts or updates a worker and its attributes; it is healthy from now.
pub fn upsert(tx: &Tx<'_>, r: &Registration, now: i64) -> Result<()> {
    tx.workers_changed.set(true);
    let tx = tx.raw();
    tx.prepare_cached(
        "INSERT INTO workers(worker_id, address, md_hostname, md_ip_address, md_cpu_count, md_memory_bytes, md_disk_bytes,
            md_device_json, total_cpu_millicores, total_memory_bytes, total_gpu_count, total_tpu_count, device_type,
            device_variant, slice_id, scale_group, healthy, registered_at_ms, last_heartbeat_ms, metadata_blob)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,1,?17,?17,?18)
         ON CONFLICT(worker_id) DO UPDATE SET address = excluded.address, md_hostname = excluded.md_hostname,
            md_ip_address = excluded.md_ip_address, md_cpu_count = excluded.md_cpu_count, md_memory_bytes = excluded.md_memory_bytes,
            md_disk_bytes = excluded.md_disk_bytes, md_device_json = excluded.md_device_json,
            total_cpu_millicores = excluded.total_cpu_millicores, total_memory_bytes = excluded.total_memory_bytes,
            total_gpu_count = excluded.total_gpu_count, total_tpu_count = excluded.total_tpu_count,
            device_type = excluded.device_type, device_variant = excluded.device_variant, slice_id = excluded.slice_id,
            scale_group = excluded.scale_group, healthy = 1, last_heartbeat_ms = excluded.last_heartbeat_ms,
            metadata_blob = excluded.metadata_blob",
    )?
    .execute(params![
        r.worker_id,
        r.address,
        r.hostname,
        r.ip_address,
        r.cpu_count,
        r.memory_bytes,
        r.disk_bytes,
        r.device_json,
        r.total.cpu_millicores,
        r.total.memory_bytes,
        r.total.gpu,
        r.total.tpu,
        r.device_type,
        r.device_variant,
        r.slice_id,
        r.scale_group,
        now,
        r.metadata_blob,
    ])?;
    tx.prepare_cached("DELETE FROM worker_attributes WHERE worker_id = ?1")?
        .execute([&r.worker_id])?;
    let mut ins = tx.prepare_cached(
        "INSERT INTO worker_attributes(worker_id, key, value_type, str_value, int_value, float_value) VALUES (?1,?2,?3,?4,?5,?6)",
    )?;
    for (k, v) in &r.attributes {
        let (t, sv, iv, fv) = match v {
            AttrValue::Int(i) => ("int", None, Some(*i), None),
            AttrValue::Float(f) => ("float", None, None, Some(*f)),
            AttrValue::Str(s) => ("str", Some(s.as_str()), None, None),
        };
        ins.execute(params![r.worker_id, k, t, sv, iv, fv])?;
    }
    Ok(())
}

/// Every registered worker id.
pub fn ids(c: &impl Read) -> Result<Vec<String>> {
    let mut st = c
        .raw()
        .prepare_cached("SELECT worker_id FROM workers ORDER BY worker_id")?;
    let rows = st.query_map([], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// A worker's address, if it is registered.
pub fn address(c: &impl Read, worker_id: &str) -> Result<Option<String>> {
    Ok(c.raw()
        .prepare_cached("SELECT address FROM workers WHERE worker_id = ?1")?
        .query_row([worker_id], |r| r.get(0))
        .optional()?)
}

/// Every worker's address.
pub fn addresses(c: &impl Read) -> Result<BTreeMap<String, String>> {
    let mut st = c
        .raw()
        .prepare_cached("SELECT worker_id, address FROM workers")?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// A successful reconcile: the worker is alive.
pub fn heartbeat(tx: &Tx<'_>, worker_id: &str, now: i64) -> Result<()> {
    tx.raw()
        .prepare_cached(
            "UPDATE workers SET last_heartbeat_ms = ?2, healthy = 1 WHERE worker_id = ?1",
        )?
        .execute(params![worker_id, now])?;
    Ok(())
}

/// A worker as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct Capacity {
    pub worker_id: String,
    pub address: String,
    pub total: Resources,
    /// Lower-case accelerator variant; empty for CPU workers.
    pub device_variant: String,
    pub healthy: bool,
    pub attributes: BTreeMap<String, AttrValue>,
}

/// A stored `device_variant` as the scheduler takes it: lower-case, empty for CPU.
pub fn scheduler_variant(stored: &str) -> String {
    if stored.eq_ignore_ascii_case("cpu") {
        String::new()
    } else {
        stored.to_ascii_lowercase()
    }
}

/// Every worker with its capacity and attributes, by id.
pub fn capacities(c: &impl Read) -> Result<Vec<Capacity>> {
    let c = c.raw();
    let mut attrs: BTreeMap<String, BTreeMap<String, AttrValue>> = BTreeMap::new();
    {
        let mut st = c.prepare_cached(
            "SELECT worker_id, key, value_type, str_value, int_value, float_value FROM worker_attributes",
        )?;
        let mut rows = st.query([])?;
        while let Some(r) = rows.next()? {
            let w: String = r.get(0)?;
            let k: String = r.get(1)?;
            let t: String = r.get(2)?;
            let v = match t.as_str() {
                "int" => AttrValue::Int(r.get::<_, Option<i64>>(4)?.unwrap_or(0)),
                "float" => AttrValue::Float(r.get::<_, Option<f64>>(5)?.unwrap_or(0.0)),
                _ => AttrValue::Str(r.get::<_, Option<String>>(3)?.unwrap_or_default()),
            };
            attrs.entry(w).or_default().insert(k, v);
        }
    }
    let mut st = c.prepare_cached(
        "SELECT worker_id, total_cpu_millicores, total_memory_bytes, md_disk_bytes, total_gpu_count, total_tpu_count, device_variant, healthy, address
         FROM workers ORDER BY worker_id",
    )?;
    let rows = st.query_map([], |r| {
        let v: String = r.get(6)?;
        Ok(Capacity {
            worker_id: r.get(0)?,
            total: Resources {
                cpu_millicores: r.get(1)?,
                memory_bytes: r.get(2)?,
                disk_bytes: r.get::<_, Option<i64>>(3)?.unwrap_or(0),
                gpu: r.get(4)?,
                tpu: r.get(5)?,
            },
            device_variant: scheduler_variant(&v),
            healthy: r.get::<_, i64>(7)? != 0,
            address: r.get(8)?,
            attributes: BTreeMap::new(),
        })
    })?;
    let mut out: Vec<Capacity> = rows.collect::<rusqlite::Result<_>>()?;
    for w in &mut out {
        if let Some(a) = attrs.remove(&w.worker_id) {
            w.attributes = a;
        }
    }
    Ok(out)
}

/// A worker as `ListWorkers` shows it.
#[derive(Clone, Debug)]
pub struct Listed {
    pub worker_id: String,
    pub address: String,
    pub healthy: bool,
    pub last_heartbeat_ms: Option<i64>,
    pub metadata_blob: Option<Vec<u8>>,
    pub scale_group: String,
    /// The tasks with an attempt still holding this worker (the wire's `running_job_ids`, which
    /// holds task ids in the reference too).
    pub running_task_ids: Vec<String>,
}

/// Every worker, by id, with the jobs holding it.
pub fn list(c: &impl Read) -> Result<Vec<Listed>> {
    let c = c.raw();
    let mut st = c.prepare_cached(
        "SELECT worker_id, address, healthy, last_heartbeat_ms, metadata_blob, scale_group FROM workers ORDER BY worker_id",
    )?;
    let rows = st.query_map([], |r| {
        Ok(Listed {
            worker_id: r.get(0)?,
            address: r.get(1)?,
            healthy: r.get::<_, i64>(2)? != 0,
            last_heartbeat_ms: r.get(3)?,
            metadata_blob: r.get(4)?,
            scale_group: r.get::<_, Option<String>>(5)?.unwrap_or_default(),
            running_task_ids: Vec::new(),
        })
    })?;
    let mut out: Vec<Listed> = rows.collect::<rusqlite::Result<_>>()?;
    let mut st = c.prepare_cached(
        "SELECT task_id FROM task_attempts WHERE worker_id = ?1 AND finished_at_ms IS NULL
         ORDER BY task_id",
    )?;
    for w in &mut out {
        let rows = st.query_map([&w.worker_id], |r| r.get(0))?;
        w.running_task_ids = rows.collect::<rusqlite::Result<_>>()?;
    }
    Ok(out)
}

/// One attempt a worker should hold (for building the reconcile desired set).
#[derive(Clone, Debug)]
pub struct DesiredRow {
    pub attempt_uid: String,
    pub task_id: String,
    pub attempt_id: i64,
    pub attempt_state: TaskState,
    /// The attempt is its task's current one and the task is active (ASSIGNED, BUILDING or
    /// RUNNING). When not, the controller has moved the task on (pending again, ended, or on a
    /// newer attempt) and the attempt must stop.
    pub current_of_active_task: bool,
}

/// Every reconcile of every worker reads these rows: with thousands of workers, thousands of
/// reads a second, each after another connection's commit has dropped the reader's page cache.
/// So both lookups are answered from small partial indexes alone (migration 0012): the open
/// attempts of a worker lie together in `idx_attempts_open` (keyed by worker), and only active
/// tasks are in `idx_tasks_active`, so an attempt whose task is not there is one to stop. Before,
/// each row cost a read of its attempt's and its task's table pages, scattered over the whole DB
/// (23% of the controller's CPU at C1M shape, half of it `pread`; BENCHMARKS.md). The job comes
/// from the task id, and what a launch needs of it from the controller's cached spec.
fn open_attempts_sql(attempts_index: &str, filter: &str) -> String {
    format!(
        "SELECT a.attempt_uid, a.task_id, a.attempt_id, a.state, t.current_attempt_id
         FROM task_attempts a INDEXED BY {attempts_index}
         LEFT JOIN tasks t INDEXED BY idx_tasks_active
           ON t.task_id = a.task_id AND ({})
         WHERE {filter} AND a.finished_at_ms IS NULL ORDER BY a.created_at_ms",
        crate::sets::tasks_matching("t.state", TaskState::is_active)
    )
}

static OPEN_ON_WORKER: LazyLock<String> =
    LazyLock::new(|| open_attempts_sql("idx_attempts_open", "a.worker_id = ?1"));
static OPEN_ON_BACKEND: LazyLock<String> = LazyLock::new(|| {
    open_attempts_sql(
        "idx_attempts_open_backend",
        "a.backend_id = ?1 AND a.worker_id IS NULL",
    )
});

/// Open attempts (no `finished_at`) on a worker, oldest first.
pub fn open_attempts(c: &impl Read, worker_id: &str) -> Result<Vec<DesiredRow>> {
    open_rows(c, &OPEN_ON_WORKER, worker_id)
}

/// Open attempts of an in-process backend (attempts with no worker), oldest first.
pub fn open_backend_attempts(c: &impl Read, backend_id: &str) -> Result<Vec<DesiredRow>> {
    open_rows(c, &OPEN_ON_BACKEND, backend_id)
}

fn open_rows(c: &impl Read, sql: &str, holder: &str) -> Result<Vec<DesiredRow>> {
    let mut st = c.raw().prepare_cached(sql)?;
    let rows = st.query_map([holder], |r| {
        let attempt_id: i64 = r.get(2)?;
        let current: Option<i64> = r.get(4)?;
        Ok(DesiredRow {
            attempt_uid: r.get(0)?,
            task_id: r.get(1)?,
            attempt_id,
            attempt_state: TaskState::from_code(r.get(3)?).unwrap_or(TaskState::Unspecified),
            current_of_active_task: current == Some(attempt_id),
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Db;

    fn registration(id: &str) -> Registration {
        Registration {
            worker_id: id.into(),
            address: "127.0.0.1:1".into(),
            ..Default::default()
        }
    }

    /// A worker's desired set is read from the two partial indexes alone (no table page of an
    /// attempt or a task is read), which is what makes it cheap at thousands of reads a second;
    /// an in-process backend's reads its attempts' rows, but its tasks from the active index too.
    #[test]
    fn a_desired_set_is_read_from_covering_indexes_only() {
        let db = Db::open_in_memory().expect("db");
        for sql in [&*OPEN_ON_WORKER, &*OPEN_ON_BACKEND] {
            let mut st = db
                .raw()
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .expect("plan");
            let plan: Vec<String> = st
                .query_map([""], |r| r.get(3))
                .expect("plan rows")
                .collect::<rusqlite::Result<_>>()
                .expect("plan rows");
            let plan = plan.join("\n");
            assert!(
                plan.contains("COVERING INDEX idx_tasks_active"),
                "tasks from the active index alone:\n{plan}"
            );
            if sql == &*OPEN_ON_WORKER {
                assert!(
                    plan.contains("COVERING INDEX idx_attempts_open"),
                    "a worker's attempts from the open index alone:\n{plan}"
                );
                assert!(!plan.contains("TEMP B-TREE"), "no sort:\n{plan}");
            }
        }
    }

    #[test]
    fn the_generation_moves_when_a_worker_write_commits() {
        let mut db = Db::open_in_memory().expect("db");
        // Other tests in this process bump it too, so only "it moved" can be checked.
        let tx = db.begin().expect("tx");
        upsert(&tx, &registration("w1"), 1).expect("upsert");
        let before_commit = generation();
        tx.commit().expect("commit");
        assert!(
            generation() > before_commit,
            "registering moves the generation"
        );
        let g1 = generation();
        let tx = db.begin().expect("tx");
        crate::apply::fail_worker(&tx, "w1", 2).expect("fail worker");
        tx.commit().expect("commit");
        assert!(generation() > g1, "removing a worker moves the generation");
        assert!(ids(&db).expect("ids").is_empty());
    }
}
