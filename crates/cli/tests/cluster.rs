//! Integration tests: the real `iris` binary as controller, workers and CLI on 127.0.0.1.
//!
//! One test per behaviour of reference §11 (1–10, 13–15) plus the core acceptance points
//! (preemption, gangs, bad input). Each test owns its cluster; tasks that must stay running
//! block on a trigger file the test creates, so nothing depends on timing.

mod common;

use common::*;
use serde_json::{json, Value};

/// A task script that blocks until `$GO` exists, then runs `then`.
fn wait_go(then: &str) -> String {
    format!("while [ ! -e \"$GO\" ]; do sleep 0.05; done; {then}")
}

fn touch(p: &std::path::Path) {
    std::fs::write(p, "go").expect("write the trigger file");
}

/// An attempt uid as the tick mints it: 20 lower-case hex digits.
fn is_attempt_uid(s: &str) -> bool {
    s.len() == 20
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

fn i(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

// ---------------------------------------------------------------------------------------------
// §11.1

#[test]
fn b01_run_no_wait_prints_only_the_job_id() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let o = c.iris(&[
        "job",
        "run",
        "--no-wait",
        "--job-name",
        "hello",
        "--user",
        "u",
        "--",
        "echo",
        "hi",
    ]);
    assert_eq!(o.ok(), "/u/hello\n", "stdout must be exactly the job id");

    // What the LaunchJob carried, as stored.
    let r = c.job_request("/u/hello");
    assert_eq!(r.replicas, Some(1));
    let res = r.resources.clone().expect("resources");
    assert_eq!(res.cpu_millicores, 100);
    assert_eq!(res.memory_bytes, 1_073_741_824i64);
    assert_eq!(res.disk_bytes, 5_368_709_120i64);
    let constraints = serde_json::to_value(&r.constraints).expect("constraints JSON");
    let pre: Vec<&Value> = constraints
        .as_array()
        .expect("array")
        .iter()
        .filter(|c| c["key"] == "preemptible")
        .collect();
    assert_eq!(pre.len(), 1, "{constraints}");
    assert_eq!(pre[0]["value"]["stringValue"], "false");
    assert!(
        pre[0]
            .get("op")
            .is_none_or(|o| o == 0 || o == "CONSTRAINT_OP_EQ"),
        "EQ: {constraints}"
    );
    assert!(
        pre[0]
            .get("mode")
            .is_none_or(|m| m == 0 || m == "CONSTRAINT_MODE_REQUIRED"),
        "hard: {constraints}"
    );
    assert!(
        r.bundle_id.clone().unwrap_or_default().len() == 64,
        "bundle stored: {r:?}"
    );

    let s = c.wait_job("/u/hello", "succeeded");
    assert_eq!(s["tasks"][0]["task_id"], "/u/hello/0");
}

// ---------------------------------------------------------------------------------------------
// §11.2

#[test]
fn b02_successful_task_succeeds_the_job() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let o = c.iris(&[
        "job",
        "run",
        "--user",
        "u",
        "--job-name",
        "ok",
        "--",
        "sh",
        "-c",
        "echo to-stdout; echo to-stderr >&2",
    ]);
    o.ok();
    // `job run` streams the task's stdout and stderr while it waits, then reports the end.
    assert!(o.stderr.contains("to-stdout"), "{}", o.stderr);
    assert!(o.stderr.contains("to-stderr"), "{}", o.stderr);
    assert!(o.stderr.contains("Job /u/ok succeeded"), "{}", o.stderr);

    let w = c.iris(&["job", "wait", "/u/ok"]);
    assert_eq!(w.ok(), "succeeded\n");

    let s = c.summary("/u/ok");
    assert_eq!(s["state"], "succeeded");
    assert_eq!(s["error"], "");
    assert_eq!(s["task_state_counts"], json!({"succeeded": 1}));
    assert_eq!(s["tasks"][0]["state"], "succeeded");
    assert_eq!(s["tasks"][0]["exit_code"], 0);
    assert_eq!(c.job_status("/u/ok")["completed_count"], 1);
    let d = c.iris(&["job", "describe", "/u/ok"]);
    let lines: Vec<&str> = d.ok().lines().collect();
    assert_eq!(lines[0], "Job: /u/ok (/u/ok)");
    assert_eq!(lines[1], "State: succeeded");
    assert!(
        d.stdout
            .lines()
            .any(|l| l.starts_with("/u/ok/0 ") && l.contains("succeeded")),
        "{}",
        d.stdout
    );

    let a = c.attempts("/u/ok/0");
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0]["state"], 4);
    assert_eq!(a[0]["exit_code"], 0);
}

// ---------------------------------------------------------------------------------------------
// §11.3

#[test]
fn b03_non_zero_exit_fails_the_job() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let o = c.iris(&[
        "job",
        "run",
        "--user",
        "u",
        "--job-name",
        "bad",
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    assert_eq!(o.code, 1, "job run exits 1 on failure: {o:?}");
    assert!(o.stderr.contains("Job /u/bad failed"), "{}", o.stderr);

    let w = c.iris(&["job", "wait", "/u/bad"]);
    assert_eq!(w.code, 1);
    assert_eq!(w.stdout, "failed\n");

    let s = c.summary("/u/bad");
    assert_eq!(s["state"], "failed");
    let err = s["error"].as_str().expect("error");
    assert!(
        err.starts_with(
            "Cumulative failed task attempts exceeded max_task_failures: failures=1, limit=0"
        ),
        "{err}"
    );
    assert!(err.contains("Exit code: 3"), "{err}");
    assert_eq!(s["failure_count"], 1);
    assert_eq!(s["tasks"][0]["exit_code"], 3);
    let a = c.attempts("/u/bad/0");
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0]["state"], 5);
    assert_eq!(a[0]["exit_code"], 3);
}

// ---------------------------------------------------------------------------------------------
// §11.4

#[test]
fn b04_max_retries_gives_exactly_two_failed_attempts() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let o = c.iris(&[
        "job",
        "run",
        "--user",
        "u",
        "--job-name",
        "r",
        "--max-retries",
        "1",
        "--",
        "sh",
        "-c",
        "echo \"attempt $IRIS_TASK_ID\"; exit 1",
    ]);
    assert_eq!(o.code, 1, "{o:?}");

    let a = c.attempts("/u/r/0");
    assert_eq!(a.len(), 2, "exactly attempts 0 and 1: {a:?}");
    for (n, att) in a.iter().enumerate() {
        assert_eq!(att["attempt_id"], n as i64);
        assert_eq!(att["state"], 5, "attempt {n} FAILED");
        assert!(
            is_attempt_uid(att["attempt_uid"].as_str().unwrap_or("")),
            "{att}"
        );
    }
    assert_ne!(a[0]["attempt_uid"], a[1]["attempt_uid"]);

    let logs = c.iris(&["job", "logs", "/u/r"]);
    assert_eq!(
        log_lines(logs.ok()),
        vec!["attempt /u/r/0:0", "attempt /u/r/0:1"]
    );

    let s = c.summary("/u/r");
    assert_eq!(s["state"], "failed");
    assert!(
        s["error"]
            .as_str()
            .unwrap_or("")
            .contains("failures=2, limit=1"),
        "{s}"
    );
    assert_eq!(s["failure_count"], 2);
}

// ---------------------------------------------------------------------------------------------
// §11.5

