#!/usr/bin/env bash
# Writes an upgrade fixture with an OLDER `iris` binary: the controller DB of a local cluster that
# ran a succeeded and a failed job, and a checkpoint of it, as that release wrote them.
#
#   git worktree add /tmp/old <commit> && CARGO_TARGET_DIR=/tmp/old-target cargo build -p iris-cli
#   scripts/make-upgrade-fixture.sh /tmp/old-target/debug/iris crates/cli/tests/fixtures/upgrade/<schema>
#
# `recovery.rs::a_db_and_a_checkpoint_from_every_earlier_schema_open_and_migrate` opens every
# fixture with the current binary.
set -euo pipefail
OLD="$(realpath "$1")"
OUT="$(mkdir -p "$2" && cd "$2" && pwd)"
W="$(mktemp -d "${TMPDIR:-/tmp}/iris-fixture.XXXXXX")"
# Run as plain `iris` from PATH: a job records the command line that submitted it, and the
# fixture must not carry this machine's paths.
mkdir -p "$W/bin"
ln -s "$OLD" "$W/bin/iris"
export PATH="$W/bin:$PATH"
PID=""
cleanup() {
    if [[ -n "$PID" ]]; then kill -INT "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/ws" "$OUT"
cd "$W/ws"
iris cluster start --local --state-dir "$W/state" >"$W/cluster.log" 2>&1 &
PID=$!
for _ in $(seq 300); do
    [[ -s "$W/state/controller.url" ]] && break
    sleep 0.1
done
URL="$(tr -d '[:space:]' <"$W/state/controller.url")"
iris --controller-url "$URL" job run --job-name upgrade-ok --user fixture -- echo from-the-old-release
iris --controller-url "$URL" job run --job-name upgrade-fail --user fixture -- sh -c 'exit 3' || true
iris --controller-url "$URL" cluster controller checkpoint
kill -INT "$PID"
wait "$PID" || true
PID=""
rm -rf "$OUT/controller.sqlite3" "$OUT/logs.sqlite3" "$OUT/remote-state"
# Self-contained files (each WAL folded in), and the checkpoint tree as the old release wrote it.
for db in controller.sqlite3 logs.sqlite3; do
    python3 - "$W/state/$db" "$OUT/$db" <<'PY'
import sqlite3, sys
sqlite3.connect(sys.argv[1]).execute("VACUUM INTO ?", (sys.argv[2],))
PY
done
cp -r "$W/state/remote-state" "$OUT/remote-state"
echo "written: $OUT"
