//! Attempt execution and process supervision: preparing an attempt's working directory (bundle
//! and workdir files), starting its command in its own process group with the `IRIS_*`
//! environment, pumping its output into the [`LogShipper`], and turning its exit into a final
//! state. Stopping attempts (`kill_group`, and stopping all of them on shutdown or when the
//! controller is lost) lives here too.

use crate::logs::{now_ms, LogShipper};
use crate::{bundle, lock, Attempt, Inner};
use anyhow::Context;
use iris_proto::finelog::logging as fl;
use iris_proto::job;
use iris_types::TaskState;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

pub(crate) fn kill_all(inner: &Inner) {
    for a in lock(&inner.attempts).values_mut() {
        if let Some(pg) = a.pgid {
            a.stop_requested = true;
            kill_group(pg);
        }
    }
}

/// The controller has been unreachable past the heartbeat timeout: stop every live attempt.
/// Each ends WORKER_FAILED, so the controller reruns it under the preemption budget.
pub(crate) fn abandon_all(inner: &Inner) {
    for a in lock(&inner.attempts).values_mut() {
        if !a.state.is_terminal() {
            a.stop_requested = true;
            a.abandoned = true;
            if let Some(pg) = a.pgid {
                kill_group(pg);
            }
        }
    }
}

pub(crate) fn kill_group(pgid: i32) {
    use nix::sys::signal::{killpg, Signal};
    use nix::unistd::Pid;
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
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

pub(crate) async fn run_attempt(inner: Arc<Inner>, uid: String, run: job::RunTaskRequest) {
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
        Err(e) => (TaskState::Failed, -1, format!("setup failed: {e:#}")),
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
) -> anyhow::Result<(TaskState, i32, String)> {
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
        Err(e) => return Ok((TaskState::Failed, -1, format!("cannot start {prog:?}: {e}"))),
    };
    let pgid = child.id().map(|p| p as i32);
    let mut stop_now = false;
    set_state(inner, uid, |a| {
        a.pgid = pgid;
        a.state = TaskState::Running;
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
            TaskState::WorkerFailed,
            status.code().unwrap_or(-1),
            "Killed by the worker: no reconcile from the controller within the heartbeat timeout"
                .into(),
        ));
    }
    if stopped {
        return Ok((
            TaskState::Killed,
            status.code().unwrap_or(-1),
            "Stopped by controller".into(),
        ));
    }
    use std::os::unix::process::ExitStatusExt;
    let (code, mut error) = match (status.code(), status.signal()) {
        (Some(0), _) => return Ok((TaskState::Succeeded, 0, String::new())),
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
    Ok((TaskState::Failed, code, error))
}
