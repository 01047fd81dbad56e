//! Builders for unit tests.

use std::collections::BTreeMap;

use crate::{Advertised, Availability, BackendView, Band, PeerView};

/// `[("device-variant", &["h100"])]` → advertised attributes.
pub(crate) fn adv(pairs: &[(&str, &[&str])]) -> Advertised {
    pairs
        .iter()
        .map(|(k, vs)| (k.to_string(), vs.iter().map(|v| v.to_string()).collect()))
        .collect()
}

/// Token → amount map.
pub(crate) fn amounts(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// An availability metric at `generation`.
pub(crate) fn avail(
    generation: i64,
    free: &[(&str, i64)],
    held: &[(Band, &[(&str, i64)])],
) -> Availability {
    Availability {
        generation,
        free: amounts(free),
        held_by_band: held.iter().map(|(b, a)| (*b, amounts(a))).collect(),
    }
}

pub(crate) fn backend(
    id: &str,
    advertised: Advertised,
    availability: Option<Availability>,
) -> BackendView {
    BackendView {
        backend_id: id.to_string(),
        advertised,
        availability,
    }
}

/// A reachable peer.
pub(crate) fn peer(id: &str, backends: Vec<BackendView>) -> PeerView {
    PeerView {
        peer_id: id.to_string(),
        reachable: true,
        backends,
    }
}
