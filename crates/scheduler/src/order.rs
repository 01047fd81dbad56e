//! Pending-task order (§4.2 step 3): band, then fair round-robin across users by spend.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::model::{JobKey, PendingTask};
use iris_types::Band;
use rustc_hash::FxHashMap;

/// The base order of one user's tasks: deeper jobs first, then older trees, older jobs,
/// insertion order, and finally the task key so that the order is total.
pub(crate) fn base_cmp(a: &PendingTask, b: &PendingTask) -> Ordering {
    b.depth
        .cmp(&a.depth)
        .then(a.root_submitted_ms.cmp(&b.root_submitted_ms))
        .then(a.submitted_ms.cmp(&b.submitted_ms))
        .then(a.insertion.cmp(&b.insertion))
        .then_with(|| a.task.cmp(&b.task))
}

/// The per-job gate (the reference's `apply_scheduling_gates`): of each job that is not
/// coscheduled, only its first `cap` tasks in base order enter the cycle; a gang enters whole.
/// Gating before ordering keeps a cycle's work proportional to jobs × `cap` rather than to every
/// pending task (a million of them at C1M shape).
pub(crate) struct Gate {
    /// Indices into `pending` that enter the cycle, ascending; `None` when every task does.
    pub(crate) kept: Option<Vec<usize>>,
    /// Jobs with tasks held back.
    pub(crate) capped: Vec<JobKey>,
}

pub(crate) fn gate(pending: &[PendingTask], cap: usize) -> Gate {
    // Per job: its kept tasks (at most `cap`, base order) and whether any was held back.
    struct Slot {
        kept: Vec<usize>,
        held_back: bool,
    }
    let mut slots: Vec<Slot> = Vec::new();
    let mut ids: FxHashMap<&str, usize> = FxHashMap::default();
    // A job's tasks usually arrive together: the previous task's slot is tried first.
    let mut last: Option<(&str, usize)> = None;
    let mut any_held_back = false;
    let mut gangs: Vec<usize> = Vec::new();
    for (i, t) in pending.iter().enumerate() {
        if t.group_by.is_some() {
            gangs.push(i);
            continue;
        }
        let job = t.job.as_str();
        let n = match last.filter(|(prev, _)| *prev == job) {
            Some((_, n)) => n,
            None => {
                let next = slots.len();
                let n = *ids.entry(job).or_insert(next);
                if n == next {
                    slots.push(Slot {
                        kept: Vec::with_capacity(cap.min(8)),
                        held_back: false,
                    });
                }
                last = Some((job, n));
                n
            }
        };
        let slot = &mut slots[n];
        let at = slot
            .kept
            .partition_point(|&k| base_cmp(&pending[k], t) == Ordering::Less);
        if at < cap {
            if slot.kept.len() == cap {
                slot.kept.pop();
                slot.held_back = true;
                any_held_back = true;
            }
            slot.kept.insert(at, i);
        } else {
            slot.held_back = true;
            any_held_back = true;
        }
    }
    if !any_held_back {
        return Gate {
            kept: None,
            capped: Vec::new(),
        };
    }
    let mut capped: Vec<JobKey> = Vec::new();
    let mut kept: Vec<usize> = Vec::with_capacity(slots.len() * cap);
    for (job, n) in ids {
        let slot = &slots[n];
        if slot.held_back {
            capped.push(job.to_string());
        }
        kept.extend_from_slice(&slot.kept);
    }
    kept.extend(gangs);
    kept.sort_unstable();
    capped.sort_unstable();
    Gate {
        kept: Some(kept),
        capped,
    }
}

