//! Which controller a command talks to, chosen the way the published CLI chooses it:
//! `--controller-url` (never together with `--config`), else the cluster a config describes
//! (`--config FILE`, or `--cluster NAME` looked up by file name in the cluster config
//! directories), else `IRIS_CONTROLLER_URL`, else the local cluster recorded in the state dir.
//!
//! A config names its controller by `defaults.worker.controller_address`, or, for a local
//! controller, by the fixed `controller.local.port`, or else by the address the local cluster
//! started from that config recorded in its own state dir (`iris --config FILE cluster start
//! --local`), so two local clusters from two configs are each reached by their config. A
//! `controller.manual` config is reached at its host and port; a `controller.coreweave` one
//! through a `kubectl port-forward` to its Service, opened for the command ([`crate::tunnel`]);
//! GCP controllers need an SSH tunnel this build does not open (the error says how).

use crate::config::{self, ClusterConfig};
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Directories searched for `--cluster NAME` and listed by `cluster list`, in priority order:
/// the user's own (`~/.config/marin/clusters`, as for the published CLI), then `lib/iris/config`
/// of the marin checkout the current directory is in.
pub fn config_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(home) = dirs::home_dir() {
        dirs.push(home.join(".config/marin/clusters"));
    }
    if let Ok(cwd) = std::env::current_dir() {
        if let Some(root) = cwd.ancestors().find(|d| d.join("lib/iris/config").is_dir()) {
            dirs.push(root.join("lib/iris/config"));
        }
    }
    dirs
}

/// Every `*.yaml` / `*.yml` in `dirs` by file stem; an earlier directory wins a name.
pub fn list_configs(dirs: &[PathBuf]) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        files.sort();
        for p in files {
            let yaml = matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"));
            if let (true, Some(stem)) = (yaml && p.is_file(), p.file_stem()) {
                found
                    .entry(stem.to_string_lossy().into_owned())
                    .or_insert(p);
            }
        }
    }
    found
}

/// `--cluster NAME` (or a path to an existing file) to its config file.
pub fn resolve_cluster(name: &str) -> anyhow::Result<PathBuf> {
    let as_path = Path::new(name);
    if as_path.is_file() {
        return Ok(as_path.to_path_buf());
    }
    let stem = name
        .strip_suffix(".yaml")
        .or_else(|| name.strip_suffix(".yml"))
        .unwrap_or(name);
    let dirs = config_dirs();
    if let Some(p) = list_configs(&dirs).remove(stem) {
        return Ok(p);
    }
    let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    anyhow::bail!(
        "unknown cluster {name}: no {stem}.yaml in {}. Run `iris cluster list` to see the known clusters, or pass --config FILE",
        if searched.is_empty() {
            "any cluster config directory".to_string()
        } else {
            searched.join(", ")
        }
    )
}

/// The cluster's name: the config's `name`, else the file's stem.
pub fn cluster_name(cfg: &ClusterConfig, path: &Path) -> String {
    cfg.name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "cluster".into())
        })
}

/// Where a local cluster started from a config named `name` keeps its state by default.
pub fn cluster_state_dir(name: &str) -> PathBuf {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    dirs::data_local_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("iris")
        .join("clusters")
        .join(safe)
}

