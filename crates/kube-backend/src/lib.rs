//! The Kubernetes backend (reference federation-k8s §3): no worker daemons; the controller makes
//! one Pod per task attempt, Kueue admits it (gangs whole, by priority tier) and Kubernetes
//! places it.
//!
//! It implements [`iris_backend::Backend`]: registered as one pseudo worker per
//! device variant whose capacity is effectively unbounded (placement and preemption belong to
//! Kueue, so the controller's scheduler only turns pending tasks into attempts), it receives the
//! desired set of attempts each round and
//! * applies the Pod (server-side apply, deterministic name from task, attempt and uid, so a
//!   retried apply is idempotent) and, for coordinator tasks, its PodDisruptionBudget;
//! * deletes the exact Pod of an attempt that is no longer wanted (gangs: every pod of the group
//!   and its Workload);
//! * maps what it watches (kube-runtime reflectors over Pods and Kueue Workloads) to attempt
//!   observations with `iris_kube_model::status`, records Kueue / container / disruption events,
//!   and gives up on a pod missing for three scans;
//! * streams each attempt's `task` container log through the API into the controller's log
//!   store (no sidecar), so `job logs` works as on workers.
//!
//! Pod manifests, priority classes, topology arithmetic and status mapping are pure
//! (`iris-kube-model`); this crate is only the I/O.

use futures::future::BoxFuture;
use futures::StreamExt;
use iris_backend::{
    AttemptEvent, AttemptLogs, Availability, Backend, DesiredAttempt, Detail, Device, Error,
    Intent, KubernetesStatus, NodeStatus, Observation, PodStatus, Registration, Report, Summary,
};
use iris_kube_model as km;
use iris_proto::job;
use iris_types::{AttrValue, Resources, TaskState};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// The label scoping pods to one pseudo worker (so two backends never collect each other's).
pub const LABEL_BACKEND: &str = "iris.backend";
const FIELD_MANAGER: &str = "iris-controller";
/// A running pod's log is read at most this often; a finished pod's once, at the end.
const LOG_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);
/// Pod applies in flight per reconcile round.
const APPLY_CONCURRENCY: usize = 32;
const KUEUE_GROUP: &str = "kueue.x-k8s.io";
const KUEUE_VERSION: &str = "v1beta1";

/// `kubernetes_provider` settings the backend needs.
#[derive(Clone, Debug)]
pub struct KubeSettings {
    /// Pod layout (namespace, label prefix, host networking, caches, images, priority classes,
    /// topologies).
    pub provider: km::ProviderConfig,
    /// `kubernetes_provider.kueue.cluster_queue` (required).
    pub cluster_queue: String,
    /// GPU variants the cluster's scale groups offer (`H100`, `GB200`); one pseudo worker each,
    /// plus one for CPU work.
    pub gpu_variants: Vec<String>,
    /// Scale group names, for `ListBackends`.
    pub scale_groups: Vec<String>,
    /// Where pods reach the controller (`IRIS_CONTROLLER_URL`).
    pub controller_url: String,
}

/// What startup found missing among the admin-owned Kueue objects (reported, never created).
#[derive(Clone, Debug, Default)]
pub struct Preflight {
    pub missing: Vec<String>,
}

/// Connection and watch state shared by the backend's pseudo workers.
struct Core {
    client: kube::Client,
    settings: KubeSettings,
    pods: Api<Pod>,
    pdbs: Api<PodDisruptionBudget>,
    workloads: Api<DynamicObject>,
    pod_store: Store<Pod>,
    workload_store: Store<DynamicObject>,
    /// The last version seen of every pod that ended (or was marked for disruption), kept after
    /// it is deleted: a preempted pod is often gone before the next scan, and its final state
    /// still says what happened.
    last_seen: Arc<Mutex<HashMap<String, Pod>>>,
}

