#!/usr/bin/env bash
# Installs what the dashboard's browser test (crates/cli/tests/dashboard.rs) needs: Debian's
# chromium and chromedriver. Idempotent; run as root (CI runs as root).
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver
/usr/bin/chromium --version
/usr/bin/chromedriver --version
