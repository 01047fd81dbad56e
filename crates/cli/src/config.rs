//! Cluster YAML (reference §10): the parts a local cluster uses. Unknown keys are refused with
//! their path; sections that only matter to cloud platforms are accepted as they are.

use anyhow::Context;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // accepted for compatibility; read by later features
pub struct ClusterConfig {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub platform: Option<serde_yaml::Value>,
    #[serde(default)]
    pub controller: Option<serde_yaml::Value>,
    #[serde(default)]
    pub worker_provider: Option<serde_yaml::Value>,
    #[serde(default)]
    pub kubernetes_provider: Option<KubernetesProvider>,
    #[serde(default)]
    pub storage: Option<Storage>,
    #[serde(default)]
    pub auth: Option<AuthSection>,
    #[serde(default)]
    pub defaults: Option<serde_yaml::Value>,
    #[serde(default)]
    pub task_env: BTreeMap<String, String>,
    #[serde(default)]
    pub peers: BTreeMap<String, PeerSection>,
    #[serde(default)]
    pub scale_groups: BTreeMap<String, ScaleGroup>,
    // Published keys this controller accepts; those it does not act on are named by
    // [`ClusterConfig::warnings`].
    #[serde(default)]
    pub dashboard_url: Option<String>,
    #[serde(default)]
    pub finelog: Option<serde_yaml::Value>,
    #[serde(default)]
    pub endpoints: Option<serde_yaml::Value>,
    #[serde(default)]
    pub task_outputs: Option<serde_yaml::Value>,
    #[serde(default)]
    pub user_budget_defaults: Option<serde_yaml::Value>,
    #[serde(default)]
    pub user_budgets: Option<serde_yaml::Value>,
    #[serde(default)]
    pub federation_public_parent: Option<String>,
    #[serde(default)]
    pub budget_parent: Option<String>,
    #[serde(default)]
    pub budget_peers: Option<serde_yaml::Value>,
    #[serde(default)]
    pub tpu_pools: Option<serde_yaml::Value>,
    /// Infrastructure-as-code settings, owned by the provisioning tools (the reference does not
    /// read them either).
    #[serde(default)]
    #[allow(dead_code)]
    pub provisioning: Option<serde_yaml::Value>,
}

/// `kubernetes_provider`: run tasks as Pods admitted by Kueue instead of on worker daemons.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct KubernetesProvider {
    #[serde(default)]
    pub namespace: Option<String>,
    /// The operator's kubeconfig (never given to pods); unset: in-cluster service account.
    #[serde(default)]
    pub kubeconfig: Option<String>,
    /// Pinned context in that kubeconfig.
    #[serde(default)]
    pub kube_context: Option<String>,
    #[serde(default)]
    pub service_account: Option<String>,
    #[serde(default)]
    pub host_network: bool,
    #[serde(default)]
    pub cache_dir: Option<String>,
    #[serde(default)]
    #[allow(dead_code)] // accepted; cache eviction is the node's business here
    pub cache_max_age: Option<serde_yaml::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    pub node_health: Option<serde_yaml::Value>,
    /// Where pods reach the controller (required).
    #[serde(default)]
    pub controller_address: String,
    #[serde(default)]
    #[allow(dead_code)]
    pub service_cidr: Option<String>,
    #[serde(default)]
    pub kueue: KueueSection,
    /// Band name → PriorityClass name.
    #[serde(default)]
    pub priority_classes: BTreeMap<String, String>,
}

/// `kubernetes_provider.kueue`.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct KueueSection {
    #[serde(default)]
    pub cluster_queue: String,
    #[serde(default)]
    pub topologies: Option<iris_kube_model::TopologyMap>,
}

/// `peers.<id>`: a federation peer this cluster may hand jobs to.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    pub controller_address: String,
    /// The peer's cluster manifest name (accepted for compatibility; credentials come from our
    /// own signing key).
    #[serde(default)]
    #[allow(dead_code)]
    pub cluster: Option<String>,
    /// The peer's public key (PEM), as printed by `iris cluster init-keys` there. Validated.
    #[serde(default)]
    pub public_key: Option<String>,
}

