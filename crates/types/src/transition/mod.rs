//! The task state machine (reference §2.4–2.6): one function from (task, event) to a step.
//!
//! The controller loads a `TaskCtx` from the store, calls `transition`, and writes the `Step` back in
//! the same transaction. Effects on workers are derived from the stored state by reconcile, so
//! nothing here does I/O.

use crate::state::{JobState, TaskState};

mod job;
pub use job::{
    job_transition, orphaned_attempt_on_worker_loss, terminates_children, ErrorUpdate, JobEvent,
    JobRejected, JobStep,
};

/// The current attempt of a task, as the state machine needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptCtx {
    pub state: TaskState,
    /// The worker reported BUILDING or RUNNING at least once (`started_at_ms` set).
    pub started: bool,
}

/// What the state machine needs to know about a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskCtx {
    pub state: TaskState,
    pub attempt: Option<AttemptCtx>,
    /// FAILED attempts so far.
    pub failure_count: u32,
    /// Charged preemptions so far (WORKER_FAILED/KILLED/PREEMPTED attempts that started).
    pub preemption_count: u32,
    pub max_retries_failure: u32,
    pub max_retries_preemption: u32,
    /// Member of a coscheduled gang.
    pub coscheduled: bool,
}

/// Something that happens to a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskEvent {
    /// The scheduler placed the task: a new attempt starts in ASSIGNED.
    Assign,
    /// The worker observed the current attempt in `state` (BUILDING, RUNNING, SUCCEEDED, FAILED,
    /// KILLED, WORKER_FAILED, PREEMPTED or MISSING).
    Report { state: TaskState, error: String },
    /// The worker holding the attempt was declared dead.
    WorkerLost,
    /// Evicted by a higher band.
    Preempt { by: String },
    /// The execution timeout ran out (counts as a failure, never retried).
    ExecutionTimeout,
    /// The scheduling deadline passed while pending.
    SchedulingTimeout,
    /// Cancelled by the user or a parent.
    Kill { reason: String },
    /// The job went terminal while this task was unfinished: killed with the job's reason.
    JobFinalized { reason: String },
    /// `CompleteJob`: mark done.
    Complete,
    /// A gang sibling failed for good: this member fails too.
    SiblingFailed { sibling: String },
    /// A gang sibling is retrying: this member re-queues with it, uncharged.
    SiblingRequeued { sibling: String },
    /// Operator override (`task fail`): like an execution timeout.
    KickFail,
}

impl TaskEvent {
    /// Whether the transition of this event may read the task's retry counts
    /// ([`TaskCtx::failure_count`], [`TaskCtx::preemption_count`]): only a failure or a loss of
    /// the attempt decides between a retry and the end. For any other event a store may leave
    /// them at zero instead of counting the task's attempts (test
    /// `only_failures_and_losses_read_the_retry_counts`).
    pub fn reads_retry_counts(&self) -> bool {
        match self {
            TaskEvent::WorkerLost | TaskEvent::Preempt { .. } => true,
            TaskEvent::Report { state, .. } => matches!(
                state,
                TaskState::Failed
                    | TaskState::WorkerFailed
                    | TaskState::Killed
                    | TaskState::Preempted
                    | TaskState::Missing
            ),
            TaskEvent::Assign
            | TaskEvent::ExecutionTimeout
            | TaskEvent::SchedulingTimeout
            | TaskEvent::Kill { .. }
            | TaskEvent::JobFinalized { .. }
            | TaskEvent::Complete
            | TaskEvent::SiblingFailed { .. }
            | TaskEvent::SiblingRequeued { .. }
            | TaskEvent::KickFail => false,
        }
    }
}

/// Which way a gang goes after a member's failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GangCascade {
    /// Active siblings become COSCHED_FAILED (terminal).
    Fail,
    /// Active siblings go back to PENDING, their attempts stamped COSCHED_FAILED.
    Requeue,
}

/// The result of one transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub task: TaskState,
    /// New state of the current attempt (`None`: unchanged, or no attempt).
    pub attempt: Option<TaskState>,
    /// A new attempt row is created in ASSIGNED.
    pub new_attempt: bool,
    /// Stamp `started_at` on the current attempt.
    pub mark_started: bool,
    /// Error to record on the task (and attempt).
    pub error: Option<String>,
    /// Event reason for `task events` (TaskAssigned, TaskRetryScheduled, TaskTerminated, …).
    pub reason: &'static str,
    pub cascade: Option<GangCascade>,
}

