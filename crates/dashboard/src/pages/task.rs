//! The Task page: one task's state, attempts, resource usage and recent log lines.

use super::layout::{badge, error_box, ms, Nav, Page};
use super::logs::log_list;
use crate::fmt;
use crate::svg;
use iris_proto::cluster::controller as c;
use iris_proto::finelog_logging as fl;
use iris_proto::inspect as pb;
use maud::html;

pub struct TaskView<'a> {
    pub resp: &'a c::GetTaskStatusResponse,
    pub spans: &'a [svg::Span],
    /// `ListTaskEvents`, or why it could not be read (e.g. not the job's owner).
    pub events: Result<&'a pb::ListTaskEventsResponse, &'a str>,
    /// `ExplainTask` for a pending task (or why it could not be read); `None` otherwise.
    pub explain: Option<Result<&'a pb::ExplainTaskResponse, &'a str>>,
    pub log_tail: &'a [fl::LogEntry],
    /// `ListTaskSamples`: CPU and memory over time, oldest first.
    pub samples: &'a [pb::TaskSample],
    pub now: i64,
}

/// CPU and memory over time, each a line chart with its latest and peak in text beside it.
fn usage(samples: &[pb::TaskSample]) -> maud::Markup {
    let cpu: Vec<(i64, f64)> = samples
        .iter()
        .map(|s| (s.ts_ms, f64::from(s.cpu_millicores) / 1000.0))
        .collect();
    let mem: Vec<(i64, f64)> = samples
        .iter()
        .map(|s| (s.ts_ms, s.memory_mb as f64))
        .collect();
    let peak_mem = samples.iter().map(|s| s.memory_peak_mb).max().unwrap_or(0);
    let peak_cpu = cpu.iter().map(|p| p.1).fold(0.0, f64::max);
    let last = samples.last();
    html! {
        @if samples.is_empty() {
            p.muted { "No samples yet: a worker samples a running task's processes every few seconds." }
        } @else {
            div.charts {
                figure {
                    (svg::line_chart(&cpu, "cores", &format!("CPU over time: latest {:.2} cores, peak {:.2}", last.map_or(0.0, |s| f64::from(s.cpu_millicores) / 1000.0), peak_cpu)))
                    figcaption { "CPU (cores): latest " (format!("{:.2}", last.map_or(0.0, |s| f64::from(s.cpu_millicores) / 1000.0))) ", peak " (format!("{peak_cpu:.2}")) }
                }
                figure {
                    (svg::line_chart(&mem, "MB", &format!("Memory over time: latest {} MB, peak {} MB", last.map_or(0, |s| s.memory_mb), peak_mem)))
                    figcaption { "Memory (MB): latest " (last.map_or(0, |s| s.memory_mb)) ", peak " (peak_mem) }
                }
            }
            p.muted { (samples.len()) " sample(s) from " (fmt::ts(samples.first().map(|s| s.ts_ms))) }
        }
    }
}

/// Every worker with the first placement rule that rules the task out (or that it fits).
fn explanation(r: &pb::ExplainTaskResponse) -> maud::Markup {
    html! {
        @if !r.pending { p.muted { (r.note) } }
        @else {
            p {
                "Band " (r.band)
                @if !r.effective_band.is_empty() && r.effective_band != r.band { " (placed as " (r.effective_band) ")" }
                @if r.gang_size > 0 { "; coscheduled: " (r.gang_size) " members sharing one value of '" (r.group_by) "'" }
                "."
            }
            @if !r.note.is_empty() { p.muted { (r.note) } }
            @if r.workers.is_empty() { p.muted { "No workers are registered." } }
            @else {
                div.tablewrap { table #explain {
                    thead { tr { th scope="col" { "Worker" } th scope="col" { "Verdict" } th scope="col" { "Detail" } } }
                    tbody {
                        @for w in &r.workers {
                            tr {
                                td { (w.worker_id) }
                                td { (badge(&w.rule)) }
                                td.reason { (w.detail) }
                            }
                        }
                    }
                } }
            }
        }
    }
}

