//! The side of the picture that changes little from one tick to the next: workers, the tasks
//! holding resources on them, and the indexes every plan starts from (capacity left by running
//! tasks, running tasks per worker and per slice, solo victims in victim order). [`Cluster`]
//! keeps them across ticks and takes changes in batches, so a tick after a small change does
//! not sort and index every running task again (issue 17: 86,655 running tasks at 100,000 ×
//! 10,000 cost ~45 ms per tick to re-index).
//!
//! Architecture Invariant: a cluster brought to a state by any sequence of [`Cluster::update`],
//! [`Cluster::set_workers`] and [`Cluster::sync`] plans exactly as one built from that state
//! ([`crate::schedule`] builds one per call). The indexes are kept in the order a fresh build
//! gives: running tasks by (task key, worker), per-worker and per-slice lists ascending, solo
//! victims by [`VictimKey`].

use std::cmp::{Ordering, Reverse};
use std::collections::BTreeMap;

use crate::constraint::normalize;
use crate::engine::{CSetCache, Engine};
use crate::explain::Explanation;
use crate::model::{PendingTask, Plan, Policy, ResourcesExt, RunningTask, Worker};
use iris_types::Resources;
use rustc_hash::FxHashMap;

/// How many per-worker entries (about 13 bytes each) the constraint-set cache may hold before a
/// plan starts it afresh: 2,000,000 is ~26 MB, 200 distinct constraint lists at 10,000 workers.
const MAX_CACHED_CSET_CELLS: usize = 2_000_000;

/// Sort key for victims: lowest band first, then cheapest, then task key (= index order).
pub(crate) type VictimKey = (Reverse<u8>, (i64, i64, i64), usize);

/// Device variants numbered by their normalized spelling, each raw spelling normalized once.
#[derive(Clone, Default)]
pub(crate) struct Variants {
    pub(crate) names: Vec<String>,
    by_name: FxHashMap<String, usize>,
    by_raw: FxHashMap<String, usize>,
}

impl Variants {
    /// The number of `raw`'s normalized spelling, numbering it if it is new.
    pub(crate) fn id(&mut self, raw: &str) -> usize {
        if let Some(&id) = self.by_raw.get(raw) {
            return id;
        }
        let n = normalize(raw);
        let next = self.names.len();
        let id = *self.by_name.entry(n.clone()).or_insert(next);
        if id == next {
            self.names.push(n);
        }
        self.by_raw.insert(raw.to_string(), id);
        id
    }
}

/// Workers and running tasks with their indexes, kept across ticks (see the module docs).
#[derive(Clone, Default)]
pub struct Cluster {
    /// Sorted by id; duplicates dropped.
    pub(crate) workers: Vec<Worker>,
    worker_idx: FxHashMap<String, usize>,
    /// Sorted by (task key, worker). Boxed so that a change moves pointers, not ~150-byte
    /// values, when it shifts the tasks after it.
    #[allow(clippy::vec_box, reason = "a change shifts pointers, not whole tasks")]
    pub(crate) running: Vec<Box<RunningTask>>,
    /// Index of the worker holding each running task, if known.
    pub(crate) running_worker: Vec<Option<usize>>,
    /// Running tasks per worker, ascending.
    pub(crate) on_worker: Vec<Vec<usize>>,
    /// Coscheduled running tasks per job ("slices"), ascending.
    pub(crate) slices: BTreeMap<String, Vec<usize>>,
    /// Per worker: total minus what its running tasks hold.
    pub(crate) free: Vec<Resources>,
    /// Per worker: ASSIGNED/BUILDING tasks.
    pub(crate) building: Vec<usize>,
    /// Every running task's variant number, and the numbering (pending tasks' variants join it
    /// during a plan, on a copy).
    pub(crate) variant_of: Vec<usize>,
    pub(crate) variants: Variants,
    /// Solo victims (RUNNING, not in a slice, on a known worker) per variant, in victim order.
    pub(crate) solo_victims: Vec<Vec<usize>>,
    /// What each constraint list seen so far makes of the workers; dropped when they change.
    pub(crate) csets: CSetCache,
}

/// The order of [`Cluster::running`]. Keys are unique in practice; the worker makes the order
/// total anyway.
fn running_cmp(a: &RunningTask, b: &RunningTask) -> Ordering {
    a.task.cmp(&b.task).then_with(|| a.worker.cmp(&b.worker))
}

