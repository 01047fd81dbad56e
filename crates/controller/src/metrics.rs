//! The controller's Prometheus metrics (`GET /metrics`, OpenMetrics text via `prometheus-client`):
//! what the tick does and costs, RPC latency by method, group-commit latency and batch sizes,
//! log bytes taken in, and task steps by the state they entered. Work paths record into
//! [`Metrics`] (atomic updates, no locks on the hot path); gauges that describe the cluster
//! (pending tasks by band, workers by health) are the last tick's picture.

use crate::WriterUse;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Method {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodCode {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BandLabel {
    band: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByLabel {
    by: String,
}

fn latency() -> Histogram {
    // 50 µs .. ~26 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

pub(crate) struct Metrics {
    registry: Registry,
    tick_seconds: Histogram,
    ticks: Counter,
    assignments: Counter,
    preemptions: Counter,
    pending: Family<BandLabel, Gauge>,
    workers: Family<StateLabel, Gauge>,
    rpc_seconds: Family<Method, Histogram, fn() -> Histogram>,
    rpc_requests: Family<MethodCode, Counter>,
    commit_seconds: Histogram,
    commit_batch: Histogram,
    observation_queue_seconds: Histogram,
    observation_tx_seconds: Histogram,
    observation_tx_reports: Histogram,
    writer_held: Family<ByLabel, Counter<f64, AtomicU64>>,
    /// `writer_held`'s series, one per [`WriterUse`] in its order, made once so that releasing
    /// the writer costs no label allocation or family lookup.
    writer_held_by: [Counter<f64, AtomicU64>; WriterUse::ALL.len()],
    writer_turns: Family<ByLabel, Counter>,
    /// `writer_turns`'s series, as `writer_held_by`.
    writer_turns_by: [Counter; WriterUse::ALL.len()],
    log_bytes: Counter,
    log_lines: Counter,
    steps: Family<StateLabel, Counter>,
    illegal: Counter,
    pruned: Counter,
    /// One scrape at a time: the store's counters are copied in as deltas.
    scrape: Mutex<()>,
}

/// One series of `family` per [`WriterUse`], in its order.
fn by_use<M: Clone + Default>(family: &Family<ByLabel, M>) -> [M; WriterUse::ALL.len()] {
    WriterUse::ALL.map(|by| {
        family
            .get_or_create(&ByLabel {
                by: by.label().to_string(),
            })
            .clone()
    })
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut r = Registry::with_prefix("iris");
        let m = Metrics {
            tick_seconds: latency(),
            ticks: Counter::default(),
            assignments: Counter::default(),
            preemptions: Counter::default(),
            pending: Family::default(),
            workers: Family::default(),
            rpc_seconds: Family::new_with_constructor(latency),
            rpc_requests: Family::default(),
            commit_seconds: latency(),
            commit_batch: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            observation_queue_seconds: latency(),
            observation_tx_seconds: latency(),
            observation_tx_reports: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            writer_held: Family::default(),
            writer_held_by: Default::default(),
            writer_turns: Family::default(),
            writer_turns_by: Default::default(),
            log_bytes: Counter::default(),
            log_lines: Counter::default(),
            steps: Family::default(),
            illegal: Counter::default(),
            pruned: Counter::default(),
            scrape: Mutex::new(()),
            registry: Registry::default(),
        };
        r.register(
            "tick_duration_seconds",
            "Wall time of one control tick (snapshot, plan, commit)",
            m.tick_seconds.clone(),
        );
        r.register("ticks", "Control ticks run", m.ticks.clone());
        r.register(
            "assignments",
            "Tasks placed on a worker by the tick",
            m.assignments.clone(),
        );
        r.register(
            "preemptions",
            "Running tasks preempted by the tick for higher-band work",
            m.preemptions.clone(),
        );
        r.register(
            "pending_tasks",
            "Tasks pending at the last tick, by effective priority band",
            m.pending.clone(),
        );
        r.register(
            "workers",
            "Workers at the last tick, by health (healthy: confirmed by this run and heartbeating)",
            m.workers.clone(),
        );
        r.register(
            "rpc_duration_seconds",
            "Time to serve an RPC, by method",
            m.rpc_seconds.clone(),
        );
        r.register(
            "rpc_requests",
            "RPCs served, by method and HTTP status",
            m.rpc_requests.clone(),
        );
        r.register(
            "admission_commit_duration_seconds",
            "Time to admit and commit one group-commit batch of submissions",
            m.commit_seconds.clone(),
        );
        r.register(
            "admission_batch_size",
            "Submissions per group-commit batch",
            m.commit_batch.clone(),
        );
        r.register(
            "observation_queue_seconds",
            "Time a worker's reconcile answer waited for the observation writer",
            m.observation_queue_seconds.clone(),
        );
        r.register(
            "observation_transaction_seconds",
            "Time to apply and commit one transaction of workers' reconcile answers",
            m.observation_tx_seconds.clone(),
        );
        r.register(
            "observation_transaction_reports",
            "Workers' reconcile answers per observation-writer transaction",
            m.observation_tx_reports.clone(),
        );
        r.register(
            "writer_held_seconds",
            "Time the writer connection was held, by its user (admission, tick, observation, other)",
            m.writer_held.clone(),
        );
        r.register(
            "writer_turns",
            "Times the writer connection was taken, by its user (one turn: one or more transactions)",
            m.writer_turns.clone(),
        );
        r.register(
            "log_bytes",
            "Bytes of task log lines stored",
            m.log_bytes.clone(),
        );
        r.register("log_lines", "Task log lines stored", m.log_lines.clone());
        r.register(
            "task_steps",
            "Task state-machine steps applied, by the state entered",
            m.steps.clone(),
        );
        r.register(
            "illegal_transitions",
            "State-machine events dropped as illegal (bugs)",
            m.illegal.clone(),
        );
        r.register(
            "jobs_pruned",
            "Finished job trees deleted by the retention sweep",
            m.pruned.clone(),
        );
        let writer_held_by = by_use(&m.writer_held);
        let writer_turns_by = by_use(&m.writer_turns);
        Metrics {
            registry: r,
            writer_held_by,
            writer_turns_by,
            ..m
        }
    }

    /// The writer connection was held for `took` by `by` (`crate::Writer`).
    pub(crate) fn writer_held(&self, by: WriterUse, took: Duration) {
        self.writer_held_by[by as usize].inc_by(took.as_secs_f64());
        self.writer_turns_by[by as usize].inc();
    }

    pub(crate) fn tick_done(&self, took: Duration) {
        self.ticks.inc();
        self.tick_seconds.observe(took.as_secs_f64());
    }

    /// What one tick planned.
    pub(crate) fn planned(&self, assignments: usize, preemptions: usize) {
        self.assignments.inc_by(assignments as u64);
        self.preemptions.inc_by(preemptions as u64);
    }

    /// The cluster one tick planned over.
    pub(crate) fn tick_plan(
        &self,
        pending_by_band: &[(&'static str, i64)],
        workers_healthy: i64,
        workers_unhealthy: i64,
    ) {
        for (band, n) in pending_by_band {
            self.pending
                .get_or_create(&BandLabel {
                    band: (*band).to_string(),
                })
                .set(*n);
        }
        for (state, n) in [
            ("healthy", workers_healthy),
            ("unhealthy", workers_unhealthy),
        ] {
            self.workers
                .get_or_create(&StateLabel {
                    state: state.to_string(),
                })
                .set(n);
        }
    }

    pub(crate) fn rpc(&self, method: &str, status: u16, took: Duration) {
        self.rpc_seconds
            .get_or_create(&Method {
                method: method.to_string(),
            })
            .observe(took.as_secs_f64());
        self.rpc_requests
            .get_or_create(&MethodCode {
                method: method.to_string(),
                code: status.to_string(),
            })
            .inc();
    }

    pub(crate) fn admission_batch(&self, size: usize, took: Duration) {
        self.commit_batch.observe(size as f64);
        self.commit_seconds.observe(took.as_secs_f64());
    }

    /// A reconcile answer reached the observation writer after waiting `waited`.
    pub(crate) fn observation_queued(&self, waited: Duration) {
        self.observation_queue_seconds.observe(waited.as_secs_f64());
    }

    /// The observation writer committed `reports` answers in one transaction taking `took`.
    pub(crate) fn observation_transaction(&self, reports: usize, took: Duration) {
        self.observation_tx_reports.observe(reports as f64);
        self.observation_tx_seconds.observe(took.as_secs_f64());
    }

    pub(crate) fn logs_stored(&self, lines: usize, bytes: usize) {
        self.log_lines.inc_by(lines as u64);
        self.log_bytes.inc_by(bytes as u64);
    }

    pub(crate) fn pruned(&self, trees: usize) {
        self.pruned.inc_by(trees as u64);
    }

    /// The OpenMetrics text of every metric.
    pub(crate) fn render(&self) -> String {
        let _one = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        for (state, n) in iris_store::apply::task_steps_applied() {
            let c = self.steps.get_or_create(&StateLabel {
                state: state.friendly().to_string(),
            });
            c.inc_by(n.saturating_sub(c.get()));
        }
        self.illegal
            .inc_by(iris_store::apply::illegal_transitions().saturating_sub(self.illegal.get()));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_renders_with_its_prefix_and_moves_with_work() {
        let m = Metrics::new();
        m.tick_done(Duration::from_millis(3));
        m.planned(2, 1);
        m.tick_plan(&[("batch", 5)], 3, 1);
        m.rpc("LaunchJob", 200, Duration::from_micros(300));
        m.admission_batch(4, Duration::from_millis(1));
        m.observation_queued(Duration::from_millis(2));
        m.observation_transaction(3, Duration::from_millis(4));
        m.logs_stored(2, 10);
        // Each user's held time lands in its own series.
        for (i, by) in WriterUse::ALL.into_iter().enumerate() {
            m.writer_held(by, Duration::from_secs(i as u64 + 1));
        }
        let text = m.render();
        for (i, by) in WriterUse::ALL.into_iter().enumerate() {
            let line = format!(
                "iris_writer_held_seconds_total{{by=\"{}\"}} {}.0",
                by.label(),
                i + 1
            );
            assert!(text.contains(&line), "{line} missing from:\n{text}");
            let line = format!("iris_writer_turns_total{{by=\"{}\"}} 1", by.label());
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
        for line in [
            "iris_ticks_total 1",
            "iris_assignments_total 2",
            "iris_preemptions_total 1",
            "iris_pending_tasks{band=\"batch\"} 5",
            "iris_workers{state=\"healthy\"} 3",
            "iris_rpc_requests_total{method=\"LaunchJob\",code=\"200\"} 1",
            "iris_rpc_duration_seconds_count{method=\"LaunchJob\"} 1",
            "iris_admission_batch_size_sum 4.0",
            "iris_observation_queue_seconds_count 1",
            "iris_observation_transaction_seconds_count 1",
            "iris_observation_transaction_reports_sum 3.0",
            "iris_log_bytes_total 10",
            "iris_tick_duration_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(
            text.contains("iris_task_steps_total{state=\"running\"}"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
