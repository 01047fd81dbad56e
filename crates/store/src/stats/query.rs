//! `Query`: one read-only SQL statement over the namespaces (and the privileged `log`).
//!
//! SQLite is the engine (the published server uses DataFusion; both read the same simple
//! Postgres-style `SELECT`s that Iris clients send: subqueries, `IN` lists, `ORDER BY`,
//! `LIMIT`, aggregates). Each query gets its own read-only connection with an authorizer that
//! admits only reads and functions (no `ATTACH`, no `PRAGMA`, no writes even to `TEMP`), a
//! deadline enforced by SQLite's progress handler, and a cap on result rows.
//!
//! Result columns are typed from the declaration of the table column they name (which SQLite
//! follows through subqueries and views), else from their values.

use super::{ColumnKind, Value};
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::time::{Duration, Instant};

/// A query may return at most this many rows.
pub const MAX_RESULT_ROWS: usize = 1_000_000;

/// One result column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultColumn {
    pub name: String,
    pub kind: ColumnKind,
}

/// A query's result, column by column.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryResult {
    pub columns: Vec<ResultColumn>,
    /// `values[c][r]`: column `c` of row `r`, of `columns[c].kind`.
    pub values: Vec<Vec<Value>>,
    pub rows: usize,
}

/// Why a query was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The statement does not parse, names an unknown table or column, or is not a read.
    #[error("query failed: {0}")]
    Invalid(String),
    /// More rows than [`MAX_RESULT_ROWS`], or longer than the deadline.
    #[error("{0}")]
    TooLarge(String),
    #[error("stats store: {0}")]
    Sql(rusqlite::Error),
}

fn authorize(ctx: AuthContext<'_>) -> Authorization {
    match ctx.action {
        AuthAction::Select
        | AuthAction::Read { .. }
        | AuthAction::Function { .. }
        | AuthAction::Recursive => Authorization::Allow,
        _ => Authorization::Deny,
    }
}

fn classify(e: rusqlite::Error, sql_timeout: Duration) -> QueryError {
    use rusqlite::ErrorCode;
    match &e {
        rusqlite::Error::SqliteFailure(f, msg) => match f.code {
            ErrorCode::AuthorizationForStatementDenied => QueryError::Invalid(
                "only a read (SELECT or WITH … SELECT) may run here; writes, ATTACH and PRAGMA are refused".into(),
            ),
            ErrorCode::OperationInterrupted => QueryError::TooLarge(format!(
                "query ran longer than {} s; filter on the namespace's key column or add a LIMIT",
                sql_timeout.as_secs()
            )),
            _ => QueryError::Invalid(msg.clone().unwrap_or_else(|| f.to_string())),
        },
        rusqlite::Error::SqlInputError { msg, offset, .. } => {
            QueryError::Invalid(format!("{msg} (at character {offset})"))
        }
        rusqlite::Error::MultipleStatement => {
            QueryError::Invalid("send one statement per query (found more than one)".into())
        }
        _ => QueryError::Sql(e),
    }
}