#[test]
fn b05_launch_of_a_running_name_is_refused_then_replaces_once_terminal() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    c.submit("dup", &[], &["sh", "-c", "echo first; sleep 30"]);
    let s = c.wait_tasks("/u/dup", &[(0, "running")]);
    // Its log has a line numbered 1 under `/u/dup/0:0`, as the replacement's first line will be.
    wait_until(SHORT, "the first job's line", || {
        c.iris(&["job", "logs", "/u/dup"]).stdout.contains("first")
    });
    assert_eq!(s["state"], "running");
    let old = c.attempts("/u/dup/0");
    assert_eq!(old.len(), 1);
    let old_uid = old[0]["attempt_uid"].as_str().expect("uid").to_string();

    // Through the CLI: a clear error, non-zero exit.
    let o = c.iris(&[
        "job",
        "run",
        "--no-wait",
        "--user",
        "u",
        "--job-name",
        "dup",
        "--",
        "echo",
        "again",
    ]);
    let e = o.err();
    assert!(e.contains("already exists"), "{e}");
    assert!(e.contains("already_exists"), "{e}");
    assert_eq!(o.stdout, "");
    // On the wire: HTTP 409 with the Connect error JSON.
    let body = json!({"name": "/u/dup", "entrypoint": {"runCommand": {"argv": ["echo", "again"]}}, "replicas": 1});
    let (status, resp) = http_post_json(
        &c.url,
        "/iris.cluster.ControllerService/LaunchJob",
        &body.to_string(),
    );
    assert_eq!(status, 409, "{resp}");
    let resp: Value = serde_json::from_str(&resp).expect("error JSON");
    assert_eq!(resp["code"], "already_exists");

    // Nothing changed.
    assert_eq!(c.job_count(), 1);
    let still = c.attempts("/u/dup/0");
    assert_eq!(still.len(), 1);
    assert_eq!(still[0]["attempt_uid"], old_uid.as_str());
    assert_eq!(c.summary("/u/dup")["state"], "running");

    // Once terminal, the same name is accepted and the old job's attempts are gone.
    c.iris(&["job", "cancel", "/u/dup"]).ok();
    c.wait_job("/u/dup", "killed");
    assert_eq!(c.submit("dup", &[], &["echo", "second"]), "/u/dup");
    c.wait_job("/u/dup", "succeeded");
    let new = c.attempts("/u/dup/0");
    assert_eq!(new.len(), 1, "{new:?}");
    assert_ne!(new[0]["attempt_uid"], old_uid.as_str());
    assert!(
        c.attempts_under("/")
            .iter()
            .all(|a| a.attempt_uid != old_uid),
        "the first submission's attempt is gone with it"
    );
    assert_eq!(c.job_count(), 1);
    // Only the replacement's lines: the first job's went with it (and did not shadow these).
    assert_eq!(
        log_lines(c.iris(&["job", "logs", "/u/dup"]).ok()),
        vec!["second"]
    );
}

// ---------------------------------------------------------------------------------------------
// §11.6

#[test]
fn b06_cancel_kills_running_tasks_and_leaves_finished_jobs_alone() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let pidfile = c.path("pids");
    let pf = pidfile.to_str().expect("utf8 path");
    c.submit(
        "c",
        &["--replicas", "2", "-e", "PIDFILE", pf],
        &["sh", "-c", "echo $$ >> \"$PIDFILE\"; exec sleep 30"],
    );
    c.wait_tasks("/u/c", &[(0, "running"), (1, "running")]);
    let pids = wait_for(SHORT, "both tasks to record their pids", || {
        let p = read_pids(&pidfile);
        (p.len() == 2).then_some(p)
    });
    assert!(pids.iter().all(|p| alive(*p)));

    let o = c.iris(&["job", "cancel", "/u/c"]);
    assert_eq!(o.ok(), "Cancelled /u/c\n");
    let s = c.wait_job("/u/c", "killed");
    assert_eq!(s["error"], "Terminated by user");
    assert_eq!(s["task_state_counts"], json!({"killed": 2}));
    for t in s["tasks"].as_array().expect("tasks") {
        assert_eq!(t["state"], "killed");
        assert_eq!(t["error"], "Terminated by user");
    }
    let st = c.job_status("/u/c");
    assert_eq!(st["completed_count"], 2);
    assert_eq!(st["preemption_count"], 2);
    // The worker got the stop: the processes exit and the attempts are confirmed finished.
    wait_until(SHORT, "task processes to exit", || {
        pids.iter().all(|p| !alive(*p))
    });
    wait_until(SHORT, "attempts confirmed finished", || {
        c.open_attempts().iter().all(|h| h.job_id != "/u/c")
    });

    // A finished job stays as it was.
    c.submit("done", &[], &["true"]);
    c.wait_job("/u/done", "succeeded");
    c.iris(&["job", "cancel", "/u/done"]).ok();
    let s = c.summary("/u/done");
    assert_eq!(s["state"], "succeeded");
    assert_eq!(s["error"], "");

    // Unknown job.
    let o = c.iris(&["job", "cancel", "/u/nope"]);
    assert!(o.err().contains("not found"), "{}", o.stderr);
}

// ---------------------------------------------------------------------------------------------
// §11.7

#[test]
fn b07_logs_tail_and_head() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    c.submit(
        "lines",
        &[],
        &[
            "sh",
            "-c",
            "i=1; while [ $i -le 1500 ]; do echo \"line $i\"; i=$((i+1)); done",
        ],
    );
    c.wait_job("/u/lines", "succeeded");

    let o = c.iris(&["job", "logs", "/u/lines"]);
    let got = log_lines(o.ok());
    let want: Vec<String> = (501..=1500).map(|n| format!("line {n}")).collect();
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want, "the last 1000 lines, in order");
    let first = o.stdout.lines().next().expect("a line");
    assert!(
        first.contains("task=/u/lines/0 attempt=0 | line 501"),
        "{first}"
    );

    let o = c.iris(&["job", "logs", "/u/lines", "--no-tail", "--max-lines", "3"]);
    assert_eq!(log_lines(o.ok()), vec!["line 1", "line 2", "line 3"]);
}

#[test]
fn b07_job_run_streams_every_line_once_in_order() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let o = c.iris(&[
        "job",
        "run",
        "--user",
        "u",
        "--job-name",
        "stream",
        "--",
        "sh",
        "-c",
        "i=1; while [ $i -le 2500 ]; do echo \"line $i\"; i=$((i+1)); done; echo last >&2",
    ]);
    o.ok();
    // stdout and stderr are separate pipes: order holds within each stream, not across them.
    let got: Vec<&str> = o
        .stderr
        .lines()
        .filter_map(|l| l.split_once(" | ").map(|x| x.1))
        .collect();
    let stdout: Vec<&str> = got.iter().copied().filter(|l| *l != "last").collect();
    let want: Vec<String> = (1..=2500).map(|n| format!("line {n}")).collect();
    assert_eq!(
        stdout.len(),
        want.len(),
        "every line exactly once across log pages"
    );
    assert!(
        stdout.iter().zip(&want).all(|(g, w)| g == w),
        "stdout lines in order"
    );
    assert_eq!(
        got.iter().filter(|l| **l == "last").count(),
        1,
        "the stderr line once"
    );
    assert!(
        o.stderr
            .lines()
            .last()
            .is_some_and(|l| l == "Job /u/stream succeeded"),
        "{}",
        o.stderr.lines().last().unwrap_or("")
    );
}

#[test]
fn b07_ctrl_c_on_job_run_cancels_the_job() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let child = c.spawn_iris(&[
        "job",
        "run",
        "--user",
        "u",
        "--job-name",
        "intr",
        "--",
        "sh",
        "-c",
        "echo started; exec sleep 30",
    ]);
    wait_until(SHORT, "the task to run", || {
        c.job_state("/u/intr").as_deref() == Some("running")
    });
    let st = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(st.success());
    let o = child.wait_with_output().expect("wait for job run");
    assert_eq!(o.status.code(), Some(130), "{o:?}");
    let s = c.wait_job("/u/intr", "killed");
    assert_eq!(s["error"], "Terminated by user");
}

// ---------------------------------------------------------------------------------------------
// §11.8

