//! Hub side: where a submitted job goes, the tick's placement pass, cancels of handed-off jobs,
//! logs read through the peer, and `ListPeers`.

use super::{log_job_key, shape_of, PeerRuntime, Route, CONTROLLER, LOGS};
use crate::error::{Error, Result};
use crate::{lock, Controller};
use iris_federation as fed;
use iris_proto::cluster::controller as c;
use iris_proto::finelog::logging as fl;
use iris_proto::job;
use iris_rpc::{Code, RpcError};
use iris_store::federation as sf;
use iris_types::Band;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

impl Controller {
    /// Submit-time classification (reference §1.1). `local` is the local feasibility verdict.
    /// Strips a `cluster` pin naming this cluster itself.
    pub(crate) fn classify_submit(
        &self,
        name: &iris_types::JobName,
        req: &mut c::LaunchJobRequest,
        local: Result<()>,
        submitting_user: &str,
    ) -> Result<Route> {
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
                    req.constraints.retain(|k| k.key() != fed::CLUSTER_KEY);
                    return Ok(Route::Local);
                }
                let known: Vec<&str> = self.fed.cfg.peers.iter().map(|p| p.id.as_str()).collect();
                return Err(Error::invalid(format!(
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
                    let to = match &pinned_peer {
                        Some(p) => vec![p.clone()],
                        None => fed::candidate_peers(&constraints, &self.fed.views()),
                    };
                    let (peers, pin) = match to.first() {
                        Some(first) => (to.join(", "), first.as_str()),
                        None => ("?".to_string(), "<peer>"),
                    };
                    return Err(Error::invalid(format!(
                        "job {name} would run on federation peer {peers}, but only whole root jobs federate; submit it as its own job: iris job run --target-cluster {pin} -- <command>"
                    )));
                }
                if self.cfg.auth.as_ref().map(|a| a.enforcing).unwrap_or(false)
                    && submitting_user == fed::LOCAL_ADMIN
                {
                    return Err(Error::new(
                        Code::PermissionDenied,
                        format!("job {name} would run on a federation peer, which needs a verified user identity; the anonymous loopback/CIDR admin cannot federate: log in with a token (iris login --token T, or MARIN_CLUSTER_TOKEN)"),
                    ));
                }
                Ok(Route::Queue(pinned_peer.unwrap_or_default()))
            }
            fed::Disposition::Reject => {
                let why = match local {
                    Err(e) => {
                        let m = e.to_string();
                        m.split_once(": ").map(|(_, w)| w.to_string()).unwrap_or(m)
                    }
                    Ok(()) => "no local backend or peer can host it".into(),
                };
                let shown: Vec<String> = constraints.iter().map(|k| k.to_string()).collect();
                Err(Error::precondition(format!(
                    "Job {name} is unschedulable: {why}; no reachable federation peer advertises a backend for it (constraints: [{}])",
                    shown.join(", ")
                )))
            }
        }
    }

    /// JobStatus decoration for a federated job: `peer_status` and the §1.10 pending reason.
    pub(crate) fn decorate_federated(
        &self,
        conn: &impl iris_store::Read,
        j: &mut job::JobStatus,
    ) -> Result<()> {
        if j.cluster() == "local" {
            return Ok(());
        }
        let Some(h) = sf::root_handle(conn, j.job_id())? else {
            return Ok(());
        };
        if h.direction != sf::SENT {
            return Ok(());
        }
        let mirrored = sf::tasks_mirrored(conn, j.job_id())?;
        let state = match h.handoff_state {
            sf::QUEUED => fed::HandoffState::Queued,
            sf::PENDING => fed::HandoffState::Pending,
            sf::REJECTED => fed::HandoffState::Rejected,
            _ => fed::HandoffState::HandedOff,
        };
        j.peer_status = Some(match state {
            fed::HandoffState::Rejected => job::PeerStatus::Rejected,
            _ if mirrored => job::PeerStatus::Synced,
            fed::HandoffState::Queued | fed::HandoffState::Pending => {
                job::PeerStatus::PendingScheduling
            }
            fed::HandoffState::HandedOff => job::PeerStatus::Assigned,
        } as i32);
        if j.state == Some(iris_types::JobState::Pending.code()) {
            // The peer's own word: why it refused the last offer, or its pending reason for a
            // job it accepted.
            let says = match state {
                fed::HandoffState::Pending => self.fed.refusal_reason(j.job_id()),
                fed::HandoffState::HandedOff if mirrored => {
                    sf::mirrored_pending_reason(conn, j.job_id())?
                }
                _ => None,
            };
            j.pending_reason = Some(fed::pending_reason(
                state,
                &h.peer_id,
                self.fed.peer_reachable(&h.peer_id),
                mirrored,
                says.as_deref(),
            ));
        }
        Ok(())
    }

    /// Hub cancel of a federated job. `Ok(false)`: not federated, cancel locally.
    pub(crate) async fn cancel_federated(&self, job_id: &str) -> Result<bool> {
        let now = iris_store::now_ms();
        let target = {
            let mut conn = self.db();
            let tx = conn.begin()?;
            let Some(root) = sf::root_handle(&tx, job_id)? else {
                return Ok(false);
            };
            if root.direction != sf::SENT {
                return Ok(false);
            }
            if root.job_id != job_id {
                // A child of a federated root lives on the peer: record the intent (the sync
                // loop re-drives it until the mirror shows the child ended), then forward it.
                sf::record_child_cancel(&tx, job_id, &root.peer_id, now)?;
                tx.commit()?;
                Some(root.peer_id.clone())
            } else {
                let before = sf::cancel_sent(&tx, job_id, now)?
                    .ok_or_else(|| Error::not_found(format!("job {job_id} not found")))?;
                tx.commit()?;
                (before.handoff_state == sf::PENDING || before.handoff_state == sf::HANDED_OFF)
                    .then(|| before.peer_id.clone())
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
            Err(e) if e.code == Code::NotFound => {
                let mut conn = self.db();
                let tx = conn.begin()?;
                iris_store::mirror::kill_mirrored(
                    &tx,
                    job_id,
                    "Cancelled (peer reported the job gone)",
                    now,
                )?;
                tx.commit()?;
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
        let h = sf::root_handle(&*conn, key).ok().flatten()?;
        (h.direction == sf::SENT && !h.peer_id.is_empty() && h.handoff_state == sf::HANDED_OFF)
            .then_some(h.peer_id)
    }

    /// Forwards a log read to the peer running the job.
    pub(crate) async fn fetch_logs_from_peer(
        &self,
        peer: &str,
        req: &fl::FetchLogsRequest,
    ) -> Result<fl::FetchLogsResponse> {
        self.peer_call(peer, LOGS, "FetchLogs", req, Duration::from_secs(30))
            .await
            .map_err(|e| {
                // A Python peer's `/proxy` refuses a federation bearer for its log server: it
                // gives logs to a hub only by finelog forwarding.
                let hint = if e.code == Code::PermissionDenied {
                    " (this peer does not serve logs to the hub; have its finelog forward to the hub's log server)"
                } else {
                    ""
                };
                Error::new(
                    e.code,
                    format!("reading logs from peer {peer}: {}{hint}", e.message),
                )
            })
    }

    pub(crate) async fn peer_call<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        peer: &str,
        service: &str,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> std::result::Result<Resp, RpcError> {
        let client = self.peer_client(peer)?;
        client.call(service, method, req, timeout).await
    }

    pub(crate) fn peer_client(
        &self,
        peer: &str,
    ) -> std::result::Result<iris_rpc::Client, RpcError> {
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

    pub(crate) async fn list_peers(
        &self,
        _req: c::ListPeersRequest,
    ) -> Result<c::ListPeersResponse> {
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
                active_federated_jobs: sf::active_count(&*conn, &id)? as i32,
                aggregate_spend_micros: 0,
                backends,
            });
        }
        Ok(c::ListPeersResponse { peers })
    }
}

