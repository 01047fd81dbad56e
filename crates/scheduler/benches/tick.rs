//! One scheduling tick at scale: 10,000 pending tasks over 1,000 workers, or `TICK_SCALE` times
//! that (`TICK_SCALE=10`: 100,000 pending over 10,000 workers).
//!
//! `TICK_QUEUE=<jobs>` instead plans the C1M queue: `<jobs>` jobs of 100 tasks on 5,000 workers.
//!
//! Run with `cargo bench -p iris-scheduler`; prints the median of several runs, from scratch and
//! in the steady state the controller meets tick after tick: the first plan applied, then one
//! running task finished since the last tick, planned from scratch and with the [`Cluster`] of
//! the tick before brought up to date (what the controller does).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use iris_scheduler::*;
use iris_types::{Band, Constraint, Resources};

/// The allocator of the `iris` process, where the controller's tick runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const GIB: i64 = 1 << 30;
const RUNS: usize = 15;

/// Small deterministic generator (xorshift64*), so every run measures the same input.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn band(rng: &mut Rng) -> Band {
    match rng.below(10) {
        0 => Band::System,
        1 | 2 => Band::Production,
        3..=6 => Band::Interactive,
        _ => Band::Batch,
    }
}

fn build(k: usize) -> Snapshot {
    let mut rng = Rng(0x1F2E_3D4C_5B6A_7988);
    let mut workers = Vec::new();
    for i in 0..700 * k {
        let w = Worker::new(format!("cpu-{i:04}"), Resources::cpu_mem(32_000, 128 * GIB))
            .with_attr("device-type", "cpu")
            .with_attr("region", if i % 2 == 0 { "us-east" } else { "us-west" })
            .with_attr("zone", ["a", "b", "c"][i % 3])
            .with_attr("preemptible", if i % 4 == 0 { "true" } else { "false" });
        workers.push(w);
    }
    for i in 0..300 * k {
        let variant = if i % 300 < 200 { "h100" } else { "a100" };
        let mut w = Worker::new(
            format!("gpu-{i:04}"),
            Resources {
                cpu_millicores: 96_000,
                memory_bytes: 1024 * GIB,
                gpu: 8,
                ..Resources::default()
            },
        )
        .with_attr("device-type", "gpu")
        .with_attr("device-variant", variant)
        .with_attr("region", if i % 2 == 0 { "us-east" } else { "us-west" })
        .with_attr("pool", format!("pool-{}", i / 8))
        .with_attr("tpu-worker-id", (i % 8) as i64);
        w.device_variant = variant.to_string();
        w.healthy = i % 97 != 5;
        workers.push(w);
    }

    let mut running = Vec::new();
    for i in 0..500 * k {
        for k in 0..2 {
            running.push(RunningTask {
                task: format!("/bg/cpu{i}/{k}"),
                job: format!("/bg/cpu{i}"),
                worker: format!("cpu-{i:04}"),
                band: if k == 0 {
                    Band::Batch
                } else {
                    Band::Interactive
                },
                resources: Resources::cpu_mem(12_000, 48 * GIB),
                running: rng.chance(90),
                coscheduled: false,
                device_variant: String::new(),
            });
        }
    }
    for i in 0..120 * k {
        running.push(RunningTask {
            task: format!("/bg/gpu{i}/0"),
            job: format!("/bg/gpu{i}"),
            worker: format!("gpu-{i:04}"),
            band: Band::Batch,
            resources: Resources {
                cpu_millicores: 32_000,
                memory_bytes: 256 * GIB,
                gpu: 8,
                ..Resources::default()
            },
            running: true,
            coscheduled: false,
            device_variant: "h100".to_string(),
        });
    }
    // Two running Batch slices on pools 20 and 21 (h100).
    for s in 0..2 {
        for k in 0..8 {
            running.push(RunningTask {
                task: format!("/bg/slice{s}/{k}"),
                job: format!("/bg/slice{s}"),
                worker: format!("gpu-{:04}", 160 + s * 8 + k),
                band: Band::Batch,
                resources: Resources {
                    cpu_millicores: 8_000,
                    memory_bytes: 64 * GIB,
                    gpu: 8,
                    ..Resources::default()
                },
                running: true,
                coscheduled: true,
                device_variant: "h100".to_string(),
            });
        }
    }

    let mut pending = Vec::new();
    let mut push_job = |rng: &mut Rng,
                        j: usize,
                        n: usize,
                        resources: Resources,
                        constraints: Vec<Constraint>,
                        group_by: Option<&str>,
                        variant: &str| {
        let user = format!("user{:02}", rng.below(50));
        let job = format!("/{user}/job{j}");
        let b = band(rng);
        for t in 0..n {
            pending.push(PendingTask {
                task: format!("{job}/{t}"),
                job: job.clone(),
                user: user.clone(),
                band: b,
                resources: resources.clone(),
                constraints: constraints.clone(),
                group_by: group_by.map(str::to_string),
                depth: 1 + (j % 3) as u32,
                root_submitted_ms: (j / 4) as i64,
                submitted_ms: j as i64,
                insertion: t as i64,
                device_variant: variant.to_string(),
            });
        }
    };
    let mut j = 0;
    // 8,000 cpu tasks: 2,000 jobs of 4.
    for _ in 0..2000 * k {
        let cpu = 1000 * (1 + rng.below(8) as i64);
        let mem = GIB * (2 + rng.below(31) as i64);
        let mut cs = Vec::new();
        if rng.chance(30) {
            cs.push(Constraint::equals(
                "region",
                if rng.chance(50) { "us-east" } else { "us-west" },
            ));
        }
        if rng.chance(20) {
            cs.push(Constraint::equals("zone", ["a", "b", "c"][rng.below(3) as usize]).preferred());
        }
        if rng.chance(10) {
            cs.push(Constraint::equals("preemptible", "false"));
        }
        push_job(&mut rng, j, 4, Resources::cpu_mem(cpu, mem), cs, None, "");
        j += 1;
    }
    // 1,200 gpu tasks: 300 jobs of 4.
    for _ in 0..300 * k {
        let variant = if rng.chance(70) { "h100" } else { "a100" };
        let res = Resources {
            cpu_millicores: 8_000,
            memory_bytes: 64 * GIB,
            gpu: [1, 2, 4, 8][rng.below(4) as usize],
            ..Resources::default()
        };
        let cs = vec![Constraint::equals("device-variant", variant)];
        push_job(&mut rng, j, 4, res, cs, None, variant);
        j += 1;
    }
    // 800 gang tasks: 100 coscheduled jobs of 8 hosts.
    for _ in 0..100 * k {
        let variant = if rng.chance(80) { "h100" } else { "a100" };
        let res = Resources {
            cpu_millicores: 8_000,
            memory_bytes: 64 * GIB,
            gpu: 8,
            ..Resources::default()
        };
        let cs = vec![Constraint::equals("device-variant", variant)];
        push_job(&mut rng, j, 8, res, cs, Some("pool"), variant);
        j += 1;
    }
    let user_spend: BTreeMap<String, i64> = (0..50)
        .map(|u| (format!("user{u:02}"), rng.below(2000) as i64))
        .collect();
    Snapshot {
        workers,
        running,
        pending,
        user_spend,
    }
}

