//! Auth end to end (issue: "nobody gets in where they don't belong"): an enforcing controller on
//! 127.0.0.1, reached through a local forwarding proxy that adds `X-Forwarded-For`, so callers are
//! not direct loopback peers and must present tokens.

mod common;

use common::{TestCluster, WorkerSpec};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

/// A tiny HTTP/1.1 forwarding proxy: one request per upstream connection, adding
/// `X-Forwarded-For`. Runs until the test process ends.
fn start_proxy(upstream: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let addr = listener.local_addr().expect("addr");
    let upstream = upstream
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let up = upstream.clone();
            std::thread::spawn(move || {
                let _ = serve_conn(conn, &up);
            });
        }
    });
    format!("http://{addr}")
}

fn serve_conn(client: TcpStream, upstream: &str) -> std::io::Result<()> {
    // One request per connection: the proxy forces `Connection: close` both ways.
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    let mut head = Vec::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("connection:") {
            continue;
        }
        if line == "\r\n" {
            head.extend_from_slice(b"X-Forwarded-For: 203.0.113.9\r\nConnection: close\r\n\r\n");
            break;
        }
        head.extend_from_slice(line.as_bytes());
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    let mut up = TcpStream::connect(upstream)?;
    up.write_all(&head)?;
    up.write_all(&body)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    client.write_all(&resp)?;
    client.flush()
}

/// Kills the worker process on drop.
struct WorkerProc(std::process::Child);

impl Drop for WorkerProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Env {
    cluster: TestCluster,
    proxy: String,
    key: iris_auth::Keypair,
    home: tempfile::TempDir,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Env {
    fn start(extra_auth: &str) -> Env {
        Env::start_with_args(extra_auth, &[])
    }

    fn start_with_args(extra_auth: &str, args: &[&str]) -> Env {
        let home = tempfile::tempdir().expect("home");
        let (key_path, _) = common::init_keys(home.path(), "signing");
        let key = iris_auth::Keypair::from_pem(&std::fs::read_to_string(&key_path).expect("key"))
            .expect("load key");
        let yaml = format!(
            "name: authtest\nauth:\n  provider: token\n  signing_key: file:{}\n  admin_users: [root]\n  user_roles: {{viewer: dashboard}}\n{extra_auth}",
            key_path.display()
        );
        let cluster = TestCluster::start_with_args(&[WorkerSpec::cpu(4)], Some(&yaml), args);
        let proxy = start_proxy(&cluster.url);
        Env {
            cluster,
            proxy,
            key,
            home,
        }
    }

    fn token(&self, sub: &str, role: &str, aud: &str, iat: u64, extra: &[(&str, &str)]) -> String {
        let extra: BTreeMap<String, serde_json::Value> = extra
            .iter()
            .map(|(k, v)| (k.to_string(), (*v).into()))
            .collect();
        self.key
            .mint("authtest", aud, sub, role, 3600, iat, extra)
            .expect("mint")
    }

    fn user(&self, sub: &str, role: &str) -> String {
        self.token(sub, role, "iris", now(), &[])
    }

    /// Runs the CLI through the proxy with `token` (or none).
    fn iris(&self, token: Option<&str>, args: &[&str]) -> (bool, String, String) {
        let mut c = Command::new(env!("CARGO_BIN_EXE_iris"));
        c.current_dir(&self.cluster.ws)
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.home.path())
            .env_remove("MARIN_CLUSTER_TOKEN")
            .env_remove("IRIS_CONTROLLER_URL")
            .args(["--controller-url", &self.proxy])
            .args(args);
        if let Some(t) = token {
            c.env("MARIN_CLUSTER_TOKEN", t);
        }
        let o = c.output().expect("run iris");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }
}

