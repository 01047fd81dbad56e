//! Compiles the crate's `.proto` files with the pure-Rust `protox` compiler
//! (no system `protoc`), then generates prost message types, pbjson serde
//! impls and a small table of service method names.

use std::error::Error;
use std::fmt::Write as _;
use std::path::PathBuf;

use prost::Message as _;

const PROTO_ROOT: &str = "proto";

const PROTO_FILES: &[&str] = &[
    "iris/time.proto",
    "iris/errors.proto",
    "iris/iris_logging.proto",
    "iris/query.proto",
    "iris/job.proto",
    "iris/vm.proto",
    "iris/controller.proto",
    "iris/worker.proto",
    "iris/inspect.proto",
    "iris/actor.proto",
    "finelog/logging.proto",
    "finelog/stats.proto",
];

/// The messages whose singular fields have explicit presence so far. The
/// published protos give it to every message; the wire-shape comparison
/// (`tests/compat/wire_shape_test.py`) names the differences still open, and
/// each message joins this list with the code that sets its fields.
const EXPLICIT_PRESENCE: &[&str] = &[
    ".iris.job.Constraint",
    ".iris.job.Provenance",
    ".iris.job.WorkerMetadata",
    ".iris.job.TaskAttempt",
    ".iris.job.TaskOutputArchive",
    ".iris.job.TaskStatus",
    ".iris.job.JobStatus",
    ".iris.cluster.Controller.LaunchJobRequest",
    ".iris.cluster.Controller.ListJobsResponse",
    ".iris.cluster.Controller.ListWorkersResponse",
    ".iris.cluster.Controller.WorkerHealthStatus",
    ".iris.cluster.Controller.UserSummary",
    ".iris.cluster.Controller.Endpoint",
    ".iris.cluster.Controller.ExecInContainerResponse",
    ".iris.cluster.Controller.FederationBudgetUsage",
    ".iris.job.ProfileTaskResponse",
    ".iris.time.Timestamp",
    ".iris.vm.ScaleGroupStatus",
    ".iris.vm.SliceInfo",
    ".iris.vm.AutoscalerAction",
    ".iris.vm.DemandEntryStatus",
    ".iris.vm.GroupRoutingStatus",
    ".iris.vm.ResourceSpec",
    ".finelog.logging.LogEntry",
    ".finelog.stats.GetTableStatusResponse",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={PROTO_ROOT}/{file}");
    }

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut fds = protox::compile(PROTO_FILES, [PROTO_ROOT])?;
    explicit_presence(&mut fds);
    let fds_bytes = fds.encode_to_vec();
    std::fs::write(out_dir.join("file_descriptor_set.bin"), &fds_bytes)?;

    let mut config = prost_build::Config::new();
    config.out_dir(&out_dir);
    config.btree_map(["."]);
    config.compile_fds(fds.clone())?;

    pbjson_build::Builder::new()
        .out_dir(&out_dir)
        .register_descriptors(&fds_bytes)?
        .btree_map(["."])
        .build(&[".iris", ".finelog"])?;

    std::fs::write(out_dir.join("services.rs"), service_tables(&fds)?)?;
    Ok(())
}

/// Gives every singular scalar and enum field explicit presence, as the
/// published protos have it (`edition = "2023"`, whose default is
/// `field_presence = EXPLICIT`): a field that was set is sent even when it is
/// zero, empty or false, and a reader can tell it from one never set. Our
/// `.proto` files are proto3 (protox and prost do not read editions), so the
/// presence is added here, to the descriptors, the way `optional` is encoded:
/// a synthetic one-field oneof and `proto3_optional`. prost then generates
/// `Option<T>` and pbjson emits `Some(0)`.
fn explicit_presence(fds: &mut prost_types::FileDescriptorSet) {
    use prost_types::field_descriptor_proto::{Label, Type};
    fn visit(scope: &str, msg: &mut prost_types::DescriptorProto) {
        let name = format!("{scope}.{}", msg.name());
        for nested in &mut msg.nested_type {
            visit(&name, nested);
        }
        if msg.options.as_ref().and_then(|o| o.map_entry) == Some(true)
            || !EXPLICIT_PRESENCE.contains(&name.as_str())
        {
            return;
        }
        let mut added = Vec::new();
        for field in &mut msg.field {
            let singular = field.label() != Label::Repeated;
            let scalar = !matches!(field.r#type(), Type::Message | Type::Group);
            if singular && scalar && field.oneof_index.is_none() {
                let index = msg.oneof_decl.len() + added.len();
                field.oneof_index = Some(i32::try_from(index).unwrap_or(i32::MAX));
                field.proto3_optional = Some(true);
                added.push(prost_types::OneofDescriptorProto {
                    name: Some(format!("_{}", field.name())),
                    options: None,
                });
            }
        }
        msg.oneof_decl.extend(added);
    }
    for file in &mut fds.file {
        let scope = format!(".{}", file.package());
        for msg in &mut file.message_type {
            visit(&scope, msg);
        }
    }
}

/// Emits `<NAME>_SERVICE` (fully-qualified service name) and `<NAME>_METHODS`
/// (method names in declaration order) for every service, where `<NAME>` is
/// the service name without its `Service` suffix in SCREAMING_SNAKE_CASE.
fn service_tables(fds: &prost_types::FileDescriptorSet) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    for file in &fds.file {
        let package = file.package();
        for service in &file.service {
            let name = service.name();
            let stem = screaming_snake(name.strip_suffix("Service").unwrap_or(name));
            writeln!(out, "/// Fully-qualified name of `{package}.{name}`.")?;
            writeln!(
                out,
                "pub const {stem}_SERVICE: &str = \"{package}.{name}\";"
            )?;
            writeln!(
                out,
                "/// Method names of `{package}.{name}`, in declaration order."
            )?;
            writeln!(out, "pub const {stem}_METHODS: &[&str] = &[")?;
            for method in &service.method {
                writeln!(out, "    \"{}\",", method.name())?;
            }
            writeln!(out, "];")?;
        }
    }
    Ok(out)
}

fn screaming_snake(name: &str) -> String {
    let mut out = String::new();
    for (i, ch) in name.chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}
