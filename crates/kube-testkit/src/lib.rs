//! A fake Kubernetes API server for tests, with Kueue's plain-pod admission and a kubelet that
//! runs containers as local processes.
//!
//! [`TestApiServer::start`] binds `127.0.0.1:0` and serves the real REST and watch protocol over
//! plain HTTP, so `kube::Client` (and `kube_runtime::watcher`) talk to it as to a cluster:
//!
//! * core/v1 pods (with `status`, `log`, `eviction`), nodes, namespaces, configmaps, secrets,
//!   events, services, serviceaccounts, persistentvolumeclaims; apps/v1 deployments;
//!   coordination.k8s.io/v1 leases; policy/v1 poddisruptionbudgets; scheduling.k8s.io/v1
//!   priorityclasses; kueue.x-k8s.io/v1beta1 workloads, localqueues, clusterqueues,
//!   resourceflavors, workloadpriorityclasses and topologies (also served at v1alpha1).
//! * get, list (label selectors in every kube-rs form, any dotted `fieldSelector`, `limit` and
//!   `continue`), watch (replay from a bounded event history after `resourceVersion`, `410 Gone`
//!   as an `ERROR` event once compacted, bookmarks, `sendInitialEvents`, `timeoutSeconds`),
//!   create, replace (optimistic concurrency on `resourceVersion`), patch (merge, strategic merge
//!   with the Kubernetes merge keys, JSON patch, server-side apply that creates a missing object),
//!   delete (graceful for bound pods, finalizers, `Orphan` propagation, preconditions),
//!   deletecollection, `dryRun`; errors are `Status` objects with the API server's codes,
//!   reasons and messages; discovery at `/api`, `/api/v1`, `/apis`, `/apis/{g}`, `/apis/{g}/{v}`
//!   and `/version`.
//! * API-server admission for pods: defaulting, `spec.priority` from the PriorityClass (a missing
//!   class is 403 as in Kubernetes), immutable pod specs (only images, the deadline, added
//!   tolerations and removed scheduling gates may change), immutable PriorityClass values.
//!
//! A background loop (every [`ServerOptions::tick`], and shortly after each write) emulates:
//!
//! * **Kueue** (plain pods): the webhook gates every pod labelled `kueue.x-k8s.io/queue-name`
//!   with `kueue.x-k8s.io/admission`, labels it `kueue.x-k8s.io/managed=true` and (by default)
//!   adds the `kueue.x-k8s.io/managed` finalizer. A Workload is created per pod
//!   (`pod-<name>-<5 uid chars>`, owned by the pod) or per pod group (named after
//!   `kueue.x-k8s.io/pod-group-name`, owned by every member, created once
//!   `kueue.x-k8s.io/pod-group-total-count` pods exist). Workloads are admitted against one GPU
//!   quota ([`ServerOptions::gpu_quota`]) in priority order (the `value` of the
//!   WorkloadPriorityClass named by `kueue.x-k8s.io/priority-class`, unknown → 0), then FIFO;
//!   groups all-or-nothing. Admission sets `QuotaReserved`/`Admitted` and removes the gates;
//!   a workload that does not fit gets `QuotaReserved=False` reason `Pending` with Kueue's
//!   "couldn't assign flavors … insufficient unused quota …" message. A workload that does not
//!   fit preempts strictly lower-priority admitted workloads (lowest priority, most recently
//!   admitted first, only as many as needed): the victim gets `Evicted=True` (reason
//!   `Preempted`) and `Preempted=True` (reason `InClusterQueue`); each of its pods gets
//!   `TerminationTarget=True` reason `WorkloadEvictedDueToPreempted` — exactly what Kueue's pod
//!   integration writes — and is deleted with its grace period, so the kubelet stops it (phase
//!   `Failed`, exit 143/137) and the object goes away once Kueue's finalizer is released. The
//!   victims hold their quota until their pods have stopped; the preemptor is admitted after.
//!   Finished workloads get `Finished=True`; Kueue's finalizer is dropped from pods that are
//!   terminating and stopped, or terminal with a finished workload. Evicted workloads are never
//!   re-admitted (their pods are gone); the garbage collector removes them with their pods.
//! * **the scheduler**: an ungated pod is bound to the first node (by name) that is Ready,
//!   schedulable, matches `nodeSelector`/required node affinity, tolerates its taints and has
//!   room for its `nvidia.com/gpu`; otherwise `PodScheduled=False` reason `Unschedulable` with
//!   the scheduler's "0/N nodes are available: …" message. CPU and memory are not accounted.
//! * **the kubelet**: containers run as local processes (`command` + `args`, `$(VAR)`
//!   expansion, `env`/`envFrom` with `valueFrom` from the pod, secrets and configmaps), each in
//!   its own process group, in a per-pod directory: every `volumeMount` and the `workingDir`
//!   are mapped to local directories (emptyDir per pod, hostPath per node, secret and configMap
//!   volumes written out) and those container paths are rewritten in argv and env values, so
//!   `bash -lc "cd /app && …"` works; `HOME` is the pod's own `home` directory. Init containers
//!   run in order first; native sidecars (`restartPolicy: Always`) are not executed and show as
//!   running. Output (stdout and stderr, by line) is the pod log. Containers run once
//!   (restarts are not simulated): the pod ends `Succeeded` or `Failed` with each
//!   `state.terminated.exitCode`. An image in [`ServerOptions::bad_images`] (or containing
//!   `does-not-exist`) waits with `ErrImagePull` then `ImagePullBackOff`
//!   (`Back-off pulling image "<image>"`). `activeDeadlineSeconds` ends a pod `Failed` with
//!   reason `DeadlineExceeded`. Deleting a bound pod sends SIGTERM, then SIGKILL after the grace
//!   period (capped by [`ServerOptions::max_termination_grace`]); the object is removed once the
//!   processes are gone and no finalizer remains.
//! * **the garbage collector** (owner references) and **the disruption controller**
//!   (PodDisruptionBudget status; the eviction subresource answers 429 when a budget forbids).
//!
//! Test controls live on the handle: nodes, quota, disruptions ([`Disruption`]), vanishing pods,
//! the requests served, and [`TestApiServer::shutdown`], which stops the server and kills every
//! process it started (dropping the handle does the same, without waiting).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use iris_kube_testkit::{NodeSpec, ServerOptions, TestApiServer};
//!
//! let opts = ServerOptions {
//!     nodes: vec![NodeSpec::new("gpu-0").gpus(8)],
//!     gpu_quota: Some(8),
//!     ..Default::default()
//! };
//! let (server, url) = TestApiServer::start(opts).await?;
//! let client = kube::Client::try_from(kube::Config::new(url.parse()?))?;
//! // ... run the code under test against `client`, assert on objects and `server.requests()` ...
//! server.shutdown().await;
//! # drop(client);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod apiserver;
mod cluster;
mod http;
mod kubelet;
mod kueue;
pub mod node_agent;
mod node_logs;
mod node_portforward;
mod patch;
mod pdb;
mod pod;
mod process;
mod resources;
mod selector;
mod sim;
mod spdy_dictionary;
mod status;
mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::cluster::{Cluster, Settings, Shared};
use crate::resources::id;
use crate::status::ApiError;
use crate::store::{now_rfc3339, Store};

