//! Render functions over fixtures: well-formed HTML, accessible structure, and page size.

use iris_dashboard::pages::{self, JobsFilter, Page};
use iris_dashboard::{model, svg, Table};
use iris_proto::cluster::controller as c;
use iris_proto::finelog_logging as fl;
use iris_proto::inspect as pb;
use iris_proto::job;
use iris_proto::time::Timestamp;
use std::collections::BTreeMap;

const NOW: i64 = 1_790_000_000_000;

const VOID: &[&str] = &["meta", "link", "input", "br", "hr", "img"];

/// Checks that every non-void element is closed in order; returns the tag names seen.
fn assert_well_formed(html: &str) -> Vec<String> {
    let mut stack: Vec<String> = Vec::new();
    let mut seen = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest.find('>').expect("unterminated tag");
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().unwrap_or_else(|| panic!("stray </{name}>"));
            assert_eq!(open, name, "</{name}> closes <{open}>");
            continue;
        }
        let name: String = tag
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect::<String>()
            .to_ascii_lowercase();
        seen.push(name.clone());
        if tag.ends_with('/') || VOID.contains(&name.as_str()) {
            continue;
        }
        // Raw-text elements: skip to their end tag.
        if name == "script" || name == "style" || name == "textarea" || name == "title" {
            let close = format!("</{name}>");
            let j = rest.find(&close).expect("raw text element closed");
            rest = &rest[j + close.len()..];
            continue;
        }
        stack.push(name);
    }
    assert!(stack.is_empty(), "unclosed elements: {stack:?}");
    seen
}

