//! Server time of the dashboard's pages with many jobs in the DB.
//!
//! Starts an in-process controller (no workers, so every job stays pending), submits the jobs
//! over loopback, starts the dashboard and times whole GETs of its pages. Prints figures.
//!
//! `cargo bench -p iris-dashboard --bench jobs_page` (10,000 jobs, release build), or
//! `cargo test -p iris-dashboard --bench jobs_page -- --jobs 10000` (debug build). Under
//! `cargo test` without `--jobs` it is a quick smoke run (300 jobs).

use iris_proto::cluster::controller as c;
use iris_proto::job;
use std::time::{Duration, Instant};

fn request(name: String) -> c::LaunchJobRequest {
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

async fn submit(url: &str, jobs: usize) -> anyhow::Result<()> {
    const CLIENTS: usize = 8;
    let mut handles = Vec::new();
    for k in 0..CLIENTS {
        let cl = iris_rpc::Client::new(url)?;
        // Joined below, before the controller is stopped.
        handles.push(tokio::spawn(async move {
            for i in (k..jobs).step_by(CLIENTS) {
                let _: c::LaunchJobResponse = cl
                    .call(
                        "iris.cluster.ControllerService",
                        "LaunchJob",
                        &request(format!("/user{}/bench-{i:05}", i % 7)),
                        Duration::from_secs(60),
                    )
                    .await
                    .map_err(|e| anyhow::anyhow!("submit failed: {e}"))?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(())
}

/// Times `n` sequential GETs of `path`; returns sorted latencies and the body size.
async fn time_page(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    n: usize,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let mut lat = Vec::with_capacity(n);
    let mut size = 0;
    for _ in 0..n {
        let t = Instant::now();
        let r = http.get(format!("{base}{path}")).send().await?;
        anyhow::ensure!(r.status().is_success(), "GET {path}: {}", r.status());
        size = r.bytes().await?.len();
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    Ok((lat, size))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let jobs = args
        .iter()
        .position(|a| a == "--jobs")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(if args.iter().any(|a| a == "--bench") {
            10_000
        } else {
            300
        });
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(jobs))
}

async fn run(jobs: usize) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("iris-dashboard-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ctl = iris_controller::start(iris_controller::ControllerConfig::local(dir.clone())).await?;
    let url = ctl.url();
    let t = Instant::now();
    submit(&url, jobs).await?;
    println!(
        "submitted {jobs} pending jobs in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let (addr, dash) =
        iris_dashboard::serve(url, std::net::SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let runs = 30;
    let mut worst_jobs_median = 0.0f64;
    for path in [
        "/jobs",
        "/jobs?state=pending",
        "/jobs?user=user3",
        "/jobs?page=100",
        "/job/user0/bench-00000",
        "/scheduler",
        "/backends",
        "/workers",
    ] {
        time_page(&http, &base, path, 2).await?; // warm-up
        let (lat, size) = time_page(&http, &base, path, runs).await?;
        let median = lat[lat.len() / 2];
        if path.starts_with("/jobs") {
            worst_jobs_median = worst_jobs_median.max(median);
        }
        println!(
            "GET {path:<26} {jobs} jobs: median {median:6.1} ms  p90 {:6.1} ms  max {:6.1} ms  ({} KB)",
            lat[lat.len() * 9 / 10],
            lat[lat.len() - 1],
            size / 1024
        );
        anyhow::ensure!(size < 200_000, "{path} is {size} bytes");
    }
    println!("jobs page: worst median {worst_jobs_median:.1} ms (target < 100 ms)");
    // Where the filtered page's time goes: the controller's ListJobs alone, over the same loopback.
    let api = iris_dashboard::Api::new(&format!("http://{}", ctl.addr))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for state in ["", "pending"] {
        let mut lat = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            api.list_jobs(c::JobQuery {
                state_filter: state.into(),
                limit: 50,
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        lat.sort_by(|a, b| a.total_cmp(b));
        println!(
            "  ListJobs RPC alone, state_filter={state:?}: median {:.1} ms",
            lat[lat.len() / 2]
        );
    }
    dash.shutdown().await;
    ctl.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
