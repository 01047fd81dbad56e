//! Property tests for `schedule` over small random clusters.

use std::collections::{BTreeMap, BTreeSet};

use iris_scheduler::*;
use iris_types::{AttrValue, Band, Constraint, ConstraintOp, Resources};
use proptest::prelude::*;

const GIB: i64 = 1 << 30;
const VARIANTS: [&str; 3] = ["", "a100", "h100"];
const REGIONS: [&str; 2] = ["east", "west"];
const POOLS: [&str; 3] = ["p0", "p1", "p2"];

fn band(i: u8) -> Band {
    Band::ALL[usize::from(i % 4)]
}

/// Raw worker: (total, variant, region, pool, tpu-worker-id, healthy).
type RawWorker = (
    Resources,
    String,
    Option<usize>,
    Option<usize>,
    Option<i64>,
    bool,
);

prop_compose! {
    fn arb_worker()(
        cpu in prop_oneof![1 => Just(0i64), 6 => 2000i64..16000],
        mem in 0i64..64,
        gpu in prop_oneof![Just(0i64), Just(4), Just(8)],
        variant in 1usize..3,
        region in proptest::option::of(0usize..2),
        pool in proptest::option::weighted(0.8, 0usize..3),
        tpu_id in proptest::option::weighted(0.7, 0i64..4),
        healthy in proptest::bool::weighted(0.9),
    ) -> RawWorker {
        let total = Resources { cpu_millicores: cpu, memory_bytes: mem * GIB, gpu, ..Resources::default() };
        let variant = if gpu > 0 { VARIANTS[variant].to_string() } else { String::new() };
        (total, variant, region, pool, tpu_id, healthy)
    }
}

fn build_workers(raw: Vec<RawWorker>) -> Vec<Worker> {
    raw.into_iter()
        .enumerate()
        .map(|(i, (total, variant, region, pool, tpu_id, healthy))| {
            let mut w = Worker::new(format!("w{i:02}"), total);
            w.healthy = healthy;
            w.device_variant = variant.clone();
            if !variant.is_empty() {
                w = w.with_attr("device-variant", variant.as_str());
            }
            if let Some(r) = region {
                w = w.with_attr("region", REGIONS[r]);
            }
            if let Some(p) = pool {
                w = w.with_attr("pool", POOLS[p]);
            }
            if let Some(t) = tpu_id {
                w = w.with_attr("tpu-worker-id", t);
            }
            w
        })
        .collect()
}

/// Raw running task: (worker, band, cpu, mem GiB, gpu, running, slice job or solo).
type RawRunning = (usize, u8, i64, i64, i64, bool, Option<u8>);

fn arb_running() -> impl Strategy<Value = RawRunning> {
    (
        0usize..10,
        0u8..4,
        0i64..8000,
        0i64..24,
        prop_oneof![Just(0i64), 1i64..5],
        proptest::bool::weighted(0.8),
        proptest::option::weighted(0.3, 0u8..2),
    )
}

/// Keeps only running tasks that fit (on every dimension) on top of the ones kept before.
fn build_running(workers: &[Worker], raw: Vec<RawRunning>) -> Vec<RunningTask> {
    let mut used: Vec<Resources> = vec![Resources::default(); workers.len()];
    let mut out = Vec::new();
    for (i, (w, b, cpu, mem, gpu, running, slice)) in raw.into_iter().enumerate() {
        let Some(worker) = workers.get(w % workers.len().max(1)) else {
            continue;
        };
        let w = w % workers.len();
        let res = Resources {
            cpu_millicores: cpu,
            memory_bytes: mem * GIB,
            gpu: if worker.total.gpu > 0 { gpu } else { 0 },
            ..Resources::default()
        };
        let t = &worker.total;
        let u = &used[w];
        if u.cpu_millicores + res.cpu_millicores > t.cpu_millicores
            || u.memory_bytes + res.memory_bytes > t.memory_bytes
            || u.gpu + res.gpu > t.gpu
        {
            continue;
        }
        used[w].cpu_millicores += res.cpu_millicores;
        used[w].memory_bytes += res.memory_bytes;
        used[w].gpu += res.gpu;
        let (job, coscheduled) = match slice {
            Some(s) => (format!("/r/slice{s}"), true),
            None => (format!("/r/solo{i}"), false),
        };
        out.push(RunningTask {
            task: format!("{job}/{i}"),
            job,
            worker: worker.id.clone(),
            band: band(b),
            resources: res,
            running,
            coscheduled,
            device_variant: if res_has_gpu(&worker.total) {
                worker.device_variant.clone()
            } else {
                String::new()
            },
        });
    }
    out
}

