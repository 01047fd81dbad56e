//! CoreWeave topology arithmetic for Kueue topology-aware scheduling (reference §4).
//!
//! A multi-node GPU gang names a *level* (`group_by`) of the cluster's Kueue Topology. This
//! module picks the level for a gang ([`gang_level`]), computes the per-rack slice of a
//! multi-rack NVL72 gang ([`balanced_split`]) and turns a level into the pod annotations Kueue
//! reads ([`annotations`]).
//!
//! NVL72 background: a GB200/GB300 rack holds [`RACK_SIZE`] nodes sharing one NVLink domain,
//! but CoreWeave keeps only [`SCHEDULABLE_RACK_NODES`] of them schedulable at a time. A gang of
//! up to that many pods is bound hard to one rack; a larger one is cut into equal slices, one
//! per rack, each larger than half a rack so two slices can never share a rack.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::manifest::ManifestError;

/// InfiniBand fabric label (coarsest level).
pub const LABEL_FABRIC: &str = "backend.coreweave.cloud/fabric";
/// InfiniBand superpod label.
pub const LABEL_SUPERPOD: &str = "backend.coreweave.cloud/superpod";
/// InfiniBand leaf-switch group label (finest IB level).
pub const LABEL_LEAFGROUP: &str = "backend.coreweave.cloud/leafgroup";
/// NVLink domain label; only GB200/GB300 nodes carry it (one rack = one domain).
pub const LABEL_NVLINK_DOMAIN: &str = "ds.coreweave.com/nvlink.domain";
/// The per-node topology level.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";

/// Nodes in one NVL72 rack (and so in one NVLink domain).
pub const RACK_SIZE: u32 = 18;
/// Nodes of a rack that CoreWeave keeps schedulable at once.
pub const SCHEDULABLE_RACK_NODES: u32 = 16;
/// GPUs on one NVL72 node; a pod requesting this many saturates its node.
pub const NVL72_GPUS_PER_NODE: u32 = 4;
/// Smallest rack slice: more than half a rack, so two slices cannot share one rack.
pub const MIN_RACK_SLICE: u32 = RACK_SIZE / 2 + 1;
/// Instance-type / device-variant prefixes of NVL72 SKUs (compared case-insensitively).
pub const NVL72_PREFIXES: [&str; 2] = ["gb200", "gb300"];

/// Kueue annotation: the whole pod set prefers one domain of this level.
pub const ANNOTATION_PREFERRED: &str = "kueue.x-k8s.io/podset-preferred-topology";
/// Kueue annotation: the whole pod set must fit one domain of this level.
pub const ANNOTATION_REQUIRED: &str = "kueue.x-k8s.io/podset-required-topology";
/// Kueue annotation: each slice must fit one domain of this level.
pub const ANNOTATION_SLICE_REQUIRED: &str = "kueue.x-k8s.io/podset-slice-required-topology";
/// Kueue annotation: pods per slice.
pub const ANNOTATION_SLICE_SIZE: &str = "kueue.x-k8s.io/podset-slice-size";
/// Kueue annotation: no topology constraint, but still accounted by TAS.
pub const ANNOTATION_UNCONSTRAINED: &str = "kueue.x-k8s.io/podset-unconstrained-topology";

/// Why a gang shape cannot be placed. The texts are the reference's, so users see the same
/// guidance whichever implementation rejected them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// A gang of zero pods.
    #[error("gang size must be positive, got {0}")]
    EmptyGang(u32),
    /// The fewest racks that hold the gang do not split it evenly.
    #[error(
        "{nodes} nodes do not divide evenly across {racks} racks (<= {SCHEDULABLE_RACK_NODES} nodes each); \
         a multi-rack NVL72 gang must split into equal {MIN_RACK_SLICE}-{SCHEDULABLE_RACK_NODES} node rack \
         slices (e.g. 20, 24, 32, 48)"
    )]
    UnevenSplit {
        /// Gang size.
        nodes: u32,
        /// Racks needed.
        racks: u32,
    },
    /// The even split leaves slices of half a rack or less.
    #[error(
        "{nodes} nodes would place {racks} racks of {slice}, but a rack slice must exceed half a rack \
         ({MIN_RACK_SLICE}+ of {RACK_SIZE} nodes) to keep one slice per rack; use a larger gang \
         (e.g. 20, 24, 32, 48)"
    )]
    SliceTooSmall {
        /// Gang size.
        nodes: u32,
        /// Racks needed.
        racks: u32,
        /// Pods per rack.
        slice: u32,
    },
    /// Sliced placement with pods that do not fill their node.
    #[error(
        "sliced multi-rack placement requires node-saturating NVL72 pods ({NVL72_GPUS_PER_NODE} GPUs each); got {0}"
    )]
    NotNodeSaturating(u32),
    /// A hard single-NVLink-domain gang larger than one rack can hold.
    #[error(
        "{0} replicas cannot share one NVLink domain (at most {SCHEDULABLE_RACK_NODES} schedulable nodes per \
         rack); use group_by nvlink.domain.sliced with {NVL72_GPUS_PER_NODE} GPUs per pod for a multi-rack gang"
    )]
    RackOverflow(u32),
    /// An NVL72 NodePool size that is not a whole number of racks.
    #[error(
        "NVL72 node pools are sized in whole racks: {0} nodes is not a multiple of {RACK_SIZE}"
    )]
    PartialRack(u32),
}

