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
        let reader = self.reader();
        let conn = reader.begin_read()?;
        let reasons = lock(&self.pending_reasons);
        let mut job = views::job(&conn, &req.job_id, &reasons)?
            .ok_or_else(|| Error::not_found(format!("job {} not found", req.job_id)))?;
        self.decorate_federated(&conn, &mut job)?;
        let request = self
            .spec(&conn, &req.job_id)?
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
        let reader = self.reader();
        let conn = reader.begin_read()?;
        let mut states = std::collections::BTreeMap::new();
        for id in req.job_ids {
            if let Some(s) = iris_store::jobs::job_state_of(&conn, &id)? {
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
            return Err(Error::invalid(
                "query.offset must be between 0 and 5000; page deeper with query.page_token",
            ));
        }
        let after = match q.page_token.as_deref() {
            None | Some("") => None,
            Some(t) => Some(crate::views::parse_page_token(t).ok_or_else(|| {
                Error::invalid(format!(
                    "query.page_token: '{t}' is not a page token this controller issued; start again without one"
                ))
            })?),
        };
        if q.page_token.is_some() && q.offset != 0 {
            return Err(Error::invalid(
                "query.offset and query.page_token: use one; a page token already says where the page starts",
            ));
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
        let reader = self.reader();
        let conn = reader.begin_read()?;
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
            after,
        };
        let mut resp = views::list_jobs(&conn, &filter, &reasons, q.page_token.is_some())?;
        for j in &mut resp.jobs {
            self.decorate_federated(&conn, j)?;
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::{controller, insert_job_at, request};
    use iris_proto::cluster::controller as c;

    fn query(offset: i32, token: Option<&str>) -> c::ListJobsRequest {
        c::ListJobsRequest {
            query: Some(c::JobQuery {
                offset,
                limit: 500,
                page_token: token.map(str::to_string),
                ..Default::default()
            }),
        }
    }

    #[tokio::test]
    async fn list_jobs_pages_by_token_past_the_offset_limit_and_refuses_bad_tokens() {
        let ctl = controller();
        let n = 5_120;
        for i in 0..n {
            let name = format!("/u/job-{i:05}");
            insert_job_at(&ctl, &request(&name, 1, 100), 1_000 + i64::from(i), None);
        }
        let e = ctl
            .list_jobs(query(5_001, None))
            .await
            .expect_err("deep offset");
        assert!(e.to_string().contains("query.page_token"), "{e}");

        // Newest first, every job once, however deep.
        let mut ids: Vec<String> = Vec::new();
        let mut token = Some(String::new());
        while let Some(t) = token {
            let r = ctl.list_jobs(query(0, Some(&t))).await.expect("page");
            assert_eq!(r.total_count, Some(n));
            assert_eq!(r.total_count_is_lower_bound, None, "under the cap");
            assert_eq!(r.has_more(), r.next_page_token.is_some());
            ids.extend(r.jobs.into_iter().filter_map(|j| j.job_id));
            token = r.next_page_token;
        }
        let expected: Vec<String> = (0..n).rev().map(|i| format!("/u/job-{i:05}")).collect();
        assert_eq!(ids, expected);

        // Without page_token the answer carries no token (the reference's shape).
        let plain = ctl.list_jobs(query(0, None)).await.expect("plain");
        assert!(plain.has_more() && plain.next_page_token.is_none());

        let e = ctl
            .list_jobs(query(0, Some("yesterday")))
            .await
            .expect_err("made-up token");
        assert!(
            e.to_string().contains("query.page_token: 'yesterday'"),
            "{e}"
        );
        let e = ctl
            .list_jobs(query(10, Some("")))
            .await
            .expect_err("offset and token");
        assert!(e.to_string().contains("use one"), "{e}");
    }
}
