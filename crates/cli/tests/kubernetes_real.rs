//! The Kubernetes backend against a real control plane (issue 13): `scripts/k8s-testenv.sh up`
//! starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and Kueue built from
//! their Go modules, with CoreWeave-shaped Node objects; the test kit's node agent plays the
//! kubelet for them. A CPU job's pod must be gated and admitted by the real Kueue (TAS pins
//! it to a hostname), bound by the real kube-scheduler, run by the agent, and the job succeed.
//!
//! CI builds the control plane first (`scripts/test-all.sh` runs `scripts/k8s-testenv.sh build`;
//! about 14–22 minutes on two cores, once per machine). When the environment cannot start, the
//! test fails: it never skips.

mod common;

use common::{wait_for, TestCluster};
use iris_kube_testkit::{AgentMode, AgentOptions, KubeletEndpoint, NodeAgent};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);
const NS: &str = "iris";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/k8s-testenv.sh")
}

/// The running environment; dropping it stops the agent and runs `down`.
struct RealEnv {
    run_dir: PathBuf,
    agent: Option<NodeAgent>,
    rt: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    /// Control-plane processes a test started again itself (stopped by `down` through their pid
    /// files, reaped here).
    restarted: std::sync::Mutex<Vec<std::process::Child>>,
}

impl RealEnv {
    /// kubectl's standard output (what it printed, also when it failed).
    fn kubectl(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.kubectl_out(args).stdout).into_owned()
    }

    /// The built kubectl (the API server's own version) against this cluster.
    fn kubectl_out(&self, args: &[&str]) -> std::process::Output {
        Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(self.run_dir.join("kubeconfig"))
            .args(args)
            .output()
            .expect("kubectl")
    }

    /// The controller config pointing the Kubernetes backend at this cluster.
    fn config(&self) -> String {
        self.config_reaching("http://127.0.0.1:9")
    }

    /// The cluster config, with pods reaching the controller at `controller`.
    fn config_reaching(&self, controller: &str) -> String {
        format!(
            "name: k8s\nkubernetes_provider:\n  namespace: {NS}\n  kubeconfig: {}\n  controller_address: {controller}\n  kueue: {{cluster_queue: cluster-queue}}\nscale_groups:\n  h100:\n    num_vms: 4\n    resources: {{cpu: 128, ram: 2000GB, disk: 1TB, device_type: gpu, device_variant: H100, device_count: 8, capacity_type: on-demand}}\n",
            self.run_dir.join("kubeconfig").display()
        )
    }

    fn ran(&self) -> Vec<iris_kube_testkit::RanPod> {
        self.agent.as_ref().map(|a| a.ran()).unwrap_or_default()
    }
}

