//! The stats store behind finelog's `StatsService`: typed, append-only tables ("namespaces")
//! that producers write in batches and readers query with SQL. Iris keeps its time series here
//! (`iris.task_event`, `iris.task`, `iris.worker`, `iris.task_state`, …), never in the
//! controller DB.
//!
//! One SQLite file (`stats.sqlite3`), apart from the controller DB and the log DB so that
//! telemetry never contends with the scheduler's commits. Each namespace is a table named
//! exactly as the namespace (the namespace rule admits no quote), with the server-assigned
//! `seq` first and the registered columns after it, so `SELECT *` returns what the published
//! server returns. Column types are declared with names that both give SQLite the right
//! affinity and let a query's result be typed from the declaration ([`ColumnKind::decl`]).
//!
//! Retention works on *batches*: each write is recorded (merged into the namespace's newest
//! batch while that is under a minute old) with its seq range, row count, byte size and time,
//! so age and size limits drop whole batches, oldest first, without scanning rows.

mod query;
mod series;
#[cfg(test)]
mod tests;

pub use query::{QueryError, QueryResult, ResultColumn, MAX_RESULT_ROWS};

use rusqlite::{params, Connection, OptionalExtension};
use std::path::{Path, PathBuf};

/// A column's type, as the published `ColumnType` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnKind {
    String,
    Int64,
    Int32,
    Float64,
    Bool,
    /// Milliseconds since the epoch.
    TimestampMs,
    Bytes,
    /// A string-to-string map, stored as a JSON object.
    Map,
    /// Stored as a JSON array.
    Float64List,
    /// Stored as a JSON array.
    Int64List,
}

const KINDS: [ColumnKind; 10] = [
    ColumnKind::String,
    ColumnKind::Int64,
    ColumnKind::Int32,
    ColumnKind::Float64,
    ColumnKind::Bool,
    ColumnKind::TimestampMs,
    ColumnKind::Bytes,
    ColumnKind::Map,
    ColumnKind::Float64List,
    ColumnKind::Int64List,
];

impl ColumnKind {
    /// The declared SQLite type. Each name gets the affinity its values need (`…INT…` integer,
    /// `TEXT…` text, `REAL`, `BLOB`) and is distinct, so [`ColumnKind::from_decl`] recovers the
    /// kind of a result column that names a table column.
    pub fn decl(self) -> &'static str {
        match self {
            Self::String => "TEXT",
            Self::Int64 => "INTEGER",
            Self::Int32 => "INT32",
            Self::Float64 => "REAL",
            Self::Bool => "BOOL_INT",
            Self::TimestampMs => "TIMESTAMP_MS_INT",
            Self::Bytes => "BLOB",
            Self::Map => "TEXT_MAP",
            Self::Float64List => "TEXT_F64_LIST",
            Self::Int64List => "TEXT_I64_LIST",
        }
    }

    /// The kind a declared type stands for (case-insensitive).
    pub fn from_decl(decl: &str) -> Option<Self> {
        KINDS
            .into_iter()
            .find(|k| k.decl().eq_ignore_ascii_case(decl))
    }

    /// The published enum's name without its `COLUMN_TYPE_` prefix.
    pub fn name(self) -> &'static str {
        match self {
            Self::String => "STRING",
            Self::Int64 => "INT64",
            Self::Int32 => "INT32",
            Self::Float64 => "FLOAT64",
            Self::Bool => "BOOL",
            Self::TimestampMs => "TIMESTAMP_MS",
            Self::Bytes => "BYTES",
            Self::Map => "MAP",
            Self::Float64List => "FLOAT64_LIST",
            Self::Int64List => "INT64_LIST",
        }
    }
}

/// One registered column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsColumn {
    pub name: String,
    pub kind: ColumnKind,
    pub nullable: bool,
}

/// One stored value. Booleans are 0/1, timestamps milliseconds, maps and lists JSON text.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl Value {
    fn size(&self) -> u64 {
        match self {
            Value::Null => 1,
            Value::Int(_) | Value::Real(_) => 8,
            Value::Text(s) => s.len() as u64,
            Value::Blob(b) => b.len() as u64,
        }
    }
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Real(f) => ValueRef::Real(*f),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

