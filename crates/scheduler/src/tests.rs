//! Example-based tests of `schedule`, one rule each.

use std::collections::BTreeMap;

use crate::testutil::*;
use crate::*;
use iris_types::{Band, Constraint, ConstraintOp};

fn run(s: &Snapshot) -> Plan {
    schedule(s, &Policy::default())
}

// ---------------------------------------------------------------- fit and capacity

#[test]
fn places_first_fit_by_worker_id() {
    let s = snap(
        vec![worker("w-b").build(), worker("w-a").build()],
        vec![],
        vec![pending("/u/j/0").build()],
    );
    let plan = run(&s);
    assert_eq!(placed(&plan), [("/u/j/0", "w-a")]);
    assert!(plan.pending_reasons.is_empty());
    assert!(plan.preemptions.is_empty());
}

#[test]
fn capacity_counts_running_tasks_and_earlier_assignments() {
    // w-a: 8 cores, 4 held by a running task; each task asks for 3 cores.
    let s = snap(
        vec![worker("w-a").build(), worker("w-b").build()],
        vec![running("/x/r/0", "w-a").cpu(4000).build()],
        vec![
            pending("/u/j/0").cpu(3000).build(),
            pending("/u/j/1").cpu(3000).build(),
            pending("/u/j/2").cpu(3000).build(),
        ],
    );
    assert_eq!(
        placed(&run(&s)),
        [("/u/j/0", "w-a"), ("/u/j/1", "w-b"), ("/u/j/2", "w-b")]
    );
}

#[test]
fn only_requested_dimensions_are_checked_and_disk_never() {
    let mut no_mem = pending("/u/nomem/0").mem_gib(0).build();
    no_mem.resources.disk_bytes = 1 << 50;
    let s = snap(
        // A worker with no memory left at all and no disk.
        vec![worker("w").mem_gib(0).build()],
        vec![],
        vec![no_mem, pending("/u/mem/0").build()],
    );
    let plan = run(&s);
    assert_eq!(placed(&plan), [("/u/nomem/0", "w")]);
    assert_eq!(
        reason(&plan, "/u/mem/0"),
        "Waiting for resources: no healthy worker has 1 GiB memory free (none has any memory)"
    );
}

#[test]
fn gpus_and_tpus_must_fit() {
    let s = snap(
        vec![worker("cpu").build(), worker("gpu").gpu(8, "h100").build()],
        vec![running("/x/r/0", "gpu").gpu(4, "h100").build()],
        vec![
            pending("/u/big/0").gpu(8, "h100").build(),
            pending("/u/small/0").gpu(2, "h100").build(),
            pending("/u/tpu/0").build(),
        ],
    );
    let mut tpu = s.pending[2].clone();
    tpu.resources.tpu = 4;
    let s = Snapshot {
        pending: vec![s.pending[0].clone(), s.pending[1].clone(), tpu],
        ..s
    };
    let plan = run(&s);
    assert_eq!(placed(&plan), [("/u/small/0", "gpu")]);
    // Reasons describe the state at the end of placement.
    assert_eq!(
        reason(&plan, "/u/big/0"),
        "Waiting for resources: no healthy worker has 8 gpu free (best: gpu 2 free)"
    );
    assert_eq!(
        reason(&plan, "/u/tpu/0"),
        "Waiting for resources: no healthy worker has 4 tpu free (none has any tpu)"
    );
}

#[test]
fn unhealthy_workers_get_nothing() {
    let s = snap(
        vec![worker("sick").unhealthy().build()],
        vec![],
        vec![pending("/u/j/0").build()],
    );
    let plan = run(&s);
    assert!(plan.assignments.is_empty());
    assert_eq!(
        reason(&plan, "/u/j/0"),
        "Waiting for workers: no healthy worker is registered"
    );
}

#[test]
fn at_most_four_new_assignments_per_worker_per_cycle() {
    let pending: Vec<_> = (0..6)
        .map(|i| pending(&format!("/u{i}/j/0")).cpu(100).build())
        .collect();
    let s = snap(vec![worker("w").build()], vec![], pending);
    let plan = run(&s);
    assert_eq!(plan.assignments.len(), 4);
    let left: Vec<&String> = plan.pending_reasons.keys().collect();
    assert_eq!(left.len(), 2);
    assert_eq!(
        plan.pending_reasons.values().next().map(String::as_str),
        Some(
            "Waiting for worker capacity: 1 worker(s) with room reached the limit of 4 new \
             assignments per cycle"
        )
    );
}

