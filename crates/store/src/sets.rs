//! State codes in SQL, generated from `TaskState`/`JobState` so no query carries a hand copy of
//! `is_terminal` or `is_active`. Each fragment is built once and reused; queries that contain
//! one are built once too (`LazyLock`), so the prepared-statement cache still sees one text.

use iris_types::{JobState, TaskState};
use std::sync::LazyLock;

/// `(4,5,6)`: the codes of the task states that satisfy `pred`.
pub(crate) fn tasks_where(pred: fn(TaskState) -> bool) -> String {
    list(
        TaskState::ALL
            .iter()
            .filter(|s| pred(**s))
            .map(|s| s.code()),
    )
}

/// `(4,5,6)`: the codes of the job states that satisfy `pred`.
pub(crate) fn jobs_where(pred: fn(JobState) -> bool) -> String {
    list(JobState::ALL.iter().filter(|s| pred(**s)).map(|s| s.code()))
}

fn list(codes: impl Iterator<Item = i32>) -> String {
    let v: Vec<String> = codes.map(|c| c.to_string()).collect();
    format!("({})", v.join(","))
}

/// `col IN (2,3) OR col = 9`: the codes of the task states that satisfy `pred`, in lists of at
/// most two. SQLite evaluates an `IN` list of three or more constants through a temporary B-tree
/// it builds on every run of the statement; a partial index's condition is evaluated by every
/// update of the column, so one written this way costs no B-tree (the index's own condition in
/// its migration must be the same expression, for the planner to match the two).
pub(crate) fn tasks_matching(col: &str, pred: fn(TaskState) -> bool) -> String {
    let codes: Vec<i32> = TaskState::ALL
        .iter()
        .filter(|s| pred(**s))
        .map(|s| s.code())
        .collect();
    let terms: Vec<String> = codes
        .chunks(2)
        .map(|c| match c {
            [one] => format!("{col} = {one}"),
            _ => format!("{col} IN {}", list(c.iter().copied())),
        })
        .collect();
    terms.join(" OR ")
}

/// Terminal task states.
pub(crate) static TASK_TERMINAL: LazyLock<String> =
    LazyLock::new(|| tasks_where(TaskState::is_terminal));
/// Task states holding a worker: ASSIGNED, BUILDING, RUNNING.
pub(crate) static TASK_ACTIVE: LazyLock<String> =
    LazyLock::new(|| tasks_where(TaskState::is_active));
/// Attempt states that charge the preemption budget once the attempt started.
pub(crate) static ATTEMPT_PREEMPTION: LazyLock<String> = LazyLock::new(|| {
    tasks_where(|s| {
        matches!(
            s,
            TaskState::Killed | TaskState::WorkerFailed | TaskState::Preempted
        )
    })
});
/// A task still to run or running: not terminal and not yet on a worker, or on one.
pub(crate) static TASK_LIVE_MIRROR: LazyLock<String> =
    LazyLock::new(|| tasks_where(|s| s == TaskState::Pending || s.is_active()));
/// Terminal job states.
pub(crate) static JOB_TERMINAL: LazyLock<String> =
    LazyLock::new(|| jobs_where(JobState::is_terminal));
/// Live job states as the federation paths use them: PENDING, BUILDING, RUNNING.
pub(crate) static JOB_LIVE: LazyLock<String> = LazyLock::new(|| jobs_where(JobState::is_live));
/// A job not yet running: PENDING or BUILDING (a queued federated job).
pub(crate) static JOB_NOT_STARTED: LazyLock<String> =
    LazyLock::new(|| jobs_where(|s| matches!(s, JobState::Pending | JobState::Building)));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_match_the_state_predicates() {
        assert_eq!(*TASK_TERMINAL, "(4,5,6,7,8,10,11)");
        assert_eq!(*TASK_ACTIVE, "(2,3,9)");
        assert_eq!(*JOB_TERMINAL, "(4,5,6,7,8)");
        assert_eq!(*JOB_LIVE, "(1,2,3)");
        assert_eq!(*TASK_LIVE_MIRROR, "(1,2,3,9)");
        assert_eq!(*ATTEMPT_PREEMPTION, "(6,7,10)");
        assert_eq!(*JOB_NOT_STARTED, "(1,2)");
        // `idx_tasks_active`'s condition in migration 0012 is the generated one (the planner
        // matches a query's condition to the index's only when the two are the same).
        let (_, migration) = crate::schema::MIGRATIONS
            .iter()
            .find(|(name, _)| *name == "0012_desired_set_from_indexes")
            .expect("migration 0012");
        let condition = format!("WHERE {}", tasks_matching("state", TaskState::is_active));
        assert!(
            migration.replace(", ", ",").contains(&condition),
            "migration 0012 does not say {condition}"
        );
    }
}
