//! The job-level state machine: every write of a job's state is one of these events.
//!
//! A job's state is mostly derived from its tasks ([`super::job_state`], reference §2.6); the
//! store feeds that result back in as [`JobEvent::Recomputed`]. The other events are decisions
//! about the job as a whole (a kill of a subtree, `CompleteJob`, federation verdicts) that happen
//! before, or instead of, its tasks changing.

use crate::state::JobState;

/// Something that happens to a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobEvent {
    /// The tasks changed: [`super::job_state`] computed `next` (and, for terminal states, the
    /// job's error).
    Recomputed {
        next: JobState,
        error: Option<String>,
    },
    /// Cancelled by the user, replaced by a new submission, or its parent ended (§2.7).
    Kill { reason: String },
    /// `CompleteJob`: done, whatever its tasks were doing.
    Complete,
    /// A job queued for a federation peer outlived its scheduling deadline.
    QueuedDeadlinePassed,
    /// The federation peer refused the handoff with this verdict.
    HandoffRejected { message: String },
    /// A job a peer kept refusing (it cannot host it now) outlived its scheduling deadline;
    /// `message` carries the peer's last reason.
    RefusedDeadlinePassed { message: String },
    /// Cancelled on the hub before any peer ran it.
    CancelledBeforeHandoff,
}

/// How a step changes the job's `error` column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorUpdate {
    Keep,
    Clear,
    Set(String),
}

/// The result of one job transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobStep {
    pub state: JobState,
    pub error: ErrorUpdate,
    /// Stamp `started_at` if it is not set.
    pub stamp_started: bool,
    /// Stamp `finished_at` (if not set already).
    pub stamp_finished: bool,
    /// The unfinished tasks are killed with this reason (`JobFinalized`), the job having gone
    /// terminal on its own.
    pub finalize_tasks: Option<String>,
    /// The unfinished tasks are killed as part of the job's kill.
    pub kill_tasks: Option<String>,
    /// The unfinished tasks are marked done (`CompleteJob`).
    pub complete_tasks: bool,
}

/// A job event that does not apply: a value, not an error (the caller drops it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JobRejected {
    #[error("job is already terminal ({0})")]
    Terminal(JobState),
    #[error("event {event} does not apply to a job in state {from}")]
    Illegal { from: JobState, event: &'static str },
    #[error("no change")]
    NoChange,
}

impl JobEvent {
    fn name(&self) -> &'static str {
        match self {
            JobEvent::Recomputed { .. } => "Recomputed",
            JobEvent::Kill { .. } => "Kill",
            JobEvent::Complete => "Complete",
            JobEvent::QueuedDeadlinePassed => "QueuedDeadlinePassed",
            JobEvent::HandoffRejected { .. } => "HandoffRejected",
            JobEvent::RefusedDeadlinePassed { .. } => "RefusedDeadlinePassed",
            JobEvent::CancelledBeforeHandoff => "CancelledBeforeHandoff",
        }
    }
}

fn step(state: JobState, error: ErrorUpdate) -> JobStep {
    JobStep {
        state,
        error,
        stamp_started: false,
        stamp_finished: state.is_terminal(),
        finalize_tasks: None,
        kill_tasks: None,
        complete_tasks: false,
    }
}

