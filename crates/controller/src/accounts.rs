//! Users and the scheduler's view of them: `ListUsers`, `GetSchedulerState`, and the budget rule
//! that downgrades an over-budget user's work to BATCH (§4.7).

use crate::error::Result;
use crate::Controller;
use iris_proto::cluster::controller as c;
use iris_store::budgets::{self, UserCounts};
use iris_types::{Band, JobState, TaskState};
use std::collections::BTreeMap;

/// The band work of `band` runs at for a user who has spent `spent` of `limit`: SYSTEM and
/// PRODUCTION never change; anything else drops to BATCH once spend exceeds a non-zero limit.
pub(crate) fn effective_band(band: Band, spent: i64, limit: i64) -> Band {
    match band {
        Band::System | Band::Production => band,
        _ if limit > 0 && spent > limit => Band::Batch,
        _ => band,
    }
}

/// [`effective_band`] for `user` given everyone's spend and budget limits (`default_limit`
/// when the user has none).
pub(crate) fn effective_band_of(
    band: Band,
    user: &str,
    spend: &std::collections::BTreeMap<String, i64>,
    limits: &std::collections::BTreeMap<String, i64>,
    default_limit: i64,
) -> Band {
    effective_band(
        band,
        spend.get(user).copied().unwrap_or(0),
        limits.get(user).copied().unwrap_or(default_limit),
    )
}

/// Writes the config's `user_budgets` tiers (in order, so a later tier wins for a user listed
/// twice), in one transaction: a bad tier changes nothing.
pub(crate) fn apply_budget_tiers(
    db: &mut iris_store::Db,
    tiers: &[crate::BudgetTier],
) -> anyhow::Result<usize> {
    if tiers.is_empty() {
        return Ok(0);
    }
    let now = iris_store::now_ms();
    let tx = db.begin()?;
    let mut n = 0;
    for (i, t) in tiers.iter().enumerate() {
        for user in &t.user_ids {
            if user.trim().is_empty() {
                anyhow::bail!("user_budgets[{i}].user_ids: an entry is empty; name a user");
            }
            budgets::set(
                &tx,
                &budgets::Budget {
                    user_id: user.trim().to_string(),
                    limit: t.limit,
                    max_band: t.max_band.code(),
                },
                now,
            )?;
            n += 1;
        }
    }
    tx.commit()?;
    Ok(n)
}

/// Job states a user summary always lists (with 0 when absent).
const SUMMARY_JOB_STATES: [JobState; 8] = [
    JobState::Pending,
    JobState::Building,
    JobState::Running,
    JobState::Succeeded,
    JobState::Failed,
    JobState::Killed,
    JobState::WorkerFailed,
    JobState::Unschedulable,
];

/// Task states a user summary always lists (with 0 when absent).
const SUMMARY_TASK_STATES: [TaskState; 11] = [
    TaskState::Pending,
    TaskState::Assigned,
    TaskState::Building,
    TaskState::Running,
    TaskState::Succeeded,
    TaskState::Failed,
    TaskState::Killed,
    TaskState::Unschedulable,
    TaskState::WorkerFailed,
    TaskState::Preempted,
    TaskState::CoschedFailed,
];

fn friendly_counts<S: Copy>(
    always: &[S],
    counts: &BTreeMap<i32, i32>,
    name: impl Fn(S) -> &'static str,
    from_code: impl Fn(i32) -> Option<S>,
) -> BTreeMap<String, i32> {
    let mut out: BTreeMap<String, i32> = always.iter().map(|s| (name(*s).to_string(), 0)).collect();
    for (code, n) in counts {
        if let Some(s) = from_code(*code) {
            out.insert(name(s).to_string(), *n);
        }
    }
    out
}

impl Controller {
    /// Every user with a job or a budget row, busiest first (active jobs, then running tasks,
    /// then name). Counts cover the user's active jobs only.
    pub(crate) async fn list_users(
        &self,
        _req: c::ListUsersRequest,
    ) -> Result<c::ListUsersResponse> {
        let mut counts = budgets::user_counts(&*self.db())?;
        let active = |u: &UserCounts| u.jobs.values().sum::<i32>();
        let running = |u: &UserCounts| {
            u.tasks
                .get(&TaskState::Running.code())
                .copied()
                .unwrap_or(0)
        };
        counts.sort_by(|a, b| {
            active(b)
                .cmp(&active(a))
                .then(running(b).cmp(&running(a)))
                .then_with(|| a.user.cmp(&b.user))
        });
        let users = counts
            .into_iter()
            .map(|u| c::UserSummary {
                task_state_counts: friendly_counts(
                    &SUMMARY_TASK_STATES,
                    &u.tasks,
                    TaskState::friendly,
                    TaskState::from_code,
                ),
                job_state_counts: friendly_counts(
                    &SUMMARY_JOB_STATES,
                    &u.jobs,
                    JobState::friendly,
                    JobState::from_code,
                ),
                user: Some(u.user),
                // No auth: no role policy.
                role: Some(String::new()),
            })
            .collect();
        Ok(c::ListUsersResponse { users })
    }