#[test]
fn enforcing_controller_behind_a_proxy() {
    let env = Env::start("");
    // Jwks is served.
    let (status, _, body) = common::http_get(&env.cluster.url, "/.well-known/jwks.json", None);
    assert_eq!(status, 200);
    assert!(body.contains(env.key.kid()), "{body}");

    // No token → unauthenticated.
    let (ok, _, err) = env.iris(None, &["job", "list"]);
    assert!(!ok && err.contains("unauthenticated"), "{err}");
    // Another key, expired, wrong audience, tampered → unauthenticated.
    let other = iris_auth::Keypair::generate();
    let forged = other
        .mint(
            "authtest",
            "iris",
            "alice",
            "user",
            3600,
            now(),
            BTreeMap::new(),
        )
        .expect("mint");
    let expired = env.token("alice", "user", "iris", now() - 3 * 3600, &[]);
    let wrong_aud = env.token("alice", "user", "federation", now(), &[]);
    let good = env.user("alice", "user");
    let parts: Vec<&str> = good.split('.').collect();
    let tampered = format!("{}.{}x.{}", parts[0], parts[1], parts[2]);
    for (what, t) in [
        ("forged", &forged),
        ("expired", &expired),
        ("wrong audience", &wrong_aud),
        ("tampered", &tampered),
    ] {
        let (ok, _, err) = env.iris(Some(t), &["job", "list"]);
        assert!(!ok && err.contains("unauthenticated"), "{what}: {err}");
    }

    let alice = env.user("alice", "user");
    let bob = env.user("bob", "user");
    let root = env.user("root", "user");
    // Alice submits (a root name for someone else is renamed to hers), lists and cancels her job.
    let (ok, out, err) = env.iris(
        Some(&alice),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--user",
            "mallory",
            "--job-name",
            "a1",
            "--",
            "sleep",
            "30",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "/alice/a1");
    let (ok, out, _) = env.iris(Some(&alice), &["job", "list"]);
    assert!(ok && out.contains("/alice/a1"), "{out}");
    let (ok, out, err) = env.iris(
        Some(&bob),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--user",
            "bob",
            "--job-name",
            "b1",
            "--",
            "sleep",
            "30",
        ],
    );
    assert!(ok && out.trim() == "/bob/b1", "{err}");
    // Alice may not cancel Bob's job, and the refusal is the same for a job that does not exist.
    let (ok, _, err) = env.iris(Some(&alice), &["job", "cancel", "/bob/b1"]);
    assert!(!ok && err.contains("permission_denied"), "{err}");
    let (ok, _, err2) = env.iris(Some(&alice), &["job", "cancel", "/bob/nothing"]);
    assert!(!ok && err2.contains("permission_denied"), "{err2}");
    assert_eq!(
        env.cluster
            .job_state("/bob/b1")
            .as_deref()
            .map(|s| s != "killed"),
        Some(true)
    );
    let (ok, _, err) = env.iris(Some(&alice), &["job", "cancel", "/alice/a1"]);
    assert!(ok, "{err}");
    // Alice cannot query or submit PRODUCTION.
    let (ok, _, err) = env.iris(Some(&alice), &["query", "SELECT count(*) FROM jobs"]);
    assert!(!ok && err.contains("permission_denied"), "{err}");
    let (ok, _, err) = env.iris(
        Some(&alice),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--priority",
            "production",
            "--job-name",
            "p",
            "--",
            "true",
        ],
    );
    assert!(!ok && err.contains("permission_denied"), "{err}");
    // An admin can.
    let (ok, out, err) = env.iris(
        Some(&root),
        &["query", "SELECT count(*) FROM jobs", "-f", "csv"],
    );
    assert!(ok, "{err}");
    assert!(out.lines().count() == 2, "{out}");
    let (ok, _, err) = env.iris(
        Some(&root),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--user",
            "root",
            "--priority",
            "production",
            "--job-name",
            "p",
            "--",
            "true",
        ],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = env.iris(Some(&root), &["job", "cancel", "/bob/b1"]);
    assert!(ok, "{err}");
    // A dashboard token can list but not submit.
    let viewer = env.user("viewer", "user");
    let (ok, _, err) = env.iris(Some(&viewer), &["job", "list"]);
    assert!(ok, "{err}");
    let (ok, _, err) = env.iris(
        Some(&viewer),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--user",
            "viewer",
            "--",
            "true",
        ],
    );
    assert!(!ok && err.contains("permission_denied"), "{err}");
    // An endpoint token can call no RPC.
    let ep = env.token(
        "endpoint:x",
        "endpoint",
        "iris-proxy",
        now(),
        &[("scope", "proxy"), ("endpoint", "/x")],
    );
    let (ok, _, err) = env.iris(Some(&ep), &["job", "list"]);
    assert!(!ok && err.contains("permission_denied"), "{err}");
    // GetCurrentUser reports the caller.
    let (ok, out, _) = env.iris(Some(&alice), &["rpc", "controller", "get-current-user"]);
    assert!(ok && out.contains("alice") && out.contains("user"), "{out}");
}

