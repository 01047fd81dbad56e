//! `iris task ...`: listing and describing a job's tasks, their logs and events, the bulk
//! `preempt`/`fail` actions ([`kick`], shared with `iris attempt`), and `exec` and `profile`
//! against a running task.

use super::bulk_ids;
use super::logs::logs;
use crate::client::{call, call_inspect, controller_client};
use crate::{output, BulkArgs, TaskCmd};
use iris_proto::cluster::controller as c;
use iris_rpc::Client;

/// Prints `ListTaskEvents` for a task (optionally one attempt), with a note on stderr when
/// earlier events were left out.
pub(crate) async fn task_events(
    cl: &Client,
    task_id: &str,
    attempt_id: Option<i32>,
    limit: i32,
) -> anyhow::Result<i32> {
    let r: iris_proto::inspect::ListTaskEventsResponse = call_inspect(
        cl,
        "ListTaskEvents",
        &iris_proto::inspect::ListTaskEventsRequest {
            task_id: task_id.to_string(),
            attempt_id,
            limit,
        },
    )
    .await?;
    output::print_events(&r.events);
    if r.omitted > 0 {
        eprintln!(
            "({} earlier event(s) not shown; pass --limit up to 10000 to see more)",
            r.omitted
        );
    }
    Ok(0)
}

pub(crate) async fn kick(cl: &Client, b: &BulkArgs, desired: i32) -> anyhow::Result<i32> {
    let ids = bulk_ids(b)?;
    if b.dry_run {
        for i in &ids {
            println!(
                "Would {} {i}",
                if desired == 10 { "preempt" } else { "fail" }
            );
        }
        return Ok(0);
    }
    let r: c::KickTasksResponse = call(
        cl,
        "KickTasks",
        &c::KickTasksRequest {
            targets: ids,
            desired_state: desired,
            reason: b.reason.clone().unwrap_or_default(),
        },
    )
    .await?;
    let mut bad = 0;
    for x in r.results {
        if x.queued {
            println!(
                "{} {}: {}",
                if desired == 10 { "Preempted" } else { "Failed" },
                x.task_id,
                x.detail
            );
        } else {
            bad += 1;
            eprintln!("{}: {}", x.target, x.detail);
        }
    }
    Ok(if bad > 0 { 1 } else { 0 })
}

/// `iris task exec TASK_ID [--timeout S] -- CMD...`.
#[derive(clap::Args)]
pub(crate) struct ExecArgs {
    task_id: String,
    /// Seconds the command may run (-1: no limit).
    #[arg(long, default_value_t = 60, allow_negative_numbers = true)]
    timeout: i32,
    /// The command (after `--` when it has options of its own).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Runs a command in the task's running attempt (its directory, environment and user) and
/// passes on its output and exit code.
async fn exec(cl: &Client, a: ExecArgs) -> anyhow::Result<i32> {
    let wait = match a.timeout {
        t if t < 0 => std::time::Duration::from_secs(7 * 24 * 3600),
        0 => std::time::Duration::from_secs(120),
        t => std::time::Duration::from_secs(t as u64 + 60),
    };
    let r: c::ExecInContainerResponse = cl
        .call(
            crate::client::SVC,
            "ExecInContainer",
            &c::ExecInContainerRequest {
                task_id: a.task_id,
                command: a.command,
                timeout_seconds: a.timeout,
            },
            wait,
        )
        .await?;
    if !r.error.is_empty() {
        eprintln!("Error: {}", r.error);
        return Ok(1);
    }
    use std::io::Write;
    print!("{}", r.stdout);
    eprint!("{}", r.stderr);
    let _ = std::io::stdout().flush();
    Ok(r.exit_code)
}

pub(crate) async fn run(t: TaskCmd, url: Option<String>) -> anyhow::Result<i32> {
    let cl = controller_client(&url)?;
    match t {
        TaskCmd::List { job_id } => {
            let r: c::ListTasksResponse =
                call(&cl, "ListTasks", &c::ListTasksRequest { job_id }).await?;
            output::print_tasks(&r.tasks);
            Ok(0)
        }
        TaskCmd::Describe { task_id } => {
            let r: c::GetTaskStatusResponse =
                call(&cl, "GetTaskStatus", &c::GetTaskStatusRequest { task_id }).await?;
            output::print_task(&r.task.unwrap_or_default());
            Ok(0)
        }
        TaskCmd::Logs(l) => {
            let src = format!("{}:", l.target);
            logs(&cl, &l, &src, 2, None).await
        }
        TaskCmd::Wait { task_id } => {
            iris_types::TaskId::parse(&task_id).map_err(|e| anyhow::anyhow!("{e}"))?;
            let state = wait_for_task(&cl, &task_id, None).await?;
            println!("{}", state.friendly());
            Ok(if state == iris_types::TaskState::Succeeded {
                0
            } else {
                1
            })
        }
        TaskCmd::Events { task_id, limit } => {
            iris_types::TaskId::parse(&task_id).map_err(|e| anyhow::anyhow!("{e}"))?;
            task_events(&cl, &task_id, None, limit).await
        }
        TaskCmd::Preempt(b) => kick(&cl, &b, 10).await,
        TaskCmd::Fail(b) => kick(&cl, &b, 5).await,
        TaskCmd::Exec(a) => exec(&cl, a).await,
        TaskCmd::Profile { task_id, profile } => {
            if iris_types::AttemptId::parse(&task_id).is_ok() {
                anyhow::bail!("task profile takes a task id; use `iris attempt profile {task_id}` for one attempt");
            }
            iris_types::TaskId::parse(&task_id).map_err(|e| anyhow::anyhow!("{e}"))?;
            super::process::run_profile(&cl, task_id, &profile).await
        }
    }
}

/// Polls the task (or one of its attempts) until it is terminal; returns its final state.
pub(crate) async fn wait_for_task(
    cl: &Client,
    task_id: &str,
    attempt: Option<u32>,
) -> anyhow::Result<iris_types::TaskState> {
    let mut delay = std::time::Duration::from_millis(100);
    loop {
        let r: c::GetTaskStatusResponse = call(
            cl,
            "GetTaskStatus",
            &c::GetTaskStatusRequest {
                task_id: task_id.to_string(),
            },
        )
        .await?;
        let t = r.task.unwrap_or_default();
        let code = match attempt {
            None => t.state,
            Some(n) => t
                .attempts
                .iter()
                .find(|x| x.attempt_id as u32 == n)
                .map(|x| x.state)
                .ok_or_else(|| anyhow::anyhow!("attempt {task_id}:{n} not found"))?,
        };
        let state =
            iris_types::TaskState::from_code(code).unwrap_or(iris_types::TaskState::Pending);
        if state.is_terminal() {
            return Ok(state);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(std::time::Duration::from_secs(2));
    }
}
