//! Simulated workers (`iris worker simulate`): one process hosts a fleet that speaks the real
//! Register / Reconcile protocol, so a controller can be driven at scale without processes.
//! These tests check the fleet's behaviour end to end, not its speed (that is `iris bench c1m`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{wait_until, TestCluster};
use iris_proto::job::TaskState;

/// 50 workers in pools of 10, 8 H100s each; attempts run 100–400 ms and 10% fail, 5% crash.
fn fleet() -> TestCluster {
    let mut c = TestCluster::start(&[]);
    c.add_simulated_fleet(
        "sim",
        50,
        &[
            "--pool-size",
            "10",
            "--device",
            "gpu:h100:8",
            "--duration",
            "100ms..400ms",
            "--fail-percent",
            "10",
            "--crash-percent",
            "5",
        ],
    );
    c
}

#[test]
fn a_simulated_fleet_runs_jobs_to_an_end_with_the_configured_outcome_mix() {
    let c = fleet();
    assert_eq!(
        c.healthy_workers()
            .iter()
            .filter(|w| w.starts_with("sim-"))
            .count(),
        50
    );
    for j in 0..4 {
        c.submit(
            &format!("bulk{j}"),
            &["--replicas", "100", "--cpu", "1", "--max-retries", "100000"],
            &["true"],
        );
    }
    wait_until(Duration::from_secs(120), "every bulk job to finish", || {
        c.unfinished_jobs("/u/bulk") == 0
    });
    for j in 0..4 {
        assert_eq!(
            c.job_state(&format!("/u/bulk{j}")).as_deref(),
            Some("succeeded"),
            "with a retry budget every task ends up succeeding"
        );
    }
    let attempts = c.attempts_under("/u/bulk");
    let mut by_state: BTreeMap<TaskState, usize> = BTreeMap::new();
    let mut tasks = BTreeSet::new();
    for a in &attempts {
        *by_state.entry(a.state()).or_default() += 1;
        tasks.insert(a.task_id.clone());
        assert!(a.worker_id.starts_with("sim-"), "{}", a.worker_id);
    }
    assert_eq!(tasks.len(), 400, "every task had at least one attempt");
    let succeeded = by_state.get(&TaskState::Succeeded).copied().unwrap_or(0);
    let failed = by_state.get(&TaskState::Failed).copied().unwrap_or(0);
    assert_eq!(succeeded, 400, "exactly one successful attempt per task");
    assert_eq!(
        succeeded + failed,
        attempts.len(),
        "every attempt ended succeeded or failed: {by_state:?}"
    );
    // 15% of ~470 attempts end badly: with these odds, fewer than 20 would be a broken mix.
    assert!(failed >= 20, "too few failed attempts: {by_state:?}");
    let plain = attempts.iter().filter(|a| a.exit_code == Some(1)).count();
    let crashed = attempts
        .iter()
        .filter(|a| a.exit_code == Some(139) && a.error.contains("SIGSEGV"))
        .count();
    assert!(plain > 0, "no attempt failed with exit code 1");
    assert!(crashed > 0, "no attempt crashed with SIGSEGV");
    assert_eq!(plain + crashed, failed, "a failure is an exit 1 or a crash");
}

#[test]
fn a_gpu_gang_lands_on_distinct_workers_of_one_pool() {
    let c = fleet();
    let job = c.submit(
        "gang",
        &[
            "--replicas",
            "10",
            "--gpu",
            "H100x8",
            "--enable-extra-resources",
            "--group-by",
            "pool",
            "--max-retries",
            "100000",
        ],
        &["true"],
    );
    wait_until(Duration::from_secs(60), "the gang to finish", || {
        c.unfinished_jobs(&job) == 0
    });
    assert_eq!(c.job_state(&job).as_deref(), Some("succeeded"));
    let workers = c.healthy_workers();
    assert_eq!(workers.len(), 50);
    // Each round of the gang (its attempts created together) holds all 8 GPUs of 10 hosts:
    // so every round sits on 10 distinct workers, all of one pool.
    let attempts = c.attempts_under(&job);
    let mut rounds: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for a in &attempts {
        rounds
            .entry(a.attempt_id)
            .or_default()
            .push(a.worker_id.clone());
    }
    let first = rounds.get(&0).expect("a first round");
    assert_eq!(first.len(), 10, "every task had a first attempt");
    let distinct: BTreeSet<&String> = first.iter().collect();
    assert_eq!(distinct.len(), 10, "one task per host: {first:?}");
    let pools: BTreeSet<String> = first.iter().map(|w| pool_of(&c, w)).collect();
    assert_eq!(pools.len(), 1, "one pool: {first:?} in {pools:?}");
}

/// The `pool` attribute a worker registered with.
fn pool_of(c: &TestCluster, worker: &str) -> String {
    let r: iris_proto::cluster::controller::ListWorkersResponse =
        c.controller_rpc("list-workers", serde_json::json!({}));
    let w = r
        .workers
        .iter()
        .find(|w| w.worker_id.as_deref() == Some(worker))
        .unwrap_or_else(|| panic!("worker {worker} is listed"));
    let md = w.metadata.as_ref().expect("worker metadata");
    match md.attributes.get("pool").and_then(|v| v.value.as_ref()) {
        Some(iris_proto::job::attribute_value::Value::StringValue(s)) => s.clone(),
        other => panic!("worker {worker}: pool attribute is not a string: {other:?}"),
    }
}