/// `task events` and the dashboard's reads go through `iris.inspect.InspectService`, not the
/// admin-only `ExecuteRawQuery`: the job's owner reads its events, another user is refused the
/// same way whether or not the task exists, and the dashboard role reads events, counts and holds.
#[test]
fn typed_reads_follow_roles_and_ownership() {
    let env = Env::start("");
    let alice = env.user("alice", "user");
    let bob = env.user("bob", "user");
    let viewer = env.user("viewer", "user");
    let (ok, out, err) = env.iris(
        Some(&alice),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--user",
            "alice",
            "--job-name",
            "ev",
            "--",
            "sleep",
            "30",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "/alice/ev");

    // The owner (a plain user) reads the task's events, with the same columns as before.
    let out = common::wait_for(Duration::from_secs(30), "the task to be assigned", || {
        let (ok, out, _) = env.iris(Some(&alice), &["task", "events", "/alice/ev/0"]);
        (ok && out.contains("TaskAssigned")).then_some(out)
    });
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["TIME", "ATTEMPT", "TYPE", "REASON", "MESSAGE", "SOURCE"],
        "{out}"
    );
    let (ok, out, err) = env.iris(Some(&alice), &["attempt", "events", "/alice/ev/0:0"]);
    assert!(ok && out.contains("TaskAssigned"), "{out}{err}");
    let (ok, _, err) = env.iris(Some(&alice), &["attempt", "events", "/alice/ev/0:7"]);
    assert!(
        !ok && err.contains("not_found") && err.contains("/alice/ev/0:7"),
        "{err}"
    );
    let (ok, _, err) = env.iris(Some(&alice), &["task", "events", "/alice/nothing/0"]);
    assert!(
        !ok && err.contains("not_found") && err.contains("/alice/nothing/0"),
        "{err}"
    );

    // Another user is refused, and the refusal is the same for a task that does not exist.
    let (ok, _, err) = env.iris(Some(&bob), &["task", "events", "/alice/ev/0"]);
    assert!(!ok && err.contains("permission_denied"), "{err}");
    let (ok, _, err2) = env.iris(Some(&bob), &["task", "events", "/alice/nothing/0"]);
    assert!(!ok && err2.contains("permission_denied"), "{err2}");

    let post = |token: &str, method: &str, body: &str| {
        common::http_post_json_with(
            &env.proxy,
            &format!("/iris.inspect.InspectService/{method}"),
            body,
            &[("authorization", &format!("Bearer {token}"))],
        )
    };
    // A malformed id is refused naming the field.
    let (status, body) = post(&alice, "ListTaskEvents", r#"{"taskId":"ev/0"}"#);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("task_id"), "{body}");

    // The dashboard role reads events, job counts and resource holds.
    let (status, body) = post(&viewer, "ListTaskEvents", r#"{"taskId":"/alice/ev/0"}"#);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("TaskAssigned"), "{body}");
    let (status, body) = post(&viewer, "CountJobs", r#"{"jobIdPrefix":"/alice/"}"#);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("JOB_STATE_"), "{body}");
    let (status, body) = post(&viewer, "ListResourceHolds", "{}");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("/alice/ev"),
        "the running attempt holds its worker: {body}"
    );
    // Roles outside the read path are refused.
    let worker = env.user("system:worker", "worker");
    let (status, body) = post(&worker, "CountJobs", "{}");
    assert_eq!(status, 403, "{body}");

    let (ok, _, err) = env.iris(Some(&alice), &["job", "cancel", "/alice/ev"]);
    assert!(ok, "{err}");
}

#[test]
fn task_token_submits_children_only_under_its_job() {
    let env = Env::start("");
    let root = env.user("root", "user");
    let (ok, _, err) = env.iris(
        Some(&root),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--user",
            "alice",
            "--job-name",
            "parent",
            "--",
            "sleep",
            "30",
        ],
    );
    assert!(ok, "{err}");
    let task = env.token(
        "alice",
        "task",
        "iris",
        now(),
        &[("job_id", "/alice/parent")],
    );
    let run_child = |job: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_iris"));
        c.current_dir(&env.cluster.ws)
            .env("HOME", env.home.path())
            .env("XDG_CONFIG_HOME", env.home.path())
            .env("MARIN_CLUSTER_TOKEN", &task)
            .env("IRIS_TASK_ID", format!("{job}/0:0"))
            .args([
                "--controller-url",
                &env.proxy,
                "job",
                "run",
                "--no-wait",
                "--no-bundle",
                "--job-name",
                "kid",
                "--",
                "true",
            ]);
        let o = c.output().expect("run");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run_child("/alice/parent");
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "/alice/parent/kid");
    let (ok2, out2, err2) = env.iris(
        Some(&root),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--user",
            "alice",
            "--job-name",
            "other",
            "--",
            "sleep",
            "30",
        ],
    );
    assert!(ok2, "{out2}{err2}");
    let (ok, _, err) = run_child("/alice/other");
    assert!(!ok && err.contains("permission_denied"), "{err}");
    // And no root submissions.
    let (ok, _, err) = env.iris(
        Some(&task),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--job-name",
            "rootjob",
            "--",
            "true",
        ],
    );
    assert!(!ok && err.contains("permission_denied"), "{err}");
}