/// One column of a batch to append: its values, one per row, already of `kind`.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnData {
    pub name: String,
    pub kind: ColumnKind,
    pub values: Vec<Value>,
}

/// Retention limits of one namespace; 0 = the store's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub max_segments: i32,
    pub max_bytes: i64,
    pub max_age_seconds: i64,
}

/// The defaults a zero policy field inherits (stated in the README).
pub const DEFAULT_MAX_AGE_SECONDS: i64 = 30 * 24 * 3600;
pub const DEFAULT_MAX_BYTES: i64 = 256 * 1024 * 1024;
/// At most this many namespaces exist at once.
pub const MAX_NAMESPACES: usize = 256;
/// The store as a whole keeps at most this many bytes: past it, the oldest batches of any
/// namespace go first (each namespace's own limits apply before).
pub const MAX_TOTAL_BYTES: i64 = 4 * 1024 * 1024 * 1024;
/// Writes within this window of a namespace's newest batch extend it.
const BATCH_WINDOW_MS: i64 = 60_000;

/// The privileged namespace that exposes the log store; read-only here.
pub const LOG_NAMESPACE: &str = "log";
/// The implicit column the published server appends to every schema (the writing cluster).
pub const CLUSTER_COLUMN: &str = "cluster";

/// A registered namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    pub columns: Vec<StatsColumn>,
    pub key_column: String,
    pub policy: Policy,
}

/// What a namespace holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extent {
    pub rows: i64,
    pub bytes: i64,
    pub min_seq: i64,
    pub max_seq: i64,
    pub batches: i32,
}

/// Why a stats call was refused; each maps to one Connect code.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// INVALID_ARGUMENT.
    #[error("{0}")]
    Invalid(String),
    /// NOT_FOUND.
    #[error("namespace \"{0}\" is not registered (register it with RegisterTable first)")]
    NotFound(String),
    /// FAILED_PRECONDITION: the request disagrees with what is registered.
    #[error("{0}")]
    Conflict(String),
    #[error("stats store: {0}")]
    Sql(#[from] rusqlite::Error),
}

type Result<T> = std::result::Result<T, StatsError>;

/// The stats writer's page cache.
const STATS_CACHE_MIB: i64 = 32;

/// The stats DB (`stats.sqlite3`): one writer connection; queries open their own read-only one.
pub struct StatsDb {
    conn: Connection,
    path: PathBuf,
    log_path: Option<PathBuf>,
}

/// Opens (creating) the stats DB. `log_path`, when given, is the log DB that the privileged
/// `log` namespace reads.
pub fn open(path: &Path, log_path: Option<&Path>) -> Result<StatsDb> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // The writer inserts batches of up to 10,000 task events, each into the key column's index
    // at its task's place: with SQLite's default 2 MiB cache it spilled pages mid-transaction
    // and read them back (~1.5% of the controller at C1M shape). Pages are cached as they are
    // used, so a small DB never takes this much.
    conn.pragma_update(None, "cache_size", -(STATS_CACHE_MIB * 1024))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS _stats_namespaces (
            namespace TEXT PRIMARY KEY,
            position INTEGER NOT NULL,
            columns_json TEXT NOT NULL,
            key_column TEXT NOT NULL,
            max_segments INTEGER NOT NULL,
            max_bytes INTEGER NOT NULL,
            max_age_seconds INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS _stats_cursors (
            name TEXT PRIMARY KEY,
            value INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS _stats_batches (
            namespace TEXT NOT NULL,
            first_seq INTEGER NOT NULL,
            last_seq INTEGER NOT NULL,
            rows INTEGER NOT NULL,
            bytes INTEGER NOT NULL,
            written_ms INTEGER NOT NULL,
            PRIMARY KEY (namespace, first_seq)
        );",
    )?;
    Ok(StatsDb {
        conn,
        path: path.to_path_buf(),
        log_path: log_path.map(Path::to_path_buf),
    })
}

