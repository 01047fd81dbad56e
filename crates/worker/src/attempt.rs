//! Attempt execution and process supervision: preparing an attempt's working directory (bundle
//! and workdir files), starting its command in its own process group with the `IRIS_*`
//! environment, pumping its output into the [`LogShipper`], and turning its exit into a final
//! state. Stopping attempts (`kill_group`, and stopping all of them on shutdown or when the
//! controller is lost) lives here too.

use crate::logs::{now_ms, LogShipper};
use crate::task_env::{task_environment, WorkerSide};
use crate::{bundle, levels, lock, setup, Attempt, Inner};
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
    let _ = std::fs::remove_dir_all(secrets_dir(&inner, &run));
    poke_controller(&inner).await;
}

/// Where an attempt's secrets live: on the host's tmpfs (`/dev/shm`, never on disk) when there
/// is one, in a per-user, per-worker directory outside the workdir, bundles and logs.
fn secrets_dir(inner: &Inner, run: &job::RunTaskRequest) -> std::path::PathBuf {
    // One directory per attempt, never the shared parent (an attempt without a uid, from an
    // older controller, is named by its task and number).
    let attempt = if run.attempt_uid.is_empty() {
        format!("{}_{}", sanitize(&run.task_id), run.attempt_id)
    } else {
        sanitize(&run.attempt_uid)
    };
    use sha2::Digest;
    let scope = hex::encode(sha2::Sha256::digest(
        inner.cfg.cache_dir.display().to_string().as_bytes(),
    ));
    let shm = std::path::Path::new("/dev/shm");
    let root = if shm.is_dir() {
        shm.join(format!("iris-secrets-{}", nix::unistd::getuid()))
    } else {
        inner.cfg.cache_dir.join("secrets")
    };
    root.join(&scope[..16]).join(attempt)
}

