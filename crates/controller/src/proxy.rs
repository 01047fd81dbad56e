//! `/proxy`: users reach a task's registered service through the controller.
//!
//! `/proxy/<name>/<path>` with the caller's own identity, `/proxy/t/<token>/<name>/<path>` with a
//! capability URL (`MintEndpointToken`), and `/proxy/t/cluster=<peer>/…` relayed to the peer that
//! minted it. Which endpoint and who may reach it are decided by the pure rules in
//! `iris_types::endpoint`; everything is checked before a byte goes to a worker, and only a
//! registered endpoint's address is ever dialled. Bodies stream both ways (hyper's flow control
//! is the backpressure; nothing is buffered), HTTP/2 requests go upstream as HTTP/2 (so gRPC and
//! Connect actors work), and websocket upgrades are spliced once both sides agree.

use crate::auth::{authenticate, Identity};
use crate::Controller;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use iris_auth::Role;
use iris_types::endpoint::{self as ep, ProxyCaller, ProxyTarget};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How long an upstream may take to answer (its response headers) unless its endpoint says.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// A relayed capability URL is a peer's business; its own proxy applies the endpoint's timeout.
const RELAY_TIMEOUT: Duration = Duration::from_secs(3600);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const METHODS: [Method; 7] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::HEAD,
    Method::OPTIONS,
];

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// The HTTP clients `/proxy` forwards with: HTTP/1.1 (with upgrades) and HTTP/2 with prior
/// knowledge (h2c), chosen by the version the caller spoke.
pub(crate) struct Upstreams {
    h1: Client<Connector, Body>,
    h2: Client<Connector, Body>,
}

impl Upstreams {
    pub(crate) fn new() -> Upstreams {
        let connector = || {
            let mut http = HttpConnector::new();
            http.enforce_http(false);
            http.set_connect_timeout(Some(CONNECT_TIMEOUT));
            http.set_nodelay(true);
            let tls = hyper_rustls::HttpsConnectorBuilder::new()
                .with_native_roots()
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "no system CA roots; /proxy reaches https endpoints only with a private CA");
                    hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                        rustls::ClientConfig::builder()
                            .with_root_certificates(rustls::RootCertStore::empty())
                            .with_no_client_auth(),
                    )
                })
                .https_or_http()
                .enable_http1()
                .enable_http2();
            tls.wrap_connector(http)
        };
        Upstreams {
            h1: Client::builder(TokioExecutor::new()).build(connector()),
            h2: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build(connector()),
        }
    }
}

/// The `/proxy` routes (no request-size guard: bodies stream).
pub(crate) fn router(ctl: Arc<Controller>) -> Router {
    Router::new()
        .route("/proxy/", any(handle))
        .route("/proxy/{*rest}", any(handle))
        .with_state(ctl)
}

/// An error answer: JSON `{"error": …}`, like the reference's proxy.
fn fail(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(serde_json::json!({ "error": message.into() })),
    )
        .into_response()
}

async fn handle(State(ctl): State<Arc<Controller>>, req: Request) -> Response {
    if !METHODS.contains(req.method()) {
        return fail(
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "/proxy forwards GET, POST, PUT, PATCH, DELETE, HEAD and OPTIONS, not {}",
                req.method()
            ),
        );
    }
    let path = req.uri().path().strip_prefix("/proxy/").unwrap_or("");
    let Some(target) = ep::parse_proxy_path(path) else {
        return fail(
            StatusCode::BAD_REQUEST,
            "the proxy URL names no endpoint: use /proxy/<name>/<path> (the name with '.' for '/', e.g. /proxy/alice.train.web/), or a capability URL /proxy/t/<token>/<name>/",
        );
    };
    let query = req.uri().query().map(str::to_string);
    match target {
        ProxyTarget::Relay { peer, rest } => {
            let Some(base) = ctl.fed.peer_address(&peer) else {
                return fail(
                    StatusCode::NOT_FOUND,
                    format!("no federation peer '{peer}' is configured here"),
                );
            };
            let upstream = join(&format!("{base}/proxy/t"), &rest, query.as_deref());
            let prefix = format!("/proxy/t/cluster={peer}");
            forward(&ctl, req, &upstream, &prefix, None, RELAY_TIMEOUT, &peer).await
        }
        ProxyTarget::Named { segment, rest } => {
            let creds = credentials(req.headers(), None);
            let prefix = format!("/proxy/{segment}");
            local(&ctl, req, creds, &segment, &rest, &prefix, query).await
        }
        ProxyTarget::Token {
            token,
            segment,
            rest,
        } => {
            let creds = credentials(req.headers(), Some(&token));
            let prefix = format!("/proxy/t/{token}/{segment}");
            local(&ctl, req, creds, &segment, &rest, &prefix, query).await
        }
    }
}

