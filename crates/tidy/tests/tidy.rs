//! The architecture's invariants, checked over the source tree (rust-analyzer's tidy tests are
//! the model). Each test names the rule; a failure lists every offending file and line.
//!
//! The checks read Rust source as text: string literals are extracted with a small lexer (no
//! crate does "give me the string literals of a Rust file" without pulling in a full parser),
//! and `#[cfg(test)]` modules at the end of a file count as tests.

use regex::Regex;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Every file under `dir` (recursively) whose name ends with one of `exts`.
fn files(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                if name != "target" && !name.starts_with('.') && name != "node_modules" {
                    stack.push(p);
                }
            } else if exts.iter().any(|x| name.ends_with(x)) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The path relative to the workspace, with `/` separators.
fn rel(p: &Path) -> String {
    p.strip_prefix(workspace())
        .unwrap_or(p)
        .to_string_lossy()
        .replace('\\', "/")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The part of a file before its trailing `#[cfg(test)]` module (the whole file if none).
fn non_test(src: &str) -> &str {
    let mut at = 0;
    for line in src.split_inclusive('\n') {
        if line.starts_with("#[cfg(test)]") {
            return &src[..at];
        }
        at += line.len();
    }
    src
}

/// Whether a path is test code: integration tests, benches, test modules in their own file, and
/// the dev-only test kit crate.
fn is_test_path(r: &str) -> bool {
    r.contains("/tests/")
        || r.contains("/benches/")
        || r.ends_with("/tests.rs")
        || r.ends_with("/testutil.rs")
        || r.ends_with("_tests.rs")
        || r.starts_with("crates/kube-testkit/")
        || r.starts_with("crates/tidy/")
}

/// String literals of a Rust source with the line each starts on. Skips comments and char
/// literals; handles escapes and raw strings.
fn string_literals(src: &str) -> Vec<(usize, String)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0usize, 1usize);
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    if b[i] == b'\n' {
                        line += 1;
                    }
                    i += 1;
                }
                i += 2;
            }
            b'\'' => {
                // A char literal ('x', '\n', '"'), or a lifetime ('a).
                if b.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                } else if b.get(i + 2) == Some(&b'\'') {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            b'r' if (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let start_line = line;
                let start = j + 1;
                let mut k = start;
                loop {
                    if k >= b.len() {
                        break;
                    }
                    if b[k] == b'"' && (0..hashes).all(|h| b.get(k + 1 + h) == Some(&b'#')) {
                        break;
                    }
                    if b[k] == b'\n' {
                        line += 1;
                    }
                    k += 1;
                }
                out.push((start_line, src[start..k.min(b.len())].to_string()));
                i = k + 1 + hashes;
            }
            b'"' => {
                let start_line = line;
                let start = i + 1;
                let mut k = start;
                while k < b.len() && b[k] != b'"' {
                    if b[k] == b'\\' {
                        k += 1;
                    }
                    if k < b.len() && b[k] == b'\n' {
                        line += 1;
                    }
                    k += 1;
                }
                out.push((start_line, src[start..k.min(b.len())].to_string()));
                i = k + 1;
            }
            _ => i += 1,
        }
    }
    out
}

fn sql_re() -> Regex {
    Regex::new(
        r"(?is)\b(SELECT\b[^;]{0,600}?\bFROM\b|INSERT\s+INTO\b|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\b|CREATE\s+(TABLE|INDEX|TRIGGER)\b|VACUUM\s+INTO\s+\?|PRAGMA\s+\w)",
    )
    .expect("regex")
}

fn fail(rule: &str, violations: Vec<String>) {
    assert!(
        violations.is_empty(),
        "{rule}:\n  {}",
        violations.join("\n  ")
    );
}