pub use crate::kubelet::Disruption;
pub use crate::node_agent::{AgentOptions, Mode as AgentMode, NodeAgent, RanPod};
pub use crate::node_logs::KubeletEndpoint;

/// How the fake cluster starts.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Simulation period (Kueue, scheduler, kubelet, GC). Writes also wake it early.
    pub tick: Duration,
    /// Nodes present at start. The default is one node without GPUs, `testkit-node-0`.
    pub nodes: Vec<NodeSpec>,
    /// Kueue's GPU (`nvidia.com/gpu`) quota; `None` admits everything.
    pub gpu_quota: Option<u64>,
    /// Images that never pull (`ImagePullBackOff`), besides any containing `does-not-exist`.
    pub bad_images: BTreeSet<String>,
    /// Namespaces present at start (besides `default`, `kube-system` and `kube-public`).
    pub namespaces: Vec<String>,
    /// Create a namespace when an object is created in a missing one (else 404, as Kubernetes).
    pub auto_create_namespaces: bool,
    /// Where pod directories go; `None` makes a temporary directory removed at shutdown.
    pub work_dir: Option<PathBuf>,
    /// Upper bound on a pod's termination grace period before SIGKILL.
    pub max_termination_grace: Duration,
    /// Events kept for watch replay; a watch from an older resourceVersion gets 410 Gone.
    pub history_limit: usize,
    /// Period of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Add (and release) Kueue's `kueue.x-k8s.io/managed` finalizer on managed pods.
    pub kueue_pod_finalizer: bool,
    /// Hold workloads whose LocalQueue does not exist (`QuotaReserved=False`, `Inadmissible`).
    pub require_local_queue: bool,
    /// Run init containers (`false`: they count as succeeded without running).
    pub run_init_containers: bool,
    /// ClusterQueue named in admissions when the LocalQueue does not name one.
    pub cluster_queue: String,
    /// ResourceFlavor named in admissions and quota messages.
    pub resource_flavor: String,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            tick: Duration::from_millis(50),
            nodes: vec![NodeSpec::new("testkit-node-0")],
            gpu_quota: None,
            bad_images: BTreeSet::new(),
            namespaces: Vec::new(),
            auto_create_namespaces: true,
            work_dir: None,
            max_termination_grace: Duration::from_secs(2),
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(1),
            kueue_pod_finalizer: true,
            require_local_queue: false,
            run_init_containers: true,
            cluster_queue: "cluster-queue".to_string(),
            resource_flavor: "default-flavor".to_string(),
        }
    }
}

