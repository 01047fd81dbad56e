//! Kueue's plain-pod integration, emulated: the pod webhook (scheduling gate, managed label,
//! finalizer), Workload objects per pod or pod group, and admission against one GPU quota in
//! priority order with `withinClusterQueue: LowerPriority` preemption.
//!
//! The admission decision is [`plan`], a pure function over [`WorkloadView`]s; [`tick`] builds the
//! views from the store and applies the plan.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use crate::cluster::{Cluster, Settings};
use crate::pod;
use crate::resources::{id, ResourceDef};
use crate::status::ApiError;
use crate::store::{meta_str, metadata_mut, name_of, uid_of, Store};

pub(crate) const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
pub(crate) const PRIORITY_LABEL: &str = "kueue.x-k8s.io/priority-class";
pub(crate) const GROUP_LABEL: &str = "kueue.x-k8s.io/pod-group-name";
pub(crate) const TOTAL_COUNT: &str = "kueue.x-k8s.io/pod-group-total-count";
pub(crate) const GATE: &str = "kueue.x-k8s.io/admission";
pub(crate) const MANAGED_LABEL: &str = "kueue.x-k8s.io/managed";
pub(crate) const FINALIZER: &str = "kueue.x-k8s.io/managed";
const JOB_UID_LABEL: &str = "kueue.x-k8s.io/job-uid";
const GROUP_WORKLOAD: &str = "kueue.x-k8s.io/is-group-workload";
const POD_SET: &str = "main";

/// Kueue's bookkeeping that is not visible in objects.
#[derive(Debug, Default)]
pub(crate) struct KueueState {
    /// Admission sequence per workload uid (preemption prefers the most recently admitted).
    admitted_seq: HashMap<String, u64>,
    seq: u64,
    /// First-seen order per workload uid (FIFO among equal priorities).
    first_seen: HashMap<String, u64>,
    next_order: u64,
}

impl KueueState {
    fn order_of(&mut self, uid: &str) -> u64 {
        if let Some(o) = self.first_seen.get(uid) {
            return *o;
        }
        self.next_order += 1;
        self.first_seen.insert(uid.to_string(), self.next_order);
        self.next_order
    }

    /// Forgets workloads that no longer exist.
    fn retain(&mut self, live: &std::collections::HashSet<String>) {
        self.admitted_seq.retain(|k, _| live.contains(k));
        self.first_seen.retain(|k, _| live.contains(k));
    }
}

/// Kueue's mutating pod webhook: pods carrying the queue-name label get the admission gate, the
/// managed label and (optionally) the managed finalizer. Group pods must declare their size.
pub(crate) fn pod_webhook(
    settings: &Settings,
    d: &ResourceDef,
    name: &str,
    pod: &mut Value,
) -> Result<(), ApiError> {
    if pod::label(pod, QUEUE_LABEL).is_none() {
        return Ok(());
    }
    if pod::label(pod, GROUP_LABEL).is_some() {
        let total = pod::annotation(pod, TOTAL_COUNT).and_then(|v| v.parse::<i64>().ok());
        if total.is_none_or(|t| t < 1) {
            return Err(ApiError::forbidden_object(
                d,
                name,
                &format!("admission webhook \"vpod.kb.io\" denied the request: metadata.annotations[{TOTAL_COUNT}]: Required value: a pod in a group needs a positive total count"),
            ));
        }
    }
    let spec = pod
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| ApiError::invalid(d, name, "spec", "Required value"))?;
    let gates = spec.entry("schedulingGates").or_insert_with(|| json!([]));
    if let Value::Array(gs) = gates {
        if !gs
            .iter()
            .any(|g| g.get("name").and_then(Value::as_str) == Some(GATE))
        {
            gs.push(json!({"name": GATE}));
        }
    }
    let meta = metadata_mut(pod);
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    labels[MANAGED_LABEL] = json!("true");
    if settings.kueue_pod_finalizer {
        let fins = meta.entry("finalizers").or_insert_with(|| json!([]));
        if let Value::Array(fs) = fins {
            if !fs.iter().any(|f| f.as_str() == Some(FINALIZER)) {
                fs.push(json!(FINALIZER));
            }
        }
    }
    Ok(())
}

