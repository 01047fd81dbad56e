//! Page rendering: pure functions from fetched data to HTML, so they are tested with fixtures.
//!
//! Every page has a static part (heading, forms) and a live part (`div#live`) that the browser
//! refreshes by fetching the same URL with the `x-iris-fragment` header and swapping it in.

use crate::api::Table;
use crate::fmt;
use crate::model::{Committed, Variant};
use crate::svg;
use iris_proto::cluster::controller as c;
use iris_proto::finelog_logging as fl;
use iris_proto::inspect as pb;
use iris_proto::job;
use maud::{html, Markup, DOCTYPE};
use std::collections::BTreeMap;

/// Jobs shown per page.
pub const JOBS_PER_PAGE: i32 = 50;
/// Tasks shown per page of a job.
pub const TASKS_PER_PAGE: usize = 100;
/// Log lines a page renders at most (the rest stays on the server).
pub const MAX_LOG_LINES: usize = 1000;
/// Query rows rendered at most.
pub const MAX_QUERY_ROWS: usize = 500;
/// Jobs listed per band on the scheduler page.
pub const SCHEDULER_JOBS_PER_BAND: usize = 100;
/// Refresh period of live regions.
pub const REFRESH_MS: u32 = 3000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Nav {
    Jobs,
    Workers,
    Backends,
    Peers,
    Scheduler,
    Query,
}

/// A rendered page: the static part and the live part.
pub struct Page {
    pub title: String,
    pub nav: Nav,
    pub head: Markup,
    pub live: Markup,
    /// The live part no longer changes (a finished job): the browser stops refreshing.
    pub done: bool,
    /// Refresh the live part at all (the Query page does not).
    pub refresh: bool,
}

const CSS_PATH: &str = concat!("/static/app-", env!("CARGO_PKG_VERSION"), ".css");
const JS_PATH: &str = concat!("/static/app-", env!("CARGO_PKG_VERSION"), ".js");

pub fn css_path() -> &'static str {
    CSS_PATH
}
pub fn js_path() -> &'static str {
    JS_PATH
}

/// The whole document.
pub fn layout(p: &Page) -> Markup {
    let item = |n: Nav, href: &str, text: &str| {
        html! {
            li { a href=(href) aria-current=[(p.nav == n).then_some("page")] { (text) } }
        }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (p.title) " · Iris" }
                link rel="stylesheet" href=(CSS_PATH);
                script src=(JS_PATH) defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    a.brand href="/jobs" { "Iris" }
                    nav aria-label="Main" {
                        ul {
                            (item(Nav::Jobs, "/jobs", "Jobs"))
                            (item(Nav::Workers, "/workers", "Workers"))
                            (item(Nav::Backends, "/backends", "Backends"))
                            (item(Nav::Peers, "/peers", "Peers"))
                            (item(Nav::Scheduler, "/scheduler", "Scheduler"))
                            (item(Nav::Query, "/query", "Query"))
                        }
                    }
                    span.note title="The dashboard only reads; it acts as your session's user" { "read-only" }
                }
                main #main tabindex="-1" {
                    (p.head)
                    div #live data-refresh=(if p.refresh && !p.done { REFRESH_MS } else { 0 }) {
                        (p.live)
                    }
                    @if p.refresh {
                        p.status #refresh-status aria-live="polite" {
                            @if p.done { "Final state; no longer refreshing." } @else { "Refreshes every " (REFRESH_MS / 1000) " s." }
                        }
                    }
                }
            }
        }
    }
}

/// A state badge: the state's name in text, with its colour as a marker.
pub fn badge(state: &str) -> Markup {
    html! {
        span.st style=(format!("--c:{}", fmt::color(state))) { (state) }
    }
}

pub fn error_box(title: &str, msg: &str) -> Markup {
    html! {
        div.error role="alert" {
            strong { (title) } " " (msg)
        }
    }
}

/// An error page (controller unreachable, not found, …).
pub fn error_page(nav: Nav, title: &str, msg: &str) -> Page {
    Page {
        title: title.to_string(),
        nav,
        head: html! { h1 { (title) } },
        live: error_box("Error:", msg),
        done: false,
        refresh: true,
    }
}

fn time_cell(now: i64, ms: Option<i64>) -> Markup {
    match ms.filter(|m| *m > 0) {
        Some(m) => {
            html! { time datetime=(fmt::iso(m)) title=(fmt::ts(Some(m))) { (fmt::ago(now, m)) } }
        }
        None => html! { "—" },
    }
}

fn ms(t: &Option<iris_proto::time::Timestamp>) -> Option<i64> {
    t.as_ref().map(|t| t.epoch_ms).filter(|m| *m > 0)
}

// ---------------------------------------------------------------------------------------------
// Jobs

/// Jobs page filters (the query string).
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct JobsFilter {
    pub state: String,
    pub user: String,
    pub prefix: String,
    pub name: String,
    pub page: u32,
}

impl JobsFilter {
    /// The `job_id_prefix` for ListJobs: the user's namespace and/or the given prefix.
    pub fn id_prefix(&self) -> String {
        let user = self.user.trim().trim_matches('/');
        let prefix = self.prefix.trim();
        if user.is_empty() {
            return prefix.to_string();
        }
        let ns = format!("/{user}/");
        if prefix.starts_with(&ns) {
            prefix.to_string()
        } else {
            format!("{ns}{}", prefix.trim_start_matches('/'))
        }
    }