/// `name` and `peers` as the controller's federation settings, validated.
pub fn federation(
    cfg: &ClusterConfig,
) -> anyhow::Result<iris_controller::federation::FederationConfig> {
    let name = cfg.name.clone().unwrap_or_default();
    if name == "local" {
        anyhow::bail!("name: `local` is reserved; choose another cluster name");
    }
    if !cfg.peers.is_empty() && name.is_empty() {
        anyhow::bail!(
            "name: a cluster with peers needs a name (peers know it as the requester id)"
        );
    }
    let mut out = iris_controller::federation::FederationConfig {
        cluster_name: name.clone(),
        ..Default::default()
    };
    for (id, p) in &cfg.peers {
        if id.is_empty() || id == "local" || *id == name {
            anyhow::bail!("peers.{id}: a peer id must be non-empty, not `local` and not this cluster's own name");
        }
        let url = url::Url::parse(&p.controller_address).map_err(|e| {
            anyhow::anyhow!("peers.{id}.controller_address: '{}' is not a URL ({e}); use e.g. http://10.0.0.5:10000", p.controller_address)
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            anyhow::bail!("peers.{id}.controller_address: use an http:// or https:// URL");
        }
        if let Some(pem) = &p.public_key {
            iris_auth::public_from_pem(pem)
                .map_err(|e| anyhow::anyhow!("peers.{id}.public_key: {e}"))?;
        }
        out.peers.push(iris_controller::federation::PeerConfig {
            id: id.clone(),
            address: p.controller_address.trim_end_matches('/').to_string(),
        });
    }
    Ok(out)
}

/// `storage:` — where the controller keeps its state.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct Storage {
    /// Local DB, logs and bundle cache (the controller's `--state-dir`).
    #[serde(default)]
    #[allow(dead_code)] // the state dir is always given on the command line here
    pub local_state_dir: Option<String>,
    /// Checkpoints and the rollout record: a local path or a file://, s3:// or gs:// URL.
    #[serde(default)]
    pub remote_state_dir: Option<String>,
}

impl ClusterConfig {
    /// `storage.remote_state_dir`, if set and non-empty.
    pub fn remote_state_dir(&self) -> Option<String> {
        self.storage
            .as_ref()
            .and_then(|s| s.remote_state_dir.clone())
            .filter(|s| !s.trim().is_empty())
    }

    /// One line per published key this config sets that this controller accepts but does not
    /// act on, naming the key and why.
    pub fn warnings(&self) -> Vec<String> {
        let set = |v: &Option<serde_yaml::Value>| v.as_ref().is_some_and(|v| !v.is_null());
        let text = |v: &Option<String>| v.as_ref().is_some_and(|v| !v.trim().is_empty());
        let mut out = Vec::new();
        let mut warn = |on: bool, key: &str, why: &str| {
            if on {
                out.push(format!(
                    "config key `{key}` is accepted but not acted on: {why}"
                ));
            }
        };
        warn(
            text(&self.dashboard_url),
            "dashboard_url",
            "job links use the address the dashboard is served on",
        );
        warn(
            set(&self.finelog),
            "finelog",
            "this controller serves task logs itself (`/system/log-server` is the controller)",
        );
        warn(
            set(&self.endpoints),
            "endpoints",
            "named system endpoints are not registered from the config (tasks register their own)",
        );
        warn(
            set(&self.task_outputs),
            "task_outputs",
            "task outputs are not uploaded",
        );
        warn(
            text(&self.federation_public_parent),
            "federation_public_parent",
            "capability URLs are not relayed through a parent",
        );
        warn(
            text(&self.budget_parent) || set(&self.budget_peers),
            "budget_parent / budget_peers",
            "budgets are not shared between federated clusters",
        );
        warn(
            set(&self.tpu_pools),
            "tpu_pools",
            "TPU pools are provisioned on GCP, which this controller does not drive",
        );
        out
    }

