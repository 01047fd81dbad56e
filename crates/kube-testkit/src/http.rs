//! The REST surface: path routing, discovery, verbs, watch streams and the pod log subresource.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::Response;
use axum::Router;
use futures::channel::mpsc;
use futures::SinkExt;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::apiserver::{self, DeleteOpts, Deleted, ListParams, PatchParams, Target};
use crate::cluster::Shared;
use crate::resources::{self, def, id};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::{self, ApiError};
use crate::store::{meta_str, uid_of, Event, EventType};
use crate::RecordedRequest;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

fn json_response(code: u16, body: &Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.code, &e.to_status())
}

fn text_response(body: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    r
}

/// What a path addresses.
enum Route {
    Json(Value),
    Text(&'static str),
    Resource(Target),
    NotFound,
}

fn parse_route(path: &str, server_address: &str) -> Route {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Route::Json(resources::version()),
        ["healthz" | "livez" | "readyz"] => return Route::Text("ok"),
        ["api"] => return Route::Json(resources::core_versions(server_address)),
        ["apis"] => return Route::Json(resources::group_list()),
        ["api", v] => {
            return resources::resource_list("", v)
                .map(Route::Json)
                .unwrap_or(Route::NotFound)
        }
        ["apis", g] => {
            return resources::group(g)
                .map(Route::Json)
                .unwrap_or(Route::NotFound)
        }
        ["apis", g, v] => {
            return resources::resource_list(g, v)
                .map(Route::Json)
                .unwrap_or(Route::NotFound)
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::NotFound,
    };
    let lookup = |plural: &str| resources::find(group, version, plural);
    let served_version = |res: usize| {
        def(res)
            .versions
            .iter()
            .copied()
            .find(|v| *v == version)
            .unwrap_or("v1")
    };
    let target = |res: usize, ns: Option<&str>, name: Option<&str>, sub: Option<&str>| {
        Route::Resource(Target {
            res,
            version: served_version(res),
            namespace: ns.map(str::to_string),
            name: name.map(str::to_string),
            sub: sub.map(str::to_string),
        })
    };
    match rest {
        ["namespaces", ns, plural, tail @ ..]
            if lookup(plural).is_some_and(|r| def(r).namespaced) =>
        {
            let Some(res) = lookup(plural) else {
                return Route::NotFound;
            };
            match tail {
                [] => target(res, Some(ns), None, None),
                [name] => target(res, Some(ns), Some(name), None),
                [name, sub] => target(res, Some(ns), Some(name), Some(sub)),
                _ => Route::NotFound,
            }
        }
        [plural, tail @ ..] => {
            let Some(res) = lookup(plural) else {
                return Route::NotFound;
            };
            let namespaced = def(res).namespaced;
            match tail {
                [] => target(res, None, None, None),
                [name] if !namespaced => target(res, None, Some(name), None),
                [name, sub] if !namespaced => target(res, None, Some(name), Some(sub)),
                _ => Route::NotFound,
            }
        }
        _ => Route::NotFound,
    }
}

fn flag(q: &HashMap<String, String>, key: &str) -> bool {
    matches!(q.get(key).map(String::as_str), Some("true" | "1"))
}

fn dry_run(q: &HashMap<String, String>) -> bool {
    q.get("dryRun").is_some_and(|v| !v.is_empty())
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let q: HashMap<String, String> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = match axum::body::to_bytes(req.into_body(), 256 << 20).await {
        Ok(b) => b,
        Err(e) => {
            return error_response(&ApiError::bad_request(format!(
                "reading the request body: {e}"
            )))
        }
    };
    let port = shared.lock().settings.port;
    let route = parse_route(&path, &format!("127.0.0.1:{port}"));
    let mut rec = RecordedRequest {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        verb: String::new(),
        api_group: String::new(),
        resource: None,
        namespace: None,
        name: None,
        content_type: content_type.clone(),
        status: 0,
    };
    let response = match route {
        Route::Json(v) => {
            rec.verb = "discovery".into();
            if method == Method::GET {
                json_response(200, &v)
            } else {
                error_response(&ApiError::method_not_allowed(format!(
                    "{method} is not supported here"
                )))
            }
        }
        Route::Text(t) => {
            rec.verb = "health".into();
            text_response(t.as_bytes().to_vec())
        }
        Route::NotFound => {
            rec.verb = "unknown".into();
            error_response(&ApiError::path_not_found(&path))
        }
        Route::Resource(t) => {
            let d = def(t.res);
            rec.api_group = d.group.to_string();
            rec.resource = Some(match &t.sub {
                Some(s) => format!("{}/{s}", d.plural),
                None => d.plural.to_string(),
            });
            rec.namespace = t.namespace.clone();
            rec.name = t.name.clone();
            let (verb, resp) = resource_request(
                &shared,
                &method,
                t,
                &q,
                content_type.as_deref().unwrap_or_default(),
                body,
            )
            .await;
            rec.verb = verb.to_string();
            resp
        }
    };
    rec.status = response.status().as_u16();
    shared.lock().requests.push(rec);
    response
}

async fn resource_request(
    shared: &Arc<Shared>,
    method: &Method,
    t: Target,
    q: &HashMap<String, String>,
    content_type: &str,
    body: Bytes,
) -> (&'static str, Response) {
    let d = def(t.res);
    if let Some(sub) = &t.sub {
        if !d.subresources.contains(&sub.as_str()) {
            return (
                "unknown",
                error_response(&ApiError::path_not_found(&format!("{}/{sub}", d.plural))),
            );
        }
    }
    let parse_body = || -> Result<Value, ApiError> {
        if body.is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(&body)
            .or_else(|_| serde_yaml::from_slice(&body))
            .map_err(|e| ApiError::bad_request(format!("error decoding the request body: {e}")))
    };
    if d.namespaced && t.namespace.is_none() && method != Method::GET {
        let msg = format!("the server does not allow this method on the requested resource ({method} {} without a namespace)", d.plural);
        return (
            "unknown",
            error_response(&ApiError::method_not_allowed(msg)),
        );
    }
    let kick = || shared.kick.notify_one();
    let sub = t.sub.clone();
    match (method.clone(), t.name.is_some(), sub.as_deref()) {
        (Method::GET, false, None) => {
            let params = match list_params(q) {
                Ok(p) => p,
                Err(e) => return ("list", error_response(&e)),
            };
            if flag(q, "watch") {
                return ("watch", watch(shared.clone(), t, params, q));
            }
            let cl = shared.lock();
            match apiserver::list(&cl, &t, &params) {
                Ok((items, token, remaining)) => {
                    let mut meta =
                        json!({"resourceVersion": cl.store.resource_version().to_string()});
                    if let Some(tok) = token {
                        meta["continue"] = json!(tok);
                        meta["remainingItemCount"] = json!(remaining);
                    }
                    let items: Vec<Value> = items
                        .iter()
                        .map(|o| apiserver::render(t.res, t.version, o))
                        .collect();
                    let list = json!({
                        "kind": format!("{}List", d.kind),
                        "apiVersion": d.api_version(t.version),
                        "metadata": meta,
                        "items": items,
                    });
                    ("list", json_response(200, &list))
                }
                Err(e) => ("list", error_response(&e)),
            }
        }
        (Method::GET, true, None | Some("status")) => {
            let cl = shared.lock();
            match apiserver::get(&cl, &t) {
                Ok(o) => (
                    "get",
                    json_response(200, &apiserver::render(t.res, t.version, &o)),
                ),
                Err(e) => ("get", error_response(&e)),
            }
        }
        (Method::GET, true, Some("log")) => ("get", logs(shared.clone(), &t, q).await),
        (Method::POST, false, None) => {
            let result =
                parse_body().and_then(|b| apiserver::create(&mut shared.lock(), &t, b, dry_run(q)));
            kick();
            match result {
                Ok(o) => (
                    "create",
                    json_response(201, &apiserver::render(t.res, t.version, &o)),
                ),
                Err(e) => ("create", error_response(&e)),
            }
        }
        (Method::POST, true, Some("eviction")) => {
            let mut opts = DeleteOpts {
                dry_run: dry_run(q),
                ..Default::default()
            };
            let result = parse_body().and_then(|b| {
                if let Some(dopts) = b.get("deleteOptions") {
                    opts.merge_body(dopts);
                }
                apiserver::evict(
                    &mut shared.lock(),
                    t.namespace.as_deref().unwrap_or_default(),
                    t.name.as_deref().unwrap_or_default(),
                    &opts,
                )
            });
            kick();
            match result {
                Ok(()) => (
                    "create",
                    json_response(
                        201,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                    ),
                ),
                Err(e) => ("create", error_response(&e)),
            }
        }
        (Method::PUT, true, None | Some("status")) => {
            let result =
                parse_body().and_then(|b| apiserver::update(&mut shared.lock(), &t, b, dry_run(q)));
            kick();
            match result {
                Ok(o) => (
                    "update",
                    json_response(200, &apiserver::render(t.res, t.version, &o)),
                ),
                Err(e) => ("update", error_response(&e)),
            }
        }
        (Method::PATCH, true, None | Some("status")) => {
            let params = PatchParams {
                field_manager: q.get("fieldManager").cloned(),
                dry_run: dry_run(q),
            };
            let result = apiserver::patch(&mut shared.lock(), &t, content_type, &body, &params);
            kick();
            match result {
                Ok((o, created)) => (
                    "patch",
                    json_response(
                        if created { 201 } else { 200 },
                        &apiserver::render(t.res, t.version, &o),
                    ),
                ),
                Err(e) => ("patch", error_response(&e)),
            }
        }
        (Method::DELETE, true, None) => {
            let mut opts = delete_opts(q);
            let result = parse_body().and_then(|b| {
                opts.merge_body(&b);
                let ns = t.namespace.clone().unwrap_or_default();
                apiserver::delete(
                    &mut shared.lock(),
                    t.res,
                    &ns,
                    t.name.as_deref().unwrap_or_default(),
                    &opts,
                )
            });
            kick();
            match result {
                Ok(Deleted::Gone(o)) => (
                    "delete",
                    json_response(200, &status::deleted(d, meta_str(&o, "name"), uid_of(&o))),
                ),
                Ok(Deleted::Pending(o)) => (
                    "delete",
                    json_response(202, &apiserver::render(t.res, t.version, &o)),
                ),
                Err(e) => ("delete", error_response(&e)),
            }
        }
        (Method::DELETE, false, None) => {
            let mut opts = delete_opts(q);
            let params = match list_params(q) {
                Ok(p) => p,
                Err(e) => return ("deletecollection", error_response(&e)),
            };
            let result = parse_body().and_then(|b| {
                opts.merge_body(&b);
                let mut cl = shared.lock();
                let (items, _, _) = apiserver::list(
                    &cl,
                    &t,
                    &ListParams {
                        limit: None,
                        continue_token: None,
                        ..params
                    },
                )?;
                let mut out = Vec::new();
                for o in items {
                    let ns = meta_str(&o, "namespace").to_string();
                    match apiserver::delete(&mut cl, t.res, &ns, meta_str(&o, "name"), &opts)? {
                        Deleted::Gone(o) | Deleted::Pending(o) => {
                            out.push(apiserver::render(t.res, t.version, &o))
                        }
                    }
                }
                Ok((out, cl.store.resource_version()))
            });
            kick();
            match result {
                Ok((items, rv)) => (
                    "deletecollection",
                    json_response(
                        200,
                        &json!({"kind": format!("{}List", d.kind), "apiVersion": d.api_version(t.version),
                                "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
                    ),
                ),
                Err(e) => ("deletecollection", error_response(&e)),
            }
        }
        _ => (
            "unknown",
            error_response(&ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method})"
            ))),
        ),
    }
}

