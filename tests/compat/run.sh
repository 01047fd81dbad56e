#!/usr/bin/env bash
# Drives our controller with the PUBLISHED Python Iris CLI and IrisClient (marin-iris on PyPI).
#
#   bash tests/compat/run.sh            # creates .venv-compat in the repo root if absent
#   IRIS_COMPAT_VENV=/tmp/V bash tests/compat/run.sh   # reuse an existing venv
#   bash tests/compat/run.sh -k cancel  # only steps whose name contains "cancel"
#
# Builds `iris`, starts a local cluster on a temp state dir, runs tests/compat/compat_test.py
# with the venv's python, stops the cluster. Ends with `N passed, M failed`; exits non-zero on
# any failure.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"

VENV="${IRIS_COMPAT_VENV:-$ROOT/.venv-compat}"
IRIS_COMPAT_VENV="$VENV" bash "$ROOT/tests/compat/venv.sh"

cargo build -q -p iris-cli
BIN="$ROOT/target/debug/iris"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/iris-compat.XXXXXX")"
STATE="$WORK/state"
LOG="$WORK/cluster.log"
CLUSTER_PID=""
cleanup() {
    if [[ -n "$CLUSTER_PID" ]] && kill -0 "$CLUSTER_PID" 2>/dev/null; then
        kill -INT "$CLUSTER_PID" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$CLUSTER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$CLUSTER_PID" 2>/dev/null || true
        wait "$CLUSTER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Started the way a user of the published package starts it: with the package's venv
# activated, so the workers' `python3` (IRIS_PYTHON for callable jobs) has cloudpickle.
# Four workers (the embedded local config starts two): the endpoint step runs a 4-host gang.
cat >"$WORK/cluster.yaml" <<'YAML'
name: compat
platform: {local: {}}
controller: {local: {port: 0}}
scale_groups:
  cpu:
    num_vms: 4
    resources: {cpu: 8, ram: 16GB, disk: 100GB, device_type: cpu, device_variant: cpu, capacity_type: on-demand}
YAML
PATH="$VENV/bin:$PATH" "$BIN" cluster start --local --config "$WORK/cluster.yaml" --state-dir "$STATE" >"$LOG" 2>&1 &
CLUSTER_PID=$!
URL=""
for _ in $(seq 300); do
    if [[ -s "$STATE/controller.url" ]]; then
        URL="$(tr -d '[:space:]' <"$STATE/controller.url")"
        break
    fi
    if ! kill -0 "$CLUSTER_PID" 2>/dev/null; then
        break
    fi
    sleep 0.1
done
if [[ -z "$URL" ]]; then
    echo "compat: the local cluster did not start:" >&2
    cat "$LOG" >&2
    exit 1
fi
echo "compat: controller $URL (published CLI $VENV/bin/iris)"

STATUS=0
"$VENV/bin/python" "$ROOT/tests/compat/compat_test.py" --controller-url "$URL" --iris "$VENV/bin/iris" \
    --cluster-log "$LOG" "$@" || STATUS=$?
# Mixed federations (its own controllers, started and stopped by the script): skipped when
# `-k` selects single-cluster steps only.
if [[ $# -eq 0 ]] || [[ "$*" == *federation* ]]; then
    "$VENV/bin/python" "$ROOT/tests/compat/federation_test.py" --ours "$BIN" --published "$VENV/bin/iris" ||
        STATUS=$?
fi
# Wire shape: the JSON of every RPC both serve against the published controller's for the same
# state (its own controllers too).
if [[ $# -eq 0 ]] || [[ "$*" == *wire* ]]; then
    "$VENV/bin/python" "$ROOT/tests/compat/wire_shape_test.py" --ours "$BIN" --published "$VENV/bin/iris" ||
        STATUS=$?
fi
# Pod parity: the published provider's pod builder and ours on the same run requests.
if [[ $# -eq 0 ]] || [[ "$*" == *pod* ]]; then
    IRIS_COMPAT_VENV="$VENV" cargo test -q -p iris-kube-backend --lib -- --ignored parity || STATUS=$?
fi
exit "$STATUS"
