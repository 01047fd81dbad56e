//! The hub's placement pass with peer heartbeats injected into the in-memory federation state.

use super::*;
use crate::federation::{FederationConfig, PeerConfig};
use crate::testutil::{controller_with, insert_job_at, job_row, request, TestCtl};
use iris_types::JobState;

fn hub() -> TestCtl {
    controller_with(|c| {
        c.federation = FederationConfig {
            cluster_name: "hub".into(),
            // Never dialled: the pass only reads heartbeats and writes the store.
            peers: vec![
                PeerConfig {
                    id: "east".into(),
                    address: "http://127.0.0.1:1".into(),
                },
                PeerConfig {
                    id: "west".into(),
                    address: "http://127.0.0.1:2".into(),
                },
            ],
            ..FederationConfig::default()
        };
    })
}

/// A heartbeat: one backend advertising H100 GPUs with `free` of them idle.
fn heartbeat(ctl: &Controller, peer: &str, free: i64) {
    let backend = c::BackendSummary {
        backend_id: "k8s".into(),
        advertised_attributes: [("device-type", "gpu"), ("device-variant", "h100")]
            .into_iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    iris_proto::cluster::StringList {
                        values: vec![v.into()],
                    },
                )
            })
            .collect(),
        availability: Some(c::ResourceAvailability {
            version: fed::AVAILABILITY_VERSION,
            observation_epoch_ms: 1_000 + free,
            amounts: [("h100".to_string(), free)].into_iter().collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    lock(&ctl.fed.peers).insert(
        peer.into(),
        PeerRuntime {
            reachable: true,
            refused: None,
            suspect: false,
            last_contact_ms: iris_store::now_ms(),
            backends: vec![backend],
        },
    );
}

/// A root job needing one H100, queued (unpinned) for the federation as admission would.
fn queue_gpu_job(ctl: &Controller, name: &str, submitted_at: i64, deadline_ms: Option<i64>) {
    let mut req = request(name, 1, 1000);
    if let Some(r) = req.resources.as_mut() {
        r.device = Some(job::DeviceConfig {
            device: Some(job::device_config::Device::Gpu(job::GpuDevice {
                variant: "H100".into(),
                count: 1,
            })),
        });
    }
    for (k, v) in [("device-type", "gpu"), ("device-variant", "h100")] {
        req.constraints.push(job::Constraint {
            key: Some(k.into()),
            op: Some(0),
            value: Some(crate::spec::attr_to_proto(&iris_types::AttrValue::Str(
                v.into(),
            ))),
            values: Vec::new(),
            mode: Some(0),
        });
    }
    req.scheduling_timeout =
        deadline_ms.map(|milliseconds| iris_proto::time::Duration { milliseconds });
    insert_job_at(ctl, &req, submitted_at, Some(""));
}

fn handle(ctl: &Controller, job_id: &str) -> sf::Handle {
    sf::handle(&*ctl.db(), job_id)
        .expect("read handle")
        .expect("handle exists")
}

#[test]
fn a_queued_job_is_promoted_to_the_peer_that_reports_capacity() {
    let ctl = hub();
    queue_gpu_job(&ctl, "/alice/train", iris_store::now_ms(), None);

    // Both peers can run H100 jobs but neither has one free: the job waits.
    heartbeat(&ctl, "east", 0);
    heartbeat(&ctl, "west", 0);
    tick_pass(&ctl).expect("pass");
    let h = handle(&ctl, "/alice/train");
    assert_eq!(h.handoff_state, sf::QUEUED);
    assert_eq!(h.peer_id, "");

    heartbeat(&ctl, "west", 4);
    tick_pass(&ctl).expect("pass");
    let h = handle(&ctl, "/alice/train");
    assert_eq!(h.handoff_state, sf::PENDING, "promoted, awaiting delivery");
    assert_eq!(h.peer_id, "west");
    assert_eq!(h.backend_id, "k8s");
    assert_eq!(
        h.generation, 1_004,
        "the heartbeat generation it was placed against"
    );
    assert_eq!(job_row(&ctl, "/alice/train").cluster, "west");
    assert_eq!(
        job_row(&ctl, "/alice/train").state,
        JobState::Pending.code()
    );

    // Promoted once: a later pass leaves it where it is.
    heartbeat(&ctl, "east", 8);
    tick_pass(&ctl).expect("pass");
    assert_eq!(handle(&ctl, "/alice/train").peer_id, "west");
}

#[test]
fn a_queued_job_past_its_deadline_expires_unschedulable_instead_of_being_promoted() {
    let ctl = hub();
    heartbeat(&ctl, "west", 8);
    let long_ago = iris_store::now_ms() - 60_000;
    queue_gpu_job(&ctl, "/alice/late", long_ago, Some(1_000));
    queue_gpu_job(&ctl, "/alice/on-time", long_ago, Some(3_600_000));

    tick_pass(&ctl).expect("pass");
    let j = job_row(&ctl, "/alice/late");
    assert_eq!(j.state, JobState::Unschedulable.code());
    assert!(j.error.unwrap_or_default().contains("Scheduling timeout"));
    assert_eq!(handle(&ctl, "/alice/late").handoff_state, sf::QUEUED);
    assert_eq!(handle(&ctl, "/alice/late").peer_id, "");
    assert_eq!(handle(&ctl, "/alice/on-time").peer_id, "west");
}

#[test]
fn a_cancelled_queued_job_is_never_promoted() {
    let ctl = hub();
    heartbeat(&ctl, "west", 8);
    queue_gpu_job(&ctl, "/alice/changed-mind", iris_store::now_ms(), None);
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        let before = sf::cancel_sent(&tx, "/alice/changed-mind", iris_store::now_ms())
            .expect("cancel")
            .expect("a sent handle");
        assert_eq!(before.handoff_state, sf::QUEUED);
        tx.commit().expect("commit");
    }
    let j = job_row(&ctl, "/alice/changed-mind");
    assert_eq!(j.state, JobState::Killed.code());
    assert_eq!(j.error.as_deref(), Some("Cancelled before handoff"));

    tick_pass(&ctl).expect("pass");
    let h = handle(&ctl, "/alice/changed-mind");
    assert_eq!(h.handoff_state, sf::QUEUED);
    assert_eq!(h.peer_id, "");
    assert_eq!(h.cancel_intent_version, 1);
    assert!(sf::deliveries(&*ctl.db(), "west", 10)
        .expect("deliveries")
        .is_empty());
}

