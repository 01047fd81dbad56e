//! In-process backends (Kubernetes): registering them, and the one place where the
//! `iris_backend` contract's domain types meet the wire.
//!
//! The trait and its data live in `iris-backend`; implementations live in their own crates and
//! are handed in with [`Controller::add_backend`]. This module turns a backend's
//! [`Registration`] into a placement target the scheduler sees (kept in memory: a backend has no
//! worker row, and `ListWorkers` lists worker daemons only), its [`Observation`]s into the
//! store's, its [`Summary`] into the wire `BackendSummary`, its errors into RPC errors, and a
//! desired set into the wire `DesiredAttempt`s a worker daemon receives.

use crate::{lock, Controller};
use iris_backend::{
    Backend, DesiredAttempt, Device, Intent, Observation, Registration, StopReason,
};
use iris_proto::cluster::controller as c;
use iris_proto::cluster::worker as w;
use iris_proto::job;
use iris_rpc::{Code, RpcError};
use iris_store::apply;
use std::sync::Arc;

impl Controller {
    /// Registers an in-process backend and starts reconciling it.
    pub async fn add_backend(&self, b: Arc<dyn Backend>) -> Result<(), RpcError> {
        let id = b.backend_id();
        lock(&self.backends).insert(id.clone(), b.clone());
        self.register_backend(&b).await.map_err(|e| e.to_wire())?;
        crate::reconcile::ensure_reconciler(self, &id);
        self.wake();
        Ok(())
    }

    /// Asks a backend for its registration and keeps it as the backend's placement target
    /// (in memory only: nothing about a backend's capacity needs to survive a restart, since a
    /// restarted controller asks again before it places anything there).
    pub(crate) async fn register_backend(&self, b: &Arc<dyn Backend>) -> crate::error::Result<()> {
        let reg = b.registration().await.map_err(rpc_error)?;
        let target = target_of(b.backend_id(), reg);
        lock(&self.backend_targets).insert(target.id.clone(), target);
        Ok(())
    }

    /// Every registered backend as the scheduler sees it: a pool that places work itself.
    pub(crate) fn backend_targets(&self) -> Vec<iris_scheduler::Worker> {
        lock(&self.backend_targets).values().cloned().collect()
    }

    pub(crate) fn backend(&self, worker_id: &str) -> Option<Arc<dyn Backend>> {
        lock(&self.backends).get(worker_id).cloned()
    }

    pub(crate) fn backend_list(&self) -> Vec<Arc<dyn Backend>> {
        lock(&self.backends).values().cloned().collect()
    }
}

