//! The tick's pending tasks and open attempts, kept across ticks: each tick re-reads only the
//! `tasks` and `task_attempts` rows that committed writes touched since the last one
//! (`iris_store::changes`), instead of every pending task and every attempt holding a worker
//! (issue 17: ~50–250 ms each per tick at 50,000 pending and 20,000 running). Budgets can move
//! any user's tasks between bands at any time, so each pending task's effective band is worked
//! out again every tick from its job's band (in memory, no read).

use crate::error::Result;
use crate::Controller;
use iris_scheduler::PendingTask;
use iris_store::changes::Taken;
use iris_store::snapshot::{self, Holding, Waiting};
use iris_store::Read;
use iris_types::Band;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// What the tick keeps across ticks (behind one lock).
#[derive(Default)]
pub(crate) struct Kept {
    pub pending: PendingSet,
    pub holdings: HoldingSet,
    /// The last refresh completed: the sets plus the next changes taken are the truth. False
    /// at first, after a refresh that failed part-way (its taken changes are lost) and after
    /// [`Kept::distrust`], so the next refresh reads everything.
    trusted: bool,
    /// How the last refresh went.
    last: Refreshed,
}

impl Kept {
    /// Brings both sets to what `tx` sees, given the changes taken before `tx`'s first read.
    /// Call it before anything else that can fail between the take and here.
    pub(crate) fn refresh(
        &mut self,
        ctl: &Controller,
        tx: &impl Read,
        taken: Taken,
    ) -> Result<Refreshed> {
        let full = taken.resync || !self.trusted;
        self.trusted = false;
        self.holdings.update(tx, full, &taken.attempts)?;
        self.pending.update(ctl, tx, full, &taken.tasks)?;
        self.trusted = true;
        self.last = Refreshed {
            rows: if full { 0 } else { taken.tasks.len() },
            full,
        };
        Ok(self.last)
    }

    /// The next refresh reads every pending task and open attempt again (a job's cached spec
    /// changed under the kept tasks).
    pub(crate) fn distrust(&mut self) {
        self.trusted = false;
    }

    /// Debug builds: compares both sets with a full read in the same transaction and logs any
    /// difference. A difference can be a commit that landed after the changes were taken but
    /// before this read (taken next tick), so it is not fatal; the sets are read in full next
    /// tick. `iris_store`'s test of the change notes is what holds them exact.
    pub(crate) fn check_against_full_read(&mut self, tx: &impl Read) -> Result<()> {
        if !(self.pending.same_as_full_read(tx)? && self.holdings.same_as_full_read(tx)?) {
            self.trusted = false;
        }
        Ok(())
    }

    /// How the last refresh went.
    #[cfg(test)]
    pub(crate) fn last(&self) -> Refreshed {
        self.last
    }
}

/// The attempts holding workers, as of the last [`Kept::refresh`], and which of them the tick's
/// [`iris_scheduler::Cluster`] has not been told about yet: the tick hands the cluster only the
/// tasks whose holdings changed (issue 17: rebuilding and re-sorting every running task each
/// tick cost ~5% of the controller at C1M shape, 50,000 running).
#[derive(Default)]
pub(crate) struct HoldingSet {
    by_row: FxHashMap<i64, Holding>,
    /// Each task's rows in `by_row`. Usually one; two for a moment when a task's stopping
    /// attempt still holds its worker while its successor holds another.
    by_task: FxHashMap<String, Vec<i64>>,
    unsynced: Unsynced,
}

/// What the cluster still has to learn from a [`HoldingSet`].
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) enum Unsynced {
    /// Everything (at first and after a full read): the cluster is brought to the whole set.
    #[default]
    All,
    /// The holdings of these task keys changed (possibly to none).
    Tasks(Vec<String>),
}

/// Past this many changed tasks (and the number of holdings), handing the cluster the whole set
/// costs no more than the changes.
const MAX_UNSYNCED: usize = 4096;

