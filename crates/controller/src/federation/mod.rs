//! Federation (reference federation-k8s §1): this controller as a hub handing whole root jobs to
//! peers, and as a peer receiving them.
//!
//! Hub side: peers' `ListBackends` heartbeats ([`Federation`] keeps the latest per peer), submit
//! classification (`iris_federation::classify`), the tick's placement pass
//! (`iris_federation::assign_queued` plus the promotion CAS), and one sync loop per peer that
//! delivers promoted jobs, re-drives cancels and mirrors `FederationSync` deltas into our tables.
//!
//! Peer side: `LaunchJob` with a `federation` field (checked in `check_handoff`), the change
//! log (SQLite triggers, `0003_federation`), and the `FederationSync` answer.
//!
//! Logs of a federated job are fetched from the peer on demand (`FetchLogs` is forwarded with a
//! federation token): nothing is copied, the hub never serves a stale or partial log, and a log
//! the user never reads costs nothing. The price is that logs are unreadable from the hub while
//! the peer is down.

mod fleet;
mod hub;
mod loops;
mod peer;

pub(crate) use hub::tick_pass;
pub(crate) use loops::start;

use crate::error::{Error, Result};
use crate::lock;
use iris_federation as fed;
use iris_proto::cluster::controller as c;
use iris_types::Band;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

const CONTROLLER: &str = "iris.cluster.ControllerService";
/// A peer's log service, reached the way clients reach it: through the controller's
/// `/proxy/system.log-server/` route (a Python controller serves logs only there; ours serves
/// both this and the bare service path).
const LOGS: &str = "proxy/system.log-server/finelog.logging.LogService";

/// One configured peer (`peers.<id>`).
#[derive(Clone, Debug)]
pub struct PeerConfig {
    pub id: String,
    pub address: String,
}

/// Federation settings.
#[derive(Clone, Debug)]
pub struct FederationConfig {
    /// This cluster's name: the requester id peers know us by.
    pub cluster_name: String,
    pub peers: Vec<PeerConfig>,
    /// At most this many promotions per peer per tick (reference default 8).
    pub max_handoffs_per_cycle: usize,
    /// How often each peer's `ListBackends` is polled (reference default 30 s).
    pub heartbeat_interval: Duration,
    /// How often each peer's sync loop runs when nothing pokes it (reference 3 s).
    pub sync_interval: Duration,
}

impl Default for FederationConfig {
    fn default() -> Self {
        FederationConfig {
            cluster_name: String::new(),
            peers: Vec::new(),
            max_handoffs_per_cycle: fed::DEFAULT_MAX_PER_PEER_PER_CYCLE,
            heartbeat_interval: Duration::from_secs(30),
            sync_interval: Duration::from_secs(3),
        }
    }
}

/// What the last heartbeat told us about a peer.
#[derive(Clone, Debug, Default)]
struct PeerRuntime {
    reachable: bool,
    /// The peer answered but refused our identity (UNAUTHENTICATED / PERMISSION_DENIED).
    refused: Option<String>,
    /// A sync round or delivery failed since the last heartbeat answered: probe it now.
    suspect: bool,
    last_contact_ms: i64,
    backends: Vec<c::BackendSummary>,
}

/// The hub's in-memory federation state.
pub(crate) struct Federation {
    pub(crate) cfg: FederationConfig,
    peers: Mutex<BTreeMap<String, PeerRuntime>>,
    ledger: Mutex<fed::ReservationLedger>,
    pokes: BTreeMap<String, Arc<Notify>>,
    /// One HTTP client per peer, kept for its connection pool (each call adds a fresh token).
    clients: BTreeMap<String, iris_rpc::Client>,
    /// Per job: the peer's refusals of its offers (backoff and reason, `iris_federation::after_answer`).
    refusals: Mutex<HashMap<String, fed::Refusal>>,
    /// Per peer: wakes its heartbeat loop to probe a suspect peer at once.
    probes: BTreeMap<String, Arc<Notify>>,
    /// Peer side, per requester: the pending reason last sent for each pending task (`None`:
    /// not the requester's task), so a changed reason is sent again (`FederationSync`).
    pub(crate) sent_reasons: Mutex<HashMap<String, HashMap<String, Option<String>>>>,
}

/// Deliveries taken per peer per sync round.
const DELIVERY_BATCH: usize = 512;
/// Deliveries in flight per peer.
const DELIVERY_CONCURRENCY: usize = 32;

