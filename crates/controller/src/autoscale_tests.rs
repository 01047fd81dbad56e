//! The autoscaler against a real controller and a provider that "starts" a slice by registering
//! its workers: slices follow demand, a failed start backs off, and stopping a slice never races
//! a placement.

use super::{evaluate, stop_slice, SliceProvider};
use crate::testutil::{controller_with, launch, register, request, task, GIB};
use crate::{lock, tick::tick, Controller, GroupCapacity};
use futures::future::BoxFuture;
use iris_scheduler::autoscale::{GroupPolicy, Lifecycle};
use iris_types::{AttrValue, Resources, TaskState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

struct Fake {
    ctl: Arc<Controller>,
    fail: AtomicBool,
    created: Mutex<Vec<String>>,
    stopped: Mutex<Vec<String>>,
}

impl Fake {
    fn new(ctl: &Arc<Controller>, fail: bool) -> Fake {
        Fake {
            ctl: ctl.clone(),
            fail: AtomicBool::new(fail),
            created: Mutex::new(Vec::new()),
            stopped: Mutex::new(Vec::new()),
        }
    }
}

impl SliceProvider for Fake {
    fn create<'a>(
        &'a self,
        _group: &'a str,
        slice_id: &'a str,
        worker_ids: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if self.fail.load(Ordering::SeqCst) {
                return Err("no room on this host".into());
            }
            for w in worker_ids {
                register(&self.ctl, w, 4, 16 * GIB);
            }
            lock(&self.created).push(slice_id.to_string());
            Ok(())
        })
    }

    fn terminate<'a>(&'a self, slice_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move { lock(&self.stopped).push(slice_id.to_string()) })
    }
}

fn group() -> GroupCapacity {
    GroupCapacity {
        name: "cpu".into(),
        capacity: Resources::cpu_mem(4000, 16 * GIB),
        attributes: [
            ("device-type".to_string(), AttrValue::Str("cpu".into())),
            ("device-variant".to_string(), AttrValue::Str("cpu".into())),
        ]
        .into_iter()
        .collect(),
        max_workers: 2,
        autoscale: Some(GroupPolicy {
            num_vms: 1,
            buffer_slices: 0,
            max_slices: 2,
            idle_threshold_ms: 0,
            priority: 100,
        }),
    }
}

