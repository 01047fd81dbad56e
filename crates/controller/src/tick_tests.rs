//! The control tick against a real controller: placements, execution timeouts, scheduling
//! deadlines and budget demotion.

use super::tick;
use crate::testutil::{
    controller, insert_job_at, job_row, job_state, launch, register, request, task, task_state, GIB,
};
use iris_proto::time::Duration as PDuration;
use iris_store::{apply, budgets, snapshot};
use iris_types::{Band, JobState, TaskState};
use std::collections::BTreeMap;

fn bands(ctl: &crate::Controller) -> BTreeMap<String, i32> {
    snapshot::holdings(&*ctl.db())
        .expect("holdings")
        .into_iter()
        .map(|h| (h.task_id, h.band))
        .collect()
}

#[tokio::test]
async fn tick_places_what_fits_and_leaves_the_rest_pending_with_a_reason() {
    let ctl = controller();
    register(&ctl, "w1", 4, 16 * GIB);
    launch(&ctl, request("/alice/small", 2, 1000)).await;
    launch(&ctl, request("/alice/big", 1, 4000)).await;

    let touched = tick(&ctl).expect("tick");
    assert_eq!(touched.into_iter().collect::<Vec<_>>(), vec!["w1"]);
    for t in ["/alice/small/0", "/alice/small/1"] {
        let row = task(&ctl, t);
        assert_eq!(row.state, TaskState::Assigned.code(), "{t}");
        assert_eq!(row.worker_id.as_deref(), Some("w1"), "{t}");
        assert_eq!(row.attempts.len(), 1, "{t}");
        assert_eq!(row.attempts[0].attempt_uid.len(), 20, "{t}");
    }
    // 2 of 4 cores are taken: the 4-core task waits, and says why.
    assert_eq!(task_state(&ctl, "/alice/big/0"), TaskState::Pending);
    assert!(crate::lock(&ctl.pending_reasons)
        .get("/alice/big/0")
        .is_some());
    assert_eq!(job_state(&ctl, "/alice/small"), JobState::Running);

    // Nothing changed: the next tick places nothing and touches no worker.
    assert!(tick(&ctl).expect("second tick").is_empty());
    assert_eq!(task(&ctl, "/alice/small/0").attempts.len(), 1);
}

#[tokio::test]
async fn tasks_the_per_job_cap_holds_back_say_so_through_the_read_views() {
    let ctl = controller();
    register(&ctl, "w1", 4, 16 * GIB);
    launch(&ctl, request("/alice/wide", 6, 4000)).await;
    launch(&ctl, request("/alice/more", 6, 4000)).await;
    tick(&ctl).expect("tick");
    let reasons = crate::lock(&ctl.pending_reasons).clone();
    // One job's first task took the worker; every other task waits and says why.
    let conn = ctl.db();
    for job in ["/alice/wide", "/alice/more"] {
        for t in crate::views::tasks_of_job(&*conn, job, &reasons).expect("tasks") {
            if t.state == Some(TaskState::Pending.code()) {
                assert!(!t.pending_reason().is_empty(), "{}", t.task_id());
            }
        }
    }
    let held_back = crate::views::task(&*conn, "/alice/more/5", &reasons)
        .expect("read")
        .expect("task");
    assert!(
        held_back
            .pending_reason()
            .starts_with("Per-job cycle cap reached"),
        "{}",
        held_back.pending_reason()
    );
    // One reason per capped job, not per held-back task.
    assert!(reasons.by_task.len() <= 8, "{:?}", reasons.by_task.keys());
    assert_eq!(reasons.capped_jobs.len(), 2);
}

#[tokio::test]
async fn a_task_past_its_execution_timeout_fails_its_job() {
    let ctl = controller();
    register(&ctl, "w1", 4, 16 * GIB);
    let mut req = request("/alice/slow", 1, 1000);
    req.timeout = Some(PDuration { milliseconds: 1000 });
    launch(&ctl, req).await;
    launch(&ctl, request("/alice/open-ended", 1, 1000)).await;
    tick(&ctl).expect("placing tick");

    // Both started a minute ago; only one has a 1 s execution timeout.
    let started = iris_store::now_ms() - 60_000;
    for t in ["/alice/slow/0", "/alice/open-ended/0"] {
        report_at(&ctl, "w1", t, 0, TaskState::Running, started);
    }

    let touched = tick(&ctl).expect("timeout tick");
    assert!(touched.contains("w1"), "the worker must learn to stop it");
    let t = task(&ctl, "/alice/slow/0");
    assert_eq!(t.state, TaskState::Failed.code());
    assert_eq!(t.error.as_deref(), Some("Execution timeout exceeded"));
    assert_eq!(t.attempts[0].state, TaskState::Failed);
    assert_eq!(
        t.attempts[0].finished_at_ms, None,
        "the attempt holds w1 until the worker confirms it stopped"
    );
    assert_eq!(job_state(&ctl, "/alice/slow"), JobState::Failed);
    assert_eq!(task_state(&ctl, "/alice/open-ended/0"), TaskState::Running);
}