pub fn task_page(v: &TaskView<'_>) -> Page {
    let t = v.resp.task.clone().unwrap_or_default();
    let st = fmt::task_state(t.state.unwrap_or_default());
    let terminal = iris_types::TaskState::from_code(t.state.unwrap_or_default())
        .map(|s| s.is_terminal())
        .unwrap_or(false);
    let job_id = t.task_id().rsplit_once('/').map(|x| x.0).unwrap_or("");
    let head = html! {
        nav.crumbs aria-label="Breadcrumb" {
            a href="/jobs" { "Jobs" } " / " a href=(fmt::id_path("job", job_id)) { (job_id) }
        }
        h1 { "Task " span.id { (t.task_id()) } }
        p { a href=(fmt::id_path("logs", t.task_id())) { "Full logs (tail, follow, filter)" } }
    };
    let live = html! {
        dl.facts {
            dt { "State" } dd #task-state { (badge(st)) }
            dt { "Worker" } dd { (if t.worker_id().is_empty() { "—" } else { t.worker_id() }) }
            dt { "Current attempt" } dd { (t.current_attempt_id()) }
            @if terminal { dt { "Exit code" } dd { (t.exit_code()) } }
            dt { "Duration" } dd { (fmt::span(ms(&t.started_at), ms(&t.finished_at), v.now)) }
            @if !t.error().is_empty() { dt { "Error" } dd.reason { (t.error()) } }
            @if !t.pending_reason().is_empty() { dt { "Pending reason" } dd.reason { (t.pending_reason()) } }
        }
        @if let Some(x) = &v.explain {
            section aria-labelledby="explain-h" {
                h2 #explain-h { "Why it waits" }
                @match x {
                    Err(e) => (error_box("Cannot explain the task:", e)),
                    Ok(r) => (explanation(r)),
                }
            }
        }
        @if !v.resp.root_cause_highlights.is_empty() {
            section aria-labelledby="rc-h" {
                h2 #rc-h { "Likely cause" }
                pre.logs { @for l in &v.resp.root_cause_highlights { (l) "\n" } }
            }
        }
        section aria-labelledby="att-h" {
            h2 #att-h { "Attempts (" (t.attempts.len()) ")" }
            @if !v.spans.is_empty() {
                figure {
                    (svg::timeline(&[svg::Row { label: "attempts".into(), spans: v.spans.to_vec() }], v.now))
                    figcaption { "Attempts over time (hover a bar for details)." }
                }
            }
            div.tablewrap { table {
                thead { tr {
                    th scope="col" .num { "Attempt" } th scope="col" { "Uid" } th scope="col" { "Worker" } th scope="col" { "State" }
                    th scope="col" .num { "Exit" } th scope="col" { "Started" } th scope="col" .num { "Duration" } th scope="col" { "Error" }
                } }
                tbody {
                    @for a in &t.attempts {
                        @let ast = fmt::task_state(a.state.unwrap_or_default());
                        @let ended = ms(&a.finished_at).is_some();
                        tr {
                            td.num { (a.attempt_id()) }
                            td { code { (a.attempt_uid()) } }
                            td { (a.worker_id()) }
                            td { (badge(ast)) }
                            td.num { @if ended { (a.exit_code()) } @else { "—" } }
                            td { (fmt::ts(ms(&a.started_at))) }
                            td.num { (fmt::span(ms(&a.started_at), ms(&a.finished_at), v.now)) }
                            td.reason { (a.error()) }
                        }
                    }
                }
            } }
        }
        section aria-labelledby="usage-h" {
            h2 #usage-h { "Resource usage" }
            (usage(v.samples))
        }
        section aria-labelledby="ev-h" {
            h2 #ev-h { "Events" }
            @match v.events {
                Err(e) => (error_box("Cannot read task events:", e)),
                Ok(ev) => {
                    @if ev.omitted > 0 { p.muted { (ev.omitted) " earlier event(s) not shown; the latest " (ev.events.len()) " follow." } }
                    div.tablewrap { table {
                        thead { tr {
                            th scope="col" { "Time" } th scope="col" .num { "Attempt" } th scope="col" { "Type" }
                            th scope="col" { "Reason" } th scope="col" { "Message" } th scope="col" { "Source" }
                        } }
                        tbody {
                            @for e in &ev.events {
                                tr {
                                    td { (fmt::ts(Some(e.ts_ms))) }
                                    td.num { @if let Some(a) = e.attempt_id { (a) } }
                                    td { (e.r#type) }
                                    td { (e.reason) }
                                    td.reason { (e.message) }
                                    td { (e.source) }
                                }
                            }
                        }
                    } }
                }
            }
        }
        section aria-labelledby="log-h" {
            h2 #log-h { "Last log lines" }
            @if v.log_tail.is_empty() { p.muted { "No log lines yet." } }
            @else { (log_list(v.log_tail, false)) }
            p { a href=(fmt::id_path("logs", t.task_id())) { "All logs →" } }
        }
    };
    Page {
        title: format!("Task {}", t.task_id()),
        nav: Nav::Jobs,
        head,
        live,
        done: terminal,
        refresh: true,
    }
}
