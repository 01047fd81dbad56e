//! The task container's command and environment: the `bash -lc` script around the setup steps
//! and the command, and the layered environment variables (cluster, job, pod layout and
//! identity, the controller's system variables, then the downward API).

use super::input::{PodInput, ProviderConfig};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};
use std::collections::BTreeMap;

/// Quotes `s` for a POSIX shell (single quotes unless it is plainly safe).
fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r#"'"'"'"#))
    }
}

/// The `bash -lc` script: strict mode, no core dumps, the setup steps, the venv if one exists,
/// then `exec` of the command.
///
/// Each setup step runs in its own `bash` after a banner (`[iris setup] step i/n`), so a
/// failure names its step and `set -e` stops there. A step that runs `uv sync` is skipped, with
/// a line saying so, when the staged working directory has no `pyproject.toml` — the rule a
/// worker daemon applies ([`iris_backend::task_env::runs_uv_sync`]).
pub fn task_script(input: &PodInput) -> String {
    let mut lines = vec![
        "set -e".to_string(),
        "ulimit -c 0".to_string(),
        "mkdir -p /app".to_string(),
        "cd /app".to_string(),
    ];
    let total = input.setup_commands.len();
    for (i, script) in input.setup_commands.iter().enumerate() {
        let banner = format!("[iris setup] step {}/{total}", i + 1);
        let run = format!("echo '{banner}'; bash -c {}", shell_quote(script));
        if iris_backend::task_env::runs_uv_sync(script) {
            lines.push(format!(
                "if [ -f pyproject.toml ]; then {run}; else echo '{banner} skipped: no pyproject.toml to sync'; fi"
            ));
        } else {
            lines.push(run);
        }
    }
    lines.push(
        r#"if [ -f "$IRIS_VENV/bin/activate" ]; then . "$IRIS_VENV/bin/activate"; fi"#.to_string(),
    );
    if !input.argv.is_empty() {
        let argv: Vec<String> = input.argv.iter().map(|a| shell_quote(a)).collect();
        lines.push(format!("exec {}", argv.join(" ")));
    }
    lines.join("\n")
}

/// Variables fixed by the pod layout (mount points) and the attempt's identity.
fn layout_env(input: &PodInput, config: &ProviderConfig) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = [
        ("IRIS_WORKDIR", "/app"),
        ("IRIS_OUTPUT_DIR", "/iris/outputs"),
        ("IRIS_VENV", "/app/.venv"),
        ("UV_PROJECT_ENVIRONMENT", "/app/.venv"),
        ("UV_CACHE_DIR", "/uv/cache"),
        // The node may clean the shared cache while tasks run: venvs own copies.
        ("UV_LINK_MODE", "copy"),
        ("UV_PYTHON_INSTALL_DIR", "/uv/cache/python"),
        ("HF_HUB_CACHE", "/hf/cache"),
        ("CARGO_HOME", "/cargo"),
        ("CARGO_TARGET_DIR", "/cargo/target"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.insert(
        "IRIS_TASK_ID".into(),
        format!("{}:{}", input.task_id, input.attempt_id),
    );
    env.insert("IRIS_ATTEMPT_UID".into(), input.attempt_uid.clone());
    env.insert("IRIS_NUM_TASKS".into(), input.num_tasks.to_string());
    env.insert("IRIS_JOB_ID".into(), input.job_id.clone());
    if let Some(addr) = &config.controller_address {
        env.insert("IRIS_CONTROLLER_ADDRESS".into(), addr.clone());
        env.insert("IRIS_CONTROLLER_URL".into(), addr.clone());
    }
    env
}

/// Variables filled in by the kubelet through the downward API.
const DOWNWARD_ENV: [(&str, &str); 2] = [
    ("IRIS_ADVERTISE_HOST", "status.podIP"),
    ("IRIS_NODE_NAME", "spec.nodeName"),
];

/// The task container's environment: cluster `task_env` < job env < pod-layout and identity
/// variables < the controller's `system_env`, then where the job's secret files are (with
/// secrets), sorted by name, then `IRIS_ADVERTISE_HOST` (pod IP) and `IRIS_NODE_NAME` (node)
/// from the downward API, which nothing can override.
pub fn pod_env(input: &PodInput, config: &ProviderConfig) -> Vec<EnvVar> {
    let mut merged = config.task_env.clone();
    merged.extend(input.env.clone());
    merged.extend(layout_env(input, config));
    merged.extend(input.system_env.clone());
    if !input.secrets.is_empty() {
        iris_backend::task_env::secret_environment(
            input.secrets.keys(),
            super::SECRETS_MOUNT_PATH,
            &mut merged,
        );
    }
    for (name, _) in DOWNWARD_ENV {
        merged.remove(name);
    }
    let mut env: Vec<EnvVar> = merged
        .into_iter()
        .map(|(name, value)| EnvVar {
            name,
            value: Some(value),
            ..Default::default()
        })
        .collect();
    env.extend(DOWNWARD_ENV.into_iter().map(|(name, path)| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }));
    env
}
