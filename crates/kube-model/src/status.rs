//! What an observed Pod (and its Kueue Workload) means for the attempt (reference §3.6).
//!
//! [`observe`] maps one Pod to an [`Observation`]: a task state, a human status line, the error
//! of a terminal attempt, the exit code, the node, and at most one event worth recording.
//! [`MissingTracker`] adds the grace the API needs: a pod that is missing, or whose phase is
//! `Unknown`, is only given up after [`MissingTracker::GRACE_SCANS`] consecutive scans.
//! Both are facts-only: retry decisions stay in `iris_types::transition`.

use std::collections::BTreeMap;
use std::fmt;

use iris_types::TaskState;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};
use k8s_openapi::jiff;
use serde_json::Value;

use crate::manifest::{KUEUE_POD_GROUP_NAME, KUEUE_QUEUE_NAME, TASK_CONTAINER};

/// Longest terminal reason or message kept, in characters.
pub const MAX_REASON_CHARS: usize = 500;

/// Kueue label carrying the uid of the pod a single-pod Workload belongs to.
pub const KUEUE_JOB_UID: &str = "kueue.x-k8s.io/job-uid";

/// Pod or container reasons that blame the infrastructure, not the task.
const INFRASTRUCTURE_REASONS: [&str; 3] = ["Evicted", "DeadlineExceeded", "Preempting"];

/// The task state an observation implies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObservedState {
    /// Pod accepted but not running yet (queued, gated, pulling, initialising).
    Building,
    /// The task container is running.
    Running,
    /// The task exited 0.
    Succeeded,
    /// The task failed (non-zero exit, OOM, bad init); charged to the task.
    Failed,
    /// Disrupted or evicted to make room; not charged as a failure.
    Preempted,
    /// The infrastructure failed it (eviction, deadline, lost pod); retried, not charged.
    WorkerFailed,
}

impl ObservedState {
    /// The Iris task state.
    pub fn task_state(self) -> TaskState {
        match self {
            ObservedState::Building => TaskState::Building,
            ObservedState::Running => TaskState::Running,
            ObservedState::Succeeded => TaskState::Succeeded,
            ObservedState::Failed => TaskState::Failed,
            ObservedState::Preempted => TaskState::Preempted,
            ObservedState::WorkerFailed => TaskState::WorkerFailed,
        }
    }

    /// True once the attempt has ended.
    pub fn is_terminal(self) -> bool {
        !matches!(self, ObservedState::Building | ObservedState::Running)
    }
}

/// How loud an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Severity {
    /// Worth recording.
    Info,
    /// Something the user probably has to act on or should know about.
    Warning,
}

/// Which part of Kubernetes an event comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventSource {
    /// Kueue admission and placement (`k8s/kueue`).
    Kueue,
    /// kube-scheduler's verdict on an ungated pod (`k8s/scheduler`), e.g. `Unschedulable`.
    Scheduler,
    /// The kubelet and container runtime (`k8s/container`).
    Container,
    /// Disruptions, evictions and lost pods (`k8s/disruption`).
    Disruption,
}

impl EventSource {
    /// `k8s/kueue`, `k8s/scheduler`, `k8s/container` or `k8s/disruption`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventSource::Kueue => "k8s/kueue",
            EventSource::Scheduler => "k8s/scheduler",
            EventSource::Container => "k8s/container",
            EventSource::Disruption => "k8s/disruption",
        }
    }
}

impl fmt::Display for EventSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An event for the task's history (`iris task events`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEvent {
    /// Severity.
    pub severity: Severity,
    /// Short CamelCase reason (`ImagePullBackOff`, `QuotaReserved`, …).
    pub reason: String,
    /// Human message.
    pub message: String,
    /// Origin.
    pub source: EventSource,
}

/// What one scan saw for an attempt's pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The state it implies.
    pub state: ObservedState,
    /// Why the task is in that state, for `task describe` (empty when there is nothing to say).
    pub status_message: String,
    /// The error of a terminal, unsuccessful attempt.
    pub error: Option<String>,
    /// The task container's exit code, once it exited.
    pub exit_code: Option<i32>,
    /// The node the pod is bound to.
    pub node_name: Option<String>,
    /// One event worth recording, if any.
    pub event: Option<PodEvent>,
}

impl Observation {
    fn new(state: ObservedState, pod: &Pod) -> Observation {
        Observation {
            state,
            status_message: String::new(),
            error: None,
            exit_code: None,
            node_name: node_name(pod),
            event: None,
        }
    }
}

fn node_name(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Unknown")
}

fn conditions(pod: &Pod) -> &[PodCondition] {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[])
}

