//! The scheduler and kubelet, emulated: ungated pods are bound to a node with room for their GPUs,
//! their containers run as local processes, and the pod status follows the processes.
//!
//! Per pod, [`PodRun`] holds the facts (container states, exits recorded by the process
//! monitors); [`tick`] advances it one step and renders the pod status from it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::cluster::{Cluster, Shared};
use crate::pod;
use crate::process::{self, Exit, LogBuffer, NotReady, PodDirs};
use crate::resources::{def, id};
use crate::selector::labels_of;
use crate::status::ApiError;
use crate::store::{meta_str, name_of, now_rfc3339, uid_of};

/// How a pod is disrupted through the handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disruption {
    /// Graceful node shutdown: `DisruptionTarget=True` reason `TerminationByKubelet` (message
    /// names the node), containers terminated, phase `Failed` with reason `Terminated`. The pod
    /// object stays.
    NodeShutdown,
    /// Kubelet node-pressure eviction: `DisruptionTarget=True` reason `TerminationByKubelet`
    /// (Kubernetes ≥ 1.26 adds it), phase `Failed` with reason `Evicted`. The pod object stays.
    NodePressureEviction,
    /// The Eviction API (`POST pods/{name}/eviction`, as `kubectl drain`): PodDisruptionBudgets
    /// are honoured, then `DisruptionTarget=True` reason `EvictionByEvictionAPI` and a graceful
    /// delete.
    EvictionApi,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum CState {
    Waiting { reason: String, message: String },
    Running { started_at: String },
    Terminated { started_at: String, exit: Exit },
}

struct ContainerRun {
    name: String,
    image: String,
    init: bool,
    sidecar: bool,
    state: CState,
    pgid: Option<i32>,
    log: Arc<LogBuffer>,
    container_id: String,
}

impl ContainerRun {
    fn live(&self) -> bool {
        self.pgid.is_some() && matches!(self.state, CState::Running { .. })
    }

    /// An init container lets the next one start: it succeeded, or it is a started sidecar.
    fn init_satisfied(&self) -> bool {
        let sidecar_started = self.sidecar && !matches!(self.state, CState::Waiting { .. });
        sidecar_started || self.exit().is_some_and(|e| e.code == 0)
    }

    fn exit(&self) -> Option<&Exit> {
        match &self.state {
            CState::Terminated { exit, .. } => Some(exit),
            _ => None,
        }
    }
}

/// Why the kubelet is terminating a pod it keeps (not a delete).
#[derive(Debug, Clone)]
struct Termination {
    reason: String,
    message: String,
}

/// The kubelet's record of one pod.
pub(crate) struct PodRun {
    dirs: PodDirs,
    volumes: Option<HashMap<String, PathBuf>>,
    containers: Vec<ContainerRun>,
    pull_attempts: u32,
    /// `spec.activeDeadlineSeconds`, watched while the pod runs.
    deadline: Option<Duration>,
    start_time: String,
    started_instant: Instant,
    termination: Option<Termination>,
    stop_requested: Option<Instant>,
    kill_sent: bool,
    final_phase: Option<&'static str>,
    /// The pod's resourceVersion and this run's fingerprint after the last status write.
    rendered: Option<(String, u64)>,
}

impl PodRun {
    /// Everything the rendered status depends on.
    fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for c in &self.containers {
            c.state.hash(&mut h);
            c.pgid.is_some().hash(&mut h);
        }
        self.final_phase.hash(&mut h);
        self.termination.as_ref().map(|t| &t.reason).hash(&mut h);
        self.stop_requested.is_some().hash(&mut h);
        self.pull_attempts.hash(&mut h);
        self.volumes.is_some().hash(&mut h);
        h.finish()
    }

    /// Nothing will happen without an exit, a write or a stop: every container started (or the
    /// pod ended), no deadline and no stop pending.
    fn settled(&self) -> bool {
        self.final_phase.is_some()
            || (self.stop_requested.is_none()
                && self.termination.is_none()
                && self.deadline.is_none()
                && self
                    .containers
                    .iter()
                    .all(|c| !matches!(c.state, CState::Waiting { .. })))
    }

    fn any_live(&self) -> bool {
        self.containers.iter().any(ContainerRun::live)
    }

    fn main(&self) -> impl Iterator<Item = &ContainerRun> {
        self.containers.iter().filter(|c| !c.init)
    }
}