#[tokio::test]
async fn a_child_cancel_that_cannot_be_sent_is_recorded_and_stays_pending_until_settled() {
    let ctl = hub();
    heartbeat(&ctl, "west", 4);
    queue_gpu_job(&ctl, "/alice/root", iris_store::now_ms(), None);
    tick_pass(&ctl).expect("pass");
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        assert!(sf::mark_handed_off(&tx, "/alice/root", iris_store::now_ms()).expect("mark"));
        tx.commit().expect("commit");
    }
    assert_eq!(handle(&ctl, "/alice/root").peer_id, "west");

    // The child lives on the peer, which is unreachable (its address refuses connections): the
    // cancel is accepted, and its intent outlives the failed send.
    let child = "/alice/root/eval";
    assert!(ctl.cancel_federated(child).await.expect("cancel"));
    let pending = sf::pending_child_cancels(&*ctl.db(), "west").expect("pending");
    assert_eq!(
        pending,
        vec![child.to_string()],
        "the sync loop re-drives it"
    );
    assert!(sf::pending_child_cancels(&*ctl.db(), "east")
        .expect("pending")
        .is_empty());

    // Once the peer reports the child gone, nothing is left to re-drive.
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        sf::settle_child_cancels(&tx, "west", &[child.to_string()]).expect("settle");
        tx.commit().expect("commit");
    }
    assert!(sf::pending_child_cancels(&*ctl.db(), "west")
        .expect("pending")
        .is_empty());
}

