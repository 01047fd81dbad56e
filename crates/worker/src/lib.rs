//! The Iris worker daemon: registers with the controller, answers `WorkerService/Reconcile`, and
//! runs each attempt as a child process in its own process group.
//!
//! Architecture invariant: the worker knows nothing about scheduling; it reports facts
//! (BUILDING, RUNNING, exit codes) and obeys the desired set. Unknown desired uids are reported
//! MISSING; local attempts missing from the desired set are killed.

pub mod bundle;

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{Path as AxPath, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use iris_proto::cluster::controller as c;
use iris_proto::cluster::worker as w;
use iris_proto::finelog::logging as fl;
use iris_proto::job;
use iris_rpc::RpcError;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

/// Worker settings.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub controller_url: String,
    pub worker_id: String,
    pub bind: SocketAddr,
    pub cpu_count: i32,
    pub memory_bytes: i64,
    pub disk_bytes: i64,
    /// Advertised accelerator: `("gpu"|"tpu", variant, count)`. May be fake (testing/dev only).
    pub device: Option<(String, String, i32)>,
    pub attributes: Vec<(String, String)>,
    pub scale_group: String,
    pub cache_dir: PathBuf,
    /// Without a reconcile for this long the worker kills its tasks and re-registers.
    pub heartbeat_timeout: Duration,
}

#[derive(Debug)]
struct Attempt {
    task_id: String,
    attempt_id: i32,
    state: i32,
    exit_code: i32,
    error: String,
    pgid: Option<i32>,
    stop_requested: bool,
    /// Stopped by the worker itself after losing the controller (ends WORKER_FAILED).
    abandoned: bool,
}

struct Inner {
    cfg: WorkerConfig,
    attempts: Mutex<HashMap<String, Attempt>>,
    last_reconcile: Mutex<Instant>,
    http: reqwest::Client,
    rpc: iris_rpc::Client,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

const PENDING: i32 = 1;
const BUILDING: i32 = 2;
const RUNNING: i32 = 3;
const SUCCEEDED: i32 = 4;
const FAILED: i32 = 5;
const KILLED: i32 = 6;
const WORKER_FAILED: i32 = 7;
const MISSING: i32 = 12;

fn terminal(s: i32) -> bool {
    matches!(s, SUCCEEDED | FAILED | KILLED | WORKER_FAILED | 8 | 10 | 11)
}

/// A running worker.
pub struct RunningWorker {
    pub addr: SocketAddr,
    pub worker_id: String,
    inner: Arc<Inner>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningWorker {
    /// Stops the server and kills every task.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        kill_all(&self.inner);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

fn kill_all(inner: &Inner) {
    for a in lock(&inner.attempts).values_mut() {
        if let Some(pg) = a.pgid {
            a.stop_requested = true;
            kill_group(pg);
        }
    }
}

/// The controller has been unreachable past the heartbeat timeout: stop every live attempt.
/// Each ends WORKER_FAILED, so the controller reruns it under the preemption budget.
fn abandon_all(inner: &Inner) {
    for a in lock(&inner.attempts).values_mut() {
        if !terminal(a.state) {
            a.stop_requested = true;
            a.abandoned = true;
            if let Some(pg) = a.pgid {
                kill_group(pg);
            }
        }
    }
}

fn kill_group(pgid: i32) {
    use nix::sys::signal::{killpg, Signal};
    use nix::unistd::Pid;
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
}

/// Starts the worker: binds, serves Reconcile, and registers (retrying until accepted).
pub async fn start(cfg: WorkerConfig) -> anyhow::Result<RunningWorker> {
    std::fs::create_dir_all(&cfg.cache_dir)
        .with_context(|| format!("creating {}", cfg.cache_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(cfg.bind)
        .await
        .with_context(|| format!("binding worker to {}", cfg.bind))?;
    let addr = listener.local_addr()?;
    // With auth on, the worker presents its token (minted with `iris user token mint
    // system:worker --role worker`) on Register and PushLogs.
    let rpc = iris_rpc::Client::new(&cfg.controller_url)
        .map_err(|e| anyhow::anyhow!(e.message))?
        .with_token(std::env::var("IRIS_WORKER_TOKEN").ok());
    let inner = Arc::new(Inner {
        attempts: Mutex::new(HashMap::new()),
        last_reconcile: Mutex::new(Instant::now()),
        http: reqwest::Client::new(),
        rpc,
        cfg,
    });
    let (tx, rx) = tokio::sync::watch::channel(false);
    let app = Router::new()
        .route("/{service}/{method}", post(dispatch))
        .with_state(inner.clone());
    let mut srx = rx.clone();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = srx.wait_for(|v| *v).await;
            })
            .await;
    });
    let reg = tokio::spawn(registration_loop(inner.clone(), addr, rx));
    Ok(RunningWorker {
        addr,
        worker_id: inner.cfg.worker_id.clone(),
        inner,
        shutdown: tx,
        tasks: vec![server, reg],
    })
}

fn metadata(cfg: &WorkerConfig) -> job::WorkerMetadata {
    use job::device_config::Device;
    let device = match &cfg.device {
        Some((t, v, n)) if t == "gpu" => Device::Gpu(job::GpuDevice {
            variant: v.clone(),
            count: *n,
        }),
        Some((t, v, n)) if t == "tpu" => Device::Tpu(job::TpuDevice {
            variant: v.clone(),
            topology: String::new(),
            count: *n,
        }),
        _ => Device::Cpu(job::CpuDevice {
            variant: "cpu".into(),
        }),
    };
    let attributes = cfg
        .attributes
        .iter()
        .map(|(k, v)| {
            let value = match v.parse::<i64>() {
                Ok(i) if k != "region" && k != "zone" => job::attribute_value::Value::IntValue(i),
                _ => job::attribute_value::Value::StringValue(v.clone()),
            };
            (k.clone(), job::AttributeValue { value: Some(value) })
        })
        .collect();
    job::WorkerMetadata {
        hostname: "localhost".into(),
        ip_address: "127.0.0.1".into(),
        cpu_count: cfg.cpu_count,
        memory_bytes: cfg.memory_bytes,
        disk_bytes: cfg.disk_bytes,
        gpu_count: cfg
            .device
            .as_ref()
            .filter(|d| d.0 == "gpu")
            .map(|d| d.2)
            .unwrap_or(0),
        gpu_name: cfg
            .device
            .as_ref()
            .filter(|d| d.0 == "gpu")
            .map(|d| d.1.clone())
            .unwrap_or_default(),
        device: Some(job::DeviceConfig {
            device: Some(device),
        }),
        attributes,
        ..Default::default()
    }
}

async fn register_once(inner: &Inner, addr: SocketAddr) -> bool {
    let req = c::RegisterRequest {
        address: addr.to_string(),
        metadata: Some(metadata(&inner.cfg)),
        worker_id: inner.cfg.worker_id.clone(),
        slice_id: String::new(),
        scale_group: inner.cfg.scale_group.clone(),
    };
    match inner
        .rpc
        .call::<_, c::RegisterResponse>(
            "iris.cluster.ControllerService",
            "Register",
            &req,
            Duration::from_secs(10),
        )
        .await
    {
        Ok(r) if r.accepted => true,
        Ok(_) => {
            tracing::warn!("registration refused");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "registration failed; retrying");
            false
        }
    }
}