/// Applies `event` to a job in state `from`. Exhaustive over events.
pub fn job_transition(from: JobState, event: &JobEvent) -> Result<JobStep, JobRejected> {
    use JobState as J;
    let live = !from.is_terminal();
    match event {
        // A WORKER_FAILED job can still be killed: its remaining work and children are
        // stopped and it reads KILLED, as a user who cancels it expects.
        JobEvent::Kill { reason } => {
            if !live && from != J::WorkerFailed {
                return Err(JobRejected::Terminal(from));
            }
            let mut s = step(J::Killed, ErrorUpdate::Set(reason.clone()));
            s.kill_tasks = Some(reason.clone());
            Ok(s)
        }
        _ if !live => Err(JobRejected::Terminal(from)),
        JobEvent::Recomputed { next, error } => {
            if *next == from {
                // Same live state: only a job that started running gets its start stamped.
                return if *next == J::Running {
                    let mut s = step(from, ErrorUpdate::Keep);
                    s.stamp_started = true;
                    Ok(s)
                } else {
                    Err(JobRejected::NoChange)
                };
            }
            if *next == J::Unspecified {
                return Err(JobRejected::Illegal {
                    from,
                    event: event.name(),
                });
            }
            let mut s = step(
                *next,
                match error {
                    Some(e) => ErrorUpdate::Set(e.clone()),
                    None => ErrorUpdate::Clear,
                },
            );
            s.stamp_started = *next == J::Running;
            if next.is_terminal() {
                s.finalize_tasks = Some(error.clone().unwrap_or_else(|| format!("Job {next}")));
            }
            Ok(s)
        }
        JobEvent::Complete => {
            let mut s = step(J::Succeeded, ErrorUpdate::Clear);
            s.stamp_started = true;
            s.complete_tasks = true;
            Ok(s)
        }
        JobEvent::QueuedDeadlinePassed => match from {
            J::Pending | J::Building => Ok(step(
                J::Unschedulable,
                ErrorUpdate::Set(
                    "Scheduling timeout exceeded while queued for a federation peer".into(),
                ),
            )),
            _ => Err(JobRejected::Illegal {
                from,
                event: event.name(),
            }),
        },
        JobEvent::RefusedDeadlinePassed { message } => match from {
            J::Pending | J::Building => {
                Ok(step(J::Unschedulable, ErrorUpdate::Set(message.clone())))
            }
            _ => Err(JobRejected::Illegal {
                from,
                event: event.name(),
            }),
        },
        JobEvent::HandoffRejected { message } => match from {
            J::Pending | J::Building | J::Running => {
                Ok(step(J::Killed, ErrorUpdate::Set(message.clone())))
            }
            _ => Err(JobRejected::Illegal {
                from,
                event: event.name(),
            }),
        },
        JobEvent::CancelledBeforeHandoff => match from {
            J::Pending | J::Building | J::Running => Ok(step(
                J::Killed,
                ErrorUpdate::Set("Cancelled before handoff".into()),
            )),
            _ => Err(JobRejected::Illegal {
                from,
                event: event.name(),
            }),
        },
    }
}

/// Whether a job that just went terminal on its own (`next`) takes its unfinished children
/// with it: always when it succeeded; otherwise per its preemption policy (TERMINATE_CHILDREN=1,
/// PRESERVE_CHILDREN=2), where an unspecified policy terminates them for jobs of one task.
pub fn terminates_children(next: JobState, policy: i32, num_tasks: i64) -> bool {
    next == JobState::Succeeded || policy == 1 || (policy == 0 && num_tasks <= 1)
}

