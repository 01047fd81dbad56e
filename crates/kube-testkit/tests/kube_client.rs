//! The fake API server driven by the real `kube` client and `kube_runtime` watchers.

use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use iris_kube_testkit::{NodeSpec, ServerOptions, TestApiServer};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, LogParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Config};
use serde_json::{json, Value};

const NS: &str = "iris";
const TIMEOUT: Duration = Duration::from_secs(30);

async fn start(opts: ServerOptions) -> (TestApiServer, Client) {
    let (server, url) = TestApiServer::start(opts).await.expect("server starts");
    let client =
        Client::try_from(Config::new(url.parse().expect("url parses"))).expect("client builds");
    (server, client)
}

fn workload_api(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", "Workload"),
        "workloads",
    );
    Api::namespaced_with(client.clone(), NS, &ar)
}

async fn priority_class(client: &Client, name: &str, value: i64) {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", "WorkloadPriorityClass"),
        "workloadpriorityclasses",
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "WorkloadPriorityClass",
        "metadata": {"name": name}, "value": value, "description": "test"
    }))
    .expect("valid object");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("priority class created");
}

fn task_pod(name: &str, script: &str, gpus: u32) -> Pod {
    let mut resources = json!({"requests": {"cpu": "100m"}});
    if gpus > 0 {
        resources["limits"] = json!({"nvidia.com/gpu": gpus.to_string()});
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {
            "iris.managed": "true", "kueue.x-k8s.io/queue-name": "iris-lq"}},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "task", "image": "ghcr.io/marin-community/iris-task:latest",
                "workingDir": "/app",
                "command": ["bash", "-lc", script],
                "env": [{"name": "IRIS_WORKDIR", "value": "/app"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "resources": resources,
                "volumeMounts": [{"name": "workdir", "mountPath": "/app"}],
            }],
            "volumes": [{"name": "workdir", "emptyDir": {}}],
        }
    }))
    .expect("valid pod")
}

fn gang_pod(name: &str, group: &str, total: u32, index: u32, class: &str, gpus: u32) -> Pod {
    let mut p = task_pod(name, "echo started; sleep 300", gpus);
    let meta = &mut p.metadata;
    let labels = meta.labels.get_or_insert_with(Default::default);
    labels.insert("kueue.x-k8s.io/pod-group-name".into(), group.into());
    labels.insert(
        "kueue.x-k8s.io/pod-group-pod-index".into(),
        index.to_string(),
    );
    labels.insert("kueue.x-k8s.io/priority-class".into(), class.into());
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(
            "kueue.x-k8s.io/pod-group-total-count".into(),
            total.to_string(),
        );
    p
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn condition<'a>(p: &'a Pod, kind: &str) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
}

fn wl_condition(wl: &DynamicObject, kind: &str) -> Option<Value> {
    wl.data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
}

/// Waits until the simulation has completed a whole pass that began after this call, so its
/// controllers have seen everything written before it.
async fn wait_full_pass(server: &TestApiServer, what: &str) {
    let seen = server.passes();
    wait_until(what, || async { server.passes() >= seen + 2 }).await;
}

/// Waits (through a `kube_runtime` watcher) until the pod satisfies `cond`.
async fn wait_pod(api: &Api<Pod>, name: &str, what: &str, cond: impl Fn(&Pod) -> bool) -> Pod {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(api.clone(), cfg).applied_objects();
    let found = tokio::time::timeout(TIMEOUT, async {
        let mut stream = std::pin::pin!(stream);
        while let Some(p) = stream.try_next().await.expect("watch stream") {
            if cond(&p) {
                return p;
            }
        }
        panic!("watch ended before {name} was {what}")
    })
    .await;
    match found {
        Ok(p) => p,
        Err(_) => panic!(
            "timed out waiting for {name} to be {what}; last state: {:?}",
            api.get_opt(name).await
        ),
    }
}

