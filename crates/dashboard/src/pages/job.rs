//! The Job page: one job's settings, its tasks with their attempt timeline, and its child jobs.

use super::jobs::{legend, user_cell};
use super::layout::{badge, ms, Nav, Page};
use super::TASKS_PER_PAGE;
use crate::fmt;
use crate::svg;
use iris_proto::cluster::controller as c;
use iris_proto::inspect as pb;
use iris_proto::job;
use maud::html;
use std::collections::BTreeMap;

/// Attempt rows for a job's timeline, keyed by task id.
pub type Attempts = BTreeMap<String, Vec<svg::Span>>;

/// Builds [`Attempts`] from `ListAttempts` rows.
pub fn attempts_from(rows: &[pb::AttemptSummary]) -> Attempts {
    let mut out: Attempts = BTreeMap::new();
    for a in rows {
        out.entry(a.task_id.clone()).or_default().push(svg::Span {
            attempt_id: a.attempt_id.into(),
            worker: a.worker_id.clone(),
            state: a.state,
            created_ms: a.created_at_ms,
            started_ms: a.started_at_ms,
            finished_ms: a.finished_at_ms,
            exit_code: a.exit_code.map(i64::from),
        });
    }
    out
}

pub struct JobView<'a> {
    pub job: &'a job::JobStatus,
    /// The endpoints its tasks registered.
    pub endpoints: &'a [c::Endpoint],
    /// Where `/proxy` links point.
    pub controller_url: &'a str,
    pub request: Option<&'a c::LaunchJobRequest>,
    pub tasks: &'a [job::TaskStatus],
    pub attempts: &'a Attempts,
    pub children: Option<&'a c::ListJobsResponse>,
    pub task_page: usize,
    pub now: i64,
}

pub(super) fn task_index(task_id: &str) -> &str {
    task_id.rsplit('/').next().unwrap_or(task_id)
}

fn resources_text(r: Option<&job::ResourceSpecProto>) -> String {
    let Some(r) = r else { return "—".into() };
    let mut s = format!(
        "{} CPU, {} memory, {} disk",
        fmt::cores(r.cpu_millicores as i64),
        fmt::bytes(r.memory_bytes),
        fmt::bytes(r.disk_bytes)
    );
    match r.device.as_ref().and_then(|d| d.device.as_ref()) {
        Some(job::device_config::Device::Gpu(g)) => {
            s.push_str(&format!(", {}× {} GPU", g.count, g.variant))
        }
        Some(job::device_config::Device::Tpu(t)) => {
            s.push_str(&format!(", {}× {} TPU", t.count, t.variant))
        }
        _ => {}
    }
    s
}

