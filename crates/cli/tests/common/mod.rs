//! Test harness: a real controller and real workers, each its own `iris` child process on
//! 127.0.0.1 with ephemeral ports, driven through the real `iris` CLI.
//!
//! Every process started here is stopped when the `TestCluster` is dropped. Nothing sleeps for
//! synchronisation: tests wait on observable state with [`wait_until`] / [`wait_for`].

#![allow(dead_code)] // each test uses a different subset

use iris_proto::job::JobState;
use iris_proto::{cluster, inspect};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Job states a job never leaves.
pub const JOB_FINAL: [JobState; 5] = [
    JobState::Succeeded,
    JobState::Failed,
    JobState::Killed,
    JobState::WorkerFailed,
    JobState::Unschedulable,
];

/// The `iris` binary under test.
pub const IRIS: &str = env!("CARGO_BIN_EXE_iris");

/// How long a cluster may take to come up, or a job to reach an expected state.
pub const STARTUP: Duration = Duration::from_secs(30);
pub const SHORT: Duration = Duration::from_secs(30);

/// Polls `f` every 50 ms until it returns true; panics naming `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    wait_for(timeout, what, || f().then_some(()));
}

/// Polls `f` every 50 ms until it returns `Some`; panics naming `what` after `timeout`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for `child` to exit and returns its status; after `timeout` kills it and panics naming
/// `what` (the timeout only bounds a failure).
#[track_caller]
pub fn wait_exit(child: &mut Child, timeout: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A finished CLI invocation.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// A finished command's exit code and output.
    pub fn of(o: Output) -> Out {
        Out::from(o)
    }

    fn from(o: Output) -> Out {
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// Asserts exit 0 and returns stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert_eq!(
            self.code, 0,
            "expected success\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        &self.stdout
    }

    /// Asserts exit 0 and returns the job id `iris job run --no-wait` printed (its last line;
    /// a bundled submission prints what it bundled first).
    #[track_caller]
    #[allow(dead_code)]
    pub fn job_id(&self) -> String {
        self.ok()
            .trim()
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string()
    }

    /// Asserts a non-zero exit and returns stderr.
    #[track_caller]
    pub fn err(&self) -> &str {
        assert_ne!(
            self.code, 0,
            "expected failure\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        &self.stderr
    }
}

/// A worker to start: `iris worker serve --cpu C --memory 16GB [--device D] [--attribute k=v]...`.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    pub cpu: u32,
    pub device: Option<String>,
    pub attributes: Vec<(String, String)>,
    /// `--heartbeat-timeout` seconds (default 30).
    pub heartbeat_timeout: u32,
}

impl WorkerSpec {
    pub fn cpu(cpu: u32) -> WorkerSpec {
        WorkerSpec {
            cpu,
            device: None,
            attributes: Vec::new(),
            heartbeat_timeout: 30,
        }
    }
    pub fn heartbeat_timeout(mut self, secs: u32) -> WorkerSpec {
        self.heartbeat_timeout = secs;
        self
    }
    pub fn device(mut self, d: &str) -> WorkerSpec {
        self.device = Some(d.to_string());
        self
    }
    pub fn attr(mut self, k: &str, v: &str) -> WorkerSpec {
        self.attributes.push((k.to_string(), v.to_string()));
        self
    }
}

struct Proc {
    name: String,
    child: Child,
}

/// A controller plus workers, each a separate `iris` process, in a private temp dir.
pub struct TestCluster {
    root: tempfile::TempDir,
    pub state_dir: PathBuf,
    /// Working directory for CLI invocations (so `job run` bundles an empty tree).
    pub ws: PathBuf,
    pub url: String,
    controller: Proc,
    /// Extra `cluster controller serve` arguments, used again on every restart.
    controller_args: Vec<String>,
    workers: Vec<Proc>,
    next_worker: usize,
    /// Sent as `MARIN_CLUSTER_TOKEN` by [`TestCluster::iris`] and friends.
    cli_token: Option<String>,
}

