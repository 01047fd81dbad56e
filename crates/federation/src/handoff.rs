//! Handoff states of a job sent to a peer, and the pending reason shown for it (§1.3, §1.10).

/// Where a SENT job is in its handoff to a peer. Persisted as [`HandoffState::code`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandoffState {
    /// Admitted on the parent; no peer chosen, nothing delivered.
    Queued,
    /// A peer was chosen by the tick; awaiting its `LaunchJob` acknowledgement.
    Pending,
    /// The peer accepted it; its state is mirrored by sync.
    HandedOff,
    /// The peer refused it with a verdict it would repeat. Terminal.
    Rejected,
}

impl HandoffState {
    /// All states, in code order.
    pub const ALL: [HandoffState; 4] = [
        HandoffState::Pending,
        HandoffState::HandedOff,
        HandoffState::Rejected,
        HandoffState::Queued,
    ];

    /// Persisted code: PENDING=0, HANDED_OFF=1, REJECTED=2, QUEUED=3.
    pub fn code(self) -> i32 {
        match self {
            HandoffState::Pending => 0,
            HandoffState::HandedOff => 1,
            HandoffState::Rejected => 2,
            HandoffState::Queued => 3,
        }
    }

    /// From a persisted code; `None` for an unknown one.
    pub fn from_code(code: i32) -> Option<HandoffState> {
        match code {
            0 => Some(HandoffState::Pending),
            1 => Some(HandoffState::HandedOff),
            2 => Some(HandoffState::Rejected),
            3 => Some(HandoffState::Queued),
            _ => None,
        }
    }
}

/// Why a federated job is still PENDING, for `JobStatus.pending_reason`.
///
/// `peer_id` is `""` for a queued job no peer was chosen for. `peer_reachable` is the peer's
/// last heartbeat result, `None` when it has not been heard from yet (the job is then simply
/// waiting for its report). `tasks_mirrored` is whether sync has mirrored any task row yet.
/// `peer_says` is the peer's own word: for a PENDING handle, why it refused the last offer; for
/// a handed-off job, the pending reason the peer reports for it (mirrored).
pub fn pending_reason(
    state: HandoffState,
    peer_id: &str,
    peer_reachable: Option<bool>,
    tasks_mirrored: bool,
    peer_says: Option<&str>,
) -> String {
    let says = peer_says.map(str::trim).filter(|s| !s.is_empty());
    match state {
        HandoffState::Queued if peer_id.is_empty() => {
            "Queued for a federation peer to report free capacity".to_string()
        }
        HandoffState::Queued if peer_reachable == Some(false) => {
            format!("Peer {peer_id} is unreachable; queued until it reconnects")
        }
        HandoffState::Queued => format!("Queued for peer {peer_id} to report free capacity"),
        HandoffState::Pending => match says {
            Some(why) => format!("Peer {peer_id} cannot run it yet: {why}"),
            None => format!("Awaiting acceptance by peer {peer_id}"),
        },
        HandoffState::HandedOff if !tasks_mirrored => {
            format!("Handed off to peer {peer_id}; awaiting first status report")
        }
        HandoffState::HandedOff | HandoffState::Rejected => match says {
            Some(why) => format!("Pending on peer {peer_id}: {why}"),
            None => format!("Pending on peer {peer_id}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HandoffState::*;

    #[test]
    fn codes_round_trip() {
        for s in HandoffState::ALL {
            assert_eq!(HandoffState::from_code(s.code()), Some(s));
        }
        assert_eq!(
            HandoffState::ALL.map(HandoffState::code),
            [0, 1, 2, 3],
            "ALL is in code order"
        );
        assert_eq!(Queued.code(), 3);
        assert_eq!(HandoffState::from_code(4), None);
        assert_eq!(HandoffState::from_code(-1), None);
    }

    #[test]
    fn the_peers_own_word_is_shown() {
        assert_eq!(
            pending_reason(
                Pending,
                "b",
                Some(true),
                false,
                Some("no worker has 8000m cpu (largest: 4000m)")
            ),
            "Peer b cannot run it yet: no worker has 8000m cpu (largest: 4000m)"
        );
        assert_eq!(
            pending_reason(
                HandedOff,
                "b",
                Some(true),
                true,
                Some("Waiting for 2 more workers")
            ),
            "Pending on peer b: Waiting for 2 more workers"
        );
        assert_eq!(
            pending_reason(HandedOff, "b", Some(true), true, Some("  ")),
            "Pending on peer b"
        );
        assert_eq!(
            pending_reason(Pending, "b", Some(true), false, None),
            "Awaiting acceptance by peer b"
        );
    }

    #[test]
    fn reasons() {
        let cases = [
            (
                Queued,
                "",
                None,
                false,
                "Queued for a federation peer to report free capacity",
            ),
            (
                Queued,
                "",
                Some(false),
                false,
                "Queued for a federation peer to report free capacity",
            ),
            (
                Queued,
                "east",
                Some(true),
                false,
                "Queued for peer east to report free capacity",
            ),
            (
                Queued,
                "east",
                None,
                false,
                "Queued for peer east to report free capacity",
            ),
            (
                Queued,
                "east",
                Some(false),
                false,
                "Peer east is unreachable; queued until it reconnects",
            ),
            (
                Pending,
                "east",
                Some(false),
                false,
                "Awaiting acceptance by peer east",
            ),
            (
                HandedOff,
                "east",
                Some(true),
                false,
                "Handed off to peer east; awaiting first status report",
            ),
            (HandedOff, "east", Some(true), true, "Pending on peer east"),
            (Rejected, "east", None, false, "Pending on peer east"),
        ];
        for (state, peer, reachable, mirrored, want) in cases {
            assert_eq!(
                pending_reason(state, peer, reachable, mirrored, None),
                want,
                "{state:?} {peer:?} {reachable:?}"
            );
        }
    }
}
