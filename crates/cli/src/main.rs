//! `iris`: the command-line interface, controller, worker and local cluster in one binary.

mod bench;
mod bench_federation;
mod bench_memory;
mod config;
mod keys;
mod local;
mod output;
mod rollout;
mod workspace;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use iris_proto::cluster::controller as c;
use iris_proto::finelog::logging as fl;
use iris_proto::job;
use iris_rpc::{Client, Code, RpcError};
use std::io::BufRead;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "iris",
    version,
    about = "Iris: a workload scheduler for ML research clusters"
)]
struct Cli {
    /// Controller URL (default: $IRIS_CONTROLLER_URL, else the local cluster's recorded address).
    #[arg(long, global = true, env = "IRIS_CONTROLLER_URL")]
    controller_url: Option<String>,
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
    /// Read-only SQL over the controller DB.
    Query {
        sql: String,
        #[arg(short = 'f', long, default_value = "table", value_parser = ["table", "csv", "json"])]
        format: String,
    },
    /// Call any controller method with JSON in and JSON out.
    Rpc {
        #[arg(value_parser = ["controller"])]
        target: String,
        /// Method name, e.g. list-workers or ListWorkers.
        method: String,
        /// JSON request body (default `{}`).
        #[arg(long, default_value = "{}")]
        json: String,
    },
    /// Clusters: start a local one, show status, run daemons.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Run a worker daemon.
    #[command(subcommand)]
    Worker(WorkerCmd),
    /// Per-user budgets and maximum bands.
    #[command(subcommand)]
    User(UserCmd),
    /// Store a token for later commands (sent as `authorization: Bearer`).
    Login {
        #[arg(long)]
        token: String,
    },
    /// Benchmarks against an in-process controller (prints figures).
    #[command(subcommand)]
    Bench(bench::BenchCmd),
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
    /// Accepted for compatibility; GPU and TPU requests need no extra flag here.
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
    #[arg(long)]
    level: Option<String>,
}

#[derive(Args, Clone)]
struct BulkArgs {
    ids: Vec<String>,
    /// Treat each id as a prefix and act on every active job under it.
    #[arg(long)]
    prefix: bool,
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
}

#[derive(Subcommand)]
enum AttemptCmd {
    Describe {
        attempt_id: String,
    },
    Logs(LogArgs),
    /// One attempt's events (`<task>:<N>`), oldest first.
    Events {
        attempt_id: String,
        /// Show at most this many, the most recent (default 1000, at most 10000).
        #[arg(long, default_value_t = 0)]
        limit: i32,
    },
    Preempt(BulkArgs),
    Fail(BulkArgs),
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Start a cluster. `--local`: controller and workers on 127.0.0.1 in this process.
    Start(local::StartArgs),
    /// Show workers and job counts.
    Status,
    /// Generate the cluster's Ed25519 signing key; prints `kid:` and the public PEM.
    InitKeys(keys::InitKeysArgs),
    /// Controller daemon commands.
    #[command(subcommand)]
    Controller(ControllerCmd),
}

#[derive(Subcommand)]
enum ControllerCmd {
    /// Serve a controller on a state dir.
    Serve(local::ServeArgs),
    /// Write a checkpoint of the controller DB to its remote state dir now.
    Checkpoint,
    /// Checkpoint the controller and record a rollout (`pending`) in the remote state dir.
    Restart(rollout::RestartArgs),
    /// Ask the next controller start to restore the rollout's checkpoint (`rollback_requested`).
    Rollback(rollout::RollbackArgs),
}

