//! Showing logs: `iris job logs`, `iris task logs` and `iris attempt logs` share [`logs`], which
//! fetches (optionally tails) a log source from the controller's log service and, with
//! `--follow`, keeps polling until the job ends.

use crate::client::{call, fetch_logs};
use crate::{output, LogArgs};
use anyhow::bail;
use iris_proto::cluster::controller as c;
use iris_proto::finelog::logging as fl;
use iris_rpc::Client;
use std::time::Duration;

pub(crate) async fn logs(
    cl: &Client,
    l: &LogArgs,
    source: &str,
    scope: i32,
    job_for_follow: Option<&str>,
) -> anyhow::Result<i32> {
    if let Some(r) = &l.regex {
        if let Err(e) = regex_check(r) {
            bail!("--regex '{r}': {e}");
        }
    }
    let tail = !l.no_tail;
    let mut req = fl::FetchLogsRequest {
        source: source.to_string(),
        match_scope: scope,
        since_ms: match l.since_seconds {
            Some(s) => chrono::Utc::now().timestamp_millis() - (s as i64).saturating_mul(1000),
            None => l.since_ms,
        },
        substring: l.substring.clone().unwrap_or_default(),
        regex: l.regex.clone().unwrap_or_default(),
        max_lines: l.max_lines,
        tail,
        min_level: l.level.clone().unwrap_or_default(),
        ..Default::default()
    };
    let r = fetch_logs(cl, &req).await?;
    for e in &r.entries {
        output::print_log(e, source);
    }
    if !l.follow {
        return Ok(0);
    }
    req.cursor = r.cursor;
    req.tail = false;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = fetch_logs(cl, &req).await?;
        for e in &r.entries {
            output::print_log(e, source);
        }
        req.cursor = r.cursor;
        if r.entries.is_empty() {
            if let Some(j) = job_for_follow {
                let st: c::GetJobStateResponse = call(
                    cl,
                    "GetJobState",
                    &c::GetJobStateRequest {
                        job_ids: vec![j.to_string()],
                    },
                )
                .await?;
                if st
                    .states
                    .get(j)
                    .map(|s| (4..=8).contains(s))
                    .unwrap_or(true)
                {
                    return Ok(0);
                }
            }
        }
    }
}

fn regex_check(r: &str) -> Result<(), String> {
    // The server validates too; checking here gives the error before any request.
    let depth = r.chars().fold(0i32, |d, ch| match ch {
        '[' => d + 1,
        ']' => d - 1,
        _ => d,
    });
    if depth > 0 {
        return Err("unbalanced '['".into());
    }
    Ok(())
}