#[derive(Default)]
struct State {
    /// The run request of each attempt uid (sent once, on assignment).
    requests: HashMap<String, job::RunTaskRequest>,
    /// Pod name per attempt uid, once applied.
    applied: HashMap<String, String>,
    missing: km::MissingTracker,
    /// Log lines already shipped per pod.
    log_lines: HashMap<String, usize>,
    /// Pods whose final log has been shipped.
    log_done: BTreeSet<String>,
    /// When a running pod's log was last read (read at most every [`LOG_PERIOD`]).
    log_read_at: HashMap<String, std::time::Instant>,
    /// Events already recorded, per attempt uid.
    events: HashMap<String, BTreeSet<String>>,
    /// Manifest errors per attempt uid (the attempt fails with it).
    manifest_errors: HashMap<String, String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unavailable(what: &str, e: kube::Error) -> Error {
    Error::transient(format!("kubernetes: {what}")).caused_by(e)
}

/// One pseudo worker of the Kubernetes backend.
pub struct KubeBackend {
    core: Arc<Core>,
    /// This pseudo worker's own bookkeeping (its pods carry its `iris.backend` label).
    state: Mutex<State>,
    id: String,
    /// `None`: the CPU pseudo worker.
    variant: Option<String>,
}

/// Connects, reconciles the priority classes and the LocalQueue, checks the admin-owned Kueue
/// objects, starts the watches, and returns one backend per pseudo worker.
pub async fn connect(
    client: kube::Client,
    settings: KubeSettings,
) -> anyhow::Result<(Vec<Arc<KubeBackend>>, Preflight)> {
    let ns = settings.provider.namespace.clone();
    if settings.cluster_queue.trim().is_empty() {
        anyhow::bail!("kubernetes_provider.kueue.cluster_queue is required: the ClusterQueue Iris's LocalQueue points at");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    let wl_res = kueue_resource("Workload", "workloads");
    let workloads: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &wl_res);
    let pp = PatchParams::apply(FIELD_MANAGER).force();

    // Pod PriorityClasses and Kueue WorkloadPriorityClasses (ours: created or updated).
    let pcs: Api<PriorityClass> = Api::all(client.clone());
    for pc in km::priority::pod_priority_classes() {
        let name = pc.metadata.name.clone().unwrap_or_default();
        if let Err(e) = pcs.patch(&name, &pp, &Patch::Apply(&pc)).await {
            // `value` is immutable: a changed class is replaced.
            tracing::warn!(class = %name, error = %e, "replacing PriorityClass");
            let _ = pcs.delete(&name, &DeleteParams::default()).await;
            pcs.patch(&name, &pp, &Patch::Apply(&pc))
                .await
                .map_err(|e| anyhow::anyhow!("applying PriorityClass {name}: {e}"))?;
        }
    }
    let wpc_res = kueue_resource("WorkloadPriorityClass", "workloadpriorityclasses");
    let wpcs: Api<DynamicObject> = Api::all_with(client.clone(), &wpc_res);
    for v in km::priority::workload_priority_classes() {
        let name = v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let obj: DynamicObject = serde_json::from_value(v)?;
        wpcs.patch(&name, &pp, &Patch::Apply(&obj))
            .await
            .map_err(|e| anyhow::anyhow!("applying WorkloadPriorityClass {name}: {e}"))?;
    }
    let lq_res = kueue_resource("LocalQueue", "localqueues");
    let lqs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &lq_res);
    let lq = km::priority::local_queue(
        &ns,
        &settings.provider.label_prefix,
        &settings.cluster_queue,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let lq_name = lq["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let lq_obj: DynamicObject = serde_json::from_value(lq)?;
    lqs.patch(&lq_name, &pp, &Patch::Apply(&lq_obj))
        .await
        .map_err(|e| anyhow::anyhow!("applying LocalQueue {lq_name}: {e}"))?;

    // Admin-owned objects: verified, never created or repaired.
    let mut pre = Preflight::default();
    let cq: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kueue_resource("ClusterQueue", "clusterqueues"),
    );
    if cq.get_opt(&settings.cluster_queue).await?.is_none() {
        pre.missing.push(format!(
            "ClusterQueue {} (kubernetes_provider.kueue.cluster_queue)",
            settings.cluster_queue
        ));
    }
    let flavors: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kueue_resource("ResourceFlavor", "resourceflavors"),
    );
    if flavors
        .list(&ListParams::default())
        .await
        .map(|l| l.items.is_empty())
        .unwrap_or(true)
    {
        pre.missing.push("a Kueue ResourceFlavor".into());
    }
    let topo_res = ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk(KUEUE_GROUP, "v1alpha1", "Topology"),
        "topologies",
    );
    let topos: Api<DynamicObject> = Api::all_with(client.clone(), &topo_res);
    if topos
        .list(&ListParams::default())
        .await
        .map(|l| l.items.is_empty())
        .unwrap_or(true)
    {
        pre.missing.push("a Kueue Topology".into());
    }
    for m in &pre.missing {
        tracing::warn!(missing = %m, "Kueue object not found; ask the cluster admin to install it (Iris does not create it)");
    }

    // Watches: pods we manage, and Kueue workloads.
    let (pod_store, pod_writer) = reflector::store();
    let pod_stream = reflector::reflector(
        pod_writer,
        watcher(
            pods.clone(),
            watcher::Config::default().labels(&format!("{}=true", km::manifest::LABEL_MANAGED)),
        ),
    )
    .default_backoff()
    .applied_objects();
    let last_seen: Arc<Mutex<HashMap<String, Pod>>> = Arc::default();
    let seen = last_seen.clone();
    tokio::spawn(async move {
        futures::pin_mut!(pod_stream);
        while let Some(ev) = pod_stream.next().await {
            match ev {
                Ok(p) => {
                    let ended = matches!(phase(&p), "Succeeded" | "Failed") || disrupted(&p);
                    if let (true, Some(name)) = (ended, p.metadata.name.clone()) {
                        lock(&seen).insert(name, p);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "pod watch"),
            }
        }
    });
    let wl_writer = reflector::store::Writer::<DynamicObject>::new(wl_res.clone());
    let workload_store = wl_writer.as_reader();
    let wl_stream = reflector::reflector(
        wl_writer,
        watcher(workloads.clone(), watcher::Config::default()),
    )
    .default_backoff()
    .applied_objects();
    tokio::spawn(async move {
        futures::pin_mut!(wl_stream);
        while let Some(ev) = wl_stream.next().await {
            if let Err(e) = ev {
                tracing::debug!(error = %e, "workload watch");
            }
        }
    });
    let _ = pod_store.wait_until_ready().await;
    let core = Arc::new(Core {
        client,
        settings: settings.clone(),
        pods,
        pdbs,
        workloads,
        pod_store,
        workload_store,
        last_seen,
    });
    let mut out = vec![Arc::new(KubeBackend {
        core: core.clone(),
        state: Mutex::new(State::default()),
        id: "k8s-cpu".into(),
        variant: None,
    })];
    for v in &settings.gpu_variants {
        out.push(Arc::new(KubeBackend {
            core: core.clone(),
            state: Mutex::new(State::default()),
            id: format!("k8s-{}", v.to_lowercase()),
            variant: Some(v.clone()),
        }));
    }
    Ok((out, pre))
}