/// Where SQL may appear outside the store: operator SQL (`iris query`, the dashboard's Query
/// page) is a product feature, so the page's example and the tests whose subject is operator
/// SQL itself (its formats, its read-only guard, its admin-only rule) send it. Everything else,
/// tests included, reads through the typed InspectService RPCs.
enum Within {
    /// A string literal containing this text.
    Literal(&'static str),
    /// Any string literal inside the function of this name.
    Fn(&'static str),
}

const SQL_ALLOWED: &[(&str, Within)] = &[
    (
        "crates/dashboard/src/pages",
        Within::Literal("Example: SELECT state, count(*) FROM jobs"),
    ),
    (
        "crates/cli/tests/cluster.rs",
        Within::Fn("b14_query_formats_and_read_only"),
    ),
    (
        "crates/cli/tests/cluster.rs",
        Within::Literal("UPDATE jobs SET state=1"),
    ),
    (
        "crates/cli/tests/hardening.rs",
        Within::Fn("query_refuses_writes_and_stops_runaway_queries_while_jobs_run"),
    ),
    // A non-admin is refused operator SQL; an admin is not.
    (
        "crates/cli/tests/auth.rs",
        Within::Literal("SELECT count(*) FROM jobs"),
    ),
    // The browser drives the Query page.
    (
        "crates/cli/tests/dashboard.rs",
        Within::Literal("/query?sql="),
    ),
];

/// The name of the function whose body holds `line` (1-based): the last `fn` declared above it.
fn enclosing_fn(src: &str, line: usize) -> Option<String> {
    static FN: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^\s*(?:pub\s+)?(?:async\s+)?fn\s+(\w+)").expect("regex"));
    src.lines()
        .take(line)
        .filter_map(|l| FN.captures(l).map(|c| c[1].to_string()))
        .last()
}

fn sql_allowed(file: &str, src: &str, line: usize, lit: &str) -> bool {
    SQL_ALLOWED.iter().any(|(f, w)| {
        file.starts_with(f)
            && match w {
                Within::Literal(s) => lit.contains(s),
                Within::Fn(name) => enclosing_fn(src, line).as_deref() == Some(name),
            }
    })
}

#[test]
fn sql_and_rusqlite_live_only_in_the_store() {
    let root = workspace();
    let sql = sql_re();
    let mut bad = Vec::new();
    for p in files(&root.join("crates"), &[".rs"]) {
        let r = rel(&p);
        if r.starts_with("crates/store/") || r.starts_with("crates/tidy/") {
            continue;
        }
        let src = read(&p);
        for (n, l) in src.lines().enumerate() {
            if l.contains("rusqlite") {
                bad.push(format!("{r}:{}: names rusqlite", n + 1));
            }
        }
        // Tests are checked too: they observe the cluster through the typed InspectService
        // reads, and send SQL only where operator SQL is itself what they test.
        for (line, lit) in string_literals(&src) {
            if sql.is_match(&lit) && !sql_allowed(&r, &src, line, &lit) {
                bad.push(format!(
                    "{r}:{line}: SQL outside crates/store: {}",
                    first_line(&lit)
                ));
            }
        }
    }
    for p in files(&root.join("crates"), &["Cargo.toml"]) {
        let r = rel(&p);
        if r.starts_with("crates/store/") {
            continue;
        }
        if read(&p).contains("rusqlite") {
            bad.push(format!("{r}: depends on rusqlite"));
        }
    }
    // The store's API speaks its own types: no re-export or alias of rusqlite.
    let reexport = Regex::new(r"pub\s+(use\s+rusqlite|type\s+\w+\s*=\s*rusqlite)").expect("regex");
    for p in files(&root.join("crates/store/src"), &[".rs"]) {
        let src = read(&p);
        for (n, l) in non_test(&src).lines().enumerate() {
            if reexport.is_match(l) {
                bad.push(format!("{}:{}: exposes rusqlite", rel(&p), n + 1));
            }
        }
    }
    fail(
        "only crates/store speaks SQL (Architecture Invariant: the store is the boundary)",
        bad,
    );
}

fn first_line(s: &str) -> String {
    let l = s.trim().lines().next().unwrap_or("").trim();
    l.chars().take(90).collect()
}

/// Modules of the store allowed to write a job's, task's or attempt's state column.
const STATE_WRITERS: &[&str] = &["crates/store/src/apply/", "crates/store/src/mirror.rs"];

fn re(s: &str) -> Regex {
    Regex::new(s).expect("regex")
}

static UPDATE: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?is)\bUPDATE\s+(jobs|tasks|task_attempts)\s+SET\b(.*?)(\bWHERE\b|$)"));
static SET_STATE: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)(^|[^\w.])(\w+\.)?state\s*="));
static INSERT: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?is)\bINSERT\s+INTO\s+(jobs|tasks|task_attempts)\s*\(([^)]*)\)"));
static UPSERT: LazyLock<Regex> = LazyLock::new(|| re(r"(?is)\bDO\s+UPDATE\s+SET\b(.*)"));
static STATE_COLUMN: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)(^|[^\w])state([^\w]|$)"));

