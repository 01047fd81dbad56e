//! GPU capacity and node summaries of a Kubernetes backend (reference §3.7).
//!
//! Total GPUs are the nodes' allocatable `nvidia.com/gpu`. A pod holds its GPUs once Kueue has
//! admitted it — it has no `spec.schedulingGates` — and until it ends, whether or not it is
//! bound yet; gated (queued) pods hold nothing. Held GPUs are attributed to the band whose
//! PriorityClass the pod carries; a pod with an unknown class still counts as held.
//!
//! The controller reports these numbers keyed by the cluster's GPU variant, and only when the
//! cluster advertises exactly one; that choice is the caller's.

use iris_types::Band;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::manifest::{ProviderConfig, GPU_RESOURCE};

/// Node labels naming the GPU model, most specific first.
pub const GPU_MODEL_LABELS: [&str; 2] = ["nvidia.com/gpu.product", "gpu.nvidia.com/model"];
/// Node label naming the instance type.
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

/// Taints Iris GPU pods tolerate, so they do not make a GPU node unschedulable for Iris.
const TOLERATED_GPU_TAINTS: [&str; 2] = [GPU_RESOURCE, "qos.coreweave.cloud/interruptable"];

/// One node, as the backend reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSummary {
    /// Node name.
    pub name: String,
    /// `Ready=True`.
    pub ready: bool,
    /// Not cordoned and without a NoSchedule/NoExecute taint Iris pods do not tolerate.
    pub schedulable: bool,
    /// Allocatable `nvidia.com/gpu`.
    pub gpu_count: u32,
    /// GPU model label, if any.
    pub gpu_model: Option<String>,
    /// Instance type label, if any.
    pub instance_type: Option<String>,
    /// Allocatable CPU in millicores.
    pub allocatable_cpu_millicores: u64,
    /// Allocatable memory in bytes.
    pub allocatable_memory_bytes: u64,
    /// Allocatable ephemeral storage in bytes.
    pub allocatable_disk_bytes: u64,
    /// Pods bound to the node in phase Running.
    pub running_pods: u32,
}

/// The backend's capacity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Σ allocatable GPUs.
    pub total_gpus: u64,
    /// GPUs requested by admitted, non-terminal pods.
    pub held_gpus: u64,
    /// `max(0, total − held)`.
    pub free_gpus: u64,
    /// Held GPUs per band, highest band first, bands holding none left out.
    pub held_by_band: Vec<(Band, u64)>,
    /// Every node, sorted by name.
    pub nodes: Vec<NodeSummary>,
    /// Nodes that are schedulable.
    pub schedulable_nodes: u32,
    /// Σ allocatable CPU in millicores.
    pub allocatable_cpu_millicores: u64,
    /// Σ allocatable memory in bytes.
    pub allocatable_memory_bytes: u64,
}

/// Parses a Kubernetes quantity (`500m`, `4`, `1.5`, `16Gi`, `1e3`, `128974848k`) to a number
/// in base units. `None` for malformed input.
pub fn parse_quantity(q: &str) -> Option<f64> {
    const SUFFIXES: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1_048_576.0),
        ("Gi", 1_073_741_824.0),
        ("Ti", 1_099_511_627_776.0),
        ("Pi", 1_125_899_906_842_624.0),
        ("Ei", 1_152_921_504_606_846_976.0),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let q = q.trim();
    let (num, scale) = SUFFIXES
        .iter()
        .find_map(|(suffix, scale)| q.strip_suffix(suffix).map(|n| (n, *scale)))
        .unwrap_or((q, 1.0));
    // Only digits, a sign, a point and a decimal exponent may remain.
    if num.is_empty()
        || !num
            .chars()
            .all(|c| c.is_ascii_digit() || "+-.eE".contains(c))
    {
        return None;
    }
    let value: f64 = num.parse().ok()?;
    value.is_finite().then_some(value * scale)
}

fn quantity(map: Option<&std::collections::BTreeMap<String, Quantity>>, key: &str) -> f64 {
    map.and_then(|m| m.get(key))
        .and_then(|q| parse_quantity(&q.0))
        .unwrap_or(0.0)
        .max(0.0)
}

/// A non-negative whole count from a quantity (GPUs, bytes), rounding up fractions.
fn whole(v: f64) -> u64 {
    // Float-to-int `as` saturates, which is what we want for absurd inputs.
    v.ceil() as u64
}

/// GPUs a pod requests: per container the request, else the limit (limits imply requests).
pub fn pod_gpu_request(pod: &Pod) -> u64 {
    pod.spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| {
                    let res = c.resources.as_ref();
                    let req = quantity(res.and_then(|r| r.requests.as_ref()), GPU_RESOURCE);
                    let v = if req > 0.0 {
                        req
                    } else {
                        quantity(res.and_then(|r| r.limits.as_ref()), GPU_RESOURCE)
                    };
                    whole(v)
                })
                .sum()
        })
        .unwrap_or(0)
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Not Succeeded or Failed.
fn is_live(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed")
}

