//! `cluster start --local`, `cluster controller serve`, `worker serve`.

use crate::config;
use anyhow::Context;
use clap::Args;
use iris_controller::{ControllerConfig, GroupCapacity};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct StartArgs {
    /// Run controller and workers on 127.0.0.1 in this process.
    #[arg(long)]
    pub local: bool,
    /// Cluster YAML (scale groups decide the local workers); default: the embedded local config.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where the DB, bundles and logs live (default: a per-user data directory).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Controller port (0 = `controller.local.port` from --config, else any free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Dashboard port on 127.0.0.1 (0 = any free port).
    #[arg(long, default_value_t = 0)]
    pub dashboard_port: u16,
    /// Run a sample job to completion, print its output, then stop.
    #[arg(long)]
    pub sample: bool,
    /// The interpreter the local workers run Python-callable jobs with (`IRIS_PYTHON`;
    /// default: `python3`, else `python`, from PATH).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Start with an empty database: the state dir's DB is set aside (renamed, not deleted) and
    /// no checkpoint is restored.
    #[arg(long)]
    pub fresh: bool,
    /// Accepted for the published CLI's scripts; a local cluster builds no images.
    #[arg(long)]
    pub image_platform: Option<String>,
    /// Accepted for the published CLI's scripts; a local cluster runs this binary as it is.
    #[arg(long, value_parser = ["fast", "release"])]
    pub cargo_profile: Option<String>,
    #[command(flatten)]
    pub fed: FederationArgs,
}

impl StartArgs {
    /// `cluster restart`: a local cluster from `config` (the embedded one when `None`).
    pub fn restart(config: Option<PathBuf>, state_dir: Option<PathBuf>) -> StartArgs {
        StartArgs {
            local: true,
            config,
            state_dir,
            port: 0,
            dashboard_port: 0,
            sample: false,
            python: None,
            fresh: false,
            image_platform: None,
            cargo_profile: None,
            fed: FederationArgs::default(),
        }
    }
}

#[derive(Args)]
pub struct ServeArgs {
    #[arg(long, required_unless_present = "dry_run")]
    pub state_dir: Option<PathBuf>,
    /// Validate --config, print what this controller would run from it, and exit.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: std::net::SocketAddr,
    /// Bind host (overrides --bind's host).
    #[arg(long)]
    pub host: Option<std::net::IpAddr>,
    /// Bind port (overrides --bind's port).
    #[arg(long)]
    pub port: Option<u16>,
    /// Restore this checkpoint directory (`<remote_state_dir>/controller-state/<epoch_ms>`) into
    /// an empty state dir (with --fresh, the existing DB is set aside first).
    #[arg(long)]
    pub checkpoint_path: Option<String>,
    /// Start with an empty database: the state dir's DB is set aside (renamed, not deleted) and
    /// no checkpoint is restored (unless --checkpoint-path names one).
    #[arg(long)]
    pub fresh: bool,
    /// Also serve the web dashboard on this address (e.g. 127.0.0.1:0). With auth on it acts as
    /// each browser's session user (`?session_token=` login).
    #[arg(long)]
    pub dashboard_bind: Option<std::net::SocketAddr>,
    /// Seconds without a successful reconcile before a worker is declared failed.
    #[arg(long, default_value_t = 10.0)]
    pub worker_grace: f64,
    /// Idle reconciles per second the whole fleet may make (past it, idle rounds stretch).
    #[arg(long, default_value_t = 1000)]
    pub max_reconciles_per_second: u32,
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Checkpoints and the rollout record: a local path or a file://, s3:// or gs:// URL
    /// (default: `storage.remote_state_dir` from --config; none: no checkpoints).
    #[arg(long)]
    pub remote_state_dir: Option<String>,
    /// Take a checkpoint every N seconds (0 = only on request).
    #[arg(long, default_value_t = 0.0)]
    pub checkpoint_interval: f64,
    /// Prune checkpoint directories older than N seconds (default 3 days).
    #[arg(long, default_value_t = 3.0 * 24.0 * 3600.0)]
    pub checkpoint_max_age: f64,
    /// With no local DB, restore this checkpoint (`controller-state/<epoch_ms>`) instead of the newest.
    #[arg(long)]
    pub restore_checkpoint: Option<String>,
    /// Delete finished job trees (tasks, attempts, events, logs) N seconds after they end
    /// (default 7 days; 0 = keep forever).
    #[arg(long, default_value_t = 7.0 * 24.0 * 3600.0)]
    pub job_retention: f64,
    /// Run the retention sweep every N seconds.
    #[arg(long, default_value_t = 3600.0)]
    pub prune_interval: f64,
    /// Time limit in seconds for one `iris query` (ExecuteRawQuery).
    #[arg(long, default_value_t = 10.0)]
    pub query_timeout: f64,
    #[command(flatten)]
    pub fed: FederationArgs,
}

