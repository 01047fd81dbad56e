//! The controller on Kubernetes (`iris cluster start` with `controller.coreweave`, reference
//! federation-k8s §5): the objects that run it, the admin-owned ones it needs, and what a
//! Deployment's pods say about a rollout.
//!
//! Object names, labels and mount paths are the published package's, so an operator moving
//! between the two finds the same objects: Deployment `iris-controller` (one replica,
//! `Recreate`: one controller owns the state volume at a time), ConfigMap `iris-cluster-config`
//! (`config.json` at `/etc/iris`), PVC `iris-controller-state` or a hostPath
//! (`storage.local_state_dir`) at the state mount, ClusterIP Service
//! `controller.coreweave.service_name`, PDB `iris-controller-pdb`.

use serde_json::{json, Value};

/// Label on the controller's objects and pods.
pub const APP_LABEL: (&str, &str) = ("app", "iris-controller");
/// The controller Deployment.
pub const DEPLOYMENT: &str = "iris-controller";
/// Its container.
pub const CONTAINER: &str = "iris-controller";
/// The ConfigMap holding the cluster config as `config.json`.
pub const CONFIG_MAP: &str = "iris-cluster-config";
/// Where that ConfigMap is mounted.
pub const CONFIG_DIR: &str = "/etc/iris";
/// The PVC holding the controller's state when no hostPath is configured.
pub const STATE_PVC: &str = "iris-controller-state";
/// The state mount when `storage.local_state_dir` is not set.
pub const DEFAULT_STATE_DIR: &str = "/var/cache/iris/controller";
/// The controller's PodDisruptionBudget.
pub const PDB: &str = "iris-controller-pdb";
/// The ServiceAccount the controller runs as (admin-owned).
pub const SERVICE_ACCOUNT: &str = "iris-controller";
/// The Role (and RoleBinding) that lets the controller deliver task secrets (admin-owned).
pub const TASK_SECRET_ROLE: &str = "iris-task-secret-delivery";

/// Where the controller's state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateVolume {
    /// A `ReadWriteOnce` claim of this size, mounted at [`DEFAULT_STATE_DIR`].
    Claim {
        /// Requested storage (`50Gi`).
        size: String,
    },
    /// A node directory (`storage.local_state_dir`), mounted at the same path.
    HostPath(String),
}

impl StateVolume {
    /// The path the controller sees its state at.
    pub fn mount_path(&self) -> &str {
        match self {
            StateVolume::Claim { .. } => DEFAULT_STATE_DIR,
            StateVolume::HostPath(p) => p,
        }
    }
}

/// Everything the controller's objects are built from (read from the cluster config).
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerDeploy {
    /// `platform.coreweave.namespace` (default `iris`).
    pub namespace: String,
    /// `platform.label_prefix` (default `iris`).
    pub label_prefix: String,
    /// `controller.image`.
    pub image: String,
    /// `controller.coreweave.port` (default 10000).
    pub port: u16,
    /// `controller.coreweave.service_name` (default `iris-controller-svc`).
    pub service_name: String,
    /// `controller.coreweave.scale_group`: the node pool the controller runs on.
    pub scale_group: String,
    /// `controller.coreweave.hostname`: pins the controller to one node (hostPath state).
    pub hostname: Option<String>,
    /// The state volume.
    pub state: StateVolume,
    /// `controller.checkpoint_interval_seconds` (0: the controller's default).
    pub checkpoint_interval_seconds: u64,
    /// Start from an empty DB (`cluster start --fresh`).
    pub fresh: bool,
    /// `defaults.task_env`, passed to the controller's environment as the reference does.
    pub env: Vec<(String, String)>,
    /// The config the controller reads (`config.json`), operator-only keys removed.
    pub config_json: String,
}

impl ControllerDeploy {
    /// The controller's command line. `0.0.0.0`: `kubectl port-forward` reaches the container
    /// on its loopback and the Service on its pod IP.
    pub fn command(&self) -> Vec<String> {
        let mut cmd: Vec<String> = ["iris", "cluster", "controller", "serve"]
            .map(String::from)
            .to_vec();
        cmd.push("--host=0.0.0.0".into());
        cmd.push(format!("--port={}", self.port));
        cmd.push(format!("--config={CONFIG_DIR}/config.json"));
        cmd.push(format!("--state-dir={}", self.state.mount_path()));
        if self.fresh {
            cmd.push("--fresh".into());
        }
        if self.checkpoint_interval_seconds > 0 {
            cmd.push(format!(
                "--checkpoint-interval={}",
                self.checkpoint_interval_seconds
            ));
        }
        cmd
    }