#[derive(Default)]
pub(crate) struct Kubelet {
    runs: HashMap<String, PodRun>,
    /// A process exit was recorded since the last step.
    pub(crate) dirty: bool,
}

fn random_hex(n: usize) -> String {
    (0..n)
        .map(|_| format!("{:x}", rand::random::<u8>() % 16))
        .collect()
}

impl Kubelet {
    /// A process monitor's report: the container's process ended.
    /// Whether a run is waiting on the clock (a grace period to enforce, a deadline to watch, an
    /// image pull to retry), so the simulation must keep stepping without any write.
    pub(crate) fn needs_time(&self) -> bool {
        self.runs.values().any(|r| {
            (r.stop_requested.is_some() && r.any_live())
                || (r.final_phase.is_none() && r.deadline.is_some())
                || r.pull_attempts == 1
        })
    }

    pub(crate) fn record_exit(&mut self, pod_uid: &str, container: &str, exit: Exit) {
        self.dirty = true;
        let Some(run) = self.runs.get_mut(pod_uid) else {
            return;
        };
        if let Some(c) = run.containers.iter_mut().find(|c| c.name == container) {
            let started_at = match &c.state {
                CState::Running { started_at } => started_at.clone(),
                _ => exit.finished_at.clone(),
            };
            c.state = CState::Terminated { started_at, exit };
            c.pgid = None;
        }
    }

    pub(crate) fn has_live_processes(&self, pod_uid: &str) -> bool {
        self.runs.get(pod_uid).is_some_and(PodRun::any_live)
    }

    /// The log of a container (`None` when the pod has no such container started here).
    pub(crate) fn log(&self, pod_uid: &str, container: &str) -> Option<Arc<LogBuffer>> {
        self.runs
            .get(pod_uid)?
            .containers
            .iter()
            .find(|c| c.name == container)
            .map(|c| c.log.clone())
    }

    /// Whether a container has started (so it has a log to read), and if not, why.
    pub(crate) fn waiting_reason(&self, pod_uid: &str, container: &str) -> Option<String> {
        let run = self.runs.get(pod_uid)?;
        let c = run.containers.iter().find(|c| c.name == container)?;
        match &c.state {
            CState::Waiting { reason, .. } => Some(reason.clone()),
            _ => None,
        }
    }

    /// Process groups of every live container (for shutdown).
    pub(crate) fn all_pgids(&self) -> Vec<i32> {
        self.runs
            .values()
            .flat_map(|r| r.containers.iter().filter_map(|c| c.pgid))
            .collect()
    }

    pub(crate) fn live_process_count(&self) -> usize {
        self.runs
            .values()
            .map(|r| r.containers.iter().filter(|c| c.live()).count())
            .sum()
    }
}

fn kill_run(run: &mut PodRun, sig: Signal) {
    for c in &run.containers {
        if let (Some(pgid), true) = (c.pgid, c.live()) {
            process::signal_group(pgid, sig);
        }
    }
}

/// Stops the processes of pods the store no longer has (force-deleted, vanished, GC'd).
fn reap_orphans(cl: &mut Cluster) {
    let uids = cl.store.all_uids();
    let gone: Vec<String> = cl
        .kubelet
        .runs
        .keys()
        .filter(|u| !uids.contains(*u))
        .cloned()
        .collect();
    for uid in gone {
        if let Some(mut run) = cl.kubelet.runs.remove(&uid) {
            kill_run(&mut run, Signal::SIGKILL);
            for c in &run.containers {
                c.log.close();
            }
        }
    }
}

fn node_ready(n: &Value) -> bool {
    match pod::condition(n, "Ready") {
        Some(c) => c.get("status").and_then(Value::as_str) == Some("True"),
        None => true,
    }
}