/// A superseded attempt (not its task's current one) on a worker that was declared dead: if it
/// was still holding the worker it ends WORKER_FAILED, otherwise it keeps the state the
/// controller already decided for it.
pub fn orphaned_attempt_on_worker_loss(state: crate::TaskState) -> crate::TaskState {
    if state.is_active() {
        crate::TaskState::WorkerFailed
    } else {
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TaskState;
    use JobState as J;

    fn kill() -> JobEvent {
        JobEvent::Kill {
            reason: "Terminated by user".into(),
        }
    }

    #[test]
    fn kill_live_and_worker_failed_jobs_only() {
        for from in [J::Pending, J::Building, J::Running, J::WorkerFailed] {
            let s = job_transition(from, &kill()).expect("applies");
            assert_eq!(s.state, J::Killed);
            assert_eq!(s.error, ErrorUpdate::Set("Terminated by user".into()));
            assert!(s.stamp_finished && s.kill_tasks.is_some());
        }
        for from in [J::Succeeded, J::Failed, J::Killed, J::Unschedulable] {
            assert_eq!(
                job_transition(from, &kill()),
                Err(JobRejected::Terminal(from))
            );
        }
    }

    #[test]
    fn recomputed_same_state_is_no_change_except_running_stamps_start() {
        let same = |s| JobEvent::Recomputed {
            next: s,
            error: None,
        };
        assert_eq!(
            job_transition(J::Pending, &same(J::Pending)),
            Err(JobRejected::NoChange)
        );
        let s = job_transition(J::Running, &same(J::Running)).expect("stamps");
        assert!(s.stamp_started && !s.stamp_finished);
        assert_eq!(s.error, ErrorUpdate::Keep);
    }

    #[test]
    fn recomputed_terminal_finalizes_tasks_with_its_error() {
        let s = job_transition(
            J::Running,
            &JobEvent::Recomputed {
                next: J::Failed,
                error: Some("boom".into()),
            },
        )
        .expect("applies");
        assert_eq!(s.finalize_tasks.as_deref(), Some("boom"));
        assert!(s.stamp_finished);
        let s = job_transition(
            J::Running,
            &JobEvent::Recomputed {
                next: J::Succeeded,
                error: None,
            },
        )
        .expect("applies");
        assert_eq!(s.finalize_tasks.as_deref(), Some("Job succeeded"));
        assert_eq!(s.error, ErrorUpdate::Clear);
    }

    #[test]
    fn terminal_jobs_take_no_other_event() {
        for ev in [
            JobEvent::Complete,
            JobEvent::QueuedDeadlinePassed,
            JobEvent::CancelledBeforeHandoff,
            JobEvent::Recomputed {
                next: J::Running,
                error: None,
            },
        ] {
            assert_eq!(
                job_transition(J::Succeeded, &ev),
                Err(JobRejected::Terminal(J::Succeeded))
            );
        }
    }

    #[test]
    fn federation_verdicts() {
        let s = job_transition(J::Pending, &JobEvent::QueuedDeadlinePassed).expect("applies");
        assert_eq!(s.state, J::Unschedulable);
        let refused = JobEvent::RefusedDeadlinePassed {
            message: "peer b: no worker has 8000m cpu".into(),
        };
        let s = job_transition(J::Pending, &refused).expect("applies");
        assert_eq!(
            (s.state, s.error),
            (
                J::Unschedulable,
                ErrorUpdate::Set("peer b: no worker has 8000m cpu".into())
            )
        );
        assert!(matches!(
            job_transition(J::Running, &refused),
            Err(JobRejected::Illegal { .. })
        ));
        assert!(matches!(
            job_transition(J::Running, &JobEvent::QueuedDeadlinePassed),
            Err(JobRejected::Illegal { .. })
        ));
        let s = job_transition(
            J::Running,
            &JobEvent::HandoffRejected {
                message: "no".into(),
            },
        )
        .expect("applies");
        assert_eq!(
            (s.state, s.error),
            (J::Killed, ErrorUpdate::Set("no".into()))
        );
        let s = job_transition(J::Pending, &JobEvent::CancelledBeforeHandoff).expect("applies");
        assert_eq!(s.state, J::Killed);
    }

    #[test]
    fn complete_marks_tasks_done() {
        let s = job_transition(J::Pending, &JobEvent::Complete).expect("applies");
        assert!(s.complete_tasks && s.stamp_started && s.stamp_finished);
        assert_eq!(s.error, ErrorUpdate::Clear);
    }

    #[test]
    fn children_follow_the_policy() {
        assert!(terminates_children(J::Succeeded, 2, 8));
        assert!(terminates_children(J::Failed, 1, 8));
        assert!(!terminates_children(J::Failed, 2, 1));
        assert!(terminates_children(J::Failed, 0, 1));
        assert!(!terminates_children(J::Failed, 0, 2));
    }

    #[test]
    fn orphaned_attempts() {
        for s in TaskState::ALL {
            let n = orphaned_attempt_on_worker_loss(*s);
            if s.is_active() {
                assert_eq!(n, TaskState::WorkerFailed);
            } else {
                assert_eq!(n, *s);
            }
        }
    }
}