impl Drop for RealEnv {
    fn drop(&mut self) {
        if let Some(agent) = self.agent.take() {
            self.rt.block_on(agent.shutdown());
        }
        let _ = Command::new("bash")
            .arg(script())
            .arg("down")
            .env("IRIS_K8S_RUN_DIR", &self.run_dir)
            .status();
        let restarted = self.restarted.get_mut().map(std::mem::take);
        for mut child in restarted.unwrap_or_default() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Submits a job and returns its id.
fn run(cluster: &TestCluster, name: &str, flags: &[&str], cmd: &[&str]) -> String {
    let mut args = vec!["job", "run", "--no-wait", "--no-bundle", "--job-name", name];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(cmd);
    let o = cluster.iris(&args);
    o.job_id()
}

/// Waits for the job to end; returns its summary.
fn finish(cluster: &TestCluster, job: &str) -> serde_json::Value {
    wait_for(LONG, &format!("job {job} to finish"), || {
        let v = cluster.summary(job);
        let s = v["state"].as_str().unwrap_or("").to_string();
        (s == "succeeded" || s == "failed" || s == "killed").then_some(v)
    })
}

fn start_env() -> RealEnv {
    start_env_with(&[], AgentMode::Process)
}

/// `scripts/k8s-testenv.sh up` with extra environment (node counts), and the node agent in `mode`.
fn start_env_with(vars: &[(&str, &str)], mode: AgentMode) -> RealEnv {
    let dir = tempfile::tempdir().expect("dir");
    let mut env = RealEnv {
        run_dir: dir.path().join("k8s"),
        agent: None,
        rt: tokio::runtime::Runtime::new().expect("runtime"),
        dir,
        restarted: Default::default(),
    };
    let out = Command::new("bash")
        .arg(script())
        .arg("up")
        .env("IRIS_K8S_RUN_DIR", &env.run_dir)
        .env("IRIS_K8S_NAMESPACE", NS)
        .envs(vars.iter().copied())
        .output()
        .expect("running scripts/k8s-testenv.sh");
    assert!(
        out.status.success(),
        "scripts/k8s-testenv.sh up failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kubeconfig = env.run_dir.join("kubeconfig");
    let work = env.dir.path().join("node-agent");
    let port = std::fs::read_to_string(env.run_dir.join("kubelet-port")).expect("kubelet-port");
    let kubelet = KubeletEndpoint {
        port: port.trim().parse().expect("kubelet port"),
        cert: env.run_dir.join("pki/serving.crt"),
        key: env.run_dir.join("pki/serving.key"),
    };
    let agent = env
        .rt
        .block_on(NodeAgent::start(
            &kubeconfig,
            NS,
            work,
            AgentOptions {
                kubelet: Some(kubelet),
                mode,
                // The controller Deployment's container runs this build's `iris`.
                bin_dirs: vec![Path::new(common::IRIS)
                    .parent()
                    .expect("iris binary dir")
                    .to_path_buf()],
            },
        ))
        .expect("node agent");
    env.agent = Some(agent);
    env
}

#[test]
fn cpu_job_through_real_kueue_and_scheduler() {
    let env = start_env();
    // Pods reach this controller (the process kubelet runs them on this host): the init
    // container fetches bundles from it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let yaml = env.config_reaching(&format!("http://127.0.0.1:{port}"));
    let cluster = TestCluster::start_bound(&format!("127.0.0.1:{port}"), &[], Some(&yaml), &[]);
    let job = run(
        &cluster,
        "cpu",
        &[],
        &["sh", "-c", "echo hello-from-a-real-pod"],
    );
    let summary = finish(&cluster, &job);
    let ran = env.ran();
    assert_eq!(
        summary["state"],
        "succeeded",
        "{summary}\npods run: {ran:?}\nworkloads: {}\npods: {}",
        env.kubectl(&["get", "workloads.kueue.x-k8s.io", "-A", "-o", "wide"]),
        env.kubectl(&["get", "pods", "-A", "-o", "wide"])
    );
    // kube-scheduler bound the pod to one of the registered nodes (the agent runs only bound
    // pods, and Kueue's webhook gates Iris pods until Kueue admits their Workload).
    // The container's command ran as a local process (its output is in the agent's log file).
    let logs = logs_under(&env.dir.path().join("node-agent"));
    assert!(logs.contains("hello-from-a-real-pod"), "{logs}");
    // The backend read the container log through the API server's `pods/log`, which the API
    // server proxied to the node's kubelet endpoint (the agent's), verified by the test CA.
    let shipped = wait_for(LONG, "the pod's output in iris job logs", || {
        let o = cluster.iris(&["job", "logs", &job]);
        o.stdout
            .contains("hello-from-a-real-pod")
            .then_some(o.stdout)
    });
    assert!(!shipped.contains("500"), "{shipped}");
    // Kueue admitted the pod's Workload into the ClusterQueue through the cw-tas flavor.
    let wl = env.kubectl(&["-n", NS, "get", "workloads.kueue.x-k8s.io", "-o", "json"]);
    let wl: serde_json::Value = serde_json::from_str(&wl).unwrap_or_default();
    let admitted = wl["items"].as_array().is_some_and(|items| {
        items.iter().any(|w| {
            w["status"]["admission"]["clusterQueue"] == "cluster-queue"
                && w.to_string().contains("cw-tas")
        })
    });
    assert!(admitted, "{wl}");
    // A job's secret reaches the pod as a file: the backend creates the pod's Secret (owned by
    // the pod), the kubelet mounts it at RIGGING_SECRETS_DIR, and no value is in the pod spec.
    let source = env.dir.path().join("token");
    std::fs::write(&source, "s3cr3t-value\n").expect("secret source");
    let secret_ref = format!("file:{}", source.display());
    let check = r#"ls -la "$RIGGING_SECRETS_DIR"; test "$(cat "$RIGGING_SECRETS_DIR/TOKEN")" = s3cr3t-value && echo secret-delivered"#;
    let sj = run(
        &cluster,
        "secret",
        &["--secret", "TOKEN", &secret_ref],
        &["sh", "-c", check],
    );
    let summary = finish(&cluster, &sj);
    assert_eq!(
        summary["state"],
        "succeeded",
        "{summary}\nagent logs: {}\nsecrets: {}\npods: {}",
        logs_under(&env.dir.path().join("node-agent")),
        env.kubectl(&["-n", NS, "get", "secrets"]),
        env.kubectl(&["-n", NS, "get", "pods", "-o", "wide"])
    );
    wait_for(LONG, "the secret job's output", || {
        logs_under(&env.dir.path().join("node-agent"))
            .contains("secret-delivered")
            .then_some(())
    });
    // A bundled job: the pod's `stage-workdir` init container (our staging script, run with the
    // image's Python) fetches the bundle from the controller and unpacks it into /app before
    // the task starts; the setup steps run, the `uv sync` one skipped for want of a
    // pyproject.toml.
    let ws = env.dir.path().join("workspace");
    std::fs::create_dir_all(ws.join("pkg")).expect("workspace");
    std::fs::write(ws.join("pkg/data.txt"), "bundle-staged-by-init\n").expect("bundle file");
    let o = common::iris_in(
        &ws,
        &[],
        &[
            "--controller-url",
            &cluster.url,
            "job",
            "run",
            "--no-wait",
            "--job-name",
            "bundled",
            "--",
            "sh",
            "-c",
            "cat pkg/data.txt",
        ],
    );
    let bundled = o.job_id();
    let summary = finish(&cluster, &bundled);
    assert_eq!(
        summary["state"],
        "succeeded",
        "{summary}\nagent logs: {}\npods: {}",
        logs_under(&env.dir.path().join("node-agent")),
        env.kubectl(&["-n", NS, "get", "pods", "-o", "yaml"])
    );
    let out = wait_for(LONG, "the bundled job's output", || {
        let o = cluster.iris(&["job", "logs", &bundled]);
        o.stdout
            .contains("bundle-staged-by-init")
            .then_some(o.stdout)
    });
    assert!(out.contains("skipped: no pyproject.toml"), "{out}");
    // Cancel deletes the pod: the real API server marks it, the agent kills the process and
    // confirms the deletion, Kueue drops its finalizer.
    let long = run(
        &cluster,
        "long",
        &[],
        &["sh", "-c", "echo long-job-started; sleep 300"],
    );
    wait_for(LONG, "the long job to run", || {
        (cluster.summary(&long)["state"] == "running").then_some(())
    });
    let pod = wait_for(LONG, "the long job's pod to run", || {
        env.agent
            .as_ref()
            .map(|a| a.ran())
            .unwrap_or_default()
            .into_iter()
            .find(|p| p.name.contains("long"))
    });
    // The controller reconciled the twelve WorkloadPriorityClasses (seed 000's table), and the
    // running CPU pod's Workload carries the CPU tier of its band.
    let wpcs = env.kubectl(&[
        "get",
        "workloadpriorityclasses.kueue.x-k8s.io",
        "-o",
        "json",
    ]);
    let wpcs: serde_json::Value = serde_json::from_str(&wpcs).unwrap_or_default();
    let value = |name: &str| {
        wpcs["items"]
            .as_array()
            .and_then(|items| items.iter().find(|w| w["metadata"]["name"] == name))
            .and_then(|w| w["value"].as_i64())
    };
    for (band, tiers) in [
        ("batch", [0, 1, 2]),
        ("interactive", [10, 11, 12]),
        ("production", [1000, 1000, 1000]),
        ("system", [10000, 10000, 10000]),
    ] {
        for (kind, v) in ["cpu", "accelerator", "coscheduled"].iter().zip(tiers) {
            let name = format!("iris-{kind}-{band}");
            assert_eq!(value(&name), Some(v), "{name}: {wpcs}");
        }
    }
    assert_eq!(
        workload_priorities(&env, &pod.name),
        (10, "iris-cpu-interactive".into())
    );
    // `kubectl logs` reads the running container through the API server and the agent.
    let logs = wait_for(LONG, "kubectl logs of the long job's pod", || {
        let o = env.kubectl_out(&["-n", NS, "logs", &pod.name, "-c", "task"]);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.contains("long-job-started").then_some(out)
    });
    // The container's own output: the setup banners, then the command's line.
    assert_eq!(
        logs.trim().lines().last(),
        Some("long-job-started"),
        "{logs}"
    );
    cluster.iris(&["job", "cancel", &long]).ok();
    wait_for(LONG, "the cancelled job's pod to be deleted", || {
        let pods = env.kubectl(&["-n", NS, "get", "pods", "-o", "name"]);
        (!pods.contains(&pod.name)).then_some(())
    });
    assert_eq!(cluster.summary(&long)["state"], "killed");
    let nodes = ["cpu-0", "cpu-1", "h100-0", "h100-1", "h100-2", "h100-3"];
    assert!(
        !ran.is_empty() && ran.iter().all(|p| nodes.contains(&p.node.as_str())),
        "{ran:?}"
    );
}

/// The `spec.priority` of the Workload that holds `pod` (Kueue names the pod or its pod group
/// in the Workload's owner references), and the WorkloadPriorityClass it names.
fn workload_priorities(env: &RealEnv, pod: &str) -> (i64, String) {
    wait_for(LONG, &format!("the Workload of {pod}"), || {
        let wl = env.kubectl(&["-n", NS, "get", "workloads.kueue.x-k8s.io", "-o", "json"]);
        let wl: serde_json::Value = serde_json::from_str(&wl).ok()?;
        let w = wl["items"].as_array()?.iter().find(|w| {
            w["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|o| o.iter().any(|r| r["name"] == pod))
        })?;
        let spec = &w["spec"];
        let class = spec["priorityClassRef"]["name"]
            .as_str()
            .or(spec["priorityClassName"].as_str())
            .unwrap_or("")
            .to_string();
        Some((spec["priority"].as_i64()?, class))
    })
}

/// Every `*.log` file under `dir`, concatenated.
fn logs_under(dir: &Path) -> String {
    let mut out = String::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.push_str(&logs_under(&p));
        } else if p.extension().is_some_and(|x| x == "log") {
            out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
    }
    out
}

#[test]
fn gpu_job_and_leafgroup_gang_through_real_kueue() {
    let env = start_env();
    let yaml = env.config();
    let cluster = TestCluster::start_with_args(&[], Some(&yaml), &[]);
    let one = run(
        &cluster,
        "one-gpu",
        &["--enable-extra-resources", "--gpu", "H100x1"],
        &["true"],
    );
    // No --group-by: the CLI picks the H100 level (leafgroup), as the published CLI does.
    let gang = run(
        &cluster,
        "gang",
        &[
            "--enable-extra-resources",
            "--gpu",
            "H100x2",
            "--replicas",
            "8",
        ],
        &["sh", "-c", "echo rank $IRIS_TASK_ID"],
    );
    assert_eq!(
        cluster
            .job_request(&gang)
            .coscheduling
            .map(|c| c.group_by)
            .as_deref(),
        Some("leafgroup")
    );
    for job in [&one, &gang] {
        let summary = finish(&cluster, job);
        let ran = env.ran();
        assert_eq!(
            summary["state"],
            "succeeded",
            "{job}: {summary}\npods run: {ran:?}\nworkloads: {}\npods: {}",
            env.kubectl(&["get", "workloads.kueue.x-k8s.io", "-A", "-o", "wide"]),
            env.kubectl(&["get", "pods", "-A", "-o", "wide"])
        );
    }
    // GPU pods went to H100 nodes only, and the leafgroup gang's eight pods to one leaf.
    let ran = env.ran();
    assert!(ran.iter().all(|p| p.node.starts_with("h100-")), "{ran:?}");
    let gang_nodes: std::collections::BTreeSet<&str> = ran
        .iter()
        .filter(|p| p.name.contains("gang"))
        .map(|p| p.node.as_str())
        .collect();
    let leaf0 = gang_nodes.iter().all(|n| *n == "h100-0" || *n == "h100-1");
    let leaf1 = gang_nodes.iter().all(|n| *n == "h100-2" || *n == "h100-3");
    assert!(!gang_nodes.is_empty() && (leaf0 || leaf1), "{ran:?}");

    // Capacity lost after admission (seed 000): with kube-scheduler held, Kueue admits an
    // H100x8 task and pins it to a node; a pod Kueue does not manage then takes that node's
    // GPUs. Once the scheduler runs again it cannot bind the pod (node affinity + Insufficient),
    // and after the grace Iris gives the attempt up as WORKER_FAILED: the task goes back to
    // PENDING, a new attempt is admitted afresh on another node, and the job succeeds.
    let paused = SchedulerPaused::new(&env);
    let full = run(
        &cluster,
        "full-node",
        &["--enable-extra-resources", "--gpu", "H100x8"],
        &["true"],
    );
    let task = format!("{full}/0");
    let (first_pod, pinned) = wait_for(LONG, "Kueue to admit and pin the H100x8 pod", || {
        let name = first_pod_name(&cluster, &task)?;
        let got = env.kubectl(&[
            "-n",
            NS,
            "get",
            "pod",
            &name,
            "-o",
            r"jsonpath={.spec.schedulingGates}|{.spec.nodeSelector.kubernetes\.io/hostname}",
        ]);
        let (gates, node) = got.split_once('|')?;
        (gates.is_empty() && !node.is_empty()).then(|| (name, node.to_string()))
    });
    let blocker = env.dir.path().join("blocker.yaml");
    std::fs::write(
        &blocker,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: gpu-blocker, namespace: default}}\nspec:\n  nodeName: {pinned}\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, '3600']\n    resources:\n      requests: {{nvidia.com/gpu: 8}}\n      limits: {{nvidia.com/gpu: 8}}\n"
        ),
    )
    .expect("blocker manifest");
    let applied = env.kubectl_out(&["apply", "-f", &blocker.to_string_lossy()]);
    assert!(
        applied.status.success(),
        "blocker: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    paused.restart(&env);
    let states = wait_for(
        Duration::from_secs(180),
        "the job to succeed on fresh admission",
        || {
            let summary = cluster.summary(&full);
            (summary["state"] == "succeeded").then(|| attempt_states(&cluster, &task))
        },
    );
    let events = cluster.iris(&["task", "events", &task]);
    assert_eq!(
        states,
        vec![7, 4],
        "WORKER_FAILED, then SUCCEEDED\nevents: {}\npods: {}",
        events.stdout,
        env.kubectl(&["get", "pods", "-A", "-o", "wide"])
    );
    assert!(
        events.ok().contains("CapacityLost")
            && events.stdout.contains("Insufficient nvidia.com/gpu"),
        "{}",
        events.stdout
    );
    let reran: Vec<_> = env
        .ran()
        .into_iter()
        .filter(|p| p.name.contains("full-node"))
        .collect();
    assert!(
        !reran.is_empty()
            && reran
                .iter()
                .all(|p| p.node != pinned && p.name != first_pod),
        "the new attempt ran elsewhere than {pinned}: {reran:?}"
    );
    env.kubectl(&[
        "-n",
        "default",
        "delete",
        "pod",
        "gpu-blocker",
        "--grace-period=0",
        "--force",
    ]);

    // A federation hub routes an H100 job to this cluster by what its backend reports.
    common::hub_routes_a_gpu_job_to(&cluster, "k8s-h100", "H100x1", LONG);
}