fn tolerates(p: &Value, taint: &Value) -> bool {
    let tk = taint.get("key").and_then(Value::as_str).unwrap_or_default();
    let tv = taint
        .get("value")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let te = taint
        .get("effect")
        .and_then(Value::as_str)
        .unwrap_or_default();
    p.pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                let key = t.get("key").and_then(Value::as_str).unwrap_or_default();
                let op = t.get("operator").and_then(Value::as_str).unwrap_or("Equal");
                let effect = t.get("effect").and_then(Value::as_str).unwrap_or_default();
                let key_ok = key.is_empty() && op == "Exists" || key == tk;
                let val_ok = op == "Exists"
                    || t.get("value").and_then(Value::as_str).unwrap_or_default() == tv;
                key_ok && val_ok && (effect.is_empty() || effect == te)
            })
        })
}

fn affinity_matches(p: &Value, labels: &std::collections::BTreeMap<String, String>) -> bool {
    let Some(terms) = p
        .pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
    else {
        return true;
    };
    terms.iter().any(|term| {
        term.get("matchExpressions")
            .and_then(Value::as_array)
            .is_none_or(|exprs| {
                exprs.iter().all(|e| {
                    let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
                    let values: Vec<&str> = e
                        .get("values")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let v = labels.get(key).map(String::as_str);
                    match e
                        .get("operator")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                    {
                        "In" => v.is_some_and(|v| values.contains(&v)),
                        "NotIn" => v.is_none_or(|v| !values.contains(&v)),
                        "Exists" => v.is_some(),
                        "DoesNotExist" => v.is_none(),
                        _ => false,
                    }
                })
            })
    })
}

/// Picks a node for `p` (first by name among those that fit) or explains why none fits, in the
/// scheduler's words.
/// GPUs held per node by bound, non-terminal pods.
fn gpus_in_use(cl: &Cluster) -> HashMap<String, u64> {
    let mut used: HashMap<String, u64> = HashMap::new();
    for p in cl.store.list(id::PODS, None) {
        if !pod::is_terminal(p) && !pod::node_name(p).is_empty() {
            *used.entry(pod::node_name(p).to_string()).or_default() += pod::gpus(p);
        }
    }
    used
}

fn schedule(cl: &Cluster, used: &HashMap<String, u64>, p: &Value) -> Result<String, String> {
    let nodes: Vec<&Value> = cl.store.list(id::NODES, None).collect();
    if nodes.is_empty() {
        return Err("no nodes available to schedule pods".into());
    }
    let want = pod::gpus(p);
    let selector: Vec<(String, String)> = p
        .pointer("/spec/nodeSelector")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
    let mut reasons: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for n in &nodes {
        let labels = labels_of(n);
        let reason = if !node_ready(n) {
            Some("node(s) were not ready".to_string())
        } else if n.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
            Some("node(s) were unschedulable".to_string())
        } else if !selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            || !affinity_matches(p, &labels)
        {
            Some("node(s) didn't match Pod's node affinity/selector".to_string())
        } else if let Some(t) = n
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .and_then(|ts| {
                ts.iter().find(|t| {
                    matches!(
                        t.get("effect").and_then(Value::as_str),
                        Some("NoSchedule" | "NoExecute")
                    ) && !tolerates(p, t)
                })
            })
        {
            Some(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                t.get("key").and_then(Value::as_str).unwrap_or_default(),
                t.get("value").and_then(Value::as_str).unwrap_or_default()
            ))
        } else {
            let alloc = n
                .pointer("/status/allocatable")
                .and_then(|a| a.get(pod::GPU))
                .map(pod::quantity)
                .unwrap_or(0);
            let free = alloc.saturating_sub(used.get(name_of(n)).copied().unwrap_or(0));
            (want > free).then(|| format!("Insufficient {}", pod::GPU))
        };
        match reason {
            None => return Ok(name_of(n).to_string()),
            Some(r) => *reasons.entry(r).or_default() += 1,
        }
    }
    let detail: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    Err(format!(
        "0/{} nodes are available: {}. preemption: 0/{} nodes are available: {} Preemption is not helpful for scheduling.",
        nodes.len(),
        detail.join(", "),
        nodes.len(),
        nodes.len()
    ))
}

