//! Looking into what the worker runs: `ExecInContainer` (a command in a running attempt's
//! working directory and environment), `ProfileTask` (py-spy or memray against an attempt's
//! main process, or a native thread dump from `/proc`) and `GetProcessStatus` (the worker
//! itself, or an attempt's main process).
//!
//! Attempts run as the worker's own user in the host's PID namespace, so commands and
//! profilers run the same way, as children of the worker.
//!
//! These RPCs carry no credentials, like `Reconcile`: whoever reaches the worker's port may
//! call them. The controller checks the caller's ownership before it forwards one.

use crate::{lock, Inner, RunEnv};
use iris_proto::cluster::worker as w;
use iris_proto::iris::logging as il;
use iris_proto::job;
use iris_rpc::{procinfo, proclog, Code, RpcError};
use iris_types::TaskState;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// What the worker itself is addressed as (the controller rewrites `/system/worker/<id>`).
const SELF_TARGET: &str = "/system/process";
/// Each of an exec's streams is kept up to this many bytes.
const OUTPUT_CAP: usize = 8 << 20;
/// Time a profiler may take beyond its sampling window to attach and write its output.
const PROFILER_HEADROOM: Duration = Duration::from_secs(30);

/// A running attempt's main process and environment.
struct Live {
    attempt: String,
    pid: i32,
    env: Arc<RunEnv>,
}

/// The running attempt of `task_id` (attempt `n`, else its newest on this worker).
fn live_attempt(inner: &Inner, task_id: &str, n: Option<i32>) -> Result<Live, RpcError> {
    let attempts = lock(&inner.attempts);
    let worker = &inner.cfg.worker_id;
    let a = attempts
        .values()
        .filter(|a| a.task_id == task_id && n.is_none_or(|n| a.attempt_id == n))
        .max_by_key(|a| a.attempt_id)
        .ok_or_else(|| {
            let what = match n {
                Some(n) => format!("attempt {task_id}:{n}"),
                None => format!("task {task_id}"),
            };
            RpcError::not_found(format!("{what} has no attempt on worker {worker}"))
        })?;
    let attempt = format!("{}:{}", a.task_id, a.attempt_id);
    match (a.state, a.pgid, &a.run_env) {
        (TaskState::Running, Some(pid), Some(env)) => Ok(Live {
            attempt,
            pid,
            env: env.clone(),
        }),
        (state, ..) => Err(RpcError::precondition(format!(
            "attempt {attempt} is {state} on worker {worker}, not running: only a running attempt's process can be reached"
        ))),
    }
}

