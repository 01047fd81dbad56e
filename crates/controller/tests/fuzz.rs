//! Fuzzing the input path: random and mutated bytes, with every content type and encoding the
//! Connect layer knows (and some it does not), through `iris_rpc::decode` and through the
//! controller's router (decode → LaunchJob validation → admission), in process.
//!
//! Properties: nothing panics; every refusal is a Connect error (a known code, a message, JSON
//! with Connect's HTTP status); an accepted request got HTTP 200.
//!
//! The long campaign is an ignored test:
//! `IRIS_FUZZ_CASES=1000000 cargo test --release -p iris-controller --test fuzz -- --ignored --nocapture`.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request};
use iris_controller::{Controller, ControllerConfig};
use iris_proto::cluster::controller as c;
use iris_proto::job;
use iris_rpc::Code;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use prost::Message;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;
use tower::ServiceExt;

const CONTENT_TYPES: &[&str] = &[
    "application/proto",
    "application/json",
    "application/protobuf",
    "application/x-protobuf",
    "application/json; charset=utf-8",
    "text/plain",
    "",
];
const ENCODINGS: &[&str] = &["", "identity", "gzip", "zstd", "br"];
const METHODS: &[&str] = &[
    "/iris.cluster.ControllerService/LaunchJob",
    "/iris.cluster.ControllerService/LaunchJob",
    "/iris.cluster.ControllerService/LaunchJob",
    "/iris.cluster.ControllerService/GetJobStatus",
    "/iris.cluster.ControllerService/ListJobs",
    "/iris.cluster.ControllerService/GetJobState",
    "/iris.cluster.ControllerService/ListTasks",
    "/iris.cluster.ControllerService/KickTasks",
    "/finelog.logging.LogService/FetchLogs",
];
const CODES: &[&str] = &[
    "canceled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
];

/// Valid requests to mutate: protobuf and proto-JSON LaunchJobs exercising most fields.
fn seeds() -> Vec<(bool, Vec<u8>)> {
    let full = c::LaunchJobRequest {
        name: Some("/u/seed".into()),
        entrypoint: Some(job::RuntimeEntrypoint {
            run_command: Some(job::CommandEntrypoint {
                argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            }),
            ..Default::default()
        }),
        resources: Some(job::ResourceSpecProto {
            cpu_millicores: 500,
            memory_bytes: 1 << 30,
            disk_bytes: 1 << 30,
            device: Some(job::DeviceConfig {
                device: Some(job::device_config::Device::Gpu(job::GpuDevice {
                    variant: "H100".into(),
                    count: 8,
                })),
            }),
        }),
        environment: Some(job::EnvironmentConfig {
            env_vars: [("A".to_string(), "b".to_string())].into_iter().collect(),
            ..Default::default()
        }),
        replicas: Some(4),
        max_retries_failure: Some(2),
        max_retries_preemption: Some(0),
        coscheduling: Some(job::CoschedulingConfig {
            group_by: "pool".into(),
        }),
        constraints: vec![job::Constraint {
            key: Some("region".into()),
            op: Some(8),
            values: vec![job::AttributeValue {
                value: Some(job::attribute_value::Value::StringValue("us".into())),
            }],
            ..Default::default()
        }],
        timeout: Some(iris_proto::time::Duration { milliseconds: 1000 }),
        scheduling_timeout: Some(iris_proto::time::Duration { milliseconds: 5 }),
        priority_band: Some(3),
        bundle_blob: Some(b"PK\x05\x06not really a zip".to_vec()),
        ports: vec!["http".into()],
        ..Default::default()
    };
    let small = c::LaunchJobRequest {
        name: Some("/u/small".into()),
        entrypoint: full.entrypoint.clone(),
        ..Default::default()
    };
    let mut out = Vec::new();
    for r in [&full, &small] {
        out.push((false, r.encode_to_vec()));
        out.push((true, serde_json::to_vec(r).expect("json")));
    }
    out.push((
        true,
        br#"{"jobId": "/u/seed", "query": {"stateFilter": "running", "limit": 5}, "source": "/u/", "matchScope": 3, "regex": "a+", "targets": ["/u/seed/0:0"], "desiredState": 10}"#
            .to_vec(),
    ));
    out
}

#[derive(Clone, Debug)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
}

fn mutate(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let n = b.len().max(1);
        match m {
            Mutation::Set(i, v) => {
                if !b.is_empty() {
                    let i = i % n;
                    b[i] = *v;
                }
            }
            Mutation::Insert(i, bytes) => {
                let i = i % (b.len() + 1);
                b.splice(i..i, bytes.iter().copied());
            }
            Mutation::Delete(i, len) => {
                if !b.is_empty() {
                    let i = i % n;
                    let end = (i + len).min(b.len());
                    b.drain(i..end);
                }
            }
            Mutation::Truncate(i) => b.truncate(i % n),
        }
    }
    b
}