/// Where a workload stands, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WorkloadState {
    /// Waiting for quota; `ready` is false while a group is missing pods or its queue is absent.
    Pending {
        ready: bool,
        blocked: Option<String>,
    },
    /// Holding quota; `seq` orders admissions.
    Admitted { seq: u64 },
    /// Preempted, its pods still terminating: still holding quota.
    Evicting,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkloadView {
    pub name: String,
    pub priority: i64,
    /// GPUs (`nvidia.com/gpu`) over all pods of the workload.
    pub gpus: u64,
    /// Creation order (resourceVersion at creation).
    pub order: u64,
    pub state: WorkloadState,
}

/// What [`plan`] decided for one pending workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Admit,
    /// Evict these admitted workloads (indices into the input); admission follows once they let go.
    Preempt(Vec<usize>),
    /// Enough lower-priority quota is already being released.
    WaitForPreemption,
    /// Cannot be admitted now; the `QuotaReserved=False` message.
    NoFit(String),
    /// Not considered (group incomplete, queue missing).
    NotReady(Option<String>),
}

/// Admission in priority order (then creation order) against `quota` GPUs (`None`: unlimited).
/// A workload that does not fit may preempt strictly lower-priority admitted workloads, lowest
/// priority and most recently admitted first, keeping only the victims it needs.
pub(crate) fn plan(
    quota: Option<u64>,
    flavor: &str,
    wls: &[WorkloadView],
) -> Vec<(usize, Verdict)> {
    let mut held: u64 = wls
        .iter()
        .filter(|w| {
            matches!(
                w.state,
                WorkloadState::Admitted { .. } | WorkloadState::Evicting
            )
        })
        .map(|w| w.gpus)
        .sum();
    // (index, priority, gpus, seq) of admitted workloads that can still be preempted.
    let mut active: Vec<(usize, i64, u64, u64)> = wls
        .iter()
        .enumerate()
        .filter_map(|(i, w)| match w.state {
            WorkloadState::Admitted { seq } => Some((i, w.priority, w.gpus, seq)),
            _ => None,
        })
        .collect();
    let mut pending: Vec<usize> = wls
        .iter()
        .enumerate()
        .filter(|(_, w)| matches!(w.state, WorkloadState::Pending { .. }))
        .map(|(i, _)| i)
        .collect();
    pending.sort_by_key(|&i| {
        (
            std::cmp::Reverse(wls[i].priority),
            wls[i].order,
            wls[i].name.clone(),
        )
    });
    let mut out = Vec::new();
    let mut next_seq = u64::MAX / 2;
    for i in pending {
        let w = &wls[i];
        if let WorkloadState::Pending {
            ready: false,
            blocked,
        } = &w.state
        {
            out.push((i, Verdict::NotReady(blocked.clone())));
            continue;
        }
        let Some(q) = quota else {
            held += w.gpus;
            active.push((i, w.priority, w.gpus, next_seq));
            next_seq += 1;
            out.push((i, Verdict::Admit));
            continue;
        };
        if held + w.gpus <= q {
            held += w.gpus;
            active.push((i, w.priority, w.gpus, next_seq));
            next_seq += 1;
            out.push((i, Verdict::Admit));
            continue;
        }
        if w.gpus > q {
            out.push((i, Verdict::NoFit(format!(
                "couldn't assign flavors to pod set {POD_SET}: insufficient quota for {} in flavor {flavor}, request > maximum capacity ({} > {q})",
                pod::GPU, w.gpus
            ))));
            continue;
        }
        let active_held: u64 = active.iter().map(|a| a.2).sum();
        if active_held + w.gpus <= q {
            out.push((i, Verdict::WaitForPreemption));
            continue;
        }
        let mut candidates: Vec<(usize, i64, u64, u64)> = active
            .iter()
            .copied()
            .filter(|a| a.1 < w.priority)
            .collect();
        candidates.sort_by_key(|a| (a.1, std::cmp::Reverse(a.3)));
        let mut victims: Vec<(usize, i64, u64, u64)> = Vec::new();
        let mut freed = 0u64;
        for c in candidates {
            if active_held - freed + w.gpus <= q {
                break;
            }
            freed += c.2;
            victims.push(c);
        }
        if active_held - freed + w.gpus > q {
            out.push((i, Verdict::NoFit(format!(
                "couldn't assign flavors to pod set {POD_SET}: insufficient unused quota for {} in flavor {flavor}, {} more needed",
                pod::GPU,
                held + w.gpus - q
            ))));
            continue;
        }
        // Fill back: keep victims only if still needed, trying the last picked first.
        for k in (0..victims.len()).rev() {
            if active_held - (freed - victims[k].2) + w.gpus <= q {
                freed -= victims[k].2;
                victims.remove(k);
            }
        }
        active.retain(|a| !victims.iter().any(|v| v.0 == a.0));
        out.push((i, Verdict::Preempt(victims.iter().map(|v| v.0).collect())));
    }
    out
}

