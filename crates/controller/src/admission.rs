//! Admission: `LaunchJob` from validation to commit. Every field is checked up front (each
//! refusal names the field and the fix); the band is resolved and authorized; the job is placed
//! here or queued for a federation peer; the existing-job policy decides what happens to a job
//! of the same name; then submissions are committed in groups (one transaction, a savepoint
//! each) and acknowledged only after the commit.

use crate::error::{Error, Result};
use crate::rpc::{now, valid_sha};
use crate::spec::{constraint_from_proto, device_of, JobSpec};
use crate::{lock, Controller};
use iris_proto::cluster::controller as c;
use iris_proto::job;
use iris_rpc::Code;
use iris_store::{apply, Attempt, Tx};
use iris_types::{Band, JobName, JobState};
use sha2::Digest;
use std::sync::Arc;

/// Largest accepted workspace bundle.
pub const MAX_BUNDLE_BYTES: usize = 25 << 20;
/// Most replicas a job may ask for.
pub const MAX_REPLICAS: i32 = 10_000;

/// What to do when a job of the same name exists (`existing_job_policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExistingJobPolicy {
    /// 0: refuse while the old job runs; replace a finished one.
    Unspecified,
    /// 1: always refuse.
    Error,
    /// 2: keep a running job (acknowledge without change); replace a finished one.
    Keep,
    /// 3: always replace (kill the old job if it runs).
    Recreate,
}

impl ExistingJobPolicy {
    pub(crate) fn from_code(code: i32) -> ExistingJobPolicy {
        match code {
            1 => ExistingJobPolicy::Error,
            2 => ExistingJobPolicy::Keep,
            3 => ExistingJobPolicy::Recreate,
            _ => ExistingJobPolicy::Unspecified,
        }
    }
}

/// What admission does about an existing job in state `existing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnExisting {
    /// Acknowledge; the running job stays.
    Keep,
    /// Refuse with ALREADY_EXISTS.
    Refuse,
    /// Kill the old job if it runs, delete it, insert the new one.
    Replace,
}

/// The existing-job policy as a decision (pure).
pub(crate) fn on_existing(
    policy: ExistingJobPolicy,
    fail_if_exists: bool,
    existing: JobState,
) -> OnExisting {
    let running = !existing.is_terminal();
    match policy {
        ExistingJobPolicy::Keep if running => OnExisting::Keep,
        ExistingJobPolicy::Error => OnExisting::Refuse,
        _ if fail_if_exists => OnExisting::Refuse,
        ExistingJobPolicy::Recreate => OnExisting::Replace,
        _ if running => OnExisting::Refuse,
        _ => OnExisting::Replace,
    }
}

fn check_revision_date(client: &str, controller: Option<&str>) -> Result<()> {
    if client.is_empty() {
        return Ok(());
    }
    let parse = |s: &str| chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d");
    let cd = parse(client).map_err(|_| {
        Error::invalid(format!(
            "client_revision_date '{client}' must be YYYY-MM-DD"
        ))
    })?;
    let Some(ours) = controller.and_then(|s| parse(s).ok()) else {
        return Ok(());
    };
    if cd < ours - chrono::Duration::days(14) {
        return Err(Error::precondition(format!(
            "marin-iris client is too old: its revision date {client} is more than 14 days before this controller's {ours}; upgrade the client (pip install -U marin-iris)"
        )));
    }
    Ok(())
}

