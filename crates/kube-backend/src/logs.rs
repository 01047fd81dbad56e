//! Log shipping: each attempt's `task` container log read through the API (no sidecar), sent to
//! the controller's log store in increments, at most every `LOG_PERIOD` while running and once
//! more when the pod ends.

use crate::pods::phase;
use crate::{lock, now_ms, KubeBackend, LOG_PERIOD};
use iris_backend::AttemptLogs;
use iris_kube_model as km;
use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;

impl KubeBackend {
    /// New lines of the attempt's `task` container log since the last round, stored under `key`.
    pub(crate) async fn ship_logs(
        &self,
        key: String,
        name: &str,
        pod: &Pod,
    ) -> Option<AttemptLogs> {
        let core = &self.core;
        let ph = phase(pod);
        if !matches!(ph, "Running" | "Succeeded" | "Failed")
            || lock(&self.state).log_done.contains(name)
        {
            return None;
        }
        if ph == "Running" {
            let mut st = lock(&self.state);
            let now = std::time::Instant::now();
            if st
                .log_read_at
                .get(name)
                .is_some_and(|t| now.duration_since(*t) < LOG_PERIOD)
            {
                return None;
            }
            st.log_read_at.insert(name.to_string(), now);
        }
        let text = core
            .pods
            .logs(
                name,
                &LogParams {
                    container: Some(km::manifest::TASK_CONTAINER.into()),
                    ..Default::default()
                },
            )
            .await
            .ok()?;
        let mut st = lock(&self.state);
        let sent = st.log_lines.get(name).copied().unwrap_or(0);
        let now = now_ms();
        let lines: Vec<(String, String, i64, i64)> = text
            .lines()
            .enumerate()
            .skip(sent)
            .map(|(i, l)| ("stdout".to_string(), l.to_string(), now, i as i64))
            .collect();
        st.log_lines.insert(name.to_string(), sent + lines.len());
        if matches!(ph, "Succeeded" | "Failed") {
            st.log_done.insert(name.to_string());
        }
        (!lines.is_empty()).then_some(AttemptLogs { key, lines })
    }
}
