//! User RPCs: budgets and who the caller is.

use crate::error::{Error, Result};
use crate::Controller;
use iris_proto::cluster::controller as c;
use iris_proto::job;
use iris_store::budgets;
use iris_types::Band;

use super::now;

impl Controller {
    pub(crate) async fn set_user_budget(
        &self,
        req: c::SetUserBudgetRequest,
    ) -> Result<c::SetUserBudgetResponse> {
        iris_types::ids::validate_user(&req.user_id)
            .map_err(|e| Error::invalid(format!("user_id: {e}")))?;
        if req.budget_limit < 0 {
            return Err(Error::invalid(
                "budget_limit must not be negative (0 = unlimited)",
            ));
        }
        let band = if req.max_band == 0 {
            Band::Interactive
        } else {
            Band::from_code(req.max_band).ok_or_else(|| {
                Error::invalid(format!("max_band: unknown value {}", req.max_band))
            })?
        };
        let mut conn = self.db();
        let tx = conn.begin()?;
        budgets::set(
            &tx,
            &budgets::Budget {
                user_id: req.user_id.trim().to_string(),
                limit: req.budget_limit,
                max_band: band.code(),
            },
            now(),
        )?;
        tx.commit()?;
        Ok(c::SetUserBudgetResponse {})
    }

    pub(crate) async fn get_user_budget(
        &self,
        req: c::GetUserBudgetRequest,
    ) -> Result<c::GetUserBudgetResponse> {
        if req.user_id.trim().is_empty() {
            return Err(Error::invalid("user_id is required"));
        }
        let conn = self.db();
        let (limit, band) = match budgets::get(&*conn, &req.user_id)? {
            Some(b) => (b.limit, b.max_band),
            None => (
                self.cfg.budget_defaults.limit,
                self.cfg.budget_defaults.max_band.code(),
            ),
        };
        let spent = budgets::spend(&*conn, &req.user_id)?;
        Ok(c::GetUserBudgetResponse {
            user_id: req.user_id,
            budget_limit: limit,
            budget_spent: spent,
            max_band: band,
        })
    }

    pub(crate) async fn list_user_budgets(
        &self,
        _req: c::ListUserBudgetsRequest,
    ) -> Result<c::ListUserBudgetsResponse> {
        let conn = self.db();
        let mut users = Vec::new();
        for b in budgets::all(&*conn)? {
            let spent = budgets::spend(&*conn, &b.user_id)?;
            users.push(c::GetUserBudgetResponse {
                user_id: b.user_id,
                budget_limit: b.limit,
                budget_spent: spent,
                max_band: b.max_band,
            });
        }
        Ok(c::ListUserBudgetsResponse { users })
    }

    pub(crate) async fn get_current_user(
        &self,
        _req: job::GetCurrentUserRequest,
    ) -> Result<job::GetCurrentUserResponse> {
        let c = crate::auth::caller();
        // The reference leaves display_name unset: a name is only what a user chose.
        Ok(job::GetCurrentUserResponse {
            user_id: c.user_id,
            role: c.role.name().into(),
            ..Default::default()
        })
    }
}
