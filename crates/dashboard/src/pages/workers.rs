//! The Workers page: each worker's health, last heartbeat and committed resources.

use super::layout::{error_box, ms, time_cell, Nav, Page};
use crate::fmt;
use crate::model::Committed;
use crate::svg;
use iris_proto::cluster::controller as c;
use maud::html;
use std::collections::BTreeMap;

pub fn workers_page(
    resp: Result<&c::ListWorkersResponse, &str>,
    committed: &BTreeMap<String, Committed>,
    now: i64,
) -> Page {
    let live = match resp {
        Err(e) => error_box("Cannot list workers:", e),
        Ok(r) => {
            let healthy = r
                .workers
                .iter()
                .filter(|w| w.healthy.unwrap_or_default())
                .count();
            html! {
                p { (r.workers.len()) " worker(s), " (healthy) " healthy." }
                div.tablewrap { table {
                    caption.sr-only { "Workers" }
                    thead { tr {
                        th scope="col" { "Worker" } th scope="col" { "Health" } th scope="col" { "Last seen" }
                        th scope="col" { "Devices" } th scope="col" { "CPU committed" } th scope="col" { "Memory committed" }
                        th scope="col" { "Running tasks" }
                    } }
                    tbody {
                        @for w in &r.workers {
                            @let md = w.metadata.clone().unwrap_or_default();
                            @let (kind, variant, units) = crate::model::advertised(w);
                            @let cm = committed.get(w.worker_id()).cloned().unwrap_or_default();
                            @let cpu_total = md.cpu_count() as i64 * 1000;
                            tr {
                                td { span.id { (w.worker_id()) } br; span.muted { (w.address()) } }
                                td { @if w.healthy.unwrap_or_default() { span.ok { "✓ healthy" } } @else { span.bad { "✗ unhealthy" } } }
                                td { (time_cell(now, ms(&w.last_heartbeat))) }
                                td { @if kind == "cpu" { (units) " cores" } @else { (units) "× " (variant.to_uppercase()) " " (kind.to_uppercase()) br; span.muted { (cm.units) " held" } } }
                                td.meter-cell {
                                    (svg::meter(cm.cpu_millicores, cpu_total, &format!("{} of {} cores committed", fmt::cores(cm.cpu_millicores), md.cpu_count())))
                                    " " span.num { (fmt::cores(cm.cpu_millicores)) "/" (md.cpu_count()) }
                                }
                                td.meter-cell {
                                    (svg::meter(cm.memory_bytes, md.memory_bytes.unwrap_or_default(), &format!("{} of {} memory committed", fmt::bytes(cm.memory_bytes), fmt::bytes(md.memory_bytes.unwrap_or_default()))))
                                    " " span.num { (fmt::bytes(cm.memory_bytes)) " / " (fmt::bytes(md.memory_bytes.unwrap_or_default())) }
                                }
                                td {
                                    @if w.running_job_ids.is_empty() { span.muted { "idle" } }
                                    @for (i, j) in w.running_job_ids.iter().enumerate() {
                                        @if i > 0 { ", " }
                                        a href=(fmt::id_path("task", j)) { (j) }
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
