//! Reconcile: a worker's registration, its desired set, applying its answer, and the
//! worker-loss rule (≥3 failed reconciles and `worker_grace` without an answer) on a paused
//! clock against an address that refuses connections.

use super::*;
use crate::testutil::{
    controller, controller_with, launch, register, register_at, request, task, task_state, GIB,
};
use crate::tick::tick;
use iris_store::workers;
use iris_types::{JobEvent, TaskEvent};

fn gpu_worker() -> (c::RegisterRequest, job::WorkerMetadata) {
    let req = c::RegisterRequest {
        worker_id: "gpu-1".into(),
        address: "10.0.0.5:8081".into(),
        slice_id: "slice-a".into(),
        scale_group: "h100-pool".into(),
        metadata: None,
    };
    let md = job::WorkerMetadata {
        hostname: Some("node-5".into()),
        ip_address: Some("10.0.0.5".into()),
        cpu_count: Some(32),
        memory_bytes: Some(256 * GIB),
        disk_bytes: Some(1024 * GIB),
        device: Some(job::DeviceConfig {
            device: Some(job::device_config::Device::Gpu(job::GpuDevice {
                variant: "H100".into(),
                count: 8,
            })),
        }),
        attributes: [
            (
                "zone".to_string(),
                crate::spec::attr_to_proto(&AttrValue::Str("us-east1-b".into())),
            ),
            (
                "preemptible".to_string(),
                crate::spec::attr_to_proto(&AttrValue::Str("true".into())),
            ),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    (req, md)
}

fn attr<'a>(r: &'a workers::Registration, key: &str) -> Option<&'a AttrValue> {
    r.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn s(v: &str) -> AttrValue {
    AttrValue::Str(v.into())
}

#[test]
fn registration_of_a_gpu_worker_derives_capacity_and_default_attributes() {
    let (req, md) = gpu_worker();
    let r = registration_of(&req, &md);
    assert_eq!(r.worker_id, "gpu-1");
    assert_eq!(r.address, "10.0.0.5:8081");
    assert_eq!(r.total.cpu_millicores, 32_000);
    assert_eq!(r.total.memory_bytes, 256 * GIB);
    assert_eq!(r.total.gpu, 8);
    assert_eq!(r.total.tpu, 0);
    assert_eq!(r.device_type, "gpu");
    assert_eq!(r.device_variant, "H100");
    assert_eq!(r.scale_group, "h100-pool");
    assert_eq!(attr(&r, "device-type"), Some(&s("gpu")));
    assert_eq!(attr(&r, "device-variant"), Some(&s("h100")), "lower-cased");
    assert_eq!(attr(&r, "scale-group"), Some(&s("h100-pool")));
    assert_eq!(attr(&r, "zone"), Some(&s("us-east1-b")));
    assert_eq!(
        attr(&r, "preemptible"),
        Some(&s("true")),
        "an advertised attribute wins over the default"
    );
    let n = r
        .attributes
        .iter()
        .filter(|(k, _)| k == "preemptible")
        .count();
    assert_eq!(n, 1);
}

#[test]
fn registration_of_a_cpu_worker_is_variant_cpu_without_a_scale_group() {
    let req = c::RegisterRequest {
        worker_id: "cpu-1".into(),
        address: "127.0.0.1:1".into(),
        ..Default::default()
    };
    let md = job::WorkerMetadata {
        cpu_count: Some(4),
        memory_bytes: Some(8 * GIB),
        ..Default::default()
    };
    let r = registration_of(&req, &md);
    assert_eq!(r.total.cpu_millicores, 4000);
    assert_eq!((r.total.gpu, r.total.tpu), (0, 0));
    assert_eq!(r.device_type, "cpu");
    assert_eq!(r.device_variant, "cpu");
    assert_eq!(attr(&r, "device-type"), Some(&s("cpu")));
    assert_eq!(attr(&r, "device-variant"), Some(&s("cpu")));
    assert_eq!(attr(&r, "preemptible"), Some(&s("false")));
    assert_eq!(attr(&r, "scale-group"), None);
}

fn desired(ctl: &crate::Controller, worker: &str) -> Vec<DesiredAttempt> {
    let conn = ctl.db();
    let rows = iris_store::workers::open_attempts(&*conn, worker).expect("open attempts");
    desired_set(ctl, &*conn, rows).expect("desired set")
}

fn intent_of<'a>(set: &'a [DesiredAttempt], task: &str) -> Option<&'a Intent> {
    set.iter()
        .find(|d| d.task_id.to_string() == task)
        .map(|d| &d.intent)
}

