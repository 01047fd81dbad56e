//! The host's own usage (`WorkerResourceSnapshot`), sent with the worker's health on each
//! reconcile answer and kept by the controller in `iris.worker`: CPU busy share between samples
//! (`/proc/stat`), memory in use (`MemTotal - MemAvailable`), the cache dir's filesystem
//! (`statvfs`), processes (`/proc`), and network bytes (`/proc/net/dev`, loopback aside).

use iris_proto::job;
use std::path::Path;
use std::time::{Duration, Instant};

/// Samples are at least this far apart.
const EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
pub(crate) struct Host {
    last: Option<(Instant, u64, u64)>,
    snapshot: Option<job::WorkerResourceSnapshot>,
}

/// `(busy, total)` jiffies of all CPUs.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

fn meminfo_kb(text: &str, key: &str) -> i64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .unwrap_or(0)
        * 1024
}

fn net_bytes() -> (i64, i64) {
    let text = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
    let mut rx = 0i64;
    let mut tx = 0i64;
    for line in text.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        if name.trim() == "lo" {
            continue;
        }
        let f: Vec<i64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        rx += f.first().copied().unwrap_or(0);
        tx += f.get(8).copied().unwrap_or(0);
    }
    (rx, tx)
}

fn disk(path: &Path) -> (i64, i64) {
    match nix::sys::statvfs::statvfs(path) {
        Ok(s) => {
            let frag = s.fragment_size() as i64;
            let total = s.blocks() as i64 * frag;
            let free = s.blocks_free() as i64 * frag;
            (total - free, total)
        }
        Err(_) => (0, 0),
    }
}

impl Host {
    /// The latest snapshot, taken now if the last is older than [`EVERY`].
    pub(crate) fn sample(
        &mut self,
        now: Instant,
        running: i32,
        cache_dir: &Path,
    ) -> Option<job::WorkerResourceSnapshot> {
        if self
            .last
            .is_some_and(|(at, _, _)| now.duration_since(at) < EVERY)
        {
            return self.snapshot;
        }
        let (busy, total) = cpu_jiffies()?;
        let cpu = match self.last {
            Some((_, b, t)) if total > t => ((busy.saturating_sub(b)) * 100 / (total - t)) as i32,
            _ => 0,
        };
        self.last = Some((now, busy, total));
        let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_total = meminfo_kb(&mem, "MemTotal:");
        let (disk_used, disk_total) = disk(cache_dir);
        let (net_recv, net_sent) = net_bytes();
        let processes = std::fs::read_dir("/proc")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name()
                            .to_str()
                            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .count() as i32
            })
            .unwrap_or(0);
        self.snapshot = Some(job::WorkerResourceSnapshot {
            timestamp: Some(iris_proto::time::Timestamp {
                epoch_ms: Some(crate::logs::now_ms()),
            }),
            host_cpu_percent: cpu,
            memory_used_bytes: mem_total - meminfo_kb(&mem, "MemAvailable:"),
            memory_total_bytes: mem_total,
            disk_used_bytes: disk_used,
            disk_total_bytes: disk_total,
            running_task_count: running,
            total_process_count: processes,
            net_recv_bytes: net_recv,
            net_sent_bytes: net_sent,
        });
        self.snapshot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_measured() {
        let mut h = Host::default();
        let t0 = Instant::now();
        let s = h.sample(t0, 3, Path::new("/")).expect("a snapshot");
        assert!(s.memory_total_bytes > 0 && s.memory_used_bytes > 0, "{s:?}");
        assert!(s.disk_total_bytes > 0 && s.total_process_count > 0, "{s:?}");
        assert_eq!(s.running_task_count, 3);
        // Within the interval the same snapshot is reused.
        assert_eq!(
            h.sample(t0 + Duration::from_millis(10), 9, Path::new("/")),
            Some(s)
        );
    }
}