fn full(p: &Page) -> String {
    let html = pages::layout(p).into_string();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains(r#"<html lang="en">"#));
    assert!(html.contains(r#"<nav aria-label="Main">"#));
    assert!(html.contains(r#"<main id="main""#));
    let tags = assert_well_formed(&html);
    // Every column header says what it heads.
    assert_eq!(
        html.matches("<th ").count(),
        tags.iter().filter(|t| *t == "th").count(),
        "every th has attributes (scope)"
    );
    assert!(!html.contains("<th>"), "th without scope");
    html
}

fn job_fixture(i: usize, state: i32) -> job::JobStatus {
    let mut counts = BTreeMap::new();
    counts.insert("running".to_string(), 2);
    counts.insert("pending".to_string(), 1);
    counts.insert("succeeded".to_string(), 1);
    job::JobStatus {
        job_id: Some(format!("/alice/train-run-with-a-long-name-{i:05}")),
        state: Some(state),
        submitted_at: Some(Timestamp {
            epoch_ms: Some(NOW - 60_000 - i as i64),
        }),
        started_at: Some(Timestamp {
            epoch_ms: Some(NOW - 30_000),
        }),
        task_count: Some(4),
        task_state_counts: counts,
        submitting_user: Some("alice".into()),
        pending_reason: Some("Insufficient resources: need 8 gpu (h100), best worker has 0 free; <script>alert(1)</script>".into()),
        ..Default::default()
    }
}

#[test]
fn jobs_page_with_many_jobs_is_small_escaped_and_well_formed() {
    let resp = c::ListJobsResponse {
        jobs: (0..pages::JOBS_PER_PAGE as usize)
            .map(|i| job_fixture(i, 1 + (i % 8) as i32))
            .collect(),
        total_count: Some(10_000),
        has_more: Some(true),
        ..Default::default()
    };
    let counts = vec![
        ("pending".to_string(), 9_000),
        ("running".to_string(), 900),
        ("failed".to_string(), 100),
    ];
    let f = JobsFilter {
        state: "pending".into(),
        user: "alice".into(),
        ..Default::default()
    };
    let html = full(&pages::jobs_page(&f, Ok(&resp), &counts, NOW));
    assert!(html.len() < 200_000, "jobs page is {} bytes", html.len());
    assert!(html.contains("/alice/train-run-with-a-long-name-00000"));
    assert!(html.contains("1–50 of 10000"));
    assert!(html.contains(r#"<option value="pending" selected>"#));
    assert!(html.contains("Older →"));
    assert!(html.contains("page=2"));
    assert!(!html.contains("<script>alert"), "text is escaped");
    // Colour is never the only carrier: the state's name is in the badge.
    assert!(html.contains(">pending</span>"));
}

#[test]
fn jobs_filter_builds_the_query_and_the_counts_request() {
    let f = JobsFilter {
        user: "bob".into(),
        prefix: "exp'1".into(),
        name: "Train".into(),
        page: 3,
        ..Default::default()
    };
    let q = f.query();
    assert_eq!(q.job_id_prefix, "/bob/exp'1");
    assert_eq!(q.offset, 100);
    let counts = f.counts_request();
    assert_eq!(counts.job_id_prefix, q.job_id_prefix);
    assert_eq!(counts.name_filter, "Train");
    let r = pb::CountJobsResponse {
        counts: vec![
            pb::JobStateCount {
                state: job::JobState::Pending as i32,
                count: 3,
            },
            pb::JobStateCount {
                state: job::JobState::Succeeded as i32,
                count: 1,
            },
        ],
    };
    assert_eq!(
        pages::state_counts(&r),
        [("pending".to_string(), 3), ("succeeded".to_string(), 1)]
    );
    let g = JobsFilter {
        user: "bob".into(),
        prefix: "/bob/x".into(),
        ..Default::default()
    };
    assert_eq!(g.id_prefix(), "/bob/x");
}

#[test]
fn job_page_shows_tasks_timeline_and_children() {
    let j = job_fixture(1, 3);
    let tasks: Vec<job::TaskStatus> = (0..3)
        .map(|i| job::TaskStatus {
            task_id: Some(format!("{}/{i}", j.job_id())),
            state: if i == 0 { Some(5) } else { Some(3) },
            exit_code: Some(1),
            worker_id: Some("w0".into()),
            error: if i == 0 {
                Some("Exit code: 1".into())
            } else {
                Some(String::new())
            },
            started_at: Some(Timestamp {
                epoch_ms: Some(NOW - 20_000),
            }),
            ..Default::default()
        })
        .collect();
    let rows = vec![
        pb::AttemptSummary {
            task_id: tasks[0].task_id.clone().unwrap_or_default(),
            attempt_id: 0,
            worker_id: "w0".into(),
            state: 5,
            created_at_ms: NOW - 50_000,
            started_at_ms: Some(NOW - 45_000),
            finished_at_ms: Some(NOW - 40_000),
            exit_code: Some(1),
            ..Default::default()
        },
        pb::AttemptSummary {
            task_id: tasks[0].task_id.clone().unwrap_or_default(),
            attempt_id: 1,
            worker_id: "w1".into(),
            state: 3,
            created_at_ms: NOW - 30_000,
            started_at_ms: Some(NOW - 29_000),
            ..Default::default()
        },
    ];
    let attempts = pages::attempts_from(&rows);
    assert_eq!(
        attempts.get(tasks[0].task_id()).map(|s| s.to_vec()),
        Some(vec![
            svg::Span {
                attempt_id: 0,
                state: 5,
                created_ms: NOW - 50_000,
                started_ms: Some(NOW - 45_000),
                finished_ms: Some(NOW - 40_000),
                worker: "w0".into(),
                exit_code: Some(1),
            },
            svg::Span {
                attempt_id: 1,
                state: 3,
                created_ms: NOW - 30_000,
                started_ms: Some(NOW - 29_000),
                finished_ms: None,
                worker: "w1".into(),
                exit_code: None,
            },
        ])
    );
    let children = c::ListJobsResponse {
        jobs: vec![job::JobStatus {
            job_id: Some(format!("{}/eval", j.job_id())),
            state: Some(4),
            ..Default::default()
        }],
        total_count: Some(1),
        has_more: Some(false),
        ..Default::default()
    };
    let endpoints = vec![c::Endpoint {
        endpoint_id: Some("ep-1".into()),
        name: Some(format!("{}/coordinator", j.job_id())),
        address: Some("10.0.0.5:8476".into()),
        task_id: Some(format!("{}/0", j.job_id())),
        access: Some(2),
        ..Default::default()
    }];
    let v = pages::JobView {
        job: &j,
        endpoints: &endpoints,
        controller_url: "http://ctl:10000",
        request: None,
        tasks: &tasks,
        attempts: &attempts,
        children: Some(&children),
        task_page: 1,
        now: NOW,
    };
    let p = pages::job_page(&v);
    assert!(!p.done, "a running job keeps refreshing");
    let html = full(&p);
    assert!(html.contains("<svg class=\"timeline\""));
    assert!(html.contains("attempt 0: failed, exit 1 on w0"));
    assert!(html.contains("Child jobs (1)"));
    assert!(html.contains("Endpoints (1)"));
    assert!(html.contains(
        "href=\"http://ctl:10000/proxy/alice.train-run-with-a-long-name-00001.coordinator/\""
    ));
    assert!(html.contains("/task/alice/train-run-with-a-long-name-00001/0"));
    let mut killed = j.clone();
    killed.state = Some(6);
    let v = pages::JobView { job: &killed, ..v };
    let p = pages::job_page(&v);
    assert!(p.done, "a finished job stops refreshing");
    assert!(p.live.into_string().contains(">killed</span>"));
}

#[test]
fn task_page_shows_attempts_events_and_logs() {
    let resp = c::GetTaskStatusResponse {
        task: Some(job::TaskStatus {
            task_id: Some("/u/j/0".into()),
            state: Some(5),
            exit_code: Some(3),
            error: Some("Exit code: 3".into()),
            attempts: vec![job::TaskAttempt {
                attempt_id: Some(0),
                worker_id: Some("w0".into()),
                state: Some(5),
                exit_code: Some(3),
                error: Some("Exit code: 3".into()),
                attempt_uid: Some("0123456789abcdef".into()),
                started_at: Some(Timestamp {
                    epoch_ms: Some(NOW - 5000),
                }),
                finished_at: Some(Timestamp {
                    epoch_ms: Some(NOW - 1000),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        job_resources: None,
        root_cause_highlights: vec!["Traceback: boom".into()],
    };
    let events = pb::ListTaskEventsResponse {
        events: vec![
            pb::TaskEvent {
                ts_ms: NOW - 3000,
                attempt_id: None,
                r#type: "Normal".into(),
                reason: "TaskSubmitted".into(),
                message: "queued <b>".into(),
                source: "iris/controller".into(),
                ..Default::default()
            },
            pb::TaskEvent {
                ts_ms: NOW - 2000,
                attempt_id: Some(0),
                attempt_uid: "0123456789abcdef".into(),
                r#type: "Warning".into(),
                reason: "TaskFailed".into(),
                message: "Exit code: 3".into(),
                source: "worker".into(),
            },
        ],
        omitted: 5,
    };
    let logs = vec![fl::LogEntry {
        data: Some("hello <b>".into()),
        source: Some("stderr".into()),
        timestamp: Some(fl::Timestamp { epoch_ms: NOW }),
        ..Default::default()
    }];
    let v = pages::TaskView {
        resp: &resp,
        spans: &[],
        events: Ok(&events),
        explain: None,
        log_tail: &logs,
        samples: &[],
        now: NOW,
    };
    let html = full(&pages::task_page(&v));
    assert!(html.contains("No samples yet"));
    assert!(html.contains("0123456789abcdef"));
    assert!(html.contains("TaskFailed"));
    assert!(html.contains("queued &lt;b&gt;"), "event text is escaped");
    assert!(html.contains("5 earlier event(s) not shown"));
    let v = pages::TaskView {
        events: Err("read task events of job /u/j: permission denied"),
        ..v
    };
    let html = full(&pages::task_page(&v));
    assert!(html.contains("Cannot read task events:"));
    assert!(html.contains("permission denied"));
    assert!(html.contains("hello &lt;b&gt;"));
    assert!(html.contains("Traceback: boom"));
    assert!(
        !html.contains("Why it waits"),
        "only a pending task is explained"
    );
    let explained = pb::ExplainTaskResponse {
        task_id: "/u/j/0".into(),
        pending: true,
        band: "interactive".into(),
        effective_band: "batch".into(),
        workers: vec![
            pb::WorkerVerdict {
                worker_id: "w-a".into(),
                rule: "resources".into(),
                detail: "memory short by 4 GiB <b>".into(),
                ..Default::default()
            },
            pb::WorkerVerdict {
                worker_id: "w-b".into(),
                rule: "fits".into(),
                detail: "the task fits here now".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let v2 = pages::TaskView {
        explain: Some(Ok(&explained)),
        ..v
    };
    let html = full(&pages::task_page(&v2));
    assert!(html.contains("Why it waits"));
    assert!(html.contains("(placed as batch)"));
    assert!(
        html.contains("memory short by 4 GiB &lt;b&gt;"),
        "detail is escaped"
    );
    assert!(html.contains("w-b") && html.contains("the task fits here now"));
    let v3 = pages::TaskView {
        explain: Some(Err("explain tasks of job /u/j: permission denied")),
        ..v2
    };
    assert!(full(&pages::task_page(&v3)).contains("Cannot explain the task:"));
    // Resource usage: a line per measure, the latest and peak in text.
    let samples: Vec<pb::TaskSample> = [(0, 250, 100), (5_000, 1500, 400), (10_000, 900, 300)]
        .into_iter()
        .map(|(dt, cpu, mem)| pb::TaskSample {
            ts_ms: NOW - 10_000 + dt,
            attempt_id: 0,
            cpu_millicores: cpu,
            memory_mb: mem,
            memory_peak_mb: mem.max(400),
        })
        .collect();
    let v4 = pages::TaskView {
        samples: &samples,
        ..v3
    };
    let html = full(&pages::task_page(&v4));
    assert!(html.contains("Resource usage"));
    assert_eq!(
        html.matches("<polyline").count(),
        2,
        "a CPU and a memory line"
    );
    assert!(
        html.contains("CPU (cores): latest 0.90, peak 1.50"),
        "{html}"
    );
    assert!(html.contains("Memory (MB): latest 300, peak 400"));
    assert!(html.contains("3 sample(s)"));
}

#[test]
fn logs_page_shows_a_rejected_regex_as_an_error() {
    let f = pages::LogsFilter {
        regex: "[".into(),
        ..Default::default()
    };
    let v = pages::LogsView {
        id: "/u/j/0",
        is_task: true,
        filter: &f,
        lines: Err("invalid regex: unclosed character class"),
        more: 0,
        cursor: 0,
        active: false,
    };
    let html = full(&pages::logs_page(&v));
    assert!(html.contains(r#"role="alert""#));
    assert!(html.contains("unclosed character class"));
    assert!(html.contains(r#"<label for="regex">"#));
    assert!(html.contains(r#"<label for="find">"#));
}

#[test]
fn logs_page_with_a_full_tail_stays_under_the_size_budget() {
    let lines: Vec<fl::LogEntry> = (0..pages::MAX_LOG_LINES)
        .map(|i| fl::LogEntry {
            data: Some(format!(
                "rank{} step {i} train/loss={:.4} lr=3e-4 tokens/s=123456",
                i % 8,
                1.0 / (i + 1) as f64
            )),
            source: Some("stdout".into()),
            key: Some("/u/j/0:0".into()),
            timestamp: Some(fl::Timestamp {
                epoch_ms: NOW + i as i64,
            }),
            ..Default::default()
        })
        .collect();
    let f = pages::LogsFilter::default();
    let v = pages::LogsView {
        id: "/u/j",
        is_task: false,
        filter: &f,
        lines: Ok(&lines),
        more: 1,
        cursor: 99,
        active: true,
    };
    let html = full(&pages::logs_page(&v));
    assert!(html.len() < 200_000, "logs page is {} bytes", html.len());
    assert!(html.contains(r#"data-cursor="99""#));
}

#[test]
fn backends_page_shows_free_over_total() {
    let ws = vec![c::WorkerHealthStatus {
        worker_id: Some("w0".into()),
        healthy: Some(true),
        metadata: Some(job::WorkerMetadata {
            cpu_count: Some(8),
            memory_bytes: Some(16 << 30),
            device: Some(job::DeviceConfig {
                device: Some(job::device_config::Device::Gpu(job::GpuDevice {
                    variant: "h100".into(),
                    count: 8,
                })),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }];
    let idle = model::variants(&ws, &[]);
    let html = full(&pages::backends_page(Ok(&idle)));
    assert!(html.contains("8/8</strong> free"), "{html}");
    assert!(html.contains("H100 GPU"));
    let held = model::variants(
        &ws,
        &[model::Hold {
            worker_id: "w0".into(),
            device: Some(job::device_config::Device::Gpu(job::GpuDevice {
                variant: "H100".into(),
                count: 8,
            })),
            band: 2,
            cpu_millicores: 1000,
            memory_bytes: 1 << 30,
        }],
    );
    let html = full(&pages::backends_page(Ok(&held)));
    assert!(html.contains("0/8</strong> free"));
    assert!(html.contains("interactive <strong>8</strong>"));
    let html = full(&pages::workers_page(
        Ok(&c::ListWorkersResponse {
            workers: ws,
            total_count: Some(1),
            has_more: Some(false),
        }),
        &BTreeMap::new(),
        NOW,
    ));
    assert!(html.contains("✓ healthy"));
}

#[test]
fn scheduler_and_query_pages_render() {
    let st = c::GetSchedulerStateResponse {
        total_pending: 3,
        total_running: 1,
        pending_buckets: vec![
            c::PendingTaskBucket {
                band: 3,
                user_id: "bob".into(),
                job_id: "/bob/batch".into(),
                count: 2,
                ..Default::default()
            },
            c::PendingTaskBucket {
                band: 1,
                user_id: "alice".into(),
                job_id: "/alice/prod".into(),
                count: 1,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let mut pending = BTreeMap::new();
    pending.insert(
        "/alice/prod".to_string(),
        vec![pages::PendingTask {
            task_id: "/alice/prod/0".into(),
            reason: "no worker with 8 h100".into(),
        }],
    );
    let html = full(&pages::scheduler_page(Ok(&st), &pending));
    let prod = html.find("Band production").expect("production band");
    let batch = html.find("Band batch").expect("batch band");
    assert!(prod < batch, "higher band first");
    assert!(html.contains("no worker with 8 h100"));
    let t = Table {
        columns: vec!["state".into(), "n".into()],
        rows: vec![vec![serde_json::json!(1), serde_json::json!(5)]],
    };
    let html = full(&pages::query_page("SELECT 1", Some(Ok(&t)), 1.5));
    assert!(html.contains(r#"<th scope="col">state</th>"#));
    let html = full(&pages::query_page(
        "SELEC",
        Some(Err("sql: syntax error")),
        0.1,
    ));
    assert!(html.contains("syntax error"));
}
