//! One test per row of the reference §2.4 table, plus §2.5 and §2.6.

use super::*;
use crate::state::TaskState as T;

fn task(state: T, attempt: Option<(T, bool)>) -> TaskCtx {
    TaskCtx {
        state,
        attempt: attempt.map(|(state, started)| AttemptCtx { state, started }),
        failure_count: 0,
        preemption_count: 0,
        max_retries_failure: 0,
        max_retries_preemption: 100,
        coscheduled: false,
    }
}

fn report(state: T) -> TaskEvent {
    TaskEvent::Report {
        state,
        error: String::new(),
    }
}

#[test]
fn pending_assign_creates_attempt() {
    let s = transition(&task(T::Pending, None), &TaskEvent::Assign).expect("applies");
    assert_eq!(
        (s.task, s.attempt, s.new_attempt),
        (T::Assigned, Some(T::Assigned), true)
    );
}

#[test]
fn assigned_building_marks_started() {
    let s = transition(
        &task(T::Assigned, Some((T::Assigned, false))),
        &report(T::Building),
    )
    .expect("applies");
    assert_eq!(
        (s.task, s.attempt, s.mark_started),
        (T::Building, Some(T::Building), true)
    );
}

#[test]
fn an_exit_reported_straight_from_assigned_marks_started() {
    for end in [T::Succeeded, T::Failed] {
        let s = transition(&task(T::Assigned, Some((T::Assigned, false))), &report(end))
            .expect("applies");
        assert_eq!((s.attempt, s.mark_started), (Some(end), true), "{end}");
        let s =
            transition(&task(T::Running, Some((T::Running, true))), &report(end)).expect("applies");
        assert!(!s.mark_started, "{end} after running keeps the first stamp");
    }
}

#[test]
fn assigned_or_building_running() {
    let s = transition(
        &task(T::Assigned, Some((T::Assigned, false))),
        &report(T::Running),
    )
    .expect("applies");
    assert_eq!((s.task, s.mark_started), (T::Running, true));
    let s = transition(
        &task(T::Building, Some((T::Building, true))),
        &report(T::Running),
    )
    .expect("applies");
    assert_eq!((s.task, s.mark_started), (T::Running, false));
    assert_eq!(
        transition(
            &task(T::Running, Some((T::Running, true))),
            &report(T::Running)
        ),
        Err(Rejected::NoChange)
    );
}

#[test]
fn active_succeeded() {
    let s = transition(
        &task(T::Running, Some((T::Running, true))),
        &report(T::Succeeded),
    )
    .expect("applies");
    assert_eq!((s.task, s.attempt), (T::Succeeded, Some(T::Succeeded)));
}

#[test]
fn failed_within_and_beyond_failure_budget() {
    let mut t = task(T::Running, Some((T::Running, true)));
    t.max_retries_failure = 1;
    let ev = TaskEvent::Report {
        state: T::Failed,
        error: "Exit code: 3".into(),
    };
    let s = transition(&t, &ev).expect("applies");
    assert_eq!((s.task, s.attempt), (T::Pending, Some(T::Failed)));
    assert_eq!(s.reason, "TaskRetryScheduled");
    t.failure_count = 1;
    let s = transition(&t, &ev).expect("applies");
    assert_eq!((s.task, s.attempt), (T::Failed, Some(T::Failed)));
    assert_eq!(s.error.as_deref(), Some("Exit code: 3"));
}

#[test]
fn assigned_loss_is_never_charged() {
    let mut t = task(T::Assigned, Some((T::Assigned, false)));
    t.max_retries_preemption = 0;
    for ev in [
        TaskEvent::WorkerLost,
        report(T::WorkerFailed),
        report(T::Killed),
    ] {
        let s = transition(&t, &ev).expect("applies");
        assert_eq!(s.task, T::Pending, "{ev:?}");
    }
    let s = transition(
        &t,
        &TaskEvent::Preempt {
            by: "/a/b/0".into(),
        },
    )
    .expect("applies");
    assert_eq!((s.task, s.attempt), (T::Pending, Some(T::Preempted)));
}