/// The snapshot of the next tick after `plan` was applied and every placed task started:
/// assignments run, preempted tasks are gone, and then one running task finished (returned
/// with it).
fn applied(snapshot: &Snapshot, plan: &Plan) -> (Snapshot, Option<RunningTask>) {
    let mut next = snapshot.clone();
    let placed: BTreeMap<&str, &str> = plan
        .assignments
        .iter()
        .map(|a| (a.task.as_str(), a.worker.as_str()))
        .collect();
    let victims: std::collections::BTreeSet<&str> =
        plan.preemptions.iter().map(|p| p.victim.as_str()).collect();
    next.running.retain(|r| !victims.contains(r.task.as_str()));
    let (started, waiting): (Vec<PendingTask>, Vec<PendingTask>) = next
        .pending
        .into_iter()
        .partition(|p| placed.contains_key(p.task.as_str()));
    next.pending = waiting;
    for p in started {
        next.running.push(RunningTask {
            worker: placed[p.task.as_str()].to_string(),
            band: p.band,
            resources: p.resources,
            running: true,
            coscheduled: p.group_by.is_some(),
            device_variant: p.device_variant,
            task: p.task,
            job: p.job,
        });
    }
    // One solo task finished since the last tick: its worker has room again.
    let finished = next
        .running
        .iter()
        .position(|r| !r.coscheduled)
        .map(|i| next.running.remove(i));
    (next, finished)
}

