//! Federation end to end (issue: "one hub, many clusters, every job lands where there is
//! room"): three controllers on 127.0.0.1, each with its own workers and its own signing key
//! from `iris cluster init-keys`; everything is driven through the hub with the `iris` CLI.

mod common;

use common::{http_get, init_keys, wait_for, wait_until, TestCluster, WorkerSpec};
use iris_proto::inspect::{HandoffDirection, HandoffState};
use iris_proto::job::{JobState, TaskState};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(90);

fn indent(pem: &str, n: usize) -> String {
    pem.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(n)))
        .collect()
}

/// A peer's config: enforcing auth, trusting `parent` (name → public PEM), admitting `allowed`.
fn peer_yaml(name: &str, key: &Path, parent: (&str, &str), allowed: &str) -> String {
    format!(
        "name: {name}\nauth:\n  provider: token\n  signing_key: file:{}\n  allowed_submitters: {allowed}\n  federation_peers:\n    {}: |\n{}",
        key.display(),
        parent.0,
        indent(parent.1, 6)
    )
}

fn hub_yaml(key: &Path, peers: &[(&str, &str)]) -> String {
    let mut y = format!(
        "name: hub\nauth:\n  signing_key: file:{}\npeers:\n",
        key.display()
    );
    for (id, url) in peers {
        y.push_str(&format!("  {id}:\n    controller_address: {url}\n"));
    }
    y
}

fn hub_args() -> Vec<&'static str> {
    vec![
        "--federation-heartbeat",
        "0.5",
        "--federation-sync-interval",
        "0.2",
    ]
}

fn user_token(hub_key: &Path, user: &str) -> String {
    let key =
        iris_auth::Keypair::from_pem(&std::fs::read_to_string(hub_key).expect("key")).expect("key");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    key.mint("hub", "iris", user, "user", 3600, now, Default::default())
        .expect("mint")
}

/// `job run --no-wait --job-name NAME <flags> -- <cmd>` on `c`; returns the job id.
#[track_caller]
fn run(c: &TestCluster, name: &str, flags: &[&str], cmd: &[&str]) -> String {
    let mut args = vec!["job", "run", "--no-wait", "--job-name", name];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(cmd);
    let o = c.iris(&args);
    o.job_id()
}

fn peers(hub: &TestCluster) -> Value {
    let o = hub.iris(&["rpc", "controller", "list-peers"]);
    serde_json::from_str(o.ok()).expect("list-peers JSON")
}

fn peer<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["peers"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["peer_id"] == id))
        .unwrap_or(&Value::Null)
}

fn wait_reachable(hub: &TestCluster, id: &str, want: bool) {
    wait_until(LONG, &format!("peer {id} reachable={want}"), || {
        peer(&peers(hub), id)["reachable"]
            .as_bool()
            .unwrap_or(false)
            == want
    });
}

fn wait_state(c: &TestCluster, job: &str, state: &str) -> Value {
    wait_for(LONG, &format!("job {job} to be {state}"), || {
        let v = c.summary(job);
        (v["state"] == state).then_some(v)
    })
}