#[test]
fn build_back_pressure_counts_assigned_and_building_tasks() {
    // 6 tasks already ASSIGNED/BUILDING and one RUNNING: 2 more may be assigned.
    let mut running_tasks: Vec<_> = (0..6)
        .map(|i| {
            running(&format!("/x/b/{i}"), "w")
                .cpu(10)
                .building()
                .build()
        })
        .collect();
    running_tasks.push(running("/x/r/0", "w").cpu(10).build());
    let pending: Vec<_> = (0..4)
        .map(|i| pending(&format!("/u{i}/j/0")).cpu(10).build())
        .collect();
    let s = snap(vec![worker("w").build()], running_tasks, pending);
    let plan = run(&s);
    assert_eq!(plan.assignments.len(), 2);
    assert_eq!(
        reason(&plan, "/u3/j/0"),
        "Waiting for worker capacity: 1 worker(s) with room already have 8 tasks assigned or building"
    );
}

#[test]
fn a_pooled_worker_has_no_build_back_pressure_and_its_own_cycle_limit() {
    // Kueue queues a pooled backend's pods: 50 ASSIGNED/BUILDING attempts do not close it, and
    // it takes past the per-worker limit of 4 (up to the pool's) in one cycle.
    let building: Vec<_> = (0..50)
        .map(|i| {
            running(&format!("/x/b/{i}"), "k8s")
                .cpu(10)
                .building()
                .build()
        })
        .collect();
    let pending: Vec<_> = (0..12)
        .map(|i| pending(&format!("/u{i}/j/0")).cpu(10).build())
        .collect();
    let pool = worker("k8s")
        .cpu(1_000_000)
        .mem_gib(1 << 20)
        .pooled()
        .build();
    let s = snap(vec![pool.clone()], building.clone(), pending.clone());
    let p = run(&s);
    assert_eq!(p.assignments.len(), 12, "{:?}", p.pending_reasons);
    let tight = Policy {
        max_assignments_per_pool_per_cycle: 5,
        ..Policy::default()
    };
    let plan = schedule(&snap(vec![pool], building, pending), &tight);
    assert_eq!(plan.assignments.len(), 5);
    let left = (0..12)
        .map(|i| format!("/u{i}/j/0"))
        .find(|t| !plan.assignments.iter().any(|a| a.task == *t))
        .expect("an unplaced task");
    assert_eq!(
        reason(&plan, &left),
        "Waiting for worker capacity: 1 worker(s) with room reached the limit of 5 new \
         assignments per cycle"
    );
}

// ---------------------------------------------------------------- per-job rules

#[test]
fn per_job_cap_limits_tasks_considered() {
    let pending: Vec<_> = (0..6)
        .map(|i| pending(&format!("/u/j/{i}")).cpu(100).build())
        .collect();
    let s = snap(
        vec![worker("a").build(), worker("b").build()],
        vec![],
        pending,
    );
    let plan = run(&s);
    assert_eq!(
        placed(&plan),
        [
            ("/u/j/0", "a"),
            ("/u/j/1", "a"),
            ("/u/j/2", "a"),
            ("/u/j/3", "a")
        ]
    );
    assert_eq!(
        reason(&plan, "/u/j/4"),
        "Per-job cycle cap reached: at most 4 tasks of job /u/j are considered per cycle"
    );
    assert_eq!(reason(&plan, "/u/j/5"), reason(&plan, "/u/j/4"));
    // One reason for the job, not one per held-back task.
    assert_eq!(plan.capped_jobs.len(), 1);
    assert!(plan.pending_reasons.is_empty());
}

