//! The placement pass: working state, constraint sets, gangs and first-fit solos.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use crate::cluster::Cluster;
use crate::constraint::{canonical, normalize, satisfied};
use crate::firstfit::{request_node, FirstFit};
use crate::model::{Assignment, PendingTask, Plan, Policy, ResourcesExt, RunningTask, Worker};
use crate::order::order_pending;
use iris_types::{AttrValue, Band, Constraint, Resources};
use rustc_hash::FxHashMap;

mod explain;

/// Distinct ranked lists that get a [`FirstFit`] tree (about 80 KB each for 1,000 workers);
/// further ones fall back to a linear scan.
const MAX_TREES: usize = 256;

/// First-fit search over one ranked worker list.
enum Finder {
    Tree(FirstFit),
    /// Linear scan; closed workers are dropped as they are met (they stay closed).
    Scan(Vec<usize>),
}

impl Finder {
    /// `(position, worker)` of the first worker in rank order that is open and where `req` fits.
    fn find(&mut self, req: &Resources, cap: &Capacity) -> Option<(usize, usize)> {
        match self {
            Finder::Tree(tree) => tree.find(req, cap),
            Finder::Scan(open) => {
                open.retain(|&w| !cap.closed(w));
                open.iter()
                    .copied()
                    .enumerate()
                    .find(|&(_, w)| req.fits_in(&cap.free[w]))
            }
        }
    }

    /// Tells the index that the worker at `pos`, just returned by `find`, changed.
    fn refresh(&mut self, pos: usize, cap: &Capacity) {
        if let Finder::Tree(tree) = self {
            tree.refresh(pos, cap);
        }
    }
}

/// What decides whether a gang fits: its members' constraint sets and requests and the
/// grouping attribute.
pub(crate) type GangShape = (Vec<usize>, String, Vec<[i64; 4]>);

/// The attribute that orders hosts inside a coscheduling group.
pub(crate) const WORKER_ORDER_ATTR: &str = "tpu-worker-id";

/// Free capacity and per-cycle counters, indexed like `Engine::workers`.
pub(crate) struct Capacity {
    pub(crate) free: Vec<Resources>,
    /// ASSIGNED+BUILDING tasks, including assignments made in this plan.
    pub(crate) building: Vec<usize>,
    /// Assignments made in this plan.
    pub(crate) assigned_now: Vec<usize>,
    pub(crate) max_building: usize,
    pub(crate) max_assign: usize,
    /// Pooled workers (an in-process backend such as Kubernetes, where Kueue queues and places
    /// pods): no build back-pressure, and their own per-cycle limit.
    pub(crate) pooled: Vec<bool>,
    pub(crate) max_assign_pooled: usize,
}

impl Capacity {
    /// Takes no more tasks this cycle (build back-pressure or per-cycle limit).
    pub(crate) fn closed(&self, w: usize) -> bool {
        if self.pooled.get(w).copied().unwrap_or(false) {
            return self.assigned_now[w] >= self.max_assign_pooled;
        }
        self.building[w] >= self.max_building || self.assigned_now[w] >= self.max_assign
    }

    /// Holds as many ASSIGNED/BUILDING tasks as it may (never for a pooled worker).
    pub(crate) fn backpressured(&self, w: usize) -> bool {
        !self.pooled.get(w).copied().unwrap_or(false) && self.building[w] >= self.max_building
    }

    /// The per-cycle assignment limit of worker `w`.
    pub(crate) fn assign_limit(&self, w: usize) -> usize {
        if self.pooled.get(w).copied().unwrap_or(false) {
            self.max_assign_pooled
        } else {
            self.max_assign
        }
    }

    pub(crate) fn can_host(&self, w: usize, req: &Resources) -> bool {
        !self.closed(w) && req.fits_in(&self.free[w])
    }

    #[cfg(test)]
    pub(crate) fn for_test(free: Vec<Resources>, max_building: usize, max_assign: usize) -> Self {
        let n = free.len();
        Capacity {
            free,
            building: vec![0; n],
            assigned_now: vec![0; n],
            max_building,
            max_assign,
            pooled: vec![false; n],
            max_assign_pooled: max_assign,
        }
    }

