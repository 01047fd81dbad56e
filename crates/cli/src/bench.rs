//! `iris bench`: figures for submit throughput and submit-to-succeeded latency, measured against
//! an in-process controller (and local workers) on 127.0.0.1. Prints figures; asserts nothing.

use clap::{Args, Subcommand};
use iris_proto::cluster::controller as c;
use iris_proto::job;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum BenchCmd {
    /// LaunchJob throughput over loopback with several concurrent clients (no workers, so only
    /// admission is measured).
    Submit(SubmitArgs),
    /// Median submit-to-succeeded latency of a trivial job on an idle local cluster.
    Latency(LatencyArgs),
    /// Controller resident memory and `iris job list` latency, empty and with N queued jobs
    /// (a separate `iris cluster controller serve` process, no workers).
    Memory(crate::bench_memory::MemoryArgs),
    /// Federation: hub-to-peer handoff throughput, and the submit-to-RUNNING latency a handoff
    /// adds (a hub and its peers in-process, null-auth).
    Federation(crate::bench_federation::FederationArgs),
    /// Federation failure detection: SIGKILL of a peer process until the hub shows it
    /// unreachable, and its restart until reachable again (median and max over N rounds).
    FederationDetect(crate::bench_federation_detect::DetectArgs),
    /// `/proxy`: requests per second and the latency it adds over a direct connection, for small
    /// and 1 MiB bodies (controller, worker and upstream in-process).
    Proxy(crate::bench_proxy::ProxyArgs),
    /// Checkpoint time and size for a DB of N finished jobs, and restore time, against a remote
    /// state dir (`s3://…` with AWS_ENDPOINT_URL and friends, `gs://…`, or a path).
    Checkpoint(crate::bench_checkpoint::CheckpointArgs),
    /// Read paths at scale: `ListJobs` newest 50, `GetJobStatus`, `GetJobState` of 100, RSS and
    /// DB size with N finished and L live jobs.
    Reads(crate::bench_reads::ReadsArgs),
    /// Nomad's C1M shape: N jobs of R tasks (a share of them GPU gangs) on W simulated workers,
    /// submit to every task terminal; tasks placed and completed per second, RSS, DB size.
    C1m(crate::bench_c1m::C1mArgs),
}

#[derive(Args)]
pub struct SubmitArgs {
    #[arg(long, default_value_t = 8)]
    clients: usize,
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
}

#[derive(Args)]
pub struct LatencyArgs {
    #[arg(long, default_value_t = 50)]
    jobs: usize,
}

