//! Peer side: may a requester hand us a job (reference §1.6), which jobs a requester may act
//! on, and the `FederationSync` answer built from the change log.

use crate::error::{Error, Result};
use crate::{lock, views, Controller};
use iris_federation as fed;
use iris_proto::cluster::controller as c;
use iris_rpc::Code;
use iris_store::federation as sf;
use iris_types::TaskState;

impl Controller {
    /// Peer side: may this caller hand us this job? (reference §1.6 "Peer side").
    pub(crate) fn check_handoff(
        &self,
        name: &iris_types::JobName,
        f: &c::FederationHandoff,
    ) -> Result<()> {
        if !name.is_root() {
            return Err(Error::invalid(format!(
                "federation: job {name} is not a root job; only whole root jobs are handed off"
            )));
        }
        if f.requester_id.trim().is_empty() {
            return Err(Error::invalid(
                "federation.requester_id: the handing-off cluster's name is required",
            ));
        }
        let Some(auth) = &self.cfg.auth else {
            return Ok(());
        };
        let caller = crate::auth::caller();
        let denied = |m: String| Err(Error::new(Code::PermissionDenied, m));
        if f.submitting_user.is_empty() || f.submitting_user == fed::LOCAL_ADMIN {
            return denied(format!(
                "federation: job {name} was submitted by the anonymous admin ('{}') of {}; only verified users' jobs may be handed off",
                f.submitting_user, f.requester_id
            ));
        }
        match caller.role {
            iris_auth::Role::FederationPeer => {
                if caller.user_id != f.requester_id {
                    return denied(format!(
                        "federation.requester_id '{}' does not match the caller's token issuer '{}'",
                        f.requester_id, caller.user_id
                    ));
                }
                if !fed::submitter_admitted(&auth.allowed_submitters, &f.submitting_user) {
                    return denied(format!(
                        "submitter '{}' is not in this cluster's auth.allowed_submitters",
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
    pub(crate) fn check_received_from(&self, job_id: &str, requester: &str) -> Result<()> {
        let conn = self.db();
        let h = sf::root_handle(&*conn, job_id)?;
        match h {
            Some(h) if h.direction == sf::RECEIVED && h.peer_id == requester => Ok(()),
            _ => Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "{job_id}: permission denied: peer {requester} did not hand this job to us"
                ),
            )),
        }
    }

    /// Peer side of `FederationSync` (reference §1.7).
    pub(crate) async fn federation_sync(
        &self,
        req: c::FederationSyncRequest,
    ) -> Result<c::FederationSyncResponse> {
        let caller = crate::auth::caller();
        if caller.role == iris_auth::Role::FederationPeer && caller.user_id != req.requester_id {
            return Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "FederationSync: requester_id '{}' does not match the caller's token issuer '{}'",
                    req.requester_id, caller.user_id
                ),
            ));
        }
        let conn = self.db();
        let ch = sf::changes_since(&*conn, &req.requester_id, &req.cursor)?;
        let reasons = lock(&self.pending_reasons).clone();
        let mut deltas = Vec::with_capacity(ch.jobs.len());
        for (job_id, what) in ch.jobs {
            let summary = match what {
                None => None,
                Some(_) => views::job(&*conn, &job_id, &reasons)?,
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
            for t in views::tasks_of_job(&*conn, &job_id, &reasons)? {
                let idx: i64 = t
                    .task_id
                    .clone()
                    .unwrap_or_default()
                    .rsplit('/')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(-1);
                if indexes.as_ref().map(|v| v.contains(&idx)).unwrap_or(true) {
                    if let Some(full) = views::task(&*conn, t.task_id(), &reasons)? {
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
        self.resend_changed_reasons(&*conn, &req.requester_id, &reasons, &mut deltas)?;
        // The requester's whole endpoint set every time (not only changes): it replaces its
        // mirror of them, so a lapsed lease or an ended attempt disappears there within a sync.
        let now = crate::rpc::now();
        let endpoints = iris_store::endpoints::for_requester(&*conn, &req.requester_id, now)?
            .into_iter()
            .map(|e| c::FederationEndpoint {
                lease_remaining: e.lease_deadline_ms.map(|d| iris_proto::time::Duration {
                    milliseconds: (d - now).max(0),
                }),
                endpoint_id: e.endpoint_id,
                name: e.name,
                address: e.address,
                task_id: e.task_id,
                access: e.access.code(),
                metadata: e.metadata.into_iter().collect(),
            })
            .collect();
        // Our users' spend here, as the reference reports it to every requester. Budgets are
        // not shared between federated clusters yet (`budget_parent` is named as unused at
        // start), so this cluster names no budget parent and a hub counts none of it.
        let budget_usage = Some(c::FederationBudgetUsage {
            budget_parent: Some(String::new()),
            spend: iris_store::budgets::spend_by_user(&*conn)?,
        });
        Ok(c::FederationSyncResponse {
            deltas,
            next_cursor: ch.max_seq.to_string(),
            cursor_stale: ch.stale,
            endpoints,
            budget_usage,
        })
    }
}

impl Controller {
    /// A pending task's reason changes without a state change (so without a change-log row):
    /// tasks of jobs `requester` handed us whose current reason differs from the one last sent
    /// to it are added to `deltas`, so the hub can show the peer's own words.
    fn resend_changed_reasons(
        &self,
        conn: &impl iris_store::Read,
        requester: &str,
        reasons: &views::PendingReasons,
        deltas: &mut Vec<c::FederationJobDelta>,
    ) -> Result<()> {
        // Tasks the per-job cap held back carry their job's reason: those of this requester's
        // jobs are listed, so the hub sees that reason too.
        let mut held_back: Vec<(String, &String)> = Vec::new();
        for (job_id, reason) in &reasons.capped_jobs {
            let ours = sf::root_handle(conn, job_id)?
                .is_some_and(|h| h.direction == sf::RECEIVED && h.peer_id == requester);
            if !ours {
                continue;
            }
            for t in iris_store::views::tasks_of_job(conn, job_id)? {
                if t.state == TaskState::Pending.code() && !reasons.by_task.contains_key(&t.task_id)
                {
                    held_back.push((t.task_id, reason));
                }
            }
        }
        let mut all = lock(&self.fed.sent_reasons);
        let memo = all.entry(requester.to_string()).or_default();
        memo.retain(|task, _| reasons.get(task).is_some());
        // What this round already sends counts as sent.
        for d in deltas.iter() {
            for t in &d.changed_tasks {
                if reasons.get(t.task_id()).is_some() {
                    memo.insert(
                        t.task_id.clone().unwrap_or_default(),
                        Some(t.pending_reason.clone().unwrap_or_default()),
                    );
                }
            }
        }
        let mut changed: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let every = reasons
            .by_task
            .iter()
            .chain(held_back.iter().map(|(t, r)| (t, *r)));
        for (task, reason) in every {
            match memo.get(task) {
                // Not one of this requester's tasks (decided once per task).
                Some(None) => continue,
                Some(Some(sent)) if sent == reason => continue,
                _ => {}
            }
            let Some((job_id, _)) = task.rsplit_once('/') else {
                continue;
            };
            let ours = sf::root_handle(conn, job_id)?
                .is_some_and(|h| h.direction == sf::RECEIVED && h.peer_id == requester);
            if !ours {
                memo.insert(task.clone(), None);
                continue;
            }
            memo.insert(task.clone(), Some(reason.clone()));
            changed
                .entry(job_id.to_string())
                .or_default()
                .push(task.clone());
        }
        drop(all);
        for (job_id, tasks) in changed {
            let mut full = Vec::with_capacity(tasks.len());
            for t in &tasks {
                if let Some(v) = views::task(conn, t, reasons)? {
                    full.push(v);
                }
            }
            match deltas
                .iter_mut()
                .find(|d| d.job_id == job_id && !d.tombstone)
            {
                Some(d) => {
                    d.changed_tasks
                        .retain(|t| !tasks.iter().any(|id| id == t.task_id()));
                    d.changed_tasks.extend(full);
                }
                None => {
                    let Some(summary) = views::job(conn, &job_id, reasons)? else {
                        continue;
                    };
                    deltas.push(c::FederationJobDelta {
                        job_id,
                        summary: Some(summary),
                        changed_tasks: full,
                        tombstone: false,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "peer_tests.rs"]
mod tests;