/// Holds kube-scheduler stopped (SIGSTOP), so that a test can change the cluster between Kueue's
/// admission of a pod and the scheduler's binding of it. [`SchedulerPaused::restart`] replaces
/// it with a fresh scheduler with the same command line: a fresh one lists every pod before it
/// schedules any, where a resumed one may bind a pod before its watch delivers a change made
/// while it was stopped. Dropped without a restart (a failing test), it is resumed.
struct SchedulerPaused {
    pid: String,
    pid_file: PathBuf,
    log: PathBuf,
}

impl SchedulerPaused {
    fn new(env: &RealEnv) -> SchedulerPaused {
        let pid_file = env.run_dir.join("pids/kube-scheduler.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .expect("kube-scheduler's pid file")
            .trim()
            .to_string();
        let stopped = Command::new("kill").args(["-STOP", &pid]).status();
        assert!(
            stopped.map(|s| s.success()).unwrap_or(false),
            "SIGSTOP to kube-scheduler"
        );
        SchedulerPaused {
            pid,
            pid_file,
            log: env.run_dir.join("logs/kube-scheduler.log"),
        }
    }

    /// Stops the paused scheduler and starts it again, recording the new pid where
    /// `scripts/k8s-testenv.sh down` finds it (`env` reaps it once stopped).
    fn restart(self, env: &RealEnv) {
        use std::os::unix::process::CommandExt;
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.pid)).expect("cmdline");
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let killed = Command::new("kill").args(["-KILL", &self.pid]).status();
        assert!(
            killed.map(|s| s.success()).unwrap_or(false),
            "SIGKILL to kube-scheduler"
        );
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .expect("scheduler log");
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("starting kube-scheduler again");
        std::fs::write(&self.pid_file, child.id().to_string()).expect("pid file");
        env.restarted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child);
        std::mem::forget(self);
    }
}

