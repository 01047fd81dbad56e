//! `iris cluster controller serve --config FILE --dry-run`: validate a cluster config the way
//! a start would, print what the controller would run from it, and exit without touching any
//! state. Secret references are reported (and whether they resolve on this machine), not
//! required to resolve: the config is often checked away from the machine that holds them.

use crate::{config, keys, local, target};
use std::path::Path;

fn gib(bytes: i64) -> String {
    format!("{:.1}GiB", bytes as f64 / (1u64 << 30) as f64)
}

pub fn report(path: Option<&Path>) -> anyhow::Result<i32> {
    let path = path
        .ok_or_else(|| anyhow::anyhow!("--dry-run: pass the config to check with --config FILE"))?;
    let cfg = config::load(path)?;
    // Everything a start validates, in the same order.
    let groups = local::plan_groups(&cfg)?;
    let federation = config::federation(&cfg)?;
    let kube = crate::kube_config::kube_settings(&cfg)?;
    let task_env = cfg.task_env()?;

    println!("Config: {}", path.display());
    println!("Cluster: {}", target::cluster_name(&cfg, path));
    println!("Platform: {}", config::oneof_arm(&cfg.platform));
    println!("Controller: {}", config::oneof_arm(&cfg.controller));
    match &kube {
        Some((k, kubeconfig, context)) => {
            println!("Backend: Kubernetes (one Pod per attempt, admitted by Kueue)");
            println!("  namespace: {}", k.provider.namespace);
            println!(
                "  kubeconfig: {}",
                kubeconfig
                    .as_deref()
                    .unwrap_or("in-cluster service account")
            );
            if let Some(c) = context {
                println!("  context: {c}");
            }
            println!("  pods reach the controller at: {}", k.controller_url);
            println!("  task image: {}", k.provider.default_task_image);
            println!(
                "  checks at start (never creates): Namespace {}, ClusterQueue {}, a LocalQueue for it in {}",
                k.provider.namespace, k.cluster_queue, k.provider.namespace
            );
            for (band, class) in &k.provider.priority_classes {
                println!("  priority class for {band}: {class}");
            }
        }
        None => println!("Backend: worker daemons"),
    }
    println!("Scale groups:");
    if groups.is_empty() {
        println!("  (none)");
    }
    for g in &groups {
        let device = match &g.device {
            Some((t, v, n)) => format!("{t} {v} x{n}"),
            None => "cpu".into(),
        };
        let slices = match &g.autoscale {
            Some(p) => format!("slices={}-{}", p.buffer_slices, p.max_slices),
            None => "slices=1 (fixed)".into(),
        };
        println!(
            "  {:24} vms={} {slices} cpu={} memory={} disk={} device={device}",
            g.name,
            g.count,
            g.cpu,
            gib(g.memory),
            gib(g.disk),
        );
    }
    let (defaults, tiers) = cfg.budgets()?;
    println!(
        "Budgets: default limit {} (0 = unlimited), max band {}; {} user(s) set by user_budgets",
        defaults.limit,
        defaults.max_band,
        tiers.iter().map(|t| t.user_ids.len()).sum::<usize>()
    );
    match &cfg.auth {
        None => println!("Auth: none (every caller is the anonymous admin)"),
        Some(a) => {
            println!(
                "Auth: {}",
                a.provider
                    .as_deref()
                    .unwrap_or(if a.iap.is_some() { "iap" } else { "token" })
            );
            if a.signing_key.is_empty() {
                println!("  signing key: none (an ephemeral key per start)");
            } else {
                let resolves = match keys::resolve_first_secret(&a.signing_key) {
                    Ok(_) => "resolves here".to_string(),
                    Err(e) => format!("does not resolve here: {e:#}"),
                };
                println!("  signing key: {} ({resolves})", a.signing_key.join(", "));
            }
            for (user, role) in &a.user_roles {
                println!("  role {user}: {role}");
            }
        }
    }
    if federation.peers.is_empty() {
        println!("Federation peers: none");
    } else {
        println!("Federation peers:");
        for p in &federation.peers {
            println!("  {} -> {}", p.id, p.address);
        }
    }
    if !task_env.is_empty() {
        let names: Vec<&str> = task_env.keys().map(String::as_str).collect();
        println!("Task env defaults: {}", names.join(", "));
    }
    for w in cfg.warnings() {
        println!("warning: {w}");
    }
    println!("OK: the config is valid for this controller (dry run: nothing was started)");
    Ok(0)
}
