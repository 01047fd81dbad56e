//! `iris process ...`: the controller's, a worker's or a task's process (`--target`): its host
//! and resource facts (`status`), the daemons' own recent log lines (`logs`) and profiles
//! (`profile`, also behind `iris task profile` and `iris attempt profile`). Output matches the
//! published CLI's: the same lines, and a profile lands in the same file.

use crate::client::{call, fetch_logs, SVC};
use clap::{Args, Subcommand};
use iris_proto::finelog::logging as fl;
use iris_proto::job;
use iris_rpc::Client;
use std::time::Duration;

/// What `--target` defaults to for a profile: the process answering (the controller).
pub(crate) const SELF_TARGET: &str = "/system/process";
const CONTROLLER_LOGS: &str = "/system/controller";

#[derive(Subcommand)]
pub(crate) enum ProcessCmd {
    /// Show a process's host and resource facts (default: the controller).
    Status {
        /// /system/worker/<id> for a worker, /user/job/0 for a task (default: the controller).
        #[arg(short, long)]
        target: Option<String>,
    },
    /// The controller's (or a worker's) own recent log lines; task output is `iris task logs`.
    Logs {
        /// /system/worker/<id> for a worker (default: the controller).
        #[arg(short, long)]
        target: Option<String>,
        /// Minimum level: DEBUG, INFO, WARNING, ERROR or CRITICAL.
        #[arg(long, default_value = "")]
        level: String,
        /// Keep printing new lines.
        #[arg(short, long)]
        follow: bool,
        #[arg(long, default_value_t = 200)]
        max_lines: i32,
        /// Only lines containing this.
        #[arg(long, default_value = "")]
        substring: String,
    },
    /// Profile the controller, a worker (/system/worker/<id>) or a task (/user/job/0).
    Profile {
        #[arg(short, long)]
        target: Option<String>,
        #[command(flatten)]
        profile: ProfileArgs,
    },
}

/// The profile options `iris process|task|attempt profile` share.
#[derive(Args)]
pub(crate) struct ProfileArgs {
    #[arg(value_parser = ["threads", "cpu", "mem"])]
    profiler: String,
    /// Sampling time in seconds (cpu, mem).
    #[arg(short, long, default_value_t = 10)]
    duration: i32,
    /// Write the profile here (default: threads are printed; cpu and mem go to
    /// profile-<kind>-<target>.speedscope.json / .html).
    #[arg(short, long)]
    output: Option<std::path::PathBuf>,
    /// Include local variables in a thread dump.
    #[arg(long)]
    locals: bool,
    /// Include native frames in a thread dump.
    #[arg(long)]
    native: bool,
}

pub(crate) async fn run(p: ProcessCmd, url: Option<String>) -> anyhow::Result<i32> {
    let cl = crate::client::controller_client(&url)?;
    match p {
        ProcessCmd::Status { target } => {
            let r: job::GetProcessStatusResponse = call(
                &cl,
                "GetProcessStatus",
                &job::GetProcessStatusRequest {
                    max_log_lines: 0,
                    target: target.clone().unwrap_or_default(),
                    ..Default::default()
                },
            )
            .await?;
            let label = target.unwrap_or_else(|| "Controller".into());
            print_status(&r.process_info.unwrap_or_default(), &label);
            Ok(0)
        }
        ProcessCmd::Logs {
            target,
            level,
            follow,
            max_lines,
            substring,
        } => {
            let source = target.unwrap_or_else(|| CONTROLLER_LOGS.into());
            logs(&cl, source, level, follow, max_lines, substring).await
        }
        ProcessCmd::Profile { target, profile } => {
            run_profile(&cl, target.unwrap_or_else(|| SELF_TARGET.into()), &profile).await
        }
    }
}

