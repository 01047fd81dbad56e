//! The peer-side rules: who may hand us a job, and which jobs a requester may act on.

use super::*;
use crate::auth::{with_caller, AuthConfig, Identity};
use crate::testutil::{controller, controller_with, insert_job_at, request, TestCtl};
use iris_auth::Role;
use std::collections::BTreeMap;

fn name(s: &str) -> iris_types::JobName {
    iris_types::JobName::parse(s).expect("job name")
}

fn handoff(requester: &str, submitter: &str) -> c::FederationHandoff {
    c::FederationHandoff {
        requester_id: requester.into(),
        owner_principal: submitter.into(),
        submitting_user: submitter.into(),
        handoff_nonce: "n1".into(),
    }
}

fn code(r: Result<()>) -> Option<Code> {
    r.err().map(|e| e.to_wire().code)
}

/// A peer whose auth admits handoffs of `*@example.com` users.
fn guarded_peer() -> TestCtl {
    controller_with(|c| {
        c.auth = Some(AuthConfig {
            issuer: "east".into(),
            keypair: iris_auth::Keypair::generate(),
            previous_public_keys: Vec::new(),
            enforcing: true,
            trusted_cidrs: Vec::new(),
            admin_users: Vec::new(),
            user_roles: BTreeMap::new(),
            optional: false,
            federation_peers: BTreeMap::new(),
            allowed_submitters: vec!["*@example.com".into()],
            iap: None,
        });
    })
}

fn as_caller(user: &str, role: Role) -> Identity {
    Identity {
        user_id: user.into(),
        role,
        job_id: None,
        anonymous: false,
    }
}

#[test]
fn a_handoff_must_be_a_root_job_with_a_requester() {
    let ctl = controller();
    let ok = handoff("hub", "alice@example.com");
    assert_eq!(code(ctl.check_handoff(&name("/alice/train"), &ok)), None);
    assert_eq!(
        code(ctl.check_handoff(&name("/alice/train/eval"), &ok)),
        Some(Code::InvalidArgument)
    );
    let anonymous_requester = handoff("  ", "alice@example.com");
    assert_eq!(
        code(ctl.check_handoff(&name("/alice/train"), &anonymous_requester)),
        Some(Code::InvalidArgument)
    );
}

#[tokio::test]
async fn with_auth_only_the_named_peer_may_hand_off_admitted_users_jobs() {
    let ctl = guarded_peer();
    let job = name("/alice/train");
    let check = |who: Identity, f: c::FederationHandoff| {
        let ctl = &ctl;
        let job = &job;
        with_caller(who, async move { code(ctl.check_handoff(job, &f)) })
    };
    let hub = || as_caller("hub", Role::FederationPeer);

    assert_eq!(
        check(hub(), handoff("hub", "alice@example.com")).await,
        None
    );
    assert_eq!(
        check(hub(), handoff("other-hub", "alice@example.com")).await,
        Some(Code::PermissionDenied),
        "the requester must be the token's issuer"
    );
    assert_eq!(
        check(hub(), handoff("hub", "mallory@evil.test")).await,
        Some(Code::PermissionDenied),
        "not in allowed_submitters"
    );
    assert_eq!(
        check(hub(), handoff("hub", "local_admin")).await,
        Some(Code::PermissionDenied),
        "the anonymous admin's jobs never federate"
    );
    assert_eq!(
        check(hub(), handoff("hub", "")).await,
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        check(
            as_caller("alice@example.com", Role::User),
            handoff("hub", "alice@example.com")
        )
        .await,
        Some(Code::PermissionDenied),
        "a user cannot pose as a peer"
    );
    assert_eq!(
        check(
            as_caller("root", Role::Admin),
            handoff("hub", "alice@example.com")
        )
        .await,
        None
    );
}

