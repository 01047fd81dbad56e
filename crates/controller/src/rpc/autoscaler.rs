//! `GetAutoscalerStatus` and `GetWorkerStatus`: the scale groups and the workers of each, as the
//! published `cluster status`, `cluster vm status` and `cluster vm logs` read them.
//!
//! A group the autoscaler runs (`crate::autoscale`, on the local platform) reports its slices,
//! demand, availability, actions and routing from the autoscaler's state. Other groups (a
//! controller whose workers are daemons joining by `--scale-group`) report the workers they have,
//! one slice per worker and one VM per slice (a worker is its own host), their demand (the
//! pending tasks one of their workers could run), and no scaling actions.

use crate::error::{Error, Result};
use crate::{views, Controller};
use iris_proto::cluster::controller as c;
use iris_proto::vm;
use std::collections::BTreeMap;

/// How many of a worker's newest attempts `GetWorkerStatus` lists (the reference's 50).
const RECENT_ATTEMPTS: u32 = 50;

fn vm_of(w: &c::WorkerHealthStatus) -> vm::VmInfo {
    let healthy = w.healthy();
    vm::VmInfo {
        vm_id: w.worker_id().to_owned(),
        slice_id: w.worker_id().to_owned(),
        scale_group: w.scale_group().to_owned(),
        state: if healthy {
            vm::VmState::Ready
        } else {
            vm::VmState::Unhealthy
        } as i32,
        address: w.address().to_owned(),
        worker_id: w.worker_id().to_owned(),
        worker_healthy: healthy,
        usability: if healthy { "healthy" } else { "dead" }.into(),
        running_task_count: w.running_job_ids.len() as i32,
        state_changed_at: w.last_heartbeat,
        ..Default::default()
    }
}

fn slice_of(w: &c::WorkerHealthStatus) -> vm::SliceInfo {
    let healthy = w.healthy();
    let idle = w.running_job_ids.is_empty();
    vm::SliceInfo {
        slice_id: Some(w.worker_id().to_owned()),
        scale_group: Some(w.scale_group().to_owned()),
        vms: vec![vm_of(w)],
        last_active: w.last_heartbeat,
        idle: Some(idle),
        state: Some(if healthy { "ready" } else { "failed" }.into()),
        error_message: Some(if healthy {
            String::new()
        } else {
            w.status_message().to_owned()
        }),
        created_at: None,
        degraded_slot_count: Some(0),
        capacity_status: Some(
            match (healthy, idle) {
                (false, _) => "degraded",
                (true, false) => "in_use",
                (true, true) => "available",
            }
            .into(),
        ),
    }
}

fn attr(g: &crate::GroupCapacity, key: &str) -> String {
    match g.attributes.get(key) {
        Some(iris_types::AttrValue::Str(s)) => s.clone(),
        Some(iris_types::AttrValue::Int(i)) => i.to_string(),
        _ => String::new(),
    }
}