#[test]
fn hub_routes_mirrors_cancels_and_survives_a_peer_restart() {
    let keys = tempfile::tempdir().expect("keys dir");
    let (hub_key, hub_pub) = init_keys(keys.path(), "hub");
    let (a_key, _) = init_keys(keys.path(), "cw-a");
    let (b_key, _) = init_keys(keys.path(), "cw-b");
    let (c_key, _) = init_keys(keys.path(), "cw-c");
    let (_, stranger_pub) = init_keys(keys.path(), "stranger");

    let mut a = TestCluster::start_with_config(
        &[WorkerSpec::cpu(8).device("gpu:H100:8")],
        Some(&peer_yaml("cw-a", &a_key, ("hub", &hub_pub), "[alice]")),
    );
    let b = TestCluster::start_with_config(
        &[WorkerSpec::cpu(8).device("gpu:GB200:4")],
        Some(&peer_yaml("cw-b", &b_key, ("hub", &hub_pub), "['*']")),
    );
    // cw-c trusts a different key under the hub's name: every hub token fails there.
    let mut c = TestCluster::start_with_config(
        &[WorkerSpec::cpu(2)],
        Some(&peer_yaml("cw-c", &c_key, ("hub", &stranger_pub), "['*']")),
    );
    let mut hub = TestCluster::start_with_args(
        &[WorkerSpec::cpu(4)],
        Some(&hub_yaml(
            &hub_key,
            &[("cw-a", &a.url), ("cw-b", &b.url), ("cw-c", &c.url)],
        )),
        &hub_args(),
    );
    hub.set_cli_token(Some(user_token(&hub_key, "alice")));
    wait_reachable(&hub, "cw-a", true);
    wait_reachable(&hub, "cw-b", true);

    // list-peers has the reference's shape.
    let ps = peers(&hub);
    let pa = peer(&ps, "cw-a");
    assert_eq!(pa["controller_address"], a.url.as_str(), "{ps}");
    let av = &pa["backends"][0]["availability"];
    assert_eq!(av["version"], 3, "{ps}");
    assert!(
        av["observation_epoch_ms"].as_str().is_some() || av["observation_epoch_ms"].is_number(),
        "{ps}"
    );
    assert_eq!(av["amounts"]["h100"], "8", "{ps}");
    assert_eq!(av["total_amounts"]["h100"], "8", "{ps}");
    // The reference's worker-daemon backend: its id and kind, and only routing attributes.
    let ba = &pa["backends"][0];
    assert_eq!(ba["backend_id"], "default", "{ps}");
    assert_eq!(ba["kind"], "worker-daemon", "{ps}");
    assert_eq!(ba["name"], "cw-a", "{ps}");
    assert_eq!(ba["capabilities"], serde_json::json!(["workers"]), "{ps}");
    let keys: Vec<&str> = ba["advertised_attributes"]
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(
        keys,
        vec![
            "availability:h100",
            "device-type",
            "device-variant",
            "preemptible"
        ],
        "{ps}"
    );
    assert_eq!(
        ba["advertised_attributes"]["device-variant"]["values"],
        serde_json::json!(["h100"]),
        "{ps}"
    );
    assert!(
        !peer(&ps, "cw-c")["reachable"].as_bool().unwrap_or(false),
        "{ps}"
    );

    // A CPU job runs on the hub itself.
    let cpu = run(&hub, "cpu", &[], &["true"]);
    assert!(cpu.starts_with("/alice/"), "{cpu}");
    wait_state(&hub, &cpu, "succeeded");
    assert_eq!(hub.job_status(&cpu)["cluster"], "local");

    // H100x8 → cw-a, GB200x4 → cw-b, both under the same job id.
    let h100 = run(
        &hub,
        "h100",
        &["--enable-extra-resources", "--gpu", "H100x8"],
        &["sh", "-c", "echo rank0 train/loss 1.5; sleep 0.3"],
    );
    let gb200 = run(
        &hub,
        "gb200",
        &["--enable-extra-resources", "--gpu", "GB200x4"],
        &["true"],
    );
    wait_state(&hub, &h100, "succeeded");
    wait_state(&hub, &gb200, "succeeded");
    assert_eq!(hub.job_status(&h100)["cluster"], "cw-a");
    assert_eq!(hub.job_status(&gb200)["cluster"], "cw-b");
    assert_eq!(a.job_state(&h100).as_deref(), Some("succeeded"));
    assert_eq!(b.job_state(&gb200).as_deref(), Some("succeeded"));
    assert_eq!(hub.job_status(&h100)["peer_status"], "PEER_STATUS_SYNCED");
    // Logs of the remote job read through the hub.
    let logs = hub.iris(&["job", "logs", &h100]);
    assert!(
        logs.ok().contains("rank0 train/loss 1.5"),
        "{}",
        logs.stdout
    );
    let jd = hub.iris(&["job", "describe", &h100]);
    assert!(
        jd.ok().contains("cw-a") && jd.stdout.contains("succeeded"),
        "{}",
        jd.stdout
    );
    // task describe on the hub shows the mirrored attempt.
    let td = hub.iris(&["task", "describe", &format!("{h100}/0")]);
    assert!(td.ok().contains("succeeded"), "{}", td.stdout);
    // The handoff record is queryable on the hub (admin: the hub's loopback CLI without a token).
    hub.set_cli_token(None);
    let rows = hub.handoffs(&h100);
    hub.set_cli_token(Some(user_token(&hub_key, "alice")));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].peer_id, "cw-a");
    assert_eq!(rows[0].owner_principal, "alice");
    assert_eq!(rows[0].direction(), HandoffDirection::Sent);
    assert_eq!(rows[0].state(), HandoffState::HandedOff);

    // --target-cluster pins a CPU job to cw-b.
    let pinned = run(&hub, "pinned", &["--target-cluster", "cw-b"], &["true"]);
    wait_state(&hub, &pinned, "succeeded");
    assert_eq!(b.job_state(&pinned).as_deref(), Some("succeeded"));

    // A region nobody advertises: refused at submit.
    let o = hub.iris(&[
        "job",
        "run",
        "--no-wait",
        "--job-name",
        "mars",
        "--enable-extra-resources",
        "--gpu",
        "H100x8",
        "--region",
        "mars-1",
        "--",
        "true",
    ]);
    let e = o.err();
    assert!(e.contains("unschedulable"), "{e}");
    // A pin to a peer that does not exist.
    let o = hub.iris(&[
        "job",
        "run",
        "--no-wait",
        "--target-cluster",
        "nope",
        "--",
        "true",
    ]);
    assert!(
        o.err().contains("not a configured federation peer"),
        "{}",
        o.stderr
    );

    // A child that would route to a peer is refused with the hint.
    let parent = run(&hub, "parent", &[], &["sleep", "30"]);
    wait_state(&hub, &parent, "running");
    let o = hub.iris(&[
        "rpc",
        "controller",
        "launch-job",
        "--json",
        &serde_json::json!({
            "name": format!("{parent}/gpu-child"),
            "entrypoint": {"runCommand": {"argv": ["true"]}},
            "resources": {"cpuMillicores": 1000, "memoryBytes": "1073741824",
                          "device": {"gpu": {"variant": "H100", "count": 8}}},
            "replicas": 1
        })
        .to_string(),
    ]);
    assert!(
        o.code != 0
            && o.stdout.contains("only whole root jobs federate")
            && o.stdout.contains("federation peer cw-a")
            && o.stdout.contains("--target-cluster cw-a"),
        "the refusal names the peer: {o:?}"
    );
    hub.iris(&["job", "cancel", &parent]).ok();

    // Refusals end KILLED with the peer's reason: a submitter cw-a does not admit…
    hub.set_cli_token(Some(user_token(&hub_key, "bob")));
    let bobs = run(
        &hub,
        "bobs",
        &["--enable-extra-resources", "--gpu", "H100x8"],
        &["true"],
    );
    let v = wait_state(&hub, &bobs, "killed");
    let err = hub.job_status(&bobs)["error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        err.contains("Peer cw-a rejected the handoff") && err.contains("allowed_submitters"),
        "{err} {v}"
    );
    assert_eq!(a.job_state(&bobs), None, "cw-a must not have bob's job");
    hub.set_cli_token(Some(user_token(&hub_key, "alice")));
    // …a peer that holds a different key for the hub…
    let forged = run(&hub, "wrongkey", &["--target-cluster", "cw-c"], &["true"]);
    wait_state(&hub, &forged, "killed");
    let err = hub.job_status(&forged)["error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        err.contains("Peer cw-c rejected the handoff") && err.contains("invalid token"),
        "{err}"
    );
    assert_eq!(c.job_state(&forged), None);
    // …and a peer that does not know the hub as an issuer at all.
    let other = peer_yaml("cw-c", &c_key, ("elsewhere", &hub_pub), "['*']");
    std::fs::write(c.path("cluster.yaml"), other).expect("rewrite cw-c config");
    c.restart_controller();
    let unknown = run(
        &hub,
        "unknown-issuer",
        &["--target-cluster", "cw-c"],
        &["true"],
    );
    wait_state(&hub, &unknown, "killed");
    let err = hub.job_status(&unknown)["error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(err.contains("Peer cw-c rejected the handoff"), "{err}");
    assert_eq!(c.job_state(&unknown), None);

    // Cancel on the hub reaches the peer.
    let long = run(
        &hub,
        "long",
        &["--enable-extra-resources", "--gpu", "H100x8"],
        &["sleep", "300"],
    );
    wait_state(&hub, &long, "running");
    wait_for(LONG, "cw-a to run it", || {
        (a.job_state(&long).as_deref() == Some("running")).then_some(())
    });
    hub.iris(&["job", "cancel", &long]).ok();
    wait_for(LONG, "cw-a to kill it", || {
        (a.job_state(&long).as_deref() == Some("killed")).then_some(())
    });
    wait_state(&hub, &long, "killed");

    // A running job on cw-a survives its controller's crash; while cw-a is down the hub shows
    // it unreachable and queues a pinned job with the unreachable reason.
    let survivor = run(
        &hub,
        "survivor",
        &["--enable-extra-resources", "--gpu", "H100x8"],
        &["sleep", "4"],
    );
    wait_state(&hub, &survivor, "running");
    a.kill_controller();
    wait_reachable(&hub, "cw-a", false);
    let queued = run(&hub, "while-down", &["--target-cluster", "cw-a"], &["true"]);
    wait_until(LONG, "the unreachable reason", || {
        hub.job_status(&queued)["pending_reason"]
            == "Peer cw-a is unreachable; queued until it reconnects"
    });
    a.start_controller_again();
    wait_reachable(&hub, "cw-a", true);
    wait_state(&hub, &survivor, "succeeded");
    wait_state(&hub, &queued, "succeeded");
    // Nothing lost or duplicated: every job the hub sent to cw-a exists there exactly once.
    for j in [&h100, &long, &survivor, &queued] {
        let n = a.jobs(j).iter().filter(|s| s.job_id() == *j).count();
        assert_eq!(n, 1, "{j} on cw-a");
    }
    drop(c);
}

