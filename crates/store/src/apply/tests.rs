//! The state machine driven through the store: jobs from `insert_job`, workers from
//! `workers::upsert`, events through the appliers, state read back through `views` and `jobs`.

use super::*;
use crate::sealed::Raw;
use crate::{jobs, views, workers, Db, Tx};
use iris_types::{JobEvent, JobState, TaskEvent, TaskState};

const T0: i64 = 1_000_000;

fn db() -> Db {
    Db::open_in_memory().expect("in-memory db")
}

/// A root job of `tasks` tasks owned by alice, with no retries and no failure allowance.
fn job(id: &str, tasks: u32) -> NewJob {
    NewJob {
        job_id: id.into(),
        user_id: "alice".into(),
        submitting_user: "alice".into(),
        parent_job_id: None,
        root_job_id: id.into(),
        depth: 1,
        num_tasks: tasks,
        ..Default::default()
    }
}

fn child(parent: &NewJob, name: &str, tasks: u32) -> NewJob {
    let mut j = job(&format!("{}/{name}", parent.job_id), tasks);
    j.parent_job_id = Some(parent.job_id.clone());
    j.root_job_id = parent.root_job_id.clone();
    j.depth = parent.depth + 1;
    j
}

fn insert(tx: &Tx<'_>, j: &NewJob) {
    insert_job(tx, j, T0).expect("insert job");
}

fn worker(tx: &Tx<'_>, id: &str) {
    let r = workers::Registration {
        worker_id: id.into(),
        address: format!("127.0.0.1:{}", 9000 + id.len()),
        ..Default::default()
    };
    workers::upsert(tx, &r, T0).expect("upsert worker");
}

fn assign(tx: &Tx<'_>, task: &str, worker: &str, uid: &str, now: i64) -> bool {
    assign_task(tx, task, worker, "127.0.0.1:1", uid, 2, now).expect("assign")
}

fn report(
    tx: &Tx<'_>,
    worker: &str,
    uid: &str,
    state: TaskState,
    exit_code: Option<i32>,
    error: &str,
    now: i64,
) -> bool {
    let obs = Observation {
        attempt_uid: uid.into(),
        state,
        exit_code,
        error: error.into(),
        status_message: String::new(),
        container_id: String::new(),
    };
    apply_observation(tx, worker, &obs, now).expect("observation")
}

fn event(tx: &Tx<'_>, task: &str, ev: TaskEvent, finish: Finish, now: i64) -> Option<TaskState> {
    apply_task_event(tx, task, &ev, None, finish, now, "test").expect("task event")
}

fn task(tx: &Tx<'_>, id: &str) -> views::TaskRow {
    views::task(tx, id)
        .expect("read task")
        .expect("task exists")
}

fn task_state(tx: &Tx<'_>, id: &str) -> TaskState {
    jobs::task_state(tx, id)
        .expect("read task state")
        .expect("task exists")
        .0
}

fn job_state(tx: &Tx<'_>, id: &str) -> JobState {
    jobs::job_state_of(tx, id)
        .expect("read job state")
        .expect("job exists")
}

fn job_row(tx: &Tx<'_>, id: &str) -> views::JobRow {
    views::job(tx, id).expect("read job").expect("job exists")
}

#[test]
fn a_task_goes_assigned_building_running_succeeded_and_the_job_follows() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    insert(&tx, &job("/alice/j", 2));
    assert_eq!(job_state(&tx, "/alice/j"), JobState::Pending);

    assert!(assign(&tx, "/alice/j/0", "w1", "uid-0", T0 + 1));
    let t = task(&tx, "/alice/j/0");
    assert_eq!(t.state, TaskState::Assigned.code());
    assert_eq!(t.worker_id.as_deref(), Some("w1"));
    assert_eq!(t.current_attempt_id, 0);
    assert_eq!(t.attempts.len(), 1);
    assert_eq!(t.attempts[0].state, TaskState::Assigned);
    assert_eq!(t.attempts[0].attempt_uid, "uid-0");
    assert_eq!(t.attempts[0].started_at_ms, None);
    assert_eq!(job_state(&tx, "/alice/j"), JobState::Running);
    // A task that is not pending cannot be assigned again.
    assert!(!assign(&tx, "/alice/j/0", "w1", "uid-x", T0 + 1));

    assert!(report(
        &tx,
        "w1",
        "uid-0",
        TaskState::Building,
        None,
        "",
        T0 + 2
    ));
    let t = task(&tx, "/alice/j/0");
    assert_eq!(t.state, TaskState::Building.code());
    assert_eq!(t.attempts[0].started_at_ms, Some(T0 + 2));
    // A backend's event between two transitions goes on the same chain (`insert_event`).
    assert!(crate::events::record_attempt_event(
        &tx,
        "uid-0",
        ["Normal", "Pulled", "image pulled", "test"],
        T0 + 2
    )
    .expect("event"));

    assert!(report(
        &tx,
        "w1",
        "uid-0",
        TaskState::Running,
        None,
        "",
        T0 + 3
    ));
    assert_eq!(task_state(&tx, "/alice/j/0"), TaskState::Running);
    // A repeated RUNNING is no change.
    assert!(!report(
        &tx,
        "w1",
        "uid-0",
        TaskState::Running,
        None,
        "",
        T0 + 4
    ));

    assert!(report(
        &tx,
        "w1",
        "uid-0",
        TaskState::Succeeded,
        Some(0),
        "",
        T0 + 5
    ));
    let t = task(&tx, "/alice/j/0");
    assert_eq!(t.state, TaskState::Succeeded.code());
    assert_eq!(t.exit_code, Some(0));
    assert_eq!(t.attempts[0].state, TaskState::Succeeded);
    assert_eq!(t.attempts[0].finished_at_ms, Some(T0 + 5));
    // One of two tasks done: the job still runs.
    assert_eq!(job_state(&tx, "/alice/j"), JobState::Running);
    // Each step appended its event to the task's chain, after the one the task row named.
    let reasons: Vec<String> = crate::inspect::task_events(&tx, "/alice/j/0", None, 100)
        .expect("events")
        .events
        .into_iter()
        .map(|e| e.reason)
        .collect();
    assert_eq!(
        reasons,
        [
            "TaskAssigned",
            "TaskBuilding",
            "Pulled",
            "TaskRunning",
            "TaskSucceeded"
        ]
    );

    assert!(assign(&tx, "/alice/j/1", "w1", "uid-1", T0 + 6));
    assert!(report(
        &tx,
        "w1",
        "uid-1",
        TaskState::Running,
        None,
        "",
        T0 + 7
    ));
    assert!(report(
        &tx,
        "w1",
        "uid-1",
        TaskState::Succeeded,
        Some(0),
        "",
        T0 + 8
    ));
    let j = job_row(&tx, "/alice/j");
    assert_eq!(j.state, JobState::Succeeded.code());
    assert_eq!(j.finished_at_ms, Some(T0 + 8));
    assert_eq!(j.error, None);
}

#[test]
fn a_failure_with_retries_left_requeues_and_the_next_assign_opens_a_new_attempt() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    worker(&tx, "w2");
    let mut j = job("/alice/retry", 1);
    j.cfg.max_retries_failure = 1;
    j.cfg.max_task_failures = 5;
    insert(&tx, &j);

    assert!(assign(&tx, "/alice/retry/0", "w1", "a0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Failed,
        Some(3),
        "exit 3: boom",
        T0 + 3
    ));
    let t = task(&tx, "/alice/retry/0");
    assert_eq!(t.state, TaskState::Pending.code(), "retried, not failed");
    assert_eq!(t.worker_id, None, "a re-queued task holds no worker");
    assert_eq!(t.attempts.len(), 1);
    assert_eq!(t.attempts[0].state, TaskState::Failed);
    assert_eq!(t.attempts[0].error.as_deref(), Some("exit 3: boom"));
    assert_eq!(t.attempts[0].exit_code, Some(3));
    assert_eq!(t.attempts[0].finished_at_ms, Some(T0 + 3));
    assert!(!job_state(&tx, "/alice/retry").is_terminal());

    assert!(assign(&tx, "/alice/retry/0", "w2", "a1", T0 + 4));
    let t = task(&tx, "/alice/retry/0");
    assert_eq!(t.current_attempt_id, 1);
    assert_eq!(t.worker_id.as_deref(), Some("w2"));
    assert_eq!(t.attempts.len(), 2);
    assert_eq!(t.attempts[1].attempt_uid, "a1");
    assert_eq!(t.attempts[1].state, TaskState::Assigned);
    assert_eq!(
        t.attempts[0].state,
        TaskState::Failed,
        "the old attempt is kept"
    );

    // The retry budget is spent: the second failure is final.
    assert!(report(
        &tx,
        "w2",
        "a1",
        TaskState::Failed,
        Some(1),
        "again",
        T0 + 5
    ));
    assert_eq!(task_state(&tx, "/alice/retry/0"), TaskState::Failed);
    assert_eq!(job_state(&tx, "/alice/retry"), JobState::Failed);
}