fn kueue_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk(KUEUE_GROUP, KUEUE_VERSION, kind),
        plural,
    )
}

impl KubeBackend {
    fn registration_now(&self) -> Registration {
        // Kueue owns placement: the pseudo worker never runs out, so every pending task becomes an
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

    fn pods_of_this_backend(&self) -> Vec<Arc<Pod>> {
        self.core
            .pod_store
            .state()
            .into_iter()
            .filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_BACKEND))
                    .map(|b| b == &self.id)
                    .unwrap_or(false)
            })
            .collect()
    }

    async fn reconcile_now(&self, desired: Vec<DesiredAttempt>) -> Result<Report, Error> {
        let core = &self.core;
        let mut report = Report::default();
        let mut want_run: Vec<String> = Vec::new();
        let mut want_stop: BTreeSet<String> = BTreeSet::new();
        let log_keys: HashMap<&String, String> = desired
            .iter()
            .map(|d| (&d.attempt_uid, d.log_key()))
            .collect();
        {
            let mut st = lock(&self.state);
            for d in &desired {
                match &d.intent {
                    Intent::Run { launch } => {
                        if let Some(r) = launch {
                            st.requests.insert(d.attempt_uid.clone(), (**r).clone());
                        }
                        want_run.push(d.attempt_uid.clone());
                    }
                    Intent::Stop(_) => {
                        want_stop.insert(d.attempt_uid.clone());
                    }
                }
            }
        }
        let pods = self.pods_of_this_backend();
        let by_name: HashMap<String, Arc<Pod>> = pods
            .iter()
            .filter_map(|p| p.metadata.name.clone().map(|n| (n, p.clone())))
            .collect();
        // Kueue's verdict only matters for pods still waiting: the Workload cache is converted
        // once per round, and only if some pod needs it.
        let mut workloads: Option<WorkloadIndex> = None;

        // Apply pods for wanted attempts not yet applied, many at once (each is one
        // server-side apply; the API server, not this loop, should be the limit).
        let to_apply: Vec<(String, job::RunTaskRequest)> = {
            let st = lock(&self.state);
            want_run
                .iter()
                .filter(|u| !st.applied.contains_key(*u) && !st.manifest_errors.contains_key(*u))
                .filter_map(|u| st.requests.get(u).map(|r| (u.clone(), r.clone())))
                .collect()
        };
        // An attempt without a cached request (a restarted controller) is found by its pod's
        // name below; without a pod it is reported lost after the grace scans.
        let results: Vec<(String, Result<String, ApplyError>)> = futures::stream::iter(to_apply)
            .map(|(uid, req)| async move { (uid, self.apply_attempt(&req).await) })
            .buffer_unordered(APPLY_CONCURRENCY)
            .collect()
            .await;
        for (uid, r) in results {
            match r {
                Ok(name) => {
                    lock(&self.state).applied.insert(uid, name);
                }
                Err(ApplyError::Manifest(m)) => {
                    lock(&self.state).manifest_errors.insert(uid, m);
                }
                Err(ApplyError::Api(e)) => {
                    report.observed.push(Observation {
                        error: format!("applying the pod: {e}"),
                        ..Observation::new(uid, TaskState::WorkerFailed)
                    });
                }
            }
        }

        // Delete pods whose attempt is no longer wanted (stopped, or gone from the desired set):
        // a live pod of a stopped attempt is killed, a finished one whose attempt is settled is
        // garbage-collected. Pods already terminating are left to finish.
        let wanted: BTreeSet<&String> = want_run.iter().collect();
        let mut doomed: Vec<(Arc<Pod>, String)> = Vec::new();
        for p in &pods {
            let uid = attempt_uid_of(p);
            let Some(name) = p.metadata.name.clone() else {
                continue;
            };
            if uid.as_ref().map(|u| wanted.contains(u)).unwrap_or(false) {
                continue;
            }
            if let Some(u) = &uid {
                if want_stop.contains(u) {
                    report
                        .observed
                        .push(Observation::new(u.clone(), TaskState::Killed));
                }
            }
            if p.metadata.deletion_timestamp.is_none() {
                doomed.push((p.clone(), name));
            }
        }
        futures::stream::iter(doomed)
            .for_each_concurrent(APPLY_CONCURRENCY, |(p, name)| async move {
                self.delete_pod(&p, &name).await;
            })
            .await;
        // Stops for pods that never existed (or are already gone).
        for u in &want_stop {
            let has_pod = pods
                .iter()
                .any(|p| attempt_uid_of(p).as_deref() == Some(u.as_str()));
            if !has_pod {
                report
                    .observed
                    .push(Observation::new(u.clone(), TaskState::Killed));
            }
        }

        // Observe wanted attempts (log reads are collected and made concurrently afterwards).
        let mut log_reads: Vec<(String, String, Arc<Pod>)> = Vec::new();
        for uid in &want_run {
            if let Some(m) = lock(&self.state).manifest_errors.get(uid).cloned() {
                report.observed.push(Observation {
                    exit_code: Some(-1),
                    error: m,
                    ..Observation::new(uid.clone(), TaskState::Failed)
                });
                continue;
            }
            let name = {
                let st = lock(&self.state);
                st.applied.get(uid).cloned()
            }
            .or_else(|| {
                pods.iter()
                    .find(|p| attempt_uid_of(p).as_deref() == Some(uid.as_str()))
                    .and_then(|p| p.metadata.name.clone())
            });
            let Some(name) = name else { continue };
            // Gone from the API but seen ending (e.g. preempted and deleted at once): its last
            // state is the verdict.
            let pod = by_name.get(&name).cloned().or_else(|| {
                lock(&core.last_seen)
                    .get(&name)
                    .filter(|p| matches!(phase(p), "Succeeded" | "Failed"))
                    .map(|p| Arc::new(p.clone()))
            });
            let waiting = pod.as_ref().map(|p| phase(p) == "Pending").unwrap_or(false);
            if waiting && workloads.is_none() {
                workloads = Some(WorkloadIndex::build(&core.workload_store));
            }
            let wl = match (&pod, &workloads, waiting) {
                (Some(p), Some(ws), true) => ws.find(p),
                _ => None,
            };
            let obs = lock(&self.state).missing.scan(&name, pod.as_deref(), wl);
            let Some(obs) = obs else { continue };
            if let Some(ev) = &obs.event {
                let key = format!("{}:{}", ev.reason, ev.message);
                let fresh = lock(&self.state)
                    .events
                    .entry(uid.clone())
                    .or_default()
                    .insert(key);
                if fresh {
                    report.events.push(AttemptEvent {
                        attempt_uid: uid.clone(),
                        kind: match ev.severity {
                            km::status::Severity::Warning => "WARNING".into(),
                            km::status::Severity::Info => "INFO".into(),
                        },
                        reason: ev.reason.clone(),
                        message: ev.message.clone(),
                        source: ev.source.as_str().into(),
                    });
                }
            }
            report.observed.push(Observation {
                attempt_uid: uid.clone(),
                state: obs.state.task_state(),
                // A pod that ended without its container exiting (never started, evicted).
                exit_code: obs.exit_code.or(obs.state.is_terminal().then_some(-1)),
                error: obs.error.clone().unwrap_or_default(),
                status_message: obs.status_message.clone(),
            });
            if let (Some(p), Some(key)) = (&pod, log_keys.get(uid)) {
                log_reads.push((key.clone(), name.clone(), p.clone()));
            }
            if obs.state.is_terminal() {
                lock(&self.state).missing.forget(&name);
            }
        }
        let logs: Vec<Option<AttemptLogs>> = futures::stream::iter(log_reads)
            .map(|(key, name, p)| async move { self.ship_logs(key, &name, &p).await })
            .buffer_unordered(APPLY_CONCURRENCY)
            .collect()
            .await;
        report.logs.extend(logs.into_iter().flatten());
        // Forget what is no longer desired.
        {
            let mut st = lock(&self.state);
            let all: BTreeSet<&String> = desired.iter().map(|d| &d.attempt_uid).collect();
            st.requests.retain(|u, _| all.contains(u));
            st.applied.retain(|u, _| all.contains(u));
            st.events.retain(|u, _| all.contains(u));
            st.manifest_errors.retain(|u, _| all.contains(u));
            drop(st);
            lock(&core.last_seen).retain(|_, p| {
                let mine = p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_BACKEND))
                    .map(|b| b == &self.id)
                    .unwrap_or(false);
                !mine || attempt_uid_of(p).map(|u| all.contains(&u)).unwrap_or(false)
            });
        }
        Ok(report)
    }

    async fn apply_attempt(&self, req: &job::RunTaskRequest) -> Result<String, ApplyError> {
        let core = &self.core;
        let input = pod_input(req, &core.settings.controller_url);
        let mut pod = km::manifest::build_pod(&input, &core.settings.provider)
            .map_err(|e| ApplyError::Manifest(e.to_string()))?;
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(LABEL_BACKEND.into(), self.id.clone());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        if let Some(pdb) = km::manifest::build_pdb(&input, &core.settings.provider) {
            let pdb_name = pdb.metadata.name.clone().unwrap_or_default();
            core.pdbs
                .patch(&pdb_name, &pp, &Patch::Apply(&pdb))
                .await
                .map_err(|e| ApplyError::Api(e.to_string()))?;
        }
        core.pods
            .patch(&name, &pp, &Patch::Apply(&pod))
            .await
            .map_err(|e| ApplyError::Api(e.to_string()))?;
        Ok(name)
    }

    async fn delete_pod(&self, pod: &Pod, name: &str) {
        let core = &self.core;
        // A gang goes as a whole: its Workload too.
        if let Some(group) = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(km::manifest::KUEUE_POD_GROUP_NAME))
        {
            let _ = core.workloads.delete(group, &DeleteParams::default()).await;
        }
        match core.pods.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(pod = %name, error = %e, "deleting pod"),
        }
        let pdb = format!("{name}-pdb");
        let _ = core.pdbs.delete(&pdb, &DeleteParams::default()).await;
        lock(&core.last_seen).remove(name);
        let mut st = lock(&self.state);
        st.log_lines.remove(name);
        st.log_done.remove(name);
        st.log_read_at.remove(name);
        st.missing.forget(name);
    }

    /// New lines of the attempt's `task` container log since the last round, stored under `key`.
    async fn ship_logs(&self, key: String, name: &str, pod: &Pod) -> Option<AttemptLogs> {
        let core = &self.core;
        let ph = phase(pod);
        if !matches!(ph, "Running" | "Succeeded" | "Failed")
            || lock(&self.state).log_done.contains(name)
        {
            return None;
        }
        if ph == "Running" {
            let mut st = lock(&self.state);
            let now = std::time::Instant::now();
            if st
                .log_read_at
                .get(name)
                .is_some_and(|t| now.duration_since(*t) < LOG_PERIOD)
            {
                return None;
            }
            st.log_read_at.insert(name.to_string(), now);
        }
        let text = core
            .pods
            .logs(
                name,
                &LogParams {
                    container: Some(km::manifest::TASK_CONTAINER.into()),
                    ..Default::default()
                },
            )
            .await
            .ok()?;
        let mut st = lock(&self.state);
        let sent = st.log_lines.get(name).copied().unwrap_or(0);
        let now = now_ms();
        let lines: Vec<(String, String, i64, i64)> = text
            .lines()
            .enumerate()
            .skip(sent)
            .map(|(i, l)| ("stdout".to_string(), l.to_string(), now, i as i64))
            .collect();
        st.log_lines.insert(name.to_string(), sent + lines.len());
        if matches!(ph, "Succeeded" | "Failed") {
            st.log_done.insert(name.to_string());
        }
        (!lines.is_empty()).then_some(AttemptLogs { key, lines })
    }

    async fn summary_now(&self) -> Result<Summary, Error> {
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

/// Kueue Workloads indexed by what pods are found by: the pod-group name (gangs) and the owning
/// pod's uid, built once per round so matching is not waiting pods × workloads.
struct WorkloadIndex {
    all: Vec<serde_json::Value>,
    by_key: HashMap<String, usize>,
}

impl WorkloadIndex {
    fn build(store: &Store<DynamicObject>) -> WorkloadIndex {
        let all: Vec<serde_json::Value> = store
            .state()
            .iter()
            .filter_map(|w| serde_json::to_value(w.as_ref()).ok())
            .collect();
        let mut by_key = HashMap::new();
        for (i, w) in all.iter().enumerate() {
            if let Some(n) = w["metadata"]["name"].as_str() {
                by_key.insert(format!("group:{n}"), i);
            }
            for r in w["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if let Some(u) = r["uid"].as_str() {
                    by_key.insert(format!("uid:{u}"), i);
                }
            }
            if let Some(u) = w["metadata"]["labels"]["kueue.x-k8s.io/job-uid"].as_str() {
                by_key.insert(format!("uid:{u}"), i);
            }
        }
        WorkloadIndex { all, by_key }
    }

    /// The pod's Workload, with `find_workload`'s rules applied to the one candidate.
    fn find(&self, pod: &Pod) -> Option<&serde_json::Value> {
        let key = match pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(km::manifest::KUEUE_POD_GROUP_NAME))
        {
            Some(g) => format!("group:{g}"),
            None => format!("uid:{}", pod.metadata.uid.as_deref()?),
        };
        let w = self.all.get(*self.by_key.get(&key)?)?;
        km::status::find_workload(pod, std::slice::from_ref(w))
    }
}

