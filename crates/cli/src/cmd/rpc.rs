//! `iris rpc <service> <method>`: calls any method of the controller, worker, actor or inspect
//! service. The command tree is generated at run time from the descriptors `iris-proto` embeds
//! (one command per method, a flag per singular scalar request field, see [`flags`]), like the
//! published CLI's; the reply is printed as pretty proto3 JSON, and an error status exits 1 with
//! its code and message.
//!
//! The address is `--controller-url` (or the usual controller resolution) for every service:
//! `rpc worker` and `rpc actor` talk to whatever URL they are given, e.g. a worker's address or
//! an actor endpoint's `<controller>/proxy/<name>` URL.

mod flags;
mod render;
pub(crate) mod wire;

use crate::client::controller_client;
use crate::keys;
use anyhow::Context as _;
use clap::{ArgMatches, Command};
use prost_reflect::{DescriptorPool, DynamicMessage, MethodDescriptor};
use std::sync::OnceLock;
use std::time::Duration;

/// `iris rpc` subcommand groups: (group name, fully-qualified service, about).
const SERVICES: &[(&str, &str, &str)] = &[
    (
        "controller",
        iris_proto::CONTROLLER_SERVICE,
        "Controller service RPC methods",
    ),
    (
        "worker",
        iris_proto::WORKER_SERVICE,
        "Worker service RPC methods (--controller-url: the worker's address)",
    ),
    (
        "actor",
        iris_proto::ACTOR_SERVICE,
        "Actor service RPC methods (--controller-url: the actor server, e.g. \
         <controller>/proxy/<endpoint name with dots for slashes>)",
    ),
    (
        "inspect",
        iris_proto::INSPECT_SERVICE,
        "Iris's typed reads (iris.inspect.InspectService; not in the published protocol)",
    ),
];

/// How long one call may take: generous, since some methods (launch-job with a bundle,
/// profile-task, exec-in-container) legitimately take minutes.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// The descriptors of every `.proto` file in `iris-proto`.
pub(crate) fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(iris_proto::FILE_DESCRIPTOR_SET)
            .expect("iris-proto's build script embeds a valid descriptor set")
    })
}

/// The parsed `iris rpc ...` command line (the tree is built at run time, so it is kept as
/// clap's matches).
pub(crate) struct RpcArgs {
    matches: ArgMatches,
}

impl clap::FromArgMatches for RpcArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(RpcArgs { matches: m.clone() })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        self.matches = m.clone();
        Ok(())
    }
}

impl clap::Args for RpcArgs {
    fn augment_args(cmd: Command) -> Command {
        rpc_command(cmd)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        rpc_command(cmd)
    }
}

/// Adds the service groups to `rpc`; each group's methods are built only when it is used.
fn rpc_command(cmd: Command) -> Command {
    // `defer` takes a plain fn, so each group names its service in its own closure.
    let deferred: [fn(Command) -> Command; 4] = [
        |c| with_methods(c, SERVICES[0].1),
        |c| with_methods(c, SERVICES[1].1),
        |c| with_methods(c, SERVICES[2].1),
        |c| with_methods(c, SERVICES[3].1),
    ];
    let mut cmd = cmd.subcommand_required(true).arg_required_else_help(true);
    for (&(group, _, about), defer) in SERVICES.iter().zip(deferred) {
        cmd = cmd.subcommand(
            Command::new(group)
                .about(about)
                .subcommand_required(true)
                .arg_required_else_help(true)
                .defer(defer),
        );
    }
    cmd
}

/// One subcommand per method of `service`, sorted by name.
fn with_methods(cmd: Command, service: &str) -> Command {
    let Some(svc) = pool().get_service_by_name(service) else {
        return cmd;
    };
    let mut methods: Vec<MethodDescriptor> = svc.methods().collect();
    methods.sort_by(|a, b| a.name().cmp(b.name()));
    cmd.subcommands(methods.iter().map(flags::method_command))
}

