//! The environment a task process starts with, shared by every backend.
//!
//! [`iris_environment`] is the `IRIS_*` part derived from the `RunTaskRequest` and what the
//! runner knows ([`WorkerSide`]); [`secret_environment`] points the well-known clients at the
//! job's secret files. A worker daemon layers them as the published worker does
//! ([`task_environment`]: Iris variables, then the cluster's `task_env` defaults, then the job's
//! own env, then what the worker owns and nobody may replace — the attempt uid, the task token,
//! the worker's region, the interpreter in `IRIS_PYTHON`). The Kubernetes backend layers them as
//! the published pod builder does (cluster `task_env` < job env < Iris variables).
//!
//! Pure: the caller supplies everything it knows; no I/O here.

use iris_proto::job;
use std::collections::BTreeMap;

/// Constraint keys a child job inherits from its parent through `IRIS_JOB_CONSTRAINTS` (device
/// constraints are re-derived from each child's own resources), as in the reference.
const INHERITED_CONSTRAINT_KEYS: [&str; 2] = ["region", "zone"];

/// What the runner (a worker daemon, or the Kubernetes backend for a pod) contributes to a
/// task's environment.
#[derive(Clone, Debug, Default)]
pub struct WorkerSide {
    /// `IRIS_WORKER_ID`; empty (Kubernetes) leaves it unset.
    pub worker_id: String,
    /// The controller tasks call back (`IRIS_CONTROLLER_ADDRESS` and `_URL`); empty leaves both
    /// unset.
    pub controller_url: String,
    /// The address other tasks and users reach this worker's tasks on; empty leaves it unset
    /// (on Kubernetes the pod IP comes from the downward API).
    pub advertise_host: String,
    /// The address tasks should bind their servers to (the worker's own bind address).
    pub bind_host: String,
    /// The task's working directory (`IRIS_WORKDIR`).
    pub workdir: String,
    /// The venv the setup populates and the run phase activates (`IRIS_VENV`).
    pub venv: String,
    /// The interpreter callable entrypoints run (`exec $IRIS_PYTHON -u …`).
    pub python: String,
    /// The worker's `region` attribute, if it has one.
    pub region: Option<String>,
    /// Cluster-wide defaults (`defaults.task_env`); the job's env overrides them.
    pub task_env: BTreeMap<String, String>,
    /// The port allocated on this worker for each of the job's named ports.
    pub ports: BTreeMap<String, u16>,
    /// Where this attempt's secrets were written as files, when the job has any.
    pub secrets_dir: Option<String>,
}

/// The files a job's secrets are delivered as (name → contents): one per secret, plus an AWS
/// credentials file when both CoreWeave object-storage keys are present, as the reference
/// writes them.
pub fn secret_files(secrets: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut files = secrets.clone();
    if let (Some(id), Some(key)) = (
        secrets.get("CW_KEY_ID").filter(|v| !v.is_empty()),
        secrets.get("CW_KEY_SECRET").filter(|v| !v.is_empty()),
    ) {
        files.insert(
            AWS_CREDENTIALS_FILE.into(),
            format!("[default]\naws_access_key_id = {id}\naws_secret_access_key = {key}\n\n"),
        );
    }
    files
}

const AWS_CREDENTIALS_FILE: &str = ".aws-credentials";

/// Proto JSON with the reference's field names (`preserving_proto_field_name`): our generated
/// serde emits lowerCamelCase, which the reference's parser also accepts, but users read these
/// variables with plain `json.loads`, so the names must be the proto's.
fn proto_json<T: serde::Serialize>(m: &T) -> serde_json::Value {
    fn snake(s: &str) -> String {
        let mut out = String::with_capacity(s.len() + 4);
        for c in s.chars() {
            if c.is_ascii_uppercase() {
                out.push('_');
                out.push(c.to_ascii_lowercase());
            } else {
                out.push(c);
            }
        }
        out
    }
    // Only object keys that are field names are renamed: neither message serialized here has a
    // map field, whose keys would be user data.
    fn rename(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(o) => serde_json::Value::Object(
                o.into_iter().map(|(k, v)| (snake(&k), rename(v))).collect(),
            ),
            serde_json::Value::Array(a) => {
                serde_json::Value::Array(a.into_iter().map(rename).collect())
            }
            other => other,
        }
    }
    rename(serde_json::to_value(m).unwrap_or_default())
}

