//! A process kubelet for a *real* API server (`scripts/k8s-testenv.sh`): the nodes there are
//! Node objects with no kubelet behind them, so this agent plays the kubelet for the pods that
//! kube-scheduler binds to them. It polls the namespace's pods; a bound pod that has not started
//! gets its init containers run one after another, then its containers, as local processes
//! (each mounted path rewritten to a directory of its own; Secret and ConfigMap volumes written
//! as files), its status patched to Running and, once every container exits, to Succeeded or
//! Failed (a failed init container fails the pod, as `Init:Error`);
//! a deleted pod has its processes killed and is then removed with grace 0, as a kubelet
//! confirms a deletion. Container logs go to files in the agent's work dir, and, when the agent
//! is given a [`KubeletEndpoint`], are served at the kubelet's `containerLogs` path, so the API
//! server's `pods/log` (and `kubectl logs`) read them as they would from a kubelet.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, ServiceAccount, Volume};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::host::{now_rfc3339, rewrite_paths};
use crate::node_logs::{KubeletEndpoint, LogIndex, PodLogs};

/// One container's end.
#[derive(Debug, Clone)]
pub(crate) struct Ended {
    code: i32,
    at: String,
}

struct Run {
    root: PathBuf,
    started_at: String,
    /// Container name → process group id.
    pgids: Vec<(String, i32)>,
    images: HashMap<String, String>,
    ended: Arc<Mutex<HashMap<String, Ended>>>,
    reported_final: bool,
}

/// A pod whose init containers are running: one at a time, in order.
struct Init {
    root: PathBuf,
    started_at: String,
    /// The init container running now and its process group.
    running: Option<(String, i32)>,
    /// Index of the next init container to start.
    next: usize,
    ended: Arc<Mutex<HashMap<String, Ended>>>,
}

/// Where a pod's init containers stand after [`advance_init`].
enum InitStep {
    /// One is still running.
    Running,
    /// Every one exited 0: the containers may start.
    Done,
    /// One failed: the pod fails with this status.
    Failed(Value),
}

/// A pod the agent started: its name and the node kube-scheduler bound it to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RanPod {
    /// Pod name.
    pub name: String,
    /// `spec.nodeName`.
    pub node: String,
}

/// How the agent runs the containers of the pods kube-scheduler binds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// Each container's command as a local process.
    #[default]
    Process,
    /// No process: each container "runs" this long and exits 0 (for scale benchmarks).
    Simulate(Duration),
}

/// What [`NodeAgent::start`] serves and how it runs pods.
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    /// Serve container logs on the nodes' kubelet port.
    pub kubelet: Option<KubeletEndpoint>,
    /// Processes or simulated containers.
    pub mode: Mode,
    /// Directories put first on the containers' `PATH`: where the images' programs are (a
    /// test's `iris` binary, for the controller's Deployment).
    pub bin_dirs: Vec<PathBuf>,
}

/// What every container the agent starts shares: its work dir (pod roots, hostPath and claim
/// directories), the programs on its `PATH` and the API server it reaches in-cluster.
pub(crate) struct Host {
    dir: PathBuf,
    path: String,
    /// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`, as a kubelet sets them.
    api: (String, String),
}

/// The running agent; [`NodeAgent::shutdown`] (or drop) stops it and kills what it started.
pub struct NodeAgent {
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
    ran: Arc<Mutex<Vec<RanPod>>>,
}