#[test]
fn b08_job_state_precedence_for_two_task_jobs() {
    let c = TestCluster::start(&[
        WorkerSpec::cpu(16).attr("slot", "a"),
        WorkerSpec::cpu(16).attr("slot", "b"),
    ]);
    let first_exits =
        |code: i32| format!("case \"$IRIS_TASK_ID\" in */0:*) exit {code};; esac; exec sleep 30");

    // SUCCEEDED + KILLED → KILLED.
    c.submit("pk", &["--replicas", "2"], &["sh", "-c", &first_exits(0)]);
    c.wait_tasks("/u/pk", &[(0, "succeeded"), (1, "running")]);
    c.iris(&["job", "cancel", "/u/pk"]).ok();
    let s = c.wait_job("/u/pk", "killed");
    assert_eq!(s["task_state_counts"], json!({"succeeded": 1, "killed": 1}));

    // Cumulative FAILED attempts > max_task_failures → FAILED at once, the other task killed.
    c.submit("pf", &["--replicas", "2"], &["sh", "-c", &first_exits(1)]);
    let s = c.wait_job("/u/pf", "failed");
    assert!(
        s["error"].as_str().unwrap_or("").starts_with(
            "Cumulative failed task attempts exceeded max_task_failures: failures=1, limit=0"
        ),
        "{s}"
    );
    assert_eq!(s["task_state_counts"], json!({"failed": 1, "killed": 1}));

    // An operator `task fail` is a failure with no retry: same outcome.
    c.submit("pt", &["--replicas", "2"], &["sleep", "30"]);
    c.wait_tasks("/u/pt", &[(0, "running"), (1, "running")]);
    let o = c.iris(&["task", "fail", "/u/pt/0"]);
    assert!(o.ok().starts_with("Failed /u/pt/0"), "{}", o.stdout);
    let s = c.wait_job("/u/pt", "failed");
    assert_eq!(s["task_state_counts"], json!({"failed": 1, "killed": 1}));
    assert_eq!(s["failure_count"], 1);

    // SUCCEEDED + preempted with the preemption budget exhausted → WORKER_FAILED.
    // (The CLI always sends max_retries_preemption=1000, so this one goes over raw RPC.)
    let req = json!({
        "name": "/u/pw",
        "entrypoint": {"runCommand": {"argv": ["sh", "-c", first_exits(0)]}},
        "replicas": 2,
        "resources": {"cpuMillicores": 100, "memoryBytes": "1073741824"},
        "maxRetriesPreemption": 0,
    });
    c.iris(&[
        "rpc",
        "controller",
        "launch-job",
        "--json",
        &req.to_string(),
    ])
    .ok();
    c.wait_tasks("/u/pw", &[(0, "succeeded"), (1, "running")]);
    let o = c.iris(&["task", "preempt", "/u/pw/1"]);
    assert!(o.ok().starts_with("Preempted /u/pw/1"), "{}", o.stdout);
    let s = c.wait_job("/u/pw", "worker_failed");
    assert_eq!(s["tasks"][0]["state"], "succeeded");
    assert_eq!(s["tasks"][1]["state"], "preempted");
    // Cancel keeps terminal states except WORKER_FAILED, which becomes KILLED (§2.7).
    c.iris(&["job", "cancel", "/u/pw"]).ok();
    assert_eq!(c.summary("/u/pw")["state"], "killed");
    c.iris(&["job", "cancel", "/u/pf"]).ok();
    assert_eq!(c.summary("/u/pf")["state"], "failed");

    // Any UNSCHEDULABLE → UNSCHEDULABLE: two 12-core tasks pinned to one 16-core worker with a
    // 3 s scheduling timeout; the first starts at once, the second can never start in time.
    wait_until(SHORT, "earlier attempts to be confirmed finished", || {
        c.open_attempts().is_empty()
    });
    let req = json!({
        "name": "/u/pu",
        "entrypoint": {"runCommand": {"argv": ["sleep", "30"]}},
        "replicas": 2,
        "resources": {"cpuMillicores": 12000, "memoryBytes": "1073741824"},
        "constraints": [{"key": "slot", "value": {"stringValue": "a"}}],
        "schedulingTimeout": {"milliseconds": "3000"},
        "maxRetriesPreemption": 1000,
    });
    c.iris(&[
        "rpc",
        "controller",
        "launch-job",
        "--json",
        &req.to_string(),
    ])
    .ok();
    let s = c.wait_job("/u/pu", "unschedulable");
    let counts = s["task_state_counts"].as_object().expect("counts");
    assert_eq!(counts.get("unschedulable"), Some(&json!(1)), "{s}");
    assert_eq!(counts.values().map(i).sum::<i64>(), 2, "{s}");
    assert!(
        counts.keys().all(|k| k == "unschedulable" || k == "killed"),
        "the other task is killed when the job goes terminal: {s}"
    );
}

#[test]
fn b08_execution_timeout_fails_without_retry() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    c.submit(
        "slow",
        &["--timeout", "1", "--max-retries", "2"],
        &["sleep", "30"],
    );
    let s = c.wait_job("/u/slow", "failed");
    assert!(
        s["tasks"][0]["error"]
            .as_str()
            .unwrap_or("")
            .contains("Execution timeout exceeded"),
        "{s}"
    );
    let a = c.attempts("/u/slow/0");
    assert_eq!(
        a.len(),
        1,
        "a timed-out task is not retried even with budget: {a:?}"
    );
    assert_eq!(a[0]["state"], 5);
    assert_eq!(s["failure_count"], 1);
}

// ---------------------------------------------------------------------------------------------
// §11.9

#[test]
fn b09_task_environment() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let script = "echo \"TID=$IRIS_TASK_ID\"; echo \"NUM=$IRIS_NUM_TASKS\"; echo \"UID=$IRIS_ATTEMPT_UID\"; \
                  echo \"FOO=$FOO\"; echo \"JOBENV=$IRIS_JOB_ENV\"";
    c.submit(
        "env",
        &["--replicas", "2", "-e", "FOO", "bar", "-e", "ZED", "a b"],
        &["sh", "-c", script],
    );
    c.wait_job("/u/env", "succeeded");
    for idx in 0..2 {
        let task = format!("/u/env/{idx}");
        let o = c.iris(&["task", "logs", &task]);
        let lines = log_lines(o.ok());
        let get = |k: &str| {
            lines
                .iter()
                .find_map(|l| l.strip_prefix(&format!("{k}=")).map(str::to_string))
                .unwrap_or_else(|| panic!("{k} missing in {lines:?}"))
        };
        assert_eq!(get("TID"), format!("{task}:0"));
        assert_eq!(get("NUM"), "2");
        assert_eq!(get("FOO"), "bar");
        let env: Value = serde_json::from_str(&get("JOBENV")).expect("IRIS_JOB_ENV is JSON");
        assert_eq!(env, json!({"FOO": "bar", "ZED": "a b"}));
        // The uid the task saw is the attempt's uid as `task describe` shows it.
        let uid = get("UID");
        assert!(is_attempt_uid(&uid), "{uid}");
        let d = c.iris(&["task", "describe", &task]);
        let row = d
            .ok()
            .lines()
            .find(|l| l.split_whitespace().next() == Some("0") && l.contains("succeeded"))
            .unwrap_or_else(|| panic!("attempt 0 row in:\n{}", d.stdout))
            .to_string();
        assert_eq!(row.split_whitespace().nth(1), Some(uid.as_str()), "{row}");
        let a = c.iris(&["attempt", "describe", &format!("{task}:0")]);
        assert!(
            a.ok().lines().any(|l| l == format!("UID: {uid}")),
            "{}",
            a.stdout
        );
    }
}

/// A local cluster from a config in the published layout: `defaults.task_env` reaches worker
/// tasks under the job's env, and the worker sets the `IRIS_*` variables the reference sets
/// (the interpreter for callables, resources, setup scripts, region, its real addresses).
#[test]
fn b09_cluster_task_env_and_the_reference_iris_variables() {
    let c = TestCluster::start_local(
        r#"
platform: {local: {}}
defaults:
  task_env: {CLUSTER_ONLY: from-cluster, SHARED: from-cluster}
scale_groups:
  cpu:
    num_vms: 1
    resources: {cpu: 8, ram: 16GB, disk: 50GB, device_type: cpu}
    attributes: {region: us-test}
"#,
        1,
    );
    let vars = [
        "CLUSTER_ONLY",
        "SHARED",
        "IRIS_PYTHON",
        "IRIS_TASK_RESOURCES",
        "IRIS_JOB_SETUP_SCRIPTS",
        "IRIS_WORKER_REGION",
        "IRIS_ADVERTISE_HOST",
        "IRIS_BIND_HOST",
    ];
    let script: String = vars
        .iter()
        // printf, not echo: dash's echo would expand the `\n` escapes inside the JSON values.
        .map(|v| format!("printf '%s\\n' \"{v}=${v}\"; "))
        .collect();
    c.submit(
        "tenv",
        &["-e", "SHARED", "from-job", "--memory", "1GB"],
        &["sh", "-c", &script],
    );
    c.wait_job("/u/tenv", "succeeded");
    let lines = log_lines(c.iris(&["task", "logs", "/u/tenv/0"]).ok());
    let get = |k: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(&format!("{k}=")).map(str::to_string))
            .unwrap_or_else(|| panic!("{k} missing in {lines:?}"))
    };
    assert_eq!(get("CLUSTER_ONLY"), "from-cluster");
    assert_eq!(
        get("SHARED"),
        "from-job",
        "the job's env wins over the cluster's"
    );
    let python = get("IRIS_PYTHON");
    assert!(
        std::path::Path::new(&python).is_absolute() && python.contains("python"),
        "IRIS_PYTHON is a resolved interpreter: {python}"
    );
    let res: Value = serde_json::from_str(&get("IRIS_TASK_RESOURCES")).expect("resources JSON");
    assert_eq!(res["memory_bytes"], "1073741824", "{res}");
    // Our CLI sends the published CLI's default setup: the workspace's uv sync (skipped on the
    // worker, as this workspace has no pyproject.toml).
    let scripts: Vec<String> =
        serde_json::from_str(&get("IRIS_JOB_SETUP_SCRIPTS")).expect("setup scripts JSON");
    assert!(
        scripts.len() == 1 && scripts[0].contains("uv sync"),
        "{scripts:?}"
    );
    assert_eq!(get("IRIS_WORKER_REGION"), "us-test");
    assert_eq!(get("IRIS_ADVERTISE_HOST"), "127.0.0.1");
    assert_eq!(get("IRIS_BIND_HOST"), "127.0.0.1");
}