async fn logs(
    cl: &Client,
    source: String,
    min_level: String,
    follow: bool,
    max_lines: i32,
    substring: String,
) -> anyhow::Result<i32> {
    let mut cursor = 0;
    let mut first = true;
    loop {
        let r = fetch_logs(
            cl,
            &fl::FetchLogsRequest {
                source: source.clone(),
                match_scope: 1,
                max_lines: if first { max_lines } else { 100 },
                tail: first,
                min_level: min_level.clone(),
                cursor,
                substring: substring.clone(),
                ..Default::default()
            },
        )
        .await?;
        for e in &r.entries {
            let ts = e
                .timestamp
                .as_ref()
                .filter(|t| t.epoch_ms > 0)
                .and_then(|t| chrono::DateTime::from_timestamp_millis(t.epoch_ms))
                .map(|d| d.format("%H:%M:%S").to_string())
                .unwrap_or_default();
            println!("[{ts}] {}", e.data());
        }
        cursor = r.cursor;
        first = false;
        if !follow {
            return Ok(0);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// `humanfriendly.format_timespan`-style: "3 minutes and 4.5 seconds".
fn timespan(ms: i64) -> String {
    let secs = ms as f64 / 1000.0;
    if secs < 60.0 {
        return plural(trim(secs), "second");
    }
    let mut rest = ms / 1000;
    let mut parts = Vec::new();
    for (unit, size) in [
        ("week", 604_800),
        ("day", 86_400),
        ("hour", 3600),
        ("minute", 60),
    ] {
        if rest >= size {
            parts.push(plural(format!("{}", rest / size), unit));
            rest %= size;
        }
    }
    if rest > 0 {
        parts.push(plural(format!("{rest}"), "second"));
    }
    match parts.split_last() {
        Some((last, init)) if !init.is_empty() => format!("{} and {last}", init.join(", ")),
        _ => parts.join(""),
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn plural(n: String, unit: &str) -> String {
    if n == "1" {
        format!("1 {unit}")
    } else {
        format!("{n} {unit}s")
    }
}

/// `humanfriendly.format_size(binary=True)`-style: "12.5 MiB".
fn size(bytes: i64) -> String {
    let units = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    if v < 1024.0 {
        return plural(format!("{bytes}"), "byte");
    }
    let mut unit = units[0];
    for u in units {
        unit = u;
        v /= 1024.0;
        if v < 1024.0 {
            break;
        }
    }
    format!("{} {unit}", trim(v))
}

fn print_status(info: &job::ProcessInfo, label: &str) {
    println!("=== {label} Process Status ===");
    println!("Hostname:        {}", info.hostname);
    println!("PID:             {}", info.pid);
    println!("Python:          {}", info.python_version);
    println!("Uptime:          {}", timespan(info.uptime_ms));
    println!(
        "CPU:             {} cores ({}m)",
        trim(f64::from(info.cpu_millicores) / 1000.0),
        info.cpu_millicores
    );
    println!("Memory RSS:      {}", size(info.memory_rss_bytes));
    println!("Memory VMS:      {}", size(info.memory_vms_bytes));
    println!("Memory Total:    {}", size(info.memory_total_bytes));
    println!("Threads:         {}", info.thread_count);
    println!("Open FDs:        {}", info.open_fd_count);
}

/// `ProfileTask` for `target`; the profile is printed (threads) or written where the published
/// CLI writes it (`-o FILE`, else `profile-<kind>-<target>.<ext>` in the current directory).
pub(crate) async fn run_profile(
    cl: &Client,
    target: String,
    p: &ProfileArgs,
) -> anyhow::Result<i32> {
    use job::profile_type::Profiler;
    let label = if target == SELF_TARGET {
        "Controller".to_string()
    } else {
        target.clone()
    };
    let profiler = match p.profiler.as_str() {
        "threads" => Profiler::Threads(job::ThreadsProfile {
            locals: p.locals,
            native: p.native,
        }),
        "cpu" => Profiler::Cpu(job::CpuProfile {
            format: job::cpu_profile::Format::Speedscope as i32,
            ..Default::default()
        }),
        _ => Profiler::Memory(job::MemoryProfile {
            format: job::memory_profile::Format::Flamegraph as i32,
            ..Default::default()
        }),
    };
    println!("Profiling {label} ({}, {}s)...", p.profiler, p.duration);
    let r: job::ProfileTaskResponse = cl
        .call(
            SVC,
            "ProfileTask",
            &job::ProfileTaskRequest {
                target,
                duration_seconds: p.duration,
                profile_type: Some(job::ProfileType {
                    profiler: Some(profiler),
                }),
            },
            Duration::from_secs(p.duration.max(0) as u64 + 90),
        )
        .await?;
    if !r.error().is_empty() {
        eprintln!("error: Profiling failed: {}", r.error());
        return Ok(1);
    }
    let path = match &p.output {
        Some(o) => o.clone(),
        None if p.profiler == "threads" => {
            // A closed pipe (`| head`) ends the output, not the process with a panic.
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = out
                .write_all(r.profile_data())
                .and_then(|()| out.write_all(b"\n"));
            return Ok(0);
        }
        None => {
            let ext = if p.profiler == "cpu" {
                ".speedscope.json"
            } else {
                ".html"
            };
            let safe = label.to_lowercase().replace([' ', '/'], "-");
            format!("profile-{}-{}{ext}", p.profiler, safe.trim_matches('-')).into()
        }
    };
    std::fs::write(&path, r.profile_data())
        .map_err(|e| anyhow::anyhow!("writing the profile to {}: {e}", path.display()))?;
    println!("Profile written to {}", path.display());
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_timespans_read_as_the_published_cli_prints_them() {
        assert_eq!(timespan(4_500), "4.5 seconds");
        assert_eq!(timespan(1_000), "1 second");
        assert_eq!(timespan(184_000), "3 minutes and 4 seconds");
        assert_eq!(timespan(90_061_000), "1 day, 1 hour, 1 minute and 1 second");
        assert_eq!(size(512), "512 bytes");
        assert_eq!(size(12 << 20), "12 MiB");
        assert_eq!(size(1536 << 20), "1.5 GiB");
    }
}