    /// The ConfigMap with the config.
    pub fn config_map(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": self.namespace, "labels": app_labels()},
            "data": {"config.json": self.config_json},
        })
    }

    /// The state claim, when the state is not a hostPath.
    pub fn state_claim(&self) -> Option<Value> {
        let StateVolume::Claim { size } = &self.state else {
            return None;
        };
        Some(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": STATE_PVC, "namespace": self.namespace, "labels": app_labels()},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": size}},
            },
        }))
    }

    /// The controller Deployment running `image`.
    pub fn deployment(&self) -> Value {
        let state_volume = match &self.state {
            StateVolume::Claim { .. } => {
                json!({"name": "local-state", "persistentVolumeClaim": {"claimName": STATE_PVC}})
            }
            StateVolume::HostPath(path) => {
                json!({"name": "local-state", "hostPath": {"path": path, "type": "DirectoryOrCreate"}})
            }
        };
        let mut node_selector = json!({
            "kubernetes.io/arch": "amd64",
            format!("iris-{}-scale-group", self.label_prefix): self.scale_group,
        });
        if let Some(h) = &self.hostname {
            node_selector["kubernetes.io/hostname"] = json!(h);
        }
        let env: Vec<Value> = self
            .env
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        let probe = |initial: u32, period: u32| {
            json!({
                "httpGet": {"path": "/health", "port": self.port},
                "initialDelaySeconds": initial,
                "periodSeconds": period,
                "timeoutSeconds": 10,
                "failureThreshold": 6,
            })
        };
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": DEPLOYMENT, "namespace": self.namespace, "labels": app_labels()},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": app_labels()},
                "template": {
                    "metadata": {"labels": app_labels()},
                    "spec": {
                        "serviceAccountName": SERVICE_ACCOUNT,
                        "priorityClassName": "iris-system",
                        "nodeSelector": node_selector,
                        "tolerations": [
                            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                            {"key": "qos.coreweave.cloud/interruptable", "operator": "Exists", "effect": "NoExecute"},
                        ],
                        "containers": [{
                            "name": CONTAINER,
                            "image": self.image,
                            "imagePullPolicy": "Always",
                            "command": self.command(),
                            "ports": [{"containerPort": self.port}],
                            "env": env,
                            "volumeMounts": [
                                {"name": "config", "mountPath": CONFIG_DIR, "readOnly": true},
                                {"name": "local-state", "mountPath": self.state.mount_path()},
                            ],
                            "readinessProbe": probe(10, 10),
                            "livenessProbe": probe(30, 30),
                        }],
                        "volumes": [
                            {"name": "config", "configMap": {"name": CONFIG_MAP}},
                            state_volume,
                        ],
                    },
                },
            },
        })
    }

    /// The ClusterIP Service in front of the controller.
    pub fn service(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": self.service_name, "namespace": self.namespace},
            "spec": {
                "type": "ClusterIP",
                "selector": app_labels(),
                "ports": [{"port": self.port, "targetPort": self.port}],
            },
        })
    }

    /// The PDB that keeps voluntary evictions off the controller.
    pub fn pdb(&self) -> Value {
        json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": PDB, "namespace": self.namespace, "labels": app_labels()},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": app_labels()}},
        })
    }
}

fn app_labels() -> Value {
    json!({APP_LABEL.0: APP_LABEL.1})
}

/// An admin-owned object `cluster start` checks for and never creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prerequisite {
    /// `apiVersion` (`v1` for the core group).
    pub api_version: &'static str,
    /// Kind, as printed.
    pub kind: &'static str,
    /// Plural resource name.
    pub plural: &'static str,
    /// Namespace, for namespaced objects.
    pub namespace: Option<String>,
    /// Object name.
    pub name: String,
}

impl Prerequisite {
    /// `Kind/namespace/name` or `Kind/name`, as the missing list prints it.
    pub fn label(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.kind, self.name),
            None => format!("{}/{}", self.kind, self.name),
        }
    }
}