fn writes_state(sql: &str) -> bool {
    if let Some(c) = UPDATE.captures(sql) {
        if SET_STATE.is_match(&c[2]) {
            return true;
        }
    }
    if let Some(c) = INSERT.captures(sql) {
        if STATE_COLUMN.is_match(&c[2]) {
            return true;
        }
        if let Some(u) = UPSERT.captures(sql) {
            if SET_STATE.is_match(&u[1]) {
                return true;
            }
        }
    }
    false
}

#[test]
fn state_columns_are_written_only_by_the_transition_appliers() {
    let root = workspace();
    let mut bad = Vec::new();
    for p in files(&root.join("crates"), &[".rs"]) {
        let r = rel(&p);
        if is_test_path(&r) || STATE_WRITERS.iter().any(|w| r.starts_with(w)) {
            continue;
        }
        let src = read(&p);
        for (line, lit) in string_literals(non_test(&src)) {
            if writes_state(&lit) {
                bad.push(format!(
                    "{r}:{line}: writes a state column: {}",
                    first_line(&lit)
                ));
            }
        }
    }
    fail(
        "a state column is written only in crates/store/src/apply (through iris_types::transition / job_transition) or crates/store/src/mirror.rs (a peer's reported state)",
        bad,
    );
}

#[test]
fn sql_names_states_through_the_generated_sets() {
    let root = workspace();
    let sql = sql_re();
    let literal =
        Regex::new(r"(?i)(^|[^\w])(\w+\.)?state\s*(=|!=|<>|\bNOT\s+IN\b|\bIN\b)\s*\(?\s*-?\d")
            .expect("regex");
    let mut bad = Vec::new();
    for p in files(&root.join("crates/store/src"), &[".rs"]) {
        let r = rel(&p);
        if r.ends_with("/schema.rs") {
            continue; // migrations are frozen history; they compare no states
        }
        let src = read(&p);
        for (line, lit) in string_literals(non_test(&src)) {
            if sql.is_match(&lit) && literal.is_match(&lit) {
                bad.push(format!(
                    "{r}:{line}: literal state code: {}",
                    first_line(&lit)
                ));
            }
        }
    }
    fail(
        "state codes in SQL come from TaskState/JobState (crates/store/src/sets.rs or `.code()`), never literals",
        bad,
    );
}

const MAX_LINES: usize = 800;

#[test]
fn no_source_file_over_the_size_limit() {
    let root = workspace();
    let mut bad = Vec::new();
    for p in files(&root.join("crates"), &[".rs"]) {
        let r = rel(&p);
        if !r.contains("/src/") || is_test_path(&r) {
            continue;
        }
        let n = non_test(&read(&p)).lines().count();
        if n > MAX_LINES {
            bad.push(format!("{r}: {n} lines"));
        }
    }
    fail(
        &format!("no source file over {MAX_LINES} lines (split it by role)"),
        bad,
    );
}

