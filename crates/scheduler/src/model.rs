//! Input and output data of the scheduler: plain values, no behaviour beyond small helpers.
//!
//! The domain vocabulary they are made of ([`Band`], [`Resources`], [`AttrValue`],
//! [`Constraint`]) is `iris-types`'s.

use std::collections::BTreeMap;

use iris_types::{AttrValue, Band, Constraint, Dim, Resources};

/// A worker's id as registered with the controller.
pub type WorkerId = String;
/// A task's full name, e.g. `/alice/train/0`.
pub type TaskKey = String;
/// A job's full name, e.g. `/alice/train`.
pub type JobKey = String;

/// The scheduler's arithmetic over [`Resources`]: sums and differences of free capacity, and the
/// comparisons preemption and cycle bookkeeping rely on. Scheduling behaviour rather than
/// vocabulary, so it lives here and not in `iris-types`.
pub(crate) trait ResourcesExt {
    /// True if this request asks for at least as much as `other` on every dimension `other`
    /// asks for; wherever `other` does not fit, `self` does not fit either.
    fn covers(&self, other: &Resources) -> bool;
    /// Component-wise sum (all five fields).
    fn add(&mut self, o: &Resources);
    /// Component-wise difference (all five fields).
    fn sub(&mut self, o: &Resources);
    /// Component-wise maximum.
    fn component_max(&self, o: &Resources) -> Resources;
    /// Sort key for "cheapest first": accelerators, then cpu, then memory.
    fn cost_key(&self) -> (i64, i64, i64);
}

impl ResourcesExt for Resources {
    fn covers(&self, other: &Resources) -> bool {
        Dim::CHECKED
            .into_iter()
            .all(|d| other.get(d) <= 0 || self.get(d) >= other.get(d))
    }

    fn add(&mut self, o: &Resources) {
        self.cpu_millicores += o.cpu_millicores;
        self.memory_bytes += o.memory_bytes;
        self.disk_bytes += o.disk_bytes;
        self.gpu += o.gpu;
        self.tpu += o.tpu;
    }

    fn sub(&mut self, o: &Resources) {
        self.cpu_millicores -= o.cpu_millicores;
        self.memory_bytes -= o.memory_bytes;
        self.disk_bytes -= o.disk_bytes;
        self.gpu -= o.gpu;
        self.tpu -= o.tpu;
    }

    fn component_max(&self, o: &Resources) -> Resources {
        Resources {
            cpu_millicores: self.cpu_millicores.max(o.cpu_millicores),
            memory_bytes: self.memory_bytes.max(o.memory_bytes),
            disk_bytes: self.disk_bytes.max(o.disk_bytes),
            gpu: self.gpu.max(o.gpu),
            tpu: self.tpu.max(o.tpu),
        }
    }

    fn cost_key(&self) -> (i64, i64, i64) {
        (
            self.gpu.max(0) + self.tpu.max(0),
            self.cpu_millicores.max(0),
            self.memory_bytes.max(0),
        )
    }
}

/// A registered worker.
#[derive(Clone, Debug, PartialEq)]
pub struct Worker {
    /// Unique id.
    pub id: WorkerId,
    /// Total capacity.
    pub total: Resources,
    /// Advertised attributes (`device-type`, `region`, `tpu-name`, ...).
    pub attributes: BTreeMap<String, AttrValue>,
    /// Unhealthy workers receive no new tasks and host no preemption.
    pub healthy: bool,
    /// Accelerator variant, `""` for cpu-only workers.
    pub device_variant: String,
    /// A pool that places work itself (an in-process backend such as Kubernetes, where Kueue
    /// decides nodes): it may host several members of one gang.
    pub pooled: bool,
}

impl Worker {
    /// A healthy cpu worker with no attributes.
    pub fn new(id: impl Into<WorkerId>, total: Resources) -> Worker {
        Worker {
            id: id.into(),
            total,
            attributes: BTreeMap::new(),
            healthy: true,
            pooled: false,
            device_variant: String::new(),
        }
    }

    /// Adds or replaces an attribute.
    pub fn with_attr(mut self, key: impl Into<String>, value: impl Into<AttrValue>) -> Worker {
        self.attributes.insert(key.into(), value.into());
        self
    }
}

/// A task bound to a worker that still holds resources there (ASSIGNED, BUILDING or RUNNING).
#[derive(Clone, Debug, PartialEq)]
pub struct RunningTask {
    /// Task key.
    pub task: TaskKey,
    /// Owning job.
    pub job: JobKey,
    /// Worker holding its resources.
    pub worker: WorkerId,
    /// Band stamped at assignment; compared against preemptors.
    pub band: Band,
    /// Resources held.
    pub resources: Resources,
    /// RUNNING (may be preempted) vs ASSIGNED/BUILDING (counts toward build back-pressure).
    pub running: bool,
    /// Member of a coscheduled job (slice).
    pub coscheduled: bool,
    /// Accelerator variant, `""` for cpu.
    pub device_variant: String,
}

