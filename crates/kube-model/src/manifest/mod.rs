//! Pod, PodDisruptionBudget and Secret manifests for one task attempt (reference §3.1–3.3).
//!
//! One Pod per attempt, named from `(task, attempt, uid)` so a repeated launch is idempotent.
//! Everything here is a pure function of a [`PodInput`] (what the controller decided) and a
//! [`ProviderConfig`] (the `kubernetes_provider` section of the cluster config).
//!
//! Not built, on purpose (the published Python provider has them):
//! * the `log-shipper` sidecar — the controller streams the `task` container's log through the
//!   Kubernetes API instead;
//! * the `output-uploader` container — task outputs stay in the `task-outputs` emptyDir;
//! * container security profiles other than the default (`SYS_PTRACE`), gVisor and sandbox
//!   egress (`iris.egress`).
//!
//! By role: `input` (what a manifest is built from), `names` (object names, labels and
//! annotations), `pod` (the Pod itself, with nodeSelector and tolerations), `env` (command script
//! and environment), `resources` (requests and limits), `volumes` (volumes and mounts), `pdb`
//! (PodDisruptionBudget), `secret` (the per-pod Secret) and `workdir` (the `stage-workdir` init
//! container and the per-pod ConfigMap of workdir files). Everything public is re-exported
//! here.

mod env;
mod input;
mod names;
mod pdb;
mod pod;
mod resources;
mod secret;
mod volumes;
mod workdir;

pub use env::{pod_env, task_script};
pub use input::{NodeConstraint, PodInput, ProviderConfig};
pub use names::{
    pod_annotations, pod_group_name, pod_labels, pod_name, sanitize_label_value, task_hash,
};
pub use pdb::{build_pdb, pdb_name};
pub use pod::build_pod;
pub use secret::{build_secret, secret_name};
pub use workdir::{
    build_workdir_config_map, workdir_config_map_name, workdir_relative_path, STAGE_CONTAINER,
    STAGE_SCRIPT,
};

use crate::topology::TopologyError;

/// Label: every Iris pod carries `iris.managed=true`.
pub const LABEL_MANAGED: &str = "iris.managed";
/// Label: `iris.runtime=iris-kubernetes`.
pub const LABEL_RUNTIME: &str = "iris.runtime";
/// Value of [`LABEL_RUNTIME`].
pub const RUNTIME_VALUE: &str = "iris-kubernetes";
/// Label: the task wire id, sanitised to a label value.
pub const LABEL_TASK_ID: &str = "iris.task_id";
/// Label: the attempt number.
pub const LABEL_ATTEMPT_ID: &str = "iris.attempt_id";
/// Label: first 16 hex chars of sha256(task wire id); kill/stray detection keys on it.
pub const LABEL_TASK_HASH: &str = "iris.task_hash";
/// Label: the job path, sanitised to a label value.
pub const LABEL_JOB_ID: &str = "iris.job_id";
/// Label: the accelerator variant a GPU pod asked for (sanitised), so held GPUs can be
/// attributed per variant.
pub const LABEL_GPU_VARIANT: &str = "iris.gpu_variant";
/// Annotation: the full, unsanitised task wire id.
pub const ANNOTATION_TASK_ID: &str = "iris.task_id";
/// Node label matched by a `pool EQ x` constraint.
pub const NODE_LABEL_POOL: &str = "iris.pool";
/// Node label matched by a `region EQ x` constraint.
pub const NODE_LABEL_REGION: &str = "iris.region";

/// Kueue label: the LocalQueue a pod is admitted through.
pub const KUEUE_QUEUE_NAME: &str = "kueue.x-k8s.io/queue-name";
/// Kueue label: the WorkloadPriorityClass.
pub const KUEUE_PRIORITY_CLASS: &str = "kueue.x-k8s.io/priority-class";
/// Kueue label: the pod group of a gang (also the Workload's name).
pub const KUEUE_POD_GROUP_NAME: &str = "kueue.x-k8s.io/pod-group-name";
/// Kueue label: a gang member's index.
pub const KUEUE_POD_GROUP_POD_INDEX: &str = "kueue.x-k8s.io/pod-group-pod-index";
/// Kueue annotation: a gang's size.
pub const KUEUE_POD_GROUP_TOTAL_COUNT: &str = "kueue.x-k8s.io/pod-group-total-count";