/// `name` on the task's `PATH` (its venv first), else on the worker's.
fn find_tool(name: &str, env: &RunEnv) -> Option<PathBuf> {
    let task_path = env.env.get("PATH").map(std::ffi::OsString::from);
    let worker_path = std::env::var_os("PATH");
    [task_path, worker_path]
        .into_iter()
        .flatten()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn missing_tool(name: &str, package: &str, env: &RunEnv, why: &str) -> String {
    let searched = match env.env.get("PATH") {
        Some(p) => format!("the task's PATH ({p}) nor on the worker's"),
        None => "the worker's PATH, which the task runs with".into(),
    };
    format!(
        "{name} is not on {searched}: {why} needs it; install it in the task's environment (`pip install {package}`, or add {package} to the job's dependencies) or on the worker"
    )
}

async fn read_capped(mut r: impl tokio::io::AsyncRead + Unpin) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut buf = [0u8; 16 << 10];
    let mut truncated = false;
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, truncated),
            Ok(n) => {
                let room = OUTPUT_CAP.saturating_sub(kept.len());
                truncated |= n > room;
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

/// How a command run by [`run_captured`] ended.
struct Captured {
    /// `None`: killed at the timeout.
    exit_code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

/// Runs `cmd` in its own process group with piped output; at `timeout` the group is killed.
async fn run_captured(
    mut cmd: tokio::process::Command,
    timeout: Option<Duration>,
) -> std::io::Result<Captured> {
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let pgid = child.id().map(|p| p as i32);
    let out = child.stdout.take().map(|o| tokio::spawn(read_capped(o)));
    let err = child.stderr.take().map(|e| tokio::spawn(read_capped(e)));
    let waited = match timeout {
        Some(t) => tokio::time::timeout(t, child.wait()).await.ok(),
        None => Some(child.wait().await),
    };
    let exit_code = match waited {
        Some(status) => {
            use std::os::unix::process::ExitStatusExt;
            let status = status?;
            Some(
                status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            )
        }
        None => None,
    };
    // Whatever the command left in its group goes with it (and a timed-out one is stopped).
    if let Some(pg) = pgid {
        crate::attempt::kill_group(pg);
    }
    let join = |h: Option<tokio::task::JoinHandle<(Vec<u8>, bool)>>| async move {
        match h {
            Some(h) => h.await.unwrap_or_default(),
            None => (Vec::new(), false),
        }
    };
    let (stdout, out_cut) = join(out).await;
    let (stderr, err_cut) = join(err).await;
    let mut stderr = String::from_utf8_lossy(&stderr).into_owned();
    if out_cut || err_cut {
        stderr.push_str(&format!(
            "\n[iris: output beyond {} MiB per stream was dropped]\n",
            OUTPUT_CAP >> 20
        ));
    }
    Ok(Captured {
        exit_code,
        stdout,
        stderr,
    })
}

pub(crate) async fn exec(
    inner: &Arc<Inner>,
    req: w::ExecInContainerRequest,
) -> Result<w::ExecInContainerResponse, RpcError> {
    let Some((prog, args)) = req.command.split_first() else {
        return Err(RpcError::invalid(
            "command: give the command to run (e.g. `iris task exec TASK -- pwd`)",
        ));
    };
    let live = live_attempt(inner, &req.task_id, None)?;
    let timeout = match req.timeout_seconds {
        0 => Some(Duration::from_secs(60)),
        t if t < 0 => None,
        t => Some(Duration::from_secs(t as u64)),
    };
    let mut cmd = tokio::process::Command::new(prog);
    cmd.args(args)
        .envs(&live.env.env)
        .current_dir(&live.env.dir);
    tracing::info!(attempt = %live.attempt, command = %req.command.join(" "), "exec in attempt");
    let c = match run_captured(cmd, timeout).await {
        Ok(c) => c,
        Err(e) => {
            return Ok(w::ExecInContainerResponse {
                exit_code: -1,
                error: format!("cannot start '{prog}' in attempt {}: {e}", live.attempt),
                ..Default::default()
            })
        }
    };
    let error = match (c.exit_code, timeout) {
        (None, Some(t)) => format!(
            "the command did not finish within {} s and was killed; pass --timeout with more seconds, or -1 for none",
            t.as_secs()
        ),
        _ => String::new(),
    };
    Ok(w::ExecInContainerResponse {
        exit_code: c.exit_code.unwrap_or(-1),
        stdout: String::from_utf8_lossy(&c.stdout).into_owned(),
        stderr: c.stderr,
        error,
    })
}

/// `<task>` or `<task>:<N>`.
fn parse_target(target: &str) -> Result<(String, Option<i32>), RpcError> {
    if let Ok(a) = iris_types::AttemptId::parse(target) {
        let n = i32::try_from(a.attempt).map_err(|_| {
            RpcError::invalid(format!("target: attempt number in '{target}' is too large"))
        })?;
        return Ok((a.task.to_string(), Some(n)));
    }
    iris_types::TaskId::parse(target).map_err(|e| {
        RpcError::invalid(format!(
            "target: {e}; name a task (/user/job/0), an attempt (/user/job/0:1) or {SELF_TARGET}"
        ))
    })?;
    Ok((target.to_string(), None))
}

fn daemon_version() -> String {
    format!("none: iris worker {} (Rust)", env!("CARGO_PKG_VERSION"))
}

pub(crate) async fn profile(
    inner: &Arc<Inner>,
    req: job::ProfileTaskRequest,
) -> Result<job::ProfileTaskResponse, RpcError> {
    let Some(profiler) = req.profile_type.and_then(|p| p.profiler) else {
        return Err(RpcError::invalid(
            "profile_type: choose one of threads, cpu or memory",
        ));
    };
    let duration = if req.duration_seconds > 0 {
        req.duration_seconds as u64
    } else {
        10
    };
    let result = if req.target.is_empty() || req.target.starts_with("/system/") {
        profile_self(&profiler)
    } else {
        let (task, n) = parse_target(&req.target)?;
        let live = live_attempt(inner, &task, n)?;
        let r = profile_attempt(inner, &live, &profiler, duration).await;
        // py-spy and memray attach with ptrace; one that died mid-attach can leave the process
        // group-stopped.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(live.pid),
            nix::sys::signal::Signal::SIGCONT,
        );
        r
    };
    Ok(job::ProfileTaskResponse::from_outcome(result))
}

/// The worker daemon itself: native threads; CPU and memory profiles are for Python.
fn profile_self(profiler: &job::profile_type::Profiler) -> Result<Vec<u8>, String> {
    use job::profile_type::Profiler;
    match profiler {
        Profiler::Threads(_) => procinfo::thread_dump(std::process::id(), false)
            .map(String::into_bytes)
            .map_err(|e| format!("reading /proc/self/task: {e}")),
        Profiler::Cpu(_) => Err(
            "cpu profiling of the worker daemon is not supported (it is a Rust process, which py-spy cannot sample); use `iris process profile threads` for its threads, or `perf record -p <pid>` on its host".into(),
        ),
        Profiler::Memory(_) => Err(
            "memory profiling of the worker daemon is not supported (it is a Rust process, which memray cannot attach to); `iris process status` shows its RSS".into(),
        ),
    }
}

fn scratch(inner: &Inner, live: &Live, ext: &str) -> Result<PathBuf, String> {
    let dir = inner.cfg.cache_dir.join("profiles");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Ok(dir.join(format!(
        "{}-{}-{nanos}.{ext}",
        live.pid,
        rand::random::<u32>()
    )))
}

/// Runs a profiler; `Err` names the tool, its exit code and what it printed.
async fn run_tool(tool: &Path, args: &[String], timeout: Duration) -> Result<Captured, String> {
    let mut cmd = tokio::process::Command::new(tool);
    cmd.args(args);
    let name = tool
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("profiler");
    let c = run_captured(cmd, Some(timeout))
        .await
        .map_err(|e| format!("cannot start {}: {e}", tool.display()))?;
    match c.exit_code {
        None => Err(format!(
            "{name} did not finish within {} s and was killed",
            timeout.as_secs()
        )),
        Some(_) => Ok(c),
    }
}

fn tool_failed(name: &str, c: &Captured) -> String {
    // py-spy appends its own backtrace when RUST_BACKTRACE is set: the message is enough.
    let message = c.stderr.split("Stack backtrace:").next().unwrap_or("");
    format!(
        "{name} failed (exit {}): {}",
        c.exit_code.unwrap_or(-1),
        message.trim()
    )
}

async fn profile_attempt(
    inner: &Inner,
    live: &Live,
    profiler: &job::profile_type::Profiler,
    duration: u64,
) -> Result<Vec<u8>, String> {
    use job::profile_type::Profiler;
    let pid = live.pid.to_string();
    match profiler {
        Profiler::Threads(t) => {
            let native_dump = |note: String| {
                procinfo::thread_dump(live.pid as u32, true)
                    .map(|d| {
                        format!(
                            "{note}\nNative threads of attempt {} (from /proc):\n\n{d}",
                            live.attempt
                        )
                        .into_bytes()
                    })
                    .map_err(|e| format!("reading /proc/{}: {e}", live.pid))
            };
            let Some(py_spy) = find_tool("py-spy", &live.env) else {
                return native_dump(missing_tool(
                    "py-spy",
                    "py-spy",
                    &live.env,
                    "a Python stack dump",
                ));
            };
            let mut args = vec!["dump".into(), "--pid".into(), pid, "--subprocesses".into()];
            if t.locals {
                args.push("--locals".into());
            }
            if t.native {
                args.push("--native".into());
            }
            let c = run_tool(&py_spy, &args, PROFILER_HEADROOM).await?;
            let partial = !c.stdout.is_empty()
                && c.stderr
                    .contains("Failed to find python version from target process");
            if c.exit_code == Some(0) || partial {
                return Ok(c.stdout);
            }
            native_dump(format!(
                "py-spy could not dump Python stacks ({}); is the attempt's process Python?",
                tool_failed("py-spy dump", &c)
            ))
        }
        Profiler::Cpu(cpu) => {
            let py_spy = find_tool("py-spy", &live.env)
                .ok_or_else(|| missing_tool("py-spy", "py-spy", &live.env, "a cpu profile"))?;
            use job::cpu_profile::Format;
            let (format, ext) = match Format::try_from(cpu.format).unwrap_or(Format::Flamegraph) {
                Format::Speedscope => ("speedscope", "json"),
                Format::Raw => ("raw", "txt"),
                Format::Flamegraph | Format::Unspecified => ("flamegraph", "svg"),
            };
            let out = scratch(inner, live, ext)?;
            let rate = if cpu.rate_hz > 0 { cpu.rate_hz } else { 20 };
            let mut args: Vec<String> = vec![
                "record".into(),
                "--pid".into(),
                pid,
                "--duration".into(),
                duration.to_string(),
                "--rate".into(),
                rate.to_string(),
                "--format".into(),
                format.into(),
                "--output".into(),
                out.display().to_string(),
                "--subprocesses".into(),
            ];
            if cpu.native.unwrap_or(true) {
                args.push("--native".into());
            }
            let c = run_tool(
                &py_spy,
                &args,
                Duration::from_secs(duration) + PROFILER_HEADROOM,
            )
            .await;
            let data = match c {
                Ok(c) if c.exit_code == Some(0) => std::fs::read(&out)
                    .map_err(|e| format!("py-spy wrote no profile to {}: {e}", out.display())),
                Ok(c) => Err(tool_failed("py-spy record", &c)),
                Err(e) => Err(e),
            };
            let _ = std::fs::remove_file(&out);
            data
        }
        Profiler::Memory(mem) => {
            let memray = find_tool("memray", &live.env)
                .ok_or_else(|| missing_tool("memray", "memray", &live.env, "a memory profile"))?;
            memory_profile(inner, live, &memray, mem, duration).await
        }
    }
}

async fn memory_profile(
    inner: &Inner,
    live: &Live,
    memray: &Path,
    mem: &job::MemoryProfile,
    duration: u64,
) -> Result<Vec<u8>, String> {
    use job::memory_profile::Format;
    let format = Format::try_from(mem.format).unwrap_or(Format::Flamegraph);
    let ext = match format {
        Format::Table => "txt",
        Format::Stats => "json",
        Format::Raw => "bin",
        Format::Flamegraph | Format::Unspecified => "html",
    };
    let trace = scratch(inner, live, "bin")?;
    let out = scratch(inner, live, ext)?;
    let mut attach: Vec<String> = vec![
        "attach".into(),
        "--native".into(),
        live.pid.to_string(),
        "--duration".into(),
        duration.to_string(),
        "--output".into(),
        trace.display().to_string(),
    ];
    if mem.leaks {
        attach.push("--aggregate".into());
    }
    let result = async {
        let c = run_tool(
            memray,
            &attach,
            Duration::from_secs(duration) + PROFILER_HEADROOM,
        )
        .await?;
        if c.exit_code != Some(0) {
            return Err(tool_failed("memray attach", &c));
        }
        let (t, o) = (trace.display().to_string(), out.display().to_string());
        let report: Vec<String> = match format {
            Format::Raw => return std::fs::read(&trace).map_err(|e| format!("reading {t}: {e}")),
            Format::Table => vec!["table".into(), t],
            Format::Stats => vec![
                "stats".into(),
                "--json".into(),
                "--force".into(),
                "-o".into(),
                o,
                t,
            ],
            Format::Flamegraph | Format::Unspecified => {
                let mut a = vec!["flamegraph".into()];
                if mem.leaks {
                    a.push("--leaks".into());
                }
                a.extend(["--force".into(), "--output".into(), o, t]);
                a
            }
        };
        let c = run_tool(memray, &report, PROFILER_HEADROOM).await?;
        if c.exit_code != Some(0) {
            return Err(tool_failed(&format!("memray {}", report[0]), &c));
        }
        if format == Format::Table {
            return Ok(c.stdout);
        }
        std::fs::read(&out).map_err(|e| format!("memray wrote no report to {}: {e}", out.display()))
    }
    .await;
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_file(&out);
    result
}

fn process_info(s: procinfo::Snapshot, python_version: String) -> job::ProcessInfo {
    job::ProcessInfo {
        hostname: s.hostname,
        pid: s.pid as i32,
        python_version,
        uptime_ms: s.uptime_ms,
        memory_rss_bytes: s.memory_rss_bytes,
        memory_vms_bytes: s.memory_vms_bytes,
        thread_count: s.thread_count,
        open_fd_count: s.open_fd_count,
        memory_total_bytes: s.memory_total_bytes,
        cpu_count: s.cpu_count,
        cpu_millicores: s.cpu_millicores,
        provenance: Some(iris_proto::build_provenance()),
    }
}

pub(crate) fn process_status(
    inner: &Inner,
    req: job::GetProcessStatusRequest,
) -> Result<job::GetProcessStatusResponse, RpcError> {
    let internal = |e: std::io::Error| RpcError::new(Code::Internal, format!("reading /proc: {e}"));
    if !req.target.is_empty() && !req.target.starts_with("/system/") {
        let (task, n) = parse_target(&req.target)?;
        let live = live_attempt(inner, &task, n)?;
        let s = procinfo::snapshot(live.pid as u32).map_err(internal)?;
        return Ok(job::GetProcessStatusResponse {
            process_info: Some(process_info(s, String::new())),
            log_entries: Vec::new(),
        });
    }
    let s = procinfo::snapshot(std::process::id()).map_err(internal)?;
    let mut log_entries = Vec::new();
    if req.max_log_lines > 0 {
        let min_level = proclog::parse_level(&req.min_log_level).map_err(RpcError::invalid)?;
        let source = format!("/system/worker/{}", inner.cfg.worker_id);
        let (lines, _) = proclog::recent(&proclog::Query {
            substring: &req.log_substring,
            min_level,
            after_seq: 0,
            max_lines: req.max_log_lines as usize,
            tail: true,
        });
        log_entries = lines
            .into_iter()
            .map(|l| il::LogEntry {
                timestamp: Some(iris_proto::time::Timestamp {
                    epoch_ms: Some(l.epoch_ms),
                }),
                source: source.clone(),
                data: l.data,
                level: l.level,
                seq: l.seq,
                ..Default::default()
            })
            .collect();
    }
    Ok(job::GetProcessStatusResponse {
        process_info: Some(process_info(s, daemon_version())),
        log_entries,
    })
}