#[test]
fn a_failure_without_retries_fails_the_job_with_the_attempts_error() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    let mut j = job("/alice/once", 1);
    j.cfg.max_task_failures = 5;
    insert(&tx, &j);
    assert!(assign(&tx, "/alice/once/0", "w1", "a0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Failed,
        Some(2),
        "exit 2: no such file",
        T0 + 3
    ));

    let t = task(&tx, "/alice/once/0");
    assert_eq!(t.state, TaskState::Failed.code());
    assert_eq!(t.error.as_deref(), Some("exit 2: no such file"));
    assert_eq!(t.exit_code, Some(2));
    let j = job_row(&tx, "/alice/once");
    assert_eq!(j.state, JobState::Failed.code());
    assert_eq!(j.error.as_deref(), Some("exit 2: no such file"));
    assert_eq!(j.failure_count, 1);
    assert_eq!(j.finished_at_ms, Some(T0 + 3));
}

#[test]
fn failed_attempts_over_max_task_failures_fail_the_job_and_finalize_its_tasks() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    let mut j = job("/alice/flaky", 2);
    j.cfg.max_retries_failure = 3;
    j.cfg.max_task_failures = 0;
    insert(&tx, &j);
    assert!(assign(&tx, "/alice/flaky/0", "w1", "a0", T0 + 1));
    assert!(assign(&tx, "/alice/flaky/1", "w1", "b0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Failed,
        Some(1),
        "oops",
        T0 + 2
    ));

    let j = job_row(&tx, "/alice/flaky");
    assert_eq!(j.state, JobState::Failed.code());
    let err = j.error.unwrap_or_default();
    assert!(
        err.contains("max_task_failures") && err.contains("oops"),
        "{err}"
    );
    // The retrying task and its assigned sibling are killed with the job.
    assert_eq!(task_state(&tx, "/alice/flaky/0"), TaskState::Killed);
    let sib = task(&tx, "/alice/flaky/1");
    assert_eq!(sib.state, TaskState::Killed.code());
    assert_eq!(sib.attempts[0].state, TaskState::Killed);
    assert_eq!(
        sib.attempts[0].finished_at_ms, None,
        "a controller-decided end waits for the worker's confirmation"
    );
}

/// `report` with the job's rollup left to `rollups`.
fn report_deferred(
    tx: &Tx<'_>,
    uid: &str,
    state: TaskState,
    exit_code: Option<i32>,
    now: i64,
    rollups: &mut JobRollups,
) -> bool {
    let obs = Observation {
        attempt_uid: uid.into(),
        state,
        exit_code,
        error: String::new(),
        status_message: String::new(),
        container_id: String::new(),
    };
    apply_observation_deferred(tx, "w1", &obs, now, rollups).expect("observation")
}

#[test]
fn a_batch_rolls_each_job_up_once_at_its_end_as_one_report_at_a_time_would() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    insert(&tx, &job("/alice/batch", 3));
    let mut rollups = JobRollups::default();
    for (i, uid) in ["a", "b", "c"].iter().enumerate() {
        let task = format!("/alice/batch/{i}");
        assert!(assign_deferred(
            &tx,
            &task,
            Holder::Worker {
                id: "w1",
                address: "127.0.0.1:1"
            },
            uid,
            2,
            T0 + 1,
            &mut rollups,
        )
        .expect("assign"));
    }
    // Not rolled up yet: the job still says PENDING inside the batch.
    assert_eq!(job_state(&tx, "/alice/batch"), JobState::Pending);
    rollups.finish(&tx, T0 + 1).expect("rollup");
    assert_eq!(job_state(&tx, "/alice/batch"), JobState::Running);

    let mut rollups = JobRollups::default();
    for uid in ["a", "b", "c"] {
        assert!(report_deferred(
            &tx,
            uid,
            TaskState::Running,
            None,
            T0 + 2,
            &mut rollups
        ));
        assert!(report_deferred(
            &tx,
            uid,
            TaskState::Succeeded,
            Some(0),
            T0 + 3,
            &mut rollups
        ));
    }
    rollups.finish(&tx, T0 + 3).expect("rollup");
    let j = job_row(&tx, "/alice/batch");
    assert_eq!(j.state, JobState::Succeeded.code());
    assert_eq!(j.finished_at_ms, Some(T0 + 3));
}

#[test]
fn in_a_batch_a_job_that_fails_part_way_finalizes_its_other_tasks_after_their_reports() {
    // The one ordering a batch changes: task 0's failure fails the job (no failure allowance),
    // but task 1's success in the same batch is applied before the rollup kills what is left.
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    insert(&tx, &job("/alice/race", 3));
    assert!(assign(&tx, "/alice/race/0", "w1", "a", T0 + 1));
    assert!(assign(&tx, "/alice/race/1", "w1", "b", T0 + 1));
    assert!(assign(&tx, "/alice/race/2", "w1", "c", T0 + 1));
    let mut rollups = JobRollups::default();
    assert!(report_deferred(
        &tx,
        "a",
        TaskState::Failed,
        Some(1),
        T0 + 2,
        &mut rollups
    ));
    assert!(report_deferred(
        &tx,
        "b",
        TaskState::Succeeded,
        Some(0),
        T0 + 2,
        &mut rollups
    ));
    rollups.finish(&tx, T0 + 2).expect("rollup");
    assert_eq!(job_state(&tx, "/alice/race"), JobState::Failed);
    assert_eq!(task_state(&tx, "/alice/race/0"), TaskState::Failed);
    assert_eq!(task_state(&tx, "/alice/race/1"), TaskState::Succeeded);
    assert_eq!(task_state(&tx, "/alice/race/2"), TaskState::Killed);
}