fn stop(p: &mut Proc) {
    if matches!(p.child.try_wait(), Ok(Some(_))) {
        return;
    }
    // SIGTERM first: a worker kills its tasks' process groups on a clean shutdown.
    let _ = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if matches!(p.child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = p.child.kill();
    let _ = p.child.wait();
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for w in &mut self.workers {
            stop(w);
        }
        stop(&mut self.controller);
        if std::thread::panicking() {
            // Leave the daemons' own logs in the test output for diagnosis.
            for name in std::iter::once("controller".to_string())
                .chain(self.workers.iter().map(|w| w.name.clone()))
            {
                let p = self.root.path().join(format!("{name}.log"));
                if let Ok(s) = std::fs::read_to_string(&p) {
                    let tail: Vec<&str> = s.lines().rev().take(40).collect();
                    eprintln!("---- {name}.log (last lines) ----");
                    for l in tail.into_iter().rev() {
                        eprintln!("{l}");
                    }
                }
            }
        }
    }
}

/// A cluster's private temp dir with its state dir and a small workspace (for `job run`).
fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = tempfile::Builder::new()
        .prefix("iris-it-")
        .tempdir()
        .expect("temp dir");
    let state_dir = root.path().join("state");
    let ws = root.path().join("ws");
    std::fs::create_dir_all(&state_dir).expect("state dir");
    std::fs::create_dir_all(&ws).expect("ws dir");
    std::fs::write(ws.join("README"), "integration test workspace\n").expect("ws file");
    (root, state_dir, ws)
}

fn base_cmd(cwd: &Path) -> Command {
    scrub(Command::new(IRIS), cwd)
}

/// `iris` inside network namespace `ns` (`ip netns exec` execs it, so the child's pid is
/// iris's own), with the same clean environment as every other test invocation.
pub fn netns_cmd(ns: &str, cwd: &Path) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, IRIS]);
    scrub(c, cwd)
}

fn scrub(mut c: Command, cwd: &Path) -> Command {
    c.current_dir(cwd)
        .env_remove("IRIS_CONTROLLER_URL")
        .env_remove("IRIS_TASK_ID")
        .env_remove("IRIS_STATE_DIR")
        .env_remove("IRIS_USER")
        .env_remove("IRIS_LOG")
        .env_remove("MARIN_CLUSTER_TOKEN")
        .stdin(Stdio::null());
    c
}

impl TestCluster {
    /// Starts a controller (`--worker-grace 2`) and the given workers, and waits until every
    /// worker is listed as healthy.
    pub fn start(workers: &[WorkerSpec]) -> TestCluster {
        TestCluster::start_with_config(workers, None)
    }

    /// Like [`TestCluster::start`], with a cluster YAML whose scale groups declare capacity for
    /// the submit-time feasibility check.
    pub fn start_with_config(workers: &[WorkerSpec], config_yaml: Option<&str>) -> TestCluster {
        TestCluster::start_with_args(workers, config_yaml, &[])
    }

    /// Like [`TestCluster::start_with_config`], with extra `cluster controller serve` arguments
    /// (kept for restarts).
    pub fn start_with_args(
        workers: &[WorkerSpec],
        config_yaml: Option<&str>,
        controller_args: &[&str],
    ) -> TestCluster {
        TestCluster::start_bound("127.0.0.1:0", workers, config_yaml, controller_args)
    }

    /// Like [`TestCluster::start_with_args`], with the controller bound to `bind` (a config
    /// that names the controller's own address needs to know it in advance).
    #[allow(dead_code)]
    pub fn start_bound(
        bind: &str,
        workers: &[WorkerSpec],
        config_yaml: Option<&str>,
        controller_args: &[&str],
    ) -> TestCluster {
        let (root, state_dir, ws) = scratch();
        let log = std::fs::File::create(root.path().join("controller.log")).expect("log file");
        let mut cmd = base_cmd(root.path());
        cmd.args(["cluster", "controller", "serve", "--state-dir"])
            .arg(&state_dir)
            .args(["--bind", bind, "--worker-grace", "2"]);
        // The config goes with the other `serve` arguments, so restarts read it again (a test
        // may rewrite `cluster.yaml` before a restart).
        let mut controller_args: Vec<String> =
            controller_args.iter().map(|s| s.to_string()).collect();
        if let Some(y) = config_yaml {
            let p = root.path().join("cluster.yaml");
            std::fs::write(&p, y).expect("config");
            controller_args.push("--config".into());
            controller_args.push(p.display().to_string());
        }
        cmd.args(&controller_args);
        let child = cmd
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn controller");
        let mut tc = TestCluster::attach(root, state_dir, ws, child, controller_args);
        let ids: Vec<String> = workers.iter().map(|w| tc.spawn_worker(w)).collect();
        tc.wait_workers(&ids);
        tc
    }