fn workload_priority(cl: &Cluster, pod: &Value) -> (Option<String>, i64) {
    match pod::label(pod, PRIORITY_LABEL) {
        Some(class) => {
            let v = cl
                .store
                .get(id::WORKLOAD_PRIORITY_CLASSES, "", class)
                .and_then(|c| c.get("value"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            (Some(class.to_string()), v)
        }
        None => (None, 0),
    }
}

fn is_active(p: &Value) -> bool {
    !pod::is_terminal(p) && !pod::is_deleting(p)
}

fn owner_ref(p: &Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "name": name_of(p), "uid": uid_of(p),
           "controller": false, "blockOwnerDeletion": true})
}

fn short_uid(uid: &str) -> String {
    uid.chars()
        .filter(|c| c.is_ascii_hexdigit())
        .take(5)
        .collect()
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The Workload a single (non-group) pod belongs to.
pub(crate) fn single_workload_name(pod: &Value) -> String {
    format!(
        "pod-{}-{}",
        truncate(name_of(pod), 240),
        short_uid(uid_of(pod))
    )
}

fn new_workload(cl: &Cluster, ns: &str, name: &str, pods: &[&Value], group: bool) -> Value {
    let first = pods[0];
    let (class, priority) = workload_priority(cl, first);
    let queue = pod::label(first, QUEUE_LABEL).unwrap_or_default();
    let mut template_spec = first.get("spec").cloned().unwrap_or_default();
    if let Some(m) = template_spec.as_object_mut() {
        m.remove("schedulingGates");
        m.remove("nodeName");
    }
    let mut wl = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {},
            "annotations": {},
            "ownerReferences": pods.iter().map(|p| owner_ref(p)).collect::<Vec<_>>(),
        },
        "spec": {
            "active": true,
            "queueName": queue,
            "priority": priority,
            "podSets": [{"name": POD_SET, "count": pods.len(), "template": {"spec": template_spec}}],
        },
    });
    if let Some(c) = class {
        wl["spec"]["priorityClassName"] = json!(c);
        wl["spec"]["priorityClassSource"] = json!("kueue.x-k8s.io/workloadpriorityclass");
    }
    if group {
        wl["metadata"]["annotations"][GROUP_WORKLOAD] = json!("true");
    } else {
        wl["metadata"]["labels"][JOB_UID_LABEL] = json!(uid_of(first));
        wl["metadata"]["ownerReferences"][0]["controller"] = json!(true);
    }
    wl
}

/// Where each managed pod sits, built once per pass: group members by `(namespace, group)`,
/// others by uid. Holds keys, not objects, so the pass can write while using it.
#[derive(Default)]
struct PodIndex {
    groups: HashMap<(String, String), Vec<String>>,
    single: HashMap<String, (String, String)>,
}

