#!/usr/bin/env bash
# `make test` runs this first: the system programs the tests drive must be there, or the run
# stops here with the one command that installs them (.ci/run installs them before make test).
#   chromium            the browser tests (Playwright drives Debian's Chromium)
#   promtool            the alert rules' unit tests (Debian's prometheus package)
#   prometheus          the dashboard test scrapes a running stack with it (same package)
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    missing+=(prometheus)
fi
if ((${#missing[@]})); then
    echo "make test needs: ${missing[*]}" >&2
    echo "install them with: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi
