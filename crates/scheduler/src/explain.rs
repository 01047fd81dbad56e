//! Why a pending task can or cannot go to each worker, one verdict per worker (HyperQueue's
//! `hq task explain` is the model; the reference only keeps one pending reason per task).
//!
//! [`explain`] builds the same [`Engine`] that [`schedule`](crate::schedule) builds from the
//! same [`Snapshot`], and asks the engine's own predicates in the order placement applies them:
//! health and hard constraints (the constraint set's `eligible`), the gang's group attribute,
//! free capacity (`Capacity::can_host`: requested dimensions, then build back-pressure) and, for a
//! gang, whether the worker's group can take every member (`Engine::zip_gang`). So a verdict
//! cannot disagree with placement: the property tests in `tests/props.rs`
//! (`explain_fits_exactly_where_placement_may_go`) hold the two together.
//!
//! Verdicts describe the capacity at the start of a cycle: what other pending tasks take in the
//! same cycle, and what preemption may free, are not modelled (a `Resources` verdict says how
//! much of the worker lower-band work holds, which preemption may reclaim).

use std::fmt;

use crate::cluster::Cluster;
use crate::constraint::{canonical, satisfied};
use crate::engine::{task_index, Engine};
use crate::model::{PendingTask, Policy, ResourcesExt, Snapshot, TaskKey, WorkerId};
use iris_types::{AttrValue, Band, Constraint, Dim, Resources};

/// One requested dimension a worker has too little of right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    /// The dimension (cpu, memory, gpu, tpu; disk is never checked by placement).
    pub dim: Dim,
    /// Requested amount.
    pub requested: i64,
    /// Free on the worker (total − held by its ASSIGNED/BUILDING/RUNNING tasks).
    pub free: i64,
    /// The worker's total.
    pub total: i64,
}

impl Shortfall {
    /// How much is missing.
    pub fn missing(&self) -> i64 {
        self.requested - self.free.max(0)
    }
}

/// The first rule that rules a worker out, or [`Verdict::Fits`].
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Placement may put the task here now.
    Fits,
    /// The worker is unhealthy (or not yet confirmed after a controller restart).
    Unhealthy,
    /// A hard constraint fails against the worker's attribute (`None`: the worker lacks it).
    Constraint {
        /// The first failing hard constraint, in the job's order.
        constraint: Constraint,
        /// The worker's value of the constraint's attribute.
        value: Option<AttrValue>,
    },
    /// A gang member needs a worker with the gang's group attribute.
    NoGroupAttribute {
        /// The `group_by` attribute.
        key: String,
    },
    /// Too little free capacity on one or more requested dimensions.
    Resources {
        /// Every short dimension, in cpu, memory, gpu, tpu order.
        short: Vec<Shortfall>,
        /// Held by RUNNING solo tasks of a band this task outranks (what preemption may free).
        held_by_lower_band: Resources,
        /// Held by every other task there (same or higher band, slices, ASSIGNED/BUILDING).
        held_by_others: Resources,
    },
    /// The worker already holds the most ASSIGNED/BUILDING tasks it takes at once.
    BuildBackpressure {
        /// ASSIGNED+BUILDING tasks on the worker.
        building: usize,
        /// `Policy::max_building_per_worker`.
        limit: usize,
    },
    /// The worker's group cannot take the whole gang at once.
    GroupTooSmall {
        /// The `group_by` attribute.
        key: String,
        /// The worker's (canonical) value of it.
        value: String,
        /// Workers of the group eligible for the gang and with room for a member now.
        with_room: usize,
        /// Members to place together.
        needed: usize,
    },
}

impl Verdict {
    /// A short name of the rule: `fits`, `unhealthy`, `constraint`, `group-attribute`,
    /// `resources`, `backpressure`, `group-size`.
    pub fn rule(&self) -> &'static str {
        match self {
            Verdict::Fits => "fits",
            Verdict::Unhealthy => "unhealthy",
            Verdict::Constraint { .. } => "constraint",
            Verdict::NoGroupAttribute { .. } => "group-attribute",
            Verdict::Resources { .. } => "resources",
            Verdict::BuildBackpressure { .. } => "backpressure",
            Verdict::GroupTooSmall { .. } => "group-size",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Fits => write!(f, "the task fits here now"),
            Verdict::Unhealthy => write!(f, "worker is not healthy"),
            Verdict::Constraint { constraint, value } => {
                let have = match value {
                    Some(v) => format!("has {}={}", constraint.key, canonical(v)),
                    None => format!("has no {} attribute", constraint.key),
                };
                if constraint.key.starts_with("device-") {
                    write!(f, "device: requires {constraint}; worker {have}")
                } else {
                    write!(f, "constraint {constraint} fails: worker {have}")
                }
            }
            Verdict::NoGroupAttribute { key } => write!(
                f,
                "coscheduled: worker has no '{key}' attribute to group the gang by"
            ),
            Verdict::Resources {
                short,
                held_by_lower_band,
                held_by_others,
            } => {
                let parts: Vec<String> = short
                    .iter()
                    .map(|s| {
                        format!(
                            "{} short by {} (requested {}, free {} of {})",
                            s.dim.name(),
                            s.dim.amount(s.missing()),
                            s.dim.amount(s.requested),
                            s.dim.amount(s.free.max(0)),
                            s.dim.amount(s.total)
                        )
                    })
                    .collect();
                write!(f, "{}", parts.join("; "))?;
                let held = |r: &Resources| -> Vec<String> {
                    short
                        .iter()
                        .filter(|s| r.get(s.dim) > 0)
                        .map(|s| format!("{} {}", s.dim.amount(r.get(s.dim)), s.dim.name()))
                        .collect()
                };
                let others = held(held_by_others);
                if !others.is_empty() {
                    write!(
                        f,
                        "; held by same or higher band or reserved: {}",
                        others.join(", ")
                    )?;
                }
                let lower = held(held_by_lower_band);
                if !lower.is_empty() {
                    write!(f, "; held by lower-band work: {}", lower.join(", "))?;
                }
                Ok(())
            }
            Verdict::BuildBackpressure { building, limit } => write!(
                f,
                "worker has {building} tasks assigned or building (takes no more at {limit})"
            ),
            Verdict::GroupTooSmall {
                key,
                value,
                with_room,
                needed,
            } => write!(
                f,
                "coscheduled: group {key}={value} has {with_room} worker(s) with room, the gang needs {needed}"
            ),
        }
    }
}

