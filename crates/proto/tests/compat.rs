//! Wire-compatibility tests against the published Python `iris`/`finelog`
//! packages.
//!
//! The fixtures under `tests/fixtures/` were produced by `fixtures/gen.py`
//! with the published generated code; nothing here needs Python at test time.
//! Regenerate them with `python crates/proto/tests/fixtures/gen.py`.

use std::collections::BTreeSet;
use std::fmt::Debug;

use iris_proto::cluster::{controller, worker};
use iris_proto::finelog_logging as finelog;
use iris_proto::job;
use prost::Message;
use prost_types::field_descriptor_proto::Label;
use prost_types::{DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet};
use serde::de::DeserializeOwned;
use serde::Serialize;

macro_rules! fixture {
    ($name:literal) => {
        Fixture {
            name: $name,
            bin: include_bytes!(concat!("fixtures/", $name, ".bin")),
            json: include_str!(concat!("fixtures/", $name, ".json")),
            camel_json: include_str!(concat!("fixtures/", $name, ".camel.json")),
        }
    };
}

struct Fixture {
    name: &'static str,
    /// Python `SerializeToString(deterministic=True)`.
    bin: &'static [u8],
    /// Python `MessageToJson(preserving_proto_field_name=True)`.
    json: &'static str,
    /// Python `MessageToJson()` (lowerCamelCase names).
    camel_json: &'static str,
}

/// Decodes the Python encoding and checks every direction we can without
/// Python: re-encoding is byte-identical, re-decoding is equal, both Python
/// JSON spellings parse to the same message, and our JSON output equals
/// Python's canonical (camelCase) JSON.
fn check<T>(fx: &Fixture) -> T
where
    T: Message + Default + PartialEq + Debug + Serialize + DeserializeOwned,
{
    check_with(fx, true)
}

/// Like [`check`]; `exact_bytes = false` skips only the byte-identity check
/// (for messages whose canonical encodings legitimately differ, e.g. prost
/// omits a default-valued map value where Python writes an empty one).
fn check_with<T>(fx: &Fixture, exact_bytes: bool) -> T
where
    T: Message + Default + PartialEq + Debug + Serialize + DeserializeOwned,
{
    let name = fx.name;
    let msg = T::decode(fx.bin).unwrap_or_else(|e| panic!("{name}: decode failed: {e}"));

    let ours = msg.encode_to_vec();
    if exact_bytes {
        assert_eq!(
            ours, fx.bin,
            "{name}: re-encoding differs from Python's bytes"
        );
    }
    let again = T::decode(ours.as_slice()).expect("re-decode");
    assert_eq!(again, msg, "{name}: decode(encode(msg)) != msg");

    let from_snake: T =
        serde_json::from_str(fx.json).unwrap_or_else(|e| panic!("{name}: json: {e}"));
    assert_eq!(from_snake, msg, "{name}: snake_case JSON parse differs");
    let from_camel: T =
        serde_json::from_str(fx.camel_json).unwrap_or_else(|e| panic!("{name}: camel json: {e}"));
    assert_eq!(from_camel, msg, "{name}: camelCase JSON parse differs");

    let ours_json = serde_json::to_value(&msg).expect("serialize");
    let python_json: serde_json::Value =
        serde_json::from_str(fx.camel_json).expect("camel json value");
    assert_eq!(
        ours_json, python_json,
        "{name}: our JSON differs from Python's"
    );
    msg
}

