use super::*;
use std::time::Duration;

fn col(name: &str, kind: ColumnKind, nullable: bool) -> StatsColumn {
    StatsColumn {
        name: name.into(),
        kind,
        nullable,
    }
}

fn data(name: &str, kind: ColumnKind, values: Vec<Value>) -> ColumnData {
    ColumnData {
        name: name.into(),
        kind,
        values,
    }
}

fn events() -> Vec<StatsColumn> {
    vec![
        col("task_id", ColumnKind::String, false),
        col("attempt_id", ColumnKind::Int64, false),
        col("ts", ColumnKind::TimestampMs, false),
        col("reason", ColumnKind::String, true),
    ]
}

fn open_tmp() -> (tempfile::TempDir, StatsDb) {
    let dir = tempfile::tempdir().expect("tempdir");
    let logs = crate::logs::open(&dir.path().join("logs.sqlite3")).expect("log db");
    drop(logs);
    let db = open(
        &dir.path().join("stats.sqlite3"),
        Some(&dir.path().join("logs.sqlite3")),
    )
    .expect("stats db");
    (dir, db)
}

fn write_to(db: &mut StatsDb, ns: &str, rows: &[(&str, i64, i64)], now: i64) -> i64 {
    let batch = vec![
        data(
            "task_id",
            ColumnKind::String,
            rows.iter().map(|r| Value::Text(r.0.into())).collect(),
        ),
        data(
            "attempt_id",
            ColumnKind::Int64,
            rows.iter().map(|r| Value::Int(r.1)).collect(),
        ),
        data(
            "ts",
            ColumnKind::TimestampMs,
            rows.iter().map(|r| Value::Int(r.2)).collect(),
        ),
    ];
    db.write(ns, &batch, now).expect("write")
}

fn write_events(db: &mut StatsDb, rows: &[(&str, i64, i64)], now: i64) -> i64 {
    write_to(db, "iris.task_event", rows, now)
}

#[test]
fn a_registered_namespace_takes_batches_and_answers_sql_typed_by_its_schema() {
    let (_dir, mut db) = open_tmp();
    let ns = db
        .register("iris.task_event", events(), "task_id", Policy::default())
        .expect("register");
    assert_eq!(
        ns.columns.last().map(|c| c.name.as_str()),
        Some(CLUSTER_COLUMN)
    );
    assert_eq!(
        write_events(
            &mut db,
            &[
                ("/u/j/0", 0, 1000),
                ("/u/j/0", 1, 3000),
                ("/u/j/1", 0, 2000)
            ],
            0
        ),
        3
    );
    // The published CLI's `task events` query: a subquery, an IN list, ORDER BY, LIMIT.
    let r = db
        .query(
            "SELECT attempt_id, ts, reason FROM (SELECT attempt_id, ts, reason FROM \"iris.task_event\" \
             WHERE task_id = '/u/j/0' AND attempt_id IN (0, 1) ORDER BY ts DESC LIMIT 10) AS recent ORDER BY ts ASC",
            Duration::from_secs(5),
        )
        .expect("query");
    assert_eq!(r.rows, 2);
    let kinds: Vec<ColumnKind> = r.columns.iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds,
        [
            ColumnKind::Int64,
            ColumnKind::TimestampMs,
            ColumnKind::String
        ]
    );
    assert_eq!(r.values[1], [Value::Int(1000), Value::Int(3000)]);
    assert_eq!(r.values[2], [Value::Null, Value::Null]);
    // `SELECT *` puts the server's seq first; expressions are typed by their values.
    let r = db
        .query(
            "SELECT * FROM \"iris.task_event\" ORDER BY seq",
            Duration::from_secs(5),
        )
        .expect("select *");
    assert_eq!(r.columns[0].name, "seq");
    assert_eq!(r.values[0], [Value::Int(1), Value::Int(2), Value::Int(3)]);
    let r = db
        .query(
            "SELECT count(*) AS n, avg(attempt_id) AS a FROM \"iris.task_event\"",
            Duration::from_secs(5),
        )
        .expect("aggregate");
    assert_eq!(r.columns[0].kind, ColumnKind::Int64);
    assert_eq!(r.columns[1].kind, ColumnKind::Float64);
    let (_, extent) = db.namespaces().expect("list").remove(0);
    assert_eq!((extent.rows, extent.min_seq, extent.max_seq), (3, 1, 3));
}