#[test]
fn rotation_keeps_old_tokens_valid_only_when_listed() {
    let mut env = Env::start("");
    let old = iris_auth::Keypair::generate();
    let old_token = old
        .mint(
            "authtest",
            "iris",
            "alice",
            "user",
            3600,
            now(),
            BTreeMap::new(),
        )
        .expect("mint");
    let (ok, _, err) = env.iris(Some(&old_token), &["job", "list"]);
    assert!(
        !ok && err.contains("unauthenticated"),
        "a rotated-out key must not verify: {err}"
    );
    // A worker holding a token from the rotated-out key cannot register (it calls through the
    // proxy, so loopback trust does not apply).
    let old_worker = old
        .mint(
            "authtest",
            "iris",
            "system:worker",
            "worker",
            3600,
            now(),
            BTreeMap::new(),
        )
        .expect("mint");
    let worker_log = env.home.path().join("w-rotated.log");
    let mut worker = WorkerProc(
        Command::new(env!("CARGO_BIN_EXE_iris"))
            .env("IRIS_WORKER_TOKEN", &old_worker)
            .env("IRIS_LOG", "warn")
            .args([
                "--controller-url",
                &env.proxy,
                "worker",
                "serve",
                "--worker-id",
                "w-rotated",
                "--cpu",
                "1",
            ])
            .arg("--cache-dir")
            .arg(env.home.path().join("w-rotated"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&worker_log).expect("worker log"))
            .spawn()
            .expect("spawn worker"),
    );
    // The controller has answered two registrations, refusing both, and the worker tries again.
    common::wait_until(
        Duration::from_secs(30),
        "the worker's registration to be refused twice",
        || {
            std::fs::read_to_string(&worker_log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("registration failed") && l.contains("unauthenticated"))
                .count()
                >= 2
        },
    );
    assert!(
        !env.cluster
            .listed_workers()
            .iter()
            .any(|(id, _)| id == "w-rotated"),
        "a worker with a rotated-out key registered"
    );
    assert!(
        matches!(worker.0.try_wait(), Ok(None)),
        "the worker keeps retrying"
    );
    // Restart with the old public key in previous_public_keys: the old token verifies again.
    let pem = old.public_pem().expect("pem");
    let indented: String = pem.lines().map(|l| format!("    {l}\n")).collect();
    let key_path = env.home.path().join("signing.pem");
    let yaml = format!(
        "name: authtest\nauth:\n  provider: token\n  signing_key: file:{}\n  admin_users: [root]\n  previous_public_keys:\n  - |\n{indented}",
        key_path.display()
    );
    std::fs::write(env.cluster.path("rotated.yaml"), yaml).expect("write config");
    let cfg = env.cluster.path("rotated.yaml").display().to_string();
    env.cluster.set_controller_args(&["--config", &cfg]);
    env.cluster.restart_controller();
    let (ok, _, err) = env.iris(Some(&old_token), &["job", "list"]);
    assert!(ok, "old token should verify after rotation: {err}");
    // With the old key listed, the same worker registers and can renew its token.
    common::wait_until(Duration::from_secs(20), "the worker to register", || {
        env.cluster
            .healthy_workers()
            .contains(&"w-rotated".to_string())
    });
    let renewed = env.iris(
        Some(&old_worker),
        &["rpc", "controller", "renew-worker-token"],
    );
    assert!(renewed.0 && renewed.1.contains("token"), "{renewed:?}");
    drop(worker);
}

#[test]
fn a_task_submits_its_child_with_the_token_the_controller_minted() {
    let env = Env::start("");
    let root = env.user("root", "user");
    // The task calls back through the proxy (so it is not a trusted loopback peer) with only the
    // IRIS_TASK_TOKEN the controller minted for its attempt.
    let script = "\"$IRIS_BIN\" --controller-url \"$PROXY\" job run --no-wait --no-bundle --job-name kid -- true";
    let (ok, out, err) = env.iris(
        Some(&root),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--user",
            "alice",
            "--job-name",
            "parent",
            "-e",
            "IRIS_BIN",
            env!("CARGO_BIN_EXE_iris"),
            "-e",
            "PROXY",
            &env.proxy,
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "/alice/parent");
    env.cluster.wait_job("/alice/parent", "succeeded");
    assert!(
        env.cluster.job_state("/alice/parent/kid").is_some(),
        "the child was not created"
    );
    assert_eq!(
        env.cluster.job_status("/alice/parent/kid")["parent_job_id"],
        "/alice/parent"
    );
}

