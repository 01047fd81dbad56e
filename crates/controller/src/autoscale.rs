//! The scale-group autoscaler: once a second it reads the demand no live worker can take, asks
//! the pure rule (`iris_scheduler::autoscale`) what each autoscaled group needs, and starts or
//! stops slices through a [`SliceProvider`] (the local platform's in-process workers; the edge
//! is a trait so the decision never touches processes). Its state is in memory, written to
//! `scaling_groups`/`slices` after each evaluation, and reported by `GetAutoscalerStatus`.
//!
//! Stopping a slice never races a placement: its workers are first marked draining (the tick
//! offers them nothing and commits no assignment to them), then, in one write transaction, the
//! slice is checked to still run nothing and its worker rows are removed; only then is it
//! stopped.

use crate::{lock, Controller};
use futures::future::BoxFuture;
use iris_proto::vm;
use iris_scheduler::autoscale::{self as rule, Demand, Lifecycle, Slice, SliceChange};
use iris_types::Resources;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// How often the autoscaler evaluates.
const EVALUATE_EVERY: Duration = Duration::from_secs(1);
/// Actions kept for `GetAutoscalerStatus` (the reference's 100).
const ACTIONS_KEPT: usize = 100;

/// Starts and stops slices. Implemented at the edge (the local platform starts in-process
/// workers that register with this controller).
pub trait SliceProvider: Send + Sync {
    /// Starts slice `slice_id` of `group` with workers named `worker_ids`; the error says why
    /// it could not.
    fn create<'a>(
        &'a self,
        group: &'a str,
        slice_id: &'a str,
        worker_ids: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>>;
    /// Stops the slice and its workers (a no-op for an unknown one).
    fn terminate<'a>(&'a self, slice_id: &'a str) -> BoxFuture<'a, ()>;
}

/// What the autoscaler keeps between evaluations.
#[derive(Default)]
pub(crate) struct State {
    /// True once a provider runs the loop: groups are then reported from here.
    pub(crate) enabled: bool,
    pub(crate) groups: BTreeMap<String, rule::GroupState>,
    pub(crate) actions: VecDeque<vm::AutoscalerAction>,
    pub(crate) routing: Option<vm::RoutingDecision>,
    pub(crate) last_evaluation_ms: i64,
    /// Workers of slices being stopped: offered nothing by the tick.
    pub(crate) draining: HashSet<String>,
    /// Why a pending task waits, in the autoscaler's words (a slice starting for it, or why
    /// none can), by task id: shown instead of the scheduler's reason.
    pub(crate) hints: std::collections::HashMap<String, String>,
}

impl State {
    fn act(
        &mut self,
        action_type: &str,
        group: &str,
        slice_id: &str,
        reason: String,
        status: &str,
    ) {
        if self.actions.len() == ACTIONS_KEPT {
            self.actions.pop_front();
        }
        self.actions.push_back(vm::AutoscalerAction {
            timestamp: Some(iris_proto::time::Timestamp {
                epoch_ms: Some(iris_store::now_ms()),
            }),
            action_type: Some(action_type.into()),
            scale_group: Some(group.into()),
            slice_id: Some(slice_id.into()),
            reason: Some(reason),
            status: Some(status.into()),
        });
    }

    /// Settles the pending `scale_up` action of `slice_id` (if still in the ring).
    fn settle(&mut self, slice_id: &str, status: &str, reason: Option<String>) {
        let found = self
            .actions
            .iter_mut()
            .rev()
            .find(|a| a.slice_id() == slice_id && a.action_type() == "scale_up");
        if let Some(a) = found {
            a.status = Some(status.into());
            if let Some(r) = reason {
                a.reason = Some(r);
            }
        }
    }
}

/// Runs the autoscaler until `stop`: slices recorded by a previous run are gone with it (their
/// workers were in-process), so it starts from none.
pub(crate) async fn run(
    ctl: Arc<Controller>,
    provider: Arc<dyn SliceProvider>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    lock(&ctl.autoscale).enabled = true;
    loop {
        if let Err(e) = evaluate(&ctl, &*provider).await {
            tracing::error!(error = %e, "autoscaler evaluation");
        }
        tokio::select! {
            _ = tokio::time::sleep(EVALUATE_EVERY) => {}
            _ = stop.changed() => break,
        }
    }
}

