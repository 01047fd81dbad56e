#!/usr/bin/env bash
# finelog StatsService: WriteRows throughput and Query latency over ROWS stored rows, on our
# release controller (its /proxy/system.log-server) and on the published finelog server
# (marin-finelog-server, in its own process), in one run. Needs the compat venv
# (tests/compat/run.sh creates it; VENV overrides).
# Before that, on each: an hour of `iris.task` samples from 100 tasks (one batch per 5 s round)
# and the newest sample of every task, with the server's RSS before and after.
# Usage: scripts/bench-stats.sh [ROWS] [BATCH]
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS="${1:-1000000}"
BATCH="${2:-10000}"
VENV="${VENV:-$PWD/.venv-compat}"
cargo build --release -q -p iris-cli
WORK="$(mktemp -d)"
PORT=18090
target/release/iris cluster controller serve --state-dir "$WORK/ours" --bind "127.0.0.1:$PORT" >"$WORK/ours.log" 2>&1 &
OURS=$!
"$VENV/bin/python" -c "
import sys, time
from finelog_server import EmbeddedServer
s = EmbeddedServer(log_dir=sys.argv[1], port=0)
print(s.address, flush=True)
time.sleep(10**6)
" "$WORK/ref" >"$WORK/ref.url" 2>"$WORK/ref.log" &
REF=$!
trap 'kill $OURS $REF 2>/dev/null; wait $OURS $REF 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do [ -s "$WORK/ours/controller.url" ] && [ -s "$WORK/ref.url" ] && break; sleep 0.1; done
"$VENV/bin/python" scripts/bench-stats.py --rows "$ROWS" --batch "$BATCH" \
    --url "ours=http://127.0.0.1:$PORT/proxy/system.log-server" \
    --url "published=$(head -1 "$WORK/ref.url")" --pid "ours=$OURS" --pid "published=$REF"
echo "ours: controller RSS $(awk '/VmRSS/ {print $2 " kB"}' /proc/$OURS/status), stats DB $(du -sh "$WORK/ours/stats.sqlite3" | cut -f1)"
echo "published: server RSS $(awk '/VmRSS/ {print $2 " kB"}' /proc/$REF/status), data $(du -sh "$WORK/ref" | cut -f1)"