// ---------------------------------------------------------------------------------------------
// §11.10

#[test]
fn b10_replicas_never_overcommit_one_worker() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    c.submit(
        "rep",
        &["--replicas", "3", "--cpu", "12"],
        &["sh", "-c", "sleep 0.3"],
    );
    let o = c.iris(&["task", "list", "/u/rep"]);
    let ids: Vec<&str> = o
        .ok()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        ids,
        vec!["/u/rep/0", "/u/rep/1", "/u/rep/2"],
        "ordered by index"
    );
    assert_eq!(c.job_status("/u/rep")["task_count"], 3);

    c.wait_job("/u/rep", "succeeded");
    // One at a time: each attempt is placed only after the previous one was confirmed finished.
    let mut rows = c.attempts_under("/u/rep");
    rows.sort_by_key(|a| (a.created_at_ms, a.task_id.clone()));
    assert_eq!(rows.len(), 3, "{rows:?}");
    for w in rows.windows(2) {
        assert!(
            w[1].created_at_ms >= w[0].finished_at_ms.unwrap_or(i64::MAX),
            "two 12-core tasks overlapped on one 16-core worker: {rows:?}"
        );
    }
    assert!(rows.iter().all(|r| r.worker_id == "w0"));
}

// ---------------------------------------------------------------------------------------------
// §11.13

#[test]
fn b13_priority_bands_and_max_band() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let o = c.iris(&[
        "job",
        "run",
        "--no-wait",
        "--user",
        "u",
        "--job-name",
        "prod",
        "--priority",
        "production",
        "--",
        "true",
    ]);
    let e = o.err();
    assert!(e.contains("permission_denied"), "{e}");
    assert!(e.contains("production"), "{e}");
    assert_eq!(c.job_count(), 0);

    c.submit("batch", &["--priority", "batch"], &["true"]);
    c.submit("plain", &[], &["true"]);
    let band = |j: &str| c.job_request(j).priority_band;
    assert_eq!(band("/u/batch"), Some(3));
    assert_eq!(band("/u/plain"), Some(2));

    let o = c.iris(&[
        "user",
        "budget",
        "set",
        "u",
        "--max-band",
        "production",
        "--limit",
        "0",
    ]);
    assert_eq!(o.ok(), "Set budget for u\n");
    c.submit("prod", &["--priority", "production"], &["true"]);
    assert_eq!(band("/u/prod"), Some(1));
    c.wait_job("/u/prod", "succeeded");
}

// ---------------------------------------------------------------------------------------------
// §11.14

#[test]
fn b14_query_formats_and_read_only() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    c.submit("q", &[], &["true"]);
    c.wait_job("/u/q", "succeeded");

    let body = json!({"sql": "SELECT job_id, state FROM jobs"}).to_string();
    let o = c.iris(&["rpc", "controller", "execute-raw-query", "--json", &body]);
    let v: Value = serde_json::from_str(o.ok()).expect("JSON");
    assert_eq!(
        v["columns"],
        json!([{"name": "job_id", "type": "unknown"}, {"name": "state", "type": "unknown"}])
    );
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1);
    let row: Value = serde_json::from_str(rows[0].as_str().expect("row string")).expect("row JSON");
    assert_eq!(row, json!(["/u/q", 4]));

    let o = c.iris(&["query", "SELECT job_id, state FROM jobs", "-f", "csv"]);
    assert_eq!(o.ok(), "job_id,state\n/u/q,4\n");
    let o = c.iris(&["query", "SELECT job_id, state FROM jobs"]);
    let lines: Vec<&str> = o.ok().lines().collect();
    assert_eq!(lines.len(), 2, "{}", o.stdout);
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        vec!["job_id", "state"]
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        vec!["/u/q", "4"]
    );

    let o = c.iris(&["query", "DELETE FROM jobs"]);
    assert!(
        o.err().contains("only SELECT statements are allowed"),
        "{}",
        o.stderr
    );
    assert_eq!(c.job_count(), 1);

    // The README's pipeline: CSV ids into `job cancel --stdin`.
    c.submit("s", &[], &["sleep", "30"]);
    c.wait_tasks("/u/s", &[(0, "running")]);
    let csv = c.iris(&[
        "query",
        "SELECT job_id FROM jobs WHERE state = 3",
        "-f",
        "csv",
    ]);
    assert_eq!(csv.ok(), "job_id\n/u/s\n");
    let o = c.iris_stdin(&["job", "cancel", "--stdin"], &csv.stdout);
    assert_eq!(o.ok(), "Cancelled /u/s\n");
    c.wait_job("/u/s", "killed");
    assert_eq!(c.summary("/u/q")["state"], "succeeded");
}

// ---------------------------------------------------------------------------------------------
// §11.15

#[test]
fn b15_killed_worker_attempt_is_retried_elsewhere() {
    let mut c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let pidfile = c.path("pids");
    let pf = pidfile.to_str().expect("utf8 path").to_string();
    let script = "echo $$ >> \"$PIDFILE\"; case \"$IRIS_TASK_ID\" in *:0) exec sleep 30;; esac; echo second-attempt";
    c.submit("wf", &["-e", "PIDFILE", &pf], &["sh", "-c", script]);
    let s = c.wait_tasks("/u/wf", &[(0, "running")]);
    assert_eq!(s["tasks"][0]["worker_id"], "w0");
    let orphan = wait_for(SHORT, "attempt 0 to record its pid", || {
        read_pids(&pidfile).first().copied()
    });

    let w1 = c.add_worker(&WorkerSpec::cpu(16));
    let killed_at = now_ms();
    c.kill_worker("w0");
    let s = c.wait_job("/u/wf", "succeeded");
    // The dead worker's task process was orphaned by the SIGKILL; clean it up.
    let _ = std::process::Command::new("kill")
        .args(["-9", &orphan.to_string()])
        .status();

    let a = c.attempts("/u/wf/0");
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(a[0]["worker_id"], "w0");
    assert_eq!(a[0]["state"], 7, "attempt 0 WORKER_FAILED: {a:?}");
    // Declared failed only after the 2 s grace (counted from its last good reconcile, which was
    // at most ~1 s before the kill).
    let declared = i(&a[0]["finished_at_ms"]) - killed_at;
    assert!(
        declared >= 900,
        "worker failed {declared} ms after the kill: {a:?}"
    );
    assert_eq!(a[1]["worker_id"], w1.as_str());
    assert_eq!(a[1]["state"], 4);
    assert_eq!(s["preemption_count"], 1);
    assert_eq!(s["failure_count"], 0);
    assert_eq!(
        log_lines(c.iris(&["task", "logs", "/u/wf/0"]).ok())
            .last()
            .map(String::as_str),
        Some("second-attempt")
    );
    assert!(!c.healthy_workers().contains(&"w0".to_string()));
}