/// Issue 8 under auth: the dashboard acts as the browser's user, logs in from a one-time
/// `?session_token=` URL (the token then lives only in an HttpOnly cookie), shows the
/// `dashboard` role read-only pages and keeps Query for admins.
#[test]
fn dashboard_login_and_roles() {
    let env = Env::start_with_args("", &["--dashboard-bind", "127.0.0.1:0"]);
    let dash = env.cluster.dashboard_url();
    let admin = env.user("root", "admin");
    let (ok, out, err) = env.iris(
        Some(&admin),
        &[
            "job",
            "run",
            "--no-wait",
            "--job-name",
            "seen",
            "--",
            "true",
        ],
    );
    assert!(ok, "{out}{err}");

    // No session: the dashboard's own loopback connection does not make the browser an admin.
    let (status, _, body) = common::http_get(&dash, "/jobs", None);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("session_token"), "{body}");

    // The login URL sets an HttpOnly cookie and redirects to a URL without the token.
    let (status, head, _) = common::http_get(
        &dash,
        &format!("/jobs?state=all&session_token={admin}"),
        None,
    );
    assert_eq!(status, 303, "{head}");
    let location = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("location: ")
                .or_else(|| l.strip_prefix("Location: "))
        })
        .unwrap_or("")
        .to_string();
    assert_eq!(location, "/jobs?state=all", "{head}");
    assert!(!location.contains(&admin));
    assert!(
        head.to_ascii_lowercase()
            .contains("set-cookie: iris_session="),
        "{head}"
    );
    assert!(head.contains("HttpOnly"), "{head}");

    let admin_cookie = format!("iris_session={admin}");
    let (status, _, body) = common::http_get(&dash, "/jobs", Some(&admin_cookie));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("/root/seen"), "admin sees the job");
    assert!(!body.contains(&admin), "the token never appears in a page");
    let (status, _, body) = common::http_get(&dash, "/query?sql=SELECT+1", Some(&admin_cookie));
    assert_eq!(status, 200, "{body}");

    // The dashboard role reads pages but not Query.
    let viewer = format!("iris_session={}", env.user("viewer", "user"));
    let (status, _, body) = common::http_get(&dash, "/jobs", Some(&viewer));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("/root/seen"), "{body}");
    let (status, _, body) = common::http_get(&dash, "/query", Some(&viewer));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("admin role"), "{body}");
    // Its task page shows events and attempts read through typed RPCs, not SQL. The page reads
    // the task and its events with separate RPCs, so one render can fall between the
    // assignment's two halves; wait for a render that has both.
    let body = common::wait_for(
        Duration::from_secs(30),
        "the task page to show the assignment and its attempt",
        || {
            let (status, _, body) = common::http_get(&dash, "/task/root/seen/0", Some(&viewer));
            (status == 200
                && body.contains("TaskAssigned")
                && body.contains("<svg class=\"timeline\""))
            .then_some(body)
        },
    );
    assert!(!body.contains("Cannot read task events"), "{body}");
    let (status, _, body) = common::http_get(&dash, "/workers", Some(&viewer));
    assert_eq!(status, 200, "{body}");
    // A forged session is refused, not downgraded.
    let forged = iris_auth::Keypair::generate()
        .mint(
            "authtest",
            "iris",
            "root",
            "admin",
            3600,
            now(),
            BTreeMap::new(),
        )
        .expect("mint");
    let (status, _, _) = common::http_get(&dash, "/jobs", Some(&format!("iris_session={forged}")));
    assert_eq!(status, 401);
}