fn res_has_gpu(r: &Resources) -> bool {
    r.gpu > 0
}

/// Raw job: (user, band, cpu, mem GiB, gpu, variant, tasks, gang, constraint kind, depth).
type RawJob = (u8, u8, i64, i64, i64, usize, usize, bool, u8, u32);

fn arb_job() -> impl Strategy<Value = RawJob> {
    (
        0u8..3,
        0u8..4,
        0i64..6000,
        0i64..16,
        prop_oneof![3 => Just(0i64), 1 => 1i64..9],
        1usize..3,
        1usize..5,
        proptest::bool::weighted(0.3),
        0u8..6,
        0u32..3,
    )
}

fn build_pending(raw: Vec<RawJob>) -> Vec<PendingTask> {
    let mut out = Vec::new();
    for (j, (user, b, cpu, mem, gpu, variant, n, gang, ckind, depth)) in raw.into_iter().enumerate()
    {
        let user = format!("u{user}");
        let job = format!("/{user}/job{j}");
        let variant = if gpu > 0 { VARIANTS[variant] } else { "" };
        let mut constraints = Vec::new();
        match ckind {
            1 => constraints.push(Constraint::equals("region", "west")),
            2 => constraints.push(Constraint::equals("region", "east").preferred()),
            3 => constraints.push(Constraint::new(
                "region",
                ConstraintOp::Gt,
                Some(AttrValue::Int(1)),
            )),
            4 => constraints.push(Constraint::one_of("pool", vec!["p0".into(), "P1 ".into()])),
            _ => {}
        }
        if !variant.is_empty() {
            constraints.push(Constraint::equals("device-variant", variant));
        }
        for i in 0..n {
            out.push(PendingTask {
                task: format!("{job}/{i}"),
                job: job.clone(),
                user: user.clone(),
                band: band(b),
                resources: Resources {
                    cpu_millicores: cpu,
                    memory_bytes: mem * GIB,
                    gpu,
                    ..Resources::default()
                },
                constraints: constraints.clone(),
                group_by: gang.then(|| "pool".to_string()),
                depth,
                root_submitted_ms: j as i64 % 3,
                submitted_ms: j as i64,
                insertion: i as i64,
                device_variant: variant.to_string(),
            });
        }
    }
    out
}

prop_compose! {
    fn arb_snapshot()(
        workers in proptest::collection::vec(arb_worker(), 1..10),
        running in proptest::collection::vec(arb_running(), 0..20),
        jobs in proptest::collection::vec(arb_job(), 0..8),
        spend in proptest::collection::vec(0i64..100, 3),
    ) -> Snapshot {
        let workers = build_workers(workers);
        let running = build_running(&workers, running);
        let pending = build_pending(jobs);
        let user_spend = spend.into_iter().enumerate().map(|(i, s)| (format!("u{i}"), s)).collect();
        Snapshot { workers, running, pending, user_spend }
    }
}

fn small_policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::default()),
        (1usize..3, 1usize..3, 1usize..4).prop_map(|(a, b, c)| Policy {
            max_tasks_per_job_per_cycle: a,
            max_assignments_per_worker_per_cycle: b,
            max_building_per_worker: c,
            max_assignments_per_pool_per_cycle: b,
        }),
    ]
}

