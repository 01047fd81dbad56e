//! Helpers for the controller's component tests: a real controller on a temp state dir (no port
//! bound), workers registered as `Register` would, and submissions as `LaunchJob` or, for
//! back-dated cases, straight through the store.

use crate::{Controller, ControllerConfig};
use iris_proto::cluster::controller as c;
use iris_proto::job;
use iris_store::{apply, views};
use iris_types::{JobState, TaskState};
use std::sync::Arc;

pub(crate) const GIB: i64 = 1 << 30;

/// A controller and the temp dir it lives in (dropped with it).
pub(crate) struct TestCtl {
    pub ctl: Arc<Controller>,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for TestCtl {
    type Target = Controller;
    fn deref(&self) -> &Controller {
        &self.ctl
    }
}

/// A controller with `ControllerConfig::local`, adjusted by `f`.
pub(crate) fn controller_with(f: impl FnOnce(&mut ControllerConfig)) -> TestCtl {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ControllerConfig::local(dir.path().to_path_buf());
    f(&mut cfg);
    let ctl = Controller::open(cfg).expect("controller opens");
    TestCtl { ctl, _dir: dir }
}

pub(crate) fn controller() -> TestCtl {
    controller_with(|_| {})
}

/// Registers a CPU worker at `address` as `Register` does.
pub(crate) fn register_at(ctl: &Controller, id: &str, address: &str, cpus: i32, memory: i64) {
    let req = c::RegisterRequest {
        worker_id: id.into(),
        address: address.into(),
        ..Default::default()
    };
    let md = job::WorkerMetadata {
        hostname: Some(id.into()),
        cpu_count: Some(cpus),
        memory_bytes: Some(memory),
        disk_bytes: Some(100 * GIB),
        ..Default::default()
    };
    crate::reconcile::upsert_worker(ctl, &req, &md).expect("register worker");
}

pub(crate) fn register(ctl: &Controller, id: &str, cpus: i32, memory: i64) {
    register_at(ctl, id, "127.0.0.1:1", cpus, memory);
}

/// A `LaunchJob` request for `replicas` tasks of `cpu_millicores` and 1 GiB each.
pub(crate) fn request(name: &str, replicas: i32, cpu_millicores: i32) -> c::LaunchJobRequest {
    c::LaunchJobRequest {
        name: Some(name.into()),
        entrypoint: Some(job::RuntimeEntrypoint {
            run_command: Some(job::CommandEntrypoint {
                argv: vec!["python".into(), "train.py".into()],
            }),
            ..Default::default()
        }),
        resources: Some(job::ResourceSpecProto {
            cpu_millicores,
            memory_bytes: GIB,
            ..Default::default()
        }),
        replicas: Some(replicas),
        ..Default::default()
    }
}

/// Submits through `LaunchJob` (the admission thread commits it).
pub(crate) async fn launch(ctl: &Controller, req: c::LaunchJobRequest) -> String {
    ctl.launch_job(req).await.expect("job admitted").job_id
}

/// Inserts a root job directly through the store, as submitted at `submitted_at`; `federated`
/// queues it for a federation peer instead of creating tasks.
pub(crate) fn insert_job_at(
    ctl: &Controller,
    req: &c::LaunchJobRequest,
    submitted_at: i64,
    federated: Option<&str>,
) {
    let res = req.resources.clone().unwrap_or_default();
    let name = iris_types::JobName::parse(req.name()).expect("job name");
    let new = apply::NewJob {
        job_id: req.name.clone().unwrap_or_default(),
        user_id: name.user().to_string(),
        submitting_user: name.user().to_string(),
        parent_job_id: None,
        root_job_id: req.name.clone().unwrap_or_default(),
        depth: 1,
        num_tasks: req.replicas().max(1) as u32,
        failed: None,
        cfg: apply::JobConfigRow {
            res_cpu_millicores: res.cpu_millicores as i64,
            res_memory_bytes: res.memory_bytes,
            scheduling_timeout_ms: req.scheduling_timeout.as_ref().map(|d| d.milliseconds),
            timeout_ms: req.timeout.as_ref().map(|d| d.milliseconds),
            priority_band: iris_types::Band::Interactive.code(),
            request_blob: prost::Message::encode_to_vec(req),
            ..Default::default()
        },
        workdir_files: Vec::new(),
        secrets: Vec::new(),
        federated: federated.map(str::to_string),
    };
    let mut conn = ctl.db();
    let tx = conn.begin().expect("tx");
    apply::insert_job(&tx, &new, submitted_at).expect("insert job");
    if let Some(peer) = federated {
        use iris_store::federation as sf;
        let user = name.user().to_string();
        sf::insert_handle(&tx, req.name(), sf::SENT, peer, &user, sf::QUEUED, "nonce")
            .expect("insert handle");
    }
    tx.commit().expect("commit");
}

pub(crate) fn task(ctl: &Controller, task_id: &str) -> views::TaskRow {
    views::task(&*ctl.db(), task_id)
        .expect("read task")
        .expect("task exists")
}

pub(crate) fn task_state(ctl: &Controller, task_id: &str) -> TaskState {
    TaskState::from_code(task(ctl, task_id).state).expect("known task state")
}

pub(crate) fn job_row(ctl: &Controller, job_id: &str) -> views::JobRow {
    views::job(&*ctl.db(), job_id)
        .expect("read job")
        .expect("job exists")
}

pub(crate) fn job_state(ctl: &Controller, job_id: &str) -> JobState {
    JobState::from_code(job_row(ctl, job_id).state).expect("known job state")
}
