//! Protobuf wire types for Iris.
//!
//! The `.proto` sources under `proto/` are this project's own proto3
//! definitions, kept wire-compatible (package, message, field, enum and
//! service names and numbers) with the published Python `iris` and `finelog`
//! packages. Rust modules mirror the protobuf packages:
//!
//! | package           | module                   |
//! |-------------------|--------------------------|
//! | `iris.time`       | [`iris::time`]           |
//! | `iris.job`        | [`iris::job`]            |
//! | `iris.cluster`    | [`iris::cluster`]        |
//! | `iris.query`      | [`iris::query`]          |
//! | `iris.rpc`        | [`iris::rpc`]            |
//! | `iris.logging`    | [`iris::logging`]        |
//! | `iris.vm`         | [`iris::vm`]             |
//! | `iris.inspect`    | [`iris::inspect`]        |
//! | `iris.actor`      | [`iris::actor`]          |
//! | `finelog.logging` | [`finelog::logging`]     |
//!
//! `iris.inspect` is ours alone (typed reads for the dashboard and CLI); the published packages
//! have no counterpart and the published Python client never calls it.
//!
//! Every message implements [`prost::Message`] for the binary encoding and
//! `serde::Serialize`/`Deserialize` for the canonical proto3 JSON mapping
//! (lowerCamelCase field names on output; both spellings accepted on input).

/// Generated code for the `iris.*` packages.
pub mod iris {
    /// `iris.time`: millisecond timestamps and durations.
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod time {
        include!(concat!(env!("OUT_DIR"), "/iris.time.rs"));
        include!(concat!(env!("OUT_DIR"), "/iris.time.serde.rs"));
    }

    /// `iris.job`: types shared by the controller, worker and clients.
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod job {
        include!(concat!(env!("OUT_DIR"), "/iris.job.rs"));
        include!(concat!(env!("OUT_DIR"), "/iris.job.serde.rs"));
    }

    /// `iris.cluster`: `ControllerService`, `EndpointService` and
    /// `WorkerService` messages (nested in `Controller` and `Worker`).
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod cluster {
        include!(concat!(env!("OUT_DIR"), "/iris.cluster.rs"));
        include!(concat!(env!("OUT_DIR"), "/iris.cluster.serde.rs"));
    }

    /// `iris.query`: raw SQL query API.
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod query {
        include!(concat!(env!("OUT_DIR"), "/iris.query.rs"));
        include!(concat!(env!("OUT_DIR"), "/iris.query.serde.rs"));
    }

    /// `iris.rpc`: structured error details.
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/iris.rpc.rs"));
        include!(concat!(env!("OUT_DIR"), "/iris.rpc.serde.rs"));
    }

    /// `iris.logging`: log entries embedded in controller/worker RPCs.
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod logging {
        include!(concat!(env!("OUT_DIR"), "/iris.logging.rs"));
        include!(concat!(env!("OUT_DIR"), "/iris.logging.serde.rs"));
    }

    /// `iris.vm`: autoscaler and VM status.
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod vm {
        include!(concat!(env!("OUT_DIR"), "/iris.vm.rs"));
        include!(concat!(env!("OUT_DIR"), "/iris.vm.serde.rs"));
    }

    /// `iris.actor`: the `ActorService` an actor server exposes (pickled arguments and results).
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod actor {
        include!(concat!(env!("OUT_DIR"), "/iris.actor.rs"));
        include!(concat!(env!("OUT_DIR"), "/iris.actor.serde.rs"));
    }

    /// `iris.inspect`: Iris's own typed reads (`InspectService`) for the dashboard and CLI.
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod inspect {
        include!(concat!(env!("OUT_DIR"), "/iris.inspect.rs"));
        include!(concat!(env!("OUT_DIR"), "/iris.inspect.serde.rs"));
    }
}

/// Generated code for the `finelog.*` packages.
pub mod finelog {
    /// `finelog.logging`: log entries and `LogService`.
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod logging {
        include!(concat!(env!("OUT_DIR"), "/finelog.logging.rs"));
        include!(concat!(env!("OUT_DIR"), "/finelog.logging.serde.rs"));
    }
    /// `finelog.stats`: typed tables written as Arrow batches and read with SQL (`StatsService`).
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod stats {
        include!(concat!(env!("OUT_DIR"), "/finelog.stats.rs"));
        include!(concat!(env!("OUT_DIR"), "/finelog.stats.serde.rs"));
    }
}

pub use finelog::logging as finelog_logging;
pub use iris::{cluster, inspect, job, query, time, vm};

// Service names and method tables generated from the service definitions:
// CONTROLLER_SERVICE / CONTROLLER_METHODS, ENDPOINT_SERVICE / ENDPOINT_METHODS,
// WORKER_SERVICE / WORKER_METHODS, LOG_SERVICE / LOG_METHODS, INSPECT_SERVICE / INSPECT_METHODS,
// ACTOR_SERVICE / ACTOR_METHODS.
include!(concat!(env!("OUT_DIR"), "/services.rs"));

/// Encoded `google.protobuf.FileDescriptorSet` for every `.proto` file in this
/// crate (useful for reflection and for schema checks).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));

/// This build's `Provenance`, as `GetProcessStatus` and a worker's registration report it.
/// The commit and tree hash come from `IRIS_BUILD_COMMIT` / `IRIS_BUILD_TREE_HASH` at build
/// time and are `unknown` without them, as the published package reports a build outside git.
pub fn build_provenance() -> job::Provenance {
    job::Provenance {
        base_commit: Some(option_env!("IRIS_BUILD_COMMIT").unwrap_or("unknown").into()),
        tree_hash: Some(
            option_env!("IRIS_BUILD_TREE_HASH")
                .unwrap_or("unknown")
                .into(),
        ),
        branch: Some(option_env!("IRIS_BUILD_BRANCH").unwrap_or_default().into()),
        built_by: Some(String::new()),
        dirty: Some(false),
    }
}

impl iris::job::ProfileTaskResponse {
    /// A profiler's outcome as the reference answers it: both fields set, the unused one empty.
    pub fn from_outcome(outcome: Result<Vec<u8>, String>) -> Self {
        let (profile_data, error) = match outcome {
            Ok(data) => (data, String::new()),
            Err(error) => (Vec::new(), error),
        };
        Self {
            profile_data: Some(profile_data),
            error: Some(error),
        }
    }
}