/// The admin-owned objects the controller needs, in the order they are reported: its
/// namespace, ServiceAccount and RBAC, and the ClusterQueue its LocalQueue points at (the
/// queue's ResourceFlavors are checked once the queue is read).
pub fn prerequisites(namespace: &str, cluster_queue: &str) -> Vec<Prerequisite> {
    let ns = || Some(namespace.to_string());
    let rbac = "rbac.authorization.k8s.io/v1";
    let cluster_role = format!("iris-controller-{namespace}");
    vec![
        Prerequisite {
            api_version: "v1",
            kind: "Namespace",
            plural: "namespaces",
            namespace: None,
            name: namespace.into(),
        },
        Prerequisite {
            api_version: "v1",
            kind: "ServiceAccount",
            plural: "serviceaccounts",
            namespace: ns(),
            name: SERVICE_ACCOUNT.into(),
        },
        Prerequisite {
            api_version: rbac,
            kind: "ClusterRole",
            plural: "clusterroles",
            namespace: None,
            name: cluster_role.clone(),
        },
        Prerequisite {
            api_version: rbac,
            kind: "ClusterRoleBinding",
            plural: "clusterrolebindings",
            namespace: None,
            name: cluster_role,
        },
        Prerequisite {
            api_version: rbac,
            kind: "Role",
            plural: "roles",
            namespace: ns(),
            name: TASK_SECRET_ROLE.into(),
        },
        Prerequisite {
            api_version: rbac,
            kind: "RoleBinding",
            plural: "rolebindings",
            namespace: ns(),
            name: TASK_SECRET_ROLE.into(),
        },
        Prerequisite {
            api_version: crate::priority::KUEUE_API_VERSION,
            kind: "ClusterQueue",
            plural: "clusterqueues",
            namespace: None,
            name: cluster_queue.into(),
        },
    ]
}

/// The ResourceFlavors a ClusterQueue object names (`spec.resourceGroups[].flavors[].name`).
pub fn cluster_queue_flavors(cq: &Value) -> Vec<String> {
    let mut out: Vec<String> = cq["spec"]["resourceGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["flavors"].as_array().into_iter().flatten())
        .filter_map(|f| f["name"].as_str().map(str::to_string))
        .collect();
    out.dedup();
    out
}

/// Where a controller rollout stands, from its Deployment and the pods it selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollout {
    /// The current generation has an available replica.
    Available,
    /// Not yet; the reason, for progress messages.
    Waiting(String),
    /// It will not become available without a change (bad image, crashing container).
    Failed(String),
}

/// Reasons a waiting container will not get past without a change.
const FATAL_WAITING: [&str; 4] = [
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
];