#[test]
fn fail_worker_sends_the_current_attempt_down_worker_failed_and_requeues() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    worker(&tx, "w2");
    let mut j = job("/alice/lost", 2);
    j.cfg.max_retries_preemption = 1;
    insert(&tx, &j);
    // Task 0 runs on w1.
    assert!(assign(&tx, "/alice/lost/0", "w1", "a0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));
    // Task 1's first attempt on w1 was preempted by the controller (w1 has not confirmed it
    // ended) and the task was placed again on w2.
    assert!(assign(&tx, "/alice/lost/1", "w1", "b0", T0 + 1));
    let preempt = TaskEvent::Preempt {
        by: "/bob/x/0".into(),
    };
    assert_eq!(
        event(&tx, "/alice/lost/1", preempt, Finish::AwaitWorker, T0 + 3),
        Some(TaskState::Pending)
    );
    assert_eq!(task(&tx, "/alice/lost/1").attempts[0].finished_at_ms, None);
    assert!(assign(&tx, "/alice/lost/1", "w2", "b1", T0 + 4));

    let mut affected = fail_worker(&tx, "w1", T0 + 10).expect("fail worker");
    affected.sort();
    assert_eq!(affected, vec!["/alice/lost/0", "/alice/lost/1"]);

    let t0 = task(&tx, "/alice/lost/0");
    assert_eq!(
        t0.state,
        TaskState::Pending.code(),
        "re-queued within the preemption budget"
    );
    assert_eq!(t0.worker_id, None);
    assert_eq!(t0.attempts[0].state, TaskState::WorkerFailed);
    assert_eq!(t0.attempts[0].finished_at_ms, Some(T0 + 10));
    assert_eq!(t0.error.as_deref(), Some("Worker failed"));

    let t1 = task(&tx, "/alice/lost/1");
    assert_eq!(
        t1.attempts[0].state,
        TaskState::Preempted,
        "a superseded attempt keeps the end the controller decided"
    );
    assert_eq!(
        t1.attempts[0].finished_at_ms,
        Some(T0 + 10),
        "but it no longer holds w1"
    );
    assert_eq!(
        t1.state,
        TaskState::Assigned.code(),
        "its current attempt on w2 is untouched"
    );
    assert_eq!(t1.attempts[1].state, TaskState::Assigned);
    assert_eq!(t1.attempts[1].finished_at_ms, None);
    assert_eq!(t1.worker_id.as_deref(), Some("w2"));

    assert_eq!(workers::ids(&tx).expect("ids"), vec!["w2"]);
    // The re-queued task runs again on a new attempt.
    assert!(assign(&tx, "/alice/lost/0", "w2", "a1", T0 + 11));
    assert_eq!(task(&tx, "/alice/lost/0").current_attempt_id, 1);
}

#[test]
fn fail_worker_past_the_preemption_budget_ends_the_task_worker_failed() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    insert(&tx, &job("/alice/fragile", 1));
    assert!(assign(&tx, "/alice/fragile/0", "w1", "a0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));
    fail_worker(&tx, "w1", T0 + 3).expect("fail worker");
    assert_eq!(task_state(&tx, "/alice/fragile/0"), TaskState::WorkerFailed);
    assert_eq!(job_state(&tx, "/alice/fragile"), JobState::WorkerFailed);
}

#[test]
fn reports_are_fenced_by_worker_and_attempt() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    worker(&tx, "w2");
    insert(&tx, &job("/alice/fence", 1));
    assert!(assign(&tx, "/alice/fence/0", "w1", "a0", T0 + 1));

    // From the wrong worker: nothing changes.
    assert!(!report(
        &tx,
        "w2",
        "a0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));
    assert!(!report(
        &tx,
        "w2",
        "a0",
        TaskState::Failed,
        Some(1),
        "x",
        T0 + 2
    ));
    let t = task(&tx, "/alice/fence/0");
    assert_eq!(t.state, TaskState::Assigned.code());
    assert_eq!(t.attempts[0].finished_at_ms, None);
    // An unknown attempt: nothing changes.
    assert!(!report(
        &tx,
        "w1",
        "nope",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));

    // The controller preempts a0 (w1 must still confirm) and places a new attempt on w2.
    let preempt = TaskEvent::Preempt {
        by: "/bob/x/0".into(),
    };
    event(&tx, "/alice/fence/0", preempt, Finish::AwaitWorker, T0 + 3);
    assert!(assign(&tx, "/alice/fence/0", "w2", "a1", T0 + 4));

    // A live report for the superseded attempt changes nothing.
    assert!(!report(
        &tx,
        "w1",
        "a0",
        TaskState::Running,
        None,
        "",
        T0 + 5
    ));
    let t = task(&tx, "/alice/fence/0");
    assert_eq!(t.state, TaskState::Assigned.code());
    assert_eq!(t.attempts[0].state, TaskState::Preempted);
    assert_eq!(t.attempts[0].finished_at_ms, None);

    // Its terminal report only confirms it ended (releasing w1), once.
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Killed,
        Some(137),
        "",
        T0 + 6
    ));
    let t = task(&tx, "/alice/fence/0");
    assert_eq!(
        t.attempts[0].state,
        TaskState::Preempted,
        "state is not rewritten"
    );
    assert_eq!(t.attempts[0].finished_at_ms, Some(T0 + 6));
    assert_eq!(t.attempts[0].exit_code, Some(137));
    assert_eq!(
        t.state,
        TaskState::Assigned.code(),
        "the current attempt is untouched"
    );
    assert_eq!(t.attempts[1].state, TaskState::Assigned);
    assert!(!report(
        &tx,
        "w1",
        "a0",
        TaskState::Killed,
        Some(137),
        "",
        T0 + 7
    ));
    assert_eq!(
        task(&tx, "/alice/fence/0").attempts[0].finished_at_ms,
        Some(T0 + 6)
    );

    // The current attempt still takes reports from its own worker.
    assert!(report(
        &tx,
        "w2",
        "a1",
        TaskState::Running,
        None,
        "",
        T0 + 8
    ));
    assert_eq!(task_state(&tx, "/alice/fence/0"), TaskState::Running);
}

#[test]
fn a_terminal_report_for_a_controller_decided_attempt_only_stamps_finished() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    insert(&tx, &job("/alice/slow", 1));
    assert!(assign(&tx, "/alice/slow/0", "w1", "a0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));
    let timeout = TaskEvent::ExecutionTimeout;
    assert_eq!(
        event(&tx, "/alice/slow/0", timeout, Finish::AwaitWorker, T0 + 3),
        Some(TaskState::Failed)
    );
    assert_eq!(task(&tx, "/alice/slow/0").attempts[0].finished_at_ms, None);

    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Killed,
        Some(143),
        "",
        T0 + 4
    ));
    let t = task(&tx, "/alice/slow/0");
    assert_eq!(t.state, TaskState::Failed.code());
    assert_eq!(t.attempts[0].state, TaskState::Failed);
    assert_eq!(t.attempts[0].finished_at_ms, Some(T0 + 4));
    assert_eq!(t.error.as_deref(), Some("Execution timeout exceeded"));
}

#[test]
fn a_gang_members_final_failure_fails_its_siblings() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    worker(&tx, "w2");
    let mut j = job("/alice/gang", 3);
    j.cfg.coscheduling_group_by = Some("slice".into());
    insert(&tx, &j);
    assert!(assign(&tx, "/alice/gang/0", "w1", "g0", T0 + 1));
    assert!(assign(&tx, "/alice/gang/1", "w2", "g1", T0 + 1));
    assert!(assign(&tx, "/alice/gang/2", "w2", "g2", T0 + 1));
    for (w, uid) in [("w1", "g0"), ("w2", "g1"), ("w2", "g2")] {
        assert!(report(&tx, w, uid, TaskState::Running, None, "", T0 + 2));
    }
    // Member 2 already finished: it is not dragged along.
    assert!(report(
        &tx,
        "w2",
        "g2",
        TaskState::Succeeded,
        Some(0),
        "",
        T0 + 3
    ));

    assert!(report(
        &tx,
        "w1",
        "g0",
        TaskState::Failed,
        Some(1),
        "rank 0 died",
        T0 + 4
    ));
    assert_eq!(task_state(&tx, "/alice/gang/0"), TaskState::Failed);
    let sib = task(&tx, "/alice/gang/1");
    assert_eq!(sib.state, TaskState::CoschedFailed.code());
    assert_eq!(sib.attempts[0].state, TaskState::CoschedFailed);
    assert!(sib.error.unwrap_or_default().contains("/alice/gang/0"));
    assert_eq!(task_state(&tx, "/alice/gang/2"), TaskState::Succeeded);
    let j = job_row(&tx, "/alice/gang");
    assert_eq!(j.state, JobState::Failed.code());
    assert!(j.error.unwrap_or_default().contains("rank 0 died"));
}

#[test]
fn a_gang_members_retry_requeues_its_siblings() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    worker(&tx, "w2");
    let mut j = job("/alice/gang2", 2);
    j.cfg.coscheduling_group_by = Some("slice".into());
    j.cfg.max_retries_failure = 1;
    j.cfg.max_task_failures = 5;
    insert(&tx, &j);
    assert!(assign(&tx, "/alice/gang2/0", "w1", "g0", T0 + 1));
    assert!(assign(&tx, "/alice/gang2/1", "w2", "g1", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "g0",
        TaskState::Failed,
        Some(1),
        "flake",
        T0 + 2
    ));

    assert_eq!(task_state(&tx, "/alice/gang2/0"), TaskState::Pending);
    let sib = task(&tx, "/alice/gang2/1");
    assert_eq!(sib.state, TaskState::Pending.code());
    assert_eq!(sib.attempts[0].state, TaskState::CoschedFailed);
    assert!(!job_state(&tx, "/alice/gang2").is_terminal());
}

