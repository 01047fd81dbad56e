//! The control tick: timeouts → snapshot → `schedule` → commit the plan → wake reconcilers.

use crate::error::Result;
use crate::pending::Unsynced;
use crate::{lock, Controller};
use iris_scheduler::{Policy, RunningTask, Snapshot, Worker};
use iris_store::{apply, snapshot, Read};
use iris_types::{job_of_task, Band, TaskEvent};
use rand::RngCore;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// How often endpoints whose lease ran out are deleted (reads hide them at once).
const ENDPOINT_SWEEP: Duration = Duration::from_secs(60);

pub(crate) async fn run(ctl: Arc<Controller>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    // The last tick's reading and planning, and its writing (`pause_after`).
    let mut last = (Duration::ZERO, Duration::ZERO);
    let mut last_sweep = std::time::Instant::now();
    loop {
        tokio::select! {
            _ = ctl.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        // Coalesce bursts of wakes (e.g. a storm of submits) into one tick; see `pause_after`.
        tokio::time::sleep(pause_after(last.0, last.1)).await;
        let c = ctl.clone();
        let started = std::time::Instant::now();
        let sweep = last_sweep.elapsed() >= ENDPOINT_SWEEP;
        if sweep {
            last_sweep = started;
        }
        let res = tokio::task::spawn_blocking(move || {
            if sweep {
                if let Err(e) = c.sweep_endpoints() {
                    tracing::error!(error = %e, "sweeping expired endpoints failed");
                }
            }
            let r = paced_tick(&c);
            if let Err(e) = crate::federation::tick_pass(&c) {
                tracing::error!(error = %e, "federation placement pass failed");
            }
            r
        })
        .await;
        let cost = started.elapsed();
        ctl.metrics.tick_done(cost);
        // A tick that failed or panicked is paced by its whole cost.
        last = match &res {
            Ok(Ok(t)) => (
                t.overhead_cpu + cost.saturating_sub(t.took),
                t.took.saturating_sub(t.overhead),
            ),
            _ => (cost, Duration::ZERO),
        };
        let res = res.map(|r| r.map(|t| t.touched));
        match res {
            Ok(Ok(workers)) => {
                let links = lock(&ctl.workers);
                for w in workers {
                    if let Some(l) = links.get(&w) {
                        l.poke.notify_one();
                    }
                }
            }
            Ok(Err(e)) => tracing::error!(error = %e, "control tick failed"),
            Err(e) => tracing::error!(error = %e, "control tick panicked"),
        }
    }
}

/// Every worker daemon as the scheduler sees it (capacity, attributes, health).
/// Availability markers (`availability:<variant>`) are added per region (see
/// [`iris_scheduler::enrich_with_availability`]).
pub(crate) fn load_workers(conn: &impl Read) -> Result<Vec<Worker>> {
    let mut workers = worker_rows(conn)?;
    iris_scheduler::enrich_with_availability(&mut workers);
    Ok(workers)
}

fn worker_rows(conn: &impl Read) -> Result<Vec<Worker>> {
    Ok(iris_store::workers::capacities(conn)?
        .into_iter()
        .map(|w| Worker {
            pooled: false,
            id: w.worker_id,
            total: w.total,
            attributes: w.attributes,
            healthy: w.healthy,
            device_variant: w.device_variant,
        })
        .collect())
}

/// The placement targets as of one [`iris_store::workers::generation`] and one set of backend
/// targets: the tick and every admission batch need all of them (5,000 workers and their
/// attributes at C1M shape), and they change only when a worker registers or goes or a backend's
/// capacity moves. Kept enriched with the availability markers, which cost ~3% of the
/// controller at that shape when worked out again for every tick and batch.
pub(crate) struct WorkerRows {
    generation: u64,
    backends: Vec<Worker>,
    targets: Arc<Vec<Worker>>,
}

impl Controller {
    /// Everything work may be placed on: the worker daemons and, as pooled targets, the
    /// in-process backends (which have no worker rows), with their availability markers.
    /// `generation` is the workers' generation taken before `conn`'s read transaction first
    /// read (or, on the writer connection, under its lock): rows read at that generation are
    /// reused until it moves. Shared, not copied: an admission batch only reads them (copying
    /// 5,000 workers' attribute maps for each batch was 4% of the controller at C1M shape).
    pub(crate) fn placement_targets(
        &self,
        conn: &impl Read,
        generation: u64,
    ) -> Result<Arc<Vec<Worker>>> {
        let backends = self.backend_targets();
        if let Some(c) = lock(&self.worker_rows)
            .as_ref()
            .filter(|c| c.generation == generation && c.backends == backends)
        {
            return Ok(Arc::clone(&c.targets));
        }
        let mut targets = worker_rows(conn)?;
        targets.extend(backends.iter().cloned());
        iris_scheduler::enrich_with_availability(&mut targets);
        let targets = Arc::new(targets);
        let mut cache = lock(&self.worker_rows);
        if cache.as_ref().is_none_or(|c| c.generation <= generation) {
            *cache = Some(WorkerRows {
                generation,
                backends,
                targets: Arc::clone(&targets),
            });
        }
        Ok(targets)
    }
}

pub(crate) fn new_uid() -> String {
    let mut b = [0u8; 8];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// A new attempt's uid: 20 hex digits, the low 40 bits of the Unix time in milliseconds, then 40
/// random bits. Attempts are looked up by uid on every observation and every uid is indexed
/// (UNIQUE), so uids that grow with time are inserted at the index's end and the ones in use lie
/// on its last pages; random ones dirtied a page of the index for nearly every placement (each
/// tick's commit wrote the whole index out again at C1M shape). 40 random bits keep two uids
/// minted in the same millisecond apart (a clash fails that tick's write, which the next tick
/// redoes with new uids). The time wraps every ~35 years, which only costs locality once.
pub(crate) fn new_attempt_uid(now_ms: i64) -> String {
    let mut b = [0u8; 5];
    rand::thread_rng().fill_bytes(&mut b);
    let time = (now_ms as u64) & ((1 << 40) - 1);
    format!("{time:010x}{}", hex::encode(b))
}

/// What the scheduler sees besides the pending tasks, read in one transaction: workers
/// (unconfirmed ones unhealthy), the tasks of the holdings given (all of them, or only those
/// that changed since the cluster last heard), each user's spend and budget limits.
pub(crate) struct Scene {
    pub workers: Vec<Worker>,
    pub running: Vec<RunningTask>,
    pub spend: BTreeMap<String, i64>,
    pub limits: BTreeMap<String, i64>,
}

pub(crate) fn read_scene<'h>(
    ctl: &Controller,
    tx: &impl Read,
    generation: u64,
    holdings: impl IntoIterator<Item = &'h snapshot::Holding>,
) -> Result<Scene> {
    // The tick marks some unhealthy below: its own copy.
    let mut workers = Vec::clone(&*ctl.placement_targets(tx, generation)?);
    {
        // A worker of a previous run that has not come back gets nothing until it does.
        let confirmed = lock(&ctl.confirmed);
        // Nor does a worker of a slice being stopped.
        let draining = ctl.draining();
        for w in workers.iter_mut().filter(|w| !w.pooled) {
            w.healthy &= confirmed.contains(&w.id) && !draining.contains(&w.id);
        }
    }
    let running = running_tasks(ctl, tx, holdings)?;
    // Budgets (§4.7): spend per user over active non-BATCH work; over a non-zero limit, a user's
    // INTERACTIVE work is scheduled as BATCH.
    Ok(Scene {
        workers,
        running,
        spend: iris_store::budgets::spend_by_user(tx)?,
        limits: crate::accounts::limits(tx)?,
    })
}

/// The scheduler's view of `holdings` (those whose job's spec is unreadable left out).
fn running_tasks<'h>(
    ctl: &Controller,
    tx: &impl Read,
    holdings: impl IntoIterator<Item = &'h snapshot::Holding>,
) -> Result<Vec<RunningTask>> {
    let mut running = Vec::new();
    for h in holdings {
        let Some(spec) = ctl.spec(tx, &h.job_id)? else {
            continue;
        };
        running.push(RunningTask {
            band: Band::from_code(h.band).unwrap_or(spec.band),
            resources: spec.resources.clone(),
            running: h.running,
            coscheduled: spec.group_by.is_some(),
            device_variant: spec.device_variant.clone(),
            task: h.task_id.clone(),
            job: h.job_id.clone(),
            worker: h.worker_id.clone(),
        });
    }
    Ok(running)
}

