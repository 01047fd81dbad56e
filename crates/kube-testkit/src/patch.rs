//! Patch semantics: JSON merge patch (RFC 7386), an approximation of strategic merge patch
//! (keyed list merging with the merge keys Kubernetes declares for the fields Iris touches, plus
//! the `$patch`, `$deleteFromPrimitiveList` and `$setElementOrder` directives), which is also used
//! for server-side apply, and JSON patch (RFC 6902).

use serde_json::{Map, Value};

/// RFC 7386: objects merge recursively, `null` deletes, anything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The merge key of a list field, by field name, as declared by the Kubernetes types
/// (`patchMergeKey` / `listMapKeys`) for the lists Iris and Kueue objects use.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "containerStatuses"
        | "initContainerStatuses"
        | "ephemeralContainerStatuses"
        | "schedulingGates"
        | "imagePullSecrets"
        | "podSets"
        | "podSetAssignments"
        | "resources"
        | "flavors" => "name",
        "ports" => "containerPort",
        "levels" => "nodeLabel",
        "volumeMounts" => "mountPath",
        "conditions" | "addresses" => "type",
        "ownerReferences" => "uid",
        "podIPs" | "hostIPs" => "ip",
        _ => return None,
    })
}

/// Primitive lists that strategic merge treats as sets.
fn is_set_list(field: &str) -> bool {
    matches!(field, "finalizers")
}

/// Strategic merge patch over JSON values. Directives are consumed and never stored.
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut clean = p.clone();
        clean.remove("$patch");
        *target = strip_directives(&Value::Object(clean));
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" || k == "$patch" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(del)) = (t.get_mut(field), v) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), v) {
            (Some(Value::Array(existing)), Value::Array(items)) => {
                if let Some(key) = merge_key(k) {
                    merge_keyed_list(existing, items, key);
                } else if is_set_list(k) {
                    for item in items {
                        if !existing.contains(item) {
                            existing.push(item.clone());
                        }
                    }
                } else {
                    *existing = items.iter().map(strip_directives).collect();
                }
            }
            (Some(existing @ Value::Object(_)), Value::Object(_)) => strategic_merge(existing, v),
            _ => {
                t.insert(k.clone(), strip_directives(v));
            }
        }
    }
}

fn merge_keyed_list(existing: &mut Vec<Value>, items: &[Value], key: &str) {
    for item in items {
        let Some(id) = item.get(key).cloned() else {
            existing.push(strip_directives(item));
            continue;
        };
        let pos = existing.iter().position(|e| e.get(key) == Some(&id));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                existing.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut existing[i], item),
            (None, false) => existing.push(strip_directives(item)),
        }
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|x| x.get("$patch").and_then(Value::as_str) != Some("delete"))
                .map(strip_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn split_pointer(path: &str) -> Result<(String, String), String> {
    if path.is_empty() {
        return Err("the root cannot be the target of this operation".into());
    }
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    Ok((parent.to_string(), unescape(last)))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    let target = doc
        .pointer_mut(&parent)
        .ok_or_else(|| format!("doc is missing path: {parent:?}"))?;
    match target {
        Value::Object(m) => {
            m.insert(last, value);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(value);
                return Ok(());
            }
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid array index {last:?}"))?;
            if i > a.len() {
                return Err(format!("array index {i} out of bounds"));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err(format!("doc is missing path: {path:?}")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    let target = doc
        .pointer_mut(&parent)
        .ok_or_else(|| format!("doc is missing path: {path:?}"))?;
    match target {
        Value::Object(m) => m
            .remove(&last)
            .ok_or_else(|| format!("doc is missing path: {path:?}")),
        Value::Array(a) => {
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid array index {last:?}"))?;
            if i >= a.len() {
                return Err(format!("array index {i} out of bounds"));
            }
            Ok(a.remove(i))
        }
        _ => Err(format!("doc is missing path: {path:?}")),
    }
}

/// RFC 6902 JSON patch (`add`, `remove`, `replace`, `move`, `copy`, `test`).
pub(crate) fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    for op in ops {
        let kind = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or("a JSON patch operation needs \"op\"")?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or("a JSON patch operation needs \"path\"")?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| format!("{kind} operation needs \"value\""))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{kind} operation needs \"from\""))
        };
        match kind {
            "add" => add(doc, path, value()?)?,
            "remove" => {
                remove(doc, path)?;
            }
            "replace" => {
                if doc.pointer(path).is_none() {
                    return Err(format!(
                        "replace operation does not apply: doc is missing key: {path}"
                    ));
                }
                let v = value()?;
                if let Some(slot) = doc.pointer_mut(path) {
                    *slot = v;
                }
            }
            "move" => {
                let v = remove(doc, from()?)?;
                add(doc, path, v)?;
            }
            "copy" => {
                let v = doc
                    .pointer(from()?)
                    .cloned()
                    .ok_or("copy operation does not apply: missing from")?;
                add(doc, path, v)?;
            }
            "test" => {
                if doc.pointer(path) != Some(&value()?) {
                    return Err(format!("testing value {path} failed"));
                }
            }
            other => {
                return Err(format!(
                    "unexpected kind of JSON patch operation: {other:?}"
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn strategic_merges_conditions_by_type_and_finalizers_as_set() {
        let mut doc = json!({
            "metadata": {"finalizers": ["a"]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "False"}]}
        });
        strategic_merge(
            &mut doc,
            &json!({
                "metadata": {"finalizers": ["b"]},
                "status": {"conditions": [{"type": "X", "status": "True"}, {"type": "Y", "status": "True"}],
                           "$setElementOrder/conditions": [{"type": "Ready"}]}
            }),
        );
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            doc["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "X", "status": "True"}, {"type": "Y", "status": "True"}])
        );
        strategic_merge(
            &mut doc,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
                    "status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}}),
        );
        assert_eq!(doc["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(
            doc["status"]["conditions"].as_array().map(Vec::len),
            Some(2)
        );
    }

    #[test]
    fn json_patch_ops() {
        let mut doc = json!({"metadata": {"finalizers": ["a", "b"]}, "x": 1});
        json_patch(
            &mut doc,
            &json!([
                {"op": "test", "path": "/x", "value": 1},
                {"op": "remove", "path": "/metadata/finalizers/0"},
                {"op": "add", "path": "/metadata/labels", "value": {"k": "v"}},
                {"op": "add", "path": "/metadata/labels/a~1b", "value": "w"},
                {"op": "replace", "path": "/x", "value": 2},
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"finalizers": ["b"], "labels": {"k": "v", "a/b": "w"}}, "x": 2})
        );
        assert!(json_patch(&mut doc, &json!([{"op": "test", "path": "/x", "value": 1}])).is_err());
        assert!(json_patch(
            &mut doc,
            &json!([{"op": "replace", "path": "/nope", "value": 1}])
        )
        .is_err());
    }
}
