//! The availability gate and the per-tick assignment of queued jobs to peers (§1.4, §1.5).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use blake2::digest::consts::U8;
use blake2::{Blake2b, Digest};
use iris_types::Constraint;

use crate::routing::{backend_satisfies, normalize, MARKER_PREFIX};
use crate::{Availability, Band, PeerView, ReservationLedger, CLUSTER_KEY};

/// A job waiting in the federation queue, as the tick sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The job id in wire form (`/user/job`); the same id is used on the peer.
    pub job_id: String,
    /// Effective band (after any budget demotion).
    pub band: Band,
    /// Submission time, the second sort key after the band.
    pub submitted_at_ms: i64,
    /// The job's [`routing_constraints`](crate::routing_constraints) (any `cluster`
    /// constraint here is ignored).
    pub shape: Vec<Constraint>,
    /// The only peer the job may go to, if pinned.
    pub pinned_peer: Option<String>,
    /// What the job needs free on one backend ([`availability_gate`]); empty matches on shape
    /// only.
    pub gate: BTreeMap<String, i64>,
}

/// A decision to hand a queued job to a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promotion {
    /// The job.
    pub job_id: String,
    /// The chosen peer.
    pub peer_id: String,
    /// The chosen backend of that peer; `""` when force-routed to a peer none of whose
    /// backends matches the shape.
    pub backend_id: String,
    /// The generation of the availability the choice was made against; 0 without a metric.
    pub generation: i64,
    /// Amounts spent from that backend (token → amount); empty unless measured with a gate.
    pub reserved: BTreeMap<String, i64>,
}

/// The capacity a job must find free on a single peer backend: `{variant: replicas × gpus}`
/// (each at least 1) for a GPU with a concrete variant. CPU and TPU jobs, and GPUs with an
/// empty or `auto` variant, have no gate and are matched on shape only.
pub fn availability_gate(
    gpu_variant: Option<&str>,
    gpu_count: u32,
    replicas: u32,
) -> BTreeMap<String, i64> {
    let Some(variant) = gpu_variant
        .map(normalize)
        .filter(|v| !v.is_empty() && v != "auto")
    else {
        return BTreeMap::new();
    };
    let amount = i64::from(replicas.max(1)).saturating_mul(i64::from(gpu_count.max(1)));
    BTreeMap::from([(variant, amount)])
}

/// Chooses a peer (and backend) for queued jobs. Pure: neither the inputs nor the ledger
/// change; the caller applies the promotions and then commits the confirmed ones to the
/// ledger.
///
/// Candidates are taken by band rank, then `submitted_at_ms`, then `job_id`; each job is
/// promoted at most once. For each, every reachable peer that it is not pinned away from
/// and that has had fewer than `max_per_peer_per_cycle` promotions in this pass offers
/// options, one per backend matching the whole shape:
///
/// * a backend without a metric is a *shape-only* option;
/// * a backend with a metric is a *measured* option if, for every gated token, the amount
///   available to the job's band covers the need; otherwise it is no option at all (the job
///   waits for a full backend rather than going to a legacy one blindly).
///
/// A peer none of whose backends matches the shape still takes the job, with
/// `backend_id = ""` and nothing reserved ("force-route"), when the job has no shape or is
/// pinned to that peer.
///
/// The best option overall has the smallest key `(shape_only, preempts, remaining, marker,
/// spread, peer_id, backend_id)`: measured before shape-only; a fit in idle capacity before
/// one that reclaims held capacity; the tightest fit (least left over across gated tokens);
/// most capacity for the variants named by `availability:<variant>` markers in the shape;
/// then a stable per-(job, peer) hash, so equal peers share the load.
///
/// Capacity is per backend and never summed across backends. A backend's working capacity is
/// its reported idle and held amounts, less this generation's ledger reservations (which may
/// have used held capacity of any band), less what earlier candidates of this pass took. A
/// job may use idle capacity plus capacity held by bands it strictly outranks; it spends idle
/// first, then held capacity from the lowest band up.
pub fn assign_queued(
    candidates: &[Candidate],
    peers: &[PeerView],
    ledger: &ReservationLedger,
    max_per_peer_per_cycle: usize,
) -> Vec<Promotion> {
    let mut working: Vec<Vec<Option<Capacity>>> = peers
        .iter()
        .map(|p| {
            if !p.reachable {
                return Vec::new();
            }
            p.backends
                .iter()
                .map(|b| {
                    b.availability.as_ref().map(|av| {
                        Capacity::working(
                            av,
                            &ledger.reserved_for(&p.peer_id, &b.backend_id, av.generation),
                        )
                    })
                })
                .collect()
        })
        .collect();

    let mut order: Vec<&Candidate> = candidates.iter().collect();
    // Stable, so exact duplicates keep their input order.
    order.sort_by_key(|&c| (c.band.rank(), c.submitted_at_ms, &c.job_id));

    let mut promoted: BTreeSet<&str> = BTreeSet::new();
    let mut per_peer: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for cand in order {
        if promoted.contains(cand.job_id.as_str()) {
            continue;
        }
        let need = Need::of(cand);
        let Some(choice) = best_option(&need, peers, &working, &per_peer, max_per_peer_per_cycle)
        else {
            continue;
        };
        let peer = &peers[choice.peer];
        let mut promotion = Promotion {
            job_id: cand.job_id.clone(),
            peer_id: peer.peer_id.clone(),
            backend_id: String::new(),
            generation: 0,
            reserved: BTreeMap::new(),
        };
        if let Some(bi) = choice.backend {
            let backend = &peer.backends[bi];
            promotion.backend_id = backend.backend_id.clone();
            if let (Some(cap), Some(av)) = (&mut working[choice.peer][bi], &backend.availability) {
                promotion.generation = av.generation;
                for (token, amount) in &need.gate {
                    let uncovered = cap.spend(token, *amount, reclaimable(need.band));
                    debug_assert_eq!(uncovered, 0, "a measured option covers its gate");
                }
                promotion.reserved = need.gate.clone();
            }
        }
        promoted.insert(&cand.job_id);
        *per_peer.entry(&peer.peer_id).or_insert(0) += 1;
        out.push(promotion);
    }
    out
}

