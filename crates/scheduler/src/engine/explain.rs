//! Why a task stays pending: the text of [`Plan::pending_reasons`](crate::Plan::pending_reasons)
//! for every task placement left unassigned (reference §4.2 step 3). Reasons describe the state at
//! the end of placement: no healthy worker, a hard constraint no worker matches, too little free
//! capacity (with the best worker's free amount), build back-pressure or the per-cycle limits,
//! or the per-job cycle cap. Explanations are memoized per constraint set and request shape.

use std::collections::{BTreeMap, BTreeSet};

use super::{Engine, Status};
use crate::constraint::satisfied;
use crate::model::Worker;
use iris_types::{Dim, Resources};

/// Facts about one constraint set's workers at the end of placement, for explanations.
struct Summary {
    /// Eligible workers in id order.
    eligible: Vec<usize>,
    /// Per checked dimension: the most free and the worker with it (smallest id on ties).
    best: [(i64, usize); 4],
    /// Per checked dimension: the largest total.
    largest: [i64; 4],
}

/// Memoized explanations, per constraint set and request shape.
#[derive(Default)]
struct Explainer {
    summaries: BTreeMap<usize, Summary>,
    reasons: BTreeMap<(usize, [i64; 4]), String>,
    /// Per gang (its first task): its reason.
    gangs: BTreeMap<usize, String>,
    /// Per constraint set, grouping attribute, gang size and request: the text after the job.
    gang_tails: BTreeMap<(usize, String, usize, String), String>,
}