    /// `iris cluster start --local --config <config_yaml>`: the controller and the config's
    /// local workers in one process, as a user starts them; waits until `workers` are healthy.
    /// (Restarting it is not supported.)
    pub fn start_local(config_yaml: &str, workers: usize) -> TestCluster {
        TestCluster::start_local_with_args(config_yaml, workers, &[])
    }

    /// Like [`TestCluster::start_local`], with extra `cluster start` arguments.
    pub fn start_local_with_args(config_yaml: &str, workers: usize, args: &[&str]) -> TestCluster {
        let (root, state_dir, ws) = scratch();
        let cfg = root.path().join("cluster.yaml");
        std::fs::write(&cfg, config_yaml).expect("config");
        let log = std::fs::File::create(root.path().join("controller.log")).expect("log file");
        let child = base_cmd(root.path())
            .args(["cluster", "start", "--local", "--config"])
            .arg(&cfg)
            .arg("--state-dir")
            .arg(&state_dir)
            .args(args)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn local cluster");
        let tc = TestCluster::attach(root, state_dir, ws, child, Vec::new());
        wait_until(STARTUP, "the local workers to register", || {
            tc.listed_workers().len() == workers
        });
        tc
    }

    /// Waits for a just-spawned controller process to record its address and answer.
    fn attach(
        root: tempfile::TempDir,
        state_dir: PathBuf,
        ws: PathBuf,
        child: Child,
        controller_args: Vec<String>,
    ) -> TestCluster {
        let mut tc = TestCluster {
            root,
            state_dir,
            ws,
            url: String::new(),
            controller: Proc {
                name: "controller".into(),
                child,
            },
            controller_args,
            workers: Vec::new(),
            next_worker: 0,
            cli_token: None,
        };
        let url_file = tc.state_dir.join("controller.url");
        tc.url = wait_for(STARTUP, "controller.url to be written", || {
            if let Ok(Some(st)) = tc.controller.child.try_wait() {
                panic!("controller exited early: {st}");
            }
            std::fs::read_to_string(&url_file)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| {
                    s.starts_with("http://127.0.0.1:")
                        && s.rsplit(':')
                            .next()
                            .is_some_and(|p| p.parse::<u16>().is_ok())
                })
        });
        wait_until(STARTUP, "controller to answer list-workers", || {
            tc.iris(&["rpc", "controller", "list-workers"]).code == 0
        });
        tc
    }

    /// Stops the controller (SIGTERM) and starts it again on the same state dir and address;
    /// waits until it answers and every running worker is healthy again.
    pub fn restart_controller(&mut self) {
        stop(&mut self.controller);
        self.start_controller_again();
    }

    /// Sends SIGTERM to the controller process and waits (up to `timeout`) for it to exit.
    pub fn terminate_controller(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.controller.child.id().to_string()])
            .status();
        wait_exit(
            &mut self.controller.child,
            timeout,
            "the controller to exit on SIGTERM",
        )
    }

    /// `kill -9` the controller (no chance to flush or shut down).
    pub fn kill_controller(&mut self) {
        let _ = self.controller.child.kill();
        let _ = self.controller.child.wait();
    }

    /// The controller's pid.
    pub fn controller_pid(&self) -> u32 {
        self.controller.child.id()
    }

    /// Replaces the extra `serve` arguments used by the next (re)start.
    pub fn set_controller_args(&mut self, args: &[&str]) {
        self.controller_args = args.iter().map(|s| s.to_string()).collect();
    }

    /// Starts the (stopped or killed) controller again on the same state dir and address; waits
    /// until it answers and every running worker is healthy again.
    pub fn start_controller_again(&mut self) {
        let addr = self.url.trim_start_matches("http://").to_string();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.root.path().join("controller.log"))
            .expect("log file");
        let child = base_cmd(self.root.path())
            .args(["cluster", "controller", "serve", "--state-dir"])
            .arg(&self.state_dir)
            .args(["--bind", &addr, "--worker-grace", "2"])
            .args(&self.controller_args)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn controller");
        self.controller = Proc {
            name: "controller".into(),
            child,
        };
        wait_until(STARTUP, "restarted controller to answer", || {
            if let Ok(Some(st)) = self.controller.child.try_wait() {
                panic!("controller exited early: {st}");
            }
            self.iris(&["rpc", "controller", "list-workers"]).code == 0
        });
        let live: Vec<String> = self
            .workers
            .iter_mut()
            .filter_map(|w| matches!(w.child.try_wait(), Ok(None)).then(|| w.name.clone()))
            .collect();
        self.wait_workers(&live);
    }

    /// Starts one more worker and waits until it is registered; returns its id.
    pub fn add_worker(&mut self, w: &WorkerSpec) -> String {
        let id = self.spawn_worker(w);
        self.wait_workers(std::slice::from_ref(&id));
        id
    }

    /// `iris worker simulate --id-prefix PREFIX <args>`: a fleet of simulated workers in one
    /// process (stopped with the cluster); waits until `count` of them are healthy.
    pub fn add_simulated_fleet(&mut self, prefix: &str, count: usize, args: &[&str]) {
        let name = format!("fleet-{prefix}");
        let log =
            std::fs::File::create(self.root.path().join(format!("{name}.log"))).expect("log file");
        let mut cmd = base_cmd(self.root.path());
        cmd.args(["--controller-url", &self.url, "worker", "simulate"])
            .args(["--id-prefix", prefix, "--count", &count.to_string()])
            .args(args);
        let child = cmd
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn simulated fleet");
        self.workers.push(Proc { name, child });
        let want = format!("{prefix}-");
        wait_until(
            STARTUP,
            &format!("{count} simulated workers to register"),
            || {
                self.healthy_workers()
                    .iter()
                    .filter(|w| w.starts_with(&want))
                    .count()
                    == count
            },
        );
    }

    fn spawn_worker(&mut self, w: &WorkerSpec) -> String {
        let id = format!("w{}", self.next_worker);
        self.next_worker += 1;
        let log =
            std::fs::File::create(self.root.path().join(format!("{id}.log"))).expect("log file");
        let mut cmd = base_cmd(self.root.path());
        cmd.args([
            "--controller-url",
            &self.url,
            "worker",
            "serve",
            "--worker-id",
            &id,
        ])
        .args([
            "--cpu",
            &w.cpu.to_string(),
            "--memory",
            "16GB",
            "--heartbeat-timeout",
            &w.heartbeat_timeout.to_string(),
        ])
        .arg("--cache-dir")
        .arg(self.root.path().join("cache").join(&id));
        if let Some(d) = &w.device {
            cmd.args(["--device", d]);
        }
        for (k, v) in &w.attributes {
            cmd.args(["--attribute", &format!("{k}={v}")]);
        }
        let child = cmd
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn worker");
        self.workers.push(Proc {
            name: id.clone(),
            child,
        });
        id
    }

    fn wait_workers(&self, ids: &[String]) {
        wait_until(STARTUP, &format!("workers {ids:?} to register"), || {
            let healthy = self.healthy_workers();
            ids.iter().all(|i| healthy.contains(i))
        });
    }

    /// Ids of the workers the controller lists as healthy.
    pub fn healthy_workers(&self) -> Vec<String> {
        self.listed_workers()
            .into_iter()
            .filter(|(_, healthy)| *healthy)
            .map(|(id, _)| id)
            .collect()
    }

    /// Every worker the controller lists (`ListWorkers`), with whether it is healthy; empty if
    /// the controller does not answer.
    pub fn listed_workers(&self) -> Vec<(String, bool)> {
        let o = self.iris(&["rpc", "controller", "list-workers"]);
        if o.code != 0 {
            return Vec::new();
        }
        let v: Value = serde_json::from_str(&o.stdout).unwrap_or(Value::Null);
        v["workers"]
            .as_array()
            .map(|ws| {
                ws.iter()
                    .filter_map(|w| {
                        let id = w["worker_id"].as_str()?.to_string();
                        Some((id, w["healthy"].as_bool().unwrap_or(false)))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A worker's pid.
    pub fn worker_pid(&self, id: &str) -> u32 {
        self.workers
            .iter()
            .find(|w| w.name == id)
            .expect("known worker")
            .child
            .id()
    }

    /// `kill -9` a worker's process (the controller is not told).
    pub fn kill_worker(&mut self, id: &str) {
        let p = self
            .workers
            .iter_mut()
            .find(|w| w.name == id)
            .expect("known worker");
        p.child.kill().expect("kill -9 worker");
        p.child.wait().expect("reap worker");
    }

    /// CLI calls from now on send this token (`MARIN_CLUSTER_TOKEN`), or none.
    pub fn set_cli_token(&mut self, token: Option<String>) {
        self.cli_token = token;
    }

    fn cli(&self) -> Command {
        let mut c = base_cmd(&self.ws);
        if let Some(t) = &self.cli_token {
            c.env("MARIN_CLUSTER_TOKEN", t);
        }
        c
    }

    /// The dashboard address the controller printed (`serve --dashboard-bind`).
    pub fn dashboard_url(&self) -> String {
        wait_for(
            STARTUP,
            "the controller to print the dashboard address",
            || {
                let log = std::fs::read_to_string(self.path("controller.log")).ok()?;
                log.lines()
                    .find_map(|l| l.strip_prefix("Dashboard: "))
                    .map(|u| u.trim().trim_end_matches('/').to_string())
            },
        )
    }

    /// A path inside the cluster's temp dir (for pid files and the like).
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// Runs `iris --controller-url URL <args>` from the workspace dir.
    pub fn iris(&self, args: &[&str]) -> Out {
        let o = self
            .cli()
            .arg("--controller-url")
            .arg(&self.url)
            .args(args)
            .output()
            .expect("run iris");
        Out::from(o)
    }

    /// Starts `iris --controller-url URL <args>` without waiting (stdout and stderr piped).
    pub fn spawn_iris(&self, args: &[&str]) -> Child {
        self.cli()
            .arg("--controller-url")
            .arg(&self.url)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn iris")
    }

    /// Like [`TestCluster::iris`], feeding `input` on stdin.
    pub fn iris_stdin(&self, args: &[&str], input: &str) -> Out {
        use std::io::Write;
        let mut child = self
            .cli()
            .arg("--controller-url")
            .arg(&self.url)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run iris");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
        Out::from(child.wait_with_output().expect("wait iris"))
    }

    /// `iris job run --no-wait --user u --job-name NAME <flags> -- <cmd>`; asserts success and
    /// returns the printed job id.
    #[track_caller]
    pub fn submit(&self, name: &str, flags: &[&str], cmd: &[&str]) -> String {
        let mut args = vec!["job", "run", "--no-wait", "--user", "u", "--job-name", name];
        args.extend_from_slice(flags);
        args.push("--");
        args.extend_from_slice(cmd);
        let o = self.iris(&args);
        o.ok().trim().to_string()
    }

    /// `iris job summary JOB --json`.
    #[track_caller]
    pub fn summary(&self, job: &str) -> Value {
        let o = self.iris(&["job", "summary", job, "--json"]);
        serde_json::from_str(o.ok()).unwrap_or_else(|e| panic!("summary JSON: {e}\n{}", o.stdout))
    }

    /// `GetJobStatus` as proto-JSON (for fields the summary does not carry).
    #[track_caller]
    pub fn job_status(&self, job: &str) -> Value {
        let body = serde_json::json!({ "jobId": job }).to_string();
        let o = self.iris(&["rpc", "controller", "get-job-status", "--json", &body]);
        let v: Value = serde_json::from_str(o.ok()).expect("get-job-status JSON");
        v["job"].clone()
    }

    /// `iris rpc inspect METHOD --json BODY`, decoded: Iris's typed reads
    /// (`iris.inspect.InspectService`), so tests read state without SQL against the schema.
    #[track_caller]
    pub fn inspect<T: serde::de::DeserializeOwned>(&self, method: &str, body: Value) -> T {
        let o = self.iris(&["rpc", "inspect", method, "--json", &body.to_string()]);
        serde_json::from_str(o.ok()).unwrap_or_else(|e| panic!("{method} reply: {e}\n{}", o.stdout))
    }

    /// `iris rpc controller METHOD --json BODY`, decoded.
    #[track_caller]
    pub fn controller_rpc<T: serde::de::DeserializeOwned>(&self, method: &str, body: Value) -> T {
        let o = self.iris(&["rpc", "controller", method, "--json", &body.to_string()]);
        serde_json::from_str(o.ok()).unwrap_or_else(|e| panic!("{method} reply: {e}\n{}", o.stdout))
    }

    /// The job as submitted (`GetJobStatus.request`): resources, band, retry budgets, ….
    #[track_caller]
    pub fn job_request(&self, job: &str) -> cluster::controller::LaunchJobRequest {
        let r: cluster::controller::GetJobStatusResponse =
            self.controller_rpc("get-job-status", json!({ "jobId": job }));
        r.request
            .unwrap_or_else(|| panic!("{job}: GetJobStatus carries no request"))
    }

    /// Every job whose id starts with `prefix`, by id (`ListJobs`, page by page).
    pub fn jobs(&self, prefix: &str) -> Vec<iris_proto::job::JobStatus> {
        let mut out = Vec::new();
        loop {
            let r: cluster::controller::ListJobsResponse = self.controller_rpc(
                "list-jobs",
                json!({ "query": {
                    "jobIdPrefix": prefix,
                    "sortDirection": "SORT_DIRECTION_ASC",
                    "offset": out.len(),
                    "limit": 500,
                }}),
            );
            let n = r.jobs.len();
            let more = r.has_more();
            out.extend(r.jobs);
            if !more || n == 0 {
                out.sort_by(|a, b| a.job_id.cmp(&b.job_id));
                return out;
            }
        }
    }

    /// Jobs whose id starts with `prefix`, by state.
    pub fn job_counts(&self, prefix: &str) -> BTreeMap<JobState, i64> {
        let r: inspect::CountJobsResponse =
            self.inspect("count-jobs", json!({ "jobIdPrefix": prefix }));
        r.counts.into_iter().map(|c| (c.state(), c.count)).collect()
    }

    /// Every job there is.
    pub fn job_count(&self) -> i64 {
        self.job_counts("").values().sum()
    }

    /// Jobs under `prefix` not yet in a final state.
    pub fn unfinished_jobs(&self, prefix: &str) -> i64 {
        self.job_counts(prefix)
            .into_iter()
            .filter(|(s, _)| !JOB_FINAL.contains(s))
            .map(|(_, n)| n)
            .sum()
    }

    /// The attempts of one task, by attempt id, each as a flat JSON object (`attempt_id`,
    /// `worker_id`, `state` as its number, `exit_code`, `attempt_uid`, `created_at_ms`,
    /// `started_at_ms`, `finished_at_ms`, `error`; absent values are null) from `ListAttempts`.
    #[track_caller]
    pub fn attempts(&self, task: &str) -> Vec<Value> {
        let r: inspect::ListAttemptsResponse =
            self.inspect("list-attempts", json!({ "taskId": task }));
        r.attempts
            .into_iter()
            .map(|a| {
                json!({
                    "attempt_id": a.attempt_id,
                    "worker_id": a.worker_id,
                    "state": a.state,
                    "exit_code": a.exit_code,
                    "attempt_uid": a.attempt_uid,
                    "created_at_ms": a.created_at_ms,
                    "started_at_ms": a.started_at_ms,
                    "finished_at_ms": a.finished_at_ms,
                    "error": if a.error.is_empty() { Value::Null } else { Value::from(a.error) },
                })
            })
            .collect()
    }

    /// The attempts of every job whose id starts with `prefix`, by task id and attempt id.
    #[track_caller]
    pub fn attempts_under(&self, prefix: &str) -> Vec<inspect::AttemptSummary> {
        let r: inspect::ListAttemptsResponse = self.inspect(
            "list-attempts",
            json!({ "jobIdPrefix": prefix, "limit": 20000 }),
        );
        assert!(!r.truncated, "more than 20000 attempts under {prefix}");
        r.attempts
    }

    /// Attempts whose worker has not confirmed their end (they still hold resources).
    pub fn open_attempts(&self) -> Vec<inspect::ResourceHold> {
        let r: inspect::ListResourceHoldsResponse = self.inspect("list-resource-holds", json!({}));
        r.holds
    }

    /// The federation handoff records of jobs whose id starts with `prefix`.
    pub fn handoffs(&self, prefix: &str) -> Vec<inspect::Handoff> {
        let r: inspect::ListHandoffsResponse =
            self.inspect("list-handoffs", json!({ "jobIdPrefix": prefix }));
        r.handoffs
    }

    /// The checkpoint the controller's DB was last written to or restored from.
    pub fn last_checkpoint(&self) -> Option<i64> {
        let r: inspect::GetCheckpointStatusResponse =
            self.inspect("get-checkpoint-status", json!({}));
        r.last_checkpoint_epoch_ms
    }

    /// The job's friendly state (`running`, `succeeded`, …); `None` if the job does not exist.
    pub fn job_state(&self, job: &str) -> Option<String> {
        let o = self.iris(&["job", "summary", job, "--json"]);
        if o.code != 0 {
            return None;
        }
        let v: Value = serde_json::from_str(&o.stdout).ok()?;
        v["state"].as_str().map(str::to_string)
    }

    /// Waits until the job is in `state`.
    #[track_caller]
    pub fn wait_job(&self, job: &str, state: &str) -> Value {
        wait_for(SHORT, &format!("job {job} to be {state}"), || {
            let v = self.summary(job);
            (v["state"] == state).then_some(v)
        })
    }

    /// Waits until every listed task of `job` is in the paired state.
    #[track_caller]
    pub fn wait_tasks(&self, job: &str, states: &[(usize, &str)]) -> Value {
        wait_for(
            SHORT,
            &format!("tasks of {job} to reach {states:?}"),
            || {
                let v = self.summary(job);
                let tasks = v["tasks"].as_array()?;
                states
                    .iter()
                    .all(|(i, s)| tasks.get(*i).map(|t| t["state"] == *s).unwrap_or(false))
                    .then_some(v)
            },
        )
    }
}

/// Log lines printed by `iris job logs`: the text after ` | `.
pub fn log_lines(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once(" | ").map(|(_, d)| d.to_string()))
        .collect()
}

/// Whether process `pid` still exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            // Field 3 (after the parenthesised command) is the state.
            let state = s
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            state != Some('Z')
        }
        Err(_) => false,
    }
}