fn observe(ctl: &crate::Controller, worker: &str, uid: &str, state: TaskState) -> bool {
    let o = w::AttemptObservation {
        attempt_uid: uid.into(),
        state: state.code(),
        exit_code: if state.is_terminal() { 137 } else { 0 },
        ..Default::default()
    };
    apply_response(
        ctl,
        worker,
        w::ReconcileResponse {
            observed: vec![o],
            ..Default::default()
        },
    )
}

fn uid(ctl: &crate::Controller, t: &str) -> String {
    task(ctl, t)
        .attempts
        .last()
        .expect("an attempt")
        .attempt_uid
        .clone()
}

#[tokio::test]
async fn the_desired_set_launches_new_attempts_keeps_running_ones_and_stops_ended_ones() {
    let ctl = controller();
    register(&ctl, "w1", 8, 32 * GIB);
    launch(&ctl, request("/alice/run", 2, 1000)).await;
    launch(&ctl, request("/alice/cancel", 1, 1000)).await;
    tick(&ctl).expect("tick");
    assert!(observe(
        &ctl,
        "w1",
        &uid(&ctl, "/alice/run/1"),
        TaskState::Running
    ));
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        let now = iris_store::now_ms();
        let kill = JobEvent::Kill {
            reason: "Terminated by user".into(),
        };
        assert!(apply::apply_job_event(&tx, "/alice/cancel", &kill, now).expect("kill"));
        tx.commit().expect("commit");
    }

    let set = desired(&ctl, "w1");
    assert_eq!(set.len(), 3);
    match intent_of(&set, "/alice/run/0") {
        Some(Intent::Run { launch: Some(l) }) => {
            assert_eq!(l.task_id, "/alice/run/0");
            assert_eq!(l.attempt_uid, uid(&ctl, "/alice/run/0"));
            assert_eq!(l.attempt_id, 0);
            assert_eq!(l.num_tasks, 2);
            let argv = l
                .entrypoint
                .as_ref()
                .and_then(|e| e.run_command.as_ref())
                .map(|r| r.argv.clone());
            assert_eq!(argv, Some(vec!["python".into(), "train.py".into()]));
        }
        other => panic!("a new attempt is launched with its spec, got {other:?}"),
    }
    assert_eq!(
        intent_of(&set, "/alice/run/1"),
        Some(&Intent::Run { launch: None }),
        "a running attempt is kept without resending its spec"
    );
    assert_eq!(
        intent_of(&set, "/alice/cancel/0"),
        Some(&Intent::Stop(StopReason::Cancelled))
    );
    assert!(desired(&ctl, "w2").is_empty());

    // The worker confirms the cancelled attempt ended: it leaves the set.
    assert!(observe(
        &ctl,
        "w1",
        &uid(&ctl, "/alice/cancel/0"),
        TaskState::Killed
    ));
    assert_eq!(intent_of(&desired(&ctl, "w1"), "/alice/cancel/0"), None);
}