#[test]
fn launch_job_request() {
    let req: controller::LaunchJobRequest = check(&fixture!("launch_job_request"));
    assert_eq!(req.name(), "/alice/train-llm");
    assert_eq!(req.bundle_blob(), b"PK\x03\x04\x00\xffbundle");

    let entry = req.entrypoint.as_ref().expect("entrypoint");
    assert_eq!(
        entry.setup_commands,
        ["uv sync", "source .venv/bin/activate"]
    );
    let argv = &entry.run_command.as_ref().expect("run_command").argv;
    assert_eq!(argv, &["python", "train.py", "--epochs", "10"]);
    assert_eq!(entry.workdir_files["data/blob.bin"], b"\x00\x01\x02\xff");
    assert_eq!(entry.workdir_file_refs["weights.pt"], "9f86d081884c7d65");

    let res = req.resources.as_ref().expect("resources");
    assert_eq!(res.cpu_millicores, 8000);
    assert_eq!(res.memory_bytes, 64 << 30);
    assert_eq!(res.disk_bytes, 200 << 30);
    match res.device.as_ref().and_then(|d| d.device.as_ref()) {
        Some(job::device_config::Device::Gpu(gpu)) => {
            assert_eq!(gpu.variant, "H100");
            assert_eq!(gpu.count, 8);
        }
        other => panic!("expected GPU device, got {other:?}"),
    }

    let env = req.environment.as_ref().expect("environment");
    assert_eq!(env.env_vars["WANDB_PROJECT"], "llm");
    assert_eq!(env.env_vars["HF_HOME"], "/cache/hf");
    assert_eq!(env.secrets["HF_TOKEN"], "hf_secret");
    assert_eq!(env.setup_scripts.len(), 1);

    assert_eq!(
        req.scheduling_timeout.as_ref().map(|d| d.milliseconds),
        Some(600_000)
    );
    assert_eq!(
        req.timeout.as_ref().map(|d| d.milliseconds),
        Some(86_400_000)
    );
    assert_eq!(req.ports, ["http", "actor"]);
    assert_eq!((req.max_task_failures(), req.max_retries_failure()), (3, 2));
    assert_eq!(req.max_retries_preemption, Some(1000));
    assert_eq!(req.replicas, Some(4));
    assert!(req.fail_if_exists());

    use job::attribute_value::Value;
    assert_eq!(req.constraints.len(), 4);
    let ne = &req.constraints[0];
    assert_eq!(ne.op(), job::ConstraintOp::Ne);
    assert_eq!(
        ne.value.as_ref().and_then(|v| v.value.clone()),
        Some(Value::StringValue("us-east1".into()))
    );
    let in_c = &req.constraints[1];
    assert_eq!(in_c.op(), job::ConstraintOp::In);
    assert!(in_c.value.is_none());
    let values: Vec<_> = in_c.values.iter().map(|v| v.value.clone()).collect();
    assert_eq!(
        values,
        [
            Some(Value::StringValue("a".into())),
            Some(Value::IntValue(0)),
            Some(Value::IntValue(-7)),
            Some(Value::FloatValue(2.5)),
        ]
    );
    let ge = &req.constraints[2];
    assert_eq!(ge.op(), job::ConstraintOp::Ge);
    assert_eq!(ge.mode(), job::ConstraintMode::Preferred);
    assert_eq!(req.constraints[3].op(), job::ConstraintOp::Exists);

    assert_eq!(
        req.coscheduling.as_ref().map(|c| c.group_by.as_str()),
        Some("tpu-name")
    );
    assert_eq!(req.priority_band(), job::PriorityBand::System);
    assert_eq!(req.priority_band, Some(4));
    assert_eq!(
        req.preemption_policy(),
        job::JobPreemptionPolicy::PreserveChildren
    );
    assert_eq!(req.existing_job_policy(), job::ExistingJobPolicy::Recreate);
    assert_eq!(req.container_profile(), job::ContainerProfile::DockerAccess);
    assert_eq!(req.egress_policy(), job::EgressPolicy::Internet);
    assert_eq!(req.client_revision_date(), "2026-01-15");
    let fed = req.federation.as_ref().expect("federation");
    assert_eq!(fed.requester_id, "parent-cluster");
    assert_eq!(fed.handoff_nonce, "n-42");
}

#[test]
fn job_status() {
    let st: job::JobStatus = check(&fixture!("job_status"));
    assert_eq!(st.job_id(), "/alice/train-llm");
    assert_eq!(st.state(), job::JobState::Running);
    assert_eq!(
        st.started_at.as_ref().map(|t| t.epoch_ms),
        Some(Some(1_700_000_000_000))
    );
    assert_eq!(
        st.finished_at.as_ref().map(|t| t.epoch_ms),
        Some(Some(1_700_000_900_000))
    );
    assert_eq!(
        st.submitted_at.as_ref().map(|t| t.epoch_ms),
        Some(Some(1_699_999_990_000))
    );
    assert_eq!(st.task_state_counts.len(), 3);
    assert_eq!(st.task_state_counts["running"], 2);
    assert_eq!(st.task_state_counts["pending"], 1);
    assert_eq!(st.task_state_counts["succeeded"], 1);
    assert_eq!(st.ports["http"], 8080);
    assert_eq!((st.task_count(), st.completed_count()), (4, 1));
    assert_eq!((st.failure_count(), st.preemption_count()), (1, 2));
    assert!(st.has_children());
    assert_eq!(st.parent_job_id(), "/alice");
    assert_eq!(st.peer_status(), job::PeerStatus::Synced);
    assert_eq!(st.tasks.len(), 1);
    match st
        .resources
        .as_ref()
        .and_then(|r| r.device.as_ref())
        .and_then(|d| d.device.as_ref())
    {
        Some(job::device_config::Device::Tpu(tpu)) => {
            assert_eq!(
                (tpu.variant.as_str(), tpu.topology.as_str(), tpu.count),
                ("v5litepod-16", "4x4", 4)
            );
        }
        other => panic!("expected TPU device, got {other:?}"),
    }
    let bm = st.build_metrics.as_ref().expect("build_metrics");
    assert!(bm.from_cache);
    assert!(bm.build_started.is_none());
}

#[test]
fn task_status() {
    let st: job::TaskStatus = check(&fixture!("task_status"));
    assert_eq!(st.task_id(), "/alice/train-llm/0");
    assert_eq!(st.state(), job::TaskState::Running);
    assert_eq!(st.current_attempt_id, Some(1));
    assert!(st.can_be_scheduled());
    assert_eq!(st.ports["actor"], 31001);
    assert_eq!(
        st.resource_usage.as_ref().map(|u| u.process_count),
        Some(12)
    );
    assert_eq!(st.attempts.len(), 2);

    let first = &st.attempts[0];
    assert_eq!(
        first.attempt_id, None,
        "attempt 0 is left unset by the fixture"
    );
    assert_eq!(first.state(), job::TaskState::Preempted);
    assert_eq!(first.exit_code, Some(137));
    assert!(first.is_worker_failure());
    assert_eq!(first.attempt_uid(), "0000000000000000");
    assert_eq!(first.terminal_reason(), "OOMKilled");
    let archive = first.output_archive.as_ref().expect("output_archive");
    assert_eq!(
        archive.state(),
        job::task_output_archive::State::TaskOutputArchiveStateUploaded
    );
    assert_eq!(
        archive.retention(),
        job::task_output_archive::Retention::TaskOutputArchiveRetentionTtl
    );
    assert_eq!(archive.size_bytes, Some(123_456_789_012));
    assert_eq!(archive.skipped_sample[0].path, "core.1234");

    let second = &st.attempts[1];
    assert_eq!(second.attempt_id, Some(1));
    assert_eq!(second.state(), job::TaskState::Running);
    assert!(second.finished_at.is_none());
    assert!(second.output_archive.is_none());
}