/// One worker's verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerVerdict {
    /// Worker id.
    pub worker: WorkerId,
    /// The first rule that rules it out, or `Fits`.
    pub verdict: Verdict,
}

/// Per-worker verdicts for one pending task.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation {
    /// The task explained.
    pub task: TaskKey,
    /// Its effective band (after budget downgrades), as placement sees it.
    pub band: Band,
    /// Requested resources.
    pub resources: Resources,
    /// For a coscheduled task: the group attribute and the number of members placed together.
    pub gang: Option<(String, usize)>,
    /// Every worker in id order.
    pub workers: Vec<WorkerVerdict>,
}

/// Explains pending task `task` of `snapshot` against every worker; `None` if the snapshot does
/// not hold it as pending.
pub fn explain(snapshot: &Snapshot, policy: &Policy, task: &str) -> Option<Explanation> {
    let cluster = Cluster::new(snapshot.workers.clone(), snapshot.running.clone());
    explain_in(&cluster, &snapshot.pending, policy, task)
}

/// [`explain`] over a [`Cluster`] and its pending tasks.
pub(crate) fn explain_in(
    cluster: &Cluster,
    pending: &[PendingTask],
    policy: &Policy,
    task: &str,
) -> Option<Explanation> {
    let mut engine = Engine::new(cluster, cluster.csets.clone(), pending, policy);
    let p = pending.iter().position(|t| t.task == task)?;
    let t = &pending[p];
    let cs = engine.cset_for(p);
    // A gang: every pending task of the job, in the order placement zips them.
    let gang = t.group_by.as_ref().map(|key| {
        let mut tasks: Vec<usize> = (0..pending.len())
            .filter(|&q| pending[q].job == t.job && pending[q].group_by.is_some())
            .collect();
        tasks.sort_by(|&a, &b| {
            let (ta, tb) = (&pending[a].task, &pending[b].task);
            task_index(ta).cmp(&task_index(tb)).then_with(|| ta.cmp(tb))
        });
        let css: Vec<usize> = tasks.iter().map(|&q| engine.cset_for(q)).collect();
        let groups = engine.all_groups(css[0], key);
        (key.clone(), tasks, css, groups)
    });
    let mut workers = Vec::with_capacity(engine.workers.len());
    for w in 0..engine.workers.len() {
        let worker = &engine.workers[w];
        let verdict = if !worker.healthy {
            Verdict::Unhealthy
        } else if let Some(c) = engine.csets[cs]
            .hard
            .iter()
            .find(|c| !satisfied(c, &worker.attributes))
        {
            Verdict::Constraint {
                constraint: (*c).clone(),
                value: worker.attributes.get(&c.key).cloned(),
            }
        } else if let Some((key, ..)) = gang
            .as_ref()
            .filter(|(key, ..)| !worker.attributes.contains_key(key))
        {
            Verdict::NoGroupAttribute { key: key.clone() }
        } else if !t.resources.fits_in(&engine.cap.free[w]) {
            resources_verdict(&engine, w, t.band, &t.resources)
        } else if !engine.cap.can_host(w, &t.resources) {
            Verdict::BuildBackpressure {
                building: engine.cap.building[w],
                limit: policy.max_building_per_worker,
            }
        } else {
            match &gang {
                None => Verdict::Fits,
                Some((key, tasks, css, groups)) => {
                    match groups.iter().find(|g| g.workers.contains(&w)) {
                        Some(g) if engine.zip_gang(tasks, css, &g.workers).is_some() => {
                            Verdict::Fits
                        }
                        // Eligible with the attribute, so it is in a group; defensive otherwise.
                        found => Verdict::GroupTooSmall {
                            key: key.clone(),
                            value: found.map(|g| g.value.clone()).unwrap_or_default(),
                            with_room: found.map_or(0, |g| {
                                g.workers
                                    .iter()
                                    .filter(|&&h| engine.cap.can_host(h, &t.resources))
                                    .count()
                            }),
                            needed: tasks.len(),
                        },
                    }
                }
            }
        };
        workers.push(WorkerVerdict {
            worker: worker.id.clone(),
            verdict,
        });
    }
    Some(Explanation {
        task: t.task.clone(),
        band: t.band,
        resources: t.resources.clone(),
        gang: gang.map(|(key, tasks, ..)| (key, tasks.len())),
        workers,
    })
}