/// Admitted by Kueue: no scheduling gates left.
fn is_admitted(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_none_or(|g| g.is_empty())
}

fn summarize(node: &Node, pods: &[Pod]) -> NodeSummary {
    let name = node.metadata.name.clone().unwrap_or_default();
    let labels = node.metadata.labels.as_ref();
    let label = |k: &str| {
        labels
            .and_then(|l| l.get(k))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let status = node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let allocatable = status.and_then(|s| s.allocatable.as_ref());
    let gpu_count = u32::try_from(whole(quantity(allocatable, GPU_RESOURCE))).unwrap_or(u32::MAX);
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let blocking_taint = spec.and_then(|s| s.taints.as_ref()).is_some_and(|taints| {
        taints.iter().any(|t| {
            matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
                && !(gpu_count > 0 && TOLERATED_GPU_TAINTS.contains(&t.key.as_str()))
        })
    });
    let running_pods = pods
        .iter()
        .filter(|p| {
            phase(p) == "Running"
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str())
        })
        .count();
    NodeSummary {
        ready,
        schedulable: !cordoned && !blocking_taint,
        gpu_count,
        gpu_model: GPU_MODEL_LABELS.iter().find_map(|k| label(k)),
        instance_type: label(INSTANCE_TYPE_LABEL),
        allocatable_cpu_millicores: whole(quantity(allocatable, "cpu") * 1000.0),
        allocatable_memory_bytes: whole(quantity(allocatable, "memory")),
        allocatable_disk_bytes: whole(quantity(allocatable, "ephemeral-storage")),
        running_pods: u32::try_from(running_pods).unwrap_or(u32::MAX),
        name,
    }
}

/// Capacity of the cluster from its nodes and pods. `config` maps PriorityClass names back to
/// bands (its overrides, else the `iris-<band>` defaults).
pub fn capacity(config: &ProviderConfig, nodes: &[Node], pods: &[Pod]) -> Capacity {
    let mut summaries: Vec<NodeSummary> = nodes.iter().map(|n| summarize(n, pods)).collect();
    summaries.sort_by(|a, b| a.name.cmp(&b.name));

    let mut by_band = [0u64; Band::ALL.len()];
    let mut held = 0u64;
    for pod in pods.iter().filter(|p| is_live(p) && is_admitted(p)) {
        let gpus = pod_gpu_request(pod);
        if gpus == 0 {
            continue;
        }
        held = held.saturating_add(gpus);
        let band = pod
            .spec
            .as_ref()
            .and_then(|s| s.priority_class_name.as_deref())
            .and_then(|c| config.band_for_priority_class(c));
        if let Some(band) = band {
            if let Some(slot) = Band::ALL.iter().position(|b| *b == band) {
                by_band[slot] = by_band[slot].saturating_add(gpus);
            }
        }
    }
    let total: u64 = summaries.iter().map(|n| u64::from(n.gpu_count)).sum();
    Capacity {
        total_gpus: total,
        held_gpus: held,
        free_gpus: total.saturating_sub(held),
        held_by_band: Band::ALL
            .into_iter()
            .zip(by_band)
            .filter(|(_, n)| *n > 0)
            .collect(),
        schedulable_nodes: u32::try_from(summaries.iter().filter(|n| n.schedulable).count())
            .unwrap_or(u32::MAX),
        allocatable_cpu_millicores: summaries.iter().map(|n| n.allocatable_cpu_millicores).sum(),
        allocatable_memory_bytes: summaries.iter().map(|n| n.allocatable_memory_bytes).sum(),
        nodes: summaries,
    }
}