/// The cap is a gate before ordering, as in the reference (`apply_scheduling_gates`): a job's
/// held-back tasks take no turn in the round-robin across users. Here u1's second job (`b`) takes
/// its turn right after the last task of `a` that entered, ahead of u2's second job, although
/// u1's queue holds six held-back tasks of `a` before it.
#[test]
fn held_back_tasks_take_no_turn_in_the_round_robin() {
    let mut pending = Vec::new();
    for i in 0..10 {
        pending.push(user_task(&format!("/u1/a/{i}"), "u1", 1, i));
    }
    pending.push(user_task("/u1/b/0", "u1", 2, 0));
    for i in 0..4 {
        pending.push(user_task(&format!("/u2/c/{i}"), "u2", 1, i));
    }
    for i in 0..20 {
        pending.push(user_task(&format!("/u2/d/{i}"), "u2", 2, i));
    }
    // Room for nine tasks (one per worker): a0-3 and c0-3 interleave, then b0 (not d0) is the ninth.
    let workers: Vec<_> = (0..9)
        .map(|i| worker(&format!("w{i}")).cpu(1_000).build())
        .collect();
    let s = snap(workers, vec![], pending);
    let plan = run(&s);
    let placed: Vec<&str> = plan.assignments.iter().map(|a| a.task.as_str()).collect();
    assert_eq!(placed.len(), 9);
    assert!(placed.contains(&"/u1/b/0"), "{placed:?}");
    assert!(!placed.contains(&"/u2/d/0"), "{placed:?}");
    assert!(reason(&plan, "/u2/d/0").starts_with("Waiting for resources"));
    assert!(reason(&plan, "/u2/d/9").starts_with("Per-job cycle cap reached"));
    assert!(reason(&plan, "/u1/a/9").starts_with("Per-job cycle cap reached"));
}

fn user_task(task: &str, user: &str, submitted_ms: i64, insertion: i64) -> PendingTask {
    let mut t = pending(task).cpu(1_000).build();
    t.user = user.to_string();
    t.submitted_ms = submitted_ms;
    t.root_submitted_ms = submitted_ms;
    t.insertion = insertion;
    t
}

#[test]
fn a_job_that_fails_skips_its_remaining_tasks_but_not_other_jobs() {
    let s = snap(
        vec![worker("w").cpu(8000).build()],
        vec![running("/x/r/0", "w")
            .band(Band::Interactive)
            .cpu(5000)
            .build()],
        vec![
            pending("/a/big/0").cpu(4000).build(),
            pending("/a/big/1").cpu(1000).build(), // would fit, but the job is blocked
            pending("/a/big/2").cpu(9000).build(),
            pending("/b/small/0").cpu(1000).build(),
        ],
    );
    let plan = run(&s);
    assert_eq!(placed(&plan), [("/b/small/0", "w")]);
    assert_eq!(
        reason(&plan, "/a/big/0"),
        "Waiting for resources: no healthy worker has 4000m cpu free (best: w 2000m free)"
    );
    assert_eq!(
        reason(&plan, "/a/big/1"),
        "Deferred: an earlier task of job /a/big found no worker this cycle"
    );
    assert_eq!(
        reason(&plan, "/a/big/2"),
        "Waiting for resources: no healthy worker has 9000m cpu free (largest has 8000m in total)"
    );
}

// ---------------------------------------------------------------- ordering

#[test]
fn higher_bands_are_placed_first() {
    let s = snap(
        vec![worker("w").cpu(1000).build()],
        vec![],
        vec![
            pending("/a/batch/0").band(Band::Batch).build(),
            pending("/a/sys/0").band(Band::System).build(),
        ],
    );
    let plan = run(&s);
    assert_eq!(placed(&plan), [("/a/sys/0", "w")]);
    assert!(plan.pending_reasons.contains_key("/a/batch/0"));
}

#[test]
fn users_with_less_spend_go_first() {
    let s = Snapshot {
        user_spend: BTreeMap::from([("alice".to_string(), 900), ("bob".to_string(), 5)]),
        ..snap(
            vec![worker("w").cpu(1000).build()],
            vec![],
            vec![pending("/alice/j/0").build(), pending("/bob/j/0").build()],
        )
    };
    assert_eq!(placed(&run(&s)), [("/bob/j/0", "w")]);
}

// ---------------------------------------------------------------- constraints

#[test]
fn hard_constraints_filter_workers() {
    let s = snap(
        vec![
            worker("a").attr("region", "us-east").build(),
            worker("b").attr("region", "US-West").build(),
        ],
        vec![],
        vec![
            pending("/u/west/0")
                .constraint(Constraint::equals("region", "us-west"))
                .build(),
            pending("/u/mars/0")
                .constraint(Constraint::equals("region", "mars"))
                .build(),
        ],
    );
    let plan = run(&s);
    assert_eq!(placed(&plan), [("/u/west/0", "b")]);
    assert_eq!(
        reason(&plan, "/u/mars/0"),
        "No worker matches constraint region EQ mars"
    );
}

