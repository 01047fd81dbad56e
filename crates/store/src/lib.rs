//! SQLite persistence for the controller: schema, forward-only migrations, typed queries, and
//! applying state-machine steps inside transactions. The only crate that knows SQL: its API
//! speaks domain types ([`Db`], [`Tx`], plain row structs), never `rusqlite`'s.
//!
//! Architecture invariant: a job's, task's or attempt's state column is written only in
//! [`apply`] (through `iris_types::transition` / `job_transition`) and, for jobs mirrored from a
//! federation peer, in [`mirror`]. State sets in SQL come from [`sets`], generated from
//! `TaskState`/`JobState`.

pub mod apply;
pub mod autoscale;
pub mod budgets;
pub mod changes;
pub mod checkpoint;
pub mod endpoints;
pub mod events;
pub mod federation;
pub mod inspect;
pub mod jobs;
pub mod logs;
pub mod mirror;
pub mod prune;
pub mod query;
mod schema;
pub(crate) mod sets;
pub mod snapshot;
pub mod stats;
pub mod views;
pub mod workers;

use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;

mod sealed {
    /// Access to the raw connection, for this crate only.
    pub trait Raw {
        fn raw(&self) -> &rusqlite::Connection;
    }
}
use sealed::Raw;

/// Something the store can read through: a [`Db`] or an open [`Tx`].
pub trait Read: sealed::Raw {}

/// A connection to the controller DB.
pub struct Db {
    conn: Connection,
    changes: changes::Noter,
}

/// An open transaction. Every state change takes one: nothing is visible until [`Tx::commit`],
/// and dropping it rolls back.
pub struct Tx<'a> {
    tx: rusqlite::Transaction<'a>,
    /// Where the `tasks` and `task_attempts` rows this transaction writes are noted
    /// (`crate::changes`).
    changes: &'a changes::Noter,
    /// Some worker row or attribute was written: committing bumps [`workers::generation`].
    workers_changed: std::cell::Cell<bool>,
    /// The next task insertion number, once this transaction has handed one out: kept here
    /// and written to `meta` once, at commit, instead of an upsert per inserted job
    /// ([`Tx::reserve_insertions`]).
    next_insertion: std::cell::Cell<Option<i64>>,
}

impl Raw for Db {
    fn raw(&self) -> &Connection {
        &self.conn
    }
}
impl Read for Db {}
impl Raw for Tx<'_> {
    fn raw(&self) -> &Connection {
        &self.tx
    }
}
impl Read for Tx<'_> {}

impl Db {
    /// Opens (creating if needed) the controller DB with WAL and foreign keys, and applies
    /// migrations.
    pub fn open(path: &Path) -> Result<Db> {
        let conn = Connection::open(path)?;
        configure(&conn)?;
        migrate(&conn)?;
        let changes = changes::Noter::install(&conn, Some(path));
        Ok(Db { conn, changes })
    }

    /// An in-memory DB (tests).
    pub fn open_in_memory() -> Result<Db> {
        let conn = Connection::open_in_memory()?;
        configure(&conn)?;
        migrate(&conn)?;
        let changes = changes::Noter::install(&conn, None);
        Ok(Db { conn, changes })
    }

