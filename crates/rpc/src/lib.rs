//! The Connect protocol (unary calls) over HTTP, for both sides.
//!
//! Written by hand because the Connect wire format for unary calls is small (a POST with a
//! protobuf or JSON body, errors as a JSON object) and no maintained Rust crate serves it over
//! axum with prost messages and the compressions the published client sends (zstd, gzip).

mod channel;
pub mod dirlock;
pub mod procinfo;
pub mod proclog;

pub use channel::Channel;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{de::DeserializeOwned, Serialize};
use std::io::Read;
use std::time::Duration;

/// Largest request body accepted, compressed or not (bundles are at most 25 MiB).
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// Connect error codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    pub fn parse(s: &str) -> Code {
        match s {
            "canceled" => Code::Canceled,
            "invalid_argument" => Code::InvalidArgument,
            "deadline_exceeded" => Code::DeadlineExceeded,
            "not_found" => Code::NotFound,
            "already_exists" => Code::AlreadyExists,
            "permission_denied" => Code::PermissionDenied,
            "resource_exhausted" => Code::ResourceExhausted,
            "failed_precondition" => Code::FailedPrecondition,
            "aborted" => Code::Aborted,
            "out_of_range" => Code::OutOfRange,
            "unimplemented" => Code::Unimplemented,
            "internal" => Code::Internal,
            "unavailable" => Code::Unavailable,
            "data_loss" => Code::DataLoss,
            "unauthenticated" => Code::Unauthenticated,
            _ => Code::Unknown,
        }
    }

    /// HTTP status used for this code (the Connect mapping).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An RPC error: a code and a message for the user.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }
    pub fn precondition(message: impl Into<String>) -> Self {
        Self::new(Code::FailedPrecondition, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        let body =
            serde_json::json!({"code": self.code.as_str(), "message": self.message}).to_string();
        let mut r = (self.code.http_status(), body).into_response();
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        r
    }
}

/// Body codec chosen by the request's content type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Proto,
    Json,
}

fn decompress(encoding: &str, body: &[u8]) -> Result<Vec<u8>, RpcError> {
    let limit = MAX_BODY_BYTES as u64;
    let mut out = Vec::new();
    let res = match encoding {
        "" | "identity" => return Ok(body.to_vec()),
        "zstd" => zstd::stream::read::Decoder::new(body)
            .and_then(|d| d.take(limit + 1).read_to_end(&mut out)),
        "gzip" => flate2::read::GzDecoder::new(body)
            .take(limit + 1)
            .read_to_end(&mut out),
        other => {
            return Err(RpcError::new(
                Code::Unimplemented,
                format!("unsupported content-encoding '{other}' (use identity, gzip or zstd)"),
            ))
        }
    };
    res.map_err(|e| RpcError::invalid(format!("request body is not valid {encoding}: {e}")))?;
    if out.len() as u64 > limit {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("decompressed request body exceeds {MAX_BODY_BYTES} bytes"),
        ));
    }
    Ok(out)
}

/// Decodes a unary request body according to its headers.
pub fn decode<M: prost::Message + Default + DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(M, Codec), RpcError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("request body exceeds {MAX_BODY_BYTES} bytes"),
        ));
    }
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/proto");
    let enc = headers
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity");
    let raw = decompress(enc, body)?;
    let ct = ct.split(';').next().unwrap_or("").trim();
    match ct {
        "application/proto" | "application/protobuf" | "application/x-protobuf" => {
            M::decode(raw.as_slice())
                .map(|m| (m, Codec::Proto))
                .map_err(|e| {
                    RpcError::invalid(format!("request is not a valid protobuf message: {e}"))
                })
        }
        "application/json" => {
            let v = if raw.iter().all(|b| b.is_ascii_whitespace()) {
                b"{}".to_vec()
            } else {
                raw
            };
            serde_json::from_slice(&v)
                .map(|m| (m, Codec::Json))
                .map_err(|e| {
                    RpcError::invalid(format!("request is not valid JSON for this method: {e}"))
                })
        }
        other => Err(RpcError::new(
            Code::Unimplemented,
            format!(
                "unsupported content-type '{other}' (use application/proto or application/json)"
            ),
        )),
    }
}