/// A candidate's requirements, normalised once.
struct Need<'a> {
    job_id: &'a str,
    band: Band,
    shape: Vec<&'a Constraint>,
    pinned_peer: Option<&'a str>,
    /// Lower-cased token → positive amount.
    gate: BTreeMap<String, i64>,
    /// Tokens of the `availability:<variant>` markers in the shape.
    markers: Vec<String>,
}

impl<'a> Need<'a> {
    fn of(c: &'a Candidate) -> Need<'a> {
        let shape: Vec<&Constraint> = c.shape.iter().filter(|c| c.key != CLUSTER_KEY).collect();
        let markers = shape
            .iter()
            .filter_map(|c| c.key.strip_prefix(MARKER_PREFIX))
            .map(normalize)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut gate = BTreeMap::new();
        for (token, amount) in c.gate.iter().filter(|(_, a)| **a > 0) {
            add(&mut gate, &normalize(token), *amount);
        }
        Need {
            job_id: &c.job_id,
            band: c.band,
            shape,
            pinned_peer: c.pinned_peer.as_deref().filter(|p| !p.is_empty()),
            gate,
            markers,
        }
    }
}

/// Sort key of an option; smaller is better. Field order is the comparison order.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct OptionKey<'a> {
    shape_only: bool,
    preempts: bool,
    remaining: i64,
    marker: i64,
    spread: u64,
    peer_id: &'a str,
    backend_id: &'a str,
}

struct Choice<'a> {
    key: OptionKey<'a>,
    peer: usize,
    /// `None` when force-routed.
    backend: Option<usize>,
}

fn best_option<'p>(
    need: &Need<'_>,
    peers: &'p [PeerView],
    working: &[Vec<Option<Capacity>>],
    per_peer: &BTreeMap<&str, usize>,
    cap: usize,
) -> Option<Choice<'p>> {
    let mut best: Option<Choice<'p>> = None;
    let mut offer = |choice: Choice<'p>| {
        if best.as_ref().is_none_or(|b| choice.key < b.key) {
            best = Some(choice);
        }
    };
    for (pi, peer) in peers.iter().enumerate() {
        if !peer.reachable
            || need.pinned_peer.is_some_and(|pin| pin != peer.peer_id)
            || per_peer.get(peer.peer_id.as_str()).copied().unwrap_or(0) >= cap
        {
            continue;
        }
        let spread = spread(need.job_id, &peer.peer_id);
        let shape_only = |backend_id| OptionKey {
            shape_only: true,
            preempts: false,
            remaining: 0,
            marker: 0,
            spread,
            peer_id: &peer.peer_id,
            backend_id,
        };
        let mut any_shape_match = false;
        for (bi, backend) in peer.backends.iter().enumerate() {
            if !need
                .shape
                .iter()
                .all(|c| backend_satisfies(&backend.advertised, c))
            {
                continue;
            }
            any_shape_match = true;
            let key = match working[pi].get(bi) {
                Some(Some(cap)) => match measured_key(need, cap) {
                    Some(m) => OptionKey {
                        shape_only: false,
                        preempts: m.preempts,
                        remaining: m.remaining,
                        marker: m.marker,
                        spread,
                        peer_id: &peer.peer_id,
                        backend_id: &backend.backend_id,
                    },
                    None => continue,
                },
                _ => shape_only(&backend.backend_id),
            };
            offer(Choice {
                key,
                peer: pi,
                backend: Some(bi),
            });
        }
        if !any_shape_match && (need.shape.is_empty() || need.pinned_peer.is_some()) {
            offer(Choice {
                key: shape_only(""),
                peer: pi,
                backend: None,
            });
        }
    }
    best
}

