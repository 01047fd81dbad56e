//! Input and output data of the scheduler: plain values, no behaviour beyond small helpers.

use std::collections::BTreeMap;
use std::fmt;

/// A worker's id as registered with the controller.
pub type WorkerId = String;
/// A task's full name, e.g. `/alice/train/0`.
pub type TaskKey = String;
/// A job's full name, e.g. `/alice/train`.
pub type JobKey = String;

/// Priority band. Declaration order is rank order: `System` is the highest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Band {
    /// Cluster infrastructure; preempts everything else.
    System,
    /// Production work; preempts `Interactive` and `Batch`.
    Production,
    /// The default band; preempts `Batch`.
    Interactive,
    /// Best-effort work; never preempts.
    Batch,
}

impl Band {
    /// All bands, highest first.
    pub const ALL: [Band; 4] = [
        Band::System,
        Band::Production,
        Band::Interactive,
        Band::Batch,
    ];

    /// Rank: 0 is the highest priority.
    pub fn rank(self) -> u8 {
        match self {
            Band::System => 0,
            Band::Production => 1,
            Band::Interactive => 2,
            Band::Batch => 3,
        }
    }

    /// True if `self` has strictly higher priority than `other` (never within a band).
    pub fn outranks(self, other: Band) -> bool {
        self.rank() < other.rank()
    }

    /// Lower-case name, as shown to users.
    pub fn name(self) -> &'static str {
        match self {
            Band::System => "system",
            Band::Production => "production",
            Band::Interactive => "interactive",
            Band::Batch => "batch",
        }
    }
}

impl fmt::Display for Band {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A resource vector. A request asks for a dimension when its value is `> 0`.
///
/// Fit checks cpu, memory, gpu and tpu; disk is carried but never checked (as in Iris).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Resources {
    /// CPU in millicores.
    pub cpu_millicores: i64,
    /// Memory in bytes.
    pub memory_bytes: i64,
    /// Disk in bytes (not checked by fit).
    pub disk_bytes: i64,
    /// GPU count.
    pub gpu: i64,
    /// TPU chip count.
    pub tpu: i64,
}

/// A dimension checked by fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dim {
    Cpu,
    Memory,
    Gpu,
    Tpu,
}

impl Dim {
    pub(crate) const CHECKED: [Dim; 4] = [Dim::Cpu, Dim::Memory, Dim::Gpu, Dim::Tpu];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Dim::Cpu => "cpu",
            Dim::Memory => "memory",
            Dim::Gpu => "gpu",
            Dim::Tpu => "tpu",
        }
    }

    /// An amount of this dimension with its unit, e.g. `4000m`, `16 GiB`, `8`.
    pub(crate) fn amount(self, v: i64) -> String {
        match self {
            Dim::Cpu => format!("{v}m"),
            Dim::Memory => format_bytes(v),
            Dim::Gpu | Dim::Tpu => v.to_string(),
        }
    }
}

/// Human-readable byte count: `512 MiB`, `16 GiB`, `1.5 GiB`.
pub(crate) fn format_bytes(v: i64) -> String {
    const KIB: i64 = 1 << 10;
    const MIB: i64 = 1 << 20;
    const GIB: i64 = 1 << 30;
    let (unit, name) = match v.unsigned_abs() {
        a if a >= GIB as u64 => (GIB, "GiB"),
        a if a >= MIB as u64 => (MIB, "MiB"),
        a if a >= KIB as u64 => (KIB, "KiB"),
        _ => return format!("{v} B"),
    };
    if v % unit == 0 {
        format!("{} {name}", v / unit)
    } else {
        format!("{:.1} {name}", v as f64 / unit as f64)
    }
}

impl Resources {
    /// Only cpu and memory.
    pub fn cpu_mem(cpu_millicores: i64, memory_bytes: i64) -> Resources {
        Resources {
            cpu_millicores,
            memory_bytes,
            ..Resources::default()
        }
    }