/// The tick's federation pass (reference §1.4): expire queued jobs past their deadline, place
/// the rest with the pure pass, and apply each promotion through the CAS.
pub(crate) fn tick_pass(ctl: &Controller) -> Result<()> {
    let f = &ctl.fed;
    if !f.enabled() {
        return Ok(());
    }
    let now = iris_store::now_ms();
    expire_refused(ctl, now)?;
    let (queued, spend, limits) = {
        let conn = ctl.db();
        let q = sf::queued(&*conn)?;
        if q.is_empty() {
            return Ok(());
        }
        let spend = iris_store::budgets::spend_by_user(&*conn)?;
        let limits = crate::accounts::limits(&*conn)?;
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
            ctl.cfg.budget_defaults.limit,
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
        let tx = conn.begin()?;
        // Expiry first, so a promotion of the same job loses the CAS.
        for j in &expired {
            sf::expire_queued(&tx, j, now)?;
        }
        for p in promotions.iter().chain(forced.iter()) {
            if sf::promote(&tx, &p.job_id, &p.peer_id, &p.backend_id, p.generation, now)? {
                confirmed.push(p.clone());
            }
        }
        tx.commit()?;
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

/// Jobs a peer kept refusing end UNSCHEDULABLE with its reason once their scheduling deadline
/// passes (`iris_federation::refusal_expired`); records of jobs no longer PENDING are dropped.
fn expire_refused(ctl: &Controller, now: i64) -> Result<()> {
    let f = &ctl.fed;
    let records: Vec<(String, fed::Refusal)> = lock(&f.refusals)
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if records.is_empty() {
        return Ok(());
    }
    let mut done = Vec::new();
    {
        let mut conn = ctl.db();
        let tx = conn.begin()?;
        for (job_id, rec) in &records {
            let Some(deadline) = sf::pending_deadline(&tx, job_id)? else {
                done.push(job_id.clone());
                continue;
            };
            let peer = sf::handle(&tx, job_id)?
                .map(|h| h.peer_id)
                .unwrap_or_default();
            if let Some(msg) = fed::refusal_expired(Some(rec), &peer, deadline, now) {
                sf::expire_refused(&tx, job_id, &msg, now)?;
                done.push(job_id.clone());
            }
        }
        tx.commit()?;
    }
    let mut map = lock(&f.refusals);
    for j in done {
        map.remove(&j);
    }
    Ok(())
}

#[cfg(test)]
#[path = "hub_tests.rs"]
mod tests;