/// Checks a namespace name against the published rule.
pub fn check_namespace_name(ns: &str) -> Result<()> {
    let mut chars = ns.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok =
        chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok && ns.len() <= 64 {
        Ok(())
    } else {
        Err(StatsError::Invalid(format!(
            "namespace \"{ns}\" does not match ^[a-z][a-z0-9_.-]{{0,63}}$ (lowercase letters, digits, '_', '.', '-'; starting with a letter)"
        )))
    }
}

/// `"name"` with any `"` doubled: a safe SQL identifier for any column name.
pub(super) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn kind_from_name(name: &str) -> Option<ColumnKind> {
    KINDS.into_iter().find(|k| k.name() == name)
}

fn columns_to_json(columns: &[StatsColumn]) -> String {
    let list: Vec<serde_json::Value> = columns
        .iter()
        .map(|c| serde_json::json!([c.name, c.kind.name(), c.nullable]))
        .collect();
    serde_json::Value::Array(list).to_string()
}

fn columns_from_json(text: &str) -> Vec<StatsColumn> {
    let list: Vec<(String, String, bool)> = serde_json::from_str(text).unwrap_or_default();
    list.into_iter()
        .filter_map(|(name, kind, nullable)| {
            Some(StatsColumn {
                name,
                kind: kind_from_name(&kind)?,
                nullable,
            })
        })
        .collect()
}

/// Checks a requested schema on its own: names present and distinct, `seq` not claimed, a key
/// column (or `timestamp_ms`) that exists and can be ordered.
fn check_schema(columns: &[StatsColumn], key_column: &str) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for c in columns {
        if c.name.is_empty() {
            return Err(StatsError::Invalid(
                "schema.columns: a column has no name".into(),
            ));
        }
        if c.name == "seq" {
            return Err(StatsError::Invalid(
                "column \"seq\" is reserved (the server assigns it); rename the column".into(),
            ));
        }
        if !seen.insert(c.name.as_str()) {
            return Err(StatsError::Invalid(format!(
                "column \"{}\" is declared twice; each column name must be unique",
                c.name
            )));
        }
    }
    let key = if key_column.is_empty() {
        "timestamp_ms"
    } else {
        key_column
    };
    match columns.iter().find(|c| c.name == key) {
        None if key_column.is_empty() => Err(StatsError::Invalid(
            "schema declares no key_column and has no 'timestamp_ms' column; set schema.key_column to the column rows are looked up by".into(),
        )),
        None => Err(StatsError::Invalid(format!(
            "key_column \"{key}\" is not a column of the schema"
        ))),
        Some(c) if c.kind == ColumnKind::Map => Err(StatsError::Invalid(format!(
            "key_column \"{key}\" is a MAP column, which cannot be ordered; choose a scalar column"
        ))),
        Some(_) => Ok(()),
    }
}