impl Drop for SchedulerPaused {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.pid]).status();
    }
}

#[test]
fn gb200_rack_slices_through_real_kueue() {
    // Two NVL72 racks of 18 GB200 nodes (4 GPUs each) under the NVLink-domain Topology.
    let env = start_env_with(
        &[
            ("IRIS_K8S_GB200_NODES", "36"),
            ("IRIS_K8S_H100_NODES", "0"),
            ("IRIS_K8S_TOPOLOGY", "nvlink"),
        ],
        AgentMode::Process,
    );
    for (i, resource) in [(3, "nvidia.com/gpu"), (4, "rdma/ib")] {
        let patch = format!(
            r#"[{{"op":"replace","path":"/spec/resourceGroups/0/flavors/0/resources/{i}/nominalQuota","value":"144"}}]"#
        );
        let out = env.kubectl(&[
            "patch",
            "clusterqueue",
            "cluster-queue",
            "--type=json",
            "-p",
            &patch,
        ]);
        assert!(out.contains("patched"), "{resource} quota: {out}");
    }
    let yaml = format!(
        "name: k8s\nkubernetes_provider:\n  namespace: {NS}\n  kubeconfig: {}\n  controller_address: http://127.0.0.1:9\n  kueue: {{cluster_queue: cluster-queue}}\nscale_groups:\n  gb200:\n    num_vms: 36\n    resources: {{cpu: 144, ram: 900GB, disk: 1TB, device_type: gpu, device_variant: GB200, device_count: 4, capacity_type: on-demand}}\n",
        env.run_dir.join("kubeconfig").display()
    );
    let cluster = TestCluster::start_with_args(&[], Some(&yaml), &[]);
    // 32 node-saturating pods: the CLI picks the sliced NVLink level, two slices of 16, each
    // bound to one rack (a rack has 18 nodes, so two slices can never share one).
    let job = run(
        &cluster,
        "big",
        &[
            "--enable-extra-resources",
            "--gpu",
            "GB200x4",
            "--replicas",
            "32",
        ],
        &["sh", "-c", "echo rank $IRIS_TASK_ID"],
    );
    let summary = finish(&cluster, &job);
    assert_eq!(
        summary["state"],
        "succeeded",
        "{summary}\nworkloads: {}\npods: {}",
        env.kubectl(&["get", "workloads.kueue.x-k8s.io", "-A", "-o", "wide"]),
        env.kubectl(&["get", "pods", "-A", "-o", "wide"])
    );
    let ran = env.ran();
    let rack_of = |node: &str| -> u32 {
        let i: u32 = node
            .trim_start_matches("gb200-")
            .parse()
            .expect("a GB200 node");
        i / 18
    };
    let mut racks: [std::collections::BTreeSet<u32>; 2] = Default::default();
    for i in 0..32u32 {
        let task = format!("{job}/{i}");
        let rows = cluster.attempts(&task);
        let first = rows.first().expect("an attempt");
        let id = first["attempt_id"].as_i64().unwrap_or(0) as u32;
        let uid = first["attempt_uid"].as_str().unwrap_or("");
        let name = iris_kube_model::manifest::pod_name(&task, id, uid);
        let pod = ran
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("pod {name} ran: {ran:?}"));
        racks[(i / 16) as usize].insert(rack_of(&pod.node));
    }
    assert!(
        racks[0].len() == 1 && racks[1].len() == 1 && racks[0] != racks[1],
        "each slice of 16 within one rack, the two in different racks: {racks:?}"
    );
    // An NVL72 gang that cannot split into rack slices is refused at submit with the
    // arithmetic: by the CLI when it picks the level, by the controller when it is explicit.
    let rack72 = |extra: &[&str]| {
        let mut args = vec![
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
        ];
        args.extend_from_slice(extra);
        args.extend(["--", "true"]);
        cluster.iris(&args)
    };
    let refused = rack72(&[]);
    let err = refused.err();
    assert!(
        err.contains("--replicas 72 for GB200")
            && err.contains("72 nodes do not divide evenly across 5 racks"),
        "{err}"
    );
    let refused = rack72(&["--group-by", "nvlink.domain.sliced"]);
    let err = refused.err();
    assert!(
        err.contains("coscheduling.group_by `nvlink.domain.sliced` with 72 replicas")
            && err.contains("72 nodes do not divide evenly across 5 racks"),
        "{err}"
    );
    assert!(!cluster.iris(&["job", "list"]).stdout.contains("rack72"));
}

