//! The controller schema (reference §3) as forward-only migrations, applied in order and recorded
//! by name in `schema_migrations`.

/// `(name, sql)` in application order. Never edit a released entry: add a new one.
pub const MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_baseline",
        r#"
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    submitting_user TEXT NOT NULL DEFAULT '',
    parent_job_id TEXT REFERENCES jobs(job_id) ON DELETE CASCADE,
    root_job_id TEXT NOT NULL,
    depth INTEGER NOT NULL,
    state INTEGER NOT NULL,
    submitted_at_ms INTEGER NOT NULL,
    root_submitted_at_ms INTEGER NOT NULL,
    started_at_ms INTEGER,
    finished_at_ms INTEGER,
    scheduling_deadline_epoch_ms INTEGER,
    error TEXT,
    exit_code INTEGER,
    num_tasks INTEGER NOT NULL,
    name TEXT NOT NULL,
    backend_id TEXT,
    cluster TEXT NOT NULL DEFAULT 'local'
);
CREATE INDEX idx_jobs_state ON jobs(state);
CREATE INDEX idx_jobs_parent ON jobs(parent_job_id);
CREATE INDEX idx_jobs_submitted ON jobs(submitted_at_ms);
CREATE TABLE job_config (
    job_id TEXT PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
    res_cpu_millicores INTEGER NOT NULL DEFAULT 0,
    res_memory_bytes INTEGER NOT NULL DEFAULT 0,
    res_disk_bytes INTEGER NOT NULL DEFAULT 0,
    res_device_json TEXT,
    constraints_json TEXT,
    has_coscheduling INTEGER NOT NULL DEFAULT 0,
    coscheduling_group_by TEXT,
    scheduling_timeout_ms INTEGER,
    max_task_failures INTEGER NOT NULL DEFAULT 0,
    entrypoint_json TEXT,
    environment_json TEXT,
    bundle_id TEXT,
    ports_json TEXT,
    max_retries_failure INTEGER NOT NULL DEFAULT 0,
    max_retries_preemption INTEGER NOT NULL DEFAULT 100,
    timeout_ms INTEGER,
    preemption_policy INTEGER NOT NULL DEFAULT 0,
    existing_job_policy INTEGER NOT NULL DEFAULT 0,
    priority_band INTEGER NOT NULL,
    task_image TEXT,
    submit_argv_json TEXT,
    fail_if_exists INTEGER NOT NULL DEFAULT 0,
    container_profile INTEGER NOT NULL DEFAULT 0,
    egress_policy INTEGER NOT NULL DEFAULT 0,
    request_blob BLOB NOT NULL
);
CREATE TABLE job_workdir_files (
    job_id TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
    filename TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (job_id, filename)
);
CREATE TABLE workers (
    worker_id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    md_hostname TEXT,
    md_ip_address TEXT,
    md_cpu_count INTEGER,
    md_memory_bytes INTEGER,
    md_disk_bytes INTEGER,
    md_device_json TEXT,
    md_provenance_json TEXT,
    total_cpu_millicores INTEGER NOT NULL,
    total_memory_bytes INTEGER NOT NULL,
    total_gpu_count INTEGER NOT NULL DEFAULT 0,
    total_tpu_count INTEGER NOT NULL DEFAULT 0,
    device_type TEXT NOT NULL DEFAULT 'cpu',
    device_variant TEXT NOT NULL DEFAULT 'cpu',
    slice_id TEXT,
    scale_group TEXT,
    healthy INTEGER NOT NULL DEFAULT 1,
    registered_at_ms INTEGER NOT NULL,
    last_heartbeat_ms INTEGER,
    metadata_blob BLOB
);
CREATE TABLE worker_attributes (
    worker_id TEXT NOT NULL REFERENCES workers(worker_id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    value_type TEXT NOT NULL,
    str_value TEXT,
    int_value INTEGER,
    float_value REAL,
    PRIMARY KEY (worker_id, key)
);
CREATE TABLE tasks (
    task_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
    task_index INTEGER NOT NULL,
    state INTEGER NOT NULL,
    error TEXT,
    exit_code INTEGER,
    submitted_at_ms INTEGER NOT NULL,
    started_at_ms INTEGER,
    finished_at_ms INTEGER,
    max_retries_failure INTEGER NOT NULL,
    max_retries_preemption INTEGER NOT NULL,
    current_attempt_id INTEGER NOT NULL DEFAULT -1,
    priority_neg_depth INTEGER NOT NULL,
    priority_root_submitted_ms INTEGER NOT NULL,
    priority_insertion INTEGER NOT NULL,
    priority_band INTEGER NOT NULL,
    container_id TEXT,
    status_message TEXT,
    current_worker_id TEXT REFERENCES workers(worker_id) ON DELETE SET NULL,
    current_worker_address TEXT,
    backend_id TEXT,
    cluster TEXT NOT NULL DEFAULT 'local',
    UNIQUE (job_id, task_index)
);
CREATE INDEX idx_tasks_state ON tasks(state);
CREATE INDEX idx_tasks_worker ON tasks(current_worker_id);
CREATE TABLE task_attempts (
    task_id TEXT NOT NULL REFERENCES tasks(task_id) ON DELETE CASCADE,
    attempt_id INTEGER NOT NULL,
    worker_id TEXT,
    state INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    started_at_ms INTEGER,
    finished_at_ms INTEGER,
    exit_code INTEGER,
    error TEXT,
    attempt_uid TEXT NOT NULL UNIQUE,
    backend_id TEXT,
    pod_name TEXT,
    pod_uid TEXT,
    node_name TEXT,
    terminal_reason TEXT,
    PRIMARY KEY (task_id, attempt_id)
);
CREATE INDEX idx_attempts_open ON task_attempts(worker_id) WHERE finished_at_ms IS NULL;
CREATE TABLE task_attempt_outputs (
    task_id TEXT NOT NULL,
    attempt_id INTEGER NOT NULL,
    archive_json TEXT,
    PRIMARY KEY (task_id, attempt_id)
);
CREATE TABLE task_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    attempt_id INTEGER,
    attempt_uid TEXT,
    ts_ms INTEGER NOT NULL,
    type TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT NOT NULL,
    source TEXT NOT NULL
);
CREATE INDEX idx_task_events_task ON task_events(task_id, id);
CREATE TABLE endpoints (
    endpoint_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    address TEXT NOT NULL,
    job_id TEXT,
    task_id TEXT,
    metadata_json TEXT,
    registered_at_ms INTEGER NOT NULL,
    lease_deadline_ms INTEGER,
    access TEXT,
    peer_id TEXT
);
CREATE TABLE scaling_groups (
    name TEXT PRIMARY KEY,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    backoff_until_ms INTEGER,
    last_scale_up_ms INTEGER,
    last_scale_down_ms INTEGER,
    quota_exceeded_until_ms INTEGER,
    quota_reason TEXT
);
CREATE TABLE slices (
    slice_id TEXT PRIMARY KEY,
    scale_group TEXT,
    lifecycle TEXT,
    worker_ids TEXT,
    created_at_ms INTEGER,
    error_message TEXT
);
CREATE TABLE user_budgets (
    user_id TEXT PRIMARY KEY,
    budget_limit INTEGER NOT NULL DEFAULT 0,
    max_band INTEGER NOT NULL DEFAULT 2,
    updated_at_ms INTEGER NOT NULL
);
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"#,
    ),
    (
        "0002_jobs_state_submitted_index",
        "CREATE INDEX idx_jobs_state_submitted ON jobs(state, submitted_at_ms);",
    ),
    (
        "0003_federation",
        r#"
CREATE TABLE federated_jobs (
    job_id TEXT PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
    direction INTEGER NOT NULL,
    peer_id TEXT NOT NULL DEFAULT '',
    owner_principal TEXT NOT NULL DEFAULT '',
    handoff_state INTEGER NOT NULL DEFAULT 3,
    cancel_intent_version INTEGER NOT NULL DEFAULT 0,
    handoff_nonce TEXT NOT NULL DEFAULT '',
    backend_id TEXT NOT NULL DEFAULT '',
    generation INTEGER NOT NULL DEFAULT 0,
    promoted_at_ms INTEGER,
    handed_off_at_ms INTEGER,
    last_error TEXT
);
CREATE INDEX idx_federated_jobs_handoff ON federated_jobs(direction, handoff_state, peer_id);
CREATE TABLE federation_sync_state (
    peer_id TEXT PRIMARY KEY,
    cursor TEXT NOT NULL
);
CREATE TABLE federation_changelog (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    requester_id TEXT NOT NULL,
    task_index INTEGER,
    tombstone INTEGER NOT NULL DEFAULT 0,
    written_ms INTEGER NOT NULL
);
CREATE INDEX idx_federation_changelog_requester ON federation_changelog(requester_id, seq);
CREATE TRIGGER federation_log_job_insert AFTER INSERT ON jobs
WHEN NEW.depth > 1 AND EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone, written_ms)
    SELECT NEW.job_id, f.peer_id, NULL, 0, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1;