#[test]
fn reconcile_request() {
    use worker::desired_attempt::Intent;

    let req: worker::ReconcileRequest = check(&fixture!("reconcile_request"));
    assert_eq!(req.worker_id, "worker-7");
    assert_eq!(req.desired.len(), 4);

    let Some(Intent::Run(spec)) = &req.desired[0].intent else {
        panic!("expected run intent: {:?}", req.desired[0]);
    };
    let run = spec.request.as_ref().expect("run request");
    assert_eq!(run.task_id, "/alice/train-llm/3");
    assert_eq!(run.attempt_id, 2);
    assert_eq!(run.attempt_uid, "00000000deadbeef");
    assert_eq!(run.priority(), job::PriorityBand::Batch);
    assert_eq!(run.container_profile(), job::ContainerProfile::Sandbox);
    assert_eq!(run.egress_policy(), job::EgressPolicy::None);
    assert!(matches!(
        run.resources
            .as_ref()
            .and_then(|r| r.device.as_ref())
            .and_then(|d| d.device.as_ref()),
        Some(job::device_config::Device::Cpu(_))
    ));

    // A run directive with no spec attached.
    assert_eq!(
        req.desired[1].intent,
        Some(Intent::Run(worker::AttemptSpec { request: None }))
    );
    assert_eq!(
        req.desired[2].intent,
        Some(Intent::Stop(worker::StopReason::Preempted as i32))
    );
    // The zero enum value still selects the oneof member.
    assert_eq!(
        req.desired[3].intent,
        Some(Intent::Stop(worker::StopReason::Unspecified as i32))
    );
}

#[test]
fn reconcile_response() {
    let resp: worker::ReconcileResponse = check(&fixture!("reconcile_response"));
    assert_eq!(resp.observed.len(), 3);
    assert_eq!(resp.observed[0].state(), job::TaskState::Running);
    assert_eq!(resp.observed[1].state(), job::TaskState::Failed);
    assert_eq!(resp.observed[1].exit_code, 1);
    assert_eq!(
        resp.observed[1].finished_at.as_ref().map(|t| t.epoch_ms),
        Some(Some(1_700_000_500_000))
    );
    assert_eq!(resp.observed[2].state(), job::TaskState::Missing);
    let health = resp.health.as_ref().expect("health");
    assert!(health.healthy);
    let snap = health.resources.as_ref().expect("resources");
    assert_eq!(snap.host_cpu_percent, 37);
    assert_eq!(snap.net_recv_bytes, (1 << 40) + 3);
    assert_eq!(snap.total_process_count, 311);
}

#[test]
fn fetch_logs_request() {
    let req: finelog::FetchLogsRequest = check(&fixture!("fetch_logs_request"));
    assert_eq!(req.source, "/alice/train-llm/");
    assert_eq!(req.match_scope(), finelog::MatchScope::Prefix);
    assert_eq!(
        (req.since_ms, req.cursor, req.until_cursor),
        (1_700_000_000_000, 981_234, 9_999_999_999)
    );
    assert_eq!(req.max_lines, 500);
    assert!(req.tail);
    assert_eq!(req.min_level, "WARNING");
    assert_eq!(req.cluster, "us-central");
    assert_eq!(req.regex, r"step \d+");
    assert_eq!(req.substring, "loss=");
}

#[test]
fn fetch_logs_response() {
    let resp: finelog::FetchLogsResponse = check(&fixture!("fetch_logs_response"));
    assert_eq!(resp.cursor, 981_240);
    assert_eq!(resp.entries.len(), 2);
    let first = &resp.entries[0];
    assert_eq!(first.data(), "step 1 loss=2.31 \u{2713}");
    assert_eq!(first.level(), finelog::LogLevel::Info);
    assert_eq!(
        first.timestamp.as_ref().map(|t| t.epoch_ms),
        Some(1_700_000_000_001)
    );
    assert_eq!(first.seq, Some(981_239));
    assert_eq!(resp.entries[1].level(), finelog::LogLevel::Warning);

    // iris.logging.LogEntry is documented as wire-identical to finelog's.
    let iris_entry = iris_proto::iris::logging::LogEntry::decode(first.encode_to_vec().as_slice())
        .expect("decode");
    assert_eq!(iris_entry.key, first.key());
    // finelog's entry has explicit presence (a set zero is on the wire), iris's does not: the
    // same message either way, read back with the zeros set.
    let back =
        finelog::LogEntry::decode(iris_entry.encode_to_vec().as_slice()).expect("decode back");
    assert_eq!(back.data(), first.data());
    assert_eq!(back.seq(), first.seq());
    assert_eq!(back.level(), first.level());
    assert_eq!(back.timestamp, first.timestamp);
}

