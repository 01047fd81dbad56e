//! `iris bench proxy`: what `/proxy` costs. An upstream HTTP server in this process (a small
//! body and a 1 MiB body), registered as an endpoint by a task on an in-process worker, is
//! fetched directly and through the controller's `/proxy` with keep-alive HTTP/1.1 clients:
//! sequential latency (median, p90; the difference is what the proxy adds) and concurrent
//! requests per second. Load generator, controller and upstream share this machine's cores, so
//! the throughput figures are a floor. Prints figures; asserts nothing.

use anyhow::{bail, Context};
use clap::Args;
use iris_proto::cluster::controller as c;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct ProxyArgs {
    /// Sequential requests per latency run.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Concurrent clients in the throughput runs.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds per throughput run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

const MIB: usize = 1 << 20;

async fn start_upstream() -> anyhow::Result<String> {
    let big = bytes::Bytes::from(vec![b'x'; MIB]);
    let app = axum::Router::new()
        .route("/small", axum::routing::get(|| async { "ok" }))
        .route(
            "/1m",
            axum::routing::get(move || {
                let b = big.clone();
                async move { b }
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    // Owned by the runtime: ends with the benchmark process.
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    Ok(addr.to_string())
}

async fn register(url: &str, upstream: &str) -> anyhow::Result<()> {
    let script = format!(
        "curl -sS --fail-with-body -X POST \"$IRIS_CONTROLLER_ADDRESS/iris.cluster.EndpointService/RegisterEndpoint\" \
         -H 'content-type: application/json' \
         -d \"{{\\\"name\\\":\\\"/bench/proxy/up\\\",\\\"address\\\":\\\"{upstream}\\\",\\\"taskId\\\":\\\"${{IRIS_TASK_ID%:*}}\\\",\\\"attemptId\\\":${{IRIS_TASK_ID##*:}}}}\" && sleep 3600"
    );
    let mut req = crate::bench::request("/bench/proxy".into());
    if let Some(e) = req.entrypoint.as_mut() {
        e.run_command = Some(iris_proto::job::CommandEntrypoint {
            argv: vec!["sh".into(), "-c".into(), script],
        });
    }
    let cl = iris_rpc::Client::new(url)?;
    let _: c::LaunchJobResponse = cl
        .call(
            "iris.cluster.ControllerService",
            "LaunchJob",
            &req,
            Duration::from_secs(60),
        )
        .await?;
    for _ in 0..600 {
        let r: c::ListEndpointsResponse = cl
            .call(
                "iris.cluster.EndpointService",
                "ListEndpoints",
                &c::ListEndpointsRequest {
                    prefix: "/bench/proxy/up".into(),
                    exact: true,
                    ..Default::default()
                },
                Duration::from_secs(5),
            )
            .await?;
        if !r.endpoints.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the task did not register its endpoint within 30 s")
}

async fn get(cl: &reqwest::Client, url: &str, want: usize) -> anyhow::Result<()> {
    let r = cl.get(url).send().await?;
    if !r.status().is_success() {
        bail!("{url}: HTTP {}", r.status());
    }
    let n = r.bytes().await?.len();
    if n != want {
        bail!("{url}: {n} bytes, expected {want}");
    }
    Ok(())
}

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().http1_only().build()?)
}

/// Sequential latencies (sorted) of `n` GETs on one keep-alive connection.
async fn latencies(url: &str, want: usize, n: usize) -> anyhow::Result<Vec<Duration>> {
    let cl = client()?;
    for _ in 0..20 {
        get(&cl, url, want).await?;
    }
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        get(&cl, url, want).await?;
        lat.push(t.elapsed());
    }
    lat.sort();
    Ok(lat)
}

/// Requests per second from `clients` concurrent keep-alive clients for `secs`.
async fn throughput(url: &str, want: usize, clients: usize, secs: f64) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut hs = Vec::new();
    for _ in 0..clients {
        let url = url.to_string();
        let cl = client()?;
        hs.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                get(&cl, &url, want).await?;
                n += 1;
            }
            Ok::<_, anyhow::Error>(n)
        }));
    }
    let start = Instant::now();
    let mut total = 0;
    for h in hs {
        total += h.await.context("client task")??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

pub(crate) async fn run(url: &str, dir: &std::path::Path, a: ProxyArgs) -> anyhow::Result<i32> {
    let worker = crate::bench::start_worker(url, dir).await?;
    let upstream = start_upstream().await?;
    register(url, &upstream).await?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for (path, size, label) in [("small", 2, "small (2 B)"), ("1m", MIB, "1 MiB")] {
        let direct = format!("http://{upstream}/{path}");
        let proxied = format!("{url}/proxy/bench.proxy.up/{path}");
        let n = if size == MIB {
            a.requests / 4
        } else {
            a.requests
        };
        let d = latencies(&direct, size, n).await?;
        let p = latencies(&proxied, size, n).await?;
        let (dm, pm) = (d[d.len() / 2], p[p.len() / 2]);
        let (d9, p9) = (d[d.len() * 9 / 10], p[p.len() * 9 / 10]);
        println!(
            "{label}: latency over {n} sequential requests: direct median {:.3} ms p90 {:.3} ms; \
             proxied median {:.3} ms p90 {:.3} ms; added at the median {:.3} ms",
            ms(dm),
            ms(d9),
            ms(pm),
            ms(p9),
            ms(pm.saturating_sub(dm))
        );
        let dt = throughput(&direct, size, a.clients, a.seconds).await?;
        let pt = throughput(&proxied, size, a.clients, a.seconds).await?;
        println!(
            "{label}: {} clients for {:.0} s: direct {dt:.0} req/s, proxied {pt:.0} req/s ({:.0}% of direct){}",
            a.clients,
            a.seconds,
            100.0 * pt / dt.max(1.0),
            if size == MIB {
                format!(", {:.0} MiB/s through the proxy", pt)
            } else {
                String::new()
            }
        );
    }
    worker.shutdown().await;
    Ok(0)
}
