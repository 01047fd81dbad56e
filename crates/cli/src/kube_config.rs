//! The Kubernetes backend's settings from a cluster config (`kubernetes_provider`, and
//! `platform.coreweave` for the kubeconfig and context), shared by `cluster controller serve`
//! and its `--dry-run` report.

use crate::config;

/// `kubernetes_provider` (and `platform.coreweave` for the kubeconfig and context) as the
/// backend's settings, validated; `None` when the cluster uses worker daemons.
#[allow(clippy::type_complexity)]
pub(crate) fn kube_settings(
    cfg: &config::ClusterConfig,
) -> anyhow::Result<
    Option<(
        iris_kube_backend::KubeSettings,
        Option<String>,
        Option<String>,
    )>,
> {
    let Some(kp) = &cfg.kubernetes_provider else {
        return Ok(None);
    };
    if cfg.worker_provider.is_some() {
        anyhow::bail!("kubernetes_provider and worker_provider: choose one backend");
    }
    if kp.controller_address.trim().is_empty() {
        anyhow::bail!("kubernetes_provider.controller_address: required: where pods reach the controller (e.g. http://iris-controller-svc.iris:10000)");
    }
    if kp.kueue.cluster_queue.trim().is_empty() {
        anyhow::bail!("kubernetes_provider.kueue.cluster_queue: required: the ClusterQueue the cluster admin installed for Iris");
    }
    for band in kp.priority_classes.keys() {
        iris_types::Band::parse(band)
            .map_err(|e| anyhow::anyhow!("kubernetes_provider.priority_classes.{band}: {e}"))?;
    }
    let coreweave = cfg
        .platform
        .as_ref()
        .and_then(|p| p.get("coreweave"))
        .cloned();
    if let Some(cw) = coreweave.as_ref().and_then(|c| c.as_mapping()) {
        const KNOWN: [&str; 6] = [
            "region",
            "namespace",
            "kubeconfig_path",
            "kube_context",
            "object_storage_endpoint",
            "external_object_storage_endpoint",
        ];
        for k in cw.keys() {
            let k = k.as_str().unwrap_or("?");
            if !KNOWN.contains(&k) {
                anyhow::bail!(
                    "platform.coreweave.{k}: unknown key (known: {})",
                    KNOWN.join(", ")
                );
            }
        }
    }
    let cw_str = |k: &str| {
        coreweave
            .as_ref()
            .and_then(|c| c.get(k))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let kubeconfig = kp.kubeconfig.clone().or_else(|| cw_str("kubeconfig_path"));
    let context = kp.kube_context.clone().or_else(|| cw_str("kube_context"));
    let namespace = kp
        .namespace
        .clone()
        .or_else(|| cw_str("namespace"))
        .unwrap_or_else(|| "iris".into());
    let label_prefix = cfg
        .platform
        .as_ref()
        .and_then(|p| p.get("label_prefix"))
        .and_then(|v| v.as_str())
        .unwrap_or("iris")
        .to_string();
    let mut gpu_variants = Vec::new();
    for (name, g) in &cfg.scale_groups {
        if g.resources.device_type.as_deref() == Some("gpu") {
            let v = g.resources.device_variant.clone().unwrap_or_default();
            if v.is_empty() {
                anyhow::bail!("scale_groups.{name}.resources.device_variant: required for GPU groups on Kubernetes");
            }
            if !gpu_variants
                .iter()
                .any(|x: &String| x.eq_ignore_ascii_case(&v))
            {
                gpu_variants.push(v);
            }
        }
    }
    let task_image = cfg
        .defaults
        .as_ref()
        .and_then(|d| d.get("worker"))
        .and_then(|w| {
            w.get("default_task_image")
                .or_else(|| w.get("docker_image"))
        })
        .and_then(|v| v.as_str())
        .filter(|v| !v.trim().is_empty())
        .unwrap_or("ghcr.io/marin-community/iris-task:latest")
        .to_string();
    let provider = iris_kube_model::ProviderConfig {
        namespace,
        label_prefix,
        host_network: kp.host_network,
        cache_dir: kp.cache_dir.clone().unwrap_or_else(|| "/cache".into()),
        default_task_image: task_image,
        controller_address: Some(kp.controller_address.clone()),
        service_account: kp.service_account.clone(),
        task_env: cfg.task_env()?,
        priority_classes: kp.priority_classes.clone(),
        kueue_topologies: kp.kueue.topologies.clone(),
        deadline_grace_seconds: 0,
    };
    Ok(Some((
        iris_kube_backend::KubeSettings {
            provider,
            cluster_queue: kp.kueue.cluster_queue.clone(),
            gpu_variants,
            scale_groups: cfg.scale_groups.keys().cloned().collect(),
            controller_url: kp.controller_address.clone(),
        },
        kubeconfig,
        context,
    )))
}