/// Reads a rollout: available once the Deployment has observed its generation and counts an
/// updated, available replica; failed as soon as one of its pods cannot start its image or its
/// container has exited (the controller never exits on its own while it serves).
pub fn rollout(deployment: &Value, pods: &[Value]) -> Rollout {
    let generation = deployment["metadata"]["generation"].as_i64().unwrap_or(0);
    let status = &deployment["status"];
    let observed = status["observedGeneration"].as_i64().unwrap_or(0);
    let count = |k: &str| status[k].as_i64().unwrap_or(0);
    for pod in pods {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        if pod["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        for c in pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let waiting = &c["state"]["waiting"];
            if let Some(reason) = waiting["reason"].as_str() {
                if FATAL_WAITING.contains(&reason) {
                    let msg = waiting["message"].as_str().unwrap_or("");
                    return Rollout::Failed(format!(
                        "controller pod {name} cannot start: {reason}: {msg}"
                    ));
                }
                if reason == "CrashLoopBackOff" {
                    return Rollout::Failed(format!(
                        "controller pod {name} is in CrashLoopBackOff (restarts: {})",
                        c["restartCount"].as_i64().unwrap_or(0)
                    ));
                }
            }
            let terminated = &c["state"]["terminated"];
            if let Some(code) = terminated["exitCode"].as_i64() {
                return Rollout::Failed(format!(
                    "controller pod {name} exited with code {code} ({})",
                    terminated["reason"].as_str().unwrap_or("Error")
                ));
            }
        }
        if pod["status"]["phase"] == "Failed" {
            return Rollout::Failed(format!("controller pod {name} failed"));
        }
    }
    if observed >= generation && count("updatedReplicas") >= 1 && count("availableReplicas") >= 1 {
        return Rollout::Available;
    }
    let live = pods
        .iter()
        .filter(|p| !p["metadata"]["deletionTimestamp"].is_string())
        .count();
    Rollout::Waiting(match live {
        0 => "no controller pod yet".to_string(),
        _ => {
            let phase = pods
                .iter()
                .filter_map(|p| p["status"]["phase"].as_str())
                .next()
                .unwrap_or("Pending");
            format!("controller pod {phase}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(state: StateVolume) -> ControllerDeploy {
        ControllerDeploy {
            namespace: "iris".into(),
            label_prefix: "cw".into(),
            image: "ghcr.io/acme/iris:v1".into(),
            port: 10000,
            service_name: "iris-controller-svc".into(),
            scale_group: "cpu-erapids".into(),
            hostname: None,
            state,
            checkpoint_interval_seconds: 600,
            fresh: false,
            env: vec![("A".into(), "1".into())],
            config_json: "{}".into(),
        }
    }

    #[test]
    fn the_deployment_matches_the_published_shape() {
        let d = deploy(StateVolume::Claim {
            size: "50Gi".into(),
        });
        let dep = d.deployment();
        let spec = &dep["spec"];
        assert_eq!(spec["replicas"], 1);
        assert_eq!(spec["strategy"]["type"], "Recreate");
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "iris-controller");
        assert_eq!(pod["priorityClassName"], "iris-system");
        assert_eq!(pod["nodeSelector"]["iris-cw-scale-group"], "cpu-erapids");
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "ghcr.io/acme/iris:v1");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/health");
        let cmd: Vec<&str> = c["command"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            cmd,
            [
                "iris",
                "cluster",
                "controller",
                "serve",
                "--host=0.0.0.0",
                "--port=10000",
                "--config=/etc/iris/config.json",
                "--state-dir=/var/cache/iris/controller",
                "--checkpoint-interval=600",
            ]
        );
        assert_eq!(
            pod["volumes"][1]["persistentVolumeClaim"]["claimName"],
            "iris-controller-state"
        );
        assert!(d.state_claim().is_some());
        let hp = deploy(StateVolume::HostPath("/mnt/local/state".into()));
        assert!(hp.state_claim().is_none());
        let v = &hp.deployment()["spec"]["template"]["spec"]["volumes"][1];
        assert_eq!(v["hostPath"]["path"], "/mnt/local/state");
        assert_eq!(
            hp.deployment()["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][1]
                ["mountPath"],
            "/mnt/local/state"
        );
        assert_eq!(d.service()["spec"]["ports"][0]["targetPort"], 10000);
    }

    #[test]
    fn prerequisites_name_rbac_by_namespace_and_flavors_come_from_the_queue() {
        let labels: Vec<String> = prerequisites("iris-ci", "iris-cq")
            .iter()
            .map(Prerequisite::label)
            .collect();
        assert_eq!(
            labels,
            [
                "Namespace/iris-ci",
                "ServiceAccount/iris-ci/iris-controller",
                "ClusterRole/iris-controller-iris-ci",
                "ClusterRoleBinding/iris-controller-iris-ci",
                "Role/iris-ci/iris-task-secret-delivery",
                "RoleBinding/iris-ci/iris-task-secret-delivery",
                "ClusterQueue/iris-cq",
            ]
        );
        let cq = json!({"spec": {"resourceGroups": [
            {"flavors": [{"name": "cw-tas"}, {"name": "cpu"}]},
            {"flavors": [{"name": "gpu"}]},
        ]}});
        assert_eq!(cluster_queue_flavors(&cq), ["cw-tas", "cpu", "gpu"]);
    }

    #[test]
    fn a_rollout_fails_fast_on_a_bad_image_and_waits_for_its_generation() {
        let dep = |gen: i64, observed: i64, avail: i64| {
            json!({"metadata": {"generation": gen}, "status": {
                "observedGeneration": observed, "updatedReplicas": avail, "availableReplicas": avail}})
        };
        let pod =
            |status: Value| json!({"metadata": {"name": "iris-controller-x"}, "status": status});
        let pulling = pod(json!({"phase": "Pending", "containerStatuses": [{"state": {
            "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"x\""}}}]}));
        let v = rollout(&dep(2, 2, 0), &[pulling]);
        assert!(
            matches!(&v, Rollout::Failed(m) if m.contains("ImagePullBackOff") && m.contains("Back-off")),
            "{v:?}"
        );
        let exited = pod(json!({"phase": "Running", "containerStatuses": [{"state": {
            "terminated": {"exitCode": 2, "reason": "Error"}}}]}));
        assert!(
            matches!(rollout(&dep(1, 1, 0), &[exited]), Rollout::Failed(m) if m.contains("code 2"))
        );
        let running =
            pod(json!({"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}));
        assert_eq!(
            rollout(&dep(2, 1, 1), std::slice::from_ref(&running)),
            Rollout::Waiting("controller pod Running".into())
        );
        assert_eq!(rollout(&dep(2, 2, 1), &[running]), Rollout::Available);
        assert_eq!(
            rollout(&dep(1, 1, 0), &[]),
            Rollout::Waiting("no controller pod yet".into())
        );
    }
}