#[test]
fn constraints_that_only_conflict_together_are_listed() {
    let s = snap(
        vec![
            worker("a").attr("region", "us-east").build(),
            worker("b").attr("zone", "b").build(),
        ],
        vec![],
        vec![pending("/u/j/0")
            .constraint(Constraint::equals("region", "us-east"))
            .constraint(Constraint::equals("zone", "b"))
            .build()],
    );
    assert_eq!(
        reason(&run(&s), "/u/j/0"),
        "No worker matches all constraints together: region EQ us-east AND zone EQ b"
    );
}

#[test]
fn constraint_errors_count_as_no_match() {
    let s = snap(
        vec![worker("a").attr("zone", "a").build()],
        vec![],
        vec![pending("/u/j/0")
            .constraint(Constraint::new("zone", ConstraintOp::Gt, Some(1.into())))
            .build()],
    );
    let plan = run(&s);
    assert!(plan.assignments.is_empty());
    assert_eq!(
        reason(&plan, "/u/j/0"),
        "No worker matches constraint zone GT 1"
    );
}

#[test]
fn preferred_constraints_rank_workers() {
    let s = snap(
        vec![
            worker("a").attr("zone", "x").build(),
            worker("b")
                .attr("zone", "y")
                .attr("preemptible", "true")
                .build(),
            worker("c").attr("zone", "y").build(),
        ],
        vec![],
        vec![
            pending("/u/one/0")
                .constraint(Constraint::equals("zone", "y").preferred())
                .build(),
            pending("/u/two/0")
                .constraint(Constraint::equals("zone", "y").preferred())
                .constraint(Constraint::equals("preemptible", "true").preferred())
                .build(),
            // Nobody satisfies it: still placed, ties broken by id.
            pending("/u/three/0")
                .constraint(Constraint::equals("zone", "nowhere").preferred())
                .build(),
        ],
    );
    assert_eq!(
        placed(&run(&s)),
        [("/u/one/0", "b"), ("/u/three/0", "a"), ("/u/two/0", "b")]
    );
}

#[test]
fn constraint_shortage_reason_mentions_constraints() {
    let s = snap(
        vec![
            worker("a").attr("region", "west").cpu(2000).build(),
            worker("b").cpu(16000).build(),
        ],
        vec![],
        vec![pending("/u/j/0")
            .cpu(4000)
            .constraint(Constraint::equals("region", "west"))
            .build()],
    );
    assert_eq!(
        reason(&run(&s), "/u/j/0"),
        "Waiting for resources: no healthy worker matching its constraints has 4000m cpu free \
         (largest has 2000m in total)"
    );
}

#[test]
fn resources_that_only_fit_apart_are_explained() {
    let s = snap(
        vec![
            worker("a").cpu(8000).mem_gib(1).build(),
            worker("b").cpu(1000).mem_gib(64).build(),
        ],
        vec![],
        vec![pending("/u/j/0").cpu(4000).mem_gib(16).build()],
    );
    assert_eq!(
        reason(&run(&s), "/u/j/0"),
        "Waiting for resources: no single healthy worker has cpu=4000m, memory=16 GiB free at \
         the same time"
    );
}

// ---------------------------------------------------------------- coscheduling

fn slice_hosts(name: &str, n: usize) -> Vec<Worker> {
    // Ids deliberately out of tpu-worker-id order.
    (0..n)
        .map(|i| {
            worker(&format!("{name}-{}", n - 1 - i))
                .attr("tpu-name", name)
                .attr("tpu-worker-id", i as i64)
                .build()
        })
        .collect()
}

fn gang(job: &str, n: usize) -> Vec<PendingTask> {
    (0..n)
        .map(|i| {
            pending(&format!("{job}/{i}"))
                .cpu(4000)
                .group_by("tpu-name")
                .build()
        })
        .collect()
}

