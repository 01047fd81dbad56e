#!/usr/bin/env bash
# Creates (or brings up to date) the venv with the PUBLISHED Python Iris at exact pins:
# `$IRIS_COMPAT_VENV`, default `.venv-compat` in the repo root. Used by tests/compat/run.sh and,
# through scripts/test-all.sh, by the Rust tests that drive the published CLI
# (crates/cli/tests/kubernetes_real.rs). Idempotent: a venv at the pins is left alone.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
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