#[test]
fn profile_task_request_keeps_explicit_false() {
    let req: job::ProfileTaskRequest = check(&fixture!("profile_task_request"));
    assert_eq!(req.target, "/alice/train-llm/0:1");
    assert_eq!(req.duration_seconds, 15);
    let Some(job::profile_type::Profiler::Cpu(cpu)) = req.profile_type.and_then(|p| p.profiler)
    else {
        panic!("expected cpu profiler");
    };
    assert_eq!(cpu.format(), job::cpu_profile::Format::Speedscope);
    assert_eq!(cpu.rate_hz, 100);
    // `native` has explicit presence: an explicit false must survive.
    assert_eq!(cpu.native, Some(false));
    assert!(job::CpuProfile::default().native.is_none());
}

#[test]
fn list_backends_response() {
    // Not byte-exact: the `"empty"` entry of `advertised_attributes` maps to an
    // empty StringList, which Python writes as `value {}` and prost omits
    // (a map entry without a value decodes to the default on both sides).
    let resp: controller::ListBackendsResponse =
        check_with(&fixture!("list_backends_response"), false);
    assert_eq!(resp.backends.len(), 2);
    let k8s = &resp.backends[0];
    assert_eq!(k8s.advertised_attributes["device"].values, ["h100", "a100"]);
    assert!(k8s.advertised_attributes["empty"].values.is_empty());
    match k8s.detail.as_ref().and_then(|d| d.detail.as_ref()) {
        Some(controller::backend_status::Detail::Kubernetes(k)) => {
            assert_eq!(k.namespace, "iris");
            assert_eq!(k.nodes[0].cpu_millicores, 96_000);
        }
        other => panic!("expected kubernetes detail, got {other:?}"),
    }
    let avail = k8s.availability.as_ref().expect("availability");
    assert_eq!(avail.version, 2);
    assert_eq!(avail.held_by_band[0].band(), job::PriorityBand::Batch);
    assert_eq!(avail.held_by_band[0].amounts["h100"], 16);
    match resp.backends[1]
        .detail
        .as_ref()
        .and_then(|d| d.detail.as_ref())
    {
        Some(controller::backend_status::Detail::Worker(w)) => {
            let groups = &w.autoscaler.as_ref().expect("autoscaler").groups;
            assert_eq!(groups[0].slice_state_counts["ready"], 2);
        }
        other => panic!("expected worker detail, got {other:?}"),
    }
}

#[test]
fn unknown_enum_values_round_trip() {
    // Enums are open on both sides: an unknown number must survive a round trip.
    let st = job::JobStatus {
        state: Some(99),
        ..Default::default()
    };
    let back = job::JobStatus::decode(st.encode_to_vec().as_slice()).expect("decode");
    assert_eq!(back.state, Some(99));
    assert!(job::JobState::try_from(back.state.unwrap_or_default()).is_err());
}