#[test]
fn gang_zips_tasks_onto_hosts_by_tpu_worker_id() {
    let mut workers = slice_hosts("s1", 3);
    workers.push(worker("lonely").attr("tpu-worker-id", 0).build()); // no tpu-name
    let s = snap(workers, vec![], gang("/u/g", 3));
    let plan = run(&s);
    assert_eq!(
        placed(&plan),
        [("/u/g/0", "s1-2"), ("/u/g/1", "s1-1"), ("/u/g/2", "s1-0")]
    );
}

#[test]
fn gang_hosts_sort_numerically_with_missing_last() {
    let workers = vec![
        worker("a").attr("tpu-name", "s").build(),
        worker("b")
            .attr("tpu-name", "s")
            .attr("tpu-worker-id", "10")
            .build(),
        worker("c")
            .attr("tpu-name", "s")
            .attr("tpu-worker-id", 9)
            .build(),
    ];
    let s = snap(workers, vec![], gang("/u/g", 3));
    assert_eq!(
        placed(&run(&s)),
        [("/u/g/0", "c"), ("/u/g/1", "b"), ("/u/g/2", "a")]
    );
}

#[test]
fn gang_is_all_or_nothing_and_reason_names_it() {
    let mut workers = slice_hosts("a", 3);
    workers.extend(slice_hosts("b", 2));
    let s = snap(workers, vec![], gang("/u/g", 4));
    let plan = run(&s);
    assert!(plan.assignments.is_empty());
    let expect = "Coscheduled job /u/g needs 4 workers sharing one value of 'tpu-name' with \
                  cpu=4000m, memory=1 GiB each; best group 'a' has 3 with room now";
    for i in 0..4 {
        assert_eq!(reason(&plan, &format!("/u/g/{i}")), expect);
    }
}

#[test]
fn gangs_of_one_shape_fail_alike_and_name_the_room_left_after_placement() {
    // The second gang is refused by the memo of the first; a solo task placed after both takes
    // a host of 'a', and both reasons count the room at the end of placement.
    let mut workers = slice_hosts("a", 3);
    workers.extend(slice_hosts("b", 2));
    let mut pending = gang("/u/g1", 4);
    pending.extend(gang("/u/g2", 4));
    pending.push(pending_task("/u/s/0", 8000));
    let plan = run(&snap(workers, vec![], pending));
    assert_eq!(placed(&plan), [("/u/s/0", "a-0")]);
    for job in ["/u/g1", "/u/g2"] {
        let expect = format!(
            "Coscheduled job {job} needs 4 workers sharing one value of 'tpu-name' with \
             cpu=4000m, memory=1 GiB each; best group 'a' has 2 with room now"
        );
        for i in 0..4 {
            assert_eq!(reason(&plan, &format!("{job}/{i}")), expect);
        }
    }
}

fn pending_task(task: &str, cpu: i64) -> PendingTask {
    pending(task).cpu(cpu).build()
}

#[test]
fn gang_skips_groups_without_room() {
    let mut workers = slice_hosts("a", 2);
    workers.extend(slice_hosts("b", 2));
    let s = snap(
        workers,
        vec![running("/x/r/0", "a-0").cpu(6000).build()],
        gang("/u/g", 2),
    );
    assert_eq!(placed(&run(&s)), [("/u/g/0", "b-1"), ("/u/g/1", "b-0")]);
}

#[test]
fn gang_groups_are_tried_by_soft_score_then_value() {
    let mut workers = slice_hosts("a", 2);
    workers.extend(slice_hosts("b", 2).into_iter().map(|mut w| {
        w.attributes.insert("zone".into(), "z".into());
        w
    }));
    let mut tasks = gang("/u/g", 2);
    for t in &mut tasks {
        t.constraints
            .push(Constraint::equals("zone", "z").preferred());
    }
    let s = snap(workers.clone(), vec![], tasks);
    assert_eq!(placed(&run(&s)), [("/u/g/0", "b-1"), ("/u/g/1", "b-0")]);
    // Without preferences, group 'a' wins on value.
    let s = snap(workers, vec![], gang("/u/g", 2));
    assert_eq!(placed(&run(&s)), [("/u/g/0", "a-1"), ("/u/g/1", "a-0")]);
}

#[test]
fn gang_ignores_per_job_cap() {
    let s = snap(slice_hosts("s", 6), vec![], gang("/u/g", 6));
    assert_eq!(run(&s).assignments.len(), 6);
}

