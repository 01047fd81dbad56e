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
            key: k.into(),
            op: 0,
            value: Some(crate::spec::attr_to_proto(&iris_types::AttrValue::Str(
                v.into(),
            ))),
            values: Vec::new(),
            mode: 0,
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