#[test]
fn service_method_tables() {
    assert_eq!(
        iris_proto::CONTROLLER_SERVICE,
        "iris.cluster.ControllerService"
    );
    assert_eq!(iris_proto::CONTROLLER_METHODS.len(), 30);
    assert_eq!(iris_proto::CONTROLLER_METHODS[0], "LaunchJob");
    assert_eq!(
        iris_proto::CONTROLLER_METHODS.last(),
        Some(&"FederationSync")
    );
    assert_eq!(iris_proto::ENDPOINT_SERVICE, "iris.cluster.EndpointService");
    assert_eq!(
        iris_proto::ENDPOINT_METHODS,
        ["RegisterEndpoint", "UnregisterEndpoint", "ListEndpoints"]
    );
    assert_eq!(iris_proto::WORKER_SERVICE, "iris.cluster.WorkerService");
    assert_eq!(
        iris_proto::WORKER_METHODS,
        [
            "GetTaskStatus",
            "ListTasks",
            "HealthCheck",
            "ProfileTask",
            "GetProcessStatus",
            "ExecInContainer",
            "Reconcile"
        ]
    );
    assert_eq!(iris_proto::LOG_SERVICE, "finelog.logging.LogService");
    assert_eq!(iris_proto::LOG_METHODS, ["PushLogs", "FetchLogs"]);

    // The tables agree with the service definitions in the golden listing.
    let golden = include_str!("fixtures/python_descriptor_listing.txt");
    for (service, methods) in [
        (
            iris_proto::CONTROLLER_SERVICE,
            iris_proto::CONTROLLER_METHODS,
        ),
        (iris_proto::ENDPOINT_SERVICE, iris_proto::ENDPOINT_METHODS),
        (iris_proto::WORKER_SERVICE, iris_proto::WORKER_METHODS),
        (iris_proto::LOG_SERVICE, iris_proto::LOG_METHODS),
    ] {
        let header = format!("service {service}\n");
        let start = golden
            .find(&header)
            .map(|i| i + header.len())
            .expect("service in listing");
        let listed: Vec<&str> = golden[start..]
            .lines()
            .take_while(|l| l.starts_with("  rpc "))
            .filter_map(|l| l.split_whitespace().nth(1))
            .collect();
        assert_eq!(listed, methods, "{service}");
    }
}

// ---------------------------------------------------------------------------
// Schema listing: our descriptors vs the published Python descriptors.
// Must render exactly like `listing()` in fixtures/gen.py.
// ---------------------------------------------------------------------------

fn label(field: &FieldDescriptorProto) -> &'static str {
    match field.label() {
        Label::Optional => "optional",
        Label::Required => "required",
        Label::Repeated => "repeated",
    }
}

fn type_name(field: &FieldDescriptorProto) -> String {
    let ty = field
        .r#type()
        .as_str_name()
        .trim_start_matches("TYPE_")
        .to_ascii_lowercase();
    match field.type_name.as_deref() {
        Some(name) if !name.is_empty() => format!("{ty} {name}"),
        _ => ty,
    }
}

fn listing_message(prefix: &str, msg: &DescriptorProto, out: &mut Vec<(String, Vec<String>)>) {
    let full = format!("{prefix}.{}", msg.name());
    let mut lines = vec![format!("message {full}")];
    if msg.options.as_ref().is_some_and(|o| o.map_entry()) {
        lines.push("  map_entry".into());
    }
    let real_oneofs: BTreeSet<i32> = msg
        .field
        .iter()
        .filter(|f| !f.proto3_optional())
        .filter_map(|f| f.oneof_index)
        .collect();
    for (i, oneof) in msg.oneof_decl.iter().enumerate() {
        if i32::try_from(i).is_ok_and(|i| real_oneofs.contains(&i)) {
            lines.push(format!("  oneof {}", oneof.name()));
        }
    }
    let mut fields: Vec<_> = msg.field.iter().collect();
    fields.sort_by_key(|f| f.number());
    for f in fields {
        let mut line = format!(
            "  field {} {} {} {} json={}",
            f.number(),
            f.name(),
            label(f),
            type_name(f),
            f.json_name()
        );
        if let Some(idx) = f.oneof_index.filter(|i| real_oneofs.contains(i)) {
            let oneof = &msg.oneof_decl[usize::try_from(idx).expect("oneof index")];
            line.push_str(&format!(" oneof={}", oneof.name()));
        }
        lines.push(line);
    }
    let mut ranges: Vec<_> = msg
        .reserved_range
        .iter()
        .map(|r| (r.start(), r.end()))
        .collect();
    ranges.sort_unstable();
    lines.extend(
        ranges
            .into_iter()
            .map(|(s, e)| format!("  reserved {s}..{e}")),
    );
    let mut names = msg.reserved_name.clone();
    names.sort();
    lines.extend(names.into_iter().map(|n| format!("  reserved_name {n}")));
    out.push((full.clone(), lines));
    for nested in &msg.nested_type {
        listing_message(&full, nested, out);
    }
    for e in &msg.enum_type {
        listing_enum(&full, e, out);
    }
}

