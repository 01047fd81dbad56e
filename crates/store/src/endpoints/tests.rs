//! The registry through the store: registration outcomes, renewal, listing, and the ways an
//! endpoint goes away (its attempt ends, its job is killed, its lease runs out).

use super::*;
use crate::apply::{apply_observation, assign_task, insert_job, kill_subtree, NewJob, Observation};
use crate::{federation, workers, Db};

const T0: i64 = 1_000_000;
const LEASE: i64 = 600_000;

fn job(id: &str, tasks: u32, retries: i64) -> NewJob {
    let mut j = NewJob {
        job_id: id.into(),
        user_id: "alice".into(),
        submitting_user: "alice".into(),
        root_job_id: id.into(),
        depth: 1,
        num_tasks: tasks,
        ..Default::default()
    };
    j.cfg.max_retries_failure = retries;
    j.cfg.max_task_failures = retries;
    j
}

fn setup(db: &mut Db, retries: i64) {
    let tx = db.begin().expect("tx");
    workers::upsert(
        &tx,
        &workers::Registration {
            worker_id: "w1".into(),
            address: "127.0.0.1:9001".into(),
            ..Default::default()
        },
        T0,
    )
    .expect("worker");
    insert_job(&tx, &job("/alice/j", 2, retries), T0).expect("job");
    assert!(assign_task(&tx, "/alice/j/0", "w1", "127.0.0.1:1", "uid-0", 2, T0).expect("assign"));
    tx.commit().expect("commit");
}

fn ep(id: &str, name: &str, task: &str) -> Endpoint {
    Endpoint {
        endpoint_id: id.into(),
        name: name.into(),
        address: "127.0.0.1:8080".into(),
        task_id: task.into(),
        job_id: String::new(),
        metadata: BTreeMap::from([("k".to_string(), "v".to_string())]),
        registered_at_ms: T0,
        lease_deadline_ms: Some(T0 + LEASE),
        access: Access::Link,
        peer_id: None,
    }
}

fn reg(db: &mut Db, e: &Endpoint, attempt: i64) -> Registered {
    let tx = db.begin().expect("tx");
    let r = register(&tx, e, attempt).expect("register");
    tx.commit().expect("commit");
    r
}

fn names(db: &Db, prefix: &str, now: i64) -> Vec<String> {
    list(
        db,
        &Filter {
            name: prefix,
            ..Default::default()
        },
        now,
    )
    .expect("list")
    .into_iter()
    .map(|e| e.name)
    .collect()
}

fn observe(db: &mut Db, uid: &str, state: TaskState, exit: Option<i32>) {
    let tx = db.begin().expect("tx");
    let obs = Observation {
        attempt_uid: uid.into(),
        state,
        exit_code: exit,
        error: String::new(),
        status_message: String::new(),
        container_id: String::new(),
    };
    apply_observation(&tx, "w1", &obs, T0 + 5).expect("observe");
    tx.commit().expect("commit");
}

#[test]
fn registration_needs_the_live_attempt_of_a_live_task() {
    let mut db = Db::open_in_memory().expect("db");
    setup(&mut db, 0);
    assert_eq!(
        reg(&mut db, &ep("e0", "/alice/j/x", "/alice/nope/0"), 0),
        Registered::NoTask
    );
    // Task 1 was never assigned: no attempt of it is live.
    assert_eq!(
        reg(&mut db, &ep("e0", "/alice/j/x", "/alice/j/1"), 0),
        Registered::Stale { current: -1 }
    );
    assert_eq!(
        reg(&mut db, &ep("e0", "/alice/j/x", "/alice/j/0"), 3),
        Registered::Stale { current: 0 }
    );
    assert_eq!(
        reg(&mut db, &ep("e0", "/alice/j/x", "/alice/j/0"), 0),
        Registered::Ok
    );
    let got = by_id(&db, "e0").expect("read").expect("row");
    assert_eq!(got.job_id, "/alice/j");
    assert_eq!(got.access, Access::Link);
    assert_eq!(got.metadata.get("k").map(String::as_str), Some("v"));
    // A renewal with the same id moves the lease; a second id for the same name replaces it.
    let mut renewed = ep("e0", "/alice/j/x", "/alice/j/0");
    renewed.lease_deadline_ms = Some(T0 + 2 * LEASE);
    assert_eq!(reg(&mut db, &renewed, 0), Registered::Ok);
    assert_eq!(
        reg(&mut db, &ep("e1", "/alice/j/x", "/alice/j/0"), 0),
        Registered::Ok
    );
    assert_eq!(by_id(&db, "e0").expect("read"), None);
    assert_eq!(names(&db, "/alice/", T0), vec!["/alice/j/x"]);
}