/// Debug builds: the cluster's running set, kept across ticks from the changes alone, is what
/// every holding read whole says (`every` from [`running_tasks`] over all of them).
fn check_cluster_against_full_read(cluster: &iris_scheduler::Cluster, every: Vec<RunningTask>) {
    let key = |t: &RunningTask| (t.task.clone(), t.worker.clone());
    let mut every = every;
    every.sort_by_key(key);
    let mut kept: Vec<RunningTask> = cluster.running().cloned().collect();
    kept.sort_by_key(key);
    assert!(
        kept == every,
        "the cluster's running set ({} tasks) differs from the holdings ({} tasks)",
        kept.len(),
        every.len()
    );
}

/// What the scheduler sees, read in one transaction: [`Scene`] and every pending local task
/// with its effective band (budgets, §4.7). `ExplainTask` explains over it; the tick plans over
/// the same reads, with the pending tasks kept across ticks (`crate::pending`).
pub(crate) fn read_snapshot(ctl: &Controller, tx: &impl Read, generation: u64) -> Result<Snapshot> {
    let h = read_scene(ctl, tx, generation, &snapshot::holdings(tx)?)?;
    let mut pending = Vec::new();
    for w in snapshot::waiting(tx)? {
        let Some(spec) = ctl.spec(tx, &w.job_id)? else {
            continue;
        };
        let mut p = crate::pending::pending_task(&spec, w);
        p.band = crate::accounts::effective_band_of(
            spec.band,
            &spec.user,
            &h.spend,
            &h.limits,
            ctl.cfg.budget_defaults.limit,
        );
        pending.push(p);
    }
    Ok(Snapshot {
        workers: h.workers,
        running: h.running,
        pending,
        user_spend: h.spend,
    })
}

