//! Scenario tests for the availability gate and `assign_queued`.

use std::collections::BTreeMap;

use iris_types::Constraint;

use crate::assign::spread;
use crate::testutil::{adv, amounts, avail, backend, peer};
use crate::*;

const GEN: i64 = 1_700_000_000_000;

fn h100_shape() -> Vec<Constraint> {
    vec![
        Constraint::equals("device-type", "gpu"),
        Constraint::equals("device-variant", "h100"),
    ]
}

fn h100_backend(id: &str, availability: Option<Availability>) -> BackendView {
    backend(
        id,
        adv(&[
            ("device-type", &["gpu"]),
            ("device-variant", &["h100"]),
            ("availability:h100", &["true"]),
        ]),
        availability,
    )
}

/// A reachable peer with one H100 backend `k8s`.
fn h100_peer(id: &str, availability: Option<Availability>) -> PeerView {
    peer(id, vec![h100_backend("k8s", availability)])
}

fn free(n: i64) -> Option<Availability> {
    Some(avail(GEN, &[("h100", n)], &[]))
}

/// An H100 job needing `gpus` on one backend.
fn cand(job: &str, band: Band, at: i64, gpus: i64) -> Candidate {
    Candidate {
        job_id: job.to_string(),
        band,
        submitted_at_ms: at,
        shape: h100_shape(),
        pinned_peer: None,
        gate: amounts(&[("h100", gpus)]),
    }
}

fn pinned(mut c: Candidate, peer: &str) -> Candidate {
    c.pinned_peer = Some(peer.to_string());
    c
}

fn assign(candidates: &[Candidate], peers: &[PeerView]) -> Vec<Promotion> {
    assign_queued(
        candidates,
        peers,
        &ReservationLedger::new(),
        DEFAULT_MAX_PER_PEER_PER_CYCLE,
    )
}

/// `(job, peer, backend)` of each promotion.
fn placed(ps: &[Promotion]) -> Vec<(&str, &str, &str)> {
    ps.iter()
        .map(|p| (p.job_id.as_str(), p.peer_id.as_str(), p.backend_id.as_str()))
        .collect()
}

// ---- availability_gate ----

#[test]
fn gate_is_replicas_times_gpus_per_variant() {
    assert_eq!(
        availability_gate(Some("H100"), 8, 2),
        amounts(&[("h100", 16)])
    );
    assert_eq!(
        availability_gate(Some(" a100 "), 4, 0),
        amounts(&[("a100", 4)])
    );
    assert_eq!(
        availability_gate(Some("a100"), 0, 3),
        amounts(&[("a100", 3)])
    );
    assert_eq!(
        availability_gate(Some("h100"), u32::MAX, u32::MAX),
        amounts(&[("h100", i64::MAX)]),
        "saturates"
    );
}

#[test]
fn no_gate_without_a_concrete_gpu_variant() {
    assert!(availability_gate(None, 8, 2).is_empty());
    assert!(availability_gate(Some(""), 8, 2).is_empty());
    assert!(availability_gate(Some("auto"), 8, 2).is_empty());
    assert!(availability_gate(Some(" AUTO "), 8, 2).is_empty());
}

// ---- held capacity and the ledger (the brief's worked examples) ----

#[test]
fn held_capacity_is_reclaimable_only_by_higher_bands() {
    let peers = [h100_peer(
        "p",
        Some(avail(
            GEN,
            &[("h100", 0)],
            &[(Band::Batch, &[("h100", 16)])],
        )),
    )];
    let got = assign(&[cand("/u/i", Band::Interactive, 1, 8)], &peers);
    assert_eq!(
        got,
        [Promotion {
            job_id: "/u/i".into(),
            peer_id: "p".into(),
            backend_id: "k8s".into(),
            generation: GEN,
            reserved: amounts(&[("h100", 8)]),
        }]
    );
    assert!(assign(&[cand("/u/b", Band::Batch, 1, 8)], &peers).is_empty());
}

#[test]
fn reservations_in_one_pass_reduce_capacity() {
    let peers = [h100_peer("p", free(16))];
    let cands = [
        cand("/u/a", Band::Interactive, 1, 8),
        cand("/u/b", Band::Interactive, 2, 8),
        cand("/u/c", Band::Interactive, 3, 8),
    ];
    assert_eq!(
        placed(&assign(&cands, &peers)),
        [("/u/a", "p", "k8s"), ("/u/b", "p", "k8s")]
    );
}

