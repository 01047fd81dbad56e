//! Read models: the rows behind `JobStatus`, `TaskStatus` and their attempts, as plain structs.
//! The controller turns them into wire messages.

use crate::sets::ATTEMPT_PREEMPTION;
use crate::{Read, Result};
use iris_types::{JobState, TaskState};
use rusqlite::{OptionalExtension, Row};
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// A job row with what its status needs.
#[derive(Clone, Debug, Default)]
pub struct JobRow {
    pub job_id: String,
    pub state: i32,
    pub error: Option<String>,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub submitted_at_ms: i64,
    pub name: String,
    pub parent_job_id: Option<String>,
    pub backend_id: Option<String>,
    pub cluster: String,
    pub num_tasks: i32,
    pub submitting_user: String,
    /// The stored request (binary protobuf; empty for mirrored children).
    pub request_blob: Vec<u8>,
    /// Task counts by state.
    pub task_counts: BTreeMap<TaskState, i32>,
    /// The first PENDING task, by index.
    pub first_pending_task: Option<String>,
    /// The status message of the first task waiting on its backend (assigned or building).
    pub first_waiting_message: Option<String>,
    /// FAILED attempts over all tasks.
    pub failure_count: i32,
    /// Charged preemptions over all tasks.
    pub preemption_count: i32,
    pub has_children: bool,
}

const JOB_COLS: &str =
    "j.job_id, j.state, j.error, j.started_at_ms, j.finished_at_ms, j.submitted_at_ms, j.name,
    j.parent_job_id, j.backend_id, j.cluster, j.num_tasks, j.submitting_user, c.request_blob";

fn job_from_row(r: &Row<'_>) -> rusqlite::Result<JobRow> {
    Ok(JobRow {
        job_id: r.get(0)?,
        state: r.get(1)?,
        error: r.get(2)?,
        started_at_ms: r.get(3)?,
        finished_at_ms: r.get(4)?,
        submitted_at_ms: r.get(5)?,
        name: r.get(6)?,
        parent_job_id: r.get(7)?,
        backend_id: r.get(8)?,
        cluster: r.get(9)?,
        num_tasks: r.get(10)?,
        submitting_user: r.get(11)?,
        request_blob: r.get(12)?,
        ..Default::default()
    })
}

static ATTEMPT_TOTALS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT COALESCE(SUM(a.state = {}), 0), COALESCE(SUM(a.state IN {} AND a.started_at_ms IS NOT NULL), 0)
         FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id WHERE t.job_id = ?1",
        TaskState::Failed.code(),
        *ATTEMPT_PREEMPTION
    )
});

fn finish_job(c: &rusqlite::Connection, j: &mut JobRow) -> Result<()> {
    {
        let mut st = c.prepare_cached(
            "SELECT task_id, state, status_message FROM tasks WHERE job_id = ?1 ORDER BY task_index",
        )?;
        let mut rows = st.query([&j.job_id])?;
        while let Some(r) = rows.next()? {
            let tid: String = r.get(0)?;
            let s = TaskState::from_code(r.get(1)?).unwrap_or(TaskState::Unspecified);
            *j.task_counts.entry(s).or_default() += 1;
            if s == TaskState::Pending && j.first_pending_task.is_none() {
                j.first_pending_task = Some(tid);
            } else if matches!(s, TaskState::Assigned | TaskState::Building)
                && j.first_waiting_message.is_none()
            {
                j.first_waiting_message = r.get::<_, Option<String>>(2)?.filter(|m| !m.is_empty());
            }
        }
    }
    let (f, p): (i64, i64) = c
        .prepare_cached(&ATTEMPT_TOTALS)?
        .query_row([&j.job_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    j.failure_count = f as i32;
    j.preemption_count = p as i32;
    j.has_children = c
        .prepare_cached("SELECT EXISTS(SELECT 1 FROM jobs WHERE parent_job_id = ?1)")?
        .query_row([&j.job_id], |r| r.get(0))?;
    Ok(())
}

/// One job with its counts.
pub fn job(c: &impl Read, job_id: &str) -> Result<Option<JobRow>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {JOB_COLS} FROM jobs j JOIN job_config c ON c.job_id = j.job_id WHERE j.job_id = ?1"
        )
    });
    let c = c.raw();
    let j = c
        .prepare_cached(&SQL)?
        .query_row([job_id], job_from_row)
        .optional()?;
    let Some(mut j) = j else { return Ok(None) };
    finish_job(c, &mut j)?;
    Ok(Some(j))
}

