//! `iris`: the command-line interface, controller, worker and local cluster in one binary.
//!
//! This file holds the clap definitions (every subcommand and flag) and the dispatch in
//! [`run`]; each command group's implementation lives in [`cmd`] (`cmd/job.rs` for
//! `iris job ...`, and so on), and [`client`] holds the calls to the controller.

mod bench;
mod bench_c1m;
mod bench_checkpoint;
mod bench_federation;
mod bench_federation_detect;
mod bench_memory;
mod bench_proxy;
mod bench_reads;
mod client;
mod cmd;
mod config;
mod dry_run;
mod keys;
mod kube_config;
mod kube_deploy;
mod lifecycle;
mod local;
mod output;
mod rollout;
mod secrets;
mod setup_scripts;
mod simulate;
mod slices;
mod target;
mod tunnel;
mod workspace;

use clap::{Args, Parser, Subcommand};
use iris_rpc::RpcError;

#[derive(Parser)]
#[command(
    name = "iris",
    version,
    about = "Iris: a workload scheduler for ML research clusters"
)]
struct Cli {
    /// Controller URL (default: the cluster of --config/--cluster, else $IRIS_CONTROLLER_URL,
    /// else the local cluster's recorded address).
    #[arg(long, global = true)]
    controller_url: Option<String>,
    /// Exact cluster config YAML: talk to the controller it describes (before the command:
    /// `iris --config FILE job list`).
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// A named cluster: NAME.yaml from the cluster config directories (`iris cluster list`).
    #[arg(long)]
    cluster: Option<String>,
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Submit and manage jobs.
    #[command(subcommand)]
    Job(Box<JobCmd>),
    /// Inspect and act on tasks.
    #[command(subcommand)]
    Task(TaskCmd),
    /// Inspect and act on single attempts (`<task>:<N>`).
    #[command(subcommand)]
    Attempt(AttemptCmd),
    /// Diagnose the controller, a worker or a task's process: status, logs, profiles.
    #[command(subcommand)]
    Process(cmd::process::ProcessCmd),
    /// Read-only SQL over the controller DB.
    Query {
        sql: String,
        #[arg(short = 'f', long, default_value = "table", value_parser = ["table", "csv", "json"])]
        format: String,
    },
    /// Execute RPC calls against Iris services.
    ///
    /// `iris rpc controller|worker|actor|inspect <method> [--json BODY] [--<field> VALUE]...`
    /// prints the reply as JSON; an error status exits 1.
    Rpc(cmd::rpc::RpcArgs),
    /// Interact with actors served by tasks, through the controller's `/proxy`.
    #[command(subcommand)]
    Actor(cmd::actor::ActorCmd),
    /// Clusters: start a local one, show status, run daemons.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Run a worker daemon.
    #[command(subcommand)]
    Worker(WorkerCmd),
    /// Per-user budgets and maximum bands.
    #[command(subcommand)]
    User(UserCmd),
    /// Services tasks registered (coordinators, actors, dashboards) and capability URLs for
    /// reaching them through the controller's `/proxy`.
    #[command(subcommand)]
    Endpoints(EndpointsCmd),
    /// Store a token for later commands (sent as `authorization: Bearer`).
    Login {
        /// The token (from `iris user token mint` or your cluster's admin).
        #[arg(long)]
        token: Option<String>,
        /// Print where to get a token and read it from standard input (for a box without a
        /// browser or clipboard; also what happens without --token).
        #[arg(long)]
        headless: bool,
    },
    /// Image builds (not supported: Iris is one binary; answers with the reason).
    #[command(subcommand)]
    Build(lifecycle::BuildCmd),
    /// Benchmarks against an in-process controller (prints figures).
    #[command(subcommand)]
    Bench(bench::BenchCmd),
}