#[test]
fn ledger_reservations_count_only_at_their_generation() {
    let peers = [h100_peer("p", free(16))];
    let cands = [
        cand("/u/a", Band::Interactive, 1, 8),
        cand("/u/b", Band::Interactive, 2, 8),
        cand("/u/c", Band::Interactive, 3, 8),
    ];
    let charge = |generation| {
        let mut ledger = ReservationLedger::new();
        ledger.commit(&Promotion {
            job_id: "/u/earlier".into(),
            peer_id: "p".into(),
            backend_id: "k8s".into(),
            generation,
            reserved: amounts(&[("h100", 16)]),
        });
        ledger
    };
    let same = charge(GEN);
    assert!(assign_queued(&cands, &peers, &same, 8).is_empty());
    let older = charge(GEN - 30_000);
    assert_eq!(assign_queued(&cands, &peers, &older, 8).len(), 2);
}

#[test]
fn ledger_reservations_use_idle_before_held() {
    // 8 idle + 8 held by batch; 8 already reserved this generation took the idle part.
    let peers = [h100_peer(
        "p",
        Some(avail(GEN, &[("h100", 8)], &[(Band::Batch, &[("h100", 8)])])),
    )];
    let mut ledger = ReservationLedger::new();
    ledger.commit(&Promotion {
        job_id: "/u/earlier".into(),
        peer_id: "p".into(),
        backend_id: "k8s".into(),
        generation: GEN,
        reserved: amounts(&[("h100", 8)]),
    });
    let batch = [cand("/u/b", Band::Batch, 1, 8)];
    assert!(assign_queued(&batch, &peers, &ledger, 8).is_empty());
    let interactive = [cand("/u/i", Band::Interactive, 1, 8)];
    assert_eq!(assign_queued(&interactive, &peers, &ledger, 8).len(), 1);
}

#[test]
fn same_band_capacity_is_not_reclaimable() {
    let peers = [h100_peer(
        "p",
        Some(avail(GEN, &[], &[(Band::Interactive, &[("h100", 8)])])),
    )];
    assert!(assign(&[cand("/u/i", Band::Interactive, 1, 8)], &peers).is_empty());
    assert_eq!(
        assign(&[cand("/u/p", Band::Production, 1, 8)], &peers).len(),
        1
    );
}

#[test]
fn spending_takes_idle_then_the_lowest_band() {
    // Production takes 6: 4 idle, then 2 of batch's 4 (interactive's 4 untouched). An
    // interactive job may then use only batch's remaining 2.
    let peers = [h100_peer(
        "p",
        Some(avail(
            GEN,
            &[("h100", 4)],
            &[
                (Band::Interactive, &[("h100", 4)]),
                (Band::Batch, &[("h100", 4)]),
            ],
        )),
    )];
    let prod = cand("/u/p", Band::Production, 1, 6);
    let got = assign(
        &[prod.clone(), cand("/u/i3", Band::Interactive, 2, 3)],
        &peers,
    );
    assert_eq!(placed(&got), [("/u/p", "p", "k8s")]);
    let got = assign(&[prod, cand("/u/i2", Band::Interactive, 2, 2)], &peers);
    assert_eq!(got.len(), 2);
}

#[test]
fn tokens_are_compared_lower_case() {
    let peers = [h100_peer("p", Some(avail(GEN, &[("H100", 8)], &[])))];
    let mut c = cand("/u/a", Band::Batch, 1, 0);
    c.gate = amounts(&[(" H100", 8)]);
    let got = assign(&[c], &peers);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].reserved, amounts(&[("h100", 8)]));
}

// ---- ordering of options ----

#[test]
fn idle_fit_beats_reclaiming_held_capacity() {
    let peers = [
        // Exact fit, but only by reclaiming batch capacity.
        h100_peer(
            "reclaim",
            Some(avail(GEN, &[], &[(Band::Batch, &[("h100", 8)])])),
        ),
        // Idle fit with room to spare.
        h100_peer("idle", free(16)),
    ];
    let got = assign(&[cand("/u/i", Band::Interactive, 1, 8)], &peers);
    assert_eq!(placed(&got), [("/u/i", "idle", "k8s")]);
}