impl NodeAgent {
    /// Starts the agent for the pods of `namespace`, with the client from `kubeconfig`; with
    /// `opts.kubelet`, it also serves the pods' container logs there.
    pub async fn start(
        kubeconfig: &Path,
        namespace: &str,
        work_dir: PathBuf,
        opts: AgentOptions,
    ) -> Result<Self, kube::Error> {
        let AgentOptions {
            kubelet,
            mode,
            bin_dirs,
        } = opts;
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)
            .map_err(|e| kube::Error::Service(e.to_string().into()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| kube::Error::Service(e.to_string().into()))?;
        let api_url = config.cluster_url.clone();
        let client = kube::Client::try_from(config)?;
        let base_path =
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        let path = bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .chain([base_path])
            .collect::<Vec<_>>()
            .join(":");
        let host = Host {
            dir: work_dir,
            path,
            api: (
                api_url.host().unwrap_or("127.0.0.1").to_string(),
                api_url.port_u16().unwrap_or(443).to_string(),
            ),
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let service_accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let config_maps: Api<ConfigMap> = Api::namespaced(client, namespace);
        let (stop, mut stopped) = watch::channel(false);
        let index: LogIndex = Arc::default();
        let server = match &kubelet {
            Some(ep) => Some(
                crate::node_logs::serve(ep, namespace.to_string(), index.clone(), stop.subscribe())
                    .await
                    .map_err(|e| {
                        kube::Error::Service(
                            format!("kubelet endpoint on 127.0.0.1:{}: {e}", ep.port).into(),
                        )
                    })?,
            ),
            None => None,
        };
        let ran = Arc::new(Mutex::new(Vec::new()));
        let ran2 = ran.clone();
        let task = tokio::spawn(async move {
            let mut runs: HashMap<String, Run> = HashMap::new();
            let mut inits: HashMap<String, Init> = HashMap::new();
            loop {
                let apis = (&pods, &secrets, &config_maps, &service_accounts);
                let state = (&mut runs, &mut inits);
                if let Err(e) = pass(apis, &host, mode, state, &ran2, &index).await {
                    tracing::warn!(error = %e, "node agent pass");
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stopped.changed() => break,
                }
            }
            for run in runs.values() {
                kill(run);
            }
            for init in inits.values() {
                kill_init(init);
            }
            if let Some(server) = server {
                let _ = server.await;
            }
        });
        Ok(Self {
            stop,
            task: Some(task),
            ran,
        })
    }

    /// The pods started so far.
    pub fn ran(&self) -> Vec<RanPod> {
        self.ran.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Stops polling and kills every process the agent started.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn kill_init(init: &Init) {
    if let Some((_, pgid)) = init.running.as_ref().filter(|(_, p)| *p > 0) {
        crate::host::signal_group(*pgid, nix::sys::signal::Signal::SIGKILL);
    }
}

fn kill(run: &Run) {
    // A container that never started (or a simulated one) has no process group: 0, which must
    // never reach killpg (it would signal the agent's own group).
    for (_, pgid) in run.pgids.iter().filter(|(_, p)| *p > 0) {
        crate::host::signal_group(*pgid, nix::sys::signal::Signal::SIGKILL);
    }
}

/// What one pass asks of the API server, sent together once the pass has looked at every pod.
enum Call {
    Status { name: String, body: Value },
    Delete { name: String, uid: String },
}

/// How many of a pass's API calls are in flight at once.
const CONCURRENT_CALLS: usize = 32;

async fn send(pods: &Api<Pod>, call: Call) -> Result<(), kube::Error> {
    match call {
        Call::Status { name, body } => pods
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(body))
            .await
            .map(|_| ()),
        Call::Delete { name, uid } => {
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(kube::api::Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            // Already gone, or waiting on a finalizer: the next pass sees it again.
            let _ = pods.delete(&name, &dp).await;
            Ok(())
        }
    }
}

async fn pass(
    (pods, secrets, config_maps, sas): (
        &Api<Pod>,
        &Api<Secret>,
        &Api<ConfigMap>,
        &Api<ServiceAccount>,
    ),
    host: &Host,
    mode: Mode,
    (runs, inits): (&mut HashMap<String, Run>, &mut HashMap<String, Init>),
    ran: &Mutex<Vec<RanPod>>,
    index: &LogIndex,
) -> Result<(), kube::Error> {
    let work_dir = host.dir.as_path();
    let list = pods.list(&ListParams::default()).await?;
    let mut seen = HashSet::new();
    let mut names = HashSet::new();
    let mut calls = Vec::new();
    for pod in list.items {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if node.is_empty() || uid.is_empty() {
            continue;
        }
        seen.insert(uid.clone());
        names.insert(name.clone());
        if pod.metadata.deletion_timestamp.is_some() {
            if let Some(init) = inits.remove(&uid) {
                kill_init(&init);
            }
            if let Some(run) = runs.remove(&uid) {
                kill(&run);
                // As a kubelet does, a deleted pod that was running ends in a terminal phase
                // (its containers killed) before the deletion is confirmed.
                if !run.reported_final {
                    let mut ended = run.ended.lock().map(|e| e.clone()).unwrap_or_default();
                    for (c, _) in &run.pgids {
                        ended.entry(c.clone()).or_insert(Ended {
                            code: 137,
                            at: now_rfc3339(),
                        });
                    }
                    let body = finished(&pod, &run, &ended);
                    calls.push(Call::Status {
                        name: name.clone(),
                        body,
                    });
                }
            }
            calls.push(Call::Delete { name, uid });
            continue;
        }
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let pending = phase.is_empty() || phase == "Pending";
        match runs.get_mut(&uid) {
            None if pending && unpullable(&pod).is_some() => {
                // As a kubelet whose pull failed: the pod stays Pending with the container
                // waiting in ImagePullBackOff, and nothing runs.
                let image = unpullable(&pod).unwrap_or_default();
                calls.push(Call::Status {
                    name,
                    body: pull_failed(&pod, &image),
                });
                runs.insert(uid, Run::settled(work_dir.to_path_buf()));
            }
            None if pending => {
                // As a kubelet, a pod whose Secret or ConfigMap volume does not exist yet waits
                // for it.
                if matches!(mode, Mode::Process)
                    && !inits.contains_key(&uid)
                    && !stage_volumes((secrets, config_maps, sas), &pod, work_dir).await
                {
                    continue;
                }
                if matches!(mode, Mode::Process) {
                    match advance_init(&pod, host, inits.entry(uid.clone())) {
                        InitStep::Running => continue,
                        InitStep::Failed(body) => {
                            inits.remove(&uid);
                            calls.push(Call::Status { name, body });
                            runs.insert(uid, Run::settled(pod_root(&pod, work_dir)));
                            continue;
                        }
                        InitStep::Done => {
                            inits.remove(&uid);
                        }
                    }
                }
                let run = match mode {
                    Mode::Process => start_pod(&pod, host),
                    Mode::Simulate(run_for) => simulate_pod(&pod, work_dir, run_for),
                };
                calls.push(Call::Status {
                    name: name.clone(),
                    body: running(&pod, &run),
                });
                if let Ok(mut logs) = index.lock() {
                    logs.insert(
                        name.clone(),
                        PodLogs {
                            root: run.root.clone(),
                            ended: run.ended.clone(),
                        },
                    );
                }
                if let Ok(mut r) = ran.lock() {
                    r.push(RanPod { name, node });
                }
                runs.insert(uid, run);
            }
            // A Running report that did not get through is sent again.
            Some(run) if pending && !run.reported_final => calls.push(Call::Status {
                name,
                body: running(&pod, run),
            }),
            Some(run) if !run.reported_final => {
                let ended = run.ended.lock().map(|e| e.clone()).unwrap_or_default();
                if ended.len() == run.pgids.len() {
                    calls.push(Call::Status {
                        name,
                        body: finished(&pod, run, &ended),
                    });
                    run.reported_final = true;
                }
            }
            _ => {}
        }
    }
    runs.retain(|uid, run| {
        let keep = seen.contains(uid);
        if !keep {
            kill(run);
        }
        keep
    });
    inits.retain(|uid, init| {
        let keep = seen.contains(uid);
        if !keep {
            kill_init(init);
        }
        keep
    });
    // A kubelet serves a pod's logs until the pod is gone.
    if let Ok(mut logs) = index.lock() {
        logs.retain(|name, _| names.contains(name));
    }
    // A final report that fails is lost with this pass; the pod's next deletion or the test's
    // timeout shows it. The first error is returned (and logged by the caller).
    // As a kubelet does, a pod's terminal status is written before its deletion is confirmed:
    // statuses go first, deletions after, so no watcher sees a pod vanish with its last state
    // unwritten.
    let (statuses, deletions): (Vec<Call>, Vec<Call>) = calls
        .into_iter()
        .partition(|c| matches!(c, Call::Status { .. }));
    let mut results: Vec<Result<(), kube::Error>> = Vec::new();
    for batch in [statuses, deletions] {
        let sent: Vec<Result<(), kube::Error>> = futures::stream::iter(batch)
            .map(|c| send(pods, c))
            .buffer_unordered(CONCURRENT_CALLS)
            .collect()
            .await;
        results.extend(sent);
    }
    results.into_iter().collect()
}

/// A pod whose containers are not run: each "runs" for `run_for`, then exits 0, with an empty
/// log (kwok-style nodes, for scale benchmarks).
fn simulate_pod(pod: &Pod, work_dir: &Path, run_for: Duration) -> Run {
    let root = pod_root(pod, work_dir);
    let ended: Arc<Mutex<HashMap<String, Ended>>> = Arc::default();
    let mut pgids = Vec::new();
    let mut images = HashMap::new();
    let _ = std::fs::create_dir_all(&root);
    for c in pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
    {
        images.insert(c.name.clone(), c.image.clone().unwrap_or_default());
        let _ = std::fs::File::create(root.join(format!("{}.log", c.name)));
        // No process: 0 is never signalled (see `kill`).
        pgids.push((c.name.clone(), 0));
        let ended = ended.clone();
        let name = c.name.clone();
        tokio::spawn(async move {
            tokio::time::sleep(run_for).await;
            record_end(&ended, name, 0);
        });
    }
    Run::started(root, pgids, images, ended)
}

/// Records that container `name` exited with `code`, now.
fn record_end(ended: &Mutex<HashMap<String, Ended>>, name: String, code: i32) {
    if let Ok(mut m) = ended.lock() {
        m.insert(
            name,
            Ended {
                code,
                at: now_rfc3339(),
            },
        );
    }
}

impl Run {
    /// A pod that runs nothing and whose final status is already sent (its image could not be
    /// pulled, or an init container failed): kept so later passes leave it alone.
    fn settled(root: PathBuf) -> Run {
        Run {
            root,
            started_at: now_rfc3339(),
            pgids: Vec::new(),
            images: HashMap::new(),
            ended: Arc::default(),
            reported_final: true,
        }
    }

    /// A pod whose containers were just started (or simulated).
    fn started(
        root: PathBuf,
        pgids: Vec<(String, i32)>,
        images: HashMap<String, String>,
        ended: Arc<Mutex<HashMap<String, Ended>>>,
    ) -> Run {
        Run {
            root,
            started_at: now_rfc3339(),
            pgids,
            images,
            ended,
            reported_final: false,
        }
    }
}

/// The directory a pod's volumes and root filesystem live under.
fn pod_root(pod: &Pod, work_dir: &Path) -> PathBuf {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let short: String = uid.chars().take(8).collect();
    work_dir.join(format!(
        "{}_{short}",
        pod.metadata.name.clone().unwrap_or_default()
    ))
}

/// Files of one volume: relative path → contents, and their mode.
type VolumeFiles = (Vec<(String, Vec<u8>)>, u32);

/// A Secret's or ConfigMap's keys (`None` while it does not exist or cannot be read).
async fn secret_keys(secrets: &Api<Secret>, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    let secret = secrets.get_opt(name).await.ok()??;
    let data = secret.data.unwrap_or_default();
    Some(data.into_iter().map(|(k, v)| (k, v.0)).collect())
}

async fn config_map_keys(cms: &Api<ConfigMap>, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    let cm = cms.get_opt(name).await.ok()??;
    let mut files: BTreeMap<String, Vec<u8>> = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    files.extend(
        cm.binary_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0)),
    );
    Some(files)
}

/// With `items`, only the listed keys, each at its own path; without, every key.
fn pick(
    files: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>,
) -> Vec<(String, Vec<u8>)> {
    match items {
        Some(items) => items
            .iter()
            .filter_map(|i| Some((i.path.clone(), files.get(&i.key)?.clone())))
            .collect(),
        None => files.into_iter().collect(),
    }
}

/// The files a Secret, ConfigMap or projected volume holds (a projected service account token
/// is asked of the API server for this pod, as a kubelet asks for it); `Some(None)` for other
/// kinds of volume, `None` while a source is missing.
async fn volume_files(
    (secrets, config_maps, sas): (&Api<Secret>, &Api<ConfigMap>, &Api<ServiceAccount>),
    pod: &Pod,
    v: &Volume,
) -> Option<Option<VolumeFiles>> {
    if let Some(source) = &v.secret {
        let name = source.secret_name.as_deref()?;
        let files = secret_keys(secrets, name).await?;
        let mode = source.default_mode.unwrap_or(0o644) as u32;
        return Some(Some((pick(files, source.items.as_ref()), mode)));
    }
    if let Some(source) = &v.config_map {
        let files = config_map_keys(config_maps, &source.name).await?;
        let mode = source.default_mode.unwrap_or(0o644) as u32;
        return Some(Some((pick(files, source.items.as_ref()), mode)));
    }
    let Some(projected) = &v.projected else {
        return Some(None);
    };
    let mut out = Vec::new();
    for src in projected.sources.clone().unwrap_or_default() {
        if let Some(s) = &src.secret {
            out.extend(pick(secret_keys(secrets, &s.name).await?, s.items.as_ref()));
        }
        if let Some(cm) = &src.config_map {
            out.extend(pick(
                config_map_keys(config_maps, &cm.name).await?,
                cm.items.as_ref(),
            ));
        }
        if let Some(d) = &src.downward_api {
            for item in d.items.clone().unwrap_or_default() {
                let path = item.field_ref.as_ref().map(|f| f.field_path.as_str());
                out.push((item.path.clone(), field_ref(pod, path).into_bytes()));
            }
        }
        if let Some(t) = &src.service_account_token {
            let sa = pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".into());
            let request = TokenRequest {
                spec: Some(TokenRequestSpec {
                    audiences: Some(t.audience.clone().into_iter().collect()),
                    expiration_seconds: t.expiration_seconds,
                    bound_object_ref: Some(BoundObjectReference {
                        kind: Some("Pod".into()),
                        api_version: Some("v1".into()),
                        name: pod.metadata.name.clone(),
                        uid: pod.metadata.uid.clone(),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let token = sas
                .create_token_request(&sa, &PostParams::default(), &request)
                .await
                .ok()?;
            let token = token.status?.token?;
            out.push((t.path.clone(), token.into_bytes()));
        }
    }
    let mode = projected.default_mode.unwrap_or(0o644) as u32;
    Some(Some((out, mode)))
}

/// Writes each Secret, ConfigMap and projected volume of `pod` as files into the directory its
/// mounts map to, and each container's environment taken from Secrets and ConfigMaps (`envFrom`,
/// `secretKeyRef`, `configMapKeyRef`) to `<root>/env/<container>`. False while a source is
/// missing or unreadable, as a kubelet waits for it.
async fn stage_volumes(
    apis: (&Api<Secret>, &Api<ConfigMap>, &Api<ServiceAccount>),
    pod: &Pod,
    work_dir: &Path,
) -> bool {
    let spec = pod.spec.clone().unwrap_or_default();
    for v in spec.volumes.clone().unwrap_or_default() {
        let Some(found) = volume_files(apis, pod, &v).await else {
            return false;
        };
        let Some((placed, mode)) = found else {
            continue;
        };
        let dir = pod_root(pod, work_dir).join("volumes").join(&v.name);
        if std::fs::create_dir_all(&dir).is_err() {
            return false;
        }
        for (rel, value) in placed {
            if rel.split('/').any(|p| p == "..") {
                return false;
            }
            let path = dir.join(&rel);
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let _ = std::fs::remove_file(&path);
            if std::fs::write(&path, &value).is_err() {
                return false;
            }
            let perm = std::os::unix::fs::PermissionsExt::from_mode(mode);
            let _ = std::fs::set_permissions(&path, perm);
        }
    }
    let containers = spec
        .init_containers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .chain(spec.containers.clone());
    for c in containers {
        let Some(env) = container_env(apis, &c).await else {
            return false;
        };
        let dir = pod_root(pod, work_dir).join("env");
        let Ok(body) = serde_json::to_vec(&env) else {
            return false;
        };
        if std::fs::create_dir_all(&dir).is_err()
            || std::fs::write(dir.join(&c.name), body).is_err()
        {
            return false;
        }
    }
    true
}

/// A container's variables from Secrets and ConfigMaps; `None` while a required source is
/// missing (an `optional` one that is missing contributes nothing).
async fn container_env(
    (secrets, config_maps, _): (&Api<Secret>, &Api<ConfigMap>, &Api<ServiceAccount>),
    c: &Container,
) -> Option<BTreeMap<String, String>> {
    let text = |b: &Vec<u8>| String::from_utf8_lossy(b).into_owned();
    let mut env = BTreeMap::new();
    for from in c.env_from.clone().unwrap_or_default() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (keys, optional) = if let Some(s) = &from.secret_ref {
            (
                secret_keys(secrets, &s.name).await,
                s.optional == Some(true),
            )
        } else if let Some(cm) = &from.config_map_ref {
            (
                config_map_keys(config_maps, &cm.name).await,
                cm.optional == Some(true),
            )
        } else {
            continue;
        };
        match keys {
            Some(keys) => {
                for (k, v) in keys {
                    env.insert(format!("{prefix}{k}"), text(&v));
                }
            }
            None if optional => {}
            None => return None,
        }
    }
    for e in c.env.clone().unwrap_or_default() {
        let Some(from) = &e.value_from else { continue };
        let (value, optional) = if let Some(s) = &from.secret_key_ref {
            let keys = secret_keys(secrets, &s.name).await;
            (
                keys.and_then(|k| k.get(&s.key).map(text)),
                s.optional == Some(true),
            )
        } else if let Some(cm) = &from.config_map_key_ref {
            let keys = config_map_keys(config_maps, &cm.name).await;
            (
                keys.and_then(|k| k.get(&cm.key).map(text)),
                cm.optional == Some(true),
            )
        } else {
            continue;
        };
        match value {
            Some(v) => {
                env.insert(e.name.clone(), v);
            }
            None if optional => {}
            None => return None,
        }
    }
    Some(env)
}

/// Starts the pod's next init container, or reports how they went: each runs to its end before
/// the next starts, as a kubelet runs them.
fn advance_init(
    pod: &Pod,
    host: &Host,
    entry: std::collections::hash_map::Entry<'_, String, Init>,
) -> InitStep {
    let containers = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.clone())
        .unwrap_or_default();
    if containers.is_empty() {
        return InitStep::Done;
    }
    let init = entry.or_insert_with(|| Init {
        root: pod_root(pod, &host.dir),
        started_at: now_rfc3339(),
        running: None,
        next: 0,
        ended: Arc::default(),
    });
    if let Some((name, _)) = &init.running {
        let end = init.ended.lock().ok().and_then(|e| e.get(name).cloned());
        match end {
            None => return InitStep::Running,
            Some(e) if e.code != 0 => return InitStep::Failed(init_failed(pod, init, name, &e)),
            Some(_) => {
                init.running = None;
                init.next += 1;
            }
        }
    }
    let Some(c) = containers.get(init.next) else {
        return InitStep::Done;
    };
    let pgid = match spawn(pod, c, &init.root, init.ended.clone(), host) {
        Ok(pgid) => pgid,
        Err(e) => {
            tracing::warn!(container = %c.name, error = %e, "node agent: init container did not start");
            record_end(&init.ended, c.name.clone(), 128);
            0
        }
    };
    init.running = Some((c.name.clone(), pgid));
    InitStep::Running
}

/// The status of a pod whose init container `name` failed: phase Failed, the init container
/// terminated with its code and (as `FallbackToLogsOnError` makes a kubelet do) the end of its
/// log as the message.
fn init_failed(pod: &Pod, init: &Init, name: &str, end: &Ended) -> Value {
    let log = std::fs::read_to_string(init.root.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    let tail: String = tail
        .chars()
        .rev()
        .take(2048)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let waiting = waiting_statuses(pod, json!({"reason": "PodInitializing"}));
    json!({"status": {
        "phase": "Failed",
        "hostIP": "127.0.0.1",
        "startTime": init.started_at,
        "conditions": conditions(pod, "False", Some("PodFailed")),
        "initContainerStatuses": [{
            "name": name,
            "image": "",
            "imageID": "",
            "ready": false,
            "restartCount": 0,
            "state": {"terminated": {
                "exitCode": end.code,
                "reason": "Error",
                "message": tail.trim_end(),
                "startedAt": init.started_at,
                "finishedAt": end.at,
            }},
        }],
        "containerStatuses": waiting,
    }})
}

/// Starts every container of the pod; one that cannot start ends at once with code 128.
fn start_pod(pod: &Pod, host: &Host) -> Run {
    let root = pod_root(pod, &host.dir);
    let ended = Arc::new(Mutex::new(HashMap::new()));
    let mut pgids = Vec::new();
    let mut images = HashMap::new();
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    for c in &containers {
        images.insert(c.name.clone(), c.image.clone().unwrap_or_default());
        match spawn(pod, c, &root, ended.clone(), host) {
            Ok(pgid) => pgids.push((c.name.clone(), pgid)),
            Err(e) => {
                tracing::warn!(container = %c.name, error = %e, "node agent: container did not start");
                pgids.push((c.name.clone(), 0));
                record_end(&ended, c.name.clone(), 128);
            }
        }
    }
    Run::started(root, pgids, images, ended)
}

/// Paths programs read at a fixed place whatever the pod says (the in-cluster client's service
/// account files): mounted there for real, in a mount namespace of the container's own,
/// instead of being rewritten into the command line.
const FIXED_MOUNTS: [&str; 2] = ["/var/run/secrets/", "/run/secrets/"];

/// Where a volume's files live on this host: a hostPath or a claim is one directory shared by
/// every pod that mounts it (a replaced controller finds its state); anything else is the pod's.
fn volume_dir(pod: &Pod, root: &Path, host: &Host, name: &str) -> PathBuf {
    let volume: Option<&Volume> = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|vs| vs.iter().find(|v| v.name == name));
    match volume {
        Some(v) if v.host_path.is_some() => {
            let path = v.host_path.as_ref().map(|h| h.path.as_str()).unwrap_or("");
            host.dir.join("hostpath").join(path.trim_start_matches('/'))
        }
        Some(v) if v.persistent_volume_claim.is_some() => {
            let claim = v
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str())
                .unwrap_or("");
            host.dir.join("claims").join(claim)
        }
        _ => root.join("volumes").join(name),
    }
}

/// Single-quotes `s` for `sh`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn spawn(
    pod: &Pod,
    c: &Container,
    root: &Path,
    ended: Arc<Mutex<HashMap<String, Ended>>>,
    host: &Host,
) -> std::io::Result<i32> {
    // Each mount point (and the working directory) becomes a directory under the pod's root,
    // except the fixed ones, which are mounted in place.
    let mut map: Vec<(String, String)> = Vec::new();
    let mut fixed: Vec<(String, PathBuf)> = Vec::new();
    for m in c.volume_mounts.clone().unwrap_or_default() {
        let local = volume_dir(pod, root, host, &m.name);
        std::fs::create_dir_all(&local)?;
        let at = m.mount_path.trim_end_matches('/').to_string();
        if FIXED_MOUNTS.iter().any(|f| m.mount_path.starts_with(f)) {
            fixed.push((at, local));
        } else {
            map.push((at, local.to_string_lossy().into_owned()));
        }
    }
    let workdir = c.working_dir.clone().unwrap_or_default();
    let wd = workdir.trim_end_matches('/').to_string();
    if !wd.is_empty() && !map.iter().any(|(from, _)| *from == wd) {
        let local = root.join("rootfs").join(wd.trim_start_matches('/'));
        map.push((wd.clone(), local.to_string_lossy().into_owned()));
    }
    map.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    let cwd = if wd.is_empty() {
        root.join("rootfs")
    } else {
        PathBuf::from(rewrite_paths(&wd, &map))
    };
    let home = root.join("home");
    std::fs::create_dir_all(&cwd)?;
    std::fs::create_dir_all(&home)?;
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), host.path.clone()),
        ("HOME".into(), home.to_string_lossy().into_owned()),
        (
            "HOSTNAME".into(),
            pod.metadata.name.clone().unwrap_or_default(),
        ),
        ("KUBERNETES_SERVICE_HOST".into(), host.api.0.clone()),
        ("KUBERNETES_SERVICE_PORT".into(), host.api.1.clone()),
    ];
    // Values from Secrets and ConfigMaps were read when the pod's volumes were staged.
    let staged: HashMap<String, String> = std::fs::read(root.join("env").join(&c.name))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let mut staged_sorted: Vec<(String, String)> = staged.into_iter().collect();
    staged_sorted.sort();
    env.extend(staged_sorted);
    for e in c.env.clone().unwrap_or_default() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => rewrite_paths(v, &map),
            (None, Some(from)) if from.field_ref.is_some() => {
                field_ref(pod, from.field_ref.as_ref().map(|f| f.field_path.as_str()))
            }
            // Staged above (Secret and ConfigMap keys).
            (None, Some(_)) => continue,
            (None, None) => String::new(),
        };
        env.retain(|(k, _)| *k != e.name);
        env.push((e.name.clone(), value));
    }
    // The agent's pods share the host's network: a container listening on every interface
    // listens on loopback instead (tests bind nothing else).
    let argv: Vec<String> = c
        .command
        .clone()
        .unwrap_or_default()
        .into_iter()
        .chain(c.args.clone().unwrap_or_default())
        .map(|a| rewrite_paths(&a, &map).replace("0.0.0.0", "127.0.0.1"))
        .collect();
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("no command (images' entrypoints are not run)"))?;
    let (program, args): (String, Vec<String>) = if fixed.is_empty() {
        (program.clone(), args.to_vec())
    } else {
        // A private mount namespace with a fresh /run (where /var/run points), the fixed mounts
        // bound into it, then the container's command in place of the shell.
        let mut script = String::from("set -e; mount -t tmpfs iris-run /run");
        for (at, local) in &fixed {
            let at = sh_quote(at);
            script.push_str(&format!(
                "; mkdir -p {at}; mount --bind {} {at}",
                sh_quote(&local.to_string_lossy())
            ));
        }
        script.push_str("; exec \"$@\"");
        let mut wrapped: Vec<String> =
            ["--mount", "--propagation", "private", "--", "/bin/sh", "-c"]
                .map(String::from)
                .to_vec();
        wrapped.push(script);
        wrapped.push("sh".into());
        wrapped.push(program.clone());
        wrapped.extend(args.iter().cloned());
        ("unshare".into(), wrapped)
    };
    let log = std::fs::File::create(root.join(format!("{}.log", c.name)))?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .envs(env)
        .current_dir(&cwd)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let pgid = child
        .id()
        .map(|p| p as i32)
        .ok_or_else(|| std::io::Error::other("process exited before it was observed"))?;
    let name = c.name.clone();
    tokio::spawn(async move {
        let status = child.wait().await;
        crate::host::signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
        let code = status.map(crate::host::exit_code).unwrap_or(128);
        record_end(&ended, name, code);
    });
    Ok(pgid)
}