/// The identity-aware proxy layer: with `auth.iap`, a request carrying a valid ES256
/// `x-goog-iap-jwt-assertion` for the configured audience is that user (unprovisioned users get
/// the dashboard role; `admin_users` are admins); a bad assertion is refused, never downgraded.
/// Google's keys are stood in for by a locally generated P-256 key.
#[test]
fn iap_assertions() {
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    let rng = ring::rand::SystemRandom::new();
    let gen = |kid: &str| {
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("gen");
        let kp = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("parse");
        let pt = kp.public_key().as_ref().to_vec();
        (pkcs8.as_ref().to_vec(), kid.to_string(), pt)
    };
    let b64 = |b: &[u8]| {
        use std::fmt::Write;
        // base64url without padding, by hand to keep the test's dependencies small.
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in b.chunks(3) {
            let n =
                chunk.iter().fold(0u32, |acc, &x| (acc << 8) | x as u32) << (8 * (3 - chunk.len()));
            for i in 0..=chunk.len() {
                let _ = out.write_char(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    };
    let (google, kid, pt) = gen("iap-k1");
    let dir = tempfile::tempdir().expect("dir");
    let jwks = dir.path().join("iap.jwks");
    std::fs::write(
        &jwks,
        serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": kid, "x": b64(&pt[1..33]), "y": b64(&pt[33..65])}]}).to_string(),
    )
    .expect("jwks");
    let env = Env::start(&format!(
        "  iap:\n    signed_header_audience: /projects/1/global/backendServices/2\n    jwks_file: {}\n",
        jwks.display()
    ));
    let sign = |key: &[u8], kid: &str, aud: &str, email: &str| {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        h.kid = Some(kid.to_string());
        let claims = serde_json::json!({"iss": "https://cloud.google.com/iap", "aud": aud,
            "iat": now(), "exp": now() + 600, "email": format!("accounts.google.com:{email}"), "sub": "1"});
        jsonwebtoken::encode(&h, &claims, &jsonwebtoken::EncodingKey::from_ec_der(key))
            .expect("sign")
    };
    let aud = "/projects/1/global/backendServices/2";
    let who = |assertion: Option<&str>| {
        let mut h = Vec::new();
        if let Some(a) = assertion {
            h.push(("x-goog-iap-jwt-assertion", a));
        }
        common::http_post_json_with(
            &env.proxy,
            "/iris.cluster.ControllerService/GetCurrentUser",
            "{}",
            &h,
        )
    };
    let (status, body) = who(Some(&sign(&google, &kid, aud, "alice@example.com")));
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("alice@example.com") && body.contains("dashboard"),
        "{body}"
    );
    let (status, body) = who(Some(&sign(&google, &kid, aud, "root")));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"admin\""), "{body}");
    // The dashboard role cannot submit.
    let (status, body) = common::http_post_json_with(
        &env.proxy,
        "/iris.cluster.ControllerService/LaunchJob",
        r#"{"name":"/alice/x","entrypoint":{"runCommand":{"argv":["true"]}},"replicas":1}"#,
        &[(
            "x-goog-iap-jwt-assertion",
            &sign(&google, &kid, aud, "alice@example.com"),
        )],
    );
    assert_eq!(status, 403, "{body}");
    // Wrong audience, another key, garbage: refused, not downgraded to anything.
    for bad in [
        sign(
            &google,
            &kid,
            "/projects/1/global/backendServices/999",
            "alice@example.com",
        ),
        sign(&gen("iap-k1").0, &kid, aud, "alice@example.com"),
        "e30.e30.".to_string(),
    ] {
        let (status, body) = who(Some(&bad));
        assert_eq!(status, 401, "{body}");
    }
    // No assertion behind the proxy: unauthenticated.
    let (status, _) = who(None);
    assert_eq!(status, 401);
}

#[test]
fn elevated_container_profiles_need_an_admin() {
    let env = Env::start("");
    let alice = env.user("alice", "user");
    let root = env.user("root", "user");
    let launch = |name: &str, profile: &str| {
        format!(
            r#"{{"name":"{name}","entrypoint":{{"runCommand":{{"argv":["true"]}}}},"containerProfile":"{profile}"}}"#
        )
    };
    for profile in [
        "CONTAINER_PROFILE_PRIVILEGED",
        "CONTAINER_PROFILE_DOCKER_ACCESS",
    ] {
        let (ok, out, _) = env.iris(
            Some(&alice),
            &[
                "rpc",
                "controller",
                "launch-job",
                "--json",
                &launch("/alice/priv", profile),
            ],
        );
        assert!(!ok, "{profile} for a non-admin must be refused: {out}");
        assert!(
            out.contains("permission_denied") && out.contains("container_profile"),
            "{out}"
        );
    }
    // Nothing was written for the refused submissions.
    assert_eq!(env.cluster.job_state("/alice/priv"), None);
    // The default profile is fine for her; an admin may ask for PRIVILEGED.
    let (ok, out, _) = env.iris(
        Some(&alice),
        &[
            "rpc",
            "controller",
            "launch-job",
            "--json",
            &launch("/alice/plain", "CONTAINER_PROFILE_DEFAULT"),
        ],
    );
    assert!(ok, "{out}");
    let (ok, out, _) = env.iris(
        Some(&root),
        &[
            "rpc",
            "controller",
            "launch-job",
            "--json",
            &launch("/root/priv", "CONTAINER_PROFILE_PRIVILEGED"),
        ],
    );
    assert!(ok, "{out}");
}