async fn registration_loop(
    inner: Arc<Inner>,
    addr: SocketAddr,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        while !register_once(&inner, addr).await {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.wait_for(|v| *v) => return,
            }
        }
        *lock(&inner.last_reconcile) = Instant::now();
        // Watch for a lost controller.
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = shutdown.wait_for(|v| *v) => return,
            }
            if lock(&inner.last_reconcile).elapsed() > inner.cfg.heartbeat_timeout {
                tracing::warn!(
                    "no reconcile within the heartbeat timeout; killing tasks and re-registering"
                );
                abandon_all(&inner);
                break;
            }
        }
    }
}

async fn dispatch(
    State(inner): State<Arc<Inner>>,
    AxPath((service, method)): AxPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    use axum::response::IntoResponse;
    match (service.as_str(), method.as_str()) {
        ("iris.cluster.WorkerService", "Reconcile") => {
            iris_rpc::unary(&headers, &body, |req| {
                let inner = inner.clone();
                async move { reconcile(&inner, req) }
            })
            .await
        }
        ("iris.cluster.WorkerService", "HealthCheck") => {
            iris_rpc::unary(&headers, &body, |_req: job::Empty| {
                let inner = inner.clone();
                async move {
                    let running = lock(&inner.attempts)
                        .values()
                        .filter(|a| !terminal(a.state))
                        .count() as i32;
                    Ok::<_, RpcError>(w::HealthResponse {
                        healthy: true,
                        uptime: None,
                        running_tasks: running,
                    })
                }
            })
            .await
        }
        _ => RpcError::new(
            iris_rpc::Code::Unimplemented,
            format!("{service}/{method} is not implemented"),
        )
        .into_response(),
    }
}