/// The built-in coscheduling levels (`coscheduling.group_by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupBy {
    /// `leafgroup`: soft InfiniBand leaf-group colocation (H100 and other non-NVL72 GPUs).
    Leafgroup,
    /// `nvlink.domain`: hard single NVLink domain (one rack).
    NvlinkDomain,
    /// `nvlink.domain.preferred`: soft NVLink-domain packing (explicit configuration only).
    NvlinkDomainPreferred,
    /// `nvlink.domain.sliced`: balanced per-rack slices, each hard-bound to one NVLink domain.
    NvlinkDomainSliced,
}

impl GroupBy {
    /// Every built-in level.
    pub const ALL: [GroupBy; 4] = [
        GroupBy::Leafgroup,
        GroupBy::NvlinkDomain,
        GroupBy::NvlinkDomainPreferred,
        GroupBy::NvlinkDomainSliced,
    ];

    /// The `group_by` string.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Leafgroup => "leafgroup",
            GroupBy::NvlinkDomain => "nvlink.domain",
            GroupBy::NvlinkDomainPreferred => "nvlink.domain.preferred",
            GroupBy::NvlinkDomainSliced => "nvlink.domain.sliced",
        }
    }

    /// Parses a built-in level name; custom levels from `kueue.topologies` give `None`.
    pub fn parse(s: &str) -> Option<GroupBy> {
        GroupBy::ALL.into_iter().find(|g| g.as_str() == s)
    }
}

impl fmt::Display for GroupBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a level's node label constrains Kueue placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopologyMode {
    /// The whole pod set prefers one domain (soft).
    Preferred,
    /// The whole pod set must fit one domain (hard).
    Required,
    /// The pod set is cut into balanced rack slices, each required in one domain.
    Slice,
}

/// What one `group_by` level binds to (`kubernetes_provider.kueue.topologies.<group_by>`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyBinding {
    /// Node label of the Topology level the constraint names.
    pub node_label: String,
    /// Hard, soft or sliced.
    pub mode: TopologyMode,
    /// Optional soft whole-pod-set preference at a coarser level (used with `slice`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coarse_preferred_label: Option<String>,
}

/// `group_by` → binding. Sorted, so error messages and iteration are deterministic.
pub type TopologyMap = BTreeMap<String, TopologyBinding>;

/// The CoreWeave default bindings (§4.3), used when `kueue.topologies` is unset or empty.
pub fn default_topologies() -> TopologyMap {
    let bind = |label: &str, mode, coarse: Option<&str>| TopologyBinding {
        node_label: label.to_string(),
        mode,
        coarse_preferred_label: coarse.map(str::to_string),
    };
    BTreeMap::from([
        (
            GroupBy::Leafgroup.as_str().to_string(),
            bind(LABEL_LEAFGROUP, TopologyMode::Preferred, None),
        ),
        (
            GroupBy::NvlinkDomain.as_str().to_string(),
            bind(LABEL_NVLINK_DOMAIN, TopologyMode::Required, None),
        ),
        (
            GroupBy::NvlinkDomainPreferred.as_str().to_string(),
            bind(LABEL_NVLINK_DOMAIN, TopologyMode::Preferred, None),
        ),
        (
            GroupBy::NvlinkDomainSliced.as_str().to_string(),
            bind(
                LABEL_NVLINK_DOMAIN,
                TopologyMode::Slice,
                Some(LABEL_LEAFGROUP),
            ),
        ),
    ])
}

/// True for NVL72 SKUs: an instance type or device variant starting with `gb200`/`gb300`,
/// case-insensitively (`GB200`, `gb300-4x`).
pub fn is_nvl72(instance_type_or_variant: &str) -> bool {
    let lower = instance_type_or_variant.trim().to_ascii_lowercase();
    NVL72_PREFIXES.iter().any(|p| lower.starts_with(p))
}