END;
CREATE TRIGGER federation_log_job_update AFTER UPDATE ON jobs
WHEN EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone, written_ms)
    SELECT NEW.job_id, f.peer_id, NULL, 0, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1;
END;
CREATE TRIGGER federation_log_job_delete BEFORE DELETE ON jobs
WHEN EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = OLD.root_job_id AND f.direction = 1)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone, written_ms)
    SELECT OLD.job_id, f.peer_id, NULL, 1, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM federated_jobs f WHERE f.job_id = OLD.root_job_id AND f.direction = 1;
END;
CREATE TRIGGER federation_log_task_update AFTER UPDATE ON tasks
WHEN EXISTS (SELECT 1 FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE j.job_id = NEW.job_id)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone, written_ms)
    SELECT NEW.job_id, f.peer_id, NEW.task_index, 0, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE j.job_id = NEW.job_id;
END;
CREATE TRIGGER federation_log_attempt_change AFTER UPDATE ON task_attempts
WHEN EXISTS (SELECT 1 FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE t.task_id = NEW.task_id)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone, written_ms)
    SELECT t.job_id, f.peer_id, t.task_index, 0, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE t.task_id = NEW.task_id;
END;
"#,
    ),
    (
        "0004_federated_child_cancels",
        r#"
-- A cancel of a child of a handed-off root, re-driven by the sync loop until the peer confirms
-- (the mirror shows the child ended, or the peer does not know it).
CREATE TABLE federated_child_cancels (
    job_id TEXT PRIMARY KEY,
    peer_id TEXT NOT NULL,
    requested_at_ms INTEGER NOT NULL
);
"#,
    ),
    (
        "0005_job_secrets",
        r#"
-- A job's secrets (`EnvironmentConfig.secrets`), kept out of `job_config`'s request and env
-- columns; the operator's read-only SQL may not read this table.
CREATE TABLE job_secrets (
    job_id TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (job_id, name)
) WITHOUT ROWID;
"#,
    ),
    (
        "0006_endpoint_indexes",
        r#"
-- The endpoint registry is read by name on every proxied request, by task when an attempt ends,
-- and by peer when a federation sync replaces a peer's mirrored set.
CREATE INDEX idx_endpoints_name ON endpoints(name);
CREATE INDEX idx_endpoints_task ON endpoints(task_id);
CREATE INDEX idx_endpoints_job ON endpoints(job_id);
CREATE INDEX idx_endpoints_peer ON endpoints(peer_id);
"#,
    ),
    (
        "0007_attempts_by_worker",
        r#"
-- A worker's task history (`GetWorkerStatus.recent_attempts`): its newest attempts first.
CREATE INDEX idx_attempts_worker_recent
    ON task_attempts(worker_id, COALESCE(started_at_ms, created_at_ms));
"#,
    ),
    (
        "0008_backends_without_worker_rows",
        r#"
-- An in-process backend (Kubernetes) places work without worker rows (seed 000: no synthetic
-- worker on that path): its attempts have no worker and name the backend in `backend_id`.
-- Earlier versions registered each backend as a pseudo worker at an `inproc://` address; those
-- rows go, and their attempts move to the backend they stood for.
UPDATE task_attempts SET backend_id = worker_id, worker_id = NULL
 WHERE worker_id IN (SELECT worker_id FROM workers WHERE address LIKE 'inproc://%');
UPDATE tasks SET current_worker_id = NULL, current_worker_address = NULL
 WHERE current_worker_address LIKE 'inproc://%';
DELETE FROM workers WHERE address LIKE 'inproc://%';
CREATE INDEX IF NOT EXISTS idx_attempts_open_backend ON task_attempts(backend_id)
    WHERE finished_at_ms IS NULL AND worker_id IS NULL;
"#,
    ),
    (
        "0009_lighter_task_writes",
        r#"
-- A job's FAILED attempts over all its tasks (the `max_task_failures` budget's count), kept on
-- the job row by triggers so that no write path can let it drift; the job rollup read it by
-- counting the job's attempts on every task transition. 5 is TASK_STATE_FAILED.
ALTER TABLE jobs ADD COLUMN failed_attempts INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET failed_attempts = (
    SELECT count(*) FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
     WHERE t.job_id = jobs.job_id AND a.state = 5);