/// Returns indices into `pending` in scheduling order.
///
/// Bands go in rank order (System, Production, Interactive, Batch). Within a band, users take
/// turns, one task each per round, in ascending order of `user_spend` (missing = 0; ties by
/// user name). Each user's tasks keep the base order: `depth` descending (deeper jobs first),
/// then `root_submitted_ms`, `submitted_ms` and `insertion` ascending, then task key. The result
/// depends only on the set of tasks, not on their order in `pending` (task keys are assumed
/// unique).
pub fn order_pending(pending: &[PendingTask], user_spend: &BTreeMap<String, i64>) -> Vec<usize> {
    let mut out = Vec::with_capacity(pending.len());
    for band in Band::ALL {
        let mut by_user: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, t) in pending.iter().enumerate() {
            if t.band == band {
                by_user.entry(t.user.as_str()).or_default().push(i);
            }
        }
        let mut users: Vec<(i64, &str, Vec<usize>)> = by_user
            .into_iter()
            .map(|(user, mut tasks)| {
                tasks.sort_by(|&a, &b| base_cmp(&pending[a], &pending[b]));
                let spend = user_spend.get(user).copied().unwrap_or(0);
                (spend, user, tasks)
            })
            .collect();
        users.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(b.1)));
        let mut queues: Vec<std::vec::IntoIter<usize>> =
            users.into_iter().map(|(_, _, t)| t.into_iter()).collect();
        while !queues.is_empty() {
            queues.retain_mut(|q| match q.next() {
                Some(i) => {
                    out.push(i);
                    true
                }
                None => false,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::pending;

    fn keys(p: &[PendingTask], spend: &BTreeMap<String, i64>) -> Vec<String> {
        order_pending(p, spend)
            .into_iter()
            .map(|i| p[i].task.clone())
            .collect()
    }

    /// The gate keeps each solo job's first `cap` tasks in base order whatever the input order,
    /// lets gangs in whole, and names exactly the jobs it held tasks of.
    #[test]
    fn the_gate_keeps_each_jobs_first_tasks_in_base_order() {
        let mut p: Vec<PendingTask> = Vec::new();
        for i in [5, 2, 7, 0, 6, 1, 4, 3] {
            p.push(pending(&format!("/u/a/{i}")).insertion(i).build());
        }
        p.push(pending("/u/b/0").build());
        for i in 0..6 {
            p.push(pending(&format!("/u/g/{i}")).group_by("pool").build());
        }
        let g = gate(&p, 3);
        let kept: Vec<&str> = g
            .kept
            .as_ref()
            .expect("some held back")
            .iter()
            .map(|&i| p[i].task.as_str())
            .collect();
        let mut solo: Vec<&str> = kept
            .iter()
            .copied()
            .filter(|t| t.starts_with("/u/a"))
            .collect();
        solo.sort();
        assert_eq!(solo, ["/u/a/0", "/u/a/1", "/u/a/2"]);
        assert!(kept.contains(&"/u/b/0"));
        assert_eq!(kept.iter().filter(|t| t.starts_with("/u/g")).count(), 6);
        assert_eq!(g.capped, ["/u/a"]);
        assert!(
            gate(&p, 8).kept.is_none(),
            "nothing held back: the input as it is"
        );
    }

    #[test]
    fn bands_in_rank_order() {
        let p = vec![
            pending("/a/batch/0").band(Band::Batch).build(),
            pending("/a/int/0").band(Band::Interactive).build(),
            pending("/a/sys/0").band(Band::System).build(),
            pending("/a/prod/0").band(Band::Production).build(),
        ];
        assert_eq!(
            keys(&p, &BTreeMap::new()),
            ["/a/sys/0", "/a/prod/0", "/a/int/0", "/a/batch/0"]
        );
    }

    #[test]
    fn round_robin_by_ascending_spend_then_name() {
        let p = vec![
            pending("/rich/j/0").insertion(0).build(),
            pending("/rich/j/1").insertion(1).build(),
            pending("/poor/j/0").insertion(0).build(),
            pending("/poor/j/1").insertion(1).build(),
            pending("/poor/j/2").insertion(2).build(),
            pending("/bob/j/0").build(),
            pending("/amy/j/0").build(),
        ];
        let spend = BTreeMap::from([("rich".to_string(), 500), ("poor".to_string(), 10)]);
        // amy and bob have spend 0 (ties by name), then poor (10), then rich (500).
        assert_eq!(
            keys(&p, &spend),
            [
                "/amy/j/0",
                "/bob/j/0",
                "/poor/j/0",
                "/rich/j/0",
                "/poor/j/1",
                "/rich/j/1",
                "/poor/j/2"
            ]
        );
    }

    #[test]
    fn base_order_within_a_user() {
        let p = vec![
            pending("/u/late/0").root_submitted(5).submitted(5).build(),
            pending("/u/early/1")
                .root_submitted(1)
                .submitted(1)
                .insertion(1)
                .build(),
            pending("/u/early/0")
                .root_submitted(1)
                .submitted(1)
                .insertion(0)
                .build(),
            pending("/u/early/child/0")
                .depth(2)
                .root_submitted(1)
                .submitted(9)
                .build(),
            pending("/u/mid/0").root_submitted(1).submitted(3).build(),
        ];
        assert_eq!(
            keys(&p, &BTreeMap::new()),
            [
                "/u/early/child/0",
                "/u/early/0",
                "/u/early/1",
                "/u/mid/0",
                "/u/late/0"
            ]
        );
    }

    #[test]
    fn independent_of_input_order() {
        let mut p = vec![
            pending("/a/x/0").build(),
            pending("/b/x/0").build(),
            pending("/a/x/1").build(),
            pending("/c/y/0").band(Band::Production).build(),
        ];
        let first = keys(&p, &BTreeMap::new());
        p.reverse();
        assert_eq!(keys(&p, &BTreeMap::new()), first);
    }
}