/// The live child processes of `pid` (for a worker: its tasks' top processes).
pub fn child_pids(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in threads.flatten() {
        let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(
            kids.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out.retain(|p| alive(*p));
    out.sort_unstable();
    out.dedup();
    out
}

/// Pids written one per line to a file (empty if the file does not exist yet).
pub fn read_pids(p: &Path) -> Vec<u32> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A raw HTTP/1.1 JSON POST to the controller (to observe status codes the CLI hides).
/// Returns the status code and the body.
/// A raw HTTP/1.1 GET with an optional cookie: (status, response head, body).
pub fn http_get(url: &str, path: &str, cookie: Option<&str>) -> (u16, String, String) {
    use std::io::{Read, Write};
    let hostport = url.trim_start_matches("http://").trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(hostport).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {hostport}\r\n{cookie}Connection: close\r\n\r\n"
    )
    .expect("send request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read response");
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

/// `iris cluster init-keys --out-file dir/name.pem`: (path, public PEM).
pub fn init_keys(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(format!("{name}.pem"));
    let out = Command::new(IRIS)
        .args(["cluster", "init-keys", "--out-file"])
        .arg(&path)
        .output()
        .expect("init-keys");
    assert!(
        out.status.success(),
        "init-keys: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("kid: "), "{stdout}");
    let key = iris_auth::Keypair::from_pem(&std::fs::read_to_string(&path).expect("key"))
        .expect("key parses");
    (path, key.public_pem().expect("public pem"))
}

pub fn http_post_json(url: &str, path: &str, body: &str) -> (u16, String) {
    http_post_json_with(url, path, body, &[])
}

/// Like [`http_post_json`], with extra request headers.
pub fn http_post_json_with(
    url: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    use std::io::{Read, Write};
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let hostport = url.trim_start_matches("http://").trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(hostport).expect("connect to controller");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read response");
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {resp:?}"));
    let body = resp
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (status, body)
}

/// An `iris` process a test starts by hand (e.g. `cluster start --local` with its own
/// environment); stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Daemon(Proc);

impl Daemon {
    /// Starts `iris <args>` in `cwd` with `envs` set, its output to `log`.
    pub fn spawn(cwd: &Path, envs: &[(&str, &Path)], args: &[&str], log: &Path) -> Daemon {
        let log = std::fs::File::create(log).expect("log file");
        let mut cmd = base_cmd(cwd);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd
            .args(args)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn iris");
        Daemon(Proc {
            name: args.join(" "),
            child,
        })
    }

    /// Starts `iris <args>` inside network namespace `ns`, its output to `log`.
    pub fn spawn_netns(ns: &str, cwd: &Path, args: &[&str], log: &Path) -> Daemon {
        let log = std::fs::File::create(log).expect("log file");
        let child = netns_cmd(ns, cwd)
            .args(args)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn iris in a network namespace");
        Daemon(Proc {
            name: format!("{ns}: {}", args.join(" ")),
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.0.child.id()
    }

    /// Waits up to `timeout` for the process to exit by itself; its status, or `None`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = self.0.child.try_wait() {
                return Some(st);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        stop(&mut self.0);
    }
}

/// Runs `iris <args>` in `cwd` with `envs` set (and no ambient controller address).
pub fn iris_in(cwd: &Path, envs: &[(&str, &Path)], args: &[&str]) -> Out {
    let mut cmd = base_cmd(cwd);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    Out::from(cmd.args(args).output().expect("run iris"))
}

/// A shell line a task runs to register an endpoint for itself, over Connect JSON with its task
/// token (ignored when auth is off). `name` and `address` may hold shell expansions; `extra` is
/// more JSON fields, already escaped for a double-quoted shell string (e.g. `,\"access\":2`).
pub fn register_endpoint_sh(name: &str, address: &str, extra: &str) -> String {
    format!(
        "curl -sS --fail-with-body -X POST \"$IRIS_CONTROLLER_ADDRESS/iris.cluster.EndpointService/RegisterEndpoint\" \
         -H 'content-type: application/json' -H \"authorization: Bearer $IRIS_TASK_TOKEN\" \
         -d \"{{\\\"name\\\":\\\"{name}\\\",\\\"address\\\":\\\"{address}\\\",\\\"taskId\\\":\\\"${{IRIS_TASK_ID%:*}}\\\",\\\"attemptId\\\":${{IRIS_TASK_ID##*:}}{extra}}}\"\n"
    )
}

/// Shell lines that serve the task's `./site` directory on a free loopback port in the
/// background and wait until the port is in `./port`.
pub const SERVE_SITE_SH: &str = r#"python3 - <<'PY' &
import functools, http.server, os
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory="site")
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), h)
open("port.tmp", "w").write(str(s.server_address[1])); os.rename("port.tmp", "port")
s.serve_forever()
PY
while [ ! -s port ]; do sleep 0.1; done
"#;

/// A federation hub (with one CPU worker of its own) in front of `peer`, which it calls `k8s`:
/// waits until the hub sees the peer reachable with the `lane` it reports, routes a one-GPU
/// `gpu` job there by what the peer reports, and checks that it succeeded on both sides.
#[allow(dead_code)]
pub fn hub_routes_a_gpu_job_to(peer: &TestCluster, lane: &str, gpu: &str, timeout: Duration) {
    let keys = tempfile::tempdir().expect("keys");
    let (key, _) = init_keys(keys.path(), "hub");
    let hub = TestCluster::start_with_args(
        &[WorkerSpec::cpu(4)],
        Some(&format!(
            "name: hub\nauth:\n  signing_key: file:{}\npeers:\n  k8s:\n    controller_address: {}\n",
            key.display(),
            peer.url
        )),
        &["--federation-heartbeat", "0.5", "--federation-sync-interval", "0.2"],
    );
    wait_until(timeout, "the hub to see the Kubernetes peer", || {
        let o = hub.iris(&["rpc", "controller", "list-peers"]);
        o.stdout.contains(lane) && o.stdout.contains("\"reachable\": true")
    });
    let o = hub.iris(&[
        "job",
        "run",
        "--no-wait",
        "--no-bundle",
        "--job-name",
        "routed",
        "--enable-extra-resources",
        "--gpu",
        gpu,
        "--",
        "true",
    ]);
    let routed = o.job_id();
    wait_for(timeout, "the routed job to succeed on the hub", || {
        (hub.summary(&routed)["state"] == "succeeded").then_some(())
    });
    assert_eq!(hub.job_status(&routed)["cluster"], "k8s");
    assert_eq!(peer.summary(&routed)["state"], "succeeded");
}