#[test]
fn started_loss_within_and_beyond_preemption_budget() {
    let mut t = task(T::Running, Some((T::Running, true)));
    t.max_retries_preemption = 1;
    let s = transition(&t, &TaskEvent::WorkerLost).expect("applies");
    assert_eq!((s.task, s.attempt), (T::Pending, Some(T::WorkerFailed)));
    t.preemption_count = 1;
    let s = transition(&t, &TaskEvent::WorkerLost).expect("applies");
    assert_eq!(
        (s.task, s.attempt),
        (T::WorkerFailed, Some(T::WorkerFailed))
    );
    let s = transition(
        &t,
        &TaskEvent::Preempt {
            by: "/x/y/0".into(),
        },
    )
    .expect("applies");
    assert_eq!((s.task, s.attempt), (T::Preempted, Some(T::Preempted)));
    assert_eq!(s.error.as_deref(), Some("Preempted by /x/y/0"));
}

#[test]
fn missing_report_is_worker_failure() {
    let s = transition(
        &task(T::Running, Some((T::Running, true))),
        &report(T::Missing),
    )
    .expect("applies");
    assert_eq!((s.task, s.attempt), (T::Pending, Some(T::WorkerFailed)));
    assert_eq!(s.error.as_deref(), Some("worker_lost_spec"));
}

#[test]
fn scheduling_timeout() {
    let s = transition(&task(T::Pending, None), &TaskEvent::SchedulingTimeout).expect("applies");
    assert_eq!(s.task, T::Unschedulable);
    assert!(transition(&task(T::Running, None), &TaskEvent::SchedulingTimeout).is_err());
}

#[test]
fn execution_timeout_fails_without_retry() {
    let mut t = task(T::Running, Some((T::Running, true)));
    t.max_retries_failure = 5;
    let s = transition(&t, &TaskEvent::ExecutionTimeout).expect("applies");
    assert_eq!((s.task, s.attempt), (T::Failed, Some(T::Failed)));
    assert_eq!(s.error.as_deref(), Some("Execution timeout exceeded"));
}

#[test]
fn kill_from_any_non_terminal() {
    for (state, attempt) in [
        (T::Pending, None),
        (T::Pending, Some((T::Failed, true))),
        (T::Assigned, Some((T::Assigned, false))),
        (T::Running, Some((T::Running, true))),
    ] {
        let s = transition(
            &task(state, attempt),
            &TaskEvent::Kill {
                reason: "Terminated by user".into(),
            },
        )
        .expect("applies");
        assert_eq!(s.task, T::Killed);
        let expect_attempt = attempt.filter(|a| !a.0.is_terminal()).map(|_| T::Killed);
        assert_eq!(s.attempt, expect_attempt, "{state:?}");
    }
}

#[test]
fn job_finalized_kills_with_its_own_reason() {
    let s = transition(
        &task(T::Running, Some((T::Running, true))),
        &TaskEvent::JobFinalized {
            reason: "Job failed".into(),
        },
    )
    .expect("applies");
    assert_eq!(
        (s.task, s.attempt, s.reason),
        (T::Killed, Some(T::Killed), "JobFinalizedTaskKilled")
    );
    assert_eq!(s.error.as_deref(), Some("Job failed"));
}

#[test]
fn complete_succeeds() {
    let s = transition(
        &task(T::Running, Some((T::Running, true))),
        &TaskEvent::Complete,
    )
    .expect("applies");
    assert_eq!(s.task, T::Succeeded);
    let s = transition(&task(T::Pending, None), &TaskEvent::Complete).expect("applies");
    assert_eq!((s.task, s.attempt), (T::Succeeded, None));
}

#[test]
fn kick_fail_is_like_timeout() {
    let s = transition(
        &task(T::Running, Some((T::Running, true))),
        &TaskEvent::KickFail,
    )
    .expect("applies");
    assert_eq!(s.task, T::Failed);
}

