//! What the hub does with a peer's answer to a delivery (`LaunchJob` with a handoff), and when
//! it offers a refused job again.
//!
//! A peer that answers "I cannot host this now" (FAILED_PRECONDITION / RESOURCE_EXHAUSTED, e.g.
//! `no worker has 8000m cpu (largest: 4000m)`) is not a glitch to retry every sync round: each
//! offer carries the job's bundle. The hub keeps the peer's reason (shown as the job's pending
//! reason), offers again after an exponential backoff — [`FIRST_BACKOFF_MS`] doubled per
//! refusal, capped at [`MAX_BACKOFF_MS`] — and ends the job UNSCHEDULABLE with that reason once
//! its scheduling deadline passes ([`refusal_expired`]).

/// The first wait after a refusal: 2 s.
pub const FIRST_BACKOFF_MS: i64 = 2_000;
/// The longest wait between two offers of one refused job: 60 s.
pub const MAX_BACKOFF_MS: i64 = 60_000;
/// A delivery refused this many times in a row as UNAUTHENTICATED is a verdict, not a glitch.
pub const AUTH_FAILURE_VERDICT: u32 = 3;

/// A peer's answer to one delivery, as the caller reads its status code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerAnswer {
    /// The peer accepted the job.
    Accepted,
    /// A verdict the peer would repeat (ALREADY_EXISTS, PERMISSION_DENIED, INVALID_ARGUMENT).
    Verdict(String),
    /// The peer cannot host the job now (FAILED_PRECONDITION, RESOURCE_EXHAUSTED): its reason.
    CannotHost(String),
    /// UNAUTHENTICATED: a verdict only after [`AUTH_FAILURE_VERDICT`] in a row.
    Unauthenticated(String),
    /// The call failed on the way (unreachable, timed out, anything else): retried next round,
    /// and a reason to probe the peer at once.
    Transient(String),
}

impl PeerAnswer {
    /// The peer's words (empty for an acceptance).
    pub fn message(&self) -> &str {
        match self {
            PeerAnswer::Accepted => "",
            PeerAnswer::Verdict(m)
            | PeerAnswer::CannotHost(m)
            | PeerAnswer::Unauthenticated(m)
            | PeerAnswer::Transient(m) => m,
        }
    }
}

/// The hub's memory of one job's refused offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Consecutive CannotHost answers.
    pub refusals: u32,
    /// Consecutive Unauthenticated answers.
    pub auth_failures: u32,
    /// The peer's last reason.
    pub reason: String,
    /// No offer before this time.
    pub next_offer_ms: i64,
}

/// What to do after an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterAnswer {
    /// Mark the handle HANDED_OFF and forget any refusal.
    HandedOff,
    /// End the job with the peer's verdict.
    Reject(String),
    /// Keep the handle PENDING with this refusal record (wait until `next_offer_ms`).
    Wait(Refusal),
    /// Keep the handle PENDING; offer again next round. `suspect`: probe the peer now.
    Retry {
        /// The record to keep (auth failures counted), if any.
        keep: Option<Refusal>,
        /// The call failed on the way: the peer may be down.
        suspect: bool,
    },
}

/// The wait after the `n`-th consecutive refusal (n ≥ 1): 2 s, 4 s, 8 s, … capped at 60 s.
pub fn backoff_ms(n: u32) -> i64 {
    let shift = n.saturating_sub(1).min(20);
    FIRST_BACKOFF_MS
        .saturating_mul(1i64 << shift)
        .min(MAX_BACKOFF_MS)
}

/// Decides what an answer means given the job's previous refusal record.
pub fn after_answer(prev: Option<&Refusal>, answer: PeerAnswer, now_ms: i64) -> AfterAnswer {
    match answer {
        PeerAnswer::Accepted => AfterAnswer::HandedOff,
        PeerAnswer::Verdict(m) => AfterAnswer::Reject(m),
        PeerAnswer::CannotHost(reason) => {
            let refusals = prev.map_or(0, |p| p.refusals) + 1;
            AfterAnswer::Wait(Refusal {
                refusals,
                auth_failures: 0,
                reason,
                next_offer_ms: now_ms.saturating_add(backoff_ms(refusals)),
            })
        }
        PeerAnswer::Unauthenticated(m) => {
            let auth_failures = prev.map_or(0, |p| p.auth_failures) + 1;
            if auth_failures >= AUTH_FAILURE_VERDICT {
                return AfterAnswer::Reject(m);
            }
            AfterAnswer::Retry {
                keep: Some(Refusal {
                    auth_failures,
                    ..prev.cloned().unwrap_or(Refusal {
                        refusals: 0,
                        auth_failures: 0,
                        reason: String::new(),
                        next_offer_ms: 0,
                    })
                }),
                suspect: false,
            }
        }
        // A transport failure says nothing about the job: keep what the peer said before.
        PeerAnswer::Transient(_) => AfterAnswer::Retry {
            keep: prev.cloned(),
            suspect: true,
        },
    }
}