enum ApplyError {
    /// The attempt can never run (bad gang shape, unsupported constraint): it fails.
    Manifest(String),
    /// The API refused or was unreachable: the attempt is lost and retried.
    Api(String),
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Marked for disruption (preemption, eviction, node shutdown).
fn disrupted(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        })
        .unwrap_or(false)
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// The attempt uid a pod was made for (the pod name ends with it).
fn attempt_uid_of(p: &Pod) -> Option<String> {
    let name = p.metadata.name.as_deref()?;
    let last = name.rsplit('-').next()?;
    (last.len() == 16 && last.chars().all(|c| c.is_ascii_hexdigit())).then(|| last.to_string())
}

/// The pure manifest's input from a run request.
fn pod_input(req: &job::RunTaskRequest, controller_url: &str) -> km::manifest::PodInput {
    let (job_id, index) = match req.task_id.rsplit_once('/') {
        Some((j, i)) => (j.to_string(), i.parse().unwrap_or(0)),
        None => (req.task_id.clone(), 0),
    };
    let res = req.resources.clone().unwrap_or_default();
    let (gpu_count, gpu_variant) = match res.device.as_ref().and_then(|d| d.device.as_ref()) {
        Some(job::device_config::Device::Gpu(g)) => (g.count.max(0) as u32, g.variant.clone()),
        _ => (0, String::new()),
    };
    let env: BTreeMap<String, String> = req
        .environment
        .as_ref()
        .map(|e| e.env_vars.clone().into_iter().collect())
        .unwrap_or_default();
    let mut system_env = BTreeMap::new();
    system_env.insert(
        "IRIS_TASK_ID".to_string(),
        format!("{}:{}", req.task_id, req.attempt_id),
    );
    system_env.insert("IRIS_ATTEMPT_UID".to_string(), req.attempt_uid.clone());
    system_env.insert("IRIS_NUM_TASKS".to_string(), req.num_tasks.to_string());
    system_env.insert("IRIS_JOB_ID".to_string(), job_id.clone());
    system_env.insert("IRIS_BUNDLE_ID".to_string(), req.bundle_id.clone());
    system_env.insert(
        "IRIS_CONTROLLER_URL".to_string(),
        controller_url.to_string(),
    );
    system_env.insert(
        "IRIS_CONTROLLER_ADDRESS".to_string(),
        controller_url.to_string(),
    );
    system_env.insert(
        "IRIS_JOB_ENV".to_string(),
        serde_json::to_string(&env).unwrap_or_else(|_| "{}".into()),
    );
    if !req.task_token.is_empty() {
        system_env.insert("IRIS_TASK_TOKEN".to_string(), req.task_token.clone());
    }
    let mut setup = Vec::new();
    if !req.bundle_id.is_empty() {
        setup.push(format!(
            "curl -fsS \"$IRIS_CONTROLLER_URL/bundles/{}.zip\" -o /tmp/iris-bundle.zip && unzip -q -o /tmp/iris-bundle.zip -d .",
            req.bundle_id
        ));
    }
    let constraints = req
        .constraints
        .iter()
        .filter(|k| k.key == "pool" || k.key == "region")
        .map(|k| {
            let v = k.value.as_ref().and_then(|v| match &v.value {
                Some(job::attribute_value::Value::StringValue(s)) => Some(s.clone()),
                _ => None,
            });
            match (k.op, v) {
                (0, Some(value)) => km::manifest::NodeConstraint::Eq {
                    key: k.key.clone(),
                    value,
                },
                (op, _) => km::manifest::NodeConstraint::Other {
                    key: k.key.clone(),
                    op: format!("{op}"),
                },
            }
        })
        .collect();
    km::manifest::PodInput {
        task_id: req.task_id.clone(),
        attempt_id: req.attempt_id.max(0) as u32,
        attempt_uid: req.attempt_uid.clone(),
        job_id,
        num_tasks: req.num_tasks.max(1) as u32,
        task_index: index,
        band: iris_types::Band::from_code(req.priority).unwrap_or(iris_types::Band::Interactive),
        argv: req
            .entrypoint
            .as_ref()
            .and_then(|e| e.run_command.as_ref())
            .map(|r| r.argv.clone())
            .unwrap_or_default(),
        setup_commands: setup,
        env,
        system_env,
        cpu_millicores: res.cpu_millicores.max(0) as u64,
        memory_bytes: res.memory_bytes.max(0) as u64,
        disk_bytes: res.disk_bytes.max(0) as u64,
        gpu_count,
        gpu_variant,
        group_by: req
            .coscheduling
            .as_ref()
            .map(|c| c.group_by.clone())
            .filter(|g| !g.is_empty() && req.num_tasks > 1),
        constraints,
        timeout_seconds: req
            .timeout
            .as_ref()
            .map(|d| (d.milliseconds / 1000).max(0) as u64)
            .filter(|s| *s > 0),
        task_image: (!req.task_image.is_empty()).then(|| req.task_image.clone()),
        secrets: req
            .environment
            .as_ref()
            .map(|e| e.secrets.clone().into_iter().collect())
            .unwrap_or_default(),
    }
}

