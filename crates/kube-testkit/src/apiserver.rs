//! The API server's verbs over the store: create, get, list, update, patch, delete, evict, with
//! the admission the real server (and Kueue's pod webhook) applies. No I/O: the HTTP layer parses
//! requests into these calls and renders what they return.

use base64::Engine;
use serde_json::{json, Value};

use crate::cluster::Cluster;
use crate::pod;
use crate::resources::{self, def, id, Special};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{meta_str, metadata_mut, name_of, uid_of};
use crate::{kueue, patch, pdb};

/// What a request addresses.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub res: usize,
    pub version: &'static str,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

impl Target {
    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    fn status_sub(&self) -> bool {
        self.sub.as_deref() == Some("status")
    }
}

/// An object as served at `version` (storage is shared across versions).
pub(crate) fn render(res: usize, version: &str, obj: &Value) -> Value {
    let mut out = obj.clone();
    if let Value::Object(m) = &mut out {
        m.insert("apiVersion".into(), json!(def(res).api_version(version)));
        m.insert("kind".into(), json!(def(res).kind));
    }
    out
}

fn canonical_api_version(res: usize) -> String {
    def(res).api_version(def(res).versions[0])
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn check_type(res: usize, body: &Value) -> Result<(), ApiError> {
    let d = def(res);
    if let Some(av) = body.get("apiVersion").and_then(Value::as_str) {
        if !d.versions.iter().any(|v| d.api_version(v) == av) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                canonical_api_version(res)
            )));
        }
    }
    if let Some(kind) = body.get("kind").and_then(Value::as_str) {
        if kind != d.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                d.kind
            )));
        }
    }
    Ok(())
}

fn check_namespace(t: &Target, body: &Value) -> Result<(), ApiError> {
    let body_ns = meta_str(body, "namespace");
    if def(t.res).namespaced && !body_ns.is_empty() && body_ns != t.ns() {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

pub(crate) fn get(cl: &Cluster, t: &Target) -> Result<Value, ApiError> {
    cl.store
        .get(t.res, t.ns(), t.name())
        .cloned()
        .ok_or_else(|| ApiError::not_found(def(t.res), t.name()))
}

fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = (0..5)
        .map(|_| ALPHABET[rand::random::<usize>() % ALPHABET.len()] as char)
        .collect();
    format!("{prefix}{suffix}")
}

fn ensure_namespace(cl: &mut Cluster, ns: &str) -> Result<(), ApiError> {
    match cl.store.get(id::NAMESPACES, "", ns) {
        Some(n) if pod::is_deleting(n) => Err(ApiError::forbidden(format!(
            "unable to create new content in namespace {ns} because it is being terminated"
        ))),
        Some(_) => Ok(()),
        None if cl.settings.auto_create_namespaces => {
            cl.store.insert(
                id::NAMESPACES,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                       "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
            );
            Ok(())
        }
        None => Err(ApiError::not_found(def(id::NAMESPACES), ns)),
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Object names are RFC 1123 subdomains (namespaces: labels), as the API server validates them.
fn validate_name(res: usize, name: &str) -> Result<(), ApiError> {
    let d = def(res);
    if d.special == Special::Namespace {
        if !is_dns_label(name) {
            return Err(ApiError::invalid(d, name, "metadata.name", &format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            )));
        }
    } else if !is_dns_subdomain(name) {
        return Err(ApiError::invalid(d, name, "metadata.name", &format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )));
    }
    Ok(())
}

fn is_label_name(s: &str) -> bool {
    let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(ok)
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// Label keys (`[prefix/]name`) and values, with the API server's rules and messages.
fn validate_labels(res: usize, name: &str, obj: &Value) -> Result<(), ApiError> {
    let d = def(res);
    let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) else {
        return Ok(());
    };
    for (k, v) in labels {
        let (prefix, key_name) = match k.split_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, k.as_str()),
        };
        if !is_label_name(key_name) || prefix.is_some_and(|p| !is_dns_subdomain(p)) {
            return Err(ApiError::invalid(d, name, "metadata.labels", &format!(
                "Invalid value: \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
            )));
        }
        let Some(v) = v.as_str() else {
            return Err(ApiError::bad_request(format!("label {k} must be a string")));
        };
        if v.len() > 63 {
            return Err(ApiError::invalid(
                d,
                name,
                "metadata.labels",
                &format!("Invalid value: \"{v}\": must be no more than 63 characters"),
            ));
        }
        if !v.is_empty() && !is_label_name(v) {
            return Err(ApiError::invalid(d, name, "metadata.labels", &format!(
                "Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
            )));
        }
    }
    Ok(())
}

