//! One reconcile round: apply the Pods of wanted attempts, delete those no longer wanted, and map
//! what the watches show (Pods and, for waiting pods, their Kueue Workloads) to attempt
//! observations and events with `iris_kube_model::status`.

use crate::pods::{attempt_uid_of, phase, ApplyError};
use crate::{lock, KubeBackend, APPLY_CONCURRENCY, LABEL_BACKEND};
use futures::StreamExt;
use iris_backend::{AttemptEvent, AttemptLogs, DesiredAttempt, Error, Intent, Observation, Report};
use iris_kube_model as km;
use iris_proto::job;
use iris_types::TaskState;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

impl KubeBackend {
    pub(crate) async fn reconcile_now(
        &self,
        desired: Vec<DesiredAttempt>,
    ) -> Result<Report, Error> {
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
                let last = lock(&core.last_seen).get(&name).cloned()?;
                // A disruption the watch saw counts even if no scan did (the pod can be evicted
                // and gone between two rounds): the tracker's verdict is then PREEMPTED.
                lock(&self.state).missing.saw(&name, &last);
                matches!(phase(&last), "Succeeded" | "Failed").then(|| Arc::new(last))
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
            // An admitted pod whose node lost the room Kueue counted on goes back for a fresh
            // admission (the pod is deleted once the attempt is settled, like any other).
            let obs = match (&pod, obs.state) {
                (Some(p), km::status::ObservedState::Building) => {
                    km::status::capacity_lost_after_admission(
                        p,
                        k8s_openapi::jiff::Timestamp::now(),
                    )
                    .unwrap_or(obs)
                }
                _ => obs,
            };
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
