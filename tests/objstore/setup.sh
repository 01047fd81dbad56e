#!/usr/bin/env bash
# Creates .venv-objstore in the repo root for the object-storage tests (crates/cli/tests/objstore.rs):
# moto's S3 server and gcp-storage-emulator, at the exact versions of requirements.txt (every
# package pinned, installed with --no-deps). Does nothing when the venv already matches.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-objstore
REQ=tests/objstore/requirements.txt
if [ -f "$VENV/.installed" ] && cmp -s "$REQ" "$VENV/.installed"; then
    exit 0
fi
PYENV_ROOT="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
PY="$PYENV_ROOT/versions/3.12.1/bin/python3"
if [ ! -x "$PY" ]; then
    echo "tests/objstore/setup.sh: $PY not found (install Python 3.12.1 with pyenv)" >&2
    exit 1
fi
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$REQ"
cp "$REQ" "$VENV/.installed"
echo "created $VENV (moto server, gcp-storage-emulator)"