fn strip_server_fields(obj: &mut Value) {
    let meta = metadata_mut(obj);
    for f in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "managedFields",
        "selfLink",
    ] {
        meta.remove(f);
    }
}

/// POST: admission (defaults, priority, Kueue's webhook), then store.
pub(crate) fn create(
    cl: &mut Cluster,
    t: &Target,
    mut body: Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let d = def(t.res);
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    check_type(t.res, &body)?;
    check_namespace(t, &body)?;
    strip_server_fields(&mut body);
    let mut name = meta_str(&body, "name").to_string();
    if name.is_empty() {
        let prefix = meta_str(&body, "generateName").to_string();
        if prefix.is_empty() {
            return Err(ApiError::invalid(
                d,
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            ));
        }
        loop {
            name = generate_name(&prefix);
            if cl.store.get(t.res, t.ns(), &name).is_none() {
                break;
            }
        }
    }
    if let Some(url_name) = &t.name {
        if *url_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({name}) does not match the name on the URL ({url_name})"
            )));
        }
    }
    validate_name(t.res, &name)?;
    validate_labels(t.res, &name, &body)?;
    if cl.store.get(t.res, t.ns(), &name).is_some() {
        return Err(ApiError::already_exists(d, &name));
    }
    {
        let meta = metadata_mut(&mut body);
        meta.insert("name".into(), json!(name));
        if d.namespaced {
            meta.insert("namespace".into(), json!(t.ns()));
        }
    }
    body["apiVersion"] = json!(canonical_api_version(t.res));
    body["kind"] = json!(d.kind);
    if d.namespaced && !dry_run {
        ensure_namespace(cl, t.ns())?;
    }
    match d.special {
        Special::Pod => admit_pod(cl, &name, &mut body)?,
        Special::Namespace => {
            body["status"] = json!({"phase": "Active"});
            if body.pointer("/spec/finalizers").is_none() {
                body["spec"] = json!({"finalizers": ["kubernetes"]});
            }
        }
        Special::PriorityClass => {
            if !body.get("value").is_some_and(Value::is_i64) {
                return Err(ApiError::invalid(d, &name, "value", "Required value"));
            }
            if body.get("preemptionPolicy").is_none() {
                body["preemptionPolicy"] = json!("PreemptLowerPriority");
            }
        }
        Special::WorkloadPriorityClass => {
            if !body.get("value").is_some_and(Value::is_i64) {
                return Err(ApiError::invalid(d, &name, "value", "Required value"));
            }
        }
        Special::Node
        | Special::Plain
        | Special::PodDisruptionBudget
        | Special::Workload
        | Special::LocalQueue => {
            if d.has_status() && d.special != Special::Node {
                if let Value::Object(m) = &mut body {
                    m.remove("status");
                }
            }
        }
    }
    if dry_run {
        return Ok(body);
    }
    Ok(cl.store.insert(t.res, body))
}