impl StatsDb {
    /// Registers `ns`, or reconciles a re-registration with what is registered: a subset keeps
    /// the registered schema, new columns are added (nullable: earlier rows have none), a
    /// column whose type changed is a conflict. A zero policy field keeps the registered one.
    pub fn register(
        &mut self,
        ns: &str,
        mut columns: Vec<StatsColumn>,
        key_column: &str,
        policy: Policy,
    ) -> Result<Namespace> {
        check_namespace_name(ns)?;
        if ns == LOG_NAMESPACE {
            return Err(StatsError::Invalid(
                "namespace \"log\" is privileged: it is the log store, written with LogService/PushLogs".into(),
            ));
        }
        check_schema(&columns, key_column)?;
        if !columns.iter().any(|c| c.name == CLUSTER_COLUMN) {
            columns.push(StatsColumn {
                name: CLUSTER_COLUMN.into(),
                kind: ColumnKind::String,
                nullable: true,
            });
        }
        let tx = self.conn.transaction()?;
        let existing = namespace_in(&tx, ns)?;
        let result = match existing {
            None => {
                let count: i64 =
                    tx.query_row("SELECT count(*) FROM _stats_namespaces", [], |r| r.get(0))?;
                if count as usize >= MAX_NAMESPACES {
                    return Err(StatsError::Conflict(format!(
                        "the stats store holds {MAX_NAMESPACES} namespaces, its limit; drop one with DropTable first"
                    )));
                }
                let defs: Vec<String> =
                    std::iter::once("seq INTEGER PRIMARY KEY AUTOINCREMENT".to_string())
                        .chain(
                            columns
                                .iter()
                                .map(|c| format!("{} {}", ident(&c.name), c.kind.decl())),
                        )
                        .collect();
                tx.execute_batch(&format!(
                    "CREATE TABLE {} ({}); CREATE INDEX {} ON {} ({}, seq);",
                    ident(ns),
                    defs.join(", "),
                    ident(&format!("{ns}:key")),
                    ident(ns),
                    ident(if key_column.is_empty() {
                        "timestamp_ms"
                    } else {
                        key_column
                    }),
                ))?;
                let next: i64 = tx.query_row(
                    "SELECT coalesce(max(position), 0) + 1 FROM _stats_namespaces",
                    [],
                    |r| r.get(0),
                )?;
                let entry = Namespace {
                    name: ns.into(),
                    columns,
                    key_column: key_column.into(),
                    policy,
                };
                tx.execute(
                    "INSERT INTO _stats_namespaces VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        ns,
                        next,
                        columns_to_json(&entry.columns),
                        entry.key_column,
                        policy.max_segments,
                        policy.max_bytes,
                        policy.max_age_seconds
                    ],
                )?;
                entry
            }
            Some(mut entry) => {
                for c in &columns {
                    match entry.columns.iter().find(|e| e.name == c.name) {
                        Some(e) if e.kind != c.kind => {
                            return Err(StatsError::Conflict(format!(
                                "column \"{}\": type mismatch registered={} requested={}; register under a new namespace to change a type",
                                c.name,
                                e.kind.name(),
                                c.kind.name()
                            )))
                        }
                        Some(_) => {}
                        None => {
                            tx.execute_batch(&format!(
                                "ALTER TABLE {} ADD COLUMN {} {}",
                                ident(ns),
                                ident(&c.name),
                                c.kind.decl()
                            ))?;
                            entry.columns.push(StatsColumn {
                                nullable: true,
                                ..c.clone()
                            });
                        }
                    }
                }
                let keep = |new: i64, old: i64| if new != 0 { new } else { old };
                entry.policy = Policy {
                    max_segments: keep(policy.max_segments.into(), entry.policy.max_segments.into())
                        as i32,
                    max_bytes: keep(policy.max_bytes, entry.policy.max_bytes),
                    max_age_seconds: keep(policy.max_age_seconds, entry.policy.max_age_seconds),
                };
                tx.execute(
                    "UPDATE _stats_namespaces SET columns_json = ?2, max_segments = ?3, max_bytes = ?4,
                     max_age_seconds = ?5 WHERE namespace = ?1",
                    params![
                        ns,
                        columns_to_json(&entry.columns),
                        entry.policy.max_segments,
                        entry.policy.max_bytes,
                        entry.policy.max_age_seconds
                    ],
                )?;
                entry
            }
        };
        tx.commit()?;
        Ok(result)
    }

    /// The registered namespace `ns`, if any.
    pub fn namespace(&self, ns: &str) -> Result<Option<Namespace>> {
        namespace_in(&self.conn, ns)
    }

    /// Every registered namespace in registration order, with what it holds.
    pub fn namespaces(&self) -> Result<Vec<(Namespace, Extent)>> {
        let names: Vec<String> = self
            .conn
            .prepare_cached("SELECT namespace FROM _stats_namespaces ORDER BY position")?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            if let Some(ns) = self.namespace(&name)? {
                let extent = self.extent(&name)?;
                out.push((ns, extent));
            }
        }
        Ok(out)
    }

    fn extent(&self, ns: &str) -> Result<Extent> {
        Ok(self.conn.prepare_cached(
            "SELECT coalesce(sum(rows), 0), coalesce(sum(bytes), 0), coalesce(min(first_seq), 0),
                    coalesce(max(last_seq), 0), count(*)
             FROM _stats_batches WHERE namespace = ?1",
        )?
        .query_row([ns], |r| {
            Ok(Extent {
                rows: r.get(0)?,
                bytes: r.get(1)?,
                min_seq: r.get(2)?,
                max_seq: r.get(3)?,
                batches: r.get(4)?,
            })
        })?)
    }

    /// Appends one batch to `ns` and returns the rows written. Every column must be registered
    /// with the same kind; a registered column the batch omits must be nullable. Nothing is
    /// written unless the whole batch is valid.
    pub fn write(&mut self, ns: &str, batch: &[ColumnData], now_ms: i64) -> Result<i64> {
        self.write_inner(ns, batch, now_ms, None)
    }

    /// [`StatsDb::write`], setting cursor `name` to `value` in the same transaction: a mirror
    /// that copies rows from elsewhere neither loses nor repeats any across a crash.
    pub fn write_advancing(
        &mut self,
        ns: &str,
        batch: &[ColumnData],
        now_ms: i64,
        (name, value): (&str, i64),
    ) -> Result<i64> {
        self.write_inner(ns, batch, now_ms, Some((name, value)))
    }

    /// Cursor `name` (0 before it is first set).
    pub fn cursor(&self, name: &str) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("SELECT value FROM _stats_cursors WHERE name = ?1")?
            .query_row([name], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    /// Sets cursor `name`.
    pub fn set_cursor(&mut self, name: &str, value: i64) -> Result<()> {
        set_cursor_in(&self.conn, name, value)
    }

    fn write_inner(
        &mut self,
        ns: &str,
        batch: &[ColumnData],
        now_ms: i64,
        cursor: Option<(&str, i64)>,
    ) -> Result<i64> {
        if ns == LOG_NAMESPACE {
            return Err(StatsError::Invalid(
                "namespace \"log\" is privileged: write log lines with LogService/PushLogs".into(),
            ));
        }
        let entry = self
            .namespace(ns)?
            .ok_or_else(|| StatsError::NotFound(ns.into()))?;
        let rows = batch.first().map_or(0, |c| c.values.len());
        for c in batch {
            let Some(reg) = entry.columns.iter().find(|r| r.name == c.name) else {
                return Err(StatsError::Conflict(format!(
                    "unknown column \"{}\" not in the registered schema of \"{ns}\"; register it first (re-register the table with the column added)",
                    c.name
                )));
            };
            if reg.kind != c.kind {
                return Err(StatsError::Conflict(format!(
                    "column \"{}\": type mismatch registered={} batch={}",
                    c.name,
                    reg.kind.name(),
                    c.kind.name()
                )));
            }
            if c.values.len() != rows {
                return Err(StatsError::Invalid(format!(
                    "column \"{}\" has {} values where the batch has {rows} rows",
                    c.name,
                    c.values.len()
                )));
            }
            if !reg.nullable && c.values.contains(&Value::Null) {
                return Err(StatsError::Conflict(format!(
                    "column \"{}\": null in a required (non-nullable) column",
                    c.name
                )));
            }
        }
        if let Some(missing) = entry
            .columns
            .iter()
            .find(|r| !r.nullable && !batch.iter().any(|c| c.name == r.name))
        {
            return Err(StatsError::Conflict(format!(
                "column \"{}\": missing required (non-nullable) column",
                missing.name
            )));
        }
        if rows == 0 {
            if let Some((name, value)) = cursor {
                set_cursor_in(&self.conn, name, value)?;
            }
            return Ok(0);
        }
        let names: Vec<String> = batch.iter().map(|c| ident(&c.name)).collect();
        let marks: Vec<String> = (1..=batch.len()).map(|i| format!("?{i}")).collect();
        let sql = format!(
            "INSERT INTO {} ({}) VALUES ({})",
            ident(ns),
            names.join(", "),
            marks.join(", ")
        );
        let tx = self.conn.transaction()?;
        let mut bytes = 0u64;
        let (mut first, mut last) = (0i64, 0i64);
        {
            let mut stmt = tx.prepare_cached(&sql)?;
            let mut row: Vec<&Value> = Vec::with_capacity(batch.len());
            for i in 0..rows {
                row.clear();
                row.extend(batch.iter().map(|c| &c.values[i]));
                bytes += row.iter().map(|v| v.size()).sum::<u64>();
                stmt.execute(rusqlite::params_from_iter(row.iter()))?;
                last = tx.last_insert_rowid();
                if i == 0 {
                    first = last;
                }
            }
        }
        let newest: Option<(i64, i64)> = tx
            .prepare_cached(
                "SELECT first_seq, written_ms FROM _stats_batches WHERE namespace = ?1
                 ORDER BY first_seq DESC LIMIT 1",
            )?
            .query_row([ns], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        match newest {
            Some((start, written)) if now_ms - written < BATCH_WINDOW_MS => {
                tx.prepare_cached(
                    "UPDATE _stats_batches SET last_seq = ?3, rows = rows + ?4, bytes = bytes + ?5
                     WHERE namespace = ?1 AND first_seq = ?2",
                )?
                .execute(params![ns, start, last, rows as i64, bytes as i64])?;
            }
            _ => {
                tx.prepare_cached("INSERT INTO _stats_batches VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?
                    .execute(params![ns, first, last, rows as i64, bytes as i64, now_ms])?;
            }
        }
        if let Some((name, value)) = cursor {
            set_cursor_in(&tx, name, value)?;
        }
        tx.commit()?;
        Ok(rows as i64)
    }

    /// Removes `ns` and its rows.
    pub fn drop_table(&mut self, ns: &str) -> Result<()> {
        if ns == LOG_NAMESPACE {
            return Err(StatsError::Invalid(
                "namespace \"log\" is privileged and cannot be dropped".into(),
            ));
        }
        let tx = self.conn.transaction()?;
        if namespace_in(&tx, ns)?.is_none() {
            return Err(StatsError::NotFound(ns.into()));
        }
        tx.execute_batch(&format!("DROP TABLE {}", ident(ns)))?;
        tx.execute("DELETE FROM _stats_namespaces WHERE namespace = ?1", [ns])?;
        tx.execute("DELETE FROM _stats_batches WHERE namespace = ?1", [ns])?;
        tx.commit()?;
        Ok(())
    }

    /// Runs one read-only SQL statement (see [`query`]).
    pub fn query(
        &self,
        sql: &str,
        timeout: std::time::Duration,
    ) -> std::result::Result<QueryResult, QueryError> {
        self.query_handle().run(sql, timeout)
    }

    /// What a query needs, to run it without holding this (the writer's) connection.
    pub fn query_handle(&self) -> QueryHandle {
        QueryHandle {
            path: self.path.clone(),
            log_path: self.log_path.clone(),
        }
    }
}

/// Runs queries on their own read-only connections (see [`query`]).
#[derive(Clone, Debug)]
pub struct QueryHandle {
    path: PathBuf,
    log_path: Option<PathBuf>,
}

impl QueryHandle {
    /// Runs one read-only SQL statement, stopped after `timeout`.
    pub fn run(
        &self,
        sql: &str,
        timeout: std::time::Duration,
    ) -> std::result::Result<QueryResult, QueryError> {
        query::run(&self.path, self.log_path.as_deref(), sql, timeout)
    }
}

fn set_cursor_in(conn: &Connection, name: &str, value: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO _stats_cursors(name, value) VALUES (?1, ?2)
         ON CONFLICT(name) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![name, value])?;
    Ok(())
}

fn namespace_in(conn: &Connection, ns: &str) -> Result<Option<Namespace>> {
    Ok(conn
        .prepare_cached(
            "SELECT columns_json, key_column, max_segments, max_bytes, max_age_seconds
             FROM _stats_namespaces WHERE namespace = ?1",
        )?
        .query_row([ns], |r| {
            Ok(Namespace {
                name: ns.into(),
                columns: columns_from_json(&r.get::<_, String>(0)?),
                key_column: r.get(1)?,
                policy: Policy {
                    max_segments: r.get(2)?,
                    max_bytes: r.get(3)?,
                    max_age_seconds: r.get(4)?,
                },
            })
        })
        .optional()?)
}