fn mirror_running(ctl: &Controller, job_id: &str, state: JobState) {
    use iris_store::mirror as m;
    static UID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0xa0);
    let uid = || {
        format!(
            "{:016x}",
            UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )
    };
    let mut conn = ctl.db();
    let tx = conn.begin().expect("tx");
    let now = iris_store::now_ms();
    let task = m::MirrorTask {
        task_index: 0,
        state: iris_types::TaskState::Running.code(),
        started_at_ms: Some(now),
        current_attempt_id: 0,
        worker_address: "peer-worker:1".into(),
        attempts: vec![m::MirrorAttempt {
            attempt_id: 0,
            state: iris_types::TaskState::Running.code(),
            started_at_ms: Some(now),
            attempt_uid: uid(),
            worker_id: "peer-worker".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let job = m::MirrorJob {
        job_id: job_id.into(),
        state: state.code(),
        started_at_ms: Some(now),
        num_tasks: 1,
        ..Default::default()
    };
    m::apply_mirror(&tx, "west", &job, std::slice::from_ref(&task), now).expect("mirror root");
    let child = m::MirrorJob {
        job_id: format!("{job_id}/eval"),
        ..job.clone()
    };
    let mut child_task = task.clone();
    child_task.attempts[0].attempt_uid = uid();
    m::apply_mirror(&tx, "west", &child, &[child_task], now).expect("mirror child");
    tx.commit().expect("commit");
}

/// Issue 18, federation faults: the peer restarted from a checkpoint older than a handoff, so
/// its full snapshot lacks a root it had accepted. That root is wound back (children gone, its
/// task PENDING without attempts) and queued for delivery to the same peer again; roots the
/// snapshot has, and roots that already ended here, are left alone.
#[test]
fn a_handed_off_job_the_peers_snapshot_lacks_is_delivered_again() {
    let ctl = hub();
    heartbeat(&ctl, "west", 8);
    for j in ["/alice/lost", "/alice/kept", "/alice/done"] {
        queue_gpu_job(&ctl, j, iris_store::now_ms(), None);
    }
    tick_pass(&ctl).expect("pass");
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        for j in ["/alice/lost", "/alice/kept", "/alice/done"] {
            assert_eq!(sf::handle(&tx, j).expect("h").expect("h").peer_id, "west");
            assert!(sf::mark_handed_off(&tx, j, iris_store::now_ms()).expect("mark"));
        }
        tx.commit().expect("commit");
    }
    mirror_running(&ctl, "/alice/lost", JobState::Running);
    mirror_running(&ctl, "/alice/kept", JobState::Running);
    mirror_running(&ctl, "/alice/done", JobState::Succeeded);
    let nonce = handle(&ctl, "/alice/lost").nonce;

    let snapshot = vec![c::FederationJobDelta {
        job_id: "/alice/kept".into(),
        ..Default::default()
    }];
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        super::super::loops::redeliver_lost(&tx, "west", &snapshot).expect("reconcile");
        tx.commit().expect("commit");
    }

    let lost = handle(&ctl, "/alice/lost");
    assert_eq!(lost.handoff_state, sf::PENDING);
    assert_eq!(lost.peer_id, "west");
    assert_eq!(
        lost.nonce, nonce,
        "the same handoff, so a lost answer stays idempotent"
    );
    assert_eq!(job_row(&ctl, "/alice/lost").state, JobState::Pending.code());
    assert!(
        crate::views::job(&*ctl.db(), "/alice/lost/eval", &Default::default())
            .expect("read")
            .is_none()
    );
    let task = crate::views::task(&*ctl.db(), "/alice/lost/0", &Default::default())
        .expect("read")
        .expect("task");
    assert_eq!(task.state, Some(iris_types::TaskState::Pending.code()));
    assert!(task.attempts.is_empty(), "{:?}", task.attempts);
    assert!(task.status_message().contains("no longer has this job"));
    let queued: Vec<String> = sf::deliveries(&*ctl.db(), "west", 10)
        .expect("deliveries")
        .into_iter()
        .map(|d| d.job_id)
        .collect();
    assert_eq!(queued, vec!["/alice/lost".to_string()]);

    for (j, state) in [
        ("/alice/kept", JobState::Running),
        ("/alice/done", JobState::Succeeded),
    ] {
        assert_eq!(handle(&ctl, j).handoff_state, sf::HANDED_OFF, "{j}");
        assert_eq!(job_row(&ctl, j).state, state.code(), "{j}");
        assert!(
            crate::views::job(&*ctl.db(), &format!("{j}/eval"), &Default::default())
                .expect("read")
                .is_some()
        );
    }
}