fn new_run(cl: &Cluster, p: &Value) -> PodRun {
    let mut containers = Vec::new();
    for (init, list) in [(true, pod::init_containers(p)), (false, pod::containers(p))] {
        for c in list {
            containers.push(ContainerRun {
                name: c
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                image: c
                    .get("image")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                init,
                sidecar: init && pod::is_sidecar(c),
                state: CState::Waiting {
                    reason: if init {
                        "ContainerCreating"
                    } else {
                        "PodInitializing"
                    }
                    .into(),
                    message: String::new(),
                },
                pgid: None,
                log: LogBuffer::new(),
                container_id: format!("containerd://{}", random_hex(64)),
            });
        }
    }
    if !containers.iter().any(|c| c.init) {
        for c in containers.iter_mut() {
            c.state = CState::Waiting {
                reason: "ContainerCreating".into(),
                message: String::new(),
            };
        }
    }
    PodRun {
        dirs: process::pod_dirs(&cl.settings.work_dir, p),
        volumes: None,
        containers,
        pull_attempts: 0,
        deadline: p
            .pointer("/spec/activeDeadlineSeconds")
            .and_then(Value::as_u64)
            .map(Duration::from_secs),
        start_time: now_rfc3339(),
        started_instant: Instant::now(),
        termination: None,
        stop_requested: None,
        kill_sent: false,
        final_phase: None,
        rendered: None,
    }
}

fn container_spec<'a>(p: &'a Value, name: &str) -> Option<&'a Value> {
    pod::init_containers(p)
        .iter()
        .chain(pod::containers(p))
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
}

/// Starts container `idx` (or records why it cannot start).
fn start_container(cl: &Cluster, shared: &Weak<Shared>, p: &Value, run: &mut PodRun, idx: usize) {
    let uid = uid_of(p).to_string();
    let name = run.containers[idx].name.clone();
    let now = now_rfc3339();
    let skip_init = run.containers[idx].init
        && !run.containers[idx].sidecar
        && !cl.settings.run_init_containers;
    if run.containers[idx].sidecar || skip_init {
        // Native sidecars are not executed (they ship logs or upload outputs from images that do
        // not exist here); skipped init containers count as succeeded.
        run.containers[idx].state = if skip_init {
            CState::Terminated {
                started_at: now.clone(),
                exit: Exit {
                    code: 0,
                    finished_at: now,
                    message: None,
                },
            }
        } else {
            CState::Running { started_at: now }
        };
        run.containers[idx].log.close();
        return;
    }
    let Some(spec) = container_spec(p, &name) else {
        return;
    };
    let volumes = run.volumes.clone().unwrap_or_default();
    match process::prepare(cl, p, spec, &run.dirs, &volumes) {
        Err(NotReady { reason, message }) => {
            run.containers[idx].state = CState::Waiting {
                reason: reason.into(),
                message,
            };
        }
        Ok(ps) if ps.argv.is_empty() => {
            run.containers[idx].state = CState::Terminated {
                started_at: now.clone(),
                exit: Exit {
                    code: 0,
                    finished_at: now,
                    message: None,
                },
            };
            run.containers[idx].log.close();
        }
        Ok(ps) => {
            let log = run.containers[idx].log.clone();
            match process::spawn(shared.clone(), uid, name, &ps, log) {
                Ok(pgid) => {
                    run.containers[idx].pgid = Some(pgid);
                    run.containers[idx].state = CState::Running { started_at: now };
                }
                Err(e) => {
                    let msg = format!(
                        "failed to create containerd task: failed to create shim task: OCI runtime create failed: exec: \"{}\": {e}",
                        ps.argv[0]
                    );
                    run.containers[idx].state = CState::Terminated {
                        started_at: now.clone(),
                        exit: Exit {
                            code: 128,
                            finished_at: now,
                            message: Some(msg),
                        },
                    };
                    run.containers[idx].log.close();
                }
            }
        }
    }
}

