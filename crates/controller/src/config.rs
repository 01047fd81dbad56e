//! Controller settings.

use crate::{auth, checkpoint, federation};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Capacity a scale group can provide, used for the submit-time feasibility check.
/// The budget of a user nobody set one for (the reference's defaults: 1000, INTERACTIVE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetDefaults {
    /// Spend before work drops to BATCH; 0 = unlimited.
    pub limit: i64,
    /// The highest band such a user may submit to.
    pub max_band: iris_types::Band,
}

impl Default for BudgetDefaults {
    fn default() -> Self {
        BudgetDefaults {
            limit: 1000,
            max_band: iris_types::Band::Interactive,
        }
    }
}

/// One `user_budgets` entry of a cluster config: these users get this budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetTier {
    pub user_ids: Vec<String>,
    pub limit: i64,
    pub max_band: iris_types::Band,
}

#[derive(Clone, Debug)]
pub struct GroupCapacity {
    pub name: String,
    /// What one worker of the group offers.
    pub capacity: iris_types::Resources,
    /// One worker's attributes; `device-type` and `device-variant` (`cpu` for CPU workers)
    /// say which accelerator it has.
    pub attributes: std::collections::BTreeMap<String, iris_types::AttrValue>,
    /// Workers the group can grow to.
    pub max_workers: u32,
    /// Slices of it are started and stopped by demand (`RunningController::autoscale`);
    /// `None`: its workers come from elsewhere.
    pub autoscale: Option<iris_scheduler::autoscale::GroupPolicy>,
}

impl GroupCapacity {
    /// Whether `template` (one of the group's workers, [`GroupCapacity::worker`]) could run a
    /// task of `spec`, by its resources and constraints.
    pub(crate) fn template_runs(
        template: &iris_scheduler::Worker,
        spec: &crate::spec::JobSpec,
    ) -> bool {
        iris_scheduler::feasible_anywhere(
            &spec.resources,
            &spec.constraints,
            None,
            1,
            std::slice::from_ref(template),
        )
        .is_ok()
    }

    /// One of the group's workers as the scheduler sees it: healthy, not pooled.
    pub(crate) fn worker(&self, id: String) -> iris_scheduler::Worker {
        let device_variant = match self.attributes.get("device-variant") {
            Some(iris_types::AttrValue::Str(v)) if !v.eq_ignore_ascii_case("cpu") => {
                v.to_ascii_lowercase()
            }
            _ => String::new(),
        };
        iris_scheduler::Worker {
            id,
            total: self.capacity.clone(),
            attributes: self.attributes.clone(),
            healthy: true,
            device_variant,
            pooled: false,
        }
    }
}

/// Controller settings.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub state_dir: PathBuf,
    pub bind: SocketAddr,
    /// The controller's revision date (`YYYY-MM-DD`) for the client freshness gate.
    pub revision_date: Option<String>,
    /// A worker is failed after this long without a successful reconcile (and ≥3 failures).
    pub worker_grace: Duration,
    /// How often an idle worker is reconciled when the fleet is small (see
    /// `max_reconciles_per_second`). A worker whose desired set changes, or that pokes the
    /// controller because an attempt ended, is reconciled at once whatever this says.
    pub reconcile_interval: Duration,
    /// The fleet's budget of idle reconciles: with more than this many workers per second of
    /// `reconcile_interval`, each idle worker's round is stretched to `workers / this` seconds,
    /// so the cost of a quiet fleet stays flat as it grows (Nomad caps heartbeats the same way).
    pub max_reconciles_per_second: u32,
    /// Declared scale groups: a job no group and no worker could ever host is refused at submit.
    pub groups: Vec<GroupCapacity>,
    /// Query limits for `ExecuteRawQuery`.
    pub query_time_limit: Duration,
    pub query_max_rows: usize,
    /// Where checkpoints and the rollout record live: a local path or a `file://`, `s3://` or
    /// `gs://` URL. `None`: no checkpoints.
    pub remote_state_dir: Option<String>,
    /// Take a checkpoint this often (`None`: only on `BeginCheckpoint`).
    pub checkpoint_interval: Option<Duration>,
    /// Checkpoint directories older than this are pruned after each checkpoint.
    pub checkpoint_max_age: Duration,
    /// With no local DB, restore this checkpoint (`controller-state/<epoch_ms>`) instead of the newest.
    pub restore_checkpoint: Option<String>,
    /// Finished job trees older than this are deleted with their tasks, attempts, events and logs
    /// (see `iris_store::prune`); `None`: kept forever. Default 7 days, as the reference.
    pub job_retention: Option<Duration>,
    /// How often the retention sweep runs (default 1 hour, as the reference).
    pub prune_interval: Duration,
    /// Start on an empty DB: an existing one is set aside (renamed, never deleted) and no
    /// checkpoint is restored unless `restore_checkpoint` names one (`--fresh`).
    pub fresh: bool,
    /// Budget of a user without a `user_budgets` row (`user_budget_defaults`).
    pub budget_defaults: BudgetDefaults,
    /// Per-user budgets from the config (`user_budgets`), written at start; later tiers win.
    pub budget_tiers: Vec<BudgetTier>,
    /// `auth.*`; `None`: null-auth, every caller is the anonymous admin.
    pub auth: Option<auth::AuthConfig>,
    /// This cluster's name and its federation peers (none: no federation).
    pub federation: federation::FederationConfig,
}

impl ControllerConfig {
    pub fn local(state_dir: PathBuf) -> Self {
        ControllerConfig {
            state_dir,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            revision_date: None,
            auth: None,
            worker_grace: Duration::from_secs(10),
            reconcile_interval: Duration::from_secs(1),
            max_reconciles_per_second: 1000,
            groups: Vec::new(),
            query_time_limit: Duration::from_secs(10),
            query_max_rows: 10_000,
            remote_state_dir: None,
            checkpoint_interval: None,
            checkpoint_max_age: checkpoint::DEFAULT_MAX_AGE,
            restore_checkpoint: None,
            job_retention: Some(crate::prune::DEFAULT_JOB_RETENTION),
            prune_interval: crate::prune::DEFAULT_PRUNE_INTERVAL,
            fresh: false,
            budget_defaults: BudgetDefaults::default(),
            budget_tiers: Vec::new(),
            federation: federation::FederationConfig::default(),
        }
    }
}