/// Whether a job with this record may be offered now.
pub fn may_offer(rec: Option<&Refusal>, now_ms: i64) -> bool {
    rec.is_none_or(|r| now_ms >= r.next_offer_ms)
}

/// The UNSCHEDULABLE message for a refused job past its scheduling deadline, or `None` while it
/// may still wait (no deadline, not passed, or the peer never said it cannot host it).
pub fn refusal_expired(
    rec: Option<&Refusal>,
    peer_id: &str,
    deadline_ms: Option<i64>,
    now_ms: i64,
) -> Option<String> {
    let r = rec.filter(|r| r.refusals > 0)?;
    let d = deadline_ms?;
    (now_ms > d).then(|| {
        format!(
            "Scheduling timeout exceeded: peer {peer_id} could not run the job: {}",
            r.reason
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let got: Vec<i64> = (1..=8).map(backoff_ms).collect();
        assert_eq!(
            got,
            [2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000]
        );
        assert_eq!(backoff_ms(0), 2_000);
        assert_eq!(backoff_ms(u32::MAX), MAX_BACKOFF_MS);
    }

    #[test]
    fn refusals_accumulate_and_an_acceptance_clears_them() {
        let why = "no worker has 8000m cpu (largest: 4000m)";
        let AfterAnswer::Wait(r1) = after_answer(None, PeerAnswer::CannotHost(why.into()), 1_000)
        else {
            panic!("a refusal waits");
        };
        assert_eq!((r1.refusals, r1.next_offer_ms), (1, 3_000));
        assert_eq!(r1.reason, why);
        assert!(!may_offer(Some(&r1), 2_999));
        assert!(may_offer(Some(&r1), 3_000));
        let AfterAnswer::Wait(r2) =
            after_answer(Some(&r1), PeerAnswer::CannotHost(why.into()), 3_000)
        else {
            panic!("a refusal waits");
        };
        assert_eq!((r2.refusals, r2.next_offer_ms), (2, 7_000));
        assert_eq!(
            after_answer(Some(&r2), PeerAnswer::Accepted, 7_000),
            AfterAnswer::HandedOff
        );
        assert!(may_offer(None, 0));
    }

    #[test]
    fn transport_failures_keep_the_record_and_make_the_peer_suspect() {
        let r = Refusal {
            refusals: 2,
            auth_failures: 0,
            reason: "full".into(),
            next_offer_ms: 9,
        };
        assert_eq!(
            after_answer(Some(&r), PeerAnswer::Transient("refused".into()), 10),
            AfterAnswer::Retry {
                keep: Some(r.clone()),
                suspect: true
            }
        );
        assert_eq!(
            after_answer(None, PeerAnswer::Verdict("dup".into()), 0),
            AfterAnswer::Reject("dup".into())
        );
    }

    #[test]
    fn unauthenticated_becomes_a_verdict_on_the_third_answer_in_a_row() {
        let mut prev: Option<Refusal> = None;
        for _ in 1..AUTH_FAILURE_VERDICT {
            match after_answer(prev.as_ref(), PeerAnswer::Unauthenticated("bad".into()), 0) {
                AfterAnswer::Retry {
                    keep,
                    suspect: false,
                } => prev = keep,
                other => panic!("not yet a verdict: {other:?}"),
            }
        }
        assert_eq!(
            after_answer(prev.as_ref(), PeerAnswer::Unauthenticated("bad".into()), 0),
            AfterAnswer::Reject("bad".into())
        );
    }

    #[test]
    fn only_a_refused_job_expires_and_only_after_its_deadline() {
        let r = Refusal {
            refusals: 1,
            auth_failures: 0,
            reason: "no worker has 8000m cpu (largest: 4000m)".into(),
            next_offer_ms: 0,
        };
        assert_eq!(refusal_expired(Some(&r), "b", Some(100), 100), None);
        assert_eq!(refusal_expired(Some(&r), "b", None, 1_000), None);
        assert_eq!(refusal_expired(None, "b", Some(100), 1_000), None);
        let auth_only = Refusal {
            refusals: 0,
            auth_failures: 1,
            ..r.clone()
        };
        assert_eq!(refusal_expired(Some(&auth_only), "b", Some(1), 1_000), None);
        assert_eq!(
            refusal_expired(Some(&r), "b", Some(100), 101).as_deref(),
            Some("Scheduling timeout exceeded: peer b could not run the job: no worker has 8000m cpu (largest: 4000m)")
        );
    }
}