#[tokio::test]
async fn a_pending_task_past_its_scheduling_deadline_becomes_unschedulable() {
    let ctl = controller();
    // No worker: nothing can be placed. One job has a 1 s scheduling timeout and was submitted
    // a minute ago; the other has no deadline.
    let long_ago = iris_store::now_ms() - 60_000;
    let mut req = request("/alice/deadline", 2, 1000);
    req.scheduling_timeout = Some(PDuration { milliseconds: 1000 });
    insert_job_at(&ctl, &req, long_ago, None);
    insert_job_at(&ctl, &request("/alice/patient", 1, 1000), long_ago, None);

    tick(&ctl).expect("tick");
    // The first task to time out makes the job UNSCHEDULABLE, which finalizes the rest.
    for (t, state) in [
        ("/alice/deadline/0", TaskState::Unschedulable),
        ("/alice/deadline/1", TaskState::Killed),
    ] {
        let row = task(&ctl, t);
        assert_eq!(row.state, state.code(), "{t}");
        assert_eq!(
            row.error.as_deref(),
            Some("Scheduling timeout exceeded"),
            "{t}"
        );
    }
    let j = job_row(&ctl, "/alice/deadline");
    assert_eq!(j.state, JobState::Unschedulable.code());
    assert_eq!(j.error.as_deref(), Some("Scheduling timeout exceeded"));
    assert_eq!(task_state(&ctl, "/alice/patient/0"), TaskState::Pending);
}

#[tokio::test]
async fn an_over_budget_users_work_is_placed_as_batch() {
    let ctl = controller();
    register(&ctl, "w1", 32, 64 * GIB);
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        let b = budgets::Budget {
            user_id: "alice".into(),
            limit: 10,
            max_band: Band::Interactive.code(),
        };
        budgets::set(&tx, &b, iris_store::now_ms()).expect("set budget");
        tx.commit().expect("commit");
    }
    // 4 cores + 1 GiB is worth 21 > 10 once it holds a worker.
    launch(&ctl, request("/alice/first", 1, 4000)).await;
    tick(&ctl).expect("first tick");
    assert_eq!(
        bands(&ctl).get("/alice/first/0"),
        Some(&Band::Interactive.code()),
        "within budget when it was placed"
    );

    launch(&ctl, request("/alice/second", 1, 1000)).await;
    launch(&ctl, request("/bob/third", 1, 1000)).await;
    tick(&ctl).expect("second tick");
    let b = bands(&ctl);
    assert_eq!(b.get("/alice/second/0"), Some(&Band::Batch.code()));
    assert_eq!(b.get("/bob/third/0"), Some(&Band::Interactive.code()));
}

fn kept_pending(
    ctl: &crate::Controller,
) -> (
    std::collections::BTreeSet<String>,
    crate::pending::Refreshed,
) {
    let kept = crate::lock(&ctl.kept);
    let tasks = kept
        .pending
        .tasks()
        .iter()
        .map(|t| t.task.clone())
        .collect();
    (tasks, kept.last())
}

fn pending_read_in_full(ctl: &crate::Controller) -> std::collections::BTreeSet<String> {
    snapshot::waiting(&*ctl.db())
        .expect("waiting")
        .into_iter()
        .map(|w| w.task_id)
        .collect()
}

#[tokio::test]
async fn the_tick_rereads_only_the_task_rows_written_since_the_last_tick() {
    let ctl = controller();
    register(&ctl, "w1", 2, 16 * GIB);
    launch(&ctl, request("/alice/a", 3, 1000)).await;
    tick(&ctl).expect("first tick");
    let (kept, how) = kept_pending(&ctl);
    assert!(how.full, "the first tick reads every pending task");
    // The set is as the tick read it, before it placed 2 of the 3 on w1's 2 cores.
    assert_eq!(kept.len(), 3);
    assert_eq!(pending_read_in_full(&ctl).len(), 1);

    // New tasks and the rows the last tick assigned are all the next tick reads (w1 is full:
    // it places nothing, so the set stays equal to the store's).
    launch(&ctl, request("/alice/b", 2, 1000)).await;
    tick(&ctl).expect("second tick");
    let (kept, how) = kept_pending(&ctl);
    assert!(!how.full);
    assert_eq!(how.rows, 4, "b's 2 new rows and a's 2 assigned rows");
    assert_eq!(kept, pending_read_in_full(&ctl));
    assert_eq!(kept.len(), 3);

    // A kill ends pending tasks in the store: they leave the set without a full read.
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        apply::kill_subtree(&tx, "/alice/b", "killed", "killed", iris_store::now_ms())
            .expect("kill");
        tx.commit().expect("commit");
    }
    tick(&ctl).expect("third tick");
    let (kept, how) = kept_pending(&ctl);
    assert!(!how.full);
    assert_eq!(kept, pending_read_in_full(&ctl));
    assert_eq!(kept.into_iter().collect::<Vec<_>>(), vec!["/alice/a/2"]);

    // Nothing written: nothing re-read.
    tick(&ctl).expect("fourth tick");
    assert_eq!(kept_pending(&ctl).1.rows, 0);
}