    pub(crate) fn take(&mut self, w: usize, req: &Resources) {
        self.free[w].sub(req);
        self.building[w] += 1;
        self.assigned_now[w] += 1;
    }
}

/// What one distinct list of constraints makes of the workers. It depends on the workers alone,
/// so the [`Cluster`] keeps it from plan to plan until they change.
pub(crate) struct CSetBase {
    /// Healthy and satisfies every hard constraint.
    pub(crate) eligible: Vec<bool>,
    /// Number of preferred constraints satisfied.
    pub(crate) soft_score: Vec<u32>,
    /// Eligible workers by soft score (desc), then id.
    ranked: Vec<usize>,
    /// Equal for bases with equal `ranked` lists: they share a first-fit index in a plan.
    ranking: usize,
}

/// [`CSetBase`]s by constraint-list key, and what builds them, kept across plans.
#[derive(Clone, Default)]
pub(crate) struct CSetCache {
    bases: FxHashMap<String, Arc<CSetBase>>,
    /// Per distinct constraint (ignoring its mode): whether each worker satisfies it.
    matches: FxHashMap<String, Arc<Vec<bool>>>,
    /// Distinct ranked lists, numbered.
    rankings: FxHashMap<Vec<usize>, usize>,
}

impl CSetCache {
    /// Constraint lists, constraints and rankings held.
    pub(crate) fn entries(&self) -> usize {
        self.bases.len() + self.matches.len() + self.rankings.len()
    }
}

/// Workers evaluated once against one distinct list of constraints.
pub(crate) struct CSet<'a> {
    pub(crate) hard: Vec<&'a Constraint>,
    /// Eligibility and soft scores (see [`CSetBase`]).
    pub(crate) base: Arc<CSetBase>,
    /// Index into `Engine::finders`.
    finder: usize,
    /// Requests that found no worker during the placement pass. Capacity only shrinks during
    /// that pass, so any request that covers one of these fails too.
    failed: Vec<Resources>,
}

/// What happened to a pending task.
#[derive(Clone, Debug)]
pub(crate) enum Status {
    /// Not reached by any placement unit (defensive; not expected).
    Untouched,
    Assigned,
    /// Tried and found no worker.
    Failed {
        cset: usize,
    },
    /// An earlier task of the job (`head`) found no worker.
    Skipped {
        head: usize,
        cset: usize,
    },
    /// Gang could not be placed; the reason names the gang.
    GangFailed(String),
    /// Gang found groups but none with room for all of its `n` members (`head` is its first
    /// task, `cs` its constraint set); the reason names the best group's room at the end of
    /// placement.
    GangNoRoom {
        head: usize,
        n: usize,
        cs: usize,
    },
}

/// A unit of placement, in scheduling order.
pub(crate) enum Unit<'a> {
    /// All pending tasks of a coscheduled job, in task-index order.
    Gang {
        job: &'a str,
        tasks: Vec<usize>,
    },
    Solo(usize),
}

/// A set of workers sharing one value of the `group_by` attribute.
#[derive(Clone)]
pub(crate) struct Group {
    /// Canonical value (trimmed, lower-cased).
    pub(crate) value: String,
    /// Workers ordered by `tpu-worker-id` then id.
    pub(crate) workers: Vec<usize>,
    /// Lowest soft score among its workers.
    pub(crate) score: u32,
}