/// A task of alice's job serves a directory (with a 100 MB file) and registers it, link access,
/// through the Connect JSON API with its task token.
fn site_task() -> String {
    format!(
        "set -e\nmkdir -p site\nhead -c 104857600 /dev/zero > site/big\necho proxied-hello > site/index.html\n{}{}echo registered\nsleep 600\n",
        common::SERVE_SITE_SH,
        common::register_endpoint_sh("/alice/site/web", "127.0.0.1:$(cat port)", ",\\\"access\\\":2")
    )
}

/// `curl` as a caller from outside (an `X-Forwarded-For`, so loopback is not the anonymous
/// admin): (status, body), or the body to a sink with `-o`.
fn curl(args: &[&str]) -> (u16, String) {
    let o = Command::new("curl")
        .args([
            "-sS",
            "-H",
            "X-Forwarded-For: 203.0.113.9",
            "-w",
            "\n%{http_code}",
        ])
        .args(args)
        .output()
        .expect("run curl");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Issue 16, acceptance 2: from outside, `/proxy/<name>/` with the owner's token and a minted
/// `/proxy/t/<token>/` URL reach the task's server; 100 MB stream through with flat controller
/// memory; an expired token, another user's request, a private endpoint's capability and an
/// unregistered name are refused without reaching the worker.
#[test]
fn endpoints_are_reached_through_the_proxy_only_by_who_may() {
    let env = Env::start("");
    let url = env.cluster.url.clone();
    let alice = env.user("alice", "user");
    let bob = env.user("bob", "user");
    let (ok, out, err) = env.iris(
        Some(&alice),
        &[
            "job",
            "run",
            "--no-wait",
            "--job-name",
            "site",
            "--",
            "sh",
            "-c",
            &site_task(),
        ],
    );
    assert!(ok, "{out}{err}");
    let bearer = |t: &str| format!("authorization: Bearer {t}");
    common::wait_for(Duration::from_secs(60), "the endpoint to be listed", || {
        let (ok, out, _) = env.iris(Some(&alice), &["endpoints", "list", "/alice/"]);
        (ok && out.contains("/alice/site/web")).then_some(())
    });
    let (ok, out, err) = env.iris(
        Some(&alice),
        &["endpoints", "list", "/alice/site/web", "--exact"],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("link") && out.contains("/proxy/alice.site.web/"),
        "{out}"
    );

    // The owner reaches it; the redirect keeps a browser under the prefix.
    let (code, body) = curl(&[
        "-H",
        &bearer(&alice),
        &format!("{url}/proxy/alice.site.web/"),
    ]);
    assert_eq!((code, body.trim()), (200, "proxied-hello"));
    let (code, _) = curl(&[
        "-H",
        &bearer(&alice),
        &format!("{url}/proxy/alice.site.web"),
    ]);
    assert_eq!(code, 307);
    // Others are refused before anything is forwarded.
    let (code, body) = curl(&["-H", &bearer(&bob), &format!("{url}/proxy/alice.site.web/")]);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("owner"), "{body}");
    let (code, body) = curl(&[&format!("{url}/proxy/alice.site.web/")]);
    assert_eq!(code, 401, "{body}");
    let (code, body) = curl(&[
        "-H",
        &bearer(&alice),
        &format!("{url}/proxy/alice.site.nope/"),
    ]);
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("alice/site/nope"), "{body}");

    // A capability URL: minted by the owner only, works without any other credential.
    let (ok, _, err) = env.iris(Some(&bob), &["endpoints", "mint", "/alice/site/web"]);
    assert!(!ok && err.contains("permission"), "{err}");
    let (ok, out, err) = env.iris(
        Some(&alice),
        &["endpoints", "mint", "/alice/site/web", "--ttl-hours", "1"],
    );
    assert!(ok, "{err}");
    let cap = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("url"))
        .map(|u| u.trim().to_string())
        .unwrap_or_else(|| panic!("no url in {out}"));
    assert!(cap.contains("/proxy/t/") && !cap.contains(&alice), "{cap}");
    let (code, body) = curl(&[&cap]);
    assert_eq!((code, body.trim()), (200, "proxied-hello"));
    // An expired capability, and one for another endpoint, are refused.
    let expired = env.token(
        "endpoint:/alice/site/web",
        "endpoint",
        "iris-proxy",
        now() - 3 * 3600,
        &[("scope", "proxy"), ("endpoint", "/alice/site/web")],
    );
    let (code, _) = curl(&[&format!("{url}/proxy/t/{expired}/alice.site.web/")]);
    assert_eq!(code, 401);
    let other = env.token(
        "endpoint:/alice/site/db",
        "endpoint",
        "iris-proxy",
        now(),
        &[("scope", "proxy"), ("endpoint", "/alice/site/db")],
    );
    let (code, body) = curl(&[&format!("{url}/proxy/t/{other}/alice.site.web/")]);
    assert_eq!(code, 403, "{body}");
    // A capability token has no authority over the control plane.
    let (ok, _, err) = env.iris(Some(&other), &["job", "list"]);
    assert!(!ok && err.contains("permission"), "{err}");

    // 100 MB stream through; the controller's peak memory barely moves.
    let pid = env.cluster.controller_pid();
    let before = peak_rss_kib(pid);
    let (code, _) = curl(&[
        "-H",
        &bearer(&alice),
        "-o",
        "/dev/null",
        &format!("{url}/proxy/alice.site.web/big"),
    ]);
    assert_eq!(code, 200);
    let size = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download}",
            &format!("{cap}big"),
        ])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&size.stdout).trim(), "104857600");
    let grown_mib = peak_rss_kib(pid).saturating_sub(before) / 1024;
    assert!(
        grown_mib < 48,
        "the controller's peak RSS grew {grown_mib} MiB streaming 200 MB"
    );

    // A task token registers only for its own job; a user only for theirs.
    let (code, body) = common::http_post_json_with(
        &url,
        "/iris.cluster.EndpointService/RegisterEndpoint",
        r#"{"name":"/alice/site/evil","address":"127.0.0.1:9","taskId":"/alice/site/0","attemptId":0}"#,
        &[
            ("authorization", &format!("Bearer {bob}")),
            ("x-forwarded-for", "203.0.113.9"),
        ],
    );
    assert_eq!(code, 403, "{body}");
    // When the job ends, its endpoint is gone.
    let (ok, _, err) = env.iris(Some(&alice), &["job", "cancel", "/alice/site"]);
    assert!(ok, "{err}");
    let (ok, out, _) = env.iris(Some(&alice), &["endpoints", "list", "/alice/"]);
    assert!(ok && out.contains("No endpoints found."), "{out}");
    let (code, _) = curl(&[&cap]);
    assert_eq!(code, 404);
}