#[test]
fn kill_subtree_kills_the_job_its_tasks_and_descendants_only() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    let root = job("/alice/p", 1);
    let kid = child(&root, "c", 1);
    let grandkid = child(&kid, "g", 1);
    insert(&tx, &root);
    insert(&tx, &kid);
    insert(&tx, &grandkid);
    // A job whose name merely starts with the same characters is not a descendant.
    insert(&tx, &job("/alice/p2", 1));
    assert!(assign(&tx, "/alice/p/0", "w1", "a0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));

    assert!(kill_subtree(
        &tx,
        "/alice/p",
        "Terminated by user",
        "Parent job terminated",
        T0 + 3
    )
    .expect("kill"));
    let p = job_row(&tx, "/alice/p");
    assert_eq!(p.state, JobState::Killed.code());
    assert_eq!(p.error.as_deref(), Some("Terminated by user"));
    assert_eq!(p.finished_at_ms, Some(T0 + 3));
    let t = task(&tx, "/alice/p/0");
    assert_eq!(t.state, TaskState::Killed.code());
    assert_eq!(t.attempts[0].state, TaskState::Killed);
    assert_eq!(
        t.attempts[0].finished_at_ms, None,
        "w1 must still confirm the kill"
    );
    for id in ["/alice/p/c", "/alice/p/c/g"] {
        let j = job_row(&tx, id);
        assert_eq!(j.state, JobState::Killed.code(), "{id}");
        assert_eq!(j.error.as_deref(), Some("Parent job terminated"), "{id}");
        assert_eq!(
            task_state(&tx, &format!("{id}/0")),
            TaskState::Killed,
            "{id}"
        );
    }
    assert_eq!(job_state(&tx, "/alice/p2"), JobState::Pending);
    assert_eq!(task_state(&tx, "/alice/p2/0"), TaskState::Pending);

    assert!(!kill_subtree(&tx, "/alice/none", "x", "y", T0 + 4).expect("kill unknown"));
}

#[test]
fn complete_job_succeeds_the_job_and_its_tasks_and_ends_its_children() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    let root = job("/alice/done", 2);
    insert(&tx, &root);
    insert(&tx, &child(&root, "helper", 1));
    assert!(assign(&tx, "/alice/done/0", "w1", "a0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));

    assert!(complete_job(&tx, "/alice/done", T0 + 3).expect("complete"));
    let j = job_row(&tx, "/alice/done");
    assert_eq!(j.state, JobState::Succeeded.code());
    assert_eq!(j.finished_at_ms, Some(T0 + 3));
    let t0 = task(&tx, "/alice/done/0");
    assert_eq!(t0.state, TaskState::Succeeded.code());
    assert_eq!(t0.attempts[0].state, TaskState::Succeeded);
    assert_eq!(t0.exit_code, Some(0));
    assert_eq!(task_state(&tx, "/alice/done/1"), TaskState::Succeeded);
    assert_eq!(job_state(&tx, "/alice/done/helper"), JobState::Killed);

    assert!(!complete_job(&tx, "/alice/none", T0 + 4).expect("complete unknown"));
}

#[test]
fn a_terminal_job_ignores_later_events() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    insert(&tx, &job("/alice/fin", 1));
    assert!(assign(&tx, "/alice/fin/0", "w1", "a0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Succeeded,
        Some(0),
        "",
        T0 + 2
    ));
    assert_eq!(job_state(&tx, "/alice/fin"), JobState::Succeeded);

    let kill = JobEvent::Kill {
        reason: "late".into(),
    };
    assert!(!apply_job_event(&tx, "/alice/fin", &kill, T0 + 3).expect("kill"));
    assert!(
        !apply_job_event(&tx, "/alice/fin", &JobEvent::CancelledBeforeHandoff, T0 + 3)
            .expect("cancel")
    );
    assert!(kill_subtree(&tx, "/alice/fin", "late", "late", T0 + 3).expect("kill subtree"));
    let report_fail = TaskEvent::Report {
        state: TaskState::Failed,
        error: "late".into(),
    };
    assert_eq!(
        event(&tx, "/alice/fin/0", report_fail, Finish::Now, T0 + 3),
        None
    );
    assert!(!report(
        &tx,
        "w1",
        "a0",
        TaskState::Failed,
        Some(1),
        "late",
        T0 + 3
    ));
    assert!(!assign(&tx, "/alice/fin/0", "w1", "a1", T0 + 3));

    let j = job_row(&tx, "/alice/fin");
    assert_eq!(j.state, JobState::Succeeded.code());
    assert_eq!(j.error, None);
    assert_eq!(j.finished_at_ms, Some(T0 + 2));
    let t = task(&tx, "/alice/fin/0");
    assert_eq!(t.state, TaskState::Succeeded.code());
    assert_eq!(t.attempts.len(), 1);
}

#[test]
fn federation_verdicts_end_a_queued_job() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    for id in ["/alice/q1", "/alice/q2", "/alice/q3"] {
        let mut j = job(id, 1);
        j.federated = Some(String::new());
        insert(&tx, &j);
        assert!(
            !jobs::has_tasks(&tx, id).expect("has tasks"),
            "the peer runs its tasks"
        );
    }

    assert!(
        apply_job_event(&tx, "/alice/q1", &JobEvent::QueuedDeadlinePassed, T0 + 1)
            .expect("deadline")
    );
    let j = job_row(&tx, "/alice/q1");
    assert_eq!(j.state, JobState::Unschedulable.code());
    assert!(j.error.unwrap_or_default().contains("Scheduling timeout"));
    assert_eq!(j.finished_at_ms, Some(T0 + 1));

    let rejected = JobEvent::HandoffRejected {
        message: "quota exceeded on east".into(),
    };
    assert!(apply_job_event(&tx, "/alice/q2", &rejected, T0 + 2).expect("rejected"));
    let j = job_row(&tx, "/alice/q2");
    assert_eq!(j.state, JobState::Killed.code());
    assert_eq!(j.error.as_deref(), Some("quota exceeded on east"));

    assert!(
        apply_job_event(&tx, "/alice/q3", &JobEvent::CancelledBeforeHandoff, T0 + 3)
            .expect("cancel")
    );
    let j = job_row(&tx, "/alice/q3");
    assert_eq!(j.state, JobState::Killed.code());
    assert_eq!(j.error.as_deref(), Some("Cancelled before handoff"));

    // A verdict arriving after another is dropped.
    assert!(!apply_job_event(&tx, "/alice/q3", &rejected, T0 + 4).expect("late verdict"));
    assert_eq!(
        job_row(&tx, "/alice/q3").error.as_deref(),
        Some("Cancelled before handoff")
    );
    assert!(!apply_job_event(&tx, "/alice/none", &rejected, T0 + 4).expect("unknown job"));
}

#[test]
fn illegal_events_are_dropped_and_counted() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    insert(&tx, &job("/alice/ill", 1));
    assert!(assign(&tx, "/alice/ill/0", "w1", "a0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "a0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));
    let before = illegal_transitions();

    // A running job cannot expire as queued; a running task cannot miss its scheduling deadline.
    assert!(
        !apply_job_event(&tx, "/alice/ill", &JobEvent::QueuedDeadlinePassed, T0 + 3)
            .expect("job event")
    );
    let sched = TaskEvent::SchedulingTimeout;
    assert_eq!(event(&tx, "/alice/ill/0", sched, Finish::Now, T0 + 3), None);

    assert!(
        illegal_transitions() >= before + 2,
        "both illegal events are counted"
    );
    assert_eq!(job_state(&tx, "/alice/ill"), JobState::Running);
    let t = task(&tx, "/alice/ill/0");
    assert_eq!(t.state, TaskState::Running.code());
    assert_eq!(t.error, None);
}