/// Racks for an NVL72 NodePool of `max_nodes` nodes (`targetRacks`); partial racks are refused.
pub fn target_racks(max_nodes: u32) -> Result<u32, TopologyError> {
    if !max_nodes.is_multiple_of(RACK_SIZE) {
        return Err(TopologyError::PartialRack(max_nodes));
    }
    Ok(max_nodes / RACK_SIZE)
}

/// Splits a multi-rack NVL72 gang of `nodes` pods evenly over the fewest racks that hold at most
/// [`SCHEDULABLE_RACK_NODES`] each. Returns `(racks, slice)`; the slice must exceed half a rack.
///
/// A gang of 10–16 yields one slice of the whole gang.
pub fn balanced_split(nodes: u32) -> Result<(u32, u32), TopologyError> {
    if nodes == 0 {
        return Err(TopologyError::EmptyGang(nodes));
    }
    let racks = nodes.div_ceil(SCHEDULABLE_RACK_NODES);
    if !nodes.is_multiple_of(racks) {
        return Err(TopologyError::UnevenSplit { nodes, racks });
    }
    let slice = nodes / racks;
    if slice < MIN_RACK_SLICE {
        return Err(TopologyError::SliceTooSmall {
            nodes,
            racks,
            slice,
        });
    }
    Ok((racks, slice))
}

/// The level a GPU gang of `replicas` pods binds to (§4.2).
///
/// Non-NVL72 variants (H100, …) use [`GroupBy::Leafgroup`] at any size. NVL72 gangs of up to
/// [`SCHEDULABLE_RACK_NODES`] use [`GroupBy::NvlinkDomain`] (the GPU count is not checked);
/// larger ones need node-saturating pods and a valid [`balanced_split`] and use
/// [`GroupBy::NvlinkDomainSliced`]. A single replica is not a gang: callers only ask for
/// `replicas > 1` (the function still answers for 1, as the §4.4 table does).
pub fn gang_level(
    variant: &str,
    replicas: u32,
    gpus_per_pod: u32,
) -> Result<GroupBy, TopologyError> {
    if replicas == 0 {
        return Err(TopologyError::EmptyGang(replicas));
    }
    if !is_nvl72(variant) {
        return Ok(GroupBy::Leafgroup);
    }
    if replicas <= SCHEDULABLE_RACK_NODES {
        return Ok(GroupBy::NvlinkDomain);
    }
    if gpus_per_pod != NVL72_GPUS_PER_NODE {
        return Err(TopologyError::NotNodeSaturating(gpus_per_pod));
    }
    balanced_split(replicas)?;
    Ok(GroupBy::NvlinkDomainSliced)
}