#[test]
fn tightest_fit_wins() {
    let peers = [
        h100_peer("roomy", free(64)),
        h100_peer("snug", free(9)),
        h100_peer("full", free(7)),
    ];
    let got = assign(&[cand("/u/a", Band::Batch, 1, 8)], &peers);
    assert_eq!(placed(&got), [("/u/a", "snug", "k8s")]);

    // Also between the backends of one peer.
    let one = [peer(
        "p",
        vec![
            h100_backend("big", free(64)),
            h100_backend("small", free(8)),
        ],
    )];
    let got = assign(&[cand("/u/a", Band::Batch, 1, 8)], &one);
    assert_eq!(placed(&got), [("/u/a", "p", "small")]);
}

#[test]
fn measured_beats_shape_only() {
    let peers = [h100_peer("legacy", None), h100_peer("metric", free(64))];
    let got = assign(&[cand("/u/a", Band::Batch, 1, 8)], &peers);
    assert_eq!(placed(&got), [("/u/a", "metric", "k8s")]);
    assert_eq!(got[0].generation, GEN);

    // A full metric backend is no option; the legacy peer still is.
    let peers = [h100_peer("legacy", None), h100_peer("metric", free(4))];
    let got = assign(&[cand("/u/a", Band::Batch, 1, 8)], &peers);
    assert_eq!(
        got,
        [Promotion {
            job_id: "/u/a".into(),
            peer_id: "legacy".into(),
            backend_id: "k8s".into(),
            generation: 0,
            reserved: BTreeMap::new(),
        }]
    );
}

#[test]
fn a_full_peer_is_waited_on() {
    let peers = [h100_peer("metric", free(4))];
    assert!(assign(&[cand("/u/a", Band::Batch, 1, 8)], &peers).is_empty());
    // Pinned too: a matching backend exists, so there is no force-route.
    let c = pinned(cand("/u/a", Band::Batch, 1, 8), "metric");
    assert!(assign(&[c], &peers).is_empty());
}

#[test]
fn availability_markers_prefer_more_capacity() {
    let mut shape = h100_shape();
    shape.push(Constraint::equals("availability:h100", "true"));
    let c = |job: &str| Candidate {
        job_id: job.into(),
        band: Band::Batch,
        submitted_at_ms: 1,
        shape: shape.clone(),
        pinned_peer: None,
        gate: BTreeMap::new(),
    };
    let peers = [h100_peer("small", free(8)), h100_peer("large", free(32))];
    for job in ["/u/a", "/u/b", "/u/c", "/u/d"] {
        let got = assign(&[c(job)], &peers);
        assert_eq!(placed(&got), [(job, "large", "k8s")]);
        assert!(got[0].reserved.is_empty(), "a marker spends nothing");
    }
}

#[test]
fn spread_matches_blake2b_64() {
    // Digests from Python's hashlib.blake2b(digest_size=8).
    assert_eq!(
        format!("{:016x}", spread("/alice/train", "east")),
        "9e459f928315e440"
    );
    assert_eq!(
        format!("{:016x}", spread("/alice/train", "west")),
        "63cfa230a13b0c0c"
    );
    assert_eq!(format!("{:016x}", spread("", "")), "94f6d9cdd1ea8248");
}

#[test]
fn spread_breaks_ties_stably() {
    let c = cand("/alice/train", Band::Batch, 1, 8);
    let east = h100_peer("east", free(16));
    let west = h100_peer("west", free(16));
    // west's hash is smaller, whatever the order of the peer list.
    for peers in [[east.clone(), west.clone()], [west, east]] {
        let got = assign(std::slice::from_ref(&c), &peers);
        assert_eq!(placed(&got), [("/alice/train", "west", "k8s")]);
    }
}

#[test]
fn spread_shares_load_between_equal_peers() {
    let peers: Vec<PeerView> = ["a", "b", "c"]
        .iter()
        .map(|p| h100_peer(p, free(1 << 20)))
        .collect();
    // No gate, so every fit is equally tight and only the hash tells the peers apart.
    let cands: Vec<Candidate> = (0..30)
        .map(|i| Candidate {
            gate: BTreeMap::new(),
            ..cand(&format!("/u/job-{i}"), Band::Batch, i, 0)
        })
        .collect();
    let got = assign_queued(&cands, &peers, &ReservationLedger::new(), 100);
    let mut per_peer: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &got {
        *per_peer.entry(&p.peer_id).or_default() += 1;
    }
    assert_eq!(got.len(), 30);
    assert_eq!(per_peer.len(), 3, "{per_peer:?}");
}

// ---- which peers and backends are eligible ----