#[test]
fn terminal_tasks_reject_everything() {
    for st in [
        T::Succeeded,
        T::Failed,
        T::Killed,
        T::WorkerFailed,
        T::CoschedFailed,
    ] {
        assert_eq!(
            transition(&task(st, None), &TaskEvent::WorkerLost),
            Err(Rejected::Terminal(st))
        );
    }
}

#[test]
fn gang_cascade_direction() {
    let mut t = task(T::Running, Some((T::Running, true)));
    t.coscheduled = true;
    let fail = TaskEvent::Report {
        state: T::Failed,
        error: "Exit code: 1".into(),
    };
    assert_eq!(
        transition(&t, &fail).expect("applies").cascade,
        Some(GangCascade::Fail)
    );
    t.max_retries_failure = 1;
    assert_eq!(
        transition(&t, &fail).expect("applies").cascade,
        Some(GangCascade::Requeue)
    );
    let s = transition(
        &t,
        &TaskEvent::SiblingFailed {
            sibling: "/a/b/1".into(),
        },
    )
    .expect("applies");
    assert_eq!(
        (s.task, s.attempt),
        (T::CoschedFailed, Some(T::CoschedFailed))
    );
    let s = transition(
        &t,
        &TaskEvent::SiblingRequeued {
            sibling: "/a/b/1".into(),
        },
    )
    .expect("applies");
    assert_eq!((s.task, s.attempt), (T::Pending, Some(T::CoschedFailed)));
}

fn job(tasks: &[T], failed: u32, limit: u32) -> (JobState, Option<String>) {
    job_state(&JobCtx {
        tasks,
        failed_attempts: failed,
        max_task_failures: limit,
        ever_started: false,
        first_error: Some("Exit code: 3"),
    })
}

#[test]
fn job_state_precedence() {
    assert_eq!(
        job(&[T::Succeeded, T::Succeeded], 0, 0).0,
        JobState::Succeeded
    );
    let (s, e) = job(&[T::Failed, T::Running], 1, 0);
    assert_eq!(s, JobState::Failed);
    assert_eq!(
        e.as_deref(),
        Some("Cumulative failed task attempts exceeded max_task_failures: failures=1, limit=0; Exit code: 3")
    );
    assert_eq!(
        job(&[T::Unschedulable, T::Killed], 0, 0).0,
        JobState::Unschedulable
    );
    assert_eq!(job(&[T::Succeeded, T::Killed], 0, 0).0, JobState::Killed);
    assert_eq!(
        job(&[T::Succeeded, T::WorkerFailed], 0, 0).0,
        JobState::WorkerFailed
    );
    assert_eq!(job(&[T::Succeeded, T::Failed], 1, 1).0, JobState::Failed);
    assert_eq!(job(&[T::Succeeded, T::Running], 0, 0).0, JobState::Running);
    assert_eq!(job(&[T::Pending, T::Pending], 0, 0).0, JobState::Pending);
    assert_eq!(
        job(&[T::Pending, T::WorkerFailed], 0, 0).0,
        JobState::Pending
    );
}

/// The job rollup looks the job's error up only for a verdict that carries one, which is sound
/// only if the error never changes the verdict: every pair of task states, budget spent or not,
/// started or not, gets the same state with and without an error.
#[test]
fn the_first_error_words_the_job_verdict_but_never_picks_it() {
    for a in T::ALL {
        for b in T::ALL {
            for (failed_attempts, started) in [(0, false), (0, true), (3, false), (3, true)] {
                let tasks = [*a, *b];
                let ctx = |first_error| JobCtx {
                    tasks: &tasks,
                    failed_attempts,
                    max_task_failures: 1,
                    ever_started: started,
                    first_error,
                };
                let (without, none) = job_state(&ctx(None));
                let (with, _) = job_state(&ctx(Some("boom")));
                assert_eq!(without, with, "tasks {a} and {b}, {failed_attempts} failed");
                if !without.is_terminal() {
                    assert_eq!(none, None, "tasks {a} and {b}: a live job has no error");
                }
            }
        }
    }
}