impl PodIndex {
    fn build(cl: &Cluster) -> Self {
        let mut idx = PodIndex::default();
        for p in cl
            .store
            .list(id::PODS, None)
            .filter(|p| pod::label(p, QUEUE_LABEL).is_some())
        {
            let ns = meta_str(p, "namespace").to_string();
            let name = name_of(p).to_string();
            match pod::label(p, GROUP_LABEL) {
                Some(g) => idx
                    .groups
                    .entry((ns, g.to_string()))
                    .or_default()
                    .push(name),
                None => {
                    idx.single.insert(uid_of(p).to_string(), (ns, name));
                }
            }
        }
        idx
    }
}

/// Pods of a workload: the owner pod of a single workload, the group's pods otherwise.
fn workload_pods<'a>(store: &'a Store, idx: &PodIndex, wl: &Value) -> Vec<&'a Value> {
    let ns = meta_str(wl, "namespace");
    let keys: Vec<(String, String)> = if pod::annotation(wl, GROUP_WORKLOAD) == Some("true") {
        let names = idx.groups.get(&(ns.to_string(), name_of(wl).to_string()));
        names
            .into_iter()
            .flatten()
            .map(|n| (ns.to_string(), n.clone()))
            .collect()
    } else {
        let uid = pod::label(wl, JOB_UID_LABEL).unwrap_or_default();
        idx.single.get(uid).into_iter().cloned().collect()
    };
    keys.iter()
        .filter_map(|(ns, n)| store.get(id::PODS, ns, n))
        .filter(|p| {
            pod::annotation(wl, GROUP_WORKLOAD) == Some("true")
                || pod::label(wl, JOB_UID_LABEL) == Some(uid_of(p))
        })
        .collect()
}

