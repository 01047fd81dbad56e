//! The controller's API as the dashboard uses it: the same Connect RPCs as the CLI
//! (`iris.cluster.ControllerService`, `iris.inspect.InspectService`,
//! `finelog.logging.LogService`), over loopback. Only the admin's Query page sends SQL.

use iris_proto::cluster::controller as c;
use iris_proto::finelog_logging as fl;
use iris_proto::inspect as pb;
use iris_proto::query;
use iris_rpc::{Client, RpcError};
use std::time::Duration;

const CONTROLLER: &str = "iris.cluster.ControllerService";
const LOGS: &str = "finelog.logging.LogService";
const TIMEOUT: Duration = Duration::from_secs(15);

/// The Query page's result: column names and rows of JSON cells.
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<serde_json::Value>>,
}

impl Table {
    /// The column's index by name.
    pub fn col(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }
}

#[derive(Clone)]
pub struct Api {
    cl: Client,
    controller_url: String,
}

impl Api {
    pub fn new(controller_url: &str) -> Result<Api, RpcError> {
        Ok(Api {
            cl: Client::new(controller_url)?,
            controller_url: controller_url.trim_end_matches('/').to_string(),
        })
    }

    /// This client acting for one browser: its session token (if any) as the bearer, and its
    /// address as `x-forwarded-for`, so the controller authenticates the browser's user and never
    /// treats the dashboard's own loopback connection as the anonymous admin.
    pub fn for_caller(&self, token: Option<String>, peer: &str) -> Api {
        Api {
            cl: self
                .cl
                .clone()
                .with_token(token)
                .with_forwarded_for(Some(peer.to_string())),
            controller_url: self.controller_url.clone(),
        }
    }

    /// The controller's URL (where `/proxy` links point).
    pub fn controller_url(&self) -> &str {
        &self.controller_url
    }

    /// Live endpoints whose name starts with `prefix`.
    pub async fn list_endpoints(&self, prefix: &str) -> Result<c::ListEndpointsResponse, RpcError> {
        self.cl
            .call(
                "iris.cluster.EndpointService",
                "ListEndpoints",
                &c::ListEndpointsRequest {
                    prefix: prefix.to_string(),
                    ..Default::default()
                },
                TIMEOUT,
            )
            .await
    }

