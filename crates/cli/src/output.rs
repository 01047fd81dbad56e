//! Output formats (a user contract: scripts parse these).

use iris_proto::finelog::logging as fl;
use iris_proto::job;
use iris_types::{JobState, TaskState};

fn job_state(s: i32) -> &'static str {
    JobState::from_code(s)
        .map(|s| s.friendly())
        .unwrap_or("unknown")
}
fn task_state(s: i32) -> &'static str {
    TaskState::from_code(s)
        .map(|s| s.friendly())
        .unwrap_or("unknown")
}

fn fmt_ts(t: Option<&iris_proto::time::Timestamp>) -> String {
    t.and_then(|t| chrono::DateTime::from_timestamp_millis(t.epoch_ms()))
        .map(|d| d.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}

pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{:<width$}", c, width = w[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(headers.iter().map(|s| s.to_string()).collect());
    for r in rows {
        line(r.clone());
    }
}

fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n).collect::<String>() + "…"
    }
}

pub fn print_jobs(jobs: &[job::JobStatus]) {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let reason = if !j.error().is_empty() {
                j.error()
            } else {
                j.pending_reason()
            };
            vec![
                j.job_id().to_owned(),
                job_state(j.state.unwrap_or_default()).into(),
                fmt_ts(j.submitted_at.as_ref()),
                cut(reason, 63),
            ]
        })
        .collect();
    table(&["JOB ID", "STATE", "SUBMITTED", "REASON"], &rows);
}

fn duration(t: &job::TaskStatus) -> String {
    match (&t.started_at, &t.finished_at) {
        (Some(s), Some(f)) => format!("{:.1}s", (f.epoch_ms() - s.epoch_ms()) as f64 / 1000.0),
        (Some(s), None) => format!("{:.1}s", (iris_now() - s.epoch_ms()) as f64 / 1000.0),
        _ => "-".into(),
    }
}

fn iris_now() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub fn print_job(j: &job::JobStatus, tasks: &[job::TaskStatus]) {
    println!("Job: {} ({})", j.job_id(), j.name());
    println!("State: {}", job_state(j.state.unwrap_or_default()));
    if j.cluster() != "local" {
        let peer = if j.cluster().is_empty() {
            "(a federation peer, not yet chosen)"
        } else {
            j.cluster()
        };
        let status = job::PeerStatus::try_from(j.peer_status.unwrap_or_default())
            .map(|p| {
                p.as_str_name()
                    .trim_start_matches("PEER_STATUS_")
                    .to_lowercase()
            })
            .unwrap_or_default();
        println!("Cluster: {peer} (handoff: {status})");
    }
    let counts: Vec<String> = j
        .task_state_counts
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("Tasks: {} ({})", j.task_count(), counts.join(", "));
    println!(
        "Failures: {}  Preemptions: {}",
        j.failure_count(),
        j.preemption_count()
    );
    if !j.error().is_empty() {
        println!("Error: {}", j.error());
    } else if !j.pending_reason().is_empty() {
        println!("Pending: {}", j.pending_reason());
    }
    println!();
    print_tasks(tasks);
}

pub fn print_tasks(tasks: &[job::TaskStatus]) {
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            let exit = if TaskState::from_code(t.state.unwrap_or_default())
                .map(|s| s.is_terminal())
                .unwrap_or(false)
            {
                t.exit_code.unwrap_or_default().to_string()
            } else {
                "-".into()
            };
            let diag = if !t.error().is_empty() {
                t.error()
            } else {
                t.pending_reason()
            };
            vec![
                t.task_id().to_owned(),
                task_state(t.state.unwrap_or_default()).into(),
                exit,
                duration(t),
                t.current_attempt_id().max(0).to_string(),
                t.worker_id().to_owned(),
                cut(diag, 80),
            ]
        })
        .collect();
    table(
        &[
            "TASK",
            "STATE",
            "EXIT",
            "DURATION",
            "ATTEMPTS",
            "WORKER",
            "DIAGNOSTIC",
        ],
        &rows,
    );
}

