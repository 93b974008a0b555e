#!/usr/bin/env bash
# Builds and runs tests/downstream: a user's crate on tch 0.26 that adds tch-memprof by path,
# runs the four lines around a few training steps and checks the weights and gradient bytes
# against hand computation. Provisions the libtorch its own lock needs (2.13.0 for tch 0.26).
# Its Cargo.lock is committed and used as it is (--locked): the package's own lock moved to
# tch 0.26, as scripts/compat.sh moves it, so that its dependencies are the compat suite's.
# After changing tch-memprof's dependencies, make it again:
#   cp Cargo.lock tests/downstream/ && (cd tests/downstream && cargo update -p tch --precise 0.26.0)
# CI builds it in the compat suite's target folder (CARGO_TARGET_DIR), where those
# dependencies are built already; its profile is the package's, for the same reason.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# A relative CARGO_TARGET_DIR is the caller's, not tests/downstream's.
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
export CARGO_TARGET_DIR="$target"
cd "$root/tests/downstream"
exec "$root/scripts/with-libtorch.sh" cargo run --locked --quiet
