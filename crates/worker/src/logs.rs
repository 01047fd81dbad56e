//! Log shipping: an attempt's stdout and stderr lines are numbered, batched and pushed to the
//! controller's log service (`finelog.logging.LogService/PushLogs`), retrying through a
//! controller restart but not past the heartbeat timeout.

use crate::Inner;
use iris_proto::finelog::logging as fl;
use std::time::{Duration, Instant};

/// Log lines this worker dropped because the controller could not store them (its disk full).
pub(crate) static DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Log shipping: lines are batched and pushed to the controller's log service.
pub(crate) struct LogShipper {
    pub(crate) key: String,
    pub(crate) buf: Vec<fl::LogEntry>,
    /// Lines are numbered per attempt (`LogEntry.seq`, from 1) so a retried push is stored once.
    pub(crate) next_seq: i64,
}

impl LogShipper {
    pub(crate) async fn flush(&mut self, inner: &Inner) {
        if self.buf.is_empty() {
            return;
        }
        let req = fl::PushLogsRequest {
            key: self.key.clone(),
            entries: std::mem::take(&mut self.buf),
            cluster: String::new(),
        };
        // Keep trying through a controller restart (the terminal state is reported only after
        // the logs are in), but not past the heartbeat timeout.
        let give_up = Instant::now() + inner.cfg.heartbeat_timeout.max(Duration::from_secs(10));
        let mut delay = Duration::from_millis(100);
        for attempt in 0u32.. {
            match inner
                .rpc
                .call::<_, fl::PushLogsResponse>(
                    "finelog.logging.LogService",
                    "PushLogs",
                    &req,
                    Duration::from_secs(10),
                )
                .await
            {
                Ok(_) => return,
                // The controller's disk is full: the lines are lost either way, and waiting for
                // space would stall the task's output pipe. Drop them now and count them.
                Err(e) if e.code == iris_rpc::Code::ResourceExhausted => {
                    let n = req.entries.len() as u64;
                    let total = DROPPED.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
                    tracing::warn!(error = %e, key = %req.key, dropped = n, dropped_total = total, "dropping log lines");
                    return;
                }
                Err(e)
                    if Instant::now() < give_up
                        && (e.code == iris_rpc::Code::Unavailable || attempt < 5) =>
                {
                    tracing::warn!(error = %e, attempt, "pushing logs failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::error!(error = %e, attempt, key = %req.key, "dropping log lines");
                    return;
                }
            }
        }
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
