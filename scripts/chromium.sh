#!/usr/bin/env bash
# Debian's headless Chromium for the console's browser tests (tests/api/console/test_console_browser.py):
# installed from the distribution's packages when missing (browsers cannot be downloaded at install time here,
# so Playwright is pointed at this one). LORAHOST_CHROMIUM names another binary instead.
set -euo pipefail
if [ -n "${LORAHOST_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
  echo "chromium: not installed and apt-get is not available as root; the browser tests will be skipped (failed under CI)"
  exit 0
fi
echo "chromium: installing Debian's chromium package"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null; }
command -v chromium
