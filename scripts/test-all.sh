#!/usr/bin/env bash
# The whole test suite: every Rust test (unit, property, integration against real processes on
# 127.0.0.1), then the published Python client driving our controller.
set -euo pipefail
cd "$(dirname "$0")/.."
bash crates/dashboard/ci/install-browser.sh
# The partition test puts daemons in network namespaces with `ip` (iproute2).
if ! command -v ip >/dev/null; then
    apt-get install -y iproute2 || { apt-get update && apt-get install -y iproute2; }
fi
bash tests/objstore/setup.sh
# The real Kubernetes control plane under crates/cli/tests/kubernetes_real.rs: etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and Kueue built from their Go
# modules, once per machine (14-22 min cold on 2 cores; cached under ~/.cache/iris/k8s).
for t in jq openssl curl; do
    command -v "$t" >/dev/null || { apt-get update && apt-get install -y jq openssl curl; break; }
done
bash scripts/k8s-testenv.sh build
# The published Python Iris at exact pins: the real-Kubernetes test drives its CLI against our
# controller deployed into the test cluster; the compatibility suite below uses it throughout.
bash tests/compat/venv.sh
cargo test --workspace --all-targets
bash tests/compat/run.sh