pub fn print_task(t: &job::TaskStatus) {
    println!("Task: {}", t.task_id());
    println!("State: {}", task_state(t.state.unwrap_or_default()));
    println!(
        "Worker: {}",
        if t.worker_id().is_empty() {
            "-"
        } else {
            t.worker_id()
        }
    );
    if !t.error().is_empty() {
        println!("Error: {}", t.error());
    }
    if !t.status_message().is_empty() {
        println!("Status: {}", t.status_message());
    }
    if !t.pending_reason().is_empty() {
        println!("Pending: {}", t.pending_reason());
    }
    println!();
    let rows: Vec<Vec<String>> = t
        .attempts
        .iter()
        .map(|a| {
            vec![
                a.attempt_id.unwrap_or_default().to_string(),
                a.attempt_uid.clone().unwrap_or_default(),
                task_state(a.state.unwrap_or_default()).into(),
                a.exit_code.unwrap_or_default().to_string(),
                a.worker_id.clone().unwrap_or_default(),
                cut(a.error(), 80),
            ]
        })
        .collect();
    table(
        &["ATTEMPT", "UID", "STATE", "EXIT", "WORKER", "REASON"],
        &rows,
    );
    if let Some(last) = t.attempts.iter().rev().find(|a| !a.error().is_empty()) {
        println!();
        println!("Root cause: {}", last.error());
    }
}

pub fn print_attempt(id: &str, a: &job::TaskAttempt) {
    println!("Attempt: {id}");
    println!("UID: {}", a.attempt_uid());
    println!("State: {}", task_state(a.state.unwrap_or_default()));
    println!("Worker: {}", a.worker_id());
    println!("Exit code: {}", a.exit_code());
    println!("Started: {}", fmt_ts(a.started_at.as_ref()));
    println!("Finished: {}", fmt_ts(a.finished_at.as_ref()));
    if !a.error().is_empty() {
        println!("Error: {}", a.error());
    }
}

pub fn print_log(e: &fl::LogEntry, source: &str) {
    let t = e
        .timestamp
        .as_ref()
        .and_then(|t| chrono::DateTime::from_timestamp_millis(t.epoch_ms))
        .map(|d| d.format("%H:%M:%S").to_string())
        .unwrap_or_default();
    let key = if e.key().is_empty() { source } else { e.key() };
    let task = key.rsplit_once(':').map(|x| x.0).unwrap_or(key);
    println!(
        "[{t}] task={task} attempt={} | {}",
        e.attempt_id(),
        e.data()
    );
}

pub fn print_workers(ws: &[iris_proto::cluster::controller::WorkerHealthStatus]) {
    let rows: Vec<Vec<String>> = ws
        .iter()
        .map(|w| {
            let md = w.metadata.clone().unwrap_or_default();
            let dev = match md.device.clone().and_then(|d| d.device) {
                Some(job::device_config::Device::Gpu(g)) => {
                    format!("gpu {}x{}", g.variant, g.count)
                }
                Some(job::device_config::Device::Tpu(t)) => {
                    format!("tpu {}x{}", t.variant, t.count)
                }
                _ => "cpu".into(),
            };
            vec![
                w.worker_id().to_owned(),
                if w.healthy() {
                    "healthy".into()
                } else {
                    "unhealthy".into()
                },
                w.address().to_owned(),
                md.cpu_count.unwrap_or_default().to_string(),
                format!("{}GiB", md.memory_bytes() >> 30),
                dev,
                w.running_job_ids.len().to_string(),
            ]
        })
        .collect();
    table(
        &[
            "WORKER", "HEALTH", "ADDRESS", "CPU", "MEMORY", "DEVICE", "TASKS",
        ],
        &rows,
    );
}

