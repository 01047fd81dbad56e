//! What this cluster offers: `ListBackends` (the worker fleet as one backend, plus in-process
//! backends) and the Kubernetes status.

use crate::error::{Error, Result};
use crate::Controller;
use iris_federation as fed;
use iris_proto::cluster::controller as c;
use iris_rpc::Code;
use iris_types::Band;
use std::collections::{BTreeMap, BTreeSet, HashMap};

impl Controller {
    pub(crate) async fn list_backends(
        &self,
        _req: c::ListBackendsRequest,
    ) -> Result<c::ListBackendsResponse> {
        let mut backends = Vec::new();
        let headroom = self.autoscale_headroom();
        let mut fleet = {
            let conn = self.db();
            self.worker_backend(&*conn, &headroom)?
        };
        if !headroom.is_empty() {
            // The fleet has an autoscaler: its status, and each group's availability.
            let status = self
                .get_autoscaler_status(c::GetAutoscalerStatusRequest::default())
                .await?
                .status;
            let mut health: BTreeMap<String, i32> = BTreeMap::new();
            for g in status.iter().flat_map(|s| s.groups.iter()) {
                *health
                    .entry(g.availability_status().to_string())
                    .or_default() += 1;
            }
            fleet.capacity_health = health.into_iter().collect();
            fleet.has_autoscaler = true;
            fleet.capabilities.push("autoscaler".into());
            if let Some(c::BackendStatus {
                detail: Some(c::backend_status::Detail::Worker(w)),
            }) = fleet.detail.as_mut()
            {
                w.autoscaler = status;
            }
        }
        // A fleet with no daemons next to an in-process backend is not a backend.
        if fleet.worker_count > 0 || fleet.has_autoscaler || self.backend_list().is_empty() {
            backends.push(fleet);
        }
        for b in self.backend_list() {
            backends.push(crate::backend::summary(&*b).await?);
        }
        Ok(c::ListBackendsResponse {
            backends,
            unroutable_job_count: 0,
            unroutable_sample: Vec::new(),
        })
    }

    /// The worker fleet as a backend: advertised attributes (union over healthy workers) and GPU
    /// availability per variant. Unlike the reference's worker backend, `held_by_band` is
    /// reported (GPUs held by running attempts, by band), so a hub can see what a higher band
    /// could reclaim here by preemption.
    /// `headroom`: slices each autoscaled group can still start.
    fn worker_backend(
        &self,
        conn: &impl iris_store::Read,
        headroom: &BTreeMap<String, u32>,
    ) -> Result<c::BackendSummary> {
        let workers = crate::tick::load_workers(conn)?;
        let mut advertised: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut total: BTreeMap<String, i64> = BTreeMap::new();
        let mut healthy = 0;
        let mut variant_of: HashMap<String, String> = HashMap::new();
        // The configured groups' routing attributes (what the reference advertises), then the
        // live workers' (daemons started by hand have no group in the config).
        for g in &self.cfg.groups {
            add_routing(&mut advertised, &g.attributes);
        }
        for w in &workers {
            if !w.healthy {
                continue;
            }
            healthy += 1;
            add_routing(&mut advertised, &w.attributes);
            if w.total.gpu > 0 && !w.device_variant.is_empty() {
                let v = w.device_variant.to_lowercase();
                *total.entry(v.clone()).or_default() += w.total.gpu;
                advertised
                    .entry(format!("availability:{v}"))
                    .or_default()
                    .insert("true".into());
                variant_of.insert(w.id.clone(), v);
            }
        }
        // An autoscaled group can still start slices: their accelerators count as free here
        // (a hub routes on them; the job waits here for its slice, not there for a peer).
        for g in &self.cfg.groups {
            let (Some(&slices), true) = (headroom.get(&g.name), g.capacity.gpu > 0) else {
                continue;
            };
            let Some(iris_types::AttrValue::Str(v)) = g.attributes.get("device-variant") else {
                continue;
            };
            let v = v.to_lowercase();
            let per_slice = g.autoscale.as_ref().map(|p| p.num_vms.max(1)).unwrap_or(1);
            *total.entry(v.clone()).or_default() += g.capacity.gpu * (slices * per_slice) as i64;
            advertised
                .entry(format!("availability:{v}"))
                .or_default()
                .insert("true".into());
        }
        let mut held: BTreeMap<i32, BTreeMap<String, i64>> = BTreeMap::new();
        let mut committed: BTreeMap<String, i64> = BTreeMap::new();
        let mut running = 0;
        {
            for h in iris_store::snapshot::holdings(conn)? {
                running += 1;
                let Some(v) = variant_of.get(&h.worker_id) else {
                    continue;
                };
                let Some(spec) = self.spec(conn, &h.job_id)? else {
                    continue;
                };
                let gpus = spec.resources.gpu;
                if gpus <= 0 {
                    continue;
                }
                *committed.entry(v.clone()).or_default() += gpus;
                *held
                    .entry(h.band)
                    .or_default()
                    .entry(v.clone())
                    .or_default() += gpus;
            }
        }
        let pending = iris_store::snapshot::waiting_count(conn)?;
        let amounts = total
            .iter()
            .map(|(v, t)| {
                (
                    v.clone(),
                    (t - committed.get(v).copied().unwrap_or(0)).max(0),
                )
            })
            .collect();
        let mut held_by_band: Vec<c::BandCapacity> = held
            .into_iter()
            .filter(|(b, _)| Band::from_code(*b).is_some())
            .map(|(band, amounts)| c::BandCapacity { band, amounts })
            .collect();
        held_by_band.sort_by_key(|h| Band::from_code(h.band).map(|b| b.rank()).unwrap_or(9));
        // One health count per scale group, as `GetAutoscalerStatus` reports them (configured
        // groups, and groups only worker daemons name).
        let mut groups: BTreeSet<String> = self.cfg.groups.iter().map(|g| g.name.clone()).collect();
        groups.extend(
            workers
                .iter()
                .filter_map(|w| match w.attributes.get("scale-group") {
                    Some(iris_types::AttrValue::Str(g)) if !g.is_empty() => Some(g.clone()),
                    _ => None,
                }),
        );
        let capacity_health = if groups.is_empty() {
            Default::default()
        } else {
            [("available".to_string(), groups.len() as i32)]
                .into_iter()
                .collect()
        };
        Ok(c::BackendSummary {
            // The reference's worker-daemon backend: id `default`, named after the cluster.
            backend_id: "default".into(),
            name: if self.fed.cfg.cluster_name.is_empty() {
                "default".into()
            } else {
                self.fed.cfg.cluster_name.clone()
            },
            kind: "worker-daemon".into(),
            // No autoscaler here: local workers come from the config, daemons from their
            // supervisor (ARCHITECTURE.md, "Deliberately Absent").
            capabilities: vec!["workers".into()],
            advertised_attributes: advertised
                .into_iter()
                .map(|(k, v)| {
                    (
                        k,
                        iris_proto::cluster::StringList {
                            values: v.into_iter().collect(),
                        },
                    )
                })
                .collect(),
            scale_groups: self.cfg.groups.iter().map(|g| g.name.clone()).collect(),
            worker_count: healthy,
            pending_task_count: pending as i32,
            running_task_count: running,
            has_autoscaler: false,
            capacity_health,
            detail: Some(c::BackendStatus {
                detail: Some(c::backend_status::Detail::Worker(c::WorkerFleetDetail {
                    autoscaler: None,
                    healthy_worker_count: healthy,
                    total_worker_count: workers.len() as i32,
                })),
            }),
            availability: Some(c::ResourceAvailability {
                version: fed::AVAILABILITY_VERSION,
                observation_epoch_ms: iris_store::now_ms(),
                amounts,
                total_amounts: total,
                held_by_band,
            }),
        })
    }

