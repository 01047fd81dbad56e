//! `iris.inspect.InspectService/ExplainTask`: every worker's verdict for a pending task,
//! computed by [`iris_scheduler::explain`] over the snapshot the control tick reads
//! ([`crate::tick::read_snapshot`]) with the tick's policy, so it cannot disagree with placement.
//!
//! Access: like `ListTaskEvents`, the job's owner, an admin or the dashboard role (an
//! explanation names workers and what holds them).

use crate::error::{Error, Result};
use crate::{lock, Controller};
use iris_auth::Role;
use iris_proto::inspect as pb;
use iris_scheduler::{Policy, Verdict};
use iris_types::{AttrValue, TaskId, TaskState};

impl Controller {
    pub(crate) async fn explain_task(
        &self,
        req: pb::ExplainTaskRequest,
    ) -> Result<pb::ExplainTaskResponse> {
        let task =
            TaskId::parse(&req.task_id).map_err(|e| Error::invalid(format!("task_id: {e}")))?;
        let caller = crate::auth::caller();
        // Checked before the lookup, so a refusal does not reveal whether the task exists.
        if caller.role != Role::Dashboard {
            crate::auth::check_owner(&caller, task.job.as_str(), "explain tasks of job")?;
        }
        let reasons = lock(&self.pending_reasons).only(&req.task_id);
        let reason = reasons.get(&req.task_id).cloned();
        let (status, snapshot, job_band) = {
            let snap = lock(&self.snap);
            let generation = iris_store::workers::generation();
            let tx = snap.begin_read()?;
            let Some(status) = crate::views::task(&tx, &req.task_id, &reasons)? else {
                return Err(Error::not_found(format!(
                    "task {} not found; `iris task list {}` shows the job's tasks",
                    req.task_id,
                    task.job.as_str()
                )));
            };
            let job_band = self.spec(&tx, task.job.as_str())?.map(|s| s.band);
            (
                status,
                crate::tick::read_snapshot(self, &tx, generation)?,
                job_band,
            )
        };
        let state = TaskState::from_code(status.state.unwrap_or_default());
        let mut out = pb::ExplainTaskResponse {
            task_id: req.task_id.clone(),
            state: status.state.unwrap_or_default(),
            band: job_band.map(|b| b.name().to_string()).unwrap_or_default(),
            pending_reason: reason.unwrap_or_default(),
            ..Default::default()
        };
        if state != Some(TaskState::Pending) {
            let name = state.map_or_else(
                || format!("state {}", status.state.unwrap_or_default()),
                |s| s.friendly().to_string(),
            );
            out.note = format!(
                "task {} is {name}, not pending: there is no placement to explain",
                req.task_id
            );
            return Ok(out);
        }
        let Some(e) = iris_scheduler::explain(&snapshot, &Policy::default(), &req.task_id) else {
            out.note = format!(
                "task {} is pending but not waiting for a worker of this cluster (it is handed to a federation peer, or its job is being replaced)",
                req.task_id
            );
            return Ok(out);
        };
        out.pending = true;
        out.effective_band = e.band.name().to_string();
        if job_band.is_some_and(|b| b != e.band) {
            out.note = format!(
                "the owner's budget is spent: placed as {} instead of {}",
                e.band.name(),
                out.band
            );
        }
        if let Some((key, n)) = &e.gang {
            out.group_by = key.clone();
            out.gang_size = i32::try_from(*n).unwrap_or(i32::MAX);
        }
        let only = req.worker_id.trim();
        if !only.is_empty() && !e.workers.iter().any(|v| v.worker == only) {
            return Err(Error::not_found(format!(
                "worker_id: no worker {only} is registered; `iris cluster status` lists the workers"
            )));
        }
        out.workers = e
            .workers
            .iter()
            .filter(|v| only.is_empty() || v.worker == only)
            .map(|v| verdict_to_wire(&v.worker, &v.verdict))
            .collect();
        Ok(out)
    }
}