/// A slice id as the reference names them: `iris-<group>-<YYYYMMDD-HHMM>-<8 hex>`.
fn slice_id(group: &str) -> String {
    let clean: String = group
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let stamp = chrono::Utc::now().format("%Y%m%d-%H%M");
    format!("iris-{}-{stamp}-{}", clean.trim_matches('-'), short_hex())
}

fn short_hex() -> String {
    let mut b = [0u8; 4];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
    hex::encode(b)
}

/// What one evaluation read from the store.
struct Observed {
    /// Healthy, confirmed workers.
    live: BTreeSet<String>,
    /// Every worker with a row, healthy or not (a worker is lost once the controller has
    /// declared it failed and removed its row, after its grace).
    present: BTreeSet<String>,
    /// Workers running or building something.
    busy: BTreeSet<String>,
    /// Room left on each live worker.
    free: BTreeMap<String, Resources>,
    /// Pending demand: the groups that could host it (indices, in routing order), the demand
    /// and its task ids.
    pending: Vec<(Vec<usize>, Demand, Vec<String>)>,
}

fn observe(ctl: &Controller, groups: &[&crate::GroupCapacity]) -> crate::error::Result<Observed> {
    let conn = ctl.db();
    let workers = crate::tick::load_workers(&*conn)?;
    let confirmed = lock(&ctl.confirmed).clone();
    let live: BTreeSet<String> = workers
        .iter()
        .filter(|w| w.healthy && confirmed.contains(&w.id))
        .map(|w| w.id.clone())
        .collect();
    let present: BTreeSet<String> = workers.iter().map(|w| w.id.clone()).collect();
    let mut free: BTreeMap<String, Resources> = workers
        .iter()
        .filter(|w| live.contains(&w.id))
        .map(|w| (w.id.clone(), w.total.clone()))
        .collect();
    let mut busy = BTreeSet::new();
    for h in iris_store::snapshot::holdings(&*conn)? {
        busy.insert(h.worker_id.clone());
        if let (Some(room), Some(spec)) = (free.get_mut(&h.worker_id), ctl.spec(&*conn, &h.job_id)?)
        {
            rule::take(room, &spec.resources);
        }
    }
    // One unit of demand per task, one per coscheduled job (its pending tasks together).
    let templates: Vec<iris_scheduler::Worker> = groups
        .iter()
        .map(|g| g.worker(format!("{}-template", g.name)))
        .collect();
    let mut gangs: BTreeMap<String, usize> = BTreeMap::new();
    let mut pending: Vec<(Vec<usize>, Demand, Vec<String>)> = Vec::new();
    for w in iris_store::snapshot::waiting(&*conn)? {
        let Some(spec) = ctl.spec(&*conn, &w.job_id)? else {
            continue;
        };
        if spec.group_by.is_some() {
            if let Some(&i) = gangs.get(&w.job_id) {
                let (_, Demand::Gang { size, .. }, ids) = &mut pending[i] else {
                    continue;
                };
                *size += 1;
                ids.push(w.task_id);
                continue;
            }
        }
        let candidates: Vec<usize> = templates
            .iter()
            .enumerate()
            .filter(|(_, t)| crate::GroupCapacity::template_runs(t, &spec))
            .map(|(i, _)| i)
            .collect();
        let demand = if spec.group_by.is_some() {
            gangs.insert(w.job_id.clone(), pending.len());
            Demand::Gang {
                size: 1,
                each: spec.resources.clone(),
            }
        } else {
            Demand::Task(spec.resources.clone())
        };
        pending.push((candidates, demand, vec![w.task_id]));
    }
    Ok(Observed {
        live,
        present,
        busy,
        free,
        pending,
    })
}

