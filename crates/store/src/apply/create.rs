//! Creating and deleting jobs: a job's first state (PENDING, or FAILED for a submission that can
//! never run) and its tasks' (PENDING) are written here, the only writes of a state column
//! outside the transition functions.

use crate::{Result, Tx};
use iris_types::{JobState, TaskState};
use rusqlite::{params, OptionalExtension};

/// Resolved job configuration, as stored in `job_config`.
#[derive(Clone, Debug, Default)]
pub struct JobConfigRow {
    pub res_cpu_millicores: i64,
    pub res_memory_bytes: i64,
    pub res_disk_bytes: i64,
    pub res_device_json: Option<String>,
    pub constraints_json: Option<String>,
    pub coscheduling_group_by: Option<String>,
    pub scheduling_timeout_ms: Option<i64>,
    pub max_task_failures: i64,
    pub entrypoint_json: Option<String>,
    pub environment_json: Option<String>,
    pub bundle_id: Option<String>,
    pub ports_json: Option<String>,
    pub max_retries_failure: i64,
    pub max_retries_preemption: i64,
    pub timeout_ms: Option<i64>,
    pub preemption_policy: i32,
    pub existing_job_policy: i32,
    pub priority_band: i32,
    pub task_image: Option<String>,
    pub submit_argv_json: Option<String>,
    /// The full LaunchJobRequest (minus bundle bytes) as binary protobuf.
    pub request_blob: Vec<u8>,
}

/// A job to insert.
#[derive(Clone, Debug, Default)]
pub struct NewJob {
    pub job_id: String,
    pub user_id: String,
    pub submitting_user: String,
    pub parent_job_id: Option<String>,
    pub root_job_id: String,
    pub depth: u32,
    pub num_tasks: u32,
    /// `Some(error)`: insert directly as FAILED with no tasks (invalid replica count).
    pub failed: Option<String>,
    pub cfg: JobConfigRow,
    pub workdir_files: Vec<(String, Vec<u8>)>,
    /// The job's secrets (name, value), stored apart from `cfg` (which must not carry them).
    pub secrets: Vec<(String, String)>,
    /// `Some(peer)`: a job queued for a federation peer (`""` while unpinned). It gets no task
    /// rows here: the peer runs it and its tasks are mirrored back.
    pub federated: Option<String>,
}

