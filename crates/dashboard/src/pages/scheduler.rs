//! The Scheduler page: pending tasks by band with the scheduler's reason each one waits.

use super::job::task_index;
use super::layout::{error_box, Nav, Page};
use super::SCHEDULER_JOBS_PER_BAND;
use crate::fmt;
use iris_proto::cluster::controller as c;
use maud::html;
use std::collections::BTreeMap;

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
