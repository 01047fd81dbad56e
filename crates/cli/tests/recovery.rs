//! "Nothing is lost": crash recovery, worker loss, checkpoints and the migration guard, over the
//! real `iris` binary (controller and workers as separate processes on 127.0.0.1).

mod common;

use common::*;
use iris_proto::job::JobState;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SVC: &str = "/iris.cluster.ControllerService";

/// A raw HTTP/1.1 JSON POST that reports failure instead of panicking (the controller may be
/// dead). Returns the status and body.
fn try_post(url: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    let hostport = url.trim_start_matches("http://").trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(hostport).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).map_err(|e| format!("read: {e}"))?;
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {resp:?}"))?;
    let body = resp
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn launch_body(name: &str, script: &str, extra: Value) -> String {
    let mut v = json!({
        "name": name,
        "entrypoint": {"runCommand": {"argv": ["sh", "-c", script]}},
        "resources": {"cpuMillicores": 100, "memoryBytes": "67108864", "diskBytes": "1048576"},
        "replicas": 1,
        "maxRetriesPreemption": 1000,
    });
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in e {
            o.insert(k.clone(), x.clone());
        }
    }
    v.to_string()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Quick,
    Sleeping,
    Failing,
}

impl Kind {
    fn of(i: usize) -> Kind {
        match i % 3 {
            0 => Kind::Quick,
            1 => Kind::Sleeping,
            _ => Kind::Failing,
        }
    }
    /// Every job echoes its own name first, so its log can be checked.
    fn script(self, name: &str) -> String {
        match self {
            Kind::Quick => format!("echo {name}"),
            Kind::Sleeping => format!("echo {name}; sleep 1"),
            Kind::Failing => format!("echo {name}; exit 2"),
        }
    }
    fn expected_state(self) -> i64 {
        match self {
            Kind::Quick | Kind::Sleeping => 4,
            Kind::Failing => 5,
        }
    }
}