impl Backend for KubeBackend {
    fn worker_id(&self) -> String {
        self.id.clone()
    }

    fn registration(&self) -> BoxFuture<'_, Result<Registration, Error>> {
        Box::pin(async move { Ok(self.registration_now()) })
    }

    fn reconcile(&self, desired: Vec<DesiredAttempt>) -> BoxFuture<'_, Result<Report, Error>> {
        Box::pin(self.reconcile_now(desired))
    }

    fn summary(&self) -> BoxFuture<'_, Result<Summary, Error>> {
        Box::pin(self.summary_now())
    }
}

/// A client for the configured cluster: the operator's kubeconfig file (and pinned context)
/// when given, else the in-cluster service account. Neither ever reaches a Pod.
pub async fn client(
    kubeconfig: Option<&str>,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig.filter(|p| !p.is_empty()) {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                anyhow::anyhow!("kubernetes_provider.kubeconfig: reading {path}: {e}")
            })?;
            let opts = kube::config::KubeConfigOptions {
                context: context.map(str::to_string),
                ..Default::default()
            };
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| anyhow::anyhow!("kubernetes_provider.kubeconfig {path}: {e}"))?
        }
        None => kube::Config::incluster().map_err(|e| {
            anyhow::anyhow!("no kubernetes_provider.kubeconfig and not running in a cluster: {e}")
        })?,
    };
    kube::Client::try_from(config).map_err(|e| anyhow::anyhow!("kubernetes client: {e}"))
}
