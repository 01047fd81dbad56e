//! The kubelet's log endpoint for the node agent: `GET /containerLogs/{namespace}/{pod}/{container}`
//! over HTTPS on the port the test cluster's Node objects advertise
//! (`status.daemonEndpoints.kubeletEndpoint.Port`). The real API server proxies `pods/log` reads
//! here, so `kubectl logs` and the backend's log reads meet the API server's own log path.
//!
//! Supported query parameters, as the kubelet reads them: `tailLines`, `limitBytes` and
//! `follow` (streams until the container has ended). `timestamps` and `previous` are accepted
//! and ignored: the agent keeps no timestamps and never restarts a container.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// Where the agent's kubelet endpoint listens, and the serving certificate it presents (the API
/// server checks it against `--kubelet-certificate-authority`).
#[derive(Debug, Clone)]
pub struct KubeletEndpoint {
    /// Loopback port (the Node objects' `kubeletEndpoint.Port`).
    pub port: u16,
    /// PEM certificate chain, valid for 127.0.0.1.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// One pod's log files: `<root>/<container>.log`, and which containers have ended.
#[derive(Clone)]
pub(crate) struct PodLogs {
    pub(crate) root: PathBuf,
    pub(crate) ended: Arc<Mutex<HashMap<String, crate::node_agent::Ended>>>,
}

/// Pod name → its logs, for the pods of the agent's namespace it ran.
pub(crate) type LogIndex = Arc<Mutex<HashMap<String, PodLogs>>>;

#[derive(Clone)]
struct Served {
    namespace: String,
    index: LogIndex,
}

impl crate::node_portforward::PodLookup for Served {
    fn runs(&self, namespace: &str, pod: &str) -> bool {
        namespace == self.namespace && self.index.lock().is_ok_and(|index| index.contains_key(pod))
    }
}

/// Binds the endpoint and serves it until `stop` changes.
pub(crate) async fn serve(
    ep: &KubeletEndpoint,
    namespace: String,
    index: LogIndex,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let certs = CertificateDer::pem_file_iter(&ep.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| std::io::Error::other(format!("{}: {e}", ep.cert.display())))?;
    let key = PrivateKeyDer::from_pem_file(&ep.key)
        .map_err(|e| std::io::Error::other(format!("{}: {e}", ep.key.display())))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(std::io::Error::other)?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(std::io::Error::other)?;
    let tcp = TcpListener::bind(("127.0.0.1", ep.port)).await?;
    let listener = TlsListener {
        tcp,
        acceptor: TlsAcceptor::from(Arc::new(config)),
    };
    let app = Router::new()
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .route(
            "/portForward/{ns}/{pod}",
            any(crate::node_portforward::port_forward::<Served>),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(Served { namespace, index });
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop.changed().await;
            })
            .await;
    }))
}

/// TCP with a TLS handshake per connection. Hand-written because axum serves any
/// [`axum::serve::Listener`] but ships none for TLS; a failed or slow handshake is dropped and
/// the next connection accepted.
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = match self.tcp.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, "node agent kubelet endpoint: accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let handshake = self.acceptor.accept(stream);
            match tokio::time::timeout(Duration::from_secs(5), handshake).await {
                Ok(Ok(tls)) => return (tls, addr),
                Ok(Err(e)) => tracing::debug!(error = %e, "node agent kubelet endpoint: TLS"),
                Err(_) => tracing::debug!("node agent kubelet endpoint: TLS handshake timed out"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    tail_lines: Option<i64>,
    limit_bytes: Option<i64>,
    follow: Option<bool>,
}

fn refuse(status: StatusCode, msg: String) -> Response {
    (status, msg).into_response()
}

async fn container_logs(
    State(s): State<Served>,
    UrlPath((ns, pod, container)): UrlPath<(String, String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    let found = (ns == s.namespace)
        .then(|| s.index.lock().ok().and_then(|m| m.get(&pod).cloned()))
        .flatten();
    let Some(logs) = found else {
        return refuse(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{pod} is not known to this node"),
        );
    };
    let file = logs.root.join(format!("{container}.log"));
    let text = match tokio::fs::read(&file).await {
        Ok(b) => b,
        Err(_) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("container {container} is not valid for pod {pod}"),
            )
        }
    };
    let mut out = tail(&text, q.tail_lines);
    if let Some(limit) = q.limit_bytes.filter(|n| *n >= 0) {
        out.truncate(limit as usize);
    }
    if !q.follow.unwrap_or(false) {
        return (StatusCode::OK, out).into_response();
    }
    // Follow: what is there now, then what the file grows by until the container has ended.
    let start = text.len() as u64;
    let first = futures::stream::once(async move { Ok::<_, std::io::Error>(out) });
    let rest = futures::stream::unfold(
        (file, start, logs, container, false),
        |(file, pos, logs, container, done)| async move {
            if done {
                return None;
            }
            loop {
                let ended = logs
                    .ended
                    .lock()
                    .map(|e| e.contains_key(&container))
                    .unwrap_or(true);
                match read_from(&file, pos).await {
                    Ok(chunk) if !chunk.is_empty() => {
                        let next = pos + chunk.len() as u64;
                        return Some((Ok(chunk), (file, next, logs, container, false)));
                    }
                    Ok(_) if ended => return None,
                    Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    Err(e) => return Some((Err(e), (file, pos, logs, container, true))),
                }
            }
        },
    );
    use futures::StreamExt;
    (StatusCode::OK, Body::from_stream(first.chain(rest))).into_response()
}

/// The last `n` lines of `text` (all of it when `n` is absent or negative).
fn tail(text: &[u8], n: Option<i64>) -> Vec<u8> {
    let Some(n) = n.filter(|n| *n >= 0) else {
        return text.to_vec();
    };
    if n == 0 {
        return Vec::new();
    }
    // Skip a final newline, then count back `n` line breaks.
    let end = text.len() - usize::from(text.ends_with(b"\n"));
    let mut seen = 0;
    for (i, b) in text[..end].iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return text[i + 1..].to_vec();
            }
        }
    }
    text.to_vec()
}

async fn read_from(file: &Path, pos: u64) -> std::io::Result<Vec<u8>> {
    let mut f = tokio::fs::File::open(file).await?;
    f.seek(std::io::SeekFrom::Start(pos)).await?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).await?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn tail_counts_lines_from_the_end() {
        assert_eq!(tail(b"a\nb\nc\n", Some(2)), b"b\nc\n");
        assert_eq!(tail(b"a\nb\nc", Some(2)), b"b\nc");
        assert_eq!(tail(b"a\nb\n", Some(5)), b"a\nb\n");
        assert_eq!(tail(b"a\nb\n", Some(0)), b"");
        assert_eq!(tail(b"a\nb\n", None), b"a\nb\n");
    }
}
