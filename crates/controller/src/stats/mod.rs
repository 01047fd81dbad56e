//! finelog's `StatsService`, served by the controller at `/proxy/system.log-server/` as the
//! published controller's embedded log server does, over [`iris_store::stats`].
//!
//! The controller fills Iris's own namespaces: every task event it records (each transition,
//! each backend verdict, each operator action) is copied to `iris.task_event` by [`periodic`],
//! with the attempt's uid, so the published CLI's `task events` / `attempt events` (which query
//! that namespace) show a task's whole history; the same loop writes the task resource samples
//! workers report (`usage`) and each root job's task counts (`produce`), and applies retention.

mod arrow;
mod produce;
mod usage;

pub(crate) use produce::Capture;

pub(crate) use usage::UsageBuffer;

use crate::error::{Error, Result};
use crate::{lock, Controller};
use iris_proto::finelog::stats as fs;
use iris_store::stats::{
    self as st, ColumnData, ColumnKind, Namespace, Policy, StatsColumn, StatsError, Value,
};
use std::sync::Arc;
use std::time::Duration;

/// A query may run this long before it is stopped.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often task events are copied and retention applied.
const MIRROR_EVERY: Duration = Duration::from_millis(500);
const RETENTION_EVERY: Duration = Duration::from_secs(60);
const TASK_STATE_EVERY: Duration = Duration::from_secs(10);
/// Events copied per pass.
const MIRROR_BATCH: usize = 10_000;

pub(crate) const TASK_EVENT_NAMESPACE: &str = "iris.task_event";
const MIRROR_CURSOR: &str = "task_events";

pub(crate) fn stats_error(e: StatsError) -> Error {
    match e {
        StatsError::Invalid(m) => Error::invalid(m),
        StatsError::NotFound(_) => Error::not_found(e.to_string()),
        StatsError::Conflict(m) => Error::precondition(m),
        StatsError::Sql(e) => Error::internal(e),
    }
}

fn kind_from_proto(name: &str, t: i32) -> Result<ColumnKind> {
    use fs::ColumnType as T;
    Ok(match T::try_from(t).unwrap_or(T::Unknown) {
        T::String => ColumnKind::String,
        T::Int64 => ColumnKind::Int64,
        T::Int32 => ColumnKind::Int32,
        T::Float64 => ColumnKind::Float64,
        T::Bool => ColumnKind::Bool,
        T::TimestampMs => ColumnKind::TimestampMs,
        T::Bytes => ColumnKind::Bytes,
        T::Map => ColumnKind::Map,
        T::Float64List => ColumnKind::Float64List,
        T::Int64List => ColumnKind::Int64List,
        T::Unknown => {
            return Err(Error::invalid(format!(
                "column \"{name}\": unknown column type {t}; set schema.columns[].type to a COLUMN_TYPE_* value"
            )))
        }
    })
}

fn kind_to_proto(k: ColumnKind) -> fs::ColumnType {
    use fs::ColumnType as T;
    match k {
        ColumnKind::String => T::String,
        ColumnKind::Int64 => T::Int64,
        ColumnKind::Int32 => T::Int32,
        ColumnKind::Float64 => T::Float64,
        ColumnKind::Bool => T::Bool,
        ColumnKind::TimestampMs => T::TimestampMs,
        ColumnKind::Bytes => T::Bytes,
        ColumnKind::Map => T::Map,
        ColumnKind::Float64List => T::Float64List,
        ColumnKind::Int64List => T::Int64List,
    }
}

fn schema_to_proto(ns: &Namespace) -> fs::Schema {
    fs::Schema {
        columns: ns
            .columns
            .iter()
            .map(|c| fs::Column {
                name: c.name.clone(),
                r#type: kind_to_proto(c.kind) as i32,
                nullable: c.nullable,
                index: Some(fs::ColumnIndex::default()),
            })
            .collect(),
        key_column: ns.key_column.clone(),
        ..Default::default()
    }
}

fn policy_to_proto(p: Policy) -> fs::StoragePolicy {
    fs::StoragePolicy {
        max_segments: p.max_segments,
        max_bytes: p.max_bytes,
        max_age_seconds: p.max_age_seconds,
    }
}