#[test]
fn gangs_go_before_solo_tasks_of_their_band_but_after_higher_bands() {
    let workers = slice_hosts("s", 2);
    let mut pending = vec![
        // Same band, earlier in base order: still after the gang.
        pending("/a/solo/0").cpu(8000).submitted(0).build(),
        pending("/a/sys/0").band(Band::System).cpu(8000).build(),
    ];
    pending.extend(gang("/b/g", 1).into_iter().map(|mut t| {
        t.submitted_ms = 100;
        t
    }));
    let s = snap(workers, vec![], pending);
    let plan = run(&s);
    assert_eq!(placed(&plan), [("/a/sys/0", "s-0"), ("/b/g/0", "s-1")]);
    assert!(plan.pending_reasons.contains_key("/a/solo/0"));
}

#[test]
fn gang_without_any_group_says_so() {
    let s = snap(vec![worker("w").build()], vec![], gang("/u/g", 1));
    assert_eq!(
        reason(&run(&s), "/u/g/0"),
        "Coscheduled job /u/g needs 1 workers sharing one value of 'tpu-name' with cpu=4000m, \
         memory=1 GiB each; no eligible worker has attribute 'tpu-name'"
    );
}

// ---------------------------------------------------------------- solo preemption

#[test]
fn higher_band_preempts_and_takes_the_freed_worker() {
    let s = snap(
        vec![worker("w").build()],
        vec![running("/x/batch/0", "w").cpu(8000).build()],
        vec![pending("/u/prod/0")
            .band(Band::Production)
            .cpu(4000)
            .build()],
    );
    let plan = run(&s);
    assert_eq!(evicted(&plan), [("/x/batch/0", "w", "/u/prod/0")]);
    assert_eq!(placed(&plan), [("/u/prod/0", "w")]);
    assert!(plan.pending_reasons.is_empty());
}

#[test]
fn never_within_a_band_and_batch_never_preempts() {
    for (victim, preemptor) in [
        (Band::Interactive, Band::Interactive),
        (Band::Batch, Band::Batch),
        (Band::Production, Band::Interactive),
    ] {
        let s = snap(
            vec![worker("w").build()],
            vec![running("/x/r/0", "w").band(victim).cpu(8000).build()],
            vec![pending("/u/p/0").band(preemptor).cpu(4000).build()],
        );
        let plan = run(&s);
        assert!(plan.preemptions.is_empty(), "{victim} vs {preemptor}");
        assert!(plan.assignments.is_empty());
    }
}

#[test]
fn victims_lowest_band_first_then_cheapest() {
    let s = snap(
        vec![
            worker("a").build(),
            worker("b").build(),
            worker("c").build(),
        ],
        vec![
            running("/x/int/0", "a")
                .band(Band::Interactive)
                .cpu(8000)
                .build(),
            running("/x/big/0", "b").cpu(8000).build(),
            running("/x/small/0", "c").cpu(6000).build(),
            running("/x/small/1", "c").cpu(2000).build(),
        ],
        vec![pending("/u/sys/0").band(Band::System).cpu(2000).build()],
    );
    let plan = run(&s);
    // The cheapest Batch task whose eviction suffices.
    assert_eq!(evicted(&plan), [("/x/small/1", "c", "/u/sys/0")]);
    assert_eq!(placed(&plan), [("/u/sys/0", "c")]);
}

#[test]
fn freeing_the_victim_must_be_enough() {
    let s = snap(
        vec![worker("a").build(), worker("b").build()],
        vec![
            running("/x/tiny/0", "a").cpu(1000).build(),
            running("/x/prod/0", "a")
                .band(Band::Production)
                .cpu(7000)
                .build(),
            running("/x/big/0", "b").cpu(8000).build(),
        ],
        vec![pending("/u/p/0").band(Band::Production).cpu(4000).build()],
    );
    let plan = run(&s);
    assert_eq!(evicted(&plan), [("/x/big/0", "b", "/u/p/0")]);
}

