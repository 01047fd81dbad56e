//! The writer's cost per task transition (issue 17: the single writer connection bounds the
//! C1M figure). Drives `BENCH_JOBS` jobs of `BENCH_TASKS` tasks through the same store calls
//! the tick and the observation writer make, in their batch shape (512 operations per
//! transaction, each job rolled up once per transaction), on a WAL file DB as the controller
//! opens it: assign every task, report it RUNNING, report it SUCCEEDED. Prints microseconds per
//! operation per phase. Wall time is noisy on shared machines; for a repeatable figure run it
//! under `valgrind --tool=callgrind` and compare instruction counts.
//!
//! `cargo bench -p iris-store --bench transitions`; under `cargo test` (no `--bench` argument) it
//! runs a few small jobs as a smoke test. Either way every job must end SUCCEEDED.

use iris_store::apply::{
    apply_observation_deferred, assign_deferred, insert_job, Holder, JobRollups, NewJob,
    Observation,
};
use iris_store::{jobs as store_jobs, workers, Db, Tx};
use iris_types::{JobState, TaskState};
use std::time::Instant;

const BATCH: usize = 512;
const T0: i64 = 1_700_000_000_000;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let full = std::env::args().any(|a| a == "--bench");
    let jobs = env("BENCH_JOBS", if full { 200 } else { 4 });
    let per_job = env("BENCH_TASKS", if full { 100 } else { 10 });
    let n_workers = env("BENCH_WORKERS", if full { 500 } else { 8 });
    let dir = tempfile::tempdir()?;
    let mut db = Db::open(&dir.path().join("controller.sqlite3"))?;
    let mut now = T0;
    let t = Instant::now();
    {
        let tx = db.begin()?;
        for w in 0..n_workers {
            let r = workers::Registration {
                worker_id: format!("w{w}"),
                address: format!("127.0.0.1:{}", 10_000 + w),
                ..Default::default()
            };
            workers::upsert(&tx, &r, now)?;
        }
        tx.commit()?;
    }
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(64) {
        let tx = db.begin()?;
        for j in chunk {
            let id = format!("/bench/j{j}");
            let job = NewJob {
                job_id: id.clone(),
                user_id: "bench".into(),
                submitting_user: "bench".into(),
                root_job_id: id,
                depth: 1,
                num_tasks: per_job as u32,
                ..Default::default()
            };
            insert_job(&tx, &job, now)?;
        }
        tx.commit()?;
    }
    let tasks = jobs * per_job;
    report("submit (per task)", t.elapsed().as_secs_f64(), tasks);

    let ids: Vec<(String, String, String)> = (0..tasks)
        .map(|i| {
            let (j, k) = (i / per_job, i % per_job);
            (
                format!("/bench/j{j}/{k}"),
                format!("w{}", i % n_workers),
                format!("uid-{i}"),
            )
        })
        .collect();
    // Interleave jobs as the tick does (a few tasks of every job per cycle).
    let mut order: Vec<usize> = (0..tasks).collect();
    order.sort_by_key(|i| (i % per_job, i / per_job));

    now += 1000;
    let t = Instant::now();
    in_batches(&mut db, &order, now, |tx, i, rollups| {
        let (task, worker, uid) = &ids[i];
        let holder = Holder::Worker {
            id: worker,
            address: "127.0.0.1:1",
        };
        assign_deferred(tx, task, holder, uid, 2, now, rollups).map(|_| ())
    })?;
    report("assign", t.elapsed().as_secs_f64(), tasks);

    for (phase, state, code) in [
        ("report RUNNING", TaskState::Running, None),
        ("report SUCCEEDED", TaskState::Succeeded, Some(0)),
    ] {
        now += 1000;
        let t = Instant::now();
        in_batches(&mut db, &order, now, |tx, i, rollups| {
            let (_, worker, uid) = &ids[i];
            let obs = Observation {
                attempt_uid: uid.clone(),
                state,
                exit_code: code,
                error: String::new(),
                status_message: String::new(),
                container_id: String::new(),
            };
            apply_observation_deferred(tx, worker, &obs, now, rollups).map(|_| ())
        })?;
        report(phase, t.elapsed().as_secs_f64(), tasks);
    }
    let read = db.begin_read()?;
    for j in 0..jobs {
        let id = format!("/bench/j{j}");
        let state = store_jobs::job_state_of(&read, &id)?;
        if state != Some(JobState::Succeeded) {
            let got = state.map_or_else(|| "missing".to_string(), |s| s.to_string());
            return Err(format!("{id} ended {got}, not succeeded").into());
        }
    }
    Ok(())
}

/// Runs `op` on every task of `order`, [`BATCH`] to a transaction, each transaction's jobs rolled
/// up once before it commits (the tick's and the observation writer's shape).
fn in_batches(
    db: &mut Db,
    order: &[usize],
    now: i64,
    mut op: impl FnMut(&Tx<'_>, usize, &mut JobRollups) -> iris_store::Result<()>,
) -> iris_store::Result<()> {
    for chunk in order.chunks(BATCH) {
        let tx = db.begin()?;
        let mut rollups = JobRollups::default();
        for &i in chunk {
            op(&tx, i, &mut rollups)?;
        }
        rollups.finish(&tx, now)?;
        tx.commit()?;
    }
    Ok(())
}

fn report(phase: &str, secs: f64, n: usize) {
    println!(
        "{phase:<20} {:>8.1} µs per task ({n} tasks in {secs:.2} s)",
        secs * 1e6 / n as f64
    );
}
