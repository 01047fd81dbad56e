//! Federation decisions for Iris, as pure functions.
//!
//! A **parent** controller can hand whole root jobs to **peers** (other Iris controllers). This
//! crate holds every decision in that flow that needs no I/O; the controller gathers the inputs
//! (the job's constraints, the last heartbeat of each peer, the queued handles) and applies the
//! outputs in its own transactions.
//!
//! * **Submit time** ([`classify`]): a job pinned with `cluster EQ <peer>` is queued for that
//!   peer; otherwise it runs locally when the local backend can host it; otherwise it is queued
//!   for federation when some reachable peer has one backend satisfying all of its
//!   [`routing_constraints`]; otherwise it is rejected.
//! * **Every control tick** ([`assign_queued`]): queued jobs are matched to peers. A peer backend
//!   that reports an availability metric is only chosen when the job's
//!   [`availability_gate`] fits in what it reports free (plus capacity held by lower bands,
//!   which the job may reclaim); a legacy backend without the metric is matched on shape only.
//!   The pass returns [`Promotion`]s and changes nothing itself.
//! * **After the tick commits**, the controller charges each confirmed promotion to the
//!   [`ReservationLedger`], so the next tick does not spend the same reported capacity twice
//!   before the peer's next heartbeat shows the new numbers.
//! * **After each delivery** ([`after_answer`]): a peer that cannot host the job now is offered
//!   it again only after an exponential backoff, with its reason kept for display; a failed call
//!   makes the peer *suspect*, and [`heartbeat_wait`] then probes it every second until it
//!   answers or is marked unreachable.
//! * **Display and trust**: [`pending_reason`] explains a queued or handed-off job;
//!   [`submitter_admitted`] is the peer-side `allowed_submitters` check.
//!
//! Architecture Invariant: no I/O, no clock, no randomness. Every output depends only on the
//! arguments, maps are `BTreeMap`s, and ties are broken by a hash of the job and peer ids.
//!
//! API Boundary: inputs are domain values ([`iris_types::Constraint`], [`Band`]); wire
//! messages (heartbeat `BackendSummary`, `ResourceAvailability`) are converted by the caller.

#![warn(missing_docs)]

mod assign;
mod classify;
mod delivery;
mod handoff;
mod ledger;
mod probe;
mod routing;
mod submitters;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;

use std::collections::BTreeMap;

pub use assign::{assign_queued, availability_gate, Candidate, Promotion};
pub use classify::{candidate_peers, classify, Disposition};
pub use delivery::{
    after_answer, backoff_ms, may_offer, refusal_expired, AfterAnswer, PeerAnswer, Refusal,
    AUTH_FAILURE_VERDICT, FIRST_BACKOFF_MS, MAX_BACKOFF_MS,
};
pub use handoff::{pending_reason, HandoffState};
pub use iris_types::Band;
pub use ledger::ReservationLedger;
pub use probe::{heartbeat_wait, probe_timeout, PROBE_INTERVAL, PROBE_TIMEOUT};
pub use routing::{backend_satisfies, backend_satisfies_all, cluster_pin, routing_constraints};
pub use submitters::{submitter_admitted, LOCAL_ADMIN};

/// The reserved constraint key that pins a job to a peer (`--target-cluster`).
pub const CLUSTER_KEY: &str = "cluster";

/// Default cap on promotions to one peer in one control tick.
pub const DEFAULT_MAX_PER_PEER_PER_CYCLE: usize = 8;

/// The newest `ResourceAvailability` version this crate understands.
pub const AVAILABILITY_VERSION: u32 = 3;

/// Advertised attributes of one backend: key → values (lower-cased by the peer).
pub type Advertised = BTreeMap<String, Vec<String>>;

/// Whether a heartbeat's availability metric of this version may be used. A newer version is
/// treated as absent (shape-only matching); older versions are accepted.
pub fn availability_supported(version: u32) -> bool {
    version <= AVAILABILITY_VERSION
}

/// What the parent last heard from one peer.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerView {
    /// Configured peer id.
    pub peer_id: String,
    /// The last heartbeat succeeded.
    pub reachable: bool,
    /// The backends from the last successful heartbeat.
    pub backends: Vec<BackendView>,
}

/// One backend of a peer, as advertised in its heartbeat.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendView {
    /// Backend id, unique within its peer.
    pub backend_id: String,
    /// Attributes the backend can satisfy.
    pub advertised: Advertised,
    /// `None`: the peer reported no availability metric (a legacy peer, matched on shape
    /// only), or one of a version newer than [`AVAILABILITY_VERSION`].
    pub availability: Option<Availability>,
}

/// A backend's reported free capacity, as of one observation.
///
/// Tokens are lower-case device variants (`h100`); amounts are device counts. Negative
/// amounts are read as zero. An `Availability` with no amounts means "nothing free".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Availability {
    /// When the peer computed the numbers (`observation_epoch_ms`); the ledger generation.
    /// Zero disables ledger reservations for this backend.
    pub generation: i64,
    /// Token → idle amount.
    pub free: BTreeMap<String, i64>,
    /// Capacity in use by each band, which a job of a strictly higher band may reclaim.
    /// A band listed twice counts the sum (a list, as the heartbeat carries it).
    pub held_by_band: Vec<(Band, BTreeMap<String, i64>)>,
}
