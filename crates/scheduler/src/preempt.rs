//! The preemption pass (§4.6) for tasks still unplaced after placement.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use crate::cluster::{victim_key, Variants, VictimKey};
use crate::constraint::normalize;
use crate::engine::{Engine, GangShape, Status, Unit};
use crate::firstfit::request_node;
use crate::model::{PendingTask, Preemption, ResourcesExt};
use iris_types::{Band, Resources};
use rustc_hash::FxHashMap;

/// What solo scans that found no victim learned, per (constraint set, variant number, band).
/// Valid until the next successful preemption changes the state.
type FailCache = FxHashMap<(usize, usize, Band), Rooms>;

/// Most distinct room vectors a [`Rooms`] keeps; past it, only failed requests are remembered.
const MAX_ROOMS: usize = 256;

/// The room each eligible victim would leave (its worker's free capacity plus its resources,
/// as [`request_node`] dimensions), kept as the vectors no other one dominates. A scan over
/// the same victims fits a request exactly when one of them does, so once a scan failed, a
/// later request of the same key is answered without scanning 50,000 victims again.
#[derive(Default)]
struct Rooms {
    /// Requests that found no victim (any request covering one fails too).
    failed: Vec<Resources>,
    /// The undominated rooms of the last failed scan; `None` if there were too many.
    frontier: Option<Vec<[i64; 4]>>,
}

impl Rooms {
    /// False when `req` provably finds no victim; true when a scan must decide.
    fn may_fit(&self, req: &Resources) -> bool {
        if self.failed.iter().any(|f| req.covers(f)) {
            return false;
        }
        match &self.frontier {
            Some(rooms) => {
                let req = request_node(req);
                rooms
                    .iter()
                    .any(|room| (0..4).all(|d| req[d] == 0 || room[d] >= req[d]))
            }
            None => true,
        }
    }
}

/// Adds `room` to the undominated set `rooms` (`None` once it outgrew [`MAX_ROOMS`]).
fn add_room(rooms: &mut Option<Vec<[i64; 4]>>, room: [i64; 4]) {
    let Some(list) = rooms else {
        return;
    };
    let covers = |a: &[i64; 4], b: &[i64; 4]| (0..4).all(|d| a[d] >= b[d]);
    if list.iter().any(|r| covers(r, &room)) {
        return;
    }
    list.retain(|r| !covers(&room, r));
    list.push(room);
    if list.len() > MAX_ROOMS {
        *rooms = None;
    }
}

/// Gangs (by shape, variant and band) that found no victims; valid like [`FailCache`].
type GangFailCache = BTreeSet<(GangShape, String, Band)>;

/// A running slice's facts that do not change during the preemption pass.
struct SliceInfo<'a> {
    job: &'a str,
    members: usize,
    /// The members' normalized device variant, if they all share one.
    variant: Option<String>,
    /// Every member is RUNNING on a known worker.
    usable: bool,
    /// The highest band among the members (lowest rank).
    top: u8,
}

impl<'a> Engine<'a> {
    fn victim_key(&self, r: usize) -> VictimKey {
        victim_key(self.running, r)
    }

    /// Evicts running task `r` for pending task `by`.
    fn evict(&mut self, r: usize, by: usize) {
        let rt = &self.running[r];
        self.evicted[r] = true;
        if let Some(w) = self.running_worker[r] {
            self.cap.free[w].add(&rt.resources);
        }
        self.plan.preemptions.push(Preemption {
            victim: rt.task.clone(),
            worker: rt.worker.clone(),
            by: self.pending[by].task.clone(),
        });
    }

    fn placed_by_preemption(&mut self, p: usize, w: usize) {
        self.assign(p, w);
        self.plan.pending_reasons.remove(&self.pending[p].task);
    }