/// Extended resource name of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Extended resource name of InfiniBand RDMA devices.
pub const RDMA_RESOURCE: &str = "rdma/ib";
/// Name of the container that runs the task.
pub const TASK_CONTAINER: &str = "task";
/// Where job secrets are mounted, one file per key (rigging's well-known directory, which the
/// task finds in `RIGGING_SECRETS_DIR`).
pub const SECRETS_MOUNT_PATH: &str = "/run/rigging/secrets";
/// The pod volume holding the job's secrets.
const SECRETS_VOLUME: &str = "job-secrets";
/// Mode of the secret files: readable by the owner and the pod's fsGroup, nobody else.
const SECRET_FILE_MODE: i32 = 0o440;
/// The pod's fsGroup when it mounts secrets, so the task's user can read them.
const SECRET_GROUP: i64 = 2000;

/// Longest pod name we produce (a DNS label).
const MAX_POD_NAME_LEN: usize = 63;
/// Longest label value Kubernetes accepts.
const MAX_LABEL_VALUE_LEN: usize = 63;
/// `/dev/shm` size for accelerator pods that request no memory (100 GiB, in bytes as the
/// reference writes it).
const SHM_FALLBACK: &str = "107374182400";
const GIB: u64 = 1 << 30;

/// Why a manifest cannot be built. The task fails terminally with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// An impossible gang shape (§4.4).
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The gang's `group_by` is not a level this cluster maps.
    #[error(
        "coscheduling group_by '{group_by}' has no topology mapping on this cluster (known: {}); \
         use a known level or configure kubernetes_provider.kueue.topologies",
        known.join(", ")
    )]
    UnknownGroupBy {
        /// The requested level.
        group_by: String,
        /// The levels the cluster maps, sorted.
        known: Vec<String>,
    },
    /// A `pool`/`region` constraint with an operator other than EQ.
    #[error("constraint {key} {op} cannot become a nodeSelector: only EQ is supported for {key}")]
    UnsupportedConstraint {
        /// `pool` or `region`.
        key: String,
        /// The operator's name (`NE`, `IN`, …).
        op: String,
    },
    /// Neither the request nor the cluster names an image.
    #[error(
        "no task image: the request sets none and kubernetes_provider has no default task image"
    )]
    MissingImage,
    /// A workdir file whose name is not a safe relative path.
    #[error("workdir file '{name}': {why}; name files by paths relative to the working directory")]
    InvalidWorkdirFile {
        /// The name as submitted.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// `kubernetes_provider.kueue.cluster_queue` is empty.
    #[error("kubernetes_provider.kueue.cluster_queue is required: the LocalQueue must point at a ClusterQueue")]
    MissingClusterQueue,
}

