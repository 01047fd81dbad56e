#!/usr/bin/env bash
# Submit throughput with an external load generator: a release controller on 127.0.0.1 with no
# workers (admission only) and `wrk` (Debian) posting LaunchJob over Connect JSON from N
# connections. Prints wrk's figures and the number of jobs the DB holds afterwards.
# Usage: scripts/bench-submit.sh [CONNECTIONS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS="${1:-32}"
SECS="${2:-6}"
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
cargo build --release -q -p iris-cli
STATE="$(mktemp -d)"
PORT=18080
target/release/iris cluster controller serve --state-dir "$STATE" --bind "127.0.0.1:$PORT" >"$STATE/log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$STATE"' EXIT
for _ in $(seq 50); do [ -s "$STATE/controller.url" ] && break; sleep 0.1; done
wrk -t1 -c"$CONNS" -d"${SECS}s" -s scripts/bench-submit.lua "http://127.0.0.1:$PORT"
echo "jobs stored: $(target/release/iris --controller-url "http://127.0.0.1:$PORT" query 'SELECT count(*) FROM jobs' -f csv | tail -1)"
