//! Checkpoints to real object storage: moto's S3 server and gcp-storage-emulator (through
//! `tests/objstore/gcs_emulator.py`), each started by the test on 127.0.0.1 with an ephemeral
//! port and stopped when it ends, from the venv `tests/objstore/setup.sh` creates
//! (`scripts/test-all.sh` runs it first; a missing venv fails these tests).
//!
//! The stores are reached the standard ways: `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` for S3 (no `AWS_ALLOW_HTTP`: an `http://` endpoint allows
//! HTTP), and `GOOGLE_SERVICE_ACCOUNT` naming a service-account JSON whose `gcs_base_url` is the
//! emulator (`disable_oauth: true`) for GCS. Those variables are process-wide and every `iris`
//! process a test starts inherits them, so the tests here take [`ENV`] for their whole run and
//! run one at a time.

mod common;

use common::*;
use iris_controller::checkpoint::{self as cp, RemoteStore};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

static ENV: Mutex<()> = Mutex::new(());

fn env_lock() -> MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|p| p.into_inner())
}

fn venv() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let v = root.join(".venv-objstore");
    assert!(
        v.join(".installed").is_file(),
        "{} is missing: run `bash tests/objstore/setup.sh` (scripts/test-all.sh does)",
        v.display()
    );
    v
}

/// A server process, killed (and reaped) on drop.
struct Server {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `cmd` with its output in a file and waits for `marker URL` in it.
    fn start(mut cmd: Command, marker: &str) -> Server {
        let dir = tempfile::tempdir().expect("server dir");
        let log = dir.path().join("server.log");
        let f = std::fs::File::create(&log).expect("log");
        let mut child = cmd
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("log"))
            .stderr(f)
            .spawn()
            .expect("spawn server");
        let url = wait_for(STARTUP, "the server to print its address", || {
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "server exited: {st}: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            let s = std::fs::read_to_string(&log).ok()?;
            let rest = &s[s.find(marker)? + marker.len()..];
            let url: String = rest
                .chars()
                .take_while(|c| !c.is_whitespace() && !c.is_control())
                .collect();
            url.rsplit(':')
                .next()
                .is_some_and(|p| p.parse::<u16>().is_ok())
                .then_some(url)
        });
        Server {
            child,
            url,
            _dir: dir,
        }
    }

    /// moto's S3 server with a bucket `iris`.
    fn moto() -> Server {
        let mut cmd = Command::new(venv().join("bin/moto_server"));
        cmd.args(["-H", "127.0.0.1", "-p", "0"]);
        let s = Server::start(cmd, "Running on ");
        s.create_bucket("iris");
        s
    }

    /// The GCS emulator with a bucket `iris`.
    fn gcs() -> Server {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/objstore/gcs_emulator.py");
        let mut cmd = Command::new(venv().join("bin/python"));
        cmd.arg(script).arg("iris");
        Server::start(cmd, "listening on ")
    }

    fn create_bucket(&self, name: &str) {
        let (st, body) = http(&self.url, "PUT", &format!("/{name}"));
        assert_eq!(st, 200, "creating bucket {name}: {body}");
    }

    /// Drops every bucket and object (moto's reset).
    fn s3_drop_buckets(&self) {
        let (st, body) = http(&self.url, "POST", "/moto-api/reset");
        assert_eq!(st, 200, "{body}");
    }

    /// Drops every bucket and object (the emulator's wipe).
    fn gcs_drop_buckets(&self) {
        let (st, body) = http(&self.url, "GET", "/wipe");
        assert_eq!(st, 200, "{body}");
    }

    /// Creates a bucket through the GCS JSON API.
    fn gcs_create_bucket(&self, name: &str) {
        let (st, body) = http_with(
            &self.url,
            "POST",
            "/storage/v1/b?project=test",
            &serde_json::json!({ "name": name }).to_string(),
        );
        assert_eq!(st, 200, "creating bucket {name}: {body}");
    }

    fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "kill {sig}");
    }
}

/// A bodiless HTTP/1.1 request; returns the status and body.
fn http(url: &str, method: &str, path: &str) -> (u16, String) {
    http_with(url, method, path, "")
}

/// An HTTP/1.1 request with `body` (sent as JSON); returns the status and body.
fn http_with(url: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let hostport = url.trim_start_matches("http://").trim_end_matches('/');
    let mut s = TcpStream::connect(hostport).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map(|x| x.1.to_string());
    (status, body.unwrap_or_default())
}

