//! `iris bench memory`: the controller's resident memory (VmRSS from /proc) and `iris job list`
//! latency, first with an empty cluster, then with N queued jobs (no workers, so they stay
//! PENDING and the tick plans over all of them every round). The controller is a separate
//! `iris cluster controller serve` process so its memory is measured alone.

use anyhow::{bail, Context};
use clap::Args;
use iris_proto::cluster::controller as c;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct MemoryArgs {
    /// Queued jobs for the loaded measurement.
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Concurrent submitting clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Timed runs of each list measurement (the median is reported).
    #[arg(long, default_value_t = 15)]
    runs: usize,
}

/// CPU time `pid` has used so far (user + system), from `/proc/<pid>/stat`.
pub(crate) fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    stat_cpu_seconds(&format!("/proc/{pid}"))
}

/// The user and system CPU time in `dir/stat` (a process's or a thread's), in seconds.
fn stat_cpu_seconds(dir: &str) -> anyhow::Result<f64> {
    let s = std::fs::read_to_string(format!("{dir}/stat"))
        .with_context(|| format!("reading {dir}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = s
        .rsplit_once(')')
        .map(|(_, r)| r)
        .with_context(|| format!("no command name in {dir}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let ticks = |i: usize| -> anyhow::Result<f64> {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("no CPU time in {dir}/stat"))
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&hz| hz > 0)
        .context("the clock tick rate (sysconf CLK_TCK)")? as f64;
    Ok((ticks(11)? + ticks(12)?) / hz)
}

/// A process's live threads grouped by name: how many, their CPU time, and how long they were
/// runnable but waiting for a CPU (`schedstat`), in seconds. Threads that already exited are
/// not counted.
pub(crate) fn thread_times(pid: u32) -> anyhow::Result<Vec<ThreadTimes>> {
    let mut by_name: std::collections::BTreeMap<String, ThreadTimes> = Default::default();
    let tasks = format!("/proc/{pid}/task");
    for entry in std::fs::read_dir(&tasks).with_context(|| format!("listing {tasks}"))? {
        let dir = entry?.path().display().to_string();
        // A thread may exit between the listing and the reads: skip it.
        let (Ok(name), Ok(cpu), Ok(sched)) = (
            std::fs::read_to_string(format!("{dir}/comm")),
            stat_cpu_seconds(&dir),
            std::fs::read_to_string(format!("{dir}/schedstat")),
        ) else {
            continue;
        };
        // schedstat: nanoseconds on a CPU, nanoseconds runnable but waiting, time slices.
        let waiting = sched
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1e9;
        let name = name.trim().to_string();
        let t = by_name.entry(name.clone()).or_insert(ThreadTimes {
            name,
            ..Default::default()
        });
        t.threads += 1;
        t.cpu_s += cpu;
        t.waiting_s += waiting;
    }
    let mut out: Vec<ThreadTimes> = by_name.into_values().collect();
    out.sort_by(|a, b| b.cpu_s.total_cmp(&a.cpu_s));
    Ok(out)
}

#[derive(Default)]
pub(crate) struct ThreadTimes {
    pub name: String,
    pub threads: usize,
    pub cpu_s: f64,
    pub waiting_s: f64,
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
pub(crate) fn rss_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

struct Figures {
    rss_kib: u64,
    hwm_kib: u64,
    /// `iris job list` (default: newest 50), whole process, median ms.
    cli_list_ms: f64,
    /// `ListJobs` limit 50 over one connection, median ms.
    rpc_list_ms: f64,
    /// `iris job list --limit 5000` (10 pages of 500), whole process, median ms.
    cli_list_all_ms: f64,
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// ListJobs refuses offsets past 5,000, so the CLI can page through at most 5,500 jobs.
const LIST_ALL: usize = 5000;

async fn measure(pid: u32, url: &str, runs: usize) -> anyhow::Result<Figures> {
    // Let the tick and allocator settle before reading memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_kib, hwm_kib) = rss_kib(pid)?;
    let exe = std::env::current_exe()?;
    let time_cli = |args: Vec<String>| -> anyhow::Result<f64> {
        let t = Instant::now();
        let o = Command::new(&exe)
            .arg("--controller-url")
            .arg(url)
            .args(&args)
            .stdin(Stdio::null())
            .output()?;
        if !o.status.success() {
            bail!(
                "iris {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    };
    let mut cli = Vec::new();
    let mut all = Vec::new();
    for _ in 0..runs {
        cli.push(time_cli(vec!["job".into(), "list".into()])?);
        all.push(time_cli(vec![
            "job".into(),
            "list".into(),
            "--limit".into(),
            LIST_ALL.to_string(),
        ])?);
    }
    let cl = iris_rpc::Client::new(url)?;
    let mut rpc = Vec::new();
    for _ in 0..runs * 4 {
        let t = Instant::now();
        let _: c::ListJobsResponse = cl
            .call(
                "iris.cluster.ControllerService",
                "ListJobs",
                &c::ListJobsRequest {
                    query: Some(c::JobQuery {
                        limit: 50,
                        ..Default::default()
                    }),
                },
                Duration::from_secs(30),
            )
            .await?;
        rpc.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(Figures {
        rss_kib,
        hwm_kib,
        cli_list_ms: median(cli),
        rpc_list_ms: median(rpc),
        cli_list_all_ms: median(all),
    })
}

pub(crate) async fn submit(url: &str, jobs: usize, clients: usize) -> anyhow::Result<f64> {
    let t = Instant::now();
    let clients = clients.max(1);
    let mut handles = Vec::new();
    for k in 0..clients {
        let cl = iris_rpc::Client::new(url)?;
        handles.push(tokio::spawn(async move {
            for i in (k..jobs).step_by(clients) {
                let _: c::LaunchJobResponse = cl
                    .call(
                        "iris.cluster.ControllerService",
                        "LaunchJob",
                        &crate::bench::request(format!("/bench/queued-{i:05}")),
                        Duration::from_secs(60),
                    )
                    .await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(t.elapsed().as_secs_f64())
}

pub(crate) fn wait_url(dir: &Path, child: &mut std::process::Child) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait()? {
            bail!("controller exited: {st}");
        }
        if let Ok(u) = std::fs::read_to_string(dir.join("controller.url")) {
            if u.trim().starts_with("http://") {
                return Ok(u.trim().to_string());
            }
        }
        if Instant::now() > deadline {
            bail!("controller did not start within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `iris cluster controller serve` on `dir` and an ephemeral loopback port, as its own process
/// (so its memory is measured alone); the caller kills it.
pub(crate) fn spawn_controller(dir: &Path) -> anyhow::Result<std::process::Child> {
    spawn_controller_with(dir, &[])
}

/// [`spawn_controller`] with more `serve` flags.
pub(crate) fn spawn_controller_with(
    dir: &Path,
    extra: &[String],
) -> anyhow::Result<std::process::Child> {
    Command::new(std::env::current_exe()?)
        .args(["cluster", "controller", "serve", "--state-dir"])
        .arg(dir)
        .args(["--bind", "127.0.0.1:0"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the controller")
}

pub async fn run(a: MemoryArgs) -> anyhow::Result<i32> {
    let dir = crate::bench::tempdir()?;
    let mut child = spawn_controller(&dir)?;
    let result = crate::bench::until_interrupted(async {
        let url = wait_url(&dir, &mut child)?;
        let pid = child.id();
        let empty = measure(pid, &url, a.runs).await?;
        let secs = submit(&url, a.jobs, a.clients).await?;
        let loaded = measure(pid, &url, a.runs).await?;
        Ok::<_, anyhow::Error>((empty, secs, loaded))
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let (empty, secs, loaded) = result?;
    let mib = |k: u64| k as f64 / 1024.0;
    let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
    println!(
        "{} jobs queued by {} clients in {:.1} s; no workers, so all stay pending",
        a.jobs, a.clients, secs
    );
    println!();
    println!("| measure | empty | {} queued | ratio |", a.jobs);
    println!("|---|---:|---:|---:|");
    println!(
        "| controller VmRSS (MiB) | {:.1} | {:.1} | {:.2}x |",
        mib(empty.rss_kib),
        mib(loaded.rss_kib),
        ratio(loaded.rss_kib as f64, empty.rss_kib as f64)
    );
    println!(
        "| controller VmHWM, peak (MiB) | {:.1} | {:.1} | {:.2}x |",
        mib(empty.hwm_kib),
        mib(loaded.hwm_kib),
        ratio(loaded.hwm_kib as f64, empty.hwm_kib as f64)
    );
    println!(
        "| `iris job list` (newest 50), whole CLI process, median ms | {:.1} | {:.1} | {:.2}x |",
        empty.cli_list_ms,
        loaded.cli_list_ms,
        ratio(loaded.cli_list_ms, empty.cli_list_ms)
    );
    println!(
        "| `ListJobs` limit 50 RPC, median ms | {:.2} | {:.2} | {:.2}x |",
        empty.rpc_list_ms,
        loaded.rpc_list_ms,
        ratio(loaded.rpc_list_ms, empty.rpc_list_ms)
    );
    println!(
        "| `iris job list --limit {LIST_ALL}` (10 pages of 500), whole CLI process, median ms | {:.1} | {:.1} | {:.2}x |",
        empty.cli_list_all_ms,
        loaded.cli_list_all_ms,
        ratio(loaded.cli_list_all_ms, empty.cli_list_all_ms)
    );
    Ok(0)
}