/// The pause before the next tick, after one that spent `overhead` of CPU reading the state and
/// planning and `writing` writing what it placed: long enough that reading and planning take at
/// most a quarter of the cycle, tick and pause together (so those passes, which grow with the
/// queue and the cluster, take at most about a quarter of a core however large both are); at
/// least 2 ms (bursts of wakes, e.g. a storm of submits, coalesce into one tick) and at most 3 s.
///
/// Writing is not paced for itself: each placement has to be written once whenever it is made,
/// so a pause for it only delays the next ones (with it paced as overhead, a C1M-shape cluster
/// placed ~5,000 tasks/s). But it is part of the cycle. And the overhead is the tick thread's CPU
/// time, not its wall time, which on a busy host counts the time it waited for a CPU. At C1M
/// shape a job's tasks are placed at most four per tick and a worker's four
/// (`iris_scheduler::Policy`), so the ticks' rate bounds the cluster's: three times the wall
/// time on top of the writing held each tick back ~0.7 s there (BENCHMARKS.md).
pub(crate) fn pause_after(overhead: Duration, writing: Duration) -> Duration {
    (overhead * 3)
        .saturating_sub(writing)
        .clamp(Duration::from_millis(2), Duration::from_secs(3))
}

/// What one tick did, for its pacing ([`pause_after`]).
pub(crate) struct Ticked {
    /// The workers whose desired set changed.
    pub touched: BTreeSet<String>,
    /// Time spent reading and planning, or the whole tick when it placed nothing.
    pub overhead: Duration,
    /// The CPU time of `overhead` (its wall time where the thread's CPU clock is not available).
    pub overhead_cpu: Duration,
    /// The whole tick.
    pub took: Duration,
}

/// One control tick. Returns the workers whose desired set changed.
#[cfg(test)]
pub(crate) fn tick(ctl: &Controller) -> Result<BTreeSet<String>> {
    paced_tick(ctl).map(|t| t.touched)
}

/// One control tick, with what its pacing needs.
pub(crate) fn paced_tick(ctl: &Controller) -> Result<Ticked> {
    // Its write transactions hand the writer to a thread that waits for it after the
    // observation writer's `shared` budget.
    tick_within(ctl, crate::observe::TX_BUDGET.shared)
}

