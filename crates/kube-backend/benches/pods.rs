//! Pod throughput of the Kubernetes backend against the test kit's fake API server, in-process.
//!
//! One `KubeBackend` (the `k8s-cpu` lane) is connected to an `iris_kube_testkit` server.
//! For a warm-up set and then N attempts (default 1,000) of `true` it measures:
//!
//! 1. apply: one `reconcile` with N new Run attempts, until it returns. Every single-task CPU
//!    attempt is a coordinator, so that is a server-side apply of its PodDisruptionBudget and of
//!    its pod. The cluster has no nodes yet, so the fake kubelet (which runs each container as a
//!    local process, under the server's lock) stays out of this figure;
//! 2. end to end: 40 nodes × 32 CPUs join (capacity never limits 100m pods) and rounds with the
//!    same desired set (no request after the first) run every `ROUND_GAP` until every attempt is
//!    observed SUCCEEDED: attempts/s from the first apply to the last success, and the cost of
//!    each round; then `--steady` rounds with all N finished pods in the watch cache and nothing
//!    left to do;
//! 3. deletion: one round with an empty desired set (the backend deletes the finished pods and
//!    their PDBs), and the time until the API server has none left.
//!
//! Then, as a yardstick for (1) and (3), the same requests from a bare `kube::Client` (apply PDB
//! then pod; once the pods finished, delete pod then PDB), one attempt at a time and 32 at a
//! time: what the fake API server allows, and so how much of each figure is the backend's own.
//! Each measurement gets a fresh fake cluster; the fake server runs on a tokio runtime of its own
//! (see [`with_env`]). Prints figures; nothing is asserted on time.
//!
//! `cargo bench -p iris-kube-backend --bench pods` (release). Options after `--`:
//! `--attempts N` (default 1000), `--warmup N` (default 100), `--steady N` (default 10).

use futures::StreamExt;
use iris_backend::{Backend, DesiredAttempt, Intent, Observation};
use iris_kube_backend::{KubeBackend, KubeSettings, LABEL_BACKEND};
use iris_kube_model as km;
use iris_kube_testkit::{NodeSpec, ServerOptions, TestApiServer};
use iris_proto::job;
use iris_types::{TaskId, TaskState};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NS: &str = "iris";
const NODES: usize = 40;
/// Pause between observation rounds (the controller's reconciler runs on every poke, and at least
/// once a second).
const ROUND_GAP: Duration = Duration::from_millis(100);
/// Attempts in flight for the concurrent yardstick (the backend's apply concurrency).
const RAW_IN_FLIGHT: usize = 32;
const GIVE_UP: Duration = Duration::from_secs(900);
const CONTROLLER_URL: &str = "http://127.0.0.1:9";
const FLOORS: [(f64, &str); 3] = [
    (680.0, "kube-scheduler floor 680 pods/s"),
    (1100.0, "floor 1,100 pods/s"),
    (1000.0, "target 1,000 attempts/s"),
];

fn uid(set: u32, i: usize) -> String {
    format!("{:08x}{:08x}", 0xbe00_0000 | set, i)
}

fn request(prefix: &str, set: u32, i: usize) -> job::RunTaskRequest {
    job::RunTaskRequest {
        task_id: format!("/bench/{prefix}{i}/0"),
        num_tasks: 1,
        attempt_id: 0,
        attempt_uid: uid(set, i),
        entrypoint: Some(job::RuntimeEntrypoint {
            run_command: Some(job::CommandEntrypoint {
                argv: vec!["true".into()],
            }),
            ..Default::default()
        }),
        resources: Some(job::ResourceSpecProto {
            cpu_millicores: 100,
            memory_bytes: 1 << 28,
            ..Default::default()
        }),
        priority: 2,
        ..Default::default()
    }
}