/// The Kueue topology annotations for a gang member (§4.3).
///
/// `overrides` is `kubernetes_provider.kueue.topologies`; when it is `None` or empty the
/// CoreWeave defaults apply, otherwise it replaces them entirely. A `group_by` missing from the
/// map is an error naming the known levels. Rules:
/// * `required` on the NVLink-domain label refuses gangs above [`SCHEDULABLE_RACK_NODES`];
/// * `slice` requires [`NVL72_GPUS_PER_NODE`] GPUs per pod and a valid [`balanced_split`], and
///   adds the slice size plus the binding's coarse preference, if any.
pub fn annotations(
    group_by: &str,
    num_tasks: u32,
    gpus_per_pod: u32,
    overrides: Option<&TopologyMap>,
) -> Result<BTreeMap<String, String>, ManifestError> {
    let defaults;
    let map = match overrides {
        Some(m) if !m.is_empty() => m,
        _ => {
            defaults = default_topologies();
            &defaults
        }
    };
    let binding = map
        .get(group_by)
        .ok_or_else(|| ManifestError::UnknownGroupBy {
            group_by: group_by.to_string(),
            known: map.keys().cloned().collect(),
        })?;
    let mut out = BTreeMap::new();
    match binding.mode {
        TopologyMode::Preferred => {
            out.insert(ANNOTATION_PREFERRED.to_string(), binding.node_label.clone());
        }
        TopologyMode::Required => {
            if binding.node_label == LABEL_NVLINK_DOMAIN && num_tasks > SCHEDULABLE_RACK_NODES {
                return Err(TopologyError::RackOverflow(num_tasks).into());
            }
            out.insert(ANNOTATION_REQUIRED.to_string(), binding.node_label.clone());
        }
        TopologyMode::Slice => {
            if gpus_per_pod != NVL72_GPUS_PER_NODE {
                return Err(TopologyError::NotNodeSaturating(gpus_per_pod).into());
            }
            let (_racks, slice) = balanced_split(num_tasks)?;
            out.insert(
                ANNOTATION_SLICE_REQUIRED.to_string(),
                binding.node_label.clone(),
            );
            out.insert(ANNOTATION_SLICE_SIZE.to_string(), slice.to_string());
            if let Some(coarse) = &binding.coarse_preferred_label {
                out.insert(ANNOTATION_PREFERRED.to_string(), coarse.clone());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The §4.4 table: `req 1xN`, `slice RxS` or `INVALID`, for GB200 with 4 GPUs per pod.
    fn shape(n: u32) -> Result<String, String> {
        let level = gang_level("GB200", n, NVL72_GPUS_PER_NODE).map_err(|e| e.to_string())?;
        let ann =
            annotations(level.as_str(), n, NVL72_GPUS_PER_NODE, None).map_err(|e| e.to_string())?;
        match level {
            GroupBy::NvlinkDomain => {
                assert_eq!(
                    ann.get(ANNOTATION_REQUIRED).map(String::as_str),
                    Some(LABEL_NVLINK_DOMAIN)
                );
                Ok(format!("req 1x{n}"))
            }
            GroupBy::NvlinkDomainSliced => {
                let (r, s) = balanced_split(n).map_err(|e| e.to_string())?;
                assert_eq!(ann.get(ANNOTATION_SLICE_SIZE), Some(&s.to_string()));
                assert_eq!(
                    ann.get(ANNOTATION_SLICE_REQUIRED).map(String::as_str),
                    Some(LABEL_NVLINK_DOMAIN)
                );
                assert_eq!(
                    ann.get(ANNOTATION_PREFERRED).map(String::as_str),
                    Some(LABEL_LEAFGROUP)
                );
                Ok(format!("slice {r}x{s}"))
            }
            other => panic!("unexpected level {other} for GB200 x{n}"),
        }
    }

    #[test]
    fn gb200_replica_table_1_to_72() {
        let valid: BTreeMap<u32, &str> = BTreeMap::from([
            (20, "slice 2x10"),
            (22, "slice 2x11"),
            (24, "slice 2x12"),
            (26, "slice 2x13"),
            (28, "slice 2x14"),
            (30, "slice 2x15"),
            (32, "slice 2x16"),
            (33, "slice 3x11"),
            (36, "slice 3x12"),
            (39, "slice 3x13"),
            (42, "slice 3x14"),
            (45, "slice 3x15"),
            (48, "slice 3x16"),
            (52, "slice 4x13"),
            (56, "slice 4x14"),
            (60, "slice 4x15"),
            (64, "slice 4x16"),
            (65, "slice 5x13"),
            (70, "slice 5x14"),
        ]);
        for n in 1..=72u32 {
            let got = shape(n);
            if n <= 16 {
                assert_eq!(got, Ok(format!("req 1x{n}")), "n={n}");
            } else if let Some(want) = valid.get(&n) {
                assert_eq!(got.as_deref(), Ok(*want), "n={n}");
            } else {
                let racks = n.div_ceil(16);
                let msg = got.expect_err(&format!("n={n} must be INVALID"));
                if n % racks != 0 {
                    assert!(
                        msg.starts_with(&format!(
                            "{n} nodes do not divide evenly across {racks} racks (<= 16 nodes each)"
                        )),
                        "n={n}: {msg}"
                    );
                } else {
                    let slice = n / racks;
                    assert!(
                        msg.starts_with(&format!(
                            "{n} nodes would place {racks} racks of {slice}, but a rack slice must exceed half a rack (10+ of 18 nodes)"
                        )),
                        "n={n}: {msg}"
                    );
                }
            }
        }
    }

    #[test]
    fn table_spot_checks_and_full_messages() {
        assert_eq!(
            balanced_split(17).unwrap_err().to_string(),
            "17 nodes do not divide evenly across 2 racks (<= 16 nodes each); a multi-rack NVL72 gang \
             must split into equal 10-16 node rack slices (e.g. 20, 24, 32, 48)"
        );
        assert_eq!(
            balanced_split(18).unwrap_err().to_string(),
            "18 nodes would place 2 racks of 9, but a rack slice must exceed half a rack (10+ of 18 nodes) \
             to keep one slice per rack; use a larger gang (e.g. 20, 24, 32, 48)"
        );
        assert!(matches!(
            balanced_split(72),
            Err(TopologyError::UnevenSplit {
                nodes: 72,
                racks: 5
            })
        ));
        assert_eq!(balanced_split(12), Ok((1, 12)));
        assert!(matches!(
            balanced_split(5),
            Err(TopologyError::SliceTooSmall { slice: 5, .. })
        ));
        assert_eq!(balanced_split(0), Err(TopologyError::EmptyGang(0)));
    }

    #[test]
    fn level_selection() {
        assert_eq!(gang_level("H100", 64, 8), Ok(GroupBy::Leafgroup));
        assert_eq!(gang_level("h100", 2, 1), Ok(GroupBy::Leafgroup));
        assert_eq!(gang_level("gb300-4x", 16, 2), Ok(GroupBy::NvlinkDomain));
        assert_eq!(gang_level("GB200", 32, 4), Ok(GroupBy::NvlinkDomainSliced));
        assert_eq!(
            gang_level("GB200", 32, 2).unwrap_err().to_string(),
            "sliced multi-rack placement requires node-saturating NVL72 pods (4 GPUs each); got 2"
        );
        assert_eq!(gang_level("GB200", 0, 4), Err(TopologyError::EmptyGang(0)));
    }

    #[test]
    fn nvl72_detection_and_racks() {
        assert!(is_nvl72("GB200"));
        assert!(is_nvl72("gb300-4x"));
        assert!(!is_nvl72("H100"));
        assert!(!is_nvl72("a-gb200"));
        assert_eq!(target_racks(36), Ok(2));
        assert_eq!(target_racks(20), Err(TopologyError::PartialRack(20)));
    }

    #[test]
    fn default_annotations_per_level() {
        let a = annotations("leafgroup", 8, 8, None).unwrap();
        assert_eq!(
            a,
            BTreeMap::from([(
                ANNOTATION_PREFERRED.to_string(),
                LABEL_LEAFGROUP.to_string()
            )])
        );
        let a = annotations("nvlink.domain.preferred", 40, 4, None).unwrap();
        assert_eq!(
            a,
            BTreeMap::from([(
                ANNOTATION_PREFERRED.to_string(),
                LABEL_NVLINK_DOMAIN.to_string()
            )])
        );
        let e = annotations("nvlink.domain", 17, 4, None).unwrap_err();
        assert!(matches!(
            e,
            ManifestError::Topology(TopologyError::RackOverflow(17))
        ));
        // An explicit sliced level with 10-16 replicas is one slice of the whole gang.
        let a = annotations("nvlink.domain.sliced", 12, 4, None).unwrap();
        assert_eq!(a.get(ANNOTATION_SLICE_SIZE).map(String::as_str), Some("12"));
        let e = annotations("nvlink.domain.sliced", 8, 4, None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("8 nodes would place 1 racks of 8"),
            "{e}"
        );
        let e = annotations("nvlink.domain.sliced", 32, 1, None).unwrap_err();
        assert!(e.to_string().ends_with("got 1"), "{e}");
    }

    #[test]
    fn overrides_replace_the_defaults() {
        let mut m = TopologyMap::new();
        m.insert(
            "rack".into(),
            TopologyBinding {
                node_label: "example.com/rack".into(),
                mode: TopologyMode::Required,
                coarse_preferred_label: None,
            },
        );
        let a = annotations("rack", 40, 1, Some(&m)).unwrap();
        assert_eq!(
            a,
            BTreeMap::from([(
                ANNOTATION_REQUIRED.to_string(),
                "example.com/rack".to_string()
            )])
        );
        let e = annotations("leafgroup", 2, 8, Some(&m)).unwrap_err();
        assert_eq!(
            e,
            ManifestError::UnknownGroupBy {
                group_by: "leafgroup".into(),
                known: vec!["rack".into()]
            }
        );
        // An empty map means "use the defaults".
        assert!(annotations("leafgroup", 2, 8, Some(&TopologyMap::new())).is_ok());
        let e = annotations("fabric", 2, 8, None).unwrap_err().to_string();
        assert!(
            e.contains("leafgroup, nvlink.domain, nvlink.domain.preferred, nvlink.domain.sliced"),
            "{e}"
        );
    }

    #[test]
    fn binding_parses_from_config_yaml_shape() {
        let b: TopologyBinding = serde_json::from_value(serde_json::json!({
            "node_label": LABEL_NVLINK_DOMAIN, "mode": "slice", "coarse_preferred_label": LABEL_LEAFGROUP
        }))
        .unwrap();
        assert_eq!(b.mode, TopologyMode::Slice);
        assert!(
            serde_json::from_value::<TopologyBinding>(serde_json::json!({
                "node_label": "x", "mode": "hard"
            }))
            .is_err()
        );
    }
}