/// The first 16 bytes of `s`, zero-padded, as a big-endian number: where two of them differ, they
/// order as the strings do.
fn key_prefix(s: &str) -> u128 {
    let mut b = [0u8; 16];
    let n = s.len().min(16);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    u128::from_be_bytes(b)
}

/// Sorts running tasks into [`running_cmp`] order. The keys' first 16 bytes ride along, so most
/// comparisons touch neither the task nor its key's heap bytes (tens of thousands of running
/// tasks at scale).
#[allow(clippy::vec_box, reason = "the boxes become `Cluster::running`")]
fn sort_running(running: Vec<RunningTask>) -> Vec<Box<RunningTask>> {
    if running.is_sorted_by(|a, b| running_cmp(a, b) != Ordering::Greater) {
        return running.into_iter().map(Box::new).collect();
    }
    // Sorted as (prefix, position) pairs, then moved once: sorting the tasks themselves moves
    // ~150-byte values at every swap.
    let mut keyed: Vec<(u128, usize)> = running
        .iter()
        .enumerate()
        .map(|(i, rt)| (key_prefix(&rt.task), i))
        .collect();
    keyed.sort_unstable_by(|(pa, a), (pb, b)| {
        pa.cmp(pb)
            .then_with(|| running_cmp(&running[*a], &running[*b]))
    });
    let mut slots: Vec<Option<RunningTask>> = running.into_iter().map(Some).collect();
    keyed
        .iter()
        .filter_map(|&(_, i)| slots[i].take())
        .map(Box::new)
        .collect()
}

fn sort_workers(mut workers: Vec<Worker>) -> Vec<Worker> {
    workers.sort_by(|a, b| a.id.cmp(&b.id));
    workers.dedup_by(|a, b| a.id == b.id);
    workers
}

/// Inserts `x` into ascending `list`.
fn insert_sorted(list: &mut Vec<usize>, x: usize) {
    let at = list.partition_point(|&y| y < x);
    list.insert(at, x);
}

/// Renumbers the entries of `list` through `map` (monotonic), dropping removed ones.
fn remap(list: &mut Vec<usize>, map: &[usize]) {
    list.retain_mut(|r| {
        let n = map[*r];
        *r = n;
        n != usize::MAX
    });
}

impl Cluster {
    /// Indexes `workers` (any order) and the tasks holding resources on them (any order).
    pub fn new(workers: Vec<Worker>, running: Vec<RunningTask>) -> Cluster {
        let mut c = Cluster::default();
        c.index_workers(sort_workers(workers));
        c.running = sort_running(running);
        c.reindex_running();
        c
    }

    /// The workers, in id order.
    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// The tasks holding resources, in (task key, worker) order.
    pub fn running(&self) -> impl ExactSizeIterator<Item = &RunningTask> {
        self.running.iter().map(|rt| &**rt)
    }

    fn index_workers(&mut self, workers: Vec<Worker>) {
        self.worker_idx = workers
            .iter()
            .enumerate()
            .map(|(i, w)| (w.id.clone(), i))
            .collect();
        self.workers = workers;
    }

    /// Builds every running-task index from `self.running` (already sorted).
    fn reindex_running(&mut self) {
        let n_workers = self.workers.len();
        self.free = self.workers.iter().map(|w| w.total.clone()).collect();
        self.building = vec![0; n_workers];
        self.on_worker = vec![Vec::new(); n_workers];
        self.slices = BTreeMap::new();
        self.running_worker = Vec::with_capacity(self.running.len());
        self.variant_of = Vec::with_capacity(self.running.len());
        for r in 0..self.running.len() {
            let rt = &self.running[r];
            let w = self.worker_idx.get(rt.worker.as_str()).copied();
            self.running_worker.push(w);
            self.variant_of.push(self.variants.id(&rt.device_variant));
            self.hold(r);
        }
        self.solo_victims = vec![Vec::new(); self.variants.names.len()];
        for r in 0..self.running.len() {
            if self.is_solo_victim(r) {
                self.solo_victims[self.variant_of[r]].push(r);
            }
        }
        for list in &mut self.solo_victims {
            let running = &self.running;
            list.sort_by_cached_key(|&r| victim_key(running, r));
        }
    }

