//! Pending-task order (§4.2 step 3): band, then fair round-robin across users by spend.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::model::PendingTask;
use iris_types::Band;

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