/// The API server's pod admission: validation, defaulting, priority resolution and Kueue's
/// mutating webhook; the status starts over at `Pending`.
fn admit_pod(cl: &Cluster, name: &str, pod: &mut Value) -> Result<(), ApiError> {
    let d = def(id::PODS);
    pod::validate_create(d, name, pod)?;
    pod::apply_defaults(pod);
    let class = pod
        .pointer("/spec/priorityClassName")
        .and_then(Value::as_str)
        .map(str::to_string);
    let (priority, policy) = match class {
        Some(c) if !c.is_empty() => {
            let pc = cl.store.get(id::PRIORITY_CLASSES, "", &c).ok_or_else(|| {
                ApiError::forbidden_object(
                    d,
                    name,
                    &format!("no PriorityClass with name {c} was found"),
                )
            })?;
            (
                pc.get("value").and_then(Value::as_i64).unwrap_or(0),
                pc.get("preemptionPolicy").cloned(),
            )
        }
        _ => {
            let global = cl
                .store
                .list(id::PRIORITY_CLASSES, None)
                .find(|pc| pc.get("globalDefault").and_then(Value::as_bool) == Some(true));
            match global {
                Some(pc) => {
                    pod["spec"]["priorityClassName"] = json!(name_of(pc));
                    (
                        pc.get("value").and_then(Value::as_i64).unwrap_or(0),
                        pc.get("preemptionPolicy").cloned(),
                    )
                }
                None => (0, None),
            }
        }
    };
    pod["spec"]["priority"] = json!(priority);
    pod["spec"]["preemptionPolicy"] = policy.unwrap_or(json!("PreemptLowerPriority"));
    kueue::pod_webhook(&cl.settings, d, name, pod)?;
    pod["status"] = json!({"phase": "Pending", "qosClass": pod::qos_class(pod)});
    Ok(())
}

/// Writes `new` over `old`: optimistic concurrency, status-subresource split, per-kind
/// validation, and removal once a deleting object's last finalizer is gone.
fn commit_write(
    cl: &mut Cluster,
    res: usize,
    old: &Value,
    mut new: Value,
    status_sub: bool,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let d = def(res);
    let name = name_of(old).to_string();
    let ns = meta_str(old, "namespace").to_string();
    if !new.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    let want_rv = meta_str(&new, "resourceVersion");
    if !want_rv.is_empty() && want_rv != meta_str(old, "resourceVersion") {
        return Err(ApiError::stale(d, &name));
    }
    check_type(res, &new)?;
    new["apiVersion"] = old
        .get("apiVersion")
        .cloned()
        .unwrap_or_else(|| json!(canonical_api_version(res)));
    new["kind"] = json!(d.kind);
    {
        let meta = metadata_mut(&mut new);
        meta.remove("managedFields");
        meta.insert("name".into(), json!(name));
        if d.namespaced {
            meta.insert("namespace".into(), json!(ns));
        }
    }
    if d.has_status() {
        if status_sub {
            let st = new.get("status").cloned();
            new = old.clone();
            if let Value::Object(m) = &mut new {
                match st {
                    Some(s) => m.insert("status".into(), s),
                    None => m.remove("status"),
                };
            }
        } else if let Value::Object(m) = &mut new {
            match old.get("status") {
                Some(s) => m.insert("status".into(), s.clone()),
                None => m.remove("status"),
            };
        }
    }
    validate_labels(res, &name, &new)?;
    match d.special {
        Special::Pod if !status_sub => pod::validate_update(d, &name, old, &new)?,
        Special::PriorityClass | Special::WorkloadPriorityClass => {
            for f in ["value", "preemptionPolicy"] {
                if new.get(f).is_some() && new.get(f) != old.get(f) {
                    return Err(ApiError::invalid(
                        d,
                        &name,
                        f,
                        "Forbidden: may not be changed in an update.",
                    ));
                }
                if let (None, Some(v)) = (new.get(f), old.get(f)) {
                    new[f] = v.clone();
                }
            }
        }
        _ => {}
    }
    if dry_run {
        return Ok(new);
    }
    // A deleting object whose last finalizer went away is removed (pods: once the kubelet let go,
    // which the simulation decides).
    if pod::is_deleting(old) && finalizers(&new).is_empty() && d.special != Special::Pod {
        cl.store.update(res, new);
        return cl
            .store
            .remove(res, &ns, &name)
            .ok_or_else(|| ApiError::internal("object vanished during update"));
    }
    cl.store
        .update(res, new)
        .ok_or_else(|| ApiError::not_found(d, &name))
}