/// Applies `state` to `task`'s attempt `n` as worker `worker` reports it now.
fn report(ctl: &crate::Controller, worker: &str, task_id: &str, n: usize, state: TaskState) {
    report_at(ctl, worker, task_id, n, state, iris_store::now_ms());
}

/// [`report`] as of `at_ms`.
fn report_at(
    ctl: &crate::Controller,
    worker: &str,
    task_id: &str,
    n: usize,
    state: TaskState,
    at_ms: i64,
) {
    let uid = task(ctl, task_id).attempts[n].attempt_uid.clone();
    let mut conn = ctl.db();
    let tx = conn.begin().expect("tx");
    let obs = apply::Observation {
        attempt_uid: uid,
        state,
        exit_code: None,
        error: String::new(),
        status_message: String::new(),
        container_id: String::new(),
    };
    assert!(apply::apply_observation(&tx, worker, &obs, at_ms).expect("observe"));
    tx.commit().expect("commit");
}

/// The scheduler's running set, as (task, worker) pairs.
fn cluster_running(ctl: &crate::Controller) -> Vec<(String, String)> {
    crate::lock(&ctl.cluster)
        .running()
        .map(|rt| (rt.task.clone(), rt.worker.clone()))
        .collect()
}

#[tokio::test]
async fn the_clusters_running_set_follows_the_changed_holdings_alone() {
    let ctl = controller();
    register(&ctl, "w1", 2, 16 * GIB);
    let mut a = request("/alice/a", 2, 1000);
    a.max_retries_preemption = Some(1);
    launch(&ctl, a).await;
    tick(&ctl).expect("placing tick");
    assert_eq!(
        crate::lock(&ctl.kept).holdings.unsynced(),
        crate::pending::Unsynced::Tasks(Vec::new()),
        "the first tick told the cluster everything"
    );
    for t in ["/alice/a/0", "/alice/a/1"] {
        report(&ctl, "w1", t, 0, TaskState::Running);
    }
    // a/0 is preempted: its attempt holds w1 until the worker confirms it stopped, and the task
    // is placed again on the new worker w2, so for a while it holds two workers.
    register(&ctl, "w2", 2, 16 * GIB);
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        apply::apply_task_event(
            &tx,
            "/alice/a/0",
            &iris_types::TaskEvent::Preempt {
                by: "/bob/b/0".into(),
            },
            None,
            apply::Finish::AwaitWorker,
            iris_store::now_ms(),
            "test",
        )
        .expect("preempt");
        tx.commit().expect("commit");
    }
    assert_eq!(task_state(&ctl, "/alice/a/0"), TaskState::Pending);
    tick(&ctl).expect("tick placing a/0 again");
    assert_eq!(task(&ctl, "/alice/a/0").worker_id.as_deref(), Some("w2"));
    // The cluster hears of a tick's own assignments at the next tick. (A task that fits nowhere
    // keeps the ticks planning.)
    launch(&ctl, request("/alice/c", 1, 2000)).await;
    tick(&ctl).expect("tick after the placement");
    assert_eq!(
        crate::lock(&ctl.kept).holdings.unsynced(),
        crate::pending::Unsynced::Tasks(Vec::new())
    );
    let both = vec![
        ("/alice/a/0".to_string(), "w1".to_string()),
        ("/alice/a/0".to_string(), "w2".to_string()),
        ("/alice/a/1".to_string(), "w1".to_string()),
    ];
    assert_eq!(cluster_running(&ctl), both);

    // The stopped attempt lets go of w1; a/0's new attempt keeps w2. The tick tells the cluster
    // of a/0 alone (debug builds also check the whole set against a full read every tick).
    report(&ctl, "w1", "/alice/a/0", 0, TaskState::Killed);
    assert_eq!(
        crate::lock(&ctl.kept).holdings.unsynced(),
        crate::pending::Unsynced::Tasks(Vec::new()),
        "nothing is noted before the next refresh"
    );
    tick(&ctl).expect("tick after the stop");
    assert_eq!(task_state(&ctl, "/alice/c/0"), TaskState::Pending);
    assert_eq!(cluster_running(&ctl), both[1..].to_vec());
}