/// A node to register: name, labels, GPUs (`nvidia.com/gpu` capacity and allocatable) and
/// taints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Node name (also its `kubernetes.io/hostname` label).
    pub name: String,
    /// Labels besides `kubernetes.io/{hostname,os,arch}`.
    pub labels: BTreeMap<String, String>,
    /// `nvidia.com/gpu` capacity and allocatable (absent when 0).
    pub gpus: u64,
    /// CPU capacity (not accounted by the scheduler).
    pub cpu: String,
    /// Memory capacity (not accounted by the scheduler).
    pub memory: String,
    /// `(key, value, effect)`, e.g. `("nvidia.com/gpu", "present", "NoSchedule")`.
    pub taints: Vec<(String, String, String)>,
}

impl NodeSpec {
    /// A Ready node with 32 CPUs, 256Gi memory and no GPUs.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            labels: BTreeMap::new(),
            gpus: 0,
            cpu: "32".to_string(),
            memory: "256Gi".to_string(),
            taints: Vec::new(),
        }
    }

    /// Sets the node's GPUs.
    pub fn gpus(mut self, gpus: u64) -> Self {
        self.gpus = gpus;
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds a taint (`NoSchedule`/`NoExecute` ones repel pods that do not tolerate them).
    pub fn taint(
        mut self,
        key: impl Into<String>,
        value: impl Into<String>,
        effect: impl Into<String>,
    ) -> Self {
        self.taints.push((key.into(), value.into(), effect.into()));
        self
    }

    fn to_object(&self) -> Value {
        let mut labels: BTreeMap<String, String> = [
            ("kubernetes.io/hostname".to_string(), self.name.clone()),
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            ("kubernetes.io/arch".to_string(), "amd64".to_string()),
        ]
        .into();
        labels.extend(self.labels.clone());
        let mut resources = json!({"cpu": self.cpu, "memory": self.memory, "pods": "110", "ephemeral-storage": "1Ti"});
        if self.gpus > 0 {
            resources[pod::GPU] = json!(self.gpus.to_string());
        }
        let now = now_rfc3339();
        let taints: Vec<Value> = self
            .taints
            .iter()
            .map(|(k, v, e)| json!({"key": k, "value": v, "effect": e}))
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": {"taints": taints},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kubelet is posting ready status",
                                "lastHeartbeatTime": now, "lastTransitionTime": now}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.name}],
                "nodeInfo": {"kubeletVersion": "v1.37.0", "containerRuntimeVersion": "containerd://2.0.0",
                             "operatingSystem": "linux", "architecture": "amd64", "osImage": "iris-kube-testkit",
                             "kernelVersion": "6.0.0", "machineID": "", "systemUUID": "", "bootID": "", "kubeProxyVersion": ""},
            },
        })
    }
}