const ENV_VARS: &[&str] = &[
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
    "AWS_TIMEOUT",
    "AWS_PROFILE",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_ALLOW_HTTP",
];

/// Points S3 at `endpoint`, as a CoreWeave pod's environment does. Call with [`ENV`] held.
fn s3_env(endpoint: &str, extra: &[(&str, &str)]) {
    for v in ENV_VARS {
        std::env::remove_var(v);
    }
    std::env::set_var("AWS_ENDPOINT_URL", endpoint);
    std::env::set_var("AWS_ACCESS_KEY_ID", "test-key");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test-secret");
    std::env::set_var("AWS_REGION", "us-east-1");
    for (k, v) in extra {
        std::env::set_var(k, v);
    }
}

/// Points GCS at the emulator through a service-account file. Call with [`ENV`] held.
fn gcs_env(dir: &Path, base_url: &str) {
    for v in ENV_VARS {
        std::env::remove_var(v);
    }
    let sa = dir.join("service-account.json");
    let json = serde_json::json!({
        "private_key": "", "private_key_id": "", "client_email": "emulator@example.com",
        "gcs_base_url": base_url, "disable_oauth": true,
    });
    std::fs::write(&sa, json.to_string()).expect("service account");
    std::env::set_var("GOOGLE_SERVICE_ACCOUNT", &sa);
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The remote state dir as the test sees it (same environment as the controller).
struct Remote {
    url: String,
    store: RemoteStore,
    rt: tokio::runtime::Runtime,
}

impl Remote {
    fn new(url: &str) -> Remote {
        Remote {
            url: url.to_string(),
            store: RemoteStore::parse(url).expect("remote store"),
            rt: rt(),
        }
    }
    fn checkpoints(&self) -> Vec<i64> {
        self.rt
            .block_on(self.store.checkpoints())
            .expect("list checkpoints")
    }
    fn rollout(&self) -> Value {
        let rec = self
            .rt
            .block_on(self.store.read_rollout())
            .expect("read rollout")
            .expect("a rollout record");
        serde_json::to_value(rec).expect("record JSON")
    }
    fn manifest(&self, ms: i64) -> Option<cp::Manifest> {
        self.rt
            .block_on(cp::read_manifest(&self.store, ms))
            .expect("manifest")
    }
    fn get(&self, rel: &str) -> Option<Vec<u8>> {
        self.rt.block_on(self.store.get(rel)).expect("get")
    }
    fn put(&self, rel: &str, data: Vec<u8>) {
        self.rt.block_on(self.store.put(rel, data)).expect("put")
    }
    fn data_object(ms: i64) -> String {
        format!("{}/{ms}/{}", cp::STATE_DIR, cp::DB_OBJECT)
    }
}

fn job_ids(c: &TestCluster) -> Vec<String> {
    c.jobs("/")
        .into_iter()
        .map(|j| j.job_id.unwrap_or_default())
        .collect()
}

fn delete_local_db(c: &TestCluster) {
    for f in [
        "controller.sqlite3",
        "controller.sqlite3-wal",
        "controller.sqlite3-shm",
    ] {
        let _ = std::fs::remove_file(c.state_dir.join(f));
    }
}

fn controller_log(c: &TestCluster) -> String {
    std::fs::read_to_string(c.path("controller.log")).unwrap_or_default()
}

/// `iris cluster controller checkpoint` → the checkpoint's epoch ms (its manifest checked).
fn checkpoint(c: &TestCluster, r: &Remote) -> i64 {
    let out = c.iris(&["cluster", "controller", "checkpoint"]);
    let text = out.ok();
    let path = text
        .trim()
        .strip_prefix("Checkpoint written to ")
        .and_then(|x| x.split_once(' '))
        .map(|x| x.0)
        .unwrap_or_else(|| panic!("unexpected output: {text}"));
    assert!(path.starts_with(&r.url), "{path}");
    let ms: i64 = path
        .rsplit('/')
        .next()
        .and_then(|m| m.parse().ok())
        .expect("epoch dir");
    let m = r.manifest(ms).expect("the checkpoint has a manifest");
    let data = r.get(&Remote::data_object(ms)).expect("data object");
    assert_eq!(m.size, data.len() as u64);
    ms
}

/// Submits `n` jobs, every third failing, and waits for all to end; returns the counts by state.
fn finished_jobs(c: &TestCluster, prefix: &str, n: usize) -> BTreeMap<String, usize> {
    for i in 0..n {
        let cmd: &[&str] = if i % 3 == 2 {
            &["sh", "-c", "exit 3"]
        } else {
            &["echo", "ok"]
        };
        c.submit(&format!("{prefix}{i}"), &[], cmd);
    }
    for i in 0..n {
        let want = if i % 3 == 2 { "failed" } else { "succeeded" };
        c.wait_job(&format!("/u/{prefix}{i}"), want);
    }
    states(c)
}

fn states(c: &TestCluster) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for id in job_ids(c) {
        *m.entry(c.job_state(&id).unwrap_or_default()).or_default() += 1;
    }
    m
}