#[test]
fn a_workers_attempts_come_newest_first_each_with_its_task_and_the_index_serves_the_order() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    worker(&tx, "w2");
    let mut j = job("/alice/hist", 1);
    j.cfg.max_retries_failure = 1;
    j.cfg.max_task_failures = 5;
    insert(&tx, &j);
    insert(&tx, &job("/alice/later", 1));

    assert!(assign(&tx, "/alice/hist/0", "w1", "h0", T0 + 1));
    assert!(report(
        &tx,
        "w1",
        "h0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));
    assert!(report(
        &tx,
        "w1",
        "h0",
        TaskState::Failed,
        Some(1),
        "x",
        T0 + 3
    ));
    assert!(assign(&tx, "/alice/hist/0", "w2", "h1", T0 + 4));
    // Ordered by when each was created, started or not.
    assert!(assign(&tx, "/alice/later/0", "w1", "l0", T0 + 10));

    let on_w1 = views::worker_attempts(&tx, "w1", 50).expect("w1 attempts");
    let got: Vec<(&str, &str)> = on_w1
        .iter()
        .map(|(t, a)| (t.as_str(), a.attempt_uid.as_str()))
        .collect();
    assert_eq!(got, [("/alice/later/0", "l0"), ("/alice/hist/0", "h0")]);
    assert_eq!(on_w1[1].1.state, TaskState::Failed);
    assert_eq!(on_w1[1].1.started_at_ms, Some(T0 + 2));
    let on_w2 = views::worker_attempts(&tx, "w2", 50).expect("w2 attempts");
    assert_eq!(on_w2.len(), 1);
    assert_eq!(on_w2[0].1.attempt_id, 1, "the retry is its own entry");
    assert_eq!(
        views::worker_attempts(&tx, "w1", 1).expect("limit").len(),
        1
    );

    let plan: Vec<String> = tx
        .raw()
        .prepare(
            "EXPLAIN QUERY PLAN SELECT task_id FROM task_attempts WHERE worker_id = 'w1'
             ORDER BY created_at_ms DESC LIMIT 50",
        )
        .expect("plan")
        .query_map([], |r| r.get::<_, String>(3))
        .expect("plan rows")
        .collect::<rusqlite::Result<_>>()
        .expect("plan detail");
    let plan = plan.join("; ");
    assert!(plan.contains("idx_attempts_worker_recent"), "{plan}");
    assert!(!plan.contains("TEMP B-TREE"), "no sort: {plan}");
}

#[test]
fn a_task_shows_the_container_its_current_attempt_reported() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    worker(&tx, "w2");
    let mut j = job("/alice/ctr", 1);
    j.cfg.max_retries_failure = 1;
    j.cfg.max_task_failures = 5;
    insert(&tx, &j);
    let seen = |uid: &str, worker: &str, state: TaskState, container: &str, now: i64| {
        let obs = Observation {
            attempt_uid: uid.into(),
            state,
            exit_code: state.is_terminal().then_some(1),
            error: String::new(),
            status_message: String::new(),
            container_id: container.into(),
        };
        apply_observation(&tx, worker, &obs, now).expect("observation")
    };

    assert!(assign(&tx, "/alice/ctr/0", "w1", "c0", T0 + 1));
    assert_eq!(
        task(&tx, "/alice/ctr/0").container_id,
        None,
        "none before a report"
    );
    seen("c0", "w1", TaskState::Running, "local-pg100", T0 + 2);
    assert_eq!(
        task(&tx, "/alice/ctr/0").container_id.as_deref(),
        Some("local-pg100")
    );
    // A report that names no container keeps the one known.
    seen("c0", "w1", TaskState::Running, "", T0 + 3);
    assert_eq!(
        task(&tx, "/alice/ctr/0").container_id.as_deref(),
        Some("local-pg100")
    );
    seen("c0", "w1", TaskState::Failed, "local-pg100", T0 + 4);

    assert!(assign(&tx, "/alice/ctr/0", "w2", "c1", T0 + 5));
    seen("c1", "w2", TaskState::Running, "local-pg200", T0 + 6);
    // The superseded attempt's late report does not take the task's container back.
    seen("c0", "w1", TaskState::Failed, "local-pg100", T0 + 7);
    assert_eq!(
        task(&tx, "/alice/ctr/0").container_id.as_deref(),
        Some("local-pg200")
    );
}

#[test]
fn a_backend_holds_attempts_without_a_worker_row_and_only_it_reports_them() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    insert(&tx, &job("/alice/k", 2));
    let on_backend = Holder::Backend("k8s-h100");
    assert!(super::assign(&tx, "/alice/k/0", on_backend, "uid-k0", 2, T0 + 1).expect("assign"));
    assert!(assign(&tx, "/alice/k/1", "w1", "uid-k1", T0 + 1));
    let t = task(&tx, "/alice/k/0");
    assert_eq!(t.state, TaskState::Assigned.code());
    assert_eq!(t.worker_id, None, "no worker holds a backend's attempt");
    assert_eq!(t.attempts[0].worker_id, None);
    // The backend's open attempts are its own; the worker's are the worker's.
    let on = |rows: Vec<workers::DesiredRow>| -> Vec<String> {
        rows.into_iter().map(|r| r.attempt_uid).collect()
    };
    let backend = workers::open_backend_attempts(&tx, "k8s-h100").expect("backend attempts");
    assert_eq!(on(backend), ["uid-k0"]);
    assert_eq!(
        on(workers::open_attempts(&tx, "w1").expect("w1")),
        ["uid-k1"]
    );
    assert!(workers::open_backend_attempts(&tx, "w1")
        .expect("w1")
        .is_empty());
    // Fencing: a worker cannot report the backend's attempt; the backend can.
    assert!(!report(
        &tx,
        "w1",
        "uid-k0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));
    assert!(report(
        &tx,
        "k8s-h100",
        "uid-k0",
        TaskState::Running,
        None,
        "",
        T0 + 2
    ));
    assert!(report(
        &tx,
        "k8s-h100",
        "uid-k0",
        TaskState::Succeeded,
        Some(0),
        "",
        T0 + 3
    ));
    assert_eq!(task_state(&tx, "/alice/k/0"), TaskState::Succeeded);
    assert!(workers::open_backend_attempts(&tx, "k8s-h100")
        .expect("backend")
        .is_empty());
    // No worker row was ever written for the backend.
    assert_eq!(workers::ids(&tx).expect("ids"), ["w1"]);
}

#[test]
fn the_pseudo_worker_rows_of_earlier_versions_become_backend_attempts() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    // As an earlier version left it: the backend registered as a worker at an inproc address.
    let legacy = workers::Registration {
        worker_id: "k8s-cpu".into(),
        address: "inproc://k8s-cpu".into(),
        ..Default::default()
    };
    workers::upsert(&tx, &legacy, T0).expect("legacy row");
    worker(&tx, "w1");
    insert(&tx, &job("/alice/old", 2));
    assert!(assign_task(
        &tx,
        "/alice/old/0",
        "k8s-cpu",
        "inproc://k8s-cpu",
        "uid-o0",
        2,
        T0
    )
    .expect("assign"));
    assert!(assign(&tx, "/alice/old/1", "w1", "uid-o1", T0));
    let (_, sql) = crate::schema::MIGRATIONS
        .iter()
        .find(|(n, _)| *n == "0008_backends_without_worker_rows")
        .expect("migration");
    tx.raw().execute_batch(sql).expect("migration applies");
    assert_eq!(workers::ids(&tx).expect("ids"), ["w1"]);
    let t = task(&tx, "/alice/old/0");
    assert_eq!((t.worker_id, t.worker_address), (None, None));
    let backend = workers::open_backend_attempts(&tx, "k8s-cpu").expect("backend");
    assert_eq!(backend.len(), 1);
    assert_eq!(backend[0].attempt_uid, "uid-o0");
    // The worker daemon's attempt is untouched.
    assert_eq!(task(&tx, "/alice/old/1").worker_id.as_deref(), Some("w1"));
    assert!(report(
        &tx,
        "k8s-cpu",
        "uid-o0",
        TaskState::Running,
        None,
        "",
        T0 + 1
    ));
}