impl Controller {
    pub(crate) async fn get_autoscaler_status(
        &self,
        _req: c::GetAutoscalerStatusRequest,
    ) -> Result<c::GetAutoscalerStatusResponse> {
        // Autoscaled groups report the autoscaler's demand; only the others need the pending
        // tasks read here.
        let enabled = crate::lock(&self.autoscale).enabled;
        let counts_demand = self
            .cfg
            .groups
            .iter()
            .any(|g| g.autoscale.is_none() || !enabled);
        let conn = self.db();
        let workers = views::workers(&*conn)?;
        // The pending tasks' requirements, one entry per task.
        let mut pending = Vec::new();
        if counts_demand {
            for w in iris_store::snapshot::waiting(&*conn)? {
                if let Some(spec) = self.spec(&*conn, &w.job_id)? {
                    pending.push(spec);
                }
            }
        }
        drop(conn);
        let mut by_group: BTreeMap<String, Vec<&c::WorkerHealthStatus>> = BTreeMap::new();
        for w in &workers {
            if !w.scale_group().is_empty() {
                by_group
                    .entry(w.scale_group.clone().unwrap_or_default())
                    .or_default()
                    .push(w);
            }
        }
        let auto = crate::lock(&self.autoscale);
        let now = iris_store::now_ms();
        let by_id: BTreeMap<&str, &c::WorkerHealthStatus> =
            workers.iter().map(|w| (w.worker_id(), w)).collect();
        let mut groups = Vec::new();
        let mut demand_total = BTreeMap::new();
        let configured: Vec<&str> = self.cfg.groups.iter().map(|g| g.name.as_str()).collect();
        for g in &self.cfg.groups {
            let dtype = attr(g, "device-type");
            let variant = attr(g, "device-variant");
            let region = attr(g, "region");
            let names = GroupNames {
                name: &g.name,
                device_type: &dtype,
                device_variant: &variant,
                region: &region,
            };
            if let (Some(policy), true) = (&g.autoscale, auto.enabled) {
                let empty = Default::default();
                let gs = auto.groups.get(&g.name).unwrap_or(&empty);
                demand_total.insert(g.name.clone(), gs.current_demand as i32);
                groups.push(autoscaled_status(names, policy, gs, &by_id, now));
                continue;
            }
            let template = g.worker(format!("{}-template", g.name));
            let demand = pending
                .iter()
                .filter(|s| crate::GroupCapacity::template_runs(&template, s))
                .count() as i32;
            demand_total.insert(g.name.clone(), demand);
            let members = by_group.get(&g.name).cloned().unwrap_or_default();
            groups.push(group_status(names, demand, &members));
        }
        // Groups that only worker daemons name (`iris worker serve --scale-group G`).
        for (name, members) in &by_group {
            if !configured.contains(&name.as_str()) {
                let names = GroupNames {
                    name,
                    device_type: "",
                    device_variant: "",
                    region: "",
                };
                groups.push(group_status(names, 0, members));
            }
        }
        Ok(c::GetAutoscalerStatusResponse {
            status: Some(vm::AutoscalerStatus {
                groups,
                current_demand: demand_total.into_iter().collect(),
                last_evaluation: Some(ts(if auto.enabled {
                    auto.last_evaluation_ms
                } else {
                    now
                })),
                recent_actions: auto.actions.iter().cloned().collect(),
                last_routing_decision: auto.routing.clone(),
            }),
        })
    }