#[test]
fn listing_filters_by_prefix_exact_task_and_hides_expired_leases() {
    let mut db = Db::open_in_memory().expect("db");
    setup(&mut db, 0);
    for (id, name) in [
        ("a", "/alice/j/web"),
        ("b", "/alice/j/web2"),
        ("c", "/alice/j/db"),
    ] {
        assert_eq!(reg(&mut db, &ep(id, name, "/alice/j/0"), 0), Registered::Ok);
    }
    assert_eq!(
        names(&db, "/alice/j/", T0),
        vec!["/alice/j/db", "/alice/j/web", "/alice/j/web2"]
    );
    assert_eq!(
        names(&db, "/alice/j/web", T0),
        vec!["/alice/j/web", "/alice/j/web2"]
    );
    let exact = list(
        &db,
        &Filter {
            name: "/alice/j/web",
            exact: true,
            ..Default::default()
        },
        T0,
    )
    .expect("list");
    assert_eq!(exact.len(), 1);
    let other_task = ["/alice/j/1".to_string()];
    let by_task = list(
        &db,
        &Filter {
            name: "",
            task_ids: &other_task,
            ..Default::default()
        },
        T0,
    )
    .expect("list");
    assert!(by_task.is_empty());
    assert!(resolve(&db, "/alice/j/db", T0).expect("resolve").is_some());
    // Past the lease: hidden at once, deleted by the sweep.
    let later = T0 + LEASE;
    assert!(names(&db, "", later).is_empty());
    assert!(resolve(&db, "/alice/j/db", later)
        .expect("resolve")
        .is_none());
    let tx = db.begin().expect("tx");
    assert_eq!(sweep_expired(&tx, later).expect("sweep").len(), 3);
    tx.commit().expect("commit");
    assert_eq!(by_id(&db, "a").expect("read"), None);
}

#[test]
fn an_endpoint_goes_when_its_attempt_ends_even_if_the_task_retries() {
    let mut db = Db::open_in_memory().expect("db");
    setup(&mut db, 1);
    assert_eq!(
        reg(&mut db, &ep("e0", "/alice/j/x", "/alice/j/0"), 0),
        Registered::Ok
    );
    observe(&mut db, "uid-0", TaskState::Running, None);
    assert_eq!(names(&db, "", T0), vec!["/alice/j/x"]);
    observe(&mut db, "uid-0", TaskState::Failed, Some(1));
    // The task is pending its retry: the name no longer resolves, and the ended attempt cannot
    // put it back.
    assert!(names(&db, "", T0).is_empty());
    assert_eq!(
        reg(&mut db, &ep("e0", "/alice/j/x", "/alice/j/0"), 0),
        Registered::Stale { current: 0 }
    );
}

#[test]
fn a_killed_job_and_a_finished_task_take_their_endpoints_along() {
    let mut db = Db::open_in_memory().expect("db");
    setup(&mut db, 0);
    assert_eq!(
        reg(&mut db, &ep("e0", "/alice/j/x", "/alice/j/0"), 0),
        Registered::Ok
    );
    let tx = db.begin().expect("tx");
    assert!(kill_subtree(&tx, "/alice/j", "cancelled", "parent cancelled", T0 + 9).expect("kill"));
    tx.commit().expect("commit");
    assert!(names(&db, "", T0).is_empty());
    assert!(matches!(
        reg(&mut db, &ep("e0", "/alice/j/x", "/alice/j/0"), 0),
        Registered::Terminal(_)
    ));
}

#[test]
fn a_hub_mirrors_only_the_endpoints_of_jobs_it_sent_to_that_peer() {
    // The peer's side: a received job's endpoints are reported to its requester only.
    let mut peer = Db::open_in_memory().expect("db");
    setup(&mut peer, 0);
    let tx = peer.begin().expect("tx");
    federation::insert_handle(
        &tx,
        "/alice/j",
        federation::RECEIVED,
        "hub",
        "alice",
        0,
        "n",
    )
    .expect("handle");
    tx.commit().expect("commit");
    assert_eq!(
        reg(&mut peer, &ep("e0", "/alice/j/x", "/alice/j/0"), 0),
        Registered::Ok
    );
    let reported = for_requester(&peer, "hub", T0).expect("report");
    assert_eq!(reported.len(), 1);
    assert!(for_requester(&peer, "other", T0)
        .expect("report")
        .is_empty());

    // The hub's side: a job it sent to `gpu` takes the report; one it did not is ignored.
    let mut hub = Db::open_in_memory().expect("db");
    let tx = hub.begin().expect("tx");
    let mut sent = job("/alice/j", 1, 0);
    sent.federated = Some("gpu".into());
    insert_job(&tx, &sent, T0).expect("job");
    federation::insert_handle(&tx, "/alice/j", federation::SENT, "gpu", "alice", 0, "n")
        .expect("handle");
    let stranger = Endpoint {
        job_id: "/bob/k".into(),
        ..reported[0].clone()
    };
    assert_eq!(
        replace_for_peer(&tx, "gpu", &[reported[0].clone(), stranger]).expect("mirror"),
        1
    );
    assert_eq!(replace_for_peer(&tx, "cpu", &reported).expect("mirror"), 0);
    tx.commit().expect("commit");
    let mirrored = resolve(&hub, "/alice/j/x", T0)
        .expect("resolve")
        .expect("row");
    assert_eq!(mirrored.peer_id.as_deref(), Some("gpu"));
    // The next report replaces the whole set.
    let tx = hub.begin().expect("tx");
    replace_for_peer(&tx, "gpu", &[]).expect("mirror");
    tx.commit().expect("commit");
    assert!(resolve(&hub, "/alice/j/x", T0).expect("resolve").is_none());
}
