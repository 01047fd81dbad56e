//! Pod helpers: resource arithmetic, conditions, API-server defaulting and validation.

use serde_json::{json, Map, Value};

use crate::resources::ResourceDef;
use crate::status::ApiError;
use crate::store::now_rfc3339;

pub(crate) const GPU: &str = "nvidia.com/gpu";

/// An integer quantity (`"8"`, `8`, `"2k"`, `"1500m"` rounds up). Unparseable → 0.
pub(crate) fn quantity(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n
            .as_u64()
            .unwrap_or_else(|| n.as_f64().map(|f| f.max(0.0).ceil() as u64).unwrap_or(0)),
        Value::String(s) => {
            let s = s.trim();
            let (num, mult): (&str, f64) = if let Some(n) = s.strip_suffix('m') {
                (n, 0.001)
            } else if let Some(n) = s.strip_suffix('k') {
                (n, 1e3)
            } else if let Some(n) = s.strip_suffix("Ki") {
                (n, 1024.0)
            } else {
                (s, 1.0)
            };
            num.parse::<f64>()
                .map(|f| (f * mult).max(0.0).ceil() as u64)
                .unwrap_or(0)
        }
        _ => 0,
    }
}

fn container_gpus(c: &Value) -> u64 {
    let r = c.get("resources");
    r.and_then(|r| r.get("limits"))
        .and_then(|l| l.get(GPU))
        .or_else(|| r.and_then(|r| r.get("requests")).and_then(|l| l.get(GPU)))
        .map(quantity)
        .unwrap_or(0)
}

fn list<'a>(pod: &'a Value, field: &str) -> &'a [Value] {
    pod.get("spec")
        .and_then(|s| s.get(field))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

pub(crate) fn containers(pod: &Value) -> &[Value] {
    list(pod, "containers")
}

pub(crate) fn init_containers(pod: &Value) -> &[Value] {
    list(pod, "initContainers")
}

/// A native sidecar: an init container with `restartPolicy: Always`.
pub(crate) fn is_sidecar(c: &Value) -> bool {
    c.get("restartPolicy").and_then(Value::as_str) == Some("Always")
}

/// The pod's effective GPU request: max(sum of app containers and sidecars, largest init container).
pub(crate) fn gpus(pod: &Value) -> u64 {
    let sidecars: u64 = init_containers(pod)
        .iter()
        .filter(|c| is_sidecar(c))
        .map(container_gpus)
        .sum();
    let app: u64 = containers(pod).iter().map(container_gpus).sum::<u64>() + sidecars;
    let init = init_containers(pod)
        .iter()
        .filter(|c| !is_sidecar(c))
        .map(container_gpus)
        .max()
        .unwrap_or(0);
    app.max(init)
}

pub(crate) fn phase(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending")
}

pub(crate) fn is_terminal(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

pub(crate) fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some()
}

pub(crate) fn node_name(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

pub(crate) fn gates(pod: &Value) -> Vec<String> {
    list(pod, "schedulingGates")
        .iter()
        .filter_map(|g| g.get("name").and_then(Value::as_str).map(str::to_string))
        .collect()
}

pub(crate) fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
}

pub(crate) fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
}

pub(crate) fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
        })
}

pub(crate) fn condition_true(obj: &Value, kind: &str) -> bool {
    condition(obj, kind)
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
        == Some("True")
}

pub(crate) fn status_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let Value::Object(m) = obj else {
        unreachable!("made an object above")
    };
    let st = m.entry("status").or_insert_with(|| json!({}));
    if !st.is_object() {
        *st = json!({});
    }
    let Value::Object(st) = st else {
        unreachable!("made an object above")
    };
    st
}

