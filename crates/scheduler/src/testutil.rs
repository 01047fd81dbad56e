//! Builders for unit tests.

use std::collections::BTreeMap;

use crate::model::*;
use iris_types::{AttrValue, Band, Constraint, Resources};

pub(crate) const GIB: i64 = 1 << 30;

pub(crate) fn res(cpu: i64, mem_gib: i64) -> Resources {
    Resources::cpu_mem(cpu, mem_gib * GIB)
}

pub(crate) struct WorkerB(Worker);

/// A healthy worker with 8 cores and 32 GiB.
pub(crate) fn worker(id: &str) -> WorkerB {
    WorkerB(Worker::new(id, res(8000, 32)))
}

impl WorkerB {
    pub(crate) fn cpu(mut self, m: i64) -> Self {
        self.0.total.cpu_millicores = m;
        self
    }
    pub(crate) fn mem_gib(mut self, g: i64) -> Self {
        self.0.total.memory_bytes = g * GIB;
        self
    }
    pub(crate) fn gpu(mut self, n: i64, variant: &str) -> Self {
        self.0.total.gpu = n;
        self.0.device_variant = variant.to_string();
        self
    }
    pub(crate) fn attr(mut self, k: &str, v: impl Into<AttrValue>) -> Self {
        self.0.attributes.insert(k.to_string(), v.into());
        self
    }
    pub(crate) fn pooled(mut self) -> Self {
        self.0.pooled = true;
        self
    }
    pub(crate) fn unhealthy(mut self) -> Self {
        self.0.healthy = false;
        self
    }
    pub(crate) fn build(self) -> Worker {
        self.0
    }
}

fn job_of(task: &str) -> String {
    match task.rfind('/') {
        Some(i) if i > 0 => task[..i].to_string(),
        _ => task.to_string(),
    }
}

fn user_of(task: &str) -> String {
    task.trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("")
        .to_string()
}

pub(crate) struct PendingB(PendingTask);

/// An Interactive pending task asking for 1 core and 1 GiB; job and user come from the key.
pub(crate) fn pending(task: &str) -> PendingB {
    let idx = task
        .rsplit('/')
        .next()
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or(0);
    PendingB(PendingTask {
        task: task.to_string(),
        job: job_of(task),
        user: user_of(task),
        band: Band::Interactive,
        resources: res(1000, 1),
        constraints: vec![],
        group_by: None,
        depth: 1,
        root_submitted_ms: 0,
        submitted_ms: 0,
        insertion: idx,
        device_variant: String::new(),
    })
}

impl PendingB {
    pub(crate) fn band(mut self, b: Band) -> Self {
        self.0.band = b;
        self
    }
    pub(crate) fn cpu(mut self, m: i64) -> Self {
        self.0.resources.cpu_millicores = m;
        self
    }
    pub(crate) fn mem_gib(mut self, g: i64) -> Self {
        self.0.resources.memory_bytes = g * GIB;
        self
    }
    pub(crate) fn gpu(mut self, n: i64, variant: &str) -> Self {
        self.0.resources.gpu = n;
        self.0.device_variant = variant.to_string();
        self
    }
    pub(crate) fn constraint(mut self, c: Constraint) -> Self {
        self.0.constraints.push(c);
        self
    }
    pub(crate) fn group_by(mut self, key: &str) -> Self {
        self.0.group_by = Some(key.to_string());
        self
    }
    pub(crate) fn depth(mut self, d: u32) -> Self {
        self.0.depth = d;
        self
    }
    pub(crate) fn root_submitted(mut self, ms: i64) -> Self {
        self.0.root_submitted_ms = ms;
        self
    }
    pub(crate) fn submitted(mut self, ms: i64) -> Self {
        self.0.submitted_ms = ms;
        self
    }
    pub(crate) fn insertion(mut self, i: i64) -> Self {
        self.0.insertion = i;
        self
    }
    pub(crate) fn build(self) -> PendingTask {
        self.0
    }
}

pub(crate) struct RunningB(RunningTask);

/// A RUNNING Batch task on `worker` holding 1 core and 1 GiB.
pub(crate) fn running(task: &str, worker: &str) -> RunningB {
    RunningB(RunningTask {
        task: task.to_string(),
        job: job_of(task),
        worker: worker.to_string(),
        band: Band::Batch,
        resources: res(1000, 1),
        running: true,
        coscheduled: false,
        device_variant: String::new(),
    })
}

impl RunningB {
    pub(crate) fn band(mut self, b: Band) -> Self {
        self.0.band = b;
        self
    }
    pub(crate) fn cpu(mut self, m: i64) -> Self {
        self.0.resources.cpu_millicores = m;
        self
    }
    pub(crate) fn gpu(mut self, n: i64, variant: &str) -> Self {
        self.0.resources.gpu = n;
        self.0.device_variant = variant.to_string();
        self
    }
    pub(crate) fn building(mut self) -> Self {
        self.0.running = false;
        self
    }
    pub(crate) fn coscheduled(mut self) -> Self {
        self.0.coscheduled = true;
        self
    }
    pub(crate) fn build(self) -> RunningTask {
        self.0
    }
}

pub(crate) fn snap(
    workers: Vec<Worker>,
    running: Vec<RunningTask>,
    pending: Vec<PendingTask>,
) -> Snapshot {
    Snapshot {
        workers,
        running,
        pending,
        user_spend: BTreeMap::new(),
    }
}

/// `(task, worker)` pairs of a plan's assignments.
pub(crate) fn placed(plan: &Plan) -> Vec<(&str, &str)> {
    plan.assignments
        .iter()
        .map(|a| (a.task.as_str(), a.worker.as_str()))
        .collect()
}

/// `(victim, worker, by)` triples of a plan's preemptions.
pub(crate) fn evicted(plan: &Plan) -> Vec<(&str, &str, &str)> {
    plan.preemptions
        .iter()
        .map(|p| (p.victim.as_str(), p.worker.as_str(), p.by.as_str()))
        .collect()
}

pub(crate) fn reason<'a>(plan: &'a Plan, task: &str) -> &'a str {
    plan.reason(task).unwrap_or("<no reason>")
}
