//! One clap command per RPC method, generated from the method's descriptor: `--json` (the
//! whole request body) plus a flag per singular scalar field of the request message, the same
//! set the published CLI derives. [`request_body`] merges the flags over `--json` into the
//! Connect JSON body (proto3 JSON names, lowerCamelCase).

use anyhow::bail;
use clap::{Arg, ArgAction, ArgMatches, Command};
use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor, MethodDescriptor};
use serde_json::{Map, Value};

/// The id of the `--json` argument (not a valid proto field name, so it never collides).
const JSON_ARG: &str = "--json";

/// How a field's flag parses its value. Repeated, map, message, enum and bytes fields get no
/// flag (the published CLI gives them none either): they are set through `--json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlagKind {
    Str,
    I32,
    I64,
    U32,
    U64,
    Float,
    Bool,
}

pub(crate) fn flag_kind(field: &FieldDescriptor) -> Option<FlagKind> {
    if field.is_list() || field.is_map() {
        return None;
    }
    Some(match field.kind() {
        Kind::String => FlagKind::Str,
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => FlagKind::I32,
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => FlagKind::I64,
        Kind::Uint32 | Kind::Fixed32 => FlagKind::U32,
        Kind::Uint64 | Kind::Fixed64 => FlagKind::U64,
        Kind::Float | Kind::Double => FlagKind::Float,
        Kind::Bool => FlagKind::Bool,
        Kind::Bytes | Kind::Message(_) | Kind::Enum(_) => return None,
    })
}

