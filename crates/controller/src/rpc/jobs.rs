//! Job RPCs: status, state, cancel, complete, list.

use crate::error::{Error, Result};
use crate::{lock, views, Controller};
use iris_proto::cluster::controller as c;
use iris_proto::job;
use iris_store::apply;
use iris_types::JobState;

use super::now;

impl Controller {
    pub(crate) async fn get_job_status(
        &self,
        req: c::GetJobStatusRequest,
    ) -> Result<c::GetJobStatusResponse> {
        let conn = self.db();
        let reasons = lock(&self.pending_reasons);
        let mut job = views::job(&*conn, &req.job_id, &reasons)?
            .ok_or_else(|| Error::not_found(format!("job {} not found", req.job_id)))?;
        self.decorate_federated(&*conn, &mut job)?;
        let request = self
            .spec(&*conn, &req.job_id)?
            .map(|s| views::wire_request(s.request.clone()));
        Ok(c::GetJobStatusResponse {
            job: Some(job),
            request,
        })
    }

    pub(crate) async fn get_job_state(
        &self,
        req: c::GetJobStateRequest,
    ) -> Result<c::GetJobStateResponse> {
        let conn = self.db();
        let mut states = std::collections::BTreeMap::new();
        for id in req.job_ids {
            if let Some(s) = iris_store::jobs::job_state_of(&*conn, &id)? {
                states.insert(id, s.code());
            }
        }
        Ok(c::GetJobStateResponse { states })
    }

    pub(crate) async fn terminate_job(&self, req: c::TerminateJobRequest) -> Result<job::Empty> {
        let caller = crate::auth::caller();
        if caller.role == iris_auth::Role::FederationPeer {
            self.check_received_from(&req.job_id, &caller.user_id)?;
        } else {
            crate::auth::check_owner(&caller, &req.job_id, "cancel")?;
        }
        if self.cancel_federated(&req.job_id).await? {
            return Ok(job::Empty {});
        }
        let mut conn = self.db();
        let tx = conn.begin()?;
        let found = apply::kill_subtree(
            &tx,
            &req.job_id,
            "Terminated by user",
            "Parent job terminated",
            now(),
        )?;
        if !found {
            return Err(Error::not_found(format!("job {} not found", req.job_id)));
        }
        tx.commit()?;
        drop(conn);
        self.poke_all();
        self.wake();
        Ok(job::Empty {})
    }

    pub(crate) async fn complete_job(&self, req: c::CompleteJobRequest) -> Result<job::Empty> {
        crate::auth::check_owner(&crate::auth::caller(), &req.job_id, "complete")?;
        {
            let conn = self.db();
            if let Some(h) = iris_store::federation::root_handle(&*conn, &req.job_id)? {
                if h.direction == iris_store::federation::SENT {
                    return Err(Error::precondition(format!(
                        "job {} runs on federation peer {}; complete it there (or cancel it here)",
                        req.job_id,
                        if h.peer_id.is_empty() {
                            "(not yet chosen)"
                        } else {
                            &h.peer_id
                        }
                    )));
                }
            }
        }
        let mut conn = self.db();
        let tx = conn.begin()?;
        if !apply::complete_job(&tx, &req.job_id, now())? {
            return Err(Error::not_found(format!("job {} not found", req.job_id)));
        }
        tx.commit()?;
        drop(conn);
        self.poke_all();
        self.wake();
        Ok(job::Empty {})
    }

    pub(crate) async fn list_jobs(&self, req: c::ListJobsRequest) -> Result<c::ListJobsResponse> {
        let q = req.query.unwrap_or_default();
        if q.offset < 0 || q.offset > 5000 {
            return Err(Error::invalid("query.offset must be between 0 and 5000"));
        }
        let state = if q.state_filter.is_empty() {
            None
        } else {
            Some(JobState::from_friendly(&q.state_filter).ok_or_else(|| {
                Error::invalid(format!(
                    "query.state_filter: unknown state '{}'; use pending, running, succeeded, failed, killed, worker_failed or unschedulable",
                    q.state_filter
                ))
            })?)
        };
        let limit = if q.limit <= 0 || q.limit > 500 {
            500
        } else {
            q.limit
        };
        let conn = self.db();
        let reasons = lock(&self.pending_reasons);
        let filter = iris_store::views::JobFilter {
            state,
            id_prefix: q.job_id_prefix.clone(),
            name_contains: q.name_filter.clone(),
            parent_job_id: q.parent_job_id.clone(),
            // Ascending only when explicitly asked (SortDirection ASC = 1).
            ascending: q.sort_direction == 1,
            limit: limit as u32,
            offset: q.offset as u32,
        };
        let mut resp = views::list_jobs(&*conn, &filter, &reasons)?;
        for j in &mut resp.jobs {
            self.decorate_federated(&*conn, j)?;
        }
        Ok(resp)
    }
}