    pub fn page(&self) -> u32 {
        self.page.max(1)
    }

    pub fn query(&self) -> c::JobQuery {
        c::JobQuery {
            state_filter: self.state.trim().to_string(),
            job_id_prefix: self.id_prefix(),
            name_filter: self.name.trim().to_string(),
            offset: (self.page() as i32 - 1) * JOBS_PER_PAGE,
            limit: JOBS_PER_PAGE,
            ..Default::default()
        }
    }

    /// `CountJobs` under the same filters as [`JobsFilter::query`] (for the state bar).
    pub fn counts_request(&self) -> pb::CountJobsRequest {
        pb::CountJobsRequest {
            job_id_prefix: self.id_prefix(),
            name_filter: self.name.trim().to_string(),
        }
    }

    fn link(&self, page: u32) -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("state", &self.state),
            ("user", &self.user),
            ("prefix", &self.prefix),
            ("name", &self.name),
        ] {
            if !v.is_empty() {
                parts.push(format!("{k}={}", fmt::qs(v)));
            }
        }
        if page > 1 {
            parts.push(format!("page={page}"));
        }
        if parts.is_empty() {
            "/jobs".into()
        } else {
            format!("/jobs?{}", parts.join("&"))
        }
    }
}

/// The job's owner (its id's namespace, which the User filter matches) and, when someone else
/// submitted it, who did.
fn user_cell(j: &job::JobStatus) -> Markup {
    let owner = j.job_id.split('/').nth(1).unwrap_or("");
    html! {
        (owner)
        @if !j.submitting_user.is_empty() && j.submitting_user != owner {
            br; span.muted { "by " (j.submitting_user) }
        }
    }
}

const JOB_STATES: &[&str] = &[
    "pending",
    "building",
    "running",
    "succeeded",
    "failed",
    "killed",
    "worker_failed",
    "unschedulable",
];

/// Job counts by state name from `CountJobs`.
pub fn state_counts(r: &pb::CountJobsResponse) -> Vec<(String, i64)> {
    r.counts
        .iter()
        .map(|c| (fmt::job_state(c.state).to_string(), c.count))
        .collect()
}

fn legend(counts: &[(String, i64)]) -> Markup {
    let mut v: Vec<&(String, i64)> = counts.iter().filter(|(_, n)| *n > 0).collect();
    v.sort_by_key(|(s, _)| {
        fmt::STATE_ORDER
            .iter()
            .position(|x| x == s)
            .unwrap_or(usize::MAX)
    });
    html! {
        ul.legend {
            @for (s, n) in v {
                li { span.sw style=(format!("background:{}", fmt::color(s))) {} (s) " " strong { (n) } }
            }
        }
    }
}

pub fn jobs_page(
    f: &JobsFilter,
    resp: Result<&c::ListJobsResponse, &str>,
    counts: &[(String, i64)],
    now: i64,
) -> Page {
    let head = html! {
        h1 { "Jobs" }
        form.filters method="get" action="/jobs" role="search" aria-label="Filter jobs" {
            label { "State "
                select name="state" {
                    option value="" selected[f.state.is_empty()] { "any" }
                    @for s in JOB_STATES {
                        option value=(s) selected[f.state == *s] { (s) }
                    }
                }
            }
            label { "User " input type="text" name="user" value=(f.user) size="10" autocomplete="off"; }
            label { "Id prefix " input type="text" name="prefix" value=(f.prefix) size="18" placeholder="/alice/train" autocomplete="off"; }
            label { "Name contains " input type="text" name="name" value=(f.name) size="12" autocomplete="off"; }
            button type="submit" { "Filter" }
            @if !f.state.is_empty() || !f.user.is_empty() || !f.prefix.is_empty() || !f.name.is_empty() {
                " " a href="/jobs" { "Clear" }
            }
        }
    };
    let live = match resp {
        Err(e) => error_box("Cannot list jobs:", e),
        Ok(r) => {
            let total: i64 = counts.iter().map(|(_, n)| *n).sum();
            let page = f.page();
            let first = (page as i64 - 1) * JOBS_PER_PAGE as i64;
            let shown = r.jobs.len() as i64;
            let last_page =
                ((r.total_count as i64 + JOBS_PER_PAGE as i64 - 1) / JOBS_PER_PAGE as i64).max(1);
            // ListJobs refuses offsets past 5000.
            let max_page = 5000 / JOBS_PER_PAGE as i64 + 1;
            html! {
                section aria-labelledby="by-state" {
                    h2 #by-state .sr-only { "Jobs by state" }
                    div.summary {
                        (svg::state_bar(counts, 480))
                        (legend(counts))
                        span.muted { (total) " jobs match" }
                    }
                }
                div.tablewrap {
                    table.jobs {
                        caption {
                            "Jobs, newest first: "
                            @if shown == 0 { "none match" } @else { (first + 1) "–" (first + shown) " of " (r.total_count) }
                        }
                        thead { tr {
                            th scope="col" { "Job" }
                            th scope="col" { "State" }
                            th scope="col" { "Tasks" }
                            th scope="col" { "User" }
                            th scope="col" { "Submitted" }
                            th scope="col" .num { "Duration" }
                            th scope="col" { "Pending reason / error" }
                        } }
                        tbody {
                            @for j in &r.jobs {
                                @let st = fmt::job_state(j.state);
                                @let counts: Vec<(String, i64)> = j.task_state_counts.iter().map(|(k, v)| (k.clone(), *v as i64)).collect();
                                @let done = j.task_state_counts.get("succeeded").copied().unwrap_or(0);
                                tr {
                                    td.id { a href=(fmt::id_path("job", &j.job_id)) { (j.job_id) } }
                                    td { (badge(st)) }
                                    td.tasks { (svg::state_bar(&counts, 64)) " " span.num { (done) "/" (j.task_count) } }
                                    td { (user_cell(j)) }
                                    td { (time_cell(now, ms(&j.submitted_at))) }
                                    td.num { (fmt::span(ms(&j.started_at), ms(&j.finished_at), now)) }
                                    td.reason { (j.pending_reason) }
                                }
                            }
                        }
                    }
                }
                nav.pager aria-label="Pages" {
                    @if page > 1 { a href=(f.link(page - 1)) rel="prev" { "← Newer" } } @else { span.muted { "← Newer" } }
                    span { "Page " (page) " of " (last_page) }
                    @if r.has_more && (page as i64) < max_page { a href=(f.link(page + 1)) rel="next" { "Older →" } } @else { span.muted { "Older →" } }
                    @if r.has_more && (page as i64) >= max_page { span.muted { " (older jobs: narrow the filter)" } }
                }
            }
        }
    };
    Page {
        title: "Jobs".into(),
        nav: Nav::Jobs,
        head,
        live,
        done: false,
        refresh: true,
    }
}

