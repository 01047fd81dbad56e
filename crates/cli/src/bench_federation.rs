//! `iris bench federation`: handoff throughput and the extra submit-to-RUNNING latency of a
//! handoff, with a hub and its peers as in-process controllers on 127.0.0.1 (ephemeral ports,
//! temp state dirs). Every controller runs with null-auth, so the hub mints no federation tokens
//! and the peers verify none. Prints figures; asserts nothing.

use anyhow::{bail, Context};
use clap::Args;
use iris_controller::federation::{FederationConfig, PeerConfig};
use iris_proto::cluster::controller as c;
use iris_proto::{inspect, job};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CONTROLLER: &str = "iris.cluster.ControllerService";
const PEERS: [&str; 2] = ["cw-a", "cw-b"];
/// The throughput runs' sync interval; heartbeats are set per run.
const FAST_SYNC: Duration = Duration::from_millis(50);
const FAST_HEARTBEAT: Duration = Duration::from_millis(200);
/// The figure MultiKueue publishes for dispatching workloads to worker clusters.
const MULTIKUEUE_PER_SEC: f64 = 45.0;
/// Job states (`iris_types::JobState` codes).
const RUNNING: i32 = 3;
const SUCCEEDED: i32 = 4;

#[derive(Args)]
pub struct FederationArgs {
    /// Jobs handed off in the main throughput run.
    #[arg(long, default_value_t = 5000)]
    jobs: usize,
    /// The hub's promotions per peer per control tick in the main throughput run (the
    /// reference default, 8, is measured in a second, smaller run).
    #[arg(long, default_value_t = 1000)]
    max_handoffs_per_cycle: usize,
    /// Concurrent LaunchJob calls to the hub in the throughput runs.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// Sequential `sleep 0.2` jobs per latency measurement (after one warm-up job).
    #[arg(long, default_value_t = 30)]
    latency_jobs: usize,
}

pub async fn run(a: FederationArgs) -> anyhow::Result<i32> {
    println!(
        "auth: none on the hub and the peers (null-auth: no federation tokens minted or verified)"
    );
    let reference = FederationConfig::default();
    let runs = [
        (a.jobs, a.max_handoffs_per_cycle, FAST_HEARTBEAT),
        (
            a.jobs.min(1000),
            reference.max_handoffs_per_cycle,
            FAST_HEARTBEAT,
        ),
        (
            a.jobs.min(1000),
            reference.max_handoffs_per_cycle,
            reference.heartbeat_interval,
        ),
    ];
    for (i, (jobs, cap, heartbeat)) in runs.into_iter().enumerate() {
        let label = format!(
            "throughput[jobs={jobs} max_handoffs_per_cycle={cap} heartbeat={} sync={} in_flight={}]",
            fmt_dur(heartbeat),
            fmt_dur(FAST_SYNC),
            a.in_flight
        );
        let mut fleet = Fleet::default();
        let r = throughput(&mut fleet, jobs, cap, heartbeat, a.in_flight).await;
        fleet.stop().await;
        let t = r.with_context(|| format!("{label} failed"))?;
        println!(
            "{label}: submit {:.0} jobs/s accepted by the hub ({jobs} in {:.2} s)",
            jobs as f64 / t.submit_secs,
            t.submit_secs
        );
        let handoff_rate = jobs as f64 / t.first_submit_to_last_ack_secs;
        println!(
            "{label}: end-to-end handoff {handoff_rate:.0} jobs/s (first submit -> last acknowledgement {:.2} s)",
            t.first_submit_to_last_ack_secs
        );
        println!(
            "{label}: last submit -> last acknowledgement {:.2} s",
            t.last_submit_to_last_ack_secs
        );
        if i == 0 {
            println!(
                "{label}: {:.0}x MultiKueue's published ~{MULTIKUEUE_PER_SEC:.0} workloads/s",
                handoff_rate / MULTIKUEUE_PER_SEC
            );
        }
    }
    let mut fleet = Fleet::default();
    let r = latency(&mut fleet, a.latency_jobs).await;
    fleet.stop().await;
    r.context("latency measurement failed")?;
    Ok(0)
}