/// The `file://` scenario of recovery.rs against `url`: explicit and periodic checkpoints,
/// `kill -9` plus a lost local DB, restart/rollback, a named restore, pruning by age.
fn checkpoint_cycle(url: &str) {
    let r = Remote::new(url);
    let mut c =
        TestCluster::start_with_args(&[WorkerSpec::cpu(16)], None, &["--remote-state-dir", url]);
    let before = finished_jobs(&c, "j", 6);
    assert_eq!(before.values().sum::<usize>(), 6, "{before:?}");
    let ids_before = job_ids(&c);
    let cp1 = checkpoint(&c, &r);
    assert_eq!(c.last_checkpoint(), Some(cp1));
    c.submit("later", &[], &["echo", "later"]);
    c.wait_job("/u/later", "succeeded");

    // kill -9, local DB gone: every job of the checkpoint is back, in its state.
    c.kill_controller();
    delete_local_db(&c);
    c.start_controller_again();
    assert_eq!(job_ids(&c), ids_before);
    assert_eq!(states(&c), before);
    assert_eq!(c.last_checkpoint(), Some(cp1));
    let log = controller_log(&c);
    let restored = format!("{}/{cp1}", cp::STATE_DIR);
    assert!(
        log.lines().any(
            |l| l.contains("restored controller DB from checkpoint (quick_check: ok)")
                && l.contains(&restored)
        ),
        "no quick_check line for {restored} in the controller log:\n{log}"
    );

    // restart: checkpoint + pending record; the next start commits it.
    let o = c.iris(&[
        "cluster",
        "controller",
        "restart",
        "--remote-state-dir",
        url,
        "--image",
        "v2",
    ]);
    assert!(
        o.ok().contains("does not restart the daemon"),
        "{}",
        o.stdout
    );
    let rec = r.rollout();
    assert_eq!(rec["phase"], "pending", "{rec}");
    let cp2 = cp::parse_checkpoint_name(rec["rollback_checkpoint"].as_str().unwrap_or(""))
        .expect("rollback checkpoint");
    assert!(cp2 > cp1);
    c.submit("d", &[], &["echo", "d"]);
    c.wait_job("/u/d", "succeeded");
    c.restart_controller();
    assert_eq!(r.rollout()["phase"], "committed");
    assert!(job_ids(&c).contains(&"/u/d".to_string()));

    // rollback: the next start restores cp2 once.
    c.iris(&[
        "cluster",
        "controller",
        "rollback",
        "--remote-state-dir",
        url,
    ])
    .ok();
    assert_eq!(r.rollout()["phase"], "rollback_requested");
    c.restart_controller();
    assert_eq!(r.rollout()["phase"], "rolled_back");
    assert!(
        !job_ids(&c).contains(&"/u/d".to_string()),
        "cp2 has no /u/d"
    );
    assert_eq!(c.last_checkpoint(), Some(cp2));

    // A named checkpoint wins over the newest.
    c.kill_controller();
    delete_local_db(&c);
    let name = format!("{}/{cp1}", cp::STATE_DIR);
    c.set_controller_args(&["--remote-state-dir", url, "--restore-checkpoint", &name]);
    c.start_controller_again();
    assert_eq!(job_ids(&c), ids_before);
    assert_eq!(c.last_checkpoint(), Some(cp1));

    // Periodic checkpoints, pruned by age (never the newest).
    c.set_controller_args(&[
        "--remote-state-dir",
        url,
        "--checkpoint-interval",
        "0.3",
        "--checkpoint-max-age",
        "1",
    ]);
    c.restart_controller();
    wait_until(SHORT, "every checkpoint from before to be pruned", || {
        let d = r.checkpoints();
        !d.is_empty() && d.iter().all(|ms| *ms > cp2)
    });
    let last = wait_for(SHORT, "a periodic checkpoint", || {
        c.last_checkpoint().filter(|ms| *ms > cp2)
    });
    let d = r.checkpoints();
    assert!(
        d.iter().all(|ms| *ms >= last - 1000 || *ms > last),
        "directories older than the max age remain: {d:?} (last {last})"
    );
    assert!(d.len() <= 6, "{d:?}");
    assert!(r.manifest(last).is_some() || d.iter().any(|ms| *ms > last));
}