CREATE TRIGGER job_failed_attempts_insert AFTER INSERT ON task_attempts
WHEN NEW.state = 5
BEGIN
    UPDATE jobs SET failed_attempts = failed_attempts + 1
     WHERE job_id = (SELECT job_id FROM tasks WHERE task_id = NEW.task_id);
END;
CREATE TRIGGER job_failed_attempts_update AFTER UPDATE OF state ON task_attempts
WHEN (NEW.state = 5) <> (OLD.state = 5)
BEGIN
    UPDATE jobs SET failed_attempts = failed_attempts + (CASE WHEN NEW.state = 5 THEN 1 ELSE -1 END)
     WHERE job_id = (SELECT job_id FROM tasks WHERE task_id = NEW.task_id);
END;
CREATE TRIGGER job_failed_attempts_delete AFTER DELETE ON task_attempts
WHEN OLD.state = 5
BEGIN
    UPDATE jobs SET failed_attempts = failed_attempts - 1
     WHERE job_id = (SELECT job_id FROM tasks WHERE task_id = OLD.task_id);
END;

-- The federation change-log triggers (0003) asked, on every write to a job, task or attempt,
-- whether its root was handed to this cluster by a hub: two or three index lookups per write,
-- a tenth of the writer's instructions per task transition (BENCHMARKS, C1M). Each now first
-- asks whether any job was handed here at all (one lookup in an index that is empty on a
-- cluster no hub uses), and only then which.
DROP TRIGGER federation_log_job_insert;
DROP TRIGGER federation_log_job_update;
DROP TRIGGER federation_log_job_delete;
DROP TRIGGER federation_log_task_update;
DROP TRIGGER federation_log_attempt_change;
CREATE TRIGGER federation_log_job_insert AFTER INSERT ON jobs
WHEN NEW.depth > 1 AND EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone, written_ms)
    SELECT NEW.job_id, f.peer_id, NULL, 0, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1;
