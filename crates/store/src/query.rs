//! Read-only SQL for operators (`iris query`, `ExecuteRawQuery`).
//!
//! Defence in depth: a read-only connection with `query_only`, an authorizer that allows only
//! reads, a statement check (one SELECT/WITH statement), a progress-handler deadline and a row
//! limit, so a heavy query can neither write nor stall the controller.

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::time::{Duration, Instant};

/// Why a query was refused or stopped.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The statement is not a single read-only SELECT.
    #[error("{0}")]
    NotAllowed(String),
    /// The query ran past its time limit.
    #[error("query exceeded its time limit of {:.1} s and was stopped", .0.as_secs_f64())]
    Timeout(Duration),
    #[error("sql error: {0}")]
    Sql(String),
}

/// A query result: column names and rows as JSON arrays.
#[derive(Debug, Clone)]
pub struct QueryResult {
    pub columns: Vec<String>,
    pub rows: Vec<String>,
    pub truncated: bool,
}

/// A read-only connection for operators' queries.
pub struct ReadOnlyDb(Connection);

/// Opens a read-only connection suitable for [`run_readonly`].
pub fn open_readonly(path: &Path) -> rusqlite::Result<ReadOnlyDb> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )?;
    conn.pragma_update(None, "query_only", 1)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.authorizer(Some(|ctx: AuthContext<'_>| match ctx.action {
        // Jobs' secrets are delivered to their tasks and shown to nobody.
        AuthAction::Read {
            table_name: "job_secrets",
            ..
        } => Authorization::Deny,
        AuthAction::Select
        | AuthAction::Read { .. }
        | AuthAction::Function { .. }
        | AuthAction::Recursive => Authorization::Allow,
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => {
            // Reading a harmless pragma is fine; setting any pragma is not.
            if pragma_value.is_none()
                && matches!(pragma_name, "table_info" | "table_list" | "index_list")
            {
                Authorization::Allow
            } else {
                Authorization::Deny
            }
        }
        _ => Authorization::Deny,
    }));
    Ok(ReadOnlyDb(conn))
}

fn first_keyword(sql: &str) -> String {
    let mut s = sql.trim_start();
    loop {
        if let Some(rest) = s.strip_prefix("--") {
            s = rest
                .split_once('\n')
                .map(|x| x.1)
                .unwrap_or("")
                .trim_start();
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest
                .split_once("*/")
                .map(|x| x.1)
                .unwrap_or("")
                .trim_start();
        } else {
            break;
        }
    }
    s.split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("")
        .to_ascii_uppercase()
}

/// Whether anything but whitespace follows the first `;` outside quotes and comments.
fn has_second_statement(sql: &str) -> bool {
    let b = sql.as_bytes();
    let mut i = 0;
    let mut quote: Option<u8> = None;
    while i < b.len() {
        let c = b[i];
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                b'\'' | b'"' | b'`' => quote = Some(c),
                b'[' => quote = Some(b']'),
                b'-' if b.get(i + 1) == Some(&b'-') => {
                    while i < b.len() && b[i] != b'\n' {
                        i += 1;
                    }
                }
                b';' => {
                    return !first_keyword(&sql[i + 1..]).is_empty()
                        || !sql[i + 1..].trim().trim_matches(';').trim().is_empty()
                }
                _ => {}
            },
        }
        i += 1;
    }
    false
}

/// Runs one read-only statement with a deadline and a row limit.
pub fn run_readonly(
    conn: &ReadOnlyDb,
    sql: &str,
    time_limit: Duration,
    max_rows: usize,
) -> Result<QueryResult, QueryError> {
    let kw = first_keyword(sql);
    if kw != "SELECT" && kw != "WITH" && kw != "VALUES" {
        return Err(QueryError::NotAllowed(
            "only SELECT statements are allowed".into(),
        ));
    }
    if has_second_statement(sql) {
        return Err(QueryError::NotAllowed(
            "only one SELECT statement is allowed per query".into(),
        ));
    }
    let deadline = Instant::now() + time_limit;
    let conn = &conn.0;
    conn.progress_handler(1000, Some(move || Instant::now() > deadline));
    let res = run_inner(conn, sql, max_rows);
    conn.progress_handler(0, None::<fn() -> bool>);
    res.map_err(|e| {
        if Instant::now() > deadline {
            return QueryError::Timeout(time_limit);
        }
        match e {
            rusqlite::Error::SqliteFailure(f, Some(msg))
                if f.code == rusqlite::ErrorCode::AuthorizationForStatementDenied
                    && msg.contains("job_secrets") =>
            {
                QueryError::NotAllowed(
                    "job_secrets holds jobs' secret values, which no query may read (a job's secret names are not shown either; the task reads them from $RIGGING_SECRETS_DIR)".into(),
                )
            }
            rusqlite::Error::SqliteFailure(f, msg)
                if f.code == rusqlite::ErrorCode::AuthorizationForStatementDenied =>
            {
                QueryError::NotAllowed(format!(
                    "only read-only SELECT statements are allowed ({})",
                    msg.unwrap_or_else(|| "not authorized".into())
                ))
            }
            rusqlite::Error::MultipleStatement => {
                QueryError::NotAllowed("only one SELECT statement is allowed per query".into())
            }
            other => QueryError::Sql(other.to_string()),
        }
    })
}