fn verdict_to_wire(worker: &str, v: &Verdict) -> pb::WorkerVerdict {
    let mut out = pb::WorkerVerdict {
        worker_id: worker.to_string(),
        rule: v.rule().to_string(),
        detail: v.to_string(),
        ..Default::default()
    };
    match v {
        Verdict::Constraint { constraint, value } => {
            out.constraint = constraint.to_string();
            out.attribute_value = value.as_ref().map(|a| match a {
                AttrValue::Str(s) => s.clone(),
                AttrValue::Int(i) => i.to_string(),
                AttrValue::Float(f) => f.to_string(),
            });
        }
        Verdict::Resources { short, .. } => {
            out.short = short
                .iter()
                .map(|s| pb::ResourceShortfall {
                    resource: s.dim.name().to_string(),
                    requested: s.requested,
                    free: s.free,
                    total: s.total,
                })
                .collect();
        }
        Verdict::Fits
        | Verdict::Unhealthy
        | Verdict::NoGroupAttribute { .. }
        | Verdict::BuildBackpressure { .. }
        | Verdict::GroupTooSmall { .. } => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::auth::{with_caller, Identity};
    use crate::testutil::{controller, launch, register, request, task_state, GIB};
    use iris_auth::Role;
    use iris_proto::inspect as pb;
    use iris_rpc::Code;
    use iris_types::TaskState;

    fn req(task: &str, worker: &str) -> pb::ExplainTaskRequest {
        pb::ExplainTaskRequest {
            task_id: task.into(),
            worker_id: worker.into(),
        }
    }

    fn who(user: &str, role: Role) -> Identity {
        Identity {
            user_id: user.into(),
            role,
            job_id: None,
            anonymous: false,
        }
    }

    #[tokio::test]
    async fn explains_over_the_ticks_snapshot_and_only_for_pending_tasks() {
        let ctl = controller();
        register(&ctl, "w1", 4, 16 * GIB);
        launch(&ctl, request("/alice/small", 2, 1000)).await;
        launch(&ctl, request("/alice/big", 1, 4000)).await;
        // Before any tick nothing holds w1: the 4-core task fits there.
        let e = ctl
            .explain_task(req("/alice/big/0", ""))
            .await
            .expect("explain");
        assert!(e.pending);
        assert_eq!(e.workers.len(), 1);
        assert_eq!(e.workers[0].rule, "fits", "{}", e.workers[0].detail);

        crate::tick::tick(&ctl).expect("tick");
        assert_eq!(task_state(&ctl, "/alice/big/0"), TaskState::Pending);
        let e = ctl
            .explain_task(req("/alice/big/0", "w1"))
            .await
            .expect("explain");
        assert_eq!(e.band, "interactive");
        assert!(
            !e.pending_reason.is_empty(),
            "the tick's reason comes along"
        );
        let v = &e.workers[0];
        assert_eq!((v.worker_id.as_str(), v.rule.as_str()), ("w1", "resources"));
        assert_eq!(v.short.len(), 1);
        assert_eq!(
            (
                v.short[0].resource.as_str(),
                v.short[0].requested,
                v.short[0].free
            ),
            ("cpu", 4000, 2000)
        );
        assert!(v.detail.starts_with("cpu short by 2000m"), "{}", v.detail);

        // An assigned task has nothing to explain, and says which state it is in.
        let e = ctl
            .explain_task(req("/alice/small/0", ""))
            .await
            .expect("explain");
        assert!(!e.pending && e.workers.is_empty());
        assert_eq!(e.state, TaskState::Assigned.code());
        assert!(e.note.contains("is assigned, not pending"), "{}", e.note);

        let err = |r: crate::error::Result<pb::ExplainTaskResponse>| {
            r.map(|_| ()).expect_err("refused").to_wire()
        };
        let e = err(ctl.explain_task(req("/alice/big/0", "w9")).await);
        assert_eq!(e.code, Code::NotFound);
        assert!(
            e.message.starts_with("worker_id: no worker w9"),
            "{}",
            e.message
        );
        let e = err(ctl.explain_task(req("/alice/nope/0", "")).await);
        assert_eq!(e.code, Code::NotFound);
        let e = err(ctl.explain_task(req("alice", "")).await);
        assert!(e.message.starts_with("task_id:"), "{}", e.message);

        // The owner, an admin or the dashboard role; not another user.
        let as_bob = with_caller(
            who("bob", Role::User),
            ctl.explain_task(req("/alice/big/0", "")),
        );
        assert_eq!(err(as_bob.await).code, Code::PermissionDenied);
        for id in [who("alice", Role::User), who("dash", Role::Dashboard)] {
            let r = with_caller(id, ctl.explain_task(req("/alice/big/0", ""))).await;
            assert!(r.is_ok());
        }
    }
}