/// One request the server answered, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: String,
    /// URL path.
    pub path: String,
    /// The raw query string.
    pub query: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`,
    /// `discovery`, `health` or `unknown`.
    pub verb: String,
    /// API group (`""` for core).
    pub api_group: String,
    /// Plural, with the subresource if any (`pods/log`, `pods/status`).
    pub resource: Option<String>,
    /// Namespace in the path, if any.
    pub namespace: Option<String>,
    /// Object name in the path, if any.
    pub name: Option<String>,
    /// The request's `Content-Type`.
    pub content_type: Option<String>,
    /// HTTP status of the answer (200 for a watch that started streaming).
    pub status: u16,
}

/// Errors of the test controls and of starting the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listener could not be bound.
    #[error("binding 127.0.0.1:0 for the test API server")]
    Bind(#[source] std::io::Error),
    /// The work directory could not be created.
    #[error("creating the work directory {}", path.display())]
    WorkDir {
        /// The directory.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The fake API server refused, as it would answer over HTTP.
    #[error("{message} ({code} {reason})")]
    Api {
        /// HTTP status code.
        code: u16,
        /// `Status.reason` (`NotFound`, `AlreadyExists`, `TooManyRequests`, ...).
        reason: String,
        /// `Status.message`.
        message: String,
    },
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        Error::Api {
            code: e.code,
            reason: e.reason.to_string(),
            message: e.message,
        }
    }
}

/// A running fake API server. Dropping it stops the server and kills its processes.
pub struct TestApiServer {
    shared: Arc<Shared>,
    url: String,
    work_dir: PathBuf,
    server: Option<JoinHandle<()>>,
    sim: Option<JoinHandle<()>>,
    _temp: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for TestApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApiServer")
            .field("url", &self.url)
            .field("work_dir", &self.work_dir)
            .finish_non_exhaustive()
    }
}

fn seed(cl: &mut Cluster, opts: &ServerOptions) -> Result<(), Error> {
    let mut namespaces = vec![
        "default".to_string(),
        "kube-system".to_string(),
        "kube-public".to_string(),
    ];
    namespaces.extend(opts.namespaces.iter().cloned());
    namespaces.dedup();
    for ns in namespaces {
        if cl.store.get(id::NAMESPACES, "", &ns).is_none() {
            cl.store.insert(
                id::NAMESPACES,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                       "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
            );
        }
    }
    for (name, value) in [
        ("system-cluster-critical", 2_000_000_000i64),
        ("system-node-critical", 2_000_001_000),
    ] {
        cl.store.insert(
            id::PRIORITY_CLASSES,
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                   "value": value, "preemptionPolicy": "PreemptLowerPriority",
                   "description": "Used for system critical pods that must not be moved from their current node."}),
        );
    }
    for n in &opts.nodes {
        add_node(cl, n)?;
    }
    Ok(())
}

fn add_node(cl: &mut Cluster, node: &NodeSpec) -> Result<(), Error> {
    if cl.store.get(id::NODES, "", &node.name).is_some() {
        return Err(ApiError::already_exists(resources::def(id::NODES), &node.name).into());
    }
    cl.store.insert(id::NODES, node.to_object());
    Ok(())
}

impl TestApiServer {
    /// Binds `127.0.0.1:0`, seeds namespaces, system priority classes and nodes, and starts
    /// serving and simulating. Returns the handle and the base URL (`http://127.0.0.1:<port>`).
    pub async fn start(opts: ServerOptions) -> Result<(TestApiServer, String), Error> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(Error::Bind)?;
        let port = listener.local_addr().map_err(Error::Bind)?.port();
        let (work_dir, temp) = match &opts.work_dir {
            Some(p) => {
                std::fs::create_dir_all(p).map_err(|source| Error::WorkDir {
                    path: p.clone(),
                    source,
                })?;
                (p.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("iris-kube-testkit-")
                    .tempdir()
                    .map_err(|source| Error::WorkDir {
                        path: std::env::temp_dir(),
                        source,
                    })?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let settings = Settings {
            gpu_quota: opts.gpu_quota,
            bad_images: opts.bad_images.clone(),
            max_termination_grace: opts.max_termination_grace,
            kueue_pod_finalizer: opts.kueue_pod_finalizer,
            require_local_queue: opts.require_local_queue,
            run_init_containers: opts.run_init_containers,
            cluster_queue: opts.cluster_queue.clone(),
            resource_flavor: opts.resource_flavor.clone(),
            auto_create_namespaces: opts.auto_create_namespaces,
            work_dir: work_dir.clone(),
            bookmark_interval: opts.bookmark_interval.max(Duration::from_millis(10)),
            port,
        };
        let mut cluster = Cluster {
            store: Store::new(opts.history_limit),
            settings,
            kubelet: Default::default(),
            kueue: Default::default(),
            requests: Vec::new(),
            sim: Default::default(),
        };
        seed(&mut cluster, &opts)?;
        let shared = Arc::new(Shared::new(cluster));
        let app = http::router(shared.clone());
        let mut stop = shared.shutdown.subscribe();
        // Owned by the handle: stopped by `shutdown`/`Drop` through the shutdown signal.
        let server = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stop.changed().await;
            });
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "test API server stopped with an error");
            }
        });
        // Owned by the handle, like the server task.
        let sim = tokio::spawn(sim::run(
            shared.clone(),
            opts.tick.max(Duration::from_millis(1)),
        ));
        let url = format!("http://127.0.0.1:{port}");
        tracing::debug!(%url, work_dir = %work_dir.display(), "test API server started");
        Ok((
            TestApiServer {
                shared,
                url: url.clone(),
                work_dir,
                server: Some(server),
                sim: Some(sim),
                _temp: temp,
            },
            url,
        ))
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where pod directories live (`pods/<ns>_<name>_<uid8>/…`, `nodes/<node>/hostpath/…`).
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// A kubeconfig pointing at this server with `namespace` as the context's namespace.
    pub fn kubeconfig_yaml(&self, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: iris-kube-testkit\n  cluster:\n    server: {}\n\
             contexts:\n- name: iris-kube-testkit\n  context:\n    cluster: iris-kube-testkit\n    user: iris-kube-testkit\n    namespace: {namespace}\n\
             current-context: iris-kube-testkit\nusers:\n- name: iris-kube-testkit\n  user: {{}}\n",
            self.url
        )
    }

    /// Registers a Ready node (409 `AlreadyExists` if the name is taken).
    pub fn add_node(&self, node: NodeSpec) -> Result<(), Error> {
        let r = add_node(&mut self.shared.lock(), &node);
        self.shared.kick.notify_one();
        r
    }

    /// Deletes a node; the pod garbage collector then force-deletes the pods bound to it (with
    /// `DisruptionTarget=True` reason `DeletionByPodGC`) and their processes are killed.
    pub fn remove_node(&self, name: &str) -> Result<(), Error> {
        let r = apiserver::delete(
            &mut self.shared.lock(),
            id::NODES,
            "",
            name,
            &Default::default(),
        );
        self.shared.kick.notify_one();
        r.map(|_| ()).map_err(Error::from)
    }

    /// Sets Kueue's GPU quota (`None`: unlimited). Lowering it preempts nothing by itself.
    pub fn set_gpu_quota(&self, quota: Option<u64>) {
        let mut cl = self.shared.lock();
        cl.settings.gpu_quota = quota;
        cl.sim.dirty = true;
        drop(cl);
        self.shared.kick.notify_one();
    }

    /// Makes `image` fail to pull from now on.
    pub fn add_bad_image(&self, image: impl Into<String>) {
        let mut cl = self.shared.lock();
        cl.settings.bad_images.insert(image.into());
        cl.sim.dirty = true;
    }

    /// Node shutdown: `DisruptionTarget=True` reason `TerminationByKubelet` naming the node, the
    /// containers are stopped and the pod ends `Failed` (reason `Terminated`).
    pub fn disrupt(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.disrupt_with(namespace, pod, Disruption::NodeShutdown)
    }

    /// Kubelet node-pressure eviction: phase `Failed`, reason `Evicted` (with the
    /// `DisruptionTarget` condition Kubernetes adds).
    pub fn evict(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        self.disrupt_with(namespace, pod, Disruption::NodePressureEviction)
    }

    /// Disrupts a pod the way `how` says.
    pub fn disrupt_with(&self, namespace: &str, pod: &str, how: Disruption) -> Result<(), Error> {
        let r = kubelet::disrupt(&mut self.shared.lock(), namespace, pod, how);
        self.shared.kick.notify_one();
        Ok(r?)
    }

    /// Removes a pod at once (no grace, finalizers ignored) and kills its processes, as if its
    /// node vanished with it.
    pub fn vanish(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        let r = kubelet::vanish(&mut self.shared.lock(), namespace, pod);
        self.shared.kick.notify_one();
        Ok(r?)
    }

    /// The stored object (as served at its first version), if any. `api_version` is `v1` or
    /// `group/version`; `namespace` is `None` for cluster-scoped resources.
    pub fn get(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let res = resources::find(group, version, plural)?;
        let cl = self.shared.lock();
        cl.store
            .get(res, namespace.unwrap_or_default(), name)
            .map(|o| apiserver::render(res, version, o))
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// Forgets the requests recorded so far.
    pub fn clear_requests(&self) {
        self.shared.lock().requests.clear();
    }

    /// Simulation passes completed so far (idle ticks that skip the pass are not counted). A
    /// pass that ends after this count rose by two began after the call that read it, so tests
    /// can wait for the controllers to have seen a change, or to have had the chance to act.
    pub fn passes(&self) -> u64 {
        self.shared.lock().sim.passes
    }

    /// Container processes currently running.
    pub fn running_processes(&self) -> usize {
        self.shared.lock().kubelet.live_process_count()
    }

    fn stop_now(&mut self) {
        self.shared.shutdown.send_replace(true);
        for pgid in self.shared.lock().kubelet.all_pgids() {
            process::signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// Stops serving (open watches and log streams end), stops the simulation and kills every
    /// process the kubelet started.
    pub async fn shutdown(mut self) {
        self.stop_now();
        for task in [self.sim.take(), self.server.take()].into_iter().flatten() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        if self.server.is_some() || self.sim.is_some() {
            self.stop_now();
            for task in [self.sim.take(), self.server.take()].into_iter().flatten() {
                task.abort();
            }
        }
    }
}