#[tokio::test]
async fn a_preempted_victim_withholds_new_launches_on_its_worker_until_it_ends() {
    let ctl = controller();
    register(&ctl, "w1", 8, 32 * GIB);
    launch(&ctl, request("/alice/victim", 1, 1000)).await;
    launch(&ctl, request("/bob/next", 1, 1000)).await;
    tick(&ctl).expect("tick");
    let victim = uid(&ctl, "/alice/victim/0");
    assert!(observe(&ctl, "w1", &victim, TaskState::Running));
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        let ev = TaskEvent::Preempt {
            by: "/bob/next/0".into(),
        };
        let now = iris_store::now_ms();
        apply::apply_task_event(
            &tx,
            "/alice/victim/0",
            &ev,
            None,
            apply::Finish::AwaitWorker,
            now,
            "test",
        )
        .expect("preempt");
        tx.commit().expect("commit");
    }

    let set = desired(&ctl, "w1");
    assert_eq!(
        intent_of(&set, "/alice/victim/0"),
        Some(&Intent::Stop(StopReason::Preempted))
    );
    assert_eq!(
        intent_of(&set, "/bob/next/0"),
        None,
        "withheld while the victim holds w1"
    );

    assert!(observe(&ctl, "w1", &victim, TaskState::Killed));
    let set = desired(&ctl, "w1");
    assert_eq!(intent_of(&set, "/alice/victim/0"), None);
    assert!(matches!(
        intent_of(&set, "/bob/next/0"),
        Some(Intent::Run { launch: Some(_) })
    ));
}

#[tokio::test]
async fn apply_response_applies_the_workers_facts_only_for_its_own_attempts() {
    let ctl = controller();
    register(&ctl, "w1", 8, 32 * GIB);
    register(&ctl, "w2", 8, 32 * GIB);
    launch(&ctl, request("/alice/obs", 1, 1000)).await;
    tick(&ctl).expect("tick");
    let a = uid(&ctl, "/alice/obs/0");
    let holder = task(&ctl, "/alice/obs/0").worker_id.expect("placed");
    let other = if holder == "w1" { "w2" } else { "w1" };

    assert!(
        !observe(&ctl, other, &a, TaskState::Running),
        "fenced by worker"
    );
    assert_eq!(task_state(&ctl, "/alice/obs/0"), TaskState::Assigned);
    assert!(!apply_response(
        &ctl,
        &holder,
        w::ReconcileResponse::default()
    ));

    assert!(observe(&ctl, &holder, &a, TaskState::Running));
    assert_eq!(task_state(&ctl, "/alice/obs/0"), TaskState::Running);
    assert_eq!(
        task(&ctl, "/alice/obs/0").exit_code,
        None,
        "no exit code while running"
    );
    let done = w::AttemptObservation {
        attempt_uid: a.clone(),
        state: TaskState::Succeeded.code(),
        exit_code: 0,
        ..Default::default()
    };
    let resp = w::ReconcileResponse {
        observed: vec![done],
        ..Default::default()
    };
    assert!(apply_response(&ctl, &holder, resp));
    let t = task(&ctl, "/alice/obs/0");
    assert_eq!(t.state, TaskState::Succeeded.code());
    assert_eq!(t.exit_code, Some(0));
    assert!(t.attempts[0].finished_at_ms.is_some());
}

/// An address on 127.0.0.1 that refuses connections: a port the OS handed out, then closed.
fn refusing_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = l.local_addr().expect("local addr");
    drop(l);
    addr.to_string()
}

