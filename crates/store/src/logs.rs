//! The log store: task and system log lines keyed `<task>:<attempt>`, with a store-wide increasing
//! `seq`, queried with EXACT / PREFIX / REGEX scopes (reference §7.5). A separate SQLite file so log
//! traffic never contends with the scheduler's writes.

use rusqlite::{params, Connection};
use std::path::Path;

/// Log levels (finelog codes).
pub const LEVEL_UNKNOWN: i32 = 0;
pub const LEVEL_DEBUG: i32 = 1;
pub const LEVEL_INFO: i32 = 2;
pub const LEVEL_WARNING: i32 = 3;
pub const LEVEL_ERROR: i32 = 4;
pub const LEVEL_CRITICAL: i32 = 5;

/// One stored line.
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    pub seq: i64,
    pub key: String,
    pub source: String,
    pub data: String,
    pub epoch_ms: i64,
    pub level: i32,
}

/// How `FetchQuery::source` is matched against keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Exact,
    Prefix,
    Regex,
}

/// A fetch request (see `FetchLogsRequest`).
#[derive(Clone, Debug)]
pub struct FetchQuery {
    pub source: String,
    pub scope: Scope,
    pub since_ms: i64,
    pub cursor: i64,
    pub until_cursor: i64,
    pub substring: String,
    pub regex: String,
    pub max_lines: usize,
    pub tail: bool,
    pub min_level: i32,
}

/// The log DB (`logs.sqlite3`).
pub struct LogDb(Connection);

/// Opens the log DB.
pub fn open(path: &Path) -> rusqlite::Result<LogDb> {
    let c = Connection::open(path)?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "synchronous", "NORMAL")?;
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS logs (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            key TEXT NOT NULL,
            source TEXT NOT NULL,
            data TEXT NOT NULL,
            epoch_ms INTEGER NOT NULL,
            level INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS idx_logs_key ON logs(key, seq);",
    )?;
    // Writers may number their lines per key (`client_seq`), which makes a retried push of a
    // batch that was stored but not acknowledged (e.g. across a controller crash) a no-op.
    let has_client_seq = c
        .prepare("SELECT 1 FROM pragma_table_info('logs') WHERE name = 'client_seq'")?
        .exists([])?;
    if !has_client_seq {
        c.execute_batch("ALTER TABLE logs ADD COLUMN client_seq INTEGER")?;
    }
    c.execute_batch(
        "CREATE UNIQUE INDEX IF NOT EXISTS idx_logs_client_seq ON logs(key, client_seq) WHERE client_seq IS NOT NULL",
    )?;
    Ok(LogDb(c))
}

/// Appends lines under `key` in one transaction.
pub fn append(
    conn: &mut LogDb,
    key: &str,
    lines: &[(String, String, i64, i32)],
) -> Result<(), LogError> {
    let numbered: Vec<(String, String, i64, i32, Option<i64>)> = lines
        .iter()
        .map(|(s, d, t, l)| (s.clone(), d.clone(), *t, *l, None))
        .collect();
    append_numbered(conn, key, &numbered)
}

/// Appends `(source, data, epoch_ms, level, client_seq)` lines under `key` in one transaction.
/// A line whose `client_seq` is already stored for `key` is skipped, so pushes can be retried.
pub fn append_numbered(
    conn: &mut LogDb,
    key: &str,
    lines: &[(String, String, i64, i32, Option<i64>)],
) -> Result<(), LogError> {
    let tx = conn.0.transaction()?;
    {
        let mut st = tx.prepare_cached(
            "INSERT INTO logs(key, source, data, epoch_ms, level, client_seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT DO NOTHING",
        )?;
        for (source, data, ts, level, cseq) in lines {
            st.execute(params![key, source, data, ts, level, cseq])?;
        }
    }
    Ok(tx.commit()?)
}

