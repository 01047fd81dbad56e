//! Which `tasks` and `task_attempts` rows committed writes touched, so the control tick can
//! re-read only those instead of every pending task and every open attempt on every tick (issue
//! 17: at 50,000 pending tasks and 20,000 open attempts those reads were ~100–250 ms each).
//!
//! Every connection the store opens carries an SQLite update hook that notes the rowid of each
//! `tasks` or `task_attempts` row an INSERT, UPDATE or DELETE touches, whatever code path wrote
//! it. The notes stay
//! with the connection until its transaction commits ([`crate::Tx::commit`]), then move to the
//! [`TaskChanges`] shared by every connection to the same database file. A reader takes them
//! *before* its read transaction's first read, so the rows it re-reads are at least as new as
//! the writes it was told about; a commit that lands between the take and the read is simply
//! taken (and re-read) next time.
//!
//! The notes over-approximate, never under: a rolled-back write, or a write that left the row
//! pending, is re-read for nothing. Deleting a `jobs` row (replacing a job, pruning) deletes its
//! tasks by foreign-key cascade; rather than rely on cascades reaching the hook, it asks the
//! reader for a full re-read ([`Taken::resync`]), as does a backlog past [`MAX_NOTED`].

use rustc_hash::FxHashSet;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

/// Past this many noted rows not yet taken, the notes are dropped for a full re-read (a DB
/// nobody ticks on, or a burst of submissions a full read serves better than point reads).
pub const MAX_NOTED: usize = 200_000;

#[derive(Default)]
struct Noted {
    tasks: FxHashSet<i64>,
    attempts: FxHashSet<i64>,
    resync: bool,
}

impl Noted {
    fn len(&self) -> usize {
        self.tasks.len() + self.attempts.len()
    }

    fn add(&mut self, other: Noted) {
        if self.resync || other.resync || self.len() + other.len() > MAX_NOTED {
            *self = Noted {
                resync: true,
                ..Default::default()
            };
        } else {
            self.tasks.extend(other.tasks);
            self.attempts.extend(other.attempts);
        }
    }
}

/// The committed `tasks` and `task_attempts` writes of one database file not yet taken.
pub struct TaskChanges {
    noted: Mutex<Noted>,
}

/// What [`TaskChanges::take`] hands over.
#[derive(Debug, Default)]
pub struct Taken {
    /// Rowids of `tasks` rows written since the last take (any order).
    pub tasks: Vec<i64>,
    /// Rowids of `task_attempts` rows written since the last take (any order).
    pub attempts: Vec<i64>,
    /// The rows cannot be trusted to be complete: read every row again.
    pub resync: bool,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The notes are plain sets: a panic while holding them cannot leave them half-updated in a
    // way that loses a note (at worst a note is doubled), so the poisoned guard is usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TaskChanges {
    fn new() -> Arc<TaskChanges> {
        Arc::new(TaskChanges {
            // A fresh log knows nothing of the writes before it: its first taker reads all.
            noted: Mutex::new(Noted {
                resync: true,
                ..Default::default()
            }),
        })
    }

    /// Takes every committed write noted so far. Take it before the read transaction that
    /// re-reads the rows makes its first read.
    pub fn take(&self) -> Taken {
        let noted = std::mem::take(&mut *guard(&self.noted));
        Taken {
            tasks: noted.tasks.into_iter().collect(),
            attempts: noted.attempts.into_iter().collect(),
            resync: noted.resync,
        }
    }

    fn publish(&self, n: Noted) {
        if n.len() == 0 && !n.resync {
            return;
        }
        guard(&self.noted).add(n);
    }
}

/// Files' change logs, so that every connection to one file shares one (connections to
/// in-memory databases each get their own).
static BY_FILE: LazyLock<Mutex<HashMap<PathBuf, Weak<TaskChanges>>>> =
    LazyLock::new(Default::default);

fn for_file(path: Option<&Path>) -> Arc<TaskChanges> {
    let Some(path) = path else {
        return TaskChanges::new();
    };
    // Canonical, so that two spellings of one file share the log; a path that cannot be
    // canonicalized (it was just created, so it exists) falls back to its spelling.
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut files = guard(&BY_FILE);
    files.retain(|_, w| w.strong_count() > 0);
    if let Some(c) = files.get(&key).and_then(Weak::upgrade) {
        return c;
    }
    let c = TaskChanges::new();
    files.insert(key, Arc::downgrade(&c));
    c
}

/// One connection's side: the hook's notes of its open transaction, and the file's log they
/// go to when it commits.
pub(crate) struct Noter {
    open: Arc<Mutex<Noted>>,
    log: Arc<TaskChanges>,
}

impl Noter {
    /// Hooks `conn` (open on `path`, or in memory).
    pub(crate) fn install(conn: &rusqlite::Connection, path: Option<&Path>) -> Noter {
        let open: Arc<Mutex<Noted>> = Arc::default();
        let hook_open = open.clone();
        conn.update_hook(Some(
            move |action: rusqlite::hooks::Action, _db: &str, table: &str, rowid: i64| match (
                table, action,
            ) {
                ("tasks", _) => {
                    guard(&hook_open).tasks.insert(rowid);
                }
                ("task_attempts", _) => {
                    guard(&hook_open).attempts.insert(rowid);
                }
                ("jobs", rusqlite::hooks::Action::SQLITE_DELETE) => {
                    guard(&hook_open).resync = true;
                }
                _ => {}
            },
        ));
        Noter {
            open,
            log: for_file(path),
        }
    }

    /// Moves the connection's notes to the file's log: call after a commit returned (also
    /// harmless after a rollback: the rows are re-read for nothing).
    pub(crate) fn publish(&self) {
        let n = std::mem::take(&mut *guard(&self.open));
        self.log.publish(n);
    }

    pub(crate) fn log(&self) -> &Arc<TaskChanges> {
        &self.log
    }
}
