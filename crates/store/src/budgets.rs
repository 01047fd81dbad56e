//! User budgets and what counts against them (reference §4.7), and the per-user and per-task
//! rows of `ListUsers` and `GetSchedulerState`.

use crate::sets::{JOB_LIVE, TASK_ACTIVE};
use crate::{Raw, Read, Result, Tx};
use iris_types::{Band, TaskState};
use rusqlite::{params, OptionalExtension};
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// A user's configured budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    pub user_id: String,
    /// 0 = unlimited.
    pub limit: i64,
    pub max_band: i32,
}

/// Sets (or replaces) a user's budget.
pub fn set(tx: &Tx<'_>, b: &Budget, now: i64) -> Result<()> {
    tx.raw()
        .prepare_cached(
            "INSERT INTO user_budgets(user_id, budget_limit, max_band, updated_at_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(user_id) DO UPDATE SET budget_limit = excluded.budget_limit, max_band = excluded.max_band,
                updated_at_ms = excluded.updated_at_ms",
        )?
        .execute(params![b.user_id, b.limit, b.max_band, now])?;
    Ok(())
}

/// A user's budget, if one is configured.
pub fn get(c: &impl Read, user: &str) -> Result<Option<Budget>> {
    Ok(c.raw()
        .prepare_cached(
            "SELECT user_id, budget_limit, max_band FROM user_budgets WHERE user_id = ?1",
        )?
        .query_row([user], |r| {
            Ok(Budget {
                user_id: r.get(0)?,
                limit: r.get(1)?,
                max_band: r.get(2)?,
            })
        })
        .optional()?)
}

/// Every configured budget, by user.
pub fn all(c: &impl Read) -> Result<Vec<Budget>> {
    let mut st = c.raw().prepare_cached(
        "SELECT user_id, budget_limit, max_band FROM user_budgets ORDER BY user_id",
    )?;
    let rows = st.query_map([], |r| {
        Ok(Budget {
            user_id: r.get(0)?,
            limit: r.get(1)?,
            max_band: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// A task's budget value: 1000·accelerators (GPU + TPU) + whole GiB + 5·whole cores.
const TASK_VALUE_SQL: &str = "1000 * (COALESCE(json_extract(c.res_device_json, '$.gpu.count'), 0)
        + COALESCE(json_extract(c.res_device_json, '$.tpu.count'), 0))
    + c.res_memory_bytes / 1073741824 + 5 * (c.res_cpu_millicores / 1000)";

static USER_SPEND: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT COALESCE(SUM({TASK_VALUE_SQL}), 0)
         FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN job_config c ON c.job_id = t.job_id
         WHERE j.user_id = ?1 AND t.state IN {} AND c.priority_band != {}",
        *TASK_ACTIVE,
        Band::Batch.code()
    )
});

// A task's value depends only on its job's config, so the active tasks are counted per job first
// and each job's config is read and its device JSON parsed once, not once per task (the tick runs
// this every time: 4.5% of the controller at C1M shape with the join per task).
static SPEND_BY_USER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT j.user_id, SUM(a.n * ({TASK_VALUE_SQL}))
         FROM (SELECT job_id, count(*) AS n FROM tasks WHERE state IN {} GROUP BY job_id) a
         JOIN jobs j ON j.job_id = a.job_id JOIN job_config c ON c.job_id = a.job_id
         WHERE c.priority_band != {}
         GROUP BY j.user_id",
        *TASK_ACTIVE,
        Band::Batch.code()
    )
});

/// Spend = Σ over active (assigned, building, running) tasks of non-BATCH jobs of the task
/// value. BATCH is judged by the job's requested band.
pub fn spend(c: &impl Read, user: &str) -> Result<i64> {
    Ok(c.raw()
        .prepare_cached(&USER_SPEND)?
        .query_row([user], |r| r.get(0))?)
}

/// [`spend`] for every user with active non-BATCH tasks.
pub fn spend_by_user(c: &impl Read) -> Result<BTreeMap<String, i64>> {
    let mut st = c.raw().prepare_cached(&SPEND_BY_USER)?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Per-user workload counts: every user with a job or a budget row, with counts of their live
/// jobs by state and of those jobs' tasks by state (codes).
#[derive(Clone, Debug, Default)]
pub struct UserCounts {
    pub user: String,
    pub jobs: BTreeMap<i32, i32>,
    pub tasks: BTreeMap<i32, i32>,
}

static LIVE_JOBS_BY_USER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT user_id, state, count(*) FROM jobs WHERE state IN {} GROUP BY user_id, state",
        *JOB_LIVE
    )
});
static LIVE_TASKS_BY_USER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT j.user_id, t.state, count(*) FROM tasks t JOIN jobs j ON j.job_id = t.job_id
         WHERE j.state IN {} GROUP BY j.user_id, t.state",
        *JOB_LIVE
    )
});