/// The `IRIS_*` variables (and the platform variables a TPU needs) of one attempt, from the
/// request and what the runner knows: identity, controller, addresses, paths, the parent's
/// setup scripts, env and inheritable constraints for child jobs, ports and resources.
pub fn iris_environment(run: &job::RunTaskRequest, w: &WorkerSide) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    set(
        "IRIS_TASK_ID",
        format!("{}:{}", run.task_id, run.attempt_id),
    );
    if !run.attempt_uid.is_empty() {
        set("IRIS_ATTEMPT_UID", run.attempt_uid.clone());
    }
    set("IRIS_NUM_TASKS", run.num_tasks.to_string());
    set(
        "IRIS_JOB_ID",
        iris_types::job_of_task(&run.task_id).to_string(),
    );
    set("IRIS_BUNDLE_ID", run.bundle_id.clone());
    if !w.controller_url.is_empty() {
        set("IRIS_CONTROLLER_ADDRESS", w.controller_url.clone());
        set("IRIS_CONTROLLER_URL", w.controller_url.clone());
    }
    if !run.task_token.is_empty() {
        set("IRIS_TASK_TOKEN", run.task_token.clone());
    }
    set("IRIS_BIND_HOST", w.bind_host.clone());
    if !w.advertise_host.is_empty() {
        set("IRIS_ADVERTISE_HOST", w.advertise_host.clone());
    }
    set("IRIS_WORKDIR", w.workdir.clone());
    // uv (sync and pip install) populates the same venv whatever directory a script runs in.
    set("IRIS_VENV", w.venv.clone());
    set("UV_PROJECT_ENVIRONMENT", w.venv.clone());
    if !w.worker_id.is_empty() {
        set("IRIS_WORKER_ID", w.worker_id.clone());
    }
    set("IRIS_PYTHON", w.python.clone());
    let environment = run.environment.clone().unwrap_or_default();
    // Always set, even when empty: a child can tell a parent that ran no setup from a top-level
    // submission with no parent.
    set(
        "IRIS_JOB_SETUP_SCRIPTS",
        serde_json::to_string(&environment.setup_scripts).unwrap_or_else(|_| "[]".into()),
    );
    if !environment.env_vars.is_empty() {
        set(
            "IRIS_JOB_ENV",
            serde_json::to_string(&environment.env_vars).unwrap_or_else(|_| "{}".into()),
        );
    }
    let inherited: Vec<serde_json::Value> = run
        .constraints
        .iter()
        .filter(|c| INHERITED_CONSTRAINT_KEYS.contains(&c.key.clone().unwrap_or_default().as_str()))
        .map(proto_json)
        .collect();
    if !inherited.is_empty() {
        set(
            "IRIS_JOB_CONSTRAINTS",
            serde_json::Value::Array(inherited).to_string(),
        );
    }
    for p in &run.ports {
        let port = w.ports.get(p).copied().unwrap_or(0);
        set(
            &format!("IRIS_PORT_{}", p.to_ascii_uppercase()),
            port.to_string(),
        );
    }
    if let Some(r) = &run.resources {
        let tpu = r
            .device
            .as_ref()
            .and_then(|d| d.device.as_ref())
            .is_some_and(|d| matches!(d, job::device_config::Device::Tpu(_)));
        if tpu {
            set("JAX_PLATFORMS", "tpu,cpu".into());
            set("PJRT_DEVICE", "TPU".into());
            set("JAX_FORCE_TPU_INIT", "1".into());
        }
        // Zero fields are omitted, as proto3 JSON does; an empty spec sets nothing.
        let json = proto_json(r);
        if json.as_object().is_some_and(|o| !o.is_empty()) {
            set("IRIS_TASK_RESOURCES", json.to_string());
        }
    }
    env
}

/// Where the job's secret files are (never their values): `RIGGING_SECRETS_DIR`, which nothing
/// may replace, then the well-known clients' paths, which the job's own env may set otherwise
/// (`HF_TOKEN_PATH` with an `HF_TOKEN` secret, `AWS_SHARED_CREDENTIALS_FILE` with both CoreWeave
/// object-storage keys). Applies them to `env`, the rest of the task's environment.
pub fn secret_environment<'a>(
    secrets: impl IntoIterator<Item = &'a String>,
    dir: &str,
    env: &mut BTreeMap<String, String>,
) {
    let names: Vec<&String> = secrets.into_iter().collect();
    let has = |k: &str| names.iter().any(|n| n.as_str() == k);
    env.insert("RIGGING_SECRETS_DIR".into(), dir.to_string());
    if has("HF_TOKEN") {
        env.entry("HF_TOKEN_PATH".into())
            .or_insert_with(|| format!("{dir}/HF_TOKEN"));
    }
    if has("CW_KEY_ID") && has("CW_KEY_SECRET") {
        env.entry("AWS_SHARED_CREDENTIALS_FILE".into())
            .or_insert_with(|| format!("{dir}/{AWS_CREDENTIALS_FILE}"));
    }
}