/// The snapshot after applying `plan`: victims gone, assignments now ASSIGNED tasks.
fn apply(s: &Snapshot, plan: &Plan) -> Snapshot {
    let victims: BTreeSet<&str> = plan.preemptions.iter().map(|p| p.victim.as_str()).collect();
    let assigned: BTreeMap<&str, &str> = plan
        .assignments
        .iter()
        .map(|a| (a.task.as_str(), a.worker.as_str()))
        .collect();
    let mut running: Vec<RunningTask> = s
        .running
        .iter()
        .filter(|r| !victims.contains(r.task.as_str()))
        .cloned()
        .collect();
    for t in &s.pending {
        if let Some(w) = assigned.get(t.task.as_str()) {
            running.push(RunningTask {
                task: t.task.clone(),
                job: t.job.clone(),
                worker: w.to_string(),
                band: t.band,
                resources: t.resources.clone(),
                running: false,
                coscheduled: t.group_by.is_some(),
                device_variant: t.device_variant.clone(),
            });
        }
    }
    Snapshot {
        workers: s.workers.clone(),
        running,
        pending: s
            .pending
            .iter()
            .filter(|t| !assigned.contains_key(t.task.as_str()))
            .cloned()
            .collect(),
        user_spend: s.user_spend.clone(),
    }
}

fn dims(r: &Resources) -> [i64; 4] {
    [r.cpu_millicores, r.memory_bytes, r.gpu, r.tpu]
}

/// No worker is over-committed on any dimension a new assignment asks for.
fn check_no_overcommit(s: &Snapshot, plan: &Plan) -> Result<(), TestCaseError> {
    let after = apply(s, plan);
    let new: BTreeSet<&str> = plan.assignments.iter().map(|a| a.task.as_str()).collect();
    for w in &s.workers {
        let on_w: Vec<&RunningTask> = after.running.iter().filter(|r| r.worker == w.id).collect();
        let mut used = [0i64; 4];
        let mut asked = [false; 4];
        for r in &on_w {
            for (k, v) in dims(&r.resources).into_iter().enumerate() {
                used[k] += v;
                if new.contains(r.task.as_str()) && v > 0 {
                    asked[k] = true;
                }
            }
        }
        let total = dims(&w.total);
        for k in 0..4 {
            prop_assert!(
                !asked[k] || used[k] <= total[k],
                "worker {} over-committed on dim {k}: {} > {}",
                w.id,
                used[k],
                total[k]
            );
        }
    }
    Ok(())
}