impl HoldingSet {
    /// Re-reads attempt rows `rows`, or every open attempt if `full`.
    fn update(&mut self, tx: &impl Read, full: bool, rows: &[i64]) -> Result<()> {
        if full {
            self.by_row.clear();
            self.by_task.clear();
            for h in snapshot::holdings(tx)? {
                self.insert(h);
            }
            self.unsynced = Unsynced::All;
            return Ok(());
        }
        let mut changed: Vec<String> = Vec::new();
        for (row, h) in snapshot::holding_rows(tx, rows)? {
            if let Some(old) = self.remove(row) {
                changed.push(old.task_id);
            }
            if let Some(h) = h {
                changed.push(h.task_id.clone());
                self.insert(h);
            }
        }
        if let Unsynced::Tasks(keys) = &mut self.unsynced {
            keys.extend(changed);
            if keys.len() > MAX_UNSYNCED.max(self.by_row.len()) {
                keys.sort_unstable();
                keys.dedup();
                if keys.len() > MAX_UNSYNCED.max(self.by_row.len()) {
                    self.unsynced = Unsynced::All;
                }
            }
        }
        Ok(())
    }

    fn insert(&mut self, h: Holding) {
        let rows = self.by_task.entry(h.task_id.clone()).or_default();
        if !rows.contains(&h.row) {
            rows.push(h.row);
        }
        self.by_row.insert(h.row, h);
    }

    fn remove(&mut self, row: i64) -> Option<Holding> {
        let old = self.by_row.remove(&row)?;
        if let Some(rows) = self.by_task.get_mut(&old.task_id) {
            rows.retain(|&r| r != row);
            if rows.is_empty() {
                self.by_task.remove(&old.task_id);
            }
        }
        Some(old)
    }

    /// The attempts holding workers, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Holding> {
        self.by_row.values()
    }

    /// What the cluster has not been told yet (sorted, without repeats). Call
    /// [`HoldingSet::told`] once it has been, under the same lock.
    pub(crate) fn unsynced(&mut self) -> Unsynced {
        if let Unsynced::Tasks(keys) = &mut self.unsynced {
            keys.sort_unstable();
            keys.dedup();
        }
        self.unsynced.clone()
    }

    /// The holdings the cluster needs for `unsynced`: all of them, or those of its tasks.
    pub(crate) fn for_cluster<'a>(
        &'a self,
        unsynced: &'a Unsynced,
    ) -> Box<dyn Iterator<Item = &'a Holding> + 'a> {
        match unsynced {
            Unsynced::All => Box::new(self.iter()),
            Unsynced::Tasks(keys) => Box::new(
                keys.iter()
                    .filter_map(|k| self.by_task.get(k))
                    .flatten()
                    .filter_map(|row| self.by_row.get(row)),
            ),
        }
    }

    /// The cluster now knows what [`HoldingSet::unsynced`] returned (under the same lock, so
    /// nothing changed in between). If a tick stops before this, the next tells the cluster the
    /// same again, which is harmless: it drops each named task and takes its current holdings.
    pub(crate) fn told(&mut self) {
        self.unsynced = Unsynced::Tasks(Vec::new());
    }

    /// The cluster's running set can no longer be trusted (it panicked part-way): the next
    /// tick tells it everything.
    pub(crate) fn untold(&mut self) {
        self.unsynced = Unsynced::All;
    }

    fn same_as_full_read(&self, tx: &impl Read) -> Result<bool> {
        let full = snapshot::holdings(tx)?;
        let same = full.len() == self.by_row.len()
            && full.iter().all(|h| {
                self.by_row.get(&h.row).is_some_and(|k| {
                    (&k.task_id, &k.worker_id, k.band, k.running)
                        == (&h.task_id, &h.worker_id, h.band, h.running)
                })
            });
        if !same {
            tracing::error!(
                kept = self.by_row.len(),
                read = full.len(),
                "the kept open attempts differ from a full read"
            );
        }
        Ok(same)
    }
}

/// Pending local tasks, as of the last [`Kept::refresh`].
#[derive(Default)]
pub(crate) struct PendingSet {
    /// The tasks, in no particular order (plans do not depend on it).
    tasks: Vec<PendingTask>,
    /// Per task: its `tasks` rowid and its job's own band (before budgets).
    rows: Vec<(i64, Band)>,
    /// Where each rowid's task is in `tasks`.
    at: FxHashMap<i64, usize>,
}

