//! The SQLite side of checkpoints: a consistent copy of the live DB, its row counts, and
//! validating a downloaded copy before it replaces the DB. Object storage is the controller's.

use crate::{Error, Raw, Result, Tx};
use rusqlite::{params, Connection, OpenFlags};
use std::path::Path;
use std::time::Duration;

/// The `meta` key recording the checkpoint a DB was last checkpointed to or restored from.
pub const META_KEY: &str = "last_checkpoint_epoch_ms";

/// Copies the DB at `db_path` into `out` (`VACUUM INTO` on a read-only connection, so the writer
/// is never blocked), switched to DELETE journal mode so the copy is one file. Returns the row
/// counts of jobs, tasks and workers.
pub fn copy_to(db_path: &Path, out: &Path) -> Result<[i32; 3]> {
    {
        let conn = Connection::open_with_flags(
            db_path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(Duration::from_secs(30))?;
        conn.execute("VACUUM INTO ?1", [out.to_string_lossy()])?;
    }
    let conn = Connection::open(out)?;
    conn.pragma_update(None, "journal_mode", "DELETE")?;
    let n = |t: &str| -> Result<i32> {
        Ok(conn.query_row(&format!("SELECT count(*) FROM {t}"), [], |r| r.get(0))?)
    };
    Ok([n("jobs")?, n("tasks")?, n("workers")?])
}

/// Checks a downloaded copy (`PRAGMA quick_check`) and records `epoch_ms` in its `meta` table.
pub fn validate_and_stamp(path: &Path, epoch_ms: i64) -> Result<()> {
    let conn = Connection::open(path)?;
    let check: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| Error::Invalid(format!("not a valid SQLite DB: {e}")))?;
    if check != "ok" {
        return Err(Error::Invalid(format!(
            "failed PRAGMA quick_check: {check}"
        )));
    }
    conn.execute(
        "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        params![META_KEY, epoch_ms],
    )
    .map_err(|e| Error::Invalid(format!("has no meta table: {e}")))?;
    Ok(())
}

/// Records the checkpoint just taken.
pub fn record_taken(tx: &Tx<'_>, epoch_ms: i64) -> Result<()> {
    crate::meta_set(tx.raw(), META_KEY, epoch_ms)
}