#[test]
fn quota_hold_and_preemption_through_real_kueue() {
    let env = start_env();
    // 16 GPUs of quota: one 8×2 gang fills it.
    let patch = r#"[{"op":"replace","path":"/spec/resourceGroups/0/flavors/0/resources/3/nominalQuota","value":"16"}]"#;
    env.kubectl(&[
        "patch",
        "clusterqueue",
        "cluster-queue",
        "--type=json",
        "-p",
        patch,
    ]);
    let yaml = env.config();
    let cluster =
        TestCluster::start_with_args(&[], Some(&yaml), &["--dashboard-bind", "127.0.0.1:0"]);
    let gang = |name: &str, band: &str, cmd: &[&str]| {
        let mut flags = vec![
            "--enable-extra-resources",
            "--gpu",
            "H100x2",
            "--replicas",
            "8",
            "--group-by",
            "leafgroup",
        ];
        if !band.is_empty() {
            flags.extend(["--priority", band]);
        }
        run(&cluster, name, &flags, cmd)
    };
    let batch = gang("batch", "batch", &["sleep", "300"]);
    wait_for(LONG, "the BATCH gang to run", || {
        (cluster.summary(&batch)["state"] == "running").then_some(())
    });
    // No synthetic workers: the Kubernetes backend places work without worker rows, and
    // list-backends shows the cluster's view (nodes, free/total GPUs, held by band).
    let workers = cluster.iris(&["rpc", "controller", "list-workers"]);
    let workers: serde_json::Value = serde_json::from_str(workers.ok()).expect("list-workers json");
    assert!(
        workers["workers"].as_array().is_none_or(|w| w.is_empty()),
        "ListWorkers lists no worker on a Kubernetes cluster: {workers}"
    );
    // The dashboard's Backends page shows the Kubernetes backends and nodes; its Workers page
    // has no Kubernetes entry.
    let dash = cluster.dashboard_url();
    let (_, _, page) = common::http_get(&dash, "/backends", None);
    assert!(
        page.contains("Kubernetes") && page.contains("h100-0") && page.contains("k8s-h100"),
        "{page}"
    );
    let (_, _, page) = common::http_get(&dash, "/workers", None);
    assert!(!page.contains("k8s-h100"), "{page}");
    let nodes = env.kubectl(&["get", "nodes", "-o", "name"]).lines().count();
    let h100 = wait_for(LONG, "the BATCH gang's GPUs held in list-backends", || {
        let o = cluster.iris(&["rpc", "controller", "list-backends"]);
        let v: serde_json::Value = serde_json::from_str(o.ok()).ok()?;
        let b = v["backends"]
            .as_array()?
            .iter()
            .find(|b| b["backend_id"] == "k8s-h100")?
            .clone();
        let held = b["availability"]["held_by_band"]
            .as_array()?
            .iter()
            .any(|h| {
                h["band"].as_str().is_some_and(|s| s.contains("BATCH"))
                    && h["amounts"]["h100"] == "16"
            });
        held.then_some(b)
    });
    let amount = |k: &str| -> i64 {
        h100["availability"][k]["h100"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1)
    };
    assert!(amount("total_amounts") >= 16, "{h100}");
    assert_eq!(amount("amounts"), amount("total_amounts") - 16, "{h100}");
    assert_eq!(h100["detail"]["kubernetes"]["total_nodes"], nodes, "{h100}");
    // A gang's Workload is admitted at its band's coscheduled tier.
    let member = pod_of(&env, &cluster, &format!("{batch}/0"));
    assert_eq!(
        workload_priorities(&env, &member.name),
        (2, "iris-coscheduled-batch".into())
    );
    // A second BATCH gang does not fit the quota: Kueue holds it and Iris says so.
    let held = gang("held", "batch", &["true"]);
    wait_for(LONG, "the Kueue reason on the held gang", || {
        let td = cluster.iris(&["task", "describe", &format!("{held}/0")]);
        (td.stdout.contains("Kueue")
            || td.stdout.contains("QuotaReserved")
            || td.stdout.contains("SchedulingGated"))
        .then_some(())
    });
    cluster.iris(&["job", "cancel", &held]).ok();
    // A gang of the default (higher) band preempts the BATCH gang through Kueue.
    let urgent = gang("urgent", "", &["sleep", "1"]);
    let summary = finish(&cluster, &urgent);
    assert_eq!(
        summary["state"],
        "succeeded",
        "{summary}\nworkloads: {}\npods: {}",
        env.kubectl(&["get", "workloads.kueue.x-k8s.io", "-A", "-o", "wide"]),
        env.kubectl(&["get", "pods", "-A", "-o", "wide"])
    );
    let states = wait_for(LONG, "a BATCH attempt to end preempted", || {
        let all: Vec<i64> = (0..8)
            .flat_map(|i| {
                cluster
                    .attempts(&format!("{batch}/{i}"))
                    .iter()
                    .filter_map(|r| r["state"].as_i64())
                    .collect::<Vec<_>>()
            })
            .collect();
        all.iter().any(|s| [5, 6, 7, 10].contains(s)).then_some(all)
    });
    let ev = cluster.iris(&["task", "events", &format!("{batch}/0")]);
    assert!(
        states.contains(&10),
        "{states:?}\n{}\npods: {}",
        ev.stdout,
        env.kubectl(&["get", "pods", "-A", "-o", "json"])
    );
    cluster.iris(&["job", "cancel", &batch]).ok();
}

/// The first attempt states of a task, oldest first.
fn attempt_states(cluster: &TestCluster, task: &str) -> Vec<i64> {
    cluster
        .attempts(task)
        .iter()
        .filter_map(|r| r["state"].as_i64())
        .collect()
}

/// The pod name of the first attempt of `task`, once it has one.
fn first_pod_name(cluster: &TestCluster, task: &str) -> Option<String> {
    let rows = cluster.attempts(task);
    let first = rows.first()?;
    let id = first["attempt_id"].as_i64().unwrap_or(0) as u32;
    let uid = first["attempt_uid"].as_str().unwrap_or("");
    Some(iris_kube_model::manifest::pod_name(task, id, uid))
}

/// The pod the agent ran for the first attempt of `task`.
fn pod_of(env: &RealEnv, cluster: &TestCluster, task: &str) -> iris_kube_testkit::RanPod {
    wait_for(LONG, &format!("the pod of {task} to run"), || {
        let name = first_pod_name(cluster, task)?;
        env.ran().into_iter().find(|p| p.name == name)
    })
}

/// Asks the API server to evict `pod` (the Eviction API, as `kubectl drain` does).
fn evict(env: &RealEnv, pod: &str) -> std::process::Output {
    let body = env.dir.path().join(format!("evict-{pod}.json"));
    let eviction = serde_json::json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": NS},
    });
    std::fs::write(&body, eviction.to_string()).expect("eviction body");
    let path = format!("/api/v1/namespaces/{NS}/pods/{pod}/eviction");
    env.kubectl_out(&["create", "--raw", &path, "-f", &body.to_string_lossy()])
}

