//! The served resource table and the discovery documents built from it.

use serde_json::{json, Value};

/// Behaviour the server attaches to a resource beyond plain storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Special {
    Plain,
    Pod,
    Node,
    Namespace,
    PriorityClass,
    PodDisruptionBudget,
    Workload,
    WorkloadPriorityClass,
    LocalQueue,
}

/// One resource served by the fake API server.
#[derive(Debug)]
pub(crate) struct ResourceDef {
    /// API group, `""` for core.
    pub group: &'static str,
    /// Served versions; every version reads and writes the same stored objects.
    pub versions: &'static [&'static str],
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Subresources (`status`, `log`, `eviction`).
    pub subresources: &'static [&'static str],
    pub short_names: &'static [&'static str],
    pub special: Special,
}

impl ResourceDef {
    pub(crate) fn has_status(&self) -> bool {
        self.subresources.contains(&"status")
    }

    pub(crate) fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    /// `pods` or `workloads.kueue.x-k8s.io`, as the API server names a resource in messages.
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `Pod` or `Workload.kueue.x-k8s.io`, as the API server names a kind in `Invalid` messages.
    pub(crate) fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
}

const S: &[&str] = &["status"];
const NONE: &[&str] = &[];

macro_rules! res {
    ($group:expr, $versions:expr, $plural:expr, $singular:expr, $kind:expr, $ns:expr, $subs:expr, $short:expr, $special:expr) => {
        ResourceDef {
            group: $group,
            versions: $versions,
            plural: $plural,
            singular: $singular,
            kind: $kind,
            namespaced: $ns,
            subresources: $subs,
            short_names: $short,
            special: $special,
        }
    };
}

const V1: &[&str] = &["v1"];
const KUEUE: &[&str] = &["v1beta1"];
const KUEUE_TOPOLOGY: &[&str] = &["v1beta1", "v1alpha1"];

/// Every resource the server knows. Index into this table is a resource's storage id.
pub(crate) static RESOURCES: &[ResourceDef] = &[
    res!(
        "",
        V1,
        "pods",
        "pod",
        "Pod",
        true,
        &["status", "log", "eviction"],
        &["po"],
        Special::Pod
    ),
    res!(
        "",
        V1,
        "nodes",
        "node",
        "Node",
        false,
        S,
        &["no"],
        Special::Node
    ),
    res!(
        "",
        V1,
        "namespaces",
        "namespace",
        "Namespace",
        false,
        S,
        &["ns"],
        Special::Namespace
    ),
    res!(
        "",
        V1,
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        NONE,
        &["cm"],
        Special::Plain
    ),
    res!(
        "",
        V1,
        "secrets",
        "secret",
        "Secret",
        true,
        NONE,
        NONE,
        Special::Plain
    ),
    res!(
        "",
        V1,
        "events",
        "event",
        "Event",
        true,
        NONE,
        &["ev"],
        Special::Plain
    ),
    res!(
        "",
        V1,
        "services",
        "service",
        "Service",
        true,
        S,
        &["svc"],
        Special::Plain
    ),
    res!(
        "",
        V1,
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        NONE,
        &["sa"],
        Special::Plain
    ),
    res!(
        "",
        V1,
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        S,
        &["pvc"],
        Special::Plain
    ),
    res!(
        "apps",
        V1,
        "deployments",
        "deployment",
        "Deployment",
        true,
        S,
        &["deploy"],
        Special::Plain
    ),
    res!(
        "coordination.k8s.io",
        V1,
        "leases",
        "lease",
        "Lease",
        true,
        NONE,
        NONE,
        Special::Plain
    ),
    res!(
        "policy",
        V1,
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        S,
        &["pdb"],
        Special::PodDisruptionBudget
    ),
    res!(
        "scheduling.k8s.io",
        V1,
        "priorityclasses",
        "priorityclass",
        "PriorityClass",
        false,
        NONE,
        &["pc"],
        Special::PriorityClass
    ),
    res!(
        "kueue.x-k8s.io",
        KUEUE,
        "workloads",
        "workload",
        "Workload",
        true,
        S,
        &["wl"],
        Special::Workload
    ),
    res!(
        "kueue.x-k8s.io",
        KUEUE,
        "localqueues",
        "localqueue",
        "LocalQueue",
        true,
        S,
        &["queue", "queues", "lq"],
        Special::LocalQueue
    ),
    res!(
        "kueue.x-k8s.io",
        KUEUE,
        "clusterqueues",
        "clusterqueue",
        "ClusterQueue",
        false,
        S,
        &["cq"],
        Special::Plain
    ),
    res!(
        "kueue.x-k8s.io",
        KUEUE,
        "resourceflavors",
        "resourceflavor",
        "ResourceFlavor",
        false,
        NONE,
        &["flavor", "flavors", "rf"],
        Special::Plain
    ),
    res!(
        "kueue.x-k8s.io",
        KUEUE,
        "workloadpriorityclasses",
        "workloadpriorityclass",
        "WorkloadPriorityClass",
        false,
        NONE,
        NONE,
        Special::WorkloadPriorityClass
    ),
    res!(
        "kueue.x-k8s.io",
        KUEUE_TOPOLOGY,
        "topologies",
        "topology",
        "Topology",
        false,
        NONE,
        NONE,
        Special::Plain
    ),
];

