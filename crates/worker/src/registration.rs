//! Registration with the controller: the worker's advertised metadata (resources, device,
//! attributes), `Register` retried until accepted, and the watchdog that abandons every attempt
//! and re-registers when no reconcile arrives within the heartbeat timeout.

use crate::attempt::abandon_all;
use crate::{lock, Inner, WorkerConfig};
use iris_proto::cluster::controller as c;
use iris_proto::job;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) fn metadata(cfg: &WorkerConfig, ip_address: &str) -> job::WorkerMetadata {
    use job::device_config::Device;
    let device = match &cfg.device {
        Some((t, v, n)) if t == "gpu" => Device::Gpu(job::GpuDevice {
            variant: v.clone(),
            count: *n,
        }),
        Some((t, v, n)) if t == "tpu" => Device::Tpu(job::TpuDevice {
            variant: v.clone(),
            topology: String::new(),
            count: *n,
        }),
        _ => Device::Cpu(job::CpuDevice {
            variant: "cpu".into(),
        }),
    };
    let attributes = cfg
        .attributes
        .iter()
        .map(|(k, v)| {
            let value = match v.parse::<i64>() {
                Ok(i) if k != "region" && k != "zone" => job::attribute_value::Value::IntValue(i),
                _ => job::attribute_value::Value::StringValue(v.clone()),
            };
            (k.clone(), job::AttributeValue { value: Some(value) })
        })
        .collect();
    job::WorkerMetadata {
        hostname: Some("localhost".into()),
        ip_address: Some(ip_address.to_string()),
        cpu_count: Some(cfg.cpu_count),
        memory_bytes: Some(cfg.memory_bytes),
        disk_bytes: Some(cfg.disk_bytes),
        gpu_count: Some(
            cfg.device
                .as_ref()
                .filter(|d| d.0 == "gpu")
                .map(|d| d.2)
                .unwrap_or(0),
        ),
        gpu_name: Some(
            cfg.device
                .as_ref()
                .filter(|d| d.0 == "gpu")
                .map(|d| d.1.clone())
                .unwrap_or_default(),
        ),
        device: Some(job::DeviceConfig {
            device: Some(device),
        }),
        attributes,
        // A process worker is no cloud VM and no TPU host: those facts are empty, as the
        // published worker reports them on a local platform.
        tpu_name: Some(String::new()),
        tpu_worker_hostnames: Some(String::new()),
        tpu_worker_id: Some(String::new()),
        tpu_chips_per_host_bounds: Some(String::new()),
        gpu_memory_mb: Some(0),
        gce_instance_name: Some(String::new()),
        gce_zone: Some(String::new()),
        provenance: Some(iris_proto::build_provenance()),
    }
}

async fn register_once(inner: &Inner, addr: SocketAddr) -> bool {
    let req = c::RegisterRequest {
        address: addr.to_string(),
        metadata: Some(metadata(&inner.cfg, &inner.advertise_host)),
        worker_id: inner.cfg.worker_id.clone(),
        slice_id: String::new(),
        scale_group: inner.cfg.scale_group.clone(),
    };
    match inner
        .rpc
        .call::<_, c::RegisterResponse>(
            "iris.cluster.ControllerService",
            "Register",
            &req,
            Duration::from_secs(10),
        )
        .await
    {
        Ok(r) if r.accepted => true,
        Ok(_) => {
            tracing::warn!("registration refused");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "registration failed; retrying");
            false
        }
    }
}

pub(crate) async fn registration_loop(
    inner: Arc<Inner>,
    addr: SocketAddr,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        while !register_once(&inner, addr).await {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.wait_for(|v| *v) => return,
            }
        }
        *lock(&inner.last_reconcile) = Instant::now();
        // Watch for a lost controller.
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = shutdown.wait_for(|v| *v) => return,
            }
            if inner
                .fenced
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                tracing::warn!(
                    "the controller declared this worker lost (its tasks run elsewhere now); stopped every task, registering again"
                );
                abandon_all(&inner);
                break;
            }
            if lock(&inner.last_reconcile).elapsed() > inner.cfg.heartbeat_timeout {
                tracing::warn!(
                    "no reconcile within the heartbeat timeout; killing tasks and re-registering"
                );
                abandon_all(&inner);
                break;
            }
        }
    }
}