#[test]
fn s3_checkpoint_restore_rollback_and_pruning() {
    let _env = env_lock();
    let s3 = Server::moto();
    s3_env(&s3.url, &[]);
    checkpoint_cycle("s3://iris/clusters/one");
}

#[test]
fn gcs_checkpoint_restore_rollback_and_pruning() {
    let _env = env_lock();
    let gcs = Server::gcs();
    let dir = tempfile::tempdir().expect("dir");
    gcs_env(dir.path(), &gcs.url);
    checkpoint_cycle("gs://iris/clusters/one");
}

fn status(c: &TestCluster) -> iris_proto::inspect::GetCheckpointStatusResponse {
    c.inspect("get-checkpoint-status", serde_json::json!({}))
}

/// A bucket that is gone: the checkpoint fails with the reason in the CLI, the log and
/// GetCheckpointStatus; the controller keeps serving and the previous checkpoint stays newest.
/// `drop_buckets` removes the bucket; `recreate` brings it back (empty).
fn missing_bucket_cycle(url: &str, drop_buckets: impl Fn(), recreate: impl Fn()) {
    let r = Remote::new(url);
    let c =
        TestCluster::start_with_args(&[WorkerSpec::cpu(16)], None, &["--remote-state-dir", url]);
    c.submit("a", &[], &["echo", "a"]);
    c.wait_job("/u/a", "succeeded");
    let cp1 = checkpoint(&c, &r);
    drop_buckets();
    let o = c.iris(&["cluster", "controller", "checkpoint"]);
    assert_ne!(o.code, 0);
    let err = o.err();
    assert!(
        err.contains(&format!("checkpoint to {url} failed")) && err.contains("previous checkpoint"),
        "{err}"
    );
    let st = status(&c);
    assert!(st.last_error.contains(url), "{st:?}");
    assert!(st.last_error_epoch_ms.is_some());
    assert_eq!(st.last_checkpoint_epoch_ms, Some(cp1));
    assert_eq!(st.remote_state_dir, url);
    assert!(controller_log(&c).contains("checkpoint failed"));
    // So do `process logs` (the controller's own log, through the RPC) and `cluster status`.
    let o = c.iris(&[
        "process",
        "logs",
        "--level",
        "ERROR",
        "--substring",
        "checkpoint failed",
    ]);
    let logs = o.ok();
    assert!(
        logs.contains(url) && logs.contains("NoSuchBucket"),
        "{logs}"
    );
    let o = c.iris(&["cluster", "status"]);
    let out = o.ok();
    assert!(
        out.contains(&format!("Checkpoints: {url}")) && out.contains("Last failure ("),
        "{out}"
    );
    // Still serving.
    c.submit("b", &[], &["echo", "b"]);
    c.wait_job("/u/b", "succeeded");
    // The bucket is back: the next checkpoint succeeds and clears the error.
    recreate();
    let cp2 = checkpoint(&c, &r);
    assert!(cp2 > cp1);
    let st = status(&c);
    assert_eq!(st.last_error, "");
    assert_eq!(st.last_error_epoch_ms, None);
}

#[test]
fn s3_missing_bucket_is_reported_and_the_controller_keeps_serving() {
    let _env = env_lock();
    let s3 = Server::moto();
    s3_env(&s3.url, &[]);
    missing_bucket_cycle(
        "s3://iris/p",
        || s3.s3_drop_buckets(),
        || s3.create_bucket("iris"),
    );
}