fn delete_opts(q: &HashMap<String, String>) -> DeleteOpts {
    DeleteOpts {
        grace: q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()),
        propagation: q.get("propagationPolicy").cloned(),
        dry_run: dry_run(q),
        ..Default::default()
    }
}

fn list_params(q: &HashMap<String, String>) -> Result<ListParams, ApiError> {
    Ok(ListParams {
        labels: LabelSelector::parse(
            q.get("labelSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )
        .map_err(ApiError::bad_request)?,
        fields: FieldSelector::parse(
            q.get("fieldSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )
        .map_err(ApiError::bad_request)?,
        limit: q.get("limit").and_then(|l| l.parse().ok()),
        continue_token: q.get("continue").cloned(),
    })
}

fn matches(params: &ListParams, t: &Target, obj: &Value) -> bool {
    t.namespace
        .as_deref()
        .is_none_or(|ns| meta_str(obj, "namespace") == ns)
        && params.labels.matches_object(obj)
        && params.fields.matches(obj)
}

/// The line a watch sends for `ev`, if the watch selects it. A modification that makes an object
/// start or stop matching is sent as ADDED or DELETED.
fn event_line(t: &Target, params: &ListParams, ev: &Event) -> Option<Value> {
    if ev.res != t.res {
        return None;
    }
    let now = matches(params, t, &ev.object);
    let kind = match ev.kind {
        EventType::Added | EventType::Deleted if now => ev.kind,
        EventType::Modified => {
            let before = ev.prev.as_ref().is_some_and(|p| matches(params, t, p));
            match (before, now) {
                (true, true) => EventType::Modified,
                (false, true) => EventType::Added,
                (true, false) => EventType::Deleted,
                (false, false) => return None,
            }
        }
        _ => return None,
    };
    Some(json!({"type": kind.as_str(), "object": apiserver::render(t.res, t.version, &ev.object)}))
}

fn bookmark(t: &Target, rv: u64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"type": "BOOKMARK", "object": {"kind": def(t.res).kind, "apiVersion": def(t.res).api_version(t.version), "metadata": meta}})
}

fn line(v: &Value) -> Result<Bytes, Infallible> {
    let mut s = v.to_string();
    s.push('\n');
    Ok(Bytes::from(s))
}

fn streaming(
    rx: mpsc::Receiver<Result<Bytes, Infallible>>,
    content_type: &'static str,
) -> Response {
    let mut r = Response::new(Body::from_stream(rx));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

/// `?watch=true`: replays history after `resourceVersion` (or the current state for
/// `""`/`"0"`/`sendInitialEvents`), then streams live events, bookmarks and a close at
/// `timeoutSeconds`. A compacted version yields an `ERROR` event with a 410 `Status`.
fn watch(
    shared: Arc<Shared>,
    t: Target,
    params: ListParams,
    q: &HashMap<String, String>,
) -> Response {
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();
    let send_initial = flag(q, "sendInitialEvents");
    let bookmarks = flag(q, "allowWatchBookmarks");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0);
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    let mut first: Vec<Value> = Vec::new();
    let start_rv;
    let mut events_rx;
    let bookmark_every;
    {
        let cl = shared.lock();
        bookmark_every = cl.settings.bookmark_interval;
        let current = cl.store.resource_version();
        let from_state = send_initial || rv_param.is_empty() || rv_param == "0";
        if from_state {
            for o in cl
                .store
                .list(t.res, t.namespace.as_deref())
                .filter(|o| matches(&params, &t, o))
            {
                first.push(
                    json!({"type": "ADDED", "object": apiserver::render(t.res, t.version, o)}),
                );
            }
            match cl.store.subscribe(current) {
                Ok((_, r)) => events_rx = r,
                Err(_) => {
                    return error_response(&ApiError::internal(
                        "subscribing to the current version failed",
                    ))
                }
            }
            start_rv = current;
            if send_initial {
                first.push(bookmark(&t, current, true));
            }
        } else {
            let Ok(since) = rv_param.parse::<u64>() else {
                return error_response(&ApiError::bad_request(format!(
                    "invalid resource version: {rv_param}"
                )));
            };
            match cl.store.subscribe(since) {
                Ok((backlog, r)) => {
                    events_rx = r;
                    let mut last = since;
                    for ev in backlog {
                        last = last.max(ev.rv);
                        if let Some(l) = event_line(&t, &params, &ev) {
                            first.push(l);
                        }
                    }
                    start_rv = last.max(since);
                }
                Err(oldest) => {
                    first.push(json!({"type": "ERROR", "object": status::too_old(since, oldest)}));
                    let mut tx = tx;
                    // Owned by the response body: ends once the error line is sent or the client left.
                    tokio::spawn(async move {
                        for l in first {
                            let _ = tx.send(line(&l)).await;
                        }
                    });
                    return streaming(rx, "application/json");
                }
            }
        }
    }
    let mut shutdown = shared.shutdown.subscribe();
    drop(shared);
    // Owned by the response body: ends when the client disconnects, at timeoutSeconds, or at
    // server shutdown.
    tokio::spawn(async move {
        let mut tx = tx;
        for l in &first {
            if tx.send(line(l)).await.is_err() {
                return;
            }
        }
        let mut last_rv = start_rv;
        let deadline = tokio::time::sleep(
            timeout
                .map(Duration::from_secs)
                .unwrap_or(Duration::from_secs(3600)),
        );
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(bookmark_every);
        ticker.tick().await;
        loop {
            tokio::select! {
                ev = events_rx.recv() => match ev {
                    Ok(ev) => {
                        if ev.rv <= last_rv {
                            continue;
                        }
                        last_rv = ev.rv;
                        if let Some(l) = event_line(&t, &params, &ev) {
                            if tx.send(line(&l)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(RecvError::Lagged(_)) => {
                        let _ = tx.send(line(&json!({"type": "ERROR", "object": status::too_old(last_rv, last_rv + 1)}))).await;
                        return;
                    }
                    Err(RecvError::Closed) => return,
                },
                _ = ticker.tick(), if bookmarks => {
                    if tx.send(line(&bookmark(&t, last_rv, false))).await.is_err() {
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = shutdown.changed() => return,
            }
        }
    });
    streaming(rx, "application/json")
}

fn format_lines(lines: &[(chrono::DateTime<chrono::Utc>, Vec<u8>)], timestamps: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for (ts, l) in lines {
        if timestamps {
            out.extend_from_slice(
                ts.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
                    .as_bytes(),
            );
            out.push(b' ');
        }
        out.extend_from_slice(l);
    }
    out
}

/// `GET pods/{name}/log`: `container`, `follow`, `tailLines`, `sinceSeconds`, `timestamps`,
/// `limitBytes`, `previous`, with the API server's errors for pods that have not started.
async fn logs(shared: Arc<Shared>, t: &Target, q: &HashMap<String, String>) -> Response {
    let d = def(id::PODS);
    let ns = t.namespace.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let (buffer, shutdown) = {
        let cl = shared.lock();
        let Some(p) = cl.store.get(id::PODS, &ns, &name).cloned() else {
            return error_response(&ApiError::not_found(d, &name));
        };
        let names = |list: &[Value]| -> Vec<String> {
            list.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        };
        let mains = names(crate::pod::containers(&p));
        let inits = names(crate::pod::init_containers(&p));
        let container = match q.get("container").filter(|c| !c.is_empty()) {
            Some(c) => c.clone(),
            None if mains.len() == 1 => mains[0].clone(),
            None => {
                let mut msg = format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    mains.join(" ")
                );
                if !inits.is_empty() {
                    msg.push_str(&format!(
                        " or one of the init containers: [{}]",
                        inits.join(" ")
                    ));
                }
                return error_response(&ApiError::bad_request(msg));
            }
        };
        if !mains.contains(&container) && !inits.contains(&container) {
            return error_response(&ApiError::bad_request(format!(
                "container {container} is not valid for pod {name}"
            )));
        }
        if flag(q, "previous") {
            return error_response(&ApiError::bad_request(format!(
                "previous terminated container \"{container}\" in pod \"{name}\" not found"
            )));
        }
        if crate::pod::node_name(&p).is_empty() {
            return error_response(&ApiError::bad_request(format!(
                "pod {name} does not have a host assigned"
            )));
        }
        let uid = uid_of(&p).to_string();
        if let Some(reason) = cl.kubelet.waiting_reason(&uid, &container) {
            return error_response(&ApiError::bad_request(format!(
                "container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"
            )));
        }
        match cl.kubelet.log(&uid, &container) {
            Some(b) => (b, shared.shutdown.subscribe()),
            None => {
                return error_response(&ApiError::bad_request(format!(
                    "container \"{container}\" in pod \"{name}\" is waiting to start: ContainerCreating"
                )))
            }
        }
    };
    let timestamps = flag(q, "timestamps");
    let mut lines = buffer.since(0);
    if let Some(secs) = q.get("sinceSeconds").and_then(|s| s.parse::<i64>().ok()) {
        let cutoff = chrono::Utc::now() - chrono::Duration::seconds(secs);
        lines.retain(|(ts, _)| *ts >= cutoff);
    }
    if let Some(n) = q.get("tailLines").and_then(|s| s.parse::<usize>().ok()) {
        let skip = lines.len().saturating_sub(n);
        lines.drain(..skip);
    }
    let limit = q.get("limitBytes").and_then(|s| s.parse::<usize>().ok());
    let mut body = format_lines(&lines, timestamps);
    if let Some(l) = limit {
        body.truncate(l);
    }
    if !flag(q, "follow") {
        return text_response(body);
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let mut shutdown = shutdown;
    // Owned by the response body: ends when the container's log closes, the client leaves, or
    // the server shuts down.
    tokio::spawn(async move {
        let mut tx = tx;
        let mut sent = body.len();
        if tx.send(Ok(Bytes::from(body))).await.is_err() {
            return;
        }
        let mut next = buffer.len();
        let mut version = buffer.subscribe();
        loop {
            let new = buffer.since(next);
            next += new.len();
            if !new.is_empty() {
                let mut chunk = format_lines(&new, timestamps);
                if let Some(l) = limit {
                    chunk.truncate(l.saturating_sub(sent));
                }
                sent += chunk.len();
                if tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                    return;
                }
                if limit.is_some_and(|l| sent >= l) {
                    return;
                }
            }
            if buffer.is_closed() && buffer.len() == next {
                return;
            }
            tokio::select! {
                changed = version.changed() => if changed.is_err() { return },
                _ = shutdown.changed() => return,
            }
        }
    });
    streaming(rx, "text/plain")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(path: &str) -> Option<Target> {
        match parse_route(path, "127.0.0.1:1") {
            Route::Resource(t) => Some(t),
            _ => None,
        }
    }

    #[test]
    fn routes() {
        let t = target("/api/v1/namespaces/iris/pods/p1/log").unwrap();
        assert_eq!(
            (
                def(t.res).plural,
                t.namespace.as_deref(),
                t.name.as_deref(),
                t.sub.as_deref()
            ),
            ("pods", Some("iris"), Some("p1"), Some("log"))
        );
        let t = target("/api/v1/pods").unwrap();
        assert_eq!((def(t.res).plural, t.namespace.as_deref()), ("pods", None));
        let t = target("/api/v1/namespaces/iris").unwrap();
        assert_eq!(
            (def(t.res).plural, t.name.as_deref()),
            ("namespaces", Some("iris"))
        );
        let t = target("/apis/kueue.x-k8s.io/v1alpha1/topologies/infiniband").unwrap();
        assert_eq!((def(t.res).plural, t.version), ("topologies", "v1alpha1"));
        let t = target("/apis/kueue.x-k8s.io/v1beta1/namespaces/iris/workloads").unwrap();
        assert_eq!(def(t.res).plural, "workloads");
        assert!(
            target("/api/v1/pods/p1").is_none(),
            "namespaced objects need a namespace"
        );
        assert!(target("/apis/kueue.x-k8s.io/v1alpha1/workloads").is_none());
        assert!(matches!(parse_route("/apis/policy/v1", ""), Route::Json(_)));
    }
}