fn shuffled<T: Clone>(v: &[T], seed: u64) -> Vec<T> {
    let mut out = v.to_vec();
    let mut x = seed | 1;
    for i in (1..out.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.swap(i, (x % (i as u64 + 1)) as usize);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_worker_is_over_committed(s in arb_snapshot(), policy in small_policy()) {
        let plan = schedule(&s, &policy);
        check_no_overcommit(&s, &plan)?;
    }

    #[test]
    fn assignments_respect_health_and_hard_constraints(s in arb_snapshot()) {
        let plan = schedule(&s, &Policy::default());
        let workers: BTreeMap<&str, &Worker> = s.workers.iter().map(|w| (w.id.as_str(), w)).collect();
        let tasks: BTreeMap<&str, &PendingTask> = s.pending.iter().map(|t| (t.task.as_str(), t)).collect();
        for a in &plan.assignments {
            let w = workers[a.worker.as_str()];
            let t = tasks[a.task.as_str()];
            prop_assert!(w.healthy);
            for c in t.constraints.iter().filter(|c| c.required) {
                prop_assert_eq!(constraint_matches(c, &w.attributes), Ok(true), "{} on {}", c, w.id);
            }
        }
    }

    #[test]
    fn every_pending_task_is_assigned_xor_explained(s in arb_snapshot(), policy in small_policy()) {
        let plan = schedule(&s, &policy);
        let assigned: BTreeSet<&str> = plan.assignments.iter().map(|a| a.task.as_str()).collect();
        prop_assert_eq!(assigned.len(), plan.assignments.len(), "a task was assigned twice");
        for t in &s.pending {
            if assigned.contains(t.task.as_str()) {
                prop_assert!(!plan.pending_reasons.contains_key(&t.task), "{}", t.task);
            } else {
                prop_assert!(plan.reason(&t.task).is_some_and(|r| !r.is_empty()), "{}", t.task);
            }
        }
        // Nothing else is explained: per-task reasons name pending tasks, capped jobs pending jobs.
        let tasks: BTreeSet<&str> = s.pending.iter().map(|t| t.task.as_str()).collect();
        let jobs: BTreeSet<&str> = s.pending.iter().map(|t| t.job.as_str()).collect();
        prop_assert!(plan.pending_reasons.keys().all(|t| tasks.contains(t.as_str())));
        prop_assert!(plan.capped_jobs.keys().all(|j| jobs.contains(j.as_str())));
    }

    #[test]
    fn gangs_are_placed_whole_on_one_group(s in arb_snapshot(), policy in small_policy()) {
        let plan = schedule(&s, &policy);
        let where_: BTreeMap<&str, &str> =
            plan.assignments.iter().map(|a| (a.task.as_str(), a.worker.as_str())).collect();
        let workers: BTreeMap<&str, &Worker> = s.workers.iter().map(|w| (w.id.as_str(), w)).collect();
        let mut gangs: BTreeMap<&str, Vec<&PendingTask>> = BTreeMap::new();
        for t in s.pending.iter().filter(|t| t.group_by.is_some()) {
            gangs.entry(t.job.as_str()).or_default().push(t);
        }
        for (job, tasks) in gangs {
            let hosts: Vec<&str> = tasks.iter().filter_map(|t| where_.get(t.task.as_str()).copied()).collect();
            prop_assert!(hosts.is_empty() || hosts.len() == tasks.len(), "gang {} partly placed", job);
            let distinct: BTreeSet<&str> = hosts.iter().copied().collect();
            prop_assert_eq!(distinct.len(), hosts.len(), "gang {} shares a host", job);
            let values: BTreeSet<String> = hosts
                .iter()
                .map(|h| workers[h].attributes.get("pool").map(|v| v.to_string().to_lowercase()).unwrap_or_default())
                .collect();
            prop_assert!(values.len() <= 1, "gang {} spans groups {:?}", job, values);
            prop_assert!(!values.contains(""), "gang {} on a host without the attribute", job);
        }
    }

    #[test]
    fn preemption_only_of_lower_band_running_tasks(s in arb_snapshot(), policy in small_policy()) {
        let plan = schedule(&s, &policy);
        let running: BTreeMap<&str, &RunningTask> = s.running.iter().map(|r| (r.task.as_str(), r)).collect();
        let pending: BTreeMap<&str, &PendingTask> = s.pending.iter().map(|t| (t.task.as_str(), t)).collect();
        let assigned: BTreeMap<&str, &str> =
            plan.assignments.iter().map(|a| (a.task.as_str(), a.worker.as_str())).collect();
        let mut seen = BTreeSet::new();
        for p in &plan.preemptions {
            let v = running[p.victim.as_str()];
            let by = pending[p.by.as_str()];
            prop_assert!(seen.insert(p.victim.as_str()), "victim {} chosen twice", p.victim);
            prop_assert!(v.running, "victim {} is not RUNNING", p.victim);
            prop_assert!(by.band.outranks(v.band), "{} ({}) preempted {} ({})", by.task, by.band, v.task, v.band);
            prop_assert_eq!(&v.worker, &p.worker);
            prop_assert!(assigned.contains_key(p.by.as_str()), "preemptor {} not assigned", p.by);
            if by.group_by.is_none() {
                prop_assert!(!v.coscheduled, "solo {} tore down slice member {}", by.task, v.task);
                prop_assert_eq!(assigned[p.by.as_str()], p.worker.as_str());
                prop_assert_eq!(&by.device_variant, &v.device_variant);
            }
        }
    }

    #[test]
    fn deterministic_and_independent_of_input_order(s in arb_snapshot(), policy in small_policy(), seed in any::<u64>()) {
        let plan = schedule(&s, &policy);
        prop_assert_eq!(&schedule(&s, &policy), &plan);
        let s2 = Snapshot {
            workers: shuffled(&s.workers, seed),
            running: shuffled(&s.running, seed.rotate_left(17)),
            pending: shuffled(&s.pending, seed.rotate_left(31)),
            user_spend: s.user_spend.clone(),
        };
        prop_assert_eq!(&schedule(&s2, &policy), &plan);
    }

    #[test]
    fn rerun_on_post_plan_snapshot_assigns_nothing_twice(s in arb_snapshot(), policy in small_policy()) {
        let plan = schedule(&s, &policy);
        let after = apply(&s, &plan);
        let plan2 = schedule(&after, &policy);
        let first: BTreeSet<&str> = plan.assignments.iter().map(|a| a.task.as_str()).collect();
        for a in &plan2.assignments {
            prop_assert!(!first.contains(a.task.as_str()), "{} assigned again", a.task);
        }
        check_no_overcommit(&after, &plan2)?;
    }
}

/// A variation of running task `rt` under the same key: another worker, state, band or size.
fn varied(rt: &RunningTask, workers: &[Worker], x: u64) -> RunningTask {
    let mut v = rt.clone();
    match x % 4 {
        0 => v.worker = workers[(x as usize / 4) % workers.len()].id.clone(),
        1 => v.running = !v.running,
        2 => v.band = band((x / 4) as u8),
        _ => v.resources.cpu_millicores += 500,
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// ARCHITECTURE: a `Cluster` kept across changes plans as one built fresh.
    #[test]
    fn a_cluster_kept_across_changes_plans_as_one_built_fresh(
        s in arb_snapshot(),
        other in arb_snapshot(),
        policy in small_policy(),
        seed in any::<u64>(),
    ) {
        // Start from a different picture: some of the running tasks missing, some varied under
        // their key, another snapshot's tasks (stale keys) in the mix, another worker set.
        let shuffled_running = shuffled(&s.running, seed);
        let mut start = Vec::new();
        let mut removed: Vec<String> = Vec::new();
        let mut added = Vec::new();
        for (i, rt) in shuffled_running.iter().enumerate() {
            match (seed.rotate_left(i as u32 * 3) >> 5) % 3 {
                0 => added.push(rt.clone()),
                1 => {
                    start.push(varied(rt, &s.workers, seed.rotate_left(i as u32)));
                    removed.push(rt.task.clone());
                    added.push(rt.clone());
                }
                _ => start.push(rt.clone()),
            }
        }
        for rt in &other.running {
            let mut stale = rt.clone();
            stale.task = format!("/stale{}", rt.task);
            removed.push(stale.task.clone());
            start.push(stale);
        }
        let mut kept = Cluster::new(other.workers.clone(), start.clone());
        // A plan over the old workers first: what it learnt about them must not outlive them.
        kept.plan(&other.pending, &other.user_spend, &policy);
        kept.set_workers(s.workers.clone());
        kept.update(removed.iter().map(String::as_str), added);
        let fresh = Cluster::new(s.workers.clone(), s.running.clone());
        prop_assert!(kept.running().eq(fresh.running()));
        let plan = schedule(&s, &policy);
        prop_assert_eq!(&kept.plan(&s.pending, &s.user_spend, &policy), &plan);

        // The same picture reached by a whole-state sync from the start.
        let mut synced = Cluster::new(other.workers.clone(), start);
        synced.sync(shuffled(&s.workers, seed), shuffled(&s.running, seed.rotate_left(7)));
        prop_assert_eq!(&synced.plan(&s.pending, &s.user_spend, &policy), &plan);

        // And the tick after: the plan applied and every ASSIGNED task started RUNNING.
        let mut next = apply(&s, &plan);
        for rt in &mut next.running {
            rt.running = true;
        }
        kept.sync(next.workers.clone(), next.running.clone());
        prop_assert_eq!(
            &kept.plan(&next.pending, &next.user_spend, &policy),
            &schedule(&next, &policy)
        );
        if let Some(task) = next.pending.first() {
            prop_assert_eq!(
                kept.explain(&next.pending, &policy, &task.task),
                explain(&next, &policy, &task.task)
            );
        }
    }
}

/// Guards the generators: a fair share of random cases must exercise each feature.
#[test]
fn generators_exercise_every_feature() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut assigned, mut preempted, mut gang_preempted, mut gang_placed, mut unplaced) =
        (0, 0, 0, 0, 0);
    for _ in 0..400 {
        let s = arb_snapshot()
            .new_tree(&mut runner)
            .map(|t| t.current())
            .unwrap_or_default();
        let plan = schedule(&s, &Policy::default());
        let gang_tasks: BTreeSet<&str> = s
            .pending
            .iter()
            .filter(|t| t.group_by.is_some())
            .map(|t| t.task.as_str())
            .collect();
        assigned += usize::from(!plan.assignments.is_empty());
        preempted += usize::from(!plan.preemptions.is_empty());
        gang_preempted += usize::from(
            plan.preemptions
                .iter()
                .any(|p| gang_tasks.contains(p.by.as_str())),
        );
        gang_placed += usize::from(
            plan.assignments
                .iter()
                .any(|a| gang_tasks.contains(a.task.as_str())),
        );
        unplaced += usize::from(!plan.pending_reasons.is_empty());
    }
    eprintln!(
        "of 400: assigned {assigned}, preempted {preempted}, gang preempted {gang_preempted}, \
         gang placed {gang_placed}, unplaced {unplaced}"
    );
    assert!(assigned > 150 && preempted > 15 && gang_placed > 20 && unplaced > 100);
}