    /// Counts running task `r` (already numbered) on its worker and in its slice, keeping their
    /// lists ascending (a fresh build meets `r` in ascending order, so it appends).
    fn hold(&mut self, r: usize) {
        let rt = &self.running[r];
        if let Some(w) = self.running_worker[r] {
            self.free[w].sub(&rt.resources);
            if !rt.running {
                self.building[w] += 1;
            }
            insert_sorted(&mut self.on_worker[w], r);
        }
        if rt.coscheduled {
            match self.slices.get_mut(rt.job.as_str()) {
                Some(members) => insert_sorted(members, r),
                None => {
                    self.slices.insert(rt.job.clone(), vec![r]);
                }
            }
        }
    }

    fn is_solo_victim(&self, r: usize) -> bool {
        let rt = &self.running[r];
        rt.running && !rt.coscheduled && self.running_worker[r].is_some()
    }

    /// Replaces the workers. When the set of ids is unchanged only capacity is recomputed
    /// (health, attributes and totals change without re-indexing the running tasks); otherwise
    /// every index is rebuilt.
    pub fn set_workers(&mut self, workers: Vec<Worker>) {
        let workers = sort_workers(workers);
        if workers == self.workers {
            return;
        }
        self.csets = CSetCache::default();
        let same_ids = workers.len() == self.workers.len()
            && workers.iter().zip(&self.workers).all(|(a, b)| a.id == b.id);
        if !same_ids {
            self.index_workers(workers);
            self.reindex_running();
            return;
        }
        self.workers = workers;
        self.free = self.workers.iter().map(|w| w.total.clone()).collect();
        for (r, rt) in self.running.iter().enumerate() {
            if let Some(w) = self.running_worker[r] {
                self.free[w].sub(&rt.resources);
            }
        }
    }

