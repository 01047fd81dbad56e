//! The Jobs page: the filterable, paged job list with counts by state (the dashboard's landing
//! page).

use super::layout::{badge, error_box, ms, time_cell, Nav, Page};
use super::JOBS_PER_PAGE;
use crate::fmt;
use crate::svg;
use iris_proto::cluster::controller as c;
use iris_proto::inspect as pb;
use iris_proto::job;
use maud::{html, Markup};

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
pub(super) fn user_cell(j: &job::JobStatus) -> Markup {
    let owner = j.job_id().split('/').nth(1).unwrap_or("");
    html! {
        (owner)
        @if !j.submitting_user().is_empty() && j.submitting_user() != owner {
            br; span.muted { "by " (j.submitting_user()) }
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

pub(super) fn legend(counts: &[(String, i64)]) -> Markup {
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
            let last_page = ((i64::from(r.total_count.unwrap_or_default()) + JOBS_PER_PAGE as i64
                - 1)
                / JOBS_PER_PAGE as i64)
                .max(1);
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
                            @if shown == 0 { "none match" } @else { (first + 1) "–" (first + shown) " of " (r.total_count()) @if r.total_count_is_lower_bound() { "+" } }
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
                                @let st = fmt::job_state(j.state.unwrap_or_default());
                                @let counts: Vec<(String, i64)> = j.task_state_counts.iter().map(|(k, v)| (k.clone(), *v as i64)).collect();
                                @let done = j.task_state_counts.get("succeeded").copied().unwrap_or(0);
                                tr {
                                    td.id { a href=(fmt::id_path("job", j.job_id())) { (j.job_id()) } }
                                    td { (badge(st)) }
                                    td.tasks { (svg::state_bar(&counts, 64)) " " span.num { (done) "/" (j.task_count()) } }
                                    td { (user_cell(j)) }
                                    td { (time_cell(now, ms(&j.submitted_at))) }
                                    td.num { (fmt::span(ms(&j.started_at), ms(&j.finished_at), now)) }
                                    td.reason { (j.pending_reason()) }
                                }
                            }
                        }
                    }
                }
                nav.pager aria-label="Pages" {
                    @if page > 1 { a href=(f.link(page - 1)) rel="prev" { "← Newer" } } @else { span.muted { "← Newer" } }
                    span { "Page " (page) " of " (last_page) }
                    @if r.has_more.unwrap_or_default() && (page as i64) < max_page { a href=(f.link(page + 1)) rel="next" { "Older →" } } @else { span.muted { "Older →" } }
                    @if r.has_more.unwrap_or_default() && (page as i64) >= max_page { span.muted { " (older jobs: narrow the filter)" } }
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
