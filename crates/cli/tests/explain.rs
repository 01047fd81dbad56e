//! `iris task explain`: every worker's first failing placement rule for a pending task, through
//! the real CLI against a real controller with two CPU workers (4 cpu, 16 GB, `pool=a` each).
//! The scale groups below make each job feasible at submit time, so it waits rather than being
//! refused; none of them can be placed on the two workers, so nothing depends on timing.

mod common;

use common::*;
use serde_json::Value;

/// Declares workers that could exist (a third `pool=a` host with more memory, H100 hosts), so
/// every job below passes the submit-time feasibility check.
const CONFIG: &str = r#"
scale_groups:
  pool-a:
    num_vms: 1
    max_slices: 3
    resources: {cpu: 4, ram: 32GB, disk: 100GB, device_type: cpu}
    attributes: {pool: a}
  h100:
    num_vms: 1
    resources: {cpu: 16, ram: 64GB, disk: 100GB, device_type: gpu, device_variant: H100, device_count: 8}
"#;

/// `iris task explain TASK --json`, decoded.
#[track_caller]
fn explain(c: &TestCluster, task: &str, extra: &[&str]) -> Value {
    let mut args = vec!["task", "explain", task, "--json"];
    args.extend_from_slice(extra);
    let o = c.iris(&args);
    serde_json::from_str(o.ok()).unwrap_or_else(|e| panic!("explain JSON: {e}\n{}", o.stdout))
}

/// The verdicts as (worker, rule, detail).
fn verdicts(v: &Value) -> Vec<(String, String, String)> {
    let s = |x: &Value| x.as_str().unwrap_or_default().to_string();
    v["workers"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .map(|w| (s(&w["workerId"]), s(&w["rule"]), s(&w["detail"])))
                .collect()
        })
        .unwrap_or_default()
}

/// An int64 of proto-JSON (a string) or a number.
fn int(v: &Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
        .unwrap_or(-1)
}

#[test]
fn explain_names_the_first_failing_rule_per_worker() {
    let pool_a = || WorkerSpec::cpu(4).attr("pool", "a");
    let mut c = TestCluster::start_with_args(
        &[pool_a(), pool_a()],
        Some(CONFIG),
        &["--dashboard-bind", "127.0.0.1:0"],
    );
    let mut workers = c.healthy_workers();
    workers.sort();
    assert_eq!(workers.len(), 2, "{workers:?}");

    let gpu = c.submit(
        "gpu",
        &["--enable-extra-resources", "--gpu", "H100x1", "--cpu", "1"],
        &["true"],
    );
    let mem = c.submit(
        "mem",
        &["--enable-extra-resources", "--memory", "20GB", "--cpu", "1"],
        &["true"],
    );
    let gang = c.submit(
        "gang",
        &["--replicas", "3", "--group-by", "pool", "--cpu", "1"],
        &["true"],
    );

    // (1) A GPU variant no worker has: a device constraint fails on each worker.
    let v = explain(&c, &format!("{gpu}/0"), &[]);
    assert_eq!(v["pending"], true, "{v}");
    let got = verdicts(&v);
    assert_eq!(
        got.iter().map(|g| g.0.clone()).collect::<Vec<_>>(),
        workers,
        "{v}"
    );
    for (w, rule, detail) in &got {
        assert_eq!(rule, "constraint", "{w}: {detail}");
        assert!(
            detail.starts_with("device: requires device-"),
            "{w}: {detail}"
        );
    }
    assert!(
        v["workers"][0]["constraint"]
            .as_str()
            .is_some_and(|c| c.starts_with("device-")),
        "{v}"
    );

    // (2) One short of memory: 20 GiB asked, 16 GiB free on each.
    let v = explain(&c, &format!("{mem}/0"), &[]);
    for (i, (w, rule, detail)) in verdicts(&v).iter().enumerate() {
        assert_eq!(rule, "resources", "{w}: {detail}");
        assert!(detail.starts_with("memory short by 4 GiB"), "{w}: {detail}");
        let short = &v["workers"][i]["short"][0];
        assert_eq!(short["resource"], "memory", "{v}");
        assert_eq!(
            int(&short["requested"]) - int(&short["free"]),
            4 << 30,
            "{v}"
        );
        assert_eq!(
            v["workers"][i]["short"].as_array().map(Vec::len),
            Some(1),
            "{v}"
        );
    }

    // (3) A gang larger than its pool: 3 members, 2 `pool=a` hosts.
    let v = explain(&c, &format!("{gang}/1"), &[]);
    assert_eq!(v["gangSize"], 3, "{v}");
    assert_eq!(v["groupBy"], "pool", "{v}");
    for (w, rule, detail) in verdicts(&v) {
        assert_eq!(rule, "group-size", "{w}: {detail}");
        assert!(
            detail.contains("group pool=a has 2 worker(s) with room, the gang needs 3"),
            "{w}: {detail}"
        );
    }

    // `--worker` narrows to one worker; an unknown one is refused by name.
    let v = explain(&c, &format!("{mem}/0"), &["--worker", &workers[1]]);
    let got = verdicts(&v);
    assert_eq!(got.len(), 1, "{v}");
    assert_eq!(got[0].0, workers[1]);
    let o = c.iris(&["task", "explain", &format!("{mem}/0"), "--worker", "nope"]);
    assert_ne!(o.code, 0);
    assert!(
        o.stderr.contains("worker_id: no worker nope"),
        "{}",
        o.stderr
    );

    // The human table: worker, verdict, detail.
    let o = c.iris(&["task", "explain", &format!("{mem}/0")]);
    let out = o.ok();
    assert!(
        out.contains("WORKER") && out.contains("VERDICT") && out.contains("DETAIL"),
        "{out}"
    );
    assert!(
        out.contains(&format!("task {mem}/0: pending, band interactive")),
        "{out}"
    );
    for w in &workers {
        assert!(
            out.lines()
                .any(|l| l.starts_with(w.as_str()) && l.contains("resources")),
            "{out}"
        );
    }

    // The dashboard's task page shows the same verdicts for a pending task.
    let (code, _, page) = http_get(&c.dashboard_url(), &format!("/task{gang}/1"), None);
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("Why it waits"), "{page}");
    assert!(
        page.contains("group-size") && page.contains("the gang needs 3"),
        "{page}"
    );

    // The fitting case: a third `pool=a` host is exactly what the gang's verdict said was
    // missing; with it, the gang is placed and runs to the end.
    c.add_worker(&pool_a());
    c.wait_job(&gang, "succeeded");

    // A task that is not pending says so, with its state, and lists no verdicts.
    let v = explain(&c, &format!("{gang}/0"), &[]);
    assert_ne!(v["pending"], true, "{v}");
    assert!(verdicts(&v).is_empty(), "{v}");
    let o = c.iris(&["task", "explain", &format!("{gang}/0")]);
    assert!(o.ok().contains("is succeeded, not pending"), "{}", o.stdout);
}