impl Controller {
    pub(crate) async fn launch_job(
        &self,
        mut req: c::LaunchJobRequest,
    ) -> Result<c::LaunchJobResponse> {
        let name = JobName::parse(req.name()).map_err(|e| Error::invalid(format!("name: {e}")))?;
        let caller = crate::auth::caller();
        let handoff = req.federation.clone();
        let (name, submitting_user) = match &handoff {
            Some(f) => {
                // A parent's handoff keeps its job id (the same id on both clusters).
                self.check_handoff(&name, f)?;
                (name, f.submitting_user.clone())
            }
            None => {
                let name =
                    self.authorize_submission(name, req.priority_band.unwrap_or_default())?;
                self.authorize_container_profile(&name, req.container_profile.unwrap_or_default())?;
                let who = if caller.anonymous {
                    iris_federation::LOCAL_ADMIN.to_string()
                } else {
                    caller.user_id.clone()
                };
                (name, who)
            }
        };
        req.name = Some(name.to_string());
        if let Some(env) = &req.environment {
            for secret in env.secrets.keys() {
                if !iris_types::ids::valid_secret_name(secret) {
                    return Err(Error::invalid(format!(
                        "environment.secrets: `{secret}` is not a valid secret name; use letters, digits, `_`, `.` and `-`, starting with a letter, digit or `_`"
                    )));
                }
            }
        }
        if req.replicas() == 0 {
            req.replicas = Some(1);
        }
        if req.replicas() < 1 || req.replicas() > MAX_REPLICAS {
            return Err(Error::invalid(format!(
                "replicas: {} is out of range; use 1 to {MAX_REPLICAS}",
                req.replicas()
            )));
        }
        let res = req.resources.clone().unwrap_or_default();
        if res.cpu_millicores < 0 || res.memory_bytes < 0 || res.disk_bytes < 0 {
            return Err(Error::invalid(
                "resources: cpu, memory and disk must not be negative",
            ));
        }
        let (dtype, variant, gpu, tpu) = device_of(req.resources.as_ref());
        if gpu < 0 || tpu < 0 {
            return Err(Error::invalid(
                "resources.device: count must not be negative",
            ));
        }
        let argv_empty = req
            .entrypoint
            .as_ref()
            .and_then(|e| e.run_command.as_ref())
            .map(|r| r.argv.is_empty())
            .unwrap_or(true);
        if argv_empty {
            return Err(Error::invalid(
                "entrypoint.run_command.argv: a command is required (e.g. iris job run -- python train.py)",
            ));
        }
        if req.max_retries_failure.unwrap_or_default() < 0
            || req.max_retries_preemption.unwrap_or_default() < 0
            || req.max_task_failures.unwrap_or_default() < 0
        {
            return Err(Error::invalid("max_retries_failure, max_retries_preemption and max_task_failures must not be negative"));
        }
        if let Some(co) = &req.coscheduling {
            if co.group_by.trim().is_empty() {
                return Err(Error::invalid("coscheduling.group_by must not be empty"));
            }
        }
        let shape = iris_backend::JobShape {
            replicas: req.replicas() as u32,
            group_by: req.coscheduling.as_ref().map(|c| c.group_by.as_str()),
            gpus_per_task: gpu.max(0) as u32,
        };
        for b in self.backend_list() {
            b.check_job(&shape)
                .map_err(|why| Error::invalid(format!("Job {name} cannot run here: {why}")))?;
        }
        if req.bundle_blob().len() > MAX_BUNDLE_BYTES {
            return Err(Error::invalid(format!(
                "bundle_blob: {} bytes exceeds the {} MiB limit; exclude large files with --exclude",
                req.bundle_blob.unwrap_or_default().len(),
                MAX_BUNDLE_BYTES >> 20
            )));
        }
        for pc in &req.constraints {
            constraint_from_proto(pc).map_err(Error::invalid)?;
        }
        // Freshness gate: root jobs only (a parent's handoff was checked there).
        if name.is_root() && handoff.is_none() {
            check_revision_date(
                req.client_revision_date(),
                self.cfg.revision_date.as_deref(),
            )?;
        }
        // Auto device constraints.
        if dtype != "cpu" && !req.constraints.iter().any(|k| k.key() == "device-type") {
            req.constraints.push(eq_constraint("device-type", dtype));
        }
        if dtype != "cpu"
            && !variant.is_empty()
            && !variant.eq_ignore_ascii_case("auto")
            && !req.constraints.iter().any(|k| k.key() == "device-variant")
        {
            req.constraints.push(eq_constraint(
                "device-variant",
                &variant.to_ascii_lowercase(),
            ));
        }
        let t = now();
        let user = name.user().to_string();
        // Bundle: content-addressed under the state dir.
        if !req.bundle_blob().is_empty() {
            let sha = hex::encode(sha2::Sha256::digest(req.bundle_blob()));
            let path = self.cfg.state_dir.join("bundles").join(&sha);
            if !path.exists() {
                let tmp = path.with_extension("tmp");
                if let Err(e) = std::fs::write(&tmp, req.bundle_blob())
                    .and_then(|()| std::fs::rename(&tmp, &path))
                {
                    // A full disk leaves no partial bundle behind to take more of it.
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e.into());
                }
            }
            req.bundle_id = Some(sha);
            req.bundle_blob = None;
        } else if !req.bundle_id().is_empty()
            && (!valid_sha(req.bundle_id())
                || !self
                    .cfg
                    .state_dir
                    .join("bundles")
                    .join(req.bundle_id())
                    .exists())
        {
            return Err(Error::invalid(format!(
                "bundle_id '{}' is not a bundle this controller has; send bundle_blob instead",
                req.bundle_id()
            )));
        }
        let skip_band_ceiling = handoff.is_some()
            || (self.cfg.auth.is_some()
                && caller.is_admin()
                && matches!(
                    Band::from_code(req.priority_band.unwrap_or_default()),
                    Some(Band::System) | Some(Band::Production)
                ));
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.admissions
            .send(crate::Admission {
                name,
                req,
                user,
                t,
                skip_band_ceiling,
                submitting_user,
                reply,
            })
            .map_err(|_| Error::new(Code::Unavailable, "controller is shutting down"))?;
        rx.await
            .map_err(|_| Error::new(Code::Unavailable, "controller is shutting down"))?
    }

    /// Admits a batch of validated submissions in one transaction (group commit): one refusal
    /// never affects another, and all are acknowledged only after the commit.
    pub(crate) fn admit_batch(&self, batch: Vec<crate::Admission>) {
        // One failure for the whole batch: each caller gets the same id to look up.
        fn reject_all(batch: Vec<crate::Admission>, e: Error) {
            let wire = e.to_wire();
            for a in batch {
                let _ = a.reply.send(Err(Error::Rejected(wire.clone())));
            }
        }
        let started = std::time::Instant::now();
        let size = batch.len();
        let mut conn = self.writer(crate::WriterUse::Admission);
        // Under the writer's lock nothing else commits: the generation and the rows agree.
        let generation = iris_store::workers::generation();
        let workers = match self.feasibility_workers(&*conn, generation) {
            Ok(w) => w,
            Err(e) => return reject_all(batch, e),
        };
        let tx = match conn.begin() {
            Ok(tx) => tx,
            Err(e) => return reject_all(batch, e.into()),
        };
        // Each submission checks everything it can be refused for before it writes, so the
        // batch runs without a savepoint per submission (`Tx::attempt`). One that fails after
        // writing (an I/O or constraint error) rolls the batch back, and the batch runs again
        // with a savepoint each, so that one failure never costs the others their admission.
        let mut results = Vec::with_capacity(batch.len());
        let mut dirty = None;
        for a in &batch {
            match tx.attempt(|tx| self.admit(tx, a, &workers)) {
                Attempt::Done(v) => results.push(Ok(v)),
                Attempt::Refused(e) => results.push(Err(e)),
                Attempt::Dirty(e) => {
                    dirty = Some(e);
                    break;
                }
            }
        }
        let tx = match dirty {
            None => tx,
            Some(e) => {
                drop(tx);
                tracing::warn!(error = %e, "a submission failed after writing; admitting its batch again with a savepoint each");
                let tx = match conn.begin() {
                    Ok(tx) => tx,
                    Err(e) => return reject_all(batch, e.into()),
                };
                results = batch
                    .iter()
                    .map(|a| tx.savepoint(|tx| self.admit(tx, a, &workers)))
                    .collect();
                tx
            }
        };
        let committed = tx.commit().map_err(|e| Error::from(e).to_wire());
        self.metrics.admission_batch(size, started.elapsed());
        let mut any = false;
        for (a, r) in batch.into_iter().zip(results) {
            let reply = a.reply;
            let r = match (&committed, r) {
                (Err(e), _) => Err(Error::Rejected(e.clone())),
                (Ok(()), Ok((resp, spec))) => {
                    any = true;
                    tracing::info!(job = %resp.job_id, "job accepted");
                    if let Some((replaced, job_id, spec)) = spec {
                        if replaced {
                            self.forget_spec(&job_id);
                            self.forget_logs(&job_id);
                        }
                        lock(&self.specs).insert(job_id, spec);
                    }
                    Ok(resp)
                }
                (Ok(()), Err(e)) => Err(e),
            };
            let _ = reply.send(r);
        }
        if any {
            self.wake();
        }
    }

    /// One submission of a group commit. Everything it can be refused for is checked before
    /// its first write (`admit_batch` relies on it to run without a savepoint).
    #[allow(clippy::type_complexity)]
    fn admit(
        &self,
        tx: &Tx<'_>,
        a: &crate::Admission,
        workers: &[iris_scheduler::Worker],
    ) -> Result<(c::LaunchJobResponse, Option<(bool, String, Arc<JobSpec>)>)> {
        let name = &a.name;
        let mut req = a.req.clone();
        let user = &a.user;
        let (t, skip_band_ceiling, submitting_user) =
            (a.t, a.skip_band_ceiling, a.submitting_user.as_str());
        let res = req.resources.clone().unwrap_or_default();
        // Band resolution and authorization.
        let parent = name.parent();
        let parent_band = match &parent {
            Some(p) => {
                match iris_store::jobs::state_and_band(tx, p.as_str())? {
                    None => {
                        return Err(Error::precondition(format!(
                            "parent job {p} does not exist; submit the parent first or use a root name /<user>/<job>"
                        )))
                    }
                    Some((s, _)) if s.is_terminal() => {
                        return Err(Error::precondition(format!("parent job {p} has already finished")))
                    }
                    Some((_, b)) => Band::from_code(b),
                }
            }
            None => None,
        };
        let band = match req.priority_band.unwrap_or_default() {
            0 => parent_band.unwrap_or(Band::Interactive),
            code => Band::from_code(code).ok_or_else(|| {
                Error::invalid(format!(
                    "priority_band: unknown value {code}; use PRODUCTION=1, INTERACTIVE=2, BATCH=3 or SYSTEM=4"
                ))
            })?,
        };
        if !skip_band_ceiling
            && (parent.is_none() || parent_band.map(|pb| band.outranks(pb)).unwrap_or(true))
        {
            let max_band = iris_store::budgets::get(tx, user)?
                .and_then(|b| Band::from_code(b.max_band))
                .unwrap_or(self.cfg.budget_defaults.max_band);
            if band.outranks(max_band) {
                return Err(Error::new(
                    Code::PermissionDenied,
                    format!(
                        "priority {band} is above user {user}'s maximum band {max_band}; an admin can allow it with: iris user budget set {user} --max-band {band}"
                    ),
                ));
            }
        }
        req.priority_band = Some(band.code());
        // Feasibility, and where the job runs (here, or queued for a federation peer).
        let local = self.check_feasible(workers, name, &req);
        let route = self.classify_submit(name, &mut req, local, submitting_user)?;
        let handoff = req.federation.clone();
        // Existing job policy.
        let existing = iris_store::jobs::job_state_of(tx, name.as_str())?;
        if let (Some(f), Some(_)) = (&handoff, existing) {
            let h = iris_store::federation::handle(tx, name.as_str())?;
            match h {
                Some(h)
                    if h.direction == iris_store::federation::RECEIVED
                        && h.peer_id == f.requester_id =>
                {
                    if h.nonce == f.handoff_nonce {
                        // A redelivery of the same handoff: acknowledge it again.
                        return Ok((
                            c::LaunchJobResponse {
                                job_id: name.to_string(),
                            },
                            None,
                        ));
                    }
                }
                _ => {
                    return Err(Error::new(
                        Code::AlreadyExists,
                        format!(
                        "job {name} already exists on this cluster and was not handed over by {}",
                        f.requester_id
                    ),
                    ))
                }
            }
        }
        if let Some(st) = existing {
            let policy = ExistingJobPolicy::from_code(req.existing_job_policy.unwrap_or_default());
            match on_existing(policy, req.fail_if_exists.unwrap_or_default(), st) {
                OnExisting::Keep => {
                    return Ok((
                        c::LaunchJobResponse {
                            job_id: name.to_string(),
                        },
                        None,
                    ))
                }
                OnExisting::Refuse => {
                    return Err(Error::new(
                        Code::AlreadyExists,
                        format!("job {name} already exists and is {st}; cancel it first or choose another --job-name"),
                    ))
                }
                OnExisting::Replace => {}
            }
        }
        // Secrets are stored apart (`job_secrets`): never in the request or env columns. The
        // in-memory spec keeps them for dispatch.
        let secrets: Vec<(String, String)> = req
            .environment
            .as_ref()
            .map(|e| e.secrets.clone().into_iter().collect())
            .unwrap_or_default();
        let stripped;
        let stored: &c::LaunchJobRequest = if secrets.is_empty() {
            &req
        } else {
            let mut r = req.clone();
            if let Some(e) = r.environment.as_mut() {
                e.secrets.clear();
            }
            stripped = r;
            &stripped
        };
        let group_by = req.coscheduling.as_ref().map(|c| c.group_by.clone());
        let cfg = apply::JobConfigRow {
            res_cpu_millicores: res.cpu_millicores as i64,
            res_memory_bytes: res.memory_bytes,
            res_disk_bytes: res.disk_bytes,
            res_device_json: res
                .device
                .as_ref()
                .and_then(|d| serde_json::to_string(d).ok()),
            constraints_json: if req.constraints.is_empty() {
                None
            } else {
                serde_json::to_string(&req.constraints).ok()
            },
            coscheduling_group_by: group_by,
            scheduling_timeout_ms: req
                .scheduling_timeout
                .as_ref()
                .map(|d| d.milliseconds)
                .filter(|m| *m > 0),
            max_task_failures: req.max_task_failures() as i64,
            entrypoint_json: req.entrypoint.as_ref().and_then(|e| {
                let mut e = e.clone();
                e.workdir_files.clear();
                serde_json::to_string(&e).ok()
            }),
            environment_json: stored
                .environment
                .as_ref()
                .and_then(|e| serde_json::to_string(e).ok()),
            bundle_id: req.bundle_id.clone().filter(|b| !b.is_empty()),
            ports_json: serde_json::to_string(&req.ports).ok(),
            max_retries_failure: req.max_retries_failure() as i64,
            max_retries_preemption: req.max_retries_preemption() as i64,
            timeout_ms: req
                .timeout
                .as_ref()
                .map(|d| d.milliseconds)
                .filter(|m| *m > 0),
            preemption_policy: req.preemption_policy.unwrap_or_default(),
            existing_job_policy: req.existing_job_policy.unwrap_or_default(),
            priority_band: band.code(),
            task_image: req.task_image.clone().filter(|t| !t.is_empty()),
            submit_argv_json: serde_json::to_string(&req.submit_argv).ok(),
            request_blob: prost::Message::encode_to_vec(stored),
        };
        let new = apply::NewJob {
            job_id: name.to_string(),
            user_id: user.clone(),
            submitting_user: submitting_user.to_string(),
            parent_job_id: parent.as_ref().map(|p| p.to_string()),
            root_job_id: name.root_job().to_string(),
            depth: name.depth(),
            num_tasks: req.replicas() as u32,
            failed: None,
            cfg,
            workdir_files: Vec::new(),
            secrets,
            federated: match &route {
                crate::federation::Route::Queue(peer) => Some(peer.clone()),
                crate::federation::Route::Local => None,
            },
        };
        if let Some(st) = existing {
            if !st.is_terminal() {
                apply::kill_subtree(
                    tx,
                    name.as_str(),
                    "Replaced by a new submission",
                    "Parent job terminated",
                    t,
                )?;
            }
            apply::delete_job(tx, name.as_str())?;
        }
        apply::insert_job(tx, &new, t)?;
        {
            use iris_store::federation as sf;
            if let crate::federation::Route::Queue(peer) = &route {
                let nonce = crate::tick::new_uid() + &crate::tick::new_uid();
                sf::insert_handle(tx, name.as_str(), sf::SENT, peer, user, sf::QUEUED, &nonce)?;
            } else if let Some(f) = &handoff {
                let owner = if f.owner_principal.is_empty() {
                    user
                } else {
                    &f.owner_principal
                };
                sf::insert_handle(
                    tx,
                    name.as_str(),
                    sf::RECEIVED,
                    &f.requester_id,
                    owner,
                    sf::HANDED_OFF,
                    &f.handoff_nonce,
                )?;
                sf::append_changelog(tx, name.as_str(), &f.requester_id, None, false)?;
            }
        }
        let spec = Arc::new(JobSpec::from_request(req, band, user.clone(), name.depth()));
        Ok((
            c::LaunchJobResponse {
                job_id: name.to_string(),
            },
            Some((existing.is_some(), name.to_string(), spec)),
        ))
    }

    /// Workers (registered, plus declared scale groups) for the submit-time feasibility check.
    fn feasibility_workers(
        &self,
        conn: &impl iris_store::Read,
        generation: u64,
    ) -> Result<Arc<Vec<iris_scheduler::Worker>>> {
        let workers = self.placement_targets(conn, generation)?;
        if self.cfg.groups.is_empty() {
            return Ok(workers);
        }
        let mut workers = Vec::clone(&*workers);
        for g in &self.cfg.groups {
            for i in 0..g.max_workers.max(1) {
                workers.push(g.worker(format!("{}#{i}", g.name)));
            }
        }
        Ok(Arc::new(workers))
    }

    fn check_feasible(
        &self,
        workers: &[iris_scheduler::Worker],
        name: &JobName,
        req: &c::LaunchJobRequest,
    ) -> Result<()> {
        if workers.is_empty() {
            return Ok(());
        }
        // Every constraint was validated in `launch_job`; this list includes the automatic
        // device-type/device-variant ones added after that. Availability markers
        // (`--reserve`) are left out: they depend on which accelerators are up right now, and a
        // job asking for one waits until it can be found rather than being refused.
        let all: Vec<_> = req
            .constraints
            .iter()
            .filter_map(|pc| constraint_from_proto(pc).ok())
            .filter(|c| !c.key.starts_with(iris_types::AVAILABILITY_PREFIX))
            .collect();
        let res = crate::spec::resources_of(req.resources.as_ref());
        let group_by = req.coscheduling.as_ref().map(|c| c.group_by.as_str());
        iris_scheduler::feasible_anywhere(
            &res,
            &all,
            group_by,
            req.replicas().max(1) as u32,
            workers,
        )
        .map_err(|why| Error::precondition(format!("Job {name} is unschedulable: {why}")))
    }

    /// Elevated container profiles (DOCKER_ACCESS, PRIVILEGED) need an admin when auth is on;
    /// a task may ask for its own job's profile for a child (reference §2.4).
    fn authorize_container_profile(&self, name: &JobName, profile: i32) -> Result<()> {
        use job::ContainerProfile as P;
        let elevated = profile == P::DockerAccess as i32 || profile == P::Privileged as i32;
        if !elevated || self.cfg.auth.is_none() {
            return Ok(());
        }
        let caller = crate::auth::caller();
        if caller.is_admin() {
            return Ok(());
        }
        if caller.role == iris_auth::Role::Task {
            if let Some(parent) = name.parent() {
                let spec = self.spec(&*self.db(), parent.as_str())?;
                if spec.is_some_and(|s| s.request.container_profile.unwrap_or_default() == profile)
                {
                    return Ok(());
                }
            }
        }
        let label = P::try_from(profile)
            .map(|p| {
                p.as_str_name()
                    .trim_start_matches("CONTAINER_PROFILE_")
                    .to_ascii_lowercase()
            })
            .unwrap_or_default();
        Err(Error::denied(format!(
            "container_profile: {label} requires the admin role; submit with the default profile or ask an admin"
        )))
    }

    /// Auth rules for a submission (reference §2.4): non-admin root jobs are renamed to
    /// `/<caller>/<name>`; children need the parent's owner (a task token: its own job);
    /// SYSTEM and PRODUCTION need an admin, except a task's child at its parent's band.
    fn authorize_submission(&self, name: JobName, band_code: i32) -> Result<JobName> {
        if self.cfg.auth.is_none() {
            return Ok(name);
        }
        let caller = crate::auth::caller();
        if caller.is_admin() {
            return Ok(name);
        }
        let elevated = matches!(
            Band::from_code(band_code),
            Some(Band::System) | Some(Band::Production)
        );
        match (&caller.role, name.parent()) {
            (iris_auth::Role::Task, None) => Err(Error::new(
                Code::PermissionDenied,
                "a task token may only submit child jobs under its own job",
            )),
            (iris_auth::Role::Task, Some(parent)) => {
                crate::auth::check_owner(&caller, parent.as_str(), "submit a child of")?;
                Ok(name)
            }
            (_, parent) => {
                if elevated {
                    return Err(Error::new(
                        Code::PermissionDenied,
                        "submitting at priority system or production requires the admin role; use --priority interactive or batch",
                    ));
                }
                match parent {
                    Some(p) => {
                        crate::auth::check_owner(&caller, p.as_str(), "submit a child of")?;
                        Ok(name)
                    }
                    None if name.user() == caller.user_id => Ok(name),
                    None => {
                        let job = name
                            .as_str()
                            .trim_start_matches('/')
                            .split_once('/')
                            .map(|x| x.1)
                            .unwrap_or("");
                        JobName::root(&caller.user_id, job)
                            .map_err(|e| Error::invalid(format!("name: {e}")))
                    }
                }
            }
        }
    }
}