#[derive(Subcommand)]
enum EndpointsCmd {
    /// List live endpoints whose name starts with PREFIX (all when omitted), by name.
    List {
        #[arg(default_value = "")]
        prefix: String,
        /// Match PREFIX as the whole name.
        #[arg(long)]
        exact: bool,
        /// Only endpoints these tasks registered (repeatable).
        #[arg(long = "task-id")]
        task_id: Vec<String>,
    },
    /// Mint a capability URL for a link-access endpoint: whoever has it reaches the endpoint
    /// through `/proxy` until it expires.
    Mint {
        /// The endpoint's name, e.g. /alice/train/web.
        name: String,
        #[arg(long, default_value_t = 24.0)]
        ttl_hours: f64,
    },
}

#[derive(Subcommand)]
enum JobCmd {
    /// Submit a job and (by default) stream its logs until it ends.
    Run(Box<RunArgs>),
    /// List jobs, newest first.
    List {
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        prefix: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i32,
    },
    /// Show a job and its tasks.
    Describe { job_id: String },
    /// Show a job's logs.
    Logs(LogArgs),
    /// Cancel jobs (and their children).
    Cancel(BulkArgs),
    /// Mark a job and its unfinished tasks succeeded.
    Complete { job_id: String },
    /// Wait for a job to finish; exit 0 only if it succeeded.
    Wait { job_id: String },
    /// Machine-readable job state for scripts.
    Summary {
        job_id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct RunArgs {
    #[arg(long, default_value = "0.1", allow_negative_numbers = true)]
    cpu: String,
    #[arg(long, default_value = "1GB", allow_negative_numbers = true)]
    memory: String,
    #[arg(long, default_value = "5GB", allow_negative_numbers = true)]
    disk: String,
    /// Accelerators: H100x8, 8, or H100.
    #[arg(long)]
    gpu: Option<String>,
    #[arg(long)]
    tpu: Option<String>,
    /// Allow accelerators, >= 4 GB of memory or >= 10 GB of disk on this job (as the published
    /// CLI, which refuses them without it: they usually belong on the tasks a job spawns).
    #[arg(long)]
    enable_extra_resources: bool,
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    replicas: i64,
    #[arg(long)]
    priority: Option<String>,
    /// Required with `--priority system`: why (must mention hero, finelog or iris).
    #[arg(long)]
    system_reason: Option<String>,
    /// Execution timeout in seconds (0 = none).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    timeout: i64,
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    max_retries: i64,
    /// Reruns allowed after preemption or worker loss (0 = the first loss fails the job).
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true)]
    max_retries_preemption: i64,
    /// Environment variable for the task: `-e KEY VALUE` (repeatable).
    #[arg(short = 'e', long = "env-vars", num_args = 2, value_names = ["KEY", "VALUE"], action = clap::ArgAction::Append)]
    env: Vec<String>,
    #[arg(long)]
    no_wait: bool,
    #[arg(long)]
    job_name: Option<String>,
    #[arg(long)]
    user: Option<String>,
    #[arg(long, action = clap::ArgAction::Append)]
    region: Vec<String>,
    #[arg(long)]
    zone: Option<String>,
    /// Run on this federation peer (the hub hands the whole job to it).
    #[arg(long)]
    target_cluster: Option<String>,
    /// Container image for the task (Kubernetes backend); default: the cluster's task image.
    #[arg(long)]
    task_image: Option<String>,
    #[arg(long, overrides_with = "no_preemptible")]
    preemptible: bool,
    #[arg(long)]
    no_preemptible: bool,
    /// Coscheduling attribute for multi-replica gangs.
    #[arg(long)]
    group_by: Option<String>,
    /// Hard constraint KEY=VALUE on a worker attribute (repeatable).
    #[arg(long, action = clap::ArgAction::Append)]
    constraint: Vec<String>,
    #[arg(long, action = clap::ArgAction::Append)]
    include: Vec<String>,
    #[arg(long, action = clap::ArgAction::Append)]
    exclude: Vec<String>,
    /// Do not ship the working directory.
    #[arg(long)]
    no_bundle: bool,
    /// Availability constraint: schedule only where this accelerator can be found (the job
    /// waits otherwise). `[COUNT:]DEVICE`, e.g. `4:H100x8` or `v5litepod-16`; the count is
    /// ignored (repeatable).
    #[arg(long, action = clap::ArgAction::Append)]
    reserve: Vec<String>,
    /// A uv extra to install in the task's setup (`--extra cpu`; repeatable).
    #[arg(long = "extra", action = clap::ArgAction::Append)]
    extras: Vec<String>,
    /// Scope the setup's `uv sync --all-packages --no-dev` to this workspace member (repeatable).
    #[arg(long = "sync-package", action = clap::ArgAction::Append)]
    sync_packages: Vec<String>,
    /// Skip environment setup entirely: run the command as it is (no uv sync).
    #[arg(long)]
    no_sync: bool,
    /// Deliver a named secret to the task as a file (NAME SOURCE; SOURCE is env:VAR or
    /// file:PATH), e.g. `--secret SERVICE_KEY env:SERVICE_KEY` (repeatable).
    #[arg(long = "secret", num_args = 2, value_names = ["NAME", "SOURCE"], action = clap::ArgAction::Append)]
    secrets: Vec<String>,
    /// `inherit`: also forward your HF / W&B / CoreWeave credentials (and, inside a task, its
    /// secrets); `isolate`: only the explicit --secret ones.
    #[arg(long, default_value = "inherit", value_parser = ["inherit", "isolate"])]
    secret_behavior: String,
    /// Container security profile (RESTRICTED, DEFAULT, DOCKER_ACCESS, PRIVILEGED, SANDBOX; the
    /// `CONTAINER_PROFILE_` prefix is optional). The elevated ones need an admin.
    #[arg(long)]
    container_profile: Option<String>,
    /// What the job's network reaches (CLUSTER, INTERNET, NONE; the `EGRESS_POLICY_` prefix is
    /// optional).
    #[arg(long)]
    egress_policy: Option<String>,
    /// Cancel the job on Ctrl-C while following it (the default).
    #[arg(long, overrides_with = "no_cancel_on_exit")]
    cancel_on_exit: bool,
    /// Leave the job running on Ctrl-C.
    #[arg(long)]
    no_cancel_on_exit: bool,
    /// The command, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Args, Clone)]
struct LogArgs {
    target: String,
    #[arg(short, long)]
    follow: bool,
    #[arg(long, default_value_t = 0)]
    max_lines: i32,
    #[arg(long)]
    substring: Option<String>,
    #[arg(long)]
    regex: Option<String>,
    #[arg(long, overrides_with = "tail")]
    no_tail: bool,
    #[arg(long)]
    tail: bool,
    #[arg(long, default_value_t = 0)]
    since_ms: i64,
    /// Only lines from the last N seconds.
    #[arg(long, conflicts_with = "since_ms")]
    since_seconds: Option<u64>,
    #[arg(long)]
    level: Option<String>,
}

#[derive(Args, Clone)]
struct BulkArgs {
    ids: Vec<String>,
    /// Treat each id as a prefix and act on every active job under it.
    #[arg(long, overrides_with = "exact")]
    prefix: bool,
    /// Match each id exactly (the default).
    #[arg(long)]
    exact: bool,
    /// Read ids from standard input (first CSV field of lines starting with `/`).
    #[arg(long)]
    stdin: bool,
    #[arg(long)]
    dry_run: bool,
    #[arg(long)]
    reason: Option<String>,
}

#[derive(Subcommand)]
enum TaskCmd {
    List {
        job_id: String,
    },
    Describe {
        task_id: String,
    },
    Logs(LogArgs),
    /// A task's events (every attempt's), oldest first.
    Events {
        task_id: String,
        /// Show at most this many, the most recent (default 1000, at most 10000).
        #[arg(long, default_value_t = 0)]
        limit: i32,
    },
    Preempt(BulkArgs),
    Fail(BulkArgs),
    /// Why a pending task waits: every worker with the first placement rule that rules it out
    /// (or "fits"), computed by the scheduler over the snapshot the control tick uses.
    Explain {
        task_id: String,
        /// Only this worker's verdict.
        #[arg(long)]
        worker: Option<String>,
        /// Print the ExplainTask response as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Wait until a task ends; prints its state and exits 0 only if it succeeded.
    Wait {
        task_id: String,
    },
    /// Run a command in a running task's directory and environment.
    Exec(cmd::task::ExecArgs),
    /// Profile a running task's current attempt (threads, cpu or mem).
    Profile {
        task_id: String,
        #[command(flatten)]
        profile: cmd::process::ProfileArgs,
    },
}

#[derive(Subcommand)]
enum AttemptCmd {
    Describe {
        attempt_id: String,
    },
    Logs(LogArgs),
    /// Wait until one attempt (`<task>:<N>`) ends; prints its state and exits 0 only if it
    /// succeeded.
    Wait {
        attempt_id: String,
    },
    /// One attempt's events (`<task>:<N>`), oldest first.
    Events {
        attempt_id: String,
        /// Show at most this many, the most recent (default 1000, at most 10000).
        #[arg(long, default_value_t = 0)]
        limit: i32,
    },
    Preempt(BulkArgs),
    Fail(BulkArgs),
    /// Profile one running attempt (`<task>:<N>`).
    Profile {
        attempt_id: String,
        #[command(flatten)]
        profile: cmd::process::ProfileArgs,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Start a cluster. `--local`: controller and workers on 127.0.0.1 in this process.
    Start(local::StartArgs),
    /// Show workers and job counts.
    Status,
    /// List the cluster configs `--cluster NAME` can name.
    List,
    /// Generate the cluster's Ed25519 signing key; prints `kid:` and the public PEM.
    InitKeys(keys::InitKeysArgs),
    /// Controller daemon commands.
    #[command(subcommand)]
    Controller(ControllerCmd),
    /// Stop the local cluster's controller, its workers and their tasks (SIGTERM; waits).
    Stop(lifecycle::StopArgs),
    /// Stop the local cluster, then start it again (in the foreground, as `cluster start`).
    Restart {
        /// The local cluster's state dir (default: the one --config/--cluster selects).
        #[arg(long)]
        state_dir: Option<std::path::PathBuf>,
    },
    /// Serve the dashboard on 127.0.0.1 for the selected controller until Ctrl-C.
    Dashboard,
    /// Serve a local dashboard that reads the selected (remote) controller through its RPCs.
    DashboardProxy(lifecycle::DashboardProxyArgs),
    /// The log server (built into the controller: status, and the reason for the rest).
    #[command(subcommand)]
    LogServer(lifecycle::LogServerCmd),
    /// Scale groups, slices and VMs as the controller reports them.
    #[command(subcommand)]
    Vm(cmd::vm::VmCmd),
    /// Create an operator-managed slice from a scale group's template (cloud platforms only).
    CreateSlice {
        #[arg(long)]
        scale_group: String,
    },
    /// Terminate an operator-managed slice (cloud platforms only).
    DeleteSlice { slice_id: String },
}

#[derive(Subcommand)]
enum ControllerCmd {
    /// Serve a controller on a state dir.
    Serve(local::ServeArgs),
    /// Write a checkpoint of the controller DB to its remote state dir now.
    Checkpoint {
        /// Stop the controller after the checkpoint (it must run on this machine).
        #[arg(long)]
        stop: bool,
        /// With --stop: the controller's state dir (default: the one --config/--cluster or the
        /// default local cluster uses).
        #[arg(long)]
        state_dir: Option<std::path::PathBuf>,
    },
    /// Rolling restart of VM workers over SSH (not supported here; answers with the reason).
    WorkerRestart(lifecycle::WorkerRestartArgs),
    /// Checkpoint the controller and record a rollout (`pending`) in the remote state dir.
    Restart(rollout::RestartArgs),
    /// Ask the next controller start to restore the rollout's checkpoint (`rollback_requested`).
    Rollback(rollout::RollbackArgs),
}

#[derive(Subcommand)]
enum WorkerCmd {
    /// Run a worker that registers with the controller.
    Serve(local::WorkerArgs),
    /// Host many simulated workers in this process: they register and answer Reconcile like
    /// real ones, and run each attempt for a drawn duration without a process (scale tests).
    Simulate(simulate::SimulateArgs),
}

#[derive(Subcommand)]
enum UserCmd {
    #[command(subcommand)]
    Budget(BudgetCmd),
    /// User tokens (for deployments without an identity-aware proxy).
    #[command(subcommand)]
    Token(TokenCmd),
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Mint a user token with the cluster's signing key.
    Mint(keys::MintArgs),
}

#[derive(Subcommand)]
enum BudgetCmd {
    Set {
        user: String,
        #[arg(long, default_value_t = 0)]
        limit: i64,
        #[arg(long)]
        max_band: Option<String>,
    },
    Get {
        user: String,
    },
    List,
}

/// Lifts the soft open-file limit to the hard one (as Go's runtime does): a controller holds a
/// socket per client connection and a worker pipes per task, and distributions often default
/// the soft limit to 1,024, which a thousand idle clients would exhaust.
fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::debug!(error = %e, "raising the open-file limit");
            }
        }
    }
}

