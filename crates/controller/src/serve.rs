//! The controller's HTTP server loop, with the limits the failure model states (ARCHITECTURE.md,
//! "Failure model", slow and hostile clients):
//!
//! - at most [`MAX_CONNECTIONS`] connections at once; past that, new ones wait in the kernel's
//!   accept backlog until one closes (nothing already accepted is dropped);
//! - a request's head must arrive within [`HEADER_READ_TIMEOUT`] of the connection opening or
//!   of the previous response, so stalled (slowloris) or idle HTTP/1 connections are closed;
//! - request bodies are capped at `iris_rpc::MAX_BODY_BYTES` (see `limits`); unary answers are
//!   capped by their RPCs (`FetchLogs`: 100,000 lines), so a client that stops reading holds one
//!   answer, and `/proxy` streams with the transport's flow control.
//!
//! `axum::serve` exposes none of hyper's connection settings, hence this loop; the pieces are
//! hyper-util's (auto HTTP/1+2 builder, graceful shutdown tracker).

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

/// Connections served at once.
pub(crate) const MAX_CONNECTIONS: usize = 16_384;
/// How long a connection may take to send a request head.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// On shutdown, how long open connections get to finish their requests.
const DRAIN: Duration = Duration::from_secs(3);

pub(crate) async fn serve(listener: TcpListener, app: Router, shutdown: watch::Receiver<bool>) {
    serve_with(
        listener,
        app,
        shutdown,
        MAX_CONNECTIONS,
        HEADER_READ_TIMEOUT,
    )
    .await
}

async fn serve_with(
    listener: TcpListener,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
    max_connections: usize,
    header_read_timeout: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(max_connections));
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stopped(&mut shutdown) => break,
        };
        let (stream, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors or similar: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let svc =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(remote));
                app.clone().oneshot(req)
            });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        // Owned by the graceful tracker: ends with its connection.
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(DRAIN) => {}
    }
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn server(max: usize, head_timeout: Duration) -> (String, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (tx, rx) = watch::channel(false);
        tokio::spawn(serve_with(listener, app, rx, max, head_timeout));
        (addr, tx)
    }

    async fn get(s: &mut TcpStream) -> String {
        s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("write");
        let mut buf = vec![0u8; 1024];
        let n = s.read(&mut buf).await.expect("read");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn a_stalled_request_head_is_cut_off_and_others_are_served() {
        let (addr, _stop) = server(16, Duration::from_millis(300)).await;
        let mut slow = TcpStream::connect(&addr).await.expect("connect");
        slow.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n")
            .await
            .expect("write");
        let mut ok = TcpStream::connect(&addr).await.expect("connect");
        assert!(get(&mut ok).await.ends_with("ok"));
        // The stalled one is answered 408 or closed once its head is overdue.
        let mut buf = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut buf))
            .await
            .expect("the server closes a stalled connection")
            .expect("read");
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "{text}");
    }

    #[tokio::test]
    async fn past_the_connection_cap_new_connections_wait_for_a_free_slot() {
        let (addr, _stop) = server(2, Duration::from_secs(60)).await;
        let mut a = TcpStream::connect(&addr).await.expect("connect");
        let mut b = TcpStream::connect(&addr).await.expect("connect");
        assert!(get(&mut a).await.ends_with("ok"));
        assert!(get(&mut b).await.ends_with("ok"));
        // The kernel accepts the third, but the server does not serve it while both slots are held.
        let mut c = TcpStream::connect(&addr).await.expect("connect");
        c.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 256];
        assert!(
            tokio::time::timeout(Duration::from_millis(300), c.read(&mut buf))
                .await
                .is_err(),
            "served past the cap"
        );
        drop(a);
        let n = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf))
            .await
            .expect("served once a slot is free")
            .expect("read");
        assert!(String::from_utf8_lossy(&buf[..n]).ends_with("ok"));
    }
}