fn reconcile(
    inner: &Arc<Inner>,
    req: w::ReconcileRequest,
) -> Result<w::ReconcileResponse, RpcError> {
    if req.worker_id != inner.cfg.worker_id {
        return Err(RpcError::invalid(format!(
            "reconcile addressed to worker {:?}, but this is {:?}",
            req.worker_id, inner.cfg.worker_id
        )));
    }
    *lock(&inner.last_reconcile) = Instant::now();
    let mut observed = Vec::with_capacity(req.desired.len());
    let desired_uids: std::collections::HashSet<String> =
        req.desired.iter().map(|d| d.attempt_uid.clone()).collect();
    let mut attempts = lock(&inner.attempts);
    // Kill zombies: live local attempts the controller no longer wants; forget finished ones.
    attempts.retain(|uid, a| {
        if desired_uids.contains(uid) {
            return true;
        }
        if !terminal(a.state) {
            a.stop_requested = true;
            if let Some(pg) = a.pgid {
                kill_group(pg);
            }
            return true;
        }
        false
    });
    for d in req.desired {
        use w::desired_attempt::Intent;
        match d.intent {
            Some(Intent::Run(spec)) => {
                if !attempts.contains_key(&d.attempt_uid) {
                    match spec.request {
                        Some(run) => {
                            // A newer attempt of the same task supersedes an older live one.
                            for a in attempts.values_mut() {
                                if a.task_id == run.task_id
                                    && a.attempt_id < run.attempt_id
                                    && !terminal(a.state)
                                {
                                    a.stop_requested = true;
                                    if let Some(pg) = a.pgid {
                                        kill_group(pg);
                                    }
                                }
                            }
                            attempts.insert(
                                d.attempt_uid.clone(),
                                Attempt {
                                    task_id: run.task_id.clone(),
                                    attempt_id: run.attempt_id,
                                    state: BUILDING,
                                    exit_code: 0,
                                    error: String::new(),
                                    pgid: None,
                                    stop_requested: false,
                                    abandoned: false,
                                },
                            );
                            let inner2 = inner.clone();
                            let uid = d.attempt_uid.clone();
                            // Owned by the attempt entry: ends when the child exits.
                            tokio::spawn(async move { run_attempt(inner2, uid, run).await });
                        }
                        None => {
                            observed.push(w::AttemptObservation {
                                attempt_uid: d.attempt_uid,
                                state: MISSING,
                                ..Default::default()
                            });
                            continue;
                        }
                    }
                }
            }
            Some(Intent::Stop(_)) => match attempts.get_mut(&d.attempt_uid) {
                Some(a) if !terminal(a.state) => {
                    a.stop_requested = true;
                    if let Some(pg) = a.pgid {
                        kill_group(pg);
                    } else if a.state == PENDING {
                        a.state = KILLED;
                    }
                }
                Some(_) => {}
                None => {
                    observed.push(w::AttemptObservation {
                        attempt_uid: d.attempt_uid,
                        state: MISSING,
                        ..Default::default()
                    });
                    continue;
                }
            },
            None => continue,
        }
        if let Some(a) = attempts.get(&d.attempt_uid) {
            observed.push(w::AttemptObservation {
                attempt_uid: d.attempt_uid,
                state: if a.state == PENDING {
                    BUILDING
                } else {
                    a.state
                },
                exit_code: a.exit_code,
                error: a.error.clone(),
                ..Default::default()
            });
        }
    }
    drop(attempts);
    Ok(w::ReconcileResponse {
        worker_id: inner.cfg.worker_id.clone(),
        observed,
        health: Some(w::WorkerHealth {
            healthy: true,
            health_error: String::new(),
            resources: None,
        }),
    })
}

fn set_state(inner: &Inner, uid: &str, f: impl FnOnce(&mut Attempt)) {
    if let Some(a) = lock(&inner.attempts).get_mut(uid) {
        f(a);
    }
}