#[test]
fn child_jobs_nest_under_the_task_and_cancel_cascades() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    // A task submits a child through the CLI, with the controller URL and task id the worker set.
    let script = "\"$IRIS_BIN\" job run --no-wait --job-name kid -- sleep 30 && exec sleep 30";
    c.submit("parent", &["-e", "IRIS_BIN", IRIS], &["sh", "-c", script]);
    wait_until(SHORT, "the child job to run", || {
        c.job_state("/u/parent/kid").as_deref() == Some("running")
    });
    assert_eq!(c.job_status("/u/parent/kid")["parent_job_id"], "/u/parent");
    let holds = c.open_attempts();
    let kid = holds
        .iter()
        .find(|h| h.task_id == "/u/parent/kid/0")
        .unwrap_or_else(|| panic!("the running child holds nothing: {holds:?}"));
    assert_eq!(kid.band, 2, "inherits the parent's band");

    c.iris(&["job", "cancel", "/u/parent"]).ok();
    let p = c.wait_job("/u/parent", "killed");
    assert_eq!(p["error"], "Terminated by user");
    let k = c.wait_job("/u/parent/kid", "killed");
    assert_eq!(k["error"], "Parent job terminated");
    wait_until(SHORT, "all attempts confirmed finished", || {
        c.open_attempts().is_empty()
    });
}

// ---------------------------------------------------------------------------------------------
// Restart: the state dir is the cluster's memory (README: "starting again with the same DIR
// resumes every job").

#[test]
fn controller_restart_on_the_same_state_dir_resumes_jobs() {
    let mut c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let go = c.path("go");
    c.submit("done", &[], &["echo", "before"]);
    c.wait_job("/u/done", "succeeded");
    c.submit(
        "live",
        &["-e", "GO", go.to_str().expect("utf8")],
        &["sh", "-c", &wait_go("echo after-restart")],
    );
    c.wait_tasks("/u/live", &[(0, "running")]);
    let uid = c.attempts("/u/live/0")[0]["attempt_uid"].clone();

    c.restart_controller();
    assert_eq!(c.summary("/u/done")["state"], "succeeded");
    assert_eq!(
        log_lines(c.iris(&["job", "logs", "/u/done"]).ok()),
        vec!["before"]
    );
    let s = c.summary("/u/live");
    assert_eq!(s["tasks"][0]["state"], "running", "{s}");

    touch(&go);
    c.wait_job("/u/live", "succeeded");
    let a = c.attempts("/u/live/0");
    assert_eq!(
        a.len(),
        1,
        "the running attempt survived the restart: {a:?}"
    );
    assert_eq!(a[0]["attempt_uid"], uid);
    assert_eq!(
        log_lines(c.iris(&["job", "logs", "/u/live"]).ok()),
        vec!["after-restart"]
    );
    c.submit("new", &[], &["echo", "new"]);
    c.wait_job("/u/new", "succeeded");
}

// ---------------------------------------------------------------------------------------------
// Acceptance: preemption

#[test]
fn preemption_interactive_evicts_batch_which_then_reruns() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16).device("gpu:h100:8")]);
    let go = c.path("go");
    let gp = go.to_str().expect("utf8 path");
    c.submit(
        "batch",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x8",
            "--priority",
            "batch",
        ],
        &[
            "sh",
            "-c",
            "case \"$IRIS_TASK_ID\" in *:0) exec sleep 30;; esac; echo batch-done",
        ],
    );
    c.wait_tasks("/u/batch", &[(0, "running")]);

    c.submit(
        "inter",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x8",
            "-e",
            "GO",
            gp,
        ],
        &["sh", "-c", &wait_go("echo interactive-done")],
    );
    c.wait_tasks("/u/inter", &[(0, "running")]);
    // The batch attempt was preempted and its task is back to pending while the preemptor runs.
    let b = c.wait_tasks("/u/batch", &[(0, "pending")]);
    assert_eq!(
        b["state"], "running",
        "a started job stays running while its task waits: {b}"
    );
    let ba = c.attempts("/u/batch/0");
    assert_eq!(ba.len(), 1, "{ba:?}");
    assert_eq!(ba[0]["state"], 10, "PREEMPTED: {ba:?}");
    let ia = c.attempts("/u/inter/0");
    assert_eq!(ia.len(), 1);
    assert_eq!(ia[0]["worker_id"], "w0");
    assert!(
        i(&ia[0]["started_at_ms"]) >= i(&ba[0]["finished_at_ms"]),
        "the preemptor starts only after the victim ended: batch {ba:?} interactive {ia:?}"
    );

    touch(&go);
    c.wait_job("/u/inter", "succeeded");
    let s = c.wait_job("/u/batch", "succeeded");
    assert_eq!(s["preemption_count"], 1);
    let ba = c.attempts("/u/batch/0");
    assert_eq!(ba.len(), 2, "{ba:?}");
    assert_eq!(ba[1]["state"], 4);
    let ia = c.attempts("/u/inter/0");
    assert!(
        i(&ba[1]["created_at_ms"]) >= i(&ia[0]["finished_at_ms"]),
        "batch reruns after interactive: {ba:?} {ia:?}"
    );
    assert_eq!(
        log_lines(c.iris(&["job", "logs", "/u/batch"]).ok()),
        vec!["batch-done"]
    );
}

#[test]
fn operator_preempt_with_budget_left_requeues_the_task() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    c.submit(
        "op",
        &[],
        &[
            "sh",
            "-c",
            "case \"$IRIS_TASK_ID\" in *:0) exec sleep 30;; esac; echo rerun",
        ],
    );
    c.wait_tasks("/u/op", &[(0, "running")]);
    let o = c.iris(&["task", "preempt", "/u/op/0"]);
    assert!(o.ok().starts_with("Preempted /u/op/0"), "{}", o.stdout);
    let s = c.wait_job("/u/op", "succeeded");
    assert_eq!(s["preemption_count"], 1);
    assert_eq!(s["failure_count"], 0);
    let a = c.attempts("/u/op/0");
    assert_eq!(
        a.iter().map(|a| i(&a["state"])).collect::<Vec<_>>(),
        vec![10, 4],
        "{a:?}"
    );
    assert_eq!(
        log_lines(c.iris(&["job", "logs", "/u/op"]).ok()),
        vec!["rerun"]
    );
    // Only active tasks can be kicked.
    let o = c.iris(&["task", "preempt", "/u/op/0"]);
    assert!(o.err().contains("not running"), "{}", o.stderr);
}