/// Filters of `ListJobs`.
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub id_prefix: String,
    /// Matched case-insensitively against the job's name.
    pub name_contains: String,
    pub parent_job_id: String,
    pub ascending: bool,
    pub limit: u32,
    pub offset: u32,
    /// Keyset paging: only jobs after this `(submitted_at_ms, job_id)` in the listing's order
    /// (the last job of the previous page), so a page deep in a large table costs one page.
    pub after: Option<(i64, String)>,
}

/// Counting the jobs that match a filter stops here: past it [`list_jobs`] reports this many and
/// says the figure is a lower bound (counting a million rows would cost far more than the page).
pub const JOB_COUNT_CAP: i64 = 10_000;

/// A page of jobs.
#[derive(Clone, Debug)]
pub struct JobPage {
    pub jobs: Vec<JobRow>,
    /// How many jobs match the filter (all pages), at most [`JOB_COUNT_CAP`].
    pub total: i64,
    /// True when the count stopped at [`JOB_COUNT_CAP`]: at least that many match.
    pub total_is_lower_bound: bool,
    /// True when more jobs follow this page.
    pub has_more: bool,
}

/// A page of jobs, newest first unless `ascending`, with a bounded count of the matches.
pub fn list_jobs(c: &impl Read, f: &JobFilter) -> Result<JobPage> {
    let c = c.raw();
    let mut where_ = vec!["1=1".to_string()];
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    if let Some(s) = f.state {
        args.push((s.code() as i64).into());
        where_.push(format!("j.state = ?{}", args.len()));
    }
    if !f.id_prefix.is_empty() {
        args.push(f.id_prefix.clone().into());
        where_.push(format!(
            "substr(j.job_id, 1, length(?{0})) = ?{0}",
            args.len()
        ));
    }
    if !f.name_contains.is_empty() {
        args.push(f.name_contains.to_lowercase().into());
        where_.push(format!("instr(j.name, ?{}) > 0", args.len()));
    }
    if !f.parent_job_id.is_empty() {
        args.push(f.parent_job_id.clone().into());
        where_.push(format!("j.parent_job_id = ?{}", args.len()));
    }
    let w = where_.join(" AND ");
    let counted: i64 = c.query_row(
        &format!(
            "SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE {w} LIMIT {})",
            JOB_COUNT_CAP + 1
        ),
        rusqlite::params_from_iter(args.iter()),
        |r| r.get(0),
    )?;
    let dir = if f.ascending { "ASC" } else { "DESC" };
    let mut page_where = w;
    if let Some((ms, id)) = &f.after {
        // The listing's order is (submitted_at_ms in `dir`, job_id ascending); `ms <=` (or `>=`)
        // first lets the submitted_at index bound the range.
        let (cmp, strict) = if f.ascending {
            (">=", ">")
        } else {
            ("<=", "<")
        };
        args.push((*ms).into());
        let m = args.len();
        args.push(id.clone().into());
        let i = args.len();
        page_where.push_str(&format!(
            " AND j.submitted_at_ms {cmp} ?{m} AND (j.submitted_at_ms {strict} ?{m} OR j.job_id > ?{i})"
        ));
    }
    // One row past the page says whether more follow, whatever the count says.
    let sql = format!(
        "SELECT {JOB_COLS} FROM jobs j JOIN job_config c ON c.job_id = j.job_id WHERE {page_where}
         ORDER BY j.submitted_at_ms {dir}, j.job_id LIMIT {} OFFSET {}",
        u64::from(f.limit) + 1,
        f.offset
    );
    let mut st = c.prepare(&sql)?;
    let rows = st.query_map(rusqlite::params_from_iter(args.iter()), job_from_row)?;
    let mut jobs: Vec<JobRow> = rows.collect::<rusqlite::Result<_>>()?;
    let has_more = jobs.len() > f.limit as usize;
    jobs.truncate(f.limit as usize);
    for j in &mut jobs {
        finish_job(c, j)?;
    }
    Ok(JobPage {
        jobs,
        total: counted.min(JOB_COUNT_CAP),
        total_is_lower_bound: counted > JOB_COUNT_CAP,
        has_more,
    })
}