#[test]
fn a_failed_victim_search_still_lets_a_smaller_request_of_the_same_kind_preempt() {
    // The first preemptor needs more than any eviction frees; the memo of that failed search
    // must still let a smaller one (same constraints, variant and band) find its victim, and a
    // larger one after it must fail without a victim.
    let s = snap(
        vec![worker("a").build(), worker("b").build()],
        vec![
            running("/x/prod/0", "a")
                .band(Band::Production)
                .cpu(4000)
                .build(),
            running("/x/batch/0", "a").cpu(4000).build(),
            running("/x/prod/1", "b")
                .band(Band::Production)
                .cpu(5000)
                .build(),
            running("/x/batch/1", "b").cpu(3000).build(),
        ],
        vec![
            pending("/u/big/0").band(Band::Production).cpu(6000).build(),
            pending("/u/small/0")
                .band(Band::Production)
                .cpu(3500)
                .build(),
            pending("/u/huge/0")
                .band(Band::Production)
                .cpu(7000)
                .build(),
        ],
    );
    let plan = run(&s);
    assert_eq!(evicted(&plan), [("/x/batch/0", "a", "/u/small/0")]);
    assert_eq!(placed(&plan), [("/u/small/0", "a")]);
    assert!(plan.pending_reasons.contains_key("/u/big/0"));
    assert!(plan.pending_reasons.contains_key("/u/huge/0"));
}

#[test]
fn victim_must_share_the_device_variant() {
    let s = snap(
        vec![worker("g").gpu(8, "h100").build()],
        vec![running("/x/cpu/0", "g").cpu(8000).build()],
        vec![pending("/u/p/0")
            .band(Band::Production)
            .gpu(1, "h100")
            .cpu(4000)
            .build()],
    );
    let plan = run(&s);
    assert!(plan.preemptions.is_empty());
    assert!(plan.assignments.is_empty());
    assert!(reason(&plan, "/u/p/0").starts_with("Waiting for resources"));
}

#[test]
fn victim_worker_must_satisfy_hard_constraints() {
    let s = snap(
        vec![
            worker("east").attr("region", "east").build(),
            worker("west").attr("region", "west").build(),
        ],
        vec![
            running("/x/a/0", "east").cpu(8000).build(),
            running("/x/b/0", "west").cpu(8000).build(),
        ],
        vec![pending("/u/p/0")
            .band(Band::Production)
            .cpu(4000)
            .constraint(Constraint::equals("region", "west"))
            .build()],
    );
    assert_eq!(evicted(&run(&s)), [("/x/b/0", "west", "/u/p/0")]);
}

#[test]
fn only_running_tasks_are_victims() {
    let s = snap(
        vec![worker("w").build()],
        vec![running("/x/b/0", "w").cpu(8000).building().build()],
        vec![pending("/u/p/0").band(Band::System).cpu(4000).build()],
    );
    assert!(run(&s).preemptions.is_empty());
}

#[test]
fn each_victim_once_and_one_victim_per_preemptor() {
    let s = snap(
        vec![worker("w").build()],
        vec![
            running("/x/a/0", "w").cpu(4000).build(),
            running("/x/b/0", "w").cpu(4000).build(),
        ],
        vec![
            // Needs both victims: one victim per preemptor means no preemption.
            pending("/u/huge/0").band(Band::System).cpu(8000).build(),
            pending("/v/p/0").band(Band::Production).cpu(4000).build(),
            pending("/w/p/0").band(Band::Production).cpu(4000).build(),
            pending("/z/p/0").band(Band::Production).cpu(4000).build(),
        ],
    );
    let plan = run(&s);
    assert_eq!(
        evicted(&plan),
        [("/x/a/0", "w", "/v/p/0"), ("/x/b/0", "w", "/w/p/0")]
    );
    assert!(plan.pending_reasons.contains_key("/u/huge/0"));
    assert!(plan.pending_reasons.contains_key("/z/p/0"));
}

#[test]
fn solo_preemptor_never_tears_down_a_slice() {
    let s = snap(
        vec![worker("w").build()],
        vec![running("/x/slice/0", "w").cpu(8000).coscheduled().build()],
        vec![pending("/u/p/0").band(Band::System).cpu(4000).build()],
    );
    assert!(run(&s).preemptions.is_empty());
}