/// PUT on an object or its `status`.
pub(crate) fn update(
    cl: &mut Cluster,
    t: &Target,
    body: Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    check_namespace(t, &body)?;
    let body_name = meta_str(&body, "name");
    if !body_name.is_empty() && body_name != t.name() {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({})",
            t.name()
        )));
    }
    let old = get(cl, t)?;
    commit_write(cl, t.res, &old, body, t.status_sub(), dry_run)
}

/// Patch parameters from the query string. Server-side apply ignores `force`: field ownership
/// conflicts are not detected (an apply always wins, as with `force=true`).
#[derive(Debug, Default, Clone)]
pub(crate) struct PatchParams {
    pub field_manager: Option<String>,
    pub dry_run: bool,
}

/// PATCH: merge, strategic-merge, JSON patch or server-side apply (which creates a missing
/// object). Returns the object and whether it was created.
pub(crate) fn patch(
    cl: &mut Cluster,
    t: &Target,
    content_type: &str,
    body: &[u8],
    params: &PatchParams,
) -> Result<(Value, bool), ApiError> {
    let ct = content_type.split(';').next().unwrap_or_default().trim();
    let parse_json = || {
        serde_json::from_slice::<Value>(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
    };
    match ct {
        "application/apply-patch+yaml" => {
            if params
                .field_manager
                .as_deref()
                .unwrap_or_default()
                .is_empty()
            {
                return Err(ApiError::bad_request(
                    "PATCH, fieldManager is required for apply requests",
                ));
            }
            let applied: Value = serde_yaml::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
            if applied.get("apiVersion").is_none() || applied.get("kind").is_none() {
                return Err(ApiError::bad_request(
                    "apiVersion and kind must be set in an apply request",
                ));
            }
            match cl.store.get(t.res, t.ns(), t.name()).cloned() {
                None if t.status_sub() => Err(ApiError::not_found(def(t.res), t.name())),
                None => create(cl, t, applied, params.dry_run).map(|o| (o, true)),
                Some(old) => {
                    let mut merged = old.clone();
                    let mut applied = applied;
                    strip_server_fields_keep_rv(&mut applied);
                    patch::strategic_merge(&mut merged, &applied);
                    commit_write(cl, t.res, &old, merged, t.status_sub(), params.dry_run)
                        .map(|o| (o, false))
                }
            }
        }
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/json-patch+json" => {
            let p = parse_json()?;
            let old = get(cl, t)?;
            let mut merged = old.clone();
            match ct {
                "application/merge-patch+json" => patch::merge_patch(&mut merged, &p),
                "application/strategic-merge-patch+json" => patch::strategic_merge(&mut merged, &p),
                _ => patch::json_patch(&mut merged, &p)
                    .map_err(|e| ApiError::internal(e).with_code(422, "Invalid"))?,
            }
            commit_write(cl, t.res, &old, merged, t.status_sub(), params.dry_run)
                .map(|o| (o, false))
        }
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

fn strip_server_fields_keep_rv(obj: &mut Value) {
    let meta = metadata_mut(obj);
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "managedFields",
    ] {
        meta.remove(f);
    }
}

impl ApiError {
    fn with_code(mut self, code: u16, reason: &'static str) -> Self {
        self.code = code;
        self.reason = reason;
        self
    }
}

/// Options of a delete (query string or `DeleteOptions` body).
#[derive(Debug, Default, Clone)]
pub(crate) struct DeleteOpts {
    pub grace: Option<i64>,
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

impl DeleteOpts {
    /// Reads a `DeleteOptions` body over the query-string values.
    pub(crate) fn merge_body(&mut self, body: &Value) {
        if let Some(g) = body.get("gracePeriodSeconds").and_then(Value::as_i64) {
            self.grace = Some(g);
        }
        if let Some(p) = body.get("propagationPolicy").and_then(Value::as_str) {
            self.propagation = Some(p.to_string());
        }
        if let Some(u) = body.pointer("/preconditions/uid").and_then(Value::as_str) {
            self.precondition_uid = Some(u.to_string());
        }
        if let Some(r) = body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
        {
            self.precondition_rv = Some(r.to_string());
        }
        if body
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            self.dry_run = true;
        }
    }
}

/// How a delete ended.
#[derive(Debug)]
pub(crate) enum Deleted {
    /// Removed; the final state of the object.
    Gone(Value),
    /// Still present with `deletionTimestamp` (graceful termination or finalizers pending).
    Pending(Value),
}

pub(crate) fn delete(
    cl: &mut Cluster,
    res: usize,
    ns: &str,
    name: &str,
    opts: &DeleteOpts,
) -> Result<Deleted, ApiError> {
    let d = def(res);
    let obj = cl
        .store
        .get(res, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(d, name))?;
    if let Some(uid) = &opts.precondition_uid {
        if uid != uid_of(&obj) {
            return Err(ApiError::conflict(
                d,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    uid_of(&obj)
                ),
            ));
        }
    }
    if let Some(rv) = &opts.precondition_rv {
        if rv != meta_str(&obj, "resourceVersion") {
            return Err(ApiError::conflict(
                d,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&obj, "resourceVersion")
                ),
            ));
        }
    }
    let has_finalizers = !finalizers(&obj).is_empty();
    if opts.dry_run {
        return Ok(
            if has_finalizers || (d.special == Special::Pod && !pod::node_name(&obj).is_empty()) {
                Deleted::Pending(obj)
            } else {
                Deleted::Gone(obj)
            },
        );
    }
    if opts.propagation.as_deref() == Some("Orphan") {
        orphan_dependents(cl, uid_of(&obj));
    }
    match d.special {
        Special::Namespace => {
            for r in resources::RESOURCES
                .iter()
                .enumerate()
                .filter(|(_, r)| r.namespaced)
                .map(|(i, _)| i)
            {
                let names: Vec<String> = cl
                    .store
                    .list(r, Some(name))
                    .map(|o| name_of(o).to_string())
                    .collect();
                for n in names {
                    cl.store.remove(r, name, &n);
                }
            }
            cl.store
                .remove(res, ns, name)
                .map(Deleted::Gone)
                .ok_or_else(|| ApiError::not_found(d, name))
        }
        Special::Pod => {
            let grace = opts
                .grace
                .or_else(|| {
                    obj.pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30)
                .max(0);
            let bound = !pod::node_name(&obj).is_empty();
            let force = grace == 0 && !has_finalizers;
            if pod::is_deleting(&obj) && !force {
                return Ok(Deleted::Pending(obj));
            }
            if bound && grace > 0 {
                return cl
                    .store
                    .mark_deleting(res, ns, name, grace)
                    .map(Deleted::Pending)
                    .ok_or_else(|| ApiError::not_found(d, name));
            }
            if has_finalizers {
                return cl
                    .store
                    .mark_deleting(res, ns, name, 0)
                    .map(Deleted::Pending)
                    .ok_or_else(|| ApiError::not_found(d, name));
            }
            cl.store
                .remove(res, ns, name)
                .map(Deleted::Gone)
                .ok_or_else(|| ApiError::not_found(d, name))
        }
        _ if has_finalizers => cl
            .store
            .mark_deleting(res, ns, name, 0)
            .map(Deleted::Pending)
            .ok_or_else(|| ApiError::not_found(d, name)),
        _ => cl
            .store
            .remove(res, ns, name)
            .map(Deleted::Gone)
            .ok_or_else(|| ApiError::not_found(d, name)),
    }
}