/// How a refresh went (for the tick's log line and the tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Refreshed {
    /// Rows re-read (0 on a full read).
    pub rows: usize,
    /// Every pending task was read.
    pub full: bool,
}

/// A pending task of `w`'s job `spec`, at its job's band (budgets are applied later).
pub(crate) fn pending_task(spec: &crate::spec::JobSpec, w: Waiting) -> PendingTask {
    PendingTask {
        user: spec.user.clone(),
        band: spec.band,
        resources: spec.resources.clone(),
        constraints: spec.constraints.clone(),
        group_by: spec.group_by.clone(),
        depth: spec.depth,
        root_submitted_ms: w.root_submitted_ms,
        submitted_ms: w.submitted_ms,
        insertion: w.insertion,
        device_variant: spec.device_variant.clone(),
        task: w.task_id,
        job: w.job_id,
    }
}

impl PendingSet {
    /// The pending tasks, at the bands [`PendingSet::set_bands`] last gave them.
    pub(crate) fn tasks(&self) -> &[PendingTask] {
        &self.tasks
    }

    /// Re-reads task rows `rows`, or every pending task if `full`.
    fn update(&mut self, ctl: &Controller, tx: &impl Read, full: bool, rows: &[i64]) -> Result<()> {
        if full {
            self.tasks.clear();
            self.rows.clear();
            self.at.clear();
            for w in snapshot::waiting(tx)? {
                self.put(ctl, tx, w.row, Some(w))?;
            }
        } else {
            for (row, w) in snapshot::waiting_rows(tx, rows)? {
                self.put(ctl, tx, row, w)?;
            }
        }
        Ok(())
    }

    /// Gives each task its effective band under `spend` and `limits` (§4.7).
    pub(crate) fn set_bands(
        &mut self,
        ctl: &Controller,
        spend: &BTreeMap<String, i64>,
        limits: &BTreeMap<String, i64>,
    ) {
        let default_limit = ctl.cfg.budget_defaults.limit;
        for (t, &(_, base)) in self.tasks.iter_mut().zip(&self.rows) {
            t.band =
                crate::accounts::effective_band_of(base, &t.user, spend, limits, default_limit);
        }
    }

    fn same_as_full_read(&self, tx: &impl Read) -> Result<bool> {
        let mine: rustc_hash::FxHashSet<&str> =
            self.tasks.iter().map(|t| t.task.as_str()).collect();
        let full = snapshot::waiting(tx)?;
        let missing = full
            .iter()
            .filter(|w| !mine.contains(w.task_id.as_str()))
            .count();
        let extra = mine.len() + missing - full.len();
        if missing + extra > 0 {
            tracing::error!(
                missing,
                extra,
                "the kept pending set differs from a full read"
            );
        }
        Ok(missing + extra == 0)
    }

    /// Row `row` now holds `w` (or no pending task).
    fn put(
        &mut self,
        ctl: &Controller,
        tx: &impl Read,
        row: i64,
        w: Option<Waiting>,
    ) -> Result<()> {
        let spec = match &w {
            Some(w) => ctl.spec(tx, &w.job_id)?,
            None => None,
        };
        match (w, spec) {
            (Some(w), Some(spec)) => {
                let task = pending_task(&spec, w);
                match self.at.get(&row) {
                    Some(&i) => {
                        self.tasks[i] = task;
                        self.rows[i] = (row, spec.band);
                    }
                    None => {
                        self.at.insert(row, self.tasks.len());
                        self.tasks.push(task);
                        self.rows.push((row, spec.band));
                    }
                }
            }
            // Not pending, gone, or its job's spec is unreadable: not schedulable.
            _ => {
                if let Some(i) = self.at.remove(&row) {
                    self.tasks.swap_remove(i);
                    self.rows.swap_remove(i);
                    if let Some(&(moved, _)) = self.rows.get(i) {
                        self.at.insert(moved, i);
                    }
                }
            }
        }
        Ok(())
    }
}