    /// The env every task starts with unless its job sets the same key: the published
    /// `defaults.task_env`, under `defaults.worker.task_env` (a worker's own entry wins, as the
    /// reference propagates it), and our older top-level `task_env` over both.
    /// `user_budget_defaults` and `user_budgets`, validated (the reference's defaults when
    /// absent: 1000 and INTERACTIVE).
    pub fn budgets(
        &self,
    ) -> anyhow::Result<(
        iris_controller::BudgetDefaults,
        Vec<iris_controller::BudgetTier>,
    )> {
        let mut defaults = iris_controller::BudgetDefaults::default();
        if let Some(d) = self.user_budget_defaults.as_ref().filter(|v| !v.is_null()) {
            let m = budget_map(d, "user_budget_defaults", &["budget_limit", "max_band"])?;
            if let Some(v) = m.get("budget_limit") {
                defaults.limit = budget_limit(v, "user_budget_defaults.budget_limit")?;
            }
            if let Some(v) = m.get("max_band") {
                defaults.max_band = budget_band(v, "user_budget_defaults.max_band")?;
            }
        }
        let mut tiers = Vec::new();
        let Some(list) = self.user_budgets.as_ref().filter(|v| !v.is_null()) else {
            return Ok((defaults, tiers));
        };
        let Some(list) = list.as_sequence() else {
            anyhow::bail!("user_budgets: expected a list of {{user_ids, budget_limit, max_band}}");
        };
        for (i, t) in list.iter().enumerate() {
            let at = format!("user_budgets[{i}]");
            let m = budget_map(t, &at, &["user_ids", "budget_limit", "max_band"])?;
            let user_ids = match m.get("user_ids").and_then(|v| v.as_sequence()) {
                Some(ids) => ids
                    .iter()
                    .map(|u| {
                        u.as_str()
                            .map(str::to_string)
                            .filter(|u| !u.trim().is_empty())
                            .ok_or_else(|| {
                                anyhow::anyhow!("{at}.user_ids: each entry must be a user name")
                            })
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?,
                None => anyhow::bail!("{at}.user_ids: required, a list of user names"),
            };
            let limit = match m.get("budget_limit") {
                Some(v) => budget_limit(v, &format!("{at}.budget_limit"))?,
                None => 0,
            };
            let max_band = match m.get("max_band") {
                Some(v) => budget_band(v, &format!("{at}.max_band"))?,
                None => anyhow::bail!(
                    "{at}.max_band: required (PRIORITY_BAND_SYSTEM, _PRODUCTION, _INTERACTIVE or _BATCH)"
                ),
            };
            tiers.push(iris_controller::BudgetTier {
                user_ids,
                limit,
                max_band,
            });
        }
        Ok((defaults, tiers))
    }

    /// `defaults.autoscaler.scale_down_delay` in milliseconds: how long a slice must be idle
    /// before the autoscaler stops it (the reference's default, 10 minutes, when unset). The
    /// published format: milliseconds as a number, or `{milliseconds: N}` / `{seconds: N}`.
    pub fn scale_down_delay_ms(&self) -> anyhow::Result<i64> {
        const KEY: &str = "defaults.autoscaler.scale_down_delay";
        let v = self
            .defaults
            .as_ref()
            .and_then(|d| d.get("autoscaler"))
            .and_then(|a| a.get("scale_down_delay"))
            .filter(|v| !v.is_null());
        let Some(v) = v else {
            return Ok(600_000);
        };
        let ms = if let Some(n) = v.as_f64().filter(|_| !v.is_bool()) {
            n
        } else if let Some(n) = v.get("milliseconds").and_then(|n| n.as_f64()) {
            n
        } else if let Some(n) = v.get("seconds").and_then(|n| n.as_f64()) {
            n * 1000.0
        } else {
            anyhow::bail!(
                "`{KEY}`: give a duration as milliseconds (e.g. 60000) or as {{seconds: 60}} / {{milliseconds: 60000}}"
            );
        };
        if !(ms.is_finite() && ms >= 0.0) {
            anyhow::bail!("`{KEY}`: must be a duration of 0 or more");
        }
        Ok(ms as i64)
    }

    pub fn task_env(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let section = |path: &[&str]| -> anyhow::Result<BTreeMap<String, String>> {
            let mut v = self.defaults.as_ref();
            for key in path {
                v = v.and_then(|x| x.get(*key));
            }
            let dotted = format!("defaults.{}", path.join("."));
            let Some(v) = v.filter(|v| !v.is_null()) else {
                return Ok(BTreeMap::new());
            };
            let map = v.as_mapping().ok_or_else(|| {
                anyhow::anyhow!("`{dotted}` must be a map of variable names to values")
            })?;
            let mut out = BTreeMap::new();
            for (k, val) in map {
                let key = k
                    .as_str()
                    .ok_or_else(|| anyhow::anyhow!("`{dotted}`: variable names must be strings"))?;
                if val.is_mapping() || val.is_sequence() {
                    anyhow::bail!(
                        "`{dotted}.{key}` must be a string, number or boolean (write lists and maps as a quoted string)"
                    );
                }
                out.insert(key.to_string(), attr_string(val));
            }
            Ok(out)
        };
        let mut env = section(&["task_env"])?;
        env.extend(section(&["worker", "task_env"])?);
        env.extend(self.task_env.clone());
        Ok(env)
    }
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct ScaleGroup {
    #[serde(default)]
    pub num_vms: Option<u32>,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub buffer_slices: Option<u32>,
    #[serde(default)]
    pub max_slices: Option<u32>,
    #[serde(default)]
    pub min_slices: Option<u32>,
    #[serde(default)]
    pub priority: Option<i64>,
    #[serde(default)]
    pub slice_template: Option<serde_yaml::Value>,
    #[serde(default)]
    pub worker: Option<WorkerSection>,
    #[serde(default)]
    pub attributes: BTreeMap<String, serde_yaml::Value>,
    #[serde(default)]
    pub zones: Option<serde_yaml::Value>,
    // Autoscaler settings of the published schema, accepted; local groups start their slices
    // at once.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub scale_up_rate_limit: Option<u32>,
    #[serde(default)]
    pub scale_down_rate_limit: Option<u32>,
    #[serde(default)]
    pub quota_pool: Option<String>,
    #[serde(default)]
    pub allocation_tier: Option<i64>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct WorkerSection {
    #[serde(default)]
    pub attributes: BTreeMap<String, serde_yaml::Value>,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub env: Option<serde_yaml::Value>,
    /// The worker's cache directory on the VM (local workers use the state dir).
    #[serde(default)]
    pub cache_dir: Option<String>,
}

/// `auth:` (reference §5). Secret references are resolved when the controller starts.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // federation_peers, allowed_submitters, iap: read once federation and IAP land
pub struct AuthSection {
    #[serde(default)]
    pub provider: Option<String>,
    /// A secret reference (`file:PATH`, `env:VAR`), or an ordered list of them: the first that
    /// resolves is used, as in the published config.
    #[serde(default, deserialize_with = "string_or_list")]
    pub signing_key: Vec<String>,
    #[serde(default)]
    pub previous_public_keys: Vec<String>,
    #[serde(default)]
    pub trusted_cidrs: Vec<String>,
    #[serde(default)]
    pub admin_users: Vec<String>,
    #[serde(default)]
    pub user_roles: BTreeMap<String, String>,
    #[serde(default)]
    pub optional: bool,
    #[serde(default)]
    pub federation_peers: BTreeMap<String, String>,
    #[serde(default)]
    pub allowed_submitters: Vec<String>,
    #[serde(default)]
    pub iap: Option<IapSection>,
    #[serde(default)]
    pub principal_directory: Option<serde_yaml::Value>,
}

/// Which arm of the published one-of (`gcp`, `manual`, `local`, `coreweave`) a `platform:` or
/// `controller:` section sets; `none` when it sets none.
pub fn oneof_arm(section: &Option<serde_yaml::Value>) -> &'static str {
    ["gcp", "manual", "local", "coreweave"]
        .into_iter()
        .find(|k| section.as_ref().and_then(|v| v.get(*k)).is_some())
        .unwrap_or("none")
}

/// A string or a list of strings, as a list (the published `SecretRefSpec`).
fn string_or_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) if s.trim().is_empty() => Vec::new(),
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// `auth.iap`: requests arrive through an identity-aware proxy that signs each one.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // url and the OAuth client are for the browser login flow, not verification
pub struct IapSection {
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub oauth_client_id: Option<String>,
    #[serde(default)]
    pub oauth_client_secret: Option<String>,
    #[serde(default)]
    pub programmatic_audiences: Vec<String>,
    /// The `aud` every assertion must carry (required).
    #[serde(default)]
    pub signed_header_audience: String,
    /// A JWKS file with the proxy's ES256 public keys (Google publishes them at
    /// https://www.gstatic.com/iap/verify/public_key-jwk; mirror that file here).
    #[serde(default)]
    pub jwks_file: Option<String>,
    #[serde(default)]
    pub unprovisioned_role: Option<String>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default)]
    pub cpu: Option<f64>,
    #[serde(default)]
    pub ram: Option<String>,
    #[serde(default)]
    pub disk: Option<String>,
    #[serde(default)]
    pub device_type: Option<String>,
    #[serde(default)]
    pub device_variant: Option<String>,
    #[serde(default)]
    pub device_count: Option<i32>,
    #[serde(default)]
    pub capacity_type: Option<String>,
    #[serde(default)]
    pub preemptible: Option<bool>,
}