#[test]
fn preemption_never_within_a_band_and_never_by_batch() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16).device("gpu:h100:8")]);
    let go = c.path("go");
    let gp = go.to_str().expect("utf8 path");
    c.submit(
        "a",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x8",
            "-e",
            "GO",
            gp,
        ],
        &["sh", "-c", &wait_go("echo a-done")],
    );
    c.wait_tasks("/u/a", &[(0, "running")]);

    c.submit(
        "b",
        &["--enable-extra-resources", "--gpu", "H100x8"],
        &["echo", "b-done"],
    );
    c.submit(
        "c",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x8",
            "--priority",
            "batch",
        ],
        &["echo", "c-done"],
    );
    // Once the scheduler has explained why b and c wait, it has planned them without preempting.
    for j in ["/u/b", "/u/c"] {
        wait_until(SHORT, &format!("{j} to have a pending reason"), || {
            let s = c.summary(j);
            s["state"] == "pending" && !s["pending_reason"].as_str().unwrap_or("").is_empty()
        });
    }
    let s = c.summary("/u/a");
    assert_eq!(s["tasks"][0]["state"], "running");
    assert_eq!(c.attempts("/u/a/0").len(), 1);
    let o = c.iris(&["job", "list"]);
    let row = o
        .ok()
        .lines()
        .find(|l| l.starts_with("/u/b "))
        .unwrap_or_else(|| panic!("{}", o.stdout))
        .to_string();
    assert!(
        row.split_whitespace().nth(1) == Some("pending") && row.split_whitespace().count() > 4,
        "REASON shown: {row}"
    );

    touch(&go);
    for j in ["/u/a", "/u/b", "/u/c"] {
        let s = c.wait_job(j, "succeeded");
        assert_eq!(s["preemption_count"], 0, "{j}: {s}");
    }
    let a = c.attempts("/u/a/0");
    let b = c.attempts("/u/b/0");
    let cc = c.attempts("/u/c/0");
    assert_eq!((a.len(), b.len(), cc.len()), (1, 1, 1));
    assert!(i(&b[0]["created_at_ms"]) >= i(&a[0]["finished_at_ms"]));
    assert!(
        i(&cc[0]["created_at_ms"]) >= i(&b[0]["finished_at_ms"]),
        "interactive before batch: {b:?} {cc:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Acceptance: gangs

/// Declares that up to four `pool=a` hosts can exist, so a 4-host gang is feasible at submit.
const POOL_CONFIG: &str = r#"
scale_groups:
  pool-a:
    num_vms: 1
    max_slices: 4
    resources: {cpu: 4, ram: 16GB, disk: 100GB, device_type: cpu}
    attributes: {pool: a}
"#;

#[test]
fn gang_waits_for_enough_hosts_and_fails_together() {
    let pool_a = || WorkerSpec::cpu(4).attr("pool", "a");
    let mut c = TestCluster::start_with_config(
        &[
            pool_a(),
            pool_a(),
            pool_a(),
            WorkerSpec::cpu(4).attr("pool", "b"),
        ],
        Some(POOL_CONFIG),
    );
    let go = c.path("go");
    let pidfile = c.path("pids");
    let script = "echo $$ >> \"$PIDFILE\"; case \"$IRIS_TASK_ID\" in */0:*) while [ ! -e \"$GO\" ]; do sleep 0.05; done; exit 1;; esac; exec sleep 30";
    c.submit(
        "gang",
        &[
            "--replicas",
            "4",
            "--cpu",
            "2",
            "--group-by",
            "pool",
            "-e",
            "GO",
            go.to_str().expect("utf8"),
            "-e",
            "PIDFILE",
            pidfile.to_str().expect("utf8"),
        ],
        &["sh", "-c", script],
    );
    let s = wait_for(SHORT, "the gang's pending reason", || {
        let s = c.summary("/u/gang");
        (!s["pending_reason"].as_str().unwrap_or("").is_empty()).then_some(s)
    });
    assert_eq!(s["state"], "pending");
    assert_eq!(s["task_state_counts"], json!({"pending": 4}));
    let reason = s["pending_reason"].as_str().expect("reason");
    assert!(
        reason.contains("Coscheduled job /u/gang") && reason.contains("'pool'"),
        "{reason}"
    );
    let o = c.iris(&["job", "list"]);
    assert!(
        o.ok()
            .lines()
            .any(|l| l.starts_with("/u/gang ") && l.contains("Coscheduled job /u/gang")),
        "{}",
        o.stdout
    );

    let w4 = c.add_worker(&pool_a());
    let s = c.wait_tasks(
        "/u/gang",
        &[
            (0, "running"),
            (1, "running"),
            (2, "running"),
            (3, "running"),
        ],
    );
    let mut hosts: Vec<&str> = s["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["worker_id"].as_str().unwrap_or(""))
        .collect();
    hosts.sort();
    assert_eq!(
        hosts,
        vec!["w0", "w1", "w2", w4.as_str()],
        "one task per pool=a host"
    );
    let pids = wait_for(SHORT, "all members to record pids", || {
        let p = read_pids(&pidfile);
        (p.len() == 4).then_some(p)
    });

    // Member 0 fails with no retries left: its running siblings are COSCHED_FAILED (terminal).
    touch(&go);
    let s = c.wait_job("/u/gang", "failed");
    let tasks = s["tasks"].as_array().expect("tasks");
    assert_eq!(tasks[0]["state"], "failed");
    for t in &tasks[1..] {
        assert_eq!(t["state"], "cosched_failed", "{s}");
        assert!(
            t["error"]
                .as_str()
                .unwrap_or("")
                .contains("Coscheduled sibling /u/gang/0"),
            "{t}"
        );
    }
    wait_until(SHORT, "sibling processes to be stopped", || {
        pids.iter().all(|p| !alive(*p))
    });
    for n in 1..4 {
        let a = c.attempts(&format!("/u/gang/{n}"));
        assert_eq!(a.len(), 1, "no sibling is retried: {a:?}");
        assert_eq!(a[0]["state"], 11);
    }
}

#[test]
fn gang_member_retry_requeues_the_whole_gang() {
    let pool_a = || WorkerSpec::cpu(4).attr("pool", "a");
    let c = TestCluster::start(&[pool_a(), pool_a()]);
    let go = c.path("go");
    // Member 0 fails its first attempt once every member is running; all later attempts succeed.
    let script = "case \"$IRIS_TASK_ID\" in */0:0) while [ ! -e \"$GO\" ]; do sleep 0.05; done; exit 1;; */*:0) exec sleep 30;; esac; echo \"ok $IRIS_TASK_ID\"";
    c.submit(
        "gr",
        &[
            "--replicas",
            "2",
            "--cpu",
            "3",
            "--group-by",
            "pool",
            "--max-retries",
            "1",
            "-e",
            "GO",
            go.to_str().expect("utf8"),
        ],
        &["sh", "-c", script],
    );
    c.wait_tasks("/u/gr", &[(0, "running"), (1, "running")]);
    touch(&go);
    let s = c.wait_job("/u/gr", "succeeded");
    assert_eq!(
        s["failure_count"], 1,
        "one crashed gang round charges one failure: {s}"
    );
    assert_eq!(
        s["preemption_count"], 0,
        "the requeued sibling is not charged: {s}"
    );
    let a0 = c.attempts("/u/gr/0");
    let a1 = c.attempts("/u/gr/1");
    assert_eq!(
        a0.iter().map(|a| i(&a["state"])).collect::<Vec<_>>(),
        vec![5, 4],
        "{a0:?}"
    );
    assert_eq!(
        a1.iter().map(|a| i(&a["state"])).collect::<Vec<_>>(),
        vec![11, 4],
        "{a1:?}"
    );
    // The gang was re-placed as a whole (one tick), once the old attempts had freed their hosts
    // (3 of 4 cores each, so an old and a new attempt never fit on one host together).
    assert_eq!(
        a0[1]["created_at_ms"], a1[1]["created_at_ms"],
        "{a0:?} {a1:?}"
    );
    let ended = i(&a0[0]["finished_at_ms"]).max(i(&a1[0]["finished_at_ms"]));
    assert!(i(&a0[1]["created_at_ms"]) >= ended, "{a0:?} {a1:?}");
}

// ---------------------------------------------------------------------------------------------
// Acceptance: bad input

#[test]
fn bad_input_is_refused_with_the_field_named_and_changes_nothing() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    c.submit("keep", &[], &["true"]);
    c.wait_job("/u/keep", "succeeded");
    let job_states = || -> Vec<(String, i32)> {
        c.jobs("/")
            .into_iter()
            .map(|j| (j.job_id().to_owned(), j.state.unwrap_or_default()))
            .collect()
    };
    let before = job_states();
    assert_eq!(c.job_count(), 1);

    let run = |flags: &[&str]| {
        let mut a = vec!["job", "run", "--no-wait", "--user", "u"];
        a.extend_from_slice(flags);
        a.extend_from_slice(&["--", "true"]);
        c.iris(&a)
    };
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (vec!["--job-name", "a/b"], &["--job-name", "a/b"]),
        (
            vec!["--job-name", "x", "--replicas", "0"],
            &["--replicas", "1 to 10000"],
        ),
        (
            vec!["--job-name", "x", "--replicas", "10001"],
            &["--replicas", "1 to 10000"],
        ),
        (
            vec!["--job-name", "x", "--replicas", "-1"],
            &["--replicas", "1 to 10000"],
        ),
        (
            vec!["--job-name", "x", "--max-retries", "-1"],
            &["--max-retries"],
        ),
        (
            vec!["--job-name", "x", "--priority", "urgent"],
            &["--priority", "urgent"],
        ),
        (vec!["--job-name", "x", "--cpu", "-1"], &["--cpu"]),
        (vec!["--job-name", "x", "--cpu=-1"], &["--cpu"]),
        (vec!["--job-name", "x", "--memory", "lots"], &["--memory"]),
        (
            vec!["--job-name", "x", "-e", "FOO"],
            &["--env-vars", "KEY", "VALUE"],
        ),
        // Infeasible anywhere (§11.12): refused at submit, nothing stored.
        (
            vec!["--job-name", "x", "--cpu", "100"],
            &["is unschedulable", "failed_precondition"],
        ),
        (
            vec![
                "--job-name",
                "x",
                "--enable-extra-resources",
                "--gpu",
                "H100x8",
            ],
            &["is unschedulable", "failed_precondition"],
        ),
        (
            vec![
                "--job-name",
                "x",
                "--enable-extra-resources",
                "--gpu",
                "H100xlots",
            ],
            &["gpu"],
        ),
    ];
    for (flags, needles) in &cases {
        let o = run(flags);
        let e = o.err();
        for n in *needles {
            assert!(
                e.contains(n),
                "{flags:?}: stderr should mention {n:?}:\n{e}"
            );
        }
        assert_eq!(o.stdout, "", "{flags:?}");
    }

    // Server-side validation, bypassing the CLI.
    let body = json!({"name": "/u/x", "entrypoint": {"runCommand": {"argv": ["true"]}}, "replicas": 10001});
    let o = c.iris(&[
        "rpc",
        "controller",
        "launch-job",
        "--json",
        &body.to_string(),
    ]);
    assert_ne!(o.code, 0);
    let v: Value = serde_json::from_str(&o.stdout).expect("error JSON");
    assert_eq!(v["code"], "invalid_argument");
    assert!(
        v["message"].as_str().unwrap_or("").contains("replicas"),
        "{v}"
    );

    let o = c.iris(&["query", "UPDATE jobs SET state=1"]);
    assert!(
        o.err().contains("only SELECT statements are allowed"),
        "{}",
        o.stderr
    );
    let o = c.iris(&["job", "describe", "/nobody/nothing"]);
    let e = o.err();
    assert!(
        e.contains("/nobody/nothing") && e.contains("not found"),
        "{e}"
    );
    let o = c.iris(&["job", "wait", "/nobody/nothing"]);
    assert!(o.err().contains("not found"), "{}", o.stderr);
    let o = c.iris(&["job", "list", "--state", "bogus"]);
    assert!(o.err().contains("state"), "{}", o.stderr);

    assert_eq!(c.job_count(), 1);
    assert_eq!(job_states(), before);
}

