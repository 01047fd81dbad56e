//! The Logs page and the log-line rendering shared with the Task page: one task's (or job's)
//! log entries, filterable, with stderr marked.

use super::layout::{error_box, Nav, Page};
use crate::fmt;
use iris_proto::finelog_logging as fl;
use maud::{html, Markup};

/// Logs page options (the query string).
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct LogsFilter {
    /// Full-log regular expression, evaluated by the server.
    pub regex: String,
    /// Lines of tail to load (default and cap [`MAX_LOG_LINES`](super::MAX_LOG_LINES)).
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
        li.e[e.source() == "stderr"] {
            span.t { (t) } " "
            @if with_key && !e.key().is_empty() { span.k { (e.key()) } " " }
            (e.data())
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
