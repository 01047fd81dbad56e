//! `GetAutoscalerStatus` and `GetWorkerStatus`: the scale groups and the workers of each, as the
//! published `cluster status`, `cluster vm status` and `cluster vm logs` read them.
//!
//! This controller scales nothing by itself: a local cluster starts `num_vms` workers per group
//! and worker daemons join a group by `--scale-group`. So each group reports the workers it has
//! (one slice per worker, one VM per slice: a local worker is its own host), its demand (the
//! pending tasks that one of its workers could run, by resources and constraints), and no
//! scaling actions.

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
    vm::SliceInfo {
        slice_id: w.worker_id().to_owned(),
        scale_group: w.scale_group().to_owned(),
        vms: vec![vm_of(w)],
        last_active: w.last_heartbeat,
        idle: w.running_job_ids.is_empty(),
        state: if healthy { "ready" } else { "failed" }.into(),
        error_message: if healthy {
            String::new()
        } else {
            w.status_message().to_owned()
        },
        ..Default::default()
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
        let conn = self.db();
        let workers = views::workers(&*conn)?;
        // The pending tasks' requirements, one entry per task.
        let mut pending = Vec::new();
        for w in iris_store::snapshot::waiting(&*conn)? {
            if let Some(spec) = self.spec(&*conn, &w.job_id)? {
                pending.push(spec);
            }
        }
        drop(conn);
        let mut by_group: BTreeMap<String, Vec<&c::WorkerHealthStatus>> = BTreeMap::new();
        for w in &workers {
            if !w.scale_group().is_empty() && !crate::backend::is_inproc_address(w.address()) {
                by_group
                    .entry(w.scale_group.clone().unwrap_or_default())
                    .or_default()
                    .push(w);
            }
        }
        let mut groups = Vec::new();
        let mut demand_total = BTreeMap::new();
        let configured: Vec<&str> = self.cfg.groups.iter().map(|g| g.name.as_str()).collect();
        for g in &self.cfg.groups {
            let template = [g.worker(format!("{}-template", g.name))];
            let demand = pending
                .iter()
                .filter(|s| {
                    iris_scheduler::feasible_anywhere(
                        &s.resources,
                        &s.constraints,
                        None,
                        1,
                        &template,
                    )
                    .is_ok()
                })
                .count() as i32;
            demand_total.insert(g.name.clone(), demand);
            let members = by_group.get(&g.name).cloned().unwrap_or_default();
            groups.push(group_status(
                &g.name,
                &attr(g, "device-type"),
                &attr(g, "device-variant"),
                &attr(g, "region"),
                demand,
                &members,
            ));
        }
        // Groups that only worker daemons name (`iris worker serve --scale-group G`).
        for (name, members) in &by_group {
            if !configured.contains(&name.as_str()) {
                groups.push(group_status(name, "", "", "", 0, members));
            }
        }
        Ok(c::GetAutoscalerStatusResponse {
            status: Some(vm::AutoscalerStatus {
                groups,
                current_demand: demand_total.into_iter().collect(),
                last_evaluation: Some(iris_proto::time::Timestamp {
                    epoch_ms: iris_store::now_ms(),
                }),
                ..Default::default()
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

fn group_status(
    name: &str,
    device_type: &str,
    device_variant: &str,
    region: &str,
    demand: i32,
    members: &[&c::WorkerHealthStatus],
) -> vm::ScaleGroupStatus {
    let slices: Vec<vm::SliceInfo> = members.iter().map(|w| slice_of(w)).collect();
    let mut counts: BTreeMap<String, i32> = BTreeMap::new();
    for s in &slices {
        *counts.entry(s.state.clone()).or_default() += 1;
    }
    vm::ScaleGroupStatus {
        name: name.into(),
        backend_id: "default".into(),
        device_type: device_type.into(),
        device_variant: device_variant.into(),
        region: region.into(),
        current_demand: demand,
        peak_demand: demand,
        slices,
        slice_state_counts: counts.into_iter().collect(),
        availability_status: "available".into(),
        ..Default::default()
    }
}