/// The control tick keeps its pending set from [`crate::changes`] instead of reading every
/// pending task each time. Driven through every kind of write the store makes to tasks
/// (submissions, assignments, reports, retries, worker loss, kills, preemptions, job
/// replacement, pruning, rolled-back transactions), a pending set kept only from the noted
/// rows equals a full read after every commit, and so does the set of attempts holding
/// workers kept from the noted attempt rows; most steps are kept without a full read. Each
/// job's trigger-kept count of failed attempts (migration 0009) equals a count of its attempts
/// after every step.
#[test]
fn pending_and_holding_sets_kept_from_noted_row_changes_equal_a_full_read() {
    use crate::snapshot::{holding_rows, holdings, waiting, waiting_rows};
    use std::collections::{BTreeMap, BTreeSet};
    let mut db = db();
    // A fixed-seed xorshift: the steps are random but the same on every run.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| -> usize {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    {
        let tx = db.begin().expect("tx");
        for w in ["w1", "w2", "w3"] {
            worker(&tx, w);
        }
        tx.commit().expect("commit");
    }
    let mut kept: BTreeMap<i64, String> = BTreeMap::new();
    let mut held: BTreeMap<i64, (String, String, i32, bool)> = BTreeMap::new();
    let holding = |h: crate::snapshot::Holding| (h.task_id, h.worker_id, h.band, h.running);
    let (mut incremental, mut resyncs) = (0, 0);
    let mut jobs: Vec<String> = Vec::new();
    let mut uids: BTreeMap<String, (String, String)> = BTreeMap::new(); // task → (worker, uid)
    for step in 0..600 {
        let now = T0 + step as i64 * 10;
        let tx = db.begin().expect("tx");
        let pending: Vec<String> = waiting(&tx)
            .expect("waiting")
            .into_iter()
            .map(|w| w.task_id)
            .collect();
        let mut commit = true;
        match next(10) {
            0 | 1 => {
                let id = format!("/alice/j{step}");
                let mut j = job(&id, 1 + next(3) as u32);
                j.cfg.max_retries_failure = next(2) as i64;
                j.cfg.max_retries_preemption = 1;
                insert(&tx, &j);
                jobs.push(id);
            }
            2..=4 if !pending.is_empty() => {
                let t = &pending[next(pending.len())];
                let w = format!("w{}", 1 + next(3));
                let uid = format!("u{step}");
                if assign(&tx, t, &w, &uid, now) {
                    uids.insert(t.clone(), (w, uid));
                }
            }
            5 | 6 if !uids.is_empty() => {
                let keys: Vec<&String> = uids.keys().collect();
                let t = keys[next(keys.len())].clone();
                let (w, uid) = uids[&t].clone();
                let (state, code, err) = match next(3) {
                    0 => (TaskState::Running, None, ""),
                    1 => (TaskState::Succeeded, Some(0), ""),
                    _ => (TaskState::Failed, Some(1), "boom"),
                };
                report(&tx, &w, &uid, state, code, err, now);
                if state != TaskState::Running {
                    uids.remove(&t);
                }
            }
            7 => {
                let w = format!("w{}", 1 + next(3));
                fail_worker(&tx, &w, now).expect("fail worker");
                uids.retain(|_, (held, _)| *held != w);
                worker(&tx, &w);
            }
            8 if !jobs.is_empty() => {
                let j = jobs[next(jobs.len())].clone();
                match next(4) {
                    0 => {
                        kill_subtree(&tx, &j, "killed", "killed", now).expect("kill");
                    }
                    1 => {
                        // Replaced: the old job's rows go (cascading to its tasks), new ones come.
                        delete_job(&tx, &j).expect("delete job");
                        insert(&tx, &job(&j, 2));
                    }
                    2 => {
                        crate::prune::delete_trees(&tx, std::slice::from_ref(&j)).expect("prune");
                        jobs.retain(|x| *x != j);
                    }
                    _ => {
                        if let Some(t) = pending.first() {
                            event(&tx, t, TaskEvent::SchedulingTimeout, Finish::Now, now);
                        }
                    }
                }
                uids.retain(|t, _| !t.starts_with(&format!("{j}/")));
            }
            _ => {
                // Written and rolled back: noted for nothing, never missed.
                insert(&tx, &job(&format!("/alice/rolled{step}"), 2));
                commit = false;
            }
        }
        let drifted: i64 = tx
            .raw()
            .query_row(
                "SELECT count(*) FROM jobs j WHERE j.failed_attempts <> (
                    SELECT count(*) FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
                     WHERE t.job_id = j.job_id AND a.state = ?1)",
                [TaskState::Failed.code()],
                |r| r.get(0),
            )
            .expect("failed-attempt counts");
        assert_eq!(
            drifted, 0,
            "step {step}: a job's failed-attempt count drifted"
        );
        if commit {
            tx.commit().expect("commit");
        } else {
            drop(tx);
        }
        let taken = db.task_changes().take();
        let read = db.begin_read().expect("read");
        if taken.resync {
            resyncs += 1;
            kept = waiting(&read)
                .expect("waiting")
                .into_iter()
                .map(|w| (w.row, w.task_id))
                .collect();
            held = holdings(&read)
                .expect("holdings")
                .into_iter()
                .map(|h| (h.row, holding(h)))
                .collect();
        } else {
            incremental += 1;
            for (row, w) in waiting_rows(&read, &taken.tasks).expect("rows") {
                match w {
                    Some(w) => kept.insert(row, w.task_id),
                    None => kept.remove(&row),
                };
            }
            for (row, h) in holding_rows(&read, &taken.attempts).expect("rows") {
                match h {
                    Some(h) => held.insert(row, holding(h)),
                    None => held.remove(&row),
                };
            }
        }
        let full_held: BTreeMap<i64, _> = holdings(&read)
            .expect("holdings")
            .into_iter()
            .map(|h| (h.row, holding(h)))
            .collect();
        assert_eq!(held, full_held, "step {step}: the kept holdings drifted");
        let full: BTreeSet<String> = waiting(&read)
            .expect("waiting")
            .into_iter()
            .map(|w| w.task_id)
            .collect();
        let mine: BTreeSet<String> = kept.values().cloned().collect();
        assert_eq!(mine, full, "step {step}: the kept pending set drifted");
    }
    assert!(
        incremental > 500 && resyncs < 60,
        "{incremental} steps kept incrementally, {resyncs} full reads"
    );
}

/// Migration 0010 dropped the insert trigger on `jobs`: `insert_job` logs a new job below a
/// root received from a hub for that hub itself, and nothing for any other job.
#[test]
fn a_received_jobs_new_child_goes_into_its_hubs_change_log() {
    use crate::federation as sf;
    let mut db = db();
    let tx = db.begin().expect("tx");
    let received = job("/alice/received", 1);
    let local = job("/alice/local", 1);
    insert(&tx, &received);
    insert(&tx, &local);
    sf::insert_handle(
        &tx,
        "/alice/received",
        sf::RECEIVED,
        "hub",
        "alice",
        sf::HANDED_OFF,
        "n",
    )
    .expect("handle");
    let cursor = sf::changes_since(&tx, "hub", "").expect("log").max_seq;
    insert(&tx, &child(&received, "eval", 2));
    insert(&tx, &child(&local, "eval", 2));
    let grandchild = child(&child(&received, "eval", 0), "inner", 1);
    insert(&tx, &grandchild);
    let changed = sf::changes_since(&tx, "hub", &cursor.to_string()).expect("log");
    let ids: Vec<&str> = changed.jobs.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["/alice/received/eval", "/alice/received/eval/inner"]);
    assert!(changed.jobs.iter().all(|(_, tasks)| tasks == &Some(None)));
}

/// Migration 0015: the change log's triggers exist only where a job was received from a hub, so
/// a cluster no hub uses runs no trigger on its updates; receiving a job creates them, and a DB
/// holding a received job gets them back when opened.
#[test]
fn the_change_log_triggers_exist_only_once_a_job_was_received() {
    use crate::federation as sf;
    fn triggers(tx: &Tx<'_>) -> i64 {
        tx.raw()
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'federation_log_%'",
                [],
                |r| r.get(0),
            )
            .expect("triggers")
    }
    fn touch(tx: &Tx<'_>, task: &str) {
        tx.raw()
            .execute(
                "UPDATE tasks SET status_message = 'touched' WHERE task_id = ?1",
                [task],
            )
            .expect("update");
    }
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("controller.sqlite3");
    let mut db = crate::Db::open(&path).expect("open");
    let tx = db.begin().expect("tx");
    insert(&tx, &job("/alice/local", 1));
    insert(&tx, &job("/alice/received", 1));
    assert_eq!(triggers(&tx), 0, "no job received: no trigger");
    touch(&tx, "/alice/local/0");
    let before = sf::changes_since(&tx, "hub", "").expect("log");
    assert!(before.jobs.is_empty());
    sf::insert_handle(
        &tx,
        "/alice/received",
        sf::RECEIVED,
        "hub",
        "alice",
        sf::HANDED_OFF,
        "n",
    )
    .expect("handle");
    assert_eq!(triggers(&tx), 4);
    touch(&tx, "/alice/received/0");
    touch(&tx, "/alice/local/0");
    let logged = sf::changes_since(&tx, "hub", "").expect("log");
    let ids: Vec<&str> = logged.jobs.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["/alice/received"]);
    // As an older DB comes out of migration 0015: a received job, and its triggers dropped.
    tx.raw()
        .execute_batch(
            "DROP TRIGGER federation_log_job_update; DROP TRIGGER federation_log_job_delete;
             DROP TRIGGER federation_log_task_update; DROP TRIGGER federation_log_attempt_change;",
        )
        .expect("drop");
    tx.commit().expect("commit");
    drop(db);
    let mut db = crate::Db::open(&path).expect("reopen");
    let tx = db.begin().expect("tx");
    assert_eq!(
        triggers(&tx),
        4,
        "reopened with a received job: its triggers are back"
    );
}