/// Encodes a unary response; compresses large bodies with zstd or gzip when the client accepts it.
pub fn encode<M: prost::Message + Serialize>(
    codec: Codec,
    headers: &HeaderMap,
    msg: &M,
) -> Response {
    let (body, ct) = match codec {
        Codec::Proto => (msg.encode_to_vec(), "application/proto"),
        Codec::Json => match serde_json::to_vec(msg) {
            Ok(b) => (b, "application/json"),
            Err(e) => return RpcError::internal(format!("encoding response: {e}")).into_response(),
        },
    };
    let accept = headers
        .get("accept-encoding")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut encoding = None;
    let body = if body.len() > 64 * 1024 && accept.contains("zstd") {
        match zstd::encode_all(body.as_slice(), 1) {
            Ok(b) => {
                encoding = Some("zstd");
                b
            }
            Err(_) => body,
        }
    } else {
        body
    };
    let mut r = (StatusCode::OK, Bytes::from(body)).into_response();
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static(ct));
    if let Some(e) = encoding {
        r.headers_mut()
            .insert("content-encoding", HeaderValue::from_static(e));
    }
    r
}

/// Runs a unary handler: decode, call, encode.
pub async fn unary<Req, Resp, F, Fut>(headers: &HeaderMap, body: &[u8], f: F) -> Response
where
    Req: prost::Message + Default + DeserializeOwned,
    Resp: prost::Message + Serialize,
    F: FnOnce(Req) -> Fut,
    Fut: std::future::Future<Output = Result<Resp, RpcError>>,
{
    match decode::<Req>(headers, body) {
        Ok((req, codec)) => match f(req).await {
            Ok(resp) => encode(codec, headers, &resp),
            Err(e) => e.into_response(),
        },
        Err(e) => e.into_response(),
    }
}

/// A Connect client for one base URL.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Sent as `x-forwarded-for` (a relay such as the dashboard naming its own caller, so the
    /// controller never mistakes the relay's loopback connection for the caller).
    forwarded_for: Option<String>,
    /// Further headers sent on every call (see [`Client::with_header`]).
    extra: Vec<(&'static str, String)>,
    /// Parsed URL per `service/method`: parsing (with IDNA) on every call showed in profiles.
    urls: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, reqwest::Url>>>,
}

/// On a `Reconcile`: the controller has declared this worker lost (its attempts rerun
/// elsewhere). The request's desired set is empty, so the worker stops every attempt; the header
/// tells it to register afresh instead of waiting out its heartbeat timeout.
pub const FENCE_HEADER: &str = "x-iris-fence";

/// The process's one HTTP client: its connection pool is keyed by host, so every [`Client`]
/// shares it. Building a `reqwest::Client` reads the system's CA certificates (a few ms of
/// CPU); a controller that built one per worker spent a fifth of its CPU doing that while a
/// 5,000-worker fleet registered.
fn shared_http() -> Result<reqwest::Client, RpcError> {
    static SHARED: std::sync::OnceLock<Result<reqwest::Client, String>> =
        std::sync::OnceLock::new();
    SHARED
        .get_or_init(|| {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .pool_max_idle_per_host(64)
                .build()
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| RpcError::internal(format!("http client: {e}")))
}

impl Client {
    pub fn new(base: &str) -> Result<Self, RpcError> {
        let http = shared_http()?;
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_string(),
            token: None,
            forwarded_for: None,
            extra: Vec::new(),
            urls: Default::default(),
        })
    }

    /// Sends `authorization: Bearer <token>` on every call.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// Sends `x-forwarded-for: <addr>` on every call.
    pub fn with_forwarded_for(mut self, addr: Option<String>) -> Self {
        self.forwarded_for = addr.filter(|a| !a.is_empty());
        self
    }

    /// Sends `name: value` on every call (for example [`FENCE_HEADER`]).
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.extra.push((name, value.into()));
        self
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn url_for(&self, service: &str, method: &str) -> Result<reqwest::Url, RpcError> {
        let key = format!("{service}/{method}");
        let mut cache = self.urls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = cache.get(&key) {
            return Ok(u.clone());
        }
        let u = reqwest::Url::parse(&format!("{}/{key}", self.base)).map_err(|e| {
            RpcError::invalid(format!(
                "controller URL '{}' is not a valid URL: {e}",
                self.base
            ))
        })?;
        cache.insert(key, u.clone());
        Ok(u)
    }

    /// Calls `/<service>/<method>` with a protobuf body.
    pub async fn call<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        service: &str,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, RpcError> {
        let url = self.url_for(service, method)?;
        let mut rb = self
            .http
            .post(url.clone())
            .header("content-type", "application/proto")
            .header("connect-protocol-version", "1")
            .header("connect-timeout-ms", timeout.as_millis().to_string())
            .timeout(timeout)
            .body(req.encode_to_vec());
        if let Some(t) = &self.token {
            rb = rb.header("authorization", format!("Bearer {t}"));
        }
        if let Some(f) = &self.forwarded_for {
            rb = rb.header("x-forwarded-for", f.as_str());
        }
        for (k, v) in &self.extra {
            rb = rb.header(*k, v.as_str());
        }
        let resp = rb.send().await.map_err(|e| {
            RpcError::new(
                Code::Unavailable,
                format!("cannot reach {}: {}", self.base, root_cause(&e)),
            )
        })?;
        let (status, headers) = (resp.status(), resp.headers().clone());
        let bytes = resp.bytes().await.map_err(|e| {
            RpcError::new(
                Code::Unavailable,
                format!("reading response from {url}: {e}"),
            )
        })?;
        answer(url.as_str(), status, &headers, &bytes)
    }
}