/// Everything one measurement started: stopped and removed together, on success and on error.
#[derive(Default)]
struct Fleet {
    controllers: Vec<iris_controller::RunningController>,
    workers: Vec<iris_worker::RunningWorker>,
    dirs: Vec<PathBuf>,
}

impl Fleet {
    async fn controller(&mut self, name: &str, fed: FederationConfig) -> anyhow::Result<String> {
        let dir = crate::bench::tempdir().context("creating a controller state dir")?;
        self.dirs.push(dir.clone());
        let mut cfg = iris_controller::ControllerConfig::local(dir);
        cfg.federation = fed;
        let ctl = iris_controller::start(cfg)
            .await
            .with_context(|| format!("starting controller {name}"))?;
        let url = ctl.url();
        self.controllers.push(ctl);
        Ok(url)
    }

    async fn worker(&mut self, controller_url: &str, cpu_count: i32) -> anyhow::Result<()> {
        let dir = crate::bench::tempdir().context("creating a worker cache dir")?;
        self.dirs.push(dir.clone());
        let w = iris_worker::start(iris_worker::WorkerConfig {
            controller_url: controller_url.to_string(),
            worker_id: format!("worker-bench-{}", self.workers.len()),
            bind: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            cpu_count,
            memory_bytes: 8 << 30,
            disk_bytes: 20 << 30,
            device: None,
            attributes: Vec::new(),
            scale_group: "cpu".into(),
            cache_dir: dir,
            heartbeat_timeout: Duration::from_secs(60),
            python: None,
            task_env: Default::default(),
        })
        .await
        .context("starting a worker")?;
        self.workers.push(w);
        Ok(())
    }

    /// Workers first, then controllers newest first (a hub before its peers), then the dirs.
    async fn stop(self) {
        for w in self.workers {
            w.shutdown().await;
        }
        for ctl in self.controllers.into_iter().rev() {
            ctl.shutdown().await;
        }
        for d in self.dirs {
            if let Err(e) = std::fs::remove_dir_all(&d) {
                eprintln!("warning: removing {}: {e}", d.display());
            }
        }
    }
}

fn hub_config(
    name: &str,
    peers: Vec<PeerConfig>,
    max_handoffs_per_cycle: usize,
    heartbeat_interval: Duration,
    sync_interval: Duration,
) -> FederationConfig {
    FederationConfig {
        cluster_name: name.into(),
        peers,
        max_handoffs_per_cycle,
        heartbeat_interval,
        sync_interval,
    }
}

/// A one-task CPU job running `argv`, pinned to `peer` when given (what `iris job run
/// --target-cluster <peer>` sends: `cluster EQ <peer>`, REQUIRED).
fn launch(name: String, argv: &[&str], peer: Option<&str>) -> c::LaunchJobRequest {
    let mut req = crate::bench::request(name);
    req.entrypoint = Some(job::RuntimeEntrypoint {
        run_command: Some(job::CommandEntrypoint {
            argv: argv.iter().map(|s| s.to_string()).collect(),
        }),
        ..Default::default()
    });
    if let Some(p) = peer {
        req.constraints.push(job::Constraint {
            key: Some("cluster".into()),
            op: Some(0),
            value: Some(job::AttributeValue {
                value: Some(job::attribute_value::Value::StringValue(p.into())),
            }),
            values: Vec::new(),
            mode: Some(0),
        });
    }
    req
}