fn slices(ctl: &Controller) -> Vec<(String, Vec<String>, Lifecycle)> {
    let st = lock(&ctl.autoscale);
    st.groups
        .get("cpu")
        .map(|g| {
            g.slices
                .iter()
                .map(|s| (s.id.clone(), s.workers.clone(), s.lifecycle))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn slices_follow_demand_and_an_idle_one_stops_only_when_nothing_runs_on_it() {
    let t = controller_with(|c| c.groups = vec![group()]);
    let ctl = t.ctl.clone();
    lock(&ctl.autoscale).enabled = true;
    let fake = Fake::new(&ctl, false);
    let job = launch(&ctl, request("/alice/one", 1, 4000)).await;
    evaluate(&ctl, &fake).await.expect("evaluate");
    assert_eq!(
        lock(&fake.created).len(),
        1,
        "one slice for one 4-core task"
    );
    evaluate(&ctl, &fake).await.expect("evaluate");
    let s = slices(&ctl);
    assert_eq!(
        s.len(),
        1,
        "the booting slice counts against the demand: {s:?}"
    );
    assert_eq!(s[0].2, Lifecycle::Ready, "its worker registered");
    let (slice, workers) = (s[0].0.clone(), s[0].1.clone());

    // A worker of a slice being stopped is offered nothing.
    lock(&ctl.autoscale).draining.insert(workers[0].clone());
    tick(&ctl).expect("tick");
    assert_eq!(
        super::super::testutil::task_state(&ctl, &format!("{job}/0")),
        TaskState::Pending
    );
    lock(&ctl.autoscale).draining.clear();
    tick(&ctl).expect("tick");
    let row = task(&ctl, &format!("{job}/0"));
    assert_eq!(row.worker_id.as_deref(), Some(workers[0].as_str()));

    // With its task there, the slice is not stopped, whatever the rule said.
    let stopped = stop_slice(&ctl, &fake, "cpu", &slice, &workers, "test".into())
        .await
        .expect("stop");
    assert!(!stopped && lock(&fake.stopped).is_empty());
    assert!(lock(&ctl.autoscale).draining.is_empty(), "undrained again");

    // Once it ran, the slice is idle (threshold 0) and stops; its worker row goes with it.
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        let obs = iris_store::apply::Observation {
            attempt_uid: row.attempts[0].attempt_uid.clone(),
            state: TaskState::Succeeded,
            exit_code: Some(0),
            error: String::new(),
            status_message: String::new(),
            container_id: String::new(),
        };
        iris_store::apply::apply_observation(&tx, &workers[0], &obs, iris_store::now_ms())
            .expect("observation");
        tx.commit().expect("commit");
    }
    evaluate(&ctl, &fake).await.expect("evaluate");
    assert_eq!(*lock(&fake.stopped), vec![slice.clone()]);
    assert!(slices(&ctl).is_empty());
    let listed = crate::views::workers(&*ctl.db()).expect("workers");
    assert!(listed.is_empty(), "the stopped slice's worker is gone");
    let rows = iris_store::autoscale::slices(&*ctl.db()).expect("slices table");
    assert!(rows.is_empty(), "and so is its row");
}

#[tokio::test]
async fn a_failed_start_backs_off_and_the_group_says_why() {
    let t = controller_with(|c| c.groups = vec![group()]);
    let ctl = t.ctl.clone();
    lock(&ctl.autoscale).enabled = true;
    let fake = Fake::new(&ctl, true);
    launch(&ctl, request("/alice/one", 1, 4000)).await;
    evaluate(&ctl, &fake).await.expect("evaluate");
    fake.fail.store(false, Ordering::SeqCst);
    // Within the backoff nothing is started, however often it evaluates.
    evaluate(&ctl, &fake).await.expect("evaluate");
    assert!(lock(&fake.created).is_empty());
    let status = ctl
        .get_autoscaler_status(Default::default())
        .await
        .expect("status")
        .status
        .expect("status");
    let g = &status.groups[0];
    assert_eq!(g.availability_status(), "backoff");
    assert!(
        g.availability_reason().contains("no room on this host"),
        "{g:?}"
    );
    assert_eq!(g.consecutive_failures(), 1);
    assert!(g.backoff_until.as_ref().is_some_and(|t| t.epoch_ms() > 0));
    let kinds: Vec<&str> = status
        .recent_actions
        .iter()
        .map(|a| a.action_type())
        .collect();
    assert_eq!(kinds, ["scale_up", "slice_failed"]);
    assert_eq!(status.recent_actions[0].status(), "failed");
    let rows = iris_store::autoscale::groups(&*ctl.db()).expect("groups table");
    assert_eq!(rows[0].consecutive_failures, 1);
}

#[tokio::test]
async fn a_slice_whose_worker_was_declared_lost_is_stopped() {
    let t = controller_with(|c| c.groups = vec![group()]);
    let ctl = t.ctl.clone();
    lock(&ctl.autoscale).enabled = true;
    let fake = Fake::new(&ctl, false);
    launch(&ctl, request("/alice/one", 1, 4000)).await;
    evaluate(&ctl, &fake).await.expect("evaluate");
    evaluate(&ctl, &fake).await.expect("evaluate");
    let (slice, workers, _) = slices(&ctl).remove(0);
    // The controller declares the worker failed (its grace ran out): its row goes.
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        iris_store::apply::fail_worker(&tx, &workers[0], iris_store::now_ms()).expect("fail");
        tx.commit().expect("commit");
    }
    evaluate(&ctl, &fake).await.expect("evaluate");
    assert_eq!(*lock(&fake.stopped), vec![slice]);
    let st = lock(&ctl.autoscale);
    let last = st
        .actions
        .iter()
        .rev()
        .find(|a| a.action_type() == "worker_failed");
    assert!(
        last.is_some_and(|a| a.reason().contains(&workers[0])),
        "{:?}",
        st.actions
    );
}