/// A unary call's answer as Connect defines it: the decoded message on success, else the error
/// the body names (a Connect error object), or one made from the HTTP status and what came back.
fn answer<Resp: prost::Message + Default>(
    url: &str,
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Resp, RpcError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let bytes = decompress(header("content-encoding").unwrap_or("identity"), body)?;
    let is_json = header("content-type").is_some_and(|c| c.starts_with("application/json"));
    if status.is_success() {
        return Resp::decode(bytes.as_slice())
            .map_err(|e| RpcError::internal(format!("invalid response from {url}: {e}")));
    }
    // Connect's mapping for an HTTP status without a Connect error body.
    let by_status = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502..=504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    let json = if is_json {
        serde_json::from_slice::<serde_json::Value>(&bytes).ok()
    } else {
        None
    };
    if let Some(v) = json.as_ref().filter(|v| v.get("code").is_some()) {
        let code = v
            .get("code")
            .and_then(|c| c.as_str())
            .map(Code::parse)
            .unwrap_or(by_status);
        let message = v
            .get("message")
            .and_then(|c| c.as_str())
            .unwrap_or("")
            .to_string();
        return Err(RpcError { code, message });
    }
    // Not a Connect error (a proxy's or a web framework's page): say what came back.
    let said = json
        .as_ref()
        .and_then(|v| {
            ["error", "detail", "message"]
                .iter()
                .find_map(|k| v.get(*k).and_then(|m| m.as_str()).map(str::to_string))
        })
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(&bytes);
            text.trim().chars().take(200).collect()
        });
    let message = if said.is_empty() {
        format!("HTTP {status} from {url}")
    } else {
        format!("HTTP {status} from {url}: {said}")
    };
    Err(RpcError::new(by_status, message))
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: &(dyn std::error::Error + 'static) = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use axum::routing::post;

    /// A server that answers every call with `status` and `body` (as JSON when `json`).
    async fn answering(status: StatusCode, body: &'static str, json: bool) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let ct = if json {
            "application/json"
        } else {
            "text/html"
        };
        let app = axum::Router::new().route(
            "/{service}/{method}",
            post(move || async move { (status, [("content-type", ct)], body) }),
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        url
    }

    /// The error a call to `url` gets, through [`Client`] and through [`Channel`] alike.
    async fn call(url: &str) -> RpcError {
        let timeout = Duration::from_secs(10);
        let e = Client::new(url)
            .expect("client")
            .call::<(), ()>("s.S", "M", &(), timeout)
            .await
            .expect_err("an error answer");
        let mut ch = Channel::new(url).expect("an http URL");
        let by_channel = ch
            .call::<(), ()>("s.S", "M", &(), timeout)
            .await
            .expect_err("an error answer");
        assert_eq!((e.code, &e.message), (by_channel.code, &by_channel.message));
        e
    }

    #[tokio::test]
    async fn errors_that_are_not_connect_errors_say_what_came_back() {
        // A Connect error body is taken as it is.
        let url = answering(
            StatusCode::NOT_FOUND,
            r#"{"code":"not_found","message":"job /u/x not found"}"#,
            true,
        )
        .await;
        let e = call(&url).await;
        assert_eq!(
            (e.code, e.message.as_str()),
            (Code::NotFound, "job /u/x not found")
        );
        // A web framework's JSON refusal: its status maps as Connect maps it, its words kept.
        let url = answering(
            StatusCode::FORBIDDEN,
            r#"{"error":"peer not authorized for this endpoint"}"#,
            true,
        )
        .await;
        let e = call(&url).await;
        assert_eq!(e.code, Code::PermissionDenied);
        assert!(
            e.message.contains("403") && e.message.contains("peer not authorized"),
            "{}",
            e.message
        );
        // A proxy's HTML page.
        let url = answering(StatusCode::BAD_GATEWAY, "<html>bad gateway</html>", false).await;
        let e = call(&url).await;
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.message.contains("bad gateway"), "{}", e.message);
    }
}
