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
cargo test --workspace --all-targets
bash tests/compat/run.sh