#[test]
fn capped_tasks_do_not_preempt_but_blocked_tasks_of_the_same_shape_do() {
    let running_tasks: Vec<_> = (0..6)
        .map(|i| {
            running(&format!("/x/b{i}/0"), &format!("w{i}"))
                .cpu(8000)
                .build()
        })
        .collect();
    let workers: Vec<_> = (0..6).map(|i| worker(&format!("w{i}")).build()).collect();
    let pending: Vec<_> = (0..6)
        .map(|i| {
            pending(&format!("/u/p/{i}"))
                .band(Band::Production)
                .cpu(8000)
                .build()
        })
        .collect();
    let plan = run(&snap(workers, running_tasks, pending));
    assert_eq!(plan.preemptions.len(), 4);
    assert_eq!(plan.assignments.len(), 4);
    assert!(reason(&plan, "/u/p/4").starts_with("Per-job cycle cap reached"));
}

// ---------------------------------------------------------------- gang preemption

#[test]
fn gang_preempts_a_whole_lower_band_slice() {
    let workers = slice_hosts("s", 2);
    let running_tasks = vec![
        running("/x/slice/0", "s-1").cpu(8000).coscheduled().build(),
        running("/x/slice/1", "s-0").cpu(8000).coscheduled().build(),
    ];
    let mut tasks = gang("/u/g", 2);
    for t in &mut tasks {
        t.band = Band::Production;
    }
    let plan = run(&snap(workers, running_tasks, tasks));
    assert_eq!(
        evicted(&plan),
        [
            ("/x/slice/0", "s-1", "/u/g/0"),
            ("/x/slice/1", "s-0", "/u/g/1")
        ]
    );
    assert_eq!(placed(&plan), [("/u/g/0", "s-1"), ("/u/g/1", "s-0")]);
    assert!(plan.pending_reasons.is_empty());
}

#[test]
fn gang_does_not_preempt_a_slice_of_its_own_band() {
    let workers = slice_hosts("s", 2);
    let running_tasks = vec![
        running("/x/slice/0", "s-1")
            .band(Band::Interactive)
            .cpu(8000)
            .coscheduled()
            .build(),
        running("/x/slice/1", "s-0")
            .band(Band::Interactive)
            .cpu(8000)
            .coscheduled()
            .build(),
    ];
    let plan = run(&snap(workers, running_tasks, gang("/u/g", 2)));
    assert!(plan.preemptions.is_empty());
    assert!(plan.assignments.is_empty());
}

#[test]
fn gang_evicts_solo_cotenants_on_enough_hosts_of_one_group() {
    let workers = slice_hosts("s", 3);
    let running_tasks = vec![
        running("/x/a/0", "s-2").cpu(6000).build(),
        running("/x/b/0", "s-1").cpu(2000).build(),
        running("/x/c/0", "s-1").cpu(6000).build(),
        // A sibling of higher band on s-0: that host is not usable.
        running("/x/prod/0", "s-0")
            .band(Band::Production)
            .cpu(6000)
            .build(),
    ];
    let mut tasks = gang("/u/g", 2);
    for t in &mut tasks {
        t.band = Band::Production;
    }
    let plan = run(&snap(workers, running_tasks, tasks));
    // s-1 only needs /x/c/0 gone (the cheaper /x/b/0 alone would not do).
    assert_eq!(
        evicted(&plan),
        [("/x/a/0", "s-2", "/u/g/0"), ("/x/c/0", "s-1", "/u/g/1")]
    );
    assert_eq!(placed(&plan), [("/u/g/0", "s-2"), ("/u/g/1", "s-1")]);
}

// ---------------------------------------------------------------- determinism

#[test]
fn input_order_does_not_matter() {
    let mut workers = slice_hosts("s", 3);
    workers.push(worker("cpu").attr("region", "west").build());
    let mut tasks = gang("/a/g", 2);
    tasks.push(pending("/b/j/0").cpu(3000).build());
    tasks.push(pending("/b/j/1").cpu(3000).build());
    tasks.push(
        pending("/c/p/0")
            .band(Band::Production)
            .cpu(8000)
            .constraint(Constraint::equals("region", "west"))
            .build(),
    );
    let running_tasks = vec![running("/x/r/0", "cpu").cpu(7000).build()];
    let s = snap(workers.clone(), running_tasks.clone(), tasks.clone());
    let plan = run(&s);
    workers.reverse();
    tasks.reverse();
    let s2 = snap(workers, running_tasks, tasks);
    assert_eq!(run(&s2), plan);
    assert_eq!(run(&s), plan);
}
