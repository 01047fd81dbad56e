//! A local cluster's lifecycle from another terminal, and the published commands that have no
//! meaning for a one-binary controller.
//!
//! * `cluster stop` / `cluster restart` / `cluster controller checkpoint --stop`: the controller
//!   that holds a state dir is found through the dir's lock file (`controller.lock`, which names
//!   the holder's PID and address while the holder's `flock` is held; see
//!   `iris_rpc::dirlock`). It is stopped with SIGTERM, which a local cluster and
//!   `cluster controller serve` answer by stopping their workers and tasks and exiting; the
//!   command returns once the lock is free.
//! * `cluster dashboard` / `cluster dashboard-proxy`: a dashboard served from this process against
//!   the selected controller (our dashboard reads the controller only through its RPCs, so it
//!   is already the proxy the published command starts).
//! * `build ...` and `cluster controller worker-restart` (image builds, SSH bootstraps of VM
//!   workers) answer that this controller has nothing of the kind.

use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Exit code of a command this controller does not support.
pub const UNSUPPORTED: i32 = 2;

/// The state dir of the local cluster the command's flags select: `--state-dir`, else the
/// directory a cluster started from `--config`/`--cluster` keeps (by the config's name), else
/// `$IRIS_STATE_DIR`, else the default per-user one.
pub fn local_state_dir(
    state_dir: Option<&Path>,
    config: Option<&Path>,
    cluster: Option<&str>,
) -> anyhow::Result<PathBuf> {
    if let Some(d) = state_dir {
        return Ok(d.to_path_buf());
    }
    if let Some((path, cfg)) = crate::target::selected_config(config, cluster)? {
        return Ok(crate::target::cluster_state_dir(
            &crate::target::cluster_name(&cfg, &path),
        ));
    }
    Ok(std::env::var_os("IRIS_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(crate::local::default_state_dir))
}

pub use iris_rpc::dirlock::Holder;

/// The controller holding `dir` (see [`iris_rpc::dirlock::holder`]).
pub fn holder(dir: &Path) -> anyhow::Result<Option<Holder>> {
    iris_rpc::dirlock::holder(dir, "controller")
        .with_context(|| format!("checking the controller lock in {}", dir.display()))
}

#[derive(Args)]
pub struct StopArgs {
    /// Show what would be stopped without stopping it.
    #[arg(long, overrides_with = "no_dry_run")]
    pub dry_run: bool,
    #[arg(long)]
    pub no_dry_run: bool,
    /// The local cluster's state dir (default: the one --config/--cluster or the default
    /// local cluster uses).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

/// `iris cluster stop`: SIGTERM to the controller holding the state dir; waits until it exits.
pub async fn stop(a: &StopArgs, dir: &Path, url: &Option<String>) -> anyhow::Result<i32> {
    let Some(h) = holder(dir)? else {
        println!(
            "Nothing to stop: no controller is running on {}",
            dir.display()
        );
        return Ok(0);
    };
    let address = h.address.clone().unwrap_or_else(|| "starting".into());
    if a.dry_run {
        println!(
            "Would stop the controller (pid {}, {address}) on {}",
            h.pid,
            dir.display()
        );
        let cl = crate::client::controller_client(&h.address.clone().or(url.clone()))?;
        let req = iris_proto::cluster::controller::ListWorkersRequest::default();
        let listed: Result<iris_proto::cluster::controller::ListWorkersResponse, _> =
            crate::client::call(&cl, "ListWorkers", &req).await;
        if let Ok(w) = listed {
            println!(
                "Would stop its {} local worker(s) and their tasks:",
                w.workers.len()
            );
            for w in &w.workers {
                println!("  {} {}", w.worker_id(), w.address());
            }
        }
        return Ok(0);
    }
    terminate(&h, dir, Duration::from_secs(60)).await?;
    println!(
        "Stopped the controller (pid {}, {address}) on {} and its local workers",
        h.pid,
        dir.display()
    );
    Ok(0)
}

/// Sends SIGTERM to `h` and waits (at most `within`) until it no longer holds `dir`.
pub async fn terminate(h: &Holder, dir: &Path, within: Duration) -> anyhow::Result<()> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    match kill(Pid::from_raw(h.pid), Signal::SIGTERM) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => anyhow::bail!(
            "stopping the controller (pid {}) on {}: {e}; stop it as the user that started it",
            h.pid,
            dir.display()
        ),
    }
    let start = Instant::now();
    while holder(dir)?.is_some() {
        if start.elapsed() > within {
            anyhow::bail!(
                "the controller (pid {}) on {} did not stop within {}s of SIGTERM; look at its log, or `kill -9 {}`",
                h.pid,
                dir.display(),
                within.as_secs(),
                h.pid
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// `iris cluster controller checkpoint --stop`: the controller must be on this machine.
pub async fn stop_after_checkpoint(dir: &Path, url: &Option<String>) -> anyhow::Result<i32> {
    let Some(h) = holder(dir)? else {
        anyhow::bail!(
            "--stop: no controller is running on {} on this machine (the checkpoint was written); stop a remote controller where it runs, or pass --state-dir",
            dir.display()
        );
    };
    if let (Some(want), Some(have)) = (url, &h.address) {
        if want.trim_end_matches('/') != have.trim_end_matches('/') {
            anyhow::bail!(
                "--stop: the controller on {} is {have}, not {want} (the checkpoint was written); pass --state-dir of the controller to stop",
                dir.display()
            );
        }
    }
    terminate(&h, dir, Duration::from_secs(60)).await?;
    println!("Stopped the controller (pid {})", h.pid);
    Ok(0)
}

#[derive(Args)]
pub struct DashboardProxyArgs {
    /// Local port for the dashboard (0 = any free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

/// `iris cluster dashboard` and `dashboard-proxy`: serves the dashboard on 127.0.0.1 against
/// `url` until Ctrl-C or SIGTERM.
pub async fn dashboard(url: &str, port: u16) -> anyhow::Result<i32> {
    let bind = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (addr, handle) = iris_dashboard::serve(url.to_string(), bind)
        .await
        .with_context(|| format!("serving the dashboard on {bind}"))?;
    println!("Dashboard: http://{addr}/ (controller {url})");
    println!("Press Ctrl-C to stop.");
    crate::local::shutdown_signal().recv().await;
    handle.shutdown().await;
    Ok(0)
}

#[derive(Subcommand)]
pub enum LogServerCmd {
    /// Provision the cluster's log server (built into this controller: nothing to provision).
    Up {
        #[arg(long, overrides_with = "no_build")]
        build: bool,
        #[arg(long)]
        no_build: bool,
    },
    /// Stop the log server (it is the controller's own LogService: stop the controller).
    Down {
        #[arg(short = 'y', long)]
        yes: bool,
    },
    /// Restart the log server (it restarts with the controller).
    Restart {
        #[arg(long, overrides_with = "no_build")]
        build: bool,
        #[arg(long)]
        no_build: bool,
    },
    /// Show where the log server answers and whether it serves.
    Status,
    /// The log server's own diagnostics (the controller's: see `iris process logs`).
    Logs {
        #[arg(long, default_value_t = 200)]
        tail: i32,
        #[arg(short, long)]
        follow: bool,
    },
}

/// `iris cluster log-server ...`: the log store is the controller's `finelog.logging.LogService`
/// (the same RPCs the published finelog server answers), so there is no deployment to manage.
pub async fn log_server(cmd: LogServerCmd, url: &Option<String>) -> anyhow::Result<i32> {
    let cl = crate::client::controller_client(url)?;
    let probe = || async {
        cl.call::<_, iris_proto::finelog::logging::FetchLogsResponse>(
            "finelog.logging.LogService",
            "FetchLogs",
            &iris_proto::finelog::logging::FetchLogsRequest {
                source: "/system/controller".into(),
                max_lines: 1,
                ..Default::default()
            },
            Duration::from_secs(10),
        )
        .await
    };
    match cmd {
        LogServerCmd::Up { .. } => {
            probe().await.with_context(|| {
                format!(
                    "the log server built into the controller at {} does not answer",
                    cl.base()
                )
            })?;
            println!(
                "The log server is built into the controller and serving at {}/finelog.logging.LogService; nothing to provision.",
                cl.base()
            );
            Ok(0)
        }
        LogServerCmd::Status => match probe().await {
            Ok(_) => {
                println!("Log server: serving (built into the controller)");
                println!("Address: {}/finelog.logging.LogService", cl.base());
                Ok(0)
            }
            Err(e) => {
                println!("Log server: not answering at {} ({})", cl.base(), e.message);
                Ok(1)
            }
        },
        LogServerCmd::Down { .. } | LogServerCmd::Restart { .. } => {
            eprintln!(
                "error: the log server is the controller's own LogService at {}; it stops and restarts with the controller (`iris cluster stop`, `iris cluster restart`)",
                cl.base()
            );
            Ok(UNSUPPORTED)
        }
        LogServerCmd::Logs { .. } => {
            eprintln!(
                "error: the log server has no process of its own; its diagnostics are the controller's: `iris process logs`"
            );
            Ok(UNSUPPORTED)
        }
    }
}

#[derive(Subcommand)]
pub enum BuildCmd {
    /// Build and push every image.
    All {
        #[arg(long)]
        push: bool,
        #[arg(long)]
        platform: Option<String>,
        #[arg(long)]
        ghcr_org: Option<String>,
    },
    ControllerImage(ImageArgs),
    WorkerImage(ImageArgs),
    TaskImage {
        #[arg(short, long)]
        tag: Option<String>,
        #[arg(long)]
        push: bool,
        #[arg(long)]
        platform: Option<String>,
        #[arg(long)]
        ghcr_org: Option<String>,
    },
    Dashboard,
    Push {
        source_tag: String,
        #[arg(long)]
        ghcr_org: Option<String>,
        #[arg(long)]
        image_name: Option<String>,
        #[arg(long)]
        version: Option<String>,
    },
}

#[derive(Args)]
pub struct ImageArgs {
    #[arg(short, long)]
    pub tag: Option<String>,
    #[arg(long)]
    pub push: bool,
    #[arg(long)]
    pub context: Option<PathBuf>,
    #[arg(long)]
    pub platform: Option<String>,
    #[arg(long)]
    pub ghcr_org: Option<String>,
}

/// `iris build ...`: refused with the reason.
pub fn build(_cmd: BuildCmd) -> i32 {
    eprintln!(
        "error: `iris build` is not supported by this controller: Iris (Rust) is one `iris` binary (controller, worker, dashboard and CLI), so there are no controller, worker or dashboard images to build; build task images with your own Docker tooling and pass them with `job run --task-image`"
    );
    UNSUPPORTED
}

#[derive(Args)]
pub struct WorkerRestartArgs {
    #[arg(long = "worker-id", action = clap::ArgAction::Append)]
    pub worker_id: Vec<String>,
    #[arg(long)]
    pub timeout: Option<i64>,
    #[arg(long)]
    pub min_batch: Option<i64>,
    #[arg(long)]
    pub max_batch: Option<i64>,
    #[arg(long)]
    pub observation_window: Option<i64>,
    #[arg(long)]
    pub max_failures: Option<i64>,
    #[arg(long, overrides_with = "no_skip_current_hash")]
    pub skip_current_hash: bool,
    #[arg(long)]
    pub no_skip_current_hash: bool,
}

/// `iris cluster controller worker-restart`: refused with the reason.
pub fn worker_restart(_a: WorkerRestartArgs) -> i32 {
    eprintln!(
        "error: `cluster controller worker-restart` is not supported by this controller: it re-bootstraps GCP VM workers over SSH; local workers restart with their cluster (`iris cluster restart`), worker daemons by their supervisor (`iris worker serve` stops cleanly on SIGTERM; its tasks are rerun elsewhere)"
    );
    UNSUPPORTED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unheld_lock_has_no_holder_and_a_held_one_does() {
        let dir = std::env::temp_dir().join(format!("iris-lifecycle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        assert_eq!(holder(&dir).expect("read"), None, "no lock file");
        let lock = iris_rpc::dirlock::DirLock::acquire(&dir, "controller").expect("lock");
        lock.record(Some("http://127.0.0.1:1")).expect("record");
        let h = holder(&dir).expect("read").expect("held");
        assert_eq!(h.pid, std::process::id() as i32);
        assert_eq!(h.address.as_deref(), Some("http://127.0.0.1:1"));
        drop(lock);
        assert_eq!(holder(&dir).expect("read"), None, "released");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
