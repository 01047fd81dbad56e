//! The Backends page: capacity per device variant, and for Kubernetes backends the free/total
//! GPUs, what each band holds and the cluster's nodes.

use super::layout::{error_box, Nav, Page};
use crate::fmt;
use crate::model::Variant;
use crate::svg;
use iris_proto::cluster::controller as c;
use maud::{html, Markup};

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
