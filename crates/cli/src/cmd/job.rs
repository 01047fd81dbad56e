//! `iris job ...`: submitting jobs (`run`, including turning the flags into a
//! `LaunchJobRequest` in [`build_launch`]), listing, describing, cancelling, completing and
//! waiting on them, and streaming a job's logs until it ends.

use super::bulk_ids;
use super::logs::logs;
use crate::client::{call, controller_client, fetch_logs};
use crate::{output, workspace, JobCmd, RunArgs};
use anyhow::bail;
use iris_proto::cluster::controller as c;
use iris_proto::finelog::logging as fl;
use iris_proto::job;
use iris_rpc::{Client, Code};
use std::time::Duration;

fn resolve_user(flag: &Option<String>) -> anyhow::Result<String> {
    let raw = flag
        .clone()
        .or_else(|| std::env::var("IRIS_USER").ok())
        .or_else(|| {
            std::env::var("IRIS_TASK_ID")
                .ok()
                .and_then(|t| t.split('/').nth(1).map(|s| s.to_string()))
        })
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "root".into());
    iris_types::ids::validate_user(&raw).map_err(anyhow::Error::msg)
}

/// `--priority system` needs `--system-reason` naming hero, finelog or iris (as whole words);
/// `--system-reason` with any other priority is a usage error.
fn check_system_reason(band: i32, reason: Option<&str>) -> anyhow::Result<()> {
    let system = band == iris_types::Band::System.code();
    match (system, reason) {
        (false, Some(_)) => bail!("--system-reason is only valid with --priority system"),
        (false, None) => Ok(()),
        (true, None) => bail!("--priority system requires --system-reason (say why: hero run, finelog or iris infrastructure)"),
        (true, Some(r)) => {
            let words: Vec<String> = r
                .split(|c: char| !c.is_ascii_alphanumeric())
                .map(|w| w.to_ascii_lowercase())
                .collect();
            if words.iter().any(|w| w == "hero" || w == "finelog" || w == "iris") {
                Ok(())
            } else {
                bail!("--system-reason '{r}' must mention hero, finelog or iris")
            }
        }
    }
}

fn constraint(key: &str, op: i32, values: &[&str], mode: i32) -> job::Constraint {
    let v = |s: &str| job::AttributeValue {
        value: Some(job::attribute_value::Value::StringValue(s.to_string())),
    };
    job::Constraint {
        key: Some(key.into()),
        op: Some(op),
        value: if op == 8 {
            None
        } else {
            values.first().map(|s| v(s))
        },
        values: if op == 8 {
            values.iter().map(|s| v(s)).collect()
        } else {
            Vec::new()
        },
        mode: Some(mode),
    }
}

/// `--reserve [COUNT:]DEVICE` as its hard `availability:<variant>` marker key: a TPU variant
/// (`v5litepod-16`, `v4-8`) as it is, else a GPU spec's variant (`H100x8` → `h100`).
fn reserve_key(spec: &str) -> anyhow::Result<String> {
    let device = spec.split_once(':').map(|x| x.1).unwrap_or(spec).trim();
    let b = device.as_bytes();
    let tpu = b.len() > 2
        && b[0].eq_ignore_ascii_case(&b'v')
        && b[1].is_ascii_digit()
        && device.contains('-');
    let variant = if tpu {
        device.to_string()
    } else {
        iris_types::resources::parse_gpu(device)
            .map_err(|_| anyhow::anyhow!("--reserve '{spec}': expected [COUNT:]DEVICE naming an accelerator, e.g. 4:H100x8 or v5litepod-16"))?
            .variant
    };
    // "auto" (a bare count) names no variant.
    if variant.trim().is_empty() || variant.eq_ignore_ascii_case("auto") {
        bail!("--reserve '{spec}' does not name an accelerator variant; name one, e.g. H100x8");
    }
    Ok(iris_types::availability_key(&variant))
}

