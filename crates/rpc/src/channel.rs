//! A unary Connect client over one HTTP/1.1 connection of its own, for a caller that calls one
//! plain-HTTP peer again and again with idempotent requests: the controller's reconcile loop
//! with its worker.
//!
//! [`Client`](crate::Client) goes through reqwest, whose shared pool, redirect and retry layers,
//! URL handling and per-call timer are right for a CLI or a relay. At C1M shape (5,000 workers,
//! thousands of reconcile rounds a second) those layers were ~8% of the controller's CPU beside
//! the HTTP exchange itself (BENCHMARKS.md). A loop that owns its connection needs none of them:
//! this is hyper's connection API with the Connect framing of [`crate::answer`].

use crate::{answer, root_cause, Code, RpcError, MAX_BODY_BYTES};
use axum::http::{header, Request, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use std::time::Duration;

/// How long connecting may take (as `Client`'s pool allows).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One peer's connection, opened on the first call and again after any failed one.
pub struct Channel {
    base: String,
    /// `host:port` to connect to, and the `host` header.
    authority: String,
    /// The base URL's path, which prefixes `/<service>/<method>`.
    prefix: String,
    sender: Option<SendRequest<Full<Bytes>>>,
}

/// Why one exchange failed: `unsent` when the request never left (the connection was already
/// closed), so sending it again on a new connection cannot repeat it.
struct Failed {
    error: RpcError,
    unsent: bool,
}

impl Channel {
    /// A channel to `base` (`http://host[:port][/path]`); `None` for any other scheme, which
    /// needs [`Client`](crate::Client).
    pub fn new(base: &str) -> Option<Self> {
        let base = base.trim_end_matches('/');
        let uri: Uri = base.parse().ok()?;
        if uri.scheme_str() != Some("http") {
            return None;
        }
        let auth = uri.authority()?;
        Some(Channel {
            base: base.to_string(),
            authority: format!("{}:{}", auth.host(), auth.port_u16().unwrap_or(80)),
            prefix: uri.path().trim_end_matches('/').to_string(),
            sender: None,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Calls `/<service>/<method>` with a protobuf body, within `timeout` all told (connecting
    /// included). The request must be idempotent: one that fails on a connection kept from an
    /// earlier call, before an answer began, is sent once more on a new connection (the peer
    /// may have closed the idle one just as it left).
    pub async fn call<Req: prost::Message, Resp: prost::Message + Default>(
        &mut self,
        service: &str,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, RpcError> {
        let path = format!("/{service}/{method}");
        let target = format!("{}{path}", self.prefix);
        let body = Bytes::from(req.encode_to_vec());
        let attempt = async {
            let reused = self.sender.as_ref().is_some_and(|s| !s.is_closed());
            match self.exchange(&target, &path, body.clone(), timeout).await {
                Err(f) if reused && f.unsent => {
                    // On a new connection, even if the old one is not yet seen closed.
                    self.sender = None;
                    self.exchange(&target, &path, body, timeout).await
                }
                other => other,
            }
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(f)) => {
                self.sender = None;
                Err(f.error)
            }
            Err(_) => {
                // Mid-exchange: the connection cannot carry another request.
                self.sender = None;
                Err(RpcError::new(
                    Code::DeadlineExceeded,
                    format!(
                        "no answer from {} within {} ms",
                        self.base,
                        timeout.as_millis()
                    ),
                ))
            }
        }
    }

    async fn exchange<Resp: prost::Message + Default>(
        &mut self,
        target: &str,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Resp, Failed> {
        let unreachable = |e: String, unsent: bool| Failed {
            error: RpcError::new(
                Code::Unavailable,
                format!("cannot reach {}: {e}", self.base),
            ),
            unsent,
        };
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            self.sender = None;
            self.sender = Some(self.connect().await.map_err(|e| unreachable(e, false))?);
        }
        let Some(sender) = self.sender.as_mut() else {
            return Err(unreachable("no connection".into(), false));
        };
        let req = Request::post(target)
            .header(header::HOST, &self.authority)
            .header(header::CONTENT_TYPE, "application/proto")
            .header("connect-protocol-version", "1")
            .header("connect-timeout-ms", timeout.as_millis().to_string())
            .body(Full::new(body))
            .map_err(|e| Failed {
                error: RpcError::invalid(format!("request to {}: {e}", self.base)),
                unsent: false,
            })?;
        let resp = match sender.try_send_request(req).await {
            Ok(resp) => resp,
            Err(mut e) => {
                let unsent = e.take_message().is_some();
                return Err(unreachable(root_cause(e.error()), unsent));
            }
        };
        let (parts, body) = resp.into_parts();
        let bytes = Limited::new(body, MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| Failed {
                error: RpcError::new(
                    Code::Unavailable,
                    format!("reading response from {}: {e}", self.base),
                ),
                unsent: false,
            })?
            .to_bytes();
        let url = format!("{}{path}", self.base);
        answer(&url, parts.status, &parts.headers, &bytes).map_err(|error| Failed {
            error,
            unsent: false,
        })
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(&self.authority),
        )
        .await
        .map_err(|_| format!("connecting took over {} s", CONNECT_TIMEOUT.as_secs()))?
        .map_err(|e| e.to_string())?;
        // Small requests and answers, each awaited: no batching delay.
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| root_cause(&e))?;
        // Ends when the sender is dropped (or the peer closes): the connection closes with it.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::ConnectInfo;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    /// A server at `/<prefix>/{service}/{method}` that notes each call's client port and answers
    /// 200 with an empty message (after `delay`), or 400 when the request is not Connect's
    /// unary protobuf; with `close`, it closes each connection after its answer.
    async fn server(prefix: &str, close: bool, delay: Duration) -> (String, Arc<Mutex<Vec<u16>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}{prefix}", listener.local_addr().expect("addr"));
        let ports = Arc::new(Mutex::new(Vec::new()));
        let seen = ports.clone();
        let app = axum::Router::new().route(
            &format!("{prefix}/{{service}}/{{method}}"),
            post(
                move |ConnectInfo(peer): ConnectInfo<SocketAddr>, headers: HeaderMap| {
                    let seen = seen.clone();
                    async move {
                        seen.lock().expect("lock").push(peer.port());
                        tokio::time::sleep(delay).await;
                        let connect = headers.get("content-type").map(|v| v.as_bytes())
                            == Some(b"application/proto")
                            && headers.contains_key("connect-protocol-version");
                        let status = if connect {
                            StatusCode::OK
                        } else {
                            StatusCode::BAD_REQUEST
                        };
                        let conn = if close { "close" } else { "keep-alive" };
                        (status, [("connection", conn)], "")
                    }
                },
            ),
        );
        tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            let _ = axum::serve(listener, app).await;
        });
        (url, ports)
    }

    async fn call(ch: &mut Channel, timeout: Duration) -> Result<(), RpcError> {
        ch.call::<(), ()>("s.S", "M", &(), timeout).await
    }

    #[tokio::test]
    async fn a_channel_keeps_its_connection_and_opens_another_once_the_peer_closed_it() {
        let second = Duration::from_secs(10);
        let (url, ports) = server("/api", false, Duration::ZERO).await;
        let mut ch = Channel::new(&format!("{url}/")).expect("an http URL");
        for _ in 0..3 {
            call(&mut ch, second).await.expect("answered");
        }
        let seen = ports.lock().expect("lock").clone();
        assert_eq!(seen.len(), 3);
        assert!(
            seen.iter().all(|p| *p == seen[0]),
            "one connection: {seen:?}"
        );

        let (url, ports) = server("", true, Duration::ZERO).await;
        let mut ch = Channel::new(&url).expect("an http URL");
        for _ in 0..3 {
            call(&mut ch, second)
                .await
                .expect("answered on a new connection");
        }
        let mut seen = ports.lock().expect("lock").clone();
        seen.dedup();
        assert_eq!(seen.len(), 3, "a connection per call: {seen:?}");
    }

    #[tokio::test]
    async fn a_channel_says_when_its_peer_is_unreachable_or_too_slow() {
        assert!(
            Channel::new("https://127.0.0.1:1").is_none(),
            "TLS needs Client"
        );
        assert!(Channel::new("not a url").is_none());

        let gone = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", gone.local_addr().expect("addr"));
        drop(gone);
        let mut ch = Channel::new(&url).expect("an http URL");
        let e = call(&mut ch, Duration::from_secs(10))
            .await
            .expect_err("nothing listens");
        assert_eq!(e.code, Code::Unavailable);
        assert!(
            e.message.starts_with(&format!("cannot reach {url}")),
            "{}",
            e.message
        );

        let (url, _) = server("", false, Duration::from_secs(5)).await;
        let mut ch = Channel::new(&url).expect("an http URL");
        let e = call(&mut ch, Duration::from_millis(200))
            .await
            .expect_err("the answer comes too late");
        assert_eq!(e.code, Code::DeadlineExceeded);
        assert_eq!(e.message, format!("no answer from {url} within 200 ms"));
    }
}
