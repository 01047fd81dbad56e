//! `iris.inspect.InspectService`: Iris's own typed reads for the dashboard and the CLI (task
//! events, job counts by state, attempt timelines, open resource holds, federation handoffs,
//! the last checkpoint), so neither composes SQL
//! against the controller's tables nor needs the admin-only `ExecuteRawQuery`.
//!
//! Access: the role rule in `auth::authorize` lets users, tasks, the dashboard role and admins
//! call these methods. Task events are further limited to the job's owner (`auth::check_owner`),
//! admins and the dashboard role; the rest is what `ListJobs`, `ListTasks` and `ListWorkers`
//! already show every caller that may call them.

use crate::error::{Error, Result};
use crate::Controller;
use iris_auth::Role;
use iris_proto::inspect as pb;
use iris_proto::job;
use iris_store::inspect as store;
use iris_types::{JobName, TaskId};

/// Events returned when the request names no limit, and the most it may name.
const DEFAULT_EVENTS: i32 = 1000;
const MAX_EVENTS: i32 = 10_000;
/// Attempts returned when the request names no limit, and the most it may name.
const DEFAULT_ATTEMPTS: i32 = 5000;
const MAX_ATTEMPTS: i32 = 20_000;

/// `0` → `default`; negative → INVALID_ARGUMENT naming `field`; above `max` → `max`.
fn limit(field: &str, n: i32, default: i32, max: i32) -> Result<usize> {
    match n {
        0 => Ok(default as usize),
        n if n < 0 => Err(Error::invalid(format!(
            "{field}: {n} is negative; use 0 for the default ({default}) or a count up to {max}"
        ))),
        n => Ok(n.min(max) as usize),
    }
}

fn task_not_found(task_id: &str) -> Error {
    let job = task_id.rsplit_once('/').map(|x| x.0).unwrap_or(task_id);
    Error::not_found(format!(
        "task {task_id} not found; `iris task list {job}` shows the job's tasks"
    ))
}

fn job_not_found(job_id: &str) -> Error {
    Error::not_found(format!(
        "job {job_id} not found; `iris job list` shows the jobs there are"
    ))
}

impl Controller {
    pub(crate) async fn list_task_events(
        &self,
        req: pb::ListTaskEventsRequest,
    ) -> Result<pb::ListTaskEventsResponse> {
        let task =
            TaskId::parse(&req.task_id).map_err(|e| Error::invalid(format!("task_id: {e}")))?;
        let attempt = match req.attempt_id {
            None | Some(-1) => None,
            Some(n) if n >= 0 => Some(i64::from(n)),
            Some(n) => {
                return Err(Error::invalid(format!(
                    "attempt_id: {n} is not an attempt number; use 0, 1, … or -1 (or leave it unset) for every attempt"
                )))
            }
        };
        let limit = limit("limit", req.limit, DEFAULT_EVENTS, MAX_EVENTS)?;
        let caller = crate::auth::caller();
        // The dashboard role reads every job's pages, events included; anyone else must own the
        // job (or be an admin). Checked before the lookup, so a refusal does not reveal whether
        // the task exists.
        if caller.role != Role::Dashboard {
            crate::auth::check_owner(&caller, task.job.as_str(), "read task events of job")?;
        }
        let conn = self.db();
        if !store::task_exists(&*conn, &req.task_id)? {
            return Err(task_not_found(&req.task_id));
        }
        if let Some(n) = attempt {
            if !store::attempt_exists(&*conn, &req.task_id, n)? {
                return Err(Error::not_found(format!(
                    "attempt {}:{n} not found (see `iris task describe {}` for its attempts)",
                    req.task_id, req.task_id
                )));
            }
        }
        let found = store::task_events(&*conn, &req.task_id, attempt, limit)?;
        Ok(pb::ListTaskEventsResponse {
            events: found
                .events
                .into_iter()
                .map(|e| pb::TaskEvent {
                    ts_ms: e.ts_ms,
                    attempt_id: e.attempt_id.map(|a| a as i32),
                    attempt_uid: e.attempt_uid.unwrap_or_default(),
                    r#type: e.kind,
                    reason: e.reason,
                    message: e.message,
                    source: e.source,
                })
                .collect(),
            omitted: i32::try_from(found.omitted).unwrap_or(i32::MAX),
        })
    }

    pub(crate) async fn count_jobs(
        &self,
        req: pb::CountJobsRequest,
    ) -> Result<pb::CountJobsResponse> {
        // The same filter as ListJobs: names are stored lower-case.
        let name = req.name_filter.to_lowercase();
        let conn = self.db();
        let counts = store::job_counts(&*conn, &req.job_id_prefix, &name)?;
        Ok(pb::CountJobsResponse {
            counts: counts
                .into_iter()
                .map(|(state, count)| pb::JobStateCount {
                    state: state.code(),
                    count,
                })
                .collect(),
        })
    }