fn insertion(tx: &Tx<'_>, task: &str) -> i64 {
    tx.raw()
        .query_row(
            "SELECT priority_insertion FROM tasks WHERE task_id = ?1",
            [task],
            |r| r.get(0),
        )
        .expect("task")
}

/// Task insertion numbers are handed out from memory within a transaction and written to
/// `meta` once at its commit: they rise across jobs and transactions, never repeat, and a
/// rolled-back transaction's numbers are not seen again.
#[test]
fn task_insertion_numbers_rise_across_jobs_and_commits_and_never_repeat() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    insert(&tx, &job("/alice/a", 3));
    insert(&tx, &job("/alice/b", 2));
    tx.commit().expect("commit");
    let tx = db.begin().expect("tx");
    insert(&tx, &job("/alice/rolled-back", 4));
    drop(tx);
    let tx = db.begin().expect("tx");
    insert(&tx, &job("/alice/c", 1));
    let order: Vec<i64> = [
        "/alice/a/0",
        "/alice/a/1",
        "/alice/a/2",
        "/alice/b/0",
        "/alice/b/1",
        "/alice/c/0",
    ]
    .iter()
    .map(|t| insertion(&tx, t))
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    tx.commit().expect("commit");
    let tx = db.begin().expect("tx");
    insert(&tx, &job("/alice/d", 1));
    assert!(insertion(&tx, "/alice/d/0") > order[5]);
}

/// `Tx::attempt` runs a step without a savepoint and says whether a failure left writes
/// behind: a step that fails before writing, or whose failing statement SQLite undid itself
/// (a duplicate job id), is refused and the transaction goes on; one that fails after a
/// write is dirty.
#[test]
fn attempt_tells_a_refusal_from_a_failure_after_writing() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    let done = tx.attempt(|tx| insert_job(tx, &job("/alice/a", 2), T0));
    assert!(matches!(done, crate::Attempt::Done(_)));
    let refused = tx.attempt(|tx| {
        jobs::job_state_of(tx, "/alice/a")?;
        Err::<(), _>(crate::Error::Invalid("checked, then refused".into()))
    });
    assert!(matches!(refused, crate::Attempt::Refused(_)));
    let duplicate = tx.attempt(|tx| insert_job(tx, &job("/alice/a", 1), T0));
    assert!(matches!(duplicate, crate::Attempt::Refused(_)));
    let dirty = tx.attempt(|tx| {
        insert_job(tx, &job("/alice/b", 1), T0)?;
        Err::<(), _>(crate::Error::Invalid("failed after writing".into()))
    });
    assert!(matches!(dirty, crate::Attempt::Dirty(_)));
    drop(tx);
    let tx = db.begin().expect("tx");
    assert!(jobs::job_state_of(&tx, "/alice/a").expect("read").is_none());
}

/// "No statement journal" (`apply`): the transitions' updates cannot stop halfway on a
/// constraint and call no function, and no trigger on the rows they write calls one.
#[test]
fn a_transition_writes_no_statement_journal() {
    let mut db = db();
    let tx = db.begin().expect("begin");
    // With the change log's triggers, as on a cluster that received a job from a hub (migration
    // 0015): the most triggers these updates ever run under.
    tx.raw()
        .execute_batch(crate::schema::CHANGE_LOG_TRIGGERS)
        .expect("triggers");
    // SQLite's conflict rules, as EXPLAIN shows them in a constraint check's P2.
    const OE_ABORT: i64 = 2;
    for stmt in [
        task::SAVE_TASK_STATE,
        task::SAVE_ATTEMPT_STATE,
        job::SAVE_JOB_STATE,
    ] {
        let mut explain = tx
            .raw()
            .prepare(&format!("EXPLAIN {stmt}"))
            .expect("explain");
        let unbound = std::iter::repeat_n(rusqlite::types::Null, explain.parameter_count());
        let program: Vec<(String, i64)> = explain
            .query_map(rusqlite::params_from_iter(unbound), |r| {
                Ok((r.get::<_, String>(1)?, r.get::<_, i64>(3)?))
            })
            .expect("program")
            .collect::<rusqlite::Result<_>>()
            .expect("opcodes");
        assert!(
            program.iter().any(|(op, _)| op == "Program"),
            "a trigger fires on {stmt}: otherwise this test checks nothing"
        );
        for (op, p2) in &program {
            assert!(
                !(op.starts_with("Halt") && *p2 == OE_ABORT),
                "{stmt} may abort halfway ({op}): it must say OR FAIL"
            );
            assert!(!op.contains("Func"), "{stmt} calls a function ({op})");
        }
    }
    let triggers = crate::schema_triggers(tx.raw());
    // Words that may stand before a parenthesis without calling a function.
    const NOT_CALLS: [&str; 16] = [
        "EXISTS", "IN", "INTO", "VALUES", "AND", "OR", "NOT", "WHEN", "THEN", "ELSE", "WHERE",
        "ON", "SELECT", "IS", "BEGIN", "CASE",
    ];
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut checked = 0;
    for (name, table, sql) in triggers {
        if !["jobs", "tasks", "task_attempts"].contains(&table.as_str()) {
            continue;
        }
        checked += 1;
        let sql = sql.to_uppercase();
        for (at, _) in sql.match_indices('(') {
            // The word right before the parenthesis (spaces between allowed), and the one before
            // that: `INTO t(...)` names columns.
            let before = sql[..at].trim_end();
            let word_start = before.rfind(|c: char| !is_word(c)).map_or(0, |i| i + 1);
            let word = &before[word_start..];
            if word.is_empty() || NOT_CALLS.contains(&word) {
                continue;
            }
            let previous = before[..word_start].trim_end();
            let previous = &previous[previous.rfind(|c: char| !is_word(c)).map_or(0, |i| i + 1)..];
            assert!(
                previous == "INTO",
                "trigger {name} on {table} calls {word}(): a function call in a trigger puts every write to {table} under a statement journal"
            );
        }
    }
    assert!(
        checked >= 4,
        "the change-log and count triggers are there to check"
    );
}

/// What one step of [`a_rollup_that_skips_a_running_job_never_hides_its_verdict`] does to task
/// `task` of job `job`.
#[derive(Clone, Copy, Debug)]
enum Op {
    Assign,
    Report(TaskState),
    /// Ends the batch (its rollups) before the next step.
    Commit,
}