/// One evaluation: observe, decide per group, then start and stop slices.
async fn evaluate(ctl: &Arc<Controller>, provider: &dyn SliceProvider) -> crate::error::Result<()> {
    let mut groups: Vec<&crate::GroupCapacity> = ctl
        .cfg
        .groups
        .iter()
        .filter(|g| g.autoscale.is_some())
        .collect();
    if groups.is_empty() {
        return Ok(());
    }
    groups.sort_by_key(|g| {
        (
            g.autoscale.as_ref().map(|p| p.priority).unwrap_or(100),
            g.name.clone(),
        )
    });
    let obs = observe(ctl, &groups)?;
    let now = iris_store::now_ms();
    // Route each unit of demand to the first group (by priority, then name) that can host it.
    let mut routed: Vec<Vec<Demand>> = vec![Vec::new(); groups.len()];
    let mut routed_ids: Vec<Vec<Vec<String>>> = vec![Vec::new(); groups.len()];
    // Demand no group can bring capacity up for: task ids, request, reason.
    let mut unmet: Vec<(Vec<String>, Resources, String)> = Vec::new();
    let mut hints = std::collections::HashMap::new();
    let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
    for (candidates, demand, ids) in obs.pending {
        match candidates.first() {
            Some(&i) => {
                routed[i].push(demand);
                routed_ids[i].push(ids);
            }
            None => {
                for t in &ids {
                    hints.insert(
                        t.clone(),
                        "Unsatisfied autoscaler demand: no scale group can host it".to_string(),
                    );
                }
                let res = demand.resources().clone();
                let why = format!(
                    "no_matching_group: no scaling group can host {res} (groups: {})",
                    names.join(", ")
                );
                unmet.push((ids, res, why));
            }
        }
    }
    let mut to_add: Vec<(String, String)> = Vec::new();
    let mut to_remove: Vec<(String, String, Vec<String>, String)> = Vec::new();
    let mut to_terminate: Vec<(String, Vec<String>)> = Vec::new();
    {
        let mut st = lock(&ctl.autoscale);
        let mut statuses = Vec::new();
        let mut launch = BTreeMap::new();
        for (i, g) in groups.iter().enumerate() {
            let Some(policy) = g.autoscale.as_ref() else {
                continue;
            };
            let mut events: Vec<(&str, String, String, &str)> = Vec::new();
            let gs = st.groups.entry(g.name.clone()).or_default();
            for change in
                gs.observe_workers(|w| obs.live.contains(w), |w| obs.present.contains(w), now)
            {
                match change {
                    SliceChange::Ready { slice, workers } => events.push((
                        "slice_ready",
                        slice,
                        format!("bootstrap completed ({workers} workers)"),
                        "completed",
                    )),
                    SliceChange::BootTimedOut {
                        slice,
                        workers,
                        why,
                    } => {
                        events.push(("slice_failed", slice.clone(), why, "failed"));
                        to_terminate.push((slice, workers));
                    }
                    SliceChange::Lost {
                        slice,
                        workers,
                        lost,
                    } => {
                        let why = format!("workers failed: {}", lost.join(", "));
                        events.push(("worker_failed", slice.clone(), why, "completed"));
                        to_terminate.push((slice, workers));
                    }
                }
            }
            gs.observe_activity(|w| obs.busy.contains(w), now);
            let mine: BTreeSet<&String> = gs.slices.iter().flat_map(|s| s.workers.iter()).collect();
            let free: Vec<Resources> = obs
                .free
                .iter()
                .filter(|(w, _)| mine.contains(w))
                .map(|(_, r)| r.clone())
                .collect();
            let need = rule::required_slices(policy, &g.capacity, &free, &routed[i]);
            let required = need.slices;
            gs.current_demand = required;
            gs.peak_demand = gs.peak_demand.max(required);
            let d = rule::decide(policy, gs, &need, now);
            let avail = rule::availability(policy, gs, now);
            let (decision, reason) = if !d.add.is_empty() {
                ("selected", "demand-routed".to_string())
            } else if let Some(why) = &d.blocked {
                ("blocked", why.clone())
            } else if avail.status == "at_max_slices" && required > 0 {
                ("blocked", "at max_slices".to_string())
            } else if avail.status == "cooldown" {
                ("cooldown", avail.reason.clone())
            } else {
                ("idle", String::new())
            };
            statuses.push(vm::GroupRoutingStatus {
                group: Some(g.name.clone()),
                priority: Some(policy.priority as i32),
                assigned: Some(routed[i].len() as i32),
                launch: Some(d.add.len() as i32),
                decision: Some(decision.into()),
                reason: Some(reason),
            });
            launch.insert(g.name.clone(), d.add.len() as i32);
            // Demand this group cannot bring up capacity for, even with what is starting.
            let starting = gs.booting() as usize + d.add.len();
            let short = required as usize > starting;
            for &u in &need.unabsorbed {
                let (Some(ids), Some(demand)) = (routed_ids[i].get(u), routed[i].get(u)) else {
                    continue;
                };
                let hint = if short {
                    let why = d.blocked.clone().unwrap_or_else(|| avail.reason.clone());
                    unmet.push((
                        ids.clone(),
                        demand.resources().clone(),
                        format!("no_capacity: {}={}", g.name, avail.status),
                    ));
                    let why = if why.is_empty() {
                        String::new()
                    } else {
                        format!(" ({why})")
                    };
                    format!(
                        "Unsatisfied autoscaler demand: scale group '{}' is {}{why}",
                        g.name, avail.status
                    )
                } else {
                    format!(
                        "Waiting for worker scale-up in scale group '{}' ({starting} slice(s) requested)",
                        g.name
                    )
                };
                for t in ids {
                    hints.insert(t.clone(), hint.clone());
                }
            }
            for reason in d.add {
                to_add.push((g.name.clone(), reason));
            }
            for (id, reason) in d.remove {
                let workers = gs
                    .slices
                    .iter()
                    .find(|s| s.id == id)
                    .map(|s| s.workers.clone())
                    .unwrap_or_default();
                to_remove.push((g.name.clone(), id, workers, reason));
            }
            for (kind, slice, reason, status) in events {
                st.act(kind, &g.name, &slice, reason, status);
            }
        }
        let unmet_entries = unmet
            .into_iter()
            .map(|(ids, res, reason)| vm::UnmetDemand {
                entry: Some(demand_entry(ids, &res)),
                reason,
            })
            .collect();
        st.hints = hints;
        st.routing = Some(vm::RoutingDecision {
            group_to_launch: launch,
            group_statuses: statuses,
            unmet_entries,
            ..Default::default()
        });
        st.last_evaluation_ms = now;
    }
    for (id, workers) in to_terminate {
        provider.terminate(&id).await;
        // Its workers went with it: what they ran is lost now, not after their grace.
        {
            let mut conn = ctl.db();
            let tx = conn.begin()?;
            for w in &workers {
                iris_store::apply::fail_worker(&tx, w, iris_store::now_ms())?;
            }
            tx.commit()?;
        }
        ctl.wake();
    }
    let mut failed_groups: BTreeSet<String> = BTreeSet::new();
    for (group, reason) in to_add {
        // After a failed start the group waits out its backoff; other groups still start.
        if failed_groups.contains(&group) {
            continue;
        }
        let Some(g) = groups.iter().find(|g| g.name == group) else {
            continue;
        };
        let per_slice = g.autoscale.as_ref().map(|p| p.num_vms.max(1)).unwrap_or(1);
        let id = slice_id(&group);
        let workers: Vec<String> = (0..per_slice)
            .map(|i| format!("worker-{id}-{i}-{}", short_hex()))
            .collect();
        {
            let mut st = lock(&ctl.autoscale);
            let gs = st.groups.entry(group.clone()).or_default();
            gs.slices.push(Slice {
                id: id.clone(),
                workers: workers.clone(),
                lifecycle: Lifecycle::Booting,
                created_at_ms: now,
                quiet_since_ms: None,
            });
            gs.last_scale_up_ms = now;
            st.act("scale_up", &group, &id, reason.clone(), "pending");
        }
        tracing::info!(group = %group, slice = %id, reason = %reason, "starting a slice");
        let result = provider.create(&group, &id, &workers).await;
        let mut st = lock(&ctl.autoscale);
        match result {
            Ok(()) => st.settle(&id, "completed", None),
            Err(e) => {
                tracing::warn!(group = %group, slice = %id, error = %e, "a slice failed to start; backing off");
                st.settle(&id, "failed", Some(format!("{reason} - error: {e}")));
                if let Some(gs) = st.groups.get_mut(&group) {
                    gs.slices.retain(|s| s.id != id);
                    gs.record_failure(e.clone(), iris_store::now_ms());
                }
                st.act("slice_failed", &group, &id, e, "failed");
                failed_groups.insert(group);
            }
        }
    }
    for (group, id, workers, reason) in to_remove {
        if stop_slice(ctl, provider, &group, &id, &workers, reason).await? {
            ctl.wake();
        }
    }
    persist(ctl)
}