#[test]
fn evictions_pdbs_lost_pods_and_image_pulls_through_the_real_api_server() {
    let env = start_env();
    let yaml = env.config();
    let cluster = TestCluster::start_with_args(&[], Some(&yaml), &[]);

    // A production coordinator (one CPU task) is covered by a minAvailable=1 PDB: the API
    // server refuses to evict it, and it keeps running.
    cluster
        .iris(&["user", "budget", "set", "ops", "--max-band", "production"])
        .ok();
    let coord = run(
        &cluster,
        "coord",
        &["--user", "ops", "--priority", "production"],
        &["sleep", "300"],
    );
    wait_for(LONG, "the coordinator to run", || {
        (cluster.summary(&coord)["state"] == "running").then_some(())
    });
    let pod = pod_of(&env, &cluster, &format!("{coord}/0"));
    let refused = wait_for(LONG, "the PDB to refuse the eviction", || {
        // The disruption controller computes the PDB's status shortly after it is created;
        // until then the API server refuses for the same reason.
        let o = evict(&env, &pod.name);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        (!o.status.success() && err.contains("disruption budget")).then_some(err)
    });
    assert!(refused.contains("disruption budget"), "{refused}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        cluster.summary(&coord)["state"],
        "running",
        "{}",
        env.kubectl(&["-n", NS, "get", "pods", "-o", "wide"])
    );
    cluster.iris(&["job", "cancel", &coord]).ok();

    // A task pod of a two-replica job has no PDB: the eviction goes through, the API server marks
    // the pod DisruptionTarget, and the attempt ends PREEMPTED with the node named.
    let pair = run(
        &cluster,
        "pair",
        &["--replicas", "2"],
        &["sh", "-c", "echo replica $IRIS_TASK_ID; sleep 300"],
    );
    wait_for(LONG, "the pair to run", || {
        (cluster.summary(&pair)["state"] == "running").then_some(())
    });
    let victim = pod_of(&env, &cluster, &format!("{pair}/0"));
    let o = evict(&env, &victim.name);
    assert!(
        o.status.success(),
        "eviction: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let task = format!("{pair}/0");
    let first = wait_for(LONG, "the evicted attempt to end", || {
        attempt_states(&cluster, &task)
            .first()
            .copied()
            .filter(|s| [4, 5, 6, 7, 8, 10, 11, 12].contains(s))
    });
    let ev = cluster.iris(&["task", "events", &task]);
    assert_eq!(
        first,
        10,
        "the evicted attempt ends PREEMPTED\nevents: {}\npods: {}",
        ev.stdout,
        env.kubectl(&["-n", NS, "get", "pods", "-o", "wide"])
    );
    assert!(ev.ok().contains("k8s/disruption"), "{}", ev.stdout);
    assert!(
        ev.stdout.contains(&victim.node),
        "the node is named: {}",
        ev.stdout
    );
    cluster.iris(&["job", "cancel", &pair]).ok();

    // A pod that vanishes (its finalizers dropped, force-deleted) is given up after three scans:
    // WORKER_FAILED.
    let lost = run(
        &cluster,
        "lost",
        &["--max-retries-preemption", "0"],
        &["sleep", "300"],
    );
    wait_for(LONG, "the lost job to run", || {
        (cluster.summary(&lost)["state"] == "running").then_some(())
    });
    let gone = pod_of(&env, &cluster, &format!("{lost}/0"));
    env.kubectl(&[
        "-n",
        NS,
        "patch",
        "pod",
        &gone.name,
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    env.kubectl(&[
        "-n",
        NS,
        "delete",
        "pod",
        &gone.name,
        "--grace-period=0",
        "--force",
    ]);
    let task = format!("{lost}/0");
    wait_for(LONG, "the lost attempt to be WORKER_FAILED", || {
        (attempt_states(&cluster, &task).first() == Some(&7)).then_some(())
    });

    // An image the node cannot pull: the pod stays Pending in ImagePullBackOff, and Iris says so.
    let bad = run(
        &cluster,
        "badimage",
        &["--task-image", "registry.example/does-not-exist:1"],
        &["true"],
    );
    wait_for(LONG, "ImagePullBackOff in task describe", || {
        let td = cluster.iris(&["task", "describe", &format!("{bad}/0")]);
        td.stdout.contains("ImagePullBackOff").then_some(())
    });
    cluster.iris(&["job", "cancel", &bad]).ok();
}

/// Issue 13's benchmark against the real API server; prints figures (BENCHMARKS.md), asserts
/// only that the work finished. Run by hand:
/// `cargo test --release -p iris-cli --test kubernetes_real -- --ignored --nocapture bench`
/// (`BENCH_TASKS`, default 1,000; `BENCH_NODES`, default 50 simulated CPU nodes).
///
/// Iris: `BENCH_TASKS / 100` jobs of 100 one-second tasks go through the controller, the
/// backend (server-side apply, 32 at a time), Kueue, kube-scheduler and simulated nodes; pods
/// applied per second (first to last pod seen by a 50 ms poll) and attempts completed per
/// second (first submit to the last job SUCCEEDED). The bare client: the same number of pods,
/// built by the same manifest function, server-side applied 32 at a time by kube-rs.
#[test]
#[ignore = "benchmark: prints figures for BENCHMARKS.md; run by hand with --ignored --nocapture"]
fn bench_pods_and_attempts_through_the_real_api_server() {
    use iris_kube_model as km;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, ListParams, Patch, PatchParams};
    use std::collections::HashSet;
    use std::time::Instant;

    let tasks: usize = std::env::var("BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let nodes = std::env::var("BENCH_NODES").unwrap_or_else(|_| "50".into());
    let jobs = tasks.div_ceil(100);
    let env = start_env_with(
        &[("IRIS_K8S_CPU_NODES", &nodes), ("IRIS_K8S_H100_NODES", "0")],
        AgentMode::Simulate(Duration::from_secs(1)),
    );
    let cluster = TestCluster::start_with_args(&[], Some(&env.config()), &[]);
    let client = env.rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(env.run_dir.join("kubeconfig"))
            .expect("kubeconfig");
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        kube::Client::try_from(cfg).expect("client")
    });
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let names = |prefix: &str| -> HashSet<String> {
        env.rt
            .block_on(pods.list_metadata(&ListParams::default()))
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|p| p.metadata.name)
                    .filter(|n| n.starts_with(prefix))
                    .collect()
            })
            .unwrap_or_default()
    };

    // Iris end to end.
    let t0 = Instant::now();
    let ids: Vec<String> = (0..jobs)
        .map(|j| {
            let n = (tasks - j * 100).min(100).to_string();
            run(
                &cluster,
                &format!("bench{j}"),
                // `--no-sync`: the bare client's manifests below carry no setup steps either,
                // so both sides send the same requests.
                &[
                    "--replicas",
                    &n,
                    "--cpu",
                    "0.5",
                    "--memory",
                    "256MiB",
                    "--no-sync",
                ],
                &["true"],
            )
        })
        .collect();
    let submitted = t0.elapsed();
    let mut seen: HashSet<String> = HashSet::new();
    let (mut first_pod, mut last_pod) = (None, None);
    let mut done = 0;
    while done < ids.len() {
        assert!(
            t0.elapsed() < Duration::from_secs(900),
            "bench: not done in 900 s"
        );
        let now = names("iris-");
        let before = seen.len();
        seen.extend(now);
        if seen.len() > before {
            first_pod.get_or_insert(t0.elapsed());
            last_pod = Some(t0.elapsed());
        }
        done = ids
            .iter()
            .filter(|j| cluster.summary(j)["state"] == "succeeded")
            .count();
        std::thread::sleep(Duration::from_millis(50));
    }
    let end_to_end = t0.elapsed();
    let (first, last) = (first_pod.unwrap_or_default(), last_pod.unwrap_or_default());
    let applied_s = (last - first).as_secs_f64().max(1e-3);
    println!(
        "iris: {tasks} attempts in {jobs} jobs on {nodes} simulated nodes: submit {:.2} s; {} pods seen, applied {:.0}/s (first {:.2} s, last {:.2} s); {:.0} attempts/s end to end ({:.2} s)",
        submitted.as_secs_f64(),
        seen.len(),
        seen.len() as f64 / applied_s,
        first.as_secs_f64(),
        last.as_secs_f64(),
        tasks as f64 / end_to_end.as_secs_f64(),
        end_to_end.as_secs_f64()
    );
    drop(cluster);
    // The controller garbage-collects settled pods while it runs; what it left is removed here
    // (Kueue's finalizer dropped first, as Kueue would drop it, only later).
    let managed = ListParams::default().labels("iris.managed=true");
    env.rt.block_on(async {
        use futures::StreamExt;
        let left = pods
            .list_metadata(&managed)
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let unpin = serde_json::json!({"metadata": {"finalizers": null}});
        futures::stream::iter(left)
            .map(|p| {
                let (pods, unpin) = (pods.clone(), unpin.clone());
                async move {
                    let name = p.metadata.name.unwrap_or_default();
                    let _ = pods
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&unpin))
                        .await;
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
        let _ = pods.delete_collection(&Default::default(), &managed).await;
    });
    wait_for(LONG, "the Iris pods to be gone", || {
        names("iris-").is_empty().then_some(())
    });

    // The bare client: the same pods, the same manifest function, the same concurrency.
    let provider = km::ProviderConfig {
        default_task_image: "ghcr.io/marin-community/iris-task:latest".into(),
        controller_address: Some("http://127.0.0.1:9".into()),
        ..Default::default()
    };
    let manifests: Vec<Pod> = (0..tasks)
        .map(|i| {
            let input = km::PodInput {
                task_id: format!("/bare/bench{}/{}", i / 100, i % 100),
                attempt_id: 0,
                attempt_uid: format!("{i:016x}"),
                job_id: format!("/bare/bench{}", i / 100),
                num_tasks: 100,
                task_index: (i % 100) as u32,
                band: iris_types::Band::Interactive,
                argv: vec!["true".into()],
                setup_commands: Vec::new(),
                env: Default::default(),
                system_env: Default::default(),
                cpu_millicores: 500,
                memory_bytes: 256 << 20,
                disk_bytes: 0,
                gpu_count: 0,
                gpu_variant: String::new(),
                tpu: false,
                group_by: None,
                constraints: Vec::new(),
                timeout_seconds: None,
                task_image: None,
                secrets: Default::default(),
                bundle_id: String::new(),
                workdir_files: Default::default(),
                workdir_file_refs: Default::default(),
            };
            km::manifest::build_pod(&input, &provider).expect("manifest")
        })
        .collect();
    let t1 = Instant::now();
    let applied = env.rt.block_on(async {
        use futures::StreamExt;
        let pp = PatchParams::apply("bench-bare").force();
        futures::stream::iter(manifests)
            .map(|pod| {
                let pods = pods.clone();
                let pp = pp.clone();
                async move {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    pods.patch(&name, &pp, &Patch::Apply(&pod)).await.is_ok()
                }
            })
            .buffer_unordered(32)
            .filter(|ok| futures::future::ready(*ok))
            .count()
            .await
    });
    let bare_s = t1.elapsed().as_secs_f64();
    println!(
        "bare kube-rs client: {applied} of {tasks} pods applied in {bare_s:.2} s ({:.0}/s); iris/bare apply rate {:.2}",
        applied as f64 / bare_s,
        (seen.len() as f64 / applied_s) / (applied as f64 / bare_s)
    );
    assert_eq!(done, ids.len());
}