/// The environment of one attempt's process on a worker, in the order the reference layers it.
pub fn task_environment(run: &job::RunTaskRequest, w: &WorkerSide) -> BTreeMap<String, String> {
    let mut env = iris_environment(run, w);
    let environment = run.environment.clone().unwrap_or_default();
    env.extend(w.task_env.clone());
    env.extend(environment.env_vars);
    if let Some(dir) = &w.secrets_dir {
        secret_environment(environment.secrets.keys(), dir, &mut env);
    }
    // What the controller and the worker own: user and cluster env cannot replace these.
    env.remove("IRIS_ATTEMPT_UID");
    env.remove("IRIS_TASK_TOKEN");
    if !run.attempt_uid.is_empty() {
        env.insert("IRIS_ATTEMPT_UID".into(), run.attempt_uid.clone());
    }
    if !run.task_token.is_empty() {
        env.insert("IRIS_TASK_TOKEN".into(), run.task_token.clone());
    }
    if let Some(region) = w.region.as_ref().filter(|r| !r.is_empty()) {
        env.insert("IRIS_WORKER_REGION".into(), region.clone());
    }
    env.insert("IRIS_PYTHON".into(), w.python.clone());
    env
}

/// Whether a setup script runs `uv sync` (outside comments): such a step needs the job's
/// `pyproject.toml` in the working directory, so both kinds of backend skip it when there is
/// none (a worker decides before it runs anything; a pod's script checks when it gets there).
pub fn runs_uv_sync(script: &str) -> bool {
    script
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.windows(2).any(|w| w == ["uv", "sync"])
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_proto::job::{attribute_value, AttributeValue, Constraint};

    fn run() -> job::RunTaskRequest {
        job::RunTaskRequest {
            task_id: "/alice/train/2".into(),
            attempt_id: 1,
            attempt_uid: "uid-1".into(),
            num_tasks: 4,
            bundle_id: "b".into(),
            task_token: "tok".into(),
            ports: vec!["http".into(), "coord".into()],
            ..Default::default()
        }
    }

    fn worker() -> WorkerSide {
        WorkerSide {
            worker_id: "w1".into(),
            controller_url: "http://127.0.0.1:1".into(),
            advertise_host: "10.0.0.5".into(),
            bind_host: "127.0.0.1".into(),
            workdir: "/tmp/wd".into(),
            venv: "/tmp/wd/.venv".into(),
            python: "/usr/bin/python3".into(),
            region: Some("us-east".into()),
            ports: [("http".to_string(), 4242)].into(),
            ..Default::default()
        }
    }

    #[test]
    fn identity_addresses_and_ports() {
        let e = task_environment(&run(), &worker());
        assert_eq!(e["IRIS_TASK_ID"], "/alice/train/2:1");
        assert_eq!(e["IRIS_JOB_ID"], "/alice/train");
        assert_eq!(e["IRIS_NUM_TASKS"], "4");
        assert_eq!(e["IRIS_ADVERTISE_HOST"], "10.0.0.5");
        assert_eq!(e["IRIS_BIND_HOST"], "127.0.0.1");
        assert_eq!(e["IRIS_PORT_HTTP"], "4242");
        // A port the worker did not allocate reads 0 ("kernel-assigned"), as on Kubernetes.
        assert_eq!(e["IRIS_PORT_COORD"], "0");
        assert_eq!(e["IRIS_PYTHON"], "/usr/bin/python3");
        assert_eq!(e["IRIS_VENV"], "/tmp/wd/.venv");
        assert_eq!(e["UV_PROJECT_ENVIRONMENT"], "/tmp/wd/.venv");
        assert_eq!(e["IRIS_WORKER_REGION"], "us-east");
        assert_eq!(e["IRIS_JOB_SETUP_SCRIPTS"], "[]");
        assert!(
            !e.contains_key("IRIS_JOB_ENV"),
            "set only when the job has env"
        );
        assert!(!e.contains_key("IRIS_TASK_RESOURCES"));
    }

    #[test]
    fn cluster_defaults_lose_to_the_job_and_neither_replaces_what_the_worker_owns() {
        let mut r = run();
        r.environment = Some(job::EnvironmentConfig {
            env_vars: [
                ("SHARED".to_string(), "job".to_string()),
                ("IRIS_TASK_TOKEN".to_string(), "forged".to_string()),
                ("IRIS_WORKER_REGION".to_string(), "elsewhere".to_string()),
                ("IRIS_PYTHON".to_string(), "/bin/false".to_string()),
            ]
            .into(),
            setup_scripts: vec!["uv sync".into()],
            ..Default::default()
        });
        let mut w = worker();
        w.task_env = [
            ("SHARED".to_string(), "cluster".to_string()),
            ("ONLY_CLUSTER".to_string(), "c".to_string()),
            ("IRIS_ATTEMPT_UID".to_string(), "forged".to_string()),
        ]
        .into();
        let e = task_environment(&r, &w);
        assert_eq!(e["SHARED"], "job");
        assert_eq!(e["ONLY_CLUSTER"], "c");
        assert_eq!(e["IRIS_TASK_TOKEN"], "tok");
        assert_eq!(e["IRIS_ATTEMPT_UID"], "uid-1");
        assert_eq!(e["IRIS_WORKER_REGION"], "us-east");
        assert_eq!(e["IRIS_PYTHON"], "/usr/bin/python3");
        assert_eq!(e["IRIS_JOB_SETUP_SCRIPTS"], r#"["uv sync"]"#);
        let job_env: BTreeMap<String, String> =
            serde_json::from_str(&e["IRIS_JOB_ENV"]).expect("IRIS_JOB_ENV is JSON");
        assert_eq!(job_env["SHARED"], "job");
        assert!(
            !job_env.contains_key("ONLY_CLUSTER"),
            "cluster defaults are not the job's env"
        );
    }

    #[test]
    fn secrets_are_files_and_only_their_paths_are_in_the_environment() {
        let mut r = run();
        r.environment = Some(job::EnvironmentConfig {
            secrets: [
                ("HF_TOKEN".to_string(), "hf-value".to_string()),
                ("CW_KEY_ID".to_string(), "id".to_string()),
                ("CW_KEY_SECRET".to_string(), "key".to_string()),
            ]
            .into(),
            ..Default::default()
        });
        let mut w = worker();
        w.secrets_dir = Some("/dev/shm/s/uid-1".into());
        let e = task_environment(&r, &w);
        assert_eq!(e["RIGGING_SECRETS_DIR"], "/dev/shm/s/uid-1");
        assert_eq!(e["HF_TOKEN_PATH"], "/dev/shm/s/uid-1/HF_TOKEN");
        assert_eq!(
            e["AWS_SHARED_CREDENTIALS_FILE"],
            "/dev/shm/s/uid-1/.aws-credentials"
        );
        assert!(
            !e.values().any(|v| v.contains("hf-value") || v == "key"),
            "no secret value in the environment"
        );
        let files = secret_files(&r.environment.expect("env").secrets);
        assert_eq!(files["HF_TOKEN"], "hf-value");
        assert!(files[".aws-credentials"].contains("aws_secret_access_key = key"));
    }

    #[test]
    fn resources_and_inherited_constraints_as_proto_json_with_proto_names() {
        let mut r = run();
        r.resources = Some(job::ResourceSpecProto {
            cpu_millicores: 500,
            memory_bytes: 1 << 30,
            disk_bytes: 0,
            device: Some(job::DeviceConfig {
                device: Some(job::device_config::Device::Tpu(job::TpuDevice {
                    variant: "v5litepod-16".into(),
                    topology: String::new(),
                    count: 4,
                })),
            }),
        });
        let s = |v: &str| AttributeValue {
            value: Some(attribute_value::Value::StringValue(v.into())),
        };
        r.constraints = vec![
            Constraint {
                key: Some("region".into()),
                op: Some(job::ConstraintOp::Eq as i32),
                value: Some(s("us-east")),
                ..Default::default()
            },
            Constraint {
                key: Some("device-variant".into()),
                op: Some(job::ConstraintOp::Eq as i32),
                value: Some(s("v5litepod-16")),
                ..Default::default()
            },
        ];
        let e = task_environment(&r, &worker());
        let res: serde_json::Value =
            serde_json::from_str(&e["IRIS_TASK_RESOURCES"]).expect("resources JSON");
        assert_eq!(res["cpu_millicores"], 500);
        assert_eq!(
            res["memory_bytes"], "1073741824",
            "int64 is a string in proto JSON"
        );
        assert!(res.get("disk_bytes").is_none(), "zero fields are omitted");
        assert_eq!(res["device"]["tpu"]["variant"], "v5litepod-16");
        assert_eq!(e["JAX_PLATFORMS"], "tpu,cpu");
        assert_eq!(e["PJRT_DEVICE"], "TPU");
        let cons: serde_json::Value =
            serde_json::from_str(&e["IRIS_JOB_CONSTRAINTS"]).expect("constraints JSON");
        let cons = cons.as_array().expect("a list");
        assert_eq!(
            cons.len(),
            1,
            "only region and zone are inherited: {cons:?}"
        );
        assert_eq!(cons[0]["key"], "region");
        assert_eq!(cons[0]["value"]["string_value"], "us-east");
    }
}