/// The first container image the agent cannot "pull": one whose registry host is under a
/// reserved test domain (`.example`, `.invalid`, RFC 2606). The agent runs every other image's
/// command directly, with no pull at all.
fn unpullable(pod: &Pod) -> Option<String> {
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice())?;
    containers.iter().find_map(|c| {
        let image = c.image.clone()?;
        let host = image.split('/').next().unwrap_or_default();
        let host = host.split(':').next().unwrap_or_default();
        (image.contains('/') && (host.ends_with(".example") || host.ends_with(".invalid")))
            .then_some(image)
    })
}

/// Every container of `pod` waiting with `waiting` (its `reason` and, if any, `message`).
fn waiting_statuses(pod: &Pod, waiting: Value) -> Vec<Value> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": "",
                "ready": false,
                "started": false,
                "restartCount": 0,
                "state": {"waiting": waiting},
            })
        })
        .collect()
}

fn pull_failed(pod: &Pod, image: &str) -> Value {
    let statuses = waiting_statuses(
        pod,
        json!({
            "reason": "ImagePullBackOff",
            "message": format!("Back-off pulling image \"{image}\""),
        }),
    );
    json!({"status": {
        "phase": "Pending",
        "hostIP": "127.0.0.1",
        "conditions": conditions(pod, "False", Some("ContainersNotReady")),
        "containerStatuses": statuses,
    }})
}

