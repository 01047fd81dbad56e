//! What a device lane tells the controller about itself: its registration (effectively
//! unbounded capacity, since Kueue owns placement) and its summary for `ListBackends` (GPU
//! availability by band, nodes, and its pods).

use crate::pods::phase;
use crate::{now_ms, unavailable, KubeBackend};
use iris_backend::{
    Availability, Detail, Device, Error, KubernetesStatus, NodeStatus, PodStatus, Registration,
    Summary,
};
use iris_kube_model as km;
use iris_types::{AttrValue, Resources};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use std::collections::BTreeMap;

impl KubeBackend {
    pub(crate) fn registration_now(&self) -> Registration {
        // Kueue owns placement: the lane never runs out, so every pending task becomes an
        // attempt (a Pod) at once and waits, if it must, in Kueue's queue.
        let mut attributes: BTreeMap<String, AttrValue> = BTreeMap::new();
        for key in [
            "leafgroup",
            "nvlink.domain",
            "nvlink.domain.preferred",
            "nvlink.domain.sliced",
            km::topology::LABEL_LEAFGROUP,
            km::topology::LABEL_NVLINK_DOMAIN,
            km::topology::LABEL_HOSTNAME,
        ] {
            attributes.insert(key.into(), AttrValue::from("kueue"));
        }
        attributes.insert("backend".into(), AttrValue::from("kubernetes"));
        let (device, gpu) = match &self.variant {
            Some(v) => (Device::Gpu { variant: v.clone() }, 1_000_000),
            None => (Device::Cpu, 0),
        };
        Registration {
            hostname: format!("kubernetes/{}", self.core.settings.provider.namespace),
            capacity: Resources {
                cpu_millicores: 1_000_000 * 1000,
                memory_bytes: 1 << 60,
                disk_bytes: 1 << 60,
                gpu,
                tpu: 0,
            },
            device,
            attributes,
            scale_group: "kubernetes".into(),
        }
    }

    pub(crate) async fn summary_now(&self) -> Result<Summary, Error> {
        let core = &self.core;
        let nodes: Api<Node> = Api::all(core.client.clone());
        let nodes = nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| unavailable("listing nodes", e))?
            .items;
        let pods: Vec<Pod> = core
            .pod_store
            .state()
            .iter()
            .map(|p| p.as_ref().clone())
            .collect();
        let cap = km::capacity::capacity(&core.settings.provider, &nodes, &pods);
        let mut advertised: BTreeMap<String, Vec<String>> = BTreeMap::new();
        advertised.insert("preemptible".into(), vec!["false".into()]);
        match &self.variant {
            Some(v) => {
                advertised.insert("device-type".into(), vec!["gpu".into()]);
                advertised.insert("device-variant".into(), vec![v.to_lowercase()]);
                advertised.insert(
                    format!("availability:{}", v.to_lowercase()),
                    vec!["true".into()],
                );
            }
            None => {
                advertised.insert("device-type".into(), vec!["cpu".into()]);
            }
        }
        let availability = self.variant.as_ref().map(|v| {
            let token = v.to_lowercase();
            let of =
                |n: u64| BTreeMap::from([(token.clone(), i64::try_from(n).unwrap_or(i64::MAX))]);
            Availability {
                observed_at_ms: now_ms(),
                free: of(cap.free_gpus),
                total: of(cap.total_gpus),
                held_by_band: cap.held_by_band.iter().map(|(b, n)| (*b, of(*n))).collect(),
            }
        });
        let mine = self.pods_of_this_backend();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let running = count(mine.iter().filter(|p| phase(p) == "Running").count());
        let pending = count(mine.iter().filter(|p| phase(p) == "Pending").count());
        let status = KubernetesStatus {
            namespace: core.settings.provider.namespace.clone(),
            total_nodes: count(cap.nodes.len()),
            schedulable_nodes: cap.schedulable_nodes,
            allocatable_cpu: km::capacity::format_cores(cap.allocatable_cpu_millicores),
            allocatable_memory: format!(
                "{:.1} GiB",
                cap.allocatable_memory_bytes as f64 / (1u64 << 30) as f64
            ),
            pods: mine
                .iter()
                .map(|p| {
                    let o = km::status::observe(p, None);
                    PodStatus {
                        pod_name: p.metadata.name.clone().unwrap_or_default(),
                        task_id: p
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(km::manifest::ANNOTATION_TASK_ID))
                            .cloned()
                            .unwrap_or_default(),
                        phase: phase(p).to_string(),
                        reason: o.error.clone().unwrap_or_default(),
                        message: o.status_message.clone(),
                        node_name: o.node_name.clone().unwrap_or_default(),
                    }
                })
                .collect(),
            provider_version: "iris-kubernetes/v1".into(),
            nodes: cap
                .nodes
                .iter()
                .map(|n| NodeStatus {
                    name: n.name.clone(),
                    ready: n.ready,
                    schedulable: n.schedulable,
                    instance_type: n.instance_type.clone().unwrap_or_default(),
                    gpu_count: n.gpu_count,
                    gpu_model: n.gpu_model.clone().unwrap_or_default(),
                    cpu_millicores: n.allocatable_cpu_millicores as i64,
                    memory_bytes: n.allocatable_memory_bytes as i64,
                    disk_bytes: n.allocatable_disk_bytes as i64,
                    running_pods: n.running_pods,
                })
                .collect(),
        };
        Ok(Summary {
            kind: "kubernetes".into(),
            capabilities: vec!["DIRECT_DISPATCH".into()],
            advertised,
            scale_groups: core.settings.scale_groups.clone(),
            worker_count: count(cap.nodes.len()),
            pending_tasks: pending,
            running_tasks: running,
            availability,
            detail: Some(Detail::Kubernetes(status)),
        })
    }
}