/// One attempt of a task.
#[derive(Clone, Debug)]
pub struct AttemptRow {
    pub attempt_id: i64,
    /// The worker, or for attempts mirrored from a peer, the node it ran on.
    pub worker_id: Option<String>,
    pub state: TaskState,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub attempt_uid: String,
}

/// A task's attempts, oldest first.
pub fn attempts(c: &impl Read, task_id: &str) -> Result<Vec<AttemptRow>> {
    attempts_raw(c.raw(), task_id)
}

fn attempts_raw(c: &rusqlite::Connection, task_id: &str) -> Result<Vec<AttemptRow>> {
    let mut st = c.prepare_cached(&format!(
        "SELECT {ATTEMPT_COLS} FROM task_attempts WHERE task_id = ?1 ORDER BY attempt_id"
    ))?;
    let rows = st.query_map([task_id], |r| attempt_row(r, 0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

const ATTEMPT_COLS: &str = "attempt_id, COALESCE(worker_id, node_name), state, exit_code, error, started_at_ms, finished_at_ms, attempt_uid";

/// An `ATTEMPT_COLS` row whose first column is at `at`.
fn attempt_row(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<AttemptRow> {
    Ok(AttemptRow {
        attempt_id: r.get(at)?,
        worker_id: r.get(at + 1)?,
        state: TaskState::from_code(r.get(at + 2)?).unwrap_or(TaskState::Unspecified),
        exit_code: r.get(at + 3)?,
        error: r.get(at + 4)?,
        started_at_ms: r.get(at + 5)?,
        finished_at_ms: r.get(at + 6)?,
        attempt_uid: r.get(at + 7)?,
    })
}

/// The attempts that ran (or run) on a worker, newest first (by creation), at most `limit`, each
/// with its task id: a worker's task history.
pub fn worker_attempts(
    c: &impl Read,
    worker_id: &str,
    limit: u32,
) -> Result<Vec<(String, AttemptRow)>> {
    // `idx_attempts_worker_recent` (migration 0013) serves this order: no sort of a long-lived
    // worker's whole history.
    let mut st = c.raw().prepare_cached(&format!(
        "SELECT task_id, {ATTEMPT_COLS} FROM task_attempts WHERE worker_id = ?1
         ORDER BY created_at_ms DESC LIMIT ?2"
    ))?;
    let rows = st.query_map(rusqlite::params![worker_id, limit], |r| {
        Ok((r.get(0)?, attempt_row(r, 1)?))
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// A task row with its attempts.
#[derive(Clone, Debug, Default)]
pub struct TaskRow {
    pub task_id: String,
    pub state: i32,
    pub worker_id: Option<String>,
    pub worker_address: Option<String>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub current_attempt_id: i64,
    pub submitted_at_ms: Option<i64>,
    pub status_message: Option<String>,
    pub backend_id: Option<String>,
    pub cluster: String,
    pub container_id: Option<String>,
    pub attempts: Vec<AttemptRow>,
}

const TASK_COLS: &str = "task_id, state, current_worker_id, current_worker_address, exit_code, error, current_attempt_id,
    submitted_at_ms, status_message, backend_id, cluster, container_id";

fn task_from_row(r: &Row<'_>) -> rusqlite::Result<TaskRow> {
    Ok(TaskRow {
        task_id: r.get(0)?,
        state: r.get(1)?,
        worker_id: r.get(2)?,
        worker_address: r.get(3)?,
        exit_code: r.get(4)?,
        error: r.get(5)?,
        current_attempt_id: r.get(6)?,
        submitted_at_ms: r.get(7)?,
        status_message: r.get(8)?,
        backend_id: r.get(9)?,
        cluster: r.get(10)?,
        container_id: r.get(11)?,
        attempts: Vec::new(),
    })
}

/// One task with all its attempts.
pub fn task(c: &impl Read, task_id: &str) -> Result<Option<TaskRow>> {
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("SELECT {TASK_COLS} FROM tasks WHERE task_id = ?1"));
    let c = c.raw();
    let t = c
        .prepare_cached(&SQL)?
        .query_row([task_id], task_from_row)
        .optional()?;
    let Some(mut t) = t else { return Ok(None) };
    t.attempts = attempts_raw(c, task_id)?;
    Ok(Some(t))
}

/// A job's tasks by index, each with all its attempts.
pub fn tasks_of_job(c: &impl Read, job_id: &str) -> Result<Vec<TaskRow>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!("SELECT {TASK_COLS} FROM tasks WHERE job_id = ?1 ORDER BY task_index")
    });
    let c = c.raw();
    let mut st = c.prepare_cached(&SQL)?;
    let rows = st.query_map([job_id], task_from_row)?;
    let mut tasks: Vec<TaskRow> = rows.collect::<rusqlite::Result<_>>()?;
    for t in &mut tasks {
        t.attempts = attempts_raw(c, &t.task_id)?;
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::{insert_job, NewJob};
    use crate::Db;

    fn filter(prefix: &str, ascending: bool, after: Option<(i64, String)>) -> JobFilter {
        JobFilter {
            state: None,
            id_prefix: prefix.into(),
            name_contains: String::new(),
            parent_job_id: String::new(),
            ascending,
            limit: 500,
            offset: 0,
            after,
        }
    }

    /// Every job under `prefix`, page by page through the keyset.
    fn walk(db: &Db, prefix: &str, ascending: bool) -> Vec<String> {
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = list_jobs(db, &filter(prefix, ascending, after.clone())).expect("page");
            after = page
                .jobs
                .last()
                .map(|j| (j.submitted_at_ms, j.job_id.clone()));
            seen.extend(page.jobs.into_iter().map(|j| j.job_id));
            if !page.has_more {
                return seen;
            }
        }
    }

    #[test]
    fn keyset_pages_cover_every_job_once_and_the_count_stops_at_its_cap() {
        let mut db = Db::open_in_memory().expect("db");
        let n = JOB_COUNT_CAP as usize + 50;
        let tx = db.begin().expect("tx");
        let mut order = Vec::new();
        for i in 0..n {
            let user = if i % 3 == 0 { "a" } else { "b" };
            let id = format!("/{user}/job-{i:05}");
            let j = NewJob {
                job_id: id.clone(),
                user_id: user.into(),
                submitting_user: user.into(),
                root_job_id: id.clone(),
                depth: 1,
                ..Default::default()
            };
            // Equal submission times would be broken by job id; insert_job keeps them apart.
            insert_job(&tx, &j, 1_000).expect("insert");
            order.push(id);
        }
        tx.commit().expect("commit");

        // Newest 50: the count stops at the cap and says so; more follow.
        let mut newest = filter("", false, None);
        newest.limit = 50;
        let page = list_jobs(&db, &newest).expect("newest");
        assert_eq!(page.jobs.len(), 50);
        assert_eq!(page.jobs[0].job_id, order[n - 1]);
        assert_eq!(
            (page.total, page.total_is_lower_bound),
            (JOB_COUNT_CAP, true)
        );
        assert!(page.has_more);

        // Newest first, past the 5,000 an offset reaches: every job once, in order.
        let desc = walk(&db, "", false);
        let mut expected = order.clone();
        expected.reverse();
        assert_eq!(desc, expected);

        // Oldest first, with a filter: the filter and the keyset together.
        let a: Vec<String> = order
            .iter()
            .filter(|id| id.starts_with("/a/"))
            .cloned()
            .collect();
        assert_eq!(walk(&db, "/a/", true), a);
        let counted = list_jobs(&db, &filter("/a/", true, None)).expect("a");
        assert_eq!(
            (counted.total, counted.total_is_lower_bound),
            (a.len() as i64, false),
            "under the cap the count is exact"
        );

        // The last page says no more.
        let mut last = filter("", true, None);
        last.offset = (n - 10) as u32;
        let page = list_jobs(&db, &last).expect("last");
        assert_eq!((page.jobs.len(), page.has_more), (10, false));
    }
}