#[test]
fn re_registering_adds_columns_keeps_a_subset_and_refuses_a_changed_type() {
    let (_dir, mut db) = open_tmp();
    db.register("x.y", events(), "task_id", Policy::default())
        .expect("register");
    write_to(&mut db, "x.y", &[("/u/j/0", 0, 1)], 0);
    let mut more = events();
    more.push(col("node", ColumnKind::String, false));
    let ns = db
        .register("x.y", more, "task_id", Policy::default())
        .expect("extend");
    let node = ns
        .columns
        .iter()
        .find(|c| c.name == "node")
        .expect("node added");
    assert!(
        node.nullable,
        "a column added later is nullable: earlier rows lack it"
    );
    let ns = db
        .register("x.y", events()[..2].to_vec(), "task_id", Policy::default())
        .expect("subset");
    assert!(ns.columns.iter().any(|c| c.name == "node"));
    let mut changed = events();
    changed[1].kind = ColumnKind::String;
    let err = db
        .register("x.y", changed, "task_id", Policy::default())
        .expect_err("type change");
    assert!(matches!(err, StatsError::Conflict(_)), "{err}");
    assert!(err.to_string().contains("attempt_id"), "{err}");
}

#[test]
fn bad_registrations_and_writes_name_the_field_and_write_nothing() {
    let (_dir, mut db) = open_tmp();
    for (ns, columns, key, needle) in [
        ("Bad Name", events(), "task_id", "does not match"),
        ("log", events(), "task_id", "privileged"),
        ("x.y", events(), "nope", "key_column \"nope\""),
        ("x.y", events(), "", "timestamp_ms"),
        (
            "x.y",
            vec![col("seq", ColumnKind::Int64, false)],
            "seq",
            "reserved",
        ),
        (
            "x.y",
            vec![
                col("a", ColumnKind::Int64, false),
                col("a", ColumnKind::Int64, false),
            ],
            "a",
            "twice",
        ),
        ("x.y", vec![col("m", ColumnKind::Map, false)], "m", "MAP"),
    ] {
        let err = db
            .register(ns, columns, key, Policy::default())
            .expect_err(needle);
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
    db.register("x.y", events(), "task_id", Policy::default())
        .expect("register");
    let ok_ids = data("task_id", ColumnKind::String, vec![Value::Text("t".into())]);
    let ok_attempt = data("attempt_id", ColumnKind::Int64, vec![Value::Int(0)]);
    let ok_ts = data("ts", ColumnKind::TimestampMs, vec![Value::Int(0)]);
    for (batch, needle) in [
        (
            vec![ok_ids.clone(), ok_attempt.clone()],
            "\"ts\": missing required",
        ),
        (
            vec![
                ok_ids.clone(),
                ok_attempt.clone(),
                ok_ts.clone(),
                data("zz", ColumnKind::Int64, vec![Value::Int(1)]),
            ],
            "unknown column \"zz\"",
        ),
        (
            vec![
                ok_ids.clone(),
                data(
                    "attempt_id",
                    ColumnKind::String,
                    vec![Value::Text("0".into())],
                ),
                ok_ts.clone(),
            ],
            "type mismatch",
        ),
        (
            vec![
                ok_ids.clone(),
                data("attempt_id", ColumnKind::Int64, vec![Value::Null]),
                ok_ts.clone(),
            ],
            "null in a required",
        ),
    ] {
        let err = db.write("x.y", &batch, 0).expect_err(needle);
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
    assert!(matches!(
        db.write("nope", &[ok_ids], 0),
        Err(StatsError::NotFound(_))
    ));
    let r = db
        .query("SELECT count(*) FROM \"x.y\"", Duration::from_secs(5))
        .expect("count");
    assert_eq!(r.values[0], [Value::Int(0)], "nothing was half-written");
}

#[test]
fn queries_may_only_read() {
    let (dir, mut db) = open_tmp();
    db.register("x.y", events(), "task_id", Policy::default())
        .expect("register");
    let attach = format!(
        "ATTACH DATABASE '{}' AS other",
        dir.path().join("stats.sqlite3").display()
    );
    for sql in [
        "DELETE FROM \"x.y\"",
        "INSERT INTO \"x.y\"(task_id) VALUES ('a')",
        "DROP TABLE \"x.y\"",
        "CREATE TEMP TABLE t(a)",
        attach.as_str(),
        "PRAGMA journal_mode",
        "SELECT 1; DELETE FROM \"x.y\"",
        "SELEC 1",
        "SELECT * FROM nope",
    ] {
        let err = db.query(sql, Duration::from_secs(5)).expect_err(sql);
        assert!(matches!(err, QueryError::Invalid(_)), "{sql}: {err}");
    }
    // A query past its deadline stops with a hint.
    let err = db
        .query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT max(i) FROM n",
            Duration::from_millis(50),
        )
        .expect_err("endless");
    assert!(err.to_string().contains("LIMIT"), "{err}");
}

#[test]
fn the_log_namespace_reads_the_log_store() {
    let (dir, db) = open_tmp();
    let mut logs = crate::logs::open(&dir.path().join("logs.sqlite3")).expect("logs");
    crate::logs::append_numbered(
        &mut logs,
        "/u/j/0:0",
        &[("stdout".into(), "hello".into(), 5, 2, None)],
    )
    .expect("append");
    let r = db
        .query(
            "SELECT key, data, epoch_ms FROM \"log\" WHERE key = '/u/j/0:0'",
            Duration::from_secs(5),
        )
        .expect("log query");
    assert_eq!(r.values[1], [Value::Text("hello".into())]);
    assert_eq!(r.columns[2].kind, ColumnKind::Int64);
}

#[test]
fn retention_drops_the_oldest_batches_past_the_age_or_size_limit() {
    let (_dir, mut db) = open_tmp();
    let policy = Policy {
        max_segments: 0,
        max_bytes: 0,
        max_age_seconds: 3600,
    };
    db.register("iris.task_event", events(), "task_id", policy)
        .expect("register");
    let hour = 3_600_000;
    write_events(&mut db, &[("old", 0, 0)], 0);
    write_events(&mut db, &[("new", 0, 0)], 2 * hour);
    assert_eq!(db.enforce_retention(2 * hour + 1).expect("retention"), 1);
    let r = db
        .query(
            "SELECT task_id FROM \"iris.task_event\"",
            Duration::from_secs(5),
        )
        .expect("query");
    assert_eq!(r.values[0], [Value::Text("new".into())]);

    // Size: with a cap of ~3 batches' bytes, the oldest go first and the newest stays.
    let tight = Policy {
        max_segments: 0,
        max_bytes: 3 * 20,
        max_age_seconds: 0,
    };
    db.register("iris.task_event", events(), "task_id", tight)
        .expect("tighten");
    for i in 0..10 {
        write_events(&mut db, &[("abcd", i, 0)], 3 * hour + i * 61_000);
    }
    db.enforce_retention(3 * hour + 11 * 61_000)
        .expect("retention");
    let (_, extent) = db.namespaces().expect("list").remove(0);
    assert!(extent.bytes <= 60 && extent.rows >= 1, "{extent:?}");
    let r = db
        .query(
            "SELECT max(attempt_id) FROM \"iris.task_event\"",
            Duration::from_secs(5),
        )
        .expect("query");
    assert_eq!(r.values[0], [Value::Int(9)], "the newest batch is kept");
}

#[test]
fn drop_removes_a_namespace_but_never_the_log() {
    let (_dir, mut db) = open_tmp();
    db.register("x.y", events(), "task_id", Policy::default())
        .expect("register");
    db.drop_table("x.y").expect("drop");
    assert!(matches!(db.drop_table("x.y"), Err(StatsError::NotFound(_))));
    assert!(matches!(db.drop_table("log"), Err(StatsError::Invalid(_))));
    assert!(db.namespaces().expect("list").is_empty());
}

#[test]
fn the_newest_rows_of_a_key_are_read_through_its_index() {
    let (_dir, mut db) = open_tmp();
    db.register("iris.task_event", events(), "task_id", Policy::default())
        .expect("register");
    write_events(
        &mut db,
        &[
            ("/u/j/0", 0, 1),
            ("/u/j/1", 0, 2),
            ("/u/j/0", 1, 3),
            ("/u/j/0", 2, 4),
        ],
        0,
    );
    let keys = vec![
        "/u/j/0".to_string(),
        "/u/j/1".to_string(),
        "/u/j/9".to_string(),
    ];
    let latest = db
        .latest_by_key("iris.task_event", &keys, &["attempt_id", "ts"])
        .expect("latest");
    assert_eq!(latest.len(), 2, "a key without rows is absent");
    assert_eq!(latest["/u/j/0"], [Value::Int(2), Value::Int(4)]);
    assert_eq!(latest["/u/j/1"], [Value::Int(0), Value::Int(2)]);
    let newest = db
        .newest_for_key("iris.task_event", "/u/j/0", &["attempt_id"], 2)
        .expect("newest");
    assert_eq!(
        newest,
        [[Value::Int(1)], [Value::Int(2)]],
        "the newest two, oldest first"
    );
    assert!(db
        .newest_for_key("iris.unregistered", "/u/j/0", &["x"], 2)
        .expect("unregistered")
        .is_empty());
}

#[test]
fn the_store_as_a_whole_is_capped_oldest_batches_first() {
    let (_dir, mut db) = open_tmp();
    db.register("a.x", events(), "task_id", Policy::default())
        .expect("a");
    db.register("b.x", events(), "task_id", Policy::default())
        .expect("b");
    let ns =
        |db: &mut StatsDb, name: &str, i: i64| write_to(db, name, &[("abcd", i, 0)], i * 61_000);
    for i in 0..6 {
        ns(&mut db, if i % 2 == 0 { "a.x" } else { "b.x" }, i);
    }
    let bytes = |db: &StatsDb| {
        db.namespaces()
            .expect("list")
            .iter()
            .map(|(_, e)| e.bytes)
            .sum::<i64>()
    };
    let before = bytes(&db);
    let removed = db.enforce_total_cap(before / 2).expect("cap");
    assert!(removed >= 2, "{removed}");
    assert!(bytes(&db) <= before / 2 + 20, "{} of {before}", bytes(&db));
    // Each namespace keeps its newest batch.
    for (ns, extent) in db.namespaces().expect("list") {
        assert!(extent.rows >= 1, "{} kept nothing", ns.name);
    }
}
