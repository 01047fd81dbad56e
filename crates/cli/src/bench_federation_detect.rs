//! `iris bench federation-detect`: how long a hub takes to show a peer `reachable: false` after
//! the peer's process is killed with SIGKILL, and `reachable: true` after it is started again.
//!
//! The peer is a separate `iris cluster controller serve` process (so it can really be
//! `kill -9`ed) on a fixed loopback port; the hub runs in this process with the default
//! federation timing (heartbeat 30 s, sync 3 s), so what is measured is the suspect-and-probe
//! path, not a fast heartbeat. Both use null-auth. Prints figures; asserts nothing.

use anyhow::{bail, Context};
use clap::Args;
use iris_controller::federation::{FederationConfig, PeerConfig};
use iris_proto::cluster::controller as c;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CONTROLLER: &str = "iris.cluster.ControllerService";
const PEER: &str = "cw-a";

#[derive(Args)]
pub struct DetectArgs {
    /// Kill/restart rounds.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
}

pub async fn run(a: DetectArgs) -> anyhow::Result<i32> {
    let peer_dir = crate::bench::tempdir().context("creating the peer's state dir")?;
    let hub_dir = crate::bench::tempdir().context("creating the hub's state dir")?;
    let r = measure(&a, &peer_dir, &hub_dir).await;
    for d in [&peer_dir, &hub_dir] {
        let _ = std::fs::remove_dir_all(d);
    }
    r.map(|()| 0)
}

async fn measure(a: &DetectArgs, peer_dir: &Path, hub_dir: &Path) -> anyhow::Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port for the peer")?
        .port();
    let peer_url = format!("http://127.0.0.1:{port}");
    let mut peer = Peer::spawn(peer_dir, port)?;
    let fed = FederationConfig {
        cluster_name: "hub".into(),
        peers: vec![PeerConfig {
            id: PEER.into(),
            address: peer_url.clone(),
        }],
        ..Default::default()
    };
    println!(
        "hub: in-process, heartbeat {} s, sync {} s; peer: `iris cluster controller serve` on {peer_url}",
        fed.heartbeat_interval.as_secs_f64(),
        fed.sync_interval.as_secs_f64()
    );
    let mut cfg = iris_controller::ControllerConfig::local(hub_dir.to_path_buf());
    cfg.federation = fed;
    let hub = iris_controller::start(cfg)
        .await
        .context("starting the hub")?;
    let cl = iris_rpc::Client::new(&hub.url()).map_err(|e| anyhow::anyhow!(e.message))?;
    let result = crate::bench::until_interrupted(rounds(a, &cl, &mut peer, peer_dir, port)).await;
    peer.kill();
    hub.shutdown().await;
    let (down, up) = result?;
    report("kill -9 -> reachable: false", down);
    report("restart -> reachable: true", up);
    Ok(())
}

async fn rounds(
    a: &DetectArgs,
    cl: &iris_rpc::Client,
    peer: &mut Peer,
    peer_dir: &Path,
    port: u16,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    wait_reachable(cl, true, Duration::from_secs(60)).await?;
    let (mut down, mut up) = (Vec::new(), Vec::new());
    for i in 0..a.rounds {
        // A quiet moment between rounds, so each kill finds the hub at rest, of random length
        // so kills land at every phase of the 3 s sync loop (a fixed pause would lock onto it).
        let pause = rand::Rng::gen_range(&mut rand::thread_rng(), 1500..4500);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        peer.kill();
        let t = Instant::now();
        wait_reachable(cl, false, Duration::from_secs(60)).await?;
        down.push(t.elapsed());
        *peer = Peer::spawn(peer_dir, port)?;
        let t = Instant::now();
        wait_reachable(cl, true, Duration::from_secs(60)).await?;
        up.push(t.elapsed());
        println!(
            "round {}: unreachable after {:.2} s, reachable again after {:.2} s",
            i + 1,
            down[i].as_secs_f64(),
            up[i].as_secs_f64()
        );
    }
    Ok((down, up))
}

fn report(what: &str, mut v: Vec<Duration>) {
    if v.is_empty() {
        return;
    }
    v.sort();
    let median = v[v.len() / 2].as_secs_f64();
    let max = v[v.len() - 1].as_secs_f64();
    println!(
        "{what}: median {median:.2} s, max {max:.2} s ({} rounds)",
        v.len()
    );
}

/// Polls the hub's `ListPeers` every 20 ms until the peer's `reachable` is `want`.
async fn wait_reachable(cl: &iris_rpc::Client, want: bool, limit: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let r: c::ListPeersResponse = cl
            .call(
                CONTROLLER,
                "ListPeers",
                &c::ListPeersRequest {},
                Duration::from_secs(5),
            )
            .await
            .context("ListPeers on the hub")?;
        if r.peers
            .iter()
            .any(|p| p.peer_id == PEER && p.reachable == want)
        {
            return Ok(());
        }
        if start.elapsed() > limit {
            bail!("the hub did not show {PEER} reachable={want} within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The peer controller process.
struct Peer(Child);

impl Peer {
    fn spawn(state_dir: &Path, port: u16) -> anyhow::Result<Peer> {
        let exe = std::env::current_exe().context("locating the iris binary")?;
        let child = Command::new(exe)
            .args(["cluster", "controller", "serve", "--state-dir"])
            .arg(state_dir)
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the peer controller")?;
        Ok(Peer(child))
    }

    /// SIGKILL (no chance to shut down) and reap.
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
