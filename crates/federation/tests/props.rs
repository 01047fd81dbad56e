//! Property tests for `assign_queued` over small random federations.

use std::collections::{BTreeMap, BTreeSet};

use iris_federation::*;
use iris_types::Constraint;
use proptest::prelude::*;

const VARIANTS: [&str; 2] = ["h100", "a100"];
const GENERATIONS: [i64; 2] = [100, 200];
const JOBS: usize = 8;

fn band(i: u8) -> Band {
    Band::ALL[usize::from(i % 4)]
}

fn amounts_strategy() -> impl Strategy<Value = BTreeMap<String, i64>> {
    proptest::collection::btree_map(
        (0..VARIANTS.len()).prop_map(|v| VARIANTS[v].to_string()),
        -2i64..24,
        0..3,
    )
}

prop_compose! {
    fn arb_availability()(
        generation in 0..GENERATIONS.len(),
        free in amounts_strategy(),
        held in proptest::collection::vec((0u8..4, amounts_strategy()), 0..4),
    ) -> Availability {
        Availability {
            generation: GENERATIONS[generation],
            free,
            held_by_band: held.into_iter().map(|(b, a)| (band(b), a)).collect(),
        }
    }
}

prop_compose! {
    fn arb_backend()(
        variant in 0..VARIANTS.len(),
        region in proptest::bool::ANY,
        availability in proptest::option::weighted(0.8, arb_availability()),
    ) -> (Advertised, Option<Availability>) {
        let mut adv = Advertised::new();
        adv.insert("device-type".into(), vec!["gpu".into()]);
        adv.insert("device-variant".into(), vec![VARIANTS[variant].into()]);
        adv.insert(format!("availability:{}", VARIANTS[variant]), vec!["true".into()]);
        if region {
            adv.insert("region".into(), vec!["us".into()]);
        }
        (adv, availability)
    }
}

fn arb_peers() -> impl Strategy<Value = Vec<PeerView>> {
    let peer = (
        proptest::bool::weighted(0.8),
        proptest::collection::vec(arb_backend(), 0..4),
    );
    proptest::collection::vec(peer, 1..4).prop_map(|peers| {
        peers
            .into_iter()
            .enumerate()
            .map(|(i, (reachable, backends))| PeerView {
                peer_id: format!("p{i}"),
                reachable,
                backends: backends
                    .into_iter()
                    .enumerate()
                    .map(|(j, (advertised, availability))| BackendView {
                        backend_id: format!("b{j}"),
                        advertised,
                        availability,
                    })
                    .collect(),
            })
            .collect()
    })
}

fn shape(kind: usize) -> Vec<Constraint> {
    let gpu = |v: &str| {
        vec![
            Constraint::equals("device-type", "gpu"),
            Constraint::equals("device-variant", v),
        ]
    };
    match kind {
        0 => vec![],
        1 => gpu("h100"),
        2 => gpu("a100"),
        3 => {
            let mut s = gpu("h100");
            s.push(Constraint::equals("region", "us"));
            s
        }
        _ => {
            let mut s = gpu("a100");
            s.push(Constraint::equals("availability:a100", "true"));
            s
        }
    }
}

/// Raw candidate: (job index, submitted_at, shape kind, pin, gate).
type RawCandidate = (usize, i64, usize, Option<usize>, Option<(usize, i64)>);

fn arb_candidates() -> impl Strategy<Value = Vec<Candidate>> {
    let raw = (
        0..JOBS,
        0i64..4,
        0usize..5,
        proptest::option::weighted(0.2, 0usize..4),
        proptest::option::weighted(0.8, (0..VARIANTS.len(), 1i64..16)),
    );
    (
        proptest::collection::vec(0u8..4, JOBS),
        proptest::collection::vec(raw, 0..14),
    )
        .prop_map(|(job_bands, raw): (Vec<u8>, Vec<RawCandidate>)| {
            raw.into_iter()
                .map(|(job, at, kind, pin, gate)| Candidate {
                    job_id: format!("/u/j{job}"),
                    // A job id always has one band, so promotions can be traced to it.
                    band: band(job_bands[job]),
                    submitted_at_ms: at,
                    shape: shape(kind),
                    // Index 3 names a peer that may not exist.
                    pinned_peer: pin.map(|p| format!("p{p}")),
                    gate: gate
                        .map(|(v, n)| BTreeMap::from([(VARIANTS[v].to_string(), n)]))
                        .unwrap_or_default(),
                })
                .collect()
        })
}

/// Ledger commits: (peer, backend, generation, variant, amount).
fn arb_ledger() -> impl Strategy<Value = Vec<(usize, usize, usize, usize, i64)>> {
    proptest::collection::vec(
        (
            0usize..4,
            0usize..4,
            0..GENERATIONS.len(),
            0..VARIANTS.len(),
            1i64..20,
        ),
        0..6,
    )
}

fn build_ledger(raw: &[(usize, usize, usize, usize, i64)]) -> ReservationLedger {
    let mut ledger = ReservationLedger::new();
    for &(p, b, g, v, n) in raw {
        ledger.commit(&Promotion {
            job_id: "/u/earlier".into(),
            peer_id: format!("p{p}"),
            backend_id: format!("b{b}"),
            generation: GENERATIONS[g],
            reserved: BTreeMap::from([(VARIANTS[v].to_string(), n)]),
        });
    }
    ledger
}

