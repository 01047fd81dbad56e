//! The controller on Kubernetes: `iris cluster start | stop` and `cluster controller restart`
//! for a config whose controller is `coreweave` (reference federation-k8s §5; the objects are
//! built in `iris_kube_model::controller`).
//!
//! `start` checks the admin-owned objects (namespace, ServiceAccount and RBAC, the ClusterQueue
//! and its flavors) without creating them, applies the cluster's own ones with the operator's
//! credentials (config ConfigMap, priority classes, LocalQueue, state claim), replaces the
//! controller Deployment (delete, wait for its pod to go, apply: one controller owns the state
//! at a time), waits for it to become available and checks `/health` through the same
//! `kubectl port-forward` every later command uses. `restart` checkpoints the running
//! controller first and, when the new image does not come up healthy, rolls back by itself:
//! the previous image (read from the live Deployment) is deployed again and restores that
//! checkpoint on boot.

use crate::config;
use anyhow::{bail, Context};
use iris_controller::checkpoint::{RemoteStore, RolloutPhase, RolloutRecord, STATE_DIR};
use iris_kube_model::controller::{self as kc, ControllerDeploy, Rollout, StateVolume};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use kube::api::{Patch, PatchParams};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

const FIELD_MANAGER: &str = "iris";
/// How long a replaced controller's pod may take to go.
const DELETE_WAIT: Duration = Duration::from_secs(120);
/// How long a new controller Deployment may take to become available (a node may have to be
/// provisioned for it; a bad image or a crashing container fails at once instead).
pub const AVAILABLE_WAIT: Duration = Duration::from_secs(1200);
/// How long the tunnel's `/health` check may take once the Deployment is available.
const HEALTH_WAIT: Duration = Duration::from_secs(120);

/// Options shared by start and restart.
#[derive(Debug, Clone)]
pub struct DeployOpts {
    pub fresh: bool,
    /// How long the Deployment may take to become available.
    pub timeout: Duration,
}

/// What a coreweave config says about where the controller runs.
pub struct Target {
    pub deploy: ControllerDeploy,
    pub cluster_queue: String,
    pub remote_state_dir: Option<String>,
    kubeconfig: Option<String>,
    context: Option<String>,
    pf: crate::tunnel::PortForward,
}

/// True when the config's controller runs in a Kubernetes cluster (`controller.coreweave`).
pub fn is_kubernetes(cfg: &config::ClusterConfig) -> bool {
    config::oneof_arm(&cfg.controller) == "coreweave"
}

