//! Submit-time classification of a root job (§1.1).

use iris_types::Constraint;

use crate::routing::{backend_satisfies_all, cluster_pin, routing_constraints};
use crate::PeerView;

/// Where a newly submitted root job goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Run it on this controller's own backend.
    Local,
    /// Admit it to the federation queue. `pinned_peer` is the peer named by a `cluster`
    /// constraint; `None` lets the tick choose.
    Queue {
        /// The peer the job must go to, if pinned.
        pinned_peer: Option<String>,
    },
    /// Neither this controller nor any reachable peer can host it.
    Reject,
}

/// Classifies a job. The first rule that applies wins:
///
/// 1. pinned (`cluster EQ <peer>`) → queued for that peer, even if it could run locally and
///    even if the peer is unreachable (the caller checks that the peer is configured);
/// 2. `local_feasible` → local;
/// 3. some reachable peer can host it → queued, unpinned;
/// 4. otherwise → rejected.
///
/// A peer can host a job when it is reachable and either the job has no routing constraints
/// (plain CPU work goes anywhere) or a single one of its backends satisfies all of them.
/// Constraints are never satisfied by combining two backends of one peer.
pub fn classify(
    constraints: &[Constraint],
    local_feasible: bool,
    peers: &[PeerView],
) -> Disposition {
    if let Some(pin) = cluster_pin(constraints) {
        return Disposition::Queue {
            pinned_peer: Some(pin),
        };
    }
    if local_feasible {
        return Disposition::Local;
    }
    let shape = routing_constraints(constraints);
    if peers.iter().any(|p| peer_can_host(p, &shape)) {
        Disposition::Queue { pinned_peer: None }
    } else {
        Disposition::Reject
    }
}

/// The peers a job would go to: its pinned peer, else every reachable peer that can host it
/// (in the order given), for messages that name them.
pub fn candidate_peers(constraints: &[Constraint], peers: &[PeerView]) -> Vec<String> {
    if let Some(pin) = cluster_pin(constraints) {
        return vec![pin];
    }
    let shape = routing_constraints(constraints);
    peers
        .iter()
        .filter(|p| peer_can_host(p, &shape))
        .map(|p| p.peer_id.clone())
        .collect()
}

fn peer_can_host(peer: &PeerView, shape: &[Constraint]) -> bool {
    peer.reachable
        && (shape.is_empty()
            || peer
                .backends
                .iter()
                .any(|b| backend_satisfies_all(&b.advertised, shape)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{adv, backend, peer};

    fn gpu(variant: &str) -> Vec<Constraint> {
        vec![
            Constraint::equals("device-type", "gpu"),
            Constraint::equals("device-variant", variant),
        ]
    }

    fn h100_peer(id: &str, reachable: bool) -> PeerView {
        let mut p = peer(
            id,
            vec![backend(
                "k8s",
                adv(&[("device-type", &["gpu"]), ("device-variant", &["h100"])]),
                None,
            )],
        );
        p.reachable = reachable;
        p
    }

    #[test]
    fn pin_wins_over_local_and_reachability() {
        let mut cs = gpu("h100");
        cs.push(Constraint::equals("cluster", "far"));
        let want = Disposition::Queue {
            pinned_peer: Some("far".into()),
        };
        assert_eq!(classify(&cs, true, &[]), want);
        assert_eq!(classify(&cs, false, &[h100_peer("far", false)]), want);
    }

    #[test]
    fn candidate_peers_are_the_pin_or_every_reachable_host() {
        let peers = [
            h100_peer("a", true),
            h100_peer("b", false),
            h100_peer("c", true),
        ];
        assert_eq!(candidate_peers(&gpu("h100"), &peers), ["a", "c"]);
        assert!(candidate_peers(&gpu("a100"), &peers).is_empty());
        let mut pinned = gpu("h100");
        pinned.push(Constraint::equals(crate::CLUSTER_KEY, "b"));
        assert_eq!(candidate_peers(&pinned, &peers), ["b"]);
    }

    #[test]
    fn local_before_peers() {
        assert_eq!(
            classify(&gpu("h100"), true, &[h100_peer("a", true)]),
            Disposition::Local
        );
    }

    #[test]
    fn queued_when_a_reachable_peer_matches() {
        let peers = [h100_peer("down", false), h100_peer("up", true)];
        assert_eq!(
            classify(&gpu("h100"), false, &peers),
            Disposition::Queue { pinned_peer: None }
        );
        assert_eq!(classify(&gpu("a100"), false, &peers), Disposition::Reject);
        assert_eq!(
            classify(&gpu("h100"), false, &peers[..1]),
            Disposition::Reject
        );
    }

    #[test]
    fn plain_cpu_job_goes_to_any_reachable_peer() {
        let cs = vec![
            Constraint::equals("device-type", "cpu"),
            Constraint::equals("pool", "ignored"),
        ];
        let empty = peer("bare", vec![]);
        assert_eq!(
            classify(&cs, false, &[empty]),
            Disposition::Queue { pinned_peer: None }
        );
        assert_eq!(
            classify(&cs, false, &[h100_peer("down", false)]),
            Disposition::Reject
        );
        assert_eq!(classify(&cs, false, &[]), Disposition::Reject);
    }

    #[test]
    fn constraints_are_not_split_across_backends() {
        let split = peer(
            "split",
            vec![
                backend("a", adv(&[("device-variant", &["h100"])]), None),
                backend("b", adv(&[("region", &["us"])]), None),
            ],
        );
        let cs = vec![
            Constraint::equals("device-variant", "h100"),
            Constraint::equals("region", "us"),
        ];
        assert_eq!(classify(&cs, false, &[split]), Disposition::Reject);
    }
}