    pub(crate) async fn get_worker_status(
        &self,
        req: c::GetWorkerStatusRequest,
    ) -> Result<c::GetWorkerStatusResponse> {
        let id = req.id.trim();
        if id.is_empty() {
            return Err(Error::invalid(
                "id: name a worker (or VM) id; `iris cluster vm status` lists them",
            ));
        }
        let conn = self.db();
        let workers = views::workers(&*conn)?;
        let Some(w) = workers.into_iter().find(|w| w.worker_id() == id) else {
            return Err(Error::not_found(format!(
                "worker {id} not found; `iris cluster vm status` lists the workers"
            )));
        };
        // `job_resources` reads through the controller's spec cache: a job's request is
        // decoded once however many of its attempts the worker ran.
        let recent_attempts = iris_store::views::worker_attempts(&*conn, id, RECENT_ATTEMPTS)?
            .into_iter()
            .map(|(task_id, a)| {
                let job_id = task_id.rsplit_once('/').map(|x| x.0).unwrap_or("");
                Ok(c::WorkerTaskAttempt {
                    resources: self.job_resources(&*conn, job_id)?,
                    attempt: Some(views::attempt(&a)),
                    task_id,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        drop(conn);
        Ok(c::GetWorkerStatusResponse {
            vm: Some(vm_of(&w)),
            scale_group: w.scale_group.clone().unwrap_or_default(),
            worker: Some(w),
            // Local workers and daemons are started by their cluster or supervisor, not
            // bootstrapped over SSH: there is no bootstrap log.
            bootstrap_logs: String::new(),
            recent_attempts,
        })
    }
}

fn ts(epoch_ms: i64) -> iris_proto::time::Timestamp {
    iris_proto::time::Timestamp {
        epoch_ms: Some(epoch_ms),
    }
}

/// A group's names as its status shows them.
struct GroupNames<'a> {
    name: &'a str,
    device_type: &'a str,
    device_variant: &'a str,
    region: &'a str,
}

/// Every slice state name the reference counts, with this group's counts.
fn state_counts<'a>(states: impl Iterator<Item = &'a str>) -> BTreeMap<String, i32> {
    let mut counts: BTreeMap<String, i32> =
        ["booting", "failed", "initializing", "ready", "requesting"]
            .into_iter()
            .map(|s| (s.to_string(), 0))
            .collect();
    for s in states {
        *counts.entry(s.to_string()).or_default() += 1;
    }
    counts
}

/// A group's status with every field the reference sends (zeros included); `availability`,
/// scaling times and failures are the caller's.
fn base_status(
    n: GroupNames<'_>,
    demand: i32,
    peak: i32,
    slices: Vec<vm::SliceInfo>,
) -> vm::ScaleGroupStatus {
    let counts = state_counts(slices.iter().map(|s| s.state()));
    vm::ScaleGroupStatus {
        name: Some(n.name.into()),
        backend_id: Some("default".into()),
        device_type: Some(n.device_type.into()),
        device_variant: Some(n.device_variant.into()),
        quota_pool: Some(String::new()),
        allocation_tier: Some(0),
        region: Some(n.region.into()),
        current_demand: Some(demand),
        peak_demand: Some(peak),
        backoff_until: Some(ts(0)),
        consecutive_failures: Some(0),
        last_scale_up: Some(ts(0)),
        last_scale_down: Some(ts(0)),
        slices,
        slice_state_counts: counts,
        availability_status: Some("available".into()),
        availability_reason: Some(String::new()),
        blocked_until: Some(ts(0)),
        scale_up_cooldown_until: Some(ts(0)),
        idle_threshold_ms: Some(0),
    }
}

fn group_status(
    n: GroupNames<'_>,
    demand: i32,
    members: &[&c::WorkerHealthStatus],
) -> vm::ScaleGroupStatus {
    let slices: Vec<vm::SliceInfo> = members.iter().map(|w| slice_of(w)).collect();
    base_status(n, demand, demand, slices)
}

/// A group the autoscaler runs, from its state: each slice with its workers as VMs.
fn autoscaled_status(
    n: GroupNames<'_>,
    policy: &iris_scheduler::autoscale::GroupPolicy,
    gs: &iris_scheduler::autoscale::GroupState,
    workers: &BTreeMap<&str, &c::WorkerHealthStatus>,
    now: i64,
) -> vm::ScaleGroupStatus {
    use iris_scheduler::autoscale::{availability, Lifecycle};
    let slices = gs
        .slices
        .iter()
        .map(|s| {
            let vms: Vec<vm::VmInfo> = s
                .workers
                .iter()
                .map(|id| {
                    let w = workers.get(id.as_str());
                    let healthy = w.is_some_and(|w| w.healthy());
                    vm::VmInfo {
                        vm_id: id.clone(),
                        state: match (s.lifecycle, healthy) {
                            (Lifecycle::Ready, true) => vm::VmState::Ready,
                            (Lifecycle::Ready, false) => vm::VmState::Unhealthy,
                            (Lifecycle::Booting, _) => vm::VmState::Booting,
                        } as i32,
                        created_at: Some(ts(s.created_at_ms)),
                        state_changed_at: Some(ts(s.created_at_ms)),
                        worker_id: id.clone(),
                        worker_healthy: healthy,
                        usability: if w.is_none() {
                            String::new()
                        } else if healthy {
                            "healthy".into()
                        } else {
                            "dead".into()
                        },
                        running_task_count: w.map(|w| w.running_job_ids.len() as i32).unwrap_or(0),
                        ..Default::default()
                    }
                })
                .collect();
            let busy = vms.iter().any(|v| v.running_task_count > 0);
            let idle = gs.is_idle(policy, s, now);
            let capacity = match s.lifecycle {
                Lifecycle::Booting => "",
                Lifecycle::Ready if vms.iter().any(|v| !v.worker_healthy) => "degraded",
                Lifecycle::Ready if busy => "in_use",
                Lifecycle::Ready if idle => "idle",
                Lifecycle::Ready => "available",
            };
            vm::SliceInfo {
                slice_id: Some(s.id.clone()),
                scale_group: Some(n.name.into()),
                created_at: Some(ts(s.created_at_ms)),
                vms,
                error_message: Some(String::new()),
                last_active: Some(ts(s.quiet_since_ms.unwrap_or(now))),
                idle: Some(idle),
                state: Some(s.lifecycle.as_str().into()),
                degraded_slot_count: Some(0),
                capacity_status: Some(capacity.into()),
            }
        })
        .collect();
    let a = availability(policy, gs, now);
    let mut st = base_status(n, gs.current_demand as i32, gs.peak_demand as i32, slices);
    st.backoff_until = Some(ts(gs.backoff_until_ms));
    st.consecutive_failures = Some(gs.consecutive_failures as i32);
    st.last_scale_up = Some(ts(gs.last_scale_up_ms));
    st.last_scale_down = Some(ts(gs.last_scale_down_ms));
    st.availability_status = Some(a.status.into());
    st.availability_reason = Some(a.reason);
    st.blocked_until = Some(ts(a.until_ms));
    st.idle_threshold_ms = Some(policy.idle_threshold_ms);
    st
}
