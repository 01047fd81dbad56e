//! Typed reads behind `iris.inspect.InspectService`: task events, job counts by state, attempt
//! timelines and the resources open attempts hold. Plain structs out, no wire types, so the
//! dashboard and CLI never see table or column names.

use crate::{Read, Result};
use iris_types::{Band, JobState, TaskState};
use rusqlite::{params, OptionalExtension};
use std::sync::LazyLock;

/// One row of a task's event history (written by [`the state machine's apply path`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskEvent {
    pub ts_ms: i64,
    /// `None`: the event is about the task, not one attempt.
    pub attempt_id: Option<i64>,
    pub attempt_uid: Option<String>,
    pub kind: String,
    pub reason: String,
    pub message: String,
    pub source: String,
}

/// The most recent events of a task, oldest first, and how many earlier ones were left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskEvents {
    pub events: Vec<TaskEvent>,
    pub omitted: usize,
}

/// Whether a task row exists.
pub fn task_exists(conn: &impl Read, task_id: &str) -> Result<bool> {
    Ok(conn
        .raw()
        .prepare_cached("SELECT 1 FROM tasks WHERE task_id = ?1")?
        .query_row([task_id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Whether a task has an attempt with this id.
pub fn attempt_exists(conn: &impl Read, task_id: &str, attempt_id: i64) -> Result<bool> {
    Ok(conn
        .raw()
        .prepare_cached("SELECT 1 FROM task_attempts WHERE task_id = ?1 AND attempt_id = ?2")?
        .query_row(params![task_id, attempt_id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// A task's newest `?3` events (`?2`'s only, when given), newest first, each with how many
/// there are in all: the chain is walked once for both.
static TASK_EVENTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} SELECT e.ts_ms, e.attempt_id, e.attempt_uid, e.type, e.reason, e.message, e.source,
                count(*) OVER ()
         FROM chain c JOIN task_events e ON e.id = c.id
         WHERE ?2 IS NULL OR e.attempt_id = ?2 ORDER BY e.id DESC LIMIT ?3",
        crate::events::chain_cte("task_id = ?1")
    )
});

/// The last `limit` events of `task_id` (only `attempt`'s when given), oldest first.
pub fn task_events(
    conn: &impl Read,
    task_id: &str,
    attempt: Option<i64>,
    limit: usize,
) -> Result<TaskEvents> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut st = conn.raw().prepare_cached(&TASK_EVENTS)?;
    let mut total = 0i64;
    let rows = st.query_map(params![task_id, attempt, limit], |r| {
        Ok((
            TaskEvent {
                ts_ms: r.get(0)?,
                attempt_id: r.get(1)?,
                attempt_uid: r.get(2)?,
                kind: r.get(3)?,
                reason: r.get(4)?,
                message: r.get(5)?,
                source: r.get(6)?,
            },
            r.get::<_, i64>(7)?,
        ))
    })?;
    let mut events = Vec::new();
    for row in rows {
        let (event, all) = row?;
        total = all;
        events.push(event);
    }
    events.reverse();
    let omitted = usize::try_from(total)
        .unwrap_or(0)
        .saturating_sub(events.len());
    Ok(TaskEvents { events, omitted })
}

/// Jobs by state among those whose id starts with `id_prefix` and whose (lower-case) name
/// contains `name_contains` (empty: no filter), in state-code order; states without jobs are
/// absent. The same filter as the controller's job list.
pub fn job_counts(
    conn: &impl Read,
    id_prefix: &str,
    name_contains: &str,
) -> Result<Vec<(JobState, i64)>> {
    let mut st = conn.raw().prepare_cached(
        "SELECT state, count(*) FROM jobs
         WHERE (?1 = '' OR substr(job_id, 1, length(?1)) = ?1) AND (?2 = '' OR instr(name, ?2) > 0)
         GROUP BY state ORDER BY state",
    )?;
    let rows = st.query_map(params![id_prefix, name_contains], |r| {
        Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (code, n) = row?;
        out.push((
            JobState::from_code(code).unwrap_or(JobState::Unspecified),
            n,
        ));
    }
    Ok(out)
}

/// One attempt, with the times a timeline needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRow {
    pub task_id: String,
    pub attempt_id: i64,
    pub attempt_uid: String,
    /// The worker (or, for a backend without one, the node) it ran on; empty if neither.
    pub worker_id: String,
    pub state: TaskState,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub exit_code: Option<i64>,
    /// Why it failed; `None` if it did not.
    pub error: Option<String>,
}

/// Attempts of one job, of one task, or of every job whose id starts with a prefix.
#[derive(Clone, Copy, Debug)]
pub enum AttemptsOf<'a> {
    Job(&'a str),
    Task(&'a str),
    JobPrefix(&'a str),
}

/// The attempts of a job (by task index, then attempt id), of a task (by attempt id) or of the
/// jobs under a prefix (by task id, then attempt id), at most `limit`; `true` when more exist.
pub fn attempts(
    conn: &impl Read,
    of: AttemptsOf<'_>,
    limit: usize,
) -> Result<(Vec<AttemptRow>, bool)> {
    const COLS: &str =
        "a.task_id, a.attempt_id, a.attempt_uid, COALESCE(a.worker_id, a.node_name, ''),
        a.state, a.created_at_ms, a.started_at_ms, a.finished_at_ms, a.exit_code, a.error";
    let (sql, key) = match of {
        AttemptsOf::Job(job_id) => (
            format!(
                "SELECT {COLS} FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
                 WHERE t.job_id = ?1 ORDER BY t.task_index, a.attempt_id LIMIT ?2"
            ),
            job_id,
        ),
        AttemptsOf::Task(task_id) => (
            format!(
                "SELECT {COLS} FROM task_attempts a WHERE a.task_id = ?1 ORDER BY a.attempt_id LIMIT ?2"
            ),
            task_id,
        ),
        AttemptsOf::JobPrefix(prefix) => (
            format!(
                "SELECT {COLS} FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
                 WHERE substr(t.job_id, 1, length(?1)) = ?1 ORDER BY a.task_id, a.attempt_id LIMIT ?2"
            ),
            prefix,
        ),
    };
    // One more than asked, to tell whether the list was cut.
    let fetch = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
    let mut st = conn.raw().prepare_cached(&sql)?;
    let rows = st.query_map(params![key, fetch], |r| {
        Ok(AttemptRow {
            task_id: r.get(0)?,
            attempt_id: r.get(1)?,
            attempt_uid: r.get(2)?,
            worker_id: r.get(3)?,
            state: TaskState::from_code(r.get(4)?).unwrap_or(TaskState::Unspecified),
            created_at_ms: r.get(5)?,
            started_at_ms: r.get(6)?,
            finished_at_ms: r.get(7)?,
            exit_code: r.get(8)?,
            error: r.get(9)?,
        })
    })?;
    let mut out: Vec<AttemptRow> = rows.collect::<rusqlite::Result<_>>()?;
    let more = out.len() > limit;
    out.truncate(limit);
    Ok((out, more))
}

/// What one open attempt (its worker has not confirmed its end) holds on its worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// Empty if the attempt has no worker.
    pub worker_id: String,
    pub job_id: String,
    pub task_id: String,
    pub attempt_id: i64,
    /// The band the task runs at (`None`: an unknown code in the row).
    pub band: Option<Band>,
    pub cpu_millicores: i64,
    pub memory_bytes: i64,
    /// The job's requested device as stored at submit
    /// ([`crate::apply::JobConfigRow::res_device_json`]); `None`: CPU only.
    pub device_json: Option<String>,
}

/// Every open attempt, by worker, then task id, then attempt id.
pub fn open_holds(conn: &impl Read) -> Result<Vec<Hold>> {
    let mut st = conn.raw().prepare_cached(
        "SELECT COALESCE(a.worker_id, ''), t.job_id, a.task_id, a.attempt_id, t.priority_band,
                c.res_cpu_millicores, c.res_memory_bytes, c.res_device_json
         FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
         JOIN job_config c ON c.job_id = t.job_id
         WHERE a.finished_at_ms IS NULL ORDER BY 1, a.task_id, a.attempt_id",
    )?;
    let rows = st.query_map([], |r| {
        Ok(Hold {
            worker_id: r.get(0)?,
            job_id: r.get(1)?,
            task_id: r.get(2)?,
            attempt_id: r.get(3)?,
            band: Band::from_code(r.get(4)?),
            cpu_millicores: r.get(5)?,
            memory_bytes: r.get(6)?,
            device_json: r.get(7)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::{self, JobConfigRow, NewJob};
    use crate::{Db, Raw, Tx};

    fn job(conn: &Tx<'_>, id: &str, tasks: u32, device_json: Option<&str>) {
        let j = NewJob {
            job_id: id.into(),
            user_id: "u".into(),
            submitting_user: "u".into(),
            root_job_id: id.into(),
            num_tasks: tasks,
            cfg: JobConfigRow {
                res_cpu_millicores: 500,
                res_memory_bytes: 1 << 30,
                res_device_json: device_json.map(str::to_string),
                priority_band: Band::Batch.code(),
                ..Default::default()
            },
            ..Default::default()
        };
        apply::insert_job(conn, &j, 1_000).expect("insert job");
    }

    fn worker(conn: &Tx<'_>, id: &str) {
        conn.raw().execute(
            "INSERT INTO workers(worker_id, address, total_cpu_millicores, total_memory_bytes, registered_at_ms)
             VALUES (?1, 'w:1', 4000, 0, 0)",
            [id],
        )
        .expect("insert worker");
    }

    fn event(conn: &Tx<'_>, task: &str, attempt: Option<i64>, t: i64, reason: &str) {
        crate::events::insert_event(
            conn.raw(),
            task,
            attempt,
            None,
            t,
            "Normal",
            reason,
            "msg",
            "test",
        )
        .expect("event");
    }

    #[test]
    fn events_are_oldest_first_filtered_and_limited_to_the_latest() {
        let mut db = Db::open_in_memory().expect("db");
        let conn = db.begin().expect("tx");
        job(&conn, "/u/j", 1, None);
        assert!(task_exists(&conn, "/u/j/0").expect("exists"));
        assert!(!task_exists(&conn, "/u/j/1").expect("exists"));
        event(&conn, "/u/j/0", None, 10, "Submitted");
        event(&conn, "/u/j/0", Some(0), 20, "A0");
        event(&conn, "/u/j/0", Some(1), 30, "A1");
        event(&conn, "/u/j/0", Some(1), 40, "A1b");
        event(&conn, "/u/other/0", Some(0), 50, "Elsewhere");
        let all = task_events(&conn, "/u/j/0", None, 100).expect("events");
        let reasons: Vec<&str> = all.events.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons, ["Submitted", "A0", "A1", "A1b"]);
        assert_eq!((all.events[0].attempt_id, all.omitted), (None, 0));
        let one = task_events(&conn, "/u/j/0", Some(1), 100).expect("events");
        let reasons: Vec<&str> = one.events.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons, ["A1", "A1b"]);
        let last = task_events(&conn, "/u/j/0", None, 2).expect("events");
        let reasons: Vec<&str> = last.events.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!((reasons, last.omitted), (vec!["A1", "A1b"], 2));
    }

    /// Migration 0014: a job's events are found through its tasks' chains, so deleting the job
    /// (replaced, or pruned) deletes every event of its tree and none of another job's.
    #[test]
    fn deleting_a_job_deletes_the_events_of_its_tree_through_the_task_chains() {
        let mut db = Db::open_in_memory().expect("db");
        let conn = db.begin().expect("tx");
        job(&conn, "/u/a", 2, None);
        job(&conn, "/u/a/c", 1, None);
        job(&conn, "/u/ab", 1, None);
        for (i, task) in ["/u/a/0", "/u/a/1", "/u/a/c/0", "/u/ab/0"]
            .iter()
            .enumerate()
        {
            event(&conn, task, None, 10 * i as i64, "First");
            event(&conn, task, Some(0), 10 * i as i64 + 1, "Second");
        }
        let events_of = |task: &str| -> i64 {
            conn.raw()
                .query_row(
                    "SELECT count(*) FROM task_events WHERE task_id = ?1",
                    [task],
                    |r| r.get(0),
                )
                .expect("count")
        };
        apply::delete_job(&conn, "/u/a").expect("delete");
        for gone in ["/u/a/0", "/u/a/1", "/u/a/c/0"] {
            assert_eq!(events_of(gone), 0, "{gone}");
        }
        assert_eq!(events_of("/u/ab/0"), 2);
        let kept = task_events(&conn, "/u/ab/0", None, 100).expect("events");
        let reasons: Vec<&str> = kept.events.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons, ["First", "Second"]);
    }

    #[test]
    fn job_counts_follow_the_job_list_filter() {
        let mut db = Db::open_in_memory().expect("db");
        let conn = db.begin().expect("tx");
        job(&conn, "/alice/train", 1, None);
        job(&conn, "/alice/eval", 1, None);
        job(&conn, "/bob/train", 1, None);
        assert!(apply::complete_job(&conn, "/alice/eval", 2_000).expect("complete"));
        assert_eq!(
            job_counts(&conn, "", "").expect("counts"),
            [(JobState::Pending, 2), (JobState::Succeeded, 1)]
        );
        assert_eq!(
            job_counts(&conn, "/alice/", "").expect("counts"),
            [(JobState::Pending, 1), (JobState::Succeeded, 1)]
        );
        assert_eq!(
            job_counts(&conn, "", "train").expect("counts"),
            [(JobState::Pending, 2)]
        );
        assert_eq!(job_counts(&conn, "/carol/", "").expect("counts"), []);
    }

    #[test]
    fn attempts_and_holds_of_assigned_tasks() {
        let mut db = Db::open_in_memory().expect("db");
        let conn = db.begin().expect("tx");
        job(
            &conn,
            "/u/gpu",
            3,
            Some(r#"{"gpu":{"variant":"H100","count":8}}"#),
        );
        worker(&conn, "w0");
        for (i, uid) in ["00000000000000a0", "00000000000000a1"].iter().enumerate() {
            let task = format!("/u/gpu/{i}");
            assert!(
                apply::assign_task(&conn, &task, "w0", "w:1", uid, Band::Batch.code(), 2_000)
                    .expect("assign")
            );
        }
        let (rows, more) = attempts(&conn, AttemptsOf::Job("/u/gpu"), 10).expect("attempts");
        assert!(!more);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].task_id, "/u/gpu/0");
        assert_eq!(rows[0].state, TaskState::Assigned);
        assert_eq!(
            (rows[0].created_at_ms, rows[0].started_at_ms),
            (2_000, None)
        );
        assert_eq!(rows[1].worker_id, "w0");
        let (rows, more) = attempts(&conn, AttemptsOf::Job("/u/gpu"), 1).expect("attempts");
        assert!(more && rows.len() == 1);
        let (rows, _) = attempts(&conn, AttemptsOf::Task("/u/gpu/1"), 10).expect("attempts");
        assert_eq!(rows[0].attempt_uid, "00000000000000a1");

        let holds = open_holds(&conn).expect("holds");
        assert_eq!(holds.len(), 2);
        assert_eq!(holds[0].worker_id, "w0");
        assert_eq!(holds[0].job_id, "/u/gpu");
        assert_eq!(holds[0].band, Some(Band::Batch));
        assert_eq!(
            (holds[0].cpu_millicores, holds[0].memory_bytes),
            (500, 1 << 30)
        );
        assert!(holds[0]
            .device_json
            .as_deref()
            .unwrap_or("")
            .contains("H100"));
        conn.raw()
            .execute(
                "UPDATE task_attempts SET finished_at_ms = 3000 WHERE task_id = '/u/gpu/0'",
                [],
            )
            .expect("finish");
        assert_eq!(open_holds(&conn).expect("holds").len(), 1);
        assert!(attempt_exists(&conn, "/u/gpu/0", 0).expect("exists"));
        assert!(!attempt_exists(&conn, "/u/gpu/0", 1).expect("exists"));
    }
}