// ---------------------------------------------------------------------------------------------
// Job

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
    pub request: Option<&'a c::LaunchJobRequest>,
    pub tasks: &'a [job::TaskStatus],
    pub attempts: &'a Attempts,
    pub children: Option<&'a c::ListJobsResponse>,
    pub task_page: usize,
    pub now: i64,
}

fn task_index(task_id: &str) -> &str {
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
    let st = fmt::job_state(j.state);
    let terminal = iris_types::JobState::from_code(j.state)
        .map(|s| s.is_terminal())
        .unwrap_or(false);
    let head = html! {
        nav.crumbs aria-label="Breadcrumb" {
            a href="/jobs" { "Jobs" }
            @if !j.parent_job_id.is_empty() { " / " a href=(fmt::id_path("job", &j.parent_job_id)) { (j.parent_job_id) } }
        }
        h1 { "Job " span.id { (j.job_id) } }
        p { a href=(fmt::id_path("logs", &j.job_id)) { "Logs of all tasks" } }
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
    let band = v.request.map(|r| fmt::band(r.priority_band)).unwrap_or("—");
    let start = (v.task_page.max(1) - 1) * TASKS_PER_PAGE;
    let page_tasks: Vec<&job::TaskStatus> =
        v.tasks.iter().skip(start).take(TASKS_PER_PAGE).collect();
    let rows: Vec<svg::Row> = page_tasks
        .iter()
        .map(|t| svg::Row {
            label: format!("task {}", task_index(&t.task_id)),
            spans: v.attempts.get(&t.task_id).cloned().unwrap_or_default(),
        })
        .filter(|r| !r.spans.is_empty())
        .collect();
    let pages = v.tasks.len().div_ceil(TASKS_PER_PAGE).max(1);
    let base = fmt::id_path("job", &j.job_id);
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
                dt { "Failures / preemptions" } dd { (j.failure_count) " / " (j.preemption_count) }
                @if !argv.is_empty() { dt { "Command" } dd { code { (argv) } } }
                @if !j.pending_reason.is_empty() {
                    dt { (if terminal { "Error" } else { "Pending reason" }) } dd.reason { (j.pending_reason) }
                }
            }
        }
        section aria-labelledby="tasks-h" {
            h2 #tasks-h { "Tasks (" (j.task_count) ")" }
            div.summary { (svg::state_bar(&counts, 480)) (legend(&counts)) }
            @if !rows.is_empty() {
                figure {
                    (svg::timeline(&rows, v.now))
                    figcaption { "Attempts over time: thin while assigned or building, thick while running; colour by final state (hover a bar for details)." }
                }
            }
            div.tablewrap {
                table {
                    caption.sr-only { "Tasks of " (j.job_id) }
                    thead { tr {
                        th scope="col" { "Task" } th scope="col" { "State" } th scope="col" .num { "Exit" }
                        th scope="col" .num { "Duration" } th scope="col" .num { "Attempts" } th scope="col" { "Worker" }
                        th scope="col" { "Reason / error" } th scope="col" { "Logs" }
                    } }
                    tbody {
                        @for t in &page_tasks {
                            @let tst = fmt::task_state(t.state);
                            @let n = v.attempts.get(&t.task_id).map(|a| a.len()).unwrap_or(t.attempts.len());
                            @let ended = iris_types::TaskState::from_code(t.state).map(|s| s.is_terminal()).unwrap_or(false);
                            tr {
                                td { a href=(fmt::id_path("task", &t.task_id)) { "task " (task_index(&t.task_id)) } }
                                td { (badge(tst)) }
                                td.num { @if ended { (t.exit_code) } @else { "—" } }
                                td.num { (fmt::span(ms(&t.started_at), ms(&t.finished_at), v.now)) }
                                td.num { (n) }
                                td { (t.worker_id) }
                                td.reason { (if !t.error.is_empty() { &t.error } else { &t.pending_reason }) }
                                td { a href=(fmt::id_path("logs", &t.task_id)) aria-label=(format!("Logs of task {}", task_index(&t.task_id))) { "logs" } }
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
        @if let Some(ch) = v.children {
            @if !ch.jobs.is_empty() {
                section aria-labelledby="children-h" {
                    h2 #children-h { "Child jobs (" (ch.total_count) ")" }
                    div.tablewrap { table {
                        thead { tr { th scope="col" { "Job" } th scope="col" { "State" } th scope="col" .num { "Tasks" } th scope="col" .num { "Duration" } } }
                        tbody {
                            @for c in &ch.jobs {
                                tr {
                                    td.id { a href=(fmt::id_path("job", &c.job_id)) { (c.job_id) } }
                                    td { (badge(fmt::job_state(c.state))) }
                                    td.num { (c.completed_count) "/" (c.task_count) }
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
        title: format!("Job {}", j.job_id),
        nav: Nav::Jobs,
        head,
        live,
        done: terminal,
        refresh: true,
    }
}

// ---------------------------------------------------------------------------------------------
// Task

pub struct TaskView<'a> {
    pub resp: &'a c::GetTaskStatusResponse,
    pub spans: &'a [svg::Span],
    /// `ListTaskEvents`, or why it could not be read (e.g. not the job's owner).
    pub events: Result<&'a pb::ListTaskEventsResponse, &'a str>,
    pub log_tail: &'a [fl::LogEntry],
    pub now: i64,
}

pub fn task_page(v: &TaskView<'_>) -> Page {
    let t = v.resp.task.clone().unwrap_or_default();
    let st = fmt::task_state(t.state);
    let terminal = iris_types::TaskState::from_code(t.state)
        .map(|s| s.is_terminal())
        .unwrap_or(false);
    let job_id = t.task_id.rsplit_once('/').map(|x| x.0).unwrap_or("");
    let head = html! {
        nav.crumbs aria-label="Breadcrumb" {
            a href="/jobs" { "Jobs" } " / " a href=(fmt::id_path("job", job_id)) { (job_id) }
        }
        h1 { "Task " span.id { (t.task_id) } }
        p { a href=(fmt::id_path("logs", &t.task_id)) { "Full logs (tail, follow, filter)" } }
    };
    let uid_of = |id: i32| {
        t.attempts
            .iter()
            .find(|a| a.attempt_id == id)
            .map(|a| a.attempt_uid.clone())
    };
    let live = html! {
        dl.facts {
            dt { "State" } dd #task-state { (badge(st)) }
            dt { "Worker" } dd { (if t.worker_id.is_empty() { "—" } else { &t.worker_id }) }
            dt { "Current attempt" } dd { (t.current_attempt_id) }
            @if terminal { dt { "Exit code" } dd { (t.exit_code) } }
            dt { "Duration" } dd { (fmt::span(ms(&t.started_at), ms(&t.finished_at), v.now)) }
            @if !t.error.is_empty() { dt { "Error" } dd.reason { (t.error) } }
            @if !t.pending_reason.is_empty() { dt { "Pending reason" } dd.reason { (t.pending_reason) } }
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
                        @let ast = fmt::task_state(a.state);
                        @let ended = ms(&a.finished_at).is_some();
                        tr {
                            td.num { (a.attempt_id) }
                            td { code { (uid_of(a.attempt_id).unwrap_or_default()) } }
                            td { (a.worker_id) }
                            td { (badge(ast)) }
                            td.num { @if ended { (a.exit_code) } @else { "—" } }
                            td { (fmt::ts(ms(&a.started_at))) }
                            td.num { (fmt::span(ms(&a.started_at), ms(&a.finished_at), v.now)) }
                            td.reason { (a.error) }
                        }
                    }
                }
            } }
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
            p { a href=(fmt::id_path("logs", &t.task_id)) { "All logs →" } }
        }
    };
    Page {
        title: format!("Task {}", t.task_id),
        nav: Nav::Jobs,
        head,
        live,
        done: terminal,
        refresh: true,
    }
}

// ---------------------------------------------------------------------------------------------
// Logs

/// Logs page options (the query string).
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct LogsFilter {
    /// Full-log regular expression, evaluated by the server.
    pub regex: String,
    /// Lines of tail to load (default and cap [`MAX_LOG_LINES`]).
    pub lines: usize,
    /// Follow: only entries after this cursor.
    pub after: Option<i64>,
}

/// Log lines as an ordered list: time, (key,) text. stderr lines are marked.
pub fn log_list(lines: &[fl::LogEntry], with_key: bool) -> Markup {
    html! {
        ol.log #log-lines {
            @for e in lines { (log_line(e, with_key)) }
        }
    }
}

pub fn log_line(e: &fl::LogEntry, with_key: bool) -> Markup {
    let t = e
        .timestamp
        .as_ref()
        .and_then(|t| chrono::DateTime::from_timestamp_millis(t.epoch_ms))
        .map(|t| t.format("%H:%M:%S%.3f").to_string())
        .unwrap_or_default();
    html! {
        li.e[e.source == "stderr"] {
            span.t { (t) } " "
            @if with_key && !e.key.is_empty() { span.k { (e.key) } " " }
            (e.data)
        }
    }
}

pub struct LogsView<'a> {
    pub id: &'a str,
    pub is_task: bool,
    pub filter: &'a LogsFilter,
    /// Lines, or the server's refusal (e.g. a bad regular expression).
    pub lines: Result<&'a [fl::LogEntry], &'a str>,
    /// Matches beyond those rendered (regex mode) or lines before the tail.
    pub more: usize,
    pub cursor: i64,
    pub active: bool,
}

pub fn logs_page(v: &LogsView<'_>) -> Page {
    let f = v.filter;
    let path = fmt::id_path("logs", v.id);
    let kind = if v.is_task { "task" } else { "job" };
    let head = html! {
        nav.crumbs aria-label="Breadcrumb" {
            a href="/jobs" { "Jobs" } " / "
            a href=(fmt::id_path(kind, v.id)) { (v.id) }
        }
        h1 { "Logs of " (kind) " " span.id { (v.id) } }
        form.filters method="get" action=(path) role="search" aria-label="Filter the full log" {
            label for="regex" { "Full-log filter (regular expression, searched on the server over the whole log)" }
            div.row {
                input #regex type="text" name="regex" value=(f.regex) size="40" placeholder="rank0.*train/loss" spellcheck="false" autocomplete="off";
                button type="submit" { "Filter" }
                @if !f.regex.is_empty() { a href=(path) { "Clear filter (back to tail)" } }
            }
        }
        div.findbar role="search" aria-label="Find in loaded lines" {
            label for="find" { "Find in loaded lines (searches only what is shown below)" }
            div.row {
                input #find type="search" size="30" autocomplete="off";
                span #find-count aria-live="polite" {}
            }
        }
    };
    let live = match v.lines {
        Err(e) => html! {
            (error_box("The full-log filter was rejected:", e))
            p { "Fix the expression: an empty result would not mean the task printed no matching lines." }
        },
        Ok(lines) => {
            let src = if f.regex.is_empty() {
                path.clone()
            } else {
                format!("{path}?regex={}", fmt::qs(&f.regex))
            };
            html! {
                p.muted #log-summary {
                    @if f.regex.is_empty() {
                        "Last " (lines.len()) " line(s)"
                        @if v.more > 0 { " (earlier lines: use the full-log filter)" }
                    } @else {
                        (lines.len()) " matching line(s) in the whole log"
                        @if v.more > 0 { ", showing the first " (lines.len()) "; " (v.more) " more match: narrow the expression" }
                    }
                    "."
                }
                div.follow {
                    label { input #follow type="checkbox" checked[v.active]; " Follow new lines" }
                }
                div #log-box data-src=(src) data-cursor=(v.cursor) data-active=(if v.active { "1" } else { "0" }) {
                    @if lines.is_empty() { p.muted #no-lines { "No lines." } }
                    (log_list(lines, !v.is_task))
                }
            }
        }
    };
    Page {
        title: format!("Logs {}", v.id),
        nav: Nav::Jobs,
        head,
        live,
        done: false,
        refresh: false,
    }
}

// ---------------------------------------------------------------------------------------------
// Workers

pub fn workers_page(
    resp: Result<&c::ListWorkersResponse, &str>,
    committed: &BTreeMap<String, Committed>,
    now: i64,
) -> Page {
    let live = match resp {
        Err(e) => error_box("Cannot list workers:", e),
        Ok(r) => {
            let healthy = r.workers.iter().filter(|w| w.healthy).count();
            html! {
                p { (r.workers.len()) " worker(s), " (healthy) " healthy." }
                div.tablewrap { table {
                    caption.sr-only { "Workers" }
                    thead { tr {
                        th scope="col" { "Worker" } th scope="col" { "Health" } th scope="col" { "Last seen" }
                        th scope="col" { "Devices" } th scope="col" { "CPU committed" } th scope="col" { "Memory committed" }
                        th scope="col" { "Running jobs" }
                    } }
                    tbody {
                        @for w in &r.workers {
                            @let md = w.metadata.clone().unwrap_or_default();
                            @let (kind, variant, units) = crate::model::advertised(w);
                            @let cm = committed.get(&w.worker_id).cloned().unwrap_or_default();
                            @let cpu_total = md.cpu_count as i64 * 1000;
                            tr {
                                td { span.id { (w.worker_id) } br; span.muted { (w.address) } }
                                td { @if w.healthy { span.ok { "✓ healthy" } } @else { span.bad { "✗ unhealthy" } } }
                                td { (time_cell(now, ms(&w.last_heartbeat))) }
                                td { @if kind == "cpu" { (units) " cores" } @else { (units) "× " (variant.to_uppercase()) " " (kind.to_uppercase()) br; span.muted { (cm.units) " held" } } }
                                td.meter-cell {
                                    (svg::meter(cm.cpu_millicores, cpu_total, &format!("{} of {} cores committed", fmt::cores(cm.cpu_millicores), md.cpu_count)))
                                    " " span.num { (fmt::cores(cm.cpu_millicores)) "/" (md.cpu_count) }
                                }
                                td.meter-cell {
                                    (svg::meter(cm.memory_bytes, md.memory_bytes, &format!("{} of {} memory committed", fmt::bytes(cm.memory_bytes), fmt::bytes(md.memory_bytes))))
                                    " " span.num { (fmt::bytes(cm.memory_bytes)) " / " (fmt::bytes(md.memory_bytes)) }
                                }
                                td {
                                    @if w.running_job_ids.is_empty() { span.muted { "idle" } }
                                    @for (i, j) in w.running_job_ids.iter().enumerate() {
                                        @if i > 0 { ", " }
                                        a href=(fmt::id_path("job", j)) { (j) }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
        }
    };
    Page {
        title: "Workers".into(),
        nav: Nav::Workers,
        head: html! { h1 { "Workers" } },
        live,
        done: false,
        refresh: true,
    }
}

// ---------------------------------------------------------------------------------------------
// Backends

pub fn backends_page(variants: Result<&[Variant], &str>) -> Page {
    let live = match variants {
        Err(e) => error_box("Cannot compute capacity:", e),
        Ok(vs) => html! {
            p { "Free and total units per device variant on healthy workers. Held units belong to attempts that have not finished on their worker." }
            @if vs.is_empty() { p.muted { "No workers have registered." } }
            div.tablewrap { table.backends {
                caption.sr-only { "Capacity by device variant" }
                thead { tr {
                    th scope="col" { "Variant" } th scope="col" { "Free / total" } th scope="col" .num { "Held" }
                    th scope="col" { "Held by band" } th scope="col" .num { "Workers" }
                } }
                tbody {
                    @for v in vs {
                        @let free = v.free();
                        tr {
                            th scope="row" { (v.title()) }
                            td.meter-cell {
                                (svg::meter(v.total - free, v.total, &format!("{free} of {} {} free", v.total, v.title())))
                                " " strong.num.free { (free) "/" (v.total) } " free"
                            }
                            td.num { (v.held) }
                            td {
                                @if v.held_by_band.is_empty() { span.muted { "—" } }
                                @for (i, (b, n)) in v.held_by_band.iter().enumerate() {
                                    @if i > 0 { ", " }
                                    (fmt::band(*b)) " " strong { (n) }
                                }
                            }
                            td.num { (v.healthy_workers) @if v.unhealthy_workers > 0 { " (+" (v.unhealthy_workers) " unhealthy)" } }
                        }
                    }
                }
            } }
        },
    };
    Page {
        title: "Backends".into(),
        nav: Nav::Backends,
        head: html! { h1 { "Backends" } },
        live,
        done: false,
        refresh: true,
    }
}

/// The Backends page's Kubernetes part: per backend free/total GPUs and held-by-band, and the
/// cluster's nodes.
pub fn with_kubernetes(live: Markup, backends: &[c::BackendSummary]) -> Markup {
    let cluster =
        backends.iter().find_map(
            |b| match b.detail.as_ref().and_then(|d| d.detail.as_ref()) {
                Some(c::backend_status::Detail::Kubernetes(k)) => Some(k),
                _ => None,
            },
        );
    html! {
        (live)
        h2 { "Kubernetes" }
        div.tablewrap { table.backends {
            caption.sr-only { "Kubernetes backends" }
            thead { tr {
                th scope="col" { "Backend" } th scope="col" { "Free / total" } th scope="col" { "Held by band" }
                th scope="col" .num { "Running pods" } th scope="col" .num { "Pending pods" }
            } }
            tbody {
                @for b in backends {
                    tr {
                        th scope="row" { (b.backend_id) }
                        td.meter-cell {
                            @match &b.availability {
                                None => { span.muted { "CPU only" } }
                                Some(a) => {
                                    @for (v, total) in &a.total_amounts {
                                        @let free = a.amounts.get(v).copied().unwrap_or(0);
                                        (svg::meter(total - free, *total, &format!("{free} of {total} {v} free")))
                                        " " strong.num.free { (free) "/" (total) } " " (v)
                                    }
                                }
                            }
                        }
                        td {
                            @match &b.availability {
                                Some(a) if !a.held_by_band.is_empty() => {
                                    @for (i, h) in a.held_by_band.iter().enumerate() {
                                        @if i > 0 { ", " }
                                        (fmt::band(h.band)) " "
                                        @for n in h.amounts.values() { strong { (n) } }
                                    }
                                }
                                _ => { span.muted { "—" } }
                            }
                        }
                        td.num { (b.running_task_count) }
                        td.num { (b.pending_task_count) }
                    }
                }
            }
        } }
        @if let Some(k) = cluster {
            p { "Namespace " code { (k.namespace) } ": " (k.schedulable_nodes) " of " (k.total_nodes) " nodes schedulable; " (k.allocatable_cpu) ", " (k.allocatable_memory) " allocatable." }
            div.tablewrap { table.nodes {
                caption.sr-only { "Kubernetes nodes" }
                thead { tr {
                    th scope="col" { "Node" } th scope="col" { "Ready" } th scope="col" { "Schedulable" }
                    th scope="col" .num { "GPUs" } th scope="col" { "GPU model" } th scope="col" .num { "CPU" }
                    th scope="col" .num { "Memory" } th scope="col" .num { "Running pods" }
                } }
                tbody {
                    @for n in &k.nodes {
                        tr {
                            th scope="row" { (n.name) }
                            td { @if n.ready { "✓ ready" } @else { strong.bad { "✗ not ready" } } }
                            td { @if n.schedulable { "yes" } @else { "no" } }
                            td.num { (n.gpu_count) }
                            td { (n.gpu_model) }
                            td.num { (fmt::cores(n.cpu_millicores)) }
                            td.num { (fmt::bytes(n.memory_bytes)) }
                            td.num { (n.running_pods) }
                        }
                    }
                }
            } }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Peers

/// Federation peers: reachability, last contact, and each peer backend's free/total per device
/// variant with the capacity held by band (what a higher band could reclaim there).
pub fn peers_page(peers: Result<&c::ListPeersResponse, &str>, now: i64) -> Page {
    let live = match peers {
        Err(e) => error_box("Cannot list peers:", e),
        Ok(r) => html! {
            @if r.peers.is_empty() { p.muted { "This cluster has no federation peers." } }
            @else {
                p { "Jobs that no local worker can host go to the peer whose backend reports room. Numbers come from each peer's last heartbeat; an unreachable peer's numbers are hidden." }
                div.tablewrap { table.peers {
                    caption.sr-only { "Federation peers" }
                    thead { tr {
                        th scope="col" { "Peer" } th scope="col" { "Reachable" } th scope="col" { "Last contact" }
                        th scope="col" .num { "Active jobs" } th scope="col" { "Backend" } th scope="col" { "Free / total" } th scope="col" { "Held by band" }
                    } }
                    tbody {
                        @for p in &r.peers {
                            @let rows = p.backends.len().max(1);
                            @for i in 0..rows {
                                @let b = p.backends.get(i);
                                tr {
                                    @if i == 0 {
                                        th scope="row" rowspan=(rows) { (p.peer_id) br; span.muted { (p.controller_address) } }
                                        td rowspan=(rows) {
                                            @if p.reachable { span.ok { "✓ reachable" } } @else { strong.bad { "✗ unreachable" } }
                                        }
                                        td rowspan=(rows) {
                                            @if p.last_contact_ms > 0 { (fmt::ago(now, p.last_contact_ms)) } @else { span.muted { "never" } }
                                        }
                                        td.num rowspan=(rows) { (p.active_federated_jobs) }
                                    }
                                    @match b {
                                        None => { td colspan="3" { span.muted { "no backends reported" } } }
                                        Some(b) => {
                                            td { (b.backend_id) " " span.muted { "(" (b.kind) ")" } }
                                            td.meter-cell {
                                                @match &b.availability {
                                                    None => { span.muted { "not reported" } }
                                                    Some(a) => {
                                                        @if a.total_amounts.is_empty() { span.muted { "no accelerators" } }
                                                        @for (v, total) in &a.total_amounts {
                                                            @let free = a.amounts.get(v).copied().unwrap_or(0);
                                                            div {
                                                                (svg::meter(total - free, *total, &format!("{free} of {total} {v} free")))
                                                                " " strong.num.free { (free) "/" (total) } " " (v)
                                                            }
                                                        }
                                                    }
                                                }
                                            }
                                            td {
                                                @match &b.availability {
                                                    Some(a) if !a.held_by_band.is_empty() => {
                                                        @for (i, h) in a.held_by_band.iter().enumerate() {
                                                            @if i > 0 { "; " }
                                                            (fmt::band(h.band)) " "
                                                            @for (v, n) in &h.amounts { strong { (n) } " " (v) " " }
                                                        }
                                                    }
                                                    _ => { span.muted { "—" } }
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
        },
    };
    Page {
        title: "Peers".into(),
        nav: Nav::Peers,
        head: html! { h1 { "Peers" } },
        live,
        done: false,
        refresh: true,
    }
}

// ---------------------------------------------------------------------------------------------
// Scheduler

/// A pending task with its reason, for the scheduler page.
pub struct PendingTask {
    pub task_id: String,
    pub reason: String,
}

pub fn scheduler_page(
    st: Result<&c::GetSchedulerStateResponse, &str>,
    pending: &BTreeMap<String, Vec<PendingTask>>,
) -> Page {
    let live = match st {
        Err(e) => error_box("Cannot read the scheduler state:", e),
        Ok(s) => {
            let mut bands: BTreeMap<u8, Vec<&c::PendingTaskBucket>> = BTreeMap::new();
            for b in &s.pending_buckets {
                let rank = iris_types::Band::from_code(b.band)
                    .map(|b| b.rank())
                    .unwrap_or(9);
                bands.entry(rank).or_default().push(b);
            }
            html! {
                p { strong { (s.total_pending) } " task(s) pending, " strong { (s.total_running) } " running." }
                @if bands.is_empty() { p.muted { "The queue is empty." } }
                @for (_, buckets) in &bands {
                    @let name = fmt::band(buckets[0].band);
                    section aria-label=(format!("Band {name}")) {
                        h2 { "Band " (name) " — " (buckets.iter().map(|b| b.count as i64).sum::<i64>()) " pending" }
                        div.tablewrap { table {
                            thead { tr {
                                th scope="col" { "Job" } th scope="col" { "User" } th scope="col" .num { "Pending" }
                                th scope="col" { "Task" } th scope="col" { "Reason" }
                            } }
                            tbody {
                                @for b in buckets.iter().take(SCHEDULER_JOBS_PER_BAND) {
                                    @let tasks = pending.get(&b.job_id);
                                    @match tasks {
                                        Some(ts) if !ts.is_empty() => {
                                            @for (i, t) in ts.iter().enumerate() {
                                                tr {
                                                    @if i == 0 {
                                                        td.id rowspan=(ts.len()) { a href=(fmt::id_path("job", &b.job_id)) { (b.job_id) } }
                                                        td rowspan=(ts.len()) { (b.user_id) }
                                                        td.num rowspan=(ts.len()) { (b.count) }
                                                    }
                                                    td { a href=(fmt::id_path("task", &t.task_id)) { (task_index(&t.task_id)) } }
                                                    td.reason { (if t.reason.is_empty() { "waiting for the next scheduling pass" } else { &t.reason }) }
                                                }
                                            }
                                        }
                                        _ => {
                                            tr {
                                                td.id { a href=(fmt::id_path("job", &b.job_id)) { (b.job_id) } }
                                                td { (b.user_id) } td.num { (b.count) } td { "—" } td.muted { "(not loaded)" }
                                            }
                                        }
                                    }
                                }
                            }
                        } }
                        @if buckets.len() > SCHEDULER_JOBS_PER_BAND {
                            p.muted { "…and " (buckets.len() - SCHEDULER_JOBS_PER_BAND) " more job(s) in this band (see " a href="/jobs?state=pending" { "pending jobs" } ")." }
                        }
                    }
                }
                @if !s.user_budgets.is_empty() {
                    section aria-labelledby="budgets-h" {
                        h2 #budgets-h { "User budgets" }
                        div.tablewrap { table {
                            thead { tr {
                                th scope="col" { "User" } th scope="col" .num { "Spent" } th scope="col" .num { "Limit" }
                                th scope="col" { "Max band" } th scope="col" { "Effective band" }
                            } }
                            tbody {
                                @for u in &s.user_budgets {
                                    tr {
                                        td { (u.user_id) } td.num { (u.budget_spent) }
                                        td.num { @if u.budget_limit == 0 { "unlimited" } @else { (u.budget_limit) } }
                                        td { (fmt::band(u.max_band)) } td { (fmt::band(u.effective_band)) }
                                    }
                                }
                            }
                        } }
                    }
                }
            }
        }
    };
    Page {
        title: "Scheduler".into(),
        nav: Nav::Scheduler,
        head: html! { h1 { "Scheduler" } p.muted { "The pending queue by priority band, highest first, with each task's reason for waiting." } },
        live,
        done: false,
        refresh: true,
    }
}

// ---------------------------------------------------------------------------------------------
// Query

pub fn query_page(sql: &str, result: Option<Result<&Table, &str>>, elapsed_ms: f64) -> Page {
    let head = html! {
        h1 { "Query" }
        form.query method="get" action="/query" {
            label for="sql" { "SQL (one read-only SELECT against the controller DB)" }
            textarea #sql name="sql" rows="5" spellcheck="false" { (sql) }
            div.row {
                button type="submit" { "Run" }
                span.muted { "Example: SELECT state, count(*) FROM jobs GROUP BY state" }
            }
        }
    };
    let live = match result {
        None => html! {},
        Some(Err(e)) => error_box("Query failed:", e),
        Some(Ok(t)) => html! {
            p.muted {
                (t.rows.len()) " row(s) in " (format!("{elapsed_ms:.1}")) " ms"
                @if t.rows.len() > MAX_QUERY_ROWS { "; showing the first " (MAX_QUERY_ROWS) }
                "."
            }
            div.tablewrap { table.query {
                thead { tr { @for c in &t.columns { th scope="col" { (c) } } } }
                tbody {
                    @for r in t.rows.iter().take(MAX_QUERY_ROWS) {
                        tr { @for i in 0..t.columns.len() {
                            @let v = r.get(i).cloned().unwrap_or(serde_json::Value::Null);
                            @match v {
                                serde_json::Value::Null => td.muted { "NULL" },
                                serde_json::Value::Number(n) => td.num { (n) },
                                serde_json::Value::String(s) => td { (s) },
                                other => td { (other) },
                            }
                        } }
                    }
                }
            } }
        },
    };
    Page {
        title: "Query".into(),
        nav: Nav::Query,
        head,
        live,
        done: true,
        refresh: false,
    }
}