#[derive(Clone, Debug)]
struct Input {
    path: &'static str,
    content_type: &'static str,
    encoding: &'static str,
    /// Compress the body with `encoding` (when it is gzip or zstd) so the decoder reaches it.
    compress: bool,
    body: Vec<u8>,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, v)| Mutation::Set(i, v)),
        2 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (any::<usize>(), 1usize..16).prop_map(|(i, l)| Mutation::Delete(i, l)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn input() -> impl Strategy<Value = Input> {
    let seeds = seeds();
    let body = prop_oneof![
        2 => prop::collection::vec(any::<u8>(), 0..300),
        5 => (0..seeds.len(), prop::collection::vec(mutation(), 0..6)).prop_map(move |(i, m)| {
            mutate(seeds[i].1.clone(), &m)
        }),
    ];
    (
        prop::sample::select(METHODS),
        prop::sample::select(CONTENT_TYPES),
        prop::sample::select(ENCODINGS),
        any::<bool>(),
        body,
    )
        .prop_map(|(path, content_type, encoding, compress, body)| Input {
            path,
            content_type,
            encoding,
            compress,
            body,
        })
}

fn encode_body(i: &Input) -> Vec<u8> {
    if !i.compress {
        return i.body.clone();
    }
    match i.encoding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&i.body).expect("gzip");
            e.finish().expect("gzip")
        }
        "zstd" => zstd::encode_all(i.body.as_slice(), 1).expect("zstd"),
        _ => i.body.clone(),
    }
}

fn headers(i: &Input) -> HeaderMap {
    let mut h = HeaderMap::new();
    if !i.content_type.is_empty() {
        h.insert("content-type", HeaderValue::from_static(i.content_type));
    }
    if !i.encoding.is_empty() {
        h.insert("content-encoding", HeaderValue::from_static(i.encoding));
    }
    h
}

/// `iris_rpc::decode` alone: Ok, or an error with a known code.
fn check_decode(i: &Input) -> Result<(), TestCaseError> {
    let body = encode_body(i);
    match iris_rpc::decode::<c::LaunchJobRequest>(&headers(i), &body) {
        Ok(_) => Ok(()),
        Err(e) => {
            prop_assert!(CODES.contains(&e.code.as_str()));
            prop_assert!(!e.message.is_empty());
            prop_assert!(
                e.code != Code::Internal,
                "decode reported internal: {}",
                e.message
            );
            Ok(())
        }
    }
}

/// The router in process: 200, or a Connect JSON error with a matching HTTP status.
async fn check_router(app: &axum::Router, i: &Input) -> Result<bool, TestCaseError> {
    let mut rb = Request::builder().method("POST").uri(i.path);
    for (k, v) in headers(i).iter() {
        rb = rb.header(k, v);
    }
    let req = rb.body(Body::from(encode_body(i))).expect("request");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .expect("response body");
    if status.is_success() {
        return Ok(true);
    }
    prop_assert_eq!(ct.as_str(), "application/json");
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| TestCaseError::fail(format!("error body is not JSON: {e}")))?;
    let code = v["code"].as_str().unwrap_or("");
    prop_assert!(CODES.contains(&code), "unknown code in {}", v);
    prop_assert!(
        v["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        v
    );
    prop_assert_eq!(Code::parse(code).http_status(), status, "{}", v);
    prop_assert!(code != "internal", "internal error for fuzzed input: {}", v);
    Ok(false)
}

struct Fixture {
    _dir: tempfile::TempDir,
    _ctl: Arc<Controller>,
    app: axum::Router,
    rt: tokio::runtime::Runtime,
}

fn fixture() -> Fixture {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = {
        let _g = rt.enter();
        Controller::open(ControllerConfig::local(dir.path().to_path_buf())).expect("open")
    };
    let app = iris_controller::router(ctl.clone());
    Fixture {
        _dir: dir,
        _ctl: ctl,
        app,
        rt,
    }
}

fn run(cases: u32) -> (u64, u64, std::time::Duration) {
    let f = fixture();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let accepted = std::cell::Cell::new(0u64);
    let total = std::cell::Cell::new(0u64);
    let started = Instant::now();
    let res = runner.run(&input(), |i| {
        total.set(total.get() + 1);
        check_decode(&i)?;
        if f.rt.block_on(check_router(&f.app, &i))? {
            accepted.set(accepted.get() + 1);
        }
        Ok(())
    });
    if let Err(e) = res {
        panic!("fuzzing found a failure: {e}");
    }
    (total.get(), accepted.get(), started.elapsed())
}

#[test]
fn fuzzed_requests_never_panic_and_errors_are_connect_errors() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let (n, accepted, took) = run(cases);
    eprintln!("{n} fuzzed requests ({accepted} accepted) in {took:?}");
    assert!(n >= cases as u64);
}

#[test]
#[ignore]
fn fuzz_campaign() {
    let cases = std::env::var("IRIS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let (n, accepted, took) = run(cases);
    println!(
        "fuzz campaign: {n} inputs ({accepted} accepted as valid) through decode + router in {:.1} s ({:.0} inputs/s), no failures",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
}
