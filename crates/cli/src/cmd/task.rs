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

/// `iris task explain`: the ExplainTask verdicts as a table (worker, verdict, detail), or the
/// state of a task that is not pending.
async fn explain(
    cl: &Client,
    task_id: String,
    worker: Option<String>,
    json: bool,
) -> anyhow::Result<i32> {
    iris_types::TaskId::parse(&task_id).map_err(|e| anyhow::anyhow!("task id: {e}"))?;
    let r: iris_proto::inspect::ExplainTaskResponse = call_inspect(
        cl,
        "ExplainTask",
        &iris_proto::inspect::ExplainTaskRequest {
            task_id,
            worker_id: worker.unwrap_or_default(),
        },
    )
    .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(0);
    }
    print_explanation(&r);
    Ok(0)
}

fn print_explanation(r: &iris_proto::inspect::ExplainTaskResponse) {
    if !r.pending {
        println!("{}", r.note);
        return;
    }
    let band = if r.effective_band.is_empty() || r.effective_band == r.band {
        r.band.clone()
    } else {
        format!("{} (placed as {})", r.band, r.effective_band)
    };
    println!("task {}: pending, band {band}", r.task_id);
    if r.gang_size > 0 {
        println!(
            "coscheduled: {} members on workers sharing one value of '{}'",
            r.gang_size, r.group_by
        );
    }
    if !r.note.is_empty() {
        println!("note: {}", r.note);
    }
    if !r.pending_reason.is_empty() {
        println!("last tick: {}", r.pending_reason);
    }
    if r.workers.is_empty() {
        println!("no workers are registered");
        return;
    }
    let rows: Vec<Vec<String>> = r
        .workers
        .iter()
        .map(|v| vec![v.worker_id.clone(), v.rule.clone(), v.detail.clone()])
        .collect();
    output::table(&["WORKER", "VERDICT", "DETAIL"], &rows);
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
    if !r.error().is_empty() {
        eprintln!("Error: {}", r.error());
        return Ok(1);
    }
    use std::io::Write;
    print!("{}", r.stdout());
    eprint!("{}", r.stderr());
    let _ = std::io::stdout().flush();
    Ok(r.exit_code())
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
        TaskCmd::Explain {
            task_id,
            worker,
            json,
        } => explain(&cl, task_id, worker, json).await,
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
                .find(|x| x.attempt_id() as u32 == n)
                .map(|x| x.state)
                .ok_or_else(|| anyhow::anyhow!("attempt {task_id}:{n} not found"))?,
        };
        let state = iris_types::TaskState::from_code(code.unwrap_or_default())
            .unwrap_or(iris_types::TaskState::Pending);
        if state.is_terminal() {
            return Ok(state);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(std::time::Duration::from_secs(2));
    }
}
