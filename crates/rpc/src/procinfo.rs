//! What `GetProcessStatus` and a native thread dump report about a process, read from Linux's
//! `/proc`: the controller and the worker daemon describe themselves with it, and the worker
//! describes a task's main process.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// Clock ticks per second of `/proc/<pid>/stat` times: `USER_HZ`, 100 on every Linux ABI.
const TICKS_PER_SECOND: u64 = 100;

/// One process's host and resource facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub hostname: String,
    pub pid: u32,
    pub uptime_ms: i64,
    pub memory_rss_bytes: i64,
    pub memory_vms_bytes: i64,
    pub memory_total_bytes: i64,
    pub thread_count: i32,
    pub open_fd_count: i32,
    pub cpu_count: i32,
    /// CPU used since the previous snapshot of this pid (the first: since it started).
    pub cpu_millicores: i32,
}

/// The fields of `/proc/<pid>/stat` after the command name, which may itself hold spaces.
fn stat_fields(pid: u32) -> std::io::Result<(String, Vec<String>)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let open = text.find('(').unwrap_or(0);
    let close = text.rfind(')').unwrap_or(text.len());
    let comm = text.get(open + 1..close).unwrap_or("").to_string();
    let rest = text.get(close + 1..).unwrap_or("");
    Ok((comm, rest.split_whitespace().map(str::to_string).collect()))
}

fn field_u64(fields: &[String], i: usize) -> u64 {
    fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0)
}

/// A `kB` line of a `/proc` status-like file, in bytes.
fn kb_line(text: &str, key: &str) -> i64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

static CPU_SAMPLES: Mutex<Option<HashMap<u32, (Instant, u64)>>> = Mutex::new(None);

/// Facts about process `pid` (`std::process::id()` for this one).
pub fn snapshot(pid: u32) -> std::io::Result<Snapshot> {
    let (_, f) = stat_fields(pid)?;
    // After the name: state(0) ppid pgrp session tty tpgid flags minflt cminflt majflt
    // cmajflt utime(11) stime(12) cutime cstime priority nice num_threads(17) itrealvalue
    // starttime(19) vsize rss.
    let cpu_ticks = field_u64(&f, 11) + field_u64(&f, 12);
    let started_ticks = field_u64(&f, 19);
    let boot_secs: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|s| s.parse().ok()))
        .unwrap_or(0.0);
    let age_ms =
        ((boot_secs * 1000.0) as i64 - (started_ticks * 1000 / TICKS_PER_SECOND) as i64).max(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let now = Instant::now();
    let cpu_millicores = {
        let mut samples = CPU_SAMPLES.lock().unwrap_or_else(|e| e.into_inner());
        let samples = samples.get_or_insert_with(HashMap::new);
        let (elapsed_ms, ticks) = match samples.get(&pid) {
            Some((at, prev)) if cpu_ticks >= *prev => {
                (now.duration_since(*at).as_millis() as u64, cpu_ticks - prev)
            }
            _ => (age_ms as u64, cpu_ticks),
        };
        samples.insert(pid, (now, cpu_ticks));
        (ticks * 1000 * 1000 / TICKS_PER_SECOND)
            .checked_div(elapsed_ms)
            .unwrap_or(0) as i32
    };
    Ok(Snapshot {
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        pid,
        uptime_ms: age_ms,
        memory_rss_bytes: kb_line(&status, "VmRSS:"),
        memory_vms_bytes: kb_line(&status, "VmSize:"),
        memory_total_bytes: kb_line(&meminfo, "MemTotal:"),
        thread_count: field_u64(&f, 17) as i32,
        open_fd_count: std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count() as i32)
            .unwrap_or(0),
        cpu_count: std::thread::available_parallelism()
            .map(|n| n.get() as i32)
            .unwrap_or(0),
        cpu_millicores,
    })
}

/// What the processes of one process group use together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupUsage {
    /// Resident memory, summed over the group's processes.
    pub rss_bytes: i64,
    /// User + system CPU time of the group's live processes, in clock ticks.
    pub cpu_ticks: u64,
    pub processes: i32,
}

impl GroupUsage {
    /// CPU used between `earlier` and this sample, `elapsed_ms` apart, in millicores (0 when a
    /// process left the group and the total went down).
    pub fn millicores_since(&self, earlier: &GroupUsage, elapsed_ms: u64) -> i32 {
        let ticks = self.cpu_ticks.saturating_sub(earlier.cpu_ticks);
        (ticks * 1000 * 1000 / TICKS_PER_SECOND)
            .checked_div(elapsed_ms)
            .map_or(0, |m| i32::try_from(m).unwrap_or(i32::MAX))
    }
}