    /// Starts a write transaction. `BEGIN IMMEDIATE`: the write lock is taken at the start,
    /// waiting up to the busy timeout for any other writer, so a transaction that reads before
    /// it writes never fails on the upgrade (a deferred one gets `database is locked` at once,
    /// without waiting, when another connection committed after its first read).
    pub fn begin(&mut self) -> Result<Tx<'_>> {
        // Whatever is still noted was committed outside a `Tx` or rolled back: pass it on.
        self.changes.publish();
        Ok(Tx {
            tx: self
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?,
            changes: &self.changes,
            workers_changed: std::cell::Cell::new(false),
            next_insertion: std::cell::Cell::new(None),
        })
    }

    /// Lets this connection's commits leave the WAL's copying to another connection until it
    /// holds `pages` pages. By default the commit that takes the WAL past 1,000 pages copies it
    /// into the DB file and syncs it, on the committing thread (12% of the admission thread
    /// under a storm of submits); a process that raises the limit runs [`Db::checkpoint_wal`]
    /// from a thread of its own, so that a commit past the limit finds little left to copy.
    /// The limit cannot be lifted altogether: a WAL starts over only when a write transaction
    /// begins with every page copied, and under steady writes another connection's checkpoint
    /// always ends behind the next commit (the WAL grew to 25 GB at C1M shape). A checkpoint
    /// in the commit itself is followed by this connection's next transaction at once.
    pub fn checkpoint_on_commit_past(&self, pages: u32) -> Result<()> {
        self.conn.pragma_update(None, "wal_autocheckpoint", pages)?;
        Ok(())
    }

    /// Copies what it can of the WAL into the DB file without waiting for any reader or writer
    /// (`PRAGMA wal_checkpoint(PASSIVE)`); returns the pages in the WAL and how many of them
    /// are now in the DB file. A writer starts the WAL over once every page is copied and no
    /// reader still reads it, so it stays bounded as with checkpoints on commit.
    pub fn checkpoint_wal(&self) -> Result<(i64, i64)> {
        Ok(self
            .conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get(1)?, r.get(2)?))
            })?)
    }

    /// Lets this connection cache up to `mib` MiB of pages (SQLite's default is 2 MiB). For a
    /// connection that reads much of a large DB often, such as the tick's: each page missing
    /// from the cache is a `pread` and a copy.
    pub fn set_page_cache_mib(&self, mib: u32) -> Result<()> {
        self.conn
            .pragma_update(None, "cache_size", -(i64::from(mib) * 1024))?;
        Ok(())
    }

    /// The committed writes to `tasks` rows, shared by every connection to this DB's file
    /// (`crate::changes`).
    pub fn task_changes(&self) -> &std::sync::Arc<changes::TaskChanges> {
        self.changes.log()
    }

    /// Starts a read transaction on a shared connection: one consistent snapshot for several
    /// reads (the tick's snapshot connection).
    pub fn begin_read(&self) -> Result<Tx<'_>> {
        Ok(Tx {
            tx: self.conn.unchecked_transaction()?,
            changes: &self.changes,
            workers_changed: std::cell::Cell::new(false),
            next_insertion: std::cell::Cell::new(None),
        })
    }
}

impl Tx<'_> {
    /// Commits the transaction.
    pub fn commit(self) -> Result<()> {
        if let Some(next) = self.next_insertion.get() {
            meta_set(&self.tx, INSERTION_KEY, next)?;
        }
        let workers_changed = self.workers_changed.get();
        let changes = self.changes;
        self.tx.commit()?;
        changes.publish();
        if workers_changed {
            workers::bump_generation();
        }
        Ok(())
    }

    /// Runs `f` without a savepoint of its own and says whether an error left writes behind.
    /// A savepoint journals every page first touched inside it (with a trigger's statement
    /// journal, 20% of the admission thread), so a group commit whose steps check before they
    /// write runs each step this way and falls back to [`Tx::savepoint`] only when one fails
    /// after writing. Sound because SQLite undoes a failed statement itself: a statement that
    /// may fail part-way through several writes runs under a statement journal, one that
    /// cannot fails before its single write, and an I/O error rolls the whole transaction back
    /// (then `Dirty`, since the transaction is gone).
    pub fn attempt<T, E>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> std::result::Result<T, E>,
    ) -> Attempt<T, E> {
        let before = self.tx.total_changes();
        match f(self) {
            Ok(v) => Attempt::Done(v),
            Err(e) if self.tx.total_changes() == before && !self.tx.is_autocommit() => {
                Attempt::Refused(e)
            }
            Err(e) => Attempt::Dirty(e),
        }
    }

    /// Runs `f` inside a savepoint: its writes are kept if it returns `Ok` and rolled back if it
    /// returns `Err`, without affecting the rest of the transaction (group commit).
    pub fn savepoint<T, E: From<Error>>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let exec = |sql: &str| -> Result<()> {
            self.tx.prepare_cached(sql)?.execute([])?;
            Ok(())
        };
        exec("SAVEPOINT sp")?;
        let r = f(self);
        if r.is_ok() {
            exec("RELEASE sp")?;
        } else {
            exec("ROLLBACK TO sp")?;
            exec("RELEASE sp")?;
        }
        r
    }
}

