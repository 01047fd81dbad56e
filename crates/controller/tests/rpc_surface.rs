//! The controller's Connect surface as the published Python client meets it: a real server on
//! 127.0.0.1 with no workers (tasks stay PENDING), called over HTTP with the Rust client.

use iris_controller::{start, ControllerConfig, RunningController};
use iris_proto::cluster::controller as c;
use iris_proto::job;
use iris_rpc::{Client, Code, RpcError};
use std::time::Duration;

const SVC: &str = "iris.cluster.ControllerService";

struct Harness {
    _dir: tempfile::TempDir,
    ctl: Option<RunningController>,
    client: Client,
}

impl Harness {
    async fn new() -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = ControllerConfig::local(dir.path().to_path_buf());
        cfg.revision_date = Some("2026-10-24".into());
        let ctl = start(cfg).await.expect("controller starts");
        let client = Client::new(&ctl.url()).expect("client");
        Harness {
            _dir: dir,
            ctl: Some(ctl),
            client,
        }
    }

    async fn call<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        method: &str,
        req: &Req,
    ) -> Result<Resp, RpcError> {
        self.client
            .call(SVC, method, req, Duration::from_secs(30))
            .await
    }

    async fn launch(&self, name: &str, replicas: i32, bundle: Vec<u8>) -> Result<String, RpcError> {
        let req = c::LaunchJobRequest {
            name: Some(name.into()),
            entrypoint: Some(job::RuntimeEntrypoint {
                run_command: Some(job::CommandEntrypoint {
                    argv: vec!["true".into()],
                }),
                ..Default::default()
            }),
            resources: Some(job::ResourceSpecProto {
                cpu_millicores: 1000,
                memory_bytes: 2 << 30,
                ..Default::default()
            }),
            replicas: Some(replicas),
            bundle_blob: Some(bundle),
            client_revision_date: Some("2026-10-24".into()),
            ..Default::default()
        };
        let r: c::LaunchJobResponse = self.call("LaunchJob", &req).await?;
        Ok(r.job_id)
    }

    async fn stop(mut self) {
        if let Some(c) = self.ctl.take() {
            c.shutdown().await;
        }
    }
}