/// One kubelet step for a bound, live pod: pull, init containers in order, then the app
/// containers; the phase is final once every app container ended or an init container failed.
fn advance(cl: &Cluster, shared: &Weak<Shared>, p: &Value, run: &mut PodRun) {
    if run.final_phase.is_some() {
        return;
    }
    if run.stop_requested.is_none() {
        if let Some(bad) = run.containers.iter().position(|c| {
            matches!(c.state, CState::Waiting { .. }) && cl.settings.is_bad_image(&c.image)
        }) {
            run.pull_attempts += 1;
            let image = run.containers[bad].image.clone();
            run.containers[bad].state = if run.pull_attempts == 1 {
                CState::Waiting {
                    reason: "ErrImagePull".into(),
                    message: format!("failed to pull and unpack image \"{image}\": not found"),
                }
            } else {
                CState::Waiting {
                    reason: "ImagePullBackOff".into(),
                    message: format!("Back-off pulling image \"{image}\""),
                }
            };
            return;
        }
        if run.volumes.is_none() {
            match process::materialize_volumes(cl, p, &run.dirs) {
                Ok(v) => run.volumes = Some(v),
                Err(NotReady { reason, message }) => {
                    for c in run.containers.iter_mut() {
                        c.state = CState::Waiting {
                            reason: reason.into(),
                            message: message.clone(),
                        };
                    }
                    return;
                }
            }
        }
        // Init containers, in order; sidecars start and keep running.
        let mut init_done = true;
        for idx in 0..run.containers.len() {
            if !run.containers[idx].init {
                continue;
            }
            match run.containers[idx].state.clone() {
                CState::Waiting { .. } => {
                    start_container(cl, shared, p, run, idx);
                    if !run.containers[idx].init_satisfied() {
                        init_done = false;
                        break;
                    }
                }
                CState::Running { .. } if run.containers[idx].sidecar => {}
                CState::Running { .. } => {
                    init_done = false;
                    break;
                }
                CState::Terminated { exit, .. } => {
                    if exit.code != 0 {
                        run.final_phase = Some("Failed");
                        return;
                    }
                }
            }
        }
        if !init_done {
            return;
        }
        for idx in 0..run.containers.len() {
            if !run.containers[idx].init
                && matches!(run.containers[idx].state, CState::Waiting { .. })
            {
                start_container(cl, shared, p, run, idx);
            }
        }
        if let Some(deadline) = run.deadline {
            if run.started_instant.elapsed() > deadline && run.termination.is_none() {
                run.termination = Some(Termination {
                    reason: "DeadlineExceeded".into(),
                    message: "Pod was active on the node longer than the specified deadline".into(),
                });
                run.stop_requested = Some(Instant::now());
            }
        }
    }
    let app_done = run.main().all(|c| c.exit().is_some());
    if app_done && run.stop_requested.is_none() {
        let ok = run.main().all(|c| c.exit().is_some_and(|e| e.code == 0));
        run.final_phase = Some(if ok { "Succeeded" } else { "Failed" });
    } else if run.stop_requested.is_some() && !run.any_live() {
        let ok = app_done
            && run.main().all(|c| c.exit().is_some_and(|e| e.code == 0))
            && run.termination.is_none();
        run.final_phase = Some(if ok { "Succeeded" } else { "Failed" });
    }
    if run.final_phase.is_some() {
        let now = now_rfc3339();
        for c in run.containers.iter_mut().filter(|c| c.sidecar) {
            if let CState::Running { started_at } = &c.state {
                c.state = CState::Terminated {
                    started_at: started_at.clone(),
                    exit: Exit {
                        code: 0,
                        finished_at: now.clone(),
                        message: None,
                    },
                };
            }
        }
    }
}

