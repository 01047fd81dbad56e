//! One scheduling tick at scale: 10,000 pending tasks over 1,000 workers.
//!
//! Run with `cargo bench -p iris-scheduler`; prints the median of several runs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use iris_scheduler::*;
use iris_types::{Band, Constraint, Resources};

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

fn build() -> Snapshot {
    let mut rng = Rng(0x1F2E_3D4C_5B6A_7988);
    let mut workers = Vec::new();
    for i in 0..700 {
        let w = Worker::new(format!("cpu-{i:04}"), Resources::cpu_mem(32_000, 128 * GIB))
            .with_attr("device-type", "cpu")
            .with_attr("region", if i % 2 == 0 { "us-east" } else { "us-west" })
            .with_attr("zone", ["a", "b", "c"][i % 3])
            .with_attr("preemptible", if i % 4 == 0 { "true" } else { "false" });
        workers.push(w);
    }
    for i in 0..300 {
        let variant = if i < 200 { "h100" } else { "a100" };
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
    for i in 0..500 {
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
    for i in 0..120 {
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
    for _ in 0..2000 {
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
    for _ in 0..300 {
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
    for _ in 0..100 {
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

fn main() {
    let snapshot = build();
    let policy = Policy::default();
    let warm = schedule(&snapshot, &policy);
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            let plan = schedule(&snapshot, &policy);
            let took = start.elapsed();
            assert_eq!(plan, warm, "schedule is not deterministic");
            took
        })
        .collect();
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "schedule: {} workers, {} running, {} pending -> {} assignments, {} preemptions, {} reasons",
        snapshot.workers.len(),
        snapshot.running.len(),
        snapshot.pending.len(),
        warm.assignments.len(),
        warm.preemptions.len(),
        warm.pending_reasons.len()
    );
    println!(
        "schedule: median {:.2} ms, min {:.2} ms, max {:.2} ms over {RUNS} runs",
        ms(times[RUNS / 2]),
        ms(times[0]),
        ms(times[RUNS - 1])
    );
    // `explain` (ExplainTask) over the same snapshot, for a gang member and a solo task.
    for task in [
        snapshot.pending.iter().find(|t| t.group_by.is_some()),
        snapshot.pending.iter().find(|t| t.group_by.is_none()),
    ]
    .into_iter()
    .flatten()
    {
        let mut times: Vec<Duration> = (0..RUNS)
            .map(|_| {
                let start = Instant::now();
                let e = explain(&snapshot, &policy, &task.task);
                let took = start.elapsed();
                assert!(e.is_some_and(|e| e.workers.len() == snapshot.workers.len()));
                took
            })
            .collect();
        times.sort();
        println!(
            "explain {} ({}): median {:.2} ms, max {:.2} ms over {RUNS} runs",
            task.task,
            if task.group_by.is_some() {
                "gang"
            } else {
                "solo"
            },
            ms(times[RUNS / 2]),
            ms(times[RUNS - 1])
        );
    }
}
