//! The Pods of one device lane: listing its pods, applying an attempt's Pod (and, for a
//! coordinator, its PodDisruptionBudget) built from the run request by the pure manifest code,
//! deleting a pod (a gang's with its Workload), and reading what a pod says about itself (phase,
//! disruption, attempt uid).

use crate::{lock, KubeBackend, FIELD_MANAGER, LABEL_BACKEND};
use iris_kube_model as km;
use iris_proto::job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use std::collections::BTreeMap;
use std::sync::Arc;

impl KubeBackend {
    pub(crate) fn pods_of_this_backend(&self) -> Vec<Arc<Pod>> {
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

    pub(crate) async fn apply_attempt(
        &self,
        req: &job::RunTaskRequest,
    ) -> Result<String, ApplyError> {
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
        let applied = core
            .pods
            .patch(&name, &pp, &Patch::Apply(&pod))
            .await
            .map_err(|e| ApplyError::Api(e.to_string()))?;
        // The job's secrets, after the pod so the pod can own them (Kubernetes deletes them
        // with it); the kubelet holds the task until its secret volume exists.
        if let Some(secret) = km::manifest::build_secret(
            &input,
            &core.settings.provider,
            applied.metadata.uid.as_deref(),
        ) {
            let secret_name = secret.metadata.name.clone().unwrap_or_default();
            core.secrets
                .patch(&secret_name, &pp, &Patch::Apply(&secret))
                .await
                .map_err(|e| ApplyError::Api(format!("creating the job's secrets: {e}")))?;
        }
        // The job's workdir files, likewise owned by the pod; its `stage-workdir` init
        // container waits for them.
        if let Some(cm) = km::manifest::build_workdir_config_map(
            &input,
            &core.settings.provider,
            applied.metadata.uid.as_deref(),
        ) {
            let cm_name = cm.metadata.name.clone().unwrap_or_default();
            core.config_maps
                .patch(&cm_name, &pp, &Patch::Apply(&cm))
                .await
                .map_err(|e| ApplyError::Api(format!("creating the job's workdir files: {e}")))?;
        }
        Ok(name)
    }

    pub(crate) async fn delete_pod(&self, pod: &Pod, name: &str) {
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
}

pub(crate) enum ApplyError {
    /// The attempt can never run (bad gang shape, unsupported constraint): it fails.
    Manifest(String),
    /// The API refused or was unreachable: the attempt is lost and retried.
    Api(String),
}

/// Marked for disruption (preemption, eviction, node shutdown).
pub(crate) fn disrupted(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        })
        .unwrap_or(false)
}

pub(crate) fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// The attempt uid a pod was made for (the pod name ends with it): 20 hex digits, or 16 for a
/// pod made before attempt uids began with the time.
pub(crate) fn attempt_uid_of(p: &Pod) -> Option<String> {
    uid_in_pod_name(p.metadata.name.as_deref()?)
}

fn uid_in_pod_name(name: &str) -> Option<String> {
    let last = name.rsplit('-').next()?;
    (matches!(last.len(), 16 | 20) && last.chars().all(|c| c.is_ascii_hexdigit()))
        .then(|| last.to_string())
}

/// The pure manifest's input from a run request.
pub(crate) fn pod_input(req: &job::RunTaskRequest, controller_url: &str) -> km::manifest::PodInput {
    let (job_id, index) = match req.task_id.rsplit_once('/') {
        Some((j, i)) => (j.to_string(), i.parse().unwrap_or(0)),
        None => (req.task_id.clone(), 0),
    };
    let res = req.resources.clone().unwrap_or_default();
    let device = res.device.as_ref().and_then(|d| d.device.as_ref());
    let (gpu_count, gpu_variant) = match device {
        Some(job::device_config::Device::Gpu(g)) => (g.count.max(0) as u32, g.variant.clone()),
        _ => (0, String::new()),
    };
    let tpu = matches!(device, Some(job::device_config::Device::Tpu(_)));
    let env: BTreeMap<String, String> = req
        .environment
        .as_ref()
        .map(|e| e.env_vars.clone().into_iter().collect())
        .unwrap_or_default();
    // The Iris variables as every backend derives them; the pod's own layout (bind on all
    // interfaces, `/app`, the image's `python`) and no worker id or static advertise address
    // (the pod IP comes from the downward API).
    let pod_side = iris_backend::task_env::WorkerSide {
        controller_url: controller_url.to_string(),
        bind_host: "0.0.0.0".into(),
        workdir: "/app".into(),
        venv: "/app/.venv".into(),
        python: "python".into(),
        ..Default::default()
    };
    let system_env = iris_backend::task_env::iris_environment(req, &pod_side);
    let entrypoint = req.entrypoint.clone().unwrap_or_default();
    let constraints = req
        .constraints
        .iter()
        .filter(|k| k.key() == "pool" || k.key() == "region")
        .map(|k| {
            let v = k.value.as_ref().and_then(|v| match &v.value {
                Some(job::attribute_value::Value::StringValue(s)) => Some(s.clone()),
                _ => None,
            });
            match (k.op.unwrap_or_default(), v) {
                (0, Some(value)) => km::manifest::NodeConstraint::Eq {
                    key: k.key().to_owned(),
                    value,
                },
                (op, _) => km::manifest::NodeConstraint::Other {
                    key: k.key().to_owned(),
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
        argv: entrypoint
            .run_command
            .as_ref()
            .map(|r| r.argv.clone())
            .unwrap_or_default(),
        setup_commands: entrypoint.setup_commands.clone(),
        env,
        system_env,
        cpu_millicores: res.cpu_millicores.max(0) as u64,
        memory_bytes: res.memory_bytes.max(0) as u64,
        disk_bytes: res.disk_bytes.max(0) as u64,
        gpu_count,
        gpu_variant,
        tpu,
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
        bundle_id: req.bundle_id.clone(),
        workdir_files: entrypoint.workdir_files.into_iter().collect(),
        workdir_file_refs: entrypoint.workdir_file_refs.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::uid_in_pod_name;
    use iris_kube_model::manifest::pod_name;

    #[test]
    fn a_pod_name_gives_back_the_attempt_uid_it_was_made_for() {
        for uid in ["0195f3a2c4e19d2b7a10", "0123456789abcdef"] {
            let name = pod_name("/alice/train/0", 3, uid);
            assert_eq!(uid_in_pod_name(&name).as_deref(), Some(uid), "{name}");
        }
        // Without a uid the name ends with the attempt number, which is no uid.
        assert_eq!(uid_in_pod_name(&pod_name("/alice/train/0", 3, "")), None);
    }
}
