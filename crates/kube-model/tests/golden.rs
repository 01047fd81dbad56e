//! Golden manifests: each case renders its objects as YAML and compares them with
//! `tests/golden/<case>.yaml`. Run with `UPDATE_GOLDEN=1` to rewrite the files after an
//! intended change, then review the diff.

use std::collections::BTreeMap;
use std::path::PathBuf;

use iris_kube_model::manifest::{
    build_pdb, build_pod, build_workdir_config_map, NodeConstraint, PodInput, ProviderConfig,
};
use iris_kube_model::priority::{local_queue, pod_priority_classes, workload_priority_classes};
use iris_types::Band;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn to_yaml<T: serde::Serialize>(value: &T) -> String {
    serde_yaml::to_string(value).expect("k8s objects serialise to YAML")
}

/// Compares `docs` (joined as a multi-document YAML stream) with the golden file, or rewrites
/// it under `UPDATE_GOLDEN=1`.
fn check(case: &str, docs: &[String]) {
    let rendered = docs.iter().map(|d| format!("---\n{d}")).collect::<String>();
    let path = golden_dir().join(format!("{case}.yaml"));
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(golden_dir()).expect("create golden dir");
        std::fs::write(&path, &rendered).expect("write golden file");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run `UPDATE_GOLDEN=1 cargo test -p iris-kube-model --test golden`",
            path.display()
        )
    });
    if want != rendered {
        let first = want
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| want.lines().count().min(rendered.lines().count()));
        panic!(
            "{case}: rendered manifest differs from {} at line {}:\n  golden:   {:?}\n  rendered: {:?}\n\
             re-run with UPDATE_GOLDEN=1 if the change is intended\n--- rendered ---\n{rendered}",
            path.display(),
            first + 1,
            want.lines().nth(first),
            rendered.lines().nth(first),
        );
    }
}

fn config(host_network: bool) -> ProviderConfig {
    ProviderConfig {
        namespace: "iris".into(),
        label_prefix: "cw".into(),
        host_network,
        cache_dir: "/mnt/local/iris-cache".into(),
        default_task_image: "ghcr.io/marin-community/iris-task:2026.08".into(),
        controller_address: Some("http://iris-controller-svc.iris.svc.cluster.local:10000".into()),
        service_account: Some("iris-task".into()),
        task_env: BTreeMap::from([
            ("MARIN_PREFIX".into(), "s3://marin-cw/".into()),
            ("WANDB_MODE".into(), "offline".into()),
        ]),
        ..Default::default()
    }
}

fn system_env() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("IRIS_BUNDLE_ID".into(), "5f2c0e".into()),
        ("IRIS_TASK_TOKEN".into(), "token-for-tests".into()),
    ])
}

fn coordinator(band: Band) -> PodInput {
    PodInput {
        task_id: "/alice/pipeline-coord/0".into(),
        attempt_id: 0,
        attempt_uid: "0123456789abcdef".into(),
        job_id: "/alice/pipeline-coord".into(),
        num_tasks: 1,
        task_index: 0,
        band,
        argv: vec![
            "python".into(),
            "-m".into(),
            "pipeline.coordinate".into(),
            "--steps=all".into(),
        ],
        setup_commands: vec!["uv sync --frozen".into()],
        env: BTreeMap::from([("WANDB_MODE".into(), "online".into())]),
        system_env: system_env(),
        cpu_millicores: 2_000,
        memory_bytes: 8 << 30,
        disk_bytes: 20 << 30,
        gpu_count: 0,
        gpu_variant: String::new(),
        tpu: false,
        group_by: None,
        constraints: vec![NodeConstraint::Eq {
            key: "region".into(),
            value: "US-EAST-04".into(),
        }],
        timeout_seconds: Some(86_400),
        task_image: None,
        secrets: BTreeMap::new(),
        bundle_id: String::new(),
        workdir_files: BTreeMap::new(),
        workdir_file_refs: BTreeMap::new(),
    }
}

fn h100_standalone() -> PodInput {
    PodInput {
        task_id: "/bob/eval-llama/0".into(),
        attempt_id: 1,
        attempt_uid: "fedcba9876543210".into(),
        job_id: "/bob/eval-llama".into(),
        band: Band::Batch,
        argv: vec![
            "python".into(),
            "eval.py".into(),
            "--model".into(),
            "llama 3".into(),
        ],
        setup_commands: vec![],
        env: BTreeMap::new(),
        cpu_millicores: 16_000,
        memory_bytes: 0,
        disk_bytes: 0,
        gpu_count: 1,
        gpu_variant: "H100".into(),
        tpu: false,
        constraints: vec![],
        timeout_seconds: None,
        task_image: Some("ghcr.io/bob/eval:cuda12".into()),
        secrets: BTreeMap::from([("HF_TOKEN".into(), "hf_example".into())]),
        // Staged by the init container: the bundle, a workdir file from the per-pod
        // ConfigMap and one the controller holds as a blob.
        bundle_id: "5f2c0e".into(),
        workdir_files: BTreeMap::from([("_callable.pkl".into(), b"\x80\x05N.".to_vec())]),
        workdir_file_refs: BTreeMap::from([(
            "data/prompts.json".into(),
            "9b74c9897bac770ffc029102a200c5de5e1ee0a8ec5ae3c4b1f3f05bd0ab0d6b".into(),
        )]),
        ..coordinator(Band::Batch)
    }
}

