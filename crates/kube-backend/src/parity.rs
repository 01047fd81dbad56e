//! Pod parity with the published provider: the same run requests through the published
//! `_build_pod_manifest` (run by `tests/compat/pod_parity.py` in the compat venv) and through
//! ours ([`pod_input`] then `build_pod`), compared field by field.
//!
//! Left out of the comparison, on purpose (see `iris_kube_model::manifest`): the published
//! log-shipper sidecar and its `varlogpods` volume (we read logs through the API), the command
//! script's body (ours runs the same steps without the published uv wrapper), the
//! `stage-workdir` init container's script (ours is our own; its name, image, environment and
//! mounts are compared), and what we add:
//! the `IRIS_JOB_ID` variable and the `iris.gpu_variant` label (`kubectl get pods -l
//! iris.gpu_variant=H100`).
//!
//! Needs the published package: `tests/compat/run.sh` creates the venv and runs this with
//! `--ignored`; `IRIS_COMPAT_VENV` names another venv.

use crate::pods::pod_input;
use iris_kube_model as km;
use iris_proto::job;
use prost::Message;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Ours only: the published provider does not set these.
const EXTRA_ENV: [&str; 1] = ["IRIS_JOB_ID"];
const EXTRA_LABELS: [&str; 1] = [km::manifest::LABEL_GPU_VARIANT];
/// Theirs only: the log-shipper sidecar and the host log directory it reads.
const SIDECAR_VOLUMES: [&str; 1] = ["varlogpods"];
const SIDECAR_INIT: [&str; 1] = ["log-shipper"];
/// Environment values that are JSON documents: compared parsed (the reference pretty-prints).
const JSON_ENV: [&str; 5] = [
    "IRIS_TASK_RESOURCES",
    "IRIS_JOB_CONSTRAINTS",
    "IRIS_JOB_ENV",
    "IRIS_JOB_SETUP_SCRIPTS",
    "IRIS_WORKDIR_BLOB_REFS",
];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The published manifests, one entry per case.
fn published_cases() -> Vec<Value> {
    let venv = std::env::var_os("IRIS_COMPAT_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv-compat"));
    let python = venv.join("bin/python");
    let script = repo_root().join("tests/compat/pod_parity.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {}: {e}; create the venv with tests/compat/run.sh",
                python.display()
            )
        });
    assert!(
        out.status.success(),
        "{} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("the script prints a JSON list")
}

fn provider(config: &Value, host_network: bool) -> km::manifest::ProviderConfig {
    let s = |k: &str| config[k].as_str().unwrap_or_default().to_string();
    km::manifest::ProviderConfig {
        namespace: s("namespace"),
        label_prefix: s("label_prefix"),
        host_network,
        cache_dir: s("cache_dir"),
        default_task_image: s("default_image"),
        controller_address: Some(s("controller_address")),
        service_account: Some(s("service_account")),
        task_env: serde_json::from_value(config["task_env"].clone()).unwrap_or_default(),
        ..Default::default()
    }
}

/// name → value (or `valueFrom` as JSON) of a container's env list.
fn env_map(container: &Value) -> BTreeMap<String, Value> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().unwrap_or_default().to_string();
            let value = match e.get("value") {
                Some(Value::String(v)) if JSON_ENV.contains(&name.as_str()) => {
                    serde_json::from_str(v).unwrap_or_else(|_| json!(v))
                }
                Some(v) => v.clone(),
                None => json!({"valueFrom": e["valueFrom"]}),
            };
            (name, value)
        })
        .collect()
}

/// Items of a list keyed by `name`, minus `skip`.
fn by_name(list: &Value, skip: &[&str]) -> BTreeMap<String, Value> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?.to_string(), v.clone())))
        .filter(|(n, _)| !skip.contains(&n.as_str()))
        .collect()
}

/// Mount path → mount (a mount's position is not meaningful).
fn mounts(container: &Value) -> BTreeMap<String, Value> {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m["mountPath"].as_str()?.to_string(), m.clone())))
        .collect()
}