END;
CREATE TRIGGER federation_log_job_update AFTER UPDATE ON jobs
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone, written_ms)
    SELECT NEW.job_id, f.peer_id, NULL, 0, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1;
END;
CREATE TRIGGER federation_log_job_delete BEFORE DELETE ON jobs
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = OLD.root_job_id AND f.direction = 1)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone, written_ms)
    SELECT OLD.job_id, f.peer_id, NULL, 1, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM federated_jobs f WHERE f.job_id = OLD.root_job_id AND f.direction = 1;
END;
CREATE TRIGGER federation_log_task_update AFTER UPDATE ON tasks
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE j.job_id = NEW.job_id)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone, written_ms)
    SELECT NEW.job_id, f.peer_id, NEW.task_index, 0, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE j.job_id = NEW.job_id;
END;
CREATE TRIGGER federation_log_attempt_change AFTER UPDATE ON task_attempts
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE t.task_id = NEW.task_id)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone, written_ms)
    SELECT t.job_id, f.peer_id, t.task_index, 0, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE t.task_id = NEW.task_id;
END;
"#,
    ),
    (
        "0010_lighter_submits",
        r#"
-- Any trigger on a table makes SQLite run each insert into it as a program that may write
-- several rows, under a statement journal: every page the insert touches is copied first (with
-- the savepoint each submission had, 15% of the admission thread). Inserting a job now logs a
-- received job's child itself (`federation::log_received_child`, called by the two inserts).
DROP TRIGGER federation_log_job_insert;
-- (state, submitted_at_ms) serves every lookup by state; the index on state alone was one more
-- B-tree written on every job insert and state change.
DROP INDEX idx_jobs_state;
-- A task without a worker (every task at submit) has nothing to find by worker.
DROP INDEX idx_tasks_worker;
CREATE INDEX idx_tasks_worker ON tasks(current_worker_id) WHERE current_worker_id IS NOT NULL;
"#,
    ),
    (
        "0011_no_statement_journal_for_task_writes",
        r#"
-- SQLite runs a write under a statement journal (each page it touches copied first, and the copy
-- released at its end) when the write may fire a trigger and may also stop halfway. Any call of
-- a function in the statement or in one of its triggers counts as "may stop halfway", and the
-- change-log triggers called `unixepoch()` for `written_ms`, a column nothing ever read: so every
-- update of a job, task or attempt paid for the journal even on a cluster no hub uses (a tenth
-- of the writer's instructions per task transition; BENCHMARKS.md, C1M). The column goes, and the
-- triggers are the same without it.
-- An insert that may fire a trigger and checks a foreign key is journalled too: every attempt the
-- tick creates was, for the failed-attempt count's insert trigger, which only an attempt inserted
-- FAILED moves. None is now: the tick inserts ASSIGNED, and the federation mirror inserts
-- UNSPECIFIED and then updates to the peer's state, which the update trigger counts.
DROP TRIGGER job_failed_attempts_insert;
DROP TRIGGER federation_log_job_update;
DROP TRIGGER federation_log_job_delete;
DROP TRIGGER federation_log_task_update;
DROP TRIGGER federation_log_attempt_change;
ALTER TABLE federation_changelog DROP COLUMN written_ms;
CREATE TRIGGER federation_log_job_update AFTER UPDATE ON jobs
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone)
    SELECT NEW.job_id, f.peer_id, NULL, 0
    FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1;
END;
CREATE TRIGGER federation_log_job_delete BEFORE DELETE ON jobs
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = OLD.root_job_id AND f.direction = 1)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone)
    SELECT OLD.job_id, f.peer_id, NULL, 1
    FROM federated_jobs f WHERE f.job_id = OLD.root_job_id AND f.direction = 1;
