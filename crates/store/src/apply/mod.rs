//! The only writers of state columns (`jobs.state`, `tasks.state`, `task_attempts.state`) for
//! this cluster's own work: job creation ([`create`]), task and attempt transitions ([`task`])
//! and job transitions ([`job`]), each applying a step computed by the pure functions in
//! `iris_types`. Mirrored federation state has its own writer, [`crate::mirror`].
//!
//! An event that does not apply in the current state is a value (dropped); an *illegal* one is a
//! bug in the caller: it is logged and counted ([`illegal_transitions`]).

mod create;
mod job;
mod task;

pub(crate) use create::delete_job_raw;
pub use create::{delete_job, insert_job, JobConfigRow, NewJob};
pub use job::{apply_job_event, complete_job, kill_subtree};
pub use task::{
    apply_observation, apply_task_event, assign_task, fail_worker, Finish, Observation,
};

use std::sync::atomic::{AtomicU64, Ordering};

static ILLEGAL: AtomicU64 = AtomicU64::new(0);

/// Illegal transitions dropped since this process started.
pub fn illegal_transitions() -> u64 {
    ILLEGAL.load(Ordering::Relaxed)
}

pub(crate) fn note_illegal(kind: &str, id: &str, what: &str) {
    ILLEGAL.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(kind, id, what, "illegal transition dropped");
}

#[cfg(test)]
mod tests;