/// [`paced_tick`], its write transactions handing the writer over after `shared`.
pub(crate) fn tick_within(ctl: &Controller, shared: Duration) -> Result<Ticked> {
    let now = iris_store::now_ms();
    // Phase times for the debug line at the end (`IRIS_LOG=iris_controller::tick=debug`).
    let started = std::time::Instant::now();
    let cpu_started = thread_cpu();
    let mut touched = BTreeSet::new();
    let snap = lock(&ctl.snap);
    let generation = iris_store::workers::generation();
    // Taken before the read transaction's first read, so every write it names is visible to
    // the reads below (`iris_store::changes`).
    let taken = snap.task_changes().take();
    let tx = snap.begin_read()?;
    // The kept sets first: nothing between the take and here may fail and drop the notes.
    let mut kept = lock(&ctl.kept);
    let refreshed = kept.refresh(ctl, &tx, taken)?;
    if cfg!(debug_assertions) {
        kept.check_against_full_read(&tx)?;
    }
    let expired = snapshot::past_scheduling_deadline(&tx, now)?;
    let timed_out = snapshot::past_execution_timeout(&tx, now)?;
    let addresses = iris_store::workers::addresses(&tx)?;
    // The cluster keeps its running set across ticks: it hears only of the tasks whose
    // holdings changed (everything after a full read).
    let unsynced = kept.holdings.unsynced();
    let scene = read_scene(ctl, &tx, generation, kept.holdings.for_cluster(&unsynced))?;
    let every_running = if cfg!(debug_assertions) {
        Some(running_tasks(ctl, &tx, kept.holdings.iter())?)
    } else {
        None
    };
    let pending = &mut kept.pending;
    pending.set_bands(ctl, &scene.spend, &scene.limits);
    drop(tx);
    drop(snap);
    let read = started.elapsed();
    let tasks = pending.tasks();
    let pending_by_band: Vec<(&'static str, i64)> = Band::ALL
        .iter()
        .map(|b| {
            let n = tasks.iter().filter(|p| p.band == *b).count();
            (b.name(), n as i64)
        })
        .collect();
    let healthy = scene.workers.iter().filter(|w| w.healthy).count() as i64;
    let unhealthy = scene.workers.len() as i64 - healthy;
    ctl.metrics.tick_plan(&pending_by_band, healthy, unhealthy);
    if !expired.is_empty() || !timed_out.is_empty() {
        drop(kept);
        let mut conn = ctl.writer(crate::WriterUse::Tick);
        let wtx = conn.begin()?;
        for t in &expired {
            apply::apply_task_event(
                &wtx,
                t,
                &TaskEvent::SchedulingTimeout,
                None,
                apply::Finish::Now,
                now,
                "iris/controller",
            )?;
        }
        for (t, w) in &timed_out {
            apply::apply_task_event(
                &wtx,
                t,
                &TaskEvent::ExecutionTimeout,
                None,
                apply::Finish::AwaitWorker,
                now,
                "iris/controller",
            )?;
            touched.insert(w.clone());
        }
        wtx.commit()?;
        // Those tasks changed state after the snapshot: plan again right after the pause.
        ctl.wake.notify_one();
        return Ok(Ticked::whole(touched, started, cpu_started));
    }
    if tasks.is_empty() {
        *lock(&ctl.pending_reasons) = Default::default();
        return Ok(Ticked::whole(touched, started, cpu_started));
    }
    // Plan without holding the DB: submissions and reconciles proceed meanwhile. Every decision
    // is re-validated by `transition` when applied below.
    let plan = {
        let mut cluster = match ctl.cluster.lock() {
            Ok(c) => c,
            Err(poisoned) => {
                // A tick panicked part-way through the cluster: rebuild its running set from
                // every holding next tick.
                ctl.cluster.clear_poison();
                drop(poisoned);
                kept.holdings.untold();
                ctl.wake.notify_one();
                return Ok(Ticked::whole(touched, started, cpu_started));
            }
        };
        match &unsynced {
            Unsynced::All => cluster.sync(scene.workers, scene.running),
            Unsynced::Tasks(keys) => {
                cluster.set_workers(scene.workers);
                cluster.update(keys.iter().map(String::as_str), scene.running);
            }
        }
        if let Some(every) = every_running {
            check_cluster_against_full_read(&cluster, every);
        }
        cluster.plan(tasks, &scene.spend, &Policy::default())
    };
    // The band each placed task goes at (budgets applied).
    let bands: BTreeMap<String, Band> = {
        let placed: rustc_hash::FxHashSet<&str> =
            plan.assignments.iter().map(|a| a.task.as_str()).collect();
        tasks
            .iter()
            .filter(|p| placed.contains(p.task.as_str()))
            .map(|p| (p.task.clone(), p.band))
            .collect()
    };
    let pending_n = tasks.len();
    kept.holdings.told();
    drop(kept);
    let planned = started.elapsed();
    let planned_cpu = cpu_since(cpu_started, planned);
    let (mut waited_for_writer, mut rolled_up, mut committed) = Default::default();
    ctl.metrics
        .planned(plan.assignments.len(), plan.preemptions.len());
    if !plan.preemptions.is_empty() || !plan.assignments.is_empty() {
        let mut preemptions = plan.preemptions.as_slice();
        let mut assignments = plan.assignments.as_slice();
        // In transactions that hand the writer over (fairly) once they have run for `shared`
        // and another thread waits for it, as the observation writer's do: a
        // tick placing 20,000 tasks at C1M shape held it for ~0.4 s, and submissions waited
        // behind it. The plan holds across them: every assignment is re-validated when applied.
        loop {
            let now = iris_store::now_ms();
            let asked = std::time::Instant::now();
            let mut conn = ctl.writer(crate::WriterUse::Tick);
            waited_for_writer += asked.elapsed();
            let began = std::time::Instant::now();
            let tx = conn.begin()?;
            // Read under the write lock: a slice being stopped checks, under the same lock, that
            // nothing was placed on it (`crate::autoscale`).
            let draining = ctl.draining();
            // The assignments' jobs are rolled up once each per transaction, after all of them.
            let mut rollups = apply::JobRollups::default();
            for p in preemptions {
                apply::apply_task_event(
                    &tx,
                    &p.victim,
                    &TaskEvent::Preempt { by: p.by.clone() },
                    None,
                    apply::Finish::AwaitWorker,
                    now,
                    "iris/controller",
                )?;
                touched.insert(p.worker.clone());
            }
            preemptions = &[];
            while let Some((a, rest)) = assignments.split_first() {
                assignments = rest;
                if draining.contains(&a.worker) {
                    continue;
                }
                let band = bands.get(&a.task).copied().unwrap_or(Band::Interactive);
                // Asked of the backend registry, not inferred from a missing address: a worker
                // removed since the snapshot must fail this commit (its row is gone), not become
                // a backend nobody reconciles.
                let holder = if ctl.backend(&a.worker).is_some() {
                    apply::Holder::Backend(&a.worker)
                } else {
                    apply::Holder::Worker {
                        id: &a.worker,
                        address: addresses.get(&a.worker).map_or("", String::as_str),
                    }
                };
                if apply::assign_deferred(
                    &tx,
                    &a.task,
                    holder,
                    &new_attempt_uid(now),
                    band.code(),
                    now,
                    &mut rollups,
                )? {
                    touched.insert(a.worker.clone());
                }
                // Never between two tasks of one job: a gang's members commit together.
                let job_ends = rest
                    .first()
                    .is_none_or(|next| job_of_task(&next.task) != job_of_task(&a.task));
                if job_ends && began.elapsed() >= shared && ctl.writer_wanted() {
                    break;
                }
            }
            let at = std::time::Instant::now();
            rollups.finish(&tx, now)?;
            rolled_up += at.elapsed();
            let at = std::time::Instant::now();
            tx.commit()?;
            committed += at.elapsed();
            conn.unlock_fair();
            if assignments.is_empty() {
                break;
            }
        }
        // Progress: plan again right after the pause, for what the per-job and per-worker
        // cycle caps held back, instead of waiting out the idle second. A tick that changes
        // nothing does not re-arm itself.
        if !touched.is_empty() {
            ctl.wake.notify_one();
        }
    }
    let mut reasons = crate::views::PendingReasons {
        by_task: plan.pending_reasons.into_iter().collect(),
        capped_jobs: plan.capped_jobs.into_iter().collect(),
    };
    // A task the autoscaler is bringing capacity up for (or cannot) says so instead.
    for (task, hint) in lock(&ctl.autoscale).hints.iter() {
        if reasons.get(task).is_some() {
            reasons.by_task.insert(task.clone(), hint.clone());
        }
    }
    *lock(&ctl.pending_reasons) = reasons;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    tracing::debug!(
        pending = pending_n,
        rows_reread = refreshed.rows,
        read_in_full = refreshed.full,
        assigned = plan.assignments.len(),
        read_ms = ms(read),
        plan_ms = ms(planned - read),
        apply_ms = ms(started.elapsed() - planned),
        of_which_waiting_for_writer_ms = ms(waited_for_writer),
        of_which_rollups_ms = ms(rolled_up),
        of_which_commit_ms = ms(committed),
        "tick"
    );
    Ok(Ticked {
        touched,
        overhead: planned,
        overhead_cpu: planned_cpu,
        took: started.elapsed(),
    })
}

/// The calling thread's CPU time so far (`None` where its clock cannot be read).
fn thread_cpu() -> Option<Duration> {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .ok()
        .map(Duration::from)
}

/// The calling thread's CPU time since `start` ([`thread_cpu`]), or `wall` without its clock.
fn cpu_since(start: Option<Duration>, wall: Duration) -> Duration {
    match (start, thread_cpu()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => wall,
    }
}

impl Ticked {
    /// A tick that stopped before applying a plan: all of it was overhead.
    fn whole(
        touched: BTreeSet<String>,
        started: std::time::Instant,
        cpu_started: Option<Duration>,
    ) -> Self {
        let took = started.elapsed();
        Ticked {
            touched,
            overhead: took,
            overhead_cpu: cpu_since(cpu_started, took),
            took,
        }
    }
}

#[cfg(test)]
#[path = "tick_tests.rs"]
mod tests;