/// Every task event, each report once per state.
fn all_events() -> Vec<TaskEvent> {
    let mut events = vec![
        TaskEvent::Assign,
        TaskEvent::WorkerLost,
        TaskEvent::Preempt { by: "/x".into() },
        TaskEvent::ExecutionTimeout,
        TaskEvent::SchedulingTimeout,
        TaskEvent::Kill { reason: "r".into() },
        TaskEvent::JobFinalized { reason: "r".into() },
        TaskEvent::Complete,
        TaskEvent::SiblingFailed {
            sibling: "s".into(),
        },
        TaskEvent::SiblingRequeued {
            sibling: "s".into(),
        },
        TaskEvent::KickFail,
    ];
    events.extend(T::ALL.iter().map(|s| report(*s)));
    events
}

/// No attempt, or an attempt in any state, started or not.
fn all_attempts() -> Vec<Option<(T, bool)>> {
    std::iter::once(None)
        .chain(
            T::ALL
                .iter()
                .flat_map(|s| [Some((*s, false)), Some((*s, true))]),
        )
        .collect()
}

/// `TaskEvent::reads_retry_counts`: for every event it says no to, in every state, with or
/// without an attempt (started or not), in or out of a gang, and whatever the budgets, the
/// step is the same with the counts at zero as with any counts.
#[test]
fn only_failures_and_losses_read_the_retry_counts() {
    let events = all_events();
    let attempts = all_attempts();
    let mut read = 0;
    for event in &events {
        if event.reads_retry_counts() {
            read += 1;
            continue;
        }
        for state in T::ALL {
            for attempt in &attempts {
                for coscheduled in [false, true] {
                    for (max_f, max_p) in [(0, 0), (1, 1), (3, 5)] {
                        let mut zero = task(*state, *attempt);
                        zero.coscheduled = coscheduled;
                        zero.max_retries_failure = max_f;
                        zero.max_retries_preemption = max_p;
                        for (f, p) in [(1, 0), (0, 1), (2, 4), (9, 9)] {
                            let counted = TaskCtx {
                                failure_count: f,
                                preemption_count: p,
                                ..zero
                            };
                            assert_eq!(
                                transition(&zero, event),
                                transition(&counted, event),
                                "{event:?} from {state} with {f} failures and {p} preemptions"
                            );
                        }
                    }
                }
            }
        }
    }
    // The events that do read them: a failure and the losses (reported or not).
    assert_eq!(read, 7, "WorkerLost, Preempt and five reported ends");
}

/// The other tasks a job may have beside the one a step moves: none, one or two, in every state.
fn up_to_two_other_tasks() -> Vec<Vec<T>> {
    let mut others: Vec<Vec<T>> = vec![vec![]];
    for a in T::ALL {
        others.push(vec![*a]);
        for b in T::ALL {
            others.push(vec![*a, *b]);
        }
    }
    others
}

/// The verdict on a job that has started, whose tasks are `first` and `rest`, with `failed`
/// failed attempts of `limit` allowed.
fn started_job_state(first: T, rest: &[T], failed: u32, limit: u32) -> JobState {
    let tasks: Vec<T> = std::iter::once(first).chain(rest.iter().copied()).collect();
    job_state(&JobCtx {
        tasks: &tasks,
        failed_attempts: failed,
        max_task_failures: limit,
        ever_started: true,
        first_error: None,
    })
    .0
}