pub(super) fn run(
    path: &Path,
    log_path: Option<&Path>,
    sql: &str,
    timeout: Duration,
) -> Result<QueryResult, QueryError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(QueryError::Sql)?;
    if let Some(log) = log_path.filter(|p| p.exists()) {
        conn.execute(
            "ATTACH DATABASE ?1 AS logdb",
            [log.to_string_lossy().as_ref()],
        )
        .map_err(QueryError::Sql)?;
        conn.execute_batch(
            "CREATE TEMP VIEW \"log\" AS
             SELECT seq, key, source, data, epoch_ms, level, NULL AS cluster FROM logdb.logs",
        )
        .map_err(QueryError::Sql)?;
    }
    conn.authorizer(Some(authorize));
    let deadline = Instant::now() + timeout;
    conn.progress_handler(10_000, Some(move || Instant::now() > deadline));

    // `Batch` walks the statements of `sql`; exactly one may be there.
    let mut batch = rusqlite::Batch::new(&conn, sql);
    let mut stmt = batch
        .next()
        .map_err(|e| classify(e, timeout))?
        .ok_or_else(|| QueryError::Invalid("the query is empty; send one SELECT".into()))?;
    if batch.next().map_err(|e| classify(e, timeout))?.is_some() {
        return Err(classify(rusqlite::Error::MultipleStatement, timeout));
    }
    let declared: Vec<(String, Option<ColumnKind>)> = stmt
        .columns()
        .iter()
        .map(|c| {
            (
                c.name().to_string(),
                c.decl_type().and_then(ColumnKind::from_decl),
            )
        })
        .collect();
    let width = declared.len();
    let mut values: Vec<Vec<Value>> = vec![Vec::new(); width];
    let mut rows = stmt.query([]).map_err(|e| classify(e, timeout))?;
    let mut count = 0usize;
    while let Some(row) = rows.next().map_err(|e| classify(e, timeout))? {
        count += 1;
        if count > MAX_RESULT_ROWS {
            return Err(QueryError::TooLarge(format!(
                "query returns more than {MAX_RESULT_ROWS} rows; add a LIMIT or aggregate"
            )));
        }
        for (c, column) in values.iter_mut().enumerate() {
            use rusqlite::types::ValueRef;
            let v = match row.get_ref(c).map_err(QueryError::Sql)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(i) => Value::Int(i),
                ValueRef::Real(f) => Value::Real(f),
                ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                ValueRef::Blob(b) => Value::Blob(b.to_vec()),
            };
            column.push(v);
        }
    }
    let mut columns = Vec::with_capacity(width);
    for ((name, decl), column) in declared.into_iter().zip(values.iter_mut()) {
        let kind = match decl {
            Some(k) if column.iter().all(|v| fits(k, v)) => k,
            _ => infer(column),
        };
        if kind == ColumnKind::Float64 {
            for v in column.iter_mut() {
                if let Value::Int(i) = *v {
                    *v = Value::Real(i as f64);
                }
            }
        }
        if kind == ColumnKind::String {
            for v in column.iter_mut() {
                *v = match std::mem::replace(v, Value::Null) {
                    Value::Int(i) => Value::Text(i.to_string()),
                    Value::Real(f) => Value::Text(f.to_string()),
                    Value::Blob(b) => Value::Text(String::from_utf8_lossy(&b).into_owned()),
                    other => other,
                };
            }
        }
        columns.push(super::ResultColumn { name, kind });
    }
    Ok(QueryResult {
        columns,
        values,
        rows: count,
    })
}

fn fits(kind: ColumnKind, v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Int(_) => matches!(
            kind,
            ColumnKind::Int64
                | ColumnKind::Int32
                | ColumnKind::Bool
                | ColumnKind::TimestampMs
                | ColumnKind::Float64
        ),
        Value::Real(_) => kind == ColumnKind::Float64,
        Value::Text(_) => matches!(
            kind,
            ColumnKind::String | ColumnKind::Map | ColumnKind::Float64List | ColumnKind::Int64List
        ),
        Value::Blob(_) => kind == ColumnKind::Bytes,
    }
}

/// The type of an expression column: integers stay integers, any real makes it real, any text
/// (or a mix with blobs) makes it text; a column of only NULLs is text.
fn infer(column: &[Value]) -> ColumnKind {
    let (mut int, mut real, mut text, mut blob) = (false, false, false, false);
    for v in column {
        match v {
            Value::Null => {}
            Value::Int(_) => int = true,
            Value::Real(_) => real = true,
            Value::Text(_) => text = true,
            Value::Blob(_) => blob = true,
        }
    }
    match (int, real, text, blob) {
        (_, _, true, _) => ColumnKind::String,
        (false, false, false, true) => ColumnKind::Bytes,
        (_, _, _, true) => ColumnKind::String,
        (_, true, _, _) => ColumnKind::Float64,
        (true, false, _, _) => ColumnKind::Int64,
        _ => ColumnKind::String,
    }
}