/// Waits until a pod is gone (a `Delete` event or no object at all).
async fn wait_gone(api: &Api<Pod>, name: &str) {
    let r = tokio::time::timeout(TIMEOUT, async {
        loop {
            if api.get_opt(name).await.expect("get").is_none() {
                return;
            }
            let cfg = watcher::Config::default()
                .fields(&format!("metadata.name={name}"))
                .timeout(1);
            let mut events = std::pin::pin!(watcher(api.clone(), cfg));
            while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(2), events.try_next())
                .await
                .map(|r| r.ok().flatten())
            {
                if matches!(ev, watcher::Event::Delete(_)) {
                    return;
                }
            }
        }
    })
    .await;
    assert!(
        r.is_ok(),
        "{name} still exists: {:?}",
        api.get_opt(name).await
    );
}

async fn wait_until<F, Fut>(what: &str, f: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let r = tokio::time::timeout(TIMEOUT, async {
        while !f().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(r.is_ok(), "timed out waiting until {what}");
}

#[tokio::test]
async fn queued_pod_is_admitted_runs_and_logs() {
    let (server, client) = start(ServerOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let script = "set -e; cd /app; echo \"hello from $POD_NAME in $(pwd)\"; echo to-stderr >&2; test \"$IRIS_WORKDIR\" = \"$(pwd)\"; touch marker";
    let created = pods
        .create(&PostParams::default(), &task_pod("hello", script, 0))
        .await
        .expect("created");
    // Kueue's webhook gated it and marked it managed.
    let gates = created
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.clone())
        .unwrap_or_default();
    assert_eq!(
        gates.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
        vec!["kueue.x-k8s.io/admission"]
    );
    assert_eq!(
        created
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kueue.x-k8s.io/managed"))
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(phase(&created), "Pending");

    let done = wait_pod(&pods, "hello", "Succeeded", |p| phase(p) == "Succeeded").await;
    let spec = done.spec.as_ref().expect("spec");
    assert!(
        spec.scheduling_gates.as_ref().is_none_or(|g| g.is_empty()),
        "gate removed on admission"
    );
    assert_eq!(spec.node_name.as_deref(), Some("testkit-node-0"));
    let cs = &done
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .expect("container statuses")[0];
    let term = cs
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("terminated");
    assert_eq!(
        (term.exit_code, term.reason.as_deref()),
        (0, Some("Completed"))
    );

    let log = pods
        .logs("hello", &LogParams::default())
        .await
        .expect("log");
    assert!(log.contains("hello from hello in "), "{log}");
    assert!(log.contains("to-stderr"), "{log}");
    let tail = pods
        .logs(
            "hello",
            &LogParams {
                tail_lines: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("log");
    assert_eq!(tail.lines().count(), 1);

    let wl = workload_api(&client)
        .list(&ListParams::default())
        .await
        .expect("workloads")
        .items;
    assert_eq!(wl.len(), 1);
    let name = wl[0].metadata.name.clone().unwrap_or_default();
    assert!(name.starts_with("pod-hello-"), "{name}");
    assert_eq!(
        wl_condition(&wl[0], "Admitted").map(|c| c["status"].clone()),
        Some(json!("True"))
    );
    let wls = workload_api(&client);
    wait_until("the workload is finished", || async {
        wls.get_opt(&name)
            .await
            .expect("get")
            .and_then(|w| wl_condition(&w, "Finished"))
            .is_some_and(|c| c["reason"] == "Succeeded")
    })
    .await;

    // A failing container reports its exit code.
    pods.create(
        &PostParams::default(),
        &task_pod("fails", "echo bye; exit 3", 0),
    )
    .await
    .expect("created");
    let failed = wait_pod(&pods, "fails", "Failed", |p| phase(p) == "Failed").await;
    let cs = &failed
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .expect("statuses")[0];
    assert_eq!(
        cs.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code),
        Some(3)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn gangs_are_admitted_whole_and_preempt_lower_priority() {
    let opts = ServerOptions {
        nodes: vec![
            NodeSpec::new("gpu-a")
                .gpus(4)
                .taint("nvidia.com/gpu", "present", "NoSchedule"),
            NodeSpec::new("gpu-b")
                .gpus(4)
                .taint("nvidia.com/gpu", "present", "NoSchedule"),
        ],
        gpu_quota: Some(8),
        ..Default::default()
    };
    let (server, client) = start(opts).await;
    priority_class(&client, "iris-coscheduled-batch", 2).await;
    priority_class(&client, "iris-coscheduled-production", 1000).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let workloads = workload_api(&client);

    // A gang larger than the quota is admitted never, not partly.
    for i in 0..3 {
        pods.create(
            &PostParams::default(),
            &gang_pod(
                &format!("huge-{i}"),
                "pg-huge",
                3,
                i,
                "iris-coscheduled-batch",
                4,
            ),
        )
        .await
        .expect("created");
    }
    wait_until(
        "the huge gang's workload reports insufficient quota",
        || async {
            workloads
                .get_opt("pg-huge")
                .await
                .expect("get")
                .and_then(|w| wl_condition(&w, "QuotaReserved"))
                .is_some_and(|c| {
                    c["status"] == "False"
                        && c["message"]
                            .as_str()
                            .unwrap_or_default()
                            .contains("request > maximum capacity (12 > 8)")
                })
        },
    )
    .await;
    for i in 0..3 {
        let p = pods.get(&format!("huge-{i}")).await.expect("get");
        assert!(
            !p.spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.clone())
                .unwrap_or_default()
                .is_empty(),
            "huge-{i} stays gated"
        );
    }
    for i in 0..3 {
        pods.delete(&format!("huge-{i}"), &DeleteParams::default())
            .await
            .expect("deleted");
    }

    // The low-priority gang fills the quota.
    for i in 0..2 {
        pods.create(
            &PostParams::default(),
            &gang_pod(
                &format!("low-{i}"),
                "pg-low",
                2,
                i,
                "iris-coscheduled-batch",
                4,
            ),
        )
        .await
        .expect("created");
    }
    for i in 0..2 {
        wait_pod(&pods, &format!("low-{i}"), "Running", |p| {
            phase(p) == "Running"
        })
        .await;
    }
    let mut nodes: Vec<String> = Vec::new();
    for i in 0..2 {
        nodes.push(
            pods.get(&format!("low-{i}"))
                .await
                .expect("get")
                .spec
                .and_then(|s| s.node_name)
                .unwrap_or_default(),
        );
    }
    assert_eq!(nodes.len(), 2);
    assert_ne!(nodes[0], nodes[1], "one 4-GPU pod per 4-GPU node");

    // Half of a high-priority gang: no workload yet, nothing preempted.
    pods.create(
        &PostParams::default(),
        &gang_pod("high-0", "pg-high", 2, 0, "iris-coscheduled-production", 4),
    )
    .await
    .expect("created");
    wait_full_pass(&server, "Kueue has seen the half gang").await;
    assert!(
        workloads.get_opt("pg-high").await.expect("get").is_none(),
        "no workload before the group is complete"
    );
    assert_eq!(phase(&pods.get("low-0").await.expect("get")), "Running");

    // The whole gang: the low gang is preempted Kueue-style, then the high gang runs.
    let mut victims = std::pin::pin!(watcher(
        pods.clone(),
        watcher::Config::default().labels("kueue.x-k8s.io/pod-group-name=pg-low")
    )
    .applied_objects());
    pods.create(
        &PostParams::default(),
        &gang_pod("high-1", "pg-high", 2, 1, "iris-coscheduled-production", 4),
    )
    .await
    .expect("created");
    let failed_victim = tokio::time::timeout(TIMEOUT, async {
        while let Some(p) = victims.try_next().await.expect("watch") {
            if phase(&p) == "Failed" {
                return p;
            }
        }
        panic!("watch ended")
    })
    .await
    .expect("a victim pod observed Failed");
    let tt = condition(&failed_victim, "TerminationTarget").expect("TerminationTarget condition");
    assert_eq!(
        (tt.status.as_str(), tt.reason.as_deref()),
        ("True", Some("WorkloadEvictedDueToPreempted"))
    );
    assert!(
        failed_victim.metadata.deletion_timestamp.is_some(),
        "victims are deleted"
    );
    for i in 0..2 {
        wait_gone(&pods, &format!("low-{i}")).await;
    }
    for i in 0..2 {
        wait_pod(&pods, &format!("high-{i}"), "Running", |p| {
            phase(p) == "Running"
        })
        .await;
    }
    let high = workloads.get("pg-high").await.expect("workload");
    assert_eq!(
        wl_condition(&high, "Admitted").map(|c| c["status"].clone()),
        Some(json!("True"))
    );
    assert_eq!(high.data["spec"]["priority"], json!(1000));
    wait_until(
        "the low workload is garbage collected with its pods",
        || async { workloads.get_opt("pg-low").await.expect("get").is_none() },
    )
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn disruption_fails_the_pod_and_kills_its_process() {
    let (server, client) = start(ServerOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &task_pod("victim", "echo up; sleep 300", 0),
    )
    .await
    .expect("created");
    wait_pod(&pods, "victim", "Running", |p| phase(p) == "Running").await;
    assert_eq!(server.running_processes(), 1);
    server.disrupt(NS, "victim").expect("disrupted");
    let p = wait_pod(&pods, "victim", "Failed", |p| phase(p) == "Failed").await;
    let dt = condition(&p, "DisruptionTarget").expect("DisruptionTarget");
    assert_eq!(
        (dt.status.as_str(), dt.reason.as_deref()),
        ("True", Some("TerminationByKubelet"))
    );
    assert!(
        dt.message
            .as_deref()
            .unwrap_or_default()
            .contains("testkit-node-0"),
        "{:?}",
        dt.message
    );
    assert_eq!(server.running_processes(), 0);
    let code = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c[0].state.clone())
        .and_then(|s| s.terminated)
        .map(|t| t.exit_code);
    assert_eq!(code, Some(143), "SIGTERM");

    // Node-pressure eviction and deletion of a running pod.
    pods.create(&PostParams::default(), &task_pod("evicted", "sleep 300", 0))
        .await
        .expect("created");
    wait_pod(&pods, "evicted", "Running", |p| phase(p) == "Running").await;
    server.evict(NS, "evicted").expect("evicted");
    let p = wait_pod(&pods, "evicted", "Failed", |p| phase(p) == "Failed").await;
    assert_eq!(p.status.and_then(|s| s.reason).as_deref(), Some("Evicted"));

    pods.create(&PostParams::default(), &task_pod("deleted", "sleep 300", 0))
        .await
        .expect("created");
    wait_pod(&pods, "deleted", "Running", |p| phase(p) == "Running").await;
    let del = pods
        .delete("deleted", &DeleteParams::default())
        .await
        .expect("delete accepted");
    assert!(del.is_left(), "a running pod terminates gracefully");
    wait_gone(&pods, "deleted").await;
    wait_until("no process is left", || async {
        server.running_processes() == 0
    })
    .await;

    // A vanished pod is gone at once.
    pods.create(&PostParams::default(), &task_pod("ghost", "sleep 300", 0))
        .await
        .expect("created");
    wait_pod(&pods, "ghost", "Running", |p| phase(p) == "Running").await;
    server.vanish(NS, "ghost").expect("vanished");
    assert!(pods.get_opt("ghost").await.expect("get").is_none());
    wait_until("the vanished pod's process is killed", || async {
        server.running_processes() == 0
    })
    .await;

    // An idle cluster writes nothing: watchers see no spurious MODIFIED events.
    pods.create(&PostParams::default(), &task_pod("idle", "sleep 300", 0))
        .await
        .expect("created");
    wait_pod(&pods, "idle", "Running", |p| phase(p) == "Running").await;
    let version = || async {
        pods.list(&ListParams::default())
            .await
            .expect("list")
            .metadata
            .resource_version
    };
    // Settled: a whole pass over the running pod wrote nothing.
    let before = tokio::time::timeout(TIMEOUT, async {
        loop {
            let start = version().await;
            wait_full_pass(&server, "a pass over the running pod").await;
            if version().await == start {
                return start;
            }
        }
    })
    .await
    .expect("the simulation settles");
    // Two more whole passes over the idle cluster write nothing either.
    wait_full_pass(&server, "a pass over the idle cluster").await;
    wait_full_pass(&server, "another pass over the idle cluster").await;
    let after = version().await;
    assert_eq!(before, after, "no writes while nothing changes");
    pods.delete("idle", &DeleteParams::default())
        .await
        .expect("deleted");

    // A followed log streams while the container runs and ends with it.
    let script = "for i in 1 2 3; do echo line-$i; sleep 0.2; done";
    pods.create(&PostParams::default(), &task_pod("chatty", script, 0))
        .await
        .expect("created");
    wait_pod(&pods, "chatty", "started", |p| phase(p) != "Pending").await;
    let follow = LogParams {
        follow: true,
        ..Default::default()
    };
    let stream = pods
        .log_stream("chatty", &follow)
        .await
        .expect("log stream");
    let lines: Vec<String> = tokio::time::timeout(TIMEOUT, stream.lines().try_collect())
        .await
        .expect("the stream ends with the container")
        .expect("lines");
    assert_eq!(lines, vec!["line-1", "line-2", "line-3"]);

    // Losing a node: the pod GC deletes its pods and their processes are killed.
    pods.create(
        &PostParams::default(),
        &task_pod("stranded", "sleep 300", 0),
    )
    .await
    .expect("created");
    wait_pod(&pods, "stranded", "Running", |p| phase(p) == "Running").await;
    server.remove_node("testkit-node-0").expect("node removed");
    wait_gone(&pods, "stranded").await;
    wait_until("the stranded pod's process is killed", || async {
        server.running_processes() == 0
    })
    .await;

    // Shutdown kills every process the server started.
    server
        .add_node(NodeSpec::new("node-2"))
        .expect("node added");
    pods.create(
        &PostParams::default(),
        &task_pod("survivor", "echo pid=$BASHPID; exec sleep 300", 0),
    )
    .await
    .expect("created");
    wait_pod(&pods, "survivor", "Running", |p| phase(p) == "Running").await;
    let mut pid = None;
    wait_until("the survivor logged its pid", || async {
        let log = pods
            .logs("survivor", &LogParams::default())
            .await
            .unwrap_or_default();
        log.trim()
            .strip_prefix("pid=")
            .and_then(|p| p.parse::<u32>().ok())
            .is_some()
    })
    .await;
    let log = pods
        .logs("survivor", &LogParams::default())
        .await
        .expect("log");
    if let Some(p) = log
        .trim()
        .strip_prefix("pid=")
        .and_then(|p| p.parse::<u32>().ok())
    {
        pid = Some(p);
    }
    let pid = pid.expect("pid logged");
    assert!(alive(pid), "the survivor runs before shutdown");
    server.shutdown().await;
    wait_until("the survivor is killed by shutdown", || async {
        !alive(pid)
    })
    .await;
}

/// Whether a process exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            stat.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                != Some("Z")
        }
        Err(_) => false,
    }
}

#[tokio::test]
async fn api_semantics() {
    let opts = ServerOptions {
        bad_images: ["registry.invalid/nope:1".to_string()].into(),
        history_limit: 20,
        ..Default::default()
    };
    let (server, client) = start(opts).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"a": "1"}}))
            .expect("cm");
    let first = cms
        .create(&PostParams::default(), &cm)
        .await
        .expect("created");
    assert!(first.metadata.uid.is_some() && first.metadata.creation_timestamp.is_some());
    match cms.create(&PostParams::default(), &cm).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists")),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    match cms.get("nope").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
            assert_eq!(s.message, "configmaps \"nope\" not found");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    // Optimistic concurrency.
    let mut stale = first.clone();
    cms.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"b": "2"}})),
    )
    .await
    .expect("merge patch");
    stale.data = Some([("a".to_string(), "9".to_string())].into());
    match cms.replace("cfg", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("expected Conflict, got {other:?}"),
    }
    // Server-side apply creates, then merges.
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"x": "1"}});
    let pp = PatchParams::apply("iris-test").force();
    cms.patch("applied", &pp, &Patch::Apply(&applied))
        .await
        .expect("apply creates");
    let got = cms.patch("applied", &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"y": "2"}}))).await.expect("apply merges");
    assert_eq!(got.data.unwrap_or_default().len(), 2);
    // Delete answers a Status; deleting again is 404.
    assert!(cms
        .delete("applied", &DeleteParams::default())
        .await
        .expect("deleted")
        .is_right());
    assert!(
        matches!(cms.delete("applied", &DeleteParams::default()).await, Err(kube::Error::Api(s)) if s.code == 404)
    );

    // Priority classes must exist (as with the real admission plugin).
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut p = task_pod("prio", "true", 0);
    p.spec.as_mut().expect("spec").priority_class_name = Some("iris-batch".into());
    assert!(
        matches!(pods.create(&PostParams::default(), &p).await, Err(kube::Error::Api(s)) if s.code == 403)
    );

    // Pod specs are immutable apart from the allowed fields.
    pods.create(&PostParams::default(), &task_pod("img", "sleep 300", 0))
        .await
        .expect("created");
    let patch = json!({"spec": {"containers": [{"name": "task", "command": ["true"]}]}});
    assert!(
        matches!(pods.patch("img", &PatchParams::default(), &Patch::Strategic(patch)).await, Err(kube::Error::Api(s)) if s.code == 422)
    );

    // A bad image backs off.
    let mut bad = task_pod("badimg", "true", 0);
    bad.spec.as_mut().expect("spec").containers[0].image = Some("registry.invalid/nope:1".into());
    pods.create(&PostParams::default(), &bad)
        .await
        .expect("created");
    let p = wait_pod(&pods, "badimg", "in ImagePullBackOff", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c[0].state.as_ref())
            .and_then(|s| s.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some("ImagePullBackOff"))
    })
    .await;
    assert_eq!(phase(&p), "Pending");
    let waiting = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c[0].state.clone())
        .and_then(|s| s.waiting)
        .expect("waiting");
    assert_eq!(
        waiting.message.as_deref(),
        Some("Back-off pulling image \"registry.invalid/nope:1\"")
    );

    // Nodes and discovery through the client.
    let nodes: Api<Node> = Api::all(client.clone());
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .expect("nodes")
            .items
            .len(),
        1
    );
    let version = client.apiserver_version().await.expect("version");
    assert_eq!(version.major, "1");
    let discovery = kube::Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    assert!(discovery.groups().any(|g| g.name() == "kueue.x-k8s.io"));

    // PDBs: eviction is refused while the budget allows no disruption.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({"metadata": {"name": "img-pdb"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"iris.managed": "true"}}}}))
    .expect("pdb");
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .expect("pdb created");
    wait_pod(&pods, "img", "Running", |p| phase(p) == "Running").await;
    wait_until("the pdb status is current", || async {
        pdbs.get("img-pdb")
            .await
            .expect("pdb")
            .status
            .is_some_and(|s| s.current_healthy == Some(1))
    })
    .await;
    // kube retries 429 answers by default (with backoff); ask once.
    let mut cfg = Config::new(server.url().parse().expect("url"));
    cfg.default_retry = false;
    let once: Api<Pod> = Api::namespaced(Client::try_from(cfg).expect("client"), NS);
    let r = once.evict("img", &Default::default()).await;
    assert!(
        matches!(&r, Err(kube::Error::Api(s)) if s.code == 429),
        "{r:?}"
    );

    // A watch from a compacted resourceVersion gets 410 Gone.
    for i in 0..30 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}})).expect("cm");
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("created");
    }
    let mut stream = cms
        .watch(&WatchParams::default(), "2")
        .await
        .expect("watch")
        .boxed();
    match tokio::time::timeout(TIMEOUT, stream.try_next())
        .await
        .expect("an event")
    {
        Ok(Some(WatchEvent::Error(e))) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    let watched: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.verb == "watch")
        .map(|r| r.query.clone())
        .collect();
    assert!(!watched.is_empty());
    let unknown: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.verb == "unknown")
        .map(|r| format!("{} {}?{}", r.method, r.path, r.query))
        .collect();
    assert!(
        unknown.is_empty(),
        "requests the server did not route: {unknown:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn init_containers_volumes_secrets_and_env() {
    let (server, client) = start(ServerOptions::default()).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), NS);
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "job-secrets"}, "stringData": {"TOKEN": "s3cr3t"}, "data": {"file.txt": "aGVsbG8="}
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret created");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "staged", "labels": {"kueue.x-k8s.io/queue-name": "iris-lq"}},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {"name": "stage-workdir", "image": "iris-controller:1", "command": ["bash", "-c", "echo staged > /app/bundle.txt"],
                 "volumeMounts": [{"name": "workdir", "mountPath": "/app"}]},
                {"name": "log-shipper", "image": "iris-controller:1", "restartPolicy": "Always", "command": ["false"]},
            ],
            "containers": [{
                "name": "task", "image": "iris-task:1", "workingDir": "/app",
                "command": ["bash", "-lc"],
                "args": ["set -e; cat bundle.txt; echo token=$TOKEN; cat /secrets/file.txt; echo; echo node=$(NODE) home=$HOME; test -d /iris/outputs"],
                "env": [
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "job-secrets", "key": "TOKEN"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                ],
                "volumeMounts": [
                    {"name": "workdir", "mountPath": "/app"},
                    {"name": "outputs", "mountPath": "/iris/outputs"},
                    {"name": "secrets", "mountPath": "/secrets", "readOnly": true},
                ],
            }],
            "volumes": [
                {"name": "workdir", "emptyDir": {}},
                {"name": "outputs", "emptyDir": {}},
                {"name": "secrets", "secret": {"secretName": "job-secrets"}},
            ],
        }
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("created");
    let done = wait_pod(&pods, "staged", "finished", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await;
    let log = pods
        .logs(
            "staged",
            &LogParams {
                container: Some("task".into()),
                ..Default::default()
            },
        )
        .await
        .expect("log");
    assert_eq!(phase(&done), "Succeeded", "{log}");
    assert!(log.contains("staged\n"), "{log}");
    assert!(log.contains("token=s3cr3t"), "{log}");
    assert!(log.contains("hello"), "{log}");
    assert!(log.contains("node=testkit-node-0"), "{log}");
    let home = server.work_dir().to_string_lossy().into_owned();
    assert!(
        log.contains(&format!("home={home}")),
        "HOME is in the pod's directory: {log}"
    );
    let inits = done
        .status
        .and_then(|s| s.init_container_statuses)
        .expect("init statuses");
    let stage = inits[0]
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("stage terminated");
    assert_eq!(stage.exit_code, 0);
    // Two containers: the log needs a container name.
    let multi: Pod = serde_json::from_value(json!({"metadata": {"name": "two"}, "spec": {"containers": [
        {"name": "a", "image": "x:1", "command": ["true"]}, {"name": "b", "image": "x:1", "command": ["true"]}]}}))
    .expect("pod");
    pods.create(&PostParams::default(), &multi)
        .await
        .expect("created");
    wait_pod(&pods, "two", "Succeeded", |p| phase(p) == "Succeeded").await;
    match pods.logs("two", &LogParams::default()).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 400);
            assert!(
                s.message.contains(
                    "a container name must be specified for pod two, choose one of: [a b]"
                ),
                "{}",
                s.message
            );
        }
        other => panic!("expected 400, got {other:?}"),
    }
    // A missing secret keeps the container waiting with CreateContainerConfigError.
    let mut missing = task_pod("nosecret", "true", 0);
    missing.spec.as_mut().expect("spec").containers[0].env =
        Some(vec![serde_json::from_value(json!(
            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}
        ))
        .expect("env")]);
    pods.create(&PostParams::default(), &missing)
        .await
        .expect("created");
    wait_pod(&pods, "nosecret", "waiting on its config", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c[0].state.as_ref())
            .and_then(|s| s.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
    })
    .await;
    server.shutdown().await;
}