pub(crate) async fn run(args: RpcArgs, url: Option<String>) -> anyhow::Result<i32> {
    let (group, group_m) = args
        .matches
        .subcommand()
        .context("name a service: iris rpc controller|worker|actor|inspect <method>")?;
    let (method_name, method_m) = group_m
        .subcommand()
        .with_context(|| format!("name a method: iris rpc {group} <method> (see --help)"))?;
    let method = find_method(group, method_name)?;
    let body = flags::request_body(
        flags::json_arg(method_m),
        flags::flag_values(&method.input(), method_m),
    )?;
    let request = to_message(&method, body)?;
    let target = wire::Target::new(controller_client(&url)?.base(), keys::cli_token());
    match wire::call(&target, &method, &request, CALL_TIMEOUT).await {
        Ok(reply) => {
            println!("{}", render::to_pretty_json(&reply)?);
            Ok(0)
        }
        Err(e) => {
            // The error as the Connect JSON error body on stdout (for scripts, as before), and
            // as a sentence on stderr.
            let body = serde_json::json!({ "code": e.code.as_str(), "message": e.message });
            println!("{}", serde_json::to_string_pretty(&body)?);
            eprintln!("error: {} ({})", e.message, e.code.as_str());
            Ok(1)
        }
    }
}

fn find_method(group: &str, kebab_name: &str) -> anyhow::Result<MethodDescriptor> {
    let service = SERVICES
        .iter()
        .find(|(g, _, _)| *g == group)
        .map(|(_, s, _)| *s)
        .with_context(|| format!("unknown service group '{group}'"))?;
    let svc = pool()
        .get_service_by_name(service)
        .with_context(|| format!("{service} is not in the embedded descriptors"))?;
    let found = svc.methods().find(|m| flags::kebab(m.name()) == kebab_name);
    found.with_context(|| format!("{service} has no method '{kebab_name}'"))
}

/// The JSON body as the method's request message; the error names the message and the field.
fn to_message(
    method: &MethodDescriptor,
    body: serde_json::Value,
) -> anyhow::Result<DynamicMessage> {
    let input = method.input();
    DynamicMessage::deserialize(input.clone(), body).map_err(|e| {
        let fields: Vec<String> = input.fields().map(|f| f.json_name().to_string()).collect();
        anyhow::anyhow!(
            "the request body is not a valid {}: {e} (its fields: {})",
            input.name(),
            fields.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_of_every_group_builds_a_valid_command() {
        rpc_command(Command::new("rpc")).debug_assert();
        for (group, service, _) in SERVICES {
            let cmd = with_methods(Command::new(*group), service);
            assert!(cmd.get_subcommands().count() > 0, "{group}");
            cmd.debug_assert();
        }
    }

    #[test]
    fn groups_list_the_published_methods() {
        let names = |group: &str| -> Vec<String> {
            let service = SERVICES
                .iter()
                .find(|(g, _, _)| *g == group)
                .map(|(_, s, _)| *s)
                .expect("group");
            let cmd = with_methods(Command::new(group.to_string()), service);
            cmd.get_subcommands()
                .map(|c| c.get_name().to_string())
                .collect()
        };
        assert_eq!(
            names("worker"),
            [
                "exec-in-container",
                "get-process-status",
                "get-task-status",
                "health-check",
                "list-tasks",
                "profile-task",
                "reconcile",
            ]
        );
        assert_eq!(
            names("actor"),
            [
                "call",
                "cancel-operation",
                "get-operation",
                "health-check",
                "list-actors",
                "list-methods",
                "start-operation",
            ]
        );
        let controller = names("controller");
        assert_eq!(controller.len(), iris_proto::CONTROLLER_METHODS.len());
        assert!(controller.contains(&"list-tasks".to_string()));
        assert!(names("inspect").contains(&"list-task-events".to_string()));
    }

    #[test]
    fn a_bad_body_names_the_message_and_its_fields() {
        let m = find_method("controller", "get-job-status").expect("method");
        let e = to_message(&m, serde_json::json!({ "jobid": "x" })).expect_err("unknown field");
        let text = e.to_string();
        assert!(
            text.contains("GetJobStatusRequest") && text.contains("jobId"),
            "{text}"
        );
        let ok = to_message(&m, serde_json::json!({ "job_id": "/u/a" })).expect("snake case too");
        assert_eq!(
            render::to_pretty_json(&ok).expect("json"),
            "{\n  \"job_id\": \"/u/a\"\n}",
            "printed with the proto's field names, as the published CLI prints"
        );
    }
}