    /// Pending work by (effective band, user, job), running work by (band, user, worker, job),
    /// and every user's budget, limit and spend.
    pub(crate) async fn get_scheduler_state(
        &self,
        _req: c::GetSchedulerStateRequest,
    ) -> Result<c::GetSchedulerStateResponse> {
        let (budgets, spend, pending, running) = {
            let conn = self.db();
            (
                budgets::all(&*conn)?,
                budgets::spend_by_user(&*conn)?,
                budgets::pending_tasks(&*conn)?,
                budgets::running_tasks(&*conn)?,
            )
        };
        let limits: BTreeMap<&str, i64> = budgets
            .iter()
            .map(|b| (b.user_id.as_str(), b.limit))
            .collect();
        let defaults = self.cfg.budget_defaults;
        let limit_of = |u: &str| limits.get(u).copied().unwrap_or(defaults.limit);
        let spent_of = |u: &str| spend.get(u).copied().unwrap_or(0);
        let band_of = |code: i32| Band::from_code(code).unwrap_or(Band::Interactive);

        let mut pending_buckets: BTreeMap<(i32, String, String, String), i32> = BTreeMap::new();
        for t in pending {
            let eff = effective_band(band_of(t.band), spent_of(&t.user), limit_of(&t.user));
            *pending_buckets
                .entry((eff.code(), t.user, t.job_id, t.backend_id))
                .or_default() += 1;
        }
        let mut running_buckets: BTreeMap<(i32, String, String, String, String), i32> =
            BTreeMap::new();
        for t in running {
            *running_buckets
                .entry((t.band, t.user, t.worker_id, t.job_id, t.backend_id))
                .or_default() += 1;
        }

        let mut rows: Vec<(String, i64, i32)> = budgets
            .iter()
            .map(|b| (b.user_id.clone(), b.limit, b.max_band))
            .collect();
        rows.extend(
            spend
                .keys()
                .filter(|u| !limits.contains_key(u.as_str()))
                .map(|u| (u.clone(), defaults.limit, defaults.max_band.code())),
        );
        let user_budgets = rows
            .into_iter()
            .map(|(user, limit, max_band)| {
                let spent = spent_of(&user);
                c::SchedulerUserBudget {
                    effective_band: effective_band(Band::Interactive, spent, limit).code(),
                    utilization_percent: if limit > 0 {
                        (spent as f64 / limit as f64 * 100.0) as f32
                    } else {
                        0.0
                    },
                    user_id: user,
                    budget_limit: limit,
                    budget_spent: spent,
                    max_band,
                }
            })
            .collect();
        Ok(c::GetSchedulerStateResponse {
            user_budgets,
            total_pending: pending_buckets.values().sum(),
            total_running: running_buckets.values().sum(),
            pending_buckets: pending_buckets
                .into_iter()
                .map(
                    |((band, user_id, job_id, backend_id), count)| c::PendingTaskBucket {
                        band,
                        user_id,
                        job_id,
                        count,
                        backend_id,
                    },
                )
                .collect(),
            running_buckets: running_buckets
                .into_iter()
                .map(|((band, user_id, worker_id, job_id, backend_id), count)| {
                    c::RunningTaskBucket {
                        band,
                        user_id,
                        worker_id,
                        job_id,
                        count,
                        backend_id,
                    }
                })
                .collect(),
        })
    }
}

/// Every user's budget limit.
pub(crate) fn limits(conn: &impl iris_store::Read) -> Result<BTreeMap<String, i64>> {
    Ok(budgets::all(conn)?
        .into_iter()
        .map(|b| (b.user_id, b.limit))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_budget_work_drops_to_batch_but_admin_bands_never_do() {
        assert_eq!(effective_band(Band::Interactive, 1001, 1000), Band::Batch);
        assert_eq!(
            effective_band(Band::Interactive, 1000, 1000),
            Band::Interactive,
            "at the limit is not over it"
        );
        assert_eq!(
            effective_band(Band::Interactive, 1_000_000, 0),
            Band::Interactive,
            "0 = unlimited"
        );
        assert_eq!(
            effective_band(Band::Production, 5000, 1000),
            Band::Production
        );
        assert_eq!(effective_band(Band::System, 5000, 1000), Band::System);
        assert_eq!(effective_band(Band::Batch, 0, 1000), Band::Batch);
    }

    #[test]
    fn summaries_list_every_state_and_skip_unknown_codes() {
        let counts = BTreeMap::from([(TaskState::Running.code(), 2), (99, 7)]);
        let out = friendly_counts(
            &SUMMARY_TASK_STATES,
            &counts,
            TaskState::friendly,
            TaskState::from_code,
        );
        assert_eq!(out.len(), SUMMARY_TASK_STATES.len());
        assert_eq!(out["running"], 2);
        assert_eq!(out["pending"], 0);
        assert_eq!(out["cosched_failed"], 0);
    }
}
