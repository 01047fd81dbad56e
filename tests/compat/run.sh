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
MARIN_IRIS_VERSION="0.2.227.dev40316220070"
# (`pip show` is read whole: `grep -q` closing the pipe early would fail it under pipefail.)
if [[ ! -x "$VENV/bin/iris" ]] || [[ ! -x "$VENV/bin/uv" ]] ||
    [[ "$("$VENV/bin/pip" show marin-iris 2>/dev/null || true)" != *"Version: $MARIN_IRIS_VERSION"* ]]; then
    PY="${IRIS_COMPAT_PYTHON:-$(pyenv root 2>/dev/null)/versions/3.12.1/bin/python3}"
    if [[ ! -x "$PY" ]]; then
        PY="$(command -v python3.12 || true)"
    fi
    [[ -x "$PY" ]] || { echo "compat: no Python 3.12 found (set IRIS_COMPAT_PYTHON)" >&2; exit 2; }
    echo "compat: creating $VENV with $PY" >&2
    "$PY" -m venv "$VENV"
    # Exact pins: the published package is the spec, so a new release changes what we test
    # against only when someone bumps these on purpose. httpx's 1.0 pre-releases dropped
    # `httpx.Auth` and break `import iris.cli`; keep httpx < 1.
    # uv: the workers run the jobs' `uv sync` setup with it (it is on their PATH through the venv).
    "$VENV/bin/pip" install -q --disable-pip-version-check \
        "marin-iris==$MARIN_IRIS_VERSION" "marin-finelog==0.2.71.dev40003900277" "httpx<1" \
        "uv==0.9.5"
fi
# py-spy: `task profile threads` dumps a task's Python stacks with it (the workers find it on
# their PATH through the venv). Checked on its own so an existing venv gets it too.
if [[ "$("$VENV/bin/pip" show py-spy 2>/dev/null || true)" != *"Version: 0.4.3"* ]]; then
    "$VENV/bin/pip" install -q --disable-pip-version-check "py-spy==0.4.3"
fi

# The published controller itself (and the finelog server it starts): the mixed-federation
# step runs it as hub and as peer beside ours. Checked on its own so an existing venv gets it.
FINELOG_SERVER_VERSION="0.2.71.dev40003900277"
if [[ "$("$VENV/bin/pip" show marin-finelog-server 2>/dev/null || true)" != *"Version: $FINELOG_SERVER_VERSION"* ]] ||
    [[ "$("$VENV/bin/pip" show kubernetes 2>/dev/null || true)" != *"Version: "* ]]; then
    "$VENV/bin/pip" install -q --disable-pip-version-check \
        "marin-iris[controller]==$MARIN_IRIS_VERSION" "marin-finelog-server==$FINELOG_SERVER_VERSION" "httpx<1"
fi

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