// ---------------------------------------------------------------- explain agrees with placement

/// The placement units of a snapshot, each alone: one snapshot per solo task and per gang job,
/// with every worker and running task kept (so explain and placement see the same capacity).
fn alone(s: &Snapshot) -> Vec<Snapshot> {
    let mut gangs: BTreeMap<&str, Vec<PendingTask>> = BTreeMap::new();
    let mut out = Vec::new();
    for t in &s.pending {
        if t.group_by.is_some() {
            gangs.entry(t.job.as_str()).or_default().push(t.clone());
        } else {
            out.push(Snapshot {
                pending: vec![t.clone()],
                ..s.clone()
            });
        }
    }
    for tasks in gangs.into_values() {
        out.push(Snapshot {
            pending: tasks,
            ..s.clone()
        });
    }
    out
}

/// `s` with only the workers `keep` accepts (and the running tasks on them).
fn only_workers(s: &Snapshot, keep: impl Fn(&Worker) -> bool) -> Snapshot {
    let workers: Vec<Worker> = s.workers.iter().filter(|w| keep(w)).cloned().collect();
    let ids: BTreeSet<&str> = workers.iter().map(|w| w.id.as_str()).collect();
    let running = s
        .running
        .iter()
        .filter(|r| ids.contains(r.worker.as_str()))
        .cloned()
        .collect();
    Snapshot {
        workers,
        running,
        ..s.clone()
    }
}