fn epoch_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn fmt_dur(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Polls `cond` every 20 ms for up to `limit`.
async fn wait_for<F, Fut>(what: &str, limit: Duration, mut cond: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    while !cond().await? {
        if start.elapsed() > limit {
            bail!("timed out after {} waiting for {what}", fmt_dur(limit));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Waits until the hub's heartbeat has reached every peer.
async fn wait_peers_reachable(hub: &iris_rpc::Client, n: usize) -> anyhow::Result<()> {
    wait_for(
        "the hub to reach its peers",
        Duration::from_secs(20),
        move || async move {
            let r: c::ListPeersResponse = hub
                .call(
                    CONTROLLER,
                    "ListPeers",
                    &c::ListPeersRequest {},
                    Duration::from_secs(5),
                )
                .await
                .context("ListPeers on the hub")?;
            Ok(r.peers.iter().filter(|p| p.reachable).count() >= n)
        },
    )
    .await
}

struct Throughput {
    submit_secs: f64,
    first_submit_to_last_ack_secs: f64,
    last_submit_to_last_ack_secs: f64,
}

/// Two admitting peers (no workers) and a hub; `jobs` pinned jobs alternate between the peers.
async fn throughput(
    fleet: &mut Fleet,
    jobs: usize,
    cap: usize,
    heartbeat: Duration,
    in_flight: usize,
) -> anyhow::Result<Throughput> {
    let mut peers = Vec::new();
    for id in PEERS {
        let address = fleet.controller(id, FederationConfig::default()).await?;
        peers.push(PeerConfig {
            id: id.into(),
            address,
        });
    }
    let hub_url = fleet
        .controller("hub", hub_config("hub", peers, cap, heartbeat, FAST_SYNC))
        .await?;
    let hub = iris_rpc::Client::new(&hub_url)?;
    wait_peers_reachable(&hub, PEERS.len()).await?;

    let first_submit_ms = epoch_ms();
    let start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut submitters = tokio::task::JoinSet::new();
    for _ in 0..in_flight.max(1) {
        let cl = iris_rpc::Client::new(&hub_url)?;
        let next = next.clone();
        submitters.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return Ok::<_, anyhow::Error>(());
                }
                let req = launch(format!("/bench/fed-{i}"), &["true"], Some(PEERS[i % 2]));
                let _: c::LaunchJobResponse = cl
                    .call(CONTROLLER, "LaunchJob", &req, Duration::from_secs(60))
                    .await
                    .with_context(|| format!("submitting job {i} to the hub"))?;
            }
        });
    }
    while let Some(r) = submitters.join_next().await {
        r.context("a submitting task panicked")??;
    }
    let submit_secs = start.elapsed().as_secs_f64();
    let last_submit_ms = epoch_ms();
    let last_ack_ms = wait_handed_off(&hub, jobs).await?;
    Ok(Throughput {
        submit_secs,
        first_submit_to_last_ack_secs: (last_ack_ms - first_submit_ms) as f64 / 1000.0,
        last_submit_to_last_ack_secs: (last_ack_ms - last_submit_ms) as f64 / 1000.0,
    })
}

/// Handoff states of the hub's sent jobs (`ListHandoffs`).
#[derive(Debug, PartialEq)]
struct HandoffCounts {
    queued: i64,
    pending: i64,
    handed_off: i64,
    rejected: i64,
    /// When the hub recorded the latest acknowledgement (epoch ms).
    last_ack_ms: Option<i64>,
}

async fn handoff_counts(hub: &iris_rpc::Client) -> anyhow::Result<HandoffCounts> {
    let r: inspect::ListHandoffsResponse = hub
        .call(
            iris_proto::INSPECT_SERVICE,
            "ListHandoffs",
            &inspect::ListHandoffsRequest::default(),
            Duration::from_secs(15),
        )
        .await
        .context("ListHandoffs on the hub")?;
    let mut c = HandoffCounts {
        queued: 0,
        pending: 0,
        handed_off: 0,
        rejected: 0,
        last_ack_ms: None,
    };
    for h in r
        .handoffs
        .iter()
        .filter(|h| h.direction() == inspect::HandoffDirection::Sent)
    {
        match h.state() {
            inspect::HandoffState::Queued => c.queued += 1,
            inspect::HandoffState::Pending => c.pending += 1,
            inspect::HandoffState::Rejected => c.rejected += 1,
            inspect::HandoffState::HandedOff => {
                c.handed_off += 1;
                c.last_ack_ms = c.last_ack_ms.max(h.handed_off_at_ms);
            }
        }
    }
    Ok(c)
}