END;
CREATE TRIGGER federation_log_task_update AFTER UPDATE ON tasks
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE j.job_id = NEW.job_id)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone)
    SELECT NEW.job_id, f.peer_id, NEW.task_index, 0
    FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE j.job_id = NEW.job_id;
END;
CREATE TRIGGER federation_log_attempt_change AFTER UPDATE ON task_attempts
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE t.task_id = NEW.task_id)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone)
    SELECT t.job_id, f.peer_id, t.task_index, 0
    FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE t.task_id = NEW.task_id;
END;
"#,
    ),
    (
        "0012_desired_set_from_indexes",
        r#"
-- Every reconcile of every worker reads its open attempts and whether their tasks still want
-- them (`workers::open_attempts`). Both answers now come from small partial indexes alone: a
-- worker's open attempts lie together in one, keyed by worker with the columns the read needs
-- (finished_at_ms too, always NULL here, so that SQLite knows the index covers the read), and
-- only active tasks (ASSIGNED 9, BUILDING 2, RUNNING 3) are in the other. Before, each attempt
-- cost a read of its attempt's and its task's table pages, scattered over the whole DB.
-- The condition is not `state IN (2, 3, 9)`: SQLite evaluates a list of three or more constants
-- through a temporary table it builds on every run of a statement, and every update of a task's
-- state evaluates it.
DROP INDEX idx_attempts_open;
CREATE INDEX idx_attempts_open
    ON task_attempts(worker_id, created_at_ms, attempt_uid, task_id, attempt_id, state, finished_at_ms)
    WHERE finished_at_ms IS NULL;
CREATE INDEX idx_tasks_active ON tasks(task_id, state, current_attempt_id)
    WHERE state IN (2, 3) OR state = 9;
"#,
    ),
    (
        "0013_worker_history_by_creation",
        r#"
-- A worker's task history (`GetWorkerStatus.recent_attempts`, newest first) is ordered by when
-- each attempt was created, not by its start else its creation (0007): that key moved the
-- attempt's entry when it started, an index delete and insert in every RUNNING report.
DROP INDEX idx_attempts_worker_recent;
CREATE INDEX idx_attempts_worker_recent ON task_attempts(worker_id, created_at_ms);
"#,
    ),
    (
        "0014_task_event_chains",
        r#"
-- A task's events are found from its row: `tasks.last_event_id` names its newest event and each
-- event's `prev_id` the one before (`events::insert_event`). The index of events by task id was
-- an insert at a scattered place for every event, and most of the pages a transition's commit
-- wrote to the WAL (without it, C1M ran 11% faster; BENCHMARKS.md).
ALTER TABLE tasks ADD COLUMN last_event_id INTEGER;
ALTER TABLE task_events ADD COLUMN prev_id INTEGER;
UPDATE task_events SET prev_id = (
    SELECT max(p.id) FROM task_events p WHERE p.task_id = task_events.task_id AND p.id < task_events.id);
UPDATE tasks SET last_event_id = (SELECT max(e.id) FROM task_events e WHERE e.task_id = tasks.task_id);
-- Events of tasks that no longer exist could be found by task id alone; nothing leads to them now.
DELETE FROM task_events WHERE task_id NOT IN (SELECT task_id FROM tasks);
DROP INDEX idx_task_events_task;
"#,
    ),
    (
        "0015_change_log_triggers_only_on_a_peer",
        r#"
-- The federation change log's triggers exist only on a cluster that received a job from a hub
-- (`federation::ensure_change_log`, called when a received job's handle is inserted and when a
-- DB that has one is opened). On every other cluster each update of a job, task or attempt ran
-- a trigger program only to find no received job: a frame allocated and zeroed and a lookup of
-- `federated_jobs`, ~11% of the writer's instructions per task (BENCHMARKS.md, C1M).
DROP TRIGGER federation_log_job_update;
DROP TRIGGER federation_log_job_delete;
DROP TRIGGER federation_log_task_update;
DROP TRIGGER federation_log_attempt_change;
"#,
    ),
];