#[derive(Subcommand)]
enum WorkerCmd {
    /// Run a worker that registers with the controller.
    Serve(local::WorkerArgs),
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

fn main() {
    let cli = Cli::parse();
    let filter = if cli.verbose { "info" } else { "warn" };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("IRIS_LOG")
                .unwrap_or_else(|_| filter.into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
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
    std::process::exit(code);
}

pub(crate) fn controller_client(url: &Option<String>) -> anyhow::Result<Client> {
    let url = match url {
        Some(u) => u.clone(),
        None => local::recorded_url().context(
            "no controller address: start one with `iris cluster start --local`, or pass --controller-url",
        )?,
    };
    let token = keys::cli_token();
    Ok(Client::new(&url)
        .map_err(anyhow::Error::new)?
        .with_token(token))
}

const SVC: &str = "iris.cluster.ControllerService";

async fn call<Req: prost::Message, Resp: prost::Message + Default>(
    client: &Client,
    method: &str,
    req: &Req,
) -> Result<Resp, RpcError> {
    let timeout = if method == "LaunchJob" { 180 } else { 30 };
    client
        .call(SVC, method, req, Duration::from_secs(timeout))
        .await
}

/// Calls Iris's own `iris.inspect.InspectService` (typed reads; not in the published protocol).
async fn call_inspect<Req: prost::Message, Resp: prost::Message + Default>(
    client: &Client,
    method: &str,
    req: &Req,
) -> Result<Resp, RpcError> {
    client
        .call(
            iris_proto::INSPECT_SERVICE,
            method,
            req,
            Duration::from_secs(30),
        )
        .await
}

/// Prints `ListTaskEvents` for a task (optionally one attempt), with a note on stderr when
/// earlier events were left out.
async fn task_events(
    cl: &Client,
    task_id: &str,
    attempt_id: Option<i32>,
    limit: i32,
) -> anyhow::Result<i32> {
    let r: iris_proto::inspect::ListTaskEventsResponse = call_inspect(
        cl,
        "ListTaskEvents",
        &iris_proto::inspect::ListTaskEventsRequest {
            task_id: task_id.to_string(),
            attempt_id,
            limit,
        },
    )
    .await?;
    output::print_events(&r.events);
    if r.omitted > 0 {
        eprintln!(
            "({} earlier event(s) not shown; pass --limit up to 10000 to see more)",
            r.omitted
        );
    }
    Ok(0)
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let url = cli.controller_url.clone();
    match cli.cmd {
        Cmd::Cluster(ClusterCmd::Start(a)) => local::start(a).await,
        Cmd::Cluster(ClusterCmd::Controller(ControllerCmd::Serve(a))) => {
            local::serve_controller(a).await
        }
        Cmd::Cluster(ClusterCmd::Controller(ControllerCmd::Checkpoint)) => {
            rollout::checkpoint(&controller_client(&url)?).await
        }
        Cmd::Cluster(ClusterCmd::Controller(ControllerCmd::Restart(a))) => {
            rollout::restart(a, &url).await
        }
        Cmd::Cluster(ClusterCmd::Controller(ControllerCmd::Rollback(a))) => {
            rollout::rollback(a).await
        }
        Cmd::Worker(WorkerCmd::Serve(a)) => local::serve_worker(a, url).await,
        Cmd::Cluster(ClusterCmd::Status) => {
            let cl = controller_client(&url)?;
            let w: c::ListWorkersResponse =
                call(&cl, "ListWorkers", &c::ListWorkersRequest::default()).await?;
            println!("Controller: {}", cl.base());
            output::print_workers(&w.workers);
            Ok(0)
        }
        Cmd::Bench(b) => bench::run(b).await,
        Cmd::Login { token } => keys::login(&token),
        Cmd::Job(j) => job_cmd(*j, url).await,
        Cmd::Task(t) => task_cmd(t, url).await,
        Cmd::Attempt(a) => attempt_cmd(a, url).await,
        Cmd::Query { sql, format } => {
            let cl = controller_client(&url)?;
            let r: iris_proto::query::RawQueryResponse = call(
                &cl,
                "ExecuteRawQuery",
                &iris_proto::query::RawQueryRequest { sql },
            )
            .await?;
            output::print_query(&r, &format)?;
            Ok(0)
        }
        Cmd::Rpc { method, json, .. } => {
            let cl = controller_client(&url)?;
            let m = kebab_to_pascal(&method);
            let mut rb = reqwest::Client::new()
                .post(format!("{}/{SVC}/{m}", cl.base()))
                .header("content-type", "application/json")
                .body(json);
            if let Some(t) = keys::cli_token() {
                rb = rb.header("authorization", format!("Bearer {t}"));
            }
            let resp = rb.send().await.with_context(|| format!("calling {m}"))?;
            let ok = resp.status().is_success();
            let text = resp.text().await?;
            let pretty = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| serde_json::to_string_pretty(&v).ok())
                .unwrap_or(text);
            println!("{pretty}");
            Ok(if ok { 0 } else { 1 })
        }
        Cmd::Cluster(ClusterCmd::InitKeys(a)) => keys::init_keys(a),
        Cmd::User(UserCmd::Token(TokenCmd::Mint(a))) => keys::mint(a),
        Cmd::User(UserCmd::Budget(b)) => {
            let cl = controller_client(&url)?;
            match b {
                BudgetCmd::Set {
                    user,
                    limit,
                    max_band,
                } => {
                    let band = match max_band {
                        Some(b) => iris_types::Band::parse(&b)
                            .map_err(anyhow::Error::msg)?
                            .code(),
                        None => 0,
                    };
                    let _: c::SetUserBudgetResponse = call(
                        &cl,
                        "SetUserBudget",
                        &c::SetUserBudgetRequest {
                            user_id: user.clone(),
                            budget_limit: limit,
                            max_band: band,
                        },
                    )
                    .await?;
                    println!("Set budget for {user}");
                }
                BudgetCmd::Get { user } => {
                    let r: c::GetUserBudgetResponse = call(
                        &cl,
                        "GetUserBudget",
                        &c::GetUserBudgetRequest { user_id: user },
                    )
                    .await?;
                    output::print_budgets(&[r]);
                }
                BudgetCmd::List => {
                    let r: c::ListUserBudgetsResponse =
                        call(&cl, "ListUserBudgets", &c::ListUserBudgetsRequest {}).await?;
                    output::print_budgets(&r.users);
                }
            }
            Ok(0)
        }
    }
}

fn kebab_to_pascal(s: &str) -> String {
    if !s.contains('-')
        && s.chars()
            .next()
            .map(|c| c.is_ascii_uppercase())
            .unwrap_or(false)
    {
        return s.to_string();
    }
    s.split(['-', '_'])
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

fn resolve_user(flag: &Option<String>) -> anyhow::Result<String> {
    let raw = flag
        .clone()
        .or_else(|| std::env::var("IRIS_USER").ok())
        .or_else(|| {
            std::env::var("IRIS_TASK_ID")
                .ok()
                .and_then(|t| t.split('/').nth(1).map(|s| s.to_string()))
        })
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "root".into());
    iris_types::ids::validate_user(&raw).map_err(anyhow::Error::msg)
}

/// `--priority system` needs `--system-reason` naming hero, finelog or iris (as whole words);
/// `--system-reason` with any other priority is a usage error.
fn check_system_reason(band: i32, reason: Option<&str>) -> anyhow::Result<()> {
    let system = band == iris_types::Band::System.code();
    match (system, reason) {
        (false, Some(_)) => bail!("--system-reason is only valid with --priority system"),
        (false, None) => Ok(()),
        (true, None) => bail!("--priority system requires --system-reason (say why: hero run, finelog or iris infrastructure)"),
        (true, Some(r)) => {
            let words: Vec<String> = r
                .split(|c: char| !c.is_ascii_alphanumeric())
                .map(|w| w.to_ascii_lowercase())
                .collect();
            if words.iter().any(|w| w == "hero" || w == "finelog" || w == "iris") {
                Ok(())
            } else {
                bail!("--system-reason {r:?} must mention hero, finelog or iris")
            }
        }
    }
}

fn constraint(key: &str, op: i32, values: &[&str], mode: i32) -> job::Constraint {
    let v = |s: &str| job::AttributeValue {
        value: Some(job::attribute_value::Value::StringValue(s.to_string())),
    };
    job::Constraint {
        key: key.into(),
        op,
        value: if op == 8 {
            None
        } else {
            values.first().map(|s| v(s))
        },
        values: if op == 8 {
            values.iter().map(|s| v(s)).collect()
        } else {
            Vec::new()
        },
        mode,
    }
}

fn build_launch(a: &RunArgs) -> anyhow::Result<c::LaunchJobRequest> {
    let user = resolve_user(&a.user)?;
    let cpu =
        iris_types::resources::parse_cpu(&a.cpu).map_err(|e| anyhow::anyhow!("--cpu: {e}"))?;
    let memory = iris_types::resources::parse_bytes(&a.memory)
        .map_err(|e| anyhow::anyhow!("--memory: {e}"))?;
    let disk =
        iris_types::resources::parse_bytes(&a.disk).map_err(|e| anyhow::anyhow!("--disk: {e}"))?;
    if a.replicas < 1 || a.replicas > 10_000 {
        bail!("--replicas: {} is out of range; use 1 to 10000", a.replicas);
    }
    if a.timeout < 0 {
        bail!("--timeout: must not be negative (0 = no timeout)");
    }
    if a.max_retries < 0 {
        bail!("--max-retries: must not be negative");
    }
    if !(0..=i32::MAX as i64).contains(&a.max_retries_preemption) {
        bail!(
            "--max-retries-preemption: must be between 0 and {}",
            i32::MAX
        );
    }
    let band = match &a.priority {
        Some(p) => iris_types::Band::parse(p)
            .map_err(|e| anyhow::anyhow!("--priority: {e}"))?
            .code(),
        None => 0,
    };
    check_system_reason(band, a.system_reason.as_deref())?;
    if !a.env.len().is_multiple_of(2) {
        bail!(
            "-e/--env-vars takes KEY VALUE pairs: missing the value for {:?}",
            a.env.last()
        );
    }
    let mut env_vars = std::collections::BTreeMap::new();
    for kv in a.env.chunks(2) {
        if kv[0].is_empty() || kv[0].contains('=') {
            bail!("-e: invalid variable name {:?}", kv[0]);
        }
        env_vars.insert(kv[0].clone(), kv[1].clone());
    }
    let mut device = job::DeviceConfig {
        device: Some(job::device_config::Device::Cpu(job::CpuDevice {
            variant: "cpu".into(),
        })),
    };
    let mut cpu = cpu;
    let mut accel = false;
    if let Some(g) = &a.gpu {
        let s = iris_types::resources::parse_gpu(g).map_err(anyhow::Error::msg)?;
        device = job::DeviceConfig {
            device: Some(job::device_config::Device::Gpu(job::GpuDevice {
                variant: s.variant,
                count: s.count,
            })),
        };
        accel = true;
    }
    if let Some(t) = &a.tpu {
        device = job::DeviceConfig {
            device: Some(job::device_config::Device::Tpu(job::TpuDevice {
                variant: t.clone(),
                topology: String::new(),
                count: 4,
            })),
        };
        accel = true;
    }
    if accel {
        cpu = cpu.max(4000);
    }
    let mut constraints = Vec::new();
    match a.region.len() {
        0 => {}
        1 => constraints.push(constraint("region", 0, &[a.region[0].as_str()], 0)),
        _ => constraints.push(constraint(
            "region",
            8,
            &a.region.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            0,
        )),
    }
    if let Some(z) = &a.zone {
        constraints.push(constraint("zone", 0, &[z.as_str()], 0));
    }
    if let Some(t) = &a.target_cluster {
        if t.trim().is_empty() {
            anyhow::bail!(
                "--target-cluster: name a federation peer (see `iris rpc controller list-peers`)"
            );
        }
        constraints.push(constraint("cluster", 0, &[t.trim()], 0));
    }
    if a.preemptible {
        constraints.push(constraint("preemptible", 0, &["true"], 1));
    } else if a.no_preemptible || (!accel && a.replicas == 1 && cpu <= 1000 && memory <= 4 << 30) {
        constraints.push(constraint("preemptible", 0, &["false"], 0));
    }
    for kv in &a.constraint {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--constraint {kv:?}: expected KEY=VALUE"))?;
        constraints.push(constraint(k, 0, &[v], 0));
    }
    let name = match &a.job_name {
        Some(n) => {
            if n.contains('/') || n.trim().is_empty() {
                bail!("--job-name {n:?}: must be a single non-empty component without '/'");
            }
            n.clone()
        }
        None => {
            let stem = a
                .command
                .iter()
                .find(|x| x.ends_with(".py"))
                .and_then(|p| {
                    std::path::Path::new(p)
                        .file_stem()
                        .map(|s| s.to_string_lossy().to_string())
                })
                .unwrap_or_else(|| "job".into());
            format!(
                "iris-run-{stem}-{}",
                chrono::Utc::now().format("%Y%m%d-%H%M%S")
            )
        }
    };
    let full = match std::env::var("IRIS_TASK_ID") {
        Ok(t) => {
            let job = t.rsplit_once(':').map(|x| x.0).unwrap_or(&t);
            let job = job.rsplit_once('/').map(|x| x.0).unwrap_or(job);
            format!("{job}/{name}")
        }
        Err(_) => format!("/{user}/{name}"),
    };
    iris_types::JobName::parse(&full).map_err(|e| anyhow::anyhow!("job name: {e}"))?;
    let coscheduling = a.group_by.as_ref().map(|g| job::CoschedulingConfig {
        group_by: g.clone(),
    });
    Ok(c::LaunchJobRequest {
        name: full,
        entrypoint: Some(job::RuntimeEntrypoint {
            setup_commands: Vec::new(),
            run_command: Some(job::CommandEntrypoint {
                argv: a.command.clone(),
            }),
            workdir_files: Default::default(),
            workdir_file_refs: Default::default(),
        }),
        resources: Some(job::ResourceSpecProto {
            cpu_millicores: cpu,
            memory_bytes: memory,
            disk_bytes: disk,
            device: Some(device),
        }),
        environment: Some(job::EnvironmentConfig {
            env_vars,
            secrets: Default::default(),
            setup_scripts: Vec::new(),
        }),
        replicas: a.replicas as i32,
        max_retries_failure: a.max_retries as i32,
        max_task_failures: a.max_retries as i32,
        max_retries_preemption: a.max_retries_preemption as i32,
        constraints,
        coscheduling,
        timeout: (a.timeout > 0).then_some(iris_proto::time::Duration {
            milliseconds: a.timeout * 1000,
        }),
        priority_band: band,
        submit_argv: std::env::args().collect(),
        task_image: a.task_image.clone().unwrap_or_default(),
        ..Default::default()
    })
}

async fn job_cmd(j: JobCmd, url: Option<String>) -> anyhow::Result<i32> {
    match j {
        JobCmd::Run(a) => {
            let mut req = build_launch(&a)?;
            let cl = controller_client(&url)?;
            if !a.no_bundle {
                let cwd = std::env::current_dir()?;
                let (zip, n) = workspace::bundle(&cwd, &a.include, &a.exclude)?;
                eprintln!(
                    "Bundled {n} files from {} ({} bytes)",
                    cwd.display(),
                    zip.len()
                );
                req.bundle_blob = zip;
            }
            let r: c::LaunchJobResponse = call(&cl, "LaunchJob", &req).await?;
            if a.no_wait {
                println!("{}", r.job_id);
                return Ok(0);
            }
            eprintln!("Submitted {}", r.job_id);
            stream_until_done(&cl, &r.job_id, true).await
        }
        JobCmd::List {
            state,
            prefix,
            limit,
        } => {
            let cl = controller_client(&url)?;
            let mut jobs = Vec::new();
            let mut offset = 0;
            loop {
                let q = c::JobQuery {
                    state_filter: state.clone().unwrap_or_default(),
                    job_id_prefix: prefix.clone().unwrap_or_default(),
                    offset,
                    limit: limit.clamp(1, 500),
                    ..Default::default()
                };
                let r: c::ListJobsResponse =
                    call(&cl, "ListJobs", &c::ListJobsRequest { query: Some(q) }).await?;
                offset += r.jobs.len() as i32;
                jobs.extend(r.jobs);
                if !r.has_more || jobs.len() as i32 >= limit {
                    break;
                }
            }
            jobs.truncate(limit.max(0) as usize);
            output::print_jobs(&jobs);
            Ok(0)
        }
        JobCmd::Describe { job_id } => {
            let cl = controller_client(&url)?;
            let s: c::GetJobStatusResponse = call(
                &cl,
                "GetJobStatus",
                &c::GetJobStatusRequest {
                    job_id: job_id.clone(),
                },
            )
            .await?;
            let t: c::ListTasksResponse =
                call(&cl, "ListTasks", &c::ListTasksRequest { job_id }).await?;
            output::print_job(&s.job.unwrap_or_default(), &t.tasks);
            Ok(0)
        }
        JobCmd::Logs(l) => {
            let cl = controller_client(&url)?;
            let src = format!("{}/", l.target.trim_end_matches('/'));
            logs(&cl, &l, &src, 2, Some(&l.target)).await
        }
        JobCmd::Cancel(b) => {
            let cl = controller_client(&url)?;
            let ids = bulk_ids(&b)?;
            let mut targets = Vec::new();
            for id in ids {
                if b.prefix {
                    let q = c::JobQuery {
                        job_id_prefix: id,
                        limit: 500,
                        ..Default::default()
                    };
                    let r: c::ListJobsResponse =
                        call(&cl, "ListJobs", &c::ListJobsRequest { query: Some(q) }).await?;
                    targets.extend(
                        r.jobs
                            .into_iter()
                            .filter(|j| !(4..=8).contains(&j.state))
                            .map(|j| j.job_id),
                    );
                } else {
                    targets.push(id);
                }
            }
            let mut failed = 0;
            for t in targets {
                if b.dry_run {
                    println!("Would cancel {t}");
                    continue;
                }
                match call::<_, job::Empty>(
                    &cl,
                    "TerminateJob",
                    &c::TerminateJobRequest { job_id: t.clone() },
                )
                .await
                {
                    Ok(_) => println!("Cancelled {t}"),
                    Err(e) if e.code == Code::NotFound => {
                        eprintln!("error: job {t} not found");
                        failed += 1;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(if failed > 0 { 1 } else { 0 })
        }
        JobCmd::Complete { job_id } => {
            let cl = controller_client(&url)?;
            let _: job::Empty = call(
                &cl,
                "CompleteJob",
                &c::CompleteJobRequest {
                    job_id: job_id.clone(),
                },
            )
            .await?;
            println!("Completed {job_id}");
            Ok(0)
        }
        JobCmd::Wait { job_id } => {
            let cl = controller_client(&url)?;
            let st = wait_terminal(&cl, &job_id).await?;
            let name = iris_types::JobState::from_code(st)
                .map(|s| s.friendly())
                .unwrap_or("unknown");
            println!("{name}");
            Ok(if st == 4 { 0 } else { 1 })
        }
        JobCmd::Summary { job_id, json } => {
            let cl = controller_client(&url)?;
            let s: c::GetJobStatusResponse = call(
                &cl,
                "GetJobStatus",
                &c::GetJobStatusRequest {
                    job_id: job_id.clone(),
                },
            )
            .await?;
            let t: c::ListTasksResponse =
                call(&cl, "ListTasks", &c::ListTasksRequest { job_id }).await?;
            let v = output::summary_json(&s.job.unwrap_or_default(), &t.tasks);
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{v}");
            }
            Ok(0)
        }
    }
}

async fn wait_terminal(cl: &Client, job_id: &str) -> anyhow::Result<i32> {
    let mut delay = Duration::from_millis(50);
    loop {
        let r: c::GetJobStateResponse = call(
            cl,
            "GetJobState",
            &c::GetJobStateRequest {
                job_ids: vec![job_id.to_string()],
            },
        )
        .await?;
        match r.states.get(job_id) {
            None => bail!("job {job_id} not found"),
            Some(s) if (4..=8).contains(s) => return Ok(*s),
            Some(_) => {}
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

async fn stream_until_done(
    cl: &Client,
    job_id: &str,
    cancel_on_ctrl_c: bool,
) -> anyhow::Result<i32> {
    let src = format!("{job_id}/");
    let mut cursor = 0i64;
    let mut delay = Duration::from_millis(50);
    let mut ctrl_c = Box::pin(tokio::signal::ctrl_c());
    loop {
        let st: c::GetJobStateResponse = call(
            cl,
            "GetJobState",
            &c::GetJobStateRequest {
                job_ids: vec![job_id.to_string()],
            },
        )
        .await?;
        let state = st.states.get(job_id).copied().unwrap_or(0);
        let terminal = (4..=8).contains(&state);
        loop {
            let r: fl::FetchLogsResponse = fetch_logs(
                cl,
                &fl::FetchLogsRequest {
                    source: src.clone(),
                    match_scope: 2,
                    cursor,
                    max_lines: 1000,
                    ..Default::default()
                },
            )
            .await?;
            for e in &r.entries {
                eprintln!("task={} | {}", e.key, e.data);
            }
            let got = r.entries.len();
            cursor = r.cursor;
            if got < 1000 {
                if got > 0 {
                    delay = Duration::from_millis(50);
                }
                break;
            }
        }
        if terminal {
            let s: c::GetJobStatusResponse = call(
                cl,
                "GetJobStatus",
                &c::GetJobStatusRequest {
                    job_id: job_id.to_string(),
                },
            )
            .await?;
            let j = s.job.unwrap_or_default();
            let name = iris_types::JobState::from_code(state)
                .map(|s| s.friendly())
                .unwrap_or("unknown");
            if j.error.is_empty() {
                eprintln!("Job {job_id} {name}");
            } else {
                eprintln!("Job {job_id} {name}: {}", j.error);
            }
            return Ok(if state == 4 { 0 } else { 1 });
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = &mut ctrl_c, if cancel_on_ctrl_c => {
                eprintln!("Interrupted: cancelling {job_id}");
                let _: Result<job::Empty, _> = call(cl, "TerminateJob", &c::TerminateJobRequest { job_id: job_id.to_string() }).await;
                return Ok(130);
            }
        }
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// Streams a sample job's logs to stdout until it ends.
pub(crate) async fn stream_sample(cl: &Client, job_id: &str) -> anyhow::Result<i32> {
    let code = stream_until_done(cl, job_id, false).await?;
    Ok(code)
}

pub(crate) async fn fetch_logs(
    cl: &Client,
    req: &fl::FetchLogsRequest,
) -> Result<fl::FetchLogsResponse, RpcError> {
    cl.call(
        "finelog.logging.LogService",
        "FetchLogs",
        req,
        Duration::from_secs(30),
    )
    .await
}

async fn logs(
    cl: &Client,
    l: &LogArgs,
    source: &str,
    scope: i32,
    job_for_follow: Option<&str>,
) -> anyhow::Result<i32> {
    if let Some(r) = &l.regex {
        if let Err(e) = regex_check(r) {
            bail!("--regex {r:?}: {e}");
        }
    }
    let tail = !l.no_tail;
    let mut req = fl::FetchLogsRequest {
        source: source.to_string(),
        match_scope: scope,
        since_ms: l.since_ms,
        substring: l.substring.clone().unwrap_or_default(),
        regex: l.regex.clone().unwrap_or_default(),
        max_lines: l.max_lines,
        tail,
        min_level: l.level.clone().unwrap_or_default(),
        ..Default::default()
    };
    let r = fetch_logs(cl, &req).await?;
    for e in &r.entries {
        output::print_log(e, source);
    }
    if !l.follow {
        return Ok(0);
    }
    req.cursor = r.cursor;
    req.tail = false;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = fetch_logs(cl, &req).await?;
        for e in &r.entries {
            output::print_log(e, source);
        }
        req.cursor = r.cursor;
        if r.entries.is_empty() {
            if let Some(j) = job_for_follow {
                let st: c::GetJobStateResponse = call(
                    cl,
                    "GetJobState",
                    &c::GetJobStateRequest {
                        job_ids: vec![j.to_string()],
                    },
                )
                .await?;
                if st
                    .states
                    .get(j)
                    .map(|s| (4..=8).contains(s))
                    .unwrap_or(true)
                {
                    return Ok(0);
                }
            }
        }
    }
}

fn regex_check(r: &str) -> Result<(), String> {
    // The server validates too; checking here gives the error before any request.
    let depth = r.chars().fold(0i32, |d, ch| match ch {
        '[' => d + 1,
        ']' => d - 1,
        _ => d,
    });
    if depth > 0 {
        return Err("unbalanced '['".into());
    }
    Ok(())
}

/// Ids from arguments and, with `--stdin`, from standard input: the first CSV field of lines
/// starting with `/` (so `iris query ... -f csv | iris job cancel --stdin` works).
fn bulk_ids(b: &BulkArgs) -> anyhow::Result<Vec<String>> {
    let mut ids = b.ids.clone();
    if b.stdin {
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            let first = line
                .split(',')
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches('"');
            if first.starts_with('/') {
                ids.push(first.to_string());
            }
        }
    }
    if ids.is_empty() {
        bail!("no ids given: pass them as arguments or with --stdin");
    }
    Ok(ids)
}

async fn kick(cl: &Client, b: &BulkArgs, desired: i32) -> anyhow::Result<i32> {
    let ids = bulk_ids(b)?;
    if b.dry_run {
        for i in &ids {
            println!(
                "Would {} {i}",
                if desired == 10 { "preempt" } else { "fail" }
            );
        }
        return Ok(0);
    }
    let r: c::KickTasksResponse = call(
        cl,
        "KickTasks",
        &c::KickTasksRequest {
            targets: ids,
            desired_state: desired,
            reason: b.reason.clone().unwrap_or_default(),
        },
    )
    .await?;
    let mut bad = 0;
    for x in r.results {
        if x.queued {
            println!(
                "{} {}: {}",
                if desired == 10 { "Preempted" } else { "Failed" },
                x.task_id,
                x.detail
            );
        } else {
            bad += 1;
            eprintln!("{}: {}", x.target, x.detail);
        }
    }
    Ok(if bad > 0 { 1 } else { 0 })
}

async fn task_cmd(t: TaskCmd, url: Option<String>) -> anyhow::Result<i32> {
    let cl = controller_client(&url)?;
    match t {
        TaskCmd::List { job_id } => {
            let r: c::ListTasksResponse =
                call(&cl, "ListTasks", &c::ListTasksRequest { job_id }).await?;
            output::print_tasks(&r.tasks);
            Ok(0)
        }
        TaskCmd::Describe { task_id } => {
            let r: c::GetTaskStatusResponse =
                call(&cl, "GetTaskStatus", &c::GetTaskStatusRequest { task_id }).await?;
            output::print_task(&r.task.unwrap_or_default());
            Ok(0)
        }
        TaskCmd::Logs(l) => {
            let src = format!("{}:", l.target);
            logs(&cl, &l, &src, 2, None).await
        }
        TaskCmd::Events { task_id, limit } => {
            iris_types::TaskId::parse(&task_id).map_err(|e| anyhow::anyhow!("{e}"))?;
            task_events(&cl, &task_id, None, limit).await
        }
        TaskCmd::Preempt(b) => kick(&cl, &b, 10).await,
        TaskCmd::Fail(b) => kick(&cl, &b, 5).await,
    }
}

async fn attempt_cmd(a: AttemptCmd, url: Option<String>) -> anyhow::Result<i32> {
    let cl = controller_client(&url)?;
    match a {
        AttemptCmd::Describe { attempt_id } => {
            let id =
                iris_types::AttemptId::parse(&attempt_id).map_err(|e| anyhow::anyhow!("{e}"))?;
            let r: c::GetTaskStatusResponse = call(
                &cl,
                "GetTaskStatus",
                &c::GetTaskStatusRequest {
                    task_id: id.task.to_string(),
                },
            )
            .await?;
            let t = r.task.unwrap_or_default();
            let att = t
                .attempts
                .iter()
                .find(|x| x.attempt_id as u32 == id.attempt)
                .ok_or_else(|| anyhow::anyhow!("attempt {attempt_id} not found"))?;
            output::print_attempt(&id.to_string(), att);
            Ok(0)
        }
        AttemptCmd::Logs(l) => {
            iris_types::AttemptId::parse(&l.target).map_err(|e| anyhow::anyhow!("{e}"))?;
            let src = l.target.clone();
            logs(&cl, &l, &src, 1, None).await
        }
        AttemptCmd::Events { attempt_id, limit } => {
            let id =
                iris_types::AttemptId::parse(&attempt_id).map_err(|e| anyhow::anyhow!("{e}"))?;
            let n = i32::try_from(id.attempt).map_err(|_| {
                anyhow::anyhow!("{attempt_id}: attempt number {} is too large", id.attempt)
            })?;
            task_events(&cl, &id.task.to_string(), Some(n), limit).await
        }
        AttemptCmd::Preempt(b) => kick(&cl, &b, 10).await,
        AttemptCmd::Fail(b) => kick(&cl, &b, 5).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_reason_rules() {
        let sys = iris_types::Band::System.code();
        assert!(check_system_reason(sys, None).is_err());
        assert!(check_system_reason(sys, Some("urgent")).is_err());
        assert!(check_system_reason(sys, Some("heroic")).is_err());
        assert!(check_system_reason(sys, Some("Hero run for the paper")).is_ok());
        assert!(check_system_reason(sys, Some("iris: log server")).is_ok());
        assert!(check_system_reason(2, Some("hero")).is_err());
        assert!(check_system_reason(2, None).is_ok());
    }
}
