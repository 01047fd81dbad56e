//! The task container's resource requests and limits: CPU, memory, GPUs (with RDMA on host
//! networking) and ephemeral disk.

use super::input::{PodInput, ProviderConfig};
use super::{GIB, GPU_RESOURCE, RDMA_RESOURCE};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// Requests and limits (§3.2): CPU as a request only, memory as both, GPUs (and `rdma/ib` with
/// host networking) as limits, disk as whole GiB (at least 1) both ways.
pub(super) fn resources(input: &PodInput, config: &ProviderConfig) -> Option<ResourceRequirements> {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    if input.cpu_millicores > 0 {
        requests.insert(
            "cpu".to_string(),
            Quantity(format!("{}m", input.cpu_millicores)),
        );
    }
    if input.memory_bytes > 0 {
        let q = Quantity(input.memory_bytes.to_string());
        requests.insert("memory".to_string(), q.clone());
        limits.insert("memory".to_string(), q);
    }
    if input.gpu_count > 0 {
        let q = Quantity(input.gpu_count.to_string());
        if config.host_network {
            limits.insert(RDMA_RESOURCE.to_string(), q.clone());
        }
        limits.insert(GPU_RESOURCE.to_string(), q);
    }
    if input.disk_bytes > 0 {
        let q = Quantity(format!("{}Gi", (input.disk_bytes / GIB).max(1)));
        requests.insert("ephemeral-storage".to_string(), q.clone());
        limits.insert("ephemeral-storage".to_string(), q);
    }
    if requests.is_empty() && limits.is_empty() {
        return None;
    }
    Some(ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..Default::default()
    })
}
