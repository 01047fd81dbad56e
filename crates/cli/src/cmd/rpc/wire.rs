//! One unary Connect call (protobuf encoding) to any base URL: a service's own address, or a
//! `/proxy/<name>` URL on the controller. Errors come back as [`RpcError`] (code and message),
//! read from a Connect error body, or from the `{"error": ...}` body the controller's proxy
//! answers with when it cannot forward the call.

use iris_rpc::{Code, RpcError};
use prost_reflect::{DynamicMessage, MethodDescriptor};
use std::time::Duration;

/// Where calls go: a base URL (the service path is appended) and the bearer token, if any.
pub(crate) struct Target {
    pub(crate) base: String,
    pub(crate) token: Option<String>,
}

impl Target {
    pub(crate) fn new(base: &str, token: Option<String>) -> Self {
        Target {
            base: base.trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()),
        }
    }
}

/// Calls `method` with `request` and decodes the reply as the method's output message.
pub(crate) async fn call(
    target: &Target,
    method: &MethodDescriptor,
    request: &DynamicMessage,
    timeout: Duration,
) -> Result<DynamicMessage, RpcError> {
    use prost::Message as _;
    let service = method.parent_service().full_name();
    let bytes = unary(
        target,
        service,
        method.name(),
        request.encode_to_vec(),
        timeout,
    )
    .await?;
    let output = method.output();
    DynamicMessage::decode(output.clone(), bytes.as_slice()).map_err(|e| {
        RpcError::internal(format!(
            "the reply to {} is not a valid {}: {e}",
            method.name(),
            output.name()
        ))
    })
}

/// POSTs `body` to `<base>/<service>/<method>` and returns the reply's bytes.
pub(crate) async fn unary(
    target: &Target,
    service: &str,
    method: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Vec<u8>, RpcError> {
    let url = format!("{}/{service}/{method}", target.base);
    let url = reqwest::Url::parse(&url).map_err(|e| {
        RpcError::invalid(format!(
            "'{}' is not a valid URL ({e}); pass --controller-url http://HOST:PORT",
            target.base
        ))
    })?;
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| RpcError::internal(format!("http client: {e}")))?;
    let mut rb = http
        .post(url.clone())
        .header("content-type", "application/proto")
        .header("connect-protocol-version", "1")
        .header("connect-timeout-ms", timeout.as_millis().to_string())
        .timeout(timeout)
        .body(body);
    if let Some(t) = &target.token {
        rb = rb.header("authorization", format!("Bearer {t}"));
    }
    let resp = rb.send().await.map_err(|e| {
        let code = if e.is_timeout() {
            Code::DeadlineExceeded
        } else {
            Code::Unavailable
        };
        RpcError::new(
            code,
            format!("cannot reach {}: {}", target.base, root_cause(&e)),
        )
    })?;
    let status = resp.status();
    let encoding = resp
        .headers()
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .to_string();
    let bytes = resp.bytes().await.map_err(|e| {
        RpcError::new(
            Code::Unavailable,
            format!("reading the reply from {url}: {}", root_cause(&e)),
        )
    })?;
    if status.is_success() {
        if encoding != "identity" {
            return Err(RpcError::internal(format!(
                "{url} answered with content-encoding {encoding}, which was not asked for"
            )));
        }
        return Ok(bytes.to_vec());
    }
    Err(error_from(status.as_u16(), &bytes, &url))
}

/// The error an unsuccessful reply carries: a Connect error body (`code`, `message`), the
/// proxy's `{"error": ...}`, or else the HTTP status mapped the Connect way.
fn error_from(status: u16, body: &[u8], url: &reqwest::Url) -> RpcError {
    let by_status = match status {
        400 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        408 | 504 => Code::DeadlineExceeded,
        429 | 502 | 503 => Code::Unavailable,
        501 => Code::Unimplemented,
        _ => Code::Unknown,
    };
    let json = serde_json::from_slice::<serde_json::Value>(body).ok();
    let field = |k: &str| {
        json.as_ref()
            .and_then(|v| v.get(k))
            .and_then(|c| c.as_str())
            .map(str::to_string)
    };
    if let Some(code) = field("code") {
        return RpcError::new(Code::parse(&code), field("message").unwrap_or_default());
    }
    if let Some(message) = field("error") {
        return RpcError::new(by_status, message);
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut message = format!("HTTP {status} from {url}");
    if status == 404 && text.is_empty() {
        message.push_str(" (no such service or method at this address)");
    } else if !text.is_empty() {
        message.push_str(": ");
        message.extend(text.chars().take(300));
    }
    RpcError::new(by_status, message)
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_connect_and_proxy_bodies() {
        let url = reqwest::Url::parse("http://127.0.0.1:1/s/M").expect("url");
        let e = error_from(
            404,
            br#"{"code":"not_found","message":"job /a/b not found"}"#,
            &url,
        );
        assert_eq!(
            (e.code, e.message.as_str()),
            (Code::NotFound, "job /a/b not found")
        );
        let e = error_from(404, br#"{"error":"No endpoint '/a/x'"}"#, &url);
        assert_eq!(
            (e.code, e.message.as_str()),
            (Code::NotFound, "No endpoint '/a/x'")
        );
        let e = error_from(502, b"bad gateway", &url);
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.message.contains("HTTP 502") && e.message.contains("bad gateway"));
    }
}