fn op() -> impl proptest::strategy::Strategy<Value = (usize, usize, Op)> {
    use proptest::prelude::*;
    let op = prop_oneof![
        3 => Just(Op::Assign),
        3 => Just(Op::Report(TaskState::Running)),
        3 => Just(Op::Report(TaskState::Succeeded)),
        2 => Just(Op::Report(TaskState::Failed)),
        1 => Just(Op::Report(TaskState::Preempted)),
        1 => Just(Op::Report(TaskState::WorkerFailed)),
        2 => Just(Op::Commit),
    ];
    (0..3usize, 0..3usize, op)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

    /// `JobRollups` skips reading the tasks of a started RUNNING job when no step of the batch
    /// can move it (`Step::can_move_a_running_job`), or when its strongest steps are successes
    /// and one of its tasks is unfinished (`RunningJobMove::OnceNoTaskIsLeft`). Whatever the mix of assignments, reports,
    /// retries, losses and batch ends over three jobs (one a gang) with different failure
    /// allowances and retry budgets, each job's stored state after every batch is the one a
    /// full recomputation gives.
    #[test]
    fn a_rollup_that_skips_a_running_job_never_hides_its_verdict(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        let mut db = db();
        let tx = db.begin().expect("tx");
        worker(&tx, "w1");
        let jobs = ["/alice/p0", "/alice/p1", "/alice/p2"];
        for (i, id) in jobs.iter().enumerate() {
            let mut j = job(id, 3);
            j.cfg.max_task_failures = i as i64;
            j.cfg.max_retries_failure = 1;
            j.cfg.max_retries_preemption = 1;
            j.cfg.coscheduling_group_by = (i == 2).then(|| "pool".to_string());
            insert(&tx, &j);
        }
        let mut uids: std::collections::HashMap<(usize, usize), String> = Default::default();
        let mut rollups = JobRollups::default();
        let mut now = T0;
        let check = |tx: &Tx<'_>, now: i64| {
            for id in jobs {
                let stored = job_state(tx, id);
                tx.tx.execute_batch("SAVEPOINT full").expect("savepoint");
                super::job::recompute_job(&tx.tx, id, iris_types::RunningJobMove::May, now).expect("recompute");
                let full = job_state(tx, id);
                tx.tx.execute_batch("ROLLBACK TO full; RELEASE full").expect("rollback");
                assert_eq!(stored, full, "{id} after a batch");
            }
        };
        for (n, (j, t, op)) in ops.into_iter().enumerate() {
            now += 1;
            let task_id = format!("{}/{t}", jobs[j]);
            match op {
                Op::Assign => {
                    let uid = format!("u{n}");
                    let holder = Holder::Worker { id: "w1", address: "127.0.0.1:1" };
                    if assign_deferred(&tx, &task_id, holder, &uid, 2, now, &mut rollups)
                        .expect("assign")
                    {
                        uids.insert((j, t), uid);
                    }
                }
                Op::Report(state) => {
                    if let Some(uid) = uids.get(&(j, t)) {
                        let exit = (state == TaskState::Failed).then_some(1);
                        report_deferred(&tx, uid, state, exit, now, &mut rollups);
                    }
                }
                Op::Commit => {
                    std::mem::take(&mut rollups).finish(&tx, now).expect("rollup");
                    check(&tx, now);
                }
            }
        }
        rollups.finish(&tx, now).expect("rollup");
        check(&tx, now);
    }
}

/// `jobs::task_state_rollup` (`iris.task_state`): each root job with live tasks, its children's
/// tasks counted under it, with the oldest pending task's age (since its submit, or since its
/// last attempt ended when it ran before) and the oldest assigned-or-building attempt's.
#[test]
fn the_task_state_rollup_counts_each_root_with_its_children_and_the_oldest_waits() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    let root = job("/alice/r", 3);
    insert(&tx, &root);
    insert(&tx, &child(&root, "c", 2));
    let mut retried = job("/bob/s", 1);
    retried.cfg.max_retries_preemption = 1;
    insert(&tx, &retried);
    insert(&tx, &job("/carol/done", 1));
    let run = |task: &str, uid: &str, states: &[(TaskState, i64)]| {
        for (state, at) in states {
            assert!(
                report(&tx, "w1", uid, *state, None, "", *at),
                "{task} {state}"
            );
        }
    };
    // /alice/r: 0 assigned at +1, 1 building (assigned at +2), 2 never ran.
    assert!(assign(&tx, "/alice/r/0", "w1", "a", T0 + 1));
    assert!(assign(&tx, "/alice/r/1", "w1", "b", T0 + 2));
    run("/alice/r/1", "b", &[(TaskState::Building, T0 + 3)]);
    // Its child: one running, one done.
    assert!(assign(&tx, "/alice/r/c/0", "w1", "c", T0 + 4));
    run("/alice/r/c/0", "c", &[(TaskState::Running, T0 + 5)]);
    assert!(assign(&tx, "/alice/r/c/1", "w1", "d", T0 + 4));
    run(
        "/alice/r/c/1",
        "d",
        &[(TaskState::Running, T0 + 5), (TaskState::Succeeded, T0 + 6)],
    );
    // /bob/s: ran, lost its worker at +7, pending again since then.
    assert!(assign(&tx, "/bob/s/0", "w1", "e", T0 + 1));
    run(
        "/bob/s/0",
        "e",
        &[
            (TaskState::Running, T0 + 2),
            (TaskState::WorkerFailed, T0 + 7),
        ],
    );
    assert_eq!(task_state(&tx, "/bob/s/0"), TaskState::Pending);
    // /carol/done: finished, so not listed.
    assert!(assign(&tx, "/carol/done/0", "w1", "f", T0 + 1));
    run("/carol/done/0", "f", &[(TaskState::Succeeded, T0 + 2)]);

    let rollup = jobs::task_state_rollup(&tx).expect("rollup");
    let want = |root: &str, counts: [i64; 4], pending: Option<i64>, building: Option<i64>| {
        jobs::TaskStateRollup {
            root_job_id: root.into(),
            pending: counts[0],
            assigned: counts[1],
            building: counts[2],
            running: counts[3],
            oldest_pending_since_ms: pending,
            oldest_building_since_ms: building,
        }
    };
    assert_eq!(
        rollup,
        vec![
            want("/alice/r", [1, 1, 1, 1], Some(T0), Some(T0 + 1)),
            want("/bob/s", [1, 0, 0, 0], Some(T0 + 7), None),
        ]
    );
}

/// A worker's status text (what a task waits for) is kept while it is reported, replaced by a
/// new one, and cleared once the task runs; a report without one keeps it until then.
#[test]
fn a_status_message_is_kept_replaced_and_cleared_when_the_task_runs() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    worker(&tx, "w1");
    insert(&tx, &job("/alice/st", 1));
    assert!(assign(&tx, "/alice/st/0", "w1", "s0", T0 + 1));
    let seen = |state: TaskState, status: &str, now: i64| {
        let obs = Observation {
            attempt_uid: "s0".into(),
            state,
            exit_code: None,
            error: String::new(),
            status_message: status.into(),
            container_id: String::new(),
        };
        apply_observation(&tx, "w1", &obs, now).expect("observation");
        task(&tx, "/alice/st/0").status_message
    };
    assert_eq!(
        seen(TaskState::Building, "pulling image", T0 + 2).as_deref(),
        Some("pulling image")
    );
    assert_eq!(
        seen(TaskState::Building, "pulling image", T0 + 3).as_deref(),
        Some("pulling image")
    );
    assert_eq!(
        seen(TaskState::Building, "", T0 + 4).as_deref(),
        Some("pulling image")
    );
    assert_eq!(
        seen(TaskState::Building, "syncing deps", T0 + 5).as_deref(),
        Some("syncing deps")
    );
    assert_eq!(seen(TaskState::Running, "", T0 + 6), None);
}

/// The desired set's read decides "run" from the partial index of active tasks: its SQL list of
/// states must be exactly `TaskState::is_active`, and only the task's current attempt runs.
#[test]
fn a_worker_s_desired_set_runs_only_the_current_attempt_of_an_active_task() {
    let mut db = db();
    let tx = db.begin().expect("tx");
    insert(&tx, &job("/alice/d", 2));
    worker(&tx, "w1");
    assert!(assign(&tx, "/alice/d/0", "w1", "a0", T0 + 1));
    assert!(assign(&tx, "/alice/d/1", "w1", "a1", T0 + 2));
    let runs = |tx: &Tx<'_>| -> Vec<(String, bool)> {
        workers::open_attempts(tx, "w1")
            .expect("open attempts")
            .into_iter()
            .map(|r| (r.attempt_uid, r.current_of_active_task))
            .collect()
    };
    assert_eq!(
        runs(&tx),
        vec![("a0".to_string(), true), ("a1".to_string(), true)],
        "both assigned attempts run, oldest first"
    );
    for &state in TaskState::ALL {
        tx.raw()
            .execute(
                "UPDATE tasks SET state = ?1 WHERE task_id = '/alice/d/0'",
                [state.code()],
            )
            .expect("set state");
        assert_eq!(
            runs(&tx)[0],
            ("a0".to_string(), state.is_active()),
            "a task {state} runs its attempt only if active"
        );
    }
    // A newer attempt of the task: the open older one stops.
    tx.raw()
        .execute(
            "UPDATE tasks SET state = ?1, current_attempt_id = current_attempt_id + 1 WHERE task_id = '/alice/d/1'",
            [TaskState::Assigned.code()],
        )
        .expect("supersede");
    assert_eq!(runs(&tx)[1], ("a1".to_string(), false));
    tx.commit().expect("commit");
}