/// The controller a config describes, as a URL.
pub fn controller_url_of(cfg: &ClusterConfig, path: &Path) -> anyhow::Result<String> {
    let defaults_address = cfg
        .defaults
        .as_ref()
        .and_then(|d| d.get("worker"))
        .and_then(|w| w.get("controller_address"))
        .and_then(|a| a.as_str())
        .filter(|a| !a.trim().is_empty());
    if let Some(a) = defaults_address {
        return Ok(if a.contains("://") {
            a.to_string()
        } else {
            format!("http://{a}")
        });
    }
    let controller = cfg.controller.as_ref();
    let local = controller.and_then(|c| c.get("local"));
    if let Some(local) = local {
        if let Some(port) = local
            .get("port")
            .and_then(|p| p.as_u64())
            .filter(|p| *p > 0)
        {
            return Ok(format!("http://127.0.0.1:{port}"));
        }
        let name = cluster_name(cfg, path);
        let file = cluster_state_dir(&name).join("controller.url");
        return std::fs::read_to_string(&file)
            .map(|s| s.trim().to_string())
            .with_context(|| {
                format!(
                    "cluster {name} ({}) is not running here: start it with `iris --config {} cluster start --local`",
                    path.display(),
                    path.display()
                )
            });
    }
    let kind = config::oneof_arm(&cfg.controller);
    let section = |key: &str| controller.and_then(|c| c.get(key));
    let port_of = |v: Option<&serde_yaml::Value>| {
        v.and_then(|m| m.get("port"))
            .and_then(|p| p.as_u64())
            .filter(|p| *p > 0 && *p <= u16::MAX as u64)
            .unwrap_or(10000) as u16
    };
    let text = |v: Option<&serde_yaml::Value>, key: &str| {
        v.and_then(|m| m.get(key))
            .and_then(|s| s.as_str())
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    match kind {
        "manual" => {
            let m = section("manual");
            let host = m
                .and_then(|m| m.get("host"))
                .and_then(|h| h.as_str())
                .filter(|h| !h.trim().is_empty())
                .with_context(|| format!("{}: controller.manual.host is not set", path.display()))?;
            Ok(format!("http://{host}:{}", port_of(m)))
        }
        "coreweave" => {
            let cw = section("coreweave");
            let platform = cfg.platform.as_ref().and_then(|p| p.get("coreweave"));
            let pf = crate::tunnel::PortForward {
                kubeconfig: text(platform, "kubeconfig_path"),
                context: text(platform, "kube_context"),
                namespace: text(platform, "namespace").unwrap_or_else(|| "iris".into()),
                service: text(cw, "service_name").unwrap_or_else(|| "iris-controller-svc".into()),
                port: port_of(cw),
            };
            crate::tunnel::open(&pf, std::time::Duration::from_secs(90))
        }
        "gcp" => {
            let platform = cfg.platform.as_ref();
            let ssh = cfg.defaults.as_ref().and_then(|d| d.get("ssh"));
            let project = text(platform.and_then(|p| p.get("gcp")), "project_id").with_context(|| {
                format!(
                    "{}: platform.gcp.project_id is not set; it names the project the controller VM runs in",
                    path.display()
                )
            })?;
            let t = crate::tunnel::GcpSsh {
                project,
                label_prefix: text(platform, "label_prefix").unwrap_or_else(|| "iris".into()),
                port: port_of(section("gcp")),
                impersonate: text(ssh, "impersonate_service_account"),
                key_file: text(ssh, "key_file"),
            };
            crate::tunnel::open_gcp(&t, std::time::Duration::from_secs(90))
        }
        _ => anyhow::bail!(
            "{}: the controller is `{kind}` and the config has no defaults.worker.controller_address; \
             this build reaches local, manual, coreweave and gcp controllers: open a tunnel yourself \
             and pass --controller-url http://127.0.0.1:PORT",
            path.display()
        ),
    }
}

/// The config a command was pointed at (`--config`, else `--cluster`), loaded.
pub fn selected_config(
    config: Option<&Path>,
    cluster: Option<&str>,
) -> anyhow::Result<Option<(PathBuf, ClusterConfig)>> {
    let path = match (config, cluster) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(name)) => resolve_cluster(name)?,
        (None, None) => return Ok(None),
    };
    let cfg = config::load(&path)?;
    Ok(Some((path, cfg)))
}

/// The URL the command's flags select, or `None` to fall back to `IRIS_CONTROLLER_URL` and the
/// recorded local cluster.
pub fn explicit_url(
    controller_url: Option<String>,
    config: Option<&Path>,
    cluster: Option<&str>,
) -> anyhow::Result<Option<String>> {
    if controller_url.is_some() && config.is_some() {
        anyhow::bail!("pass either --controller-url or --config, not both");
    }
    if controller_url.is_some() {
        return Ok(controller_url);
    }
    match selected_config(config, cluster)? {
        Some((path, cfg)) => Ok(Some(controller_url_of(&cfg, &path)?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml: &str) -> ClusterConfig {
        config::parse(yaml, "x.yaml").expect("config")
    }

    #[test]
    fn a_config_names_its_controller() {
        let p = Path::new("/etc/iris/dev.yaml");
        let c = cfg("defaults:\n  worker:\n    controller_address: 10.0.0.2:10000\n");
        assert_eq!(
            controller_url_of(&c, p).expect("url"),
            "http://10.0.0.2:10000"
        );
        let c = cfg("controller: {local: {port: 10500}}\n");
        assert_eq!(
            controller_url_of(&c, p).expect("url"),
            "http://127.0.0.1:10500"
        );
        let c = cfg("controller: {gcp: {zone: x}}\n");
        let e = controller_url_of(&c, p).expect_err("remote").to_string();
        assert!(e.contains("platform.gcp.project_id"), "{e}");
        let c = cfg("name: my-dev\ncontroller: {local: {port: 0}}\n");
        assert_eq!(cluster_name(&c, p), "my-dev");
        assert_eq!(cluster_name(&cfg("{}"), p), "dev");
    }

    #[test]
    fn configs_are_listed_by_stem_and_the_first_directory_wins() {
        let a = tempfile::tempdir().expect("dir");
        let b = tempfile::tempdir().expect("dir");
        std::fs::write(a.path().join("dev.yaml"), "{}").expect("write");
        std::fs::write(b.path().join("dev.yaml"), "{}").expect("write");
        std::fs::write(b.path().join("prod.yml"), "{}").expect("write");
        std::fs::write(b.path().join("notes.txt"), "").expect("write");
        let found = list_configs(&[a.path().to_path_buf(), b.path().to_path_buf()]);
        assert_eq!(found.keys().collect::<Vec<_>>(), ["dev", "prod"]);
        assert_eq!(found["dev"], a.path().join("dev.yaml"));
    }

    #[test]
    fn url_and_config_together_are_refused() {
        let e = explicit_url(Some("http://x".into()), Some(Path::new("c.yaml")), None)
            .expect_err("both");
        assert!(
            e.to_string().contains("--controller-url or --config"),
            "{e}"
        );
        assert_eq!(
            explicit_url(Some("http://x".into()), None, None).expect("url"),
            Some("http://x".into())
        );
        assert_eq!(explicit_url(None, None, None).expect("none"), None);
    }
}