#[test]
fn gcs_missing_bucket_is_reported_and_the_controller_keeps_serving() {
    let _env = env_lock();
    let gcs = Server::gcs();
    let dir = tempfile::tempdir().expect("dir");
    gcs_env(dir.path(), &gcs.url);
    missing_bucket_cycle(
        "gs://iris/p",
        || gcs.gcs_drop_buckets(),
        || gcs.gcs_create_bucket("iris"),
    );
}

/// Credentials the store refuses (moto checks them once its auth is switched on, and knows no
/// key): the checkpoint fails naming the refusal, the controller keeps serving, the previous
/// checkpoint stays the newest, and a restart with the same store still starts from the local DB.
#[test]
fn s3_wrong_credentials_are_reported_and_the_controller_keeps_serving() {
    let _env = env_lock();
    let s3 = Server::moto();
    s3_env(&s3.url, &[]);
    let url = "s3://iris/creds";
    let r = Remote::new(url);
    let mut c =
        TestCluster::start_with_args(&[WorkerSpec::cpu(16)], None, &["--remote-state-dir", url]);
    c.submit("a", &[], &["echo", "a"]);
    c.wait_job("/u/a", "succeeded");
    let cp1 = checkpoint(&c, &r);
    // From now on every request must be signed by a key moto's IAM knows; ours is unknown.
    let (st, body) = http_with(&s3.url, "POST", "/moto-api/reset-auth", "0");
    assert_eq!(st, 200, "{body}");
    let o = c.iris(&["cluster", "controller", "checkpoint"]);
    assert_ne!(o.code, 0);
    let err = o.err();
    assert!(
        err.contains(&format!("checkpoint to {url} failed")),
        "{err}"
    );
    let st = status(&c);
    assert!(
        st.last_error.contains("InvalidAccessKeyId") || st.last_error.contains("403"),
        "the store's refusal is named: {st:?}"
    );
    assert_eq!(st.last_checkpoint_epoch_ms, Some(cp1));
    c.submit("b", &[], &["echo", "b"]);
    c.wait_job("/u/b", "succeeded");
    // A restart reads the rollout record first; refused, it starts from its own DB and says so.
    c.restart_controller();
    assert!(job_ids(&c).contains(&"/u/b".to_string()));
    let st = status(&c);
    assert!(
        st.startup_notes
            .iter()
            .any(|n| n.contains("could not be read at start") && n.contains(url)),
        "{st:?}"
    );
    let (st, body) = http_with(&s3.url, "POST", "/moto-api/reset-auth", "inf");
    assert_eq!(st, 200, "{body}");
    assert!(checkpoint(&c, &r) > cp1);
}

/// A store that is down when the controller starts: with a local DB the controller serves from
/// it and reports the store in GetCheckpointStatus and `cluster status`; with no local DB it
/// refuses to start (starting empty would hide every job), naming the store and `--fresh`.
#[test]
fn s3_down_at_start_serves_from_the_local_db_and_refuses_without_one() {
    let _env = env_lock();
    let s3 = Server::moto();
    s3_env(&s3.url, &[("AWS_TIMEOUT", "2s")]);
    let url = "s3://iris/down";
    let r = Remote::new(url);
    let mut c =
        TestCluster::start_with_args(&[WorkerSpec::cpu(16)], None, &["--remote-state-dir", url]);
    c.submit("a", &[], &["echo", "a"]);
    c.wait_job("/u/a", "succeeded");
    checkpoint(&c, &r);
    drop(s3);
    c.restart_controller();
    assert!(job_ids(&c).contains(&"/u/a".to_string()));
    let st = status(&c);
    assert!(
        st.startup_notes
            .iter()
            .any(|n| n.contains("could not be read at start")),
        "{st:?}"
    );
    let o = c.iris(&["cluster", "status"]);
    let out = o.ok();
    assert!(out.contains("At start: the remote state dir"), "{out}");
    c.submit("b", &[], &["echo", "b"]);
    c.wait_job("/u/b", "succeeded");

    c.kill_controller();
    delete_local_db(&c);
    let o = Command::new(IRIS)
        .args(["cluster", "controller", "serve", "--state-dir"])
        .arg(&c.state_dir)
        .args(["--bind", "127.0.0.1:0", "--remote-state-dir", url])
        .env_remove("IRIS_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("serve");
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(url) && err.contains("no local DB") && err.contains("--fresh"),
        "{err}"
    );
    assert!(
        !c.state_dir.join("controller.sqlite3").exists(),
        "a refused start created no empty DB"
    );
}