fn verdict_of<'a>(e: &'a Explanation, worker: &str) -> Option<&'a Verdict> {
    e.workers
        .iter()
        .find(|v| v.worker == worker)
        .map(|v| &v.verdict)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Architecture invariant "explain and placement share predicates": where placement puts a
    /// task (without preempting), `explain` said `Fits`; where it puts one by preempting,
    /// `explain` got past health, constraints and the group attribute (only capacity stood in
    /// the way); and a worker `explain` clears takes the task (a solo task on that worker
    /// alone, a gang on that worker's group alone).
    #[test]
    fn explain_fits_exactly_where_placement_may_go(s in arb_snapshot(), policy in small_policy()) {
        for one in alone(&s) {
            let plan = schedule(&one, &policy);
            // A gang that preempts for one member is placed by preemption as a whole.
            let mut preemptors: BTreeSet<&str> = plan.preemptions.iter().map(|p| p.by.as_str()).collect();
            if !preemptors.is_empty() {
                preemptors.extend(one.pending.iter().map(|t| t.task.as_str()));
            }
            let explained: BTreeMap<&str, Explanation> = one
                .pending
                .iter()
                .map(|t| (t.task.as_str(), explain(&one, &policy, &t.task).expect("pending task is explained")))
                .collect();
            for a in &plan.assignments {
                let e = &explained[a.task.as_str()];
                let v = verdict_of(e, &a.worker).expect("every worker has a verdict");
                if preemptors.contains(a.task.as_str()) {
                    prop_assert!(matches!(v, Verdict::Resources { .. } | Verdict::GroupTooSmall { .. }),
                        "{} placed on {} by preemption, but explain said {}", a.task, a.worker, v);
                } else {
                    prop_assert_eq!(v, &Verdict::Fits, "{} placed on {}", a.task, a.worker);
                }
            }
            let head = &one.pending[0];
            let e = &explained[head.task.as_str()];
            let fits: Vec<&str> = e.workers.iter().filter(|v| v.verdict == Verdict::Fits).map(|v| v.worker.as_str()).collect();
            let placed_plainly = plan.assignments.iter().any(|a| !preemptors.contains(a.task.as_str()));
            prop_assert_eq!(!fits.is_empty(), placed_plainly, "fits on {:?}, plan {:?}", fits, plan);
            for w in fits {
                let restricted = match &head.group_by {
                    None => only_workers(&one, |x| x.id == w),
                    Some(key) => {
                        let value = one.workers.iter().find(|x| x.id == w).and_then(|x| x.attributes.get(key)).cloned();
                        only_workers(&one, |x| x.attributes.get(key) == value.as_ref())
                    }
                };
                let plan = schedule(&restricted, &policy);
                prop_assert!(plan.preemptions.is_empty());
                prop_assert_eq!(plan.assignments.len(), one.pending.len(),
                    "explain cleared {} for {}, yet placement on it alone left {:?}", w, head.task, plan.pending_reasons);
                if head.group_by.is_none() {
                    prop_assert_eq!(plan.assignments[0].worker.as_str(), w);
                }
            }
        }
    }
}