/// `--cluster NAME` and `--config FILE` choose among several local clusters, each started from
/// its config and keeping its own state; `cluster list` shows the names `--cluster` takes.
#[test]
fn b16_config_and_cluster_choose_among_local_clusters() {
    let root = tempfile::tempdir().expect("dir");
    let home = root.path().join("home");
    let data = root.path().join("data");
    let configs = home.join(".config/marin/clusters");
    std::fs::create_dir_all(&configs).expect("config dir");
    for name in ["alpha", "beta"] {
        std::fs::write(
            configs.join(format!("{name}.yaml")),
            format!(
                "name: {name}\nplatform: {{local: {{}}}}\ncontroller: {{local: {{port: 0}}}}\n\
                 scale_groups:\n  cpu:\n    num_vms: 1\n    resources: {{cpu: 2, ram: 4GB, disk: 10GB, device_type: cpu}}\n"
            ),
        )
        .expect("config");
    }
    let env: [(&str, &std::path::Path); 2] = [("HOME", &home), ("XDG_DATA_HOME", &data)];
    let beta_file = configs.join("beta.yaml");
    let beta = beta_file.to_str().expect("utf-8 path");
    let _alpha = Daemon::spawn(
        root.path(),
        &env,
        &["--cluster", "alpha", "cluster", "start", "--local"],
        &root.path().join("alpha.log"),
    );
    let _beta = Daemon::spawn(
        root.path(),
        &env,
        &["--config", beta, "cluster", "start", "--local"],
        &root.path().join("beta.log"),
    );
    for sel in [["--cluster", "alpha"], ["--config", beta]] {
        wait_until(STARTUP, "the local cluster to answer", || {
            let o = iris_in(
                root.path(),
                &env,
                &[sel[0], sel[1], "rpc", "controller", "list-workers"],
            );
            o.code == 0 && o.stdout.contains("worker_id")
        });
    }
    // Each cluster keeps its state under its own name.
    for name in ["alpha", "beta"] {
        assert!(data
            .join("iris/clusters")
            .join(name)
            .join("controller.url")
            .is_file());
    }
    let o = iris_in(
        root.path(),
        &env,
        &[
            "--cluster",
            "alpha",
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--user",
            "u",
            "--job-name",
            "only-alpha",
            "--",
            "true",
        ],
    );
    assert_eq!(o.ok().trim(), "/u/only-alpha");
    let listed = |sel: [&str; 2]| {
        iris_in(root.path(), &env, &[sel[0], sel[1], "job", "list"])
            .ok()
            .to_string()
    };
    assert!(listed(["--cluster", "alpha"]).contains("/u/only-alpha"));
    assert!(!listed(["--config", beta]).contains("/u/only-alpha"));
    assert!(!listed(["--cluster", "beta"]).contains("/u/only-alpha"));

    let o = iris_in(root.path(), &env, &["cluster", "list"]);
    let out = o.ok();
    assert!(out.starts_with("Available clusters:"), "{out}");
    for name in ["alpha", "beta"] {
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().next() == Some(name) && l.contains(".yaml")),
            "{out}"
        );
    }
    let o = iris_in(root.path(), &env, &["--cluster", "gamma", "job", "list"]);
    let err = o.err();
    assert!(
        err.contains("unknown cluster gamma") && err.contains("iris cluster list"),
        "{err}"
    );
    let o = iris_in(
        root.path(),
        &env,
        &[
            "--controller-url",
            "http://127.0.0.1:1",
            "--config",
            beta,
            "job",
            "list",
        ],
    );
    assert!(o.err().contains("not both"), "{}", o.stderr);
}

/// The published CLI's smaller verbs and flags: `task wait` / `attempt wait` (state printed,
/// exit 0 only on success), `job logs --since-seconds`, `job cancel --exact`, and
/// `--container-profile` / `--egress-policy` carried in the request.
#[test]
fn b17_wait_since_seconds_exact_cancel_and_profiles() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    c.submit("ok", &[], &["sh", "-c", "echo waited-for"]);
    c.submit("bad", &[], &["sh", "-c", "exit 3"]);
    let o = c.iris(&["task", "wait", "/u/ok/0"]);
    assert_eq!(o.ok().trim(), "succeeded");
    let o = c.iris(&["task", "wait", "/u/bad/0"]);
    assert_eq!((o.code, o.stdout.trim()), (1, "failed"), "{}", o.stderr);
    let o = c.iris(&["attempt", "wait", "/u/bad/0:0"]);
    assert_eq!((o.code, o.stdout.trim()), (1, "failed"), "{}", o.stderr);
    let o = c.iris(&["attempt", "wait", "/u/ok/0:7"]);
    assert!(
        o.err().contains("attempt /u/ok/0:7 not found"),
        "{}",
        o.stderr
    );

    c.wait_job("/u/ok", "succeeded");
    let o = c.iris(&["job", "logs", "/u/ok", "--since-seconds", "3600"]);
    assert!(o.ok().contains("waited-for"), "{}", o.stdout);
    let o = c.iris(&[
        "job",
        "logs",
        "/u/ok",
        "--since-seconds",
        "60",
        "--since-ms",
        "1",
    ]);
    assert_ne!(o.code, 0, "--since-seconds and --since-ms are exclusive");

    c.submit("long", &[], &["sleep", "30"]);
    c.submit("long2", &[], &["sleep", "30"]);
    c.wait_tasks("/u/long2", &[(0, "running")]);
    c.iris(&["job", "cancel", "--exact", "/u/long"]).ok();
    c.wait_job("/u/long", "killed");
    assert_eq!(c.job_state("/u/long2").as_deref(), Some("running"));
    c.iris(&["job", "cancel", "/u/long2"]).ok();

    c.submit(
        "prof",
        &[
            "--container-profile",
            "restricted",
            "--egress-policy",
            "EGRESS_POLICY_NONE",
        ],
        &["true"],
    );
    let body = json!({"job_id": "/u/prof"}).to_string();
    let v: Value = serde_json::from_str(
        c.iris(&["rpc", "controller", "get-job-status", "--json", &body])
            .ok(),
    )
    .expect("JSON");
    assert_eq!(
        v["request"]["container_profile"], "CONTAINER_PROFILE_RESTRICTED",
        "{v}"
    );
    assert_eq!(v["request"]["egress_policy"], "EGRESS_POLICY_NONE", "{v}");
    let o = c.iris(&[
        "job",
        "run",
        "--no-wait",
        "--user",
        "u",
        "--container-profile",
        "roomy",
        "--",
        "true",
    ]);
    assert!(
        o.err().contains("--container-profile roomy: unknown value"),
        "{}",
        o.stderr
    );
}