/// Stops an idle slice unless something was placed on it meanwhile. True when it stopped.
async fn stop_slice(
    ctl: &Controller,
    provider: &dyn SliceProvider,
    group: &str,
    id: &str,
    workers: &[String],
    reason: String,
) -> crate::error::Result<bool> {
    lock(&ctl.autoscale)
        .draining
        .extend(workers.iter().cloned());
    let removed = {
        let mut conn = ctl.db();
        let tx = conn.begin()?;
        let busy = iris_store::snapshot::holdings(&tx)?
            .iter()
            .any(|h| workers.contains(&h.worker_id));
        if !busy {
            for w in workers {
                iris_store::apply::fail_worker(&tx, w, iris_store::now_ms())?;
            }
        }
        tx.commit()?;
        !busy
    };
    if removed {
        provider.terminate(id).await;
        tracing::info!(group = %group, slice = %id, reason = %reason, "stopped an idle slice");
    }
    let mut st = lock(&ctl.autoscale);
    for w in workers {
        st.draining.remove(w);
    }
    if removed {
        if let Some(gs) = st.groups.get_mut(group) {
            gs.slices.retain(|s| s.id != id);
            gs.last_scale_down_ms = iris_store::now_ms();
        }
        st.act("scale_down", group, id, reason, "completed");
    }
    Ok(removed)
}