fn text(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Reads the deploy target from the config file at `path`.
pub fn target(path: &Path, fresh: bool) -> anyhow::Result<Target> {
    let cfg = config::load(path)?;
    let raw: Value = {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let yaml: serde_yaml::Value =
            serde_yaml::from_str(&text).with_context(|| format!("{}: not YAML", path.display()))?;
        serde_json::to_value(yaml)
            .with_context(|| format!("{}: not JSON-shaped", path.display()))?
    };
    let at = |what: &str| format!("{}: {what}", path.display());
    let image = text(&raw, "/controller/image").with_context(|| {
        at("controller.image is not set; it names the image the controller Deployment runs")
    })?;
    let scale_group = text(&raw, "/controller/coreweave/scale_group").with_context(|| {
        at("controller.coreweave.scale_group is not set; it names the scale group (node pool) the controller runs on")
    })?;
    if !cfg.scale_groups.contains_key(&scale_group) {
        bail!(at(&format!(
            "controller.coreweave.scale_group: {scale_group} is not one of scale_groups ({})",
            cfg.scale_groups
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let port = match raw.pointer("/controller/coreweave/port") {
        None | Some(Value::Null) => 10000,
        Some(v) => v
            .as_u64()
            .filter(|p| (1..=65535).contains(p))
            .with_context(|| at("controller.coreweave.port: expected a port number (1-65535)"))?
            as u16,
    };
    let cluster_queue = cfg
        .kubernetes_provider
        .as_ref()
        .map(|k| k.kueue.cluster_queue.trim().to_string())
        .filter(|q| !q.is_empty())
        .with_context(|| at("kubernetes_provider.kueue.cluster_queue is not set; the controller's LocalQueue points at that ClusterQueue"))?;
    crate::kube_config::kube_settings(&cfg).map_err(|e| anyhow::anyhow!(at(&e.to_string())))?;
    // The signing key is a reference to a file or variable on the operator's machine; the
    // controller in the pod could not resolve it, and the key must not go into a ConfigMap.
    if cfg.auth.as_ref().is_some_and(|a| !a.signing_key.is_empty()) {
        bail!(at(
            "auth.signing_key: deploying a controller with auth into a cluster is not supported by this build (the key would have to reach the pod as a Secret); run the controller with `iris cluster controller serve` where the key is, or remove auth for this cluster"
        ));
    }
    let namespace = text(&raw, "/platform/coreweave/namespace").unwrap_or_else(|| "iris".into());
    let label_prefix = text(&raw, "/platform/label_prefix").unwrap_or_else(|| "iris".into());
    let service_name = text(&raw, "/controller/coreweave/service_name")
        .unwrap_or_else(|| "iris-controller-svc".into());
    let state = match text(&raw, "/storage/local_state_dir") {
        Some(p) if p.starts_with('/') => StateVolume::HostPath(p),
        Some(p) => bail!(at(&format!(
            "storage.local_state_dir: {p} is not an absolute path (it is a directory on the controller's node)"
        ))),
        None => StateVolume::Claim {
            size: "50Gi".into(),
        },
    };
    let checkpoint_interval_seconds = raw
        .pointer("/controller/checkpoint_interval_seconds")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let env = raw
        .pointer("/defaults/task_env")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string()),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let kubeconfig = text(&raw, "/platform/coreweave/kubeconfig_path");
    let context = text(&raw, "/platform/coreweave/kube_context");
    // The controller reads the same config, minus what only the operator's machine means.
    let mut pod_config = raw.clone();
    for (section, key) in [
        ("/platform/coreweave", "kubeconfig_path"),
        ("/platform/coreweave", "kube_context"),
        ("/kubernetes_provider", "kubeconfig"),
        ("/kubernetes_provider", "context"),
    ] {
        if let Some(m) = pod_config
            .pointer_mut(section)
            .and_then(Value::as_object_mut)
        {
            m.remove(key);
        }
    }
    let deploy = ControllerDeploy {
        namespace: namespace.clone(),
        label_prefix,
        image,
        port,
        service_name: service_name.clone(),
        scale_group,
        hostname: text(&raw, "/controller/coreweave/hostname"),
        state,
        checkpoint_interval_seconds,
        fresh,
        env,
        config_json: serde_json::to_string_pretty(&pod_config)?,
    };
    let pf = crate::tunnel::PortForward {
        kubeconfig: kubeconfig.clone(),
        context: context.clone(),
        namespace,
        service: service_name,
        port,
    };
    Ok(Target {
        deploy,
        cluster_queue,
        remote_state_dir: cfg.remote_state_dir(),
        kubeconfig,
        context,
        pf,
    })
}

impl Target {
    /// The operator's client: `$KUBECONFIG` when set (as kubectl reads it), else
    /// `platform.coreweave.kubeconfig_path`, else kubectl's default file.
    async fn client(&self) -> anyhow::Result<kube::Client> {
        let path = std::env::var("KUBECONFIG")
            .ok()
            .filter(|p| !p.is_empty())
            .or_else(|| self.kubeconfig.clone());
        let opts = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match path {
            Some(p) => {
                let kc = kube::config::Kubeconfig::read_from(&p)
                    .map_err(|e| anyhow::anyhow!("kubeconfig {p}: {e}"))?;
                kube::Config::from_custom_kubeconfig(kc, &opts)
                    .await
                    .map_err(|e| anyhow::anyhow!("kubeconfig {p}: {e}"))?
            }
            None => kube::Config::from_kubeconfig(&opts).await.map_err(|e| {
                anyhow::anyhow!(
                    "no kubeconfig (set platform.coreweave.kubeconfig_path or KUBECONFIG): {e}"
                )
            })?,
        };
        kube::Client::try_from(config).map_err(|e| anyhow::anyhow!("kubernetes client: {e}"))
    }
}

/// The resource of `kind` at `api_version` (`v1`, `apps/v1`, ...).
fn resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// The API resource of a manifest this module applies.
fn resource_of(obj: &Value) -> anyhow::Result<ApiResource> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    let plural = match kind {
        "ConfigMap" => "configmaps",
        "PersistentVolumeClaim" => "persistentvolumeclaims",
        "Deployment" => "deployments",
        "Service" => "services",
        "PodDisruptionBudget" => "poddisruptionbudgets",
        "PriorityClass" => "priorityclasses",
        "WorkloadPriorityClass" => "workloadpriorityclasses",
        "LocalQueue" => "localqueues",
        other => bail!("no API resource known for kind {other}"),
    };
    Ok(resource(api_version, kind, plural))
}

/// Server-side apply of one manifest (namespaced when it names a namespace).
async fn apply(client: &kube::Client, obj: &Value) -> anyhow::Result<()> {
    let ar = resource_of(obj)?;
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let dynamic: DynamicObject = serde_json::from_value(obj.clone())?;
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&dynamic),
    )
    .await
    .map_err(|e| anyhow::anyhow!("applying {} {name}: {e}", ar.kind))?;
    Ok(())
}

fn namespaced(client: &kube::Client, ns: &str, ar: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, ar)
}

