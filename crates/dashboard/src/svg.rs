//! Inline SVG pictures rendered on the server: meters, per-state bars and attempt timelines.
//! Every picture has a text alternative (`role="img"` + `aria-label`) and sits next to the same
//! figures in text, so colour is never the only carrier of meaning.

use crate::fmt;
use maud::{html, Markup};

/// A horizontal meter: `used` of `total` filled. `label` is the accessible description.
pub fn meter(used: i64, total: i64, label: &str) -> Markup {
    const W: f64 = 160.0;
    let frac = if total > 0 {
        (used.max(0) as f64 / total as f64).min(1.0)
    } else {
        0.0
    };
    let fill = if frac >= 0.9 {
        "#d0342c"
    } else if frac >= 0.6 {
        "#d99a00"
    } else {
        "#1a6fd8"
    };
    html! {
        svg.meter width="160" height="12" viewBox="0 0 160 12" role="img" aria-label=(label) {
            rect x="0" y="0" width="160" height="12" rx="2" fill="#e4e7eb" {}
            rect x="0" y="0" width=(format!("{:.1}", W * frac)) height="12" rx="2" fill=(fill) {}
        }
    }
}

/// A stacked bar of counts by state (friendly names), in [`fmt::STATE_ORDER`].
pub fn state_bar(counts: &[(String, i64)], width: u32) -> Markup {
    let total: i64 = counts.iter().map(|(_, n)| *n).sum();
    let mut ordered: Vec<(&str, i64)> = Vec::new();
    for s in fmt::STATE_ORDER {
        if let Some((_, n)) = counts.iter().find(|(k, n)| k == s && *n > 0) {
            ordered.push((s, *n));
        }
    }
    for (k, n) in counts {
        if *n > 0 && !fmt::STATE_ORDER.contains(&k.as_str()) {
            ordered.push((k, *n));
        }
    }
    let label = if total == 0 {
        "no tasks".to_string()
    } else {
        ordered
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let w = width as f64;
    let mut x = 0.0;
    let segs: Vec<(&str, i64, f64, f64)> = ordered
        .iter()
        .map(|(s, n)| {
            let seg = if total > 0 {
                w * *n as f64 / total as f64
            } else {
                0.0
            };
            let at = x;
            x += seg;
            (*s, *n, at, seg)
        })
        .collect();
    html! {
        svg.bar width=(width) height="10" viewBox=(format!("0 0 {width} 10")) role="img" aria-label=(label) {
            rect x="0" y="0" width=(width) height="10" fill="#eef0f2" {}
            @for (s, n, at, seg) in &segs {
                rect x=(format!("{at:.1}")) y="0" width=(format!("{seg:.1}")) height="10" fill=(fmt::color(s)) {
                    title { (n) " " (s) }
                }
            }
        }
    }
}

/// One attempt drawn on a timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub attempt_id: i64,
    pub state: i32,
    /// When the attempt was created (assigned); the bar starts here.
    pub created_ms: i64,
    /// When it started running, if it did (the thick part starts here).
    pub started_ms: Option<i64>,
    /// When it ended; open attempts run to `now`.
    pub finished_ms: Option<i64>,
    pub worker: String,
    pub exit_code: Option<i64>,
}

/// A row of the timeline: a label (usually the task) and its attempts.
#[derive(Clone, Debug)]
pub struct Row {
    pub label: String,
    pub spans: Vec<Span>,
}