fn persist(ctl: &Controller) -> crate::error::Result<()> {
    let (groups, slices) = {
        let st = lock(&ctl.autoscale);
        let groups: Vec<iris_store::autoscale::GroupRow> = st
            .groups
            .iter()
            .map(|(name, g)| iris_store::autoscale::GroupRow {
                name: name.clone(),
                consecutive_failures: g.consecutive_failures as i64,
                backoff_until_ms: g.backoff_until_ms,
                last_scale_up_ms: g.last_scale_up_ms,
                last_scale_down_ms: g.last_scale_down_ms,
            })
            .collect();
        let slices = st
            .groups
            .iter()
            .flat_map(|(name, g)| {
                g.slices
                    .iter()
                    .map(move |s| iris_store::autoscale::SliceRow {
                        slice_id: s.id.clone(),
                        scale_group: name.clone(),
                        lifecycle: s.lifecycle.as_str().into(),
                        worker_ids: s.workers.clone(),
                        created_at_ms: s.created_at_ms,
                        error_message: String::new(),
                    })
            })
            .collect::<Vec<_>>();
        (groups, slices)
    };
    let mut conn = ctl.db();
    let tx = conn.begin()?;
    iris_store::autoscale::save(&tx, &groups, &slices)?;
    tx.commit()?;
    Ok(())
}

fn demand_entry(task_ids: Vec<String>, r: &Resources) -> vm::DemandEntryStatus {
    vm::DemandEntryStatus {
        task_ids,
        device_type: Some(
            if r.gpu > 0 {
                "gpu"
            } else if r.tpu > 0 {
                "tpu"
            } else {
                ""
            }
            .into(),
        ),
        device_variant: Some("*".into()),
        resources: Some(vm::ResourceSpec {
            cpu_millicores: Some(r.cpu_millicores as i32),
            memory_bytes: Some(r.memory_bytes),
            disk_bytes: Some(r.disk_bytes),
            gpu_count: Some(r.gpu as i32),
            tpu_count: Some(r.tpu as i32),
        }),
        coschedule_group_id: Some(String::new()),
        preemptible: Some(false),
    }
}

impl Controller {
    /// True while worker `id` belongs to a slice being stopped.
    pub(crate) fn draining(&self) -> HashSet<String> {
        lock(&self.autoscale).draining.clone()
    }
}

impl Controller {
    /// Slices each autoscaled group can still start (`max_slices` − its slices); empty while
    /// no autoscaler runs.
    pub(crate) fn autoscale_headroom(&self) -> BTreeMap<String, u32> {
        let st = lock(&self.autoscale);
        if !st.enabled {
            return BTreeMap::new();
        }
        self.cfg
            .groups
            .iter()
            .filter_map(|g| {
                let p = g.autoscale.as_ref()?;
                let have = st
                    .groups
                    .get(&g.name)
                    .map(|s| s.slices.len() as u32)
                    .unwrap_or(0);
                Some((g.name.clone(), p.max_slices.saturating_sub(have)))
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "autoscale_tests.rs"]
mod tests;