/// Acceptance 2 and 3: a full peer is waited on at the same band and reclaimed by a higher one;
/// the reservation ledger bounds promotions per heartbeat; a job cancelled while queued never
/// reaches the peer.
#[test]
fn capacity_reclaim_ledger_and_queued_cancel() {
    let keys = tempfile::tempdir().expect("keys dir");
    let (hub_key, hub_pub) = init_keys(keys.path(), "hub");
    let (a_key, _) = init_keys(keys.path(), "cw-a");
    let a = TestCluster::start_with_config(
        &[
            WorkerSpec::cpu(8).device("gpu:H100:8"),
            WorkerSpec::cpu(8).device("gpu:H100:8"),
        ],
        Some(&peer_yaml("cw-a", &a_key, ("hub", &hub_pub), "['*']")),
    );
    let mut args = hub_args();
    args.extend(["--dashboard-bind", "127.0.0.1:0"]);
    let mut hub = TestCluster::start_with_args(
        &[WorkerSpec::cpu(4)],
        Some(&hub_yaml(&hub_key, &[("cw-a", &a.url)])),
        &args,
    );
    hub.set_cli_token(Some(user_token(&hub_key, "alice")));
    wait_reachable(&hub, "cw-a", true);

    // Fill cw-a with BATCH work submitted there directly.
    let fill: Vec<String> = (0..2)
        .map(|i| {
            run(
                &a,
                &format!("fill-{i}"),
                &[
                    "--enable-extra-resources",
                    "--gpu",
                    "H100x8",
                    "--priority",
                    "batch",
                ],
                &["sleep", "300"],
            )
        })
        .collect();
    for j in &fill {
        wait_state(&a, j, "running");
    }
    // The hub's view: nothing free, 16 H100 held at BATCH.
    wait_until(LONG, "the hub to see cw-a's BATCH holdings", || {
        let ps = peers(&hub);
        let av = &peer(&ps, "cw-a")["backends"][0]["availability"];
        av["amounts"]["h100"].as_str().unwrap_or("0") == "0"
            && av["held_by_band"][0]["band"] == "PRIORITY_BAND_BATCH"
            && av["held_by_band"][0]["amounts"]["h100"] == "16"
    });

    // The dashboard's Peers page shows the same picture.
    let dash = hub.dashboard_url();
    let (_, _, page) = http_get(&dash, "/peers", None);
    assert!(
        page.contains("cw-a") && page.contains("reachable"),
        "{page}"
    );
    assert!(page.contains("0/16") && page.contains("batch"), "{page}");

    // A BATCH job cannot reclaim BATCH capacity: it waits on the hub.
    let waits = run(
        &hub,
        "batch-waits",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x8",
            "--priority",
            "batch",
        ],
        &["true"],
    );
    wait_until(LONG, "the queued reason", || {
        hub.job_status(&waits)["pending_reason"]
            == "Queued for a federation peer to report free capacity"
    });
    // An INTERACTIVE job is promoted against the reclaimable BATCH holdings and cw-a preempts.
    let urgent = run(
        &hub,
        "urgent",
        &["--enable-extra-resources", "--gpu", "H100x8"],
        &["sleep", "300"],
    );
    // It keeps running through the checks below: once it ends, its GPUs are free on cw-a until
    // the preempted BATCH attempt is placed again, and the hub may rightly hand `waits` off then.
    wait_state(&hub, &urgent, "running");
    let preempted = fill
        .iter()
        .flat_map(|j| a.attempts_under(j))
        .filter(|at| at.state() == TaskState::Preempted)
        .count();
    assert!(preempted >= 1, "cw-a preempted no BATCH attempt");
    // The BATCH job is still queued; cancelled there, it never reaches cw-a.
    hub.set_cli_token(None);
    let queued = hub.handoffs(&waits);
    assert_eq!(
        queued.iter().map(|h| h.state()).collect::<Vec<_>>(),
        [HandoffState::Queued],
        "{queued:?}"
    );
    hub.set_cli_token(Some(user_token(&hub_key, "alice")));
    hub.iris(&["job", "cancel", &waits]).ok();
    let v = wait_state(&hub, &waits, "killed");
    assert!(
        hub.job_status(&waits)["error"] == "Cancelled before handoff",
        "{v}"
    );
    hub.iris(&["job", "cancel", &urgent]).ok();
    wait_state(&hub, &urgent, "killed");
    for j in &fill {
        a.iris(&["job", "cancel", j]).ok();
    }
    // A later job of the same band and shape reaching cw-a proves the hub promoted against the
    // freed capacity; the cancelled job, queued before it, would have gone first.
    let marker = run(
        &hub,
        "after-cancel",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x8",
            "--priority",
            "batch",
        ],
        &["true"],
    );
    wait_state(&hub, &marker, "succeeded");
    assert_eq!(a.job_state(&marker).as_deref(), Some("succeeded"));
    assert_eq!(
        a.job_state(&waits),
        None,
        "a job cancelled while queued reached the peer"
    );

    // 50 H100x8 jobs against 2 free nodes: at most 2 promotions per heartbeat observation, and
    // every job eventually succeeds.
    let burst: Vec<String> = (0..50)
        .map(|i| {
            run(
                &hub,
                &format!("burst-{i}"),
                &["--enable-extra-resources", "--gpu", "H100x8"],
                &["sleep", "0.2"],
            )
        })
        .collect();
    hub.set_cli_token(None);
    wait_until(
        Duration::from_secs(240),
        "all 50 burst jobs to succeed",
        || {
            hub.job_counts("/alice/burst-")
                .get(&JobState::Succeeded)
                .copied()
                == Some(50)
        },
    );
    let mut per_generation: BTreeMap<i64, usize> = BTreeMap::new();
    for h in hub.handoffs("/alice/burst-") {
        *per_generation.entry(h.generation).or_default() += 1;
    }
    assert!(per_generation.len() >= 25, "{per_generation:?}");
    assert!(
        !per_generation.contains_key(&0),
        "a burst job was promoted without a measured backend: {per_generation:?}"
    );
    assert!(
        per_generation.values().all(|n| *n <= 2),
        "more than 2 promotions against one observation: {per_generation:?}"
    );
    for j in &burst {
        assert_eq!(a.job_state(j).as_deref(), Some("succeeded"), "{j} on cw-a");
    }
}