/// `GET /metrics` (OpenMetrics text): the names an operator scrapes, each moving with the work
/// the cluster did — submits, placements, task steps, logs, ticks, the writer connection's time
/// by user — and the workers' health.
#[test]
fn metrics_are_scraped_and_move_with_the_work_done() {
    let c = TestCluster::start(&[WorkerSpec::cpu(8), WorkerSpec::cpu(8)]);
    let scrape = || {
        let (code, _, body) = http_get(&c.url, "/metrics", None);
        assert_eq!(code, 200, "{body}");
        body
    };
    let value = |text: &str, series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    };
    let before = scrape();
    for name in [
        "iris_tick_duration_seconds",
        "iris_ticks",
        "iris_assignments",
        "iris_preemptions",
        "iris_pending_tasks",
        "iris_workers",
        "iris_rpc_duration_seconds",
        "iris_rpc_requests",
        "iris_admission_commit_duration_seconds",
        "iris_admission_batch_size",
        "iris_log_bytes",
        "iris_task_steps",
        "iris_illegal_transitions",
        "iris_writer_held_seconds",
        "iris_writer_turns",
    ] {
        assert!(
            before.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{before}"
        );
    }
    for i in 0..5 {
        c.submit(
            &format!("m{i}"),
            &["--replicas", "2"],
            &["echo", "hello from metrics"],
        );
    }
    for i in 0..5 {
        c.wait_job(&format!("/u/m{i}"), "succeeded");
    }
    let launched = "iris_rpc_requests_total{method=\"LaunchJob\",code=\"200\"}";
    let after = wait_for(SHORT, "the log lines to be counted", || {
        let t = scrape();
        (value(&t, "iris_log_bytes_total") > value(&before, "iris_log_bytes_total")).then_some(t)
    });
    let moved = |series: &str| value(&after, series) - value(&before, series);
    assert_eq!(moved(launched), 5.0, "{after}");
    assert!(moved("iris_assignments_total") >= 10.0, "{after}");
    assert!(
        moved("iris_task_steps_total{state=\"succeeded\"}") >= 10.0,
        "{after}"
    );
    assert!(moved("iris_ticks_total") >= 1.0, "{after}");
    assert!(moved("iris_admission_batch_size_sum") >= 5.0, "{after}");
    // Submits, placements and the workers' reports each held the writer connection.
    for by in ["admission", "tick", "observation"] {
        let series = format!("iris_writer_held_seconds_total{{by=\"{by}\"}}");
        assert!(moved(&series) > 0.0, "{series} did not move:\n{after}");
        let series = format!("iris_writer_turns_total{{by=\"{by}\"}}");
        assert!(moved(&series) >= 1.0, "{series} did not move:\n{after}");
    }
    assert!(
        moved("iris_rpc_duration_seconds_count{method=\"LaunchJob\"}") >= 5.0,
        "{after}"
    );
    assert_eq!(
        value(&after, "iris_workers{state=\"healthy\"}"),
        2.0,
        "{after}"
    );
    assert_eq!(
        value(&after, "iris_illegal_transitions_total"),
        0.0,
        "{after}"
    );
    // An unknown method is one label, however many are tried.
    for m in ["NoSuchA", "NoSuchB"] {
        let (code, body) = http_post_json(
            &c.url,
            &format!("/iris.cluster.ControllerService/{m}"),
            "{}",
        );
        assert_eq!(code, 501, "{body}");
    }
    let t = scrape();
    assert!(!t.contains("NoSuchA"), "{t}");
    assert_eq!(
        value(
            &t,
            "iris_rpc_requests_total{method=\"unknown\",code=\"501\"}"
        ),
        2.0,
        "{t}"
    );
}

/// Retention: a finished job tree older than `--job-retention` is deleted with its tasks and
/// logs by the sweep; a running job is kept until it too has finished and aged.
#[test]
fn finished_jobs_are_pruned_after_their_retention_and_running_ones_kept() {
    let c = TestCluster::start_with_args(
        &[WorkerSpec::cpu(8)],
        None,
        &["--job-retention", "1", "--prune-interval", "0.3"],
    );
    let done = c.submit("done", &[], &["echo", "a line to prune"]);
    let live = c.submit("live", &[], &["sleep", "60"]);
    c.wait_job(&done, "succeeded");
    c.wait_job(&live, "running");
    let logs = c.iris(&["job", "logs", &done, "--no-tail"]);
    assert!(logs.ok().contains("a line to prune"), "{}", logs.stdout);
    wait_until(SHORT, "the finished job to be pruned", || {
        c.job_state(&done).is_none()
    });
    assert_eq!(c.job_state(&live).as_deref(), Some("running"));
    let o = c.iris(&["job", "describe", &done]);
    assert_ne!(o.code, 0, "{}", o.stdout);
    let (_, _, metrics) = http_get(&c.url, "/metrics", None);
    assert!(metrics.contains("iris_jobs_pruned_total 1"), "{metrics}");
    // The pruned job's log lines went with it: a new job of the same name starts clean.
    let again = c.submit("done", &[], &["echo", "second run"]);
    c.wait_job(&again, "succeeded");
    let logs = c.iris(&["job", "logs", &again, "--no-tail"]);
    let text = logs.ok();
    assert!(
        text.contains("second run") && !text.contains("a line to prune"),
        "{text}"
    );
    c.iris(&["job", "cancel", &live]).ok();
    wait_until(SHORT, "the cancelled job to be pruned too", || {
        c.job_state(&live).is_none()
    });
}

/// Issue 15, acceptance 3: a local scale group with `buffer_slices: 0`, `max_slices: 3` starts
/// with no slice, backs off when a slice's worker cannot start (and says why), scales to 3
/// slices under a burst and back to 0 once idle; `cluster vm status` shows each step.
#[test]
fn a_local_scale_group_follows_its_demand_and_backs_off_after_a_failed_start() {
    let yaml = "name: scaling\nplatform: {local: {}}\ncontroller: {local: {port: 0}}\n\
        defaults: {autoscaler: {scale_down_delay: {seconds: 2}}}\n\
        scale_groups:\n  cpu:\n    num_vms: 1\n    buffer_slices: 0\n    max_slices: 3\n\
        \x20   resources: {cpu: 2, ram: 4GB, disk: 10GB, device_type: cpu}\n";
    let tc = TestCluster::start_local(yaml, 0);
    let vm = || tc.iris(&["cluster", "vm", "status"]).ok().to_string();
    let status = vm();
    assert!(
        status.contains("Slices: 0/0 ready"),
        "starts with no slice:\n{status}"
    );

    // Every worker's cache dir is under state/workers: a file there makes each start fail.
    let blocker = tc.state_dir.join("workers");
    std::fs::write(&blocker, "not a directory").expect("blocker");
    let first = tc.submit("first", &["--cpu", "2"], &["true"]);
    wait_until(SHORT, "the group to back off", || {
        let s = vm();
        s.contains("Availability: backoff") && s.contains("failed slice start")
    });
    let s = vm();
    assert!(s.contains("Not a directory"), "the reason is shown:\n{s}");
    wait_until(SHORT, "the job to say why it waits", || {
        let l = tc.iris(&["job", "list"]);
        l.stdout
            .contains("Unsatisfied autoscaler demand: scale group 'cpu' is backoff")
    });
    let r: Value = tc.controller_rpc("get-autoscaler-status", json!({}));
    assert_eq!(r["status"]["groups"][0]["consecutive_failures"], 1, "{r}");
    std::fs::remove_file(&blocker).expect("unblock");
    tc.wait_job(&first, "succeeded");

    // A burst of four 2-core jobs: three slices (the maximum), the fourth job waits its turn.
    let burst: Vec<String> = (0..4)
        .map(|i| tc.submit(&format!("burst-{i}"), &["--cpu", "2"], &["sleep", "4"]))
        .collect();
    wait_until(SHORT, "three ready slices", || {
        let s = vm();
        s.contains("Slices: 3/3 ready") && s.contains("READY (in_use)")
    });
    for j in &burst {
        tc.wait_job(j, "succeeded");
    }
    wait_until(SHORT, "every idle slice to stop", || {
        vm().contains("Slices: 0/0 ready")
    });

    let r: Value = tc.controller_rpc("get-autoscaler-status", json!({}));
    let kinds: Vec<&str> = r["status"]["recent_actions"]
        .as_array()
        .expect("actions")
        .iter()
        .filter_map(|a| a["action_type"].as_str())
        .collect();
    for want in ["slice_failed", "scale_up", "slice_ready", "scale_down"] {
        assert!(kinds.contains(&want), "{want} in {kinds:?}");
    }
    let ups = kinds.iter().filter(|k| **k == "scale_up").count();
    assert!(
        (4..=5).contains(&ups),
        "one failed, one for the first job, three for the burst (maybe one reused): {kinds:?}"
    );
}