async fn poke_controller(inner: &Inner) {
    let url = format!(
        "{}/internal/worker-poke/{}",
        inner.cfg.controller_url.trim_end_matches('/'),
        inner.cfg.worker_id
    );
    let _ = inner
        .http
        .post(url)
        .timeout(Duration::from_secs(2))
        .send()
        .await;
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Log shipping: lines are batched and pushed to the controller's log service.
struct LogShipper {
    key: String,
    buf: Vec<fl::LogEntry>,
    /// Lines are numbered per attempt (`LogEntry.seq`, from 1) so a retried push is stored once.
    next_seq: i64,
}

impl LogShipper {
    async fn flush(&mut self, inner: &Inner) {
        if self.buf.is_empty() {
            return;
        }
        let req = fl::PushLogsRequest {
            key: self.key.clone(),
            entries: std::mem::take(&mut self.buf),
            cluster: String::new(),
        };
        // Keep trying through a controller restart (the terminal state is reported only after
        // the logs are in), but not past the heartbeat timeout.
        let give_up = Instant::now() + inner.cfg.heartbeat_timeout.max(Duration::from_secs(10));
        let mut delay = Duration::from_millis(100);
        for attempt in 0u32.. {
            match inner
                .rpc
                .call::<_, fl::PushLogsResponse>(
                    "finelog.logging.LogService",
                    "PushLogs",
                    &req,
                    Duration::from_secs(10),
                )
                .await
            {
                Ok(_) => return,
                Err(e)
                    if Instant::now() < give_up
                        && (e.code == iris_rpc::Code::Unavailable || attempt < 5) =>
                {
                    tracing::warn!(error = %e, attempt, "pushing logs failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::error!(error = %e, attempt, key = %req.key, "dropping log lines");
                    return;
                }
            }
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

async fn prepare_workdir(
    inner: &Inner,
    run: &job::RunTaskRequest,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    if !run.bundle_id.is_empty() {
        let data = bundle::fetch(
            &inner.http,
            &inner.cfg.controller_url,
            &run.bundle_id,
            &inner.cfg.cache_dir.join("bundles"),
        )
        .await?;
        let dir2 = dir.to_path_buf();
        tokio::task::spawn_blocking(move || bundle::unzip(&data, &dir2)).await??;
    }
    if let Some(ep) = &run.entrypoint {
        for (name, data) in &ep.workdir_files {
            let rel = bundle::safe_relative(name)?;
            let p = dir.join(rel);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&p, data)?;
        }
        for (name, sha) in &ep.workdir_file_refs {
            let rel = bundle::safe_relative(name)?;
            let data = bundle::fetch(
                &inner.http,
                &inner.cfg.controller_url,
                sha,
                &inner.cfg.cache_dir.join("bundles"),
            )
            .await?;
            std::fs::write(dir.join(rel), data)?;
        }
    }
    Ok(())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

async fn run_attempt(inner: Arc<Inner>, uid: String, run: job::RunTaskRequest) {
    let key = format!("{}:{}", run.task_id, run.attempt_id);
    let mut logs = LogShipper {
        key: key.clone(),
        buf: Vec::new(),
        next_seq: 1,
    };
    let dir = inner.cfg.cache_dir.join("workdirs").join(format!(
        "{}_attempt_{}",
        sanitize(&run.task_id),
        run.attempt_id
    ));
    let outcome = execute(&inner, &uid, &run, &dir, &mut logs).await;
    logs.flush(&inner).await;
    let (state, code, error) = match outcome {
        Ok(o) => o,
        Err(e) => (FAILED, -1, format!("setup failed: {e:#}")),
    };
    set_state(&inner, &uid, |a| {
        a.state = state;
        a.exit_code = code;
        a.error = error;
        a.pgid = None;
    });
    let _ = std::fs::remove_dir_all(&dir);
    poke_controller(&inner).await;
}

async fn execute(
    inner: &Arc<Inner>,
    uid: &str,
    run: &job::RunTaskRequest,
    dir: &std::path::Path,
    logs: &mut LogShipper,
) -> anyhow::Result<(i32, i32, String)> {
    prepare_workdir(inner, run, dir).await?;
    let argv = run
        .entrypoint
        .as_ref()
        .and_then(|e| e.run_command.as_ref())
        .map(|r| r.argv.clone())
        .unwrap_or_default();
    let Some((prog, args)) = argv.split_first() else {
        anyhow::bail!("empty command");
    };
    let job_id = run
        .task_id
        .rsplit_once('/')
        .map(|x| x.0)
        .unwrap_or(&run.task_id)
        .to_string();
    let env_vars = run
        .environment
        .as_ref()
        .map(|e| e.env_vars.clone())
        .unwrap_or_default();
    let mut cmd = tokio::process::Command::new(prog);
    cmd.args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let url = inner.cfg.controller_url.clone();
    let iris_env: Vec<(String, String)> = vec![
        (
            "IRIS_TASK_ID".into(),
            format!("{}:{}", run.task_id, run.attempt_id),
        ),
        ("IRIS_ATTEMPT_UID".into(), run.attempt_uid.clone()),
        ("IRIS_NUM_TASKS".into(), run.num_tasks.to_string()),
        ("IRIS_JOB_ID".into(), job_id),
        ("IRIS_WORKER_ID".into(), inner.cfg.worker_id.clone()),
        ("IRIS_ADVERTISE_HOST".into(), "127.0.0.1".into()),
        ("IRIS_BIND_HOST".into(), "127.0.0.1".into()),
        ("IRIS_CONTROLLER_ADDRESS".into(), url.clone()),
        ("IRIS_CONTROLLER_URL".into(), url),
        ("IRIS_BUNDLE_ID".into(), run.bundle_id.clone()),
        ("IRIS_WORKDIR".into(), dir.display().to_string()),
        (
            "IRIS_JOB_ENV".into(),
            serde_json::to_string(&env_vars).unwrap_or_else(|_| "{}".into()),
        ),
    ];
    for (k, v) in &iris_env {
        cmd.env(k, v);
    }
    for p in &run.ports {
        cmd.env(
            format!("IRIS_PORT_{}", p.to_ascii_uppercase().replace('-', "_")),
            free_port().to_string(),
        );
    }
    for (k, v) in &env_vars {
        cmd.env(k, v);
    }
    cmd.env("IRIS_ATTEMPT_UID", &run.attempt_uid);
    if !run.task_token.is_empty() {
        // Forced back after the job's env, like the attempt uid: the task acts with its own token.
        cmd.env("IRIS_TASK_TOKEN", &run.task_token);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ok((FAILED, -1, format!("cannot start {prog:?}: {e}"))),
    };
    let pgid = child.id().map(|p| p as i32);
    let mut stop_now = false;
    set_state(inner, uid, |a| {
        a.pgid = pgid;
        a.state = RUNNING;
        stop_now = a.stop_requested;
    });
    if stop_now {
        if let Some(pg) = pgid {
            kill_group(pg);
        }
    }
    poke_controller(inner).await;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let (ltx, mut lrx) = tokio::sync::mpsc::channel::<(bool, String)>(1024);
    if let Some(out) = stdout {
        let t = ltx.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if t.send((false, l)).await.is_err() {
                    break;
                }
            }
        });
    }
    if let Some(err) = stderr {
        let t = ltx.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(err).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if t.send((true, l)).await.is_err() {
                    break;
                }
            }
        });
    }
    drop(ltx);
    let mut last_stderr = String::new();
    let mut last_flush = Instant::now();
    loop {
        let next = tokio::time::timeout(Duration::from_millis(200), lrx.recv()).await;
        match next {
            Ok(Some((is_err, line))) => {
                if is_err {
                    last_stderr = line.clone();
                }
                logs.buf.push(fl::LogEntry {
                    timestamp: Some(fl::Timestamp { epoch_ms: now_ms() }),
                    source: if is_err {
                        "stderr".into()
                    } else {
                        "stdout".into()
                    },
                    data: line,
                    attempt_id: run.attempt_id,
                    level: if is_err { 4 } else { 2 },
                    key: String::new(),
                    seq: logs.next_seq,
                });
                logs.next_seq += 1;
                if logs.buf.len() >= 500 || last_flush.elapsed() > Duration::from_millis(300) {
                    logs.flush(inner).await;
                    last_flush = Instant::now();
                }
            }
            Ok(None) => break,
            Err(_) => {
                logs.flush(inner).await;
                last_flush = Instant::now();
            }
        }
    }
    let status = child.wait().await.context("waiting for task process")?;
    // Reap any grandchildren left in the group.
    if let Some(pg) = pgid {
        kill_group(pg);
    }
    let (stopped, abandoned) = lock(&inner.attempts)
        .get(uid)
        .map(|a| (a.stop_requested, a.abandoned))
        .unwrap_or((false, false));
    if abandoned {
        return Ok((
            WORKER_FAILED,
            status.code().unwrap_or(-1),
            "Killed by the worker: no reconcile from the controller within the heartbeat timeout"
                .into(),
        ));
    }
    if stopped {
        return Ok((
            KILLED,
            status.code().unwrap_or(-1),
            "Stopped by controller".into(),
        ));
    }
    use std::os::unix::process::ExitStatusExt;
    let (code, mut error) = match (status.code(), status.signal()) {
        (Some(0), _) => return Ok((SUCCEEDED, 0, String::new())),
        (Some(c), _) => (c, format!("Exit code: {c}")),
        (None, Some(sig)) => {
            let name = nix::sys::signal::Signal::try_from(sig)
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|_| format!("signal {sig}"));
            (
                128 + sig,
                format!("Exit code {}: killed by {name}", 128 + sig),
            )
        }
        (None, None) => (-1, "Exit code: -1".into()),
    };
    if !last_stderr.is_empty() {
        error.push_str(". stderr: ");
        error.push_str(&last_stderr);
    }
    Ok((FAILED, code, error))
}