/// Storage ids of the resources the simulation touches.
pub(crate) mod id {
    pub const PODS: usize = 0;
    pub const NODES: usize = 1;
    pub const NAMESPACES: usize = 2;
    pub const CONFIGMAPS: usize = 3;
    pub const SECRETS: usize = 4;
    pub const PDBS: usize = 11;
    pub const PRIORITY_CLASSES: usize = 12;
    pub const WORKLOADS: usize = 13;
    pub const LOCAL_QUEUES: usize = 14;
    pub const WORKLOAD_PRIORITY_CLASSES: usize = 17;
}

pub(crate) fn def(id: usize) -> &'static ResourceDef {
    &RESOURCES[id]
}

/// The resource `plural` served at `group/version`.
pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.plural == plural && r.versions.contains(&version))
}

/// Groups other than core, with their versions (preferred first).
fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        let entry = match out.iter_mut().position(|(g, _)| *g == r.group) {
            Some(i) => &mut out[i].1,
            None => {
                out.push((r.group, Vec::new()));
                let last = out.len() - 1;
                &mut out[last].1
            }
        };
        for v in r.versions {
            if !entry.contains(v) {
                entry.push(v);
            }
        }
    }
    out
}

pub(crate) fn group_versions(group: &str) -> Option<Vec<&'static str>> {
    groups()
        .into_iter()
        .find(|(g, _)| *g == group)
        .map(|(_, v)| v)
}

fn group_json(group: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "name": group,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
    })
}

/// `GET /api`.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// `GET /apis`.
pub(crate) fn group_list() -> Value {
    let groups: Vec<Value> = groups().iter().map(|(g, v)| group_json(g, v)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/{group}`.
pub(crate) fn group(group: &str) -> Option<Value> {
    let versions = group_versions(group)?;
    let mut g = group_json(group, &versions);
    if let Value::Object(m) = &mut g {
        m.insert("kind".into(), json!("APIGroup"));
        m.insert("apiVersion".into(), json!("v1"));
    }
    Some(g)
}

fn verbs(r: &ResourceDef) -> Vec<&'static str> {
    if r.special == Special::Namespace {
        return vec![
            "create", "delete", "get", "list", "patch", "update", "watch",
        ];
    }
    vec![
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ]
}

/// `GET /api/v1` or `GET /apis/{group}/{version}`.
pub(crate) fn resource_list(group: &str, version: &str) -> Option<Value> {
    let served: Vec<&ResourceDef> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.versions.contains(&version))
        .collect();
    if served.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for r in served {
        resources.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs(r),
            "shortNames": r.short_names,
            "storageVersionHash": "",
        }));
        for sub in r.subresources {
            let (kind, verbs): (&str, Vec<&str>) = match *sub {
                "status" => (r.kind, vec!["get", "patch", "update"]),
                "log" => ("Pod", vec!["get"]),
                "eviction" => ("Eviction", vec!["create"]),
                _ => (r.kind, vec!["get"]),
            };
            let mut entry = json!({
                "name": format!("{}/{}", r.plural, sub),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": verbs,
            });
            if *sub == "eviction" {
                if let Value::Object(m) = &mut entry {
                    m.insert("group".into(), json!("policy"));
                    m.insert("version".into(), json!("v1"));
                }
            }
            resources.push(entry);
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": if group.is_empty() { version.to_string() } else { format!("{group}/{version}") },
        "resources": resources,
    }))
}

/// `GET /version`.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "gitVersion": "v1.37.0-iris-kube-testkit",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_table() {
        assert_eq!(def(id::PODS).plural, "pods");
        assert_eq!(def(id::NODES).plural, "nodes");
        assert_eq!(def(id::NAMESPACES).plural, "namespaces");
        assert_eq!(def(id::CONFIGMAPS).plural, "configmaps");
        assert_eq!(def(id::SECRETS).plural, "secrets");
        assert_eq!(def(id::PDBS).plural, "poddisruptionbudgets");
        assert_eq!(def(id::PRIORITY_CLASSES).plural, "priorityclasses");
        assert_eq!(def(id::WORKLOADS).plural, "workloads");
        assert_eq!(def(id::LOCAL_QUEUES).plural, "localqueues");
        assert_eq!(
            def(id::WORKLOAD_PRIORITY_CLASSES).plural,
            "workloadpriorityclasses"
        );
    }

    #[test]
    fn topologies_served_at_both_versions() {
        assert!(find("kueue.x-k8s.io", "v1alpha1", "topologies").is_some());
        assert!(find("kueue.x-k8s.io", "v1beta1", "topologies").is_some());
        assert!(find("kueue.x-k8s.io", "v1alpha1", "workloads").is_none());
        assert_eq!(
            group_versions("kueue.x-k8s.io"),
            Some(vec!["v1beta1", "v1alpha1"])
        );
    }
}