fn deployments() -> ApiResource {
    resource("apps/v1", "Deployment", "deployments")
}

fn pods() -> ApiResource {
    resource("v1", "Pod", "pods")
}

/// The missing admin-owned objects, by label; empty when all are there.
async fn missing_prerequisites(client: &kube::Client, t: &Target) -> anyhow::Result<Vec<String>> {
    let mut missing = Vec::new();
    let mut queue: Option<Value> = None;
    for p in kc::prerequisites(&t.deploy.namespace, &t.cluster_queue) {
        let ar = resource(p.api_version, p.kind, p.plural);
        let api: Api<DynamicObject> = match &p.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        match api.get_opt(&p.name).await {
            Ok(Some(obj)) if p.kind == "ClusterQueue" => queue = Some(serde_json::to_value(obj)?),
            Ok(Some(_)) => {}
            Ok(None) => missing.push(p.label()),
            Err(e) => bail!("checking {}: {e}", p.label()),
        }
    }
    if let Some(cq) = queue {
        let flavors: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &resource(
                iris_kube_model::priority::KUEUE_API_VERSION,
                "ResourceFlavor",
                "resourceflavors",
            ),
        );
        for f in kc::cluster_queue_flavors(&cq) {
            if flavors.get_opt(&f).await?.is_none() {
                missing.push(format!("ResourceFlavor/{f}"));
            }
        }
    }
    Ok(missing)
}

