//! Request-size guard: a body announced larger than `iris_rpc::MAX_BODY_BYTES` is refused from
//! its `content-length` header, before any of it is read, with a Connect JSON error. Bodies
//! without a length (chunked) are cut off at the same limit while being read (`dispatch` reads
//! with `axum::body::to_bytes(.., MAX_BODY_BYTES)`), and `DefaultBodyLimit` covers extractors.

use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use iris_rpc::{Code, RpcError, MAX_BODY_BYTES};

async fn refuse_oversized(req: Request, next: Next) -> Response {
    let announced = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = announced {
        if n > MAX_BODY_BYTES as u64 {
            return RpcError::new(
                Code::ResourceExhausted,
                format!("request body of {n} bytes exceeds the {MAX_BODY_BYTES}-byte limit"),
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// Wraps the router with the size guard.
pub(crate) fn guard(router: axum::Router) -> axum::Router {
    router
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(refuse_oversized))
}
