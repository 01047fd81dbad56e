//! The kubelet's port-forward endpoint for the node agent: `/portForward/{namespace}/{pod}`,
//! where the real API server sends `pods/portforward` (and so `kubectl port-forward`). The
//! connection is upgraded to SPDY/3.1 with the `portforward.k8s.io` stream protocol: for each
//! forwarded connection the client opens an `error` stream and a `data` stream that share a
//! `requestid` and name the `port`; the agent connects to that port on 127.0.0.1 (its pods'
//! processes share the host's network) and copies bytes both ways, writing a failure to
//! connect on the error stream, as the kubelet does.
//!
//! SPDY is written by hand: it was superseded by HTTP/2 and no maintained Rust crate speaks it.
//! Only what the Kubernetes client side sends is needed: SYN_STREAM / SYN_REPLY with zlib
//! header blocks (one compression context per direction for the whole session, primed with the
//! protocol's dictionary), DATA with FIN, RST_STREAM, PING and GOAWAY. Flow control frames are
//! read and ignored, as Kubernetes' own SPDY library does.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::spdy_dictionary::HEADER_DICTIONARY;

/// The only stream protocol offered (`X-Stream-Protocol-Version`).
const PROTOCOL: &str = "portforward.k8s.io";
const SPDY_VERSION: u16 = 3;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const FLAG_FIN: u8 = 0x01;
/// RST_STREAM status: the stream is refused (bad headers).
const REFUSED_STREAM: u32 = 3;
/// The largest data frame the agent writes.
const CHUNK: usize = 32 * 1024;

/// Which pods the endpoint may forward to: it answers only for pods this agent runs.
pub(crate) trait PodLookup: Clone + Send + Sync + 'static {
    fn runs(&self, namespace: &str, pod: &str) -> bool;
}

/// The upgrade handler. `GET` or `POST`, as the API server passes on the client's method.
pub(crate) async fn port_forward<L: PodLookup>(
    UrlPath((ns, pod)): UrlPath<(String, String)>,
    State(lookup): State<L>,
    mut req: Request,
) -> Response {
    if !lookup.runs(&ns, &pod) {
        return (
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{pod} is not running on this node"),
        )
            .into_response();
    }
    let offered: Vec<String> = req
        .headers()
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|p| p.trim().to_string()))
        .collect();
    if !offered.is_empty() && !offered.iter().any(|p| p == PROTOCOL) {
        return (
            StatusCode::FORBIDDEN,
            format!(
                "unable to upgrade: no common stream protocol (offered: {}; supported: {PROTOCOL})",
                offered.join(", ")
            ),
        )
            .into_response();
    }
    let upgrades_to_spdy = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("SPDY/3.1"));
    if !upgrades_to_spdy {
        return (
            StatusCode::BAD_REQUEST,
            "port-forward needs `Upgrade: SPDY/3.1`".to_string(),
        )
            .into_response();
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => serve_session(TokioIo::new(io)).await,
            Err(e) => tracing::debug!(error = %e, "node agent port-forward: upgrade failed"),
        }
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    if !offered.is_empty() {
        h.insert(
            "x-stream-protocol-version",
            HeaderValue::from_static(PROTOCOL),
        );
    }
    resp
}

/// One forwarded connection's two streams, as they arrive.
#[derive(Default)]
struct Pair {
    error: Option<u32>,
    data: Option<(u32, u16, mpsc::UnboundedReceiver<Vec<u8>>)>,
}

/// Runs one SPDY session until the client goes away.
async fn serve_session<S: AsyncRead + AsyncWrite + Send + 'static>(io: S) {
    let (rd, mut wr) = tokio::io::split(io);
    let (out, mut frames) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(frame) = frames.recv().await {
            if wr.write_all(&frame).await.is_err() || wr.flush().await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    });
    if let Err(e) = read_session(BufReader::new(rd), out).await {
        tracing::debug!(error = %e, "node agent port-forward: session ended");
    }
    let _ = writer.await;
}