/// Every difference between the published pod and ours, as readable lines.
fn differences(theirs: &Value, ours: &Value) -> Vec<String> {
    let mut diffs = Vec::new();
    let mut same = |what: &str, a: &Value, b: &Value| {
        if a != b {
            diffs.push(format!("{what}:\n    published: {a}\n    ours:      {b}"));
        }
    };
    for field in ["name", "namespace", "labels", "annotations"] {
        same(
            &format!("metadata.{field}"),
            &theirs["metadata"][field],
            &ours["metadata"][field],
        );
    }
    let (ts, os) = (&theirs["spec"], &ours["spec"]);
    for field in [
        "restartPolicy",
        "nodeSelector",
        "tolerations",
        "priorityClassName",
        "activeDeadlineSeconds",
        "securityContext",
        "hostNetwork",
        "dnsPolicy",
        "serviceAccountName",
        "runtimeClassName",
        "automountServiceAccountToken",
    ] {
        same(&format!("spec.{field}"), &ts[field], &os[field]);
    }
    same(
        "spec.volumes",
        &json!(by_name(&ts["volumes"], &SIDECAR_VOLUMES)),
        &json!(by_name(&os["volumes"], &[])),
    );
    // The staging script is ours (`python -c <script>`): compared up to the script itself.
    let without_script = |list: &Value, skip: &[&str]| -> Value {
        let mut m = by_name(list, skip);
        for c in m.values_mut() {
            if let Some(cmd) = c["command"].as_array_mut() {
                cmd.truncate(2);
            }
            c["env"] = json!(env_map(c));
        }
        json!(m)
    };
    same(
        "spec.initContainers",
        &without_script(&ts["initContainers"], &SIDECAR_INIT),
        &without_script(&os["initContainers"], &[]),
    );
    let names = |s: &Value| -> Vec<Value> {
        s["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["name"].clone())
            .collect()
    };
    same("container names", &json!(names(ts)), &json!(names(os)));
    let (tc, oc) = (&ts["containers"][0], &os["containers"][0]);
    for field in [
        "image",
        "imagePullPolicy",
        "workingDir",
        "resources",
        "securityContext",
        "terminationMessagePolicy",
    ] {
        same(&format!("task.{field}"), &tc[field], &oc[field]);
    }
    same("task.volumeMounts", &json!(mounts(tc)), &json!(mounts(oc)));
    let (te, mut oe) = (env_map(tc), env_map(oc));
    for extra in EXTRA_ENV {
        oe.remove(extra);
    }
    let keys: BTreeSet<&String> = te.keys().chain(oe.keys()).collect();
    for k in keys {
        same(
            &format!("task env {k}"),
            te.get(k).unwrap_or(&Value::Null),
            oe.get(k).unwrap_or(&Value::Null),
        );
    }
    let last_line = |c: &Value| json!(c["command"][2].as_str().and_then(|s| s.lines().last()));
    same("task command", &tc["command"][0], &oc["command"][0]);
    same("task command's exec line", &last_line(tc), &last_line(oc));
    diffs
}

#[test]
#[ignore = "needs the published package: run by tests/compat/run.sh (cargo test -p iris-kube-backend -- --ignored parity)"]
fn parity_pods_match_the_published_pod_builder() {
    let cases = published_cases();
    assert!(cases.len() >= 4, "the script built {} cases", cases.len());
    let mut report = Vec::new();
    for case in &cases {
        let name = case["case"].as_str().unwrap_or("?");
        let bytes = hex::decode(case["request"].as_str().unwrap_or_default()).expect("hex");
        let req = job::RunTaskRequest::decode(bytes.as_slice()).expect("a RunTaskRequest");
        let config = provider(&case["config"], case["host_network"] == true);
        let url = config.controller_address.clone().unwrap_or_default();
        let pod = km::manifest::build_pod(&pod_input(&req, &url), &config)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut ours = serde_json::to_value(&pod).expect("a pod serialises");
        if let Some(labels) = ours["metadata"]["labels"].as_object_mut() {
            for extra in EXTRA_LABELS {
                labels.remove(extra);
            }
        }
        for d in differences(&case["pod"], &ours) {
            report.push(format!("[{name}] {d}"));
        }
    }
    assert!(
        report.is_empty(),
        "{} differences from the published pod builder:\n{}",
        report.len(),
        report.join("\n")
    );
}