/// A TCP proxy in front of the S3 server. Once armed, the first `PUT` of a checkpoint's data
/// object is forwarded only up to half its body; then `on_cut` runs and the connection is held
/// (nothing more forwarded) until `release`.
struct CutProxy {
    url: String,
    armed: Arc<AtomicBool>,
    cut: Arc<AtomicBool>,
    released: Arc<AtomicBool>,
}

impl CutProxy {
    fn start(upstream: &str, on_cut: impl Fn() + Send + Sync + 'static) -> CutProxy {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let up = upstream.trim_start_matches("http://").to_string();
        let armed = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let released = Arc::new(AtomicBool::new(false));
        let on_cut = Arc::new(on_cut);
        let (a, k, rl) = (armed.clone(), cut.clone(), released.clone());
        // Detached: it ends with the test process (the listener is not closed earlier, so the
        // controller sees a server that stops answering rather than a refused connection).
        std::thread::spawn(move || {
            for client in l.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&up) else {
                    continue;
                };
                let (a, k, rl, on_cut) = (a.clone(), k.clone(), rl.clone(), on_cut.clone());
                let (mut c2, mut s2) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s2, &mut c2);
                    let _ = c2.shutdown(std::net::Shutdown::Both);
                });
                std::thread::spawn(move || pump(client, server, &a, &k, &rl, &*on_cut));
            }
        });
        CutProxy {
            url,
            armed,
            cut,
            released,
        }
    }
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    armed: &AtomicBool,
    cut: &AtomicBool,
    released: &AtomicBool,
    on_cut: &(dyn Fn() + Send + Sync),
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        let text = String::from_utf8_lossy(chunk);
        let put = text.find("PUT ").filter(|i| {
            text[*i..]
                .lines()
                .next()
                .is_some_and(|l| l.contains("controller.sqlite3.zst"))
        });
        if let (Some(i), true) = (put, armed.load(Ordering::SeqCst)) {
            if !cut.swap(true, Ordering::SeqCst) {
                let body = text[i..].find("\r\n\r\n").map(|h| i + h + 4).unwrap_or(n);
                let upto = body + (n - body) / 2;
                let _ = to.write_all(&chunk[..upto]);
                on_cut();
                while !released.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                break;
            }
        }
        if to.write_all(chunk).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

/// The S3 server stops (SIGSTOP) mid-upload: the checkpoint fails within the retry budget, the
/// controller keeps serving, and after the server is back the previous checkpoint is still the
/// newest one a restore uses.
#[test]
fn s3_server_stopped_mid_upload_leaves_the_previous_checkpoint_newest() {
    let _env = env_lock();
    let s3 = Arc::new(Server::moto());
    let pid = s3.child.id();
    let proxy = CutProxy::start(&s3.url, move || {
        let _ = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status();
    });
    s3_env(&proxy.url, &[("AWS_TIMEOUT", "2s")]);
    let url = "s3://iris/p";
    let r = Remote::new(url);
    let mut c =
        TestCluster::start_with_args(&[WorkerSpec::cpu(16)], None, &["--remote-state-dir", url]);
    let before = finished_jobs(&c, "j", 3);
    let cp1 = checkpoint(&c, &r);
    c.submit("after", &[], &["echo", "after"]);
    c.wait_job("/u/after", "succeeded");

    proxy.armed.store(true, Ordering::SeqCst);
    let mut cli = c.spawn_iris(&["cluster", "controller", "checkpoint"]);
    wait_until(SHORT, "the upload to be cut and the server stopped", || {
        proxy.cut.load(Ordering::SeqCst)
    });
    // While the store is down the controller serves (a job runs to the end) and the failure
    // shows in GetCheckpointStatus.
    c.submit("during", &[], &["echo", "during"]);
    c.wait_job("/u/during", "succeeded");
    let st = wait_for(
        Duration::from_secs(120),
        "the failure in GetCheckpointStatus",
        || {
            let st = status(&c);
            (!st.last_error.is_empty()).then_some(st)
        },
    );
    assert!(st.last_error.contains("was not completed"), "{st:?}");
    assert_eq!(st.last_checkpoint_epoch_ms, Some(cp1));
    let exit = wait_exit(&mut cli, Duration::from_secs(120), "the checkpoint command");
    assert!(!exit.success());
    let mut err = String::new();
    if let Some(mut e) = cli.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(err.contains("checkpoint to s3://iris/p failed"), "{err}");

    // The server is back; whatever it kept of the cut upload, the previous checkpoint is the one
    // a restore finds newest and usable.
    s3.signal("-CONT");
    proxy.released.store(true, Ordering::SeqCst);
    proxy.armed.store(false, Ordering::SeqCst);
    for ms in r.checkpoints() {
        if ms > cp1 {
            assert!(
                r.manifest(ms).is_none(),
                "the cut checkpoint {ms} has a manifest"
            );
        }
    }
    c.kill_controller();
    delete_local_db(&c);
    c.start_controller_again();
    assert_eq!(c.last_checkpoint(), Some(cp1));
    assert_eq!(states(&c), before);
    drop(c);
    drop(s3);
}