/// `<x.y> cores`, as the cluster status shows allocatable CPU.
pub fn format_cores(millicores: u64) -> String {
    // Exact integer arithmetic, rounded half up to one decimal.
    let tenths = (millicores + 50) / 100;
    format!("{}.{} cores", tenths / 10, tenths % 10)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, NodeCondition, NodeSpec, NodeStatus, PodSchedulingGate, PodSpec, PodStatus,
        ResourceRequirements, Taint,
    };
    use std::collections::BTreeMap;

    fn node(name: &str, gpus: &str, ready: bool) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(BTreeMap::from([
            (
                "nvidia.com/gpu.product".to_string(),
                "NVIDIA-H100-80GB-HBM3".to_string(),
            ),
            (
                INSTANCE_TYPE_LABEL.to_string(),
                "gd-8xh100ib-i128".to_string(),
            ),
        ]));
        n.status = Some(NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("127500m".into())),
                ("memory".to_string(), Quantity("2Ti".into())),
                (GPU_RESOURCE.to_string(), Quantity(gpus.into())),
            ])),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        n.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: GPU_RESOURCE.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        n
    }

    fn gpu_pod(gpus: &str, class: &str, phase: &str, gated: bool, node: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "task".into(),
                    resources: Some(ResourceRequirements {
                        limits: Some(BTreeMap::from([(
                            GPU_RESOURCE.to_string(),
                            Quantity(gpus.into()),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                priority_class_name: Some(class.into()),
                scheduling_gates: gated.then(|| {
                    vec![PodSchedulingGate {
                        name: "kueue.x-k8s.io/admission".into(),
                    }]
                }),
                node_name: node.map(str::to_string),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("4"), Some(4.0));
        assert_eq!(
            parse_quantity("16Gi"),
            Some(16.0 * 1024.0 * 1024.0 * 1024.0)
        );
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("128974848k"), Some(128_974_848_000.0));
        assert_eq!(parse_quantity("1.5"), Some(1.5));
        assert_eq!(parse_quantity("12Q"), None);
        assert_eq!(parse_quantity(""), None);
        assert_eq!(parse_quantity("2E"), Some(2e18));
        assert_eq!(parse_quantity("1Ei"), Some(1_152_921_504_606_846_976.0));
        assert_eq!(parse_quantity("inf"), None);
    }

    #[test]
    fn held_free_and_by_band() {
        let cfg = ProviderConfig::default();
        let nodes = vec![node("b", "8", true), node("a", "8", false)];
        let pods = vec![
            gpu_pod("8", "iris-production", "Running", false, Some("a")),
            gpu_pod("2", "iris-batch", "Pending", false, None), // admitted, not bound yet
            gpu_pod("4", "iris-batch", "Pending", true, None),  // gated: holds nothing
            gpu_pod("1", "iris-interactive", "Succeeded", false, Some("b")), // ended
            gpu_pod("1", "someone-elses", "Running", false, Some("b")), // held, not attributed
        ];
        let c = capacity(&cfg, &nodes, &pods);
        assert_eq!(c.total_gpus, 16);
        assert_eq!(c.held_gpus, 11);
        assert_eq!(c.free_gpus, 5);
        assert_eq!(
            c.held_by_band,
            vec![(Band::Production, 8), (Band::Batch, 2)]
        );
        let names: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, vec!["a", "b"]);
        let a = &c.nodes[0];
        assert!(!a.ready);
        assert!(a.schedulable, "the GPU taint is tolerated by Iris GPU pods");
        assert_eq!(a.gpu_count, 8);
        assert_eq!(a.gpu_model.as_deref(), Some("NVIDIA-H100-80GB-HBM3"));
        assert_eq!(a.instance_type.as_deref(), Some("gd-8xh100ib-i128"));
        assert_eq!(a.allocatable_cpu_millicores, 127_500);
        assert_eq!(a.allocatable_memory_bytes, 2 << 40);
        assert_eq!(a.running_pods, 1);
        assert_eq!(c.nodes[1].running_pods, 1);
        assert_eq!(c.schedulable_nodes, 2);
        assert_eq!(format_cores(c.allocatable_cpu_millicores), "255.0 cores");
    }

    #[test]
    fn oversubscription_never_goes_negative() {
        let c = capacity(
            &ProviderConfig::default(),
            &[node("a", "4", true)],
            &[gpu_pod("8", "iris-batch", "Running", false, Some("a"))],
        );
        assert_eq!((c.total_gpus, c.held_gpus, c.free_gpus), (4, 8, 0));
    }

    #[test]
    fn cordoned_or_tainted_nodes_are_unschedulable() {
        let mut cordoned = node("a", "8", true);
        if let Some(s) = cordoned.spec.as_mut() {
            s.unschedulable = Some(true);
        }
        let mut cpu = node("b", "0", true);
        if let Some(s) = cpu.spec.as_mut() {
            s.taints = Some(vec![Taint {
                key: "node.kubernetes.io/disk-pressure".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]);
        }
        let c = capacity(&ProviderConfig::default(), &[cordoned, cpu], &[]);
        assert!(c.nodes.iter().all(|n| !n.schedulable));
        assert_eq!(c.schedulable_nodes, 0);
    }

    #[test]
    fn priority_class_overrides_attribute_bands() {
        let mut cfg = ProviderConfig::default();
        cfg.priority_classes.insert("batch".into(), "cw-low".into());
        let c = capacity(
            &cfg,
            &[node("a", "8", true)],
            &[gpu_pod("3", "cw-low", "Running", false, Some("a"))],
        );
        assert_eq!(c.held_by_band, vec![(Band::Batch, 3)]);
    }

    #[test]
    fn cores_format() {
        assert_eq!(format_cores(0), "0.0 cores");
        assert_eq!(format_cores(1_250), "1.3 cores");
        assert_eq!(format_cores(3_500), "3.5 cores");
    }
}