/// mimalloc instead of glibc's malloc for the whole process (see the dependency's note).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = Cli::parse();
    let filter = if cli.verbose { "info" } else { "warn" };
    use tracing_subscriber::prelude::*;
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(
                    tracing_subscriber::EnvFilter::try_from_env("IRIS_LOG")
                        .unwrap_or_else(|_| filter.into()),
                ),
        )
        // The daemons' recent lines (INFO and up, whatever stderr shows) for `iris process logs`.
        .with(iris_rpc::proclog::layer())
        .try_init();
    raise_open_file_limit();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            if let Some(r) = e.downcast_ref::<RpcError>() {
                eprintln!("error: {} ({})", r.message, r.code.as_str());
            } else {
                eprintln!("error: {e:#}");
            }
            1
        }
    };
    tunnel::close();
    std::process::exit(code);
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    // Starting a cluster or listing configs needs no running controller.
    if let Cmd::Cluster(ClusterCmd::Start(mut a)) = cli.cmd {
        if a.config.is_none() {
            a.config = target::selected_config(cli.config.as_deref(), cli.cluster.as_deref())?
                .map(|(path, _)| path);
        }
        if let (false, Some(path)) = (a.local, a.config.as_deref()) {
            if kube_deploy::is_kubernetes(&config::load(path)?) {
                let opts = kube_deploy::DeployOpts {
                    fresh: a.fresh,
                    timeout: kube_deploy::AVAILABLE_WAIT,
                };
                return kube_deploy::start(path, opts).await;
            }
        }
        return local::start(a).await;
    }
    // A controller in a Kubernetes cluster is stopped and restarted through the API server.
    let in_cluster = matches!(
        &cli.cmd,
        Cmd::Cluster(ClusterCmd::Stop(_))
            | Cmd::Cluster(ClusterCmd::Controller(ControllerCmd::Restart(_)))
    );
    let kube_config = match in_cluster {
        true => target::selected_config(cli.config.as_deref(), cli.cluster.as_deref())?
            .filter(|(_, cfg)| kube_deploy::is_kubernetes(cfg))
            .map(|(path, _)| path),
        false => None,
    };
    if let Some(path) = kube_config {
        match &cli.cmd {
            Cmd::Cluster(ClusterCmd::Stop(a)) => return kube_deploy::stop(&path, a.dry_run).await,
            Cmd::Cluster(ClusterCmd::Controller(ControllerCmd::Restart(a))) if a.rollback => {
                return kube_deploy::rollback(&path, kube_deploy::AVAILABLE_WAIT).await;
            }
            Cmd::Cluster(ClusterCmd::Controller(ControllerCmd::Restart(a))) => {
                let o = kube_deploy::RestartOpts {
                    image: Some(a.image.clone()),
                    prebuilt_tag: a.prebuilt_tag.clone(),
                    skip_checkpoint: a.skip_checkpoint,
                    checkpoint_timeout: std::time::Duration::from_secs(a.checkpoint_timeout.max(1)),
                    timeout: kube_deploy::AVAILABLE_WAIT,
                };
                return kube_deploy::restart(&path, o).await;
            }
            _ => {}
        }
    }
    if let Cmd::Cluster(ClusterCmd::List) = cli.cmd {
        return Ok(cmd::cluster::list());
    }
    if let Cmd::Build(b) = cli.cmd {
        return Ok(lifecycle::build(b));
    }
    // Manual slices need only the config (they are refused before any controller is dialled).
    if let Cmd::Cluster(ClusterCmd::CreateSlice { scale_group }) = &cli.cmd {
        let (config, cluster) = (cli.config.as_deref(), cli.cluster.as_deref());
        return cmd::vm::manual_slice("create-slice", Some(scale_group), config, cluster);
    }
    if let Cmd::Cluster(ClusterCmd::DeleteSlice { .. }) = &cli.cmd {
        let (config, cluster) = (cli.config.as_deref(), cli.cluster.as_deref());
        return cmd::vm::manual_slice("delete-slice", None, config, cluster);
    }
    if let Cmd::Cluster(ClusterCmd::Stop(a)) = &cli.cmd {
        let dir = lifecycle::local_state_dir(
            a.state_dir.as_deref(),
            cli.config.as_deref(),
            cli.cluster.as_deref(),
        )?;
        return lifecycle::stop(a, &dir, &cli.controller_url).await;
    }
    if let Cmd::Cluster(ClusterCmd::Restart { state_dir }) = &cli.cmd {
        let dir = lifecycle::local_state_dir(
            state_dir.as_deref(),
            cli.config.as_deref(),
            cli.cluster.as_deref(),
        )?;
        let stop = lifecycle::StopArgs {
            dry_run: false,
            no_dry_run: true,
            state_dir: Some(dir.clone()),
        };
        lifecycle::stop(&stop, &dir, &None).await?;
        let config = target::selected_config(cli.config.as_deref(), cli.cluster.as_deref())?
            .map(|(path, _)| path);
        return local::start(local::StartArgs::restart(config, state_dir.clone())).await;
    }
    let url = target::explicit_url(
        cli.controller_url.clone(),
        cli.config.as_deref(),
        cli.cluster.as_deref(),
    )?;
    match cli.cmd {
        Cmd::Cluster(c) => {
            cmd::cluster::run(c, url, cli.config.as_deref(), cli.cluster.as_deref()).await
        }
        Cmd::Worker(WorkerCmd::Serve(a)) => local::serve_worker(a, url).await,
        Cmd::Worker(WorkerCmd::Simulate(a)) => simulate::run(a, url).await,
        Cmd::Bench(b) => bench::run(b).await,
        Cmd::Login { token, headless } => keys::login(token, headless),
        Cmd::Build(b) => Ok(lifecycle::build(b)),
        Cmd::Job(j) => cmd::job::run(*j, url).await,
        Cmd::Task(t) => cmd::task::run(t, url).await,
        Cmd::Attempt(a) => cmd::attempt::run(a, url).await,
        Cmd::Process(p) => cmd::process::run(p, url).await,
        Cmd::Query { sql, format } => cmd::query::run(sql, &format, url).await,
        Cmd::Rpc(r) => cmd::rpc::run(r, url).await,
        Cmd::Actor(a) => cmd::actor::run(a, url).await,
        Cmd::User(u) => cmd::user::run(u, url).await,
        Cmd::Endpoints(e) => cmd::endpoints::run(e, url).await,
    }
}