pub fn job_page(v: &JobView<'_>) -> Page {
    let j = v.job;
    let st = fmt::job_state(j.state.unwrap_or_default());
    let terminal = iris_types::JobState::from_code(j.state.unwrap_or_default())
        .map(|s| s.is_terminal())
        .unwrap_or(false);
    let head = html! {
        nav.crumbs aria-label="Breadcrumb" {
            a href="/jobs" { "Jobs" }
            @if !j.parent_job_id().is_empty() { " / " a href=(fmt::id_path("job", j.parent_job_id())) { (j.parent_job_id()) } }
        }
        h1 { "Job " span.id { (j.job_id()) } }
        p { a href=(fmt::id_path("logs", j.job_id())) { "Logs of all tasks" } }
    };
    let counts: Vec<(String, i64)> = j
        .task_state_counts
        .iter()
        .map(|(k, n)| (k.clone(), *n as i64))
        .collect();
    let argv = v
        .request
        .and_then(|r| r.entrypoint.as_ref())
        .and_then(|e| e.run_command.as_ref())
        .map(|c| c.argv.join(" "))
        .unwrap_or_default();
    let band = v
        .request
        .map(|r| fmt::band(r.priority_band.unwrap_or_default()))
        .unwrap_or("—");
    let start = (v.task_page.max(1) - 1) * TASKS_PER_PAGE;
    let page_tasks: Vec<&job::TaskStatus> =
        v.tasks.iter().skip(start).take(TASKS_PER_PAGE).collect();
    let rows: Vec<svg::Row> = page_tasks
        .iter()
        .map(|t| svg::Row {
            label: format!("task {}", task_index(t.task_id())),
            spans: v.attempts.get(t.task_id()).cloned().unwrap_or_default(),
        })
        .filter(|r| !r.spans.is_empty())
        .collect();
    let pages = v.tasks.len().div_ceil(TASKS_PER_PAGE).max(1);
    let base = fmt::id_path("job", j.job_id());
    let live = html! {
        div.cards {
            dl.facts {
                dt { "State" } dd #job-state { (badge(st)) }
                dt { "User" } dd { (user_cell(j)) }
                dt { "Band" } dd { (band) }
                dt { "Submitted" } dd { (fmt::ts(ms(&j.submitted_at))) }
                dt { "Started" } dd { (fmt::ts(ms(&j.started_at))) }
                dt { "Finished" } dd { (fmt::ts(ms(&j.finished_at))) }
                dt { "Duration" } dd { (fmt::span(ms(&j.started_at), ms(&j.finished_at), v.now)) }
                dt { "Resources per task" } dd { (resources_text(j.resources.as_ref())) }
                dt { "Failures / preemptions" } dd { (j.failure_count()) " / " (j.preemption_count()) }
                @if !argv.is_empty() { dt { "Command" } dd { code { (argv) } } }
                @if !j.pending_reason().is_empty() {
                    dt { (if terminal { "Error" } else { "Pending reason" }) } dd.reason { (j.pending_reason()) }
                }
            }
        }
        section aria-labelledby="tasks-h" {
            h2 #tasks-h { "Tasks (" (j.task_count()) ")" }
            div.summary { (svg::state_bar(&counts, 480)) (legend(&counts)) }
            @if !rows.is_empty() {
                figure {
                    (svg::timeline(&rows, v.now))
                    figcaption { "Attempts over time: thin while assigned or building, thick while running; colour by final state (hover a bar for details)." }
                }
            }
            div.tablewrap {
                table {
                    caption.sr-only { "Tasks of " (j.job_id()) }
                    thead { tr {
                        th scope="col" { "Task" } th scope="col" { "State" } th scope="col" .num { "Exit" }
                        th scope="col" .num { "Duration" } th scope="col" .num { "Attempts" } th scope="col" { "Worker" }
                        th scope="col" { "Reason / error" } th scope="col" { "Logs" }
                    } }
                    tbody {
                        @for t in &page_tasks {
                            @let tst = fmt::task_state(t.state.unwrap_or_default());
                            @let n = v.attempts.get(t.task_id()).map(|a| a.len()).unwrap_or(t.attempts.len());
                            @let ended = iris_types::TaskState::from_code(t.state.unwrap_or_default()).map(|s| s.is_terminal()).unwrap_or(false);
                            tr {
                                td { a href=(fmt::id_path("task", t.task_id())) { "task " (task_index(t.task_id())) } }
                                td { (badge(tst)) }
                                td.num { @if ended { (t.exit_code()) } @else { "—" } }
                                td.num { (fmt::span(ms(&t.started_at), ms(&t.finished_at), v.now)) }
                                td.num { (n) }
                                td { (t.worker_id()) }
                                td.reason { (if !t.error().is_empty() { t.error() } else { t.pending_reason() }) }
                                td { a href=(fmt::id_path("logs", t.task_id())) aria-label=(format!("Logs of task {}", task_index(t.task_id()))) { "logs" } }
                            }
                        }
                    }
                }
            }
            @if pages > 1 {
                nav.pager aria-label="Task pages" {
                    @for p in 1..=pages {
                        @if p == v.task_page.max(1) { span aria-current="page" { (p) } }
                        @else { a href=(format!("{base}?tpage={p}")) { (p) } }
                    }
                }
            }
        }
        @if !v.endpoints.is_empty() {
            section aria-labelledby="endpoints-h" {
                h2 #endpoints-h { "Endpoints (" (v.endpoints.len()) ")" }
                div.tablewrap { table {
                    caption.sr-only { "Services the tasks of " (j.job_id()) " registered" }
                    thead { tr {
                        th scope="col" { "Name" } th scope="col" { "Task" } th scope="col" { "Address" }
                        th scope="col" { "Access" } th scope="col" { "Through the controller" }
                    } }
                    tbody {
                        @for e in v.endpoints {
                            @let proxy = format!("{}/proxy/{}/", v.controller_url, iris_types::endpoint::encode_proxy_name(e.name()));
                            tr {
                                td.id { (e.name()) }
                                td { a href=(fmt::id_path("task", e.task_id())) { "task " (task_index(e.task_id())) } }
                                td { code { (e.address()) } }
                                td { (iris_types::endpoint::Access::from_code(e.access.unwrap_or_default()).map(|a| a.name()).unwrap_or("unknown")) }
                                td { @if e.peer_id().is_empty() { a href=(proxy) { "open" } } @else { "on peer " (e.peer_id()) } }
                            }
                        }
                    }
                } }
            }
        }
        @if let Some(ch) = v.children {
            @if !ch.jobs.is_empty() {
                section aria-labelledby="children-h" {
                    h2 #children-h { "Child jobs (" (ch.total_count()) ")" }
                    div.tablewrap { table {
                        thead { tr { th scope="col" { "Job" } th scope="col" { "State" } th scope="col" .num { "Tasks" } th scope="col" .num { "Duration" } } }
                        tbody {
                            @for c in &ch.jobs {
                                tr {
                                    td.id { a href=(fmt::id_path("job", c.job_id())) { (c.job_id()) } }
                                    td { (badge(fmt::job_state(c.state.unwrap_or_default()))) }
                                    td.num { (c.completed_count()) "/" (c.task_count()) }
                                    td.num { (fmt::span(ms(&c.started_at), ms(&c.finished_at), v.now)) }
                                }
                            }
                        }
                    } }
                }
            }
        }
    };
    Page {
        title: format!("Job {}", j.job_id()),
        nav: Nav::Jobs,
        head,
        live,
        done: terminal,
        refresh: true,
    }
}