impl Step {
    /// Whether this step can change the verdict of a job that is RUNNING and has started
    /// (§2.6): it ends its task, fails an attempt (which raises the job's failed-attempt count),
    /// or moves the task's gang (whose members' steps a store applies under this one's rollup,
    /// so the rule answers for them too). Any other step leaves such a job RUNNING whatever its
    /// other tasks are, so a store may skip recomputing the job after it (test
    /// `only_ends_failures_and_cascades_can_move_a_running_job`).
    pub fn can_move_a_running_job(&self) -> bool {
        self.running_job_move() != RunningJobMove::Cannot
    }

    /// How this step can change the verdict of a job that is RUNNING and has started: not at
    /// all ([`Step::can_move_a_running_job`]); only once none of the job's tasks is left
    /// unfinished, for a success (it ends its task SUCCEEDED, fails no attempt and moves no
    /// gang: a RUNNING job's other tasks cannot be KILLED or UNSCHEDULABLE, or it would not be
    /// RUNNING, and a success raises no failure count, so while one task is unfinished the job
    /// stays RUNNING — test `a_success_moves_a_running_job_only_once_no_task_is_left`); or
    /// otherwise.
    pub fn running_job_move(&self) -> RunningJobMove {
        if self.attempt == Some(TaskState::Failed) || self.cascade.is_some() {
            RunningJobMove::May
        } else if self.task == TaskState::Succeeded {
            RunningJobMove::OnceNoTaskIsLeft
        } else if self.task.is_terminal() {
            RunningJobMove::May
        } else {
            RunningJobMove::Cannot
        }
    }
}

/// What a task step (or the strongest of a batch's steps on one job) can do to the verdict of a
/// job that is RUNNING and has started ([`Step::running_job_move`]), weakest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum RunningJobMove {
    /// It stays RUNNING whatever its other tasks are.
    #[default]
    Cannot,
    /// It stays RUNNING while any of its tasks is unfinished (and no more attempts failed than
    /// its `max_task_failures`, which only a step that [`RunningJobMove::May`] can raise).
    OnceNoTaskIsLeft,
    /// Its tasks decide.
    May,
}

/// A transition that does not apply. These are values, not errors: the caller drops the event.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("task is already terminal ({0})")]
    Terminal(TaskState),
    #[error("event {event} does not apply to a task in state {from}")]
    Illegal { from: TaskState, event: String },
    #[error("no change")]
    NoChange,
}

fn step(task: TaskState, attempt: Option<TaskState>, reason: &'static str) -> Step {
    Step {
        task,
        attempt,
        new_attempt: false,
        mark_started: false,
        error: None,
        reason,
        cascade: None,
    }
}

fn illegal(from: TaskState, event: &TaskEvent) -> Rejected {
    Rejected::Illegal {
        from,
        // debug-ok: the event's variant, in an internal illegal-transition report.
        event: format!("{event:?}"),
    }
}

