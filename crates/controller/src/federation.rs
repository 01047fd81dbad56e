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

use crate::{internal, lock, views, Controller};
use iris_federation as fed;
use iris_proto::cluster::controller as c;
use iris_proto::finelog::logging as fl;
use iris_proto::job;
use iris_rpc::{Code, RpcError};
use iris_store::federation as sf;
use iris_types::Band;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

const CONTROLLER: &str = "iris.cluster.ControllerService";
const LOGS: &str = "finelog.logging.LogService";

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
    /// Consecutive UNAUTHENTICATED delivery answers per job.
    auth_failures: Mutex<HashMap<String, u32>>,
}

/// Deliveries taken per peer per sync round.
const DELIVERY_BATCH: usize = 512;
/// Deliveries in flight per peer.
const DELIVERY_CONCURRENCY: usize = 32;
/// A delivery refused this many times in a row as UNAUTHENTICATED is a verdict, not a glitch.
const AUTH_FAILURE_VERDICT: u32 = 3;

impl Federation {
    pub(crate) fn new(cfg: FederationConfig) -> Result<Self, RpcError> {
        let clients = cfg
            .peers
            .iter()
            .map(|p| Ok((p.id.clone(), iris_rpc::Client::new(&p.address)?)))
            .collect::<Result<_, RpcError>>()?;
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
        Ok(Federation {
            cfg,
            peers: Mutex::new(peers),
            ledger: Mutex::new(fed::ReservationLedger::new()),
            pokes,
            clients,
            auth_failures: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn enabled(&self) -> bool {
        !self.cfg.peers.is_empty()
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
            req.replicas.max(1) as u32,
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

impl Controller {
    /// Submit-time classification (reference §1.1). `local` is the local feasibility verdict.
    /// Strips a `cluster` pin naming this cluster itself.
    pub(crate) fn classify_submit(
        &self,
        name: &iris_types::JobName,
        req: &mut c::LaunchJobRequest,
        local: Result<(), RpcError>,
        submitting_user: &str,
    ) -> Result<Route, RpcError> {
        if req.federation.is_some() {
            return local.map(|()| Route::Local);
        }
        let constraints: Vec<_> = req
            .constraints
            .iter()
            .filter_map(|pc| crate::spec::constraint_from_proto(pc).ok())
            .collect();
        let pin = fed::cluster_pin(&constraints);
        if let Some(p) = &pin {
            if !self.fed.is_peer(p) {
                let me = &self.fed.cfg.cluster_name;
                if !me.is_empty() && p == me {
                    req.constraints.retain(|k| k.key != fed::CLUSTER_KEY);
                    return Ok(Route::Local);
                }
                let known: Vec<&str> = self.fed.cfg.peers.iter().map(|p| p.id.as_str()).collect();
                return Err(RpcError::invalid(format!(
                    "constraints: job {name} pins cluster '{p}', which is not a configured federation peer (configured: {})",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                )));
            }
        }
        if !self.fed.enabled() {
            return local.map(|()| Route::Local);
        }
        let disposition = fed::classify(&constraints, local.is_ok(), &self.fed.views());
        match disposition {
            fed::Disposition::Local => Ok(Route::Local),
            fed::Disposition::Queue { pinned_peer } => {
                if !name.is_root() {
                    return Err(RpcError::invalid(format!(
                        "job {name} would run on a federation peer, but only whole root jobs federate; submit it as its own job: iris job run --target-cluster <peer> -- <command>"
                    )));
                }
                if self.cfg.auth.as_ref().map(|a| a.enforcing).unwrap_or(false)
                    && submitting_user == "local_admin"
                {
                    return Err(RpcError::new(
                        Code::PermissionDenied,
                        format!("job {name} would run on a federation peer, which needs a verified user identity; the anonymous loopback/CIDR admin cannot federate: log in with a token (iris login --token T, or MARIN_CLUSTER_TOKEN)"),
                    ));
                }
                Ok(Route::Queue(pinned_peer.unwrap_or_default()))
            }
            fed::Disposition::Reject => {
                let why = match local {
                    Err(e) => e
                        .message
                        .split_once(": ")
                        .map(|(_, w)| w.to_string())
                        .unwrap_or(e.message),
                    Ok(()) => "no local backend or peer can host it".into(),
                };
                let shown: Vec<String> = constraints
                    .iter()
                    .map(|k| {
                        format!(
                            "{} {:?} {:?}",
                            k.key,
                            k.op,
                            k.value
                                .as_ref()
                                .map(|v| format!("{v:?}"))
                                .unwrap_or_default()
                        )
                    })
                    .collect();
                Err(RpcError::precondition(format!(
                    "Job {name} is unschedulable: {why}; no reachable federation peer advertises a backend for it (constraints: [{}])",
                    shown.join(", ")
                )))
            }
        }
    }

    /// Peer side: may this caller hand us this job? (reference §1.6 "Peer side").
    pub(crate) fn check_handoff(
        &self,
        name: &iris_types::JobName,
        f: &c::FederationHandoff,
    ) -> Result<(), RpcError> {
        if !name.is_root() {
            return Err(RpcError::invalid(format!(
                "federation: job {name} is not a root job; only whole root jobs are handed off"
            )));
        }
        if f.requester_id.trim().is_empty() {
            return Err(RpcError::invalid(
                "federation.requester_id: the handing-off cluster's name is required",
            ));
        }
        let Some(auth) = &self.cfg.auth else {
            return Ok(());
        };
        let caller = crate::auth::caller();
        let denied = |m: String| Err(RpcError::new(Code::PermissionDenied, m));
        if f.submitting_user.is_empty() || f.submitting_user == "local_admin" {
            return denied(format!(
                "federation: job {name} was submitted by the anonymous admin ({:?}) of {}; only verified users' jobs may be handed off",
                f.submitting_user, f.requester_id
            ));
        }
        match caller.role {
            iris_auth::Role::FederationPeer => {
                if caller.user_id != f.requester_id {
                    return denied(format!(
                        "federation.requester_id {:?} does not match the caller's token issuer {:?}",
                        f.requester_id, caller.user_id
                    ));
                }
                if !fed::submitter_admitted(&auth.allowed_submitters, &f.submitting_user) {
                    return denied(format!(
                        "submitter {:?} is not in this cluster's auth.allowed_submitters",
                        f.submitting_user
                    ));
                }
                Ok(())
            }
            iris_auth::Role::Admin => Ok(()),
            _ => denied(format!(
                "federation: the handoff field may only be set by a trusted peer (you are {} with role {})",
                caller.user_id,
                caller.role.name()
            )),
        }
    }

    /// A federation-peer caller may only touch jobs it handed to us.
    pub(crate) fn check_received_from(
        &self,
        job_id: &str,
        requester: &str,
    ) -> Result<(), RpcError> {
        let conn = self.db();
        let h = sf::root_handle(&conn, job_id).map_err(internal)?;
        match h {
            Some(h) if h.direction == sf::RECEIVED && h.peer_id == requester => Ok(()),
            _ => Err(RpcError::new(
                Code::PermissionDenied,
                format!(
                    "{job_id}: permission denied: peer {requester} did not hand this job to us"
                ),
            )),
        }
    }

    /// JobStatus decoration for a federated job: `peer_status` and the §1.10 pending reason.
    pub(crate) fn decorate_federated(
        &self,
        conn: &iris_store::rusqlite::Connection,
        j: &mut job::JobStatus,
    ) -> Result<(), RpcError> {
        if j.cluster == "local" {
            return Ok(());
        }
        let Some(h) = sf::root_handle(conn, &j.job_id).map_err(internal)? else {
            return Ok(());
        };
        if h.direction != sf::SENT {
            return Ok(());
        }
        let mirrored = sf::tasks_mirrored(conn, &j.job_id).map_err(internal)?;
        let state = match h.handoff_state {
            sf::QUEUED => fed::HandoffState::Queued,
            sf::PENDING => fed::HandoffState::Pending,
            sf::REJECTED => fed::HandoffState::Rejected,
            _ => fed::HandoffState::HandedOff,
        };
        j.peer_status = match state {
            fed::HandoffState::Rejected => job::PeerStatus::Rejected,
            _ if mirrored => job::PeerStatus::Synced,
            fed::HandoffState::Queued | fed::HandoffState::Pending => {
                job::PeerStatus::PendingScheduling
            }
            fed::HandoffState::HandedOff => job::PeerStatus::Assigned,
        } as i32;
        if j.state == iris_types::JobState::Pending.code() {
            j.pending_reason = fed::pending_reason(
                state,
                &h.peer_id,
                self.fed.peer_reachable(&h.peer_id),
                mirrored,
            );
        }
        Ok(())
    }

    /// Hub cancel of a federated job. `Ok(false)`: not federated, cancel locally.
    pub(crate) async fn cancel_federated(&self, job_id: &str) -> Result<bool, RpcError> {
        let now = iris_store::now_ms();
        let (target, root) = {
            let mut conn = self.db();
            let tx = conn.transaction().map_err(internal)?;
            let Some(root) = sf::root_handle(&tx, job_id).map_err(internal)? else {
                return Ok(false);
            };
            if root.direction != sf::SENT {
                return Ok(false);
            }
            if root.job_id != job_id {
                // A child of a federated root lives on the peer: forward the cancel.
                (Some(root.peer_id.clone()), root)
            } else {
                let before = sf::cancel_sent(&tx, job_id, now)
                    .map_err(internal)?
                    .ok_or_else(|| RpcError::not_found(format!("job {job_id} not found")))?;
                tx.commit().map_err(internal)?;
                let target = (before.handoff_state == sf::PENDING
                    || before.handoff_state == sf::HANDED_OFF)
                    .then(|| before.peer_id.clone());
                (target, before)
            }
        };
        let Some(peer) = target.filter(|p| !p.is_empty()) else {
            return Ok(true);
        };
        // Best effort now; the sync loop re-drives it until the mirror shows the job ended.
        match self
            .peer_call::<_, job::Empty>(
                &peer,
                CONTROLLER,
                "TerminateJob",
                &c::TerminateJobRequest {
                    job_id: job_id.to_string(),
                },
                Duration::from_secs(30),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == Code::NotFound && root.job_id == job_id => {
                let conn = self.db();
                sf::kill_mirrored(&conn, job_id, "Cancelled (peer reported the job gone)", now)
                    .map_err(internal)?;
            }
            Err(e) => {
                tracing::warn!(job = %job_id, peer = %peer, error = %e.message, "cancel not delivered yet; will retry");
            }
        }
        self.fed.poke(&peer);
        Ok(true)
    }

    /// Hub: the peer that runs `source`'s job, if it was handed off.
    pub(crate) fn log_peer(&self, source: &str) -> Option<String> {
        if !self.fed.enabled() {
            return None;
        }
        let key = log_job_key(source);
        if key.is_empty() {
            return None;
        }
        let conn = self.db();
        let h = sf::root_handle(&conn, key).ok().flatten()?;
        (h.direction == sf::SENT && !h.peer_id.is_empty() && h.handoff_state == sf::HANDED_OFF)
            .then_some(h.peer_id)
    }

    /// Forwards a log read to the peer running the job.
    pub(crate) async fn fetch_logs_from_peer(
        &self,
        peer: &str,
        req: &fl::FetchLogsRequest,
    ) -> Result<fl::FetchLogsResponse, RpcError> {
        self.peer_call(peer, LOGS, "FetchLogs", req, Duration::from_secs(30))
            .await
            .map_err(|e| {
                RpcError::new(
                    e.code,
                    format!("reading logs from peer {peer}: {}", e.message),
                )
            })
    }

    async fn peer_call<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        peer: &str,
        service: &str,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, RpcError> {
        let client = self.peer_client(peer)?;
        client.call(service, method, req, timeout).await
    }

    fn peer_client(&self, peer: &str) -> Result<iris_rpc::Client, RpcError> {
        let client = self.fed.clients.get(peer).ok_or_else(|| {
            RpcError::new(Code::Unavailable, format!("peer {peer} is not configured"))
        })?;
        let token = self
            .cfg
            .auth
            .as_ref()
            .and_then(crate::auth::federation_token);
        // A clone shares the pool; the token is minted fresh for this call.
        Ok(client.clone().with_token(token))
    }

    // ---- RPCs ----

    pub(crate) async fn list_peers(
        &self,
        _req: c::ListPeersRequest,
    ) -> Result<c::ListPeersResponse, RpcError> {
        let snapshot: Vec<(String, PeerRuntime)> = lock(&self.fed.peers)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let conn = self.db();
        let mut peers = Vec::new();
        for (id, rt) in snapshot {
            let address = self
                .fed
                .cfg
                .peers
                .iter()
                .find(|p| p.id == id)
                .map(|p| p.address.clone())
                .unwrap_or_default();
            let mut backends = rt.backends.clone();
            if !rt.reachable {
                for b in &mut backends {
                    b.availability = None;
                }
            }
            peers.push(c::PeerSummary {
                peer_id: id.clone(),
                controller_address: address,
                reachable: rt.reachable,
                last_contact_ms: rt.last_contact_ms,
                active_federated_jobs: sf::active_count(&conn, &id).map_err(internal)? as i32,
                aggregate_spend_micros: 0,
                backends,
            });
        }
        Ok(c::ListPeersResponse { peers })
    }

    pub(crate) async fn list_backends(
        &self,
        _req: c::ListBackendsRequest,
    ) -> Result<c::ListBackendsResponse, RpcError> {
        let mut backends = Vec::new();
        {
            let conn = self.db();
            let fleet = self.worker_backend(&conn)?;
            // A fleet with no daemons next to an in-process backend is not a backend.
            if fleet.worker_count > 0 || self.backend_list().is_empty() {
                backends.push(fleet);
            }
        }
        for b in self.backend_list() {
            backends.push(crate::backend::summary(&*b).await?);
        }
        Ok(c::ListBackendsResponse {
            backends,
            unroutable_job_count: 0,
            unroutable_sample: Vec::new(),
        })
    }

    /// The worker fleet as a backend: advertised attributes (union over healthy workers) and GPU
    /// availability per variant. Unlike the reference's worker backend, `held_by_band` is
    /// reported (GPUs held by running attempts, by band), so a hub can see what a higher band
    /// could reclaim here by preemption.
    fn worker_backend(
        &self,
        conn: &iris_store::rusqlite::Connection,
    ) -> Result<c::BackendSummary, RpcError> {
        let workers = crate::tick::load_workers(conn).map_err(internal)?;
        let mut advertised: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut total: BTreeMap<String, i64> = BTreeMap::new();
        let mut healthy = 0;
        let mut variant_of: HashMap<String, String> = HashMap::new();
        let inproc: BTreeSet<String> = self.backend_list().iter().map(|b| b.worker_id()).collect();
        let workers: Vec<_> = workers
            .into_iter()
            .filter(|w| !inproc.contains(&w.id))
            .collect();
        for w in &workers {
            if !w.healthy {
                continue;
            }
            healthy += 1;
            for (k, v) in &w.attributes {
                let s = match v {
                    iris_types::AttrValue::Str(s) => s.trim().to_lowercase(),
                    iris_types::AttrValue::Int(i) => i.to_string(),
                    iris_types::AttrValue::Float(f) => f.to_string(),
                };
                advertised.entry(k.clone()).or_default().insert(s);
            }
            if w.total.gpu > 0 && !w.device_variant.is_empty() {
                let v = w.device_variant.to_lowercase();
                *total.entry(v.clone()).or_default() += w.total.gpu;
                advertised
                    .entry(format!("availability:{v}"))
                    .or_default()
                    .insert("true".into());
                variant_of.insert(w.id.clone(), v);
            }
        }
        let mut held: BTreeMap<i32, BTreeMap<String, i64>> = BTreeMap::new();
        let mut committed: BTreeMap<String, i64> = BTreeMap::new();
        let mut running = 0;
        {
            let mut st = conn
                .prepare_cached(
                    "SELECT a.worker_id, t.job_id, t.priority_band FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id
                     WHERE a.finished_at_ms IS NULL AND a.worker_id IS NOT NULL",
                )
                .map_err(internal)?;
            let rows: Vec<(String, String, i32)> = st
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .map_err(internal)?
                .collect::<Result<_, _>>()
                .map_err(internal)?;
            for (worker, job_id, band) in rows {
                running += 1;
                let Some(v) = variant_of.get(&worker) else {
                    continue;
                };
                let Some(spec) = self.spec(conn, &job_id)? else {
                    continue;
                };
                let gpus = spec.resources.gpu;
                if gpus <= 0 {
                    continue;
                }
                *committed.entry(v.clone()).or_default() += gpus;
                *held.entry(band).or_default().entry(v.clone()).or_default() += gpus;
            }
        }
        let pending: i64 = conn
            .prepare_cached("SELECT count(*) FROM tasks WHERE state = 1 AND cluster = 'local'")
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(internal)?;
        let amounts = total
            .iter()
            .map(|(v, t)| {
                (
                    v.clone(),
                    (t - committed.get(v).copied().unwrap_or(0)).max(0),
                )
            })
            .collect();
        let mut held_by_band: Vec<c::BandCapacity> = held
            .into_iter()
            .filter(|(b, _)| Band::from_code(*b).is_some())
            .map(|(band, amounts)| c::BandCapacity { band, amounts })
            .collect();
        held_by_band.sort_by_key(|h| Band::from_code(h.band).map(|b| b.rank()).unwrap_or(9));
        Ok(c::BackendSummary {
            backend_id: "workers".into(),
            name: "workers".into(),
            kind: "worker".into(),
            capabilities: Vec::new(),
            advertised_attributes: advertised
                .into_iter()
                .map(|(k, v)| {
                    (
                        k,
                        iris_proto::cluster::StringList {
                            values: v.into_iter().collect(),
                        },
                    )
                })
                .collect(),
            scale_groups: self.cfg.groups.iter().map(|g| g.name.clone()).collect(),
            worker_count: healthy,
            pending_task_count: pending as i32,
            running_task_count: running,
            has_autoscaler: false,
            capacity_health: Default::default(),
            detail: Some(c::BackendStatus {
                detail: Some(c::backend_status::Detail::Worker(c::WorkerFleetDetail {
                    autoscaler: None,
                    healthy_worker_count: healthy,
                    total_worker_count: workers.len() as i32,
                })),
            }),
            availability: Some(c::ResourceAvailability {
                version: fed::AVAILABILITY_VERSION,
                observation_epoch_ms: iris_store::now_ms(),
                amounts,
                total_amounts: total,
                held_by_band,
            }),
        })
    }

    /// `GetKubernetesClusterStatus`: the Kubernetes backend's cluster view.
    pub(crate) async fn get_kubernetes_cluster_status(
        &self,
        req: c::GetKubernetesClusterStatusRequest,
    ) -> Result<c::GetKubernetesClusterStatusResponse, RpcError> {
        for b in self.backend_list() {
            if !req.backend_id.is_empty() && b.worker_id() != req.backend_id {
                continue;
            }
            let s = crate::backend::summary(&*b).await?;
            if let Some(c::backend_status::Detail::Kubernetes(k)) = s.detail.and_then(|d| d.detail)
            {
                return Ok(k);
            }
        }
        Err(RpcError::new(
            Code::FailedPrecondition,
            "this controller has no Kubernetes backend (kubernetes_provider is not configured)",
        ))
    }

    /// Peer side of `FederationSync` (reference §1.7).
    pub(crate) async fn federation_sync(
        &self,
        req: c::FederationSyncRequest,
    ) -> Result<c::FederationSyncResponse, RpcError> {
        let caller = crate::auth::caller();
        if caller.role == iris_auth::Role::FederationPeer && caller.user_id != req.requester_id {
            return Err(RpcError::new(
                Code::PermissionDenied,
                format!(
                    "FederationSync: requester_id {:?} does not match the caller's token issuer {:?}",
                    req.requester_id, caller.user_id
                ),
            ));
        }
        let conn = self.db();
        let ch = sf::changes_since(&conn, &req.requester_id, &req.cursor).map_err(internal)?;
        let reasons = lock(&self.pending_reasons).clone();
        let mut deltas = Vec::with_capacity(ch.jobs.len());
        for (job_id, what) in ch.jobs {
            let summary = match what {
                None => None,
                Some(_) => views::job_status(&conn, &job_id, &reasons)?,
            };
            let Some(summary) = summary else {
                deltas.push(c::FederationJobDelta {
                    job_id,
                    summary: None,
                    changed_tasks: Vec::new(),
                    tombstone: true,
                });
                continue;
            };
            let indexes: Option<Vec<i64>> = what.flatten();
            let mut changed_tasks = Vec::new();
            for t in views::tasks_of_job(&conn, &job_id, &reasons)? {
                let idx: i64 = t
                    .task_id
                    .rsplit('/')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(-1);
                if indexes.as_ref().map(|v| v.contains(&idx)).unwrap_or(true) {
                    if let Some(full) = views::task_status(&conn, &t.task_id, true, &reasons)? {
                        changed_tasks.push(full);
                    }
                }
            }
            deltas.push(c::FederationJobDelta {
                job_id,
                summary: Some(summary),
                changed_tasks,
                tombstone: false,
            });
        }
        Ok(c::FederationSyncResponse {
            deltas,
            next_cursor: ch.max_seq.to_string(),
            cursor_stale: ch.stale,
            endpoints: Vec::new(),
            budget_usage: None,
        })
    }
}

/// The job a log source names: `/u/j/0:1` or the prefix `/u/j/` → `/u/j/0` or `/u/j`.
pub(crate) fn log_job_key(source: &str) -> &str {
    source
        .split(':')
        .next()
        .unwrap_or(source)
        .trim_end_matches('/')
}

fn ms(t: &Option<iris_proto::time::Timestamp>) -> Option<i64> {
    t.as_ref().map(|t| t.epoch_ms).filter(|m| *m > 0)
}

fn mirror_of(d: &c::FederationJobDelta) -> Option<(sf::MirrorJob, Vec<sf::MirrorTask>)> {
    let s = d.summary.as_ref()?;
    let job = sf::MirrorJob {
        job_id: d.job_id.clone(),
        state: s.state,
        error: (!s.error.is_empty()).then(|| s.error.clone()),
        exit_code: Some(s.exit_code),
        started_at_ms: ms(&s.started_at),
        finished_at_ms: ms(&s.finished_at),
        num_tasks: s.task_count as i64,
    };
    let tasks = d
        .changed_tasks
        .iter()
        .filter_map(|t| {
            let index = t.task_id.rsplit('/').next()?.parse().ok()?;
            Some(sf::MirrorTask {
                task_index: index,
                state: t.state,
                error: (!t.error.is_empty()).then(|| t.error.clone()),
                exit_code: Some(t.exit_code),
                started_at_ms: ms(&t.started_at),
                finished_at_ms: ms(&t.finished_at),
                current_attempt_id: t.current_attempt_id as i64,
                worker_address: t.worker_address.clone(),
                status_message: Some(if t.pending_reason.is_empty() {
                    t.status_message.clone()
                } else {
                    t.pending_reason.clone()
                })
                .filter(|s| !s.is_empty()),
                attempts: t
                    .attempts
                    .iter()
                    .map(|a| sf::MirrorAttempt {
                        attempt_id: a.attempt_id as i64,
                        state: a.state,
                        started_at_ms: ms(&a.started_at),
                        finished_at_ms: ms(&a.finished_at),
                        exit_code: Some(a.exit_code),
                        error: (!a.error.is_empty()).then(|| a.error.clone()),
                        attempt_uid: a.attempt_uid.clone(),
                        worker_id: a.worker_id.clone(),
                        terminal_reason: (!a.terminal_reason.is_empty())
                            .then(|| a.terminal_reason.clone()),
                    })
                    .collect(),
            })
        })
        .collect();
    Some((job, tasks))
}

/// The tick's federation pass (reference §1.4): expire queued jobs past their deadline, place
/// the rest with the pure pass, and apply each promotion through the CAS.
pub(crate) fn tick_pass(ctl: &Controller) -> Result<(), RpcError> {
    let f = &ctl.fed;
    if !f.enabled() {
        return Ok(());
    }
    let now = iris_store::now_ms();
    let (queued, spend, limits) = {
        let conn = ctl.db();
        let q = sf::queued(&conn).map_err(internal)?;
        if q.is_empty() {
            return Ok(());
        }
        let spend = views::spend_by_user(&conn)?;
        let limits = crate::accounts::limits(&conn)?;
        (q, spend, limits)
    };
    let refused: BTreeSet<String> = lock(&f.peers)
        .iter()
        .filter(|(_, p)| p.refused.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    let mut expired = Vec::new();
    let mut candidates = Vec::new();
    let mut forced = Vec::new();
    for q in queued {
        if q.deadline_ms.map(|d| d < now).unwrap_or(false) {
            expired.push(q.job_id);
            continue;
        }
        let Ok(req) = <c::LaunchJobRequest as prost::Message>::decode(q.request_blob.as_slice())
        else {
            tracing::error!(job = %q.job_id, "stored request is corrupt; not placing it");
            continue;
        };
        let shape = shape_of(&req);
        let band = crate::accounts::effective_band_of(
            Band::from_code(q.band).unwrap_or(Band::Interactive),
            &q.user_id,
            &spend,
            &limits,
        );
        let pinned = (!q.pinned_peer.is_empty()).then(|| q.pinned_peer.clone());
        if let Some(p) = pinned.as_ref().filter(|p| refused.contains(*p)) {
            // The peer answers but refuses our identity: deliver anyway so the job ends with the
            // peer's own verdict instead of waiting forever.
            forced.push(fed::Promotion {
                job_id: q.job_id.clone(),
                peer_id: p.clone(),
                backend_id: String::new(),
                generation: 0,
                reserved: BTreeMap::new(),
            });
            continue;
        }
        candidates.push(fed::Candidate {
            job_id: q.job_id,
            band,
            submitted_at_ms: q.submitted_at_ms,
            shape: fed::routing_constraints(&shape.constraints),
            pinned_peer: pinned,
            gate: shape.gate,
        });
    }
    let promotions = {
        let mut ledger = lock(&f.ledger);
        let ids: Vec<String> = f.cfg.peers.iter().map(|p| p.id.clone()).collect();
        ledger.retain_peers(&ids);
        fed::assign_queued(
            &candidates,
            &f.views(),
            &ledger,
            f.cfg.max_handoffs_per_cycle,
        )
    };
    if expired.is_empty() && promotions.is_empty() && forced.is_empty() {
        return Ok(());
    }
    let mut confirmed = Vec::new();
    {
        let mut conn = ctl.db();
        let tx = conn.transaction().map_err(internal)?;
        // Expiry first, so a promotion of the same job loses the CAS.
        for j in &expired {
            sf::expire_queued(&tx, j, now).map_err(internal)?;
        }
        for p in promotions.iter().chain(forced.iter()) {
            if sf::promote(&tx, &p.job_id, &p.peer_id, &p.backend_id, p.generation, now)
                .map_err(internal)?
            {
                confirmed.push(p.clone());
            }
        }
        tx.commit().map_err(internal)?;
    }
    let mut ledger = lock(&f.ledger);
    let mut peers = BTreeSet::new();
    let mut per_peer: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &confirmed {
        ledger.commit(p);
        peers.insert(p.peer_id.clone());
        *per_peer.entry(p.peer_id.as_str()).or_default() += 1;
    }
    drop(ledger);
    for p in &peers {
        f.poke(p);
    }
    // A pass that stopped at the per-peer cap with jobs still queued runs again at once rather
    // than waiting for the next submit or heartbeat to wake the tick.
    let capped = per_peer
        .values()
        .any(|n| *n >= f.cfg.max_handoffs_per_cycle);
    if capped && confirmed.len() < candidates.len() + forced.len() {
        ctl.wake();
    }
    Ok(())
}

/// Starts the heartbeat and sync loops for every configured peer.
pub(crate) fn start(ctl: &Arc<Controller>, shutdown: tokio::sync::watch::Receiver<bool>) {
    for p in &ctl.fed.cfg.peers {
        tokio::spawn(heartbeat_loop(ctl.clone(), p.id.clone(), shutdown.clone()));
        tokio::spawn(sync_loop(ctl.clone(), p.id.clone(), shutdown.clone()));
    }
}

async fn heartbeat_loop(
    ctl: Arc<Controller>,
    peer: String,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let r = ctl
            .peer_call::<_, c::ListBackendsResponse>(
                &peer,
                CONTROLLER,
                "ListBackends",
                &c::ListBackendsRequest {},
                Duration::from_secs(10),
            )
            .await;
        {
            let mut peers = lock(&ctl.fed.peers);
            let rt = peers.entry(peer.clone()).or_default();
            match r {
                Ok(resp) => {
                    if !rt.reachable {
                        tracing::info!(peer = %peer, "federation peer reachable");
                    }
                    rt.reachable = true;
                    rt.refused = None;
                    rt.last_contact_ms = iris_store::now_ms();
                    rt.backends = resp.backends;
                }
                Err(e) => {
                    if rt.reachable {
                        tracing::warn!(peer = %peer, error = %e.message, "federation peer unreachable");
                    }
                    rt.reachable = false;
                    rt.refused = matches!(e.code, Code::Unauthenticated | Code::PermissionDenied)
                        .then(|| e.message.clone());
                }
            }
        }
        // New capacity numbers: let the tick place queued jobs now.
        ctl.wake();
        tokio::select! {
            _ = tokio::time::sleep(ctl.fed.cfg.heartbeat_interval) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
    }
}

async fn sync_loop(
    ctl: Arc<Controller>,
    peer: String,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let Some(poke) = ctl.fed.pokes.get(&peer).cloned() else {
        return;
    };
    loop {
        let wait = match sync_round(&ctl, &peer).await {
            // Just delivered: the peer starts those jobs within moments, so look again soon
            // instead of leaving the hub's view a whole interval behind.
            Ok(delivered) if delivered > 0 => ctl.fed.cfg.sync_interval.min(QUICK_PULL),
            Ok(_) => ctl.fed.cfg.sync_interval,
            Err(e) => {
                tracing::debug!(peer = %peer, error = %e.message, "federation sync round");
                ctl.fed.cfg.sync_interval
            }
        };
        tokio::select! {
            _ = poke.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
    }
}

/// The pull after a round that delivered jobs comes this soon.
const QUICK_PULL: Duration = Duration::from_millis(200);

/// One round for one peer: deliver promoted jobs, re-drive cancels, then pull state. Returns how
/// many jobs it delivered.
async fn sync_round(ctl: &Arc<Controller>, peer: &str) -> Result<usize, RpcError> {
    let client = ctl.peer_client(peer)?;
    let mut delivered = 0;
    loop {
        let batch = {
            let conn = ctl.db();
            sf::deliveries(&conn, peer, DELIVERY_BATCH).map_err(internal)?
        };
        if batch.is_empty() {
            break;
        }
        let n = batch.len();
        delivered += n;
        deliver(ctl, &client, peer, batch).await;
        if n < DELIVERY_BATCH {
            break;
        }
    }
    let cancels = {
        let conn = ctl.db();
        sf::pending_cancels(&conn, peer).map_err(internal)?
    };
    for job_id in cancels {
        let r = client
            .call::<_, job::Empty>(
                CONTROLLER,
                "TerminateJob",
                &c::TerminateJobRequest {
                    job_id: job_id.clone(),
                },
                Duration::from_secs(30),
            )
            .await;
        if let Err(e) = r {
            if e.code == Code::NotFound {
                let conn = ctl.db();
                sf::kill_mirrored(
                    &conn,
                    &job_id,
                    "Cancelled (peer reported the job gone)",
                    iris_store::now_ms(),
                )
                .map_err(internal)?;
            }
        }
    }
    pull(ctl, &client, peer).await?;
    Ok(delivered)
}

async fn deliver(
    ctl: &Arc<Controller>,
    client: &iris_rpc::Client,
    peer: &str,
    batch: Vec<sf::Delivery>,
) {
    use futures::StreamExt;
    let me = ctl.fed.cfg.cluster_name.clone();
    let results: Vec<(String, Result<(), RpcError>)> = futures::stream::iter(batch)
        .map(|d| {
            let client = client.clone();
            let me = me.clone();
            let ctl = ctl.clone();
            async move {
                let job_id = d.job_id.clone();
                let r = async {
                    let req = ctl.handoff_request(&me, &d)?;
                    client
                        .call::<_, c::LaunchJobResponse>(
                            CONTROLLER,
                            "LaunchJob",
                            &req,
                            Duration::from_secs(180),
                        )
                        .await
                        .map(|_| ())
                }
                .await;
                (job_id, r)
            }
        })
        .buffer_unordered(DELIVERY_CONCURRENCY)
        .collect()
        .await;
    let now = iris_store::now_ms();
    let mut conn = ctl.db();
    let Ok(tx) = conn.transaction() else {
        return;
    };
    for (job_id, r) in results {
        let outcome = match r {
            Ok(()) => {
                lock(&ctl.fed.auth_failures).remove(&job_id);
                sf::mark_handed_off(&tx, &job_id, now).map(|_| ())
            }
            Err(e) => {
                let verdict = match e.code {
                    Code::AlreadyExists | Code::PermissionDenied | Code::InvalidArgument => true,
                    Code::Unauthenticated => {
                        let mut fails = lock(&ctl.fed.auth_failures);
                        let n = fails.entry(job_id.clone()).or_default();
                        *n += 1;
                        if *n >= AUTH_FAILURE_VERDICT {
                            fails.remove(&job_id);
                            true
                        } else {
                            false
                        }
                    }
                    _ => false,
                };
                let msg = format!("Peer {peer} rejected the handoff: {}", e.message);
                if verdict {
                    tracing::warn!(job = %job_id, peer = %peer, error = %e.message, "handoff rejected");
                    sf::mark_rejected(&tx, &job_id, &msg, now).map(|_| ())
                } else {
                    sf::note_error(&tx, &job_id, &format!("delivery to {peer}: {}", e.message))
                }
            }
        };
        if let Err(e) = outcome {
            tracing::error!(job = %job_id, error = %e, "recording a handoff outcome");
        }
    }
    if let Err(e) = tx.commit() {
        tracing::error!(error = %e, "committing handoff outcomes");
    }
}

impl Controller {
    /// The request a peer receives: the stored, normalised request with the same job id, no
    /// `cluster` constraints, the federation identity, and the bundle inlined as bytes
    /// (workdir files already travel inline in the stored request).
    fn handoff_request(&self, me: &str, d: &sf::Delivery) -> Result<c::LaunchJobRequest, RpcError> {
        let mut req = <c::LaunchJobRequest as prost::Message>::decode(d.request_blob.as_slice())
            .map_err(|e| {
                RpcError::internal(format!("stored request for {} is corrupt: {e}", d.job_id))
            })?;
        req.name = d.job_id.clone();
        req.constraints.retain(|k| k.key != fed::CLUSTER_KEY);
        if !req.bundle_id.is_empty() {
            let path = self.cfg.state_dir.join("bundles").join(&req.bundle_id);
            req.bundle_blob = std::fs::read(&path).map_err(|e| {
                RpcError::internal(format!(
                    "reading bundle {} for {}: {e}",
                    req.bundle_id, d.job_id
                ))
            })?;
            req.bundle_id.clear();
        }
        req.federation = Some(c::FederationHandoff {
            requester_id: me.to_string(),
            owner_principal: d.owner.clone(),
            submitting_user: d.submitting_user.clone(),
            handoff_nonce: d.nonce.clone(),
        });
        Ok(req)
    }
}

/// Pulls `FederationSync` from a peer and mirrors it in one transaction.
async fn pull(
    ctl: &Arc<Controller>,
    client: &iris_rpc::Client,
    peer: &str,
) -> Result<(), RpcError> {
    let cursor = {
        let conn = ctl.db();
        sf::cursor(&conn, peer).map_err(internal)?
    };
    let resp: c::FederationSyncResponse = client
        .call(
            CONTROLLER,
            "FederationSync",
            &c::FederationSyncRequest {
                requester_id: ctl.fed.cfg.cluster_name.clone(),
                cursor: cursor.clone(),
                budget_policy: None,
            },
            Duration::from_secs(60),
        )
        .await?;
    if resp.deltas.is_empty() && resp.next_cursor == cursor {
        return Ok(());
    }
    let now = iris_store::now_ms();
    let mut conn = ctl.db();
    let tx = conn.transaction().map_err(internal)?;
    for d in &resp.deltas {
        if !sf::root_sent_to(&tx, &d.job_id, peer).map_err(internal)? {
            tracing::warn!(job = %d.job_id, peer = %peer, "ignoring a delta for a job not handed to this peer");
            continue;
        }
        if d.tombstone {
            sf::delete_mirrored(&tx, &d.job_id).map_err(internal)?;
            continue;
        }
        if let Some((job, tasks)) = mirror_of(d) {
            sf::apply_mirror(&tx, peer, &job, &tasks, now).map_err(internal)?;
        }
    }
    sf::set_cursor(&tx, peer, &resp.next_cursor).map_err(internal)?;
    tx.commit().map_err(internal)?;
    Ok(())
}
