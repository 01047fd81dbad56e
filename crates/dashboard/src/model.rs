//! Figures the pages show that no single RPC returns: device capacity per variant (Backends) and
//! committed resources per worker (Workers), computed from `ListWorkers` plus the open attempts'
//! `ListResourceHolds`. Pure functions over already-fetched data, so they are tested without a
//! controller.

use iris_proto::cluster::controller as c;
use iris_proto::inspect as pb;
use iris_proto::job::device_config::Device;
use std::collections::BTreeMap;

/// One open attempt's hold on a worker.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hold {
    pub worker_id: String,
    /// The job's requested device (`None`: CPU only).
    pub device: Option<Device>,
    pub band: i32,
    pub cpu_millicores: i64,
    pub memory_bytes: i64,
}

impl From<&pb::ResourceHold> for Hold {
    /// One row of `ListResourceHolds`.
    fn from(h: &pb::ResourceHold) -> Hold {
        Hold {
            worker_id: h.worker_id.clone(),
            device: h.device.as_ref().and_then(|d| d.device.clone()),
            band: h.band,
            cpu_millicores: h.cpu_millicores,
            memory_bytes: h.memory_bytes,
        }
    }
}

impl Hold {
    /// Accelerator units this hold takes (GPUs or TPU chips).
    fn units(&self) -> i64 {
        match &self.device {
            Some(Device::Gpu(g)) => g.count.max(0) as i64,
            Some(Device::Tpu(t)) => t.count.max(0) as i64,
            Some(Device::Cpu(_)) | None => 0,
        }
    }
}

/// `(kind, variant)` a worker advertises, e.g. `("gpu", "h100")`, with its unit count; CPU-only
/// workers advertise `("cpu", "cpu")` with their cores.
pub fn advertised(w: &c::WorkerHealthStatus) -> (String, String, i64) {
    let md = w.metadata.clone().unwrap_or_default();
    match md.device.clone().and_then(|d| d.device) {
        Some(Device::Gpu(g)) if g.count > 0 => {
            ("gpu".into(), g.variant.to_lowercase(), g.count as i64)
        }
        Some(Device::Tpu(t)) if t.count > 0 => {
            ("tpu".into(), t.variant.to_lowercase(), t.count as i64)
        }
        _ => ("cpu".into(), "cpu".into(), md.cpu_count() as i64),
    }
}

/// Free/total of one device variant across the healthy workers that advertise it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Variant {
    pub kind: String,
    pub variant: String,
    /// Units on healthy workers.
    pub total: i64,
    /// Units held by open attempts on those workers.
    pub held: i64,
    /// Held units by priority band code.
    pub held_by_band: BTreeMap<i32, i64>,
    pub healthy_workers: usize,
    pub unhealthy_workers: usize,
}

impl Variant {
    pub fn free(&self) -> i64 {
        (self.total - self.held).max(0)
    }
    /// Unit name for text: `H100`, `cores`.
    pub fn title(&self) -> String {
        if self.kind == "cpu" {
            "CPU cores".into()
        } else {
            format!(
                "{} {}",
                self.variant.to_uppercase(),
                self.kind.to_uppercase()
            )
        }
    }
}

/// Capacity per device variant: accelerator variants count GPUs/TPU chips; `cpu` counts the
/// cores of every healthy worker (CPU holds are the attempts' millicores).
pub fn variants(workers: &[c::WorkerHealthStatus], holds: &[Hold]) -> Vec<Variant> {
    let mut out: BTreeMap<(String, String), Variant> = BTreeMap::new();
    let mut by_worker: BTreeMap<&str, (String, String, bool)> = BTreeMap::new();
    let mut cpu = Variant {
        kind: "cpu".into(),
        variant: "cpu".into(),
        ..Default::default()
    };
    for w in workers {
        let (kind, variant, units) = advertised(w);
        let cores = w
            .metadata
            .as_ref()
            .map(|m| m.cpu_count() as i64)
            .unwrap_or(0);
        if w.healthy.unwrap_or_default() {
            cpu.total += cores;
            cpu.healthy_workers += 1;
        } else {
            cpu.unhealthy_workers += 1;
        }
        by_worker.insert(
            w.worker_id(),
            (kind.clone(), variant.clone(), w.healthy.unwrap_or_default()),
        );
        if kind == "cpu" {
            continue;
        }
        let v = out
            .entry((kind.clone(), variant.clone()))
            .or_insert_with(|| Variant {
                kind,
                variant,
                ..Default::default()
            });
        if w.healthy.unwrap_or_default() {
            v.total += units;
            v.healthy_workers += 1;
        } else {
            v.unhealthy_workers += 1;
        }
    }
    // Holds count in millicores for CPU; converted to whole cores (rounded up) at the end.
    let mut cpu_milli: i64 = 0;
    let mut cpu_band_milli: BTreeMap<i32, i64> = BTreeMap::new();
    for h in holds {
        let Some((kind, variant, healthy)) = by_worker.get(h.worker_id.as_str()) else {
            continue;
        };
        if !healthy {
            continue;
        }
        cpu_milli += h.cpu_millicores;
        *cpu_band_milli.entry(h.band).or_default() += h.cpu_millicores;
        let units = h.units();
        if kind != "cpu" && units > 0 {
            if let Some(v) = out.get_mut(&(kind.clone(), variant.clone())) {
                v.held += units;
                *v.held_by_band.entry(h.band).or_default() += units;
            }
        }
    }
    cpu.held = (cpu_milli + 999) / 1000;
    cpu.held_by_band = cpu_band_milli
        .into_iter()
        .map(|(b, m)| (b, (m + 999) / 1000))
        .collect();
    let mut v: Vec<Variant> = out.into_values().collect();
    if cpu.healthy_workers + cpu.unhealthy_workers > 0 {
        v.push(cpu);
    }
    v
}

