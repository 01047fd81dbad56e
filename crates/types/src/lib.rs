//! Iris domain types: identifiers, states, resources and the state machine. No I/O, no async.

pub mod ids;
pub mod resources;
pub mod state;
pub mod transition;

pub use ids::{AttemptId, IdError, JobName, TaskId};
pub use state::{Band, JobState, TaskState};
pub use transition::{
    job_state, transition, AttemptCtx, GangCascade, JobCtx, Rejected, Step, TaskCtx, TaskEvent,
};