/// Issue 16, acceptance 4: a job the hub handed to a peer registers an endpoint there; the hub
/// lists it (with the peer's id) and its `/proxy` reaches it, forwarding to the peer's proxy
/// under a federation token; when the job ends, the hub's mirror of it is gone.
#[test]
fn a_hub_lists_and_proxies_the_endpoints_of_jobs_on_a_peer() {
    let keys = tempfile::tempdir().expect("keys dir");
    let (hub_key, hub_pub) = init_keys(keys.path(), "hub");
    let (a_key, _) = init_keys(keys.path(), "cw-a");
    let a = TestCluster::start_with_config(
        &[WorkerSpec::cpu(8).device("gpu:H100:8")],
        Some(&peer_yaml("cw-a", &a_key, ("hub", &hub_pub), "[alice]")),
    );
    let mut hub = TestCluster::start_with_args(
        &[WorkerSpec::cpu(4)],
        Some(&hub_yaml(&hub_key, &[("cw-a", &a.url)])),
        &hub_args(),
    );
    let alice = user_token(&hub_key, "alice");
    hub.set_cli_token(Some(alice.clone()));
    wait_reachable(&hub, "cw-a", true);
    let script = format!(
        "set -e\nmkdir -p site && echo served-on-the-peer > site/index.html\n{}JOB=\"${{IRIS_TASK_ID%/*}}\"\n{}sleep 600\n",
        common::SERVE_SITE_SH,
        common::register_endpoint_sh("$JOB/web", "127.0.0.1:$(cat port)", "")
    );
    let job = run(
        &hub,
        "served",
        &["--enable-extra-resources", "--gpu", "H100x8"],
        &["sh", "-c", &script],
    );
    let name = format!("{job}/web");
    wait_for(LONG, "the hub to list the peer's endpoint", || {
        let o = hub.iris(&["endpoints", "list", &name, "--exact"]);
        o.stdout.contains("cw-a").then_some(())
    });
    let enc = name.trim_start_matches('/').replace('/', ".");
    let body = wait_for(LONG, "the hub's proxy to reach the peer's task", || {
        let o = std::process::Command::new("curl")
            .args(["-sS", "-H", "X-Forwarded-For: 203.0.113.9", "-H"])
            .arg(format!("authorization: Bearer {alice}"))
            .arg(format!("{}/proxy/{enc}/", hub.url))
            .output()
            .expect("curl");
        let body = String::from_utf8_lossy(&o.stdout).into_owned();
        body.contains("served-on-the-peer").then_some(body)
    });
    assert_eq!(body.trim(), "served-on-the-peer");
    // Another user of the hub is refused there, before the peer is asked.
    let bob = user_token(&hub_key, "bob");
    let o = std::process::Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "X-Forwarded-For: 203.0.113.9",
            "-H",
        ])
        .arg(format!("authorization: Bearer {bob}"))
        .arg(format!("{}/proxy/{enc}/", hub.url))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "403");
    hub.iris(&["job", "cancel", &job]).ok();
    wait_for(LONG, "the hub's mirror of the endpoint to go", || {
        let o = hub.iris(&["endpoints", "list", &name, "--exact"]);
        o.stdout.contains("No endpoints found.").then_some(())
    });
}