#[test]
fn a_requester_may_only_act_on_jobs_it_handed_to_us() {
    let ctl = controller();
    insert_job_at(
        &ctl,
        &request("/alice/received", 1, 1000),
        iris_store::now_ms(),
        None,
    );
    insert_job_at(
        &ctl,
        &request("/alice/ours", 1, 1000),
        iris_store::now_ms(),
        None,
    );
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        sf::insert_handle(
            &tx,
            "/alice/received",
            sf::RECEIVED,
            "hub",
            "alice",
            sf::HANDED_OFF,
            "n",
        )
        .expect("received handle");
        // A job we sent to "hub" ourselves is not one it handed us.
        sf::insert_handle(
            &tx,
            "/alice/ours",
            sf::SENT,
            "hub",
            "alice",
            sf::PENDING,
            "m",
        )
        .expect("sent handle");
        tx.commit().expect("commit");
    }
    assert_eq!(
        code(ctl.check_received_from("/alice/received", "hub")),
        None
    );
    assert_eq!(
        code(ctl.check_received_from("/alice/received/child/0", "hub")),
        None,
        "descendants belong to the root's requester"
    );
    for (job, requester) in [
        ("/alice/received", "other-hub"),
        ("/alice/ours", "hub"),
        ("/alice/unknown", "hub"),
    ] {
        assert_eq!(
            code(ctl.check_received_from(job, requester)),
            Some(Code::PermissionDenied),
            "{job} from {requester}"
        );
    }
}

/// A received job, with the change-log row the peer writes when it accepts it.
fn receive(ctl: &Controller, job: &str) {
    insert_job_at(ctl, &request(job, 1, 1000), iris_store::now_ms(), None);
    let mut conn = ctl.db();
    let tx = conn.begin().expect("tx");
    sf::insert_handle(&tx, job, sf::RECEIVED, "hub", "alice", sf::HANDED_OFF, "n")
        .expect("received handle");
    sf::append_changelog(&tx, job, "hub", None, false).expect("log");
    tx.commit().expect("commit");
}

async fn sync(ctl: &Controller, cursor: &str) -> c::FederationSyncResponse {
    ctl.federation_sync(c::FederationSyncRequest {
        requester_id: "hub".into(),
        cursor: cursor.into(),
        budget_policy: None,
    })
    .await
    .expect("sync")
}

/// Issue 18, federation faults: a peer restored from a checkpoint older than a hub's cursor
/// must not answer that cursor with "nothing new" (or with the new history's tail): every cursor
/// of its previous life reads as stale, so the hub gets the full set and can see what is gone.
#[tokio::test]
async fn after_a_restore_every_cursor_of_the_previous_history_is_stale() {
    let ctl = controller();
    receive(&ctl, "/alice/kept");
    let first = sync(&ctl, "").await;
    assert!(first.cursor_stale, "an empty cursor gets everything");
    assert_eq!(first.deltas.len(), 1);
    // In step: nothing new, not stale.
    let caught_up = sync(&ctl, &first.next_cursor).await;
    assert!(!caught_up.cursor_stale);
    assert!(caught_up.deltas.is_empty());
    // The hub saw more of this history than the checkpoint holds.
    receive(&ctl, "/alice/after-the-checkpoint");
    let ahead = sync(&ctl, &first.next_cursor).await.next_cursor;
    let ahead_n: i64 = ahead.parse().expect("cursor");
    // A cursor the log never issued is stale (as after a restore, before any new change).
    let beyond = sync(&ctl, &(ahead_n + 5).to_string()).await;
    assert!(beyond.cursor_stale);
    assert_eq!(beyond.deltas.len(), 2);

    // The restore: a new history.
    {
        let mut conn = ctl.db();
        let tx = conn.begin().expect("tx");
        sf::start_new_history(&tx, iris_store::now_ms()).expect("new history");
        tx.commit().expect("commit");
    }
    let before_any_change = sync(&ctl, &ahead).await;
    assert!(before_any_change.cursor_stale, "no rows yet, cursor beyond");
    // New changes number above anything the previous history issued: the old cursor still
    // reads as stale rather than as a position in the new history.
    receive(&ctl, "/alice/new");
    let after = sync(&ctl, &ahead).await;
    assert!(after.cursor_stale, "an old cursor after new changes");
    assert_eq!(after.deltas.len(), 3, "the full set");
    let new_cursor: i64 = after.next_cursor.parse().expect("cursor");
    assert!(new_cursor > ahead_n, "{new_cursor} > {ahead_n}");
    let in_step = sync(&ctl, &after.next_cursor).await;
    assert!(!in_step.cursor_stale && in_step.deltas.is_empty());
}
