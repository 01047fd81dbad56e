//! The Kubernetes backend end to end (issue: "one Pod per attempt, admitted by Kueue"): a
//! controller process whose `kubernetes_provider` points at the test kit's API server, which
//! speaks the real REST and watch protocol and simulates Kueue admission and a kubelet that runs
//! each container's command as a local process. Nothing here ran against a real cluster.

mod common;

use common::{http_get, wait_for, wait_until, TestCluster};
use iris_kube_testkit::{NodeSpec, ServerOptions, TestApiServer};
use serde_json::Value;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(90);
const NS: &str = "iris";

struct Env {
    cluster: TestCluster,
    server: Option<TestApiServer>,
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.rt.block_on(s.shutdown());
        }
    }
}

fn start() -> Env {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let opts = ServerOptions {
        nodes: vec![
            // Iris pods select nodes carrying the managed label (`iris-<label_prefix>-managed`).
            NodeSpec::new("cpu-0").label("iris-iris-managed", "true"),
            NodeSpec::new("gpu-0")
                .gpus(8)
                .label("iris-iris-managed", "true")
                .label("nvidia.com/gpu.product", "H100"),
            NodeSpec::new("gpu-1")
                .gpus(8)
                .label("iris-iris-managed", "true")
                .label("nvidia.com/gpu.product", "H100"),
        ],
        gpu_quota: Some(16),
        namespaces: vec![NS.to_string()],
        ..Default::default()
    };
    let (server, _url) = rt
        .block_on(TestApiServer::start(opts))
        .expect("test API server");
    let dir = tempfile::tempdir().expect("dir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig_yaml(NS)).expect("kubeconfig");
    let yaml = format!(
        "name: k8s\nkubernetes_provider:\n  namespace: {NS}\n  kubeconfig: {}\n  controller_address: http://127.0.0.1:9\n  kueue: {{cluster_queue: cluster-queue}}\nscale_groups:\n  h100:\n    num_vms: 2\n    resources: {{cpu: 64, ram: 256GB, disk: 1TB, device_type: gpu, device_variant: H100, device_count: 8, capacity_type: on-demand}}\n",
        kubeconfig.display()
    );
    let cluster =
        TestCluster::start_with_args(&[], Some(&yaml), &["--dashboard-bind", "127.0.0.1:0"]);
    wait_until(LONG, "the Kubernetes backend to register", || {
        let o = cluster.iris(&["rpc", "controller", "list-backends"]);
        o.code == 0 && o.stdout.contains("k8s-cpu") && o.stdout.contains("k8s-h100")
    });
    Env {
        cluster,
        server: Some(server),
        rt,
        _dir: dir,
    }
}

impl Env {
    fn server(&self) -> &TestApiServer {
        self.server.as_ref().expect("server")
    }

    #[track_caller]
    fn run(&self, name: &str, flags: &[&str], cmd: &[&str]) -> String {
        let mut args = vec!["job", "run", "--no-wait", "--no-bundle", "--job-name", name];
        args.extend_from_slice(flags);
        args.push("--");
        args.extend_from_slice(cmd);
        let o = self.cluster.iris(&args);
        o.job_id()
    }

    fn wait_state(&self, job: &str, state: &str) -> Value {
        wait_for(LONG, &format!("job {job} to be {state}"), || {
            let v = self.cluster.summary(job);
            (v["state"] == state).then_some(v)
        })
    }

    /// The pod of a task's current attempt.
    fn pod_of(&self, task: &str) -> String {
        // The current attempt is the newest one.
        let rows = self.cluster.attempts(task);
        let last = rows
            .last()
            .unwrap_or_else(|| panic!("{task} has no attempt"));
        let id = last["attempt_id"].as_i64().unwrap_or(0) as u32;
        let uid = last["attempt_uid"].as_str().unwrap_or("").to_string();
        iris_kube_model::manifest::pod_name(task, id, &uid)
    }

    fn pod(&self, name: &str) -> Option<Value> {
        self.server().get("v1", "pods", Some(NS), name)
    }

    fn attempt_states(&self, task: &str) -> Vec<i64> {
        self.cluster
            .attempts(task)
            .iter()
            .filter_map(|r| r["state"].as_i64())
            .collect()
    }
}

#[test]
fn pods_kueue_and_lifecycle() {
    let env = start();
    let c = &env.cluster;

    // A CPU job, a 1-GPU job and an 8-replica H100 gang run to success through Kueue.
    let cpu = env.run("cpu", &[], &["sh", "-c", "echo hello-from-a-pod"]);
    let one = env.run(
        "one-gpu",
        &["--enable-extra-resources", "--gpu", "H100x1"],
        &["true"],
    );
    let gang = env.run(
        "gang",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x2",
            "--replicas",
            "8",
            "--group-by",
            "leafgroup",
        ],
        &["sh", "-c", "echo rank $IRIS_TASK_ID"],
    );
    env.wait_state(&cpu, "succeeded");
    env.wait_state(&one, "succeeded");
    env.wait_state(&gang, "succeeded");
    let logs = c.iris(&["job", "logs", &cpu]);
    assert!(logs.ok().contains("hello-from-a-pod"), "{}", logs.stdout);
    // The pods carried Kueue's labels; finished pods are garbage-collected.
    wait_until(LONG, "finished pods to be collected", || {
        env.pod(&env.pod_of(&format!("{cpu}/0"))).is_none()
    });

    // list-backends: nodes, free/total GPUs.
    let o = c.iris(&["rpc", "controller", "list-backends"]);
    let v: Value = serde_json::from_str(o.ok()).expect("json");
    let h100 = v["backends"]
        .as_array()
        .and_then(|bs| bs.iter().find(|b| b["backend_id"] == "k8s-h100"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(h100["kind"], "kubernetes", "{v}");
    assert_eq!(h100["availability"]["total_amounts"]["h100"], "16", "{v}");
    assert_eq!(h100["detail"]["kubernetes"]["total_nodes"], 3, "{v}");
    // No synthetic workers: ListWorkers lists none (the backend has no worker rows).
    assert!(c.listed_workers().is_empty(), "{:?}", c.listed_workers());
    // The dashboard's Backends page shows the Kubernetes backends and nodes, and the Workers
    // page has no Kubernetes entry.
    let dash = c.dashboard_url();
    let (_, _, page) = http_get(&dash, "/backends", None);
    assert!(
        page.contains("Kubernetes") && page.contains("gpu-1") && page.contains("k8s-h100"),
        "{page}"
    );
    let (_, _, page) = http_get(&dash, "/workers", None);
    assert!(!page.contains("k8s-h100"), "{page}");

    // A BATCH gang takes the whole quota; a second BATCH gang is held by Kueue and says so.
    let batch = env.run(
        "batch",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x2",
            "--replicas",
            "8",
            "--group-by",
            "leafgroup",
            "--priority",
            "batch",
        ],
        &["sleep", "300"],
    );
    env.wait_state(&batch, "running");
    let held = env.run(
        "held",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x2",
            "--replicas",
            "8",
            "--group-by",
            "leafgroup",
            "--priority",
            "batch",
        ],
        &["true"],
    );
    wait_until(LONG, "the Kueue reason on the held gang", || {
        let td = c.iris(&["task", "describe", &format!("{held}/0")]);
        td.stdout.contains("Kueue")
            || td.stdout.contains("QuotaReserved")
            || td.stdout.contains("SchedulingGated")
    });
    let listed = c.iris(&["job", "list"]);
    let line = listed
        .ok()
        .lines()
        .find(|l| l.contains("/held"))
        .unwrap_or("")
        .to_string();
    assert!(
        line.contains("Kueue") || line.contains("SchedulingGated"),
        "{}",
        listed.stdout
    );
    // The running BATCH gang's GPUs show as held at BATCH.
    let o = c.iris(&["rpc", "controller", "list-backends"]);
    assert!(o.ok().contains("PRIORITY_BAND_BATCH"), "{}", o.stdout);
    c.iris(&["job", "cancel", &held]).ok();

    // A higher band gang preempts the BATCH gang through Kueue: victims PREEMPTED, then retried.
    let urgent = env.run(
        "urgent",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x2",
            "--replicas",
            "8",
            "--group-by",
            "leafgroup",
        ],
        &["sleep", "1"],
    );
    env.wait_state(&urgent, "succeeded");
    let preempted = wait_for(LONG, "a BATCH attempt to end", || {
        let all: Vec<i64> = (0..8)
            .flat_map(|i| env.attempt_states(&format!("{batch}/{i}")))
            .collect();
        all.iter().any(|s| [5, 6, 7, 10].contains(s)).then_some(all)
    });
    let ev = c.iris(&["task", "events", &format!("{batch}/0")]);
    assert!(preempted.contains(&10), "{preempted:?}\n{}", ev.stdout);
    wait_until(LONG, "the BATCH gang retried", || {
        env.attempt_states(&format!("{batch}/0")).len() >= 2
    });

    // Cancel deletes the pods.
    let before = env.pod_of(&format!("{batch}/0"));
    c.iris(&["job", "cancel", &batch]).ok();
    env.wait_state(&batch, "killed");
    wait_until(LONG, "the cancelled job's pod to be deleted", || {
        env.pod(&before).is_none()
    });

    // A disruption becomes PREEMPTED with the node in task events.
    let victim = env.run("victim", &[], &["sleep", "300"]);
    env.wait_state(&victim, "running");
    let pod = env.pod_of(&format!("{victim}/0"));
    wait_until(LONG, "the victim pod to run", || {
        env.pod(&pod)
            .map(|p| p["status"]["phase"] == "Running")
            .unwrap_or(false)
    });
    env.server().disrupt(NS, &pod).expect("disrupt");
    wait_until(LONG, "the disrupted attempt to be PREEMPTED", || {
        env.attempt_states(&format!("{victim}/0")).first() == Some(&10)
    });
    let ev = c.iris(&["task", "events", &format!("{victim}/0")]);
    assert!(ev.ok().contains("k8s/disruption"), "{}", ev.stdout);
    assert!(
        ev.stdout.contains("cpu-0"),
        "the node is named: {}",
        ev.stdout
    );
    c.iris(&["job", "cancel", &victim]).ok();

    // A pod that vanishes becomes WORKER_FAILED after three scans.
    let lost = env.run(
        "lost",
        &["--max-retries-preemption", "0"],
        &["sleep", "300"],
    );
    env.wait_state(&lost, "running");
    let pod = env.pod_of(&format!("{lost}/0"));
    wait_until(LONG, "the pod to exist", || env.pod(&pod).is_some());
    env.server().vanish(NS, &pod).expect("vanish");
    wait_until(LONG, "the lost attempt to be WORKER_FAILED", || {
        env.attempt_states(&format!("{lost}/0")).first() == Some(&7)
    });

    // An image that cannot be pulled shows ImagePullBackOff as the pending reason.
    let bad = env.run(
        "badimage",
        &["--task-image", "registry.example/does-not-exist:1"],
        &["true"],
    );
    wait_until(LONG, "ImagePullBackOff in task describe", || {
        c.iris(&["task", "describe", &format!("{bad}/0")])
            .stdout
            .contains("ImagePullBackOff")
    });
    c.iris(&["job", "cancel", &bad]).ok();

    // Gang shapes are checked at submit. Without --group-by, a multi-replica GPU job gets the
    // published CLI's level (leafgroup for H100); an NVL72 gang that cannot split into rack
    // slices is refused by the CLI, and an explicit one by the controller, with the arithmetic.
    let auto = env.run(
        "auto-level",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x1",
            "--replicas",
            "2",
        ],
        &["true"],
    );
    let co = c.job_request(&auto).coscheduling.map(|c| c.group_by);
    assert_eq!(co.as_deref(), Some("leafgroup"));
    env.wait_state(&auto, "succeeded");
    let refused = c.iris(&[
        "job",
        "run",
        "--no-wait",
        "--no-bundle",
        "--job-name",
        "rack72",
        "--enable-extra-resources",
        "--gpu",
        "GB200x4",
        "--replicas",
        "72",
        "--",
        "true",
    ]);
    assert!(
        refused.stderr.contains("--replicas 72 for GB200")
            && refused
                .stderr
                .contains("72 nodes do not divide evenly across 5 racks"),
        "{}",
        refused.stderr
    );
    let refused = c.iris(&[
        "job",
        "run",
        "--no-wait",
        "--no-bundle",
        "--job-name",
        "rack72",
        "--enable-extra-resources",
        "--gpu",
        "GB200x4",
        "--replicas",
        "72",
        "--group-by",
        "nvlink.domain.sliced",
        "--",
        "true",
    ]);
    assert!(
        refused
            .stderr
            .contains("coscheduling.group_by `nvlink.domain.sliced` with 72 replicas")
            && refused
                .stderr
                .contains("72 nodes do not divide evenly across 5 racks"),
        "{}",
        refused.stderr
    );
    assert!(!c.iris(&["job", "list"]).stdout.contains("rack72"));

    // A federation hub routes an H100 job to this Kubernetes cluster by what its backend reports.
    common::hub_routes_a_gpu_job_to(c, "k8s-h100", "H100x1", LONG);
}