/// Writes each file owner-read-only (0400) in a fresh owner-only (0700) directory.
fn write_secrets(
    dir: &std::path::Path,
    files: &std::collections::BTreeMap<String, String>,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    for (name, value) in files {
        // Names were validated at submission (the AWS credentials file is ours); checked again
        // because a name becomes a path here.
        if name != ".aws-credentials" && !iris_types::ids::valid_secret_name(name) {
            return Err(std::io::Error::other(format!("invalid secret name {name}")));
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(dir.join(name))?
            .write_all(value.as_bytes())?;
    }
    Ok(())
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
    let venv = dir.join(".venv");
    let mut side = WorkerSide {
        worker_id: inner.cfg.worker_id.clone(),
        controller_url: inner.cfg.controller_url.clone(),
        advertise_host: inner.advertise_host.clone(),
        bind_host: inner.cfg.bind.ip().to_string(),
        workdir: dir.display().to_string(),
        venv: venv.display().to_string(),
        python: inner.python.clone(),
        region: inner
            .cfg
            .attributes
            .iter()
            .find(|(k, _)| k == "region")
            .map(|(_, v)| v.clone()),
        task_env: inner.cfg.task_env.clone(),
        ports: run.ports.iter().map(|p| (p.clone(), free_port())).collect(),
        secrets_dir: None,
    };
    let secrets = run
        .environment
        .as_ref()
        .map(|e| e.secrets.clone())
        .unwrap_or_default();
    if !secrets.is_empty() {
        let dir = secrets_dir(inner, run);
        write_secrets(
            &dir,
            &crate::task_env::secret_files(&secrets.into_iter().collect()),
        )
        .with_context(|| format!("writing the job's secrets to {}", dir.display()))?;
        side.secrets_dir = Some(dir.display().to_string());
    }

    // Setup phase (BUILDING): each setup command in its own bash, in the workdir, with the
    // task's environment; the venv they populate is `$IRIS_VENV`.
    let commands = run
        .entrypoint
        .as_ref()
        .map(|e| e.setup_commands.clone())
        .unwrap_or_default();
    let steps = match setup::plan(
        &commands,
        dir.join("pyproject.toml").is_file(),
        venv.is_dir(),
        crate::find_on_path("uv").is_some(),
    ) {
        Ok(s) => s,
        Err(why) => return Ok((TaskState::Failed, -1, why)),
    };
    let total = steps.len();
    // Every step that runs sees the same environment; uv finds the worker's base interpreter
    // last on its PATH.
    let setup_env = if steps.iter().any(|s| matches!(s, setup::Step::Run(_))) {
        let mut env = task_environment(run, &side);
        if let Some(home) = &inner.python_home {
            let path = search_path(&env, None, Some(home));
            env.insert("PATH".into(), path);
        }
        env
    } else {
        Default::default()
    };
    for (i, step) in steps.into_iter().enumerate() {
        let script = match step {
            setup::Step::Skip(notice) => {
                if let Some(message) = notice {
                    push_line(logs, run.attempt_id, Stream::Build, message);
                }
                continue;
            }
            setup::Step::Run(script) => script,
        };
        push_line(
            logs,
            run.attempt_id,
            Stream::Build,
            format!("[iris setup] step {}/{total}", i + 1),
        );
        let file = dir.join(format!("_iris_setup_step_{}.sh", i + 1));
        std::fs::write(&file, &script).context("writing a setup step")?;
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg(&file).envs(&setup_env);
        let (status, last) = match supervise(inner, uid, cmd, dir, logs, run, false).await? {
            Supervised::Exited(s, last) => (s, last),
            Supervised::NotStarted(e) => {
                return Ok((TaskState::Failed, -1, format!("cannot start setup: {e}")))
            }
        };
        if let Some(ended) = stopped_outcome(inner, uid, &status) {
            return Ok(ended);
        }
        if !status.success() {
            let code = status.code().unwrap_or(-1);
            let mut error = format!("setup step {}/{total} failed with exit code {code}", i + 1);
            if !last.is_empty() {
                error.push_str(": ");
                error.push_str(&last);
            }
            return Ok((TaskState::Failed, code, error));
        }
    }

    // Run phase (RUNNING): the synced venv, when setup left one, is active and runs callables.
    let venv_bin = venv.join("bin");
    if venv_bin.join("python").is_file() {
        side.python = venv_bin.join("python").display().to_string();
    }
    let mut env = task_environment(run, &side);
    if venv_bin.join("activate").is_file() {
        let path = search_path(&env, Some(&venv_bin), None);
        env.insert("PATH".into(), path);
        env.insert("VIRTUAL_ENV".into(), venv.display().to_string());
    }
    let run_env = Arc::new(crate::RunEnv {
        dir: dir.to_path_buf(),
        env: env.clone(),
    });
    set_state(inner, uid, |a| a.run_env = Some(run_env));
    let mut cmd = tokio::process::Command::new(prog);
    cmd.args(args).envs(env);
    let (status, last_stderr) = match supervise(inner, uid, cmd, dir, logs, run, true).await? {
        Supervised::Exited(s, last) => (s, last),
        Supervised::NotStarted(e) => {
            return Ok((TaskState::Failed, -1, format!("cannot start {prog}: {e}")))
        }
    };
    if let Some(ended) = stopped_outcome(inner, uid, &status) {
        return Ok(ended);
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

/// Which stream a captured line came from.
#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
    /// The setup phase's output (both streams): the reference's `build` source, whose lines
    /// carry their own prefix level or none (UNKNOWN passes every level filter).
    Build,
}

fn push_line(logs: &mut LogShipper, attempt_id: i32, stream: Stream, line: String) {
    let (source, level) = match stream {
        Stream::Stdout => ("stdout", levels::classify(false, &line)),
        Stream::Stderr => ("stderr", levels::classify(true, &line)),
        Stream::Build => ("build", levels::classify_build(&line)),
    };
    logs.buf.push(fl::LogEntry {
        timestamp: Some(fl::Timestamp { epoch_ms: now_ms() }),
        source: Some(source.into()),
        data: Some(line),
        attempt_id: Some(attempt_id),
        level: Some(level),
        key: None,
        seq: Some(logs.next_seq),
    });
    logs.next_seq += 1;
}

/// The task's `PATH` (its job's, else the worker's) with `first` put before it and `last` after.
fn search_path(
    env: &std::collections::BTreeMap<String, String>,
    first: Option<&std::path::Path>,
    last: Option<&std::path::Path>,
) -> String {
    let base = env
        .get("PATH")
        .map(std::ffi::OsString::from)
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_default();
    let dirs = first
        .map(std::path::Path::to_path_buf)
        .into_iter()
        .chain(std::env::split_paths(&base))
        .chain(last.map(std::path::Path::to_path_buf));
    std::env::join_paths(dirs)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| base.to_string_lossy().into_owned())
}

enum Supervised {
    Exited(std::process::ExitStatus, String),
    NotStarted(std::io::Error),
}

/// Starts `cmd` in `dir` in its own process group (recorded so a stop kills it), ships its
/// output line by line, and waits for it; returns its status and its last stderr line. With
/// `running`, the attempt is reported RUNNING once the process has started.
async fn supervise(
    inner: &Arc<Inner>,
    uid: &str,
    mut cmd: tokio::process::Command,
    dir: &std::path::Path,
    logs: &mut LogShipper,
    run: &job::RunTaskRequest,
    running: bool,
) -> anyhow::Result<Supervised> {
    cmd.current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ok(Supervised::NotStarted(e)),
    };
    let pgid = child.id().map(|p| p as i32);
    let mut stop_now = false;
    set_state(inner, uid, |a| {
        a.pgid = pgid;
        if let Some(pg) = pgid {
            a.container_id = crate::service::container_id(pg);
        }
        if running {
            a.state = TaskState::Running;
        }
        stop_now = a.stop_requested;
    });
    if stop_now {
        if let Some(pg) = pgid {
            kill_group(pg);
        }
    }
    if running {
        poke_controller(inner).await;
    }
    let (ltx, mut lrx) = tokio::sync::mpsc::channel::<(bool, String)>(1024);
    let readers: [(bool, Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>); 2] = [
        (
            false,
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ),
        (
            true,
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ),
    ];
    for (is_err, reader) in readers {
        let Some(reader) = reader else { continue };
        let t = ltx.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(reader).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if t.send((is_err, l)).await.is_err() {
                    break;
                }
            }
        });
    }
    drop(ltx);
    let mut last_stderr = String::new();
    let mut last_flush = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_millis(200), lrx.recv()).await {
            Ok(Some((is_err, line))) => {
                if is_err {
                    last_stderr = line.clone();
                }
                let stream = match (running, is_err) {
                    (false, _) => Stream::Build,
                    (true, false) => Stream::Stdout,
                    (true, true) => Stream::Stderr,
                };
                push_line(logs, run.attempt_id, stream, line);
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
    let status = child
        .wait()
        .await
        .context("waiting for the task's process")?;
    // Reap any grandchildren left in the group.
    if let Some(pg) = pgid {
        kill_group(pg);
    }
    set_state(inner, uid, |a| a.pgid = None);
    Ok(Supervised::Exited(status, last_stderr))
}

/// The final outcome when the process ended because the worker or the controller stopped it.
fn stopped_outcome(
    inner: &Inner,
    uid: &str,
    status: &std::process::ExitStatus,
) -> Option<(TaskState, i32, String)> {
    let (stopped, abandoned) = lock(&inner.attempts)
        .get(uid)
        .map(|a| (a.stop_requested, a.abandoned))
        .unwrap_or((false, false));
    if abandoned {
        return Some((
            TaskState::WorkerFailed,
            status.code().unwrap_or(-1),
            "Killed by the worker: no reconcile from the controller within the heartbeat timeout"
                .into(),
        ));
    }
    if stopped {
        return Some((
            TaskState::Killed,
            status.code().unwrap_or(-1),
            "Stopped by controller".into(),
        ));
    }
    None
}
