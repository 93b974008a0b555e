#!/usr/bin/env bash
# The HTML report checked in a real browser: installs Debian's chromium where it is missing
# (apt-get, as root), then runs tests/html_report.rs, which trains a small CNN with the
# timeline and `.html(true)`, renders the report headless from file://, fails on any script
# error, checks the rendered DOM for the run's exact peak bytes and for an attack-shaped
# parameter name shown as text, and keeps a screenshot in target/report-check/report.png.
# Where chromium cannot be installed, says so and fails under CI (else says NOT RUN).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "check-report: installing Debian's chromium" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } || true
  fi
fi
if ! command -v chromium >/dev/null; then
  # Under CI every check must run: no browser is a failure there, not a skip.
  if [ -n "${CI:-}" ]; then
    echo "check-report: FAILED under CI: chromium is not installed and could not be (apt-get install chromium, as root)" >&2
    exit 1
  fi
  echo "check-report: NOT RUN: chromium is not installed and could not be (apt-get install chromium, as root)" >&2
  exit 0
fi
TCH_MEMPROF_CHROMIUM="$(command -v chromium)" exec scripts/with-libtorch.sh \
  cargo test --test html_report -- --nocapture