#[cfg(test)]
mod tests {
    use super::names::dns_fragment;
    use super::*;
    use crate::topology;
    use iris_types::Band;
    use k8s_openapi::api::core::v1::{Pod, PodSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use std::collections::BTreeMap;

    /// A minimal CPU task; tests override what they exercise.
    fn input() -> PodInput {
        PodInput {
            task_id: "/alice/train/0".into(),
            attempt_id: 0,
            attempt_uid: "0123456789abcdef".into(),
            job_id: "/alice/train".into(),
            num_tasks: 1,
            task_index: 0,
            band: Band::Interactive,
            argv: vec!["python".into(), "-c".into(), "print('hi')".into()],
            setup_commands: vec![],
            env: BTreeMap::new(),
            system_env: BTreeMap::new(),
            cpu_millicores: 500,
            memory_bytes: 1 << 30,
            disk_bytes: 0,
            gpu_count: 0,
            gpu_variant: String::new(),
            tpu: false,
            group_by: None,
            constraints: vec![],
            timeout_seconds: None,
            task_image: None,
            secrets: BTreeMap::new(),
            bundle_id: String::new(),
            workdir_files: BTreeMap::new(),
            workdir_file_refs: BTreeMap::new(),
        }
    }

    fn config() -> ProviderConfig {
        ProviderConfig {
            default_task_image: "ghcr.io/example/iris-task:latest".into(),
            ..Default::default()
        }
    }

    fn spec(pod: &Pod) -> &PodSpec {
        pod.spec.as_ref().expect("built pods have a spec")
    }

    #[test]
    fn pod_names_are_dns_labels_and_distinct() {
        let n = pod_name("/alice/train/0", 3, "0123456789ABCDEF");
        let hash8 = &task_hash("/alice/train/0")[..8];
        assert_eq!(n, format!("iris-alice-train-0-{hash8}-3-0123456789abcdef"));
        assert_eq!(
            pod_name("/alice/train/0", 3, ""),
            format!("iris-alice-train-0-{hash8}-3")
        );

        let long_a = format!("/alice/{}/0", "x".repeat(100));
        let long_b = format!("/alice/{}/1", "x".repeat(100));
        let a = pod_name(&long_a, 0, "ffffffffffffffff");
        let b = pod_name(&long_b, 0, "ffffffffffffffff");
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
        for n in [&a, &b] {
            assert!(n
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
            assert!(!n.contains("--"));
        }
        assert_eq!(dns_fragment("iris-/Bob__x//y/0"), "iris-bob-x-y-0");
    }

    #[test]
    fn label_values_are_sanitised() {
        assert_eq!(sanitize_label_value("/alice/train/0"), "alice.train.0");
        assert_eq!(sanitize_label_value("///"), "unknown");
        let long = sanitize_label_value(&format!("/a/{}", "b".repeat(80)));
        assert_eq!(long.len(), 63);
        assert_eq!(sanitize_label_value("/a/b c:1"), "a.b.c.1");
        assert_eq!(task_hash("/alice/train/0").len(), 16);
    }

    #[test]
    fn labels_for_cpu_and_gang_pods() {
        let cfg = config();
        let l = pod_labels(&input(), &cfg);
        assert_eq!(l["iris.task_id"], "alice.train.0");
        assert_eq!(l["iris.job_id"], "alice.train");
        assert_eq!(l["iris.attempt_id"], "0");
        assert_eq!(l["iris-iris-managed"], "true");
        assert_eq!(l[KUEUE_QUEUE_NAME], "iris-lq");
        assert_eq!(l[KUEUE_PRIORITY_CLASS], "iris-cpu-interactive");
        assert!(!l.contains_key(KUEUE_POD_GROUP_NAME));

        let gang = PodInput {
            task_id: "/alice/train/3".into(),
            task_index: 3,
            num_tasks: 8,
            gpu_count: 8,
            gpu_variant: "H100".into(),
            tpu: false,
            group_by: Some("leafgroup".into()),
            band: Band::Batch,
            ..input()
        };
        let l = pod_labels(&gang, &cfg);
        assert_eq!(l[KUEUE_POD_GROUP_NAME], pod_group_name("/alice/train", 0));
        assert_eq!(l[KUEUE_POD_GROUP_POD_INDEX], "3");
        assert_eq!(l[KUEUE_PRIORITY_CLASS], "iris-coscheduled-batch");
        assert_eq!(l[LABEL_GPU_VARIANT], "H100");
        assert!(pod_group_name("/alice/train", 2).starts_with("iris-pg-"));
        assert!(pod_group_name("/alice/train", 2).ends_with("-2"));
    }

    #[test]
    fn annotations_for_each_kind_of_pod() {
        let cfg = config();
        let a = pod_annotations(&input(), &cfg).unwrap();
        assert_eq!(a[topology::ANNOTATION_UNCONSTRAINED], "true");
        assert_eq!(a[ANNOTATION_TASK_ID], "/alice/train/0");
        let gpu = PodInput {
            gpu_count: 1,
            ..input()
        };
        let a = pod_annotations(&gpu, &cfg).unwrap();
        assert_eq!(a[topology::ANNOTATION_PREFERRED], "kubernetes.io/hostname");
        assert!(!a.contains_key(topology::ANNOTATION_UNCONSTRAINED));
        let gang = PodInput {
            num_tasks: 8,
            gpu_count: 8,
            group_by: Some("leafgroup".into()),
            ..input()
        };
        let a = pod_annotations(&gang, &cfg).unwrap();
        assert_eq!(a[KUEUE_POD_GROUP_TOTAL_COUNT], "8");
        assert_eq!(a[topology::ANNOTATION_PREFERRED], topology::LABEL_LEAFGROUP);
    }

    #[test]
    fn env_precedence_and_downward_api() {
        let mut cfg = config();
        cfg.controller_address = Some("http://iris-controller-svc:10000".into());
        cfg.task_env = BTreeMap::from([
            ("A".into(), "cluster".into()),
            ("B".into(), "cluster".into()),
            ("IRIS_WORKDIR".into(), "/elsewhere".into()),
        ]);
        let inp = PodInput {
            env: BTreeMap::from([
                ("B".into(), "job".into()),
                ("C".into(), "job".into()),
                ("IRIS_NUM_TASKS".into(), "99".into()),
                ("IRIS_ADVERTISE_HOST".into(), "1.2.3.4".into()),
            ]),
            system_env: BTreeMap::from([
                ("C".into(), "system".into()),
                ("IRIS_BUNDLE_ID".into(), "abc".into()),
            ]),
            ..input()
        };
        let env = pod_env(&inp, &cfg);
        let plain: BTreeMap<&str, &str> = env
            .iter()
            .filter_map(|e| e.value.as_deref().map(|v| (e.name.as_str(), v)))
            .collect();
        assert_eq!(plain["A"], "cluster");
        assert_eq!(plain["B"], "job");
        assert_eq!(plain["C"], "system");
        assert_eq!(plain["IRIS_WORKDIR"], "/app");
        assert_eq!(plain["IRIS_NUM_TASKS"], "1");
        assert_eq!(plain["IRIS_TASK_ID"], "/alice/train/0:0");
        assert_eq!(plain["IRIS_BUNDLE_ID"], "abc");
        assert_eq!(
            plain["IRIS_CONTROLLER_URL"],
            "http://iris-controller-svc:10000"
        );
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names
                .iter()
                .filter(|n| **n == "IRIS_ADVERTISE_HOST")
                .count(),
            1
        );
        let tail: Vec<(&str, &str)> = env[env.len() - 2..]
            .iter()
            .map(|e| {
                let path = e
                    .value_from
                    .as_ref()
                    .and_then(|v| v.field_ref.as_ref())
                    .map(|f| f.field_path.as_str())
                    .unwrap_or("");
                (e.name.as_str(), path)
            })
            .collect();
        assert_eq!(
            tail,
            vec![
                ("IRIS_ADVERTISE_HOST", "status.podIP"),
                ("IRIS_NODE_NAME", "spec.nodeName")
            ]
        );
    }

    #[test]
    fn resources_and_host_network() {
        let gpu = PodInput {
            gpu_count: 8,
            gpu_variant: "H100".into(),
            tpu: false,
            cpu_millicores: 32_000,
            memory_bytes: 0,
            disk_bytes: 100 * GIB + 5,
            ..input()
        };
        let mut cfg = config();
        let pod = build_pod(&gpu, &cfg).unwrap();
        let s = spec(&pod);
        let r = s.containers[0].resources.clone().unwrap();
        let limits = r.limits.unwrap();
        let requests = r.requests.unwrap();
        assert_eq!(requests["cpu"], Quantity("32000m".into()));
        assert!(!limits.contains_key("cpu"));
        assert_eq!(limits[GPU_RESOURCE], Quantity("8".into()));
        assert!(!limits.contains_key(RDMA_RESOURCE));
        assert_eq!(limits["ephemeral-storage"], Quantity("100Gi".into()));
        assert_eq!(s.host_network, None);
        assert_eq!(s.dns_policy, None);
        let shm = s
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "dshm")
            .unwrap();
        assert_eq!(
            shm.empty_dir.as_ref().unwrap().size_limit,
            Some(Quantity("107374182400".into()))
        );
        assert_eq!(s.tolerations.as_ref().map(Vec::len), Some(2));

        cfg.host_network = true;
        let pod = build_pod(&gpu, &cfg).unwrap();
        let s = spec(&pod);
        let limits = s.containers[0].resources.clone().unwrap().limits.unwrap();
        assert_eq!(limits[RDMA_RESOURCE], Quantity("8".into()));
        assert_eq!(s.host_network, Some(true));
        assert_eq!(s.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));

