//! Reservations charged against a peer's last reported capacity (§1.5).

use std::collections::BTreeMap;

use crate::Promotion;

/// What this parent has already promoted against each `(peer, backend)` observation.
///
/// A peer's heartbeat reports free capacity as of one observation (its generation). Jobs
/// promoted against that observation are not in the numbers yet, so the ledger remembers
/// them until the peer reports a different generation, whose numbers already account for
/// whatever was delivered. The ledger lives in memory only: after a restart, over-assignment
/// is bounded by one observation's free capacity plus the per-tick cap, and the peer's own
/// scheduler is the backstop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReservationLedger {
    entries: BTreeMap<(String, String), Entry>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Entry {
    generation: i64,
    reserved: BTreeMap<String, i64>,
}

impl ReservationLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// The amounts reserved against `(peer, backend)` at `generation`: empty unless the
    /// stored generation is exactly `generation` and `generation` is not zero.
    pub fn reserved_for(
        &self,
        peer: &str,
        backend: &str,
        generation: i64,
    ) -> BTreeMap<String, i64> {
        if generation == 0 {
            return BTreeMap::new();
        }
        self.entries
            .get(&(peer.to_string(), backend.to_string()))
            .filter(|e| e.generation == generation)
            .map(|e| e.reserved.clone())
            .unwrap_or_default()
    }

    /// Charges a promotion that the store confirmed. Promotions without a generation or
    /// without positive amounts (shape-only, force-routed, empty gate) are ignored. A stored
    /// entry of a different generation is discarded first: the peer has reported anew.
    pub fn commit(&mut self, p: &Promotion) {
        let mut amounts = p.reserved.iter().filter(|(_, v)| **v > 0).peekable();
        if p.generation == 0 || amounts.peek().is_none() {
            return;
        }
        let entry = self
            .entries
            .entry((p.peer_id.clone(), p.backend_id.clone()))
            .or_default();
        if entry.generation != p.generation {
            *entry = Entry {
                generation: p.generation,
                reserved: BTreeMap::new(),
            };
        }
        for (token, amount) in amounts {
            let slot = entry.reserved.entry(token.clone()).or_insert(0);
            *slot = slot.saturating_add(*amount);
        }
    }

    /// Forgets every peer not in `peers` (no longer configured).
    pub fn retain_peers(&mut self, peers: &[String]) {
        self.entries.retain(|(peer, _), _| peers.contains(peer));
    }

    /// True when nothing is reserved.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::amounts;

    fn promo(peer: &str, backend: &str, generation: i64, reserved: &[(&str, i64)]) -> Promotion {
        Promotion {
            job_id: "/u/j".into(),
            peer_id: peer.into(),
            backend_id: backend.into(),
            generation,
            reserved: amounts(reserved),
        }
    }

    #[test]
    fn reservations_accumulate_within_a_generation() {
        let mut l = ReservationLedger::new();
        l.commit(&promo("p", "b", 7, &[("h100", 8)]));
        l.commit(&promo("p", "b", 7, &[("h100", 8), ("a100", 1)]));
        assert_eq!(
            l.reserved_for("p", "b", 7),
            amounts(&[("a100", 1), ("h100", 16)])
        );
        assert!(l.reserved_for("p", "b", 8).is_empty());
        assert!(l.reserved_for("p", "other", 7).is_empty());
        assert!(l.reserved_for("q", "b", 7).is_empty());
    }

    #[test]
    fn a_new_generation_starts_over() {
        let mut l = ReservationLedger::new();
        l.commit(&promo("p", "b", 7, &[("h100", 8)]));
        l.commit(&promo("p", "b", 9, &[("h100", 4)]));
        assert!(l.reserved_for("p", "b", 7).is_empty());
        assert_eq!(l.reserved_for("p", "b", 9), amounts(&[("h100", 4)]));
        // A peer whose clock went back reports a lower generation: that is new too.
        l.commit(&promo("p", "b", 3, &[("h100", 2)]));
        assert_eq!(l.reserved_for("p", "b", 3), amounts(&[("h100", 2)]));
        assert!(l.reserved_for("p", "b", 9).is_empty());
    }

    #[test]
    fn generation_zero_and_empty_reservations_are_ignored() {
        let mut l = ReservationLedger::new();
        l.commit(&promo("p", "b", 0, &[("h100", 8)]));
        l.commit(&promo("p", "b", 5, &[]));
        l.commit(&promo("p", "b", 5, &[("h100", 0)]));
        assert!(l.is_empty());
        assert!(l.reserved_for("p", "b", 0).is_empty());
        // An ignored promotion does not reset the stored generation either.
        l.commit(&promo("p", "b", 5, &[("h100", 1)]));
        l.commit(&promo("p", "b", 6, &[]));
        assert_eq!(l.reserved_for("p", "b", 5), amounts(&[("h100", 1)]));
    }

    #[test]
    fn retain_peers_drops_unconfigured_peers() {
        let mut l = ReservationLedger::new();
        l.commit(&promo("keep", "b", 1, &[("h100", 1)]));
        l.commit(&promo("gone", "b", 1, &[("h100", 1)]));
        l.retain_peers(&["keep".to_string()]);
        assert_eq!(l.reserved_for("keep", "b", 1), amounts(&[("h100", 1)]));
        assert!(l.reserved_for("gone", "b", 1).is_empty());
        l.retain_peers(&[]);
        assert!(l.is_empty());
    }
}