fn true_condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a PodCondition> {
    conditions(pod)
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// The task container's status, by name, else the first one.
fn task_status(pod: &Pod) -> Option<&ContainerStatus> {
    let statuses = pod.status.as_ref()?.container_statuses.as_deref()?;
    statuses
        .iter()
        .find(|s| s.name == TASK_CONTAINER)
        .or_else(|| statuses.first())
}

/// `reason: message`, or whichever of the two is present.
fn reason_message(reason: &str, message: &str) -> String {
    match (reason.trim(), message.trim()) {
        ("", m) => m.to_string(),
        (r, "") => r.to_string(),
        (r, m) => format!("{r}: {m}"),
    }
}

/// Caps a terminal reason at [`MAX_REASON_CHARS`] characters.
fn cap(s: String) -> String {
    match s.char_indices().nth(MAX_REASON_CHARS) {
        Some((i, _)) => s[..i].to_string(),
        None => s,
    }
}

/// Waiting reasons that deserve a warning event.
fn is_container_warning(reason: &str) -> bool {
    matches!(
        reason,
        "ImagePullBackOff"
            | "ErrImagePull"
            | "InvalidImageName"
            | "RunContainerError"
            | "CrashLoopBackOff"
    ) || (reason.starts_with("CreateContainer") && reason.ends_with("Error"))
}

/// The task container's current waiting or terminated `(reason, message)`, if it has a reason.
fn container_reason(status: &ContainerStatus) -> Option<(String, String)> {
    let state = status.state.as_ref()?;
    if let Some(w) = &state.waiting {
        let reason = w.reason.clone().unwrap_or_default();
        if !reason.is_empty() {
            return Some((reason, w.message.clone().unwrap_or_default()));
        }
    }
    if let Some(t) = &state.terminated {
        let reason = t.reason.clone().unwrap_or_default();
        if !reason.is_empty() {
            return Some((reason, t.message.clone().unwrap_or_default()));
        }
    }
    None
}

/// A failed or stuck init container: `(reason, "Init:<reason> <container>: <message>")`.
fn init_failure(pod: &Pod) -> Option<(String, String)> {
    let statuses = pod.status.as_ref()?.init_container_statuses.as_deref()?;
    statuses.iter().find_map(|s| {
        let state = s.state.as_ref()?;
        let (reason, message) =
            if let Some(t) = state.terminated.as_ref().filter(|t| t.exit_code != 0) {
                let reason = t
                    .reason
                    .clone()
                    .filter(|r| !r.is_empty())
                    .unwrap_or_else(|| "Error".into());
                let message = t
                    .message
                    .clone()
                    .filter(|m| !m.trim().is_empty())
                    .unwrap_or_else(|| format!("exit code {}", t.exit_code));
                (reason, message)
            } else if let Some(w) = &state.waiting {
                let reason = w.reason.clone().unwrap_or_default();
                if reason.is_empty() || reason == "PodInitializing" {
                    return None;
                }
                (reason, w.message.clone().unwrap_or_default())
            } else {
                return None;
            };
        let text = match message.trim() {
            "" => format!("Init:{reason} {}", s.name),
            m => format!("Init:{reason} {}: {m}", s.name),
        };
        Some((reason, cap(text)))
    })
}

/// A pod Kueue manages (a queue or pod-group label).
fn is_kueue_managed(pod: &Pod) -> bool {
    label(pod, KUEUE_QUEUE_NAME).is_some() || label(pod, KUEUE_POD_GROUP_NAME).is_some()
}

/// A Kueue-managed pod still held by a scheduling gate.
fn is_kueue_gated(pod: &Pod) -> bool {
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty());
    let gated_condition = conditions(pod)
        .iter()
        .any(|c| c.status == "False" && c.reason.as_deref() == Some("SchedulingGated"));
    is_kueue_managed(pod) && (gates || gated_condition)
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, k| v.get(*k))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The Workload of a pod among `workloads`: by pod-group name for gangs (the Workload is named
/// after the group), otherwise by the pod's uid (an owner reference of kind Pod, or the
/// `kueue.x-k8s.io/job-uid` label).
pub fn find_workload<'a>(pod: &Pod, workloads: &'a [Value]) -> Option<&'a Value> {
    if let Some(group) = label(pod, KUEUE_POD_GROUP_NAME) {
        return workloads
            .iter()
            .find(|w| str_at(w, &["metadata", "name"]) == group);
    }
    let uid = pod.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    workloads.iter().find(|w| {
        let owned = w["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|refs| {
                refs.iter()
                    .any(|r| str_at(r, &["kind"]) == "Pod" && str_at(r, &["uid"]) == uid)
            });
        owned || str_at(w, &["metadata", "labels", KUEUE_JOB_UID]) == uid
    })
}

/// A Workload condition that is not `True` and says why.
struct KueueCondition<'a> {
    type_: &'a str,
    reason: &'a str,
    message: &'a str,
}

