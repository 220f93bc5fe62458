#!/usr/bin/env bash
# The browser tests drive Debian's Chromium through Playwright (browsers cannot be downloaded).
set -euo pipefail
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's chromium for the browser tests..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-noto-color-emoji >/dev/null
else
  echo "warning: $CHROMIUM not found and not root: install Debian's chromium for the browser tests" >&2
fi