/// [`UserCounts`] for every user, by user.
pub fn user_counts(c: &impl Read) -> Result<Vec<UserCounts>> {
    let c = c.raw();
    let mut by_user: BTreeMap<String, UserCounts> = BTreeMap::new();
    fn entry(by_user: &mut BTreeMap<String, UserCounts>, u: String) -> &mut UserCounts {
        by_user.entry(u.clone()).or_insert_with(|| UserCounts {
            user: u,
            ..Default::default()
        })
    }
    {
        let mut st = c.prepare_cached(
            "SELECT DISTINCT user_id FROM jobs UNION SELECT user_id FROM user_budgets",
        )?;
        let rows = st.query_map([], |r| r.get::<_, String>(0))?;
        for u in rows {
            entry(&mut by_user, u?);
        }
    }
    for (sql, jobs) in [(&*LIVE_JOBS_BY_USER, true), (&*LIVE_TASKS_BY_USER, false)] {
        let mut st = c.prepare_cached(sql)?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i32>(1)?,
                r.get::<_, i32>(2)?,
            ))
        })?;
        for row in rows {
            let (u, state, n) = row?;
            let e = entry(&mut by_user, u);
            if jobs {
                e.jobs.insert(state, n);
            } else {
                e.tasks.insert(state, n);
            }
        }
    }
    Ok(by_user.into_values().collect())
}

/// A task waiting or running, for `GetSchedulerState`.
#[derive(Clone, Debug)]
pub struct QueuedTask {
    pub user: String,
    pub job_id: String,
    /// PENDING: the job's requested band; RUNNING: the band it runs at.
    pub band: i32,
    /// RUNNING only: the worker, or the backend running it.
    pub worker_id: String,
    pub backend_id: String,
}

static PENDING_TASKS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT j.user_id, t.job_id, c.priority_band, COALESCE(t.backend_id, '')
         FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN job_config c ON c.job_id = t.job_id
         WHERE t.state = {} ORDER BY t.job_id, t.task_index",
        TaskState::Pending.code()
    )
});
static RUNNING_TASKS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT j.user_id, t.job_id, t.priority_band, COALESCE(t.current_worker_id, a.backend_id),
                COALESCE(t.backend_id, '')
         FROM tasks t JOIN jobs j ON j.job_id = t.job_id
         JOIN task_attempts a ON a.task_id = t.task_id AND a.attempt_id = t.current_attempt_id
         WHERE t.state = {} AND t.cluster = 'local' ORDER BY t.job_id, t.task_index",
        TaskState::Running.code()
    )
});

/// Every PENDING task, by job and index.
pub fn pending_tasks(c: &impl Read) -> Result<Vec<QueuedTask>> {
    let mut st = c.raw().prepare_cached(&PENDING_TASKS)?;
    let rows = st.query_map([], |r| {
        Ok(QueuedTask {
            user: r.get(0)?,
            job_id: r.get(1)?,
            band: r.get(2)?,
            worker_id: String::new(),
            backend_id: r.get(3)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Every RUNNING local task with its holder (its worker, or the backend of an attempt with no
/// worker), by job and index.
pub fn running_tasks(c: &impl Read) -> Result<Vec<QueuedTask>> {
    let mut st = c.raw().prepare_cached(&RUNNING_TASKS)?;
    let rows = st.query_map([], |r| {
        Ok(QueuedTask {
            user: r.get(0)?,
            job_id: r.get(1)?,
            band: r.get(2)?,
            worker_id: r.get(3)?,
            backend_id: r.get(4)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::{self, JobConfigRow, NewJob};
    use crate::{Db, Raw};

    /// `spend_by_user` (active tasks counted per job) agrees with `spend` (summed per task) for
    /// every user, over jobs of every band, with and without accelerators, in every task state.
    #[test]
    fn spend_by_user_counts_per_job_what_spend_sums_per_task() {
        let mut db = Db::open_in_memory().expect("db");
        let tx = db.begin().expect("tx");
        let devices = [
            None,
            Some(r#"{"gpu":{"variant":"H100","count":8}}"#),
            Some(r#"{"tpu":{"variant":"v5p-8","count":4}}"#),
        ];
        let states = TaskState::ALL;
        let mut n = 0;
        for (u, user) in ["ann", "bob", "cy"].iter().enumerate() {
            for band in Band::ALL {
                for (d, device) in devices.iter().enumerate() {
                    n += 1;
                    let id = format!("/{user}/j{n}");
                    let j = NewJob {
                        job_id: id.clone(),
                        user_id: user.to_string(),
                        submitting_user: user.to_string(),
                        root_job_id: id.clone(),
                        num_tasks: states.len() as u32,
                        cfg: JobConfigRow {
                            res_cpu_millicores: 1_500 + 1_000 * (u + d) as i64,
                            res_memory_bytes: (3 << 30) + (1 << 29),
                            res_device_json: device.map(str::to_string),
                            priority_band: band.code(),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    apply::insert_job(&tx, &j, 1_000).expect("insert job");
                    for (i, s) in states.iter().enumerate() {
                        tx.raw()
                            .execute(
                                "UPDATE tasks SET state = ?1 WHERE task_id = ?2",
                                rusqlite::params![s.code(), format!("{id}/{i}")],
                            )
                            .expect("set state");
                    }
                }
            }
        }
        let by_user = spend_by_user(&tx).expect("spend by user");
        for user in ["ann", "bob", "cy", "nobody"] {
            let each = spend(&tx, user).expect("spend");
            assert_eq!(by_user.get(user).copied().unwrap_or(0), each, "{user}");
        }
        assert!(by_user.values().all(|&v| v > 0), "{by_user:?}");
        assert_eq!(by_user.len(), 3);
    }
}