    pub(crate) fn preemption_pass(&mut self, units: &[Unit<'a>]) {
        // Running tasks' variants and solo victims are indexed by the cluster; pending tasks'
        // variants join the numbering on this plan's copy (a variant no running task has gets
        // a number without victims).
        let mut variants = self.cluster.variants.clone();
        let mut solo_victims = self.cluster.solo_victims.clone();
        let slices = self.slice_infos(&self.cluster.variant_of, &variants.names);
        let mut cache = FailCache::default();
        let mut gang_cache = GangFailCache::new();
        for unit in units {
            let done = match unit {
                Unit::Solo(p) => {
                    let candidate = match self.status[*p] {
                        Status::Failed { .. } => true,
                        Status::Skipped { head, cset } => self.dominated(*p, head, cset),
                        _ => false,
                    };
                    candidate && self.preempt_solo(*p, &mut variants, &mut solo_victims, &mut cache)
                }
                Unit::Gang { tasks, .. } => {
                    let failed = tasks.iter().all(|&p| {
                        matches!(
                            self.status[p],
                            Status::GangFailed(_) | Status::GangNoRoom { .. }
                        )
                    });
                    failed
                        && !tasks.is_empty()
                        && self.preempt_gang(tasks, &slices, &mut gang_cache)
                }
            };
            if done {
                cache.clear();
                gang_cache.clear();
            }
        }
    }

    /// One victim for one solo preemptor: lowest band first, then cheapest; same variant,
    /// on a worker matching the preemptor's hard constraints, and freeing it must suffice.
    fn preempt_solo(
        &mut self,
        p: usize,
        variants: &mut Variants,
        solo_victims: &mut [Vec<usize>],
        cache: &mut FailCache,
    ) -> bool {
        let t: &'a PendingTask = &self.pending[p];
        if t.band == Band::Batch {
            return false;
        }
        let cs = self.cset_for(p);
        let variant = variants.id(&t.device_variant);
        let key = (cs, variant, t.band);
        if cache.get(&key).is_some_and(|m| !m.may_fit(&t.resources)) {
            return false;
        }
        let mut found = None;
        let mut rooms = Some(Vec::new());
        if let Some(list) = solo_victims.get_mut(variant) {
            // Scan in victim order, dropping already-evicted entries on the way.
            let (mut read, mut write) = (0, 0);
            while read < list.len() {
                let r = list[read];
                read += 1;
                if self.evicted[r] {
                    continue;
                }
                list[write] = r;
                write += 1;
                let rt = &self.running[r];
                if !t.band.outranks(rt.band) {
                    break; // sorted lowest band first: the rest are not lower
                }
                let Some(w) = self.running_worker[r] else {
                    continue;
                };
                if !self.csets[cs].base.eligible[w] || self.cap.closed(w) {
                    continue;
                }
                let mut freed = self.cap.free[w].clone();
                freed.add(&rt.resources);
                if t.resources.fits_in(&freed) {
                    found = Some((r, w));
                    break;
                }
                add_room(&mut rooms, request_node(&freed));
            }
            if read != write {
                list.copy_within(read.., write);
                list.truncate(list.len() - (read - write));
            }
        }
        match found {
            Some((r, w)) => {
                self.evict(r, p);
                self.placed_by_preemption(p, w);
                true
            }
            None => {
                let memo = cache.entry(key).or_default();
                memo.failed.retain(|f| !f.covers(&t.resources));
                memo.failed.push(t.resources.clone());
                memo.frontier = rooms;
                false
            }
        }
    }

    /// A gang preempts either one whole lower-band slice of its variant whose hosts form a
    /// valid group for it, or else lower-band solo co-tenants on enough hosts of one group.
    fn preempt_gang(
        &mut self,
        tasks: &[usize],
        slices: &[SliceInfo<'a>],
        cache: &mut GangFailCache,
    ) -> bool {
        // The gang's band is its lowest task band, so every victim is below every member.
        let Some(band) = tasks.iter().map(|&p| self.pending[p].band).max() else {
            return false;
        };
        if band == Band::Batch {
            return false;
        }
        let head: &'a PendingTask = &self.pending[tasks[0]];
        let key = head.group_by.as_deref().unwrap_or("");
        let variant = normalize(&head.device_variant);
        let css: Vec<usize> = tasks.iter().map(|&p| self.cset_for(p)).collect();
        // Nothing changes between successful preemptions, so a gang of the same shape, band and
        // variant as one that found no victims finds none either.
        let memo = (self.gang_shape(tasks, &css, key), variant, band);
        if cache.contains(&memo) {
            return false;
        }
        let done = self.preempt_slice(tasks, &css, band, key, &memo.1, slices)
            || self.preempt_cotenants(tasks, &css, band, key);
        if !done {
            cache.insert(memo);
        }
        done
    }

    /// Each running slice's facts that do not change during the pass (see [`SliceInfo`]).
    fn slice_infos(&self, variants: &[usize], names: &[String]) -> Vec<SliceInfo<'a>> {
        let slices: &'a BTreeMap<String, Vec<usize>> = self.slices;
        slices
            .iter()
            .map(|(job, members)| {
                let first = members.first().map(|&r| variants[r]);
                SliceInfo {
                    job: job.as_str(),
                    members: members.len(),
                    variant: first
                        .filter(|&v| members.iter().all(|&r| variants[r] == v))
                        .map(|v| names[v].clone()),
                    usable: members
                        .iter()
                        .all(|&r| self.running[r].running && self.running_worker[r].is_some()),
                    top: members
                        .iter()
                        .map(|&r| self.running[r].band.rank())
                        .min()
                        .unwrap_or(0),
                }
            })
            .collect()
    }

    fn preempt_slice(
        &mut self,
        tasks: &[usize],
        css: &[usize],
        band: Band,
        key: &str,
        variant: &str,
        infos: &[SliceInfo<'a>],
    ) -> bool {
        let mut slices: Vec<(Reverse<u8>, usize, &'a str)> = Vec::new();
        for info in infos {
            // Every member RUNNING on a known worker, of the gang's variant, below its band,
            // and none evicted yet in this pass.
            let ok = info.members >= tasks.len()
                && info.usable
                && band.rank() < info.top
                && info.variant.as_deref() == Some(variant)
                && self
                    .slices
                    .get(info.job)
                    .is_some_and(|m| m.iter().all(|&r| !self.evicted[r]));
            if ok {
                slices.push((Reverse(info.top), info.members, info.job));
            }
        }
        slices.sort();
        for (_, _, job) in slices {
            let members = self.slices.get(job).cloned().unwrap_or_default();
            let hosts: BTreeSet<usize> = members
                .iter()
                .filter_map(|&r| self.running_worker[r])
                .collect();
            for &r in &members {
                if let Some(w) = self.running_worker[r] {
                    self.cap.free[w].add(&self.running[r].resources);
                }
            }
            let groups = self.groups(css[0], key, Some(&hosts));
            let picks = groups
                .iter()
                .find_map(|g| self.zip_gang(tasks, css, &g.workers));
            // Undo the tentative release; `evict` applies it for real.
            for &r in &members {
                if let Some(w) = self.running_worker[r] {
                    self.cap.free[w].sub(&self.running[r].resources);
                }
            }
            if let Some(picks) = picks {
                for &r in &members {
                    let by = self.running_worker[r]
                        .and_then(|w| picks.iter().position(|&x| x == w))
                        .map_or(tasks[0], |k| tasks[k]);
                    self.evict(r, by);
                }
                for (&p, &w) in tasks.iter().zip(&picks) {
                    self.placed_by_preemption(p, w);
                }
                return true;
            }
        }
        false
    }

    fn preempt_cotenants(&mut self, tasks: &[usize], css: &[usize], band: Band, key: &str) -> bool {
        let need = tasks.iter().fold(Resources::default(), |acc, &p| {
            acc.component_max(&self.pending[p].resources)
        });
        for g in self.all_groups(css[0], key) {
            // (victim count, position in host order, worker, victims)
            let mut usable: Vec<(usize, usize, usize, Vec<usize>)> = Vec::new();
            for (pos, &w) in g.workers.iter().enumerate() {
                if self.cap.closed(w) || !css.iter().all(|&c| self.csets[c].base.eligible[w]) {
                    continue;
                }
                if let Some(victims) = self.cotenant_victims(w, band, &need) {
                    usable.push((victims.len(), pos, w, victims));
                }
            }
            if usable.len() < tasks.len() {
                continue;
            }
            usable.sort_by_key(|u| (u.0, u.1));
            usable.truncate(tasks.len());
            usable.sort_by_key(|u| u.1);
            for (&p, (_, _, w, victims)) in tasks.iter().zip(&usable) {
                for &r in victims {
                    self.evict(r, p);
                }
                self.placed_by_preemption(p, *w);
            }
            return true;
        }
        false
    }

    /// The fewest lower-band solo RUNNING tasks on `w` (cheapest first) whose eviction makes
    /// room for `need`; `Some(empty)` if it already fits, `None` if eviction cannot help.
    fn cotenant_victims(&self, w: usize, band: Band, need: &Resources) -> Option<Vec<usize>> {
        let mut free = self.cap.free[w].clone();
        if need.fits_in(&free) {
            return Some(Vec::new());
        }
        let mut candidates: Vec<usize> = self.on_worker[w]
            .iter()
            .copied()
            .filter(|&r| {
                let rt = &self.running[r];
                !self.evicted[r] && rt.running && !rt.coscheduled && band.outranks(rt.band)
            })
            .collect();
        candidates.sort_by_cached_key(|&r| self.victim_key(r));
        let mut chosen = Vec::new();
        for r in candidates {
            free.add(&self.running[r].resources);
            chosen.push(r);
            if need.fits_in(&free) {
                break;
            }
        }
        if !need.fits_in(&free) {
            return None;
        }
        // Keep only the victims that are needed.
        let mut i = 0;
        while i < chosen.len() {
            let mut without = free.clone();
            without.sub(&self.running[chosen[i]].resources);
            if need.fits_in(&without) {
                free = without;
                chosen.remove(i);
            } else {
                i += 1;
            }
        }
        Some(chosen)
    }
}