/// As the published CLI: accelerators, >= 4 GB of memory or >= 10 GB of disk on a job need
/// `--enable-extra-resources` (they usually belong on the tasks an entrypoint job spawns, not
/// on the entrypoint). Unparsable sizes are left to the size parser's own error.
fn check_extra_resources(a: &RunArgs) -> anyhow::Result<()> {
    if a.enable_extra_resources {
        return Ok(());
    }
    const HINT: &str = "the top-level entrypoint job usually needs only modest CPU/RAM/disk to schedule and dispatch work; accelerators and large resources belong on the tasks it spawns. If this request is intentional, pass --enable-extra-resources";
    if a.tpu.is_some() {
        bail!("--tpu requires --enable-extra-resources: {HINT}");
    }
    if a.gpu.is_some() {
        bail!("--gpu requires --enable-extra-resources: {HINT}");
    }
    let size = |s: &str| published_size(s).unwrap_or(0.0);
    if size(&a.memory) >= 4e9 {
        bail!(
            "--memory {} (>= 4 GB) requires --enable-extra-resources: {HINT}",
            a.memory
        );
    }
    if size(&a.disk) >= 10e9 {
        bail!(
            "--disk {} (>= 10 GB) requires --enable-extra-resources: {HINT}",
            a.disk
        );
    }
    Ok(())
}

/// A size as the published CLI reads it for this check (humanfriendly: `GB` is 10^9, `GiB`
/// 2^30), so a request is refused exactly when the published CLI refuses it.
fn published_size(s: &str) -> Option<f64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(n * mult)
}

/// The coscheduling level of a `replicas`-pod gang of `variant`x`count` GPUs: `leafgroup` for
/// H100 and other non-NVL72 GPUs; for GB200/GB300, `nvlink.domain` up to one rack's schedulable
/// nodes and `nvlink.domain.sliced` beyond, refused here when the gang cannot split into rack
/// slices (the published CLI's rule, `iris_kube_model::topology::gang_level`).
fn gpu_gang_level(variant: &str, count: i32, replicas: i64) -> anyhow::Result<String> {
    let n = u32::try_from(replicas).unwrap_or(u32::MAX);
    iris_kube_model::topology::gang_level(variant, n, u32::try_from(count).unwrap_or(0))
        .map(|level| level.as_str().to_string())
        .map_err(|e| anyhow::anyhow!("--replicas {replicas} for {variant}: {e}"))
}