fn listing_enum(prefix: &str, e: &EnumDescriptorProto, out: &mut Vec<(String, Vec<String>)>) {
    let full = format!("{prefix}.{}", e.name());
    let mut lines = vec![format!("enum {full}")];
    let mut values: Vec<_> = e.value.iter().collect();
    values.sort_by(|a, b| (a.number(), a.name()).cmp(&(b.number(), b.name())));
    for v in values {
        let deprecated = if v.options.as_ref().is_some_and(|o| o.deprecated()) {
            " deprecated"
        } else {
            ""
        };
        lines.push(format!("  value {} {}{deprecated}", v.number(), v.name()));
    }
    let mut ranges: Vec<_> = e
        .reserved_range
        .iter()
        .map(|r| (r.start(), r.end()))
        .collect();
    ranges.sort_unstable();
    lines.extend(
        ranges
            .into_iter()
            .map(|(s, end)| format!("  reserved {s}..={end}")),
    );
    let mut names = e.reserved_name.clone();
    names.sort();
    lines.extend(names.into_iter().map(|n| format!("  reserved_name {n}")));
    out.push((full, lines));
}

/// Packages of our own, with no published counterpart: left out of the comparison with Python
/// and pinned by their own listing instead; and finelog's stats schema, of which we declare the
/// part `StatsService` exchanges (checked by `stats_listing_is_a_subset_of_python`).
const OUR_PACKAGES: &[&str] = &["iris.inspect", "finelog.stats"];

/// The listing of the published packages (everything but [`OUR_PACKAGES`]).
fn our_listing() -> String {
    listing(|package| !OUR_PACKAGES.contains(&package))
}