#[test]
fn candidates_go_in_band_then_submission_order() {
    let peers = [h100_peer("p", free(8))];
    let cands = [
        cand("/u/batch-early", Band::Batch, 1, 8),
        cand("/u/inter-late", Band::Interactive, 9, 8),
        cand("/u/inter-b", Band::Interactive, 5, 8),
        cand("/u/inter-a", Band::Interactive, 5, 8),
    ];
    assert_eq!(
        placed(&assign(&cands, &peers)),
        [("/u/inter-a", "p", "k8s")]
    );
}

#[test]
fn per_peer_cap_limits_one_pass() {
    let peers = [h100_peer("p", free(100)), h100_peer("q", free(100))];
    let cands: Vec<Candidate> = (0..5)
        .map(|i| cand(&format!("/u/{i}"), Band::Batch, i, 1))
        .collect();
    let got = assign_queued(&cands, &peers, &ReservationLedger::new(), 2);
    assert_eq!(got.len(), 4);
    for id in ["p", "q"] {
        assert_eq!(got.iter().filter(|p| p.peer_id == id).count(), 2);
    }
    assert!(assign_queued(&cands, &peers, &ReservationLedger::new(), 0).is_empty());
}

#[test]
fn pinned_candidates_go_only_to_their_peer() {
    let peers = [h100_peer("best", free(8)), h100_peer("pin", free(64))];
    let got = assign(&[pinned(cand("/u/a", Band::Batch, 1, 8), "pin")], &peers);
    assert_eq!(placed(&got), [("/u/a", "pin", "k8s")]);
    let got = assign(
        &[pinned(cand("/u/a", Band::Batch, 1, 8), "unknown")],
        &peers,
    );
    assert!(got.is_empty());
}

#[test]
fn unreachable_peers_are_skipped() {
    let mut down = h100_peer("down", free(8));
    down.reachable = false;
    let peers = [down.clone(), h100_peer("up", free(64))];
    let got = assign(&[cand("/u/a", Band::Batch, 1, 8)], &peers);
    assert_eq!(placed(&got), [("/u/a", "up", "k8s")]);
    let got = assign(&[pinned(cand("/u/a", Band::Batch, 1, 8), "down")], &[down]);
    assert!(got.is_empty());
}

#[test]
fn backends_are_never_summed() {
    let peers = [peer(
        "p",
        vec![h100_backend("a", free(4)), h100_backend("b", free(4))],
    )];
    assert!(assign(&[cand("/u/a", Band::Batch, 1, 8)], &peers).is_empty());
    let got = assign(
        &[
            cand("/u/a", Band::Batch, 1, 4),
            cand("/u/b", Band::Batch, 2, 4),
        ],
        &peers,
    );
    assert_eq!(placed(&got), [("/u/a", "p", "a"), ("/u/b", "p", "b")]);
}

#[test]
fn force_route_without_a_matching_backend() {
    let cpu_peer = peer("cpu", vec![]);
    let gpu_peer = h100_peer("gpu", free(8));
    // No shape: a peer without backends still takes the job.
    let plain = Candidate {
        shape: vec![],
        gate: BTreeMap::new(),
        ..cand("/u/plain", Band::Batch, 1, 0)
    };
    let got = assign(
        std::slice::from_ref(&plain),
        std::slice::from_ref(&cpu_peer),
    );
    assert_eq!(
        got,
        [Promotion {
            job_id: "/u/plain".into(),
            peer_id: "cpu".into(),
            backend_id: String::new(),
            generation: 0,
            reserved: BTreeMap::new(),
        }]
    );
    // Shaped and unpinned: not without a match.
    let shaped = cand("/u/gpu", Band::Batch, 1, 8);
    assert!(assign(
        std::slice::from_ref(&shaped),
        std::slice::from_ref(&cpu_peer)
    )
    .is_empty());
    // Pinned: yes, even with a gate.
    let got = assign(&[pinned(shaped, "cpu")], &[cpu_peer, gpu_peer]);
    assert_eq!(placed(&got), [("/u/gpu", "cpu", "")]);
}

#[test]
fn each_job_is_promoted_once() {
    let peers = [h100_peer("p", free(64))];
    let cands = [
        cand("/u/a", Band::Batch, 1, 8),
        cand("/u/a", Band::Batch, 2, 8),
    ];
    assert_eq!(assign(&cands, &peers).len(), 1);
}

#[test]
fn cluster_constraints_in_the_shape_are_ignored() {
    let mut c = cand("/u/a", Band::Batch, 1, 8);
    c.shape.push(Constraint::equals("cluster", "p"));
    assert_eq!(assign(&[c], &[h100_peer("p", free(8))]).len(), 1);
}