/// A truncated data object (with its manifest) and a truncated one without a manifest (only
/// zstd's checksum to catch it) are skipped at restore with a message naming each and the
/// checkpoint restored instead; a named bad checkpoint is refused rather than substituted.
#[test]
fn s3_truncated_checkpoints_are_skipped_at_restore() {
    let _env = env_lock();
    let s3 = Server::moto();
    s3_env(&s3.url, &[]);
    truncated_cycle("s3://iris/p");
}

#[test]
fn gcs_truncated_checkpoints_are_skipped_at_restore() {
    let _env = env_lock();
    let gcs = Server::gcs();
    let dir = tempfile::tempdir().expect("dir");
    gcs_env(dir.path(), &gcs.url);
    truncated_cycle("gs://iris/p");
}

fn truncated_cycle(url: &str) {
    let r = Remote::new(url);
    let mut c =
        TestCluster::start_with_args(&[WorkerSpec::cpu(16)], None, &["--remote-state-dir", url]);
    let before = finished_jobs(&c, "j", 3);
    let cp1 = checkpoint(&c, &r);
    c.submit("x", &[], &["echo", "x"]);
    c.wait_job("/u/x", "succeeded");
    let cp2 = checkpoint(&c, &r);
    let cp3 = checkpoint(&c, &r);
    for ms in [cp2, cp3] {
        let obj = Remote::data_object(ms);
        let data = r.get(&obj).expect("data");
        r.put(&obj, data[..data.len() / 2].to_vec());
    }
    // cp3 also loses its manifest (an upload that did not complete).
    r.rt.block_on(
        r.store
            .delete(&format!("{}/{cp3}/{}", cp::STATE_DIR, cp::MANIFEST)),
    )
    .expect("delete manifest");
    c.kill_controller();
    delete_local_db(&c);
    c.start_controller_again();
    assert_eq!(c.last_checkpoint(), Some(cp1));
    assert_eq!(states(&c), before);
    let log = controller_log(&c);
    let loc = |ms: i64| format!("{url}/{}/{ms}", cp::STATE_DIR);
    let line = log
        .lines()
        .find(|l| l.contains("skipped unusable checkpoint"))
        .unwrap_or_else(|| panic!("no skip message in the controller log:\n{log}"));
    let st = status(&c);
    assert_eq!(st.restored_checkpoint_epoch_ms, Some(cp1));
    assert_eq!(st.startup_notes.len(), 1, "{st:?}");
    for needle in [
        loc(cp3),
        loc(cp2),
        format!("restored the previous checkpoint {}", loc(cp1)),
        "truncated or damaged".to_string(),
    ] {
        assert!(line.contains(&needle), "{needle} not in: {line}");
        assert!(
            st.startup_notes[0].contains(&needle),
            "{needle} not in GetCheckpointStatus: {st:?}"
        );
    }
    // Named, a bad checkpoint is an error at start, not a substitution.
    c.kill_controller();
    delete_local_db(&c);
    let o = Command::new(IRIS)
        .args(["cluster", "controller", "serve", "--state-dir"])
        .arg(&c.state_dir)
        .args(["--bind", "127.0.0.1:0", "--remote-state-dir", url])
        .args(["--restore-checkpoint", &format!("{}/{cp2}", cp::STATE_DIR)])
        .env_remove("IRIS_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("serve");
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("checkpoint {} cannot be restored", loc(cp2)))
            && err.contains("truncated or damaged"),
        "{err}"
    );
}