fn h100_gang_member() -> PodInput {
    PodInput {
        task_id: "/carol/train-8b/3".into(),
        attempt_id: 2,
        attempt_uid: "00000000c0ffee00".into(),
        job_id: "/carol/train-8b".into(),
        num_tasks: 8,
        task_index: 3,
        band: Band::Interactive,
        argv: vec!["python".into(), "-m".into(), "train".into()],
        cpu_millicores: 96_000,
        memory_bytes: 1_000 << 30,
        disk_bytes: 500 << 30,
        gpu_count: 8,
        gpu_variant: "H100".into(),
        tpu: false,
        group_by: Some("leafgroup".into()),
        constraints: vec![NodeConstraint::Eq {
            key: "pool".into(),
            value: "h100-ib".into(),
        }],
        timeout_seconds: Some(36_000),
        ..coordinator(Band::Interactive)
    }
}

fn gb200_sliced_member() -> PodInput {
    PodInput {
        task_id: "/dave/train-70b/17".into(),
        attempt_id: 0,
        attempt_uid: "1111222233334444".into(),
        job_id: "/dave/train-70b".into(),
        num_tasks: 32,
        task_index: 17,
        band: Band::Production,
        argv: vec![
            "python".into(),
            "-m".into(),
            "train".into(),
            "--config".into(),
            "70b.yaml".into(),
        ],
        cpu_millicores: 120_000,
        memory_bytes: 800 << 30,
        disk_bytes: 0,
        gpu_count: 4,
        gpu_variant: "GB200".into(),
        tpu: false,
        group_by: Some("nvlink.domain.sliced".into()),
        constraints: vec![],
        timeout_seconds: None,
        ..coordinator(Band::Production)
    }
}

fn pod_docs(input: &PodInput, cfg: &ProviderConfig) -> Vec<String> {
    let mut docs = Vec::new();
    if let Some(pdb) = build_pdb(input, cfg) {
        docs.push(to_yaml(&pdb));
    }
    docs.push(to_yaml(
        &build_pod(input, cfg).expect("golden inputs are valid"),
    ));
    if let Some(cm) = build_workdir_config_map(input, cfg, Some("pod-uid")) {
        docs.push(to_yaml(&cm));
    }
    docs
}

#[test]
fn coordinator_pods_and_pdbs_per_band() {
    for band in Band::ALL {
        let input = coordinator(band);
        let cfg = config(false);
        assert!(build_pdb(&input, &cfg).is_some());
        check(
            &format!("coordinator-{}", band.name()),
            &pod_docs(&input, &cfg),
        );
    }
}

#[test]
fn coordinator_with_host_network() {
    check(
        "coordinator-batch-hostnet",
        &pod_docs(&coordinator(Band::Batch), &config(true)),
    );
}

#[test]
fn h100_standalone_pod() {
    let input = h100_standalone();
    assert!(build_pdb(&input, &config(false)).is_none());
    check("h100-standalone", &pod_docs(&input, &config(false)));
    check("h100-standalone-hostnet", &pod_docs(&input, &config(true)));
}

#[test]
fn h100_leafgroup_gang_member() {
    let input = h100_gang_member();
    check("h100-gang-leafgroup", &pod_docs(&input, &config(false)));
    check(
        "h100-gang-leafgroup-hostnet",
        &pod_docs(&input, &config(true)),
    );
}

#[test]
fn gb200_sliced_gang_member() {
    let input = gb200_sliced_member();
    let pod = build_pod(&input, &config(true)).expect("valid");
    let ann = pod.metadata.annotations.expect("annotations");
    assert_eq!(
        ann["kueue.x-k8s.io/podset-slice-size"], "16",
        "32 replicas = slice 2x16"
    );
    check("gb200-gang-sliced-2x16", &pod_docs(&input, &config(false)));
    check(
        "gb200-gang-sliced-2x16-hostnet",
        &pod_docs(&input, &config(true)),
    );
}

#[test]
fn priority_and_queue_objects() {
    let mut docs: Vec<String> = pod_priority_classes().iter().map(to_yaml).collect();
    docs.extend(workload_priority_classes().iter().map(to_yaml));
    docs.push(to_yaml(
        &local_queue("iris", "cw", "cw-cluster-queue").expect("valid"),
    ));
    check("priority-classes-and-local-queue", &docs);
}

#[test]
fn rendering_is_deterministic() {
    let cfg = config(true);
    let a = pod_docs(&gb200_sliced_member(), &cfg);
    let b = pod_docs(&gb200_sliced_member(), &cfg);
    assert_eq!(a, b);
}