/// Guards the explain property's inputs: random cases reach every rule, and gangs that fit.
#[test]
fn explain_generators_reach_every_rule() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut rules: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut gang_fits = 0;
    // Half the cases with build back-pressure at one task, as `small_policy` may pick.
    let tight = Policy {
        max_building_per_worker: 1,
        ..Policy::default()
    };
    for i in 0..300 {
        let s = arb_snapshot()
            .new_tree(&mut runner)
            .map(|t| t.current())
            .unwrap_or_default();
        let policy = if i % 2 == 0 {
            Policy::default()
        } else {
            tight.clone()
        };
        for one in alone(&s) {
            let Some(e) = explain(&one, &policy, &one.pending[0].task) else {
                continue;
            };
            for v in &e.workers {
                *rules.entry(v.verdict.rule()).or_default() += 1;
                gang_fits += usize::from(e.gang.is_some() && v.verdict == Verdict::Fits);
            }
        }
    }
    eprintln!("verdicts over 300 snapshots: {rules:?}; gang fits {gang_fits}");
    for rule in [
        "fits",
        "unhealthy",
        "constraint",
        "group-attribute",
        "resources",
        "backpressure",
        "group-size",
    ] {
        assert!(
            rules.get(rule).copied().unwrap_or(0) > 10,
            "{rule}: {rules:?}"
        );
    }
    assert!(gang_fits > 10, "gang fits {gang_fits}");
}