/// FetchLogs over HTTP: every stored line under `prefix` as (key, data).
fn all_logs(url: &str, prefix: &str) -> Vec<(String, String)> {
    let body = json!({"source": prefix, "matchScope": 2, "maxLines": 100000}).to_string();
    let (st, text) = try_post(url, "/finelog.logging.LogService/FetchLogs", &body).expect("fetch");
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("logs JSON");
    v["entries"]
        .as_array()
        .map(|es| {
            es.iter()
                .map(|e| {
                    (
                        e["key"].as_str().unwrap_or("").to_string(),
                        e["data"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// 1. Crash safety

#[test]
fn kill_9_of_the_controller_mid_submission_loses_nothing() {
    const JOBS: usize = 1000;
    const THREADS: usize = 4;
    let started = Instant::now();
    let mut c = TestCluster::start(&[WorkerSpec::cpu(16), WorkerSpec::cpu(16)]);
    let url = c.url.clone();
    let acked: Arc<Mutex<Vec<usize>>> = Arc::default();
    let uncertain: Arc<Mutex<Vec<usize>>> = Arc::default();
    let n_acked = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for t in 0..THREADS {
        let (url, acked, uncertain, n_acked) = (
            url.clone(),
            acked.clone(),
            uncertain.clone(),
            n_acked.clone(),
        );
        handles.push(std::thread::spawn(move || {
            for i in (t..JOBS).step_by(THREADS) {
                let name = format!("/u/crash-{i:04}");
                let body = launch_body(&name, &Kind::of(i).script(&name), json!({}));
                match try_post(&url, &format!("{SVC}/LaunchJob"), &body) {
                    Ok((200, _)) => {
                        acked.lock().expect("lock").push(i);
                        n_acked.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok((st, b)) if st != 503 => panic!("LaunchJob {name}: HTTP {st}: {b}"),
                    _ => {
                        // Not acknowledged: it may or may not exist. Wait for the controller.
                        uncertain.lock().expect("lock").push(i);
                        let deadline = Instant::now() + Duration::from_secs(30);
                        while Instant::now() < deadline
                            && try_post(&url, &format!("{SVC}/ListWorkers"), "{}").is_err()
                        {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
            }
        }));
    }
    let tasks_on_workers = |c: &TestCluster| -> Vec<u32> {
        ["w0", "w1"]
            .iter()
            .flat_map(|w| child_pids(c.worker_pid(w)))
            .collect()
    };
    wait_until(SHORT, "400 submissions acknowledged, tasks running", || {
        n_acked.load(Ordering::SeqCst) >= 400 && !tasks_on_workers(&c).is_empty()
    });
    c.kill_controller();
    let killed_after = n_acked.load(Ordering::SeqCst);
    // Jobs keep running on the workers meanwhile; their results wait for the new controller:
    // restart it only once a task the killed controller launched has ended.
    let in_flight = tasks_on_workers(&c);
    if in_flight.is_empty() {
        eprintln!("every task had already ended when the controller died");
    } else {
        wait_until(
            SHORT,
            "a task launched before the kill to end while the controller is down",
            || in_flight.iter().any(|p| !alive(*p)),
        );
    }
    c.start_controller_again();
    for h in handles {
        h.join().expect("submitter");
    }
    let acked: BTreeSet<usize> = acked.lock().expect("lock").iter().copied().collect();
    let uncertain: BTreeSet<usize> = uncertain.lock().expect("lock").iter().copied().collect();
    eprintln!(
        "acked {} ({} before the kill), uncertain {:?}",
        acked.len(),
        killed_after,
        uncertain
    );
    assert!(
        killed_after < JOBS && acked.len() > killed_after,
        "the kill happened mid-stream"
    );

    wait_until(
        Duration::from_secs(60),
        "every job terminal and every attempt confirmed",
        || c.unfinished_jobs("/u/crash-") == 0 && c.open_attempts().is_empty(),
    );
    let states: BTreeMap<String, i32> = c
        .jobs("/u/crash-")
        .into_iter()
        .map(|j| (j.job_id.unwrap_or_default(), j.state.unwrap_or_default()))
        .collect();
    // Every acknowledged job is there, and every job (acknowledged or not) ended correctly.
    for i in &acked {
        let name = format!("/u/crash-{i:04}");
        assert!(
            states.contains_key(&name),
            "acknowledged job {name} is lost"
        );
    }
    for (name, st) in &states {
        let i: usize = name["/u/crash-".len()..].parse().expect("index");
        assert!(
            acked.contains(&i) || uncertain.contains(&i),
            "{name} was never submitted"
        );
        assert_eq!(
            *st,
            Kind::of(i).expected_state() as i32,
            "{name} ended in state {st}"
        );
    }
    // No attempt ran twice: one attempt per task, none left open, each ended as its job did
    // (one task per job) and started before it finished.
    let attempts = c.attempts_under("/u/crash-");
    let mut per_task: BTreeMap<&str, usize> = BTreeMap::new();
    for a in &attempts {
        *per_task.entry(a.task_id.as_str()).or_default() += 1;
    }
    let multi: Vec<_> = per_task.iter().filter(|(_, n)| **n > 1).collect();
    assert!(multi.is_empty(), "tasks with several attempts: {multi:?}");
    assert_eq!(
        per_task.len(),
        states.len(),
        "one task per job, each with an attempt"
    );
    for a in &attempts {
        let job = a.task_id.trim_end_matches("/0");
        let i: usize = job["/u/crash-".len()..].parse().expect("index");
        assert_eq!(
            a.state,
            Kind::of(i).expected_state() as i32,
            "{}: attempt ended in state {}",
            a.task_id,
            a.state
        );
        let (Some(started), Some(finished)) = (a.started_at_ms, a.finished_at_ms) else {
            panic!("{}: attempt without a start or end stamp: {a:?}", a.task_id);
        };
        assert!(
            finished >= started,
            "{}: ended before it started: {a:?}",
            a.task_id
        );
    }
    // Logs of finished attempts are intact: each job's name exactly once, from attempt 0.
    let mut seen: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (key, data) in all_logs(&c.url, "/u/crash-") {
        let job = key
            .split_once("/0:")
            .map(|x| x.0.to_string())
            .unwrap_or(key.clone());
        seen.entry(job).or_default().push((key, data));
    }
    for name in states.keys() {
        let lines = seen.get(name).cloned().unwrap_or_default();
        assert_eq!(
            lines,
            vec![(format!("{name}/0:0"), name.clone())],
            "logs of {name}"
        );
    }
    // And through the CLI, for a sample.
    for name in states.keys().step_by(97) {
        assert_eq!(
            log_lines(c.iris(&["job", "logs", name]).ok()),
            vec![name.clone()]
        );
    }
    // The restarted controller still schedules.
    c.submit("after", &[], &["true"]);
    c.wait_job("/u/after", "succeeded");
    eprintln!(
        "crash test: {} jobs in {:.1}s",
        states.len(),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Worker loss

/// A task script that records its pid, then blocks until `$GO` exists.
const BLOCK: &str = "echo $$ >> \"$PIDFILE\"; while [ ! -e \"$GO\" ]; do sleep 0.05; done; echo \"done $IRIS_TASK_ID\"";

fn kill_pids(pids: &[u32]) {
    for p in pids {
        let _ = std::process::Command::new("kill")
            .args(["-9", &p.to_string()])
            .status();
    }
}

/// A controller down for longer than the workers' heartbeat timeout: the workers stop their
/// tasks (WORKER_FAILED), re-register when it is back, and the tasks rerun.
#[test]
fn controller_outage_past_the_heartbeat_timeout_reruns_the_task() {
    let mut c = TestCluster::start(&[WorkerSpec::cpu(16).heartbeat_timeout(2)]);
    let (_, go, pid) = run_blocking(&c, "hb");
    c.kill_controller();
    wait_until(
        SHORT,
        "the worker to stop its task after the heartbeat timeout",
        || !alive(pid),
    );
    c.start_controller_again();
    wait_until(SHORT, "the task to rerun", || {
        c.attempts("/u/hb/0").len() == 2 && c.summary("/u/hb")["tasks"][0]["state"] == "running"
    });
    std::fs::write(&go, "go").expect("go");
    let s = c.wait_job("/u/hb", "succeeded");
    assert_eq!(s["preemption_count"], 1, "{s}");
    let a = c.attempts("/u/hb/0");
    assert_eq!(a[0]["state"], 7, "{a:?}");
    assert!(
        a[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("heartbeat timeout")),
        "{a:?}"
    );
    assert_eq!(a[1]["state"], 4, "{a:?}");
    assert!(
        a[0]["finished_at_ms"].as_i64() <= a[1]["started_at_ms"].as_i64(),
        "{a:?}"
    );
    assert_eq!(
        log_lines(c.iris(&["job", "logs", "/u/hb"]).ok()),
        vec!["done /u/hb/0:1"]
    );
}

/// Submits `/u/<name>` running [`BLOCK`] (until its `GO` file appears), waits until it runs and
/// has recorded its pid; returns the pid file, the go file and the pid.
fn run_blocking(c: &TestCluster, name: &str) -> (std::path::PathBuf, std::path::PathBuf, u32) {
    let pidfile = c.path(&format!("{name}.pids"));
    let go = c.path(&format!("{name}.go"));
    c.submit(
        name,
        &[
            "-e",
            "PIDFILE",
            pidfile.to_str().expect("utf8"),
            "-e",
            "GO",
            go.to_str().expect("utf8"),
        ],
        &["sh", "-c", BLOCK],
    );
    c.wait_tasks(&format!("/u/{name}"), &[(0, "running")]);
    let pid = wait_for(SHORT, "the task to record its pid", || {
        read_pids(&pidfile).first().copied()
    });
    (pidfile, go, pid)
}

/// Submits a 2-replica blocking job on w0 alone, adds w1, and `kill -9`s w0.
fn two_replicas_then_kill_w0(c: &mut TestCluster, job: &str, flags: &[&str]) -> Vec<u32> {
    let pidfile = c.path(&format!("{job}.pids"));
    let go = c.path(&format!("{job}.go"));
    let mut f = vec![
        "--replicas",
        "2",
        "-e",
        "PIDFILE",
        pidfile.to_str().expect("utf8"),
        "-e",
        "GO",
        go.to_str().expect("utf8"),
    ];
    f.extend_from_slice(flags);
    c.submit(job, &f, &["sh", "-c", BLOCK]);
    let s = c.wait_tasks(&format!("/u/{job}"), &[(0, "running"), (1, "running")]);
    for t in s["tasks"].as_array().expect("tasks") {
        assert_eq!(t["worker_id"], "w0", "{s}");
    }
    let orphans = wait_for(SHORT, "both tasks to record their pids", || {
        let p = read_pids(&pidfile);
        (p.len() == 2).then_some(p)
    });
    c.add_worker(&WorkerSpec::cpu(16));
    c.kill_worker("w0");
    orphans
}

#[test]
fn worker_loss_reruns_both_replicas_elsewhere_and_the_job_succeeds() {
    let mut c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let orphans = two_replicas_then_kill_w0(&mut c, "wl", &[]);
    // The reruns on w1 block too: release them once both run there.
    let s = c.wait_tasks("/u/wl", &[(0, "running"), (1, "running")]);
    wait_until(SHORT, "both tasks rerun on w1", || {
        let s = c.summary("/u/wl");
        s["tasks"].as_array().is_some_and(|ts| {
            ts.iter()
                .all(|t| t["worker_id"] == "w1" && t["state"] == "running")
        })
    });
    let _ = s;
    kill_pids(&orphans);
    std::fs::write(c.path("wl.go"), "go").expect("go");
    let s = c.wait_job("/u/wl", "succeeded");
    assert_eq!(s["preemption_count"], 2, "{s}");
    assert_eq!(s["failure_count"], 0, "{s}");
    for t in 0..2 {
        let a = c.attempts(&format!("/u/wl/{t}"));
        assert_eq!(a.len(), 2, "{a:?}");
        assert_eq!(
            (a[0]["worker_id"].clone(), a[0]["state"].clone()),
            (json!("w0"), json!(7))
        );
        assert_eq!(
            (a[1]["worker_id"].clone(), a[1]["state"].clone()),
            (json!("w1"), json!(4))
        );
        assert_eq!(
            log_lines(c.iris(&["task", "logs", &format!("/u/wl/{t}")]).ok()),
            vec![format!("done /u/wl/{t}:1")]
        );
    }
}

#[test]
fn worker_loss_with_preemption_budget_0_fails_the_job_worker_failed() {
    let mut c = TestCluster::start(&[WorkerSpec::cpu(16)]);
    let orphans = two_replicas_then_kill_w0(&mut c, "wl0", &["--max-retries-preemption", "0"]);
    let s = c.wait_job("/u/wl0", "worker_failed");
    kill_pids(&orphans);
    assert_eq!(c.job_request("/u/wl0").max_retries_preemption, Some(0));
    for t in 0..2 {
        let a = c.attempts(&format!("/u/wl0/{t}"));
        assert_eq!(a.len(), 1, "no rerun with budget 0: {a:?}");
        assert_eq!(a[0]["state"], 7, "{a:?}");
    }
    assert_eq!(s["tasks"][0]["state"], "worker_failed", "{s}");
    // Nothing is left running or scheduled for it.
    let live: Vec<_> = s["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter(|t| {
            ["pending", "assigned", "building", "running"]
                .contains(&t["state"].as_str().unwrap_or(""))
        })
        .collect();
    assert!(live.is_empty(), "{live:?}");
}

// ---------------------------------------------------------------------------------------------
// 3. Checkpoints and the rollout record

/// The durable job state: every job's status with its tasks (`GetJobStatus`) and every attempt
/// (`ListAttempts`).
fn durable_state(c: &TestCluster) -> Vec<Value> {
    let mut out: Vec<Value> = job_ids(c).iter().map(|j| c.job_status(j)).collect();
    out.extend(
        c.attempts_under("/")
            .into_iter()
            .map(|a| serde_json::to_value(a).expect("attempt JSON")),
    );
    out
}

fn delete_local_db(c: &TestCluster) {
    for f in [
        "controller.sqlite3",
        "controller.sqlite3-wal",
        "controller.sqlite3-shm",
    ] {
        let _ = std::fs::remove_file(c.state_dir.join(f));
    }
    assert!(!c.state_dir.join("controller.sqlite3").exists());
}

fn job_ids(c: &TestCluster) -> Vec<String> {
    c.jobs("/")
        .into_iter()
        .map(|j| j.job_id.unwrap_or_default())
        .collect()
}

/// `iris cluster controller checkpoint` → the checkpoint's epoch ms.
fn checkpoint(c: &TestCluster, remote: &std::path::Path) -> i64 {
    let o = c.iris(&["cluster", "controller", "checkpoint"]);
    let out = o.ok();
    let path = out
        .trim()
        .strip_prefix("Checkpoint written to ")
        .and_then(|r| r.split_once(' '))
        .map(|x| x.0)
        .unwrap_or_else(|| panic!("unexpected output: {out}"));
    let ms: i64 = path
        .rsplit('/')
        .next()
        .and_then(|m| m.parse().ok())
        .expect("epoch dir");
    assert!(path.ends_with(&format!("controller-state/{ms}")), "{path}");
    assert!(remote
        .join(format!("controller-state/{ms}/controller.sqlite3.zst"))
        .is_file());
    ms
}

fn rollout_record(remote: &std::path::Path) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(remote.join("rollout-record.json")).expect("rollout record"),
    )
    .expect("record JSON")
}

#[test]
fn checkpoint_restore_and_rollback() {
    let remote_dir = tempfile::tempdir().expect("remote");
    let remote = remote_dir.path().join("remote state");
    let remote_url = format!("file://{}", remote.display()).replace(' ', "%20");
    let mut c = TestCluster::start_with_args(
        &[WorkerSpec::cpu(16)],
        None,
        &["--remote-state-dir", &remote_url],
    );
    c.submit("a", &[], &["echo", "a"]);
    c.submit("b", &[], &["sh", "-c", "exit 3"]);
    c.wait_job("/u/a", "succeeded");
    c.wait_job("/u/b", "failed");
    let before = durable_state(&c);
    let cp1 = checkpoint(&c, &remote);
    assert_eq!(c.last_checkpoint(), Some(cp1));
    c.submit("later", &[], &["echo", "later"]);
    c.wait_job("/u/later", "succeeded");

    // Lose the local DB: the newest checkpoint comes back, exactly.
    c.kill_controller();
    delete_local_db(&c);
    c.start_controller_again();
    assert_eq!(durable_state(&c), before);
    assert_eq!(job_ids(&c), vec!["/u/a", "/u/b"]);
    assert_eq!(c.last_checkpoint(), Some(cp1));
    // Logs are not part of a checkpoint and survive in the local state dir.
    assert_eq!(log_lines(c.iris(&["job", "logs", "/u/a"]).ok()), vec!["a"]);
    c.submit("c", &[], &["echo", "c"]);
    c.wait_job("/u/c", "succeeded");

    // `restart` checkpoints and records a pending rollout; the next start commits it.
    let o = c.iris(&[
        "cluster",
        "controller",
        "restart",
        "--remote-state-dir",
        &remote_url,
        "--image",
        "v2",
    ]);
    assert!(
        o.ok().contains("does not restart the daemon"),
        "{}",
        o.stdout
    );
    let rec = rollout_record(&remote);
    assert_eq!(rec["phase"], "pending");
    assert_eq!(rec["image"], "v2");
    let cp2: i64 = rec["rollback_checkpoint"]
        .as_str()
        .and_then(|s| s.strip_prefix("controller-state/"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{rec}"));
    assert!(cp2 > cp1);
    c.submit("d", &[], &["echo", "d"]);
    c.wait_job("/u/d", "succeeded");
    c.restart_controller();
    assert_eq!(rollout_record(&remote)["phase"], "committed");
    assert_eq!(job_ids(&c), vec!["/u/a", "/u/b", "/u/c", "/u/d"]);

    // Rollback: the next start restores cp2 once and records rolled_back.
    c.iris(&[
        "cluster",
        "controller",
        "rollback",
        "--remote-state-dir",
        &remote_url,
    ])
    .ok();
    assert_eq!(rollout_record(&remote)["phase"], "rollback_requested");
    c.restart_controller();
    let rec = rollout_record(&remote);
    assert_eq!(rec["phase"], "rolled_back", "{rec}");
    assert_eq!(rec["previous_image"], "");
    assert_eq!(job_ids(&c), vec!["/u/a", "/u/b", "/u/c"], "cp2 has no /u/d");
    c.submit("e", &[], &["echo", "e"]);
    c.wait_job("/u/e", "succeeded");
    c.restart_controller();
    assert_eq!(
        job_ids(&c),
        vec!["/u/a", "/u/b", "/u/c", "/u/e"],
        "a rolled-back record is not restored again"
    );

    // An explicit checkpoint: with no local DB, --restore-checkpoint picks cp1 over the newest.
    c.kill_controller();
    delete_local_db(&c);
    let cp1_name = format!("controller-state/{cp1}");
    c.set_controller_args(&[
        "--remote-state-dir",
        &remote_url,
        "--restore-checkpoint",
        &cp1_name,
    ]);
    c.start_controller_again();
    assert_eq!(durable_state(&c), before);
    // With a local DB present, an explicit restore is refused rather than overwriting it.
    c.kill_controller();
    let o = std::process::Command::new(IRIS)
        .args(["cluster", "controller", "serve", "--state-dir"])
        .arg(&c.state_dir)
        .args(["--bind", "127.0.0.1:0", "--remote-state-dir", &remote_url])
        .args(["--restore-checkpoint", &cp1_name])
        .output()
        .expect("serve");
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("already exists") && err.contains("move it aside"),
        "{err}"
    );
}

#[test]
fn periodic_checkpoints_are_pruned_by_age() {
    let remote_dir = tempfile::tempdir().expect("remote");
    let remote = remote_dir.path().to_path_buf();
    // The remote state dir comes from the cluster config's `storage` section.
    let yaml = format!(
        "storage:\n  remote_state_dir: {}\n",
        serde_json::to_string(remote.to_str().expect("utf8")).expect("quote")
    );
    let c = TestCluster::start_with_args(
        &[],
        Some(&yaml),
        &["--checkpoint-interval", "0.3", "--checkpoint-max-age", "1"],
    );
    let dirs = || -> Vec<i64> {
        let mut v: Vec<i64> = std::fs::read_dir(remote.join("controller-state"))
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let first = wait_for(SHORT, "several periodic checkpoints", || {
        let d = dirs();
        (c.last_checkpoint().is_some() && d.len() >= 2).then_some(d)
    });
    // The checkpoints seen first age out: later periodic checkpoints prune them.
    wait_until(SHORT, "the first checkpoints to be pruned", || {
        let d = dirs();
        !d.is_empty() && first.iter().all(|ms| !d.contains(ms))
    });
    // Each checkpoint prunes before it is recorded in meta, so once `last` is recorded no other
    // directory is more than the max age (1 s) older than it; later checkpoints only add newer
    // directories and prune more.
    let last = c.last_checkpoint().expect("a checkpoint was recorded");
    let d = dirs();
    assert!(
        d.contains(&last) || d.iter().any(|ms| *ms > last),
        "the last recorded checkpoint {last} is gone with nothing newer: {d:?}"
    );
    assert!(
        last > *first.iter().max().expect("first checkpoints"),
        "no checkpoint after {first:?}"
    );
    assert!(
        d.iter().all(|ms| *ms >= last - 1000),
        "directories older than the max age before checkpoint {last} remain: {d:?}"
    );
    // Periodic checkpoints start at least 0.3 s apart: at most four fit in the max age up to
    // `last`, plus one newer still being written.
    assert!(d.len() <= 6, "{d:?}");
}

// ---------------------------------------------------------------------------------------------
// 4. Migrations: a DB from a newer Iris is refused with a clear message

#[test]
fn serve_refuses_a_db_written_by_a_newer_iris() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("controller.sqlite3");
    iris_store::testing::record_migration(&db, "9999_from_the_future").expect("create DB");
    let mut serve = std::process::Command::new(IRIS)
        .args(["cluster", "controller", "serve", "--state-dir"])
        .arg(dir.path())
        .args(["--bind", "127.0.0.1:0"])
        .env_remove("IRIS_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    // It exits on its own instead of serving (the timeout only bounds a hang).
    let status = wait_exit(
        &mut serve,
        Duration::from_secs(60),
        "serve to refuse the DB",
    );
    assert_eq!(status.code(), Some(1));
    let mut err = String::new();
    serve
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    assert!(
        err.contains("newer Iris")
            && err.contains("9999_from_the_future")
            && err.contains("upgrade this binary or restore an older checkpoint")
            && err.contains("controller.sqlite3"),
        "{err}"
    );
    assert!(
        !dir.path().join("controller.url").exists(),
        "it never served"
    );
}

/// Issue 18, acceptance 1 (first half): a controller restarted (kill -9) on its state dir after
/// its workers died too gives no work to those workers: 200 jobs submitted before any new worker
/// comes wait for one, and none is ever assigned to a worker of the previous run.
#[test]
fn a_restarted_controller_gives_nothing_to_the_workers_of_its_previous_run() {
    let mut c = TestCluster::start(&[WorkerSpec::cpu(4)]);
    c.kill_controller();
    c.kill_worker("w0");
    c.start_controller_again();
    for i in 0..200 {
        let (code, body) = try_post(
            &c.url,
            "/iris.cluster.ControllerService/LaunchJob",
            &launch_body(&format!("/u/after-restart-{i}"), "true", json!({})),
        )
        .expect("submit");
        assert_eq!(code, 200, "{body}");
    }
    let started = Instant::now();
    c.add_worker(&WorkerSpec::cpu(4));
    let registered = Instant::now();
    // One ListJobs a poll (not 200 reads), so the figure measures the cluster, not the test.
    wait_until(Duration::from_secs(120), "all 200 jobs to succeed", || {
        c.job_counts("/u/after-restart-")
            .get(&JobState::Succeeded)
            .copied()
            == Some(200)
    });
    println!(
        "200 jobs succeeded {:.2} s after the new worker registered ({:.2} s after it was started)",
        registered.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let attempts = c.attempts_under("/u/after-restart-");
    assert_eq!(
        attempts.len(),
        200,
        "one attempt each: none lost to a dead worker"
    );
    assert!(
        attempts.iter().all(|a| a.worker_id == "w1"),
        "attempts went to {:?}",
        attempts
            .iter()
            .map(|a| &a.worker_id)
            .collect::<BTreeSet<_>>()
    );
}

/// Issue 18, acceptance 2: a second controller on a state dir in use refuses at once, naming
/// the first one's PID and address; the first keeps serving.
#[test]
fn a_second_controller_on_the_same_state_dir_refuses_and_names_the_first() {
    let c = TestCluster::start(&[WorkerSpec::cpu(2)]);
    let state = c.state_dir.to_string_lossy().into_owned();
    let second = iris_in(
        &c.ws,
        &[],
        &[
            "cluster",
            "controller",
            "serve",
            "--state-dir",
            &state,
            "--bind",
            "127.0.0.1:0",
        ],
    );
    assert_ne!(second.code, 0, "{}{}", second.stdout, second.stderr);
    let pid = c.controller_pid().to_string();
    assert!(
        second.stderr.contains(&format!("pid {pid}")) && second.stderr.contains(&c.url),
        "{}",
        second.stderr
    );
    // A second local cluster on it is refused the same way.
    let third = iris_in(
        &c.ws,
        &[],
        &["cluster", "start", "--local", "--state-dir", &state],
    );
    assert_ne!(third.code, 0);
    assert!(
        third.stderr.contains(&format!("pid {pid}")),
        "{}",
        third.stderr
    );
    let job = c.submit("still-serving", &[], &["true"]);
    wait_until(
        Duration::from_secs(60),
        "the first controller to run a job",
        || c.job_state(&job).as_deref() == Some("succeeded"),
    );
}

/// Issue 18, acceptance 1 (second half): SIGTERM stops `cluster start --local` cleanly: exit 0,
/// its tasks' processes gone, the recorded URL removed.
#[test]
fn sigterm_stops_a_local_cluster_and_its_tasks() {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let mut cluster = Daemon::spawn(
        dir.path(),
        &[],
        &[
            "cluster",
            "start",
            "--local",
            "--state-dir",
            &state.to_string_lossy(),
        ],
        &dir.path().join("cluster.log"),
    );
    let url_file = state.join("controller.url");
    let url = wait_for(Duration::from_secs(60), "the local cluster's URL", || {
        std::fs::read_to_string(&url_file)
            .ok()
            .filter(|u| !u.trim().is_empty())
    });
    let marker = format!("iris-sigterm-{}", std::process::id());
    let out = iris_in(
        dir.path(),
        &[],
        &[
            "--controller-url",
            url.trim(),
            "job",
            "run",
            "--no-wait",
            "--",
            "sh",
            "-c",
            &format!("sleep 600; : {marker}"),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let running = |m: &str| {
        std::process::Command::new("pgrep")
            .args(["-f", m])
            .output()
            .map(|o| !o.stdout.is_empty())
            .unwrap_or(false)
    };
    wait_until(
        Duration::from_secs(60),
        "the task's process to start",
        || running(&marker),
    );
    let t = Instant::now();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &cluster.pid().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let status = cluster.wait_exit(Duration::from_secs(60)).expect("exited");
    println!(
        "cluster start --local exited {:.2}s after SIGTERM",
        t.elapsed().as_secs_f64()
    );
    assert!(status.success(), "{status}");
    wait_until(
        Duration::from_secs(10),
        "the task's process to be gone",
        || !running(&marker),
    );
    assert!(!url_file.exists(), "the recorded URL is removed");
}

/// A directory of fixtures, one per released schema, each written by that release's binary
/// (`scripts/make-upgrade-fixture.sh`): its controller DB and a checkpoint of it.
fn upgrade_fixtures() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upgrade");
    let mut v: Vec<_> = std::fs::read_dir(&root)
        .expect("fixtures/upgrade")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("controller.sqlite3").is_file())
        .collect();
    v.sort();
    assert!(
        !v.is_empty(),
        "no upgrade fixtures under {}",
        root.display()
    );
    v
}

/// Starts `cluster controller serve` on `state` (plus `extra` flags) and a worker; returns the
/// daemons and the controller's URL.
fn serve_with_worker(
    dir: &std::path::Path,
    state: &std::path::Path,
    extra: &[&str],
) -> (Daemon, Daemon, String) {
    let mut args = vec![
        "cluster",
        "controller",
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--state-dir",
    ];
    let state_s = state.to_string_lossy().into_owned();
    args.push(&state_s);
    args.extend_from_slice(extra);
    let ctl = Daemon::spawn(
        dir,
        &[],
        &args,
        &dir.join(format!("ctl-{}.log", extra.len())),
    );
    let url = wait_for(
        Duration::from_secs(60),
        "the upgraded controller to start",
        || {
            std::fs::read_to_string(state.join("controller.url"))
                .ok()
                .map(|u| u.trim().to_string())
                .filter(|u| !u.is_empty())
        },
    );
    let cache = dir.join(format!("cache-{}", extra.len()));
    let cache_s = cache.to_string_lossy().into_owned();
    let worker = Daemon::spawn(
        dir,
        &[],
        &[
            "--controller-url",
            &url,
            "worker",
            "serve",
            "--worker-id",
            "w-upgraded",
            "--cpu",
            "2",
            "--cache-dir",
            &cache_s,
        ],
        &dir.join(format!("worker-{}.log", extra.len())),
    );
    (ctl, worker, url)
}

/// Issue 18, upgrades (acceptance 4): the DB of every earlier schema, as that release wrote
/// it, migrates forward one step at a time with integrity and foreign keys intact after each;
/// the current controller serves it in place (old jobs with their states, new jobs run); and a
/// checkpoint that release took restores into an empty state dir.
#[test]
fn a_db_and_a_checkpoint_from_every_earlier_schema_open_and_migrate() {
    let names = iris_store::testing::migration_names();
    for fixture in upgrade_fixtures() {
        let dir = tempfile::tempdir().expect("dir");
        // Every step.
        let stepwise = dir.path().join("stepwise.sqlite3");
        std::fs::copy(fixture.join("controller.sqlite3"), &stepwise).expect("copy");
        let applied = iris_store::testing::migrate_step_by_step(&stepwise)
            .unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
        assert!(
            !applied.is_empty(),
            "{}: nothing to migrate",
            fixture.display()
        );
        assert_eq!(applied.last().map(String::as_str), names.last().copied());

        // In place.
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).expect("state");
        for db in ["controller.sqlite3", "logs.sqlite3"] {
            std::fs::copy(fixture.join(db), state.join(db)).expect("copy");
        }
        let (ctl, worker, url) = serve_with_worker(dir.path(), &state, &[]);
        let list = iris_in(dir.path(), &[], &["--controller-url", &url, "job", "list"]);
        assert_eq!(list.code, 0, "{}", list.stderr);
        for (job, state) in [
            ("/fixture/upgrade-ok", "succeeded"),
            ("/fixture/upgrade-fail", "failed"),
        ] {
            assert!(
                list.stdout
                    .lines()
                    .any(|l| l.starts_with(job) && l.contains(state)),
                "{job} {state}: {}",
                list.stdout
            );
        }
        let logs = iris_in(
            dir.path(),
            &[],
            &[
                "--controller-url",
                &url,
                "job",
                "logs",
                "/fixture/upgrade-ok",
            ],
        );
        assert!(
            logs.stdout.contains("from-the-old-release"),
            "{}{}",
            logs.stdout,
            logs.stderr
        );
        // The old release's events, reached by the task chains migration 0014 built.
        let events = iris_in(
            dir.path(),
            &[],
            &[
                "--controller-url",
                &url,
                "task",
                "events",
                "/fixture/upgrade-fail/0",
            ],
        );
        assert!(
            ["TaskAssigned", "TaskFailed"]
                .iter()
                .all(|r| events.stdout.contains(r)),
            "{}: {}{}",
            fixture.display(),
            events.stdout,
            events.stderr
        );
        let run = iris_in(
            dir.path(),
            &[],
            &[
                "--controller-url",
                &url,
                "job",
                "run",
                "--user",
                "fixture",
                "--",
                "echo",
                "after-the-upgrade",
            ],
        );
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        drop(worker);
        drop(ctl);

        // Its checkpoint, restored by this binary into an empty state dir.
        let restored = dir.path().join("restored");
        let remote = dir.path().join("remote");
        copy_tree(&fixture.join("remote-state"), &remote);
        let remote_url = format!("file://{}", remote.display());
        let (_ctl, _worker, url) =
            serve_with_worker(dir.path(), &restored, &["--remote-state-dir", &remote_url]);
        let list = iris_in(dir.path(), &[], &["--controller-url", &url, "job", "list"]);
        assert!(
            list.stdout.contains("/fixture/upgrade-ok")
                && list.stdout.contains("/fixture/upgrade-fail"),
            "{}{}",
            list.stdout,
            list.stderr
        );
    }
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read fixture dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_tree(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).expect("copy");
        }
    }
}

/// A tmpfs mounted for one test (root only, as the CI machine is), unmounted when dropped.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(at: &std::path::Path, mib: u32) -> SmallDisk {
        std::fs::create_dir_all(at).expect("mount point");
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .status()
            .expect("run mount");
        assert!(
            st.success(),
            "the full-disk test mounts a small tmpfs and needs root (CAP_SYS_ADMIN) for it"
        );
        SmallDisk(at.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Writes zeros to `path` until the file system says it is full.
fn fill(path: &std::path::Path) {
    let mut f = std::fs::File::create(path).expect("filler");
    // Big writes until one fails, then ever smaller ones, down to the last free page.
    let mut size = 1usize << 20;
    while size >= 512 {
        let chunk = vec![0u8; size];
        while f.write_all(&chunk).is_ok() {}
        size /= 4;
    }
    let _ = f.sync_all();
}

/// Issue 18, full disk: with the state dir's file system full, a submission fails at once with
/// RESOURCE_EXHAUSTED naming the disk and nothing half-written; a task already running keeps
/// running (its log lines are dropped, not blocking it); when space returns everything resumes;
/// the DB passes `integrity_check`.
#[test]
fn a_full_state_disk_refuses_submissions_clearly_and_recovers() {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let _disk = SmallDisk::mount(&state, 48);
    let (_ctl, _worker, url) = serve_with_worker(dir.path(), &state, &[]);
    // The CLI runs from a workspace with some data in it: each submission carries a bundle the
    // controller must store.
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("ws");
    let noise = |n: usize, seed: u64| -> Vec<u8> {
        (0..n as u64)
            .map(|i| ((i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
            .collect()
    };
    std::fs::write(ws.join("data.bin"), noise(256 << 10, 1)).expect("ws data");
    let iris = |args: &[&str]| {
        let mut a = vec!["--controller-url", url.as_str()];
        a.extend_from_slice(args);
        iris_in(&ws, &[], &a)
    };
    let long = iris(&[
        "job",
        "run",
        "--no-wait",
        "--user",
        "u",
        "--job-name",
        "through-the-full-disk",
        "--",
        "sh",
        "-c",
        "for i in $(seq 1 40); do echo tick $i; sleep 0.1; done; echo done-ticking",
    ]);
    assert_eq!(long.code, 0, "{}", long.stderr);
    wait_until(Duration::from_secs(60), "the long task to run", || {
        iris(&["job", "list"])
            .stdout
            .lines()
            .any(|l| l.starts_with("/u/through-the-full-disk") && l.contains("running"))
    });

    let filler = state.join("filler");
    fill(&filler);
    std::fs::write(ws.join("changed.bin"), noise(64 << 10, 2)).expect("ws data");
    let refused = iris(&[
        "job",
        "run",
        "--no-wait",
        "--user",
        "u",
        "--job-name",
        "on-a-full-disk",
        "--",
        "true",
    ]);
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("resource_exhausted") && refused.stderr.contains("full disk"),
        "{}",
        refused.stderr
    );
    let listed = iris(&["job", "list"]);
    assert!(
        !listed.stdout.contains("/u/on-a-full-disk"),
        "nothing half-written: {}",
        listed.stdout
    );

    std::fs::remove_file(&filler).expect("free the space");
    wait_until(Duration::from_secs(120), "the long task to finish", || {
        iris(&["job", "list"])
            .stdout
            .lines()
            .any(|l| l.starts_with("/u/through-the-full-disk") && l.contains("succeeded"))
    });
    let after = iris(&[
        "job",
        "run",
        "--user",
        "u",
        "--job-name",
        "after-the-disk",
        "--",
        "echo",
        "space-again",
    ]);
    assert_eq!(after.code, 0, "{}{}", after.stdout, after.stderr);
    assert!(
        format!("{}{}", after.stdout, after.stderr).contains("space-again"),
        "{}{}",
        after.stdout,
        after.stderr
    );
    iris_store::testing::integrity_check(&state.join("controller.sqlite3"))
        .expect("the DB is intact");
}

/// Issue 18, freezes: a controller frozen (SIGSTOP) past its workers' heartbeat timeout and then
/// resumed loses no task and never has two live attempts of one: the worker stops the attempt
/// when its lease on the controller lapses (it has not been reconciled for `heartbeat_timeout`),
/// the resumed controller learns it ended and reruns it, and the rerun starts only after the
/// first attempt finished.
#[test]
fn a_frozen_and_resumed_controller_loses_no_task_and_runs_none_twice() {
    let c = TestCluster::start(&[WorkerSpec::cpu(16).heartbeat_timeout(2)]);
    let (pidfile, go, pid) = run_blocking(&c, "freeze");
    let ctl = c.controller_pid().to_string();
    let signal = |sig: &str| {
        let st = std::process::Command::new("kill")
            .args([sig, &ctl])
            .status()
            .expect("kill");
        assert!(st.success(), "kill {sig}");
    };
    // Jobs acknowledged just before the freeze are kept and run after it.
    let acked: Vec<String> = (0..20)
        .map(|i| c.submit(&format!("before-freeze-{i}"), &[], &["true"]))
        .collect();
    signal("-STOP");
    wait_until(
        SHORT,
        "the worker to stop its attempt once its lease on the controller lapsed",
        || !alive(pid),
    );
    signal("-CONT");
    wait_until(SHORT, "the task to rerun", || {
        c.attempts("/u/freeze/0").len() == 2
            && c.summary("/u/freeze")["tasks"][0]["state"] == "running"
    });
    std::fs::write(&go, "go").expect("go");
    c.wait_job("/u/freeze", "succeeded");
    let a = c.attempts("/u/freeze/0");
    assert_eq!(a.len(), 2, "{a:?}");
    assert!(
        a[0]["finished_at_ms"].as_i64() <= a[1]["started_at_ms"].as_i64(),
        "the rerun started before the first attempt ended: {a:?}"
    );
    assert_eq!(read_pids(&pidfile).len(), 2, "each attempt ran once");
    assert_eq!(
        log_lines(c.iris(&["job", "logs", "/u/freeze"]).ok()),
        vec!["done /u/freeze/0:1"]
    );
    for j in &acked {
        c.wait_job(j, "succeeded");
    }
    iris_store::testing::integrity_check(&c.state_dir.join("controller.sqlite3"))
        .expect("integrity_check");
}