#[tokio::test]
async fn launch_accepts_a_workspace_bundle_larger_than_two_mib() {
    let h = Harness::new().await;
    // The published client sends bundles of up to 25 MiB inline in LaunchJob.
    let bundle: Vec<u8> = (0..(6u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let id = h
        .launch("/alice/big-bundle", 1, bundle)
        .await
        .expect("a 6 MiB bundle is accepted");
    assert_eq!(id, "/alice/big-bundle");
    h.stop().await;
}

#[tokio::test]
async fn kick_targets_resolve_like_the_reference() {
    let h = Harness::new().await;
    h.launch("/alice/pend", 2, Vec::new()).await.unwrap();
    let kick = |targets: &[&str], desired: job::TaskState| c::KickTasksRequest {
        targets: targets.iter().map(|s| s.to_string()).collect(),
        desired_state: desired as i32,
        reason: String::new(),
    };
    let r: c::KickTasksResponse = h
        .call(
            "KickTasks",
            &kick(
                &[
                    "/alice/pend/0",
                    "/alice/pend/0:3",
                    "/alice/pend",
                    "/alice/pend:1",
                    "/alice/nope/0",
                    "/alice/nope",
                    "nonsense",
                ],
                job::TaskState::Preempted,
            ),
        )
        .await
        .unwrap();
    let got: Vec<(&str, &str, bool, &str)> = r
        .results
        .iter()
        .map(|k| {
            (
                k.target.as_str(),
                k.task_id.as_str(),
                k.queued,
                k.detail.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got[0],
        (
            "/alice/pend/0",
            "/alice/pend/0",
            false,
            "task is pending, not running on a worker"
        )
    );
    assert_eq!(
        got[1],
        (
            "/alice/pend/0:3",
            "/alice/pend/0",
            false,
            "attempt 3 is not current (current is -1)"
        )
    );
    assert_eq!(
        got[2],
        (
            "/alice/pend",
            "/alice/pend",
            false,
            "job has no tasks running on a worker"
        )
    );
    assert_eq!(
        got[3],
        (
            "/alice/pend:1",
            "",
            false,
            "a job target cannot carry an ':attempt' suffix"
        )
    );
    assert_eq!(got[4], ("/alice/nope/0", "", false, "task not found"));
    assert_eq!(got[5], ("/alice/nope", "", false, "job not found"));
    assert_eq!((got[6].0, got[6].2), ("nonsense", false));
    assert_eq!(got.len(), 7);

    let e = h
        .call::<_, c::KickTasksResponse>("KickTasks", &kick(&[], job::TaskState::Failed))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    let e = h
        .call::<_, c::KickTasksResponse>(
            "KickTasks",
            &kick(&["/alice/pend/0"], job::TaskState::Running),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    h.stop().await;
}

#[tokio::test]
async fn list_users_and_scheduler_state_report_pending_work_and_budgets() {
    let h = Harness::new().await;
    h.launch("/alice/a", 2, Vec::new()).await.unwrap();
    let _: c::SetUserBudgetResponse = h
        .call(
            "SetUserBudget",
            &c::SetUserBudgetRequest {
                user_id: "bob".into(),
                budget_limit: 50,
                max_band: job::PriorityBand::Batch as i32,
            },
        )
        .await
        .unwrap();

    let users: c::ListUsersResponse = h.call("ListUsers", &c::ListUsersRequest {}).await.unwrap();
    let names: Vec<&str> = users.users.iter().map(|u| u.user()).collect();
    assert_eq!(names, ["alice", "bob"], "users with active jobs first");
    let alice = &users.users[0];
    assert_eq!(alice.job_state_counts["pending"], 1);
    assert_eq!(alice.job_state_counts["succeeded"], 0);
    assert_eq!(alice.task_state_counts["pending"], 2);
    assert_eq!(alice.task_state_counts["running"], 0);
    assert_eq!(alice.job_state_counts.len(), 8);
    assert_eq!(alice.task_state_counts.len(), 11);
    assert_eq!(users.users[1].job_state_counts["pending"], 0);

    let s: c::GetSchedulerStateResponse = h
        .call("GetSchedulerState", &c::GetSchedulerStateRequest {})
        .await
        .unwrap();
    assert_eq!((s.total_pending, s.total_running), (2, 0));
    assert_eq!(s.pending_buckets.len(), 1);
    let b = &s.pending_buckets[0];
    assert_eq!(
        (b.band, b.user_id.as_str(), b.job_id.as_str(), b.count),
        (
            job::PriorityBand::Interactive as i32,
            "alice",
            "/alice/a",
            2
        )
    );
    // Only bob has a budget row, and alice has no active spend yet.
    assert_eq!(s.user_budgets.len(), 1);
    let bob = &s.user_budgets[0];
    assert_eq!(
        (
            bob.user_id.as_str(),
            bob.budget_limit,
            bob.budget_spent,
            bob.max_band
        ),
        ("bob", 50, 0, job::PriorityBand::Batch as i32)
    );
    assert_eq!(bob.effective_band, job::PriorityBand::Interactive as i32);

    let e = h
        .call::<_, c::GetUserBudgetResponse>(
            "GetUserBudget",
            &c::GetUserBudgetRequest {
                user_id: String::new(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    let d: c::GetUserBudgetResponse = h
        .call(
            "GetUserBudget",
            &c::GetUserBudgetRequest {
                user_id: "carol".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (d.budget_limit, d.max_band),
        (1000, job::PriorityBand::Interactive as i32)
    );
    h.stop().await;
}

#[tokio::test]
async fn unknown_methods_are_unimplemented_and_unknown_paths_a_plain_404() {
    let h = Harness::new().await;
    // A known service without the method: Connect `unimplemented` (HTTP 501, JSON), never retried.
    let e = h
        .call::<_, job::Empty>("NoSuchMethod", &job::Empty {})
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unimplemented);
    assert!(e.message.contains("NoSuchMethod"), "{e}");
    // A path no route serves: a bare 404 (the client maps it to UNIMPLEMENTED), never a 503.
    let e = h
        .client
        .call::<_, job::Empty>("no/such/x.Y", "Z", &job::Empty {}, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unimplemented);
    assert!(e.message.starts_with("HTTP 404"), "{e}");
    h.stop().await;
}