/// `RunningJobMove::OnceNoTaskIsLeft`: every step it names, from every task state, attempt and
/// gang flag, ends its task SUCCEEDED without failing an attempt or moving a gang, and leaves a
/// started RUNNING job RUNNING while another of its tasks is unfinished, whatever those others
/// are and whatever its failure count and limit. And with none left it does move some job.
#[test]
fn a_success_moves_a_running_job_only_once_no_task_is_left() {
    use crate::RunningJobMove as M;
    let others = up_to_two_other_tasks();
    let (mut successes, mut checked, mut moved) = (0, 0, 0);
    for event in &all_events() {
        for state in T::ALL {
            for attempt in &all_attempts() {
                for coscheduled in [false, true] {
                    let mut t = task(*state, *attempt);
                    t.coscheduled = coscheduled;
                    let Ok(step) = transition(&t, event) else {
                        continue;
                    };
                    if step.running_job_move() != M::OnceNoTaskIsLeft {
                        continue;
                    }
                    successes += 1;
                    // A success fails no attempt: the job's failure count stays.
                    assert_eq!(step.task, T::Succeeded);
                    assert_ne!(step.attempt, Some(T::Failed));
                    assert!(step.cascade.is_none());
                    for rest in &others {
                        for (failed, limit) in [(0, 0), (1, 1), (2, 1), (2, 5)] {
                            let state_of = |first: T| started_job_state(first, rest, failed, limit);
                            if state_of(*state) != JobState::Running {
                                continue;
                            }
                            if rest.iter().any(|s| !s.is_terminal()) {
                                checked += 1;
                                assert_eq!(
                                    state_of(step.task),
                                    JobState::Running,
                                    "{event:?} from {state} ({attempt:?}) beside {rest:?}, {failed} failed of {limit}"
                                );
                            } else if state_of(step.task) != JobState::Running {
                                moved += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        successes > 0 && checked > 100,
        "{successes} successes, {checked} checked"
    );
    // With nothing left unfinished, a success does move a job (the rule is not vacuous).
    assert!(moved > 0);
    // The strongest step of a batch decides: the kinds are ordered.
    assert!(M::Cannot < M::OnceNoTaskIsLeft && M::OnceNoTaskIsLeft < M::May);
}

/// `Step::can_move_a_running_job`: every step it says no to, from every task state, attempt,
/// gang flag, budget and count, leaves a started RUNNING job RUNNING (§2.6), whatever up to two
/// other tasks of the job are and whatever its failure count and limit (raised by one when the
/// step fails an attempt, as the store counts them). And the rule is not vacuous: an assignment
/// and a RUNNING report are among the steps it skips.
#[test]
fn only_ends_failures_and_cascades_can_move_a_running_job() {
    let others = up_to_two_other_tasks();
    let (mut skipped, mut checked) = (0, 0);
    for event in &all_events() {
        for state in T::ALL {
            for attempt in &all_attempts() {
                for coscheduled in [false, true] {
                    for (max_f, max_p, f, p) in
                        [(0, 0, 0, 0), (1, 1, 0, 0), (1, 1, 1, 1), (3, 5, 1, 2)]
                    {
                        let mut t = task(*state, *attempt);
                        t.coscheduled = coscheduled;
                        t.max_retries_failure = max_f;
                        t.max_retries_preemption = max_p;
                        t.failure_count = f;
                        t.preemption_count = p;
                        let Ok(step) = transition(&t, event) else {
                            continue;
                        };
                        if step.can_move_a_running_job() {
                            continue;
                        }
                        skipped += 1;
                        for rest in &others {
                            for (failed, limit) in [(0, 0), (1, 1), (2, 1), (2, 5)] {
                                let state_of = |first: T, failed: u32| {
                                    started_job_state(first, rest, failed, limit)
                                };
                                if state_of(*state, failed) != JobState::Running {
                                    continue;
                                }
                                checked += 1;
                                // The store counts an attempt that enters FAILED.
                                let failed_after =
                                    failed + u32::from(step.attempt == Some(T::Failed));
                                assert_eq!(
                                    state_of(step.task, failed_after),
                                    JobState::Running,
                                    "{event:?} from {state} ({attempt:?}) to {} beside {rest:?}, {failed} failed of {limit}",
                                    step.task
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} running jobs checked");
    let assign = transition(&task(T::Pending, None), &TaskEvent::Assign).expect("assigns");
    let running = transition(
        &task(T::Assigned, Some((T::Assigned, false))),
        &report(T::Running),
    )
    .expect("runs");
    assert!(!assign.can_move_a_running_job() && !running.can_move_a_running_job());
    assert!(skipped > 0);
}
