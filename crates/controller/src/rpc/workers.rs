//! Worker RPCs: registration, token renewal, listing.

use crate::error::{Error, Result};
use crate::{views, Controller};
use iris_proto::cluster::controller as c;
use iris_rpc::Code;

impl Controller {
    pub(crate) async fn register(&self, req: c::RegisterRequest) -> Result<c::RegisterResponse> {
        if req.worker_id.is_empty() {
            return Ok(c::RegisterResponse {
                worker_id: String::new(),
                accepted: false,
            });
        }
        if req.address.is_empty() {
            return Err(Error::invalid(
                "address: the worker's host:port is required",
            ));
        }
        let md = req.metadata.clone().unwrap_or_default();
        crate::reconcile::upsert_worker(self, &req, &md)?;
        tracing::info!(worker = %req.worker_id, address = %req.address, "worker registered");
        crate::reconcile::ensure_reconciler(self, &req.worker_id);
        self.wake();
        Ok(c::RegisterResponse {
            worker_id: req.worker_id,
            accepted: true,
        })
    }

    pub(crate) async fn list_workers(
        &self,
        _req: c::ListWorkersRequest,
    ) -> Result<c::ListWorkersResponse> {
        let conn = self.db();
        let workers = views::workers(&*conn)?;
        let n = workers.len() as i32;
        Ok(c::ListWorkersResponse {
            workers,
            total_count: Some(n),
            has_more: Some(false),
        })
    }

    /// A fresh 30-day worker token for a worker (or admin) caller; needs auth configured.
    pub(crate) async fn renew_worker_token(
        &self,
        _req: c::RenewWorkerTokenRequest,
    ) -> Result<c::RenewWorkerTokenResponse> {
        let Some(a) = &self.cfg.auth else {
            return Err(Error::precondition(
                "this controller has no auth configured, so it issues no worker tokens",
            ));
        };
        let caller = crate::auth::caller();
        if !matches!(
            caller.role,
            iris_auth::Role::Worker | iris_auth::Role::Admin
        ) {
            return Err(Error::new(
                Code::PermissionDenied,
                "RenewWorkerToken requires the worker role",
            ));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let token = a
            .keypair
            .mint(
                &a.issuer,
                "iris",
                "system:worker",
                "worker",
                30 * 86400,
                now,
                Default::default(),
            )
            .map_err(Error::internal)?;
        Ok(c::RenewWorkerTokenResponse { token })
    }
}