    /// Applies one batch of changes to the running set: every task keyed in `removed` stops
    /// holding resources, then every task of `added` starts (a task that changed, e.g. from
    /// BUILDING to RUNNING, is removed and added again). Costs a pass over the indexes' integers
    /// plus a binary search per change, not a re-sort.
    pub fn update<'k>(
        &mut self,
        removed: impl IntoIterator<Item = &'k str>,
        added: Vec<RunningTask>,
    ) {
        let n = self.running.len();
        let mut gone = vec![false; n];
        let mut any_gone = false;
        for key in removed {
            let start = self.running.partition_point(|rt| rt.task.as_str() < key);
            for (r, rt) in self.running.iter().enumerate().skip(start) {
                if rt.task != key {
                    break;
                }
                if !gone[r] {
                    gone[r] = true;
                    any_gone = true;
                }
            }
        }
        if !any_gone && added.is_empty() {
            return;
        }
        for r in (0..n).filter(|&r| gone[r]) {
            let rt = &self.running[r];
            if let Some(w) = self.running_worker[r] {
                self.free[w].add(&rt.resources);
                if !rt.running {
                    self.building[w] -= 1;
                }
            }
        }
        // Where each added task goes among the old ones (ties after them, as a sort would
        // put equal keys in either order and keys are unique in practice).
        let mut added = sort_running(added);
        let at: Vec<usize> = added
            .iter()
            .map(|a| {
                self.running
                    .partition_point(|rt| running_cmp(rt, a) != Ordering::Greater)
            })
            .collect();
        let old = std::mem::take(&mut self.running);
        let old_worker = std::mem::take(&mut self.running_worker);
        let old_variant = std::mem::take(&mut self.variant_of);
        let mut map = vec![usize::MAX; n];
        let mut new_idx = Vec::with_capacity(added.len());
        let mut next_added = 0;
        let mut incoming = std::mem::take(&mut added).into_iter();
        let mut running = Vec::with_capacity(n + at.len());
        let mut running_worker = Vec::with_capacity(n + at.len());
        let mut variant_of = Vec::with_capacity(n + at.len());
        let mut push_added = |running: &mut Vec<Box<RunningTask>>,
                              running_worker: &mut Vec<Option<usize>>,
                              variant_of: &mut Vec<usize>,
                              rt: Box<RunningTask>| {
            new_idx.push(running.len());
            running_worker.push(self.worker_idx.get(rt.worker.as_str()).copied());
            variant_of.push(self.variants.id(&rt.device_variant));
            running.push(rt);
        };
        for (r, ((rt, w), v)) in old.into_iter().zip(old_worker).zip(old_variant).enumerate() {
            while next_added < at.len() && at[next_added] <= r {
                if let Some(a) = incoming.next() {
                    push_added(&mut running, &mut running_worker, &mut variant_of, a);
                }
                next_added += 1;
            }
            if gone[r] {
                continue;
            }
            map[r] = running.len();
            running.push(rt);
            running_worker.push(w);
            variant_of.push(v);
        }
        for a in incoming {
            push_added(&mut running, &mut running_worker, &mut variant_of, a);
        }
        self.running = running;
        self.running_worker = running_worker;
        self.variant_of = variant_of;
        for list in &mut self.on_worker {
            remap(list, &map);
        }
        self.slices.retain(|_, members| {
            remap(members, &map);
            !members.is_empty()
        });
        for list in &mut self.solo_victims {
            remap(list, &map);
        }
        self.solo_victims
            .resize(self.variants.names.len(), Vec::new());
        for r in new_idx {
            self.hold(r);
            if self.is_solo_victim(r) {
                let key = victim_key(&self.running, r);
                let list = &mut self.solo_victims[self.variant_of[r]];
                let at = list.partition_point(|&x| victim_key(&self.running, x) < key);
                list.insert(at, r);
            }
        }
    }

    /// Brings the cluster to `workers` and `running` (any order), applying only the
    /// difference: what a controller that reads its state whole each tick calls. Running tasks
    /// already in (task key, worker) order are compared in one pass without sorting.
    pub fn sync(&mut self, workers: Vec<Worker>, running: Vec<RunningTask>) {
        self.set_workers(workers);
        let running = sort_running(running);
        let mut removed: Vec<String> = Vec::new();
        let mut added: Vec<RunningTask> = Vec::new();
        let mut old = self.running.iter().peekable();
        for rt in running {
            loop {
                match old.peek() {
                    Some(o) if running_cmp(o, &rt) == Ordering::Less => {
                        removed.push(o.task.clone());
                        old.next();
                    }
                    _ => break,
                }
            }
            match old.peek() {
                Some(o) if running_cmp(o, &rt) == Ordering::Equal => {
                    if ***o != *rt {
                        removed.push(o.task.clone());
                        added.push(*rt);
                    }
                    old.next();
                }
                _ => added.push(*rt),
            }
        }
        removed.extend(old.map(|o| o.task.clone()));
        // A key removed and added again under another worker comes back through `added`.
        self.update(removed.iter().map(String::as_str), added);
    }

    /// One scheduling cycle's plan for `pending` over this cluster (see [`crate::schedule`]).
    /// Takes `&mut self` only to keep what the plan learnt about constraints for the next one.
    pub fn plan(
        &mut self,
        pending: &[PendingTask],
        user_spend: &BTreeMap<String, i64>,
        policy: &Policy,
    ) -> Plan {
        let mut cache = std::mem::take(&mut self.csets);
        if cache.entries() * self.workers.len().max(1) > MAX_CACHED_CSET_CELLS {
            cache = CSetCache::default();
        }
        let cap = policy.max_tasks_per_job_per_cycle;
        let gate = crate::order::gate(pending, cap);
        let gated: Vec<PendingTask>;
        let considered = match &gate.kept {
            None => pending,
            Some(kept) => {
                gated = kept.iter().map(|&i| pending[i].clone()).collect();
                &gated
            }
        };
        let (mut plan, cache) = Engine::new(self, cache, considered, policy).run(user_spend);
        self.csets = cache;
        plan.capped_jobs = gate
            .capped
            .into_iter()
            .map(|job| {
                let reason = crate::model::capped_reason(cap, &job);
                (job, reason)
            })
            .collect();
        plan
    }

    /// [`crate::explain`] over this cluster and `pending`.
    pub fn explain(
        &self,
        pending: &[PendingTask],
        policy: &Policy,
        task: &str,
    ) -> Option<Explanation> {
        crate::explain::explain_in(self, pending, policy, task)
    }
}

/// Victim order of running task `r` of `running`.
pub(crate) fn victim_key(running: &[Box<RunningTask>], r: usize) -> VictimKey {
    let rt = &running[r];
    (Reverse(rt.band.rank()), rt.resources.cost_key(), r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_prefixes_order_as_their_keys_where_they_differ() {
        let keys = [
            "",
            "/",
            "/a",
            "/a/",
            "/a/0",
            "/a/1",
            "/a/10",
            "/user01/job23000/0",
            "/user01/job23000/1",
            "/user01/job2300/0",
            "/user01/job23001",
            "/u\u{e9}/j/0",
        ];
        for a in keys {
            for b in keys {
                let (pa, pb) = (key_prefix(a), key_prefix(b));
                if pa != pb {
                    assert_eq!(pa.cmp(&pb), a.cmp(b), "{a} vs {b}");
                }
            }
        }
    }
}
