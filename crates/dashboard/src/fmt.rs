//! Small formatting helpers: times, durations, sizes, state names and their colours.

use iris_types::{Band, JobState, TaskState};

/// `2026-11-29 21:45:01` (UTC) for epoch milliseconds; `—` for none.
pub fn ts(ms: Option<i64>) -> String {
    match ms.and_then(chrono::DateTime::from_timestamp_millis) {
        Some(t) => t.format("%Y-%m-%d %H:%M:%S").to_string(),
        None => "—".into(),
    }
}

/// ISO 8601 for a `<time datetime>` attribute.
pub fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// `1h 02m`, `3m 05s`, `4.2s`, `120ms`.
pub fn dur(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms < 10_000 {
        return format!("{:.1}s", ms as f64 / 1000.0);
    }
    let s = ms / 1000;
    if s < 60 {
        return format!("{s}s");
    }
    if s < 3600 {
        return format!("{}m {:02}s", s / 60, s % 60);
    }
    if s < 86_400 {
        return format!("{}h {:02}m", s / 3600, (s % 3600) / 60);
    }
    format!("{}d {:02}h", s / 86_400, (s % 86_400) / 3600)
}

/// `5s ago` relative to `now`.
pub fn ago(now: i64, ms: i64) -> String {
    if ms <= 0 {
        return "—".into();
    }
    format!("{} ago", dur(now - ms))
}

/// Duration between `start` and `end` (or `now` while running); `—` if never started.
pub fn span(start: Option<i64>, end: Option<i64>, now: i64) -> String {
    match start {
        Some(s) if s > 0 => dur(end.filter(|e| *e > 0).unwrap_or(now) - s),
        _ => "—".into(),
    }
}

/// `16 GiB`, `512 MiB`.
pub fn bytes(b: i64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let f = b as f64;
    if f >= GIB {
        let g = f / GIB;
        if (g - g.round()).abs() < 0.05 {
            format!("{} GiB", g.round())
        } else {
            format!("{g:.1} GiB")
        }
    } else {
        format!("{:.0} MiB", f / MIB)
    }
}

/// Cores from millicores: `4`, `0.5`.
pub fn cores(m: i64) -> String {
    if m % 1000 == 0 {
        format!("{}", m / 1000)
    } else {
        format!("{:.1}", m as f64 / 1000.0)
    }
}

pub fn job_state(code: i32) -> &'static str {
    JobState::from_code(code)
        .map(|s| s.friendly())
        .unwrap_or("unknown")
}

pub fn task_state(code: i32) -> &'static str {
    TaskState::from_code(code)
        .map(|s| s.friendly())
        .unwrap_or("unknown")
}

pub fn band(code: i32) -> &'static str {
    Band::from_code(code).map(|b| b.name()).unwrap_or("unknown")
}

/// Fill colour for a (job or task) state's friendly name. Always shown next to the state's
/// text, so nothing depends on telling colours apart.
pub fn color(state: &str) -> &'static str {
    match state {
        "pending" => "#8d939a",
        "assigned" | "building" => "#d99a00",
        "running" => "#1a6fd8",
        "succeeded" => "#1e8a3c",
        "failed" | "cosched_failed" => "#d0342c",
        "killed" => "#4a4f55",
        "worker_failed" => "#8e44c8",
        "unschedulable" => "#e06c00",
        "preempted" => "#b0572b",
        _ => "#b5bac0",
    }
}

/// Display order of states in bars and legends: active first, then terminal.
pub const STATE_ORDER: &[&str] = &[
    "running",
    "building",
    "assigned",
    "pending",
    "succeeded",
    "failed",
    "killed",
    "worker_failed",
    "preempted",
    "cosched_failed",
    "unschedulable",
];

/// A URL query component, percent-encoded.
pub fn qs(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A path under `/job/`, `/task/` or `/logs/` for an id that starts with `/`.
pub fn id_path(kind: &str, id: &str) -> String {
    let enc: Vec<String> = id
        .trim_start_matches('/')
        .split('/')
        .map(|seg| qs(seg).replace('/', "%2F"))
        .collect();
    format!("/{kind}/{}", enc.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(dur(120), "120ms");
        assert_eq!(dur(4200), "4.2s");
        assert_eq!(dur(65_000), "1m 05s");
        assert_eq!(dur(3_720_000), "1h 02m");
    }

    #[test]
    fn url_escaping() {
        assert_eq!(id_path("job", "/u/my job"), "/job/u/my%20job");
        assert_eq!(qs("a[b"), "a%5Bb");
    }
}