/// Applies `event` to the task. Exhaustive over events; see the §2.4 table.
pub fn transition(t: &TaskCtx, event: &TaskEvent) -> Result<Step, Rejected> {
    if t.state.is_terminal() {
        return Err(Rejected::Terminal(t.state));
    }
    let started = t.attempt.map(|a| a.started).unwrap_or(false);
    match event {
        TaskEvent::Assign => {
            if t.state != TaskState::Pending {
                return Err(illegal(t.state, event));
            }
            let mut s = step(
                TaskState::Assigned,
                Some(TaskState::Assigned),
                "TaskAssigned",
            );
            s.new_attempt = true;
            Ok(s)
        }
        TaskEvent::Report { state, error } => report(t, *state, error, started, event),
        TaskEvent::WorkerLost => {
            if !t.state.is_active() {
                return Err(illegal(t.state, event));
            }
            Ok(lost(
                t,
                started,
                TaskState::WorkerFailed,
                "Worker failed".into(),
            ))
        }
        TaskEvent::Preempt { by } => {
            if !t.state.is_active() {
                return Err(illegal(t.state, event));
            }
            let mut s = lost(
                t,
                started,
                TaskState::Preempted,
                format!("Preempted by {by}"),
            );
            s.reason = "Preempted";
            Ok(s)
        }
        TaskEvent::ExecutionTimeout | TaskEvent::KickFail => {
            if !t.state.is_active() {
                return Err(illegal(t.state, event));
            }
            let msg = if matches!(event, TaskEvent::KickFail) {
                "Failed by operator"
            } else {
                "Execution timeout exceeded"
            };
            let mut s = step(TaskState::Failed, Some(TaskState::Failed), "TaskTimedOut");
            s.error = Some(msg.into());
            if t.coscheduled {
                s.cascade = Some(GangCascade::Fail);
            }
            Ok(s)
        }
        TaskEvent::SchedulingTimeout => {
            if t.state != TaskState::Pending {
                return Err(illegal(t.state, event));
            }
            let mut s = step(TaskState::Unschedulable, None, "TaskUnschedulable");
            s.error = Some("Scheduling timeout exceeded".into());
            Ok(s)
        }
        TaskEvent::Kill { reason } | TaskEvent::JobFinalized { reason } => {
            let attempt = t
                .attempt
                .filter(|a| !a.state.is_terminal())
                .map(|_| TaskState::Killed);
            let label = match event {
                TaskEvent::JobFinalized { .. } => "JobFinalizedTaskKilled",
                _ => "TaskTerminated",
            };
            let mut s = step(TaskState::Killed, attempt, label);
            s.error = Some(reason.clone());
            Ok(s)
        }
        TaskEvent::Complete => {
            let attempt = t
                .attempt
                .filter(|a| !a.state.is_terminal())
                .map(|_| TaskState::Succeeded);
            Ok(step(
                TaskState::Succeeded,
                attempt,
                "JobCompletedTaskSucceeded",
            ))
        }
        TaskEvent::SiblingFailed { sibling } => {
            if !t.state.is_active() {
                return Err(illegal(t.state, event));
            }
            let mut s = step(
                TaskState::CoschedFailed,
                Some(TaskState::CoschedFailed),
                "CoscheduledSiblingTerminated",
            );
            s.error = Some(format!("Coscheduled sibling {sibling} failed"));
            Ok(s)
        }
        TaskEvent::SiblingRequeued { sibling } => {
            if !t.state.is_active() {
                return Err(illegal(t.state, event));
            }
            let mut s = step(
                TaskState::Pending,
                Some(TaskState::CoschedFailed),
                "CoscheduledSiblingRequeued",
            );
            s.error = Some(format!("Coscheduled sibling {sibling} is retrying"));
            Ok(s)
        }
    }
}

/// A worker-side loss (worker death, out-of-band kill, preemption): retried without charge if the
/// attempt never started, else within the preemption budget.
fn lost(t: &TaskCtx, started: bool, attempt_state: TaskState, error: String) -> Step {
    let exhausted = started && t.preemption_count + 1 > t.max_retries_preemption;
    let final_state = if attempt_state == TaskState::Preempted {
        TaskState::Preempted
    } else {
        TaskState::WorkerFailed
    };
    let mut s = if exhausted {
        step(
            final_state,
            Some(attempt_state),
            "TaskPreemptionBudgetExhausted",
        )
    } else {
        step(
            TaskState::Pending,
            Some(attempt_state),
            "TaskRetryScheduled",
        )
    };
    s.error = Some(error);
    if t.coscheduled {
        s.cascade = Some(if exhausted {
            GangCascade::Fail
        } else {
            GangCascade::Requeue
        });
    }
    s
}

