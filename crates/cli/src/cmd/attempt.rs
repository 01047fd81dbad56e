//! `iris attempt ...`: one attempt of a task (`<task>:<N>`): describe it, show its logs and
//! events, preempt or fail it, and profile it while it runs.

use super::logs::logs;
use super::task::{kick, task_events};
use crate::client::{call, controller_client};
use crate::{output, AttemptCmd};
use iris_proto::cluster::controller as c;

pub(crate) async fn run(a: AttemptCmd, url: Option<String>) -> anyhow::Result<i32> {
    let cl = controller_client(&url)?;
    match a {
        AttemptCmd::Describe { attempt_id } => {
            let id =
                iris_types::AttemptId::parse(&attempt_id).map_err(|e| anyhow::anyhow!("{e}"))?;
            let r: c::GetTaskStatusResponse = call(
                &cl,
                "GetTaskStatus",
                &c::GetTaskStatusRequest {
                    task_id: id.task.to_string(),
                },
            )
            .await?;
            let t = r.task.unwrap_or_default();
            let att = t
                .attempts
                .iter()
                .find(|x| x.attempt_id() as u32 == id.attempt)
                .ok_or_else(|| anyhow::anyhow!("attempt {attempt_id} not found"))?;
            output::print_attempt(&id.to_string(), att);
            Ok(0)
        }
        AttemptCmd::Logs(l) => {
            iris_types::AttemptId::parse(&l.target).map_err(|e| anyhow::anyhow!("{e}"))?;
            let src = l.target.clone();
            logs(&cl, &l, &src, 1, None).await
        }
        AttemptCmd::Wait { attempt_id } => {
            let id =
                iris_types::AttemptId::parse(&attempt_id).map_err(|e| anyhow::anyhow!("{e}"))?;
            let state =
                super::task::wait_for_task(&cl, &id.task.to_string(), Some(id.attempt)).await?;
            println!("{}", state.friendly());
            Ok(if state == iris_types::TaskState::Succeeded {
                0
            } else {
                1
            })
        }
        AttemptCmd::Events { attempt_id, limit } => {
            let id =
                iris_types::AttemptId::parse(&attempt_id).map_err(|e| anyhow::anyhow!("{e}"))?;
            let n = i32::try_from(id.attempt).map_err(|_| {
                anyhow::anyhow!("{attempt_id}: attempt number {} is too large", id.attempt)
            })?;
            task_events(&cl, &id.task.to_string(), Some(n), limit).await
        }
        AttemptCmd::Preempt(b) => kick(&cl, &b, 10).await,
        AttemptCmd::Fail(b) => kick(&cl, &b, 5).await,
        AttemptCmd::Profile {
            attempt_id,
            profile,
        } => {
            let id =
                iris_types::AttemptId::parse(&attempt_id).map_err(|e| anyhow::anyhow!("{e}"))?;
            super::process::run_profile(&cl, id.to_string(), &profile).await
        }
    }
}