/// Runs the worker's reconcile loop until its row is gone; returns how long that took on the
/// (paused) tokio clock. Bounded: panics after an hour of virtual time.
async fn time_until_failed(ctl: &crate::Controller, worker: &str) -> Duration {
    let start = tokio::time::Instant::now();
    ensure_reconciler(ctl, worker);
    let wait = async {
        loop {
            let gone = workers::address(&*ctl.db(), worker)
                .expect("read worker")
                .is_none();
            if gone {
                return start.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(3600), wait)
        .await
        .expect("the unreachable worker is declared failed")
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_worker_is_failed_only_after_its_grace_and_its_work_requeued() {
    let ctl = controller_with(|c| {
        c.worker_grace = Duration::from_secs(120);
        c.reconcile_interval = Duration::from_secs(1);
    });
    register_at(&ctl, "w1", &refusing_address(), 8, 32 * GIB);
    launch(&ctl, request("/alice/stranded", 1, 1000)).await;
    tick(&ctl).expect("tick");
    assert_eq!(task_state(&ctl, "/alice/stranded/0"), TaskState::Assigned);

    let took = time_until_failed(&ctl, "w1").await;
    // Three failed rounds take a few seconds (at most ~11 s each with the call's timeout):
    // only the grace can keep the worker this long.
    assert!(
        took >= Duration::from_secs(120),
        "failed after {took:?}, inside the grace"
    );
    let t = task(&ctl, "/alice/stranded/0");
    assert_eq!(
        t.state,
        TaskState::Pending.code(),
        "re-queued for another worker"
    );
    assert_eq!(t.attempts[0].state, TaskState::WorkerFailed);
    assert!(t.attempts[0].finished_at_ms.is_some());
    assert!(
        !crate::lock(&ctl.workers).contains_key("w1"),
        "the loop's link is gone"
    );
}

#[tokio::test]
async fn a_worker_registered_again_at_another_address_is_reconciled_there() {
    let ctl = controller_with(|c| {
        c.worker_grace = Duration::from_secs(3600);
        c.reconcile_interval = Duration::from_millis(20);
    });
    register_at(&ctl, "w1", &refusing_address(), 8, 32 * GIB);
    ensure_reconciler(&ctl, "w1");
    // A few refused rounds at the first address (the loop keeps the address it read).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr").to_string();
    register_at(&ctl, "w1", &addr, 8, 32 * GIB);
    // The same loop's next round goes to the new address.
    let accepted = tokio::time::timeout(Duration::from_secs(30), listener.accept()).await;
    assert!(
        accepted.is_ok_and(|r| r.is_ok()),
        "no reconcile reached the worker's new address"
    );
    assert!(workers::address(&*ctl.db(), "w1")
        .expect("read worker")
        .is_some_and(|a| a == addr));
}

#[tokio::test(start_paused = true)]
async fn a_worker_is_failed_only_after_three_failed_reconciles_even_with_no_grace() {
    let ctl = controller_with(|c| {
        c.worker_grace = Duration::ZERO;
        c.reconcile_interval = Duration::from_secs(60);
    });
    register_at(&ctl, "w1", &refusing_address(), 8, 32 * GIB);
    let took = time_until_failed(&ctl, "w1").await;
    // Rounds are at least one interval apart: three rounds take at least two intervals, while
    // one or two would take under that (a failed call takes at most its 10 s timeout).
    assert!(took >= Duration::from_secs(120), "failed after {took:?}");
}

#[test]
fn idle_rounds_stretch_with_the_fleet_past_the_budget() {
    let base = Duration::from_secs(1);
    assert_eq!(idle_interval(base, 1, 1000), base);
    assert_eq!(idle_interval(base, 1000, 1000), base);
    assert_eq!(idle_interval(base, 5000, 1000), Duration::from_secs(5));
    assert_eq!(idle_interval(base, 5000, 0), Duration::from_secs(5000));
}

#[tokio::test(start_paused = true)]
async fn a_lost_worker_in_a_stretched_fleet_is_retried_at_the_base_interval() {
    let ctl = controller_with(|c| {
        c.worker_grace = Duration::ZERO;
        c.reconcile_interval = Duration::from_secs(1);
        // Ten workers at one idle round a second: each idle worker waits 10 s.
        c.max_reconciles_per_second = 1;
    });
    for i in 1..10 {
        let id = format!("w{i}");
        register_at(&ctl, &id, &refusing_address(), 8, 32 * GIB);
        ensure_reconciler(&ctl, &id);
    }
    register_at(&ctl, "w0", &refusing_address(), 8, 32 * GIB);
    let took = time_until_failed(&ctl, "w0").await;
    // Three rounds: the first at once, the next two one base interval after each failure. At
    // the stretched interval they would take at least 20 s.
    assert!(took < Duration::from_secs(10), "failed after {took:?}");
}

/// A RUNNING observation of task `t`'s attempt, from its holder or, if `fenced`, from another
/// of `workers` (an answer the writer must refuse).
fn running_answer(
    ctl: &crate::Controller,
    t: &str,
    fenced: bool,
    workers: [&str; 2],
) -> (String, apply::Observation) {
    let holder = task(ctl, t).worker_id.expect("placed");
    let from = match (fenced, holder == workers[0]) {
        (false, _) => holder,
        (true, true) => workers[1].to_string(),
        (true, false) => workers[0].to_string(),
    };
    let obs = apply::Observation {
        attempt_uid: uid(ctl, t),
        state: TaskState::Running,
        exit_code: None,
        error: String::new(),
        status_message: String::new(),
        container_id: String::new(),
    };
    (from, obs)
}

/// `n` one-core workers `w00`, `w01`, … and `n` one-task jobs `/alice/<name>00`, …, every task
/// placed (one placement per worker and tick at most, so `n` ticks): the tasks' keys.
async fn one_placed_task_each(ctl: &crate::Controller, n: usize, name: &str) -> Vec<String> {
    for i in 0..n {
        register(ctl, &format!("w{i:02}"), 1, 4 * GIB);
        launch(ctl, request(&format!("/alice/{name}{i:02}"), 1, 1000)).await;
    }
    for _ in 0..n {
        tick(ctl).expect("tick");
    }
    (0..n).map(|i| format!("/alice/{name}{i:02}/0")).collect()
}

/// The observation writer commits many workers' answers together: each answer's verdict comes
/// back to its own sender, and one worker reporting an attempt that is not its own changes
/// nothing while the others in the same batch apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_observation_writer_applies_many_workers_answers_each_to_its_own_attempts() {
    let ctl = controller();
    let tasks = one_placed_task_each(&ctl, 24, "many").await;
    let mut calls = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        // Every fourth answer comes from a worker that does not hold the attempt.
        let (from, obs) = running_answer(&ctl, t, i % 4 == 0, ["w00", "w01"]);
        let c = ctl.ctl.clone();
        calls.push(tokio::spawn(async move {
            (i, c.observe(&from, vec![obs], true).await == Some(true))
        }));
    }
    for call in calls {
        let (i, changed) = call.await.expect("observe task");
        let t = &tasks[i];
        if i % 4 == 0 {
            assert!(!changed, "{t}: another worker's answer is fenced");
            assert_eq!(task_state(&ctl, t), TaskState::Assigned, "{t}");
        } else {
            assert!(changed, "{t}");
            assert_eq!(task_state(&ctl, t), TaskState::Running, "{t}");
        }
    }
}

/// The observation writer splits a batch into transactions (`observe::TX_BUDGET`, so the tick
/// and admission get the writer in between): with no budget at all, every answer
/// is its own transaction, and each still gets its own verdict, in order.
#[tokio::test]
async fn a_batch_split_into_one_transaction_per_answer_gives_each_its_own_verdict() {
    let ctl = controller();
    let n = 6;
    let tasks = one_placed_task_each(&ctl, n, "split").await;
    let mut answers: Vec<(String, Vec<apply::Observation>)> = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        // Every third answer comes from a worker that does not hold the attempt.
        let (from, obs) = running_answer(&ctl, t, i % 3 == 0, ["w00", "w01"]);
        answers.push((from, vec![obs]));
    }
    let reports: Vec<crate::observe::Answer<'_>> = answers
        .iter()
        .map(|(w, o)| (w.as_str(), o.as_slice(), true))
        .collect();
    let verdicts = crate::observe::apply_reports_within(
        &ctl,
        &reports,
        crate::observe::TxBudget {
            shared: std::time::Duration::ZERO,
            alone: std::time::Duration::ZERO,
        },
    );
    let expected: Vec<Option<bool>> = (0..n).map(|i| Some(i % 3 != 0)).collect();
    assert_eq!(verdicts, expected);
    for (i, t) in tasks.iter().enumerate() {
        let want = if i % 3 == 0 {
            TaskState::Assigned
        } else {
            TaskState::Running
        };
        assert_eq!(task_state(&ctl, t), want, "{t}");
    }
}

