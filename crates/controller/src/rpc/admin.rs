//! Operator RPCs: read-only SQL.

use crate::error::{Error, Result};
use crate::{lock, Controller};
use iris_proto::query;
use iris_rpc::Code;

impl Controller {
    pub(crate) async fn execute_raw_query(
        &self,
        req: query::RawQueryRequest,
    ) -> Result<query::RawQueryResponse> {
        // A query may run for its whole time limit: keep it off the async workers, so that
        // even several runaway queries never stall RPCs, reconciles or the tick.
        let me = self
            .self_arc()
            .ok_or_else(|| Error::new(Code::Unavailable, "controller is shutting down"))?;
        let r = tokio::task::spawn_blocking(move || {
            let conn = lock(&me.readonly);
            iris_store::query::run_readonly(
                &conn,
                &req.sql,
                me.cfg.query_time_limit,
                me.cfg.query_max_rows,
            )
        })
        .await
        .map_err(Error::internal)?
        .map_err(|e| match e {
            iris_store::query::QueryError::NotAllowed(m) => Error::invalid(m),
            iris_store::query::QueryError::Timeout(_) => {
                Error::new(Code::DeadlineExceeded, e.to_string())
            }
            iris_store::query::QueryError::Sql(m) => Error::invalid(format!("sql: {m}")),
        })?;
        Ok(query::RawQueryResponse {
            columns: r
                .columns
                .into_iter()
                .map(|name| query::ColumnMeta {
                    name,
                    r#type: "unknown".into(),
                })
                .collect(),
            rows: r.rows,
        })
    }
}