pub(crate) struct Engine<'a> {
    pub(crate) pending: &'a [PendingTask],
    /// The workers and running tasks with their indexes ([`Cluster`]).
    pub(crate) cluster: &'a Cluster,
    /// Sorted by id; duplicates dropped.
    pub(crate) workers: &'a [Worker],
    pub(crate) cap: Capacity,
    /// Sorted by task key.
    pub(crate) running: &'a [Box<RunningTask>],
    /// Index of the worker holding each running task, if known.
    pub(crate) running_worker: &'a [Option<usize>],
    /// Running tasks per worker, by task key.
    pub(crate) on_worker: &'a [Vec<usize>],
    /// Coscheduled running tasks per job ("slices").
    pub(crate) slices: &'a BTreeMap<String, Vec<usize>>,
    pub(crate) evicted: Vec<bool>,
    pub(crate) csets: Vec<CSet<'a>>,
    cset_ids: FxHashMap<String, usize>,
    /// Worker-derived constraint facts, borrowed from the cluster for the plan.
    cache: CSetCache,
    /// First-fit indexes, shared by constraint sets that rank workers identically.
    finders: Vec<Finder>,
    /// Finder per ranking number.
    finder_ids: FxHashMap<usize, usize>,
    /// `groups(cs, key, None)` results; group membership does not change during a cycle.
    group_cache: BTreeMap<(usize, String), Vec<Group>>,
    /// Gangs that found no group during placement, by shape, with the reason after the job's
    /// name, or `None` when groups exist but none had room (that reason is written at the end
    /// of placement). Capacity only shrinks and closed workers stay closed during that pass, so
    /// a later gang of the same shape cannot be placed either.
    gang_failed: BTreeMap<GangShape, Option<String>>,
    /// Dense job number of each pending task.
    job_of: Vec<usize>,
    /// Per job: the constraint list last interned for it and its set.
    job_cset: Vec<Option<(&'a [Constraint], usize)>>,
    task_cset: Vec<Option<usize>>,
    pub(crate) status: Vec<Status>,
    pub(crate) plan: Plan,
    any_healthy: bool,
}