/// Federation tuning, shared by `cluster start --local` and `cluster controller serve`.
#[derive(Args, Clone)]
pub struct FederationArgs {
    /// Seconds between `ListBackends` heartbeats to each federation peer (a peer that failed a
    /// call is probed every second instead until it answers).
    #[arg(long, default_value_t = 30.0)]
    pub federation_heartbeat: f64,
    /// Seconds between sync rounds (deliver, cancel, mirror) with each federation peer.
    #[arg(long, default_value_t = 3.0)]
    pub federation_sync_interval: f64,
    /// At most this many jobs promoted to one peer per control tick.
    #[arg(long, default_value_t = 8)]
    pub max_federation_handoffs_per_cycle: usize,
}

impl Default for FederationArgs {
    fn default() -> Self {
        FederationArgs {
            federation_heartbeat: 30.0,
            federation_sync_interval: 3.0,
            max_federation_handoffs_per_cycle: 8,
        }
    }
}

/// The federation settings of `cfg` (none without one) with `a`'s tuning, validated the same way
/// for every command that starts a controller.
fn federation_settings(
    cfg: Option<&config::ClusterConfig>,
    a: &FederationArgs,
) -> anyhow::Result<iris_controller::federation::FederationConfig> {
    let mut out = match cfg {
        Some(cfg) => {
            let f = config::federation(cfg)?;
            if !f.peers.is_empty() && cfg.auth.as_ref().is_none_or(|a| a.signing_key.is_empty()) {
                anyhow::bail!("peers: a controller with federation peers needs a persistent auth.signing_key (peers pin its public key); create one with `iris cluster init-keys --out-file F` and set auth.signing_key: file:F");
            }
            f
        }
        None => Default::default(),
    };
    for (flag, v) in [
        ("--federation-heartbeat", a.federation_heartbeat),
        ("--federation-sync-interval", a.federation_sync_interval),
    ] {
        if !(v > 0.0 && v.is_finite()) {
            anyhow::bail!("{flag}: must be a positive number of seconds");
        }
    }
    if a.max_federation_handoffs_per_cycle == 0 {
        anyhow::bail!("--max-federation-handoffs-per-cycle: must be at least 1");
    }
    out.heartbeat_interval = Duration::from_secs_f64(a.federation_heartbeat);
    out.sync_interval = Duration::from_secs_f64(a.federation_sync_interval);
    out.max_handoffs_per_cycle = a.max_federation_handoffs_per_cycle;
    Ok(out)
}

/// `controller.local.port` of a config (`None` when absent or 0), refusing a value that is not a
/// port rather than ignoring it.
fn config_port(cfg: &config::ClusterConfig) -> anyhow::Result<Option<u16>> {
    let Some(v) = cfg
        .controller
        .as_ref()
        .and_then(|c| c.get("local"))
        .and_then(|l| l.get("port"))
    else {
        return Ok(None);
    };
    match v.as_u64().and_then(|p| u16::try_from(p).ok()) {
        Some(0) => Ok(None),
        Some(p) => Ok(Some(p)),
        None => anyhow::bail!(
            "controller.local.port: expected a port number (0-65535, 0 = any free port)"
        ),
    }
}