#[test]
fn the_checks_see_what_they_look_for() {
    // The lexer finds literals across lines and raw strings, skipping chars and comments.
    let src = "let a = '\"'; // \"not this\"\nlet s = \"UPDATE tasks SET state = ?2\n WHERE x\";\nlet r = r#\"SELECT state FROM jobs WHERE state IN (1, 2)\"#;\nfn f<'a>(x: &'a str) {}";
    let lits = string_literals(src);
    assert_eq!(lits.len(), 2, "{lits:?}");
    assert_eq!(lits[0].0, 2);
    assert!(writes_state(&lits[0].1));
    assert!(!writes_state(
        "UPDATE federated_jobs SET handoff_state = 1 WHERE job_id = ?1"
    ));
    assert!(!writes_state(
        "UPDATE tasks SET status_message = ?2 WHERE task_id = ?1"
    ));
    assert!(writes_state(
        "INSERT INTO task_attempts(task_id, attempt_id, state) VALUES (?1, ?2, ?3)"
    ));
    assert!(writes_state(
        "INSERT INTO tasks(task_id, x) VALUES (?1, ?2) ON CONFLICT(task_id) DO UPDATE SET state = excluded.state"
    ));
    assert!(sql_re().is_match(&lits[1].1));
    assert_eq!(non_test("a\n#[cfg(test)]\nmod tests {}\n"), "a\n");
    // An allowance by function covers that function's body and no other.
    let t = "#[test]\nfn b14_query_formats_and_read_only() {\n    q(\"DELETE FROM jobs\");\n}\nasync fn other() {\n    q(\"DELETE FROM jobs\");\n}\n";
    let f = "crates/cli/tests/cluster.rs";
    assert!(sql_allowed(f, t, 3, "DELETE FROM jobs"));
    assert!(!sql_allowed(f, t, 6, "DELETE FROM jobs"));
    assert!(!sql_allowed(
        "crates/cli/tests/auth.rs",
        t,
        3,
        "DELETE FROM jobs"
    ));
}

/// Where a `{…:?}` placeholder may stand in non-test source: log lines (tracing renders
/// fields with `Debug` by design), panics and expectations (bugs, not answers), the log layer
/// that renders tracing's field values, benchmark diagnostics, and a line marked `debug-ok:`
/// with its reason.
const DEBUG_ALLOWED_FILES: &[&str] = &["crates/rpc/src/proclog.rs", "crates/cli/src/bench"];
const DEBUG_ALLOWED_CALLS: &[&str] = &[
    "tracing::",
    "trace!(",
    "debug!(",
    "info!(",
    "warn!(",
    "error!(",
    "panic!(",
    "unreachable!(",
    "expect(",
    "assert",
];

#[test]
fn user_facing_text_has_no_debug_formatting() {
    let placeholder = re(r"\{[A-Za-z0-9_.]*:#?\?\}");
    let root = workspace();
    let mut bad = Vec::new();
    for p in files(&root.join("crates"), &[".rs"]) {
        let r = rel(&p);
        if !r.contains("/src/")
            || is_test_path(&r)
            || DEBUG_ALLOWED_FILES.iter().any(|f| r.starts_with(f))
        {
            continue;
        }
        let src = read(&p);
        let body = non_test(&src);
        let lines: Vec<&str> = body.lines().collect();
        for (line, lit) in string_literals(body) {
            if !placeholder.is_match(&lit) {
                continue;
            }
            // The call the literal belongs to starts on its line or up to two lines above.
            let from = line.saturating_sub(3);
            let context = lines[from..line.min(lines.len())].join("\n");
            if DEBUG_ALLOWED_CALLS.iter().any(|c| context.contains(c))
                || context.contains("debug-ok:")
            {
                continue;
            }
            bad.push(format!("{r}:{line}: {}", first_line(&lit)));
        }
    }
    fail(
        "user-facing text quotes input with iris_types::quoted (or '{x}'), never Debug",
        bad,
    );
}