async fn read_session<R: AsyncRead + Unpin>(
    mut rd: R,
    out: mpsc::UnboundedSender<Vec<u8>>,
) -> std::io::Result<()> {
    let mut codec = HeaderCodec::new();
    // Client data for each open stream, by stream id; dropping a sender ends that direction.
    let mut inbound: HashMap<u32, mpsc::UnboundedSender<Vec<u8>>> = HashMap::new();
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    loop {
        let mut head = [0u8; 8];
        match rd.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let word = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let flags = head[4];
        let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        let mut payload = vec![0u8; len];
        rd.read_exact(&mut payload).await?;
        if word & 0x8000_0000 == 0 {
            let id = word & 0x7fff_ffff;
            if let Some(tx) = inbound.get(&id) {
                if !payload.is_empty() {
                    let _ = tx.send(payload);
                }
            }
            if flags & FLAG_FIN != 0 {
                inbound.remove(&id);
            }
            continue;
        }
        let version = ((word >> 16) & 0x7fff) as u16;
        if version != SPDY_VERSION {
            return Err(std::io::Error::other(format!(
                "SPDY version {version} (only {SPDY_VERSION} is spoken)"
            )));
        }
        match (word & 0xffff) as u16 {
            SYN_STREAM => {
                if payload.len() < 10 {
                    return Err(std::io::Error::other("short SYN_STREAM"));
                }
                let id = be32(&payload[0..4]) & 0x7fff_ffff;
                let headers = codec.decode(&payload[10..])?;
                let _ = out.send(codec.syn_reply(id)?);
                let (tx, rx) = mpsc::unbounded_channel();
                if flags & FLAG_FIN == 0 {
                    inbound.insert(id, tx);
                }
                match classify(id, &headers) {
                    Err(why) => {
                        tracing::debug!(stream = id, "node agent port-forward: {why}");
                        let _ = out.send(rst_stream(id, REFUSED_STREAM));
                        inbound.remove(&id);
                    }
                    Ok((request, Kind::Error)) => {
                        let p = pairs.entry(request.clone()).or_default();
                        p.error = Some(id);
                        start_if_complete(&mut pairs, &request, &out);
                    }
                    Ok((request, Kind::Data(port))) => {
                        let p = pairs.entry(request.clone()).or_default();
                        p.data = Some((id, port, rx));
                        start_if_complete(&mut pairs, &request, &out);
                    }
                }
            }
            RST_STREAM if payload.len() >= 4 => {
                inbound.remove(&(be32(&payload[0..4]) & 0x7fff_ffff));
            }
            PING => {
                let _ = out.send(control(PING, 0, &payload));
            }
            GOAWAY => return Ok(()),
            // Its header block must pass through the decompressor to keep the shared context
            // in step, though nothing in it matters here.
            HEADERS if payload.len() >= 4 => {
                codec.decode(&payload[4..])?;
            }
            // SETTINGS, WINDOW_UPDATE, and anything else: nothing to do.
            _ => {}
        }
    }
}

enum Kind {
    Error,
    Data(u16),
}

/// A new stream's request id and role, from its headers (names arrive lower-cased). Without a
/// `requestid`, the id is derived from the stream ids as older clients expect (error stream n,
/// data stream n + 2).
fn classify(id: u32, headers: &HashMap<String, String>) -> Result<(String, Kind), String> {
    let port = headers.get("port").ok_or("the `port` header is required")?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("port {port:?} is not a port number between 1 and 65535"))?;
    let kind = match headers.get("streamtype").map(String::as_str) {
        Some("error") => Kind::Error,
        Some("data") => Kind::Data(port),
        Some(other) => return Err(format!("stream type {other:?} is neither error nor data")),
        None => return Err("the `streamType` header is required".into()),
    };
    let request = match (headers.get("requestid"), &kind) {
        (Some(r), _) => r.clone(),
        (None, Kind::Error) => id.to_string(),
        (None, Kind::Data(_)) => id.saturating_sub(2).to_string(),
    };
    Ok((request, kind))
}