/// How a step run by [`Tx::attempt`] ended.
#[derive(Debug)]
pub enum Attempt<T, E> {
    /// It succeeded; its writes are part of the transaction.
    Done(T),
    /// It failed without writing anything: the transaction goes on as if it had not run.
    Refused(E),
    /// It failed after writing: the transaction must be rolled back.
    Dirty(E),
}

/// Store errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database was written by a newer Iris (unknown migration '{0}'); upgrade this binary or restore an older checkpoint")]
    NewerSchema(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The write failed because the state dir's file system is full (`SQLITE_FULL`); the
    /// transaction was rolled back, so nothing was half-written.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, Error::Sqlite(e) if sqlite_disk_full(e))
    }
}

pub(crate) fn sqlite_disk_full(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull)
}

/// Current time in epoch milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn configure(conn: &Connection) -> Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "busy_timeout", 5000)?;
    // Savepoints (one per submission in a group commit) journal the pages they touch; in a
    // temp file that was a write syscall per first-touched page (14% of the admission thread).
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.set_prepared_statement_cache_capacity(128);
    Ok(())
}

/// Applies pending migrations in order; refuses a DB that records a migration this binary does
/// not know (written by a newer version).
fn migrate(conn: &Connection) -> Result<()> {
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
        apply_migration(conn, name, sql)?;
    }
    federation::ensure_change_log(conn)
}

/// One migration and its record, in one transaction.
fn apply_migration(conn: &Connection, name: &str, sql: &str) -> Result<()> {
    let tx = conn.unchecked_transaction()?;
    tx.execute_batch(sql)?;
    tx.execute(
        "INSERT INTO schema_migrations(name, applied_at_ms) VALUES (?1, ?2)",
        params![name, now_ms()],
    )?;
    tx.commit()?;
    Ok(())
}

/// `PRAGMA integrity_check` and `PRAGMA foreign_key_check`: `Ok` only when both find nothing.
fn check_integrity(conn: &Connection) -> Result<()> {
    let verdict: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    if verdict != "ok" {
        return Err(Error::Invalid(format!("integrity_check: {verdict}")));
    }
    let mut st = conn.prepare("PRAGMA foreign_key_check")?;
    let bad: Vec<String> = st
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<std::result::Result<_, _>>()?;
    if !bad.is_empty() {
        return Err(Error::Invalid(format!(
            "foreign_key_check: rows of {} point at nothing",
            bad.join(", ")
        )));
    }
    Ok(())
}

/// Reads an integer from `meta`.
pub fn meta_get(conn: &impl Read, key: &str) -> Result<Option<i64>> {
    Ok(conn
        .raw()
        .prepare_cached("SELECT value FROM meta WHERE key = ?1")?
        .query_row([key], |r| r.get(0))
        .optional()?)
}

/// Writes an integer to `meta`.
pub(crate) fn meta_set(conn: &Connection, key: &str, value: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![key, value])?;
    Ok(())
}

/// The `meta` counter of task insertion numbers (`tasks.priority_insertion`, FIFO among equals).
const INSERTION_KEY: &str = "task_priority_insertion";

impl Tx<'_> {
    /// Reserves `n` task insertion numbers and returns the first. Numbers a rolled-back
    /// savepoint reserved are skipped, never reused: only their order matters.
    pub(crate) fn reserve_insertions(&self, n: i64) -> Result<i64> {
        let first = match self.next_insertion.get() {
            Some(next) => next,
            None => meta_get(self, INSERTION_KEY)?.unwrap_or(0),
        };
        self.next_insertion.set(Some(first + n));
        Ok(first)
    }
}

