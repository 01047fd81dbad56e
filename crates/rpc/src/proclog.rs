//! The daemon's own recent log lines, kept in memory: a `tracing` layer ([`layer`]) that the
//! `iris` binary installs beside its stderr formatter, read back with [`recent`] by
//! `GetProcessStatus` and by `FetchLogs` for the `/system/...` sources (`iris process logs`).
//!
//! One ring per process: in `cluster start --local` the controller and its workers share it.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// How many lines the ring keeps (about a megabyte of typical lines).
pub const CAPACITY: usize = 5000;

/// One captured line. `level` is the wire code of `iris.logging.LogLevel` (DEBUG=1 …
/// CRITICAL=5); `seq` grows by one per line, from 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub seq: i64,
    pub epoch_ms: i64,
    pub level: i32,
    pub data: String,
}

struct Ring {
    lines: VecDeque<Line>,
    next_seq: i64,
}

static RING: Mutex<Ring> = Mutex::new(Ring {
    lines: VecDeque::new(),
    next_seq: 1,
});

fn ring() -> MutexGuard<'static, Ring> {
    RING.lock().unwrap_or_else(|e| e.into_inner())
}

/// The wire level code of a `tracing` level (TRACE counts as DEBUG).
pub fn level_code(level: &Level) -> i32 {
    match *level {
        Level::TRACE | Level::DEBUG => 1,
        Level::INFO => 2,
        Level::WARN => 3,
        Level::ERROR => 4,
    }
}

/// The wire level code of a level name as `--level` takes it (`""`: every level).
pub fn parse_level(name: &str) -> Result<i32, String> {
    match name.trim().to_ascii_uppercase().as_str() {
        "" => Ok(0),
        "DEBUG" | "TRACE" => Ok(1),
        "INFO" => Ok(2),
        "WARNING" | "WARN" => Ok(3),
        "ERROR" => Ok(4),
        "CRITICAL" | "FATAL" => Ok(5),
        other => Err(format!(
            "min_level: unknown level {other:?}; use one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
        )),
    }
}

/// Appends a line (the layer does this for every event at INFO or above).
pub fn push(level: i32, data: String) {
    let epoch_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let mut r = ring();
    let seq = r.next_seq;
    r.next_seq += 1;
    if r.lines.len() == CAPACITY {
        r.lines.pop_front();
    }
    r.lines.push_back(Line {
        seq,
        epoch_ms,
        level,
        data,
    });
}

/// Which lines [`recent`] returns.
#[derive(Clone, Debug, Default)]
pub struct Query<'a> {
    /// Only lines containing this (empty: all).
    pub substring: &'a str,
    /// Only lines at this wire level or above (0: all).
    pub min_level: i32,
    /// Only lines after this sequence number (0: from the oldest kept).
    pub after_seq: i64,
    /// At most this many (0: 1000).
    pub max_lines: usize,
    /// The newest `max_lines` rather than the oldest.
    pub tail: bool,
}

/// The matching lines, oldest first, and the cursor to pass as `after_seq` next time (every
/// line up to it has been considered).
pub fn recent(q: &Query<'_>) -> (Vec<Line>, i64) {
    let max = if q.max_lines == 0 { 1000 } else { q.max_lines };
    let r = ring();
    let newest = r.next_seq - 1;
    let matching = r.lines.iter().filter(|l| {
        l.seq > q.after_seq
            && l.level >= q.min_level
            && (q.substring.is_empty() || l.data.contains(q.substring))
    });
    if q.tail {
        let mut out: Vec<Line> = matching.rev().take(max).cloned().collect();
        out.reverse();
        return (out, newest.max(q.after_seq));
    }
    let out: Vec<Line> = matching.take(max + 1).cloned().collect();
    if out.len() > max {
        let kept = out[..max].to_vec();
        let cursor = kept.last().map(|l| l.seq).unwrap_or(q.after_seq);
        return (kept, cursor);
    }
    (out, newest.max(q.after_seq))
}

/// The layer: every event at INFO or above, whatever the stderr filter (`IRIS_LOG`, `-v`)
/// lets through, formatted as `LEVEL target: message key=value ...`.
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    RingLayer.with_filter(LevelFilter::INFO)
}

struct RingLayer;

impl<S: Subscriber> Layer<S> for RingLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut v = Fields::default();
        event.record(&mut v);
        push(
            level_code(meta.level()),
            format!(
                "{} {}: {}{}",
                meta.level(),
                meta.target(),
                v.message,
                v.rest
            ),
        );
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn the_layer_keeps_info_and_above_and_filters_by_substring_level_and_cursor() {
        let sub = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(sub, || {
            tracing::debug!("ring-test debug line");
            tracing::info!(job = "/u/ring-test", n = 3, "ring-test accepted");
            tracing::warn!(error = %"disk slow", "ring-test warning");
        });
        let (lines, cursor) = recent(&Query {
            substring: "ring-test",
            ..Default::default()
        });
        let data: Vec<&str> = lines.iter().map(|l| l.data.as_str()).collect();
        assert_eq!(data.len(), 2, "{data:?}");
        assert!(data[0].starts_with("INFO "), "{data:?}");
        assert!(
            data[0].ends_with("ring-test accepted job=/u/ring-test n=3"),
            "{data:?}"
        );
        assert!(
            data[1].contains("ring-test warning error=disk slow"),
            "{data:?}"
        );
        let (warn_only, _) = recent(&Query {
            substring: "ring-test",
            min_level: 3,
            ..Default::default()
        });
        assert_eq!(warn_only.len(), 1);
        let (after, _) = recent(&Query {
            substring: "ring-test",
            after_seq: cursor,
            ..Default::default()
        });
        assert!(after.is_empty(), "{after:?}");
        assert_eq!(parse_level("warning"), Ok(3));
        assert!(parse_level("loud").unwrap_err().contains("min_level"));
    }
}