/// Attempts over time: one row per task, one bar per attempt (thin while assigned/building,
/// thick while running), coloured by the attempt's state, with a `<title>` for each.
pub fn timeline(rows: &[Row], now: i64) -> Markup {
    const LABEL_W: f64 = 120.0;
    const PLOT_W: f64 = 600.0;
    const ROW_H: f64 = 18.0;
    let start = rows
        .iter()
        .flat_map(|r| r.spans.iter().map(|s| s.created_ms))
        .min()
        .unwrap_or(now);
    let end = rows
        .iter()
        .flat_map(|r| r.spans.iter().map(|s| s.finished_ms.unwrap_or(now)))
        .max()
        .unwrap_or(now)
        .max(start + 1);
    let scale = PLOT_W / (end - start) as f64;
    let x = |t: i64| LABEL_W + ((t - start) as f64 * scale).clamp(0.0, PLOT_W);
    let height = ROW_H * rows.len() as f64 + 22.0;
    let total_w = LABEL_W + PLOT_W + 8.0;
    let n: usize = rows.iter().map(|r| r.spans.len()).sum();
    let label = format!(
        "Timeline of {n} attempt(s) over {}, from {} to {}",
        fmt::dur(end - start),
        fmt::ts(Some(start)),
        fmt::ts(Some(end))
    );
    html! {
        svg.timeline width=(total_w) height=(height) viewBox=(format!("0 0 {total_w} {height}")) role="img" aria-label=(label) {
            @for (i, r) in rows.iter().enumerate() {
                @let y = ROW_H * i as f64;
                @if i % 2 == 0 {
                    rect x="0" y=(y) width=(total_w) height=(ROW_H) fill="#f6f7f9" {}
                }
                text x="4" y=(y + 13.0) font-size="11" fill="#333" { (r.label) }
                @for s in &r.spans {
                    @let state = fmt::task_state(s.state);
                    @let end_t = s.finished_ms.unwrap_or(now);
                    @let x0 = x(s.created_ms);
                    @let x1 = x(end_t).max(x0 + 2.0);
                    @let xs = s.started_ms.map(|t| x(t).clamp(x0, x1)).unwrap_or(x1);
                    @let tip = format!(
                        "attempt {}: {}{} on {} — {} ({})",
                        s.attempt_id,
                        state,
                        s.exit_code.map(|c| format!(", exit {c}")).unwrap_or_default(),
                        if s.worker.is_empty() { "no worker" } else { s.worker.as_str() },
                        fmt::dur(end_t - s.created_ms),
                        fmt::ts(Some(s.created_ms)),
                    );
                    g {
                        title { (tip) }
                        rect x=(format!("{x0:.1}")) y=(y + 7.0) width=(format!("{:.1}", (xs - x0).max(0.0))) height="4" fill=(fmt::color(state)) opacity="0.6" {}
                        @if xs < x1 {
                            rect x=(format!("{xs:.1}")) y=(y + 3.0) width=(format!("{:.1}", x1 - xs)) height="12" rx="2" fill=(fmt::color(state)) {}
                        }
                    }
                }
            }
            @let axis_y = ROW_H * rows.len() as f64;
            line x1=(LABEL_W) y1=(axis_y + 2.0) x2=(LABEL_W + PLOT_W) y2=(axis_y + 2.0) stroke="#999" {}
            text x=(LABEL_W) y=(axis_y + 16.0) font-size="10" fill="#555" { (fmt::ts(Some(start))) }
            text x=(LABEL_W + PLOT_W) y=(axis_y + 16.0) font-size="10" fill="#555" text-anchor="end" { "+" (fmt::dur(end - start)) }
        }
    }
}

/// A line chart of `(epoch ms, value)` points (oldest first) with the value axis from 0 to the
/// maximum, labelled with `unit`; `label` is the accessible description (the same figures are in
/// text beside it).
pub fn line_chart(points: &[(i64, f64)], unit: &str, label: &str) -> Markup {
    const W: f64 = 320.0;
    const H: f64 = 100.0;
    const PAD: f64 = 4.0;
    let (t0, t1) = match (points.first(), points.last()) {
        (Some(a), Some(b)) => (a.0, b.0.max(a.0 + 1)),
        _ => (0, 1),
    };
    let top = points
        .iter()
        .map(|p| p.1)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let xy = |&(t, v): &(i64, f64)| {
        let x = PAD + (W - 2.0 * PAD) * (t - t0) as f64 / (t1 - t0) as f64;
        let y = H - PAD - (H - 2.0 * PAD) * (v / top);
        (x, y)
    };
    let coords: Vec<(f64, f64)> = points.iter().map(xy).collect();
    let line: Vec<String> = coords
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    let max_label = if top >= 10.0 {
        format!("{top:.0} {unit}")
    } else {
        format!("{top:.2} {unit}")
    };
    html! {
        svg.chart width="320" height="100" viewBox="0 0 320 100" role="img" aria-label=(label) {
            rect x="0" y="0" width="320" height="100" fill="#f6f8fa" {}
            line x1="4" y1="96" x2="316" y2="96" stroke="#c9ced6" {}
            text x="6" y="14" font-size="11" fill="#57606a" { (max_label) }
            @if let [(x, y)] = coords.as_slice() {
                circle cx=(format!("{x:.1}")) cy=(format!("{y:.1}")) r="2.5" fill="#1a6fd8" {}
            } @else {
                polyline points=(line.join(" ")) fill="none" stroke="#1a6fd8" stroke-width="1.5" {}
            }
        }
    }
}
