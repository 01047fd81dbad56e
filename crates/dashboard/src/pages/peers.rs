//! The Peers page: federation peers' reachability, last contact and per-variant capacity held
//! by band.

use super::layout::{error_box, Nav, Page};
use crate::fmt;
use crate::svg;
use iris_proto::cluster::controller as c;
use maud::html;

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