/// Resources committed on one worker by its open attempts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Committed {
    pub cpu_millicores: i64,
    pub memory_bytes: i64,
    pub units: i64,
    pub attempts: usize,
}

pub fn committed(holds: &[Hold]) -> BTreeMap<String, Committed> {
    let mut out: BTreeMap<String, Committed> = BTreeMap::new();
    for h in holds {
        let e = out.entry(h.worker_id.clone()).or_default();
        e.cpu_millicores += h.cpu_millicores;
        e.memory_bytes += h.memory_bytes;
        e.units += h.units();
        e.attempts += 1;
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use iris_proto::job;

    pub fn gpu_worker(id: &str, variant: &str, n: i32, healthy: bool) -> c::WorkerHealthStatus {
        c::WorkerHealthStatus {
            worker_id: Some(id.into()),
            healthy: Some(healthy),
            address: Some("127.0.0.1:1".into()),
            metadata: Some(job::WorkerMetadata {
                cpu_count: Some(16),
                memory_bytes: Some(64 << 30),
                device: Some(job::DeviceConfig {
                    device: Some(Device::Gpu(job::GpuDevice {
                        variant: variant.into(),
                        count: n,
                    })),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub fn gpu_hold(worker: &str, variant: &str, n: i32, band: i32) -> Hold {
        Hold {
            worker_id: worker.into(),
            device: Some(Device::Gpu(job::GpuDevice {
                variant: variant.into(),
                count: n,
            })),
            band,
            cpu_millicores: 1000,
            memory_bytes: 1 << 30,
        }
    }

    #[test]
    fn idle_worker_is_all_free_and_a_held_job_takes_its_units() {
        let ws = vec![gpu_worker("w0", "h100", 8, true)];
        let v = variants(&ws, &[]);
        let h100 = v.iter().find(|v| v.variant == "h100").expect("h100");
        assert_eq!((h100.free(), h100.total), (8, 8));
        let v = variants(&ws, &[gpu_hold("w0", "H100", 8, 2)]);
        let h100 = v.iter().find(|v| v.variant == "h100").expect("h100");
        assert_eq!((h100.free(), h100.total), (0, 8));
        assert_eq!(h100.held_by_band.get(&2), Some(&8));
        let cpu = v.iter().find(|v| v.kind == "cpu").expect("cpu");
        assert_eq!((cpu.total, cpu.held), (16, 1));
    }

    #[test]
    fn unhealthy_workers_add_no_capacity() {
        let ws = vec![
            gpu_worker("w0", "h100", 8, true),
            gpu_worker("w1", "h100", 8, false),
        ];
        let v = variants(&ws, &[gpu_hold("w1", "h100", 8, 1)]);
        let h100 = v.iter().find(|v| v.variant == "h100").expect("h100");
        assert_eq!((h100.free(), h100.total, h100.unhealthy_workers), (8, 8, 1));
    }

    #[test]
    fn holds_come_from_list_resource_holds() {
        let gpu = pb::ResourceHold {
            worker_id: "w0".into(),
            job_id: "/u/j".into(),
            band: 2,
            cpu_millicores: 1000,
            memory_bytes: 1 << 30,
            device: Some(job::DeviceConfig {
                device: Some(Device::Gpu(job::GpuDevice {
                    variant: "H100".into(),
                    count: 8,
                })),
            }),
            ..Default::default()
        };
        let h = Hold::from(&gpu);
        assert_eq!(h.units(), 8);
        assert_eq!((h.band, h.cpu_millicores), (2, 1000));
        let cpu = pb::ResourceHold {
            device: None,
            ..gpu
        };
        assert_eq!(Hold::from(&cpu).device, None);
        assert_eq!(Hold::from(&cpu).units(), 0);
    }
}
