//! SQLite persistence for the controller: schema, forward-only migrations, typed queries, and
//! applying state-machine steps inside transactions. The only crate that knows SQL.
//!
//! Architecture invariant: every state change goes through [`ops::apply_task_event`], which loads
//! the task, calls `iris_types::transition`, and writes the result in the caller's transaction.

pub mod federation;
pub mod inspect;
pub mod logs;
pub mod ops;
pub mod query;
mod schema;

use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;

pub use rusqlite;

/// Store errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database was written by a newer Iris (unknown migration {0:?}); upgrade this binary or restore an older checkpoint")]
    NewerSchema(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Current time in epoch milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Opens (creating if needed) the controller DB with WAL and foreign keys, and applies migrations.
pub fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    configure(&conn)?;
    migrate(&conn)?;
    Ok(conn)
}

/// An in-memory DB for tests.
pub fn open_in_memory() -> Result<Connection> {
    let conn = Connection::open_in_memory()?;
    configure(&conn)?;
    migrate(&conn)?;
    Ok(conn)
}

fn configure(conn: &Connection) -> Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "busy_timeout", 5000)?;
    conn.set_prepared_statement_cache_capacity(128);
    Ok(())
}

/// Applies pending migrations in order; refuses a DB that records a migration this binary does
/// not know (written by a newer version).
pub fn migrate(conn: &Connection) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at_ms INTEGER NOT NULL)",
    )?;
    let applied: Vec<String> = {
        let mut st = conn.prepare("SELECT name FROM schema_migrations ORDER BY name")?;
        let rows = st.query_map([], |r| r.get::<_, String>(0))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    for name in &applied {
        if !schema::MIGRATIONS.iter().any(|(n, _)| n == name) {
            return Err(Error::NewerSchema(name.clone()));
        }
    }
    for (name, sql) in schema::MIGRATIONS {
        if applied.iter().any(|a| a == name) {
            continue;
        }
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations(name, applied_at_ms) VALUES (?1, ?2)",
            params![name, now_ms()],
        )?;
        tx.commit()?;
    }
    Ok(())
}

/// Reads an integer from `meta`.
pub fn meta_get(conn: &Connection, key: &str) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT value FROM meta WHERE key = ?1")?
        .query_row([key], |r| r.get(0))
        .optional()?)
}

/// Adds `n` to a `meta` counter and returns the first value of the reserved range.
pub fn meta_reserve(conn: &Connection, key: &str, n: i64) -> Result<i64> {
    let cur = meta_get(conn, key)?.unwrap_or(0);
    conn.prepare_cached(
        "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![key, cur + n])?;
    Ok(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_recorded_and_idempotent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.sqlite3");
        let c = open(&p).expect("open");
        drop(c);
        let c = open(&p).expect("reopen");
        let n: i64 = c
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .expect("count");
        assert_eq!(n as usize, schema::MIGRATIONS.len());
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.sqlite3");
        let c = open(&p).expect("open");
        c.execute(
            "INSERT INTO schema_migrations(name, applied_at_ms) VALUES ('9999_from_the_future', 0)",
            [],
        )
        .expect("insert");
        drop(c);
        match open(&p) {
            Err(Error::NewerSchema(n)) => assert_eq!(n, "9999_from_the_future"),
            other => panic!("expected NewerSchema, got {other:?}"),
        }
    }
}