#[derive(Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub worker_id: Option<String>,
    /// Address the worker serves `Reconcile` on (port 0 picks one); the controller and other
    /// tasks reach it and its tasks there, so it must be reachable from the controller.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: std::net::SocketAddr,
    #[arg(long, default_value_t = 4)]
    pub cpu: i32,
    #[arg(long, default_value = "16GB")]
    pub memory: String,
    #[arg(long, default_value = "100GB")]
    pub disk: String,
    /// Advertise accelerators, e.g. `gpu:h100:8` (may be fake: for testing and development).
    #[arg(long)]
    pub device: Option<String>,
    /// Worker attribute KEY=VALUE (repeatable).
    #[arg(long = "attribute", action = clap::ArgAction::Append)]
    pub attributes: Vec<String>,
    #[arg(long, default_value = "")]
    pub scale_group: String,
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 600.0)]
    pub heartbeat_timeout: f64,
    /// The interpreter Python-callable jobs run with when the task has no synced `.venv`
    /// (`IRIS_PYTHON`; default: `python3`, else `python`, from PATH).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Default task env KEY=VALUE for every task on this worker (repeatable); the job's env
    /// overrides it.
    #[arg(long = "task-env", action = clap::ArgAction::Append)]
    pub task_env: Vec<String>,
}

pub fn default_state_dir() -> PathBuf {
    dirs::data_local_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("iris")
        .join("local")
}

