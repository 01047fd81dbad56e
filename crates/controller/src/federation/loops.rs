//! The per-peer loops: heartbeats (`ListBackends`) and sync rounds (deliver promoted jobs,
//! re-drive cancels, pull `FederationSync` and mirror it).

use super::{CONTROLLER, DELIVERY_BATCH, DELIVERY_CONCURRENCY};
use crate::error::{Error, Result};
use crate::{lock, Controller};
use iris_federation as fed;
use iris_proto::cluster::controller as c;
use iris_proto::job;
use iris_rpc::{Code, RpcError};
use iris_store::federation as sf;
use iris_store::mirror;
use std::sync::Arc;
use std::time::Duration;

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
    let Some(probe) = ctl.fed.probes.get(&peer).cloned() else {
        return;
    };
    loop {
        let (reachable, suspect) = {
            let peers = lock(&ctl.fed.peers);
            peers
                .get(&peer)
                .map_or((false, false), |rt| (rt.reachable, rt.suspect))
        };
        let r = ctl
            .peer_call::<_, c::ListBackendsResponse>(
                &peer,
                CONTROLLER,
                "ListBackends",
                &c::ListBackendsRequest {},
                fed::probe_timeout(reachable, suspect),
            )
            .await;
        let wait = {
            let mut peers = lock(&ctl.fed.peers);
            let rt = peers.entry(peer.clone()).or_default();
            match r {
                Ok(resp) => {
                    if !rt.reachable {
                        tracing::info!(peer = %peer, "federation peer reachable");
                    }
                    rt.reachable = true;
                    rt.suspect = false;
                    rt.refused = None;
                    rt.last_contact_ms = iris_store::now_ms();
                    rt.backends = resp.backends;
                }
                Err(e) => {
                    if rt.reachable {
                        tracing::warn!(peer = %peer, error = %e.message, "federation peer unreachable");
                    }
                    rt.reachable = false;
                    rt.suspect = false;
                    rt.refused = matches!(e.code, Code::Unauthenticated | Code::PermissionDenied)
                        .then(|| e.message.clone());
                }
            }
            fed::heartbeat_wait(rt.reachable, rt.suspect, ctl.fed.cfg.heartbeat_interval)
        };
        // New capacity numbers: let the tick place queued jobs now.
        ctl.wake();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = probe.notified() => {}
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
                tracing::debug!(peer = %peer, error = %e, "federation sync round");
                // A failed round may be a dead peer: have the heartbeat loop confirm it now.
                ctl.fed.suspect(&peer);
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
async fn sync_round(ctl: &Arc<Controller>, peer: &str) -> Result<usize> {
    let client = ctl.peer_client(peer)?;
    let mut delivered = 0;
    loop {
        let batch = {
            let conn = ctl.db();
            sf::deliveries(&*conn, peer, DELIVERY_BATCH)?
        };
        let fetched = batch.len();
        // A job the peer refused is offered again only after its backoff.
        let now = iris_store::now_ms();
        let batch: Vec<sf::Delivery> = {
            let refusals = lock(&ctl.fed.refusals);
            batch
                .into_iter()
                .filter(|d| fed::may_offer(refusals.get(&d.job_id), now))
                .collect()
        };
        if batch.is_empty() {
            break;
        }
        delivered += batch.len();
        deliver(ctl, &client, peer, batch).await;
        if fetched < DELIVERY_BATCH {
            break;
        }
    }
    // Cancels of handed-off roots and of their children, until the mirror shows them ended.
    let (roots, children) = {
        let conn = ctl.db();
        (
            sf::pending_cancels(&*conn, peer)?,
            sf::pending_child_cancels(&*conn, peer)?,
        )
    };
    let mut gone = Vec::new();
    for job_id in roots.into_iter().chain(children) {
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
                gone.push(job_id);
            }
        }
    }
    if !gone.is_empty() {
        let mut conn = ctl.db();
        let tx = conn.begin()?;
        for job_id in &gone {
            mirror::kill_mirrored(
                &tx,
                job_id,
                "Cancelled (peer reported the job gone)",
                iris_store::now_ms(),
            )?;
        }
        tx.commit()?;
    }
    pull(ctl, &client, peer).await?;
    {
        let mut conn = ctl.db();
        let tx = conn.begin()?;
        sf::settle_child_cancels(&tx, peer, &gone)?;
        tx.commit()?;
    }
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
    let results: Vec<(String, std::result::Result<(), RpcError>)> = futures::stream::iter(batch)
        .map(|d| {
            let client = client.clone();
            let me = me.clone();
            let ctl = ctl.clone();
            async move {
                let job_id = d.job_id.clone();
                let r = async {
                    let req = ctl.handoff_request(&me, &d).map_err(|e| e.to_wire())?;
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
    let Ok(tx) = conn.begin() else {
        return;
    };
    let mut suspect = false;
    for (job_id, r) in results {
        let answer = match r {
            Ok(()) => fed::PeerAnswer::Accepted,
            Err(e) => match e.code {
                Code::AlreadyExists | Code::PermissionDenied | Code::InvalidArgument => {
                    fed::PeerAnswer::Verdict(e.message)
                }
                Code::FailedPrecondition | Code::ResourceExhausted => {
                    fed::PeerAnswer::CannotHost(e.message)
                }
                Code::Unauthenticated => fed::PeerAnswer::Unauthenticated(e.message),
                _ => fed::PeerAnswer::Transient(e.message),
            },
        };
        let detail = answer.message().to_string();
        let decision = {
            let refusals = lock(&ctl.fed.refusals);
            fed::after_answer(refusals.get(&job_id), answer, now)
        };
        let outcome = match decision {
            fed::AfterAnswer::HandedOff => {
                lock(&ctl.fed.refusals).remove(&job_id);
                sf::mark_handed_off(&tx, &job_id, now).map(|_| ())
            }
            fed::AfterAnswer::Reject(m) => {
                lock(&ctl.fed.refusals).remove(&job_id);
                tracing::warn!(job = %job_id, peer = %peer, error = %m, "handoff rejected");
                let msg = format!("Peer {peer} rejected the handoff: {m}");
                sf::mark_rejected(&tx, &job_id, &msg, now).map(|_| ())
            }
            fed::AfterAnswer::Wait(rec) => {
                // Not a glitch: the peer said why. Operators see it at info, users as the
                // job's pending reason; the next offer waits for the backoff.
                tracing::info!(
                    job = %job_id, peer = %peer, reason = %rec.reason, refusals = rec.refusals,
                    next_offer_in_ms = rec.next_offer_ms - now, "peer cannot host the job yet"
                );
                lock(&ctl.fed.refusals).insert(job_id.clone(), rec);
                sf::note_error(
                    &tx,
                    &job_id,
                    &format!("peer {peer} cannot run it: {detail}"),
                )
            }
            fed::AfterAnswer::Retry { keep, suspect: s } => {
                suspect |= s;
                match keep {
                    Some(rec) => lock(&ctl.fed.refusals).insert(job_id.clone(), rec),
                    None => lock(&ctl.fed.refusals).remove(&job_id),
                };
                sf::note_error(&tx, &job_id, &format!("delivery to {peer}: {detail}"))
            }
        };
        if let Err(e) = outcome {
            tracing::error!(job = %job_id, error = %e, "recording a handoff outcome");
        }
    }
    if suspect {
        ctl.fed.suspect(peer);
    }
    if let Err(e) = tx.commit() {
        tracing::error!(error = %e, "committing handoff outcomes");
    }
}

impl Controller {
    /// The request a peer receives: the stored, normalised request with the same job id, no
    /// `cluster` constraints, the federation identity, and the bundle inlined as bytes
    /// (workdir files already travel inline in the stored request).
    fn handoff_request(&self, me: &str, d: &sf::Delivery) -> Result<c::LaunchJobRequest> {
        let mut req = crate::stored_request(&*self.db(), &d.job_id, &d.request_blob)?;
        req.name = Some(d.job_id.clone());
        req.constraints.retain(|k| k.key() != fed::CLUSTER_KEY);
        if !req.bundle_id().is_empty() {
            let path = self.cfg.state_dir.join("bundles").join(req.bundle_id());
            req.bundle_blob = Some(std::fs::read(&path).map_err(|e| {
                Error::internal(format!(
                    "reading bundle {} for {}: {e}",
                    req.bundle_id(),
                    d.job_id
                ))
            })?);
            req.bundle_id = None;
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
async fn pull(ctl: &Arc<Controller>, client: &iris_rpc::Client, peer: &str) -> Result<()> {
    let cursor = {
        let conn = ctl.db();
        sf::cursor(&*conn, peer)?
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
    let now = iris_store::now_ms();
    let endpoints = mirrored_endpoints(&resp.endpoints, now);
    let mut conn = ctl.db();
    let tx = conn.begin()?;
    iris_store::endpoints::replace_for_peer(&tx, peer, &endpoints)?;
    if resp.deltas.is_empty() && resp.next_cursor == cursor {
        tx.commit()?;
        return Ok(());
    }
    for d in &resp.deltas {
        if !sf::root_sent_to(&tx, &d.job_id, peer)? {
            tracing::warn!(job = %d.job_id, peer = %peer, "ignoring a delta for a job not handed to this peer");
            continue;
        }
        if d.tombstone {
            mirror::delete_mirrored(&tx, &d.job_id)?;
            continue;
        }
        // The peer reports it, so it accepted it: a handoff whose answer was lost (or has not
        // come back yet) is handed off, whatever state the job has reached there.
        if sf::root_of(&d.job_id) == d.job_id && sf::mark_handed_off(&tx, &d.job_id, now)? {
            lock(&ctl.fed.refusals).remove(&d.job_id);
        }
        if let Some((job, tasks)) = mirror_of(d) {
            mirror::apply_mirror(&tx, peer, &job, &tasks, now)?;
        }
    }
    if resp.cursor_stale {
        redeliver_lost(&tx, peer, &resp.deltas)?;
    }
    sf::set_cursor(&tx, peer, &resp.next_cursor)?;
    tx.commit()?;
    Ok(())
}

/// A full snapshot lists every job the peer holds for us. A live root we handed off that is not
/// in it was lost by the peer (it restarted from a state older than the handoff): it is wound
/// back and delivered again, never left showing a state nobody holds. (The reference drops the
/// handle; the job then shows its last mirrored state for ever.)
pub(super) fn redeliver_lost(
    tx: &iris_store::Tx<'_>,
    peer: &str,
    deltas: &[c::FederationJobDelta],
) -> Result<()> {
    let present: std::collections::HashSet<&str> =
        deltas.iter().map(|d| d.job_id.as_str()).collect();
    for job_id in sf::handed_off_roots(tx, peer)? {
        if present.contains(job_id.as_str()) {
            continue;
        }
        let note = format!(
            "peer {peer} no longer has this job (it restarted from a state older than the handoff); delivering it again"
        );
        if mirror::reset_for_redelivery(tx, &job_id, &note)? && sf::redeliver(tx, &job_id, &note)? {
            tracing::warn!(job = %job_id, peer = %peer, "peer lost a handed-off job; delivering it again");
        }
    }
    Ok(())
}

/// A peer's reported endpoints as the hub keeps them: expiring after the lease the peer says
/// is left (relative, so clock skew does not matter), never later than a fresh lease.
fn mirrored_endpoints(
    reported: &[c::FederationEndpoint],
    now: i64,
) -> Vec<iris_store::endpoints::Endpoint> {
    reported
        .iter()
        .filter_map(|e| {
            let job_id = e.task_id.rsplit_once('/')?.0.to_string();
            let left = e
                .lease_remaining
                .as_ref()
                .map(|d| d.milliseconds)
                .unwrap_or(crate::rpc::endpoints::LEASE_MS)
                .clamp(0, crate::rpc::endpoints::LEASE_MS);
            Some(iris_store::endpoints::Endpoint {
                endpoint_id: e.endpoint_id.clone(),
                name: e.name.clone(),
                address: e.address.clone(),
                task_id: e.task_id.clone(),
                job_id,
                metadata: e.metadata.clone().into_iter().collect(),
                registered_at_ms: now,
                lease_deadline_ms: Some(now + left),
                access: iris_types::endpoint::Access::from_code(e.access).unwrap_or_default(),
                peer_id: None,
            })
        })
        .collect()
}

fn ms(t: &Option<iris_proto::time::Timestamp>) -> Option<i64> {
    t.as_ref().map(|t| t.epoch_ms()).filter(|m| *m > 0)
}

fn mirror_of(d: &c::FederationJobDelta) -> Option<(mirror::MirrorJob, Vec<mirror::MirrorTask>)> {
    let s = d.summary.as_ref()?;
    let job = mirror::MirrorJob {
        job_id: d.job_id.clone(),
        state: s.state.unwrap_or_default(),
        error: s.error.clone().filter(|e| !e.is_empty()),
        exit_code: Some(s.exit_code.unwrap_or_default()),
        started_at_ms: ms(&s.started_at),
        finished_at_ms: ms(&s.finished_at),
        num_tasks: i64::from(s.task_count.unwrap_or_default()),
    };
    let tasks = d
        .changed_tasks
        .iter()
        .filter_map(|t| {
            let index = t.task_id().rsplit('/').next()?.parse().ok()?;
            Some(mirror::MirrorTask {
                task_index: index,
                state: t.state.unwrap_or_default(),
                error: t.error.clone().filter(|e| !e.is_empty()),
                exit_code: Some(t.exit_code.unwrap_or_default()),
                started_at_ms: ms(&t.started_at),
                finished_at_ms: ms(&t.finished_at),
                current_attempt_id: i64::from(t.current_attempt_id.unwrap_or_default()),
                worker_address: t.worker_address.clone().unwrap_or_default(),
                status_message: Some(if t.pending_reason().is_empty() {
                    t.status_message().to_owned()
                } else {
                    t.pending_reason().to_owned()
                })
                .filter(|s| !s.is_empty()),
                attempts: t
                    .attempts
                    .iter()
                    .map(|a| mirror::MirrorAttempt {
                        attempt_id: i64::from(a.attempt_id.unwrap_or_default()),
                        state: a.state.unwrap_or_default(),
                        started_at_ms: ms(&a.started_at),
                        finished_at_ms: ms(&a.finished_at),
                        exit_code: Some(a.exit_code.unwrap_or_default()),
                        error: a.error.clone().filter(|e| !e.is_empty()),
                        attempt_uid: a.attempt_uid.clone().unwrap_or_default(),
                        worker_id: a.worker_id.clone().unwrap_or_default(),
                        terminal_reason: a.terminal_reason.clone().filter(|r| !r.is_empty()),
                    })
                    .collect(),
            })
        })
        .collect();
    Some((job, tasks))
}