fn start_if_complete(
    pairs: &mut HashMap<String, Pair>,
    request: &str,
    out: &mpsc::UnboundedSender<Vec<u8>>,
) {
    let complete = pairs
        .get(request)
        .is_some_and(|p| p.error.is_some() && p.data.is_some());
    if !complete {
        return;
    }
    let Some(Pair {
        error: Some(error),
        data: Some((data, port, rx)),
    }) = pairs.remove(request)
    else {
        return;
    };
    tokio::spawn(forward(port, data, error, rx, out.clone()));
}

/// Copies one forwarded connection: client bytes into 127.0.0.1:port (its write side shut when
/// the client half-closes), the port's bytes back as data frames, FIN on both streams at the end.
async fn forward(
    port: u16,
    data: u32,
    error: u32,
    mut inbound: mpsc::UnboundedReceiver<Vec<u8>>,
    out: mpsc::UnboundedSender<Vec<u8>>,
) {
    let tcp = match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(t) => t,
        Err(e) => {
            let msg = format!("error forwarding port {port}: connecting to 127.0.0.1:{port}: {e}");
            let _ = out.send(data_frame(error, 0, msg.as_bytes()));
            let _ = out.send(data_frame(error, FLAG_FIN, &[]));
            let _ = out.send(rst_stream(data, REFUSED_STREAM));
            return;
        }
    };
    let (mut from_pod, mut to_pod) = tcp.into_split();
    let up = async move {
        while let Some(bytes) = inbound.recv().await {
            if to_pod.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to_pod.shutdown().await;
    };
    let down_out = out.clone();
    let down = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from_pod.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if down_out.send(data_frame(data, 0, &buf[..n])).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = down_out.send(data_frame(data, FLAG_FIN, &[]));
    };
    tokio::join!(up, down);
    let _ = out.send(data_frame(error, FLAG_FIN, &[]));
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(0x8000 | SPDY_VERSION).to_be_bytes());
    f.extend_from_slice(&kind.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

fn data_frame(id: u32, flags: u8, bytes: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + bytes.len());
    f.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(bytes.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(bytes);
    f
}

fn rst_stream(id: u32, status: u32) -> Vec<u8> {
    let mut p = id.to_be_bytes().to_vec();
    p.extend_from_slice(&status.to_be_bytes());
    control(RST_STREAM, 0, &p)
}

/// The session's two zlib contexts: header blocks are compressed as one stream per direction,
/// each flushed at the end of its block.
struct HeaderCodec {
    inflate: Decompress,
    deflate: Compress,
}

impl HeaderCodec {
    fn new() -> Self {
        let mut deflate = Compress::new(Compression::default(), true);
        // Priming a fresh compressor cannot fail.
        let _ = deflate.set_dictionary(&HEADER_DICTIONARY);
        HeaderCodec {
            inflate: Decompress::new(true),
            deflate,
        }
    }

    /// Decompresses one header block and parses its name/value pairs (a value holding several
    /// NUL-separated values keeps the first).
    fn decode(&mut self, block: &[u8]) -> std::io::Result<HashMap<String, String>> {
        let mut plain = Vec::with_capacity(block.len() * 4 + 64);
        let mut input = block;
        loop {
            let before_in = self.inflate.total_in();
            let before_out = plain.len();
            let r = self
                .inflate
                .decompress_vec(input, &mut plain, FlushDecompress::Sync);
            let used = (self.inflate.total_in() - before_in) as usize;
            input = &input[used..];
            match r {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(&HEADER_DICTIONARY)
                        .map_err(std::io::Error::other)?;
                    continue;
                }
                Err(e) => return Err(std::io::Error::other(format!("header block: {e}"))),
            }
            let full = plain.len() == plain.capacity();
            if input.is_empty() && !full {
                break;
            }
            if used == 0 && plain.len() == before_out && !full {
                return Err(std::io::Error::other("header block: zlib made no progress"));
            }
            plain.reserve(4096);
        }
        parse_pairs(&plain)
    }

    /// A SYN_REPLY for `id` with an empty header block.
    fn syn_reply(&mut self, id: u32) -> std::io::Result<Vec<u8>> {
        let block = self.encode(&0u32.to_be_bytes())?;
        let mut p = (id & 0x7fff_ffff).to_be_bytes().to_vec();
        p.extend_from_slice(&block);
        Ok(control(SYN_REPLY, 0, &p))
    }

    fn encode(&mut self, plain: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(plain.len() + 64);
        let mut input = plain;
        loop {
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(std::io::Error::other)?;
            input = &input[(self.deflate.total_in() - before) as usize..];
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(out);
            }
            out.reserve(256);
        }
    }
}