/// The federation change log's triggers, as migration 0011 left them: on a cluster that received
/// jobs from a hub, every change to a received tree's job, task or attempt rows is logged for the
/// hub's `FederationSync` (`federation::ensure_change_log` creates them).
pub(crate) const CHANGE_LOG_TRIGGERS: &str = r#"
CREATE TRIGGER IF NOT EXISTS federation_log_job_update AFTER UPDATE ON jobs
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone)
    SELECT NEW.job_id, f.peer_id, NULL, 0
    FROM federated_jobs f WHERE f.job_id = NEW.root_job_id AND f.direction = 1;
END;
CREATE TRIGGER IF NOT EXISTS federation_log_job_delete BEFORE DELETE ON jobs
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM federated_jobs f WHERE f.job_id = OLD.root_job_id AND f.direction = 1)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone)
    SELECT OLD.job_id, f.peer_id, NULL, 1
    FROM federated_jobs f WHERE f.job_id = OLD.root_job_id AND f.direction = 1;
END;
CREATE TRIGGER IF NOT EXISTS federation_log_task_update AFTER UPDATE ON tasks
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE j.job_id = NEW.job_id)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone)
    SELECT NEW.job_id, f.peer_id, NEW.task_index, 0
    FROM jobs j JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE j.job_id = NEW.job_id;
END;
CREATE TRIGGER IF NOT EXISTS federation_log_attempt_change AFTER UPDATE ON task_attempts
WHEN EXISTS (SELECT 1 FROM federated_jobs WHERE direction = 1)
 AND EXISTS (SELECT 1 FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE t.task_id = NEW.task_id)
BEGIN
    INSERT INTO federation_changelog(job_id, requester_id, task_index, tombstone)
    SELECT t.job_id, f.peer_id, t.task_index, 0
    FROM tasks t JOIN jobs j ON j.job_id = t.job_id JOIN federated_jobs f ON f.job_id = j.root_job_id AND f.direction = 1 WHERE t.task_id = NEW.task_id;
END;
"#;

#[cfg(test)]
mod tests {
    /// `CHANGE_LOG_TRIGGERS` creates the change log's triggers exactly as migration 0011 defined
    /// them (0015 dropped them to create them only where needed): the two texts cannot drift.
    #[test]
    fn the_change_log_triggers_are_migration_0011s() {
        let (_, m0011) = super::MIGRATIONS
            .iter()
            .find(|(name, _)| name.starts_with("0011_"))
            .expect("migration 0011");
        let statements = |sql: &str| -> Vec<String> {
            sql.split("CREATE TRIGGER ")
                .skip(1)
                .map(|s| {
                    let body = &s[..s.find("END;").expect("END;") + 4];
                    body.trim_start_matches("IF NOT EXISTS ").to_string()
                })
                .collect()
        };
        let created = statements(super::CHANGE_LOG_TRIGGERS);
        assert_eq!(created.len(), 4);
        assert_eq!(created, statements(m0011));
    }
}