/// Sends SIGTERM once a stop is requested and SIGKILL after the (capped) grace period.
fn enforce_stop(cl: &Cluster, p: &Value, run: &mut PodRun) {
    let Some(since) = run.stop_requested else {
        return;
    };
    if !run.any_live() {
        return;
    }
    let grace = p
        .pointer("/metadata/deletionGracePeriodSeconds")
        .or_else(|| p.pointer("/spec/terminationGracePeriodSeconds"))
        .and_then(Value::as_u64)
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(30))
        .min(cl.settings.max_termination_grace);
    if since.elapsed() >= grace {
        kill_run(run, Signal::SIGKILL);
    }
}

fn request_stop(run: &mut PodRun) {
    if run.stop_requested.is_none() {
        run.stop_requested = Some(Instant::now());
    }
    if !run.kill_sent {
        run.kill_sent = true;
        kill_run(run, Signal::SIGTERM);
    }
}

fn container_status(c: &ContainerRun, final_phase: Option<&str>) -> Value {
    let image_id = format!(
        "{}@sha256:{}",
        c.image.split(':').next().unwrap_or_default(),
        "0".repeat(64)
    );
    let state = match &c.state {
        CState::Waiting { reason, message } => {
            let mut w = json!({"reason": reason});
            if !message.is_empty() {
                w["message"] = json!(message);
            }
            json!({"waiting": w})
        }
        CState::Running { started_at } => json!({"running": {"startedAt": started_at}}),
        CState::Terminated { started_at, exit } => {
            let mut t = json!({
                "exitCode": exit.code,
                "reason": if exit.code == 0 { "Completed" } else if exit.code == 128 && exit.message.is_some() { "StartError" } else { "Error" },
                "startedAt": started_at,
                "finishedAt": exit.finished_at,
                "containerID": c.container_id,
            });
            if let Some(m) = &exit.message {
                t["message"] = json!(m);
            }
            json!({"terminated": t})
        }
    };
    let running = matches!(c.state, CState::Running { .. });
    let mut s = json!({
        "name": c.name,
        "image": c.image,
        "imageID": if matches!(c.state, CState::Waiting { .. }) { String::new() } else { image_id },
        "ready": running && final_phase.is_none(),
        "started": running,
        "restartCount": 0,
        "state": state,
        "lastState": {},
    });
    if !matches!(c.state, CState::Waiting { .. }) {
        s["containerID"] = json!(c.container_id);
    }
    s
}

/// The pod status as the kubelet reports it from `run`.
fn render(p: &Value, run: &PodRun) -> Value {
    let mut next = p.clone();
    let phase = match run.final_phase {
        Some(ph) => ph,
        None if run
            .main()
            .any(|c| !matches!(c.state, CState::Waiting { .. })) =>
        {
            "Running"
        }
        None => "Pending",
    };
    let inits: Vec<Value> = run
        .containers
        .iter()
        .filter(|c| c.init)
        .map(|c| container_status(c, run.final_phase))
        .collect();
    let mains: Vec<Value> = run
        .main()
        .map(|c| container_status(c, run.final_phase))
        .collect();
    {
        let st = pod::status_mut(&mut next);
        st.insert("phase".into(), json!(phase));
        st.insert("hostIP".into(), json!("127.0.0.1"));
        st.insert("hostIPs".into(), json!([{"ip": "127.0.0.1"}]));
        st.insert("podIP".into(), json!("127.0.0.1"));
        st.insert("podIPs".into(), json!([{"ip": "127.0.0.1"}]));
        st.insert("startTime".into(), json!(run.start_time));
        if !inits.is_empty() {
            st.insert("initContainerStatuses".into(), json!(inits));
        }
        st.insert("containerStatuses".into(), json!(mains));
        if let (Some(t), Some(_)) = (&run.termination, run.final_phase) {
            st.insert("reason".into(), json!(t.reason));
            st.insert("message".into(), json!(t.message));
        }
    }
    let initialized_pending: Vec<&str> = run
        .containers
        .iter()
        .filter(|c| c.init && !c.init_satisfied())
        .map(|c| c.name.as_str())
        .collect();
    pod::ensure_condition(
        &mut next,
        "PodReadyToStartContainers",
        if run.final_phase.is_some() && !run.any_live() {
            "False"
        } else {
            "True"
        },
        "",
        "",
        true,
    );
    if initialized_pending.is_empty() {
        pod::ensure_condition(&mut next, "Initialized", "True", "", "", true);
    } else {
        let msg = format!(
            "containers with incomplete status: [{}]",
            initialized_pending.join(" ")
        );
        pod::ensure_condition(
            &mut next,
            "Initialized",
            "False",
            "ContainersNotInitialized",
            &msg,
            true,
        );
    }
    let unready: Vec<&str> = run
        .main()
        .filter(|c| !matches!(c.state, CState::Running { .. }))
        .map(|c| c.name.as_str())
        .collect();
    if run.final_phase.is_some() {
        pod::ensure_condition(
            &mut next,
            "ContainersReady",
            "False",
            "PodCompleted",
            "",
            true,
        );
        pod::ensure_condition(&mut next, "Ready", "False", "PodCompleted", "", true);
    } else if unready.is_empty() {
        pod::ensure_condition(&mut next, "ContainersReady", "True", "", "", true);
        pod::ensure_condition(&mut next, "Ready", "True", "", "", true);
    } else {
        let msg = format!("containers with unready status: [{}]", unready.join(" "));
        pod::ensure_condition(
            &mut next,
            "ContainersReady",
            "False",
            "ContainersNotReady",
            &msg,
            true,
        );
        pod::ensure_condition(
            &mut next,
            "Ready",
            "False",
            "ContainersNotReady",
            &msg,
            true,
        );
    }
    next
}