/// The headers authentication reads: a path token wins over everything; else the caller's
/// `Authorization`, else the dashboard's session cookie.
fn credentials(headers: &HeaderMap, path_token: Option<&str>) -> HeaderMap {
    let mut h = headers.clone();
    let token = path_token.map(str::to_string).or_else(|| {
        if headers.contains_key(header::AUTHORIZATION) {
            return None;
        }
        iris_auth::session_token(
            headers
                .get_all(header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        )
    });
    if let Some(t) = token {
        if let Ok(v) = HeaderValue::from_str(&format!("Bearer {t}")) {
            h.insert(header::AUTHORIZATION, v);
        }
    }
    h
}

async fn local(
    ctl: &Arc<Controller>,
    req: Request,
    creds: HeaderMap,
    segment: &str,
    rest: &str,
    prefix: &str,
    query: Option<String>,
) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let id = match authenticate(
        ctl.cfg.auth.as_ref(),
        ctl.verifier.as_ref(),
        ctl.fed_verifier.as_ref(),
        &creds,
        peer,
    ) {
        Ok(id) => id,
        Err(e) => return fail(StatusCode::UNAUTHORIZED, e.message),
    };
    let name = percent_encoding::percent_decode_str(segment)
        .decode_utf8_lossy()
        .into_owned();
    let endpoint = match ctl.resolve_endpoint(&name) {
        Ok(Some(e)) => e,
        Ok(None) => {
            return fail(
                StatusCode::NOT_FOUND,
                format!(
                    "No endpoint '{}': nothing by that name is registered and live (see `iris endpoints list`)",
                    ep::decode_proxy_name(&name)[0]
                ),
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "resolving an endpoint");
            return fail(StatusCode::INTERNAL_SERVER_ERROR, "could not read the endpoint registry");
        }
    };
    let caller = match proxy_caller(ctl, &id, &endpoint) {
        Ok(c) => c,
        Err(why) => return fail(StatusCode::FORBIDDEN, why),
    };
    let owner = ep::owner_of(&endpoint.job_id);
    if let Err(why) = ep::proxy_allowed(&caller, &endpoint.name, owner, endpoint.access) {
        return fail(
            StatusCode::FORBIDDEN,
            format!("endpoint {}: {why} (you are {})", endpoint.name, id.user_id),
        );
    }
    // `/proxy/<name>` without the slash: relative links in the page would resolve against
    // `/proxy/`, so send the browser to the directory form first.
    if !has_slash_after(&req, prefix) {
        let location = match &query {
            Some(q) => format!("{prefix}/?{q}"),
            None => format!("{prefix}/"),
        };
        return (
            StatusCode::TEMPORARY_REDIRECT,
            [(header::LOCATION, location)],
        )
            .into_response();
    }
    let timeout = ep::proxy_timeout_secs(
        endpoint
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    )
    .map(Duration::from_secs_f64)
    .unwrap_or(DEFAULT_TIMEOUT);
    if let Some(peer_id) = &endpoint.peer_id {
        // A mirrored endpoint: the peer's proxy reaches it; we vouch for the caller.
        let (Some(base), Some(token)) = (
            ctl.fed.peer_address(peer_id),
            ctl.cfg
                .auth
                .as_ref()
                .and_then(crate::auth::federation_token),
        ) else {
            return fail(
                StatusCode::BAD_GATEWAY,
                format!("endpoint {} lives on federation peer {peer_id}, which this controller cannot reach (no address or signing key)", endpoint.name),
            );
        };
        let upstream = join(
            &format!("{base}/proxy/{}", ep::encode_proxy_name(&endpoint.name)),
            rest,
            query.as_deref(),
        );
        let bearer = format!("Bearer {token}");
        return forward(
            ctl,
            req,
            &upstream,
            prefix,
            Some(bearer),
            timeout,
            &endpoint.name,
        )
        .await;
    }
    let Some(base) = ep::proxy_base(&endpoint.address) else {
        return fail(
            StatusCode::BAD_GATEWAY,
            format!(
                "endpoint {} is registered at {}, which is not an HTTP address; /proxy forwards only to host:port or http(s):// endpoints",
                endpoint.name, endpoint.address
            ),
        );
    };
    let upstream = join(&base, rest, query.as_deref());
    forward(ctl, req, &upstream, prefix, None, timeout, &endpoint.name).await
}