#[test]
fn exec_and_profiles_of_a_task_are_for_its_owner_and_admins() {
    let env = Env::start("");
    let alice = env.user("alice", "user");
    let bob = env.user("bob", "user");
    let root = env.user("root", "admin");
    let (ok, out, err) = env.iris(
        Some(&alice),
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--user",
            "alice",
            "--job-name",
            "ex",
            "-e",
            "EXEC_VAR",
            "from-alice",
            "--",
            "sleep",
            "60",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "/alice/ex");
    // The owner runs a command in the task's environment once it runs.
    let out = common::wait_for(Duration::from_secs(60), "exec in the running task", || {
        let (ok, out, _) = env.iris(
            Some(&alice),
            &[
                "task",
                "exec",
                "/alice/ex/0",
                "--",
                "sh",
                "-c",
                "echo $EXEC_VAR",
            ],
        );
        ok.then_some(out)
    });
    assert_eq!(out.trim(), "from-alice");
    // An admin may too.
    let (ok, out, err) = env.iris(Some(&root), &["task", "exec", "/alice/ex/0", "--", "true"]);
    assert!(ok, "{out}{err}");

    // Another user is refused, the same way for a task that does not exist.
    for task in ["/alice/ex/0", "/alice/nothing/0"] {
        let (ok, out, err) = env.iris(Some(&bob), &["task", "exec", task, "--", "true"]);
        assert!(
            !ok && err.contains("permission_denied"),
            "{task}: {out}{err}"
        );
        assert!(err.contains("owner or an admin"), "{err}");
        let (ok, _, err) = env.iris(Some(&bob), &["task", "profile", task, "threads"]);
        assert!(!ok && err.contains("permission_denied"), "{task}: {err}");
        let (ok, _, err) = env.iris(Some(&bob), &["process", "status", "-t", task]);
        assert!(!ok && err.contains("permission_denied"), "{task}: {err}");
    }
    // Without a token nothing gets through.
    let (ok, _, err) = env.iris(None, &["task", "exec", "/alice/ex/0", "--", "true"]);
    assert!(!ok && err.contains("unauthenticated"), "{err}");

    // The owner's thread dump of a non-Python task falls back to /proc.
    let (ok, out, err) = env.iris(Some(&alice), &["task", "profile", "/alice/ex/0", "threads"]);
    assert!(ok && out.contains("(sleep)"), "{out}{err}");

    let (ok, _, err) = env.iris(Some(&alice), &["job", "cancel", "/alice/ex"]);
    assert!(ok, "{err}");
}
