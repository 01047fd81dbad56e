//! Startup: the cluster client (kubeconfig or in-cluster), and [`connect`], which applies Iris's
//! own cluster objects (Pod PriorityClasses, Kueue WorkloadPriorityClasses, the LocalQueue),
//! checks the admin-owned Kueue objects (reported in [`Preflight`], never created), starts the
//! Pod and Workload watches and builds one [`KubeBackend`] per device lane (one per GPU
//! variant, one for CPU work).

use crate::pods::{disrupted, phase};
use crate::{
    lock, Core, KubeBackend, KubeSettings, Preflight, State, FIELD_MANAGER, KUEUE_GROUP,
    KUEUE_VERSION,
};
use futures::StreamExt;
use iris_kube_model as km;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::reflector;
use kube::runtime::{watcher, WatchStreamExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Connects, reconciles the priority classes and the LocalQueue, checks the admin-owned Kueue
/// objects, starts the watches, and returns one backend per device lane.
pub async fn connect(
    client: kube::Client,
    settings: KubeSettings,
) -> anyhow::Result<(Vec<Arc<KubeBackend>>, Preflight)> {
    let ns = settings.provider.namespace.clone();
    if settings.cluster_queue.trim().is_empty() {
        anyhow::bail!("kubernetes_provider.kueue.cluster_queue is required: the ClusterQueue Iris's LocalQueue points at");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let wl_res = kueue_resource("Workload", "workloads");
    let workloads: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &wl_res);
    let pp = PatchParams::apply(FIELD_MANAGER).force();

    // Pod PriorityClasses and Kueue WorkloadPriorityClasses (ours: created or updated).
    let pcs: Api<PriorityClass> = Api::all(client.clone());
    for pc in km::priority::pod_priority_classes() {
        let name = pc.metadata.name.clone().unwrap_or_default();
        if let Err(e) = pcs.patch(&name, &pp, &Patch::Apply(&pc)).await {
            // `value` is immutable: a changed class is replaced.
            tracing::warn!(class = %name, error = %e, "replacing PriorityClass");
            let _ = pcs.delete(&name, &DeleteParams::default()).await;
            pcs.patch(&name, &pp, &Patch::Apply(&pc))
                .await
                .map_err(|e| anyhow::anyhow!("applying PriorityClass {name}: {e}"))?;
        }
    }
    let wpc_res = kueue_resource("WorkloadPriorityClass", "workloadpriorityclasses");
    let wpcs: Api<DynamicObject> = Api::all_with(client.clone(), &wpc_res);
    for v in km::priority::workload_priority_classes() {
        let name = v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let obj: DynamicObject = serde_json::from_value(v)?;
        wpcs.patch(&name, &pp, &Patch::Apply(&obj))
            .await
            .map_err(|e| anyhow::anyhow!("applying WorkloadPriorityClass {name}: {e}"))?;
    }
    let lq_res = kueue_resource("LocalQueue", "localqueues");
    let lqs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &lq_res);
    let lq = km::priority::local_queue(
        &ns,
        &settings.provider.label_prefix,
        &settings.cluster_queue,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let lq_name = lq["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let lq_obj: DynamicObject = serde_json::from_value(lq)?;
    lqs.patch(&lq_name, &pp, &Patch::Apply(&lq_obj))
        .await
        .map_err(|e| anyhow::anyhow!("applying LocalQueue {lq_name}: {e}"))?;

    // Admin-owned objects: verified, never created or repaired.
    let mut pre = Preflight::default();
    let cq: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kueue_resource("ClusterQueue", "clusterqueues"),
    );
    if cq.get_opt(&settings.cluster_queue).await?.is_none() {
        pre.missing.push(format!(
            "ClusterQueue {} (kubernetes_provider.kueue.cluster_queue)",
            settings.cluster_queue
        ));
    }
    let flavors: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kueue_resource("ResourceFlavor", "resourceflavors"),
    );
    if flavors
        .list(&ListParams::default())
        .await
        .map(|l| l.items.is_empty())
        .unwrap_or(true)
    {
        pre.missing.push("a Kueue ResourceFlavor".into());
    }
    let topo_res = ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk(KUEUE_GROUP, "v1alpha1", "Topology"),
        "topologies",
    );
    let topos: Api<DynamicObject> = Api::all_with(client.clone(), &topo_res);
    if topos
        .list(&ListParams::default())
        .await
        .map(|l| l.items.is_empty())
        .unwrap_or(true)
    {
        pre.missing.push("a Kueue Topology".into());
    }
    for m in &pre.missing {
        tracing::warn!(missing = %m, "Kueue object not found; ask the cluster admin to install it (Iris does not create it)");
    }

    // Watches: pods we manage, and Kueue workloads.
    let (pod_store, pod_writer) = reflector::store();
    let pod_stream = reflector::reflector(
        pod_writer,
        watcher(
            pods.clone(),
            watcher::Config::default().labels(&format!("{}=true", km::manifest::LABEL_MANAGED)),
        ),
    )
    .default_backoff()
    .applied_objects();
    let last_seen: Arc<Mutex<HashMap<String, Pod>>> = Arc::default();
    let seen = last_seen.clone();
    tokio::spawn(async move {
        futures::pin_mut!(pod_stream);
        while let Some(ev) = pod_stream.next().await {
            match ev {
                Ok(p) => {
                    let ended = matches!(phase(&p), "Succeeded" | "Failed") || disrupted(&p);
                    if let (true, Some(name)) = (ended, p.metadata.name.clone()) {
                        lock(&seen).insert(name, p);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "pod watch"),
            }
        }
    });
    let wl_writer = reflector::store::Writer::<DynamicObject>::new(wl_res.clone());
    let workload_store = wl_writer.as_reader();
    let wl_stream = reflector::reflector(
        wl_writer,
        watcher(workloads.clone(), watcher::Config::default()),
    )
    .default_backoff()
    .applied_objects();
    tokio::spawn(async move {
        futures::pin_mut!(wl_stream);
        while let Some(ev) = wl_stream.next().await {
            if let Err(e) = ev {
                tracing::debug!(error = %e, "workload watch");
            }
        }
    });
    let _ = pod_store.wait_until_ready().await;
    let core = Arc::new(Core {
        client,
        settings: settings.clone(),
        pods,
        pdbs,
        secrets,
        config_maps,
        workloads,
        pod_store,
        workload_store,
        last_seen,
    });
    let mut out = vec![Arc::new(KubeBackend {
        core: core.clone(),
        state: Mutex::new(State::default()),
        id: "k8s-cpu".into(),
        variant: None,
    })];
    for v in &settings.gpu_variants {
        out.push(Arc::new(KubeBackend {
            core: core.clone(),
            state: Mutex::new(State::default()),
            id: format!("k8s-{}", v.to_lowercase()),
            variant: Some(v.clone()),
        }));
    }
    Ok((out, pre))
}

fn kueue_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk(KUEUE_GROUP, KUEUE_VERSION, kind),
        plural,
    )
}

/// A client for the configured cluster: the operator's kubeconfig file (and pinned context)
/// when given, else the in-cluster service account. Neither ever reaches a Pod.
pub async fn client(
    kubeconfig: Option<&str>,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig.filter(|p| !p.is_empty()) {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                anyhow::anyhow!("kubernetes_provider.kubeconfig: reading {path}: {e}")
            })?;
            let opts = kube::config::KubeConfigOptions {
                context: context.map(str::to_string),
                ..Default::default()
            };
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| anyhow::anyhow!("kubernetes_provider.kubeconfig {path}: {e}"))?
        }
        None => kube::Config::incluster().map_err(|e| {
            anyhow::anyhow!("no kubernetes_provider.kubeconfig and not running in a cluster: {e}")
        })?,
    };
    kube::Client::try_from(config).map_err(|e| anyhow::anyhow!("kubernetes client: {e}"))
}