pub(crate) fn request(name: String) -> c::LaunchJobRequest {
    c::LaunchJobRequest {
        name: Some(name),
        entrypoint: Some(job::RuntimeEntrypoint {
            run_command: Some(job::CommandEntrypoint {
                argv: vec!["true".into()],
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
    }
}

pub async fn run(cmd: BenchCmd) -> anyhow::Result<i32> {
    let cmd = match cmd {
        BenchCmd::Memory(a) => return crate::bench_memory::run(a).await,
        BenchCmd::Federation(a) => return crate::bench_federation::run(a).await,
        BenchCmd::FederationDetect(a) => return crate::bench_federation_detect::run(a).await,
        BenchCmd::Checkpoint(a) => return crate::bench_checkpoint::run(a).await,
        BenchCmd::Reads(a) => return crate::bench_reads::run(a).await,
        BenchCmd::C1m(a) => return crate::bench_c1m::run(a).await,
        other => other,
    };
    let dir = tempdir()?;
    let mut cfg = iris_controller::ControllerConfig::local(dir.clone());
    cfg.revision_date = None;
    let ctl = iris_controller::start(cfg).await?;
    let url = ctl.url();
    let result = match cmd {
        BenchCmd::Submit(a) => submit(&url, a).await,
        BenchCmd::Latency(a) => latency(&url, &dir, a).await,
        BenchCmd::Proxy(a) => crate::bench_proxy::run(&url, &dir, a).await,
        BenchCmd::Memory(_)
        | BenchCmd::Federation(_)
        | BenchCmd::FederationDetect(_)
        | BenchCmd::Checkpoint(_)
        | BenchCmd::Reads(_)
        | BenchCmd::C1m(_) => {
            unreachable!("handled above")
        }
    };
    ctl.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Runs a bench's body until it ends or SIGTERM / Ctrl-C arrives, so that the caller's cleanup
/// (stopping the controller and workers it started, removing its directory) runs either way:
/// a signal's default action would end the bench and leave them running.
pub(crate) async fn until_interrupted<T>(
    body: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let stop = crate::local::shutdown_signal();
    tokio::select! {
        r = body => r,
        () = stop.recv() => Err(anyhow::anyhow!(
            "interrupted: stopping the processes this bench started"
        )),
    }
}

/// The `q` quantile (0..=1) of `sorted` (the sample at `q` of the way from first to last), in
/// milliseconds; 0 for no samples.
pub(crate) fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0.0;
    };
    sorted[((last as f64) * q) as usize].as_secs_f64() * 1e3
}

pub(crate) fn tempdir() -> anyhow::Result<std::path::PathBuf> {
    let mut b = [0u8; 6];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
    let d = std::env::temp_dir().join(format!("iris-bench-{}", hex::encode(b)));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

async fn submit(url: &str, a: SubmitArgs) -> anyhow::Result<i32> {
    let per = a.jobs / a.clients.max(1);
    let start = Instant::now();
    let mut handles = Vec::new();
    for c in 0..a.clients {
        let cl = iris_rpc::Client::new(url)?;
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let t = Instant::now();
                let r: Result<c::LaunchJobResponse, _> = cl
                    .call(
                        "iris.cluster.ControllerService",
                        "LaunchJob",
                        &request(format!("/bench/c{c}-j{i}")),
                        Duration::from_secs(60),
                    )
                    .await;
                if let Err(e) = r {
                    return Err(anyhow::anyhow!("submit failed: {e}"));
                }
                lat.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    all.sort();
    let p = |q: f64| quantile_ms(&all, q);
    println!(
        "submit: {} jobs from {} clients in {:.2}s = {:.0} jobs/s accepted",
        all.len(),
        a.clients,
        secs,
        all.len() as f64 / secs
    );
    println!(
        "submit latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}",
        p(0.5),
        p(0.9),
        p(0.99)
    );
    Ok(0)
}

/// One in-process worker for the benchmarks that run jobs; returns once it has registered.
pub(crate) async fn start_worker(
    url: &str,
    dir: &std::path::Path,
) -> anyhow::Result<iris_worker::RunningWorker> {
    let w = iris_worker::start(iris_worker::WorkerConfig {
        controller_url: url.to_string(),
        worker_id: "worker-bench-0".into(),
        bind: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        cpu_count: 16,
        memory_bytes: 64 << 30,
        disk_bytes: 100 << 30,
        device: None,
        attributes: Vec::new(),
        scale_group: "cpu".into(),
        cache_dir: dir.join("worker"),
        heartbeat_timeout: Duration::from_secs(60),
        python: None,
        task_env: Default::default(),
    })
    .await?;
    let cl = iris_rpc::Client::new(url)?;
    for _ in 0..200 {
        let r: c::ListWorkersResponse = cl
            .call(
                "iris.cluster.ControllerService",
                "ListWorkers",
                &c::ListWorkersRequest::default(),
                Duration::from_secs(5),
            )
            .await?;
        if !r.workers.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(w)
}

async fn latency(url: &str, dir: &std::path::Path, a: LatencyArgs) -> anyhow::Result<i32> {
    if a.jobs == 0 {
        anyhow::bail!("--jobs: give at least 1 job to time");
    }
    let w = start_worker(url, dir).await?;
    let cl = iris_rpc::Client::new(url)?;
    let mut lat = Vec::new();
    for i in 0..a.jobs {
        let name = format!("/bench/lat-{i}");
        let t = Instant::now();
        let _: c::LaunchJobResponse = cl
            .call(
                "iris.cluster.ControllerService",
                "LaunchJob",
                &request(name.clone()),
                Duration::from_secs(60),
            )
            .await?;
        loop {
            let r: c::GetJobStateResponse = cl
                .call(
                    "iris.cluster.ControllerService",
                    "GetJobState",
                    &c::GetJobStateRequest {
                        job_ids: vec![name.clone()],
                    },
                    Duration::from_secs(5),
                )
                .await?;
            match r.states.get(&name) {
                Some(4) => break,
                Some(s) if (5..=8).contains(s) => anyhow::bail!("job {name} ended in state {s}"),
                _ => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
        lat.push(t.elapsed());
    }
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let at = |q: usize| ms(lat[(lat.len() * q / 100).min(lat.len() - 1)]);
    println!(
        "submit-to-succeeded latency over {} trivial jobs: median {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        lat.len(),
        at(50),
        at(90),
        at(99),
        ms(lat[lat.len() - 1])
    );
    w.shutdown().await;
    Ok(0)
}