/// The observation writer keeps one transaction going while nobody else wants the writer
/// connection, and ends it after the shared budget once another thread waits for it (the tick's
/// assignments, admission), so that answers are committed in large transactions without
/// holding submissions up.
#[tokio::test]
async fn answers_share_one_transaction_until_another_thread_waits_for_the_writer() {
    let ctl = controller();
    let n = 8;
    let tasks = one_placed_task_each(&ctl, n, "tx").await;
    let answers: Vec<(String, Vec<apply::Observation>)> = tasks
        .iter()
        .map(|t| {
            let (from, obs) = running_answer(&ctl, t, false, ["w00", "w01"]);
            (from, vec![obs])
        })
        .collect();
    let reports: Vec<crate::observe::Answer<'_>> = answers
        .iter()
        .map(|(w, o)| (w.as_str(), o.as_slice(), true))
        .collect();
    let budget = crate::observe::TxBudget {
        shared: std::time::Duration::ZERO,
        alone: std::time::Duration::from_secs(3600),
    };
    let transactions = |ctl: &crate::Controller| {
        let text = ctl.metrics.render();
        text.lines()
            .find_map(|l| l.strip_prefix("iris_observation_transaction_reports_count "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Nobody else waits: the first half goes in one transaction.
    let verdicts = crate::observe::apply_reports_within(&ctl, &reports[..n / 2], budget);
    assert_eq!(verdicts, vec![Some(true); n / 2]);
    assert_eq!(transactions(&ctl), 1);
    // Someone waits: each answer of the second half is committed on its own.
    ctl.pretend_writer_wanted(true);
    let verdicts = crate::observe::apply_reports_within(&ctl, &reports[n / 2..], budget);
    ctl.pretend_writer_wanted(false);
    assert_eq!(verdicts, vec![Some(true); n / 2]);
    assert_eq!(transactions(&ctl), 1 + n as u64 / 2);
    for t in &tasks {
        assert_eq!(task_state(&ctl, t), TaskState::Running, "{t}");
    }
}

/// A worker's heartbeat in the store (`last_heartbeat_ms`).
fn heartbeat_of(ctl: &crate::Controller, worker: &str) -> Option<i64> {
    let conn = ctl.db();
    workers::list(&*conn)
        .expect("workers")
        .into_iter()
        .find(|w| w.worker_id == worker)
        .and_then(|w| w.last_heartbeat_ms)
}

/// Answers that change something are stored at once; the heartbeat goes with them only when it
/// is due (every `HEARTBEAT_EVERY`), not with each of them.
#[tokio::test]
async fn a_workers_changed_answers_are_stored_at_once_and_its_heartbeat_only_when_due() {
    let ctl = controller();
    let tasks = one_placed_task_each(&ctl, 1, "beat").await;
    let t = &tasks[0];
    let (worker, running) = running_answer(&ctl, t, false, ["w00", "w01"]);
    let mut stored = Stored::default();
    // The first answer: the state and the heartbeat.
    let before = heartbeat_of(&ctl, &worker);
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(stored.report(&ctl, &worker, vec![running.clone()]).await);
    assert_eq!(task_state(&ctl, t), TaskState::Running);
    let beat = heartbeat_of(&ctl, &worker);
    assert!(beat > before, "{beat:?} after {before:?}");
    // A repeat changes nothing and writes nothing.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(!stored.report(&ctl, &worker, vec![running.clone()]).await);
    // A change is stored at once, without a heartbeat that is not yet due.
    let done = apply::Observation {
        state: TaskState::Succeeded,
        exit_code: Some(0),
        ..running
    };
    assert!(stored.report(&ctl, &worker, vec![done]).await);
    assert_eq!(task_state(&ctl, t), TaskState::Succeeded);
    assert_eq!(heartbeat_of(&ctl, &worker), beat);
    // Once due, it goes (alone here: the answer repeats what is stored).
    stored.beat = stored.beat.and_then(|b| b.checked_sub(HEARTBEAT_EVERY));
    tokio::time::sleep(Duration::from_millis(5)).await;
    stored.report(&ctl, &worker, vec![]).await;
    assert!(heartbeat_of(&ctl, &worker) > beat);
}
