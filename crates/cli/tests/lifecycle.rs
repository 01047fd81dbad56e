//! A local cluster's lifecycle from another terminal, as the published CLI drives it:
//! `cluster stop` (and `--dry-run`), `cluster restart`, `cluster start --fresh`,
//! `cluster controller checkpoint --stop`; `cluster init-keys` reading an existing key back and
//! `--rotate`; `job run --reserve` waiting until its accelerator can be found.

mod common;

use common::{iris_in, wait_for, wait_until, Daemon, TestCluster, WorkerSpec};
use std::path::Path;
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);

fn url_of(state: &Path) -> String {
    let f = state.join("controller.url");
    wait_for(MINUTE, "the local cluster's URL", || {
        std::fs::read_to_string(&f)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|u| !u.is_empty())
    })
}

fn start_local(dir: &Path, state: &Path, extra: &[&str], log: &str) -> Daemon {
    let s = state.to_string_lossy().to_string();
    let mut args = vec!["cluster", "start", "--local", "--state-dir", s.as_str()];
    args.extend_from_slice(extra);
    Daemon::spawn(dir, &[], &args, &dir.join(log))
}

fn run_job(dir: &Path, url: &str, name: &str) {
    let out = iris_in(
        dir,
        &[],
        &[
            "--controller-url",
            url,
            "job",
            "run",
            "--job-name",
            name,
            "--",
            "echo",
            "hello",
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
}

fn job_ids(dir: &Path, url: &str) -> String {
    let out = iris_in(dir, &[], &["--controller-url", url, "job", "list"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.stdout
}

#[test]
fn cluster_stop_restart_and_fresh_act_on_the_running_local_cluster() {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let s = state.to_string_lossy().to_string();
    let mut first = start_local(dir.path(), &state, &[], "first.log");
    let url = url_of(&state);
    run_job(dir.path(), &url, "before-stop");

    // --dry-run names the controller and its workers and stops nothing.
    let out = iris_in(
        dir.path(),
        &[],
        &["cluster", "stop", "--dry-run", "--state-dir", &s],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .contains(&format!("Would stop the controller (pid {}", first.pid())),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("Would stop its 2 local worker(s)"),
        "{}",
        out.stdout
    );
    assert!(first.wait_exit(Duration::from_millis(200)).is_none());

    // `cluster restart` stops the running cluster and serves again on the same state.
    let mut second = Daemon::spawn(
        dir.path(),
        &[],
        &["cluster", "restart", "--state-dir", &s],
        &dir.path().join("second.log"),
    );
    let status = first.wait_exit(MINUTE).expect("the first cluster exited");
    assert!(
        status.success(),
        "the first cluster exits cleanly: {status}"
    );
    let url = wait_for(MINUTE, "the restarted cluster's URL", || {
        let u = std::fs::read_to_string(state.join("controller.url")).ok()?;
        let lock = std::fs::read_to_string(state.join("controller.lock")).ok()?;
        lock.contains(&format!("pid {}", second.pid()))
            .then(|| u.trim().to_string())
            .filter(|u| !u.is_empty())
    });
    assert!(
        job_ids(dir.path(), &url).contains("before-stop"),
        "a restart keeps the cluster's jobs"
    );

    // `cluster stop` waits until the controller is gone; a second one has nothing to stop.
    let out = iris_in(dir.path(), &[], &["cluster", "stop", "--state-dir", &s]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("Stopped the controller"),
        "{}",
        out.stdout
    );
    let status = second.wait_exit(Duration::from_secs(5)).expect("exited");
    assert!(status.success(), "{status}");
    assert!(!state.join("controller.url").exists());
    let out = iris_in(dir.path(), &[], &["cluster", "stop", "--state-dir", &s]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("Nothing to stop"), "{}", out.stdout);

    // --fresh starts empty and keeps the previous DB beside it.
    let mut third = start_local(dir.path(), &state, &["--fresh"], "third.log");
    let url = url_of(&state);
    assert!(
        !job_ids(dir.path(), &url).contains("before-stop"),
        "--fresh starts on an empty DB"
    );
    let aside = std::fs::read_dir(&state)
        .expect("state dir")
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n.starts_with("controller.sqlite3.set-aside-")
                && !n.ends_with("-wal")
                && !n.ends_with("-shm")
        })
        .count();
    assert_eq!(aside, 1, "the previous DB is set aside, not deleted");
    let out = iris_in(dir.path(), &[], &["cluster", "stop", "--state-dir", &s]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(third.wait_exit(Duration::from_secs(5)).is_some());
}

#[test]
fn checkpoint_stop_writes_a_checkpoint_then_stops_the_controller() {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let remote = dir.path().join("remote");
    let (s, r) = (
        state.to_string_lossy().to_string(),
        remote.to_string_lossy().to_string(),
    );
    let mut serve = Daemon::spawn(
        dir.path(),
        &[],
        &[
            "cluster",
            "controller",
            "serve",
            "--state-dir",
            &s,
            "--remote-state-dir",
            &r,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ],
        &dir.path().join("serve.log"),
    );
    let url = url_of(&state);
    let out = iris_in(
        dir.path(),
        &[],
        &[
            "--controller-url",
            &url,
            "cluster",
            "controller",
            "checkpoint",
            "--stop",
            "--state-dir",
            &s,
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("Checkpoint written to"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("Stopped the controller"),
        "{}",
        out.stdout
    );
    let status = serve.wait_exit(Duration::from_secs(5)).expect("exited");
    assert!(status.success(), "{status}");
    let checkpoints = std::fs::read_dir(remote.join("controller-state"))
        .expect("checkpoints")
        .count();
    assert_eq!(checkpoints, 1);

    // --checkpoint-path names one checkpoint: into an empty state dir it is restored.
    let name = std::fs::read_dir(remote.join("controller-state"))
        .expect("checkpoints")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .next()
        .expect("one checkpoint");
    let path = format!("{r}/controller-state/{name}");
    let fresh_state = dir.path().join("state2");
    let s2 = fresh_state.to_string_lossy().to_string();
    let mut restored = Daemon::spawn(
        dir.path(),
        &[],
        &[
            "cluster",
            "controller",
            "serve",
            "--state-dir",
            &s2,
            "--checkpoint-path",
            &path,
        ],
        &dir.path().join("restored.log"),
    );
    let _ = url_of(&fresh_state);
    assert!(fresh_state.join("controller.sqlite3").exists());
    let out = iris_in(dir.path(), &[], &["cluster", "stop", "--state-dir", &s2]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(restored.wait_exit(Duration::from_secs(5)).is_some());

    // A path that is not a checkpoint directory is refused with the expected shape.
    let out = iris_in(
        dir.path(),
        &[],
        &[
            "cluster",
            "controller",
            "serve",
            "--state-dir",
            &s2,
            "--checkpoint-path",
            &r,
        ],
    );
    assert_ne!(out.code, 0);
    assert!(
        out.stderr
            .contains("expected <remote_state_dir>/controller-state/<epoch_ms>"),
        "{}",
        out.stderr
    );
}

#[test]
fn init_keys_reads_an_existing_key_back_and_rotates_only_when_asked() {
    let dir = tempfile::tempdir().expect("dir");
    let key = dir.path().join("cluster.pem");
    let k = key.to_string_lossy().to_string();
    let kid = |out: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix("kid: "))
            .map(str::to_string)
            .expect("a kid line")
    };
    let first = iris_in(dir.path(), &[], &["cluster", "init-keys", "--out-file", &k]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let again = iris_in(dir.path(), &[], &["cluster", "init-keys", "--out-file", &k]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(
        kid(&first.stdout),
        kid(&again.stdout),
        "read back, not replaced"
    );
    assert!(again.stdout.contains("existing key"), "{}", again.stdout);
    let rotated = iris_in(
        dir.path(),
        &[],
        &["cluster", "init-keys", "--out-file", &k, "--rotate"],
    );
    assert_eq!(rotated.code, 0, "{}", rotated.stderr);
    assert_ne!(kid(&first.stdout), kid(&rotated.stdout));
    assert!(dir.path().join("cluster.pem.previous").exists());
    let gcp = iris_in(
        dir.path(),
        &[],
        &[
            "cluster",
            "init-keys",
            "--gcp-secret",
            "projects/p/secrets/s",
        ],
    );
    assert_ne!(gcp.code, 0);
    assert!(gcp.stderr.contains("--out-file"), "{}", gcp.stderr);
}

#[test]
fn a_reserving_job_waits_until_its_accelerator_can_be_found_in_the_region() {
    let mut c = TestCluster::start(&[WorkerSpec::cpu(4).attr("region", "us-west")]);
    let west = c.submit(
        "reserve-west",
        &["--reserve", "4:H100x8", "--region", "us-west"],
        &["echo", "reserved"],
    );
    let reason = wait_for(MINUTE, "a pending reason", || {
        let s = c.job_status(&west);
        let r = s["pending_reason"].as_str().unwrap_or("").to_string();
        (!r.is_empty()).then_some(r)
    });
    assert!(reason.contains("availability:h100"), "{reason}");
    // An H100 worker in us-east marks us-east: a reserving job without a region runs there
    // (it needs no GPU itself), and once it has, the us-west job is still waiting.
    c.add_worker(
        &WorkerSpec::cpu(4)
            .device("gpu:h100:8")
            .attr("region", "us-east"),
    );
    let anywhere = c.submit("reserve-anywhere", &["--reserve", "H100"], &["true"]);
    c.wait_job(&anywhere, "succeeded");
    assert_eq!(c.job_state(&west).as_deref(), Some("pending"));
    c.add_worker(
        &WorkerSpec::cpu(4)
            .device("gpu:h100:8")
            .attr("region", "us-west"),
    );
    c.wait_job(&west, "succeeded");
    let bad = c.iris(&["job", "run", "--no-wait", "--reserve", "8", "--", "true"]);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("--reserve"), "{}", bad.stderr);
}

/// A stand-in for `kubectl port-forward` and for gcloud (`compute instances list` answers one
/// running controller VM; `compute ssh ... -L 127.0.0.1:LOCAL:localhost:PORT`): records its
/// arguments, then forwards the local port it was given to the address in `$FAKE_TARGET_FILE`
/// (the test's controller) until killed.
const FAKE_KUBECTL: &str = r#"#!/usr/bin/env python3
import json, os, socket, sys, threading
open(os.environ["FAKE_ARGS_FILE"], "a").write(" ".join(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if "instances" in args:
    print(json.dumps([{"name": "iris-ctl", "status": "RUNNING",
                       "zone": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a"}]))
    sys.exit(0)
if "port-forward" in args:
    local = args[args.index("port-forward") + 2].split(":")[0]
else:
    local = args[args.index("-L") + 1].split(":")[1]
host, port = open(os.environ["FAKE_TARGET_FILE"]).read().strip().rsplit(":", 1)
srv = socket.create_server(("127.0.0.1", int(local)))
def pipe(a, b):
    try:
        while (d := a.recv(65536)):
            b.sendall(d)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try: s.shutdown(socket.SHUT_RDWR)
            except OSError: pass
while True:
    c, _ = srv.accept()
    u = socket.create_connection((host, int(port)))
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
"#;

#[test]
fn a_coreweave_config_is_reached_through_a_kubectl_port_forward() {
    use std::os::unix::fs::PermissionsExt;
    let c = TestCluster::start(&[WorkerSpec::cpu(2)]);
    let job = c.submit("through-the-tunnel", &[], &["true"]);
    c.wait_job(&job, "succeeded");
    let dir = tempfile::tempdir().expect("dir");
    let kubectl = dir.path().join("kubectl");
    std::fs::write(&kubectl, FAKE_KUBECTL).expect("write");
    std::fs::set_permissions(&kubectl, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let target = dir.path().join("target");
    let address = c.url.trim_start_matches("http://").to_string();
    std::fs::write(&target, &address).expect("write");
    let args_file = dir.path().join("args");
    let cfg = dir.path().join("cw.yaml");
    std::fs::write(
        &cfg,
        "name: cw-test\nplatform:\n  coreweave:\n    namespace: research\n    kubeconfig_path: /etc/kube/cw\ncontroller:\n  coreweave:\n    port: 10000\n    scale_group: cpu\nscale_groups:\n  cpu:\n    num_vms: 1\n    resources: {cpu: 2, ram: 4GB, disk: 10GB, device_type: cpu, device_variant: cpu, capacity_type: on-demand}\n",
    )
    .expect("config");
    let envs: [(&str, &Path); 3] = [
        ("IRIS_KUBECTL", &kubectl),
        ("FAKE_TARGET_FILE", &target),
        ("FAKE_ARGS_FILE", &args_file),
    ];
    let out = iris_in(
        dir.path(),
        &envs,
        &["--config", &cfg.to_string_lossy(), "job", "list"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("through-the-tunnel"), "{}", out.stdout);
    let args = std::fs::read_to_string(&args_file).expect("kubectl ran");
    assert!(
        args.starts_with(
            "--kubeconfig /etc/kube/cw -n research port-forward svc/iris-controller-svc "
        ),
        "{args}"
    );
    assert!(args.trim_end().ends_with(":10000"), "{args}");
    // The tunnel lives only as long as the command.
    let local = args
        .split_whitespace()
        .last()
        .and_then(|p| p.split(':').next())
        .expect("port");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{local}").parse().expect("addr");
    wait_until(
        Duration::from_secs(10),
        "the port-forward to be closed",
        || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err(),
    );
    // A kubectl that fails says so, with its own words.
    let broken = dir.path().join("broken-kubectl");
    std::fs::write(
        &broken,
        "#!/bin/sh\necho 'error: services \"iris-controller-svc\" not found' >&2\nexit 1\n",
    )
    .expect("write");
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = iris_in(
        dir.path(),
        &[("IRIS_KUBECTL", &broken)],
        &["--config", &cfg.to_string_lossy(), "job", "list"],
    );
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("not found") && out.stderr.contains("namespace research"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_gcp_config_is_reached_through_a_gcloud_ssh_tunnel_to_the_labelled_vm() {
    use std::os::unix::fs::PermissionsExt;
    let c = TestCluster::start(&[WorkerSpec::cpu(2)]);
    let job = c.submit("through-ssh", &[], &["true"]);
    c.wait_job(&job, "succeeded");
    let dir = tempfile::tempdir().expect("dir");
    let gcloud = dir.path().join("gcloud");
    std::fs::write(&gcloud, FAKE_KUBECTL).expect("write");
    std::fs::set_permissions(&gcloud, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let target = dir.path().join("target");
    std::fs::write(&target, c.url.trim_start_matches("http://")).expect("write");
    let args_file = dir.path().join("args");
    let key = dir.path().join("gce-key");
    let cfg = dir.path().join("gcp.yaml");
    let yaml = |key_file: &Path| {
        format!(
            "name: gcp-test\nplatform:\n  label_prefix: marin\n  gcp:\n    project_id: hai-test\n    zones: [us-central1-a]\n\
             defaults:\n  ssh:\n    key_file: {}\ncontroller:\n  gcp:\n    zone: us-central1-a\n    port: 10000\n",
            key_file.display()
        )
    };
    std::fs::write(&cfg, yaml(&key)).expect("config");
    let envs: [(&str, &Path); 3] = [
        ("IRIS_GCLOUD", &gcloud),
        ("FAKE_TARGET_FILE", &target),
        ("FAKE_ARGS_FILE", &args_file),
    ];
    // No SSH key: refused before gcloud runs (it would wait at a prompt).
    let out = iris_in(
        dir.path(),
        &envs,
        &["--config", &cfg.to_string_lossy(), "job", "list"],
    );
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("no SSH key") && out.stderr.contains("key_file"),
        "{}",
        out.stderr
    );
    assert!(!args_file.exists(), "gcloud ran without a key");
    std::fs::write(&key, "fake key").expect("key");
    let out = iris_in(
        dir.path(),
        &envs,
        &["--config", &cfg.to_string_lossy(), "job", "list"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("through-ssh"), "{}", out.stdout);
    let args = std::fs::read_to_string(&args_file).expect("gcloud ran");
    let lines: Vec<&str> = args.lines().collect();
    assert_eq!(lines.len(), 2, "{args}");
    assert!(
        lines[0].starts_with("compute instances list --project=hai-test --filter=labels.iris-marin-controller=true AND status=RUNNING"),
        "{args}"
    );
    assert!(
        lines[1].starts_with("compute ssh iris-ctl --project=hai-test --zone=us-central1-a")
            && lines[1].contains(" -- -L 127.0.0.1:")
            && lines[1].contains(":localhost:10000 -N"),
        "{args}"
    );
    // The tunnel lives only as long as the command.
    let local = lines[1]
        .split_whitespace()
        .find(|a| a.starts_with("127.0.0.1:"))
        .and_then(|a| a.split(':').nth(1))
        .expect("port");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{local}").parse().expect("addr");
    wait_until(
        Duration::from_secs(10),
        "the ssh tunnel to be closed",
        || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err(),
    );
    // No controller VM running: said with the label and project.
    let none = dir.path().join("gcloud-none");
    std::fs::write(&none, "#!/bin/sh\necho '[]'\n").expect("write");
    std::fs::set_permissions(&none, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = iris_in(
        dir.path(),
        &[("IRIS_GCLOUD", &none)],
        &["--config", &cfg.to_string_lossy(), "job", "list"],
    );
    assert_ne!(out.code, 0);
    assert!(
        out.stderr
            .contains("no running controller VM in project hai-test")
            && out.stderr.contains("iris-marin-controller=true"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_configs_budget_defaults_and_user_budgets_apply() {
    let c = TestCluster::start_local(
        "name: budgets\nplatform: {local: {}}\ncontroller: {local: {port: 0}}\n\
         user_budget_defaults: {budget_limit: 7, max_band: PRIORITY_BAND_BATCH}\n\
         user_budgets:\n  - user_ids: [power]\n    budget_limit: 75000\n    max_band: PRIORITY_BAND_INTERACTIVE\n  \
         - user_ids: [power, root]\n    budget_limit: 0\n    max_band: PRIORITY_BAND_PRODUCTION\n\
         scale_groups:\n  cpu:\n    num_vms: 1\n    resources: {cpu: 4, ram: 8GB, disk: 10GB, device_type: cpu, device_variant: cpu, capacity_type: on-demand}\n",
        1,
    );
    let budget = |user: &str| {
        let o = c.iris(&["user", "budget", "get", user]);
        o.ok().to_string()
    };
    // An unlisted user gets the defaults: limit 7, nothing above BATCH.
    let alice = budget("alice");
    assert!(
        alice.contains('7') && alice.to_lowercase().contains("batch"),
        "{alice}"
    );
    let o = c.iris(&[
        "job",
        "run",
        "--no-wait",
        "--user",
        "alice",
        "--priority",
        "interactive",
        "--",
        "true",
    ]);
    assert_ne!(o.code, 0);
    assert!(o.stderr.contains("maximum band batch"), "{}", o.stderr);
    // A later tier wins for a user listed twice.
    let power = budget("power");
    assert!(power.to_lowercase().contains("production"), "{power}");
    let o = c.iris(&[
        "job",
        "run",
        "--no-wait",
        "--user",
        "power",
        "--job-name",
        "prod",
        "--priority",
        "production",
        "--",
        "true",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    c.wait_job("/power/prod", "succeeded");
}