fn desired(
    reqs: &[job::RunTaskRequest],
    with_request: bool,
) -> anyhow::Result<Vec<DesiredAttempt>> {
    reqs.iter()
        .map(|r| {
            Ok(DesiredAttempt {
                attempt_uid: r.attempt_uid.clone(),
                task_id: TaskId::parse(&r.task_id)?,
                attempt_id: u32::try_from(r.attempt_id)?,
                intent: Intent::Run {
                    launch: with_request.then(|| Box::new(r.clone())),
                },
            })
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

fn ratios(per_s: f64) -> String {
    FLOORS
        .iter()
        .map(|(f, what)| format!("{:.2}x {what}", per_s / f))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `p` in [0, 1] of sorted millisecond figures.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn sorted_ms(ds: &[Duration]) -> Vec<f64> {
    let mut v: Vec<f64> = ds.iter().map(|d| ms(*d)).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// Requests the server answered since the last clear (watches left out), by verb and resource.
fn request_counts(server: &TestApiServer) -> String {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for r in server.requests() {
        if r.verb == "watch" {
            continue;
        }
        let key = format!("{} {}", r.verb, r.resource.unwrap_or_default());
        *counts.entry(key).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort();
    if v.is_empty() {
        return "none".into();
    }
    v.into_iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A fresh fake cluster with no nodes yet, and the backend connected to it.
struct Env {
    server: TestApiServer,
    client: kube::Client,
    backend: Arc<KubeBackend>,
    provider: km::ProviderConfig,
}

impl Env {
    async fn connect(server: TestApiServer, dir: &Path) -> anyhow::Result<Env> {
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, server.kubeconfig_yaml(NS))?;
        let client = iris_kube_backend::client(kubeconfig.to_str(), None).await?;
        let provider = km::ProviderConfig {
            namespace: NS.into(),
            default_task_image: "ghcr.io/marin-community/iris-task:latest".into(),
            controller_address: Some(CONTROLLER_URL.into()),
            ..Default::default()
        };
        // Also creates the priority classes the pods name (the yardstick needs them too).
        let (backends, _preflight) = iris_kube_backend::connect(
            client.clone(),
            KubeSettings {
                provider: provider.clone(),
                cluster_queue: "cluster-queue".into(),
                gpu_variants: Vec::new(),
                scale_groups: Vec::new(),
                controller_url: CONTROLLER_URL.into(),
            },
        )
        .await?;
        let backend = backends
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("connect returned no backend"))?;
        Ok(Env {
            server,
            client,
            backend,
            provider,
        })
    }

    /// The nodes the pods select (`iris-<label prefix>-managed=true`).
    fn add_nodes(&self) -> anyhow::Result<()> {
        for i in 0..NODES {
            self.server.add_node(
                NodeSpec::new(format!("cpu-{i:02}")).label("iris-iris-managed", "true"),
            )?;
        }
        Ok(())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }
}

/// Runs `f` against a fresh fake cluster. The server runs on a tokio runtime of its own: its
/// simulation holds the cluster's lock while the kubelet starts processes, and on a shared
/// runtime that stalls the backend's timers and watches for seconds. The backend and `f` run on
/// a second runtime. Nothing either spawned outlives the call.
fn with_env<T>(name: &str, f: impl AsyncFnOnce(&Env) -> anyhow::Result<T>) -> anyhow::Result<T> {
    let server_rt = tokio::runtime::Runtime::new()?;
    let opts = ServerOptions {
        nodes: Vec::new(),
        namespaces: vec![NS.to_string()],
        // Every event stays replayable, so no watch is ever answered 410 Gone.
        history_limit: 1_000_000,
        ..Default::default()
    };
    let (server, _url) = server_rt.block_on(TestApiServer::start(opts))?;
    let dir = std::env::temp_dir().join(format!("iris-kube-bench-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Runtime::new()?;
    let run = rt.block_on(async {
        let env = Env::connect(server, &dir).await?;
        let out = f(&env).await;
        anyhow::Ok((env.server, out))
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let out = run.map(|(server, out)| {
        server_rt.block_on(server.shutdown());
        out
    });
    server_rt.shutdown_timeout(Duration::from_secs(5));
    // Best effort: only the kubeconfig is in it.
    let _ = std::fs::remove_dir_all(&dir);
    out?
}

/// Polls until no pod carries `selector`.
async fn wait_pods_gone(pods: &Api<Pod>, selector: &str) -> anyhow::Result<()> {
    let until = Instant::now() + GIVE_UP;
    loop {
        let left = pods.list(&ListParams::default().labels(selector)).await?;
        if left.items.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < until,
            "{} pods ({selector}) still present",
            left.items.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until `n` pods carrying `selector` have finished.
async fn wait_pods_finished(pods: &Api<Pod>, selector: &str, n: usize) -> anyhow::Result<()> {
    let until = Instant::now() + GIVE_UP;
    loop {
        let list = pods.list(&ListParams::default().labels(selector)).await?;
        let done = list
            .items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
            })
            .count();
        if done >= n {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < until,
            "{done}/{n} pods ({selector}) finished after {GIVE_UP:?}"
        );
        tokio::time::sleep(ROUND_GAP).await;
    }
}

/// One observation round of (2).
struct Round {
    took: Duration,
    /// Requests it made (watches left out).
    requests: usize,
    /// Attempts it reported SUCCEEDED.
    succeeded: usize,
}

fn epoch_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Requests the server answered so far, watches left out.
fn answered(server: &TestApiServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.verb != "watch")
        .count()
}

/// When the last of the backend's containers exited, after `t0_epoch_ms`, by the pods'
/// `state.terminated.finishedAt` (whole seconds).
async fn last_exit_after(
    pods: &Api<Pod>,
    backend: &KubeBackend,
    t0_epoch_ms: i64,
) -> anyhow::Result<Duration> {
    let list = pods
        .list(&ListParams::default().labels(&format!("{LABEL_BACKEND}={}", backend.backend_id())))
        .await?;
    let last = list
        .items
        .iter()
        .flat_map(|p| p.status.iter())
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
        .map(|t| t.0.as_millisecond())
        .max()
        .ok_or_else(|| anyhow::anyhow!("no container has finished"))?;
    Ok(Duration::from_millis((last - t0_epoch_ms).max(0) as u64))
}

struct Figures {
    n: usize,
    apply: Duration,
    apply_requests: String,
    e2e: Duration,
    last_exit: Duration,
    rounds: Vec<Round>,
    round_requests: String,
    steady: Vec<Duration>,
    delete_call: Duration,
    delete_requests: String,
    delete_gone: Duration,
}

/// Apply, run to success and delete `n` attempts through the backend.
async fn through_backend(
    env: &Env,
    prefix: &str,
    set: u32,
    n: usize,
    steady_rounds: usize,
) -> anyhow::Result<Figures> {
    let (backend, server) = (&env.backend, &env.server);
    let reqs: Vec<job::RunTaskRequest> = (0..n).map(|i| request(prefix, set, i)).collect();
    let first = desired(&reqs, true)?;
    let later = desired(&reqs, false)?;

    // (1) One round that applies every pod.
    server.clear_requests();
    let t0 = Instant::now();
    let t0_epoch_ms = epoch_ms();
    let report = backend
        .reconcile(first)
        .await
        .map_err(|e| anyhow::Error::new(e).context("apply round"))?;
    let apply = t0.elapsed();
    let apply_requests = request_counts(server);
    let refused: Vec<&Observation> = report
        .observed
        .iter()
        .filter(|o| o.state == TaskState::WorkerFailed)
        .collect();
    if let Some(o) = refused.first() {
        anyhow::bail!("{} applies refused, first: {}", refused.len(), o.error);
    }

    // (2) Capacity arrives; observation rounds until every attempt is observed SUCCEEDED.
    env.add_nodes()?;
    server.clear_requests();
    let mut rounds = Vec::new();
    let e2e = loop {
        tokio::time::sleep(ROUND_GAP).await;
        let before = answered(server);
        let t = Instant::now();
        let report = backend
            .reconcile(later.clone())
            .await
            .map_err(|e| anyhow::Error::new(e).context("observe round"))?;
        let took = t.elapsed();
        let at = t0.elapsed();
        let mut succeeded = 0;
        for o in &report.observed {
            match o.state {
                TaskState::Succeeded => succeeded += 1,
                TaskState::Pending
                | TaskState::Building
                | TaskState::Running
                | TaskState::Assigned
                | TaskState::Unschedulable => {}
                other => anyhow::bail!(
                    "attempt {} ended {other} (exit {}): {} {}",
                    o.attempt_uid,
                    o.exit_code
                        .map_or_else(|| "none".to_string(), |c| c.to_string()),
                    o.error,
                    o.status_message
                ),
            }
        }
        rounds.push(Round {
            took,
            requests: answered(server) - before,
            succeeded,
        });
        if succeeded == n {
            break at;
        }
        anyhow::ensure!(
            t0.elapsed() < GIVE_UP,
            "only {succeeded}/{n} attempts succeeded after {GIVE_UP:?}"
        );
    };
    let round_requests = request_counts(server);
    let last_exit = last_exit_after(&env.pods(), backend, t0_epoch_ms).await?;
    let mut steady = Vec::new();
    for _ in 0..steady_rounds {
        tokio::time::sleep(ROUND_GAP).await;
        let t = Instant::now();
        backend
            .reconcile(later.clone())
            .await
            .map_err(|e| anyhow::Error::new(e).context("steady round"))?;
        steady.push(t.elapsed());
    }

    // (3) Nothing desired: the backend deletes the finished pods.
    server.clear_requests();
    let t = Instant::now();
    backend
        .reconcile(Vec::new())
        .await
        .map_err(|e| anyhow::Error::new(e).context("delete round"))?;
    let delete_call = t.elapsed();
    let delete_requests = request_counts(server);
    wait_pods_gone(
        &env.pods(),
        &format!("{LABEL_BACKEND}={}", backend.backend_id()),
    )
    .await?;
    let delete_gone = t.elapsed();
    Ok(Figures {
        n,
        apply,
        apply_requests,
        e2e,
        last_exit,
        rounds,
        round_requests,
        steady,
        delete_call,
        delete_requests,
        delete_gone,
    })
}

fn print_figures(f: &Figures) {
    let n = f.n;
    let apply_rate = rate(n, f.apply);
    println!(
        "  (1) apply: one reconcile with {n} new attempts returned in {:.0} ms: {:.0} pods/s, {:.2} ms per pod",
        ms(f.apply),
        apply_rate,
        ms(f.apply) / n as f64
    );
    println!("      requests: {}", f.apply_requests);
    println!("      ratio: {}", ratios(apply_rate));
    let e2e_rate = rate(n, f.e2e);
    println!(
        "  (2) end to end: first apply -> last SUCCEEDED observed in {:.0} ms ({:.0} ms after the apply round; {} observation rounds, {} ms apart): {:.0} attempts/s",
        ms(f.e2e),
        ms(f.e2e.saturating_sub(f.apply)),
        f.rounds.len(),
        ROUND_GAP.as_millis(),
        e2e_rate
    );
    println!("      ratio: {}", ratios(e2e_rate));
    println!(
        "      the last container exited {:.1} s after the first apply (pod status, whole seconds): \
         the backend reported the last success {:.1} s after that",
        f.last_exit.as_secs_f64(),
        f.e2e.as_secs_f64() - f.last_exit.as_secs_f64()
    );
    let r = sorted_ms(&f.rounds.iter().map(|r| r.took).collect::<Vec<_>>());
    println!(
        "      observation round while the pods ran: median {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        pct(&r, 0.5),
        pct(&r, 0.9),
        pct(&r, 1.0)
    );
    println!(
        "      rounds (ms / requests / attempts SUCCEEDED): {}",
        f.rounds
            .iter()
            .map(|r| format!("{:.0}/{}/{}", ms(r.took), r.requests, r.succeeded))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("      requests over those rounds: {}", f.round_requests);
    let s = sorted_ms(&f.steady);
    if !s.is_empty() {
        println!(
            "      steady round, {n} finished pods in the watch cache, nothing to do ({} rounds): median {:.1} ms, max {:.1} ms ({:.1} us per pod)",
            s.len(),
            pct(&s, 0.5),
            pct(&s, 1.0),
            pct(&s, 0.5) * 1000.0 / n as f64
        );
    }
    println!(
        "  (3) delete: the round with an empty desired set returned in {:.0} ms: {:.0} pods deleted/s; all gone from the API after {:.0} ms ({:.0} pods/s)",
        ms(f.delete_call),
        rate(n, f.delete_call),
        ms(f.delete_gone),
        rate(n, f.delete_gone)
    );
    println!("      requests: {}", f.delete_requests);
}

/// The backend's manifests for `reqs`, labelled for no lane.
fn raw_manifests(
    provider: &km::ProviderConfig,
    reqs: &[job::RunTaskRequest],
) -> anyhow::Result<Vec<(PodDisruptionBudget, Pod)>> {
    reqs.iter()
        .map(|r| {
            let input = km::manifest::PodInput {
                task_id: r.task_id.clone(),
                attempt_id: 0,
                attempt_uid: r.attempt_uid.clone(),
                job_id: r
                    .task_id
                    .rsplit_once('/')
                    .map(|(j, _)| j.to_string())
                    .unwrap_or_default(),
                num_tasks: 1,
                task_index: 0,
                band: iris_types::Band::Interactive,
                argv: vec!["true".into()],
                setup_commands: Vec::new(),
                env: Default::default(),
                system_env: [
                    ("IRIS_TASK_ID", format!("{}:0", r.task_id)),
                    ("IRIS_ATTEMPT_UID", r.attempt_uid.clone()),
                    ("IRIS_CONTROLLER_URL", CONTROLLER_URL.to_string()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
                cpu_millicores: 100,
                memory_bytes: 1 << 28,
                disk_bytes: 0,
                gpu_count: 0,
                gpu_variant: String::new(),
                tpu: false,
                group_by: None,
                constraints: Vec::new(),
                timeout_seconds: None,
                task_image: None,
                secrets: Default::default(),
                bundle_id: String::new(),
                workdir_files: Default::default(),
                workdir_file_refs: Default::default(),
            };
            let mut pod = km::manifest::build_pod(&input, provider)?;
            pod.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(LABEL_BACKEND.into(), "bench-raw".into());
            let pdb = km::manifest::build_pdb(&input, provider)
                .ok_or_else(|| anyhow::anyhow!("a single-task CPU attempt gets a PDB"))?;
            Ok((pdb, pod))
        })
        .collect()
}

/// The yardstick: the backend's requests for `n` attempts from a bare client, `in_flight`
/// attempts at a time, under the same conditions as [`through_backend`]: apply (PDB, then pod)
/// with no nodes yet; nodes join; once every pod has finished, delete (pod, then PDB).
/// Returns (apply time, delete time).
async fn raw_cycle(env: &Env, n: usize, in_flight: usize) -> anyhow::Result<(Duration, Duration)> {
    let reqs: Vec<job::RunTaskRequest> = (0..n).map(|i| request("r", 9, i)).collect();
    let manifests = raw_manifests(&env.provider, &reqs)?;
    let names: Vec<(String, String)> = manifests
        .iter()
        .map(|(pdb, pod)| {
            (
                pod.metadata.name.clone().unwrap_or_default(),
                pdb.metadata.name.clone().unwrap_or_default(),
            )
        })
        .collect();
    let pods = env.pods();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), NS);
    let pp = PatchParams::apply("iris-controller").force();
    let t = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(manifests)
        .map(|(pdb, pod)| {
            let (pods, pdbs, pp) = (pods.clone(), pdbs.clone(), pp.clone());
            async move {
                let pdb_name = pdb.metadata.name.clone().unwrap_or_default();
                pdbs.patch(&pdb_name, &pp, &Patch::Apply(&pdb)).await?;
                let name = pod.metadata.name.clone().unwrap_or_default();
                pods.patch(&name, &pp, &Patch::Apply(&pod)).await?;
                Ok(())
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let apply = t.elapsed();
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;

    env.add_nodes()?;
    let selector = format!("{LABEL_BACKEND}=bench-raw");
    wait_pods_finished(&pods, &selector, n).await?;
    let t = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(names)
        .map(|(pod, pdb)| {
            let (pods, pdbs) = (pods.clone(), pdbs.clone());
            async move {
                pods.delete(&pod, &DeleteParams::default()).await?;
                pdbs.delete(&pdb, &DeleteParams::default()).await?;
                Ok(())
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let delete = t.elapsed();
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    wait_pods_gone(&pods, &selector).await?;
    Ok((apply, delete))
}

fn arg(name: &str, default: usize) -> anyhow::Result<usize> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("{name} takes a number")),
        None => Ok(default),
    }
}

fn main() -> anyhow::Result<()> {
    // `cargo test --all-targets` runs bench targets without `--bench`: a small smoke run there
    // keeps the suite quick while still exercising every phase.
    let full = std::env::args().any(|a| a == "--bench");
    let n = arg("--attempts", if full { 1000 } else { 20 })?;
    let warmup = arg("--warmup", if full { 100 } else { 0 })?;
    let steady = arg("--steady", if full { 10 } else { 2 })?;
    println!(
        "Kubernetes backend (k8s-cpu) against the test kit's fake API server, in-process, {} cores; \
         pods of 100m running `true`; {NODES} nodes x 32 CPUs join after the apply round",
        std::thread::available_parallelism().map(|p| p.get()).unwrap_or(1),
    );
    for (label, prefix, set, count) in [("warm-up", "w", 1, warmup), ("measured", "j", 2, n)] {
        if count == 0 {
            continue;
        }
        println!("{label}, {count} attempts:");
        let f = with_env(prefix, async |env: &Env| {
            through_backend(env, prefix, set, count, steady).await
        })?;
        print_figures(&f);
        if label == "measured" {
            println!(
                "yardstick: the same {n} attempts' requests from a bare kube client, fresh cluster each \
                 (apply: PDB then pod, no nodes yet; delete: pod then PDB, pods finished):"
            );
            for in_flight in [1, RAW_IN_FLIGHT] {
                let (apply, delete) = with_env(&format!("raw{in_flight}"), async |env: &Env| {
                    raw_cycle(env, n, in_flight).await
                })?;
                println!(
                    "  {in_flight:>2} attempts in flight: apply {:.0} ms, {:.0} pods/s (backend time / this {:.2}); \
                     delete {:.0} ms, {:.0} pods/s (backend time / this {:.2})",
                    ms(apply),
                    rate(n, apply),
                    f.apply.as_secs_f64() / apply.as_secs_f64().max(1e-9),
                    ms(delete),
                    rate(n, delete),
                    f.delete_call.as_secs_f64() / delete.as_secs_f64().max(1e-9),
                );
            }
        }
    }
    Ok(())
}
