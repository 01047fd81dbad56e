//! The kubelet side of a *real* Kubernetes control plane for tests (`scripts/k8s-testenv.sh`):
//! the test cluster's nodes are Node objects with no kubelet behind them, and [`NodeAgent`] plays
//! the kubelet for the pods kube-scheduler binds to them. It runs each container's command as a
//! local process (or, in [`AgentMode::Simulate`], runs nothing for a while, for scale
//! benchmarks), reports pod status, finishes deletions, and serves the kubelet's endpoint on the
//! nodes' port (container logs, port-forward), so `kubectl logs`, `kubectl port-forward` and the
//! API server's `pods/log` and `pods/portforward` work as on a cluster.
//!
//! This crate once also held a fake API server with emulated Kueue, scheduler and kubelet; every
//! scenario it served now runs against the real control plane (`crates/cli/tests/kubernetes_real.rs`),
//! so it was removed (issue 13).

#![warn(missing_docs)]

mod host;
pub mod node_agent;
mod node_logs;
mod node_portforward;
mod spdy_dictionary;

pub use crate::node_agent::{AgentOptions, Mode as AgentMode, NodeAgent, RanPod};
pub use crate::node_logs::KubeletEndpoint;
