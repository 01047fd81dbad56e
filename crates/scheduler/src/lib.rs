//! Pure placement for Iris: [`schedule`]`(&Snapshot, &Policy) -> Plan`.
//!
//! Architecture Invariant: no I/O, no clock, no async, no randomness. The output depends only
//! on the *contents* of the snapshot: workers are sorted by id, running tasks by key and
//! pending tasks by [`order_pending`] (whose order is total), and every map is a `BTreeMap`.
//!
//! # Pipeline (reference §4.2–4.6)
//! 0. **Gate** (the reference's `apply_scheduling_gates`): of each job that is not coscheduled,
//!    only its first `max_tasks_per_job_per_cycle` tasks in base order enter the cycle; the
//!    others are explained once per job in [`Plan::capped_jobs`] ("Per-job cycle cap reached:
//!    …") and take no turn in the ordering below. A cycle's work follows jobs × cap, not the
//!    number of pending tasks.
//! 1. **Order** pending tasks: band rank, then round-robin across users by ascending spend,
//!    each user's tasks in base order ([`order_pending`]).
//! 2. **Place**, band by band. Within a band, coscheduled jobs (gangs) go first, then solo tasks
//!    first-fit. (Placing gangs first *within each band* rather than across all bands keeps a
//!    Batch gang from taking capacity ahead of System work.)
//!    * Solo: once one of a job's tasks finds no worker, the job's remaining tasks are skipped
//!      this cycle. Candidates are healthy workers satisfying every hard constraint, ranked by
//!      the number of preferred constraints satisfied (more first), then worker id.
//!    * Gang: all pending tasks of the job go at once to distinct hosts sharing one value of
//!      `group_by`, or none do. Groups are tried by soft score (the lowest soft score among a
//!      group's hosts, higher first), then group value; hosts are ordered by `tpu-worker-id`
//!      (integers numerically, missing last), then id; tasks by key index; they are zipped,
//!      skipping hosts without room.
//!    * Fit: each requested (> 0) cpu/memory/gpu/tpu dimension fits the worker's free capacity
//!      (total − resources held by running tasks − assignments earlier in this plan); disk is not
//!      checked. A worker takes nothing more once it holds `max_building_per_worker`
//!      ASSIGNED/BUILDING tasks (counting this plan's) or received
//!      `max_assignments_per_worker_per_cycle` assignments in this plan. A pooled worker (an
//!      in-process backend: Kueue queues and places its pods) has no build back-pressure and
//!      takes up to `max_assignments_per_pool_per_cycle`.
//! 3. **Explain** every unplaced task in [`Plan::pending_reasons`]. Reasons describe the state
//!    at the end of placement (e.g. "Waiting for resources: no healthy worker has 12000m cpu free
//!    (best: worker-a 4000m free)", "No worker matches constraint region EQ us-west",
//!    "Per-job cycle cap reached: …", "Coscheduled job /u/j needs 4 workers sharing one value of
//!    'pool' with cpu=…, memory=… each; best group 'a' has 3 with room now").
//! 4. **Preempt** for what is still unplaced, in the same unit order. Candidates are tasks that
//!    found no worker, plus tasks skipped behind them that ask for at least as much under the
//!    same constraints (so they provably cannot fit either); capped tasks never preempt. Only
//!    RUNNING tasks of a strictly lower band are victims (Batch never preempts), each victim at
//!    most once per plan, and the preemptor is assigned to the freed worker in the same plan
//!    (it is listed in both [`Plan::assignments`] and, as `by`, in [`Plan::preemptions`]).
//!    The per-cycle limit and build back-pressure apply to preemptors too.
//!    * Solo preemptor: exactly one victim, not part of a slice, with the same device variant,
//!      on a healthy worker satisfying the preemptor's hard constraints, whose eviction makes
//!      the preemptor fit there. Candidates in order: lowest band first, then cheapest
//!      (accelerators, then cpu, then memory), then task key.
//!    * Gang preemptor (band = the lowest band among its tasks): first a whole running slice
//!      (coscheduled job, every member RUNNING, strictly lower band, same variant, at least as many
//!      tasks) whose hosts, once freed, form a valid group for the gang (lowest band, then
//!      smallest slice first); otherwise, group by group, hosts where evicting lower-band solo
//!      RUNNING co-tenants (cheapest first, unneeded ones dropped) makes room for the gang's
//!      largest task, preferring hosts that need the fewest evictions.
//!
//! [`explain`] gives, for one pending task, every worker's first failing rule (or `Fits`),
//! computed with the engine's own predicates over the same snapshot.
//!
//! Submit-time checks use [`feasible_anywhere`]; constraints are evaluated by
//! [`constraint_matches`]. Task keys and worker ids are assumed unique.
//!
//! The vocabulary of the inputs (`Band`, `Resources`, `AttrValue`, `ConstraintOp`,
//! `Constraint`) is `iris-types`'s, shared with federation, backends and the controller; this
//! crate defines only the snapshot and plan around it.

pub mod autoscale;
mod availability;
mod cluster;
mod constraint;
mod engine;
mod explain;
mod feasible;
mod firstfit;
mod model;
mod order;
mod preempt;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;

pub use availability::enrich_with_availability;
pub use cluster::Cluster;
pub use constraint::{constraint_matches, ConstraintError};
pub use explain::{explain, Explanation, Shortfall, Verdict, WorkerVerdict};
pub use feasible::feasible_anywhere;
pub use model::{
    Assignment, JobKey, PendingTask, Plan, Policy, Preemption, RunningTask, Snapshot, TaskKey,
    Worker, WorkerId,
};
pub use order::order_pending;

/// Computes one scheduling cycle's plan: assignments, preemptions, and a reason for every
/// pending task left unassigned. Pure and deterministic (see the crate docs).
///
/// A controller that plans tick after tick keeps a [`Cluster`] instead and brings it up to date
/// with what changed; this function builds one for the call.
pub fn schedule(snapshot: &Snapshot, policy: &Policy) -> Plan {
    let mut cluster = Cluster::new(snapshot.workers.clone(), snapshot.running.clone());
    cluster.plan(&snapshot.pending, &snapshot.user_spend, policy)
}