    /// `GetKubernetesClusterStatus`: the Kubernetes backend's cluster view.
    pub(crate) async fn get_kubernetes_cluster_status(
        &self,
        req: c::GetKubernetesClusterStatusRequest,
    ) -> Result<c::GetKubernetesClusterStatusResponse> {
        for b in self.backend_list() {
            if !req.backend_id.is_empty() && b.backend_id() != req.backend_id {
                continue;
            }
            let s = crate::backend::summary(&*b).await?;
            if let Some(c::backend_status::Detail::Kubernetes(k)) = s.detail.and_then(|d| d.detail)
            {
                return Ok(k);
            }
        }
        Err(Error::new(
            Code::FailedPrecondition,
            "this controller has no Kubernetes backend (kubernetes_provider is not configured)",
        ))
    }
}

/// The attributes a federation hub routes on (the reference's `backend_attribute_sets`):
/// `preemptible`, and for accelerators `device-type`, `device-variant` and
/// `availability:<variant>`, plus `region`. CPU groups add only `preemptible`; per-worker
/// attributes (`scale-group`, `cpu`, user labels) stay home.
fn add_routing(
    advertised: &mut BTreeMap<String, BTreeSet<String>>,
    attrs: &BTreeMap<String, iris_types::AttrValue>,
) {
    let text = |k: &str| match attrs.get(k) {
        Some(iris_types::AttrValue::Str(s)) => Some(s.trim().to_lowercase()),
        Some(iris_types::AttrValue::Int(i)) => Some(i.to_string()),
        Some(iris_types::AttrValue::Float(f)) => Some(f.to_string()),
        None => None,
    };
    let mut add = |k: &str, v: String| {
        if !v.is_empty() {
            advertised.entry(k.to_string()).or_default().insert(v);
        }
    };
    if let Some(p) = text("preemptible") {
        add("preemptible", p);
    }
    if let Some(r) = text("region") {
        add("region", r);
    }
    match text("device-type") {
        Some(t) if t != "cpu" => {
            add("device-type", t);
            if let Some(v) = text("device-variant").filter(|v| v != "auto" && v != "cpu") {
                add(&format!("availability:{v}"), "true".into());
                add("device-variant", v);
            }
        }
        _ => {}
    }
}