fn orphan_dependents(cl: &mut Cluster, owner_uid: &str) {
    let dependents: Vec<(usize, Value)> = cl
        .store
        .iter_all()
        .filter(|(_, o)| {
            o.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| {
                    refs.iter()
                        .any(|r| r.get("uid").and_then(Value::as_str) == Some(owner_uid))
                })
        })
        .map(|(res, o)| (res, o.clone()))
        .collect();
    for (res, mut obj) in dependents {
        let Some(refs) = obj
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
        else {
            continue;
        };
        if !refs
            .iter()
            .any(|r| r.get("uid").and_then(Value::as_str) == Some(owner_uid))
        {
            continue;
        }
        let kept: Vec<Value> = refs
            .iter()
            .filter(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid))
            .cloned()
            .collect();
        metadata_mut(&mut obj).insert("ownerReferences".into(), json!(kept));
        cl.store.update(res, obj);
    }
}

/// Selectors and paging of a list.
#[derive(Debug, Default)]
pub(crate) struct ListParams {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

fn encode_continue(ns: &str, name: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json!([ns, name]).to_string())
}

fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    let bad = || {
        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: (String, String) = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    Ok(v)
}

/// Matching objects of a list, in (namespace, name) order, with the next page's token.
pub(crate) fn list(
    cl: &Cluster,
    t: &Target,
    p: &ListParams,
) -> Result<(Vec<Value>, Option<String>, usize), ApiError> {
    let after = p
        .continue_token
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(decode_continue)
        .transpose()?;
    let ns = t.namespace.as_deref();
    let mut items: Vec<Value> = Vec::new();
    let mut remaining = 0usize;
    for obj in cl.store.list_after(t.res, ns, after) {
        if !p.labels.matches_object(obj) || !p.fields.matches(obj) {
            continue;
        }
        if p.limit.is_some_and(|l| l > 0 && items.len() >= l) {
            remaining += 1;
            continue;
        }
        items.push(obj.clone());
    }
    let token = if remaining > 0 {
        items
            .last()
            .map(|o| encode_continue(meta_str(o, "namespace"), name_of(o)))
    } else {
        None
    };
    Ok((items, token, remaining))
}