/// The built kubectl's path (the API server's own version).
fn kubectl_bin() -> PathBuf {
    let bin = Command::new("bash")
        .arg(script())
        .arg("bin")
        .output()
        .expect("k8s-testenv.sh bin");
    Path::new(String::from_utf8_lossy(&bin.stdout).trim()).join("kubectl")
}

/// The published package's venv (`tests/compat/venv.sh` creates it; `scripts/test-all.sh` runs
/// that before the Rust tests).
fn published_venv() -> PathBuf {
    let venv = std::env::var("IRIS_COMPAT_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-compat"));
    assert!(
        venv.join("bin/iris").is_file(),
        "the published CLI is not at {}: run `bash tests/compat/venv.sh` first (scripts/test-all.sh does)",
        venv.display()
    );
    venv
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Runs this build's `iris` with `--config cfg` (the CLI reaches the controller through its own
/// `kubectl port-forward`, with the test cluster's kubectl).
fn iris_cfg(cfg: &Path, args: &[&str]) -> common::Out {
    let o = Command::new(common::IRIS)
        .arg("--config")
        .arg(cfg)
        .args(args)
        .env("IRIS_KUBECTL", kubectl_bin())
        .env_remove("KUBECONFIG")
        .output()
        .expect("run iris");
    common::Out::of(o)
}