/// A log store failure.
#[derive(Debug, thiserror::Error)]
#[error("log store: {0}")]
pub struct LogError(#[from] rusqlite::Error);

impl LogError {
    /// The log store's file system is full.
    pub fn is_disk_full(&self) -> bool {
        crate::sqlite_disk_full(&self.0)
    }
}

/// Deletes every line whose key starts with `prefix` (a replaced job's `<job>/…` keys); returns
/// how many. A job submitted again under the same name numbers its lines from 1 again, so its
/// predecessor's lines would otherwise shadow them (a retried push of an already stored line
/// number is skipped).
pub fn delete_under(conn: &mut LogDb, prefix: &str) -> Result<usize, LogError> {
    let n = match prefix_upper(prefix) {
        Some(upper) => conn.0.execute(
            "DELETE FROM logs WHERE key >= ?1 AND key < ?2",
            params![prefix, upper],
        )?,
        None => conn
            .0
            .execute("DELETE FROM logs WHERE key >= ?1", params![prefix])?,
    };
    Ok(n)
}

/// The smallest string greater than every string starting with `prefix`, if any.
fn prefix_upper(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(c) = chars.pop() {
        if let Some(n) = char::from_u32(c as u32 + 1) {
            chars.push(n);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Parses a level name (`DEBUG`…`CRITICAL`); empty is 0 (no filter).
pub fn parse_level(s: &str) -> Result<i32, String> {
    match s
        .trim()
        .to_ascii_uppercase()
        .trim_start_matches("LOG_LEVEL_")
    {
        "" => Ok(0),
        "DEBUG" => Ok(LEVEL_DEBUG),
        "INFO" => Ok(LEVEL_INFO),
        "WARNING" | "WARN" => Ok(LEVEL_WARNING),
        "ERROR" => Ok(LEVEL_ERROR),
        "CRITICAL" => Ok(LEVEL_CRITICAL),
        other => Err(format!(
            "unknown min_level '{other}': expected DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )),
    }
}

/// Errors from fetching.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("invalid regex '{0}': {1}")]
    BadRegex(String, String),
    #[error("log store: {0}")]
    Sql(#[from] rusqlite::Error),
}

/// Runs a fetch; returns lines in ascending seq order and the response cursor (largest seq
/// returned, or the request cursor when nothing matched).
pub fn fetch(conn: &LogDb, q: &FetchQuery) -> Result<(Vec<LogLine>, i64), FetchError> {
    let conn = &conn.0;
    let key_re = if q.scope == Scope::Regex {
        Some(
            regex::Regex::new(&q.source)
                .map_err(|e| FetchError::BadRegex(q.source.clone(), e.to_string()))?,
        )
    } else {
        None
    };
    let data_re = if q.regex.is_empty() {
        None
    } else {
        Some(
            regex::Regex::new(&q.regex)
                .map_err(|e| FetchError::BadRegex(q.regex.clone(), e.to_string()))?,
        )
    };
    let max = if q.max_lines == 0 { 1000 } else { q.max_lines };
    let (key_clause, upper) = match q.scope {
        Scope::Exact => ("key = ?1", None),
        Scope::Prefix => match prefix_upper(&q.source) {
            Some(u) => ("key >= ?1 AND key < ?6", Some(u)),
            None => ("key >= ?1", None),
        },
        Scope::Regex => ("?1 = ?1", None),
    };
    let order = if q.tail { "DESC" } else { "ASC" };
    let sql = format!(
        "SELECT seq, key, source, data, epoch_ms, level FROM logs
         WHERE {key_clause} AND seq > ?2 AND (?3 <= 0 OR seq < ?3) AND epoch_ms > ?4 AND level >= ?5
           AND (?6 IS NULL OR ?6 = ?6)
         ORDER BY seq {order}"
    );
    let mut st = conn.prepare_cached(&sql)?;
    let min_level = if q.min_level > 0 {
        q.min_level
    } else {
        i32::MIN
    };
    let mut rows = st.query(params![
        q.source,
        q.cursor,
        q.until_cursor,
        q.since_ms,
        min_level,
        upper
    ])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let line = LogLine {
            seq: r.get(0)?,
            key: r.get(1)?,
            source: r.get(2)?,
            data: r.get(3)?,
            epoch_ms: r.get(4)?,
            level: r.get(5)?,
        };
        if let Some(re) = &key_re {
            if !re.is_match(&line.key) {
                continue;
            }
        }
        if !q.substring.is_empty() && !line.data.contains(&q.substring) {
            continue;
        }
        if let Some(re) = &data_re {
            if !re.is_match(&line.data) {
                continue;
            }
        }
        out.push(line);
        if out.len() >= max {
            break;
        }
    }
    if q.tail {
        out.reverse();
    }
    let cursor = out
        .iter()
        .map(|l| l.seq)
        .max()
        .unwrap_or(q.cursor)
        .max(q.cursor);
    Ok((out, cursor))
}

/// How many lines the log store holds and its lowest and highest `seq` (0, 0, 0 when empty).
pub fn extent(conn: &LogDb) -> rusqlite::Result<(i64, i64, i64)> {
    conn.0.query_row(
        "SELECT count(*), coalesce(min(seq), 0), coalesce(max(seq), 0) FROM logs",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(source: &str, scope: Scope) -> FetchQuery {
        FetchQuery {
            source: source.into(),
            scope,
            since_ms: 0,
            cursor: 0,
            until_cursor: 0,
            substring: String::new(),
            regex: String::new(),
            max_lines: 0,
            tail: false,
            min_level: 0,
        }
    }

    #[test]
    fn numbered_lines_are_stored_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = open(&dir.path().join("logs.sqlite3")).expect("open");
        let batch = |from: i64, to: i64| -> Vec<(String, String, i64, i32, Option<i64>)> {
            (from..=to)
                .map(|i| ("stdout".into(), format!("l{i}"), i, LEVEL_INFO, Some(i)))
                .collect()
        };
        append_numbered(&mut c, "/u/j/0:0", &batch(1, 3)).expect("push");
        // A retried push of a stored batch, overlapping the next one.
        append_numbered(&mut c, "/u/j/0:0", &batch(1, 5)).expect("retry");
        append_numbered(&mut c, "/u/k/0:0", &batch(1, 1)).expect("other key");
        append(
            &mut c,
            "/u/j/0:0",
            &[("stdout".into(), "plain".into(), 9, LEVEL_INFO)],
        )
        .expect("plain");
        let (got, _) = fetch(&c, &q("/u/j/0:0", Scope::Exact)).expect("fetch");
        let data: Vec<&str> = got.iter().map(|l| l.data.as_str()).collect();
        assert_eq!(data, ["l1", "l2", "l3", "l4", "l5", "plain"]);
        drop(c);
        open(&dir.path().join("logs.sqlite3")).expect("reopen keeps the column");
    }

    #[test]
    fn scopes_cursor_tail_filters() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = open(&dir.path().join("logs.sqlite3")).expect("open");
        let lines: Vec<(String, String, i64, i32)> = (1..=1500)
            .map(|i| {
                (
                    "stdout".to_string(),
                    format!("line {i}"),
                    1000 + i,
                    LEVEL_INFO,
                )
            })
            .collect();
        append(&mut c, "/u/j/0:0", &lines).expect("append");
        append(
            &mut c,
            "/u/j2/0:0",
            &[("stderr".into(), "other".into(), 5, LEVEL_ERROR)],
        )
        .expect("append");
        let (all, cur) = fetch(
            &c,
            &FetchQuery {
                max_lines: 0,
                tail: true,
                ..q("/u/j/", Scope::Prefix)
            },
        )
        .expect("fetch");
        assert_eq!(all.len(), 1000);
        assert_eq!(all[0].data, "line 501");
        assert_eq!(all[999].data, "line 1500");
        assert_eq!(cur, all[999].seq);
        let (head, _) = fetch(
            &c,
            &FetchQuery {
                max_lines: 3,
                ..q("/u/j/", Scope::Prefix)
            },
        )
        .expect("fetch");
        assert_eq!(
            head.iter().map(|l| l.data.as_str()).collect::<Vec<_>>(),
            ["line 1", "line 2", "line 3"]
        );
        let (none, cur) = fetch(
            &c,
            &FetchQuery {
                cursor: 99999,
                ..q("/u/j/", Scope::Prefix)
            },
        )
        .expect("fetch");
        assert!(none.is_empty());
        assert_eq!(cur, 99999);
        let (ex, _) = fetch(&c, &q("/u/j2/0:0", Scope::Exact)).expect("fetch");
        assert_eq!(ex.len(), 1);
        let (re, _) = fetch(
            &c,
            &FetchQuery {
                regex: "^line 14[0-9]{2}$".into(),
                ..q("/u/j/0:0", Scope::Exact)
            },
        )
        .expect("fetch");
        assert_eq!(re.len(), 100);
        let (lvl, _) = fetch(
            &c,
            &FetchQuery {
                min_level: LEVEL_ERROR,
                ..q("^/u/", Scope::Regex)
            },
        )
        .expect("fetch");
        assert_eq!(lvl.len(), 1);
        assert!(matches!(
            fetch(
                &c,
                &FetchQuery {
                    regex: "[".into(),
                    ..q("/u/", Scope::Prefix)
                }
            ),
            Err(FetchError::BadRegex(..))
        ));
    }
}