/// Helpers for tests of other crates that need a DB in a particular shape.
pub mod testing {
    use super::*;

    /// Makes `db`'s inserts of tasks for jobs whose id ends in `suffix` (letters, digits and
    /// `-` only) fail, by a trigger on this connection alone: a submission that fails after
    /// its job's row was written.
    pub fn fail_task_inserts(db: &Db, suffix: &str) -> Result<()> {
        if !suffix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(Error::Invalid(format!(
                "suffix '{suffix}': letters, digits and '-' only"
            )));
        }
        db.conn.execute_batch(&format!(
            "CREATE TEMP TRIGGER fail_task_inserts BEFORE INSERT ON main.tasks
             WHEN NEW.job_id LIKE '%{suffix}'
             BEGIN SELECT RAISE(ABORT, 'injected failure of a task insert'); END"
        ))?;
        Ok(())
    }

    /// Brings the DB at `path` forward one pending migration at a time, checking integrity and
    /// foreign keys after each; returns the migrations applied, in order (an upgrade test walks
    /// an old release's DB through every step).
    pub fn migrate_step_by_step(path: &Path) -> Result<Vec<String>> {
        let conn = Connection::open(path)?;
        configure(&conn)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at_ms INTEGER NOT NULL)",
        )?;
        check_integrity(&conn)?;
        let mut done = Vec::new();
        for (name, sql) in schema::MIGRATIONS {
            let applied: bool = conn.query_row(
                "SELECT EXISTS(SELECT 1 FROM schema_migrations WHERE name = ?1)",
                [name],
                |r| r.get(0),
            )?;
            if applied {
                continue;
            }
            apply_migration(&conn, name, sql)?;
            check_integrity(&conn).map_err(|e| Error::Invalid(format!("after {name}: {e}")))?;
            done.push(name.to_string());
        }
        Ok(done)
    }

    /// `PRAGMA integrity_check` and `PRAGMA foreign_key_check` of the DB at `path` (a fault test's
    /// last word on whether a crash or a full disk corrupted anything).
    pub fn integrity_check(path: &Path) -> Result<()> {
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        check_integrity(&conn)
    }

    /// The migrations this binary knows, in order.
    pub fn migration_names() -> Vec<&'static str> {
        schema::MIGRATIONS.iter().map(|(n, _)| *n).collect()
    }

    /// Records a migration this binary does not know, as a newer Iris would have.
    pub fn record_migration(path: &Path, name: &str) -> Result<()> {
        let db = Db::open(path)?;
        db.conn.execute(
            "INSERT INTO schema_migrations(name, applied_at_ms) VALUES (?1, 0)",
            [name],
        )?;
        Ok(())
    }
}