fn listing(include: impl Fn(&str) -> bool) -> String {
    let fds = FileDescriptorSet::decode(iris_proto::FILE_DESCRIPTOR_SET).expect("descriptor set");
    let mut entries = Vec::new();
    for file in fds.file.iter().filter(|f| include(f.package())) {
        let prefix = file.package();
        for msg in &file.message_type {
            listing_message(prefix, msg, &mut entries);
        }
        for e in &file.enum_type {
            listing_enum(prefix, e, &mut entries);
        }
        for svc in &file.service {
            let full = format!("{prefix}.{}", svc.name());
            let mut lines = vec![format!("service {full}")];
            for m in &svc.method {
                let stream = if m.client_streaming() || m.server_streaming() {
                    format!(
                        " stream={}{}",
                        u8::from(m.client_streaming()),
                        u8::from(m.server_streaming())
                    )
                } else {
                    String::new()
                };
                lines.push(format!(
                    "  rpc {} {} {}{stream}",
                    m.name(),
                    m.input_type(),
                    m.output_type()
                ));
            }
            entries.push((full, lines));
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
        .into_iter()
        .map(|(_, lines)| lines.join("\n") + "\n")
        .collect()
}

/// Fields we add to published messages on purpose, as their listing lines: `ListJobs` keyset
/// paging and its bounded count (ARCHITECTURE.md, "`ListJobs` at scale"). Numbered from 1001 so
/// that a field the reference adds later cannot take their number; its clients never send them,
/// and our controller sets the answer's only when asked or when the count stopped at its cap.
const OUR_EXTENSIONS: &[&str] = &[
    "  field 1001 page_token optional string json=pageToken",
    "  field 1001 next_page_token optional string json=nextPageToken",
    "  field 1002 total_count_is_lower_bound optional bool json=totalCountIsLowerBound",
];

#[test]
fn descriptor_listing_matches_python() {
    let golden = include_str!("fixtures/python_descriptor_listing.txt");
    let full = our_listing();
    for ext in OUR_EXTENSIONS {
        assert!(
            full.lines().any(|l| l == *ext),
            "OUR_EXTENSIONS names a field we no longer have: {ext}"
        );
    }
    let ours: String = full
        .lines()
        .filter(|l| !OUR_EXTENSIONS.contains(l))
        .map(|l| format!("{l}\n"))
        .collect();
    if ours != golden {
        let golden_lines: BTreeSet<&str> = golden.lines().collect();
        let our_lines: BTreeSet<&str> = ours.lines().collect();
        let missing: Vec<_> = golden_lines.difference(&our_lines).collect();
        let extra: Vec<_> = our_lines.difference(&golden_lines).collect();
        panic!(
            "schema drift vs published Python protos\nonly in Python ({}):\n{}\nonly in ours ({}):\n{}",
            missing.len(),
            missing.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n"),
            extra.len(),
            extra.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n"),
        );
    }
}

/// finelog's stats schema: every message, enum and service we declare is the published one's,
/// field for field (same number, name, type and JSON name); what we leave out is either a whole
/// message or a field we reserve. The service is declared whole, in the published order.
#[test]
fn stats_listing_is_a_subset_of_python() {
    fn entries(text: &str) -> std::collections::BTreeMap<&str, Vec<&str>> {
        let mut out = std::collections::BTreeMap::new();
        let mut current: Option<&str> = None;
        for line in text.lines() {
            if line.starts_with(' ') {
                if let Some(h) = current {
                    out.entry(h).or_insert_with(Vec::new).push(line);
                }
            } else {
                current = Some(line);
                out.entry(line).or_insert_with(Vec::new);
            }
        }
        out
    }
    let golden = include_str!("fixtures/python_stats_listing.txt");
    let ours = listing(|package| package == "finelog.stats");
    let (python, ours) = (entries(golden), entries(&ours));
    assert!(
        ours.len() >= 30,
        "the stats schema is declared ({} entries)",
        ours.len()
    );
    for (header, lines) in &ours {
        let theirs = python
            .get(header)
            .unwrap_or_else(|| panic!("{header} is not in the published stats schema"));
        if header.starts_with("service ") {
            assert_eq!(
                lines, theirs,
                "{header}: every method, in the published order"
            );
            continue;
        }
        for line in lines {
            if let Some(range) = line.trim().strip_prefix("reserved ") {
                // A field we deliberately do not read: the published message has it.
                let (lo, hi) = range.split_once("..").unwrap_or((range, range));
                let lo: u32 = lo.trim_start_matches('=').parse().unwrap_or(0);
                let hi: u32 = hi.trim_start_matches('=').parse().unwrap_or(lo);
                for n in lo..hi.max(lo + 1) {
                    let prefix = format!("  field {n} ");
                    assert!(
                        theirs.iter().any(|l| l.starts_with(&prefix)),
                        "{header}: reserved {n} is not a published field"
                    );
                }
                continue;
            }
            assert!(
                theirs.contains(line),
                "{header}: `{line}` differs from the published schema"
            );
        }
    }
}

/// Our own `iris.inspect` package keeps its field numbers too: a change here is a wire break
/// for dashboards and CLIs of the previous release. After an addition, rewrite the fixture with
/// `UPDATE_INSPECT_LISTING=1 cargo test -p iris-proto --test compat`.
#[test]
fn inspect_listing_is_pinned() {
    let golden = include_str!("fixtures/inspect_descriptor_listing.txt");
    let ours = listing(|package| package == "iris.inspect");
    if std::env::var_os("UPDATE_INSPECT_LISTING").is_some() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/inspect_descriptor_listing.txt"
        );
        std::fs::write(path, &ours).expect("write the inspect listing");
        return;
    }
    assert_eq!(
        ours, golden,
        "iris.inspect changed; new fields and methods may be appended, numbers never change"
    );
    assert_eq!(iris_proto::INSPECT_SERVICE, "iris.inspect.InspectService");
    assert_eq!(
        iris_proto::INSPECT_METHODS,
        [
            "ListTaskEvents",
            "CountJobs",
            "ListAttempts",
            "ListResourceHolds",
            "ListHandoffs",
            "GetCheckpointStatus",
            "ExplainTask",
            "ListTaskSamples"
        ]
    );
}