/// A digest of everything a plan decides, so that runs before and after a change can show
/// they plan alike.
fn digest(plan: &Plan) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for a in &plan.assignments {
        (&a.task, &a.worker).hash(&mut h);
    }
    for p in &plan.preemptions {
        (&p.victim, &p.worker, &p.by).hash(&mut h);
    }
    plan.pending_reasons.hash(&mut h);
    h.finish()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What `plan` decided over `snapshot`, with its digest.
fn outcome(snapshot: &Snapshot, plan: &Plan) -> String {
    format!(
        "{} running, {} pending -> {} assignments, {} preemptions, {} reasons, plan {:016x}",
        snapshot.running.len(),
        snapshot.pending.len(),
        plan.assignments.len(),
        plan.preemptions.len(),
        plan.pending_reasons.len(),
        digest(plan)
    )
}

fn print_times(what: &str, (med, min, max): (Duration, Duration, Duration)) {
    println!(
        "{what}: median {:.2} ms, min {:.2} ms, max {:.2} ms over the runs",
        ms(med),
        ms(min),
        ms(max)
    );
}

/// `TICK_RUNS`, default 15.
fn runs() -> usize {
    std::env::var("TICK_RUNS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(RUNS)
}

/// Median, min and max of `times` (not empty).
fn spread(mut times: Vec<Duration>) -> (Duration, Duration, Duration) {
    times.sort();
    let n = times.len();
    (times[n / 2], times[0], times[n - 1])
}

/// Median, min and max of `TICK_RUNS` timed calls of `f`.
fn time<T>(mut f: impl FnMut() -> T) -> (Duration, Duration, Duration) {
    spread(
        (0..runs())
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(f());
                start.elapsed()
            })
            .collect(),
    )
}

/// `TICK_QUEUE=<jobs>`: the C1M queue (issue 17), `<jobs>` jobs of 100 solo tasks (0.1 cpu,
/// 1 GiB) pending at once over 5,000 idle workers of 64 cpus, planned from scratch. The per-job
/// cap (4 a cycle) lets 4 tasks of each job in; the plan's cost should follow that, not the queue.
fn queue(jobs: usize) {
    let workers: Vec<Worker> = (0..5_000)
        .map(|i| Worker::new(format!("w{i:05}"), Resources::cpu_mem(64_000, 512 * GIB)))
        .collect();
    let mut pending = Vec::with_capacity(jobs * 100);
    for j in 0..jobs {
        let job = format!("/bench/c1m-{j:06}");
        for t in 0..100 {
            pending.push(PendingTask {
                task: format!("{job}/{t}"),
                job: job.clone(),
                user: "bench".into(),
                band: Band::Interactive,
                resources: Resources::cpu_mem(100, GIB),
                constraints: Vec::new(),
                group_by: None,
                depth: 1,
                root_submitted_ms: j as i64,
                submitted_ms: j as i64,
                insertion: (j * 100 + t) as i64,
                device_variant: String::new(),
            });
        }
    }
    let snapshot = Snapshot {
        workers,
        running: Vec::new(),
        pending,
        user_spend: BTreeMap::new(),
    };
    let policy = Policy::default();
    let plan = schedule(&snapshot, &policy);
    println!(
        "queue: {} workers, {} pending in {jobs} jobs -> {} assignments, {} per-task reasons",
        snapshot.workers.len(),
        snapshot.pending.len(),
        plan.assignments.len(),
        plan.pending_reasons.len()
    );
    print_times(
        "schedule the queue from scratch",
        time(|| schedule(&snapshot, &policy)),
    );
}