impl<'a> Engine<'a> {
    pub(crate) fn new(
        cluster: &'a Cluster,
        cache: CSetCache,
        pending: &'a [PendingTask],
        policy: &'a Policy,
    ) -> Engine<'a> {
        let workers = cluster.workers.as_slice();
        let cap = Capacity {
            free: cluster.free.clone(),
            building: cluster.building.clone(),
            assigned_now: vec![0; workers.len()],
            max_building: policy.max_building_per_worker,
            max_assign: policy.max_assignments_per_worker_per_cycle,
            pooled: workers.iter().map(|w| w.pooled).collect(),
            max_assign_pooled: policy.max_assignments_per_pool_per_cycle,
        };
        let running = cluster.running.as_slice();
        let any_healthy = workers.iter().any(|w| w.healthy);
        let mut job_numbers: FxHashMap<&str, usize> = FxHashMap::default();
        // A job's tasks usually arrive together: the previous task's number is tried first.
        let mut last: Option<(&str, usize)> = None;
        let job_of: Vec<usize> = pending
            .iter()
            .map(|t| {
                let job = t.job.as_str();
                if let Some((_, n)) = last.filter(|(prev, _)| *prev == job) {
                    return n;
                }
                let next = job_numbers.len();
                let n = *job_numbers.entry(job).or_insert(next);
                last = Some((job, n));
                n
            })
            .collect();
        let n_jobs = job_numbers.len();
        Engine {
            pending,
            cluster,
            cap,
            evicted: vec![false; running.len()],
            running,
            running_worker: &cluster.running_worker,
            on_worker: &cluster.on_worker,
            slices: &cluster.slices,
            csets: Vec::new(),
            cset_ids: FxHashMap::default(),
            cache,
            finders: Vec::new(),
            finder_ids: FxHashMap::default(),
            group_cache: BTreeMap::new(),
            gang_failed: BTreeMap::new(),
            job_cset: vec![None; n_jobs],
            job_of,
            task_cset: vec![None; pending.len()],
            status: vec![Status::Untouched; pending.len()],
            plan: Plan::default(),
            any_healthy,
            workers,
        }
    }

    /// Orders pending tasks into placement units: per band, gangs first, then solo tasks.
    pub(crate) fn units(&self, order: &[usize]) -> Vec<Unit<'a>> {
        let pending = self.pending;
        let mut gang_members: Vec<Option<Vec<usize>>> = vec![None; self.job_cset.len()];
        for (p, t) in pending.iter().enumerate() {
            if t.group_by.is_some() {
                gang_members[self.job_of[p]]
                    .get_or_insert_with(Vec::new)
                    .push(p);
            }
        }
        for tasks in gang_members.iter_mut().flatten() {
            tasks.sort_by(|&a, &b| {
                task_index(&pending[a].task)
                    .cmp(&task_index(&pending[b].task))
                    .then_with(|| pending[a].task.cmp(&pending[b].task))
            });
        }
        let mut out = Vec::with_capacity(order.len());
        let mut gangs = Vec::new();
        let mut solos = Vec::new();
        let mut band: Option<Band> = None;
        for &p in order {
            let t = &pending[p];
            if band != Some(t.band) {
                out.append(&mut gangs);
                out.append(&mut solos);
                band = Some(t.band);
            }
            if t.group_by.is_some() {
                if let Some(tasks) = gang_members[self.job_of[p]].take() {
                    gangs.push(Unit::Gang {
                        job: t.job.as_str(),
                        tasks,
                    });
                }
            } else {
                solos.push(Unit::Solo(p));
            }
        }
        out.append(&mut gangs);
        out.append(&mut solos);
        out
    }

    /// The constraint set of pending task `p`, computed once per distinct constraint list.
    pub(crate) fn cset_for(&mut self, p: usize) -> usize {
        if let Some(cs) = self.task_cset[p] {
            return cs;
        }
        let t: &'a PendingTask = &self.pending[p];
        let constraints = t.constraints.as_slice();
        let job = self.job_of[p];
        let cs = match self.job_cset[job] {
            Some((cached, cs)) if std::ptr::eq(cached, constraints) || cached == constraints => cs,
            _ => {
                let cs = self.intern_cset(constraints);
                self.job_cset[job] = Some((constraints, cs));
                cs
            }
        };
        self.task_cset[p] = Some(cs);
        cs
    }

    /// Whether each worker satisfies `c` (errors = no), computed once per distinct constraint.
    fn matches_of(&mut self, c: &Constraint) -> Arc<Vec<bool>> {
        let mut key = String::new();
        push_constraint_key(&mut key, c);
        let workers = self.workers;
        self.cache
            .matches
            .entry(key)
            .or_insert_with(|| {
                Arc::new(
                    workers
                        .iter()
                        .map(|w| satisfied(c, &w.attributes))
                        .collect(),
                )
            })
            .clone()
    }

    fn intern_cset(&mut self, constraints: &'a [Constraint]) -> usize {
        let mut key = String::new();
        for c in constraints {
            push_constraint_key(&mut key, c);
            key.push(if c.required { 'R' } else { 'P' });
        }
        if let Some(&cs) = self.cset_ids.get(&key) {
            return cs;
        }
        let base = match self.cache.bases.get(&key) {
            Some(base) => base.clone(),
            None => {
                let base = Arc::new(self.cset_base(constraints));
                self.cache.bases.insert(key.clone(), base.clone());
                base
            }
        };
        let finder = match self.finder_ids.get(&base.ranking) {
            Some(&f) => f,
            None => {
                let f = self.finders.len();
                self.finders.push(if f < MAX_TREES {
                    Finder::Tree(FirstFit::new(base.ranked.clone(), &self.cap))
                } else {
                    Finder::Scan(base.ranked.clone())
                });
                self.finder_ids.insert(base.ranking, f);
                f
            }
        };
        let cs = self.csets.len();
        self.csets.push(CSet {
            hard: constraints.iter().filter(|c| c.required).collect(),
            base,
            finder,
            failed: Vec::new(),
        });
        self.cset_ids.insert(key, cs);
        cs
    }

    /// Evaluates the workers against `constraints` (see [`CSetBase`]).
    fn cset_base(&mut self, constraints: &[Constraint]) -> CSetBase {
        let mut eligible: Vec<bool> = self.workers.iter().map(|w| w.healthy).collect();
        let mut soft_score = vec![0; self.workers.len()];
        for c in constraints {
            let matches = self.matches_of(c);
            for (w, &ok) in matches.iter().enumerate() {
                if c.required {
                    eligible[w] &= ok;
                } else if ok {
                    soft_score[w] += 1;
                }
            }
        }
        for (w, score) in soft_score.iter_mut().enumerate() {
            if !eligible[w] {
                *score = 0;
            }
        }
        let mut ranked: Vec<usize> = (0..self.workers.len()).filter(|&w| eligible[w]).collect();
        ranked.sort_by_key(|&w| (Reverse(soft_score[w]), w));
        let next = self.cache.rankings.len();
        let ranking = *self.cache.rankings.entry(ranked.clone()).or_insert(next);
        CSetBase {
            eligible,
            soft_score,
            ranked,
            ranking,
        }
    }

    pub(crate) fn assign(&mut self, p: usize, w: usize) {
        let t = &self.pending[p];
        self.cap.take(w, &t.resources);
        self.plan.assignments.push(Assignment {
            task: t.task.clone(),
            worker: self.workers[w].id.clone(),
        });
        self.status[p] = Status::Assigned;
    }

    /// Runs placement, explains what is left, then runs preemption. Hands back the constraint
    /// facts for the cluster to keep. `pending` has passed the per-job gate
    /// ([`crate::order::gate`], applied by `Cluster::plan`): no solo job has more than the cap.
    pub(crate) fn run(mut self, user_spend: &BTreeMap<String, i64>) -> (Plan, CSetCache) {
        let order = order_pending(self.pending, user_spend);
        let units = self.units(&order);
        let mut job_block: Vec<Option<usize>> = vec![None; self.job_cset.len()];
        for unit in &units {
            match unit {
                Unit::Gang { job, tasks } => self.place_gang(job, tasks),
                Unit::Solo(p) => self.place_solo(*p, &mut job_block),
            }
        }
        self.explain_unplaced();
        self.preemption_pass(&units);
        (self.plan, self.cache)
    }

    fn place_solo(&mut self, p: usize, job_block: &mut [Option<usize>]) {
        let t: &'a PendingTask = &self.pending[p];
        let job = self.job_of[p];
        let cset = self.cset_for(p);
        if let Some(head) = job_block[job] {
            self.status[p] = Status::Skipped { head, cset };
            return;
        }
        match self.find_fit(cset, &t.resources) {
            Some((pos, w)) => {
                self.assign(p, w);
                self.finders[self.csets[cset].finder].refresh(pos, &self.cap);
            }
            None => {
                self.status[p] = Status::Failed { cset };
                job_block[job] = Some(p);
            }
        }
    }

    /// First open eligible worker (by soft score, then id) where `req` fits; the worker's
    /// position in the finder comes along so that it can be refreshed after the assignment.
    fn find_fit(&mut self, cs: usize, req: &Resources) -> Option<(usize, usize)> {
        let set = &mut self.csets[cs];
        if set.failed.iter().any(|f| req.covers(f)) {
            return None;
        }
        let found = self.finders[set.finder].find(req, &self.cap);
        if found.is_none() {
            set.failed.retain(|f| !f.covers(req));
            set.failed.push(req.clone());
        }
        found
    }

    /// `groups(cs, key, None)`, computed once per cycle.
    pub(crate) fn all_groups(&mut self, cs: usize, key: &str) -> Vec<Group> {
        let cache_key = (cs, key.to_string());
        if let Some(g) = self.group_cache.get(&cache_key) {
            return g.clone();
        }
        let groups = self.groups(cs, key, None);
        self.group_cache.insert(cache_key, groups.clone());
        groups
    }

    /// Workers eligible for `cs` (and inside `within`, if given) grouped by their value of
    /// `key`, in try order: soft score (desc), then group value.
    pub(crate) fn groups(
        &self,
        cs: usize,
        key: &str,
        within: Option<&BTreeSet<usize>>,
    ) -> Vec<Group> {
        let set = &self.csets[cs];
        let mut by_value: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (w, worker) in self.workers.iter().enumerate() {
            if !set.base.eligible[w] || within.is_some_and(|s| !s.contains(&w)) {
                continue;
            }
            if let Some(v) = worker.attributes.get(key) {
                by_value.entry(canonical(v)).or_default().push(w);
            }
        }
        let mut groups: Vec<Group> = by_value
            .into_iter()
            .map(|(value, mut workers)| {
                workers.sort_by_cached_key(|&w| host_order_key(&self.workers[w]));
                let score = workers
                    .iter()
                    .map(|&w| set.base.soft_score[w])
                    .min()
                    .unwrap_or(0);
                Group {
                    value,
                    workers,
                    score,
                }
            })
            .collect();
        groups.sort_by(|a, b| b.score.cmp(&a.score).then_with(|| a.value.cmp(&b.value)));
        groups
    }

    /// Zips gang tasks onto distinct hosts of `hosts` (already in host order): each task takes
    /// the next host that is open, eligible for its constraints and has room. All or nothing.
    pub(crate) fn zip_gang(
        &self,
        tasks: &[usize],
        css: &[usize],
        hosts: &[usize],
    ) -> Option<Vec<usize>> {
        let mut picks = Vec::with_capacity(tasks.len());
        let mut next = 0;
        for (k, &p) in tasks.iter().enumerate() {
            let req = &self.pending[p].resources;
            let cs = &self.csets[css[k]];
            let pos = hosts[next..]
                .iter()
                .position(|&w| cs.base.eligible[w] && self.cap.can_host(w, req))?;
            picks.push(hosts[next + pos]);
            // A pooled host takes further members of the same gang; any other host one each.
            next += if self.workers[hosts[next + pos]].pooled {
                pos
            } else {
                pos + 1
            };
        }
        Some(picks)
    }

    fn place_gang(&mut self, job: &str, tasks: &[usize]) {
        let Some(&first) = tasks.first() else {
            return;
        };
        let head = &self.pending[first];
        let key = head.group_by.as_deref().unwrap_or("");
        let css: Vec<usize> = tasks.iter().map(|&p| self.cset_for(p)).collect();
        let shape = self.gang_shape(tasks, &css, key);
        match self.gang_failed.get(&shape) {
            Some(Some(tail)) => {
                let reason = format!("Coscheduled job {job}{tail}");
                return self.gang_failed_with(tasks, reason);
            }
            Some(None) => return self.gang_no_room(tasks, css[0]),
            None => {}
        }
        let groups = self.all_groups(css[0], key);
        for g in &groups {
            if let Some(picks) = self.zip_gang(tasks, &css, &g.workers) {
                for (&p, &w) in tasks.iter().zip(&picks) {
                    self.assign(p, w);
                }
                return;
            }
        }
        if !groups.is_empty() {
            self.gang_failed.insert(shape, None);
            return self.gang_no_room(tasks, css[0]);
        }
        let tail = self.gang_tail(tasks.len(), key, &head.resources, None, css[0]);
        let reason = format!("Coscheduled job {job}{tail}");
        self.gang_failed.insert(shape, Some(tail));
        self.gang_failed_with(tasks, reason);
    }

    /// The shape of the gang of `tasks` (with constraint sets `css`, grouped by `key`).
    pub(crate) fn gang_shape(&self, tasks: &[usize], css: &[usize], key: &str) -> GangShape {
        let requests = tasks
            .iter()
            .map(|&p| request_node(&self.pending[p].resources))
            .collect();
        (css.to_vec(), key.to_string(), requests)
    }

    fn gang_failed_with(&mut self, tasks: &[usize], reason: String) {
        for &p in tasks {
            self.status[p] = Status::GangFailed(reason.clone());
        }
    }

    fn gang_no_room(&mut self, tasks: &[usize], cs: usize) {
        let (head, n) = (tasks[0], tasks.len());
        for &p in tasks {
            self.status[p] = Status::GangNoRoom { head, n, cs };
        }
    }

    /// The group of `all_groups(cs, key)` with the most workers that can host `req` now (the
    /// first on ties), with that count.
    pub(crate) fn best_group(
        &self,
        cs: usize,
        key: &str,
        req: &Resources,
    ) -> Option<(usize, &str)> {
        let groups = self.group_cache.get(&(cs, key.to_string()))?;
        let mut best: Option<(usize, &str)> = None;
        for g in groups {
            let room = g
                .workers
                .iter()
                .filter(|&&w| self.cap.can_host(w, req))
                .count();
            if best.is_none_or(|(n, _)| room > n) {
                best = Some((room, g.value.as_str()));
            }
        }
        best
    }

    /// Why a gang of `n` hosts found no group, after "Coscheduled job <job>".
    pub(crate) fn gang_tail(
        &self,
        n: usize,
        key: &str,
        req: &Resources,
        best: Option<(usize, &str)>,
        cs: usize,
    ) -> String {
        let mut tail = format!(" needs {n} workers sharing one value of '{key}' with {req} each");
        match best {
            Some((room, value)) => {
                let _ = write!(tail, "; best group '{value}' has {room} with room now");
            }
            None if !self.csets[cs].base.eligible.contains(&true) => {
                let _ = write!(tail, "; {}", self.constraint_reason(cs));
            }
            None => {
                let _ = write!(tail, "; no eligible worker has attribute '{key}'");
            }
        }
        tail
    }

    /// True if skipped task `p` has the constraints of its job's failed `head` and asks for at
    /// least as much, so it could not fit where `head` could not.
    pub(crate) fn dominated(&self, p: usize, head: usize, cset: usize) -> bool {
        self.task_cset[head] == Some(cset)
            && self.pending[p]
                .resources
                .covers(&self.pending[head].resources)
    }
}