/// A PENDING task waiting for a worker.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingTask {
    /// Task key, e.g. `/alice/train/3`.
    pub task: TaskKey,
    /// Owning job, e.g. `/alice/train`.
    pub job: JobKey,
    /// Job owner; spend is tracked per user.
    pub user: String,
    /// Effective band (after budget downgrades).
    pub band: Band,
    /// Requested resources.
    pub resources: Resources,
    /// Required and preferred constraints, all ANDed.
    pub constraints: Vec<Constraint>,
    /// Coscheduling attribute (e.g. `tpu-name`); `Some` makes the job a gang.
    pub group_by: Option<String>,
    /// Job depth in the job tree; deeper jobs go first.
    pub depth: u32,
    /// Submission time of the root job (ms).
    pub root_submitted_ms: i64,
    /// Submission time of this job (ms).
    pub submitted_ms: i64,
    /// Insertion order (task order within a job).
    pub insertion: i64,
    /// Accelerator variant, `""` for cpu.
    pub device_variant: String,
}

/// Everything the scheduler looks at, read in one transaction by the controller.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Registered workers (any order).
    pub workers: Vec<Worker>,
    /// Tasks holding resources on workers (any order).
    pub running: Vec<RunningTask>,
    /// PENDING tasks (any order).
    pub pending: Vec<PendingTask>,
    /// Current spend per user; missing users count as 0.
    pub user_spend: BTreeMap<String, i64>,
}

/// Per-cycle limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Non-coscheduled tasks of one job considered per cycle (Iris: 4).
    pub max_tasks_per_job_per_cycle: usize,
    /// New assignments per worker per cycle (Iris: 4).
    pub max_assignments_per_worker_per_cycle: usize,
    /// ASSIGNED+BUILDING tasks a worker may hold before taking no more (Iris: 8). Pooled
    /// workers have none: Kueue queues their pods.
    pub max_building_per_worker: usize,
    /// New assignments per pooled worker (an in-process backend) per cycle (ours: 1000; the
    /// published Kubernetes provider places without a scheduler).
    pub max_assignments_per_pool_per_cycle: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_tasks_per_job_per_cycle: 4,
            max_assignments_per_worker_per_cycle: 4,
            max_building_per_worker: 8,
            max_assignments_per_pool_per_cycle: 1000,
        }
    }
}

/// Bind `task` to `worker` (the task becomes ASSIGNED).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// Pending task placed.
    pub task: TaskKey,
    /// Worker it goes to.
    pub worker: WorkerId,
}

/// Preempt running task `victim` on `worker` to make room for pending task `by`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    /// Running task to preempt.
    pub victim: TaskKey,
    /// Worker the victim runs on.
    pub worker: WorkerId,
    /// Preemptor; it also appears in [`Plan::assignments`].
    pub by: TaskKey,
}

/// The result of one scheduling cycle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// New assignments, in decision order (placements first, then preemptors).
    pub assignments: Vec<Assignment>,
    /// Preemptions, in decision order.
    pub preemptions: Vec<Preemption>,
    /// A user-facing reason for every pending task that entered the cycle and was not assigned.
    pub pending_reasons: BTreeMap<TaskKey, String>,
    /// Jobs whose tasks beyond the per-job cap did not enter the cycle, with the reason each of
    /// those tasks shows (one entry per job, not per task: at C1M shape that is 10,000 strings
    /// a tick instead of a million).
    pub capped_jobs: BTreeMap<JobKey, String>,
}

impl Plan {
    /// Why pending task `task` (a key `<job>/<index>`), which this plan did not assign, waits:
    /// its own reason if it entered the cycle, else its job's per-job cap reason. Ask only of
    /// unassigned tasks: an assigned task of a capped job gets its job's reason too.
    pub fn reason(&self, task: &str) -> Option<&str> {
        if let Some(r) = self.pending_reasons.get(task) {
            return Some(r);
        }
        let (job, _) = task.rsplit_once('/')?;
        self.capped_jobs.get(job).map(String::as_str)
    }
}

/// The reason of a task held back by the per-job cap.
pub fn capped_reason(cap: usize, job: &str) -> String {
    format!("Per-job cycle cap reached: at most {cap} tasks of job {job} are considered per cycle")
}