impl Federation {
    pub(crate) fn new(cfg: FederationConfig) -> Result<Self> {
        let clients = cfg
            .peers
            .iter()
            .map(|p| {
                iris_rpc::Client::new(&p.address)
                    .map(|c| (p.id.clone(), c))
                    .map_err(|e| Error::invalid(format!("peers.{}.address: {}", p.id, e.message)))
            })
            .collect::<Result<_>>()?;
        let pokes = cfg
            .peers
            .iter()
            .map(|p| (p.id.clone(), Arc::new(Notify::new())))
            .collect();
        let peers = cfg
            .peers
            .iter()
            .map(|p| (p.id.clone(), PeerRuntime::default()))
            .collect();
        let cfg_probes = cfg
            .peers
            .iter()
            .map(|p| (p.id.clone(), Arc::new(Notify::new())))
            .collect();
        Ok(Federation {
            cfg,
            peers: Mutex::new(peers),
            ledger: Mutex::new(fed::ReservationLedger::new()),
            pokes,
            clients,
            refusals: Mutex::new(HashMap::new()),
            probes: cfg_probes,
            sent_reasons: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn enabled(&self) -> bool {
        !self.cfg.peers.is_empty()
    }

    /// A configured peer's base URL.
    pub(crate) fn peer_address(&self, id: &str) -> Option<String> {
        self.cfg
            .peers
            .iter()
            .find(|p| p.id == id)
            .map(|p| p.address.trim_end_matches('/').to_string())
    }

    pub(crate) fn is_peer(&self, id: &str) -> bool {
        self.cfg.peers.iter().any(|p| p.id == id)
    }

    fn peer_reachable(&self, id: &str) -> Option<bool> {
        lock(&self.peers).get(id).map(|p| p.reachable)
    }

    /// The pure crate's view of every configured peer.
    fn views(&self) -> Vec<fed::PeerView> {
        lock(&self.peers)
            .iter()
            .map(|(id, p)| fed::PeerView {
                peer_id: id.clone(),
                reachable: p.reachable,
                backends: p.backends.iter().map(backend_view).collect(),
            })
            .collect()
    }

    /// A call to `peer` failed on the way: mark it suspect and probe it now.
    fn suspect(&self, peer: &str) {
        if let Some(rt) = lock(&self.peers).get_mut(peer) {
            rt.suspect = true;
        }
        if let Some(n) = self.probes.get(peer) {
            n.notify_one();
        }
    }

    /// The peer's last reason for refusing `job_id`, if it refused the last offer.
    fn refusal_reason(&self, job_id: &str) -> Option<String> {
        lock(&self.refusals)
            .get(job_id)
            .filter(|r| r.refusals > 0)
            .map(|r| r.reason.clone())
    }

    fn poke(&self, peer: &str) {
        if let Some(n) = self.pokes.get(peer) {
            n.notify_one();
        }
    }
}

fn backend_view(b: &c::BackendSummary) -> fed::BackendView {
    let advertised = b
        .advertised_attributes
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.values.iter().map(|s| s.trim().to_lowercase()).collect(),
            )
        })
        .collect();
    let availability = b
        .availability
        .as_ref()
        .filter(|a| a.version <= fed::AVAILABILITY_VERSION)
        .map(|a| fed::Availability {
            generation: a.observation_epoch_ms,
            free: a
                .amounts
                .iter()
                .map(|(k, v)| (k.to_lowercase(), *v))
                .collect(),
            held_by_band: a
                .held_by_band
                .iter()
                .filter_map(|h| {
                    Band::from_code(h.band).map(|b| {
                        (
                            b,
                            h.amounts
                                .iter()
                                .map(|(k, v)| (k.to_lowercase(), *v))
                                .collect(),
                        )
                    })
                })
                .collect(),
        });
    fed::BackendView {
        backend_id: b.backend_id.clone(),
        advertised,
        availability,
    }
}

/// The routing-relevant parts of a stored request.
struct Shape {
    constraints: Vec<iris_types::Constraint>,
    gate: BTreeMap<String, i64>,
}

fn shape_of(req: &c::LaunchJobRequest) -> Shape {
    let constraints: Vec<_> = req
        .constraints
        .iter()
        .filter_map(|pc| crate::spec::constraint_from_proto(pc).ok())
        .collect();
    let (dtype, variant, gpu, _) = crate::spec::device_of(req.resources.as_ref());
    let gate = if dtype == "gpu" {
        fed::availability_gate(
            Some(&variant),
            gpu.max(0) as u32,
            req.replicas().max(1) as u32,
        )
    } else {
        BTreeMap::new()
    };
    Shape { constraints, gate }
}

/// What submit-time classification decided for a job.
pub(crate) enum Route {
    Local,
    /// Queue for a peer: the pinned peer or "" for any.
    Queue(String),
}

/// The job a log source names: `/u/j/0:1` or the prefix `/u/j/` → `/u/j/0` or `/u/j`.
pub(crate) fn log_job_key(source: &str) -> &str {
    source
        .split(':')
        .next()
        .unwrap_or(source)
        .trim_end_matches('/')
}