    pub(crate) fn get(&self, d: Dim) -> i64 {
        match d {
            Dim::Cpu => self.cpu_millicores,
            Dim::Memory => self.memory_bytes,
            Dim::Gpu => self.gpu,
            Dim::Tpu => self.tpu,
        }
    }

    /// The dimensions this request asks for (`> 0`), in cpu, memory, gpu, tpu order.
    pub(crate) fn requested(&self) -> impl Iterator<Item = Dim> + '_ {
        Dim::CHECKED.into_iter().filter(|d| self.get(*d) > 0)
    }

    /// True if this request fits in `free` on every requested dimension.
    pub fn fits_in(&self, free: &Resources) -> bool {
        (self.cpu_millicores <= 0 || self.cpu_millicores <= free.cpu_millicores)
            && (self.memory_bytes <= 0 || self.memory_bytes <= free.memory_bytes)
            && (self.gpu <= 0 || self.gpu <= free.gpu)
            && (self.tpu <= 0 || self.tpu <= free.tpu)
    }

    /// True if this request asks for at least as much as `other` on every dimension `other`
    /// asks for; wherever `other` does not fit, `self` does not fit either.
    pub(crate) fn covers(&self, other: &Resources) -> bool {
        Dim::CHECKED
            .into_iter()
            .all(|d| other.get(d) <= 0 || self.get(d) >= other.get(d))
    }

    /// Component-wise sum (all five fields).
    pub(crate) fn add(&mut self, o: &Resources) {
        self.cpu_millicores += o.cpu_millicores;
        self.memory_bytes += o.memory_bytes;
        self.disk_bytes += o.disk_bytes;
        self.gpu += o.gpu;
        self.tpu += o.tpu;
    }

    /// Component-wise difference (all five fields).
    pub(crate) fn sub(&mut self, o: &Resources) {
        self.cpu_millicores -= o.cpu_millicores;
        self.memory_bytes -= o.memory_bytes;
        self.disk_bytes -= o.disk_bytes;
        self.gpu -= o.gpu;
        self.tpu -= o.tpu;
    }

    /// Component-wise maximum.
    pub(crate) fn component_max(&self, o: &Resources) -> Resources {
        Resources {
            cpu_millicores: self.cpu_millicores.max(o.cpu_millicores),
            memory_bytes: self.memory_bytes.max(o.memory_bytes),
            disk_bytes: self.disk_bytes.max(o.disk_bytes),
            gpu: self.gpu.max(o.gpu),
            tpu: self.tpu.max(o.tpu),
        }
    }

    /// Sort key for "cheapest first": accelerators, then cpu, then memory.
    pub(crate) fn cost_key(&self) -> (i64, i64, i64) {
        (
            self.gpu.max(0) + self.tpu.max(0),
            self.cpu_millicores.max(0),
            self.memory_bytes.max(0),
        )
    }
}

/// Requested dimensions only, e.g. `cpu=1000m, memory=4 GiB, gpu=8`; `nothing` if none.
impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for d in self.requested() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{}={}", d.name(), d.amount(self.get(d)))?;
        }
        if first {
            f.write_str("nothing")?;
        }
        Ok(())
    }
}

/// A worker attribute value or a constraint operand.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// Compared case-insensitively after trimming.
    Str(String),
    /// Integer.
    Int(i64),
    /// Float; compares numerically with `Int`.
    Float(f64),
}

impl From<&str> for AttrValue {
    fn from(s: &str) -> Self {
        AttrValue::Str(s.to_string())
    }
}

impl From<String> for AttrValue {
    fn from(s: String) -> Self {
        AttrValue::Str(s)
    }
}

impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        AttrValue::Int(v)
    }
}

impl From<f64> for AttrValue {
    fn from(v: f64) -> Self {
        AttrValue::Float(v)
    }
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrValue::Str(s) => f.write_str(s.trim()),
            AttrValue::Int(v) => write!(f, "{v}"),
            AttrValue::Float(v) => write!(f, "{v}"),
        }
    }
}