fn eq_constraint(key: &str, value: &str) -> job::Constraint {
    job::Constraint {
        key: Some(key.into()),
        op: Some(0),
        value: Some(job::AttributeValue {
            value: Some(job::attribute_value::Value::StringValue(value.into())),
        }),
        values: Vec::new(),
        mode: Some(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    /// A group commit runs its submissions without a savepoint each; one that fails after
    /// writing (here a task insert, made to fail) rolls the batch back, and the batch is
    /// admitted again with a savepoint each: the others are stored, the failed one not at all.
    #[tokio::test]
    async fn a_submission_that_fails_after_writing_costs_the_rest_of_its_batch_nothing() {
        let ctl = testutil::controller();
        iris_store::testing::fail_task_inserts(&ctl.db(), "poison").expect("inject");
        let mut replies = Vec::new();
        let batch: Vec<crate::Admission> = ["/alice/first", "/alice/poison", "/alice/last"]
            .iter()
            .map(|n| {
                let (reply, rx) = tokio::sync::oneshot::channel();
                replies.push(rx);
                crate::Admission {
                    name: JobName::parse(n).expect("name"),
                    req: testutil::request(n, 2, 100),
                    user: "alice".into(),
                    t: now(),
                    skip_band_ceiling: false,
                    submitting_user: "alice".into(),
                    reply,
                }
            })
            .collect();
        ctl.admit_batch(batch);
        let mut answers = Vec::new();
        for rx in replies {
            answers.push(rx.await.expect("answered"));
        }
        assert!(answers[0].is_ok() && answers[2].is_ok());
        let refused = answers[1]
            .as_ref()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("injected failure"), "{refused}");
        assert_eq!(testutil::job_state(&ctl, "/alice/first"), JobState::Pending);
        assert_eq!(testutil::job_state(&ctl, "/alice/last"), JobState::Pending);
        let conn = ctl.db();
        assert_eq!(
            iris_store::jobs::job_state_of(&*conn, "/alice/poison").expect("read"),
            None
        );
        assert!(!iris_store::jobs::has_tasks(&*conn, "/alice/poison").expect("read"));
        for stored in ["/alice/first", "/alice/last"] {
            assert!(iris_store::jobs::has_tasks(&*conn, stored).expect("read"));
        }
    }

    #[test]
    fn existing_job_policy() {
        use ExistingJobPolicy as P;
        use OnExisting as O;
        let (run, done) = (JobState::Running, JobState::Succeeded);
        assert_eq!(on_existing(P::Unspecified, false, run), O::Refuse);
        assert_eq!(on_existing(P::Unspecified, false, done), O::Replace);
        assert_eq!(on_existing(P::Unspecified, true, done), O::Refuse);
        assert_eq!(on_existing(P::Error, false, done), O::Refuse);
        assert_eq!(on_existing(P::Keep, false, run), O::Keep);
        assert_eq!(on_existing(P::Keep, true, run), O::Keep);
        assert_eq!(on_existing(P::Keep, false, done), O::Replace);
        assert_eq!(on_existing(P::Recreate, false, run), O::Replace);
        assert_eq!(on_existing(P::Recreate, true, run), O::Refuse);
    }

    #[test]
    fn freshness_gate() {
        assert!(check_revision_date("", Some("2026-10-24")).is_ok());
        assert!(check_revision_date("2026-10-24", Some("2026-10-24")).is_ok());
        assert!(check_revision_date("2026-10-10", Some("2026-10-24")).is_ok());
        let e = check_revision_date("2026-10-09", Some("2026-10-24"))
            .expect_err("too old")
            .to_wire();
        assert_eq!(e.code, Code::FailedPrecondition);
        assert!(e.message.contains("too old"));
        assert_eq!(
            check_revision_date("yesterday", Some("2026-10-24"))
                .expect_err("bad")
                .to_wire()
                .code,
            Code::InvalidArgument
        );
        assert!(check_revision_date("2020-01-01", None).is_ok());
    }
}