/// The embedded default: one 16-core CPU group.
pub const DEFAULT_LOCAL: &str = r#"
name: local-dev
platform: {local: {}}
controller: {local: {port: 0}}
worker_provider: {}
scale_groups:
  cpu:
    num_vms: 2
    resources: {cpu: 16, ram: 32GB, disk: 100GB, device_type: cpu, device_variant: cpu, capacity_type: on-demand}
    buffer_slices: 0
    max_slices: 4
    slice_template: {num_vms: 1, local: {}}
"#;

pub fn parse(text: &str, origin: &str) -> anyhow::Result<ClusterConfig> {
    let de = serde_yaml::Deserializer::from_str(text);
    let c: ClusterConfig = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let hint = closest_key_hint(&inner);
        anyhow::anyhow!("{origin}: invalid config at `{path}`: {inner}{hint}")
    })?;
    c.task_env()
        .map_err(|e| anyhow::anyhow!("{origin}: invalid config: {e}"))?;
    Ok(c)
}

/// For serde's "unknown field `x`, expected one of `a`, `b`" message: " (did you mean `a`?)"
/// when one expected key is close to the misspelt one, else nothing.
fn closest_key_hint(message: &str) -> String {
    let Some((_, rest)) = message.split_once("unknown field `") else {
        return String::new();
    };
    let Some((got, rest)) = rest.split_once('`') else {
        return String::new();
    };
    let Some((_, expected)) = rest.split_once("expected") else {
        return String::new();
    };
    let best = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|k| (strsim::levenshtein(got, k), k))
        .min();
    match best {
        Some((d, k)) if d <= (got.len() / 3).max(2) => format!(" (did you mean `{k}`?)"),
        _ => String::new(),
    }
}