fn parse_pairs(b: &[u8]) -> std::io::Result<HashMap<String, String>> {
    let short = || std::io::Error::other("header block: truncated");
    let mut at = 0usize;
    let mut take = |n: usize| -> std::io::Result<&[u8]> {
        let s = b.get(at..at + n).ok_or_else(short)?;
        at += n;
        Ok(s)
    };
    let count = be32(take(4)?);
    let mut headers = HashMap::new();
    for _ in 0..count {
        let n = be32(take(4)?) as usize;
        let name = String::from_utf8_lossy(take(n)?).to_ascii_lowercase();
        let n = be32(take(4)?) as usize;
        let value = String::from_utf8_lossy(take(n)?);
        let first = value.split('\0').next().unwrap_or_default().to_string();
        headers.insert(name, first);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut b = (pairs.len() as u32).to_be_bytes().to_vec();
        for (k, v) in pairs {
            b.extend_from_slice(&(k.len() as u32).to_be_bytes());
            b.extend_from_slice(k.as_bytes());
            b.extend_from_slice(&(v.len() as u32).to_be_bytes());
            b.extend_from_slice(v.as_bytes());
        }
        b
    }

    #[test]
    fn header_blocks_round_trip_through_one_shared_context_each_way() {
        // A client's compressor and our decompressor (and the reverse) keep one context for
        // the session: the second block only decodes if the first went through the same one.
        let mut client = HeaderCodec::new();
        let mut server = HeaderCodec::new();
        for (i, stream) in ["error", "data", "error", "data"].iter().enumerate() {
            let plain = block(&[
                ("streamtype", stream),
                ("port", "8080"),
                ("requestid", &(i / 2).to_string()),
            ]);
            let wire = client.encode(&plain).expect("encode");
            let h = server.decode(&wire).expect("decode");
            assert_eq!(h["streamtype"], *stream);
            assert_eq!(h["requestid"], (i / 2).to_string());
        }
        let reply = server.syn_reply(7).expect("reply");
        assert_eq!(&reply[..4], &[0x80, 0x03, 0x00, 0x02]);
        assert_eq!(be32(&reply[8..12]), 7);
        assert!(client
            .decode(&reply[12..])
            .expect("decode reply")
            .is_empty());
    }

    #[test]
    fn streams_are_classified_with_the_kubelets_defaults_and_refusals() {
        let h = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let (r, k) = classify(5, &h(&[("port", "80"), ("streamtype", "data")])).expect("data");
        assert_eq!(r, "3");
        assert!(matches!(k, Kind::Data(80)));
        let (r, _) = classify(1, &h(&[("port", "80"), ("streamtype", "error")])).expect("err");
        assert_eq!(r, "1");
        let e = classify(1, &h(&[("port", "0"), ("streamtype", "data")])).err();
        assert!(e.is_some_and(|e| e.contains("port")));
        let e = classify(1, &h(&[("port", "80")])).err();
        assert!(e.is_some_and(|e| e.contains("streamType")));
    }
}