/// Deliveries a peer has received: every `LaunchJob` it answered, whatever the answer (its own
/// RPC counter on `/metrics`).
fn launch_jobs_received(peer: &TestCluster) -> u64 {
    let (code, _, body) = http_get(&peer.url, "/metrics", None);
    assert_eq!(code, 200, "{body}");
    body.lines()
        .filter(|l| l.starts_with("iris_rpc_requests_total{") && l.contains("method=\"LaunchJob\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Issue 19, acceptance 3: `cluster start --local --config` of a hub config federates with its
/// peers (as `cluster controller serve` does), listens on `controller.local.port`, and on
/// SIGTERM checkpoints, stops its workers' tasks and removes its recorded address.
#[test]
fn cluster_start_local_with_a_hub_config_federates_and_stops_cleanly_on_sigterm() {
    let keys = tempfile::tempdir().expect("keys dir");
    let (hub_key, hub_pub) = init_keys(keys.path(), "hub");
    let (b_key, _) = init_keys(keys.path(), "cw-b");
    let b = TestCluster::start_with_config(
        &[WorkerSpec::cpu(4).device("gpu:H100:8")],
        Some(&peer_yaml("cw-b", &b_key, ("hub", &hub_pub), "['*']")),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let yaml = format!(
        "{}controller:\n  local:\n    port: {port}\nscale_groups:\n  cpu:\n    num_vms: 1\n    resources: {{cpu: 2, ram: 4GB, disk: 10GB, device_type: cpu, device_variant: cpu, capacity_type: on-demand}}\n",
        hub_yaml(&hub_key, &[("cw-b", &b.url)])
    );
    let mut hub = TestCluster::start_local_with_args(&yaml, 1, &hub_args());
    assert_eq!(hub.url, format!("http://127.0.0.1:{port}"));
    hub.set_cli_token(Some(user_token(&hub_key, "alice")));
    wait_reachable(&hub, "cw-b", true);

    // A GPU job the hub's CPU worker cannot run is routed to the peer and succeeds there.
    let gpu = run(
        &hub,
        "gpu",
        &["--enable-extra-resources", "--gpu", "H100x1"],
        &["true"],
    );
    wait_state(&hub, &gpu, "succeeded");
    assert_eq!(hub.job_status(&gpu)["cluster"], "cw-b");
    assert_eq!(b.job_state(&gpu).as_deref(), Some("succeeded"));

    // A long task on the hub's own worker, whose pid we can check after the stop.
    let pid_file = hub.path("task.pid");
    let local = run(
        &hub,
        "sleeper",
        &[],
        &[
            "sh",
            "-c",
            &format!("echo $$ > {}; exec sleep 600", pid_file.display()),
        ],
    );
    wait_state(&hub, &local, "running");
    let pid: u32 = wait_for(LONG, "the task to record its pid", || {
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    });
    assert!(common::alive(pid));

    let st = hub.terminate_controller(LONG);
    assert!(st.success(), "exit status on SIGTERM: {st}");
    assert!(
        !hub.state_dir.join("controller.url").exists(),
        "the recorded URL is removed"
    );
    wait_until(LONG, "the hub's task to be stopped with its worker", || {
        !common::alive(pid)
    });
    let checkpoints = std::fs::read_dir(hub.state_dir.join("remote-state/controller-state"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(checkpoints > 0, "a checkpoint is taken on the way out");
}

/// Issue 19, acceptance 4: a job pinned to a peer none of whose workers can host it shows the
/// peer's own reason on the hub, is offered again only after an exponential backoff (counted on
/// the peer), and ends UNSCHEDULABLE with that reason after its scheduling timeout.
#[test]
fn a_job_the_peer_cannot_host_shows_its_reason_backs_off_and_ends_unschedulable() {
    let keys = tempfile::tempdir().expect("keys dir");
    let (hub_key, hub_pub) = init_keys(keys.path(), "hub");
    let (b_key, _) = init_keys(keys.path(), "cw-b");
    let b = TestCluster::start_with_config(
        &[WorkerSpec::cpu(4)],
        Some(&peer_yaml("cw-b", &b_key, ("hub", &hub_pub), "['*']")),
    );
    let mut hub = TestCluster::start_with_args(
        &[WorkerSpec::cpu(2)],
        Some(&hub_yaml(&hub_key, &[("cw-b", &b.url)])),
        &hub_args(),
    );
    hub.set_cli_token(Some(user_token(&hub_key, "alice")));
    wait_reachable(&hub, "cw-b", true);
    assert_eq!(launch_jobs_received(&b), 0);

    let submitted = std::time::Instant::now();
    let big = run(
        &hub,
        "big",
        &["--target-cluster", "cw-b", "--cpu", "8"],
        &["true"],
    );
    let reason = wait_for(LONG, "the peer's reason on the hub", || {
        let j = hub.job_status(&big);
        let r = j["pending_reason"].as_str().unwrap_or("").to_string();
        r.contains("no worker has 8000m cpu").then_some(r)
    });
    assert!(
        reason.contains("cw-b"),
        "the reason names the peer: {reason}"
    );
    assert_eq!(hub.summary(&big)["state"], "pending");
    // Without a backoff the 0.2 s sync rounds would offer it ~5 times a second. With it, the
    // n-th offer comes at least 2+4+…+2^(n-1) s after the first: within `e` seconds there are
    // at most 1 + log2(e/2 + 1) offers (a slow machine only makes fewer); one spare.
    std::thread::sleep(Duration::from_secs(7));
    let offers = launch_jobs_received(&b);
    let e = submitted.elapsed().as_secs_f64();
    let allowed = 2 + (e / 2.0 + 1.0).log2().floor() as u64;
    assert!(
        (1..=allowed).contains(&offers),
        "{offers} offers in {e:.1} s (at most {allowed} with the backoff)"
    );
    assert!(
        b.job_state(&big).is_none(),
        "the peer never took the job it cannot host"
    );

    // A job the peer accepts but cannot start yet (its one worker is busy) shows the peer's own
    // pending reason, not just "Pending on peer".
    let hog = run(
        &hub,
        "hog",
        &["--target-cluster", "cw-b", "--cpu", "4"],
        &["sleep", "600"],
    );
    wait_until(LONG, "the hog to run on the peer", || {
        b.job_state(&hog).as_deref() == Some("running")
    });
    // Six tasks: the peer's per-job cap (4) holds the last two back, with one reason per job.
    let waiter = run(
        &hub,
        "waiter",
        &["--target-cluster", "cw-b", "--cpu", "4", "--replicas", "6"],
        &["true"],
    );
    let on_peer = wait_for(LONG, "the peer's own pending reason", || {
        let r = b.job_status(&waiter)["pending_reason"]
            .as_str()
            .unwrap_or("")
            .to_string();
        (!r.is_empty()).then_some(r)
    });
    let mirrored = wait_for(
        LONG,
        "the peer's pending reason mirrored on the hub",
        || {
            let r = hub.job_status(&waiter)["pending_reason"]
                .as_str()
                .unwrap_or("")
                .to_string();
            r.strip_prefix("Pending on peer cw-b: ")
                .filter(|w| !w.is_empty())
                .map(str::to_string)
        },
    );
    assert!(
        on_peer.contains(&mirrored) || mirrored.contains(&on_peer),
        "hub shows {mirrored:?}, the peer says {on_peer:?}"
    );
    // A task the cap held back shows the cap's reason on the peer and, mirrored, on the hub.
    let last = format!("{waiter}/5");
    let task_says = |c: &TestCluster| -> String {
        let body = serde_json::json!({ "taskId": last }).to_string();
        let o = c.iris(&["rpc", "controller", "get-task-status", "--json", &body]);
        let v: Value = serde_json::from_str(o.ok()).expect("get-task-status JSON");
        let t = &v["task"];
        let r = t["pending_reason"].as_str().unwrap_or("");
        if r.is_empty() {
            t["status_message"].as_str().unwrap_or("").to_string()
        } else {
            r.to_string()
        }
    };
    wait_for(LONG, "the peer's cap reason for a held-back task", || {
        let r = task_says(&b);
        r.contains("Per-job cycle cap reached").then_some(r)
    });
    wait_for(
        LONG,
        "the cap reason of a held-back task on the hub",
        || {
            let r = task_says(&hub);
            r.contains("Per-job cycle cap reached").then_some(r)
        },
    );
    hub.iris(&["job", "cancel", &hog]).ok();
    hub.iris(&["job", "cancel", &waiter]).ok();

    // With a scheduling timeout the job ends UNSCHEDULABLE, carrying the peer's reason.
    let req = serde_json::json!({
        "name": "/alice/big-timed",
        "entrypoint": {"runCommand": {"argv": ["true"]}},
        "replicas": 1,
        "resources": {"cpuMillicores": 8000, "memoryBytes": "1073741824"},
        "constraints": [{"key": "cluster", "value": {"stringValue": "cw-b"}}],
        "schedulingTimeout": {"milliseconds": "4000"},
    });
    hub.iris(&[
        "rpc",
        "controller",
        "launch-job",
        "--json",
        &req.to_string(),
    ])
    .ok();
    hub.wait_job("/alice/big-timed", "unschedulable");
    let s = hub.job_status("/alice/big-timed");
    let err = s["error"].as_str().unwrap_or("");
    assert!(
        err.contains("cw-b") && err.contains("no worker has 8000m cpu"),
        "{s}"
    );
}

/// A TCP relay on 127.0.0.1 in front of a peer that can lose the peer's answers to `LaunchJob`
/// and `FederationSync`: with `drop_answers` set, the request still reaches the peer, but the
/// first bytes the peer sends back on that connection close both sides instead (the request was
/// delivered, its answer lost). Heartbeats (`ListBackends`) pass, so the peer stays reachable. The hub's
/// client speaks HTTP/1.1 to `http://` peers, one request at a time per connection, so the
/// request line names the call whose answer comes next.
struct LossyLink {
    url: String,
    drop_answers: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Answers lost so far.
    lost: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl LossyLink {
    fn to(upstream_url: &str) -> LossyLink {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let upstream = upstream_url.trim_start_matches("http://").to_string();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let drop_answers = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicUsize::new(0));
        let (d, l) = (drop_answers.clone(), lost.clone());
        // The accept thread ends with the test process (it owns nothing but sockets).
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                let (Ok(mut c_read), Ok(mut s_write)) = (client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                // Whether the request in flight on this connection is one whose answer is lost.
                let launch = Arc::new(AtomicBool::new(false));
                let up = launch.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    loop {
                        let n = match c_read.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if buf[..n].starts_with(b"POST ") {
                            let head = String::from_utf8_lossy(&buf[..n.min(200)]).into_owned();
                            up.store(
                                head.contains("/LaunchJob ") || head.contains("/FederationSync "),
                                Ordering::SeqCst,
                            );
                        }
                        if s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s_write.shutdown(std::net::Shutdown::Write);
                });
                let (d, l) = (d.clone(), l.clone());
                std::thread::spawn(move || {
                    let (mut s_read, mut c_write) = (server, client);
                    let mut buf = [0u8; 16 * 1024];
                    loop {
                        let n = match s_read.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if d.load(Ordering::SeqCst) && launch.load(Ordering::SeqCst) {
                            l.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        if c_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c_write.shutdown(std::net::Shutdown::Both);
                    let _ = s_read.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        LossyLink {
            url,
            drop_answers,
            lost,
        }
    }

    fn set_dropping(&self, on: bool) {
        self.drop_answers
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    fn answers_lost(&self) -> usize {
        self.lost.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Jobs on `c` whose id is `job` (a peer must never hold two of one handoff).
fn copies(c: &TestCluster, job: &str) -> usize {
    c.jobs(job).iter().filter(|j| j.job_id() == job).count()
}

/// Issue 18, federation faults: the hub's handoff reaches the peer but the peer's answer is
/// lost (the link drops the answers to `LaunchJob` and `FederationSync` for a while, so the hub
/// learns nothing). The hub offers it again with the same nonce; the peer acknowledges the job
/// it already has instead of refusing or copying it; the job ends once, on the peer, and the
/// hub shows that (once an answer gets through, or its mirror shows the peer has the job).
#[test]
fn a_handoff_whose_answer_is_lost_ends_with_exactly_one_job_on_the_peer() {
    let keys = tempfile::tempdir().expect("keys dir");
    let (hub_key, hub_pub) = init_keys(keys.path(), "hub");
    let (a_key, _) = init_keys(keys.path(), "cw-a");
    let a = TestCluster::start_with_config(
        &[WorkerSpec::cpu(4).device("gpu:H100:8")],
        Some(&peer_yaml("cw-a", &a_key, ("hub", &hub_pub), "['*']")),
    );
    let link = LossyLink::to(&a.url);
    let mut hub = TestCluster::start_with_args(
        &[WorkerSpec::cpu(2)],
        Some(&hub_yaml(&hub_key, &[("cw-a", &link.url)])),
        &hub_args(),
    );
    hub.set_cli_token(Some(user_token(&hub_key, "alice")));
    wait_reachable(&hub, "cw-a", true);
    let offers_before = launch_jobs_received(&a);

    link.set_dropping(true);
    let job = run(
        &hub,
        "lost-answer",
        &["--enable-extra-resources", "--gpu", "H100x1"],
        &["sh", "-c", "echo ran-once"],
    );
    // The peer has it (the request was delivered) and its answer was lost.
    wait_until(LONG, "the peer to receive the job", || {
        copies(&a, &job) == 1
    });
    wait_until(LONG, "the peer's answer to be lost", || {
        link.answers_lost() > 0 && launch_jobs_received(&a) > offers_before
    });
    let h = hub.handoffs(&job);
    assert_eq!(
        h.first().map(|h| h.state),
        Some(HandoffState::Pending as i32),
        "the hub has no answer yet: {h:?}"
    );
    // The hub keeps offering it while answers are lost.
    wait_until(LONG, "a second offer of the same handoff", || {
        launch_jobs_received(&a) >= offers_before + 2
    });
    link.set_dropping(false);

    wait_state(&hub, &job, "succeeded");
    assert_eq!(a.job_state(&job).as_deref(), Some("succeeded"));
    assert_eq!(copies(&a, &job), 1, "exactly one copy on the peer");
    let h = hub.handoffs(&job);
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!(h[0].state, HandoffState::HandedOff as i32, "{h:?}");
    // It ran once: one attempt, one line of output.
    assert_eq!(a.attempts(&format!("{job}/0")).len(), 1);
    let logs = hub.iris(&["job", "logs", &job]);
    assert_eq!(logs.ok().matches("ran-once").count(), 1, "{}", logs.stdout);
}

/// Issue 18, federation faults: a peer restarts from a checkpoint taken before it accepted a
/// job (its DB lost, the newest checkpoint restored). Its next full snapshot lacks the job; the
/// hub delivers it again instead of showing a state nobody holds, and it finishes there once.
#[test]
fn a_peer_restored_from_a_checkpoint_older_than_a_handoff_gets_the_job_again() {
    let keys = tempfile::tempdir().expect("keys dir");
    let (hub_key, hub_pub) = init_keys(keys.path(), "hub");
    let (a_key, _) = init_keys(keys.path(), "cw-a");
    let remote = tempfile::tempdir().expect("remote dir");
    let remote_url = format!("file://{}", remote.path().display());
    let mut a = TestCluster::start_with_args(
        &[WorkerSpec::cpu(4).device("gpu:H100:8")],
        Some(&peer_yaml("cw-a", &a_key, ("hub", &hub_pub), "['*']")),
        &["--remote-state-dir", &remote_url],
    );
    let hub = {
        let mut h = TestCluster::start_with_args(
            &[WorkerSpec::cpu(2)],
            Some(&hub_yaml(&hub_key, &[("cw-a", &a.url)])),
            &hub_args(),
        );
        h.set_cli_token(Some(user_token(&hub_key, "alice")));
        h
    };
    wait_reachable(&hub, "cw-a", true);
    // An earlier job, handed off and finished before the checkpoint.
    let before = run(
        &hub,
        "before",
        &["--enable-extra-resources", "--gpu", "H100x1"],
        &["true"],
    );
    wait_state(&hub, &before, "succeeded");
    a.iris(&["cluster", "controller", "checkpoint"]).ok();

    let flag = hub.path("go");
    let job = run(
        &hub,
        "after-the-checkpoint",
        &["--enable-extra-resources", "--gpu", "H100x1"],
        &[
            "sh",
            "-c",
            &format!(
                "while [ ! -f {} ]; do sleep 0.1; done; echo finished",
                flag.display()
            ),
        ],
    );
    wait_state(&hub, &job, "running");

    // The peer loses its DB and comes back from the older checkpoint.
    a.kill_controller();
    for f in [
        "controller.sqlite3",
        "controller.sqlite3-wal",
        "controller.sqlite3-shm",
    ] {
        let _ = std::fs::remove_file(a.state_dir.join(f));
    }
    a.start_controller_again();
    assert_eq!(
        a.job_state(&before).as_deref(),
        Some("succeeded"),
        "restored from the checkpoint"
    );

    // The hub delivers it again; it runs on the peer and finishes there, once.
    wait_until(LONG, "the job to be delivered again", || {
        copies(&a, &job) == 1
    });
    std::fs::write(&flag, "").expect("flag");
    wait_state(&hub, &job, "succeeded");
    assert_eq!(a.job_state(&job).as_deref(), Some("succeeded"));
    assert_eq!(copies(&a, &job), 1);
    assert_eq!(
        hub.job_state(&before).as_deref(),
        Some("succeeded"),
        "a job that ended is not touched"
    );
    let h = hub.handoffs(&job);
    assert_eq!(h[0].state, HandoffState::HandedOff as i32, "{h:?}");
    let log = std::fs::read_to_string(hub.path("controller.log")).unwrap_or_default();
    assert!(
        log.contains("peer lost a handed-off job; delivering it again"),
        "the hub says what it did"
    );
}