pub fn load(path: &std::path::Path) -> anyhow::Result<ClusterConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config {}", path.display()))?;
    parse(&text, &path.display().to_string())
}

pub fn attr_string(v: &serde_yaml::Value) -> String {
    match v {
        serde_yaml::Value::String(s) => s.clone(),
        serde_yaml::Value::Bool(b) => b.to_string(),
        serde_yaml::Value::Number(n) => n.to_string(),
        other => serde_yaml::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}

fn budget_map<'a>(
    v: &'a serde_yaml::Value,
    at: &str,
    keys: &[&str],
) -> anyhow::Result<BTreeMap<&'a str, &'a serde_yaml::Value>> {
    let Some(m) = v.as_mapping() else {
        anyhow::bail!("{at}: expected a mapping with {}", keys.join(", "));
    };
    let mut out = BTreeMap::new();
    for (k, v) in m {
        let Some(k) = k.as_str() else {
            anyhow::bail!("{at}: keys must be strings");
        };
        if !keys.contains(&k) {
            anyhow::bail!("{at}.{k}: unknown key; valid keys are {}", keys.join(", "));
        }
        out.insert(k, v);
    }
    Ok(out)
}

fn budget_limit(v: &serde_yaml::Value, at: &str) -> anyhow::Result<i64> {
    v.as_i64()
        .filter(|n| *n >= 0)
        .ok_or_else(|| anyhow::anyhow!("{at}: expected a whole number >= 0 (0 = unlimited)"))
}