/// A backend failure as text: its message and, after a colon, its cause.
pub(crate) fn error_text(e: &iris_backend::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// A backend failure as an RPC error: UNAVAILABLE when trying again may help, else
/// FAILED_PRECONDITION.
pub(crate) fn rpc_error(e: iris_backend::Error) -> RpcError {
    let code = if e.is_transient() {
        Code::Unavailable
    } else {
        Code::FailedPrecondition
    };
    RpcError::new(code, error_text(&e))
}

/// A backend's placement target: its registration read exactly as a worker's would be (the
/// same default attributes: `device-type`, `device-variant`, `preemptible`, `scale-group`),
/// marked pooled, so the scheduler lets it take whole gangs and leaves nodes to the backend.
fn target_of(id: String, reg: Registration) -> iris_scheduler::Worker {
    let (req, md) = register_request(id, reg);
    let r = crate::reconcile::registration_of(&req, &md);
    iris_scheduler::Worker {
        id: r.worker_id,
        total: r.total,
        attributes: r.attributes.into_iter().collect(),
        healthy: true,
        device_variant: iris_store::workers::scheduler_variant(&r.device_variant),
        pooled: true,
    }
}

/// A registration as a worker daemon would send it: the request (with the backend's id and no
/// address) and its metadata.
fn register_request(
    worker_id: String,
    reg: Registration,
) -> (c::RegisterRequest, job::WorkerMetadata) {
    let cap = &reg.capacity;
    let count = |n: i64| i32::try_from(n.max(0)).unwrap_or(i32::MAX);
    let device = match reg.device {
        Device::Cpu => None,
        Device::Gpu { variant } => Some(job::device_config::Device::Gpu(job::GpuDevice {
            variant,
            count: count(cap.gpu),
        })),
        Device::Tpu { variant } => Some(job::device_config::Device::Tpu(job::TpuDevice {
            variant,
            count: count(cap.tpu),
            ..Default::default()
        })),
    };
    let md = job::WorkerMetadata {
        hostname: Some(reg.hostname),
        cpu_count: Some(count(cap.cpu_millicores / 1000)),
        memory_bytes: Some(cap.memory_bytes),
        disk_bytes: Some(cap.disk_bytes),
        device: device.map(|d| job::DeviceConfig { device: Some(d) }),
        attributes: reg
            .attributes
            .iter()
            .map(|(k, v)| (k.clone(), crate::spec::attr_to_proto(v)))
            .collect(),
        ..Default::default()
    };
    let req = c::RegisterRequest {
        address: String::new(),
        worker_id,
        slice_id: String::new(),
        scale_group: reg.scale_group,
        metadata: Some(md.clone()),
    };
    (req, md)
}

/// A backend's observation as the store applies it. An ended attempt reported without an exit
/// code is recorded as 0, as a worker's report (where the field is not optional) would be.
pub(crate) fn store_observation(o: Observation) -> apply::Observation {
    apply::Observation {
        exit_code: o.state.is_terminal().then(|| o.exit_code.unwrap_or(0)),
        attempt_uid: o.attempt_uid,
        state: o.state,
        error: o.error,
        status_message: o.status_message,
        // Backends name no container (the reference's Kubernetes backend reports none either).
        container_id: String::new(),
    }
}

/// A desired attempt as a worker daemon receives it.
pub(crate) fn desired_to_wire(d: DesiredAttempt) -> w::DesiredAttempt {
    use w::desired_attempt::Intent as WIntent;
    let intent = match d.intent {
        Intent::Run { launch } => WIntent::Run(w::AttemptSpec {
            request: launch.map(|r| *r),
        }),
        Intent::Stop(reason) => WIntent::Stop(match reason {
            StopReason::Cancelled => w::StopReason::Cancelled,
            StopReason::Preempted => w::StopReason::Preempted,
            StopReason::Superseded => w::StopReason::Superseded,
            StopReason::JobTerminated => w::StopReason::JobTerminated,
            StopReason::TaskTimeout => w::StopReason::TaskTimeout,
        } as i32),
    };
    w::DesiredAttempt {
        attempt_uid: d.attempt_uid,
        intent: Some(intent),
    }
}

/// A backend's `ListBackends` entry.
pub(crate) async fn summary(b: &dyn Backend) -> Result<c::BackendSummary, RpcError> {
    let s = b.summary().await.map_err(rpc_error)?;
    Ok(summary_to_wire(b.backend_id(), s))
}

fn summary_to_wire(id: String, s: iris_backend::Summary) -> c::BackendSummary {
    let n = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    let detail = s.detail.map(|d| match d {
        iris_backend::Detail::Kubernetes(k) => {
            c::backend_status::Detail::Kubernetes(c::GetKubernetesClusterStatusResponse {
                namespace: k.namespace,
                total_nodes: n(k.total_nodes),
                schedulable_nodes: n(k.schedulable_nodes),
                allocatable_cpu: k.allocatable_cpu,
                allocatable_memory: k.allocatable_memory,
                pod_statuses: k
                    .pods
                    .into_iter()
                    .map(|p| c::KubernetesPodStatus {
                        pod_name: p.pod_name,
                        task_id: p.task_id,
                        phase: p.phase,
                        reason: p.reason,
                        message: p.message,
                        last_transition: None,
                        node_name: p.node_name,
                    })
                    .collect(),
                provider_version: k.provider_version,
                node_pools: Vec::new(),
                nodes: k
                    .nodes
                    .into_iter()
                    .map(|node| c::NodeStatus {
                        status_summary: if node.ready { "Ready" } else { "NotReady" }.into(),
                        name: node.name,
                        ready: node.ready,
                        schedulable: node.schedulable,
                        instance_type: node.instance_type,
                        region: String::new(),
                        gpu_count: n(node.gpu_count),
                        gpu_model: node.gpu_model,
                        cpu_millicores: node.cpu_millicores,
                        memory_bytes: node.memory_bytes,
                        disk_bytes: node.disk_bytes,
                        running_pods: n(node.running_pods),
                        created: String::new(),
                    })
                    .collect(),
            })
        }
    });
    c::BackendSummary {
        backend_id: id.clone(),
        name: id,
        kind: s.kind,
        capabilities: s.capabilities,
        advertised_attributes: s
            .advertised
            .into_iter()
            .map(|(k, values)| (k, iris_proto::cluster::StringList { values }))
            .collect(),
        scale_groups: s.scale_groups,
        worker_count: n(s.worker_count),
        pending_task_count: n(s.pending_tasks),
        running_task_count: n(s.running_tasks),
        has_autoscaler: false,
        capacity_health: Default::default(),
        detail: detail.map(|d| c::BackendStatus { detail: Some(d) }),
        availability: s.availability.map(|a| c::ResourceAvailability {
            version: iris_federation::AVAILABILITY_VERSION,
            observation_epoch_ms: a.observed_at_ms,
            amounts: a.free,
            total_amounts: a.total,
            held_by_band: a
                .held_by_band
                .into_iter()
                .map(|(band, amounts)| c::BandCapacity {
                    band: band.code(),
                    amounts,
                })
                .collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_types::{AttrValue, Resources, TaskState};
    use std::collections::BTreeMap;

    #[test]
    fn registration_becomes_the_request_a_worker_would_send() {
        let reg = Registration {
            hostname: "kubernetes/iris".into(),
            capacity: Resources {
                cpu_millicores: 1_000_000_000,
                memory_bytes: 1 << 60,
                disk_bytes: 1 << 60,
                gpu: 1_000_000,
                tpu: 0,
            },
            device: Device::Gpu {
                variant: "H100".into(),
            },
            attributes: BTreeMap::from([("backend".to_string(), AttrValue::from("kubernetes"))]),
            scale_group: "kubernetes".into(),
        };
        let (req, md) = register_request("k8s-h100".into(), reg);
        assert_eq!(req.worker_id, "k8s-h100");
        assert_eq!(req.address, "");
        assert_eq!(req.scale_group, "kubernetes");
        assert_eq!(req.metadata.as_ref(), Some(&md));
        assert_eq!(md.cpu_count, Some(1_000_000));
        assert_eq!(md.memory_bytes, Some(1 << 60));
        assert_eq!(
            md.device.and_then(|d| d.device),
            Some(job::device_config::Device::Gpu(job::GpuDevice {
                variant: "H100".into(),
                count: 1_000_000
            }))
        );
        assert_eq!(
            md.attributes.get("backend"),
            Some(&crate::spec::attr_to_proto(&AttrValue::from("kubernetes")))
        );
    }

    #[test]
    fn a_backend_is_a_pooled_target_with_the_attributes_every_worker_has() {
        let reg = Registration {
            hostname: "kubernetes/iris".into(),
            capacity: Resources {
                cpu_millicores: 64_000,
                memory_bytes: 1 << 40,
                disk_bytes: 1 << 40,
                gpu: 1_000_000,
                tpu: 0,
            },
            device: Device::Gpu {
                variant: "H100".into(),
            },
            attributes: BTreeMap::new(),
            scale_group: "kubernetes".into(),
        };
        let t = target_of("k8s-h100".into(), reg);
        assert_eq!(t.id, "k8s-h100");
        assert!(t.pooled && t.healthy);
        assert_eq!(t.device_variant, "h100");
        assert_eq!(t.total.gpu, 1_000_000);
        assert_eq!(t.total.cpu_millicores, 64_000);
        let attr = |k: &str| t.attributes.get(k).cloned();
        assert_eq!(attr("device-type"), Some(AttrValue::from("gpu")));
        assert_eq!(attr("device-variant"), Some(AttrValue::from("h100")));
        assert_eq!(attr("preemptible"), Some(AttrValue::from("false")));
        assert_eq!(attr("scale-group"), Some(AttrValue::from("kubernetes")));
    }

    #[test]
    fn ended_attempts_always_carry_an_exit_code() {
        let mut o = Observation::new("u", TaskState::Killed);
        assert_eq!(store_observation(o.clone()).exit_code, Some(0));
        o.exit_code = Some(-1);
        o.state = TaskState::Failed;
        assert_eq!(store_observation(o.clone()).exit_code, Some(-1));
        o.state = TaskState::Running;
        assert_eq!(store_observation(o).exit_code, None);
    }

    #[test]
    fn transient_failures_are_unavailable() {
        let e = iris_backend::Error::transient("kubernetes: listing nodes")
            .caused_by(std::io::Error::other("connection refused"));
        let r = rpc_error(e);
        assert_eq!(r.code, Code::Unavailable);
        assert_eq!(r.message, "kubernetes: listing nodes: connection refused");
        let r = rpc_error(iris_backend::Error::permanent("no"));
        assert_eq!(r.code, Code::FailedPrecondition);
    }
}