/// Polls the hub's DB until `jobs` handoffs are acknowledged; returns the last one's time.
/// Gives up after 30 s without progress.
async fn wait_handed_off(hub: &iris_rpc::Client, jobs: usize) -> anyhow::Result<i64> {
    let mut last = handoff_counts(hub).await?;
    let mut progressed = Instant::now();
    loop {
        if last.rejected > 0 {
            bail!("the peers rejected {} handoffs: {last:?}", last.rejected);
        }
        if last.handed_off >= jobs as i64 {
            return last
                .last_ack_ms
                .context("handed-off jobs without handed_off_at_ms");
        }
        if progressed.elapsed() > Duration::from_secs(30) {
            bail!("no handoff progress for 30 s: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = handoff_counts(hub).await?;
        if now != last {
            progressed = Instant::now();
        }
        last = now;
    }
}

async fn job_state(cl: &iris_rpc::Client, name: &str) -> anyhow::Result<Option<i32>> {
    let r: c::GetJobStateResponse = cl
        .call(
            CONTROLLER,
            "GetJobState",
            &c::GetJobStateRequest {
                job_ids: vec![name.to_string()],
            },
            Duration::from_secs(5),
        )
        .await
        .with_context(|| format!("GetJobState {name}"))?;
    Ok(r.states.get(name).copied())
}

/// RUNNING or already SUCCEEDED; a failed job is an error.
fn started(name: &str, state: Option<i32>) -> anyhow::Result<bool> {
    match state {
        Some(RUNNING | SUCCEEDED) => Ok(true),
        Some(s) if s > SUCCEEDED => bail!("job {name} ended in state {s}"),
        _ => Ok(false),
    }
}

const JOB_LIMIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(2);

async fn wait_succeeded(peer: &iris_rpc::Client, name: &str) -> anyhow::Result<()> {
    wait_for(
        &format!("job {name} to succeed"),
        JOB_LIMIT,
        move || async move {
            let s = job_state(peer, name).await?;
            started(name, s)?;
            Ok(s == Some(SUCCEEDED))
        },
    )
    .await
}

/// Submit → RUNNING of `sleep 0.2` submitted straight to the peer.
async fn direct(peer: &iris_rpc::Client, i: usize) -> anyhow::Result<Duration> {
    let name = format!("/bench/direct-{i}");
    let t = Instant::now();
    let _: c::LaunchJobResponse = peer
        .call(
            CONTROLLER,
            "LaunchJob",
            &launch(name.clone(), &["sleep", "0.2"], None),
            Duration::from_secs(60),
        )
        .await
        .context("LaunchJob on the peer")?;
    loop {
        if started(&name, job_state(peer, &name).await?)? {
            break;
        }
        if t.elapsed() > JOB_LIMIT {
            bail!("job {name} not RUNNING after {}", fmt_dur(JOB_LIMIT));
        }
        tokio::time::sleep(POLL).await;
    }
    let d = t.elapsed();
    wait_succeeded(peer, &name).await?;
    Ok(d)
}

struct ViaHub {
    /// Submit to the hub → RUNNING on the peer (as the peer reports it).
    on_peer: Duration,
    /// Submit to the hub → the hub's mirror shows RUNNING (or already SUCCEEDED).
    on_hub: Duration,
    /// The hub's first started state was RUNNING rather than SUCCEEDED.
    hub_saw_running: bool,
}

/// Submit to the hub pinned to `cw-a`; polls the peer and the hub until both show it started.
async fn via_hub(
    hub: &iris_rpc::Client,
    peer: &iris_rpc::Client,
    hub_name: &str,
    i: usize,
) -> anyhow::Result<ViaHub> {
    let name = format!("/bench/{hub_name}-{i}");
    let t = Instant::now();
    let _: c::LaunchJobResponse = hub
        .call(
            CONTROLLER,
            "LaunchJob",
            &launch(name.clone(), &["sleep", "0.2"], Some(PEERS[0])),
            Duration::from_secs(60),
        )
        .await
        .context("LaunchJob on the hub")?;
    let (mut on_peer, mut on_hub, mut hub_saw_running) = (None, None, false);
    loop {
        if on_peer.is_none() && started(&name, job_state(peer, &name).await?)? {
            on_peer = Some(t.elapsed());
        }
        if on_hub.is_none() {
            let s = job_state(hub, &name).await?;
            if started(&name, s)? {
                on_hub = Some(t.elapsed());
                hub_saw_running = s == Some(RUNNING);
            }
        }
        if let (Some(on_peer), Some(on_hub)) = (on_peer, on_hub) {
            wait_succeeded(peer, &name).await?;
            return Ok(ViaHub {
                on_peer,
                on_hub,
                hub_saw_running,
            });
        }
        if t.elapsed() > JOB_LIMIT {
            bail!(
                "job {name} not started after {} (peer: {on_peer:?}, hub: {on_hub:?})",
                fmt_dur(JOB_LIMIT)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Median and p90 in ms.
fn summary(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(v[v.len() / 2]), ms(v[v.len() * 9 / 10]))
}

/// One peer with one worker (4 CPUs); `n` sequential jobs straight to it, then through a hub with
/// the reference intervals and through one with a 50 ms sync interval.
async fn latency(fleet: &mut Fleet, n: usize) -> anyhow::Result<()> {
    let n = n.max(1);
    let peer_url = fleet
        .controller(PEERS[0], FederationConfig::default())
        .await?;
    fleet.worker(&peer_url, 4).await?;
    let peer = iris_rpc::Client::new(&peer_url)?;
    let p = &peer;
    wait_for(
        "the worker to register",
        Duration::from_secs(20),
        move || async move {
            let r: c::ListWorkersResponse = p
                .call(
                    CONTROLLER,
                    "ListWorkers",
                    &c::ListWorkersRequest::default(),
                    Duration::from_secs(5),
                )
                .await
                .context("ListWorkers on the peer")?;
            Ok(!r.workers.is_empty())
        },
    )
    .await?;

    let mut lat = Vec::with_capacity(n);
    for i in 0..=n {
        let d = direct(&peer, i).await?;
        if i > 0 {
            lat.push(d);
        }
    }
    let (direct_p50, direct_p90) = summary(lat);
    println!(
        "latency[direct to {}, 1 worker, {n} x sleep 0.2]: submit -> RUNNING median {direct_p50:.1} ms  p90 {direct_p90:.1} ms",
        PEERS[0]
    );

    let reference = FederationConfig::default();
    for (hub_name, sync) in [
        ("hub-reference", reference.sync_interval),
        ("hub-tuned", FAST_SYNC),
    ] {
        let cfg = hub_config(
            hub_name,
            vec![PeerConfig {
                id: PEERS[0].into(),
                address: peer_url.clone(),
            }],
            reference.max_handoffs_per_cycle,
            reference.heartbeat_interval,
            sync,
        );
        let label = format!(
            "latency[via hub, sync={} heartbeat={} max_handoffs_per_cycle={}, {n} x sleep 0.2]",
            fmt_dur(cfg.sync_interval),
            fmt_dur(cfg.heartbeat_interval),
            cfg.max_handoffs_per_cycle
        );
        let mut hub_fleet = Fleet::default();
        let r = async {
            let hub_url = hub_fleet.controller(hub_name, cfg).await?;
            let hub = iris_rpc::Client::new(&hub_url)?;
            wait_peers_reachable(&hub, 1).await?;
            let mut runs = Vec::with_capacity(n);
            for i in 0..=n {
                let r = via_hub(&hub, &peer, hub_name, i).await?;
                if i > 0 {
                    runs.push(r);
                }
            }
            Ok::<_, anyhow::Error>(runs)
        }
        .await;
        hub_fleet.stop().await;
        let runs = r.with_context(|| format!("{label} failed"))?;
        let saw_running = runs.iter().filter(|r| r.hub_saw_running).count();
        let (peer_p50, peer_p90) = summary(runs.iter().map(|r| r.on_peer).collect());
        let (hub_p50, hub_p90) = summary(runs.iter().map(|r| r.on_hub).collect());
        println!(
            "{label}: submit -> RUNNING on the peer median {peer_p50:.1} ms  p90 {peer_p90:.1} ms  (handoff adds {:.1} ms at the median)",
            peer_p50 - direct_p50
        );
        println!(
            "{label}: submit -> the hub shows it started median {hub_p50:.1} ms  p90 {hub_p90:.1} ms  (+{:.1} ms over direct; the hub's first view: RUNNING {saw_running}, already SUCCEEDED {})",
            hub_p50 - direct_p50,
            n - saw_running
        );
    }
    Ok(())
}