fn budget_band(v: &serde_yaml::Value, at: &str) -> anyhow::Result<iris_types::Band> {
    let band = match (v.as_str(), v.as_i64()) {
        (Some(s), _) => iris_types::Band::parse(s).ok(),
        (_, Some(n)) => i32::try_from(n).ok().and_then(iris_types::Band::from_code),
        _ => None,
    };
    band.ok_or_else(|| {
        anyhow::anyhow!(
            "{at}: expected PRIORITY_BAND_SYSTEM, PRIORITY_BAND_PRODUCTION, PRIORITY_BAND_INTERACTIVE or PRIORITY_BAND_BATCH"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_parses_and_unknown_keys_are_refused() {
        let c = parse(DEFAULT_LOCAL, "default").expect("parses");
        assert_eq!(c.scale_groups["cpu"].resources.cpu, Some(16.0));
        let bad = "scale_groups:\n  cpu:\n    resources: {cpu: 4, rams: 1GB}\n";
        let e = parse(bad, "x.yaml").expect_err("unknown key").to_string();
        assert!(e.contains("scale_groups.cpu.resources"), "{e}");
        assert!(
            e.contains("rams") && e.contains("did you mean `ram`?"),
            "{e}"
        );
        let e = parse("kubernetes_provider: {namespce: x}\n", "x.yaml")
            .expect_err("misspelt")
            .to_string();
        assert!(e.contains("did you mean `namespace`?"), "{e}");
        let e = parse("zzzzzz: 1\n", "x.yaml")
            .expect_err("unknown")
            .to_string();
        assert!(!e.contains("did you mean"), "{e}");
    }

    #[test]
    fn task_env_from_the_published_keys() {
        let c = parse(
            "defaults:\n  task_env: {A: from-defaults, B: from-defaults, N: 3}\n  worker:\n    task_env: {B: from-worker}\ntask_env: {C: top}\n",
            "x.yaml",
        )
        .expect("parses");
        let env = c.task_env().expect("task env");
        assert_eq!(env["A"], "from-defaults");
        assert_eq!(env["B"], "from-worker");
        assert_eq!(env["C"], "top");
        assert_eq!(env["N"], "3");
        let e = parse("defaults:\n  task_env: {A: [1, 2]}\n", "x.yaml")
            .expect_err("a list value")
            .to_string();
        assert!(e.contains("defaults.task_env.A"), "{e}");
        let e = parse("defaults:\n  task_env: [A]\n", "x.yaml")
            .expect_err("not a map")
            .to_string();
        assert!(e.contains("defaults.task_env"), "{e}");
    }

    #[test]
    fn storage_remote_state_dir() {
        let c = parse("storage:\n  remote_state_dir: gs://b/iris\n", "x.yaml").expect("parses");
        assert_eq!(c.remote_state_dir().as_deref(), Some("gs://b/iris"));
        let c = parse("storage: {remote_state_dir: ''}\n", "x.yaml").expect("parses");
        assert_eq!(c.remote_state_dir(), None);
        let e = parse("storage: {remote_dir: x}\n", "x.yaml").expect_err("unknown");
        assert!(e.to_string().contains("storage"), "{e}");
    }
}