/// The usage of each of `pgids`' process groups, from one pass over `/proc` (a group with no
/// live process is absent).
pub fn group_usage(pgids: &[u32]) -> HashMap<u32, GroupUsage> {
    let mut out: HashMap<u32, GroupUsage> = HashMap::new();
    if pgids.is_empty() {
        return out;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let Ok((_, f)) = stat_fields(pid) else {
            continue;
        };
        let pgrp = field_u64(&f, 2) as u32;
        if !pgids.contains(&pgrp) {
            continue;
        }
        let u = out.entry(pgrp).or_default();
        u.cpu_ticks += field_u64(&f, 11) + field_u64(&f, 12);
        // `stat` gives rss in pages of a size that varies by platform; `status` says kB.
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        u.rss_bytes += kb_line(&status, "VmRSS:");
        u.processes += 1;
    }
    out
}

/// The other processes of `pgid`'s process group (a task's children), by pid.
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| p != pgid)
        .filter(|&p| {
            stat_fields(p)
                .map(|(_, f)| field_u64(&f, 2) == u64::from(pgid))
                .unwrap_or(false)
        })
        .collect();
    pids.sort_unstable();
    pids
}

fn read_trimmed(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn state_name(code: &str) -> &'static str {
    match code {
        "R" => "running",
        "S" => "sleeping",
        "D" => "disk sleep",
        "T" => "stopped",
        "t" => "tracing stop",
        "Z" => "zombie",
        "X" => "dead",
        "I" => "idle",
        _ => "unknown",
    }
}

/// A native thread dump of `pid` (and, with `group`, of the other processes in its process
/// group): per thread its id, name, state and kernel wait channel, and its kernel stack where
/// `/proc` lets us read it (root).
pub fn thread_dump(pid: u32, group: bool) -> std::io::Result<String> {
    let mut pids = vec![pid];
    if group {
        pids.extend(group_members(pid));
    }
    let mut out = String::new();
    for (i, p) in pids.into_iter().enumerate() {
        let (comm, f) = match stat_fields(p) {
            Ok(x) => x,
            Err(e) if i == 0 => return Err(e),
            Err(_) => continue, // a child that exited meanwhile
        };
        let cmdline = std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|b| {
                b.split(|&c| c == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let state = f.first().map(String::as_str).unwrap_or("?");
        let _ = writeln!(
            out,
            "Process {p} ({comm}): {} [{state}]{}{cmdline}",
            state_name(state),
            if cmdline.is_empty() { "" } else { ": " }
        );
        let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{p}/task"))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        tids.sort_unstable();
        for tid in tids {
            let base = format!("/proc/{p}/task/{tid}");
            let name = read_trimmed(format!("{base}/comm")).unwrap_or_default();
            let tstate = std::fs::read_to_string(format!("{base}/stat"))
                .ok()
                .and_then(|t| {
                    let close = t.rfind(')')?;
                    t.get(close + 1..)?
                        .split_whitespace()
                        .next()
                        .map(str::to_string)
                })
                .unwrap_or_else(|| "?".into());
            let wchan = read_trimmed(format!("{base}/wchan"))
                .filter(|w| w != "0")
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(
                out,
                "  Thread {tid} \"{name}\": {} [{tstate}], wchan {wchan}",
                state_name(&tstate)
            );
            if let Some(stack) = read_trimmed(format!("{base}/stack")) {
                for frame in stack.lines() {
                    let _ = writeln!(out, "      {frame}");
                }
            }
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_and_a_thread_dump_of_this_process() {
        let me = std::process::id();
        let s = snapshot(me).expect("this process is in /proc");
        assert_eq!(s.pid, me);
        assert!(s.memory_rss_bytes > 0 && s.memory_total_bytes > s.memory_rss_bytes);
        assert!(s.thread_count >= 1 && s.open_fd_count >= 1 && s.cpu_count >= 1);
        let dump = thread_dump(me, false).expect("this process is in /proc");
        assert!(dump.starts_with(&format!("Process {me} (")), "{dump}");
        assert!(dump.contains(&format!("  Thread {me} \"")), "{dump}");
        assert!(thread_dump(u32::MAX, false).is_err());
    }
}