/// Whether the request path continues with '/' after `prefix` (`/proxy/x/` vs `/proxy/x`).
fn has_slash_after(req: &Request, prefix: &str) -> bool {
    req.uri()
        .path()
        .strip_prefix(prefix)
        .is_some_and(|r| r.starts_with('/'))
}

/// How the pure rules see the caller.
fn proxy_caller<'a>(
    ctl: &Controller,
    id: &'a Identity,
    endpoint: &iris_store::endpoints::Endpoint,
) -> Result<ProxyCaller<'a>, String> {
    if let Some(e) = id.endpoint_scope() {
        return Ok(ProxyCaller::Capability { endpoint: e });
    }
    if id.role != Role::FederationPeer {
        return Ok(ProxyCaller::User {
            user: &id.user_id,
            admin: id.is_admin(),
        });
    }
    // A parent relaying its user: only to endpoints of jobs it handed us, never onward.
    let handed = endpoint.peer_id.is_none()
        && ctl
            .check_received_from(&endpoint.job_id, &id.user_id)
            .is_ok();
    if handed {
        Ok(ProxyCaller::Peer)
    } else {
        Err(format!(
            "federation peer {} may reach only endpoints of jobs it handed to this cluster",
            id.user_id
        ))
    }
}

/// `base` + `/` + `rest` (still percent-encoded, as the caller sent it) + `?query`.
fn join(base: &str, rest: &str, query: Option<&str>) -> String {
    let mut u = format!("{}/{rest}", base.trim_end_matches('/'));
    if let Some(q) = query {
        u.push('?');
        u.push_str(q);
    }
    u
}

/// The headers a `Connection` header names as hop-by-hop.
fn connection_tokens(h: &HeaderMap) -> Vec<HeaderName> {
    h.get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect()
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) and the caller's credentials never go upstream.
fn strip_request_headers(h: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = connection_tokens(h)
        .into_iter()
        .filter(|n| !(upgrade && *n == header::UPGRADE))
        .collect();
    for n in named {
        h.remove(n);
    }
    // gRPC needs `te: trailers` end to end; other TE values are hop-by-hop.
    let te_trailers = h
        .get(header::TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    for n in [
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "host",
        "authorization",
        "cookie",
        iris_auth::iap::HEADER,
    ] {
        h.remove(n);
    }
    if upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        h.remove(header::CONNECTION);
        h.remove(header::UPGRADE);
    }
    if te_trailers {
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Sends `req` to `upstream` and streams the answer back.
async fn forward(
    ctl: &Arc<Controller>,
    mut req: Request,
    upstream: &str,
    prefix: &str,
    authorization: Option<String>,
    timeout: Duration,
    name: &str,
) -> Response {
    let uri: Uri = match upstream.parse() {
        Ok(u) => u,
        Err(e) => {
            return fail(
                StatusCode::BAD_GATEWAY,
                format!("endpoint {name}: {upstream} is not a valid URL: {e}"),
            )
        }
    };
    let peer_ip = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string());
    let upgrade = is_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let version = req.version();
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    let host = headers
        .get("x-forwarded-host")
        .or_else(|| headers.get(header::HOST))
        .cloned()
        .or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
    strip_request_headers(&mut headers, upgrade);
    if !headers.contains_key("x-forwarded-for") {
        if let Some(ip) = peer_ip.and_then(|ip| HeaderValue::from_str(&ip).ok()) {
            headers.insert("x-forwarded-for", ip);
        }
    }
    if let Some(h) = host {
        headers.insert("x-forwarded-host", h);
    }
    if !headers.contains_key("x-forwarded-proto") {
        headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    }
    if let Ok(p) = HeaderValue::from_str(prefix) {
        headers.insert("x-forwarded-prefix", p);
    }
    if let Some(a) = authorization.and_then(|a| HeaderValue::from_str(&a).ok()) {
        headers.insert(header::AUTHORIZATION, a);
    }
    let h2 = version == Version::HTTP_2 && !upgrade;
    let mut out = axum::http::Request::builder()
        .method(parts.method)
        .uri(uri.clone())
        .version(if h2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        });
    if let Some(h) = out.headers_mut() {
        *h = headers;
    }
    let out = match out.body(if upgrade { Body::empty() } else { body }) {
        Ok(r) => r,
        Err(e) => return fail(StatusCode::BAD_GATEWAY, format!("endpoint {name}: {e}")),
    };
    let client = if h2 {
        &ctl.upstreams().h2
    } else {
        &ctl.upstreams().h1
    };
    let mut resp = match tokio::time::timeout(timeout, client.request(out)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return fail(
                StatusCode::BAD_GATEWAY,
                format!("endpoint {name} did not answer at {}: {}", authority(&uri), error_chain(&e)),
            )
        }
        Err(_) => {
            return fail(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "endpoint {name} did not answer within {}s (set the endpoint's `{}` metadata to allow longer)",
                    timeout.as_secs_f64(),
                    ep::PROXY_TIMEOUT_KEY
                ),
            )
        }
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_upgrade {
            let upstream_side = hyper::upgrade::on(&mut resp);
            // Owned by the two connections: ends when either side closes.
            tokio::spawn(async move {
                if let (Ok(a), Ok(b)) = (client_side.await, upstream_side.await) {
                    let _ =
                        tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b))
                            .await;
                }
            });
        }
        let (parts, _) = resp.into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    let (mut parts, body) = resp.into_parts();
    rewrite_response_headers(&mut parts.headers, &uri, prefix);
    Response::from_parts(parts, Body::new(body))
}