/// Sets a `status.conditions` entry; `lastTransitionTime` moves only when `status` changes.
/// Pod conditions carry `lastProbeTime: null` as the API server renders them.
pub(crate) fn set_condition(
    obj: &mut Value,
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
    pod_style: bool,
) {
    let st = status_mut(obj);
    let conds = st.entry("conditions").or_insert_with(|| json!([]));
    if !conds.is_array() {
        *conds = json!([]);
    }
    let Value::Array(conds) = conds else {
        unreachable!("made an array above")
    };
    let mut c = json!({"type": kind, "status": status});
    if pod_style {
        c["lastProbeTime"] = Value::Null;
    }
    if !reason.is_empty() {
        c["reason"] = json!(reason);
    }
    if !message.is_empty() {
        c["message"] = json!(message);
    }
    match conds
        .iter_mut()
        .find(|x| x.get("type").and_then(Value::as_str) == Some(kind))
    {
        Some(existing) => {
            let same_status = existing.get("status").and_then(Value::as_str) == Some(status);
            c["lastTransitionTime"] = if same_status {
                existing
                    .get("lastTransitionTime")
                    .cloned()
                    .unwrap_or_else(|| json!(now_rfc3339()))
            } else {
                json!(now_rfc3339())
            };
            *existing = c;
        }
        None => {
            c["lastTransitionTime"] = json!(now_rfc3339());
            conds.push(c);
        }
    }
}

/// Sets a condition only when its status, reason or message differs (keeps writes idempotent).
pub(crate) fn ensure_condition(
    obj: &mut Value,
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
    pod_style: bool,
) {
    let same = condition(obj, kind).is_some_and(|c| {
        c.get("status").and_then(Value::as_str) == Some(status)
            && c.get("reason").and_then(Value::as_str).unwrap_or_default() == reason
            && c.get("message").and_then(Value::as_str).unwrap_or_default() == message
    });
    if !same {
        set_condition(obj, kind, status, reason, message, pod_style);
    }
}

fn default_pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        return "IfNotPresent";
    }
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn set_default(m: &mut Map<String, Value>, key: &str, v: Value) {
    m.entry(key.to_string()).or_insert(v);
}

/// The API server's defaulting for fields Iris or tests may read back.
pub(crate) fn apply_defaults(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "enableServiceLinks", json!(true));
    let sa = spec
        .get("serviceAccountName")
        .cloned()
        .unwrap_or(json!("default"));
    set_default(spec, "serviceAccountName", sa.clone());
    set_default(spec, "serviceAccount", sa);
    for field in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(field).and_then(Value::as_array_mut) {
            for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                let image = c
                    .get("image")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                set_default(c, "imagePullPolicy", json!(default_pull_policy(&image)));
                set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
                set_default(c, "terminationMessagePolicy", json!("File"));
                set_default(c, "resources", json!({}));
            }
        }
    }
}

