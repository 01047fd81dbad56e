//! `/proxy` as a protocol: HTTP/2 (h2c) goes upstream as HTTP/2 and HTTP/1.1 as HTTP/1.1,
//! an upgraded connection (a websocket handshake) is spliced both ways, the per-endpoint
//! timeout answers 504 and a gone endpoint 502, each naming the endpoint. The endpoints are
//! servers in this test process; a task registers them, as a coordinator would.

mod common;

use common::{TestCluster, WorkerSpec};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// Registers each `name=address[@timeout]` for the task, then waits to be cancelled.
fn register_task(eps: &[(&str, String, Option<&str>)]) -> String {
    let mut s = String::from("set -e\n");
    for (name, addr, timeout) in eps {
        let meta = timeout
            .map(|t| format!(",\\\"metadata\\\":{{\\\"proxy_timeout_seconds\\\":\\\"{t}\\\"}}"))
            .unwrap_or_default();
        s.push_str(&common::register_endpoint_sh(name, addr, &meta));
    }
    s.push_str("echo registered\nsleep 600\n");
    s
}

/// An HTTP/1.1 + h2c server answering with the protocol version it was spoken to in.
fn start_version_server(rt: &tokio::runtime::Runtime) -> String {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new().route(
        "/{*path}",
        axum::routing::any(|req: axum::extract::Request| async move {
            format!(
                "{:?} {} prefix={}",
                req.version(),
                req.uri().path_and_query().map(|p| p.as_str()).unwrap_or(""),
                req.headers()
                    .get("x-forwarded-prefix")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
            )
        }),
    );
    // Owned by the runtime: stops when the test drops it.
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr.to_string()
}

/// Answers an upgrade handshake with 101 and then echoes bytes back.
fn start_upgrade_echo() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().expect("clone"));
                let mut line = String::new();
                while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                    if line.ends_with("\r\n\r\n") || line == "\r\n" {
                        break;
                    }
                    if line.ends_with("\r\n") {
                        line.clear();
                    }
                }
                let mut w = conn;
                let _ = w.write_all(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
                );
                let mut buf = [0u8; 1024];
                while let Ok(n) = r.read(&mut buf) {
                    if n == 0 || w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Accepts connections and never answers.
fn start_silent() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    (l, addr)
}

#[test]
fn proxy_speaks_http2_upgrades_and_names_failures() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let versions = start_version_server(&rt);
    let echo = start_upgrade_echo();
    let (silent_listener, silent) = start_silent();
    // A port nothing listens on any more.
    let gone = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .to_string();
    let c = TestCluster::start(&[WorkerSpec::cpu(2)]);
    let script = register_task(&[
        ("/u/px/ver", versions, None),
        ("/u/px/ws", echo, None),
        ("/u/px/slow", silent, Some("1")),
        ("/u/px/gone", gone, None),
    ]);
    c.submit("px", &[], &["sh", "-c", &script]);
    common::wait_for(Duration::from_secs(60), "the endpoints", || {
        let o = c.iris(&["endpoints", "list", "/u/px/"]);
        (o.stdout.matches("/u/px/").count() >= 8).then_some(())
    });

    rt.block_on(async {
        let h2 = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .expect("client");
        let r = h2
            .get(format!("{}/proxy/u.px.ver/a/b?q=1", c.url))
            .send()
            .await
            .expect("h2 request");
        assert_eq!(r.version(), reqwest::Version::HTTP_2);
        let body = r.text().await.expect("body");
        assert_eq!(body, "HTTP/2.0 /a/b?q=1 prefix=/proxy/u.px.ver", "{body}");
        let h1 = reqwest::Client::builder()
            .http1_only()
            .build()
            .expect("client");
        let body = h1
            .get(format!("{}/proxy/u.px.ver/x", c.url))
            .send()
            .await
            .expect("h1 request")
            .text()
            .await
            .expect("body");
        assert!(body.starts_with("HTTP/1.1 /x "), "{body}");

        let t0 = std::time::Instant::now();
        let r = h1
            .get(format!("{}/proxy/u.px.slow/", c.url))
            .send()
            .await
            .expect("slow");
        assert_eq!(r.status(), 504);
        let body = r.text().await.expect("body");
        assert!(
            body.contains("/u/px/slow") && body.contains("proxy_timeout_seconds"),
            "{body}"
        );
        assert!(t0.elapsed() < Duration::from_secs(60));
        let r = h1
            .get(format!("{}/proxy/u.px.gone/", c.url))
            .send()
            .await
            .expect("gone");
        assert_eq!(r.status(), 502);
        let body = r.text().await.expect("body");
        assert!(body.contains("/u/px/gone"), "{body}");
    });
    drop(silent_listener);

    // An upgrade: the handshake goes through, then bytes flow both ways on the same connection.
    let hostport = c.url.trim_start_matches("http://");
    let mut s = TcpStream::connect(hostport).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        s,
        "GET /proxy/u.px.ws/socket HTTP/1.1\r\nHost: {hostport}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .expect("handshake");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut status = String::new();
    r.read_line(&mut status).expect("status");
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    let mut line = String::new();
    while r.read_line(&mut line).expect("header") > 0 && line != "\r\n" {
        line.clear();
    }
    for msg in ["ping", "a second message"] {
        s.write_all(msg.as_bytes()).expect("send");
        let mut got = vec![0u8; msg.len()];
        r.read_exact(&mut got).expect("echo");
        assert_eq!(String::from_utf8_lossy(&got), msg);
    }
}