/// Appends an unambiguous encoding of `c` (mode excluded) to `key`.
fn push_constraint_key(key: &mut String, c: &Constraint) {
    fn push_value(key: &mut String, v: &AttrValue) {
        match v {
            AttrValue::Str(s) => {
                key.push('s');
                key.push_str(s);
            }
            AttrValue::Int(i) => {
                let _ = write!(key, "i{i}");
            }
            AttrValue::Float(f) => {
                let _ = write!(key, "f{:x}", f.to_bits());
            }
        }
        key.push('\u{1}');
    }
    key.push_str(&c.key);
    key.push('\u{1}');
    key.push_str(c.op.name());
    key.push('\u{1}');
    if let Some(v) = &c.value {
        push_value(key, v);
    }
    key.push('\u{2}');
    for v in &c.values {
        push_value(key, v);
    }
    key.push('\u{3}');
}

/// The numeric suffix of a task key (`/u/j/12` → 12); keys without one sort last.
pub(crate) fn task_index(key: &str) -> (u8, u64) {
    match key.rsplit('/').next().and_then(|s| s.parse::<u64>().ok()) {
        Some(i) => (0, i),
        None => (1, 0),
    }
}

/// Host order inside a coscheduling group: `tpu-worker-id` numerically when it is an integer,
/// then other values as text, then workers without it; ties keep id order.
pub(crate) fn host_order_key(w: &Worker) -> (u8, i64, String) {
    match w.attributes.get(WORKER_ORDER_ATTR) {
        Some(AttrValue::Int(i)) => (0, *i, String::new()),
        Some(AttrValue::Str(s)) => match s.trim().parse::<i64>() {
            Ok(i) => (0, i, String::new()),
            Err(_) => (1, 0, normalize(s)),
        },
        Some(v @ AttrValue::Float(_)) => (1, 0, canonical(v)),
        None => (2, 0, String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_fallback_agrees_with_the_tree() {
        let free: Vec<Resources> = (0..40)
            .map(|i| Resources::cpu_mem(1000 * (i % 7), (i % 5) << 30))
            .collect();
        let mut cap = Capacity::for_test(free, 3, 2);
        let order: Vec<usize> = (0..40).rev().filter(|w| w % 3 != 0).collect();
        let mut tree = Finder::Tree(FirstFit::new(order.clone(), &cap));
        let mut scan = Finder::Scan(order);
        for i in 0..200i64 {
            let req = Resources::cpu_mem(1000 * (i % 6), (i % 4) << 30);
            let a = tree.find(&req, &cap).map(|f| f.1);
            let b = scan.find(&req, &cap).map(|f| f.1);
            assert_eq!(a, b, "request {i}");
            if let Some(w) = a {
                cap.take(w, &req);
            }
        }
    }
}