fn build_launch(a: &RunArgs) -> anyhow::Result<c::LaunchJobRequest> {
    check_extra_resources(a)?;
    let user = resolve_user(&a.user)?;
    let cpu =
        iris_types::resources::parse_cpu(&a.cpu).map_err(|e| anyhow::anyhow!("--cpu: {e}"))?;
    let memory = iris_types::resources::parse_bytes(&a.memory)
        .map_err(|e| anyhow::anyhow!("--memory: {e}"))?;
    let disk =
        iris_types::resources::parse_bytes(&a.disk).map_err(|e| anyhow::anyhow!("--disk: {e}"))?;
    if a.replicas < 1 || a.replicas > 10_000 {
        bail!("--replicas: {} is out of range; use 1 to 10000", a.replicas);
    }
    if a.timeout < 0 {
        bail!("--timeout: must not be negative (0 = no timeout)");
    }
    if a.max_retries < 0 {
        bail!("--max-retries: must not be negative");
    }
    if !(0..=i32::MAX as i64).contains(&a.max_retries_preemption) {
        bail!(
            "--max-retries-preemption: must be between 0 and {}",
            i32::MAX
        );
    }
    let band = match &a.priority {
        Some(p) => iris_types::Band::parse(p)
            .map_err(|e| anyhow::anyhow!("--priority: {e}"))?
            .code(),
        None => 0,
    };
    check_system_reason(band, a.system_reason.as_deref())?;
    if !a.env.len().is_multiple_of(2) {
        bail!(
            "-e/--env-vars takes KEY VALUE pairs: missing the value for '{}'; pass -e {} VALUE",
            a.env.last().map(String::as_str).unwrap_or(""),
            a.env.last().map(String::as_str).unwrap_or("KEY")
        );
    }
    let mut env_vars = std::collections::BTreeMap::new();
    for kv in a.env.chunks(2) {
        if kv[0].is_empty() || kv[0].contains('=') {
            bail!("-e: invalid variable name '{}'", kv[0]);
        }
        env_vars.insert(kv[0].clone(), kv[1].clone());
    }
    let mut device = job::DeviceConfig {
        device: Some(job::device_config::Device::Cpu(job::CpuDevice {
            variant: "cpu".into(),
        })),
    };
    let mut cpu = cpu;
    let mut accel = false;
    let mut auto_group_by = None;
    if let Some(g) = &a.gpu {
        let s = iris_types::resources::parse_gpu(g).map_err(anyhow::Error::msg)?;
        if a.replicas > 1 && a.tpu.is_none() && a.group_by.is_none() {
            auto_group_by = Some(gpu_gang_level(&s.variant, s.count, a.replicas)?);
        }
        device = job::DeviceConfig {
            device: Some(job::device_config::Device::Gpu(job::GpuDevice {
                variant: s.variant,
                count: s.count,
            })),
        };
        accel = true;
    }
    if let Some(t) = &a.tpu {
        device = job::DeviceConfig {
            device: Some(job::device_config::Device::Tpu(job::TpuDevice {
                variant: t.clone(),
                topology: String::new(),
                count: 4,
            })),
        };
        accel = true;
    }
    if accel {
        cpu = cpu.max(4000);
    }
    let mut constraints = Vec::new();
    match a.region.len() {
        0 => {}
        1 => constraints.push(constraint("region", 0, &[a.region[0].as_str()], 0)),
        _ => constraints.push(constraint(
            "region",
            8,
            &a.region.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            0,
        )),
    }
    if let Some(z) = &a.zone {
        constraints.push(constraint("zone", 0, &[z.as_str()], 0));
    }
    if let Some(t) = &a.target_cluster {
        if t.trim().is_empty() {
            anyhow::bail!(
                "--target-cluster: name a federation peer (see `iris rpc controller list-peers`)"
            );
        }
        constraints.push(constraint("cluster", 0, &[t.trim()], 0));
    }
    if a.preemptible {
        constraints.push(constraint("preemptible", 0, &["true"], 1));
    } else if a.no_preemptible || (!accel && a.replicas == 1 && cpu <= 1000 && memory <= 4 << 30) {
        constraints.push(constraint("preemptible", 0, &["false"], 0));
    }
    for spec in &a.reserve {
        constraints.push(constraint(&reserve_key(spec)?, 2, &[], 0));
    }
    for kv in &a.constraint {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--constraint '{kv}': expected KEY=VALUE"))?;
        constraints.push(constraint(k, 0, &[v], 0));
    }
    let name = match &a.job_name {
        Some(n) => {
            if n.contains('/') || n.trim().is_empty() {
                bail!("--job-name '{n}': must be a single non-empty component without '/'");
            }
            n.clone()
        }
        None => {
            let stem = a
                .command
                .iter()
                .find(|x| x.ends_with(".py"))
                .and_then(|p| {
                    std::path::Path::new(p)
                        .file_stem()
                        .map(|s| s.to_string_lossy().to_string())
                })
                .unwrap_or_else(|| "job".into());
            format!(
                "iris-run-{stem}-{}",
                chrono::Utc::now().format("%Y%m%d-%H%M%S")
            )
        }
    };
    let full = match std::env::var("IRIS_TASK_ID") {
        Ok(t) => {
            let job = t.rsplit_once(':').map(|x| x.0).unwrap_or(&t);
            let job = job.rsplit_once('/').map(|x| x.0).unwrap_or(job);
            format!("{job}/{name}")
        }
        Err(_) => format!("/{user}/{name}"),
    };
    iris_types::JobName::parse(&full).map_err(|e| anyhow::anyhow!("job name: {e}"))?;
    // An explicit --group-by wins; a multi-replica GPU job otherwise coschedules at the level
    // its variant implies, as the published CLI sets it.
    let coscheduling = a
        .group_by
        .clone()
        .or(auto_group_by)
        .map(|group_by| job::CoschedulingConfig { group_by });
    let container_profile = match &a.container_profile {
        Some(p) => enum_named::<job::ContainerProfile>(
            "--container-profile",
            "CONTAINER_PROFILE_",
            p,
            job::ContainerProfile::from_str_name,
        )?,
        None => 0,
    };
    let egress_policy = match &a.egress_policy {
        Some(p) => enum_named::<job::EgressPolicy>(
            "--egress-policy",
            "EGRESS_POLICY_",
            p,
            job::EgressPolicy::from_str_name,
        )?,
        None => 0,
    };
    let (setup_scripts, setup_commands) =
        crate::setup_scripts::for_submission(a.no_sync, &a.extras, &a.sync_packages)?;
    Ok(c::LaunchJobRequest {
        name: Some(full),
        entrypoint: Some(job::RuntimeEntrypoint {
            setup_commands,
            run_command: Some(job::CommandEntrypoint {
                argv: a.command.clone(),
            }),
            workdir_files: Default::default(),
            workdir_file_refs: Default::default(),
        }),
        resources: Some(job::ResourceSpecProto {
            cpu_millicores: cpu,
            memory_bytes: memory,
            disk_bytes: disk,
            device: Some(device),
        }),
        environment: Some(job::EnvironmentConfig {
            env_vars,
            secrets: crate::secrets::for_submission(&a.secrets, &a.secret_behavior)?
                .into_iter()
                .collect(),
            setup_scripts,
        }),
        replicas: Some(a.replicas as i32),
        max_retries_failure: Some(a.max_retries as i32),
        max_task_failures: Some(a.max_retries as i32),
        max_retries_preemption: Some(a.max_retries_preemption as i32),
        constraints,
        coscheduling,
        timeout: (a.timeout > 0).then_some(iris_proto::time::Duration {
            milliseconds: a.timeout * 1000,
        }),
        priority_band: Some(band),
        submit_argv: std::env::args().collect(),
        task_image: Some(a.task_image.clone().unwrap_or_default()),
        container_profile: Some(container_profile),
        egress_policy: Some(egress_policy),
        ..Default::default()
    })
}