struct Measured {
    preempts: bool,
    remaining: i64,
    marker: i64,
}

/// The key fields of a metric backend, or `None` when the gate does not fit.
fn measured_key(need: &Need<'_>, cap: &Capacity) -> Option<Measured> {
    let mut preempts = false;
    let mut remaining: i64 = 0;
    for (token, amount) in &need.gate {
        let available = cap.available(token, need.band);
        if available < *amount {
            return None;
        }
        preempts |= cap.idle(token) < *amount;
        remaining = remaining.saturating_add(available - amount);
    }
    let marker = need.markers.iter().fold(0i64, |sum, t| {
        sum.saturating_add(cap.available(t, need.band))
    });
    Some(Measured {
        preempts,
        remaining,
        marker: marker.saturating_neg(),
    })
}

/// Stable per-(job, peer) tie-break: the first 8 bytes of BLAKE2b-64 of `job\0peer`, read
/// big-endian (the same order as comparing the hex digests).
pub(crate) fn spread(job_id: &str, peer_id: &str) -> u64 {
    let mut h = Blake2b::<U8>::new();
    h.update(job_id.as_bytes());
    h.update([0u8]);
    h.update(peer_id.as_bytes());
    u64::from_be_bytes(h.finalize().into())
}

const BANDS: usize = Band::ALL.len();

/// Held ranks a job of `band` may reclaim: those of bands it strictly outranks.
fn reclaimable(band: Band) -> Range<usize> {
    usize::from(band.rank()) + 1..BANDS
}

/// One backend's capacity as this pass sees it. Amounts are never negative.
#[derive(Clone, Debug, Default)]
struct Capacity {
    idle: BTreeMap<String, i64>,
    /// Indexed by band rank.
    held: [BTreeMap<String, i64>; BANDS],
}

impl Capacity {
    /// The reported numbers less the ledger's reservations for this generation. Those were
    /// made by jobs of any band, so they may have used any held capacity.
    fn working(av: &Availability, reserved: &BTreeMap<String, i64>) -> Capacity {
        let mut cap = Capacity::default();
        for (token, amount) in &av.free {
            add(&mut cap.idle, &normalize(token), *amount);
        }
        for (band, amounts) in &av.held_by_band {
            let held = &mut cap.held[usize::from(band.rank())];
            for (token, amount) in amounts {
                add(held, &normalize(token), *amount);
            }
        }
        for (token, amount) in reserved {
            // More reserved than reported (the peer's numbers moved): nothing is left.
            cap.spend(&normalize(token), *amount, 0..BANDS);
        }
        cap
    }

    fn idle(&self, token: &str) -> i64 {
        self.idle.get(token).copied().unwrap_or(0)
    }

    /// Idle plus what bands strictly below `band` hold.
    fn available(&self, token: &str, band: Band) -> i64 {
        self.held[reclaimable(band)]
            .iter()
            .filter_map(|held| held.get(token))
            .fold(self.idle(token), |sum, a| sum.saturating_add(*a))
    }

    /// Takes `amount` of `token`: idle first, then held capacity of the ranks in `ranks`,
    /// lowest band first. Returns what could not be covered.
    fn spend(&mut self, token: &str, amount: i64, ranks: Range<usize>) -> i64 {
        let mut left = amount.max(0);
        let pools = std::iter::once(&mut self.idle).chain(self.held[ranks].iter_mut().rev());
        for pool in pools {
            if left == 0 {
                break;
            }
            if let Some(have) = pool.get_mut(token) {
                let take = left.min(*have);
                *have -= take;
                left -= take;
            }
        }
        left
    }
}

/// Adds a non-negative `amount` (negative counts as zero) to `map[token]`.
fn add(map: &mut BTreeMap<String, i64>, token: &str, amount: i64) {
    let slot = map.entry(token.to_string()).or_insert(0);
    *slot = slot.saturating_add(amount.max(0));
}