/// The controller URL a running local cluster recorded in the default state dir.
pub fn recorded_url() -> Option<String> {
    let dir = std::env::var_os("IRIS_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(default_state_dir);
    std::fs::read_to_string(dir.join("controller.url"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn revision_date() -> Option<String> {
    std::env::var("IRIS_REVISION_DATE")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| Some("2026-10-24".into()))
}

/// A scale group as the local platform runs it: its workers are in-process daemons.
#[derive(Clone)]
pub(crate) struct GroupPlan {
    pub(crate) name: String,
    /// Workers per slice (`num_vms`); a group without `max_slices` runs one such slice always.
    pub(crate) count: u32,
    pub(crate) cpu: i32,
    pub(crate) memory: i64,
    pub(crate) disk: i64,
    pub(crate) device: Option<(String, String, i32)>,
    pub(crate) attributes: Vec<(String, String)>,
    /// The most workers the group can have.
    pub(crate) max: u32,
    /// Set when the group scales by demand (its config names `max_slices`).
    pub(crate) autoscale: Option<iris_scheduler::autoscale::GroupPolicy>,
}

pub(crate) fn plan_groups(cfg: &config::ClusterConfig) -> anyhow::Result<Vec<GroupPlan>> {
    let mut out = Vec::new();
    let idle_threshold_ms = cfg.scale_down_delay_ms()?;
    for (name, g) in &cfg.scale_groups {
        let r = &g.resources;
        let memory = match &r.ram {
            Some(s) => iris_types::resources::parse_bytes(s)
                .map_err(|e| anyhow::anyhow!("scale_groups.{name}.resources.ram: {e}"))?,
            None => 16 << 30,
        };
        let disk = match &r.disk {
            Some(s) => iris_types::resources::parse_bytes(s)
                .map_err(|e| anyhow::anyhow!("scale_groups.{name}.resources.disk: {e}"))?,
            None => 100 << 30,
        };
        let dtype = r.device_type.clone().unwrap_or_else(|| "cpu".into());
        let device = match dtype.as_str() {
            "cpu" => None,
            "gpu" | "tpu" => Some((
                dtype.clone(),
                r.device_variant.clone().unwrap_or_default(),
                r.device_count.unwrap_or(1),
            )),
            other => anyhow::bail!(
                "scale_groups.{name}.resources.device_type: unknown '{other}' (cpu, gpu or tpu)"
            ),
        };
        let mut attributes: Vec<(String, String)> = g
            .attributes
            .iter()
            .map(|(k, v)| (k.clone(), config::attr_string(v)))
            .collect();
        if let Some(w) = &g.worker {
            attributes.extend(
                w.attributes
                    .iter()
                    .map(|(k, v)| (k.clone(), config::attr_string(v))),
            );
        }
        let preemptible = r
            .preemptible
            .unwrap_or(r.capacity_type.as_deref() == Some("preemptible"));
        attributes.push(("preemptible".into(), preemptible.to_string()));
        attributes.push(("scale-group".into(), name.clone()));
        let per_slice = g.num_vms.unwrap_or(1).max(1);
        // The reference scales every group between buffer_slices and max_slices (default 0:
        // never). A group that names no max_slices is one fixed slice here, so a config of
        // num_vms alone keeps its workers (ARCHITECTURE.md, "Deliberate difference").
        let autoscale = g
            .max_slices
            .map(|max| iris_scheduler::autoscale::GroupPolicy {
                num_vms: per_slice,
                buffer_slices: g.buffer_slices.unwrap_or(0),
                max_slices: max,
                idle_threshold_ms,
                priority: g.priority.unwrap_or(100),
            });
        out.push(GroupPlan {
            name: name.clone(),
            count: per_slice,
            cpu: r.cpu.unwrap_or(16.0).ceil() as i32,
            memory,
            disk,
            device,
            attributes,
            max: match &autoscale {
                Some(p) => p.max_slices * per_slice,
                None => per_slice,
            },
            autoscale,
        });
    }
    Ok(out)
}

fn capacity(g: &GroupPlan) -> GroupCapacity {
    use iris_types::{AttrValue, Resources};
    let mut attributes = std::collections::BTreeMap::new();
    for (k, v) in &g.attributes {
        attributes.insert(k.clone(), AttrValue::Str(v.clone()));
    }
    let (dtype, variant, gpu, tpu): (String, String, i64, i64) = match &g.device {
        Some((t, v, n)) => (
            t.clone(),
            v.to_ascii_lowercase(),
            if t == "gpu" { *n as i64 } else { 0 },
            if t == "tpu" { *n as i64 } else { 0 },
        ),
        None => ("cpu".into(), "cpu".into(), 0, 0),
    };
    attributes.insert("device-type".into(), AttrValue::Str(dtype));
    attributes.insert("device-variant".into(), AttrValue::Str(variant));
    GroupCapacity {
        name: g.name.clone(),
        capacity: Resources {
            cpu_millicores: g.cpu as i64 * 1000,
            memory_bytes: g.memory,
            disk_bytes: g.disk,
            gpu,
            tpu,
        },
        attributes,
        max_workers: g.max,
        autoscale: g.autoscale.clone(),
    }
}

fn short_id() -> String {
    let mut b = [0u8; 4];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
    hex::encode(b)
}

pub async fn start(a: StartArgs) -> anyhow::Result<i32> {
    let stop = shutdown_signal();
    if !a.local {
        anyhow::bail!("only --local clusters can be started from here; for a remote controller run `iris cluster controller serve` on its VM");
    }
    let cfg = match &a.config {
        Some(p) => config::load(p)?,
        None => config::parse(config::DEFAULT_LOCAL, "embedded default")?,
    };
    for w in cfg.warnings() {
        eprintln!("warning: {w}");
    }
    let groups = plan_groups(&cfg)?;
    // A cluster started from a config keeps its own state (and recorded address) by name, so
    // `iris --config FILE ...` reaches the right one of several.
    let state_dir = a.state_dir.clone().unwrap_or_else(|| match &a.config {
        Some(p) => crate::target::cluster_state_dir(&crate::target::cluster_name(&cfg, p)),
        None => default_state_dir(),
    });
    if a.image_platform.is_some() || a.cargo_profile.is_some() {
        eprintln!("note: --image-platform and --cargo-profile have no effect on a local cluster (it runs this binary; nothing is built)");
    }
    let mut ccfg = ControllerConfig::local(state_dir.clone());
    ccfg.fresh = a.fresh;
    let port = match a.port {
        0 => config_port(&cfg)?.unwrap_or(0),
        p => p,
    };
    ccfg.bind = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    ccfg.revision_date = revision_date();
    ccfg.groups = groups.iter().map(capacity).collect();
    // `peers:` and federation auth exactly as `cluster controller serve` takes them.
    ccfg.federation = federation_settings(Some(&cfg), &a.fed)?;
    // Local mode rewrites any config for local use (as the reference does): checkpoints go next
    // to the state dir, never to the config's cloud bucket.
    ccfg.remote_state_dir = Some(state_dir.join("remote-state").display().to_string());
    ccfg.auth = crate::keys::auth_from_config(&cfg)?;
    (ccfg.budget_defaults, ccfg.budget_tiers) = cfg.budgets()?;
    // With auth on, the printed dashboard URL logs the local user in (a 1-hour admin session).
    let session = ccfg.auth.as_ref().map(|a| {
        let user = std::env::var("USER").unwrap_or_else(|_| "local-admin".into());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        a.keypair
            .mint(
                &a.issuer,
                "iris",
                &user,
                "admin",
                3600,
                now,
                Default::default(),
            )
            .map_err(|e| anyhow::anyhow!("minting the dashboard session token: {e}"))
    });
    let session = session.transpose()?;
    let ctl = iris_controller::start(ccfg).await?;
    let url = ctl.url();
    std::fs::write(state_dir.join("controller.url"), &url)
        .context("recording the controller address")?;
    println!("Controller started at {url}");
    println!("State dir: {}", state_dir.display());
    let dashboard_bind = std::net::SocketAddr::from(([127, 0, 0, 1], a.dashboard_port));
    let dashboard = start_dashboard(&url, dashboard_bind, session).await?;
    let slices = std::sync::Arc::new(crate::slices::LocalSlices {
        controller_url: url.clone(),
        state_dir: state_dir.clone(),
        python: a.python.clone(),
        task_env: cfg.task_env()?,
        groups: groups.iter().map(|g| (g.name.clone(), g.clone())).collect(),
        running: tokio::sync::Mutex::new(std::collections::HashMap::new()),
    });
    // A group without max_slices is one slice of num_vms workers for as long as the cluster
    // runs; the others start and stop slices by demand.
    let mut workers = Vec::new();
    for g in groups.iter().filter(|g| g.autoscale.is_none()) {
        for i in 0..g.count {
            let id = format!("worker-{}-{i}-{}", g.name, short_id());
            workers.push(slices.start_worker(g, &id).await?);
        }
    }
    println!("Started {} local worker(s)", workers.len());
    let scaled: Vec<String> = groups
        .iter()
        .filter_map(|g| {
            g.autoscale.as_ref().map(|p| {
                format!(
                    "{} ({}-{} slices of {} worker(s))",
                    g.name, p.buffer_slices, p.max_slices, p.num_vms
                )
            })
        })
        .collect();
    if !scaled.is_empty() {
        println!("Autoscaling: {}", scaled.join(", "));
        ctl.autoscale(slices.clone());
    }
    let code = if a.sample {
        let cl = crate::client::controller_client(&Some(url.clone()))?;
        run_sample(&cl).await?
    } else {
        println!("Press Ctrl-C to stop.");
        // SIGTERM too: a supervisor (systemd, Kubernetes, a test) stops us with it, and the
        // workers must stop their tasks on the way out.
        stop.recv().await;
        0
    };
    // A last checkpoint while the state is quiet, so `cluster start` again restores it.
    if let Err(e) = ctl.controller.checkpoint_now().await {
        eprintln!("warning: checkpoint on stop: {e}");
    }
    for w in workers {
        w.shutdown().await;
    }
    slices.stop_all().await;
    dashboard.shutdown().await;
    ctl.shutdown().await;
    let _ = std::fs::remove_file(state_dir.join("controller.url"));
    Ok(code)
}

async fn run_sample(cl: &iris_rpc::Client) -> anyhow::Result<i32> {
    use iris_proto::cluster::controller as c;
    use iris_proto::job;
    let name = format!(
        "/{}/sample-{}",
        std::env::var("USER").unwrap_or_else(|_| "root".into()),
        short_id()
    );
    let script = "echo \"hello from $IRIS_TASK_ID on $IRIS_WORKER_ID\"; for i in 1 2 3; do echo \"step $i of 3\"; done; echo done";
    let req = c::LaunchJobRequest {
        name: Some(name),
        entrypoint: Some(job::RuntimeEntrypoint {
            run_command: Some(job::CommandEntrypoint {
                argv: vec!["sh".into(), "-c".into(), script.into()],
            }),
            ..Default::default()
        }),
        resources: Some(job::ResourceSpecProto {
            cpu_millicores: 100,
            memory_bytes: 1 << 30,
            disk_bytes: 1 << 30,
            device: None,
        }),
        replicas: Some(1),
        max_retries_preemption: Some(1000),
        ..Default::default()
    };
    let r: c::LaunchJobResponse = cl
        .call(
            "iris.cluster.ControllerService",
            "LaunchJob",
            &req,
            Duration::from_secs(60),
        )
        .await?;
    println!("Submitted sample job {}", r.job_id);
    let code = crate::cmd::job::stream_sample(cl, &r.job_id).await?;
    Ok(code)
}

pub async fn serve_controller(a: ServeArgs) -> anyhow::Result<i32> {
    let stop = shutdown_signal();
    if a.dry_run {
        return crate::dry_run::report(a.config.as_deref());
    }
    let state_dir = a
        .state_dir
        .clone()
        .context("--state-dir: required (where the controller keeps its DB and logs)")?;
    let ccfg_state_dir = state_dir.clone();
    let mut ccfg = ControllerConfig::local(state_dir);
    ccfg.bind = a.bind;
    if let Some(h) = a.host {
        ccfg.bind.set_ip(h);
    }
    if let Some(p) = a.port {
        ccfg.bind.set_port(p);
    }
    ccfg.revision_date = revision_date();
    ccfg.worker_grace = Duration::from_secs_f64(a.worker_grace.max(0.1));
    ccfg.max_reconciles_per_second = a.max_reconciles_per_second;
    if !(a.query_timeout > 0.0 && a.query_timeout.is_finite()) {
        anyhow::bail!("--query-timeout: must be a positive number of seconds");
    }
    ccfg.query_time_limit = Duration::from_secs_f64(a.query_timeout);
    if a.checkpoint_interval < 0.0 || a.checkpoint_max_age < 0.0 {
        anyhow::bail!("--checkpoint-interval and --checkpoint-max-age must not be negative");
    }
    ccfg.checkpoint_interval =
        (a.checkpoint_interval > 0.0).then(|| Duration::from_secs_f64(a.checkpoint_interval));
    ccfg.checkpoint_max_age = Duration::from_secs_f64(a.checkpoint_max_age);
    if !(a.job_retention >= 0.0 && a.job_retention.is_finite()) {
        anyhow::bail!("--job-retention: must be a number of seconds, 0 or more (0 keeps finished jobs forever)");
    }
    if !(a.prune_interval > 0.0 && a.prune_interval.is_finite()) {
        anyhow::bail!("--prune-interval: must be a positive number of seconds");
    }
    ccfg.job_retention = (a.job_retention > 0.0).then(|| Duration::from_secs_f64(a.job_retention));
    ccfg.prune_interval = Duration::from_secs_f64(a.prune_interval);
    ccfg.restore_checkpoint = a.restore_checkpoint.clone();
    ccfg.remote_state_dir = a.remote_state_dir.clone();
    if let Some(path) = &a.checkpoint_path {
        let (remote, name) = split_checkpoint_path(path)?;
        if a.restore_checkpoint.is_some() {
            anyhow::bail!("pass either --checkpoint-path or --restore-checkpoint, not both");
        }
        match &a.remote_state_dir {
            Some(r) if r.trim_end_matches('/') != remote => anyhow::bail!(
                "--checkpoint-path {path} is not under --remote-state-dir {r}; pass one of them"
            ),
            _ => {}
        }
        ccfg.remote_state_dir = Some(remote);
        ccfg.restore_checkpoint = Some(name);
    }
    // --fresh sets the DB aside; a named checkpoint is then restored into the empty dir.
    ccfg.fresh = a.fresh;
    let loaded = match &a.config {
        Some(p) => Some(config::load(p)?),
        None => None,
    };
    let kube = match &loaded {
        Some(cfg) => crate::kube_config::kube_settings(cfg)?,
        None => None,
    };
    if let Some(cfg) = &loaded {
        for w in cfg.warnings() {
            eprintln!("warning: {w}");
        }
        ccfg.groups = plan_groups(cfg)?.iter().map(capacity).collect();
        ccfg.auth = crate::keys::auth_from_config(cfg)?;
        (ccfg.budget_defaults, ccfg.budget_tiers) = cfg.budgets()?;
        if ccfg.remote_state_dir.is_none() {
            ccfg.remote_state_dir = cfg.remote_state_dir();
        }
    }
    ccfg.federation = federation_settings(loaded.as_ref(), &a.fed)?;
    let ctl = iris_controller::start(ccfg).await?;
    let url = ctl.url();
    if let Some((settings, kubeconfig, context)) = kube {
        let client = iris_kube_backend::client(kubeconfig.as_deref(), context.as_deref()).await?;
        let (backends, preflight) = iris_kube_backend::connect(client, settings).await?;
        for m in &preflight.missing {
            println!("Kubernetes: missing {m} (admin-owned; not created by Iris)");
        }
        for b in backends {
            ctl.controller
                .add_backend(b)
                .await
                .map_err(|e| anyhow::anyhow!("registering the Kubernetes backend: {e}"))?;
        }
        println!("Kubernetes backend ready");
    }
    std::fs::write(ccfg_state_dir.join("controller.url"), &url)
        .context("recording the controller address")?;
    println!("Controller started at {url}");
    let dashboard = match a.dashboard_bind {
        Some(bind) => Some(start_dashboard(&url, bind, None).await?),
        None => None,
    };
    stop.recv().await;
    if let Some(d) = dashboard {
        d.shutdown().await;
    }
    ctl.shutdown().await;
    Ok(0)
}

/// `--checkpoint-path <remote>/controller-state/<epoch_ms>` as the remote state dir and the
/// checkpoint's name within it.
fn split_checkpoint_path(path: &str) -> anyhow::Result<(String, String)> {
    let p = path.trim().trim_end_matches('/');
    let marker = format!("/{}/", iris_controller::checkpoint::STATE_DIR);
    let Some(i) = p.rfind(&marker) else {
        anyhow::bail!(
            "--checkpoint-path {path}: expected <remote_state_dir>/{}/<epoch_ms>",
            iris_controller::checkpoint::STATE_DIR
        );
    };
    let name = p[i + 1..].to_string();
    iris_controller::checkpoint::parse_checkpoint_name(&name)
        .with_context(|| format!("--checkpoint-path {path}"))?;
    Ok((p[..i].to_string(), name))
}

/// Starts the web dashboard for the controller at `url` and prints its address.
async fn start_dashboard(
    url: &str,
    bind: std::net::SocketAddr,
    session: Option<String>,
) -> anyhow::Result<iris_dashboard::Shutdown> {
    let (addr, handle) = iris_dashboard::serve(url.to_string(), bind).await?;
    match session {
        // The dashboard turns the token into a cookie and redirects it out of the URL.
        Some(t) => println!("Dashboard: http://{addr}/jobs?session_token={t}"),
        None => println!("Dashboard: http://{addr}/"),
    }
    Ok(handle)
}

/// SIGTERM (listened for from the moment this is made, so one that arrives while a daemon is
/// still starting is not lethal: its default action would kill the process and leave its
/// workers' tasks running), or Ctrl-C once the daemon is up (during startup Ctrl-C still
/// interrupts at once).
pub(crate) struct ShutdownSignal {
    term: Option<tokio::signal::unix::Signal>,
}

pub(crate) fn shutdown_signal() -> ShutdownSignal {
    use tokio::signal::unix::{signal, SignalKind};
    ShutdownSignal {
        term: signal(SignalKind::terminate()).ok(),
    }
}

impl ShutdownSignal {
    pub(crate) async fn recv(self) {
        let Some(mut term) = self.term else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
}

pub async fn serve_worker(a: WorkerArgs, url: Option<String>) -> anyhow::Result<i32> {
    let stop = shutdown_signal();
    let url = match url {
        Some(u) => u,
        None => {
            crate::client::ambient_url().context("no controller address: pass --controller-url")?
        }
    };
    let device = parse_device(a.device.as_deref())?;
    let attributes = parse_pairs("--attribute", &a.attributes)?;
    let task_env = parse_pairs("--task-env", &a.task_env)?
        .into_iter()
        .collect();
    let id = a
        .worker_id
        .clone()
        .unwrap_or_else(|| format!("worker-local-0-{}", short_id()));
    let cache = a
        .cache_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("iris-worker-{id}")));
    let w = iris_worker::start(iris_worker::WorkerConfig {
        controller_url: url,
        worker_id: id.clone(),
        bind: a.bind,
        cpu_count: a.cpu,
        memory_bytes: iris_types::resources::parse_bytes(&a.memory)
            .map_err(|e| anyhow::anyhow!("--memory: {e}"))?,
        disk_bytes: iris_types::resources::parse_bytes(&a.disk)
            .map_err(|e| anyhow::anyhow!("--disk: {e}"))?,
        device,
        attributes,
        scale_group: a.scale_group.clone(),
        cache_dir: cache,
        heartbeat_timeout: Duration::from_secs_f64(a.heartbeat_timeout.max(1.0)),
        python: a.python.clone(),
        task_env,
    })
    .await?;
    println!("Worker {id} serving at {}", w.addr);
    stop.recv().await;
    w.shutdown().await;
    Ok(0)
}

/// `--device gpu:VARIANT:COUNT` / `tpu:VARIANT:COUNT`.
pub(crate) fn parse_device(d: Option<&str>) -> anyhow::Result<Option<(String, String, i32)>> {
    let Some(d) = d else { return Ok(None) };
    match d.split(':').collect::<Vec<_>>().as_slice() {
        [t, v, n] if *t == "gpu" || *t == "tpu" => Ok(Some((
            t.to_string(),
            v.to_string(),
            n.parse::<i32>()
                .map_err(|_| anyhow::anyhow!("--device {d}: count must be a number"))?,
        ))),
        _ => anyhow::bail!("--device {d}: expected gpu:VARIANT:COUNT or tpu:VARIANT:COUNT"),
    }
}

/// Repeated `FLAG KEY=VALUE` arguments.
pub(crate) fn parse_pairs(flag: &str, kvs: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    kvs.iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow::anyhow!("{flag} {kv}: expected KEY=VALUE"))
        })
        .collect()
}
