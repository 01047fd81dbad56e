//! The only writers of state columns (`jobs.state`, `tasks.state`, `task_attempts.state`) for
//! this cluster's own work: job creation ([`create`]), task and attempt transitions ([`task`])
//! and job transitions ([`job`]), each applying a step computed by the pure functions in
//! `iris_types`. Mirrored federation state has its own writer, [`crate::mirror`].
//!
//! An event that does not apply in the current state is a value (dropped); an *illegal* one is a
//! bug in the caller: it is logged and counted ([`illegal_transitions`]).
//!
//! # No statement journal
//!
//! SQLite runs a write under a statement journal (every page it touches copied first, so that
//! the write alone can be undone) when the write may fire a trigger *and* may stop halfway: a
//! constraint whose conflict rule is ABORT (the default), a foreign key it checks, or a call of
//! a function in it or in any trigger it may fire. The change-log triggers on `jobs`, `tasks` and
//! `task_attempts` fire on every transition (their `WHEN` is evaluated inside them), so the
//! transitions' updates of those rows ([`task::SAVE_TASK_STATE`], [`task::SAVE_ATTEMPT_STATE`],
//! [`job::SAVE_JOB_STATE`]) say `OR FAIL`, which ends a statement at a failed constraint without
//! undoing what it already wrote (nothing relies on that: every error here ends the caller's
//! transaction or savepoint), and the triggers call no function (migration 0011). Together −6%
//! of the writer's instructions per task (BENCHMARKS.md, C1M); test
//! `a_transition_writes_no_statement_journal`.

mod create;
mod job;
mod task;

pub(crate) use create::delete_job_raw;
pub use create::{delete_job, insert_job, JobConfigRow, NewJob};
pub use job::{apply_job_event, complete_job, kill_subtree};
pub use task::{
    apply_observation, apply_observation_deferred, apply_task_event, assign, assign_deferred,
    assign_task, fail_worker, Finish, Holder, JobRollups, Observation,
};

use std::sync::atomic::{AtomicU64, Ordering};

static ILLEGAL: AtomicU64 = AtomicU64::new(0);

/// Illegal transitions dropped since this process started.
pub fn illegal_transitions() -> u64 {
    ILLEGAL.load(Ordering::Relaxed)
}

/// Task steps applied since this process started, by the state each step entered (indexed by
/// state code). Counted when the step is written, so a transaction that rolls back afterwards
/// still counts (rare: a failed commit); `/metrics` reads them.
static ENTERED: [AtomicU64; 32] = [const { AtomicU64::new(0) }; 32];

pub(crate) fn note_entered(state: iris_types::TaskState) {
    if let Some(c) = usize::try_from(state.code())
        .ok()
        .and_then(|i| ENTERED.get(i))
    {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Task steps applied since this process started, per state entered (every state listed).
pub fn task_steps_applied() -> Vec<(iris_types::TaskState, u64)> {
    iris_types::TaskState::ALL
        .iter()
        .map(|s| {
            let n = usize::try_from(s.code())
                .ok()
                .and_then(|i| ENTERED.get(i))
                .map_or(0, |c| c.load(Ordering::Relaxed));
            (*s, n)
        })
        .collect()
}

pub(crate) fn note_illegal(kind: &str, id: &str, what: &str) {
    ILLEGAL.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(kind, id, what, "illegal transition dropped");
}

#[cfg(test)]
mod tests;