fn field_ref(pod: &Pod, path: Option<&str>) -> String {
    match path.unwrap_or_default() {
        "metadata.name" => pod.metadata.name.clone().unwrap_or_default(),
        "metadata.namespace" => pod.metadata.namespace.clone().unwrap_or_default(),
        "metadata.uid" => pod.metadata.uid.clone().unwrap_or_default(),
        "spec.nodeName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.hostIP" => "127.0.0.1".into(),
        _ => String::new(),
    }
}

/// The pod's conditions with the four a kubelet owns set; the others (Kueue's, the disruption
/// controller's) kept, since a merge patch replaces the whole list.
fn conditions(pod: &Pod, ready: &str, reason: Option<&str>) -> Value {
    const OWN: [&str; 4] = ["PodScheduled", "Initialized", "ContainersReady", "Ready"];
    let kept: Vec<Value> = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !OWN.contains(&c.type_.as_str()))
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    let now = now_rfc3339();
    let cond = |t: &str, s: &str| {
        let mut c = json!({"type": t, "status": s, "lastTransitionTime": now});
        if let (Some(r), "False") = (reason, s) {
            c["reason"] = json!(r);
        }
        c
    };
    let mut all = vec![
        cond("PodScheduled", "True"),
        cond("Initialized", "True"),
        cond("ContainersReady", ready),
        cond("Ready", ready),
    ];
    all.extend(kept);
    Value::Array(all)
}