pub fn print_budgets(us: &[iris_proto::cluster::controller::GetUserBudgetResponse]) {
    let rows: Vec<Vec<String>> = us
        .iter()
        .map(|u| {
            vec![
                u.user_id.clone(),
                if u.budget_limit == 0 {
                    "unlimited".into()
                } else {
                    u.budget_limit.to_string()
                },
                u.budget_spent.to_string(),
                iris_types::Band::from_code(u.max_band)
                    .map(|b| b.name())
                    .unwrap_or("interactive")
                    .into(),
            ]
        })
        .collect();
    table(&["USER", "LIMIT", "SPENT", "MAX BAND"], &rows);
}

fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub fn print_query(r: &iris_proto::query::RawQueryResponse, format: &str) -> anyhow::Result<()> {
    let cols: Vec<String> = r.columns.iter().map(|c| c.name.clone()).collect();
    let rows: Vec<Vec<serde_json::Value>> = r
        .rows
        .iter()
        .map(|s| serde_json::from_str::<Vec<serde_json::Value>>(s))
        .collect::<Result<_, _>>()?;
    match format {
        "json" => {
            let objs: Vec<serde_json::Value> = rows
                .iter()
                .map(|r| {
                    serde_json::Value::Object(cols.iter().cloned().zip(r.iter().cloned()).collect())
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&objs)?);
        }
        "csv" => {
            let esc = |s: String| {
                if s.contains([',', '"', '\n']) {
                    format!("\"{}\"", s.replace('"', "\"\""))
                } else {
                    s
                }
            };
            println!(
                "{}",
                cols.iter().cloned().map(esc).collect::<Vec<_>>().join(",")
            );
            for r in &rows {
                println!(
                    "{}",
                    r.iter().map(|v| esc(cell(v))).collect::<Vec<_>>().join(",")
                );
            }
        }
        _ => {
            let hs: Vec<&str> = cols.iter().map(|s| s.as_str()).collect();
            let rs: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(cell).collect()).collect();
            table(&hs, &rs);
        }
    }
    Ok(())
}

/// `task events` / `attempt events`: one line per event, oldest first.
pub fn print_events(events: &[iris_proto::inspect::TaskEvent]) {
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            let ts = chrono::DateTime::from_timestamp_millis(e.ts_ms)
                .map(|d| d.format("%H:%M:%S%.3f").to_string())
                .unwrap_or_default();
            vec![
                ts,
                e.attempt_id.map(|a| a.to_string()).unwrap_or_default(),
                e.r#type.clone(),
                e.reason.clone(),
                e.message.clone(),
                e.source.clone(),
            ]
        })
        .collect();
    table(
        &["TIME", "ATTEMPT", "TYPE", "REASON", "MESSAGE", "SOURCE"],
        &rows,
    );
}

pub fn summary_json(j: &job::JobStatus, tasks: &[job::TaskStatus]) -> serde_json::Value {
    let ts = |t: &Option<iris_proto::time::Timestamp>| t.as_ref().map(|t| t.epoch_ms);
    let exit = tasks
        .iter()
        .find(|t| t.state == Some(5))
        .map(|t| t.exit_code)
        .unwrap_or(Some(0));
    serde_json::json!({
        "job_id": j.job_id,
        "state": job_state(j.state.unwrap_or_default()),
        "error": j.error,
        "exit_code": exit,
        "pending_reason": j.pending_reason,
        "failure_count": j.failure_count,
        "preemption_count": j.preemption_count,
        "submitted_at_ms": ts(&j.submitted_at),
        "started_at_ms": ts(&j.started_at),
        "finished_at_ms": ts(&j.finished_at),
        "task_state_counts": j.task_state_counts,
        "tasks": tasks.iter().map(|t| serde_json::json!({
            "task_id": t.task_id,
            "state": task_state(t.state.unwrap_or_default()),
            "exit_code": t.exit_code,
            "error": t.error,
            "attempts": t.current_attempt_id() + 1,
            "worker_id": t.worker_id,
        })).collect::<Vec<_>>(),
    })
}
