//! Log RPCs (`LogService`).

use crate::error::{Error, Result};
use crate::{lock, Controller};
use iris_proto::finelog::logging as fl;

use super::now;

impl Controller {
    pub(crate) async fn push_logs(&self, req: fl::PushLogsRequest) -> Result<fl::PushLogsResponse> {
        if req.key.is_empty() {
            return Err(Error::invalid(
                "key: the log key (<task>:<attempt>) is required",
            ));
        }
        // A positive `seq` is the writer's own line number: retried pushes are stored once.
        let lines: Vec<(String, String, i64, i32, Option<i64>)> = req
            .entries
            .into_iter()
            .map(|e| {
                (
                    e.source.unwrap_or_default(),
                    e.data.unwrap_or_default(),
                    e.timestamp.map(|t| t.epoch_ms).unwrap_or_else(now),
                    e.level.unwrap_or_default(),
                    e.seq.filter(|&s| s > 0),
                )
            })
            .collect();
        let bytes: usize = lines.iter().map(|l| l.1.len()).sum();
        let mut conn = lock(&self.logs);
        iris_store::logs::append_numbered(&mut conn, &req.key, &lines)?;
        self.metrics.logs_stored(lines.len(), bytes);
        Ok(fl::PushLogsResponse {})
    }

    pub(crate) async fn fetch_logs(
        &self,
        req: fl::FetchLogsRequest,
    ) -> Result<fl::FetchLogsResponse> {
        let scope = match req.match_scope {
            1 => iris_store::logs::Scope::Exact,
            2 => iris_store::logs::Scope::Prefix,
            _ => iris_store::logs::Scope::Regex,
        };
        if req.max_lines < 0 {
            return Err(Error::invalid("max_lines must not be negative (0 = 1000)"));
        }
        let min_level = iris_store::logs::parse_level(&req.min_level).map_err(Error::invalid)?;
        if req.source.starts_with("/system/") && req.source != super::endpoints::LOG_SERVER {
            super::process::check_system_log_reader()?;
            if let Some(r) = self.fetch_system_logs(&req, min_level).await? {
                return Ok(r);
            }
        }
        let caller = crate::auth::caller();
        if caller.role == iris_auth::Role::FederationPeer {
            let key = crate::federation::log_job_key(&req.source);
            self.check_received_from(key, &caller.user_id)?;
        } else if let Some(peer) = self.log_peer(&req.source) {
            return self.fetch_logs_from_peer(&peer, &req).await;
        }
        let q = iris_store::logs::FetchQuery {
            source: req.source.clone(),
            scope,
            since_ms: req.since_ms,
            cursor: req.cursor,
            until_cursor: req.until_cursor,
            substring: req.substring,
            regex: req.regex,
            max_lines: req.max_lines.min(100_000) as usize,
            tail: req.tail,
            min_level,
        };
        let conn = lock(&self.logs);
        let (lines, cursor) = iris_store::logs::fetch(&conn, &q).map_err(|e| match e {
            iris_store::logs::FetchError::BadRegex(..) => Error::invalid(e.to_string()),
            other => Error::internal(other),
        })?;
        let entries = lines
            .into_iter()
            .map(|l| fl::LogEntry {
                timestamp: Some(fl::Timestamp {
                    epoch_ms: l.epoch_ms,
                }),
                // Every field is sent, zeros too, as the published log server sends them; the
                // key only on a multi-key read.
                attempt_id: Some(
                    l.key
                        .rsplit_once(':')
                        .and_then(|(_, n)| n.parse().ok())
                        .unwrap_or(0),
                ),
                source: Some(l.source),
                data: Some(l.data),
                level: Some(l.level),
                key: (scope != iris_store::logs::Scope::Exact).then_some(l.key),
                seq: Some(l.seq),
            })
            .collect();
        Ok(fl::FetchLogsResponse { entries, cursor })
    }
}