#[test]
fn the_pause_after_a_tick_follows_its_reading_and_planning_within_bounds() {
    use super::pause_after;
    use std::time::Duration;
    let ms = Duration::from_millis;
    assert_eq!(pause_after(Duration::ZERO, Duration::ZERO), ms(2));
    // Reading and planning take at most a quarter of the cycle, writing included.
    assert_eq!(pause_after(ms(40), Duration::ZERO), ms(120));
    assert_eq!(pause_after(ms(40), ms(100)), ms(20));
    assert_eq!(pause_after(ms(40), ms(900)), ms(2));
    assert_eq!(
        pause_after(Duration::from_secs(2), ms(500)),
        Duration::from_secs(3)
    );
}

/// Times the tick took the writer connection (`iris_writer_turns_total{by="tick"}`).
fn tick_turns(ctl: &crate::Controller) -> u64 {
    let text = ctl.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix("iris_writer_turns_total{by=\"tick\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn gang(name: &str, replicas: i32) -> iris_proto::cluster::controller::LaunchJobRequest {
    let mut r = request(name, replicas, 1000);
    r.coscheduling = Some(iris_proto::job::CoschedulingConfig {
        // Every worker has a `device-type` (here `cpu`): one group of all of them.
        group_by: "device-type".into(),
    });
    r
}

#[tokio::test]
async fn a_tick_hands_the_writer_to_a_waiting_thread_between_jobs_never_inside_one() {
    use std::time::Duration;
    let ctl = controller();
    for w in ["w1", "w2", "w3", "w4"] {
        register(&ctl, w, 8, 64 * GIB);
    }
    // Nobody waits: one transaction for the whole plan.
    launch(&ctl, request("/alice/first", 2, 1000)).await;
    launch(&ctl, gang("/alice/first-gang", 3)).await;
    let before = tick_turns(&ctl);
    super::tick_within(&ctl, Duration::ZERO).expect("tick");
    assert_eq!(tick_turns(&ctl) - before, 1);

    // Someone waits, and the budget is spent at once: each job's assignments are their own
    // transaction, the gang's three together.
    launch(&ctl, request("/alice/a", 3, 1000)).await;
    launch(&ctl, gang("/alice/gang", 3)).await;
    launch(&ctl, request("/alice/c", 2, 1000)).await;
    ctl.pretend_writer_wanted(true);
    let before = tick_turns(&ctl);
    let ticked = super::tick_within(&ctl, Duration::ZERO);
    ctl.pretend_writer_wanted(false);
    let ticked = ticked.expect("tick");
    assert_eq!(tick_turns(&ctl) - before, 3);
    // Every assignment of the plan was applied across them.
    for (job, n) in [("/alice/a", 3), ("/alice/gang", 3), ("/alice/c", 2)] {
        for i in 0..n {
            let t = format!("{job}/{i}");
            assert_eq!(task_state(&ctl, &t), TaskState::Assigned, "{t}");
        }
        assert_eq!(job_state(&ctl, job), JobState::Running, "{job}");
    }
    assert!(!ticked.touched.is_empty());
    assert!(ticked.overhead <= ticked.took);
}

#[test]
fn attempt_uids_grow_with_time_and_differ_within_a_millisecond() {
    let earlier = crate::tick::new_attempt_uid(1_796_000_000_000);
    let later = crate::tick::new_attempt_uid(1_796_000_000_001);
    assert!(earlier < later, "{earlier} sorts before {later}");
    assert!(earlier.len() == 20 && earlier.bytes().all(|b| b.is_ascii_hexdigit()));
    let same: std::collections::HashSet<String> = (0..1_000)
        .map(|_| crate::tick::new_attempt_uid(1_796_000_000_000))
        .collect();
    assert_eq!(same.len(), 1_000, "uids minted in one millisecond differ");
}

#[test]
fn the_tick_is_paced_by_its_cpu_time_which_a_wait_does_not_add_to() {
    use super::{cpu_since, thread_cpu};
    use std::time::{Duration, Instant};
    let start = thread_cpu();
    assert!(start.is_some(), "Linux has a per-thread CPU clock");
    let wall = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    let slept = wall.elapsed();
    assert!(
        cpu_since(start, slept) < slept,
        "a thread that waited used less CPU than the time it waited"
    );
    // Work adds to it (the loop ends once it has: no timing in the assertion).
    let start = thread_cpu();
    let mut spins = 0u64;
    while cpu_since(start, Duration::ZERO) < Duration::from_millis(20) {
        spins = std::hint::black_box(spins + 1);
    }
    assert!(spins > 0);
    // Without the clock, the wall time stands in.
    assert_eq!(cpu_since(None, slept), slept);
}