/// Constraint operator (Iris codes EQ=0 … IN=8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConstraintOp {
    /// Attribute equals `value`.
    Eq,
    /// Attribute present and not equal to `value`.
    Ne,
    /// Attribute present.
    Exists,
    /// Attribute absent.
    NotExists,
    /// Attribute `>` `value` (numeric only).
    Gt,
    /// Attribute `>=` `value` (numeric only).
    Ge,
    /// Attribute `<` `value` (numeric only).
    Lt,
    /// Attribute `<=` `value` (numeric only).
    Le,
    /// Attribute equals one of `values`.
    In,
}

impl ConstraintOp {
    /// Upper-case name as in Iris (`EQ`, `NOT_EXISTS`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ConstraintOp::Eq => "EQ",
            ConstraintOp::Ne => "NE",
            ConstraintOp::Exists => "EXISTS",
            ConstraintOp::NotExists => "NOT_EXISTS",
            ConstraintOp::Gt => "GT",
            ConstraintOp::Ge => "GE",
            ConstraintOp::Lt => "LT",
            ConstraintOp::Le => "LE",
            ConstraintOp::In => "IN",
        }
    }

    /// True for GT, GE, LT, LE.
    pub fn is_ordering(self) -> bool {
        matches!(
            self,
            ConstraintOp::Gt | ConstraintOp::Ge | ConstraintOp::Lt | ConstraintOp::Le
        )
    }
}

impl fmt::Display for ConstraintOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One constraint on worker attributes. `required` constraints filter workers;
/// the others (PREFERRED) rank them.
#[derive(Clone, Debug, PartialEq)]
pub struct Constraint {
    /// Attribute key, matched exactly (e.g. `region`, `tpu-name`).
    pub key: String,
    /// Operator.
    pub op: ConstraintOp,
    /// Operand for EQ, NE, GT, GE, LT, LE.
    pub value: Option<AttrValue>,
    /// Operands for IN.
    pub values: Vec<AttrValue>,
    /// REQUIRED (hard) when true, PREFERRED (soft) when false.
    pub required: bool,
}

impl Constraint {
    /// A required constraint with one (optional) operand.
    pub fn new(key: impl Into<String>, op: ConstraintOp, value: Option<AttrValue>) -> Constraint {
        Constraint {
            key: key.into(),
            op,
            value,
            values: Vec::new(),
            required: true,
        }
    }

    /// A required `key EQ value` constraint.
    pub fn equals(key: impl Into<String>, value: impl Into<AttrValue>) -> Constraint {
        Constraint::new(key, ConstraintOp::Eq, Some(value.into()))
    }

    /// A required `key IN [values]` constraint.
    pub fn one_of(key: impl Into<String>, values: Vec<AttrValue>) -> Constraint {
        Constraint {
            values,
            ..Constraint::new(key, ConstraintOp::In, None)
        }
    }

    /// The same constraint in PREFERRED mode.
    pub fn preferred(self) -> Constraint {
        Constraint {
            required: false,
            ..self
        }
    }
}

/// `region EQ us-west`, `zone IN [a, b]`, `gpu EXISTS`.
impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.key, self.op)?;
        match self.op {
            ConstraintOp::Exists | ConstraintOp::NotExists => Ok(()),
            ConstraintOp::In => {
                f.write_str(" [")?;
                for (i, v) in self.values.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            _ => match &self.value {
                Some(v) => write!(f, " {v}"),
                None => f.write_str(" <missing>"),
            },
        }
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
    /// ASSIGNED+BUILDING tasks a worker may hold before taking no more (Iris: 8).
    pub max_building_per_worker: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_tasks_per_job_per_cycle: 4,
            max_assignments_per_worker_per_cycle: 4,
            max_building_per_worker: 8,
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
    /// A user-facing reason for every pending task that was not assigned.
    pub pending_reasons: BTreeMap<TaskKey, String>,
}