/// `ListTasks` → `list-tasks` (a dash before every capital but the first, as the published
/// CLI spells its commands).
pub(crate) fn kebab(pascal: &str) -> String {
    let mut out = String::with_capacity(pascal.len() + 4);
    for (i, c) in pascal.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The no-flag of a bool field (`--no-<name>`), as an argument id.
fn negated(field: &FieldDescriptor) -> String {
    format!("no-{}", field.name())
}

/// The command for one method: `<kebab-name> [--json TEXT] [--<field> VALUE]...`.
pub(crate) fn method_command(method: &MethodDescriptor) -> Command {
    let input = method.input();
    let signature = format!("RPC: {} -> {}", input.name(), method.output().name());
    let about = match leading_comment(method.parent_file().file_descriptor_proto(), method.path()) {
        Some(doc) => format!("{doc} ({signature})"),
        None => signature,
    };
    let mut cmd = Command::new(kebab(method.name()))
        .alias(method.name().to_string())
        .about(about)
        .arg(
            Arg::new(JSON_ARG)
                .long("json")
                .value_name("TEXT")
                .help("Full JSON request body; the flags below override its fields"),
        );
    for field in input.fields() {
        let Some(kind) = flag_kind(&field) else {
            continue;
        };
        let long = field.name().replace('_', "-");
        let help = leading_comment(field.parent_file().file_descriptor_proto(), field.path());
        let help = help.unwrap_or_else(|| format!("Request field {}", field.name()));
        let arg = Arg::new(field.name().to_string())
            .long(long.clone())
            .help(help);
        cmd = match kind {
            FlagKind::Bool => cmd
                .arg(
                    arg.action(ArgAction::SetTrue)
                        .overrides_with(negated(&field)),
                )
                .arg(
                    Arg::new(negated(&field))
                        .long(format!("no-{long}"))
                        .action(ArgAction::SetTrue)
                        .overrides_with(field.name().to_string())
                        .help(format!("Send {} = false", field.name())),
                ),
            FlagKind::Str => cmd.arg(arg.value_name("TEXT")),
            FlagKind::I32 => cmd.arg(numeric(arg, clap::value_parser!(i32))),
            FlagKind::I64 => cmd.arg(numeric(arg, clap::value_parser!(i64))),
            FlagKind::U32 => cmd.arg(numeric(arg, clap::value_parser!(u32))),
            FlagKind::U64 => cmd.arg(numeric(arg, clap::value_parser!(u64))),
            FlagKind::Float => cmd.arg(
                arg.value_name("FLOAT")
                    .allow_negative_numbers(true)
                    .value_parser(clap::value_parser!(f64)),
            ),
        };
    }
    cmd
}

fn numeric(
    arg: Arg,
    parser: impl clap::builder::IntoResettable<clap::builder::ValueParser>,
) -> Arg {
    arg.value_name("INTEGER")
        .allow_negative_numbers(true)
        .value_parser(parser)
}

/// The flags given on the command line, as (field, JSON value) in field order.
pub(crate) fn flag_values(
    input: &MessageDescriptor,
    m: &ArgMatches,
) -> Vec<(FieldDescriptor, Value)> {
    let mut out = Vec::new();
    for field in input.fields() {
        let Some(kind) = flag_kind(&field) else {
            continue;
        };
        let id = field.name();
        let value = match kind {
            FlagKind::Bool => {
                if m.get_flag(id) {
                    Some(Value::Bool(true))
                } else if m.get_flag(&negated(&field)) {
                    Some(Value::Bool(false))
                } else {
                    None
                }
            }
            FlagKind::Str => m.get_one::<String>(id).map(|s| Value::from(s.as_str())),
            FlagKind::I32 => m.get_one::<i32>(id).map(|v| Value::from(*v)),
            FlagKind::I64 => m.get_one::<i64>(id).map(|v| Value::from(*v)),
            FlagKind::U32 => m.get_one::<u32>(id).map(|v| Value::from(*v)),
            FlagKind::U64 => m.get_one::<u64>(id).map(|v| Value::from(*v)),
            FlagKind::Float => m.get_one::<f64>(id).map(|v| Value::from(*v)),
        };
        if let Some(v) = value {
            out.push((field, v));
        }
    }
    out
}

/// The request body: `--json` (an object; `{}` when absent) with each given flag set over it
/// under the field's JSON name (replacing either spelling of that field in `--json`).
pub(crate) fn request_body(
    json: Option<&str>,
    flags: Vec<(FieldDescriptor, Value)>,
) -> anyhow::Result<Value> {
    let mut body = match json {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            Ok(other) => bail!(
                "--json must be a JSON object such as '{{\"jobId\": \"/alice/x\"}}', not {}",
                json_kind(&other)
            ),
            Err(e) => bail!("--json is not valid JSON ({e}); pass an object such as '{{}}'"),
        },
    };
    for (field, value) in flags {
        body.remove(field.name());
        body.insert(field.json_name().to_string(), value);
    }
    Ok(Value::Object(body))
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The `--json` text given to a method command.
pub(crate) fn json_arg(m: &ArgMatches) -> Option<&str> {
    m.get_one::<String>(JSON_ARG).map(String::as_str)
}

/// The comment just above the element at `path` in its `.proto` file, as one line.
fn leading_comment(
    file: &prost_reflect::prost_types::FileDescriptorProto,
    path: &[i32],
) -> Option<String> {
    let info = file.source_code_info.as_ref()?;
    let loc = info.location.iter().find(|l| l.path == path)?;
    let text = loc.leading_comments.as_deref()?;
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    (!joined.is_empty()).then_some(joined)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::rpc::pool;

    fn method(service: &str, name: &str) -> MethodDescriptor {
        let svc = pool()
            .get_service_by_name(service)
            .expect("service in the pool");
        let m = svc.methods().find(|m| m.name() == name);
        m.expect("method in the service")
    }

    fn flags_of(service: &str, name: &str) -> Vec<String> {
        let cmd = method_command(&method(service, name));
        let mut out: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn method_names_are_kebab_case() {
        assert_eq!(kebab("ListTasks"), "list-tasks");
        assert_eq!(
            kebab("GetKubernetesClusterStatus"),
            "get-kubernetes-cluster-status"
        );
        assert_eq!(kebab("Call"), "call");
    }

    #[test]
    fn flags_are_the_singular_scalar_fields() {
        // The published CLI's `rpc controller launch-job` flags, exactly.
        assert_eq!(
            flags_of(iris_proto::CONTROLLER_SERVICE, "LaunchJob"),
            [
                "--bundle-id",
                "--client-revision-date",
                "--fail-if-exists",
                "--json",
                "--max-retries-failure",
                "--max-retries-preemption",
                "--max-task-failures",
                "--name",
                "--no-fail-if-exists",
                "--replicas",
                "--task-image",
            ]
        );
        assert_eq!(
            flags_of(iris_proto::CONTROLLER_SERVICE, "ListJobs"),
            ["--json"]
        );
        assert_eq!(
            flags_of(iris_proto::WORKER_SERVICE, "Reconcile"),
            ["--json", "--worker-id"]
        );
        assert_eq!(
            flags_of(iris_proto::ACTOR_SERVICE, "Call"),
            ["--actor-name", "--json", "--method-name"]
        );
    }

    fn parse(service: &str, name: &str, argv: &[&str]) -> anyhow::Result<Value> {
        let m = method(service, name);
        let matches = method_command(&m).try_get_matches_from(argv)?;
        request_body(json_arg(&matches), flag_values(&m.input(), &matches))
    }

    #[test]
    fn flags_merge_over_json_under_json_names() {
        let body = parse(
            iris_proto::CONTROLLER_SERVICE,
            "LaunchJob",
            &[
                "launch-job",
                "--json",
                r#"{"name": "old", "max_task_failures": 7, "priority": "PRIORITY_BAND_BATCH"}"#,
                "--name",
                "/u/new",
                "--replicas",
                "-3",
                "--max-task-failures",
                "2",
                "--no-fail-if-exists",
            ],
        )
        .expect("parses");
        assert_eq!(
            body,
            serde_json::json!({
                "name": "/u/new",
                "replicas": -3,
                "maxTaskFailures": 2,
                "failIfExists": false,
                "priority": "PRIORITY_BAND_BATCH",
            })
        );
    }

    #[test]
    fn the_last_of_a_bool_pair_wins_and_absent_flags_send_nothing() {
        let body = parse(
            iris_proto::CONTROLLER_SERVICE,
            "LaunchJob",
            &["launch-job", "--no-fail-if-exists", "--fail-if-exists"],
        )
        .expect("parses");
        assert_eq!(body, serde_json::json!({ "failIfExists": true }));
        let body =
            parse(iris_proto::CONTROLLER_SERVICE, "ListJobs", &["list-jobs"]).expect("parses");
        assert_eq!(body, serde_json::json!({}));
    }

    #[test]
    fn bad_input_names_the_flag() {
        let e = parse(
            iris_proto::CONTROLLER_SERVICE,
            "LaunchJob",
            &["launch-job", "--replicas", "many"],
        )
        .expect_err("not a number");
        assert!(e.to_string().contains("--replicas"), "{e}");
        let e = parse(
            iris_proto::CONTROLLER_SERVICE,
            "ListJobs",
            &["list-jobs", "--json", "[1]"],
        )
        .expect_err("not an object");
        assert!(
            e.to_string().contains("--json must be a JSON object"),
            "{e}"
        );
        let e = parse(
            iris_proto::CONTROLLER_SERVICE,
            "ListJobs",
            &["list-jobs", "--json", "{"],
        )
        .expect_err("not JSON");
        assert!(e.to_string().contains("--json is not valid JSON"), "{e}");
    }
}