fn group_total(p: &Value) -> usize {
    pod::annotation(p, TOTAL_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn cluster_queue(store: &Store, settings: &Settings, ns: &str, queue: &str) -> Option<String> {
    store.get(id::LOCAL_QUEUES, ns, queue).map(|lq| {
        lq.pointer("/spec/clusterQueue")
            .and_then(Value::as_str)
            .unwrap_or(&settings.cluster_queue)
            .to_string()
    })
}

/// Creates Workloads for managed pods that have none (groups once every pod exists).
fn create_workloads(cl: &mut Cluster) {
    let managed: Vec<Value> = cl
        .store
        .list(id::PODS, None)
        .filter(|p| {
            pod::label(p, MANAGED_LABEL) == Some("true") && pod::label(p, QUEUE_LABEL).is_some()
        })
        .filter(|p| is_active(p) && pod::gates(p).iter().any(|g| g == GATE))
        .cloned()
        .collect();
    let mut groups: BTreeMap<(String, String), Vec<Value>> = BTreeMap::new();
    for p in managed {
        let ns = meta_str(&p, "namespace").to_string();
        match pod::label(&p, GROUP_LABEL) {
            Some(g) => groups.entry((ns, g.to_string())).or_default().push(p),
            None => {
                let name = single_workload_name(&p);
                if cl.store.get(id::WORKLOADS, &ns, &name).is_none() {
                    let wl = new_workload(cl, &ns, &name, &[&p], false);
                    cl.store.insert(id::WORKLOADS, wl);
                }
            }
        }
    }
    for ((ns, group), pods) in groups {
        if cl.store.get(id::WORKLOADS, &ns, &group).is_some() || pods.len() < group_total(&pods[0])
        {
            continue;
        }
        let refs: Vec<&Value> = pods.iter().collect();
        let wl = new_workload(cl, &ns, &group, &refs, true);
        cl.store.insert(id::WORKLOADS, wl);
    }
}

fn set_pods_gate_removed(cl: &mut Cluster, pods: Vec<Value>) {
    for mut p in pods {
        let Some(gates) = p
            .pointer_mut("/spec/schedulingGates")
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        let before = gates.len();
        gates.retain(|g| g.get("name").and_then(Value::as_str) != Some(GATE));
        if gates.len() != before {
            cl.store.update(id::PODS, p);
        }
    }
}

fn set_quota_reserved(cl: &Cluster, wl: &mut Value, gpus: u64, count: usize) {
    let ns = meta_str(wl, "namespace").to_string();
    let queue = wl
        .pointer("/spec/queueName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let cq = cluster_queue(&cl.store, &cl.settings, &ns, &queue)
        .unwrap_or_else(|| cl.settings.cluster_queue.clone());
    let flavor = cl.settings.resource_flavor.clone();
    pod::status_mut(wl).insert(
        "admission".into(),
        json!({"clusterQueue": cq, "podSetAssignments": [{
            "name": POD_SET,
            "flavors": {pod::GPU: flavor},
            "resourceUsage": {pod::GPU: gpus.to_string()},
            "count": count,
        }]}),
    );
    pod::set_condition(
        wl,
        "QuotaReserved",
        "True",
        "QuotaReserved",
        &format!("Quota reserved in ClusterQueue {cq}"),
        false,
    );
    pod::set_condition(
        wl,
        "Admitted",
        "True",
        "Admitted",
        "The workload is admitted",
        false,
    );
}

/// What one pass learned about the workloads: the planner's views (with each one's namespace)
/// and the status writes it already decided (finished, released).
#[derive(Default)]
struct Survey {
    views: Vec<WorkloadView>,
    namespaces: Vec<String>,
    writes: Vec<Value>,
}

fn survey(store: &Store, settings: &Settings, kueue: &mut KueueState, index: &PodIndex) -> Survey {
    let mut out = Survey::default();
    // Finished and deleting workloads hold nothing and need nothing.
    for wl in store
        .list(id::WORKLOADS, None)
        .filter(|w| !pod::condition_true(w, "Finished") && !pod::is_deleting(w))
    {
        let pods: Vec<&Value> = workload_pods(store, index, wl);
        let is_group = pod::annotation(wl, GROUP_WORKLOAD) == Some("true");
        let total = if is_group {
            pods.first().map(|p| group_total(p)).unwrap_or(usize::MAX)
        } else {
            1
        };
        let gpus: u64 = pods.iter().map(|p| pod::gpus(p)).sum();
        let any_active = pods.iter().any(|p| is_active(p));
        let all_terminal = pods.iter().all(|p| pod::is_terminal(p));
        let reserved = pod::condition_true(wl, "QuotaReserved");
        let evicted = pod::condition_true(wl, "Evicted");
        let state = if evicted {
            if any_active {
                WorkloadState::Evicting
            } else {
                if reserved {
                    let msg = pod::condition(wl, "Evicted")
                        .and_then(|c| c.get("message"))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    let mut next = wl.clone();
                    pod::set_condition(
                        &mut next,
                        "QuotaReserved",
                        "False",
                        "Preempted",
                        &msg,
                        false,
                    );
                    pod::set_condition(
                        &mut next,
                        "Admitted",
                        "False",
                        "NoReservation",
                        "The workload has no reservation",
                        false,
                    );
                    pod::status_mut(&mut next).remove("admission");
                    out.writes.push(next);
                }
                continue;
            }
        } else if reserved {
            if !pods.is_empty() && all_terminal && pods.len() >= total {
                let ok = pods.iter().filter(|p| pod::phase(p) == "Succeeded").count();
                let (reason, msg) = if ok == pods.len() {
                    let msg = if is_group {
                        format!("Pods succeeded: {ok}/{total}.")
                    } else {
                        "Job finished successfully".to_string()
                    };
                    ("Succeeded", msg)
                } else {
                    let m = pods
                        .iter()
                        .find_map(|p| p.pointer("/status/message").and_then(Value::as_str))
                        .unwrap_or("Job failed")
                        .to_string();
                    ("Failed", m)
                };
                let mut next = wl.clone();
                pod::set_condition(&mut next, "Finished", "True", reason, &msg, false);
                out.writes.push(next);
                continue;
            }
            if !any_active && all_terminal && pods.len() < total {
                continue;
            }
            let seq = *kueue
                .admitted_seq
                .entry(uid_of(wl).to_string())
                .or_insert(0);
            WorkloadState::Admitted { seq }
        } else {
            let active = pods.iter().filter(|p| is_active(p)).count();
            let queue = wl
                .pointer("/spec/queueName")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let ns = meta_str(wl, "namespace");
            let blocked = if settings.require_local_queue
                && cluster_queue(store, settings, ns, queue).is_none()
            {
                Some(format!("LocalQueue {queue} doesn't exist"))
            } else {
                None
            };
            WorkloadState::Pending {
                ready: active >= total && blocked.is_none(),
                blocked,
            }
        };
        out.views.push(WorkloadView {
            name: name_of(wl).to_string(),
            priority: wl
                .pointer("/spec/priority")
                .and_then(Value::as_i64)
                .unwrap_or(0),
            gpus,
            order: kueue.order_of(uid_of(wl)),
            state,
        });
        out.namespaces.push(meta_str(wl, "namespace").to_string());
    }
    out
}

/// One Kueue pass: create workloads, finish or release them, plan admission, apply it, and drop
/// the managed finalizer from pods Kueue no longer needs.
pub(crate) fn tick(cl: &mut Cluster) {
    create_workloads(cl);
    let live: std::collections::HashSet<String> = cl
        .store
        .list(id::WORKLOADS, None)
        .map(|w| uid_of(w).to_string())
        .collect();
    cl.kueue.retain(&live);
    let index = PodIndex::build(cl);
    let Survey {
        views,
        namespaces,
        writes,
    } = survey(&cl.store, &cl.settings, &mut cl.kueue, &index);
    for w in writes {
        cl.store.update(id::WORKLOADS, w);
    }
    let flavor = cl.settings.resource_flavor.clone();
    let verdicts = plan(cl.settings.gpu_quota, &flavor, &views);
    for (i, verdict) in verdicts {
        let Some(mut wl) = cl
            .store
            .get(id::WORKLOADS, &namespaces[i], &views[i].name)
            .cloned()
        else {
            continue;
        };
        match verdict {
            Verdict::Admit => {
                let pods: Vec<Value> = workload_pods(&cl.store, &index, &wl)
                    .into_iter()
                    .cloned()
                    .collect();
                set_quota_reserved(cl, &mut wl, views[i].gpus, pods.len());
                cl.kueue.seq += 1;
                let seq = cl.kueue.seq;
                cl.kueue.admitted_seq.insert(uid_of(&wl).to_string(), seq);
                cl.store.update(id::WORKLOADS, wl);
                set_pods_gate_removed(cl, pods);
            }
            Verdict::Preempt(victims) => {
                let msg = format!(
                    "Preempted to accommodate a workload (UID: {}, JobUID: {}) due to prioritization in the ClusterQueue",
                    uid_of(&wl),
                    job_uid(&wl)
                );
                for v in victims {
                    preempt(cl, &index, &namespaces[v], &views[v].name, &msg);
                }
                pod::ensure_condition(
                    &mut wl,
                    "QuotaReserved",
                    "False",
                    "Pending",
                    "Pending the preemption of lower priority workloads",
                    false,
                );
                cl.store.update(id::WORKLOADS, wl);
            }
            Verdict::WaitForPreemption => {
                pod::ensure_condition(
                    &mut wl,
                    "QuotaReserved",
                    "False",
                    "Pending",
                    "Pending the preemption of lower priority workloads",
                    false,
                );
                cl.store.update(id::WORKLOADS, wl);
            }
            Verdict::NoFit(msg) => {
                pod::ensure_condition(&mut wl, "QuotaReserved", "False", "Pending", &msg, false);
                cl.store.update(id::WORKLOADS, wl);
            }
            Verdict::NotReady(Some(msg)) => {
                pod::ensure_condition(
                    &mut wl,
                    "QuotaReserved",
                    "False",
                    "Inadmissible",
                    &msg,
                    false,
                );
                cl.store.update(id::WORKLOADS, wl);
            }
            Verdict::NotReady(None) => {}
        }
    }
    ungate_late_group_members(cl);
    release_finalizers(cl);
}

fn job_uid(wl: &Value) -> String {
    pod::label(wl, JOB_UID_LABEL)
        .map(str::to_string)
        .unwrap_or_else(|| name_of(wl).to_string())
}

/// Evicts an admitted workload: `Evicted`/`Preempted` conditions on the workload, then each
/// active pod gets `TerminationTarget=True` (reason `WorkloadEvictedDueToPreempted`) and is
/// deleted, as Kueue's pod integration stops pods.
fn preempt(cl: &mut Cluster, index: &PodIndex, ns: &str, name: &str, msg: &str) {
    let Some(mut wl) = cl.store.get(id::WORKLOADS, ns, name).cloned() else {
        return;
    };
    pod::set_condition(&mut wl, "Evicted", "True", "Preempted", msg, false);
    pod::set_condition(&mut wl, "Preempted", "True", "InClusterQueue", msg, false);
    let pods: Vec<Value> = workload_pods(&cl.store, index, &wl)
        .into_iter()
        .filter(|p| !pod::is_deleting(p))
        .cloned()
        .collect();
    cl.store.update(id::WORKLOADS, wl);
    for mut p in pods {
        if pod::is_terminal(&p) {
            continue;
        }
        pod::set_condition(
            &mut p,
            "TerminationTarget",
            "True",
            "WorkloadEvictedDueToPreempted",
            msg,
            true,
        );
        let pname = name_of(&p).to_string();
        cl.store.update(id::PODS, p);
        // Kueue deletes with the pod's own grace period.
        let _ = crate::apiserver::delete(cl, id::PODS, ns, &pname, &Default::default());
    }
}

/// A pod joining a group whose workload is already admitted (a replacement) is released at once.
fn ungate_late_group_members(cl: &mut Cluster) {
    let gated: Vec<Value> = cl
        .store
        .list(id::PODS, None)
        .filter(|p| pod::gates(p).iter().any(|g| g == GATE) && is_active(p))
        .filter(|p| pod::label(p, GROUP_LABEL).is_some())
        .cloned()
        .collect();
    let mut release = Vec::new();
    for p in gated {
        let ns = meta_str(&p, "namespace");
        let group = pod::label(&p, GROUP_LABEL).unwrap_or_default();
        let admitted = cl.store.get(id::WORKLOADS, ns, group).is_some_and(|wl| {
            pod::condition_true(wl, "QuotaReserved")
                && !pod::condition_true(wl, "Evicted")
                && !pod::condition_true(wl, "Finished")
        });
        if admitted {
            release.push(p);
        }
    }
    set_pods_gate_removed(cl, release);
}

/// Kueue drops its finalizer from a pod once the pod is being deleted and no longer running, or
/// once it is terminal and its workload finished (or is gone).
fn release_finalizers(cl: &mut Cluster) {
    let held: Vec<Value> = cl
        .store
        .list(id::PODS, None)
        .filter(|p| {
            p.pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|f| f.iter().any(|x| x.as_str() == Some(FINALIZER)))
        })
        .cloned()
        .collect();
    for mut p in held {
        let uid = uid_of(&p).to_string();
        let running = cl.kubelet.has_live_processes(&uid);
        let release = if pod::is_deleting(&p) {
            !running && (pod::is_terminal(&p) || pod::node_name(&p).is_empty())
        } else if pod::is_terminal(&p) {
            let ns = meta_str(&p, "namespace");
            let wl_name = pod::label(&p, GROUP_LABEL)
                .map(str::to_string)
                .unwrap_or_else(|| single_workload_name(&p));
            cl.store.get(id::WORKLOADS, ns, &wl_name).is_none_or(|wl| {
                pod::condition_true(wl, "Finished") || pod::condition_true(wl, "Evicted")
            })
        } else {
            false
        };
        if release {
            if let Some(fs) = p
                .pointer_mut("/metadata/finalizers")
                .and_then(Value::as_array_mut)
            {
                fs.retain(|f| f.as_str() != Some(FINALIZER));
            }
            cl.store.update(id::PODS, p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wl(name: &str, priority: i64, gpus: u64, order: u64, state: WorkloadState) -> WorkloadView {
        WorkloadView {
            name: name.into(),
            priority,
            gpus,
            order,
            state,
        }
    }

    fn pending() -> WorkloadState {
        WorkloadState::Pending {
            ready: true,
            blocked: None,
        }
    }

    #[test]
    fn admits_in_priority_order_within_quota() {
        let v = vec![
            wl("low", 0, 4, 1, pending()),
            wl("high", 10, 4, 2, pending()),
            wl("mid", 5, 4, 3, pending()),
        ];
        let p = plan(Some(8), "f", &v);
        assert_eq!(p[0], (1, Verdict::Admit));
        assert_eq!(p[1], (2, Verdict::Admit));
        assert!(
            matches!(&p[2], (0, Verdict::NoFit(m)) if m.contains("4 more needed")),
            "{p:?}"
        );
    }

    #[test]
    fn too_big_is_reported_as_capacity() {
        let p = plan(Some(8), "f", &[wl("big", 0, 16, 1, pending())]);
        assert!(
            matches!(&p[0].1, Verdict::NoFit(m) if m.contains("request > maximum capacity (16 > 8)"))
        );
    }

    #[test]
    fn preempts_lowest_priority_most_recent_and_fills_back() {
        let v = vec![
            wl("a", 1, 4, 1, WorkloadState::Admitted { seq: 1 }),
            wl("b", 1, 2, 2, WorkloadState::Admitted { seq: 2 }),
            wl("c", 0, 2, 3, WorkloadState::Admitted { seq: 3 }),
            wl("hi", 5, 4, 4, pending()),
        ];
        // Candidates in order c (prio 0), b (prio 1, newer), a: c+b free 4 → enough; fill-back keeps both.
        let p = plan(Some(8), "f", &v);
        assert_eq!(p, vec![(3, Verdict::Preempt(vec![2, 1]))]);
        // Same priority never preempts.
        let v2 = vec![
            wl("a", 5, 8, 1, WorkloadState::Admitted { seq: 1 }),
            wl("hi", 5, 4, 2, pending()),
        ];
        assert!(matches!(plan(Some(8), "f", &v2)[0].1, Verdict::NoFit(_)));
    }

    #[test]
    fn waits_for_evictions_in_flight() {
        let v = vec![
            wl("gone", 0, 8, 1, WorkloadState::Evicting),
            wl("hi", 5, 8, 2, pending()),
        ];
        assert_eq!(
            plan(Some(8), "f", &v),
            vec![(1, Verdict::WaitForPreemption)]
        );
        let v = vec![
            wl("gone", 0, 8, 1, WorkloadState::Evicting),
            wl("hi", 5, 8, 2, pending()),
            wl("lo", 0, 0, 3, pending()),
        ];
        assert_eq!(plan(Some(8), "f", &v)[1], (2, Verdict::Admit));
    }

    #[test]
    fn unlimited_and_not_ready() {
        let v = vec![
            wl(
                "g",
                0,
                64,
                1,
                WorkloadState::Pending {
                    ready: false,
                    blocked: None,
                },
            ),
            wl("x", 0, 64, 2, pending()),
        ];
        assert_eq!(
            plan(None, "f", &v),
            vec![(0, Verdict::NotReady(None)), (1, Verdict::Admit)]
        );
    }
}