/// Deletes the controller Deployment (if any) and waits until its pods are gone.
async fn remove_controller(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let deps = namespaced(client, ns, &deployments());
    match deps
        .delete(kc::DEPLOYMENT, &DeleteParams::foreground())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => bail!("deleting Deployment {}: {e}", kc::DEPLOYMENT),
    }
    let pods = namespaced(client, ns, &pods());
    let selector = format!("{}={}", kc::APP_LABEL.0, kc::APP_LABEL.1);
    let start = Instant::now();
    loop {
        let dep_gone = deps.get_opt(kc::DEPLOYMENT).await?.is_none();
        let left: Vec<String> = pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        if dep_gone && left.is_empty() {
            return Ok(());
        }
        if start.elapsed() > DELETE_WAIT {
            bail!(
                "the controller Deployment {} did not go within {}s (Deployment gone: {dep_gone}; pods left: {})",
                kc::DEPLOYMENT,
                DELETE_WAIT.as_secs(),
                left.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the Deployment is available, or fails as soon as its pod cannot come up.
async fn wait_available(client: &kube::Client, ns: &str, within: Duration) -> anyhow::Result<()> {
    let deps = namespaced(client, ns, &deployments());
    let pods = namespaced(client, ns, &pods());
    let selector = format!("{}={}", kc::APP_LABEL.0, kc::APP_LABEL.1);
    let start = Instant::now();
    loop {
        let dep = match deps.get_opt(kc::DEPLOYMENT).await? {
            Some(d) => serde_json::to_value(d)?,
            None => bail!("the controller Deployment {} disappeared", kc::DEPLOYMENT),
        };
        let listed: Vec<Value> = pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
        let last = match kc::rollout(&dep, &listed) {
            Rollout::Available => return Ok(()),
            Rollout::Failed(why) => bail!("{why}"),
            Rollout::Waiting(why) => why,
        };
        if start.elapsed() > within {
            bail!(
                "the controller Deployment did not become available within {}s ({last})",
                within.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Opens the port-forward to the controller's Service (kubectl is waited for off the runtime);
/// the controller's local URL.
async fn open_tunnel(t: &Target) -> anyhow::Result<String> {
    let pf = t.pf.clone();
    tokio::task::spawn_blocking(move || crate::tunnel::open(&pf, Duration::from_secs(90))).await?
}

/// Opens the port-forward and waits for `/health`; the controller's local URL.
async fn check_health(t: &Target) -> anyhow::Result<String> {
    let url = open_tunnel(t).await?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()?;
    let start = Instant::now();
    loop {
        let why = match http.get(format!("{url}/health")).send().await {
            Ok(r) if r.status().is_success() => return Ok(url),
            Ok(r) => format!("HTTP {}", r.status()),
            Err(e) => e.to_string(),
        };
        if start.elapsed() > HEALTH_WAIT {
            bail!(
                "the controller did not answer /health through the tunnel within {}s: {why}",
                HEALTH_WAIT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Applies everything and waits for a healthy controller running `t.deploy.image`.
async fn deploy(client: &kube::Client, t: &Target, opts: &DeployOpts) -> anyhow::Result<String> {
    let d = &t.deploy;
    apply(client, &d.config_map()).await?;
    for pc in iris_kube_model::priority::pod_priority_classes() {
        apply(client, &serde_json::to_value(pc)?).await?;
    }
    for wpc in iris_kube_model::priority::workload_priority_classes() {
        apply(client, &wpc).await?;
    }
    let lq =
        iris_kube_model::priority::local_queue(&d.namespace, &d.label_prefix, &t.cluster_queue)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    apply(client, &lq).await?;
    if let Some(claim) = d.state_claim() {
        apply(client, &claim).await?;
    }
    remove_controller(client, &d.namespace).await?;
    apply(client, &d.deployment()).await?;
    apply(client, &d.service()).await?;
    apply(client, &d.pdb()).await?;
    wait_available(client, &d.namespace, opts.timeout).await?;
    check_health(t).await
}

/// `iris cluster start` for a controller in a cluster.
pub async fn start(path: &Path, opts: DeployOpts) -> anyhow::Result<i32> {
    let t = target(path, opts.fresh)?;
    let client = t.client().await?;
    let missing = missing_prerequisites(&client, &t).await?;
    if !missing.is_empty() {
        bail!(
            "prerequisites missing (a cluster administrator provisions these; `cluster start` never creates them): {}",
            missing.join(", ")
        );
    }
    println!(
        "Starting controller (image {}) in namespace {}...",
        t.deploy.image, t.deploy.namespace
    );
    let url = deploy(&client, &t, &opts).await?;
    if opts.fresh {
        // `--fresh` empties the DB once: the Deployment left behind starts from what it has.
        let mut again = t.deploy.clone();
        again.fresh = false;
        apply(&client, &again.deployment()).await?;
        wait_available(&client, &t.deploy.namespace, opts.timeout).await?;
    }
    println!(
        "Controller started: service {}.{}:{} (answered /health at {url} through kubectl port-forward)",
        t.deploy.service_name, t.deploy.namespace, t.deploy.port
    );
    println!(
        "Use 'iris --config={} cluster status' to check cluster state.",
        path.display()
    );
    Ok(0)
}

/// `iris cluster stop` for a controller in a cluster: deletes what `start` applied for the
/// controller (the Deployment, its Service, PDB, config and state claim); the namespace, RBAC,
/// Kueue objects and task pods stay.
pub async fn stop(path: &Path, dry_run: bool) -> anyhow::Result<i32> {
    let t = target(path, false)?;
    if dry_run {
        println!("Would delete in namespace {}: Deployment {}, Service {}, PodDisruptionBudget {}, ConfigMap {}{}",
            t.deploy.namespace, kc::DEPLOYMENT, t.deploy.service_name, kc::PDB, kc::CONFIG_MAP,
            if t.deploy.state_claim().is_some() { format!(", PersistentVolumeClaim {}", kc::STATE_PVC) } else { String::new() });
        return Ok(0);
    }
    let client = t.client().await?;
    let ns = &t.deploy.namespace;
    remove_controller(&client, ns).await?;
    let mut doomed = vec![
        (t.deploy.service(), t.deploy.service_name.clone()),
        (t.deploy.pdb(), kc::PDB.to_string()),
        (t.deploy.config_map(), kc::CONFIG_MAP.to_string()),
    ];
    if let Some(claim) = t.deploy.state_claim() {
        doomed.push((claim, kc::STATE_PVC.to_string()));
    }
    for (obj, name) in doomed {
        let ar = resource_of(&obj)?;
        match namespaced(&client, ns, &ar)
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => bail!("deleting {} {name}: {e}", ar.kind),
        }
    }
    println!("Cluster stopped");
    Ok(0)
}

/// What `cluster controller restart` was asked for, in a cluster.
pub struct RestartOpts {
    pub image: Option<String>,
    pub prebuilt_tag: Option<String>,
    pub skip_checkpoint: bool,
    pub checkpoint_timeout: Duration,
    pub timeout: Duration,
}

/// The image a restart rolls out: `--image`, else the config's image at `--prebuilt-tag`,
/// else the config's image.
pub fn rollout_image(config_image: &str, image: Option<&str>, tag: Option<&str>) -> String {
    match (
        image.filter(|i| !i.is_empty()),
        tag.filter(|t| !t.is_empty()),
    ) {
        (Some(i), _) => i.to_string(),
        (None, Some(tag)) => {
            let repo = match config_image.rsplit_once(':') {
                Some((repo, t)) if !t.contains('/') => repo,
                _ => config_image,
            };
            let repo = repo.split('@').next().unwrap_or(repo);
            format!("{repo}:{tag}")
        }
        (None, None) => config_image.to_string(),
    }
}

/// `iris cluster controller restart` for a controller in a cluster.
pub async fn restart(path: &Path, o: RestartOpts) -> anyhow::Result<i32> {
    let mut t = target(path, false)?;
    let client = t.client().await?;
    let ns = t.deploy.namespace.clone();
    let live = namespaced(&client, &ns, &deployments())
        .get_opt(kc::DEPLOYMENT)
        .await?
        .with_context(|| {
            format!(
                "no controller Deployment {} in namespace {ns}: start one with `iris --config {} cluster start`",
                kc::DEPLOYMENT,
                path.display()
            )
        })?;
    let previous = serde_json::to_value(live)?
        .pointer("/spec/template/spec/containers/0/image")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let image = rollout_image(
        &t.deploy.image,
        o.image.as_deref(),
        o.prebuilt_tag.as_deref(),
    );
    let store = match (&t.remote_state_dir, o.skip_checkpoint) {
        (Some(dir), false) => Some(RemoteStore::parse(dir)?),
        (_, true) => None,
        (None, false) => bail!(
            "{}: storage.remote_state_dir is not set: a restart checkpoints the controller there first so a failed rollout can restore it (or pass --skip-checkpoint to restart without one)",
            path.display()
        ),
    };
    let mut checkpoint = String::new();
    if let Some(store) = &store {
        println!(
            "Taking checkpoint (timeout {}s)...",
            o.checkpoint_timeout.as_secs()
        );
        let url = open_tunnel(&t).await?;
        let cl = crate::client::controller_client(&Some(url))?;
        let r = crate::rollout::begin_within(&cl, o.checkpoint_timeout)
            .await
            .context("checkpoint before the restart failed; nothing was changed")?;
        let ms = r.created_at.map(|c| c.epoch_ms()).unwrap_or_default();
        checkpoint = format!("{STATE_DIR}/{ms}");
        println!(
            "Checkpoint: {} ({} jobs, {} workers)",
            r.checkpoint_path, r.job_count, r.worker_count
        );
        store
            .write_rollout(&RolloutRecord {
                phase: RolloutPhase::Pending,
                image: image.clone(),
                previous_image: previous.clone(),
                rollback_checkpoint: checkpoint.clone(),
                updated_at_ms: 0,
            })
            .await?;
        crate::tunnel::close();
    } else {
        println!("Skipping pre-restart checkpoint.");
    }
    let opts = DeployOpts {
        fresh: false,
        timeout: o.timeout,
    };
    println!("Rolling out image {image} (previous: {previous})...");
    t.deploy.image = image.clone();
    let failure = match deploy(&client, &t, &opts).await {
        Ok(_) => {
            println!("Controller restarted (image {image})");
            return Ok(0);
        }
        Err(e) => e,
    };
    eprintln!("Deploy failed its post-restart health check: {failure:#}");
    crate::tunnel::close();
    if previous.is_empty() || previous == image {
        bail!("no previous image to roll back to (the live Deployment ran {image}); fix the image and restart again");
    }
    eprintln!("Auto-rolling back to previous image {previous}...");
    if let Some(store) = &store {
        store
            .write_rollout(&RolloutRecord {
                phase: RolloutPhase::RollbackRequested,
                image: previous.clone(),
                previous_image: String::new(),
                rollback_checkpoint: checkpoint.clone(),
                updated_at_ms: 0,
            })
            .await?;
    }
    t.deploy.image = previous.clone();
    deploy(&client, &t, &opts)
        .await
        .context("the rollback to the previous image failed too")?;
    eprintln!(
        "Controller rolled back to image {previous}{}",
        if checkpoint.is_empty() {
            String::new()
        } else {
            format!(" (restored checkpoint {checkpoint})")
        }
    );
    Ok(1)
}

/// `iris cluster controller restart --rollback` in a cluster: deploys the previous image of the
/// last recorded rollout again, and that controller restores the rollout's checkpoint on boot.
pub async fn rollback(path: &Path, timeout: Duration) -> anyhow::Result<i32> {
    let mut t = target(path, false)?;
    let dir = t.remote_state_dir.clone().with_context(|| {
        format!(
            "{}: --rollback reads the rollout record in storage.remote_state_dir, which is not set",
            path.display()
        )
    })?;
    let store = RemoteStore::parse(&dir)?;
    let rec = store
        .read_rollout()
        .await?
        .filter(|r| !r.previous_image.is_empty())
        .with_context(|| {
            format!(
                "no deploy to roll back to in {}/rollout-record.json",
                store.location()
            )
        })?;
    let client = t.client().await?;
    if !rec.rollback_checkpoint.is_empty() {
        store
            .write_rollout(&RolloutRecord {
                phase: RolloutPhase::RollbackRequested,
                image: rec.previous_image.clone(),
                previous_image: String::new(),
                rollback_checkpoint: rec.rollback_checkpoint.clone(),
                updated_at_ms: 0,
            })
            .await?;
    }
    println!(
        "Rolling back: image {}, checkpoint {}",
        rec.previous_image,
        if rec.rollback_checkpoint.is_empty() {
            "(none: the state volume's DB is kept)"
        } else {
            &rec.rollback_checkpoint
        }
    );
    t.deploy.image = rec.previous_image.clone();
    let opts = DeployOpts {
        fresh: false,
        timeout,
    };
    deploy(&client, &t, &opts).await?;
    println!("Controller rolled back to image {}", rec.previous_image);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> String {
        format!(
            "name: cw\nplatform:\n  coreweave: {{namespace: iris}}\ncontroller:\n  image: ghcr.io/acme/iris:v1\n  coreweave: {{port: 10000, scale_group: cpu}}\nkubernetes_provider:\n  namespace: iris\n  controller_address: http://iris-controller-svc.iris:10000\n  kueue: {{cluster_queue: iris-cq}}\nscale_groups:\n  cpu:\n    num_vms: 1\n    resources: {{cpu: 32, ram: 128GB, disk: 1TB, device_type: cpu, capacity_type: on-demand}}\n{extra}"
        )
    }

    #[test]
    fn a_deploy_target_names_what_is_missing_or_unsupported() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("cw.yaml");
        std::fs::write(&path, config("")).expect("write");
        let t = target(&path, false).expect("target");
        assert_eq!(t.deploy.namespace, "iris");
        assert_eq!(t.deploy.port, 10000);
        assert_eq!(t.deploy.service_name, "iris-controller-svc");
        assert!(matches!(t.deploy.state, StateVolume::Claim { .. }));
        let cfg: Value = serde_json::from_str(&t.deploy.config_json).expect("json");
        assert_eq!(cfg["controller"]["image"], "ghcr.io/acme/iris:v1");

        std::fs::write(&path, config("auth:\n  signing_key: file:/secrets/key\n")).expect("write");
        let err = target(&path, false)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("auth.signing_key"), "{err}");

        std::fs::write(&path, config("storage:\n  local_state_dir: relative/dir\n"))
            .expect("write");
        let err = target(&path, false)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("storage.local_state_dir") && err.contains("absolute"),
            "{err}"
        );

        let no_group = config("").replace("scale_group: cpu", "scale_group: gpu");
        std::fs::write(&path, no_group).expect("write");
        let err = target(&path, false)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("controller.coreweave.scale_group: gpu is not one of scale_groups (cpu)"),
            "{err}"
        );
    }

    #[test]
    fn a_prebuilt_tag_replaces_the_configured_tag_or_digest() {
        let img = "ghcr.io/acme/iris-controller:latest";
        assert_eq!(rollout_image(img, None, None), img);
        assert_eq!(
            rollout_image(img, None, Some("abc123")),
            "ghcr.io/acme/iris-controller:abc123"
        );
        assert_eq!(
            rollout_image("registry:5000/iris", None, Some("v2")),
            "registry:5000/iris:v2"
        );
        assert_eq!(
            rollout_image("ghcr.io/acme/iris@sha256:00", None, Some("v2")),
            "ghcr.io/acme/iris:v2"
        );
        assert_eq!(rollout_image(img, Some("other:1"), Some("x")), "other:1");
    }
}