/// `POST pods/{name}/eviction`: refused with 429 while a PodDisruptionBudget allows no
/// disruption of a healthy pod; otherwise `DisruptionTarget=True` (EvictionByEvictionAPI) and a
/// graceful delete.
pub(crate) fn evict(
    cl: &mut Cluster,
    ns: &str,
    name: &str,
    opts: &DeleteOpts,
) -> Result<(), ApiError> {
    let d = def(id::PODS);
    let pod = cl
        .store
        .get(id::PODS, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(d, name))?;
    if !pod::is_terminal(&pod) && !pod::is_deleting(&pod) {
        let budgets = pdb::covering(cl, &pod);
        if budgets.len() > 1 {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        if let Some(b) = budgets.first() {
            let healthy = pdb::is_healthy(&pod);
            if healthy && b.disruptions_allowed <= 0 {
                return Err(ApiError::too_many_requests(
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    json!({"reason": "DisruptionBudget", "message": format!(
                        "The disruption budget {} needs {} healthy pods and has {} currently",
                        b.name, b.desired_healthy, b.current_healthy)}),
                ));
            }
        }
        if !opts.dry_run {
            let mut p = pod.clone();
            pod::set_condition(
                &mut p,
                "DisruptionTarget",
                "True",
                "EvictionByEvictionAPI",
                "Eviction API: evicting",
                true,
            );
            cl.store.update(id::PODS, p);
        }
    }
    delete(cl, id::PODS, ns, name, opts).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels() {
        assert!(validate_name(id::PODS, "iris-user-job-0-1a2b3c4d-0").is_ok());
        assert!(validate_name(id::PODS, "Upper").is_err());
        assert!(validate_name(id::NAMESPACES, "a.b").is_err());
        let ok = json!({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "iris-lq", "iris.task_id": "user.job.0", "e": ""}}});
        assert!(validate_labels(id::PODS, "p", &ok).is_ok());
        let long = json!({"metadata": {"labels": {"iris.task_id": "x".repeat(64)}}});
        let err = validate_labels(id::PODS, "p", &long).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(
            err.message.contains("must be no more than 63 characters"),
            "{}",
            err.message
        );
        let bad = json!({"metadata": {"labels": {"iris.task_id": "/user/job"}}});
        assert!(validate_labels(id::PODS, "p", &bad).is_err());
    }
}