/// Inserts a job, its config and its tasks. Returns `submitted_at_ms` (strictly increasing).
pub fn insert_job(tx: &Tx<'_>, j: &NewJob, now: i64) -> Result<i64> {
    let outer = tx;
    let tx = &tx.tx;
    let last: Option<i64> = tx
        .prepare_cached("SELECT MAX(submitted_at_ms) FROM jobs")?
        .query_row([], |r| r.get(0))?;
    let submitted = now.max(last.map(|l| l + 1).unwrap_or(now));
    let root_submitted: i64 = match &j.parent_job_id {
        Some(p) => tx
            .query_row(
                "SELECT root_submitted_at_ms FROM jobs WHERE job_id = ?1",
                [p],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(submitted),
        None => submitted,
    };
    let deadline = j
        .cfg
        .scheduling_timeout_ms
        .filter(|t| *t > 0)
        .map(|t| submitted + t);
    let (state, err, finished) = match &j.failed {
        Some(e) => (JobState::Failed.code(), Some(e.clone()), Some(submitted)),
        None => (JobState::Pending.code(), None, None),
    };
    let num_tasks = if j.failed.is_some() { 0 } else { j.num_tasks };
    let cluster = j.federated.as_deref().unwrap_or("local");
    tx.prepare_cached(
        "INSERT INTO jobs(job_id, user_id, submitting_user, parent_job_id, root_job_id, depth, state,
            submitted_at_ms, root_submitted_at_ms, finished_at_ms, scheduling_deadline_epoch_ms, error,
            num_tasks, name, backend_id, cluster)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,'default',?15)",
    )?
    .execute(params![
        j.job_id,
        j.user_id,
        j.submitting_user,
        j.parent_job_id,
        j.root_job_id,
        j.depth,
        state,
        submitted,
        root_submitted,
        finished,
        deadline,
        err,
        num_tasks,
        j.job_id.to_lowercase(),
        cluster,
    ])?;
    crate::federation::log_received_child(tx, &j.job_id, &j.root_job_id, i64::from(j.depth))?;
    let c = &j.cfg;
    tx.prepare_cached(
        "INSERT INTO job_config(job_id, res_cpu_millicores, res_memory_bytes, res_disk_bytes, res_device_json,
            constraints_json, has_coscheduling, coscheduling_group_by, scheduling_timeout_ms, max_task_failures,
            entrypoint_json, environment_json, bundle_id, ports_json, max_retries_failure, max_retries_preemption,
            timeout_ms, preemption_policy, existing_job_policy, priority_band, task_image, submit_argv_json,
            request_blob)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23)",
    )?
    .execute(params![
        j.job_id,
        c.res_cpu_millicores,
        c.res_memory_bytes,
        c.res_disk_bytes,
        c.res_device_json,
        c.constraints_json,
        c.coscheduling_group_by.is_some() as i32,
        c.coscheduling_group_by,
        c.scheduling_timeout_ms,
        c.max_task_failures,
        c.entrypoint_json,
        c.environment_json,
        c.bundle_id,
        c.ports_json,
        c.max_retries_failure,
        c.max_retries_preemption,
        c.timeout_ms,
        c.preemption_policy,
        c.existing_job_policy,
        c.priority_band,
        c.task_image,
        c.submit_argv_json,
        c.request_blob,
    ])?;
    for (name, value) in &j.secrets {
        tx.prepare_cached("INSERT INTO job_secrets(job_id, name, value) VALUES (?1,?2,?3)")?
            .execute(params![j.job_id, name, value])?;
    }
    for (name, data) in &j.workdir_files {
        tx.prepare_cached(
            "INSERT INTO job_workdir_files(job_id, filename, data) VALUES (?1,?2,?3)",
        )?
        .execute(params![j.job_id, name, data])?;
    }
    if num_tasks > 0 && j.federated.is_none() {
        let first = outer.reserve_insertions(num_tasks as i64)?;
        let mut st = tx.prepare_cached(
            "INSERT INTO tasks(task_id, job_id, task_index, state, submitted_at_ms, max_retries_failure,
                max_retries_preemption, current_attempt_id, priority_neg_depth, priority_root_submitted_ms,
                priority_insertion, priority_band, backend_id, cluster)
             VALUES (?1,?2,?3,?4,?5,?6,?7,-1,?8,?9,?10,?11,'default','local')",
        )?;
        for i in 0..num_tasks {
            st.execute(params![
                format!("{}/{}", j.job_id, i),
                j.job_id,
                i,
                TaskState::Pending.code(),
                submitted,
                c.max_retries_failure,
                c.max_retries_preemption,
                -(j.depth as i64),
                root_submitted,
                first + i as i64,
                c.priority_band,
            ])?;
        }
    }
    Ok(submitted)
}

/// Deletes a job and (by cascade) its tasks, attempts and descendants.
pub fn delete_job(tx: &Tx<'_>, job_id: &str) -> Result<()> {
    delete_job_raw(&tx.tx, job_id)
}

/// Every event of the tasks of a job (`?1`) and of its descendants.
static JOB_TREE_EVENTS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    crate::events::delete_chains("job_id = ?1 OR (job_id >= ?1 || '/' AND job_id < ?1 || '0')")
});

/// Subtree matches use the range `[job/, job0)` (`'0'` is the byte after `'/'`), a range scan of
/// the `job_id` index rather than a scan of every row.
pub(crate) fn delete_job_raw(tx: &rusqlite::Connection, job_id: &str) -> Result<()> {
    tx.execute(
        "DELETE FROM endpoints WHERE job_id = ?1 OR (job_id >= ?1 || '/' AND job_id < ?1 || '0')",
        [job_id],
    )?;
    // Before the tasks go (by cascade, with the jobs): their rows lead to their events.
    tx.prepare_cached(&JOB_TREE_EVENTS)?.execute([job_id])?;
    tx.execute(
        "DELETE FROM jobs WHERE job_id = ?1 OR (job_id >= ?1 || '/' AND job_id < ?1 || '0')",
        [job_id],
    )?;
    Ok(())
}