/// A reference model of one backend's working capacity for `token`: idle and held (indexed
/// by band rank) after replaying the ledger idle-first, then lowest band first.
fn working(av: &Availability, reserved: i64, token: &str) -> (i64, [i64; 4]) {
    let mut idle = av.free.get(token).copied().unwrap_or(0).max(0);
    let mut held = [0i64; 4];
    for (b, amounts) in &av.held_by_band {
        held[usize::from(b.rank())] += amounts.get(token).copied().unwrap_or(0).max(0);
    }
    let mut left = reserved;
    let take = left.min(idle);
    idle -= take;
    left -= take;
    for h in held.iter_mut().rev() {
        let take = left.min(*h);
        *h -= take;
        left -= take;
    }
    (idle, held)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn promotions_respect_every_limit(
        peers in arb_peers(),
        candidates in arb_candidates(),
        ledger in arb_ledger(),
        cap in 0usize..4,
    ) {
        let ledger = build_ledger(&ledger);
        let got = assign_queued(&candidates, &peers, &ledger, cap);

        // Each job at most once.
        let jobs: BTreeSet<&str> = got.iter().map(|p| p.job_id.as_str()).collect();
        prop_assert_eq!(jobs.len(), got.len(), "a job was promoted twice: {:?}", got);

        // The per-peer cap.
        let mut per_peer: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &got {
            *per_peer.entry(&p.peer_id).or_default() += 1;
        }
        prop_assert!(per_peer.values().all(|n| *n <= cap), "{:?}", per_peer);

        let band_of: BTreeMap<&str, Band> =
            candidates.iter().map(|c| (c.job_id.as_str(), c.band)).collect();
        for p in &got {
            let peer = peers.iter().find(|v| v.peer_id == p.peer_id);
            prop_assert!(peer.is_some_and(|v| v.reachable), "unreachable or unknown peer: {:?}", p);
            let pinned_elsewhere = candidates
                .iter()
                .filter(|c| c.job_id == p.job_id)
                .all(|c| c.pinned_peer.as_ref().is_some_and(|pin| *pin != p.peer_id));
            prop_assert!(!pinned_elsewhere, "pin ignored: {:?}", p);
        }

        // Per backend and token, what candidates of rank >= r took fits in idle plus what
        // bands of rank > r held (for r = 0 this bounds the total as well).
        for peer in peers.iter().filter(|p| p.reachable) {
            for b in &peer.backends {
                let Some(av) = &b.availability else { continue };
                let ledger_reserved = ledger.reserved_for(&peer.peer_id, &b.backend_id, av.generation);
                let ours: Vec<&Promotion> = got
                    .iter()
                    .filter(|p| p.peer_id == peer.peer_id && p.backend_id == b.backend_id)
                    .collect();
                for token in VARIANTS {
                    let reserved_before = ledger_reserved.get(token).copied().unwrap_or(0);
                    let (idle, held) = working(av, reserved_before, token);
                    for r in 0..4usize {
                        let taken: i64 = ours
                            .iter()
                            .filter(|p| usize::from(band_of[p.job_id.as_str()].rank()) >= r)
                            .map(|p| p.reserved.get(token).copied().unwrap_or(0))
                            .sum();
                        let room = idle + held[r + 1..].iter().sum::<i64>();
                        prop_assert!(
                            taken <= room,
                            "{}/{} {}: rank>={} took {} of {} ({:?})",
                            peer.peer_id, b.backend_id, token, r, taken, room, ours
                        );
                    }
                }
                for p in &ours {
                    prop_assert_eq!(p.generation, av.generation);
                }
            }
        }
    }

    #[test]
    fn measured_promotions_reserve_exactly_the_gate(
        peers in arb_peers(),
        candidates in arb_candidates(),
    ) {
        let got = assign_queued(&candidates, &peers, &ReservationLedger::new(), DEFAULT_MAX_PER_PEER_PER_CYCLE);
        for p in &got {
            let peer = peers.iter().find(|v| v.peer_id == p.peer_id);
            let backend = peer.and_then(|v| v.backends.iter().find(|b| b.backend_id == p.backend_id));
            let measured = backend.is_some_and(|b| b.availability.is_some());
            if !measured {
                prop_assert!(p.reserved.is_empty() && p.generation == 0, "{:?}", p);
                continue;
            }
            let gates: Vec<&BTreeMap<String, i64>> = candidates
                .iter()
                .filter(|c| c.job_id == p.job_id)
                .map(|c| &c.gate)
                .collect();
            prop_assert!(gates.contains(&&p.reserved), "{:?} not one of {:?}", p, gates);
        }
    }

    #[test]
    fn independent_of_peer_and_backend_order(
        peers in arb_peers(),
        candidates in arb_candidates(),
        ledger in arb_ledger(),
    ) {
        let ledger = build_ledger(&ledger);
        let got = assign_queued(&candidates, &peers, &ledger, 2);
        let mut reversed = peers.clone();
        reversed.reverse();
        for p in &mut reversed {
            p.backends.reverse();
        }
        prop_assert_eq!(got, assign_queued(&candidates, &reversed, &ledger, 2));
    }
}
