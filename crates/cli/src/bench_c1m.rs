//! `iris bench c1m`: Nomad's C1M shape against our controller. A controller
//! (`cluster controller serve`) and a fleet of simulated workers (`worker simulate`, one process)
//! run as separate processes on loopback, so the controller pays every Register, Reconcile and
//! commit over real RPC. Jobs of `--replicas` tasks are submitted (a share of them GPU gangs
//! coscheduled by pool), then the bench polls `/metrics` and `GetJobState` until every job is
//! terminal, and prints tasks placed per second, tasks completed per second, the controller's
//! RSS and the DB's size.

use crate::bench_memory::{cpu_seconds, rss_kib, wait_url};
use anyhow::{bail, Context};
use clap::Args;
use iris_proto::cluster::controller as c;
use iris_proto::job;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct C1mArgs {
    /// Jobs to submit.
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Tasks per job.
    #[arg(long, default_value_t = 100)]
    replicas: i32,
    /// Simulated workers (8 H100s and 64 CPUs each, in pools of `--pool-size`).
    #[arg(long, default_value_t = 5_000)]
    workers: usize,
    #[arg(long, default_value_t = 10)]
    pool_size: usize,
    /// Percent of jobs that are GPU gangs: `--pool-size` tasks of one H100x8 host each,
    /// coscheduled by pool.
    #[arg(long, default_value_t = 5)]
    gang_percent: u32,
    /// How long each simulated attempt runs (as `worker simulate --duration`).
    #[arg(long, default_value = "1s..3s")]
    duration: String,
    /// Percent of attempts that fail (retried: the jobs carry a large failure budget).
    #[arg(long, default_value_t = 1)]
    fail_percent: u32,
    /// Concurrent submitting clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3_600)]
    timeout_s: u64,
    /// Passed to the controller (`serve --max-reconciles-per-second`); a large value reconciles
    /// every idle worker every second, as before the budget existed.
    #[arg(long)]
    max_reconciles_per_second: Option<u32>,
}

const SVC: &str = "iris.cluster.ControllerService";

fn job_name(i: usize) -> String {
    format!("/bench/c1m-{i:06}")
}

fn is_gang(i: usize, percent: u32) -> bool {
    // Spread the gangs evenly through the submission order.
    percent > 0 && (i * percent as usize) % 100 < percent as usize
}

fn request(i: usize, a: &C1mArgs) -> c::LaunchJobRequest {
    let mut r = crate::bench::request(job_name(i));
    r.max_task_failures = Some(1_000_000);
    r.max_retries_failure = Some(1_000_000);
    if is_gang(i, a.gang_percent) {
        r.replicas = Some(a.pool_size as i32);
        r.resources = Some(job::ResourceSpecProto {
            cpu_millicores: 1_000,
            memory_bytes: 1 << 30,
            disk_bytes: 1 << 30,
            device: Some(job::DeviceConfig {
                device: Some(job::device_config::Device::Gpu(job::GpuDevice {
                    variant: "H100".into(),
                    count: 8,
                })),
            }),
        });
        r.coscheduling = Some(job::CoschedulingConfig {
            group_by: "pool".into(),
        });
    } else {
        r.replicas = Some(a.replicas);
    }
    r
}

/// Every sample of metric `name` in the controller's `/metrics` text: its labels (`{...}`, or
/// empty) and its value.
async fn samples(
    http: &reqwest::Client,
    url: &str,
    name: &str,
) -> anyhow::Result<Vec<(String, f64)>> {
    let text = http
        .get(format!("{url}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let labels = key.strip_prefix(name)?;
            (labels.is_empty() || labels.starts_with('{'))
                .then(|| Some((labels.to_string(), value.parse::<f64>().ok()?)))
                .flatten()
        })
        .collect())
}

/// The sum of every sample of counter `name` in the controller's `/metrics` text.
async fn counter(http: &reqwest::Client, url: &str, name: &str) -> anyhow::Result<f64> {
    Ok(samples(http, url, name).await?.iter().map(|(_, v)| v).sum())
}

async fn healthy_workers(cl: &iris_rpc::Client) -> anyhow::Result<usize> {
    let r: c::ListWorkersResponse = cl
        .call(
            SVC,
            "ListWorkers",
            &c::ListWorkersRequest::default(),
            Duration::from_secs(60),
        )
        .await?;
    Ok(r.workers.iter().filter(|w| w.healthy == Some(true)).count())
}

