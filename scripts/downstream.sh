#!/usr/bin/env bash
# Builds and runs tests/downstream: a user's crate on tch 0.26 that adds tch-memprof by path,
# runs the four lines around a few training steps and checks the weights and gradient bytes
# against hand computation. Provisions the libtorch its own lock needs (2.13.0 for tch 0.26).
# Its Cargo.lock is committed and used as it is (--locked): after changing tch-memprof's
# dependencies, refresh it with `cargo update -p tch-memprof` in tests/downstream.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
cd "$root/tests/downstream"
exec "$root/scripts/with-libtorch.sh" cargo run --locked --quiet