fn authority(uri: &Uri) -> String {
    uri.authority().map(|a| a.to_string()).unwrap_or_default()
}

/// The error and its causes, as one line (hyper's top-level message alone is "client error").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.join(": ")
}

/// Drops hop-by-hop headers and cookies the upstream sets (they would be scoped to the
/// controller's origin, shared by every endpoint), and keeps redirects under the proxy prefix.
fn rewrite_response_headers(h: &mut HeaderMap, upstream: &Uri, prefix: &str) {
    for n in connection_tokens(h) {
        h.remove(n);
    }
    for n in [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "transfer-encoding",
        "upgrade",
        "set-cookie",
    ] {
        h.remove(n);
    }
    for n in [header::LOCATION, header::CONTENT_LOCATION] {
        let Some(v) = h.get(&n).and_then(|v| v.to_str().ok()) else {
            continue;
        };
        if let Some(new) = rewrite_location(v, upstream, prefix) {
            if let Ok(v) = HeaderValue::from_str(&new) {
                h.insert(n, v);
            }
        }
    }
}

/// A redirect to the upstream itself, rewritten to stay under the proxy prefix.
fn rewrite_location(v: &str, upstream: &Uri, prefix: &str) -> Option<String> {
    if v.starts_with('/') && !v.starts_with("//") {
        return Some(format!("{prefix}{v}"));
    }
    let target: Uri = v.parse().ok()?;
    let same = target.authority().map(|a| a.as_str()) == upstream.authority().map(|a| a.as_str())
        && target
            .scheme_str()
            .is_none_or(|s| Some(s) == upstream.scheme_str());
    if !same || target.authority().is_none() {
        return None;
    }
    let pq = target.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    Some(format!("{prefix}{pq}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_stay_under_the_prefix() {
        let up: Uri = "http://10.0.0.5:8080/".parse().expect("uri");
        let p = "/proxy/alice.job.web";
        assert_eq!(
            rewrite_location("/login?x=1", &up, p).as_deref(),
            Some("/proxy/alice.job.web/login?x=1")
        );
        assert_eq!(
            rewrite_location("http://10.0.0.5:8080/a/b", &up, p).as_deref(),
            Some("/proxy/alice.job.web/a/b")
        );
        assert_eq!(rewrite_location("https://example.com/x", &up, p), None);
        assert_eq!(rewrite_location("//example.com/x", &up, p), None);
    }

    #[test]
    fn credentials_and_hop_by_hop_headers_stay_behind() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer secret"),
            ("cookie", "iris_session=secret"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("te", "trailers"),
            ("x-app", "kept"),
        ] {
            h.insert(k, v.parse().expect("value"));
        }
        strip_request_headers(&mut h, false);
        assert!(h.get("authorization").is_none());
        assert!(h.get("cookie").is_none());
        assert!(h.get("x-private").is_none());
        assert!(h.get("connection").is_none());
        assert_eq!(h.get("te").and_then(|v| v.to_str().ok()), Some("trailers"));
        assert_eq!(h.get("x-app").and_then(|v| v.to_str().ok()), Some("kept"));
    }

    #[test]
    fn the_session_cookie_or_a_path_token_is_the_credential() {
        let mut h = HeaderMap::new();
        h.insert("cookie", "a=b; iris_session=tok1".parse().expect("v"));
        let c = credentials(&h, None);
        assert_eq!(
            c.get("authorization").and_then(|v| v.to_str().ok()),
            Some("Bearer tok1")
        );
        let c = credentials(&h, Some("tok2"));
        assert_eq!(
            c.get("authorization").and_then(|v| v.to_str().ok()),
            Some("Bearer tok2")
        );
    }
}