        let tiny_disk = PodInput {
            disk_bytes: 10,
            ..input()
        };
        let pod = build_pod(&tiny_disk, &config()).unwrap();
        let r = spec(&pod).containers[0].resources.clone().unwrap();
        assert_eq!(
            r.requests.unwrap()["ephemeral-storage"],
            Quantity("1Gi".into())
        );
        let mem = r.limits.unwrap();
        assert_eq!(mem["memory"], Quantity((1u64 << 30).to_string()));
    }

    #[test]
    fn node_selector_from_constraints() {
        let cfg = config();
        let inp = PodInput {
            constraints: vec![
                NodeConstraint::Eq {
                    key: "pool".into(),
                    value: "h100-a".into(),
                },
                NodeConstraint::Eq {
                    key: "region".into(),
                    value: "US-EAST-04".into(),
                },
                NodeConstraint::Other {
                    key: "tpu-name".into(),
                    op: "EXISTS".into(),
                },
                NodeConstraint::Eq {
                    key: "zone".into(),
                    value: "z".into(),
                },
            ],
            ..input()
        };
        let pod = build_pod(&inp, &cfg).unwrap();
        let sel = spec(&pod).node_selector.clone().unwrap();
        assert_eq!(
            sel,
            BTreeMap::from([
                ("iris-iris-managed".to_string(), "true".to_string()),
                ("iris.pool".to_string(), "h100-a".to_string()),
                ("iris.region".to_string(), "US-EAST-04".to_string()),
            ])
        );
        let bad = PodInput {
            constraints: vec![NodeConstraint::Other {
                key: "region".into(),
                op: "NE".into(),
            }],
            ..input()
        };
        assert_eq!(
            build_pod(&bad, &cfg).unwrap_err().to_string(),
            "constraint region NE cannot become a nodeSelector: only EQ is supported for region"
        );
    }

    #[test]
    fn deadline_only_for_non_gang_pods_with_a_timeout() {
        let mut cfg = config();
        cfg.deadline_grace_seconds = 300;
        let t = PodInput {
            timeout_seconds: Some(3600),
            ..input()
        };
        assert_eq!(
            spec(&build_pod(&t, &cfg).unwrap()).active_deadline_seconds,
            Some(3900)
        );
        let zero = PodInput {
            timeout_seconds: Some(0),
            ..input()
        };
        assert_eq!(
            spec(&build_pod(&zero, &cfg).unwrap()).active_deadline_seconds,
            None
        );
        let gang = PodInput {
            timeout_seconds: Some(3600),
            num_tasks: 2,
            gpu_count: 8,
            group_by: Some("leafgroup".into()),
            ..input()
        };
        assert_eq!(
            spec(&build_pod(&gang, &cfg).unwrap()).active_deadline_seconds,
            None
        );
    }

    #[test]
    fn invalid_nvl72_gangs_fail_first() {
        // Even with no image configured, the topology error is what the user sees.
        let cfg = ProviderConfig::default();
        let gang = PodInput {
            num_tasks: 18,
            gpu_count: 4,
            gpu_variant: "GB200".into(),
            tpu: false,
            group_by: Some("nvlink.domain.sliced".into()),
            ..input()
        };
        assert_eq!(
            build_pod(&gang, &cfg).unwrap_err().to_string(),
            "18 nodes would place 2 racks of 9, but a rack slice must exceed half a rack (10+ of 18 nodes) \
             to keep one slice per rack; use a larger gang (e.g. 20, 24, 32, 48)"
        );
        let half = PodInput {
            num_tasks: 32,
            gpu_count: 2,
            ..gang.clone()
        };
        assert!(build_pod(&half, &cfg)
            .unwrap_err()
            .to_string()
            .ends_with("(4 GPUs each); got 2"));
        let unknown = PodInput {
            group_by: Some("rack".into()),
            ..gang
        };
        assert!(matches!(
            build_pod(&unknown, &cfg),
            Err(ManifestError::UnknownGroupBy { .. })
        ));
        assert_eq!(build_pod(&input(), &cfg), Err(ManifestError::MissingImage));
    }

    #[test]
    fn priority_class_and_overrides() {
        let mut cfg = config();
        let pod = build_pod(
            &PodInput {
                band: Band::System,
                ..input()
            },
            &cfg,
        )
        .unwrap();
        assert_eq!(
            spec(&pod).priority_class_name.as_deref(),
            Some("iris-system")
        );
        cfg.priority_classes.insert("batch".into(), "cw-low".into());
        let pod = build_pod(
            &PodInput {
                band: Band::Batch,
                ..input()
            },
            &cfg,
        )
        .unwrap();
        assert_eq!(spec(&pod).priority_class_name.as_deref(), Some("cw-low"));
        assert_eq!(cfg.band_for_priority_class("cw-low"), Some(Band::Batch));
        assert_eq!(cfg.band_for_priority_class("iris-batch"), None);
        assert_eq!(
            cfg.band_for_priority_class("iris-production"),
            Some(Band::Production)
        );
    }

    #[test]
    fn script_quotes_argv_and_runs_setup_first() {
        let inp = PodInput {
            setup_commands: vec!["uv sync --frozen".into(), "echo it's ready".into()],
            argv: vec![
                "echo".into(),
                "it's".into(),
                "a b".into(),
                "".into(),
                "x=1".into(),
            ],
            ..input()
        };
        let s = task_script(&inp);
        let lines: Vec<&str> = s.lines().collect();
        // Each step in its own bash after a banner; a sync step only where there is a
        // pyproject.toml to sync.
        assert_eq!(
            &lines[..6],
            &[
                "set -e",
                "ulimit -c 0",
                "mkdir -p /app",
                "cd /app",
                "if [ -f pyproject.toml ]; then echo '[iris setup] step 1/2'; bash -c 'uv sync --frozen'; \
                 else echo '[iris setup] step 1/2 skipped: no pyproject.toml to sync'; fi",
                r#"echo '[iris setup] step 2/2'; bash -c 'echo it'"'"'s ready'"#,
            ]
        );
        assert_eq!(
            lines.last().copied(),
            Some(r#"exec echo 'it'"'"'s' 'a b' '' x=1"#)
        );
    }

    #[test]
    fn pdb_only_for_coordinators() {
        let cfg = config();
        let pdb = build_pdb(
            &PodInput {
                band: Band::Production,
                ..input()
            },
            &cfg,
        )
        .unwrap();
        let spec = pdb.spec.unwrap();
        assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
        assert_eq!(spec.max_unavailable, None);
        let pdb = build_pdb(
            &PodInput {
                band: Band::Batch,
                ..input()
            },
            &cfg,
        )
        .unwrap();
        assert_eq!(pdb.spec.unwrap().max_unavailable, Some(IntOrString::Int(1)));
        assert!(build_pdb(
            &PodInput {
                gpu_count: 1,
                ..input()
            },
            &cfg
        )
        .is_none());
        assert!(build_pdb(
            &PodInput {
                num_tasks: 2,
                ..input()
            },
            &cfg
        )
        .is_none());
    }

    #[test]
    fn secrets_are_mounted_and_owned_by_the_pod() {
        let cfg = config();
        assert!(build_secret(&input(), &cfg, None).is_none());
        let inp = PodInput {
            secrets: BTreeMap::from([("WANDB_API_KEY".into(), "s3cr3t".into())]),
            ..input()
        };
        let pod = build_pod(&inp, &cfg).unwrap();
        let pod_name = pod.metadata.name.clone().unwrap();
        let vol = spec(&pod)
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "job-secrets")
            .unwrap();
        let source = vol.secret.as_ref().unwrap();
        assert_eq!(source.secret_name, Some(format!("{pod_name}-secrets")));
        assert_eq!(source.default_mode, Some(0o440));
        assert_eq!(
            spec(&pod)
                .security_context
                .as_ref()
                .and_then(|c| c.fs_group),
            Some(2000),
            "the task reads its secrets through the pod's fsGroup"
        );
        let task = &spec(&pod).containers[0];
        let mount = task
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "job-secrets")
            .unwrap();
        assert_eq!(mount.mount_path, "/run/rigging/secrets");
        assert_eq!(mount.read_only, Some(true));
        let env: BTreeMap<String, String> = task
            .env
            .clone()
            .unwrap()
            .into_iter()
            .filter_map(|e| Some((e.name, e.value?)))
            .collect();
        assert_eq!(env["RIGGING_SECRETS_DIR"], "/run/rigging/secrets");
        assert!(!env.values().any(|v| v == "s3cr3t"), "no value in the env");
        assert!(
            build_pod(&input(), &cfg)
                .unwrap()
                .spec
                .unwrap()
                .security_context
                .is_none(),
            "no fsGroup without secrets"
        );
        let secret = build_secret(&inp, &cfg, Some("uid-1")).unwrap();
        assert_eq!(
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get("WANDB_API_KEY")),
            Some(&"s3cr3t".to_string())
        );
        assert_eq!(secret.metadata.name, Some(format!("{pod_name}-secrets")));
        let owner = &secret.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Pod", pod_name.as_str(), "uid-1")
        );
    }

    #[test]
    fn the_stage_workdir_init_container_stages_bundle_files_and_blobs() {
        let cfg = ProviderConfig {
            controller_address: Some("http://ctl:10000".into()),
            ..config()
        };
        // Nothing to stage: no init container.
        let pod = build_pod(&input(), &cfg).expect("valid");
        assert!(spec(&pod).init_containers.is_none());
        let inp = PodInput {
            bundle_id: "ab12".into(),
            workdir_files: BTreeMap::from([("pkg/run.py".into(), b"print(1)".to_vec())]),
            workdir_file_refs: BTreeMap::from([("big.bin".into(), "cd34".into())]),
            task_image: Some("ghcr.io/alice/custom:1".into()),
            ..input()
        };
        let pod = build_pod(&inp, &cfg).expect("valid");
        let init = &spec(&pod)
            .init_containers
            .as_ref()
            .expect("init containers")[0];
        assert_eq!(init.name, STAGE_CONTAINER);
        // The cluster's default image (it has Python), not the task's own.
        assert_eq!(
            init.image.as_deref(),
            Some("ghcr.io/example/iris-task:latest")
        );
        let command = init.command.clone().unwrap_or_default();
        assert_eq!(command[..2], ["python".to_string(), "-c".to_string()]);
        assert_eq!(command[2], STAGE_SCRIPT);
        let env: BTreeMap<String, String> = init
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(env["IRIS_WORKDIR"], "/app");
        assert_eq!(env["IRIS_CONTROLLER_URL"], "http://ctl:10000");
        assert_eq!(env["IRIS_BUNDLE_ID"], "ab12");
        assert_eq!(env["IRIS_WORKDIR_BLOB_REFS"], r#"{"big.bin":"cd34"}"#);
        assert_eq!(env["IRIS_WORKDIR_FILES_SRC"], "/iris/staged-workdir-files");
        let name = pod.metadata.name.clone().unwrap_or_default();
        let files = spec(&pod)
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "workdir-files")
            .and_then(|v| v.config_map.clone())
            .expect("the workdir-files volume");
        assert_eq!(files.name, workdir_config_map_name(&name));
        let items = files.items.unwrap_or_default();
        assert_eq!(
            (items[0].key.as_str(), items[0].path.as_str()),
            ("f0000", "pkg/run.py")
        );
        let cm = build_workdir_config_map(&inp, &cfg, Some("uid-1")).expect("a ConfigMap");
        assert_eq!(cm.metadata.name, Some(workdir_config_map_name(&name)));
        let data = cm.binary_data.unwrap_or_default();
        assert_eq!(data["f0000"].0, b"print(1)");
        let owner = cm.metadata.owner_references.unwrap_or_default();
        assert_eq!(
            (owner[0].kind.as_str(), owner[0].uid.as_str()),
            ("Pod", "uid-1")
        );
        // Without a controller address only the ConfigMap's files are staged (as the reference).
        let pod = build_pod(&inp, &config()).expect("valid");
        let init = &spec(&pod)
            .init_containers
            .as_ref()
            .expect("init containers")[0];
        let names: Vec<&str> = init.env.iter().flatten().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["IRIS_WORKDIR", "IRIS_WORKDIR_FILES_SRC"]);
        // A file name that escapes the working directory fails the manifest, naming it.
        let bad = PodInput {
            workdir_files: BTreeMap::from([("../etc/x".into(), vec![])]),
            ..input()
        };
        let e = build_pod(&bad, &cfg).expect_err("escapes");
        assert!(e.to_string().contains("workdir file '../etc/x'"), "{e}");
    }
}