impl Engine<'_> {
    pub(super) fn explain_unplaced(&mut self) {
        let mut memo = Explainer::default();
        // Collected, then built into the map at once (sorted, then bulk-loaded): cheaper than
        // one insertion per task at tens of thousands of reasons.
        let mut reasons = Vec::with_capacity(self.pending.len());
        for p in 0..self.pending.len() {
            let t = &self.pending[p];
            let reason = match &self.status[p] {
                Status::Assigned => continue,
                Status::Untouched => "Not considered this cycle".to_string(),
                Status::GangFailed(r) => r.clone(),
                Status::GangNoRoom { head, n, cs } => self.gang_memo(&mut memo, *head, *n, *cs),
                Status::Failed { cset } => self.diagnose_memo(&mut memo, *cset, &t.resources),
                Status::Skipped { head, cset } => {
                    if self.dominated(p, *head, *cset) {
                        self.diagnose_memo(&mut memo, *cset, &t.resources)
                    } else {
                        format!(
                            "Deferred: an earlier task of job {} found no worker this cycle",
                            t.job
                        )
                    }
                }
            };
            reasons.push((t.task.clone(), reason));
        }
        // Nothing writes reasons before this pass (preemption only removes them afterwards).
        self.plan.pending_reasons = reasons.into_iter().collect();
    }

    /// The reason of the gang whose first task is `head` (`n` hosts, constraint set `cs`) when
    /// groups exist but none has room, computed once per gang and its text once per shape.
    fn gang_memo(&self, memo: &mut Explainer, head: usize, n: usize, cs: usize) -> String {
        if let Some(r) = memo.gangs.get(&head) {
            return r.clone();
        }
        let h = &self.pending[head];
        let key = h.group_by.as_deref().unwrap_or("");
        let shape = (cs, key.to_string(), n, h.resources.to_string());
        let tail = memo.gang_tails.entry(shape).or_insert_with(|| {
            let best = self.best_group(cs, key, &h.resources);
            self.gang_tail(n, key, &h.resources, best, cs)
        });
        let reason = format!("Coscheduled job {}{tail}", h.job);
        memo.gangs.insert(head, reason.clone());
        reason
    }

    fn diagnose_memo(&self, memo: &mut Explainer, cs: usize, req: &Resources) -> String {
        let key = (cs, Dim::CHECKED.map(|d| req.get(d)));
        if let Some(r) = memo.reasons.get(&key) {
            return r.clone();
        }
        let summary = memo
            .summaries
            .entry(cs)
            .or_insert_with(|| self.summarize(cs));
        let reason = self.diagnose(cs, summary, req);
        memo.reasons.insert(key, reason.clone());
        reason
    }

    fn summarize(&self, cs: usize) -> Summary {
        let set = &self.csets[cs];
        let eligible: Vec<usize> = (0..self.workers.len())
            .filter(|&w| set.base.eligible[w])
            .collect();
        let mut best = [(i64::MIN, usize::MAX); 4];
        let mut largest = [0i64; 4];
        for &w in &eligible {
            for (k, d) in Dim::CHECKED.into_iter().enumerate() {
                let free = self.cap.free[w].get(d);
                // Strictly more: ties keep the smallest id (eligible is in id order).
                if free > best[k].0 {
                    best[k] = (free, w);
                }
                largest[k] = largest[k].max(self.workers[w].total.get(d));
            }
        }
        Summary {
            eligible,
            best,
            largest,
        }
    }

    /// Why no worker of constraint set `cs` can take `req` at the end of placement.
    fn diagnose(&self, cs: usize, summary: &Summary, req: &Resources) -> String {
        if !self.any_healthy {
            return "Waiting for workers: no healthy worker is registered".to_string();
        }
        if summary.eligible.is_empty() {
            return self.constraint_reason(cs);
        }
        let scope = if self.csets[cs].hard.is_empty() {
            "healthy worker"
        } else {
            "healthy worker matching its constraints"
        };
        let mut short = Vec::new();
        for (k, d) in Dim::CHECKED.into_iter().enumerate() {
            let need = req.get(d);
            let (have, w) = summary.best[k];
            if need <= 0 || have >= need {
                continue;
            }
            let largest = summary.largest[k];
            let detail = if largest <= 0 {
                format!("none has any {}", d.name())
            } else if largest < need {
                format!("largest has {} in total", d.amount(largest))
            } else {
                format!(
                    "best: {} {} free",
                    self.workers[w].id,
                    d.amount(have.max(0))
                )
            };
            short.push(format!(
                "no {scope} has {} {} free ({detail})",
                d.amount(need),
                d.name()
            ));
        }
        if !short.is_empty() {
            return format!("Waiting for resources: {}", short.join("; "));
        }
        let (mut fitting, mut backpressured, mut cycle_limited) = (0, 0, 0);
        for &w in &summary.eligible {
            if req.fits_in(&self.cap.free[w]) {
                fitting += 1;
                if self.cap.backpressured(w) {
                    backpressured += 1;
                } else if self.cap.assigned_now[w] >= self.cap.assign_limit(w) {
                    cycle_limited += 1;
                }
            }
        }
        if fitting == 0 {
            return format!(
                "Waiting for resources: no single {scope} has {req} free at the same time"
            );
        }
        let mut parts = Vec::new();
        if backpressured > 0 {
            parts.push(format!(
                "{backpressured} worker(s) with room already have {} tasks assigned or building",
                self.cap.max_building
            ));
        }
        if cycle_limited > 0 {
            let limits: BTreeSet<usize> = summary
                .eligible
                .iter()
                .map(|&w| self.cap.assign_limit(w))
                .collect();
            let limits: Vec<String> = limits.iter().map(|l| l.to_string()).collect();
            parts.push(format!(
                "{cycle_limited} worker(s) with room reached the limit of {} new assignments per cycle",
                limits.join(" or ")
            ));
        }
        if parts.is_empty() {
            return "Deferred to the next cycle".to_string();
        }
        format!("Waiting for worker capacity: {}", parts.join("; "))
    }

    /// Which hard constraint rules out every healthy worker.
    pub(crate) fn constraint_reason(&self, cs: usize) -> String {
        let healthy: Vec<&Worker> = self.workers.iter().filter(|w| w.healthy).collect();
        if healthy.is_empty() {
            return "Waiting for workers: no healthy worker is registered".to_string();
        }
        let hard = &self.csets[cs].hard;
        for c in hard {
            if !healthy.iter().any(|w| satisfied(c, &w.attributes)) {
                return format!("No worker matches constraint {c}");
            }
        }
        let all: Vec<String> = hard.iter().map(|c| c.to_string()).collect();
        format!(
            "No worker matches all constraints together: {}",
            all.join(" AND ")
        )
    }
}