impl fmt::Display for KueueCondition<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.type_)?;
        if !self.reason.is_empty() {
            write!(f, " ({})", self.reason)?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

fn waiting_conditions(workload: &Value) -> Vec<KueueCondition<'_>> {
    workload["status"]["conditions"]
        .as_array()
        .map(|conds| {
            conds
                .iter()
                .filter(|c| str_at(c, &["status"]) != "True")
                .map(|c| KueueCondition {
                    type_: str_at(c, &["type"]),
                    reason: str_at(c, &["reason"]),
                    message: str_at(c, &["message"]),
                })
                .filter(|c| !c.reason.is_empty() || !c.message.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

fn is_admitted(workload: &Value) -> bool {
    let admission = &workload["status"]["admission"];
    let admitted_condition = workload["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| str_at(c, &["type"]) == "Admitted" && str_at(c, &["status"]) == "True")
        });
    !(admission.is_null() || admission.as_object().is_some_and(|o| o.is_empty()))
        || admitted_condition
}

/// Kueue's verdict on a gated pod, for its status line:
/// `Kueue workload <name>: queue=<q>, clusterQueue=<cq>; <Type (Reason): message>…`, ending in
/// `admitted by Kueue; waiting for scheduler gate removal` or `waiting for Kueue admission`
/// when no condition explains the wait.
pub fn kueue_verdict(pod: &Pod, workload: Option<&Value>) -> String {
    let group = label(pod, KUEUE_POD_GROUP_NAME)
        .or(pod.metadata.name.as_deref())
        .unwrap_or("");
    let Some(w) = workload else {
        return format!(
            "Kueue workload for '{group}' not found yet; waiting for Kueue to create and admit it"
        );
    };
    let name = match str_at(w, &["metadata", "name"]) {
        "" => group,
        n => n,
    };
    let mut details = Vec::new();
    let queue = str_at(w, &["spec", "queueName"]);
    let cluster_queue = str_at(w, &["status", "admission", "clusterQueue"]);
    match (queue, cluster_queue) {
        ("", "") => {}
        (q, "") => details.push(format!("queue={q}")),
        ("", cq) => details.push(format!("clusterQueue={cq}")),
        (q, cq) => details.push(format!("queue={q}, clusterQueue={cq}")),
    }
    let waiting = waiting_conditions(w);
    if !waiting.is_empty() {
        details.extend(waiting.iter().map(ToString::to_string));
    } else if is_admitted(w) {
        details.push("admitted by Kueue; waiting for scheduler gate removal".into());
    } else {
        details.push("waiting for Kueue admission".into());
    }
    format!("Kueue workload {name}: {}", details.join("; "))
}

/// The Kueue warning for a workload whose quota reservation failed with a reason.
fn quota_warning(workload: &Value) -> Option<PodEvent> {
    waiting_conditions(workload)
        .into_iter()
        .find(|c| c.type_ == "QuotaReserved" && !c.reason.is_empty())
        .map(|c| PodEvent {
            severity: Severity::Warning,
            reason: "QuotaReserved".into(),
            message: reason_message(c.reason, c.message),
            source: EventSource::Kueue,
        })
}

fn warning(reason: &str, message: String, source: EventSource) -> Option<PodEvent> {
    Some(PodEvent {
        severity: Severity::Warning,
        reason: reason.to_string(),
        message,
        source,
    })
}

/// `<reason>: <message>` of a `DisruptionTarget=True` condition and the same text naming the
/// node, if the pod has one.
fn disruption(pod: &Pod) -> Option<(String, String, String)> {
    let c = true_condition(pod, "DisruptionTarget")?;
    let reason = c
        .reason
        .clone()
        .unwrap_or_else(|| "DisruptionTarget".into());
    let text = cap(reason_message(&reason, c.message.as_deref().unwrap_or("")));
    let on_node = match node_name(pod) {
        Some(node) => format!("node {node}: {text}"),
        None => text.clone(),
    };
    Some((reason, text, on_node))
}

fn observe_pending(pod: &Pod, workload: Option<&Value>) -> Observation {
    let mut obs = Observation::new(ObservedState::Building, pod);
    if let Some((reason, text)) = init_failure(pod) {
        obs.event = warning(&reason, text.clone(), EventSource::Container);
        obs.status_message = text;
        return obs;
    }
    if let Some((reason, message)) = task_status(pod).and_then(container_reason) {
        let text = reason_message(&reason, &message);
        if is_container_warning(&reason) {
            obs.event = warning(&reason, text.clone(), EventSource::Container);
        }
        obs.status_message = text;
        return obs;
    }
    if let Some(c) = conditions(pod).iter().find(|c| c.status == "False") {
        let reason = c.reason.as_deref().unwrap_or("");
        obs.status_message = reason_message(reason, c.message.as_deref().unwrap_or(""));
        if reason == "Unschedulable" {
            // As the reference attributes it: the scheduler's, not Kueue's (a gated pod's
            // SchedulingGated condition is Kueue's, below).
            obs.event = warning(reason, obs.status_message.clone(), EventSource::Scheduler);
        }
    }
    if is_kueue_gated(pod) {
        let verdict = kueue_verdict(pod, workload);
        obs.status_message = if obs.status_message.is_empty() {
            verdict
        } else {
            format!("{}; {verdict}", obs.status_message)
        };
        if obs.event.is_none() {
            obs.event = workload.and_then(quota_warning);
        }
    }
    if obs.status_message.is_empty() {
        obs.status_message = "Pending".into();
    }
    obs
}

fn observe_running(pod: &Pod) -> Observation {
    let mut obs = Observation::new(ObservedState::Running, pod);
    if let Some(status) = task_status(pod) {
        let state = status.state.as_ref();
        if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            obs.exit_code = Some(t.exit_code);
            obs.status_message = "finalizing task outputs".into();
        } else if let Some((reason, message)) = container_reason(status) {
            let text = reason_message(&reason, &message);
            if is_container_warning(&reason) {
                obs.event = warning(&reason, text.clone(), EventSource::Container);
            }
            obs.status_message = text;
        }
    }
    if let Some((reason, _, on_node)) = disruption(pod) {
        obs.event = warning(&reason, on_node, EventSource::Disruption);
    }
    obs
}

fn observe_failed(pod: &Pod) -> Observation {
    let status = task_status(pod);
    let terminated = status
        .and_then(|s| s.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    let exit_code = terminated.map(|t| t.exit_code);

    let terminal = |state, error: String, event| Observation {
        state,
        status_message: error.clone(),
        error: Some(error),
        exit_code,
        node_name: node_name(pod),
        event,
    };

    if let Some((reason, text, on_node)) = disruption(pod) {
        let mut obs = terminal(
            ObservedState::Preempted,
            text,
            warning(&reason, on_node.clone(), EventSource::Disruption),
        );
        obs.status_message = format!("preempted: {on_node}");
        return obs;
    }
    if let Some(c) = true_condition(pod, "TerminationTarget").filter(|c| {
        c.reason
            .as_deref()
            .is_some_and(|r| r.starts_with("WorkloadEvicted"))
    }) {
        let reason = c.reason.as_deref().unwrap_or("WorkloadEvicted");
        let text = cap(reason_message(reason, c.message.as_deref().unwrap_or("")));
        return terminal(
            ObservedState::Preempted,
            text.clone(),
            warning(reason, text, EventSource::Kueue),
        );
    }
    if exit_code == Some(0) {
        return Observation {
            exit_code,
            ..Observation::new(ObservedState::Succeeded, pod)
        };
    }

    let pod_reason = pod
        .status
        .as_ref()
        .and_then(|s| s.reason.as_deref())
        .unwrap_or("");
    let pod_message = pod
        .status
        .as_ref()
        .and_then(|s| s.message.as_deref())
        .unwrap_or("");
    let container_reason = terminated.and_then(|t| t.reason.as_deref()).unwrap_or("");
    let container_message = terminated.and_then(|t| t.message.as_deref()).unwrap_or("");
    let infra = if INFRASTRUCTURE_REASONS.contains(&pod_reason) {
        Some((pod_reason, pod_message))
    } else if INFRASTRUCTURE_REASONS.contains(&container_reason) {
        Some((container_reason, container_message))
    } else {
        None
    };
    if let Some((reason, message)) = infra {
        let text = cap(reason_message(reason, message));
        let event = match reason {
            "DeadlineExceeded" => None,
            _ => warning(reason, text.clone(), EventSource::Disruption),
        };
        return terminal(ObservedState::WorkerFailed, text, event);
    }
    if let Some((reason, text)) = init_failure(pod) {
        return terminal(
            ObservedState::Failed,
            text.clone(),
            warning(&reason, text, EventSource::Container),
        );
    }
    let text = match (container_reason, container_message.trim(), exit_code) {
        ("", "", _) if !pod_reason.is_empty() || !pod_message.is_empty() => {
            reason_message(pod_reason, pod_message)
        }
        (r, "", Some(code)) if code != 0 => reason_message(r, &format!("exit code {code}")),
        (r, m, _) => reason_message(r, m),
    };
    let text = if text.is_empty() {
        "pod failed".to_string()
    } else {
        cap(text)
    };
    terminal(ObservedState::Failed, text, None)
}

fn observe_unknown(pod: &Pod) -> Observation {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let mut text = format!("PodUnknown: pod {name} is in phase Unknown");
    if let Some(node) = node_name(pod) {
        text.push_str(&format!(" (node {node} stopped reporting)"));
    }
    match disruption(pod) {
        Some((reason, _, on_node)) => Observation {
            status_message: text.clone(),
            error: Some(text),
            event: warning(&reason, on_node, EventSource::Disruption),
            ..Observation::new(ObservedState::Preempted, pod)
        },
        None => Observation {
            status_message: text.clone(),
            error: Some(text),
            ..Observation::new(ObservedState::WorkerFailed, pod)
        },
    }
}

/// Maps an observed pod, and the Kueue Workload admitting it if known (see [`find_workload`]),
/// to what it means for the attempt.
///
/// | pod | state |
/// |-----|-------|
/// | Pending | BUILDING, with the container's, init container's or first false condition's reason, plus Kueue's verdict while gated |
/// | Running | RUNNING (`finalizing task outputs` once `task` exited; CrashLoopBackOff still RUNNING) |
/// | Succeeded, or Failed with `task` exit 0 | SUCCEEDED |
/// | Failed + `DisruptionTarget=True`, or Kueue `TerminationTarget` `WorkloadEvicted*` | PREEMPTED |
/// | Failed, reason Evicted / DeadlineExceeded / Preempting | WORKER_FAILED |
/// | Failed otherwise (OOMKilled, non-zero exit, init failure) | FAILED |
/// | Unknown | WORKER_FAILED (PREEMPTED if disrupted) — use [`MissingTracker::scan`], which holds this back for the grace scans |
pub fn observe(pod: &Pod, workload: Option<&Value>) -> Observation {
    match phase(pod) {
        "Pending" => observe_pending(pod, workload),
        "Running" => observe_running(pod),
        "Succeeded" => Observation {
            exit_code: task_status(pod)
                .and_then(|s| s.state.as_ref())
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code),
            ..Observation::new(ObservedState::Succeeded, pod)
        },
        "Failed" => observe_failed(pod),
        _ => observe_unknown(pod),
    }
}

/// How long an admitted pod may stay unbindable for want of the capacity its admission counted
/// on before [`capacity_lost_after_admission`] gives it up. Long enough for the victims of a
/// preemption to leave (the preemptor is ungated while they terminate and the scheduler reports
/// `Insufficient …` meanwhile), short enough that a stuck attempt does not hold its quota long.
pub const CAPACITY_LOST_GRACE_SECONDS: i64 = 30;

/// A pod Kueue admitted (managed, ungated) that kube-scheduler has not bound for
/// [`CAPACITY_LOST_GRACE_SECONDS`] because the node its admission pinned it to (TAS's node
/// selector) lost the room since: the verdict names both a node affinity/selector mismatch and an
/// `Insufficient` resource. The attempt is given up as WORKER_FAILED (back to PENDING, failure
/// budget not charged) so that a new attempt is admitted afresh, as the CoreWeave runbook
/// describes. `None` for every other pod, and before the grace has passed.
pub fn capacity_lost_after_admission(pod: &Pod, now: jiff::Timestamp) -> Option<Observation> {
    let waiting = phase(pod) == "Pending" && node_name(pod).is_none();
    if !waiting || !is_kueue_managed(pod) || is_kueue_gated(pod) {
        return None;
    }
    let c = conditions(pod).iter().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    })?;
    let message = c.message.as_deref().unwrap_or("");
    if !(message.contains("affinity/selector") && message.contains("Insufficient ")) {
        return None;
    }
    let since = c.last_transition_time.as_ref()?.0;
    let waited = now.duration_since(since).as_secs();
    if waited < CAPACITY_LOST_GRACE_SECONDS {
        return None;
    }
    let text = cap(format!(
        "CapacityLost: the node Kueue admitted this pod to no longer has room for it \
         (unschedulable for {waited}s: {message}); returning the task to PENDING for a fresh admission"
    ));
    Some(Observation {
        status_message: text.clone(),
        error: Some(text.clone()),
        event: warning("CapacityLost", text, EventSource::Scheduler),
        ..Observation::new(ObservedState::WorkerFailed, pod)
    })
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Tracked {
    absent_scans: u32,
    /// The first disruption seen for the pod, as `node …: reason: message`.
    disruption: Option<String>,
}

/// Holds back the verdict on pods that are missing or in phase `Unknown` until they stay so for
/// [`Self::GRACE_SCANS`] consecutive scans (the API can miss a pod for a moment), and remembers
/// disruptions seen earlier so a pod that vanishes after one is PREEMPTED, not WORKER_FAILED.
///
/// Keyed by pod name. Call [`Self::forget`] once the attempt's terminal state is applied.
#[derive(Clone, Debug, Default)]
pub struct MissingTracker {
    pods: BTreeMap<String, Tracked>,
}

impl MissingTracker {
    /// Consecutive missing/Unknown scans before the pod is given up.
    pub const GRACE_SCANS: u32 = 3;

    /// An empty tracker.
    pub fn new() -> MissingTracker {
        MissingTracker::default()
    }

    /// One scan of the pod named `pod_name`: `pod` is what the API returned (`None` if absent).
    ///
    /// Returns the observation to apply, or `None` while a missing/Unknown pod is within its
    /// grace (the caller keeps the task's state unchanged).
    pub fn scan(
        &mut self,
        pod_name: &str,
        pod: Option<&Pod>,
        workload: Option<&Value>,
    ) -> Option<Observation> {
        let entry = self.pods.entry(pod_name.to_string()).or_default();
        if let Some((_, _, on_node)) = pod.and_then(disruption) {
            entry.disruption.get_or_insert(on_node);
        }
        match pod {
            Some(p) if phase(p) != "Unknown" => {
                entry.absent_scans = 0;
                Some(observe(p, workload))
            }
            _ => {
                entry.absent_scans = entry.absent_scans.saturating_add(1);
                if entry.absent_scans < Self::GRACE_SCANS {
                    return None;
                }
                Some(Self::given_up(pod_name, pod, entry))
            }
        }
    }

    fn given_up(pod_name: &str, pod: Option<&Pod>, entry: &Tracked) -> Observation {
        let scans = Self::GRACE_SCANS;
        let mut text = match pod {
            None => format!("PodDeleted: pod {pod_name} is gone from the API server ({scans} consecutive scans)"),
            Some(p) => {
                let mut t = format!("PodUnknown: pod {pod_name} has been in phase Unknown for {scans} consecutive scans");
                if let Some(node) = node_name(p) {
                    t.push_str(&format!(" (node {node})"));
                }
                t
            }
        };
        let (state, reason) = match &entry.disruption {
            Some(d) => {
                text.push_str(&format!("; disrupted earlier: {d}"));
                (ObservedState::Preempted, "DisruptionTarget")
            }
            None if pod.is_none() => (ObservedState::WorkerFailed, "PodDeleted"),
            None => (ObservedState::WorkerFailed, "PodUnknown"),
        };
        let text = cap(text);
        Observation {
            state,
            status_message: text.clone(),
            error: Some(text.clone()),
            exit_code: None,
            node_name: pod.and_then(node_name),
            event: warning(reason, text, EventSource::Disruption),
        }
    }

    /// Remembers a disruption of `pod` seen outside a scan (a watch event), without counting
    /// a scan: a pod that then vanishes is PREEMPTED, not WORKER_FAILED.
    pub fn saw(&mut self, pod_name: &str, pod: &Pod) {
        if let Some((_, _, on_node)) = disruption(pod) {
            self.pods
                .entry(pod_name.to_string())
                .or_default()
                .disruption
                .get_or_insert(on_node);
        }
    }

    /// Consecutive missing/Unknown scans of `pod_name` so far.
    pub fn absent_scans(&self, pod_name: &str) -> u32 {
        self.pods.get(pod_name).map_or(0, |t| t.absent_scans)
    }

    /// Drops what is known about `pod_name`.
    pub fn forget(&mut self, pod_name: &str) {
        self.pods.remove(pod_name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        PodSchedulingGate, PodSpec, PodStatus,
    };
    use serde_json::json;

    fn pod(phase: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("iris-alice-train-0-abcd1234-0".into());
        p.metadata.uid = Some("pod-uid-1".into());
        p.metadata.labels = Some([(KUEUE_QUEUE_NAME.to_string(), "iris-lq".to_string())].into());
        p.spec = Some(PodSpec::default());
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        p
    }

    fn on_node(mut p: Pod, node: &str) -> Pod {
        if let Some(s) = p.spec.as_mut() {
            s.node_name = Some(node.into());
        }
        p
    }

    fn with_condition(mut p: Pod, type_: &str, status: &str, reason: &str, message: &str) -> Pod {
        if let Some(s) = p.status.as_mut() {
            s.conditions
                .get_or_insert_with(Vec::new)
                .push(PodCondition {
                    type_: type_.into(),
                    status: status.into(),
                    reason: Some(reason.into()),
                    message: Some(message.into()),
                    ..Default::default()
                });
        }
        p
    }

    fn container(name: &str, state: ContainerState) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(state),
            ..Default::default()
        }
    }

    fn with_task(mut p: Pod, state: ContainerState) -> Pod {
        if let Some(s) = p.status.as_mut() {
            s.container_statuses = Some(vec![container(TASK_CONTAINER, state)]);
        }
        p
    }

    fn with_init(mut p: Pod, name: &str, state: ContainerState) -> Pod {
        if let Some(s) = p.status.as_mut() {
            s.init_container_statuses = Some(vec![container(name, state)]);
        }
        p
    }

    fn waiting(reason: &str, message: &str) -> ContainerState {
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(message.into()),
            }),
            ..Default::default()
        }
    }

    fn terminated(code: i32, reason: &str, message: &str) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                reason: Some(reason.into()),
                message: (!message.is_empty()).then(|| message.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn gated(mut p: Pod) -> Pod {
        if let Some(s) = p.spec.as_mut() {
            s.scheduling_gates = Some(vec![PodSchedulingGate {
                name: "kueue.x-k8s.io/admission".into(),
            }]);
        }
        with_condition(
            p,
            "PodScheduled",
            "False",
            "SchedulingGated",
            "Scheduling is blocked due to non-empty scheduling gates",
        )
    }

    fn event(o: &Observation) -> (Severity, &str, EventSource) {
        let e = o.event.as_ref().expect("an event");
        (e.severity, e.reason.as_str(), e.source)
    }

    #[test]
    fn gated_without_a_workload_yet() {
        let o = observe(&gated(pod("Pending")), None);
        assert_eq!(o.state, ObservedState::Building);
        assert_eq!(
            o.status_message,
            "SchedulingGated: Scheduling is blocked due to non-empty scheduling gates; \
             Kueue workload for 'iris-alice-train-0-abcd1234-0' not found yet; waiting for Kueue to create and admit it"
        );
        assert_eq!(o.event, None);
        assert_eq!(o.state.task_state(), TaskState::Building);
    }

    #[test]
    fn gated_waiting_for_admission() {
        let w = json!({"metadata": {"name": "pod-iris-x"}, "spec": {"queueName": "iris-lq"}, "status": {}});
        let o = observe(&gated(pod("Pending")), Some(&w));
        assert!(
            o.status_message.ends_with(
                "; Kueue workload pod-iris-x: queue=iris-lq; waiting for Kueue admission"
            ),
            "{}",
            o.status_message
        );
    }

    #[test]
    fn gated_quota_not_reserved_warns() {
        let w = json!({
            "metadata": {"name": "iris-pg-0011223344556677-0"},
            "spec": {"queueName": "iris-lq"},
            "status": {"conditions": [{
                "type": "QuotaReserved", "status": "False", "reason": "Pending",
                "message": "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor cw-tas, 32 more needed"
            }]}
        });
        let mut p = gated(pod("Pending"));
        p.metadata.labels = Some(
            [(
                KUEUE_POD_GROUP_NAME.to_string(),
                "iris-pg-0011223344556677-0".to_string(),
            )]
            .into(),
        );
        let o = observe(&p, Some(&w));
        assert!(o.status_message.contains(
            "Kueue workload iris-pg-0011223344556677-0: queue=iris-lq; QuotaReserved (Pending): couldn't assign flavors"
        ), "{}", o.status_message);
        assert_eq!(
            event(&o),
            (Severity::Warning, "QuotaReserved", EventSource::Kueue)
        );
        assert!(o
            .event
            .unwrap()
            .message
            .starts_with("Pending: couldn't assign flavors"));
        assert_eq!(find_workload(&p, std::slice::from_ref(&w)), Some(&w));
    }

    #[test]
    fn gated_but_admitted() {
        let w = json!({
            "metadata": {"name": "pod-iris-x"},
            "spec": {"queueName": "iris-lq"},
            "status": {
                "admission": {"clusterQueue": "cw-cq"},
                "conditions": [
                    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved in ClusterQueue cw-cq"},
                    {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted"}
                ]
            }
        });
        let o = observe(&gated(pod("Pending")), Some(&w));
        assert!(o.status_message.ends_with(
            "Kueue workload pod-iris-x: queue=iris-lq, clusterQueue=cw-cq; admitted by Kueue; waiting for scheduler gate removal"
        ), "{}", o.status_message);
        assert_eq!(o.event, None);
    }

    #[test]
    fn workload_found_by_pod_uid() {
        let p = pod("Pending");
        let ws = vec![
            json!({"metadata": {"name": "other", "ownerReferences": [{"kind": "Pod", "uid": "x"}]}}),
            json!({"metadata": {"name": "mine", "ownerReferences": [{"kind": "Pod", "uid": "pod-uid-1"}]}}),
            json!({"metadata": {"name": "by-label", "labels": {KUEUE_JOB_UID: "pod-uid-2"}}}),
        ];
        assert_eq!(
            find_workload(&p, &ws).map(|w| &w["metadata"]["name"]),
            Some(&json!("mine"))
        );
        let mut p2 = pod("Pending");
        p2.metadata.uid = Some("pod-uid-2".into());
        assert_eq!(
            find_workload(&p2, &ws).map(|w| &w["metadata"]["name"]),
            Some(&json!("by-label"))
        );
        p2.metadata.uid = None;
        assert_eq!(find_workload(&p2, &ws), None);
    }

    #[test]
    fn image_pull_backoff() {
        let p = with_task(
            on_node(pod("Pending"), "gpu-1"),
            waiting(
                "ImagePullBackOff",
                "Back-off pulling image \"ghcr.io/x/y:bad\"",
            ),
        );
        let o = observe(&p, None);
        assert_eq!(o.state, ObservedState::Building);
        assert_eq!(
            o.status_message,
            "ImagePullBackOff: Back-off pulling image \"ghcr.io/x/y:bad\""
        );
        assert_eq!(
            event(&o),
            (
                Severity::Warning,
                "ImagePullBackOff",
                EventSource::Container
            )
        );
        assert_eq!(o.node_name.as_deref(), Some("gpu-1"));
    }

    #[test]
    fn container_creating_is_quiet() {
        let o = observe(
            &with_task(pod("Pending"), waiting("ContainerCreating", "")),
            None,
        );
        assert_eq!(o.status_message, "ContainerCreating");
        assert_eq!(o.event, None);
        let o = observe(
            &with_task(
                pod("Pending"),
                waiting("CreateContainerConfigError", "secret \"s\" not found"),
            ),
            None,
        );
        assert_eq!(
            event(&o),
            (
                Severity::Warning,
                "CreateContainerConfigError",
                EventSource::Container
            )
        );
    }

    #[test]
    fn unschedulable_warns() {
        let p = with_condition(
            pod("Pending"),
            "PodScheduled",
            "False",
            "Unschedulable",
            "0/4 nodes are available",
        );
        let o = observe(&p, None);
        assert_eq!(o.status_message, "Unschedulable: 0/4 nodes are available");
        assert_eq!(
            event(&o),
            (Severity::Warning, "Unschedulable", EventSource::Scheduler)
        );
    }

    #[test]
    fn an_admitted_pod_whose_node_lost_its_room_is_given_up_after_the_grace() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let since: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let at = |secs: i64| since + jiff::SignedDuration::from_secs(secs);
        let lost = "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, \
                    4 node(s) didn't match Pod's node affinity/selector.";
        let stuck = |message: &str| {
            let mut p = with_condition(
                pod("Pending"),
                "PodScheduled",
                "False",
                "Unschedulable",
                message,
            );
            p.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(KUEUE_QUEUE_NAME.into(), "iris".into());
            if let Some(c) = p
                .status
                .as_mut()
                .and_then(|s| s.conditions.as_mut())
                .and_then(|c| c.first_mut())
            {
                c.last_transition_time = Some(Time(since));
            }
            p
        };
        // Within the grace (a preemption's victims may still be leaving): nothing yet.
        assert_eq!(capacity_lost_after_admission(&stuck(lost), at(29)), None);
        let o = capacity_lost_after_admission(&stuck(lost), at(31)).expect("given up");
        assert_eq!(o.state, ObservedState::WorkerFailed);
        assert!(
            o.status_message.starts_with("CapacityLost: "),
            "{}",
            o.status_message
        );
        assert!(
            o.status_message.contains("unschedulable for 31s"),
            "{}",
            o.status_message
        );
        assert!(o.status_message.contains("Insufficient nvidia.com/gpu"));
        assert_eq!(
            event(&o),
            (Severity::Warning, "CapacityLost", EventSource::Scheduler)
        );
        // Not a lost admission: only a resource shortage (no pinned node), a pod Kueue does
        // not manage, a pod still gated, a bound pod.
        assert_eq!(
            capacity_lost_after_admission(
                &stuck("0/4 nodes are available: 4 Insufficient cpu."),
                at(99)
            ),
            None
        );
        let mut unmanaged = stuck(lost);
        unmanaged.metadata.labels = None;
        assert_eq!(capacity_lost_after_admission(&unmanaged, at(99)), None);
        let mut gated = stuck(lost);
        gated
            .spec
            .get_or_insert_with(Default::default)
            .scheduling_gates = Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
            name: "kueue.x-k8s.io/admission".into(),
        }]);
        assert_eq!(capacity_lost_after_admission(&gated, at(99)), None);
        let mut bound = stuck(lost);
        bound.spec.get_or_insert_with(Default::default).node_name = Some("h100-0".into());
        assert_eq!(capacity_lost_after_admission(&bound, at(99)), None);
    }

    #[test]
    fn crash_loop_while_running_stays_running() {
        let p = with_task(
            pod("Running"),
            waiting(
                "CrashLoopBackOff",
                "back-off 5m0s restarting failed container",
            ),
        );
        let o = observe(&p, None);
        assert_eq!(o.state, ObservedState::Running);
        assert_eq!(
            o.status_message,
            "CrashLoopBackOff: back-off 5m0s restarting failed container"
        );
        assert_eq!(
            event(&o),
            (
                Severity::Warning,
                "CrashLoopBackOff",
                EventSource::Container
            )
        );
    }

    #[test]
    fn running_and_finalizing() {
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        let o = observe(&with_task(on_node(pod("Running"), "n1"), running), None);
        assert_eq!(
            (o.state, o.status_message.as_str(), o.event),
            (ObservedState::Running, "", None)
        );
        assert_eq!(o.node_name.as_deref(), Some("n1"));
        let o = observe(
            &with_task(pod("Running"), terminated(0, "Completed", "")),
            None,
        );
        assert_eq!(o.state, ObservedState::Running);
        assert_eq!(o.status_message, "finalizing task outputs");
        assert_eq!(o.exit_code, Some(0));
    }

    #[test]
    fn succeeded() {
        let o = observe(
            &with_task(pod("Succeeded"), terminated(0, "Completed", "")),
            None,
        );
        assert_eq!(
            (o.state, o.exit_code, o.error),
            (ObservedState::Succeeded, Some(0), None)
        );
    }

    #[test]
    fn failed_with_exit_zero_is_success() {
        let o = observe(
            &with_task(pod("Failed"), terminated(0, "Completed", "")),
            None,
        );
        assert_eq!(o.state, ObservedState::Succeeded);
        assert_eq!(o.exit_code, Some(0));
        assert_eq!(o.error, None);
    }

    #[test]
    fn disruption_target_preempts_and_names_the_node() {
        let p = with_condition(
            with_task(
                on_node(pod("Failed"), "gpu-node-17"),
                terminated(137, "Error", ""),
            ),
            "DisruptionTarget",
            "True",
            "PreemptionByScheduler",
            "Kueue: preempted to admit a higher-priority workload",
        );
        let o = observe(&p, None);
        assert_eq!(o.state, ObservedState::Preempted);
        assert_eq!(o.state.task_state(), TaskState::Preempted);
        assert_eq!(
            o.error.as_deref(),
            Some("PreemptionByScheduler: Kueue: preempted to admit a higher-priority workload")
        );
        assert!(
            o.status_message.contains("node gpu-node-17"),
            "{}",
            o.status_message
        );
        assert_eq!(
            event(&o),
            (
                Severity::Warning,
                "PreemptionByScheduler",
                EventSource::Disruption
            )
        );
        assert!(o
            .event
            .unwrap()
            .message
            .starts_with("node gpu-node-17: PreemptionByScheduler"));
        assert_eq!(o.exit_code, Some(137));
    }

    #[test]
    fn kueue_workload_eviction_preempts() {
        let p = with_condition(
            pod("Failed"),
            "TerminationTarget",
            "True",
            "WorkloadEvictedDueToPreempted",
            "Preempted to accommodate a workload",
        );
        let o = observe(&p, None);
        assert_eq!(o.state, ObservedState::Preempted);
        assert_eq!(
            event(&o),
            (
                Severity::Warning,
                "WorkloadEvictedDueToPreempted",
                EventSource::Kueue
            )
        );
    }

    #[test]
    fn evicted_is_a_worker_failure() {
        let mut p = with_task(
            on_node(pod("Failed"), "n2"),
            terminated(137, "ContainerStatusUnknown", ""),
        );
        if let Some(s) = p.status.as_mut() {
            s.reason = Some("Evicted".into());
            s.message = Some("The node was low on resource: ephemeral-storage.".into());
        }
        let o = observe(&p, None);
        assert_eq!(o.state, ObservedState::WorkerFailed);
        assert_eq!(
            o.error.as_deref(),
            Some("Evicted: The node was low on resource: ephemeral-storage.")
        );
        assert_eq!(
            event(&o),
            (Severity::Warning, "Evicted", EventSource::Disruption)
        );
    }

    #[test]
    fn deadline_exceeded_is_a_worker_failure() {
        let mut p = pod("Failed");
        if let Some(s) = p.status.as_mut() {
            s.reason = Some("DeadlineExceeded".into());
            s.message =
                Some("Pod was active on the node longer than the specified deadline".into());
        }
        let o = observe(&p, None);
        assert_eq!(o.state, ObservedState::WorkerFailed);
        assert_eq!(
            o.error.as_deref(),
            Some("DeadlineExceeded: Pod was active on the node longer than the specified deadline")
        );
        assert_eq!(o.event, None);
    }

    #[test]
    fn oom_killed_fails_the_task() {
        let o = observe(
            &with_task(pod("Failed"), terminated(137, "OOMKilled", "")),
            None,
        );
        assert_eq!(o.state, ObservedState::Failed);
        assert_eq!(o.error.as_deref(), Some("OOMKilled: exit code 137"));
        assert_eq!(o.exit_code, Some(137));
    }

    #[test]
    fn application_error_uses_the_termination_message() {
        let o = observe(
            &with_task(pod("Failed"), terminated(1, "Error", "Traceback: boom")),
            None,
        );
        assert_eq!(o.state, ObservedState::Failed);
        assert_eq!(o.error.as_deref(), Some("Error: Traceback: boom"));
        assert_eq!(o.status_message, "Error: Traceback: boom");
        let long = "x".repeat(2000);
        let o = observe(
            &with_task(pod("Failed"), terminated(1, "Error", &long)),
            None,
        );
        assert_eq!(o.error.map(|e| e.chars().count()), Some(MAX_REASON_CHARS));
    }

    #[test]
    fn init_container_failure() {
        let p = with_init(
            pod("Failed"),
            "stage-workdir",
            terminated(2, "Error", "bundle not found"),
        );
        let o = observe(&p, None);
        assert_eq!(o.state, ObservedState::Failed);
        assert_eq!(
            o.error.as_deref(),
            Some("Init:Error stage-workdir: bundle not found")
        );
        let p = with_init(
            pod("Pending"),
            "stage-workdir",
            waiting("CrashLoopBackOff", "back-off"),
        );
        let o = observe(&p, None);
        assert_eq!(o.state, ObservedState::Building);
        assert_eq!(
            o.status_message,
            "Init:CrashLoopBackOff stage-workdir: back-off"
        );
        assert_eq!(
            event(&o),
            (
                Severity::Warning,
                "CrashLoopBackOff",
                EventSource::Container
            )
        );
        let p = with_init(pod("Pending"), "stage-workdir", terminated(3, "", ""));
        assert_eq!(
            observe(&p, None).status_message,
            "Init:Error stage-workdir: exit code 3"
        );
        let p = with_init(
            pod("Pending"),
            "stage-workdir",
            waiting("PodInitializing", ""),
        );
        assert_eq!(observe(&p, None).status_message, "Pending");
    }

    #[test]
    fn unknown_phase_alone() {
        let o = observe(&on_node(pod("Unknown"), "n3"), None);
        assert_eq!(o.state, ObservedState::WorkerFailed);
        assert!(o.error.unwrap().starts_with("PodUnknown: "));
    }

    #[test]
    fn missing_for_three_scans_is_a_worker_failure() {
        let mut t = MissingTracker::new();
        let name = "iris-x-0";
        assert_eq!(
            t.scan(name, Some(&pod("Running")), None).map(|o| o.state),
            Some(ObservedState::Running)
        );
        assert_eq!(t.scan(name, None, None), None);
        assert_eq!(t.scan(name, None, None), None);
        assert_eq!(t.absent_scans(name), 2);
        let o = t
            .scan(name, None, None)
            .expect("given up on the third scan");
        assert_eq!(o.state, ObservedState::WorkerFailed);
        assert!(o
            .error
            .as_deref()
            .unwrap_or("")
            .starts_with("PodDeleted: pod iris-x-0 is gone"));
        assert_eq!(event(&o).1, "PodDeleted");
        t.forget(name);
        assert_eq!(t.absent_scans(name), 0);
    }

    #[test]
    fn reappearing_pod_resets_the_count() {
        let mut t = MissingTracker::new();
        assert_eq!(t.scan("p", None, None), None);
        assert_eq!(t.scan("p", None, None), None);
        assert!(t.scan("p", Some(&pod("Running")), None).is_some());
        assert_eq!(t.scan("p", None, None), None);
        assert_eq!(t.scan("p", None, None), None);
        assert!(t.scan("p", None, None).is_some());
    }

    #[test]
    fn unknown_for_three_scans_is_a_worker_failure() {
        let mut t = MissingTracker::new();
        let p = on_node(pod("Unknown"), "n4");
        assert_eq!(t.scan("p", Some(&p), None), None);
        assert_eq!(t.scan("p", Some(&p), None), None);
        let o = t.scan("p", Some(&p), None).expect("given up");
        assert_eq!(o.state, ObservedState::WorkerFailed);
        assert!(o.error.unwrap().starts_with(
            "PodUnknown: pod p has been in phase Unknown for 3 consecutive scans (node n4)"
        ));
    }

    #[test]
    fn missing_after_a_disruption_is_preempted() {
        let mut t = MissingTracker::new();
        let disrupted = with_condition(
            on_node(pod("Running"), "gpu-9"),
            "DisruptionTarget",
            "True",
            "DeletionByTaintManager",
            "Taint manager: deleting due to NoExecute taint",
        );
        let o = t.scan("p", Some(&disrupted), None).expect("observed");
        assert_eq!(o.state, ObservedState::Running);
        assert_eq!(
            event(&o),
            (
                Severity::Warning,
                "DeletionByTaintManager",
                EventSource::Disruption
            )
        );
        assert_eq!(t.scan("p", None, None), None);
        assert_eq!(t.scan("p", None, None), None);
        let o = t.scan("p", None, None).expect("given up");
        assert_eq!(o.state, ObservedState::Preempted);
        let err = o.error.unwrap();
        assert!(err.starts_with("PodDeleted: "), "{err}");
        assert!(err.contains("node gpu-9: DeletionByTaintManager"), "{err}");
    }

    #[test]
    fn a_disruption_seen_only_by_the_watch_makes_a_vanished_pod_preempted() {
        let mut t = MissingTracker::new();
        let evicted = with_condition(
            on_node(pod("Running"), "cpu-2"),
            "DisruptionTarget",
            "True",
            "EvictionByEvictionAPI",
            "Eviction API: evicting",
        );
        // No scan saw the pod disrupted; the watch did, and then it was gone.
        t.saw("p", &evicted);
        t.saw("q", &on_node(pod("Running"), "cpu-3"));
        assert_eq!(t.scan("p", None, None), None);
        assert_eq!(t.scan("p", None, None), None);
        let o = t.scan("p", None, None).expect("given up");
        assert_eq!(o.state, ObservedState::Preempted);
        assert!(o
            .error
            .unwrap()
            .contains("node cpu-2: EvictionByEvictionAPI"));
        // An undisrupted pod seen by the watch is no different from one never seen.
        assert_eq!(t.scan("q", None, None), None);
        assert_eq!(t.scan("q", None, None), None);
        let o = t.scan("q", None, None).expect("given up");
        assert_eq!(o.state, ObservedState::WorkerFailed);
    }
}