/// Every trigger of the schema on `conn`: (name, table, SQL). For the tests that hold the
/// triggers to what the hot writes can afford.
#[cfg(test)]
pub(crate) fn schema_triggers(conn: &Connection) -> Vec<(String, String, String)> {
    conn.prepare("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger'")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .collect::<rusqlite::Result<_>>()
        .expect("rows")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_recorded_and_idempotent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.sqlite3");
        let c = Db::open(&p).expect("open");
        drop(c);
        let c = Db::open(&p).expect("reopen");
        let n: i64 = c
            .conn
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .expect("count");
        assert_eq!(n as usize, schema::MIGRATIONS.len());
    }

    /// Migration 0009 counts the failed attempts each job already has: the DB the release
    /// before it wrote (one job whose only attempt failed, one that succeeded) comes out with
    /// counts of 1 and 0, and the triggers keep them from then on.
    #[test]
    fn job_failed_attempt_counts_are_backfilled_from_the_release_before() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../cli/tests/fixtures/upgrade/0008_backends_without_worker_rows");
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("controller.sqlite3");
        std::fs::copy(fixture.join("controller.sqlite3"), &p).expect("copy the fixture");
        let applied = testing::migrate_step_by_step(&p).expect("migrate");
        assert!(
            applied.iter().any(|m| m == "0009_lighter_task_writes"),
            "{applied:?}"
        );
        let c = Db::open(&p).expect("open");
        let count = |job: &str| -> i64 {
            c.conn
                .query_row(
                    "SELECT failed_attempts FROM jobs WHERE job_id = ?1",
                    [job],
                    |r| r.get(0),
                )
                .expect("count")
        };
        assert_eq!(count("/fixture/upgrade-fail"), 1);
        assert_eq!(count("/fixture/upgrade-ok"), 0);
    }

    /// A writer that leaves most of the WAL's copying to another connection: with that
    /// connection checkpointing while the writer's transactions are open (so that it always
    /// ends behind the next commit), the WAL still starts over once it passes the writer's
    /// limit, and the other connection's checkpoints leave the writer little to copy.
    #[test]
    fn a_writer_that_leaves_checkpoints_to_another_connection_keeps_a_bounded_wal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.sqlite3");
        let mut writer = Db::open(&p).expect("open");
        writer.checkpoint_on_commit_past(2000).expect("pragma");
        let checkpointer = Db::open(&p).expect("open");
        // Rounds of 100 rows, the other connection checkpointing inside each: the most pages
        // it saw in the WAL and the most it had copied.
        let rounds = |writer: &mut Db, from: usize, to: usize| -> (i64, i64) {
            let (mut most, mut copied_most) = (0, 0);
            for round in from..to {
                let tx = writer.begin().expect("tx");
                for i in 0..100 {
                    tx.tx
                        .execute(
                            "INSERT INTO meta(key, value) VALUES (?1, ?2)",
                            params![format!("{:0>300}", round * 100 + i), i],
                        )
                        .expect("insert");
                }
                let (in_wal, copied) = checkpointer.checkpoint_wal().expect("checkpoint");
                most = most.max(in_wal);
                copied_most = copied_most.max(copied);
                tx.commit().expect("commit");
            }
            (most, copied_most)
        };
        let (most, copied_by_checkpointer) = rounds(&mut writer, 0, 300);
        assert!(
            copied_by_checkpointer > 1000,
            "the checkpointer copied pages"
        );
        assert!(
            most < 2200,
            "the WAL started over past the limit: {most} pages at most"
        );
        writer.checkpoint_on_commit_past(0).expect("pragma");
        rounds(&mut writer, 300, 400);
        let (in_wal, _) = checkpointer.checkpoint_wal().expect("checkpoint");
        assert!(
            in_wal > 2200,
            "without a limit it never starts over: {in_wal} pages"
        );
    }

    /// A trigger on insert puts every insert into its table under a statement journal: the
    /// tables a submission or an assignment inserts into have none (ARCHITECTURE.md,
    /// `crates/store`).
    #[test]
    fn the_tables_submissions_and_assignments_insert_into_have_no_insert_trigger() {
        let c = Db::open_in_memory().expect("open");
        let triggers = schema_triggers(&c.conn);
        assert!(!triggers.is_empty(), "the schema has triggers to check");
        for (name, table, sql) in triggers {
            let on_insert = sql.to_uppercase().contains(" INSERT ON ");
            assert!(
                !(on_insert
                    && [
                        "jobs",
                        "job_config",
                        "tasks",
                        "task_attempts",
                        "task_events"
                    ]
                    .contains(&table.as_str())),
                "trigger {name} fires on inserts into {table}"
            );
        }
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.sqlite3");
        testing::record_migration(&p, "9999_from_the_future").expect("insert");
        match Db::open(&p) {
            Err(Error::NewerSchema(n)) => assert_eq!(n, "9999_from_the_future"),
            Err(other) => panic!("expected NewerSchema, got {other}"),
            Ok(_) => panic!("expected NewerSchema, the DB opened"),
        }
    }
}