fn has_finalizers(p: &Value) -> bool {
    p.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// A pod this pass can skip: gated and already reported so, or run by a settled kubelet run
/// whose last status write is still current.
fn is_quiet(cl: &Cluster, p: &Value) -> bool {
    if pod::is_deleting(p) {
        return false;
    }
    if pod::node_name(p).is_empty() {
        let reported = pod::condition(p, "PodScheduled")
            .and_then(|c| c.get("reason"))
            .and_then(Value::as_str)
            == Some("SchedulingGated");
        return reported && !pod::gates(p).is_empty();
    }
    cl.kubelet.runs.get(uid_of(p)).is_some_and(|run| {
        run.settled()
            && run.rendered.as_ref().is_some_and(|(rv, fp)| {
                rv == meta_str(p, "resourceVersion") && *fp == run.fingerprint()
            })
    })
}

/// One scheduler + kubelet pass over every pod.
pub(crate) fn tick(cl: &mut Cluster, shared: &Weak<Shared>) {
    reap_orphans(cl);
    // Terminal pods that are not being deleted need nothing more from the kubelet.
    let keys: Vec<(String, String)> = cl
        .store
        .list(id::PODS, None)
        .filter(|p| !pod::is_terminal(p) || pod::is_deleting(p))
        .map(|p| (meta_str(p, "namespace").to_string(), name_of(p).to_string()))
        .collect();
    let mut used = gpus_in_use(cl);
    for (ns, name) in keys {
        let Some(current) = cl.store.get(id::PODS, &ns, &name) else {
            continue;
        };
        if is_quiet(cl, current) {
            continue;
        }
        let p = current.clone();
        let uid = uid_of(&p).to_string();
        let bound = !pod::node_name(&p).is_empty();
        let deleting = pod::is_deleting(&p);
        if !bound {
            if deleting {
                if !has_finalizers(&p) {
                    cl.store.remove(id::PODS, &ns, &name);
                }
                continue;
            }
            if pod::is_terminal(&p) {
                continue;
            }
            let mut next = p.clone();
            if !pod::gates(&p).is_empty() {
                pod::ensure_condition(
                    &mut next,
                    "PodScheduled",
                    "False",
                    "SchedulingGated",
                    "Scheduling is blocked due to non-empty scheduling gates",
                    true,
                );
            } else {
                match schedule(cl, &used, &p) {
                    Ok(node) => {
                        *used.entry(node.clone()).or_default() += pod::gpus(&p);
                        next["spec"]["nodeName"] = json!(node);
                        pod::ensure_condition(&mut next, "PodScheduled", "True", "", "", true);
                    }
                    Err(msg) => pod::ensure_condition(
                        &mut next,
                        "PodScheduled",
                        "False",
                        "Unschedulable",
                        &msg,
                        true,
                    ),
                }
            }
            cl.store.update(id::PODS, next);
            continue;
        }
        // Bound: the kubelet owns the pod from here.
        let mut run = match cl.kubelet.runs.remove(&uid) {
            Some(r) => r,
            None if pod::is_terminal(&p) => {
                // Terminal before this kubelet ran it (or after a disruption of a never-started pod).
                if deleting && !has_finalizers(&p) {
                    cl.store.remove(id::PODS, &ns, &name);
                }
                continue;
            }
            None => new_run(cl, &p),
        };
        if deleting || run.termination.is_some() {
            request_stop(&mut run);
        }
        advance(cl, shared, &p, &mut run);
        enforce_stop(cl, &p, &mut run);
        let next = render(&p, &run);
        let stored = cl.store.update(id::PODS, next);
        run.rendered = stored.map(|o| {
            (
                meta_str(&o, "resourceVersion").to_string(),
                run.fingerprint(),
            )
        });
        let done = run.final_phase.is_some() && !run.any_live();
        if deleting && done && !has_finalizers(cl.store.get(id::PODS, &ns, &name).unwrap_or(&p)) {
            cl.store.remove(id::PODS, &ns, &name);
            for c in &run.containers {
                c.log.close();
            }
            continue;
        }
        cl.kubelet.runs.insert(uid, run);
    }
}

/// Disrupts a pod as a node or the eviction API would (see [`Disruption`]).
pub(crate) fn disrupt(
    cl: &mut Cluster,
    ns: &str,
    name: &str,
    how: Disruption,
) -> Result<(), ApiError> {
    let d = def(id::PODS);
    let mut p = cl
        .store
        .get(id::PODS, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(d, name))?;
    let node = pod::node_name(&p).to_string();
    let (cond_reason, cond_msg, reason, message) = match how {
        Disruption::EvictionApi => return crate::apiserver::evict(cl, ns, name, &Default::default()),
        Disruption::NodeShutdown => (
            "TerminationByKubelet",
            format!("Pod was terminated in response to imminent node shutdown of node \"{node}\"."),
            "Terminated",
            "Pod was terminated in response to imminent node shutdown.".to_string(),
        ),
        Disruption::NodePressureEviction => (
            "TerminationByKubelet",
            format!("The node \"{node}\" was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 1Gi."),
            "Evicted",
            "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 1Gi. ".to_string(),
        ),
    };
    if pod::is_terminal(&p) {
        return Ok(());
    }
    pod::set_condition(
        &mut p,
        "DisruptionTarget",
        "True",
        cond_reason,
        &cond_msg,
        true,
    );
    let uid = uid_of(&p).to_string();
    match cl.kubelet.runs.get_mut(&uid) {
        Some(run) => {
            run.termination = Some(Termination {
                reason: reason.into(),
                message,
            });
            request_stop(run);
        }
        None => {
            let st = pod::status_mut(&mut p);
            st.insert("phase".into(), json!("Failed"));
            st.insert("reason".into(), json!(reason));
            st.insert("message".into(), json!(message));
        }
    }
    cl.store.update(id::PODS, p);
    Ok(())
}

/// Removes a pod at once, without grace or finalizers; its processes are killed.
pub(crate) fn vanish(cl: &mut Cluster, ns: &str, name: &str) -> Result<(), ApiError> {
    let d = def(id::PODS);
    let p = cl
        .store
        .remove(id::PODS, ns, name)
        .ok_or_else(|| ApiError::not_found(d, name))?;
    if let Some(mut run) = cl.kubelet.runs.remove(uid_of(&p)) {
        kill_run(&mut run, Signal::SIGKILL);
        for c in &run.containers {
            c.log.close();
        }
    }
    Ok(())
}
