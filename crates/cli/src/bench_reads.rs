//! `iris bench reads`: the read paths at scale. A controller (`cluster controller serve`, a
//! separate process so its memory is measured alone, no workers) is filled with N finished jobs
//! (submitted and terminated, so each ends KILLED through the real state machine) and L live
//! ones (pending), then `ListJobs` newest 50, `GetJobStatus` (what `job describe` reads) and
//! `GetJobState` of 100 jobs are timed over one connection, with the controller's RSS and the
//! DB's size.

use crate::bench_memory::{median, rss_kib, wait_url};
use clap::Args;
use iris_proto::cluster::controller as c;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct ReadsArgs {
    /// Finished jobs in the DB.
    #[arg(long, default_value_t = 1_000_000)]
    finished: usize,
    /// Live (pending) jobs in the DB.
    #[arg(long, default_value_t = 10_000)]
    live: usize,
    /// Concurrent clients filling the DB.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Timed calls of each read (median and 99th percentile reported).
    #[arg(long, default_value_t = 200)]
    runs: usize,
    /// Keep the controller's state here (created if missing) instead of a temporary directory.
    /// A directory an earlier run filled with the same counts is reused as it is, so one DB can
    /// be timed by two builds.
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
}

/// Written after a fill: the counts it holds, so a later run can reuse the directory.
const FILLED: &str = "bench-reads-filled";

const SVC: &str = "iris.cluster.ControllerService";

fn p99(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

/// Times `runs` calls of `method` with `req`; (median, p99) in ms.
async fn time_calls<
    Req: prost::Message + serde::Serialize,
    Resp: prost::Message + Default + serde::de::DeserializeOwned,
>(
    cl: &iris_rpc::Client,
    method: &str,
    req: impl Fn(usize) -> Req,
    runs: usize,
) -> anyhow::Result<(f64, f64)> {
    let mut v = Vec::with_capacity(runs);
    for i in 0..runs.max(1) {
        let r = req(i);
        let t = Instant::now();
        let _: Resp = cl
            .call(SVC, method, &r, Duration::from_secs(60))
            .await
            .map_err(|e| anyhow::anyhow!("{method}: {e}"))?;
        v.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((median(v.clone()), p99(v)))
}

pub async fn run(a: ReadsArgs) -> anyhow::Result<i32> {
    let dir = match &a.state_dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .map_err(|e| anyhow::anyhow!("--state-dir {}: {e}", d.display()))?;
            d.clone()
        }
        None => crate::bench::tempdir()?,
    };
    let counts = format!("{} {}", a.finished, a.live);
    let reuse = std::fs::read_to_string(dir.join(FILLED)).is_ok_and(|s| s.trim() == counts);
    if !reuse && dir.join("controller.sqlite3").exists() {
        anyhow::bail!(
            "--state-dir {} holds a DB not filled with --finished {} --live {}; pick an empty directory",
            dir.display(),
            a.finished,
            a.live
        );
    }
    // A reused directory holds the last run's address: wait for this run's.
    let _ = std::fs::remove_file(dir.join("controller.url"));
    let mut child = crate::bench_memory::spawn_controller(&dir)?;
    let result = crate::bench::until_interrupted(async {
        let url = wait_url(&dir, &mut child)?;
        // `None`: the DB of an earlier fill, nothing timed.
        let fill = if reuse {
            println!("reusing the DB in {}", dir.display());
            None
        } else {
            let t = Instant::now();
            crate::bench_checkpoint::fill(&url, a.finished, a.clients).await?;
            let fill_s = t.elapsed().as_secs_f64();
            let live_s = crate::bench_memory::submit(&url, a.live, a.clients).await?;
            std::fs::write(dir.join(FILLED), &counts)?;
            Some((fill_s, live_s))
        };
        // Let the tick and the allocator settle.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (rss, hwm) = rss_kib(child.id())?;
        let cl = iris_rpc::Client::new(&url)?;
        let n = a.finished.max(1);
        let list = time_calls::<_, c::ListJobsResponse>(
            &cl,
            "ListJobs",
            |_| c::ListJobsRequest {
                query: Some(c::JobQuery {
                    limit: 50,
                    ..Default::default()
                }),
            },
            a.runs,
        )
        .await?;
        let describe = time_calls::<_, c::GetJobStatusResponse>(
            &cl,
            "GetJobStatus",
            |i| c::GetJobStatusRequest {
                job_id: format!("/bench/cp-{:06}", (i * 7919) % n),
            },
            a.runs,
        )
        .await?;
        let state = time_calls::<_, c::GetJobStateResponse>(
            &cl,
            "GetJobState",
            |i| c::GetJobStateRequest {
                job_ids: (0..100)
                    .map(|k| format!("/bench/cp-{:06}", (i * 100 + k * 104_729) % n))
                    .collect(),
            },
            a.runs,
        )
        .await?;
        let db = std::fs::metadata(dir.join("controller.sqlite3"))
            .map(|m| m.len())
            .unwrap_or(0)
            + std::fs::metadata(dir.join("controller.sqlite3-wal"))
                .map(|m| m.len())
                .unwrap_or(0);
        Ok::<_, anyhow::Error>((fill, rss, hwm, list, describe, state, db))
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    if a.state_dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (fill, rss, hwm, list, describe, state, db) = result?;
    match fill {
        None => println!(
            "{} finished and {} live jobs from an earlier fill",
            a.finished, a.live
        ),
        Some((fill_s, live_s)) => println!(
            "{} finished jobs in {:.0} s ({:.0} submit+terminate pairs/s), {} live in {:.1} s",
            a.finished,
            fill_s,
            a.finished as f64 / fill_s.max(1e-9),
            a.live,
            live_s
        ),
    }
    println!();
    println!(
        "| read ({} calls, one connection) | median ms | p99 ms |",
        a.runs
    );
    println!("|---|---:|---:|");
    println!("| `ListJobs` newest 50 | {:.2} | {:.2} |", list.0, list.1);
    println!(
        "| `GetJobStatus` (job describe) | {:.2} | {:.2} |",
        describe.0, describe.1
    );
    println!(
        "| `GetJobState` of 100 jobs | {:.2} | {:.2} |",
        state.0, state.1
    );
    println!();
    println!(
        "controller VmRSS {:.1} MiB (peak {:.1} MiB); DB {:.1} MiB",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        db as f64 / 1048576.0
    );
    Ok(0)
}