fn main() {
    if let Ok(v) = std::env::var("TICK_QUEUE") {
        match v.parse::<usize>() {
            Ok(jobs) if jobs > 0 => return queue(jobs),
            _ => {
                eprintln!("TICK_QUEUE must be a positive number of jobs, got '{v}'");
                std::process::exit(2);
            }
        }
    }
    let scale = match std::env::var("TICK_SCALE") {
        Ok(v) => match v.parse::<usize>() {
            Ok(k) if k > 0 => k,
            _ => {
                eprintln!("TICK_SCALE must be a positive integer, got '{v}'");
                std::process::exit(2);
            }
        },
        Err(_) => 1,
    };
    let snapshot = build(scale);
    let policy = Policy::default();
    let warm = schedule(&snapshot, &policy);
    assert_eq!(
        schedule(&snapshot, &policy),
        warm,
        "schedule is not deterministic"
    );
    if let Ok(path) = std::env::var("TICK_DUMP") {
        // The first plan, one decision per line, to diff runs before and after a change.
        let mut out = String::new();
        for a in &warm.assignments {
            out.push_str(&format!("assign {} {}\n", a.task, a.worker));
        }
        for p in &warm.preemptions {
            out.push_str(&format!("preempt {} {} {}\n", p.victim, p.worker, p.by));
        }
        for (task, reason) in &warm.pending_reasons {
            out.push_str(&format!("reason {task} {reason}\n"));
        }
        if let Err(e) = std::fs::write(&path, out) {
            eprintln!("cannot write TICK_DUMP file {path}: {e}");
            std::process::exit(2);
        }
    }
    println!(
        "schedule: {} workers, {}",
        snapshot.workers.len(),
        outcome(&snapshot, &warm)
    );
    // `TICK_KEPT_ONLY=1` times only the kept-cluster tick (for profiling it).
    let kept_only = std::env::var_os("TICK_KEPT_ONLY").is_some();
    if !kept_only {
        print_times(
            "schedule from scratch",
            time(|| schedule(&snapshot, &policy)),
        );
    }
    // Apply plans until the cluster takes no more (what a loaded cluster looks like tick after
    // tick), then one task finishes.
    let (mut steady, mut finished) = applied(&snapshot, &warm);
    let mut next = schedule(&steady, &policy);
    let mut ticks = 1;
    while next.assignments.len() > 1 && ticks < 50 {
        (steady, finished) = applied(&steady, &next);
        next = schedule(&steady, &policy);
        ticks += 1;
    }
    println!("steady after {ticks} applied plans");
    println!("steady: {}", outcome(&steady, &next));
    if !kept_only {
        print_times(
            "schedule after one completion, from scratch",
            time(|| schedule(&steady, &policy)),
        );
    }
    // What a controller keeping a `Cluster` across ticks pays: the completion applied to the
    // indexes of the tick before, then the plan. Each run puts the task back afterwards, untimed.
    if let Some(done) = finished {
        let mut before = steady.running.clone();
        before.push(done.clone());
        let mut cluster = Cluster::new(steady.workers.clone(), before);
        let kept = cluster.clone();
        cluster.update([done.task.as_str()], Vec::new());
        let plan = cluster.plan(&steady.pending, &steady.user_spend, &policy);
        assert_eq!(
            plan, next,
            "the kept cluster plans differently from scratch"
        );
        cluster = kept;
        let runs = runs();
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let start = Instant::now();
            cluster.update([done.task.as_str()], Vec::new());
            std::hint::black_box(cluster.plan(&steady.pending, &steady.user_spend, &policy));
            times.push(start.elapsed());
            cluster.update([], vec![done.clone()]);
        }
        print_times(
            "schedule after one completion, cluster kept across ticks",
            spread(times),
        );
    }
    // `explain` (ExplainTask) over the same snapshot, for a gang member and a solo task.
    for task in [
        snapshot.pending.iter().find(|t| t.group_by.is_some()),
        snapshot.pending.iter().find(|t| t.group_by.is_none()),
    ]
    .into_iter()
    .flatten()
    {
        let (med, _, max) = time(|| {
            let e = explain(&snapshot, &policy, &task.task);
            assert!(e.is_some_and(|e| e.workers.len() == snapshot.workers.len()));
        });
        println!(
            "explain {} ({}): median {:.2} ms, max {:.2} ms over the runs",
            task.task,
            if task.group_by.is_some() {
                "gang"
            } else {
                "solo"
            },
            ms(med),
            ms(max)
        );
    }
}
