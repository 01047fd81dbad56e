//! Per-attempt resource usage: the attempt's process group is sampled (one pass over `/proc`
//! for every due attempt) when the controller reconciles, at most every [`EVERY`], and the
//! latest sample with the attempt's peak memory rides on its `AttemptObservation`.

use crate::Attempt;
use iris_proto::job;
use iris_rpc::procinfo::{group_usage, GroupUsage};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Samples are at least this far apart (CPU is averaged over the interval).
pub(crate) const EVERY: Duration = Duration::from_secs(2);

/// One attempt's usage so far.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    last: Option<(Instant, GroupUsage)>,
    reported: Option<job::ResourceUsage>,
}

impl Tracker {
    fn due(&self, now: Instant) -> bool {
        self.last
            .is_none_or(|(at, _)| now.duration_since(at) >= EVERY)
    }

    /// Folds in a new sample of the group taken at `now`.
    fn record(&mut self, sample: GroupUsage, now: Instant) {
        let cpu = match self.last {
            Some((at, prev)) => {
                sample.millicores_since(&prev, now.duration_since(at).as_millis() as u64)
            }
            None => 0,
        };
        let memory_mb = sample.rss_bytes / (1024 * 1024);
        let peak = self
            .reported
            .as_ref()
            .map_or(0, |r| r.memory_peak_mb)
            .max(memory_mb);
        self.reported = Some(job::ResourceUsage {
            memory_mb,
            disk_mb: 0,
            cpu_millicores: cpu,
            memory_peak_mb: peak,
            process_count: sample.processes,
        });
        self.last = Some((now, sample));
    }

    /// The latest sample (with the peak so far), once there is one.
    pub(crate) fn reported(&self) -> Option<job::ResourceUsage> {
        self.reported
    }
}

/// Samples every live attempt whose tracker is due, in one pass over `/proc`.
pub(crate) fn sample(attempts: &mut HashMap<String, Attempt>, now: Instant) {
    let due: Vec<u32> = attempts
        .values()
        .filter(|a| a.usage.due(now))
        .filter_map(|a| a.pgid.and_then(|p| u32::try_from(p).ok()))
        .collect();
    if due.is_empty() {
        return;
    }
    let usage = group_usage(&due);
    for a in attempts.values_mut() {
        if let Some(sample) = a
            .pgid
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| due.contains(p))
            .and_then(|p| usage.get(&p))
        {
            a.usage.record(*sample, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_averaged_between_samples_and_the_peak_is_kept() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        let g = |rss_mb: i64, ticks: u64| GroupUsage {
            rss_bytes: rss_mb * 1024 * 1024,
            cpu_ticks: ticks,
            processes: 2,
        };
        t.record(g(300, 1000), t0);
        assert_eq!(
            t.reported().map(|r| (r.memory_mb, r.cpu_millicores)),
            Some((300, 0))
        );
        // 150 ticks (1.5 s of CPU) over 2 s: 750 millicores.
        t.record(g(100, 1150), t0 + Duration::from_secs(2));
        let r = t.reported().expect("sampled");
        assert_eq!(
            (
                r.memory_mb,
                r.memory_peak_mb,
                r.cpu_millicores,
                r.process_count
            ),
            (100, 300, 750, 2)
        );
        assert!(!t.due(t0 + Duration::from_secs(3)));
        assert!(t.due(t0 + Duration::from_secs(4)));
    }

    #[test]
    fn a_live_process_group_is_measured() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .process_group(0)
            .spawn()
            .expect("spawn sleep");
        let pg = child.id();
        let usage = group_usage(&[pg]);
        let _ = child.kill();
        let _ = child.wait();
        let u = usage.get(&pg).expect("the group is found");
        assert_eq!(u.processes, 1);
        assert!(u.rss_bytes > 0, "{u:?}");
    }
}