fn run_inner(conn: &Connection, sql: &str, max_rows: usize) -> rusqlite::Result<QueryResult> {
    let mut st = conn.prepare(sql)?;
    if !st.readonly() {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_AUTH),
            Some("statement writes".into()),
        ));
    }
    let columns: Vec<String> = st.column_names().iter().map(|s| s.to_string()).collect();
    let n = columns.len();
    let mut rows = st.query([])?;
    let mut out = Vec::new();
    let mut truncated = false;
    while let Some(row) = rows.next()? {
        if out.len() >= max_rows {
            truncated = true;
            break;
        }
        let mut vals = Vec::with_capacity(n);
        for i in 0..n {
            let v = match row.get_ref(i)? {
                ValueRef::Null => serde_json::Value::Null,
                ValueRef::Integer(x) => serde_json::Value::from(x),
                ValueRef::Real(x) => serde_json::Value::from(x),
                ValueRef::Text(t) => {
                    serde_json::Value::from(String::from_utf8_lossy(t).into_owned())
                }
                ValueRef::Blob(b) => serde_json::Value::from(format!("<blob:{} bytes>", b.len())),
            };
            vals.push(v);
        }
        out.push(serde_json::Value::Array(vals).to_string());
    }
    Ok(QueryResult {
        columns,
        rows: out,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> (tempfile::TempDir, ReadOnlyDb) {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.sqlite3");
        let w = crate::Db::open(&p).expect("open");
        w.conn
            .execute("INSERT INTO meta(key, value) VALUES ('x', 1)", [])
            .expect("insert");
        drop(w);
        let r = open_readonly(&p).expect("ro");
        (dir, r)
    }

    #[test]
    fn select_works_and_writes_are_refused() {
        let (_d, c) = db();
        let r = run_readonly(
            &c,
            "SELECT key, value FROM meta",
            Duration::from_secs(2),
            100,
        )
        .expect("select");
        assert_eq!(r.columns, vec!["key", "value"]);
        assert_eq!(r.rows, vec![r#"["x",1]"#]);
        for bad in [
            "DELETE FROM meta",
            "UPDATE meta SET value = 2",
            "INSERT INTO meta VALUES ('y', 2)",
            "DROP TABLE meta",
            "ATTACH DATABASE 'x.db' AS x",
            "PRAGMA writable_schema=1",
            "SELECT 1; DELETE FROM meta",
            "WITH x AS (SELECT 1) DELETE FROM meta",
        ] {
            assert!(
                matches!(
                    run_readonly(&c, bad, Duration::from_secs(2), 100),
                    Err(QueryError::NotAllowed(_))
                ),
                "{bad} must be refused"
            );
        }
        let r = run_readonly(&c, "SELECT count(*) FROM meta", Duration::from_secs(2), 100)
            .expect("still there");
        assert_eq!(r.rows, vec!["[1]"]);
    }

    #[test]
    fn the_secrets_table_is_never_readable() {
        let (_d, c) = db();
        for sql in [
            "SELECT * FROM job_secrets",
            "SELECT value FROM job_secrets",
            "SELECT count(*) FROM jobs WHERE job_id IN (SELECT job_id FROM job_secrets)",
        ] {
            match run_readonly(&c, sql, Duration::from_secs(2), 10) {
                Err(QueryError::NotAllowed(m)) => assert!(m.contains("job_secrets"), "{m}"),
                other => panic!("{sql}: {other:?}"),
            }
        }
    }

    #[test]
    fn runaway_query_is_stopped() {
        let (_d, c) = db();
        let sql = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r";
        // On a thread, so a query that is never stopped fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(run_readonly(&c, sql, Duration::from_millis(200), 10));
        });
        let r = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the runaway query was not stopped");
        assert!(matches!(r, Err(QueryError::Timeout(_))), "{r:?}");
    }
}