/// `status.qosClass` from the containers' cpu/memory requests and limits.
pub(crate) fn qos_class(pod: &Value) -> &'static str {
    let all: Vec<&Value> = containers(pod)
        .iter()
        .chain(init_containers(pod).iter())
        .collect();
    let get = |c: &Value, kind: &str, res: &str| {
        c.pointer(&format!("/resources/{kind}/{}", res)).cloned()
    };
    let any = all.iter().any(|c| {
        ["cpu", "memory"]
            .iter()
            .any(|r| get(c, "requests", r).is_some() || get(c, "limits", r).is_some())
    });
    if !any {
        return "BestEffort";
    }
    let guaranteed = all.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| {
            let lim = get(c, "limits", r);
            lim.is_some() && get(c, "requests", r).is_none_or(|q| Some(q) == lim)
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

pub(crate) fn validate_create(def: &ResourceDef, name: &str, pod: &Value) -> Result<(), ApiError> {
    let cs = containers(pod);
    if cs.is_empty() {
        return Err(ApiError::invalid(
            def,
            name,
            "spec.containers",
            "Required value",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (field, list) in [("containers", cs), ("initContainers", init_containers(pod))] {
        for (i, c) in list.iter().enumerate() {
            let cname = c.get("name").and_then(Value::as_str).unwrap_or_default();
            if cname.is_empty() {
                return Err(ApiError::invalid(
                    def,
                    name,
                    &format!("spec.{field}[{i}].name"),
                    "Required value",
                ));
            }
            if !seen.insert(cname.to_string()) {
                return Err(ApiError::invalid(
                    def,
                    name,
                    &format!("spec.{field}[{i}].name"),
                    &format!("Duplicate value: \"{cname}\""),
                ));
            }
            if c.get("image")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty()
            {
                return Err(ApiError::invalid(
                    def,
                    name,
                    &format!("spec.{field}[{i}].image"),
                    "Required value",
                ));
            }
        }
    }
    match pod.pointer("/spec/restartPolicy").and_then(Value::as_str) {
        None | Some("Always" | "OnFailure" | "Never") => Ok(()),
        Some(other) => Err(ApiError::invalid(
            def,
            name,
            "spec.restartPolicy",
            &format!("Unsupported value: \"{other}\": supported values: \"Always\", \"OnFailure\", \"Never\""),
        )),
    }
}

const POD_UPDATE_FORBIDDEN: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// Pod spec updates are limited to images, the deadline, added tolerations and removed
/// scheduling gates (the API server's rule).
pub(crate) fn validate_update(
    def: &ResourceDef,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<(), ApiError> {
    let old_gates = gates(old);
    for g in gates(new) {
        if !old_gates.contains(&g) {
            return Err(ApiError::invalid(
                def,
                name,
                "spec.schedulingGates",
                &format!(
                    "Forbidden: only deletion is allowed, but found new scheduling gate '{g}'"
                ),
            ));
        }
    }
    let (Some(old_spec), Some(new_spec)) = (old.get("spec"), new.get("spec")) else {
        return Err(ApiError::invalid(def, name, "spec", "Required value"));
    };
    let mut normalized = new_spec.clone();
    if let Some(m) = normalized.as_object_mut() {
        for f in ["activeDeadlineSeconds", "tolerations", "schedulingGates"] {
            match old_spec.get(f) {
                Some(v) => m.insert(f.to_string(), v.clone()),
                None => m.remove(f),
            };
        }
        for field in ["containers", "initContainers"] {
            if let (Some(Value::Array(new_cs)), Some(Value::Array(old_cs))) =
                (m.get_mut(field), old_spec.get(field))
            {
                if new_cs.len() == old_cs.len() {
                    for (n, o) in new_cs.iter_mut().zip(old_cs) {
                        if let (Some(nm), Some(img)) = (n.as_object_mut(), o.get("image")) {
                            nm.insert("image".into(), img.clone());
                        }
                    }
                }
            }
        }
    }
    if &normalized != old_spec {
        return Err(ApiError::invalid(
            def,
            name,
            "spec",
            &format!("Forbidden: {POD_UPDATE_FORBIDDEN}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{def, id};

    fn pod() -> Value {
        json!({"metadata": {"name": "p"}, "spec": {
            "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
            "containers": [{"name": "task", "image": "img:1", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
            "initContainers": [{"name": "stage", "image": "img:1", "resources": {"limits": {"nvidia.com/gpu": 8}}},
                               {"name": "side", "image": "img:1", "restartPolicy": "Always"}]
        }})
    }

    #[test]
    fn gpu_arithmetic() {
        assert_eq!(gpus(&pod()), 8);
        assert_eq!(quantity(&json!("1500m")), 2);
        assert_eq!(quantity(&json!(3)), 3);
    }

    #[test]
    fn update_rules() {
        let d = def(id::PODS);
        let old = pod();
        let mut ungated = old.clone();
        ungated["spec"]["schedulingGates"] = json!([]);
        ungated["spec"]["containers"][0]["image"] = json!("img:2");
        assert!(validate_update(d, "p", &old, &ungated).is_ok());
        let err = validate_update(d, "p", &ungated, &old).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(
            err.message.contains("only deletion is allowed"),
            "{}",
            err.message
        );
        let mut changed = old.clone();
        changed["spec"]["containers"][0]["command"] = json!(["true"]);
        assert!(validate_update(d, "p", &old, &changed)
            .unwrap_err()
            .message
            .contains("pod updates may not change"));
    }

    #[test]
    fn conditions_keep_transition_time() {
        let mut p = pod();
        set_condition(&mut p, "Ready", "False", "X", "", true);
        let t = condition(&p, "Ready").unwrap()["lastTransitionTime"].clone();
        ensure_condition(&mut p, "Ready", "False", "Y", "m", true);
        assert_eq!(condition(&p, "Ready").unwrap()["lastTransitionTime"], t);
        assert_eq!(condition(&p, "Ready").unwrap()["reason"], "Y");
        assert!(!condition_true(&p, "Ready"));
    }

    #[test]
    fn defaults_and_qos() {
        let mut p = json!({"spec": {"containers": [{"name": "a", "image": "busybox"}]}});
        apply_defaults(&mut p);
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(p["spec"]["restartPolicy"], "Always");
        assert_eq!(qos_class(&p), "BestEffort");
        let g = json!({"spec": {"containers": [{"name": "a", "image": "x", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}});
        assert_eq!(qos_class(&g), "Guaranteed");
    }
}