/// A kubectl port-forward held open by the test (the published CLI's `--controller-url`).
struct Forward(std::process::Child);

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn controller_deployed_into_the_cluster_serves_the_published_cli_and_rolls_back_a_broken_image() {
    let env = start_env();
    let kubeconfig = env.run_dir.join("kubeconfig");
    let port = free_port();
    let remote = env.dir.path().join("remote-state");
    // The state directory is a hostPath on the controller's node: the agent keeps one
    // directory for it, shared by every pod that mounts it.
    let state = format!("/iris-controller-state-{port}");
    let cfg = env.dir.path().join("coreweave.yaml");
    std::fs::write(
        &cfg,
        format!(
            "name: cw-test\nplatform:\n  label_prefix: iris\n  coreweave:\n    namespace: {NS}\n    kubeconfig_path: {kc}\ncontroller:\n  image: ghcr.io/marin-community/iris-controller:v1\n  coreweave: {{port: {port}, service_name: iris-controller-svc, scale_group: cpu}}\nstorage:\n  local_state_dir: {state}\n  remote_state_dir: {remote}\nkubernetes_provider:\n  namespace: {NS}\n  controller_address: http://127.0.0.1:{port}\n  kueue: {{cluster_queue: cluster-queue}}\nscale_groups:\n  cpu:\n    num_vms: 2\n    resources: {{cpu: 32, ram: 128GB, disk: 1TB, device_type: cpu, capacity_type: on-demand}}\n  h100:\n    num_vms: 4\n    resources: {{cpu: 128, ram: 2000GB, disk: 1TB, device_type: gpu, device_variant: H100, device_count: 8, capacity_type: on-demand}}\n",
            kc = kubeconfig.display(),
            remote = remote.display(),
        ),
    )
    .expect("config");

    // Without the admin-owned objects, `cluster start` names them and creates nothing.
    let refused = iris_cfg(&cfg, &["cluster", "start"]);
    let err = refused.err();
    for want in [
        "ServiceAccount/iris/iris-controller",
        "ClusterRole/iris-controller-iris",
        "Role/iris/iris-task-secret-delivery",
    ] {
        assert!(err.contains(want), "{want} not named: {err}");
    }
    assert!(
        !env.kubectl(&["-n", NS, "get", "deployments", "-o", "name"])
            .contains("iris-controller"),
        "a refused start created the Deployment"
    );

    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/k8s-controller-prerequisites.yaml");
    let applied = env.kubectl_out(&["apply", "-f", &fixture.to_string_lossy()]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    env.kubectl(&["label", "node", "cpu-0", "iris-iris-scale-group=cpu"]);

    let started = iris_cfg(&cfg, &["cluster", "start"]);
    let out = started.ok();
    assert!(out.contains("Controller started"), "{out}");
    let deployment = |jsonpath: &str| {
        env.kubectl(&[
            "-n",
            NS,
            "get",
            "deployment",
            "iris-controller",
            "-o",
            &format!("jsonpath={jsonpath}"),
        ])
        .trim()
        .to_string()
    };
    let image_of = || deployment("{.spec.template.spec.containers[0].image}");
    assert_eq!(
        deployment("{.spec.template.spec.containers[0].image} {.spec.strategy.type}"),
        "ghcr.io/marin-community/iris-controller:v1 Recreate"
    );
    let ran = env.ran();
    assert!(
        ran.iter()
            .any(|p| p.name.starts_with("iris-controller-") && p.node == "cpu-0"),
        "the controller pod did not run on the scale group's node: {ran:?}"
    );

    // Our CLI reaches it through its own port-forward, and the controller (in the cluster,
    // with the ServiceAccount's credentials) runs the job as a pod admitted by Kueue.
    let job = iris_cfg(
        &cfg,
        &[
            "job",
            "run",
            "--no-wait",
            "--no-bundle",
            "--job-name",
            "in-cluster",
            "--",
            "echo",
            "from-inside",
        ],
    )
    .job_id();
    wait_for(LONG, "the in-cluster controller's job to succeed", || {
        let o = iris_cfg(&cfg, &["job", "summary", &job, "--json"]);
        o.stdout.contains("\"succeeded\"").then_some(())
    });

    // The published CLI, through a port-forward to the Service.
    let local = free_port();
    let forward = Forward(
        Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args([
                "-n",
                NS,
                "port-forward",
                "svc/iris-controller-svc",
                &format!("{local}:{port}"),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("kubectl port-forward"),
    );
    let url = format!("http://127.0.0.1:{local}");
    wait_for(LONG, "the port-forward", || {
        std::net::TcpStream::connect(("127.0.0.1", local)).ok()
    });
    let venv = published_venv();
    let workspace = env.dir.path().join("published-workspace");
    std::fs::create_dir_all(&workspace).expect("workspace");
    let published = |args: &[&str]| {
        common::Out::of(
            Command::new(venv.join("bin/iris"))
                .arg("--controller-url")
                .arg(&url)
                .args(args)
                .current_dir(&workspace)
                .env("IRIS_USER", "compat")
                .output()
                .expect("published iris"),
        )
    };
    let pjob = published(&[
        "job",
        "run",
        "--no-wait",
        "--job-name",
        "published",
        "--",
        "echo",
        "hi",
    ])
    .job_id();
    let deadline = std::time::Instant::now() + LONG;
    loop {
        // The published CLI's table: one row per job, its state in words.
        let o = published(&["job", "list", "--prefix", &pjob]);
        if o.stdout
            .lines()
            .any(|l| l.contains(&pjob) && l.to_lowercase().contains("succeeded"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the published CLI's job {pjob} did not succeed: {}\n{}\npods:\n{}",
            o.stdout,
            o.stderr,
            env.kubectl(&["-n", NS, "get", "pods", "-o", "wide"])
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    drop(forward);

    // A restart to an image that cannot be pulled rolls back by itself: the old image runs
    // again and the jobs are still there.
    let restart = iris_cfg(
        &cfg,
        &[
            "cluster",
            "controller",
            "restart",
            "--image",
            "registry.invalid/iris/controller:broken",
        ],
    );
    let err = restart.err();
    assert!(err.contains("ImagePullBackOff"), "{err}");
    assert!(
        err.contains(
            "Auto-rolling back to previous image ghcr.io/marin-community/iris-controller:v1"
        ),
        "{err}"
    );
    assert!(err.contains("rolled back"), "{err}");
    assert_eq!(image_of(), "ghcr.io/marin-community/iris-controller:v1");
    let listed = iris_cfg(&cfg, &["job", "summary", &job, "--json"]);
    assert!(listed.ok().contains("\"succeeded\""), "{}", listed.stdout);
    let record =
        std::fs::read_to_string(remote.join("rollout-record.json")).expect("rollout record");
    assert!(record.contains("rolled_back"), "{record}");

    // A good image rolls out; `--rollback` then brings the previous one back.
    let v2 = "ghcr.io/marin-community/iris-controller:v2";
    let out = iris_cfg(&cfg, &["cluster", "controller", "restart", "--image", v2]);
    assert!(out.ok().contains("Controller restarted"), "{}", out.stdout);
    assert_eq!(image_of(), v2);
    let record = std::fs::read_to_string(remote.join("rollout-record.json")).expect("record");
    assert!(record.contains("committed"), "{record}");
    let out = iris_cfg(&cfg, &["cluster", "controller", "restart", "--rollback"]);
    assert!(
        out.ok()
            .contains("rolled back to image ghcr.io/marin-community/iris-controller:v1"),
        "{}",
        out.stdout
    );
    assert_eq!(image_of(), "ghcr.io/marin-community/iris-controller:v1");
    let listed = iris_cfg(&cfg, &["job", "summary", &job, "--json"]);
    assert!(listed.ok().contains("\"succeeded\""), "{}", listed.stdout);

    // `cluster stop` removes the controller's objects and its pod.
    iris_cfg(&cfg, &["cluster", "stop"]).ok();
    let left = env.kubectl(&["-n", NS, "get", "deployments,services,pods", "-o", "name"]);
    assert!(!left.contains("iris-controller"), "left after stop: {left}");
}