/// The privileged `log` namespace's schema: the log store's columns.
fn log_schema() -> fs::Schema {
    let col = |name: &str, t: fs::ColumnType, nullable: bool| fs::Column {
        name: name.into(),
        r#type: t as i32,
        nullable,
        index: Some(fs::ColumnIndex::default()),
    };
    use fs::ColumnType as T;
    fs::Schema {
        columns: vec![
            col("key", T::String, false),
            col("source", T::String, false),
            col("data", T::String, false),
            col("epoch_ms", T::Int64, false),
            col("level", T::Int32, false),
            col(st::CLUSTER_COLUMN, T::String, true),
        ],
        key_column: "key".into(),
        ..Default::default()
    }
}

impl Controller {
    pub(crate) async fn register_table(
        &self,
        req: fs::RegisterTableRequest,
    ) -> Result<fs::RegisterTableResponse> {
        let schema = req.schema.unwrap_or_default();
        let columns = schema
            .columns
            .iter()
            .map(|c| {
                Ok(StatsColumn {
                    name: c.name.clone(),
                    kind: kind_from_proto(&c.name, c.r#type)?,
                    nullable: c.nullable,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let p = req.storage_policy.unwrap_or_default();
        if p.max_segments < 0 || p.max_bytes < 0 || p.max_age_seconds < 0 {
            return Err(Error::invalid(
                "storage_policy: limits must not be negative (0 = the server's default)",
            ));
        }
        let policy = Policy {
            max_segments: p.max_segments,
            max_bytes: p.max_bytes,
            max_age_seconds: p.max_age_seconds,
        };
        let ns = lock(&self.stats)
            .register(&req.namespace, columns, &schema.key_column, policy)
            .map_err(stats_error)?;
        Ok(fs::RegisterTableResponse {
            effective_schema: Some(schema_to_proto(&ns)),
            effective_policy: Some(policy_to_proto(ns.policy)),
            ..Default::default()
        })
    }

    pub(crate) async fn write_rows(
        &self,
        req: fs::WriteRowsRequest,
    ) -> Result<fs::WriteRowsResponse> {
        let batch =
            arrow::decode(&req.arrow_ipc).map_err(|e| Error::invalid(format!("WriteRows: {e}")))?;
        let rows = lock(&self.stats)
            .write(&req.namespace, &batch, iris_store::now_ms())
            .map_err(stats_error)?;
        Ok(fs::WriteRowsResponse { rows_written: rows })
    }

    pub(crate) async fn query_stats(&self, req: fs::QueryRequest) -> Result<fs::QueryResponse> {
        let handle = lock(&self.stats).query_handle();
        let result = tokio::task::spawn_blocking(move || handle.run(&req.sql, QUERY_TIMEOUT))
            .await
            .map_err(Error::internal)?
            .map_err(|e| match e {
                st::QueryError::Sql(e) => Error::internal(e),
                other => Error::invalid(other.to_string()),
            })?;
        let ipc = arrow::encode(&result).map_err(Error::internal)?;
        Ok(fs::QueryResponse {
            arrow_ipc: ipc,
            row_count: result.rows as i64,
        })
    }

    pub(crate) async fn drop_table(
        &self,
        req: fs::DropTableRequest,
    ) -> Result<fs::DropTableResponse> {
        lock(&self.stats)
            .drop_table(&req.namespace)
            .map_err(stats_error)?;
        Ok(fs::DropTableResponse {})
    }

    pub(crate) async fn list_namespaces(
        &self,
        _req: fs::ListNamespacesRequest,
    ) -> Result<fs::ListNamespacesResponse> {
        let (rows, min_seq, max_seq) =
            iris_store::logs::extent(&lock(&self.logs)).map_err(Error::internal)?;
        let mut namespaces = vec![fs::NamespaceInfo {
            namespace: st::LOG_NAMESPACE.into(),
            schema: Some(log_schema()),
            row_count: rows,
            min_seq,
            max_seq,
            segment_count: i32::from(rows > 0),
            ..Default::default()
        }];
        let listed = lock(&self.stats).namespaces().map_err(stats_error)?;
        namespaces.extend(listed.into_iter().map(|(ns, extent)| fs::NamespaceInfo {
            namespace: ns.name.clone(),
            schema: Some(schema_to_proto(&ns)),
            row_count: extent.rows,
            byte_size: extent.bytes,
            min_seq: extent.min_seq,
            max_seq: extent.max_seq,
            segment_count: extent.batches,
            storage_policy: Some(policy_to_proto(ns.policy)),
        }));
        Ok(fs::ListNamespacesResponse { namespaces })
    }

    fn registered(&self, ns: &str) -> Result<Namespace> {
        lock(&self.stats)
            .namespace(ns)
            .map_err(stats_error)?
            .ok_or_else(|| stats_error(StatsError::NotFound(ns.into())))
    }

    pub(crate) async fn get_table_schema(
        &self,
        req: fs::GetTableSchemaRequest,
    ) -> Result<fs::GetTableSchemaResponse> {
        let schema = if req.namespace == st::LOG_NAMESPACE {
            log_schema()
        } else {
            schema_to_proto(&self.registered(&req.namespace)?)
        };
        Ok(fs::GetTableSchemaResponse {
            schema: Some(schema),
        })
    }

    pub(crate) async fn get_table_status(
        &self,
        req: fs::GetTableStatusRequest,
    ) -> Result<fs::GetTableStatusResponse> {
        if req.namespace != st::LOG_NAMESPACE {
            self.registered(&req.namespace)?;
        }
        Ok(fs::GetTableStatusResponse {
            catalog_generation: Some(0),
            migration_blocked: Some(false),
            migration_error: Some(String::new()),
        })
    }

    pub(crate) async fn abort_table_migration(
        &self,
        req: fs::AbortTableMigrationRequest,
    ) -> Result<fs::AbortTableMigrationResponse> {
        self.registered(&req.namespace)?;
        Err(Error::precondition(format!(
            "namespace \"{}\" has no table migration to abort: this server keeps one version of each table",
            req.namespace
        )))
    }

    pub(crate) async fn report_relay_status(
        &self,
        _req: fs::ReportRelayStatusRequest,
    ) -> Result<fs::ReportRelayStatusResponse> {
        Err(Error::precondition(
            "this log server is not a relay hub: point the relay's target at the hub cluster's finelog server",
        ))
    }

    pub(crate) async fn list_relay_status(
        &self,
        _req: fs::ListRelayStatusRequest,
    ) -> Result<fs::ListRelayStatusResponse> {
        Ok(fs::ListRelayStatusResponse {})
    }

    /// Copies task events recorded since the last pass into `iris.task_event`; returns how
    /// many were copied.
    pub(crate) fn mirror_task_events(&self) -> Result<usize> {
        // The stats lock is never held while the snapshot lock is taken (one order: snapshot,
        // then stats); only this loop moves the cursor, so it cannot change in between.
        let cursor = {
            let mut stats = lock(&self.stats);
            if stats
                .namespace(TASK_EVENT_NAMESPACE)
                .map_err(stats_error)?
                .is_none()
            {
                stats
                    .register(
                        TASK_EVENT_NAMESPACE,
                        task_event_columns(),
                        "task_id",
                        task_event_policy(),
                    )
                    .map_err(stats_error)?;
            }
            stats.cursor(MIRROR_CURSOR).map_err(stats_error)?
        };
        let (events, newest) = {
            let snap = lock(&self.snap);
            let tx = snap.begin_read()?;
            iris_store::events::since(&tx, cursor, MIRROR_BATCH)?
        };
        let mut stats = lock(&self.stats);
        if events.is_empty() {
            if newest < cursor {
                // The controller DB was restored to an earlier history: follow it.
                stats
                    .set_cursor(MIRROR_CURSOR, newest)
                    .map_err(stats_error)?;
            }
            return Ok(0);
        }
        let last = events.last().map_or(cursor, |e| e.id);
        let n = events.len();
        let text = |f: &dyn Fn(&iris_store::events::StoredEvent) -> Value| -> Vec<Value> {
            events.iter().map(f).collect()
        };
        let batch = vec![
            data(
                "task_id",
                ColumnKind::String,
                text(&|e| Value::Text(e.task_id.clone())),
            ),
            data(
                "attempt_id",
                ColumnKind::Int64,
                text(&|e| e.attempt_id.map_or(Value::Null, Value::Int)),
            ),
            data(
                "attempt_uid",
                ColumnKind::String,
                text(&|e| e.attempt_uid.clone().map_or(Value::Null, Value::Text)),
            ),
            data(
                "ts",
                ColumnKind::TimestampMs,
                text(&|e| Value::Int(e.ts_ms)),
            ),
            data(
                "type",
                ColumnKind::String,
                text(&|e| Value::Text(e.kind.clone())),
            ),
            data(
                "reason",
                ColumnKind::String,
                text(&|e| Value::Text(e.reason.clone())),
            ),
            data(
                "message",
                ColumnKind::String,
                text(&|e| Value::Text(e.message.clone())),
            ),
            data(
                "source",
                ColumnKind::String,
                text(&|e| Value::Text(e.source.clone())),
            ),
            data("count", ColumnKind::Int64, text(&|_| Value::Int(1))),
        ];
        stats
            .write_advancing(
                TASK_EVENT_NAMESPACE,
                &batch,
                iris_store::now_ms(),
                (MIRROR_CURSOR, last),
            )
            .map_err(stats_error)?;
        Ok(n)
    }
}

pub(crate) fn data(name: &str, kind: ColumnKind, values: Vec<Value>) -> ColumnData {
    ColumnData {
        name: name.into(),
        kind,
        values,
    }
}

/// `iris.task_event`'s columns, as the published controller registers them (every column
/// nullable, the Kubernetes disruption evidence first).
fn task_event_columns() -> Vec<StatsColumn> {
    let strings = [
        "pod_name",
        "pod_uid",
        "pod_deletion_timestamp",
        "node_name",
        "node_uid",
        "node_provider_id",
        "node_boot_id",
        "node_system_uuid",
    ];
    let json = [
        "pod_tolerations_json",
        "pod_conditions_json",
        "node_taints_json",
        "node_conditions_json",
        "node_labels_json",
        "node_annotations_json",
    ];
    let c = |name: &str, kind| StatsColumn {
        name: name.into(),
        kind,
        nullable: true,
    };
    let mut cols: Vec<StatsColumn> = strings.iter().map(|n| c(n, ColumnKind::String)).collect();
    cols.push(c("node_unschedulable", ColumnKind::Bool));
    cols.extend(json.iter().map(|n| c(n, ColumnKind::String)));
    for (name, kind) in [
        ("task_id", ColumnKind::String),
        ("attempt_id", ColumnKind::Int64),
        ("attempt_uid", ColumnKind::String),
        ("ts", ColumnKind::TimestampMs),
        ("type", ColumnKind::String),
        ("reason", ColumnKind::String),
        ("message", ColumnKind::String),
        ("source", ColumnKind::String),
        ("count", ColumnKind::Int64),
    ] {
        cols.push(c(name, kind));
    }
    cols
}

/// The published retention for task events: 30 days or 1 GiB.
fn task_event_policy() -> Policy {
    Policy {
        max_segments: 0,
        max_bytes: 1024 * 1024 * 1024,
        max_age_seconds: 30 * 24 * 3600,
    }
}

/// Copies task events every [`MIRROR_EVERY`] and applies retention every [`RETENTION_EVERY`].
pub(crate) async fn periodic(
    ctl: Arc<Controller>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut since_retention = Duration::ZERO;
    let mut since_task_state = TASK_STATE_EVERY;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(MIRROR_EVERY) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        since_retention += MIRROR_EVERY;
        let c = ctl.clone();
        let retention = since_retention >= RETENTION_EVERY;
        if retention {
            since_retention = Duration::ZERO;
        }
        since_task_state += MIRROR_EVERY;
        let task_state = since_task_state >= TASK_STATE_EVERY;
        if task_state {
            since_task_state = Duration::ZERO;
        }
        let outcome = tokio::task::spawn_blocking(move || -> Result<()> {
            while c.mirror_task_events()? == MIRROR_BATCH {}
            c.flush_usage()?;
            if task_state {
                c.write_task_state()?;
            }
            if retention {
                let removed = lock(&c.stats)
                    .enforce_retention(iris_store::now_ms())
                    .map_err(stats_error)?;
                if removed > 0 {
                    tracing::info!(rows = removed, "stats retention removed rows");
                }
            }
            Ok(())
        })
        .await;
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "stats mirror pass failed"),
            Err(e) => tracing::error!(error = %e, "stats mirror pass panicked"),
        }
    }
}