const FINAL: [job::JobState; 5] = [
    job::JobState::Succeeded,
    job::JobState::Failed,
    job::JobState::Killed,
    job::JobState::WorkerFailed,
    job::JobState::Unschedulable,
];

pub async fn run(a: C1mArgs) -> anyhow::Result<i32> {
    let dir = crate::bench::tempdir()?;
    let extra: Vec<String> = a
        .max_reconciles_per_second
        .map(|n| vec!["--max-reconciles-per-second".into(), n.to_string()])
        .unwrap_or_default();
    let mut ctl = crate::bench_memory::spawn_controller_with(&dir, &extra)?;
    let mut fleet: Option<std::process::Child> = None;
    let result = crate::bench::until_interrupted(async {
        let url = wait_url(&dir, &mut ctl)?;
        let cl = iris_rpc::Client::new(&url)?;
        let http = reqwest::Client::new();
        let t_fleet = Instant::now();
        fleet = Some(
            Command::new(std::env::current_exe()?)
                .args(["--controller-url", &url, "worker", "simulate"])
                .args(["--count", &a.workers.to_string()])
                .args(["--id-prefix", "sim", "--cpu", "64"])
                .args(["--pool-size", &a.pool_size.to_string()])
                .args(["--device", "gpu:h100:8", "--duration", &a.duration])
                .args(["--fail-percent", &a.fail_percent.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .context("starting the simulated fleet")?,
        );
        loop {
            if let Some(f) = fleet.as_mut() {
                if let Some(st) = f.try_wait()? {
                    bail!("the simulated fleet exited: {st}");
                }
            }
            if healthy_workers(&cl).await? >= a.workers {
                break;
            }
            if t_fleet.elapsed() > Duration::from_secs(300) {
                bail!(
                    "{} simulated workers did not register within 300 s",
                    a.workers
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let fleet_s = t_fleet.elapsed().as_secs_f64();
        let tasks: u64 = (0..a.jobs)
            .map(|i| request(i, &a).replicas.unwrap_or(1) as u64)
            .sum();
        let gangs = (0..a.jobs).filter(|&i| is_gang(i, a.gang_percent)).count();
        let base_assign = counter(&http, &url, "iris_assignments_total").await?;

        let t0 = Instant::now();
        let fleet_pid = fleet.as_ref().map_or(0, |f| f.id());
        let cpu0 = (cpu_seconds(ctl.id())?, cpu_seconds(fleet_pid)?);
        let clients = a.clients.max(1);
        let mut handles = Vec::new();
        for k in 0..clients {
            let cl = iris_rpc::Client::new(&url)?;
            let reqs: Vec<c::LaunchJobRequest> = (k..a.jobs)
                .step_by(clients)
                .map(|i| request(i, &a))
                .collect();
            handles.push(tokio::spawn(async move {
                let mut took = Vec::with_capacity(reqs.len());
                for r in reqs {
                    let at = Instant::now();
                    let _: c::LaunchJobResponse = cl
                        .call(SVC, "LaunchJob", &r, Duration::from_secs(120))
                        .await?;
                    took.push(at.elapsed());
                }
                Ok::<_, anyhow::Error>(took)
            }));
        }
        let mut launch = Vec::with_capacity(a.jobs);
        for h in handles {
            launch.extend(h.await??);
        }
        launch.sort_unstable();
        let submit_s = t0.elapsed().as_secs_f64();
        eprintln!(
            "submitted {} jobs ({tasks} tasks) in {submit_s:.1} s",
            a.jobs
        );

        let names: Vec<String> = (0..a.jobs).map(job_name).collect();
        let mut placed_s = None;
        let mut peak_rss = 0u64;
        let mut last_report = Instant::now();
        let done_s = loop {
            let assigned = counter(&http, &url, "iris_assignments_total").await? - base_assign;
            if placed_s.is_none() && assigned >= tasks as f64 {
                placed_s = Some(t0.elapsed().as_secs_f64());
            }
            let mut terminal = 0usize;
            for chunk in names.chunks(1_000) {
                let r: c::GetJobStateResponse = cl
                    .call(
                        SVC,
                        "GetJobState",
                        &c::GetJobStateRequest {
                            job_ids: chunk.to_vec(),
                        },
                        Duration::from_secs(60),
                    )
                    .await?;
                terminal += r
                    .states
                    .values()
                    .filter(|s| job::JobState::try_from(**s).is_ok_and(|s| FINAL.contains(&s)))
                    .count();
            }
            peak_rss = peak_rss.max(rss_kib(ctl.id())?.0);
            if last_report.elapsed() > Duration::from_secs(10) {
                eprintln!(
                    "{:.0} s: {assigned:.0} assignments, {terminal}/{} jobs terminal",
                    t0.elapsed().as_secs_f64(),
                    a.jobs
                );
                last_report = Instant::now();
            }
            if terminal == a.jobs {
                break t0.elapsed().as_secs_f64();
            }
            if t0.elapsed() > Duration::from_secs(a.timeout_s) {
                bail!("jobs still running after {} s", a.timeout_s);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let cpu = (
            cpu_seconds(ctl.id())? - cpu0.0,
            cpu_seconds(fleet_pid)? - cpu0.1,
        );
        let assigned = counter(&http, &url, "iris_assignments_total").await? - base_assign;
        let held = samples(&http, &url, "iris_writer_held_seconds_total").await?;
        let threads = crate::bench_memory::thread_times(ctl.id())?;
        let ticks = counter(&http, &url, "iris_ticks_total").await?;
        let (rss, hwm) = rss_kib(ctl.id())?;
        let db = ["controller.sqlite3", "controller.sqlite3-wal"]
            .iter()
            .map(|f| std::fs::metadata(dir.join(f)).map(|m| m.len()).unwrap_or(0))
            .sum::<u64>();
        let placed_s = placed_s.unwrap_or(done_s);
        println!(
            "{} workers (registered in {fleet_s:.1} s); {} jobs, {gangs} of them gangs of {}; \
             {tasks} tasks; {assigned:.0} attempts placed ({:.1}% retries)",
            a.workers,
            a.jobs,
            a.pool_size,
            (assigned - tasks as f64).max(0.0) * 100.0 / tasks.max(1) as f64
        );
        println!();
        println!("| phase | seconds | tasks/s |");
        println!("|---|---:|---:|");
        println!(
            "| submit (LaunchJob, {clients} clients) | {submit_s:.1} | {:.0} |",
            tasks as f64 / submit_s.max(1e-9)
        );
        println!(
            "| submit → every task placed once | {placed_s:.1} | {:.0} |",
            tasks as f64 / placed_s.max(1e-9)
        );
        println!(
            "| submit → every task terminal | {done_s:.1} | {:.0} |",
            tasks as f64 / done_s.max(1e-9)
        );
        println!();
        println!(
            "controller VmRSS {:.1} MiB at the end (peak sampled {:.1} MiB, VmHWM {:.1} MiB); \
             DB {:.1} MiB",
            rss as f64 / 1024.0,
            peak_rss as f64 / 1024.0,
            hwm as f64 / 1024.0,
            db as f64 / 1_048_576.0
        );
        println!(
            "LaunchJob latency while the cluster ran: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            crate::bench::quantile_ms(&launch, 0.5),
            crate::bench::quantile_ms(&launch, 0.99),
            crate::bench::quantile_ms(&launch, 1.0)
        );
        // Since the controller started (registration included).
        let held: Vec<String> = held
            .iter()
            .map(|(labels, s)| {
                let by = labels.trim_start_matches("{by=\"").trim_end_matches("\"}");
                format!("{by} {s:.1} s")
            })
            .collect();
        println!(
            "{ticks:.0} ticks; the writer connection held by {}",
            held.join(", ")
        );
        // Where the controller's CPU went, and how long its threads waited for one (the two
        // cores are shared with the fleet and this bench).
        let threads: Vec<String> = threads
            .iter()
            .filter(|t| t.cpu_s >= 0.05)
            .map(|t| {
                let n = if t.threads > 1 {
                    format!(" ({} threads)", t.threads)
                } else {
                    String::new()
                };
                format!(
                    "{}{n} {:.1} s on a CPU, {:.1} s waiting for one",
                    t.name, t.cpu_s, t.waiting_s
                )
            })
            .collect();
        println!(
            "controller threads since it started: {}",
            threads.join("; ")
        );
        // CPU time varies less than wall time on a shared machine: compare binaries by it too.
        println!(
            "CPU from submit to the end: controller {:.1} s ({:.0} µs per task), simulated fleet \
             {:.1} s, over {done_s:.1} s of wall time on {} cores",
            cpu.0,
            cpu.0 * 1e6 / tasks.max(1) as f64,
            cpu.1,
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
        Ok::<_, anyhow::Error>(())
    })
    .await;
    // The controller first: stopped after the fleet, it would spend its last seconds logging
    // thousands of failed reconciles.
    let _ = ctl.kill();
    let _ = ctl.wait();
    if let Some(mut f) = fleet {
        let _ = f.kill();
        let _ = f.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    result.map(|()| 0)
}