fn running(pod: &Pod, run: &Run) -> Value {
    let statuses: Vec<Value> = run
        .pgids
        .iter()
        .map(|(name, pgid)| {
            json!({
                "name": name,
                "image": run.images.get(name).cloned().unwrap_or_default(),
                "imageID": "",
                "containerID": format!("process://{pgid}"),
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": run.started_at}},
            })
        })
        .collect();
    json!({"status": {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": run.started_at,
        "conditions": conditions(pod, "True", None),
        "containerStatuses": statuses,
    }})
}

fn finished(pod: &Pod, run: &Run, ended: &HashMap<String, Ended>) -> Value {
    let ok = ended.values().all(|e| e.code == 0);
    let statuses: Vec<Value> = run
        .pgids
        .iter()
        .map(|(name, pgid)| {
            let e = ended.get(name).cloned().unwrap_or(Ended {
                code: 128,
                at: now_rfc3339(),
            });
            json!({
                "name": name,
                "image": run.images.get(name).cloned().unwrap_or_default(),
                "imageID": "",
                "containerID": format!("process://{pgid}"),
                "ready": false,
                "started": false,
                "restartCount": 0,
                "state": {"terminated": {
                    "exitCode": e.code,
                    "reason": if e.code == 0 { "Completed" } else { "Error" },
                    "startedAt": run.started_at,
                    "finishedAt": e.at,
                    "containerID": format!("process://{pgid}"),
                }},
            })
        })
        .collect();
    json!({"status": {
        "phase": if ok { "Succeeded" } else { "Failed" },
        "conditions": conditions(pod, "False", Some("PodCompleted")),
        "containerStatuses": statuses,
    }})
}