    pub(crate) async fn list_attempts(
        &self,
        req: pb::ListAttemptsRequest,
    ) -> Result<pb::ListAttemptsResponse> {
        let limit = limit("limit", req.limit, DEFAULT_ATTEMPTS, MAX_ATTEMPTS)?;
        let conn = self.db();
        let of = match (
            req.job_id.is_empty(),
            req.task_id.is_empty(),
            req.job_id_prefix.is_empty(),
        ) {
            (false, true, true) => {
                JobName::parse(&req.job_id).map_err(|e| Error::invalid(format!("job_id: {e}")))?;
                let state = iris_store::jobs::job_state_of(&*conn, &req.job_id)?;
                if state.is_none() {
                    return Err(job_not_found(&req.job_id));
                }
                store::AttemptsOf::Job(&req.job_id)
            }
            (true, false, true) => {
                TaskId::parse(&req.task_id).map_err(|e| Error::invalid(format!("task_id: {e}")))?;
                if !store::task_exists(&*conn, &req.task_id)? {
                    return Err(task_not_found(&req.task_id));
                }
                store::AttemptsOf::Task(&req.task_id)
            }
            (true, true, false) => store::AttemptsOf::JobPrefix(&req.job_id_prefix),
            _ => {
                return Err(Error::invalid(
                    "job_id, task_id, job_id_prefix: set exactly one of them (`/` lists every job's attempts)",
                ))
            }
        };
        let (rows, truncated) = store::attempts(&*conn, of, limit)?;
        Ok(pb::ListAttemptsResponse {
            attempts: rows
                .into_iter()
                .map(|a| pb::AttemptSummary {
                    task_id: a.task_id,
                    attempt_id: a.attempt_id as i32,
                    attempt_uid: a.attempt_uid,
                    worker_id: a.worker_id,
                    state: a.state.code(),
                    created_at_ms: a.created_at_ms,
                    started_at_ms: a.started_at_ms,
                    finished_at_ms: a.finished_at_ms,
                    exit_code: a.exit_code.map(|c| c as i32),
                    error: a.error.unwrap_or_default(),
                })
                .collect(),
            truncated,
        })
    }

    pub(crate) async fn list_handoffs(
        &self,
        req: pb::ListHandoffsRequest,
    ) -> Result<pb::ListHandoffsResponse> {
        use iris_store::federation as fed;
        let rows = fed::handles(&*self.db(), &req.job_id_prefix)?;
        Ok(pb::ListHandoffsResponse {
            handoffs: rows
                .into_iter()
                .map(|h| pb::Handoff {
                    direction: match h.direction {
                        fed::RECEIVED => pb::HandoffDirection::Received,
                        _ => pb::HandoffDirection::Sent,
                    } as i32,
                    state: match h.handoff_state {
                        fed::HANDED_OFF => pb::HandoffState::HandedOff,
                        fed::REJECTED => pb::HandoffState::Rejected,
                        fed::QUEUED => pb::HandoffState::Queued,
                        _ => pb::HandoffState::Pending,
                    } as i32,
                    job_id: h.job_id,
                    peer_id: h.peer_id,
                    owner_principal: h.owner_principal,
                    generation: h.generation,
                    backend_id: h.backend_id,
                    last_error: h.last_error.unwrap_or_default(),
                    handed_off_at_ms: h.handed_off_at_ms,
                })
                .collect(),
        })
    }

    pub(crate) async fn get_checkpoint_status(
        &self,
        _req: pb::GetCheckpointStatusRequest,
    ) -> Result<pb::GetCheckpointStatusResponse> {
        let err = self.checkpoint_error();
        let (restored, notes) = self.startup_report();
        Ok(pb::GetCheckpointStatusResponse {
            restored_checkpoint_epoch_ms: restored,
            startup_notes: notes,
            last_checkpoint_epoch_ms: iris_store::meta_get(
                &*self.db(),
                iris_store::checkpoint::META_KEY,
            )?,
            last_error_epoch_ms: err.as_ref().map(|e| e.0),
            last_error: err.map(|e| e.1).unwrap_or_default(),
            remote_state_dir: self.remote_location(),
        })
    }

    pub(crate) async fn list_resource_holds(
        &self,
        _req: pb::ListResourceHoldsRequest,
    ) -> Result<pb::ListResourceHoldsResponse> {
        let holds = store::open_holds(&*self.db())?;
        Ok(pb::ListResourceHoldsResponse {
            holds: holds
                .into_iter()
                .map(|h| pb::ResourceHold {
                    // The controller wrote the device as proto JSON at submit (`launch_job`);
                    // a row it cannot read back counts as CPU only rather than failing the list.
                    device: h
                        .device_json
                        .as_deref()
                        .and_then(|s| serde_json::from_str::<job::DeviceConfig>(s).ok()),
                    worker_id: h.worker_id,
                    job_id: h.job_id,
                    task_id: h.task_id,
                    attempt_id: h.attempt_id as i32,
                    band: h.band.map(|b| b.code()).unwrap_or(0),
                    cpu_millicores: h.cpu_millicores,
                    memory_bytes: h.memory_bytes,
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{authorize, Identity};

    fn who(role: Role) -> Identity {
        Identity {
            user_id: "alice".into(),
            role,
            job_id: None,
            anonymous: false,
        }
    }

    #[test]
    fn readers_may_call_every_method_and_others_none() {
        for m in iris_proto::INSPECT_METHODS {
            for role in [Role::Admin, Role::User, Role::Task, Role::Dashboard] {
                assert!(
                    authorize(&who(role), iris_proto::INSPECT_SERVICE, m).is_ok(),
                    "{m} as {}",
                    role.name()
                );
            }
            for role in [Role::Worker, Role::FederationPeer, Role::Endpoint] {
                assert!(
                    authorize(&who(role), iris_proto::INSPECT_SERVICE, m).is_err(),
                    "{m} as {}",
                    role.name()
                );
            }
        }
    }

    #[test]
    fn limits_default_cap_and_refuse_negatives() {
        assert_eq!(limit("limit", 0, 10, 100).ok(), Some(10));
        assert_eq!(limit("limit", 7, 10, 100).ok(), Some(7));
        assert_eq!(limit("limit", 1000, 10, 100).ok(), Some(100));
        let e = limit("limit", -1, 10, 100).expect_err("negative").to_wire();
        assert!(e.message.starts_with("limit: -1"), "{}", e.message);
    }
}