    async fn ctl<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        method: &str,
        req: &Req,
    ) -> Result<Resp, RpcError> {
        self.cl.call(CONTROLLER, method, req, TIMEOUT).await
    }

    pub async fn current_user(&self) -> Result<iris_proto::job::GetCurrentUserResponse, RpcError> {
        self.ctl("GetCurrentUser", &iris_proto::job::GetCurrentUserRequest {})
            .await
    }

    pub async fn list_peers(&self) -> Result<c::ListPeersResponse, RpcError> {
        self.ctl("ListPeers", &c::ListPeersRequest {}).await
    }

    pub async fn list_jobs(&self, q: c::JobQuery) -> Result<c::ListJobsResponse, RpcError> {
        self.ctl("ListJobs", &c::ListJobsRequest { query: Some(q) })
            .await
    }

    pub async fn job_status(&self, job_id: &str) -> Result<c::GetJobStatusResponse, RpcError> {
        self.ctl(
            "GetJobStatus",
            &c::GetJobStatusRequest {
                job_id: job_id.to_string(),
            },
        )
        .await
    }

    pub async fn job_state(&self, job_id: &str) -> Result<c::GetJobStateResponse, RpcError> {
        self.ctl(
            "GetJobState",
            &c::GetJobStateRequest {
                job_ids: vec![job_id.to_string()],
            },
        )
        .await
    }

    pub async fn list_tasks(&self, job_id: &str) -> Result<c::ListTasksResponse, RpcError> {
        self.ctl(
            "ListTasks",
            &c::ListTasksRequest {
                job_id: job_id.to_string(),
            },
        )
        .await
    }

    pub async fn task_status(&self, task_id: &str) -> Result<c::GetTaskStatusResponse, RpcError> {
        self.ctl(
            "GetTaskStatus",
            &c::GetTaskStatusRequest {
                task_id: task_id.to_string(),
            },
        )
        .await
    }

    pub async fn list_backends(&self) -> Result<c::ListBackendsResponse, RpcError> {
        self.ctl("ListBackends", &c::ListBackendsRequest {}).await
    }

    pub async fn list_workers(&self) -> Result<c::ListWorkersResponse, RpcError> {
        self.ctl("ListWorkers", &c::ListWorkersRequest::default())
            .await
    }

    pub async fn scheduler_state(&self) -> Result<c::GetSchedulerStateResponse, RpcError> {
        self.ctl("GetSchedulerState", &c::GetSchedulerStateRequest {})
            .await
    }

    async fn inspect<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        method: &str,
        req: &Req,
    ) -> Result<Resp, RpcError> {
        self.cl
            .call(iris_proto::INSPECT_SERVICE, method, req, TIMEOUT)
            .await
    }

    /// Job counts by state under the job list's filters.
    pub async fn count_jobs(
        &self,
        req: &pb::CountJobsRequest,
    ) -> Result<pb::CountJobsResponse, RpcError> {
        self.inspect("CountJobs", req).await
    }

    /// Every attempt of a job or of a task (default limit).
    pub async fn list_attempts(
        &self,
        req: &pb::ListAttemptsRequest,
    ) -> Result<pb::ListAttemptsResponse, RpcError> {
        self.inspect("ListAttempts", req).await
    }

    /// A task's events, oldest first (the controller's default limit).
    pub async fn list_task_events(
        &self,
        task_id: &str,
    ) -> Result<pb::ListTaskEventsResponse, RpcError> {
        self.inspect(
            "ListTaskEvents",
            &pb::ListTaskEventsRequest {
                task_id: task_id.to_string(),
                ..Default::default()
            },
        )
        .await
    }

    /// Every worker's verdict for a pending task (`ExplainTask`).
    pub async fn list_task_samples(
        &self,
        task_id: &str,
    ) -> Result<pb::ListTaskSamplesResponse, RpcError> {
        self.inspect(
            "ListTaskSamples",
            &pb::ListTaskSamplesRequest {
                task_id: task_id.to_string(),
                limit: 0,
            },
        )
        .await
    }

    pub async fn explain_task(&self, task_id: &str) -> Result<pb::ExplainTaskResponse, RpcError> {
        self.inspect(
            "ExplainTask",
            &pb::ExplainTaskRequest {
                task_id: task_id.to_string(),
                ..Default::default()
            },
        )
        .await
    }

    /// What each open attempt holds on its worker.
    pub async fn list_resource_holds(&self) -> Result<pb::ListResourceHoldsResponse, RpcError> {
        self.inspect("ListResourceHolds", &pb::ListResourceHoldsRequest {})
            .await
    }

    /// `ExecuteRawQuery` (the admin's Query page only), with each row's JSON array parsed.
    pub async fn query(&self, sql: &str) -> Result<Table, RpcError> {
        let r: query::RawQueryResponse = self
            .ctl(
                "ExecuteRawQuery",
                &query::RawQueryRequest {
                    sql: sql.to_string(),
                },
            )
            .await?;
        let rows = r
            .rows
            .iter()
            .map(|row| match serde_json::from_str::<serde_json::Value>(row) {
                Ok(serde_json::Value::Array(cells)) => cells,
                Ok(other) => vec![other],
                Err(_) => vec![serde_json::Value::String(row.clone())],
            })
            .collect();
        Ok(Table {
            columns: r.columns.into_iter().map(|c| c.name).collect(),
            rows,
        })
    }

    pub async fn fetch_logs(
        &self,
        req: &fl::FetchLogsRequest,
    ) -> Result<fl::FetchLogsResponse, RpcError> {
        self.cl.call(LOGS, "FetchLogs", req, TIMEOUT).await
    }
}