pub(crate) async fn run(j: JobCmd, url: Option<String>) -> anyhow::Result<i32> {
    match j {
        JobCmd::Run(a) => {
            let mut req = build_launch(&a)?;
            let cl = controller_client(&url)?;
            if !a.no_bundle {
                let cwd = std::env::current_dir()?;
                let (zip, n) = workspace::bundle(&cwd, &a.include, &a.exclude)?;
                eprintln!(
                    "Bundled {n} files from {} ({} bytes)",
                    cwd.display(),
                    zip.len()
                );
                req.bundle_blob = Some(zip);
            }
            let r: c::LaunchJobResponse = call(&cl, "LaunchJob", &req).await?;
            if a.no_wait {
                println!("{}", r.job_id);
                return Ok(0);
            }
            eprintln!("Submitted {}", r.job_id);
            stream_until_done(&cl, &r.job_id, !a.no_cancel_on_exit).await
        }
        JobCmd::List {
            state,
            prefix,
            limit,
        } => {
            let cl = controller_client(&url)?;
            let mut jobs = Vec::new();
            let mut offset = 0;
            // Offsets stop at 5,000 (as the reference's do): a longer listing pages by token,
            // which only this controller issues, so a short one stays plain for any controller.
            let mut token = (limit > 5000).then(String::new);
            loop {
                let q = c::JobQuery {
                    state_filter: state.clone().unwrap_or_default(),
                    job_id_prefix: prefix.clone().unwrap_or_default(),
                    offset: if token.is_some() { 0 } else { offset },
                    limit: limit.clamp(1, 500),
                    page_token: token.clone(),
                    ..Default::default()
                };
                let r: c::ListJobsResponse =
                    call(&cl, "ListJobs", &c::ListJobsRequest { query: Some(q) }).await?;
                offset += r.jobs.len() as i32;
                let mut more = r.has_more();
                if token.is_some() {
                    token = r.next_page_token.clone();
                    more = more && token.is_some();
                }
                jobs.extend(r.jobs);
                if !more || jobs.len() as i32 >= limit {
                    break;
                }
            }
            jobs.truncate(limit.max(0) as usize);
            output::print_jobs(&jobs);
            Ok(0)
        }
        JobCmd::Describe { job_id } => {
            let cl = controller_client(&url)?;
            let s: c::GetJobStatusResponse = call(
                &cl,
                "GetJobStatus",
                &c::GetJobStatusRequest {
                    job_id: job_id.clone(),
                },
            )
            .await?;
            let t: c::ListTasksResponse =
                call(&cl, "ListTasks", &c::ListTasksRequest { job_id }).await?;
            output::print_job(&s.job.unwrap_or_default(), &t.tasks);
            Ok(0)
        }
        JobCmd::Logs(l) => {
            let cl = controller_client(&url)?;
            let src = format!("{}/", l.target.trim_end_matches('/'));
            logs(&cl, &l, &src, 2, Some(&l.target)).await
        }
        JobCmd::Cancel(b) => {
            let cl = controller_client(&url)?;
            let ids = bulk_ids(&b)?;
            let mut targets = Vec::new();
            for id in ids {
                if b.prefix {
                    let q = c::JobQuery {
                        job_id_prefix: id,
                        limit: 500,
                        ..Default::default()
                    };
                    let r: c::ListJobsResponse =
                        call(&cl, "ListJobs", &c::ListJobsRequest { query: Some(q) }).await?;
                    targets.extend(
                        r.jobs
                            .into_iter()
                            .filter(|j| !(4..=8).contains(&j.state.unwrap_or_default()))
                            .map(|j| j.job_id.unwrap_or_default()),
                    );
                } else {
                    targets.push(id);
                }
            }
            let mut failed = 0;
            for t in targets {
                if b.dry_run {
                    println!("Would cancel {t}");
                    continue;
                }
                match call::<_, job::Empty>(
                    &cl,
                    "TerminateJob",
                    &c::TerminateJobRequest { job_id: t.clone() },
                )
                .await
                {
                    Ok(_) => println!("Cancelled {t}"),
                    Err(e) if e.code == Code::NotFound => {
                        eprintln!("error: job {t} not found");
                        failed += 1;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(if failed > 0 { 1 } else { 0 })
        }
        JobCmd::Complete { job_id } => {
            let cl = controller_client(&url)?;
            let _: job::Empty = call(
                &cl,
                "CompleteJob",
                &c::CompleteJobRequest {
                    job_id: job_id.clone(),
                },
            )
            .await?;
            println!("Completed {job_id}");
            Ok(0)
        }
        JobCmd::Wait { job_id } => {
            let cl = controller_client(&url)?;
            let st = wait_terminal(&cl, &job_id).await?;
            let name = iris_types::JobState::from_code(st)
                .map(|s| s.friendly())
                .unwrap_or("unknown");
            println!("{name}");
            Ok(if st == 4 { 0 } else { 1 })
        }
        JobCmd::Summary { job_id, json } => {
            let cl = controller_client(&url)?;
            let s: c::GetJobStatusResponse = call(
                &cl,
                "GetJobStatus",
                &c::GetJobStatusRequest {
                    job_id: job_id.clone(),
                },
            )
            .await?;
            let t: c::ListTasksResponse =
                call(&cl, "ListTasks", &c::ListTasksRequest { job_id }).await?;
            let v = output::summary_json(&s.job.unwrap_or_default(), &t.tasks);
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{v}");
            }
            Ok(0)
        }
    }
}

async fn wait_terminal(cl: &Client, job_id: &str) -> anyhow::Result<i32> {
    let mut delay = Duration::from_millis(50);
    loop {
        let r: c::GetJobStateResponse = call(
            cl,
            "GetJobState",
            &c::GetJobStateRequest {
                job_ids: vec![job_id.to_string()],
            },
        )
        .await?;
        match r.states.get(job_id) {
            None => bail!("job {job_id} not found"),
            Some(s) if (4..=8).contains(s) => return Ok(*s),
            Some(_) => {}
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

async fn stream_until_done(
    cl: &Client,
    job_id: &str,
    cancel_on_ctrl_c: bool,
) -> anyhow::Result<i32> {
    let src = format!("{job_id}/");
    let mut cursor = 0i64;
    let mut delay = Duration::from_millis(50);
    let mut ctrl_c = Box::pin(tokio::signal::ctrl_c());
    loop {
        let st: c::GetJobStateResponse = call(
            cl,
            "GetJobState",
            &c::GetJobStateRequest {
                job_ids: vec![job_id.to_string()],
            },
        )
        .await?;
        let state = st.states.get(job_id).copied().unwrap_or(0);
        let terminal = (4..=8).contains(&state);
        loop {
            let r: fl::FetchLogsResponse = fetch_logs(
                cl,
                &fl::FetchLogsRequest {
                    source: src.clone(),
                    match_scope: 2,
                    cursor,
                    max_lines: 1000,
                    ..Default::default()
                },
            )
            .await?;
            for e in &r.entries {
                eprintln!("task={} | {}", e.key(), e.data());
            }
            let got = r.entries.len();
            cursor = r.cursor;
            if got < 1000 {
                if got > 0 {
                    delay = Duration::from_millis(50);
                }
                break;
            }
        }
        if terminal {
            let s: c::GetJobStatusResponse = call(
                cl,
                "GetJobStatus",
                &c::GetJobStatusRequest {
                    job_id: job_id.to_string(),
                },
            )
            .await?;
            let j = s.job.unwrap_or_default();
            let name = iris_types::JobState::from_code(state)
                .map(|s| s.friendly())
                .unwrap_or("unknown");
            if j.error().is_empty() {
                eprintln!("Job {job_id} {name}");
            } else {
                eprintln!("Job {job_id} {name}: {}", j.error());
            }
            return Ok(if state == 4 { 0 } else { 1 });
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = &mut ctrl_c, if cancel_on_ctrl_c => {
                eprintln!("Interrupted: cancelling {job_id}");
                let _: Result<job::Empty, _> = call(cl, "TerminateJob", &c::TerminateJobRequest { job_id: job_id.to_string() }).await;
                return Ok(130);
            }
        }
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// Streams a sample job's logs to stdout until it ends.
pub(crate) async fn stream_sample(cl: &Client, job_id: &str) -> anyhow::Result<i32> {
    let code = stream_until_done(cl, job_id, false).await?;
    Ok(code)
}

/// A proto enum value from its name, with or without the prefix, in any case.
fn enum_named<E: Into<i32>>(
    flag: &str,
    prefix: &str,
    given: &str,
    from_name: fn(&str) -> Option<E>,
) -> anyhow::Result<i32> {
    let upper = given.trim().to_ascii_uppercase();
    let full = if upper.starts_with(prefix) {
        upper
    } else {
        format!("{prefix}{upper}")
    };
    match from_name(&full) {
        Some(v) if !full.ends_with("_UNSPECIFIED") => Ok(v.into()),
        _ => anyhow::bail!(
            "{flag} {given}: unknown value; see `iris job run --help` for the choices"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_replica_gpu_job_gets_the_published_clis_gang_level() {
        assert_eq!(
            gpu_gang_level("H100", 8, 4).ok().as_deref(),
            Some("leafgroup")
        );
        assert_eq!(
            gpu_gang_level("GB200", 4, 16).ok().as_deref(),
            Some("nvlink.domain")
        );
        assert_eq!(
            gpu_gang_level("GB300", 4, 32).ok().as_deref(),
            Some("nvlink.domain.sliced")
        );
        let e = gpu_gang_level("GB200", 4, 72).map_err(|e| e.to_string());
        assert_eq!(
            e.err().as_deref().map(|e| e.starts_with(
                "--replicas 72 for GB200: 72 nodes do not divide evenly across 5 racks"
            )),
            Some(true)
        );
        let e = gpu_gang_level("GB200", 2, 32).map_err(|e| e.to_string());
        assert!(e.is_err_and(|e| e.contains("4 GPUs each); got 2")));
    }

    #[test]
    fn sizes_are_read_as_the_published_cli_reads_them() {
        assert_eq!(super::published_size("4GB"), Some(4e9));
        assert_eq!(super::published_size("3.9GB"), Some(3.9e9));
        assert_eq!(super::published_size("1GiB"), Some(1073741824.0));
        assert_eq!(super::published_size("lots"), None);
    }

    #[test]
    fn reserve_names_the_variant_and_ignores_the_count() {
        assert_eq!(
            super::reserve_key("4:H100x8").expect("gpu"),
            "availability:h100"
        );
        assert_eq!(
            super::reserve_key("H100").expect("gpu"),
            "availability:h100"
        );
        assert_eq!(
            super::reserve_key("v5litepod-16").expect("tpu"),
            "availability:v5litepod-16"
        );
        let e = super::reserve_key("8").expect_err("no variant").to_string();
        assert!(e.contains("--reserve") && e.contains("variant"), "{e}");
    }

    #[test]
    fn system_reason_rules() {
        let sys = iris_types::Band::System.code();
        assert!(check_system_reason(sys, None).is_err());
        assert!(check_system_reason(sys, Some("urgent")).is_err());
        assert!(check_system_reason(sys, Some("heroic")).is_err());
        assert!(check_system_reason(sys, Some("Hero run for the paper")).is_ok());
        assert!(check_system_reason(sys, Some("iris: log server")).is_ok());
        assert!(check_system_reason(2, Some("hero")).is_err());
        assert!(check_system_reason(2, None).is_ok());
    }
}
