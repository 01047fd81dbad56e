//! The page shell every page shares: the navigation, the [`Page`] (static head plus live
//! region) and the whole document around it, with the small components pages are built from
//! (state badges, error boxes, relative times).

use super::REFRESH_MS;
use crate::fmt;
use maud::{html, Markup, DOCTYPE};

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

pub(super) fn time_cell(now: i64, ms: Option<i64>) -> Markup {
    match ms.filter(|m| *m > 0) {
        Some(m) => {
            html! { time datetime=(fmt::iso(m)) title=(fmt::ts(Some(m))) { (fmt::ago(now, m)) } }
        }
        None => html! { "—" },
    }
}

pub(super) fn ms(t: &Option<iris_proto::time::Timestamp>) -> Option<i64> {
    t.as_ref().map(|t| t.epoch_ms()).filter(|m| *m > 0)
}
