//! When the hub asks a peer `ListBackends` next (its heartbeat, and the probe that confirms a
//! suspected failure).
//!
//! At rest a peer gets one heartbeat per heartbeat interval (plus the sync loop's one call per
//! sync interval). A failed sync round or delivery makes the peer *suspect*: the heartbeat loop
//! is woken at once and, while the peer is suspect or unreachable, asks every
//! [`PROBE_INTERVAL`] with a [`PROBE_TIMEOUT`] — one request per second per peer at most, so a
//! killed peer is marked unreachable within a sync interval plus one probe, and a restarted one
//! is seen again within about a second.

use std::time::Duration;

/// The wait between probes of a suspect or unreachable peer.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a probe may take before it counts as a failure.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a heartbeat of a healthy peer may take.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// The wait before the next `ListBackends` to a peer.
pub fn heartbeat_wait(reachable: bool, suspect: bool, heartbeat_interval: Duration) -> Duration {
    if reachable && !suspect {
        heartbeat_interval
    } else {
        heartbeat_interval.min(PROBE_INTERVAL)
    }
}

/// The time limit of the next `ListBackends` to a peer.
pub fn probe_timeout(reachable: bool, suspect: bool) -> Duration {
    if reachable && !suspect {
        HEARTBEAT_TIMEOUT
    } else {
        PROBE_TIMEOUT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_healthy_peer_is_asked_at_the_heartbeat_interval_a_suspect_one_every_second() {
        let hb = Duration::from_secs(30);
        assert_eq!(heartbeat_wait(true, false, hb), hb);
        assert_eq!(heartbeat_wait(true, true, hb), PROBE_INTERVAL);
        assert_eq!(heartbeat_wait(false, false, hb), PROBE_INTERVAL);
        // A heartbeat faster than the probe is not slowed down.
        let fast = Duration::from_millis(500);
        assert_eq!(heartbeat_wait(false, true, fast), fast);
        assert_eq!(probe_timeout(true, false), Duration::from_secs(10));
        assert_eq!(probe_timeout(true, true), PROBE_TIMEOUT);
        assert_eq!(probe_timeout(false, false), PROBE_TIMEOUT);
    }
}