fn report(
    t: &TaskCtx,
    state: TaskState,
    error: &str,
    started: bool,
    event: &TaskEvent,
) -> Result<Step, Rejected> {
    if !t.state.is_active() {
        return Err(illegal(t.state, event));
    }
    match state {
        TaskState::Building => match t.state {
            TaskState::Assigned => {
                let mut s = step(
                    TaskState::Building,
                    Some(TaskState::Building),
                    "TaskBuilding",
                );
                s.mark_started = true;
                Ok(s)
            }
            _ => Err(Rejected::NoChange),
        },
        TaskState::Running => match t.state {
            TaskState::Assigned | TaskState::Building => {
                let mut s = step(TaskState::Running, Some(TaskState::Running), "TaskRunning");
                s.mark_started = !started;
                Ok(s)
            }
            _ => Err(Rejected::NoChange),
        },
        // An exit (success or failure) proves the process ran, even when the RUNNING report
        // was lost (e.g. sent to a controller that died): the attempt gets a start stamp.
        TaskState::Succeeded => {
            let mut s = step(
                TaskState::Succeeded,
                Some(TaskState::Succeeded),
                "TaskSucceeded",
            );
            s.mark_started = !started;
            Ok(s)
        }
        TaskState::Failed => {
            let retry = t.failure_count < t.max_retries_failure;
            let mut s = if retry {
                step(
                    TaskState::Pending,
                    Some(TaskState::Failed),
                    "TaskRetryScheduled",
                )
            } else {
                step(TaskState::Failed, Some(TaskState::Failed), "TaskFailed")
            };
            s.error = Some(error.to_string());
            s.mark_started = !started;
            if t.coscheduled {
                s.cascade = Some(if retry {
                    GangCascade::Requeue
                } else {
                    GangCascade::Fail
                });
            }
            Ok(s)
        }
        TaskState::WorkerFailed | TaskState::Killed | TaskState::Preempted => {
            let err = if error.is_empty() {
                format!("Attempt ended {state} on the worker")
            } else {
                error.to_string()
            };
            Ok(lost(t, started, state, err))
        }
        TaskState::Missing => {
            let mut s = lost(
                t,
                started,
                TaskState::WorkerFailed,
                "worker_lost_spec".into(),
            );
            s.reason = "TaskLostOnWorker";
            Ok(s)
        }
        TaskState::Pending
        | TaskState::Assigned
        | TaskState::Unschedulable
        | TaskState::CoschedFailed
        | TaskState::Unspecified => Err(illegal(t.state, event)),
    }
}

/// Inputs of the job state recomputation (§2.6).
#[derive(Clone, Debug)]
pub struct JobCtx<'a> {
    pub tasks: &'a [TaskState],
    /// Cumulative FAILED attempts over all the job's tasks.
    pub failed_attempts: u32,
    pub max_task_failures: u32,
    /// The job ever had a task assigned.
    pub ever_started: bool,
    /// The first task error, for the FAILED message.
    pub first_error: Option<&'a str>,
}

/// Recomputes a job's state; first match wins (§2.6). Returns the state and, for terminal
/// states, the job error.
pub fn job_state(j: &JobCtx<'_>) -> (JobState, Option<String>) {
    use TaskState as T;
    let all = |f: fn(TaskState) -> bool| j.tasks.iter().all(|s| f(*s));
    let any = |f: fn(TaskState) -> bool| j.tasks.iter().any(|s| f(*s));
    if !j.tasks.is_empty() && all(|s| s == T::Succeeded) {
        return (JobState::Succeeded, None);
    }
    if j.failed_attempts > j.max_task_failures {
        let mut msg = format!(
            "Cumulative failed task attempts exceeded max_task_failures: failures={}, limit={}",
            j.failed_attempts, j.max_task_failures
        );
        if let Some(e) = j.first_error.filter(|e| !e.is_empty()) {
            msg.push_str("; ");
            msg.push_str(e);
        }
        return (JobState::Failed, Some(msg));
    }
    if any(|s| s == T::Unschedulable) {
        return (
            JobState::Unschedulable,
            Some(
                j.first_error
                    .unwrap_or("Scheduling timeout exceeded")
                    .to_string(),
            ),
        );
    }
    if any(|s| s == T::Killed) {
        return (
            JobState::Killed,
            Some(j.first_error.unwrap_or("Killed").to_string()),
        );
    }
    let all_terminal = !j.tasks.is_empty() && all(|s| s.is_terminal());
    if all_terminal && any(|s| matches!(s, T::WorkerFailed | T::Preempted | T::CoschedFailed)) {
        return (
            JobState::WorkerFailed,
            Some("Preemption budget exhausted".to_string()),
        );
    }
    if all_terminal {
        return (
            JobState::Failed,
            Some(j.first_error.unwrap_or("Task failed").to_string()),
        );
    }
    if any(|s| s.is_active()) || j.ever_started {
        (JobState::Running, None)
    } else {
        (JobState::Pending, None)
    }
}

#[cfg(test)]
mod tests;
