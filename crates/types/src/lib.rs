//! Iris domain types: identifiers, states, priority bands, resources, worker attributes and
//! constraints, and the state machine. No I/O, no async.
//!
//! This is the one vocabulary the scheduler, federation, backends and the controller share;
//! wire messages are converted to and from these types at the edges (the controller).

pub mod constraint;
pub mod endpoint;
pub mod ids;
pub mod quoted;
pub mod resources;
pub mod state;
pub mod transition;

pub use constraint::{availability_key, AttrValue, Constraint, ConstraintOp, AVAILABILITY_PREFIX};
pub use ids::{job_of_task, AttemptId, IdError, JobName, TaskId};
pub use quoted::{quoted, Quoted};
pub use resources::{Dim, Resources};
pub use state::{Band, JobState, TaskState};
pub use transition::{
    job_state, job_transition, orphaned_attempt_on_worker_loss, terminates_children, transition,
    AttemptCtx, ErrorUpdate, GangCascade, JobCtx, JobEvent, JobRejected, JobStep, Rejected,
    RunningJobMove, Step, TaskCtx, TaskEvent,
};
