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
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={PROTO_ROOT}/{file}");
    }

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let fds = protox::compile(PROTO_FILES, [PROTO_ROOT])?;
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