fn resources_verdict(engine: &Engine<'_>, w: usize, band: Band, req: &Resources) -> Verdict {
    let free = &engine.cap.free[w];
    let total = &engine.workers[w].total;
    let short = Dim::CHECKED
        .into_iter()
        .filter(|&d| req.get(d) > 0 && req.get(d) > free.get(d))
        .map(|d| Shortfall {
            dim: d,
            requested: req.get(d),
            free: free.get(d),
            total: total.get(d),
        })
        .collect();
    let mut lower = Resources::default();
    let mut others = Resources::default();
    for &r in &engine.on_worker[w] {
        let rt = &engine.running[r];
        if rt.running && !rt.coscheduled && band.outranks(rt.band) && band != Band::Batch {
            lower.add(&rt.resources);
        } else {
            others.add(&rt.resources);
        }
    }
    Verdict::Resources {
        short,
        held_by_lower_band: lower,
        held_by_others: others,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use iris_types::Constraint;

    fn verdicts(s: &Snapshot, task: &str) -> Vec<(String, String)> {
        explain(s, &Policy::default(), task)
            .map(|e| {
                e.workers
                    .into_iter()
                    .map(|v| (v.worker, v.verdict.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn each_worker_gets_its_first_failing_rule() {
        let s = snap(
            vec![
                worker("a").cpu(4000).build(),
                worker("b").cpu(8000).unhealthy().build(),
                worker("c").cpu(8000).attr("region", "east").build(),
                worker("d").cpu(8000).attr("region", "west").build(),
                worker("e").cpu(8000).attr("region", "west").build(),
            ],
            vec![running("/x/r/0", "e")
                .cpu(6000)
                .band(Band::Interactive)
                .build()],
            vec![pending("/u/j/0")
                .cpu(6000)
                .constraint(Constraint::equals("region", "west"))
                .build()],
        );
        assert_eq!(
            verdicts(&s, "/u/j/0"),
            [
                ("a".into(), "constraint region EQ west fails: worker has no region attribute".into()),
                ("b".into(), "worker is not healthy".into()),
                ("c".into(), "constraint region EQ west fails: worker has region=east".into()),
                ("d".into(), "the task fits here now".into()),
                (
                    "e".into(),
                    "cpu short by 4000m (requested 6000m, free 2000m of 8000m); held by same or higher band or reserved: 6000m cpu"
                        .into()
                ),
            ]
        );
        assert!(explain(&s, &Policy::default(), "/u/other/0").is_none());
    }

    #[test]
    fn lower_band_holders_are_told_apart() {
        let s = snap(
            vec![worker("a").cpu(8000).build()],
            vec![running("/x/r/0", "a").cpu(6000).band(Band::Batch).build()],
            vec![pending("/u/j/0").cpu(4000).band(Band::Production).build()],
        );
        assert_eq!(
            verdicts(&s, "/u/j/0")[0].1,
            "cpu short by 2000m (requested 4000m, free 2000m of 8000m); held by lower-band work: 6000m cpu"
        );
    }

    #[test]
    fn gangs_name_the_group_attribute_and_the_group_size() {
        let s = snap(
            vec![
                worker("a").attr("pool", "p0").build(),
                worker("b").attr("pool", "p0").build(),
                worker("c").build(),
            ],
            vec![],
            vec![
                pending("/u/g/0").group_by("pool").build(),
                pending("/u/g/1").group_by("pool").build(),
                pending("/u/g/2").group_by("pool").build(),
            ],
        );
        let v = verdicts(&s, "/u/g/1");
        assert_eq!(
            v[0].1,
            "coscheduled: group pool=p0 has 2 worker(s) with room, the gang needs 3"
        );
        assert_eq!(
            v[2].1,
            "coscheduled: worker has no 'pool' attribute to group the gang by"
        );
    }

    #[test]
    fn build_backpressure_comes_after_resources() {
        let mut running_tasks = Vec::new();
        for i in 0..8 {
            running_tasks.push(
                running(&format!("/x/r/{i}"), "a")
                    .cpu(100)
                    .building()
                    .build(),
            );
        }
        let s = snap(
            vec![worker("a").build()],
            running_tasks,
            vec![pending("/u/j/0").cpu(100).build()],
        );
        assert_eq!(
            verdicts(&s, "/u/j/0")[0].1,
            "worker has 8 tasks assigned or building (takes no more at 8)"
        );
    }
}
